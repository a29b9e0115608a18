//! `POST /v1/prefill`: the prompt a chat request would evaluate, evaluated ahead of it (a voice
//! pipeline's partial transcripts), so the final request prefills only the last words.

mod common;

use common::{exclusive_server, long_system_prompt, post};
use serde_json::{json, Value};

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
async fn a_prefill_yields_to_a_waiting_chat_request() {
    let (_guard, server) = exclusive_server().await;
    // Long enough to take many seconds in 128-token chunks on this machine.
    let long = spoken(&long_system_prompt(3000), "Hello");
    let base = server.base.clone();
    let running = tokio::spawn(async move { prefill(&base, &long).await });
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    let (status, answer) = post(&server.base, &spoken("You are brief.", "Say hi.")).await;
    assert_eq!(status, 200, "{answer}");
    let (status, yielded) = running.await.expect("prefill task");
    eprintln!("yielded prefill {yielded}");
    assert_eq!(status, 200, "{yielded}");
    assert_eq!(yielded["complete"], false, "the prefill stopped for the chat request: {yielded}");
    let evaluated = count(&yielded, "cached_tokens") + count(&yielded, "prefilled_tokens");
    assert!(evaluated < count(&yielded, "prompt_tokens"), "{yielded}");
}

#[tokio::test]
async fn a_newer_prefill_replaces_an_older_queued_one() {
    let (_guard, server) = exclusive_server().await;
    let system = long_system_prompt(400);
    // A chat request keeps the engine busy while both prefills queue behind it.
    let base = server.base.clone();
    let mut busy = spoken(&long_system_prompt(1500).replace("Fact", "Note"), "Tell me a long story.");
    busy["max_tokens"] = json!(48);
    let busy = tokio::spawn(async move { post(&base, &busy).await });
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    let base = server.base.clone();
    let older_body = spoken(&system, "What time");
    let older = tokio::spawn(async move { prefill(&base, &older_body).await });
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let (status, newer) = prefill(&server.base, &spoken(&system, "What time is it")).await;
    assert_eq!(status, 200, "{newer}");
    let (status, older) = older.await.expect("older prefill");
    assert_eq!(status, 200, "{older}");
    assert_eq!(busy.await.expect("chat").0, 200);
    eprintln!("older {older}\nnewer {newer}");
    assert_eq!((&older["superseded"], &older["prefilled_tokens"]), (&json!(true), &json!(0)), "{older}");
    assert_eq!((&newer["superseded"], &newer["complete"]), (&json!(false), &json!(true)), "{newer}");
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
