#!/usr/bin/env python3
"""Cold time to first token of firstword and llama-server, each started fresh for every
measure, interleaved (the order reversed every round), nothing else running between them.

Each round starts each server in turn (`-c 8192 -t 2`, one slot, no disk cache), waits for
/health and three quiet seconds, sends one chat request with the bench's ~4K-token synthetic
system prompt and a short user turn (`max_tokens` 1, greedy, not streamed), times it, and stops
the server. Prints each measure and, per server, the median.

Usage: LLAMA_SERVER=$(scripts/build-llama-server.sh) scripts/cold-ttft.py MODEL [ROUNDS] [SERVERS]
SERVERS: a comma-separated subset of firstword, firstword-fixed (--fixed-threads),
firstword-swa-small (--swa-small), firstword-parallel-1 (--parallel 1; firstword's default is 4),
llama-server (its defaults but one slot: weights repacked, as firstword's are), llama-server-np4
(4 slots, a unified KV cache) and llama-server-no-repack.
"""
import json
import os
import statistics
import subprocess
import sys
import time
import urllib.request

from bench_common import system_prompt, wait_for_health

MODEL = sys.argv[1]
ROUNDS = int(sys.argv[2]) if len(sys.argv) > 2 else 3
PORT = 18301
FIRSTWORD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "target", "release", "firstword")
LLAMA_SERVER = os.environ.get("LLAMA_SERVER", "")
COMMON = ["-m", MODEL, "-c", "8192", "-t", "2", "--port", str(PORT)]
SERVERS = {
    "firstword": [FIRSTWORD, "serve", *COMMON, "--threads-batch", "2", "--no-cache-dir"],
    "firstword-fixed": [FIRSTWORD, "serve", *COMMON, "--threads-batch", "2", "--no-cache-dir", "--fixed-threads"],
    "firstword-swa-small": [FIRSTWORD, "serve", *COMMON, "--threads-batch", "2", "--no-cache-dir", "--swa-small"],
    "firstword-parallel-1": [FIRSTWORD, "serve", *COMMON, "--threads-batch", "2", "--no-cache-dir", "--parallel", "1"],
    "llama-server": [LLAMA_SERVER, *COMMON, "-tb", "2", "-np", "1", "--jinja"],
    "llama-server-no-repack": [LLAMA_SERVER, *COMMON, "-tb", "2", "-np", "1", "--jinja", "--no-repack"],
    "llama-server-np4": [LLAMA_SERVER, *COMMON, "-tb", "2", "-np", "4", "-kvu", "--jinja"],
}
names = sys.argv[3].split(",") if len(sys.argv) > 3 else ["firstword", "llama-server", "llama-server-no-repack"]
if any(name.startswith("llama") for name in names) and not LLAMA_SERVER:
    sys.exit("LLAMA_SERVER is not set (LLAMA_SERVER=$(scripts/build-llama-server.sh))")
# llama-server's shared libraries sit next to it.
env = dict(os.environ, LD_LIBRARY_PATH=os.path.dirname(LLAMA_SERVER) if LLAMA_SERVER else "")


def cold_ttft(name, system, round_no):
    base = f"http://127.0.0.1:{PORT}"
    server = subprocess.Popen(SERVERS[name], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    try:
        wait_for_health(base)
        time.sleep(3)
        messages = [{"role": "system", "content": system}, {"role": "user", "content": f"Hello, round {round_no}."}]
        body = json.dumps({"messages": messages, "max_tokens": 1, "temperature": 0}).encode()
        request = urllib.request.Request(base + "/v1/chat/completions", data=body, headers={"content-type": "application/json"})
        started = time.perf_counter()
        urllib.request.urlopen(request).read()
        return time.perf_counter() - started
    finally:
        server.terminate()
        server.wait()
        time.sleep(1)


def main():
    system = system_prompt()
    measured = {name: [] for name in names}
    for round_no in range(ROUNDS):
        for name in names if round_no % 2 == 0 else names[::-1]:
            measured[name].append(cold_ttft(name, system, round_no))
            print(f"round {round_no + 1}: {name} {measured[name][-1]:.2f} s", flush=True)
    for name, seconds in measured.items():
        print(f"{name}: median {statistics.median(seconds):.2f} s", " ".join(f"{s:.2f}" for s in seconds))


main()
