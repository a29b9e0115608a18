//! Shared helpers for integration tests: the real models and a real server on port 0.

#![allow(dead_code)]

pub(crate) mod lanes;
pub(crate) mod media;
pub(crate) mod python;
pub(crate) mod tools;

use std::path::PathBuf;
use std::sync::OnceLock;

use firstword::engine::Timings;
use firstword::{Engine, EngineConfig, Event, FinishReason, GenerationRequest, Prompt, Usage};
use serde_json::{json, Value};

/// The default model (fetched by `make test`; a missing file fails the test run).
pub(crate) fn smollm2_path() -> PathBuf {
    model_path("SmolLM2-135M-Instruct.Q4_1.gguf")
}

/// The sliding-window test model, which has no chat template.
pub(crate) fn gemma3_path() -> PathBuf {
    model_path("gemma-3-270m-q4_k_m.gguf")
}

/// The tiny generated `hy_v3` model with one MTP (NextN) layer and SmolLM2's tokenizer
/// (written by scripts/fixtures.sh, which `make test` runs).
pub(crate) fn tiny_mtp_path() -> PathBuf {
    model_path("tiny-mtp.gguf")
}

/// The same tiny MTP model with a 260-token vocabulary of its own.
pub(crate) fn tiny_mtp_vocab260_path() -> PathBuf {
    model_path("tiny-mtp-vocab260.gguf")
}

pub(crate) fn model_path(file: &str) -> PathBuf {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("models").join(file);
    assert!(
        path.exists(),
        "{} is missing: run `python3 models/fetch.py` and `bash scripts/fixtures.sh` (make test does)",
        path.display()
    );
    path
}

/// Engine settings for tests: small context, two threads that do not follow the machine's
/// load (llama.cpp's sums depend on the thread count, and tests compare replies across
/// engines: the governor would make them depend on what else the machine runs).
pub(crate) fn test_config(path: PathBuf) -> EngineConfig {
    EngineConfig { ctx_size: Some(4096), threads: 2, threads_batch: 2, fixed_threads: true, ..EngineConfig::new(path) }
}

/// The test settings with one sequence, for tests that compare replies bit for bit across
/// requests or check what the RAM store alone does: with several sequences a displaced
/// conversation stays kept in its cells (tests/together.rs), and other conversations' kept
/// cells change llama.cpp's CPU sums (docs/serving.md, "Greedy replies beside others").
pub(crate) fn one_sequence_config(path: PathBuf) -> EngineConfig {
    EngineConfig { parallel: 1, ..test_config(path) }
}

/// SmolLM2 drafting for itself (the only draft pair among the test models), on every step and
/// with no confidence cut-off: drafts as deep as the depth allows, so drafting is exercised
/// even where it does not pay off on this machine.
pub(crate) fn smollm2_drafting_for_itself() -> firstword::engine::SpeculationConfig {
    firstword::engine::SpeculationConfig {
        mode: firstword::engine::SpecMode::Draft,
        draft_model: Some(smollm2_path()),
        always: true,
        draft_p_min: 0.0,
        ..firstword::engine::SpeculationConfig::default()
    }
}

/// A running server.
pub(crate) struct TestServer {
    /// `http://127.0.0.1:PORT`.
    pub base: String,
    /// The engine behind it.
    pub engine: Engine,
}

/// A server shared by the tests of one test binary, started on first use, one test at a time:
/// tests look at the cache, so their requests must not interleave.
pub(crate) struct SharedServer {
    setup: Setup,
    server: OnceLock<TestServer>,
    lock: tokio::sync::Mutex<()>,
}

/// What a shared server runs.
enum Setup {
    /// This model with the test settings.
    Model(fn() -> PathBuf),
    /// These settings.
    Config(fn() -> EngineConfig),
}

impl SharedServer {
    /// A server over the model at `model()`, not started yet.
    pub(crate) const fn new(model: fn() -> PathBuf) -> Self {
        Self { setup: Setup::Model(model), server: OnceLock::new(), lock: tokio::sync::Mutex::const_new(()) }
    }

    /// A server with the engine settings `config()`, not started yet.
    pub(crate) const fn configured(config: fn() -> EngineConfig) -> Self {
        Self { setup: Setup::Config(config), server: OnceLock::new(), lock: tokio::sync::Mutex::const_new(()) }
    }

