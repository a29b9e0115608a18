//! The grammars that make calls well-formed: each format's envelope around the arguments
//! grammars of the declared tools (function names restricted to them), and JSON output.

use super::format::{Body, Layout, PYTHON_TAG};
use super::gbnf::literal;
use super::spec::{CheckedTool, OutputSchema};
use super::{ToolChoice, ToolFormat, ToolSet};
use crate::engine::Grammar;

/// Whitespace the envelope allows between its parts: bounded, so a small model cannot loop on it.
const WS_RULE: &str = "fw-ws ::= [ \\t\\n]{0,4}\n";

/// The grammar for a request: calls when tools are allowed, JSON when a schema is given.
///
/// - `required` or a named function: the reply is only calls, from the first token.
/// - `auto`: free text until the format's opener appears, then calls (a lazy grammar whose
///   root begins with the opener, as the trigger mechanism needs). With a JSON schema too,
///   the reply is either calls or the JSON.
/// - `none`: no call grammar.
/// - `parallel = false`: exactly one call.
#[must_use]
pub fn request_grammar(
    format: ToolFormat,
    tools: &ToolSet,
    choice: &ToolChoice,
    parallel: bool,
    output: Option<&OutputSchema>,
) -> Option<Grammar> {
    let allowed: Vec<&CheckedTool> = match choice {
        ToolChoice::None => Vec::new(),
        ToolChoice::Function(name) => tools.checked().iter().filter(|t| &t.spec.name == name).collect(),
        ToolChoice::Auto | ToolChoice::Required => tools.checked().iter().collect(),
    };
    let lazy = *choice == ToolChoice::Auto && output.is_none();
    let calls = (!allowed.is_empty()).then(|| calls_grammar(format, &allowed, parallel, lazy));
    let root = |gbnf: String| Grammar { gbnf, root: "fw-root".into(), triggers: Vec::new() };
    match (calls, output) {
        (None, None) => None,
        (None, Some(output)) => {
            Some(Grammar { gbnf: output.grammar.clone(), root: OutputSchema::ROOT.into(), triggers: Vec::new() })
        }
        (Some(calls), Some(output)) if *choice == ToolChoice::Auto => {
            Some(root(format!("fw-root ::= fw-calls | {}\n{calls}{}", OutputSchema::ROOT, output.grammar)))
        }
        (Some(calls), _) if *choice == ToolChoice::Auto => Some(Grammar {
            triggers: format.openers().into_iter().map(String::from).collect(),
            ..root(format!("fw-root ::= fw-calls\n{calls}"))
        }),
        (Some(calls), _) => Some(root(format!("fw-root ::= fw-calls\n{calls}"))),
    }
}

/// Rules `fw-calls` (one or more calls in the format's layout) and everything they use.
///
/// Tagged JSON calls are written exactly as the generic prompt and Hermes templates write
/// them (`<tool_call>\n{…}\n</tool_call>`, calls separated by a newline), so the history
/// renders back to the generated text. Only a lazy grammar allows other whitespace right after
/// the opener: the token that completes a trigger may carry whatever follows it.
fn calls_grammar(format: ToolFormat, tools: &[&CheckedTool], parallel: bool, lazy: bool) -> String {
    let mut out = String::from(WS_RULE);
    let alternatives: Vec<String> = tools.iter().map(|tool| call_rule(format.body(), tool)).collect();
    out.push_str(&format!("fw-call ::= {}\n", alternatives.join(" | ")));
    let repeat = |one: &str, separator: &str| {
        if parallel {
            format!("{one} ({separator} {one})*")
        } else {
            one.to_string()
        }
    };
    match format.layout() {
        Layout::Tagged { open, close } => {
            let (after_open, before_close) = match format.body() {
                Body::Json { .. } if lazy => ("fw-ws", "\"\\n\""),
                Body::Json { .. } => ("\"\\n\"", "\"\\n\""),
                Body::Gemma { .. } => ("", ""),
            };
            out.push_str(&format!(
                "fw-one ::= {} {after_open} fw-call {before_close} {}\n",
                literal(open),
                literal(close)
            ));
            out.push_str(&format!("fw-calls ::= {}\n", repeat("fw-one", before_close)));
        }
        Layout::List { open } => {
            out.push_str(&format!(
                "fw-calls ::= {} fw-ws \"[\" fw-ws {} fw-ws \"]\"\n",
                literal(open),
                repeat("fw-call", "fw-ws \",\" fw-ws")
            ));
        }
        // Llama 3 writes one call per message.
        Layout::BareJson => out.push_str(&format!("fw-calls ::= ({} fw-ws)? fw-call\n", literal(PYTHON_TAG))),
    }
    if let Body::Gemma { quote } = format.body() {
        out.push_str(&gemma_value_rules(quote));
    }
    for tool in tools {
        if let Body::Json { .. } = format.body() {
            out.push_str(&tool.arguments_grammar);
            if !tool.arguments_grammar.ends_with('\n') {
                out.push('\n');
            }
        }
    }
    out
}

