//! The streaming parser: model text in, content and tool-call pieces out, as soon as each is
//! certain. Markers never reach the content; a call's name is reported the moment it is known
//! and its arguments as they are written.
//!
//! The format's markers are matched leniently about whitespace (a run of whitespace in a marker
//! matches any run, or none, in the text): the grammar writes them exactly, and text written
//! without one is read the same.

mod gemma_call;
mod json_call;
mod literal;
mod named_call;
mod params_call;
mod pythonic_call;

use std::collections::HashMap;
use std::sync::Arc;

use gemma_call::GemmaCall;
use json_call::JsonCall;
use literal::{match_literal, Match};
use named_call::NamedCall;
use params_call::ParamsCall;
use pythonic_call::PythonicCall;

use super::format::ToolFormat;
use super::syntax::{Body, Markers};
use super::ToolSet;

/// A piece of parsed output, in output order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ParsedPiece {
    /// Text for the user.
    Content(String),
    /// A call begins (its name is known).
    CallStart {
        /// Position of the call in this reply, from 0.
        index: usize,
        /// The function called.
        name: String,
    },
    /// More of a call's arguments (JSON text; the fragments of a call concatenate to it).
    Arguments {
        /// The call.
        index: usize,
        /// The next fragment.
        text: String,
    },
}

/// A call found in the output.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParsedCall {
    /// The function.
    pub name: String,
    /// Its arguments as JSON text.
    pub arguments: String,
    /// Whether the call was closed (false when generation stopped inside it).
    pub complete: bool,
}

/// What comes after a marker.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Then {
    /// A call.
    Call,
    /// Another call, the close of the section, or the end of the calls.
    AfterCall,
    /// Text again: the section is closed.
    Content,
    /// A call, or plain text after the format's text recipient (functionary v3.2's `all\n`
    /// after `>>>`).
    Recipient,
}

#[derive(Debug)]
enum State {
    Content,
    /// The rest of a marker, then what follows it.
    Marker(String, Then),
    Call(CallScanner),
    AfterCall,
    /// After an opener of a format whose openers also open text: the text recipient, or a call.
    Recipient,
}

/// What the parser knows of the tools: each tool's argument names, and those whose values
/// are not strings.
#[derive(Debug, Default)]
pub(crate) struct ToolKeys {
    /// The argument names of each tool, by tool name.
    pub names: HashMap<String, Vec<String>>,
    /// The arguments of each tool whose schema gives a type other than string.
    pub json: HashMap<String, Vec<String>>,
}

impl ToolKeys {
    /// Whether argument `key` of `tool` takes JSON (not raw text) in parameter formats.
    pub(crate) fn is_json(&self, tool: &str, key: &str) -> bool {
        self.json.get(tool).is_some_and(|keys| keys.iter().any(|k| k == key))
    }
}

/// Splits a model's output into content and tool calls, incrementally.
#[derive(Debug)]
pub struct ToolCallParser {
    format: ToolFormat,
    markers: Markers,
    state: State,
    /// Text received but not yet consumed.
    buffer: String,
    calls: Vec<ParsedCall>,
    /// Whitespace after a call is layout, not content.
    after_call: bool,
    /// Nothing but whitespace has been received: a bare JSON call may still open the reply.
    opening: bool,
    /// Texts that start a bare JSON call where they open the reply.
    anchored: Vec<String>,
    /// Whether the call being scanned is a bare JSON call (not in the format's markers).
    bare_call: bool,
    /// Whether calls are read (a reply without tools in a format whose reply starts inside an
    /// opener is read for its text recipient only).
    calls_allowed: bool,
    keys: Arc<ToolKeys>,
}

impl ToolCallParser {
    /// A parser for one reply in `format`. Only Llama 3's `{"name"` opens a bare JSON call
    /// (see [`Self::with_json_object_calls`]), and only where it opens the reply. In a format
    /// whose generation prompt ends with the call opener (functionary v3.2's `>>>`), the reply
    /// starts after it: with the text recipient (`all\n`, left out of the content) or a call.
    #[must_use]
    pub fn new(format: ToolFormat) -> Self {
        let prefilled = format.text_recipient().is_some();
        Self {
            markers: format.parser_markers(),
            anchored: format.anchored_openers(),
            format,
            state: if prefilled { State::Recipient } else { State::Content },
            buffer: String::new(),
            calls: Vec::new(),
            after_call: false,
            opening: !prefilled,
            bare_call: false,
            calls_allowed: true,
            keys: Arc::default(),
        }
    }

