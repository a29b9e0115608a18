//! The grading page of `firstword bench grade` in a real browser: Debian's Chromium, headless,
//! driven by Playwright (`tests/browser/grade_checks.py`, in the pinned venv of
//! `scripts/browser-venv.sh`; `make test` installs both), against a grading server over a run
//! directory written here (no model needed). Each check gets a run of its own. A missing
//! browser or driver fails the test rather than skipping it. `FIRSTWORD_GRADE_SCREENSHOT=PATH`
//! makes the names check save screenshots of the page before and after the reveal.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::python::{browser_python, run_with_timeout};
use firstword::bench::grade::serve_grading;
use firstword::bench::quality::{Answer, AnsweredCall, QualityItem, QualitySet, RunDir};
use serde_json::{json, Value};

/// Far above a check's usual run (a few seconds), so only a hang trips it.
const CHECK_TIMEOUT: Duration = Duration::from_secs(240);

/// The servers of the run (distinctive: the checks look for any trace of them).
const ALPHA: &str = "server-alpha-7731";
const BRAVO: &str = "server-bravo-5520";

#[tokio::test(flavor = "multi_thread")]
async fn the_servers_names_reach_the_page_only_after_the_scores_are_saved() {
    run_check("names_hidden").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_reload_resumes_at_the_first_unit_not_graded_and_the_grade_is_in_the_file() {
    run_check("resume").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn every_item_is_graded_and_revealed_with_the_keyboard_alone() {
    run_check("keyboard").await;
}

/// An item asked with the home tools or none.
fn item(id: &str, messages: Vec<Value>, home_tools: bool) -> QualityItem {
    QualityItem {
        id: id.into(),
        messages,
        tools: home_tools.then(|| json!("home")),
        reference: Some(format!("What a good answer to {id} says.")),
        rubric: Some("One short sentence.".into()),
        max_tokens: None,
    }
}

/// A run of four items, each answered by [`ALPHA`] and [`BRAVO`]: `capital` and `timer`
/// differently, `lights` (a follow-up after a tool call) differently, `hello` the same.
fn write_run(path: &Path) -> RunDir {
    let dir = RunDir::create(path).expect("a run directory");
    let user = |text: &str| json!({"role": "user", "content": text});
    let earlier_call = json!({"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
        "function": {"name": "HassTurnOn", "arguments": "{\"name\": \"kitchen light\"}"}}]});
    let items = vec![
        item("capital", vec![user("What is the capital of France?")], false),
        item(
            "lights",
            vec![
                user("Turn on the kitchen light."),
                earlier_call,
                json!({"role": "tool", "tool_call_id": "call_1", "content": "{\"success\": true}"}),
                user("And the one in the hall?"),
            ],
            true,
        ),
        item("hello", vec![user("Say hello.")], false),
        item("timer", vec![user("Set a timer for ten minutes.")], true),
    ];
    dir.write_items(&QualitySet { items }).expect("items");
    let call = |name: &str, arguments: &str| AnsweredCall { name: name.into(), arguments: arguments.into() };
    let answers = [
        ("capital", ALPHA, "Paris is the capital of France.", None),
        ("capital", BRAVO, "I believe it is Lyon.", None),
        ("lights", ALPHA, "", Some(call("HassTurnOn", "{\"name\": \"hall light\"}"))),
        ("lights", BRAVO, "Done, the hall light is on.", None),
        ("hello", ALPHA, "Hello! How can I help?", None),
        ("hello", BRAVO, "Hello! How can I help?", None),
        ("timer", ALPHA, "Ten minutes, starting now.", None),
        ("timer", BRAVO, "", Some(call("set_timer", "{\"minutes\": 10}"))),
    ];
    for (item, server, content, tool_call) in answers {
        let answer = Answer {
            item: item.into(),
            server: server.into(),
            content: content.into(),
            tool_calls: tool_call.into_iter().collect(),
            finish_reason: Some("stop".into()),
            ..Answer::default()
        };
        dir.append_answer(&answer).expect("an answer");
    }
    dir
}

/// Runs check `name` of `tests/browser/grade_checks.py` against a grading server over a new
/// run; fails when the check failed. One browser at a time (the machine has few cores).
async fn run_check(name: &str) {
    static ONE_BROWSER: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    let _turn = ONE_BROWSER.lock().await;
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let python = browser_python(&root);
    let run =
        std::env::temp_dir().join(format!("firstword-grade-page-{name}-{}-{}", std::process::id(), fastrand::u32(..)));
    let dir = write_run(&run);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("a port");
    let base = format!("http://{}", listener.local_addr().expect("an address"));
    let server = tokio::spawn(serve_grading(dir, listener));

    let mut command = Command::new(python);
    // -u: the lines of a check that ran come back even when a hang gets the script killed.
    command.arg("-u").arg(root.join("tests/browser/grade_checks.py")).arg(&base).arg(&run).arg(name);
    if let Ok(path) = std::env::var("FIRSTWORD_GRADE_SCREENSHOT") {
        command.env("FIRSTWORD_GRADE_SCREENSHOT", root.join(path));
    }
    let (status, stdout, stderr) =
        tokio::task::spawn_blocking(move || run_with_timeout(command, CHECK_TIMEOUT)).await.expect("check runner");
    server.abort();
    println!("{stdout}");
    eprintln!("{stderr}");
    let status = status.unwrap_or_else(|| panic!("the browser check {name} ran past {CHECK_TIMEOUT:?}:\n{stdout}"));
    assert!(status.success(), "browser check {name} failed ({status}):\n{stdout}\n{stderr}");
    assert!(stdout.contains(&format!("PASS {name}")), "{stdout}");
    let _ = std::fs::remove_dir_all(&run);
}
