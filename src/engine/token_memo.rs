//! Incremental tokenization of chat prompts. A conversation's next request renders to the
//! text of the last one plus a little at the end, so the tokens of the unchanged beginning
//! are kept and only the rest is tokenized.
//!
//! The text may only be cut where tokenizing the two parts apart gives the tokens of the
//! whole: at the start of a special token (llama.cpp first splits a text at its special
//! tokens, then tokenizes each stretch between them on its own). [`SpecialTokens::cuts`]
//! finds the places where llama.cpp's split is certain to fall: a special token that no
//! other special token's match overlaps, and, for a token that strips the spaces before it,
//! no space before it. The memo keeps, for each recent text, where it was cut and how many
//! tokens lie before each cut.

use std::collections::VecDeque;

use aho_corasick::{AhoCorasick, MatchKind};

/// Texts the memo keeps: a voice turn's partial transcripts and the final request, and two
/// conversations taking turns.
const MEMO_ENTRIES: usize = 4;

/// The vocabulary's special tokens as llama.cpp splits a text at them.
#[derive(Debug)]
pub(crate) struct SpecialTokens {
    /// Finds every occurrence, overlapping ones included; `None` without special tokens.
    matcher: Option<AhoCorasick>,
    /// Per pattern: the token strips the whitespace before it (`LSTRIP`).
    lstrip: Vec<bool>,
}

impl SpecialTokens {
    /// The special tokens `(text, strips the whitespace before it)`; empty texts are ignored
    /// (llama.cpp cannot split at them either).
    ///
    /// # Errors
    /// The matcher cannot be built (too many patterns for its limits).
    pub(crate) fn new(tokens: impl IntoIterator<Item = (Vec<u8>, bool)>) -> Result<Self, aho_corasick::BuildError> {
        let (texts, lstrip): (Vec<Vec<u8>>, Vec<bool>) =
            tokens.into_iter().filter(|(text, _)| !text.is_empty()).unzip();
        let matcher = if texts.is_empty() {
            None
        } else {
            Some(AhoCorasick::builder().match_kind(MatchKind::Standard).build(&texts)?)
        };
        Ok(Self { matcher, lstrip })
    }

    /// Byte offsets (ascending, none 0) where `text` can be cut: tokenizing `text[..cut]`
    /// and `text[cut..]` apart (the second part without BOS) gives the tokens of `text`.
    ///
    /// A cut is the start of a special token's occurrence (the longest one starting there)
    /// that llama.cpp's split keeps whole: no occurrence starts before the cut and ends after
    /// it, none starts inside the token and ends beyond it, and, if the token strips the
    /// whitespace before it, no whitespace precedes it.
    pub(crate) fn cuts(&self, text: &[u8]) -> Vec<usize> {
        let Some(matcher) = &self.matcher else { return Vec::new() };
        // (start, end, strips the whitespace before it), by start and then longest first.
        let mut found: Vec<(usize, usize, bool)> = matcher
            .find_overlapping_iter(text)
            .map(|m| (m.start(), m.end(), self.lstrip[m.pattern().as_usize()]))
            .collect();
        found.sort_unstable_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)));
        let mut cuts = Vec::new();
        // The furthest end of the occurrences starting before the current one.
        let mut reach = 0usize;
        let mut i = 0;
        while i < found.len() {
            let (start, end, _) = found[i];
            // The occurrences starting here: does any strip the whitespace before it?
            let mut group_end = i;
            let mut strips = false;
            while group_end < found.len() && found[group_end].0 == start {
                strips |= found[group_end].2 && found[group_end].1 == end;
                group_end += 1;
            }
            // Occurrences inside the token are shorter: llama.cpp splits at the token first.
            // One that starts inside and ends beyond it may win instead.
            let crossed = found[group_end..].iter().take_while(|f| f.0 < end).any(|f| f.1 > end);
            let whole = reach <= start && !crossed;
            let spaced = strips && start > 0 && is_c_space(text[start - 1]);
            if start > 0 && whole && !spaced {
                cuts.push(start);
            }
            reach = reach.max(end);
            i = group_end;
        }
        cuts
    }
}

