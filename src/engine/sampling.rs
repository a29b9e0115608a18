//! Per-request sampling settings and the llama.cpp sampler chain built from them.

use llama_cpp_2::context::LlamaContext;
use llama_cpp_2::model::LlamaModel;
use llama_cpp_2::sampling::LlamaSampler;
use llama_cpp_2::token::data::LlamaTokenData;
use llama_cpp_2::token::data_array::LlamaTokenDataArray;
use llama_cpp_2::token::logit_bias::LlamaLogitBias;
use llama_cpp_2::token::LlamaToken;

use super::{EngineError, Grammar};
use crate::chat::tools::allow_reasoning;
use crate::chat::ReasoningSplitter;

/// Where the logits a token is picked from are.
#[derive(Clone, Copy)]
pub(crate) enum Logits<'a, 'm> {
    /// The context's output at this batch index.
    Context(&'a LlamaContext<'m>, i32),
    /// A copy taken when they were computed (a parked generation's), one per vocabulary token.
    Saved(&'a [f32]),
}

impl<'a> Logits<'a, '_> {
    /// One value per vocabulary token.
    pub(crate) fn values(self) -> &'a [f32] {
        match self {
            Self::Context(ctx, index) => ctx.get_logits_ith(index),
            Self::Saved(logits) => logits,
        }
    }

    /// The candidates a sampler works on: every token with its logit.
    fn candidates(self) -> LlamaTokenDataArray {
        match self {
            Self::Context(ctx, index) => ctx.token_data_array_ith(index),
            Self::Saved(logits) => LlamaTokenDataArray::from_iter(
                logits.iter().enumerate().map(|(id, &logit)| LlamaTokenData::new(LlamaToken(id as i32), logit, 0.0)),
                false,
            ),
        }
    }
}

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
    /// Follows a thinking model's reasoning: a lazy grammar's triggers are watched in the
    /// answer only.
    reasoning: Option<ReasoningSplitter>,
}

/// A grammar and whether it applies yet.
struct Constraint {
    grammar: LlamaSampler,
    /// The triggers still awaited; `None` once the grammar applies (from the first token when
    /// it has no triggers).
    awaiting: Option<TriggerWatch>,
}

/// Watches the free output of a lazy grammar for the texts that switch it on.
#[derive(Debug)]
struct TriggerWatch {
    /// Texts that switch the grammar on wherever they appear.
    triggers: Vec<String>,
    /// Texts that switch it on only where they open the output after whitespace; emptied once
    /// other text opened it.
    anchored: Vec<String>,
    /// The end of the output so far, long enough to find a trigger that spans tokens.
    recent: Vec<u8>,
    /// How many output bytes came before `recent`.
    recent_start: usize,
    /// The whole output so far, while an anchored trigger may still open it.
    opening: Vec<u8>,
}

/// A trigger that appeared.
#[derive(Debug, PartialEq, Eq)]
struct Fired {
    /// The output from the trigger's first byte on: what the grammar must accept.
    text: Vec<u8>,
    /// How many of those bytes earlier tokens wrote (the rest came with the latest token).
    earlier: usize,
}

impl TriggerWatch {
    /// A watch for these triggers; `None` when there are none (the grammar applies at once).
    fn new(grammar: &Grammar) -> Option<Self> {
        let texts = |list: &[String]| list.iter().filter(|t| !t.is_empty()).cloned().collect::<Vec<_>>();
        let watch = Self {
            triggers: texts(&grammar.triggers),
            anchored: texts(&grammar.anchored_triggers),
            recent: Vec::new(),
            recent_start: 0,
            opening: Vec::new(),
        };
        (!watch.triggers.is_empty() || !watch.anchored.is_empty()).then_some(watch)
    }

    /// Follows the next piece of output; returns the earliest trigger it completes.
    fn push(&mut self, piece: &[u8]) -> Option<Fired> {
        let piece_start = self.recent_start + self.recent.len();
        self.recent.extend_from_slice(piece);
        let mut found = self
            .triggers
            .iter()
            .filter_map(|t| find_bytes(&self.recent, t.as_bytes()))
            .min()
            .map(|at| (self.recent_start + at, self.recent[at..].to_vec()));
        if !self.anchored.is_empty() {
            self.opening.extend_from_slice(piece);
            let lead = self.opening.iter().take_while(|b| b.is_ascii_whitespace()).count();
            let rest = &self.opening[lead..];
            if self.anchored.iter().any(|t| rest.starts_with(t.as_bytes())) {
                if found.as_ref().is_none_or(|&(at, _)| lead < at) {
                    found = Some((lead, rest.to_vec()));
                }
            } else if !self.anchored.iter().any(|t| t.as_bytes().starts_with(rest)) {
                // Other text opened the output: an anchored trigger can no longer fire.
                self.anchored.clear();
                self.opening = Vec::new();
            }
        }
        if let Some((start, text)) = found {
            return Some(Fired { text, earlier: piece_start.saturating_sub(start) });
        }
        let longest = self.triggers.iter().map(String::len).max().unwrap_or(0);
        let excess = self.recent.len().saturating_sub(longest.saturating_sub(1));
        self.recent.drain(..excess);
        self.recent_start += excess;
        None
    }
}

