//! `GET /metrics`, scraped after known requests and parsed with Prometheus's own Python parser
//! (`prometheus_client`, pinned in the tests' venv): the counts equal what the responses said.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::python::{run_with_timeout, sdk_python};
use common::{long_system_prompt, post, smollm2_path, spawn_server, stream_chunks, test_config};
use firstword::Engine;
use serde_json::{json, Value};

/// The samples of a scrape: (name, labels, value).
fn parse(python: &Path, root: &Path, scrape: &str) -> Vec<(String, Value, f64)> {
    // A name of its own per scrape: the tests run side by side.
    static SCRAPES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = SCRAPES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let file = std::env::temp_dir().join(format!("firstword-metrics-{}-{n}.txt", std::process::id()));
    std::fs::write(&file, scrape).expect("write the scrape");
    let mut command = Command::new(python);
    command.arg(root.join("tests/sdk/parse_metrics.py")).arg(&file);
    let (status, stdout, stderr) = run_with_timeout(command, Duration::from_secs(60));
    let _ = std::fs::remove_file(&file);
    assert!(status.is_some_and(|s| s.success()), "the Prometheus parser refused the scrape: {stderr}\n{scrape}");
    let samples: Vec<Value> = serde_json::from_str(&stdout).expect("JSON samples");
    samples
        .into_iter()
        .map(|s| {
            (
                s["name"].as_str().unwrap_or_default().to_string(),
                s["labels"].clone(),
                s["value"].as_f64().unwrap_or(f64::NAN),
            )
        })
        .collect()
}

/// The value of sample `name` whose labels include `labels` (0 if absent).
fn value(samples: &[(String, Value, f64)], name: &str, labels: &[(&str, &str)]) -> f64 {
    samples.iter().filter(|(n, l, _)| n == name && labels.iter().all(|(k, v)| l[*k] == *v)).map(|(_, _, v)| *v).sum()
}

