//! # firstword
//!
//! Serves a local GGUF model over an OpenAI-compatible API with the lowest possible time to
//! first token for one user: one long-lived llama.cpp context, whose KV cache is reused token
//! by token across requests, so a large system prompt re-sent every turn costs nothing after
//! the first.
//!
//! The crate is usable without HTTP: start an [`Engine`], submit a [`GenerationRequest`], read
//! [`Event`]s.
//!
//! ```
//! use firstword::{ChatMessage, Engine, EngineConfig, Event, GenerationRequest};
//!
//! // `make test` fetches this model; `models/fetch.py` does it on its own.
//! let engine = Engine::start(EngineConfig::new("models/SmolLM2-135M-Instruct.Q4_1.gguf"))?;
//! let mut request = GenerationRequest::chat(vec![
//!     ChatMessage::system("You are a concise assistant."),
//!     ChatMessage::user("Name three colours."),
//! ]);
//! request.max_tokens = Some(32);
//! let mut generation = engine.submit(request)?;
//! let mut answer = String::new();
//! while let Some(event) = generation.next_blocking() {
//!     match event {
//!         Event::Text(text) => answer.push_str(&text),
//!         Event::Finished { usage, .. } => assert!(usage.completion_tokens <= 32),
//!         Event::Failed(e) => return Err(e.into()),
//!         Event::Started { .. } | Event::Logprobs(_) => {}
//!     }
//! }
//! assert!(!answer.is_empty());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! Layout: [`chat`] is everything about text (chat templates, tool definitions, grammars, the
//! streaming tool-call parsers) and imports nothing else of the crate; [`engine`] owns llama.cpp
//! on one thread and uses `chat` to render prompts; [`api`] is the HTTP layer and only talks to
//! the engine through its handle; [`bench`] is the client-side benchmark.

pub mod api;
pub mod bench;
pub mod chat;
pub mod engine;
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing;

pub use chat::{ChatMessage, Grammar, Role};
pub use engine::{
    CacheMiss, CacheReport, CacheSource, CacheStatus, Engine, EngineConfig, EngineError, Event, FinishReason,
    Generation, GenerationRequest, ModelInfo, PendingPrefill, PrefillReport, Prompt, ReplyCut, SamplingParams,
    ThreadCounts, ThreadsInUse, Usage,
};
