//! JSON text exactly as Python's `json.dumps` writes it, which is what Hugging Face chat
//! templates see through their `tojson` filter: `", "` and `": "` separators, keys in
//! insertion order, non-ASCII characters kept (`ensure_ascii=False`), optional indentation.

use serde_json::Value;

/// Serializes `value` like `json.dumps(value, ensure_ascii=False, indent=indent)`.
pub(crate) fn dumps(value: &Value, indent: Option<usize>) -> String {
    let mut out = String::new();
    write_value(value, indent, 0, &mut out);
    out
}

fn write_value(value: &Value, indent: Option<usize>, level: usize, out: &mut String) {
    match value {
        Value::Array(items) if !items.is_empty() => {
            write_container(out, '[', ']', indent, level, items.iter(), |item, out| {
                write_value(item, indent, level + 1, out);
            });
        }
        Value::Object(map) if !map.is_empty() => {
            write_container(out, '{', '}', indent, level, map.iter(), |(key, item), out| {
                out.push_str(&Value::String(key.clone()).to_string());
                out.push_str(": ");
                write_value(item, indent, level + 1, out);
            });
        }
        // Scalars and empty containers print the same as serde_json's compact form.
        other => out.push_str(&other.to_string()),
    }
}

fn write_container<T>(
    out: &mut String,
    open: char,
    close: char,
    indent: Option<usize>,
    level: usize,
    items: impl Iterator<Item = T>,
    mut write_item: impl FnMut(T, &mut String),
) {
    out.push(open);
    for (i, item) in items.enumerate() {
        match indent {
            Some(width) => {
                out.push_str(if i == 0 { "\n" } else { ",\n" });
                out.push_str(&" ".repeat(width * (level + 1)));
            }
            None if i > 0 => out.push_str(", "),
            None => {}
        }
        write_item(item, out);
    }
    if let Some(width) = indent {
        out.push('\n');
        out.push_str(&" ".repeat(width * level));
    }
    out.push(close);
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
        assert_eq!(dumps(&json!("a\u{1}\tb"), None), r#""a\u0001\tb""#);
    }
}
