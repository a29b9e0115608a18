//! The policy's rules, model-free: examples of each decision, then property tests of the
//! invariants over any live sequence, stores and prompt.

use llama_cpp_2::token::LlamaToken;

use super::*;
use crate::engine::prefix::common_prefix_len;

fn toks(ids: &[i32]) -> Vec<LlamaToken> {
    ids.iter().copied().map(LlamaToken).collect()
}

const ATTENTION: CacheShape = CacheShape { recurrent: false, n_swa: None };
const RECURRENT: CacheShape = CacheShape { recurrent: true, n_swa: None };

fn rules(min_save: usize) -> Rules {
    Rules { min_save, costs: RestoreCosts::default(), changes: None }
}

fn live(tokens: &[LlamaToken]) -> LiveView<'_> {
    LiveView { tokens, rewindable: 0, pos_min: 0, reply_start: None }
}

fn entry(index: usize, tokens: &[LlamaToken], last_used: u64) -> StoredView<'_> {
    StoredView { index, tokens, bytes: tokens.len() * 1024, last_used }
}

/// `n` tokens counting up from `from`: distinct from any other run that does not overlap.
fn run(from: i32, n: usize) -> Vec<LlamaToken> {
    (from..from + n as i32).map(LlamaToken).collect()
}

#[test]
fn the_live_sequence_serves_a_prompt_that_continues_it() {
    let held = run(0, 100);
    let prompt = [held.clone(), run(1000, 10)].concat();
    let plan = plan_prompt(ATTENTION, live(&held), &Stores::default(), &prompt, Derivation::AsSent, rules(32));
    let expected = Plan {
        source: Source::Live,
        keep: 100,
        save_live: false,
        diverged_at: None,
        obstacle: None,
        past_changes: false,
    };
    assert_eq!(plan, expected);
}

#[test]
fn another_conversation_is_saved_and_a_stored_one_restored() {
    let a = run(0, 200);
    let b = run(5000, 200);
    let ram = vec![entry(0, &a, 1)];
    let stores = Stores { ram: Some(ram), ..Stores::default() };
    let prompt = [a.clone(), run(1000, 5)].concat();
    let plan = plan_prompt(ATTENTION, live(&b), &stores, &prompt, Derivation::AsSent, rules(32));
    assert_eq!(plan.source, Source::Ram(0));
    assert_eq!(plan.keep, 200);
    assert!(plan.save_live, "B loses everything it holds: {plan:?}");
}

#[test]
fn a_conversation_sharing_the_system_prompt_is_saved_when_another_displaces_it() {
    // B: a 2,000-token system prompt, its own 40-token turn and a 60-token reply.
    let system = run(0, 2000);
    let b = [system.clone(), run(5000, 40), run(6000, 60)].concat();
    let on = Stores { ram: Some(Vec::new()), ..Stores::default() };
    let b_live = LiveView { reply_start: Some(2040), ..live(&b) };
    // Another conversation parts at the end of the system prompt: B loses 100 tokens, fewer
    // than min_save, and is saved all the same (a restore would be chosen for it later).
    let a = [system.clone(), run(7000, 30)].concat();
    let plan = plan_prompt(ATTENTION, b_live, &on, &a, Derivation::AsSent, rules(256));
    assert_eq!((plan.source, plan.keep), (Source::Live, 2000));
    assert!(plan.save_live, "{plan:?}");
    // Fewer than the restore margin lost: nothing a restore would ever prefer, not saved.
    let small = [system.clone(), run(5000, 20), run(6000, 5)].concat();
    let small_live = LiveView { reply_start: Some(2020), ..live(&small) };
    assert!(small.len() - 2000 < RAM_RESTORE_MARGIN);
    assert!(!plan_prompt(ATTENTION, small_live, &on, &a, Derivation::AsSent, rules(256)).save_live);
    // B's own next turn: the template renders the answered turn's header differently, so the
    // prompt parts a few tokens before the reply: the same conversation moves on, not saved.
    let next = [system.clone(), run(5000, 38), run(8000, 70), run(9000, 20)].concat();
    assert!(!plan_prompt(ATTENTION, b_live, &on, &next, Derivation::AsSent, rules(256)).save_live);
    // A barge-in cuts B's reply after 10 tokens: not saved either.
    let cut = [b[..2050].to_vec(), run(9000, 20)].concat();
    assert!(!plan_prompt(ATTENTION, b_live, &on, &cut, Derivation::AsSent, rules(256)).save_live);
    // With no reply recorded (a prefill, a restored state), only min_save counts.
    assert!(!plan_prompt(ATTENTION, live(&b), &on, &a, Derivation::AsSent, rules(256)).save_live);
}

