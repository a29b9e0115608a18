//! SmolLM2's weights served with other models' chat templates (`--chat-template-file`), one per
//! call syntax family: `tool_choice: "required"` gives a structured call with valid arguments,
//! streamed and not; the round trip (call, result, answer) renders the history the template's
//! way; reasoning templates get a reasoning budget.

mod common;

use std::path::PathBuf;

use common::tools::{check_call, request, tool_definitions, tools};
use common::{post, post_json, spawn_server, stream_chunks, test_config};
use firstword::chat::{CallArguments, ChatTemplate, ToolCall};
use firstword::{Engine, EngineConfig};
use serde_json::{json, Value};

/// A template of llama.cpp's collection (fetched by `models/templates.py`).
fn template(name: &str) -> PathBuf {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("models/templates").join(format!("{name}.jinja"));
    assert!(path.exists(), "{} is missing: run `python3 models/templates.py` (make test does)", path.display());
    path
}

/// One of each family and kind of marker, the most used first, and whether the template writes
/// earlier calls exactly as the model generated them (gpt-oss and Mistral Nemo rewrite them).
/// (Seed-OSS's template is left out: SmolLM2 under its grammar and reasoning markers spends the
/// whole token limit without a visible call.) Every native template's round trip is checked
/// model-free by tests/tool_formats.rs.
const TEMPLATES: &[(&str, &str, bool)] = &[
    ("Qwen3-Coder", "xml", true),
    ("deepseek-ai-DeepSeek-V3.1", "name+json", true),
    ("GLM-4.6", "xml", true),
    ("moonshotai-Kimi-K2", "name+json", true),
    ("unsloth-mistral-Devstral-Small-2507", "name+json", true),
    ("MiniMax-M2", "xml", true),
    ("Qwen-Qwen3-0.6B", "json", true),
    ("openai-gpt-oss-120b", "harmony", false),
    ("meta-llama-Llama-3.2-3B-Instruct", "llama3", true),
    ("LFM2-8B-A1B", "pythonic", true),
    ("google-gemma-4-31B-it", "gemma4", true),
    ("mistralai-Mistral-Nemo-Instruct-2407", "json", false),
    ("Kimi-K2-Instruct", "name+json", true),
    ("MiniMax-M3", "xml", true),
    ("google-gemma-2-2b-it", "generic", true),
    // The reply starts inside the prompt's `>>>` opener.
    ("meetkai-functionary-medium-v3.2", "name+json", true),
    // Calls rendered only where the calling message's content is none.
    ("deepseek-ai-DeepSeek-R1-Distill-Llama-8B", "name+json", true),
];

/// The calls of an answer as (name, arguments), each checked against the test tools' schemas.
fn checked_calls(answer: &Value, context: &str) -> Vec<(String, String, String)> {
    let calls = answer["choices"][0]["message"]["tool_calls"].as_array().cloned().unwrap_or_default();
    assert!(!calls.is_empty(), "{context}: a structured call: {answer}");
    calls
        .iter()
        .map(|call| {
            let name = call["function"]["name"].as_str().expect("name").to_string();
            let arguments = call["function"]["arguments"].as_str().expect("arguments").to_string();
            check_call(&name, &arguments).unwrap_or_else(|e| panic!("{context}: {e}: {answer}"));
            (call["id"].as_str().expect("id").to_string(), name, arguments)
        })
        .collect()
}

