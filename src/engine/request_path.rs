//! What a request costs before llama.cpp is called: reading and parsing it, rendering the
//! template, tokenizing, the hand-over to the inference thread and the cache match. Measured
//! stage by stage as the request passes and reported in its timings.

use std::time::{Duration, Instant};

/// The stages of one request before its prompt is evaluated (`timings.request`).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct RequestPath {
    /// Arrival to the body read (waiting for a body permit included).
    pub read: Duration,
    /// The body parsed and checked into an engine job.
    pub parse: Duration,
    /// The prompt rendered through the chat template.
    pub render: Duration,
    /// The rendered prompt tokenized.
    pub tokenize: Duration,
    /// Of the prompt's tokens, those kept from an earlier prompt's tokenization (its
    /// unchanged beginning was not tokenized again).
    pub tokens_kept: u32,
    /// Queued to taken by the inference thread (on an idle engine, the hand-over alone).
    pub queue: Duration,
    /// The prompt's tokens compared with the cache and the reuse planned (a save or restore
    /// it needed is not counted: the cache report has those).
    pub matching: Duration,
    /// Arrival to the prompt's evaluation (or, for an adopted generation, its first event):
    /// everything above plus the hand-offs between threads.
    pub total: Duration,
}

/// A request's clock on its way to llama.cpp.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RequestClock {
    /// When the request arrived.
    arrived: Instant,
    /// When it was queued for the inference thread.
    queued: Option<Instant>,
    /// The stages measured so far.
    path: RequestPath,
}

impl RequestClock {
    /// A clock started at `arrived`.
    pub(crate) fn since(arrived: Instant) -> Self {
        Self { arrived, queued: None, path: RequestPath::default() }
    }

    /// The stages so far, to fill in.
    pub(crate) fn path_mut(&mut self) -> &mut RequestPath {
        &mut self.path
    }

    /// The request is queued now.
    pub(crate) fn queued(&mut self) {
        self.queued = Some(Instant::now());
    }

    /// The inference thread took the request now.
    pub(crate) fn taken(&mut self) {
        if let Some(queued) = self.queued {
            self.path.queue = queued.elapsed();
        }
    }

    /// The stages, with `matching` and the total up to now: the prompt's evaluation starts.
    pub(crate) fn finish(mut self, matching: Duration) -> RequestPath {
        self.path.matching = matching;
        self.path.total = self.arrived.elapsed();
        self.path
    }
}
