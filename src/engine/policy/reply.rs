//! Barge-in: a voice client cancels the reply when the user interrupts and sends the next turn
//! with the assistant message cut to what was spoken, so the new prompt leaves the cache inside
//! the reply. Two decisions, from token positions alone:
//!
//! - [`reply_cut`]: whether a prompt cuts the reply the live sequence ends with, and where (to
//!   explain it: `timings.cache.reason` is `reply-cut`).
//! - [`reply_checkpoint_due`]: whether to checkpoint a reply while it is generated, on a model
//!   whose live cache cannot be cut everywhere (recurrent state; a sliding window that already
//!   dropped positions), so such a cut restarts from the newest checkpoint before it instead of
//!   the prompt's end. Every [`REPLY_CHECKPOINT_EVERY`] reply tokens, at most
//!   [`MOST_REPLY_CHECKPOINTS`] per reply; each is a store entry like any checkpoint, counted
//!   against the store's budget and evicted least recently used first.

use llama_cpp_2::token::LlamaToken;

use super::{CacheShape, LiveView};
use crate::engine::prefix::common_prefix_len;

/// Reply tokens between two checkpoints of a reply (where the model takes them): a cut
/// re-evaluates fewer than this many of the spoken reply's tokens.
pub(crate) const REPLY_CHECKPOINT_EVERY: usize = 32;

/// Most checkpoints taken inside one reply: a reply is cut where the user interrupts, early in
/// it as a rule, and each checkpoint is a copy of the whole state.
pub(crate) const MOST_REPLY_CHECKPOINTS: usize = 8;

/// Where a prompt cuts the reply the live sequence holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Cut {
    /// Reply tokens the prompt keeps (it leaves the reply after them).
    pub(crate) kept: usize,
    /// Reply tokens the live sequence held.
    pub(crate) held: usize,
}

/// Whether `prompt` leaves `live` inside its last reply (`reply`: the positions the reply's
/// evaluated tokens hold), and where: a barge-in's next turn, whose assistant message is cut
/// to what was spoken. `None` when it leaves before the reply or at its first token (history
/// changed: a reply rewritten, or left out), at or after its end (the reply was sent back
/// whole), or not at all.
pub(crate) fn reply_cut(live: &[LlamaToken], reply: Option<(usize, usize)>, prompt: &[LlamaToken]) -> Option<Cut> {
    let (start, end) = reply?;
    let end = end.min(live.len());
    let shared = common_prefix_len(live, prompt);
    (shared > start && shared < end && shared < prompt.len()).then_some(Cut { kept: shared - start, held: end - start })
}

