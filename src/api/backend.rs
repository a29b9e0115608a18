//! What the API needs from an engine, as a trait: the handlers run against [`crate::Engine`]
//! in production and against a scripted fake in unit tests, without a model.

use futures_util::future::BoxFuture;

use crate::chat::tools::ToolDefinition;
use crate::chat::{ChatMessage, TemplateKwargs};
use crate::engine::media::MediaInput;
use crate::engine::{
    CacheStatus, EngineError, EngineLoad, Event, Generation, GenerationRequest, ModelInfo, PrefillReport,
    PreparedMedia, Prompt, RenderedPrompt, ThreadsInUse,
};
use crate::Engine;

/// The engine as the handlers use it.
pub(crate) trait Backend: Send + Sync + 'static {
    /// Facts about the loaded model.
    ///
    /// # Errors
    /// [`EngineError::Loading`] while the model loads, or its load failure.
    fn model_info(&self) -> Result<ModelInfo, EngineError>;

    /// Fails as a submission now would for lack of room.
    ///
    /// # Errors
    /// [`EngineError::QueueFull`] or [`EngineError::ShuttingDown`].
    fn ensure_room(&self) -> Result<(), EngineError>;

    /// Renders a prompt through the chat template: CPU work that grows with the conversation,
    /// done on a conversion thread, never on the async runtime.
    ///
    /// # Errors
    /// Not loaded, or the chat template rejected the messages.
    fn render(&self, prompt: &Prompt) -> Result<RenderedPrompt, EngineError>;

    /// Decodes and tokenizes a request's media, for [`RenderedPrompt::with_media`]: CPU work
    /// that grows with the pictures and clips, done on a conversion thread so the inference
    /// thread only evaluates them.
    ///
    /// # Errors
    /// Not loaded, or a part that cannot be decoded (naming it).
    fn prepare_media(&self, media: &[MediaInput]) -> Result<PreparedMedia, EngineError>;

    /// Queues a request whose prompt [`Backend::render`] rendered; its events arrive on the
    /// returned source.
    ///
    /// # Errors
    /// Not loaded, shutting down, or queue full.
    fn submit(&self, request: GenerationRequest, rendered: RenderedPrompt)
        -> Result<Box<dyn EventSource>, EngineError>;

    /// Queues a prefill (the prompt only, no generation); the returned future gives its
    /// report.
    ///
    /// # Errors
    /// As [`Backend::submit`].
    fn prefill(&self, request: GenerationRequest, rendered: RenderedPrompt) -> Result<PrefillFuture, EngineError>;

    /// What the cache holds.
    fn cache_status(&self) -> CacheStatus;

    /// Requests running and waiting.
    fn load(&self) -> EngineLoad;

    /// The threads llama.cpp computes with now; `None` where there is no llama.cpp (the
    /// scripted engine of the unit tests).
    fn threads(&self) -> Option<ThreadsInUse> {
        None
    }

    /// `text`'s token ids, on the calling thread (a conversion thread: it has the large stack
    /// tokenizing needs).
    ///
    /// # Errors
    /// Not loaded, or text that cannot be tokenized safely.
    fn tokenize(&self, text: &str, add_special: bool, parse_special: bool) -> Result<Vec<i32>, EngineError>;

    /// Each token's bytes.
    ///
    /// # Errors
    /// Not loaded, or an id outside the vocabulary.
    fn token_pieces(&self, tokens: &[i32]) -> Result<Vec<Vec<u8>>, EngineError>;

    /// The prompt text of a chat.
    ///
    /// # Errors
    /// Not loaded, or the template rejected the messages.
    fn chat_prompt_text(
        &self,
        messages: &[ChatMessage],
        tools: &[ToolDefinition],
        kwargs: &TemplateKwargs,
    ) -> Result<String, EngineError>;
}

/// A queued prefill's outcome. Dropping it cancels the prefill.
pub(crate) type PrefillFuture = BoxFuture<'static, Result<PrefillReport, EngineError>>;

/// The events of one submitted request. Dropping it cancels the generation.
pub(crate) trait EventSource: Send {
    /// The next event; `None` after `Finished` or `Failed`.
    fn next(&mut self) -> BoxFuture<'_, Option<Event>>;

    /// Ends generation at the next token as if the model had stopped (`Finished` still comes).
    fn finish_now(&self);
}

impl Backend for Engine {
    fn model_info(&self) -> Result<ModelInfo, EngineError> {
        Engine::model_info(self)
    }

    fn ensure_room(&self) -> Result<(), EngineError> {
        Engine::ensure_room(self)
    }

    fn render(&self, prompt: &Prompt) -> Result<RenderedPrompt, EngineError> {
        Engine::render(self, prompt)
    }

    fn prepare_media(&self, media: &[MediaInput]) -> Result<PreparedMedia, EngineError> {
        Engine::prepare_media(self, media)
    }

    fn submit(
        &self,
        request: GenerationRequest,
        rendered: RenderedPrompt,
    ) -> Result<Box<dyn EventSource>, EngineError> {
        Ok(Box::new(Engine::submit_rendered(self, request, rendered)?))
    }

    fn prefill(&self, request: GenerationRequest, rendered: RenderedPrompt) -> Result<PrefillFuture, EngineError> {
        Ok(Box::pin(Engine::prefill_rendered(self, request, rendered)?.wait()))
    }

    fn cache_status(&self) -> CacheStatus {
        Engine::cache_status(self)
    }

    fn load(&self) -> EngineLoad {
        Engine::load(self)
    }

    fn threads(&self) -> Option<ThreadsInUse> {
        Some(Engine::threads(self))
    }

    fn tokenize(&self, text: &str, add_special: bool, parse_special: bool) -> Result<Vec<i32>, EngineError> {
        Engine::tokenize_here(self, text, add_special, parse_special)
    }

    fn token_pieces(&self, tokens: &[i32]) -> Result<Vec<Vec<u8>>, EngineError> {
        Engine::token_pieces(self, tokens)
    }

    fn chat_prompt_text(
        &self,
        messages: &[ChatMessage],
        tools: &[ToolDefinition],
        kwargs: &TemplateKwargs,
    ) -> Result<String, EngineError> {
        Engine::chat_prompt_text(self, messages, tools, kwargs)
    }
}

impl EventSource for Generation {
    fn next(&mut self) -> BoxFuture<'_, Option<Event>> {
        Box::pin(Generation::next(self))
    }

    fn finish_now(&self) {
        Generation::finish_now(self);
    }
}
