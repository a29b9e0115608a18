//! `POST /api/chat`: the body mapped into a chat-completions request, then the chat path
//! (admission, conversion, the engine) and Ollama's answer, streamed or whole.

use std::sync::Arc;
use std::time::Instant;

use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use axum::Json;

use super::super::admission::{prepare_job, Prepared};
use super::super::answer::AnswerShaper;
use super::super::chat::{collect, ndjson_response, start};
use super::super::convert::{ChatBody, ChatJob};
use super::super::error::{ApiError, OllamaError};
use super::super::request_log::RequestRecord;
use super::super::AppState;
use super::reply::{Answering, Kind, NdjsonFramer};
use super::request;

/// The handler.
pub(super) async fn chat(State(state): State<Arc<AppState>>, request: Request) -> Result<Response, OllamaError> {
    let arrived = Instant::now();
    let record = RequestRecord::of(&request);
    let model = state.engine.model_info()?;
    let into_job = move |bytes: &[u8]| -> Result<(ChatJob, bool), ApiError> {
        let mapped = request::chat(request::object(bytes)?, &model)?;
        let body = serde_json::to_vec(&mapped.body).map_err(|e| ApiError::Internal(e.to_string()))?;
        Ok((ChatBody::parse(&body)?.into_job(&model)?, mapped.stream))
    };
    let Prepared { value: ((job, stream), rendered), permit } =
        prepare_job(&state, request, into_job, |(job, _)| &job.request).await?;
    answer(&state, job, stream, rendered, permit, Answering { kind: Kind::Chat, model: String::new(), arrived }, record)
        .await
}

/// Runs `job` and answers it as `answering` says (its model name from the job), streamed or
/// whole: what chat and generate share.
pub(super) async fn answer(
    state: &AppState,
    job: ChatJob,
    stream: bool,
    rendered: crate::engine::RenderedPrompt,
    permit: super::super::admission::BodyPermit,
    answering: Answering,
    record: RequestRecord,
) -> Result<Response, OllamaError> {
    let answering = Answering { model: job.model.clone(), ..answering };
    let (events, in_reasoning) = start(state, job.request, rendered, permit).await?;
    let shaper = AnswerShaper::new(job.output, in_reasoning);
    if stream {
        return Ok(ndjson_response(events, NdjsonFramer::new(answering, shaper), record));
    }
    let answer = collect(events, shaper, &record).await?;
    Ok(Json(answering.whole(&answer.ending, &answer.usage, &answer.timings)).into_response())
}
