//! The grammars that make calls well-formed: each format's envelope around the arguments
//! grammars of the declared tools (function names restricted to them), and JSON output.

use super::format::{Body, Layout, PYTHON_TAG};
use super::gbnf::{class_excluding, literal};
use super::toolset::{CheckedTool, OutputSchema};
use super::{ToolChoice, ToolFormat, ToolSet};
use crate::chat::{Grammar, ReasoningFormat};

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
                triggers: format.openers().into_iter().map(String::from).collect(),
                anchored_triggers: vec![JSON_OBJECT_OPENER.to_string()],
                ..eager(format!("fw-root ::= {root}\n{calls}"), "fw-root")
            })
        }
        (Some(calls), _) => Some(eager(format!("fw-root ::= fw-calls\n{calls}"), "fw-root")),
    }
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
    let (open, close) = (literal(format.open), literal(format.close));
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

/// Whether the grammar has a separate `fw-bare` rule for a bare JSON call opening the reply:
/// lazy grammars of formats whose own calls are not bare JSON already.
fn has_bare_rule(format: ToolFormat, lazy: bool) -> bool {
    lazy && format.layout() != Layout::BareJson
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
    if has_bare_rule(format, lazy) {
        match format.body() {
            // The same object the tagged calls carry.
            Body::Json { .. } => out.push_str("fw-bare ::= fw-call\n"),
            Body::Gemma { .. } => {
                let key = format.bare_args_key();
                let bare: Vec<String> = tools.iter().map(|tool| json_call_rule(key, tool)).collect();
                out.push_str(&format!("fw-bare ::= {}\n", bare.join(" | ")));
            }
        }
    }
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
    let json_arguments = matches!(format.body(), Body::Json { .. }) || has_bare_rule(format, lazy);
    for tool in tools {
        if json_arguments {
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
        Body::Json { args_key } => json_call_rule(args_key, tool),
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

/// A call as one JSON object, written exactly as templates write it.
fn json_call_rule(args_key: &str, tool: &CheckedTool) -> String {
    format!(
        "( {} {}root \"}}\" )",
        literal(&format!("{{\"name\": \"{}\", \"{args_key}\": ", tool.spec.name)),
        tool.rule_prefix
    )
}

/// Gemma's value syntax: JSON-like, with strings between quote markers and numbers as JSON
/// writes them (no leading zeros), so the converted arguments are valid JSON.
fn gemma_value_rules(quote: &str) -> String {
    format!(
        "fw-g-value ::= fw-g-string | fw-g-dict | fw-g-array | fw-g-number | \"true\" | \"false\" | \"null\"\n\
         fw-g-string ::= {q} fw-g-text-0 {q}\n\
         {text}\
         fw-g-key ::= [^:}}<,{{ ]+\n\
         fw-g-dict ::= \"{{\" ( fw-g-key \":\" fw-g-value ( \",\" fw-g-key \":\" fw-g-value )* )? \"}}\"\n\
         fw-g-array ::= \"[\" ( fw-g-value ( \",\" fw-g-value )* )? \"]\"\n\
         fw-g-number ::= \"-\"? ( \"0\" | [1-9] [0-9]* ) ( \".\" [0-9]+ )? ( [eE] [-+]? [0-9]+ )?\n",
        q = literal(quote),
        text = text_without(quote, "fw-g-text")
    )
}

/// Rules `{name}-0`, `{name}-1`, … matching exactly the texts that do not contain `marker`
/// (any of them may end right before it): `{name}-k` is the state where the text so far ends
/// with the first `k` characters of the marker and contains no whole marker.
fn text_without(marker: &str, name: &str) -> String {
    let mut out = String::new();
    for (k, state) in marker_free_states(marker).iter().enumerate() {
        let mut alternatives = vec![String::new()];
        for &(c, next) in &state.moves {
            alternatives.push(format!("{} {name}-{next}", literal(&c.to_string())));
        }
        alternatives.push(format!("{} {name}-0", class_excluding(&state.special)));
        out.push_str(&format!("{name}-{k} ::= {}\n", alternatives.join(" | ")));
    }
    out
}

/// A state of the automaton that follows text for a marker (Knuth-Morris-Pratt).
#[derive(Debug, PartialEq, Eq)]
struct MarkerState {
    /// Characters that lead to another state than 0, with that state.
    moves: Vec<(char, usize)>,
    /// Characters that do not lead to state 0: those of `moves` and the one that would
    /// complete the marker (not allowed).
    special: Vec<char>,
}

/// The states 0..n of the automaton that reads text without `marker` (n characters long).
fn marker_free_states(marker: &str) -> Vec<MarkerState> {
    let chars: Vec<char> = marker.chars().collect();
    let mut alphabet = chars.clone();
    alphabet.sort_unstable();
    alphabet.dedup();
    (0..chars.len())
        .map(|k| {
            let mut state = MarkerState { moves: Vec::new(), special: Vec::new() };
            for &c in &alphabet {
                // The longest beginning of the marker that ends the text read so far plus `c`.
                let mut read = chars[..k].to_vec();
                read.push(c);
                let next = (0..=read.len().min(chars.len())).rev().find(|&m| read.ends_with(&chars[..m])).unwrap_or(0);
                if next == chars.len() {
                    state.special.push(c);
                } else if next > 0 {
                    state.moves.push((c, next));
                    state.special.push(c);
                }
            }
            state
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chat::tools::ToolDefinition;
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
        assert_eq!(request_grammar(ToolFormat::Generic, &tools(), &ToolChoice::None, true, None), None);
    }

    #[test]
    fn auto_is_lazy_on_the_opener_and_required_is_not() {
        let auto = request_grammar(ToolFormat::Hermes, &tools(), &ToolChoice::Auto, true, None).expect("grammar");
        assert_eq!(auto.triggers, vec!["<tool_call>".to_string()]);
        assert_eq!(auto.anchored_triggers, vec!["{".to_string()]);
        assert!(auto.gbnf.contains("fw-one ::= \"<tool_call>\""), "{}", auto.gbnf);
        assert!(auto.gbnf.starts_with("fw-root ::= fw-calls | fw-bare\n"), "{}", auto.gbnf);
        let required =
            request_grammar(ToolFormat::Hermes, &tools(), &ToolChoice::Required, false, None).expect("grammar");
        assert!(required.triggers.is_empty());
        assert!(required.gbnf.contains("fw-calls ::= fw-one\n"), "{}", required.gbnf);
    }

    #[test]
    fn reasoning_comes_before_an_eager_grammar_and_lazy_ones_stay_as_they_are() {
        let think = ReasoningFormat::KNOWN[1];
        let required =
            request_grammar(ToolFormat::Hermes, &tools(), &ToolChoice::Required, false, None).expect("grammar");
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
        let auto = request_grammar(ToolFormat::Hermes, &tools(), &ToolChoice::Auto, true, None).expect("grammar");
        assert_eq!(allow_reasoning(&auto, think, true), auto);
    }

    #[test]
    fn llama3_bare_json_opens_the_reply_only() {
        let auto = request_grammar(ToolFormat::Llama3, &tools(), &ToolChoice::Auto, true, None).expect("grammar");
        assert_eq!(auto.triggers, vec!["<|python_tag|>".to_string()], "no `{{\"name\"` trigger inside text");
        assert_eq!(auto.anchored_triggers, vec!["{".to_string()]);
        assert!(auto.gbnf.starts_with("fw-root ::= fw-calls\n"), "its own calls are bare JSON: {}", auto.gbnf);
        assert!(!ToolFormat::Llama3.openers().contains(&"{\"name\""), "not a stop string with tool_choice none");
        assert_eq!(ToolFormat::Llama3.anchored_openers(), vec!["{\"name\""]);
    }

    #[test]
    fn auto_gemma_grammars_take_a_bare_json_call_too() {
        let auto = request_grammar(ToolFormat::Gemma4, &tools(), &ToolChoice::Auto, true, None).expect("grammar");
        assert!(
            auto.gbnf.contains(
                "fw-bare ::= ( \"{\\\"name\\\": \\\"get_weather\\\", \\\"arguments\\\": \" fw-t0-root \"}\" ) | ( "
            ),
            "{}",
            auto.gbnf
        );
        assert!(auto.gbnf.contains("fw-t1-root ::="), "the arguments grammars are included: {}", auto.gbnf);
        let required =
            request_grammar(ToolFormat::Gemma4, &tools(), &ToolChoice::Required, true, None).expect("grammar");
        assert!(!required.gbnf.contains("fw-bare") && required.anchored_triggers.is_empty(), "{}", required.gbnf);
        let schema = OutputSchema::new(&json!({"type": "object"})).expect("schema");
        let with_schema =
            request_grammar(ToolFormat::Hermes, &tools(), &ToolChoice::Auto, true, Some(&schema)).expect("grammar");
        assert!(with_schema.triggers.is_empty() && with_schema.anchored_triggers.is_empty());
        assert!(!with_schema.gbnf.contains("fw-bare"), "plain JSON stays possible: {}", with_schema.gbnf);
    }

    /// Runs the automaton of [`marker_free_states`] over `text`: whether it stays free of the marker.
    fn accepted_without(marker: &str, text: &str) -> bool {
        let states = marker_free_states(marker);
        let mut k = 0;
        for c in text.chars() {
            let state = &states[k];
            k = match state.moves.iter().find(|(m, _)| *m == c) {
                Some(&(_, next)) => next,
                None if state.special.contains(&c) => return false,
                None => 0,
            };
        }
        true
    }

    #[test]
    fn gemma_strings_are_exactly_the_texts_without_the_quote() {
        for quote in ["<|\"|>", "<escape>"] {
            for text in ["a<", "a<<b", "x<|y", "<", "<<", "<|", "<|\"|", "<esc", "<<escape", "a<|\"<|\"|", "é<é"] {
                assert!(accepted_without(quote, text), "{quote}: {text:?}");
            }
            for text in [quote.to_string(), format!("x{quote}"), format!("<{quote}y"), format!("<|{quote}")] {
                assert!(!accepted_without(quote, &text), "{quote}: {text:?}");
            }
            // Every text over the marker's characters and one other, up to 7 long.
            let alphabet: Vec<char> =
                quote.chars().chain(['a']).collect::<std::collections::BTreeSet<_>>().into_iter().collect();
            let mut texts = vec![String::new()];
            for _ in 0..7 {
                texts = texts.iter().flat_map(|t| alphabet.iter().map(move |c| format!("{t}{c}"))).collect();
                for text in &texts {
                    assert_eq!(accepted_without(quote, text), !text.contains(quote), "{quote}: {text:?}");
                }
            }
        }
    }

    #[test]
    fn gemma_string_and_number_rules() {
        let rules = gemma_value_rules("<|\"|>");
        assert!(rules.contains("fw-g-string ::= \"<|\\\"|>\" fw-g-text-0 \"<|\\\"|>\"\n"), "{rules}");
        assert!(rules.contains("fw-g-text-0 ::=  | \"<\" fw-g-text-1 | [^\\x3C] fw-g-text-0\n"), "{rules}");
        assert!(rules.contains("fw-g-text-4 ::=  | \"<\" fw-g-text-1 | [^\\x3C\\x3E] fw-g-text-0\n"), "{rules}");
        assert!(rules.contains("fw-g-number ::= \"-\"? ( \"0\" | [1-9] [0-9]* )"), "no leading zeros: {rules}");
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
