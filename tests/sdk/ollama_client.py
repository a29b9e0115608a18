"""The official `ollama` Python client against firstword, called as Home Assistant's Ollama
integration calls it: list the models, then chat streamed with tools, keep_alive=-1 and
num_ctx, a tool result as a `tool` message holding {"data": ..., "error": ...} JSON, and a
second turn. Usage: ollama_client.py BASE_URL. Exits non-zero on the first failed check."""

import json
import sys

import ollama

base = sys.argv[1]
client = ollama.Client(host=base)

listed = client.list()
names = [m.model for m in listed.models]
assert len(names) == 1 and names[0].endswith(":latest"), names
model = names[0]
print("list:", names)

shown = client.show(model)
assert "completion" in (shown.capabilities or []), shown.capabilities
print("show: capabilities", shown.capabilities)

tools = [{"type": "function", "function": {"name": "HassTurnOn", "description": "Turns on a device",
          "parameters": {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}}}]
messages = [{"role": "system", "content": "You are a voice assistant for Home Assistant."},
            {"role": "user", "content": "Turn on the kitchen light."}]
chunks = list(client.chat(model=model, messages=messages, tools=tools, stream=True, keep_alive=-1,
                          options={"num_ctx": 8192, "temperature": 0, "num_predict": 48}, think=None, format=None))
assert chunks[-1].done and chunks[-1].done_reason in ("stop", "length"), chunks[-1]
content = "".join(c.message.content or "" for c in chunks)
calls = [call for c in chunks for call in (c.message.tool_calls or [])]
for call in calls:
    assert call.function.name == "HassTurnOn", call
    assert isinstance(call.function.arguments, dict), call
print("chat streamed:", len(chunks), "chunks,", len(calls), "calls, content", repr(content[:60]))
assert chunks[-1].prompt_eval_count and chunks[-1].prompt_eval_count > 0, chunks[-1]

# The turn as Home Assistant sends it back: the call (one of its own when the model answered
# in text), its result as a tool message, then the next request.
call = calls[0] if calls else ollama.Message.ToolCall(
    function=ollama.Message.ToolCall.Function(name="HassTurnOn", arguments={"name": "kitchen light"}))
messages.append({"role": "assistant", "content": content, "tool_calls": [call]})
messages.append({"role": "tool", "content": json.dumps({"data": {"success": ["kitchen light"]}, "error": None}),
                 "tool_name": "HassTurnOn"})
second = list(client.chat(model=model, messages=messages, tools=tools, stream=True, keep_alive=-1,
                          options={"num_ctx": 8192, "temperature": 0, "num_predict": 24}))
assert second[-1].done, second[-1]
print("second turn: prompt_eval_count", second[-1].prompt_eval_count, "of the first turn's", chunks[-1].prompt_eval_count)

whole = client.chat(model=model, messages=[{"role": "user", "content": "Say hi."}], stream=False,
                    options={"temperature": 0, "num_predict": 8})
assert whole.done and whole.message.role == "assistant", whole
print("chat whole:", repr(whole.message.content))

try:
    client.chat(model="llama3.2:latest", messages=[{"role": "user", "content": "hi"}])
    raise AssertionError("an unknown model was served")
except ollama.ResponseError as e:
    assert e.status_code == 404, e
    print("unknown model:", e.status_code, e.error)
print("ok")
