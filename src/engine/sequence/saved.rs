//! The live sequence's saved states: taken into the RAM store before another prompt displaces
//! it, checkpoints of prompts for models whose cache cannot be cut, written to the disk cache
//! after a reply, and restored from either when they spare a prompt more than the live cache.

use std::time::{Duration, Instant};

use llama_cpp_2::token::LlamaToken;

use super::{divergence, Displaced, LiveSequence, Reuse};
use crate::engine::decoder::SavedState;
use crate::engine::disk::DiskCache;
use crate::engine::prefix::plan_reuse;
use crate::engine::store::{Candidate, Restored, StateBytes, StateStore};
use crate::engine::{CacheEntryKind, CacheEntryStatus, CacheMiss, CacheSource, CacheStatus};

/// How many more prompt tokens a stored entry must spare than the live sequence before it is
/// restored: a restore copies the whole state (a few ms for thousands of tokens of a small
/// model), which a handful of prefilled tokens would cost as well. A disk entry must spare
/// this many more than the best RAM entry too (reading a file costs more than a copy).
const RESTORE_MARGIN: usize = 32;

/// Where the entry to restore is.
#[derive(Clone, Copy)]
enum Found {
    Ram(Candidate),
    Disk(Candidate),
}

/// What became of an attempt to restore a stored entry.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Restore {
    /// It is the live sequence now.
    Done,
    /// Nothing changed: its file was refused on reading, or there is no such store.
    Unread,
    /// llama.cpp refused its state, or the sequence it restored does not hold the entry's
    /// tokens: the entry is gone from its store, and the cache is empty (llama.cpp drops the
    /// sequence before it reads a state, so a refusal can leave it half replaced).
    Rejected,
}

impl<'m> LiveSequence<'m> {
    /// Keeps other prompts' states in up to `budget` bytes of RAM (nothing when 0), saving a
    /// sequence of at least `min_save` tokens before another prompt displaces it (and writing
    /// no shorter one to disk). `checkpoint_every`: also save each prompt of at least
    /// `min_save` tokens at the end of its prefill, and every this many tokens of a long one
    /// (0: only at the end).
    pub(crate) fn keep_states(&mut self, budget: usize, min_save: usize, checkpoint_every: Option<usize>) {
        self.min_save = min_save.max(1);
        if budget == 0 {
            return;
        }
        self.store = Some(StateStore::new(budget, self.whole_only()));
        self.checkpoint_every = checkpoint_every;
    }

    /// Forgets every state this process holds: the live sequence (the drafter's included), the
    /// RAM store's entries and the states waiting to be written to disk. After a fault, none
    /// is known to be whole.
    pub(crate) fn forget_all(&mut self) {
        self.clear();
        let whole_only = self.whole_only();
        if let Some(store) = &mut self.store {
            *store = StateStore::new(store.budget(), whole_only);
        }
        self.unpersisted.clear();
        self.origin = CacheSource::Live;
    }

    /// Whether a restored state can only be continued from its end: the cache cannot be cut
    /// after a restore (recurrent state), or the restored sliding window holds only the last
    /// `n_swa` positions (measured on gemma-3 with the full SWA cache too).
    pub(crate) fn whole_only(&self) -> bool {
        self.recurrent || self.n_swa.is_some()
    }

    /// Keeps states on disk too, and makes the most recently used one the live sequence now,
    /// so the first request after a restart is warm. A file that cannot be used is refused
    /// (named in a warning, removed) and the next most recent one tried.
    pub(crate) fn keep_on_disk(&mut self, disk: DiskCache) {
        tracing::info!("{}", disk.describe());
        self.disk = Some(disk);
        loop {
            let Some(disk) = self.disk.as_mut() else { return };
            let Some(index) = disk.most_recent() else { return };
            let started = Instant::now();
            let Some((tokens, state, _)) = disk.load(index) else { continue };
            let count = tokens.len();
            match self.adopt(tokens, &state) {
                Ok(()) => {
                    tracing::info!(
                        tokens = count,
                        ms = started.elapsed().as_millis() as u64,
                        "restored the last conversation from the disk cache"
                    );
                    self.origin = CacheSource::Disk;
                    return;
                }
                Err(reason) => self.refuse_on_disk(index, reason),
            }
        }
    }

