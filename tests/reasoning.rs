//! A model that thinks, on the project's own Qwen3-style template over SmolLM2
//! (`tests/fixtures/thinking.jinja`: its generation prompt opens the reasoning with `<think>`,
//! so the model's first words are reasoning). The reasoning is split from the answer, streamed
//! and not, never reaching `content`; the budget makes the engine write `</think>` itself; the
//! template's variables reach it; and a turn whose template drops the earlier reasoning says
//! so in `timings.cache.reason`.

mod common;

use std::path::PathBuf;

use common::{greedy_chat, post_events, post_json, smollm2_path, test_config, SharedServer};
use firstword::EngineConfig;
use serde_json::{json, Value};

fn thinking_config() -> EngineConfig {
    let template = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/thinking.jinja");
    EngineConfig { chat_template_file: Some(template), ..test_config(smollm2_path()) }
}

static THINKING: SharedServer = SharedServer::configured(thinking_config);

const QUESTION: &str = "What is the capital of France?";

fn ask(extra: Value) -> Value {
    greedy_chat(QUESTION, 48, extra)
}

fn no_markers(text: &str) {
    assert!(!text.contains("<think>") && !text.contains("</think>"), "markers leaked: {text:?}");
}

#[tokio::test]
async fn the_models_reasoning_is_split_from_its_answer_and_the_budget_ends_it() {
    let (_guard, server) = THINKING.exclusive().await;
    let (status, body) = post_json(&server.base, "/v1/chat/completions", &ask(json!({"reasoning_budget": 4}))).await;
    assert_eq!(status, 200, "{body}");
    let message = &body["choices"][0]["message"];
    let reasoning = message["reasoning_content"].as_str().expect("reasoning_content");
    let content = message["content"].as_str().expect("content");
    assert!(!reasoning.is_empty(), "{body}");
    no_markers(reasoning);
    no_markers(content);
    // The budget's 4 tokens (the model alone would think on), then the closing text the engine
    // wrote (a few tokens).
    let thought = body["usage"]["completion_tokens_details"]["reasoning_tokens"].as_u64().expect("n");
    assert!((4..=10).contains(&thought), "{thought} reasoning tokens");
    assert!(body["usage"]["completion_tokens"].as_u64().expect("n") > thought, "an answer followed: {body}");
}

#[tokio::test]
async fn a_stream_sends_the_reasoning_first_as_reasoning_content() {
    let (_guard, server) = THINKING.exclusive().await;
    let body = ask(json!({"reasoning_budget": 6, "stream": true, "stream_options": {"include_usage": true}}));
    let (status, events) = post_events(&server.base, "/v1/chat/completions", &body).await;
    assert_eq!(status, 200);
    let (mut reasoning, mut content) = (String::new(), String::new());
    for (_, chunk) in &events {
        let Some(delta) = chunk["choices"].get(0).map(|c| &c["delta"]) else { continue };
        if let Some(text) = delta["reasoning_content"].as_str() {
            assert!(content.is_empty(), "reasoning after the answer began: {text:?}");
            reasoning.push_str(text);
        }
        content.push_str(delta["content"].as_str().unwrap_or(""));
    }
    assert!(!reasoning.is_empty() && !content.is_empty(), "reasoning {reasoning:?}, answer {content:?}");
    no_markers(&reasoning);
    no_markers(&content);
    let usage = &events.iter().rev().find(|(_, c)| c["usage"].is_object()).expect("a usage chunk").1["usage"];
    assert!(usage["completion_tokens_details"]["reasoning_tokens"].as_u64().is_some_and(|n| n >= 6), "{usage}");
}

#[tokio::test]
async fn without_a_budget_a_short_reply_is_all_reasoning() {
    let (_guard, server) = THINKING.exclusive().await;
    let (status, body) = post_json(&server.base, "/v1/chat/completions", &ask(json!({"max_tokens": 6}))).await;
    assert_eq!(status, 200, "{body}");
    let choice = &body["choices"][0];
    assert_eq!(choice["finish_reason"], "length");
    assert!(!choice["message"]["reasoning_content"].as_str().expect("reasoning").is_empty());
    assert_eq!(choice["message"]["content"], "", "no answer yet: {body}");
    assert_eq!(body["usage"]["completion_tokens_details"]["reasoning_tokens"], 6);
}

