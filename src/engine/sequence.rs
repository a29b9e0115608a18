//! The live sequence: the one context's KV cache (through the [`Decoder`], drafter included)
//! and the exact token list it holds. Every evaluation and every cut goes through here, so the
//! list never disagrees with the cache, and the guards that keep a reused prefix correct (the
//! sliding window, recurrent state that rolls back only so far) sit in one place.

use std::time::{Duration, Instant};

use llama_cpp_2::context::LlamaContext;
use llama_cpp_2::token::LlamaToken;

use super::decoder::{BatchKind, Decoder, Proposal, SavedState};
use super::prefix::{common_prefix_len, plan_reuse, window_covers};
use super::store::{Restored, StateBytes, StateStore};
use super::{CacheEntryKind, CacheEntryStatus, CacheMiss, CacheSource, CacheStatus, EngineError};

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
    store: Option<StateStore<SavedState>>,
    /// Shortest sequence worth saving to the store.
    min_save: usize,
    /// Checkpoints are taken (models whose cache cannot be cut everywhere), every this many
    /// tokens of a long prefill (0: only at each prompt's end).
    checkpoint_every: Option<usize>,
    /// The cache holds a prompt just prefilled, to save as a checkpoint before it changes
    /// (after the first token is out, so it costs nothing in time to first token).
    checkpoint_pending: bool,
}

/// What reusing the cache did for one prompt.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Reuse {
    /// Prompt tokens the cache holds now; the rest is prefilled.
    pub(crate) keep: usize,
    /// Where they came from.
    pub(crate) source: CacheSource,
    /// The first prompt position that differs from what the source (or, with no source, the
    /// live sequence) held; `None` where the prompt continues all of it.
    pub(crate) diverged_at: Option<usize>,
    /// What kept the cache from serving the prefix it shares with the prompt, if anything.
    pub(crate) obstacle: Option<CacheMiss>,
    /// Time spent saving the live sequence before the prompt took it over.
    pub(crate) save: Option<Duration>,
    /// Time spent restoring a stored state.
    pub(crate) restore: Option<Duration>,
}

