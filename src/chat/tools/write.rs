//! Writing calls in a described syntax, exactly as the template (and the grammar) writes them:
//! the text a call sent back in the history stands for.

use serde_json::Value;

use super::syntax::{Body, Markers, ARGUMENT_KEY, CALL_ID, CALL_INDEX, CALL_NAME, CALL_NUMBER};
use super::ToolDefinition;
use crate::chat::{python_json, ToolCall};

/// `calls` in a section of `markers`, each written as `body` says. Placeholders in a marker
/// (call id, index, number) are those of the call it comes before (Solar writes the first
/// call's id in the section's open, the next ones' in the separator).
pub(crate) fn section(markers: &Markers, body: &Body, calls: &[ToolCall], tools: &[ToolDefinition]) -> String {
    let fill = |text: &str, index: usize| {
        let id = calls.get(index).map_or("", |call| call.id.as_str());
        text.replace(CALL_ID, id).replace(CALL_INDEX, &index.to_string()).replace(CALL_NUMBER, &(index + 1).to_string())
    };
    let mut text = fill(&markers.open, 0);
    for (index, call) in calls.iter().enumerate() {
        if index > 0 {
            text.push_str(&fill(&markers.separator, index));
        }
        let written = format!("{}{}{}", markers.call_open, call_text(body, call, index, tools), markers.call_close);
        text.push_str(&fill(&written, index));
    }
    text.push_str(&markers.close);
    text
}

/// One call's text between its markers.
pub(crate) fn call_text(body: &Body, call: &ToolCall, index: usize, tools: &[ToolDefinition]) -> String {
    let arguments = arguments_value(&call.arguments);
    match body {
        Body::Json { name_key, args_key } => format!(
            "{{{}: {}, {}: {}}}",
            python_json(&Value::String(name_key.clone())),
            python_json(&Value::String(call.name.clone())),
            python_json(&Value::String(args_key.clone())),
            written_arguments(&call.arguments, &arguments)
        ),
        Body::NamedJson { name_close } => format!(
            "{}{}{}",
            call.name,
            name_close.replace(CALL_INDEX, &index.to_string()),
            written_arguments(&call.arguments, &arguments)
        ),
        Body::Params(params) => {
            let mut text = format!("{}{}", call.name, params.name_close.replace(CALL_NAME, &call.name));
            if let Value::Object(map) = &arguments {
                for (key, value) in map {
                    let (key_close, value_text) = match value {
                        Value::String(s) if !schema_wants_json(tools, &call.name, key) => {
                            (&params.key_close, s.clone())
                        }
                        other => (&params.key_close_json, python_json(other)),
                    };
                    text.push_str(&format!(
                        "{}{key}{key_close}{value_text}{}",
                        params.key_open,
                        params.value_close.replace(ARGUMENT_KEY, key)
                    ));
                }
            }
            text
        }
        Body::Gemma { quote } => format!("call:{}{}", call.name, gemma_value(&arguments, quote)),
        Body::Pythonic => {
            let members: Vec<String> = match &arguments {
                Value::Object(map) => map.iter().map(|(k, v)| format!("{k}={}", python_literal(v))).collect(),
                _ => Vec::new(),
            };
            format!("{}({})", call.name, members.join(", "))
        }
    }
}

/// The arguments as a JSON value (`{}` for none, the raw text as a string if it is not JSON).
fn arguments_value(arguments: &str) -> Value {
    if arguments.trim().is_empty() {
        return Value::Object(serde_json::Map::new());
    }
    serde_json::from_str(arguments).unwrap_or_else(|_| Value::String(arguments.to_string()))
}

/// JSON arguments as they were written (the model's text, which a client sends back), or in
/// Python's `json.dumps` form when they are no JSON text.
fn written_arguments(raw: &str, value: &Value) -> String {
    let raw = raw.trim();
    if raw.is_empty() {
        "{}".to_string()
    } else if serde_json::from_str::<Value>(raw).is_ok() || value.is_string() {
        raw.to_string()
    } else {
        python_json(value)
    }
}

