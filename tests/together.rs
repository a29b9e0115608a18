//! Several conversations in one context (`--parallel`): requests that arrive while a reply
//! streams are served beside it in lanes, and every reply is the one the request gives alone.
//!
//! Conversation A streams a long reply (its end-of-turn tokens banned, so it is still
//! streaming when the others end); after its 8th piece of text, B and C (the same system
//! prompt, other questions) are submitted. Without lanes they wait for A's whole reply; with
//! them they end first. Their replies are compared with the same requests served one after
//! the other on a fresh engine of the same settings: the same prompt splits (A's prompt whole;
//! B's and C's after the system prompt A evaluated), one thread. A's own long reply can tip
//! at a near tie once others share its steps (see docs/serving.md): its beginning is compared.

mod common;

use std::thread;
use std::time::Instant;

use common::lanes::{lanes_config as config, request, same_first_candidates, token_ids};
use common::{gemma3_path, generate, read, smollm2_path, streaming, Generated};
use firstword::engine::{SpecMode, SpeculationConfig};
use firstword::{ChatMessage, Engine, EngineConfig, Event, GenerationRequest, Prompt};

/// How far a log-probability computed beside other conversations' kept cells may be from the
/// same computed alone: rounding, not state (in the test below they come out identical; where
/// the rounding differs it moves them by far less than this).
const KEPT_LOGPROB_TOLERANCE: f32 = 0.05;

/// `shares`: a lane continues the system prompt A's sequence holds (not with a recurrent
/// state, which is A's whole history: the lane evaluates its prompt from the start, as the same
/// request alone after A does).
fn replies_beside_a_streaming_one_equal_their_replies_alone(
    config: EngineConfig,
    system: &str,
    end_of_turn: &[&str],
    shares: bool,
) {
    let questions = ["Turn on the office light.", "What is the capital of France?"];
    let alone = Engine::start(config.clone()).expect("the model loads");
    let banned = token_ids(&alone, end_of_turn);
    assert_eq!(banned.len(), end_of_turn.len(), "the end-of-turn tokens are known");
    let story = request(system, "Tell me a long story about a dragon in a kitchen.", 160, &banned);
    let expected_a = generate(&alone, story.clone());
    // The first token's candidates too: a fixture with random weights can answer both
    // questions with the same text, not with the same numbers.
    let ask = |question: &str| GenerationRequest { logprobs: Some(5), ..request(system, question, 24, &[]) };
    let expected: Vec<Generated> = questions.iter().map(|q| generate(&alone, ask(q))).collect();
    drop(alone);
    assert!(!same_first_candidates(&expected[0], &expected[1]), "the questions' numbers tell them apart");

    let engine = Engine::start(config).expect("the model loads");
    let a = streaming(&engine, story);
    let others: Vec<_> = questions
        .iter()
        .map(|q| {
            let generation = engine.submit(ask(q)).expect("submitted");
            thread::spawn(move || read(generation, None))
        })
        .collect();
    let others: Vec<(Generated, Instant)> = others.into_iter().map(|t| t.join().expect("reader")).collect();
    let (a, a_ended) = a.join().expect("reader");

    assert_eq!(a.usage.completion_tokens, 160, "A streamed to its limit");
    for ((answer, ended), alone) in others.iter().zip(&expected) {
        eprintln!("beside A {:?}\nalone    {:?}\n{:?}", answer.text, alone.text, answer.timings.shared);
        assert!(*ended < a_ended, "a request sent while A streams ends before A's long reply");
        let shared = answer.timings.shared.expect("it shared A's steps");
        assert!(shared.sequence > 0 && shared.replies_beside >= 1, "{shared:?}");
        assert_eq!(answer.usage.cached_tokens, alone.usage.cached_tokens, "the same split as alone");
        assert_eq!(answer.usage.cached_tokens > 0, shares, "it continued the system prompt A's sequence holds");
        assert_eq!((&answer.text, answer.reason), (&alone.text, alone.reason), "the reply it gives alone");
        assert!(same_first_candidates(answer, alone), "{:?}\n{:?}", answer.logprobs[0], alone.logprobs[0]);
    }
    // A's own tokens ride steps with the others': where its next token is a near tie, the
    // sums of a shared step (and its cells' places among the others') can tip it. What is
    // exact is the part A generated before the others came; the rest is reported (measured
    // in docs/serving.md).
    let alone_pieces: String = expected_a.text.chars().take(16).collect();
    assert!(a.text.starts_with(&alone_pieces), "A began as alone: {:?}", a.text);
    let same = a.text.chars().zip(expected_a.text.chars()).take_while(|(x, y)| x == y).count();
    eprintln!("A: {same} of {} characters as alone", expected_a.text.chars().count());
    assert!(a.timings.shared.is_some_and(|shared| shared.sequence == 0 && shared.replies_beside >= 1));
    let status = engine.cache_status();
    assert_eq!((status.lanes.running, status.lanes.served), (0, 2), "{:?}", status.lanes);
}

