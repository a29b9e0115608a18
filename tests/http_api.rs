//! The OpenAI-compatible API against a real server on the real SmolLM2 model.

mod common;

use std::time::{Duration, Instant};

use common::{chunks, exclusive_server, long_system_prompt, post, post_stream, SseData};
use serde_json::{json, Value};

/// SmolLM2's `<|im_end|>`: banning it makes generation run to `max_tokens`.
const SMOLLM2_IM_END: &str = "2";

fn content_of(events: &[SseData]) -> String {
    chunks(events)
        .iter()
        .filter_map(|c| c["choices"].get(0)?["delta"]["content"].as_str().map(str::to_string))
        .collect()
}

#[tokio::test]
async fn non_streaming_completion_has_the_openai_shape() {
    let (_guard, server) = exclusive_server().await;
    let base = server.base.as_str();
    let (status, body) = post(
        base,
        &json!({
            "model": "smollm2",
            "messages": [{"role": "user", "content": "Say hello."}],
            "max_tokens": 12,
            "temperature": 0
        }),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert!(body["id"].as_str().is_some_and(|id| id.starts_with("chatcmpl-")), "{body}");
    assert_eq!(body["object"], "chat.completion");
    assert_eq!(body["model"], "smollm2", "echoes the requested model");
    assert!(body["created"].as_u64().is_some_and(|t| t > 1_700_000_000));
    assert!(body["system_fingerprint"].is_string());
    let choice = &body["choices"][0];
    assert_eq!(choice["index"], 0);
    assert_eq!(choice["message"]["role"], "assistant");
    assert!(!choice["message"]["content"].as_str().expect("content").is_empty());
    assert!(["stop", "length"].contains(&choice["finish_reason"].as_str().expect("finish_reason")));
    let usage = &body["usage"];
    let (prompt, completion) =
        (usage["prompt_tokens"].as_u64().expect("n"), usage["completion_tokens"].as_u64().expect("n"));
    assert!(prompt > 5 && (1..=12).contains(&completion), "{usage}");
    assert_eq!(usage["total_tokens"].as_u64(), Some(prompt + completion));
    assert!(usage["prompt_tokens_details"]["cached_tokens"].as_u64().is_some_and(|c| c < prompt));
    let timings = &body["timings"];
    assert_eq!(timings["predicted_n"].as_u64(), Some(completion));
    assert_eq!(timings["prompt_n"].as_u64().expect("n") + timings["cache_n"].as_u64().expect("n"), prompt);
}

#[tokio::test]
async fn streaming_chunks_follow_openai_order_with_usage_last() {
    let (_guard, server) = exclusive_server().await;
    let base = server.base.as_str();
    let (status, events) = post_stream(
        base,
        &json!({
            "messages": [{"role": "user", "content": "Count from one to five."}],
            "max_tokens": 20,
            "temperature": 0,
            "stream": true,
            "stream_options": {"include_usage": true}
        }),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(events.last(), Some(&SseData::Done), "ends with [DONE]");
    assert_eq!(events.iter().filter(|e| **e == SseData::Done).count(), 1);
    let chunks = chunks(&events);
    assert!(chunks.len() >= 4, "role, content, finish and usage chunks: {chunks:?}");
    let id = chunks[0]["id"].as_str().expect("id");
    for chunk in &chunks {
        assert_eq!(chunk["id"], id, "one id for all chunks");
        assert_eq!(chunk["object"], "chat.completion.chunk");
        assert!(chunk["created"].is_u64() && chunk["model"].is_string());
    }
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant", "first chunk carries the role");
    let (usage_chunk, choice_chunks) = chunks.split_last().expect("chunks");
    assert_eq!(usage_chunk["choices"], json!([]), "usage chunk has no choices");
    let finish: Vec<&Value> = choice_chunks.iter().map(|c| &c["choices"][0]["finish_reason"]).collect();
    let (last_finish, earlier) = finish.split_last().expect("finish");
    assert!(last_finish.as_str().is_some_and(|r| r == "stop" || r == "length"), "{last_finish}");
    assert!(earlier.iter().all(|f| f.is_null()), "only the last choice chunk finishes");
    for chunk in choice_chunks {
        assert!(chunk.get("usage").is_none(), "usage only in the last chunk");
    }
    let usage = &usage_chunk["usage"];
    let completion = usage["completion_tokens"].as_u64().expect("completion_tokens");
    assert!((1..=20).contains(&completion));
    assert_eq!(usage["total_tokens"].as_u64(), Some(usage["prompt_tokens"].as_u64().expect("n") + completion));
    assert!(!content_of(&events).is_empty());
}

#[tokio::test]
async fn stream_without_include_usage_sends_no_usage_chunk() {
    let (_guard, server) = exclusive_server().await;
    let base = server.base.as_str();
    let (status, events) = post_stream(
        base,
        &json!({
            "messages": [{"role": "user", "content": "Hi"}],
            "max_tokens": 4,
            "stream": true
        }),
    )
    .await;
    assert_eq!(status, 200);
    let chunks = chunks(&events);
    assert!(chunks.iter().all(|c| c.get("usage").is_none() && !c["choices"].as_array().expect("choices").is_empty()));
    assert!(chunks.last().expect("chunk")["choices"][0]["finish_reason"].is_string());
    assert_eq!(events.last(), Some(&SseData::Done));
}

#[tokio::test]
async fn streamed_and_non_streamed_greedy_answers_match_from_the_same_cache_state() {
    let (_guard, server) = exclusive_server().await;
    let base = server.base.as_str();
    let request = |stream: bool| {
        json!({
            "messages": [{"role": "system", "content": "Answer in one short sentence."},
                         {"role": "user", "content": "What colour is the sky on a clear day?"}],
            "max_tokens": 24, "temperature": 0, "stream": stream
        })
    };
    // Warm the cache with the same prompt, so both answers are computed from the same split.
    post(base, &request(false)).await;
    let (_, plain) = post(base, &request(false)).await;
    let (_, events) = post_stream(base, &request(true)).await;
    assert_eq!(content_of(&events), plain["choices"][0]["message"]["content"].as_str().expect("content"));
}

#[tokio::test]
async fn second_turn_reuses_the_first_turns_prompt_and_reply() {
    let (_guard, server) = exclusive_server().await;
    let base = server.base.as_str();
    let system = long_system_prompt(2000);
    let turn1 = json!({
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": "Which facts mention trains?"}],
        "max_tokens": 24, "temperature": 0
    });
    let (status, first) = post(base, &turn1).await;
    assert_eq!(status, 200, "{first}");
    let reply = first["choices"][0]["message"]["content"].as_str().expect("reply").to_string();
    let prompt1 = first["usage"]["prompt_tokens"].as_u64().expect("n");
    let completion1 = first["usage"]["completion_tokens"].as_u64().expect("n");
    assert!(prompt1 > 1500, "system prompt is ~2K tokens: {prompt1}");

    let turn2 = json!({
        "messages": [{"role": "system", "content": system},
                     {"role": "user", "content": "Which facts mention trains?"},
                     {"role": "assistant", "content": reply},
                     {"role": "user", "content": "And which mention gardens?"}],
        "max_tokens": 8, "temperature": 0
    });
    let (status, second) = post(base, &turn2).await;
    assert_eq!(status, 200, "{second}");
    let cached = second["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().expect("cached");
    // Every evaluated token of turn 1 is reused: its prompt and its reply, all but the last
    // sampled token, which was never evaluated (it is prefilled with turn 2's suffix).
    assert!(
        cached >= prompt1 + completion1 - 1,
        "turn 2 reuses turn 1's prompt ({prompt1}) and reply ({completion1}): cached {cached}"
    );
    assert_eq!(second["timings"]["cache_n"].as_u64(), Some(cached));
    assert!(second["timings"]["prompt_n"].as_u64().expect("n") < 60, "only the new turn is prefilled");
}

#[tokio::test]
async fn disconnect_mid_stream_frees_the_engine_and_keeps_the_cache() {
    let (_guard, server) = exclusive_server().await;
    let base = server.base.as_str();
    let system = long_system_prompt(600);
    let long = json!({
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": "Tell a long story."}],
        "max_tokens": 3000, "stream": true, "logit_bias": {SMOLLM2_IM_END: -100}
    });
    let mut response =
        reqwest::Client::new().post(format!("{base}/v1/chat/completions")).json(&long).send().await.expect("request");
    let mut received = String::new();
    while received.matches("data: ").count() < 5 {
        let chunk = response.chunk().await.expect("chunk").expect("stream still open");
        received.push_str(&String::from_utf8_lossy(&chunk));
    }
    drop(response);

    let started = Instant::now();
    let (status, next) = post(
        base,
        &json!({
            "messages": [{"role": "system", "content": system}, {"role": "user", "content": "Say yes."}],
            "max_tokens": 4
        }),
    )
    .await;
    assert_eq!(status, 200, "{next}");
    // 3000 tokens would take tens of seconds; a freed engine answers in well under that.
    assert!(started.elapsed() < Duration::from_secs(20), "engine was not freed: {:?}", started.elapsed());
    let cached = next["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().expect("cached");
    assert!(cached > 500, "the system prompt is still cached after the disconnect: {cached}");
}

#[tokio::test]
async fn a_full_queue_answers_503_and_queued_requests_of_departed_clients_never_run() {
    // A server of its own, whose queue holds two waiting requests.
    let engine = firstword::Engine::start(firstword::EngineConfig {
        queue_size: 2,
        ..common::test_config(common::smollm2_path())
    })
    .expect("loads");
    let server = common::spawn_server(engine);
    let base = &server.base;
    let url = format!("{base}/v1/chat/completions");
    let long = json!({
        "messages": [{"role": "user", "content": "Write an endless poem."}],
        "max_tokens": 3000, "stream": true, "logit_bias": {SMOLLM2_IM_END: -100}
    });
    let short = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2});
    // One runs, two wait.
    let mut holders = Vec::new();
    for _ in 0..3 {
        let (body, url) = (long.clone(), url.clone());
        holders.push(tokio::spawn(async move {
            let mut response = reqwest::Client::new().post(url).json(&body).send().await.expect("request");
            // Keep the stream open until the test aborts this task.
            while let Ok(Some(_)) = response.chunk().await {}
        }));
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let response = reqwest::Client::new().post(&url).json(&short).send().await.expect("request");
    assert_eq!(response.status().as_u16(), 503);
    assert_eq!(response.headers().get("retry-after").and_then(|v| v.to_str().ok()), Some("1"));
    let body: Value = response.json().await.expect("envelope");
    assert_eq!(body["error"]["code"], "queue_full");

    for holder in &holders {
        holder.abort();
    }
    let started = Instant::now();
    loop {
        let response = reqwest::Client::new().post(&url).json(&short).send().await.expect("request");
        match response.status().as_u16() {
            // The departed clients' requests may still be leaving the queue.
            503 => tokio::time::sleep(Duration::from_millis(50)).await,
            status => {
                assert_eq!(status, 200);
                break;
            }
        }
        assert!(started.elapsed() < Duration::from_secs(20), "the queue never drained");
    }
    // Two abandoned 3000-token requests would take minutes had they run.
    assert!(started.elapsed() < Duration::from_secs(20), "queued requests of departed clients ran");
}

#[tokio::test]
async fn health_and_models_answer() {
    let (_guard, server) = exclusive_server().await;
    let base = server.base.as_str();
    let client = reqwest::Client::new();
    let health = client.get(format!("{base}/health")).send().await.expect("health");
    assert_eq!(health.status().as_u16(), 200);
    assert_eq!(health.json::<Value>().await.expect("json")["status"], "ok");
    let models: Value =
        client.get(format!("{base}/v1/models")).send().await.expect("models").json().await.expect("json");
    assert_eq!(models["object"], "list");
    let card = &models["data"][0];
    assert_eq!(card["id"], "SmolLM2-135M-Instruct.Q4_1");
    assert_eq!(card["object"], "model");
    assert_eq!(card["owned_by"], "firstword");
    assert!(card["created"].is_u64());
}

#[tokio::test]
async fn requests_real_clients_send_are_accepted() {
    let (_guard, server) = exclusive_server().await;
    // Shapes from openai-node, LiveKit, Home Assistant and LiteLLM (see OPENAI-COMPAT notes).
    let (status, body) = post(
        &server.base,
        &json!({
            "model": "gpt-4o-mini",
            "messages": [
                {"role": "developer", "content": "You control the lights."},
                {"role": "user", "content": [{"type": "text", "text": "Turn on"}, {"type": "text", "text": "the kitchen light"}], "name": "alice"},
                {"role": "assistant", "content": null, "refusal": null, "parsed": null,
                 "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "set_light", "arguments": "{\"room\": \"kitchen\", \"on\": true}"}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "{\"ok\": true}"},
                {"role": "assistant", "tool_calls": [{"id": "call_2", "type": "function", "function": {"name": "set_light", "arguments": {"room": "hall"}}}]},
                {"role": "tool", "tool_call_id": "call_2", "content": "done"},
                {"role": "user", "content": "Thanks!"}
            ],
            "tools": [{"type": "function", "function": {"name": "set_light", "strict": true,
                "parameters": {"type": "object", "properties": {"room": {"type": "string"}, "on": {"type": "boolean"}},
                               "required": ["room"], "additionalProperties": false}}}],
            "tool_choice": "none",
            "response_format": null,
            "user": "alice", "metadata": {"session": "1"}, "store": false,
            "max_tokens": 8, "max_completion_tokens": 8,
            "stop": ["\n\n"], "seed": 42, "top_k": 20, "min_p": 0.1, "repeat_penalty": 1.1,
            "presence_penalty": 0.5, "frequency_penalty": 0.5, "logit_bias": {"5": -1},
            "parallel_tool_calls": true, "some_future_field": {"x": 1}
        }),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert!(body["choices"][0]["message"]["content"].is_string());
}

#[tokio::test]
async fn stop_strings_end_generation_before_them() {
    let (_guard, server) = exclusive_server().await;
    let request = |stop: Value| {
        json!({"messages": [{"role": "user", "content": "Count from 1 to 20, separated by commas."}],
               "max_tokens": 40, "temperature": 0, "stop": stop})
    };
    let (_, free) = post(&server.base, &request(Value::Null)).await;
    let text = free["choices"][0]["message"]["content"].as_str().expect("content").to_string();
    let at = text.find('5').expect("the count reaches 5");
    let (status, stopped) = post(&server.base, &request(json!(["5", "never"]))).await;
    assert_eq!(status, 200, "{stopped}");
    assert_eq!(stopped["choices"][0]["message"]["content"].as_str(), Some(&text[..at]));
    assert_eq!(stopped["choices"][0]["finish_reason"], "stop");
}

#[tokio::test]
async fn health_is_503_while_the_model_loads() {
    // A FIFO with no writer: opening the "model" blocks, so the engine stays in loading.
    let fifo = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("loading-forever.gguf");
    let _ = std::fs::remove_file(&fifo);
    let made = std::process::Command::new("mkfifo").arg(&fifo).status().expect("mkfifo runs");
    assert!(made.success());
    let loading = common::spawn_server(firstword::Engine::spawn(firstword::EngineConfig::new(&fifo)));
    let client = reqwest::Client::new();
    let health = client.get(format!("{}/health", loading.base)).send().await.expect("health");
    assert_eq!(health.status().as_u16(), 503);
    let body: Value = health.json().await.expect("envelope");
    assert_eq!(body["error"]["code"], "model_loading", "{body}");
    let (status, body) = post(&loading.base, &json!({"messages": [{"role": "user", "content": "hi"}]})).await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["error"]["code"], "model_loading");
}
