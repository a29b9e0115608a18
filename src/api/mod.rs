//! The OpenAI-compatible HTTP API. Talks to the engine only through [`Engine`]; never to
//! llama.cpp.

mod answer;
mod chat;
mod convert;
mod error;
mod extract;
mod models;
mod wire;

use std::future::Future;
use std::sync::Arc;

use axum::extract::DefaultBodyLimit;
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::Router;
use tokio::net::TcpListener;

pub use error::ApiError;

use crate::Engine;

/// Largest request body accepted (long conversations with big system prompts fit easily).
const MAX_BODY_BYTES: usize = 32 * 1024 * 1024;

struct AppState {
    engine: Engine,
    started_at: u64,
}

/// Seconds since the Unix epoch, for `created` fields.
fn unix_now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// The API's routes over an engine.
pub fn router(engine: Engine) -> Router {
    let state = Arc::new(AppState { engine, started_at: unix_now() });
    Router::new()
        .route("/v1/chat/completions", post(chat::chat_completions))
        .route("/chat/completions", post(chat::chat_completions))
        .route("/v1/models", get(models::list_models))
        .route("/models", get(models::list_models))
        .route("/health", get(models::health))
        .fallback(|| async { ApiError::new(StatusCode::NOT_FOUND, "unknown endpoint").with_code("not_found") })
        .method_not_allowed_fallback(|| async {
            ApiError::new(StatusCode::METHOD_NOT_ALLOWED, "method not allowed on this endpoint")
        })
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(state)
}

/// Serves the API on `listener` until `shutdown` resolves, then stops accepting and waits for
/// open responses to end (call [`Engine::shutdown`] to end running generations).
///
/// # Errors
/// I/O errors from the listener.
pub async fn serve(
    listener: TcpListener,
    engine: Engine,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(listener, router(engine)).with_graceful_shutdown(shutdown).await
}
