//! The prefix cache never changes results: a turn that reuses the KV cache produces exactly the
//! greedy output of a fresh context that evaluates the same token split (prefix, then suffix).
//! llama.cpp's logits depend on how a prompt is split into batches, so "fresh, same split" is
//! the bit-exact reference; a fresh full prefill may differ in late tokens.

mod common;

use common::one_sequence_config as test_config;
use common::{gemma3_path, gemma_turns, generate, long_system_prompt, smollm2_path, Generated};
use firstword::engine::TemplateSource;
use firstword::{ChatMessage, Engine, EngineConfig, FinishReason, GenerationRequest, Prompt, SamplingParams, Usage};

/// Runs one greedy request to the end; returns the text, usage and finish reason.
fn run(engine: &Engine, prompt: Prompt, max_tokens: u32) -> (String, Usage, FinishReason) {
    let request = GenerationRequest {
        prompt,
        max_tokens: Some(max_tokens),
        sampling: SamplingParams::greedy(),
        ..GenerationRequest::chat(Vec::new())
    };
    let Generated { text, usage, reason, .. } = generate(engine, request);
    (text, usage, reason)
}

fn chat(messages: Vec<ChatMessage>) -> Prompt {
    Prompt::chat(messages, Vec::new())
}

/// Turn 1 then turn 2 on `reused`; turn 2 again on a fresh engine with the same split.
/// Returns turn 2's cached token count.
fn assert_reuse_matches_fresh_split(config: &EngineConfig, turn1: Prompt, turn2: Prompt) -> u32 {
    let reused = Engine::start(config.clone()).expect("model loads");
    run(&reused, turn1, 24);
    let (reused_text, usage, _) = run(&reused, turn2.clone(), 32);
    drop(reused);

    let fresh = Engine::start(config.clone()).expect("model loads");
    let tokens = fresh.tokenize_blocking(&turn2).expect("tokenize");
    assert_eq!(tokens.len() as u32, usage.prompt_tokens);
    let keep = usage.cached_tokens as usize;
    if keep > 0 {
        // Evaluate the prefix alone (no generation), so the suffix is a batch of its own.
        let (_, prefix_usage, _) = run(&fresh, Prompt::Tokens(tokens[..keep].to_vec()), 0);
        assert_eq!(prefix_usage.completion_tokens, 0);
    }
    let (fresh_text, fresh_usage, _) = run(&fresh, Prompt::Tokens(tokens), 32);
    assert_eq!(fresh_usage.cached_tokens, usage.cached_tokens, "same split on both sides");
    assert_eq!(reused_text, fresh_text, "cache reuse changed the output (cut at {keep})");
    assert!(!reused_text.is_empty());
    usage.cached_tokens
}

#[test]
fn smollm2_reused_turn_equals_fresh_context_with_the_same_split() {
    let config = test_config(smollm2_path());
    let system = long_system_prompt(1500);
    let turn1 = chat(vec![ChatMessage::system(&system), ChatMessage::user("Which facts mention trains?")]);
    let turn2 = chat(vec![ChatMessage::system(&system), ChatMessage::user("List three facts about gardens.")]);
    let cached = assert_reuse_matches_fresh_split(&config, turn1, turn2);
    assert!(cached > 1000, "the system prompt was reused: {cached}");
}

/// Turn 1's share of the long system prompt: the cache then holds about 1650 tokens.
const TURN1_LEN: usize = 1600;

/// Cut 1536: within one 512-token window of the end of what the cache holds (~1650).
const NEAR_CUT: usize = 1536;
/// Cut 512: more than a window before the end.
const FAR_CUT: usize = 512;

#[test]
fn gemma_full_swa_cache_reuses_cuts_inside_and_outside_the_window_exactly() {
    let config = test_config(gemma3_path());
    assert!(config.swa_full, "full SWA cache is the default");
    let prompts = Engine::start(config.clone()).expect("loads");
    for cut in [NEAR_CUT, FAR_CUT] {
        let (turn1, turn2) = gemma_turns(&prompts, TURN1_LEN, cut);
        let cached = assert_reuse_matches_fresh_split(&config, turn1, turn2);
        assert_eq!(cached as usize, cut, "the whole common prefix is reused");
    }
}

