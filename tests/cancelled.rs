//! A cancelled request is parked, not lost: when the client leaves a reply while it is
//! generated (LiveKit's preemptive generation cancelled on a changed transcript, a retry), the
//! tokens it generated stay parked (`--park-seconds`), nothing more is generated for them, and
//! the same request sent again adopts them (`timings.cache.adopted`): the answer is the one the
//! request gives alone, greedy and sampled with a seed, plain text and a required tool call,
//! over the engine, chat completions and responses. Another request, and the park time,
//! discard them.

mod common;

use std::time::Duration;

use common::{
    generate, post, post_json, settled_cache, smollm2_path, spawn_server, test_config, Generated, TestServer,
};
use firstword::{ChatMessage, Engine, EngineConfig, Event, GenerationRequest, Prompt, SamplingParams};
use serde_json::{json, Value};

fn engine(config: EngineConfig) -> Engine {
    Engine::start(config).expect("SmolLM2 loads")
}

/// A short conversation asking `question`, answered in at most 40 tokens with `sampling`.
fn request(question: &str, sampling: SamplingParams) -> GenerationRequest {
    let messages = vec![ChatMessage::system("You are a helpful home assistant."), ChatMessage::user(question)];
    GenerationRequest {
        prompt: Prompt::chat(messages, Vec::new()),
        max_tokens: Some(40),
        sampling,
        ..GenerationRequest::chat(Vec::new())
    }
}

/// Submits `request` and leaves once `texts` pieces of text arrived (the reply must still be
/// going on then); returns how many arrived.
fn leave_after(engine: &Engine, request: GenerationRequest, texts: usize) -> usize {
    let mut generation = engine.submit(request).expect("submitted");
    let mut received = 0;
    while received < texts {
        match generation.next_blocking() {
            Some(Event::Text(_)) => received += 1,
            Some(Event::Finished { .. } | Event::Failed(_)) | None => panic!("the reply ended before the client left"),
            Some(_) => {}
        }
    }
    drop(generation);
    received
}

/// What must not change with adoption.
fn outcome(answer: &Generated) -> (String, firstword::FinishReason, u32) {
    (answer.text.clone(), answer.reason, answer.usage.completion_tokens)
}

#[test]
fn a_request_sent_again_after_its_client_left_is_adopted() {
    let cases = [
        ("greedy", SamplingParams::greedy()),
        ("seeded temperature 0.8", SamplingParams { temperature: 0.8, seed: Some(7), ..SamplingParams::default() }),
    ];
    let alone = engine(test_config(smollm2_path()));
    let parking = engine(test_config(smollm2_path()));
    for (name, sampling) in cases {
        let request = request("Describe a lighthouse at night.", sampling);
        let expected = generate(&alone, request.clone());
        let received = leave_after(&parking, request.clone(), 8);
        let answer = generate(&parking, request);
        let cache = answer.timings.cache.clone();
        eprintln!("{name}: {cache:?}\nadopted {:?}\nalone {:?}", answer.text, expected.text);
        assert_eq!(outcome(&answer), outcome(&expected), "{name}: adoption changed the answer");
        // The decode step of the last token it had may have been stopped when it left (that
        // token is then picked again from its parked logits and evaluated after it is sent).
        assert!(cache.adopted as usize + 1 >= received, "{name}: what the client had is adopted: {cache:?}");
        assert!(cache.adopted < answer.usage.completion_tokens, "{name}: nothing was generated after it left");
        assert_eq!(cache.prefilled, 0, "{name}: nothing evaluated before the first token: {cache:?}");
    }
    let counts = settled_cache(&parking).parking;
    assert_eq!((counts.parked, counts.adopted, counts.discarded), (2, 2, 0), "{counts:?}");
}

/// Another request discards what a client that left was given (and is answered as it would be
/// alone); so does the park time.
#[test]
fn another_request_and_the_park_time_discard_a_left_reply() {
    let parking = engine(test_config(smollm2_path()));
    let left = request("Describe a lighthouse at night.", SamplingParams::greedy());
    leave_after(&parking, left.clone(), 8);
    let other = request("Describe a quiet harbour.", SamplingParams::greedy());
    let answer = generate(&parking, other.clone());
    assert_eq!(answer.timings.cache.adopted, 0, "another prompt: {:?}", answer.timings.cache);
    let again = generate(&parking, left.clone());
    assert_eq!(again.timings.cache.adopted, 0, "discarded by the other request: {:?}", again.timings.cache);
    let counts = settled_cache(&parking).parking;
    assert_eq!((counts.parked, counts.adopted, counts.discarded), (1, 0, 1), "{counts:?}");
    drop(parking);

    let expected = generate(&engine(test_config(smollm2_path())), other.clone());
    assert_eq!(outcome(&answer), outcome(&expected), "the other request is answered as alone");

    let expiring = engine(EngineConfig { park_for: Duration::from_nanos(1), ..test_config(smollm2_path()) });
    leave_after(&expiring, left.clone(), 8);
    let answer = generate(&expiring, left);
    assert_eq!(answer.timings.cache.adopted, 0, "parked longer than allowed: {:?}", answer.timings.cache);
    let counts = settled_cache(&expiring).parking;
    assert_eq!((counts.parked, counts.adopted, counts.discarded), (1, 0, 1), "{counts:?}");
}

