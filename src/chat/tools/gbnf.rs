//! Small operations on GBNF grammar text.

/// Prefixes every rule name in `grammar` (definitions and references) with `prefix`, so several
/// generated grammars can live in one file without their rules (`root`, `space`, ...) clashing.
/// String literals, character classes, repetition counts and comments are left as they are.
pub(crate) fn prefix_rules(grammar: &str, prefix: &str) -> String {
    let mut out = String::with_capacity(grammar.len() + grammar.len() / 4);
    let mut chars = grammar.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '"' | '[' => {
                let close = if c == '"' { '"' } else { ']' };
                out.push(c);
                while let Some(inner) = chars.next() {
                    out.push(inner);
                    if inner == '\\' {
                        if let Some(escaped) = chars.next() {
                            out.push(escaped);
                        }
                    } else if inner == close {
                        break;
                    }
                }
            }
            '{' | '#' => {
                let close = if c == '{' { '}' } else { '\n' };
                out.push(c);
                for inner in chars.by_ref() {
                    out.push(inner);
                    if inner == close {
                        break;
                    }
                }
            }
            c if is_word_char(c) => {
                out.push_str(prefix);
                out.push(c);
                while let Some(&next) = chars.peek() {
                    if !is_word_char(next) {
                        break;
                    }
                    out.push(next);
                    chars.next();
                }
            }
            c => out.push(c),
        }
    }
    out
}

/// Characters of a GBNF rule name (llama.cpp's `is_word_char`).
fn is_word_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '-' || c == '_'
}

/// `text` as a GBNF string literal. Control characters are written as escapes: llama.cpp reads
/// the grammar as a C string, which a raw NUL would end.
pub(crate) fn literal(text: &str) -> String {
    let mut out = String::from("\"");
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c.is_ascii_control() => out.push_str(&format!("\\x{:02X}", u32::from(c))),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// A GBNF character class matching any character except `excluded`, which are written as
/// escapes so none of them can read as a range or the class's end.
pub(crate) fn class_excluding(excluded: &[char]) -> String {
    let mut out = String::from("[^");
    for &c in excluded {
        match u32::from(c) {
            code @ 0..=0xFF => out.push_str(&format!("\\x{code:02X}")),
            code @ 0x100..=0xFFFF => out.push_str(&format!("\\u{code:04X}")),
            code => out.push_str(&format!("\\U{code:08X}")),
        }
    }
    out.push(']');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_names_but_not_literals_classes_counts_or_comments() {
        let grammar = "root ::= \"{\" space \"\\\"a-b\\\"\" [a-z\\]-] item{1,3} # root here\nspace ::= | \" \"\nitem ::= [0-9]+\n";
        assert_eq!(
            prefix_rules(grammar, "t0-"),
            "t0-root ::= \"{\" t0-space \"\\\"a-b\\\"\" [a-z\\]-] t0-item{1,3} # root here\nt0-space ::= | \" \"\nt0-item ::= [0-9]+\n"
        );
    }

    #[test]
    fn excluded_characters_are_escaped() {
        assert_eq!(class_excluding(&['<', '-', ']', 'é', '→']), r"[^\x3C\x2D\x5D\xE9\u2192]");
    }

    #[test]
    fn literals_escape_quotes_backslashes_and_newlines() {
        assert_eq!(literal("<a \"b\"\\\n>"), r#""<a \"b\"\\\n>""#);
    }

    #[test]
    fn control_characters_in_literals_are_escaped() {
        // Found by fuzz/fuzz_targets/schema_grammar.rs: a property name with a NUL ended
        // llama.cpp's reading of a Gemma-format grammar early.
        assert_eq!(literal("a\u{0}b\u{1f}\u{7f}"), r#""a\x00b\x1F\x7F""#);
    }
}
