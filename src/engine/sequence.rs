//! The live sequence: the one context's KV cache (through the [`Decoder`], drafter included)
//! and the exact token list it holds. Every evaluation and every cut goes through here, so the
//! list never disagrees with the cache, and the guards that keep a reused prefix correct (the
//! sliding window, recurrent state that rolls back only so far) sit in one place.

use std::time::Instant;

use llama_cpp_2::context::session::SeqState;
use llama_cpp_2::context::LlamaContext;
use llama_cpp_2::token::LlamaToken;

use super::decoder::{BatchKind, Decoder, Proposal};
use super::prefix::{common_prefix_len, plan_reuse, window_covers};
use super::store::StateStore;
use super::EngineError;

/// How many more prompt tokens a stored entry must spare than the live sequence before it is
/// restored: a restore copies the whole state (a few ms for thousands of tokens of a small
/// model), which a handful of prefilled tokens would cost as well.
const RESTORE_MARGIN: usize = 32;

/// The token list the KV cache holds (prompt and generated tokens), with the cache itself.
pub(crate) struct LiveSequence<'m> {
    decoder: Decoder<'m>,
    /// Exactly what the target's cache holds, position by position.
    cached: Vec<LlamaToken>,
    /// Most tokens one decode call takes (the context's logical batch).
    n_batch: usize,
    /// The sliding window llama.cpp applies, for models with one.
    n_swa: Option<u32>,
    /// The model keeps recurrent state, which can be cut only within the last batch.
    recurrent: bool,
    /// Recurrent-state snapshots per sequence (`n_rs_seq`): the deepest rollback.
    rs_snapshots: usize,
    /// How many of the last cached positions the cache can drop now (recurrent models).
    rewindable: usize,
    /// Other prompts' states in RAM; `None` when off.
    store: Option<StateStore<SeqState>>,
    /// Shortest sequence worth saving to the store.
    min_save: usize,
}

impl<'m> LiveSequence<'m> {
    /// An empty sequence over a fresh `decoder`, whose context takes `n_batch` tokens per
    /// decode and keeps `rs_snapshots` recurrent-state snapshots (`recurrent` models).
    pub(crate) fn new(
        decoder: Decoder<'m>,
        n_batch: usize,
        n_swa: Option<u32>,
        recurrent: bool,
        rs_snapshots: usize,
    ) -> Self {
        Self {
            decoder,
            cached: Vec::new(),
            n_batch,
            n_swa,
            recurrent,
            rs_snapshots,
            rewindable: 0,
            store: None,
            min_save: usize::MAX,
        }
    }

    /// Keeps other prompts' states in up to `budget` bytes of RAM, saving a sequence of at
    /// least `min_save` tokens before another prompt displaces it. Plain decoding only (a
    /// drafter's context would not follow a restore); false where it stays off.
    pub(crate) fn keep_states(&mut self, budget: usize, min_save: usize) -> bool {
        if budget == 0 || self.decoder.speculates() {
            return false;
        }
        self.store = Some(StateStore::new(budget));
        self.min_save = min_save.max(1);
        true
    }

    /// The tokens the cache holds, in position order.
    pub(crate) fn tokens(&self) -> &[LlamaToken] {
        &self.cached
    }