#[test]
fn gemma_small_swa_cache_never_reuses_a_cut_the_window_no_longer_covers() {
    // One sequence: llama.cpp keeps a window per sequence, and this needs the one window.
    let config = EngineConfig { swa_full: false, parallel: 1, ..test_config(gemma3_path()) };
    let prompts = Engine::start(config.clone()).expect("loads");
    let (turn1, turn2) = gemma_turns(&prompts, TURN1_LEN, FAR_CUT);
    let far = assert_reuse_matches_fresh_split(&config, turn1, turn2);
    assert_eq!(far, 0, "a cut outside the window forces a full prefill");
    // Near the end the outcome depends on what llama.cpp kept; it must be correct either way.
    let (turn1, turn2) = gemma_turns(&prompts, TURN1_LEN, NEAR_CUT);
    assert_reuse_matches_fresh_split(&config, turn1, turn2);
}

#[test]
fn gemma_without_a_template_uses_gemma_turns_and_stops_at_end_of_turn() {
    let engine = Engine::start(test_config(gemma3_path())).expect("gemma loads");
    let info = engine.model_info().expect("info");
    assert_eq!(info.template_source, TemplateSource::Builtin("gemma"));
    assert_eq!(info.n_swa, Some(512));
    let prompt =
        chat(vec![ChatMessage::system("Answer briefly."), ChatMessage::user("What is the capital of France?")]);
    let tokens = engine.tokenize_blocking(&prompt).expect("tokenize");
    let expected = "<bos><start_of_turn>user\nAnswer briefly.\n\nWhat is the capital of France?<end_of_turn>\n<start_of_turn>model\n";
    assert_eq!(
        tokens,
        engine.tokenize_blocking(&Prompt::Text(expected.into())).expect("tokenize"),
        "Gemma turns, one BOS"
    );

    let markers = ["<start_of_turn>", "<end_of_turn>", "<bos>", "<eos>"];
    let (free, _, _) = run(&engine, prompt.clone(), 48);
    assert!(markers.iter().all(|m| !free.contains(m)), "marker leaked into {free:?}");

    // This GGUF is the base (pretrained) gemma-3-270m: its <end_of_turn> is barely trained, so
    // on its own it ends a turn with a look-alike token instead. A logit bias makes the real
    // token win where the turn ends; generation must then stop there, with no marker in the text.
    let end_of_turn =
        *engine.tokenize_blocking(&Prompt::Text("<end_of_turn>".into())).expect("tokenize").last().expect("token");
    let request = GenerationRequest {
        prompt,
        max_tokens: Some(64),
        sampling: SamplingParams { logit_bias: vec![(end_of_turn, 12.0)], ..SamplingParams::greedy() },
        ..GenerationRequest::chat(Vec::new())
    };
    let Generated { text, reason, usage, .. } = generate(&engine, request);
    assert_eq!(reason, FinishReason::Stop, "stopped at <end_of_turn>: {text:?}");
    assert!(usage.completion_tokens > 0 && usage.completion_tokens < 64, "{usage:?}");
    assert!(markers.iter().all(|m| !text.contains(m)), "marker leaked into {text:?}");
}

#[test]
fn identical_prompt_twice_reuses_all_but_the_last_token() {
    let engine = Engine::start(test_config(smollm2_path())).expect("loads");
    let prompt = chat(vec![ChatMessage::user("Hello there")]);
    let (_, first, _) = run(&engine, prompt.clone(), 4);
    let (_, second, _) = run(&engine, prompt, 4);
    assert_eq!(first.cached_tokens, 0);
    assert_eq!(second.cached_tokens, second.prompt_tokens - 1);
}

#[test]
fn missing_and_corrupt_models_fail_to_load_with_clear_errors() {
    let missing = Engine::start(EngineConfig::new("/nonexistent/model.gguf")).expect_err("missing file");
    assert!(missing.to_string().contains("cannot read model file"), "{missing}");
    let corrupt = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("corrupt.gguf");
    std::fs::write(&corrupt, b"GGUF\x03\x00\x00\x00 this is not a model").expect("write");
    let err = Engine::start(EngineConfig::new(&corrupt)).expect_err("corrupt file");
    assert!(err.to_string().contains("could not load"), "{err}");
}
