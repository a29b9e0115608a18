//! Carrying out a reuse past changes ([`policy::plan_changes`]): the live sequence keeps what
//! follows a prompt's short changed spans. For each span, left to right: its old cells and the
//! neighbourhood after it are removed, what follows is moved by the span's change in length,
//! and the new span (with the neighbourhood) is evaluated at its positions. llama.cpp takes a
//! sequence's tokens only at its end, so the span is evaluated on a spare sequence that shares
//! the cells before it, and its new cells are then tagged for sequence 0 too. What the cache
//! held past the last kept run is dropped; the rest of the prompt is evaluated as usual.

use llama_cpp_2::token::LlamaToken;

use super::lanes::HOME;
use super::{LiveSequence, Reuse};
use crate::engine::decoder::SharedPart;
use crate::engine::policy::{self, ChangePlan, ChangeRules, ChangedSpan};
use crate::engine::schedule::SeqId;
use crate::engine::{CacheSource, ChangedSpanReport, ChangesReport, EngineError};

/// What a reuse past changes did, for the cache report.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ChangesReused {
    /// The changed spans, in the prompt's positions.
    pub(crate) spans: Vec<ChangedSpan>,
    /// Cached tokens kept after the spans (computed attending to the old spans).
    pub(crate) kept: usize,
    /// Prompt tokens the spans and their neighbourhoods evaluated.
    pub(crate) evaluated: usize,
}

impl ChangesReused {
    /// As the cache report gives it.
    pub(crate) fn report(&self) -> ChangesReport {
        let spans = (self.spans.iter())
            .map(|span| ChangedSpanReport {
                at: span.at as u32,
                old_len: span.old_len as u32,
                new_len: span.new_len as u32,
            })
            .collect();
        ChangesReport { spans, kept: self.kept as u32, evaluated: self.evaluated as u32 }
    }
}

