//! The router over a scripted engine, request to response with `oneshot`: routing and method
//! envelopes, body errors, refusals before the body is read, and both kinds of answer.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use axum::body::Body;
use axum::http::{header, Method, Request, StatusCode};
use axum::response::Response;
use serde_json::{json, Value};
use tower::ServiceExt;

use super::fake::FakeEngine;
use super::{call_text, finished, CACHE, USAGE};
use crate::api::backend::Backend;
use crate::api::{router_with, ServeOptions};
use crate::engine::{
    CacheEntryKind, CacheEntryStatus, CacheStatus, DiskStatus, EngineError, Event, FinishReason, PrefillReport, Timings,
};

pub(super) fn request(method: Method, path: &str, content_type: &str, body: Body) -> Request<Body> {
    Request::builder()
        .method(method)
        .uri(path)
        .header(header::CONTENT_TYPE, content_type)
        .body(body)
        .expect("a request")
}

pub(super) async fn send(engine: &Arc<FakeEngine>, request: Request<Body>) -> Response {
    let engine: Arc<dyn Backend> = Arc::clone(engine) as _;
    router_with(engine, &ServeOptions::default()).oneshot(request).await.expect("infallible")
}

pub(super) async fn text_of(response: Response) -> String {
    let bytes = axum::body::to_bytes(response.into_body(), usize::MAX).await.expect("the body");
    String::from_utf8(bytes.to_vec()).expect("UTF-8")
}

/// Status and JSON body of `method path` with `body`.
pub(super) async fn call(
    engine: &Arc<FakeEngine>,
    method: Method,
    path: &str,
    body: impl Into<Body>,
) -> (StatusCode, Value) {
    let response = send(engine, request(method, path, "application/json", body.into())).await;
    let status = response.status();
    let text = text_of(response).await;
    (status, serde_json::from_str(&text).unwrap_or_else(|e| panic!("{text}: {e}")))
}

async fn chat(engine: &Arc<FakeEngine>, body: &Value) -> (StatusCode, Value) {
    let response = send(engine, post_chat(body.to_string())).await;
    let status = response.status();
    (status, serde_json::from_str(&text_of(response).await).expect("JSON"))
}

fn post_chat(body: impl Into<Body>) -> Request<Body> {
    request(Method::POST, "/v1/chat/completions", "application/json", body.into())
}

fn hi() -> Value {
    json!({"messages": [{"role": "user", "content": "hi"}]})
}

pub(super) fn replying(texts: &[&str], reason: FinishReason) -> Arc<FakeEngine> {
    let mut script = vec![Event::Started { prompt_tokens: 10, cached_tokens: 4, in_reasoning: false }];
    script.extend(texts.iter().map(|t| Event::Text((*t).to_string())));
    script.push(finished(reason));
    Arc::new(FakeEngine::answering(script))
}

fn assert_error(case: &str, (status, body): &(StatusCode, Value), expected: StatusCode, code: Option<&str>) {
    assert_eq!(*status, expected, "{case}: {body}");
    assert_eq!(body["error"]["code"], code.map_or(Value::Null, Value::from), "{case}: {body}");
    assert!(body["error"]["message"].as_str().is_some_and(|m| !m.is_empty()), "{case}: {body}");
}

#[tokio::test]
async fn unknown_paths_and_wrong_methods_get_envelopes() {
    let engine = replying(&[], FinishReason::Stop);
    let missing = call(&engine, Method::POST, "/v1/nothing", "{}").await;
    assert_error("unknown endpoint", &missing, StatusCode::NOT_FOUND, Some("not_found"));
    assert_eq!(missing.1["error"]["type"], "not_found_error");
    let wrong = call(&engine, Method::GET, "/v1/chat/completions", Body::empty()).await;
    assert_error("wrong method", &wrong, StatusCode::METHOD_NOT_ALLOWED, None);
    assert!(engine.submitted.lock().is_empty());
}

