//! The console's page and files through the router: their types and policy, nothing fetched
//! from elsewhere, every file the page loads served, and the same host rules as the API, with
//! the page itself open so that it can ask for the key.

use std::sync::Arc;

use axum::body::Body;
use axum::http::{header, Method, Request, StatusCode};
use axum::response::Response;
use tower::ServiceExt;

use super::fake::FakeEngine;
use crate::api::backend::Backend;
use crate::api::console::{asset_paths, total_bytes};
use crate::api::{router_with, ApiKeys, ServeOptions};

async fn get(options: &ServeOptions, path: &str, host: &str) -> Response {
    let engine: Arc<dyn Backend> = Arc::new(FakeEngine::answering(Vec::new()));
    let request = Request::builder()
        .method(Method::GET)
        .uri(path)
        .header(header::HOST, host)
        // What a browser's navigation sends: it is what gets the page at `/`.
        .header(header::ACCEPT, "text/html,application/xhtml+xml,*/*;q=0.8")
        .body(Body::empty())
        .expect("request");
    router_with(engine, options).oneshot(request).await.expect("infallible")
}

async fn text_of(response: Response) -> String {
    let bytes = axum::body::to_bytes(response.into_body(), usize::MAX).await.expect("the body");
    String::from_utf8(bytes.to_vec()).expect("UTF-8")
}

fn header_of(response: &Response, name: header::HeaderName) -> &str {
    response.headers().get(name).and_then(|v| v.to_str().ok()).unwrap_or_default()
}

/// The `/console/…` paths `text` refers to (the page's `src`/`href`, the modules' imports).
fn references(text: &str) -> Vec<String> {
    let mut found = Vec::new();
    for (at, _) in text.match_indices("/console/").chain(text.match_indices("'./")) {
        let rest = &text[at..];
        let end = rest[1..].find(['"', '\'']).map_or(rest.len(), |i| i + 1);
        let name = rest[..end].trim_start_matches('\'').trim_start_matches("./").trim_start_matches("/console/");
        found.push(format!("/console/{name}"));
    }
    found
}

#[tokio::test]
async fn the_page_and_its_files_are_served_with_their_types_and_a_strict_policy() {
    let options = ServeOptions::default();
    let page = get(&options, "/", "127.0.0.1:8080").await;
    assert_eq!(page.status(), StatusCode::OK);
    assert_eq!(header_of(&page, header::CONTENT_TYPE), "text/html; charset=utf-8");
    let policy = header_of(&page, header::CONTENT_SECURITY_POLICY).to_string();
    for directive in ["default-src 'none'", "script-src 'self'", "connect-src 'self'", "frame-ancestors 'none'"] {
        assert!(policy.contains(directive), "{policy}");
    }
    assert!(!policy.contains("unsafe"), "{policy}");
    assert_eq!(header_of(&page, header::X_CONTENT_TYPE_OPTIONS), "nosniff");
    let html = text_of(page).await;
    let mut loaded = references(&html);
    assert!(loaded.contains(&"/console/app.js".to_string()) && loaded.contains(&"/console/console.css".to_string()));
    let served: Vec<String> = asset_paths().collect();
    for path in &served {
        let response = get(&options, path, "localhost:8080").await;
        assert_eq!(response.status(), StatusCode::OK, "{path}");
        let expected =
            if path.ends_with(".css") { "text/css; charset=utf-8" } else { "text/javascript; charset=utf-8" };
        assert_eq!(header_of(&response, header::CONTENT_TYPE), expected, "{path}");
        assert!(header_of(&response, header::CONTENT_SECURITY_POLICY).contains("default-src 'none'"), "{path}");
        let text = text_of(response).await;
        // Nothing from any network: the only absolute URL is the SVG namespace's name.
        let text_without_namespace = text.replace("http://www.w3.org/2000/svg", "");
        assert!(!text_without_namespace.contains("http://") && !text_without_namespace.contains("https://"), "{path}");
        assert!(!text.contains("innerHTML") && !text.contains("eval("), "{path}: text goes in as text");
        loaded.extend(references(&text));
    }
    // Every file the page and its modules load is served, and every served file is loaded.
    loaded.sort();
    loaded.dedup();
    assert_eq!(
        loaded,
        {
            let mut s = served.clone();
            s.sort();
            s
        },
        "the files the page loads"
    );
    assert!(total_bytes() < 150 * 1024, "{} bytes", total_bytes());
}

#[tokio::test]
async fn an_unknown_console_file_is_a_404_envelope() {
    for path in ["/console/nothing.js", "/console/", "/console/..%2FCargo.toml", "/console.css"] {
        let response = get(&ServeOptions::default(), path, "127.0.0.1").await;
        assert_eq!(response.status(), StatusCode::NOT_FOUND, "{path}");
        let body: serde_json::Value = serde_json::from_str(&text_of(response).await).expect("JSON");
        assert_eq!(body["error"]["code"], "not_found", "{path}: {body}");
    }
}

#[tokio::test]
async fn the_page_needs_no_key_but_every_call_it_makes_does() {
    let options = ServeOptions { api_keys: ApiKeys::new(["sk-console".to_string()]), ..ServeOptions::default() };
    assert_eq!(get(&options, "/", "127.0.0.1").await.status(), StatusCode::OK);
    for path in asset_paths() {
        assert_eq!(get(&options, &path, "127.0.0.1").await.status(), StatusCode::OK, "{path}");
    }
    for path in ["/v1/models", "/cache", "/metrics", "/console/nothing.js"] {
        assert_eq!(get(&options, path, "127.0.0.1").await.status(), StatusCode::UNAUTHORIZED, "{path}");
    }
}

#[tokio::test]
async fn the_page_is_served_only_to_allowed_host_names() {
    let response = get(&ServeOptions::default(), "/", "evil.example:8080").await;
    assert_eq!(response.status(), StatusCode::FORBIDDEN);
    assert!(text_of(response).await.contains("host_not_allowed"));
}
