//! Barge-in: the user interrupts, the voice client leaves the streamed reply and sends the next
//! turn with the assistant message cut to what was spoken, mid-word. The cache held the whole
//! reply; the next turn keeps everything up to the cut and says so (`timings.cache.reason` is
//! `reply-cut`, `reply_cut` tells where), and its greedy answer equals a fresh context's that
//! evaluates the same split (the prompt in one go, the kept reply tokens one by one as they
//! were generated, then the rest), on SmolLM2 (the live cache is cut), gemma-3 (a sliding
//! window: the live cache is cut where the window before the cut is still held; with the small
//! SWA cache a cut further back restarts from a reply checkpoint) and the tiny LFM2 fixture
//! (recurrent: the reply is checkpointed every 32 tokens as it is generated, and the cut
//! restarts from the newest checkpoint before it).

mod common;

use std::path::PathBuf;

use common::{gemma3_path, greedy, long_system_prompt, model_path, smollm2_path, test_config, Generated};
use firstword::{
    CacheMiss, CacheSource, ChatMessage, Engine, EngineConfig, Event, GenerationRequest, Prompt, SamplingParams,
};

/// Reply tokens the tiny LFM2 fixture's reply is checkpointed every (the policy's spacing):
/// a cut re-evaluates fewer than this many of the spoken reply's tokens.
const REPLY_CHECKPOINT_EVERY: u32 = 32;

/// Turn 1 on `engine`: `messages` answered greedily (the end of the reply banned by
/// `no_end`), the client leaving once `leave_after` tokens arrived. Returns the reply's tokens
/// and their text as the client had them.
fn interrupted_reply(
    engine: &Engine,
    messages: &[ChatMessage],
    no_end: &[i32],
    leave_after: usize,
) -> Vec<(i32, Vec<u8>)> {
    let sampling =
        SamplingParams { logit_bias: no_end.iter().map(|&t| (t, -100.0)).collect(), ..SamplingParams::greedy() };
    let request = GenerationRequest {
        prompt: Prompt::chat(messages.to_vec(), Vec::new()),
        max_tokens: Some(400),
        sampling,
        logprobs: Some(0),
        ..GenerationRequest::chat(Vec::new())
    };
    let mut generation = engine.submit(request).expect("submitted");
    let mut tokens = Vec::new();
    while tokens.len() < leave_after {
        match generation.next_blocking() {
            Some(Event::Logprobs(logprobs)) => {
                tokens.extend(logprobs.into_iter().map(|l| (l.chosen.token, l.chosen.bytes)));
            }
            Some(Event::Finished { .. } | Event::Failed(_)) | None => panic!("the reply ended before the user spoke"),
            Some(_) => {}
        }
    }
    // The client leaves: the engine stops at its next token.
    drop(generation);
    tokens
}

/// The next turn's prompt after a barge-in: the first prompt, the reply's first `kept` tokens,
/// then `next_turn` (the template's text after a reply, tokenized as it follows text: after a
/// stand-in "a" and whatever BOS that has); it must leave the reply exactly at the cut.
fn cut_turn(engine: &Engine, prompt1: &[i32], reply: &[(i32, Vec<u8>)], kept: usize, next_turn: &str) -> Vec<i32> {
    let tokenize = |text: &str| engine.tokenize_blocking(&Prompt::Text(text.into())).expect("tokens");
    let other = tokenize(&format!("a{next_turn}"));
    let bos = tokenize("a").len();
    let mut tokens = prompt1.to_vec();
    tokens.extend(reply[..kept].iter().map(|(token, _)| *token));
    tokens.extend(&other[bos..]);
    assert_ne!(tokens[prompt1.len() + kept], reply[kept].0, "the prompt leaves the reply at the cut");
    tokens
}

/// A fresh engine (store off) evaluates `prompt` as the barge-in turn was served: its first
/// `prompt1` tokens (turn 1's prompt) in one go, then each kept reply token alone, as they
/// were generated, then the rest; returns the greedy answer.
fn fresh_replayed(config: &EngineConfig, prompt: &[i32], prompt1: usize, reused: usize, max: u32) -> Generated {
    let fresh = Engine::start(EngineConfig { cache_ram_mib: 0, ..config.clone() }).expect("model loads");
    greedy(&fresh, Prompt::Tokens(prompt[..prompt1].to_vec()), 0);
    for end in prompt1 + 1..=reused {
        greedy(&fresh, Prompt::Tokens(prompt[..end].to_vec()), 0);
    }
    let answer = greedy(&fresh, Prompt::Tokens(prompt.to_vec()), max);
    assert_eq!(answer.usage.cached_tokens as usize, reused, "the same split on both sides");
    answer
}

