//! `into_job` against a hand-built model: the bad-input catalogue of `tests/bad_input.rs` and
//! `tests/robustness.rs` (what is decided before the engine), and good requests.

use serde_json::{json, Value};

use super::*;
use crate::api::tests::{model, timer_tool};

/// `body` parsed and converted as the handler does.
fn convert(body: &Value) -> Result<ChatJob, ApiError> {
    ChatBody::parse(body.to_string().as_bytes())?.into_job(&model())
}

fn accepted(body: Value) -> ChatJob {
    convert(&body).unwrap_or_else(|e| panic!("{body}: {e}"))
}

fn hi() -> Value {
    json!({"messages": [{"role": "user", "content": "hi"}]})
}

fn with(key: &str, value: Value) -> Value {
    let mut body = hi();
    body[key] = value;
    body
}

fn user(content: Value) -> Value {
    json!({"messages": [{"role": "user", "content": content}]})
}

fn weather_tools() -> Value {
    json!([{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}])
}

fn optional_properties(n: usize) -> Value {
    let properties: serde_json::Map<String, Value> =
        (0..n).map(|i| (format!("p{i}"), json!({"type": "string"}))).collect();
    json!({"type": "object", "properties": properties})
}

#[test]
fn each_bad_input_is_a_400_naming_its_field() {
    let tools = weather_tools();
    let format = |schema: Value| json!({"type": "json_schema", "json_schema": {"name": "x", "schema": schema}});
    let tool_with =
        |parameters: Value| json!([{"type": "function", "function": {"name": "f", "parameters": parameters}}]);
    let with_tools = |key: &str, value: Value| {
        let mut body = with("tools", tools.clone());
        body[key] = value;
        body
    };
    let cases: Vec<(&str, Value, Option<&str>, Option<&str>)> = vec![
        ("messages missing", json!({"model": "x"}), None, Some("invalid_json")),
        ("messages not an array", json!({"messages": "hi"}), Some("messages"), Some("invalid_json")),
        ("empty messages", json!({"messages": []}), Some("messages"), None),
        ("message not an object", json!({"messages": ["hi"]}), Some("messages[0]"), Some("invalid_json")),
        ("role missing", json!({"messages": [{"content": "hi"}]}), Some("messages[0]"), Some("invalid_json")),
        ("unknown role", json!({"messages": [{"role": "wizard", "content": "hi"}]}), Some("messages[0].role"), None),
        ("content is a number", user(json!(42)), Some("messages[0].content"), Some("invalid_json")),
        (
            "image part",
            user(json!([{"type": "image_url", "image_url": {"url": "data:,"}}])),
            Some("messages[0].content[0].type"),
            Some("unsupported_content_type"),
        ),
        (
            "audio part",
            user(json!([{"type": "text", "text": "listen"}, {"type": "input_audio"}])),
            Some("messages[0].content[1].type"),
            Some("unsupported_content_type"),
        ),
        ("text part without text", user(json!([{"type": "text"}])), Some("messages[0].content[0].text"), None),
        (
            "tool message without tool_call_id",
            json!({"messages": [{"role": "tool", "content": "21C"}]}),
            Some("messages[0].tool_call_id"),
            None,
        ),
        (
            "assistant tool call without a function",
            json!({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function"}]}]}),
            Some("messages[1].tool_calls[0]"),
            Some("invalid_json"),
        ),
        ("n=2", with("n", json!(2)), Some("n"), None),
        ("negative max_tokens", with("max_tokens", json!(-5)), Some("max_tokens"), None),
        ("zero max_completion_tokens", with("max_completion_tokens", json!(0)), Some("max_completion_tokens"), None),
        ("max_tokens as string", with("max_tokens", json!("10")), Some("max_tokens"), Some("invalid_json")),
        ("temperature too high", with("temperature", json!(2.5)), Some("temperature"), None),
        ("negative temperature", with("temperature", json!(-0.1)), Some("temperature"), None),
        ("top_p above one", with("top_p", json!(1.5)), Some("top_p"), None),
        ("negative top_k", with("top_k", json!(-1)), Some("top_k"), None),
        ("min_p above one", with("min_p", json!(3)), Some("min_p"), None),
        ("presence_penalty out of range", with("presence_penalty", json!(5)), Some("presence_penalty"), None),
        ("frequency_penalty out of range", with("frequency_penalty", json!(-3)), Some("frequency_penalty"), None),
        ("repeat_penalty zero", with("repeat_penalty", json!(0)), Some("repeat_penalty"), None),
        ("repeat_last_n past the context", with("repeat_last_n", json!(2_147_483_647)), Some("repeat_last_n"), None),
        ("stop of the wrong type", with("stop", json!(7)), Some("stop"), Some("invalid_json")),
        ("5 stop strings", with("stop", json!(["a", "b", "c", "d", "e"])), Some("stop"), Some("limit_exceeded")),
        ("a 300-byte stop string", with("stop", json!(["x".repeat(300)])), Some("stop"), Some("limit_exceeded")),
        ("stream not a bool", with("stream", json!("yes")), Some("stream"), Some("invalid_json")),
        ("logit_bias key not a token", with("logit_bias", json!({"abc": 1})), Some("logit_bias"), None),
        ("logit_bias token outside vocab", with("logit_bias", json!({"99999999": 1})), Some("logit_bias"), None),
        ("logit_bias value out of range", with("logit_bias", json!({"5": 500})), Some("logit_bias"), None),
        (
            "301 logit_bias entries",
            with("logit_bias", (0..301).map(|i| (i.to_string(), json!(1))).collect()),
            Some("logit_bias"),
            Some("limit_exceeded"),
        ),
        ("top_logprobs without logprobs", with("top_logprobs", json!(3)), Some("top_logprobs"), None),
        (
            "top_logprobs above 20",
            json!({"messages": [{"role": "user", "content": "hi"}], "logprobs": true, "top_logprobs": 21}),
            Some("top_logprobs"),
            None,
        ),
        ("reasoning_budget below -1", with("reasoning_budget", json!(-2)), Some("reasoning_budget"), None),
        ("unknown reasoning_effort", with("reasoning_effort", json!("extreme")), Some("reasoning_effort"), None),
        (
            "template kwargs that replace the conversation",
            with("chat_template_kwargs", json!({"messages": []})),
            Some("chat_template_kwargs.messages"),
            None,
        ),
        (
            "tool_choice required without tools",
            with("tool_choice", json!("required")),
            Some("tool_choice"),
            Some("invalid_tool_choice"),
        ),
        (
            "tool_choice names an unknown tool",
            with_tools("tool_choice", json!({"type": "function", "function": {"name": "launch_rocket"}})),
            Some("tool_choice"),
            Some("invalid_tool_choice"),
        ),
        (
            "tool_choice of an unknown kind",
            with_tools("tool_choice", json!("sometimes")),
            Some("tool_choice"),
            Some("invalid_tool_choice"),
        ),
        (
            "duplicate tool names",
            with("tools", json!([tools[0], tools[0]])),
            Some("tools[1].function.name"),
            Some("invalid_tools"),
        ),
        (
            "tool name with a space",
            with("tools", json!([{"type": "function", "function": {"name": "get weather"}}])),
            Some("tools[0].function.name"),
            Some("invalid_tools"),
        ),
        ("tool without a function", with("tools", json!([{"type": "function"}])), Some("tools[0].function"), None),
        ("tool of another type", with("tools", json!([{"type": "code_interpreter"}])), Some("tools[0].type"), None),
        (
            "129 tools",
            with(
                "tools",
                (0..129).map(|i| json!({"type": "function", "function": {"name": format!("f{i}")}})).collect(),
            ),
            Some("tools"),
            Some("limit_exceeded"),
        ),
        (
            "tool schema that is not JSON Schema",
            with("tools", tool_with(json!({"type": 7}))),
            Some("tools[0].function.parameters"),
            Some("invalid_tools"),
        ),
        (
            "tool schema the grammar cannot handle",
            with("tools", tool_with(json!({"type": "object", "properties": {"x": {"$ref": "#/$defs/missing"}}}))),
            Some("tools[0].function.parameters"),
            Some("invalid_tools"),
        ),
        (
            "1,000 optional properties in a tool",
            with("tools", tool_with(optional_properties(1_000))),
            Some("tools[0].function.parameters"),
            Some("schema_too_complex"),
        ),
        (
            "response_format of an unknown type",
            with("response_format", json!({"type": "yaml"})),
            Some("response_format.type"),
            None,
        ),
        (
            "response_format json_schema without a schema",
            with("response_format", json!({"type": "json_schema", "json_schema": {"name": "x"}})),
            Some("response_format.json_schema.schema"),
            None,
        ),
        (
            "response_format schema that is not JSON Schema",
            with("response_format", format(json!({"type": "whatever"}))),
            Some("response_format.json_schema.schema"),
            Some("invalid_response_format"),
        ),
        (
            "1,000 optional properties in response_format",
            with("response_format", format(optional_properties(1_000))),
            Some("response_format.json_schema.schema"),
            Some("schema_too_complex"),
        ),
    ];
    for (case, body, param, code) in cases {
        let error = match convert(&body) {
            Ok(_) => panic!("{case}: accepted"),
            Err(error) => error,
        };
        assert_eq!(error.status(), axum::http::StatusCode::BAD_REQUEST, "{case}: {error}");
        assert_eq!((error.param().as_deref(), error.code()), (param, code), "{case}: {error}");
        assert!(!error.to_string().is_empty(), "{case}");
    }
}

#[test]
fn a_plain_request_gets_the_defaults_and_the_model_name() {
    let job = accepted(hi());
    assert!(!job.stream && !job.include_usage);
    assert_eq!(job.model, "test-model");
    let request = job.request;
    assert_eq!((request.max_tokens, request.stop.len(), request.grammar.is_none()), (None, 0, true));
    assert!(request.preserved_tokens.is_empty());
    let defaults = crate::engine::SamplingParams::default();
    assert_eq!((request.sampling.temperature, request.sampling.top_k), (defaults.temperature, defaults.top_k));
    assert!(job.output.tools.is_none() && job.output.schema.is_none());
}

#[test]
fn sampling_fields_and_limits_are_carried_over() {
    let mut body = with("model", json!("my-name"));
    for (key, value) in [
        ("max_tokens", json!(99)),
        ("max_completion_tokens", json!(12)),
        ("temperature", json!(0.5)),
        ("top_k", json!(7)),
        ("seed", json!(-1)),
        ("stop", json!("END")),
        ("repeat_last_n", json!(4096)),
        ("logit_bias", json!({"5": -100})),
        ("stream", json!(true)),
        ("stream_options", json!({"include_usage": true})),
    ] {
        body[key] = value;
    }
    let job = accepted(body);
    assert_eq!((job.model.as_str(), job.stream, job.include_usage), ("my-name", true, true));
    let request = job.request;
    assert_eq!(request.max_tokens, Some(12), "max_completion_tokens wins");
    assert_eq!((request.sampling.temperature, request.sampling.top_k), (0.5, 7));
    assert_eq!((request.sampling.seed, request.sampling.repeat_last_n), (Some(u32::MAX), 4096));
    assert_eq!(request.sampling.logit_bias, [(5, -100.0)]);
    assert_eq!(request.stop, ["END"]);
    assert_eq!(accepted(with("model", json!(""))).model, "test-model", "an empty name is the loaded model's");
}

#[test]
fn messages_become_chat_messages() {
    let body = json!({"messages": [
        {"role": "developer", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        {"role": "assistant", "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}]},
        {"role": "tool", "tool_call_id": "call_2_0", "content": "21C"},
    ]});
    let Prompt::Chat { messages, tools, .. } = accepted(body).request.prompt else { panic!("a chat prompt") };
    assert!(tools.is_empty());
    let roles: Vec<Role> = messages.iter().map(|m| m.role).collect();
    assert_eq!(roles, [Role::System, Role::User, Role::Assistant, Role::Tool]);
    assert_eq!(messages[1].content, "a\nb");
    let call = &messages[2].tool_calls[0];
    assert_eq!((call.id.as_str(), call.arguments.as_str()), ("call_2_0", "{\"city\":\"Oslo\"}"));
}

#[test]
fn tools_allow_calls_unless_the_choice_is_none() {
    let auto = accepted(with("tools", weather_tools()));
    assert!(auto.output.tools.is_some() && auto.request.grammar.is_some());
    assert_eq!(auto.request.preserved_tokens, ToolFormat::hermes().markers());
    assert!(auto.request.stop.is_empty());
    let mut body = with("tools", weather_tools());
    body["tool_choice"] = json!("none");
    let none = accepted(body);
    assert!(none.output.tools.is_none(), "calls are not allowed");
    assert_eq!(none.request.stop, ToolFormat::hermes().openers(), "a call cannot start");
    let Prompt::Chat { tools, .. } = none.request.prompt else { panic!("a chat prompt") };
    assert_eq!(tools.len(), 1, "the tools stay in the prompt");
}

#[test]
fn a_named_tool_choice_and_json_formats_are_accepted() {
    let mut body = with(
        "tools",
        json!([{"type": "function", "function": {"name": "set_timer", "parameters": timer_tool().parameters}}]),
    );
    body["tool_choice"] = json!({"type": "function", "function": {"name": "set_timer"}});
    assert!(accepted(body).request.grammar.is_some());
    let object = accepted(with("response_format", json!({"type": "json_object"})));
    assert!(object.output.schema.is_some() && object.request.grammar.is_some());
    assert!(accepted(with("response_format", json!({"type": "text"}))).output.schema.is_none());
}

#[test]
fn a_warm_file_is_a_chat_body_or_a_system_prompt() {
    let Prompt::Chat { messages, tools, .. } = warm_prompt("You are helpful.\n").expect("text") else { panic!("chat") };
    assert_eq!(messages, vec![ChatMessage::system("You are helpful."), ChatMessage::user("")]);
    assert!(tools.is_empty());
    let body = json!({"messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}],
        "tools": weather_tools(), "temperature": 0.3});
    let Prompt::Chat { messages, tools, .. } = warm_prompt(&body.to_string()).expect("JSON") else { panic!("chat") };
    assert_eq!(messages.len(), 2);
    assert_eq!(tools.len(), 1);
    let error = warm_prompt(r#"{"messages": [{"role": "wizard", "content": "x"}]}"#).expect_err("bad role");
    assert!(error.to_string().contains("role"), "{error}");
    assert!(warm_prompt("{ not json").is_err());
}
