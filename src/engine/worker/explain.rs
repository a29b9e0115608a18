//! Why the cache served what it did for a prompt: where it came from, where the prompt left
//! it, and in which part of the prompt (the system prompt, an earlier turn, the reply the
//! cache held cut short by a barge-in).

use llama_cpp_2::token::LlamaToken;

use super::Session;
use crate::chat::{Landmarks, PromptPart};
use crate::engine::media::MediaSpan;
use crate::engine::sequence::{ChangesReused, Reuse};
use crate::engine::{CacheMiss, CacheReport, CacheSource, ReplyCut};

impl Session<'_> {
    /// What the cache did for `tokens`, and why it did not serve more: the part of the prompt
    /// where it diverged from what the cache held, when nothing else stopped it.
    pub(super) fn explain(&self, reuse: &Reuse, tokens: &[LlamaToken], parts: PromptParts<'_>) -> CacheReport {
        // A barge-in: whatever served the prefix, the cut reply is why it was not more.
        let reply_cut = reuse.reply_cut.filter(|_| reuse.keep > 0);
        let reason = match reuse.source {
            _ if reply_cut.is_some() => Some(CacheMiss::ReplyCut),
            _ if reuse.changes.is_some() => Some(CacheMiss::ReusedAfterChange),
            CacheSource::Ram | CacheSource::Disk => Some(CacheMiss::Restored),
            CacheSource::Checkpoint => Some(CacheMiss::Checkpoint),
            CacheSource::Live | CacheSource::Kept | CacheSource::None => {
                reuse.obstacle.or_else(|| reuse.diverged_at.and_then(|at| self.diverged_in(tokens, at, parts)))
            }
        };
        let respanned = reuse.evaluated_inside();
        CacheReport {
            adopted: 0,
            source: reuse.source,
            reused: (reuse.keep - respanned) as u32,
            prefilled: (tokens.len() - reuse.keep + respanned) as u32,
            diverged_at: reuse.diverged_at.map(|at| at as u32),
            reason,
            save: reuse.save,
            restore: reuse.restore,
            reply_cut: reply_cut.map(|cut| ReplyCut { kept: cut.kept as u32, held: cut.held as u32 }),
            changes: reuse.changes.as_ref().map(ChangesReused::report),
        }
    }

    /// Why a prompt that departs from the cache at token `at` did: it is shorter, or it
    /// changed inside its first message or an earlier turn (`None`: in its newest turn).
    fn diverged_in(&self, tokens: &[LlamaToken], at: usize, parts: PromptParts<'_>) -> Option<CacheMiss> {
        if at >= tokens.len() {
            return Some(CacheMiss::PromptShorter);
        }
        let text = parts.text?;
        let vocab = self.model.vocab();
        let mut offset: usize = self.text_lengths(tokens, parts.media).take(at).sum();
        // A BOS the tokenizer added is not in the text.
        if self.added_bos(tokens, text) > 0 {
            offset = offset.saturating_sub(vocab.token_to_piece(tokens[0], true, None).len());
        }
        if tracing::enabled!(tracing::Level::DEBUG) {
            let (before, after) = around(text, offset, 20);
            tracing::debug!(at, offset, before, after, "the prompt leaves the cache here");
        }
        match parts.landmarks.part_at(offset) {
            PromptPart::FirstMessage => Some(CacheMiss::SystemPromptChanged),
            PromptPart::History => Some(CacheMiss::HistoryChanged),
            PromptPart::NewestTurn => None,
        }
    }
}

/// A rendered prompt's text and where its parts lie (no text for token prompts).
#[derive(Clone, Copy)]
pub(super) struct PromptParts<'t> {
    /// The prompt's text.
    pub(super) text: Option<&'t str>,
    /// Where its parts lie.
    pub(super) landmarks: Landmarks,
    /// Where its media lie among its tokens.
    pub(super) media: &'t [MediaSpan],
}

/// Up to `chars` characters of `text` before and after byte `offset` (moved back to a
/// character boundary).
fn around(text: &str, offset: usize, chars: usize) -> (&str, &str) {
    let mut offset = offset.min(text.len());
    while !text.is_char_boundary(offset) {
        offset -= 1;
    }
    let (head, tail) = text.split_at(offset);
    let start = head.char_indices().rev().nth(chars.saturating_sub(1)).map_or(0, |(i, _)| i);
    let end = tail.char_indices().nth(chars).map_or(tail.len(), |(i, _)| i);
    (&head[start..], &tail[..end])
}

#[cfg(test)]
mod tests {
    use super::around;

    #[test]
    fn around_takes_whole_characters_on_both_sides() {
        assert_eq!(around("hello world", 5, 3), ("llo", " wo"));
        assert_eq!(around("ab", 1, 20), ("a", "b"));
        assert_eq!(around("ab", 99, 2), ("ab", ""));
        // Byte 2 is inside 'é' (bytes 1..3): moved back to its start.
        assert_eq!(around("aébc", 2, 1), ("a", "é"));
        assert_eq!(around("", 0, 5), ("", ""));
    }
}
