//! The disk cache's writer thread: files are written while the user listens, never on the
//! inference thread, and a shutdown waits for the queue only so long. A thread that stopped (a
//! panic while writing) is noticed, never waited for, and its reason kept.
//!
//! What a turn costs: the writer keeps, for each file it wrote or that was read, the
//! signature of the file's last state (see [`super::delta`]; [`SIGNATURES_MAX_BYTES`] in all,
//! least recently written dropped first). The next state of the same conversation (its tokens
//! continue the file's) is written as a delta appended to the file, unless the delta would
//! bring the file's deltas past half the state (a recurrent model's state, which changes
//! entirely, or a long chain) or the file holds [`MAX_SEGMENTS`] segments already: then a new
//! base replaces the file. So a conversation costs about its final state plus what each turn
//! changed, and a read applies at most [`MAX_SEGMENTS`] − 1 deltas of at most half a state.

use std::borrow::Cow;
use std::collections::{HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use super::delta::StateSignature;
use super::file::{append_segment, write_entry, DeltaHeader, Header};
use crate::engine::decoder::SavedState;
use crate::engine::panic_message;

/// A file not written yet.
pub(super) const PENDING: u8 = 0;
/// A file in place.
pub(super) const WRITTEN: u8 = 1;
/// A write that failed (the file, if there was one, holds what it held before).
pub(super) const FAILED: u8 = 2;
/// An entry a newer one made redundant: never written, or removed once written (by the
/// writer of the newer one, after that is in place).
pub(super) const SUPERSEDED: u8 = 3;
/// An entry a newer one of the same file continues: never written if not begun, kept (as
/// the state the newer one's delta applies to) if it was.
pub(super) const CONTINUED: u8 = 4;

/// Segments (the base included) past which a file is written anew.
pub(super) const MAX_SEGMENTS: u32 = 32;
/// Memory the signatures of the files' last states may take.
pub(super) const SIGNATURES_MAX_BYTES: u64 = 256 << 20;

/// An entry's fate, shared by the index and the writer.
#[derive(Debug, Default)]
pub(super) struct Slot {
    /// [`PENDING`], then [`WRITTEN`], [`FAILED`], [`SUPERSEDED`] or [`CONTINUED`].
    pub(super) status: AtomicU8,
    /// Once written: delta segments after the base that make its state.
    pub(super) deltas: AtomicU32,
    /// Once written: the file's length.
    pub(super) file_bytes: AtomicU64,
}

impl Slot {
    /// A slot for an entry found on disk.
    pub(super) fn written(deltas: u32, file_bytes: u64) -> Self {
        Self { status: AtomicU8::new(WRITTEN), deltas: AtomicU32::new(deltas), file_bytes: AtomicU64::new(file_bytes) }
    }

    pub(super) fn status(&self) -> u8 {
        self.status.load(Ordering::Acquire)
    }
}

/// One state to write.
pub(super) struct WriteJob {
    pub(super) path: PathBuf,
    /// Its header as a base (the fingerprint, its kind, all its tokens).
    pub(super) header: Header,
    pub(super) state: SavedState,
    pub(super) slot: Arc<Slot>,
    /// Files this one makes redundant, removed once it is in place (never when its write
    /// failed), so a process killed in the middle of the write still leaves the older state
    /// on disk.
    pub(super) replaces: Vec<PathBuf>,
}

/// What the writer knows of a file it read: enough to append the next turn to it.
pub(super) struct ReadFile {
    pub(super) path: PathBuf,
    /// The tokens of the state read.
    pub(super) tokens: Vec<i32>,
    /// The state read.
    pub(super) state: SavedState,
    /// Delta segments after the base that make it.
    pub(super) deltas: u32,
    /// Bytes of those deltas, and where the last of them ends.
    pub(super) delta_bytes: u64,
    pub(super) end: u64,
}

/// Work for the writer thread.
pub(super) enum Job {
    /// Write a state.
    Write(Box<WriteJob>),
    /// Keep the signature of a file's state just read, unless the writer has it already.
    Sign(ReadFile),
    /// Forget a file (removed, or found damaged: its next state is written as a new base).
    Forget(PathBuf),
}

/// The last state written to a file (or read from it).
struct Chain {
    tokens: Vec<i32>,
    deltas: u32,
    /// Bytes of the delta segments after the base.
    delta_bytes: u64,
    /// Where its last segment ends.
    end: u64,
    signature: StateSignature,
    /// When it was last written (a count of writes), to drop the stalest first.
    used: u64,
}

/// The writer thread's own memory: the files' chains.
#[derive(Default)]
struct Chains {
    files: HashMap<PathBuf, Chain>,
    clock: u64,
}

impl Chains {
    fn keep(&mut self, path: PathBuf, mut chain: Chain, counters: &Counters) {
        self.clock += 1;
        chain.used = self.clock;
        self.files.insert(path, chain);
        let mut held: u64 = self.files.values().map(|c| c.signature.bytes()).sum();
        while held > SIGNATURES_MAX_BYTES {
            let Some(stalest) = self.files.iter().min_by_key(|(_, c)| c.used).map(|(p, _)| p.clone()) else { break };
            held -= self.files.remove(&stalest).map_or(0, |c| c.signature.bytes());
        }
        counters.signature_bytes.store(held, Ordering::Relaxed);
    }

    fn forget(&mut self, path: &PathBuf, counters: &Counters) {
        self.files.remove(path);
        counters.signature_bytes.store(self.files.values().map(|c| c.signature.bytes()).sum(), Ordering::Relaxed);
    }
}

/// What the writer has done, for status and metrics.
#[derive(Debug, Default)]
pub(super) struct Counters {
    /// Bytes of the bases and segments it wrote (headers included).
    pub(super) bytes_written: AtomicU64,
    /// Memory its signatures take.
    pub(super) signature_bytes: AtomicU64,
}

/// A live view of the writer's counters, readable from any thread (`/metrics` reads it
/// between the inference thread's status updates).
#[derive(Clone, Debug)]
pub(crate) struct DiskCounters(Arc<Counters>);

impl DiskCounters {
    /// Bytes of the bases and segments written so far (headers included).
    pub(crate) fn bytes_written(&self) -> u64 {
        self.0.bytes_written.load(Ordering::Relaxed)
    }

    /// Memory the writer's signatures take now.
    pub(crate) fn signature_bytes(&self) -> u64 {
        self.0.signature_bytes.load(Ordering::Relaxed)
    }
}

#[derive(Default)]
struct Queue {
    jobs: VecDeque<Job>,
    /// A job is being written.
    busy: bool,
    /// Why the thread stopped (it panicked); nothing is written any more.
    stopped: Option<String>,
    /// The engine is computing: the next job waits (see [`WriteHold`]).
    held: bool,
}

/// Makes the writer wait between jobs while the engine evaluates a request: on a machine with
/// few cores its checksums and deltas would slow that request down (a 100 MB state's delta is
/// a few hundred ms of CPU). A flush is never held: the engine releases the writer first.
pub(crate) struct WriteHold(Weak<Shared>);

impl WriteHold {
    /// Holds the writer's next job (`true`) or lets it go on.
    pub(crate) fn set(&self, held: bool) {
        if let Some(queue) = self.0.upgrade() {
            let (lock, changed) = &*queue;
            lock.lock().held = held;
            if !held {
                changed.notify_all();
            }
        }
    }
}

type Shared = (Mutex<Queue>, Condvar);

/// A thread writing [`Job`]s in order.
pub(super) struct Writer {
    queue: Arc<Shared>,
    counters: Arc<Counters>,
}

impl Writer {
    /// Starts the thread; it ends once the `Writer` is dropped (after the file it is writing:
    /// [`Writer::flush`] first to write the queued ones), or at a panic, which it records.
    pub(super) fn start() -> std::io::Result<Self> {
        let queue: Arc<Shared> = Arc::default();
        let counters: Arc<Counters> = Arc::default();
        let weak = Arc::downgrade(&queue);
        let thread_counters = Arc::clone(&counters);
        std::thread::Builder::new().name("firstword-disk-cache".into()).spawn(move || {
            in_the_background();
            let served = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| serve(&weak, &thread_counters)));
            if let (Err(panic), Some(queue)) = (served, weak.upgrade()) {
                let (lock, changed) = &*queue;
                let mut state = lock.lock();
                state.stopped = Some(panic_message(&*panic));
                state.busy = false;
                for job in state.jobs.drain(..) {
                    if let Job::Write(job) = job {
                        let _ = job.slot.status.compare_exchange(PENDING, FAILED, Ordering::AcqRel, Ordering::Acquire);
                    }
                }
                changed.notify_all();
            }
        })?;
        Ok(Self { queue, counters })
    }

    /// Queues a job (a write is dropped, failed, when the thread has stopped).
    pub(super) fn push(&self, job: Job) {
        let (lock, changed) = &*self.queue;
        let mut state = lock.lock();
        if state.stopped.is_some() {
            if let Job::Write(job) = job {
                job.slot.status.store(FAILED, Ordering::Release);
            }
            return;
        }
        state.jobs.push_back(job);
        changed.notify_all();
    }

    /// Why the thread stopped, if it did.
    pub(super) fn stopped(&self) -> Option<String> {
        self.queue.0.lock().stopped.clone()
    }

    /// What it has done.
    pub(super) fn counters(&self) -> DiskCounters {
        DiskCounters(Arc::clone(&self.counters))
    }

    /// What makes the writer wait while the engine computes.
    pub(super) fn hold(&self) -> WriteHold {
        WriteHold(Arc::downgrade(&self.queue))
    }

    /// Waits until every queued job is done, at most `limit`; false if some were not (at
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

