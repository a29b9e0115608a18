#!/usr/bin/env bash
# Runs each cargo-fuzz target in fuzz/ for FUZZ_SECONDS seconds (default 60), or for FUZZ_RUNS
# executions (then FUZZ_SECONDS, default 6 hours, only bounds it), one after the other in one
# process each, and fails if any of them finds a crash (a panic, a failed check, a timeout or
# too much memory; the input is saved under fuzz/artifacts/<target>/).
#
#   scripts/fuzz.sh                       every target
#   FUZZ_SECONDS=600 scripts/fuzz.sh sse_frame
#   FUZZ_RUNS=10000000 scripts/fuzz.sh    ten million executions of each
#   FUZZ_MAX_LEN=1024 scripts/fuzz.sh     inputs of at most 1 KiB (libFuzzer's default: 4 KiB)
#
# Needs the nightly toolchain and cargo-fuzz (`cargo install cargo-fuzz`), and
# models/SmolLM2-135M-Instruct.Q4_1.gguf (`make models`) for schema_grammar. The first build
# compiles llama.cpp (minutes). No sanitizer: the code under test is safe Rust.
#
# Corpora: fuzz/corpus/<target>/seed-* are the committed seeds. Each run reads them and a
# scratch corpus, fuzz/target/corpus/<target>/ (ignored by git, kept between runs), and adds
# what it finds only to the scratch one; delete it to start from the seeds alone.
set -euo pipefail
cd "$(dirname "$0")/.."

runs="${FUZZ_RUNS:-}"
if [ -n "$runs" ]; then
    seconds="${FUZZ_SECONDS:-21600}"
    budget=(-runs="$runs")
else
    seconds="${FUZZ_SECONDS:-60}"
    budget=()
fi
if [ -n "${FUZZ_MAX_LEN:-}" ]; then
    budget+=(-max_len="$FUZZ_MAX_LEN")
fi
if [ "$#" -gt 0 ]; then
    targets=("$@")
else
    targets=(request_json chat_template tool_call_stream sse_frame schema_grammar media_headers)
fi

cargo +nightly fuzz build -s none
failed=()
for target in "${targets[@]}"; do
    scratch="fuzz/target/corpus/$target"
    log="fuzz/target/logs/$target.log"
    mkdir -p "$scratch" "$(dirname "$log")"
    echo "== $target: ${runs:+$runs executions, at most }${seconds}s"
    status=0
    # Without a sanitizer libFuzzer's timeout handler can deadlock in malloc (it has printed the
    # input's bytes to the log by then): the outer timeout ends such a run.
    timeout -s KILL $((seconds + 300)) cargo +nightly fuzz run -s none "$target" "$scratch" "fuzz/corpus/$target" -- \
        -max_total_time="$seconds" "${budget[@]}" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 >"$log" 2>&1 || status=$?
    executions="$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")"
    echo "   executions: ${executions:-?} (log: $log)"
    if [ "$status" -ne 0 ]; then
        failed+=("$target")
        grep -E '^(==[0-9]+== ERROR|ALARM|thread .* panicked|SUMMARY|artifact_prefix|Test unit written)' "$log" | head -n 20 || true
        [ "$status" -ne 137 ] || echo "   hung after a timeout: the input is the hex line after ALARM in the log"
    fi
done

if [ "${#failed[@]}" -gt 0 ]; then
    echo "crashes found in: ${failed[*]}" >&2
    exit 1
fi
echo "no crashes"
