//! Ollama's API (`/api/...`) beside the OpenAI one, on the same port and over the same engine:
//! one cache, one queue, the same limits, keys and Host/Origin checks. Requests are mapped into
//! the OpenAI request they mean and go through the same conversion and admission path; only the
//! wire shapes (NDJSON streams, `{"error": "..."}` errors, nanosecond durations) are Ollama's.
//! `docs/ollama.md` lists what is and is not implemented, field by field.

mod chat;
mod generate;
mod models;
mod reply;
mod request;

#[cfg(test)]
pub(crate) use models::{parameter_size, quantization};

use std::sync::Arc;

use axum::routing::{delete, get, post};
use axum::Router;

use super::error::ApiError;
use super::AppState;
use crate::engine::ModelInfo;

pub(super) use models::root;

/// The version `GET /api/version` reports: clients compare it to decide what they may send
/// (Ollama releases from 0.6 on take `tools` with streaming, `think` and schema `format`s).
const OLLAMA_VERSION: &str = "0.9.0";

/// The Ollama routes.
pub(super) fn routes() -> Router<Arc<AppState>> {
    Router::new()
        .route("/api/version", get(models::version))
        .route("/api/tags", get(models::tags))
        .route("/api/show", post(models::show))
        .route("/api/chat", post(chat::chat))
        .route("/api/generate", post(generate::generate))
        .route("/api/embed", post(generate::embed))
        .route("/api/embeddings", post(generate::embed))
        .route("/api/ps", get(models::running))
        .route("/api/pull", post(|| models::management("pulling models")))
        .route("/api/push", post(|| models::management("pushing models")))
        .route("/api/create", post(|| models::management("creating models")))
        .route("/api/copy", post(|| models::management("copying models")))
        .route("/api/delete", delete(|| models::management("deleting models")))
}

/// The name Ollama clients know the model by: its id with Ollama's default tag.
fn tagged_name(model: &ModelInfo) -> String {
    format!("{}:latest", model.id)
}

/// Checks that `requested` names the served model: its id, with or without `:latest` (what
/// `/api/tags` lists); an empty or absent name means it too.
///
/// # Errors
/// 404, as Ollama answers a model it does not have.
fn check_model(requested: Option<&str>, model: &ModelInfo) -> Result<(), ApiError> {
    match requested {
        None | Some("") => Ok(()),
        Some(name) if name == model.id || name == tagged_name(model) => Ok(()),
        Some(name) => Err(ApiError::ModelNotFound(name.to_string(), tagged_name(model))),
    }
}
