//! Reuse past a small change: a prompt that leaves the cached tokens in a short span (a clock
//! line, an entity's state) and continues them token for token afterwards, at the same
//! positions or shifted by a few tokens, keeps the cached continuation. The changed spans are
//! evaluated at their positions, the continuation is moved to where the prompt has it, and
//! only what is new at the end is evaluated.
//!
//! It is an approximation: the kept tokens were computed attending to the old span, so the
//! result is not what a fresh evaluation gives (docs/cache.md, "Reuse past a change"). This
//! module only finds the spans, from token lists alone; the live sequence carries a plan out.

use llama_cpp_2::token::LlamaToken;

use crate::engine::prefix::common_prefix_len;

/// The limits of a reuse past changes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChangeRules {
    /// Most changed spans in one prompt.
    pub max_spans: usize,
    /// Most tokens a changed span may have, in the cache and in the prompt.
    pub max_span_tokens: usize,
    /// Most tokens a span's length may change by (what follows is moved by that much).
    pub max_shift: usize,
    /// Fewest tokens that must follow a span unchanged for it to count as a change rather than
    /// a different text: shorter runs are taken into the span.
    pub min_run: usize,
    /// Tokens after each changed span that are evaluated again rather than kept, so they
    /// attend to the new span (a bounded neighbourhood).
    pub redo: usize,
    /// Fewest tokens the reuse must keep beyond the common prefix to be used at all (0: any
    /// plan with a span, even one that keeps nothing, which only the tests want).
    pub min_saving: usize,
}

impl Default for ChangeRules {
    /// Up to 8 spans of up to 48 tokens, lengths changing by up to 16, 16 unchanged tokens to
    /// resume, nothing evaluated again after a span, at least 64 tokens saved.
    fn default() -> Self {
        Self { max_spans: 8, max_span_tokens: 48, max_shift: 16, min_run: 16, redo: 0, min_saving: 64 }
    }
}

/// One changed span: the prompt's tokens `at..at + new_len` replace the cached tokens that were
/// at the same place (`old_len` of them, in the cache's own positions before the plan).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ChangedSpan {
    /// Where the span starts in the prompt.
    pub(crate) at: usize,
    /// Where it started in the cache.
    pub(crate) old_at: usize,
    /// Its length in the cache.
    pub(crate) old_len: usize,
    /// Its length in the prompt.
    pub(crate) new_len: usize,
    /// Tokens after it evaluated again (the neighbourhood), at most the run that follows it.
    pub(crate) redo: usize,
    /// Unchanged tokens that follow it (the redone ones included) in both lists.
    pub(crate) run: usize,
}

impl ChangedSpan {
    /// How far what follows the span moves: the prompt's length minus the cache's.
    pub(crate) fn shift(&self) -> isize {
        self.new_len as isize - self.old_len as isize
    }

    /// Cached tokens after the span that are kept as they are.
    pub(crate) fn kept(&self) -> usize {
        self.run - self.redo
    }
}

/// What to do for a prompt that changed in short spans.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ChangePlan {
    /// Tokens the prompt shares with the cache from its start.
    pub(crate) prefix: usize,
    /// The changed spans, in order.
    pub(crate) spans: Vec<ChangedSpan>,
    /// Prompt tokens the cache holds once the plan is carried out (the rest is evaluated as
    /// usual): the end of the last span's run, at most all but the prompt's last token.
    pub(crate) end: usize,
}

impl ChangePlan {
    /// Cached tokens kept beyond the common prefix (not evaluated again).
    pub(crate) fn kept(&self) -> usize {
        self.spans.iter().map(ChangedSpan::kept).sum()
    }

    /// Prompt tokens evaluated before the usual prefill: the spans and their neighbourhoods.
    pub(crate) fn evaluated(&self) -> usize {
        self.spans.iter().map(|span| span.new_len + span.redo).sum()
    }
}

/// The reuse past changes that `prompt` allows over `cached`, if it keeps at least
/// `rules.min_saving` tokens beyond their common prefix. `shift`: whether the model's cache can
/// move positions (otherwise only spans whose length stays are taken).
///
/// From the first token where they differ, each step finds the nearest place where they agree
/// again for `rules.min_run` tokens, no more than `rules.max_span_tokens` tokens ahead in
/// either list and with lengths differing by at most `rules.max_shift` (the fewest prompt
/// tokens first, then the smallest shift): what lies before it is a changed span, what agrees
/// after it is kept. Anything longer is not a small change (another conversation, a new turn)
/// and ends the plan there. At least the prompt's last token is always left to evaluate.
pub(crate) fn plan_changes(
    cached: &[LlamaToken],
    prompt: &[LlamaToken],
    rules: ChangeRules,
    shift: bool,
) -> Option<ChangePlan> {
    let prefix = common_prefix_len(cached, prompt);
    let last = prompt.len().checked_sub(1)?;
    if prefix >= cached.len() || prefix >= last || rules.min_run == 0 {
        return None;
    }
    let max_shift = if shift { rules.max_shift } else { 0 };
    let mut spans = Vec::new();
    let (mut old, mut new) = (prefix, prefix);
    while spans.len() < rules.max_spans && old < cached.len() && new < last {
        let Some((old_len, new_len)) = resume(&cached[old..], &prompt[new..last], rules, max_shift) else {
            break;
        };
        let run = common_prefix_len(&cached[old + old_len..], &prompt[new + new_len..last]);
        let redo = rules.redo.min(run);
        spans.push(ChangedSpan { at: new, old_at: old, old_len, new_len, redo, run });
        old += old_len + run;
        new += new_len + run;
    }
    let plan = ChangePlan { prefix, spans, end: new };
    (!plan.spans.is_empty() && plan.kept() >= rules.min_saving).then_some(plan)
}

