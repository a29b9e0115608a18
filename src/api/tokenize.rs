//! llama-server's tokenizer endpoints, with its field names: `POST /tokenize`,
//! `POST /detokenize` and `POST /apply-template` (the exact prompt text a chat body becomes),
//! for finding out why a prompt missed the cache. None waits for a running generation. Each
//! takes the admission path: its body is parsed, its work done and its answer written on a
//! conversion thread, and its input is bounded by a multiple of the context
//! ([`TOKENIZER_CONTEXTS`]).

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::response::Response;
use serde::de::{DeserializeSeed, Error as _, IgnoredAny, MapAccess, Visitor};
use serde::{Deserialize, Serialize};

use super::admission::{admit, json_answer, prepare, to_json};
use super::convert::ChatBody;
use super::error::{ApiError, Refusal};
use super::extract::parse_json;
use super::limits::{BoundedList, ListSeed, TOKENIZER_CONTEXTS, TOKENIZE_BYTES_PER_TOKEN};
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
#[serde(untagged)]
enum TokenizeAnswer {
    Ids { tokens: Vec<i32> },
    Pieces { tokens: Vec<IdPiece> },
}

/// A token with its piece.
#[derive(Debug, Serialize)]
struct IdPiece {
    id: i32,
    piece: Piece,
}

/// A piece as llama-server shows it: text where it is valid UTF-8, else its bytes.
#[derive(Debug, PartialEq, Serialize)]
#[serde(untagged)]
enum Piece {
    Text(String),
    Bytes(Vec<u8>),
}

impl From<Vec<u8>> for Piece {
    fn from(piece: Vec<u8>) -> Self {
        match String::from_utf8(piece) {
            Ok(text) => Self::Text(text),
            Err(bytes) => Self::Bytes(bytes.into_bytes()),
        }
    }
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

/// `POST /tokenize`: at most [`TOKENIZER_CONTEXTS`] contexts of text
/// ([`TOKENIZE_BYTES_PER_TOKEN`] bytes a token).
pub(super) async fn tokenize(State(state): State<Arc<AppState>>, request: Request) -> Result<Response, ApiError> {
    let max_bytes = TOKENIZER_CONTEXTS * TOKENIZE_BYTES_PER_TOKEN * state.engine.model_info()?.n_ctx as usize;
    let admitted = admit(&state, request).await?;
    let engine = Arc::clone(&state.engine);
    let answer = prepare(&state, admitted, move |bytes| {
        let body: TokenizeRequest = parse_json(bytes)?;
        if body.content.len() > max_bytes {
            return Err(ApiError::refused(
                Refusal::Limit,
                "content",
                format!(
                    "'content' may be at most {max_bytes} bytes long ({TOKENIZER_CONTEXTS} contexts of {TOKENIZE_BYTES_PER_TOKEN} bytes a token), got {}",
                    body.content.len()
                ),
            ));
        }
        let ids = engine.tokenize(&body.content, body.add_special, body.parse_special)?;
        drop(body.content);
        // An id is at most 7 bytes of JSON, a piece with its field names about 24.
        let size = ids.len() * if body.with_pieces { 32 } else { 7 };
        let answer = if body.with_pieces {
            let pieces = engine.token_pieces(&ids)?;
            let tokens = ids.into_iter().zip(pieces).map(|(id, piece)| IdPiece { id, piece: piece.into() }).collect();
            TokenizeAnswer::Pieces { tokens }
        } else {
            TokenizeAnswer::Ids { tokens: ids }
        };
        to_json(&answer, size)
    })
    .await?;
    Ok(json_answer(answer))
}

/// `POST /detokenize`: at most [`TOKENIZER_CONTEXTS`] contexts of token ids.
pub(super) async fn detokenize(State(state): State<Arc<AppState>>, request: Request) -> Result<Response, ApiError> {
    let max_ids = TOKENIZER_CONTEXTS * state.engine.model_info()?.n_ctx as usize;
    let admitted = admit(&state, request).await?;
    let engine = Arc::clone(&state.engine);
    let answer = prepare(&state, admitted, move |bytes| {
        let listed = parse_detokenize(bytes, max_ids)?;
        if listed.total > max_ids {
            return Err(ApiError::refused(
                Refusal::Limit,
                "tokens",
                format!(
                    "at most {max_ids} token ids ({TOKENIZER_CONTEXTS} contexts) are accepted, got {}",
                    listed.total
                ),
            ));
        }
        let ids = listed
            .items
            .into_iter()
            .map(|id| i32::try_from(id).map_err(|_| ApiError::invalid("tokens", format!("{id} is not a token id"))))
            .collect::<Result<Vec<i32>, _>>()?;
        let bytes: Vec<u8> = engine.token_pieces(&ids)?.concat();
        let content = String::from_utf8_lossy(&bytes).into_owned();
        let size = content.len();
        to_json(&DetokenizeAnswer { content }, size)
    })
    .await?;
    Ok(json_answer(answer))
}

/// A `/detokenize` body's `tokens`, keeping at most `max` of them (the rest only counted).
fn parse_detokenize(bytes: &[u8], max: usize) -> Result<BoundedList<i64>, ApiError> {
    /// Reads the body object, `tokens` through a [`ListSeed`].
    struct Body(usize);

    impl<'de> Visitor<'de> for Body {
        type Value = BoundedList<i64>;

        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("an object with 'tokens'")
        }

        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            let mut tokens = None;
            while let Some(key) = map.next_key::<String>()? {
                if key == "tokens" {
                    tokens = Some(map.next_value_seed(ListSeed::new(self.0))?);
                } else {
                    map.next_value::<IgnoredAny>()?;
                }
            }
            tokens.ok_or_else(|| A::Error::missing_field("tokens"))
        }
    }

    impl<'de> DeserializeSeed<'de> for Body {
        type Value = BoundedList<i64>;

        fn deserialize<D: serde::Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
            deserializer.deserialize_map(self)
        }
    }

    let invalid = |e: serde_json::Error| ApiError::json(None, format!("invalid /detokenize body: {e}"));
    let mut deserializer = serde_json::Deserializer::from_slice(bytes);
    let tokens = Body(max).deserialize(&mut deserializer).map_err(invalid)?;
    deserializer.end().map_err(invalid)?;
    Ok(tokens)
}

