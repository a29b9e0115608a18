//! Reading a JSON request body so that every failure is an OpenAI error envelope.

use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use axum::http::StatusCode;
use serde::de::DeserializeOwned;

use super::error::ApiError;

/// Reads the body of `request` within `timeout`. Like `axum::Json` with [`parse_json`], but
/// oversized, failed and too slow reads answer with the envelope.
pub(crate) async fn read_body(request: Request, timeout: Duration) -> Result<Bytes, ApiError> {
    match tokio::time::timeout(timeout, Bytes::from_request(request, &())).await {
        Ok(Ok(bytes)) => Ok(bytes),
        // axum's only body rejections: over the length limit, or a failed read.
        Ok(Err(rejection)) => Err(if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::BodyTooLarge
        } else {
            ApiError::BodyUnreadable(rejection.to_string())
        }),
        Err(_) => Err(ApiError::BodyTimeout(timeout)),
    }
}

/// Parses a request body, reporting the path of the field at fault: malformed JSON, wrong
/// types, bad UTF-8 and over-deep nesting all answer with the envelope, naming the field.
pub(crate) fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Err(ApiError::json(None, "the request body is empty; expected a JSON object"));
    }
    // Reject bad UTF-8 anywhere, even inside fields that are otherwise ignored.
    std::str::from_utf8(bytes)
        .map_err(|e| ApiError::json(None, format!("the request body is not valid UTF-8 ({e})")))?;
    let mut deserializer = serde_json::Deserializer::from_slice(bytes);
    let value = serde_path_to_error::deserialize(&mut deserializer).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        let message = match inner.classify() {
            serde_json::error::Category::Data => format!("invalid value for '{path}': {inner}"),
            _ => format!("invalid JSON in the request body: {inner}"),
        };
        ApiError::json((path != ".").then_some(path), message)
    })?;
    deserializer.end().map_err(|e| ApiError::json(None, format!("invalid JSON in the request body: {e}")))?;
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, serde::Deserialize)]
    #[allow(dead_code)]
    struct Body {
        n: u32,
        x: Option<serde_json::Value>,
    }

    #[test]
    fn wrong_type_names_the_field() {
        let err = parse_json::<Body>(br#"{"n": "two"}"#).expect_err("wrong type");
        assert_eq!(err.param().as_deref(), Some("n"));
        assert_eq!((err.status(), err.code()), (StatusCode::BAD_REQUEST, Some("invalid_json")));
    }

    #[test]
    fn malformed_and_empty_bodies_are_rejected() {
        assert!(parse_json::<Body>(b"{").is_err());
        assert!(parse_json::<Body>(b"  ").is_err());
        assert!(parse_json::<Body>(br#"{"n": 1} trailing"#).is_err());
        assert!(parse_json::<Body>(b"{\"n\": 1, \"x\": \"\xff\"}").is_err());
    }

    #[test]
    fn over_deep_nesting_is_a_clean_error() {
        let deep = format!("{{\"n\": 1, \"x\": {}{}}}", "[".repeat(10_000), "]".repeat(10_000));
        assert!(parse_json::<Body>(deep.as_bytes()).is_err());
    }
}
