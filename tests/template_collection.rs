//! Every chat template of llama.cpp's collection (`models/templates/*.jinja`, fetched by
//! `models/templates.py`) renders in firstword byte for byte as Hugging Face transformers
//! renders it: `tests/templates/reference.py` calls transformers' own `apply_chat_template`
//! rendering in the pinned venv of `scripts/template-venv.sh`.
//!
//! Each template gets the conversations of [`cases`]: plain chats with and without the generation
//! prompt, tools offered, a round trip of calls and results, reasoning in the history, and the
//! `enable_thinking`/`reasoning_effort` switches. Both renderers get the same `bos_token` and
//! `eos_token` texts (transformers passes the tokenizer's), so no allowance is made for them:
//! the texts must be equal. Where transformers fails (the template raises, or needs what the
//! conversation lacks), firstword must fail too, with an error, never a panic.
//!
//! Tool-call arguments reach templates as objects (what transformers documents and its own
//! server passes) unless the template can only print them as text (functionary v3.2 writes
//! `'\n' + arguments`): the round trip is rendered by the reference both ways, and firstword's
//! choice must be the object form wherever transformers renders it. The same cases are rendered
//! again with the calling message's content none (a client's `null`): firstword passes none
//! where the template writes calls only then (DeepSeek-R1-Distill-Llama's `content is none`),
//! which must be exactly where transformers writes more of the calls given none than given `""`
//! (one known exception: transformers drops keys whose value is None, see [`KNOWN`]).

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::python::run_with_timeout;
use firstword::chat::{
    CallArguments, CallContent, ChatFormat, ChatTemplate, ModelTemplateFacts, TemplateError, TemplateKwargs, ToolCall,
};
use firstword::{ChatMessage, Engine, EngineConfig, GenerationRequest, Prompt, Role, SamplingParams};
use serde_json::{json, Value};

/// The collection's size at the pinned llama.cpp release (models/templates.py).
const COLLECTION_SIZE: usize = 71;
const BOS: &str = "<|bos|>";
const EOS: &str = "<|eos|>";
/// Far above the reference's usual run (a few seconds), so only a hang trips it.
const REFERENCE_TIMEOUT: Duration = Duration::from_secs(300);

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The collection's templates, sorted by name.
fn collection() -> Vec<PathBuf> {
    let dir = root().join("models/templates");
    let mut paths: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}; run `python3 models/templates.py` (make test does)", dir.display()))
        .map(|entry| entry.expect("entry").path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "jinja"))
        .collect();
    paths.sort();
    assert_eq!(paths.len(), COLLECTION_SIZE, "models/templates holds the whole collection");
    paths
}

fn name(path: &Path) -> String {
    path.file_stem().expect("named").to_string_lossy().into_owned()
}

/// The pinned venv's python, from the last stdout line of `scripts/template-venv.sh`.
fn reference_python() -> PathBuf {
    let output = Command::new("bash")
        .arg("scripts/template-venv.sh")
        .current_dir(root())
        .output()
        .expect("bash runs template-venv.sh");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "scripts/template-venv.sh failed ({}):\n{stdout}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    PathBuf::from(stdout.lines().last().expect("template-venv.sh prints the python path").trim())
}

/// One conversation to render: messages as transformers receives them (tool-call arguments as
/// objects), tools, the generation prompt and extra template variables.
#[derive(Clone, Debug)]
struct Case {
    label: &'static str,
    messages: Value,
    /// The same messages with the call arguments as the text a client sent, for the cases with
    /// calls: the reference renders both.
    as_text: Option<Value>,
    /// The messages and the text form again with the calling message's content none.
    null_content: Option<(Value, Value)>,
    tools: Option<Value>,
    add_generation_prompt: bool,
    kwargs: Value,
}

const CALL_WEATHER: &str = r#"{"city": "Paris", "unit": "celsius"}"#;
const CALL_SEARCH: &str = r#"{"query": "café près de la tour Eiffel", "limit": 3, "exact": false, "sites": ["a.fr", "b.fr"], "near": {"lat": 48.86, "km": 1.0}, "lang": null}"#;

