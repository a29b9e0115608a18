//! Every tool-call stream parser with arbitrary model text and arbitrary chunking.
//!
//! Input: byte 0 picks the format (`common::format`); byte 1: bit 0 = a reply that opens with a
//! JSON object is a call (`auto` without a response format), bit 1 = the parser knows the tools'
//! argument names, all bits seed the chunking (`common::chunks`); the rest is the model's text
//! (lossy UTF-8).
//!
//! Checks: the same content and calls whether the text comes whole or in random pieces (one
//! char at a time for one seed in eight); the streamed pieces concatenate to the calls; calls
//! start in order, once each; a call already reported only grows (same name, arguments
//! extended).

#![no_main]

mod common;

use firstword::chat::tools::{ParsedCall, ParsedPiece, ToolCallParser};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let [format, options, text @ ..] = data else { return };
    let text = String::from_utf8_lossy(text);
    let tools = common::tools();
    let parser = || {
        let mut parser = ToolCallParser::new(common::format(*format));
        if options & 1 != 0 {
            parser = parser.with_json_object_calls();
        }
        if options & 2 != 0 {
            parser = parser.with_tools(tools);
        }
        parser
    };
    let whole = parse(parser(), &[&text]);
    assert_eq!(parse(parser(), &common::chunks(&text, u64::from(*options))), whole, "random pieces");
});

/// Content and calls of `pieces` pushed in order, checking the streamed pieces along the way.
fn parse(mut parser: ToolCallParser, pieces: &[&str]) -> (String, Vec<ParsedCall>) {
    let mut all = Vec::new();
    let mut seen: Vec<ParsedCall> = Vec::new();
    for piece in pieces {
        all.extend(parser.push(piece));
        let now = parser.calls();
        assert!(now.len() >= seen.len(), "calls are never taken back");
        for (before, after) in seen.iter().zip(now) {
            assert_eq!(before.name, after.name, "a call keeps its name");
            assert!(after.arguments.starts_with(&before.arguments), "arguments only grow: {before:?} -> {after:?}");
            assert!(!before.complete || after == before, "a complete call no longer changes");
        }
        seen = now.to_vec();
    }
    let (last, calls) = parser.finish();
    all.extend(last);
    let mut content = String::new();
    let mut streamed: Vec<(String, String)> = Vec::new();
    for piece in all {
        match piece {
            ParsedPiece::Content(text) => content.push_str(&text),
            ParsedPiece::CallStart { index, name } => {
                assert_eq!(index, streamed.len(), "calls start in order, once each");
                streamed.push((name, String::new()));
            }
            ParsedPiece::Arguments { index, text } => {
                assert!(index < streamed.len(), "arguments of a call that started");
                streamed[index].1.push_str(&text);
            }
        }
    }
    let from_calls: Vec<(String, String)> = calls.iter().map(|c| (c.name.clone(), c.arguments.clone())).collect();
    assert_eq!(streamed, from_calls, "streamed pieces concatenate to the calls");
    (content, calls)
}
