//! API keys, CORS and the body limit, through the router over a scripted engine.

use std::sync::Arc;

use axum::body::Body;
use axum::http::{header, Method, Request, StatusCode};
use axum::response::Response;
use serde_json::Value;
use tower::ServiceExt;

use super::fake::FakeEngine;
use crate::api::backend::Backend;
use crate::api::{router_with, AllowedHosts, ApiKeys, CorsOrigins, ServeOptions};

async fn send(options: &ServeOptions, request: Request<Body>) -> Response {
    let engine: Arc<dyn Backend> = Arc::new(FakeEngine::answering(Vec::new()));
    router_with(engine, options).oneshot(request).await.expect("infallible")
}

fn get(path: &str, authorization: Option<&str>) -> Request<Body> {
    let mut builder = Request::builder().method(Method::GET).uri(path);
    if let Some(value) = authorization {
        builder = builder.header(header::AUTHORIZATION, value);
    }
    builder.body(Body::empty()).expect("a request")
}

async fn json_of(response: Response) -> Value {
    let bytes = axum::body::to_bytes(response.into_body(), usize::MAX).await.expect("the body");
    serde_json::from_slice(&bytes).expect("JSON")
}

fn with_key() -> ServeOptions {
    ServeOptions { api_keys: ApiKeys::new(["sk-local-1".to_string()]), ..ServeOptions::default() }
}

#[tokio::test]
async fn a_missing_or_wrong_key_gets_401_with_the_envelope() {
    let options = with_key();
    for authorization in [None, Some("Bearer sk-local-2"), Some("Bearer sk-local-1x"), Some("Basic c2stbG9jYWwtMQ==")] {
        for path in ["/v1/models", "/v1/chat/completions", "/cache", "/models", "/v1/nothing"] {
            let response = send(&options, get(path, authorization)).await;
            assert_eq!(response.status(), StatusCode::UNAUTHORIZED, "{path} {authorization:?}");
            assert_eq!(response.headers().get(header::WWW_AUTHENTICATE).map(|v| v.as_bytes()), Some(&b"Bearer"[..]));
            let body = json_of(response).await;
            assert_eq!(body["error"]["type"], "authentication_error", "{body}");
            assert_eq!(body["error"]["code"], "invalid_api_key", "{body}");
            assert!(!body["error"]["message"].as_str().unwrap_or_default().contains("sk-local-1"), "{body}");
        }
    }
}

#[tokio::test]
async fn the_right_key_is_let_in_and_health_needs_none() {
    let options = with_key();
    for authorization in ["Bearer sk-local-1", "bearer sk-local-1", "Bearer  sk-local-1 "] {
        let response = send(&options, get("/v1/models", Some(authorization))).await;
        assert_eq!(response.status(), StatusCode::OK, "{authorization}");
    }
    assert_eq!(send(&options, get("/health", None)).await.status(), StatusCode::OK);
    // No key configured: nothing is asked for.
    assert_eq!(send(&ServeOptions::default(), get("/v1/models", None)).await.status(), StatusCode::OK);
}

fn preflight(origin: &str) -> Request<Body> {
    Request::builder()
        .method(Method::OPTIONS)
        .uri("/v1/chat/completions")
        .header(header::ORIGIN, origin)
        .header(header::ACCESS_CONTROL_REQUEST_METHOD, "POST")
        .header(header::ACCESS_CONTROL_REQUEST_HEADERS, "authorization,content-type,x-stainless-os")
        .body(Body::empty())
        .expect("a request")
}

#[tokio::test]
async fn cors_answers_preflights_for_the_named_origins_only() {
    let origins = CorsOrigins::parse(&["http://localhost:3000".into()]).expect("origins");
    let options = ServeOptions { cors_origins: origins, ..with_key() };
    // A preflight carries no key: it is answered before the key check.
    let response = send(&options, preflight("http://localhost:3000")).await;
    assert!(response.status().is_success(), "{}", response.status());
    let headers = response.headers();
    assert_eq!(
        headers.get(header::ACCESS_CONTROL_ALLOW_ORIGIN).map(|v| v.as_bytes()),
        Some(&b"http://localhost:3000"[..])
    );
    let allowed = headers.get(header::ACCESS_CONTROL_ALLOW_HEADERS).and_then(|v| v.to_str().ok()).unwrap_or_default();
    assert!(allowed.contains("authorization") && allowed.contains("x-stainless-os"), "{allowed}");
    assert!(headers.get(header::ACCESS_CONTROL_ALLOW_METHODS).is_some());

    let other = send(&options, preflight("http://evil.example")).await;
    assert!(other.headers().get(header::ACCESS_CONTROL_ALLOW_ORIGIN).is_none());

    // The actual request still needs its key, and carries the CORS header.
    let mut request = get("/v1/models", Some("Bearer sk-local-1"));
    request.headers_mut().insert(header::ORIGIN, "http://localhost:3000".parse().expect("origin"));
    let response = send(&options, request).await;
    assert_eq!(response.status(), StatusCode::OK);
    assert!(response.headers().get(header::ACCESS_CONTROL_ALLOW_ORIGIN).is_some());

    // Off by default: no CORS header at all.
    let mut request = get("/v1/models", None);
    request.headers_mut().insert(header::ORIGIN, "http://localhost:3000".parse().expect("origin"));
    let response = send(&ServeOptions::default(), request).await;
    assert!(response.headers().get(header::ACCESS_CONTROL_ALLOW_ORIGIN).is_none());

    let any = ServeOptions { cors_origins: CorsOrigins::Any, ..ServeOptions::default() };
    let response = send(&any, preflight("http://anything.example")).await;
    assert_eq!(response.headers().get(header::ACCESS_CONTROL_ALLOW_ORIGIN).map(|v| v.as_bytes()), Some(&b"*"[..]));
}