#[test]
fn the_switch_margin_follows_measured_copy_costs() {
    assert_eq!(RestoreCosts::default().switch_margin(100_000), RAM_RESTORE_MARGIN, "nothing measured yet");
    // SmolLM2 on this CPU: 23 KB a token, ~1 ms a MiB copied, ~5 ms a prompt token.
    let mut cpu = RestoreCosts::default();
    cpu.record_prefill(100, 0.5);
    cpu.record_ram(48 << 20, 2100, 0.048);
    assert_eq!(cpu.switch_margin(2100), RAM_RESTORE_MARGIN, "the copy costs ~20 prompt tokens");
    // A large model on a GPU: 128 KiB a token, 0.1 ms a MiB, 0.5 ms a prompt token: a 6K-token
    // state (768 MiB) takes ~154 ms out and back, the time of ~308 prompt tokens.
    let mut gpu = RestoreCosts::default();
    gpu.record_prefill(1000, 0.5);
    gpu.record_ram(768 << 20, 6144, 0.0768);
    assert!((300..=320).contains(&gpu.switch_margin(6144)), "{}", gpu.switch_margin(6144));
    // There another conversation displacing 100 of its 6,144 tokens is not worth a copy.
    let system = run(0, 6000);
    let b = [system.clone(), run(50_000, 44), run(60_000, 100)].concat();
    let b_live = LiveView { reply_start: Some(6044), ..live(&b) };
    let a = [system, run(70_000, 30)].concat();
    let on = Stores { ram: Some(Vec::new()), ..Stores::default() };
    let cheap =
        plan_prompt(ATTENTION, b_live, &on, &a, Derivation::AsSent, Rules { min_save: 256, costs: cpu, changes: None });
    assert!(cheap.save_live, "{cheap:?}");
    let dear =
        plan_prompt(ATTENTION, b_live, &on, &a, Derivation::AsSent, Rules { min_save: 256, costs: gpu, changes: None });
    assert!(!dear.save_live, "{dear:?}");
}

/// A conversation whose clock line (near its start) moved while another one held the live
/// sequence: with the prompt accepting a reuse past changes, its stored entry is restored and
/// reused past the clock, and the live one saved; without, it shares too little to restore.
#[test]
fn a_stored_conversation_whose_clock_moved_is_restored_past_the_change() {
    let (head, body) = (run(0, 8), run(100, 600));
    let a = [head.clone(), toks(&[50, 51]), body.clone(), run(9000, 30)].concat();
    let prompt = [head.clone(), toks(&[50, 52]), body.clone(), run(9000, 30), run(9500, 20)].concat();
    let other = run(20_000, 400);
    let stores = Stores { ram: Some(vec![entry(0, &a, 1)]), ..Stores::default() };
    let changes = Rules { changes: Some(ChangeRules::default()), ..rules(32) };
    let plan = plan_prompt(ATTENTION, live(&other), &stores, &prompt, Derivation::AsSent, changes);
    assert_eq!((plan.source, plan.past_changes), (Source::Ram(0), true), "{plan:?}");
    assert_eq!(plan.keep, a.len() - 1, "all but the changed token: {plan:?}");
    assert!(plan.save_live, "the other conversation loses all it holds: {plan:?}");
    let exact = plan_prompt(ATTENTION, live(&other), &stores, &prompt, Derivation::AsSent, rules(32));
    assert_eq!((exact.source, exact.past_changes), (Source::Live, false), "9 tokens are not worth a restore");
    // The live sequence is that conversation itself: it serves as much past the change, so
    // nothing is restored (the live sequence is reused past the change instead).
    let live_a = plan_prompt(ATTENTION, live(&a), &stores, &prompt, Derivation::AsSent, changes);
    assert_eq!((live_a.source, live_a.past_changes), (Source::Live, false), "{live_a:?}");
    // The same from a disk file (a restart, or a RAM entry evicted since).
    let on_disk = Stores { ram: Some(Vec::new()), disk: vec![entry(3, &a, 1)], ..Stores::default() };
    let disk = plan_prompt(ATTENTION, live(&other), &on_disk, &prompt, Derivation::AsSent, changes);
    assert_eq!((disk.source, disk.past_changes, disk.keep), (Source::Disk(3), true, a.len() - 1), "{disk:?}");
    // A cache that cannot be moved or cut after a restore never plans one.
    let window = CacheShape { recurrent: false, n_swa: Some(256) };
    let swa = plan_prompt(window, live(&other), &stores, &prompt, Derivation::AsSent, changes);
    assert!(!swa.past_changes, "{swa:?}");
}

