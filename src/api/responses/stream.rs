//! A response's output items, built from the shaped answer as the stream of Responses events:
//! `response.created`, each item added, its parts and deltas, each done, `response.completed`.
//! A whole (not streamed) response is the same stream's final object, so both agree.

use serde_json::{json, Value};

use super::wire::{OutputItem, OutputText, ReasoningText, ResponseObject};
use super::Answering;
use crate::api::answer::{AnswerShaper, Ending};
use crate::api::chat::{random_id, EventFramer, Framed, SsePayload};
use crate::api::error::ApiError;
use crate::api::logprobs::{ChatLogprobs, ChatTokenLogprob};
use crate::api::wire::Delta;
use crate::engine::{Event, FinishReason, TokenLogprob, Usage};

/// The item being streamed.
enum Open {
    Reasoning { id: String, text: String },
    Message { id: String, text: String, logprobs: Vec<ChatTokenLogprob> },
    Call { id: String, call_id: String, name: String, arguments: String },
}

/// Streams one response.
pub(super) struct ResponseFramer {
    answering: Option<Answering>,
    shaper: Option<AnswerShaper>,
    /// Each event's number, from 0.
    sequence: u64,
    /// Items done, in output order.
    output: Vec<OutputItem>,
    open: Option<Open>,
    /// Log-probabilities of text not streamed yet (when asked for).
    pending: Vec<TokenLogprob>,
    /// The response once it ended, or why it failed.
    outcome: Option<Result<ResponseObject, ApiError>>,
}

impl ResponseFramer {
    pub(super) fn new(answering: Answering, shaper: AnswerShaper) -> Self {
        Self {
            answering: Some(answering),
            shaper: Some(shaper),
            sequence: 0,
            output: Vec::new(),
            open: None,
            pending: Vec::new(),
            outcome: None,
        }
    }

    /// The response, once the events ended: what a whole (not streamed) response answers.
    ///
    /// # Errors
    /// Why it failed; [`ApiError::EngineStopped`] before the events ended.
    pub(super) fn into_outcome(self) -> Result<ResponseObject, ApiError> {
        self.outcome.unwrap_or(Err(ApiError::EngineStopped))
    }

    /// An SSE event of type `kind` with `fields`, numbered.
    fn event(&mut self, kind: &'static str, mut fields: Value) -> SsePayload {
        fields["type"] = json!(kind);
        fields["sequence_number"] = json!(self.sequence);
        self.sequence += 1;
        SsePayload { name: Some(kind), data: fields.to_string() }
    }

    /// The index the open item has, or the next item will have.
    fn index(&self) -> usize {
        self.output.len()
    }

    /// Events for the deltas of newly shaped text.
    fn deltas(&mut self, deltas: Vec<Delta>, out: &mut Vec<SsePayload>) {
        for delta in deltas {
            if let Some(text) = delta.reasoning_content {
                if !matches!(self.open, Some(Open::Reasoning { .. })) {
                    self.close(out);
                    self.open_item(Open::Reasoning { id: format!("rs_{}", random_id()), text: String::new() }, out);
                }
                self.reasoning_delta(text, out);
            }
            if let Some(text) = delta.content {
                if !matches!(self.open, Some(Open::Message { .. })) {
                    self.close(out);
                    let id = format!("msg_{}", random_id());
                    self.open_item(Open::Message { id, text: String::new(), logprobs: Vec::new() }, out);
                }
                self.text_delta(text, out);
            }
            for call in delta.tool_calls.into_iter().flatten() {
                if let (Some(call_id), Some(name)) = (call.id, call.function.name) {
                    self.close(out);
                    let id = format!("fc_{}", random_id());
                    self.open_item(Open::Call { id, call_id, name, arguments: String::new() }, out);
                }
                if !call.function.arguments.is_empty() {
                    self.arguments_delta(call.function.arguments, out);
                }
            }
        }
    }

