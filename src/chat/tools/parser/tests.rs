//! The streaming parser on literal model output, split at every position.

use super::*;

/// Parses `output` fed in two pieces split at every character boundary (and in one piece),
/// checking each split gives the same content, calls and argument text.
fn parse_every_split(format: ToolFormat, output: &str) -> (String, Vec<ParsedCall>) {
    parse_every_split_with(&|| ToolCallParser::new(format.clone()), output)
}

fn parse_every_split_with(parser: &dyn Fn() -> ToolCallParser, output: &str) -> (String, Vec<ParsedCall>) {
    let whole = parse_pieces_with(parser(), &[output]);
    for (at, _) in output.char_indices().skip(1) {
        let split = parse_pieces_with(parser(), &[&output[..at], &output[at..]]);
        assert_eq!(split, whole, "split at byte {at} of {output:?}");
    }
    let chars: Vec<String> = output.chars().map(String::from).collect();
    let by_char: Vec<&str> = chars.iter().map(String::as_str).collect();
    assert_eq!(parse_pieces_with(parser(), &by_char), whole, "one character at a time");
    whole
}

fn parse_in_pieces(format: ToolFormat, pieces: &[&str]) -> (String, Vec<ParsedCall>) {
    parse_pieces_with(ToolCallParser::new(format), pieces)
}

fn parse_pieces_with(mut parser: ToolCallParser, pieces: &[&str]) -> (String, Vec<ParsedCall>) {
    let mut all = Vec::new();
    for piece in pieces {
        all.extend(parser.push(piece));
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
            ParsedPiece::Arguments { index, text } => streamed[index].1.push_str(&text),
        }
    }
    let from_calls: Vec<(String, String)> = calls.iter().map(|c| (c.name.clone(), c.arguments.clone())).collect();
    assert_eq!(streamed, from_calls, "streamed pieces concatenate to the calls");
    (content, calls)
}

fn call(name: &str, arguments: &str) -> ParsedCall {
    ParsedCall { name: name.into(), arguments: arguments.into(), complete: true }
}

#[test]
fn hermes_text_then_two_calls() {
    let output = "Let me check. <tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Zürich\", \"note\": \"a \\\"}\\\" b\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"set_timer\", \"arguments\": {\"minutes\": 5}}\n</tool_call>";
    let (content, calls) = parse_every_split(ToolFormat::hermes(), output);
    assert_eq!(content, "Let me check.");
    assert_eq!(
        calls,
        vec![
            call("get_weather", "{\"city\": \"Zürich\", \"note\": \"a \\\"}\\\" b\"}"),
            call("set_timer", "{\"minutes\": 5}")
        ]
    );
}

#[test]
fn generic_plain_text_passes_through_whole() {
    let output = "No tools needed: 3 < 4 and <b>bold</b> <tool_ is not a call.";
    let (content, calls) = parse_every_split(ToolFormat::generic(), output);
    assert_eq!(content, output);
    assert!(calls.is_empty());
}

#[test]
fn arguments_before_the_name_are_held_until_the_name() {
    let output = "<tool_call>{\"arguments\": {\"a\": [1, {\"b\": null}]}, \"name\": \"f\"}</tool_call>";
    let (content, calls) = parse_every_split(ToolFormat::hermes(), output);
    assert_eq!(content, "");
    assert_eq!(calls, vec![call("f", "{\"a\": [1, {\"b\": null}]}")]);
}

#[test]
fn llama3_bare_json_and_python_tag() {
    let output = "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}";
    let (content, calls) = parse_every_split(ToolFormat::llama3(), output);
    assert_eq!((content.as_str(), calls), ("", vec![call("get_weather", "{\"city\": \"Paris\"}")]));
    let tagged = "<|python_tag|>{\"name\": \"set_timer\", \"parameters\": {\"minutes\": 3}}";
    let (content, calls) = parse_every_split(ToolFormat::llama3(), tagged);
    assert_eq!((content.as_str(), calls), ("", vec![call("set_timer", "{\"minutes\": 3}")]));
}

