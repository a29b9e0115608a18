//! Fault isolation, with failures injected into a real server over SmolLM2 (the `failpoints`
//! feature, which `make test` enables): a panic on the inference thread in the middle of a
//! reply, a llama.cpp decode failure, a panic in a request handler, and a panic the engine
//! cannot recover from. Each failing request gets its error envelope; after the recoverable
//! ones the server keeps serving, and the cache, cleared, serves the same greedy answers as
//! before; after the unrecoverable one `/health` answers 503 and the binary exits non-zero. A
//! disk cache writer thread that panics turns the disk cache off, and nothing waits for it.

mod common;

use std::time::{Duration, Instant};

use common::{chunks, post, post_stream, smollm2_path, spawn_server, test_config, ServerProcess, SseData, TestServer};
use fail::FailScenario;
use firstword::Engine;
use serde_json::{json, Value};

fn server() -> TestServer {
    spawn_server(Engine::start(test_config(smollm2_path())).expect("SmolLM2 loads"))
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Runtime::new().expect("runtime")
}

/// A greedy request on a shared system prompt; `question` makes the turns differ.
fn request(question: &str) -> Value {
    json!({
        "messages": [
            {"role": "system", "content": common::long_system_prompt(300)},
            {"role": "user", "content": question},
        ],
        "max_tokens": 12,
        "temperature": 0,
    })
}

async fn health(base: &str) -> u16 {
    reqwest::get(format!("{base}/health")).await.expect("GET /health").status().as_u16()
}

async fn live_tokens(server: &TestServer) -> u64 {
    let engine = server.engine.clone();
    tokio::task::spawn_blocking(move || engine.wait_idle_blocking()).await.expect("idle");
    let cache: Value =
        reqwest::get(format!("{}/cache", server.base)).await.expect("GET /cache").json().await.expect("JSON");
    cache["live_tokens"].as_u64().expect("live_tokens")
}

