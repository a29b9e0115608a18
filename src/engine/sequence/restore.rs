//! Carrying out the cache policy's plan for a prompt: cut the live sequence, or save it and
//! restore a stored state in its place. What is restored, from where, and what is saved or
//! forgotten is decided in [`crate::engine::policy`]; a restore that fails here (a file refused
//! on reading, a state llama.cpp does not take) removes that entry and asks for a new plan.

use std::time::{Duration, Instant};

use llama_cpp_2::token::LlamaToken;

use super::{LiveSequence, Reuse};
use crate::engine::decoder::SavedState;
use crate::engine::policy::{self, ChangeRules, Derivation, LiveView, Plan, Rules, Source, Stores};
use crate::engine::prefix::common_prefix_len;
use crate::engine::store::{Restored, StateBytes};
use crate::engine::{CacheEntryKind, CacheMiss, CacheSource};

/// Plans made for one prompt at most: each failed restore removes its entry, so this bounds
/// only a store full of entries llama.cpp refuses.
const MOST_PLANS: usize = 4;

/// What became of an attempt to restore a stored entry.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Restore {
    /// It is the live sequence now.
    Done,
    /// Nothing changed: its file was refused on reading (and left the index).
    Unread,
    /// llama.cpp refused its state, or the sequence it restored does not hold the entry's
    /// tokens: the entry is gone from its store, and the cache is empty (llama.cpp drops the
    /// sequence before it reads a state, so a refusal can leave it half replaced).
    Rejected,
}

