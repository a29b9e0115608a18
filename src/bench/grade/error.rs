//! Why the grading page refuses a request, and the one place such a refusal becomes an HTTP
//! status and an OpenAI-style error envelope.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use crate::bench::quality::QualityError;

/// A refused grading request.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GradeError {
    /// The request is addressed to a host that is not this machine (DNS rebinding).
    #[error("requests must be addressed to localhost, 127.0.0.1 or [::1], not {0:?}")]
    HostNotAllowed(String),
    /// A POST from a page of another origin.
    #[error("the origin {0:?} may not grade this run")]
    OriginNotAllowed(String),
    /// The body is not the JSON a grade is.
    #[error("{0}")]
    BadBody(String),
    /// The scores do not fit the unit or the rubric.
    #[error("{0}")]
    BadScores(String),
    /// No unit of the run has this item and sample.
    #[error("no unit {item:?} sample {sample} in this run")]
    UnknownUnit {
        /// The item's id.
        item: String,
        /// The sample.
        sample: u32,
    },
    /// The person graded this unit already.
    #[error("{item:?} sample {sample} is graded already")]
    AlreadyGraded {
        /// The item's id.
        item: String,
        /// The sample.
        sample: u32,
    },
    /// No such page or endpoint.
    #[error("no such page: {0}")]
    NotFound(String),
    /// The run directory cannot be read or the grade not written.
    #[error("{0}")]
    Run(#[from] QualityError),
    /// The blocking file work did not finish (a panic).
    #[error("the grade could not be saved: {0}")]
    Interrupted(String),
}

impl GradeError {
    /// The HTTP status and the stable machine-readable `code`.
    #[must_use]
    pub fn status_and_code(&self) -> (StatusCode, &'static str) {
        match self {
            Self::HostNotAllowed(_) => (StatusCode::FORBIDDEN, "host_not_allowed"),
            Self::OriginNotAllowed(_) => (StatusCode::FORBIDDEN, "origin_not_allowed"),
            Self::BadBody(_) => (StatusCode::BAD_REQUEST, "invalid_body"),
            Self::BadScores(_) => (StatusCode::BAD_REQUEST, "invalid_scores"),
            Self::UnknownUnit { .. } => (StatusCode::NOT_FOUND, "unknown_unit"),
            Self::AlreadyGraded { .. } => (StatusCode::CONFLICT, "already_graded"),
            Self::NotFound(_) => (StatusCode::NOT_FOUND, "not_found"),
            Self::Run(_) | Self::Interrupted(_) => (StatusCode::INTERNAL_SERVER_ERROR, "run_directory"),
        }
    }

    /// OpenAI's `type` for a status (as the API server's envelope names them).
    fn kind(status: StatusCode) -> &'static str {
        match status {
            StatusCode::FORBIDDEN => "permission_error",
            StatusCode::NOT_FOUND => "not_found_error",
            s if s.is_server_error() => "server_error",
            _ => "invalid_request_error",
        }
    }
}

impl IntoResponse for GradeError {
    fn into_response(self) -> Response {
        let (status, code) = self.status_and_code();
        let body = json!({"error": {"message": self.to_string(), "type": Self::kind(status), "code": code}});
        let content_type = [(header::CONTENT_TYPE, HeaderValue::from_static("application/json"))];
        (status, content_type, body.to_string()).into_response()
    }
}
