//! Reading a template's call syntax off what it writes: a conversation holding an assistant's
//! calls (sentinel names, arguments and values) is rendered with one call and with two, and the
//! markers are the texts around the sentinels: what comes before and after a call, what stands
//! between two calls, and how a name and its arguments are written. The description is then
//! checked by writing the same calls with it: it must give back the template's very text.

use serde_json::{json, Value};

use super::syntax::{Body, Layout, Markers, Params, ARGUMENT_KEY, CALL_ID, CALL_INDEX, CALL_NAME, CALL_NUMBER};
use super::{ToolCallParser, ToolDefinition, ToolFormat, ToolSet};
use crate::chat::{ChatMessage, ReasoningFormat, Role, ToolCall};

const FUNCTION_ONE: &str = "FWFUNCONE";
const FUNCTION_TWO: &str = "FWFUNCTWO";
const KEY_ONE: &str = "fwkeyone";
const KEY_TWO: &str = "fwkeytwo";
const VALUE_ONE: &str = "FWVALUEONE";
const VALUE_TWO: &str = "FWVALUETWO";
const NUMBER: i64 = 735;
const PLAIN_REPLY: &str = "FWPLAINREPLY";

/// A way to render a conversation: the template with `tools`, with or without the generation
/// prompt; `None` when the template refuses it.
pub(crate) type Render<'r> = dyn Fn(&[ChatMessage], &[ToolDefinition], bool) -> Option<String> + 'r;

/// The tools of the probe conversations.
fn probe_tools() -> Vec<ToolDefinition> {
    // Described parameters: Command R+'s template writes each parameter's description.
    let parameters = json!({"type": "object", "properties": {
            KEY_ONE: {"type": "string", "description": "A text."},
            KEY_TWO: {"type": "integer", "description": "A number."}},
        "required": [KEY_ONE]});
    [FUNCTION_ONE, FUNCTION_TWO]
        .into_iter()
        .map(|name| ToolDefinition {
            name: name.into(),
            description: Some("A function.".into()),
            parameters: parameters.clone(),
        })
        .collect()
}

fn probe_call(index: usize) -> ToolCall {
    let (name, arguments) = match index {
        0 => (FUNCTION_ONE, json!({KEY_ONE: VALUE_ONE, KEY_TWO: NUMBER})),
        _ => (FUNCTION_TWO, json!({KEY_ONE: VALUE_TWO})),
    };
    ToolCall {
        id: format!("call0000{}", index + 1),
        name: name.into(),
        arguments: crate::chat::python_json(&arguments),
    }
}

/// A call syntax read off a template.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Syntax {
    pub layout: Layout,
    pub body: Body,
    /// Whether the template writes several calls in a reply (GigaChat's writes the first only).
    pub parallel: bool,
    /// Where the generation prompt ends with the call opener (functionary v3.2's `>>>`): the
    /// text that follows the opener for a plain reply (`all\n`).
    pub text_recipient: Option<String>,
}

/// The call syntax `render` writes; `None` when it writes no calls or none this reading
/// understands (the caller then uses the generic format). `reasoning` is the template's
/// reasoning format: what it writes before an answer (an empty reasoning block) is no marker.
pub(crate) fn read_syntax(render: &Render<'_>, reasoning: Option<ReasoningFormat>) -> Option<Syntax> {
    let tools = probe_tools();
    let probes = Probes::render(render, &tools)?;
    let syntax = probes.describe(reasoning)?;
    // The description must read the template's own text back as the call it wrote.
    let format = ToolFormat::from_syntax(syntax.clone());
    let tool_set = ToolSet::new(tools.clone()).ok()?;
    let mut parser = ToolCallParser::new(format).with_tools(&tool_set);
    let _ = parser.push(&probes.one);
    let (_, calls) = parser.finish();
    let expected: Value = serde_json::from_str(&probe_call(0).arguments).ok()?;
    let read = calls.first().filter(|call| call.complete && call.name == FUNCTION_ONE)?;
    (serde_json::from_str::<Value>(&read.arguments).ok()? == expected).then_some(syntax)
}

/// The probe conversation rendered in its variants.
struct Probes {
    /// The assistant turn with one call, from the end of the generation prompt.
    one: String,
    /// The same with two calls, when the template allows several.
    two: Option<String>,
    /// A plain reply's turn: what the template writes before and after an answer.
    plain: String,
    /// The rendering before the assistant's turn (the generation prompt's end).
    lead: String,
}

