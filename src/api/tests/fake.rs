//! A scripted engine: fixed model facts and room, and one scripted event list per submission.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use futures_util::future::BoxFuture;
use parking_lot::Mutex;

use super::super::backend::{Backend, EventSource, PrefillFuture};
use crate::chat::tools::ToolDefinition;
use crate::chat::{ChatMessage, TemplateKwargs};
use crate::engine::{CacheStatus, EngineError, EngineLoad, Event, GenerationRequest, ModelInfo, PrefillReport};

/// An engine whose answers are written in advance.
pub(super) struct FakeEngine {
    info: Result<ModelInfo, EngineError>,
    room: Result<(), EngineError>,
    /// The events of the next submission.
    script: Mutex<Vec<Event>>,
    /// Requests submitted so far.
    pub submitted: Mutex<Vec<GenerationRequest>>,
    /// Set when the API asked a generation to finish now.
    pub finish_requested: Arc<AtomicBool>,
    /// What `cache_status` answers.
    pub(super) cache: CacheStatus,
    /// What a prefill reports (none: the engine stopped).
    pub(super) prefilled: Option<PrefillReport>,
}

impl FakeEngine {
    /// A loaded model with room, answering each submission with `script`.
    pub(super) fn answering(script: Vec<Event>) -> Self {
        Self {
            info: Ok(super::model()),
            room: Ok(()),
            script: Mutex::new(script),
            submitted: Mutex::new(Vec::new()),
            finish_requested: Arc::new(AtomicBool::new(false)),
            cache: CacheStatus::default(),
            prefilled: None,
        }
    }

    /// A loaded model with room whose prefills report `report`.
    pub(super) fn prefilling(report: PrefillReport) -> Self {
        Self { prefilled: Some(report), ..Self::answering(Vec::new()) }
    }

    /// An engine whose model facts are `error` (e.g. still loading).
    pub(super) fn without_model(error: EngineError) -> Self {
        Self { info: Err(error), ..Self::answering(Vec::new()) }
    }

    /// An engine that has no room: `ensure_room` fails with `error`.
    pub(super) fn without_room(error: EngineError) -> Self {
        Self { room: Err(error), ..Self::answering(Vec::new()) }
    }
}

impl Backend for FakeEngine {
    fn model_info(&self) -> Result<ModelInfo, EngineError> {
        self.info.clone()
    }

    fn ensure_room(&self) -> Result<(), EngineError> {
        self.room.clone()
    }

    fn submit(&self, request: GenerationRequest) -> Result<Box<dyn EventSource>, EngineError> {
        self.room.clone()?;
        self.submitted.lock().push(request);
        let events = std::mem::take(&mut *self.script.lock()).into();
        Ok(Box::new(Scripted { events, finish_requested: Arc::clone(&self.finish_requested) }))
    }

    fn prefill(&self, request: GenerationRequest) -> Result<PrefillFuture, EngineError> {
        self.room.clone()?;
        self.submitted.lock().push(request);
        let outcome = self.prefilled.ok_or(EngineError::ShuttingDown);
        Ok(Box::pin(std::future::ready(outcome)))
    }

    fn cache_status(&self) -> CacheStatus {
        self.cache.clone()
    }

    fn load(&self) -> EngineLoad {
        EngineLoad::default()
    }

    /// One token per byte.
    fn tokenize(&self, text: String, _: bool, _: bool) -> BoxFuture<'_, Result<Vec<i32>, EngineError>> {
        Box::pin(std::future::ready(Ok(text.bytes().map(i32::from).collect())))
    }

    /// Each id's byte.
    fn token_pieces(&self, tokens: &[i32]) -> Result<Vec<Vec<u8>>, EngineError> {
        tokens
            .iter()
            .map(|&t| {
                u8::try_from(t).map(|b| vec![b]).map_err(|_| EngineError::InvalidToken { token: t, n_vocab: 256 })
            })
            .collect()
    }

    /// The messages' texts, one per line.
    fn chat_prompt_text(
        &self,
        messages: &[ChatMessage],
        _: &[ToolDefinition],
        _: &TemplateKwargs,
    ) -> Result<String, EngineError> {
        Ok(messages.iter().map(|m| format!("{}: {}\n", m.role.as_str(), m.content)).collect())
    }
}

/// The events of one scripted generation.
struct Scripted {
    events: VecDeque<Event>,
    finish_requested: Arc<AtomicBool>,
}

impl EventSource for Scripted {
    fn next(&mut self) -> BoxFuture<'_, Option<Event>> {
        Box::pin(std::future::ready(self.events.pop_front()))
    }

    fn finish_now(&self) {
        self.finish_requested.store(true, Ordering::Relaxed);
    }
}