#[tokio::test]
async fn malformed_bodies_get_a_400_envelope_and_reach_no_engine() {
    let engine = replying(&["never"], FinishReason::Stop);
    for (case, body) in [("cut JSON", "{\"messages\": ["), ("empty", ""), ("not an object", "[1, 2]")] {
        let answer = call(&engine, Method::POST, "/v1/chat/completions", body).await;
        assert_error(case, &answer, StatusCode::BAD_REQUEST, Some("invalid_json"));
    }
    let answer = chat(&engine, &json!({"messages": [{"role": "user", "content": "hi"}], "temperature": 9})).await;
    assert_error("temperature 9", &answer, StatusCode::BAD_REQUEST, None);
    assert_eq!(answer.1["error"]["param"], "temperature");
    assert!(engine.submitted.lock().is_empty());
}

#[tokio::test]
async fn the_content_type_is_not_checked() {
    let engine = replying(&["Hi"], FinishReason::Stop);
    let plain = request(Method::POST, "/chat/completions", "text/plain", Body::from(hi().to_string()));
    let response = send(&engine, plain).await;
    assert_eq!(response.status(), StatusCode::OK, "read as JSON like any body");
    assert_eq!(engine.submitted.lock().len(), 1);
}

#[tokio::test]
async fn a_full_queue_gets_503_before_the_body_is_read() {
    let engine = Arc::new(FakeEngine::without_room(EngineError::QueueFull { capacity: 4 }));
    // Not even valid JSON: the refusal comes first.
    let response = send(&engine, post_chat("{")).await;
    assert_eq!(response.headers()[header::RETRY_AFTER], "1");
    let answer = (response.status(), serde_json::from_str(&text_of(response).await).expect("JSON"));
    assert_error("queue full", &answer, StatusCode::SERVICE_UNAVAILABLE, Some("queue_full"));
    assert_eq!(answer.1["error"]["type"], "unavailable_error");
}

#[tokio::test]
async fn a_loading_model_gets_503_on_chat_models_and_health() {
    let engine = Arc::new(FakeEngine::without_model(EngineError::Loading));
    assert_error("chat", &chat(&engine, &hi()).await, StatusCode::SERVICE_UNAVAILABLE, Some("model_loading"));
    for path in ["/v1/models", "/health"] {
        let answer = call(&engine, Method::GET, path, Body::empty()).await;
        assert_error(path, &answer, StatusCode::SERVICE_UNAVAILABLE, Some("model_loading"));
    }
}

#[tokio::test]
async fn health_and_models_describe_the_loaded_model() {
    let engine = replying(&[], FinishReason::Stop);
    let (status, health) = call(&engine, Method::GET, "/health", Body::empty()).await;
    assert_eq!((status, health), (StatusCode::OK, json!({"status": "ok"})));
    let (status, models) = call(&engine, Method::GET, "/models", Body::empty()).await;
    assert_eq!(status, StatusCode::OK);
    let card = &models["data"][0];
    assert_eq!((&card["id"], &card["object"]), (&"test-model".into(), &"model".into()));
    assert_eq!((&card["meta"]["n_ctx"], &card["meta"]["tool_format"]), (&4096.into(), &"json".into()));
}

#[tokio::test]
async fn a_non_streaming_answer_has_its_text_usage_and_finish_reason() {
    let engine = replying(&["Hel", "lo"], FinishReason::Stop);
    let (status, answer) = chat(&engine, &hi()).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!(answer["object"], "chat.completion");
    assert!(answer["id"].as_str().is_some_and(|id| id.starts_with("chatcmpl-")), "{answer}");
    assert_eq!(answer["choices"][0]["message"], json!({"role": "assistant", "content": "Hello"}));
    assert_eq!(answer["choices"][0]["finish_reason"], "stop");
    assert_eq!(answer["usage"]["completion_tokens"], USAGE.completion_tokens);
    assert_eq!(answer["timings"]["cache_n"], USAGE.cached_tokens);
    assert_eq!(
        answer["timings"]["cache"],
        json!({"source": "ram", "reused": 4, "prefilled": 6, "diverged_at": null, "reason": "restored", "restore_ms": 2.0})
    );
}