/// A chat barge-in with `config`'s model (`no_end`: its end-of-turn tokens): turn 1 interrupted
/// after 40 tokens, turn 2 with the spoken text (30 tokens' worth) cut in the middle of the
/// next word.
fn chat_barge_in(config: &EngineConfig, no_end: &[i32]) {
    let engine = Engine::start(config.clone()).expect("model loads");
    let mut messages = vec![
        ChatMessage::system(long_system_prompt(600)),
        ChatMessage::user("Tell me about each of the facts, one by one, in detail."),
    ];
    let messages_before_reply = messages.clone();
    let prompt1 = engine.tokenize_blocking(&Prompt::chat(messages.clone(), Vec::new())).expect("tokens").len();
    let reply = interrupted_reply(&engine, &messages, no_end, 40);
    // What was spoken: the first 30 tokens' text, then half of the next word.
    let whole: Vec<u8> = reply[..30].iter().flat_map(|(_, bytes)| bytes.clone()).collect();
    let mut spoken = String::from_utf8_lossy(&whole).into_owned();
    let next_word: String =
        String::from_utf8_lossy(&reply[30..].iter().flat_map(|(_, b)| b.clone()).collect::<Vec<_>>())
            .trim_start()
            .chars()
            .take_while(|c| c.is_alphanumeric())
            .collect();
    let half = next_word.chars().count().div_ceil(2).max(1);
    if reply[30].1.first() == Some(&b' ') {
        spoken.push(' ');
    }
    spoken.extend(next_word.chars().take(half));
    eprintln!("spoken: {spoken:?}");
    messages.push(ChatMessage::assistant(spoken));
    messages.push(ChatMessage::user("Wait, stop. Which fact mentions trains?"));
    let prompt = Prompt::chat(messages, Vec::new());
    let tokens = engine.tokenize_blocking(&prompt).expect("tokens");
    let turn1 = engine.tokenize_blocking(&Prompt::chat(messages_before_reply, Vec::new())).expect("tokens");
    assert_eq!(tokens[..prompt1], turn1[..], "turn 2 continues turn 1's prompt");
    let turn2 = greedy(&engine, prompt, 12);
    let cache = turn2.timings.cache;
    eprintln!("turn 2 {:?} {cache:?}", turn2.usage);

    assert_eq!(cache.reason, Some(CacheMiss::ReplyCut), "{cache:?}");
    assert_eq!(cache.source, CacheSource::Live, "{cache:?}");
    let cut = cache.reply_cut.expect("where the reply was cut");
    // The last token the client had may not have been evaluated when the engine saw it go.
    assert!(cut.held >= 38, "the cache held the reply up to where the client left: {cut:?}");
    assert_eq!(cache.reused as usize, prompt1 + cut.kept as usize, "all up to the cut is kept: {cache:?}");
    // The 30 whole tokens spoken are kept, but for the cut word's re-tokenized pieces (at most
    // the last two: a space-led word piece may merge with what precedes it).
    assert!(cut.kept >= 28, "{cut:?}");
    assert!(cut.kept <= 32, "nothing after the cut: {cut:?}");
    let fresh = fresh_replayed(config, &tokens, prompt1, cache.reused as usize, 12);
    assert_eq!(turn2.text, fresh.text, "the kept reply changed the answer");
}

#[test]
fn smollm2_keeps_the_reply_up_to_the_cut() {
    // <|im_end|> and <|endoftext|>.
    chat_barge_in(&test_config(smollm2_path()), &[2, 0]);
}

#[test]
fn gemma3_keeps_the_reply_up_to_the_cut() {
    // <end_of_turn> and <eos>.
    chat_barge_in(&test_config(gemma3_path()), &[106, 1]);
}

