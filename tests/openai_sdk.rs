//! The official `openai` Python SDK as the client of a real server: `tests/sdk/openai_conformance.py`
//! checks text, streaming, errors, tool calls and structured output through the SDK's own request
//! building and response parsing. `scripts/sdk-venv.sh` installs the pinned SDK (`make test` runs it
//! first); a missing SDK fails the test rather than skipping it.

mod common;

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use common::exclusive_server;

/// Far above the script's usual run (about a minute on 2 cores), so only a hang trips it.
const SCRIPT_TIMEOUT: Duration = Duration::from_secs(300);

/// The venv's python, from the last stdout line of `scripts/sdk-venv.sh`.
fn sdk_python(root: &Path) -> PathBuf {
    let output =
        Command::new("bash").arg("scripts/sdk-venv.sh").current_dir(root).output().expect("bash runs sdk-venv.sh");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "scripts/sdk-venv.sh failed ({}):\n{stdout}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    PathBuf::from(stdout.lines().last().expect("sdk-venv.sh prints the python path").trim())
}

/// Reads a child's pipe to the end on its own thread, so a full pipe never blocks the child.
fn read_in_background(mut pipe: impl Read + Send + 'static) -> JoinHandle<String> {
    std::thread::spawn(move || {
        let mut bytes = Vec::new();
        let _ = pipe.read_to_end(&mut bytes);
        String::from_utf8_lossy(&bytes).into_owned()
    })
}

/// Runs `command` to its end or until `limit` (then kills it: `None`); returns stdout and stderr.
fn run_with_timeout(mut command: Command, limit: Duration) -> (Option<ExitStatus>, String, String) {
    let mut child = command.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("python starts");
    let stdout = read_in_background(child.stdout.take().expect("piped stdout"));
    let stderr = read_in_background(child.stderr.take().expect("piped stderr"));
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for python") {
            break Some(status);
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    (status, stdout.join().expect("stdout reader"), stderr.join().expect("stderr reader"))
}

#[tokio::test(flavor = "multi_thread")]
async fn the_openai_python_sdk_reads_every_answer() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let python = sdk_python(&root);
    let (_guard, server) = exclusive_server().await;
    let model = server.engine.model_info().expect("model loaded").id;
    let mut command = Command::new(python);
    // -u: the lines of the checks that ran come back even when a hang gets the script killed.
    command.arg("-u").arg(root.join("tests/sdk/openai_conformance.py")).arg(format!("{}/v1", server.base)).arg(model);
    let (status, stdout, stderr) =
        tokio::task::spawn_blocking(move || run_with_timeout(command, SCRIPT_TIMEOUT)).await.expect("script runner");
    println!("{stdout}");
    eprintln!("{stderr}");
    let status = status.unwrap_or_else(|| panic!("the SDK checks ran past {SCRIPT_TIMEOUT:?}:\n{stdout}"));
    assert!(status.success(), "SDK checks failed ({status}):\n{stdout}");
}