#[tokio::test]
async fn template_variables_turn_thinking_off() {
    let (_guard, server) = THINKING.exclusive().await;
    let off = json!({"chat_template_kwargs": {"enable_thinking": false}});
    let (_, prompt) = post_json(&server.base, "/apply-template", &ask(off.clone())).await;
    let prompt = prompt["prompt"].as_str().expect("prompt");
    assert!(prompt.ends_with("<think>\n\n</think>\n\n"), "{prompt:?}");
    let (_, effort) = post_json(&server.base, "/apply-template", &ask(json!({"reasoning_effort": "none"}))).await;
    assert_eq!(effort["prompt"], prompt, "reasoning_effort none sets enable_thinking false");
    let (_, thinking) = post_json(&server.base, "/apply-template", &ask(json!({}))).await;
    assert!(thinking["prompt"].as_str().expect("prompt").ends_with("<think>\n"), "{thinking}");

    let (status, body) = post_json(&server.base, "/v1/chat/completions", &ask(off)).await;
    assert_eq!(status, 200, "{body}");
    let message = &body["choices"][0]["message"];
    assert!(message.get("reasoning_content").is_none(), "no reasoning: {message}");
    assert!(!message["content"].as_str().expect("content").is_empty());
    assert_eq!(body["usage"]["completion_tokens_details"]["reasoning_tokens"], 0);
}

