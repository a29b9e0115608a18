//! How long one match of the model's pre-tokenizer can be, measured before llama.cpp splits a
//! text.
//!
//! llama.cpp splits text into words with a list of regular expressions per vocabulary
//! (`llama-vocab.cpp`). A few have hand-written splitters; the rest run through `std::regex`,
//! whose matcher recurses once per character of a match: a long enough match overflows any
//! stack and kills the process. So a text whose longest possible match is beyond
//! [`MAX_PROMPT_RUN`](super::tokenizer::MAX_PROMPT_RUN) is refused before it is tokenized.
//!
//! What one match can span depends on the expressions. Every vocabulary's expressions match
//! runs of one Unicode category: letters, with combining marks attached (`[\p{L}\p{M}]+`);
//! symbols and punctuation, marks included (`[^\s\p{L}\p{N}]+`); digits; whitespace. A few
//! pre-tokenizers join more, and are named in [`Splitter`].

use unicode_general_category::{get_general_category, GeneralCategory};

/// What one match of a vocabulary's pre-tokenizer can join beyond runs of one category.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Splitter {
    /// Runs of one category only (every other pre-tokenizer).
    Categories,
    /// `\S+`: anything but whitespace (`whitespace`).
    NonSpace,
    /// `[^(\s|.,!?…。，、।۔،)]+`: anything but whitespace and a few punctuation marks
    /// (`poro-chat`, `viking`, `bloom`, `gpt3-finnish`).
    NonSpaceNorStops,
    /// `(?:\p{L}\p{M}*(?: \p{L}\p{M}*)*)+`: words joined by single spaces (`exaone-moe`).
    SpaceJoinedWords,
    /// `[!-/:-~…]+`: ASCII letters and punctuation together (`deepseek-llm`).
    AsciiLettersAndPunctuation,
}

impl Splitter {
    /// The splitter of a vocabulary whose `tokenizer.ggml.pre` is `pre`.
    pub(crate) fn of(pre: &str) -> Self {
        match pre {
            "whitespace" => Self::NonSpace,
            "poro-chat" | "viking" | "bloom" | "gpt3-finnish" => Self::NonSpaceNorStops,
            "exaone-moe" => Self::SpaceJoinedWords,
            "deepseek-llm" => Self::AsciiLettersAndPunctuation,
            _ => Self::Categories,
        }
    }

    /// The longest stretch of `text` one match can span.
    pub(crate) fn longest_run(self, text: &str) -> usize {
        let mut categories = CategoryRuns::default();
        let mut extra = 0usize;
        let mut longest_extra = 0usize;
        let mut after_letter = false;
        let mut pending_space = false;
        for c in text.chars() {
            let class = Class::of(c);
            categories.push(class);
            extra = match self {
                Self::Categories => 0,
                Self::NonSpace => continued(extra, class != Class::Space),
                Self::NonSpaceNorStops => continued(extra, class != Class::Space && !is_stop(c)),
                Self::AsciiLettersAndPunctuation => continued(extra, is_ascii_letter_or_punctuation(c)),
                Self::SpaceJoinedWords => {
                    // A letter continues a word, or a word and one space before it; a mark
                    // continues a letter; one space after a letter waits for the next letter.
                    let (next, letter, space) = match class {
                        Class::Letter if after_letter || pending_space => (extra + 1, true, false),
                        Class::Letter => (1, true, false),
                        Class::Mark if after_letter => (extra + 1, true, false),
                        _ if c == ' ' && after_letter => (extra + 1, false, true),
                        _ => (0, false, false),
                    };
                    after_letter = letter;
                    pending_space = space;
                    next
                }
            };
            // A space waiting for its next letter is not yet part of a match.
            if !pending_space {
                longest_extra = longest_extra.max(extra);
            }
        }
        categories.longest.max(longest_extra)
    }
}

/// `run + 1` when the character continues it, else 0.
fn continued(run: usize, continues: bool) -> usize {
    if continues {
        run + 1
    } else {
        0
    }
}

/// The characters `[^(\s|.,!?…。，、।۔،)]` leaves out, whitespace aside.
fn is_stop(c: char) -> bool {
    matches!(c, '(' | '|' | ')' | '.' | ',' | '!' | '?' | '…' | '。' | '，' | '、' | '।' | '۔' | '،')
}

/// `[!-/:-~！-／：-～‘-‟　-。]`: ASCII printable characters but digits and space, their full-width
/// forms, quotation marks and CJK punctuation.
fn is_ascii_letter_or_punctuation(c: char) -> bool {
    matches!(c, '!'..='/' | ':'..='~' | '！'..='／' | '：'..='～' | '‘'..='‟' | '\u{3000}'..='。')
}

