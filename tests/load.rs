//! Held load on a real server over SmolLM2, bounded in count and time, loopback only: 32
//! concurrent streaming clients, a storm of 200 streams dropped in the middle of their reply,
//! and a 300-turn conversation past the context limit (refused by default; with
//! `--context-overflow drop-oldest`, shortened by its oldest whole turns). The tests of this
//! file run one at a time: they measure the process's memory and the engine's timing.

mod common;

use std::sync::Mutex;
use std::time::{Duration, Instant};

use common::{smollm2_path, spawn_server, test_config, TestServer};
use firstword::engine::ContextOverflow;
use firstword::{Engine, EngineConfig};
use serde_json::{json, Value};

static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn server(config: EngineConfig) -> TestServer {
    spawn_server(Engine::start(config).expect("SmolLM2 loads"))
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Runtime::new().expect("runtime")
}

/// This process's resident memory in MiB (the server runs in it).
fn rss_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).expect("VmRSS");
    let kib: f64 = line.split_whitespace().nth(1).expect("value").parse().expect("number");
    kib / 1024.0
}

fn streamed(question: &str, max_tokens: u32) -> Value {
    json!({
        "messages": [
            {"role": "system", "content": "You are a concise assistant."},
            {"role": "user", "content": question},
        ],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": true,
    })
}

fn chat_url(base: &str) -> String {
    format!("{base}/v1/chat/completions")
}

/// Polls `/health` every 50 ms until `done`; returns the slowest answer and the count.
async fn watch_health(base: String, done: tokio::sync::watch::Receiver<bool>) -> (Duration, usize) {
    let client = reqwest::Client::new();
    let (mut slowest, mut polls) = (Duration::ZERO, 0);
    while !*done.borrow() {
        let started = Instant::now();
        let status = client.get(format!("{base}/health")).send().await.expect("GET /health").status();
        assert_eq!(status, 200);
        slowest = slowest.max(started.elapsed());
        polls += 1;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    (slowest, polls)
}

#[test]
fn thirty_two_streaming_clients_get_200_or_503_in_bounded_time_and_health_answers_throughout() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let server = server(test_config(smollm2_path()));
    let bound = Duration::from_secs(120);
    runtime().block_on(async {
        let (done_tx, done_rx) = tokio::sync::watch::channel(false);
        let health = tokio::spawn(watch_health(server.base.clone(), done_rx));
        let client = reqwest::Client::new();
        let clients = (0..32).map(|i| {
            let (client, url) = (client.clone(), chat_url(&server.base));
            tokio::spawn(async move {
                let started = Instant::now();
                let body = streamed(&format!("Give me fact number {i} about trains."), 8);
                let response = client.post(url).json(&body).send().await.expect("request");
                let status = response.status().as_u16();
                let retry_after = response.headers().contains_key("retry-after");
                let text = response.text().await.expect("body");
                (status, retry_after, text, started.elapsed())
            })
        });
        let results = futures_util::future::join_all(clients).await;
        done_tx.send(true).expect("stop watching");
        let (slowest_health, polls) = health.await.expect("health watcher");
        let mut served = 0;
        for result in results {
            let (status, retry_after, text, took) = result.expect("client");
            assert!(took < bound, "an answer took {took:?}");
            match status {
                200 => {
                    assert!(text.trim_end().ends_with("data: [DONE]"), "{text}");
                    assert!(!text.contains("\"error\""), "{text}");
                    served += 1;
                }
                503 => assert!(retry_after, "a 503 says when to retry"),
                other => panic!("status {other}: {text}"),
            }
        }
        // Refused at once when 8 bodies are being read or 16 requests wait behind the one
        // that generates; the rest are served.
        assert!(served >= 1, "served {served}");
        println!("32 clients: {served} served, the rest 503; /health polled {polls} times, slowest {slowest_health:?}");
        assert!(polls > 5, "health was polled throughout");
        assert!(slowest_health <= Duration::from_millis(100), "slowest /health {slowest_health:?}");
    });
}

#[test]
fn a_storm_of_200_dropped_streams_frees_the_engine_each_time_and_memory_returns() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let server = server(test_config(smollm2_path()));
    runtime().block_on(async {
        let client = reqwest::Client::new();
        // One token's time on this machine, from a reply that runs to its limit.
        let (status, reply) = common::post(
            &server.base,
            &json!({"messages": [{"role": "user", "content": "Count to fifty."}], "max_tokens": 32,
                    "temperature": 0}),
        )
        .await;
        assert_eq!(status, 200, "{reply}");
        let token_ms = reply["timings"]["predicted_per_token_ms"].as_f64().expect("per-token time");
        let before = rss_mib();
        let mut free_after = Vec::with_capacity(200);
        for i in 0..200 {
            let body = streamed(&format!("Tell me a long story about river number {i}."), 400);
            let mut response = client.post(chat_url(&server.base)).json(&body).send().await.expect("request");
            assert_eq!(response.status(), 200);
            // Read until the reply's text has begun, then hang up.
            let mut seen = String::new();
            while !seen.contains("\"content\"") {
                let chunk = response.chunk().await.expect("chunk").expect("the stream goes on");
                seen.push_str(&String::from_utf8_lossy(&chunk));
            }
            drop(response);
            let dropped = Instant::now();
            while server.engine.load().busy {
                assert!(dropped.elapsed() < Duration::from_secs(10), "the engine stayed busy");
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            free_after.push(dropped.elapsed());
        }
        free_after.sort();
        let median = free_after[100];
        let slowest = free_after[199];
        let after = rss_mib();
        println!(
            "200 dropped streams: engine free after a median {median:?}, slowest {slowest:?} (one token: {token_ms:.1} ms); RSS {before:.0} -> {after:.0} MiB"
        );
        // The engine sees the hang-up at its next token: the write of the token after it.
        let token = Duration::from_secs_f64(token_ms / 1e3);
        assert!(median <= token * 2 + Duration::from_millis(20), "median {median:?}, token {token:?}");
        assert!(slowest <= token * 10 + Duration::from_millis(200), "slowest {slowest:?}, token {token:?}");
        assert!((after - before).abs() <= before * 0.05, "RSS {before:.0} -> {after:.0} MiB");
        // And it serves as before.
        let (status, body) = common::post(&server.base, &json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4})).await;
        assert_eq!(status, 200, "{body}");
    });
}

