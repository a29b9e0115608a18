//! `POST /v1/chat/completions`, streaming (SSE) and not.

use std::convert::Infallible;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_util::stream::{self, Stream};

use super::answer::AnswerShaper;
use super::convert::prepare_job;
use super::error::ApiError;
use super::extract::read_json;
use super::wire::{
    ChatCompletion, ChatCompletionChunk, ChatCompletionRequest, Choice, ChunkChoice, Delta, PromptTokensDetails,
    ResponseMessage, WireTimings, WireUsage,
};
use super::{unix_now, AppState};
use crate::engine::{EngineError, Event, Generation, Timings, Usage};

/// Sent as `system_fingerprint`: identifies the server build.
const FINGERPRINT: &str = concat!("firstword-", env!("CARGO_PKG_VERSION"));

fn wire_usage(usage: Usage) -> WireUsage {
    WireUsage {
        prompt_tokens: usage.prompt_tokens,
        completion_tokens: usage.completion_tokens,
        total_tokens: usage.prompt_tokens + usage.completion_tokens,
        prompt_tokens_details: PromptTokensDetails { cached_tokens: usage.cached_tokens },
    }
}

fn wire_timings(usage: Usage, timings: Timings) -> WireTimings {
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
    }
}

/// An error that ended a request after it was accepted.
fn late_error(error: Option<EngineError>) -> ApiError {
    error.map_or_else(
        || ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "the inference thread stopped unexpectedly"),
        ApiError::from,
    )
}

/// The handler.
pub(super) async fn chat_completions(
    State(state): State<Arc<AppState>>,
    request: Request,
) -> Result<Response, ApiError> {
    let model = state.engine.model_info()?;
    // Refused before the body is read when it could not run anyway, or when enough bodies are
    // being read already: concurrent large bodies would otherwise take unbounded memory.
    state.engine.ensure_room()?;
    let reading = state.bodies.try_acquire().map_err(|_| {
        ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "server busy: too many requests are being read")
            .with_code("queue_full")
    })?;
    let body: ChatCompletionRequest = read_json(request, state.body_timeout).await?;
    let job = prepare_job(&state.conversions, body, model).await?;
    drop(reading);
    let mut generation = state.engine.submit(job.request)?;
    // Rejections the engine finds (prompt too long, ...) arrive before `Started`: answer them
    // with a proper status instead of a 200 stream.
    match generation.next().await {
        Some(Event::Started { .. }) => {}
        Some(Event::Failed(e)) => return Err(e.into()),
        _ => return Err(late_error(None)),
    }
    let id = format!("chatcmpl-{}", random_id());
    let meta = ResponseMeta { id, model: job.model, created: unix_now() };
    let shaper = AnswerShaper::new(job.output);
    if job.stream {
        Ok(stream_response(generation, shaper, meta, job.include_usage).into_response())
    } else {
        complete_response(generation, shaper, &meta).await
    }
}

/// 24 random alphanumerics, for response ids.
fn random_id() -> String {
    std::iter::repeat_with(fastrand::alphanumeric).take(24).collect()
}

struct ResponseMeta {
    id: String,
    model: String,
    created: u64,
}

impl ResponseMeta {
    fn chunk(&self, choices: Vec<ChunkChoice>) -> ChatCompletionChunk<'_> {
        ChatCompletionChunk {
            id: &self.id,
            object: "chat.completion.chunk",
            created: self.created,
            model: &self.model,
            system_fingerprint: FINGERPRINT,
            choices,
            usage: None,
            timings: None,
        }
    }

    fn delta_chunk(&self, delta: Delta, finish_reason: Option<&'static str>) -> ChatCompletionChunk<'_> {
        self.chunk(vec![ChunkChoice { index: 0, delta, finish_reason, logprobs: None }])
    }
}

