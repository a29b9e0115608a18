//! Each body's rule for one tool's call: its fixed name, then its arguments, with every key at
//! most once, every required key present and values of their schema's kind.

use super::text::text_without;
use crate::chat::tools::gbnf::literal;
use crate::chat::tools::syntax::{Body, Params, ARGUMENT_KEY, CALL_ID, CALL_INDEX, CALL_NAME, CALL_NUMBER};
use crate::chat::tools::toolset::{CheckedTool, Property, PropertyKind};

/// A marker as grammar: its literal text, a call index as a number, a call id as an id. Empty
/// for an empty marker.
pub(super) fn marker(text: &str) -> String {
    text.replace(CALL_NUMBER, CALL_INDEX)
        .split(CALL_ID)
        .map(|part| {
            part.split(CALL_INDEX)
                .map(|piece| if piece.is_empty() { String::new() } else { literal(piece) })
                .collect::<Vec<_>>()
                .join(" [0-9]{1,3} ")
        })
        .collect::<Vec<_>>()
        .join(" [A-Za-z0-9_-]{1,40} ")
}

/// A call as one JSON object, written exactly as templates write it.
pub(super) fn json_call_rule(name_key: &str, args_key: &str, tool: &CheckedTool) -> String {
    format!(
        "( {} {}root \"}}\" )",
        literal(&format!("{{\"{name_key}\": \"{}\", \"{args_key}\": ", tool.spec.name)),
        tool.rule_prefix
    )
}

/// The rule of a call to `tool` (the `index`-th tool) in `body`; rules it needs are added to
/// `out`.
pub(super) fn call_rule(body: &Body, tool: &CheckedTool, index: usize, out: &mut String) -> String {
    let name = &tool.spec.name;
    let members = format!("fw-m{index}");
    match body {
        Body::Json { name_key, args_key } => json_call_rule(name_key, args_key, tool),
        Body::NamedJson { name_close } => {
            format!("( {} {} {}root )", literal(name), marker(name_close), tool.rule_prefix)
        }
        Body::Params(params) => {
            let rules: Vec<(String, bool)> =
                tool.properties.iter().map(|p| (param_rule(params, p), p.required)).collect();
            let arguments = if rules.is_empty() && tool.open_properties {
                any_params(params)
            } else {
                ordered_members(&members, &rules, "", out)
            };
            if !params_text_defined(out) {
                out.push_str(&text_without(&value_marker(params), "fw-x-text"));
            }
            format!("( {} {} {arguments} )", literal(name), marker(&params.name_close.replace(CALL_NAME, name)))
        }
        Body::Gemma { quote } => {
            let rules: Vec<(String, bool)> = tool
                .properties
                .iter()
                .map(|p| (format!("{} {}", literal(&format!("{}:", p.name)), gemma_value(&p.kind, quote)), p.required))
                .collect();
            let arguments = if rules.is_empty() && tool.open_properties {
                "( fw-g-key \":\" fw-g-value ( \",\" fw-g-key \":\" fw-g-value )* )?".to_string()
            } else {
                ordered_members(&members, &rules, "\",\"", out)
            };
            format!("( {} \"{{\" {arguments} \"}}\" )", literal(&format!("call:{name}")))
        }
        Body::Pythonic => {
            let rules: Vec<(String, bool)> = tool
                .properties
                .iter()
                .map(|p| (format!("{} {}", literal(&format!("{}=", p.name)), p.json_rule), p.required))
                .collect();
            let arguments = ordered_members(&members, &rules, "\", \"", out);
            format!("( {} {arguments} \")\" )", literal(&format!("{name}(")))
        }
    }
}

/// Whether the text rule of parameter values is in the grammar already.
fn params_text_defined(out: &str) -> bool {
    out.contains("fw-x-text-0 ::=")
}

/// What ends a parameter's text value: the value's close up to the argument's name.
fn value_marker(params: &Params) -> String {
    let close = params.value_close.trim_start();
    let close = close.split(ARGUMENT_KEY).next().unwrap_or_default();
    close.split_whitespace().next().unwrap_or(close).to_string()
}

/// One parameter: its name between the key markers, its value, the value's close.
fn param_rule(params: &Params, property: &Property) -> String {
    let (key_close, value) = match &property.kind {
        PropertyKind::Text => (&params.key_close, "fw-x-text-0".to_string()),
        PropertyKind::Choice(values) => {
            (&params.key_close, format!("( {} )", values.iter().map(|v| literal(v)).collect::<Vec<_>>().join(" | ")))
        }
        _ => (&params.key_close_json, property.json_rule.clone()),
    };
    format!(
        "{} {} {} {value} {}",
        marker(&params.key_open),
        literal(&property.name),
        marker(key_close),
        marker(&params.value_close.replace(ARGUMENT_KEY, &property.name))
    )
}

/// Parameters of a tool whose schema names none: any names, text values.
fn any_params(params: &Params) -> String {
    if params.value_close.contains(ARGUMENT_KEY) {
        return String::new();
    }
    format!(
        "( {} [A-Za-z0-9_-]+ {} fw-x-text-0 {} )*",
        marker(&params.key_open),
        marker(&params.key_close),
        marker(&params.value_close)
    )
}

/// A value of `kind` in Gemma's syntax.
fn gemma_value(kind: &PropertyKind, quote: &str) -> String {
    match kind {
        PropertyKind::Text => "fw-g-string".into(),
        PropertyKind::Choice(values) => {
            let quoted: Vec<String> = values.iter().map(|v| literal(&format!("{quote}{v}{quote}"))).collect();
            format!("( {} )", quoted.join(" | "))
        }
        PropertyKind::Integer => "( \"-\"? ( \"0\" | [1-9] [0-9]* ) )".into(),
        PropertyKind::Number => "fw-g-number".into(),
        PropertyKind::Boolean => "( \"true\" | \"false\" )".into(),
        PropertyKind::Other => "fw-g-value".into(),
    }
}

/// Members in their declared order, each at most once, the required ones always, `separator`
/// between two of them: rules `{name}-s{i}` (the members from `i` on, none written yet) and
/// `{name}-t{i}` (the same after a member was written). Returns the rule of all the members.
pub(super) fn ordered_members(name: &str, members: &[(String, bool)], separator: &str, out: &mut String) -> String {
    let n = members.len();
    if n == 0 {
        return String::new();
    }
    let rest = |i: usize| if i + 1 < n { format!(" {name}-t{}", i + 1) } else { String::new() };
    for (i, (member, required)) in members.iter().enumerate() {
        let after = rest(i);
        let with_separator = format!("{separator} {member}");
        let t = if *required { format!("{with_separator}{after}") } else { format!("( {with_separator} )?{after}") };
        out.push_str(&format!("{name}-t{i} ::= {t}\n"));
        let first = format!("{member}{after}");
        let s = match (required, i + 1 < n) {
            (true, _) => first,
            (false, true) => format!("{first} | {name}-s{}", i + 1),
            (false, false) => format!("( {first} )?"),
        };
        out.push_str(&format!("{name}-s{i} ::= {s}\n"));
    }
    format!("{name}-s0")
}
