//! The scheduler's rules, model-free: examples of each, then property tests of its invariants
//! over any set of waiting sequences.

use std::collections::HashSet;
use std::time::Duration;

use proptest::prelude::*;

use super::*;

const MS: Duration = Duration::from_millis(1);

/// SmolLM2 on two threads, roughly: 11 ms a step, 3 ms a prompt token.
const COST: StepCost = StepCost { per_step: Duration::from_millis(11), per_token: Duration::from_millis(3) };

const LIMITS: Limits = Limits { n_batch: 512, min_gap: Duration::from_millis(83), min_chunk: 8 };

fn prompt(seq: SeqId, waiter: Waiter, since_ms: u64, remaining: u32) -> Pending {
    Pending { seq, waiter, since: MS * since_ms as u32, need: Need::Prompt { remaining } }
}

/// A reply that has streamed one token, at `last_ms`.
fn reply(seq: SeqId, waiter: Waiter, last_ms: u64, wanted: u32) -> Pending {
    let last_at = MS * last_ms as u32;
    Pending {
        seq,
        waiter,
        since: Duration::ZERO,
        need: Need::Token { last_at, wanted, first_at: last_at, produced: 1 },
    }
}

#[test]
fn nothing_waits_nothing_is_computed() {
    assert!(next_batch(Duration::ZERO, &[], COST, LIMITS).is_empty());
}

#[test]
fn a_prompt_alone_takes_the_whole_batch() {
    let batch = next_batch(Duration::ZERO, &[prompt(0, Waiter::Person, 0, 1500)], COST, LIMITS);
    assert_eq!(batch.entries, vec![Entry { seq: 0, work: Work::Prompt, tokens: 512 }]);
}

#[test]
fn a_new_speaker_shares_the_step_of_a_streaming_reply() {
    // A streams (its last token 10 ms ago); B's warm prompt has 20 tokens left, which after
    // A's token (14 ms) in a call of its own would take 11 ms + 20 × 3 ms: more than A's gap
    // leaves.
    let now = MS * 110;
    let pending = [reply(0, Waiter::Person, 100, 1), prompt(1, Waiter::Person, 105, 20)];
    let batch = next_batch(now, &pending, COST, LIMITS);
    assert_eq!(batch.entry(0), Some(&Entry { seq: 0, work: Work::Reply, tokens: 1 }));
    let b = batch.entry(1).expect("the new speaker's prompt is in the batch");
    assert_eq!(b.work, Work::Prompt);
    // 183 ms due − 110 ms now = 73 ms; minus A's token (14 ms) and the prompt call's own 11 ms
    // leaves 48 ms: 16 tokens.
    assert_eq!(b.tokens, 16);
    assert!(batch.time(COST) <= MS * 73);
    assert_eq!(batch.replies_beside(1), 1);
}

#[test]
fn a_short_prompt_is_evaluated_whole_beside_a_reply() {
    let pending = [reply(0, Waiter::Person, 100, 1), prompt(1, Waiter::Person, 105, 6)];
    let batch = next_batch(MS * 110, &pending, COST, LIMITS);
    assert_eq!(batch.entry(1).map(|e| e.tokens), Some(6));
}

#[test]
fn a_reply_already_late_still_lets_the_minimum_chunk_through() {
    let pending = [reply(0, Waiter::Person, 0, 1), prompt(1, Waiter::Person, 5, 300)];
    let batch = next_batch(MS * 500, &pending, COST, LIMITS);
    assert_eq!(batch.entry(0).map(|e| e.tokens), Some(1));
    assert_eq!(batch.entry(1).map(|e| e.tokens), Some(LIMITS.min_chunk));
}

#[test]
fn nobody_s_work_yields_to_a_person_s_prompt() {
    let pending =
        [reply(0, Waiter::Nobody, 0, 1), prompt(1, Waiter::Nobody, 0, 100), prompt(2, Waiter::Person, 50, 40)];
    let batch = next_batch(MS * 60, &pending, COST, LIMITS);
    assert_eq!(batch.entries, vec![Entry { seq: 2, work: Work::Prompt, tokens: 40 }]);
}

#[test]
fn nobody_s_work_runs_when_no_person_waits() {
    let pending = [reply(0, Waiter::Nobody, 0, 1), prompt(1, Waiter::Nobody, 0, 100)];
    let batch = next_batch(MS * 60, &pending, COST, LIMITS);
    assert_eq!(batch.entry(0).map(|e| e.tokens), Some(1));
    assert_eq!(batch.entry(1).map(|e| e.tokens), Some(100));
}

#[test]
fn prompts_are_served_in_the_order_they_were_admitted() {
    let pending = [prompt(1, Waiter::Person, 20, 400), prompt(2, Waiter::Person, 10, 400)];
    let batch = next_batch(MS * 30, &pending, COST, LIMITS);
    assert_eq!(
        batch.entries,
        vec![Entry { seq: 2, work: Work::Prompt, tokens: 400 }, Entry { seq: 1, work: Work::Prompt, tokens: 112 }]
    );
}

