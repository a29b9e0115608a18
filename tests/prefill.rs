//! `POST /v1/prefill`: the prompt a chat request would evaluate, evaluated ahead of it (a voice
//! pipeline's partial transcripts), so the final request prefills only the last words. The
//! tests about the queue hold the engine at a failpoint (the `failpoints` feature) and go on
//! from what they observe, never from how long a prefill takes.

mod common;

use std::time::Duration;

use common::{exclusive_server, long_system_prompt, post, until, Hold, SharedServer};
use fail::FailScenario;
use firstword::EngineConfig;
use serde_json::{json, Value};

/// A server whose queue holds two requests besides the one served.
async fn small_queue_server() -> (common::ServerLock, &'static common::TestServer) {
    static SERVER: SharedServer =
        SharedServer::configured(|| EngineConfig { queue_size: 2, ..common::test_config(common::smollm2_path()) });
    SERVER.exclusive().await
}

/// `task`'s answer, which must come while the engine is still held (failing after two
/// minutes instead of waiting forever).
async fn answered<T>(task: tokio::task::JoinHandle<T>) -> T {
    tokio::time::timeout(Duration::from_secs(120), task).await.expect("answered at once").expect("task")
}

/// Posts `body` to `/v1/prefill`; returns the status and the JSON answer.
async fn prefill(base: &str, body: &Value) -> (u16, Value) {
    let response = reqwest::Client::new().post(format!("{base}/v1/prefill")).json(body).send().await.expect("request");
    let status = response.status().as_u16();
    (status, response.json().await.expect("JSON body"))
}

/// A conversation with a long system prompt whose user turn says `words` so far.
fn spoken(system: &str, words: &str) -> Value {
    json!({"messages": [{"role": "system", "content": system}, {"role": "user", "content": words}],
        "max_tokens": 8, "temperature": 0})
}

fn count(value: &Value, field: &str) -> u64 {
    value[field].as_u64().unwrap_or_else(|| panic!("{field} in {value}"))
}

