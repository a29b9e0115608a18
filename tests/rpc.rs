//! llama.cpp's RPC backend (`--rpc`): a model split over two `firstword rpc-server`s and the
//! local CPU answers as the same model run locally (both test models), turn after turn (the
//! prefix reused), after a restart from the disk cache onto fresh servers, and with a local
//! draft model (a CPU
//! rpc-server never repacks weights, so the local side of the comparison does not either:
//! gemma-3's Q4_K weights are repacked by default, and its replies then differ in the last bits
//! of the sums, seen tipping a greedy token); an
//! endpoint where no RPC server answers is refused at start, naming it and what to run there; a
//! server lost mid-reply (killed, or frozen past `--rpc-timeout`) ends the process with a message
//! naming the servers, never a hang; an
//! rpc-server refuses a public address.
//!
//! ggml-rpc's sockets are not close-on-exec: a child spawned while this process holds a
//! connection would keep it open after this process closed it, and the rpc-server (one client
//! at a time) would never take the next one. Children are spawned with every inherited
//! descriptor past the standard three closed on exec.
#![allow(unsafe_code)]

mod common;

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{chat, gemma3_path, greedy, long_system_prompt, smollm2_drafting_for_itself, smollm2_path, test_config};
use firstword::engine::{probe, RpcEndpoint, RpcProbeError};
use firstword::{CacheMiss, CacheSource, ChatMessage, Engine, EngineConfig, EngineError};

const FIRSTWORD: &str = env!("CARGO_BIN_EXE_firstword");

/// A port nothing listens on (just released).
fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
    listener.local_addr().expect("address").port()
}

/// Spawns `command` holding none of this process' descriptors but its standard streams.
fn spawn_alone(command: &mut Command) -> Child {
    use std::os::unix::process::CommandExt;
    // SAFETY: between fork and exec the hook only calls `fcntl` (async-signal-safe), on
    // descriptor numbers it does not keep; a number that is not open fails and is ignored.
    unsafe {
        command.pre_exec(|| {
            for fd in 3..4096 {
                let fd = std::os::fd::BorrowedFd::borrow_raw(fd);
                let _ = rustix::io::fcntl_setfd(fd, rustix::io::FdFlags::CLOEXEC);
            }
            Ok(())
        });
    }
    command.spawn().expect("spawns")
}

/// A `firstword rpc-server` on 127.0.0.1, killed when dropped.
struct RpcServer {
    child: Child,
    endpoint: RpcEndpoint,
}

impl RpcServer {
    /// Starts one computing with two threads, as the local engines of these tests do
    /// (llama.cpp's CPU sums depend on the thread count), once it answers the RPC greeting.
    fn start() -> Self {
        let port = free_port();
        let child = spawn_alone(
            Command::new(FIRSTWORD)
                .args(["rpc-server", "--port", &port.to_string(), "--threads", "2"])
                .stdout(Stdio::null())
                .stderr(Stdio::null()),
        );
        let endpoint: RpcEndpoint = format!("127.0.0.1:{port}").parse().expect("an endpoint");
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            match probe(&endpoint, Duration::from_secs(10)) {
                Ok(()) => break,
                Err(RpcProbeError::Unreachable(_)) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(e) => panic!("the rpc-server at {endpoint} does not answer: {e}"),
            }
        }
        Self { child, endpoint }
    }
}

