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
    /// A stop string was completed: the text before it, and generation ends.
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
        // The stop completed first, as if the text had come one character at a time (the
        // longest of those ending there): a stop inside a longer one that began earlier ends
        // generation before that one could, however the text is split into pieces.
        let first_completed =
            self.stops.iter().filter_map(|s| self.held.find(s.as_str()).map(|at| (at + s.len(), at))).min();
        if let Some((_, at)) = first_completed {
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

#[cfg(test)]
mod tests {
    use super::*;

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
    fn a_stop_inside_a_longer_one_ends_generation_before_the_longer_one_completes() {
        // Found by the property below: in one piece, "\n a" was cut at its start, while
        // pushed one character at a time " " completes first.
        let stops = [" ".to_string(), "\n a".to_string()];
        assert_eq!(StopMatcher::new(&stops).push("\n a a"), StopScan::Stopped("\n".into()));
        let mut m = StopMatcher::new(&stops);
        assert_eq!(m.push("\n"), StopScan::Continue(String::new()));
        assert_eq!(m.push(" a a"), StopScan::Stopped("\n".into()));
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

    /// Property tests: any bytes or text, any split into pieces.
    mod properties {
        use proptest::collection::vec;
        use proptest::prelude::*;
        use proptest::sample::{select, Index};

        use super::*;

        /// Byte strings rich in what UTF-8 decoding gets wrong: whole characters of every
        /// length, characters cut short, stray continuation bytes, overlong forms, surrogates,
        /// code points past U+10FFFF and bytes that never occur in UTF-8.
        fn tricky_bytes() -> impl Strategy<Value = Vec<u8>> {
            let whole = any::<char>().prop_map(|c| c.to_string().into_bytes());
            let cut_short = (any::<char>(), any::<Index>()).prop_map(|(c, at)| {
                let bytes = c.to_string().into_bytes();
                bytes[..at.index(bytes.len())].to_vec()
            });
            let odd = select(vec![
                vec![0x80],
                vec![0xbf],
                vec![0xc0, 0xaf],
                vec![0xe0, 0x80, 0xaf],
                vec![0xed, 0xa0, 0x80],
                vec![0xf4, 0x90, 0x80, 0x80],
                vec![0xf5],
                vec![0xff],
            ]);
            vec(prop_oneof![whole, cut_short, odd, any::<u8>().prop_map(|b| vec![b])], 0..12)
                .prop_map(|atoms| atoms.concat())
        }

        /// The ranges that split `0..len` at `cut_points` (each at most `len`, in any order;
        /// repeated points make empty pieces).
        fn piece_ranges(cut_points: impl IntoIterator<Item = usize>, len: usize) -> Vec<std::ops::Range<usize>> {
            let mut points: Vec<usize> = cut_points.into_iter().collect();
            points.sort_unstable();
            let starts = [0].into_iter().chain(points.iter().copied());
            starts.zip(points.iter().copied().chain([len])).map(|(start, end)| start..end).collect()
        }

        /// Characters of 1 to 4 bytes, few enough that stop strings recur in the text.
        fn small_alphabet_text(len: std::ops::Range<usize>) -> impl Strategy<Value = String> {
            vec(select(vec!['a', 'b', 'c', ' ', '\n', 'é', '€', '😀']), len).prop_map(String::from_iter)
        }

        /// A stop string: mostly a piece of the text (so that it occurs), sometimes any.
        #[derive(Clone, Debug)]
        enum StopSpec {
            /// Up to `.1` characters of the text from the character at `.0`.
            InText(Index, usize),
            Literal(String),
        }

        fn stop_spec() -> impl Strategy<Value = StopSpec> {
            prop_oneof![
                3 => (any::<Index>(), 1..5usize).prop_map(|(at, len)| StopSpec::InText(at, len)),
                1 => small_alphabet_text(0..4).prop_map(StopSpec::Literal),
            ]
        }

        fn resolve_stop(spec: &StopSpec, text: &str) -> String {
            match spec {
                StopSpec::InText(at, len) => {
                    let chars: Vec<char> = text.chars().collect();
                    chars.iter().skip(at.index(chars.len() + 1)).take(*len).collect()
                }
                StopSpec::Literal(stop) => stop.clone(),
            }
        }

        /// Where generation must end, whatever the pieces: at the first stop string to be
        /// completed (the longest of those ending there), as (start, end) of that stop.
        fn expected_stop(text: &str, stops: &[String]) -> Option<(usize, usize)> {
            let mut ends = text.char_indices().map(|(i, _)| i).skip(1).chain([text.len()]);
            ends.find_map(|end| {
                let ending_here = stops.iter().filter(|s| !s.is_empty() && text[..end].ends_with(s.as_str()));
                ending_here.map(|s| (end - s.len(), end)).min()
            })
        }

        proptest! {
            #[test]
            fn utf8_stream_decodes_like_from_utf8_lossy(bytes in tricky_bytes(), cuts in vec(any::<Index>(), 0..6)) {
                let mut stream = Utf8Stream::default();
                let mut out = String::new();
                for piece in piece_ranges(cuts.iter().map(|cut| cut.index(bytes.len() + 1)), bytes.len()) {
                    out += &stream.push(&bytes[piece.clone()]);
                    // Only an unfinished character is held back: ending here decodes what
                    // came so far exactly as a whole would.
                    prop_assert!(stream.pending.len() < 4);
                    prop_assert!(stream.pending.is_empty() || std::str::from_utf8(&stream.pending).is_err());
                    let ending_here = Utf8Stream { pending: stream.pending.clone() }.finish();
                    prop_assert_eq!(out.clone() + &ending_here, String::from_utf8_lossy(&bytes[..piece.end]));
                }
                out += &stream.finish();
                prop_assert_eq!(out, String::from_utf8_lossy(&bytes));
            }

            #[test]
            fn stop_matcher_cuts_before_the_first_completed_stop_whatever_the_pieces(
                text in small_alphabet_text(0..24),
                stop_specs in vec(stop_spec(), 0..4),
                cuts in vec(any::<Index>(), 0..6),
            ) {
                let stops: Vec<String> = stop_specs.iter().map(|spec| resolve_stop(spec, &text)).collect();
                let boundaries: Vec<usize> = text.char_indices().map(|(i, _)| i).chain([text.len()]).collect();
                let cut_points = cuts.iter().map(|cut| boundaries[cut.index(boundaries.len())]);
                let stop = expected_stop(&text, &stops);
                let expected = &text[..stop.map_or(text.len(), |(start, _)| start)];
                let mut matcher = StopMatcher::new(&stops);
                let mut released = String::new();
                let mut stopped = false;
                for piece in piece_ranges(cut_points, text.len()) {
                    match matcher.push(&text[piece.clone()]) {
                        StopScan::Continue(more) => released += &more,
                        StopScan::Stopped(before) => {
                            released += &before;
                            stopped = true;
                        }
                    }
                    let completed = stop.is_some_and(|(_, end)| end <= piece.end);
                    prop_assert_eq!(stopped, completed, "stopped after {:?}", &text[..piece.end]);
                    if stopped {
                        break;
                    }
                    // Nothing released is ever part of a stop, and only what could still
                    // become one is held back.
                    prop_assert!(expected.starts_with(&released), "released {:?}", released);
                    let held = &text[released.len()..piece.end];
                    prop_assert!(held.is_empty() || stops.iter().any(|s| s.len() > held.len() && s.starts_with(held)));
                }
                if !stopped {
                    released += &matcher.finish();
                }
                prop_assert_eq!(released, expected);
            }
        }
    }
}
