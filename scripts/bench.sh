#!/usr/bin/env bash
# Starts firstword and, if LLAMA_SERVER points at a llama-server binary, llama-server on the
# same model (one slot each, same threads and context), then runs `firstword bench` on both.
# Usage: scripts/bench.sh MODEL [extra `firstword bench` args: --reps, --csv, --plot, ...]
# FIRSTWORD_ARGS: extra `firstword serve` flags. COMPARE_ARGS: also start a second firstword with
# these flags instead, e.g. speculation on vs off:
#   FIRSTWORD_ARGS="--spec none" COMPARE_ARGS="--spec mtp" scripts/bench.sh models/tiny-mtp.gguf
set -euo pipefail
model=${1:?model path}; shift
ctx=${CTX:-8192}
threads=${THREADS:-$(nproc)}
cargo build --release --quiet --bin firstword

pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT

port_free() {
  if curl -s "http://127.0.0.1:$1/" >/dev/null 2>&1; then
    echo "port $1 is already taken by another server; stop it first" >&2; return 1
  fi
}

wait_healthy() {  # PORT PID
  for _ in $(seq 1 600); do
    kill -0 "$2" 2>/dev/null || { echo "the server for port $1 exited" >&2; return 1; }
    curl -sf "http://127.0.0.1:$1/health" >/dev/null 2>&1 && return 0
    sleep 0.2
  done
  echo "server on port $1 did not become healthy" >&2; return 1
}

# shellcheck disable=SC2206 # flags are words
base_args=(${FIRSTWORD_ARGS:-})
port_free 18080
./target/release/firstword serve -m "$model" --port 18080 -c "$ctx" -t "$threads" --threads-batch "$threads" "${base_args[@]}" 2>/tmp/firstword-bench.log &
pids+=($!); servers=(--url http://127.0.0.1:18080 --name "firstword${FIRSTWORD_ARGS:+ $FIRSTWORD_ARGS}" --pid $!)
wait_healthy 18080 $!

if [ -n "${COMPARE_ARGS:-}" ]; then
  # shellcheck disable=SC2206 # flags are words
  compare_args=($COMPARE_ARGS)
  port_free 18082
  ./target/release/firstword serve -m "$model" --port 18082 -c "$ctx" -t "$threads" --threads-batch "$threads" "${compare_args[@]}" 2>/tmp/firstword-bench-compare.log &
  pids+=($!); servers+=(--url http://127.0.0.1:18082 --name "firstword $COMPARE_ARGS" --pid $!)
  wait_healthy 18082 $!
fi

if [ -n "${LLAMA_SERVER:-}" ]; then
  port_free 18081
  # --no-repack: firstword loads the weights as they are (no repacked or AMX buffers), so this
  # is the like-for-like setting; llama-server's AMX repack path also segfaults at the first
  # decode on this project's AMX-capable development machines.
  "$LLAMA_SERVER" -m "$model" --port 18081 -c "$ctx" -t "$threads" -tb "$threads" -np 1 --jinja --no-repack 2>/tmp/llama-server-bench.log &
  pids+=($!); servers+=(--url http://127.0.0.1:18081 --name llama-server --pid $!)
  wait_healthy 18081 $!
fi

./target/release/firstword bench "${servers[@]}" "$@"
