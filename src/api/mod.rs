//! The OpenAI-compatible HTTP API. Talks to the engine only through [`Engine`]'s handle
//! (behind a small trait, so the handlers are tested without a model); never to llama.cpp.

mod access;
mod admission;
mod answer;
mod backend;
mod chat;
mod completions;
mod console;
mod convert;
mod error;
mod extract;
mod frame;
mod limits;
mod logprobs;
mod metrics;
mod models;
mod ollama;
mod prefill;
mod request_log;
mod responses;
mod sampling;
mod tokenize;
mod transcriptions;
mod wire;

#[cfg(test)]
mod tests;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::DefaultBodyLimit;
use axum::response::IntoResponse;
use axum::routing::{get, post};
use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tower_http::catch_panic::CatchPanicLayer;

pub use access::{AllowedHosts, ApiKeys, CorsOrigins};
pub(crate) use console::{page_file, CONSOLE_STYLE, CSS};
pub use convert::warm_prompt;
pub use error::{ApiError, OutputError, Refusal};

use crate::Engine;
use backend::Backend;

/// Request bodies held at the same time, from their reading until the request is queued or
/// answered; more wait briefly, then get 503. Bounds the memory that concurrent large bodies
/// (and what they are parsed and rendered into) take.
const CONCURRENT_BODIES: usize = 8;

/// Requests turned into engine jobs at the same time (schema conversion is CPU-bound).
const CONCURRENT_CONVERSIONS: usize = 2;

/// Requests whose media are decoded and tokenized at the same time, on threads of their own:
/// beside the conversions, so pictures that take seconds to decode never hold up another
/// request's conversion.
const CONCURRENT_MEDIA: usize = 1;

/// Connection timeouts, limits and access of [`serve_with`].
#[derive(Clone, Debug)]
pub struct ServeOptions {
    /// A client must send a request's headers within this time, also on an idle keep-alive
    /// connection, or the connection is closed.
    pub header_timeout: Duration,
    /// A request's body must arrive within this time after its headers (408 otherwise).
    pub body_timeout: Duration,
    /// After shutdown begins, open responses get this long to end before the server returns.
    pub shutdown_grace: Duration,
    /// Largest request body accepted (413 with the envelope beyond it).
    pub max_body_bytes: usize,
    /// Keys one of which every request but `/health` must present (none: no key needed).
    pub api_keys: ApiKeys,
    /// Origins whose browser pages may call the API.
    pub cors_origins: CorsOrigins,
    /// Host names requests may be addressed to (403 `host_not_allowed` otherwise).
    pub allowed_hosts: AllowedHosts,
    /// Most responses of the Responses API kept in memory for `previous_response_id` and
    /// `GET /v1/responses/{id}` (least recently used dropped first; 0: none kept).
    pub responses_store: usize,
    /// Most bytes the stored responses may hold, each charged for the conversation it keeps
    /// (least recently used dropped first; 0: none kept).
    pub responses_store_bytes: usize,
}

impl ServeOptions {
    /// Default largest request body: long conversations with big system prompts fit easily.
    pub const DEFAULT_MAX_BODY_BYTES: usize = 32 * 1024 * 1024;
    /// Default number of stored responses.
    pub const DEFAULT_RESPONSES_STORE: usize = 1024;
    /// Default bytes of the stored responses: 256 MiB.
    pub const DEFAULT_RESPONSES_STORE_BYTES: usize = responses::ResponseStore::DEFAULT_MAX_BYTES;
}

impl Default for ServeOptions {
    fn default() -> Self {
        Self {
            header_timeout: Duration::from_secs(30),
            body_timeout: Duration::from_secs(30),
            shutdown_grace: Duration::from_secs(10),
            max_body_bytes: Self::DEFAULT_MAX_BODY_BYTES,
            api_keys: ApiKeys::default(),
            cors_origins: CorsOrigins::None,
            allowed_hosts: AllowedHosts::default(),
            responses_store: Self::DEFAULT_RESPONSES_STORE,
            responses_store_bytes: Self::DEFAULT_RESPONSES_STORE_BYTES,
        }
    }
}

struct AppState {
    engine: Arc<dyn Backend>,
    started_at: u64,
    body_timeout: Duration,
    /// Permits to hold a body ([`CONCURRENT_BODIES`]; see [`admission`]).
    bodies: Arc<Semaphore>,
    /// Permits to convert a request on a conversion thread ([`CONCURRENT_CONVERSIONS`]).
    conversions: Arc<Semaphore>,
    /// Permits to decode a request's media ([`CONCURRENT_MEDIA`]).
    media: Arc<Semaphore>,
    /// What `/metrics` exports.
    metrics: Arc<metrics::Metrics>,
    /// Responses kept for `previous_response_id`.
    responses: Arc<responses::ResponseStore>,
}

/// Seconds since the Unix epoch, for `created` fields.
fn unix_now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// The API's routes over an engine, with the default [`ServeOptions`].
pub fn router(engine: Engine) -> Router {
    router_with(Arc::new(engine), &ServeOptions::default())
}

