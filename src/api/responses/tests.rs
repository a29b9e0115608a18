//! The Responses API without a model: requests into jobs (the stored conversation first), and
//! scripted engine events into the stream's events and the final response object.

use std::sync::Arc;

use serde_json::{json, Value};

use super::*;
use crate::api::chat::EventFramer;
use crate::api::tests::{call_text, finished, model, timer_tool, USAGE};
use crate::chat::tools::ToolFormat;
use crate::chat::ReasoningFormat;
use crate::engine::Event;

fn job(body: Value, store: &Arc<ResponseStore>) -> Result<ResponseJob, ApiError> {
    ResponseJob::new(body.to_string().as_bytes(), &model(), store)
}

fn messages(job: &ResponseJob) -> Vec<ChatMessage> {
    let Prompt::Chat { messages, .. } = &job.request.prompt else { panic!("a chat prompt") };
    messages.clone()
}

/// The SSE events of scripted `events`, as (event name, data) pairs, and the framer after them.
fn stream(job: ResponseJob, in_reasoning: bool, events: Vec<Event>) -> (Vec<(String, Value)>, ResponseFramer) {
    let mut framer = ResponseFramer::new(job.answering, AnswerShaper::new(job.output, in_reasoning));
    let mut sse = framer.first_events();
    for event in events {
        let framed = framer.frame(Some(event));
        sse.extend(framed.events);
        if framed.done {
            break;
        }
    }
    let written = sse
        .into_iter()
        .map(|payload| {
            let data = serde_json::from_str(&payload.data).unwrap_or_else(|e| panic!("{}: {e}", payload.data));
            (payload.name.expect("every Responses event is named").to_string(), data)
        })
        .collect();
    (written, framer)
}

#[test]
fn instructions_come_first_then_the_stored_conversation_then_the_input() {
    let store = Arc::new(ResponseStore::new(8));
    let first =
        job(json!({"instructions": "Be brief.", "input": "Hi", "max_output_tokens": 5}), &store).expect("accepted");
    assert_eq!(first.request.max_tokens, Some(5));
    let (_, framer) = stream(first, false, vec![Event::Text("Hello!".into()), finished(FinishReason::Stop)]);
    let stored = framer.into_outcome().expect("a response");
    assert_eq!(stored.status, "completed");

    let body = json!({"instructions": "Be kind.", "previous_response_id": stored.id, "input": "Bye"});
    let second = job(body, &store).expect("continues");
    let roles: Vec<(Role, String)> = messages(&second).into_iter().map(|m| (m.role, m.content)).collect();
    assert_eq!(
        roles,
        [
            (Role::System, "Be kind.".to_string()),
            (Role::User, "Hi".to_string()),
            (Role::Assistant, "Hello!".to_string()),
            (Role::User, "Bye".to_string()),
        ],
        "the earlier instructions are not carried over"
    );
    let unknown = job(json!({"input": "x", "previous_response_id": "resp_nope"}), &store).err().expect("refused");
    assert_eq!(
        (unknown.status(), unknown.param().as_deref()),
        (axum::http::StatusCode::NOT_FOUND, Some("previous_response_id"))
    );
    let unstored = job(json!({"input": "x", "store": false}), &store).expect("accepted");
    assert!(unstored.answering.store.is_none());
}

#[test]
fn unsupported_options_are_refused_by_name() {
    let store = Arc::new(ResponseStore::new(8));
    for (body, param) in [
        (json!({"input": "x", "background": true}), "background"),
        (json!({"input": "x", "conversation": "conv_1"}), "conversation"),
        (json!({"input": "x", "prompt": {"id": "pmpt_1"}}), "prompt"),
        (json!({"input": "x", "max_tool_calls": 2}), "max_tool_calls"),
        (json!({"input": "x", "truncation": "auto"}), "truncation"),
        (json!({"input": "x", "tools": [{"type": "web_search_preview"}]}), "tools[0].type"),
        (json!({"input": "x", "tools": [{"type": "function"}]}), "tools[0].name"),
        (json!({"input": "x", "tool_choice": {"type": "function", "name": "nope"}}), "tool_choice"),
        (json!({"input": "x", "top_logprobs": 30}), "top_logprobs"),
        (json!({"input": "x", "temperature": 3}), "temperature"),
    ] {
        let error = job(body.clone(), &store).err().unwrap_or_else(|| panic!("{body} accepted"));
        assert_eq!(error.param().as_deref(), Some(param), "{body}: {error}");
    }
    // Accepted and echoed: the options this server does honour, and those that change nothing.
    let body = json!({"input": "x", "truncation": "disabled", "metadata": {"k": "v"}, "user": "u", "service_tier": "auto",
        "include": ["reasoning.encrypted_content", "message.output_text.logprobs"], "top_logprobs": 2});
    let accepted = job(body, &store).expect("accepted");
    assert_eq!(accepted.request.logprobs, Some(2));
    assert_eq!(accepted.answering.echo.metadata, json!({"k": "v"}));
}