#[test]
fn llama3_bare_json_counts_only_where_it_opens_the_reply() {
    let output = " \n{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}";
    let (content, calls) = parse_every_split(ToolFormat::llama3(), output);
    assert_eq!((content.as_str(), calls), ("", vec![call("get_weather", "{\"city\": \"Paris\"}")]));
    let inside = "Call it like this: {\"name\": \"get_weather\", \"parameters\": {}} and done.";
    let (content, calls) = parse_every_split(ToolFormat::llama3(), inside);
    assert_eq!((content.as_str(), calls), (inside, vec![]), "a call inside text is text");
    let object = "{\"city\": \"Paris\"}";
    assert_eq!(parse_every_split(ToolFormat::llama3(), object), (object.to_string(), vec![]));
}

#[test]
fn a_json_object_opening_the_reply_is_a_call_in_every_format() {
    let bare = "{\"name\": \"set_timer\", \"arguments\": {\"minutes\": 2}}";
    for format in [
        ToolFormat::generic(),
        ToolFormat::hermes(),
        ToolFormat::mistral(),
        ToolFormat::gemma4(),
        ToolFormat::function_gemma(),
    ] {
        let parser = || ToolCallParser::new(format.clone()).with_json_object_calls();
        let (content, calls) = parse_every_split_with(&parser, &format!("\n {bare}"));
        assert_eq!((content.as_str(), calls), ("", vec![call("set_timer", "{\"minutes\": 2}")]), "{format:?}");
        let text = format!("Sure: {bare}");
        assert_eq!(parse_every_split_with(&parser, &text), (text.clone(), vec![]), "{format:?}: inside text");
        // Without the option (a response format is given), a JSON reply is content.
        assert_eq!(parse_every_split(format.clone(), bare), (bare.to_string(), vec![]), "{format:?}");
    }
    let parser = || ToolCallParser::new(ToolFormat::llama3()).with_json_object_calls();
    let llama = "{\"name\": \"set_timer\", \"parameters\": {\"minutes\": 2}}";
    assert_eq!(parse_every_split_with(&parser, llama), (String::new(), vec![call("set_timer", "{\"minutes\": 2}")]));
    let (content, _) = parse_pieces_with(parser(), &["  "]);
    assert_eq!(content, "  ", "a reply of whitespace is content");
}

#[test]
fn gemma_keys_may_contain_colons() {
    let tools = crate::chat::tools::ToolSet::new(vec![crate::chat::tools::ToolDefinition {
        name: "f".into(),
        description: None,
        parameters: serde_json::json!({"type": "object", "properties": {
            "a": {"type": "integer"}, "a:b": {"type": "string"}, "c": {"type": "object"}}}),
    }])
    .expect("tools");
    let parser = || ToolCallParser::new(ToolFormat::gemma4()).with_tools(&tools);
    let output = "<|tool_call>call:f{a:b:<|\"|>x:y<|\"|>,a:1,c:{d:2}}<tool_call|>";
    let (content, calls) = parse_every_split_with(&parser, output);
    assert_eq!(content, "");
    assert_eq!(calls, vec![call("f", "{\"a:b\":\"x:y\",\"a\":1,\"c\":{\"d\":2}}")]);
    let value: serde_json::Value = serde_json::from_str(&calls[0].arguments).expect("JSON");
    assert_eq!(value["a:b"], "x:y");
}

#[test]
fn mistral_list_with_ids_skipped() {
    let output = "[TOOL_CALLS][{\"name\": \"a\", \"arguments\": {\"x\": 1}, \"id\": \"abc123def\"}, {\"name\": \"b\", \"arguments\": {}}]";
    let (content, calls) = parse_every_split(ToolFormat::mistral(), output);
    assert_eq!(content, "");
    assert_eq!(calls, vec![call("a", "{\"x\": 1}"), call("b", "{}")]);
}