    /// The same parser reading no calls: all is content but the text recipient that opens the
    /// reply (a reply without tools in a format whose reply starts inside an opener).
    #[must_use]
    pub fn without_calls(mut self) -> Self {
        self.calls_allowed = false;
        self
    }

    /// Tells the parser the arguments of `tools`: a Gemma call's key then ends at the longest
    /// argument name followed by `:` (names may contain `:`), and parameter formats know which
    /// values are JSON rather than text.
    #[must_use]
    pub fn with_tools(mut self, tools: &ToolSet) -> Self {
        let mut keys = ToolKeys::default();
        for spec in tools.specs() {
            let properties = spec.parameters.get("properties").and_then(serde_json::Value::as_object);
            let names = properties.map(|p| p.keys().cloned().collect()).unwrap_or_default();
            let json = properties
                .map(|p| {
                    p.iter()
                        .filter(|(_, schema)| schema.get("type").and_then(serde_json::Value::as_str) != Some("string"))
                        .filter(|(_, schema)| schema.get("type").is_some() || schema.get("enum").is_none())
                        .map(|(k, _)| k.clone())
                        .collect()
                })
                .unwrap_or_default();
            keys.names.insert(spec.name.clone(), names);
            keys.json.insert(spec.name.clone(), json);
        }
        self.keys = Arc::new(keys);
        self
    }

    /// A reply that opens with a JSON object (after optional whitespace) is a bare call
    /// `{"name": …, "arguments": {…}}` in every format: `auto` mode without a response format,
    /// where the grammar makes such a reply a call.
    #[must_use]
    pub fn with_json_object_calls(mut self) -> Self {
        self.anchored = vec!["{".to_string()];
        self
    }

    /// Feeds the next text; returns the pieces it completes.
    pub fn push(&mut self, text: &str) -> Vec<ParsedPiece> {
        self.buffer.push_str(text);
        let mut out = Vec::new();
        while self.step(&mut out) {}
        out
    }

    /// Ends the reply: releases held-back text and returns the last pieces with all calls.
    /// Unfinished call syntax (generation stopped inside a call's markers, or in the opener of
    /// a call after other calls) is not content.
    #[must_use]
    pub fn finish(mut self) -> (Vec<ParsedPiece>, Vec<ParsedCall>) {
        let mut out = Vec::new();
        let rest = std::mem::take(&mut self.buffer);
        let unfinished_opener = self.format.openers().iter().any(|o| o.starts_with(rest.trim_start()));
        let content = match self.state {
            State::Content => !(self.after_call && unfinished_opener),
            // A reply read for its text only that ends in a beginning of the text recipient.
            State::Recipient => !self.calls_allowed,
            _ => false,
        };
        if content {
            self.emit_content(&rest, &mut out);
        }
        (out, self.calls)
    }

    /// The calls found so far.
    #[must_use]
    pub fn calls(&self) -> &[ParsedCall] {
        &self.calls
    }

    /// Advances the state machine once; false when it needs more text.
    fn step(&mut self, out: &mut Vec<ParsedPiece>) -> bool {
        match &mut self.state {
            State::Content => self.step_content(out),
            State::Marker(rest, then) => {
                let then = *then;
                match match_literal(&self.buffer, rest) {
                    Match::Full(used) => {
                        self.buffer.drain(..used);
                        self.enter(then);
                        true
                    }
                    Match::Partial => false,
                    // Not the format after all (only possible without a grammar): text again.
                    Match::No => {
                        self.after_call = true;
                        self.state = State::Content;
                        true
                    }
                }
            }
            State::AfterCall => self.step_after_call(),
            State::Recipient => self.step_recipient(),
            State::Call(scanner) => {
                let mut events = Vec::new();
                let consumed = scanner.feed(&self.buffer, &mut events);
                let done = scanner.is_done();
                let failed = scanner.failed();
                self.buffer.drain(..consumed);
                for event in events {
                    self.apply(event, out);
                }
                if failed {
                    // Not a call after all (only possible without a grammar): show the rest as text.
                    self.state = State::Content;
                    return true;
                }
                if !done {
                    return false;
                }
                if let Some(call) = self.calls.last_mut() {
                    call.complete = true;
                }
                if self.bare_call {
                    self.after_call = true;
                    self.state = State::Content;
                } else {
                    self.state = State::Marker(self.markers.call_close.clone(), Then::AfterCall);
                }
                true
            }
        }
    }

