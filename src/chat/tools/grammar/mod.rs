//! The grammars that make calls well-formed: each format's envelope around the arguments
//! grammars of the declared tools (function names restricted to them), and JSON output.

mod bodies;
mod text;

use super::format::PYTHON_TAG;
use super::gbnf::literal;
use super::syntax::{Body, Layout};
use super::toolset::{CheckedTool, OutputSchema};
use super::{ToolChoice, ToolFormat, ToolSet};
use crate::chat::{Grammar, ReasoningFormat};
use text::{gemma_value_rules, text_without};

/// Whitespace the envelope allows between its parts: bounded, so a small model cannot loop on it.
const WS_RULE: &str = "fw-ws ::= [ \\t\\n]{0,4}\n";

/// The grammar for a request: calls when tools are allowed, JSON when a schema is given.
///
/// - `required` or a named function: the reply is only calls, from the first token.
/// - `auto`: free text until the format's opener appears, then calls (a lazy grammar whose
///   root begins with the opener, as the trigger mechanism needs). A reply that opens with a
///   JSON object (after optional whitespace) is an attempted call too: `{` is an anchored
///   trigger, and the object must be a bare call `{"name": …, "arguments": {…}}` of a declared
///   tool. With a JSON schema, the reply is either calls or the JSON (no triggers).
/// - `none`: no call grammar.
/// - `parallel = false`, or a named function: exactly one call (OpenAI's named `tool_choice`
///   means one call of that function, whatever `parallel_tool_calls` says).
///
/// Where the reply starts inside the call opener (functionary v3.2's prompt ends with `>>>`),
/// nothing is lazy: in `auto` the reply is calls, or the text recipient (`all\n`) then text and
/// optionally calls after an opener; without calls, the recipient then text (or the JSON).
#[must_use]
pub fn request_grammar(
    format: &ToolFormat,
    tools: &ToolSet,
    choice: &ToolChoice,
    parallel: bool,
    output: Option<&OutputSchema>,
) -> Option<Grammar> {
    let parallel = parallel && format.parallel_calls() && !matches!(choice, ToolChoice::Function(_));
    let allowed: Vec<&CheckedTool> = match choice {
        ToolChoice::None => Vec::new(),
        ToolChoice::Function(name) => tools.checked().iter().filter(|t| &t.spec.name == name).collect(),
        ToolChoice::Auto | ToolChoice::Required => tools.checked().iter().collect(),
    };
    if let Some(recipient) = format.text_recipient() {
        let calls = (!allowed.is_empty()).then(|| calls_grammar(format, &allowed, parallel, false));
        return prefilled_grammar(format, recipient, calls, choice, !tools.is_empty(), output);
    }
    let lazy = *choice == ToolChoice::Auto && output.is_none();
    let calls = (!allowed.is_empty()).then(|| calls_grammar(format, &allowed, parallel, lazy));
    let eager = |gbnf: String, root: &str| Grammar {
        gbnf,
        root: root.into(),
        triggers: Vec::new(),
        anchored_triggers: Vec::new(),
    };
    match (calls, output) {
        (None, None) => None,
        (None, Some(output)) => Some(eager(output.grammar.clone(), OutputSchema::ROOT)),
        (Some(calls), Some(output)) if *choice == ToolChoice::Auto => {
            Some(eager(format!("fw-root ::= fw-calls | {}\n{calls}{}", OutputSchema::ROOT, output.grammar), "fw-root"))
        }
        (Some(calls), _) if lazy => {
            let root = if has_bare_rule(format, lazy) { "fw-calls | fw-bare" } else { "fw-calls" };
            Some(Grammar {
                triggers: format.openers(),
                anchored_triggers: vec![JSON_OBJECT_OPENER.to_string()],
                ..eager(format!("fw-root ::= {root}\n{calls}"), "fw-root")
            })
        }
        (Some(calls), _) => Some(eager(format!("fw-root ::= fw-calls\n{calls}"), "fw-root")),
    }
}

/// The grammar of a format whose reply starts inside the call opener, text marked by
/// `recipient` (see [`request_grammar`]); `calls` are the call rules when calls are allowed.
fn prefilled_grammar(
    format: &ToolFormat,
    recipient: &str,
    calls: Option<String>,
    choice: &ToolChoice,
    has_tools: bool,
    output: Option<&OutputSchema>,
) -> Option<Grammar> {
    let opener = format.openers().concat();
    let text = match output {
        Some(output) => Some((OutputSchema::ROOT.to_string(), output.grammar.clone())),
        None if has_tools => Some(("fw-t-0".to_string(), text_without(&opener, "fw-t"))),
        None => None,
    };
    let (root, rules) = match (calls, text) {
        (None, None) => return None,
        (Some(calls), Some((text_root, text_rules))) if *choice == ToolChoice::Auto => {
            // Text may go on to calls, each after an opener (a JSON reply may not).
            let more = if output.is_none() { format!(" ( {} fw-calls )?", literal(&opener)) } else { String::new() };
            (format!("fw-calls | {} {text_root}{more}", literal(recipient)), format!("{calls}{text_rules}"))
        }
        (Some(calls), _) => ("fw-calls".to_string(), calls),
        (None, Some((text_root, text_rules))) => (format!("{} {text_root}", literal(recipient)), text_rules),
    };
    Some(Grammar {
        gbnf: format!("fw-root ::= {root}\n{rules}"),
        root: "fw-root".into(),
        triggers: Vec::new(),
        anchored_triggers: Vec::new(),
    })
}