#[tokio::test]
async fn the_cache_view_lists_the_live_sequence_and_the_entries() {
    let mut engine = FakeEngine::answering(Vec::new());
    let last_used = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_700_000_000);
    engine.cache = CacheStatus {
        live_tokens: 1200,
        budget_bytes: 1 << 30,
        used_bytes: 5 << 20,
        checkpoint_every: Some(4096),
        entries: vec![CacheEntryStatus { kind: CacheEntryKind::Checkpoint, tokens: 900, bytes: 5 << 20, last_used }],
        disk: Some(DiskStatus {
            dir: "/cache/model-1".into(),
            budget_bytes: 4 << 30,
            used_bytes: 7 << 20,
            bytes_written: 9 << 20,
            signature_bytes: 300 << 10,
            entries: vec![CacheEntryStatus { kind: CacheEntryKind::Snapshot, tokens: 1300, bytes: 7 << 20, last_used }],
            off: None,
            read_only: Some("another instance with the same settings (process 7) writes this directory".into()),
        }),
        kept: vec![crate::engine::KeptStatus { sequence: 2, tokens: 700, shared: 650 }],
        live_approximate_from: Some(12),
        ..CacheStatus::default()
    };
    let (status, view) = call(&Arc::new(engine), Method::GET, "/cache", Body::empty()).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        view,
        json!({"live_tokens": 1200, "budget_bytes": 1u64 << 30, "used_bytes": 5u64 << 20, "checkpoint_every": 4096,
            "entries": [{"kind": "checkpoint", "tokens": 900, "bytes": 5u64 << 20, "last_used": 1_700_000_000.0}],
            "disk": {"dir": "/cache/model-1", "budget_bytes": 4u64 << 30, "used_bytes": 7u64 << 20,
                "bytes_written": 9u64 << 20, "signature_bytes": 300u64 << 10,
                "entries": [{"kind": "snapshot", "tokens": 1300, "bytes": 7u64 << 20, "last_used": 1_700_000_000.0}],
                "off": null,
                "read_only": "another instance with the same settings (process 7) writes this directory"},
            "kept": [{"sequence": 2, "tokens": 700, "shared": 650}], "live_approximate_from": 12})
    );
    let loading = Arc::new(FakeEngine::without_model(EngineError::Loading));
    let (status, _) = call(&loading, Method::GET, "/cache", Body::empty()).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
}

#[tokio::test]
async fn a_repeated_call_finishes_the_generation_and_is_dropped() {
    let call = call_text("get_weather", "{\"city\": \"Oslo\"}");
    let engine = replying(&[&call, &call], FinishReason::Stop);
    let mut body = hi();
    body["tools"] = json!([{"type": "function", "function": {"name": "get_weather"}}]);
    let (status, answer) = chat(&engine, &body).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert!(engine.finish_requested.load(Ordering::Relaxed), "generation asked to end");
    let message = &answer["choices"][0]["message"];
    assert_eq!((&message["content"], message["tool_calls"].as_array().map(Vec::len)), (&Value::Null, Some(1)));
    assert_eq!(answer["choices"][0]["finish_reason"], "tool_calls");
}

#[tokio::test]
async fn a_reply_that_is_no_answer_gets_422() {
    let engine = replying(&["{\"m\": 1}"], FinishReason::Stop);
    let mut body = hi();
    body["response_format"] =
        json!({"type": "json_schema", "json_schema": {"schema": {"type": "object", "required": ["n"]}}});
    assert_error(
        "schema broken",
        &chat(&engine, &body).await,
        StatusCode::UNPROCESSABLE_ENTITY,
        Some("invalid_model_output"),
    );
}

#[tokio::test]
async fn an_engine_refusal_before_started_gets_its_own_status() {
    let overflow = EngineError::ContextOverflow { prompt_tokens: 5000, max_tokens: 1, needed: 5001, n_ctx: 4096 };
    let engine = Arc::new(FakeEngine::answering(vec![Event::Failed(overflow)]));
    let answer = chat(&engine, &hi()).await;
    assert_error("overflow", &answer, StatusCode::BAD_REQUEST, Some("context_length_exceeded"));
    assert_eq!(answer.1["error"]["param"], "messages");
}

#[tokio::test]
async fn events_that_stop_without_a_finish_get_500() {
    let engine = Arc::new(FakeEngine::answering(vec![Event::Started {
        prompt_tokens: 1,
        cached_tokens: 0,
        in_reasoning: false,
    }]));
    assert_error("stopped", &chat(&engine, &hi()).await, StatusCode::INTERNAL_SERVER_ERROR, Some("internal_error"));
    let before_start = Arc::new(FakeEngine::answering(Vec::new()));
    let never_started = chat(&before_start, &hi()).await;
    assert_error("never started", &never_started, StatusCode::INTERNAL_SERVER_ERROR, Some("internal_error"));
}

