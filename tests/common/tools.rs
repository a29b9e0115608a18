//! Tool-call checks that the tool tests run on each model, and the tools they declare.

use firstword::chat::tools::ToolDefinition;
use firstword::chat::ToolCall;
use firstword::{ChatMessage, Engine, Prompt, Role};
use serde_json::{json, Value};

use super::{post, stream_chunks, TestServer};

/// The tools the tests declare: the benchmark's `get_weather` and a kitchen timer whose
/// `minutes` are bounded (1..=600).
pub(crate) fn tools() -> Value {
    json!([
        firstword::bench::weather_tool(),
        {"type": "function", "function": {"name": "set_timer", "description": "Start a kitchen timer",
         "parameters": {"type": "object", "properties": {"minutes": {"type": "integer", "minimum": 1, "maximum": 600}},
            "required": ["minutes"], "additionalProperties": false}}}
    ])
}

/// [`tools`] in the Responses API's flat shape.
pub(crate) fn responses_tools() -> Value {
    tools()
        .as_array()
        .expect("tools")
        .iter()
        .map(|t| {
            let mut flat = t["function"].clone();
            flat["type"] = json!("function");
            flat
        })
        .collect()
}

/// [`tools`] as engine-level definitions.
pub(crate) fn tool_definitions() -> Vec<ToolDefinition> {
    tools()
        .as_array()
        .expect("tools")
        .iter()
        .map(|t| ToolDefinition {
            name: t["function"]["name"].as_str().expect("name").into(),
            description: t["function"]["description"].as_str().map(String::from),
            parameters: t["function"]["parameters"].clone(),
        })
        .collect()
}

/// Voice-assistant requests that want one of [`tools`].
pub(crate) const REQUESTS: [&str; 5] = [
    "What's the weather in Paris?",
    "Set a timer for ten minutes please.",
    "Is it cold in Oslo right now, in fahrenheit?",
    "I need a 3 minute timer for the eggs.",
    "Tell me the weather for Tokyo.",
];

/// Checks arguments against the test tools' schemas by hand (independently of the server).
pub(crate) fn check_call(name: &str, arguments: &str) -> Result<(), String> {
    let args: Value = serde_json::from_str(arguments).map_err(|e| format!("not JSON ({e}): {arguments}"))?;
    let object = args.as_object().ok_or(format!("not an object: {arguments}"))?;
    match name {
        "get_weather" => {
            let city_ok = object.get("city").is_some_and(Value::is_string);
            let unit_ok = matches!(object.get("unit").and_then(Value::as_str), Some("celsius" | "fahrenheit"));
            (city_ok && unit_ok && object.len() == 2).then_some(()).ok_or(format!("bad get_weather args {arguments}"))
        }
        "set_timer" => {
            let minutes = object.get("minutes").and_then(Value::as_i64);
            (minutes.is_some_and(|m| (1..=600).contains(&m)) && object.len() == 1)
                .then_some(())
                .ok_or(format!("bad set_timer args {arguments}"))
        }
        other => Err(format!("unknown function {other}")),
    }
}

/// Checks every call of a non-streamed answer (all are complete: one the token limit cut is
/// left out); returns how many there were. `context` starts the panic message.
pub(crate) fn check_complete_calls(answer: &Value, context: &str) -> usize {
    let Some(calls) = answer["choices"][0]["message"]["tool_calls"].as_array() else { return 0 };
    // A call cut by the token limit is left out of the answer.
    let complete = calls.len();
    for call in calls {
        check_call(
            call["function"]["name"].as_str().expect("name"),
            call["function"]["arguments"].as_str().expect("arguments"),
        )
        .unwrap_or_else(|e| panic!("{context}{e}: {answer}"));
    }
    complete
}

pub(crate) fn request(system: &str, user: &str, choice: Value, extra: Value) -> Value {
    let mut body = json!({
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}],
        "tools": tools(), "tool_choice": choice, "max_tokens": 96
    });
    for (key, value) in extra.as_object().expect("object") {
        body[key] = value.clone();
    }
    body
}