    /// The target context, for its logits.
    pub(crate) fn target(&self) -> &LlamaContext<'m> {
        self.decoder.target()
    }

    /// Context size in tokens.
    pub(crate) fn n_ctx(&self) -> u32 {
        self.decoder.target().n_ctx()
    }

    /// Most tokens one decode call takes.
    pub(crate) fn n_batch(&self) -> usize {
        self.n_batch
    }

    /// Cuts the cache to the longest prefix it shares with `tokens` that it can still continue
    /// from correctly; returns how many tokens it kept. At least the last token of `tokens` is
    /// left to evaluate, so its logits are fresh. Where the sliding window already dropped
    /// what the prefix needs, or the cache cannot be cut there, it is emptied. With the state
    /// store on, a stored state that spares more of `tokens` replaces the live one, and a live
    /// sequence about to lose much of what it holds is saved first.
    pub(crate) fn reuse_prefix(&mut self, tokens: &[LlamaToken]) -> usize {
        let mut keep = self.reusable(tokens);
        if self.store.is_some() {
            keep = self.consult_store(tokens, keep);
        }
        if keep > 0 && !self.cut(keep) {
            tracing::warn!(keep, cached = self.cached.len(), "the KV cache cannot be cut there; prefilling in full");
            keep = 0;
        }
        if keep == 0 {
            self.clear();
        }
        keep
    }

    /// How much of the cache `tokens` can reuse: the shared prefix, if the sliding window
    /// still holds what it needs.
    fn reusable(&self, tokens: &[LlamaToken]) -> usize {
        let keep = plan_reuse(&self.cached, tokens);
        let pos_min = self.decoder.target().kv_cache_seq_pos_min(0);
        tracing::debug!(keep, cached = self.cached.len(), prompt = tokens.len(), pos_min, "prefix reuse");
        if keep > 0 && !window_covers(pos_min, keep, self.n_swa) {
            tracing::info!(
                keep,
                n_swa = self.n_swa,
                pos_min,
                "the sliding-window cache no longer holds what this prefix needs; prefilling in full"
            );
            return 0;
        }
        keep
    }

    /// Saves the live sequence if `keep` drops much of it, and restores the stored state that
    /// spares the most of `tokens` when it beats the live one; returns what is reusable then.
    fn consult_store(&mut self, tokens: &[LlamaToken], keep: usize) -> usize {
        let Some(store) = self.store.as_mut() else { return keep };
        // A restored state continues only from its end where the cache cannot be cut after a
        // restore (recurrent state) or the restored sliding window holds only the last
        // `n_swa` positions (measured on gemma-3 with the full SWA cache too).
        let whole_only = self.recurrent || self.n_swa.is_some();
        let candidate = store.best(tokens, whole_only).filter(|c| c.reusable >= keep + RESTORE_MARGIN);
        let entry = candidate.map(|c| store.take(c.index));
        let kept = if entry.is_some() { 0 } else { keep };
        if self.cached.len() >= self.min_save && self.cached.len() - kept >= self.min_save {
            self.save();
        }
        let Some(entry) = entry else { return keep };
        let started = Instant::now();
        self.rewindable = 0;
        if !self.decoder.restore_target(&entry.state) {
            self.cached.clear();
            return 0;
        }
        self.cached = entry.tokens;
        tracing::debug!(
            tokens = self.cached.len(),
            mib = entry.state.byte_len() >> 20,
            ms = started.elapsed().as_secs_f32() * 1000.0,
            "restored a stored KV state"
        );
        self.reusable(tokens)
    }

    /// Copies the live sequence's state into the store.
    fn save(&mut self) {
        let started = Instant::now();
        let Some(state) = self.decoder.save_target() else { return };
        let bytes = state.byte_len();
        let Some(store) = self.store.as_mut() else { return };
        let saved = store.insert(self.cached.clone(), state);
        tracing::debug!(
            saved,
            tokens = self.cached.len(),
            mib = bytes >> 20,
            ms = started.elapsed().as_secs_f32() * 1000.0,
            entries = store.len(),
            used_mib = store.used() >> 20,
            "saved the live KV state before another prompt takes the context"
        );
    }

    /// Drops every cached position from `keep` on. False, and nothing cut, where the cache
    /// cannot be cut: recurrent state (Mamba, and the recurrent layers of hybrid models) rolls
    /// back only through llama.cpp's snapshots of the last batch's tokens, and llama.cpp
    /// accepts a deeper cut than those hold and then computes from a wrong state.
    pub(crate) fn cut(&mut self, keep: usize) -> bool {
        if keep >= self.cached.len() {
            return true;
        }
        if self.recurrent && self.cached.len() - keep > self.rewindable {
            return false;
        }
        if !self.decoder.truncate(keep) {
            return false;
        }
        self.cached.truncate(keep);
        // A rollback is single-use until the next batch.
        self.rewindable = 0;
        true
    }

    /// Empties the cache, the drafter's included.
    pub(crate) fn clear(&mut self) {
        self.decoder.clear();
        self.cached.clear();
        self.rewindable = 0;
    }

    /// Evaluates tokens at the next cache positions and records them as cached; returns the
    /// batch index of the last token. On failure the cache is cleared, since llama.cpp's state
    /// is then unknown.
    pub(crate) fn decode(&mut self, tokens: &[LlamaToken], kind: BatchKind) -> Result<i32, EngineError> {
        if tokens.is_empty() {
            return Err(EngineError::Decode("nothing to evaluate".into()));
        }
        if let Err(e) = self.decoder.decode(tokens, self.cached.len(), kind) {
            self.clear();
            return Err(e);
        }
        self.cached.extend_from_slice(tokens);
        self.rewindable = (tokens.len() - 1).min(self.rs_snapshots);
        Ok(tokens.len() as i32 - 1)
    }

    /// Evaluates prompt `tokens` after the cache in `n_batch` chunks; returns the batch index
    /// holding the last token's logits. `go_on` runs before each chunk, so a long prefill can
    /// be abandoned between chunks; its error is returned as is.
    pub(crate) fn prefill<E: From<EngineError>>(
        &mut self,
        tokens: &[LlamaToken],
        mut go_on: impl FnMut() -> Result<(), E>,
    ) -> Result<i32, E> {
        let mut last_index = 0;
        let chunks = tokens.len().div_ceil(self.n_batch);
        for (i, chunk) in tokens.chunks(self.n_batch).enumerate() {
            go_on()?;
            let kind = if i + 1 == chunks { BatchKind::PromptEnd } else { BatchKind::Prompt };
            last_index = self.decode(chunk, kind)?;
        }
        Ok(last_index)
    }

    /// Makes the cache hold `tokens` by re-evaluating where they diverge from it, when that
    /// costs at most one batch and the cache can be cut there; otherwise leaves it as it is.
    /// Nothing is done when the cache already is a prefix of `tokens`: the rest is evaluated
    /// with the next prompt anyway.
    pub(crate) fn rewrite_tail(&mut self, tokens: &[LlamaToken]) {
        let common = common_prefix_len(&self.cached, tokens);
        let redo = tokens.len() - common;
        if common == self.cached.len() || redo > self.n_batch || tokens.len() >= self.n_ctx() as usize {
            return;
        }
        if !window_covers(self.decoder.target().kv_cache_seq_pos_min(0), common, self.n_swa) || !self.cut(common) {
            return;
        }
        tracing::debug!(common, redo, cached = self.cached.len(), "re-evaluating the cache's tail");
        // A strict prefix (e.g. held-back stop text) needs only the cut.
        if redo > 0 {
            if let Err(e) = self.decode(&tokens[common..], BatchKind::Prompt) {
                tracing::warn!("re-evaluating the cache's tail failed: {e}");
            }
        }
    }

    /// Whether anything drafts.
    pub(crate) fn speculates(&self) -> bool {
        self.decoder.speculates()
    }

    /// Up to `max` drafts likely to follow the cache + `id_last` (the token just picked, not
    /// evaluated yet).
    pub(crate) fn propose(&mut self, id_last: LlamaToken, max: usize) -> Proposal {
        self.decoder.propose(&self.cached, id_last, max)
    }

    /// Cached tokens the drafter would have to evaluate before drafting after them.
    pub(crate) fn backlog(&self) -> usize {
        self.decoder.backlog(&self.cached)
    }

    /// The target verified the last proposal: its first `accepted` drafts were right.
    pub(crate) fn settle(&mut self, accepted: usize) {
        self.decoder.settle(accepted);
    }

    /// A new reply starts (an MTP drafter begins it with the cache as its history).
    pub(crate) fn begin_reply(&mut self) {
        self.decoder.begin_reply();
    }

    /// Tokens the drafter evaluated to follow the cache since the last call.
    pub(crate) fn take_catch_up(&mut self) -> u32 {
        self.decoder.take_catch_up()
    }

    /// Shows an MTP drafter the prompt batch it has not seen yet, so the next request does
    /// not pay for it.
    pub(crate) fn mirror_pending(&mut self) {
        self.decoder.mirror_pending();
    }
}
