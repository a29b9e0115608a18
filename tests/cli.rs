//! The `firstword` binary: version, load failures, and graceful shutdown on SIGTERM.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_firstword");

#[test]
fn version_names_the_linked_llama_cpp() {
    let out = Command::new(BIN).arg("--version").output().expect("runs");
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains(env!("CARGO_PKG_VERSION")) && text.contains("llama.cpp"), "{text}");
}

#[test]
fn the_pinned_llama_cpp_is_the_one_named_in_the_version() {
    let lock = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.lock")).expect("Cargo.lock");
    let sys =
        lock.split("[[package]]").find(|p| p.contains("name = \"llama-cpp-sys-2\"")).expect("llama-cpp-sys-2 locked");
    let version = sys.lines().find_map(|l| l.strip_prefix("version = ")).expect("version").trim_matches('"');
    assert!(
        firstword::engine::LLAMA_CPP_BUILD.ends_with(version),
        "{} vs {version}",
        firstword::engine::LLAMA_CPP_BUILD
    );
}

#[test]
fn a_missing_model_exits_non_zero_with_a_clear_message() {
    let out = Command::new(BIN).args(["serve", "-m", "/nonexistent/model.gguf", "--port", "0"]).output().expect("runs");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("cannot read model file"), "{stderr}");
}

#[test]
fn sigterm_ends_a_running_stream_with_an_error_event_and_exits_zero() {
    let port = {
        let probe = std::net::TcpListener::bind("127.0.0.1:0").expect("free port");
        probe.local_addr().expect("addr").port()
    };
    let mut child = Command::new(BIN)
        .args(["serve", "-m"])
        .arg(common::smollm2_path())
        .args(["--port", &port.to_string(), "-c", "2048", "-t", "2"])
        .stderr(Stdio::piped())
        .spawn()
        .expect("starts");
    let stderr = child.stderr.take().expect("stderr");
    let mut lines = BufReader::new(stderr).lines();
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let line = lines.next().expect("server still running").expect("line");
        if line.contains("ready") {
            assert!(line.contains("listening on http://127.0.0.1:"), "startup line: {line}");
            break;
        }
        assert!(Instant::now() < deadline, "server did not become ready");
    }
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let body = runtime.block_on(async {
        let mut response = reqwest::Client::new()
            .post(format!("http://127.0.0.1:{port}/v1/chat/completions"))
            .json(&serde_json::json!({
                "messages": [{"role": "user", "content": "Write a very long story."}],
                "max_tokens": 1500, "stream": true, "logit_bias": {"2": -100}
            }))
            .send()
            .await
            .expect("request");
        let mut body = String::new();
        while body.matches("data: ").count() < 3 {
            body.push_str(&String::from_utf8_lossy(&response.chunk().await.expect("chunk").expect("open")));
        }
        let status = Command::new("kill").args(["-TERM", &child.id().to_string()]).status().expect("kill");
        assert!(status.success());
        while let Some(chunk) = response.chunk().await.expect("stream ends cleanly") {
            body.push_str(&String::from_utf8_lossy(&chunk));
        }
        body
    });
    let events = common::parse_sse(&body);
    assert_eq!(events.last(), Some(&common::SseData::Done), "ends with [DONE]");
    let error = events.iter().rev().find_map(|e| match e {
        common::SseData::Json(v) if v.get("error").is_some() => Some(v.clone()),
        _ => None,
    });
    let error = error.expect("an error event before [DONE]");
    assert_eq!(error["error"]["code"], "shutting_down", "{error}");
    let status = child.wait().expect("exits");
    assert!(status.success(), "exit status {status}");
    let mut rest = String::new();
    for line in lines.map_while(Result::ok) {
        rest.push_str(&line);
    }
    assert!(rest.contains("shutting down"), "{rest}");
}
