//! The streaming parser: model text in, content and tool-call pieces out, as soon as each is
//! certain. Markers never reach the content; a call's name is reported the moment it is known
//! and its arguments as they are written.

mod gemma_call;
mod json_call;

use std::collections::HashMap;
use std::sync::Arc;

use gemma_call::GemmaCall;
use json_call::JsonCall;

use super::format::{Body, Layout, ToolFormat};
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

/// What to expect after an opener or a call.
#[derive(Clone, Copy, Debug)]
enum Expected {
    /// Whitespace, then a call.
    Call,
    /// Whitespace, then `[` opening a list of calls.
    ListStart,
    /// Whitespace, then `,` (another call) or `]`.
    ListNext,
    /// Whitespace, then the closing marker.
    Close(&'static str),
}

#[derive(Debug)]
enum State {
    Content,
    Expect(Expected),
    Call(CallScanner),
}

/// Splits a model's output into content and tool calls, incrementally.
#[derive(Debug)]
pub struct ToolCallParser {
    format: ToolFormat,
    state: State,
    /// Text received but not yet consumed.
    buffer: String,
    calls: Vec<ParsedCall>,
    /// Whitespace after a call is layout, not content.
    after_call: bool,
    /// Nothing but whitespace has been received: a bare JSON call may still open the reply.
    opening: bool,
    /// Texts that start a bare JSON call where they open the reply.
    anchored: Vec<&'static str>,
    /// Whether the call being scanned is a bare JSON call (not in the format's layout).
    bare_call: bool,
    /// The argument names of each tool, by tool name.
    keys: Arc<HashMap<String, Vec<String>>>,
}

impl ToolCallParser {
    /// A parser for one reply in `format`. Only Llama 3's `{"name"` opens a bare JSON call
    /// (see [`Self::with_json_object_calls`]), and only where it opens the reply.
    #[must_use]
    pub fn new(format: ToolFormat) -> Self {
        Self {
            format,
            state: State::Content,
            buffer: String::new(),
            calls: Vec::new(),
            after_call: false,
            opening: true,
            anchored: format.anchored_openers(),
            bare_call: false,
            keys: Arc::default(),
        }
    }

    /// Tells the parser the argument names of `tools`: a Gemma call's key then ends at the
    /// longest argument name followed by `:`, so names containing `:` are read whole (the
    /// grammar allows only these names).
    #[must_use]
    pub fn with_tools(mut self, tools: &ToolSet) -> Self {
        let keys = tools
            .specs()
            .map(|spec| {
                let names = spec
                    .parameters
                    .get("properties")
                    .and_then(serde_json::Value::as_object)
                    .map(|p| p.keys().cloned().collect())
                    .unwrap_or_default();
                (spec.name.clone(), names)
            })
            .collect();
        self.keys = Arc::new(keys);
        self
    }

