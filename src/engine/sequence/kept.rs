//! Kept sequences (`--parallel`): a conversation that another one displaced from sequence 0,
//! or a lane's once its reply ended, stays in its cells under a sequence of its own in the
//! unified KV cache (the cells it shares with sequence 0 tagged by both, nothing copied). Its
//! next turn continues it where it is: a lane takes that sequence over, or sequence 0 takes its
//! cells and the conversation it held is kept in turn. Where its copy would not fit beside the
//! others, a stored state cannot give that: a restore writes every cell anew.
//!
//! A kept sequence is what its cells are worth, no more: the RAM store still holds the copy
//! the cache policy saved, and kept sequences are dropped, the least recently used first,
//! whenever their cells are needed (a prompt of sequence 0, a lane's, a restore llama.cpp could
//! not place beside them) or their sequence is, and, where the RAM store holds their copy,
//! before a long evaluation of sequence 0 that their cells would slow (the attention runs over
//! every used cell, masked or not).
//!
//! The cells a kept sequence holds beyond the prefix it shares with sequence 0 count against
//! the context like the lanes' own; cells two kept sequences share but sequence 0 does not are
//! counted twice, which only drops one sooner.

use llama_cpp_2::token::LlamaToken;

use super::lanes::HOME;
use super::LiveSequence;
use crate::engine::policy::{self, ChangeRules};
use crate::engine::prefix::{common_prefix_len, window_covers};
use crate::engine::schedule::SeqId;
use crate::engine::KeptStatus;

/// A conversation's cells under a sequence no request is served from.
pub(super) struct Kept {
    pub(super) seq: SeqId,
    /// What the sequence holds, position by position.
    pub(super) tokens: Vec<LlamaToken>,
    /// Of these, the first ones whose cells sequence 0 holds too.
    pub(super) shared: usize,
    /// When it was kept or last served from (a counter): the oldest is dropped first.
    pub(super) used: u64,
}

impl Kept {
    /// Cells it holds that sequence 0 does not.
    fn own_cells(&self) -> usize {
        self.tokens.len() - self.shared.min(self.tokens.len())
    }
}