impl LiveSequence<'_> {
    /// The reuse past changes `tokens` allows over the live sequence now under `rules`, if
    /// this cache can carry one out: attention whose positions can be moved (no recurrent
    /// state, a sliding window only with its guard, no drafter), no lane running beside
    /// it (their cells share positions with sequence 0's), and a sequence to evaluate spans on.
    /// `Err(())` where the prompt changed in spans the policy would reuse past but this cache
    /// cannot now.
    pub(super) fn plan_changes(&self, tokens: &[LlamaToken], rules: ChangeRules) -> Result<Option<ChangePlan>, ()> {
        let Some(plan) = policy::plan_changes(&self.cached, tokens, rules, true) else { return Ok(None) };
        if !self.can_reuse_past_changes() {
            return Err(());
        }
        Ok(Some(plan))
    }

    /// Whether this cache can carry out a reuse past changes now ([`Self::plan_changes`]).
    pub(super) fn can_reuse_past_changes(&self) -> bool {
        let spare = self.spare_seq.is_some() || !self.lanes.free.is_empty() || !self.lanes.kept.is_empty();
        // A sliding window: llama.cpp writes new tokens over the cells that fell out of a
        // sequence's window (any of them, not the oldest first), and a span evaluated in the
        // middle of the prompt needs the window before it; only a guard keeps them all.
        let window = self.shape.n_swa.is_none() || self.decoder.guards_window();
        !self.shape.recurrent && window && !self.lanes.busy() && spare && self.decoder.can_shift()
    }

    /// After a stored entry the policy chose for a reuse past changes was restored as the live
    /// sequence: reuses it past the prompt's changed spans, recorded in `reuse`. False where
    /// no such reuse applies to it after all (the caller cuts it where the prompt parts).
    pub(super) fn reuse_restored_past_changes(&mut self, tokens: &[LlamaToken], reuse: &mut Reuse) -> bool {
        let Ok(Some(plan)) = self.plan_changes(tokens, self.change_rules) else { return false };
        match self.carry_out_changes(tokens, &plan) {
            Ok(done) => reuse.past_changes(&plan, done),
            // The cache is empty now.
            Err(e) => {
                tracing::warn!("reusing a restored state past changed spans failed: {e}");
                reuse.keep = 0;
                reuse.source = CacheSource::None;
                reuse.obstacle = None;
            }
        }
        true
    }

    /// Reuse past changed spans is the default for requests that do not say (`default`),
    /// within `rules`; `spare`: a sequence the context holds for it beside the lanes'.
    pub(crate) fn reuse_past_changes(&mut self, default: bool, rules: ChangeRules, spare: Option<SeqId>) {
        self.change_default = default;
        self.change_rules = rules;
        self.spare_seq = spare;
    }

    /// Makes the cache hold `tokens[..plan.end]` as `plan` says. On failure the cache is
    /// cleared (llama.cpp's cells are then in an unknown arrangement) and the error returned.
    pub(super) fn carry_out_changes(
        &mut self,
        tokens: &[LlamaToken],
        plan: &ChangePlan,
    ) -> Result<ChangesReused, EngineError> {
        self.save_pending_checkpoint();
        self.give_up_shared_cells(plan);
        let Some(spare) = self.take_spare_seq() else {
            return Err(EngineError::Internal("no sequence to evaluate a changed span on".into()));
        };
        let started = std::time::Instant::now();
        let applied = self.apply_spans(tokens, plan, spare);
        self.decoder.drop_sequence(spare);
        if Some(spare) != self.spare_seq {
            self.lanes.free.push(spare);
        }
        if let Err(e) = applied {
            self.clear();
            return Err(e);
        }
        self.cached.clear();
        self.cached.extend_from_slice(&tokens[..plan.end]);
        let first = plan.spans.first().map_or(plan.end, |span| span.at);
        self.approximate_from = Some(self.approximate_from.map_or(first, |from| from.min(first)));
        self.reply = None;
        self.rewindable = 0;
        let ms = started.elapsed().as_secs_f32() * 1e3;
        tracing::debug!(spans = plan.spans.len(), kept = plan.kept(), ms, "reused past changed spans");
        Ok(ChangesReused { spans: plan.spans.clone(), kept: plan.kept(), evaluated: plan.evaluated() })
    }

    /// Kept conversations whose cells sequence 0 shares past the prompt's common prefix: with
    /// a span that changes length they are dropped (a cell has one position for every sequence
    /// that holds it, so moving sequence 0's would move theirs); otherwise they keep their
    /// cells and count them as their own.
    fn give_up_shared_cells(&mut self, plan: &ChangePlan) {
        let moves = plan.spans.iter().any(|span| span.shift() != 0);
        let sharing: Vec<SeqId> =
            self.lanes.kept.iter().filter(|kept| kept.shared > plan.prefix).map(|kept| kept.seq).collect();
        if moves {
            for seq in sharing {
                if let Some(index) = self.lanes.kept.iter().position(|kept| kept.seq == seq) {
                    self.lanes.kept.swap_remove(index);
                    self.decoder.drop_sequence(seq);
                    self.lanes.free.push(seq);
                }
            }
        }
        self.lanes.home_cut(plan.prefix);
    }

    /// The sequence spans are evaluated on: the one reserved for it, a free one, or the least
    /// recently used kept conversation's.
    fn take_spare_seq(&mut self) -> Option<SeqId> {
        self.spare_seq.or_else(|| self.lanes.free.pop()).or_else(|| self.drop_oldest_kept(None))
    }

    /// Removes, moves and evaluates each span as the module says, then drops what the cache
    /// held past the plan's end.
    fn apply_spans(&mut self, tokens: &[LlamaToken], plan: &ChangePlan, spare: SeqId) -> Result<(), EngineError> {
        let refused = |what: &str| EngineError::Decode(format!("llama.cpp refused to {what} a changed span's cells"));
        for span in &plan.spans {
            let at = span.at;
            let old_end = at + span.old_len + span.redo;
            if !self.decoder.remove_positions(at, old_end) {
                return Err(refused("remove"));
            }
            if span.shift() != 0 && !self.decoder.shift_positions(old_end, span.shift()) {
                return Err(refused("move"));
            }
            let fresh = &tokens[at..at + span.new_len + span.redo];
            if fresh.is_empty() {
                continue;
            }
            self.room_for(fresh.len());
            if !self.decoder.share_range(HOME, spare, 0, at) {
                return Err(refused("share"));
            }
            for (index, chunk) in fresh.chunks(self.n_batch.max(1)).enumerate() {
                self.follow_threads(chunk.len());
                let start = at + index * self.n_batch.max(1);
                self.decoder.decode_span(SharedPart { seq: spare, tokens: chunk, start })?;
            }
            if !self.decoder.share_range(spare, HOME, at, at + fresh.len()) {
                return Err(refused("tag"));
            }
            self.decoder.drop_sequence(spare);
        }
        if !self.decoder.truncate(plan.end) {
            return Err(refused("drop what follows"));
        }
        // Every span moved what follows it where the prompt has it: the sequence ends where
        // the plan does.
        let target = self.decoder.target();
        let (first, last) = (target.kv_cache_seq_pos_min(HOME), target.kv_cache_seq_pos_max(HOME));
        if first != 0 || i64::from(last) + 1 != plan.end as i64 {
            return Err(EngineError::Internal(format!(
                "after a reuse past changes sequence 0 holds positions {first}..={last}, not 0..{}",
                plan.end
            )));
        }
        Ok(())
    }
}
