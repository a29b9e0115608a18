//! The SSE framing driven by scripted engine events, payload by payload.

use serde_json::Value;

use super::*;
use crate::api::tests::{call_text, calls_plan, finished, text_plan, USAGE};
use crate::api::OutputError;
use crate::engine::{EngineError, FinishReason};

fn framer(plan: crate::api::convert::OutputPlan, include_usage: bool) -> SseFramer {
    let meta = ResponseMeta { id: "chatcmpl-test".into(), model: "test-model".into(), created: 7 };
    SseFramer::new(meta, AnswerShaper::new(plan, false), include_usage, false)
}

fn parse(data: &str) -> Value {
    serde_json::from_str(data).unwrap_or_else(|e| panic!("{data}: {e}"))
}

/// Pushes `events` in order and returns every payload, checking the stream ends exactly once,
/// after the last event, with `[DONE]`.
fn run(mut framer: SseFramer, events: Vec<Option<Event>>) -> Vec<String> {
    let mut data = vec![framer.opening()];
    let count = events.len();
    for (i, event) in events.into_iter().enumerate() {
        let frames = framer.push(event);
        assert_eq!(frames.done, i + 1 == count, "done only after the last event");
        data.extend(frames.data);
    }
    assert_eq!(data.last().map(String::as_str), Some(DONE));
    data
}

fn text(text: &str) -> Option<Event> {
    Some(Event::Text(text.into()))
}

fn started() -> Option<Event> {
    Some(Event::Started { prompt_tokens: 10, cached_tokens: 4, in_reasoning: false })
}

#[test]
fn the_stream_opens_with_the_role_and_no_content() {
    let opening = parse(&framer(text_plan(None), false).opening());
    assert_eq!(opening["object"], "chat.completion.chunk");
    assert_eq!(
        (&opening["id"], &opening["model"], &opening["created"]),
        (&"chatcmpl-test".into(), &"test-model".into(), &7.into())
    );
    assert_eq!(opening["choices"][0]["delta"], serde_json::json!({"role": "assistant"}));
    assert!(opening["choices"][0]["finish_reason"].is_null());
}

#[test]
fn text_streams_as_content_then_a_finish_chunk_then_done() {
    let data = run(
        framer(text_plan(None), false),
        vec![started(), text("Hel"), text("lo"), Some(finished(FinishReason::Stop))],
    );
    assert_eq!(data.len(), 5, "{data:?}");
    let contents: Vec<Value> = data[1..3].iter().map(|d| parse(d)["choices"][0]["delta"]["content"].clone()).collect();
    assert_eq!(contents, ["Hel", "lo"]);
    let last = parse(&data[3]);
    assert_eq!(last["choices"][0]["finish_reason"], "stop");
    assert_eq!(last["choices"][0]["delta"], serde_json::json!({}));
    assert_eq!(last["timings"]["predicted_n"], USAGE.completion_tokens);
    assert!(last.get("usage").is_none(), "usage only when asked");
}

#[test]
fn include_usage_adds_a_usage_chunk_without_choices_before_done() {
    let data = run(framer(text_plan(None), true), vec![text("Hi"), Some(finished(FinishReason::Length))]);
    assert_eq!(parse(&data[2])["choices"][0]["finish_reason"], "length");
    let usage = parse(&data[3]);
    assert_eq!(usage["choices"], serde_json::json!([]));
    assert_eq!(usage["usage"]["total_tokens"], USAGE.prompt_tokens + USAGE.completion_tokens);
    assert_eq!(usage["usage"]["prompt_tokens_details"]["cached_tokens"], USAGE.cached_tokens);
    assert_eq!(data.len(), 5, "{data:?}");
}

#[test]
fn calls_stream_as_tool_call_deltas_and_finish_with_tool_calls() {
    let call = call_text("set_timer", "{\"minutes\": 2}");
    let data = run(framer(calls_plan(), false), vec![text(&call), Some(finished(FinishReason::Stop))]);
    let chunks: Vec<Value> = data[1..data.len() - 1].iter().map(|d| parse(d)).collect();
    let opening = &chunks[0]["choices"][0]["delta"]["tool_calls"][0];
    assert_eq!(
        (&opening["index"], &opening["type"], &opening["function"]["name"]),
        (&0.into(), &"function".into(), &"set_timer".into())
    );
    assert!(opening["id"].as_str().is_some_and(|id| id.starts_with("call_")), "{opening}");
    let arguments: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["tool_calls"][0]["function"]["arguments"].as_str())
        .collect();
    assert_eq!(arguments, "{\"minutes\": 2}");
    assert!(chunks.iter().all(|c| c["choices"][0]["delta"].get("content").is_none()), "no content");
    assert_eq!(chunks.last().expect("a finish chunk")["choices"][0]["finish_reason"], "tool_calls");
}

#[test]
fn a_repeated_call_asks_the_engine_to_finish_now() {
    let mut framer = framer(calls_plan(), false);
    assert!(!framer.push(text(&call_text("set_timer", "{\"minutes\": 2}"))).finish_now);
    let repeat = framer.push(text(&call_text("set_timer", "{\"minutes\": 2}")));
    assert!(repeat.finish_now && !repeat.done);
    assert!(repeat.data.is_empty(), "the repetition is not sent: {:?}", repeat.data);
}

#[test]
fn a_failure_mid_stream_is_an_error_event_then_done() {
    let data = run(framer(text_plan(None), false), vec![text("Hi"), Some(Event::Failed(EngineError::ShuttingDown))]);
    let error = parse(&data[2]);
    assert_eq!(error["error"]["code"], "shutting_down");
    assert_eq!(error["error"]["type"], "unavailable_error");
    assert_eq!(data.len(), 4, "{data:?}");
}

#[test]
fn events_that_end_without_a_finish_are_an_error_event_then_done() {
    let data = run(framer(text_plan(None), false), vec![text("Hi"), None]);
    assert_eq!(data[2], ApiError::EngineStopped.to_json());
}

#[test]
fn an_unusable_reply_at_the_finish_is_an_error_event_then_done() {
    let data = run(
        framer(calls_plan(), true),
        vec![text("<tool_call>\n{\"name\": \"set_timer\""), Some(finished(FinishReason::Stop))],
    );
    let error = parse(&data[data.len() - 2]);
    assert_eq!(error["error"]["code"], "invalid_model_output");
    let expected = OutputError::CutCall { name: "set_timer".into(), arguments: String::new() };
    assert_eq!(error["error"]["message"], expected.to_string());
    assert!(data.iter().all(|d| !d.contains("\"usage\"")), "no usage after a failure");
}
