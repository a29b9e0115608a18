//! Every chat template of llama.cpp's collection (`models/templates`, fetched by
//! `models/templates.py`): the call syntax firstword reads off it is the one docs/tool-formats.md
//! lists; the text the template writes for calls parses back to those calls at every chunking;
//! the request grammar accepts that text and rejects a repeated key, a missing required argument
//! and a cut-off call. Grammars are checked in llama.cpp's own grammar engine over SmolLM2's
//! vocabulary (no weights needed).

mod common;

use std::path::PathBuf;

use firstword::chat::tools::{
    request_grammar, Family, ToolCallParser, ToolChoice, ToolDefinition, ToolFormat, ToolSet,
};
use firstword::chat::{ChatFormat, ChatMessage, ChatTemplate, Role, TemplateSource, ToolCall};
use firstword::Grammar;
use llama_cpp_2::llama_backend::LlamaBackend;
use llama_cpp_2::model::params::LlamaModelParams;
use llama_cpp_2::model::LlamaModel;
use llama_cpp_2::sampling::LlamaSampler;
use llama_cpp_2::token::data::LlamaTokenData;
use llama_cpp_2::token::data_array::LlamaTokenDataArray;
use serde_json::{json, Value};

const DOC: &str = "docs/tool-formats.md";

/// The collection's templates, by file name.
fn templates() -> Vec<(String, String)> {
    let folder = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("models/templates");
    let mut found: Vec<(String, String)> = std::fs::read_dir(&folder)
        .unwrap_or_else(|e| panic!("{}: {e}; run `python3 models/templates.py` (make test does)", folder.display()))
        .filter_map(|entry| {
            let path = entry.ok()?.path();
            (path.extension()? == "jinja").then(|| {
                let name = path.file_stem().unwrap_or_default().to_string_lossy().into_owned();
                (name, std::fs::read_to_string(&path).expect("readable template"))
            })
        })
        .collect();
    found.sort();
    assert!(found.len() >= 70, "the collection holds 71 templates, found {}", found.len());
    found
}

/// A template's chat format; `None` when firstword cannot compile it.
fn chat_format(source: &str) -> Result<ChatFormat, String> {
    let template = ChatTemplate::new(source, "<s>", "</s>").map_err(|e| e.to_string())?;
    Ok(ChatFormat::new(template, TemplateSource::File("t".into())))
}

/// The test tools, every parameter described (Command R+'s template writes each description).
fn test_tools() -> Vec<ToolDefinition> {
    let mut tools = common::tools::tool_definitions();
    for tool in &mut tools {
        for (_, property) in tool.parameters["properties"].as_object_mut().into_iter().flatten() {
            if property.get("description").is_none() {
                property["description"] = json!("A value.");
            }
        }
    }
    tools
}

/// The variables a template reads of its own (firefunction's `functions` and `datetime`), as a
/// client gives them in `chat_template_kwargs`, empty.
fn own_variables(source: &str) -> firstword::chat::TemplateKwargs {
    let template = ChatTemplate::new(source, "<s>", "</s>").expect("compiles");
    template.free_variables().into_iter().map(|name| (name, json!(""))).collect()
}

fn call(id: &str, name: &str, arguments: Value) -> ToolCall {
    ToolCall { id: id.into(), name: name.into(), arguments: firstword_json(&arguments) }
}

/// JSON text as Python's `json.dumps` writes it (what templates print).
fn firstword_json(value: &Value) -> String {
    serde_json::to_string(value).expect("JSON").replace("\":", "\": ").replace(",\"", ", \"")
}

/// The calls of the round trip: one, then two.
fn sample_calls() -> Vec<ToolCall> {
    vec![
        call("call00001", "get_weather", json!({"city": "Paris", "unit": "celsius"})),
        call("call00002", "set_timer", json!({"minutes": 10})),
    ]
}

/// What a template's rendering of an earlier call turn looks like, with the calls' text.
fn conversation(calls: &[ToolCall]) -> Vec<ChatMessage> {
    let mut assistant = ChatMessage::assistant("");
    assistant.tool_calls = calls.to_vec();
    let mut messages = vec![ChatMessage::user("Weather in Paris, and a timer?"), assistant];
    for call in calls {
        let mut result = ChatMessage::new(Role::Tool, "{\"ok\": true}");
        result.tool_call_id = Some(call.id.clone());
        messages.push(result);
    }
    messages
}