    /// Makes `state`, saved when the cache held `tokens`, the live sequence. Refused, with the
    /// reason, and the cache left empty, when llama.cpp does not take the state or the
    /// sequence it restored does not end where `tokens` do (it was not computed for them):
    /// every restore, from RAM, a checkpoint or disk, comes through here.
    fn adopt(&mut self, tokens: Vec<LlamaToken>, state: &SavedState) -> Result<(), String> {
        self.rewindable = 0;
        self.checkpoint_pending = false;
        let adopted = if self.decoder.restore(state) {
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
            Ok(()) => self.cached = tokens,
            Err(reason) => {
                tracing::warn!("a stored KV state was not restored: {reason}");
                self.clear();
            }
        }
        adopted
    }

    /// Refuses the disk cache's entry at `index` (named in a warning, its file removed).
    fn refuse_on_disk(&mut self, index: usize, reason: String) {
        if let Some(disk) = self.disk.as_mut() {
            disk.refuse(index, reason);
        }
    }

    /// What the cache holds now.
    pub(crate) fn status(&self) -> CacheStatus {
        let mut status = CacheStatus {
            live_tokens: self.cached.len() as u32,
            checkpoint_every: self.checkpoint_every.map(|every| every as u32),
            disk: self.disk.as_ref().map(DiskCache::status),
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

    /// The stored entry (RAM or disk) worth restoring for `tokens`, given that the live cache
    /// spares `live` of them.
    fn find(&self, tokens: &[LlamaToken], live: usize) -> Option<Found> {
        let worth = live + RESTORE_MARGIN;
        let ram = self.store.as_ref().and_then(|store| store.best(tokens)).filter(|c| c.reusable >= worth);
        let disk_worth = ram.map_or(worth, |ram| ram.reusable + RESTORE_MARGIN);
        let disk = self.disk.as_ref().and_then(|disk| disk.best(tokens)).filter(|c| c.reusable >= disk_worth);
        disk.map(Found::Disk).or(ram.map(Found::Ram))
    }

    /// Restores the stored state that spares the most of `tokens` when it beats the live one,
    /// saving the live sequence first if that loses much of what it holds; `reuse` says what
    /// is reusable then (unless it is to be forgotten).
    pub(super) fn consult_store(&mut self, tokens: &[LlamaToken], reuse: &mut Reuse, displaced: Displaced) {
        let found = self.find(tokens, reuse.keep);
        if found.is_none() {
            self.explain_store_miss(tokens, reuse);
        }
        let kept = if found.is_some() { 0 } else { reuse.keep };
        let worth_saving = displaced == Displaced::Save
            && self.store.is_some()
            && self.cached.len() >= self.min_save
            && self.cached.len() - kept >= self.min_save;
        let displaced = worth_saving
            .then(|| {
                let started = Instant::now();
                let state = self.decoder.save();
                reuse.save = Some(started.elapsed());
                state.map(|state| (self.cached.clone(), state))
            })
            .flatten();
        let mut outcome = match found {
            Some(Found::Disk(candidate)) => self.restore_from_disk(tokens, candidate.index, reuse),
            Some(Found::Ram(candidate)) => self.restore(tokens, candidate.index, reuse),
            None => Restore::Unread,
        };
        // A file refused on reading falls back to the RAM store's best entry.
        if matches!(found, Some(Found::Disk(_))) && outcome == Restore::Unread {
            if let Some(Found::Ram(candidate)) = self.find(tokens, reuse.keep) {
                outcome = self.restore(tokens, candidate.index, reuse);
            }
        }
        if outcome == Restore::Rejected {
            self.recover_live(tokens, reuse, displaced.as_ref());
        }
        if let Some((held, state)) = displaced {
            // Not written yet when the next request came before the reply's upkeep was done.
            if self.disk.as_ref().is_some_and(|disk| !disk.holds(&held)) {
                self.unpersisted.push((held.clone(), state.clone(), CacheEntryKind::Snapshot));
            }
            self.insert(held, state, CacheEntryKind::Snapshot);
        }
    }

    /// Why no stored entry served `tokens` though one shares more than the live cache: it was
    /// evicted, or the prompt leaves it early and a restored state cannot be cut there.
    fn explain_store_miss(&self, tokens: &[LlamaToken], reuse: &mut Reuse) {
        let Some(store) = self.store.as_ref() else { return };
        let worth = reuse.keep + RESTORE_MARGIN;
        if store.evicted_reusable(tokens) >= worth {
            reuse.obstacle = Some(CacheMiss::Evicted);
        } else if store.longest_shared(tokens) >= worth {
            reuse.obstacle = Some(if self.recurrent { CacheMiss::CannotRewind } else { CacheMiss::SwaWindow });
        }
    }

    /// Makes the RAM store's entry at `index` the live sequence. An entry that cannot be
    /// restored leaves the store at once (a snapshot already left it), so it is never tried
    /// again.
    fn restore(&mut self, tokens: &[LlamaToken], index: usize, reuse: &mut Reuse) -> Restore {
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
        if kind == CacheEntryKind::Checkpoint && self.cached != tokens && self.disk.is_some() {
            self.unpersisted.push((self.cached.clone(), state.clone(), kind));
        }
        let source = match kind {
            CacheEntryKind::Snapshot => CacheSource::Ram,
            CacheEntryKind::Checkpoint => CacheSource::Checkpoint,
        };
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
        self.restored(tokens, CacheSource::Disk, state.byte_len(), started.elapsed(), reuse);
        Restore::Done
    }

    /// After a rejected restore emptied the cache: puts the live sequence back from the copy
    /// just taken of it, if one was (it was worth saving), and says what `tokens` reuse of it;
    /// without one, `tokens` are prefilled in full.
    fn recover_live(&mut self, tokens: &[LlamaToken], reuse: &mut Reuse, copy: Option<&(Vec<LlamaToken>, SavedState)>) {
        *reuse = Reuse { keep: 0, source: CacheSource::None, restore: None, ..*reuse };
        let Some((held, state)) = copy else { return };
        if self.adopt(held.clone(), state).is_err() {
            return;
        }
        let (keep, obstacle) = self.reusable(tokens);
        reuse.keep = keep;
        reuse.source = if keep > 0 { CacheSource::Live } else { CacheSource::None };
        reuse.diverged_at = divergence(&self.cached, tokens);
        reuse.obstacle = obstacle;
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
        reuse.keep = plan_reuse(&self.cached, tokens);
        reuse.source = source;
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
    pub(super) fn save_checkpoint(&mut self) {
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

    /// Queues what is worth keeping across a restart for the disk cache: the live sequence
    /// (the conversation, as the next turn will continue it), a checkpoint another prompt was
    /// served from, and a conversation displaced before it was written. Called after a reply,
    /// while the user listens: the live state is copied here, the files written by the disk
    /// cache's own thread.
    pub(crate) fn persist(&mut self) {
        let Some(disk) = self.disk.as_mut() else { return };
        for (tokens, state, kind) in self.unpersisted.drain(..) {
            if !disk.holds(&tokens) {
                disk.save(&tokens, &state, kind);
            }
        }
        if self.cached.len() < self.min_save || disk.holds(&self.cached) {
            return;
        }
        let started = Instant::now();
        let Some(state) = self.decoder.save() else { return };
        tracing::debug!(
            tokens = self.cached.len(),
            ms = started.elapsed().as_secs_f32() * 1000.0,
            "the live sequence copied for the disk cache"
        );
        if let Some(disk) = self.disk.as_mut() {
            disk.save(&self.cached, &state, CacheEntryKind::Snapshot);
        }
    }

    /// At shutdown: queues the live sequence for the disk cache and waits up to `limit` for
    /// the files to be written (an unfinished one is never used: it has no final name).
    pub(crate) fn persist_before_exit(&mut self, limit: Duration) {
        if self.disk.as_ref().is_none_or(DiskCache::is_off) {
            return;
        }
        self.persist();
        let started = Instant::now();
        if self.wait_for_disk(limit) {
            tracing::info!(ms = started.elapsed().as_millis() as u64, "disk cache written");
        }
    }

    /// Waits up to `limit` for the disk cache's queued files; false, with a warning, if some
    /// were not written by then (true without a disk cache, or with one that is off: nothing
    /// is waited for then).
    pub(crate) fn wait_for_disk(&self, limit: Duration) -> bool {
        let Some(disk) = self.disk.as_ref().filter(|disk| !disk.is_off()) else { return true };
        let written = disk.flush(limit);
        if !written {
            tracing::warn!("disk cache: not every file was written within {limit:?}; unfinished ones are discarded");
        }
        written
    }
}