#[test]
fn smollm2_replies_beside_a_streaming_one_equal_their_replies_alone() {
    let system = common::long_system_prompt(600);
    replies_beside_a_streaming_one_equal_their_replies_alone(
        config(smollm2_path()),
        &system,
        &["<|im_end|>", "<|endoftext|>"],
        true,
    );
}

#[test]
fn gemma3_replies_beside_a_streaming_one_equal_their_replies_alone() {
    // Shorter than gemma-3's sliding window: a lane shares the cells A's sequence still holds.
    let system = common::long_system_prompt(250);
    replies_beside_a_streaming_one_equal_their_replies_alone(
        config(gemma3_path()),
        &system,
        &["<end_of_turn>", "<eos>"],
        true,
    );
}

/// With `--reuse-after-change` a sliding-window model's context holds a guard that keeps every
/// cell (docs/cache.md): lanes beside a streaming reply still answer as alone, and share a
/// system prompt longer than the window, whose first cells A's reply has put out of it.
#[test]
fn gemma3_with_the_window_guard_replies_beside_a_streaming_one_equal_their_replies_alone() {
    let system = common::long_system_prompt(600);
    let guarded = EngineConfig { reuse_after_change: true, ..config(gemma3_path()) };
    replies_beside_a_streaming_one_equal_their_replies_alone(guarded, &system, &["<end_of_turn>", "<eos>"], true);
}

/// Models that keep a recurrent state (LFM2: hybrid, Mamba: recurrent only; fixtures with
/// SmolLM2's tokenizer) keep one state per sequence: requests are served beside a streaming
/// reply too.
#[test]
fn recurrent_models_serve_replies_beside_a_streaming_one() {
    let system = common::long_system_prompt(300);
    for fixture in ["tiny-lfm2.gguf", "tiny-mamba.gguf"] {
        let path = common::model_path(fixture);
        replies_beside_a_streaming_one_equal_their_replies_alone(
            config(path),
            &system,
            &["<|im_end|>", "<|endoftext|>"],
            false,
        );
    }
}

/// A lane whose client leaves is freed unanswered, and the streaming reply goes on to its
/// limit; with a recurrent state too (LFM2: its lane cannot be stopped midway, so it ends at
/// its next step).
#[test]
fn a_client_that_leaves_frees_its_lane_and_the_streaming_reply_goes_on() {
    // The fixture is fast: a longer reply keeps A streaming while B comes and goes.
    for (model, limit) in [(smollm2_path(), 200), (common::model_path("tiny-lfm2.gguf"), 2000)] {
        let engine = Engine::start(config(model)).expect("the model loads");
        let system = common::long_system_prompt(300);
        let banned = token_ids(&engine, &["<|im_end|>", "<|endoftext|>"]);
        let story = request(&system, "Tell me a long story about a dragon in a kitchen.", limit, &banned);
        let a = streaming(&engine, story);
        let mut b = engine.submit(request(&system, "Describe the sea at length.", 100, &banned)).expect("submitted");
        while !matches!(b.next_blocking(), Some(Event::Text(_))) {}
        drop(b);
        let (a, _) = a.join().expect("reader");
        assert_eq!(a.usage.completion_tokens, limit, "A's reply went on to its limit");
        assert!(a.timings.shared.is_some(), "B took a lane beside A");
        let status = engine.cache_status();
        assert_eq!(
            (status.lanes.running, status.lanes.served),
            (0, 0),
            "the lane was freed unanswered: {:?}",
            status.lanes
        );
        // The lane is free again: the next request is served.
        let c = generate(&engine, request(&system, "Turn on the office light.", 8, &[]));
        assert!(c.usage.completion_tokens > 0);
    }
}

