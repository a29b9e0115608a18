//! Deciding how much of the KV cache a new prompt can reuse.
//!
//! Pure logic, no llama.cpp: the live sequence asks [`plan_reuse`] what to keep, removes the
//! rest from the KV cache, and the suffix is prefilled.

use llama_cpp_2::token::LlamaToken;

/// Length of the longest common prefix of two token lists.
pub(crate) fn common_prefix_len(a: &[LlamaToken], b: &[LlamaToken]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// How many cached tokens a prompt keeps; everything after them is prefilled.
///
/// At least one prompt token is always evaluated, so the last position has fresh logits to sample
/// from, even when the prompt is identical to (or a prefix of) what the cache holds.
pub(crate) fn plan_reuse(cached: &[LlamaToken], prompt: &[LlamaToken]) -> usize {
    common_prefix_len(cached, prompt).min(prompt.len().saturating_sub(1))
}

/// Whether a sliding-window cache still holds what is needed to continue after `keep` tokens.
///
/// `pos_min` is the smallest position the KV cache still holds for the sequence (before the cut).
/// llama.cpp masks position `p0` for a token at `p1` when `p1 - p0 >= n_swa` (`is_masked_swa`),
/// so the first token evaluated, at position `keep`, attends to the cached positions
/// `keep + 1 - n_swa ..`, and every later one to fewer; if the cache already dropped some of
/// them, reuse would silently compute wrong logits, so the caller must prefill from scratch.
pub(crate) fn window_covers(pos_min: i32, keep: usize, n_swa: Option<u32>) -> bool {
    let Some(n_swa) = n_swa else { return true };
    if keep == 0 {
        return true;
    }
    let needed_from = (keep + 1).saturating_sub(n_swa as usize);
    // A window of one token attends to no cached position.
    needed_from >= keep || usize::try_from(pos_min).map_or(true, |pos_min| pos_min <= needed_from)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn toks(ids: &[i32]) -> Vec<LlamaToken> {
        ids.iter().copied().map(LlamaToken).collect()
    }

    #[test]
    fn empty_cache_reuses_nothing() {
        assert_eq!(plan_reuse(&[], &toks(&[1, 2, 3])), 0);
    }

    #[test]
    fn divergence_in_the_middle_keeps_the_common_part() {
        assert_eq!(plan_reuse(&toks(&[1, 2, 3, 4, 5]), &toks(&[1, 2, 9, 4, 5, 6])), 2);
    }

    #[test]
    fn longer_prompt_keeps_the_whole_cache() {
        assert_eq!(plan_reuse(&toks(&[1, 2, 3]), &toks(&[1, 2, 3, 4, 5])), 3);
    }

    #[test]
    fn identical_prompt_still_evaluates_its_last_token() {
        assert_eq!(plan_reuse(&toks(&[1, 2, 3]), &toks(&[1, 2, 3])), 2);
    }

    #[test]
    fn shorter_prompt_that_is_a_prefix_evaluates_its_last_token() {
        assert_eq!(plan_reuse(&toks(&[1, 2, 3, 4, 5]), &toks(&[1, 2, 3])), 2);
    }

    #[test]
    fn shorter_prompt_diverging_early() {
        assert_eq!(plan_reuse(&toks(&[1, 2, 3, 4, 5]), &toks(&[1, 7])), 1);
    }

    #[test]
    fn single_token_prompt_reuses_nothing() {
        assert_eq!(plan_reuse(&toks(&[1, 2]), &toks(&[1])), 0);
    }

    #[test]
    fn models_without_a_window_always_cover() {
        assert!(window_covers(3000, 4000, None));
    }

    #[test]
    fn window_that_still_holds_the_needed_positions_covers() {
        // keep 1000 tokens with a 512 window: position 1000 attends to 489.. (1000 - 488 is
        // 512, masked).
        assert!(window_covers(0, 1000, Some(512)));
        assert!(window_covers(489, 1000, Some(512)));
    }

    #[test]
    fn window_that_dropped_needed_positions_does_not_cover() {
        assert!(!window_covers(490, 1000, Some(512)));
        assert!(!window_covers(3400, 1000, Some(512)));
    }

    #[test]
    fn a_window_of_one_token_needs_no_cached_position() {
        assert!(window_covers(657, 1, Some(1)));
        assert!(window_covers(3400, 1000, Some(1)));
        assert!(!window_covers(3400, 1000, Some(2)));
    }

    #[test]
    fn cut_at_zero_or_empty_cache_is_always_covered() {
        assert!(window_covers(3400, 0, Some(512)));
        assert!(window_covers(-1, 700, Some(512)));
    }

    /// Property tests: any cache and prompt, any window.
    mod properties {
        use proptest::collection::vec;
        use proptest::prelude::*;

        use super::*;

        /// Tokens from a tiny vocabulary, so that lists often share long prefixes.
        fn tokens(len: std::ops::Range<usize>) -> impl Strategy<Value = Vec<LlamaToken>> {
            vec((0..3).prop_map(LlamaToken), len)
        }

        /// A cached list and a prompt: a shared start, then each its own tail.
        fn cached_and_prompt() -> impl Strategy<Value = (Vec<LlamaToken>, Vec<LlamaToken>)> {
            (tokens(0..8), tokens(0..5), tokens(0..5))
                .prop_map(|(shared, cached, prompt)| ([shared.clone(), cached].concat(), [shared, prompt].concat()))
        }

        /// llama.cpp's mask for a standard sliding window (`llama_hparams::is_masked_swa`,
        /// `LLAMA_SWA_TYPE_STANDARD`): the token at `p1` does not attend to position `p0`.
        fn is_masked_swa(n_swa: u32, p0: i64, p1: i64) -> bool {
            p1 - p0 >= i64::from(n_swa)
        }

        /// Whether a cache holding positions `pos_min..keep` (nothing dropped when `pos_min`
        /// is negative: empty) holds every position a token evaluated at `keep` or later
        /// attends to, by llama.cpp's mask, position by position.
        fn holds_every_attended_position(pos_min: i32, keep: usize, n_swa: u32) -> bool {
            let held = |p0: i64| pos_min < 0 || p0 >= i64::from(pos_min);
            // A later token attends to a subset of what the first one, at `keep`, does.
            let keep = keep as i64;
            (0..keep).filter(|&p0| !is_masked_swa(n_swa, p0, keep)).all(held)
        }

        /// (pos_min, keep, n_swa): small positions (the oracle walks them) and windows of at
        /// least one token (llama.cpp reports no window as 0), often right at the edge of
        /// coverage.
        fn window_case() -> impl Strategy<Value = (i32, usize, u32)> {
            let near_the_edge = (0..3000usize, 1..3000u32, -2..3i32).prop_map(|(keep, n_swa, off)| {
                let first_attended = (keep + 1).saturating_sub(n_swa as usize) as i32;
                (first_attended + off, keep, n_swa)
            });
            prop_oneof![(-2..3000i32, 0..3000usize, 1..3000u32), near_the_edge]
        }

        proptest! {
            #[test]
            fn common_prefix_is_shared_and_then_differs((a, b) in cached_and_prompt()) {
                let n = common_prefix_len(&a, &b);
                prop_assert_eq!(n, common_prefix_len(&b, &a));
                prop_assert_eq!(&a[..n], &b[..n]);
                prop_assert!(n == a.len() || n == b.len() || a[n] != b[n]);
            }

            #[test]
            fn reuse_keeps_only_shared_tokens_and_leaves_the_last_to_evaluate(
                (cached, prompt) in cached_and_prompt(),
            ) {
                let keep = plan_reuse(&cached, &prompt);
                let common = common_prefix_len(&cached, &prompt);
                prop_assert!(keep <= common);
                if prompt.is_empty() {
                    prop_assert_eq!(keep, 0);
                } else {
                    prop_assert!(keep < prompt.len());
                }
                // Nothing shared is given up but the last prompt token.
                if common < prompt.len() {
                    prop_assert_eq!(keep, common);
                } else {
                    prop_assert_eq!(keep, prompt.len().saturating_sub(1));
                }
            }

            #[test]
            fn a_window_covers_exactly_when_it_holds_every_position_llama_cpp_attends_to(
                (pos_min, keep, n_swa) in window_case(),
            ) {
                prop_assert_eq!(
                    window_covers(pos_min, keep, Some(n_swa)),
                    holds_every_attended_position(pos_min, keep, n_swa)
                );
                prop_assert!(window_covers(pos_min, keep, None));
                prop_assert!(window_covers(pos_min, 0, Some(n_swa)));
            }

            #[test]
            fn a_window_covers_more_with_less_dropped_more_kept_or_a_narrower_window(
                (pos_min, keep, n_swa) in window_case(),
            ) {
                // More kept tokens or a narrower window need only later positions (keeping
                // none needs none).
                if window_covers(pos_min, keep, Some(n_swa)) {
                    prop_assert!(window_covers(pos_min.saturating_sub(1), keep, Some(n_swa)));
                    prop_assert!(keep == 0 || window_covers(pos_min, keep.saturating_add(1), Some(n_swa)));
                    prop_assert!(window_covers(pos_min, keep, Some(n_swa.saturating_sub(1))));
                }
            }
        }
    }
}