#[test]
fn kept_cells_are_worth_their_attention_for_short_turns_only() {
    assert!(!kept_cost_too_much(40, 4000), "a satellite's turn beside another conversation");
    assert!(!kept_cost_too_much(1000, 150), "a long prompt beside a conversation sharing its system prompt");
    assert!(kept_cost_too_much(2300, 2300), "a new long prompt beside another long conversation");
    assert!(!kept_cost_too_much(usize::MAX, 0));
    assert!(kept_cost_too_much(usize::MAX, 2), "no overflow");
}

#[test]
fn an_entry_must_spare_the_margin_more_than_the_live_sequence() {
    let shared = run(0, 100);
    let held = [shared.clone(), run(7000, 50)].concat();
    let stored = [shared.clone(), run(8000, 20)].concat();
    let ram = vec![entry(0, &stored, 1)];
    let stores = Stores { ram: Some(ram), ..Stores::default() };
    let prompt = [stored.clone(), run(9000, 5)].concat();
    let plan = plan_prompt(ATTENTION, live(&held), &stores, &prompt, Derivation::AsSent, rules(32));
    assert_eq!((plan.source, plan.keep), (Source::Live, 100), "20 more tokens are not worth a restore");
}

#[test]
fn a_disk_file_must_beat_the_best_ram_entry_by_its_measured_margin() {
    let base = run(0, 1000);
    let ram_tokens = base[..600].to_vec();
    let ram = vec![entry(0, &ram_tokens, 1)];
    // A 100 MiB file: at 2 ms/MiB and 1 ms/token, worth 200 tokens more than the RAM entry.
    let disk = vec![StoredView { index: 3, tokens: &base, bytes: 100 << 20, last_used: 0 }];
    let stores = Stores { ram: Some(ram), disk, ..Stores::default() };
    let prompt = [base.clone(), run(9000, 5)].concat();
    let plan = plan_prompt(ATTENTION, live(&[]), &stores, &prompt, Derivation::AsSent, rules(32));
    assert_eq!((plan.source, plan.keep), (Source::Disk(3), 1000), "400 more tokens: worth the read");
    let shorter = [base[..700].to_vec(), run(9000, 5)].concat();
    let plan = plan_prompt(ATTENTION, live(&[]), &stores, &shorter, Derivation::AsSent, rules(32));
    assert_eq!(plan.source, Source::Ram(0), "the file spares only 100 more: {plan:?}");
}

#[test]
fn the_disk_margin_follows_measured_costs() {
    let mut costs = RestoreCosts::default();
    assert_eq!(costs.disk_margin(100 << 20), 200);
    assert_eq!(costs.disk_margin(1 << 20), RAM_RESTORE_MARGIN, "never below the RAM margin");
    // Measured: 100 MiB restored in 0.5 s, 1000 tokens prefilled in 0.25 s.
    costs.record_disk(100 << 20, 0.5);
    costs.record_prefill(1000, 0.25);
    assert_eq!(costs.disk_margin(100 << 20), 2000);
    // Short prefills and tiny files say nothing.
    costs.record_prefill(10, 100.0);
    costs.record_disk(1000, 100.0);
    assert_eq!(costs.disk_margin(100 << 20), 2000);
}

