// The official `ollama` JavaScript client (ollama-js, pinned by scripts/ollama-js.sh) against
// firstword, called as Home Assistant's Ollama integration calls the Python one: without the
// API key (a 401 the client reads as a message), then with it as a header: list the models,
// show the one, chat streamed with tools, keep_alive -1 and num_ctx, the call's result sent
// back as a `tool` message holding {"data": ..., "error": ...} JSON, a second turn, a whole
// answer and an unknown model's 404.
// Usage: node ollama_client.mjs NODE_MODULES BASE_URL API_KEY. Exits non-zero on the first
// failed check.
import assert from "node:assert/strict";
import path from "node:path";
import { pathToFileURL } from "node:url";

const [modules, host, key] = process.argv.slice(2);
const { Ollama } = await import(pathToFileURL(path.join(modules, "ollama/dist/index.mjs")).href);

const keyless = new Ollama({ host });
await assert.rejects(keyless.list(), (e) => {
  assert.equal(e.name, "ResponseError");
  assert.equal(e.status_code, 401);
  assert.match(e.error, /missing API key/, "the error is read as Ollama's string");
  console.log("no key:", e.status_code, e.error);
  return true;
});

const client = new Ollama({ host, headers: { Authorization: `Bearer ${key}` } });
const listed = await client.list();
const names = listed.models.map((m) => m.model);
assert.equal(names.length, 1);
assert.ok(names[0].endsWith(":latest"), names);
const model = names[0];
console.log("list:", names);

const shown = await client.show({ model });
assert.ok(shown.capabilities.includes("completion"), shown.capabilities);
console.log("show: capabilities", shown.capabilities);

const tools = [{ type: "function", function: { name: "HassTurnOn", description: "Turns on a device",
  parameters: { type: "object", properties: { name: { type: "string" } }, required: ["name"] } } }];
const messages = [{ role: "system", content: "You are a voice assistant for Home Assistant." },
  { role: "user", content: "Turn on the kitchen light." }];
const chunks = [];
for await (const part of await client.chat({ model, messages, tools, stream: true, keep_alive: -1,
  options: { num_ctx: 8192, temperature: 0, num_predict: 48 } })) {
  chunks.push(part);
}
const last = chunks.at(-1);
assert.ok(last.done && ["stop", "length"].includes(last.done_reason), JSON.stringify(last));
assert.ok(last.prompt_eval_count > 0, JSON.stringify(last));
const content = chunks.map((c) => c.message.content ?? "").join("");
const calls = chunks.flatMap((c) => c.message.tool_calls ?? []);
for (const call of calls) {
  assert.equal(call.function.name, "HassTurnOn");
  assert.equal(typeof call.function.arguments, "object", "arguments are an object, never JSON text");
}
console.log("chat streamed:", chunks.length, "chunks,", calls.length, "calls, content", JSON.stringify(content.slice(0, 60)));

// The turn as Home Assistant sends it back (a call of its own when the model answered in text).
const call = calls[0] ?? { function: { name: "HassTurnOn", arguments: { name: "kitchen light" } } };
messages.push({ role: "assistant", content, tool_calls: [call] });
messages.push({ role: "tool", content: JSON.stringify({ data: { success: ["kitchen light"] }, error: null }),
  tool_name: "HassTurnOn" });
const second = [];
for await (const part of await client.chat({ model, messages, tools, stream: true, keep_alive: -1,
  options: { num_ctx: 8192, temperature: 0, num_predict: 24 } })) {
  second.push(part);
}
assert.ok(second.at(-1).done, JSON.stringify(second.at(-1)));
console.log("second turn: prompt_eval_count", second.at(-1).prompt_eval_count, "of the first turn's", last.prompt_eval_count);

const whole = await client.chat({ model, messages: [{ role: "user", content: "Say hi." }], stream: false,
  options: { temperature: 0, num_predict: 8 } });
assert.ok(whole.done && whole.message.role === "assistant", JSON.stringify(whole));
console.log("chat whole:", JSON.stringify(whole.message.content));

await assert.rejects(client.chat({ model: "llama3.2:latest", messages: [{ role: "user", content: "hi" }] }), (e) => {
  assert.equal(e.status_code, 404);
  assert.match(e.error, /not found/);
  console.log("unknown model:", e.status_code, e.error);
  return true;
});
console.log("ok");
