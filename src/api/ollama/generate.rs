//! `POST /api/generate`: a prompt (with `system` and `images`) as a one-turn chat, or with
//! `raw` as text sent untemplated, down the chat path; and `POST /api/embed`, which the
//! engine cannot serve (501).

use std::sync::Arc;
use std::time::Instant;

use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use axum::Json;

use super::super::admission::{prepare_job, Prepared};
use super::super::convert::{ChatBody, ChatJob};
use super::super::error::{ApiError, OllamaError};
use super::super::request_log::RequestRecord;
use super::super::AppState;
use super::chat::answer;
use super::reply::{Answering, Kind};
use super::request;
use crate::engine::Prompt;

/// What a generate body became: a job, or only the wish to load the model.
enum Generate {
    /// Run this job, streamed or not.
    Job(Box<ChatJob>, bool),
    /// An empty prompt: Ollama's way of loading a model.
    Load(String),
}

/// The handler.
pub(super) async fn generate(State(state): State<Arc<AppState>>, request: Request) -> Result<Response, OllamaError> {
    let arrived = Instant::now();
    let record = RequestRecord::of(&request);
    let model = state.engine.model_info()?;
    let into_job = move |bytes: &[u8]| -> Result<Generate, ApiError> {
        let body = request::object(bytes)?;
        let loads_only = body.get("prompt").is_none_or(|p| p == "") && body.get("images").is_none_or(|i| i.is_null());
        let mapped = request::generate(body, &model)?;
        if loads_only {
            return Ok(Generate::Load(super::tagged_name(&model)));
        }
        let bytes = serde_json::to_vec(&mapped.body).map_err(|e| ApiError::Internal(e.to_string()))?;
        let mut job = ChatBody::parse(&bytes)?.into_job(&model)?;
        if let Some(raw) = mapped.raw {
            job.request.prompt = Prompt::Text(raw);
        }
        Ok(Generate::Job(Box::new(job), mapped.stream))
    };
    let Prepared { value: (generate, rendered), permit } = prepare_job(&state, request, into_job, request_of).await?;
    let answering = Answering { kind: Kind::Generate, model: String::new(), arrived };
    match generate {
        Generate::Load(model) => Ok(Json(Answering { model, ..answering }.loaded()).into_response()),
        Generate::Job(job, stream) => answer(&state, *job, stream, rendered, permit, answering, record).await,
    }
}

/// The engine request of a generate job. A load-only body is never submitted; the admission
/// path renders a one-token prompt for it (token 0, in every vocabulary).
fn request_of(generate: &Generate) -> &crate::engine::GenerationRequest {
    static EMPTY: std::sync::LazyLock<crate::engine::GenerationRequest> =
        std::sync::LazyLock::new(|| crate::engine::GenerationRequest {
            prompt: Prompt::Tokens(vec![0]),
            ..crate::engine::GenerationRequest::chat(Vec::new())
        });
    match generate {
        Generate::Job(job, _) => &job.request,
        Generate::Load(_) => &EMPTY,
    }
}

/// `POST /api/embed` (and the older `/api/embeddings`): 501, the engine generates only.
pub(super) async fn embed() -> OllamaError {
    OllamaError(ApiError::NotImplemented(
        "embeddings are not supported: firstword's engine generates text and cannot embed",
    ))
}
