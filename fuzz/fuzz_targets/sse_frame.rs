//! The SSE framer (`POST /v1/chat/completions` with `stream: true`) with arbitrary model text,
//! arbitrary chunking and every ending.
//!
//! Input: byte 0 picks the call format (`common::format`); byte 1: bit 0 = `include_usage`,
//! bit 1 = tools may be called, bit 2 = a response schema, bits 3-4 = the ending (stop, length,
//! an engine failure, events that just end), all bits seed the chunking; the rest is the
//! model's text (lossy UTF-8).
//!
//! Checks: every payload is one line of JSON (`data: …\n\n` needs no `\r` or `\n`) and the
//! stream ends with exactly one `[DONE]`, after an error envelope if it failed; chunks carry
//! the answer's id and model, content deltas are never empty, each call opens once, in order,
//! with an id, type and name, and only its arguments follow; one finish reason, in the last
//! chunk, `tool_calls` exactly when a stopped reply made calls; a stopped reply's calls match
//! their tools and its JSON the schema; usage when asked; and the same content, calls and
//! ending whether the text comes whole or in pieces.

#![no_main]

mod common;

use std::borrow::Cow;
use std::sync::OnceLock;

use firstword::chat::tools::OutputSchema;
use firstword::engine::Timings;
use firstword::fuzzing::{Api, SseTranscript};
use firstword::{EngineError, Event, FinishReason, Usage};
use libfuzzer_sys::fuzz_target;
use serde::Deserialize;
use serde_json::json;

/// The token counts every finished reply reports.
fn usage() -> Usage {
    Usage { prompt_tokens: 10, cached_tokens: 4, completion_tokens: 3, ..Usage::default() }
}

/// How the events end.
#[derive(Clone, Copy, PartialEq)]
enum Ending {
    Finished(FinishReason),
    Failed,
    Gone,
}

fuzz_target!(|data: &[u8]| {
    let [format, options, text @ ..] = data else { return };
    let text = String::from_utf8_lossy(text);
    let ending = match (options >> 3) & 3 {
        0 => Ending::Finished(FinishReason::Stop),
        1 => Ending::Finished(FinishReason::Length),
        2 => Ending::Failed,
        _ => Ending::Gone,
    };
    let run = |pieces: &[&str]| {
        let tools = (options & 2 != 0).then(|| common::tools().clone());
        let schema = (options & 4 != 0).then(|| schema().clone());
        let mut events = vec![Some(Event::Started { prompt_tokens: 10, cached_tokens: 4, in_reasoning: false })];
        events.extend(pieces.iter().map(|piece| Some(Event::Text(piece.to_string()))));
        let mut events = events.into_iter();
        let transcript =
            Api::stream(common::format(*format), tools, schema, options & 1 != 0, |finish_now| {
                match events.next().filter(|_| !finish_now) {
                    Some(event) => event,
                    None => match ending {
                        Ending::Finished(reason) => {
                            Some(Event::Finished { reason, usage: usage(), timings: Timings::default() })
                        }
                        Ending::Failed => Some(Event::Failed(EngineError::Internal("the model went away".into()))),
                        Ending::Gone => None,
                    },
                }
            });
        check(&transcript, options & 1 != 0, options & 4 != 0, ending)
    };
    let whole = run(&[&text]);
    assert_eq!(run(&common::chunks(&text, u64::from(*options))), whole, "pieces give the same answer");
});

/// The schema of JSON replies, built once.
fn schema() -> &'static OutputSchema {
    static SCHEMA: OnceLock<OutputSchema> = OnceLock::new();
    SCHEMA.get_or_init(|| {
        OutputSchema::new(
            &json!({"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}),
        )
        .expect("the schema is valid")
    })
}

/// What a client makes of a stream: content, calls (name, arguments), finish reason, error.
#[derive(Debug, PartialEq)]
struct Answer {
    content: String,
    calls: Vec<(String, String)>,
    finish_reason: Option<String>,
    error: Option<String>,
}

/// A payload as a client reads it: a chunk or an error envelope (fields not checked left out).
#[derive(Deserialize)]
struct Payload<'a> {
    #[serde(borrow)]
    error: Option<ErrorBody<'a>>,
    #[serde(borrow)]
    id: Option<Cow<'a, str>>,
    #[serde(borrow)]
    object: Option<Cow<'a, str>>,
    #[serde(borrow)]
    model: Option<Cow<'a, str>>,
    #[serde(borrow)]
    choices: Option<Vec<ChoiceBody<'a>>>,
    usage: Option<UsageBody>,
}

#[derive(Deserialize)]
struct ErrorBody<'a> {
    #[serde(borrow)]
    message: Cow<'a, str>,
    #[serde(rename = "type", borrow)]
    kind: Cow<'a, str>,
}

#[derive(Deserialize)]
struct ChoiceBody<'a> {
    #[serde(borrow)]
    delta: DeltaBody<'a>,
    #[serde(borrow)]
    finish_reason: Option<Cow<'a, str>>,
}

#[derive(Deserialize)]
struct DeltaBody<'a> {
    #[serde(borrow)]
    role: Option<Cow<'a, str>>,
    #[serde(borrow)]
    content: Option<Cow<'a, str>>,
    #[serde(borrow)]
    tool_calls: Option<Vec<CallDelta<'a>>>,
}

