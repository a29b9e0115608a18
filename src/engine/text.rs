//! Turning sampled token bytes into text: UTF-8 reassembly and stop strings.
//!
//! Both are pure state machines fed one token at a time, so they can be tested on literal
//! byte sequences without a model.

/// Reassembles UTF-8 text from token byte pieces that may split a character.
#[derive(Debug, Default)]
pub(crate) struct Utf8Stream {
    pending: Vec<u8>,
}

impl Utf8Stream {
    /// Adds a token's bytes; returns the text that is now complete.
    ///
    /// Bytes that cannot start or continue a valid character become U+FFFD; an incomplete
    /// character at the end is held until the next piece arrives.
    pub(crate) fn push(&mut self, bytes: &[u8]) -> String {
        self.pending.extend_from_slice(bytes);
        let mut out = String::new();
        let mut rest: &[u8] = &self.pending;
        loop {
            match std::str::from_utf8(rest) {
                Ok(valid) => {
                    out.push_str(valid);
                    rest = &[];
                    break;
                }
                Err(e) => {
                    let (valid, after) = rest.split_at(e.valid_up_to());
                    // SAFETY-free: `valid_up_to` guarantees this prefix is UTF-8.
                    out.push_str(std::str::from_utf8(valid).unwrap_or_default());
                    match e.error_len() {
                        Some(bad) => {
                            out.push(char::REPLACEMENT_CHARACTER);
                            rest = &after[bad..];
                        }
                        None => {
                            rest = after;
                            break;
                        }
                    }
                }
            }
        }
        let keep = rest.len();
        self.pending.drain(..self.pending.len() - keep);
        out
    }

    /// Ends the stream: an unfinished character becomes U+FFFD.
    pub(crate) fn finish(&mut self) -> String {
        if self.pending.is_empty() {
            String::new()
        } else {
            self.pending.clear();
            char::REPLACEMENT_CHARACTER.to_string()
        }
    }
}

/// Finds stop strings in streamed text, holding back what could still become one.
#[derive(Debug)]
pub(crate) struct StopMatcher {
    stops: Vec<String>,
    held: String,
}

/// What the matcher lets through after a push.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum StopScan {
    /// Text safe to emit; generation goes on.
    Continue(String),
    /// A stop string was found: the text before it, and generation ends.
    Stopped(String),
}

impl StopMatcher {
    /// A matcher for these stop strings (empty strings are ignored).
    pub(crate) fn new(stops: &[String]) -> Self {
        Self { stops: stops.iter().filter(|s| !s.is_empty()).cloned().collect(), held: String::new() }
    }

    /// Adds text; returns what can be emitted now.
    pub(crate) fn push(&mut self, text: &str) -> StopScan {
        self.held.push_str(text);
        if self.stops.is_empty() {
            return StopScan::Continue(std::mem::take(&mut self.held));
        }
        let first_stop = self.stops.iter().filter_map(|s| self.held.find(s.as_str())).min();
        if let Some(at) = first_stop {
            let before = self.held[..at].to_string();
            self.held.clear();
            return StopScan::Stopped(before);
        }
        let hold = self.partial_stop_suffix_len();
        let emit_len = self.held.len() - hold;
        let emitted = self.held[..emit_len].to_string();
        self.held.drain(..emit_len);
        StopScan::Continue(emitted)
    }

    /// Ends the stream: held-back text was not a stop string after all.
    pub(crate) fn finish(&mut self) -> String {
        std::mem::take(&mut self.held)
    }

    /// Length of the longest suffix of the held text that is a proper prefix of a stop string.
    fn partial_stop_suffix_len(&self) -> usize {
        let held = self.held.as_str();
        held.char_indices()
            .map(|(i, _)| i)
            .find(|&i| self.stops.iter().any(|s| s.starts_with(&held[i..])))
            .map_or(0, |i| held.len() - i)
    }
}