    /// Waits for the other tests, then starts the server if it is not running yet (on
    /// 127.0.0.1:0, on its own runtime thread). Hold the guard for the whole test.
    pub(crate) async fn exclusive(&'static self) -> (ServerLock, &'static TestServer) {
        let guard = self.lock.lock().await;
        let server = self.server.get_or_init(|| {
            let config = match self.setup {
                Setup::Model(model) => test_config(model()),
                Setup::Config(config) => config(),
            };
            spawn_server(Engine::start(config).expect("the test model loads"))
        });
        (ServerLock { _guard: guard, engine: server.engine.clone() }, server)
    }
}

/// The shared server over SmolLM2, for one test at a time (see [`SharedServer::exclusive`]).
pub(crate) async fn exclusive_server() -> (ServerLock, &'static TestServer) {
    static SMOLLM2: SharedServer = SharedServer::new(smollm2_path);
    SMOLLM2.exclusive().await
}

/// Exclusive use of the shared server. Dropping it waits until the engine is idle: the shared
/// engine lives in a static, and a test binary that exits while llama.cpp still works (the
/// cache upkeep after a reply) can crash in llama.cpp's teardown.
pub(crate) struct ServerLock {
    _guard: tokio::sync::MutexGuard<'static, ()>,
    engine: Engine,
}

impl Drop for ServerLock {
    fn drop(&mut self) {
        self.engine.wait_idle_blocking();
    }
}

impl Drop for TestServer {
    /// The serving thread keeps its own engine handle alive: wait until it is idle (see
    /// [`ServerLock`]).
    fn drop(&mut self) {
        self.engine.wait_idle_blocking();
    }
}

/// A long system prompt of roughly `approx_tokens` tokens (varied text, like a real one).
pub(crate) fn long_system_prompt(approx_tokens: usize) -> String {
    firstword::bench::synthetic_system_prompt(approx_tokens)
}

/// One parsed SSE `data:` payload.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum SseData {
    /// A JSON chunk (or error event).
    Json(Value),
    /// `[DONE]`.
    Done,
}

/// An SSE body's `data:` payloads (comments and keep-alives skipped), read as the benchmark
/// reads them ([`firstword::bench::sse_data`]).
pub(crate) fn parse_sse(body: &str) -> Vec<SseData> {
    firstword::bench::sse_data(body)
        .map(|data| {
            if data == "[DONE]" {
                SseData::Done
            } else {
                SseData::Json(serde_json::from_str(data).unwrap_or_else(|e| panic!("bad SSE JSON {data:?}: {e}")))
            }
        })
        .collect()
}

/// The JSON chunks of a stream (`[DONE]` left out).
pub(crate) fn chunks(events: &[SseData]) -> Vec<&Value> {
    events
        .iter()
        .filter_map(|e| match e {
            SseData::Json(v) => Some(v),
            SseData::Done => None,
        })
        .collect()
}

/// Posts a chat completion; returns the status and the JSON body.
pub(crate) async fn post(base: &str, body: &Value) -> (u16, Value) {
    let response =
        reqwest::Client::new().post(format!("{base}/v1/chat/completions")).json(body).send().await.expect("request");
    let status = response.status().as_u16();
    (status, response.json().await.expect("JSON body"))
}

/// A greedy chat body asking `question` in at most `max_tokens`, with the fields of `extra`
/// added (or replaced).
pub(crate) fn greedy_chat(question: &str, max_tokens: u32, extra: Value) -> Value {
    let mut body =
        json!({"messages": [{"role": "user", "content": question}], "max_tokens": max_tokens, "temperature": 0});
    for (key, value) in extra.as_object().expect("an object") {
        body[key] = value.clone();
    }
    body
}

/// Posts `body` to `path` (`/v1/completions`, `/tokenize`, ...); returns the status and the
/// JSON body.
pub(crate) async fn post_json(base: &str, path: &str, body: &Value) -> (u16, Value) {
    let response = reqwest::Client::new().post(format!("{base}{path}")).json(body).send().await.expect("request");
    let status = response.status().as_u16();
    (status, response.json().await.expect("JSON body"))
}

