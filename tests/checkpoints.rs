//! Checkpoints for models whose cache cannot be cut where a prompt diverges: recurrent-only
//! (Mamba) and hybrid (LFM2) fixtures, generated with SmolLM2's tokenizer, and gemma-3 with
//! the small SWA cache. A turn that rewrites history is served from the newest checkpoint at
//! or before the divergence, not prefilled in full, and answers exactly as a fresh context
//! evaluating the same split.

mod common;

use std::path::Path;

use common::{
    chat, fresh_split, gemma3_path, greedy, long_system_prompt, model_path, settled_cache, test_config, Generated,
};
use firstword::{CacheMiss, CacheSource, ChatMessage, Engine, EngineConfig, Prompt};

/// Settings that save prompts of 32 tokens or more.
fn config(model: &Path) -> EngineConfig {
    EngineConfig { cache_min_tokens: 32, ..test_config(model.to_path_buf()) }
}

/// Turn 1, then turn 2 with turn 1's reply rewritten by the client (as a template that drops
/// reasoning would): returns both.
fn rewritten_turn2(engine: &Engine) -> (Generated, Generated, Prompt) {
    let mut messages =
        vec![ChatMessage::system(long_system_prompt(300)), ChatMessage::user("Which facts mention trains?")];
    let turn1 = greedy(engine, chat(&messages), 12);
    messages.push(ChatMessage::assistant("Facts 3 and 11 mention trains."));
    messages.push(ChatMessage::user("And gardens?"));
    let prompt = chat(&messages);
    let turn2 = greedy(engine, prompt.clone(), 12);
    (turn1, turn2, prompt)
}

fn turn2_comes_from_the_prompt_checkpoint(model: &str) {
    let path = model_path(model);
    let config = config(&path);
    let engine = Engine::start(config.clone()).expect("fixture loads");
    let (turn1, turn2, prompt) = rewritten_turn2(&engine);
    let cache = turn2.timings.cache;
    eprintln!("{model}: turn 1 {:?}, turn 2 {:?} {cache:?}", turn1.usage, turn2.usage);
    assert!(turn1.usage.prompt_tokens > 300, "{:?}", turn1.usage);
    assert_eq!((cache.source, cache.reason), (CacheSource::Checkpoint, Some(CacheMiss::Checkpoint)), "{cache:?}");
    assert_eq!(cache.reused, turn1.usage.prompt_tokens, "the checkpoint holds turn 1's whole prompt");
    assert_eq!(cache.diverged_at, None, "the prompt continues the checkpoint: {cache:?}");
    assert!(!turn2.text.is_empty());
    let fresh = fresh_split(&config, &prompt, cache.reused, 12);
    assert_eq!(turn2.text, fresh.text, "{model}: the checkpoint changed the output");

    // The same turns with the store off: the cache cannot be cut there, so all is prefilled.
    let off = Engine::start(EngineConfig { cache_ram_mib: 0, ..config }).expect("fixture loads");
    let (_, turn2_off, _) = rewritten_turn2(&off);
    let cache = turn2_off.timings.cache;
    assert_eq!((cache.source, cache.reason), (CacheSource::None, Some(CacheMiss::CannotRewind)), "{cache:?}");
    assert_eq!(cache.reused, 0);
    assert_eq!(turn2_off.text, turn2.text);
}

#[test]
fn a_recurrent_model_serves_a_rewritten_turn_from_a_checkpoint() {
    turn2_comes_from_the_prompt_checkpoint("tiny-mamba.gguf");
}

#[test]
fn a_hybrid_model_serves_a_rewritten_turn_from_a_checkpoint() {
    turn2_comes_from_the_prompt_checkpoint("tiny-lfm2.gguf");
}