/// B's two turns and what A asks in between, as requests.
struct OfficeTurns {
    system: String,
}

impl OfficeTurns {
    const FIRST: &'static str =
        "I am in the office. It is getting dark outside and I can barely read the papers on my \
                                 desk, so please turn on the office light and tell me when it is done.";

    fn first(&self) -> GenerationRequest {
        request(&self.system, Self::FIRST, 24, &[])
    }

    fn second(&self, reply: &str) -> GenerationRequest {
        GenerationRequest {
            prompt: Prompt::chat(
                vec![
                    ChatMessage::system(&self.system),
                    ChatMessage::user(Self::FIRST),
                    ChatMessage::assistant(reply),
                    ChatMessage::user("Thanks. Now the kitchen light, please."),
                ],
                Vec::new(),
            ),
            ..request(&self.system, "", 24, &[])
        }
    }

    fn story(&self, banned: &[i32]) -> GenerationRequest {
        request(&self.system, "Tell me a long story about a dragon in a kitchen.", 160, banned)
    }
}

/// B's first turn alone, then A's long reply (which displaces B from the live sequence), and
/// B's second turn sent while A streams; B's second turn and how it ended against A's end.
fn second_turn_beside_a_story(engine: &Engine, turns: &OfficeTurns, reply: &str) -> (Generated, bool) {
    assert_eq!(generate(engine, turns.first()).text, reply);
    let banned = token_ids(engine, &["<|im_end|>", "<|endoftext|>"]);
    let a = streaming(engine, turns.story(&banned));
    let (b, b_ended) = read(engine.submit(turns.second(reply)).expect("submitted"), None);
    let (_, a_ended) = a.join().expect("reader");
    (b, b_ended < a_ended)
}

/// A conversation A displaced from the live sequence stays in its cells, kept under a sequence
/// of its own, and its next turn, sent while A streams, continues it there: nothing restored,
/// its whole first turn reused, in a context too small for a copy of it beside A (a restore
/// writes every cell anew; the kept cells share the system prompt with A's). Its reply is the
/// one the same two turns give served one after the other on a fresh engine.
#[test]
fn a_lane_continues_a_conversation_kept_in_its_cells_where_a_copy_would_not_fit() {
    let turns = OfficeTurns { system: common::long_system_prompt(900) };
    // A conversation that loses fewer tokens than this when displaced is not saved.
    let base = EngineConfig { cache_min_tokens: 32, ..config(smollm2_path()) };
    let alone = Engine::start(base.clone()).expect("the model loads");
    let reply = generate(&alone, turns.first()).text;
    let expected = generate(&alone, turns.second(&reply));
    let probe = GenerationRequest { max_tokens: Some(1), ..turns.story(&[]) };
    let story_prompt = generate(&alone, probe).usage.prompt_tokens as usize;
    drop(alone);

    // A's prompt and reply, and B's own turns, fit; B's whole conversation copied beside A
    // would not.
    let b_prompt = expected.usage.prompt_tokens as usize;
    let ctx = (story_prompt + 160 + b_prompt + 24).div_ceil(256) * 256 - 256;
    let engine = Engine::start(EngineConfig { ctx_size: Some(ctx as u32), ..base }).expect("the model loads");
    let n_ctx = engine.model_info().expect("loaded").n_ctx as usize;
    assert!(story_prompt + 160 + b_prompt + 24 > n_ctx, "a copy of B does not fit beside A: {n_ctx}");
    let (b, ended_first) = second_turn_beside_a_story(&engine, &turns, &reply);
    let cache = b.timings.cache.clone();
    eprintln!("{cache:?} {:?}\nbeside A {:?}\nalone    {:?}", b.timings.shared, b.text, expected.text);
    assert!(ended_first, "B's second turn ended while A streamed");
    assert_eq!(cache.source, firstword::CacheSource::Kept, "{cache:?}");
    assert_eq!(cache.restore, None, "nothing was copied");
    assert_eq!(b.usage.cached_tokens, expected.usage.cached_tokens, "the same split as alone");
    assert_eq!(b.text, expected.text, "the reply the conversation gives alone");
    assert!(b.timings.shared.is_some(), "it was served beside A");
}

