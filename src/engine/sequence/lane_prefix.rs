//! Where a lane's prefix comes from: the cells a live sequence holds (sequence 0's, another
//! lane's or a kept conversation's, shared by tagging or taken over), or a state from the RAM
//! store restored into the lane when that serves enough more.

use std::time::Instant;

use llama_cpp_2::token::LlamaToken;

use super::lanes::HOME;
use super::LiveSequence;
use crate::engine::policy;
use crate::engine::prefix::{common_prefix_len, window_covers};
use crate::engine::schedule::SeqId;
use crate::engine::store::Restored;
use crate::engine::{CacheEntryKind, CacheReport, CacheSource};

impl LiveSequence<'_> {
    /// Makes lane `seq` hold the longest prefix of `prompt` that a live sequence holds
    /// (`source`: its cells shared, or, when `source` is the kept sequence `seq`, continued
    /// where they are) or, with `may_restore` and by [`policy::restore_for_lane`]'s margin, a
    /// stored state (restored into the lane); returns the prefix's length, how much of it
    /// sequence 0's cells hold, and the cache report.
    pub(super) fn lane_prefix(
        &mut self,
        seq: SeqId,
        prompt: &[LlamaToken],
        source: (SeqId, usize),
        may_restore: bool,
    ) -> (usize, usize, CacheReport) {
        let report = |source: CacheSource, keep: usize| CacheReport {
            source: if keep > 0 { source } else { CacheSource::None },
            reused: keep as u32,
            prefilled: (prompt.len() - keep) as u32,
            ..CacheReport::default()
        };
        if source.0 == seq {
            return match self.take_kept(seq, source.1) {
                Some(shared) => (source.1, shared, report(CacheSource::Kept, source.1)),
                None => (0, 0, report(CacheSource::None, 0)),
            };
        }
        if may_restore {
            if let Some((keep, mut cache)) = self.restore_into_lane(seq, prompt, source.1) {
                cache.prefilled = (prompt.len() - keep) as u32;
                return (keep, 0, cache);
            }
        }
        let (from, keep) = source;
        let keep = if keep > 0 && self.decoder.share_prefix(from, seq, keep) { keep } else { 0 };
        let shared = if from == HOME { keep } else { 0 };
        (keep, shared, report(CacheSource::Live, keep))
    }

    /// The live sequence that holds the longest prefix of `prompt` a lane can share, and its
    /// length (at most all but the last token): sequence 0's, a lane's or a kept one's (which
    /// a lane then takes over), where the sequence's sliding window still covers it (a
    /// sliding-window model's sequence that moved on no longer holds the window before an
    /// earlier position).
    pub(crate) fn longest_live_prefix(&self, prompt: &[LlamaToken]) -> (SeqId, usize) {
        let most = prompt.len().saturating_sub(1);
        let target = self.decoder.target();
        let covered = |seq: SeqId, held: usize| window_covers(target.kv_cache_seq_pos_min(seq), held, self.shape.n_swa);
        // What a live sequence holding `tokens` gives (a recurrent state only whole).
        let shareable = |held: usize, tokens: &[LlamaToken]| {
            policy::lane_shareable(self.shape, held, common_prefix_len(tokens, prompt).min(most))
        };
        // A lane's request may not accept cells a reuse past changes kept.
        let home = shareable(self.cached.len(), self.reusable_tokens(false));
        let mut source = (HOME, if covered(HOME, home) { home } else { 0 });
        for (seq, tokens) in self.lanes.held() {
            let held = shareable(tokens.len(), tokens);
            if covered(seq, held) && held > source.1 {
                source = (seq, held);
            }
        }
        match self.longest_kept_prefix(prompt, most) {
            Some(kept) if kept.1 > source.1 => kept,
            _ => source,
        }
    }

    /// Restores into lane `seq` the stored state that serves the most of `prompt`, when it
    /// serves [`policy::restore_for_lane`] more than the `live` tokens a live sequence could
    /// share; the prefix kept and the cache report.
    fn restore_into_lane(&mut self, seq: SeqId, prompt: &[LlamaToken], live: usize) -> Option<(usize, CacheReport)> {
        let most = prompt.len().saturating_sub(1);
        let whole_only = self.shape.whole_only();
        let store = self.store.as_mut()?;
        let views = store.views();
        let (view, usable) = policy::best_entry(&views, prompt, whole_only, |_, usable| {
            policy::restore_for_lane(live, usable.min(most))
        })?;
        let index = view.index;
        let started = Instant::now();
        let (held, state, kind) = match store.restore(index) {
            Restored::Taken(entry) => (entry.tokens, entry.state, entry.kind),
            Restored::Kept(entry) => (entry.tokens.clone(), entry.state.clone(), entry.kind),
        };
        let keep = usable.min(most);
        // Kept sequences' cells may leave no room in one piece for the state: tried again
        // without them.
        let restored = self.decoder.restore_lane(seq, &state, held.len(), keep)
            || (self.drop_all_kept() && self.decoder.restore_lane(seq, &state, held.len(), keep));
        if !restored {
            if let (CacheEntryKind::Checkpoint, Some(store)) = (kind, self.store.as_mut()) {
                store.discard(index);
            }
            return None;
        }
        let source = match kind {
            CacheEntryKind::Snapshot => CacheSource::Ram,
            CacheEntryKind::Checkpoint => CacheSource::Checkpoint,
        };
        let cache =
            CacheReport { source, reused: keep as u32, restore: Some(started.elapsed()), ..CacheReport::default() };
        Some((keep, cache))
    }
}