impl Probes {
    fn render(render: &Render<'_>, tools: &[ToolDefinition]) -> Option<Self> {
        // Some templates refuse a system message, or a conversation that ends with a call:
        // the first variant that renders is used.
        for (system, results) in [(true, false), (false, false), (true, true), (false, true)] {
            let mut base = Vec::new();
            if system {
                base.push(ChatMessage::system("FWSYSTEM"));
            }
            base.push(ChatMessage::user("FWUSER"));
            let turn = |calls: usize| {
                let mut messages = base.clone();
                let mut assistant = ChatMessage::assistant("");
                assistant.tool_calls = (0..calls).map(probe_call).collect();
                messages.push(assistant);
                if results {
                    for index in 0..calls {
                        let mut result = ChatMessage::new(Role::Tool, "FWRESULT");
                        result.tool_call_id = Some(probe_call(index).id);
                        messages.push(result);
                    }
                }
                render(&messages, tools, false)
            };
            let Some(one) = turn(1) else { continue };
            let prompt = render(&base, tools, true).unwrap_or_default();
            let mut plain_messages = base.clone();
            plain_messages.push(ChatMessage::assistant(PLAIN_REPLY));
            let plain = render(&plain_messages, tools, false).unwrap_or_default();
            // Where the assistant's turn starts: after what every variant shares, never inside
            // a marker (`<|START_ACTION|>` and `<|START_TEXT|>` share `<|START_`).
            let start = marker_prefix(&one, &prompt).len().min(marker_prefix(&one, &plain).len());
            let after_user = one.find("FWUSER").map_or(0, |at| at + "FWUSER".len());
            let start = start.max(after_user);
            let cut = |text: &str| text.get(start..).unwrap_or_default().to_string();
            return Some(Self {
                one: cut(&one),
                two: turn(2).map(|two| cut(&two)),
                plain: cut(&plain),
                lead: one[..start].to_string(),
            });
        }
        None
    }