/// F2: with drop-oldest, conversation A shortened by its oldest turns displaces conversation
/// B's live sequence: B is saved for its next turn; A's own older form is forgotten.
#[test]
fn a_shortened_conversation_forgets_only_its_own_older_form() {
    let system = run(0, 50);
    let (a1, a2, a3) = (run(1000, 300), run(2000, 300), run(3000, 300));
    let a_full = [system.clone(), a1.clone(), a2.clone(), a3.clone()].concat();
    let a_shortened = [system.clone(), a2.clone(), a3.clone()].concat();
    let b = [system.clone(), run(5000, 400)].concat();
    let a_before = [system.clone(), a1.clone(), a2.clone()].concat();
    let stores = Stores { ram: Some(Vec::new()), ..Stores::default() };
    let shortened = Derivation::Shortened { full: &a_full };
    let plan = plan_prompt(ATTENTION, live(&b), &stores, &a_shortened, shortened, rules(32));
    assert!(plan.save_live, "B's live sequence is saved: {plan:?}");
    let plan = plan_prompt(ATTENTION, live(&a_before), &stores, &a_shortened, shortened, rules(32));
    assert!(!plan.save_live, "A's older form is forgotten: {plan:?}");
    // A shortened earlier by one turn, now by two.
    let a_earlier = [system.clone(), a2.clone()].concat();
    let a_now = [system.clone(), a3.clone()].concat();
    let plan = plan_prompt(ATTENTION, live(&a_earlier), &stores, &a_now, shortened, rules(32));
    assert!(!plan.save_live, "{plan:?}");
}

#[test]
fn a_recurrent_cache_that_cannot_be_cut_falls_back_to_a_checkpoint() {
    let opening = run(0, 100);
    let held = [opening.clone(), run(2000, 40)].concat();
    let ram = vec![entry(0, &opening, 1)];
    let stores = Stores { ram: Some(ram), ..Stores::default() };
    let prompt = [opening.clone(), run(3000, 10)].concat();
    let plan = plan_prompt(RECURRENT, live(&held), &stores, &prompt, Derivation::AsSent, rules(32));
    assert_eq!((plan.source, plan.keep), (Source::Ram(0), 100));
    let plan = plan_prompt(RECURRENT, live(&held), &Stores::default(), &prompt, Derivation::AsSent, rules(32));
    assert_eq!((plan.keep, plan.obstacle), (0, Some(CacheMiss::CannotRewind)));
}

#[test]
fn explanations_name_the_cold_cache_and_evicted_entries() {
    let prompt = run(0, 100);
    let plan = plan_prompt(ATTENTION, live(&[]), &Stores::default(), &prompt, Derivation::AsSent, rules(32));
    assert_eq!(plan.obstacle, Some(CacheMiss::Cold));
    let evicted = run(0, 90);
    let stores = Stores { ram: Some(Vec::new()), evicted: vec![&evicted], ..Stores::default() };
    let plan = plan_prompt(ATTENTION, live(&[]), &stores, &prompt, Derivation::AsSent, rules(32));
    assert_eq!(plan.obstacle, Some(CacheMiss::Evicted));
}

/// F3: on a recurrent model, partials stop before their last word and checkpoint once, at the
/// turn's opening.
#[test]
fn partial_transcripts_on_a_model_that_cannot_cut_stop_before_their_last_word() {
    let marks = PartialMarks { opening: Some(300), stable: Some(340) };
    let first = plan_evaluation(RECURRENT, true, Purpose::Partial, 350, 280, marks, 32);
    assert_eq!(first, EvaluationPlan { evaluate_to: 340, checkpoint_at: Some(300), checkpoint_end: false });
    let next =
        plan_evaluation(RECURRENT, true, Purpose::Partial, 356, 340, PartialMarks { stable: Some(346), ..marks }, 32);
    assert_eq!(next, EvaluationPlan { evaluate_to: 346, checkpoint_at: None, checkpoint_end: false }, "once per turn");
    let attention = plan_evaluation(ATTENTION, false, Purpose::Partial, 350, 280, marks, 32);
    assert_eq!(attention, EvaluationPlan { evaluate_to: 350, checkpoint_at: None, checkpoint_end: false });
    let reply = plan_evaluation(RECURRENT, true, Purpose::Reply, 360, 346, marks, 32);
    assert_eq!(reply, EvaluationPlan { evaluate_to: 360, checkpoint_at: None, checkpoint_end: true });
}

