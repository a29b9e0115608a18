//! `POST /v1/chat/completions`, streaming (SSE) and not; and what the completion endpoints
//! share: submitting a job, relaying its events as a stream, collecting a whole answer.

use std::convert::Infallible;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_util::stream::{self, Stream, StreamExt};

use super::admission::{prepare_job, BodyPermit, Prepared};
use super::answer::{AnswerShaper, Ending};
use super::backend::EventSource;
use super::convert::{ChatBody, ChatJob};
use super::error::ApiError;
use super::frame::{Frames, ResponseMeta, SseFramer};
use super::request_log::RequestRecord;
use super::{unix_now, AppState};
use crate::engine::{Event, GenerationRequest, RenderedPrompt, Timings, TokenLogprob, Usage};

/// The handler.
pub(super) async fn chat_completions(
    State(state): State<Arc<AppState>>,
    request: Request,
) -> Result<Response, ApiError> {
    let record = RequestRecord::of(&request);
    fail::fail_point!("api::chat");
    let Prepared { value: (job, rendered), permit } = read_chat_job(&state, request).await?;
    let logprobs = job.request.logprobs.is_some();
    let (events, in_reasoning) = start(&state, job.request, rendered, permit).await?;
    let meta = ResponseMeta { id: format!("chatcmpl-{}", random_id()), model: job.model, created: unix_now() };
    let shaper = AnswerShaper::new(job.output, in_reasoning);
    if job.stream {
        Ok(stream_response(events, SseFramer::new(meta, shaper, job.include_usage, logprobs), record).into_response())
    } else {
        let answer = collect(events, shaper, &record).await?;
        let logprobs = logprobs.then_some(answer.logprobs);
        Ok(Json(meta.completion(answer.ending, answer.usage, answer.timings, logprobs)).into_response())
    }
}

/// Reads and checks a chat-completions body (also `/v1/prefill`'s) into an engine job, its
/// prompt rendered, on the admission path.
pub(super) async fn read_chat_job(
    state: &AppState,
    request: Request,
) -> Result<Prepared<(ChatJob, RenderedPrompt)>, ApiError> {
    let model = state.engine.model_info()?;
    prepare_job(state, request, move |bytes| ChatBody::parse(bytes)?.into_job(&model), |job: &ChatJob| &job.request)
        .await
}

/// Submits `request` (its prompt `rendered`) and waits until the engine accepts it:
/// rejections the engine finds (prompt too long, ...) arrive before `Started` and are answered
/// with their own status instead of a 200 stream. The body `permit` goes once the request is
/// queued. Returns the events and whether the prompt opened the model's reasoning.
pub(super) async fn start(
    state: &AppState,
    request: GenerationRequest,
    rendered: RenderedPrompt,
    permit: BodyPermit,
) -> Result<(Box<dyn EventSource>, bool), ApiError> {
    let mut events = state.engine.submit(request, rendered)?;
    drop(permit);
    match events.next().await {
        Some(Event::Started { in_reasoning, .. }) => Ok((events, in_reasoning)),
        Some(Event::Failed(e)) => Err(e.into()),
        _ => Err(ApiError::EngineStopped),
    }
}

/// 24 random alphanumerics, for response ids.
pub(super) fn random_id() -> String {
    std::iter::repeat_with(fastrand::alphanumeric).take(24).collect()
}

/// A whole answer, collected from its events.
pub(super) struct Collected {
    /// The shaped answer.
    pub ending: Ending,
    pub usage: Usage,
    pub timings: Timings,
    /// The tokens' log-probabilities (empty unless they were asked for).
    pub logprobs: Vec<TokenLogprob>,
}

/// Reads `events` to the end of the answer through `shaper` (noting them in `record` for the
/// request's log line).
pub(super) async fn collect(
    mut events: Box<dyn EventSource>,
    mut shaper: AnswerShaper,
    record: &RequestRecord,
) -> Result<Collected, ApiError> {
    let mut logprobs = Vec::new();
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
            Some(Event::Logprobs(tokens)) => logprobs.extend(tokens),
            Some(Event::Finished { reason, usage, timings }) => {
                return Ok(Collected { ending: shaper.finish(reason)?, usage, timings, logprobs });
            }
            Some(Event::Failed(e)) => return Err(e.into()),
            Some(Event::Started { .. }) => {}
            None => return Err(ApiError::EngineStopped),
        }
    }
}

