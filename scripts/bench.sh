#!/usr/bin/env bash
# Starts firstword and, if LLAMA_SERVER points at a llama-server binary, llama-server on the
# same model (one slot each, same threads and context), then runs `firstword bench` on both.
# Usage: scripts/bench.sh MODEL [extra `firstword bench` args: --reps, --csv, --plot, ...]
# FIRSTWORD_ARGS: extra `firstword serve` flags. COMPARE_ARGS: also start a second firstword with
# these flags instead, e.g. speculation on vs off:
#   FIRSTWORD_ARGS="--spec none" COMPARE_ARGS="--spec mtp" scripts/bench.sh models/tiny-mtp.gguf
# LLAMA_SERVER_ARGS: extra llama-server flags (e.g. --no-repack: see docs/benchmarks.md, "Like for like").
# Every server it starts gets a restart command (SIGTERM, wait for the exit, start it again,
# wait for /health), so scenario R measures the first turn after a restart. Each firstword
# keeps its disk cache in a fresh temporary directory (never the user's).
# MMPROJ: a projector GGUF for the model; every server gets `--mmproj "$MMPROJ"` and the bench
# `--media` (the media scenario: transcription and the silent-failure probe; its clips are
# spoken by espeak-ng, installed here if missing). Add --media-only to the bench flags to run
# that scenario alone.
set -euo pipefail
model=${1:?model path}; shift
ctx=${CTX:-8192}
threads=${THREADS:-$(nproc)}
cargo build --release --quiet --bin firstword

media_args=()
bench_media=()
if [ -n "${MMPROJ:-}" ]; then
  [ -f "$MMPROJ" ] || { echo "MMPROJ=$MMPROJ: no such file" >&2; exit 1; }
  bash "$(dirname "$0")/setup-system.sh" media
  media_args=(--mmproj "$MMPROJ")
  # --media-only among the bench flags already selects the media scenario.
  case " $* " in *" --media-only "*) ;; *) bench_media=(--media) ;; esac
fi

state=$(mktemp -d /tmp/firstword-bench.XXXXXX)
cleanup() {
  for pidfile in "$state"/*.pid; do [ -e "$pidfile" ] && kill "$(cat "$pidfile")" 2>/dev/null || true; done
  rm -rf "$state"
}
trap cleanup EXIT

port_free() {
  if curl -s "http://127.0.0.1:$1/" >/dev/null 2>&1; then
    echo "port $1 is already taken by another server; stop it first" >&2; return 1
  fi
}

# start_server PORT LOG COMMAND...: writes $state/PORT.start (starts COMMAND in the background,
# its pid in $state/PORT.pid, waits for /health, prints the pid) and $state/PORT.restart (stops
# the running one with SIGTERM, waits for it to exit, then starts it again), and starts it.
start_server() {
  local port=$1 log=$2; shift 2
  port_free "$port"
  {
    echo 'set -e'
    # stdout too: the restart command's caller reads its output until every writer closes it.
    printf '%q ' "$@"; echo ">/dev/null 2>>$(printf '%q' "$log") &"
    echo "pid=\$!; echo \$pid > $state/$port.pid"
    echo 'for _ in $(seq 1 600); do'
    echo '  kill -0 $pid 2>/dev/null || { echo "the server for port '"$port"' exited" >&2; exit 1; }'
    echo "  curl -sf http://127.0.0.1:$port/health >/dev/null 2>&1 && { echo \$pid; exit 0; }"
    echo '  sleep 0.2'
    echo 'done'
    echo 'echo "server on port '"$port"' did not become healthy" >&2; exit 1'
  } > "$state/$port.start"
  {
    echo 'set -e'
    echo "pid=\$(cat $state/$port.pid); kill \$pid"
    echo 'while kill -0 $pid 2>/dev/null; do sleep 0.1; done'
    echo "exec bash $state/$port.start"
  } > "$state/$port.restart"
  : > "$log"
  bash "$state/$port.start" >/dev/null
}

# shellcheck disable=SC2206 # flags are words
base_args=(${FIRSTWORD_ARGS:-})
start_server 18080 /tmp/firstword-bench.log ./target/release/firstword serve -m "$model" --port 18080 -c "$ctx" -t "$threads" --threads-batch "$threads" --cache-dir "$state/cache-18080" "${media_args[@]}" "${base_args[@]}"
servers=(--url http://127.0.0.1:18080 --name "firstword${FIRSTWORD_ARGS:+ $FIRSTWORD_ARGS}" --pid "$(cat "$state/18080.pid")" --restart "bash $state/18080.restart")

if [ -n "${COMPARE_ARGS:-}" ]; then
  # shellcheck disable=SC2206 # flags are words
  compare_args=($COMPARE_ARGS)
  start_server 18082 /tmp/firstword-bench-compare.log ./target/release/firstword serve -m "$model" --port 18082 -c "$ctx" -t "$threads" --threads-batch "$threads" --cache-dir "$state/cache-18082" "${media_args[@]}" "${compare_args[@]}"
  servers+=(--url http://127.0.0.1:18082 --name "firstword $COMPARE_ARGS" --pid "$(cat "$state/18082.pid")" --restart "bash $state/18082.restart")
fi

if [ -n "${LLAMA_SERVER:-}" ]; then
  # Both servers load the weights the same way, llama.cpp's default: weights whose type has
  # CPU kernels for interleaved rows are repacked at load (CPU_REPACK), the rest mapped. (Until
  # 2026-12-04 llama-server ran with --no-repack here, against firstword's repacked weights:
  # docs/benchmarks.md, "Like for like".) LLAMA_SERVER_ARGS adds flags to llama-server alone.
  # shellcheck disable=SC2206 # flags are words
  llama_args=(${LLAMA_SERVER_ARGS:-})
  start_server 18081 /tmp/llama-server-bench.log "$LLAMA_SERVER" -m "$model" --port 18081 -c "$ctx" -t "$threads" -tb "$threads" -np 1 --jinja "${media_args[@]}" "${llama_args[@]}"
  servers+=(--url http://127.0.0.1:18081 --name llama-server --pid "$(cat "$state/18081.pid")" --restart "bash $state/18081.restart")
fi

./target/release/firstword bench "${servers[@]}" "${bench_media[@]}" "$@"