fn tools() -> Value {
    json!([
        {"type": "function", "function": {
            "name": "get_weather",
            "description": "Current weather in a city (température, vent).",
            "parameters": {"type": "object", "properties": {
                "city": {"type": "string", "description": "The city's name"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}
            }, "required": ["city"]}
        }},
        {"type": "function", "function": {
            "name": "search",
            "description": "Search the web",
            "parameters": {"type": "object", "properties": {
                "query": {"type": "string"},
                "limit": {"type": "integer", "default": 5},
                "exact": {"type": "boolean"},
                "sites": {"type": "array", "items": {"type": "string"}},
                "near": {"type": "object", "properties": {"lat": {"type": "number"}, "km": {"type": "number"}}},
                "lang": {"type": "string"}
            }, "required": ["query"]}
        }}
    ])
}

/// [`tools`] and one whose parameter may be of two types (`Optional[str]` as pydantic writes it).
fn tools_with_a_union() -> Value {
    let mut tools = tools();
    tools.as_array_mut().expect("a list").push(json!({"type": "function", "function": {
        "name": "translate",
        "description": "Translate a text",
        "parameters": {"type": "object", "properties": {
            "text": {"type": "string"},
            "target": {"type": ["string", "null"], "description": "A language code, or none for English"}
        }, "required": ["text"]}
    }}));
    tools
}

/// An assistant message with both calls, their arguments as objects or as the text a client sent.
fn calling(arguments_as_text: bool, reasoning: Option<&str>) -> Value {
    let arguments = |text: &str| {
        if arguments_as_text {
            Value::String(text.to_string())
        } else {
            serde_json::from_str(text).expect("JSON")
        }
    };
    let mut message = json!({"role": "assistant", "content": "", "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": arguments(CALL_WEATHER)}},
        {"id": "call_2", "type": "function", "function": {"name": "search", "arguments": arguments(CALL_SEARCH)}}
    ]});
    if let Some(reasoning) = reasoning {
        message["reasoning_content"] = json!(reasoning);
    }
    message
}

fn round_trip(arguments_as_text: bool) -> Value {
    json!([
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "Weather in Paris, and a café nearby?"},
        calling(arguments_as_text, None),
        {"role": "tool", "content": "{\"temperature\": 21, \"sky\": \"clear\"}", "name": "get_weather", "tool_call_id": "call_1"},
        {"role": "tool", "content": "Café de l'Homme, 1 km", "name": "search", "tool_call_id": "call_2"},
        {"role": "assistant", "content": "It is 21 °C and clear; Café de l'Homme is 1 km away."},
        {"role": "user", "content": "Thanks!"}
    ])
}

fn pending_call(arguments_as_text: bool) -> Value {
    json!([
        {"role": "user", "content": "What is the weather in Paris?"},
        calling(arguments_as_text, Some("The user wants the weather; I should call the tool.")),
        {"role": "tool", "content": "sunny", "name": "get_weather", "tool_call_id": "call_1"},
        {"role": "tool", "content": "none found", "name": "search", "tool_call_id": "call_2"}
    ])
}

/// One call answered by a result without `name` (as OpenAI clients send it), its id 9
/// alphanumerics (Mistral's templates refuse others), for templates that take a single call.
fn single_call(arguments_as_text: bool) -> Value {
    let arguments =
        if arguments_as_text { json!(CALL_WEATHER) } else { serde_json::from_str(CALL_WEATHER).expect("JSON") };
    json!([
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "a1B2c3D4e", "type": "function", "function": {"name": "get_weather", "arguments": arguments}}
        ]},
        {"role": "tool", "content": "21 °C, clear", "tool_call_id": "a1B2c3D4e"},
        {"role": "assistant", "content": "It is 21 °C and clear."},
        {"role": "user", "content": "Thanks!"}
    ])
}

