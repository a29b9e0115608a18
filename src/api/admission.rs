//! Admission: the one path every body-reading endpoint takes. A request takes a body permit
//! (waiting briefly, else 503), its body is read, then parsed, checked and rendered on a
//! conversion thread, off the async runtime; the permit stays with the request until it is
//! queued or answered (or, for a conversion that timed out, until that thread ends). So at
//! most [`super::CONCURRENT_BODIES`] bodies are held, read, parsed or converted at once,
//! and CPU work that grows with a body never stalls other connections or `/health`. A job's
//! images and audio are then decoded on a thread of their own under a media permit, so their
//! decoding stalls neither other conversions nor the inference thread.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::extract::Request;
use axum::http::header::CONTENT_TYPE;
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::error::ApiError;
use super::extract::read_body;
use super::AppState;
use crate::engine::{GenerationRequest, RenderedPrompt, LARGE_STACK_BYTES};

/// How long a request waits for a body permit before it is refused with 503.
const BODY_PERMIT_WAIT: Duration = Duration::from_millis(500);

/// Longest a request may take to become an engine job or an answer (the documented limits
/// keep real ones far below it); past it the request is refused, though its conversion runs
/// to its end (holding its permits).
const PREPARE_TIMEOUT: Duration = Duration::from_secs(5);

/// Longest a request's media may wait for a media permit, and then take to decode and
/// tokenize (16 parts at the most pixels take seconds on one core); past it the request is
/// refused.
const MEDIA_TIMEOUT: Duration = Duration::from_secs(120);

/// A request's body, read under its body permit.
pub(crate) struct Admitted {
    bytes: Bytes,
    permit: BodyPermit,
}

/// A body permit: while it lives, the request counts against [`super::CONCURRENT_BODIES`].
pub(crate) struct BodyPermit(#[allow(dead_code)] OwnedSemaphorePermit);

/// What a conversion made of a body, and the body's permit (drop it once the request is
/// queued or answered).
pub(crate) struct Prepared<T> {
    pub value: T,
    pub permit: BodyPermit,
}

/// Reads a request's body once the engine could run it: refused before the body is read
/// when it could not run anyway (see [`admit`]).
pub(crate) async fn admit_for_engine(state: &AppState, request: Request) -> Result<Admitted, ApiError> {
    state.engine.ensure_room()?;
    admit(state, request).await
}

/// Takes a body permit (waiting at most [`BODY_PERMIT_WAIT`], else 503) and reads the body.
pub(crate) async fn admit(state: &AppState, request: Request) -> Result<Admitted, ApiError> {
    let busy = || ApiError::Busy("read");
    let permit = tokio::time::timeout(BODY_PERMIT_WAIT, Arc::clone(&state.bodies).acquire_owned())
        .await
        .map_err(|_| busy())?
        .map_err(|_| busy())?;
    let bytes = read_body(request, state.body_timeout).await?;
    Ok(Admitted { bytes, permit: BodyPermit(permit) })
}

/// Runs `convert` on an admitted body (parsing, validation, conversion into an engine job,
/// rendering: CPU work that grows with the body) on a thread of its own with a large stack,
/// off the async runtime: llama.cpp's schema converter, the schema validator and tokenizing
/// recurse. At most [`super::CONCURRENT_CONVERSIONS`] conversions run at once; a request
/// waits [`PREPARE_TIMEOUT`] for one (503 after), and one that runs longer is refused
/// (its thread keeps both permits, and the body, until it ends).
pub(crate) async fn prepare<T: Send + 'static>(
    state: &AppState,
    admitted: Admitted,
    convert: impl FnOnce(&[u8]) -> Result<T, ApiError> + Send + 'static,
) -> Result<Prepared<T>, ApiError> {
    let Admitted { bytes, permit } = admitted;
    let work = move || {
        let converted = convert(&bytes);
        drop(bytes);
        // Unanswered (timed out): the permit and what was made go with the thread.
        converted.map(|value| Prepared { value, permit })
    };
    let late = ApiError::PrepareTimeout(PREPARE_TIMEOUT);
    on_own_thread(&state.conversions, PREPARE_TIMEOUT, work, late).await
}

