//! The OpenAI error envelope, and the one place where errors become HTTP statuses.
//!
//! The rest of the API says *what* went wrong with an [`ApiError`] variant; only this file
//! decides the status, OpenAI's error `type` and the machine-readable `code` of each.

use std::time::Duration;

use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use crate::chat::tools::{ArgumentsError, ReplyError, ToolError};
use crate::engine::EngineError;

/// Why a request is refused as it stands (a 400); each kind has its own `code`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// A value out of range or of a kind this server does not support (no code).
    Value,
    /// A list or string over a documented limit (`limit_exceeded`).
    Limit,
    /// A schema over the complexity limits (`schema_too_complex`).
    SchemaTooComplex,
    /// Content of a kind this server has no backend for (`unsupported_content_type`).
    UnsupportedContent,
    /// A `tool_choice` of no known shape (`invalid_tool_choice`).
    ToolChoice,
    /// A `response_format` schema that cannot be used (`invalid_response_format`).
    ResponseFormat,
    /// A body that is not JSON, or JSON of the wrong shape (`invalid_json`).
    Json,
}

/// The model's output broke a schema the grammar could not fully enforce.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum OutputError {
    /// The reply stopped inside a call (a call is never returned half written as "stop").
    #[error("the reply stopped inside a call to {name:?} (arguments so far: {arguments})")]
    CutCall {
        /// The function called.
        name: String,
        /// The arguments written so far.
        arguments: String,
    },
    /// A finished call's arguments are not usable.
    #[error(transparent)]
    Arguments(#[from] ArgumentsError),
    /// A JSON reply does not match its `response_format`.
    #[error(transparent)]
    Reply(#[from] ReplyError),
}

/// An error answered as `{"error":{"message","type","param","code"}}`.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum ApiError {
    /// The request is refused; `param` names the field at fault when there is one.
    #[error("{message}")]
    Refused {
        /// What kind of refusal.
        refusal: Refusal,
        /// The request field at fault, as a path (`messages[0].content`).
        param: Option<String>,
        /// Human-readable explanation.
        message: String,
    },
    /// The tools, `tool_choice` or `response_format` cannot be used.
    #[error(transparent)]
    Tools(#[from] ToolError),
    /// The body did not arrive within the body timeout.
    #[error("the request body did not arrive within {} s", .0.as_secs_f32())]
    BodyTimeout(Duration),
    /// The body is larger than the server accepts.
    #[error("request body too large")]
    BodyTooLarge,
    /// The body could not be read (the connection failed mid-body).
    #[error("could not read the request body: {0}")]
    BodyUnreadable(String),
    /// Every permit of one stage is taken; the text says which (`"read"`, `"prepared"`).
    #[error("server busy: too many requests are being {0}")]
    Busy(&'static str),
    /// Turning the request into an engine job took longer than this.
    #[error("preparing this request took longer than {} s; simplify its tool or response_format schemas", .0.as_secs())]
    PrepareTimeout(Duration),
    /// Decoding the request's media took longer than this.
    #[error("decoding this request's images and audio took longer than {} s; send fewer or smaller ones", .0.as_secs())]
    MediaTimeout(Duration),
    /// The engine refused or failed the request.
    #[error(transparent)]
    Engine(#[from] EngineError),
    /// The engine's events ended without `Finished` or `Failed`.
    #[error("the inference thread stopped unexpectedly")]
    EngineStopped,
    /// The model's output is no valid answer.
    #[error(transparent)]
    ModelOutput(#[from] OutputError),
    /// Something in the server itself failed.
    #[error("{0}")]
    Internal(String),
    /// No API key, or a wrong one, where one is required.
    #[error("{0}")]
    Unauthorized(&'static str),
    /// A browser page of an origin not allowed to call the API sent a POST.
    #[error(
        "requests from pages of the origin {0:?} are not allowed; start firstword with --cors-origin to allow them"
    )]
    OriginNotAllowed(String),
    /// The request was addressed to a host name that is not allowed (DNS rebinding).
    #[error(
        "requests addressed to the host {0:?} are not served (a web page may be reaching this server through DNS rebinding); start firstword with --allowed-host {0} if this is your server's name"
    )]
    HostNotAllowed(String),
    /// No route has this path.
    #[error("unknown endpoint")]
    NotFound,
    /// No stored response has this id (never stored, evicted, or deleted); `param` names the
    /// request field that gave it.
    #[error("no stored response has the id {id:?} (responses are kept in memory, the least recently used dropped first, and not across restarts)")]
    ResponseNotFound {
        /// The id asked for.
        id: String,
        /// The field that gave it (`previous_response_id`), if any.
        param: Option<&'static str>,
    },
    /// The route has no handler for this method.
    #[error("method not allowed on this endpoint")]
    MethodNotAllowed,
    /// A request names a model this server does not serve (Ollama's API, where the name
    /// chooses the model).
    #[error("model {0:?} not found: this server serves only the model it was started with, {1:?}")]
    ModelNotFound(String, String),
    /// An Ollama endpoint that manages models (`pull`, `create`, `delete`, ...): the model is
    /// chosen when the server starts.
    #[error(
        "{0} is not supported: firstword serves the one model it was started with (--model); restart it to use another"
    )]
    ModelManagement(&'static str),
    /// An endpoint the engine cannot serve.
    #[error("{0}")]
    NotImplemented(&'static str),
}

impl ApiError {
    /// A 400 about a bad value of the field `param`.
    pub(crate) fn invalid(param: impl Into<String>, message: impl Into<String>) -> Self {
        Self::refused(Refusal::Value, param, message)
    }

    /// A 400 of kind `refusal` about the field `param`.
    pub(crate) fn refused(refusal: Refusal, param: impl Into<String>, message: impl Into<String>) -> Self {
        Self::Refused { refusal, param: Some(param.into()), message: message.into() }
    }

    /// A body that is not JSON of the expected shape; `param` is the path at fault, if any.
    pub(crate) fn json(param: Option<String>, message: impl Into<String>) -> Self {
        Self::Refused { refusal: Refusal::Json, param, message: message.into() }
    }

    /// The status and `code` of this error: the one mapping of the API.
    fn status_and_code(&self) -> (StatusCode, Option<&'static str>) {
        match self {
            Self::Refused { refusal, .. } => (
                StatusCode::BAD_REQUEST,
                match refusal {
                    Refusal::Value => None,
                    Refusal::Limit => Some("limit_exceeded"),
                    Refusal::SchemaTooComplex => Some("schema_too_complex"),
                    Refusal::UnsupportedContent => Some("unsupported_content_type"),
                    Refusal::ToolChoice => Some("invalid_tool_choice"),
                    Refusal::ResponseFormat => Some("invalid_response_format"),
                    Refusal::Json => Some("invalid_json"),
                },
            ),
            Self::Tools(error) => (
                StatusCode::BAD_REQUEST,
                Some(match error {
                    ToolError::UnknownChoice(_) | ToolError::ChoiceWithoutTools(_) => "invalid_tool_choice",
                    ToolError::UnusableOutputSchema(_) => "invalid_response_format",
                    _ => "invalid_tools",
                }),
            ),
            Self::BodyTimeout(_) => (StatusCode::REQUEST_TIMEOUT, Some("body_timeout")),
            Self::BodyTooLarge => (StatusCode::PAYLOAD_TOO_LARGE, None),
            Self::BodyUnreadable(_) => (StatusCode::BAD_REQUEST, None),
            Self::Busy(_) => (StatusCode::SERVICE_UNAVAILABLE, Some("queue_full")),
            Self::PrepareTimeout(_) => (StatusCode::BAD_REQUEST, Some("schema_too_complex")),
            Self::MediaTimeout(_) => (StatusCode::BAD_REQUEST, Some("media_too_large")),
            Self::Engine(error) => engine_status_and_code(error),
            Self::EngineStopped | Self::Internal(_) => (StatusCode::INTERNAL_SERVER_ERROR, Some("internal_error")),
            // The request was valid; the model's output was not.
            Self::ModelOutput(_) => (StatusCode::UNPROCESSABLE_ENTITY, Some("invalid_model_output")),
            Self::Unauthorized(_) => (StatusCode::UNAUTHORIZED, Some("invalid_api_key")),
            Self::OriginNotAllowed(_) => (StatusCode::FORBIDDEN, Some("origin_not_allowed")),
            Self::HostNotAllowed(_) => (StatusCode::FORBIDDEN, Some("host_not_allowed")),
            Self::NotFound => (StatusCode::NOT_FOUND, Some("not_found")),
            Self::ResponseNotFound { param: Some(_), .. } => {
                (StatusCode::NOT_FOUND, Some("previous_response_not_found"))
            }
            Self::ResponseNotFound { param: None, .. } => (StatusCode::NOT_FOUND, Some("response_not_found")),
            Self::MethodNotAllowed => (StatusCode::METHOD_NOT_ALLOWED, None),
            Self::ModelNotFound(..) => (StatusCode::NOT_FOUND, Some("model_not_found")),
            Self::ModelManagement(_) => (StatusCode::BAD_REQUEST, Some("model_fixed_at_start")),
            Self::NotImplemented(_) => (StatusCode::NOT_IMPLEMENTED, Some("not_implemented")),
        }
    }

    /// The HTTP status.
    #[must_use]
    pub fn status(&self) -> StatusCode {
        self.status_and_code().0
    }

    /// The stable machine-readable `code`.
    #[must_use]
    pub fn code(&self) -> Option<&'static str> {
        self.status_and_code().1
    }

    /// The request field at fault, as a path (`messages[0].content`).
    #[must_use]
    pub fn param(&self) -> Option<String> {
        match self {
            Self::Refused { param, .. } => param.clone(),
            Self::Tools(error) => Some(error.param()),
            Self::ResponseNotFound { param, .. } => param.map(str::to_string),
            Self::Engine(EngineError::ContextOverflow { .. } | EngineError::PromptRunTooLong { .. }) => {
                Some("messages".to_string())
            }
            Self::Engine(EngineError::Media { part, .. }) => Some(part.clone()),
            _ => None,
        }
    }

    /// OpenAI's `type` for this error's status.
    fn kind(status: StatusCode) -> &'static str {
        match status {
            StatusCode::UNAUTHORIZED => "authentication_error",
            StatusCode::FORBIDDEN => "permission_error",
            StatusCode::NOT_FOUND => "not_found_error",
            StatusCode::TOO_MANY_REQUESTS => "rate_limit_error",
            StatusCode::SERVICE_UNAVAILABLE => "unavailable_error",
            s if s.is_server_error() => "server_error",
            _ => "invalid_request_error",
        }
    }

    /// The envelope as JSON text (also used for SSE error events).
    #[must_use]
    pub fn to_json(&self) -> String {
        let (status, code) = self.status_and_code();
        let message = self.client_message();
        let param = self.param();
        let envelope =
            Envelope { error: Body { message: &message, kind: Self::kind(status), param: param.as_deref(), code } };
        serde_json::to_string(&envelope).unwrap_or_default()
    }

    /// The text the client reads: the error itself, except for a failure inside the server (a
    /// bug, a panic, a dead inference thread), whose detail may hold internals (a panic's
    /// message, paths, state): the client gets a fixed text and the log gets the detail.
    fn client_message(&self) -> String {
        if !self.hides_detail() {
            return self.to_string();
        }
        tracing::error!("answering a request with a server error: {self}");
        INTERNAL_MESSAGE.to_string()
    }

    /// Whether this error is a failure inside the server rather than something the client or
    /// the server's load caused.
    fn hides_detail(&self) -> bool {
        matches!(
            self,
            Self::Internal(_)
                | Self::EngineStopped
                | Self::Engine(
                    EngineError::Internal(_)
                        | EngineError::EngineDied(_)
                        | EngineError::Decode(_)
                        | EngineError::CacheCut { .. }
                )
        )
    }
}

