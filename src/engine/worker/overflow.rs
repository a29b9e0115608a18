//! Fitting a prompt into the context: tokenized, checked against the context size, and, for a
//! chat that is too long under [`ContextOverflow::DropOldest`], shortened by its oldest turns.

use std::hash::{Hash, Hasher};

use llama_cpp_2::token::LlamaToken;

use super::{PromptInput, Session};
use crate::chat::tools::ToolDefinition;
use crate::chat::{ChatMessage, Landmarks, TemplateKwargs, Turns};
use crate::engine::media::MediaSpan;
use crate::engine::{ContextOverflow, EngineError, GenerationRequest, Prompt, CEILING_MIN_ROOM};

/// A prompt ready to evaluate.
pub(super) struct FittedPrompt {
    pub(super) tokens: Vec<LlamaToken>,
    /// Its text (none for token prompts).
    pub(super) text: Option<String>,
    /// Where its parts lie in the text.
    pub(super) landmarks: Landmarks,
    /// The most tokens the reply may have.
    pub(super) limit: u32,
    /// The conversation evaluated, when its oldest turns were left out.
    pub(super) shortened: Option<Prompt>,
    /// How many messages were left out.
    pub(super) dropped_messages: u32,
    /// The whole conversation's tokens, when its oldest turns were left out.
    pub(super) full_tokens: Option<Vec<LlamaToken>>,
    /// Where its media lie among its tokens.
    pub(super) media: Vec<MediaSpan>,
    /// Whether the request accepts cells a reuse past changed spans keeps from an older text
    /// (it asked, or the engine's default says so, and the prompt holds no media).
    pub(super) approximate: bool,
}

/// How many oldest turns the last shortened conversation left out, and a hash of their
/// messages: the next turn of that conversation leaves out the same ones while it fits, so its
/// prompt still continues the cache.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct LastDrop {
    turns: usize,
    hash: u64,
}

impl Session<'_> {
    /// Tokenizes `prompt` and checks that it fits the context with the reply's room; a chat
    /// that does not is shortened under [`ContextOverflow::DropOldest`].
    ///
    /// # Errors
    /// Tokenization errors; [`EngineError::ContextOverflow`] when it does not fit (with
    /// `DropOldest`: when its newest turn alone does not).
    pub(super) fn fit_prompt(
        &mut self,
        prompt: PromptInput,
        landmarks: Landmarks,
        request: &GenerationRequest,
    ) -> Result<FittedPrompt, EngineError> {
        let text = prompt.text().map(str::to_owned);
        let accepts = self.sequence.accepts_approximate(request.reuse_after_change);
        let (tokens, media) = self.prompt_tokens(prompt, &request.media)?;
        let overflow = match self.limit(tokens.len() as u32, request) {
            Ok(limit) => {
                return Ok(FittedPrompt {
                    tokens,
                    text,
                    landmarks,
                    limit,
                    shortened: None,
                    dropped_messages: 0,
                    full_tokens: None,
                    approximate: accepts && media.is_empty(),
                    media,
                })
            }
            Err(overflow) => overflow,
        };
        match &request.prompt {
            Prompt::Chat { messages, tools, template_kwargs }
                if self.context_overflow == ContextOverflow::DropOldest =>
            {
                let mut fitted =
                    self.drop_oldest(messages, tools, template_kwargs, request).map_err(|e| e.unwrap_or(overflow))?;
                fitted.full_tokens = Some(tokens);
                Ok(fitted)
            }
            _ => Err(overflow),
        }
    }

    /// `messages` without as few oldest turns as leave the reply its room within three
    /// quarters of the context (or, failing that, within the context). Tries the turns the
    /// last shortened conversation left out first. `Err(None)`: not even the newest turn fits.
    fn drop_oldest(
        &mut self,
        messages: &[ChatMessage],
        tools: &[ToolDefinition],
        kwargs: &TemplateKwargs,
        request: &GenerationRequest,
    ) -> Result<FittedPrompt, Option<EngineError>> {
        let last = self.last_drop;
        let turns = Turns::of(messages);
        let n_ctx = self.sequence.n_ctx();
        let accepts = self.sequence.accepts_approximate(request.reuse_after_change);
        // Without max_tokens the reply keeps a quarter of the context (or --n-predict, if less).
        let room = match request.max_tokens {
            Some(_) => required_room(request),
            None => self.n_predict.unwrap_or(n_ctx).min(n_ctx / 4),
        };
        let fits = |fitted: &FittedPrompt, target: u32| (fitted.tokens.len() as u32).saturating_add(room) <= target;
        let mut shorten = |dropped: usize| -> Result<FittedPrompt, EngineError> {
            let (kept, dropped_messages) =
                turns.without_oldest(dropped).ok_or_else(|| EngineError::Internal("no turn left to keep".into()))?;
            let rendered = self.chat.render_with(&kept, tools, kwargs)?;
            let (tokens, media) = self.prompt_tokens(PromptInput::Text(rendered.text.clone()), &request.media)?;
            let limit = self.limit(tokens.len() as u32, request)?;
            Ok(FittedPrompt {
                tokens,
                text: Some(rendered.text),
                landmarks: rendered.landmarks,
                limit,
                shortened: Some(Prompt::Chat {
                    messages: kept,
                    tools: tools.to_vec(),
                    template_kwargs: kwargs.clone(),
                }),
                dropped_messages: dropped_messages as u32,
                full_tokens: None,
                approximate: accepts && media.is_empty(),
                media,
            })
        };
        if last.turns > 0 && last.turns < turns.len() && hash_messages(turns.oldest(last.turns)) == last.hash {
            if let Ok(fitted) = shorten(last.turns) {
                if fits(&fitted, n_ctx) {
                    return Ok(fitted);
                }
            }
        }
        if turns.len() < 2 {
            return Err(None);
        }
        // Fewer turns are never longer: binary search for the fewest dropped that reach the
        // mark; the newest turn alone is the last resort.
        let mark = n_ctx / 4 * 3;
        let newest_only = turns.len() - 1;
        let (mut low, mut high) = (1, newest_only);
        let mut best = None;
        while low <= high {
            let middle = low + (high - low) / 2;
            match shorten(middle) {
                Ok(fitted) if fits(&fitted, mark) => {
                    best = Some((middle, fitted));
                    high = middle - 1;
                }
                Ok(_) | Err(EngineError::ContextOverflow { .. }) => low = middle + 1,
                Err(e) => return Err(Some(e)),
            }
        }
        let (dropped, fitted) = match best {
            Some(found) => found,
            None => (newest_only, shorten(newest_only).map_err(Some)?),
        };
        self.last_drop = LastDrop { turns: dropped, hash: hash_messages(turns.oldest(dropped)) };
        tracing::debug!(turns = dropped, messages = fitted.dropped_messages, "left out the oldest turns");
        Ok(fitted)
    }
}