/// 20 forced calls (required and named, varied prompts, sampled, parallel calls allowed): all
/// parse and validate, and a named choice is exactly one call of that function (chat and the
/// Responses API).
pub(crate) async fn forced_calls_always_validate(server: &TestServer) -> (usize, usize) {
    let mut passed = (0, 0);
    for i in 0..20u64 {
        let user = REQUESTS[i as usize % REQUESTS.len()];
        let sampled = json!({"temperature": 0.8, "seed": i});
        for (named, choice) in
            [(false, json!("required")), (true, json!({"type": "function", "function": {"name": "set_timer"}}))]
        {
            let (status, body) =
                post(&server.base, &request("You are a home assistant.", user, choice, sampled.clone())).await;
            assert_eq!(status, 200, "{body}");
            let choice0 = &body["choices"][0];
            let calls = choice0["message"]["tool_calls"].as_array().expect("tool_calls").clone();
            assert!(choice0["message"]["content"].is_null(), "no text with a forced call: {body}");
            // Parallel calls are allowed with "required": the token limit may cut a later call
            // (left out of the answer), never the first. A named choice is one call.
            match choice0["finish_reason"].as_str() {
                Some("tool_calls") => {}
                Some("length") if !named => {}
                other => panic!("finish_reason {other:?}: {body}"),
            }
            assert!(!calls.is_empty(), "at least one complete call: {body}");
            if named {
                assert_eq!(calls.len(), 1, "a named choice is exactly one call: {body}");
                let responses = json!({"input": [{"role": "system", "content": "You are a home assistant."},
                    {"role": "user", "content": user}], "tools": responses_tools(),
                    "tool_choice": {"type": "function", "name": "set_timer"}, "max_output_tokens": 96,
                    "temperature": 0.8});
                let (status, response) = super::post_json(&server.base, "/v1/responses", &responses).await;
                assert_eq!(status, 200, "{response}");
                let items: Vec<&Value> = response["output"].as_array().expect("output").iter().collect();
                let calls: Vec<&&Value> = items.iter().filter(|item| item["type"] == "function_call").collect();
                assert_eq!(calls.len(), 1, "a named choice is exactly one call: {response}");
                assert_eq!(calls[0]["name"], "set_timer", "{response}");
                check_call("set_timer", calls[0]["arguments"].as_str().expect("arguments"))
                    .unwrap_or_else(|e| panic!("{e}: {response}"));
            }
            for call in &calls {
                assert!(call["id"].as_str().is_some_and(|id| id.starts_with("call_")), "{call}");
                assert_eq!(call["type"], "function");
                let name = call["function"]["name"].as_str().expect("name");
                if named {
                    assert_eq!(name, "set_timer", "{body}");
                }
                check_call(name, call["function"]["arguments"].as_str().expect("arguments"))
                    .unwrap_or_else(|e| panic!("{e}: {body}"));
            }
            if named {
                passed.1 += 1
            } else {
                passed.0 += 1
            }
        }
    }
    passed
}

