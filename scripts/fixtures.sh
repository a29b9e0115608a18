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

# shellcheck source=scripts/pinned-venv.sh
source scripts/pinned-venv.sh
ensure_pinned_venv "$venv" "$pins" fixtures
python="$PWD/$venv/bin/python"
stamp="$venv/firstword-pins.txt"

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