#[tokio::test]
async fn a_body_over_the_limit_gets_413_with_the_envelope() {
    let options = ServeOptions { max_body_bytes: 1024, ..ServeOptions::default() };
    let body = format!(r#"{{"messages": [{{"role": "user", "content": "{}"}}]}}"#, "a".repeat(2000));
    let request = Request::builder()
        .method(Method::POST)
        .uri("/v1/chat/completions")
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(body))
        .expect("a request");
    let response = send(&options, request).await;
    assert_eq!(response.status(), StatusCode::PAYLOAD_TOO_LARGE);
    let body = json_of(response).await;
    assert_eq!(body["error"]["type"], "invalid_request_error", "{body}");
}

fn post_from(origin: Option<&str>, host: &str, content_type: &str) -> Request<Body> {
    let mut builder = Request::builder()
        .method(Method::POST)
        .uri("/v1/chat/completions")
        .header(header::HOST, host)
        .header(header::CONTENT_TYPE, content_type);
    if let Some(origin) = origin {
        builder = builder.header(header::ORIGIN, origin);
    }
    builder.body(Body::from(r#"{"messages":[{"role":"user","content":"hi"}]}"#)).expect("a request")
}

#[tokio::test]
async fn a_post_from_a_foreign_page_gets_403_and_other_clients_pass() {
    let closed = ServeOptions::default();
    // A form or text/plain POST needs no preflight: the server itself must refuse it.
    for content_type in ["text/plain", "application/x-www-form-urlencoded", "application/json"] {
        let response = send(&closed, post_from(Some("https://evil.example"), "127.0.0.1:8080", content_type)).await;
        assert_eq!(response.status(), StatusCode::FORBIDDEN, "{content_type}");
        let body = json_of(response).await;
        assert_eq!(body["error"]["type"], "permission_error", "{body}");
        assert_eq!(body["error"]["code"], "origin_not_allowed", "{body}");
        assert!(body["error"]["message"].as_str().unwrap_or_default().contains("--cors-origin"), "{body}");
    }
    let null = send(&closed, post_from(Some("null"), "127.0.0.1:8080", "text/plain")).await;
    assert_eq!(null.status(), StatusCode::FORBIDDEN, "sandboxed pages and file:// send Origin: null");
    // SDKs and curl send no Origin; a page of the server's own origin is no foreign page.
    // (Past the check, the scripted engine here ends every request without an answer: 500.)
    let sdk = send(&closed, post_from(None, "127.0.0.1:8080", "application/json")).await;
    assert_eq!(sdk.status(), StatusCode::INTERNAL_SERVER_ERROR);
    let own = send(&closed, post_from(Some("http://127.0.0.1:8080"), "127.0.0.1:8080", "application/json")).await;
    assert_eq!(own.status(), StatusCode::INTERNAL_SERVER_ERROR);
    // Reading is left to CORS: a GET's answer is unreadable to a foreign page anyway.
    let mut models = get("/v1/models", None);
    models.headers_mut().insert(header::ORIGIN, header::HeaderValue::from_static("https://evil.example"));
    assert_eq!(send(&closed, models).await.status(), StatusCode::OK);

    let named = ServeOptions {
        cors_origins: CorsOrigins::parse(&["http://localhost:3000".to_string()]).expect("origins"),
        ..ServeOptions::default()
    };
    let allowed = send(&named, post_from(Some("http://localhost:3000"), "127.0.0.1:8080", "application/json")).await;
    assert_eq!(allowed.status(), StatusCode::INTERNAL_SERVER_ERROR);
    let other = send(&named, post_from(Some("http://localhost:4000"), "127.0.0.1:8080", "text/plain")).await;
    assert_eq!(other.status(), StatusCode::FORBIDDEN);
    let any =
        ServeOptions { cors_origins: CorsOrigins::parse(&["*".to_string()]).expect("any"), ..ServeOptions::default() };
    let anywhere = send(&any, post_from(Some("https://evil.example"), "127.0.0.1:8080", "text/plain")).await;
    assert_eq!(anywhere.status(), StatusCode::INTERNAL_SERVER_ERROR, "--cors-origin '*' lets every page in");
}

/// `method path` addressed to `host`, from a page of `origin` (a DNS-rebinding page sends its
/// own origin and host, which agree), with a body that never ends: a route that read it would
/// hang.
fn addressed_to(method: Method, path: &str, host: &str, origin: Option<&str>) -> Request<Body> {
    let mut builder = Request::builder().method(method).uri(path).header(header::HOST, host);
    if let Some(origin) = origin {
        builder = builder.header(header::ORIGIN, origin);
    }
    let never = futures_util::stream::pending::<Result<Vec<u8>, std::io::Error>>();
    builder.body(Body::from_stream(never)).expect("a request")
}

const ROUTES: [(&str, &str); 12] = [
    ("POST", "/v1/chat/completions"),
    ("POST", "/v1/completions"),
    ("POST", "/v1/responses"),
    ("GET", "/v1/responses/resp_1"),
    ("POST", "/v1/prefill"),
    ("POST", "/tokenize"),
    ("POST", "/detokenize"),
    ("POST", "/apply-template"),
    ("GET", "/cache"),
    ("GET", "/metrics"),
    ("GET", "/v1/models"),
    ("GET", "/health"),
];

#[tokio::test]
async fn a_dns_rebinding_page_gets_403_on_every_route_before_its_body_is_read() {
    let cors = ServeOptions { cors_origins: CorsOrigins::Any, ..ServeOptions::default() };
    for options in [ServeOptions::default(), with_key(), cors] {
        for (method, path) in ROUTES {
            let request = addressed_to(
                method.parse().expect("method"),
                path,
                "evil.example:8080",
                Some("http://evil.example:8080"),
            );
            let response = tokio::time::timeout(std::time::Duration::from_secs(5), send(&options, request))
                .await
                .unwrap_or_else(|_| panic!("{method} {path}: the body was read"));
            assert_eq!(response.status(), StatusCode::FORBIDDEN, "{method} {path}");
            let body = json_of(response).await;
            assert_eq!(body["error"]["type"], "permission_error", "{body}");
            assert_eq!(body["error"]["code"], "host_not_allowed", "{body}");
            assert!(body["error"]["message"].as_str().unwrap_or_default().contains("--allowed-host"), "{body}");
        }
        // A preflight too, and a request naming the host in its target.
        let mut preflight = preflight("http://evil.example:8080");
        preflight.headers_mut().insert(header::HOST, header::HeaderValue::from_static("evil.example:8080"));
        assert_eq!(send(&options, preflight).await.status(), StatusCode::FORBIDDEN);
        let absolute = Request::builder()
            .uri("http://evil.example:8080/health")
            .header(header::HOST, "127.0.0.1:8080")
            .body(Body::empty())
            .expect("a request");
        assert_eq!(send(&options, absolute).await.status(), StatusCode::FORBIDDEN);
    }
}

#[tokio::test]
async fn localhost_addresses_and_allowed_names_are_served() {
    let defaults = ServeOptions::default();
    for host in ["localhost:8080", "127.0.0.1:8080", "[::1]:8080", "192.168.1.20:8080", "localhost"] {
        let response = send(&defaults, addressed_to(Method::GET, "/health", host, None)).await;
        assert_eq!(response.status(), StatusCode::OK, "{host}");
    }
    assert_eq!(send(&defaults, addressed_to(Method::GET, "/health", "homelab.lan:8080", None)).await.status(), 403);
    let named = ServeOptions {
        allowed_hosts: AllowedHosts::parse("0.0.0.0", &["homelab.lan".into()]).expect("names"),
        ..ServeOptions::default()
    };
    let page = Some("http://homelab.lan:8080");
    for (method, path) in [("GET", "/health"), ("GET", "/v1/models"), ("GET", "/cache")] {
        let response =
            send(&named, addressed_to(method.parse().expect("method"), path, "HomeLab.lan:8080", page)).await;
        assert_eq!(response.status(), StatusCode::OK, "{path}");
    }
    let any = ServeOptions {
        allowed_hosts: AllowedHosts::parse("127.0.0.1", &["*".into()]).expect("any"),
        ..ServeOptions::default()
    };
    assert_eq!(send(&any, addressed_to(Method::GET, "/health", "anything.example", None)).await.status(), 200);
}
