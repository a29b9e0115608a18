//! Token log-probabilities against the real SmolLM2 model: chat completions (streamed and not,
//! with stop strings, tool calls and JSON output) and text completions. They describe the
//! model's own distribution: sampling settings change which token is picked, never the
//! numbers.

mod common;

use common::{exclusive_server, greedy_chat, post_events, post_json};
use serde_json::{json, Value};

const QUESTION: &str = "Name three fruits.";

fn chat(extra: Value) -> Value {
    greedy_chat(QUESTION, 12, extra)
}

/// The bytes of each entry of `logprobs.content`, joined.
fn joined_bytes(entries: &[Value]) -> Vec<u8> {
    entries
        .iter()
        .flat_map(|e| e["bytes"].as_array().expect("bytes").iter().map(|b| b.as_u64().expect("a byte") as u8))
        .collect()
}

fn entries(choice: &Value) -> Vec<Value> {
    choice["logprobs"]["content"].as_array().expect("logprobs.content").clone()
}

/// Checks one entry: text and bytes agree, log-probabilities are at most 0, alternatives are
/// sorted and their probabilities sum to at most 1.
fn check_entry(entry: &Value, top: usize) {
    let bytes: Vec<u8> =
        entry["bytes"].as_array().expect("bytes").iter().map(|b| b.as_u64().expect("b") as u8).collect();
    assert_eq!(entry["token"].as_str(), Some(String::from_utf8_lossy(&bytes).as_ref()), "{entry}");
    assert!(entry["logprob"].as_f64().expect("logprob") <= 0.0, "{entry}");
    let alternatives = entry["top_logprobs"].as_array().expect("top_logprobs");
    assert_eq!(alternatives.len(), top, "{entry}");
    let logprobs: Vec<f64> = alternatives.iter().map(|a| a["logprob"].as_f64().expect("logprob")).collect();
    assert!(logprobs.windows(2).all(|w| w[0] >= w[1]), "sorted: {logprobs:?}");
    let mass: f64 = logprobs.iter().map(|l| l.exp()).sum();
    assert!(mass <= 1.0 + 1e-4, "probabilities sum to {mass}");
}

#[tokio::test]
async fn chat_logprobs_describe_each_generated_token() {
    let (_guard, server) = exclusive_server().await;
    let (status, body) =
        post_json(&server.base, "/v1/chat/completions", &chat(json!({"logprobs": true, "top_logprobs": 5}))).await;
    assert_eq!(status, 200, "{body}");
    let choice = &body["choices"][0];
    let entries = entries(choice);
    assert_eq!(entries.len() as u64, body["usage"]["completion_tokens"].as_u64().expect("n"), "one per token");
    assert_eq!(
        String::from_utf8(joined_bytes(&entries)).expect("UTF-8"),
        choice["message"]["content"].as_str().expect("content"),
        "the tokens make up the content"
    );
    for entry in &entries {
        check_entry(entry, 5);
        // Greedy decoding picks the likeliest token.
        assert_eq!(entry["top_logprobs"][0]["token"], entry["token"], "{entry}");
        assert_eq!(entry["top_logprobs"][0]["logprob"], entry["logprob"], "{entry}");
    }
    assert_eq!(choice["logprobs"]["refusal"], Value::Null);
    // Without the flag there are none.
    let (_, plain) = post_json(&server.base, "/v1/chat/completions", &chat(json!({}))).await;
    assert_eq!(plain["choices"][0]["logprobs"], Value::Null);
}

#[tokio::test]
async fn logprobs_come_from_the_model_not_the_sampling_settings() {
    let (_guard, server) = exclusive_server().await;
    let first = |body: Value| {
        let base = server.base.clone();
        async move {
            let (status, body) = post_json(&base, "/v1/chat/completions", &body).await;
            assert_eq!(status, 200, "{body}");
            entries(&body["choices"][0])[0].clone()
        }
    };
    let greedy = first(chat(json!({"logprobs": true, "top_logprobs": 3, "max_tokens": 1}))).await;
    // The first token of " zebra" is nowhere near the likeliest first token; a bias makes the
    // sampler pick it.
    let (_, zebra) = post_json(&server.base, "/tokenize", &json!({"content": " zebra", "with_pieces": true})).await;
    let (id, piece) = (zebra["tokens"][0]["id"].as_i64().expect("a token"), zebra["tokens"][0]["piece"].clone());
    let biased = first(chat(json!({
        "logprobs": true, "top_logprobs": 3, "max_tokens": 1, "temperature": 1.5, "seed": 7,
        "logit_bias": {id.to_string(): 100}
    })))
    .await;
    assert_eq!(biased["token"], piece, "the bias picked it: {biased}");
    let best = greedy["top_logprobs"][0]["logprob"].as_f64().expect("logprob");
    assert!(biased["logprob"].as_f64().expect("logprob") < best - 2.0, "its own, low, probability: {biased}");
    // The same alternatives, whatever the temperature and the bias (the prompt's last token is
    // evaluated again on its own, so the last bits may differ).
    assert_eq!(greedy["top_logprobs"][0]["token"], biased["top_logprobs"][0]["token"]);
    for a in greedy["top_logprobs"].as_array().expect("top") {
        let twin = biased["top_logprobs"].as_array().expect("top").iter().find(|b| b["token"] == a["token"]);
        if let Some(b) = twin {
            let (a, b) = (a["logprob"].as_f64().expect("l"), b["logprob"].as_f64().expect("l"));
            assert!((a - b).abs() < 1e-2, "{a} vs {b}");
        }
    }
}

