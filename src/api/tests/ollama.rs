//! Ollama's API over a scripted engine: the model endpoints, `GET /` by `Accept`, errors in
//! Ollama's shape, and chat and generate framing (NDJSON, nanosecond durations, tool calls as
//! objects) and field mapping.

use axum::body::Body;
use axum::http::{header, Method, Request, StatusCode};
use serde_json::json;

use super::router::{call, replying, send, text_of};
use crate::api::ollama::{parameter_size, quantization};
use crate::engine::FinishReason;

#[tokio::test]
async fn version_tags_ps_and_show_describe_the_one_model() {
    let engine = replying(&[], FinishReason::Stop);
    let (status, version) = call(&engine, Method::GET, "/api/version", Body::empty()).await;
    assert_eq!(status, StatusCode::OK);
    assert!(version["version"].as_str().is_some_and(|v| v.contains('.')), "{version}");

    let (status, tags) = call(&engine, Method::GET, "/api/tags", Body::empty()).await;
    assert_eq!(status, StatusCode::OK);
    let listed = &tags["models"][0];
    assert_eq!((&listed["name"], &listed["model"]), (&json!("test-model:latest"), &json!("test-model:latest")));
    assert_eq!(listed["details"]["format"], "gguf");
    assert_eq!(listed["details"]["family"], "llama");
    assert_eq!(listed["details"]["parameter_size"], "135M");
    assert_eq!(listed["details"]["quantization_level"], "Q4_1");
    assert_eq!(listed["size"], 91_000_000);
    assert_eq!(tags["models"].as_array().map(Vec::len), Some(1));

    let (status, ps) = call(&engine, Method::GET, "/api/ps", Body::empty()).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(ps["models"][0]["name"], "test-model:latest");
    assert_eq!(ps["models"][0]["context_length"], 4096);

    for name in ["test-model", "test-model:latest"] {
        let (status, show) = call(&engine, Method::POST, "/api/show", json!({"model": name}).to_string()).await;
        assert_eq!(status, StatusCode::OK, "{show}");
        assert_eq!(show["details"]["quantization_level"], "Q4_1");
        assert_eq!(show["model_info"]["llama.context_length"], 8192);
        assert_eq!(show["model_info"]["general.parameter_count"], 134_515_008);
        assert_eq!(show["capabilities"], json!(["completion", "tools"]), "no projector, no reasoning markers");
    }
    assert!(engine.submitted.lock().is_empty());
}

#[tokio::test]
async fn errors_come_in_ollamas_shape_with_their_status() {
    let engine = replying(&[], FinishReason::Stop);
    let (status, body) = call(&engine, Method::POST, "/api/show", json!({"model": "llama3"}).to_string()).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let message = body["error"].as_str().expect("error is a string, as Ollama writes it");
    assert!(message.contains("\"llama3\" not found") && message.contains("test-model:latest"), "{message}");

    let (status, body) = call(&engine, Method::POST, "/api/show", "{\"model\": ").await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(body["error"].is_string(), "{body}");

    for (method, path) in [
        (Method::POST, "/api/pull"),
        (Method::POST, "/api/create"),
        (Method::DELETE, "/api/delete"),
        (Method::POST, "/api/push"),
        (Method::POST, "/api/copy"),
    ] {
        let (status, body) = call(&engine, method, path, json!({"model": "llama3"}).to_string()).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{path}");
        let message = body["error"].as_str().expect("a string");
        assert!(message.contains("the one model it was started with"), "{path}: {message}");
    }
}

#[tokio::test]
async fn root_answers_ollamas_probe_and_browsers_the_console() {
    let engine = replying(&[], FinishReason::Stop);
    let get = |accept: Option<&str>, method: Method| {
        let mut builder = Request::builder().method(method).uri("/");
        if let Some(accept) = accept {
            builder = builder.header(header::ACCEPT, accept);
        }
        builder.body(Body::empty()).expect("a request")
    };
    // What a browser's navigation sends.
    let browser = send(&engine, get(Some("text/html,application/xhtml+xml,*/*;q=0.8"), Method::GET)).await;
    assert_eq!(browser.status(), StatusCode::OK);
    assert!(browser.headers()[header::CONTENT_TYPE].to_str().unwrap_or("").starts_with("text/html"));
    assert!(text_of(browser).await.contains("<html"));
    for accept in [None, Some("*/*"), Some("application/json")] {
        let probe = send(&engine, get(accept, Method::GET)).await;
        assert_eq!(probe.status(), StatusCode::OK);
        assert_eq!(text_of(probe).await, "Ollama is running", "Accept {accept:?}");
    }
    let head = send(&engine, get(None, Method::HEAD)).await;
    assert_eq!(head.status(), StatusCode::OK);
    assert!(text_of(head).await.is_empty());
}

#[test]
fn sizes_and_quantizations_are_written_as_ollama_writes_them() {
    assert_eq!(parameter_size(134_515_008), "135M");
    assert_eq!(parameter_size(7_241_732_096), "7.2B");
    assert_eq!(quantization(15), "Q4_K_M");
    assert_eq!(quantization(3), "Q4_1");
    assert_eq!(quantization(999), "unknown");
}
