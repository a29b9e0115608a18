//! `--serve NAME=COMMAND`: the bench starts a server itself before its turn in a repetition
//! and stops it after, so that only one candidate is in memory at a time (two large models
//! side by side would not fit, or would push each other out of the page cache). The command
//! runs in a shell in its own process group; the peak memory is the highest of the group's
//! processes (the server), read before it stops; its output goes to a log file in the
//! temporary directory, quoted when it fails to start.

use std::path::PathBuf;
use std::time::Duration;

use super::error::BenchError;
use super::peak_rss_mb;

/// A server the bench started.
#[derive(Debug)]
pub(super) struct Served {
    name: String,
    child: tokio::process::Child,
    pid: u32,
    log: PathBuf,
}

/// The process group of a live process (not a zombie), from `/proc/PID/stat` (its third and
/// fifth fields; the name before them is in parentheses and may hold spaces).
fn process_group(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let mut fields = stat[stat.rfind(')')? + 1..].split_whitespace();
    let state = fields.next()?;
    if state == "Z" || state == "X" {
        return None;
    }
    fields.nth(1)?.parse().ok()
}

/// The live processes of process group `group` (Linux; none elsewhere).
fn group_members(group: u32) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else { return Vec::new() };
    entries
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| process_group(pid) == Some(group))
        .collect()
}

/// The last lines of a log, to quote.
fn tail(path: &PathBuf) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(5)..].join("\n")
}

impl Served {
    /// Starts `command` and waits (up to `timeout`) until `base` answers `/health` or
    /// `/v1/models` with a success.
    ///
    /// # Errors
    /// [`BenchError::Serve`]: the command cannot start, exits, or the server never answers.
    pub(super) async fn start(name: &str, command: &str, base: &str, timeout: Duration) -> Result<Self, BenchError> {
        let failed = |why: String| BenchError::Serve { name: name.to_string(), why };
        let log = std::env::temp_dir().join(format!(
            "firstword-bench-serve-{}-{}.log",
            name.chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '_' }).collect::<String>(),
            std::process::id()
        ));
        let out = std::fs::File::create(&log).map_err(|e| failed(format!("{}: {e}", log.display())))?;
        let err = out.try_clone().map_err(|e| failed(e.to_string()))?;
        let mut child = tokio::process::Command::new("sh")
            .args(["-c", command])
            .stdin(std::process::Stdio::null())
            .stdout(out)
            .stderr(err)
            .process_group(0)
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| failed(format!("cannot run the command: {e}")))?;
        let pid = child.id().ok_or_else(|| failed("the command ended at once".into()))?;
        let client =
            reqwest::Client::builder().timeout(Duration::from_secs(5)).build().map_err(BenchError::HttpClient)?;
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                let why =
                    format!("the command exited ({status}) before the server answered; its log ends:\n{}", tail(&log));
                return Err(failed(why));
            }
            for path in ["/health", "/v1/models"] {
                let answer = client.get(format!("{base}{path}")).send().await;
                if answer.is_ok_and(|r| r.status().is_success()) {
                    return Ok(Self { name: name.to_string(), child, pid, log });
                }
            }
            if tokio::time::Instant::now() > deadline {
                let served = Self { name: name.to_string(), child, pid, log };
                let why = format!(
                    "no answer at {base}/health or /v1/models in {} s; its log ends:\n{}",
                    timeout.as_secs(),
                    tail(&served.log)
                );
                served.stop().await;
                return Err(failed(why));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// The highest peak resident memory so far of the processes in the command's group (the
    /// shell's, the server's), MB; Linux only.
    pub(super) fn peak_rss_mb(&self) -> Option<f64> {
        group_members(self.pid).into_iter().filter_map(peak_rss_mb).max_by(f64::total_cmp)
    }

    /// Stops the server's whole process group: SIGTERM, then SIGKILL after 20 s (and once
    /// more when dropped), and returns once none of its processes is left (a server the shell
    /// started may outlive the shell, holding its port).
    pub(super) async fn stop(mut self) {
        let group = i32::try_from(self.pid).ok().and_then(rustix::process::Pid::from_raw);
        let signal = |signal| {
            if let Some(group) = group {
                let _ = rustix::process::kill_process_group(group, signal);
            }
        };
        signal(rustix::process::Signal::TERM);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        let _ = tokio::time::timeout_at(deadline, self.child.wait()).await;
        while !group_members(self.pid).is_empty() && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        if !group_members(self.pid).is_empty() || self.child.try_wait().ok().flatten().is_none() {
            eprintln!("{} did not stop in 20 s after SIGTERM: killed", self.name);
            signal(rustix::process::Signal::KILL);
            let _ = self.child.wait().await;
            while !group_members(self.pid).is_empty() && tokio::time::Instant::now() < deadline + Duration::from_secs(5)
            {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        let _ = std::fs::remove_file(&self.log);
    }
}

impl Drop for Served {
    /// A run that ends early (an error) kills the whole group, not the shell alone; after
    /// [`Served::stop`] there is nothing left to kill.
    fn drop(&mut self) {
        if let Some(group) = i32::try_from(self.pid).ok().and_then(rustix::process::Pid::from_raw) {
            let _ = rustix::process::kill_process_group(group, rustix::process::Signal::KILL);
        }
    }
}