fn cases() -> Vec<Case> {
    let plain = json!([
        {"role": "system", "content": "You are a concise assistant."},
        {"role": "user", "content": "Hi! ¿Qué tal? 😀"},
        {"role": "assistant", "content": "Hello! How can I help?"},
        {"role": "user", "content": "Name a colour."}
    ]);
    let ask = json!([
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "What is the weather in Paris?"}
    ]);
    let reasoned = json!([
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4", "reasoning_content": "Two plus two is four."},
        {"role": "user", "content": "And 3+3?"}
    ]);
    let case = |label, messages: &Value, tools: Option<Value>, add_generation_prompt, kwargs: Value| Case {
        label,
        messages: messages.clone(),
        as_text: None,
        null_content: None,
        tools,
        add_generation_prompt,
        kwargs,
    };
    let without_content = |messages: Value| {
        let mut messages = messages;
        for message in messages.as_array_mut().expect("a list") {
            if message.get("tool_calls").is_some() {
                message["content"] = Value::Null;
            }
        }
        messages
    };
    let with_calls = |label, calls: fn(bool) -> Value| Case {
        as_text: Some(calls(true)),
        null_content: Some((without_content(calls(false)), without_content(calls(true)))),
        ..case(label, &calls(false), Some(tools()), true, json!({}))
    };
    vec![
        case("plain", &plain, None, true, json!({})),
        case("plain, no generation prompt", &plain, None, false, json!({})),
        case("user only", &json!([{"role": "user", "content": "Hi"}]), None, true, json!({})),
        case("tools offered", &ask, Some(tools()), true, json!({})),
        case("tools offered, one with a union type", &ask, Some(tools_with_a_union()), true, json!({})),
        with_calls("call round trip", round_trip),
        with_calls("single call round trip", single_call),
        with_calls("calls with reasoning, results pending", pending_call),
        case("reasoning in the history", &reasoned, None, true, json!({})),
        case("thinking off", &ask, None, true, json!({"enable_thinking": false})),
        case("thinking on", &ask, None, true, json!({"enable_thinking": true})),
        case("reasoning effort low", &ask, None, true, json!({"reasoning_effort": "low"})),
    ]
}

/// A message as firstword receives it from a client (call arguments as JSON text).
fn chat_message(message: &Value) -> ChatMessage {
    let role = match message["role"].as_str().expect("role") {
        "system" => Role::System,
        "user" => Role::User,
        "assistant" => Role::Assistant,
        "tool" => Role::Tool,
        other => panic!("role {other}"),
    };
    let text = |key: &str| message.get(key).and_then(Value::as_str).map(str::to_string);
    let call = |call: &Value| ToolCall {
        id: call["id"].as_str().expect("id").into(),
        name: call["function"]["name"].as_str().expect("name").into(),
        arguments: python_json(&call["function"]["arguments"]),
    };
    ChatMessage {
        role,
        content: text("content").unwrap_or_default(),
        name: text("name"),
        tool_calls: message
            .get("tool_calls")
            .and_then(Value::as_array)
            .map(|c| c.iter().map(call).collect())
            .unwrap_or_default(),
        tool_call_id: text("tool_call_id"),
        reasoning: text("reasoning_content"),
    }
}

/// JSON text as the test's calls are written (Python's `json.dumps` separators): the text a
/// client sent.
fn python_json(value: &Value) -> String {
    match value {
        Value::Object(map) => {
            let items: Vec<String> =
                map.iter().map(|(k, v)| format!("{}: {}", Value::String(k.clone()), python_json(v))).collect();
            format!("{{{}}}", items.join(", "))
        }
        Value::Array(items) => format!("[{}]", items.iter().map(python_json).collect::<Vec<_>>().join(", ")),
        other => other.to_string(),
    }
}

fn render(template: &ChatTemplate, case: &Case) -> Result<String, String> {
    let messages: Vec<ChatMessage> = case.messages.as_array().expect("a list").iter().map(chat_message).collect();
    let kwargs: TemplateKwargs = case.kwargs.as_object().cloned().unwrap_or_default();
    template.render(&messages, case.tools.as_ref(), case.add_generation_prompt, &kwargs).map_err(|e| e.to_string())
}

/// What transformers made of each case (messages given): the text or its error.
fn reference(jobs: &[(&Path, &Case, &Value)]) -> Vec<Result<String, String>> {
    let cases: Vec<Value> = jobs
        .iter()
        .map(|(path, case, messages)| {
            let mut kwargs = case.kwargs.clone();
            kwargs["bos_token"] = json!(BOS);
            kwargs["eos_token"] = json!(EOS);
            json!({
                "template": path,
                "messages": messages,
                "tools": case.tools,
                "add_generation_prompt": case.add_generation_prompt,
                "kwargs": kwargs,
            })
        })
        .collect();
    let input_path = std::env::temp_dir().join(format!("firstword-template-cases-{}.json", std::process::id()));
    std::fs::write(&input_path, json!({ "cases": cases }).to_string()).expect("write the cases");
    let mut command = Command::new(reference_python());
    command.arg(root().join("tests/templates/reference.py")).stdin(std::fs::File::open(&input_path).expect("cases"));
    let (status, stdout, stderr) = run_with_timeout(command, REFERENCE_TIMEOUT);
    let _ = std::fs::remove_file(&input_path);
    let status = status.unwrap_or_else(|| panic!("the reference ran past {REFERENCE_TIMEOUT:?}"));
    assert!(status.success(), "the reference failed ({status}):\n{stderr}");
    let results: Vec<Value> = serde_json::from_str(&stdout).expect("the reference writes JSON");
    assert_eq!(results.len(), jobs.len());
    results
        .into_iter()
        .map(|result| match (result.get("text"), result.get("error")) {
            (Some(Value::String(text)), _) => Ok(text.clone()),
            (_, Some(Value::String(error))) => Err(error.clone()),
            _ => panic!("unexpected reference result {result}"),
        })
        .collect()
}