#[tokio::test]
async fn every_family_makes_required_calls_and_renders_the_round_trip_its_way() {
    let only = std::env::var("FIRSTWORD_TEMPLATE").ok();
    for &(name, family, exact) in TEMPLATES.iter().filter(|(name, ..)| only.as_deref().is_none_or(|o| o == *name)) {
        let path = template(name);
        let config = EngineConfig {
            chat_template_file: Some(path),
            reasoning_budget: Some(0),
            ..test_config(common::smollm2_path())
        };
        let server = spawn_server(Engine::start(config).expect("SmolLM2 loads with the template"));
        let info = server.engine.model_info().expect("loaded");
        assert_eq!(info.tool_format.name(), family, "{name}");

        let body = request(
            "You are a home assistant.",
            "Set a timer for ten minutes please.",
            json!("required"),
            json!({"temperature": 0, "parallel_tool_calls": false, "max_tokens": 256}),
        );
        let (status, answer) = post(&server.base, &body).await;
        assert_eq!(status, 200, "{name}: {answer}");
        assert_eq!(answer["choices"][0]["finish_reason"], "tool_calls", "{name}: {answer}");
        let calls = checked_calls(&answer, name);
        // Not even the whitespace a reasoning template leaves after its reasoning block.
        assert!(answer["choices"][0]["message"]["content"].is_null(), "{name}: no text beside a forced call: {answer}");

        let mut streamed: Vec<(String, String)> = Vec::new();
        let mut finish = None;
        for chunk in stream_chunks(&server.base, &body).await {
            let Some(choice) = chunk["choices"].get(0) else { continue };
            assert!(choice["delta"]["content"].is_null(), "{name}: no text streamed beside a forced call: {chunk}");
            if let Some(reason) = choice["finish_reason"].as_str() {
                finish = Some(reason.to_string());
            }
            for call in choice["delta"]["tool_calls"].as_array().into_iter().flatten() {
                let index = call["index"].as_u64().expect("index") as usize;
                if let Some(name) = call["function"]["name"].as_str() {
                    streamed.push((name.to_string(), String::new()));
                }
                streamed[index].1.push_str(call["function"]["arguments"].as_str().unwrap_or_default());
            }
        }
        assert_eq!(finish.as_deref(), Some("tool_calls"), "{name}");
        assert!(!streamed.is_empty(), "{name}: streamed calls");
        for (function, arguments) in &streamed {
            check_call(function, arguments).unwrap_or_else(|e| panic!("{name}: streamed {e}"));
        }

        // The round trip: the call, its result, the answer.
        let (id, function, arguments) = calls[0].clone();
        let mut messages = body["messages"].as_array().expect("messages").clone();
        messages.push(json!({"role": "assistant", "content": null, "tool_calls": [{"id": id, "type": "function",
            "function": {"name": function, "arguments": arguments}}]}));
        messages.push(json!({"role": "tool", "tool_call_id": id, "content": "Timer started."}));
        let follow = json!({"messages": messages, "tools": tools(), "max_tokens": 16, "temperature": 0});
        let (status, reply) = post(&server.base, &follow).await;
        assert_eq!(status, 200, "{name}: {reply}");
        // The history as the template writes it: the prompt holds the call as the template
        // renders it on its own.
        let (status, applied) = post_json(&server.base, "/apply-template", &follow).await;
        assert_eq!(status, 200, "{name}: {applied}");
        let prompt = applied["prompt"].as_str().expect("prompt");
        // Templates print arguments as Python's json.dumps does, or the client's text as it is
        // where they take it as text (functionary v3.2, DeepSeek-R1-Distill-Llama).
        let value: Value = serde_json::from_str(&arguments).expect("JSON");
        let python = serde_json::to_string(&value).expect("JSON").replace("\":", "\": ").replace(",\"", ", \"");
        let source = std::fs::read_to_string(template(name)).expect("readable");
        let as_text = ChatTemplate::new(&source, "", "").expect("compiles").call_arguments() == CallArguments::Text;
        let call = ToolCall {
            id: id.clone(),
            name: function.clone(),
            arguments: if as_text { arguments.clone() } else { python },
        };
        let written = info.tool_format.write_calls(&[call], &tool_definitions());
        if exact {
            assert!(
                prompt.contains(&written),
                "{name}: the call as the template writes it, {written:?}, in {prompt:?}"
            );
        } else {
            // The template writes the call its own way: its name and arguments are there.
            assert!(prompt.contains(&function), "{name}: the call in {prompt:?}");
            for (_, value) in value.as_object().into_iter().flatten() {
                assert!(prompt.contains(&value.to_string()), "{name}: the argument {value} in {prompt:?}");
            }
        }
        assert!(prompt.contains("Timer started."), "{name}: the result");
        server.engine.wait_idle_blocking();
        println!("{name}: {family} call {function}({arguments}), streamed {streamed:?}");
    }
}