/// A long prefill leaves a checkpoint every `checkpoint_every` tokens: a prompt that diverges
/// inside the system prompt restarts from the newest one at or before the divergence.
#[test]
fn a_long_prefill_leaves_periodic_checkpoints() {
    let path = model_path("tiny-lfm2.gguf");
    // Batches of 128, so the prefill has boundaries to take checkpoints at.
    let config = EngineConfig { checkpoint_every: 128, batch_size: 128, ubatch_size: 128, ..config(&path) };
    let engine = Engine::start(config.clone()).expect("fixture loads");
    let system = long_system_prompt(400);
    let first = chat(&[ChatMessage::system(&system), ChatMessage::user("Hi")]);
    let turn1 = greedy(&engine, first.clone(), 4);
    let tokens = turn1.usage.prompt_tokens;
    assert!(tokens > 384, "{:?}", turn1.usage);
    let mut sizes: Vec<u32> = settled_cache(&engine).entries.iter().map(|e| e.tokens).collect();
    sizes.sort_unstable();
    let expected: Vec<u32> = (1..=(tokens - 1) / 128).map(|k| k * 128).chain([tokens]).collect();
    assert_eq!(sizes, expected, "a checkpoint every 128 tokens and one at the prompt's end");

    // Edit the system prompt's last line: the prompt diverges after the last periodic
    // checkpoint before it.
    let last_line = system.trim_end().rsplit('\n').next().expect("a line").to_string();
    let edited = system.replace(&last_line, "Fact 999: nothing at all.");
    let prompt = chat(&[ChatMessage::system(edited), ChatMessage::user("Hi")]);
    let turn2 = greedy(&engine, prompt.clone(), 4);
    let cache = turn2.timings.cache;
    eprintln!("turn 1 {:?}, turn 2 {cache:?}", turn1.usage);
    assert_eq!(cache.source, CacheSource::Checkpoint, "{cache:?}");
    let (a, b) =
        (engine.tokenize_blocking(&first).expect("tokens"), engine.tokenize_blocking(&prompt).expect("tokens"));
    let diverged = a.iter().zip(&b).take_while(|(x, y)| x == y).count() as u32;
    assert!(diverged > 256, "diverges late in the system prompt: {diverged}");
    assert_eq!(cache.reused, diverged / 128 * 128, "the newest checkpoint at or before {diverged}: {cache:?}");
    assert_eq!(turn2.text, fresh_split(&config, &prompt, cache.reused, 4).text);
}

/// gemma-3 with the small SWA cache (window 512, about 1024 positions kept): a turn that
/// rewrites a reply further back than the cache still holds comes from that turn's prompt
/// checkpoint.
#[test]
fn the_small_swa_cache_serves_a_rewritten_early_turn_from_a_checkpoint() {
    // One sequence: llama.cpp keeps a window per sequence, and this needs the one window.
    let config = EngineConfig { swa_full: false, parallel: 1, ..config(&gemma3_path()) };
    let engine = Engine::start(config.clone()).expect("gemma-3 loads");
    let mut messages =
        vec![ChatMessage::system(long_system_prompt(800)), ChatMessage::user("Which facts mention trains?")];
    let turn1 = greedy(&engine, chat(&messages), 8);
    messages.push(ChatMessage::assistant(turn1.text));
    let notes = long_system_prompt(1200).replace("Fact", "Note");
    messages.push(ChatMessage::user(format!("More notes:\n{notes}\nWhich notes mention gardens?")));
    let turn2 = greedy(&engine, chat(&messages), 8);
    assert!(
        turn2.usage.prompt_tokens > turn1.usage.prompt_tokens + 1100,
        "turn 1's end is far behind the window: {:?}",
        turn2.usage
    );
    messages[2] = ChatMessage::assistant("Facts 3 and 11 mention trains.");
    messages.push(ChatMessage::assistant(turn2.text));
    messages.push(ChatMessage::user("Thanks."));
    let prompt = chat(&messages);
    let turn3 = greedy(&engine, prompt.clone(), 8);
    let cache = turn3.timings.cache;
    eprintln!("turn 1 {:?}, turn 2 {:?}, turn 3 {cache:?}", turn1.usage, turn2.usage);
    assert_eq!((cache.source, cache.reason), (CacheSource::Checkpoint, Some(CacheMiss::Checkpoint)), "{cache:?}");
    assert_eq!(cache.reused, turn1.usage.prompt_tokens, "turn 1's prompt checkpoint");
    assert_eq!(turn3.text, fresh_split(&config, &prompt, cache.reused, 8).text);
}