/// Lowers the calling thread to the lowest CPU priority (nice 19): the writer's checksums
/// and deltas (seconds of CPU for a large state) then run while llama.cpp's threads wait,
/// and take almost nothing from a request being evaluated on a machine with few cores.
/// Linux only (a thread's own nice value); elsewhere the thread keeps the default.
fn in_the_background() {
    #[cfg(target_os = "linux")]
    if let Err(e) = rustix::process::setpriority_process(Some(rustix::thread::gettid()), 19) {
        tracing::debug!("disk cache: the writer's priority stays as it is: {e}");
    }
}

/// The thread's loop: the next job, done; returns once the `Writer` is gone.
fn serve(queue: &Weak<Shared>, counters: &Counters) {
    let mut chains = Chains::default();
    loop {
        let Some(queue) = queue.upgrade() else { return };
        let (lock, changed) = &*queue;
        let job = {
            let mut state = lock.lock();
            state.busy = false;
            changed.notify_all();
            if state.held {
                changed.wait_for(&mut state, Duration::from_millis(200));
                continue;
            }
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
        match job {
            Job::Write(job) => write(*job, &mut chains, counters),
            Job::Sign(read) => sign(read, &mut chains, counters),
            Job::Forget(path) => chains.forget(&path, counters),
        }
    }
}

/// The target's and drafter's state bytes, one after the other, as a file holds them.
fn payload(state: &SavedState) -> Cow<'_, [u8]> {
    match state.drafter() {
        None => Cow::Borrowed(state.target_bytes()),
        Some((drafter, _)) => Cow::Owned([state.target_bytes(), drafter].concat()),
    }
}

