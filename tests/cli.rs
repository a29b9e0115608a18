//! The `firstword` binary: version, load failures, `--warm`, graceful shutdown on SIGTERM, the
//! disk cache across restarts (SIGTERM and SIGKILL), API keys, the console's address in the
//! start-up log, and the systemd unit's flags.

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
    serve_smollm2_with(extra, &[])
}

/// [`serve_smollm2`] with environment variables `env` set for the server.
fn serve_smollm2_with(
    extra: &[&str],
    env: &[(&str, &str)],
) -> (Child, u16, Lines<BufReader<ChildStderr>>, Vec<String>) {
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
        .envs(env.iter().copied())
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
            // Then the console's address, reachable from this machine's browser.
            let console = lines.next().expect("server still running").expect("line");
            let local = if host == "0.0.0.0" { "127.0.0.1" } else { host };
            assert!(console.contains(&format!("console: open http://{local}:{port}/ in a browser")), "{console}");
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

/// Builds with the `failpoints` feature pause the disk cache's writer once the temporary
/// file of a new base is begun, or the header of a delta appended (and it stays there): a
/// SIGKILL then always comes in the middle of a write.
const PAUSE_WRITES: [(&str, &str); 1] = [("FAILPOINTS", "disk::write=pause;disk::append=pause")];

#[test]
#[cfg_attr(
    not(feature = "failpoints"),
    ignore = "pauses the disk cache's writer at a failpoint: needs --features failpoints"
)]
fn the_disk_cache_survives_sigterm_and_sigkill_and_refuses_a_damaged_file_by_name() {
    let reaper = Reaper::default();
    let dir = std::env::temp_dir().join(format!("firstword-cli-disk-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let cache = dir.join("cache");
    let flags = ["--cache-dir", cache.to_str().expect("path"), "--cache-min-tokens", "32"];
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let ask = |port: u16, messages: &serde_json::Value| {
        runtime.block_on(async {
            let body = serde_json::json!({"messages": messages, "max_tokens": 8, "temperature": 0});
            let (status, answer) = common::post(&format!("http://127.0.0.1:{port}"), &body).await;
            assert_eq!(status, 200, "{answer}");
            answer
        })
    };
    let files = || -> Vec<std::path::PathBuf> {
        let model_dir = std::fs::read_dir(&cache).expect("cache dir").flatten().next().expect("model dir").path();
        let entries = std::fs::read_dir(model_dir).expect("model dir").flatten().map(|e| e.path());
        // The instance's lock file (see docs/cache.md) is not a state.
        entries.filter(|path| path.extension().is_none_or(|e| e != "lock")).collect()
    };
    let temporary = |file: &std::path::PathBuf| file.extension().is_some_and(|e| e == "tmp");
    // The writer is paused in the middle of a file: its temporary file is there.
    let mid_write = || {
        let deadline = Instant::now() + Duration::from_secs(120);
        while !files().iter().any(temporary) {
            assert!(Instant::now() < deadline, "no write began: {:?}", files());
            std::thread::sleep(Duration::from_millis(10));
        }
    };
    let content = |answer: &serde_json::Value| answer["choices"][0]["message"]["content"].clone();
    let cached = |answer: &serde_json::Value| answer["usage"]["prompt_tokens_details"]["cached_tokens"].clone();
    let conversation = |system: &str| {
        serde_json::json!([{"role": "system", "content": system},
        {"role": "user", "content": "Which facts mention trains?"}])
    };
    let system = common::long_system_prompt(1200);
    let turn1 = conversation(&system);

    // SIGTERM: the conversation is on disk when the process exits.
    let (child, port, lines, startup) = serve_smollm2(&flags);
    reaper.watch(&child);
    assert!(startup.iter().any(|l| l.contains("disk cache") && l.contains("0 entries")), "{startup:?}");
    let first = ask(port, &turn1);
    let (status, log) = stop(child, lines, "-TERM");
    assert!(status.success(), "{status}: {log}");
    assert!(log.contains("disk cache written"), "{log}");
    assert_eq!(files().len(), 1, "{:?}", files());

    // The restarted server has it live before its first request.
    let (child, port, lines, startup) = serve_smollm2_with(&flags, &PAUSE_WRITES);
    reaper.watch(&child);
    assert!(startup.iter().any(|l| l.contains("restored the last conversation")), "{startup:?}");
    let again = ask(port, &turn1);
    assert_eq!(again["timings"]["cache"]["source"], "disk", "{again}");
    let prompt_tokens = again["usage"]["prompt_tokens"].as_u64().expect("prompt_tokens");
    assert_eq!(again["usage"]["prompt_tokens_details"]["cached_tokens"], prompt_tokens - 1, "{again}");

    // SIGKILL while another conversation's state is being written: no file is left that the
    // next start could use wrongly, and nothing under a temporary name survives the next
    // start, which restores the first conversation as before.
    let other = conversation(&format!("Another assistant.\n{}", common::long_system_prompt(1300)));
    let before_kill = ask(port, &other);
    mid_write();
    let (_, _) = stop(child, lines, "-KILL");
    let (child, port, lines, startup) = serve_smollm2_with(&flags, &PAUSE_WRITES);
    reaper.watch(&child);
    let refused: Vec<&String> = startup.iter().filter(|l| l.contains("refusing")).collect();
    assert!(refused.is_empty(), "a complete file only ever has its final name: {refused:?}");
    assert!(!files().iter().any(temporary), "{:?}", files());
    assert!(startup.iter().any(|l| l.contains("restored the last conversation")), "{startup:?}");
    let after_kill = ask(port, &other);
    assert_eq!(cached(&after_kill), cached(&before_kill), "{after_kill}");
    assert_eq!(content(&after_kill), content(&before_kill));
    mid_write();
    let (_, _) = stop(child, lines, "-KILL");

    // SIGKILL while the same conversation's next turn is being appended to its file (the
    // restored file's state signed at start-up, so the turn is a delta): the part appended is
    // ignored, so the next start restores the first turn and answers the second as before.
    let mut turn2 = turn1.clone();
    let messages = turn2.as_array_mut().expect("messages");
    messages.push(serde_json::json!({"role": "assistant", "content": content(&first)}));
    messages.push(serde_json::json!({"role": "user", "content": "And gardens?"}));
    let (child, port, lines, _) = serve_smollm2_with(&flags, &PAUSE_WRITES);
    reaper.watch(&child);
    let complete: Vec<_> = files().into_iter().filter(|f| !temporary(f)).collect();
    assert_eq!(complete.len(), 1, "the first turn's file: {complete:?}");
    let length = |file: &std::path::PathBuf| std::fs::metadata(file).expect("file").len();
    let turn1_length = length(&complete[0]);
    let second = ask(port, &turn2);
    // The writer is paused in the middle of the append: the file has grown.
    let deadline = Instant::now() + Duration::from_secs(120);
    while length(&complete[0]) == turn1_length {
        assert!(Instant::now() < deadline, "no append began: {:?}", files());
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(!files().iter().any(temporary), "an append, not a new file: {:?}", files());
    let (_, _) = stop(child, lines, "-KILL");
    let (child, port, lines, startup) = serve_smollm2(&flags);
    reaper.watch(&child);
    assert!(startup.iter().any(|l| l.contains("restored the last conversation")), "{startup:?}");
    assert!(!files().iter().any(temporary), "{:?}", files());
    let second_again = ask(port, &turn2);
    assert_eq!(second_again["timings"]["cache"]["source"], "disk", "{second_again}");
    assert_eq!(cached(&second_again), cached(&second), "{second_again}");
    assert_eq!(content(&second_again), content(&second));
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
    let cold = ask(port, &turn1);
    assert_eq!(cold["timings"]["cache"]["reason"], "cold", "{cold}");
    assert_eq!(content(&cold), content(&first));
    let (status, _) = stop(child, lines, "-TERM");
    assert!(status.success());

    // One digit of the header's token list changed (valid JSON of the same length): the
    // checksum covers the header, so the file is refused by name and removed.
    let written = files();
    assert_eq!(written.len(), 1, "{written:?}");
    let mut bytes = std::fs::read(&written[0]).expect("read");
    let list = bytes.windows(10).position(|w| w == b"\"tokens\":[").expect("the token list") + 10;
    let digit = list + bytes[list..].iter().position(|b| (b'1'..=b'8').contains(b)).expect("a digit");
    bytes[digit] += 1;
    std::fs::write(&written[0], bytes).expect("write");
    let (child, _, lines, startup) = serve_smollm2(&flags);
    reaper.watch(&child);
    let name = written[0].display().to_string();
    assert!(
        startup.iter().any(|l| l.contains("refusing") && l.contains(&name) && l.contains("corrupt")),
        "{name}: {startup:?}"
    );
    assert!(!written[0].exists(), "{name} is removed");
    let (status, _) = stop(child, lines, "-TERM");
    assert!(status.success());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_cache_directory_other_users_can_write_to_is_refused_with_the_fix() {
    use std::os::unix::fs::PermissionsExt;
    let reaper = Reaper::default();
    let dir = std::env::temp_dir().join(format!("firstword-cli-shared-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("dir");
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).expect("chmod");
    let (child, _, lines, startup) = serve_smollm2(&["--cache-dir", dir.to_str().expect("path")]);
    reaper.watch(&child);
    let warning = startup.iter().find(|l| l.contains("disk cache off")).expect("the disk cache is off");
    assert!(warning.contains(dir.to_str().expect("path")), "names the directory: {warning}");
    assert!(warning.contains("writable by other users") && warning.contains("chmod"), "and the fix: {warning}");
    let (status, _) = stop(child, lines, "-TERM");
    assert!(status.success());
    assert_eq!(std::fs::read_dir(&dir).expect("dir").count(), 0, "nothing was created in it");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn an_api_key_guards_every_route_but_health_and_an_open_bind_without_one_warns_and_serves_only_allowed_hosts() {
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

    // Beyond loopback without a key: a warning at start. A DNS-rebinding page (its domain
    // resolved to this machine: Host and Origin both name it) reads and uses nothing; a name
    // the user allowed is served.
    let (child, port, lines, startup) = serve_smollm2(&["--host", "0.0.0.0", "--allowed-host", "homelab.lan"]);
    reaper.watch(&child);
    assert!(startup.iter().any(|l| l.contains("WARN") && l.contains("without an API key")), "{startup:?}");
    runtime.block_on(async {
        let client = reqwest::Client::new();
        let url = |path: &str| format!("http://127.0.0.1:{port}{path}");
        let evil = format!("evil.example:{port}");
        let chat = serde_json::json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2});
        let rebound = client
            .post(url("/v1/chat/completions"))
            .header("host", &evil)
            .header("origin", format!("http://{evil}"))
            .json(&chat)
            .send()
            .await
            .expect("request");
        assert_eq!(rebound.status(), 403);
        let body: serde_json::Value = rebound.json().await.expect("JSON");
        assert_eq!(body["error"]["code"], "host_not_allowed", "{body}");
        for path in ["/cache", "/health", "/v1/models"] {
            let read = client.get(url(path)).header("host", &evil).send().await.expect("request");
            assert_eq!(read.status(), 403, "{path}");
        }
        let named = client.get(url("/cache")).header("host", format!("homelab.lan:{port}")).send().await;
        assert_eq!(named.expect("request").status(), 200);
        let local = client.post(url("/v1/chat/completions")).header("host", format!("localhost:{port}")).json(&chat);
        assert_eq!(local.send().await.expect("request").status(), 200);
    });
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
    // The service keeps its cache, is restarted on failure, and cannot gain privileges. Its
    // cache directory passes the disk cache's check: systemd makes it the service user's
    // (DynamicUser) and writable by nobody else (the mode, and the umask for what is created
    // in it).
    let settings = [
        "CacheDirectory=firstword",
        "CacheDirectoryMode=0700",
        "UMask=0077",
        "Restart=on-failure",
        "NoNewPrivileges=yes",
        "DynamicUser=yes",
    ];
    for setting in settings {
        assert!(unit.lines().any(|l| l == setting), "{setting} missing");
    }
}
