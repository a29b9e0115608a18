//! Helpers of the tests of several conversations in one context (`--parallel`): the engines'
//! settings, greedy chat requests with end-of-turn tokens banned, and the comparison of a
//! reply's first log-probabilities with the same request's alone.

use std::path::PathBuf;

use firstword::{ChatMessage, Engine, EngineConfig, GenerationRequest, Prompt, SamplingParams};

use super::{test_config, Generated};

/// Settings of both engines: three sequences, one thread, fixed.
pub(crate) fn lanes_config(model: PathBuf) -> EngineConfig {
    EngineConfig { threads: 1, threads_batch: 1, fixed_threads: true, parallel: 3, ..test_config(model) }
}

/// A greedy chat request: `system`, then `user`; `banned` tokens never picked.
pub(crate) fn request(system: &str, user: &str, max_tokens: u32, banned: &[i32]) -> GenerationRequest {
    GenerationRequest {
        prompt: Prompt::chat(vec![ChatMessage::system(system), ChatMessage::user(user)], Vec::new()),
        max_tokens: Some(max_tokens),
        sampling: SamplingParams {
            logit_bias: banned.iter().map(|&token| (token, f32::NEG_INFINITY)).collect(),
            ..SamplingParams::greedy()
        },
        ..GenerationRequest::chat(Vec::new())
    }
}

/// The last token of each of `texts` (special tokens: the model's end-of-turn markers).
pub(crate) fn token_ids(engine: &Engine, texts: &[&str]) -> Vec<i32> {
    texts
        .iter()
        .filter_map(|text| engine.tokenize_blocking(&Prompt::Text((*text).into())).ok()?.last().copied())
        .collect()
}

/// How far a lane's first log-probabilities may be from the same request's alone: rounding
/// only (they come out identical here; a lane's prompt is evaluated in a call of its own). On
/// the random-weight fixtures, a lane that wrongly continued A's recurrent state moved them by
/// 0.01-0.05.
pub(crate) const FIRST_TOKEN_TOLERANCE: f32 = 1e-3;

/// Whether two replies' first tokens had the same five likeliest candidates, their
/// log-probabilities within [`FIRST_TOKEN_TOLERANCE`].
pub(crate) fn same_first_candidates(a: &Generated, b: &Generated) -> bool {
    let (a, b) = (&a.logprobs[0].top, &b.logprobs[0].top);
    a.len() == b.len()
        && a.iter().zip(b).all(|(x, y)| x.token == y.token && (x.logprob - y.logprob).abs() <= FIRST_TOKEN_TOLERANCE)
}