/// Property tests: any live sequence, stores and prompt.
mod properties {
    use proptest::collection::vec;
    use proptest::prelude::*;

    use super::*;

    /// Tokens from a tiny vocabulary, so that lists often share long prefixes.
    fn tokens(len: std::ops::Range<usize>) -> impl Strategy<Value = Vec<LlamaToken>> {
        vec((0..3).prop_map(LlamaToken), len)
    }

    /// A shared start, then a tail of its own, for each of `n` lists.
    fn related(n: usize) -> impl Strategy<Value = Vec<Vec<LlamaToken>>> {
        (tokens(0..60), vec(tokens(0..40), n))
            .prop_map(|(shared, tails)| tails.into_iter().map(|tail| [shared.clone(), tail].concat()).collect())
    }

    fn shape() -> impl Strategy<Value = CacheShape> {
        (any::<bool>(), prop_oneof![Just(None), (1..64u32).prop_map(Some)])
            .prop_map(|(recurrent, n_swa)| CacheShape { recurrent, n_swa })
    }

    /// Live, prompt, RAM entries, disk entries, and the live cache's limits.
    fn case() -> impl Strategy<Value = (CacheShape, Vec<Vec<LlamaToken>>, usize, usize, i32, usize, bool)> {
        (shape(), related(8), 0..3usize, 0..8usize, -1..40i32, 1..80usize, any::<bool>())
    }

