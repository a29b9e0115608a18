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
/// Layers with a window of `n_swa` tokens need the KV of positions `keep - n_swa ..` to attend
/// from position `keep` on; if the cache already dropped some of them, reuse would silently
/// compute wrong logits, so the caller must prefill from scratch.
pub(crate) fn window_covers(pos_min: i32, keep: usize, n_swa: Option<u32>) -> bool {
    let Some(n_swa) = n_swa else { return true };
    if keep == 0 {
        return true;
    }
    let needed_from = keep.saturating_sub(n_swa as usize);
    usize::try_from(pos_min).map_or(true, |pos_min| pos_min <= needed_from)
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
        // keep 1000 tokens with a 512 window: positions 488.. are needed.
        assert!(window_covers(0, 1000, Some(512)));
        assert!(window_covers(488, 1000, Some(512)));
    }

    #[test]
    fn window_that_dropped_needed_positions_does_not_cover() {
        assert!(!window_covers(489, 1000, Some(512)));
        assert!(!window_covers(3400, 1000, Some(512)));
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

        /// (pos_min, keep, n_swa): mostly anything, often right at the edge of coverage.
        fn window_case() -> impl Strategy<Value = (i32, usize, u32)> {
            let near_the_edge = (0..5000usize, 0..5000u32, -2..3i32).prop_map(|(keep, n_swa, off)| {
                let needed_from = keep.saturating_sub(n_swa as usize) as i32;
                (needed_from + off, keep, n_swa)
            });
            prop_oneof![(any::<i32>(), any::<usize>(), any::<u32>()), near_the_edge]
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
            fn a_window_covers_exactly_when_it_holds_every_needed_position((pos_min, keep, n_swa) in window_case()) {
                // Continuing after `keep` tokens attends to positions `keep - n_swa .. keep`.
                let needed_from = (keep as i128 - i128::from(n_swa)).max(0);
                let holds_all = keep == 0 || i128::from(pos_min) <= needed_from;
                prop_assert_eq!(window_covers(pos_min, keep, Some(n_swa)), holds_all);
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