/// A character's Unicode category, as the pre-tokenizers' expressions group them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Class {
    Letter,
    Mark,
    Digit,
    Space,
    Other,
}

impl Class {
    fn of(c: char) -> Self {
        use GeneralCategory as G;
        if c.is_whitespace() {
            return Self::Space;
        }
        match get_general_category(c) {
            G::UppercaseLetter | G::LowercaseLetter | G::TitlecaseLetter | G::ModifierLetter | G::OtherLetter => {
                Self::Letter
            }
            G::NonspacingMark | G::SpacingMark | G::EnclosingMark => Self::Mark,
            G::DecimalNumber | G::LetterNumber | G::OtherNumber => Self::Digit,
            _ => Self::Other,
        }
    }
}

/// The longest runs of letters and marks, of other characters and marks, of digits and of
/// whitespace (a mark joins the letters or the symbols around it, as `\p{M}` does in the
/// expressions).
#[derive(Default)]
struct CategoryRuns {
    letters: usize,
    others: usize,
    digits: usize,
    spaces: usize,
    longest: usize,
}

impl CategoryRuns {
    fn push(&mut self, class: Class) {
        let is = |wanted: &[Class]| wanted.contains(&class);
        self.letters = continued(self.letters, is(&[Class::Letter, Class::Mark]));
        self.others = continued(self.others, is(&[Class::Other, Class::Mark]));
        self.digits = continued(self.digits, is(&[Class::Digit]));
        self.spaces = continued(self.spaces, is(&[Class::Space]));
        self.longest = self.longest.max(self.letters).max(self.others).max(self.digits).max(self.spaces);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const COMBINING_ACUTE: char = '\u{301}';

    #[test]
    fn runs_are_counted_per_category() {
        let runs = |text: &str| Splitter::Categories.longest_run(text);
        assert_eq!(runs(""), 0);
        assert_eq!(runs("ab  12"), 2);
        assert_eq!(runs(&" ".repeat(10_000)), 10_000);
        assert_eq!(runs(&format!("x{}y", "é".repeat(300))), 302);
        assert_eq!(runs("a1a1a1!?!"), 3);
        assert_eq!(runs("a a a a"), 1);
    }

    /// Decomposed "á" is a letter and a combining mark: `[\p{L}\p{M}]+` matches any number of
    /// them as one run, and so does `[^\s\p{L}\p{N}]+` after a symbol.
    #[test]
    fn combining_marks_join_the_run_they_follow() {
        let decomposed: String = std::iter::repeat_n(['a', COMBINING_ACUTE], 1000).flatten().collect();
        assert_eq!(Splitter::Categories.longest_run(&decomposed), 2000);
        let marked_symbols: String = std::iter::repeat_n(['!', COMBINING_ACUTE], 500).flatten().collect();
        assert_eq!(Splitter::Categories.longest_run(&marked_symbols), 1000);
        assert_eq!(Splitter::Categories.longest_run(&COMBINING_ACUTE.to_string().repeat(40)), 40);
        assert_eq!(Splitter::Categories.longest_run(&format!("1{COMBINING_ACUTE}1{COMBINING_ACUTE}")), 1);
    }

    #[test]
    fn space_joined_words_are_one_run_for_exaone_moe() {
        let words = "a ".repeat(1000);
        assert_eq!(Splitter::of("exaone-moe").longest_run(&words), 1999);
        assert_eq!(Splitter::Categories.longest_run(&words), 1);
        // Two spaces, a line break or a digit end the run; a mark continues a letter.
        assert_eq!(Splitter::SpaceJoinedWords.longest_run("ab cd  ef"), 5);
        assert_eq!(Splitter::SpaceJoinedWords.longest_run("ab\ncd 1 ef"), 2);
        assert_eq!(Splitter::SpaceJoinedWords.longest_run(&format!("a{COMBINING_ACUTE} b")), 4);
    }

    #[test]
    fn other_splitters_join_what_their_expression_matches() {
        let mixed = "a1!".repeat(100);
        assert_eq!(Splitter::of("whitespace").longest_run(&format!("{mixed} x")), 300);
        assert_eq!(Splitter::of("bloom").longest_run(&"a1$".repeat(100)), 300);
        assert_eq!(Splitter::of("poro-chat").longest_run(&"ab,".repeat(100)), 2);
        assert_eq!(Splitter::of("deepseek-llm").longest_run(&"a!".repeat(100)), 200);
        assert_eq!(Splitter::of("deepseek-llm").longest_run("a1a1"), 1);
        for pre in ["deepseek-v3", "tekken", "llama-bpe", "qwen2", "smollm", ""] {
            assert_eq!(Splitter::of(pre), Splitter::Categories, "{pre}");
        }
    }
}
