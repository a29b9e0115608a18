//! transformers' `{% generation %}` blocks, which minijinja does not know.
//!
//! transformers marks the assistant's own text with `{% generation %}` … `{% endgeneration %}`
//! (to train on it) and renders the block as its body, in a scope of its own (the body is a call
//! block's macro: `set` inside does not leak out). A `{% with %}` block renders the same text
//! with the same scoping and the same whitespace control, so the tags are rewritten to it before
//! compiling.

use std::borrow::Cow;

/// `source` with each `{% generation %}` tag written as `{% with %}` and each
/// `{% endgeneration %}` as `{% endwith %}` (whitespace-control marks kept). Text in comments,
/// expressions, string literals and `{% raw %}` blocks is left alone.
pub(super) fn rewrite_generation_blocks(source: &str) -> Cow<'_, str> {
    if !source.contains("generation") {
        return Cow::Borrowed(source);
    }
    let mut out = String::with_capacity(source.len());
    let mut rest = source;
    let mut in_raw = false;
    while let Some(open) = rest.find('{') {
        let after = &rest[open..];
        let (close, tag) = if after.starts_with("{#") {
            (after.find("#}").map(|end| end + 2), None)
        } else if let Some(inside) = after.strip_prefix("{{") {
            (tag_end(inside, "}}").map(|end| end + 2), None)
        } else if let Some(inside) = after.strip_prefix("{%") {
            let end = tag_end(inside, "%}");
            (end.map(|end| end + 2), end.map(|end| &inside[..end - 2]))
        } else {
            out.push_str(&rest[..=open]);
            rest = &rest[open + 1..];
            continue;
        };
        // An unterminated tag: minijinja reports it when compiling.
        let Some(close) = close else { break };
        out.push_str(&rest[..open]);
        let text = &after[..close];
        let word = tag.map(tag_word);
        match word {
            Some("raw") => in_raw = true,
            Some("endraw") => in_raw = false,
            _ => {}
        }
        match (in_raw, word) {
            (false, Some("generation")) => out.push_str(&text.replacen("generation", "with", 1)),
            (false, Some("endgeneration")) => out.push_str(&text.replacen("endgeneration", "endwith", 1)),
            _ => out.push_str(text),
        }
        rest = &after[close..];
    }
    out.push_str(rest);
    Cow::Owned(out)
}

/// Where `end` closes a tag whose inside starts `inside`, string literals skipped.
fn tag_end(inside: &str, end: &str) -> Option<usize> {
    let bytes = inside.as_bytes();
    let mut quote = None;
    let mut i = 0;
    while i < bytes.len() {
        match (quote, bytes[i]) {
            (Some(_), b'\\') => i += 1,
            (Some(q), c) if c == q => quote = None,
            (None, b'\'' | b'"') => quote = Some(bytes[i]),
            (None, _) if inside[i..].starts_with(end) => return Some(i + end.len()),
            _ => {}
        }
        i += 1;
    }
    None
}

/// A block tag's statement word (`if`, `generation`, ...), whitespace-control marks aside.
fn tag_word(tag: &str) -> &str {
    let inner = tag.trim_start_matches(['-', '+']).trim_end_matches(['-', '+']).trim();
    inner.split_whitespace().next().unwrap_or("")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generation_tags_become_with_blocks_and_keep_their_whitespace_control() {
        assert_eq!(
            rewrite_generation_blocks("a{%- generation -%}b{% endgeneration %}c{%generation%}{%+ endgeneration -%}"),
            "a{%- with -%}b{% endwith %}c{%with%}{%+ endwith -%}"
        );
    }

    #[test]
    fn comments_expressions_strings_and_raw_blocks_are_left_alone() {
        let source = "{# {% generation %} #}{{ '{% generation %}' }}{% set x = \"%}{% generation %}\" %}\
            {% raw %}{% generation %}{% endraw %}";
        assert_eq!(rewrite_generation_blocks(source), source);
        assert!(matches!(rewrite_generation_blocks("no such block"), Cow::Borrowed(_)));
    }

    #[test]
    fn an_unterminated_tag_is_left_for_the_compiler_to_report() {
        assert_eq!(rewrite_generation_blocks("{% generation "), "{% generation ");
    }
}