/// With no sequence to keep it in (one beside the live one, taken by a third conversation
/// kept later), a conversation set aside in the RAM store continues in a lane from there: B's
/// first turn, C's (B kept), A's long reply (C kept in B's place), then B's second turn sent
/// while A streams restores B into its lane.
#[test]
fn a_lane_continues_a_conversation_from_the_ram_store() {
    let turns = OfficeTurns { system: common::long_system_prompt(400) };
    let config = EngineConfig { cache_min_tokens: 32, parallel: 2, ..config(smollm2_path()) };
    let alone = Engine::start(config.clone()).expect("the model loads");
    let reply = generate(&alone, turns.first()).text;
    let expected = generate(&alone, turns.second(&reply));
    drop(alone);

    let engine = Engine::start(config).expect("the model loads");
    assert_eq!(generate(&engine, turns.first()).text, reply);
    // Its own turn is long enough to be worth saving and keeping when A displaces it.
    let c = "We are planning a trip through France next spring with two children and a dog, and we \
             want to see the capital first. What is the capital of France? Answer in one short sentence.";
    generate(&engine, request(&turns.system, c, 24, &[]));
    let banned = token_ids(&engine, &["<|im_end|>", "<|endoftext|>"]);
    let a = streaming(&engine, turns.story(&banned));
    let (b, b_ended) = read(engine.submit(turns.second(&reply)).expect("submitted"), None);
    let (_, a_ended) = a.join().expect("reader");
    let cache = b.timings.cache.clone();
    eprintln!("{cache:?} {:?}\nbeside A {:?}\nalone    {:?}", b.timings.shared, b.text, expected.text);
    assert!(b_ended < a_ended, "B's second turn ended while A streamed");
    assert_eq!(cache.source, firstword::CacheSource::Ram, "{cache:?}");
    assert_eq!(b.usage.cached_tokens, expected.usage.cached_tokens, "the same split as alone");
    assert_eq!(b.text, expected.text, "the reply the conversation gives alone");
}

/// A request whose prompt and `max_tokens` fit the context but not the cells the streaming
/// reply may still need waits for it (as with one sequence), and the streaming reply goes on
/// undisturbed: a lane never takes what a running reply was promised.
#[test]
fn a_request_that_does_not_fit_beside_a_streaming_reply_waits_for_it() {
    let engine = Engine::start(config(smollm2_path())).expect("the model loads");
    let system = common::long_system_prompt(300);
    let banned = token_ids(&engine, &["<|im_end|>", "<|endoftext|>"]);
    let story = request(&system, "Tell me a long story about a dragon in a kitchen.", 200, &banned);
    let a = streaming(&engine, story);
    // 4096 cells: this prompt and 3600 tokens fit alone, not beside A's prompt and 200 tokens.
    let (b, b_ended) =
        read(engine.submit(request(&system, "Turn on the office light.", 3600, &[])).expect("submitted"), None);
    let (a, a_ended) = a.join().expect("reader");
    assert_eq!(a.usage.completion_tokens, 200, "A went on to its limit");
    assert!(b_ended > a_ended, "B waited for A");
    assert_eq!(b.timings.shared, None, "B was served alone after A");
    assert_eq!(engine.cache_status().lanes.served, 0);
}

