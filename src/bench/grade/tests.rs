//! The grading router over a run directory in a temp folder, requests sent with `oneshot`.

use std::path::PathBuf;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use serde_json::{json, Value};
use tower::ServiceExt;

use super::*;
use crate::bench::quality::{Answer, QualityItem, QualitySet};

const ALPHA: &str = "server-alpha-7731";
const BRAVO: &str = "server-bravo-5520";
const HOST: &str = "127.0.0.1:4321";

/// A run of three items answered by [`ALPHA`] and [`BRAVO`]: different answers to `capital`
/// and `timer` (the latter with tools), the same one to `hello`.
fn run(name: &str) -> (RunDir, PathBuf) {
    let path =
        std::env::temp_dir().join(format!("firstword-grade-{name}-{}-{}", std::process::id(), fastrand::u32(..)));
    let dir = RunDir::create(&path).expect("run directory");
    let item = |id: &str, question: &str, tools: Option<Value>| QualityItem {
        id: id.into(),
        messages: vec![json!({"role": "user", "content": question})],
        tools,
        reference: Some(format!("the reference of {id}")),
        rubric: Some("short".into()),
        max_tokens: None,
    };
    let items = vec![
        item("capital", "What is the capital of France?", None),
        item("timer", "Set a timer for ten minutes.", Some(json!("home"))),
        item("hello", "Say hello.", None),
    ];
    dir.write_items(&QualitySet { items }).expect("items");
    for (item, alpha, bravo) in [
        ("capital", "Paris.", "Lyon, I think."),
        ("timer", "Done.", "Ten minutes, starting now."),
        ("hello", "Hello!", "Hello!"),
    ] {
        for (server, content) in [(ALPHA, alpha), (BRAVO, bravo)] {
            let answer =
                Answer { item: item.into(), server: server.into(), content: content.into(), ..Answer::default() };
            dir.append_answer(&answer).expect("answer");
        }
    }
    (dir, path)
}

/// Sends a request with `Host:` [`HOST`] (and more headers); the status and the body as text.
async fn send(router: &Router, method: &str, uri: &str, headers: &[(&str, &str)], body: &str) -> (StatusCode, String) {
    let mut request = Request::builder().method(method).uri(uri).header("host", HOST);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let response =
        router.clone().oneshot(request.body(Body::from(body.to_string())).expect("request")).await.expect("answer");
    let status = response.status();
    let bytes = axum::body::to_bytes(response.into_body(), usize::MAX).await.expect("body");
    (status, String::from_utf8_lossy(&bytes).into_owned())
}

async fn next(router: &Router) -> Value {
    let (status, body) = send(router, "GET", "/api/next", &[], "").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(!body.contains(ALPHA) && !body.contains(BRAVO), "a name before the grade: {body}");
    serde_json::from_str(&body).expect("JSON")
}

async fn post_grade(router: &Router, grade: &Value) -> (StatusCode, String) {
    send(router, "POST", "/api/grade", &[("content-type", "application/json")], &grade.to_string()).await
}

/// The label of `server`'s answer to `item`.
fn label_of(dir: &RunDir, item: &str, server: &str) -> String {
    let units = dir.units().expect("units");
    let unit = units.iter().find(|u| u.key.item == item).expect("unit");
    unit.choices.iter().find(|c| c.servers.iter().any(|s| s == server)).expect("choice").label.clone()
}

#[tokio::test]
async fn the_next_unit_has_labels_and_texts_but_never_a_servers_name() {
    let (dir, path) = run("next");
    let router = grading_router(dir);
    let next = next(&router).await;
    assert_eq!(next["progress"], json!({"graded": 0, "total": 3}));
    let unit = &next["unit"];
    assert_eq!((unit["item"].as_str(), unit["sample"].as_u64()), (Some("capital"), Some(0)));
    assert_eq!(unit["reference"], "the reference of capital");
    assert_eq!(unit["messages"][0]["content"], "What is the capital of France?");
    let labels: Vec<&str> =
        unit["choices"].as_array().expect("choices").iter().filter_map(|c| c["label"].as_str()).collect();
    assert_eq!(labels, ["A", "B"]);
    assert!(unit["choices"][0].get("servers").is_none());
    std::fs::remove_dir_all(path).expect("clean up");
}