    fn reasoning_delta(&mut self, delta: String, out: &mut Vec<SsePayload>) {
        let (index, id) = match self.open.as_mut() {
            Some(Open::Reasoning { id, text }) => {
                text.push_str(&delta);
                (self.output.len(), id.clone())
            }
            _ => return,
        };
        // The pending log-probabilities were the reasoning's: only the answer's are reported.
        self.pending.clear();
        let fields = json!({"item_id": id, "output_index": index, "content_index": 0, "delta": delta});
        out.push(self.event("response.reasoning_text.delta", fields));
    }

    fn text_delta(&mut self, delta: String, out: &mut Vec<SsePayload>) {
        let logprobs = ChatLogprobs::of(std::mem::take(&mut self.pending)).content;
        let logprobs_json = serde_json::to_value(&logprobs).unwrap_or_default();
        let index = self.index();
        let Some(Open::Message { id, text, logprobs: all }) = self.open.as_mut() else { return };
        text.push_str(&delta);
        all.extend(logprobs);
        let fields = json!({"item_id": id, "output_index": index, "content_index": 0, "delta": delta, "logprobs": logprobs_json});
        out.push(self.event("response.output_text.delta", fields));
    }

    fn arguments_delta(&mut self, delta: String, out: &mut Vec<SsePayload>) {
        let index = self.index();
        let Some(Open::Call { id, arguments, .. }) = self.open.as_mut() else { return };
        arguments.push_str(&delta);
        let fields = json!({"item_id": id, "output_index": index, "delta": delta});
        out.push(self.event("response.function_call_arguments.delta", fields));
    }

    /// Opens `item`: it is added, with its (empty) content part.
    fn open_item(&mut self, item: Open, out: &mut Vec<SsePayload>) {
        let index = self.index();
        let (added, part) = match &item {
            Open::Reasoning { id, .. } => (
                json!({"type": "reasoning", "id": id, "summary": [], "content": [], "status": "in_progress"}),
                Some((id.clone(), json!({"type": "reasoning_text", "text": ""}))),
            ),
            Open::Message { id, .. } => (
                json!({"type": "message", "id": id, "status": "in_progress", "role": "assistant", "content": []}),
                Some((id.clone(), json!({"type": "output_text", "text": "", "annotations": [], "logprobs": []}))),
            ),
            Open::Call { id, call_id, name, .. } => (
                json!({"type": "function_call", "id": id, "call_id": call_id, "name": name, "arguments": "",
                    "status": "in_progress"}),
                None,
            ),
        };
        out.push(self.event("response.output_item.added", json!({"output_index": index, "item": added})));
        if let Some((id, part)) = part {
            let fields = json!({"item_id": id, "output_index": index, "content_index": 0, "part": part});
            out.push(self.event("response.content_part.added", fields));
        }
        self.open = Some(item);
    }

    /// Closes the open item: its text or arguments are done, then the item.
    fn close(&mut self, out: &mut Vec<SsePayload>) {
        self.close_as("completed", out);
    }

    /// Closes the open item with `status` (`incomplete`: generation stopped inside it).
    fn close_as(&mut self, status: &'static str, out: &mut Vec<SsePayload>) {
        let Some(open) = self.open.take() else { return };
        let index = self.index();
        let item = match open {
            Open::Reasoning { id, text } => {
                let part = ReasoningText::new(text.clone());
                let fields = json!({"item_id": id, "output_index": index, "content_index": 0, "text": text});
                out.push(self.event("response.reasoning_text.done", fields));
                let fields = json!({"item_id": id, "output_index": index, "content_index": 0, "part": part});
                out.push(self.event("response.content_part.done", fields));
                OutputItem::Reasoning { id, summary: Vec::new(), content: vec![part], status }
            }
            Open::Message { id, text, logprobs } => {
                let part = OutputText::new(text, logprobs);
                let fields = json!({"item_id": id, "output_index": index, "content_index": 0, "text": part.text,
                    "logprobs": part.logprobs});
                out.push(self.event("response.output_text.done", fields));
                let fields = json!({"item_id": id, "output_index": index, "content_index": 0, "part": part});
                out.push(self.event("response.content_part.done", fields));
                OutputItem::Message { id, status, role: "assistant", content: vec![part] }
            }
            Open::Call { id, call_id, name, arguments } => {
                let fields = json!({"item_id": id, "output_index": index, "arguments": arguments, "name": name});
                out.push(self.event("response.function_call_arguments.done", fields));
                OutputItem::FunctionCall { id, call_id, name, arguments, status }
            }
        };
        out.push(self.event("response.output_item.done", json!({"output_index": index, "item": item})));
        self.output.push(item);
    }