/// `grammar` with the reasoning of a thinking model allowed in front of what it constrains:
/// required when the prompt `opened` the reasoning (the reply starts inside it), optional
/// otherwise. Only eager grammars change: a lazy grammar's triggers are watched in the answer
/// alone, after the reasoning.
#[must_use]
pub fn allow_reasoning(grammar: &Grammar, format: ReasoningFormat, opened: bool) -> Grammar {
    if !grammar.triggers.is_empty() || !grammar.anchored_triggers.is_empty() {
        return grammar.clone();
    }
    let (open, mut close) = (literal(format.open), literal(format.close));
    if !format.resume.is_empty() {
        close = format!("{close} {}?", literal(format.resume));
    }
    let block = if opened {
        format!("fw-think-text-0 {close}")
    } else {
        format!("( fw-think-ws {open} fw-think-text-0 {close} )?")
    };
    Grammar {
        gbnf: format!(
            "fw-reasoned ::= {block} fw-think-ws {root}\nfw-think-ws ::= [ \\t\\n]{{0,4}}\n{text}{rest}",
            root = grammar.root,
            text = text_without(format.close, "fw-think-text"),
            rest = grammar.gbnf,
        ),
        root: "fw-reasoned".into(),
        triggers: Vec::new(),
        anchored_triggers: Vec::new(),
    }
}

/// How a reply that is a JSON object begins: in `auto` mode, an attempted call.
const JSON_OBJECT_OPENER: &str = "{";

/// Grammar elements in sequence, empty ones left out.
fn sequence(parts: &[String]) -> String {
    parts.iter().filter(|p| !p.is_empty()).cloned().collect::<Vec<_>>().join(" ")
}

/// Whether the grammar has a separate `fw-bare` rule for a bare JSON call opening the reply:
/// lazy grammars of formats whose own calls are not bare JSON already.
fn has_bare_rule(format: &ToolFormat, lazy: bool) -> bool {
    lazy && *format.layout() != Layout::BareJson
}