/// Posts `body` to `path` and reads the event stream: each event's name (`event:`, if any) and
/// its `data:` as JSON (`[DONE]` as the string "[DONE]").
pub(crate) async fn post_events(base: &str, path: &str, body: &Value) -> (u16, Vec<(Option<String>, Value)>) {
    let response = reqwest::Client::new().post(format!("{base}{path}")).json(body).send().await.expect("request");
    let status = response.status().as_u16();
    let text = response.text().await.expect("body");
    let events = text
        .split("\n\n")
        .filter(|block| !block.trim().is_empty())
        .filter_map(|block| {
            let mut name = None;
            let mut data = None;
            for line in block.lines() {
                if let Some(value) = line.strip_prefix("event:") {
                    name = Some(value.trim().to_string());
                } else if let Some(value) = line.strip_prefix("data:") {
                    let value = value.trim();
                    data = Some(serde_json::from_str(value).unwrap_or_else(|_| Value::String(value.to_string())));
                }
            }
            data.map(|data| (name, data))
        })
        .collect();
    (status, events)
}

/// Posts a streamed chat completion; checks that the answer is an event stream and returns
/// the status and the stream's payloads.
pub(crate) async fn post_stream(base: &str, body: &Value) -> (u16, Vec<SseData>) {
    let response =
        reqwest::Client::new().post(format!("{base}/v1/chat/completions")).json(body).send().await.expect("request");
    let status = response.status().as_u16();
    assert_eq!(
        response.headers().get("content-type").and_then(|v| v.to_str().ok()),
        Some("text/event-stream"),
        "streams are SSE"
    );
    (status, parse_sse(&response.text().await.expect("body")))
}

/// Posts `body` with `stream: true`; checks for status 200 and a stream that ends with
/// `[DONE]`, and returns its JSON chunks.
pub(crate) async fn stream_chunks(base: &str, body: &Value) -> Vec<Value> {
    let mut body = body.clone();
    body["stream"] = json!(true);
    let (status, events) = post_stream(base, &body).await;
    assert_eq!(status, 200, "{events:?}");
    assert_eq!(events.last(), Some(&SseData::Done), "{events:?}");
    chunks(&events).into_iter().cloned().collect()
}

/// How a generation ended, with all its text.
pub(crate) struct Generated {
    /// All the text, in order.
    pub text: String,
    /// Why it ended.
    pub reason: FinishReason,
    /// Token counts.
    pub usage: Usage,
    /// Time spent, and the drafter's counts when speculating.
    pub timings: Timings,
    /// Each token's log-probabilities, when the request asked for them.
    pub logprobs: Vec<firstword::engine::TokenLogprob>,
}

/// Submits `request` and reads its events to the end (blocking); panics if the generation
/// fails or ends without [`Event::Finished`].
pub(crate) fn generate(engine: &Engine, request: GenerationRequest) -> Generated {
    read(engine.submit(request).expect("submitted"), None).0
}

/// A reply read to its end (blocking), with when it ended; `first_pieces` gets one message
/// once that many pieces of text have come.
pub(crate) fn read(
    mut generation: firstword::Generation,
    first_pieces: Option<(usize, std::sync::mpsc::Sender<()>)>,
) -> (Generated, std::time::Instant) {
    let mut text = String::new();
    let mut logprobs = Vec::new();
    let mut pieces = 0;
    while let Some(event) = generation.next_blocking() {
        match event {
            Event::Text(piece) => {
                text.push_str(&piece);
                pieces += 1;
                if let Some((n, signal)) = &first_pieces {
                    if pieces == *n {
                        let _ = signal.send(());
                    }
                }
            }
            Event::Logprobs(tokens) => logprobs.extend(tokens),
            Event::Finished { reason, usage, timings } => {
                return (Generated { text, reason, usage, timings, logprobs }, std::time::Instant::now());
            }
            Event::Failed(e) => panic!("generation failed: {e}"),
            Event::Started { .. } => {}
        }
    }
    panic!("no Finished event");
}

