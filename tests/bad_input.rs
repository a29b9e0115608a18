//! A catalogue of bad requests: each gets the right 4xx and the OpenAI error envelope, the
//! server stays up, and the next good request is still served from the cache.

mod common;

use std::io::Write;

use common::{exclusive_server, long_system_prompt, spawn_server, test_config};
use firstword::{Engine, EngineConfig};
use serde_json::{json, Value};

fn user(content: Value) -> Value {
    json!({"messages": [{"role": "user", "content": content}]})
}

fn with(mut body: Value, key: &str, value: Value) -> Value {
    body[key] = value;
    body
}

async fn send_raw(base: &str, method: reqwest::Method, path: &str, body: Vec<u8>) -> (u16, Value) {
    let response = reqwest::Client::new()
        .request(method, format!("{base}{path}"))
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .expect("request");
    let status = response.status().as_u16();
    let text = response.text().await.expect("body");
    let body = serde_json::from_str(&text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"));
    (status, body)
}

fn assert_envelope(case: &str, status: u16, expected: u16, body: &Value, param: Option<&str>) {
    assert_eq!(status, expected, "{case}: {body}");
    let error = &body["error"];
    assert!(error["message"].as_str().is_some_and(|m| !m.is_empty()), "{case}: message: {body}");
    assert!(error["type"].is_string(), "{case}: type: {body}");
    let fields = error.as_object().expect("error object");
    assert!(fields.contains_key("param") && fields.contains_key("code"), "{case}: param and code keys: {body}");
    if let Some(param) = param {
        assert_eq!(error["param"], param, "{case}: {body}");
    }
}

#[tokio::test]
async fn bad_requests_get_4xx_envelopes_and_change_nothing() {
    let (_guard, server) = exclusive_server().await;
    let base = server.base.as_str();
    let system = long_system_prompt(800);
    let good = json!({
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": "Hello"}],
        "max_tokens": 4
    });
    let (status, warm) =
        send_raw(base, reqwest::Method::POST, "/v1/chat/completions", good.to_string().into_bytes()).await;
    assert_eq!(status, 200, "{warm}");

    let huge = "word ".repeat(6000);
    let tools = json!([{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]);
    let deep = format!("{{\"messages\": {}{}}}", "[".repeat(5000), "]".repeat(5000));
    let ok = user(json!("hi"));
    let cases: Vec<(&str, Vec<u8>, u16, Option<&str>)> = vec![
        ("invalid JSON", b"{\"messages\": [".to_vec(), 400, None),
        ("empty body", Vec::new(), 400, None),
        ("not an object", b"[1, 2]".to_vec(), 400, None),
        ("trailing garbage", b"{\"messages\": []} x".to_vec(), 400, None),
        ("bad UTF-8", b"{\"messages\": [{\"role\": \"user\", \"content\": \"\xff\xfe\"}]}".to_vec(), 400, None),
        ("over-deep nesting", deep.into_bytes(), 400, None),
        ("messages missing", json!({"model": "x"}).to_string().into_bytes(), 400, None),
        ("messages not an array", json!({"messages": "hi"}).to_string().into_bytes(), 400, Some("messages")),
        ("empty messages", json!({"messages": []}).to_string().into_bytes(), 400, Some("messages")),
        ("message not an object", json!({"messages": ["hi"]}).to_string().into_bytes(), 400, Some("messages[0]")),
        ("role missing", json!({"messages": [{"content": "hi"}]}).to_string().into_bytes(), 400, Some("messages[0]")),
        ("unknown role", json!({"messages": [{"role": "wizard", "content": "hi"}]}).to_string().into_bytes(), 400, Some("messages[0].role")),
        ("content is a number", user(json!(42)).to_string().into_bytes(), 400, Some("messages[0].content")),
        ("image part", user(json!([{"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}])).to_string().into_bytes(), 400, Some("messages[0].content[0].type")),
        ("audio part", user(json!([{"type": "text", "text": "listen"}, {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}])).to_string().into_bytes(), 400, Some("messages[0].content[1].type")),
        ("text part without text", user(json!([{"type": "text"}])).to_string().into_bytes(), 400, Some("messages[0].content[0].text")),
        ("tool message without tool_call_id", json!({"messages": [{"role": "tool", "content": "21C"}]}).to_string().into_bytes(), 400, Some("messages[0].tool_call_id")),
        ("n=2", with(ok.clone(), "n", json!(2)).to_string().into_bytes(), 400, Some("n")),
        ("negative max_tokens", with(ok.clone(), "max_tokens", json!(-5)).to_string().into_bytes(), 400, Some("max_tokens")),
        ("zero max_completion_tokens", with(ok.clone(), "max_completion_tokens", json!(0)).to_string().into_bytes(), 400, Some("max_completion_tokens")),
        ("max_tokens as string", with(ok.clone(), "max_tokens", json!("10")).to_string().into_bytes(), 400, Some("max_tokens")),
        ("temperature too high", with(ok.clone(), "temperature", json!(2.5)).to_string().into_bytes(), 400, Some("temperature")),
        ("negative temperature", with(ok.clone(), "temperature", json!(-0.1)).to_string().into_bytes(), 400, Some("temperature")),
        ("top_p above one", with(ok.clone(), "top_p", json!(1.5)).to_string().into_bytes(), 400, Some("top_p")),
        ("negative top_k", with(ok.clone(), "top_k", json!(-1)).to_string().into_bytes(), 400, Some("top_k")),
        ("min_p above one", with(ok.clone(), "min_p", json!(3)).to_string().into_bytes(), 400, Some("min_p")),
        ("presence_penalty out of range", with(ok.clone(), "presence_penalty", json!(5)).to_string().into_bytes(), 400, Some("presence_penalty")),
        ("repeat_penalty zero", with(ok.clone(), "repeat_penalty", json!(0)).to_string().into_bytes(), 400, Some("repeat_penalty")),
        ("frequency_penalty out of range", with(ok.clone(), "frequency_penalty", json!(-3)).to_string().into_bytes(), 400, Some("frequency_penalty")),
        ("stop of the wrong type", with(ok.clone(), "stop", json!(7)).to_string().into_bytes(), 400, Some("stop")),
        ("stream not a bool", with(ok.clone(), "stream", json!("yes")).to_string().into_bytes(), 400, Some("stream")),
        ("logit_bias key not a token", with(ok.clone(), "logit_bias", json!({"abc": 1})).to_string().into_bytes(), 400, Some("logit_bias")),
        ("logit_bias token outside vocab", with(ok.clone(), "logit_bias", json!({"99999999": 1})).to_string().into_bytes(), 400, Some("logit_bias")),
        ("logit_bias value out of range", with(ok.clone(), "logit_bias", json!({"5": 500})).to_string().into_bytes(), 400, Some("logit_bias")),
        ("top_logprobs above 20", with(with(ok.clone(), "logprobs", json!(true)), "top_logprobs", json!(21)).to_string().into_bytes(), 400, Some("top_logprobs")),
        ("tool_choice required without tools", with(ok.clone(), "tool_choice", json!("required")).to_string().into_bytes(), 400, Some("tool_choice")),
        ("tool_choice names an unknown tool", with(with(ok.clone(), "tools", tools.clone()), "tool_choice", json!({"type": "function", "function": {"name": "launch_rocket"}})).to_string().into_bytes(), 400, Some("tool_choice")),
        ("tool_choice of an unknown kind", with(with(ok.clone(), "tools", tools.clone()), "tool_choice", json!("sometimes")).to_string().into_bytes(), 400, Some("tool_choice")),
        ("duplicate tool names", with(ok.clone(), "tools", json!([tools[0], tools[0]])).to_string().into_bytes(), 400, Some("tools[1].function.name")),
        ("tool name with a space", with(ok.clone(), "tools", json!([{"type": "function", "function": {"name": "get weather"}}])).to_string().into_bytes(), 400, Some("tools[0].function.name")),
        ("tool without a function", with(ok.clone(), "tools", json!([{"type": "function"}])).to_string().into_bytes(), 400, Some("tools[0].function")),
        ("tool of another type", with(ok.clone(), "tools", json!([{"type": "code_interpreter"}])).to_string().into_bytes(), 400, Some("tools[0].type")),
        ("tool schema that is not JSON Schema", with(ok.clone(), "tools", json!([{"type": "function", "function": {"name": "f", "parameters": {"type": 7}}}])).to_string().into_bytes(), 400, Some("tools[0].function.parameters")),
        ("tool schema the grammar cannot handle", with(ok.clone(), "tools", json!([{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {"x": {"$ref": "#/$defs/missing"}}}}}])).to_string().into_bytes(), 400, Some("tools[0].function.parameters")),
        ("assistant tool call without a function", json!({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function"}]}]}).to_string().into_bytes(), 400, Some("messages[1].tool_calls[0]")),
        ("response_format of an unknown type", with(ok.clone(), "response_format", json!({"type": "yaml"})).to_string().into_bytes(), 400, Some("response_format.type")),
        ("response_format json_schema without a schema", with(ok.clone(), "response_format", json!({"type": "json_schema", "json_schema": {"name": "x"}})).to_string().into_bytes(), 400, Some("response_format.json_schema.schema")),
        ("response_format schema that is not JSON Schema", with(ok.clone(), "response_format", json!({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "whatever"}}})).to_string().into_bytes(), 400, Some("response_format.json_schema.schema")),
        ("prompt longer than the context", user(json!(huge)).to_string().into_bytes(), 400, Some("messages")),
        ("max_tokens beyond the context", with(ok.clone(), "max_tokens", json!(100_000)).to_string().into_bytes(), 400, Some("messages")),
    ];
    assert!(cases.len() >= 25);
    for (case, body, expected, param) in cases {
        let (status, response) = send_raw(base, reqwest::Method::POST, "/v1/chat/completions", body).await;
        assert_envelope(case, status, expected, &response, param);
    }
    let (status, response) = send_raw(base, reqwest::Method::POST, "/v1/nothing", b"{}".to_vec()).await;
    assert_envelope("unknown endpoint", status, 404, &response, None);
    let (status, response) = send_raw(base, reqwest::Method::GET, "/v1/chat/completions", Vec::new()).await;
    assert_envelope("wrong method", status, 405, &response, None);

    // The overflow error names both counts.
    let (_, overflow) = send_raw(
        base,
        reqwest::Method::POST,
        "/v1/chat/completions",
        with(ok, "max_tokens", json!(100_000)).to_string().into_bytes(),
    )
    .await;
    let message = overflow["error"]["message"].as_str().expect("message");
    assert!(message.contains("100000") && message.contains("4096"), "{message}");

    // Still up, and the cache survived every bad request.
    let (status, again) =
        send_raw(base, reqwest::Method::POST, "/v1/chat/completions", good.to_string().into_bytes()).await;
    assert_eq!(status, 200, "{again}");
    let cached = again["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().expect("cached");
    let prompt = again["usage"]["prompt_tokens"].as_u64().expect("prompt");
    assert_eq!(cached, prompt - 1, "served from the cache after the bad requests");
}

#[tokio::test]
async fn a_template_that_raises_is_a_400_naming_its_message() {
    let mut file = tempfile_in_target("raising.jinja");
    write!(
        file.1,
        "{{% for m in messages %}}{{% if m['role'] == 'system' %}}{{{{ raise_exception('System role not supported') }}}}{{% endif %}}<|im_start|>{{{{ m['role'] }}}}\n{{{{ m['content'] }}}}<|im_end|>\n{{% endfor %}}<|im_start|>assistant\n"
    )
    .expect("write template");
    let engine = Engine::start(EngineConfig {
        chat_template_file: Some(file.0.clone()),
        ctx_size: Some(512),
        ..test_config(common::smollm2_path())
    })
    .expect("engine with a custom template");
    let custom = spawn_server(engine);
    let body = json!({"messages": [{"role": "system", "content": "x"}, {"role": "user", "content": "hi"}]});
    let (status, response) =
        send_raw(&custom.base, reqwest::Method::POST, "/v1/chat/completions", body.to_string().into_bytes()).await;
    assert_envelope("template raises", status, 400, &response, None);
    assert!(
        response["error"]["message"].as_str().expect("message").contains("System role not supported"),
        "{response}"
    );
    let fine = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2});
    let (status, response) =
        send_raw(&custom.base, reqwest::Method::POST, "/v1/chat/completions", fine.to_string().into_bytes()).await;
    assert_eq!(status, 200, "{response}");
}

/// A scratch file under target/ (no tempfile crate needed for one file).
fn tempfile_in_target(name: &str) -> (std::path::PathBuf, std::fs::File) {
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let path = dir.join(name);
    let file = std::fs::File::create(&path).expect("create scratch file");
    (path, file)
}
