//! The disk cache's writer thread: files are written while the user listens, never on the
//! inference thread, and a shutdown waits for the queue only so long. A thread that stopped (a
//! panic while writing) is noticed, never waited for, and its reason kept.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use super::file::{write_entry, Header};
use crate::engine::decoder::SavedState;
use crate::engine::panic_message;

/// A file not written yet.
pub(super) const PENDING: u8 = 0;
/// A file in place.
pub(super) const WRITTEN: u8 = 1;
/// A write that failed.
pub(super) const FAILED: u8 = 2;
/// An entry a newer one made redundant: never written, or removed once written (by the
/// writer of the newer one, after that is in place).
pub(super) const SUPERSEDED: u8 = 3;

/// One file to write.
pub(super) struct WriteJob {
    pub(super) path: PathBuf,
    pub(super) header: Header,
    pub(super) state: SavedState,
    /// [`PENDING`], then [`WRITTEN`], [`FAILED`] or [`SUPERSEDED`]; shared with the index.
    pub(super) status: Arc<AtomicU8>,
    /// Files this one makes redundant, removed once it is in place (or its write failed), so
    /// a process killed in the middle of the write still leaves the older state on disk.
    pub(super) replaces: Vec<PathBuf>,
}

#[derive(Default)]
struct Queue {
    jobs: VecDeque<WriteJob>,
    /// A job is being written.
    busy: bool,
    /// Why the thread stopped (it panicked); nothing is written any more.
    stopped: Option<String>,
}

type Shared = (Mutex<Queue>, Condvar);

/// A thread writing [`WriteJob`]s in order.
pub(super) struct Writer {
    queue: Arc<Shared>,
}

impl Writer {
    /// Starts the thread; it ends once the `Writer` is dropped (after the file it is writing:
    /// [`Writer::flush`] first to write the queued ones), or at a panic, which it records.
    pub(super) fn start() -> std::io::Result<Self> {
        let queue: Arc<Shared> = Arc::default();
        let weak = Arc::downgrade(&queue);
        std::thread::Builder::new().name("firstword-disk-cache".into()).spawn(move || {
            let served = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| serve(&weak)));
            if let (Err(panic), Some(queue)) = (served, weak.upgrade()) {
                let (lock, changed) = &*queue;
                let mut state = lock.lock();
                state.stopped = Some(panic_message(&*panic));
                state.busy = false;
                for job in state.jobs.drain(..) {
                    let _ = job.status.compare_exchange(PENDING, FAILED, Ordering::AcqRel, Ordering::Acquire);
                }
                changed.notify_all();
            }
        })?;
        Ok(Self { queue })
    }

    /// Queues a file (dropped when the thread has stopped).
    pub(super) fn push(&self, job: WriteJob) {
        let (lock, changed) = &*self.queue;
        let mut state = lock.lock();
        if state.stopped.is_some() {
            job.status.store(FAILED, Ordering::Release);
            return;
        }
        state.jobs.push_back(job);
        changed.notify_all();
    }

    /// Why the thread stopped, if it did.
    pub(super) fn stopped(&self) -> Option<String> {
        self.queue.0.lock().stopped.clone()
    }

    /// Waits until every queued file is written, at most `limit`; false if some were not (at
    /// once when the thread has stopped, or stops meanwhile).
    pub(super) fn flush(&self, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        let (lock, changed) = &*self.queue;
        let mut state = lock.lock();
        while state.busy || !state.jobs.is_empty() {
            if state.stopped.is_some() || changed.wait_until(&mut state, deadline).timed_out() {
                return false;
            }
        }
        state.stopped.is_none()
    }
}

/// The thread's loop: the next job, written; returns once the `Writer` is gone.
fn serve(queue: &Weak<Shared>) {
    loop {
        let Some(queue) = queue.upgrade() else { return };
        let (lock, changed) = &*queue;
        let job = {
            let mut state = lock.lock();
            state.busy = false;
            changed.notify_all();
            match state.jobs.pop_front() {
                Some(job) => {
                    state.busy = true;
                    job
                }
                None => {
                    changed.wait_for(&mut state, Duration::from_millis(200));
                    continue;
                }
            }
        };
        drop(queue);
        write(job);
    }
}

fn write(job: WriteJob) {
    if job.status.load(Ordering::Acquire) == SUPERSEDED {
        return;
    }
    let started = Instant::now();
    let drafter = job.state.drafter().map_or(&[][..], |(bytes, _)| bytes);
    let written = write_entry(&job.path, job.header, job.state.target_bytes(), drafter);
    let outcome = if written.is_ok() { WRITTEN } else { FAILED };
    if job.status.compare_exchange(PENDING, outcome, Ordering::AcqRel, Ordering::Acquire).is_err() {
        // Superseded while it was written: the newer entry removes what this one replaced.
        if written.is_ok() {
            let _ = std::fs::remove_file(&job.path);
        }
        return;
    }
    match written {
        Ok(()) => tracing::debug!(
            file = %job.path.display(),
            mib = job.state.target_bytes().len() >> 20,
            ms = started.elapsed().as_secs_f32() * 1000.0,
            "disk cache: written"
        ),
        Err(e) => tracing::warn!("disk cache: writing {} failed: {e}", job.path.display()),
    }
    for path in job.replaces.iter().filter(|path| **path != job.path) {
        let _ = std::fs::remove_file(path);
    }
}