fn sign(read: ReadFile, chains: &mut Chains, counters: &Counters) {
    if chains.files.get(&read.path).is_some_and(|chain| chain.tokens == read.tokens && chain.end == read.end) {
        return;
    }
    let signature = StateSignature::of(&payload(&read.state));
    let chain = Chain {
        tokens: read.tokens,
        deltas: read.deltas,
        delta_bytes: read.delta_bytes,
        end: read.end,
        signature,
        used: 0,
    };
    chains.keep(read.path, chain, counters);
}

/// How a state was written.
struct Written {
    bytes: u64,
    chain: Chain,
    how: &'static str,
}

fn write(job: WriteJob, chains: &mut Chains, counters: &Counters) {
    if job.slot.status() != PENDING {
        return;
    }
    let started = Instant::now();
    let payload = payload(&job.state);
    let written = match append(&job, &payload, chains) {
        Some(appended) => appended,
        None => base(&job, &payload),
    };
    let outcome = if written.is_ok() { WRITTEN } else { FAILED };
    if let Ok(done) = &written {
        job.slot.deltas.store(done.chain.deltas, Ordering::Relaxed);
        job.slot.file_bytes.store(done.chain.end, Ordering::Relaxed);
        counters.bytes_written.fetch_add(done.bytes, Ordering::Relaxed);
    }
    let ms = started.elapsed().as_secs_f32() * 1000.0;
    let written = written.map(|done| {
        let (bytes, how) = (done.bytes, done.how);
        chains.keep(job.path.clone(), done.chain, counters);
        (bytes, how)
    });
    match job.slot.status.compare_exchange(PENDING, outcome, Ordering::AcqRel, Ordering::Acquire) {
        Ok(_) => {}
        // Continued while it was written: the newer entry's delta applies to it.
        Err(CONTINUED) => {}
        // Superseded while it was written: the newer entry removes what this one replaced.
        Err(_) => {
            if written.is_ok() {
                chains.forget(&job.path, counters);
                let _ = std::fs::remove_file(&job.path);
            }
            return;
        }
    }
    match written {
        Ok((bytes, how)) => {
            tracing::debug!(
                file = %job.path.display(),
                how,
                kib = bytes >> 10,
                state_mib = payload.len() >> 20,
                ms,
                "disk cache: written"
            );
            for path in job.replaces.iter().filter(|path| **path != job.path) {
                chains.forget(path, counters);
                let _ = std::fs::remove_file(path);
            }
        }
        Err(e) => tracing::warn!("disk cache: writing {} failed: {e}; what it held before is kept", job.path.display()),
    }
}