async fn complete_response(
    mut generation: Generation,
    mut shaper: AnswerShaper,
    meta: &ResponseMeta,
) -> Result<Response, ApiError> {
    loop {
        match generation.next().await {
            Some(Event::Text(text)) => {
                if shaper.text(text).done {
                    generation.finish_now();
                }
            }
            Some(Event::Finished { reason, usage, timings }) => {
                let ending = shaper.finish(reason)?;
                let body = ChatCompletion {
                    id: &meta.id,
                    object: "chat.completion",
                    created: meta.created,
                    model: &meta.model,
                    system_fingerprint: FINGERPRINT,
                    choices: [Choice {
                        index: 0,
                        message: ResponseMessage {
                            role: "assistant",
                            content: ending.content,
                            tool_calls: ending.calls,
                        },
                        finish_reason: ending.finish_reason,
                        logprobs: None,
                    }],
                    usage: wire_usage(usage),
                    timings: wire_timings(usage, timings),
                };
                return Ok(Json(body).into_response());
            }
            Some(Event::Failed(e)) => return Err(late_error(Some(e))),
            Some(Event::Started { .. }) => {}
            None => return Err(late_error(None)),
        }
    }
}

/// Where the SSE stream is.
enum StreamStage {
    /// The role chunk is next.
    Opening,
    /// Relaying engine events.
    Relaying,
    /// Only `[DONE]` is left.
    Closing,
    Done,
}

fn sse_json(value: &impl serde::Serialize) -> SseEvent {
    SseEvent::default().data(serde_json::to_string(value).unwrap_or_default())
}

fn stream_response(
    generation: Generation,
    shaper: AnswerShaper,
    meta: ResponseMeta,
    include_usage: bool,
) -> Sse<impl Stream<Item = Result<SseEvent, Infallible>>> {
    let state = (generation, Some(shaper), meta, StreamStage::Opening);
    let events = stream::unfold(state, move |(mut generation, mut shaper, meta, stage)| async move {
        let (events, next_stage) = match stage {
            StreamStage::Opening => {
                // No `content` until there is text: clients rebuild `""` into the message they
                // send back, and OpenAI sends none before a reply of only tool calls.
                let delta = Delta { role: Some("assistant"), ..Delta::default() };
                (vec![sse_json(&meta.delta_chunk(delta, None))], StreamStage::Relaying)
            }
            StreamStage::Relaying => match generation.next().await {
                Some(Event::Text(text)) => {
                    let mut events = Vec::new();
                    if let Some(shaped) = shaper.as_mut().map(|s| s.text(text)) {
                        if shaped.done {
                            generation.finish_now();
                        }
                        events.extend(shaped.deltas.into_iter().map(|d| sse_json(&meta.delta_chunk(d, None))));
                    }
                    (events, StreamStage::Relaying)
                }
                Some(Event::Started { .. }) => (Vec::new(), StreamStage::Relaying),
                Some(Event::Finished { reason, usage, timings }) => match shaper.take().map(|s| s.finish(reason)) {
                    Some(Ok(ending)) => {
                        let mut events: Vec<SseEvent> =
                            ending.deltas.into_iter().map(|d| sse_json(&meta.delta_chunk(d, None))).collect();
                        let mut last = meta.delta_chunk(Delta::default(), Some(ending.finish_reason));
                        last.timings = Some(wire_timings(usage, timings));
                        events.push(sse_json(&last));
                        if include_usage {
                            let mut usage_chunk = meta.chunk(Vec::new());
                            usage_chunk.usage = Some(wire_usage(usage));
                            events.push(sse_json(&usage_chunk));
                        }
                        (events, StreamStage::Closing)
                    }
                    Some(Err(e)) => (vec![SseEvent::default().data(e.to_json())], StreamStage::Closing),
                    None => (vec![SseEvent::default().data(late_error(None).to_json())], StreamStage::Closing),
                },
                Some(Event::Failed(e)) => {
                    (vec![SseEvent::default().data(late_error(Some(e)).to_json())], StreamStage::Closing)
                }
                None => (vec![SseEvent::default().data(late_error(None).to_json())], StreamStage::Closing),
            },
            StreamStage::Closing => (vec![SseEvent::default().data("[DONE]")], StreamStage::Done),
            StreamStage::Done => return None,
        };
        Some((stream::iter(events.into_iter().map(Ok)), (generation, shaper, meta, next_stage)))
    });
    Sse::new(futures_util::StreamExt::flatten(events)).keep_alive(KeepAlive::default())
}
