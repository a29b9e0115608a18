//! `GET /v1/models`, `GET /health` and `GET /cache`.

use std::sync::Arc;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;

use super::error::ApiError;
use super::wire::{
    CacheEntryView, CacheView, DeviceView, DiskCacheView, KeptView, MediaCacheView, ModelCard, ModelList, ModelMeta,
};
use super::AppState;
use crate::engine::media::MediaKind;
use crate::engine::CacheEntryStatus;

/// Lists the one loaded model.
pub(super) async fn list_models(State(state): State<Arc<AppState>>) -> Result<Json<ModelList>, ApiError> {
    let info = state.engine.model_info()?;
    Ok(Json(ModelList {
        object: "list",
        data: vec![ModelCard {
            id: info.id,
            object: "model",
            created: state.started_at,
            owned_by: "firstword",
            meta: ModelMeta {
                architecture: info.architecture,
                n_ctx: info.n_ctx,
                n_ctx_train: info.n_ctx_train,
                n_vocab: info.n_vocab,
                chat_template: info.template_source.to_string(),
                tool_format: info.tool_format.name(),
                reasoning_markers: info.reasoning.map(|r| [r.open, r.close]),
                input_media: [(MediaKind::Image, info.media.image), (MediaKind::Audio, info.media.audio)]
                    .into_iter()
                    .filter(|&(kind, takes)| takes && info.media.check(kind).is_ok())
                    .map(|(kind, _)| kind.as_str())
                    .collect(),
                media_refused: info.media.refused.clone(),
                devices: (info.devices.iter())
                    .map(|device| DeviceView {
                        name: device.name.clone(),
                        description: device.description.clone(),
                        backend: device.backend.clone(),
                        memory_total: device.memory_total,
                        memory_free: device.memory_free,
                    })
                    .collect(),
            },
        }],
    }))
}

/// 200 when the model is loaded, 503 (with the envelope) while it loads.
pub(super) async fn health(State(state): State<Arc<AppState>>) -> Response {
    match state.engine.model_info() {
        Ok(_) => Json(serde_json::json!({"status": "ok"})).into_response(),
        Err(e) => ApiError::Engine(e).into_response(),
    }
}

/// How `GET /cache` shows stored entries.
fn entry_views(entries: Vec<CacheEntryStatus>) -> Vec<CacheEntryView> {
    let unix = |t: std::time::SystemTime| t.duration_since(std::time::UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64());
    entries
        .into_iter()
        .map(|entry| CacheEntryView {
            kind: entry.kind.as_str(),
            tokens: entry.tokens,
            bytes: entry.bytes,
            last_used: unix(entry.last_used),
        })
        .collect()
}

/// What the cache holds: the live sequence, the RAM store's and the disk cache's entries (as of the end of the
/// last request; never waits for a running one).
pub(super) async fn cache(State(state): State<Arc<AppState>>) -> Result<Json<CacheView>, ApiError> {
    state.engine.model_info()?;
    let status = state.engine.cache_status();
    Ok(Json(CacheView {
        live_tokens: status.live_tokens,
        budget_bytes: status.budget_bytes,
        used_bytes: status.used_bytes,
        checkpoint_every: status.checkpoint_every,
        entries: entry_views(status.entries),
        disk: status.disk.map(|disk| DiskCacheView {
            dir: disk.dir.display().to_string(),
            budget_bytes: disk.budget_bytes,
            used_bytes: disk.used_bytes,
            bytes_written: disk.bytes_written,
            signature_bytes: disk.signature_bytes,
            entries: entry_views(disk.entries),
            off: disk.off,
            read_only: disk.read_only,
        }),
        media: status.media.map(|media| MediaCacheView {
            entries: media.entries,
            budget_bytes: media.budget_bytes,
            used_bytes: media.used_bytes,
        }),
        kept: (status.kept.iter())
            .map(|kept| KeptView { sequence: kept.sequence, tokens: kept.tokens, shared: kept.shared })
            .collect(),
        live_approximate_from: status.live_approximate_from,
    }))
}