/// C's `isspace` in the "C" locale, as llama.cpp's `LSTRIP` applies it.
fn is_c_space(byte: u8) -> bool {
    matches!(byte, b' ' | b'\t' | b'\n' | 0x0b | 0x0c | b'\r')
}

/// A text and its tokens, with the cuts it was tokenized at.
#[derive(Debug)]
struct Entry<T> {
    text: String,
    /// The first part was tokenized with BOS.
    bos: bool,
    tokens: Vec<T>,
    /// `(byte, tokens)`, ascending: `tokens[..n]` are the tokens of `text[..byte]`.
    marks: Vec<(usize, usize)>,
}

/// What [`TokenMemo::tokenize`] did.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct MemoTokens<T> {
    /// The text's tokens.
    pub(crate) tokens: Vec<T>,
    /// How many of them were kept from an earlier text.
    pub(crate) kept: usize,
    /// Bytes tokenized now.
    pub(crate) tokenized_bytes: usize,
}

/// The last few texts tokenized and their tokens (see the module docs).
#[derive(Debug)]
pub(crate) struct TokenMemo<T> {
    entries: VecDeque<Entry<T>>,
}

impl<T> Default for TokenMemo<T> {
    fn default() -> Self {
        Self { entries: VecDeque::new() }
    }
}

impl<T: Clone> TokenMemo<T> {
    /// The tokens of `text`: those of the longest beginning it shares with a remembered text
    /// up to a cut, and `tokenize(part, bos)` of each part after it (the first part with
    /// `bos`, the others without). `cuts` are `text`'s cuts ([`SpecialTokens::cuts`]).
    /// Remembers `text`, forgetting the least recently used.
    ///
    /// # Errors
    /// The first error of `tokenize`.
    pub(crate) fn tokenize<E>(
        &mut self,
        text: &str,
        bos: bool,
        cuts: &[usize],
        mut tokenize: impl FnMut(&str, bool) -> Result<Vec<T>, E>,
    ) -> Result<MemoTokens<T>, E> {
        let (found, keep_byte, keep_tokens) = self.best_start(text, bos, cuts);
        let mut tokens = Vec::new();
        let mut marks = Vec::new();
        if let Some(index) = found {
            let entry = &self.entries[index];
            tokens.extend_from_slice(&entry.tokens[..keep_tokens]);
            marks.extend(entry.marks.iter().copied().take_while(|&(byte, _)| byte <= keep_byte));
        }
        let kept = tokens.len();
        let mut from = keep_byte;
        for &cut in cuts.iter().filter(|&&cut| cut > keep_byte).chain(std::iter::once(&text.len())) {
            if cut > from {
                tokens.extend(tokenize(&text[from..cut], bos && from == 0)?);
                from = cut;
            }
            if cut < text.len() {
                marks.push((cut, tokens.len()));
            }
        }
        if keep_byte == 0 && text.is_empty() {
            tokens = tokenize("", bos)?;
        }
        if let Some(index) = found {
            self.entries.remove(index);
        }
        if self.entries.len() == MEMO_ENTRIES {
            self.entries.pop_back();
        }
        self.entries.push_front(Entry { text: text.to_owned(), bos, tokens: tokens.clone(), marks });
        Ok(MemoTokens { tokens, kept, tokenized_bytes: text.len() - keep_byte })
    }

    /// The remembered text (its index) sharing the longest beginning with `text` up to one of
    /// its marks that is also a cut of `text`, that mark's byte and token count; `(None, 0,
    /// 0)` when none shares one.
    fn best_start(&self, text: &str, bos: bool, cuts: &[usize]) -> (Option<usize>, usize, usize) {
        let mut best = (None, 0, 0);
        for (index, entry) in self.entries.iter().enumerate() {
            if entry.bos != bos {
                continue;
            }
            let common = common_prefix(entry.text.as_bytes(), text.as_bytes());
            let mark = entry
                .marks
                .iter()
                .rev()
                .find(|&&(byte, _)| byte <= common && byte > best.1 && cuts.binary_search(&byte).is_ok());
            if let Some(&(byte, count)) = mark {
                best = (Some(index), byte, count);
            }
        }
        best
    }
}

