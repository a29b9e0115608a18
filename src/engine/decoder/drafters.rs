//! What drafts for the target: the model's MTP heads (their own context fed with the
//! target's hidden states), or a separate draft model caught up with the target a step at a
//! time.

use std::time::Instant;

use llama_cpp_2::context::LlamaContext;
use llama_cpp_2::llama_batch::LlamaBatch;
use llama_cpp_2::speculative::MtpSpeculative;
use llama_cpp_2::token::LlamaToken;

use super::{build_batch, Logits, Proposal};
use crate::engine::prefix::common_prefix_len;
use crate::engine::EngineError;

/// Most prompt tokens a draft model evaluates to catch up with the target in one step of a
/// reply: the catch-up with a new prompt is spread over the steps, so that a request arriving
/// meanwhile waits for one step's part of it (see [`ModelDrafter::propose`]).
pub(crate) const CATCH_UP_PER_STEP: usize = 64;

/// MTP drafting through llama.cpp's `common_speculative` (via `llama-cpp-2`).
pub(crate) struct MtpDrafter<'m> {
    pub(super) spec: MtpSpeculative<'m>,
    /// The last prompt batch (tokens, first position), shown to the MTP context only after the
    /// first token is out, so speculation costs nothing in time to first token.
    pub(super) deferred: Option<(Vec<LlamaToken>, usize)>,
    /// A draft was made and llama.cpp expects to hear how much of it was accepted.
    pub(super) accept_owed: bool,
    /// `begin` was called for the current reply.
    pub(super) begun: bool,
    /// Prompt tokens shown to the MTP context since the last [`Decoder::take_catch_up`].
    pub(super) catch_up: u32,
}

/// Drafting with a second model: its own context, caught up with the target lazily.
pub(crate) struct ModelDrafter<'m> {
    pub(super) target: LlamaContext<'m>,
    pub(super) draft: LlamaContext<'m>,
    /// Tokens the draft context's cache holds.
    pub(super) cached: Vec<LlamaToken>,
    /// Tokens evaluated to catch up with the target since the last [`Decoder::take_catch_up`].
    pub(super) catch_up: u32,
    pub(super) n_batch: usize,
    pub(super) p_min: f32,
    pub(super) n_min: usize,
}

impl<'m> MtpDrafter<'m> {
    pub(crate) fn new(spec: MtpSpeculative<'m>) -> Self {
        Self { spec, deferred: None, accept_owed: false, begun: false, catch_up: 0 }
    }

    /// Shows the deferred prompt batch to the MTP context. Must run before the target evaluates
    /// anything else: llama.cpp reads the hidden states of the target's last batch.
    pub(super) fn flush(&mut self) {
        if let Some((tokens, start)) = self.deferred.take() {
            match build_batch(&tokens, start, Logits::Last) {
                Ok(batch) => self.mirror(&batch, start),
                Err(e) => tracing::warn!("MTP: {e}"),
            }
        }
    }

    /// Feeds a batch the target just evaluated, starting at position `start`, to the MTP
    /// context (which ignores its logits flags).
    pub(super) fn mirror(&mut self, batch: &LlamaBatch<'_>, start: usize) {
        // Tentative entries of the last draft sit at these positions; `process` writes them anew.
        let _ = self.spec.draft_context_mut().kv_cache_seq_rm(0, Some(start as u32), None);
        if let Err(e) = self.spec.process(batch) {
            tracing::warn!("MTP context update failed ({e}); drafts may be rejected more often");
        }
    }

    pub(super) fn propose(&mut self, history: &[LlamaToken], id_last: LlamaToken, max: usize) -> Proposal {
        let started = Instant::now();
        self.flush();
        let catch_up_time = started.elapsed();
        self.settle(0);
        if !self.begun {
            self.begun = true;
            if let Err(e) = self.spec.begin(history) {
                tracing::warn!("MTP begin failed: {e}");
            }
        }
        let drafts = match self.spec.draft(history.len() as i32, id_last, history) {
            Ok(mut drafts) => {
                self.accept_owed = !drafts.is_empty();
                drafts.truncate(max);
                drafts
            }
            Err(e) => {
                tracing::warn!("MTP draft failed: {e}");
                Vec::new()
            }
        };
        Proposal { drafts, catch_up_time }
    }

    /// Tells llama.cpp how many drafted tokens were accepted, if it is waiting for that.
    pub(super) fn settle(&mut self, accepted: usize) {
        if std::mem::take(&mut self.accept_owed) {
            if let Err(e) = self.spec.accept(accepted.min(usize::from(u16::MAX)) as u16) {
                tracing::warn!("MTP accept failed: {e}");
            }
        }
    }
}