    /// Everything a plan for `prompt` may rely on, checked.
    fn check_plan(
        shape: CacheShape,
        live: LiveView<'_>,
        stores: &Stores<'_>,
        prompt: &[LlamaToken],
        plan: Plan,
    ) -> Result<(), TestCaseError> {
        let held: &[LlamaToken] = match plan.source {
            Source::Live => live.tokens,
            Source::Ram(index) => {
                stores.ram.as_ref().expect("store on").iter().find(|e| e.index == index).expect("held").tokens
            }
            Source::Disk(index) => stores.disk.iter().find(|e| e.index == index).expect("held").tokens,
        };
        // A state is never used beyond the prefix it shares, and the last token is evaluated.
        prop_assert!(plan.keep <= common_prefix_len(held, prompt));
        prop_assert!(plan.keep < prompt.len().max(1));
        match plan.source {
            Source::Live => {
                // The live cache is cut only where it can be.
                if plan.keep > 0 {
                    prop_assert!(can_cut(shape, live, plan.keep));
                    prop_assert!(window_covers(live.pos_min, plan.keep, shape.n_swa));
                }
            }
            Source::Ram(_) | Source::Disk(_) => {
                // A whole-only entry is restored only for a prompt that continues all of it.
                if shape.whole_only() {
                    prop_assert_eq!(plan.keep, held.len());
                    prop_assert!(prompt.starts_with(held) && prompt.len() > held.len());
                }
                // And only when it spares the margin more than the live sequence.
                let (live_keep, _) = live_reusable(shape, live, prompt);
                prop_assert!(plan.keep >= live_keep + RAM_RESTORE_MARGIN);
            }
        }
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        #[test]
        fn plans_use_states_only_for_what_they_share(
            (shape, lists, n_ram, n_disk, pos_min, min_save, store_on) in case(),
            reply_start in proptest::option::of(0..100usize),
        ) {
            let (live_tokens, prompt) = (&lists[0], &lists[1]);
            let entries = &lists[2..];
            let ram: Vec<_> = entries.iter().take(n_ram).enumerate()
                .map(|(i, t)| StoredView { index: i, tokens: t, bytes: 1, last_used: i as u64 })
                .collect();
            let disk: Vec<_> = entries.iter().skip(n_ram).take(n_disk).enumerate()
                .map(|(i, t)| StoredView { index: i, tokens: t, bytes: 1, last_used: i as u64 })
                .collect();
            let stores = Stores { ram: store_on.then_some(ram), evicted: Vec::new(), disk };
            let live = LiveView { tokens: live_tokens, rewindable: min_save % 5, pos_min, reply_start };
            let plan = plan_prompt(shape, live, &stores, prompt, Derivation::AsSent, rules(min_save));
            check_plan(shape, live, &stores, prompt, plan)?;
            // The live sequence is saved only when the store is on, it is worth saving, and it
            // loses enough: `min_save` tokens, or the restore margin when the prompt is another
            // conversation (it leaves the live sequence before its last reply).
            let kept = if plan.source == Source::Live { plan.keep } else { 0 };
            let loss = live_tokens.len() - kept;
            let parted = common_prefix_len(live_tokens, prompt);
            let another = reply_start.is_some_and(|start| parted + NEXT_TURN_SLACK < start);
            let worth = store_on && live_tokens.len() >= min_save;
            if plan.save_live {
                prop_assert!(worth && loss >= min_save.min(RAM_RESTORE_MARGIN));
                prop_assert!(loss >= min_save || another, "a next turn's small loss is not saved: {:?}", plan);
            }
            // And always then.
            if worth && (loss >= min_save || (another && loss >= RAM_RESTORE_MARGIN)) {
                prop_assert!(plan.save_live, "loss {} another {}: {:?}", loss, another, plan);
            }
        }

        /// F2: whatever conversation A became, B's live sequence, which A's turns never contain,
        /// is saved when A displaces it.
        #[test]
        fn another_conversation_is_never_forgotten(
            system in vec(0..50i32, 0..20),
            a_turns in vec(vec(100..200i32, 1..30), 2..6),
            b_turn in vec(300..400i32, 1..30),
            dropped in 1..5usize,
        ) {
            let to = |ids: &[i32]| toks(ids);
            let full: Vec<LlamaToken> = to(&system).into_iter().chain(a_turns.iter().flat_map(|t| to(t))).collect();
            let dropped = dropped.min(a_turns.len() - 1);
            let shortened: Vec<LlamaToken> =
                to(&system).into_iter().chain(a_turns[dropped..].iter().flat_map(|t| to(t))).collect();
            let b: Vec<LlamaToken> = to(&system).into_iter().chain(to(&b_turn)).collect();
            let stores = Stores { ram: Some(Vec::new()), ..Stores::default() };
            let min_save = 1;
            let plan = plan_prompt(
                ATTENTION, live(&b), &stores, &shortened, Derivation::Shortened { full: &full }, rules(min_save),
            );
            let kept = if plan.source == Source::Live { plan.keep } else { 0 };
            prop_assert_eq!(plan.save_live, b.len() - kept >= min_save, "{:?}", plan);
            // A's own older form, all of it or shortened before, is forgotten.
            for older in 0..dropped {
                let before: Vec<LlamaToken> =
                    to(&system).into_iter().chain(a_turns[older..a_turns.len() - 1].iter().flat_map(|t| to(t))).collect();
                let plan = plan_prompt(
                    ATTENTION, live(&before), &stores, &shortened, Derivation::Shortened { full: &full }, rules(min_save),
                );
                prop_assert!(!plan.save_live, "older form from turn {}: {:?}", older, plan);
            }
        }

        /// F3: on a model that cannot cut, the request after the last partial transcript
        /// evaluates at most what that partial did not: its last word and what follows.
        #[test]
        fn the_request_after_partials_evaluates_only_what_they_did_not(
            history in vec(0..50i32, 40..80),
            words in vec(vec(100..200i32, 1..4), 2..10),
            revised_at in proptest::option::of(0..10usize),
            generation_prompt in vec(900..910i32, 1..4),
        ) {
            let history = toks(&history);
            let generation_prompt = toks(&generation_prompt);
            let mut live_tokens: Vec<LlamaToken> = Vec::new();
            let mut ram: Vec<Vec<LlamaToken>> = Vec::new();
            let mut last_stable = 0;
            let mut transcript: Vec<Vec<LlamaToken>> = Vec::new();
            for (i, word) in words.iter().enumerate() {
                let mut word = toks(word);
                if revised_at == Some(i) && !transcript.is_empty() {
                    // The recogniser rewrites an earlier word.
                    transcript[0] = toks(&[199, 198]);
                }
                transcript.push(std::mem::take(&mut word));
                let body: Vec<LlamaToken> = transcript.concat();
                let last_word = transcript.last().map_or(0, Vec::len);
                let prompt = [history.clone(), body.clone(), generation_prompt.clone()].concat();
                let marks = PartialMarks {
                    opening: Some(history.len()),
                    stable: Some(history.len() + body.len() - last_word),
                };
                let views: Vec<_> = ram.iter().enumerate()
                    .map(|(index, tokens)| StoredView { index, tokens, bytes: 1, last_used: index as u64 })
                    .collect();
                let stores = Stores { ram: Some(views), ..Stores::default() };
                let plan = plan_prompt(RECURRENT, live(&live_tokens), &stores, &prompt, Derivation::AsSent, rules(8));
                let mut held = match plan.source {
                    Source::Live => live_tokens[..plan.keep].to_vec(),
                    Source::Ram(index) => ram[index].clone(),
                    Source::Disk(_) => unreachable!(),
                };
                if plan.keep == 0 { held.clear(); }
                let evaluation = plan_evaluation(RECURRENT, true, Purpose::Partial, prompt.len(), held.len(), marks, 8);
                if let Some(at) = evaluation.checkpoint_at {
                    ram.push(prompt[..at].to_vec());
                }
                live_tokens = prompt[..evaluation.evaluate_to.max(held.len())].to_vec();
                last_stable = evaluation.evaluate_to;
            }
            // The request: the final transcript, the turn's end and the generation prompt.
            let body: Vec<LlamaToken> = transcript.concat();
            let prompt = [history.clone(), body, generation_prompt.clone()].concat();
            let views: Vec<_> = ram.iter().enumerate()
                .map(|(index, tokens)| StoredView { index, tokens, bytes: 1, last_used: index as u64 })
                .collect();
            let stores = Stores { ram: Some(views), ..Stores::default() };
            let plan = plan_prompt(RECURRENT, live(&live_tokens), &stores, &prompt, Derivation::AsSent, rules(8));
            prop_assert_eq!(plan.source, Source::Live);
            prop_assert!(plan.keep >= last_stable, "kept {} of the {} the last partial evaluated", plan.keep, last_stable);
        }
    }
}