/// What a client reads for a failure inside the server; the detail goes to the log.
pub(crate) const INTERNAL_MESSAGE: &str =
    "the server had an error while processing this request; its log has the details";

/// Statuses of engine errors: the request's fault (400), the model's (422) or the server's
/// state (503, 500).
fn engine_status_and_code(error: &EngineError) -> (StatusCode, Option<&'static str>) {
    let (status, code) = match error {
        EngineError::Template(_) => (StatusCode::BAD_REQUEST, "template_error"),
        EngineError::ContextOverflow { .. } => (StatusCode::BAD_REQUEST, "context_length_exceeded"),
        EngineError::EmptyPrompt => (StatusCode::BAD_REQUEST, "empty_prompt"),
        EngineError::Media { .. } => (StatusCode::BAD_REQUEST, "invalid_media"),
        EngineError::InvalidToken { .. } => (StatusCode::BAD_REQUEST, "invalid_token"),
        EngineError::PromptRunTooLong { .. } => (StatusCode::BAD_REQUEST, "prompt_run_too_long"),
        EngineError::InvalidGrammar(_) => (StatusCode::BAD_REQUEST, "invalid_grammar"),
        // The request was valid; the model could not produce output the grammar allows.
        EngineError::GrammarDeadEnd(_) => (StatusCode::UNPROCESSABLE_ENTITY, "constrained_generation_failed"),
        EngineError::Loading => (StatusCode::SERVICE_UNAVAILABLE, "model_loading"),
        EngineError::QueueFull { .. } => (StatusCode::SERVICE_UNAVAILABLE, "queue_full"),
        EngineError::ShuttingDown => (StatusCode::SERVICE_UNAVAILABLE, "shutting_down"),
        EngineError::EngineDied(_) => (StatusCode::SERVICE_UNAVAILABLE, "engine_unavailable"),
        EngineError::Decode(_) => (StatusCode::INTERNAL_SERVER_ERROR, "decode_failed"),
        _ => (StatusCode::INTERNAL_SERVER_ERROR, "internal_error"),
    };
    (status, Some(code))
}