#[derive(Deserialize)]
struct CallDelta<'a> {
    index: usize,
    #[serde(borrow)]
    id: Option<Cow<'a, str>>,
    #[serde(rename = "type", borrow)]
    kind: Option<Cow<'a, str>>,
    #[serde(borrow)]
    function: FunctionDelta<'a>,
}

#[derive(Deserialize)]
struct FunctionDelta<'a> {
    #[serde(borrow)]
    name: Option<Cow<'a, str>>,
    #[serde(borrow)]
    arguments: Cow<'a, str>,
}

#[derive(Deserialize)]
struct UsageBody {
    total_tokens: u32,
}

/// `payload` read as a client does, checked to be one SSE data line and, if a chunk, to carry
/// the answer's id, model and object.
fn read(payload: &str) -> Payload<'_> {
    let bytes = payload.as_bytes();
    assert!(!bytes.contains(&b'\n') && !bytes.contains(&b'\r'), "one SSE data line: {payload:?}");
    let value: Payload = serde_json::from_str(payload).unwrap_or_else(|e| panic!("{payload}: {e}"));
    if value.error.is_none() {
        let fields = (value.id.as_deref(), value.model.as_deref(), value.object.as_deref());
        assert_eq!(fields, (Some("chatcmpl-fuzz"), Some("fuzz"), Some("chat.completion.chunk")), "{payload}");
    }
    value
}

/// Checks the stream's form and returns what it says.
fn check(transcript: &SseTranscript, include_usage: bool, with_schema: bool, ending: Ending) -> Answer {
    let opening = read(&transcript.opening);
    let [ChoiceBody { delta, finish_reason: None }] = opening.choices.as_deref().unwrap_or_default() else {
        panic!("one choice: {}", transcript.opening)
    };
    assert!(delta.role.as_deref() == Some("assistant") && delta.content.is_none() && delta.tool_calls.is_none());
    let (last, steps) = transcript.steps.split_last().expect("at least one step");
    assert!(last.done && steps.iter().all(|s| !s.done), "done once, at the end");
    let payloads: Vec<&str> = transcript.steps.iter().flat_map(|s| s.data.iter().map(String::as_str)).collect();
    let (done, payloads) = payloads.split_last().expect("a payload");
    assert_eq!(*done, "[DONE]");
    let mut answer = Answer { content: String::new(), calls: Vec::new(), finish_reason: None, error: None };
    let mut usage_chunk = None;
    for (i, payload) in payloads.iter().enumerate() {
        let is_last = i + 1 == payloads.len();
        let value = read(payload);
        if let Some(error) = value.error {
            assert!(is_last, "an error ends the stream: {payload}");
            assert!(!error.message.is_empty() && !error.kind.is_empty(), "{payload}");
            answer.error = Some(payload.to_string());
            continue;
        }
        let choices = value.choices.expect("choices");
        assert!(answer.finish_reason.is_none() || choices.is_empty(), "only usage after the finish: {payload}");
        let [choice] = choices.as_slice() else {
            assert!(choices.is_empty() && is_last && include_usage && answer.finish_reason.is_some(), "{payload}");
            usage_chunk = Some(value.usage.expect("the usage chunk's usage").total_tokens);
            continue;
        };
        let delta = &choice.delta;
        assert!(delta.role.is_none(), "the role only opens: {payload}");
        if let Some(reason) = choice.finish_reason.as_deref() {
            assert!(["stop", "length", "tool_calls"].contains(&reason), "{payload}");
            assert!(delta.content.is_none() && delta.tool_calls.is_none(), "{payload}");
            answer.finish_reason = Some(reason.to_string());
            continue;
        }
        if let Some(content) = &delta.content {
            assert!(!content.is_empty(), "no empty content: {payload}");
            answer.content.push_str(content);
        }
        if let Some(calls) = &delta.tool_calls {
            let [call] = calls.as_slice() else { panic!("one call per delta: {payload}") };
            let arguments = &call.function.arguments;
            if call.index == answer.calls.len() {
                assert!(
                    call.id.as_deref().is_some_and(|id| !id.is_empty()) && call.kind.as_deref() == Some("function")
                );
                let name = call.function.name.as_deref().expect("a new call's name");
                answer.calls.push((name.to_string(), arguments.to_string()));
            } else {
                assert!(call.index + 1 == answer.calls.len(), "calls stream one after the other: {payload}");
                assert!(call.id.is_none() && call.function.name.is_none(), "{payload}");
                answer.calls[call.index].1.push_str(arguments);
            }
        }
    }
    let stopped = ending == Ending::Finished(FinishReason::Stop);
    match answer.finish_reason.as_deref() {
        None => assert!(answer.error.is_some(), "a stream ends with a finish reason or an error"),
        Some(reason) => {
            assert!(answer.error.is_none() && matches!(ending, Ending::Finished(_)));
            assert_eq!(reason == "tool_calls", stopped && !answer.calls.is_empty(), "finish reason {reason}");
            assert_eq!(reason == "length", !stopped);
            assert_eq!(usage_chunk.is_some(), include_usage, "usage when asked");
            if let Some(total) = usage_chunk {
                assert_eq!(total, usage().prompt_tokens + usage().completion_tokens);
            }
            if stopped {
                for (name, arguments) in &answer.calls {
                    common::tools().check_arguments(name, arguments).expect("stopped calls match their tools");
                }
                if with_schema && answer.calls.is_empty() {
                    schema().check(&answer.content).expect("a stopped JSON reply matches the schema");
                }
            }
        }
    }
    answer
}
