//! JSON text exactly as Python's `json.dumps` writes it, which is what Hugging Face chat
//! templates see through their `tojson` filter: `", "` and `": "` separators, keys in
//! insertion order, non-ASCII characters kept (`ensure_ascii=False`, transformers' default),
//! floats as Python's `repr`; and the options transformers' `tojson` takes (`indent`,
//! `ensure_ascii`, `separators`, `sort_keys`).

use serde_json::Value;

/// `json.dumps` options.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Dumps {
    /// Pretty-print with this many spaces per level.
    pub indent: Option<usize>,
    /// Escape every character outside printable ASCII as `\uXXXX`.
    pub ensure_ascii: bool,
    /// Between items and between a key and its value; Python's defaults when `None`
    /// (`", "`, or `","` when indenting, and `": "`).
    pub separators: Option<(String, String)>,
    /// Objects' keys in sorted order.
    pub sort_keys: bool,
}

/// Serializes `value` like `json.dumps(value, ensure_ascii=False, indent=indent)`.
pub(crate) fn dumps(value: &Value, indent: Option<usize>) -> String {
    dumps_with(value, &Dumps { indent, ..Dumps::default() })
}

/// Serializes `value` like `json.dumps` with `options`.
pub(crate) fn dumps_with(value: &Value, options: &Dumps) -> String {
    let (item, key) = match &options.separators {
        Some((item, key)) => (item.as_str(), key.as_str()),
        None if options.indent.is_some() => (",", ": "),
        None => (", ", ": "),
    };
    let writer = Writer { options, item, key };
    let mut out = String::new();
    writer.value(value, 0, &mut out);
    out
}

struct Writer<'a> {
    options: &'a Dumps,
    item: &'a str,
    key: &'a str,
}

impl Writer<'_> {
    fn value(&self, value: &Value, level: usize, out: &mut String) {
        match value {
            Value::Array(items) if !items.is_empty() => {
                self.container(out, '[', ']', level, items.iter(), |item, out| self.value(item, level + 1, out));
            }
            Value::Object(map) if !map.is_empty() => {
                let mut entries: Vec<(&String, &Value)> = map.iter().collect();
                if self.options.sort_keys {
                    entries.sort_by(|a, b| a.0.cmp(b.0));
                }
                self.container(out, '{', '}', level, entries.into_iter(), |(key, item), out| {
                    self.string(key, out);
                    out.push_str(self.key);
                    self.value(item, level + 1, out);
                });
            }
            Value::Array(_) => out.push_str("[]"),
            Value::Object(_) => out.push_str("{}"),
            Value::String(text) => self.string(text, out),
            Value::Number(number) => match (number.is_f64(), number.as_f64()) {
                (true, Some(float)) => out.push_str(&float_repr(float)),
                _ => out.push_str(&number.to_string()),
            },
            Value::Bool(_) | Value::Null => out.push_str(&value.to_string()),
        }
    }

    fn container<T>(
        &self,
        out: &mut String,
        open: char,
        close: char,
        level: usize,
        items: impl Iterator<Item = T>,
        mut write_item: impl FnMut(T, &mut String),
    ) {
        out.push(open);
        for (i, item) in items.enumerate() {
            if i > 0 {
                out.push_str(self.item);
            }
            if let Some(width) = self.options.indent {
                out.push('\n');
                out.push_str(&" ".repeat(width * (level + 1)));
            }
            write_item(item, out);
        }
        if let Some(width) = self.options.indent {
            out.push('\n');
            out.push_str(&" ".repeat(width * level));
        }
        out.push(close);
    }

    /// A JSON string: Python escapes `"`, `\\` and control characters, and with `ensure_ascii`
    /// everything outside printable ASCII (astral characters as surrogate pairs).
    fn string(&self, text: &str, out: &mut String) {
        out.push('"');
        for c in text.chars() {
            match c {
                '"' => out.push_str("\\\""),
                '\\' => out.push_str("\\\\"),
                '\n' => out.push_str("\\n"),
                '\r' => out.push_str("\\r"),
                '\t' => out.push_str("\\t"),
                '\u{8}' => out.push_str("\\b"),
                '\u{c}' => out.push_str("\\f"),
                c if u32::from(c) < 0x20 || (self.options.ensure_ascii && !(' '..='~').contains(&c)) => {
                    let mut units = [0u16; 2];
                    for unit in c.encode_utf16(&mut units) {
                        out.push_str(&format!("\\u{unit:04x}"));
                    }
                }
                c => out.push(c),
            }
        }
        out.push('"');
    }
}

