#!/usr/bin/env python3
"""What llama.cpp's RPC backend costs firstword: the same model local, split over two
rpc-servers on loopback, and split over two rpc-servers behind a simulated link
(scripts/rpc-link.py: latency each way and a bandwidth cap), measured in turn, in rounds (the
order reversed every other round), medians printed.

Per variant and round, on a fresh firstword (`-c 8192 -t 2 --parallel 1 --no-cache-dir`):
- warm TTFT: a ~2K-token system prompt and a question (cold, not timed), then the same system
  prompt and another question, timed to the first streamed token;
- decode: 128 greedy tokens of a long answer, tokens per second from the server's timings;
- a RAM-store round trip: another ~1K-token prompt displaces the conversation, and the
  conversation's next request restores it from the store (`timings.cache.restore`; the save
  happened when it was displaced);
- for the simulated links, the bytes and bursts (about one per round trip) each direction
  carried per generated token, counted by the link.

Usage: scripts/rpc-costs.py MODEL LAYERS [ROUNDS] [VARIANTS]
LAYERS: --ngl for the split (the rest stay on the local CPU). VARIANTS: comma-separated among
local, loopback, llama-server (llama-server `--rpc` over loopback, one slot, on the same split
and the same `firstword rpc-server`s; set LLAMA_SERVER=$(scripts/build-llama-server.sh)),
proxy (the link script with no delay and no cap: what the Python proxy itself costs, the
baseline of the links), 1gbe (0.15 ms each way, 1000 Mbit/s), 10gbe (0.05 ms, 10000 Mbit/s),
wifi (1.5 ms, 300 Mbit/s); default all but llama-server. Needs the ports 18400-18420 free.
"""
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

from bench_common import system_prompt, wait_for_health

MODEL, LAYERS = sys.argv[1], sys.argv[2]
ROUNDS = int(sys.argv[3]) if len(sys.argv) > 3 else 3
VARIANTS = sys.argv[4].split(",") if len(sys.argv) > 4 else ["local", "loopback", "proxy", "10gbe", "1gbe", "wifi"]
HERE = os.path.dirname(os.path.abspath(__file__))
FIRSTWORD = os.path.join(HERE, "..", "target", "release", "firstword")
LLAMA_SERVER = os.environ.get("LLAMA_SERVER", "")
LINKS = {"proxy": (0.0, 0), "1gbe": (0.15, 1000), "10gbe": (0.05, 10000), "wifi": (1.5, 300)}
PORT, RPC_PORTS, LINK_PORTS = 18400, (18401, 18402), (18411, 18412)
BASE = f"http://127.0.0.1:{PORT}"


def post(body, stream=False):
    request = urllib.request.Request(
        BASE + "/v1/chat/completions", data=json.dumps(body).encode(), headers={"content-type": "application/json"}
    )
    started = time.perf_counter()
    with urllib.request.urlopen(request) as response:
        if not stream:
            return json.loads(response.read()), time.perf_counter() - started
        for line in response:
            if line.startswith(b"data: ") and b'"content"' in line:
                first = time.perf_counter() - started
                response.read()
                return None, first
    raise RuntimeError("no token streamed")


def chat(system, question, max_tokens, **extra):
    messages = [{"role": "system", "content": system}, {"role": "user", "content": question}]
    return {"messages": messages, "max_tokens": max_tokens, "temperature": 0, **extra}


def start(command, log):
    env = dict(os.environ, LD_LIBRARY_PATH=os.path.dirname(LLAMA_SERVER)) if LLAMA_SERVER else None
    return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=log, env=env)


def wait_port(port):
    import socket

    for _ in range(600):
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError(f"nothing listens on {port}")


def measure(variant, system, other, round_no):
    procs, links = [], []
    log = tempfile.TemporaryFile()
    try:
        serve = [FIRSTWORD, "serve", "-m", MODEL, "-c", "8192", "-t", "2", "--threads-batch", "2", "--parallel", "1",
                 "--no-cache-dir", "--port", str(PORT)]
        if variant == "llama-server":
            serve = [LLAMA_SERVER, "-m", MODEL, "-c", "8192", "-t", "2", "-tb", "2", "-np", "1", "--jinja",
                     "--port", str(PORT)]
        if variant != "local":
            for port in RPC_PORTS:
                procs.append(start([FIRSTWORD, "rpc-server", "--port", str(port), "-t", "2"], log))
                wait_port(port)
            endpoints = [f"127.0.0.1:{p}" for p in RPC_PORTS]
            if variant in LINKS:
                delay, mbit = LINKS[variant]
                for listen, target in zip(LINK_PORTS, RPC_PORTS):
                    stats = tempfile.NamedTemporaryFile(suffix=".json", delete=False).name
                    link = start([sys.executable, os.path.join(HERE, "rpc-link.py"), str(listen), str(target),
                                  "--delay-ms", str(delay), "--mbit", str(mbit), "--stats", stats], log)
                    links.append((link, stats))
                    wait_port(listen)
                endpoints = [f"127.0.0.1:{p}" for p in LINK_PORTS]
            serve += ["--rpc", ",".join(endpoints), "--ngl" if variant != "llama-server" else "-ngl", LAYERS]
        procs.append(start(serve, log))
        wait_for_health(BASE)
        time.sleep(2)
        post(chat(system, f"Round {round_no}: which facts mention trains?", 1))
        _, ttft = post(chat(system, f"Round {round_no}: and gardens?", 8, stream=True), stream=True)
        for link, _ in links:
            link.send_signal(signal.SIGUSR1)
        answer, _ = post(chat(system, "Tell me a long story about every fact you know.", 128,
                              logit_bias={"2": -100}))
        timings = answer["timings"]
        tokens, decode = timings["predicted_n"], timings["predicted_per_second"]
        traffic = {}
        for link, stats in links:
            link.send_signal(signal.SIGUSR1)
            time.sleep(0.3)
            with open(stats) as f:
                for key, value in json.load(f).items():
                    traffic[key] = traffic.get(key, 0) + value / max(tokens, 1)
        post(chat(other, "Summarise this.", 1))
        restored, _ = post(chat(system, f"Round {round_no}: and the river?", 1))
        cache = restored["timings"].get("cache") or {}
        return {"ttft_ms": ttft * 1000, "decode_tps": decode, "restore_ms": cache.get("restore_ms"),
                "source": cache.get("source", "n/a"),
                **{k: v for k, v in traffic.items()}}
    finally:
        for proc in procs[::-1] + [link for link, _ in links]:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()


def main():
    system = system_prompt(2000)
    other = system_prompt(1000).replace("You are", "Reply as")
    results = {variant: [] for variant in VARIANTS}
    for round_no in range(ROUNDS):
        order = VARIANTS if round_no % 2 == 0 else VARIANTS[::-1]
        for variant in order:
            result = measure(variant, system, other, round_no)
            results[variant].append(result)
            print(variant, round_no, json.dumps(result), flush=True)
    print()
    for variant, rows in results.items():
        keys = [k for k in rows[0] if isinstance(rows[0][k], (int, float))]
        medians = {k: round(statistics.median(r[k] for r in rows if isinstance(r.get(k), (int, float))), 2) for k in keys}
        ranges = {k: [round(min(r[k] for r in rows), 1), round(max(r[k] for r in rows), 1)] for k in ("ttft_ms", "decode_tps")}
        print(variant, json.dumps(medians), "ranges", json.dumps(ranges), "sources", sorted({r["source"] for r in rows}))


if __name__ == "__main__":
    main()
