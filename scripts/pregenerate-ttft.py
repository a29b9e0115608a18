#!/usr/bin/env python3
"""Time to first token of a request that follows a /v1/prefill of its exact prompt, with and
without `pregenerate` (a parked generation adopted), on a ~5K-token system prompt; the two
interleaved, six rounds, medians. Usage: scripts/pregenerate-ttft.py BINARY MODEL"""
import json, subprocess, time, urllib.request, statistics, sys
BIN, MODEL, PORT = sys.argv[1], sys.argv[2], 8191
srv = subprocess.Popen([BIN, "serve", "-m", MODEL, "-c", "8192", "-t", "2", "--threads-batch", "2", "--port", str(PORT), "--no-cache-dir"], stderr=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
base = f"http://127.0.0.1:{PORT}"
for _ in range(300):
    try:
        urllib.request.urlopen(base + "/health"); break
    except Exception: time.sleep(0.2)
system = "\n".join(f"Fact {i}: the {['north','south','east','west'][i%4]} garden has {i*7%53} trees and a {['red','blue','green'][i%3]} gate." for i in range(260))
def post(path, body):
    req = urllib.request.Request(base + path, data=json.dumps(body).encode(), headers={"content-type": "application/json"})
    return urllib.request.urlopen(req)
def ttft(body):
    t = time.perf_counter(); r = post("/v1/chat/completions", dict(body, stream=True))
    first = None
    global last
    for line in r:
        if b'"timings"' in line: last = line
        if line.startswith(b"data: ") and b'"content"' in line and first is None:
            d = json.loads(line[6:])
            if d["choices"] and d["choices"][0]["delta"].get("content"):
                first = time.perf_counter() - t
    return first
res = {"plain": [], "pregenerate": []}
for i in range(6):
    for mode in (["plain", "pregenerate"] if i % 2 == 0 else ["pregenerate", "plain"]):
        body = {"messages": [{"role": "system", "content": system}, {"role": "user", "content": f"Which gardens have a red gate? Round {i} {mode}."}], "max_tokens": 24, "temperature": 0}
        p = json.loads(post("/v1/prefill", dict(body, pregenerate=16 if mode == "pregenerate" else 0)).read())
        time.sleep(0.5)
        res[mode].append(ttft(body))
        d = json.loads(last[6:]); print(mode, "%.0f" % (1000*res[mode][-1]), d.get("timings", {}).get("cache"), d.get("timings", {}).get("prompt_ms"), file=sys.stderr)
        if i == 0: print(mode, "prompt_tokens", p["prompt_tokens"], "pregenerated", p["pregenerated_tokens"], file=sys.stderr)
srv.terminate(); srv.wait()
for k, v in res.items(): print(k, "median TTFT ms %.1f" % (1000*statistics.median(v)), ["%.0f" % (1000*x) for x in v])