/// Rules `fw-calls` (one or more calls in the format's layout) and everything they use.
///
/// The markers are written exactly as the template writes them, so the history renders back to
/// the generated text. Only a lazy grammar allows other whitespace right after the opener: the
/// token that completes a trigger may carry whatever follows it.
fn calls_grammar(format: &ToolFormat, tools: &[&CheckedTool], parallel: bool, lazy: bool) -> String {
    let mut out = String::from(WS_RULE);
    let alternatives: Vec<String> =
        tools.iter().enumerate().map(|(i, tool)| bodies::call_rule(format.body(), tool, i, &mut out)).collect();
    out.push_str(&format!("fw-call ::= {}\n", alternatives.join(" | ")));
    if has_bare_rule(format, lazy) {
        let key = format.bare_args_key();
        let bare: Vec<String> = tools.iter().map(|tool| bodies::json_call_rule("name", &key, tool)).collect();
        out.push_str(&format!("fw-bare ::= {}\n", bare.join(" | ")));
    }
    match format.layout() {
        Layout::Markers(markers) => {
            let written = format!("{}{}", markers.open, markers.call_open);
            let head = written.trim_start();
            let opener = markers.opener();
            let rest = &head[opener.len()..];
            // A reply held to calls from its start writes the space that joins them to the
            // prompt (Muse Glimmer's ` to=`); a lazy grammar starts at the opener.
            let leading = if lazy { "" } else { &written[..written.len() - head.len()] };
            let head_rule = if format.text_recipient().is_some() {
                // The prompt wrote the first call's opener.
                String::new()
            } else if lazy && rest.starts_with(char::is_whitespace) {
                sequence(&[literal(&opener), "fw-ws".into(), bodies::marker(rest.trim_start())])
            } else {
                sequence(&[bodies::marker(leading), literal(&opener), bodies::marker(rest)])
            };
            let close = bodies::marker(&markers.call_close);
            let first = sequence(&[head_rule, "fw-call".into(), close.clone()]);
            let next = sequence(&[
                bodies::marker(&markers.separator),
                bodies::marker(&markers.call_open),
                "fw-call".into(),
                close,
            ]);
            let calls = if parallel { format!("{first} ( {next} )*") } else { first };
            out.push_str(&format!("fw-calls ::= {}\n", sequence(&[calls, bodies::marker(&markers.close)])));
        }
        // Llama 3 writes one call per message.
        Layout::BareJson => out.push_str(&format!("fw-calls ::= ({} fw-ws)? fw-call\n", literal(PYTHON_TAG))),
    }
    if let Body::Gemma { quote } = format.body() {
        out.push_str(&gemma_value_rules(quote));
    }
    let json_arguments =
        matches!(format.body(), Body::Json { .. } | Body::NamedJson { .. }) || has_bare_rule(format, lazy);
    let value_grammars = matches!(format.body(), Body::Params(_) | Body::Pythonic);
    for tool in tools {
        if json_arguments {
            out.push_str(&tool.arguments_grammar);
            if !tool.arguments_grammar.ends_with('\n') {
                out.push('\n');
            }
        }
        if value_grammars {
            out.push_str(tool.property_grammars());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chat::tools::{ToolCallParser, ToolDefinition};
    use serde_json::json;

    fn tools() -> ToolSet {
        ToolSet::new(vec![
            ToolDefinition {
                name: "get_weather".into(),
                description: None,
                parameters: json!({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}),
            },
            ToolDefinition {
                name: "set_timer".into(),
                description: None,
                parameters: json!({"type": "object", "properties": {"minutes": {"type": "integer"}}, "required": ["minutes"]}),
            },
        ])
        .expect("valid tools")
    }

    #[test]
    fn none_without_schema_has_no_grammar() {
        assert_eq!(request_grammar(&ToolFormat::generic(), &tools(), &ToolChoice::None, true, None), None);
    }

    #[test]
    fn auto_is_lazy_on_the_opener_and_required_is_not() {
        let auto = request_grammar(&ToolFormat::hermes(), &tools(), &ToolChoice::Auto, true, None).expect("grammar");
        assert_eq!(auto.triggers, vec!["<tool_call>".to_string()]);
        assert_eq!(auto.anchored_triggers, vec!["{".to_string()]);
        // The trigger's token may carry whitespace after the opener: only the lazy grammar
        // allows it.
        assert!(
            auto.gbnf.contains(
                "fw-calls ::= \"<tool_call>\" fw-ws fw-call \"\\n</tool_call>\" ( \"\\n\" \"<tool_call>\\n\" fw-call"
            ),
            "{}",
            auto.gbnf
        );
        assert!(auto.gbnf.starts_with("fw-root ::= fw-calls | fw-bare\n"), "{}", auto.gbnf);
        let required =
            request_grammar(&ToolFormat::hermes(), &tools(), &ToolChoice::Required, false, None).expect("grammar");
        assert!(required.triggers.is_empty());
        assert!(
            required.gbnf.contains("fw-calls ::= \"<tool_call>\" \"\\n\" fw-call \"\\n</tool_call>\"\n"),
            "one call, exactly as the template writes it: {}",
            required.gbnf
        );
    }

    #[test]
    fn reasoning_comes_before_an_eager_grammar_and_lazy_ones_stay_as_they_are() {
        let think = ReasoningFormat::KNOWN[2];
        let required =
            request_grammar(&ToolFormat::hermes(), &tools(), &ToolChoice::Required, false, None).expect("grammar");
        let opened = allow_reasoning(&required, think, true);
        assert_eq!(opened.root, "fw-reasoned");
        assert!(
            opened.gbnf.starts_with("fw-reasoned ::= fw-think-text-0 \"</think>\" fw-think-ws fw-root\n"),
            "{}",
            opened.gbnf
        );
        assert!(opened.gbnf.ends_with(&required.gbnf), "the original rules follow");
        let optional = allow_reasoning(&required, think, false);
        assert!(
            optional.gbnf.starts_with(
                "fw-reasoned ::= ( fw-think-ws \"<think>\" fw-think-text-0 \"</think>\" )? fw-think-ws fw-root\n"
            ),
            "{}",
            optional.gbnf
        );
        let auto = request_grammar(&ToolFormat::hermes(), &tools(), &ToolChoice::Auto, true, None).expect("grammar");
        assert_eq!(allow_reasoning(&auto, think, true), auto);
    }

    #[test]
    fn llama3_bare_json_opens_the_reply_only() {
        let auto = request_grammar(&ToolFormat::llama3(), &tools(), &ToolChoice::Auto, true, None).expect("grammar");
        assert_eq!(auto.triggers, vec!["<|python_tag|>".to_string()], "no `{{\"name\"` trigger inside text");
        assert_eq!(auto.anchored_triggers, vec!["{".to_string()]);
        assert!(auto.gbnf.starts_with("fw-root ::= fw-calls\n"), "its own calls are bare JSON: {}", auto.gbnf);
        assert!(
            !ToolFormat::llama3().openers().contains(&"{\"name\"".to_string()),
            "not a stop string with tool_choice none"
        );
        assert_eq!(ToolFormat::llama3().anchored_openers(), vec!["{\"name\""]);
    }

    #[test]
    fn auto_gemma_grammars_take_a_bare_json_call_too() {
        let auto = request_grammar(&ToolFormat::gemma4(), &tools(), &ToolChoice::Auto, true, None).expect("grammar");
        assert!(
            auto.gbnf.contains(
                "fw-bare ::= ( \"{\\\"name\\\": \\\"get_weather\\\", \\\"arguments\\\": \" fw-t0-root \"}\" ) | ( "
            ),
            "{}",
            auto.gbnf
        );
        assert!(auto.gbnf.contains("fw-t1-root ::="), "the arguments grammars are included: {}", auto.gbnf);
        let required =
            request_grammar(&ToolFormat::gemma4(), &tools(), &ToolChoice::Required, true, None).expect("grammar");
        assert!(!required.gbnf.contains("fw-bare") && required.anchored_triggers.is_empty(), "{}", required.gbnf);
        let schema = OutputSchema::new(&json!({"type": "object"})).expect("schema");
        let with_schema =
            request_grammar(&ToolFormat::hermes(), &tools(), &ToolChoice::Auto, true, Some(&schema)).expect("grammar");
        assert!(with_schema.triggers.is_empty() && with_schema.anchored_triggers.is_empty());
        assert!(!with_schema.gbnf.contains("fw-bare"), "plain JSON stays possible: {}", with_schema.gbnf);
    }

    #[test]
    fn a_named_choice_allows_only_that_function() {
        let g =
            request_grammar(&ToolFormat::generic(), &tools(), &ToolChoice::Function("set_timer".into()), true, None)
                .expect("grammar");
        assert!(g.gbnf.contains("set_timer"), "{}", g.gbnf);
        assert!(!g.gbnf.contains("get_weather"), "{}", g.gbnf);
    }

    #[test]
    fn a_named_choice_is_one_call_even_with_parallel_calls() {
        for format in &ToolFormat::examples() {
            let named = ToolChoice::Function("set_timer".into());
            let g = request_grammar(format, &tools(), &named, true, None).expect("grammar");
            let single = request_grammar(format, &tools(), &named, false, None).expect("grammar");
            assert_eq!(g, single, "{format:?}: parallel_tool_calls changes nothing for a named choice");
            let required = request_grammar(format, &tools(), &ToolChoice::Required, true, None).expect("grammar");
            let one = request_grammar(format, &tools(), &ToolChoice::Required, false, None).expect("grammar");
            // Llama 3 writes one call per message in any case.
            if *format != ToolFormat::llama3() {
                assert_ne!(required, one, "{format:?}: required with parallel calls allows several");
            }
        }
    }

    #[test]
    fn the_shortest_text_of_a_required_call_or_json_grammar_is_a_valid_answer() {
        let hermes =
            request_grammar(&ToolFormat::hermes(), &tools(), &ToolChoice::Required, false, None).expect("grammar");
        assert_eq!(
            hermes.shortest_text().as_deref(),
            Some("<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\":\"\"}}\n</tool_call>")
        );
        for format in &ToolFormat::examples() {
            for choice in [ToolChoice::Required, ToolChoice::Function("set_timer".into())] {
                let grammar = request_grammar(format, &tools(), &choice, true, None).expect("grammar");
                let text = grammar.shortest_text().unwrap_or_else(|| panic!("{format:?}: no text:\n{}", grammar.gbnf));
                let mut parser = ToolCallParser::new(format.clone()).with_tools(&tools());
                parser.push(&text);
                let (_, calls) = parser.finish();
                let [call] = calls.as_slice() else { panic!("{format:?}: one call in {text:?}: {calls:?}") };
                assert!(call.complete, "{format:?}: {text:?}");
                tools().check_arguments(&call.name, &call.arguments).expect("arguments the schema accepts");
            }
        }
        let schema = json!({"type": "object", "properties": {"n": {"type": "integer"}, "tags": {"type": "array",
            "items": {"type": "string"}}}, "required": ["n", "tags"]});
        let output = OutputSchema::new(&schema).expect("schema");
        let json =
            request_grammar(&ToolFormat::hermes(), &tools(), &ToolChoice::None, true, Some(&output)).expect("grammar");
        let text = json.shortest_text().expect("a text");
        output.check(&text).expect("JSON the schema accepts");
    }

    #[test]
    fn every_format_builds_a_grammar_llama_cpp_can_parse() {
        let schema = OutputSchema::new(&json!({"type": "object"})).expect("schema");
        for format in &ToolFormat::examples() {
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
