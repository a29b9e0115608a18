//! Scanning Gemma's `call:name{key:value,…}` call syntax, converting it to JSON as it streams.

use std::sync::Arc;

use super::{flush, partial_suffix, ScanEvent, ToolKeys};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum GemmaStage {
    /// `call:`
    Prefix,
    /// The function name, up to `{`.
    Name,
    Body,
    Done,
}

/// Scans Gemma's `call:name{key:value,…}` and streams the arguments converted to JSON.
#[derive(Debug)]
pub(super) struct GemmaCall {
    quote: &'static str,
    stage: GemmaStage,
    name: String,
    /// Open containers, innermost last: true for objects.
    containers: Vec<bool>,
    expect_key: bool,
    key: String,
    in_string: bool,
    /// The arguments of each tool.
    keys: Arc<ToolKeys>,
    /// The argument names of the called tool (the only keys the grammar allows at the top).
    arguments: Vec<String>,
}

impl GemmaCall {
    const PREFIX: &'static str = "call:";

    pub(super) fn is_done(&self) -> bool {
        self.stage == GemmaStage::Done
    }

    pub(super) fn new(quote: &'static str, keys: Arc<ToolKeys>) -> Self {
        Self {
            quote,
            stage: GemmaStage::Prefix,
            name: String::new(),
            containers: Vec::new(),
            expect_key: false,
            key: String::new(),
            in_string: false,
            keys,
            arguments: Vec::new(),
        }
    }

    pub(super) fn feed(&mut self, input: &str, events: &mut Vec<ScanEvent>) -> usize {
        let mut json = String::new();
        let mut at = 0;
        while at < input.len() && self.stage != GemmaStage::Done {
            let rest = &input[at..];
            let Some(used) = self.step(rest, &mut json, events) else { break };
            at += used;
        }
        flush(&mut json, events);
        at
    }

    /// Consumes the start of `rest`; `None` when more text is needed to decide.
    fn step(&mut self, rest: &str, json: &mut String, events: &mut Vec<ScanEvent>) -> Option<usize> {
        let c = rest.chars().next()?;
        match self.stage {
            GemmaStage::Prefix => {
                if rest.starts_with(Self::PREFIX) {
                    self.stage = GemmaStage::Name;
                    return Some(Self::PREFIX.len());
                }
                if Self::PREFIX.starts_with(rest) {
                    return None;
                }
                self.stage = GemmaStage::Name;
                Some(0)
            }
            GemmaStage::Name if c == '{' => {
                let name = self.name.trim().to_string();
                self.arguments = self.keys.names.get(&name).cloned().unwrap_or_default();
                events.push(ScanEvent::Name(name));
                self.stage = GemmaStage::Body;
                Some(0)
            }
            GemmaStage::Name => {
                self.name.push(c);
                Some(c.len_utf8())
            }
            GemmaStage::Body if self.in_string => match rest.find(self.quote) {
                Some(end) => {
                    push_json_escaped(json, &rest[..end]);
                    json.push('"');
                    self.in_string = false;
                    Some(end + self.quote.len())
                }
                None => {
                    let keep = rest.len() - partial_suffix(rest, self.quote);
                    push_json_escaped(json, &rest[..keep]);
                    (keep > 0).then_some(keep)
                }
            },
            GemmaStage::Body if self.expect_key && !(c == '}' && self.key.is_empty()) => {
                if self.containers.len() == 1 && self.key.is_empty() && !self.arguments.is_empty() {
                    return self.known_key(rest, json);
                }
                if c == ':' {
                    json.push_str(&serde_json::Value::String(self.key.trim().to_string()).to_string());
                    json.push(':');
                    self.key.clear();
                    self.expect_key = false;
                } else {
                    self.key.push(c);
                }
                Some(c.len_utf8())
            }
            GemmaStage::Body => {
                if rest.starts_with(self.quote) {
                    json.push('"');
                    self.in_string = true;
                    return Some(self.quote.len());
                }
                if rest.len() < self.quote.len() && self.quote.starts_with(rest) {
                    return None;
                }
                match c {
                    '{' | '[' => {
                        self.containers.push(c == '{');
                        self.expect_key = c == '{';
                    }
                    '}' | ']' => {
                        self.containers.pop();
                        self.expect_key = false;
                        if self.containers.is_empty() {
                            self.stage = GemmaStage::Done;
                        }
                    }
                    ',' => self.expect_key = self.containers.last() == Some(&true),
                    _ => {}
                }
                json.push(c);
                Some(c.len_utf8())
            }
            GemmaStage::Done => None,
        }
    }
}

impl GemmaCall {
    /// A top-level key: the longest argument name that `rest` starts with, followed by `:`
    /// (names may contain `:`); `None` while a longer name may still follow.
    fn known_key(&mut self, rest: &str, json: &mut String) -> Option<usize> {
        let may_grow = self.arguments.iter().any(|k| k.len() + 1 > rest.len() && format!("{k}:").starts_with(rest));
        if may_grow {
            return None;
        }
        let key = self
            .arguments
            .iter()
            .filter(|k| rest.starts_with(k.as_str()) && rest[k.len()..].starts_with(':'))
            .max_by_key(|k| k.len());
        match key {
            Some(key) => {
                json.push_str(&serde_json::Value::String(key.clone()).to_string());
                json.push(':');
                self.expect_key = false;
                Some(key.len() + 1)
            }
            // Not one of them (only possible without a grammar): read up to the first `:`.
            None => {
                self.arguments.clear();
                Some(0)
            }
        }
    }
}

fn push_json_escaped(json: &mut String, text: &str) {
    let quoted = serde_json::Value::String(text.to_string()).to_string();
    json.push_str(&quoted[1..quoted.len() - 1]);
}
