//! Matching a format's marker at the start of the text, lenient about whitespace.

use super::super::syntax::{CALL_ID, CALL_INDEX, CALL_NUMBER};

/// How a marker matches the start of a text.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Match {
    /// The whole marker, in this many bytes of the text (whitespace before it included).
    Full(usize),
    /// The text so far is a beginning of the marker: more text decides.
    Partial,
    /// The text does not start with the marker.
    No,
}

/// Whether `text` starts with `marker`, where whitespace before the marker is skipped, a run of
/// whitespace in the marker matches any run of whitespace (or none) in the text, and
/// [`CALL_INDEX`] matches a number and [`CALL_ID`] an id (letters, digits, `_`, `-`). Whitespace
/// at the marker's end is taken whole: a text that ends in it is [`Match::Partial`].
pub(crate) fn match_literal(text: &str, marker: &str) -> Match {
    if marker.is_empty() {
        return Match::Full(0);
    }
    // A call's number is a number as its index is.
    let marker = marker.replace(CALL_NUMBER, CALL_INDEX);
    let marker = marker.as_str();
    let mut at = text.len() - text.trim_start().len();
    let mut rest = marker.trim_start();
    if rest.is_empty() {
        // A marker of whitespace only: all the whitespace there is.
        return if at == text.len() { Match::Partial } else { Match::Full(at) };
    }
    while !rest.is_empty() {
        if let Some(after) = rest.strip_prefix(CALL_ID) {
            let id = text[at..].len()
                - text[at..].trim_start_matches(|c: char| c.is_ascii_alphanumeric() || c == '_' || c == '-').len();
            if at + id == text.len() {
                return Match::Partial;
            }
            if id == 0 {
                return Match::No;
            }
            at += id;
            rest = after;
            continue;
        }
        if let Some(after) = rest.strip_prefix(CALL_INDEX) {
            let digits = text[at..].len() - text[at..].trim_start_matches(|c: char| c.is_ascii_digit()).len();
            if at + digits == text.len() {
                return Match::Partial;
            }
            if digits == 0 {
                return Match::No;
            }
            at += digits;
            rest = after;
            continue;
        }
        let Some(c) = rest.chars().next() else { break };
        if c.is_whitespace() {
            rest = rest.trim_start();
            let skipped = text[at..].len() - text[at..].trim_start().len();
            at += skipped;
            if at == text.len() {
                return Match::Partial;
            }
            continue;
        }
        match text[at..].chars().next() {
            None => return Match::Partial,
            Some(t) if t == c => {
                at += c.len_utf8();
                rest = &rest[c.len_utf8()..];
            }
            Some(_) => return Match::No,
        }
    }
    Match::Full(at)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn whitespace_is_lenient_and_trailing_whitespace_waits() {
        assert_eq!(match_literal("\n</tool_call>x", "\n</tool_call>"), Match::Full(13));
        assert_eq!(match_literal("</tool_call>", "\n</tool_call>"), Match::Full(12));
        assert_eq!(match_literal("  </tool", "\n</tool_call>"), Match::Partial);
        assert_eq!(match_literal("</tool_x", "\n</tool_call>"), Match::No);
        assert_eq!(match_literal(">\n", ">\n"), Match::Partial, "more whitespace may follow");
        assert_eq!(match_literal(">\n\nP", ">\n"), Match::Full(3));
        assert_eq!(match_literal("x", ""), Match::Full(0));
    }

    #[test]
    fn a_call_index_is_a_number() {
        let marker = ":{index}<|tool_call_argument_begin|>";
        assert_eq!(match_literal(":12<|tool_call_argument_begin|>{", marker), Match::Full(31));
        assert_eq!(match_literal(":1", marker), Match::Partial);
        assert_eq!(match_literal(":<", marker), Match::No);
    }
}