#[test]
fn a_lane_restores_a_stored_state_only_when_it_saves_the_margin_over_sharing() {
    // Sharing copies nothing: a stored state must serve RAM_RESTORE_MARGIN tokens more.
    assert!(restore_for_lane(0, RAM_RESTORE_MARGIN));
    assert!(!restore_for_lane(0, RAM_RESTORE_MARGIN - 1));
    assert!(restore_for_lane(1200, 1200 + RAM_RESTORE_MARGIN));
    assert!(!restore_for_lane(1200, 1200 + RAM_RESTORE_MARGIN - 1));
    assert!(!restore_for_lane(1200, 300), "a shorter stored prefix never wins");
}

/// A lane shares a live sequence's prefix by tagging its cells; a recurrent state is shared
/// whole, so only a sequence holding exactly the prefix gives it.
#[test]
fn a_recurrent_state_is_shared_with_a_lane_only_whole() {
    use crate::engine::policy::lane_shareable;
    assert_eq!(lane_shareable(ATTENTION, 900, 600), 600);
    assert_eq!(lane_shareable(CacheShape { recurrent: false, n_swa: Some(512) }, 900, 600), 600);
    assert_eq!(lane_shareable(RECURRENT, 900, 600), 0, "a state 300 tokens past the prefix");
    assert_eq!(lane_shareable(RECURRENT, 600, 600), 600, "the state is the prefix's");
    assert_eq!(lane_shareable(RECURRENT, 0, 0), 0);
}
