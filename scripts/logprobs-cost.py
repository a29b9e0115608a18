#!/usr/bin/env python3
"""What log-probabilities cost in decode speed: one `firstword serve`, the same greedy chat
request (the end-of-turn token banned, so every reply is `--tokens` long) without logprobs, with
`logprobs: true` and with `top_logprobs: 20`, interleaved round after round; prints each
setting's median decode rate (`timings.predicted_per_second`) and its ratio to the rate without.
Usage: scripts/logprobs-cost.py MODEL [--rounds N] [--tokens N] [--port P]
(run `cargo build --release` first; run it on an idle machine)
"""
import argparse
import http.client
import json
import statistics
import subprocess
import time

SETTINGS = [("off", {}), ("logprobs", {"logprobs": True}), ("top_logprobs 20", {"logprobs": True, "top_logprobs": 20})]


def post(port, path, body):
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    connection.request("POST", path, json.dumps(body), {"content-type": "application/json"})
    response = connection.getresponse()
    return response.status, json.loads(response.read())


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--port", type=int, default=18700)
    args = parser.parse_args()
    server = subprocess.Popen(
        ["./target/release/firstword", "serve", "-m", args.model, "--port", str(args.port), "-c", "2048",
         "--no-cache-dir", "-t", "2", "--threads-batch", "2"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(600):
            try:
                connection = http.client.HTTPConnection("127.0.0.1", args.port, timeout=2)
                connection.request("GET", "/health")
                if connection.getresponse().status == 200:
                    break
            except OSError:
                pass
            time.sleep(0.2)
        messages = [{"role": "user", "content": "Tell me a long story about a lighthouse keeper."}]
        # The tokens that end a turn (those of the markers that are one token in this model),
        # banned so every reply runs to max_tokens.
        bias = {}
        for marker in ["<|im_end|>", "<end_of_turn>", "<eos>", "</s>"]:
            _, tokens = post(args.port, "/tokenize", {"content": marker})
            if len(tokens["tokens"]) == 1:
                bias[str(tokens["tokens"][0])] = -100
        rates = {name: [] for name, _ in SETTINGS}
        for _ in range(args.rounds):
            for name, extra in SETTINGS:
                body = {"messages": messages, "max_tokens": args.tokens, "temperature": 0, "logit_bias": bias, **extra}
                status, answer = post(args.port, "/v1/chat/completions", body)
                assert status == 200, answer
                assert answer["usage"]["completion_tokens"] == args.tokens, answer["usage"]
                rates[name].append(answer["timings"]["predicted_per_second"])
        baseline = statistics.median(rates["off"])
        print(f"{args.model}: {args.rounds} rounds of {args.tokens} tokens, interleaved")
        for name, _ in SETTINGS:
            median = statistics.median(rates[name])
            print(f"  {name:16} median {median:7.1f} tok/s  x{median / baseline:.3f}  (all: "
                  + ", ".join(f"{r:.1f}" for r in rates[name]) + ")")
    finally:
        server.terminate()
        server.wait()


if __name__ == "__main__":
    main()
