//! What callers send to the engine and the events they get back.
//!
//! These are the engine's own types: the HTTP layer translates OpenAI wire types into them and
//! back, so the engine knows nothing about JSON or SSE.

use std::time::Duration;

use crate::chat::tools::ToolDefinition;
use crate::chat::{ChatMessage, Grammar};
use crate::engine::{EngineError, SamplingParams};

/// The text to continue.
#[derive(Clone, Debug)]
pub enum Prompt {
    /// A conversation, rendered through the model's chat template with a generation prompt.
    Chat {
        /// The conversation so far.
        messages: Vec<ChatMessage>,
        /// Functions the model may call: given to templates that render tools, described in the
        /// system message for the others (see [`crate::chat::tools::prepare_messages`]).
        tools: Vec<ToolDefinition>,
    },
    /// Raw text, tokenized as is (special tokens in it are parsed).
    Text(String),
    /// Token ids, evaluated as given.
    Tokens(Vec<i32>),
}

/// One generation request.
#[derive(Clone, Debug)]
pub struct GenerationRequest {
    /// What to continue.
    pub prompt: Prompt,
    /// Most tokens to generate; `None`: the engine's `n_predict` cap
    /// ([`EngineConfig::n_predict`](crate::EngineConfig)), else until the context is full. `Some(0)` only prefills
    /// the prompt into the cache (useful to warm it before the user finishes speaking).
    pub max_tokens: Option<u32>,
    /// Generation ends before the first occurrence of any of these strings.
    pub stop: Vec<String>,
    /// How tokens are chosen.
    pub sampling: SamplingParams,
    /// A grammar the output must follow (tool calls, JSON output).
    pub grammar: Option<Grammar>,
    /// Special tokens to show as text (tool-call markers); other special tokens are not shown.
    pub preserved_tokens: Vec<String>,
}

impl GenerationRequest {
    /// A chat request with default sampling and no limits.
    #[must_use]
    pub fn chat(messages: Vec<ChatMessage>) -> Self {
        Self {
            prompt: Prompt::Chat { messages, tools: Vec::new() },
            max_tokens: None,
            stop: Vec::new(),
            sampling: SamplingParams::default(),
            grammar: None,
            preserved_tokens: Vec::new(),
        }
    }
}

/// Why generation ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// The model ended its turn or a stop string was reached.
    Stop,
    /// `max_tokens` or the context size was reached.
    Length,
}

/// Token counts of one request.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    /// Tokens in the prompt, cached ones included.
    pub prompt_tokens: u32,
    /// Prompt tokens whose KV was reused from the previous request.
    pub cached_tokens: u32,
    /// Tokens generated.
    pub completion_tokens: u32,
}

/// Where the time of one request went.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Timings {
    /// Time spent evaluating the uncached part of the prompt.
    pub prompt: Duration,
    /// Time from the first to the last generated token.
    pub generation: Duration,
    /// Speculative decoding's counts, when it is on.
    pub draft: Option<DraftStats>,
}

/// What speculative decoding did for one reply.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DraftStats {
    /// Tokens drafted and verified.
    pub drafted: u32,
    /// Of these, how many the target accepted.
    pub accepted: u32,
    /// Prompt tokens the drafter's own context evaluated to follow the target (a cached turn
    /// costs it only the new suffix; MTP's is the target's prompt evaluation itself).
    pub catch_up: u32,
}

/// Events of one generation, in order: `Started`, any number of `Text`, then `Finished` or
/// `Failed`. A `Failed` may also come first, instead of `Started`.
#[derive(Debug)]
pub enum Event {
    /// The prompt was accepted and is being evaluated.
    Started {
        /// Tokens in the prompt.
        prompt_tokens: u32,
        /// Of these, how many the KV cache already held.
        cached_tokens: u32,
    },
    /// Newly generated text (whole UTF-8 characters, stop strings withheld).
    Text(String),
    /// Generation ended normally.
    Finished {
        /// Why it ended.
        reason: FinishReason,
        /// Token counts.
        usage: Usage,
        /// Time spent.
        timings: Timings,
    },
    /// Generation could not start or was interrupted.
    Failed(EngineError),
}