/// Runs `work` on a thread of its own (see [`prepare`]) under one of `permits`: refused with
/// 503 when none comes within `limit`, with `late` when `work` runs past `limit` (its thread
/// then runs to its end, holding its permit).
async fn on_own_thread<T: Send + 'static>(
    permits: &Arc<Semaphore>,
    limit: Duration,
    work: impl FnOnce() -> Result<T, ApiError> + Send + 'static,
    late: ApiError,
) -> Result<T, ApiError> {
    let busy = || ApiError::Busy("prepared");
    let conversion = tokio::time::timeout(limit, Arc::clone(permits).acquire_owned())
        .await
        .map_err(|_| busy())?
        .map_err(|_| busy())?;
    let (answer, result) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("firstword-prepare".into())
        .stack_size(LARGE_STACK_BYTES)
        .spawn(move || {
            let done = work();
            drop(conversion);
            let _ = answer.send(done);
        })
        .map_err(|e| ApiError::Internal(format!("cannot start a thread: {e}")))?;
    match tokio::time::timeout(limit, result).await {
        Ok(Ok(done)) => done,
        Ok(Err(_)) => Err(ApiError::Internal("preparing the request failed unexpectedly".into())),
        Err(_) => Err(late),
    }
}

/// The admission path of a request that queues an engine job: refused before its body is
/// read when the engine could not take it, then, on a conversion thread, the body becomes a
/// job (`into_job`) and the job's request (`request_of`) has its prompt rendered and
/// tokenized; then, on a thread of its own under a media permit ([`super::CONCURRENT_MEDIA`])
/// and within [`MEDIA_TIMEOUT`], its media are decoded and tokenized, so the inference thread
/// only evaluates them. Each stage up to rendering is timed from the request's arrival, for
/// its `timings.request` (the media's decoding counts in the time before it is queued).
pub(crate) async fn prepare_job<J: Send + 'static>(
    state: &AppState,
    request: Request,
    into_job: impl FnOnce(&[u8]) -> Result<J, ApiError> + Send + 'static,
    request_of: fn(&J) -> &GenerationRequest,
) -> Result<Prepared<(J, RenderedPrompt)>, ApiError> {
    let arrived = Instant::now();
    let admitted = admit_for_engine(state, request).await?;
    let read = arrived.elapsed();
    let engine = Arc::clone(&state.engine);
    let prepared = prepare(state, admitted, move |bytes| {
        let parsing = Instant::now();
        let job = into_job(bytes)?;
        let parse = parsing.elapsed();
        let rendered = engine.render(&request_of(&job).prompt)?.timed(arrived, read, parse);
        Ok((job, rendered))
    })
    .await?;
    if request_of(&prepared.value.0).media.is_empty() {
        return Ok(prepared);
    }
    let engine = Arc::clone(&state.engine);
    let work = move || {
        let Prepared { value: (job, rendered), permit } = prepared;
        let media = engine.prepare_media(&request_of(&job).media)?;
        Ok(Prepared { value: (job, rendered.with_media(media)), permit })
    };
    on_own_thread(&state.media, MEDIA_TIMEOUT, work, ApiError::MediaTimeout(MEDIA_TIMEOUT)).await
}

/// A JSON answer serialized on a conversion thread, sent in chunks; the body permit goes
/// when the whole answer has been written (or the connection dropped), so answers waiting for
/// a slow client count against [`super::CONCURRENT_BODIES`] too.
pub(crate) fn json_answer(prepared: Prepared<Vec<u8>>) -> Response {
    const CHUNK: usize = 1 << 20;
    let Prepared { value, permit } = prepared;
    let answer = Bytes::from(value);
    let chunks: Vec<Bytes> =
        (0..answer.len()).step_by(CHUNK).map(|at| answer.slice(at..answer.len().min(at + CHUNK))).collect();
    let body = futures_util::stream::iter(chunks).map(move |chunk| {
        let _held_until_written = &permit;
        Ok::<_, Infallible>(chunk)
    });
    ([(CONTENT_TYPE, "application/json")], Body::from_stream(body)).into_response()
}

/// `answer` as JSON bytes; `size` is about how long it will be (one allocation of the right
/// size rather than doublings up to twice it).
///
/// # Errors
/// None in practice (the answers are plain data).
pub(crate) fn to_json(answer: &impl serde::Serialize, size: usize) -> Result<Vec<u8>, ApiError> {
    let mut json = Vec::with_capacity(size + size / 16 + 64);
    serde_json::to_writer(&mut json, answer)
        .map_err(|e| ApiError::Internal(format!("cannot write the answer: {e}")))?;
    Ok(json)
}