#[derive(Serialize)]
struct Envelope<'a> {
    error: Body<'a>,
}

#[derive(Serialize)]
struct Body<'a> {
    message: &'a str,
    #[serde(rename = "type")]
    kind: &'static str,
    param: Option<&'a str>,
    code: Option<&'static str>,
}

/// The `code` of an error answer, attached to its response.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ErrorCode(pub(crate) Option<&'static str>);

/// The message of an error answer, attached to its response: an answer under Ollama's paths
/// is written again in Ollama's shape from it, whichever layer refused the request.
#[derive(Clone, Debug)]
pub(crate) struct ErrorMessage(pub(crate) String);

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status();
        let mut response = (status, [(header::CONTENT_TYPE, "application/json")], self.to_json()).into_response();
        // For the request log and `/metrics`: errors by code.
        response.extensions_mut().insert(ErrorCode(self.code()));
        response.extensions_mut().insert(ErrorMessage(self.client_message()));
        if status == StatusCode::SERVICE_UNAVAILABLE {
            response.headers_mut().insert(header::RETRY_AFTER, header::HeaderValue::from_static("1"));
        }
        response
    }
}

/// An [`ApiError`] answered in Ollama's shape, `{"error": "message"}`, with the same status
/// (and the same `code` for the log and `/metrics`, the same `Retry-After`).
#[derive(Debug)]
pub(crate) struct OllamaError(pub(crate) ApiError);

