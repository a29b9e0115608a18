//! Scanning a call written as its name and XML-style parameters (Qwen3-Coder's
//! `<function=NAME>\n<parameter=KEY>\nVALUE\n</parameter>\n</function>`, GLM's
//! `NAME<arg_key>KEY</arg_key><arg_value>VALUE</arg_value>`), converting it to JSON as it streams:
//! string values are raw text, the others JSON.

use std::sync::Arc;

use super::super::syntax::{Params, ARGUMENT_KEY, CALL_NAME};
use super::literal::{match_literal, Match};
use super::{flush, is_name_char, partial_suffix, ScanEvent, ToolKeys};

#[derive(Clone, Debug, PartialEq, Eq)]
enum Stage {
    Name,
    NameClose,
    KeyOrEnd,
    Key,
    /// A value; true when it is JSON (not text).
    Value(bool),
    Done,
    Failed,
}

/// Scans a parameter-style call and streams its arguments as a JSON object.
#[derive(Debug)]
pub(super) struct ParamsCall {
    params: Params,
    keys: Arc<ToolKeys>,
    stage: Stage,
    name: String,
    key: String,
    /// A JSON value's text so far.
    raw: String,
    /// Arguments written so far (none: `{` is still to come).
    count: usize,
}

impl ParamsCall {
    pub(super) fn new(params: Params, keys: Arc<ToolKeys>) -> Self {
        Self { params, keys, stage: Stage::Name, name: String::new(), key: String::new(), raw: String::new(), count: 0 }
    }

    pub(super) fn is_done(&self) -> bool {
        self.stage == Stage::Done
    }

    pub(super) fn failed(&self) -> bool {
        self.stage == Stage::Failed
    }

    pub(super) fn feed(&mut self, input: &str, events: &mut Vec<ScanEvent>) -> usize {
        let mut json = String::new();
        let mut at = 0;
        while at < input.len() && !matches!(self.stage, Stage::Done | Stage::Failed) {
            match self.step(&input[at..], &mut json, events) {
                Some(used) => at += used,
                None => break,
            }
        }
        flush(&mut json, events);
        at
    }

    /// Consumes the start of `rest`; `None` when more text is needed.
    fn step(&mut self, rest: &str, json: &mut String, events: &mut Vec<ScanEvent>) -> Option<usize> {
        match self.stage.clone() {
            Stage::Name => {
                let length = rest.len() - rest.trim_start_matches(is_name_char).len();
                self.name.push_str(&rest[..length]);
                if length == rest.len() {
                    return (length > 0).then_some(length);
                }
                if self.name.is_empty() {
                    self.stage = Stage::Failed;
                    return Some(length);
                }
                events.push(ScanEvent::Name(self.name.clone()));
                self.stage = Stage::NameClose;
                Some(length)
            }
            Stage::NameClose => {
                let close = self.params.name_close.replace(CALL_NAME, &self.name);
                self.marker(rest, &close, Stage::KeyOrEnd)
            }
            Stage::KeyOrEnd => match match_literal(rest, &self.params.key_open) {
                // A closing tag is no argument's name: MiniMax-M3's `]<]minimax[>[<` opens
                // both an argument and the call's `]<]minimax[>[</invoke>`.
                Match::Full(used) if rest.len() == used && !self.params.key_open.trim().is_empty() => None,
                Match::Full(used) if !self.params.key_open.trim().is_empty() && !rest[used..].starts_with('/') => {
                    self.stage = Stage::Key;
                    Some(used)
                }
                Match::Partial => None,
                _ => {
                    json.push_str(if self.count == 0 { "{}" } else { "}" });
                    self.stage = Stage::Done;
                    Some(0)
                }
            },
            Stage::Key => {
                let closes = [self.params.key_close.clone(), self.params.key_close_json.clone()];
                let first = |close: &str| close.split_whitespace().next().unwrap_or_default().to_string();
                let end =
                    closes.iter().filter_map(|c| rest.find(first(c).as_str()).filter(|_| !first(c).is_empty())).min();
                let end = end?;
                let mut waiting = false;
                for (i, close) in closes.iter().enumerate() {
                    match match_literal(&rest[end..], close) {
                        Match::Full(used) => {
                            self.key = rest[..end].trim().to_string();
                            let is_json = if self.params.key_close == self.params.key_close_json {
                                self.keys.is_json(&self.name, &self.key)
                            } else {
                                i == 1
                            };
                            json.push_str(if self.count == 0 { "{" } else { ", " });
                            json.push_str(&serde_json::Value::String(self.key.clone()).to_string());
                            json.push_str(": ");
                            if !is_json {
                                json.push('"');
                            }
                            self.count += 1;
                            self.raw.clear();
                            self.stage = Stage::Value(is_json);
                            return Some(end + used);
                        }
                        Match::Partial => waiting = true,
                        Match::No => {}
                    }
                }
                if waiting {
                    None
                } else {
                    self.stage = Stage::Failed;
                    Some(0)
                }
            }
            Stage::Value(is_json) => {
                let close = self.params.value_close.replace(ARGUMENT_KEY, &self.key);
                let piece = close.split_whitespace().next().unwrap_or_default().to_string();
                let trim_before = close.starts_with(char::is_whitespace);
                match rest.find(piece.as_str()).filter(|_| !piece.is_empty()) {
                    Some(end) => {
                        let text = if trim_before { rest[..end].trim_end() } else { &rest[..end] };
                        self.value_text(text, is_json, json);
                        if is_json {
                            json.push_str(&json_value(&self.raw));
                        } else {
                            json.push('"');
                        }
                        self.stage = Stage::KeyOrEnd;
                        match match_literal(&rest[end..], close.trim_start()) {
                            Match::Full(used) => Some(end + used),
                            // Whitespace at the marker's end may go on: the next marker or
                            // the call's close skips it.
                            Match::Partial => Some(end + piece.len()),
                            Match::No => Some(end + piece.len()),
                        }
                    }
                    None => {
                        let hold = partial_suffix(rest, &piece);
                        let mut safe = rest.len() - hold;
                        if trim_before {
                            safe = rest[..safe].trim_end().len();
                        }
                        self.value_text(&rest[..safe], is_json, json);
                        (safe > 0).then_some(safe)
                    }
                }
            }
            Stage::Done | Stage::Failed => None,
        }
    }

    /// Matches `marker` at the start of `rest`, then goes to `next`.
    fn marker(&mut self, rest: &str, marker: &str, next: Stage) -> Option<usize> {
        match match_literal(rest, marker) {
            Match::Full(used) => {
                self.stage = next;
                Some(used)
            }
            Match::Partial => None,
            Match::No => {
                self.stage = Stage::Failed;
                Some(0)
            }
        }
    }

    /// More of a value: text is streamed escaped, JSON is gathered.
    fn value_text(&mut self, text: &str, is_json: bool, json: &mut String) {
        if is_json {
            self.raw.push_str(text);
        } else {
            let quoted = serde_json::Value::String(text.to_string()).to_string();
            json.push_str(&quoted[1..quoted.len() - 1]);
        }
    }
}

/// A non-string value as JSON: JSON text as it is, Python's literals converted (templates write
/// `True`), anything else as a string.
fn json_value(raw: &str) -> String {
    let raw = raw.trim();
    if serde_json::from_str::<serde_json::Value>(raw).is_ok() {
        return raw.to_string();
    }
    match raw {
        "True" => "true".into(),
        "False" => "false".into(),
        "None" => "null".into(),
        other => serde_json::Value::String(other.to_string()).to_string(),
    }
}