/// Writes `job`'s state as a new base (replacing its file, if it has one, once whole).
fn base(job: &WriteJob, payload: &[u8]) -> std::io::Result<Written> {
    let drafter = job.state.drafter().map_or(&[][..], |(bytes, _)| bytes);
    let bytes = write_entry(&job.path, job.header.clone(), job.state.target_bytes(), drafter)?;
    let signature = StateSignature::of(payload);
    let chain = Chain { tokens: job.header.tokens.clone(), deltas: 0, delta_bytes: 0, end: bytes, signature, used: 0 };
    Ok(Written { bytes, chain, how: "base" })
}

/// Appends `job`'s state to its file as a delta, if the file holds an earlier state of the
/// same conversation whose signature the writer has and the delta is small enough (see the
/// module's documentation); `None` when a new base is to be written instead.
fn append(job: &WriteJob, payload: &[u8], chains: &Chains) -> Option<std::io::Result<Written>> {
    let chain = chains.files.get(&job.path)?;
    let tokens = &job.header.tokens;
    let state_bytes = payload.len() as u64;
    let room = (state_bytes / 2).checked_sub(chain.delta_bytes)?;
    let on_disk = std::fs::metadata(&job.path).is_ok_and(|m| m.len() >= chain.end);
    if !tokens.starts_with(&chain.tokens) || chain.deltas + 1 >= MAX_SEGMENTS || !on_disk {
        return None;
    }
    let delta = chain.signature.diff(payload, room as usize)?;
    let header = DeltaHeader {
        kind: job.header.kind.clone(),
        tokens: tokens[chain.tokens.len()..].to_vec(),
        drafter_tokens: job.header.drafter_tokens.clone(),
        target_bytes: job.state.target_bytes().len() as u64,
        drafter_bytes: state_bytes - job.state.target_bytes().len() as u64,
        delta_bytes: 0,
        state_hash: xxhash_rust::xxh3::xxh3_64(payload),
    };
    Some(append_segment(&job.path, chain.end, header, &delta).map(|bytes| Written {
        bytes,
        how: "delta",
        chain: Chain {
            tokens: tokens.clone(),
            deltas: chain.deltas + 1,
            delta_bytes: chain.delta_bytes + bytes,
            end: chain.end + bytes,
            signature: StateSignature::of(payload),
            used: 0,
        },
    }))
}

#[cfg(test)]
mod tests;