/// The longest run of characters of one kind (letters and marks, digits, whitespace, or any
/// other) in `text`. Some of llama.cpp's pre-tokenizers split text with `std::regex`, whose
/// matcher recurses once per character of a match, and a match never spans two kinds: this
/// bounds the stack the tokenizer needs.
pub(crate) fn longest_run(text: &str) -> usize {
    #[derive(PartialEq, Eq, Clone, Copy)]
    enum Kind {
        Letter,
        Digit,
        Space,
        Other,
    }
    let kind = |c: char| {
        if c.is_alphabetic() {
            Kind::Letter
        } else if c.is_numeric() {
            Kind::Digit
        } else if c.is_whitespace() {
            Kind::Space
        } else {
            Kind::Other
        }
    };
    let (mut longest, mut run, mut last) = (0, 0, None);
    for c in text.chars() {
        let k = kind(c);
        run = if Some(k) == last { run + 1 } else { 1 };
        last = Some(k);
        longest = longest.max(run);
    }
    longest
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_are_counted_per_kind_of_character() {
        assert_eq!(longest_run(""), 0);
        assert_eq!(longest_run("ab  12"), 2);
        assert_eq!(longest_run(&" ".repeat(10_000)), 10_000);
        assert_eq!(longest_run(&format!("x{}y", "é".repeat(300))), 302);
        assert_eq!(longest_run("a1a1a1!?!"), 3);
    }

    #[test]
    fn multibyte_character_split_across_tokens_comes_out_whole() {
        let mut s = Utf8Stream::default();
        let euro = "€".as_bytes(); // e2 82 ac
        assert_eq!(s.push(&euro[..1]), "");
        assert_eq!(s.push(&euro[1..2]), "");
        assert_eq!(s.push(&[euro[2], b'!']), "€!");
        assert_eq!(s.finish(), "");
    }

    #[test]
    fn emoji_split_in_every_position() {
        let text = "a😀b€c";
        let bytes = text.as_bytes();
        for cut in 0..=bytes.len() {
            let mut s = Utf8Stream::default();
            let mut out = s.push(&bytes[..cut]);
            out += &s.push(&bytes[cut..]);
            out += &s.finish();
            assert_eq!(out, text, "cut at {cut}");
        }
    }

    #[test]
    fn invalid_bytes_become_replacement_characters() {
        let mut s = Utf8Stream::default();
        assert_eq!(s.push(&[b'a', 0xff, b'b']), "a\u{fffd}b");
    }

    #[test]
    fn unfinished_character_at_the_end_is_replaced() {
        let mut s = Utf8Stream::default();
        assert_eq!(s.push(&[b'x', 0xe2, 0x82]), "x");
        assert_eq!(s.finish(), "\u{fffd}");
    }

    #[test]
    fn no_stops_passes_everything_through() {
        let mut m = StopMatcher::new(&[]);
        assert_eq!(m.push("hello"), StopScan::Continue("hello".into()));
    }

    #[test]
    fn stop_inside_one_piece_cuts_before_it() {
        let mut m = StopMatcher::new(&["END".into()]);
        assert_eq!(m.push("abcENDxyz"), StopScan::Stopped("abc".into()));
    }

    #[test]
    fn stop_split_across_pieces_is_held_back_then_found() {
        let mut m = StopMatcher::new(&["\nUser:".into()]);
        assert_eq!(m.push("Hi there"), StopScan::Continue("Hi there".into()));
        assert_eq!(m.push("!\nUs"), StopScan::Continue("!".into()));
        assert_eq!(m.push("er"), StopScan::Continue(String::new()));
        assert_eq!(m.push(": next"), StopScan::Stopped(String::new()));
    }

    #[test]
    fn held_text_is_released_when_it_stops_matching() {
        let mut m = StopMatcher::new(&["STOP".into()]);
        assert_eq!(m.push("ST"), StopScan::Continue(String::new()));
        assert_eq!(m.push("AR"), StopScan::Continue("STAR".into()));
        assert_eq!(m.push("ST"), StopScan::Continue(String::new()));
        assert_eq!(m.finish(), "ST");
    }

    #[test]
    fn earliest_of_several_stops_wins() {
        let mut m = StopMatcher::new(&["cd".into(), "b".into()]);
        assert_eq!(m.push("abcd"), StopScan::Stopped("a".into()));
    }

    #[test]
    fn multibyte_text_near_a_partial_stop() {
        let mut m = StopMatcher::new(&["éx".into()]);
        assert_eq!(m.push("café"), StopScan::Continue("caf".into()));
        assert_eq!(m.push("!"), StopScan::Continue("é!".into()));
    }

    #[test]
    fn every_split_of_a_stream_gives_the_same_result() {
        let text = "The answer is 42.\n\nQuestion: next";
        for cut in 1..text.len() {
            if !text.is_char_boundary(cut) {
                continue;
            }
            let mut m = StopMatcher::new(&["\n\nQuestion:".into()]);
            let mut out = String::new();
            let mut stopped = false;
            for piece in [&text[..cut], &text[cut..]] {
                match m.push(piece) {
                    StopScan::Continue(t) => out += &t,
                    StopScan::Stopped(t) => {
                        out += &t;
                        stopped = true;
                        break;
                    }
                }
            }
            assert!(stopped, "cut {cut}");
            assert_eq!(out, "The answer is 42.", "cut {cut}");
        }
    }
}