    /// The answer ended: its last items, then `response.completed` (or `.incomplete`).
    fn finish(&mut self, ending: Ending, reason: FinishReason, usage: Usage, out: &mut Vec<SsePayload>) {
        self.deltas(ending.deltas, out);
        let has_message = self.output.iter().any(|item| matches!(item, OutputItem::Message { .. }))
            || matches!(self.open, Some(Open::Message { .. }));
        if !has_message && ending.calls.is_empty() {
            self.close(out);
            self.open_item(
                Open::Message { id: format!("msg_{}", random_id()), text: String::new(), logprobs: Vec::new() },
                out,
            );
        }
        self.close_as(if reason == FinishReason::Length { "incomplete" } else { "completed" }, out);
        let Some(answering) = self.answering.take() else { return };
        let response = answering.finish(std::mem::take(&mut self.output), reason, usage);
        let kind = if response.status == "completed" { "response.completed" } else { "response.incomplete" };
        out.push(self.event(kind, json!({"response": response})));
        self.outcome = Some(Ok(response));
    }

    /// The answer failed: an error event, then `response.failed`.
    fn fail(&mut self, error: ApiError, out: &mut Vec<SsePayload>) {
        let fields = json!({"code": error.code(), "message": error.to_string(), "param": error.param()});
        out.push(self.event("error", fields));
        if let Some(answering) = self.answering.take() {
            let response = answering.failed(std::mem::take(&mut self.output), &error);
            out.push(self.event("response.failed", json!({"response": response})));
        }
        self.outcome = Some(Err(error));
    }
}

impl EventFramer for ResponseFramer {
    fn first_events(&mut self) -> Vec<SsePayload> {
        let Some(response) = self.answering.as_ref().map(Answering::in_progress) else { return Vec::new() };
        let created = self.event("response.created", json!({"response": response}));
        let in_progress = self.event("response.in_progress", json!({"response": response}));
        vec![created, in_progress]
    }

    fn frame(&mut self, event: Option<Event>) -> Framed {
        let mut out = Vec::new();
        let (mut finish_now, mut done) = (false, false);
        match event {
            Some(Event::Started { .. }) => {}
            Some(Event::Logprobs(tokens)) => self.pending.extend(tokens),
            Some(Event::Text(text)) => {
                if let Some(shaped) = self.shaper.as_mut().map(|shaper| shaper.text(text)) {
                    finish_now = shaped.done;
                    self.deltas(shaped.deltas, &mut out);
                }
            }
            Some(Event::Finished { reason, usage, .. }) => {
                done = true;
                match self.shaper.take().map(|shaper| shaper.finish(reason)) {
                    Some(Ok(ending)) => self.finish(ending, reason, usage, &mut out),
                    Some(Err(e)) => self.fail(e.into(), &mut out),
                    None => self.fail(ApiError::EngineStopped, &mut out),
                }
            }
            Some(Event::Failed(e)) => {
                done = true;
                self.fail(e.into(), &mut out);
            }
            None => {
                done = true;
                self.fail(ApiError::EngineStopped, &mut out);
            }
        }
        Framed { events: out, finish_now, done }
    }
}
