//! Ollama's model endpoints: `GET /api/version`, `/api/tags`, `/api/ps`, `POST /api/show`,
//! the model-management endpoints (refused: the model is chosen at start) and `GET /`.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, HeaderMap};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};

use super::super::admission::{admit, prepare};
use super::super::console;
use super::super::error::{ApiError, OllamaError};
use super::super::extract::parse_json;
use super::super::AppState;
use super::{check_model, tagged_name, OLLAMA_VERSION};
use crate::engine::media::MediaKind;
use crate::engine::ModelInfo;

/// `GET /` (and `HEAD /`): the console for browsers (they ask for `text/html`), else Ollama's
/// `Ollama is running`, which Ollama clients probe for.
pub(in super::super) async fn root(headers: HeaderMap) -> Response {
    let wants_html = headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|accept| accept.to_ascii_lowercase().contains("text/html"));
    if wants_html {
        console::page().await
    } else {
        ([(header::CONTENT_TYPE, "text/plain; charset=utf-8")], "Ollama is running").into_response()
    }
}

/// `GET /api/version`.
pub(super) async fn version() -> Json<Value> {
    Json(json!({ "version": OLLAMA_VERSION }))
}

/// `GET /api/tags`: the one model.
pub(super) async fn tags(State(state): State<Arc<AppState>>) -> Result<Json<Value>, OllamaError> {
    let model = state.engine.model_info()?;
    Ok(Json(json!({ "models": [listed(&model, state.started_at)] })))
}

/// `GET /api/ps`: the one model, always loaded, never expiring.
pub(super) async fn running(State(state): State<Arc<AppState>>) -> Result<Json<Value>, OllamaError> {
    let model = state.engine.model_info()?;
    let mut entry = listed(&model, state.started_at);
    entry["size_vram"] = json!(0);
    entry["context_length"] = json!(model.n_ctx);
    // Resident until the server stops: Ollama's `keep_alive: -1`, written as its far future.
    entry["expires_at"] = json!("2318-01-01T00:00:00Z");
    Ok(Json(json!({ "models": [entry] })))
}

/// `POST /api/show` body.
#[derive(Deserialize)]
struct ShowRequest {
    model: Option<String>,
    /// The older name of `model`.
    name: Option<String>,
}

/// `POST /api/show`: the model's details, parameters and capabilities.
pub(super) async fn show(State(state): State<Arc<AppState>>, request: Request) -> Result<Response, OllamaError> {
    let model = state.engine.model_info()?;
    let admitted = admit(&state, request).await?;
    let prepared = prepare(&state, admitted, parse_json::<ShowRequest>).await?;
    let asked = prepared.value.model.or(prepared.value.name);
    check_model(asked.as_deref(), &model)?;
    let template = model.template_source.to_string();
    Ok(Json(json!({
        "license": "",
        "modelfile": format!("# served by firstword\nFROM {}\n", model.id),
        "parameters": format!("num_ctx {}", model.n_ctx),
        "template": template,
        "details": details(&model),
        "model_info": {
            "general.architecture": model.architecture,
            "general.parameter_count": model.n_params,
            format!("{}.context_length", model.architecture): model.n_ctx_train,
        },
        "capabilities": capabilities(&model),
        "modified_at": rfc3339(state.started_at),
    }))
    .into_response())
}

/// Pull, push, create, copy, delete: refused, the model being chosen at start.
pub(super) async fn management(what: &'static str) -> OllamaError {
    OllamaError(ApiError::ModelManagement(what))
}

/// The model as `/api/tags` and `/api/ps` list it.
fn listed(model: &ModelInfo, started_at: u64) -> Value {
    let name = tagged_name(model);
    json!({
        "name": name,
        "model": name,
        "modified_at": rfc3339(started_at),
        "size": model.size_bytes,
        "digest": digest(model),
        "details": details(model),
    })
}

/// `details`: format, family, parameter size and quantization.
fn details(model: &ModelInfo) -> Value {
    json!({
        "parent_model": "",
        "format": "gguf",
        "family": model.architecture,
        "families": [model.architecture],
        "parameter_size": parameter_size(model.n_params),
        "quantization_level": model.file_type.map_or("unknown", quantization),
    })
}

/// What the model can do, in Ollama's words: `completion` and `tools` always (calls are
/// grammar-constrained in any template's format), `vision`/`audio` when the projector takes
/// them, `thinking` for templates with reasoning markers.
pub(super) fn capabilities(model: &ModelInfo) -> Vec<&'static str> {
    let mut capabilities = vec!["completion", "tools"];
    for (kind, name) in [(MediaKind::Image, "vision"), (MediaKind::Audio, "audio")] {
        let takes = match kind {
            MediaKind::Image => model.media.image,
            MediaKind::Audio => model.media.audio,
        };
        if takes && model.media.check(kind).is_ok() {
            capabilities.push(name);
        }
    }
    if model.reasoning.is_some() {
        capabilities.push("thinking");
    }
    capabilities
}

/// A stable digest-like id of the model (Ollama's is the manifest's SHA-256; clients only
/// compare it): its name, size and parameter count, hashed.
fn digest(model: &ModelInfo) -> String {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    (&model.id, model.size_bytes, model.n_params).hash(&mut hasher);
    format!("{:016x}", hasher.finish())
}

/// A parameter count as Ollama writes it: `135M`, `7.2B`.
pub(crate) fn parameter_size(n: u64) -> String {
    match n {
        n if n >= 1_000_000_000 => format!("{:.1}B", n as f64 / 1e9),
        n if n >= 1_000_000 => format!("{}M", (n as f64 / 1e6).round()),
        n => format!("{n}"),
    }
}

/// llama.cpp's `general.file_type` number as the quantization's name (`llama_ftype`).
pub(crate) fn quantization(file_type: u32) -> &'static str {
    const NAMES: &[(u32, &str)] = &[
        (0, "F32"),
        (1, "F16"),
        (2, "Q4_0"),
        (3, "Q4_1"),
        (7, "Q8_0"),
        (8, "Q5_0"),
        (9, "Q5_1"),
        (10, "Q2_K"),
        (11, "Q3_K_S"),
        (12, "Q3_K_M"),
        (13, "Q3_K_L"),
        (14, "Q4_K_S"),
        (15, "Q4_K_M"),
        (16, "Q5_K_S"),
        (17, "Q5_K_M"),
        (18, "Q6_K"),
        (19, "IQ2_XXS"),
        (20, "IQ2_XS"),
        (21, "Q2_K_S"),
        (22, "IQ3_XS"),
        (23, "IQ3_XXS"),
        (24, "IQ1_S"),
        (25, "IQ4_NL"),
        (26, "IQ3_S"),
        (27, "IQ3_M"),
        (28, "IQ2_S"),
        (29, "IQ2_M"),
        (30, "IQ4_XS"),
        (31, "IQ1_M"),
        (32, "BF16"),
        (36, "TQ1_0"),
        (37, "TQ2_0"),
        (38, "MXFP4"),
    ];
    NAMES.iter().find(|(n, _)| *n == file_type).map_or("unknown", |(_, name)| name)
}

/// Unix seconds as RFC 3339 UTC (`2026-12-05T01:02:03Z`).
pub(super) fn rfc3339(unix: u64) -> String {
    let time = chrono::DateTime::from_timestamp(i64::try_from(unix).unwrap_or(0), 0).unwrap_or_default();
    time.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}
