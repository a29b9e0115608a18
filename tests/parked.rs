//! Parked generations: `/v1/prefill` with `pregenerate` generates the reply's first tokens
//! after the prompt, with the request's own sampling, and parks them; the chat request that
//! follows with the same prompt adopts them (`timings.cache.adopted`) and its answer is the one
//! it would have produced alone: greedy, sampled with a seed, a required tool call and a JSON
//! reply, each compared with a fresh server answering the request directly (prompts shorter
//! than a prefill chunk, so both evaluate them in one batch). A request that differs, a newer
//! prefill and the park time discard the parked tokens; a hostile `pregenerate` is a 400.

mod common;

use std::time::Duration;

use common::{post, smollm2_path, spawn_server, test_config, until, Hold, TestServer};
use fail::FailScenario;
use firstword::{Engine, EngineConfig};
use serde_json::{json, Value};

fn server(config: EngineConfig) -> TestServer {
    spawn_server(Engine::start(config).expect("SmolLM2 loads"))
}

/// Posts `body` to `/v1/prefill`; returns the status and the JSON answer.
async fn prefill(base: &str, body: &Value) -> (u16, Value) {
    let response = reqwest::Client::new().post(format!("{base}/v1/prefill")).json(body).send().await.expect("request");
    let status = response.status().as_u16();
    (status, response.json().await.expect("JSON body"))
}

/// A short conversation (one prefill chunk) with `extra` fields.
fn body(question: &str, extra: Value) -> Value {
    let mut body = json!({
        "messages": [
            {"role": "system", "content": "You are a helpful home assistant."},
            {"role": "user", "content": question},
        ],
        "max_tokens": 24,
    });
    for (key, value) in extra.as_object().expect("an object") {
        body[key] = value.clone();
    }
    body
}

/// The answer's message and finish reason, what must not change with adoption.
fn outcome(answer: &Value) -> (Value, Value, Value) {
    let choice = &answer["choices"][0];
    (choice["message"].clone(), choice["finish_reason"].clone(), answer["usage"]["completion_tokens"].clone())
}

/// Prefills `request` with `pregenerate` on a fresh server, sends it, and compares the answer
/// with a fresh server's answer to the request alone; returns how many tokens were adopted.
async fn adopted_equals_alone(name: &str, request: &Value, pregenerate: u32) -> u64 {
    let alone = server(test_config(smollm2_path()));
    let (status, expected) = post(&alone.base, request).await;
    assert_eq!(status, 200, "{name}: {expected}");
    drop(alone);

    let parking = server(test_config(smollm2_path()));
    let mut ahead = request.clone();
    ahead["pregenerate"] = json!(pregenerate);
    let (status, report) = prefill(&parking.base, &ahead).await;
    assert_eq!(status, 200, "{name}: {report}");
    assert!(report["pregenerated_tokens"].as_u64().expect("pregenerated_tokens") > 0, "{name}: {report}");
    let (status, answer) = post(&parking.base, request).await;
    assert_eq!(status, 200, "{name}: {answer}");
    eprintln!("{name}: prefill {report}\nadopted answer {answer}\nalone {expected}");
    assert_eq!(outcome(&answer), outcome(&expected), "{name}: adoption changed the answer");
    let cache = &answer["timings"]["cache"];
    assert_eq!(cache["prefilled"], 0, "{name}: nothing evaluated before the first token: {cache}");
    cache["adopted"].as_u64().unwrap_or(0)
}

#[tokio::test]
async fn an_adopted_reply_equals_the_request_alone() {
    let greedy = body("Name three colours of the rainbow.", json!({"temperature": 0}));
    let adopted = adopted_equals_alone("greedy", &greedy, 16).await;
    assert_eq!(adopted, 16, "the request's own greedy picks are the parked ones");

    let sampled = body("Tell me something about the sea.", json!({"temperature": 0.8, "seed": 7}));
    let adopted = adopted_equals_alone("seeded temperature 0.8", &sampled, 16).await;
    assert_eq!(adopted, 16, "the same seed draws the same tokens");

    let tools = json!([{"type": "function", "function": {
        "name": "set_timer", "description": "Start a timer.",
        "parameters": {"type": "object", "properties": {"minutes": {"type": "integer"}}, "required": ["minutes"]},
    }}]);
    let call = body(
        "Set a timer for ten minutes.",
        json!({"temperature": 0, "tools": tools, "tool_choice": "required", "parallel_tool_calls": false}),
    );
    let adopted = adopted_equals_alone("required tool call", &call, 8).await;
    assert_eq!(adopted, 8);

    // A short answer ends inside the parked tokens: all of it is adopted, its end included.
    let short = body("Answer with one word: is the sky blue?", json!({"temperature": 0, "max_tokens": 64}));
    let adopted = adopted_equals_alone("an answer that ends while parked", &short, 64).await;
    assert!(adopted > 0, "the whole short answer is adopted");

    let schema = json!({"type": "json_schema", "json_schema": {"name": "room", "schema": {
        "type": "object", "properties": {"room": {"type": "string"}}, "required": ["room"],
    }}});
    let json_reply = body("Which room is the oven in?", json!({"temperature": 0, "response_format": schema}));
    let adopted = adopted_equals_alone("response_format", &json_reply, 8).await;
    assert_eq!(adopted, 8);
}