/// On a sliding-window model a lane can share a prefix only where the streaming sequence still
/// holds the window before its end. Here A's long prompt (the system prompt, then 1,400 tokens
/// of its own) has pushed the system prompt's last window out of the small SWA cache, so B,
/// which shares only that system prompt, must evaluate all of its prompt: with its 1,500-token
/// limit that does not fit beside A's promise, and B waits. (Before, the fit was reckoned as if
/// B shared the system prompt's cells; in the 4K bench such a lane's prompt then ran out of
/// cells and the request failed with a decode error.)
#[test]
fn a_prefix_the_window_no_longer_covers_is_not_reckoned_as_shared() {
    let config = EngineConfig { swa_full: false, parallel: 2, ..config(gemma3_path()) };
    let engine = Engine::start(config).expect("the model loads");
    let system = common::long_system_prompt(600);
    let notes = format!("Summarise these notes in one line:\n{}", common::long_system_prompt(1400));
    let banned = token_ids(&engine, &["<end_of_turn>", "<eos>"]);
    let a = streaming(&engine, request(&system, &notes, 100, &banned));
    let (b, b_ended) =
        read(engine.submit(request(&system, "Turn on the office light.", 1500, &[])).expect("submitted"), None);
    let (a, a_ended) = a.join().expect("reader");
    assert!(a.usage.prompt_tokens > 1900 && b.usage.prompt_tokens > 600, "{:?} {:?}", a.usage, b.usage);
    assert!(b.usage.prompt_tokens + 1500 + a.usage.prompt_tokens + 100 > 4096, "B does not fit beside A");
    assert_eq!(a.usage.completion_tokens, 100, "A went on to its limit");
    assert!(b_ended > a_ended, "B waited for A");
    assert_eq!(b.timings.shared, None, "B was served alone after A");
    assert_eq!(engine.cache_status().lanes.served, 0);
}

/// X's first turn, another conversation's turn (the same system prompt, another question: it
/// displaces X), X's second turn's first token: its cache report and the log-probabilities of
/// the likeliest five tokens there.
fn second_turn_after_another(engine: &Engine, system: &str) -> (firstword::CacheReport, u32, Vec<(i32, f32)>) {
    let first = vec![ChatMessage::system(system), ChatMessage::user("Which facts mention trains or stations?")];
    let chat = |messages: Vec<ChatMessage>, max_tokens| GenerationRequest {
        prompt: Prompt::chat(messages, Vec::new()),
        ..request(system, "", max_tokens, &[])
    };
    let reply = generate(engine, chat(first.clone(), 24)).text;
    generate(engine, chat(vec![ChatMessage::system(system), ChatMessage::user("Turn on the office light.")], 16));
    let mut second = first;
    second.push(ChatMessage::assistant(reply));
    second.push(ChatMessage::user("Thanks. And gardens, in one sentence?"));
    let turn = generate(engine, GenerationRequest { logprobs: Some(5), ..chat(second, 1) });
    let top = turn.logprobs[0].top.iter().map(|candidate| (candidate.token, candidate.logprob)).collect();
    (turn.timings.cache, turn.usage.cached_tokens, top)
}

