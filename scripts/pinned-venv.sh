# Sourced by the scripts that need a Python virtualenv with exact package versions.
# ensure_pinned_venv DIR PINS LABEL: creates DIR (or reuses it when its stamp matches PINS, one
# `name==version` per line) and installs PINS into it; pip's output goes to stderr. The stamp is
# written only after a complete install, so a partial venv is rebuilt.
ensure_pinned_venv() {
  local venv=$1 pins=$2 label=$3
  local stamp="$venv/firstword-pins.txt"
  if [ -x "$venv/bin/python" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$pins" ]; then
    return 0
  fi
  echo "$label: installing into $venv" >&2
  rm -f "$stamp"
  if ! python3 -m venv --clear "$venv" >&2; then
    echo "$label: python3 -m venv failed; on Debian/Ubuntu install python3-venv" >&2
    return 1
  fi
  # shellcheck disable=SC2086 # one pin per word
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check $pins >&2
  echo "$pins" >"$stamp"
}
