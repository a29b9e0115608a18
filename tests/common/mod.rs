//! Shared helpers for integration tests: the real models and a real server on port 0.

#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::OnceLock;

use firstword::{Engine, EngineConfig};

/// The default model (fetched by `make test`; a missing file fails the test run).
pub fn smollm2_path() -> PathBuf {
    model_path("SmolLM2-135M-Instruct.Q4_1.gguf")
}

/// The sliding-window test model, which has no chat template.
pub fn gemma3_path() -> PathBuf {
    model_path("gemma-3-270m-q4_k_m.gguf")
}

/// The tiny generated `hy_v3` model with one MTP (NextN) layer and SmolLM2's tokenizer
/// (written by scripts/fixtures.sh, which `make test` runs).
pub fn tiny_mtp_path() -> PathBuf {
    model_path("tiny-mtp.gguf")
}

/// The same tiny MTP model with a 260-token vocabulary of its own.
pub fn tiny_mtp_vocab260_path() -> PathBuf {
    model_path("tiny-mtp-vocab260.gguf")
}

fn model_path(file: &str) -> PathBuf {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("models").join(file);
    assert!(
        path.exists(),
        "{} is missing: run `python3 models/fetch.py` and `bash scripts/fixtures.sh` (make test does)",
        path.display()
    );
    path
}

/// Engine settings for tests: small context, fixed threads.
pub fn test_config(path: PathBuf) -> EngineConfig {
    EngineConfig { ctx_size: Some(4096), threads: 2, threads_batch: 2, ..EngineConfig::new(path) }
}

/// A running server over SmolLM2.
pub struct TestServer {
    pub base: String,
    pub engine: Engine,
}

/// Starts (once per test binary) a server on 127.0.0.1:0 on its own runtime thread; use it
/// through [`exclusive_server`].
fn server() -> &'static TestServer {
    static SERVER: OnceLock<TestServer> = OnceLock::new();
    SERVER.get_or_init(|| {
        let engine = Engine::start(test_config(smollm2_path())).expect("SmolLM2 loads");
        spawn_server(engine)
    })
}

/// The shared server, for one test at a time: tests look at the cache, so their requests must
/// not interleave. Hold the guard for the whole test.
pub async fn exclusive_server() -> (ServerLock, &'static TestServer) {
    static LOCK: OnceLock<tokio::sync::Mutex<()>> = OnceLock::new();
    let guard = LOCK.get_or_init(|| tokio::sync::Mutex::new(())).lock().await;
    let server = server();
    (ServerLock { _guard: guard, engine: server.engine.clone() }, server)
}

/// Exclusive use of the shared server. Dropping it waits until the engine is idle: the shared
/// engine lives in a static, and a test binary that exits while llama.cpp still works (the
/// cache upkeep after a reply) can crash in llama.cpp's teardown.
pub struct ServerLock {
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
pub fn long_system_prompt(approx_tokens: usize) -> String {
    firstword::bench::synthetic_system_prompt(approx_tokens)
}

/// One parsed SSE `data:` payload.
#[derive(Debug, Clone, PartialEq)]
pub enum SseData {
    Json(serde_json::Value),
    Done,
}

/// Splits an SSE body into its `data:` payloads (comments and keep-alives skipped).
pub fn parse_sse(body: &str) -> Vec<SseData> {
    body.split("\n\n")
        .filter_map(|event| {
            let data: Vec<&str> = event.lines().filter_map(|l| l.strip_prefix("data: ")).collect();
            if data.is_empty() {
                return None;
            }
            let data = data.join("\n");
            Some(if data == "[DONE]" {
                SseData::Done
            } else {
                SseData::Json(serde_json::from_str(&data).unwrap_or_else(|e| panic!("bad SSE JSON {data:?}: {e}")))
            })
        })
        .collect()
}

/// Starts a dedicated server over `engine` on 127.0.0.1:0 (for tests needing special settings).
pub fn spawn_server(engine: Engine) -> TestServer {
    let (tx, rx) = std::sync::mpsc::channel();
    let served = engine.clone();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Runtime::new().expect("runtime");
        runtime.block_on(async move {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
            tx.send(listener.local_addr().expect("addr")).expect("report address");
            firstword::api::serve(listener, served, std::future::pending()).await.expect("serve");
        });
    });
    let address = rx.recv().expect("server address");
    TestServer { base: format!("http://{address}"), engine }
}