/// Whether `tool`'s schema gives argument `key` a type other than string (a string value is
/// then JSON text, not raw text).
fn schema_wants_json(tools: &[ToolDefinition], tool: &str, key: &str) -> bool {
    tools
        .iter()
        .find(|t| t.name == tool)
        .and_then(|t| t.parameters.get("properties")?.get(key)?.get("type")?.as_str().map(|ty| ty != "string"))
        .unwrap_or(false)
}

/// A value in Gemma's call syntax.
pub(crate) fn gemma_value(value: &Value, quote: &str) -> String {
    match value {
        Value::String(s) => format!("{quote}{s}{quote}"),
        Value::Object(map) => {
            let members: Vec<String> = map.iter().map(|(k, v)| format!("{k}:{}", gemma_value(v, quote))).collect();
            format!("{{{}}}", members.join(","))
        }
        Value::Array(items) => {
            let items: Vec<String> = items.iter().map(|v| gemma_value(v, quote)).collect();
            format!("[{}]", items.join(","))
        }
        other => other.to_string(),
    }
}

/// A value as a Python literal (pythonic calls).
pub(crate) fn python_literal(value: &Value) -> String {
    match value {
        Value::Null => "None".into(),
        Value::Bool(true) => "True".into(),
        Value::Bool(false) => "False".into(),
        Value::Array(items) => format!("[{}]", items.iter().map(python_literal).collect::<Vec<_>>().join(", ")),
        Value::Object(map) => {
            let members: Vec<String> = map
                .iter()
                .map(|(k, v)| format!("{}: {}", python_json(&Value::String(k.clone())), python_literal(v)))
                .collect();
            format!("{{{}}}", members.join(", "))
        }
        other => python_json(other),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chat::tools::syntax::Params;

    fn call(name: &str, arguments: &str) -> ToolCall {
        ToolCall { id: "c".into(), name: name.into(), arguments: arguments.into() }
    }

    #[test]
    fn hermes_and_mistral_sections() {
        let hermes = Markers {
            call_open: "<tool_call>\n".into(),
            call_close: "\n</tool_call>".into(),
            separator: "\n".into(),
            ..Markers::default()
        };
        let json = Body::Json { name_key: "name".into(), args_key: "arguments".into() };
        let calls = [call("a", "{\"x\":1}"), call("b", "{}")];
        assert_eq!(
            section(&hermes, &json, &calls, &[]),
            "<tool_call>\n{\"name\": \"a\", \"arguments\": {\"x\":1}}\n</tool_call>\n<tool_call>\n{\"name\": \"b\", \"arguments\": {}}\n</tool_call>"
        );
        let kimi = Body::NamedJson { name_close: ":{index}<|tool_call_argument_begin|>".into() };
        // Arguments are written as they came (the model's text, sent back by the client).
        assert_eq!(call_text(&kimi, &calls[0], 1, &[]), "a:1<|tool_call_argument_begin|>{\"x\":1}");
    }

    #[test]
    fn parameters_write_strings_raw_and_other_values_as_json() {
        let qwen = Body::Params(Params {
            name_close: ">\n".into(),
            key_open: "<parameter=".into(),
            key_close: ">\n".into(),
            key_close_json: ">\n".into(),
            value_close: "\n</parameter>\n".into(),
        });
        assert_eq!(
            call_text(&qwen, &call("f", r#"{"city": "Paris", "n": 2}"#), 0, &[]),
            "f>\n<parameter=city>\nParis\n</parameter>\n<parameter=n>\n2\n</parameter>\n"
        );
    }

    #[test]
    fn python_and_gemma_values() {
        let args = serde_json::json!({"s": "x", "b": true, "n": null, "l": [1, 2]});
        assert_eq!(python_literal(&args), r#"{"s": "x", "b": True, "n": None, "l": [1, 2]}"#);
        assert_eq!(gemma_value(&args, "<|\"|>"), "{s:<|\"|>x<|\"|>,b:true,n:null,l:[1,2]}");
        assert_eq!(call_text(&Body::Pythonic, &call("f", r#"{"city": "Oslo"}"#), 0, &[]), "f(city=\"Oslo\")");
    }
}