#[test]
fn gemma4_calls_become_json() {
    let output = "Sure.<|tool_call>call:get_weather{city:<|\"|>São \"Paulo\"<|\"|>,days:3,flags:[true,null],opts:{deep:-1.5e2}}<tool_call|>";
    let (content, calls) = parse_every_split(ToolFormat::gemma4(), output);
    assert_eq!(content, "Sure.");
    assert_eq!(
        calls,
        vec![call(
            "get_weather",
            "{\"city\":\"São \\\"Paulo\\\"\",\"days\":3,\"flags\":[true,null],\"opts\":{\"deep\":-1.5e2}}"
        )]
    );
    let value: serde_json::Value = serde_json::from_str(&calls[0].arguments).expect("valid JSON");
    assert_eq!(value["city"], "São \"Paulo\"");
}

#[test]
fn function_gemma_with_escape_quotes_and_empty_arguments() {
    let output = "<start_function_call>call:set_timer{minutes:<escape>5<escape>}<end_function_call><start_function_call>call:stop{}<end_function_call>";
    let (content, calls) = parse_every_split(ToolFormat::function_gemma(), output);
    assert_eq!(content, "");
    assert_eq!(calls, vec![call("set_timer", "{\"minutes\":\"5\"}"), call("stop", "{}")]);
}