/// Between requests, sequence 0 continues a kept conversation where its cells are: X, whom
/// another conversation displaced, gets its cells back for its next turn (what the other one
/// held is kept in turn), nothing copied. The state is X's own: the next token's distribution
/// is the one X's copy restored into an empty cache gives (a one-sequence engine, which is a
/// fresh context's, tests/state_store.rs), to within the rounding of llama.cpp's kernels, whose
/// sums follow the cells in use (the other conversation's kept cells among them; how often that
/// tips a greedy reply is measured in docs/serving.md). A wrong state (another conversation's
/// cells, a cut in the wrong place) moves these log-probabilities by whole units.
#[test]
fn sequence_0_continues_a_conversation_kept_in_its_cells() {
    let system = common::long_system_prompt(800);
    let config = EngineConfig { cache_min_tokens: 32, ..config(smollm2_path()) };
    let restored = Engine::start(EngineConfig { parallel: 1, ..config.clone() }).expect("the model loads");
    let (restored_cache, restored_cached, expected) = second_turn_after_another(&restored, &system);
    assert_eq!(restored_cache.source, firstword::CacheSource::Ram, "{restored_cache:?}");
    drop(restored);

    let engine = Engine::start(config).expect("the model loads");
    let (cache, cached, top) = second_turn_after_another(&engine, &system);
    eprintln!("{cache:?}\nkept     {top:?}\nrestored {expected:?}");
    assert_eq!(cache.source, firstword::CacheSource::Kept, "{cache:?}");
    assert_eq!(cache.restore, None, "nothing was copied");
    assert_eq!(cached, restored_cached, "the same split");
    assert_eq!(engine.cache_status().lanes.kept, 1, "the other conversation is kept in turn");
    assert_eq!(top.len(), 5);
    for (token, logprob) in &expected {
        let kept = top.iter().find(|(t, _)| t == token).map(|&(_, l)| l);
        assert!(
            kept.is_some_and(|kept| (kept - logprob).abs() < KEPT_LOGPROB_TOLERANCE),
            "{token}: {kept:?} against {logprob}"
        );
    }
}

/// Two conversations with nothing shared, some 1,500 cells each, one after the other on
/// `engine`: X (railway notes) then Y (garden notes); X's system prompt and both answers.
fn x_then_y(engine: &Engine) -> (String, Generated, Generated) {
    let notes = |title: &str| format!("{title}\n{}", common::long_system_prompt(1400));
    let x_system = notes("Railway notes.");
    let x = generate(engine, request(&x_system, "Which facts mention trains?", 16, &[]));
    let y = generate(engine, request(&notes("Garden notes."), "Which facts mention roses?", 16, &[]));
    assert!(x.usage.prompt_tokens > 1300 && y.usage.cached_tokens < 50, "{:?} {:?}", x.usage, y.usage);
    (x_system, x, y)
}

/// X's next turn, restored from the RAM store, which kept its copy: all but its last token.
fn assert_x_comes_back_from_ram(engine: &Engine, x_system: &str) {
    let x_again = generate(engine, request(x_system, "Which facts mention trains?", 16, &[]));
    assert_eq!(x_again.timings.cache.source, firstword::CacheSource::Ram, "{:?}", x_again.timings.cache);
    assert_eq!(x_again.usage.cached_tokens + 1, x_again.usage.prompt_tokens, "{:?}", x_again.usage);
}

/// Kept conversations give their cells up, the oldest first, to a prompt of sequence 0 that
/// needs them: X and Y's cells, and Z's 2,600 tokens, do not fit the 4,096 cells together (Y's
/// long prompt already drops X, `a_long_prompt_drops_kept_conversations_that_would_slow_it`);
/// Z is served in full, and X's next turn is restored from the RAM store, which kept its copy.
#[test]
fn kept_conversations_give_their_cells_up_to_a_prompt_that_needs_them() {
    let config = EngineConfig { cache_min_tokens: 32, ..config(smollm2_path()) };
    let engine = Engine::start(config).expect("the model loads");
    let (x_system, x, y) = x_then_y(&engine);
    let harbour = format!("Harbour notes.\n{}", common::long_system_prompt(2600));
    let z = generate(&engine, request(&harbour, "Which facts mention ships?", 64, &[]));
    assert!(z.usage.prompt_tokens + x.usage.prompt_tokens + y.usage.prompt_tokens > 4096, "{:?}", z.usage);
    assert_eq!(z.usage.completion_tokens, 64, "Z was served in full: {:?}", z.usage);
    let status = engine.cache_status();
    assert!(status.lanes.kept < 2, "kept conversations gave their cells up: {:?}", status.lanes);
    assert_x_comes_back_from_ram(&engine, &x_system);
}