    fn enter(&mut self, then: Then) {
        self.state = match then {
            Then::Call => {
                self.bare_call = false;
                State::Call(self.scanner())
            }
            Then::AfterCall => State::AfterCall,
            Then::Content => {
                self.after_call = true;
                State::Content
            }
            Then::Recipient => State::Recipient,
        };
    }

    /// What follows an opener: a call, unless the format opens text the same way.
    fn call_then(&self) -> Then {
        if self.format.text_recipient().is_some() {
            Then::Recipient
        } else {
            Then::Call
        }
    }

    /// After an opener that may open text: the text recipient (exactly, so that a function
    /// named `allow` is no text) makes what follows content; anything else is a call.
    fn step_recipient(&mut self) -> bool {
        let recipient = self.format.text_recipient().unwrap_or_default();
        if self.buffer.starts_with(recipient) {
            self.buffer.drain(..recipient.len());
            self.state = State::Content;
        } else if recipient.starts_with(self.buffer.as_str()) {
            return false;
        } else if self.calls_allowed {
            self.enter(Then::Call);
        } else {
            self.state = State::Content;
        }
        true
    }

    fn scanner(&self) -> CallScanner {
        match self.format.body() {
            Body::Json { name_key, args_key } => CallScanner::Json(JsonCall::new(name_key, args_key)),
            Body::NamedJson { name_close } => CallScanner::Named(NamedCall::new(name_close)),
            Body::Params(params) => CallScanner::Params(ParamsCall::new(params.clone(), Arc::clone(&self.keys))),
            Body::Gemma { quote } => CallScanner::Gemma(GemmaCall::new(quote, Arc::clone(&self.keys))),
            Body::Pythonic => CallScanner::Pythonic(PythonicCall::default()),
        }
    }

    fn step_content(&mut self, out: &mut Vec<ParsedPiece>) -> bool {
        if self.opening {
            let rest = self.buffer.trim_start();
            // Whitespace, or the beginning of a bare call's opener: wait for more.
            if rest.is_empty() || self.anchored.iter().any(|o| o.starts_with(rest) && o.len() > rest.len()) {
                return false;
            }
            self.opening = false;
            if self.anchored.iter().any(|o| rest.starts_with(o.as_str())) {
                // The whitespace before the call is not content; the opener is the start of
                // the call's JSON, left to the scanner.
                let lead = self.buffer.len() - rest.len();
                self.buffer.drain(..lead);
                self.bare_call = true;
                self.state = State::Call(CallScanner::Json(JsonCall::new("name", &self.format.bare_args_key())));
                return true;
            }
        }
        let openers = if self.calls_allowed { self.format.openers() } else { Vec::new() };
        let found = openers
            .iter()
            .filter_map(|o| self.buffer.find(o.as_str()).map(|at| (at, o.len())))
            .min_by_key(|&(at, _)| at);
        match found {
            Some((at, opener_len)) => {
                let before: String = self.buffer.drain(..at).collect();
                // Whitespace before a call is layout (templates write a newline there).
                self.emit_content(before.trim_end(), out);
                self.buffer.drain(..opener_len);
                let head = format!("{}{}", self.markers.open, self.markers.call_open);
                let rest = head.trim_start().get(opener_len..).unwrap_or_default().to_string();
                self.state = State::Marker(rest, self.call_then());
                true
            }
            None => {
                let hold = openers.iter().map(|o| partial_suffix(&self.buffer, o)).max().unwrap_or(0);
                // Trailing whitespace waits too: it is content only if text follows it.
                let emit_len = self.buffer[..self.buffer.len() - hold].trim_end().len();
                let emit: String = self.buffer.drain(..emit_len).collect();
                self.emit_content(&emit, out);
                false
            }
        }
    }