/// The `n`-th user turn of the long conversation.
fn user_turn(n: usize) -> Value {
    json!({"role": "user", "content": format!("Turn {n}: one more river animal?")})
}

const SYSTEM: &str = "You are a concise assistant for a long-running chat. Answer in a few words.";

/// A conversation that opens with a tool call and its result, then plain turns.
fn opening() -> Vec<Value> {
    vec![
        json!({"role": "system", "content": SYSTEM}),
        json!({"role": "user", "content": "What is the weather in Paris?"}),
        json!({"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
               "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}]}),
        json!({"role": "tool", "tool_call_id": "call_1", "content": "{\"sky\":\"sunny\",\"celsius\":21}"}),
        json!({"role": "assistant", "content": "It is sunny and 21 °C in Paris."}),
    ]
}

fn long_chat(messages: &[Value]) -> Value {
    json!({"messages": messages, "max_tokens": 4, "temperature": 0, "tools": [{"type": "function", "function": {
        "name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]})
}

#[test]
fn a_300_turn_conversation_is_refused_at_the_limit_or_shortened_by_whole_turns_with_flat_memory() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let small =
        |overflow| EngineConfig { ctx_size: Some(768), context_overflow: overflow, ..test_config(smollm2_path()) };
    let rt = runtime();

    // By default: a clear 400 naming both counts once the conversation outgrows the context.
    let refusing = server(small(ContextOverflow::Refuse));
    rt.block_on(async {
        let mut messages = opening();
        for n in 1..=300 {
            messages.push(user_turn(n));
            let (status, body) = common::post(&refusing.base, &long_chat(&messages)).await;
            if status == 400 {
                assert_eq!(body["error"]["code"], "context_length_exceeded", "{body}");
                let message = body["error"]["message"].as_str().expect("message");
                assert!(message.contains("the context holds 768"), "{message}");
                assert!(message.contains("in the prompt"), "{message}");
                assert!(n > 10, "the conversation fit for a while ({n} turns)");
                return;
            }
            assert_eq!(status, 200, "{body}");
            messages.push(json!({"role": "assistant", "content": body["choices"][0]["message"]["content"]}));
        }
        panic!("300 turns never outgrew a 768-token context");
    });
    drop(refusing);

    // drop-oldest: all 300 turns served; the oldest whole turns go, the system prompt stays.
    let shortening = server(small(ContextOverflow::DropOldest));
    rt.block_on(async {
        let mut messages = opening();
        // Where whole turns end, in messages after the system prompt: the tool turn is 4.
        let mut boundaries = vec![4];
        let mut dropped_counts = Vec::new();
        let mut shortenings = 0;
        let (mut cached_turns, mut rss_at_100) = (0, 0.0);
        let started = Instant::now();
        for n in 1..=300 {
            messages.push(user_turn(n));
            let (status, body) = common::post(&shortening.base, &long_chat(&messages)).await;
            assert_eq!(status, 200, "turn {n}: {body}");
            let usage = &body["usage"];
            let prompt_tokens = usage["prompt_tokens"].as_u64().expect("prompt_tokens");
            assert!(prompt_tokens + 4 <= 768, "turn {n}: {prompt_tokens}");
            let dropped = body["timings"]["dropped_messages"].as_u64().unwrap_or(0) as usize;
            if dropped > dropped_counts.last().copied().unwrap_or(0) {
                shortenings += 1;
            }
            if dropped > 0 {
                assert!(boundaries.contains(&dropped), "turn {n}: {dropped} messages is not a whole number of turns");
                dropped_counts.push(dropped);
            }
            let reused = body["timings"]["cache"]["reused"].as_u64().expect("reused");
            // The system prompt and the tool definitions lead every prompt: at least they
            // are reused, whatever was left out after them.
            assert!(n == 1 || reused >= 40, "turn {n}: reused {reused}");
            if usage["prompt_tokens_details"]["cached_tokens"].as_u64() > Some(prompt_tokens / 2) {
                cached_turns += 1;
            }
            let reply = body["choices"][0]["message"]["content"].clone();
            messages.push(json!({"role": "assistant", "content": reply}));
            boundaries.push(boundaries.last().expect("one") + 2);
            if n == 100 {
                rss_at_100 = rss_mib();
            }
        }
        let rss_at_300 = rss_mib();
        assert!(!dropped_counts.is_empty(), "300 turns outgrew the context");
        assert!(dropped_counts.windows(2).all(|w| w[0] <= w[1]), "{dropped_counts:?}");
        // The same turns are left out again while they fit, so most turns continue the cache.
        assert!(cached_turns >= 240, "only {cached_turns} of 300 turns continued the cache");
        println!(
            "300 turns in {:?}: {} shortened, {shortenings} times further, {cached_turns} mostly cached, RSS {rss_at_100:.0} MiB at turn 100, {rss_at_300:.0} at 300",
            started.elapsed(),
            dropped_counts.len(),
        );
        assert!(rss_at_300 <= rss_at_100 * 1.05, "RSS {rss_at_100:.0} -> {rss_at_300:.0} MiB");
    });
}
