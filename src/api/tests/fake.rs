//! A scripted engine: fixed model facts and room, and one scripted event list per submission.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use futures_util::future::BoxFuture;
use parking_lot::{Mutex, RwLock};

use super::super::backend::{Backend, EventSource, PrefillFuture};
use crate::chat::tools::ToolDefinition;
use crate::chat::{ChatMessage, TemplateKwargs};
use crate::engine::{
    CacheStatus, EngineError, EngineLoad, Event, GenerationRequest, ModelInfo, PrefillReport, Prompt, RenderedPrompt,
};

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
    /// Rendering, tokenizing and looking up pieces wait while a test holds this for writing
    /// (so a test can keep conversions running).
    pub(super) hold: Arc<RwLock<()>>,
    /// The threads rendering, tokenizing and piece lookups ran on, by name.
    pub(super) worked_on: Mutex<Vec<String>>,
    /// Calls that are rendering, tokenizing or looking up pieces now.
    pub(super) working: AtomicUsize,
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
            hold: Arc::new(RwLock::new(())),
            worked_on: Mutex::new(Vec::new()),
            working: AtomicUsize::new(0),
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

impl FakeEngine {
    /// Notes the thread, then waits while a test holds [`FakeEngine::hold`].
    fn work(&self) {
        self.worked_on.lock().push(std::thread::current().name().unwrap_or("unnamed").to_string());
        self.working.fetch_add(1, Ordering::SeqCst);
        drop(self.hold.read());
        self.working.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Backend for FakeEngine {
    fn model_info(&self) -> Result<ModelInfo, EngineError> {
        self.info.clone()
    }

    fn ensure_room(&self) -> Result<(), EngineError> {
        self.room.clone()
    }

    fn render(&self, _: &Prompt) -> Result<RenderedPrompt, EngineError> {
        self.work();
        Ok(RenderedPrompt::empty())
    }

    fn prepare_media(
        &self,
        _: &[crate::engine::media::MediaInput],
    ) -> Result<crate::engine::PreparedMedia, EngineError> {
        Ok(crate::engine::PreparedMedia::default())
    }

    fn submit(&self, request: GenerationRequest, _: RenderedPrompt) -> Result<Box<dyn EventSource>, EngineError> {
        self.room.clone()?;
        self.submitted.lock().push(request);
        let events = std::mem::take(&mut *self.script.lock()).into();
        Ok(Box::new(Scripted { events, finish_requested: Arc::clone(&self.finish_requested) }))
    }

    fn prefill(&self, request: GenerationRequest, _: RenderedPrompt) -> Result<PrefillFuture, EngineError> {
        self.room.clone()?;
        self.submitted.lock().push(request);
        let outcome = self.prefilled.clone().ok_or(EngineError::ShuttingDown);
        Ok(Box::pin(std::future::ready(outcome)))
    }

    fn cache_status(&self) -> CacheStatus {
        self.cache.clone()
    }

    fn load(&self) -> EngineLoad {
        EngineLoad::default()
    }

    /// One token per byte.
    fn tokenize(&self, text: &str, _: bool, _: bool) -> Result<Vec<i32>, EngineError> {
        self.work();
        Ok(text.bytes().map(i32::from).collect())
    }

    /// Each id's byte.
    fn token_pieces(&self, tokens: &[i32]) -> Result<Vec<Vec<u8>>, EngineError> {
        self.work();
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
        self.work();
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