/// Where `prompt` departs from `held`; `None` where it continues all of it.
fn divergence(held: &[LlamaToken], prompt: &[LlamaToken]) -> Option<usize> {
    let common = common_prefix_len(held, prompt);
    (common < held.len()).then_some(common)
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
            checkpoint_every: None,
            checkpoint_pending: false,
        }
    }

    /// Keeps other prompts' states in up to `budget` bytes of RAM (nothing when 0), saving a
    /// sequence of at least `min_save` tokens before another prompt displaces it.
    /// `checkpoint_every`: also save each prompt of at least `min_save` tokens at the end of
    /// its prefill, and every this many tokens of a long one (0: only at the end).
    pub(crate) fn keep_states(&mut self, budget: usize, min_save: usize, checkpoint_every: Option<usize>) {
        if budget == 0 {
            return;
        }
        // A restored state continues only from its end where the cache cannot be cut after a
        // restore (recurrent state) or the restored sliding window holds only the last
        // `n_swa` positions (measured on gemma-3 with the full SWA cache too).
        let whole_only = self.recurrent || self.n_swa.is_some();
        self.store = Some(StateStore::new(budget, whole_only));
        self.min_save = min_save.max(1);
        self.checkpoint_every = checkpoint_every;
    }

    /// What the cache holds now.
    pub(crate) fn status(&self) -> CacheStatus {
        let mut status = CacheStatus {
            live_tokens: self.cached.len() as u32,
            checkpoint_every: self.checkpoint_every.map(|every| every as u32),
            ..CacheStatus::default()
        };
        if let Some(store) = &self.store {
            status.budget_bytes = store.budget() as u64;
            status.used_bytes = store.used() as u64;
            status.entries = store
                .entries()
                .map(|entry| CacheEntryStatus {
                    kind: entry.kind,
                    tokens: entry.tokens.len() as u32,
                    bytes: entry.state.byte_len() as u64,
                    last_used: entry.used_at,
                })
                .collect();
            status.entries.sort_by_key(|entry| std::cmp::Reverse(entry.last_used));
        }
        status
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
    /// from correctly. At least the last token of `tokens` is left to evaluate, so its logits
    /// are fresh. Where the sliding window already dropped what the prefix needs, or the cache
    /// cannot be cut there, it is emptied. With the state store on, a stored state that spares
    /// more of `tokens` replaces the live one, and a live sequence about to lose much of what
    /// it holds is saved first.
    pub(crate) fn reuse_prefix(&mut self, tokens: &[LlamaToken]) -> Reuse {
        self.save_pending_checkpoint();
        // Nothing live: unless the store serves the prompt (or had an entry that would have).
        let cold = self.cached.is_empty();
        let (keep, obstacle) = self.reusable(tokens);
        let mut reuse = Reuse {
            keep,
            source: if keep > 0 { CacheSource::Live } else { CacheSource::None },
            diverged_at: divergence(&self.cached, tokens),
            obstacle: if cold { Some(CacheMiss::Cold) } else { obstacle },
            save: None,
            restore: None,
        };
        if self.store.is_some() {
            self.consult_store(tokens, &mut reuse);
        }
        if reuse.keep > 0 && !self.cut(reuse.keep) {
            tracing::warn!(
                keep = reuse.keep,
                cached = self.cached.len(),
                "the KV cache cannot be cut there; prefilling in full"
            );
            reuse.keep = 0;
            reuse.source = CacheSource::None;
            reuse.obstacle = Some(CacheMiss::CannotRewind);
        }
        if reuse.keep == 0 {
            self.clear();
        }
        reuse
    }

    /// How much of the live cache `tokens` can reuse, and what stopped it from reusing all
    /// they share: the sliding window no longer holds what the prefix needs, or recurrent
    /// state cannot be rolled back that far.
    fn reusable(&self, tokens: &[LlamaToken]) -> (usize, Option<CacheMiss>) {
        let keep = plan_reuse(&self.cached, tokens);
        let pos_min = self.decoder.target().kv_cache_seq_pos_min(0);
        tracing::debug!(keep, cached = self.cached.len(), prompt = tokens.len(), pos_min, "prefix reuse");
        if keep > 0 && !window_covers(pos_min, keep, self.n_swa) {
            tracing::info!(
                keep,
                n_swa = self.n_swa,
                pos_min,
                "the sliding-window cache no longer holds what this prefix needs"
            );
            return (0, Some(CacheMiss::SwaWindow));
        }
        if keep > 0 && !self.can_cut(keep) {
            tracing::info!(keep, cached = self.cached.len(), "recurrent state cannot be rolled back that far");
            return (0, Some(CacheMiss::CannotRewind));
        }
        (keep, None)
    }

    /// Whether the cache can drop every position from `keep` on.
    fn can_cut(&self, keep: usize) -> bool {
        !self.recurrent || self.cached.len().saturating_sub(keep) <= self.rewindable
    }

    /// Restores the stored state that spares the most of `tokens` when it beats the live one,
    /// saving the live sequence first if that loses much of what it holds; `reuse` says what
    /// is reusable then.
    fn consult_store(&mut self, tokens: &[LlamaToken], reuse: &mut Reuse) {
        let Some(store) = self.store.as_ref() else { return };
        let worth = reuse.keep + RESTORE_MARGIN;
        let candidate = store.best(tokens).filter(|c| c.reusable >= worth);
        if candidate.is_none() {
            if store.evicted_reusable(tokens) >= worth {
                reuse.obstacle = Some(CacheMiss::Evicted);
            } else if store.longest_shared(tokens) >= worth {
                // An entry shares more, but the prompt leaves it early and a restored state
                // cannot be cut there.
                reuse.obstacle = Some(if self.recurrent { CacheMiss::CannotRewind } else { CacheMiss::SwaWindow });
            }
        }
        let kept = if candidate.is_some() { 0 } else { reuse.keep };
        let displaced = (self.cached.len() >= self.min_save && self.cached.len() - kept >= self.min_save)
            .then(|| {
                let started = Instant::now();
                let state = self.decoder.save();
                reuse.save = Some(started.elapsed());
                state.map(|state| (self.cached.clone(), state))
            })
            .flatten();
        if let Some(candidate) = candidate {
            self.restore(tokens, candidate.index, reuse);
        }
        if let Some((held, state)) = displaced {
            self.insert(held, state, CacheEntryKind::Snapshot);
        }
    }

    /// Makes the stored entry at `index` the live sequence.
    fn restore(&mut self, tokens: &[LlamaToken], index: usize, reuse: &mut Reuse) {
        let Some(store) = self.store.as_mut() else { return };
        let started = Instant::now();
        self.rewindable = 0;
        let restored = store.restore(index);
        let entry = restored.entry();
        let (kind, bytes) = (entry.kind, entry.state.byte_len());
        if !self.decoder.restore(&entry.state) {
            self.cached.clear();
            *reuse = Reuse { keep: 0, source: CacheSource::None, ..*reuse };
            return;
        }
        self.cached = match restored {
            Restored::Taken(entry) => entry.tokens,
            Restored::Kept(entry) => entry.tokens.clone(),
        };
        let elapsed = started.elapsed();
        tracing::debug!(
            tokens = self.cached.len(),
            mib = bytes >> 20,
            ms = elapsed.as_secs_f32() * 1000.0,
            ?kind,
            "restored a stored KV state"
        );
        reuse.keep = plan_reuse(&self.cached, tokens);
        reuse.source = match kind {
            CacheEntryKind::Snapshot => CacheSource::Ram,
            CacheEntryKind::Checkpoint => CacheSource::Checkpoint,
        };
        reuse.diverged_at = divergence(&self.cached, tokens);
        reuse.restore = Some(elapsed);
    }

    /// Stores a saved state of `tokens`.
    fn insert(&mut self, tokens: Vec<LlamaToken>, state: SavedState, kind: CacheEntryKind) {
        let Some(store) = self.store.as_mut() else { return };
        let (count, bytes) = (tokens.len(), state.byte_len());
        let saved = store.insert(tokens, state, kind);
        tracing::debug!(
            saved,
            ?kind,
            tokens = count,
            mib = bytes >> 20,
            entries = store.len(),
            used_mib = store.used() >> 20,
            "saved a KV state"
        );
    }

    /// Saves what the cache holds now as a checkpoint.
    fn save_checkpoint(&mut self) {
        let started = Instant::now();
        if let Some(state) = self.decoder.save() {
            tracing::debug!(ms = started.elapsed().as_secs_f32() * 1000.0, "checkpoint taken");
            self.insert(self.cached.clone(), state, CacheEntryKind::Checkpoint);
        }
    }

    /// Takes the checkpoint of the prompt just prefilled, if one is due (before the cache
    /// changes; the engine calls it once a reply is done too).
    pub(crate) fn save_pending_checkpoint(&mut self) {
        if std::mem::take(&mut self.checkpoint_pending) {
            self.save_checkpoint();
        }
    }

    /// Drops every cached position from `keep` on. False, and nothing cut, where the cache
    /// cannot be cut: recurrent state (Mamba, and the recurrent layers of hybrid models) rolls
    /// back only through llama.cpp's snapshots of the last batch's tokens, and llama.cpp
    /// accepts a deeper cut than those hold and then computes from a wrong state.
    pub(crate) fn cut(&mut self, keep: usize) -> bool {
        if keep >= self.cached.len() {
            return true;
        }
        if !self.can_cut(keep) {
            return false;
        }
        self.save_pending_checkpoint();
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
        self.checkpoint_pending = false;
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
        self.save_pending_checkpoint();
        if let Err(e) = self.decoder.decode(tokens, self.cached.len(), kind) {
            self.clear();
            return Err(e);
        }
        self.cached.extend_from_slice(tokens);
        self.rewindable = (tokens.len() - 1).min(self.rs_snapshots);
        Ok(tokens.len() as i32 - 1)
    }

    /// Evaluates prompt `tokens` after the cache in chunks of `chunk` tokens (at most
    /// `n_batch`); returns the batch index holding the last token's logits. `go_on` runs before
    /// each chunk, so a long prefill can be abandoned between chunks (what was evaluated stays
    /// cached); its error is returned as is.
    pub(crate) fn prefill<E: From<EngineError>>(
        &mut self,
        tokens: &[LlamaToken],
        chunk: usize,
        mut go_on: impl FnMut() -> Result<(), E>,
    ) -> Result<i32, E> {
        let chunk = chunk.clamp(1, self.n_batch);
        let mut last_index = 0;
        let chunks = tokens.len().div_ceil(chunk);
        for (i, chunk) in tokens.chunks(chunk).enumerate() {
            go_on()?;
            let last = i + 1 == chunks;
            let before = self.cached.len();
            last_index = self.decode(chunk, if last { BatchKind::PromptEnd } else { BatchKind::Prompt })?;
            let Some(every) = self.checkpoint_every else { continue };
            let worth = self.cached.len() >= self.min_save;
            if last {
                self.checkpoint_pending = worth;
            } else if worth && every > 0 && before / every != self.cached.len() / every {
                self.save_checkpoint();
            }
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

    /// Evaluates the rest of `tokens` where the cache holds a prefix of them, when that is at
    /// most one batch and fits the context: what the next prompt will start with anyway.
    pub(crate) fn extend_to(&mut self, tokens: &[LlamaToken]) {
        let held = self.cached.len();
        if held == 0
            || held >= tokens.len()
            || tokens.len() - held > self.n_batch
            || tokens.len() >= self.n_ctx() as usize
        {
            return;
        }
        if !tokens.starts_with(&self.cached) {
            return;
        }
        tracing::debug!(tokens = tokens.len() - held, "evaluating the next turn's opening");
        if let Err(e) = self.decode(&tokens[held..], BatchKind::Prompt) {
            tracing::warn!("evaluating the next turn's opening failed: {e}");
            return;
        }
        self.decoder.follow(&self.cached);
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