impl From<ApiError> for OllamaError {
    fn from(error: ApiError) -> Self {
        Self(error)
    }
}

impl From<EngineError> for OllamaError {
    fn from(error: EngineError) -> Self {
        Self(error.into())
    }
}

impl OllamaError {
    /// The body as JSON text (also a stream's error line).
    #[must_use]
    pub(crate) fn to_json(&self) -> String {
        ollama_body(&self.0.client_message())
    }
}

/// Ollama's error body for `message`.
fn ollama_body(message: &str) -> String {
    serde_json::json!({ "error": message }).to_string()
}

impl IntoResponse for OllamaError {
    /// The error's answer; [`ollama_error_shape`], around every route, writes its body in
    /// Ollama's shape (as for any error under `/api/`).
    fn into_response(self) -> Response {
        self.0.into_response()
    }
}

/// Writes an error answer to a request under Ollama's paths (`/api/...`) in Ollama's shape,
/// whatever refused it: the key check (401), the Host and Origin checks (403), an unknown path
/// (404) or method (405), a handler's panic (500). Ollama's clients read `error` as a string.
pub(crate) async fn ollama_error_shape(request: axum::extract::Request, next: axum::middleware::Next) -> Response {
    let ollama = request.uri().path().starts_with("/api/");
    let mut response = next.run(request).await;
    if ollama {
        if let Some(ErrorMessage(message)) = response.extensions().get::<ErrorMessage>().cloned() {
            response.headers_mut().remove(header::CONTENT_LENGTH);
            *response.body_mut() = axum::body::Body::from(ollama_body(&message));
        }
    }
    response
}

#[cfg(test)]
mod tests;
