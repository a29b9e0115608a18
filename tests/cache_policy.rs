//! The cache policy's decisions, end to end on real models and fixtures: a conversation
//! shortened by `--context-overflow drop-oldest` forgets only its own older form, never another
//! conversation's live state (F2); on models whose cache cannot be cut, partial transcripts stop
//! before their last word so the request continues them, and a revised word goes back to the
//! turn's opening, not to the previous turn (F3). Outputs are compared with a fresh context
//! that evaluates the same split.

mod common;

use common::one_sequence_config as test_config;
use common::{chat, fresh_split, greedy, long_system_prompt, model_path, smollm2_path, Generated};
use firstword::engine::ContextOverflow;
use firstword::{CacheSource, ChatMessage, Engine, EngineConfig, GenerationRequest, PrefillReport, SamplingParams};

/// A user message of roughly `words` words, numbered so no two are alike.
fn long_message(n: usize, words: usize) -> String {
    let mut text = format!("Note {n}:");
    for i in 0..words {
        text.push_str(&format!(" item{}", n * 1000 + i));
    }
    text
}

/// F2: conversation A grows past the context and is shortened by its oldest turns at every
/// turn; conversation B alternates with it. Each B turn continues B's previous prompt from the
/// state store: A's shortened turns displace B's live state, and it is saved, not forgotten.
#[test]
fn a_conversation_shortened_by_drop_oldest_keeps_another_conversation_s_cache() {
    let config = EngineConfig {
        ctx_size: Some(2048),
        context_overflow: ContextOverflow::DropOldest,
        cache_min_tokens: 64,
        ..test_config(smollm2_path())
    };
    let engine = Engine::start(config.clone()).expect("SmolLM2 loads");
    let mut a = vec![ChatMessage::system("You keep notes for the user. Answer in one word.")];
    let mut b = vec![ChatMessage::system(long_system_prompt(500)), ChatMessage::user("Which facts mention trains?")];
    let mut b_before: Option<Generated> = None;
    let mut checked = 0;
    for n in 0..24 {
        a.push(ChatMessage::user(long_message(n, 60)));
        let turn_a = greedy(&engine, chat(&a), 4);
        a.push(ChatMessage::assistant(turn_a.text.clone()));
        let shortened = turn_a.usage.dropped_messages > 0;

        let turn_b = greedy(&engine, chat(&b), 4);
        let cache = turn_b.timings.cache.clone();
        eprintln!(
            "turn {n}: A {:?} dropped {}; B {:?} {cache:?}",
            turn_a.usage, turn_a.usage.dropped_messages, turn_b.usage
        );
        if let (Some(before), true) = (&b_before, shortened) {
            // A shortened conversation displaced B: B's next turn continues its previous one.
            assert!(
                turn_b.usage.cached_tokens + 8 >= before.usage.prompt_tokens,
                "turn {n}: B reused {} of its previous {} prompt tokens: {cache:?}",
                turn_b.usage.cached_tokens,
                before.usage.prompt_tokens
            );
            assert_eq!(cache.source, CacheSource::Ram, "turn {n}: {cache:?}");
            checked += 1;
        }
        b.push(ChatMessage::assistant(turn_b.text.clone()));
        b.push(ChatMessage::user(format!("And fact {n}?")));
        b_before = Some(turn_b);
        if checked >= 3 {
            break;
        }
    }
    assert!(checked >= 3, "conversation A was shortened on {checked} turns");
}

/// A greedy chat request.
fn request(messages: &[ChatMessage], max_tokens: u32) -> GenerationRequest {
    GenerationRequest {
        max_tokens: Some(max_tokens),
        sampling: SamplingParams::greedy(),
        ..GenerationRequest::chat(messages.to_vec())
    }
}

fn prefill(engine: &Engine, messages: &[ChatMessage]) -> PrefillReport {
    engine.prefill(request(messages, 8)).expect("queued").wait_blocking().expect("prefilled")
}

