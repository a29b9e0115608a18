//! Tool calls and JSON output against the real models: forced calls that always parse and
//! validate, streamed deltas that match the non-streamed answer, follow-up turns served from
//! the cache, no markers in content, and no sampler setting that aborts the process.

mod common;

use common::{exclusive_server, parse_sse, spawn_server, test_config, SseData, TestServer};
use firstword::chat::tools::ToolDefinition;
use firstword::chat::ToolCall;
use firstword::{ChatMessage, Engine, Prompt, Role};
use serde_json::{json, Value};

fn tools() -> Value {
    json!([
        {"type": "function", "function": {"name": "get_weather", "description": "Current weather in a city",
         "parameters": {"type": "object", "properties": {"city": {"type": "string"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
            "required": ["city", "unit"], "additionalProperties": false}}},
        {"type": "function", "function": {"name": "set_timer", "description": "Start a kitchen timer",
         "parameters": {"type": "object", "properties": {"minutes": {"type": "integer", "minimum": 1, "maximum": 600}},
            "required": ["minutes"], "additionalProperties": false}}}
    ])
}

const REQUESTS: [&str; 5] = [
    "What's the weather in Paris?",
    "Set a timer for ten minutes please.",
    "Is it cold in Oslo right now, in fahrenheit?",
    "I need a 3 minute timer for the eggs.",
    "Tell me the weather for Tokyo.",
];

async fn post(base: &str, body: &Value) -> (u16, Value) {
    let response =
        reqwest::Client::new().post(format!("{base}/v1/chat/completions")).json(body).send().await.expect("request");
    let status = response.status().as_u16();
    (status, response.json().await.expect("JSON body"))
}

async fn post_stream(base: &str, body: &Value) -> Vec<Value> {
    let mut body = body.clone();
    body["stream"] = json!(true);
    let response =
        reqwest::Client::new().post(format!("{base}/v1/chat/completions")).json(&body).send().await.expect("request");
    assert_eq!(response.status().as_u16(), 200);
    let text = response.text().await.expect("stream body");
    let events = parse_sse(&text);
    assert_eq!(events.last(), Some(&SseData::Done), "{text}");
    events
        .into_iter()
        .filter_map(|e| match e {
            SseData::Json(v) => Some(v),
            SseData::Done => None,
        })
        .collect()
}

/// Checks arguments against the test tools' schemas by hand (independently of the server).
fn check_call(name: &str, arguments: &str) -> Result<(), String> {
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

/// Checks every complete call of a non-streamed answer (the token limit may cut the last one);
/// returns how many there were. `context` starts the panic message.
fn check_complete_calls(answer: &Value, context: &str) -> usize {
    let Some(calls) = answer["choices"][0]["message"]["tool_calls"].as_array() else { return 0 };
    let complete = if answer["choices"][0]["finish_reason"] == "length" { calls.len() - 1 } else { calls.len() };
    for call in &calls[..complete] {
        check_call(
            call["function"]["name"].as_str().expect("name"),
            call["function"]["arguments"].as_str().expect("arguments"),
        )
        .unwrap_or_else(|e| panic!("{context}{e}: {answer}"));
    }
    complete
}

fn request(system: &str, user: &str, choice: Value, extra: Value) -> Value {
    let mut body = json!({
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}],
        "tools": tools(), "tool_choice": choice, "max_tokens": 96
    });
    for (key, value) in extra.as_object().expect("object") {
        body[key] = value.clone();
    }
    body
}

/// 20 forced calls (required and named, varied prompts, sampled): all parse and validate.
async fn forced_calls_always_validate(server: &TestServer) -> (usize, usize) {
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
            let mut calls = choice0["message"]["tool_calls"].as_array().expect("tool_calls").clone();
            assert!(choice0["message"]["content"].is_null(), "no text with a forced call: {body}");
            // Parallel calls are allowed: the token limit may cut a later call, never the first.
            match choice0["finish_reason"].as_str() {
                Some("tool_calls") => {}
                Some("length") => {
                    calls.pop();
                }
                other => panic!("finish_reason {other:?}: {body}"),
            }
            assert!(!calls.is_empty(), "at least one complete call: {body}");
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
async fn streamed_calls_match_the_answer(server: &TestServer) {
    let body = request(
        "You are a home assistant.",
        "Weather in Berlin in celsius?",
        json!("required"),
        json!({"temperature": 0}),
    );
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
    let chunks = post_stream(&server.base, &body).await;
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
async fn json_schema_replies_validate(server: &TestServer) {
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

/// The tool definitions of [`tools`], for engine-level calls.
fn tool_specs() -> Vec<ToolDefinition> {
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

/// How many leading tokens the prompts of two conversations share, as the server renders them.
async fn shared_prompt_tokens(engine: &Engine, a: Vec<ChatMessage>, b: Vec<ChatMessage>) -> u64 {
    let engine = engine.clone();
    tokio::task::spawn_blocking(move || {
        let tokens =
            |messages| engine.tokenize_blocking(&Prompt::Chat { messages, tools: tool_specs() }).expect("tokenize");
        let (a, b) = (tokens(a), tokens(b));
        a.iter().zip(&b).take_while(|(x, y)| x == y).count() as u64
    })
    .await
    .expect("tokenizer task")
}

/// The turn after a tool result is served from the cache: everything before the tool result.
async fn follow_up_after_a_tool_result_is_cached(server: &TestServer) -> (u64, u64, u64) {
    let system = common::long_system_prompt(600);
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
async fn auto_never_leaks_markers(server: &TestServer) {
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
        let streamed: String = post_stream(&server.base, &body)
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

/// `parallel_tool_calls: false`: exactly one call, even where the model would go on.
async fn one_call_without_parallel_calls(server: &TestServer) {
    for (i, user) in REQUESTS.iter().enumerate() {
        let body = request(
            "You are a home assistant.",
            user,
            json!("required"),
            json!({"parallel_tool_calls": false, "seed": i, "temperature": 0.8}),
        );
        let (status, answer) = post(&server.base, &body).await;
        assert_eq!(status, 200, "{answer}");
        assert_eq!(answer["choices"][0]["finish_reason"], "tool_calls", "{answer}");
        let calls = answer["choices"][0]["message"]["tool_calls"].as_array().expect("calls");
        assert_eq!(calls.len(), 1, "{answer}");
    }
}

#[tokio::test]
async fn smollm2_tool_calls() {
    let (_guard, server) = exclusive_server().await;
    let (required, named) = forced_calls_always_validate(server).await;
    println!("SmolLM2: required {required}/20, named {named}/20 calls valid");
    one_call_without_parallel_calls(server).await;
    streamed_calls_match_the_answer(server).await;
    json_schema_replies_validate(server).await;
    let (prompt, completion, cached) = follow_up_after_a_tool_result_is_cached(server).await;
    println!("SmolLM2 follow-up: first prompt {prompt} + reply {completion} tokens, next turn cached {cached}");
    auto_never_leaks_markers(server).await;
}

#[tokio::test]
async fn gemma3_tool_calls() {
    let server = spawn_server(Engine::start(test_config(common::gemma3_path())).expect("gemma loads"));
    let (required, named) = forced_calls_always_validate(&server).await;
    println!("gemma-3: required {required}/20, named {named}/20 calls valid");
    streamed_calls_match_the_answer(&server).await;
    json_schema_replies_validate(&server).await;
    let (prompt, completion, cached) = follow_up_after_a_tool_result_is_cached(&server).await;
    println!("gemma-3 follow-up: first prompt {prompt} + reply {completion} tokens, next turn cached {cached}");
    auto_never_leaks_markers(&server).await;
}

/// Every sampler setting users send, with and without a grammar: always an answer, never an
/// abort (a truncating sampler before the grammar used to kill the process).
#[tokio::test]
async fn no_sampler_setting_aborts_with_or_without_a_grammar() {
    let (_guard, server) = exclusive_server().await;
    let modes = [
        ("plain", json!({})),
        ("tools required", json!({"tools": tools(), "tool_choice": "required"})),
        ("tools auto", json!({"tools": tools(), "tool_choice": "auto"})),
        ("json", json!({"response_format": {"type": "json_object"}})),
    ];
    let mut runs = 0;
    for (mode, extra) in &modes {
        for temperature in [0.0, 1.0, 1.9] {
            for top_k in [0, 1, 40] {
                for (top_p, min_p) in [(1.0, 0.0), (0.05, 0.0), (1.0, 0.95), (0.1, 0.5)] {
                    let mut body = json!({"messages": [{"role": "user", "content": "Weather in Lima?"}], "max_tokens": 10,
                        "temperature": temperature, "top_k": top_k, "top_p": top_p, "min_p": min_p, "seed": runs});
                    for (key, value) in extra.as_object().expect("object") {
                        body[key] = value.clone();
                    }
                    let (status, answer) = post(&server.base, &body).await;
                    assert_eq!(status, 200, "{mode} t={temperature} k={top_k} p={top_p} min_p={min_p}: {answer}");
                    runs += 1;
                }
            }
        }
    }
    assert_eq!(runs, 4 * 3 * 3 * 4);
}

/// Each format's grammar (including those for other model families) is accepted by llama.cpp's
/// grammar parser and constrains real generation.
#[tokio::test]
async fn every_format_grammar_parses_in_llama_cpp() {
    use firstword::chat::tools::{request_grammar, OutputSchema, ToolChoice, ToolDefinition, ToolFormat, ToolSet};
    use firstword::{Event, GenerationRequest, Prompt, SamplingParams};
    let (_guard, server) = exclusive_server().await;
    let specs: Vec<ToolDefinition> = tools()
        .as_array()
        .expect("tools")
        .iter()
        .map(|t| ToolDefinition {
            name: t["function"]["name"].as_str().expect("name").into(),
            description: None,
            parameters: t["function"]["parameters"].clone(),
        })
        .collect();
    let set = ToolSet::new(specs).expect("tools");
    let schema = OutputSchema::new(&json!({"type": "object"})).expect("schema");
    for format in [
        ToolFormat::Generic,
        ToolFormat::Hermes,
        ToolFormat::Llama3,
        ToolFormat::Mistral,
        ToolFormat::Gemma4,
        ToolFormat::FunctionGemma,
    ] {
        for (choice, output) in
            [(ToolChoice::Required, None), (ToolChoice::Auto, None), (ToolChoice::Auto, Some(&schema))]
        {
            let grammar = request_grammar(format, &set, &choice, true, output).expect("grammar");
            let request = GenerationRequest {
                prompt: Prompt::Text("Call a tool:".into()),
                max_tokens: Some(24),
                stop: Vec::new(),
                sampling: SamplingParams::greedy(),
                grammar: Some(grammar),
                preserved_tokens: Vec::new(),
            };
            let mut generation = server.engine.submit(request).expect("submitted");
            let mut text = String::new();
            loop {
                match generation.next().await {
                    Some(Event::Text(piece)) => text.push_str(&piece),
                    Some(Event::Finished { .. }) => break,
                    Some(Event::Failed(e)) => panic!("{format:?} {choice:?}: {e}"),
                    Some(Event::Started { .. }) => {}
                    None => panic!("{format:?}: no end"),
                }
            }
            if choice == ToolChoice::Required {
                let opener = format.openers()[0];
                assert!(text.starts_with(opener) || format == ToolFormat::Llama3, "{format:?}: {text:?}");
            }
        }
    }
}

/// A follow-up turn without `tools` still shows the model its earlier calls and their results:
/// the generic format writes them into the messages whether or not the turn carries tools.
#[tokio::test]
async fn tool_history_is_rendered_on_a_turn_without_tools() {
    let (_guard, server) = exclusive_server().await;
    let call = ToolCall { id: "call_1".into(), name: "set_timer".into(), arguments: "{\"minutes\": 10}".into() };
    let mut result = ChatMessage::new(Role::Tool, "{\"ok\": true}");
    result.tool_call_id = Some("call_1".into());
    let history = vec![
        ChatMessage::system("You are a home assistant."),
        ChatMessage::user("Set a timer for ten minutes."),
        ChatMessage { tool_calls: vec![call], ..ChatMessage::assistant("") },
        result,
        ChatMessage::user("Thanks!"),
    ];
    let written = vec![
        ChatMessage::system("You are a home assistant."),
        ChatMessage::user("Set a timer for ten minutes."),
        ChatMessage::assistant(
            "<tool_call>\n{\"name\": \"set_timer\", \"arguments\": {\"minutes\": 10}}\n</tool_call>",
        ),
        ChatMessage::user("<tool_response>\n{\"ok\": true}\n</tool_response>"),
        ChatMessage::user("Thanks!"),
    ];
    let engine = server.engine.clone();
    let (rendered, expected) = tokio::task::spawn_blocking(move || {
        let tokens =
            |messages| engine.tokenize_blocking(&Prompt::Chat { messages, tools: Vec::new() }).expect("tokens");
        (tokens(history), tokens(written))
    })
    .await
    .expect("tokenizer task");
    assert_eq!(rendered, expected, "the calls and the tool result are in the prompt");
    // The same over HTTP: the prompt the server evaluates has the calls and the result.
    let body = json!({"messages": [
        {"role": "system", "content": "You are a home assistant."},
        {"role": "user", "content": "Set a timer for ten minutes."},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
            "function": {"name": "set_timer", "arguments": "{\"minutes\": 10}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "{\"ok\": true}"},
        {"role": "user", "content": "Thanks!"}
    ], "max_tokens": 1, "temperature": 0});
    let (status, answer) = post(&server.base, &body).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["usage"]["prompt_tokens"].as_u64(), Some(expected.len() as u64), "{answer}");
}

/// A user stop string inside a call never yields half a call: the answer is the whole, valid
/// call, or a 422 (never a cut call with finish_reason "stop").
#[tokio::test]
async fn a_stop_string_never_returns_half_a_call() {
    let (_guard, server) = exclusive_server().await;
    for stop in ["arguments", "minutes", "}"] {
        let body = request(
            "You are a home assistant.",
            "Set a timer for ten minutes please.",
            json!("required"),
            json!({"temperature": 0, "stop": [stop]}),
        );
        let (status, answer) = post(&server.base, &body).await;
        if status == 422 {
            assert_eq!(answer["error"]["code"], "invalid_model_output", "stop {stop:?}: {answer}");
        } else {
            assert_eq!(status, 200, "stop {stop:?}: {answer}");
            assert_eq!(answer["choices"][0]["finish_reason"], "tool_calls", "stop {stop:?}: {answer}");
            for call in answer["choices"][0]["message"]["tool_calls"].as_array().expect("calls") {
                check_call(
                    call["function"]["name"].as_str().expect("name"),
                    call["function"]["arguments"].as_str().expect("arguments"),
                )
                .unwrap_or_else(|e| panic!("stop {stop:?}: {e}: {answer}"));
            }
        }
        let chunks = post_stream(&server.base, &body).await;
        let failed = chunks.iter().any(|c| c["error"]["code"] == "invalid_model_output");
        let finish: Vec<&str> = chunks.iter().filter_map(|c| c["choices"][0]["finish_reason"].as_str()).collect();
        assert!(failed || finish == ["tool_calls"], "stop {stop:?}: finish {finish:?}, chunks {chunks:?}");
    }
}

/// A stream of only tool calls never says `content: ""` (clients send that back as the
/// assistant's content): the opening chunk has the role and no content.
#[tokio::test]
async fn a_tool_call_stream_never_sends_empty_content() {
    let (_guard, server) = exclusive_server().await;
    for choice in [json!("required"), json!({"type": "function", "function": {"name": "set_timer"}})] {
        let body = request(
            "You are a home assistant.",
            "Set a timer for ten minutes please.",
            choice,
            json!({"temperature": 0}),
        );
        let chunks = post_stream(&server.base, &body).await;
        assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant", "{chunks:?}");
        let mut calls = 0;
        for chunk in &chunks {
            let Some(choice) = chunk["choices"].get(0) else { continue };
            let delta = &choice["delta"];
            assert!(delta.get("content").is_none_or(Value::is_null), "content in a call-only stream: {chunk}");
            calls += delta["tool_calls"].as_array().map_or(0, Vec::len);
        }
        assert!(calls > 0, "{chunks:?}");
    }
}

/// In `auto` mode a reply that opens with a JSON object is a call: SmolLM2 answered this
/// request (seed 0) with `{"type": "function", "name": "set_timer", ...}` as content. Now such a
/// reply is constrained into a valid call of a declared tool. (JSON after other text, such as
/// `set_timer({...`, is text: only a reply-opening object counts as a call.)
#[tokio::test]
async fn auto_mode_never_answers_with_a_json_object_as_content() {
    let (_guard, server) = exclusive_server().await;
    let mut calls_made = 0;
    for seed in 0..=7 {
        let body = request(
            "You are a home assistant.",
            "Set a timer for two minutes please.",
            json!("auto"),
            json!({"temperature": 0.8, "seed": seed, "max_tokens": 96}),
        );
        let (status, answer) = post(&server.base, &body).await;
        assert_eq!(status, 200, "seed {seed}: {answer}");
        let message = &answer["choices"][0]["message"];
        let content = message["content"].as_str().unwrap_or_default();
        assert!(!content.trim_start().starts_with('{'), "seed {seed}: a JSON object as content: {answer}");
        calls_made += check_complete_calls(&answer, &format!("seed {seed}: "));
        let streamed: String = post_stream(&server.base, &body)
            .await
            .iter()
            .filter_map(|chunk| chunk["choices"][0]["delta"]["content"].as_str().map(String::from))
            .collect();
        // Not compared with the answer above: the second request starts from another cache
        // state (a reused prefix), and sampled text may then differ; the rule holds for both.
        assert!(
            !streamed.trim_start().starts_with('{'),
            "seed {seed}: a JSON object as streamed content: {streamed:?}"
        );
    }
    println!("SmolLM2 auto timer: {calls_made} valid calls in 8 replies");
}