#[tokio::test]
async fn a_grade_is_stored_before_the_servers_are_revealed_and_the_next_unit_follows() {
    let (dir, path) = run("reveal");
    let router = grading_router(dir.clone());
    let alpha = label_of(&dir, "capital", ALPHA);
    let bravo = label_of(&dir, "capital", BRAVO);
    let grade = json!({"item": "capital", "sample": 0, "scores": {alpha.clone(): 5, bravo.clone(): 2}, "tie": false});
    let (status, body) = post_grade(&router, &grade).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let answer: Value = serde_json::from_str(&body).expect("JSON");
    assert_eq!(answer["reveal"][&alpha], json!([ALPHA]));
    assert_eq!(answer["reveal"][&bravo], json!([BRAVO]));
    assert_eq!(answer["progress"], json!({"graded": 1, "total": 3}));

    let grades = dir.grades().expect("grades");
    assert_eq!(grades.len(), 1);
    assert_eq!((grades[0].grader, grades[0].tie), (Grader::Person, false));
    assert_eq!(grades[0].scores, BTreeMap::from([(ALPHA.to_string(), 5.0), (BRAVO.to_string(), 2.0)]));

    let next = next(&router).await;
    assert_eq!((next["unit"]["item"].as_str(), &next["progress"]["graded"]), (Some("timer"), &json!(1)));
    let tools: Vec<&str> = next["unit"]["tools"].as_array().expect("tools").iter().filter_map(Value::as_str).collect();
    assert!(tools.contains(&"HassTurnOn") && tools.len() >= 3, "{tools:?}");
    std::fs::remove_dir_all(path).expect("clean up");
}

#[tokio::test]
async fn bad_grades_are_refused_and_a_unit_is_graded_once() {
    let (dir, path) = run("refused");
    let router = grading_router(dir.clone());
    let refused = [
        json!({"item": "capital", "sample": 0, "scores": {"A": 3}}),
        json!({"item": "capital", "sample": 0, "scores": {"A": 3, "B": 6}}),
        json!({"item": "capital", "sample": 0, "scores": {"A": 0, "B": 3}}),
        json!({"item": "capital", "sample": 0, "scores": {"A": 3, "B": 2.5}}),
        json!({"item": "capital", "sample": 0, "scores": {"A": 3, "B": 3, "C": 3}}),
        json!({"item": "capital", "sample": 0, "scores": {"A": 3, "B": 4}, "tie": true}),
        json!({"item": "capital", "sample": 0, "scores": {"A": 3, "B": 4}, "servers": {}}),
        json!({"item": "capital", "scores": {"A": 3, "B": 4}}),
    ];
    for grade in &refused {
        let (status, body) = post_grade(&router, grade).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{grade}: {body}");
        let error: Value = serde_json::from_str(&body).expect("an envelope");
        assert_eq!(error["error"]["type"], "invalid_request_error", "{body}");
        assert!(error["error"]["message"].as_str().is_some_and(|m| !m.is_empty()), "{body}");
        assert!(!body.contains(ALPHA) && !body.contains(BRAVO), "{body}");
    }
    let (status, body) = send(&router, "POST", "/api/grade", &[("content-type", "text/plain")], "{}").await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    let (status, body) =
        post_grade(&router, &json!({"item": "nowhere", "sample": 0, "scores": {"A": 3, "B": 3}})).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    assert!(dir.grades().expect("grades").is_empty());

    let tie = json!({"item": "capital", "sample": 0, "scores": {"A": 4, "B": 4}, "tie": true});
    assert_eq!(post_grade(&router, &tie).await.0, StatusCode::OK);
    let (status, body) = post_grade(&router, &tie).await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert!(body.contains("invalid_request_error") && !body.contains(ALPHA), "{body}");
    let grades = dir.grades().expect("grades");
    assert_eq!(grades.len(), 1);
    assert!(grades[0].tie);
    std::fs::remove_dir_all(path).expect("clean up");
}