/// Functionary v3.2's reply starts after the prompt's `>>>`: a text reply is `all\n` and the
/// text (the grammar of `tool_choice: "none"` forces it), and the client gets the text alone,
/// streamed and not.
#[tokio::test]
async fn functionary_v3_2_text_replies_come_without_their_recipient() {
    let config = EngineConfig {
        chat_template_file: Some(template("meetkai-functionary-medium-v3.2")),
        ..test_config(common::smollm2_path())
    };
    let server = spawn_server(Engine::start(config).expect("SmolLM2 loads with the template"));
    let body =
        request("You are a home assistant.", "Say hello.", json!("none"), json!({"temperature": 0, "max_tokens": 12}));
    let (status, answer) = post(&server.base, &body).await;
    assert_eq!(status, 200, "{answer}");
    let content = answer["choices"][0]["message"]["content"].as_str().expect("text content");
    assert!(!content.trim().is_empty() && !content.starts_with("all"), "{answer}");
    assert!(answer["choices"][0]["message"]["tool_calls"].is_null(), "{answer}");
    let mut streamed = String::new();
    for chunk in stream_chunks(&server.base, &body).await {
        if let Some(text) = chunk["choices"].get(0).and_then(|c| c["delta"]["content"].as_str()) {
            streamed.push_str(text);
        }
    }
    assert_eq!(streamed, content, "the same text streamed");
    // The prompt of the next turn holds the reply as the model wrote it, after the opener.
    let mut messages = body["messages"].as_array().expect("messages").clone();
    messages.push(json!({"role": "assistant", "content": content}));
    messages.push(json!({"role": "user", "content": "Thanks."}));
    let (status, applied) = post_json(&server.base, "/apply-template", &json!({"messages": messages})).await;
    assert_eq!(status, 200, "{applied}");
    let prompt = applied["prompt"].as_str().expect("prompt");
    assert!(prompt.contains(&format!("<|end_header_id|>\n\n>>>all\n{content}<|eot_id|>")), "{prompt:?}");
    server.engine.wait_idle_blocking();
}

/// A required call cut by `max_tokens` is no call: `finish_reason` is "length" and the answer
/// carries no call with unfinished arguments (Qwen3's template, reasoning off by budget).
#[tokio::test]
async fn a_call_cut_by_max_tokens_comes_back_as_length_without_the_call() {
    let config = EngineConfig {
        chat_template_file: Some(template("Qwen-Qwen3-0.6B")),
        reasoning_budget: Some(0),
        ..test_config(common::smollm2_path())
    };
    let server = spawn_server(Engine::start(config).expect("SmolLM2 loads with the template"));
    for max_tokens in [4, 8, 16] {
        let body = request(
            "You are a home assistant.",
            "Set a timer for ten minutes please.",
            json!("required"),
            json!({"temperature": 0, "max_tokens": max_tokens}),
        );
        let (status, answer) = post(&server.base, &body).await;
        assert_eq!(status, 200, "{max_tokens}: {answer}");
        let choice = &answer["choices"][0];
        assert_eq!(choice["finish_reason"], "length", "{max_tokens}: {answer}");
        assert!(choice["message"]["tool_calls"].is_null(), "{max_tokens}: no cut call: {answer}");
        assert_eq!(answer["usage"]["completion_tokens"], max_tokens, "{answer}");
        let mut finish = None;
        let mut started = false;
        for chunk in stream_chunks(&server.base, &body).await {
            let Some(choice) = chunk["choices"].get(0) else { continue };
            started |= choice["delta"]["tool_calls"].is_array();
            if let Some(reason) = choice["finish_reason"].as_str() {
                finish = Some(reason.to_string());
            }
        }
        assert_eq!(finish.as_deref(), Some("length"), "{max_tokens}: streamed");
        // The longest cut comes inside the call: its name was streamed already.
        assert!(max_tokens < 16 || started, "{max_tokens}: the call had started");
    }
    server.engine.wait_idle_blocking();
}
