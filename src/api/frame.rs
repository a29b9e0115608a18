//! Engine events framed as OpenAI responses: the non-streaming body, and the stream's SSE
//! payloads as a pure state machine (no I/O: push an event, get the `data:` payloads to send).

use super::answer::{AnswerShaper, Ending};
use super::error::ApiError;
use super::logprobs::ChatLogprobs;
use super::wire::{
    ChatCompletion, Choice, ChunkChoice, CompletionObject, CompletionTokensDetails, Delta, PromptTokensDetails,
    ResponseMessage, WireCache, WireChangedSpan, WireChanges, WireReplyCut, WireRequestPath, WireShared, WireTimings,
    WireUsage,
};
use crate::engine::{CacheMiss, CacheReport, Event, RequestPath, Timings, TokenLogprob, Usage};

/// Sent as `system_fingerprint`: identifies the server build.
const FINGERPRINT: &str = concat!("firstword-", env!("CARGO_PKG_VERSION"));

/// The payload that ends every stream.
pub(super) const DONE: &str = "[DONE]";

pub(super) fn wire_usage(usage: Usage) -> WireUsage {
    WireUsage {
        prompt_tokens: usage.prompt_tokens,
        completion_tokens: usage.completion_tokens,
        total_tokens: usage.prompt_tokens + usage.completion_tokens,
        prompt_tokens_details: PromptTokensDetails { cached_tokens: usage.cached_tokens },
        completion_tokens_details: CompletionTokensDetails { reasoning_tokens: usage.reasoning_tokens },
    }
}

pub(super) fn wire_timings(usage: Usage, timings: Timings) -> WireTimings {
    let prompt_n = usage.prompt_tokens - usage.cached_tokens;
    let prompt_ms = timings.prompt.as_secs_f64() * 1e3;
    let predicted_ms = timings.generation.as_secs_f64() * 1e3;
    let per =
        |n: u32, ms: f64| if n == 0 { (0.0, 0.0) } else { (ms / f64::from(n), f64::from(n) * 1e3 / ms.max(1e-9)) };
    let (prompt_per_token_ms, prompt_per_second) = per(prompt_n, prompt_ms);
    let (predicted_per_token_ms, predicted_per_second) = per(usage.completion_tokens, predicted_ms);
    WireTimings {
        cache_n: usage.cached_tokens,
        prompt_n,
        prompt_ms,
        prompt_per_token_ms,
        prompt_per_second,
        predicted_n: usage.completion_tokens,
        predicted_ms,
        predicted_per_token_ms,
        predicted_per_second,
        draft_n: timings.draft.map(|d| d.drafted),
        draft_n_accepted: timings.draft.map(|d| d.accepted),
        cache: wire_cache(timings.cache),
        shared: timings
            .shared
            .map(|shared| WireShared { sequence: shared.sequence, replies_beside: shared.replies_beside }),
        dropped_messages: (usage.dropped_messages > 0).then_some(usage.dropped_messages),
        request_ms: timings.request.map(|path| ms(path.total)),
        request: timings.request.map(wire_request_path),
    }
}

fn ms(duration: std::time::Duration) -> f64 {
    duration.as_secs_f64() * 1e3
}

pub(super) fn wire_request_path(path: RequestPath) -> WireRequestPath {
    WireRequestPath {
        read_ms: ms(path.read),
        parse_ms: ms(path.parse),
        render_ms: ms(path.render),
        tokenize_ms: ms(path.tokenize),
        tokens_kept: path.tokens_kept,
        queue_ms: ms(path.queue),
        match_ms: ms(path.matching),
    }
}

pub(super) fn wire_cache(cache: CacheReport) -> WireCache {
    let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
    WireCache {
        source: cache.source.as_str(),
        reused: cache.reused,
        prefilled: cache.prefilled,
        diverged_at: cache.diverged_at,
        reason: cache.reason.map(CacheMiss::as_str),
        save_ms: cache.save.map(ms),
        restore_ms: cache.restore.map(ms),
        adopted: (cache.adopted > 0).then_some(cache.adopted),
        reply_cut: cache.reply_cut.map(|cut| WireReplyCut { kept: cut.kept, held: cut.held }),
        changes: cache.changes.map(|changes| WireChanges {
            spans: (changes.spans.iter())
                .map(|span| WireChangedSpan { at: span.at, old_len: span.old_len, new_len: span.new_len })
                .collect(),
            kept: changes.kept,
            evaluated: changes.evaluated,
        }),
    }
}

