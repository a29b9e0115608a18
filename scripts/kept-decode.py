#!/usr/bin/env python3
"""Decode speed and the time to first token of a short new prompt after long conversations,
against a running server: whether conversations kept in their cells beside the one generating
slow its decode steps, and what a request sent right after a reply waits for (docs/benchmarks.md,
"Quality graded blind and the weighted verdict").

Usage: scripts/kept-decode.py PORT [WORDS] [CONVERSATIONS]   (a server on 127.0.0.1:PORT, e.g.
  firstword serve -m models/SmolLM2-135M-Instruct.Q4_1.gguf -c 8192 -t 2 --threads-batch 2 --parallel N --no-cache-dir)
First CONVERSATIONS (3) long conversations, each a system message of WORDS (700) distinct words
and "Say ok." (one token); then three times a short new prompt ("Write a long story about a
dragon who learns to bake.", 128 tokens, greedy, streamed): prints its TTFT, and its decode
rate (tokens after the first over the time after the first).
"""
import json
import sys
import time
import urllib.request

port = int(sys.argv[1])
words = int(sys.argv[2]) if len(sys.argv) > 2 else 700
conversations = int(sys.argv[3]) if len(sys.argv) > 3 else 3
url = f"http://127.0.0.1:{port}/v1/chat/completions"


def post(body: dict):
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    return urllib.request.urlopen(request)


for seed in range(conversations):
    text = " ".join(f"w{seed}x{i}" for i in range(words))
    reply = json.load(post({"model": "default", "max_tokens": 1, "temperature": 0,
                            "messages": [{"role": "system", "content": f"Notes {seed}: {text}"},
                                         {"role": "user", "content": "Say ok."}]}))
    print(f"conversation {seed}: {reply['usage']['prompt_tokens']} prompt tokens", flush=True)

for attempt in range(3):
    started = time.time()
    stamps = []
    body = {"model": "default", "max_tokens": 128, "temperature": 0, "stream": True,
            "messages": [{"role": "user", "content": f"Write a long story about dragon {attempt} who learns to bake."}]}
    with post(body) as response:
        for line in response:
            line = line.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            choices = chunk.get("choices") or []
            if choices and choices[0].get("delta", {}).get("content"):
                stamps.append(time.time())
    ttft = (stamps[0] - started) * 1000
    rate = (len(stamps) - 1) / (stamps[-1] - stamps[0]) if len(stamps) > 1 else 0.0
    print(f"short prompt {attempt}: TTFT {ttft:.0f} ms, {len(stamps)} deltas, decode {rate:.1f} tok/s", flush=True)