/// A template's row of the table, and its format when it has a native one that writes calls
/// exactly as the template does.
fn row(name: &str, source: &str) -> (String, Option<ToolFormat>) {
    let format = match chat_format(source) {
        Ok(format) => format,
        Err(e) => return (format!("| {name} | `generic` | not compiled by firstword yet: {} |", first_line(&e)), None),
    };
    let tool_format = format.tool_format().clone();
    let tools = test_tools();
    let mut rendered = format.render(&conversation(&sample_calls()[..1]), &tools);
    // Variables of the template's own (firefunction's `functions`, `datetime`) come from the
    // client's `chat_template_kwargs`.
    let own = own_variables(source);
    let mut needs = String::new();
    if rendered.is_err() && !own.is_empty() {
        rendered = format.render_with(&conversation(&sample_calls()[..1]), &tools, &own);
        let names: Vec<String> = own.keys().map(|name| format!("`{name}`")).collect();
        needs = format!(" (given {} in `chat_template_kwargs`)", names.join(", "));
    }
    let note = match (&rendered, tool_format.family()) {
        (Err(e), Family::Generic) => format!("renders no call turn: {}", first_line(&e.to_string())),
        (Ok(_), Family::Generic) => "the template writes no tool calls".into(),
        (Err(e), _) => format!("native; the round trip does not render: {}", first_line(&e.to_string())),
        (Ok(chat), _) => {
            let written = tool_format.write_calls(&sample_calls()[..1], &tools);
            if chat.text.contains(&written) {
                format!("native; history written exactly as generated{needs}")
            } else {
                format!(
                    "native; the template rewrites calls in the history (cache kept by the next turn's anticipation){needs}"
                )
            }
        }
    };
    let note = if tool_format.parallel_calls() || tool_format.family() == Family::Llama3 || rendered.is_err() {
        note
    } else {
        format!("{note}; one call per reply")
    };
    let exact = note.contains("exactly");
    let summary = tool_format.summary().replace('\n', "\\n").replace('|', "\\|");
    (format!("| {name} | `{summary}` | {note} |"), exact.then_some(tool_format))
}

fn first_line(text: &str) -> String {
    text.lines().next().unwrap_or_default().replace('|', "\\|").chars().take(100).collect()
}

/// The table, with totals per family.
fn table() -> (String, Vec<(String, ToolFormat)>) {
    let mut rows = Vec::new();
    let mut exact = Vec::new();
    let mut totals: Vec<(String, usize)> = Vec::new();
    for (name, source) in templates() {
        let (line, format) = row(&name, &source);
        let family = line
            .split(" | ")
            .nth(1)
            .unwrap_or_default()
            .trim_matches('`')
            .split(' ')
            .next()
            .unwrap_or_default()
            .to_string();
        match totals.iter_mut().find(|(f, _)| *f == family) {
            Some((_, n)) => *n += 1,
            None => totals.push((family, 1)),
        }
        rows.push(line);
        if let Some(format) = format {
            exact.push((name, format));
        }
    }
    totals.sort();
    let native: usize = totals.iter().filter(|(f, _)| f != "generic").map(|(_, n)| n).sum();
    let summary: Vec<String> = totals.iter().map(|(f, n)| format!("{f} {n}")).collect();
    let text = format!(
        "# Tool-call formats of llama.cpp's template collection\n\n\
         Written by `tests/tool_formats.rs` (run it with `FIRSTWORD_BLESS=1` to rewrite this file after a change;\n\
         without it the test fails when this file and firstword disagree). For each template of\n\
         `models/templates` (fetched by `models/templates.py`): the call syntax firstword reads off\n\
         the template's own rendering of a call (the family, then the text that opens calls), and\n\
         notes. \"generic\" means firstword describes the tools itself and asks for\n\
         `<tool_call>{{…}}</tool_call>` calls.\n\n\
         Totals: {native} native, {} generic, of {} templates ({}).\n\n\
         | template | detected format | notes |\n|---|---|---|\n{}\n",
        rows.len() - native,
        rows.len(),
        summary.join(", "),
        rows.join("\n")
    );
    (text, exact)
}

/// The detected formats are those the docs list.
#[test]
fn every_template_has_the_format_the_docs_list() {
    let (text, _) = table();
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(DOC);
    if std::env::var_os("FIRSTWORD_BLESS").is_some() {
        std::fs::write(&path, &text).expect("docs written");
    }
    let documented = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(documented == text, "{DOC} is out of date; the table is now:\n{text}");
}

