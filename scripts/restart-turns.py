#!/usr/bin/env python3
"""The first turn after a restart, three times in a row, against the warm turns around them:
one `firstword serve` with a disk cache in a fresh temporary directory, a 4K-token system
prompt (the bench's synthetic smart-home facts), SIGTERM and a restart before every other turn.
Prints each turn's TTFT and `timings.cache`, then the disk cache's own times from its debug log
(the live state's copy after a reply, the file's write, its read at start-up, the restore) and
the file's size. Usage: scripts/restart-turns.py MODEL [PORT]  (run `cargo build --release` first)
"""
import http.client
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

TOPICS = ["rivers", "mountains", "libraries", "trains", "gardens", "satellites", "bakeries", "harbors"]
QUESTIONS = ["Which facts mention trains? Answer in one sentence.", "And gardens?", "Which region has feature 3?",
             "Summarise what you know in one line.", "Anything about harbors?", "Thanks. What else should I know?",
             "Which facts mention rivers?", "And mountains?"]


def system_prompt(tokens=4000):
    """`firstword::bench::synthetic_system_prompt`, written again here."""
    text = "You are a helpful voice assistant for a smart home. Facts you know:\n"
    i = 0
    while len(text) * 3 // 8 < tokens:
        text += (f"Fact {i}: the {TOPICS[i % 8]} of region {i * 7 % 97} are known for feature {i * 13 % 31} "
                 f"since {1800 + i * 37 % 200}.\n")
        i += 1
    return text


def main():
    model, port = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 18600
    cache = tempfile.mkdtemp(prefix="firstword-restart-")
    log_path = cache + ".log"
    log = open(log_path, "w")

    def start():
        server = subprocess.Popen(
            ["./target/release/firstword", "serve", "-m", model, "--port", str(port), "-c", "8192", "-t", "2",
             "--threads-batch", "2", "--cache-dir", cache],
            stderr=log, stdout=subprocess.DEVNULL, env={**os.environ, "RUST_LOG": "info,firstword=debug"})
        for _ in range(600):
            try:
                connection = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
                connection.request("GET", "/health")
                if connection.getresponse().status == 200:
                    return server
            except OSError:
                pass
            time.sleep(0.2)
        raise SystemExit("the server did not become ready")

    def ask(messages):
        body = json.dumps({"messages": messages, "max_tokens": 32, "temperature": 0, "stream": True,
                           "stream_options": {"include_usage": True}})
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
        started = time.perf_counter()
        connection.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
        ttft, text, usage, cache_report = None, "", None, None
        for raw in connection.getresponse():
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            for choice in chunk.get("choices", []):
                piece = choice.get("delta", {}).get("content")
                if piece:
                    ttft = ttft or (time.perf_counter() - started) * 1000
                    text += piece
            usage = chunk.get("usage") or usage
            cache_report = (chunk.get("timings") or {}).get("cache", cache_report)
        return ttft, text, usage, cache_report

    messages = [{"role": "system", "content": system_prompt()}]
    questions = iter(QUESTIONS)

    def turn(label):
        messages.append({"role": "user", "content": next(questions)})
        ttft, text, usage, report = ask(messages)
        messages.append({"role": "assistant", "content": text})
        print(f"{label}: TTFT {ttft:.0f} ms, prompt {usage['prompt_tokens']}, "
              f"cached {usage['prompt_tokens_details']['cached_tokens']}, cache {report}", flush=True)

    server = start()
    turn("cold")
    time.sleep(3)
    turn("warm")
    for restart in range(1, 4):
        time.sleep(3)
        server.send_signal(signal.SIGTERM)
        server.wait()
        server = start()
        time.sleep(3)
        turn(f"after restart {restart}")
        time.sleep(3)
        turn("warm")
    server.send_signal(signal.SIGTERM)
    server.wait()
    log.close()
    wanted = re.compile(r"disk cache: (written|read)|copied for the disk cache|restored the last|disk cache written")
    for line in open(log_path):
        if wanted.search(line):
            print(re.sub(r"\x1b\[[0-9;]*m", "", line.strip()))
    for root, _, files in os.walk(cache):
        for name in files:
            print("file", name, os.path.getsize(os.path.join(root, name)), "bytes")


if __name__ == "__main__":
    main()
