#!/usr/bin/env python3
"""Warm time to first token of one server alone, with a pause before each turn (the user
reading or listening) or back to back (PAUSE=0: a client that sends its next request as soon
as the reply ends).

Starts BINARY (firstword, or llama-server when its name says so) on MODEL (`-c 8192 -t 2`,
one slot, no disk cache), sends a conversation of nine short turns ("And fact N?", 16 tokens
each, greedy, streamed) on the bench's ~4K-token synthetic system prompt, and prints each warm
turn's TTFT (firstword's also with its prefilled tokens and `timings.request.queue_ms`) and
their median. Run it for each server in turn, on an otherwise idle machine.

Usage: [PAUSE=seconds, default 1.5] scripts/warm-ttft.py BINARY MODEL [extra server flags]
"""
import json
import os
import statistics
import subprocess
import sys
import time
import urllib.request

from bench_common import system_prompt, wait_for_health

BINARY, MODEL, EXTRA = sys.argv[1], sys.argv[2], sys.argv[3:]
PAUSE = float(os.environ.get("PAUSE", "1.5"))
PORT = 18311
BASE = f"http://127.0.0.1:{PORT}"
common = ["-m", MODEL, "-c", "8192", "-t", "2", "--port", str(PORT)]
if "llama-server" in os.path.basename(BINARY):
    command = [BINARY, *common, "-tb", "2", "-np", "1", "--jinja", *EXTRA]
else:
    command = [BINARY, "serve", *common, "--threads-batch", "2", "--no-cache-dir", *EXTRA]


def turn(messages):
    """Streams one reply; returns (TTFT in seconds, its text, firstword's timings or None)."""
    body = json.dumps({"messages": messages, "max_tokens": 16, "temperature": 0, "stream": True}).encode()
    request = urllib.request.Request(BASE + "/v1/chat/completions", data=body, headers={"content-type": "application/json"})
    started = time.perf_counter()
    first, text, timings = None, "", None
    for line in urllib.request.urlopen(request):
        if not line.startswith(b"data: {"):
            continue
        chunk = json.loads(line[6:])
        timings = chunk.get("timings", timings)
        choices = chunk.get("choices") or []
        if choices and choices[0]["delta"].get("content"):
            first = first or time.perf_counter() - started
            text += choices[0]["delta"]["content"]
    return first, text, timings


def main():
    env = dict(os.environ, LD_LIBRARY_PATH=os.path.dirname(BINARY))
    server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    try:
        wait_for_health(BASE)
        messages = [{"role": "system", "content": system_prompt()}]
        warm = []
        for n in range(9):
            messages.append({"role": "user", "content": f"And fact {n * 7}?"})
            time.sleep(PAUSE)
            first, text, timings = turn(messages)
            messages.append({"role": "assistant", "content": text})
            if n == 0:
                continue
            warm.append(first)
            detail = ""
            if timings and "cache" in timings:
                queue = (timings.get("request") or {}).get("queue_ms", 0.0)
                detail = f" prefilled {timings['cache']['prefilled']}, queued {queue:.0f} ms"
            print(f"turn {n + 1}: TTFT {first * 1000:.0f} ms{detail}", flush=True)
        print(f"{os.path.basename(BINARY)} {' '.join(EXTRA)} pause {PAUSE} s: median warm TTFT {statistics.median(warm) * 1000:.0f} ms")
    finally:
        server.terminate()
        server.wait()


main()