/// Whether to checkpoint the reply that started at position `reply_start` now that the live
/// sequence holds `live.tokens` (`checkpoints`: the model takes them at all; `min_save`: the
/// shortest sequence worth saving). Only where the live cache could not be cut there later: a
/// recurrent model's (it rolls back only within the last batch) or a sliding window's that
/// already dropped positions (the small SWA cache keeps about one window and one batch).
pub(crate) fn reply_checkpoint_due(
    shape: CacheShape,
    checkpoints: bool,
    live: LiveView<'_>,
    reply_start: usize,
    min_save: usize,
) -> bool {
    let cut_limited = shape.recurrent || (shape.n_swa.is_some() && live.pos_min > 0);
    let held = live.tokens.len();
    let generated = held.saturating_sub(reply_start);
    checkpoints
        && cut_limited
        && held >= min_save
        && generated > 0
        && generated % REPLY_CHECKPOINT_EVERY == 0
        && generated / REPLY_CHECKPOINT_EVERY <= MOST_REPLY_CHECKPOINTS
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::engine::policy::{plan_prompt, Derivation, RestoreCosts, Rules, Source, StoredView, Stores};

    fn run(from: i32, n: usize) -> Vec<LlamaToken> {
        (from..from + n as i32).map(LlamaToken).collect()
    }

    const RECURRENT: CacheShape = CacheShape { recurrent: true, n_swa: None };
    const ATTENTION: CacheShape = CacheShape { recurrent: false, n_swa: None };
    const SWA: CacheShape = CacheShape { recurrent: false, n_swa: Some(512) };

    fn view(tokens: &[LlamaToken], pos_min: i32) -> LiveView<'_> {
        LiveView { tokens, rewindable: 0, pos_min, reply_start: None }
    }

    #[test]
    fn a_prompt_that_leaves_inside_the_reply_cuts_it() {
        let prompt1 = run(0, 100);
        let live = [prompt1.clone(), run(1000, 40)].concat();
        // The spoken part: 12 reply tokens, then a word cut short and the next user turn.
        let next = [prompt1.clone(), run(1000, 12), run(5000, 8)].concat();
        assert_eq!(reply_cut(&live, Some((100, 140)), &next), Some(Cut { kept: 12, held: 40 }));
        // After its first token.
        let first = [prompt1.clone(), run(1000, 1), run(5000, 8)].concat();
        assert_eq!(reply_cut(&live, Some((100, 140)), &first), Some(Cut { kept: 1, held: 40 }));
    }

    #[test]
    fn other_departures_are_no_cut() {
        let prompt1 = run(0, 100);
        let live = [prompt1.clone(), run(1000, 40), run(2000, 5)].concat();
        let reply = Some((100, 140));
        // Before the reply, or at its first token (rewritten): the history changed.
        assert_eq!(reply_cut(&live, reply, &[run(0, 50), run(5000, 8)].concat()), None);
        assert_eq!(reply_cut(&live, reply, &[prompt1.clone(), run(5000, 8)].concat()), None);
        // The reply sent back whole, then another turn than the anticipated one.
        assert_eq!(reply_cut(&live, reply, &[prompt1.clone(), run(1000, 40), run(5000, 3)].concat()), None);
        // The prompt continues the cache.
        assert_eq!(reply_cut(&live, reply, &[live.clone(), run(5000, 3)].concat()), None);
        // No reply known.
        assert_eq!(reply_cut(&live, None, &[prompt1, run(1000, 12), run(5000, 8)].concat()), None);
    }

    #[test]
    fn replies_are_checkpointed_only_where_the_live_cache_cannot_be_cut() {
        let held = run(0, 100 + REPLY_CHECKPOINT_EVERY);
        assert!(reply_checkpoint_due(RECURRENT, true, view(&held, 0), 100, 32));
        assert!(!reply_checkpoint_due(RECURRENT, false, view(&held, 0), 100, 32), "the store is off");
        assert!(!reply_checkpoint_due(ATTENTION, true, view(&held, 0), 100, 32), "cut anywhere");
        assert!(!reply_checkpoint_due(SWA, true, view(&held, 0), 100, 32), "a full SWA cache is cut anywhere");
        assert!(reply_checkpoint_due(SWA, true, view(&held, 40), 100, 32), "the small SWA cache dropped some");
        assert!(!reply_checkpoint_due(RECURRENT, true, view(&held, 0), 101, 32), "between two");
        assert!(!reply_checkpoint_due(RECURRENT, true, view(&held, 0), 100, 1000), "too short to save");
        let long = run(0, 100 + REPLY_CHECKPOINT_EVERY * (MOST_REPLY_CHECKPOINTS + 1));
        assert!(!reply_checkpoint_due(RECURRENT, true, view(&long, 0), 100, 32), "past the most per reply");
    }

    proptest! {
        /// On a recurrent model, a reply checkpointed as [`reply_checkpoint_due`] says serves any
        /// cut within its checkpointed part from the newest checkpoint at or before the cut: the
        /// next turn re-evaluates fewer than [`REPLY_CHECKPOINT_EVERY`] of the spoken tokens.
        #[test]
        fn a_cut_reply_restarts_within_one_spacing_of_the_cut(
            prompt_len in 40usize..300,
            reply_len in 2usize..400,
            cut_at in 0usize..400,
        ) {
            let cut = cut_at.clamp(1, reply_len - 1);
            let prompt1 = run(0, prompt_len);
            let live = [prompt1.clone(), run(10_000, reply_len)].concat();
            // The store as the generation left it: the prompt's checkpoint, then the reply's.
            let mut saved: Vec<Vec<LlamaToken>> = vec![prompt1.clone()];
            for held in prompt_len + 1..=live.len() {
                if reply_checkpoint_due(RECURRENT, true, view(&live[..held], 0), prompt_len, 32) {
                    saved.push(live[..held].to_vec());
                }
            }
            let ram: Vec<StoredView<'_>> = saved
                .iter()
                .enumerate()
                .map(|(index, tokens)| StoredView { index, tokens, bytes: 1 << 20, last_used: index as u64 })
                .collect();
            let stores = Stores { ram: Some(ram), ..Stores::default() };
            let next = [live[..prompt_len + cut].to_vec(), run(50_000, 6)].concat();
            let rules = Rules { min_save: 32, costs: RestoreCosts::default(), changes: None };
            let plan = plan_prompt(RECURRENT, view(&live, 0), &stores, &next, Derivation::AsSent, rules);
            prop_assert_eq!(reply_cut(&live, Some((prompt_len, live.len())), &next),
                Some(Cut { kept: cut, held: reply_len }));
            prop_assert!(matches!(plan.source, Source::Ram(_)), "{:?}", plan);
            prop_assert!(plan.keep <= prompt_len + cut);
            let checkpointed = REPLY_CHECKPOINT_EVERY * MOST_REPLY_CHECKPOINTS;
            if cut <= checkpointed {
                prop_assert!(plan.keep + REPLY_CHECKPOINT_EVERY > prompt_len + cut, "{:?} for a cut at {}", plan, cut);
            } else {
                prop_assert_eq!(plan.keep, prompt_len + checkpointed);
            }
        }
    }
}
