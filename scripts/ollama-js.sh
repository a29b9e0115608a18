#!/usr/bin/env bash
# Installs (or reuses) the official `ollama` JavaScript client (ollama-js) in target/ollama-js,
# for tests/ollama.rs, pinned with its one dependency so a release cannot change the result.
# Needs Node.js 18 or later and npm (installed from Debian's packages when missing). Prints the
# node_modules directory as its last stdout line.
set -euo pipefail
cd "$(dirname "$0")/.."

pins="ollama@0.6.4 whatwg-fetch@3.6.20"
dir=target/ollama-js

if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
  echo "ollama-js: installing Node.js and npm" >&2
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends nodejs npm >/dev/null
fi

if [ "$(cat "$dir/pins" 2>/dev/null)" != "$pins" ] || [ ! -f "$dir/node_modules/ollama/package.json" ]; then
  rm -rf "$dir"
  mkdir -p "$dir"
  echo '{"name": "firstword-ollama-js", "private": true}' > "$dir/package.json"
  # shellcheck disable=SC2086
  (cd "$dir" && npm install --no-audit --no-fund --ignore-scripts --loglevel=error $pins >&2)
  echo "$pins" > "$dir/pins"
fi
echo "$PWD/$dir/node_modules"
