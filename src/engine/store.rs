//! The state store: KV states of other prompts, kept in host RAM, so a request with another
//! prefix (a summary job between turns, a second conversation) no longer costs the
//! conversation its cache, and checkpoints of prompts for models whose cache cannot be cut.
//!
//! Entries are found by comparing tokens, never by a hash: an entry is only ever used for the
//! exact prefix it shares with the new prompt. The byte budget is never exceeded; the least
//! recently used entries go first, and the token lists of the last evicted ones are kept to
//! explain a miss they would have served.

use std::collections::VecDeque;
use std::time::SystemTime;

use llama_cpp_2::token::LlamaToken;

use super::policy::StoredView;
use super::prefix::plan_reuse;
use super::CacheEntryKind as EntryKind;

/// Evicted entries whose token lists are kept to explain misses (a few KiB each).
const EVICTED_KEPT: usize = 16;

/// Prompt tokens an entry holding `tokens` lets `prompt` skip; with `whole_only`, none unless
/// the prompt continues all of it.
pub(crate) fn usable(tokens: &[LlamaToken], prompt: &[LlamaToken], whole_only: bool) -> usize {
    let reusable = plan_reuse(tokens, prompt);
    if whole_only && reusable < tokens.len() {
        0
    } else {
        reusable
    }
}

/// A saved state's size in host memory.
pub(crate) trait StateBytes {
    /// Bytes held.
    fn byte_len(&self) -> usize;
}

/// One saved sequence: exactly the tokens its state holds, position by position.
#[derive(Debug)]
pub(crate) struct Entry<S> {
    /// The tokens the state holds.
    pub(crate) tokens: Vec<LlamaToken>,
    /// The sequence state.
    pub(crate) state: S,
    /// Why it was saved.
    pub(crate) kind: EntryKind,
    /// When it was saved or last restored (the store's clock).
    last_used: u64,
    /// The same, in wall-clock time.
    pub(crate) used_at: SystemTime,
}

/// Saved states under a byte budget, least recently used evicted first.
#[derive(Debug)]
pub(crate) struct StateStore<S> {
    entries: Vec<Entry<S>>,
    budget: usize,
    used: usize,
    clock: u64,
    /// Only entries a prompt continues in full are usable (the model's cache cannot be cut
    /// after a restore), so a shorter entry is never made redundant by a longer one.
    whole_only: bool,
    /// Token lists of the last evicted entries, newest last.
    evicted: VecDeque<Vec<LlamaToken>>,
}

impl<S: StateBytes> StateStore<S> {
    /// An empty store that never holds more than `budget` bytes; `whole_only`: entries serve
    /// only prompts that continue them in full.
    pub(crate) fn new(budget: usize, whole_only: bool) -> Self {
        Self { entries: Vec::new(), budget, used: 0, clock: 0, whole_only, evicted: VecDeque::new() }
    }

    /// The byte budget.
    pub(crate) fn budget(&self) -> usize {
        self.budget
    }

    /// Entries held.
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    /// Bytes held.
    pub(crate) fn used(&self) -> usize {
        self.used
    }

    /// The entries, in no particular order.
    pub(crate) fn entries(&self) -> impl Iterator<Item = &Entry<S>> {
        self.entries.iter()
    }

    /// The entries as the cache policy sees them.
    pub(crate) fn views(&self) -> Vec<StoredView<'_>> {
        self.entries
            .iter()
            .enumerate()
            .map(|(index, entry)| StoredView {
                index,
                tokens: &entry.tokens,
                bytes: entry.state.byte_len(),
                last_used: entry.last_used,
            })
            .collect()
    }

    /// Token lists of the last evicted entries (to explain a miss they would have served).
    pub(crate) fn evicted(&self) -> Vec<&[LlamaToken]> {
        self.evicted.iter().map(Vec::as_slice).collect()
    }

    /// The entry at `index`, to restore: a snapshot leaves the store (it becomes the live
    /// sequence; saved again when that is displaced), a checkpoint stays and counts as used.
    pub(crate) fn restore(&mut self, index: usize) -> Restored<'_, S> {
        if self.entries[index].kind == EntryKind::Snapshot {
            return Restored::Taken(self.remove(index));
        }
        self.clock += 1;
        let entry = &mut self.entries[index];
        entry.last_used = self.clock;
        entry.used_at = SystemTime::now();
        Restored::Kept(entry)
    }

    /// Drops the entry at `index`, a state that could not be restored: it is never offered
    /// again (nor remembered as evicted).
    pub(crate) fn discard(&mut self, index: usize) {
        self.remove(index);
    }

    fn remove(&mut self, index: usize) -> Entry<S> {
        let entry = self.entries.swap_remove(index);
        self.used -= entry.state.byte_len();
        entry
    }

    /// Saves a state, evicting the least recently used entries until it fits beside
    /// `reserved` bytes held elsewhere under the same budget (states waiting for the disk
    /// writer). An entry with the same tokens goes, and so does one that is a prefix of the new
    /// one where entries can be cut (the new one serves everything it did). False, and nothing
    /// stored or evicted, when the state and the reserved bytes alone exceed the budget.
    pub(crate) fn insert(&mut self, tokens: Vec<LlamaToken>, state: S, kind: EntryKind, reserved: usize) -> bool {
        let bytes = state.byte_len();
        let Some(budget) = self.budget.checked_sub(reserved).filter(|&budget| bytes <= budget) else {
            return false;
        };
        let mut i = 0;
        while i < self.entries.len() {
            let old = &self.entries[i].tokens;
            let served = if self.whole_only { *old == tokens } else { tokens.starts_with(old) };
            if served {
                self.remove(i);
            } else {
                i += 1;
            }
        }
        while self.used + bytes > budget {
            let oldest = self
                .entries
                .iter()
                .enumerate()
                .min_by_key(|(_, entry)| entry.last_used)
                .map(|(index, _)| index)
                .expect("a store over budget holds entries");
            let evicted = self.remove(oldest);
            if self.evicted.len() == EVICTED_KEPT {
                self.evicted.pop_front();
            }
            self.evicted.push_back(evicted.tokens);
        }
        self.clock += 1;
        self.used += bytes;
        self.evicted.retain(|evicted| *evicted != tokens);
        self.entries.push(Entry { tokens, state, kind, last_used: self.clock, used_at: SystemTime::now() });
        true
    }
}

/// An entry being restored.
#[derive(Debug)]
pub(crate) enum Restored<'s, S> {
    /// A snapshot, out of the store.
    Taken(Entry<S>),
    /// A checkpoint, still in the store.
    Kept(&'s Entry<S>),
}

#[cfg(test)]
mod tests;