    /// A reply that opens with a JSON object (after optional whitespace) is a bare call
    /// `{"name": …, "arguments": {…}}` in every format: `auto` mode without a response format,
    /// where the grammar makes such a reply a call.
    #[must_use]
    pub fn with_json_object_calls(mut self) -> Self {
        self.anchored = vec!["{"];
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
    /// Unfinished call syntax (generation stopped inside a call's envelope, or in the opener of
    /// a call after other calls) is not content.
    #[must_use]
    pub fn finish(mut self) -> (Vec<ParsedPiece>, Vec<ParsedCall>) {
        let mut out = Vec::new();
        let rest = std::mem::take(&mut self.buffer);
        let unfinished_opener = self.format.openers().iter().any(|o| o.starts_with(rest.trim_start()));
        if matches!(self.state, State::Content) && !(self.after_call && unfinished_opener) {
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
            State::Expect(next) => {
                let next = *next;
                self.step_expect(next)
            }
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
                self.state = match self.format.layout() {
                    _ if self.bare_call => {
                        self.after_call = true;
                        State::Content
                    }
                    Layout::Tagged { close, .. } => State::Expect(Expected::Close(close)),
                    Layout::List { .. } => State::Expect(Expected::ListNext),
                    Layout::BareJson => {
                        self.after_call = true;
                        State::Content
                    }
                };
                true
            }
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
            if self.anchored.iter().any(|o| rest.starts_with(o)) {
                // The whitespace before the call is not content; the opener is the start of
                // the call's JSON, left to the scanner.
                let lead = self.buffer.len() - rest.len();
                self.buffer.drain(..lead);
                self.bare_call = true;
                self.state = State::Call(CallScanner::Json(JsonCall::new(self.format.bare_args_key())));
                return true;
            }
        }
        let openers = self.format.openers();
        let found = openers.iter().filter_map(|o| self.buffer.find(o).map(|at| (at, *o))).min_by_key(|&(at, _)| at);
        match found {
            Some((at, opener)) => {
                let before: String = self.buffer.drain(..at).collect();
                self.emit_content(&before, out);
                self.state = match self.format.layout() {
                    Layout::Tagged { .. } | Layout::BareJson => State::Expect(Expected::Call),
                    Layout::List { .. } => State::Expect(Expected::ListStart),
                };
                self.buffer.drain(..opener.len());
                true
            }
            None => {
                let hold = openers.iter().map(|o| partial_suffix(&self.buffer, o)).max().unwrap_or(0);
                let emit: String = self.buffer.drain(..self.buffer.len() - hold).collect();
                self.emit_content(&emit, out);
                false
            }
        }
    }

    fn step_expect(&mut self, next: Expected) -> bool {
        let trimmed = self.buffer.trim_start().len();
        self.buffer.drain(..self.buffer.len() - trimmed);
        let Some(first) = self.buffer.chars().next() else { return false };
        match next {
            Expected::Call => self.start_call(),
            Expected::ListStart if first == '[' => {
                self.buffer.drain(..1);
                self.state = State::Expect(Expected::Call);
                true
            }
            Expected::ListNext if first == ',' => {
                self.buffer.drain(..1);
                self.state = State::Expect(Expected::Call);
                true
            }
            Expected::Close(close) if self.buffer.starts_with(close) => {
                self.buffer.drain(..close.len());
                self.after_call = true;
                self.state = State::Content;
                true
            }
            Expected::Close(close) if close.starts_with(self.buffer.as_str()) => false,
            Expected::ListNext if first == ']' => {
                self.buffer.drain(..1);
                self.after_call = true;
                self.state = State::Content;
                true
            }
            // Anything else: lenient, go back to text (only reachable without a grammar).
            _ => {
                self.after_call = true;
                self.state = State::Content;
                true
            }
        }
    }

    fn start_call(&mut self) -> bool {
        self.bare_call = false;
        self.state = State::Call(match self.format.body() {
            Body::Json { args_key } => CallScanner::Json(JsonCall::new(args_key)),
            Body::Gemma { quote } => CallScanner::Gemma(GemmaCall::new(quote, Arc::clone(&self.keys))),
        });
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

/// What a call scanner found.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum ScanEvent {
    Name(String),
    Arguments(String),
}

#[derive(Debug)]
enum CallScanner {
    Json(JsonCall),
    Gemma(GemmaCall),
}

impl CallScanner {
    /// Consumes what it can of `input`; returns the bytes consumed.
    fn feed(&mut self, input: &str, events: &mut Vec<ScanEvent>) -> usize {
        match self {
            Self::Json(call) => call.feed(input, events),
            Self::Gemma(call) => call.feed(input, events),
        }
    }

    fn is_done(&self) -> bool {
        match self {
            Self::Json(call) => call.is_done(),
            Self::Gemma(call) => call.is_done(),
        }
    }

    fn failed(&self) -> bool {
        match self {
            Self::Json(call) => call.failed(),
            Self::Gemma(_) => false,
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
