//! The one status mapping, variant by variant, and the envelope every error is sent in.

use axum::http::{header, StatusCode};
use serde_json::Value;

use super::*;
use crate::chat::TemplateError;

fn envelope(error: &ApiError) -> Value {
    serde_json::from_str(&error.to_json()).expect("the envelope is JSON")
}

/// An error, and its status, `type`, `code` and `param`.
type Case = (ApiError, u16, &'static str, Option<&'static str>, Option<&'static str>);

#[test]
fn each_error_gets_its_status_type_code_and_param() {
    let engine = |e: EngineError| ApiError::Engine(e);
    let overflow = EngineError::ContextOverflow { prompt_tokens: 9, max_tokens: 1, needed: 10, n_ctx: 8 };
    let cases: Vec<Case> = vec![
        (ApiError::invalid("top_p", "bad"), 400, "invalid_request_error", None, Some("top_p")),
        (
            ApiError::refused(Refusal::Limit, "stop", "x"),
            400,
            "invalid_request_error",
            Some("limit_exceeded"),
            Some("stop"),
        ),
        (
            ApiError::refused(Refusal::SchemaTooComplex, "tools", "x"),
            400,
            "invalid_request_error",
            Some("schema_too_complex"),
            Some("tools"),
        ),
        (
            ApiError::refused(Refusal::UnsupportedContent, "m", "x"),
            400,
            "invalid_request_error",
            Some("unsupported_content_type"),
            Some("m"),
        ),
        (
            ApiError::refused(Refusal::ToolChoice, "tool_choice", "x"),
            400,
            "invalid_request_error",
            Some("invalid_tool_choice"),
            Some("tool_choice"),
        ),
        (
            ApiError::refused(Refusal::ResponseFormat, "r", "x"),
            400,
            "invalid_request_error",
            Some("invalid_response_format"),
            Some("r"),
        ),
        (ApiError::json(None, "x"), 400, "invalid_request_error", Some("invalid_json"), None),
        (
            ToolError::UnknownChoice("f".into()).into(),
            400,
            "invalid_request_error",
            Some("invalid_tool_choice"),
            Some("tool_choice"),
        ),
        (
            ToolError::UnusableOutputSchema("x".into()).into(),
            400,
            "invalid_request_error",
            Some("invalid_response_format"),
            Some("response_format"),
        ),
        (
            ToolError::DuplicateName { index: 1, name: "f".into() }.into(),
            400,
            "invalid_request_error",
            Some("invalid_tools"),
            Some("tools[1].function.name"),
        ),
        (ApiError::BodyTimeout(Duration::from_secs(30)), 408, "invalid_request_error", Some("body_timeout"), None),
        (ApiError::BodyTooLarge, 413, "invalid_request_error", None, None),
        (ApiError::BodyUnreadable("reset".into()), 400, "invalid_request_error", None, None),
        (ApiError::Busy("read"), 503, "unavailable_error", Some("queue_full"), None),
        (
            ApiError::PrepareTimeout(Duration::from_secs(5)),
            400,
            "invalid_request_error",
            Some("schema_too_complex"),
            None,
        ),
        (
            engine(TemplateError::Render("raised".into()).into()),
            400,
            "invalid_request_error",
            Some("template_error"),
            None,
        ),
        (engine(overflow), 400, "invalid_request_error", Some("context_length_exceeded"), Some("messages")),
        (
            engine(EngineError::PromptRunTooLong { run: 9, max: 8 }),
            400,
            "invalid_request_error",
            Some("prompt_run_too_long"),
            Some("messages"),
        ),
        (engine(EngineError::EmptyPrompt), 400, "invalid_request_error", Some("empty_prompt"), None),
        (
            engine(EngineError::InvalidToken { token: -1, n_vocab: 8 }),
            400,
            "invalid_request_error",
            Some("invalid_token"),
            None,
        ),
        (engine(EngineError::InvalidGrammar("x".into())), 400, "invalid_request_error", Some("invalid_grammar"), None),
        (
            engine(EngineError::GrammarDeadEnd("x".into())),
            422,
            "invalid_request_error",
            Some("constrained_generation_failed"),
            None,
        ),
        (engine(EngineError::Loading), 503, "unavailable_error", Some("model_loading"), None),
        (engine(EngineError::QueueFull { capacity: 4 }), 503, "unavailable_error", Some("queue_full"), None),
        (engine(EngineError::ShuttingDown), 503, "unavailable_error", Some("shutting_down"), None),
        (engine(EngineError::Decode("x".into())), 500, "server_error", Some("decode_failed"), None),
        (engine(EngineError::Internal("x".into())), 500, "server_error", Some("internal_error"), None),
        (engine(EngineError::EngineDied("x".into())), 503, "unavailable_error", Some("engine_unavailable"), None),
        (ApiError::EngineStopped, 500, "server_error", Some("internal_error"), None),
        (ApiError::Internal("x".into()), 500, "server_error", Some("internal_error"), None),
        (
            OutputError::CutCall { name: "f".into(), arguments: "{".into() }.into(),
            422,
            "invalid_request_error",
            Some("invalid_model_output"),
            None,
        ),
        (ApiError::NotFound, 404, "not_found_error", Some("not_found"), None),
        (ApiError::MethodNotAllowed, 405, "invalid_request_error", None, None),
    ];
    for (error, status, kind, code, param) in cases {
        assert_eq!(
            (error.status().as_u16(), error.code(), error.param().as_deref()),
            (status, code, param),
            "{error:?}"
        );
        let body = envelope(&error);
        assert_eq!(body["error"]["type"], kind, "{error:?}");
        assert_eq!(body["error"]["code"], code.map_or(Value::Null, Value::from), "{error:?}");
        assert_eq!(body["error"]["param"], param.map_or(Value::Null, Value::from), "{error:?}");
        if status >= 500 && !matches!(code, Some("model_loading" | "queue_full" | "shutting_down")) {
            // A failure inside the server: its detail (here "x") stays in the log.
            assert_eq!(body["error"]["message"], super::INTERNAL_MESSAGE, "{error:?}");
        } else {
            assert_eq!(body["error"]["message"], error.to_string(), "{error:?}");
        }
    }
}

#[test]
fn a_panic_message_never_reaches_the_client() {
    let panicked = ApiError::Internal("index out of bounds at /home/user/secret.rs:12".into());
    let body = envelope(&panicked);
    assert_eq!(body["error"]["message"], super::INTERNAL_MESSAGE);
    assert!(!body.to_string().contains("secret"), "{body}");
    let died = ApiError::Engine(EngineError::EngineDied("token 42 of \"my prompt\"".into()));
    assert!(!envelope(&died).to_string().contains("prompt"));
}

#[test]
fn messages_read_as_they_did_on_the_wire() {
    assert_eq!(ApiError::Busy("prepared").to_string(), "server busy: too many requests are being prepared");
    assert_eq!(
        ApiError::BodyTimeout(Duration::from_millis(1500)).to_string(),
        "the request body did not arrive within 1.5 s"
    );
    assert_eq!(
        ApiError::PrepareTimeout(Duration::from_secs(5)).to_string(),
        "preparing this request took longer than 5 s; simplify its tool or response_format schemas"
    );
    assert_eq!(ApiError::BodyUnreadable("reset".into()).to_string(), "could not read the request body: reset");
    let cut = OutputError::CutCall { name: "f".into(), arguments: "{\"a\"".into() };
    assert_eq!(ApiError::from(cut).to_string(), "the reply stopped inside a call to \"f\" (arguments so far: {\"a\")");
}

#[test]
fn the_envelope_always_holds_all_four_fields() {
    let body = envelope(&ApiError::EngineStopped);
    let fields = body["error"].as_object().expect("an object");
    let mut keys: Vec<&str> = fields.keys().map(String::as_str).collect();
    keys.sort_unstable();
    assert_eq!(keys, ["code", "message", "param", "type"]);
}

#[test]
fn only_unavailable_answers_say_when_to_retry() {
    let busy = ApiError::Engine(EngineError::QueueFull { capacity: 1 }).into_response();
    assert_eq!(busy.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(busy.headers()[header::RETRY_AFTER], "1");
    assert_eq!(busy.headers()[header::CONTENT_TYPE], "application/json");
    let refused = ApiError::invalid("n", "only n=1").into_response();
    assert_eq!(refused.status(), StatusCode::BAD_REQUEST);
    assert!(refused.headers().get(header::RETRY_AFTER).is_none());
}
