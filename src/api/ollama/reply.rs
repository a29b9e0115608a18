//! Ollama's answers: a whole reply, or its NDJSON stream (one object per line, the last with
//! `done: true`, the done reason and the counts and durations in nanoseconds). Calls are sent
//! whole, their arguments an object, as Ollama sends them; never as JSON in the content.

use std::time::Instant;

use serde_json::{json, Map, Value};

use super::super::answer::{AnswerShaper, Ending};
use super::super::chat::{EventFramer, Framed, SsePayload};
use super::super::error::{ApiError, OllamaError};
use super::super::wire::Delta;
use crate::engine::{Event, Timings, Usage};

/// Which endpoint answers: chat writes a `message`, generate a `response`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Kind {
    /// `/api/chat`.
    Chat,
    /// `/api/generate`.
    Generate,
}

/// What every object of one answer carries.
#[derive(Clone, Debug)]
pub(super) struct Answering {
    /// Which endpoint answers.
    pub kind: Kind,
    /// The model name to answer with.
    pub model: String,
    /// When the request arrived (`total_duration` counts from it).
    pub arrived: Instant,
}

impl Answering {
    /// An object of the answer with its `model`, `created_at`, the `message` (or `response`)
    /// made of `content`, `thinking` and `calls`, and `done`.
    fn object(
        &self,
        content: &str,
        thinking: Option<&str>,
        calls: Option<Vec<Value>>,
        done: bool,
    ) -> Map<String, Value> {
        let mut object = Map::new();
        object.insert("model".into(), json!(self.model));
        object.insert(
            "created_at".into(),
            json!(chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true)),
        );
        match self.kind {
            Kind::Chat => {
                let mut message = json!({"role": "assistant", "content": content});
                if let Some(thinking) = thinking {
                    message["thinking"] = json!(thinking);
                }
                if let Some(calls) = calls {
                    message["tool_calls"] = Value::Array(calls);
                }
                object.insert("message".into(), message);
            }
            Kind::Generate => {
                object.insert("response".into(), json!(content));
                if let Some(thinking) = thinking {
                    object.insert("thinking".into(), json!(thinking));
                }
            }
        }
        object.insert("done".into(), json!(done));
        object
    }

    /// The last object: `done`, why, and the counts and durations (nanoseconds). Ollama's
    /// `prompt_eval_count` counts the prompt tokens evaluated: those the cache held are not.
    fn done(&self, mut object: Map<String, Value>, ending: &Ending, usage: &Usage, timings: &Timings) -> Value {
        let nanos = |d: std::time::Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        let reason = if ending.finish_reason == "length" { "length" } else { "stop" };
        object.insert("done_reason".into(), json!(reason));
        object.insert("total_duration".into(), json!(nanos(self.arrived.elapsed())));
        // The model is loaded once, at start.
        object.insert("load_duration".into(), json!(0));
        object.insert("prompt_eval_count".into(), json!(usage.prompt_tokens.saturating_sub(usage.cached_tokens)));
        object.insert("prompt_eval_duration".into(), json!(nanos(timings.prompt)));
        object.insert("eval_count".into(), json!(usage.completion_tokens));
        object.insert("eval_duration".into(), json!(nanos(timings.generation)));
        Value::Object(object)
    }

    /// The answer to a request that only asks for the model to be loaded (an empty prompt):
    /// done at once, `done_reason` `load`, as Ollama answers it.
    pub(super) fn loaded(&self) -> Value {
        let mut object = self.object("", None, None, true);
        object.insert("done_reason".into(), json!("load"));
        Value::Object(object)
    }

    /// The whole answer, from the shaped `ending`.
    pub(super) fn whole(&self, ending: &Ending, usage: &Usage, timings: &Timings) -> Value {
        let calls = calls_of(ending);
        let object = self.object(
            ending.content.as_deref().unwrap_or_default(),
            ending.reasoning.as_deref(),
            (!calls.is_empty()).then_some(calls),
            true,
        );
        self.done(object, ending, usage, timings)
    }
}

/// The calls of `ending` as Ollama writes them: `{"function": {"name", "arguments": {...}}}`.
fn calls_of(ending: &Ending) -> Vec<Value> {
    ending
        .calls
        .iter()
        .map(|call| {
            let arguments: Value = serde_json::from_str(&call.function.arguments).unwrap_or_else(|_| json!({}));
            json!({"function": {"name": call.function.name, "arguments": arguments}})
        })
        .collect()
}

/// Frames a reply's events as NDJSON lines.
pub(super) struct NdjsonFramer {
    answering: Answering,
    /// `None` once the reply ended.
    shaper: Option<AnswerShaper>,
}

impl NdjsonFramer {
    /// A framer for a reply shaped by `shaper`.
    pub(super) fn new(answering: Answering, shaper: AnswerShaper) -> Self {
        Self { answering, shaper: Some(shaper) }
    }

    /// The lines of `deltas`' text and reasoning (call pieces wait for the whole call).
    fn lines(&self, deltas: Vec<Delta>) -> Vec<SsePayload> {
        deltas
            .into_iter()
            .filter(|d| d.content.is_some() || d.reasoning_content.is_some())
            .map(|d| {
                let object = self.answering.object(
                    d.content.as_deref().unwrap_or_default(),
                    d.reasoning_content.as_deref(),
                    None,
                    false,
                );
                SsePayload::data(Value::Object(object).to_string())
            })
            .collect()
    }

    /// The stream's last line: an error.
    fn failed(error: ApiError) -> Framed {
        Framed { events: vec![SsePayload::data(OllamaError(error).to_json())], finish_now: true, done: true }
    }
}

impl EventFramer for NdjsonFramer {
    fn first_events(&mut self) -> Vec<SsePayload> {
        Vec::new()
    }

    fn frame(&mut self, event: Option<Event>) -> Framed {
        let quiet = |finish_now| Framed { events: Vec::new(), finish_now, done: false };
        match event {
            Some(Event::Text(text)) => {
                let Some(shaper) = self.shaper.as_mut() else { return quiet(true) };
                let shaped = shaper.text(text);
                Framed { events: self.lines(shaped.deltas), finish_now: shaped.done, done: false }
            }
            Some(Event::Finished { reason, usage, timings }) => {
                let Some(shaper) = self.shaper.take() else { return Self::failed(ApiError::EngineStopped) };
                let mut ending = match shaper.finish(reason) {
                    Ok(ending) => ending,
                    Err(e) => return Self::failed(e.into()),
                };
                let mut events = self.lines(std::mem::take(&mut ending.deltas));
                let calls = calls_of(&ending);
                if !calls.is_empty() {
                    let object = self.answering.object("", None, Some(calls), false);
                    events.push(SsePayload::data(Value::Object(object).to_string()));
                }
                let last = self.answering.done(self.answering.object("", None, None, true), &ending, &usage, &timings);
                events.push(SsePayload::data(last.to_string()));
                Framed { events, finish_now: false, done: true }
            }
            Some(Event::Failed(e)) => Self::failed(e.into()),
            Some(Event::Started { .. } | Event::Logprobs(_)) => quiet(false),
            None => Self::failed(ApiError::EngineStopped),
        }
    }
}
