//! Shaping generated text into the answer: plain content, or content and tool calls, checked
//! against their schemas before the answer is complete. A thinking model's reasoning is split
//! off first: it is never content, and calls are looked for in the answer only.
//!
//! Small models asked for calls with parallel calls allowed tend to repeat the same call until
//! the token limit. A repeated call (same function, same arguments) is never useful, so the
//! reply ends at the first repetition and the repetition is dropped. To drop it before a client
//! sees it, a later call to a function already called is held until it is complete; all other
//! calls stream as they are written.

use super::convert::OutputPlan;
use super::error::OutputError;
use super::wire::{Delta, FunctionCall, FunctionDelta, ResponseToolCall, ToolCallDelta};
use crate::chat::tools::{ParsedCall, ParsedPiece, ToolCallParser};
use crate::chat::{ReasoningSplitter, Split};
use crate::engine::FinishReason;

/// Follows one reply as its text arrives.
pub(super) struct AnswerShaper {
    plan: OutputPlan,
    /// Splits a thinking model's reasoning from its answer.
    reasoning: Option<ReasoningSplitter>,
    /// All reasoning sent so far.
    reasoning_text: String,
    parser: Option<ToolCallParser>,
    /// Ids of the calls sent so far, by index.
    call_ids: Vec<String>,
    /// All content sent so far (checked against the JSON schema at the end).
    content: String,
    /// A call to an already-called function, held until it is complete: its index and pieces.
    held: Option<(usize, Vec<ParsedPiece>)>,
    /// Set when a call repeated an earlier one: calls from this index on are dropped, and
    /// nothing more is sent.
    cut_at: Option<usize>,
}

/// What newly generated text produced.
pub(super) struct Shaped {
    /// Deltas to send.
    pub deltas: Vec<Delta>,
    /// The reply is complete: generation should end now.
    pub done: bool,
}

/// The end of a reply.
pub(super) struct Ending {
    /// Deltas still to send (held-back text).
    pub deltas: Vec<Delta>,
    /// OpenAI's `finish_reason`.
    pub finish_reason: &'static str,
    /// All content, `None` if there was none (or only whitespace) and the reply made calls.
    pub content: Option<String>,
    /// The model's reasoning, `None` if it wrote none.
    pub reasoning: Option<String>,
    /// The complete calls with their ids (a call cut by the token limit is left out).
    pub calls: Vec<ResponseToolCall>,
}

impl AnswerShaper {
    /// A shaper for a reply made under `plan`; `in_reasoning` when the prompt opened the
    /// model's reasoning.
    pub(super) fn new(plan: OutputPlan, in_reasoning: bool) -> Self {
        let parser = match &plan.tools {
            Some(tools) => {
                let parser = ToolCallParser::new(plan.format.clone()).with_tools(tools);
                // Without a response format, the grammar makes a reply that opens with a JSON
                // object a call (with one, that reply is the JSON answer).
                Some(if plan.schema.is_none() { parser.with_json_object_calls() } else { parser })
            }
            // A reply that starts inside the call opener starts with its text recipient
            // (functionary v3.2's `all\n`), which is no content.
            None if plan.format.text_recipient().is_some() => {
                Some(ToolCallParser::new(plan.format.clone()).without_calls())
            }
            None => None,
        };
        let reasoning = plan.reasoning.map(|format| ReasoningSplitter::new(format, in_reasoning));
        Self {
            plan,
            reasoning,
            reasoning_text: String::new(),
            parser,
            call_ids: Vec::new(),
            content: String::new(),
            held: None,
            cut_at: None,
        }
    }

    /// The deltas for newly generated text (none while markers may be forming).
    pub(super) fn text(&mut self, text: String) -> Shaped {
        match self.reasoning.as_mut().map(|splitter| splitter.push(&text)) {
            Some(split) => self.split_text(split),
            None => self.answer_text(text),
        }
    }

    /// The deltas for text split into reasoning and answer.
    fn split_text(&mut self, split: Split) -> Shaped {
        let mut deltas = Vec::new();
        if !split.reasoning.is_empty() {
            self.reasoning_text.push_str(&split.reasoning);
            deltas.push(Delta { reasoning_content: Some(split.reasoning), ..Delta::default() });
        }
        let answer = self.answer_text(split.content);
        deltas.extend(answer.deltas);
        Shaped { deltas, done: answer.done }
    }

    /// The deltas for newly generated answer text.
    fn answer_text(&mut self, text: String) -> Shaped {
        let Some(mut parser) = self.parser.take() else {
            self.content.push_str(&text);
            let deltas =
                if text.is_empty() { Vec::new() } else { vec![Delta { content: Some(text), ..Delta::default() }] };
            return Shaped { deltas, done: false };
        };
        let pieces = parser.push(&text);
        let mut deltas = self.deltas(pieces, parser.calls());
        self.resolve_held(parser.calls(), &mut deltas);
        self.parser = Some(parser);
        Shaped { deltas, done: self.cut_at.is_some() }
    }

