//! The disk cache's writer thread: files are written while the user listens, never on the
//! inference thread, and a shutdown waits for the queue only so long.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use super::file::{write_entry, Header};
use crate::engine::decoder::SavedState;

/// A file not written yet.
pub(super) const PENDING: u8 = 0;
/// A file in place.
pub(super) const WRITTEN: u8 = 1;
/// A write that failed.
pub(super) const FAILED: u8 = 2;
/// An entry a newer one made redundant before it was written: never written, or removed
/// once written.
pub(super) const SUPERSEDED: u8 = 3;

/// One file to write.
pub(super) struct WriteJob {
    pub(super) path: PathBuf,
    pub(super) header: Header,
    pub(super) state: SavedState,
    /// [`PENDING`], then [`WRITTEN`], [`FAILED`] or [`SUPERSEDED`]; shared with the index.
    pub(super) status: Arc<AtomicU8>,
}

#[derive(Default)]
struct Queue {
    jobs: VecDeque<WriteJob>,
    /// A job is being written.
    busy: bool,
}

/// A thread writing [`WriteJob`]s in order.
pub(super) struct Writer {
    queue: Arc<(Mutex<Queue>, Condvar)>,
}

impl Writer {
    /// Starts the thread; it ends once the `Writer` is dropped (after the file it is writing:
    /// [`Writer::flush`] first to write the queued ones).
    pub(super) fn start() -> std::io::Result<Self> {
        let queue: Arc<(Mutex<Queue>, Condvar)> = Arc::default();
        let weak = Arc::downgrade(&queue);
        std::thread::Builder::new().name("firstword-disk-cache".into()).spawn(move || loop {
            let Some(queue) = weak.upgrade() else { return };
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
        })?;
        Ok(Self { queue })
    }

    /// Queues a file.
    pub(super) fn push(&self, job: WriteJob) {
        let (lock, changed) = &*self.queue;
        lock.lock().jobs.push_back(job);
        changed.notify_all();
    }

    /// Waits until every queued file is written, at most `limit`; false if some were not.
    pub(super) fn flush(&self, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        let (lock, changed) = &*self.queue;
        let mut state = lock.lock();
        while state.busy || !state.jobs.is_empty() {
            if changed.wait_until(&mut state, deadline).timed_out() {
                return false;
            }
        }
        true
    }
}

fn write(job: WriteJob) {
    if job.status.load(Ordering::Acquire) == SUPERSEDED {
        return;
    }
    let started = Instant::now();
    let drafter = job.state.drafter().map_or(&[][..], |(bytes, _)| bytes);
    match write_entry(&job.path, job.header, job.state.target_bytes(), drafter) {
        Ok(()) => {
            if job.status.compare_exchange(PENDING, WRITTEN, Ordering::AcqRel, Ordering::Acquire).is_err() {
                // Superseded while it was written.
                let _ = std::fs::remove_file(&job.path);
                return;
            }
            tracing::debug!(
                file = %job.path.display(),
                mib = job.state.target_bytes().len() >> 20,
                ms = started.elapsed().as_secs_f32() * 1000.0,
                "disk cache: written"
            );
        }
        Err(e) => {
            tracing::warn!("disk cache: writing {} failed: {e}", job.path.display());
            job.status.store(FAILED, Ordering::Release);
        }
    }
}