/// SmolLM2's vocabulary (no weights), loaded once: llama.cpp's backend is initialized once per
/// process, and the tests of this file run in parallel.
fn vocabulary() -> &'static LlamaModel {
    static MODEL: std::sync::OnceLock<(LlamaBackend, LlamaModel)> = std::sync::OnceLock::new();
    let (_, model) = MODEL.get_or_init(|| {
        let backend = LlamaBackend::init().expect("backend");
        let params = LlamaModelParams::default().with_vocab_only(true);
        let model = LlamaModel::load_from_file(&backend, common::smollm2_path(), &params).expect("vocabulary loads");
        (backend, model)
    });
    model
}

/// What llama.cpp's grammar makes of a text.
#[derive(Debug, PartialEq, Eq)]
enum Verdict {
    Complete,
    Partial,
    Rejected,
}

fn verdict(model: &LlamaModel, grammar: &Grammar, text: &str) -> Verdict {
    let mut sampler = LlamaSampler::grammar(model, &grammar.gbnf, &grammar.root)
        .unwrap_or_else(|e| panic!("llama.cpp cannot parse the grammar ({e}):\n{}", grammar.gbnf));
    for token in model.vocab().tokenize(text.as_bytes(), false, false) {
        if sampler.try_accept(token).is_err() {
            return Verdict::Rejected;
        }
    }
    let eos = model.vocab().eos();
    let mut end = LlamaTokenDataArray::new(vec![LlamaTokenData::new(eos, 0.0, 0.0)], false);
    end.apply_sampler(&mut sampler);
    if end.data[0].logit().is_finite() {
        Verdict::Complete
    } else {
        Verdict::Partial
    }
}

/// `text` parsed in two pieces at every split (and whole): the same calls each time.
fn parse_every_split(format: &ToolFormat, tools: &ToolSet, text: &str) -> Vec<(String, Value)> {
    let parse = |pieces: &[&str]| {
        let mut parser = ToolCallParser::new(format.clone()).with_tools(tools);
        let mut content = String::new();
        for piece in pieces {
            for p in parser.push(piece) {
                if let firstword::chat::tools::ParsedPiece::Content(c) = p {
                    content.push_str(&c);
                }
            }
        }
        let (_, calls) = parser.finish();
        let calls: Vec<(String, Value)> = calls
            .iter()
            .map(|c| {
                assert!(c.complete, "{text:?}: {c:?}");
                (c.name.clone(), serde_json::from_str(&c.arguments).unwrap_or_else(|e| panic!("{e}: {c:?}")))
            })
            .collect();
        (content, calls)
    };
    let whole = parse(&[text]);
    assert_eq!(whole.0.trim(), "", "{text:?}: no content");
    for (at, _) in text.char_indices().skip(1) {
        assert_eq!(parse(&[&text[..at], &text[at..]]), whole, "{text:?} split at {at}");
    }
    whole.1
}