/// Prompt tokens `held` would serve with a reuse past changes: the common prefix and the
/// tokens kept after the changed spans (not the spans, which are evaluated); 0 where the
/// rules find no such reuse.
pub(crate) fn served_past_changes(held: &[LlamaToken], prompt: &[LlamaToken], rules: ChangeRules) -> usize {
    plan_changes(held, prompt, rules, true).map_or(0, |plan| plan.prefix + plan.kept())
}

/// The nearest `(old_len, new_len)` after which `cached` and `prompt` agree for `min_run`
/// tokens, within the rules' span length and shift (a span of at least one token in one of
/// them, since they differ at their first token).
fn resume(
    cached: &[LlamaToken],
    prompt: &[LlamaToken],
    rules: ChangeRules,
    max_shift: usize,
) -> Option<(usize, usize)> {
    let run = rules.min_run;
    let agree = |old_len: usize, new_len: usize| {
        old_len + run <= cached.len()
            && new_len + run <= prompt.len()
            && cached[old_len..old_len + run] == prompt[new_len..new_len + run]
    };
    for new_len in 0..=rules.max_span_tokens.min(prompt.len()) {
        for distance in 0..=max_shift {
            let mut lengths = [Some(new_len), None];
            if distance > 0 {
                lengths = [new_len.checked_sub(distance), Some(new_len + distance)];
            }
            for old_len in lengths.into_iter().flatten() {
                if old_len + new_len > 0 && old_len <= rules.max_span_tokens && agree(old_len, new_len) {
                    return Some((old_len, new_len));
                }
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use proptest::collection::vec;
    use proptest::prelude::*;

    use super::*;

    fn toks(ids: impl IntoIterator<Item = i32>) -> Vec<LlamaToken> {
        ids.into_iter().map(LlamaToken).collect()
    }

    /// `head` + `span` + `body` + `tail`, as one token list.
    fn joined(parts: &[&[LlamaToken]]) -> Vec<LlamaToken> {
        parts.concat()
    }

    fn rules() -> ChangeRules {
        ChangeRules { min_saving: 16, ..ChangeRules::default() }
    }

    #[test]
    fn a_clock_of_the_same_length_keeps_what_follows() {
        let head = toks(0..10);
        let body = toks(100..400);
        let cached = joined(&[&head, &toks([50, 51, 52]), &body, &toks([7, 7])]);
        let prompt = joined(&[&head, &toks([50, 53, 54]), &body, &toks([900, 901])]);
        let plan = plan_changes(&cached, &prompt, rules(), true).expect("a plan");
        assert_eq!(plan.prefix, 11);
        assert_eq!(plan.spans, vec![ChangedSpan { at: 11, old_at: 11, old_len: 2, new_len: 2, redo: 0, run: 300 }]);
        assert_eq!(plan.end, 313);
        assert_eq!(plan.kept(), 300);
        assert_eq!(plan.evaluated(), 2);
    }

    #[test]
    fn a_longer_span_moves_what_follows_only_where_the_cache_can_move() {
        let body = toks(100..400);
        let cached = joined(&[&toks([1, 2]), &body, &toks([5])]);
        let prompt = joined(&[&toks([1, 3, 4, 5]), &body, &toks([6])]);
        let plan = plan_changes(&cached, &prompt, rules(), true).expect("a plan");
        assert_eq!(plan.spans[0].shift(), 2);
        assert_eq!(plan.spans[0].kept(), 300);
        assert_eq!(plan_changes(&cached, &prompt, rules(), false), None);
    }

    #[test]
    fn several_spans_are_found_and_each_keeps_its_run() {
        let a = toks(100..200);
        let b = toks(200..300);
        let cached = joined(&[&toks([1, 10]), &a, &toks([20, 21]), &b, &toks([9])]);
        let prompt = joined(&[&toks([1, 11, 12]), &a, &toks([22]), &b, &toks([8, 8])]);
        let plan = plan_changes(&cached, &prompt, ChangeRules { redo: 4, ..rules() }, true).expect("a plan");
        assert_eq!(plan.spans.len(), 2);
        assert_eq!((plan.spans[1].old_at, plan.spans[1].at), (102, 103));
        assert_eq!(plan.kept(), 192);
        assert_eq!(plan.evaluated(), 2 + 4 + 1 + 4);
        assert_eq!(plan.end, prompt.len() - 2);
    }

    #[test]
    fn a_long_new_text_is_not_a_change() {
        let head = toks(0..20);
        let body = toks(100..400);
        let cached = joined(&[&head, &body]);
        let prompt = joined(&[&head, &toks(1000..1100), &body]);
        assert_eq!(plan_changes(&cached, &prompt, rules(), true), None);
    }

    #[test]
    fn nothing_changed_is_for_the_prefix_reuse() {
        let cached = toks(0..100);
        assert_eq!(plan_changes(&cached, &toks(0..200), rules(), true), None);
        assert_eq!(plan_changes(&cached, &toks(0..50), rules(), true), None);
    }

    #[test]
    fn an_unchanged_prompt_end_is_still_evaluated() {
        let cached = joined(&[&toks([1, 2]), &toks(100..200)]);
        let prompt = joined(&[&toks([1, 3]), &toks(100..200)]);
        let plan = plan_changes(&cached, &prompt, rules(), true).expect("a plan");
        assert_eq!(plan.end, prompt.len() - 1);
    }

    #[test]
    fn an_eight_thousand_token_prompt_that_differs_everywhere_is_decided_fast() {
        let cached = toks(0..8192);
        let prompt = toks(10_000..18_192);
        let started = std::time::Instant::now();
        for _ in 0..10 {
            assert_eq!(plan_changes(&cached, &prompt, ChangeRules::default(), true), None);
        }
        // Not a timing assertion: printed for docs/cache.md's figure (cargo test -- --nocapture).
        println!("8K-token prompt differing everywhere: {:?} per plan", started.elapsed() / 10);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        /// Whatever the lists, a plan keeps only tokens both hold in the same order, positions
        /// follow from the spans, and the prompt's last token is always evaluated.
        #[test]
        fn a_plan_keeps_only_what_both_hold(
            cached in vec(0..6i32, 0..160),
            prompt in vec(0..6i32, 1..160),
            redo in 0..8usize,
            shift in any::<bool>(),
        ) {
            let (cached, prompt) = (toks(cached), toks(prompt));
            let rules = ChangeRules { min_run: 4, min_saving: 1, redo, max_span_tokens: 12, max_shift: 3, max_spans: 4 };
            if let Some(plan) = plan_changes(&cached, &prompt, rules, shift) {
                prop_assert_eq!(&cached[..plan.prefix], &prompt[..plan.prefix]);
                prop_assert!(plan.end < prompt.len());
                prop_assert!(plan.spans.len() <= rules.max_spans);
                let (mut old, mut new) = (plan.prefix, plan.prefix);
                for span in &plan.spans {
                    prop_assert_eq!((span.old_at, span.at), (old, new));
                    prop_assert!(span.old_len + span.new_len > 0);
                    prop_assert!(span.old_len <= rules.max_span_tokens && span.new_len <= rules.max_span_tokens);
                    let most_shift = if shift { rules.max_shift } else { 0 };
                    prop_assert!(span.shift().unsigned_abs() <= most_shift);
                    prop_assert!(span.run >= rules.min_run.min(prompt.len() - 1 - new - span.new_len));
                    prop_assert!(span.redo <= span.run && span.redo <= rules.redo);
                    let kept_old = &cached[old + span.old_len..old + span.old_len + span.run];
                    let kept_new = &prompt[new + span.new_len..new + span.new_len + span.run];
                    prop_assert_eq!(kept_old, kept_new);
                    old += span.old_len + span.run;
                    new += span.new_len + span.run;
                }
                prop_assert_eq!(new, plan.end);
                prop_assert!(plan.kept() >= 1);
            }
        }

        /// A short change inside a long shared text is found, and keeps all that follows it.
        #[test]
        fn a_short_change_in_a_long_text_is_found(
            head in 0..200usize,
            old_span in vec(5000..5100i32, 1..20),
            new_span in vec(6000..6100i32, 1..20),
            body in 64..600usize,
        ) {
            let head = toks(0..head as i32);
            let body = toks(1000..1000 + body as i32);
            let cached = joined(&[&head, &toks(old_span.clone()), &body]);
            let prompt = joined(&[&head, &toks(new_span.clone()), &body, &toks([7000])]);
            let shift = (old_span.len() as isize - new_span.len() as isize).unsigned_abs();
            let plan = plan_changes(&cached, &prompt, rules(), true);
            if shift <= rules().max_shift {
                let plan = plan.expect("a plan");
                prop_assert_eq!(plan.kept(), body.len());
                prop_assert_eq!(plan.end, prompt.len() - 1);
            } else {
                prop_assert_eq!(plan, None);
            }
        }

        /// Two unrelated texts (no run of `min_run` tokens in common) keep nothing.
        #[test]
        fn unrelated_texts_keep_nothing(
            shared in 0..50usize,
            cached in vec(0..1000i32, 0..400),
            prompt in vec(1000..2000i32, 1..400),
        ) {
            let head = toks(5000..5000 + shared as i32);
            let cached = joined(&[&head, &toks(cached)]);
            let prompt = joined(&[&head, &toks(prompt)]);
            prop_assert_eq!(plan_changes(&cached, &prompt, ChangeRules::default(), true), None);
        }
    }
}
