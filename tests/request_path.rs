//! The request path before llama.cpp: incremental tokenization of chat prompts gives exactly
//! the tokens of whole tokenization (property tests over the real templates and tokenizers of
//! SmolLM2 and gemma-3), and every completion reports what its path cost (`timings.request_ms`
//! and its stages, consistent with each other) and `/metrics` counts it.

mod common;

use std::sync::OnceLock;

use common::{exclusive_server, gemma3_path, long_system_prompt, smollm2_path, test_config};
use firstword::chat::{ChatMessage, TemplateKwargs};
use firstword::{Engine, Prompt};
use proptest::prelude::*;
use serde_json::{json, Value};

/// Pieces of message text, special tokens of both vocabularies and their look-alikes among
/// them: a user may type them, and they sit where the text is cut.
const PIECES: &[&str] = &[
    "hello",
    " world",
    "Paris",
    "3.14",
    "\n",
    "\n\n",
    " ",
    "  ",
    "\t",
    "é",
    "日本語",
    "🙂",
    "<|im_start|>",
    "<|im_end|>",
    "<start_of_turn>",
    "<end_of_turn>",
    "<bos>",
    "<eos>",
    "<",
    "|",
    ">",
    "<|",
    "im_start",
    "user",
    "assistant",
    "model",
    "<mask>",
    "</s>",
    ".",
    "?",
    "\"",
    "{\"a\": 1}",
];

fn text() -> impl Strategy<Value = String> {
    proptest::collection::vec(proptest::sample::select(PIECES), 0..10).prop_map(|pieces| pieces.concat())
}

/// What happens to a conversation between two requests.
#[derive(Clone, Debug)]
enum Step {
    /// The reply and the user's next message.
    Turn(String, String),
    /// The last user message grows by a word (a partial transcript).
    Grow(String),
    /// A message is rewritten (a client that edits history).
    Edit(usize, String),
    /// The conversation is cut back to its first messages.
    Truncate(usize),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        3 => (text(), text()).prop_map(|(reply, user)| Step::Turn(reply, user)),
        3 => text().prop_map(Step::Grow),
        1 => (0usize..16, text()).prop_map(|(at, text)| Step::Edit(at, text)),
        1 => (1usize..16).prop_map(Step::Truncate),
    ]
}

/// Applies `step` to a conversation's texts: the system message's, then the user's and the
/// assistant's taking turns, ending with the user's (as every template wants them).
fn apply(texts: &mut Vec<String>, step: &Step) {
    match step {
        Step::Turn(reply, user) => texts.extend([reply.clone(), user.clone()]),
        Step::Grow(word) => {
            let last = texts.len() - 1;
            texts[last] = format!("{} {word}", texts[last]);
        }
        Step::Edit(at, text) => {
            let at = at % texts.len();
            texts[at] = text.clone();
        }
        Step::Truncate(keep) => {
            // System and a user message at least; an odd count ends with the user.
            let keep = (*keep).clamp(2, texts.len());
            texts.truncate(if keep % 2 == 0 { keep } else { keep - 1 });
        }
    }
}

/// The conversation's messages.
fn messages(texts: &[String]) -> Vec<ChatMessage> {
    texts
        .iter()
        .enumerate()
        .map(|(i, text)| match i {
            0 => ChatMessage::system(text.clone()),
            i if i % 2 == 1 => ChatMessage::user(text.clone()),
            _ => ChatMessage::assistant(text.clone()),
        })
        .collect()
}

/// The engine's tokens of the conversation (the incremental path) against whole tokenization
/// of the same rendered text.
fn assert_incremental_equals_whole(engine: &Engine, texts: &[String]) -> Result<(), TestCaseError> {
    let messages = messages(texts);
    let text = engine.chat_prompt_text(&messages, &[], &TemplateKwargs::new()).expect("renders");
    let whole = engine.tokenize_blocking(&Prompt::Text(text.clone())).expect("tokenizes");
    let incremental = engine.tokenize_blocking(&Prompt::chat(messages, Vec::new())).expect("tokenizes");
    prop_assert_eq!(incremental, whole, "text: {:?}", text);
    Ok(())
}

fn smollm2() -> &'static Engine {
    static ENGINE: OnceLock<Engine> = OnceLock::new();
    ENGINE.get_or_init(|| Engine::start(test_config(smollm2_path())).expect("SmolLM2 loads"))
}

fn gemma3() -> &'static Engine {
    static ENGINE: OnceLock<Engine> = OnceLock::new();
    ENGINE.get_or_init(|| Engine::start(test_config(gemma3_path())).expect("gemma-3 loads"))
}

