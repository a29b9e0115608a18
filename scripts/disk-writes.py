#!/usr/bin/env python3
"""Bytes the disk cache writes over one conversation, against the state it ends with, and the
restore of that conversation after a restart.

One `firstword serve` with a disk cache in a fresh temporary directory, a ~4K-token system
prompt (the bench's synthetic smart-home facts), TURNS turns (20 by default) of greedy replies
of at most 32 tokens. After each reply the script waits until the server's written byte count
(`wchar` in /proc/PID/io: every write() the process made, files, log and sockets alike) has not
moved for 2.5 s (the engine copies the conversation after a second idle), so every turn's write happens (as for a user who reads the reply), then
prints the bytes written so far, by /proc and, where the server has it, by the
`firstword_disk_bytes_written_total` counter of /metrics. Then the server is stopped (SIGTERM)
and started RESTARTS times (3 by default): each start restores the conversation from disk, and
the script prints the restore's time from the server's log (`restored the last conversation`:
read, reassemble, verify and hand to llama.cpp) and the file read's own (`disk cache: read`).

Usage: scripts/disk-writes.py BINARY MODEL [PORT] [TURNS] [RESTARTS]
       (e.g. ./target/release/firstword models/SmolLM2-135M-Instruct.Q4_1.gguf)
"""
import http.client
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time

TOPICS = ["rivers", "mountains", "libraries", "trains", "gardens", "satellites", "bakeries", "harbors"]
QUESTIONS = ["Which facts mention trains? Answer in one sentence.", "And gardens?", "Which region has feature 3?",
             "Summarise what you know in one line.", "Anything about harbors?", "Thanks. What else should I know?",
             "Which facts mention rivers?", "And mountains?", "Which is the oldest fact?", "And the newest?"]


def system_prompt(tokens=4000):
    """`firstword::bench::synthetic_system_prompt`, written again here."""
    text = "You are a helpful voice assistant for a smart home. Facts you know:\n"
    i = 0
    while len(text) * 3 // 8 < tokens:
        text += (f"Fact {i}: the {TOPICS[i % 8]} of region {i * 7 % 97} are known for feature {i * 13 % 31} "
                 f"since {1800 + i * 37 % 200}.\n")
        i += 1
    return text


def written(pid):
    """Bytes the process passed to write() so far."""
    with open(f"/proc/{pid}/io") as io:
        for line in io:
            if line.startswith("wchar:"):
                return int(line.split()[1])
    return 0


def settle(pid):
    """Waits until the process has written nothing for 2.5 s (the engine copies a conversation
    for the disk cache after a second idle); returns its byte count."""
    last, still = written(pid), 0
    while still < 13:
        time.sleep(0.2)
        now = written(pid)
        still = still + 1 if now == last else 0
        last = now
    return last


def get(port, path):
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    connection.request("GET", path)
    response = connection.getresponse()
    return response.status, response.read().decode()


def counter(port):
    """`firstword_disk_bytes_written_total`, or None where the server has no such counter."""
    _, text = get(port, "/metrics")
    found = re.search(r"^firstword_disk_bytes_written_total (\d+)", text, re.M)
    return int(found.group(1)) if found else None


def main():
    binary, model = sys.argv[1], sys.argv[2]
    port = int(sys.argv[3]) if len(sys.argv) > 3 else 18610
    turns = int(sys.argv[4]) if len(sys.argv) > 4 else 20
    restarts = int(sys.argv[5]) if len(sys.argv) > 5 else 3
    cache = tempfile.mkdtemp(prefix="firstword-disk-writes-")
    log_path = cache + ".log"
    log = open(log_path, "w")

    def start():
        server = subprocess.Popen(
            [binary, "serve", "-m", model, "--port", str(port), "-c", "8192", "-t", "2", "--threads-batch", "2",
             "--cache-dir", cache],
            stderr=log, stdout=subprocess.DEVNULL, env={**os.environ, "RUST_LOG": "info,firstword=debug"})
        for _ in range(600):
            try:
                if get(port, "/health")[0] == 200:
                    return server
            except OSError:
                pass
            time.sleep(0.2)
        raise SystemExit("the server did not become ready")

    def ask(messages):
        body = json.dumps({"messages": messages, "max_tokens": 32, "temperature": 0})
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
        connection.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
        reply = json.loads(connection.getresponse().read())
        return reply["choices"][0]["message"]["content"], reply["usage"]

    server = start()
    start_bytes = settle(server.pid)
    messages = [{"role": "system", "content": system_prompt()}]
    for turn in range(1, turns + 1):
        messages.append({"role": "user", "content": QUESTIONS[(turn - 1) % len(QUESTIONS)]})
        text, usage = ask(messages)
        messages.append({"role": "assistant", "content": text})
        total = settle(server.pid) - start_bytes
        print(f"turn {turn}: prompt {usage['prompt_tokens']} tokens, written so far {total / 2**20:.1f} MiB "
              f"(/proc), counter {counter(port)}", flush=True)
    _, status = get(port, "/cache")
    disk = json.loads(status)["disk"]
    state = max(entry["bytes"] for entry in disk["entries"])
    total = written(server.pid) - start_bytes
    print(f"final state {state / 2**20:.1f} MiB in {len(disk['entries'])} entries; written {total / 2**20:.1f} "
          f"MiB (/proc) = {total / state:.2f} x the final state; counter {counter(port)}; cache {disk}")
    for restart in range(restarts):
        server.send_signal(signal.SIGTERM)
        server.wait()
        server = start()
    server.send_signal(signal.SIGTERM)
    server.wait()
    log.close()
    restores, reads = [], []
    for line in open(log_path):
        line = re.sub(r"\x1b\[[0-9;]*m", "", line)
        if "restored the last conversation" in line:
            restores.append(int(re.search(r"ms=(\d+)", line).group(1)))
        elif "disk cache: read" in line:
            reads.append(float(re.search(r"ms=([\d.]+)", line).group(1)))
    print(f"restores at start-up (ms): {restores}, median {statistics.median(restores) if restores else None}; "
          f"file reads (ms): {reads}")
    for root, _, files in os.walk(cache):
        for name in files:
            print("file", name, os.path.getsize(os.path.join(root, name)), "bytes")


if __name__ == "__main__":
    main()