#[test]
fn drafts_are_verified_only_by_a_reply_alone() {
    let alone = next_batch(MS * 5, &[reply(0, Waiter::Person, 0, 5)], COST, LIMITS);
    assert_eq!(alone.entry(0).map(|e| e.tokens), Some(5));
    let beside = next_batch(MS * 5, &[reply(0, Waiter::Person, 0, 5), reply(1, Waiter::Person, 0, 5)], COST, LIMITS);
    assert_eq!(beside.tokens(), 2);
}

fn waiter() -> impl Strategy<Value = Waiter> {
    prop_oneof![Just(Waiter::Person), Just(Waiter::Nobody)]
}

fn need() -> impl Strategy<Value = Need> {
    prop_oneof![
        (1u32..5000).prop_map(|remaining| Need::Prompt { remaining }),
        (0u64..2000, 1u32..9, 0u64..2000, 1u32..400).prop_map(|(last_ms, wanted, before_ms, produced)| {
            let last_at = MS * last_ms as u32;
            let first_at = last_at.saturating_sub(MS * before_ms as u32);
            Need::Token { last_at, wanted, first_at, produced }
        }),
    ]
}

prop_compose! {
    fn pending_set()(items in prop::collection::vec((waiter(), 0u64..2000, need()), 0..9)) -> Vec<Pending> {
        items
            .into_iter()
            .enumerate()
            .map(|(i, (waiter, since_ms, need))| Pending { seq: i as SeqId, waiter, since: MS * since_ms as u32, need })
            .collect()
    }
}

prop_compose! {
    /// Prompts alone, nothing streaming.
    fn prompt_set()(items in prop::collection::vec((waiter(), 0u64..2000, 1u32..5000), 0..9)) -> Vec<Pending> {
        items
            .into_iter()
            .enumerate()
            .map(|(i, (waiter, since_ms, remaining))| Pending {
                seq: i as SeqId,
                waiter,
                since: MS * since_ms as u32,
                need: Need::Prompt { remaining },
            })
            .collect()
    }
}

prop_compose! {
    fn cost()(step_ms in 0u64..40, token_us in 0u64..20_000) -> StepCost {
        StepCost { per_step: MS * step_ms as u32, per_token: Duration::from_micros(token_us) }
    }
}

prop_compose! {
    fn limits()(n_batch in 16u32..2048, gap_ms in 20u64..500, min_chunk in 1u32..64) -> Limits {
        Limits { n_batch, min_gap: MS * gap_ms as u32, min_chunk }
    }
}

fn oldest_person_prompt(pending: &[Pending]) -> Option<&Pending> {
    pending
        .iter()
        .filter(|p| p.waiter == Waiter::Person && matches!(p.need, Need::Prompt { .. }))
        .min_by_key(|p| (p.since, p.seq))
}