#[tokio::test]
async fn a_streamed_answer_is_sse_chunks_ending_in_done() {
    let engine = replying(&["Hel", "lo"], FinishReason::Length);
    let mut body = hi();
    body["stream"] = json!(true);
    body["stream_options"] = json!({"include_usage": true});
    let response = send(&engine, post_chat(body.to_string())).await;
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.headers()[header::CONTENT_TYPE], "text/event-stream");
    let text = text_of(response).await;
    let payloads: Vec<&str> =
        text.split("\n\n").filter(|e| !e.is_empty()).map(|e| e.strip_prefix("data: ").unwrap_or(e)).collect();
    assert_eq!(payloads.len(), 6, "role, two texts, finish, usage, done: {text}");
    let chunks: Vec<Value> = payloads[..5].iter().map(|p| serde_json::from_str(p).expect("a chunk")).collect();
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let id = &chunks[0]["id"];
    assert!(chunks.iter().all(|c| &c["id"] == id), "one id for the whole stream");
    assert_eq!(
        (&chunks[1]["choices"][0]["delta"]["content"], &chunks[2]["choices"][0]["delta"]["content"]),
        (&"Hel".into(), &"lo".into())
    );
    assert_eq!(chunks[3]["choices"][0]["finish_reason"], "length");
    assert_eq!(chunks[4]["usage"]["prompt_tokens"], USAGE.prompt_tokens);
    assert_eq!(payloads[5], "[DONE]");
}

/// Each Responses event is written `event:` first, then `data:` (OpenAI's order): a client that
/// acts on each `data:` line knows which event it belongs to.
#[tokio::test]
async fn a_responses_stream_names_each_event_before_its_data() {
    let engine = replying(&["Hel", "lo"], FinishReason::Stop);
    let body = json!({"input": "hi", "stream": true});
    let response =
        send(&engine, request(Method::POST, "/v1/responses", "application/json", body.to_string().into())).await;
    assert_eq!(response.status(), StatusCode::OK);
    let text = text_of(response).await;
    let events: Vec<&str> = text.split("\n\n").filter(|e| !e.is_empty()).collect();
    assert!(events.len() >= 6, "{text}");
    for event in &events {
        let lines: Vec<&str> = event.lines().collect();
        let name = lines[0].strip_prefix("event: ").unwrap_or_else(|| panic!("event: first in {event:?}"));
        let data: Value = serde_json::from_str(lines[1].strip_prefix("data: ").expect("then data:")).expect("JSON");
        assert_eq!(data["type"], name, "{event}");
    }
}

#[tokio::test]
async fn a_failure_mid_stream_is_an_error_event_then_done() {
    let script = vec![
        Event::Started { prompt_tokens: 1, cached_tokens: 0, in_reasoning: false },
        Event::Text("Hi".into()),
        Event::Failed(EngineError::Decode("the GPU fell off".into())),
    ];
    let engine = Arc::new(FakeEngine::answering(script));
    let mut body = hi();
    body["stream"] = json!(true);
    let response = send(&engine, post_chat(body.to_string())).await;
    assert_eq!(response.status(), StatusCode::OK, "the stream had opened");
    let text = text_of(response).await;
    let events: Vec<&str> = text.split("\n\n").filter(|e| !e.is_empty()).collect();
    let error: Value = serde_json::from_str(events[2].trim_start_matches("data: ")).expect("an envelope");
    assert_eq!((&error["error"]["code"], &error["error"]["type"]), (&"decode_failed".into(), &"server_error".into()));
    assert_eq!(events[3], "data: [DONE]");
}

