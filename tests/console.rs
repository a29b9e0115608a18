//! The console at `/` in a real browser: Debian's Chromium, headless, driven by Playwright
//! (`tests/browser/console_checks.py`, in the pinned venv of `scripts/browser-venv.sh`; `make
//! test` installs both) against a real server over SmolLM2. A missing browser or driver fails
//! the test rather than skipping it. `FIRSTWORD_CONSOLE_SCREENSHOT=docs/console.png` makes the
//! typed-turn check save the screenshot the README shows.

mod common;

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use common::media::audio_projector;
use common::python::{browser_python, run_with_timeout};
use common::{exclusive_server, smollm2_path, spawn_server, spawn_server_with, test_config, TestServer};
use firstword::api::{ApiKeys, ServeOptions};
use firstword::{Engine, EngineConfig};

/// Far above a check's usual run (10 to 30 s on 2 cores), so only a hang trips it.
const CHECK_TIMEOUT: Duration = Duration::from_secs(240);

/// The key of the second server, which asks for one.
const KEY: &str = "sk-console-check";

#[tokio::test(flavor = "multi_thread")]
async fn a_typed_turn_streams_and_shows_its_time_to_first_token_and_cached_tokens() {
    run_check("typed_turn").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_tool_call_is_a_card_whose_answer_is_sent_back() {
    run_check("tool_round_trip").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_cache_view_lists_the_conversation_set_aside_for_another() {
    run_check("cache_view").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_page_asks_for_the_key_and_shows_the_401_of_a_wrong_one() {
    run_check("api_key").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn voice_mode_prefills_partial_transcripts_and_speaks_the_answer_sentence_by_sentence() {
    run_check("voice").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn speaking_over_the_answer_cuts_it_to_what_was_heard() {
    run_check("barge_in").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn with_an_audio_model_voice_mode_is_recognised_by_the_server() {
    run_check("server_recogniser").await;
}

/// A server over SmolLM2 with the audio projector fixture: the model takes audio.
fn audio_server() -> &'static str {
    static AUDIO: OnceLock<TestServer> = OnceLock::new();
    let audio = AUDIO.get_or_init(|| {
        let config = EngineConfig { mmproj: Some(audio_projector()), ..test_config(smollm2_path()) };
        spawn_server(Engine::start(config).expect("SmolLM2 with the audio projector loads"))
    });
    &audio.base
}

/// A second server over the shared engine that asks for [`KEY`] (used under the same lock).
fn keyed_server(shared: &TestServer) -> &'static str {
    static KEYED: OnceLock<TestServer> = OnceLock::new();
    let keyed = KEYED.get_or_init(|| {
        let options = ServeOptions { api_keys: ApiKeys::new([KEY.to_string()]), ..ServeOptions::default() };
        spawn_server_with(shared.engine.clone(), options)
    });
    &keyed.base
}

/// Runs check `name` of `tests/browser/console_checks.py` against the shared server (one check
/// at a time: they look at the cache); fails when the check failed.
async fn run_check(name: &str) {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let python = browser_python(&root);
    let (_guard, server) = exclusive_server().await;
    let mut command = Command::new(python);
    // -u: the lines of a check that ran come back even when a hang gets the script killed.
    command.arg("-u").arg(root.join("tests/browser/console_checks.py"));
    if name == "api_key" {
        command.arg(keyed_server(server)).arg(name).arg(KEY);
    } else if name == "server_recogniser" {
        command.arg(audio_server()).arg(name);
    } else {
        command.arg(&server.base).arg(name);
    }
    if let Ok(path) = std::env::var("FIRSTWORD_CONSOLE_SCREENSHOT") {
        command.env("FIRSTWORD_CONSOLE_SCREENSHOT", root.join(path));
    }
    let (status, stdout, stderr) =
        tokio::task::spawn_blocking(move || run_with_timeout(command, CHECK_TIMEOUT)).await.expect("check runner");
    println!("{stdout}");
    eprintln!("{stderr}");
    let status = status.unwrap_or_else(|| panic!("the browser check {name} ran past {CHECK_TIMEOUT:?}:\n{stdout}"));
    assert!(status.success(), "browser check {name} failed ({status}):\n{stdout}\n{stderr}");
    assert!(stdout.contains(&format!("PASS {name}")), "{stdout}");
}