/// Where firstword knowingly renders otherwise than transformers: the template, a text of
/// transformers' error or rendering that marks the case, and why.
const KNOWN: &[(&str, &str, &str)] = &[
    (
        "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use",
        "'NoneType' object is not iterable",
        "iterates `tools` unchecked: Python cannot iterate None, minijinja iterates none as empty, so firstword \
         writes the tool prompt without tools and a plain chat works",
    ),
    ("NousResearch-Hermes-3-Llama-3.1-8B-tool_use", "'NoneType' object is not iterable", "as Hermes 2 Pro's"),
    (
        "Kimi-K2-Instruct",
        "access to attribute 'append' of 'list' object is unsafe",
        "keeps its call ids in `namespace(ids=[])` with `ids.append(…)` and `ids.pop(0)`: jinja2's immutable sandbox \
         refuses to grow a list, so transformers renders no conversation with calls; firstword grows the lists a \
         namespace holds, as llama.cpp's template engine does",
    ),
    ("Kimi-K2-Thinking", "access to attribute 'append' of 'list' object is unsafe", "as Kimi-K2-Instruct's"),
    ("CohereForAI-c4ai-command-r-plus-tool_use", "'NoneType' object is not iterable", "as Hermes 2 Pro's"),
    (
        "llama-cpp-deepseek-r1",
        "Object of type generator is not JSON serializable",
        "llama.cpp's own template applies tojson to a map() result: jinja2's map is a generator json.dumps refuses, \
         minijinja's a list",
    ),
    (
        "deepseek-ai-DeepSeek-R1-Distill-Llama-8B",
        "empty content as None;",
        "writes calls only where `message['content'] is none`, but transformers drops a message's keys whose value \
         is None, so the template fails on a client's `null` ('dict object' has no attribute 'content') and drops \
         the calls given `\"\"`: transformers renders no conversation with calls. firstword passes none there (as \
         llama.cpp does), so the calls reach the prompt",
    ),
    (
        "meetkai-functionary-medium-v3.1",
        "&#34;",
        "jinja2 HTML-escapes a str added to a `|safe` string, so transformers writes the tools' JSON as \
         {&#34;name&#34;: …}; firstword writes the JSON itself, as llama.cpp does",
    ),
];

/// The reason firstword knowingly differs on a case, if it does.
fn known(template: &str, detail: &str) -> Option<&'static str> {
    KNOWN.iter().find(|(name, mark, _)| *name == template && detail.contains(mark)).map(|(_, _, why)| *why)
}

