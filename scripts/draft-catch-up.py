#!/usr/bin/env python3
"""A request sent while a streaming reply's draft model catches up with its prompt
(docs/benchmarks.md, "Several conversations with speculative decoding").

Usage: scripts/draft-catch-up.py PORT   (a server on 127.0.0.1:PORT with a draft model, e.g.
  firstword serve -m models/SmolLM2-135M-Instruct.Q4_1.gguf --spec draft
  --draft-model models/SmolLM2-135M-Instruct.Q4_1.gguf -c 8192 -t 2 --threads-batch 2 --no-cache-dir)
Warms the server with a ~2,800-token system prompt, then streams a 160-token story on it and,
1 s later, sends a short command on the same system prompt: prints the command's TTFT and
when it ended, the story's total time and the gaps between its pieces.
"""
import json, sys, time, threading, urllib.request
port = int(sys.argv[1])
url = f"http://127.0.0.1:{port}/v1/chat/completions"
system = " ".join(f"Fact {i}: the item number {i} is stored in box {i*7%13}." for i in range(150))
def stream(user, n, out):
    body = {"model": "m", "max_tokens": n, "temperature": 0, "stream": True, "stream_options": {"include_usage": True},
            "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}]}
    if n > 40:  # the story: SmolLM2's end-of-turn tokens banned, so it runs to its limit
        body["logit_bias"] = {"2": -100, "0": -100}
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    t0 = time.time(); stamps = []
    with urllib.request.urlopen(req) as r:
        for line in r:
            line = line.decode().strip()
            if line.startswith("data: {"):
                c = json.loads(line[6:])
                if c.get("choices") and c["choices"][0].get("delta", {}).get("content"):
                    stamps.append(time.time() - t0)
                if c.get("timings"): out["timings"] = c["timings"]
    out["stamps"] = stamps
# warm
w = {}; stream("Hello", 4, w)
a = {}; t = threading.Thread(target=stream, args=("Tell me a long story about a dragon in a kitchen.", 160, a)); t.start()
time.sleep(1.0)
b = {}; stream("Turn on the office light.", 24, b)
t.join()
s = a["stamps"]
print("A tokens", len(s), "total %.2f s" % s[-1], "B ttft %.0f ms" % (b["stamps"][0]*1000), "B end %.2f" % (b["stamps"][-1]+1.0))
gaps = [round((s[i+1]-s[i])*1000) for i in range(len(s)-1)]
print("A gaps ms", gaps)
print("A timings", json.dumps(a.get("timings",{}).get("draft")), json.dumps(a.get("timings",{}).get("shared")))
