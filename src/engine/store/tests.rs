//! The store's matching, budget and eviction, on fake states of a given size.

use llama_cpp_2::token::LlamaToken;

use super::{EntryKind, Restored, StateBytes, StateStore};
use crate::engine::policy::{best_entry, evicted_reusable};

/// The best entry for a prompt: its index and the prompt tokens it lets the prompt skip.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Candidate {
    index: usize,
    reusable: usize,
}

impl<S: StateBytes> StateStore<S> {
    /// The entry the cache policy would pick for `prompt` (no margin).
    fn best(&self, prompt: &[LlamaToken]) -> Option<Candidate> {
        best_entry(&self.views(), prompt, self.whole_only, |_, _| true)
            .map(|(entry, reusable)| Candidate { index: entry.index, reusable })
    }

    /// What the last evicted entries would have spared `prompt`.
    fn evicted_reusable(&self, prompt: &[LlamaToken]) -> usize {
        evicted_reusable(&self.evicted(), prompt, self.whole_only)
    }
}

/// A state of `.0` bytes, tagged so tests can tell entries apart.
#[derive(Debug, PartialEq)]
struct Fake(usize, &'static str);

impl StateBytes for Fake {
    fn byte_len(&self) -> usize {
        self.0
    }
}

fn tokens(ids: &[i32]) -> Vec<LlamaToken> {
    ids.iter().copied().map(LlamaToken).collect()
}

/// A store of snapshots (entries usable for any prefix they share) unless `whole_only`.
fn store(budget: usize, whole_only: bool) -> StateStore<Fake> {
    StateStore::new(budget, whole_only)
}

fn snapshot(store: &mut StateStore<Fake>, ids: &[i32], bytes: usize, tag: &'static str) -> bool {
    store.insert(tokens(ids), Fake(bytes, tag), EntryKind::Snapshot, 0)
}

/// The tag of the entry restored at `index`, and whether it stayed in the store.
fn restore(store: &mut StateStore<Fake>, index: usize) -> (&'static str, bool) {
    match store.restore(index) {
        Restored::Taken(entry) => (entry.state.1, false),
        Restored::Kept(entry) => (entry.state.1, true),
    }
}

#[test]
fn the_entry_sharing_the_longest_prefix_wins_and_only_for_what_it_shares() {
    let mut store = store(100, false);
    assert!(snapshot(&mut store, &[1, 2, 3, 4], 10, "a"));
    assert!(snapshot(&mut store, &[1, 2, 9, 9, 9], 10, "b"));
    let best = store.best(&tokens(&[1, 2, 3, 4, 5, 6])).expect("a match");
    assert_eq!(best.reusable, 4);
    assert_eq!(restore(&mut store, best.index), ("a", false));
    // Shares 2 tokens with "b": usable for exactly 2, never beyond.
    assert_eq!(store.best(&tokens(&[1, 2, 7])), Some(Candidate { index: 0, reusable: 2 }));
    assert_eq!(store.best(&tokens(&[5, 6])), None);
}

#[test]
fn at_least_the_last_prompt_token_is_left_to_evaluate() {
    let mut store = store(100, false);
    snapshot(&mut store, &[1, 2, 3], 1, "a");
    assert_eq!(store.best(&tokens(&[1, 2, 3])).map(|c| c.reusable), Some(2));
}

#[test]
fn whole_only_skips_entries_the_prompt_leaves_early() {
    let mut store = store(100, true);
    snapshot(&mut store, &[1, 2, 3, 4], 1, "long");
    snapshot(&mut store, &[1, 2], 1, "short");
    let best = store.best(&tokens(&[1, 2, 3, 9])).expect("the whole short entry");
    assert_eq!(best.reusable, 2);
    assert_eq!(restore(&mut store, best.index), ("short", false));
    // An entry the prompt continues in full but ends with is not usable either: the
    // prompt's last token must be evaluated.
    assert_eq!(store.best(&tokens(&[1, 2, 3, 4])), None);
}

#[test]
fn the_budget_is_never_exceeded_and_the_least_recently_used_go_first() {
    let mut store = store(30, false);
    snapshot(&mut store, &[1], 10, "a");
    snapshot(&mut store, &[2], 10, "b");
    snapshot(&mut store, &[3], 10, "c");
    assert_eq!((store.len(), store.used()), (3, 30));
    snapshot(&mut store, &[4], 15, "d");
    assert!(store.used() <= 30);
    // "a" and "b" (the oldest) made room; "c" and "d" remain.
    assert!(store.best(&tokens(&[1, 0])).is_none() && store.best(&tokens(&[2, 0])).is_none());
    assert!(store.best(&tokens(&[3, 0])).is_some() && store.best(&tokens(&[4, 0])).is_some());
}

#[test]
fn a_restored_checkpoint_counts_as_used_and_outlives_older_entries() {
    let mut store = store(20, true);
    store.insert(tokens(&[1, 2]), Fake(10, "checkpoint"), EntryKind::Checkpoint, 0);
    snapshot(&mut store, &[3, 4], 10, "snapshot");
    let best = store.best(&tokens(&[1, 2, 5])).expect("the checkpoint");
    assert_eq!(restore(&mut store, best.index), ("checkpoint", true));
    assert_eq!(store.len(), 2, "a checkpoint stays in the store");
    // Restoring made the checkpoint the most recently used: the snapshot goes first.
    snapshot(&mut store, &[6, 7], 10, "new");
    assert!(store.best(&tokens(&[1, 2, 5])).is_some());
    assert!(store.best(&tokens(&[3, 4, 5])).is_none());
}

#[test]
fn evicted_entries_still_explain_a_miss() {
    let mut store = store(10, false);
    snapshot(&mut store, &[1, 2, 3, 4], 10, "a");
    assert_eq!(store.evicted_reusable(&tokens(&[1, 2, 3, 4, 5])), 0, "nothing evicted yet");
    snapshot(&mut store, &[7, 8], 10, "b");
    assert_eq!(store.best(&tokens(&[1, 2, 3, 4, 5])), None);
    assert_eq!(store.evicted_reusable(&tokens(&[1, 2, 3, 4, 5])), 4);
    // Saved again, it is no longer counted as evicted.
    snapshot(&mut store, &[1, 2, 3, 4], 10, "a again");
    assert_eq!(store.evicted_reusable(&tokens(&[1, 2, 3, 4, 5])), 0);
}

#[test]
fn a_state_larger_than_the_budget_is_skipped_and_evicts_nothing() {
    let mut store = store(10, false);
    snapshot(&mut store, &[1], 5, "a");
    assert!(!snapshot(&mut store, &[2], 11, "big"));
    assert_eq!((store.len(), store.used()), (1, 5));
}

#[test]
fn a_longer_save_of_the_same_conversation_replaces_its_prefix() {
    let mut store = store(100, false);
    snapshot(&mut store, &[1, 2], 5, "turn 1");
    snapshot(&mut store, &[1, 2, 3, 4], 8, "turn 2");
    assert_eq!((store.len(), store.used()), (1, 8));
}

#[test]
fn where_entries_serve_only_whole_a_prefix_entry_stays_and_a_duplicate_goes() {
    let mut store = store(100, true);
    store.insert(tokens(&[1, 2]), Fake(5, "checkpoint"), EntryKind::Checkpoint, 0);
    snapshot(&mut store, &[1, 2, 3, 4], 8, "snapshot");
    assert_eq!(store.len(), 2, "the shorter entry serves prompts that leave the longer one early");
    store.insert(tokens(&[1, 2]), Fake(6, "checkpoint again"), EntryKind::Checkpoint, 0);
    assert_eq!((store.len(), store.used()), (2, 14));
}

/// Property tests: any sequence of saves and restores.
mod properties {
    use proptest::collection::vec;
    use proptest::prelude::*;

    use super::super::usable;
    use super::*;

    fn few_tokens() -> impl Strategy<Value = Vec<LlamaToken>> {
        vec((0..3).prop_map(LlamaToken), 0..6)
    }

    #[derive(Clone, Debug)]
    enum Step {
        Save {
            tokens: Vec<LlamaToken>,
            bytes: usize,
            checkpoint: bool,
            /// Bytes held by states waiting for the disk writer, under the same budget.
            reserved: usize,
        },
        /// Restores the best entry for this prompt, if any.
        Serve(Vec<LlamaToken>),
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            (few_tokens(), 0..40usize, any::<bool>(), prop_oneof![Just(0), 0..40usize])
                .prop_map(|(tokens, bytes, checkpoint, reserved)| Step::Save { tokens, bytes, checkpoint, reserved }),
            few_tokens().prop_map(Step::Serve),
        ]
    }

    proptest! {
        #[test]
        fn an_entry_serves_only_a_prefix_it_shares_and_whole_only_all_or_nothing(
            tokens in few_tokens(),
            prompt in few_tokens(),
        ) {
            let any_prefix = usable(&tokens, &prompt, false);
            prop_assert!(any_prefix < prompt.len().max(1));
            prop_assert_eq!(&tokens[..any_prefix], &prompt[..any_prefix]);
            let whole = usable(&tokens, &prompt, true);
            prop_assert!(whole == 0 || (whole == tokens.len() && whole == any_prefix));
        }

        #[test]
        fn the_store_keeps_its_budget_and_offers_the_best_entry(
            budget in 0..60usize,
            whole_only in any::<bool>(),
            steps in vec(step(), 0..12),
        ) {
            let mut store = store(budget, whole_only);
            for step in steps {
                match step {
                    Step::Save { tokens, bytes, checkpoint, reserved } => {
                        let kind = if checkpoint { EntryKind::Checkpoint } else { EntryKind::Snapshot };
                        let fits = bytes + reserved <= budget;
                        prop_assert_eq!(store.insert(tokens.clone(), Fake(bytes, "saved"), kind, reserved), fits);
                        // Saved and pending states together stay within the budget (F6).
                        if fits {
                            prop_assert!(store.used() + reserved <= budget);
                        }
                        // A saved entry serves any prompt that continues it.
                        let continued = [tokens.clone(), vec![LlamaToken(9)]].concat();
                        if fits && !tokens.is_empty() {
                            prop_assert_eq!(store.best(&continued).map(|c| c.reusable), Some(tokens.len()));
                        }
                    }
                    Step::Serve(prompt) => {
                        let most = store.entries().map(|e| usable(&e.tokens, &prompt, whole_only)).max().unwrap_or(0);
                        match store.best(&prompt) {
                            Some(best) => {
                                prop_assert_eq!(best.reusable, most);
                                let entry = store.entries().nth(best.index).expect("the best entry is held");
                                prop_assert_eq!(usable(&entry.tokens, &prompt, whole_only), most);
                                store.restore(best.index);
                            }
                            None => prop_assert_eq!(most, 0),
                        }
                    }
                }
                prop_assert!(store.used() <= store.budget());
                prop_assert_eq!(store.used(), store.entries().map(|e| e.state.0).sum::<usize>());
                prop_assert_eq!(store.len(), store.entries().count());
            }
        }
    }
}
