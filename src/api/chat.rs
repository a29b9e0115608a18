//! `POST /v1/chat/completions`, streaming (SSE) and not.

use std::convert::Infallible;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_util::stream::{self, Stream, StreamExt};

use super::answer::AnswerShaper;
use super::backend::EventSource;
use super::convert::{prepare_job, ChatJob};
use super::error::ApiError;
use super::extract::read_json;
use super::frame::{ResponseMeta, SseFramer};
use super::request_log::RequestRecord;
use super::wire::ChatCompletionRequest;
use super::{unix_now, AppState};
use crate::engine::Event;

/// The handler.
pub(super) async fn chat_completions(
    State(state): State<Arc<AppState>>,
    request: Request,
) -> Result<Response, ApiError> {
    let record = RequestRecord::of(&request);
    fail::fail_point!("api::chat");
    let job = read_chat_job(&state, request).await?;
    let mut events = state.engine.submit(job.request)?;
    // Rejections the engine finds (prompt too long, ...) arrive before `Started`: answer them
    // with a proper status instead of a 200 stream.
    match events.next().await {
        Some(Event::Started { .. }) => {}
        Some(Event::Failed(e)) => return Err(e.into()),
        _ => return Err(ApiError::EngineStopped),
    }
    let id = format!("chatcmpl-{}", random_id());
    let meta = ResponseMeta { id, model: job.model, created: unix_now() };
    let shaper = AnswerShaper::new(job.output);
    if job.stream {
        Ok(stream_response(events, SseFramer::new(meta, shaper, job.include_usage), record).into_response())
    } else {
        complete_response(events, shaper, &meta, &record).await
    }
}

/// Reads and checks a chat-completions body (also `/v1/prefill`'s) into an engine job.
pub(super) async fn read_chat_job(state: &AppState, request: Request) -> Result<ChatJob, ApiError> {
    let model = state.engine.model_info()?;
    // Refused before the body is read when it could not run anyway, or when enough bodies are
    // being read already: concurrent large bodies would otherwise take unbounded memory.
    state.engine.ensure_room()?;
    let _reading = state.bodies.try_acquire().map_err(|_| ApiError::Busy("read"))?;
    let body: ChatCompletionRequest = read_json(request, state.body_timeout).await?;
    prepare_job(&state.conversions, body, model).await
}

/// 24 random alphanumerics, for response ids.
fn random_id() -> String {
    std::iter::repeat_with(fastrand::alphanumeric).take(24).collect()
}

async fn complete_response(
    mut events: Box<dyn EventSource>,
    mut shaper: AnswerShaper,
    meta: &ResponseMeta,
    record: &RequestRecord,
) -> Result<Response, ApiError> {
    loop {
        let event = events.next().await;
        if let Some(event) = &event {
            record.observe(event);
        }
        match event {
            Some(Event::Text(text)) => {
                if shaper.text(text).done {
                    events.finish_now();
                }
            }
            Some(Event::Finished { reason, usage, timings }) => {
                let ending = shaper.finish(reason)?;
                return Ok(Json(meta.completion(ending, usage, timings)).into_response());
            }
            Some(Event::Failed(e)) => return Err(e.into()),
            Some(Event::Started { .. }) => {}
            None => return Err(ApiError::EngineStopped),
        }
    }
}

/// Relays `events` through `framer` until it says the stream is done (noting them in `record`
/// for the request's log line).
fn stream_response(
    events: Box<dyn EventSource>,
    framer: SseFramer,
    record: RequestRecord,
) -> Sse<impl Stream<Item = Result<SseEvent, Infallible>>> {
    let opening = stream::once(std::future::ready(framer.opening()));
    let relayed = stream::unfold(Some((events, framer, record)), |state| async move {
        let (mut events, mut framer, record) = state?;
        let event = events.next().await;
        if let Some(event) = &event {
            record.observe(event);
        }
        let frames = framer.push(event);
        if frames.finish_now {
            events.finish_now();
        }
        let next = (!frames.done).then_some((events, framer, record));
        Some((stream::iter(frames.data), next))
    })
    .flatten();
    let payloads = opening.chain(relayed);
    Sse::new(payloads.map(|data| Ok(SseEvent::default().data(data)))).keep_alive(KeepAlive::default())
}