impl LiveSequence<'_> {
    /// Makes the cache hold the longest prefix of `tokens` the policy finds it can serve
    /// correctly: the live sequence cut where the prompt leaves it, or a stored state restored
    /// in its place (the live sequence saved first when the policy says so). At least the last
    /// token of `tokens` is left to evaluate, so its logits are fresh. Where the live sequence
    /// serves it and the prompt accepts the approximation (`approximate`), the cache is reused
    /// past short changed spans ([`super::change`]); otherwise cells kept by such a reuse are
    /// not reused.
    pub(crate) fn reuse_prefix(
        &mut self,
        tokens: &[LlamaToken],
        derivation: Derivation<'_>,
        approximate: bool,
    ) -> Reuse {
        self.save_pending_checkpoint();
        let changes = (approximate && self.can_reuse_past_changes()).then_some(self.change_rules);
        let continued = self.continue_kept(tokens, changes);
        let reply = self.reply.take();
        let reply_cut = policy::reply_cut(&self.cached, reply, tokens);
        let mut origin = std::mem::replace(&mut self.origin, CacheSource::Live);
        if continued {
            origin = CacheSource::Kept;
        }
        let mut displaced: Option<(Vec<LlamaToken>, SavedState)> = None;
        let mut save = None;
        let mut reuse = None;
        let mut changes_blocked = false;
        // Where cells kept by a reuse past changes begin, if this prompt shares more than that
        // with the live sequence but does not accept them.
        let refused_from =
            (self.approximate_from).filter(|&from| !approximate && common_prefix_len(&self.cached, tokens) > from);
        for attempt in 0..MOST_PLANS {
            // Entries kept being refused: the last plan serves from the live sequence alone, as
            // far as it serves (not as far as the entry the policy would try next).
            let live_only = attempt + 1 == MOST_PLANS;
            let stores = if live_only { self.no_stores() } else { self.stores() };
            let weighed_changes = if live_only { None } else { changes };
            let reply_start = reply.map(|(start, _)| start);
            let plan = self.plan(&stores, tokens, derivation, reply_start, approximate, weighed_changes);
            if attempt == 0 && plan.source == Source::Live && approximate {
                match self.plan_changes(tokens, self.change_rules) {
                    Ok(Some(change)) => match self.carry_out_changes(tokens, &change) {
                        Ok(done) => {
                            let mut reuse = Reuse::nothing(origin);
                            reuse.past_changes(&change, done);
                            return reuse;
                        }
                        // The cache is empty now: plan again from what is left.
                        Err(e) => {
                            tracing::warn!("reusing the cache past changed spans failed: {e}");
                            origin = CacheSource::Live;
                            continue;
                        }
                    },
                    Ok(None) => {}
                    Err(()) => changes_blocked = true,
                }
            }
            if plan.save_live && attempt == 0 && self.approximate_from.is_none() {
                let started = Instant::now();
                displaced = self.decoder.save().map(|state| (self.cached.clone(), state));
                let took = started.elapsed();
                save = Some(took);
                if let Some((held, state)) = &displaced {
                    self.costs.record_ram(state.byte_len(), held.len(), took.as_secs_f64());
                }
                // And kept in its cells, for a next turn that continues it beside another.
                self.keep_home();
            }
            let mut attempted = Reuse {
                keep: plan.keep,
                source: CacheSource::None,
                diverged_at: plan.diverged_at,
                obstacle: plan.obstacle,
                save,
                restore: None,
                reply_cut,
                changes: None,
            };
            let outcome = match plan.source {
                Source::Live => {
                    self.cut_for(&mut attempted, origin);
                    Restore::Done
                }
                Source::Ram(index) => self.restore_from_ram(tokens, index, &mut attempted),
                Source::Disk(index) => self.restore_from_disk(tokens, index, &mut attempted),
            };
            match outcome {
                Restore::Done => {
                    if plan.past_changes && self.reuse_restored_past_changes(tokens, &mut attempted) {
                        reuse = Some(attempted);
                        break;
                    }
                    if plan.source != Source::Live {
                        // A restored state holds more than the prompt shares with it.
                        let source = attempted.source;
                        self.cut_for(&mut attempted, source);
                    }
                    reuse = Some(attempted);
                    break;
                }
                Restore::Unread => {}
                Restore::Rejected => {
                    // The live sequence is gone with the refused state: put it back from the
                    // copy just taken of it, if one was.
                    if let Some((held, state)) = &displaced {
                        let _ = self.adopt(held.clone(), state);
                    }
                    origin = CacheSource::Live;
                }
            }
        }
        let reuse = reuse.unwrap_or_else(|| {
            self.clear();
            Reuse { save, ..Reuse::nothing(CacheSource::None) }
        });
        let mut reuse = reuse;
        if refused_from.is_some_and(|from| reuse.keep <= from) && reuse.obstacle.is_none() {
            reuse.obstacle = Some(CacheMiss::ApproximateCells);
        }
        if changes_blocked && reuse.obstacle.is_none() && !matches!(reuse.source, CacheSource::Ram | CacheSource::Disk)
        {
            reuse.obstacle = Some(CacheMiss::CannotReuseAfterChange);
        }
        if let Some((held, state)) = displaced {
            self.keep_displaced(held, state);
        }
        self.drop_kept_costing(tokens.len().saturating_sub(reuse.keep));
        reuse
    }

    /// The cache policy's plan for `tokens` from `stores` and the live sequence now, its last
    /// reply having begun at `reply_start`. `approximate`: the prompt accepts cells a reuse
    /// past changes kept from an older text; `changes`: the limits of a reuse past changes,
    /// where one may be made.
    fn plan(
        &self,
        stores: &Stores<'_>,
        tokens: &[LlamaToken],
        derivation: Derivation<'_>,
        reply_start: Option<usize>,
        approximate: bool,
        changes: Option<ChangeRules>,
    ) -> Plan {
        let rules = Rules { min_save: self.min_save, costs: self.costs, changes };
        let live = LiveView { reply_start, tokens: self.reusable_tokens(approximate), ..self.view() };
        policy::plan_prompt(self.shape, live, stores, tokens, derivation, rules)
    }

    /// The RAM store and the disk cache as the cache policy sees them.
    fn stores(&self) -> Stores<'_> {
        Stores {
            ram: self.store.as_ref().map(|store| store.views()),
            evicted: self.store.as_ref().map(|store| store.evicted()).unwrap_or_default(),
            disk: self.disk.as_ref().map(|disk| disk.views()).unwrap_or_default(),
        }
    }

    /// The stores with no entry in them (the RAM store still on where it is, for the save).
    fn no_stores(&self) -> Stores<'_> {
        Stores { ram: self.store.as_ref().map(|_| Vec::new()), ..Stores::default() }
    }

    /// Cuts the live sequence to `reuse.keep` tokens (emptied when that is none), which came
    /// from `origin`.
    fn cut_for(&mut self, reuse: &mut Reuse, origin: CacheSource) {
        tracing::debug!(keep = reuse.keep, cached = self.cached.len(), "prefix reuse");
        if reuse.keep > 0 && !self.cut(reuse.keep) {
            tracing::warn!(
                keep = reuse.keep,
                cached = self.cached.len(),
                "the KV cache cannot be cut there; prefilling in full"
            );
            reuse.keep = 0;
            reuse.obstacle = Some(CacheMiss::CannotRewind);
        }
        if reuse.keep == 0 {
            self.clear();
        }
        reuse.source = if reuse.keep > 0 { origin } else { CacheSource::None };
    }

    /// A live sequence the prompt displaced, saved for a later prompt that continues it: into
    /// the RAM store, and to the disk writer at once if no file holds it yet.
    fn keep_displaced(&mut self, held: Vec<LlamaToken>, state: SavedState) {
        self.write_to_disk(&held, &state, CacheEntryKind::Snapshot);
        self.insert(held, state, CacheEntryKind::Snapshot);
    }

    /// Makes the RAM store's entry at `index` the live sequence. An entry that cannot be
    /// restored leaves the store at once (a snapshot already left it), so it is never tried
    /// again.
    fn restore_from_ram(&mut self, tokens: &[LlamaToken], index: usize, reuse: &mut Reuse) -> Restore {
        let Some(store) = self.store.as_mut() else { return Restore::Unread };
        let started = Instant::now();
        let (held, state, kind) = match store.restore(index) {
            Restored::Taken(entry) => (entry.tokens, entry.state, entry.kind),
            Restored::Kept(entry) => (entry.tokens.clone(), entry.state.clone(), entry.kind),
        };
        if self.adopt(held, &state).is_err() {
            if let (CacheEntryKind::Checkpoint, Some(store)) = (kind, self.store.as_mut()) {
                store.discard(index);
            }
            return Restore::Rejected;
        }
        // A checkpoint another prompt was served from: a prefix several requests share.
        if kind == CacheEntryKind::Checkpoint && self.cached != tokens {
            let held = self.cached.clone();
            self.write_to_disk(&held, &state, kind);
        }
        let source = match kind {
            CacheEntryKind::Snapshot => CacheSource::Ram,
            CacheEntryKind::Checkpoint => CacheSource::Checkpoint,
        };
        self.costs.record_ram(state.byte_len(), self.cached.len(), started.elapsed().as_secs_f64());
        self.restored(tokens, source, state.byte_len(), started.elapsed(), reuse);
        Restore::Done
    }

    /// Makes the disk cache's entry at `index` the live sequence. A file that cannot be
    /// restored is refused (named in a warning, removed), so it is never tried again.
    fn restore_from_disk(&mut self, tokens: &[LlamaToken], index: usize, reuse: &mut Reuse) -> Restore {
        let Some(disk) = self.disk.as_mut() else { return Restore::Unread };
        let started = Instant::now();
        let Some((held, state, _)) = disk.load(index) else { return Restore::Unread };
        if let Err(reason) = self.adopt(held, &state) {
            self.refuse_on_disk(index, reason);
            return Restore::Rejected;
        }
        let elapsed = started.elapsed();
        self.costs.record_disk(state.byte_len(), elapsed.as_secs_f64());
        self.restored(tokens, CacheSource::Disk, state.byte_len(), elapsed, reuse);
        Restore::Done
    }

    /// Records in `reuse` what a restore that took `elapsed` did for `tokens`.
    fn restored(
        &mut self,
        tokens: &[LlamaToken],
        source: CacheSource,
        bytes: usize,
        elapsed: Duration,
        reuse: &mut Reuse,
    ) {
        tracing::debug!(
            tokens = self.cached.len(),
            mib = bytes >> 20,
            ms = elapsed.as_secs_f32() * 1000.0,
            source = source.as_str(),
            "restored a stored KV state"
        );
        reuse.keep = crate::engine::prefix::plan_reuse(&self.cached, tokens);
        reuse.source = source;
        reuse.diverged_at = policy::divergence(&self.cached, tokens);
        reuse.restore = Some(elapsed);
    }

    /// Makes `state`, saved when the cache held `tokens`, the live sequence. Refused, with the
    /// reason, and the cache left empty, when llama.cpp does not take the state or the
    /// sequence it restored does not end where `tokens` do (it was not computed for them):
    /// every restore, from RAM, a checkpoint or disk, comes through here.
    pub(super) fn adopt(&mut self, tokens: Vec<LlamaToken>, state: &SavedState) -> Result<(), String> {
        self.lanes.home_cut(0);
        self.rewindable = 0;
        self.reply = None;
        self.checkpoint_pending = false;
        // Kept sequences' cells may leave no room in one piece for the state: tried again
        // without them.
        let adopted = if self.decoder.restore(state) || (self.drop_all_kept() && self.decoder.restore(state)) {
            let last = self.decoder.target().kv_cache_seq_pos_max(0);
            if i64::from(last) + 1 == tokens.len() as i64 {
                Ok(())
            } else {
                Err(format!("the restored sequence ends at position {last}, its tokens are {}", tokens.len()))
            }
        } else {
            Err("llama.cpp refused the state".to_string())
        };
        match &adopted {
            Ok(()) => {
                self.cached = tokens;
                self.approximate_from = None;
            }
            Err(reason) => {
                tracing::warn!("a stored KV state was not restored: {reason}");
                self.clear();
            }
        }
        adopted
    }

    /// Refuses the disk cache's entry at `index` (named in a warning, its file removed).
    pub(super) fn refuse_on_disk(&mut self, index: usize, reason: String) {
        if let Some(disk) = self.disk.as_mut() {
            disk.refuse(index, reason);
        }
    }
}