/// For every template with a native format: its calls parse back at every chunking, and the
/// grammar takes them and refuses broken ones.
#[test]
fn every_native_format_parses_its_templates_calls_and_its_grammar_takes_them() {
    let model = vocabulary();
    let definitions = test_tools();
    let tools = ToolSet::new(definitions.clone()).expect("tools");
    let (_, exact) = table();
    assert!(exact.len() >= 30, "{} templates with an exact native format", exact.len());
    let mut failures = Vec::new();
    for (name, format) in &exact {
        let mut check = |ok: bool, what: String| {
            if !ok {
                failures.push(format!("{name}: {what}"));
            }
        };
        let calls = sample_calls();
        let counts: &[usize] = if format.parallel_calls() { &[1, 2] } else { &[1] };
        for &count in counts {
            let text = format.write_calls(&calls[..count], &definitions);
            let expected: Vec<(String, Value)> = calls[..count]
                .iter()
                .map(|c| (c.name.clone(), serde_json::from_str(&c.arguments).expect("JSON")))
                .collect();
            let parsed =
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| parse_every_split(format, &tools, &text)));
            check(parsed.as_ref().is_ok_and(|p| *p == expected), format!("parses {text:?} as {parsed:?}"));
            let grammar = request_grammar(format, &tools, &ToolChoice::Required, true, None).expect("grammar");
            let whole = verdict(model, &grammar, &text);
            check(whole == Verdict::Complete, format!("grammar: {whole:?} for {text:?}\n{}", grammar.gbnf));
            let cut = &text[..text.char_indices().nth(text.chars().count() / 2).map_or(0, |(i, _)| i)];
            let cut_verdict = verdict(model, &grammar, cut);
            check(cut_verdict == Verdict::Partial, format!("cut off {cut:?}: {cut_verdict:?}"));
        }
        let grammar = request_grammar(format, &tools, &ToolChoice::Required, true, None).expect("grammar");
        let one = format.write_calls(&calls[..1], &definitions);
        let repeated = one.replacen("unit", "city", 1);
        let verdict_repeated = verdict(model, &grammar, &repeated);
        check(verdict_repeated == Verdict::Rejected, format!("repeated key {repeated:?}: {verdict_repeated:?}"));
        let missing = format.write_calls(&[call("call00003", "get_weather", json!({"city": "Paris"}))], &definitions);
        let verdict_missing = verdict(model, &grammar, &missing);
        check(verdict_missing != Verdict::Complete, format!("missing argument {missing:?}: {verdict_missing:?}"));
        // A named function: one call only.
        let named =
            request_grammar(format, &tools, &ToolChoice::Function("get_weather".into()), true, None).expect("grammar");
        let mut second = calls[0].clone();
        second.id = "call00004".into();
        let two = format.write_calls(&[calls[0].clone(), second], &definitions);
        check(verdict(model, &named, &one) == Verdict::Complete, format!("named: {one:?}"));
        if format.parallel_calls() {
            check(verdict(model, &named, &two) == Verdict::Rejected, format!("named, two calls {two:?}"));
        }
    }
    assert!(failures.is_empty(), "{} failures:\n{}", failures.len(), failures.join("\n"));
}

/// For every template with a native format, model-free: the reply a model writes in that
/// format (one call, then two where the format allows several) comes back as those calls with
/// no text beside them; the client sends them back re-serialized (`{"city":"Paris"}`) with
/// their results, and the next prompt holds the calls as the model wrote them (where the
/// template writes calls as generated) and the results. The engine serving each template on
/// SmolLM2 is tests/tool_templates.rs.
#[test]
fn every_native_template_renders_the_round_trip_of_its_own_calls() {
    let definitions = test_tools();
    let mut checked = 0;
    let mut failures = Vec::new();
    for (name, source) in templates() {
        let Ok(chat) = chat_format(&source) else { continue };
        let format = chat.tool_format().clone();
        if format.family() == Family::Generic {
            continue;
        }
        let kwargs = own_variables(&source);
        let calls = sample_calls();
        let counts: &[usize] = if format.parallel_calls() { &[1, 2] } else { &[1] };
        for &count in counts {
            let mut fail = |what: String| failures.push(format!("{name} ({count} calls): {what}"));
            let written = format.write_calls(&calls[..count], &definitions);
            let reply = chat.reply_message(&written, false, &definitions);
            let read: Vec<(String, Value)> = reply
                .tool_calls
                .iter()
                .map(|c| (c.name.clone(), serde_json::from_str(&c.arguments).unwrap_or(Value::Null)))
                .collect();
            let expected: Vec<(String, Value)> = calls[..count]
                .iter()
                .map(|c| (c.name.clone(), serde_json::from_str(&c.arguments).expect("JSON")))
                .collect();
            if read != expected || !reply.content.trim().is_empty() {
                fail(format!("the reply {written:?} reads as {read:?} and text {:?}", reply.content));
                continue;
            }
            // The client re-serializes the arguments and sends the calls back with results.
            let mut messages =
                vec![ChatMessage::system("Be brief."), ChatMessage::user("Weather in Paris, and a timer?")];
            let mut assistant = ChatMessage::assistant("");
            assistant.tool_calls = reply
                .tool_calls
                .iter()
                .zip(&calls)
                .map(|(read, sent)| {
                    let compact = serde_json::to_string(&serde_json::from_str::<Value>(&read.arguments).expect("JSON"));
                    ToolCall { id: sent.id.clone(), name: read.name.clone(), arguments: compact.expect("JSON") }
                })
                .collect();
            messages.push(assistant);
            for call in &calls[..count] {
                let mut result = ChatMessage::new(Role::Tool, format!("result of {}", call.name));
                result.tool_call_id = Some(call.id.clone());
                result.name = Some(call.name.clone());
                messages.push(result);
            }
            let prompt = match chat.render_with(&messages, &definitions, &kwargs) {
                Ok(rendered) => rendered.text,
                Err(e) => {
                    fail(format!("the round trip does not render: {e}"));
                    continue;
                }
            };
            for call in &calls[..count] {
                if !prompt.contains(&format!("result of {}", call.name)) || !prompt.contains(&call.name) {
                    fail(format!("the call and result of {} in {prompt:?}", call.name));
                }
            }
            let exact = chat
                .render_with(&conversation(&calls[..1]), &definitions, &kwargs)
                .is_ok_and(|first| first.text.contains(&format.write_calls(&calls[..1], &definitions)));
            if exact && !prompt.contains(&written) {
                fail(format!("the calls as generated, {written:?}, in {prompt:?}"));
            }
        }
        checked += 1;
    }
    assert!(checked >= 60, "{checked} native templates checked");
    assert!(failures.is_empty(), "{} failures:\n{}", failures.len(), failures.join("\n"));
}

