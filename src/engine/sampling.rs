//! Per-request sampling settings and the llama.cpp sampler chain built from them.

use llama_cpp_2::context::LlamaContext;
use llama_cpp_2::model::LlamaModel;
use llama_cpp_2::sampling::LlamaSampler;
use llama_cpp_2::token::data::LlamaTokenData;
use llama_cpp_2::token::data_array::LlamaTokenDataArray;
use llama_cpp_2::token::logit_bias::LlamaLogitBias;
use llama_cpp_2::token::LlamaToken;

use super::{EngineError, Grammar};

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

/// Chooses each next token: the sampler chain, kept inside an optional grammar.
///
/// Grammar checks are costly (~10x a plain sampling step), so the chain samples first and only
/// that one token is checked; only when the grammar rejects it is the whole distribution
/// filtered by the grammar and sampled again, grammar first. That order matters: a truncating
/// sampler (top-k, top-p, min-p) running before the grammar can leave no allowed token, and
/// llama.cpp then throws through the FFI boundary, which aborts the process.
///
/// Lazy grammars are triggered here, not inside llama.cpp (whose trigger search runs a regex
/// over all text so far on every token): once a trigger text appears in the output, the
/// grammar is started and fed the text from the trigger on.
pub(crate) struct TokenPicker<'m> {
    model: &'m LlamaModel,
    chain: LlamaSampler,
    /// How many of the most likely tokens must be allowed by the grammar for a resample to
    /// look at those alone; `None` when only the whole vocabulary gives the exact result.
    shortlist_need: Option<usize>,
    constraint: Option<Constraint>,
}

/// A grammar and whether it applies yet.
struct Constraint {
    grammar: LlamaSampler,
    /// Texts that start the grammar; empty once it is active.
    triggers: Vec<String>,
    /// The end of the output so far, long enough to find a trigger that spans tokens.
    recent: Vec<u8>,
}

impl<'m> TokenPicker<'m> {
    /// A picker for one request.
    ///
    /// # Errors
    /// [`EngineError::InvalidGrammar`] if llama.cpp cannot parse the grammar.
    pub(crate) fn new(
        model: &'m LlamaModel,
        params: &SamplingParams,
        grammar: Option<&Grammar>,
    ) -> Result<Self, EngineError> {
        let constraint = match grammar {
            None => None,
            Some(grammar) => Some(Constraint {
                grammar: LlamaSampler::grammar(model, &grammar.gbnf, &grammar.root)
                    .map_err(|e| EngineError::InvalidGrammar(format!("llama.cpp cannot parse the grammar ({e})")))?,
                triggers: grammar.triggers.iter().filter(|t| !t.is_empty()).cloned().collect(),
                recent: Vec::new(),
            }),
        };
        // Greedy over the shortlist is exact when one of it is allowed. With top-k sampling,
        // allowed tokens ranked below the shortlist are left out (they are the least likely of
        // the allowed ones; measured: a grammar pass over gemma's 262K-token vocabulary costs
        // more than a decode step). Sampling over the whole distribution (top-k off), and
        // logit bias or penalties (which move tokens across the shortlist's edge), keep the
        // exact full pass.
        let shortlist_need = match params {
            p if !p.logit_bias.is_empty() || p.has_penalties() => None,
            p if p.temperature <= 0.0 || p.top_k > 0 => Some(1),
            _ => None,
        };
        Ok(Self { model, chain: build_sampler(params, model.n_vocab()), shortlist_need, constraint })
    }

    /// Picks the token that follows the logits at `index` and records it as accepted.
    ///
    /// # Errors
    /// [`EngineError::GrammarDeadEnd`] if the grammar allows no token at all.
    pub(crate) fn pick(&mut self, ctx: &LlamaContext<'_>, index: i32) -> Result<LlamaToken, EngineError> {
        match self.constraint.as_ref() {
            None => return Ok(self.chain.sample(ctx, index)),
            Some(constraint) if !constraint.triggers.is_empty() => {
                if let Some(token) = self.pick_awaiting_trigger(ctx, index)? {
                    return Ok(token);
                }
            }
            Some(_) => {}
        }
        self.pick_constrained(ctx, index)
    }