#[tokio::test]
async fn the_final_request_pays_only_for_the_last_words() {
    let (_guard, server) = exclusive_server().await;
    let system = long_system_prompt(800);
    let (status, partial) = prefill(&server.base, &spoken(&system, "What is the weather like in")).await;
    assert_eq!(status, 200, "{partial}");
    assert_eq!(partial["object"], "prefill");
    assert_eq!((&partial["complete"], &partial["superseded"]), (&json!(true), &json!(false)), "{partial}");
    let prompt_tokens = count(&partial, "prompt_tokens");
    assert!(prompt_tokens > 700, "{partial}");
    assert_eq!(count(&partial, "cached_tokens") + count(&partial, "prefilled_tokens"), prompt_tokens, "{partial}");
    assert!(partial["timings"]["cache"]["source"].is_string(), "{partial}");

    let (status, answer) = post(&server.base, &spoken(&system, "What is the weather like in Paris today?")).await;
    assert_eq!(status, 200, "{answer}");
    let cached = answer["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().expect("cached_tokens");
    let prompt = answer["usage"]["prompt_tokens"].as_u64().expect("prompt_tokens");
    eprintln!("prefill {partial}\nfinal usage {}", answer["usage"]);
    // The partial prompt ends with the user turn's end and the generation prompt, which the
    // final one has after more words: everything before them was cached.
    assert!(cached + 8 >= prompt_tokens, "cached {cached} of the prefilled {prompt_tokens}");
    assert!(prompt - cached <= 16, "the final request evaluated {} tokens", prompt - cached);
    assert_eq!(answer["timings"]["cache"]["source"], "live", "{}", answer["timings"]);
}

#[tokio::test]
async fn a_revised_partial_transcript_redoes_only_what_changed() {
    let (_guard, server) = exclusive_server().await;
    let system = long_system_prompt(600);
    let (_, first) = prefill(&server.base, &spoken(&system, "I would like to book a flight to Boston")).await;
    // The recogniser revises its earlier words.
    let (status, revised) = prefill(&server.base, &spoken(&system, "I would like to book a fight")).await;
    assert_eq!(status, 200, "{revised}");
    eprintln!("first {first}\nrevised {revised}");
    assert!(count(&revised, "cached_tokens") + 12 >= count(&first, "prompt_tokens"), "{revised}");
    assert!(count(&revised, "prefilled_tokens") <= 10, "only the revised words: {revised}");
    assert_eq!(revised["timings"]["cache"]["source"], "live", "{revised}");
}

#[tokio::test]
#[cfg_attr(not(feature = "failpoints"), ignore = "holds the engine at a failpoint: needs --features failpoints")]
async fn a_prefill_yields_to_a_waiting_chat_request() {
    let (_guard, server) = exclusive_server().await;
    let _scenario = FailScenario::setup();
    let long = spoken(&long_system_prompt(3000), "Hello");
    let base = server.base.clone();
    // The prefill is held between two chunks while the chat request queues behind it.
    let hold = Hold::at("engine::prefill_chunk");
    let running = tokio::spawn(async move { prefill(&base, &long).await });
    hold.reached().await;
    let base = server.base.clone();
    let chat = tokio::spawn(async move { post(&base, &spoken("You are brief.", "Say hi.")).await });
    until(&server.engine, "the chat request is queued", |engine| engine.load().waiting == 1).await;
    hold.release();
    let (status, answer) = chat.await.expect("chat task");
    assert_eq!(status, 200, "{answer}");
    let (status, yielded) = running.await.expect("prefill task");
    eprintln!("yielded prefill {yielded}");
    assert_eq!(status, 200, "{yielded}");
    assert_eq!(yielded["complete"], false, "the prefill stopped for the chat request: {yielded}");
    let evaluated = count(&yielded, "cached_tokens") + count(&yielded, "prefilled_tokens");
    assert!(evaluated < count(&yielded, "prompt_tokens"), "{yielded}");
}

#[tokio::test]
#[cfg_attr(not(feature = "failpoints"), ignore = "holds the engine at a failpoint: needs --features failpoints")]
async fn a_newer_prefill_replaces_an_older_queued_one() {
    let (_guard, server) = exclusive_server().await;
    let _scenario = FailScenario::setup();
    let system = long_system_prompt(400);
    // A chat request, held at its first token, keeps the engine busy while both prefills
    // queue behind it.
    let hold = Hold::at("engine::token");
    let base = server.base.clone();
    let busy = spoken(&long_system_prompt(600).replace("Fact", "Note"), "Tell me a story.");
    let busy = tokio::spawn(async move { post(&base, &busy).await });
    hold.reached().await;
    let base = server.base.clone();
    let older_body = spoken(&system, "What time");
    let older = tokio::spawn(async move { prefill(&base, &older_body).await });
    until(&server.engine, "the older prefill is queued", |engine| engine.load().waiting == 1).await;
    let base = server.base.clone();
    let newer_body = spoken(&system, "What time is it");
    let newer = tokio::spawn(async move { prefill(&base, &newer_body).await });
    // Answered as soon as the newer one is queued, the engine still held.
    let (status, older) = answered(older).await;
    assert_eq!(status, 200, "{older}");
    assert_eq!(server.engine.load().waiting, 1, "the older prefill gave its place back");
    hold.release();
    let (status, newer) = newer.await.expect("newer prefill");
    assert_eq!(status, 200, "{newer}");
    assert_eq!(busy.await.expect("chat").0, 200);
    eprintln!("older {older}\nnewer {newer}");
    assert_eq!((&older["superseded"], &older["prefilled_tokens"]), (&json!(true), &json!(0)), "{older}");
    assert_eq!((&newer["superseded"], &newer["complete"]), (&json!(false), &json!(true)), "{newer}");
}

#[tokio::test]
#[cfg_attr(not(feature = "failpoints"), ignore = "holds the engine at a failpoint: needs --features failpoints")]
async fn prefills_sent_every_few_words_never_fill_the_queue() {
    let (_guard, server) = small_queue_server().await;
    let _scenario = FailScenario::setup();
    let system = long_system_prompt(300);
    // A long reply is being spoken (held at its first token) while the user's next words
    // arrive: one prefill per few words, more than the queue's two places.
    let hold = Hold::at("engine::token");
    let base = server.base.clone();
    let speaking = spoken(&system, "Tell me a story.");
    let speaking = tokio::spawn(async move { post(&base, &speaking).await });
    hold.reached().await;
    let words = ["Tell", "Tell me", "Tell me about", "Tell me about the", "Tell me about the weather"];
    let mut waiting = None;
    for partial in words {
        let base = server.base.clone();
        let body = spoken(&system, partial);
        let queued = tokio::spawn(async move { prefill(&base, &body).await });
        if let Some(older) = waiting.replace(queued) {
            let (status, older) = answered(older).await;
            assert_eq!((status, &older["superseded"]), (200, &json!(true)), "{older}");
        }
        until(&server.engine, "the prefill is queued", |engine| engine.load().waiting == 1).await;
    }
    // The end of speech: the last place is free for it.
    let base = server.base.clone();
    let final_body = spoken(&system, "Tell me about the weather today.");
    let last = tokio::spawn(async move { post(&base, &final_body).await });
    until(&server.engine, "the final request is queued", |engine| engine.load().waiting == 2).await;
    hold.release();
    let (status, answer) = last.await.expect("final request");
    assert_eq!(status, 200, "the final request was queued: {answer}");
    let (status, newest) = waiting.expect("a prefill").await.expect("newest prefill");
    assert_eq!((status, &newest["superseded"]), (200, &json!(false)), "{newest}");
    assert_eq!(speaking.await.expect("reply").0, 200);
}

#[tokio::test]
#[cfg_attr(not(feature = "failpoints"), ignore = "holds the engine at a failpoint: needs --features failpoints")]
async fn a_prefill_refused_for_a_full_queue_supersedes_nothing() {
    let (_guard, server) = small_queue_server().await;
    let _scenario = FailScenario::setup();
    let system = long_system_prompt(300);
    let hold = Hold::at("engine::token");
    let base = server.base.clone();
    let busy = spoken(&system, "Tell me a story.");
    let busy = tokio::spawn(async move { post(&base, &busy).await });
    hold.reached().await;
    let base = server.base.clone();
    let queued_body = spoken(&system, "What time");
    let queued = tokio::spawn(async move { prefill(&base, &queued_body).await });
    until(&server.engine, "the prefill is queued", |engine| engine.load().waiting == 1).await;
    let base = server.base.clone();
    let behind = tokio::spawn(async move { post(&base, &spoken("You are brief.", "Say hi.")).await });
    until(&server.engine, "the queue is full", |engine| engine.load().waiting == 2).await;
    let (status, refused) = prefill(&server.base, &spoken(&system, "What time is it")).await;
    assert_eq!(status, 503, "{refused}");
    hold.release();
    let (status, queued) = queued.await.expect("queued prefill");
    assert_eq!(status, 200, "{queued}");
    assert_eq!(queued["superseded"], false, "the refused prefill replaced nothing: {queued}");
    assert_eq!(behind.await.expect("chat").0, 200);
    assert_eq!(busy.await.expect("chat").0, 200);
}

#[tokio::test]
async fn bad_input_gets_the_same_answer_as_chat_completions() {
    let (_guard, server) = exclusive_server().await;
    let bad = [
        json!({"messages": []}),
        json!({"messages": [{"role": "wizard", "content": "hi"}]}),
        json!({"messages": [{"role": "user", "content": "hi"}], "n": 2}),
        json!({"messages": [{"role": "user", "content": "hi"}], "tool_choice": "required"}),
        json!({"messages": "hi"}),
    ];
    for body in bad {
        let (chat_status, chat) = post(&server.base, &body).await;
        let (status, answer) = prefill(&server.base, &body).await;
        assert!((400..500).contains(&status), "{body} → {status} {answer}");
        assert_eq!((status, &answer["error"]), (chat_status, &chat["error"]), "{body}");
    }
    let (status, _) = post(&server.base, &spoken("You are brief.", "Still up?")).await;
    assert_eq!(status, 200, "the server is still serving");
}

/// The library call behind the endpoint: `Engine::prefill`, then the request itself.
#[tokio::test]
async fn the_library_prefills_then_generates_from_the_cache() {
    let (_guard, server) = exclusive_server().await;
    let messages = |words: &str| {
        vec![firstword::ChatMessage::system(long_system_prompt(500)), firstword::ChatMessage::user(words)]
    };
    let request = |words: &str| firstword::GenerationRequest {
        max_tokens: Some(4),
        sampling: firstword::SamplingParams::greedy(),
        ..firstword::GenerationRequest::chat(messages(words))
    };
    let report = server.engine.prefill(request("Turn on the")).expect("queued").wait().await.expect("prefilled");
    assert!(report.complete && !report.superseded, "{report:?}");
    assert_eq!(report.cached_tokens + report.prefilled_tokens, report.prompt_tokens, "{report:?}");
    let mut generation = server.engine.submit(request("Turn on the kitchen lights.")).expect("submitted");
    let usage = loop {
        match generation.next().await.expect("an event") {
            firstword::Event::Finished { usage, .. } => break usage,
            firstword::Event::Failed(e) => panic!("{e}"),
            _ => {}
        }
    };
    assert!(usage.cached_tokens + 8 >= report.prompt_tokens, "{usage:?} after {report:?}");
}