/// The collection's template `name`, as `serve --chat-template-file` loads it.
fn collection_format(name: &str) -> ChatFormat {
    let (_, source) =
        templates().into_iter().find(|(n, _)| n == name).unwrap_or_else(|| panic!("{name} in the collection"));
    chat_format(&source).expect("compiles")
}

/// Functionary v3.2's generation prompt ends with the call opener `>>>`: the reply is `all\n`
/// and text (perhaps then calls after `>>>`), or calls. `auto` allows both, `required` and a
/// named function calls only, `none` text only; the text never carries the recipient.
#[test]
fn functionary_v3_2_replies_start_inside_the_opener_and_the_grammar_knows_it() {
    let chat = collection_format("meetkai-functionary-medium-v3.2");
    let format = chat.tool_format().clone();
    assert_eq!((format.openers(), format.text_recipient()), (vec![">>>".to_string()], Some("all\n")));
    let prompt = chat.render(&[ChatMessage::user("Weather in Paris?")], &test_tools()).expect("renders").text;
    assert!(prompt.ends_with("<|start_header_id|>assistant<|end_header_id|>\n\n>>>"), "{prompt:?}");

    let model = vocabulary();
    let tools = ToolSet::new(test_tools()).expect("tools");
    let grammar = |choice: ToolChoice| request_grammar(&format, &tools, &choice, true, None).expect("a grammar");
    let call = r#"get_weather\n{"city": "Paris", "unit": "celsius"}"#.replace("\\n", "\n");
    let two = format!("{call}>>>set_timer\n{{\"minutes\": 10}}");
    let text = "all\nIt is sunny.";
    let text_then_call = format!("all\nLet me check.>>>{call}");
    let auto = grammar(ToolChoice::Auto);
    assert!(auto.triggers.is_empty() && auto.anchored_triggers.is_empty(), "the reply starts inside the opener");
    for (choice, grammar) in [
        ("auto", &auto),
        ("required", &grammar(ToolChoice::Required)),
        ("named", &grammar(ToolChoice::Function("get_weather".into()))),
        ("none", &grammar(ToolChoice::None)),
    ] {
        let allows_text = matches!(choice, "auto" | "none");
        let allows_calls = choice != "none";
        let expect = |allowed: bool| if allowed { Verdict::Complete } else { Verdict::Rejected };
        assert_eq!(verdict(model, grammar, text), expect(allows_text), "{choice}: {text:?}");
        assert_eq!(verdict(model, grammar, &call), expect(allows_calls), "{choice}: {call:?}");
        assert_eq!(verdict(model, grammar, &text_then_call), expect(choice == "auto"), "{choice}: {text_then_call:?}");
        assert_eq!(verdict(model, grammar, &two), expect(matches!(choice, "auto" | "required")), "{choice}: {two:?}");
        // Text without its recipient, a second recipient, a repeated key: never.
        for bad in
            ["It is sunny.", "all\nSunny.>>>all\nWarm.", "get_weather\n{\"city\": \"Paris\", \"city\": \"Rome\"}"]
        {
            assert_eq!(verdict(model, grammar, bad), Verdict::Rejected, "{choice}: {bad:?}");
        }
        // A call cut off is unfinished, not complete.
        if allows_calls {
            assert_eq!(verdict(model, grammar, &call[..call.len() - 3]), Verdict::Partial, "{choice}");
        }
    }

    // The reply's message: text without the recipient, calls apart from text.
    let definitions = test_tools();
    let reply = chat.reply_message(&text_then_call, false, &definitions);
    assert_eq!((reply.content.as_str(), reply.tool_calls.len()), ("Let me check.", 1));
    assert_eq!(chat.reply_message(text, false, &definitions).content, "It is sunny.");
    assert_eq!(chat.reply_message(text, false, &[]).content, "It is sunny.", "without tools too");
    // Sent back, the text reply renders as the model wrote it after the prompt's opener.
    let mut messages = vec![ChatMessage::user("Weather in Paris?")];
    messages.push(chat.reply_message(text, false, &[]));
    let next = chat.render(&messages, &[]).expect("renders").text;
    assert!(next.contains(&format!(">>>{text}<|eot_id|>")), "{next:?}");
}