/// Turns engine events into a stream's SSE events.
pub(super) trait EventFramer: Send + 'static {
    /// What the stream opens with, before any event.
    fn first_events(&mut self) -> Vec<SsePayload>;

    /// What the next event (`None`: the events ended) becomes.
    fn frame(&mut self, event: Option<Event>) -> Framed;
}

/// One SSE event to send: its name (`event:`), if it has one, and its data.
#[derive(Debug)]
pub(super) struct SsePayload {
    pub name: Option<&'static str>,
    pub data: String,
}

impl SsePayload {
    /// An event without a name.
    pub(super) fn data(data: String) -> Self {
        Self { name: None, data }
    }

    /// The event as sent: `event:` before `data:`, as OpenAI writes it (a parser that acts on
    /// each `data:` line reads the name of the event it belongs to).
    fn into_event(self) -> SseEvent {
        let event = match self.name {
            Some(name) => SseEvent::default().event(name),
            None => SseEvent::default(),
        };
        event.data(self.data)
    }
}

/// What one engine event became in a stream.
pub(super) struct Framed {
    /// SSE events to send, in order.
    pub events: Vec<SsePayload>,
    /// The reply is complete: generation should end now.
    pub finish_now: bool,
    /// The stream is over: no event is read after these.
    pub done: bool,
}

impl EventFramer for SseFramer {
    fn first_events(&mut self) -> Vec<SsePayload> {
        vec![SsePayload::data(self.opening())]
    }

    fn frame(&mut self, event: Option<Event>) -> Framed {
        let Frames { data, finish_now, done } = self.push(event);
        Framed { events: data.into_iter().map(SsePayload::data).collect(), finish_now, done }
    }
}

/// The next event through `framer` (noted in `record`); ends generation when the framer says
/// the reply is complete.
async fn next_framed(
    events: &mut Box<dyn EventSource>,
    framer: &mut impl EventFramer,
    record: &RequestRecord,
) -> Framed {
    let event = events.next().await;
    if let Some(event) = &event {
        record.observe(event);
    }
    let framed = framer.frame(event);
    if framed.finish_now {
        events.finish_now();
    }
    framed
}

/// Reads `events` through `framer` until it says the stream is done, without sending what it
/// frames: for an answer that is the stream's final state.
pub(super) async fn run_to_end(
    mut events: Box<dyn EventSource>,
    framer: &mut impl EventFramer,
    record: &RequestRecord,
) {
    while !next_framed(&mut events, framer, record).await.done {}
}

/// Relays `events` through `framer` until it says the stream is done (noting them in `record`
/// for the request's log line).
pub(super) fn stream_response(
    events: Box<dyn EventSource>,
    framer: impl EventFramer,
    record: RequestRecord,
) -> Sse<impl Stream<Item = Result<SseEvent, Infallible>>> {
    Sse::new(framed(events, framer, record).map(|payload| Ok(payload.into_event()))).keep_alive(KeepAlive::default())
}

/// Relays `events` through `framer` as newline-delimited JSON (Ollama's streams): each
/// payload's data one line. No keep-alive: an NDJSON client reads every line as an object.
pub(super) fn ndjson_response(
    events: Box<dyn EventSource>,
    framer: impl EventFramer,
    record: RequestRecord,
) -> Response {
    let lines = framed(events, framer, record).map(|payload| {
        let mut line = payload.data;
        line.push('\n');
        Ok::<_, Infallible>(axum::body::Bytes::from(line))
    });
    ([(axum::http::header::CONTENT_TYPE, "application/x-ndjson")], axum::body::Body::from_stream(lines)).into_response()
}

/// The payloads `framer` makes of `events`, its opening first, until it says the stream is done.
fn framed(
    events: Box<dyn EventSource>,
    mut framer: impl EventFramer,
    record: RequestRecord,
) -> impl Stream<Item = SsePayload> {
    let opening = stream::iter(framer.first_events());
    let relayed = stream::unfold(Some((events, framer, record)), |state| async move {
        let (mut events, mut framer, record) = state?;
        let framed = next_framed(&mut events, &mut framer, &record).await;
        let next = (!framed.done).then_some((events, framer, record));
        Some((stream::iter(framed.events), next))
    })
    .flatten();
    opening.chain(relayed)
}
