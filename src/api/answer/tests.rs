//! The shaper on scripted model output: plain text, streamed and held calls, repeated calls
//! cut, and the replies that are no answer (422).

use super::*;
use crate::api::convert::OutputPlan;
use crate::api::tests::{call_text, calls_plan, text_plan, timer_tool};
use crate::chat::tools::{ArgumentsError, ReplyError, ToolDefinition, ToolFormat, ToolSet};

/// Indexes of the calls that `deltas` start (their first delta carries the name).
fn started_calls(deltas: &[Delta]) -> Vec<usize> {
    deltas
        .iter()
        .filter_map(|d| d.tool_calls.as_ref())
        .filter(|[call]| call.function.name.is_some())
        .map(|[call]| call.index)
        .collect()
}

fn content(deltas: &[Delta]) -> String {
    deltas.iter().filter_map(|d| d.content.as_deref()).collect()
}

#[test]
fn plain_text_passes_through_as_content() {
    let mut shaper = AnswerShaper::new(text_plan(None), false);
    let shaped = shaper.text("Hello".into());
    assert_eq!((content(&shaped.deltas), shaped.done), ("Hello".to_string(), false));
    assert!(shaper.text(String::new()).deltas.is_empty(), "empty text sends nothing");
    let ending = shaper.finish(FinishReason::Stop).expect("an answer");
    assert_eq!((ending.finish_reason, ending.content.as_deref()), ("stop", Some("Hello")));
    assert!(ending.calls.is_empty());
}

#[test]
fn a_call_streams_its_name_then_its_arguments() {
    let mut shaper = AnswerShaper::new(calls_plan(), false);
    let shaped = shaper.text(format!("Sure. {}", call_text("set_timer", "{\"minutes\": 2}")));
    assert_eq!(content(&shaped.deltas), "Sure.", "the space before the call is layout");
    assert_eq!(started_calls(&shaped.deltas), [0]);
    let ending = shaper.finish(FinishReason::Stop).expect("an answer");
    assert_eq!((ending.finish_reason, ending.content.as_deref()), ("tool_calls", Some("Sure.")));
    assert_eq!(ending.calls[0].function.arguments, "{\"minutes\": 2}");
    assert!(ending.calls[0].id.starts_with("call_"), "{}", ending.calls[0].id);
}

#[test]
fn a_repeated_call_is_dropped_and_ends_the_reply() {
    let mut shaper = AnswerShaper::new(calls_plan(), false);
    let first = shaper.text(call_text("set_timer", "{\"minutes\": 2}"));
    assert!(!first.done);
    // The same arguments written with other spacing are the same call.
    let repeat = shaper.text(format!("\n{}", call_text("set_timer", "{\"minutes\":2}")));
    assert!(repeat.done, "a repetition ends generation");
    assert!(started_calls(&repeat.deltas).is_empty(), "the repetition is never sent");
    assert!(shaper.text(call_text("set_timer", "{\"minutes\": 9}")).deltas.is_empty(), "nothing after the cut");
    let ending = shaper.finish(FinishReason::Stop).expect("an answer");
    assert_eq!((ending.finish_reason, ending.calls.len()), ("tool_calls", 1));
}

#[test]
fn a_second_call_to_a_function_is_held_until_complete_then_sent() {
    let mut shaper = AnswerShaper::new(calls_plan(), false);
    let _ = shaper.text(call_text("set_timer", "{\"minutes\": 2}"));
    let second = call_text("set_timer", "{\"minutes\": 3}");
    let (opening, rest) = second.split_at(second.find("3").expect("the argument"));
    let held = shaper.text(format!("\n{opening}"));
    assert!(held.deltas.iter().all(|d| d.tool_calls.is_none()), "held while it may be a repeat");
    let released = shaper.text(rest.to_string());
    assert_eq!((started_calls(&released.deltas), released.done), (vec![1], false));
    let ending = shaper.finish(FinishReason::Stop).expect("an answer");
    let arguments: Vec<&str> = ending.calls.iter().map(|c| c.function.arguments.as_str()).collect();
    assert_eq!(arguments, ["{\"minutes\": 2}", "{\"minutes\": 3}"]);
    assert_ne!(ending.calls[0].id, ending.calls[1].id);
}

