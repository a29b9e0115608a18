//! What a lane leaves for its conversation's next turn (`--parallel`): on models whose cache
//! cannot be cut everywhere, the checkpoints sequence 0 would take, and with a recurrent state
//! its state in the RAM store. Each next turn is compared with the same turns served one after
//! the other on a fresh engine of the same settings.

mod common;

use common::lanes::{lanes_config, request, same_first_candidates, token_ids};
use common::{gemma3_path, generate, read, streaming};
use firstword::{ChatMessage, Engine, EngineConfig, GenerationRequest, Prompt};

/// With a recurrent state, a lane's conversation goes on from what it left in the RAM store
/// (its whole turn, or the checkpoint at its prompt's end: a recurrent state is never cut):
/// B's two turns, each sent while A streams, and the same turns served one after the other
/// alone, reuse as much and answer the same.
#[test]
fn a_recurrent_lanes_next_turn_continues_from_what_it_stored() {
    let system = common::long_system_prompt(300);
    for fixture in ["tiny-lfm2.gguf", "tiny-mamba.gguf"] {
        let config = EngineConfig { cache_min_tokens: 32, ..lanes_config(common::model_path(fixture)) };
        let chat = |messages: Vec<ChatMessage>| GenerationRequest {
            prompt: Prompt::chat(messages, Vec::new()),
            logprobs: Some(5),
            ..request(&system, "", 24, &[])
        };
        let first = vec![ChatMessage::system(&system), ChatMessage::user("Which facts mention trains?")];
        let second = |reply: &str| {
            let mut messages = first.clone();
            messages.extend([ChatMessage::assistant(reply), ChatMessage::user("And gardens?")]);
            chat(messages)
        };
        let alone = Engine::start(config.clone()).expect("the model loads");
        let banned = token_ids(&alone, &["<|im_end|>", "<|endoftext|>"]);
        let story = request(&system, "Tell me a long story about a dragon in a kitchen.", 2000, &banned);
        generate(&alone, story.clone());
        let b1_alone = generate(&alone, chat(first.clone()));
        let b2_alone = generate(&alone, second(&b1_alone.text));
        drop(alone);

        let engine = Engine::start(config).expect("the model loads");
        let a = streaming(&engine, story);
        let b1 = generate(&engine, chat(first.clone()));
        let (b2, b2_ended) = read(engine.submit(second(&b1.text)).expect("submitted"), None);
        let (_, a_ended) = a.join().expect("reader");
        eprintln!("{fixture}: {:?} {:?}, alone {:?}", b2.timings.cache, b2.timings.shared, b2_alone.timings.cache);
        assert!(b1.timings.shared.is_some() && b2.timings.shared.is_some(), "B's turns were served beside A");
        assert!(b2_ended < a_ended, "B's second turn ended while A streamed");
        assert_eq!(b1.text, b1_alone.text);
        let source = b2.timings.cache.source;
        assert!(matches!(source, firstword::CacheSource::Ram | firstword::CacheSource::Checkpoint), "{source:?}");
        assert!(b2.usage.cached_tokens >= b1.usage.prompt_tokens, "at least B's first prompt: {:?}", b2.usage);
        assert_eq!(b2.usage.cached_tokens, b2_alone.usage.cached_tokens, "the same split as alone");
        assert_eq!(b2.text, b2_alone.text);
        assert!(same_first_candidates(&b2, &b2_alone), "{:?}\n{:?}", b2.logprobs[0], b2_alone.logprobs[0]);
    }
}

