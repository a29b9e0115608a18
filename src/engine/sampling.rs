//! Per-request sampling settings and the llama.cpp sampler chain built from them.

use llama_cpp_2::sampling::LlamaSampler;
use llama_cpp_2::token::logit_bias::LlamaLogitBias;
use llama_cpp_2::token::LlamaToken;

/// How the next token is chosen. Defaults match llama-server's.
#[derive(Clone, Debug, PartialEq)]
pub struct SamplingParams {
    /// Softmax temperature; 0 or less means greedy (always the most likely token).
    pub temperature: f32,
    /// Keep only the k most likely tokens (0 disables).
    pub top_k: i32,
    /// Nucleus sampling: keep the smallest set whose probabilities sum to `top_p` (1 disables).
    pub top_p: f32,
    /// Drop tokens less likely than `min_p` times the most likely one (0 disables).
    pub min_p: f32,
    /// Random seed; `None` picks a fresh one per request.
    pub seed: Option<u32>,
    /// Multiplicative penalty for tokens seen in the last `repeat_last_n` tokens (1 disables).
    pub repeat_penalty: f32,
    /// How many recent tokens the penalties look at.
    pub repeat_last_n: i32,
    /// OpenAI `frequency_penalty`: subtracted once per earlier occurrence.
    pub frequency_penalty: f32,
    /// OpenAI `presence_penalty`: subtracted once if the token occurred at all.
    pub presence_penalty: f32,
    /// Additive logit bias per token id (OpenAI `logit_bias`).
    pub logit_bias: Vec<(i32, f32)>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        Self {
            temperature: 0.8,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            seed: None,
            repeat_penalty: 1.0,
            repeat_last_n: 64,
            frequency_penalty: 0.0,
            presence_penalty: 0.0,
            logit_bias: Vec::new(),
        }
    }
}

impl SamplingParams {
    /// Greedy decoding: deterministic, the most likely token every step.
    #[must_use]
    pub fn greedy() -> Self {
        Self { temperature: 0.0, ..Self::default() }
    }

    fn has_penalties(&self) -> bool {
        self.repeat_penalty != 1.0 || self.frequency_penalty != 0.0 || self.presence_penalty != 0.0
    }
}

/// Builds the sampler chain in llama.cpp's usual order: logit bias, penalties, then either greedy
/// or the truncation samplers, temperature and a seeded random draw.
pub(crate) fn build_sampler(params: &SamplingParams, n_vocab: i32) -> LlamaSampler {
    let mut chain = Vec::new();
    if !params.logit_bias.is_empty() {
        let biases: Vec<LlamaLogitBias> =
            params.logit_bias.iter().map(|&(token, bias)| LlamaLogitBias::new(LlamaToken(token), bias)).collect();
        chain.push(LlamaSampler::logit_bias(n_vocab, &biases));
    }
    if params.has_penalties() {
        chain.push(LlamaSampler::penalties(
            n_vocab,
            params.repeat_last_n,
            params.repeat_penalty,
            params.frequency_penalty,
            params.presence_penalty,
        ));
    }
    if params.temperature <= 0.0 {
        chain.push(LlamaSampler::greedy());
    } else {
        if params.top_k > 0 {
            chain.push(LlamaSampler::top_k(params.top_k));
        }
        if params.top_p < 1.0 {
            chain.push(LlamaSampler::top_p(params.top_p, 1));
        }
        if params.min_p > 0.0 {
            chain.push(LlamaSampler::min_p(params.min_p, 1));
        }
        chain.push(LlamaSampler::temp(params.temperature));
        chain.push(LlamaSampler::dist(params.seed.unwrap_or_else(|| fastrand::u32(..))));
    }
    LlamaSampler::chain_simple(chain)
}