#[tokio::test]
async fn other_hosts_and_other_origins_are_refused() {
    let (dir, path) = run("hosts");
    let router = grading_router(dir.clone());
    for uri in ["/", "/api/next", "/grade.js"] {
        let request =
            Request::builder().uri(uri).header("host", "evil.example:4321").body(Body::empty()).expect("request");
        let response = router.clone().oneshot(request).await.expect("answer");
        assert_eq!(response.status(), StatusCode::FORBIDDEN, "{uri}");
        let request = Request::builder().uri(uri).body(Body::empty()).expect("request");
        assert_eq!(router.clone().oneshot(request).await.expect("answer").status(), StatusCode::FORBIDDEN, "{uri}");
    }
    for host in ["localhost:8000", "[::1]:8000", "127.0.0.1"] {
        let request = Request::builder().uri("/api/next").header("host", host).body(Body::empty()).expect("request");
        assert_eq!(router.clone().oneshot(request).await.expect("answer").status(), StatusCode::OK, "{host}");
    }
    let grade = json!({"item": "capital", "sample": 0, "scores": {"A": 4, "B": 4}}).to_string();
    for origin in ["http://evil.example", "http://127.0.0.1:9999", "null"] {
        let headers = [("content-type", "application/json"), ("origin", origin)];
        let (status, body) = send(&router, "POST", "/api/grade", &headers, &grade).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{origin}: {body}");
        assert!(body.contains("permission_error"), "{body}");
    }
    assert!(dir.grades().expect("grades").is_empty());
    let headers = [("content-type", "application/json"), ("origin", "http://127.0.0.1:4321")];
    assert_eq!(send(&router, "POST", "/api/grade", &headers, &grade).await.0, StatusCode::OK);
    std::fs::remove_dir_all(path).expect("clean up");
}

#[tokio::test]
async fn grading_resumes_from_the_file_and_ends_when_every_unit_is_graded() {
    let (dir, path) = run("resume");
    let first = grading_router(dir);
    let grade = json!({"item": "capital", "sample": 0, "scores": {"A": 1, "B": 5}});
    assert_eq!(post_grade(&first, &grade).await.0, StatusCode::OK);
    drop(first);

    // A new server over the same directory, as after a restart.
    let router = grading_router(RunDir::open(&path).expect("open"));
    let next_unit = next(&router).await;
    assert_eq!((next_unit["unit"]["item"].as_str(), &next_unit["progress"]["graded"]), (Some("timer"), &json!(1)));
    assert_eq!(
        post_grade(&router, &json!({"item": "timer", "sample": 0, "scores": {"A": 3, "B": 4}})).await.0,
        StatusCode::OK
    );
    // Equal answers share one label.
    let hello = next(&router).await;
    assert_eq!(hello["unit"]["choices"].as_array().map(Vec::len), Some(1));
    let (status, body) = post_grade(&router, &json!({"item": "hello", "sample": 0, "scores": {"A": 5}})).await;
    assert_eq!(status, StatusCode::OK);
    assert!(body.contains(ALPHA) && body.contains(BRAVO), "{body}");
    let done = next(&router).await;
    assert_eq!(done, json!({"progress": {"graded": 3, "total": 3}, "unit": null}));
    std::fs::remove_dir_all(path).expect("clean up");
}

#[tokio::test]
async fn the_page_is_served_under_a_policy_of_this_origin_only() {
    let (dir, path) = run("page");
    let router = grading_router(dir);
    let request = Request::builder().uri("/").header("host", HOST).body(Body::empty()).expect("request");
    let response = router.clone().oneshot(request).await.expect("answer");
    assert_eq!(response.status(), StatusCode::OK);
    let policy = response.headers()[header::CONTENT_SECURITY_POLICY].to_str().expect("text").to_string();
    assert!(policy.starts_with("default-src 'none'") && !policy.contains("unsafe"), "{policy}");
    let (status, body) = send(&router, "GET", "/", &[], "").await;
    assert!(status.is_success() && body.contains("/grade.js") && body.contains("/grade.css"));
    assert!(!body.contains("http://") && !body.contains("https://"), "nothing from the network");
    assert_eq!(send(&router, "GET", "/grade.css", &[], "").await.0, StatusCode::OK);
    let (status, style) = send(&router, "GET", "/console.css", &[], "").await;
    assert!(status.is_success() && body.contains("/console.css") && style.contains("--accent"), "{style}");
    let (status, body) = send(&router, "GET", "/secret", &[], "").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert!(body.contains("not_found_error"), "{body}");
    std::fs::remove_dir_all(path).expect("clean up");
}
