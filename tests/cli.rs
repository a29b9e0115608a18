//! The `firstword` binary: version, load failures, `--warm`, graceful shutdown on SIGTERM, the
//! disk cache across restarts (SIGTERM and SIGKILL), API keys, and the systemd unit's flags.

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
/// process, its port, the rest of its log and what it logged before it was ready.
fn serve_smollm2(extra: &[&str]) -> (Child, u16, Lines<BufReader<ChildStderr>>, Vec<String>) {
    let port = {
        let probe = std::net::TcpListener::bind("127.0.0.1:0").expect("free port");
        probe.local_addr().expect("addr").port()
    };
    let mut child = Command::new(BIN)
        .args(["serve", "-m"])
        .arg(common::smollm2_path())
        .args(["--port", &port.to_string(), "-c", "2048", "-t", "2"])
        // Tests never write to the user's cache directory.
        .args(if extra.contains(&"--cache-dir") { &[][..] } else { &["--no-cache-dir"][..] })
        .args(extra)
        .stderr(Stdio::piped())
        .spawn()
        .expect("starts");
    let stderr = child.stderr.take().expect("stderr");
    let mut lines = BufReader::new(stderr).lines();
    let deadline = Instant::now() + Duration::from_secs(300);
    let mut startup = Vec::new();
    loop {
        let line = lines.next().expect("server still running").expect("line");
        if line.contains("ready") {
            // The default bind stays on this machine.
            let host = extra.iter().position(|&a| a == "--host").map_or("127.0.0.1", |i| extra[i + 1]);
            assert!(line.contains(&format!("listening on http://{host}:")), "startup line: {line}");
            break;
        }
        startup.push(line);
        assert!(Instant::now() < deadline, "server did not become ready");
    }
    (child, port, lines, startup)
}