/// What every response and chunk of one answer shares.
pub(super) struct ResponseMeta {
    /// `chatcmpl-…`.
    pub id: String,
    /// The model name answered with.
    pub model: String,
    /// Unix seconds.
    pub created: u64,
}

impl ResponseMeta {
    /// An `object` of `choices` (no usage or timings yet).
    pub(super) fn object<C>(&self, object: &'static str, choices: Vec<C>) -> CompletionObject<'_, C> {
        CompletionObject {
            id: &self.id,
            object,
            created: self.created,
            model: &self.model,
            system_fingerprint: FINGERPRINT,
            choices,
            usage: None,
            timings: None,
        }
    }

    fn chunk(&self, choices: Vec<ChunkChoice>) -> CompletionObject<'_, ChunkChoice> {
        self.object("chat.completion.chunk", choices)
    }

    fn delta_chunk(
        &self,
        delta: Delta,
        finish_reason: Option<&'static str>,
        logprobs: Option<ChatLogprobs>,
    ) -> CompletionObject<'_, ChunkChoice> {
        self.chunk(vec![ChunkChoice { index: 0, delta, finish_reason, logprobs }])
    }

    /// The non-streaming body of a finished reply (`logprobs` when they were asked for).
    pub(super) fn completion(
        &self,
        ending: Ending,
        usage: Usage,
        timings: Timings,
        logprobs: Option<Vec<TokenLogprob>>,
    ) -> ChatCompletion<'_> {
        ChatCompletion {
            id: &self.id,
            object: "chat.completion",
            created: self.created,
            model: &self.model,
            system_fingerprint: FINGERPRINT,
            choices: [Choice {
                index: 0,
                message: ResponseMessage {
                    role: "assistant",
                    content: ending.content,
                    reasoning_content: ending.reasoning,
                    tool_calls: ending.calls,
                },
                finish_reason: ending.finish_reason,
                logprobs: logprobs.map(ChatLogprobs::of),
            }],
            usage: wire_usage(usage),
            timings: wire_timings(usage, timings),
        }
    }
}

pub(super) fn json(value: &impl serde::Serialize) -> String {
    serde_json::to_string(value).unwrap_or_default()
}

/// What one engine event became in the stream.
#[derive(Debug, Default)]
pub(super) struct Frames {
    /// `data:` payloads to send, in order.
    pub data: Vec<String>,
    /// The reply is complete: generation should end now.
    pub finish_now: bool,
    /// The stream is over: the last payload is [`DONE`] and no event is read after it.
    pub done: bool,
}

/// The SSE stream of one answer: the role chunk, content and call deltas, the finish chunk
/// (with usage when asked), and `[DONE]`. A failure after the stream opened (the status is
/// already 200) is sent as an error envelope before `[DONE]`.
pub(super) struct SseFramer {
    meta: ResponseMeta,
    /// `None` once the reply has ended.
    shaper: Option<AnswerShaper>,
    include_usage: bool,
    /// Log-probabilities not sent yet, which go with the next chunk; `None` when the request
    /// did not ask for them.
    logprobs: Option<Vec<TokenLogprob>>,
}

impl SseFramer {
    /// A stream of `shaper`'s reply; `include_usage` adds a usage chunk before `[DONE]`,
    /// `logprobs` sends the tokens' log-probabilities with the chunks of their text.
    pub(super) fn new(meta: ResponseMeta, shaper: AnswerShaper, include_usage: bool, logprobs: bool) -> Self {
        Self { meta, shaper: Some(shaper), include_usage, logprobs: logprobs.then(Vec::new) }
    }

    /// The first payload: the role, and no `content` until there is text (clients rebuild `""`
    /// into the message they send back, and OpenAI sends none before a reply of only calls).
    pub(super) fn opening(&self) -> String {
        json(&self.meta.delta_chunk(Delta { role: Some("assistant"), ..Delta::default() }, None, None))
    }

