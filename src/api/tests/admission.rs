//! The admission path over a scripted engine: bodies held until answered, work done on the
//! conversion threads, and the documented limits on what one request may hold.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{header, Method, Request, StatusCode};
use axum::Router;
use serde_json::{json, Value};
use tower::ServiceExt;

use super::fake::FakeEngine;
use super::{finished, model};
use crate::api::backend::Backend;
use crate::api::limits::{MAX_MESSAGES, TOKENIZER_CONTEXTS, TOKENIZE_BYTES_PER_TOKEN};
use crate::api::{app_state, router_over, router_with, ServeOptions, CONCURRENT_BODIES, CONCURRENT_CONVERSIONS};
use crate::engine::{Event, FinishReason};

fn app(engine: &Arc<FakeEngine>) -> Router {
    router_with(Arc::clone(engine) as Arc<dyn Backend>, &ServeOptions::default())
}

/// Status and JSON body of `POST path` with `body` on `app`.
async fn post(app: &Router, path: &str, body: String) -> (StatusCode, Value) {
    let request = Request::builder()
        .method(Method::POST)
        .uri(path)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(body))
        .expect("a request");
    let response = app.clone().oneshot(request).await.expect("infallible");
    let status = response.status();
    let bytes = axum::body::to_bytes(response.into_body(), usize::MAX).await.expect("the body");
    (status, serde_json::from_slice(&bytes).unwrap_or_else(|e| panic!("{e}: {bytes:?}")))
}

fn replying() -> Arc<FakeEngine> {
    let script = vec![
        Event::Started { prompt_tokens: 3, cached_tokens: 0, in_reasoning: false },
        Event::Text("Hi".into()),
        finished(FinishReason::Stop),
    ];
    Arc::new(FakeEngine::answering(script))
}

fn messages(count: usize) -> Value {
    json!({"messages": vec![json!({"role": "user", "content": "a"}); count]})
}

// The engine's lock is held across awaits on purpose: it keeps the conversions running.
#[allow(clippy::await_holding_lock)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_is_held_until_its_request_is_answered_and_the_rest_are_refused() {
    let engine = replying();
    let options = ServeOptions::default();
    let state = app_state(Arc::clone(&engine) as Arc<dyn Backend>, &options);
    let app = router_over(Arc::clone(&state), &options);
    let held = engine.hold.write();
    // Two convert (and wait in the engine), the others wait for a conversion: all hold bodies.
    let requests: Vec<_> = (0..CONCURRENT_BODIES)
        .map(|_| {
            let app = app.clone();
            tokio::spawn(async move { post(&app, "/detokenize", json!({"tokens": [72, 105]}).to_string()).await })
        })
        .collect();
    let all_held = async {
        while engine.working.load(Ordering::SeqCst) < CONCURRENT_CONVERSIONS || state.bodies.available_permits() > 0 {
            tokio::task::yield_now().await;
        }
    };
    // Before, a body's permit went when its reading ended: the bodies were never all held.
    tokio::time::timeout(Duration::from_secs(10), all_held).await.expect("every body permit held while converting");
    // Before admission held the permit, a ninth body was read and waited for a conversion
    // without a timeout (holding its parsed body): it now gets a 503 within the permit wait.
    let probe = post(&app, "/tokenize", json!({"content": "Hi"}).to_string());
    let (status, refused) = tokio::time::timeout(Duration::from_secs(5), probe).await.expect("refused in bounded time");
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{refused}");
    assert_eq!(refused["error"]["code"], "queue_full");
    assert!(refused["error"]["message"].as_str().is_some_and(|m| m.contains("being read")), "{refused}");
    drop(held);
    for request in requests {
        let (status, body) = request.await.expect("the request");
        assert_eq!((status, &body), (StatusCode::OK, &json!({"content": "Hi"})));
    }
    // Every permit came back.
    let (status, _) = post(&app, "/apply-template", messages(1).to_string()).await;
    assert_eq!(status, StatusCode::OK);
}

#[tokio::test]
async fn rendering_tokenizing_and_pieces_run_on_the_conversion_threads() {
    let engine = replying();
    let app = app(&engine);
    for (path, body) in [
        ("/v1/chat/completions", messages(2)),
        ("/apply-template", messages(2)),
        ("/tokenize", json!({"content": "Hi", "with_pieces": true})),
        ("/detokenize", json!({"tokens": [72, 105]})),
    ] {
        let (status, answer) = post(&app, path, body.to_string()).await;
        assert_eq!(status, StatusCode::OK, "{path}: {answer}");
    }
    let threads = engine.worked_on.lock().clone();
    // Render (chat), render (template), tokenize and pieces, pieces.
    assert_eq!(threads.len(), 5, "{threads:?}");
    assert!(threads.iter().all(|name| name == "firstword-prepare"), "{threads:?}");
}

#[tokio::test]
async fn a_chat_beyond_the_message_limit_is_refused_before_rendering() {
    let engine = replying();
    let app = app(&engine);
    for path in ["/v1/chat/completions", "/apply-template", "/v1/prefill"] {
        let (status, body) = post(&app, path, messages(MAX_MESSAGES + 1).to_string()).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{path}: {body}");
        assert_eq!(
            (body["error"]["code"].as_str(), body["error"]["param"].as_str()),
            (Some("limit_exceeded"), Some("messages"))
        );
        assert!(body["error"]["message"].as_str().is_some_and(|m| m.contains(&format!("at most {MAX_MESSAGES}"))));
    }
    // 900,000 tiny messages: counted while parsing, never kept or rendered.
    let (status, body) = post(&app, "/apply-template", messages(900_000).to_string()).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert!(body["error"]["message"].as_str().is_some_and(|m| m.contains("got 900000")), "{body}");
    assert!(engine.worked_on.lock().is_empty(), "nothing was rendered");
    let (status, body) = post(&app, "/apply-template", messages(MAX_MESSAGES).to_string()).await;
    assert_eq!(status, StatusCode::OK, "{body}");
}

#[tokio::test]
async fn tokenizer_input_is_bounded_by_a_multiple_of_the_context() {
    let engine = replying();
    let app = app(&engine);
    let n_ctx = model().n_ctx as usize;
    let max_ids = TOKENIZER_CONTEXTS * n_ctx;
    let (status, body) = post(&app, "/detokenize", json!({"tokens": vec![65; max_ids + 1]}).to_string()).await;
    assert_eq!((status, body["error"]["code"].as_str()), (StatusCode::BAD_REQUEST, Some("limit_exceeded")), "{body}");
    assert_eq!(body["error"]["param"], "tokens");
    let (status, body) = post(&app, "/detokenize", json!({"tokens": vec![65; max_ids]}).to_string()).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["content"].as_str().map(str::len), Some(max_ids));

    let max_bytes = max_ids * TOKENIZE_BYTES_PER_TOKEN;
    let (status, body) = post(&app, "/tokenize", json!({"content": "a".repeat(max_bytes + 1)}).to_string()).await;
    assert_eq!((status, body["error"]["param"].as_str()), (StatusCode::BAD_REQUEST, Some("content")), "{body}");
    let (status, body) =
        post(&app, "/tokenize", json!({"content": "a".repeat(max_bytes), "with_pieces": true}).to_string()).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["tokens"].as_array().map(Vec::len), Some(max_bytes));
    assert_eq!(body["tokens"][0], json!({"id": 97, "piece": "a"}));
}
