//! Every cache miss explained: each `timings.cache.reason` produced by a real request, with
//! the source the reused tokens came from and where the prompt diverged.

mod common;

use std::time::Duration;

use common::one_sequence_config as test_config;
use common::{gemma3_path, generate, long_system_prompt, settled_cache, smollm2_path, Generated};
use firstword::{
    CacheMiss, CacheReport, CacheSource, ChatMessage, Engine, EngineConfig, GenerationRequest, Prompt, SamplingParams,
};

/// Slack between a turn's prompt and what the next turn reuses: the reply's last tokens may be
/// re-split by the next turn's text.
const SLACK: u32 = 8;

/// A greedy chat request of at most `max_tokens`.
fn ask(engine: &Engine, messages: &[ChatMessage], max_tokens: u32) -> Generated {
    let request = GenerationRequest {
        prompt: Prompt::chat(messages.to_vec(), Vec::new()),
        max_tokens: Some(max_tokens),
        sampling: SamplingParams::greedy(),
        ..GenerationRequest::chat(Vec::new())
    };
    generate(engine, request)
}

/// The cache report's source and reason.
fn outcome(cache: &CacheReport) -> (CacheSource, Option<CacheMiss>) {
    (cache.source, cache.reason)
}

#[test]
fn each_reason_of_a_smollm2_conversation() {
    let engine = Engine::start(test_config(smollm2_path())).expect("model loads");
    let system = long_system_prompt(500);
    let mut messages = vec![ChatMessage::system(&system), ChatMessage::user("Which facts mention trains?")];

    let turn1 = ask(&engine, &messages, 12);
    let cache = turn1.timings.cache;
    assert_eq!(outcome(&cache), (CacheSource::None, Some(CacheMiss::Cold)), "{cache:?}");
    assert_eq!((cache.reused, cache.prefilled), (0, turn1.usage.prompt_tokens), "{cache:?}");
    assert!(turn1.usage.prompt_tokens > 300, "{:?}", turn1.usage);

    // The next turn continues everything the cache holds: a hit, nothing to explain.
    messages.push(ChatMessage::assistant(turn1.text.clone()));
    messages.push(ChatMessage::user("And gardens?"));
    let turn2 = ask(&engine, &messages, 12);
    let cache = turn2.timings.cache;
    assert_eq!(outcome(&cache), (CacheSource::Live, None), "{cache:?}");
    assert_eq!(cache.diverged_at, None, "{cache:?}");
    assert!(cache.reused + SLACK >= turn1.usage.prompt_tokens, "{cache:?}");
    assert_eq!(cache.reused + cache.prefilled, turn2.usage.prompt_tokens);
    assert_eq!(cache.reused, turn2.usage.cached_tokens);

    // The same prompt again (a regenerated reply): the cache holds it and the reply after it.
    let again = ask(&engine, &messages, 12);
    let cache = again.timings.cache.clone();
    assert_eq!(outcome(&cache), (CacheSource::Live, Some(CacheMiss::PromptShorter)), "{cache:?}");
    assert_eq!(cache.diverged_at, Some(turn2.usage.prompt_tokens), "{cache:?}");
    assert_eq!(cache.reused, turn2.usage.prompt_tokens - 1, "{cache:?}");

    // A client that rewrites the assistant's reply (dropped reasoning, say): history changed.
    let mut rewritten = messages.clone();
    rewritten[2] = ChatMessage::assistant("Facts 3 and 7 mention trains.");
    let edited = ask(&engine, &rewritten, 12);
    let cache = edited.timings.cache.clone();
    assert_eq!(outcome(&cache), (CacheSource::Live, Some(CacheMiss::HistoryChanged)), "{cache:?}");
    let at = cache.diverged_at.expect("diverged");
    assert!(at + SLACK >= turn1.usage.prompt_tokens && at < turn2.usage.prompt_tokens, "{cache:?}");
    assert_eq!(cache.reused, at, "{cache:?}");

    // Another system prompt: diverged inside the first message. The conversation's state is
    // saved to the store on the way out...
    let other = [ChatMessage::system(long_system_prompt(450).replace("Fact", "Note")), ChatMessage::user("Hello")];
    let job = ask(&engine, &other, 4);
    let cache = job.timings.cache.clone();
    assert_eq!(cache.reason, Some(CacheMiss::SystemPromptChanged), "{cache:?}");
    assert!(cache.diverged_at.expect("diverged") < 40, "{cache:?}");
    assert!(cache.save.is_some(), "the conversation was saved: {cache:?}");

    // ...and comes back from it.
    let back = ask(&engine, &rewritten, 12);
    let cache = back.timings.cache.clone();
    assert_eq!(outcome(&cache), (CacheSource::Ram, Some(CacheMiss::Restored)), "{cache:?}");
    assert!(cache.restore.is_some(), "{cache:?}");
    assert!(cache.reused + SLACK >= edited.usage.prompt_tokens, "{cache:?}");
    assert_eq!(back.text, edited.text, "the restored conversation answers as the live one did");
}

