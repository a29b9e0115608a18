#!/usr/bin/env python3
"""Floods a running firstword with large bodies and measures how the rest of the server fares.

CLIENTS threads loop POSTs of the largest bodies the server accepts (`allowed`: a
/detokenize of 4 contexts of token ids and an /apply-template of MAX_MESSAGES messages filling
the body limit) or the attacks that must be refused (`attack`: a 32 MiB /detokenize of zeros,
a 32 MiB /apply-template of ~900K tiny messages, a /tokenize with_pieces of 8 MB of text, a
/v1/responses with 30 MB of metadata), while one thread asks GET /health every 50 ms. Reports
/health latency percentiles, answers by endpoint and status, and the server's peak RSS
(VmHWM of --pid, which is the whole process's peak since it started). With --once, each body
is sent once, one after another, each with its time, status, the slowest /health during it and
the server's RSS after it.

    scripts/flood.py --port 8080 --pid $(pgrep -n firstword) --n-ctx 4096 --kind allowed
    scripts/flood.py --port 8080 --pid $(pgrep -n firstword) --kind attack --once

Python standard library only.
"""

import argparse
import http.client
import json
import threading
import time
from collections import Counter

MAX_MESSAGES = 4096
TOKENIZER_CONTEXTS = 4
BODY_LIMIT = 32 * 1024 * 1024


def bodies(kind, n_ctx):
    """(path, body bytes) pairs the clients cycle through."""
    if kind == "allowed":
        ids = [(i * 7919) % 40000 for i in range(TOKENIZER_CONTEXTS * n_ctx)]
        detok = json.dumps({"tokens": ids}).encode()
        # The largest chat the limits allow: MAX_MESSAGES messages filling the body limit.
        per_message = (BODY_LIMIT - 4096) // MAX_MESSAGES - 40
        text = "word " * (per_message // 5)
        messages = [{"role": "user" if i % 2 == 0 else "assistant", "content": text} for i in range(MAX_MESSAGES)]
        template = json.dumps({"messages": messages}).encode()
        return [("/detokenize", detok), ("/apply-template", template)]
    zeros = b'{"tokens":[' + b"0," * (BODY_LIMIT // 2 - 16) + b"0]}"
    tiny = b'{"role":"user","content":""},'
    many = b'{"messages":[' + tiny * ((BODY_LIMIT - 64) // len(tiny) - 1) + b'{"role":"user","content":""}]}'
    pieces = json.dumps({"content": "ab " * (8_000_000 // 3), "with_pieces": True}).encode()
    metadata = json.dumps({"input": "hi", "metadata": {"k": "v" * 30_000_000}}).encode()
    return [("/detokenize", zeros), ("/apply-template", many), ("/tokenize", pieces), ("/v1/responses", metadata)]


def client(port, work, stop, answers, lock):
    i = 0
    while not stop.is_set():
        path, body = work[i % len(work)]
        i += 1
        started = time.monotonic()
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
            conn.request("POST", path, body=body, headers={"Content-Type": "application/json"})
            response = conn.getresponse()
            response.read()
            status = response.status
            conn.close()
        except (OSError, http.client.HTTPException) as e:
            status = type(e).__name__
        elapsed = time.monotonic() - started
        with lock:
            answers[(path, status)] += 1
            answers[(path, "seconds")] = max(answers[(path, "seconds")], elapsed)


def health(port, stop, latencies, failures):
    conn = None
    while not stop.is_set():
        started = time.monotonic()
        try:
            if conn is None:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            conn.request("GET", "/health")
            response = conn.getresponse()
            response.read()
            if response.status != 200:
                failures.append(response.status)
        except (OSError, http.client.HTTPException) as e:
            failures.append(type(e).__name__)
            conn = None
        latencies.append((time.monotonic() - started) * 1000)
        time.sleep(0.05)


def rss_mib(pid, field="VmHWM"):
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    return None


def once(args, work):
    """Each body once: its answer, time, the slowest /health during it, RSS after it."""
    for path, body in work:
        stop = threading.Event()
        latencies, failures = [], []
        prober = threading.Thread(target=health, args=(args.port, stop, latencies, failures))
        prober.start()
        answers = {}
        started = time.monotonic()
        sender = threading.Thread(target=lambda: one_request(args.port, path, body, answers))
        sender.start()
        sender.join()
        elapsed = time.monotonic() - started
        stop.set()
        prober.join()
        rss = ""
        if args.pid:
            rss = f", RSS {rss_mib(args.pid, 'VmRSS'):.0f} MiB (peak {rss_mib(args.pid):.0f} MiB)"
        print(
            f"{path} {len(body) / 2**20:.1f} MiB: {answers['status']} {answers['message'][:90]!r} in {elapsed:.2f} s, "
            f"/health max {max(latencies, default=float('nan')):.1f} ms over {len(latencies)} probes{rss}"
        )


def one_request(port, path, body, answers):
    answers["status"], answers["message"] = "no answer", ""
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        conn.request("POST", path, body=body, headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        text = response.read()
    except (OSError, http.client.HTTPException) as e:
        answers["status"] = type(e).__name__
        return
    answers["status"] = response.status
    try:
        error = json.loads(text).get("error") or {}
        answers["message"] = error.get("message") or f"{len(text)} bytes"
    except ValueError:
        answers["message"] = text[:90].decode(errors="replace")
    conn.close()


def percentile(values, p):
    values = sorted(values)
    return values[min(len(values) - 1, int(len(values) * p / 100))] if values else float("nan")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--pid", type=int, help="the server's process id, for its peak RSS")
    parser.add_argument("--n-ctx", type=int, default=4096, help="the server's context size")
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--kind", choices=["allowed", "attack"], default="allowed")
    parser.add_argument("--once", action="store_true", help="each body once, one after another")
    args = parser.parse_args()

    work = bodies(args.kind, args.n_ctx)
    if args.once:
        once(args, work)
        return
    sizes = ", ".join(f"{path} {len(body) / 2**20:.1f} MiB" for path, body in work)
    print(f"{args.clients} clients, {args.seconds:.0f} s, {args.kind} bodies: {sizes}")
    stop = threading.Event()
    answers, lock = Counter(), threading.Lock()
    latencies, failures = [], []
    threads = [threading.Thread(target=health, args=(args.port, stop, latencies, failures))]
    threads += [
        threading.Thread(target=client, args=(args.port, work, stop, answers, lock)) for _ in range(args.clients)
    ]
    for thread in threads:
        thread.start()
    time.sleep(args.seconds)
    stop.set()
    for thread in threads:
        thread.join()

    print(
        f"/health: {len(latencies)} probes, p50 {percentile(latencies, 50):.1f} ms, "
        f"p99 {percentile(latencies, 99):.1f} ms, max {max(latencies, default=float('nan')):.1f} ms, "
        f"failures {Counter(failures)}"
    )
    for path, _ in work:
        statuses = {status: n for (p, status), n in sorted(answers.items(), key=str) if p == path and status != "seconds"}
        print(f"{path}: {statuses}, slowest answer {answers[(path, 'seconds')]:.2f} s")
    if args.pid:
        print(f"server peak RSS (VmHWM): {rss_mib(args.pid):.0f} MiB, now {rss_mib(args.pid, 'VmRSS'):.0f} MiB")


if __name__ == "__main__":
    main()