#[tokio::test]
async fn streamed_logprobs_go_with_their_text_and_leave_out_a_stop_string() {
    let (_guard, server) = exclusive_server().await;
    let (_, whole) = post_json(&server.base, "/v1/chat/completions", &chat(json!({"max_tokens": 24}))).await;
    let text = whole["choices"][0]["message"]["content"].as_str().expect("content").to_string();
    // A stop string from the middle of the greedy answer.
    let words: Vec<&str> = text.split_whitespace().collect();
    assert!(words.len() >= 4, "a long enough answer: {text:?}");
    let stop = format!(" {}", words[words.len() / 2]);
    let body = chat(json!({"max_tokens": 24, "logprobs": true, "stream": true, "stop": [stop]}));
    let (status, events) = post_events(&server.base, "/v1/chat/completions", &body).await;
    assert_eq!(status, 200);
    let mut content = String::new();
    let mut logprobs = Vec::new();
    for (_, chunk) in &events {
        let Some(choice) = chunk["choices"].get(0) else { continue };
        content.push_str(choice["delta"]["content"].as_str().unwrap_or(""));
        if let Some(list) = choice["logprobs"]["content"].as_array() {
            // Each token's entry comes with (or after) the chunk that carries its last byte.
            assert!(content.len() >= joined_bytes(&logprobs).len(), "no entry ahead of its text");
            logprobs.extend(list.iter().cloned());
        }
    }
    assert!(!content.is_empty() && !content.contains(stop.as_str()), "cut before {stop:?}: {content:?}");
    let joined = String::from_utf8(joined_bytes(&logprobs)).expect("UTF-8");
    let extra = joined.strip_prefix(content.as_str()).unwrap_or_else(|| panic!("{joined:?} begins with {content:?}"));
    assert!(
        stop.starts_with(extra) || extra.starts_with(stop.as_str()),
        "at most the token that began the stop: {extra:?}"
    );
}

#[tokio::test]
async fn tool_calls_and_json_replies_have_logprobs_too() {
    let (_guard, server) = exclusive_server().await;
    let tools = json!([{"type": "function", "function": {"name": "set_timer", "parameters":
        {"type": "object", "properties": {"minutes": {"type": "integer"}}, "required": ["minutes"]}}}]);
    let calls =
        chat(json!({"logprobs": true, "top_logprobs": 2, "tools": tools, "tool_choice": "required", "max_tokens": 48,
        "parallel_tool_calls": false}));
    let (status, body) = post_json(&server.base, "/v1/chat/completions", &calls).await;
    assert_eq!(status, 200, "{body}");
    let choice = &body["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls", "{body}");
    let call_entries = entries(choice);
    assert_eq!(call_entries.len() as u64, body["usage"]["completion_tokens"].as_u64().expect("n"));
    let written = String::from_utf8(joined_bytes(&call_entries)).expect("UTF-8");
    assert!(written.contains("set_timer"), "the call's own tokens: {written:?}");
    call_entries.iter().for_each(|e| check_entry(e, 2));

    let schema = json!({"type": "object", "properties": {"fruit": {"type": "string"}}, "required": ["fruit"]});
    let json_reply = chat(json!({"logprobs": true, "max_tokens": 32,
        "response_format": {"type": "json_schema", "json_schema": {"name": "f", "schema": schema}}}));
    let (status, body) = post_json(&server.base, "/v1/chat/completions", &json_reply).await;
    assert_eq!(status, 200, "{body}");
    let choice = &body["choices"][0];
    let content = choice["message"]["content"].as_str().expect("content");
    assert_eq!(String::from_utf8(joined_bytes(&entries(choice))).expect("UTF-8"), content);
}

#[tokio::test]
async fn text_completions_carry_the_legacy_lists() {
    let (_guard, server) = exclusive_server().await;
    let body = json!({"prompt": "The three primary colours are", "max_tokens": 8, "temperature": 0, "logprobs": 3});
    let (status, body) = post_json(&server.base, "/v1/completions", &body).await;
    assert_eq!(status, 200, "{body}");
    let choice = &body["choices"][0];
    let text = choice["text"].as_str().expect("text");
    let lists = &choice["logprobs"];
    let tokens: Vec<&str> =
        lists["tokens"].as_array().expect("tokens").iter().map(|t| t.as_str().expect("s")).collect();
    assert_eq!(tokens.len() as u64, body["usage"]["completion_tokens"].as_u64().expect("n"));
    assert_eq!(tokens.concat(), text);
    let offsets: Vec<u64> =
        lists["text_offset"].as_array().expect("offsets").iter().map(|o| o.as_u64().expect("n")).collect();
    let expected: Vec<u64> = tokens
        .iter()
        .scan(0, |at, t| {
            let start = *at;
            *at += t.chars().count() as u64;
            Some(start)
        })
        .collect();
    assert_eq!(offsets, expected);
    for (i, top) in lists["top_logprobs"].as_array().expect("top").iter().enumerate() {
        let top = top.as_object().expect("a map");
        assert!(!top.is_empty() && top.len() <= 3, "{top:?}");
        // Greedy: the token is the likeliest, with the same number.
        let best = top.values().map(|l| l.as_f64().expect("l")).fold(f64::MIN, f64::max);
        assert!((lists["token_logprobs"][i].as_f64().expect("l") - best).abs() < 1e-6, "{top:?}");
    }
}
