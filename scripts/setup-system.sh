#!/usr/bin/env bash
# Installs the system packages that building firstword needs (llama.cpp via cmake,
# bindgen via libclang) on Debian/Ubuntu. Does nothing when they are already there.
# `setup-system.sh browser` also installs what the console's browser tests need: Debian's
# Chromium (/usr/bin/chromium; Ubuntu's chromium-browser is a snap and does not serve) and a
# font for its screenshots. `setup-system.sh media` installs espeak-ng, which speaks the bench's
# media scenario's clips (`firstword bench --media`, tests/bench.rs). Several may be given.
set -euo pipefail

if ! command -v cargo >/dev/null 2>&1; then
  echo "setup: cargo not found; install Rust with rustup and re-run" >&2
  exit 1
fi

need=()
command -v cmake >/dev/null 2>&1 || need+=(cmake)
command -v g++ >/dev/null 2>&1 || need+=(g++)
command -v clang >/dev/null 2>&1 || need+=(clang)
command -v make >/dev/null 2>&1 || need+=(make)
command -v python3 >/dev/null 2>&1 || need+=(python3)
python3 -m pip --version >/dev/null 2>&1 || need+=(python3-pip)
# `venv --help` works without python3-venv; creating one needs ensurepip.
python3 -c 'import ensurepip' >/dev/null 2>&1 || need+=(python3-venv)
command -v curl >/dev/null 2>&1 || need+=(curl)
# bindgen needs libclang.so; Debian ships it in libclang-dev (unversioned symlink).
if ! ls /usr/lib/llvm-*/lib/libclang.so >/dev/null 2>&1 && ! ls /usr/lib/*/libclang*.so >/dev/null 2>&1; then
  need+=(libclang-dev)
fi
# llama.cpp's default build links OpenMP (libgomp ships with g++ on Debian).
for extra in "$@"; do
  case "$extra" in
    browser)
      [ -x /usr/bin/chromium ] || need+=(chromium)
      [ -d /usr/share/fonts/truetype/dejavu ] || need+=(fonts-dejavu-core)
      ;;
    media) command -v espeak-ng >/dev/null 2>&1 || need+=(espeak-ng) ;;
    *) echo "setup: unknown extra '$extra' (browser, media)" >&2; exit 2 ;;
  esac
done

if [ ${#need[@]} -eq 0 ]; then
  exit 0
fi

echo "setup: installing system packages: ${need[*]}" >&2
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null

