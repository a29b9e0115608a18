//! The state store: KV states of other prompts, kept in host RAM, so a request with another
//! prefix (a summary job between turns, a second conversation) no longer costs the
//! conversation its cache.
//!
//! Entries are found by comparing tokens, never by a hash: an entry is only ever used for the
//! exact prefix it shares with the new prompt. The byte budget is never exceeded; the least
//! recently used entries go first.

use llama_cpp_2::context::session::SeqState;
use llama_cpp_2::token::LlamaToken;

use super::prefix::plan_reuse;

/// A saved state's size in host memory.
pub(crate) trait StateBytes {
    /// Bytes held.
    fn byte_len(&self) -> usize;
}

impl StateBytes for SeqState {
    fn byte_len(&self) -> usize {
        SeqState::byte_len(self)
    }
}

/// One saved sequence: exactly the tokens its state holds, position by position.
#[derive(Debug)]
pub(crate) struct Entry<S> {
    /// The tokens the state holds.
    pub(crate) tokens: Vec<LlamaToken>,
    /// The sequence state.
    pub(crate) state: S,
    /// When it was saved or last matched (the store's clock).
    last_used: u64,
}

/// The best entry for a prompt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Candidate {
    /// The entry's index.
    pub(crate) index: usize,
    /// Prompt tokens the entry lets the prompt skip.
    pub(crate) reusable: usize,
}

/// Saved states under a byte budget, least recently used evicted first.
#[derive(Debug)]
pub(crate) struct StateStore<S> {
    entries: Vec<Entry<S>>,
    budget: usize,
    used: usize,
    clock: u64,
}

impl<S: StateBytes> StateStore<S> {
    /// An empty store that never holds more than `budget` bytes.
    pub(crate) fn new(budget: usize) -> Self {
        Self { entries: Vec::new(), budget, used: 0, clock: 0 }
    }

    /// Entries held.
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    /// Bytes held.
    pub(crate) fn used(&self) -> usize {
        self.used
    }

    /// The entry that lets `prompt` skip the most tokens (the most recently used among equals).
    /// `whole_only`: only entries the prompt continues in full count (models whose cache cannot
    /// be cut after a restore).
    pub(crate) fn best(&self, prompt: &[LlamaToken], whole_only: bool) -> Option<Candidate> {
        self.entries
            .iter()
            .enumerate()
            .filter_map(|(index, entry)| {
                let reusable = plan_reuse(&entry.tokens, prompt);
                let usable = reusable > 0 && (!whole_only || reusable == entry.tokens.len());
                usable.then_some((Candidate { index, reusable }, entry.last_used))
            })
            .max_by_key(|(candidate, last_used)| (candidate.reusable, *last_used))
            .map(|(candidate, _)| candidate)
    }

    /// Takes an entry out (it becomes the live sequence; saved again when that is displaced).
    pub(crate) fn take(&mut self, index: usize) -> Entry<S> {
        let entry = self.entries.swap_remove(index);
        self.used -= entry.state.byte_len();
        entry
    }

    /// Saves a state, evicting the least recently used entries until it fits. An entry that is
    /// a prefix of the new one is dropped (the new one serves everything it did). False, and
    /// nothing stored or evicted, when the state alone exceeds the budget.
    pub(crate) fn insert(&mut self, tokens: Vec<LlamaToken>, state: S) -> bool {
        let bytes = state.byte_len();
        if bytes > self.budget {
            return false;
        }
        let mut i = 0;
        while i < self.entries.len() {
            if tokens.starts_with(&self.entries[i].tokens) {
                self.take(i);
            } else {
                i += 1;
            }
        }
        while self.used + bytes > self.budget {
            let oldest = self
                .entries
                .iter()
                .enumerate()
                .min_by_key(|(_, entry)| entry.last_used)
                .map(|(index, _)| index)
                .expect("a store over budget holds entries");
            self.take(oldest);
        }
        self.clock += 1;
        self.used += bytes;
        self.entries.push(Entry { tokens, state, last_used: self.clock });
        true
    }
}

#[cfg(test)]
mod tests;
