//! The live sequence's saved states: the RAM store (states of displaced sequences, checkpoints
//! of prompts for models whose cache cannot be cut), the disk cache (states kept across
//! restarts, written by its own thread) and the copies for it. Restoring them is in
//! [`super::restore`]; when to do either is decided by [`crate::engine::policy`].

use std::time::{Duration, Instant};

use llama_cpp_2::token::LlamaToken;

use super::LiveSequence;
use crate::engine::decoder::SavedState;
use crate::engine::disk::DiskCache;
use crate::engine::store::{StateBytes, StateStore};
use crate::engine::{CacheEntryKind, CacheEntryStatus, CacheSource, CacheStatus};

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
        self.store = Some(StateStore::new(budget, self.shape.whole_only()));
        self.checkpoint_every = checkpoint_every;
    }

    /// Forgets every state this process holds: the live sequence (the drafter's included), the
    /// RAM store's entries and the states waiting to be written to disk. After a fault, none
    /// is known to be whole.
    pub(crate) fn forget_all(&mut self) {
        self.clear();
        let whole_only = self.shape.whole_only();
        if let Some(store) = &mut self.store {
            *store = StateStore::new(store.budget(), whole_only);
        }
        self.origin = CacheSource::Live;
    }

    /// Keeps states on disk too ([`Self::restore_last_conversation`] brings the most recent
    /// one back).
    pub(crate) fn keep_on_disk(&mut self, disk: DiskCache) {
        tracing::info!("{}", disk.describe());
        self.disk = Some(disk);
    }

    /// Makes the disk cache's most recently used state the live sequence, so the first
    /// request after a restart is warm: called once at start, after anything that evaluates
    /// on the context (the projector's probe), which would clear it. A file that cannot be
    /// used is refused (named in a warning, removed) and the next most recent one tried.
    pub(crate) fn restore_last_conversation(&mut self) {
        loop {
            let Some(disk) = self.disk.as_mut() else { return };
            let Some(index) = disk.most_recent() else { return };
            let started = Instant::now();
            let Some((tokens, state, _)) = disk.load(index) else { continue };
            let count = tokens.len();
            match self.adopt(tokens, &state) {
                Ok(()) => {
                    self.costs.record_disk(state.byte_len(), started.elapsed().as_secs_f64());
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

    /// What the cache holds now.
    pub(crate) fn status(&self) -> CacheStatus {
        let mut status = CacheStatus {
            live_tokens: self.cached.len() as u32,
            checkpoint_every: self.checkpoint_every.map(|every| every as u32),
            disk: self.disk.as_ref().map(DiskCache::status),
            kept: self.kept_status(),
            live_approximate_from: self.approximate_from.map(|from| from as u32),
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

    /// Stores a saved state of `tokens` in RAM, within the budget it shares with the states
    /// waiting for the disk writer.
    pub(super) fn insert(&mut self, tokens: Vec<LlamaToken>, state: SavedState, kind: CacheEntryKind) {
        let pending = self.disk.as_ref().map_or(0, DiskCache::pending_bytes);
        let Some(store) = self.store.as_mut() else { return };
        let (count, bytes) = (tokens.len(), state.byte_len());
        let saved = store.insert(tokens, state, kind, pending);
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
        if self.approximate() {
            return;
        }
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

    /// Queues `state`, saved when the cache held `tokens`, for the disk cache's writer, unless
    /// a file holds those tokens already (or is being written).
    pub(super) fn write_to_disk(&mut self, tokens: &[LlamaToken], state: &SavedState, kind: CacheEntryKind) {
        if let Some(disk) = self.disk.as_mut().filter(|disk| !disk.holds(tokens)) {
            disk.save(tokens, state, kind);
        }
    }

    /// Whether the live sequence is worth writing to the disk cache and no file holds it yet.
    pub(crate) fn unpersisted(&self) -> bool {
        self.disk.as_ref().is_some_and(|disk| !disk.is_off() && !disk.holds(&self.cached))
            && self.cached.len() >= self.min_save
            && !self.approximate()
    }

    /// Copies the live sequence (the conversation, as its next turn will continue it) for the
    /// disk cache's writer, which writes it on its own thread. The copy takes the inference
    /// thread for a moment (about 0.1 s for 4K tokens of a small model): the engine calls this
    /// only when no request waits. A state larger than the disk budget is not copied.
    pub(crate) fn persist(&mut self) {
        if !self.unpersisted() {
            return;
        }
        let Some(disk) = self.disk.as_ref() else { return };
        let size = self.decoder.state_size();
        if !disk.fits(size) {
            tracing::debug!(mib = size >> 20, "the live sequence is larger than the disk budget; not written");
            return;
        }
        // The tests count the copies here.
        fail::fail_point!("engine::persist");
        let started = Instant::now();
        let Some(state) = self.decoder.save() else { return };
        tracing::debug!(
            tokens = self.cached.len(),
            ms = started.elapsed().as_secs_f32() * 1000.0,
            "the live sequence copied for the disk cache"
        );
        let held = self.cached.clone();
        self.write_to_disk(&held, &state, CacheEntryKind::Snapshot);
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