/// Streams `body` to `path` and leaves after `chunks` SSE events.
async fn leave_stream(base: &str, path: &str, body: &Value, chunks: usize) {
    let mut body = body.clone();
    body["stream"] = json!(true);
    let mut response = reqwest::Client::new().post(format!("{base}{path}")).json(&body).send().await.expect("request");
    assert_eq!(response.status().as_u16(), 200);
    let mut received = String::new();
    while received.matches("data:").count() < chunks {
        let chunk = response.chunk().await.expect("chunk").expect("the stream goes on");
        received.push_str(&String::from_utf8_lossy(&chunk));
        assert!(!received.contains("[DONE]") && !received.contains("response.completed"), "ended: {received}");
    }
    drop(response);
}

fn server() -> TestServer {
    spawn_server(engine(test_config(smollm2_path())))
}

/// Over HTTP: a streamed chat completion (a required tool call) and a streamed response (plain
/// text) left after their first events, sent again without streaming. Each token is slowed a
/// little, so the reply is still going on when the server sees the client go.
#[tokio::test]
#[cfg_attr(not(feature = "failpoints"), ignore = "slows tokens at a failpoint: needs --features failpoints")]
async fn a_streamed_request_left_and_sent_again_is_adopted_over_http() {
    let _scenario = fail::FailScenario::setup();
    fail::cfg("engine::token", "sleep(15)").expect("failpoint");
    let tools = json!([{"type": "function", "function": {
        "name": "set_timer", "description": "Start a timer.",
        "parameters": {"type": "object", "properties": {"minutes": {"type": "integer"}, "label": {"type": "string"}},
            "required": ["minutes", "label"]},
    }}]);
    let call = json!({
        "messages": [{"role": "user", "content": "Set a timer for ten minutes for the pasta."}],
        "tools": tools, "tool_choice": "required", "parallel_tool_calls": false,
        "temperature": 0, "max_tokens": 48,
    });
    let alone = server();
    let (status, expected) = post(&alone.base, &call).await;
    assert_eq!(status, 200, "{expected}");
    let parking = server();
    // The role, the call's name, a piece of its arguments.
    leave_stream(&parking.base, "/v1/chat/completions", &call, 3).await;
    let (status, answer) = post(&parking.base, &call).await;
    assert_eq!(status, 200, "{answer}");
    eprintln!("adopted {answer}\nalone {expected}");
    let function = |a: &Value| a["choices"][0]["message"]["tool_calls"][0]["function"].clone();
    assert!(function(&expected)["name"] == "set_timer", "{expected}");
    assert_eq!(function(&answer), function(&expected), "adoption changed the call");
    assert_eq!(answer["usage"]["completion_tokens"], expected["usage"]["completion_tokens"]);
    let cache = &answer["timings"]["cache"];
    assert!(cache["adopted"].as_u64().unwrap_or(0) > 0, "{cache}");
    assert_eq!(cache["prefilled"], 0, "{cache}");

    let text = json!({"input": "Describe a lighthouse at night.", "temperature": 0, "max_output_tokens": 40});
    let (status, expected) = post_json(&alone.base, "/v1/responses", &text).await;
    assert_eq!(status, 200, "{expected}");
    // The response's opening events, then a few pieces of text.
    leave_stream(&parking.base, "/v1/responses", &text, 8).await;
    let (status, answer) = post_json(&parking.base, "/v1/responses", &text).await;
    assert_eq!(status, 200, "{answer}");
    let said = |a: &Value| a["output"][0]["content"][0]["text"].clone();
    assert!(said(&expected).is_string(), "{expected}");
    assert_eq!(said(&answer), said(&expected), "adoption changed the response");
    let usage = &answer["usage"];
    assert_eq!(usage["input_tokens_details"]["cached_tokens"], usage["input_tokens"], "all adopted: {usage}");

    let metrics = reqwest::get(format!("{}/metrics", parking.base)).await.expect("metrics");
    let metrics = metrics.text().await.expect("metrics text");
    for outcome in ["parked", "adopted"] {
        let line = format!("firstword_parked_generations_total{{outcome=\"{outcome}\"}} 2");
        assert!(metrics.lines().any(|l| l == line), "{line} in:\n{metrics}");
    }
}