/// The answer's text and its `usage.prompt_tokens_details.cached_tokens`.
async fn answer(base: &str, body: &Value) -> (String, u64) {
    let (status, reply) = post(base, body).await;
    assert_eq!(status, 200, "{reply}");
    let text = reply["choices"][0]["message"]["content"].as_str().expect("content").to_string();
    (text, reply["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().expect("cached_tokens"))
}

fn assert_envelope(body: &Value, kind: &str, code: &str) {
    assert_eq!(body["error"]["type"], kind, "{body}");
    assert_eq!(body["error"]["code"], code, "{body}");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(!message.is_empty(), "{body}");
    // A failure inside the server never shows its internals (the panic's message names the
    // failpoint): the client reads a fixed text, the log has the detail.
    assert!(!message.contains("::") && !message.contains("panic"), "{body}");
    if kind == "server_error" {
        assert!(message.contains("its log has the details"), "{body}");
    }
}

#[test]
fn a_panic_in_the_middle_of_a_reply_fails_that_request_and_the_next_is_served() {
    let scenario = FailScenario::setup();
    let server = server();
    runtime().block_on(async {
        let turn = request("Which facts mention trains?");
        let (before, _) = answer(&server.base, &turn).await;

        // A stream that has begun: the panic comes after three tokens, as an SSE error event.
        fail::cfg("engine::token", "3*off->1*panic->off").expect("failpoint");
        let mut streamed = request("Which facts mention gardens?");
        streamed["stream"] = json!(true);
        let (status, events) = post_stream(&server.base, &streamed).await;
        assert_eq!(status, 200, "the stream had begun");
        let payloads = chunks(&events);
        let error = payloads.last().expect("an error event");
        assert_envelope(error, "server_error", "internal_error");
        assert!(payloads[..payloads.len() - 1].iter().all(|chunk| chunk["choices"].is_array()), "{events:?}");
        assert!(payloads.len() > 1, "text came before the failure: {events:?}");
        assert_eq!(events.last(), Some(&SseData::Done), "the stream is closed as every stream is");
        assert_eq!(health(&server.base).await, 200);
        assert_eq!(live_tokens(&server).await, 0, "the cache was cleared");

        // Not streamed: the 500 envelope, the only legitimate 500.
        fail::cfg("engine::token", "1*panic->off").expect("failpoint");
        let (status, body) = post(&server.base, &request("Which facts mention rivers?")).await;
        assert_eq!(status, 500, "{body}");
        assert_envelope(&body, "server_error", "internal_error");

        // Served again, from an empty cache, with the answer of before; then from the cache.
        let (cold, cached) = answer(&server.base, &turn).await;
        assert_eq!(cached, 0, "nothing survived the fault");
        assert_eq!(cold, before);
        let (warm, cached) = answer(&server.base, &turn).await;
        assert!(cached > 250, "the cache serves again: {cached}");
        assert_eq!(warm, before);
    });
    scenario.teardown();
}

#[test]
fn a_decode_failure_fails_the_request_clears_the_cache_and_the_next_is_served() {
    let scenario = FailScenario::setup();
    let server = server();
    runtime().block_on(async {
        let turn = request("Which facts mention trains?");
        let (before, _) = answer(&server.base, &turn).await;
        assert!(live_tokens(&server).await > 250);

        fail::cfg("engine::decode", "1*return->off").expect("failpoint");
        let (status, body) = post(&server.base, &request("Which facts mention gardens?")).await;
        assert_eq!(status, 500, "{body}");
        assert_envelope(&body, "server_error", "decode_failed");
        assert_eq!(health(&server.base).await, 200);
        assert_eq!(live_tokens(&server).await, 0, "llama.cpp's state is unknown after a failed decode");

        let (cold, cached) = answer(&server.base, &turn).await;
        assert_eq!(cached, 0);
        assert_eq!(cold, before);
        let (warm, cached) = answer(&server.base, &turn).await;
        assert!(cached > 250, "{cached}");
        assert_eq!(warm, before);
    });
    scenario.teardown();
}

#[test]
fn a_request_whose_pictures_are_decoding_holds_up_no_other_request() {
    let scenario = FailScenario::setup();
    let config =
        firstword::EngineConfig { mmproj: Some(common::media::vision_projector()), ..test_config(smollm2_path()) };
    let server = spawn_server(Engine::start(config).expect("loads"));
    // The decoding of the pictures stops at the failpoint until the test lets it go on.
    let (reached, decoding) = std::sync::mpsc::channel::<()>();
    let (release, go_on) = std::sync::mpsc::channel::<()>();
    let (reached, go_on) = (std::sync::Mutex::new(reached), std::sync::Mutex::new(go_on));
    fail::cfg_callback("media::decode", move || {
        let _ = reached.lock().expect("lock").send(());
        let _ = go_on.lock().expect("lock").recv_timeout(Duration::from_secs(300));
    })
    .expect("failpoint");
    runtime().block_on(async {
        let base = server.base.clone();
        let pictures: Vec<Value> = [common::media::red(), common::media::checkerboard()]
            .iter()
            .map(|picture| common::media::image_part(picture))
            .chain([json!({"type": "text", "text": "Which is red?"})])
            .collect();
        let media = tokio::spawn(async move {
            post(
                &base,
                &json!({"messages": [{"role": "user", "content": pictures}], "max_tokens": 4, "temperature": 0}),
            )
            .await
        });
        tokio::task::spawn_blocking(move || decoding.recv_timeout(Duration::from_secs(120)))
            .await
            .expect("join")
            .expect("the pictures started decoding");
        // Another connection, while the first picture is decoding.
        let text =
            tokio::time::timeout(Duration::from_secs(120), post(&server.base, &request("Which facts mention trains?")))
                .await;
        let _ = release.send(());
        let _ = release.send(());
        let (status, body) = text.expect("the text request is answered while the pictures decode");
        assert_eq!(status, 200, "{body}");
        let (status, body) = media.await.expect("join");
        assert_eq!(status, 200, "the pictures' request is answered once they are decoded: {body}");
    });
    fail::remove("media::decode");
    scenario.teardown();
}

#[test]
fn a_panic_in_a_request_handler_answers_500_and_the_server_goes_on() {
    let scenario = FailScenario::setup();
    let server = server();
    runtime().block_on(async {
        fail::cfg("api::chat", "1*panic->off").expect("failpoint");
        let (status, body) = post(&server.base, &request("Which facts mention trains?")).await;
        assert_eq!(status, 500, "{body}");
        assert_envelope(&body, "server_error", "internal_error");
        assert_eq!(health(&server.base).await, 200);
        let (text, _) = answer(&server.base, &request("Which facts mention trains?")).await;
        assert!(!text.is_empty());
    });
    scenario.teardown();
}

#[test]
fn an_engine_that_cannot_recover_answers_503_and_the_binary_exits_non_zero() {
    let scenario = FailScenario::setup();
    let server = server();
    runtime().block_on(async {
        fail::cfg("engine::token", "panic").expect("failpoint");
        fail::cfg("engine::recover", "panic").expect("failpoint");
        let (status, body) = post(&server.base, &request("Which facts mention trains?")).await;
        assert_eq!(status, 500, "{body}");
        assert_envelope(&body, "server_error", "internal_error");
        let died = tokio::time::timeout(Duration::from_secs(10), server.engine.wait_died()).await.expect("died");
        assert!(died.to_string().contains("engine::recover"), "{died}");

        let response = reqwest::get(format!("{}/health", server.base)).await.expect("GET /health");
        assert_eq!(response.status().as_u16(), 503);
        assert!(response.headers().contains_key("retry-after"));
        let body: Value = response.json().await.expect("JSON");
        assert_envelope(&body, "unavailable_error", "engine_unavailable");
        let (status, body) = post(&server.base, &request("Which facts mention trains?")).await;
        assert_eq!(status, 503, "{body}");
    });
    scenario.teardown();

    // The binary: the same two failures, given in FAILPOINTS; it stops serving and exits 1.
    let args = ["--no-cache-dir", "-c", "2048", "-t", "2", "-m"].map(Into::into);
    let (mut child, base, lines) = ServerProcess::serve(&[&args[..], &[smollm2_path().into()]].concat(), |command| {
        command.env("FAILPOINTS", "engine::token=panic;engine::recover=panic");
    });
    let (status, body) = runtime().block_on(post(&base, &request("Which facts mention trains?")));
    assert_eq!(status, 500, "{body}");
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        assert!(Instant::now() < deadline, "the server did not exit");
        std::thread::sleep(Duration::from_millis(100));
    };
    let log: Vec<String> = lines.map_while(Result::ok).collect();
    assert_eq!(status.code(), Some(1), "{log:?}");
    assert!(log.iter().any(|line| line.contains("a supervisor restarts")), "{log:?}");
}

/// The disk cache's tests one at a time: the stopped writer's test bounds how long a shutdown
/// takes, which three servers started beside it on two cores would stretch.
static DISK_TESTS: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
fn a_stopped_disk_writer_turns_the_disk_cache_off_and_nothing_waits_for_it() {
    let _one_at_a_time = DISK_TESTS.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let scenario = FailScenario::setup();
    let dir = std::env::temp_dir().join(format!("firstword-faults-writer-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let config =
        firstword::EngineConfig { cache_dir: Some(dir.clone()), cache_min_tokens: 32, ..test_config(smollm2_path()) };
    let engine = Engine::start(config).expect("SmolLM2 loads");
    let turn = |question: &str| {
        common::chat(&[
            firstword::ChatMessage::system(common::long_system_prompt(300)),
            firstword::ChatMessage::user(question),
        ])
    };
    // The writer thread panics in its first write.
    fail::cfg("disk::write", "panic").expect("failpoint");
    let first = common::greedy(&engine, turn("Which facts mention trains?"), 6);
    // The idle wait flushes the disk cache: before, it waited its whole 5 s for a thread that
    // was gone.
    let started = Instant::now();
    engine.wait_idle_blocking();
    let idle = started.elapsed();
    let status = engine.cache_status();
    let disk = status.disk.expect("reported, though off");
    let off = disk.off.expect("the disk cache is off");
    assert!(off.contains("writer thread stopped") && off.contains("disk::write"), "{off}");
    assert!(disk.entries.is_empty(), "{:?}", disk.entries);
    assert!(idle < Duration::from_secs(4), "the idle wait did not wait for the stopped writer: {idle:?}");
    fail::remove("disk::write");

    // Requests are served as before (from the live cache), and nothing waits again.
    let second = common::greedy(&engine, turn("Which facts mention trains?"), 6);
    assert_eq!(second.text, first.text);
    assert!(second.usage.cached_tokens > 250, "{:?}", second.usage);
    let started = Instant::now();
    engine.wait_idle_blocking();
    drop(engine);
    let stopped = started.elapsed();
    assert!(stopped < Duration::from_secs(4), "idle and shutdown did not wait for the writer: {stopped:?}");
    let written: Vec<_> = walk_files(&dir).into_iter().filter(|p| p.extension().is_some_and(|e| e == "fwkv")).collect();
    assert!(written.is_empty(), "nothing was written after it stopped: {written:?}");
    let _ = std::fs::remove_dir_all(&dir);
    scenario.teardown();
}

/// Every file under `dir`.
fn walk_files(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() {
            found.extend(walk_files(&path));
        } else {
            found.push(path);
        }
    }
    found
}

/// A `firstword serve` over SmolLM2 with a disk cache in `dir`, failpoints set from
/// `failpoints`, ready; its log drained on a thread of its own.
fn serve_with_disk_cache(dir: &std::path::Path, failpoints: &str) -> (ServerProcess, String) {
    let args = ["-c", "2048", "-t", "2", "--cache-min-tokens", "32", "--cache-dir"].map(Into::into);
    let paths = [dir.into(), "-m".into(), smollm2_path().into()];
    ServerProcess::serve_drained(&[&args[..], &paths[..]].concat(), |command| {
        command.env("FAILPOINTS", failpoints);
    })
}

/// The tokens the base of the cache file at `path` holds.
fn base_tokens(path: &std::path::Path) -> u64 {
    let bytes = std::fs::read(path).expect("read");
    let end = 24 + u64::from_le_bytes(bytes[8..16].try_into().expect("8 bytes")) as usize;
    let header: Value = serde_json::from_slice(&bytes[24..end]).expect("a JSON header");
    header["tokens"].as_array().expect("tokens").len() as u64
}

/// F5: the process killed (SIGKILL) in the middle of the write of a conversation's next turn
/// leaves the turn before it on disk: the next start restores it, and answers the next turn as
/// the killed process did. (Before, the turn before was removed as soon as its successor was
/// queued.)
#[test]
fn a_kill_during_the_write_of_the_next_turn_leaves_the_turn_before_restorable() {
    let _one_at_a_time = DISK_TESTS.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let dir = std::env::temp_dir().join(format!("firstword-faults-kill-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let system = common::long_system_prompt(300);
    let turn1 = json!({"messages": [{"role": "system", "content": system}, {"role": "user", "content": "Which facts mention trains?"}], "max_tokens": 12, "temperature": 0});
    let rt = runtime();

    // Turn 1, written whole when the server stops.
    let (mut first, base) = serve_with_disk_cache(&dir, "");
    let (reply, _) = rt.block_on(answer(&base, &turn1));
    rustix::process::kill_process(rustix::process::Pid::from_child(&first), rustix::process::Signal::TERM)
        .expect("SIGTERM");
    assert!(first.wait().expect("exits").success());
    let files: Vec<_> = walk_files(&dir).into_iter().filter(|p| p.extension().is_some_and(|e| e == "fwkv")).collect();
    assert_eq!(files.len(), 1, "{files:?}");
    let file = &files[0];
    let length = std::fs::metadata(file).expect("file").len();
    let tokens = base_tokens(file);

    // Turn 2: restored from turn 1's file, answered, then killed while its state is appended.
    let mut turn2 = turn1.clone();
    let messages = turn2["messages"].as_array_mut().expect("messages");
    messages.push(json!({"role": "assistant", "content": reply}));
    messages.push(json!({"role": "user", "content": "And gardens?"}));
    let (mut killed, base) = serve_with_disk_cache(&dir, "disk::append=pause");
    let (second, cached) = rt.block_on(answer(&base, &turn2));
    assert!(cached >= tokens, "turn 1 came from disk: {cached} of {tokens}");
    let deadline = Instant::now() + Duration::from_secs(60);
    while std::fs::metadata(file).expect("file").len() == length {
        assert!(Instant::now() < deadline, "the append did not begin");
        std::thread::sleep(Duration::from_millis(20));
    }
    killed.kill().expect("SIGKILL");
    let _ = killed.wait();
    assert!(std::fs::metadata(file).expect("file").len() > length, "killed in the middle of the append");

    // The next start restores turn 1 and answers turn 2 as the killed server did.
    let (mut next, base) = serve_with_disk_cache(&dir, "");
    let live = rt.block_on(async {
        let cache: Value = reqwest::get(format!("{base}/cache")).await.expect("GET /cache").json().await.expect("JSON");
        cache["live_tokens"].as_u64().expect("live_tokens")
    });
    assert_eq!(live, tokens, "turn 1 restored");
    let (again, cached_again) = rt.block_on(answer(&base, &turn2));
    assert_eq!((again, cached_again), (second, cached));
    next.kill().expect("SIGKILL");
    let _ = next.wait();
    let _ = std::fs::remove_dir_all(&dir);
}

/// Stored states that llama.cpp keeps refusing: after three refused restores the prompt is
/// served from the live sequence alone, as far as that serves it. (The fourth plan once kept the
/// live sequence as far as the next entry would have served, tokens the live sequence did not
/// hold.) Four conversations each share less of the prompt than the one before; every restore
/// is refused; the reply is a fresh engine's.
#[test]
fn after_three_refused_restores_the_prompt_is_served_from_the_live_sequence_alone() {
    use firstword::{EngineConfig, GenerationRequest, Prompt, SamplingParams};
    let scenario = FailScenario::setup();
    let config = EngineConfig { cache_min_tokens: 32, ..common::one_sequence_config(smollm2_path()) };
    let engine = Engine::start(config.clone()).expect("SmolLM2 loads");
    let prompt: Vec<i32> = (0..600).map(|i| 1000 + (i * 7) % 5000).collect();
    let ask = |tokens: Vec<i32>| GenerationRequest {
        prompt: Prompt::Tokens(tokens),
        max_tokens: Some(8),
        sampling: SamplingParams::greedy(),
        ..GenerationRequest::chat(Vec::new())
    };
    let junk = |seed: i32| (0..40).map(move |i| 6000 + seed * 50 + i);
    for (n, shared) in [500, 450, 400, 350].into_iter().enumerate() {
        common::generate(&engine, ask(prompt[..shared].iter().copied().chain(junk(n as i32)).collect()));
    }
    common::generate(&engine, ask(junk(9).chain(junk(10)).collect()));
    assert!(engine.cache_status().entries.len() >= 4, "{:?}", engine.cache_status().entries);
    fail::cfg("engine::restore", "return").expect("failpoint");
    let served = common::generate(&engine, ask(prompt.clone()));
    fail::cfg("engine::restore", "off").expect("failpoint");
    let fresh = Engine::start(EngineConfig { cache_ram_mib: 0, ..config }).expect("SmolLM2 loads");
    let expected = common::generate(&fresh, ask(prompt));
    assert_eq!(served.text, expected.text, "{:?}", served.timings.cache);
    assert_eq!(served.usage.cached_tokens, 0, "nothing of the live sequence serves it: {:?}", served.timings.cache);
    scenario.teardown();
}

/// A draft model catches up with a new prompt a step at a time, not in one call: a request
/// sent during the catch-up takes a lane after at most one more step's part of it. Counted at
/// the failpoints: the catch-up's batches (64 tokens, the test's batch size) before the
/// request took its lane. In one call (as before) the request waited for all of them: about
/// twenty for this prompt.
#[test]
fn a_request_sent_while_a_drafter_catches_up_takes_a_lane_at_once() {
    use firstword::{ChatMessage, EngineConfig, GenerationRequest, SamplingParams};
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{mpsc, Arc, Mutex};

    // One failpoint scenario at a time: another test's setup or teardown clears them all.
    let scenario = FailScenario::setup();
    let config = EngineConfig {
        speculation: common::smollm2_drafting_for_itself(),
        batch_size: 64,
        ubatch_size: 64,
        parallel: 3,
        threads: 1,
        threads_batch: 1,
        ..test_config(smollm2_path())
    };
    let engine = Engine::start(config).expect("SmolLM2 loads");
    let system = common::long_system_prompt(1200);
    let ask = |user: &str, max_tokens| GenerationRequest {
        max_tokens: Some(max_tokens),
        sampling: SamplingParams::greedy(),
        ..GenerationRequest::chat(vec![ChatMessage::system(&system), ChatMessage::user(user)])
    };

    // The catch-up's batches, counted; the first holds until the request is queued.
    let batches = Arc::new(AtomicUsize::new(0));
    let at_admission = Arc::new(AtomicUsize::new(usize::MAX));
    let (reached, first_batch) = mpsc::channel();
    let (go, gate) = mpsc::channel::<()>();
    let (reached, gate) = (Mutex::new(reached), Mutex::new(gate));
    let counted = Arc::clone(&batches);
    fail::cfg_callback("engine::drafter_catch_up", move || {
        if counted.fetch_add(1, Ordering::SeqCst) == 0 {
            let _ = reached.lock().expect("lock").send(());
            let _ = gate.lock().expect("lock").recv();
        }
    })
    .expect("failpoint");
    let (seen, admitted) = (Arc::clone(&batches), Arc::clone(&at_admission));
    fail::cfg_callback("engine::lane_admitted", move || {
        let _ = admitted.compare_exchange(usize::MAX, seen.load(Ordering::SeqCst), Ordering::SeqCst, Ordering::SeqCst);
    })
    .expect("failpoint");

    let mut story = engine.submit(ask("Tell me a long story about a dragon in a kitchen.", 64)).expect("submitted");
    first_batch.recv().expect("the story's drafter began catching up");
    let mut command = engine.submit(ask("Turn on the office light.", 8)).expect("submitted");
    go.send(()).expect("the held batch goes on");
    let finished = |generation: &mut firstword::Generation| loop {
        match generation.next_blocking().expect("events until Finished") {
            firstword::Event::Finished { timings, .. } => return timings,
            firstword::Event::Failed(e) => panic!("failed: {e}"),
            _ => {}
        }
    };
    let command = finished(&mut command);
    let story = finished(&mut story);
    scenario.teardown();
    let at_admission = at_admission.load(Ordering::SeqCst);
    eprintln!(
        "{at_admission} of {} catch-up batches before the lane; story {:?}",
        batches.load(Ordering::SeqCst),
        story.draft
    );
    assert!(command.shared.is_some_and(|shared| shared.sequence > 0), "the request took a lane: {:?}", command.shared);
    assert!(at_admission <= 2, "it waited for {at_admission} of the catch-up's batches");
    assert!(batches.load(Ordering::SeqCst) >= 15, "the prompt needed many: {}", batches.load(Ordering::SeqCst));
}