impl Drop for RpcServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A directory of its own for one test, removed at the end.
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("firstword-rpc-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("temp dir");
        Self(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Stops `engine`, waits for its inference thread to end and drops it, the model with it: its
/// buffers on the rpc-servers are freed over the network, so the servers must outlive it
/// (ggml-rpc aborts the process when a server it still talks to has gone).
fn stop(engine: Engine) {
    engine.shutdown();
    engine.wait_stopped();
    drop(engine);
}

/// The test settings with `layers` of the model's layers on the servers' devices (the rest on
/// the local CPU).
fn split_config(model: PathBuf, servers: &[&RpcServer], layers: u32) -> EngineConfig {
    EngineConfig {
        rpc: servers.iter().map(|server| server.endpoint.clone()).collect(),
        n_gpu_layers: layers,
        repack: false,
        ..test_config(model)
    }
}

/// A conversation's turns: a long system prompt and a question, then each reply and the next
/// question.
fn conversation(replies: &[&str]) -> Vec<ChatMessage> {
    let questions = ["Which facts mention trains?", "And gardens?", "Which one is the oldest?"];
    let mut messages = vec![ChatMessage::system(long_system_prompt(300)), ChatMessage::user(questions[0])];
    for (reply, question) in replies.iter().zip(&questions[1..]) {
        messages.push(ChatMessage::assistant(*reply));
        messages.push(ChatMessage::user(*question));
    }
    messages
}

/// Three turns of one conversation, split over two rpc-servers (the engine restarted from its
/// disk cache before the third) and locally: the same replies, the same prefixes reused.
fn answers_as_locally(model: PathBuf, layers: u32) {
    let (first, second) = (RpcServer::start(), RpcServer::start());
    let dir = TempDir::new(&format!("{layers}"));
    let config = EngineConfig {
        cache_dir: Some(dir.0.clone()),
        cache_min_tokens: 32,
        ..split_config(model.clone(), &[&first, &second], layers)
    };
    let local = Engine::start(EngineConfig { repack: false, ..test_config(model) }).expect("model loads");
    let split = Engine::start(config.clone()).expect("model loads over RPC");

    // Both servers' devices hold layers, named by their endpoints, after the local CPU.
    let devices = split.model_info().expect("ready").devices;
    let described: Vec<(&str, &str)> = devices.iter().map(|d| (d.backend.as_str(), d.description.as_str())).collect();
    assert_eq!(described.len(), 3, "{devices:?}");
    assert_eq!(described[0].0, "CPU", "{devices:?}");
    assert_eq!(described[1..], [("RPC", &*first.endpoint.to_string()), ("RPC", &*second.endpoint.to_string())]);
    assert!(devices[1].memory_total > 0, "the server's memory is asked: {devices:?}");

    let turn1 = greedy(&split, chat(&conversation(&[])), 16);
    assert_eq!(turn1.text, greedy(&local, chat(&conversation(&[])), 16).text, "turn 1 split differs from local");
    let turn2 = greedy(&split, chat(&conversation(&[&turn1.text])), 16);
    let local2 = greedy(&local, chat(&conversation(&[&turn1.text])), 16);
    assert!(turn2.usage.cached_tokens > turn1.usage.prompt_tokens, "turn 1 reused: {:?}", turn2.timings.cache);
    assert_eq!(turn2.usage.cached_tokens, local2.usage.cached_tokens, "the same split on both sides");
    assert_eq!(turn2.text, local2.text, "turn 2 split differs from local");

    // A restart, once the conversation is written, on two fresh rpc-servers: nothing of the
    // old KV is left in their memory, so the restored state is all the remote layers hold.
    split.wait_idle_blocking();
    stop(split);
    drop((first, second));
    let (first, second) = (RpcServer::start(), RpcServer::start());
    let config = EngineConfig { rpc: vec![first.endpoint.clone(), second.endpoint.clone()], ..config };
    let restarted = Engine::start(config).expect("model loads over RPC again");
    let turn3 = greedy(&restarted, chat(&conversation(&[&turn1.text, &turn2.text])), 16);
    let local3 = greedy(&local, chat(&conversation(&[&turn1.text, &turn2.text])), 16);
    let cache = turn3.timings.cache.clone();
    assert_eq!((cache.source, cache.reason), (CacheSource::Disk, Some(CacheMiss::Restored)), "{cache:?}");
    assert_eq!(turn3.usage.cached_tokens, local3.usage.cached_tokens, "the same split on both sides");
    assert_eq!(turn3.text, local3.text, "turn 3 from disk over RPC differs from local");
    stop(restarted);
}

#[test]
fn smollm2_split_over_two_rpc_servers_answers_as_locally() {
    // 20 of its 30 layers remote, 10 local.
    answers_as_locally(smollm2_path(), 20);
}

#[test]
fn gemma3_split_over_two_rpc_servers_answers_as_locally() {
    // 12 of its 18 layers remote, 6 local; its sliding window keeps checkpoints.
    answers_as_locally(gemma3_path(), 12);
}

#[test]
fn a_local_draft_model_drafts_for_a_model_split_over_rpc() {
    let server = RpcServer::start();
    let config =
        EngineConfig { speculation: smollm2_drafting_for_itself(), ..split_config(smollm2_path(), &[&server], 24) };
    let drafting = Engine::start(config).expect("model loads over RPC");
    let local = Engine::start(test_config(smollm2_path())).expect("model loads");
    let question = chat(&[ChatMessage::user("Name three rivers of Europe and say one thing about each.")]);
    let drafted = greedy(&drafting, question.clone(), 40);
    assert!(drafted.timings.draft.is_some_and(|d| d.accepted > 0), "drafts were made: {:?}", drafted.timings);
    assert_eq!(drafted.text, greedy(&local, question, 40).text);
    stop(drafting);
}

/// A required tool call (grammar-constrained) prefilled with `/v1/prefill` and parked, then
/// adopted by the request, over RPC: the answer a local server gives the request alone.
#[test]
fn a_parked_tool_call_over_rpc_is_adopted_and_equals_the_local_answer() {
    let server = RpcServer::start();
    let split = common::spawn_server(Engine::start(split_config(smollm2_path(), &[&server], 20)).expect("loads"));
    let local = common::spawn_server(
        Engine::start(EngineConfig { repack: false, ..test_config(smollm2_path()) }).expect("loads"),
    );
    let tools = serde_json::json!([{"type": "function", "function": {
        "name": "set_timer", "description": "Start a timer.",
        "parameters": {"type": "object", "properties": {"minutes": {"type": "integer"}}, "required": ["minutes"]},
    }}]);
    let request = serde_json::json!({
        "messages": [
            {"role": "system", "content": "You are a helpful home assistant."},
            {"role": "user", "content": "Set a timer for ten minutes."},
        ],
        "max_tokens": 64, "temperature": 0, "tools": tools, "tool_choice": "required", "parallel_tool_calls": false,
    });
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(async {
        let mut ahead = request.clone();
        ahead["pregenerate"] = serde_json::json!(8);
        let (status, report) = common::post_json(&split.base, "/v1/prefill", &ahead).await;
        assert_eq!(status, 200, "{report}");
        let (status, answer) = common::post(&split.base, &request).await;
        assert_eq!(status, 200, "{answer}");
        assert_eq!(answer["timings"]["cache"]["adopted"], 8, "{answer}");
        let (status, expected) = common::post(&local.base, &request).await;
        assert_eq!(status, 200, "{expected}");
        let call = |answer: &serde_json::Value| answer["choices"][0]["message"]["tool_calls"][0]["function"].clone();
        assert_eq!(call(&answer), call(&expected), "{answer}\n{expected}");
        assert_eq!(call(&answer)["name"], "set_timer", "{answer}");
    });
    // The HTTP server keeps a handle, and the model, until the process ends: stopped, the
    // engine sends nothing more to the server.
    split.engine.shutdown();
    split.engine.wait_stopped();
}

#[test]
fn an_endpoint_where_no_rpc_server_answers_is_refused_naming_it_and_what_to_run() {
    let endpoint: RpcEndpoint = format!("127.0.0.1:{}", free_port()).parse().expect("an endpoint");
    let config = EngineConfig { rpc: vec![endpoint.clone()], ..test_config(smollm2_path()) };
    let Err(refused) = Engine::start(config) else { panic!("an endpoint where nothing listens was accepted") };
    assert!(matches!(refused, EngineError::Rpc { .. }), "{refused:?}");
    let message = refused.to_string();
    assert!(message.contains(&endpoint.to_string()) && message.contains("firstword rpc-server"), "{message}");

    // And from the command line: a non-zero exit with the same message, in bounded time.
    let out = spawn_alone(
        Command::new(FIRSTWORD)
            .args(["serve", "--no-cache-dir", "--port", "0", "-m"])
            .arg(smollm2_path())
            .args(["--rpc", &endpoint.to_string()])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped()),
    )
    .wait_with_output()
    .expect("runs");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains(&format!("cannot use the RPC server at {endpoint}")), "{stderr}");
    assert!(stderr.contains("firstword rpc-server --host"), "{stderr}");
}