/// F3: a spoken turn prefilled every 3 words on a model whose cache cannot be cut. Each
/// partial stops before its last word (the next one continues it), and the request evaluates
/// exactly what the last partial left: its last word and the generation prompt. A revised
/// earlier word goes back to the checkpoint where the turn opens, not to the previous turn's.
fn partials_leave_the_request_only_the_last_word(fixture: &str) {
    let config = EngineConfig { cache_min_tokens: 32, ..test_config(model_path(fixture)) };
    let engine = Engine::start(config.clone()).expect("fixture loads");
    let mut messages =
        vec![ChatMessage::system(long_system_prompt(300)), ChatMessage::user("Which facts mention trains?")];
    let turn1 = greedy(&engine, chat(&messages), 8);
    messages.push(ChatMessage::assistant(turn1.text.clone()));

    let words = "please turn on the lights in the kitchen and then tell me what the weather is";
    let words: Vec<&str> = words.split(' ').collect();
    let spoken = |n: usize| [messages.clone(), vec![ChatMessage::user(words[..n].join(" "))]].concat();
    let mut last = None;
    for n in [3, 6, 9, 12, 15] {
        let report = prefill(&engine, &spoken(n));
        eprintln!("{fixture}: partial of {n} words {report:?}");
        assert!(report.complete, "{report:?}");
        if n > 3 {
            assert_eq!(
                report.timings.cache.source,
                CacheSource::Live,
                "{n} words continue the last partial: {report:?}"
            );
        }
        assert!(
            report.cached_tokens + report.prefilled_tokens < report.prompt_tokens,
            "a partial stops before its last word: {report:?}"
        );
        last = Some(report);
    }
    let last = last.expect("partials");
    let left = last.prompt_tokens - last.cached_tokens - last.prefilled_tokens;
    let final_messages = spoken(15);
    let answer = greedy(&engine, chat(&final_messages), 8);
    eprintln!("{fixture}: the request {:?} {:?}", answer.usage, answer.timings.cache);
    assert_eq!(answer.usage.prompt_tokens, last.prompt_tokens);
    assert_eq!(answer.timings.cache.source, CacheSource::Live, "{:?}", answer.timings.cache);
    assert_eq!(
        answer.usage.prompt_tokens - answer.usage.cached_tokens,
        left,
        "the request evaluates only what the last partial left"
    );
    let fresh = fresh_split(&config, &chat(&final_messages), answer.usage.cached_tokens, 8);
    assert_eq!(answer.text, fresh.text, "{fixture}: continuing the partials changed the output");

    // The recogniser revises an earlier word: back to where the turn opens.
    let mut revised = spoken(15);
    revised.last_mut().expect("the user turn").content = "please turn off the lights in the hall".into();
    let report = prefill(&engine, &revised);
    eprintln!("{fixture}: revised partial {report:?}");
    assert_eq!(report.timings.cache.source, CacheSource::Checkpoint, "{report:?}");
    assert!(
        report.cached_tokens > turn1.usage.prompt_tokens + turn1.usage.completion_tokens.saturating_sub(2),
        "the checkpoint holds the previous turn and its reply: {report:?} after {:?}",
        turn1.usage
    );
}

#[test]
fn partials_on_a_hybrid_model_leave_the_request_only_the_last_word() {
    partials_leave_the_request_only_the_last_word("tiny-lfm2.gguf");
}

#[test]
fn partials_on_a_recurrent_model_leave_the_request_only_the_last_word() {
    partials_leave_the_request_only_the_last_word("tiny-mamba.gguf");
}

/// F13: the conversation is copied for the disk cache when the engine has been idle after a
/// reply, never between a reply and a request that follows it at once (a tool result): that
/// request never waits for the copy. With the idle time set far beyond the test, no copy
/// happens until the test asks the engine to settle; then exactly one, of the last turn.
#[test]
#[cfg_attr(not(feature = "failpoints"), ignore = "counts copies at a failpoint: needs --features failpoints")]
fn the_copy_for_the_disk_cache_waits_for_idle_time_not_for_the_next_request() {
    let dir = std::env::temp_dir().join(format!("firstword-idle-persist-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let config = EngineConfig {
        cache_dir: Some(dir.clone()),
        cache_min_tokens: 32,
        persist_after_idle: std::time::Duration::from_secs(3600),
        ..test_config(smollm2_path())
    };
    let copies = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = std::sync::Arc::clone(&copies);
    fail::cfg_callback("engine::persist", move || {
        counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    })
    .expect("failpoint");
    let engine = Engine::start(config).expect("SmolLM2 loads");
    let mut messages =
        vec![ChatMessage::system(long_system_prompt(300)), ChatMessage::user("Which facts mention trains?")];
    let turn1 = greedy(&engine, chat(&messages), 8);
    // The client answers at once (a tool result would): nothing was copied in between.
    messages.push(ChatMessage::assistant(turn1.text.clone()));
    messages.push(ChatMessage::user("And gardens?"));
    let turn2 = greedy(&engine, chat(&messages), 8);
    assert!(turn2.usage.cached_tokens > turn1.usage.prompt_tokens, "{:?}", turn2.usage);
    assert_eq!(copies.load(std::sync::atomic::Ordering::SeqCst), 0, "a copy ran between the turns");
    // Settled (what an idle engine does): one copy, of the conversation as it is now.
    engine.wait_idle_blocking();
    assert_eq!(copies.load(std::sync::atomic::Ordering::SeqCst), 1);
    assert_eq!(engine.cache_status().disk.expect("disk cache on").entries.len(), 1);
    engine.wait_idle_blocking();
    assert_eq!(copies.load(std::sync::atomic::Ordering::SeqCst), 1, "nothing changed since: no second copy");
    fail::remove("engine::persist");
    drop(engine);
    let _ = std::fs::remove_dir_all(&dir);
}