/// A kept conversation costs every later evaluation of sequence 0 masked attention over its
/// cells: before a long prompt of another conversation it is dropped when the RAM store holds
/// its copy (X here: 1,400 tokens of its own, Y's 1,400-token prompt), and comes back from
/// there; a conversation that shares the long system prompt holds few cells of its own and
/// stays kept (`sequence_0_continues_a_conversation_kept_in_its_cells`).
#[test]
fn a_long_prompt_drops_kept_conversations_that_would_slow_it() {
    let config = EngineConfig { cache_min_tokens: 32, ..config(smollm2_path()) };
    let engine = Engine::start(config).expect("the model loads");
    let (x_system, _, _) = x_then_y(&engine);
    assert_eq!(engine.cache_status().lanes.kept, 0, "X was dropped before Y's prompt");
    assert_x_comes_back_from_ram(&engine, &x_system);
}

/// With speculative decoding (a draft model, the model's MTP heads), a request that comes
/// while a reply streams still takes a lane. Its reply is not drafted and is the one plain
/// decoding gives alone; the streaming reply goes on drafting, in batches of its own (its
/// drafter follows sequence 0's batches alone), and began as it does alone.
#[test]
fn speculative_decoding_leaves_the_lanes_open() {
    let system = common::long_system_prompt(300);
    for (model, mode, draft_model) in
        [(smollm2_path(), SpecMode::Draft, Some(smollm2_path())), (common::tiny_mtp_path(), SpecMode::Mtp, None)]
    {
        let plain = EngineConfig {
            speculation: SpeculationConfig { mode: SpecMode::None, ..SpeculationConfig::default() },
            ..config(model)
        };
        let speculation = SpeculationConfig { mode, draft_model, always: true, ..SpeculationConfig::default() };
        let drafted = EngineConfig { speculation, ..plain.clone() };
        let reference = Engine::start(plain).expect("the model loads");
        let banned = token_ids(&reference, &["<|im_end|>", "<|endoftext|>"]);
        let story = request(&system, "Tell me a long story about a dragon in a kitchen.", 160, &banned);
        let question = request(&system, "Turn on the office light.", 24, &[]);
        generate(&reference, story.clone());
        let expected_b = generate(&reference, question.clone());
        drop(reference);
        let alone = Engine::start(drafted.clone()).expect("the model loads");
        let expected_a = generate(&alone, story.clone());
        drop(alone);

        let engine = Engine::start(drafted).expect("the model loads");
        let a = streaming(&engine, story);
        let (b, b_ended) = read(engine.submit(question).expect("submitted"), None);
        let (a, a_ended) = a.join().expect("reader");
        eprintln!("{mode:?}: A {:?} {:?}; B {:?} {:?}", a.timings.draft, a.timings.shared, b.text, b.timings.shared);
        assert!(b_ended < a_ended, "{mode:?}: B ended before A's long reply");
        assert!(b.timings.shared.is_some_and(|shared| shared.sequence > 0), "{mode:?}: B took a lane");
        assert!(b.timings.draft.is_none(), "{mode:?}: a lane's reply is not drafted");
        assert_eq!((&b.text, b.reason), (&expected_b.text, expected_b.reason), "{mode:?}: B as plain decoding alone");
        assert_eq!(a.usage.completion_tokens, 160, "{mode:?}: A streamed to its limit");
        let draft = a.timings.draft.expect("A was drafted");
        assert!(draft.drafted > 0 && draft.accepted > 0, "{mode:?}: {draft:?}");
        assert!(a.timings.shared.is_some_and(|shared| shared.sequence == 0 && shared.replies_beside >= 1));
        let alone_pieces: String = expected_a.text.chars().take(16).collect();
        assert!(a.text.starts_with(&alone_pieces), "{mode:?}: A began as alone: {:?}", a.text);
    }
}
