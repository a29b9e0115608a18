#!/usr/bin/env bash
# Creates (or reuses) target/browser-venv with Playwright's Python driver, for the console's
# browser tests (tests/console.rs runs tests/browser/console_checks.py). Playwright drives
# Debian's Chromium (/usr/bin/chromium, installed by `scripts/setup-system.sh browser`); its own
# browser download is never used. Every package is pinned to the set pip resolved when the test
# was written. Prints the venv's python path as its last stdout line.
set -euo pipefail
cd "$(dirname "$0")/.."

venv=target/browser-venv
pins="greenlet==3.5.6
playwright==1.65.2"

# shellcheck source=scripts/pinned-venv.sh
source scripts/pinned-venv.sh
ensure_pinned_venv "$venv" "$pins" browser-venv
echo "$PWD/$venv/bin/python"