#[test]
fn a_stream_adds_each_item_with_its_parts_and_completes_with_the_same_items() {
    let store = Arc::new(ResponseStore::new(8));
    let mut request = job(
        json!({"input": "Set a timer", "tools": [{"type": "function", "name": "set_timer",
        "parameters": timer_tool().parameters}]}),
        &store,
    )
    .expect("accepted");
    request.output.format = ToolFormat::generic();
    request.output.reasoning = Some(ReasoningFormat::KNOWN[2]);
    let events = vec![
        Event::Text("Think".into()),
        Event::Text("ing.</think>\n\nSure. ".into()),
        Event::Text(call_text("set_timer", "{\"minutes\": 5}")),
        finished(FinishReason::Stop),
    ];
    let (written, framer) = stream(request, true, events);
    let kinds: Vec<&str> = written.iter().map(|(name, _)| name.as_str()).collect();
    assert_eq!(
        kinds,
        [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.content_part.added",
            "response.reasoning_text.delta",
            "response.reasoning_text.delta",
            "response.reasoning_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.output_item.added",
            "response.content_part.added",
            "response.output_text.delta",
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.output_item.added",
            "response.function_call_arguments.delta",
            "response.function_call_arguments.done",
            "response.output_item.done",
            "response.completed",
        ]
    );
    for (number, (name, data)) in written.iter().enumerate() {
        assert_eq!(
            (data["type"].as_str(), data["sequence_number"].as_u64()),
            (Some(name.as_str()), Some(number as u64))
        );
    }
    let done: Vec<&Value> =
        written.iter().filter(|(name, _)| name == "response.output_item.done").map(|(_, d)| &d["item"]).collect();
    let completed = &written.last().expect("events").1["response"];
    assert_eq!(completed["output"].as_array().expect("output").iter().collect::<Vec<_>>(), done, "the streamed items");
    assert_eq!(done[0]["content"][0]["text"], "Thinking.");
    assert_eq!(done[1]["content"][0]["text"], "Sure.", "the space before the call is layout");
    assert_eq!(
        (done[2]["name"].as_str(), done[2]["arguments"].as_str()),
        (Some("set_timer"), Some("{\"minutes\": 5}"))
    );
    assert!(done[2]["call_id"].as_str().is_some_and(|id| id.starts_with("call_")));
    assert_eq!(completed["usage"]["input_tokens"], USAGE.prompt_tokens);
    assert_eq!(completed["usage"]["input_tokens_details"]["cached_tokens"], USAGE.cached_tokens);
    let whole = serde_json::to_value(framer.into_outcome().expect("completed")).expect("JSON");
    assert_eq!(&whole, completed, "a whole response is the stream's final object");
    let stored = store.get(whole["id"].as_str().expect("id")).expect("stored");
    let turn = stored.conversation();
    let reply = turn.last().expect("the reply");
    assert_eq!(
        (reply.reasoning.as_deref(), reply.content.as_str(), reply.tool_calls.len()),
        (Some("Thinking."), "Sure.", 1)
    );
}

#[test]
fn a_reply_cut_by_the_token_limit_is_incomplete_and_a_failure_is_reported() {
    let store = Arc::new(ResponseStore::new(8));
    let cut = job(json!({"input": "Hi"}), &store).expect("accepted");
    let (written, _) = stream(cut, false, vec![Event::Text("Hel".into()), finished(FinishReason::Length)]);
    let (name, last) = written.last().expect("events");
    assert_eq!(name, "response.incomplete");
    assert_eq!(last["response"]["incomplete_details"]["reason"], "max_output_tokens");
    assert_eq!(last["response"]["output"][0]["status"], "incomplete");

    let failing = job(json!({"input": "Hi"}), &store).expect("accepted");
    let (written, framer) = stream(
        failing,
        false,
        vec![Event::Text("Hel".into()), Event::Failed(crate::engine::EngineError::Decode("boom".into()))],
    );
    let kinds: Vec<&str> = written.iter().map(|(name, _)| name.as_str()).collect();
    assert_eq!(kinds[kinds.len() - 2..], ["error", "response.failed"]);
    assert_eq!(written.last().expect("events").1["response"]["error"]["code"], "decode_failed");
    assert!(framer.into_outcome().is_err(), "a whole response answers with the error's status");
}