proptest! {
    #[test]
    fn a_batch_is_well_formed(pending in pending_set(), now_ms in 0u64..3000, cost in cost(), limits in limits()) {
        let batch = next_batch(MS * now_ms as u32, &pending, cost, limits);
        prop_assert!(batch.tokens() <= limits.n_batch);
        let mut seen = HashSet::new();
        for entry in &batch.entries {
            prop_assert!(seen.insert(entry.seq), "{} twice", entry.seq);
            prop_assert!(entry.tokens >= 1);
            let p = pending.iter().find(|p| p.seq == entry.seq).expect("a waiting sequence");
            match (p.need, entry.work) {
                (Need::Prompt { remaining }, Work::Prompt) => prop_assert!(entry.tokens <= remaining),
                (Need::Token { wanted, .. }, Work::Reply) => prop_assert!(entry.tokens <= wanted),
                other => prop_assert!(false, "work does not match the need: {other:?}"),
            }
        }
        prop_assert_eq!(batch.is_empty(), pending.is_empty());
    }

    #[test]
    fn every_person_s_reply_advances(pending in pending_set(), now_ms in 0u64..3000, cost in cost(), limits in limits()) {
        let replies = pending.iter().filter(|p| p.waiter == Waiter::Person && matches!(p.need, Need::Token { .. })).count();
        prop_assume!(replies as u32 <= limits.n_batch);
        let batch = next_batch(MS * now_ms as u32, &pending, cost, limits);
        for p in pending.iter().filter(|p| p.waiter == Waiter::Person) {
            if let Need::Token { .. } = p.need {
                prop_assert!(batch.entry(p.seq).is_some(), "reply {} left out", p.seq);
            }
        }
    }

    #[test]
    fn the_oldest_person_s_prompt_always_progresses(pending in pending_set(), now_ms in 0u64..3000, cost in cost(), limits in limits()) {
        let replies: u32 = pending.iter().filter(|p| matches!(p.need, Need::Token { .. })).count() as u32;
        prop_assume!(replies < limits.n_batch);
        let batch = next_batch(MS * now_ms as u32, &pending, cost, limits);
        if let Some(oldest) = oldest_person_prompt(&pending) {
            let Need::Prompt { remaining } = oldest.need else { unreachable!() };
            let entry = batch.entry(oldest.seq);
            prop_assert!(entry.is_some(), "the oldest prompt waits: {batch:?}");
            let least = remaining.min(limits.min_chunk).min(limits.n_batch - replies);
            prop_assert!(entry.map_or(0, |e| e.tokens) >= least);
        }
    }

    #[test]
    fn nobody_s_work_never_delays_a_person_s_prompt(pending in pending_set(), now_ms in 0u64..3000, cost in cost(), limits in limits()) {
        prop_assume!(oldest_person_prompt(&pending).is_some());
        let batch = next_batch(MS * now_ms as u32, &pending, cost, limits);
        for entry in &batch.entries {
            let p = pending.iter().find(|p| p.seq == entry.seq).expect("a waiting sequence");
            prop_assert_eq!(p.waiter, Waiter::Person, "{:?} of nobody beside a person's prompt", entry);
        }
    }

    #[test]
    fn streaming_replies_keep_the_floor(pending in pending_set(), now_ms in 0u64..3000, cost in cost(), limits in limits()) {
        let now = MS * now_ms as u32;
        let batch = next_batch(now, &pending, cost, limits);
        let due = batch
            .entries
            .iter()
            .filter_map(|entry| pending.iter().find(|p| p.seq == entry.seq))
            .filter_map(|p| match (p.waiter, p.need) {
                (Waiter::Person, need @ Need::Token { .. }) => reader_due(need, limits.min_gap),
                _ => None,
            })
            .min();
        if let Some(due) = due {
            // The step ends by the due time, unless the replies and the minimum chunk alone
            // already take longer.
            let replies: u32 = batch.entries.iter().filter(|e| e.work == Work::Reply).map(|e| e.tokens).sum();
            let least = cost.of(replies) + cost.of(limits.min_chunk);
            let predicted = batch.time(cost);
            prop_assert!(predicted <= due.saturating_sub(now).max(least), "{predicted:?} past {due:?} at {now:?}");
        }
    }

    #[test]
    fn with_nothing_streaming_a_prompt_gets_all_the_room(pending in prompt_set(), now_ms in 0u64..3000, cost in cost(), limits in limits()) {
        let batch = next_batch(MS * now_ms as u32, &pending, cost, limits);
        let waiter = if oldest_person_prompt(&pending).is_some() { Waiter::Person } else { Waiter::Nobody };
        let total: u32 = pending
            .iter()
            .filter(|p| p.waiter == waiter)
            .map(|p| match p.need { Need::Prompt { remaining } => remaining, Need::Token { .. } => 0 })
            .sum();
        prop_assert_eq!(batch.tokens(), total.min(limits.n_batch));
    }

    #[test]
    fn more_slack_never_means_a_smaller_chunk(pending in pending_set(), now_ms in 0u64..3000, earlier_ms in 0u64..3000, cost in cost(), limits in limits()) {
        let now = MS * now_ms as u32;
        let earlier = MS * now_ms.min(earlier_ms) as u32;
        let later = next_batch(now, &pending, cost, limits);
        let sooner = next_batch(earlier, &pending, cost, limits);
        prop_assert!(sooner.tokens() >= later.tokens());
    }
}

#[test]
fn a_reply_ahead_of_speech_lends_a_new_speaker_the_time_it_banked() {
    // A streamed 100 tokens in 1.5 s: at 83 ms a token its reader has 8.3 s of text, so B's
    // 120-token prompt goes whole into the next step, not 16 tokens at a time.
    let ahead = Pending {
        seq: 0,
        waiter: Waiter::Person,
        since: Duration::ZERO,
        need: Need::Token { last_at: MS * 1500, wanted: 1, first_at: Duration::ZERO, produced: 100 },
    };
    let batch = next_batch(MS * 1510, &[ahead, prompt(1, Waiter::Person, 1505, 120)], COST, LIMITS);
    assert_eq!(batch.entry(1).map(|e| e.tokens), Some(120));
    // The same reply with only its first token out: its reader needs the next in 83 ms.
    let fresh = reply(0, Waiter::Person, 1500, 1);
    let batch = next_batch(MS * 1510, &[fresh, prompt(1, Waiter::Person, 1505, 120)], COST, LIMITS);
    assert!(batch.entry(1).map_or(0, |e| e.tokens) < 120);
    assert_eq!(reader_due(ahead.need, LIMITS.min_gap), Some(MS * 8300));
}