/// `POST /apply-template`: a chat-completions body (checked as that endpoint checks it) and
/// the prompt text the engine would evaluate for it, rendered on a conversion thread.
pub(super) async fn apply_template(State(state): State<Arc<AppState>>, request: Request) -> Result<Response, ApiError> {
    let model = state.engine.model_info()?;
    // Nothing is queued: a full queue does not hold it.
    let admitted = admit(&state, request).await?;
    let engine = Arc::clone(&state.engine);
    let answer = prepare(&state, admitted, move |bytes| {
        let job = ChatBody::parse(bytes)?.into_job(&model)?;
        let Prompt::Chat { messages, tools, template_kwargs } = job.request.prompt else {
            return Err(ApiError::Internal("a chat body became no chat prompt".into()));
        };
        let prompt = engine.chat_prompt_text(&messages, &tools, &template_kwargs)?;
        drop((messages, tools));
        let size = prompt.len();
        to_json(&ApplyTemplateAnswer { prompt }, size)
    })
    .await?;
    Ok(json_answer(answer))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_are_text_where_they_can_be() {
        assert_eq!(Piece::from(b"Hi".to_vec()), Piece::Text("Hi".into()));
        assert_eq!(serde_json::to_value(Piece::from(vec![0xE2, 0x82])).ok(), Some(serde_json::json!([226, 130])));
    }

    #[test]
    fn detokenize_lists_are_read_up_to_their_limit() {
        let listed = parse_detokenize(br#"{"x": [1], "tokens": [1, 2, 3, 4, 5]}"#, 3).expect("parsed");
        assert_eq!((listed.items, listed.total), (vec![1, 2, 3], 5));
        assert!(parse_detokenize(br#"{"x": 1}"#, 3).is_err());
        assert!(parse_detokenize(br#"{"tokens": [1]} x"#, 3).is_err());
    }
}