/// DeepSeek-R1-Distill-Llama's template writes calls only for an assistant message whose
/// content is none (a client's `null`): firstword passes none there, and the calls render.
#[test]
fn deepseek_r1_distill_llama_renders_calls_given_no_content() {
    let chat = collection_format("deepseek-ai-DeepSeek-R1-Distill-Llama-8B");
    let format = chat.tool_format().clone();
    assert_eq!(format.family(), Family::NamedJson);
    let definitions = test_tools();
    let calls = sample_calls();
    let prompt = chat.render(&conversation(&calls[..1]), &definitions).expect("renders").text;
    let written = format.write_calls(&calls[..1], &definitions);
    assert!(
        written.starts_with("<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n"),
        "{written:?}"
    );
    assert!(prompt.contains(&format!("<｜Assistant｜>{written}<｜tool▁outputs▁begin｜>")), "{prompt:?}");
    // Two calls: the template closes the section after the second one.
    let prompt = chat.render(&conversation(&calls), &definitions).expect("renders").text;
    let two = format.write_calls(&calls, &definitions);
    assert!(prompt.contains(&format!("{two}<｜tool▁calls▁end｜><｜end▁of▁sentence｜>")), "{prompt:?}");
    // A message with text and calls keeps its text (this template then writes no calls).
    let mut with_text = conversation(&calls[..1]);
    with_text[1].content = "Checking.".into();
    let prompt = chat.render(&with_text, &definitions).expect("renders").text;
    assert!(prompt.contains("<｜Assistant｜>Checking.<｜end▁of▁sentence｜>"), "{prompt:?}");
}

/// Muse Glimmer writes a call as `<|start|>assistant to=NAME<|message|>…<atem:invoke
/// name="NAME">`: the name twice, joined to the generation prompt by a space. The required
/// grammar holds a reply to exactly that (never the probe's sentinel name, never `assistantto=`),
/// and the prompt plus the reply is the template's own rendering of the call.
#[test]
fn muse_glimmer_repeats_the_name_and_joins_the_call_with_a_space() {
    let chat = collection_format("muse-glimmer");
    let format = chat.tool_format().clone();
    let definitions = test_tools();
    let calls = sample_calls();
    let written = format.write_calls(&calls[..1], &definitions);
    assert!(
        written.starts_with(" to=get_weather<|message|><atem:function_calls>\n<atem:invoke name=\"get_weather\">\n"),
        "{written:?}"
    );
    let prompt = chat.render(&[ChatMessage::user("Weather in Paris?")], &definitions).expect("renders").text;
    assert!(prompt.ends_with("<|start|>assistant"), "{prompt:?}");
    let history = chat.render(&conversation(&calls[..1]), &definitions).expect("renders").text;
    assert!(history.contains(&format!("<|start|>assistant{written}")), "{written:?} in {history:?}");

    let model = vocabulary();
    let tools = ToolSet::new(definitions.clone()).expect("tools");
    let grammar = request_grammar(&format, &tools, &ToolChoice::Required, true, None).expect("grammar");
    assert_eq!(verdict(model, &grammar, &written), Verdict::Complete, "{written:?}");
    for bad in [written.trim_start().to_string(), written.replacen("name=\"get_weather\"", "name=\"set_timer\"", 1)] {
        assert_eq!(verdict(model, &grammar, &bad), Verdict::Rejected, "{bad:?}");
    }
}