/// Submits `story` and returns its reader, on a thread of its own, once the story has
/// streamed 8 pieces of text (a reply under way, for a request sent beside it).
pub(crate) fn streaming(
    engine: &Engine,
    story: GenerationRequest,
) -> std::thread::JoinHandle<(Generated, std::time::Instant)> {
    let (signal, eighth) = std::sync::mpsc::channel();
    let generation = engine.submit(story).expect("submitted");
    let reader = std::thread::spawn(move || read(generation, Some((8, signal))));
    eighth.recv().expect("the story streams");
    reader
}

/// Greedy generation of up to `max_tokens` for `prompt` (blocking).
pub(crate) fn greedy(engine: &Engine, prompt: Prompt, max_tokens: u32) -> Generated {
    let request = GenerationRequest {
        prompt,
        max_tokens: Some(max_tokens),
        sampling: firstword::SamplingParams::greedy(),
        ..GenerationRequest::chat(Vec::new())
    };
    generate(engine, request)
}

/// A fresh engine with the store off evaluates `prompt` as a cached request did: its first
/// `cached` tokens alone, then the rest; returns the greedy reply (the proof that a reused
/// prefix did not change the output).
pub(crate) fn fresh_split(config: &EngineConfig, prompt: &Prompt, cached: u32, max_tokens: u32) -> Generated {
    let fresh = Engine::start(EngineConfig { cache_ram_mib: 0, ..config.clone() }).expect("model loads");
    let tokens = fresh.tokenize_blocking(prompt).expect("tokenize");
    greedy(&fresh, Prompt::Tokens(tokens[..cached as usize].to_vec()), 0);
    let answer = greedy(&fresh, Prompt::Tokens(tokens), max_tokens);
    assert_eq!(answer.usage.cached_tokens, cached, "the same split on both sides");
    answer
}

/// A chat prompt of `messages`, without tools.
pub(crate) fn chat(messages: &[firstword::ChatMessage]) -> Prompt {
    Prompt::chat(messages.to_vec(), Vec::new())
}

/// Starts a dedicated server over `engine` on 127.0.0.1:0 (for tests needing special settings).
pub(crate) fn spawn_server(engine: Engine) -> TestServer {
    spawn_server_with(engine, firstword::api::ServeOptions::default())
}

/// [`spawn_server`] with these server options (API keys, limits).
pub(crate) fn spawn_server_with(engine: Engine, options: firstword::api::ServeOptions) -> TestServer {
    let (tx, rx) = std::sync::mpsc::channel();
    let served = engine.clone();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Runtime::new().expect("runtime");
        runtime.block_on(async move {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
            tx.send(listener.local_addr().expect("addr")).expect("report address");
            firstword::api::serve_with(listener, served, options, std::future::pending()).await.expect("serve");
        });
    });
    let address = rx.recv().expect("server address");
    TestServer { base: format!("http://{address}"), engine }
}

/// Token prompts for gemma-3 whose common prefix ends exactly at `cut`: turn 1 is the first
/// `turn1_len` tokens of a long system prompt and a question, turn 2 the first `cut` and
/// another question.
///
/// gemma-3's Q4_K CPU kernels make a token's KV depend (in the last bits) on the size of the
/// batch it was computed in, and this base model's chat answers are near ties, so cuts sit on
/// ubatch boundaries (multiples of 512): the prefix is then computed in identical batches on
/// both sides and the comparison is exact.
pub(crate) fn gemma_turns(engine: &Engine, turn1_len: usize, cut: usize) -> (Prompt, Prompt) {
    let tokenize = |text: &str| engine.tokenize_blocking(&Prompt::Text(text.to_string())).expect("tokenize");
    let bos = tokenize("");
    let without_bos = |text: &str| tokenize(text)[bos.len()..].to_vec();
    let base = tokenize(&long_system_prompt(2500));
    assert!(base.len() > 1700, "{}", base.len());
    let mut turn1 = base[..turn1_len].to_vec();
    turn1.extend(without_bos("\nQuestion: which facts mention trains?\nAnswer:"));
    let mut turn2 = base[..cut].to_vec();
    turn2.extend(without_bos("\nQuestion: list three facts about gardens.\nAnswer:"));
    assert_ne!(turn2[cut], base[cut], "the prompts diverge exactly at the cut");
    (Prompt::Tokens(turn1), Prompt::Tokens(turn2))
}

