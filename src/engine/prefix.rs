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
}
