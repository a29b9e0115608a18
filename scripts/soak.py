#!/usr/bin/env python3
"""Soak test (not in CI): starts `firstword serve` and keeps it busy for a while with the mix a
homelab server sees, then prints what it held.

The mix, in rounds: a voice conversation that grows turn by turn past the context (served
with `--context-overflow drop-oldest`), an interleaved one-off job, a tool call, a stream the
client drops halfway, a malformed request, a prefill, and 4 concurrent streams (some get 503
when the queue is full, which is not an error). Memory is sampled from /proc every few
seconds; TTFT is measured on the streamed turns.

    python3 scripts/soak.py models/SmolLM2-135M-Instruct.Q4_1.gguf --minutes 30

Only the Python standard library is used; the server listens on 127.0.0.1 only.
"""

import argparse
import http.client
import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time

SYSTEM = ("You are a voice assistant in a smart home. Answer in one short sentence. "
          "The house has a kitchen, a living room, two bedrooms and a garden. ") * 12


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_mib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


class Client:
    def __init__(self, port):
        self.port = port

    def request(self, method, path, body=None, timeout=300):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        data = None if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
        conn.request(method, path, body=data, headers={"Content-Type": "application/json"})
        return conn, conn.getresponse()

    def chat(self, body):
        conn, response = self.request("POST", "/v1/chat/completions", body)
        payload = response.read()
        conn.close()
        return response.status, json.loads(payload or b"{}")

    def stream(self, body, drop_after=None):
        """Streams a chat; returns (status, ttft_s or None, text, error event or None)."""
        body = dict(body, stream=True)
        started = time.monotonic()
        conn, response = self.request("POST", "/v1/chat/completions", body)
        if response.status != 200:
            response.read()
            conn.close()
            return response.status, None, "", None
        ttft, text, error, chunks = None, "", None, 0
        for raw in response:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            if "error" in event:
                error = event["error"]
                continue
            for choice in event.get("choices", []):
                piece = choice.get("delta", {}).get("content")
                if piece:
                    ttft = ttft or time.monotonic() - started
                    text += piece
                    chunks += 1
            if drop_after is not None and chunks >= drop_after:
                break
        conn.close()
        return 200, ttft, text, error


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--minutes", type=float, default=30)
    parser.add_argument("--binary", default="target/release/firstword")
    parser.add_argument("--ctx-size", type=int, default=2048)
    args = parser.parse_args()

    port = free_port()
    log = open(f"/tmp/firstword-soak-{port}.log", "w")
    server = subprocess.Popen(
        [args.binary, "serve", "-m", args.model, "--port", str(port), "-c", str(args.ctx_size),
         "--no-cache-dir", "--context-overflow", "drop-oldest"],
        stderr=log)
    client = Client(port)
    deadline = time.monotonic() + 300
    while True:
        try:
            conn, response = client.request("GET", "/health", timeout=5)
            response.read()
            conn.close()
            if response.status == 200:
                break
        except OSError:
            pass
        if server.poll() is not None or time.monotonic() > deadline:
            sys.exit(f"the server did not start (log: {log.name})")
        time.sleep(0.5)

    counts = {"served": 0, "errors": 0, "refused_503": 0, "bad_input_4xx": 0, "dropped_streams": 0}
    ttfts, rss = [], [(0.0, rss_mib(server.pid))]
    stop = threading.Event()
    started = time.monotonic()

    def sample_memory():
        while not stop.wait(5):
            rss.append((time.monotonic() - started, rss_mib(server.pid)))

    threading.Thread(target=sample_memory, daemon=True).start()

    def record(status, expect=(200,)):
        if status in expect:
            counts["served"] += 1
        elif status == 503:
            counts["refused_503"] += 1
        else:
            counts["errors"] += 1

    conversation = [{"role": "system", "content": SYSTEM}]
    tools = [{"type": "function", "function": {"name": "set_light", "parameters": {
        "type": "object", "properties": {"room": {"type": "string"}, "on": {"type": "boolean"}},
        "required": ["room", "on"]}}}]
    end = started + args.minutes * 60
    rounds = 0
    while time.monotonic() < end and server.poll() is None:
        rounds += 1
        conversation.append({"role": "user", "content": f"Round {rounds}: is the kitchen light on?"})
        status, ttft, text, error = client.stream({"messages": conversation, "max_tokens": 16})
        record(status if error is None else 500)
        if ttft is not None:
            ttfts.append(ttft)
        conversation.append({"role": "assistant", "content": text})

        status, _ = client.chat({"messages": [{"role": "user", "content": f"Summarise round {rounds}."}],
                                 "max_tokens": 8})
        record(status)
        status, body = client.chat({"messages": [{"role": "user", "content": "Turn on the garden light."}],
                                    "tools": tools, "tool_choice": "required", "max_tokens": 48})
        record(status)
        if status == 200 and not body["choices"][0]["message"].get("tool_calls"):
            counts["errors"] += 1
        status, _, _, _ = client.stream({"messages": [{"role": "user", "content": "Tell me a long story."}],
                                         "max_tokens": 200}, drop_after=3)
        counts["dropped_streams"] += 1
        conn, response = client.request("POST", "/v1/chat/completions", b"{not json")
        response.read()
        conn.close()
        counts["bad_input_4xx" if response.status == 400 else "errors"] += 1
        conn, response = client.request("POST", "/v1/prefill", {"messages": conversation + [
            {"role": "user", "content": "And the"}]})
        response.read()
        conn.close()
        record(response.status)
        threads = [threading.Thread(target=lambda i=i: record(client.stream(
            {"messages": [{"role": "user", "content": f"Say a number near {i}."}], "max_tokens": 8})[0]))
            for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    stop.set()
    alive = server.poll() is None
    rss.append((time.monotonic() - started, rss_mib(server.pid) if alive else 0.0))
    server.terminate()
    code = server.wait(timeout=30)
    ttfts.sort()
    p = lambda q: ttfts[min(len(ttfts) - 1, int(q * len(ttfts)))] * 1000 if ttfts else float("nan")
    steady = [m for t, m in rss if t >= 60] or [m for _, m in rss]
    print(json.dumps({
        "minutes": round((time.monotonic() - started) / 60, 1), "rounds": rounds, **counts,
        "ttft_ms": {"p50": round(p(0.5)), "p99": round(p(0.99)), "n": len(ttfts)},
        "rss_mib": {"start": round(rss[0][1]), "after_1_min": round(steady[0]),
                    "max": round(max(m for _, m in rss)), "end": round(rss[-1][1])},
        "alive_at_end": alive, "exit_code": code, "log": log.name,
    }, indent=2))
    return 0 if alive and counts["errors"] == 0 and code == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