    /// Free sampling while a lazy grammar waits for its trigger. When the picked token completes
    /// a trigger, the grammar starts at the trigger and is fed the text from there. If that
    /// token also carries text the grammar rejects (`></` completing `<tool_call>`), and the
    /// trigger began in earlier tokens, the grammar starts with that earlier part and this
    /// position is sampled again under it: `None` asks the caller to do so.
    fn pick_awaiting_trigger(&mut self, ctx: &LlamaContext<'_>, index: i32) -> Result<Option<LlamaToken>, EngineError> {
        let vocab = self.model.vocab();
        let mut candidates = ctx.token_data_array_ith(index);
        candidates.apply_sampler(&mut self.chain);
        let token = candidates.selected_token().ok_or_else(|| dead_end("the sampler chose no token"))?;
        let Some(constraint) = self.constraint.as_mut() else { return Ok(Some(token)) };
        if !vocab.is_eog(token) {
            let earlier = constraint.recent.len();
            constraint.recent.extend_from_slice(&vocab.token_to_piece(token, true, None));
            let found = constraint.triggers.iter().filter_map(|t| find_bytes(&constraint.recent, t.as_bytes())).min();
            match found {
                None => {
                    let longest = constraint.triggers.iter().map(String::len).max().unwrap_or(0);
                    let excess = constraint.recent.len().saturating_sub(longest.saturating_sub(1));
                    constraint.recent.drain(..excess);
                }
                Some(start) => {
                    constraint.triggers.clear();
                    if feed_text(self.model, &mut constraint.grammar, &constraint.recent[start..]).is_err() {
                        if start >= earlier {
                            return Err(dead_end(&format!(
                                "the output after the trigger breaks the grammar: {:?}",
                                String::from_utf8_lossy(&constraint.recent[start..])
                            )));
                        }
                        constraint.grammar.reset();
                        feed_text(self.model, &mut constraint.grammar, &constraint.recent[start..earlier])?;
                        return Ok(None);
                    }
                }
            }
        }
        self.chain.accept(token);
        Ok(Some(token))
    }

    /// Sampling under an active grammar: sample, check the one token, resample grammar-first
    /// only if it is rejected.
    fn pick_constrained(&mut self, ctx: &LlamaContext<'_>, index: i32) -> Result<LlamaToken, EngineError> {
        let Some(constraint) = self.constraint.as_mut() else { return Ok(self.chain.sample(ctx, index)) };
        let mut candidates = ctx.token_data_array_ith(index);
        candidates.apply_sampler(&mut self.chain);
        let mut token = candidates.selected_token().ok_or_else(|| dead_end("the sampler chose no token"))?;
        if !allows(&mut constraint.grammar, token) {
            let mut candidates = ctx.token_data_array_ith(index);
            if let Some(need) = self.shortlist_need {
                candidates = shortlist(candidates, &mut constraint.grammar, need);
            } else {
                candidates.apply_sampler(&mut constraint.grammar);
            }
            if !candidates.data.iter().any(|c| c.logit().is_finite()) {
                return Err(dead_end("the grammar allows no token here"));
            }
            candidates.apply_sampler(&mut self.chain);
            token = candidates
                .selected_token()
                .filter(|&t| candidates.data.iter().any(|c| c.id() == t && c.logit().is_finite()))
                .ok_or_else(|| dead_end("no allowed token survived sampling"))?;
        }
        // An end-of-generation token ends the request; the grammar never sees it (llama.cpp
        // aborts if one reaches an unfinished grammar).
        if !self.model.vocab().is_eog(token) {
            constraint.grammar.try_accept(token).map_err(|e| dead_end(&format!("grammar rejected a token ({e})")))?;
        }
        self.chain.accept(token);
        Ok(token)
    }
}

/// How many of the most likely tokens a grammar resample looks at first.
const SHORTLIST: usize = 256;

/// The grammar applied to the [`SHORTLIST`] most likely tokens only (a fraction of the cost of
/// the whole vocabulary), used when at least `need` of them are allowed; otherwise the grammar
/// is applied to everything.
fn shortlist(mut all: LlamaTokenDataArray, grammar: &mut LlamaSampler, need: usize) -> LlamaTokenDataArray {
    if all.data.len() > SHORTLIST {
        let mut top = all.data.clone();
        top.select_nth_unstable_by(SHORTLIST, |a, b| b.logit().total_cmp(&a.logit()));
        top.truncate(SHORTLIST);
        let mut top = LlamaTokenDataArray::new(top, false);
        top.apply_sampler(grammar);
        if top.data.iter().filter(|c| c.logit().is_finite()).count() >= need {
            return top;
        }
    }
    all.apply_sampler(grammar);
    all
}

fn dead_end(reason: &str) -> EngineError {
    EngineError::GrammarDeadEnd(reason.to_string())
}

/// Whether the grammar accepts `token` next.
fn allows(grammar: &mut LlamaSampler, token: LlamaToken) -> bool {
    let mut one = LlamaTokenDataArray::new(vec![LlamaTokenData::new(token, 0.0, 0.0)], false);
    one.apply_sampler(grammar);
    one.data[0].logit().is_finite()
}

/// Advances a grammar over text the model wrote: tokens are only the carriers of text for a
/// grammar, so any tokenization of the same bytes leads to the same state.
fn feed_text(model: &LlamaModel, grammar: &mut LlamaSampler, text: &[u8]) -> Result<(), EngineError> {
    let vocab = model.vocab();
    for token in vocab.tokenize(text, false, true) {
        grammar.try_accept(token).map_err(|_| {
            dead_end(&format!("the text at the trigger breaks the grammar: {:?}", String::from_utf8_lossy(text)))
        })?;
    }
    Ok(())
}

fn find_bytes(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}