/// Scrapes `/metrics` (OpenMetrics text) until `done` says the samples hold what the test
/// waits for, or for 10 s: a response's line is counted as its body ends, after the client
/// may already have it.
async fn scrape_until(
    base: &str,
    python: &Path,
    done: impl Fn(&[(String, Value, f64)]) -> bool,
) -> (String, Vec<(String, Value, f64)>) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let response = reqwest::get(format!("{base}/metrics")).await.expect("GET /metrics");
        assert_eq!(response.status(), 200);
        let content_type = response.headers()["content-type"].to_str().expect("ASCII").to_string();
        assert!(content_type.starts_with("application/openmetrics-text"), "{content_type}");
        let scrape = response.text().await.expect("text");
        let samples = parse(python, root, &scrape);
        if done(&samples) || Instant::now() > deadline {
            return (scrape, samples);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn usage(answer: &Value) -> (f64, f64, f64) {
    let usage = &answer["usage"];
    let number = |v: &Value| v.as_f64().expect("a count");
    (
        number(&usage["prompt_tokens"]),
        number(&usage["prompt_tokens_details"]["cached_tokens"]),
        number(&usage["completion_tokens"]),
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn the_metrics_count_what_the_responses_said() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let python = sdk_python(root);
    let server = spawn_server(Engine::start(test_config(smollm2_path())).expect("the model loads"));
    let base = server.base.clone();
    let system = long_system_prompt(300);
    let mut messages = vec![
        json!({"role": "system", "content": system}),
        json!({"role": "user", "content": "Which facts mention trains?"}),
    ];
    let (status, first) = post(&base, &json!({"messages": messages, "max_tokens": 8, "temperature": 0})).await;
    assert_eq!(status, 200, "{first}");
    messages.push(first["choices"][0]["message"].clone());
    messages.push(json!({"role": "user", "content": "And gardens?"}));
    let body =
        json!({"messages": messages, "max_tokens": 8, "temperature": 0, "stream_options": {"include_usage": true}});
    let chunks = stream_chunks(&base, &body).await;
    let second = chunks.iter().rev().find(|c| c["usage"].is_object()).expect("a usage chunk").clone();
    let (status, bad) = post(&base, &json!({"messages": "not a list"})).await;
    assert_eq!(status, 400, "{bad}");
    let code = bad["error"]["code"].as_str().expect("a code").to_string();
    let prefill_body =
        json!({"messages": [{"role": "system", "content": system}, {"role": "user", "content": "Which facts"}]});
    let prefill: Value = reqwest::Client::new()
        .post(format!("{base}/v1/prefill"))
        .json(&prefill_body)
        .send()
        .await
        .expect("prefill")
        .json()
        .await
        .expect("JSON");

    // The engine idle (the upkeep after the last request done), then the last response's line
    // is counted as its body ends: scrape until it is in.
    let engine = server.engine.clone();
    tokio::task::spawn_blocking(move || engine.wait_idle_blocking()).await.expect("idle");
    let (scrape, samples) = scrape_until(&base, &python, |samples| {
        value(samples, "firstword_requests_total", &[("route", "/v1/prefill")]) >= 1.0
    })
    .await;
    let get = |name: &str, labels: &[(&str, &str)]| value(&samples, name, labels);
    let chat = "/v1/chat/completions";
    assert_eq!(get("firstword_requests_total", &[("route", chat), ("status", "200")]), 2.0, "{scrape}");
    assert_eq!(get("firstword_requests_total", &[("route", chat), ("status", "400")]), 1.0, "{scrape}");
    assert_eq!(get("firstword_requests_total", &[("route", "/v1/prefill"), ("status", "200")]), 1.0, "{scrape}");
    assert_eq!(get("firstword_errors_total", &[("code", &code)]), 1.0, "{scrape}");
    assert_eq!(get("firstword_ttft_seconds_count", &[]), 2.0, "two requests generated: {scrape}");

    let (p1, c1, g1) = usage(&first);
    let (p2, c2, g2) = usage(&second);
    let (p3, c3) =
        (prefill["prompt_tokens"].as_f64().expect("count"), prefill["cached_tokens"].as_f64().expect("count"));
    assert_eq!(get("firstword_generated_tokens_total", &[]), g1 + g2, "{scrape}");
    assert_eq!(get("firstword_prompt_tokens_reused_total", &[]), c1 + c2 + c3, "{scrape}");
    assert_eq!(get("firstword_prompt_tokens_reused_total", &[("source", "live")]), c1 + c2 + c3, "{scrape}");
    assert_eq!(get("firstword_prompt_tokens_evaluated_total", &[]), (p1 - c1) + (p2 - c2) + (p3 - c3), "{scrape}");
    assert!(c2 > 300.0, "turn 2 was cached: {second}");
    assert!(get("firstword_generation_seconds_total", &[]) > 0.0, "{scrape}");

    let cache: Value = reqwest::get(format!("{base}/cache")).await.expect("GET /cache").json().await.expect("JSON");
    assert_eq!(get("firstword_live_tokens", &[]), cache["live_tokens"].as_f64().expect("count"), "{scrape}");
    assert_eq!(
        get("firstword_cache_entries", &[("store", "ram")]),
        cache["entries"].as_array().map_or(0, Vec::len) as f64
    );
    assert_eq!(
        get("firstword_cache_budget_bytes", &[("store", "ram")]),
        cache["budget_bytes"].as_f64().expect("bytes")
    );
    assert_eq!(get("firstword_engine_busy", &[]), 0.0, "idle between requests: {scrape}");
    assert_eq!(get("firstword_queue_depth", &[]), 0.0, "{scrape}");
}

/// `firstword_disk_bytes_written_total` counts what the disk cache wrote: over a conversation's
/// two turns, the bytes of its file (a base, then turn 2 appended as a delta). The counter is
/// live: turn 2 is written after its reply, once the engine is idle, and a scrape with no
/// request after it sees it.
#[tokio::test(flavor = "multi_thread")]
async fn the_disk_bytes_written_are_the_bytes_of_the_conversation_s_file() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let python = sdk_python(root);
    let dir = std::env::temp_dir().join(format!("firstword-metrics-disk-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let config =
        firstword::EngineConfig { cache_dir: Some(dir.clone()), cache_min_tokens: 32, ..test_config(smollm2_path()) };
    let server = spawn_server(Engine::start(config).expect("the model loads"));
    let mut messages = vec![
        json!({"role": "system", "content": long_system_prompt(300)}),
        json!({"role": "user", "content": "Which facts mention trains?"}),
    ];
    for (turn, next) in ["And gardens?", ""].into_iter().enumerate() {
        let (status, answer) =
            post(&server.base, &json!({"messages": messages, "max_tokens": 8, "temperature": 0})).await;
        assert_eq!(status, 200, "{answer}");
        messages.push(answer["choices"][0]["message"].clone());
        messages.push(json!({"role": "user", "content": next}));
        if turn == 0 {
            // Turn 1 written before turn 2 comes (a turn still waiting to be written when the
            // next comes is written in its place).
            let engine = server.engine.clone();
            tokio::task::spawn_blocking(move || engine.wait_idle_blocking()).await.expect("idle");
        }
    }
    // Turn 2's delta is appended on its own once the engine has been idle a moment; the
    // counter follows the writer, not the status published at the end of the request.
    let file = || {
        let mut files = Vec::new();
        for model in std::fs::read_dir(&dir).expect("cache dir").flatten() {
            let entries = std::fs::read_dir(model.path()).expect("model dir").flatten().map(|file| file.path());
            files.extend(entries.filter(|path| path.extension().is_some_and(|e| e == "fwkv")));
        }
        assert_eq!(files.len(), 1, "one file for the conversation: {files:?}");
        std::fs::read(&files[0]).expect("read")
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let scrape = reqwest::get(format!("{}/metrics", server.base)).await.expect("GET /metrics");
        let scrape = scrape.text().await.expect("text");
        let written = value(&parse(&python, root, &scrape), "firstword_disk_bytes_written_total", &[]);
        let bytes = file();
        if bytes.windows(4).any(|w| w == b"FWKD") && written == bytes.len() as f64 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "turn 2 appended and counted: {written} of {}", bytes.len());
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Lanes on `/metrics`: a request sent while a reply streams is served in a lane
/// (`firstword_lane_requests_total`), and both replies count in `firstword_replies_beside` as
/// having shared steps with one other; once both ended no lane runs.
#[tokio::test(flavor = "multi_thread")]
async fn a_request_served_beside_a_streaming_reply_counts_as_a_lane() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let python = sdk_python(root);
    let server = spawn_server(Engine::start(test_config(smollm2_path())).expect("the model loads"));
    let base = server.base.clone();
    let client = reqwest::Client::new();
    // The story cannot end early: its end-of-turn tokens are banned.
    let mut banned = serde_json::Map::new();
    for marker in ["<|im_end|>", "<|endoftext|>"] {
        let tokens: Value = client
            .post(format!("{base}/tokenize"))
            .json(&json!({"content": marker}))
            .send()
            .await
            .expect("tokenize")
            .json()
            .await
            .expect("JSON");
        banned.insert(tokens["tokens"][0].to_string(), json!(-100));
    }
    let story = json!({"messages": [{"role": "user", "content": "Tell me a long story about a dragon."}],
        "max_tokens": 120, "temperature": 0, "stream": true, "logit_bias": banned});
    let mut streaming = client.post(format!("{base}/v1/chat/completions")).json(&story).send().await.expect("story");
    let mut received = String::new();
    while received.matches("\"content\":\"").count() < 8 {
        let chunk = streaming.chunk().await.expect("chunk").expect("the story streams");
        received.push_str(&String::from_utf8_lossy(&chunk));
    }
    let (status, beside) =
        post(&base, &json!({"messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 8, "temperature": 0}))
            .await;
    assert_eq!(status, 200, "{beside}");
    assert!(beside["timings"]["shared"]["sequence"].as_u64().is_some_and(|s| s > 0), "served in a lane: {beside}");
    while let Some(chunk) = streaming.chunk().await.expect("chunk") {
        received.push_str(&String::from_utf8_lossy(&chunk));
    }
    assert!(received.contains("[DONE]"), "{received}");

    let engine = server.engine.clone();
    tokio::task::spawn_blocking(move || engine.wait_idle_blocking()).await.expect("idle");
    let (scrape, samples) =
        scrape_until(&base, &python, |samples| value(samples, "firstword_replies_beside_count", &[]) >= 2.0).await;
    let get = |name: &str, labels: &[(&str, &str)]| value(&samples, name, labels);
    assert_eq!(get("firstword_lane_requests_total", &[]), 1.0, "{scrape}");
    assert_eq!(get("firstword_lanes_running", &[]), 0.0, "{scrape}");
    assert_eq!(get("firstword_replies_beside_count", &[]), 2.0, "{scrape}");
    assert_eq!(get("firstword_replies_beside_bucket", &[("le", "0.0")]), 0.0, "neither ran alone: {scrape}");
    assert_eq!(get("firstword_replies_beside_bucket", &[("le", "1.0")]), 2.0, "each beside the other: {scrape}");
}
