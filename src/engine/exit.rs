//! Exiting the process while an engine computes. `exit` runs the destructors of llama.cpp's
//! static objects (ggml's list of CPU buffer types, libmtmd's tables) even while an inference
//! thread is inside `llama_decode`, which then reads freed memory: a test binary whose engines
//! live in statics crashed with SIGSEGV after its last test, an embedder's `main` returning
//! mid-reply would too. So every engine is stopped first: each one that becomes ready registers
//! a hook with the C library's `atexit` (hooks run before the destructors of the objects
//! constructed before them, and by then loading and the warm-up decode have constructed what
//! llama.cpp computes with; a later engine may construct more, a projector's, hence one hook
//! per engine). The hook stops every engine as [`super::Engine::shutdown`] does and waits,
//! bounded, for its inference thread to end.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::{ffi, worker, Shared};

/// Engines started in this process and not dropped yet.
static LIVE: Mutex<Vec<Weak<Shared>>> = Mutex::new(Vec::new());

/// Hooks registered so far.
static HOOKS: AtomicUsize = AtomicUsize::new(0);

/// A process that starts engines over and over registers no more hooks than this (each costs
/// the C library a slot); the engines started after share the earlier hooks.
const MAX_HOOKS: usize = 32;

/// How long the exit waits for the inference threads: the disk cache's shutdown writes and a
/// decode step or prompt chunk under way.
const EXIT_WAIT: Duration = worker::SHUTDOWN_WRITE_LIMIT.saturating_add(Duration::from_secs(5));

/// Counts `shared` among the engines an exit stops (from its start, so that one still loading
/// is stopped too).
pub(super) fn track(shared: &Arc<Shared>) {
    let mut live = LIVE.lock();
    live.retain(|engine| engine.strong_count() > 0);
    live.push(Arc::downgrade(shared));
}

/// An engine is ready: a hook registered now runs before the destructors of what its loading
/// constructed.
pub(super) fn hook_after_load() {
    if HOOKS.fetch_add(1, Ordering::Relaxed) < MAX_HOOKS && !ffi::at_process_exit(stop_live_engines) {
        tracing::warn!("could not register the exit hook that stops the engine before the process exits");
    }
}

/// The exit hook: stops every live engine and waits for their inference threads.
extern "C" fn stop_live_engines() {
    let engines: Vec<Arc<Shared>> = LIVE.lock().drain(..).filter_map(|engine| engine.upgrade()).collect();
    for shared in &engines {
        shared.signals.shutting_down.store(true, Ordering::Relaxed);
    }
    let deadline = Instant::now() + EXIT_WAIT;
    for shared in &engines {
        shared.join_worker_by(deadline);
    }
    // Never the last handle's drop here: it would wait without a bound for a thread that did
    // not end in time. The process is ending; the memory goes with it.
    std::mem::forget(engines);
}
