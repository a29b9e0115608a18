//! The OpenAI error envelope, and the one place where engine errors become HTTP statuses.

use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use crate::engine::EngineError;

/// An error answered as `{"error":{"message","type","param","code"}}`.
#[derive(Debug, Clone)]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// Human-readable explanation.
    pub message: String,
    /// The request field at fault, as a path (`messages[0].content`).
    pub param: Option<String>,
    /// A stable machine-readable code.
    pub code: Option<&'static str>,
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

impl ApiError {
    /// A 400 about the field `param`.
    pub fn invalid(param: impl Into<String>, message: impl Into<String>) -> Self {
        Self { status: StatusCode::BAD_REQUEST, message: message.into(), param: Some(param.into()), code: None }
    }

    /// A 400 not tied to one field.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self { status: StatusCode::BAD_REQUEST, message: message.into(), param: None, code: None }
    }

    /// Any status, no field.
    pub fn new(status: StatusCode, message: impl Into<String>) -> Self {
        Self { status, message: message.into(), param: None, code: None }
    }

    /// Sets the machine-readable code.
    #[must_use]
    pub fn with_code(mut self, code: &'static str) -> Self {
        self.code = Some(code);
        self
    }

    /// OpenAI's `type` for this status.
    fn kind(&self) -> &'static str {
        match self.status {
            StatusCode::UNAUTHORIZED => "authentication_error",
            StatusCode::NOT_FOUND => "not_found_error",
            StatusCode::TOO_MANY_REQUESTS => "rate_limit_error",
            StatusCode::SERVICE_UNAVAILABLE => "unavailable_error",
            s if s.is_server_error() => "server_error",
            _ => "invalid_request_error",
        }
    }

    /// The envelope as JSON text (also used for SSE error events).
    pub fn to_json(&self) -> String {
        let envelope = Envelope {
            error: Body { message: &self.message, kind: self.kind(), param: self.param.as_deref(), code: self.code },
        };
        serde_json::to_string(&envelope).unwrap_or_default()
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (self.status, [(header::CONTENT_TYPE, "application/json")], self.to_json()).into_response();
        if self.status == StatusCode::SERVICE_UNAVAILABLE {
            response.headers_mut().insert(header::RETRY_AFTER, header::HeaderValue::from_static("1"));
        }
        response
    }
}

impl From<EngineError> for ApiError {
    fn from(error: EngineError) -> Self {
        let message = error.to_string();
        let (status, code) = match &error {
            EngineError::Template(_) => (StatusCode::BAD_REQUEST, "template_error"),
            EngineError::ContextOverflow { .. } => (StatusCode::BAD_REQUEST, "context_length_exceeded"),
            EngineError::EmptyPrompt => (StatusCode::BAD_REQUEST, "empty_prompt"),
            EngineError::InvalidToken { .. } => (StatusCode::BAD_REQUEST, "invalid_token"),
            EngineError::PromptRunTooLong { .. } => (StatusCode::BAD_REQUEST, "prompt_run_too_long"),
            EngineError::InvalidGrammar(_) => (StatusCode::BAD_REQUEST, "invalid_grammar"),
            // The request was valid; the model could not produce output the grammar allows.
            EngineError::GrammarDeadEnd(_) => (StatusCode::UNPROCESSABLE_ENTITY, "constrained_generation_failed"),
            EngineError::Loading => (StatusCode::SERVICE_UNAVAILABLE, "model_loading"),
            EngineError::QueueFull { .. } => (StatusCode::SERVICE_UNAVAILABLE, "queue_full"),
            EngineError::ShuttingDown => (StatusCode::SERVICE_UNAVAILABLE, "shutting_down"),
            _ => (StatusCode::INTERNAL_SERVER_ERROR, "internal_error"),
        };
        let param = matches!(error, EngineError::ContextOverflow { .. } | EngineError::PromptRunTooLong { .. })
            .then(|| "messages".to_string());
        Self { status, message, param, code: Some(code) }
    }
}