    fn describe(&self, reasoning: Option<ReasoningFormat>) -> Option<Syntax> {
        let first = CallSpan::find(&self.one, FUNCTION_ONE, 0, None)?;
        let second = self.two.as_ref().and_then(|two| {
            let first_again = CallSpan::find(two, FUNCTION_ONE, 0, None)?;
            let second = CallSpan::find(two, FUNCTION_TWO, first_again.end, Some(&first.body))?;
            Some((two.as_str(), first_again, second))
        });
        let before = &self.one[..first.start];
        let after = &self.one[first.end..];
        let (plain_before, plain_after) = match self.plain.find(PLAIN_REPLY) {
            Some(at) => (&self.plain[..at], &self.plain[at + PLAIN_REPLY.len()..]),
            None => ("", ""),
        };
        let (call_open, call_close, separator) = match &second {
            Some((two, first_again, second)) => {
                let between = &two[first_again.end..second.start];
                let call_close = marker_prefix(after, between);
                let rest = &between[call_close.len()..];
                let call_open = marker_suffix(before, rest);
                let separator = &rest[..rest.len() - call_open.len()];
                (call_open.to_string(), call_close.to_string(), separator.to_string())
            }
            // One call per reply: what follows it is its close.
            None => (String::new(), String::new(), String::new()),
        };
        let after_calls = &after[call_close.len()..];
        let end_of_turn = marker_suffix(after_calls, plain_after);
        let close = after_calls[..after_calls.len() - end_of_turn.len()].to_string();
        let mut open = &before[..before.len() - call_open.len()];
        if let Some(rest) = open.strip_prefix(plain_before) {
            open = rest;
        }
        if let Some(format) = reasoning {
            if let Some(at) = open.find(format.close) {
                open = &open[at + format.close.len()..];
            }
        }
        // A space that joins the first call to the generation prompt's last word (Muse
        // Glimmer's `<|start|>assistant to=NAME`) is the reply's first character, no layout.
        let joined = open.is_empty()
            && call_open.starts_with(' ')
            && !call_open[1..].starts_with(char::is_whitespace)
            && self.lead.ends_with(|c: char| !c.is_whitespace());
        let (open, call_open, separator) = if joined {
            (String::new(), call_open, separator)
        } else if open.trim().is_empty() {
            // Whitespace before each call (Bielik's `\n<tool_call>`, Qwen3's `\n` before a
            // second call): layout before the first, written between two.
            let trimmed = call_open.trim_start();
            let leading = &call_open[..call_open.len() - trimmed.len()];
            let separator = if second.is_some() { format!("{separator}{leading}") } else { separator };
            (String::new(), trimmed.to_string(), separator)
        } else {
            (open.trim_start().to_string(), call_open, separator)
        };
        // Calls counted from one (Kimi K3's `index="1"`, `index="2"`).
        let numbered = self.one.contains("=\"1\"")
            && !self.one.contains("=\"2\"")
            && self.two.as_deref().is_some_and(|two| two.contains("=\"2\""));
        let id = |marker: String| {
            let marker = marker.replace("call00001", CALL_ID).replace("call00002", CALL_ID);
            if numbered {
                marker.replace("=\"1\"", &format!("=\"{CALL_NUMBER}\""))
            } else {
                marker
            }
        };
        let body = match first.body {
            Body::NamedJson { name_close } => Body::NamedJson { name_close: id(name_close) },
            // A name written again before the parameters (Muse Glimmer's `invoke name="…"`).
            Body::Params(params) => {
                Body::Params(Params { name_close: id(params.name_close).replace(FUNCTION_ONE, CALL_NAME), ..params })
            }
            other => other,
        };
        let mut markers = Markers {
            open: id(open),
            call_open: id(call_open),
            call_close: id(call_close),
            separator: id(separator),
            close: id(close),
        };
        let mut text_recipient = None;
        if markers.opener().is_empty() {
            // Nothing before the first call, something before the next: the generation prompt
            // ends with the opener (functionary v3.2's `>>>`), and a plain reply is marked by
            // what follows it there (`all\n`).
            let opener = markers.separator.trim_start().to_string();
            let prefilled = !opener.trim().is_empty() && self.lead.trim_end().ends_with(opener.trim_end());
            if !prefilled || plain_before.trim().is_empty() {
                return None;
            }
            markers.separator.truncate(markers.separator.len() - opener.len());
            markers.call_open = opener;
            text_recipient = Some(plain_before.to_string());
        }
        Some(Syntax { layout: Layout::Markers(markers), body, parallel: second.is_some(), text_recipient })
    }
}

/// Where a probe call's text lies and how it is written.
struct CallSpan {
    start: usize,
    end: usize,
    body: Body,
}

impl CallSpan {
    /// The call to `name` in `text` (from `from` on): a JSON object holding the name, or the
    /// name followed by JSON arguments or by parameters. `first` is how the first call was
    /// written (the second probe call has one parameter only, too few to read markers from).
    fn find(text: &str, name: &str, from: usize, first: Option<&Body>) -> Option<Self> {
        let at = from + text.get(from..)?.find(name)?;
        let after_name = at + name.len();
        let second = name != FUNCTION_ONE;
        let arguments = if second { json!({KEY_ONE: VALUE_TWO}) } else { json!({KEY_ONE: VALUE_ONE, KEY_TWO: NUMBER}) };
        // A JSON object around a quoted name.
        if text[..at].ends_with('"') {
            if let Some(span) = Self::json_object(text, at, name, &arguments) {
                return Some(span);
            }
        }
        // The name, then the arguments as JSON.
        for written in [crate::chat::python_json(&arguments), arguments.to_string()] {
            if let Some(offset) = text[after_name..].find(&written) {
                let name_close = index_placeholder(&text[after_name..after_name + offset]);
                if name_close.contains(KEY_ONE) {
                    break;
                }
                let end = after_name + offset + written.len();
                return Some(Self { start: at, end, body: Body::NamedJson { name_close } });
            }
        }
        // The name, then parameters: KEY_ONE's value is a string, KEY_TWO's a number.
        let key_one = after_name + text[after_name..].find(KEY_ONE)?;
        let value = if second { VALUE_TWO } else { VALUE_ONE };
        let value_one = key_one + text[key_one..].find(value)?;
        let value_one_end = value_one + value.len();
        if let (true, Some(Body::Params(params))) = (second, first) {
            let closed = params.value_close.replace(ARGUMENT_KEY, KEY_ONE);
            return text[value_one_end..].starts_with(&closed).then(|| Self {
                start: at,
                end: value_one_end + closed.len(),
                body: Body::Params(params.clone()),
            });
        }
        let name_and_key_open = &text[after_name..key_one];
        let key_close = text[key_one + KEY_ONE.len()..value_one].to_string();
        let key_two = value_one_end + text[value_one_end..].find(KEY_TWO)?;
        let number_text = NUMBER.to_string();
        let number = key_two + text[key_two..].find(&number_text)?;
        let between = text[value_one_end..key_two].replace(KEY_ONE, ARGUMENT_KEY);
        let key_open = marker_suffix(name_and_key_open, &between).to_string();
        let value_close = between[..between.len() - key_open.len()].to_string();
        let name_close = name_and_key_open[..name_and_key_open.len() - key_open.len()].to_string();
        let key_close_json = text[key_two + KEY_TWO.len()..number].to_string();
        let params = Params { name_close, key_open, key_close, key_close_json, value_close };
        let value_end = number + number_text.len();
        let closed = params.value_close.replace(ARGUMENT_KEY, KEY_TWO);
        text[value_end..].starts_with(&closed).then(|| Self {
            start: at,
            end: value_end + closed.len(),
            body: Body::Params(params),
        })
    }