/// The tiny LFM2 fixture's text is random and does not survive re-tokenization, so its next
/// turn is written in tokens: turn 1's prompt, the reply's first 70 tokens, another turn.
#[test]
fn lfm2_restarts_from_the_newest_reply_checkpoint_before_the_cut() {
    let path: PathBuf = model_path("tiny-lfm2.gguf");
    let config = EngineConfig { cache_min_tokens: 32, ..test_config(path) };
    let engine = Engine::start(config.clone()).expect("fixture loads");
    let messages = vec![ChatMessage::system(long_system_prompt(300)), ChatMessage::user("Tell me about the facts.")];
    let prompt1 = engine.tokenize_blocking(&Prompt::chat(messages.clone(), Vec::new())).expect("tokens");
    let reply = interrupted_reply(&engine, &messages, &[2, 0], 100);
    let kept = 70;
    let tokens = cut_turn(&engine, &prompt1, &reply, kept, "<|im_end|>\n<|im_start|>user\nStop.");
    let turn2 = greedy(&engine, Prompt::Tokens(tokens.clone()), 8);
    let cache = turn2.timings.cache;
    eprintln!("turn 2 {:?} {cache:?}", turn2.usage);

    assert_eq!((cache.source, cache.reason), (CacheSource::Checkpoint, Some(CacheMiss::ReplyCut)), "{cache:?}");
    let cut = cache.reply_cut.expect("where the reply was cut");
    assert_eq!(cut.kept, kept as u32, "{cut:?}");
    let up_to_cut = (prompt1.len() + kept) as u32;
    assert!(cache.reused <= up_to_cut, "{cache:?}");
    assert!(cache.reused + REPLY_CHECKPOINT_EVERY > up_to_cut, "the newest checkpoint before the cut: {cache:?}");
    assert_eq!(cache.reused, prompt1.len() as u32 + 64, "the reply's checkpoints are 32 tokens apart: {cache:?}");
    let fresh = fresh_replayed(&config, &tokens, prompt1.len(), cache.reused as usize, 8);
    assert_eq!(turn2.text, fresh.text, "the checkpoint changed the answer");
}

/// gemma-3 with the small SWA cache (`swa_full: false`; batches of 64 and one sequence, so it
/// keeps about a window and a batch: with more sequences llama.cpp keeps a window per
/// sequence): a long reply leaves a cut near its start behind what the live cache still holds,
/// and the next turn restarts from the reply's checkpoint before the cut.
#[test]
fn the_small_swa_cache_restarts_from_a_reply_checkpoint() {
    let config = EngineConfig {
        swa_full: false,
        parallel: 1,
        batch_size: 64,
        ubatch_size: 64,
        cache_min_tokens: 32,
        ..test_config(gemma3_path())
    };
    let engine = Engine::start(config.clone()).expect("gemma-3 loads");
    let messages = vec![
        ChatMessage::system(long_system_prompt(900)),
        ChatMessage::user("Tell me about each of the facts, one by one, in detail."),
    ];
    let prompt1 = engine.tokenize_blocking(&Prompt::chat(messages.clone(), Vec::new())).expect("tokens");
    assert!(prompt1.len() > 900, "the SWA cache dropped the prompt's start: {}", prompt1.len());
    let reply = interrupted_reply(&engine, &messages, &[106, 1], 360);
    let kept = 40;
    let next_turn = "<end_of_turn>\n<start_of_turn>user\nStop.<end_of_turn>\n<start_of_turn>model\n";
    let tokens = cut_turn(&engine, &prompt1, &reply, kept, next_turn);
    let turn2 = greedy(&engine, Prompt::Tokens(tokens.clone()), 8);
    let cache = turn2.timings.cache;
    eprintln!("turn 2 {:?} {cache:?}", turn2.usage);

    assert_eq!((cache.source, cache.reason), (CacheSource::Checkpoint, Some(CacheMiss::ReplyCut)), "{cache:?}");
    assert_eq!(cache.reply_cut.map(|cut| cut.kept), Some(kept as u32), "{cache:?}");
    assert_eq!(cache.reused, prompt1.len() as u32 + 32, "the reply's checkpoint before the cut: {cache:?}");
    let fresh = fresh_replayed(&config, &tokens, prompt1.len(), cache.reused as usize, 8);
    assert_eq!(turn2.text, fresh.text, "the checkpoint changed the answer");
}