#[test]
fn an_entry_evicted_for_the_budget_is_reported_as_evicted() {
    // About 23 KB of SmolLM2 state per token: a 400-token conversation takes about 9 MiB, so
    // 14 MiB holds one of them, never two (checked below from the store's own figures).
    let config = EngineConfig { cache_ram_mib: 14, ..test_config(smollm2_path()) };
    let engine = Engine::start(config).expect("model loads");
    let conversation = |topic: &str| {
        let system = long_system_prompt(400).replace("Fact", topic);
        [ChatMessage::system(system), ChatMessage::user("Summarize.")]
    };
    let (a, b, c) = (conversation("alpha"), conversation("beta"), conversation("gamma"));
    ask(&engine, &a, 4);
    ask(&engine, &b, 4);
    let status = settled_cache(&engine);
    let entry = status.entries.first().expect("a was saved when b took the context");
    assert!(entry.bytes * 2 > status.budget_bytes && entry.bytes <= status.budget_bytes, "{status:?}");
    ask(&engine, &c, 4);
    assert_eq!(settled_cache(&engine).entries.len(), 1, "saving b evicted a");
    let cache = ask(&engine, &a, 4).timings.cache;
    assert_eq!(outcome(&cache), (CacheSource::Live, Some(CacheMiss::Evicted)), "{cache:?}");
}

#[test]
fn a_window_the_small_swa_cache_dropped_is_reported_as_swa_window() {
    // The store off: nothing else could serve the edited turn.
    // One sequence: llama.cpp keeps a window per sequence, and this needs the one window.
    let config = EngineConfig { swa_full: false, cache_ram_mib: 0, parallel: 1, ..test_config(gemma3_path()) };
    let engine = Engine::start(config).expect("gemma-3 loads");
    let system = long_system_prompt(1200);
    let mut messages = vec![ChatMessage::system(&system), ChatMessage::user("Which facts mention trains?")];
    let turn1 = ask(&engine, &messages, 8);
    assert!(turn1.usage.prompt_tokens > 1100, "well past the 512-token window: {:?}", turn1.usage);
    // An edit early in the system prompt, far behind the window.
    messages[0] = ChatMessage::system(system.replacen("Fact", "Note", 3));
    let edited = ask(&engine, &messages, 8);
    let cache = edited.timings.cache.clone();
    assert_eq!(outcome(&cache), (CacheSource::None, Some(CacheMiss::SwaWindow)), "{cache:?}");
    assert!(cache.diverged_at.expect("diverged") + 600 < turn1.usage.prompt_tokens, "{cache:?}");
    assert_eq!(cache.reused, 0);
}

/// After a reply the engine evaluates what the template writes before the next user's words
/// (`<|im_end|>\n<|im_start|>user\n` here), so the next turn prefills only those words and its
/// generation prompt; the answer is the same as without it.
///
/// With a grace for a request sent right after the reply (`next_request_grace`, long here so
/// that the timing is forced), turn 2 submitted as soon as turn 1 finished is served before
/// any of that preparation: it caches what an engine without anticipation caches, with the
/// same answer. A command that is no request (waiting for idle) ends the grace and the
/// preparation runs as without one.
#[test]
fn the_next_turns_opening_is_evaluated_after_the_reply() {
    let turn2 = |anticipate: bool, grace: Duration, settle: bool| {
        let config =
            EngineConfig { anticipate_next_turn: anticipate, next_request_grace: grace, ..test_config(smollm2_path()) };
        let engine = Engine::start(config).expect("model loads");
        let mut messages =
            vec![ChatMessage::system(long_system_prompt(300)), ChatMessage::user("Which facts mention trains?")];
        let turn1 = ask(&engine, &messages, 12);
        if settle {
            engine.wait_idle_blocking();
        }
        messages.push(ChatMessage::assistant(turn1.text));
        messages.push(ChatMessage::user("And gardens?"));
        ask(&engine, &messages, 12)
    };
    let grace = Duration::from_secs(30);
    let (with, without) = (turn2(true, Duration::ZERO, false), turn2(false, Duration::ZERO, false));
    let (followed, settled) = (turn2(true, grace, false), turn2(true, grace, true));
    eprintln!("followed at once {:?}, after idle {:?}", followed.timings.cache, settled.timings.cache);
    assert_eq!(followed.usage, without.usage, "the request sent at once did not wait for the preparation");
    assert_eq!(followed.text, without.text);
    assert_eq!(settled.usage, with.usage, "waiting for idle ended the grace: the turn was prepared");
    assert_eq!(settled.text, with.text);
    eprintln!("anticipated {:?}, plain {:?}", with.timings.cache, without.timings.cache);
    assert_eq!(outcome(&with.timings.cache), (CacheSource::Live, None));
    assert!(
        with.usage.cached_tokens >= without.usage.cached_tokens + 3,
        "the opening was cached: {:?} vs {:?}",
        with.usage,
        without.usage
    );
    assert_eq!(with.usage.prompt_tokens, without.usage.prompt_tokens);
    assert_eq!(with.text, without.text, "the same answer either way");
}
