//! The official `openai` Python SDK as the client of a real server: `tests/sdk/openai_conformance.py`
//! checks text, streaming, errors, tool calls and structured output through the SDK's own request
//! building and response parsing; `tests/sdk/openai_surface.py` checks logprobs, text completions
//! and the Responses API; `tests/sdk/openai_media.py` sends pictures and clips (chat, Responses,
//! transcriptions) to two servers with the tiny projector fixtures. `scripts/sdk-venv.sh` installs the pinned SDK (`make test` runs it
//! first); a missing SDK fails the test rather than skipping it.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::media::{audio_projector, vision_projector};
use common::python::{run_with_timeout, sdk_python};
use common::{exclusive_server, smollm2_path, spawn_server, test_config};
use firstword::{Engine, EngineConfig};

/// Far above the script's usual run (about a minute on 2 cores), so only a hang trips it.
const SCRIPT_TIMEOUT: Duration = Duration::from_secs(300);

#[tokio::test(flavor = "multi_thread")]
async fn the_openai_python_sdk_reads_every_answer() {
    run_script("openai_conformance.py").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_openai_python_sdk_reads_logprobs_completions_and_responses() {
    run_script("openai_surface.py").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_openai_python_sdk_sends_pictures_and_clips() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let start = |projector: PathBuf| {
        let config = EngineConfig { mmproj: Some(projector), ..test_config(smollm2_path()) };
        spawn_server(Engine::start(config).expect("the model and projector load"))
    };
    let (vision, audio) = (start(vision_projector()), start(audio_projector()));
    let model = vision.engine.model_info().expect("model loaded").id;
    let args = [format!("{}/v1", vision.base), format!("{}/v1", audio.base), model];
    run_checks(&root, "openai_media.py", &args).await;
}

/// Runs `tests/sdk/<script>` against the shared server; fails when any of its checks failed.
async fn run_script(script: &str) {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let (_guard, server) = exclusive_server().await;
    let model = server.engine.model_info().expect("model loaded").id;
    run_checks(&root, script, &[format!("{}/v1", server.base), model]).await;
}

/// Runs `tests/sdk/<script>` with `args`; fails when any of its checks failed.
async fn run_checks(root: &Path, script: &str, args: &[String]) {
    let mut command = Command::new(sdk_python(root));
    // -u: the lines of the checks that ran come back even when a hang gets the script killed.
    command.arg("-u").arg(root.join("tests/sdk").join(script)).args(args);
    let (status, stdout, stderr) =
        tokio::task::spawn_blocking(move || run_with_timeout(command, SCRIPT_TIMEOUT)).await.expect("script runner");
    println!("{stdout}");
    eprintln!("{stderr}");
    let status = status.unwrap_or_else(|| panic!("the SDK checks ran past {SCRIPT_TIMEOUT:?}:\n{stdout}"));
    assert!(status.success(), "SDK checks failed ({status}):\n{stdout}");
}