#[tokio::test]
async fn a_json_reply_and_a_tool_call_come_after_the_reasoning() {
    let (_guard, server) = THINKING.exclusive().await;
    let schema = json!({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]});
    let format = json!({"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}});
    let body = ask(json!({"reasoning_budget": 6, "response_format": format, "max_tokens": 64}));
    let (status, body) = post_json(&server.base, "/v1/chat/completions", &body).await;
    assert_eq!(status, 200, "{body}");
    let message = &body["choices"][0]["message"];
    assert!(!message["reasoning_content"].as_str().expect("reasoning").is_empty(), "{body}");
    let answer: Value = serde_json::from_str(message["content"].as_str().expect("content")).expect("JSON content");
    assert!(answer["city"].is_string(), "{answer}");

    let tools = json!([{"type": "function", "function": {"name": "get_weather", "parameters": schema}}]);
    let body = ask(json!({"reasoning_budget": 6, "tools": tools, "tool_choice": "required", "max_tokens": 64,
        "parallel_tool_calls": false}));
    let (status, body) = post_json(&server.base, "/v1/chat/completions", &body).await;
    assert_eq!(status, 200, "{body}");
    let choice = &body["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls", "{body}");
    assert!(!choice["message"]["reasoning_content"].as_str().expect("reasoning").is_empty());
    let arguments = choice["message"]["tool_calls"][0]["function"]["arguments"].as_str().expect("arguments");
    assert!(serde_json::from_str::<Value>(arguments).expect("JSON arguments")["city"].is_string());
}

/// With no `reasoning_budget`, a required call, a named call and a JSON reply still arrive
/// within `max_tokens`: the engine closes the reasoning itself while the tokens left are what
/// the smallest valid answer needs plus a margin (the model alone thinks past 200 tokens and
/// ended with `finish_reason: "length"` and no answer).
#[tokio::test]
async fn a_required_call_or_json_reply_arrives_within_max_tokens_without_a_budget() {
    let (_guard, server) = THINKING.exclusive().await;
    let schema = json!({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]});
    let tools = json!([{"type": "function", "function": {"name": "get_weather", "parameters": schema}},
        {"type": "function", "function": {"name": "set_timer", "parameters": {"type": "object",
            "properties": {"minutes": {"type": "integer"}}, "required": ["minutes"]}}}]);
    let named = json!({"type": "function", "function": {"name": "set_timer"}});
    for (choice, expected) in [(json!("required"), None), (named, Some("set_timer"))] {
        let body = greedy_chat(QUESTION, 200, json!({"tools": tools, "tool_choice": choice}));
        let (status, body) = post_json(&server.base, "/v1/chat/completions", &body).await;
        assert_eq!(status, 200, "{body}");
        let choice = &body["choices"][0];
        assert_eq!(choice["finish_reason"], "tool_calls", "{body}");
        let thought = body["usage"]["completion_tokens_details"]["reasoning_tokens"].as_u64().expect("n");
        assert!((100..200).contains(&thought), "it reasoned first, and stopped in time: {body}");
        let call = &choice["message"]["tool_calls"][0]["function"];
        let name = call["name"].as_str().expect("a call's name");
        assert!(expected.is_none_or(|expected| expected == name), "{body}");
        let arguments: Value = serde_json::from_str(call["arguments"].as_str().expect("arguments")).expect("JSON");
        let key = if name == "set_timer" { "minutes" } else { "city" };
        assert!(arguments.get(key).is_some(), "{arguments}");
    }
    let format = json!({"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}});
    let body = greedy_chat(QUESTION, 200, json!({"response_format": format}));
    let (status, body) = post_json(&server.base, "/v1/chat/completions", &body).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["choices"][0]["finish_reason"], "stop", "{body}");
    let content = body["choices"][0]["message"]["content"].as_str().expect("content");
    let answer: Value = serde_json::from_str(content).expect("JSON content");
    assert!(answer["city"].is_string(), "{answer}");
}

#[tokio::test]
async fn the_responses_api_returns_reasoning_items() {
    let (_guard, server) = THINKING.exclusive().await;
    let body = json!({"input": QUESTION, "max_output_tokens": 40, "temperature": 0, "reasoning_budget": 6});
    let (status, whole) = post_json(&server.base, "/v1/responses", &body).await;
    assert_eq!(status, 200, "{whole}");
    let output = whole["output"].as_array().expect("output");
    assert_eq!(output[0]["type"], "reasoning", "{whole}");
    let thought = output[0]["content"][0]["text"].as_str().expect("reasoning text");
    assert!(!thought.is_empty());
    no_markers(thought);
    assert_eq!(output[1]["type"], "message");
    no_markers(output[1]["content"][0]["text"].as_str().expect("text"));
    assert!(whole["usage"]["output_tokens_details"]["reasoning_tokens"].as_u64().is_some_and(|n| n >= 6));

    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let (status, events) = post_events(&server.base, "/v1/responses", &streamed).await;
    assert_eq!(status, 200);
    let kinds: Vec<&str> = events.iter().filter_map(|(name, _)| name.as_deref()).collect();
    let first = |kind: &str| kinds.iter().position(|k| *k == kind).unwrap_or_else(|| panic!("no {kind} in {kinds:?}"));
    assert!(first("response.reasoning_text.delta") < first("response.output_text.delta"), "{kinds:?}");
    assert!(first("response.reasoning_text.done") < first("response.output_text.delta"), "{kinds:?}");
}

/// Turn 1 (its reasoning cut short), then turn 2 sending turn 1's reply back as clients do;
/// returns turn 2's `timings.cache`.
async fn second_turn_cache(base: &str) -> Value {
    let first = ask(json!({"reasoning_budget": 6, "max_tokens": 24}));
    let (_, reply) = post_json(base, "/v1/chat/completions", &first).await;
    let message = &reply["choices"][0]["message"];
    let next = json!({
        "messages": [
            {"role": "user", "content": QUESTION},
            {"role": "assistant", "content": message["content"], "reasoning_content": message["reasoning_content"]},
            {"role": "user", "content": "And of Spain?"}
        ],
        "max_tokens": 4, "temperature": 0, "reasoning_budget": 0
    });
    let (status, body) = post_json(base, "/v1/chat/completions", &next).await;
    assert_eq!(status, 200, "{body}");
    body["timings"]["cache"].clone()
}

#[tokio::test]
async fn reasoning_the_template_drops_is_evaluated_away_before_the_next_turn() {
    let (_guard, server) = THINKING.exclusive().await;
    // The template shows turn 1's reasoning while it is the newest turn, not once a user
    // message follows. After the reply the engine evaluates the next turn's opening as the
    // template will write it (without the reasoning), so turn 2 continues the cache.
    let cache = second_turn_cache(&server.base).await;
    assert_eq!(cache["reason"], Value::Null, "{cache}");
    assert!(cache["prefilled"].as_u64().is_some_and(|n| n < 16), "only the new words: {cache}");
}

fn no_anticipation() -> EngineConfig {
    EngineConfig { anticipate_next_turn: false, ..thinking_config() }
}

static NO_ANTICIPATION: SharedServer = SharedServer::configured(no_anticipation);

#[tokio::test]
async fn without_anticipation_dropped_reasoning_is_a_history_change() {
    let (_guard, server) = NO_ANTICIPATION.exclusive().await;
    let cache = second_turn_cache(&server.base).await;
    assert_eq!(cache["reason"], "history-changed", "the earlier reasoning left the prompt: {cache}");
    assert!(cache["reused"].as_u64().is_some_and(|n| n > 5), "the turns before it stayed cached: {cache}");
}

/// Ollama's `/api/chat` on the same model: `show` lists `thinking`; the reasoning comes in
/// `message.thinking`, never in `content`, whole and streamed (its lines first); `think: false`
/// switches the template's reasoning off.
#[tokio::test]
async fn ollamas_chat_carries_the_reasoning_in_thinking_and_think_false_turns_it_off() {
    let (_guard, server) = THINKING.exclusive().await;
    let base = &server.base;
    let (status, show) = post_json(base, "/api/show", &json!({})).await;
    assert_eq!(status, 200, "{show}");
    assert!(show["capabilities"].as_array().is_some_and(|c| c.contains(&json!("thinking"))), "{show}");

    let ask = |extra: Value| {
        let mut body = json!({"messages": [{"role": "user", "content": QUESTION}], "stream": false,
            "options": {"temperature": 0, "num_predict": 40}});
        for (key, value) in extra.as_object().expect("an object") {
            body[key] = value.clone();
        }
        body
    };
    let (status, whole) = post_json(base, "/api/chat", &ask(json!({}))).await;
    assert_eq!(status, 200, "{whole}");
    let thinking = whole["message"]["thinking"].as_str().expect("message.thinking");
    assert!(!thinking.is_empty(), "{whole}");
    no_markers(thinking);
    no_markers(whole["message"]["content"].as_str().expect("content"));

    let response =
        reqwest::Client::new().post(format!("{base}/api/chat")).json(&ask(json!({"stream": true}))).send().await;
    let text = response.expect("request").text().await.expect("body");
    let lines: Vec<Value> = text.lines().map(|l| serde_json::from_str(l).expect("NDJSON")).collect();
    let streamed: String = lines.iter().filter_map(|l| l["message"]["thinking"].as_str()).collect();
    assert_eq!(streamed, thinking, "the same reasoning, streamed");
    let first_content = lines.iter().position(|l| l["message"]["content"].as_str().is_some_and(|c| !c.is_empty()));
    let first_thinking = lines.iter().position(|l| l["message"]["thinking"].as_str().is_some_and(|t| !t.is_empty()));
    assert!(first_thinking.expect("reasoning lines") < first_content.unwrap_or(usize::MAX), "reasoning first: {text}");
    assert_eq!(lines.last().map(|l| &l["done"]), Some(&json!(true)), "{text}");

    let (status, off) = post_json(base, "/api/chat", &ask(json!({"think": false}))).await;
    assert_eq!(status, 200, "{off}");
    assert!(off["message"]["thinking"].as_str().is_none_or(str::is_empty), "no reasoning: {off}");
    assert!(off["message"]["content"].as_str().is_some_and(|c| !c.is_empty()), "{off}");
}
