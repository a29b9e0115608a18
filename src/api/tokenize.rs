//! llama-server's tokenizer endpoints, with its field names: `POST /tokenize`,
//! `POST /detokenize` and `POST /apply-template` (the exact prompt text a chat body becomes),
//! for finding out why a prompt missed the cache. None waits for a running generation.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::Json;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::chat::read_bounded_body;
use super::convert::{prepare, ChatBody};
use super::error::ApiError;
use super::extract::parse_json;
use super::AppState;
use crate::engine::Prompt;

/// `POST /tokenize` body.
#[derive(Debug, Deserialize)]
pub(super) struct TokenizeRequest {
    content: String,
    /// Add the BOS (and EOS) tokens the model asks for.
    #[serde(default)]
    add_special: bool,
    /// Read special tokens written as text (`<|im_start|>`).
    #[serde(default = "yes")]
    parse_special: bool,
    /// Answer each token with its text.
    #[serde(default)]
    with_pieces: bool,
}

fn yes() -> bool {
    true
}

/// `POST /tokenize` answer: ids, or ids with their pieces.
#[derive(Debug, Serialize)]
pub(super) struct TokenizeAnswer {
    tokens: Vec<Value>,
}

/// `POST /detokenize` body.
#[derive(Debug, Deserialize)]
pub(super) struct DetokenizeRequest {
    tokens: Vec<i64>,
}

/// `POST /detokenize` answer.
#[derive(Debug, Serialize)]
pub(super) struct DetokenizeAnswer {
    content: String,
}

/// `POST /apply-template` answer.
#[derive(Debug, Serialize)]
pub(super) struct ApplyTemplateAnswer {
    prompt: String,
}

/// `POST /tokenize`. Reading the body and tokenizing take the permits chat requests take, so
/// that large texts cannot take unbounded memory and threads.
pub(super) async fn tokenize(
    State(state): State<Arc<AppState>>,
    request: Request,
) -> Result<Json<TokenizeAnswer>, ApiError> {
    state.engine.model_info()?;
    let body: TokenizeRequest = parse_json(&read_bounded_body(&state, request).await?)?;
    let _tokenizing = state.conversions.acquire().await.map_err(|_| ApiError::Busy("prepared"))?;
    let ids = state.engine.tokenize(body.content, body.add_special, body.parse_special).await?;
    let tokens = if body.with_pieces {
        let pieces = state.engine.token_pieces(&ids)?;
        ids.iter().zip(pieces).map(|(&id, piece)| serde_json::json!({"id": id, "piece": piece_value(piece)})).collect()
    } else {
        ids.into_iter().map(Value::from).collect()
    };
    Ok(Json(TokenizeAnswer { tokens }))
}

/// A piece as llama-server shows it: text where it is valid UTF-8, else its bytes.
fn piece_value(piece: Vec<u8>) -> Value {
    match String::from_utf8(piece) {
        Ok(text) => Value::String(text),
        Err(bytes) => Value::from(bytes.into_bytes()),
    }
}

/// `POST /detokenize`.
pub(super) async fn detokenize(
    State(state): State<Arc<AppState>>,
    request: Request,
) -> Result<Json<DetokenizeAnswer>, ApiError> {
    state.engine.model_info()?;
    let body: DetokenizeRequest = parse_json(&read_bounded_body(&state, request).await?)?;
    let ids = body
        .tokens
        .iter()
        .map(|&id| i32::try_from(id).map_err(|_| ApiError::invalid("tokens", format!("{id} is not a token id"))))
        .collect::<Result<Vec<i32>, _>>()?;
    // A large body holds millions of ids: looked up off the async runtime.
    let _detokenizing = state.conversions.acquire().await.map_err(|_| ApiError::Busy("prepared"))?;
    let engine = Arc::clone(&state.engine);
    let pieces = tokio::task::spawn_blocking(move || engine.token_pieces(&ids))
        .await
        .map_err(|e| ApiError::Internal(format!("detokenizing failed: {e}")))??;
    let bytes: Vec<u8> = pieces.concat();
    Ok(Json(DetokenizeAnswer { content: String::from_utf8_lossy(&bytes).into_owned() }))
}

/// `POST /apply-template`: a chat-completions body (checked as that endpoint checks it) and
/// the prompt text the engine would evaluate for it.
pub(super) async fn apply_template(
    State(state): State<Arc<AppState>>,
    request: Request,
) -> Result<Json<ApplyTemplateAnswer>, ApiError> {
    let model = state.engine.model_info()?;
    // Nothing is queued: a full queue does not hold it.
    let bytes = read_bounded_body(&state, request).await?;
    let job = prepare(&state.conversions, move || ChatBody::parse(&bytes)?.into_job(&model)).await?;
    let Prompt::Chat { messages, tools, template_kwargs } = job.request.prompt else {
        return Err(ApiError::Internal("a chat body became no chat prompt".into()));
    };
    let prompt = state.engine.chat_prompt_text(&messages, &tools, &template_kwargs)?;
    Ok(Json(ApplyTemplateAnswer { prompt }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_are_text_where_they_can_be() {
        assert_eq!(piece_value(b"Hi".to_vec()), Value::from("Hi"));
        assert_eq!(piece_value(vec![0xE2, 0x82]), serde_json::json!([226, 130]));
    }
}