impl<'m> ModelDrafter<'m> {
    pub(crate) fn new(
        target: LlamaContext<'m>,
        draft: LlamaContext<'m>,
        n_batch: usize,
        p_min: f32,
        n_min: usize,
    ) -> Self {
        Self { target, draft, cached: Vec::new(), catch_up: 0, n_batch, p_min, n_min }
    }

    /// Brings the draft context closer to `history` (at most [`CATCH_UP_PER_STEP`] tokens),
    /// then, once it holds all of it, drafts greedily after `id_last` until `max` tokens or a
    /// token below `p_min`. The catch-up happens here, after the target has produced its first
    /// token, never before it, and a step at a time: a request that arrives meanwhile waits for
    /// one step's part of it, not for all of it.
    pub(super) fn propose(&mut self, history: &[LlamaToken], id_last: LlamaToken, max: usize) -> Proposal {
        let started = Instant::now();
        let mut drafts = Vec::new();
        // Evaluating id_last is drafting; what comes before it is catching up.
        match self.follow(history, CATCH_UP_PER_STEP) {
            Ok(true) => {}
            Ok(false) => return Proposal { drafts, catch_up_time: started.elapsed() },
            Err(e) => {
                tracing::warn!("draft model: {e}");
                return Proposal { drafts, catch_up_time: started.elapsed() };
            }
        }
        let catch_up_time = started.elapsed();
        if let Err(e) = self.evaluate(&[id_last]) {
            tracing::warn!("draft model: {e}");
            return Proposal { drafts, catch_up_time };
        }
        loop {
            let (token, probability) = most_likely(self.draft.get_logits_ith(-1));
            if probability < self.p_min {
                break;
            }
            drafts.push(token);
            if drafts.len() >= max {
                break;
            }
            if let Err(e) = self.evaluate(&[token]) {
                tracing::warn!("draft model: {e}");
                break;
            }
        }
        if drafts.len() < self.n_min {
            drafts.clear();
        }
        Proposal { drafts, catch_up_time }
    }

    /// Brings the draft context closer to holding exactly `history`: cut where they differ,
    /// evaluate up to `most` of the rest. Whether it holds all of `history` now.
    pub(super) fn follow(&mut self, history: &[LlamaToken], most: usize) -> Result<bool, EngineError> {
        let mut keep = common_prefix_len(&self.cached, history);
        if keep < self.cached.len() && self.draft.kv_cache_seq_rm(0, Some(keep as u32), None).is_err() {
            keep = 0;
        }
        if keep == 0 {
            self.draft.clear_kv_cache();
        }
        self.cached.truncate(keep);
        let end = keep.saturating_add(most).min(history.len());
        self.catch_up += (end - keep) as u32;
        for chunk in history[keep..end].chunks(self.n_batch) {
            // Tests count the catch-up's batches here.
            fail::fail_point!("engine::drafter_catch_up");
            self.evaluate(chunk)?;
        }
        Ok(end == history.len())
    }

    /// Tokens of `history` the draft context does not hold yet.
    pub(super) fn backlog(&self, history: &[LlamaToken]) -> usize {
        history.len() - common_prefix_len(&self.cached, history)
    }

    fn evaluate(&mut self, tokens: &[LlamaToken]) -> Result<(), EngineError> {
        let mut batch = build_batch(tokens, self.cached.len(), Logits::Last)?;
        if let Err(e) = self.draft.decode(&mut batch) {
            self.draft.clear_kv_cache();
            self.cached.clear();
            return Err(EngineError::Decode(e.to_string()));
        }
        self.cached.extend_from_slice(tokens);
        Ok(())
    }
}

/// The most likely token and its probability.
fn most_likely(logits: &[f32]) -> (LlamaToken, f32) {
    let (best, &max) = logits.iter().enumerate().max_by(|a, b| a.1.total_cmp(b.1)).unwrap_or((0, &0.0));
    let total: f32 = logits.iter().map(|&l| (l - max).exp()).sum();
    (LlamaToken(best as i32), 1.0 / total.max(1.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn most_likely_token_and_probability() {
        let (token, p) = most_likely(&[0.0, 3.0, 0.0]);
        assert_eq!(token, LlamaToken(1));
        let expected = 3f32.exp() / (3f32.exp() + 2.0);
        assert!((p - expected).abs() < 1e-6);
        assert!((most_likely(&[1.0, 1.0]).1 - 0.5).abs() < 1e-6);
    }
}