/// On a sliding-window model (gemma-3) a lane's prompt is checkpointed at its end, as sequence
/// 0's is: a restored state then serves only prompts that continue it whole, so when B's next
/// turn rewrites B's reply (an edited assistant message) and B's cells are gone (C took the one
/// lane), only that checkpoint serves B's first turn. B's first turn, C's and B's second turn
/// are all sent while A streams; B's second turn restores the checkpoint into its lane and
/// answers as the same turns served one after the other on a fresh engine (whose live cache is
/// cut there: the same split). Without lane checkpoints it shared only the system prompt.
#[test]
fn a_lanes_prompt_is_checkpointed_for_a_turn_that_rewrites_its_reply() {
    let system = common::long_system_prompt(400);
    let first = "I am in the office. It is getting dark outside and I can barely read the papers on my desk, \
                 so please turn on the office light, then tell me which other lights are still on in the house.";
    let chat = |messages: Vec<ChatMessage>, max_tokens| GenerationRequest {
        prompt: Prompt::chat(messages, Vec::new()),
        ..request(&system, "", max_tokens, &[])
    };
    let b1 = chat(vec![ChatMessage::system(&system), ChatMessage::user(first)], 24);
    let b2 = chat(
        vec![
            ChatMessage::system(&system),
            ChatMessage::user(first),
            ChatMessage::assistant("Switched on. Nothing else is lit."),
            ChatMessage::user("Thanks. Now the kitchen light, please."),
        ],
        24,
    );
    let c = request(&system, "What is the capital of France? Answer in one short sentence.", 16, &[]);
    let config = EngineConfig { cache_min_tokens: 32, parallel: 2, ..lanes_config(gemma3_path()) };
    let alone = Engine::start(config.clone()).expect("the model loads");
    let banned = token_ids(&alone, &["<end_of_turn>", "<eos>"]);
    let story = request(&system, "Tell me a long story about a dragon in a kitchen.", 400, &banned);
    generate(&alone, GenerationRequest { max_tokens: Some(1), ..story.clone() });
    let b1_prompt = generate(&alone, b1.clone()).usage.prompt_tokens;
    let expected = generate(&alone, b2.clone());
    assert_eq!(expected.usage.cached_tokens, b1_prompt, "alone, the live cache is cut where B's reply began");
    drop(alone);

    let engine = Engine::start(config).expect("the model loads");
    let a = streaming(&engine, story);
    let b1 = generate(&engine, b1);
    generate(&engine, c);
    let (b2, b2_ended) = read(engine.submit(b2).expect("submitted"), None);
    let (_, a_ended) = a.join().expect("reader");
    let cache = b2.timings.cache.clone();
    eprintln!("{cache:?} {:?}\nbeside A {:?}\nalone    {:?}", b2.timings.shared, b2.text, expected.text);
    assert!(b1.timings.shared.is_some() && b2.timings.shared.is_some(), "B's turns were served beside A");
    assert!(b2_ended < a_ended, "B's second turn ended while A streamed");
    assert_eq!(cache.source, firstword::CacheSource::Checkpoint, "{cache:?}");
    assert_eq!(b2.usage.cached_tokens, b1_prompt, "B's whole first prompt came from its checkpoint");
    assert_eq!(b2.text, expected.text, "the reply the conversation gives alone");
}

/// A lane takes the other checkpoints sequence 0 takes, by the same rules: every
/// `checkpoint_every` tokens of a long prompt (here 256, in batches of 64: one at the end of the
/// batch that reached each multiple), and, once the small SWA cache has dropped the lane's first positions
/// (B's prompt alone is longer than its cells), every 32 reply tokens. B (about 1,200 tokens,
/// nothing shared) is served beside A, whose short prompt and reply take none: what the store
/// then holds is B's.
#[test]
fn a_lane_checkpoints_a_long_prompt_and_a_reply_past_its_window() {
    let config = EngineConfig {
        swa_full: false,
        parallel: 2,
        batch_size: 64,
        ubatch_size: 64,
        checkpoint_every: 256,
        cache_min_tokens: 32,
        ..lanes_config(gemma3_path())
    };
    let engine = Engine::start(config).expect("the model loads");
    let banned = token_ids(&engine, &["<end_of_turn>", "<eos>"]);
    let a = streaming(&engine, request("", "Tell me a long story about a dragon in a kitchen.", 400, &banned));
    let notes = common::long_system_prompt(1200).replace("Fact", "Note");
    let b = GenerationRequest {
        prompt: Prompt::chat(vec![ChatMessage::user(format!("{notes}\nWhich notes mention gardens?"))], Vec::new()),
        ..request("", "", 40, &banned)
    };
    let (b, b_ended) = read(engine.submit(b).expect("submitted"), None);
    let (a, a_ended) = a.join().expect("reader");
    assert!(b_ended < a_ended && b.timings.shared.is_some(), "B was served beside A");
    assert!(a.usage.prompt_tokens < 32 && a.usage.prompt_tokens + 400 < 512, "A takes no checkpoint: {:?}", a.usage);
    let prompt = b.usage.prompt_tokens;
    assert!(
        prompt % 256 > 64 && b.usage.completion_tokens == 40,
        "no multiple of 256 in the last batch: {:?}",
        b.usage
    );
    let mut checkpoints: Vec<u32> = common::settled_cache(&engine)
        .entries
        .iter()
        .filter(|entry| entry.kind == firstword::engine::CacheEntryKind::Checkpoint)
        .map(|entry| entry.tokens)
        .collect();
    checkpoints.sort_unstable();
    eprintln!("B's prompt {prompt}, checkpoints {checkpoints:?}");
    let multiples = prompt / 256;
    assert_eq!(checkpoints.len() as u32, multiples + 2, "{checkpoints:?}");
    for (k, &at) in (1..=multiples).zip(&checkpoints) {
        assert!(at >= k * 256 && at < k * 256 + 64, "one in the batch that reached {}: {checkpoints:?}", k * 256);
    }
    assert_eq!(checkpoints[multiples as usize..], [prompt, prompt + 32], "the prompt's end, and 32 reply tokens on");
}
