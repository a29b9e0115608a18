#!/usr/bin/env python3
"""Prompt time of new long prompts, one conversation at a time, against a running server:
what conversations kept in their cells beside sequence 0 cost the next one's evaluation
(docs/benchmarks.md, "Kept cells cost long evaluations").

Usage: scripts/kept-cost.py PORT [WORDS]   (a server on 127.0.0.1:PORT, e.g.
  firstword serve -m models/SmolLM2-135M-Instruct.Q4_1.gguf -c 8192 -t 2 --threads-batch 2 --parallel N --no-cache-dir)
Two rounds of four chat requests, each a system message of WORDS distinct words (700 by
default) and "Say ok.", one token generated; prints each one's prompt tokens and time.
"""
import json
import sys
import time
import urllib.request

port = int(sys.argv[1])
words = int(sys.argv[2]) if len(sys.argv) > 2 else 700


def ask(seed: int) -> None:
    text = " ".join(f"w{seed}x{i}" for i in range(words))
    body = {"model": "default", "max_tokens": 1, "temperature": 0,
            "messages": [{"role": "system", "content": f"Notes {seed}: {text}"},
                         {"role": "user", "content": "Say ok."}]}
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions",
                                     json.dumps(body).encode(), {"Content-Type": "application/json"})
    started = time.time()
    reply = json.load(urllib.request.urlopen(request))
    took = time.time() - started
    print(f"prompt {seed}: {reply['usage']['prompt_tokens']} tokens, {took * 1000:.0f} ms", flush=True)


for round_ in range(2):
    for i in range(4):
        ask(round_ * 10 + i)
