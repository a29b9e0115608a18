//! Values printed the way Python prints them, as transformers' jinja2 does: `{{ value }}`, the
//! `string` filter and `is iterable` follow Python, not minijinja's own conventions.
//!
//! - A dict or list prints as Python's `repr` (`{'type': 'function'}`, `['a', 1]`), which
//!   templates rely on (Apriel writes each tool with `{{ tool|string }}`).
//! - `upper` and `lower` work on that text too (Gemma 4 upper-cases a parameter's type list).
//! - `None`, `True` and `False` print capitalized; floats print as Python's `repr` (`1e+16`).
//! - `is iterable` is false for `none` (Python cannot iterate `None`), so a template's
//!   `tools is iterable and tools | length > 0` holds without tools.

use minijinja::value::ValueKind;
use minijinja::{Error, Output, State, Value};

use crate::chat::pyjson;

/// The formatter of `{{ … }}`: Python's `str()` of the value.
pub(super) fn format(out: &mut Output, _state: &State, value: &Value) -> Result<(), Error> {
    out.write_str(&str_of(value)).map_err(Error::from)
}

/// The `string` filter: Python's `str()`.
pub(super) fn string_filter(value: &Value) -> Value {
    if value.kind() == ValueKind::String {
        return value.clone();
    }
    Value::from(str_of(value))
}

/// The `upper` filter: Python's `str(value).upper()` (Gemma 4 upper-cases a parameter's `type`,
/// which may be a list).
pub(super) fn upper_filter(value: &Value) -> Value {
    Value::from(str_of(value).to_uppercase())
}

/// The `lower` filter: Python's `str(value).lower()`.
pub(super) fn lower_filter(value: &Value) -> Value {
    Value::from(str_of(value).to_lowercase())
}

/// The `iterable` test: whether Python can iterate the value (jinja2's undefined iterates as
/// empty; `None`, numbers and booleans do not iterate).
pub(super) fn is_iterable(value: &Value) -> bool {
    matches!(
        value.kind(),
        ValueKind::Undefined
            | ValueKind::String
            | ValueKind::Bytes
            | ValueKind::Seq
            | ValueKind::Map
            | ValueKind::Iterable
    )
}

/// Python's `str(value)`: strings as they are, everything else as [`repr`].
pub(super) fn str_of(value: &Value) -> String {
    match value.kind() {
        ValueKind::String => value.as_str().unwrap_or_default().to_string(),
        ValueKind::Undefined => String::new(),
        _ => {
            let mut out = String::new();
            repr(value, &mut out);
            out
        }
    }
}

/// Python's `repr(value)`.
fn repr(value: &Value, out: &mut String) {
    match value.kind() {
        ValueKind::Undefined => {}
        ValueKind::None => out.push_str("None"),
        ValueKind::Bool => out.push_str(if value.is_true() { "True" } else { "False" }),
        ValueKind::Number if !value.is_integer() => match f64::try_from(value.clone()) {
            Ok(number) => out.push_str(&pyjson::float_repr(number)),
            Err(_) => out.push_str(&value.to_string()),
        },
        ValueKind::String => string_repr(value.as_str().unwrap_or_default(), out),
        ValueKind::Seq | ValueKind::Iterable => {
            out.push('[');
            for (i, item) in value.try_iter().into_iter().flatten().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                repr(&item, out);
            }
            out.push(']');
        }
        ValueKind::Map => {
            out.push('{');
            for (i, key) in value.try_iter().into_iter().flatten().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                repr(&key, out);
                out.push_str(": ");
                repr(&value.get_item(&key).unwrap_or_default(), out);
            }
            out.push('}');
        }
        _ => out.push_str(&value.to_string()),
    }
}

/// Python's `repr` of a string: single quotes unless the text holds one and no double quote;
/// backslashes, the quote and control characters escaped; printable characters kept.
fn string_repr(text: &str, out: &mut String) {
    let quote = if text.contains('\'') && !text.contains('"') { '"' } else { '\'' };
    out.push(quote);
    for c in text.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if !is_printable(c) => {
                let code = u32::from(c);
                let escaped = match code {
                    0..=0xff => format!("\\x{code:02x}"),
                    0x100..=0xffff => format!("\\u{code:04x}"),
                    _ => format!("\\U{code:08x}"),
                };
                out.push_str(&escaped);
            }
            c => out.push(c),
        }
    }
    out.push(quote);
}

/// Python's `str.isprintable` for one character, close enough for prompt text: control
/// characters, separators other than the space, and unassigned-looking format characters are not.
fn is_printable(c: char) -> bool {
    !(c.is_control()
        || matches!(c, '\u{ad}' | '\u{2028}' | '\u{2029}' | '\u{200b}'..='\u{200f}' | '\u{202a}'..='\u{202e}')
        || matches!(c, '\u{2060}'..='\u{2064}' | '\u{feff}' | '\u{e000}'..='\u{f8ff}')
        || (c.is_whitespace() && c != ' '))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn render(source: &str, context: serde_json::Value) -> String {
        let mut env = minijinja::Environment::new();
        env.set_formatter(format);
        env.add_filter("string", string_filter);
        env.add_filter("upper", upper_filter);
        env.add_filter("lower", lower_filter);
        env.add_test("iterable", is_iterable);
        env.render_str(source, context).expect("renders")
    }

    // Expected strings are what jinja2 3.1 prints on CPython 3.11 for the same values.

    #[test]
    fn dicts_and_lists_print_as_python_repr() {
        let tool = serde_json::json!({"type": "function", "f": {"name": "it's", "n": [1, 2.5, null, true, "a\"b"]}});
        let expected = r#"{'type': 'function', 'f': {'name': "it's", 'n': [1, 2.5, None, True, 'a"b']}}"#;
        assert_eq!(render("{{ tool }}", serde_json::json!({ "tool": tool.clone() })), expected);
        assert_eq!(render("{{ tool|string }}", serde_json::json!({ "tool": tool })), expected);
        assert_eq!(
            render("{{ ['string', 'null']|upper }}|{{ 'ÉA'|lower }}", serde_json::json!({})),
            "['STRING', 'NULL']|éa"
        );
    }

    #[test]
    fn scalars_print_as_python_str() {
        assert_eq!(
            render(
                "{{ none }}|{{ true }}|{{ false }}|{{ 1 }}|{{ 1.0 }}|{{ 'x' }}|{{ nothing }}",
                serde_json::json!({})
            ),
            "None|True|False|1|1.0|x|"
        );
        assert_eq!(render("{{ ['a\\nb', 'é\u{1}'] }}", serde_json::json!({})), r"['a\nb', 'é\x01']");
    }

    #[test]
    fn none_and_numbers_are_not_iterable_but_undefined_is() {
        let out = render(
            "{{ none is iterable }}{{ 1 is iterable }}{{ nothing is iterable }}{{ 'a' is iterable }}{{ [] is iterable }}{{ {} is iterable }}",
            serde_json::json!({}),
        );
        assert_eq!(out, "FalseFalseTrueTrueTrueTrue");
    }
}