/// Length of the longest common beginning of `a` and `b`, in bytes.
fn common_prefix(a: &[u8], b: &[u8]) -> usize {
    const BLOCK: usize = 64;
    let limit = a.len().min(b.len());
    let mut at = 0;
    while at + BLOCK <= limit && a[at..at + BLOCK] == b[at..at + BLOCK] {
        at += BLOCK;
    }
    while at < limit && a[at] == b[at] {
        at += 1;
    }
    at
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn specials(tokens: &[(&str, bool)]) -> SpecialTokens {
        SpecialTokens::new(tokens.iter().map(|(t, l)| (t.as_bytes().to_vec(), *l))).expect("valid special tokens")
    }

    #[test]
    fn cuts_fall_at_special_tokens_that_nothing_overlaps() {
        let s = specials(&[("<|im_start|>", false), ("<|im_end|>", false)]);
        let text = b"<|im_start|>system\nHi<|im_end|>\n<|im_start|>user\nYo<|im_end|>";
        assert_eq!(s.cuts(text), vec![21, 32, 51]);
        assert_eq!(s.cuts(b"no specials here"), Vec::<usize>::new());
        assert_eq!(specials(&[]).cuts(text), Vec::<usize>::new());
    }

    #[test]
    fn no_cut_inside_or_across_an_overlapping_match() {
        // "<a><b>" is itself special: no cut at "<b>" inside it (llama.cpp takes the longer
        // token first).
        let s = specials(&[("<a>", false), ("<b>", false), ("<a><b>", false)]);
        assert_eq!(s.cuts(b"x<a><b>y<b>"), vec![1, 8]);
        // "ab" and "bc" overlap in "abc": a cut at neither "b" nor inside.
        let s = specials(&[("ab", false), ("bc", false)]);
        assert_eq!(s.cuts(b"xabcx"), Vec::<usize>::new());
        assert_eq!(s.cuts(b"xab bc"), vec![1, 4]);
        // A token that repeats itself ("aa" in "aaa") overlaps.
        let s = specials(&[("aa", false)]);
        assert_eq!(s.cuts(b"xaaa"), Vec::<usize>::new());
    }

    #[test]
    fn a_token_that_strips_spaces_before_it_is_no_cut_after_a_space() {
        let s = specials(&[("<mask>", true), ("<sep>", false)]);
        assert_eq!(s.cuts(b"a <mask>b<mask> <sep>"), vec![9, 16]);
    }

    /// A tokenizer whose tokens depend on what came before within a part (pairs of
    /// characters), so a cut anywhere but at a special token changes them.
    fn pair_tokenizer(text: &str, bos: bool) -> Result<Vec<String>, ()> {
        let mut out = Vec::new();
        if bos {
            out.push("BOS".to_string());
        }
        let mut rest = text;
        while !rest.is_empty() {
            if let Some(after) = rest.strip_prefix("<s>") {
                out.push("<s>".into());
                rest = after;
                continue;
            }
            let raw_end = rest.find("<s>").unwrap_or(rest.len());
            let raw: Vec<char> = rest[..raw_end].chars().collect();
            out.extend(raw.chunks(2).map(|c| c.iter().collect::<String>()));
            rest = &rest[raw_end..];
        }
        Ok(out)
    }

    #[test]
    fn a_growing_conversation_keeps_its_tokens_and_tokenizes_the_rest() {
        let s = specials(&[("<s>", false)]);
        let mut memo = TokenMemo::default();
        let tokenize = |text: &str, memo: &mut TokenMemo<String>| {
            memo.tokenize(text, true, &s.cuts(text.as_bytes()), pair_tokenizer).expect("tokenized")
        };
        let first = "<s>sys: be brief<s>user: hi<s>bot:";
        let got = tokenize(first, &mut memo);
        assert_eq!((got.tokens, got.kept), (pair_tokenizer(first, true).expect("tokenized"), 0));
        let second = "<s>sys: be brief<s>user: hi<s>bot: hello<s>user: more<s>bot:";
        let got = tokenize(second, &mut memo);
        assert_eq!(got.tokens, pair_tokenizer(second, true).expect("tokenized"));
        // Kept: BOS and everything before the last "<s>" the two share.
        assert_eq!(got.kept, pair_tokenizer("<s>sys: be brief<s>user: hi", true).expect("tokenized").len());
        assert_eq!(got.tokenized_bytes, second.len() - "<s>sys: be brief<s>user: hi".len());
        // The same text again: everything up to its last cut is kept.
        let got = tokenize(second, &mut memo);
        assert_eq!(got.tokens, pair_tokenizer(second, true).expect("tokenized"));
        assert_eq!(got.tokenized_bytes, "<s>bot:".len());
    }

    #[test]
    fn an_edit_early_in_the_text_keeps_only_what_comes_before_it() {
        let s = specials(&[("<s>", false)]);
        let mut memo = TokenMemo::default();
        let a = "<s>aaaa<s>bbbb<s>cccc";
        let b = "<s>aaaa<s>bxbb<s>cccc";
        memo.tokenize(a, false, &s.cuts(a.as_bytes()), pair_tokenizer).expect("tokenized");
        let got = memo.tokenize(b, false, &s.cuts(b.as_bytes()), pair_tokenizer).expect("tokenized");
        assert_eq!(got.tokens, pair_tokenizer(b, false).expect("tokenized"));
        assert_eq!(got.kept, pair_tokenizer("<s>aaaa", false).expect("tokenized").len());
        // Another BOS rule shares nothing.
        let got = memo.tokenize(b, true, &s.cuts(b.as_bytes()), pair_tokenizer).expect("tokenized");
        assert_eq!((got.kept, got.tokens), (0, pair_tokenizer(b, true).expect("tokenized")));
    }

    #[test]
    fn the_memo_keeps_a_few_texts() {
        let s = specials(&[("<s>", false)]);
        let mut memo = TokenMemo::default();
        let texts: Vec<String> = (0..6).map(|i| format!("<s>conversation {i}<s>turn")).collect();
        for text in &texts {
            memo.tokenize(text, false, &s.cuts(text.as_bytes()), pair_tokenizer).expect("tokenized");
        }
        assert_eq!(memo.entries.len(), MEMO_ENTRIES);
        let again = format!("{}<s>more", texts[5]);
        let got = memo.tokenize(&again, false, &s.cuts(again.as_bytes()), pair_tokenizer).expect("tokenized");
        assert!(got.kept > 0);
        assert_eq!(got.tokens, pair_tokenizer(&again, false).expect("tokenized"));
    }

    proptest! {
        /// Whatever the texts, the memo's tokens are the whole text's (the pair tokenizer
        /// breaks on any cut but a special token's start).
        #[test]
        fn memo_tokens_equal_whole_tokenization(
            texts in proptest::collection::vec(
                proptest::collection::vec(prop_oneof!["<s>", "<", "s>", "a", "bc", " ", "é"], 0..24)
                    .prop_map(|parts| parts.concat()),
                1..8,
            ),
            bos: bool,
        ) {
            let s = specials(&[("<s>", false)]);
            let mut memo = TokenMemo::default();
            for text in &texts {
                for variant in [text.clone(), format!("{text}<s>a"), text.chars().take(5).collect()] {
                    let got = memo.tokenize(&variant, bos, &s.cuts(variant.as_bytes()), pair_tokenizer).expect("tokenized");
                    prop_assert_eq!(got.tokens, pair_tokenizer(&variant, bos).expect("tokenized"));
                }
            }
        }
    }
}