#[test]
fn a_held_call_abandoned_before_the_next_one_is_sent_in_order() {
    // Found by fuzz/fuzz_targets/sse_frame.rs: a held call whose JSON broke off (possible only
    // without a grammar) was replaced by the next call, so the stream went from call 0 to 2.
    let mut shaper = AnswerShaper::new(calls_plan(), false);
    let text = format!(
        "{}\n<tool_call>\n{{\"name\": \"set_timer\" x\n{}",
        call_text("set_timer", "{\"minutes\": 2}"),
        call_text("set_timer", "{\"minutes\": 3}")
    );
    let shaped = shaper.text(text);
    assert_eq!(started_calls(&shaped.deltas), [0, 1, 2], "every call opens, in order");
}

#[test]
fn nothing_follows_a_repetition_found_when_the_next_call_starts() {
    // Found by fuzz/fuzz_targets/sse_frame.rs: the held call turned out to repeat an earlier
    // one as the next call started, and that next call was still sent after the cut.
    let now =
        ToolDefinition { name: "now".into(), description: None, parameters: serde_json::json!({"type": "object"}) };
    let tools = ToolSet::new(vec![timer_tool(), now]).expect("tools");
    let plan = OutputPlan { tools: Some(tools), ..calls_plan() };
    let mut shaper = AnswerShaper::new(plan, false);
    let call = call_text("set_timer", "{\"minutes\": 2}");
    let shaped = shaper.text(format!("{call}\n{call}\n{}", call_text("now", "{}")));
    assert_eq!((started_calls(&shaped.deltas), shaped.done), (vec![0], true));
    let ending = shaper.finish(FinishReason::Stop).expect("an answer");
    assert_eq!((ending.calls.len(), started_calls(&ending.deltas)), (1, vec![]));
}

#[test]
fn a_held_call_cut_by_the_end_of_the_reply_is_sent_at_the_finish() {
    let mut shaper = AnswerShaper::new(calls_plan(), false);
    let _ = shaper.text(call_text("set_timer", "{\"minutes\": 2}"));
    let second = shaper.text("\n<tool_call>\n{\"name\": \"set_timer\", \"arguments\": {\"minutes\": 3".into());
    assert!(started_calls(&second.deltas).is_empty());
    let ending = shaper.finish(FinishReason::Length).expect("an answer at the token limit");
    assert_eq!(started_calls(&ending.deltas), [1]);
    assert_eq!((ending.finish_reason, ending.calls.len()), ("length", 1), "the cut call is no call");
}

#[test]
fn a_call_cut_by_a_stop_is_refused_not_returned() {
    let mut shaper = AnswerShaper::new(calls_plan(), false);
    let _ = shaper.text("<tool_call>\n{\"name\": \"set_timer\", \"argu".into());
    let error = shaper.finish(FinishReason::Stop).err().expect("a cut call is no answer");
    assert!(matches!(&error, OutputError::CutCall { name, .. } if name == "set_timer"), "{error}");
    // At the token limit the answer says "length" and carries no cut call (OpenAI's finish
    // reason; a call with arguments `{"min` is none a client can run).
    for cut in [
        "<tool_call>\n{\"name\": \"set_timer\", \"arguments\": {\"min",
        "<tool_call>\n{\"name\": \"set_timer\"",
        "<tool_call>\n{\"",
    ] {
        let mut shaper = AnswerShaper::new(calls_plan(), false);
        let _ = shaper.text(cut.into());
        let ending = shaper.finish(FinishReason::Length).expect("an answer");
        assert_eq!((ending.finish_reason, ending.calls.len()), ("length", 0), "{cut}");
    }
}

#[test]
fn arguments_that_break_the_schema_are_refused() {
    let mut shaper = AnswerShaper::new(calls_plan(), false);
    let _ = shaper.text(call_text("set_timer", "{\"minutes\": \"two\"}"));
    let error = shaper.finish(FinishReason::Stop).err().expect("a string is no integer");
    assert!(matches!(error, OutputError::Arguments(ArgumentsError::SchemaMismatch { .. })), "{error}");
}

