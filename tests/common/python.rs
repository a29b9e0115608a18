//! The pinned Python venvs of the tests (`scripts/sdk-venv.sh`: the openai SDK, Prometheus's
//! parser; `scripts/browser-venv.sh`: Playwright) and running their scripts with a time limit.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The SDK venv's python, from the last stdout line of `scripts/sdk-venv.sh`.
pub(crate) fn sdk_python(root: &Path) -> PathBuf {
    venv_python(root, "scripts/sdk-venv.sh")
}

/// The browser venv's python (Playwright), from the last stdout line of `scripts/browser-venv.sh`.
pub(crate) fn browser_python(root: &Path) -> PathBuf {
    venv_python(root, "scripts/browser-venv.sh")
}

/// The python of the venv that `script` creates (or reuses) and names on its last stdout line.
fn venv_python(root: &Path, script: &str) -> PathBuf {
    let output = Command::new("bash").arg(script).current_dir(root).output().expect("bash runs the venv script");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{script} failed ({}):\n{stdout}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    PathBuf::from(stdout.lines().last().expect("the venv script prints the python path").trim())
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