/// What the cache holds once the engine is idle (the upkeep after the last reply done).
pub(crate) fn settled_cache(engine: &Engine) -> firstword::CacheStatus {
    engine.wait_idle_blocking();
    engine.cache_status()
}

/// A failpoint (the `failpoints` feature) that holds the thread reaching it until released or
/// dropped, and tells the test that it was reached: a test gates on where the engine is, not
/// on how long things take.
pub(crate) struct Hold {
    name: &'static str,
    reached: std::sync::mpsc::Receiver<()>,
    open: std::sync::Arc<(std::sync::Mutex<bool>, std::sync::Condvar)>,
}

impl Hold {
    /// Holds every thread that reaches failpoint `name` from now on.
    pub(crate) fn at(name: &'static str) -> Self {
        let (tell, reached) = std::sync::mpsc::channel();
        let tell = std::sync::Mutex::new(tell);
        let open = std::sync::Arc::new((std::sync::Mutex::new(false), std::sync::Condvar::new()));
        let gate = std::sync::Arc::clone(&open);
        fail::cfg_callback(name, move || {
            let _ = tell.lock().expect("lock").send(());
            let (lock, opened) = &*gate;
            let mut is_open = lock.lock().expect("lock");
            while !*is_open {
                is_open = opened.wait(is_open).expect("lock");
            }
        })
        .expect("failpoint");
        Self { name, reached, open }
    }

    /// Waits until a thread is held there (failing after five minutes).
    pub(crate) async fn reached(&self) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(300);
        while self.reached.try_recv().is_err() {
            assert!(std::time::Instant::now() < deadline, "nothing reached failpoint {}", self.name);
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
    }

    /// Lets the held thread go on; the failpoint holds nothing more.
    pub(crate) fn release(&self) {
        fail::remove(self.name);
        let (lock, opened) = &*self.open;
        *lock.lock().expect("lock") = true;
        opened.notify_all();
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        self.release();
    }
}

/// Waits until `done(engine)` holds (failing after five minutes): an observed state of the
/// engine, such as a request being queued.
pub(crate) async fn until(engine: &Engine, what: &str, done: impl Fn(&Engine) -> bool) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(300);
    while !done(engine) {
        assert!(std::time::Instant::now() < deadline, "never: {what}");
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
}

/// A server process that is killed when dropped, so that a failing test leaves none running.
pub(crate) struct ServerProcess(pub(crate) std::process::Child);

impl std::ops::Deref for ServerProcess {
    type Target = std::process::Child;
    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

impl std::ops::DerefMut for ServerProcess {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.0
    }
}

/// The lines of a server process's log not read yet.
pub(crate) type LogLines = std::io::Lines<std::io::BufReader<std::process::ChildStderr>>;

impl ServerProcess {
    /// `firstword serve --port PORT` with `args` on a free port of 127.0.0.1, `configure` setting
    /// the rest (its environment), once it logged that it is ready: the process, its base URL
    /// and the log lines after that one.
    pub(crate) fn serve(
        args: &[std::ffi::OsString],
        configure: impl FnOnce(&mut std::process::Command),
    ) -> (Self, String, LogLines) {
        use std::io::BufRead;
        let port = std::net::TcpListener::bind("127.0.0.1:0").expect("free port").local_addr().expect("addr").port();
        let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_firstword"));
        command.args(["serve", "--port", &port.to_string()]).args(args).stderr(std::process::Stdio::piped());
        configure(&mut command);
        let mut child = Self(command.spawn().expect("starts"));
        let mut lines = std::io::BufReader::new(child.stderr.take().expect("stderr")).lines();
        let ready = lines.by_ref().map_while(Result::ok).any(|line| line.contains("ready"));
        assert!(ready, "the server became ready");
        (child, format!("http://127.0.0.1:{port}"), lines)
    }

    /// [`ServerProcess::serve`], its later log read and dropped on a thread of its own.
    pub(crate) fn serve_drained(
        args: &[std::ffi::OsString],
        configure: impl FnOnce(&mut std::process::Command),
    ) -> (Self, String) {
        let (child, base, lines) = Self::serve(args, configure);
        std::thread::spawn(move || lines.for_each(drop));
        (child, base)
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