/// One template's outcome on one case.
#[derive(Debug)]
enum Outcome {
    /// Both rendered the same text.
    Equal,
    /// A difference listed in [`KNOWN`] (why).
    Known(&'static str),
    /// Transformers fails (its error); firstword fails too.
    BothFail(String),
    /// A difference: the failure of this test.
    Differs(String),
}

/// The reference's renderings of one case: the messages, and for cases with calls the text form
/// of the arguments and both forms with the calling message's content none.
struct Theirs {
    as_object: Result<String, String>,
    as_text: Option<Result<String, String>>,
    null_content: Option<(Result<String, String>, Result<String, String>)>,
}

/// The template's outcome on `case`: `ours` against transformers' rendering of the forms
/// firstword passes. The calling message's content is none exactly where transformers writes
/// more of the calls so than given `""`; the call arguments are the object form wherever
/// transformers renders that, the text form otherwise.
fn judge(template: &ChatTemplate, case: &Case, ours: &Result<String, String>, theirs: &Theirs) -> Outcome {
    let calls_written = |r: &Result<String, String>| r.as_ref().map_or(0, |text| text.matches("get_weather").count());
    let (as_object, as_text, content) = match (&theirs.null_content, &theirs.as_text) {
        (Some((null_object, null_text)), Some(as_text)) => {
            let given_empty = calls_written(&theirs.as_object).max(calls_written(as_text));
            let given_none = calls_written(null_object).max(calls_written(null_text));
            if given_none > given_empty {
                (null_object, Some(null_text), CallContent::None)
            } else {
                (&theirs.as_object, Some(as_text), CallContent::Empty)
            }
        }
        _ => (&theirs.as_object, theirs.as_text.as_ref(), CallContent::Empty),
    };
    if theirs.null_content.is_some() && template.call_content() != content {
        return Outcome::Differs(format!(
            "firstword passes a calling message's empty content as {:?}; transformers writes the calls best given {content:?}",
            template.call_content()
        ));
    }
    let expected_form = match as_text {
        Some(text_form) if as_object.is_err() && text_form.is_ok() => CallArguments::Text,
        _ => CallArguments::Object,
    };
    if as_text.is_some() && template.call_arguments() != expected_form {
        return Outcome::Differs(format!(
            "firstword passes call arguments as {:?}, transformers renders them as {expected_form:?}",
            template.call_arguments()
        ));
    }
    let theirs = if expected_form == CallArguments::Text { as_text.expect("a text form") } else { as_object };
    match (ours, theirs) {
        (Ok(a), Ok(b)) if a == b => Outcome::Equal,
        // A date printed by the template may have changed since the first rendering.
        (Ok(_), Ok(b)) => match render(template, case) {
            Ok(again) if &again == b => Outcome::Equal,
            Ok(again) => Outcome::Differs(first_difference(&again, b)),
            Err(e) => Outcome::Differs(format!("firstword failed on a second rendering: {e}")),
        },
        (Err(_), Err(theirs)) => Outcome::BothFail(theirs.clone()),
        (Err(ours), Ok(_)) => Outcome::Differs(format!("firstword fails where transformers renders: {ours}")),
        (Ok(_), Err(theirs)) => Outcome::Differs(format!("firstword renders where transformers fails: {theirs}")),
    }
}

fn first_difference(ours: &str, theirs: &str) -> String {
    let at = ours.bytes().zip(theirs.bytes()).take_while(|(a, b)| a == b).count();
    let context = |text: &str| {
        let mut start = at.saturating_sub(60).min(text.len());
        while !text.is_char_boundary(start) {
            start -= 1;
        }
        let mut end = (at + 100).min(text.len());
        while !text.is_char_boundary(end) {
            end += 1;
        }
        text[start..end].to_string()
    };
    format!("differs at byte {at}:\n    firstword:    {:?}\n    transformers: {:?}", context(ours), context(theirs))
}

#[test]
fn every_template_of_the_collection_renders_as_transformers_renders_it() {
    let templates: Vec<(PathBuf, ChatTemplate)> = collection()
        .into_iter()
        .map(|path| {
            let source = std::fs::read_to_string(&path).expect("readable");
            let template = ChatTemplate::new(&source, BOS, EOS)
                .unwrap_or_else(|e| panic!("{} does not compile in firstword: {e}", name(&path)));
            (path, template)
        })
        .collect();
    let cases = cases();
    // Rendered before the reference (and again after it where they differ, so that a template
    // printing today's date matches even when the date changes during the run).
    let ours: Vec<Vec<Result<String, String>>> =
        templates.iter().map(|(_, template)| cases.iter().map(|case| render(template, case)).collect()).collect();
    let mut jobs = Vec::new();
    for (path, _) in &templates {
        for case in &cases {
            jobs.push((path.as_path(), case, &case.messages));
            if let Some(as_text) = &case.as_text {
                jobs.push((path.as_path(), case, as_text));
            }
            if let Some((null_object, null_text)) = &case.null_content {
                jobs.push((path.as_path(), case, null_object));
                jobs.push((path.as_path(), case, null_text));
            }
        }
    }
    let mut theirs = reference(&jobs).into_iter();
    let mut failures = Vec::new();
    let mut all_equal = 0;
    let mut known_seen = std::collections::BTreeSet::new();
    for ((path, template), ours) in templates.iter().zip(&ours) {
        let mut lines = Vec::new();
        let mut equal = 0;
        for (case, ours) in cases.iter().zip(ours) {
            let mut next = || theirs.next().expect("a result per job");
            let as_object = next();
            let as_text = case.as_text.as_ref().map(|_| next());
            let null_content = case.null_content.as_ref().map(|_| (next(), next()));
            let mut outcome = judge(template, case, ours, &Theirs { as_object, as_text, null_content });
            if let Outcome::Differs(detail) = &outcome {
                if let Some(why) = known(&name(path), detail) {
                    outcome = Outcome::Known(why);
                }
            }
            match outcome {
                Outcome::Equal => equal += 1,
                Outcome::Known(why) => {
                    lines.push(format!("  {}: known difference: {why}", case.label));
                    known_seen.insert(name(path));
                }
                Outcome::BothFail(error) => {
                    lines.push(format!("  {}: transformers fails ({error}); so does firstword", case.label));
                }
                Outcome::Differs(detail) => {
                    lines.push(format!("  {}: DIFFERS {detail}", case.label));
                    failures.push(format!("{} / {}: {detail}", name(path), case.label));
                }
            }
        }
        all_equal += usize::from(equal == cases.len());
        println!(
            "{}: {equal}/{} equal, arguments as {:?}, empty calling content as {:?}",
            name(path),
            cases.len(),
            template.call_arguments(),
            template.call_content()
        );
        for line in lines {
            println!("{line}");
        }
    }
    println!("{all_equal} of {} templates equal on every case", templates.len());
    let stale: Vec<&str> = KNOWN.iter().map(|(name, _, _)| *name).filter(|name| !known_seen.contains(*name)).collect();
    assert!(stale.is_empty(), "known differences that no longer occur: {stale:?}");
    assert!(failures.is_empty(), "{} differences:\n{}", failures.len(), failures.join("\n"));
}

/// Variables a template reads that transformers does not define, which a client then gives in
/// `chat_template_kwargs`: firefunction v2 prints `functions` (its tools as JSON) and `datetime`.
fn needed_kwargs(template: &str) -> TemplateKwargs {
    let kwargs = match template {
        "fireworks-ai-llama-3-firefunction-v2" => json!({"functions": "[]", "datetime": "Jan 01 2026"}),
        _ => json!({}),
    };
    kwargs.as_object().cloned().unwrap_or_default()
}

/// Every template loads as `firstword serve --chat-template-file` loads it (the same
/// `ChatFormat::for_model`) and renders a plain chat the way the engine renders it; a template
/// that needs variables of its own fails without them with a clear error.
#[test]
fn every_template_loads_as_a_chat_template_file_and_renders_a_plain_chat() {
    let facts = ModelTemplateFacts {
        architecture: "llama".into(),
        bos_token: BOS.into(),
        eos_token: EOS.into(),
        ..Default::default()
    };
    for path in collection() {
        let name = name(&path);
        let format = ChatFormat::for_model(&facts, Some(&path)).unwrap_or_else(|e| panic!("{name}: {e}"));
        let kwargs = needed_kwargs(&name);
        let rendered = format
            .render_with(&[ChatMessage::user("Hi")], &[], &kwargs)
            .unwrap_or_else(|e| panic!("{name} rejects a plain chat: {e}"));
        assert!(rendered.text.contains("Hi"), "{name}: {}", rendered.text);
        if !kwargs.is_empty() {
            let error = format.render(&[ChatMessage::user("Hi")], &[]).expect_err("needs its variables");
            assert!(matches!(error, TemplateError::Render(_)), "{name}: {error}");
        }
    }
}

/// An engine over SmolLM2's weights answers a plain chat with templates that firstword could
/// not render before: `{% generation %}` blocks (LFM2.5) and `tools is iterable and tools |
/// length > 0` without tools (Qwen3-Coder).
#[test]
fn an_engine_serves_a_plain_chat_with_templates_of_the_collection() {
    for name in ["LFM2.5-8B-A1B", "Qwen3-Coder"] {
        let path = root().join("models/templates").join(format!("{name}.jinja"));
        let config = EngineConfig { chat_template_file: Some(path), ..common::test_config(common::smollm2_path()) };
        let engine = Engine::start(config).unwrap_or_else(|e| panic!("{name}: the engine does not start: {e}"));
        let generated = common::generate(&engine, request_with(TemplateKwargs::new()));
        assert!(generated.usage.prompt_tokens > 1 && generated.usage.completion_tokens > 0, "{name}");
        engine.wait_idle_blocking();
    }
}

/// A greedy plain chat of two tokens, rendered with `kwargs`.
fn request_with(kwargs: TemplateKwargs) -> GenerationRequest {
    GenerationRequest {
        prompt: Prompt::Chat { messages: vec![ChatMessage::user("Hi")], tools: Vec::new(), template_kwargs: kwargs },
        max_tokens: Some(2),
        sampling: SamplingParams::greedy(),
        ..GenerationRequest::chat(Vec::new())
    }
}