impl LiveSequence<'_> {
    /// Whether conversations are kept: sequences beside sequence 0, whose cells can be shared
    /// (a recurrent state is one per sequence and copied, never shared; an MTP drafter's
    /// context holds the hidden states of sequence 0's own conversation alone, which cells
    /// taken over from another would not match).
    fn keeps(&self) -> bool {
        self.lanes.pool() > 0 && !self.shape.recurrent && !self.decoder.mirrors_target()
    }

    /// Cells the kept sequences hold that sequence 0 does not.
    fn kept_cells(&self) -> usize {
        self.lanes.kept.iter().map(Kept::own_cells).sum()
    }

    /// How many sequences are kept.
    pub(crate) fn kept_count(&self) -> usize {
        self.lanes.kept.len()
    }

    /// The kept conversations, most recently used first.
    pub(super) fn kept_status(&self) -> Vec<KeptStatus> {
        let mut kept: Vec<&Kept> = self.lanes.kept.iter().collect();
        kept.sort_by_key(|kept| std::cmp::Reverse(kept.used));
        (kept.into_iter())
            .map(|kept| KeptStatus {
                sequence: kept.seq,
                tokens: kept.tokens.len() as u32,
                shared: kept.shared.min(kept.tokens.len()) as u32,
            })
            .collect()
    }

    /// Keeps what sequence 0 holds under a sequence of its own, before sequence 0 is cut or
    /// replaced: a free sequence, else the least recently used kept one's (dropped).
    pub(super) fn keep_home(&mut self) {
        if !self.keeps() || self.cached.is_empty() || self.approximate() {
            return;
        }
        let Some(seq) = self.lanes.free.pop().or_else(|| self.drop_oldest_kept(None)) else { return };
        if !self.decoder.share_prefix(HOME, seq, self.cached.len()) {
            self.decoder.drop_sequence(seq);
            self.lanes.free.push(seq);
            return;
        }
        tracing::debug!(seq, tokens = self.cached.len(), "sequence 0's conversation is kept in its cells");
        let used = self.lanes.tick();
        let held = self.cached.len();
        self.lanes.kept.push(Kept { seq, tokens: self.cached.clone(), shared: held, used });
    }

    /// Keeps lane `seq`'s cells, which hold `tokens` (the first `shared` of them sequence 0's
    /// too), after its reply ended.
    pub(super) fn keep_lane_cells(&mut self, seq: SeqId, tokens: Vec<LlamaToken>, shared: usize) {
        if !self.keeps() || tokens.is_empty() {
            self.decoder.drop_sequence(seq);
            self.lanes.free.push(seq);
            return;
        }
        let used = self.lanes.tick();
        self.lanes.kept.push(Kept { seq, tokens, shared, used });
    }

    /// Drops the least recently used kept sequence other than `spare`; its sequence, now free,
    /// or `None` when there is none to drop.
    pub(super) fn drop_oldest_kept(&mut self, spare: Option<SeqId>) -> Option<SeqId> {
        let index = (self.lanes.kept.iter().enumerate())
            .filter(|(_, kept)| Some(kept.seq) != spare)
            .min_by_key(|(_, kept)| kept.used)
            .map(|(index, _)| index)?;
        let kept = self.lanes.kept.swap_remove(index);
        tracing::debug!(seq = kept.seq, tokens = kept.tokens.len(), "a kept conversation's cells are dropped");
        self.decoder.drop_sequence(kept.seq);
        Some(kept.seq)
    }

    /// Drops every kept sequence (a restore llama.cpp could not place beside them).
    pub(super) fn drop_all_kept(&mut self) -> bool {
        let mut dropped = false;
        while let Some(seq) = self.drop_oldest_kept(None) {
            self.lanes.free.push(seq);
            dropped = true;
        }
        dropped
    }

    /// Drops kept sequences, least recently used first and never `spare`, until `needed` cells
    /// of sequence 0 fit beside the lanes' and the kept sequences' own (or none is left to
    /// drop); the cells free beside those then.
    pub(crate) fn room_beside_kept(&mut self, needed: usize, spare: Option<SeqId>) -> usize {
        let n_ctx = self.n_ctx() as usize;
        loop {
            let free = n_ctx.saturating_sub(self.lanes.reserved() + self.kept_cells());
            if needed <= free {
                return free;
            }
            let Some(seq) = self.drop_oldest_kept(spare) else { return free };
            self.lanes.free.push(seq);
        }
    }

    /// Before sequence 0 evaluates `evaluate` tokens: drops kept conversations the RAM store
    /// holds a copy of, the least recently used first, while their cells cost that evaluation
    /// more masked attention than they are worth ([`policy::kept_cost_too_much`]). Those with
    /// no copy stay: they would have to be evaluated again.
    pub(super) fn drop_kept_costing(&mut self, evaluate: usize) {
        while policy::kept_cost_too_much(evaluate, self.kept_cells()) {
            let Some(store) = self.store.as_ref() else { return };
            let copied = |kept: &Kept| store.entries().any(|entry| entry.tokens.starts_with(&kept.tokens));
            let Some(index) = (self.lanes.kept.iter().enumerate())
                .filter(|(_, kept)| copied(kept))
                .min_by_key(|(_, kept)| kept.used)
                .map(|(index, _)| index)
            else {
                return;
            };
            let kept = self.lanes.kept.swap_remove(index);
            tracing::debug!(
                seq = kept.seq,
                tokens = kept.tokens.len(),
                evaluate,
                "a kept conversation costs this evaluation more than a restore: dropped"
            );
            self.decoder.drop_sequence(kept.seq);
            self.lanes.free.push(kept.seq);
        }
    }

    /// Makes room for `more` tokens of sequence 0, dropping kept sequences where they hold the
    /// cells (nothing to do, and nothing computed, without any).
    pub(super) fn room_for(&mut self, more: usize) {
        if !self.lanes.kept.is_empty() {
            self.room_beside_kept(self.cached.len() + more, None);
        }
    }

    /// The kept sequence holding the longest prefix of `prompt` that can be continued (at most
    /// `most` tokens, covered by its sliding window), and that prefix's length.
    pub(crate) fn longest_kept_prefix(&self, prompt: &[LlamaToken], most: usize) -> Option<(SeqId, usize)> {
        let target = self.decoder.target();
        (self.lanes.kept.iter())
            .map(|kept| (kept.seq, common_prefix_len(&kept.tokens, prompt).min(most)))
            .filter(|&(seq, held)| held > 0 && window_covers(target.kv_cache_seq_pos_min(seq), held, self.shape.n_swa))
            .max_by_key(|&(_, held)| held)
    }

    /// Takes kept sequence `seq` for a lane that continues its first `keep` tokens: it is no
    /// longer kept, and holds those tokens only. How many of them sequence 0 holds too; `None`
    /// (and the sequence empty) when llama.cpp could not cut it there.
    pub(super) fn take_kept(&mut self, seq: SeqId, keep: usize) -> Option<usize> {
        let index = self.lanes.kept.iter().position(|kept| kept.seq == seq)?;
        let kept = self.lanes.kept.swap_remove(index);
        if keep < kept.tokens.len() && !self.decoder.cut_sequence(seq, keep) {
            self.decoder.drop_sequence(seq);
            return None;
        }
        Some(kept.shared.min(keep))
    }

    /// Makes sequence 0 continue the kept sequence that holds more of `prompt` than sequence 0
    /// does, if one does: its cells become sequence 0's (tagged, not copied) and what sequence
    /// 0 held is kept in turn. With `changes` (the prompt accepts a reuse past changed spans,
    /// and the cache can carry one out), each is weighed by what it serves past them: a
    /// conversation whose clock line moved while another one spoke. True when it did.
    pub(super) fn continue_kept(&mut self, prompt: &[LlamaToken], changes: Option<ChangeRules>) -> bool {
        if !self.keeps() {
            return false;
        }
        let most = prompt.len().saturating_sub(1);
        let exact = self.longest_kept_prefix(prompt, most);
        let past_changes = changes.and_then(|rules| {
            (self.lanes.kept.iter())
                .map(|kept| (kept.seq, policy::served_past_changes(&kept.tokens, prompt, rules)))
                .filter(|&(_, served)| served > 0)
                .max_by_key(|&(_, served)| served)
        });
        let Some((seq, held)) = exact.into_iter().chain(past_changes).max_by_key(|&(_, held)| held) else {
            return false;
        };
        let home = common_prefix_len(&self.cached, prompt).min(most);
        let home = if window_covers(self.decoder.target().kv_cache_seq_pos_min(HOME), home, self.shape.n_swa) {
            home
        } else {
            0
        };
        let home = changes.map_or(home, |rules| home.max(policy::served_past_changes(&self.cached, prompt, rules)));
        if held <= home {
            return false;
        }
        let Some(shared) = self.lanes.kept.iter().find(|kept| kept.seq == seq).map(|kept| kept.shared) else {
            return false;
        };
        // What sequence 0 holds is kept under a sequence of its own (free, or another kept
        // one's); without one, nothing changes: the cache policy restores the conversation from
        // the RAM store instead, and saves what sequence 0 held as it does.
        if !self.cached.is_empty() {
            if self.lanes.free.is_empty() {
                let Some(freed) = self.drop_oldest_kept(Some(seq)) else { return false };
                self.lanes.free.push(freed);
            }
            self.keep_home();
        }
        let Some(index) = self.lanes.kept.iter().position(|kept| kept.seq == seq) else { return false };
        let kept = self.lanes.kept.swap_remove(index);
        // Sequence 0 takes the kept cells: its own tags go, the kept sequence's become its.
        self.decoder.clear();
        let moved = self.decoder.share_prefix(seq, HOME, kept.tokens.len());
        self.decoder.drop_sequence(seq);
        self.lanes.free.push(seq);
        self.rewindable = 0;
        self.reply = None;
        self.checkpoint_pending = false;
        self.cached.clear();
        if !moved {
            self.lanes.home_cut(0);
            return false;
        }
        // Only the prefix the kept sequence shared with the old sequence 0 is shared by the
        // others (the old sequence 0 kept included) with the new one.
        self.lanes.home_cut(shared);
        tracing::debug!(seq, tokens = kept.tokens.len(), "sequence 0 continues a kept conversation");
        self.cached = kept.tokens;
        self.approximate_from = None;
        true
    }
}
