#!/usr/bin/env python3
"""Time to first token after a cancelled reply, against a warm turn, on a ~4K-token system
prompt; the three interleaved, ROUNDS rounds, medians. Each round asks a new question and
streams the reply, then:
  warm     reads the reply to its end and sends the next turn with the whole reply;
  barge-in leaves the stream after its first 20 pieces of text and sends the next turn with the
           reply cut to what was "spoken" (the text received, its last word cut in half);
  resend   leaves the stream after its first 10 pieces of text and sends the same request again.
Usage: scripts/barge-in-ttft.py BINARY MODEL [ROUNDS]"""
import json, subprocess, time, urllib.request, urllib.error, statistics, sys
BIN, MODEL = sys.argv[1], sys.argv[2]
ROUNDS = int(sys.argv[3]) if len(sys.argv) > 3 else 6
def free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0)); return s.getsockname()[1]
PORT = free_port()
srv = subprocess.Popen([BIN, "serve", "-m", MODEL, "-c", "8192", "-t", "2", "--threads-batch", "2", "--port", str(PORT), "--no-cache-dir"], stderr=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
base = f"http://127.0.0.1:{PORT}"
for _ in range(600):
    if srv.poll() is not None: sys.exit("the server exited")
    try:
        urllib.request.urlopen(base + "/health"); break
    except Exception: time.sleep(0.2)
system = "\n".join(f"Fact {i}: the {['north','south','east','west'][i%4]} garden has {i*7%53} trees and a {['red','blue','green'][i%3]} gate." for i in range(200))

def post(path, body):
    req = urllib.request.Request(base + path, data=json.dumps(body).encode(), headers={"content-type": "application/json"})
    for _ in range(100):
        try:
            return urllib.request.urlopen(req)
        except urllib.error.HTTPError as e:
            # A full queue (the left request still leaving it) or the model still loading.
            if e.code != 503: raise
            print("503", e.read()[:200], file=sys.stderr); time.sleep(0.05)
    raise RuntimeError("the server stayed busy")

def stream(body, leave_after=None):
    """Streams a chat completion: (text received, TTFT s, timings.cache); leaves after
    `leave_after` pieces of text (closing the connection) when given."""
    t = time.perf_counter(); r = post("/v1/chat/completions", dict(body, stream=True))
    first, text, pieces, cache = None, "", 0, None
    for line in r:
        if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"): continue
        d = json.loads(line[6:])
        if d.get("timings"): cache = d["timings"]["cache"]
        if d["choices"] and d["choices"][0]["delta"].get("content"):
            if first is None: first = time.perf_counter() - t
            text += d["choices"][0]["delta"]["content"]; pieces += 1
            if leave_after is not None and pieces >= leave_after:
                r.close(); break
    return text, first, cache

def cut_mid_word(text):
    words = text.rstrip().split(" ")
    last = words[-1]
    return " ".join(words[:-1] + [last[: max(1, len(last) // 2)]])

res = {"warm": [], "barge-in": [], "resend": []}
modes = list(res)
def rounds():
    for i in range(ROUNDS):
        order = modes[i % 3:] + modes[: i % 3]
        for mode in order:
            ask = f"Round {i} {mode}: describe the gardens with a red gate, one by one."
            turn1 = {"messages": [{"role": "system", "content": system}, {"role": "user", "content": ask}], "max_tokens": 80, "temperature": 0}
            if mode == "warm":
                reply, _, _ = stream(turn1)
                nxt = dict(turn1, messages=turn1["messages"] + [{"role": "assistant", "content": reply}, {"role": "user", "content": "Which one has the most trees?"}], max_tokens=16)
            elif mode == "barge-in":
                spoken, _, _ = stream(turn1, leave_after=20)
                nxt = dict(turn1, messages=turn1["messages"] + [{"role": "assistant", "content": cut_mid_word(spoken)}, {"role": "user", "content": "Wait, which one has the most trees?"}], max_tokens=16)
            else:
                stream(turn1, leave_after=10)
                nxt = turn1
            _, ttft, cache = stream(nxt)
            res[mode].append(ttft)
            print(mode, "%.1f ms" % (1000 * ttft), cache, file=sys.stderr)
try:
    rounds()
finally:
    srv.terminate(); srv.wait()
warm = statistics.median(res["warm"])
for k, v in res.items():
    m = statistics.median(v)
    print(f"{k}: median TTFT {1000*m:.1f} ms ({m/warm:.2f}x warm)", ["%.0f" % (1000 * x) for x in v])