/// One tool's call: its fixed name, then its arguments. The JSON around the arguments is
/// written exactly as templates (and the generic prompt) write it, so a call sent back in the
/// history renders to the very text the model generated and the next turn reuses its cache.
fn call_rule(body: Body, tool: &CheckedTool) -> String {
    let name = &tool.spec.name;
    match body {
        Body::Json { args_key } => format!(
            "( {} {}root \"}}\" )",
            literal(&format!("{{\"name\": \"{name}\", \"{args_key}\": ")),
            tool.rule_prefix
        ),
        Body::Gemma { .. } => {
            let keys: Vec<String> = tool
                .spec
                .parameters
                .get("properties")
                .and_then(serde_json::Value::as_object)
                .map(|p| p.keys().map(|k| literal(k)).collect())
                .unwrap_or_default();
            let member = if keys.is_empty() {
                "fw-g-key \":\" fw-g-value".to_string()
            } else {
                format!("( {} ) \":\" fw-g-value", keys.join(" | "))
            };
            format!("( {} \"{{\" ( {member} ( \",\" {member} )* )? \"}}\" )", literal(&format!("call:{name}")))
        }
    }
}

/// Gemma's value syntax: JSON-like, with strings between quote markers.
fn gemma_value_rules(quote: &str) -> String {
    format!(
        "fw-g-value ::= fw-g-string | fw-g-dict | fw-g-array | fw-g-number | \"true\" | \"false\" | \"null\"\n\
         fw-g-string ::= {q} ( [^<] | \"<\" [^|e] )* {q}\n\
         fw-g-key ::= [^:}}<,{{ ]+\n\
         fw-g-dict ::= \"{{\" ( fw-g-key \":\" fw-g-value ( \",\" fw-g-key \":\" fw-g-value )* )? \"}}\"\n\
         fw-g-array ::= \"[\" ( fw-g-value ( \",\" fw-g-value )* )? \"]\"\n\
         fw-g-number ::= \"-\"? [0-9]+ ( \".\" [0-9]+ )? ( [eE] [-+]? [0-9]+ )?\n",
        q = literal(quote)
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::ToolSpec;
    use serde_json::json;

    fn tools() -> ToolSet {
        ToolSet::new(vec![
            ToolSpec {
                name: "get_weather".into(),
                description: None,
                parameters: json!({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}),
            },
            ToolSpec {
                name: "set_timer".into(),
                description: None,
                parameters: json!({"type": "object", "properties": {"minutes": {"type": "integer"}}, "required": ["minutes"]}),
            },
        ])
        .expect("valid tools")
    }

    #[test]
    fn none_without_schema_has_no_grammar() {
        assert_eq!(request_grammar(ToolFormat::Generic, &tools(), &ToolChoice::None, true, None), None);
    }

    #[test]
    fn auto_is_lazy_on_the_opener_and_required_is_not() {
        let auto = request_grammar(ToolFormat::Hermes, &tools(), &ToolChoice::Auto, true, None).expect("grammar");
        assert_eq!(auto.triggers, vec!["<tool_call>".to_string()]);
        assert!(auto.gbnf.contains("fw-one ::= \"<tool_call>\""), "{}", auto.gbnf);
        let required =
            request_grammar(ToolFormat::Hermes, &tools(), &ToolChoice::Required, false, None).expect("grammar");
        assert!(required.triggers.is_empty());
        assert!(required.gbnf.contains("fw-calls ::= fw-one\n"), "{}", required.gbnf);
    }

    #[test]
    fn a_named_choice_allows_only_that_function() {
        let g = request_grammar(ToolFormat::Generic, &tools(), &ToolChoice::Function("set_timer".into()), true, None)
            .expect("grammar");
        assert!(g.gbnf.contains("set_timer"), "{}", g.gbnf);
        assert!(!g.gbnf.contains("get_weather"), "{}", g.gbnf);
    }

    #[test]
    fn every_format_builds_a_grammar_llama_cpp_can_parse() {
        let schema = OutputSchema::new(&json!({"type": "object"})).expect("schema");
        for format in [
            ToolFormat::Generic,
            ToolFormat::Hermes,
            ToolFormat::Llama3,
            ToolFormat::Mistral,
            ToolFormat::Gemma4,
            ToolFormat::FunctionGemma,
        ] {
            for choice in [ToolChoice::Auto, ToolChoice::Required, ToolChoice::Function("get_weather".into())] {
                for output in [None, Some(&schema)] {
                    let g = request_grammar(format, &tools(), &choice, true, output).expect("grammar");
                    // Every referenced rule is defined (llama.cpp rejects the grammar otherwise).
                    let defined: Vec<&str> = g.gbnf.lines().filter_map(|l| l.split(" ::=").next()).collect();
                    assert!(defined.contains(&g.root.as_str()), "{format:?} root missing:\n{}", g.gbnf);
                    for rule in ["fw-calls", "fw-call", "fw-ws"] {
                        if g.gbnf.contains(&format!("{rule} ")) || g.gbnf.contains(&format!("{rule}\n")) {
                            assert!(defined.contains(&rule), "{format:?} {rule} undefined:\n{}", g.gbnf);
                        }
                    }
                }
            }
        }
    }
}