#[test]
fn a_json_reply_must_match_the_response_format() {
    let schema = serde_json::json!({"type": "object", "required": ["n"]});
    let reply = |text: &str, reason| {
        let mut shaper = AnswerShaper::new(text_plan(Some(schema.clone())), false);
        let _ = shaper.text(text.into());
        shaper.finish(reason)
    };
    assert!(matches!(
        reply("{\"m\": 1}", FinishReason::Stop),
        Err(OutputError::Reply(ReplyError::SchemaMismatch { .. }))
    ));
    assert!(matches!(reply("{\"n\": ", FinishReason::Stop), Err(OutputError::Reply(ReplyError::NotJson { .. }))));
    assert_eq!(reply("{\"n\": 1}", FinishReason::Stop).expect("a match").finish_reason, "stop");
    // Cut by the token limit, the reply is returned as it is.
    assert_eq!(reply("{\"n\": ", FinishReason::Length).expect("cut").finish_reason, "length");
}

#[test]
fn a_json_object_opening_an_auto_reply_is_a_call() {
    let mut shaper = AnswerShaper::new(calls_plan(), false);
    let shaped = shaper.text(" {\"name\": \"set_timer\", \"arguments\": {\"minutes\": 2}}".into());
    assert!(shaped.deltas.iter().all(|d| d.content.is_none()), "no content");
    let ending = shaper.finish(FinishReason::Stop).expect("an answer");
    assert_eq!((ending.finish_reason, ending.content), ("tool_calls", None));
    assert_eq!(ending.calls[0].function.arguments, "{\"minutes\": 2}");
}

#[test]
fn whitespace_beside_a_call_is_never_content() {
    for text in [
        format!("\n\n{}", call_text("set_timer", "{\"minutes\": 2}")),
        format!("{}\n \n", call_text("set_timer", "{\"minutes\": 2}")),
    ] {
        let mut shaper = AnswerShaper::new(calls_plan(), false);
        let shaped = shaper.text(text.clone());
        assert_eq!(content(&shaped.deltas), "", "{text:?}");
        let ending = shaper.finish(FinishReason::Stop).expect("an answer");
        assert!(content(&ending.deltas).is_empty(), "{text:?}");
        assert_eq!((ending.finish_reason, ending.content), ("tool_calls", None), "{text:?}");
    }
}

#[test]
fn whitespace_after_reasoning_beside_a_call_is_never_content() {
    let reasoning = crate::chat::ReasoningFormat::detect("<think>\n{{ x }}</think>");
    assert!(reasoning.is_some(), "a reasoning format");
    let plan = OutputPlan { reasoning, ..calls_plan() };
    let mut shaper = AnswerShaper::new(plan, true);
    let shaped = shaper.text(format!("Plan.\n</think>\n\n{}\n", call_text("set_timer", "{\"minutes\": 2}")));
    assert_eq!(content(&shaped.deltas), "");
    let ending = shaper.finish(FinishReason::Stop).expect("an answer");
    assert!(content(&ending.deltas).is_empty());
    assert_eq!(
        (ending.finish_reason, ending.content, ending.reasoning.as_deref()),
        ("tool_calls", None, Some("Plan."))
    );
}

#[test]
fn a_reply_that_starts_inside_the_opener_loses_its_text_recipient() {
    let format = ToolFormat::functionary_v3_2();
    let with_tools = OutputPlan { format: format.clone(), ..calls_plan() };
    let without = OutputPlan { format, ..text_plan(None) };
    for plan in [with_tools, without] {
        let mut shaper = AnswerShaper::new(plan, false);
        let mut streamed = content(&shaper.text("al".into()).deltas);
        streamed.push_str(&content(&shaper.text("l\nHel".into()).deltas));
        streamed.push_str(&content(&shaper.text("lo".into()).deltas));
        let ending = shaper.finish(FinishReason::Stop).expect("an answer");
        streamed.push_str(&content(&ending.deltas));
        assert_eq!((streamed.as_str(), ending.content.as_deref()), ("Hello", Some("Hello")));
    }
    // With tools, the reply may be a call.
    let mut shaper = AnswerShaper::new(OutputPlan { format: ToolFormat::functionary_v3_2(), ..calls_plan() }, false);
    let _ = shaper.text("set_timer\n{\"minutes\": 2}".into());
    let ending = shaper.finish(FinishReason::Stop).expect("an answer");
    assert_eq!((ending.finish_reason, ending.content, ending.calls.len()), ("tool_calls", None, 1));
}
