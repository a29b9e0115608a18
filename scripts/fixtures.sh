#!/usr/bin/env bash
# Generates the test models that are not downloaded: tiny GGUFs with an MTP (NextN) head, written
# by tests/fixtures/make_tiny_mtp.py with the `gguf` Python package in target/fixtures-venv.
#   models/tiny-mtp.gguf          SmolLM2's tokenizer and chat template (~40 MB)
#   models/tiny-mtp-vocab260.gguf self-contained 260-token vocabulary (<1 MB)
# A model is rewritten when it is missing or older than the generator, the venv's pins or its
# tokenizer source; otherwise this is a quick no-op. Needs models/SmolLM2-135M-Instruct.Q4_1.gguf
# (`make models`).
set -euo pipefail
cd "$(dirname "$0")/.."

venv=target/fixtures-venv
stamp="$venv/firstword-pins.txt"
# gguf and its dependencies, exactly as pip resolved them when the generator was written.
pins="certifi==2026.10.19.post1
charset-normalizer==3.5.3
gguf==0.19.0
idna==3.20
numpy==2.4.6
PyYAML==6.0.4
requests==2.34.2
tqdm==4.70.1
urllib3==2.8.0"

python="$PWD/$venv/bin/python"

# The stamp is written only after a complete install, so a partial venv is rebuilt.
if ! [ -x "$python" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$pins" ]; then
  echo "fixtures: installing gguf into $venv" >&2
  rm -f "$stamp"
  if ! python3 -m venv --clear "$venv" >&2; then
    echo "fixtures: python3 -m venv failed; on Debian/Ubuntu install python3-venv" >&2
    exit 1
  fi
  # shellcheck disable=SC2086 # one pin per word
  "$python" -m pip install --quiet --disable-pip-version-check $pins >&2
  echo "$pins" >"$stamp"
fi

generator=tests/fixtures/make_tiny_mtp.py
tokenizer=models/SmolLM2-135M-Instruct.Q4_1.gguf

# make_fixture OUT [generator args...]: runs the generator unless OUT is newer than the generator,
# the pins and every argument that names a file (the tokenizer source).
make_fixture() {
  local out=$1
  shift
  local dep
  local stale=false
  [ -f "$out" ] || stale=true
  for dep in "$generator" "$stamp" "$@"; do
    if [ -f "$dep" ] && [ "$dep" -nt "$out" ]; then stale=true; fi
  done
  if $stale; then
    "$python" "$generator" "$out" "$@"
  fi
}

make_fixture models/tiny-mtp.gguf --tokenizer-from "$tokenizer"
make_fixture models/tiny-mtp-vocab260.gguf --tiny-vocab