    /// After a call's close: the separator or the next call's open (another call), the
    /// section's close, or anything else (the calls are over).
    fn step_after_call(&mut self) -> bool {
        let lead = self.buffer.len() - self.buffer.trim_start().len();
        self.buffer.drain(..lead);
        if self.buffer.is_empty() {
            return false;
        }
        let next_call = State::Marker(String::new(), self.call_then());
        let Markers { separator, call_open, close, .. } = &self.markers;
        let mut choices: Vec<(String, State)> = Vec::new();
        if !separator.trim().is_empty() {
            choices.push((format!("{separator}{call_open}"), next_call));
        } else if !call_open.trim().is_empty() {
            choices.push((call_open.clone(), next_call));
        } else if self.format.body_start().is_some_and(|c| self.buffer.starts_with(c)) {
            self.state = State::Marker(String::new(), Then::Call);
            return true;
        }
        if !close.trim().is_empty() {
            choices.push((close.clone(), State::Marker(String::new(), Then::Content)));
        }
        let mut waiting = false;
        for (marker, next) in choices {
            match match_literal(&self.buffer, &marker) {
                Match::Full(used) => {
                    self.buffer.drain(..used);
                    self.state = next;
                    return true;
                }
                Match::Partial => waiting = true,
                Match::No => {}
            }
        }
        if waiting {
            return false;
        }
        self.after_call = true;
        self.state = State::Content;
        true
    }

    fn apply(&mut self, event: ScanEvent, out: &mut Vec<ParsedPiece>) {
        match event {
            ScanEvent::Name(name) => {
                out.push(ParsedPiece::CallStart { index: self.calls.len(), name: name.clone() });
                self.calls.push(ParsedCall { name, arguments: String::new(), complete: false });
            }
            ScanEvent::Arguments(text) => {
                if let Some(call) = self.calls.last_mut() {
                    call.arguments.push_str(&text);
                    out.push(ParsedPiece::Arguments { index: self.calls.len() - 1, text });
                }
            }
        }
    }

    fn emit_content(&mut self, text: &str, out: &mut Vec<ParsedPiece>) {
        let text = if self.after_call { text.trim_start() } else { text };
        if text.is_empty() {
            return;
        }
        self.after_call = false;
        match out.last_mut() {
            Some(ParsedPiece::Content(previous)) => previous.push_str(text),
            _ => out.push(ParsedPiece::Content(text.to_string())),
        }
    }
}

/// Length of the longest end of `text` that is a proper beginning of `marker`: text that may
/// still turn into the marker.
pub(super) fn partial_suffix(text: &str, marker: &str) -> usize {
    (1..marker.len().min(text.len() + 1))
        .rev()
        .find(|&n| text.is_char_boundary(text.len() - n) && marker.starts_with(&text[text.len() - n..]))
        .unwrap_or(0)
}

/// Whether `c` may be part of a function name (the names [`ToolSet`] accepts).
pub(super) fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == '-'
}

/// What a call scanner found.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum ScanEvent {
    Name(String),
    Arguments(String),
}

#[derive(Debug)]
enum CallScanner {
    Json(JsonCall),
    Named(NamedCall),
    Params(ParamsCall),
    Gemma(GemmaCall),
    Pythonic(PythonicCall),
}

impl CallScanner {
    /// Consumes what it can of `input`; returns the bytes consumed.
    fn feed(&mut self, input: &str, events: &mut Vec<ScanEvent>) -> usize {
        match self {
            Self::Json(call) => call.feed(input, events),
            Self::Named(call) => call.feed(input, events),
            Self::Params(call) => call.feed(input, events),
            Self::Gemma(call) => call.feed(input, events),
            Self::Pythonic(call) => call.feed(input, events),
        }
    }

    fn is_done(&self) -> bool {
        match self {
            Self::Json(call) => call.is_done(),
            Self::Named(call) => call.is_done(),
            Self::Params(call) => call.is_done(),
            Self::Gemma(call) => call.is_done(),
            Self::Pythonic(call) => call.is_done(),
        }
    }

    fn failed(&self) -> bool {
        match self {
            Self::Json(call) => call.failed(),
            Self::Named(call) => call.failed(),
            Self::Params(call) => call.failed(),
            Self::Gemma(_) => false,
            Self::Pythonic(call) => call.failed(),
        }
    }
}

/// Emits the arguments text gathered so far, if any.
pub(super) fn flush(arguments: &mut String, events: &mut Vec<ScanEvent>) {
    if !arguments.is_empty() {
        events.push(ScanEvent::Arguments(std::mem::take(arguments)));
    }
}

#[cfg(test)]
mod tests;