impl<'m> TokenPicker<'m> {
    /// A picker for one request; `reasoning` follows the reasoning of a model that thinks (an
    /// eager grammar then lets the reasoning come first, see [`allow_reasoning`]).
    ///
    /// # Errors
    /// [`EngineError::InvalidGrammar`] if llama.cpp cannot parse the grammar.
    pub(crate) fn new(
        model: &'m LlamaModel,
        params: &SamplingParams,
        grammar: Option<&Grammar>,
        reasoning: Option<ReasoningSplitter>,
    ) -> Result<Self, EngineError> {
        let reasoned = match (grammar, &reasoning) {
            (Some(grammar), Some(splitter)) => {
                Some(allow_reasoning(grammar, splitter.format(), splitter.in_reasoning()))
            }
            (grammar, _) => grammar.cloned(),
        };
        let constraint = match reasoned.as_ref() {
            None => None,
            Some(grammar) => Some(Constraint {
                grammar: LlamaSampler::grammar(model, &grammar.gbnf, &grammar.root)
                    .map_err(|e| EngineError::InvalidGrammar(format!("llama.cpp cannot parse the grammar ({e})")))?,
                awaiting: TriggerWatch::new(grammar),
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
        Ok(Self { model, chain: build_sampler(params, model.n_vocab()), shortlist_need, constraint, reasoning })
    }

    /// Whether the reply is inside the model's reasoning now.
    pub(crate) fn in_reasoning(&self) -> bool {
        self.reasoning.as_ref().is_some_and(ReasoningSplitter::in_reasoning)
    }

    /// Makes `token` the next one without sampling (text the engine writes itself: the end
    /// of the reasoning when its budget is spent), as if it had been picked.
    ///
    /// # Errors
    /// [`EngineError::GrammarDeadEnd`] if an active grammar does not allow it.
    pub(crate) fn force(&mut self, token: LlamaToken) -> Result<(), EngineError> {
        if let Some(constraint) = self.constraint.as_mut().filter(|c| c.awaiting.is_none()) {
            constraint.grammar.try_accept(token).map_err(|e| dead_end(&format!("grammar rejected a token ({e})")))?;
        }
        self.follow_reasoning(token);
        self.chain.accept(token);
        Ok(())
    }

    /// Feeds a picked token's text to the reasoning splitter.
    fn follow_reasoning(&mut self, token: LlamaToken) {
        if let Some(splitter) = self.reasoning.as_mut() {
            if !self.model.vocab().is_eog(token) {
                splitter.push(&String::from_utf8_lossy(&self.model.vocab().token_to_piece(token, true, None)));
            }
        }
    }

    /// Whether the constrained output is complete: the active grammar would take the end of
    /// generation here (false without one, or while a lazy grammar waits for its trigger).
    pub(crate) fn answer_may_end(&mut self) -> bool {
        let end = self.model.vocab().eos();
        self.constraint.as_mut().filter(|c| c.awaiting.is_none()).is_some_and(|c| allows(&mut c.grammar, end))
    }

    /// Whether a grammar constrains the output now (a lazy grammar once its trigger appeared):
    /// stop strings do not apply to constrained output.
    pub(crate) fn constraining(&self) -> bool {
        self.constraint.as_ref().is_some_and(|c| c.awaiting.is_none())
    }

    /// Picks the token that follows `logits` and records it as accepted. Saved logits give the
    /// same token and leave the sampler in the same state as the context's did.
    ///
    /// # Errors
    /// [`EngineError::GrammarDeadEnd`] if the grammar allows no token at all.
    pub(crate) fn pick(&mut self, logits: Logits<'_, '_>) -> Result<LlamaToken, EngineError> {
        let token = match self.constraint.as_ref() {
            None => self.sample(logits)?,
            Some(constraint) if constraint.awaiting.is_some() => match self.pick_awaiting_trigger(logits)? {
                Some(token) => return Ok(token),
                None => self.pick_constrained(logits)?,
            },
            Some(_) => self.pick_constrained(logits)?,
        };
        self.follow_reasoning(token);
        Ok(token)
    }

    /// Free sampling while a lazy grammar waits for its trigger. When the picked token completes
    /// a trigger, the grammar starts at the trigger (all other triggers are dropped) and is fed
    /// the text from there. If that token also carries text the grammar rejects (`></`
    /// completing `<tool_call>`, ` {\n` opening the reply), the grammar starts with the
    /// trigger's part in earlier tokens (possibly none) and this position is sampled again
    /// under it: `None` asks the caller to do so. The rejected token's text before the trigger
    /// is then not written. Only the answer is watched, not a thinking model's reasoning.
    fn pick_awaiting_trigger(&mut self, logits: Logits<'_, '_>) -> Result<Option<LlamaToken>, EngineError> {
        let vocab = self.model.vocab();
        let mut candidates = logits.candidates();
        candidates.apply_sampler(&mut self.chain);
        let token = candidates.selected_token().ok_or_else(|| dead_end("the sampler chose no token"))?;
        let Some(constraint) = self.constraint.as_mut() else { return Ok(Some(token)) };
        let Some(watch) = constraint.awaiting.as_mut() else { return Ok(Some(token)) };
        let mut reasoning = self.reasoning.clone();
        if !vocab.is_eog(token) {
            let piece = vocab.token_to_piece(token, true, None);
            let answer = match reasoning.as_mut() {
                Some(splitter) if !splitter.answering() => {
                    splitter.push(&String::from_utf8_lossy(&piece)).content.into_bytes()
                }
                _ => piece,
            };
            if let Some(fired) = watch.push(&answer) {
                constraint.awaiting = None;
                if feed_text(self.model, &mut constraint.grammar, &fired.text).is_err() {
                    constraint.grammar.reset();
                    feed_text(self.model, &mut constraint.grammar, &fired.text[..fired.earlier])?;
                    return Ok(None);
                }
            }
        }
        self.reasoning = reasoning;
        self.chain.accept(token);
        Ok(Some(token))
    }

    /// The chain's pick, accepted: llama.cpp's own sampling from the context (it reuses its
    /// buffer), the same steps over saved logits.
    fn sample(&mut self, logits: Logits<'_, '_>) -> Result<LlamaToken, EngineError> {
        if let Logits::Context(ctx, index) = logits {
            return Ok(self.chain.sample(ctx, index));
        }
        let mut candidates = logits.candidates();
        candidates.apply_sampler(&mut self.chain);
        let token = candidates.selected_token().ok_or_else(|| dead_end("the sampler chose no token"))?;
        self.chain.accept(token);
        Ok(token)
    }

    /// Sampling under an active grammar: sample, check the one token, resample grammar-first
    /// only if it is rejected.
    fn pick_constrained(&mut self, logits: Logits<'_, '_>) -> Result<LlamaToken, EngineError> {
        let Some(constraint) = self.constraint.as_mut() else { return self.sample(logits) };
        let mut candidates = logits.candidates();
        candidates.apply_sampler(&mut self.chain);
        let mut token = candidates.selected_token().ok_or_else(|| dead_end("the sampler chose no token"))?;
        if !allows(&mut constraint.grammar, token) {
            let mut candidates = logits.candidates();
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

#[cfg(test)]
mod tests {
    use super::*;

    fn watch(triggers: &[&str], anchored: &[&str]) -> TriggerWatch {
        let list = |texts: &[&str]| texts.iter().map(|t| (*t).to_string()).collect();
        TriggerWatch::new(&Grammar {
            gbnf: String::new(),
            root: "root".into(),
            triggers: list(triggers),
            anchored_triggers: list(anchored),
        })
        .expect("a lazy grammar")
    }

    fn fired(text: &str, earlier: usize) -> Option<Fired> {
        Some(Fired { text: text.as_bytes().to_vec(), earlier })
    }

    #[test]
    fn a_grammar_without_triggers_applies_at_once() {
        let eager = Grammar {
            gbnf: String::new(),
            root: "root".into(),
            triggers: vec![String::new()],
            anchored_triggers: Vec::new(),
        };
        assert!(TriggerWatch::new(&eager).is_none());
    }

    #[test]
    fn a_trigger_fires_anywhere_even_across_tokens() {
        let mut w = watch(&["<tool_call>"], &[]);
        assert_eq!(w.push(b"Sure, "), None);
        assert_eq!(w.push(b"let me <tool"), None);
        assert_eq!(w.push(b"_call>\n{"), fired("<tool_call>\n{", 5));
    }

    #[test]
    fn an_anchored_trigger_fires_only_where_it_opens_the_output() {
        let mut w = watch(&[], &["{"]);
        assert_eq!(w.push(b" \n"), None);
        assert_eq!(w.push(b" {\""), fired("{\"", 0), "after whitespace, without it");
        let mut w = watch(&[], &["{\"name\""]);
        assert_eq!(w.push(b"{\"na"), None);
        assert_eq!(w.push(b"me\": \"f"), fired("{\"name\": \"f", 4));
        let mut w = watch(&["<|python_tag|>"], &["{\"name\""]);
        assert_eq!(w.push(b"Here is one: "), None);
        assert!(w.anchored.is_empty(), "text opened the output: never again");
        assert_eq!(w.push(b"{\"name\": \"f\"}"), None, "a call inside text is text");
        assert_eq!(w.push(b" <|python_tag|>"), fired("<|python_tag|>", 0), "other triggers still fire");
        let mut w = watch(&[], &["{\"name\""]);
        assert_eq!(w.push(b"{\"city\""), None, "another object is no call");
        assert!(w.anchored.is_empty());
    }

    #[test]
    fn the_earliest_trigger_wins() {
        let mut w = watch(&["<tool_call>"], &["{"]);
        assert_eq!(w.push(b"{<tool_call>"), fired("{<tool_call>", 0));
        let mut w = watch(&["<tool_call>"], &["{"]);
        assert_eq!(w.push(b"<tool_call>{"), fired("<tool_call>{", 0));
    }
}