/// The room a reply must have in the context after its prompt: its `max_tokens`, or, when that
/// is a ceiling ([`GenerationRequest::max_tokens_is_ceiling`]), only [`CEILING_MIN_ROOM`] (or
/// `max_tokens`, if less); none without `max_tokens`.
pub(super) fn required_room(request: &GenerationRequest) -> u32 {
    match request.max_tokens {
        Some(cap) if request.max_tokens_is_ceiling => cap.min(CEILING_MIN_ROOM),
        requested => requested.unwrap_or(0),
    }
}

/// The most tokens a reply to `prompt_tokens` may have in a context of `n_ctx`: the request's
/// `max_tokens`, else `n_predict`, and never past the context.
///
/// # Errors
/// [`EngineError::ContextOverflow`] when the prompt and the room the reply needs
/// ([`required_room`]) do not fit the context.
pub(super) fn reply_limit(
    prompt_tokens: u32,
    request: &GenerationRequest,
    n_ctx: u32,
    n_predict: Option<u32>,
) -> Result<u32, EngineError> {
    let required = required_room(request);
    let needed = prompt_tokens.saturating_add(required);
    if prompt_tokens >= n_ctx || needed > n_ctx {
        return Err(EngineError::ContextOverflow { prompt_tokens, max_tokens: required, needed, n_ctx });
    }
    Ok(request.max_tokens.or(n_predict).unwrap_or(u32::MAX).min(n_ctx - prompt_tokens))
}

/// A hash of messages' roles, texts and calls (which identifies a conversation's oldest turns).
fn hash_messages(messages: &[ChatMessage]) -> u64 {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    for message in messages {
        message.role.as_str().hash(&mut hasher);
        message.content.hash(&mut hasher);
        message.name.hash(&mut hasher);
        message.tool_call_id.hash(&mut hasher);
        for call in &message.tool_calls {
            (&call.id, &call.name, &call.arguments).hash(&mut hasher);
        }
    }
    hasher.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn asking(max_tokens: Option<u32>, ceiling: bool) -> GenerationRequest {
        GenerationRequest { max_tokens, max_tokens_is_ceiling: ceiling, ..GenerationRequest::chat(Vec::new()) }
    }

    fn needed(result: Result<u32, EngineError>) -> Option<(u32, u32)> {
        match result {
            Err(EngineError::ContextOverflow { max_tokens, needed, .. }) => Some((max_tokens, needed)),
            _ => None,
        }
    }

    #[test]
    fn max_tokens_is_room_the_prompt_must_leave_unless_it_is_a_ceiling() {
        // 300 s of audio: 4,480 tokens allowed, a 697-token prompt, a 2,048-token context.
        let required = asking(Some(4_480), false);
        assert_eq!(needed(reply_limit(697, &required, 2_048, None)), Some((4_480, 5_177)));
        let ceiling = asking(Some(4_480), true);
        assert_eq!(reply_limit(697, &ceiling, 2_048, None).ok(), Some(2_048 - 697));
        // A ceiling under the room left is the limit, as a required length is.
        assert_eq!(reply_limit(697, &asking(Some(300), true), 2_048, None).ok(), Some(300));
        assert_eq!(reply_limit(697, &asking(Some(300), false), 2_048, None).ok(), Some(300));
    }

    #[test]
    fn a_ceiling_still_needs_room_for_a_short_reply() {
        let ceiling = asking(Some(4_480), true);
        let last_fitting = 2_048 - CEILING_MIN_ROOM;
        assert_eq!(reply_limit(last_fitting, &ceiling, 2_048, None).ok(), Some(CEILING_MIN_ROOM));
        assert_eq!(needed(reply_limit(last_fitting + 1, &ceiling, 2_048, None)), Some((CEILING_MIN_ROOM, 2_048 + 1)));
        // A ceiling under the minimum needs only itself.
        assert_eq!(reply_limit(2_044, &asking(Some(4), true), 2_048, None).ok(), Some(4));
        assert!(reply_limit(2_048, &asking(Some(4), true), 2_048, None).is_err(), "a prompt filling the context");
    }

    #[test]
    fn without_max_tokens_the_engine_cap_applies_within_the_context() {
        let open = asking(None, false);
        assert_eq!(reply_limit(100, &open, 2_048, Some(512)).ok(), Some(512));
        assert_eq!(reply_limit(1_900, &open, 2_048, Some(512)).ok(), Some(148));
        assert_eq!(reply_limit(1_900, &open, 2_048, None).ok(), Some(148));
        assert!(reply_limit(2_048, &open, 2_048, None).is_err());
    }
}
