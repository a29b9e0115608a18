//! The pinned Python venv of the tests (`scripts/sdk-venv.sh`: the openai SDK, Prometheus's
//! parser) and running its scripts with a time limit.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The venv's python, from the last stdout line of `scripts/sdk-venv.sh`.
pub(crate) fn sdk_python(root: &Path) -> PathBuf {
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
pub(crate) fn run_with_timeout(mut command: Command, limit: Duration) -> (Option<ExitStatus>, String, String) {
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