#[test]
fn a_warm_file_is_prefilled_before_ready_and_the_first_request_is_cached() {
    let dir = std::env::temp_dir().join(format!("firstword-warm-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let system = common::long_system_prompt(600);
    let text_file = dir.join("system.txt");
    std::fs::write(&text_file, &system).expect("write");
    let (mut child, port, _lines, _) = serve_smollm2(&["--warm", text_file.to_str().expect("path")]);
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
    let (mut child, port, lines, _) = serve_smollm2(&[]);
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

/// Sends `signal` to the server and waits for it to exit; returns its exit status and the
/// rest of its log.
fn stop(mut child: Child, lines: Lines<BufReader<ChildStderr>>, signal: &str) -> (std::process::ExitStatus, String) {
    let _ = Command::new("kill").args([signal, &child.id().to_string()]).status();
    let status = child.wait().expect("exits");
    let rest: Vec<String> = lines.map_while(Result::ok).collect();
    (status, rest.join("\n"))
}

/// Kills the servers it was given when the test ends, failed or not.
#[derive(Default)]
struct Reaper(std::cell::RefCell<Vec<u32>>);

impl Reaper {
    fn watch(&self, child: &Child) {
        self.0.borrow_mut().push(child.id());
    }
}

impl Drop for Reaper {
    fn drop(&mut self) {
        for pid in self.0.borrow().iter() {
            let _ = Command::new("kill").args(["-KILL", &pid.to_string()]).stderr(Stdio::null()).status();
        }
    }
}

#[test]
fn the_disk_cache_survives_sigterm_and_sigkill_and_refuses_a_damaged_file_by_name() {
    let reaper = Reaper::default();
    let dir = std::env::temp_dir().join(format!("firstword-cli-disk-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let cache = dir.join("cache");
    let flags = ["--cache-dir", cache.to_str().expect("path"), "--cache-min-tokens", "32"];
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let ask = |port: u16, system: &str| {
        runtime.block_on(async {
            let body = serde_json::json!({"messages": [{"role": "system", "content": system},
                {"role": "user", "content": "Which facts mention trains?"}], "max_tokens": 8, "temperature": 0});
            let (status, answer) = common::post(&format!("http://127.0.0.1:{port}"), &body).await;
            assert_eq!(status, 200, "{answer}");
            answer
        })
    };
    let files = || -> Vec<std::path::PathBuf> {
        let model_dir = std::fs::read_dir(&cache).expect("cache dir").flatten().next().expect("model dir").path();
        std::fs::read_dir(model_dir).expect("model dir").flatten().map(|e| e.path()).collect()
    };
    let system = common::long_system_prompt(1200);

    // SIGTERM: the conversation is on disk when the process exits.
    let (child, port, lines, startup) = serve_smollm2(&flags);
    reaper.watch(&child);
    assert!(startup.iter().any(|l| l.contains("disk cache") && l.contains("0 entries")), "{startup:?}");
    let first = ask(port, &system);
    let (status, log) = stop(child, lines, "-TERM");
    assert!(status.success(), "{status}: {log}");
    assert!(log.contains("disk cache written"), "{log}");
    assert_eq!(files().len(), 1, "{:?}", files());

    // The restarted server has it live before its first request.
    let (child, port, lines, startup) = serve_smollm2(&flags);
    reaper.watch(&child);
    assert!(startup.iter().any(|l| l.contains("restored the last conversation")), "{startup:?}");
    let again = ask(port, &system);
    assert_eq!(again["timings"]["cache"]["source"], "disk", "{again}");
    let prompt_tokens = again["usage"]["prompt_tokens"].as_u64().expect("prompt_tokens");
    assert_eq!(again["usage"]["prompt_tokens_details"]["cached_tokens"], prompt_tokens - 1, "{again}");

    // SIGKILL right after an answer, while its state is being written: no file is left that
    // the next start could use wrongly, and nothing under a temporary name survives it.
    // SIGKILL while the answer's state is being written (as soon as its temporary file
    // appears): no file is left that the next start could use wrongly, and nothing under a
    // temporary name survives the next start.
    let other = format!("Another assistant.\n{}", common::long_system_prompt(1300));
    let before_kill = ask(port, &other);
    let deadline = Instant::now() + Duration::from_secs(10);
    let mid_write = loop {
        if files().iter().any(|f| f.extension().is_some_and(|e| e == "tmp")) {
            break true;
        }
        if files().len() == 2 || Instant::now() > deadline {
            break false;
        }
        std::thread::sleep(Duration::from_micros(200));
    };
    let (_, _) = stop(child, lines, "-KILL");
    eprintln!("SIGKILL during the write: {mid_write}; left: {:?}", files());
    let (child, port, lines, startup) = serve_smollm2(&flags);
    reaper.watch(&child);
    let refused: Vec<&String> = startup.iter().filter(|l| l.contains("refusing")).collect();
    assert!(refused.is_empty(), "a complete file only ever has its final name: {refused:?}");
    assert!(!files().iter().any(|f| f.extension().is_some_and(|e| e == "tmp")), "{:?}", files());
    let after_kill = ask(port, &other);
    let cached = |answer: &serde_json::Value| answer["usage"]["prompt_tokens_details"]["cached_tokens"].clone();
    if mid_write {
        // The unfinished file is gone: the first conversation was restored, as before the
        // kill, so the split, and the answer, are the same.
        assert_eq!(cached(&after_kill), cached(&before_kill), "{after_kill}");
        assert_eq!(after_kill["choices"][0]["message"]["content"], before_kill["choices"][0]["message"]["content"]);
    }
    let (status, _) = stop(child, lines, "-TERM");
    assert!(status.success());

    // A truncated file: a warning naming it and the reason, the file removed, a cold answer
    // equal to the first one.
    for file in files() {
        let bytes = std::fs::read(&file).expect("read");
        std::fs::write(&file, &bytes[..bytes.len() / 3]).expect("truncate");
    }
    let damaged = files();
    let (child, port, lines, startup) = serve_smollm2(&flags);
    reaper.watch(&child);
    for file in &damaged {
        let name = file.display().to_string();
        assert!(
            startup.iter().any(|l| l.contains("refusing") && l.contains(&name) && l.contains("truncated")),
            "{name}: {startup:?}"
        );
        assert!(!file.exists(), "{name} is removed");
    }
    let cold = ask(port, &system);
    assert_eq!(cold["timings"]["cache"]["reason"], "cold", "{cold}");
    assert_eq!(cold["choices"][0]["message"]["content"], first["choices"][0]["message"]["content"]);
    let (status, _) = stop(child, lines, "-TERM");
    assert!(status.success());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn an_api_key_guards_every_route_but_health_and_an_open_bind_without_one_warns() {
    let reaper = Reaper::default();
    let dir = std::env::temp_dir().join(format!("firstword-cli-keys-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let key_file = dir.join("keys");
    std::fs::write(&key_file, "# firstword keys\nsk-home-1\n").expect("write");
    let (child, port, lines, startup) = serve_smollm2(&["--api-key-file", key_file.to_str().expect("path")]);
    reaper.watch(&child);
    assert!(!startup.iter().any(|l| l.contains("sk-home-1")), "the key is never logged: {startup:?}");
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(async {
        let client = reqwest::Client::new();
        let url = |path: &str| format!("http://127.0.0.1:{port}{path}");
        let refused = client.get(url("/v1/models")).send().await.expect("request");
        assert_eq!(refused.status(), 401);
        assert_eq!(refused.headers()["www-authenticate"], "Bearer");
        let body: serde_json::Value = refused.json().await.expect("JSON");
        assert_eq!(body["error"]["code"], "invalid_api_key", "{body}");
        let wrong = client.get(url("/v1/models")).bearer_auth("sk-home-2").send().await.expect("request");
        assert_eq!(wrong.status(), 401);
        let right = client.get(url("/v1/models")).bearer_auth("sk-home-1").send().await.expect("request");
        assert_eq!(right.status(), 200);
        assert_eq!(client.get(url("/health")).send().await.expect("request").status(), 200);
    });
    let (status, log) = stop(child, lines, "-TERM");
    assert!(status.success());
    assert!(!log.contains("sk-home-1"), "{log}");

    // Beyond loopback without a key: a warning at start.
    let (child, _, lines, startup) = serve_smollm2(&["--host", "0.0.0.0"]);
    reaper.watch(&child);
    assert!(startup.iter().any(|l| l.contains("WARN") && l.contains("without an API key")), "{startup:?}");
    let _ = stop(child, lines, "-TERM");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_systemd_unit_uses_only_flags_and_variables_the_binary_has() {
    let unit = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/firstword.service")).expect("unit");
    let help = Command::new(BIN).args(["serve", "--help"]).output().expect("runs");
    let help = String::from_utf8_lossy(&help.stdout);
    let exec = unit.lines().find_map(|l| l.strip_prefix("ExecStart=")).expect("ExecStart");
    let mut words = exec.split_whitespace();
    assert!(words.next().is_some_and(|program| program.ends_with("/firstword")), "{exec}");
    assert_eq!(words.next(), Some("serve"), "{exec}");
    let flags: Vec<&str> = words.filter(|w| w.starts_with("--")).collect();
    assert!(!flags.is_empty());
    for flag in flags {
        assert!(help.contains(&format!("{flag} ")), "{flag} is not a flag of `firstword serve`");
    }
    for line in unit.lines().filter_map(|l| l.strip_prefix("Environment=")) {
        let name = line.split('=').next().expect("a name");
        assert!(help.contains(&format!("[env: {name}")), "{name} is not a variable of `firstword serve`");
    }
    // The service keeps its cache, is restarted on failure, and cannot gain privileges.
    for setting in ["CacheDirectory=firstword", "Restart=on-failure", "NoNewPrivileges=yes", "DynamicUser=yes"] {
        assert!(unit.lines().any(|l| l == setting), "{setting} missing");
    }
}