    /// The log-probabilities waiting to be sent, if any.
    fn take_logprobs(&mut self) -> Option<ChatLogprobs> {
        self.logprobs
            .as_mut()
            .filter(|pending| !pending.is_empty())
            .map(|pending| ChatLogprobs::of(std::mem::take(pending)))
    }

    /// The chunks of `deltas`, the first with the log-probabilities waiting.
    fn delta_chunks(&mut self, deltas: Vec<Delta>) -> Vec<String> {
        deltas
            .into_iter()
            .map(|delta| {
                let logprobs = self.take_logprobs();
                json(&self.meta.delta_chunk(delta, None, logprobs))
            })
            .collect()
    }

    /// The payloads for the next engine event; `None` when the events ended without
    /// `Finished` or `Failed`.
    pub(super) fn push(&mut self, event: Option<Event>) -> Frames {
        match event {
            Some(Event::Started { .. }) => Frames::default(),
            Some(Event::Logprobs(tokens)) => {
                if let Some(pending) = self.logprobs.as_mut() {
                    pending.extend(tokens);
                }
                Frames::default()
            }
            Some(Event::Text(text)) => match self.shaper.as_mut().map(|s| s.text(text)) {
                Some(shaped) => Frames { data: self.delta_chunks(shaped.deltas), finish_now: shaped.done, done: false },
                None => Frames::default(),
            },
            Some(Event::Finished { reason, usage, timings }) => match self.shaper.take().map(|s| s.finish(reason)) {
                Some(Ok(ending)) => {
                    let mut data = self.delta_chunks(ending.deltas);
                    let logprobs = self.take_logprobs();
                    let mut last = self.meta.delta_chunk(Delta::default(), Some(ending.finish_reason), logprobs);
                    last.timings = Some(wire_timings(usage, timings));
                    data.push(json(&last));
                    if self.include_usage {
                        let mut usage_chunk = self.meta.chunk(Vec::new());
                        usage_chunk.usage = Some(wire_usage(usage));
                        data.push(json(&usage_chunk));
                    }
                    closing(data)
                }
                Some(Err(e)) => failed(e.into()),
                None => failed(ApiError::EngineStopped),
            },
            Some(Event::Failed(e)) => failed(e.into()),
            None => failed(ApiError::EngineStopped),
        }
    }
}

/// The stream's last payloads: `data`, then [`DONE`].
fn closing(mut data: Vec<String>) -> Frames {
    data.push(DONE.to_string());
    Frames { data, finish_now: false, done: true }
}

/// A stream ended by `error`.
fn failed(error: ApiError) -> Frames {
    closing(vec![error.to_json()])
}

#[cfg(feature = "fuzzing")]
impl crate::fuzzing::Api {
    /// The SSE payloads of an answer made under a reply plan (the model's call `format`, the
    /// `tools` it may call, the `schema` a JSON reply must match), as `POST
    /// /v1/chat/completions` streams them: `next` gives each engine event, told whether the
    /// framer has asked generation to end, until the stream is done.
    pub fn stream(
        format: crate::chat::tools::ToolFormat,
        tools: Option<crate::chat::tools::ToolSet>,
        schema: Option<crate::chat::tools::OutputSchema>,
        include_usage: bool,
        mut next: impl FnMut(bool) -> Option<Event>,
    ) -> crate::fuzzing::SseTranscript {
        let meta = ResponseMeta { id: "chatcmpl-fuzz".into(), model: "fuzz".into(), created: 0 };
        let plan = super::convert::OutputPlan { format, tools, schema, reasoning: None };
        let mut framer = SseFramer::new(meta, AnswerShaper::new(plan, false), include_usage, false);
        let mut transcript = crate::fuzzing::SseTranscript { opening: framer.opening(), steps: Vec::new() };
        let mut finish_now = false;
        loop {
            let Frames { data, finish_now: finish, done } = framer.push(next(finish_now));
            finish_now |= finish;
            transcript.steps.push(crate::fuzzing::SseStep { data, finish_now: finish, done });
            if done {
                return transcript;
            }
        }
    }
}

#[cfg(test)]
mod tests;