#[tokio::test]
async fn a_prefill_answers_with_its_counts_and_a_superseded_one_says_so() {
    let report = PrefillReport {
        prompt_tokens: 10,
        cached_tokens: 4,
        prefilled_tokens: 6,
        complete: true,
        superseded: false,
        pregenerated_tokens: 16,
        timings: Timings { prompt: std::time::Duration::from_millis(3), cache: CACHE, ..Timings::default() },
    };
    let engine = Arc::new(FakeEngine::prefilling(report));
    let (status, body) = call(&engine, Method::POST, "/v1/prefill", hi().to_string()).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        (&body["object"], &body["prompt_tokens"], &body["cached_tokens"], &body["prefilled_tokens"]),
        (&json!("prefill"), &json!(10), &json!(4), &json!(6)),
        "{body}"
    );
    assert_eq!((&body["complete"], &body["superseded"]), (&json!(true), &json!(false)));
    assert_eq!(body["pregenerated_tokens"], 16);
    assert_eq!((&body["timings"]["prompt_ms"], &body["timings"]["cache"]["source"]), (&json!(3.0), &json!("ram")));
    assert_eq!(engine.submitted.lock().len(), 1);

    let superseded = PrefillReport { superseded: true, ..PrefillReport::default() };
    let engine = Arc::new(FakeEngine::prefilling(superseded));
    let (status, body) = call(&engine, Method::POST, "/v1/prefill", hi().to_string()).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!((&body["superseded"], &body["prefilled_tokens"]), (&json!(true), &json!(0)), "{body}");
    assert!(body["timings"].get("cache").is_none(), "{body}");

    // Bad bodies are refused as chat completions refuses them, before the engine.
    let engine = replying(&[], FinishReason::Stop);
    let bad = "{\"messages\": []}";
    let (status, body) = call(&engine, Method::POST, "/v1/prefill", bad).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!((status, body), call(&engine, Method::POST, "/v1/chat/completions", bad).await);
    assert!(engine.submitted.lock().is_empty());
}

#[tokio::test]
async fn the_tokenizer_endpoints_answer_without_the_queue() {
    // The fake tokenizer has one token per byte.
    let engine = Arc::new(FakeEngine::without_room(EngineError::QueueFull { capacity: 1 }));
    let (status, body) = call(&engine, Method::POST, "/tokenize", r#"{"content": "Hi", "with_pieces": true}"#).await;
    assert_eq!(status, StatusCode::OK, "a full queue does not hold it: {body}");
    assert_eq!(body, json!({"tokens": [{"id": 72, "piece": "H"}, {"id": 105, "piece": "i"}]}));
    let (status, body) = call(&engine, Method::POST, "/detokenize", r#"{"tokens": [72, 105]}"#).await;
    assert_eq!((status, body), (StatusCode::OK, json!({"content": "Hi"})));
    let (status, body) = call(&engine, Method::POST, "/detokenize", r#"{"tokens": [4096]}"#).await;
    assert_eq!((status, &body["error"]["code"]), (StatusCode::BAD_REQUEST, &json!("invalid_token")), "{body}");
    let (status, body) = call(&engine, Method::POST, "/apply-template", hi().to_string()).await;
    assert_eq!((status, body), (StatusCode::OK, json!({"prompt": "user: hi\n"})));
    assert!(engine.submitted.lock().is_empty(), "nothing was generated");
}

#[tokio::test]
async fn a_text_completion_has_the_legacy_shape() {
    let engine = replying(&["Once", " upon"], FinishReason::Length);
    let (status, body) =
        call(&engine, Method::POST, "/v1/completions", r#"{"prompt": "Story:", "max_tokens": 2}"#).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!((&body["object"], &body["choices"][0]["text"]), (&json!("text_completion"), &json!("Once upon")));
    assert_eq!(
        (&body["choices"][0]["finish_reason"], &body["choices"][0]["logprobs"]),
        (&json!("length"), &Value::Null)
    );
    assert_eq!(body["usage"]["prompt_tokens_details"]["cached_tokens"], USAGE.cached_tokens);
    assert!(matches!(&engine.submitted.lock()[0].prompt, crate::engine::Prompt::Text(t) if t == "Story:"));
}

#[tokio::test]
async fn a_response_that_was_never_stored_is_a_404() {
    let engine = replying(&[], FinishReason::Stop);
    for method in [Method::GET, Method::DELETE] {
        let (status, body) = call(&engine, method, "/v1/responses/resp_missing", "").await;
        assert_eq!((status, &body["error"]["code"]), (StatusCode::NOT_FOUND, &json!("response_not_found")), "{body}");
    }
}
