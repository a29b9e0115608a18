//! The `firstword` binary: version, load failures, `--warm`, and graceful shutdown on SIGTERM.

mod common;

use std::io::{BufRead, BufReader, Lines};
use std::process::{Child, ChildStderr, Command, Stdio};
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

/// A `firstword serve` over SmolLM2 with `extra` flags, once it logged that it is ready: the
/// process, its port and the rest of its log.
fn serve_smollm2(extra: &[&str]) -> (Child, u16, Lines<BufReader<ChildStderr>>) {
    let port = {
        let probe = std::net::TcpListener::bind("127.0.0.1:0").expect("free port");
        probe.local_addr().expect("addr").port()
    };
    let mut child = Command::new(BIN)
        .args(["serve", "-m"])
        .arg(common::smollm2_path())
        .args(["--port", &port.to_string(), "-c", "2048", "-t", "2"])
        .args(extra)
        .stderr(Stdio::piped())
        .spawn()
        .expect("starts");
    let stderr = child.stderr.take().expect("stderr");
    let mut lines = BufReader::new(stderr).lines();
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        let line = lines.next().expect("server still running").expect("line");
        if line.contains("ready") {
            assert!(line.contains("listening on http://127.0.0.1:"), "startup line: {line}");
            break;
        }
        assert!(Instant::now() < deadline, "server did not become ready");
    }
    (child, port, lines)
}

#[test]
fn a_warm_file_is_prefilled_before_ready_and_the_first_request_is_cached() {
    let dir = std::env::temp_dir().join(format!("firstword-warm-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let system = common::long_system_prompt(600);
    let text_file = dir.join("system.txt");
    std::fs::write(&text_file, &system).expect("write");
    let (mut child, port, _lines) = serve_smollm2(&["--warm", text_file.to_str().expect("path")]);
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let (live, usage) = runtime.block_on(async {
        let base = format!("http://127.0.0.1:{port}");
        let cache: serde_json::Value =
            reqwest::get(format!("{base}/cache")).await.expect("GET /cache").json().await.expect("JSON");
        let body = serde_json::json!({"messages": [{"role": "system", "content": system},
            {"role": "user", "content": "Which facts mention trains?"}], "max_tokens": 4, "temperature": 0});
        let (status, answer) = common::post(&base, &body).await;
        assert_eq!(status, 200, "{answer}");
        (cache["live_tokens"].as_u64().expect("live_tokens"), answer["usage"].clone())
    });
    let _ = Command::new("kill").args(["-TERM", &child.id().to_string()]).status();
    let _ = child.wait();
    eprintln!("warmed {live} tokens; first request {usage}");
    assert!(live > 500, "the system prompt was prefilled at start: {live} tokens");
    let cached = usage["prompt_tokens_details"]["cached_tokens"].as_u64().expect("cached_tokens");
    // All but the warm prompt's closing of the empty user turn and its generation prompt.
    assert!(cached + 16 >= live, "the first request reused the warm prompt: {usage}");

    // A JSON body that is no chat request is refused at start, naming the file.
    let bad = dir.join("bad.json");
    std::fs::write(&bad, r#"{"messages": [{"role": "wizard", "content": "hi"}]}"#).expect("write");
    let out = Command::new(BIN)
        .args(["serve", "-m"])
        .arg(common::smollm2_path())
        .args(["--port", "0", "--warm", bad.to_str().expect("path")])
        .output()
        .expect("runs");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--warm") && stderr.contains("bad.json") && stderr.contains("role"), "{stderr}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn sigterm_ends_a_running_stream_with_an_error_event_and_exits_zero() {
    let (mut child, port, lines) = serve_smollm2(&[]);
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
