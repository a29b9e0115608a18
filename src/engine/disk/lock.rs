//! One writer per directory and settings: instances with the same settings (the same
//! fingerprint, so the same file names) sharing a cache directory would otherwise cut and
//! remove each other's files. The first takes an exclusive advisory lock (`flock`, released by
//! the kernel when its process ends, however it ends); another one finding it taken reads the
//! files only, and tries again before each state it would write, so it becomes the writer once
//! the first has stopped. Instances with other settings write files of other names and lock
//! another file: they never wait for each other.

use std::fs::File;
use std::io::{Read, Seek, Write};
use std::path::Path;

/// What this instance may do with its files.
pub(super) struct Access {
    /// The lock file (its lock held while this instance writes).
    file: Option<File>,
    /// Why this instance reads only (another instance writes); `None` while it writes.
    read_only: Option<String>,
}

impl Access {
    /// Takes the lock on `path` (created if missing), or finds it held by another instance:
    /// then this one reads only, with a warning naming the holder. Where the file system has
    /// no locks the instance writes, as it would alone, with a warning.
    pub(super) fn take(path: &Path) -> Self {
        let opened = File::options().read(true).write(true).create(true).truncate(false).open(path);
        let file = match opened {
            Ok(file) => file,
            Err(e) => {
                tracing::warn!(
                    "disk cache: cannot open {} to lock it ({e}): another instance with the same settings on \
                     this directory would write over this one's files",
                    path.display()
                );
                return Self { file: None, read_only: None };
            }
        };
        let mut access = Self { file: Some(file), read_only: None };
        match access.try_lock() {
            Ok(true) => {}
            Ok(false) => {
                let holder = access.holder();
                let why = format!("another instance with the same settings ({holder}) writes this directory");
                tracing::warn!(
                    "disk cache: {why}: this one reads it only (restores and reads its files, never writes or \
                     removes one) until that one stops; give each instance its own --cache-dir to keep the \
                     conversations of both"
                );
                access.read_only = Some(why);
            }
            Err(e) => tracing::warn!(
                "disk cache: cannot lock {} ({e}): another instance with the same settings on this directory \
                 would write over this one's files",
                path.display()
            ),
        }
        access
    }

    /// Why this instance reads only; `None` when it writes.
    pub(super) fn read_only(&self) -> Option<&str> {
        self.read_only.as_deref()
    }

    /// Whether this instance writes: a reader tries the lock again first, and returns true
    /// (with a log line) once it took it, the instance that held it having stopped.
    pub(super) fn may_write(&mut self) -> bool {
        if self.read_only.is_none() {
            return true;
        }
        if !matches!(self.try_lock(), Ok(true)) {
            return false;
        }
        self.read_only = None;
        tracing::info!("disk cache: the instance that wrote this directory stopped; this one writes it now");
        true
    }

    /// Tries the lock without waiting: `Ok(true)` when taken (this process's id then written
    /// in the file, for the warning of an instance that finds it taken), `Ok(false)` when
    /// another holds it.
    fn try_lock(&mut self) -> std::io::Result<bool> {
        let Some(file) = self.file.as_mut() else { return Ok(true) };
        #[cfg(unix)]
        match rustix::fs::flock(&*file, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => {}
            Err(e) if e == rustix::io::Errno::WOULDBLOCK => return Ok(false),
            Err(e) => return Err(e.into()),
        }
        file.set_len(0)?;
        file.rewind()?;
        write!(file, "{}", std::process::id())?;
        Ok(true)
    }

    /// The process that holds the lock, as its file names it.
    fn holder(&mut self) -> String {
        let mut text = String::new();
        let read = self.file.as_mut().map(|file| file.rewind().and_then(|()| file.read_to_string(&mut text)));
        match text.trim().parse::<u32>() {
            Ok(pid) if matches!(read, Some(Ok(_))) => format!("process {pid}"),
            _ => "a process".to_string(),
        }
    }
}

#[cfg(all(test, unix))]
mod tests {
    use std::io::Write;
    use std::sync::Arc;

    use parking_lot::Mutex;

    use super::Access;

    /// What a test's log subscriber wrote.
    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl Write for Captured {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().extend_from_slice(bytes);
            Ok(bytes.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn the_first_writes_a_second_reads_until_the_first_is_gone() {
        let dir = std::env::temp_dir().join(format!("firstword-lock-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let path = dir.join("settings.lock");
        let first = Access::take(&path);
        assert_eq!(first.read_only(), None);
        let captured = Captured::default();
        let writer = captured.clone();
        let subscriber = tracing_subscriber::fmt().with_writer(move || writer.clone()).with_ansi(false).finish();
        let mut second = tracing::subscriber::with_default(subscriber, || Access::take(&path));
        let why = second.read_only().expect("the second reads only").to_string();
        let process = format!("process {}", std::process::id());
        assert!(why.contains(&process), "{why}");
        let logged = String::from_utf8(captured.0.lock().clone()).expect("UTF-8");
        assert!(logged.contains("WARN") && logged.contains(&process) && logged.contains("reads it only"), "{logged}");
        assert!(!second.may_write(), "the first still holds the lock");
        drop(first);
        assert!(second.may_write(), "the first is gone");
        assert_eq!(second.read_only(), None);
        assert!(Access::take(&path).read_only().is_some(), "the second holds it now");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