/// Greedy: the streamed deltas rebuild exactly the non-streamed calls; id and name come once.
pub(crate) async fn streamed_calls_match_the_answer(server: &TestServer) {
    let body = request(
        "You are a home assistant.",
        "Weather in Berlin in celsius?",
        json!("required"),
        json!({"temperature": 0}),
    );
    // The same split for both answers compared: the prompt evaluated once first, then each
    // re-evaluates only its last token (another split can flip a near tie between two calls,
    // whatever the earlier tests left in the cache).
    post(&server.base, &body).await;
    let (_, whole) = post(&server.base, &body).await;
    let expected: Vec<(String, String)> = whole["choices"][0]["message"]["tool_calls"]
        .as_array()
        .expect("calls")
        .iter()
        .map(|c| {
            (
                c["function"]["name"].as_str().unwrap_or_default().to_string(),
                c["function"]["arguments"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect();
    let chunks = stream_chunks(&server.base, &body).await;
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let mut rebuilt: Vec<(String, String)> = Vec::new();
    let mut finish = None;
    for chunk in &chunks {
        let Some(choice) = chunk["choices"].get(0) else { continue };
        if let Some(reason) = choice["finish_reason"].as_str() {
            finish = Some(reason.to_string());
        }
        let delta = &choice["delta"];
        assert!(delta["content"].as_str().is_none_or(str::is_empty), "no content around forced calls: {chunk}");
        let Some(calls) = delta["tool_calls"].as_array() else { continue };
        assert_eq!(calls.len(), 1, "one call per chunk: {chunk}");
        let call = &calls[0];
        let index = call["index"].as_u64().expect("index") as usize;
        if let Some(name) = call["function"]["name"].as_str() {
            assert_eq!(index, rebuilt.len(), "a call starts once, in order: {chunk}");
            assert!(call["id"].as_str().is_some_and(|id| id.starts_with("call_")), "{chunk}");
            assert_eq!(call["type"], "function");
            assert_eq!(call["function"]["arguments"], "", "the header carries empty arguments: {chunk}");
            rebuilt.push((name.to_string(), String::new()));
        } else {
            assert!(call.get("id").is_none() && call.get("type").is_none(), "id/type only once: {chunk}");
            rebuilt[index].1.push_str(call["function"]["arguments"].as_str().expect("fragment"));
        }
    }
    assert_eq!(finish.as_deref(), Some("tool_calls"));
    assert_eq!(rebuilt, expected);
    let fragments = chunks
        .iter()
        .filter(|c| {
            c["choices"][0]["delta"]["tool_calls"][0]["function"]["arguments"].as_str().is_some_and(|a| !a.is_empty())
        })
        .count();
    assert!(fragments > 1, "arguments stream in fragments, not in one piece at the end");
}

/// A JSON-schema reply validates.
pub(crate) async fn json_schema_replies_validate(server: &TestServer) {
    let schema = json!({"type": "object", "properties": {"city": {"type": "string"}, "celsius": {"type": "integer"}},
        "required": ["city", "celsius"], "additionalProperties": false});
    for (i, user) in ["Paris is 21 degrees.", "It is -3 in Oslo.", "Describe the weather in Rome."].iter().enumerate() {
        let body = json!({"messages": [{"role": "user", "content": user}], "max_tokens": 64, "seed": i, "temperature": 0.7,
            "response_format": {"type": "json_schema", "json_schema": {"name": "weather", "schema": schema, "strict": true}}});
        let (status, answer) = post(&server.base, &body).await;
        assert_eq!(status, 200, "{answer}");
        assert_eq!(answer["choices"][0]["finish_reason"], "stop", "{answer}");
        let content: Value =
            serde_json::from_str(answer["choices"][0]["message"]["content"].as_str().expect("content"))
                .unwrap_or_else(|e| panic!("not JSON ({e}): {answer}"));
        assert!(
            content["city"].is_string()
                && content["celsius"].is_i64()
                && content.as_object().map(|o| o.len()) == Some(2),
            "{content}"
        );
    }
}

/// How many leading tokens the prompts of two conversations share, as the server renders them.
async fn shared_prompt_tokens(engine: &Engine, a: Vec<ChatMessage>, b: Vec<ChatMessage>) -> u64 {
    let engine = engine.clone();
    tokio::task::spawn_blocking(move || {
        let tokens =
            |messages| engine.tokenize_blocking(&Prompt::chat(messages, tool_definitions())).expect("tokenize");
        let (a, b) = (tokens(a), tokens(b));
        a.iter().zip(&b).take_while(|(x, y)| x == y).count() as u64
    })
    .await
    .expect("tokenizer task")
}

/// The turn after a tool result is served from the cache: everything before the tool result.
pub(crate) async fn follow_up_after_a_tool_result_is_cached(server: &TestServer) -> (u64, u64, u64) {
    let system = super::long_system_prompt(600);
    let first =
        request(&system, "What's the weather in Madrid in celsius?", json!("required"), json!({"temperature": 0}));
    let (status, answer) = post(&server.base, &first).await;
    assert_eq!(status, 200, "{answer}");
    let first_prompt = answer["usage"]["prompt_tokens"].as_u64().expect("prompt tokens");
    let first_completion = answer["usage"]["completion_tokens"].as_u64().expect("completion tokens");
    let message = answer["choices"][0]["message"].clone();
    let call_id = message["tool_calls"][0]["id"].as_str().expect("id").to_string();
    let mut messages = first["messages"].as_array().expect("messages").clone();
    messages.push(message);
    messages
        .push(json!({"role": "tool", "tool_call_id": call_id, "content": "{\"temperature\": 24, \"sky\": \"clear\"}"}));
    let follow =
        json!({"messages": messages, "tools": tools(), "tool_choice": "none", "max_tokens": 32, "temperature": 0});
    let (status, reply) = post(&server.base, &follow).await;
    assert_eq!(status, 200, "{reply}");
    assert!(reply["choices"][0]["message"]["tool_calls"].is_null(), "tool_choice none makes no call: {reply}");
    let content = reply["choices"][0]["message"]["content"].as_str().expect("text reply");
    assert!(!content.contains("<tool_call>"), "{content}");
    let cached = reply["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().expect("cached");
    // Everything up to the end of the assistant's calls is reused. The follow-up's prompt and
    // the conversation without the tool result share that, plus the turn boundary (end-of-turn
    // marker, newline, next turn's start marker) that the cache cannot hold: the model sampled
    // the end-of-turn token but never evaluated it.
    let assistant = ChatMessage {
        tool_calls: answer["choices"][0]["message"]["tool_calls"]
            .as_array()
            .expect("calls")
            .iter()
            .map(|c| ToolCall {
                id: c["id"].as_str().expect("id").into(),
                name: c["function"]["name"].as_str().expect("name").into(),
                arguments: c["function"]["arguments"].as_str().expect("arguments").into(),
            })
            .collect(),
        ..ChatMessage::assistant("")
    };
    let mut tool_result = ChatMessage::new(Role::Tool, "{\"temperature\": 24, \"sky\": \"clear\"}");
    tool_result.tool_call_id = Some(call_id);
    let history =
        vec![ChatMessage::system(system), ChatMessage::user("What's the weather in Madrid in celsius?"), assistant];
    let with_result = [history.clone(), vec![tool_result]].concat();
    let shared = shared_prompt_tokens(&server.engine, history, with_result).await;
    assert!(shared > first_prompt, "the history extends the first prompt");
    let turn_boundary = 3;
    assert!(cached + turn_boundary >= shared, "cached {cached}, shared history {shared}: {reply}");
    (first_prompt, first_completion, cached)
}

/// `auto`: whatever the model does, markers never reach the content.
pub(crate) async fn auto_never_leaks_markers(server: &TestServer) {
    for (i, user) in REQUESTS.iter().enumerate() {
        let body = request(
            "You are a home assistant. Use the tools when they help.",
            user,
            json!("auto"),
            json!({"seed": i, "max_tokens": 64}),
        );
        let (status, answer) = post(&server.base, &body).await;
        assert_eq!(status, 200, "{answer}");
        let message = &answer["choices"][0]["message"];
        let streamed: String = stream_chunks(&server.base, &body)
            .await
            .iter()
            .filter_map(|chunk| chunk["choices"][0]["delta"]["content"].as_str().map(String::from))
            .collect();
        for content in [message["content"].as_str().unwrap_or_default(), streamed.as_str()] {
            for marker in ["<tool_call>", "</tool_call>"] {
                assert!(!content.contains(marker), "marker {marker} in content {content:?}: {answer}");
            }
        }
        check_complete_calls(&answer, "");
    }
}
