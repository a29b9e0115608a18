//! The request log: one line per request at info, with status, tokens and times, never the
//! prompt, the reply or a key.

use std::io::Write;
use std::sync::Arc;

use axum::body::Body;
use axum::http::{header, Method, Request};
use parking_lot::Mutex;
use serde_json::json;
use tower::ServiceExt;

use super::fake::FakeEngine;
use super::finished;
use crate::api::backend::Backend;
use crate::api::{router_with, ApiKeys, ServeOptions};
use crate::engine::{Event, FinishReason};

/// Everything written to it, shared.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Sends `body` to the chat endpoint (with `key`) and reads the whole answer; returns the
/// log lines of the request logger.
async fn logged_chat(options: &ServeOptions, body: serde_json::Value, key: &str) -> Vec<String> {
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .with_max_level(tracing::Level::INFO)
        .finish();
    let _default = tracing::subscriber::set_default(subscriber);
    let script = vec![
        Event::Started { prompt_tokens: 10, cached_tokens: 4, in_reasoning: false },
        Event::Text("Fine, thanks.".into()),
        finished(FinishReason::Stop),
    ];
    let engine: Arc<dyn Backend> = Arc::new(FakeEngine::answering(script));
    let request = Request::builder()
        .method(Method::POST)
        .uri("/v1/chat/completions")
        .header(header::CONTENT_TYPE, "application/json")
        .header(header::AUTHORIZATION, format!("Bearer {key}"))
        .body(Body::from(body.to_string()))
        .expect("a request");
    let response = router_with(engine, options).oneshot(request).await.expect("infallible");
    let _ = axum::body::to_bytes(response.into_body(), usize::MAX).await.expect("the body");
    let text = String::from_utf8(captured.0.lock().clone()).expect("UTF-8");
    assert!(!text.contains("xylophone") && !text.contains("Fine, thanks") && !text.contains(key), "{text}");
    text.lines().filter(|line| line.contains("firstword::request")).map(String::from).collect()
}

#[tokio::test]
async fn each_request_is_one_line_with_its_counts_and_times_and_no_text() {
    let options = ServeOptions { api_keys: ApiKeys::new(["sk-secret-key".to_string()]), ..ServeOptions::default() };
    for stream in [false, true] {
        let body = json!({"messages": [{"role": "user", "content": "say xylophone"}], "stream": stream});
        let lines = logged_chat(&options, body, "sk-secret-key").await;
        assert_eq!(lines.len(), 1, "{lines:?}");
        let line = &lines[0];
        for field in [
            "POST /v1/chat/completions",
            "status=200",
            "prompt_tokens=10",
            "cached_tokens=4",
            "completion_tokens=3",
            "ttft_ms=",
            "total_ms=",
            "client_left=false",
        ] {
            assert!(line.contains(field), "{field} missing (stream {stream}): {line}");
        }
    }
    // A refused request is one line too, with its status and no counts.
    let lines = logged_chat(&options, json!({"messages": []}), "sk-wrong").await;
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(lines[0].contains("status=401") && !lines[0].contains("prompt_tokens="), "{}", lines[0]);
}