fn router_with(engine: Arc<dyn Backend>, options: &ServeOptions) -> Router {
    router_over(app_state(engine, options), options)
}

fn app_state(engine: Arc<dyn Backend>, options: &ServeOptions) -> Arc<AppState> {
    Arc::new(AppState {
        engine,
        started_at: unix_now(),
        body_timeout: options.body_timeout,
        bodies: Arc::new(Semaphore::new(CONCURRENT_BODIES)),
        conversions: Arc::new(Semaphore::new(CONCURRENT_CONVERSIONS)),
        media: Arc::new(Semaphore::new(CONCURRENT_MEDIA)),
        metrics: Arc::new(metrics::Metrics::new()),
        responses: Arc::new(responses::ResponseStore::bounded(options.responses_store, options.responses_store_bytes)),
    })
}

/// The routes over `state`.
fn router_over(state: Arc<AppState>, options: &ServeOptions) -> Router {
    let metrics = Arc::clone(&state.metrics);
    let router = Router::new()
        .route("/v1/chat/completions", post(chat::chat_completions))
        .route("/chat/completions", post(chat::chat_completions))
        .route("/v1/models", get(models::list_models))
        .route("/models", get(models::list_models))
        .route("/health", get(models::health))
        .route("/cache", get(models::cache))
        .route("/metrics", get(metrics::metrics))
        .route("/v1/prefill", post(prefill::prefill))
        .route("/v1/audio/transcriptions", post(transcriptions::transcriptions))
        .route("/audio/transcriptions", post(transcriptions::transcriptions))
        .route("/v1/completions", post(completions::completions))
        .route("/completions", post(completions::completions))
        .route("/v1/responses", post(responses::create_response))
        .route("/responses", post(responses::create_response))
        .route("/v1/responses/{id}", get(responses::get_response).delete(responses::delete_response))
        .route("/", get(ollama::root))
        .route("/console/{name}", get(console::asset))
        .route("/tokenize", post(tokenize::tokenize))
        .route("/detokenize", post(tokenize::detokenize))
        .route("/apply-template", post(tokenize::apply_template))
        .merge(ollama::routes())
        .fallback(|| async { ApiError::NotFound })
        .method_not_allowed_fallback(|| async { ApiError::MethodNotAllowed })
        .layer(DefaultBodyLimit::max(options.max_body_bytes))
        .with_state(state)
        // A handler that panics (a bug) answers 500 with the envelope; the server goes on.
        .layer(CatchPanicLayer::custom(|panic: Box<dyn std::any::Any + Send>| {
            let message = crate::engine::panic_message(&*panic);
            tracing::error!("a request handler panicked: {message}");
            ApiError::Internal(message).into_response()
        }))
        .layer(axum::middleware::from_fn_with_state(options.api_keys.clone(), access::require_key))
        .layer(axum::middleware::from_fn_with_state(options.cors_origins.clone(), access::refuse_foreign_origins));
    // A preflight is answered before the key check (browsers send none with it).
    let router = match options.cors_origins.layer() {
        Some(cors) => router.layer(cors),
        None => router,
    };
    // Before anything else, preflights included: the host name (DNS rebinding); then the log.
    router
        .layer(axum::middleware::from_fn_with_state(options.allowed_hosts.clone(), access::refuse_unknown_hosts))
        .layer(axum::middleware::from_fn(error::ollama_error_shape))
        .layer(axum::middleware::from_fn_with_state(metrics, request_log::log_requests))
}

/// Serves the API on `listener` with the default [`ServeOptions`]; see [`serve_with`].
///
/// # Errors
/// None today; the signature leaves room for listener errors.
pub async fn serve(
    listener: TcpListener,
    engine: Engine,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    serve_with(listener, engine, ServeOptions::default(), shutdown).await
}

/// Serves the API on `listener` until `shutdown` resolves, then stops accepting, closes idle
/// connections and waits up to [`ServeOptions::shutdown_grace`] for open responses to end
/// (call [`Engine::shutdown`] to end running generations). Connections that send no complete
/// request headers within [`ServeOptions::header_timeout`] are closed.
///
/// # Errors
/// None today: failed accepts (out of file descriptors) are logged and retried.
pub async fn serve_with(
    listener: TcpListener,
    engine: Engine,
    options: ServeOptions,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let app = router_with(Arc::new(engine), &options);
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new()).header_read_timeout(options.header_timeout);
    let graceful = GracefulShutdown::new();
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    tracing::warn!("accepting a connection failed: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        // Each SSE chunk leaves at once rather than waiting for more.
        let _ = stream.set_nodelay(true);
        let connection = http.serve_connection(TokioIo::new(stream), TowerToHyperService::new(app.clone()));
        let connection = graceful.watch(connection);
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!("connection ended: {e}");
            }
        });
    }
    drop(listener);
    if tokio::time::timeout(options.shutdown_grace, graceful.shutdown()).await.is_err() {
        tracing::warn!("open connections did not end within {:?}; closing them", options.shutdown_grace);
    }
    Ok(())
}
