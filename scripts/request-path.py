#!/usr/bin/env python3
"""What a chat request costs before llama.cpp is called (`timings.request_ms` and its stages),
for a ~4K-token system prompt and ten turns: a conversation the server has not tokenized
before (whole tokenization), then the same conversation one turn longer (its beginning's
tokens kept). Each request generates one token, after a 2 s pause (the engine idle, as between a user's
turns); eight rounds of each, medians.
Usage: scripts/request-path.py BINARY MODEL [ROUNDS]"""
import json, statistics, subprocess, sys, time, urllib.request

BIN, MODEL = sys.argv[1], sys.argv[2]
ROUNDS = int(sys.argv[3]) if len(sys.argv) > 3 else 8
PORT = 8193
PAUSE = 2.0
srv = subprocess.Popen([BIN, "serve", "-m", MODEL, "-c", "8192", "-t", "2", "--threads-batch", "2", "--port", str(PORT),
                        "--no-cache-dir"], stderr=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
base = f"http://127.0.0.1:{PORT}"
for _ in range(300):
    try:
        urllib.request.urlopen(base + "/health")
        break
    except Exception:
        time.sleep(0.2)
# The bench's synthetic system prompt (about 4K tokens).
topics = ["rivers", "mountains", "libraries", "trains", "gardens", "satellites", "bakeries", "harbors"]
system, i = "You are a helpful voice assistant for a smart home. Facts you know:\n", 0
while len(system) * 3 // 8 < 4000:
    system += f"Fact {i}: the {topics[i % 8]} of region {i * 7 % 97} are known for feature {i * 13 % 31} since {1800 + i * 37 % 200}.\n"
    i += 1


def post(body):
    # A pause first, as between a user's turns: the engine finishes the last reply's upkeep,
    # so queue_ms is the hand-over alone.
    time.sleep(PAUSE)
    req = urllib.request.Request(base + "/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"content-type": "application/json"})
    return json.loads(urllib.request.urlopen(req).read())


def conversation(nonce, turns):
    messages = [{"role": "system", "content": f"Session {nonce}.\n{system}"}]
    for t in range(turns):
        messages.append({"role": "user", "content": f"Question {t}: which facts mention {topics[t % 8]}?"})
        messages.append({"role": "assistant", "content": f"Facts {t}, {t + 8} and {t + 16} mention {topics[t % 8]}."})
    messages.append({"role": "user", "content": "And which mention harbors?"})
    return messages


stages = ["read_ms", "parse_ms", "render_ms", "tokenize_ms", "queue_ms", "match_ms"]
results = {"new conversation": [], "one turn longer": []}
for r in range(ROUNDS):
    first = post({"messages": conversation(r, 10), "max_tokens": 1, "temperature": 0})
    longer = post({"messages": conversation(r, 11), "max_tokens": 1, "temperature": 0})
    for name, answer in (("new conversation", first), ("one turn longer", longer)):
        t = answer["timings"]
        results[name].append(dict(t["request"], request_ms=t["request_ms"], prompt_tokens=answer["usage"]["prompt_tokens"]))
srv.terminate()
srv.wait()
for name, rows in results.items():
    med = {k: statistics.median(row[k] for row in rows) for k in ["request_ms"] + stages + ["tokens_kept", "prompt_tokens"]}
    print(f"{name}: request_ms {med['request_ms']:.2f} (" + ", ".join(f"{k} {med[k]:.2f}" for k in stages)
          + f"), tokens kept {med['tokens_kept']:.0f} of {med['prompt_tokens']:.0f}; per round: request_ms "
          + str([round(row["request_ms"], 2) for row in rows]) + ", tokens kept " + str([row["tokens_kept"] for row in rows]))