    /// Ends the reply: the last deltas, the finish reason and the checked calls.
    ///
    /// # Errors
    /// When a finished call's arguments or a JSON reply do not match their schema, or when the
    /// reply stopped inside a call (a call is never returned half written as "stop").
    pub(super) fn finish(mut self, reason: FinishReason) -> Result<Ending, OutputError> {
        let held = match self.reasoning.as_mut().map(ReasoningSplitter::finish) {
            Some(split) => self.split_text(split).deltas,
            None => Vec::new(),
        };
        let (deltas, mut calls) = match self.parser.take() {
            Some(parser) => {
                let (pieces, calls) = parser.finish();
                let mut deltas = held;
                deltas.extend(self.deltas(pieces, &calls));
                if let Some((index, held)) = self.held.take() {
                    if !is_repeat(&calls, index) {
                        deltas.extend(self.send(held));
                    } else {
                        self.cut_at = Some(index);
                    }
                }
                (deltas, calls)
            }
            None => (held, Vec::new()),
        };
        calls.truncate(self.cut_at.unwrap_or(usize::MAX));
        if reason == FinishReason::Stop {
            if let Some(cut) = calls.iter().find(|c| !c.complete) {
                return Err(OutputError::CutCall { name: cut.name.clone(), arguments: cut.arguments.clone() });
            }
            if let Some(tools) = &self.plan.tools {
                for call in &calls {
                    tools.check_arguments(&call.name, &call.arguments)?;
                }
            }
            if let Some(schema) = self.plan.schema.as_ref().filter(|_| calls.is_empty()) {
                schema.check(&self.content)?;
            }
        }
        let finish_reason = match reason {
            FinishReason::Stop if calls.iter().any(|c| c.complete) => "tool_calls",
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
        };
        // A call the token limit cut is no call (its arguments are unfinished): the answer
        // says "length" and carries the complete calls only.
        let calls: Vec<ResponseToolCall> = calls
            .into_iter()
            .zip(self.call_ids)
            .filter(|(call, _)| call.complete)
            .map(|(call, id)| ResponseToolCall {
                id,
                kind: "function",
                function: FunctionCall { name: call.name, arguments: call.arguments },
            })
            .collect();
        // Beside calls, whitespace is layout, not content.
        let content = (!self.content.trim().is_empty() || calls.is_empty()).then_some(self.content);
        let reasoning = (!self.reasoning_text.is_empty()).then_some(self.reasoning_text);
        Ok(Ending { deltas, finish_reason, content, reasoning, calls })
    }

    /// Deltas for parsed pieces, holding calls that may repeat an earlier one.
    fn deltas(&mut self, pieces: Vec<ParsedPiece>, calls: &[ParsedCall]) -> Vec<Delta> {
        let mut out = Vec::new();
        for piece in pieces {
            if self.cut_at.is_some() {
                break;
            }
            if let ParsedPiece::CallStart { index, name } = &piece {
                self.resolve_held(calls, &mut out);
                if self.cut_at.is_some() {
                    break;
                }
                // A held call still unfinished when the next one starts was abandoned (text
                // that was no call after all): no repeat, so it is sent, never skipped.
                if let Some((_, held)) = self.held.take() {
                    out.extend(self.send(held));
                }
                if calls.iter().take(*index).any(|c| &c.name == name) {
                    self.held = Some((*index, vec![piece]));
                    continue;
                }
            }
            match self.held.as_mut() {
                Some((_, held)) => held.push(piece),
                None => out.extend(self.send(vec![piece])),
            }
        }
        out
    }

    /// Sends a held call once it is complete, or ends the reply if it repeats an earlier one.
    fn resolve_held(&mut self, calls: &[ParsedCall], out: &mut Vec<Delta>) {
        let Some((index, _)) = &self.held else { return };
        if !calls.get(*index).is_some_and(|c| c.complete) {
            return;
        }
        let index = *index;
        let Some((_, held)) = self.held.take() else { return };
        if is_repeat(calls, index) {
            self.cut_at = Some(index);
        } else {
            out.extend(self.send(held));
        }
    }

    fn send(&mut self, pieces: Vec<ParsedPiece>) -> Vec<Delta> {
        pieces
            .into_iter()
            .map(|piece| match piece {
                ParsedPiece::Content(text) => {
                    self.content.push_str(&text);
                    Delta { content: Some(text), ..Delta::default() }
                }
                ParsedPiece::CallStart { index, name } => {
                    let id = self.plan.format.new_call_id();
                    self.call_ids.push(id.clone());
                    call_delta(index, Some(id), Some(name), String::new())
                }
                ParsedPiece::Arguments { index, text } => call_delta(index, None, None, text),
            })
            .collect()
    }
}

/// Whether call `index` repeats an earlier call: same function, same arguments.
fn is_repeat(calls: &[ParsedCall], index: usize) -> bool {
    let as_json = |text: &str| serde_json::from_str::<serde_json::Value>(text).ok();
    calls.get(index).is_some_and(|call| {
        calls[..index].iter().any(|earlier| {
            earlier.name == call.name
                && (earlier.arguments == call.arguments
                    || as_json(&earlier.arguments).is_some_and(|a| Some(a) == as_json(&call.arguments)))
        })
    })
}

fn call_delta(index: usize, id: Option<String>, name: Option<String>, arguments: String) -> Delta {
    let kind = id.as_ref().map(|_| "function");
    Delta {
        tool_calls: Some([ToolCallDelta { index, id, kind, function: FunctionDelta { name, arguments } }]),
        ..Delta::default()
    }
}

#[cfg(test)]
mod tests;