fn conversation_case(engine: &Engine, system: &str, steps: &[Step]) -> Result<(), TestCaseError> {
    let mut texts = vec![system.to_string(), "Hi there".to_string()];
    assert_incremental_equals_whole(engine, &texts)?;
    for step in steps {
        apply(&mut texts, step);
        assert_incremental_equals_whole(engine, &texts)?;
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 40, ..ProptestConfig::default() })]

    /// SmolLM2 (BPE, ChatML): every request of a changing conversation tokenizes as a whole.
    #[test]
    fn smollm2_incremental_tokens_equal_whole_tokenization(
        system in text(),
        steps in proptest::collection::vec(step(), 1..12),
    ) {
        conversation_case(smollm2(), &format!("You are helpful. {system}"), &steps)?;
    }

    /// gemma-3 (SentencePiece, Gemma turns; `\n` is one of its special tokens).
    #[test]
    fn gemma3_incremental_tokens_equal_whole_tokenization(
        system in text(),
        steps in proptest::collection::vec(step(), 1..12),
    ) {
        conversation_case(gemma3(), &format!("You are helpful. {system}"), &steps)?;
    }
}

/// A long system prompt and ten turns, as the request-path target measures it: each request
/// is the last one plus a turn.
#[test]
fn a_long_growing_conversation_tokenizes_as_a_whole() {
    for engine in [smollm2(), gemma3()] {
        let mut texts = vec![long_system_prompt(4000), "Which facts?".to_string()];
        for turn in 0..10 {
            assert_incremental_equals_whole(engine, &texts).expect("equal");
            apply(&mut texts, &Step::Turn(format!("Reply {turn}."), format!("Question {turn}?")));
        }
    }
}

/// The request's stages as its timings report them.
fn stages(timings: &Value) -> Vec<f64> {
    let request = &timings["request"];
    ["read_ms", "parse_ms", "render_ms", "tokenize_ms", "queue_ms", "match_ms"]
        .iter()
        .map(|stage| request[stage].as_f64().unwrap_or_else(|| panic!("no {stage} in {timings}")))
        .collect()
}

#[tokio::test]
async fn completions_report_their_request_path() {
    let (_guard, server) = exclusive_server().await;
    let client = reqwest::Client::new();
    let url = format!("{}/v1/chat/completions", server.base);
    let mut messages = vec![
        json!({"role": "system", "content": long_system_prompt(1500)}),
        json!({"role": "user", "content": "Which facts mention trains?"}),
    ];
    let mut kept = Vec::new();
    for turn in 0..2 {
        let body = json!({"messages": messages, "max_tokens": 4, "temperature": 0});
        let answer: Value = client.post(&url).json(&body).send().await.expect("answers").json().await.expect("json");
        let timings = &answer["timings"];
        let total = timings["request_ms"].as_f64().unwrap_or_else(|| panic!("no request_ms: {answer}"));
        let stages = stages(timings);
        assert!(stages.iter().all(|&ms| ms >= 0.0), "{timings}");
        // The stages are disjoint parts of the path: together no longer than it.
        assert!(stages.iter().sum::<f64>() <= total + 1e-6, "{timings}");
        assert!(total > 0.0, "{timings}");
        kept.push(timings["request"]["tokens_kept"].as_u64().expect("tokens_kept"));
        let reply = answer["choices"][0]["message"]["content"].as_str().unwrap_or_default().to_string();
        messages.push(json!({"role": "assistant", "content": reply}));
        messages.push(json!({"role": "user", "content": format!("And turn {turn}?")}));
    }
    // The second request's prompt starts with the first one's: its tokens were kept.
    assert!(kept[1] > 300, "tokens kept: {kept:?}");

    // Streamed: the last chunk with timings carries them too.
    let body = json!({"messages": messages, "max_tokens": 4, "temperature": 0, "stream": true});
    let text = client.post(&url).json(&body).send().await.expect("answers").text().await.expect("body");
    let timed: Vec<Value> = firstword::bench::sse_data(&text)
        .filter_map(|data| serde_json::from_str::<Value>(data).ok())
        .filter(|chunk| chunk.get("timings").is_some())
        .collect();
    assert_eq!(timed.len(), 1, "{text}");
    let total = timed[0]["timings"]["request_ms"].as_f64().expect("request_ms");
    assert!(stages(&timed[0]["timings"]).iter().sum::<f64>() <= total + 1e-6, "{text}");

    let metrics =
        client.get(format!("{}/metrics", server.base)).send().await.expect("metrics").text().await.expect("text");
    for stage in ["total", "read", "parse", "render", "tokenize", "queue", "match"] {
        let count = format!("firstword_request_path_seconds_count{{stage=\"{stage}\"}}");
        let line = metrics.lines().find(|l| l.starts_with(&count)).unwrap_or_else(|| panic!("no {count}: {metrics}"));
        let n: f64 = line.rsplit(' ').next().and_then(|n| n.parse().ok()).expect("a count");
        assert!(n >= 3.0, "{line}");
    }
}