#[test]
fn an_unfinished_call_is_reported_incomplete() {
    let mut parser = ToolCallParser::new(ToolFormat::hermes());
    let pieces = parser.push("<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": ");
    assert_eq!(
        pieces,
        vec![
            ParsedPiece::CallStart { index: 0, name: "f".into() },
            ParsedPiece::Arguments { index: 0, text: "{\"x\": ".into() }
        ]
    );
    let (_, calls) = parser.finish();
    assert_eq!(calls, vec![ParsedCall { name: "f".into(), arguments: "{\"x\": ".into(), complete: false }]);
}

#[test]
fn an_unfinished_closer_is_not_content() {
    let (content, calls) =
        parse_in_pieces(ToolFormat::generic(), &["<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_c"]);
    assert_eq!(content, "");
    assert_eq!(calls, vec![call("f", "{}")]);
    let (content, _) = parse_in_pieces(
        ToolFormat::generic(),
        &["<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>\n<tool"],
    );
    assert_eq!(content, "", "the start of a next call is not content");
    let (content, _) = parse_in_pieces(ToolFormat::generic(), &["Is 3 <"]);
    assert_eq!(content, "Is 3 <", "without calls, a trailing '<' is text");
}

#[test]
fn the_name_is_reported_before_the_arguments_are_written() {
    let mut parser = ToolCallParser::new(ToolFormat::generic());
    assert_eq!(
        parser.push("<tool_call>\n{\"name\": \"get_weather\""),
        vec![ParsedPiece::CallStart { index: 0, name: "get_weather".into() }]
    );
}

#[test]
fn malformed_call_without_grammar_falls_back_to_text() {
    let (content, calls) = parse_in_pieces(ToolFormat::hermes(), &["<tool_call>oops</tool_call> done"]);
    assert!(calls.is_empty());
    assert!(!content.contains("<tool_call>"), "{content}");
}

fn weather_tools() -> crate::chat::tools::ToolSet {
    crate::chat::tools::ToolSet::new(vec![crate::chat::tools::ToolDefinition {
        name: "get_weather".into(),
        description: None,
        parameters: serde_json::json!({"type": "object", "properties": {
            "city": {"type": "string"}, "days": {"type": "integer"}, "alerts": {"type": "boolean"}}}),
    }])
    .expect("tools")
}

#[test]
fn qwen3_coder_parameters_become_json() {
    let tools = weather_tools();
    let parser = || ToolCallParser::new(ToolFormat::qwen3_coder()).with_tools(&tools);
    let output = "Let me look.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nSão <Paulo>\n</parameter>\n<parameter=days>\n3\n</parameter>\n<parameter=alerts>\nTrue\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=get_weather>\n</function>\n</tool_call>";
    let (content, calls) = parse_every_split_with(&parser, output);
    assert_eq!(content, "Let me look.");
    assert_eq!(
        calls,
        vec![
            call("get_weather", "{\"city\": \"São <Paulo>\", \"days\": 3, \"alerts\": true}"),
            call("get_weather", "{}")
        ]
    );
}

#[test]
fn deepseek_and_kimi_names_then_json() {
    let output = "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"city\": \"Oslo\"}<｜tool▁call▁end｜><｜tool▁call▁begin｜>set_timer<｜tool▁sep｜>{\"minutes\": 2}<｜tool▁call▁end｜><｜tool▁calls▁end｜>";
    let (content, calls) = parse_every_split(ToolFormat::deepseek_v3(), output);
    assert_eq!(
        (content.as_str(), calls),
        ("", vec![call("get_weather", "{\"city\": \"Oslo\"}"), call("set_timer", "{\"minutes\": 2}")])
    );
}

#[test]
fn lfm2_pythonic_calls_become_json() {
    let output = "<|tool_call_start|>[get_weather(city=\"New, \\\"York\\\"\", days=2), set_timer(minutes=5)]<|tool_call_end|>Done.";
    let (content, calls) = parse_every_split(ToolFormat::lfm2(), output);
    assert_eq!(content, "Done.");
    assert_eq!(
        calls,
        vec![
            call("get_weather", "{\"city\": \"New, \\\"York\\\"\", \"days\": 2}"),
            call("set_timer", "{\"minutes\": 5}")
        ]
    );
}

#[test]
fn functionary_v3_2_replies_start_inside_the_opener() {
    let format = ToolFormat::functionary_v3_2();
    // Text: the recipient `all` is no content.
    let (content, calls) = parse_every_split(format.clone(), "all\nIt is sunny in Paris.");
    assert_eq!((content.as_str(), calls.len()), ("It is sunny in Paris.", 0));
    // One call, then two.
    let one = "get_weather\n{\"city\": \"Paris\"}";
    assert_eq!(
        parse_every_split(format.clone(), one),
        (String::new(), vec![call("get_weather", "{\"city\": \"Paris\"}")])
    );
    let two = "get_weather\n{\"city\": \"Paris\"}>>>set_timer\n{\"minutes\": 10}";
    let (content, calls) = parse_every_split(format.clone(), two);
    assert_eq!(content, "");
    assert_eq!(calls, vec![call("get_weather", "{\"city\": \"Paris\"}"), call("set_timer", "{\"minutes\": 10}")]);
    // Text, then a call after another opener.
    let (content, calls) = parse_every_split(format.clone(), "all\nLet me check.>>>get_weather\n{\"city\": \"Paris\"}");
    assert_eq!((content.as_str(), calls), ("Let me check.", vec![call("get_weather", "{\"city\": \"Paris\"}")]));
    // A function whose name begins like the recipient is a call.
    let (content, calls) = parse_every_split(format, "allow_access\n{\"user\": \"a\"}");
    assert_eq!((content.as_str(), calls), ("", vec![call("allow_access", "{\"user\": \"a\"}")]));
}

#[test]
fn functionary_v3_2_calls_cut_by_the_token_limit_are_incomplete() {
    let format = ToolFormat::functionary_v3_2();
    for cut in [
        "get_weather\n{\"city\": \"Par",
        "get_weather\n",
        "get_wea",
        "get_weather\n{\"city\": \"Paris\"}>>>set_timer\n{",
    ] {
        let (content, calls) = parse_in_pieces(format.clone(), &[cut]);
        assert_eq!(content, "", "{cut:?}: no content");
        assert!(calls.last().is_none_or(|c| !c.complete), "{cut:?}: {calls:?}");
    }
    // A reply cut inside the recipient is neither text nor a call.
    assert_eq!(parse_in_pieces(format, &["al"]), (String::new(), Vec::new()));
}

#[test]
fn functionary_v3_2_without_calls_leaves_out_only_the_recipient() {
    let format = ToolFormat::functionary_v3_2();
    let text_only = || ToolCallParser::new(format.clone()).without_calls();
    assert_eq!(parse_every_split_with(&text_only, "all\nHello >>> there"), ("Hello >>> there".into(), Vec::new()));
    assert_eq!(parse_every_split_with(&text_only, "get_weather\n{}"), ("get_weather\n{}".into(), Vec::new()));
    assert_eq!(parse_every_split_with(&text_only, "al"), ("al".into(), Vec::new()));
}