#[test]
fn the_store_keeps_the_most_recently_used_and_drops_chains_without_recursion() {
    let store = ResponseStore::new(2);
    let object = |id: &str| {
        let answering = job(json!({"input": "x"}), &Arc::new(ResponseStore::new(0))).expect("accepted").answering;
        ResponseObject { id: id.to_string(), ..answering.in_progress() }
    };
    let a = Arc::new(StoredResponse::new(None, vec![ChatMessage::user("a")], Vec::new(), object("a")));
    let b = Arc::new(StoredResponse::new(Some(Arc::clone(&a)), vec![ChatMessage::user("b")], Vec::new(), object("b")));
    store.put(Arc::clone(&a));
    store.put(b);
    store.get("a");
    store.put(Arc::new(StoredResponse::new(None, Vec::new(), Vec::new(), object("c"))));
    assert!(store.get("b").is_none() && store.get("a").is_some(), "b was the least recently used");
    assert!(store.remove("a") && !store.remove("a"));
    // A long chain is dropped one link at a time (recursion would overflow the stack).
    let mut chain: Option<Arc<StoredResponse>> = None;
    for i in 0..200_000 {
        chain =
            Some(Arc::new(StoredResponse::new(chain, vec![ChatMessage::user(i.to_string())], Vec::new(), object("x"))));
    }
    assert_eq!(chain.as_ref().map(|c| c.conversation().len()), Some(200_000));
    drop(chain);
}

#[test]
fn the_answers_logprobs_go_with_its_text_and_the_reasonings_are_left_out() {
    use crate::engine::{Candidate, TokenLogprob};
    let token = |text: &str| TokenLogprob {
        chosen: Candidate { token: 1, bytes: text.as_bytes().to_vec(), logprob: -0.5 },
        top: Vec::new(),
    };
    let store = Arc::new(ResponseStore::new(8));
    let body = json!({"input": "Hi", "include": ["message.output_text.logprobs"]});
    let mut request = job(body, &store).expect("accepted");
    assert_eq!(request.request.logprobs, Some(0));
    request.output.reasoning = Some(ReasoningFormat::KNOWN[2]);
    let events = vec![
        Event::Logprobs(vec![token("Hm"), token(".</think>")]),
        Event::Text("Hm.</think>".into()),
        Event::Logprobs(vec![token("\n\nHel"), token("lo")]),
        Event::Text("\n\nHello".into()),
        finished(FinishReason::Stop),
    ];
    let (written, framer) = stream(request, true, events);
    let deltas: Vec<&Value> =
        written.iter().filter(|(name, _)| name == "response.output_text.delta").map(|(_, data)| data).collect();
    let tokens: Vec<&Value> =
        deltas.iter().flat_map(|d| d["logprobs"].as_array().expect("a list")).map(|l| &l["token"]).collect();
    assert_eq!(tokens, [&json!("\n\nHel"), &json!("lo")], "the answer's tokens, with its text");
    let response = framer.into_outcome().expect("completed");
    let OutputItem::Message { content, .. } = &response.output[1] else { panic!("the message second") };
    assert_eq!(content[0].logprobs.len(), 2);
}

