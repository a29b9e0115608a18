#!/usr/bin/env bash
# Creates (or reuses) target/sdk-venv with the official `openai` Python SDK, for the conformance
# test tests/openai_sdk.rs. Every package is pinned to the set the test was written against, so
# an SDK release cannot change the result. Prints the venv's python path as its last stdout line.
set -euo pipefail
cd "$(dirname "$0")/.."

venv=target/sdk-venv
stamp="$venv/firstword-pins.txt"
# openai and its dependencies, exactly as pip resolved them when the test was written.
pins="annotated-types==0.8.0
anyio==4.16.0
h11==0.16.0
httpcore2==2.16.2
httpx2==2.16.2
idna==3.20
jiter==0.19.0
openai==3.57.0
pydantic==2.14.4
pydantic_core==2.50.5
sniffio==1.3.1
truststore==0.10.5
typing-inspection==0.4.5
typing_extensions==4.16.0"

python="$PWD/$venv/bin/python"

# The stamp is written only after a complete install, so a partial venv is rebuilt.
if [ -x "$python" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$pins" ]; then
  echo "$python"
  exit 0
fi

echo "sdk-venv: installing the openai SDK into $venv" >&2
rm -f "$stamp"
if ! python3 -m venv --clear "$venv" >&2; then
  echo "sdk-venv: python3 -m venv failed; on Debian/Ubuntu install python3-venv" >&2
  exit 1
fi
# pip's own output goes to stderr: stdout ends with the python path only.
# shellcheck disable=SC2086 # one pin per word
"$python" -m pip install --quiet --disable-pip-version-check $pins >&2
echo "$pins" >"$stamp"
echo "$python"