    /// A JSON object holding the quoted `name` at `at` and `arguments`.
    fn json_object(text: &str, at: usize, name: &str, arguments: &Value) -> Option<Self> {
        let mut start = at;
        while let Some(open) = text[..start].rfind('{') {
            let mut stream = serde_json::Deserializer::from_str(&text[open..]).into_iter::<Value>();
            if let Some(Ok(Value::Object(object))) = stream.next() {
                let end = open + stream.byte_offset();
                let name_key = object.iter().find(|(_, v)| v.as_str() == Some(name)).map(|(k, _)| k.clone());
                let args_key = object.iter().find(|(_, v)| *v == arguments).map(|(k, _)| k.clone());
                if let (Some(name_key), Some(args_key)) = (name_key, args_key) {
                    return (end > at).then_some(Self { start: open, end, body: Body::Json { name_key, args_key } });
                }
            }
            start = open;
        }
        None
    }
}

/// `text` with a call index (`0`) right after a marker character replaced by [`CALL_INDEX`].
fn index_placeholder(text: &str) -> String {
    match text.find(":0") {
        Some(at) => format!("{}:{CALL_INDEX}{}", &text[..at], &text[at + 2..]),
        None => text.to_string(),
    }
}

/// Length of the longest common beginning of `a` and `b`, in whole characters.
fn common_prefix(a: &str, b: &str) -> usize {
    a.char_indices().zip(b.chars()).find(|((_, x), y)| x != y).map_or(a.len().min(b.len()), |((i, _), _)| i)
}

/// The longest common beginning of `a` and `b` that ends where a marker may end (after `>`,
/// `]`, `}`, `)`, whitespace, or at the end of either): two markers that share their first
/// characters (`<｜tool▁call▁end｜>` and `<｜tool▁calls▁end｜>`) are not cut apart.
fn marker_prefix<'a>(a: &'a str, b: &str) -> &'a str {
    let mut n = common_prefix(a, b);
    if n == a.len() || n == b.len() {
        return &a[..n];
    }
    while n > 0 && !a[..n].ends_with(|c: char| matches!(c, '>' | ']' | '}' | ')' | ',') || c.is_whitespace()) {
        n -= a[..n].chars().next_back().map_or(1, char::len_utf8);
    }
    &a[..n]
}

/// The longest common end of `a` and `b` that starts where a marker may start (before `<`,
/// `[`, `{`, after whitespace, or at the start of either).
fn marker_suffix<'a>(a: &'a str, b: &str) -> &'a str {
    let n = a.chars().rev().zip(b.chars().rev()).take_while(|(x, y)| x == y).map(|(x, _)| x.len_utf8()).sum::<usize>();
    let mut start = a.len() - n;
    if n == a.len() || n == b.len() {
        return &a[start..];
    }
    while start < a.len() {
        let rest = &a[start..];
        let previous = a[..start].chars().next_back();
        if rest.starts_with(['<', '[', '{']) || previous.is_some_and(char::is_whitespace) {
            break;
        }
        start += rest.chars().next().map_or(1, char::len_utf8);
    }
    &a[start..]
}
