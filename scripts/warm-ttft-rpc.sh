#!/usr/bin/env bash
# Warm TTFT over llama.cpp's RPC backend, firstword and llama-server on the same split, in
# turn (the order reversed every other round), each with its own fresh pair of
# `firstword rpc-server`s on 127.0.0.1 (2 threads each): scripts/warm-ttft.py's nine-turn
# conversation on the ~4K-token system prompt, each server with `--rpc` to both and LAYERS
# layers offloaded to them. Prints each run's median warm TTFT.
# Usage: LLAMA_SERVER=$(scripts/build-llama-server.sh) scripts/warm-ttft-rpc.sh MODEL [LAYERS] [ROUNDS]
set -u
cd "$(dirname "$0")/.."
model=${1:?model path}; layers=${2:-20}; rounds=${3:-4}
: "${LLAMA_SERVER:?LLAMA_SERVER=\$(scripts/build-llama-server.sh)}"
export LD_LIBRARY_PATH=$(dirname "$LLAMA_SERVER")
cargo build --release --quiet --bin firstword
for round in $(seq 1 "$rounds"); do
  order="firstword llama-server"; [ $((round % 2)) -eq 0 ] && order="llama-server firstword"
  for server in $order; do
    target/release/firstword rpc-server --port 50301 -t 2 >/dev/null 2>&1 & a=$!
    target/release/firstword rpc-server --port 50302 -t 2 >/dev/null 2>&1 & b=$!
    sleep 1
    if [ "$server" = firstword ]; then
      python3 scripts/warm-ttft.py target/release/firstword "$model" --rpc 127.0.0.1:50301,127.0.0.1:50302 --ngl "$layers" | tail -1
    else
      python3 scripts/warm-ttft.py "$LLAMA_SERVER" "$model" --rpc 127.0.0.1:50301,127.0.0.1:50302 -ngl "$layers" | tail -1
    fi | sed "s/^/round $round: /"
    kill $a $b; wait $a $b 2>/dev/null
  done
done
