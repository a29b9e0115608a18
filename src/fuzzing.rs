//! Entry points for the cargo-fuzz targets in `fuzz/` into code the crate keeps private (built
//! only with the `fuzzing` feature). The HTTP layer's modules are private to [`crate::api`], so
//! [`Api`]'s functions are defined next to the code they call: request validation in
//! `api/convert.rs`, SSE framing in `api/frame.rs`. Everything public (tool-call parsers,
//! schemas and grammars, chat templates) the targets use directly.

use crate::chat::{ChatTemplate, RenderLimits, TemplateError};

/// The HTTP layer's request validation and SSE framing.
#[derive(Debug)]
pub struct Api;

/// The SSE payloads of one streamed answer.
#[derive(Debug, Default)]
pub struct SseTranscript {
    /// The first payload (the role chunk), sent before any event.
    pub opening: String,
    /// What each engine event became, in order; the last one has `done` set.
    pub steps: Vec<SseStep>,
}

/// What the SSE framer sent for one engine event.
#[derive(Debug)]
pub struct SseStep {
    /// The `data:` payloads, in order.
    pub data: Vec<String>,
    /// The reply is complete: the engine is told to end generation.
    pub finish_now: bool,
    /// The stream is over (its last payload is `[DONE]`).
    pub done: bool,
}

/// A chat template rendered under other limits than the server's (fuel: most template steps;
/// `output_bytes`: longest output), so the fuzzer can check the limits hold without spending
/// seconds on each input. `<s>` and `</s>` are its BOS and EOS texts.
///
/// # Errors
/// [`TemplateError::Compile`] if the source does not parse.
pub fn template_with_limits(source: &str, fuel: u64, output_bytes: usize) -> Result<ChatTemplate, TemplateError> {
    ChatTemplate::with_limits(source, "<s>", "</s>", RenderLimits { fuel, output_bytes })
}
