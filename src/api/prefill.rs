//! `POST /v1/prefill`: evaluates exactly the prompt a chat-completions body would, without
//! generating, so the request that follows (the same conversation with the last words added)
//! prefills only what changed. A voice pipeline calls it with each partial transcript.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::Json;

use super::admission::Prepared;
use super::chat::read_chat_job;
use super::error::ApiError;
use super::frame::{wire_cache, wire_request_path};
use super::request_log::RequestRecord;
use super::wire::{PrefillAnswer, PrefillTimings};
use super::AppState;
use crate::engine::{PrefillReport, Usage};

/// The handler: the same body and the same 4xx answers as chat completions.
pub(super) async fn prefill(
    State(state): State<Arc<AppState>>,
    request: Request,
) -> Result<Json<PrefillAnswer>, ApiError> {
    let record = RequestRecord::of(&request);
    let Prepared { value: (job, rendered), permit } = read_chat_job(&state, request).await?;
    let pending = state.engine.prefill(job.request, rendered)?;
    drop(permit);
    let report = pending.await?;
    let usage = Usage { prompt_tokens: report.prompt_tokens, cached_tokens: report.cached_tokens, ..Usage::default() };
    record.prefilled(usage, report.timings.clone());
    Ok(Json(answer(job.model, report)))
}

fn answer(model: String, report: PrefillReport) -> PrefillAnswer {
    PrefillAnswer {
        object: "prefill",
        model,
        prompt_tokens: report.prompt_tokens,
        cached_tokens: report.cached_tokens,
        prefilled_tokens: report.prefilled_tokens,
        complete: report.complete,
        superseded: report.superseded,
        pregenerated_tokens: report.pregenerated_tokens,
        timings: PrefillTimings {
            prompt_ms: report.timings.prompt.as_secs_f64() * 1e3,
            request_ms: report.timings.request.map(|path| path.total.as_secs_f64() * 1e3),
            request: report.timings.request.map(wire_request_path),
            cache: (!report.superseded).then(|| wire_cache(report.timings.cache)),
        },
    }
}
