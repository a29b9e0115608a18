//! The store's matching, budget and eviction, on fake states of a given size.

use llama_cpp_2::token::LlamaToken;

use super::{Candidate, StateBytes, StateStore};

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

#[test]
fn the_entry_sharing_the_longest_prefix_wins_and_only_for_what_it_shares() {
    let mut store = StateStore::new(100);
    assert!(store.insert(tokens(&[1, 2, 3, 4]), Fake(10, "a")));
    assert!(store.insert(tokens(&[1, 2, 9, 9, 9]), Fake(10, "b")));
    let best = store.best(&tokens(&[1, 2, 3, 4, 5, 6]), false).expect("a match");
    assert_eq!(best.reusable, 4);
    assert_eq!(store.take(best.index).state, Fake(10, "a"));
    // Shares 2 tokens with "b": usable for exactly 2, never beyond.
    assert_eq!(store.best(&tokens(&[1, 2, 7]), false), Some(Candidate { index: 0, reusable: 2 }));
    assert_eq!(store.best(&tokens(&[5, 6]), false), None);
}

#[test]
fn at_least_the_last_prompt_token_is_left_to_evaluate() {
    let mut store = StateStore::new(100);
    store.insert(tokens(&[1, 2, 3]), Fake(1, "a"));
    assert_eq!(store.best(&tokens(&[1, 2, 3]), false).map(|c| c.reusable), Some(2));
}

#[test]
fn whole_only_skips_entries_the_prompt_leaves_early() {
    let mut store = StateStore::new(100);
    store.insert(tokens(&[1, 2, 3, 4]), Fake(1, "long"));
    store.insert(tokens(&[1, 2]), Fake(1, "short"));
    // "short" is a prefix of nothing new here, so both stay.
    let best = store.best(&tokens(&[1, 2, 3, 9]), true).expect("the whole short entry");
    assert_eq!(best.reusable, 2);
    assert_eq!(store.take(best.index).state, Fake(1, "short"));
}

#[test]
fn the_budget_is_never_exceeded_and_the_least_recently_used_go_first() {
    let mut store = StateStore::new(30);
    store.insert(tokens(&[1]), Fake(10, "a"));
    store.insert(tokens(&[2]), Fake(10, "b"));
    store.insert(tokens(&[3]), Fake(10, "c"));
    assert_eq!((store.len(), store.used()), (3, 30));
    store.insert(tokens(&[4]), Fake(15, "d"));
    assert!(store.used() <= 30);
    // "a" and "b" (the oldest) made room; "c" and "d" remain.
    assert!(store.best(&tokens(&[1, 0]), false).is_none() && store.best(&tokens(&[2, 0]), false).is_none());
    assert!(store.best(&tokens(&[3, 0]), false).is_some() && store.best(&tokens(&[4, 0]), false).is_some());
}

#[test]
fn a_state_larger_than_the_budget_is_skipped_and_evicts_nothing() {
    let mut store = StateStore::new(10);
    store.insert(tokens(&[1]), Fake(5, "a"));
    assert!(!store.insert(tokens(&[2]), Fake(11, "big")));
    assert_eq!((store.len(), store.used()), (1, 5));
}

#[test]
fn a_longer_save_of_the_same_conversation_replaces_its_prefix() {
    let mut store = StateStore::new(100);
    store.insert(tokens(&[1, 2]), Fake(5, "turn 1"));
    store.insert(tokens(&[1, 2, 3, 4]), Fake(8, "turn 2"));
    assert_eq!((store.len(), store.used()), (1, 8));
}