#[test]
fn metadata_and_user_are_checked_as_openai_does() {
    use crate::api::limits::metadata::{MAX_KEY_CHARS, MAX_PAIRS, MAX_VALUE_CHARS};
    let store = Arc::new(ResponseStore::new(8));
    let pairs = |n: usize| Value::Object((0..n).map(|i| (format!("k{i}"), json!("v"))).collect());
    assert!(job(json!({"input": "x", "metadata": pairs(MAX_PAIRS), "user": "u-1"}), &store).is_ok());
    let cases = [
        (json!({"metadata": pairs(MAX_PAIRS + 1)}), "metadata", "at most 16 metadata pairs"),
        (json!({"metadata": {"k".repeat(MAX_KEY_CHARS + 1): "v"}}), "metadata.", "key may be at most 64"),
        (json!({"metadata": {"k": "v".repeat(MAX_VALUE_CHARS + 1)}}), "metadata.k", "value may be at most 512"),
        // One 30 MB value was stored and served back before.
        (json!({"metadata": {"k": "v".repeat(30_000_000)}}), "metadata.k", "got 30000000"),
        (json!({"metadata": {"k": {"nested": true}}}), "metadata.k", "must be strings"),
        (json!({"metadata": ["a"]}), "metadata", "must be an object"),
        (json!({"user": "u".repeat(10_000)}), "user", "at most 256 characters"),
    ];
    for (mut body, param, expected) in cases {
        body["input"] = json!("x");
        let error = job(body, &store).err().unwrap_or_else(|| panic!("{expected}: accepted"));
        assert_eq!(error.status(), axum::http::StatusCode::BAD_REQUEST, "{expected}");
        assert!(error.param().is_some_and(|p| p.starts_with(param)), "{expected}: {:?}", error.param());
        assert!(error.to_string().contains(expected), "{expected}: {error}");
    }
}

#[test]
fn the_store_is_bounded_in_bytes_each_response_charged_for_its_chain() {
    let object = |id: &str| {
        let answering = job(json!({"input": "x"}), &Arc::new(ResponseStore::new(0))).expect("accepted").answering;
        ResponseObject { id: id.to_string(), ..answering.in_progress() }
    };
    let turn = |size: usize| vec![ChatMessage::user("x".repeat(size))];
    let store = ResponseStore::bounded(1_000, 1 << 20);
    // Twenty responses of 100 kB each: the store keeps what fits in 1 MiB, newest first.
    for i in 0..20 {
        assert!(store.put(Arc::new(StoredResponse::new(None, turn(100_000), Vec::new(), object(&i.to_string())))));
    }
    let (bytes, count) = store.usage();
    assert!(bytes <= 1 << 20 && (9..=10).contains(&count), "{bytes} bytes in {count}");
    assert!(store.get("19").is_some() && store.get("0").is_none());
    // A chain's later response is charged for the earlier ones it keeps alive.
    let a = Arc::new(StoredResponse::new(None, turn(400_000), Vec::new(), object("a")));
    let b = Arc::new(StoredResponse::new(Some(Arc::clone(&a)), turn(400_000), Vec::new(), object("b")));
    assert!(store.put(Arc::clone(&a)) && store.put(b));
    let (bytes, count) = store.usage();
    assert!(bytes <= 1 << 20, "{bytes}");
    assert!(store.get("b").is_some() && store.get("a").is_none(), "a is charged within b: {count} stored");
    // One larger than the whole store is not stored.
    assert!(!store.put(Arc::new(StoredResponse::new(None, turn(2 << 20), Vec::new(), object("big")))));
    assert!(store.get("big").is_none() && store.get("b").is_some());
    assert!(store.remove("b"));
    assert_eq!(store.usage(), (0, 0));
    // What a response echoes of its request (instructions, tools) counts too.
    let long = job(json!({"input": "x", "instructions": "i".repeat(300_000)}), &Arc::new(ResponseStore::new(0)));
    let echoing = ResponseObject { id: "echo".into(), ..long.expect("accepted").answering.in_progress() };
    assert!(!ResponseStore::bounded(8, 500_000).put(Arc::new(StoredResponse::new(
        None,
        Vec::new(),
        Vec::new(),
        echoing
    ))));
}

#[test]
fn a_chain_is_at_most_the_documented_length() {
    use crate::api::limits::MAX_RESPONSE_CHAIN;
    let store = Arc::new(ResponseStore::new(8));
    let object = |id: &str| {
        let answering = job(json!({"input": "x"}), &Arc::new(ResponseStore::new(0))).expect("accepted").answering;
        ResponseObject { id: id.to_string(), ..answering.in_progress() }
    };
    let mut chain: Option<Arc<StoredResponse>> = None;
    for _ in 0..MAX_RESPONSE_CHAIN - 1 {
        chain = Some(Arc::new(StoredResponse::new(chain, Vec::new(), Vec::new(), object("link"))));
    }
    store.put(Arc::new(StoredResponse::new(chain, Vec::new(), Vec::new(), object("last"))));
    let error = job(json!({"input": "x", "previous_response_id": "last"}), &store).err().expect("refused");
    assert_eq!(error.param().as_deref(), Some("previous_response_id"));
    assert_eq!(error.code(), Some("limit_exceeded"));
    assert!(error.to_string().contains("at most 1024 responses"), "{error}");
}