/// Python's `repr` of a float (what `json.dumps` and `str` print): the shortest text that reads
/// back the same, positional from 1e-4 up to 1e16, scientific (`1e+16`, `1.5e-05`) outside.
pub(crate) fn float_repr(number: f64) -> String {
    if number.is_nan() {
        return "NaN".into();
    }
    if number.is_infinite() {
        return if number > 0.0 { "Infinity".into() } else { "-Infinity".into() };
    }
    // `{:e}` is the shortest round-trip digits: `-1.5e-5`, `1e16`.
    let scientific = format!("{number:e}");
    let (mantissa, exponent) = scientific.split_once('e').expect("an exponent");
    let exponent: i32 = exponent.parse().expect("a number");
    let (sign, mantissa) = mantissa.strip_prefix('-').map_or(("", mantissa), |m| ("-", m));
    let digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();
    if (-4..16).contains(&exponent) {
        let point = exponent + 1;
        let text = if point <= 0 {
            format!("0.{}{digits}", "0".repeat(point.unsigned_abs() as usize))
        } else if point as usize >= digits.len() {
            format!("{digits}{}.0", "0".repeat(point as usize - digits.len()))
        } else {
            format!("{}.{}", &digits[..point as usize], &digits[point as usize..])
        };
        format!("{sign}{text}")
    } else {
        let sign_e = if exponent < 0 { '-' } else { '+' };
        format!("{sign}{mantissa}e{sign_e}{:02}", exponent.unsigned_abs())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    // Expected strings are what CPython 3.11's json.dumps prints for the same values.

    #[test]
    fn compact_form_uses_python_separators_and_keeps_key_order() {
        let v = json!({"zeta": 1, "alpha": [1, 2.5, null, true], "s": "é\"\n"});
        assert_eq!(dumps(&v, None), r#"{"zeta": 1, "alpha": [1, 2.5, null, true], "s": "é\"\n"}"#);
    }

    #[test]
    fn empty_containers() {
        assert_eq!(dumps(&json!({"a": {}, "b": []}), None), r#"{"a": {}, "b": []}"#);
        assert_eq!(dumps(&json!({"a": {}, "b": []}), Some(2)), "{\n  \"a\": {},\n  \"b\": []\n}");
    }

    #[test]
    fn indented_form_matches_python() {
        let v = json!({"type": "function", "function": {"name": "f", "required": ["x", "y"]}});
        let expected = "{\n    \"type\": \"function\",\n    \"function\": {\n        \"name\": \"f\",\n        \"required\": [\n            \"x\",\n            \"y\"\n        ]\n    }\n}";
        assert_eq!(dumps(&v, Some(4)), expected);
    }

    #[test]
    fn control_characters_are_escaped_like_python() {
        assert_eq!(dumps(&json!("a\u{1}\tb\u{7f}"), None), "\"a\\u0001\\tb\u{7f}\"");
    }

    #[test]
    fn ensure_ascii_escapes_everything_outside_printable_ascii() {
        let options = Dumps { ensure_ascii: true, ..Dumps::default() };
        assert_eq!(
            dumps_with(&json!({"k": "température 😀\u{7f}"}), &options),
            r#"{"k": "temp\u00e9rature \ud83d\ude00\u007f"}"#
        );
    }

    #[test]
    fn separators_and_sorted_keys() {
        let options = Dumps { separators: Some((",".into(), ":".into())), sort_keys: true, ..Dumps::default() };
        assert_eq!(
            dumps_with(&json!({"b": [1, 2], "a": {"d": 1, "c": 2}}), &options),
            r#"{"a":{"c":2,"d":1},"b":[1,2]}"#
        );
        let indented = Dumps { indent: Some(1), separators: Some((";".into(), "=".into())), ..Dumps::default() };
        assert_eq!(dumps_with(&json!({"a": 1, "b": 2}), &indented), "{\n \"a\"=1;\n \"b\"=2\n}");
    }

    #[test]
    fn floats_print_as_python_repr() {
        let cases = [
            (1.0, "1.0"),
            (21.5, "21.5"),
            (0.1, "0.1"),
            (1e16, "1e+16"),
            (1.5e-5, "1.5e-05"),
            (123456789012345.6, "123456789012345.6"),
            (0.0001, "0.0001"),
            (-2.5e20, "-2.5e+20"),
            (1e15, "1000000000000000.0"),
        ];
        for (number, expected) in cases {
            assert_eq!(float_repr(number), expected, "{number}");
        }
        assert_eq!(dumps(&json!([1.0, 2]), None), "[1.0, 2]");
    }
}
