//! Token log-probabilities in OpenAI's shapes: chat completions' `logprobs.content[]`, and the
//! legacy `tokens` / `token_logprobs` / `top_logprobs` / `text_offset` lists of text
//! completions.

use serde::Serialize;
use serde_json::{Map, Value};

use crate::engine::{Candidate, TokenLogprob};

/// The floor OpenAI reports for a token the model gives no chance at all (a log-probability
/// is otherwise -infinity, which JSON cannot hold).
const FLOOR: f32 = -9999.0;

fn finite(logprob: f32) -> f32 {
    if logprob.is_nan() {
        FLOOR
    } else {
        logprob.max(FLOOR)
    }
}

/// `value` as a JSON number written as briefly as the `f32` (a JSON map holds `f64`s, whose
/// shortest form would show the `f32`'s rounding: -0.24858812987804413 for -0.24858813).
pub(super) fn short_number(value: f32) -> Value {
    value.to_string().parse::<f64>().map_or(Value::Null, Value::from)
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Chat completions' `choices[].logprobs`.
#[derive(Debug, Default, Serialize)]
pub(super) struct ChatLogprobs {
    /// One entry per generated token.
    pub content: Vec<ChatTokenLogprob>,
    /// Always null: this server never refuses.
    pub refusal: Option<()>,
}

/// One generated token of [`ChatLogprobs`].
#[derive(Clone, Debug, Serialize)]
pub(super) struct ChatTokenLogprob {
    #[serde(flatten)]
    pub token: AlternativeLogprob,
    /// The likeliest tokens at its position.
    pub top_logprobs: Vec<AlternativeLogprob>,
}

/// A token, its log-probability and its bytes.
#[derive(Clone, Debug, Serialize)]
pub(super) struct AlternativeLogprob {
    pub token: String,
    pub logprob: f32,
    pub bytes: Vec<u8>,
}

impl From<Candidate> for AlternativeLogprob {
    fn from(candidate: Candidate) -> Self {
        Self { token: text(&candidate.bytes), logprob: finite(candidate.logprob), bytes: candidate.bytes }
    }
}

impl ChatLogprobs {
    /// The entries of `tokens`.
    pub(super) fn of(tokens: Vec<TokenLogprob>) -> Self {
        let content = tokens
            .into_iter()
            .map(|t| ChatTokenLogprob {
                token: t.chosen.into(),
                top_logprobs: t.top.into_iter().map(AlternativeLogprob::from).collect(),
            })
            .collect();
        Self { content, refusal: None }
    }
}

/// Text completions' `choices[].logprobs` (the legacy shape).
#[derive(Debug, Default, Serialize)]
pub(super) struct TextLogprobs {
    /// Each token's text.
    pub tokens: Vec<String>,
    /// Each token's log-probability.
    pub token_logprobs: Vec<f32>,
    /// Each position's likeliest tokens, text to log-probability.
    pub top_logprobs: Vec<Map<String, Value>>,
    /// Where each token starts in the completion's text, in characters.
    pub text_offset: Vec<usize>,
}

impl TextLogprobs {
    /// The lists of `tokens`, whose text starts `offset` characters into the completion;
    /// returns them with the offset after them.
    pub(super) fn of(tokens: Vec<TokenLogprob>, mut offset: usize) -> (Self, usize) {
        let mut out = Self::default();
        for token in tokens {
            let chosen = text(&token.chosen.bytes);
            out.text_offset.push(offset);
            offset += chosen.chars().count();
            out.token_logprobs.push(finite(token.chosen.logprob));
            out.tokens.push(chosen);
            let top = token.top.into_iter().map(|c| (text(&c.bytes), short_number(finite(c.logprob)))).collect();
            out.top_logprobs.push(top);
        }
        (out, offset)
    }

    /// `other`'s tokens after these.
    pub(super) fn extend(&mut self, other: Self) {
        self.tokens.extend(other.tokens);
        self.token_logprobs.extend(other.token_logprobs);
        self.top_logprobs.extend(other.top_logprobs);
        self.text_offset.extend(other.text_offset);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn token(bytes: &[u8], logprob: f32, top: &[(&[u8], f32)]) -> TokenLogprob {
        let candidate = |bytes: &[u8], logprob| Candidate { token: 7, bytes: bytes.to_vec(), logprob };
        TokenLogprob { chosen: candidate(bytes, logprob), top: top.iter().map(|&(b, l)| candidate(b, l)).collect() }
    }

    #[test]
    fn chat_entries_carry_text_bytes_and_alternatives() {
        let logprobs = ChatLogprobs::of(vec![token(b"Hi", -0.5, &[(b"Hi", -0.5), (b"Hey", -1.5)])]);
        let json = serde_json::to_value(&logprobs).expect("serializes");
        assert_eq!(
            json,
            serde_json::json!({"content": [{"token": "Hi", "logprob": -0.5, "bytes": [72, 105],
                "top_logprobs": [{"token": "Hi", "logprob": -0.5, "bytes": [72, 105]},
                                 {"token": "Hey", "logprob": -1.5, "bytes": [72, 101, 121]}]}],
                "refusal": null})
        );
    }

    #[test]
    fn a_token_without_any_chance_gets_the_floor_not_null() {
        let logprobs = ChatLogprobs::of(vec![token(b"x", f32::NEG_INFINITY, &[])]);
        assert_eq!(logprobs.content[0].token.logprob, FLOOR);
    }

    #[test]
    fn legacy_lists_count_offsets_in_characters() {
        let (first, offset) = TextLogprobs::of(vec![token("é".as_bytes(), -0.25, &[]), token(b"b", -1.0, &[])], 0);
        assert_eq!((first.text_offset.as_slice(), offset), (&[0, 1][..], 2));
        let (second, _) = TextLogprobs::of(vec![token(b"c", -2.0, &[(b"c", -2.0)])], offset);
        let mut all = first;
        all.extend(second);
        assert_eq!(all.tokens, ["é", "b", "c"]);
        assert_eq!(all.token_logprobs, [-0.25, -1.0, -2.0]);
        assert_eq!(all.text_offset, [0, 1, 2]);
        assert_eq!(all.top_logprobs[2], serde_json::json!({"c": -2.0}).as_object().cloned().expect("an object"));
    }
}
