//! What a submission hands back: a generation's events, a queued prefill, and how busy the
//! engine is.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use tokio::sync::{mpsc as tokio_mpsc, oneshot};

use super::{EngineError, Event, PrefillReport};

/// How busy the engine is.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EngineLoad {
    /// A request (generation or prefill) is being served.
    pub busy: bool,
    /// Requests queued behind it.
    pub waiting: usize,
}

/// A queued prefill. Dropping it cancels the prefill at its next chunk.
#[derive(Debug)]
pub struct PendingPrefill {
    pub(super) events: tokio_mpsc::UnboundedReceiver<Event>,
    pub(super) report: oneshot::Receiver<PrefillReport>,
}

impl PendingPrefill {
    /// Waits until the prefill has run.
    ///
    /// # Errors
    /// What stopped it: the prompt does not fit the context, a decode failed, shutting down.
    pub async fn wait(mut self) -> Result<PrefillReport, EngineError> {
        if let Ok(report) = (&mut self.report).await {
            return Ok(report);
        }
        while let Some(event) = self.events.recv().await {
            if let Event::Failed(e) = event {
                return Err(e);
            }
        }
        Err(EngineError::ShuttingDown)
    }

    /// [`PendingPrefill::wait`], blocking the current thread (not for use inside an async
    /// runtime).
    ///
    /// # Errors
    /// As [`PendingPrefill::wait`].
    pub fn wait_blocking(mut self) -> Result<PrefillReport, EngineError> {
        if let Ok(report) = self.report.blocking_recv() {
            return Ok(report);
        }
        while let Some(event) = self.events.blocking_recv() {
            if let Event::Failed(e) = event {
                return Err(e);
            }
        }
        Err(EngineError::ShuttingDown)
    }
}

/// The events of one request. Dropping it cancels the generation at its next token.
#[derive(Debug)]
pub struct Generation {
    pub(super) events: tokio_mpsc::UnboundedReceiver<Event>,
    pub(super) finish_requested: Arc<AtomicBool>,
}

impl Generation {
    /// Ends generation at the next token as if the model had stopped: `Finished` still comes,
    /// with reason `Stop` and the usage so far (unlike dropping, which cancels silently).
    pub fn finish_now(&self) {
        self.finish_requested.store(true, Ordering::Relaxed);
    }

    /// The next event; `None` after `Finished` or `Failed`.
    pub async fn next(&mut self) -> Option<Event> {
        self.events.recv().await
    }

    /// The next event, blocking the current thread (not for use inside an async runtime).
    pub fn next_blocking(&mut self) -> Option<Event> {
        self.events.blocking_recv()
    }
}
