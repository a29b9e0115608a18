//! The watchdog over llama.cpp calls that wait on RPC servers. ggml-rpc's sockets have no
//! timeout: a server that stops answering without closing its connection (a frozen process, a
//! machine that lost power or its network) would keep a decode step waiting forever, and every
//! request behind it. Once an engine drives RPC servers, each inference thread marks when a
//! call that may wait on them starts and ends; a watchdog thread ends the process, saying why,
//! when one has run longer than the limit allows for its size. Nothing can cancel the call
//! itself, and the process cannot exit cleanly around it (exit handlers would wait on it).

use std::cell::OnceCell;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

/// When the calling thread's current call started and how long it may take.
#[derive(Default)]
struct CallClock {
    /// Milliseconds since [`EPOCH`] when the call started, plus one; 0: not in a call.
    since: AtomicU64,
    /// Milliseconds the call may take.
    allowed: AtomicU64,
}

/// The watchdog's settings, once one runs.
struct Watch {
    /// How long one micro-batch may wait.
    limit: Duration,
    /// The servers, for the message.
    endpoints: String,
}

static EPOCH: OnceLock<Instant> = OnceLock::new();
static WATCH: OnceLock<Watch> = OnceLock::new();
static ACTIVE: AtomicBool = AtomicBool::new(false);
static CLOCKS: Mutex<Vec<Weak<CallClock>>> = Mutex::new(Vec::new());

thread_local! {
    static CLOCK: OnceCell<Arc<CallClock>> = const { OnceCell::new() };
}

/// Milliseconds since the watchdog's epoch.
fn now_ms() -> u64 {
    EPOCH.get_or_init(Instant::now).elapsed().as_millis() as u64
}

/// Starts the watchdog (once per process; the first limit stays): a call may take `limit` for
/// each unit of work it was given before the process ends.
pub(crate) fn watch(limit: Duration, endpoints: String) {
    if WATCH.set(Watch { limit, endpoints }).is_err() {
        return;
    }
    now_ms();
    ACTIVE.store(true, Ordering::Release);
    let started = std::thread::Builder::new().name("firstword-rpc-watch".into()).spawn(|| loop {
        std::thread::sleep(Duration::from_millis(200));
        check();
    });
    if let Err(e) = started {
        tracing::warn!("no watchdog over the RPC servers ({e}): a server that stops answering stalls firstword");
    }
}

/// Ends the process if a call has run past what it is allowed.
fn check() {
    let now = now_ms();
    let stalled = CLOCKS.lock().iter().filter_map(Weak::upgrade).find_map(|clock| {
        let since = clock.since.load(Ordering::Acquire);
        let allowed = clock.allowed.load(Ordering::Acquire);
        (since > 0 && now.saturating_sub(since - 1) > allowed).then_some(allowed)
    });
    if let (Some(allowed), Some(watch)) = (stalled, WATCH.get()) {
        tracing::error!(
            "a llama.cpp call has waited more than {:.0} s on the RPC servers {}: one stopped answering (frozen, \
             or its machine or network went) and the call cannot be cancelled. firstword exits; a service \
             manager's restart brings it back once every server answers (--rpc-timeout sets the wait, {} s per \
             micro-batch)",
            allowed as f64 / 1000.0,
            watch.endpoints,
            watch.limit.as_secs()
        );
        std::process::abort();
    }
}

/// Whether a watchdog runs (an engine drives RPC servers): calls that may return before their
/// backends end then wait for them inside the watched call.
pub(crate) fn active() -> bool {
    ACTIVE.load(Ordering::Acquire)
}

/// Runs `call`, a llama.cpp call that may wait on RPC servers, worth `units` micro-batches (or
/// state copies) of work, under the watchdog when one runs.
pub(crate) fn watched<T>(units: usize, call: impl FnOnce() -> T) -> T {
    let Some(watch) = ACTIVE.load(Ordering::Acquire).then(|| WATCH.get()).flatten() else { return call() };
    let clock = CLOCK.with(|cell| {
        Arc::clone(cell.get_or_init(|| {
            let clock = Arc::new(CallClock::default());
            let mut clocks = CLOCKS.lock();
            clocks.retain(|clock| clock.strong_count() > 0);
            clocks.push(Arc::downgrade(&clock));
            clock
        }))
    });
    let allowed = watch.limit.saturating_mul(units.clamp(1, 1 << 16) as u32);
    clock.allowed.store(allowed.as_millis() as u64, Ordering::Release);
    clock.since.store(now_ms() + 1, Ordering::Release);
    let result = call();
    clock.since.store(0, Ordering::Release);
    result
}

/// Micro-batches a call of `tokens` tokens computes.
pub(crate) fn ubatches(tokens: usize, n_ubatch: u32) -> usize {
    tokens.div_ceil(n_ubatch.max(1) as usize).max(1)
}

/// Units of work of a state copy of `bytes`: one per 256 MiB.
pub(crate) fn state_units(bytes: usize) -> usize {
    1 + bytes / (256 << 20)
}
