//! What chat and text completions share: the sampling fields, stop strings, the token limit
//! and streaming options, read from the same body as each endpoint's own fields and checked
//! against OpenAI's ranges (refused with a 400 naming the field, never clamped).

use std::collections::BTreeMap;

use serde::Deserialize;

use super::error::ApiError;
use super::limits::{check_stops, too_many, MAX_LOGIT_BIAS};
use crate::engine::{ModelInfo, SamplingParams};

/// The fields both completion endpoints take (unknown fields are ignored).
#[derive(Debug, Default, Deserialize)]
pub(crate) struct SamplingFields {
    pub model: Option<String>,
    pub stream: Option<bool>,
    pub stream_options: Option<StreamOptions>,
    pub max_tokens: Option<i64>,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub top_k: Option<i64>,
    pub min_p: Option<f64>,
    pub seed: Option<i64>,
    pub stop: Option<Stop>,
    pub presence_penalty: Option<f64>,
    pub frequency_penalty: Option<f64>,
    pub repeat_penalty: Option<f64>,
    pub repeat_last_n: Option<i64>,
    pub logit_bias: Option<BTreeMap<String, f64>>,
    pub n: Option<i64>,
    /// Reuse the cache past short changed spans of the prompt (an approximation, see
    /// docs/cache.md); the server's `--reuse-after-change` when absent.
    pub reuse_after_change: Option<bool>,
}

/// `stream_options`.
#[derive(Debug, Deserialize)]
pub(crate) struct StreamOptions {
    pub include_usage: Option<bool>,
}

/// `stop`: one string or several.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub(crate) enum Stop {
    One(String),
    Many(Vec<String>),
}

impl SamplingFields {
    /// The sampler settings, checked against OpenAI's ranges and the model.
    ///
    /// # Errors
    /// A 400 naming the first field out of range, or `n` other than 1.
    pub(crate) fn sampling(&self, model: &ModelInfo) -> Result<SamplingParams, ApiError> {
        if let Some(n) = self.n.filter(|&n| n != 1) {
            return Err(ApiError::invalid("n", format!("only n=1 is supported, got {n}")));
        }
        let defaults = SamplingParams::default();
        let top_k = match self.top_k {
            Some(k) if k < 0 => return Err(ApiError::invalid("top_k", format!("'top_k' must be 0 or more, got {k}"))),
            Some(k) => i32::try_from(k).unwrap_or(i32::MAX),
            None => defaults.top_k,
        };
        let repeat_last_n = match self.repeat_last_n {
            Some(n) if n < 0 || n > i64::from(model.n_ctx) => {
                return Err(ApiError::invalid(
                    "repeat_last_n",
                    format!("'repeat_last_n' must be between 0 and the context size {}, got {n}", model.n_ctx),
                ))
            }
            Some(n) => i32::try_from(n).unwrap_or(i32::MAX),
            None => defaults.repeat_last_n,
        };
        Ok(SamplingParams {
            temperature: in_range("temperature", self.temperature, 0.0, 2.0)?.unwrap_or(defaults.temperature),
            top_p: in_range("top_p", self.top_p, 0.0, 1.0)?.unwrap_or(defaults.top_p),
            top_k,
            min_p: in_range("min_p", self.min_p, 0.0, 1.0)?.unwrap_or(defaults.min_p),
            // Any integer is a valid seed; llama.cpp takes 32 bits.
            seed: self.seed.map(|s| s as u32),
            presence_penalty: in_range("presence_penalty", self.presence_penalty, -2.0, 2.0)?.unwrap_or(0.0),
            frequency_penalty: in_range("frequency_penalty", self.frequency_penalty, -2.0, 2.0)?.unwrap_or(0.0),
            repeat_penalty: match in_range("repeat_penalty", self.repeat_penalty, 0.0, 10.0)? {
                Some(p) if p <= 0.0 => {
                    return Err(ApiError::invalid("repeat_penalty", "'repeat_penalty' must be above 0 (1 disables it)"))
                }
                other => other.unwrap_or(defaults.repeat_penalty),
            },
            repeat_last_n,
            logit_bias: convert_logit_bias(self.logit_bias.as_ref(), model.n_vocab)?,
        })
    }

    /// The stop strings, within the limits.
    ///
    /// # Errors
    /// A 400 when there are too many or one is too long.
    pub(crate) fn stops(&mut self) -> Result<Vec<String>, ApiError> {
        let stop = match self.stop.take() {
            None => Vec::new(),
            Some(Stop::One(s)) => vec![s],
            Some(Stop::Many(list)) => list,
        };
        check_stops(&stop)?;
        Ok(stop)
    }

    /// Whether a stream ends with a usage chunk (`stream_options.include_usage`).
    pub(crate) fn include_usage(&self) -> bool {
        self.stream_options.as_ref().and_then(|o| o.include_usage).unwrap_or(false)
    }

    /// The model name to answer with: the request's, else the loaded model's.
    pub(crate) fn model_name(&mut self, model: &ModelInfo) -> String {
        self.model.take().filter(|m| !m.is_empty()).unwrap_or_else(|| model.id.clone())
    }
}

/// A token limit from the field `param`: `None` when absent.
///
/// # Errors
/// A 400 when it is below 1.
pub(crate) fn token_limit(param: &str, value: Option<i64>) -> Result<Option<u32>, ApiError> {
    match value {
        None => Ok(None),
        Some(m) if m < 1 => Err(ApiError::invalid(param, format!("'{param}' must be at least 1, got {m}"))),
        Some(m) => Ok(Some(u32::try_from(m).unwrap_or(u32::MAX))),
    }
}

/// `value` of the field `param`, checked to lie within `min..=max`.
///
/// # Errors
/// A 400 naming `param` when it does not.
pub(crate) fn in_range(param: &str, value: Option<f64>, min: f64, max: f64) -> Result<Option<f32>, ApiError> {
    match value {
        Some(v) if !(min..=max).contains(&v) => {
            Err(ApiError::invalid(param, format!("'{param}' must be between {min} and {max}, got {v}")))
        }
        other => Ok(other.map(|v| v as f32)),
    }
}

fn convert_logit_bias(bias: Option<&BTreeMap<String, f64>>, n_vocab: i32) -> Result<Vec<(i32, f32)>, ApiError> {
    let Some(bias) = bias else { return Ok(Vec::new()) };
    if bias.len() > MAX_LOGIT_BIAS {
        return Err(too_many("logit_bias", "logit_bias entries", bias.len(), MAX_LOGIT_BIAS));
    }
    let mut out = Vec::new();
    for (key, &value) in bias {
        let token = key.parse::<i32>().ok().filter(|t| (0..n_vocab).contains(t)).ok_or_else(|| {
            ApiError::invalid("logit_bias", format!("'{key}' is not a token id of this model (0..{n_vocab})"))
        })?;
        if !(-100.0..=100.0).contains(&value) {
            return Err(ApiError::invalid(
                "logit_bias",
                format!("bias for token {key} must be between -100 and 100, got {value}"),
            ));
        }
        out.push((token, value as f32));
    }
    Ok(out)
}