/// The same prompt with other sampling: the request's sampler picks from the parked logits
/// and parts ways where it picks otherwise; the answer is still the one it gives alone.
#[tokio::test]
async fn a_request_with_other_sampling_takes_only_what_it_picks_itself() {
    let greedy = body("Describe a quiet morning.", json!({"temperature": 0}));
    let sampled = body("Describe a quiet morning.", json!({"temperature": 1.5, "seed": 3}));
    let alone = server(test_config(smollm2_path()));
    let (_, expected) = post(&alone.base, &sampled).await;
    drop(alone);
    let parking = server(test_config(smollm2_path()));
    let mut ahead = greedy.clone();
    ahead["pregenerate"] = json!(16);
    let (status, report) = prefill(&parking.base, &ahead).await;
    assert_eq!(status, 200, "{report}");
    let (status, answer) = post(&parking.base, &sampled).await;
    assert_eq!(status, 200, "{answer}");
    eprintln!("parked greedy {report}\nsampled {answer}\nalone {expected}");
    assert_eq!(outcome(&answer), outcome(&expected));
    let adopted = answer["timings"]["cache"]["adopted"].as_u64().unwrap_or(0);
    assert!(adopted < 16, "a hot sampler parts ways with greedy picks: {adopted}");
}

/// A newer prefill, a request for another prompt and the park time each discard the parked
/// tokens; the request is then served as usual.
#[tokio::test]
async fn parked_tokens_go_with_a_newer_prefill_another_prompt_and_time() {
    let request = body("What is the capital of France?", json!({"temperature": 0}));
    let mut ahead = request.clone();
    ahead["pregenerate"] = json!(16);
    let mut plain = request.clone();
    plain["pregenerate"] = json!(0);

    let parking = server(test_config(smollm2_path()));
    prefill(&parking.base, &ahead).await;
    let (_, report) = prefill(&parking.base, &plain).await;
    assert_eq!(report["pregenerated_tokens"], 0, "{report}");
    let (_, answer) = post(&parking.base, &request).await;
    assert!(answer["timings"]["cache"]["adopted"].is_null(), "a newer prefill discarded them: {answer}");

    prefill(&parking.base, &ahead).await;
    let other = body("What is the capital of Spain?", json!({"temperature": 0}));
    let (_, answer) = post(&parking.base, &other).await;
    assert!(answer["timings"]["cache"]["adopted"].is_null(), "another prompt: {answer}");
    drop(parking);

    let expiring = server(EngineConfig { park_for: Duration::ZERO, ..test_config(smollm2_path()) });
    prefill(&expiring.base, &ahead).await;
    let (_, answer) = post(&expiring.base, &request).await;
    assert!(answer["timings"]["cache"]["adopted"].is_null(), "parked longer than allowed: {answer}");
}

#[tokio::test]
async fn a_hostile_pregenerate_is_refused() {
    let parking = server(test_config(smollm2_path()));
    for value in [json!(-1), json!(100_000), json!("many"), json!(1.5)] {
        let mut ahead = body("Hi", json!({}));
        ahead["pregenerate"] = value.clone();
        let (status, answer) = prefill(&parking.base, &ahead).await;
        assert_eq!(status, 400, "{value}: {answer}");
        assert!(answer["error"]["message"].as_str().expect("message").contains("pregenerate"), "{answer}");
    }
    let health = reqwest::get(format!("{}/health", parking.base)).await.expect("health").status();
    assert_eq!(health, 200);
}

/// Generating ahead yields to a request that waits: held before its next token while a chat
/// request queues, it stops there, parks what it has, and the request is served.
#[tokio::test]
#[cfg_attr(not(feature = "failpoints"), ignore = "holds the engine at a failpoint: needs --features failpoints")]
async fn generating_ahead_stops_for_a_waiting_request() {
    let _scenario = FailScenario::setup();
    let parking = server(test_config(smollm2_path()));
    let mut ahead = body("Tell me a long story about a lighthouse.", json!({"temperature": 0}));
    ahead["pregenerate"] = json!(200);
    let hold = Hold::at("engine::pregenerate");
    let base = parking.base.clone();
    let running = tokio::spawn(async move { prefill(&base, &ahead).await });
    hold.reached().await;
    let base = parking.base.clone();
    let other = body("What time is it?", json!({"temperature": 0}));
    let chat = tokio::spawn(async move { post(&base, &other).await });
    until(&parking.engine, "the chat request is queued", |engine| engine.load().waiting == 1).await;
    hold.release();
    let (status, report) = running.await.expect("prefill task");
    assert_eq!(status, 200, "{report}");
    assert_eq!(report["pregenerated_tokens"], 0, "it stopped at its next token: {report}");
    let (status, answer) = chat.await.expect("chat task");
    assert_eq!(status, 200, "{answer}");
    assert!(answer["timings"]["cache"]["adopted"].is_null(), "{answer}");
}