#[test]
fn an_rpc_server_refuses_a_public_or_every_interface_address() {
    for host in ["0.0.0.0", "8.8.8.8"] {
        let out = spawn_alone(
            Command::new(FIRSTWORD)
                .args(["rpc-server", "--host", host, "--port", "1"])
                .stdout(Stdio::piped())
                .stderr(Stdio::piped()),
        )
        .wait_with_output()
        .expect("runs");
        assert!(!out.status.success(), "{host} served");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains(&format!("refusing to listen on {host}")) && stderr.contains("no authentication"),
            "{stderr}"
        );
    }
}

/// What happens to the rpc-server while a reply streams.
#[derive(Clone, Copy)]
enum Loss {
    /// It is killed: its connection closes.
    Killed,
    /// It is stopped (SIGSTOP): its connection stays open and nothing answers.
    Frozen,
}

/// Serves SmolLM2 split over one rpc-server, streams a long reply and does `loss` to the
/// server once the reply streams: the stream ends, the process exits non-zero within bounded
/// time; returns its log.
fn lose_the_server_mid_reply(loss: Loss) -> (RpcServer, String) {
    let mut server = RpcServer::start();
    let port = free_port();
    let mut child = spawn_alone(
        Command::new(FIRSTWORD)
            .args(["serve", "--no-cache-dir", "-c", "2048", "-t", "2", "--port", &port.to_string(), "-m"])
            .arg(smollm2_path())
            .args(["--rpc", &server.endpoint.to_string(), "--ngl", "20", "--rpc-timeout", "2"])
            .stderr(Stdio::piped()),
    );
    let mut lines = BufReader::new(child.stderr.take().expect("stderr")).lines();
    let mut log = String::new();
    for line in lines.by_ref() {
        let line = line.expect("a log line");
        log.push_str(&line);
        log.push('\n');
        if line.contains("ready") {
            break;
        }
    }
    assert!(log.contains("ready"), "{log}");
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let ended = runtime.block_on(async {
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
        match loss {
            Loss::Killed => {
                let _ = server.child.kill();
                let _ = server.child.wait();
            }
            Loss::Frozen => {
                let status = Command::new("kill").args(["-STOP", &server.child.id().to_string()]).status();
                assert!(status.is_ok_and(|s| s.success()), "SIGSTOP sent");
            }
        }
        // The stream ends (the process is gone), never hangs.
        tokio::time::timeout(Duration::from_secs(120), async { while let Ok(Some(_)) = response.chunk().await {} })
            .await
            .is_ok()
    });
    assert!(ended, "the stream did not end after its RPC server was lost");
    let status = child.wait().expect("exits");
    assert!(!status.success(), "exit status {status}");
    for line in lines.map_while(Result::ok) {
        log.push_str(&line);
        log.push('\n');
    }
    (server, log)
}

#[test]
fn a_server_lost_mid_reply_ends_the_process_with_a_message_naming_the_servers() {
    let (server, log) = lose_the_server_mid_reply(Loss::Killed);
    assert!(log.contains("stopped answering") && log.contains(&server.endpoint.to_string()), "{log}");
}

#[test]
fn a_server_that_freezes_mid_reply_ends_the_process_after_the_rpc_timeout() {
    let (server, log) = lose_the_server_mid_reply(Loss::Frozen);
    assert!(
        log.contains("has waited more than 2 s on the RPC servers") && log.contains(&server.endpoint.to_string()),
        "{log}"
    );
}
