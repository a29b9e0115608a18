//! Reuse past changed spans (`--reuse-after-change`, a request's `reuse_after_change`): a
//! prompt that changed near its start (Home Assistant's clock line, an entity's state) keeps
//! what follows the change, says so in `timings.cache`, and never hands its approximate cells
//! to a request that did not accept them. The approximation's quality is measured by
//! examples/change_quality.rs (docs/cache.md); here the mechanics are checked: with every
//! kept token evaluated again the result is what a fresh context gives, and with kept tokens
//! the first token's distribution stays near the exact one.

mod common;

use common::{generate, one_sequence_config, smollm2_path, Generated};
use firstword::engine::ChangeRules;
use firstword::{CacheMiss, ChatMessage, Engine, EngineConfig, GenerationRequest, Prompt, SamplingParams};

/// A Home Assistant style system prompt: the clock first, then the home's devices.
fn system(clock: &str, kitchen: &str) -> String {
    let mut text = format!("Current time is {clock}.\nYou are a voice assistant for Home Assistant.\n");
    text.push_str("Answer in plain text. Keep it simple and to the point.\nDevices:\n");
    for i in 0..30 {
        let state = if i == 7 {
            kitchen
        } else if i % 3 == 0 {
            "off"
        } else {
            "on"
        };
        text.push_str(&format!("- names: Light {i}\n  domain: light\n  state: '{state}'\n  areas: Room {}\n", i % 5));
    }
    text
}

fn request(system: &str, reuse: Option<bool>) -> GenerationRequest {
    GenerationRequest {
        prompt: Prompt::chat(
            vec![ChatMessage::system(system), ChatMessage::user("Is light 7 on? Answer yes or no.")],
            Vec::new(),
        ),
        max_tokens: Some(12),
        logprobs: Some(5),
        sampling: SamplingParams::greedy(),
        reuse_after_change: reuse,
        ..GenerationRequest::chat(Vec::new())
    }
}

/// The reply, with its first token's five likeliest tokens and their log-probabilities.
fn run(engine: &Engine, request: GenerationRequest) -> (Generated, Vec<(i32, f32)>) {
    let generated = generate(engine, request);
    let first = generated.logprobs.first().map_or_else(Vec::new, |token| {
        token.top.iter().map(|candidate| (candidate.token, candidate.logprob)).collect()
    });
    (generated, first)
}

/// The largest difference between two first-token distributions' log-probabilities, over the
/// tokens both list; panics unless they agree on the likeliest token.
fn farthest(a: &[(i32, f32)], b: &[(i32, f32)]) -> f32 {
    assert_eq!(a[0].0, b[0].0, "the same likeliest first token: {a:?} {b:?}");
    a.iter().filter_map(|(t, p)| b.iter().find(|(u, _)| u == t).map(|(_, q)| (p - q).abs())).fold(0.0, f32::max)
}

/// The largest difference between two first-token distributions' probabilities, over the
/// tokens both list; panics unless they agree on the likeliest token. (A log-probability far
/// down the list moves more for the same change.)
fn farthest_probability(a: &[(i32, f32)], b: &[(i32, f32)]) -> f32 {
    assert_eq!(a[0].0, b[0].0, "the same likeliest first token: {a:?} {b:?}");
    (a.iter())
        .filter_map(|(t, p)| b.iter().find(|(u, _)| u == t).map(|(_, q)| (p.exp() - q.exp()).abs()))
        .fold(0.0, f32::max)
}

fn exact(config: &EngineConfig, system: &str) -> (Generated, Vec<(i32, f32)>) {
    let fresh = Engine::start(EngineConfig { cache_ram_mib: 0, reuse_after_change: false, ..config.clone() })
        .expect("the model loads");
    run(&fresh, request(system, Some(false)))
}

#[test]
fn a_changed_clock_keeps_what_follows_it_and_says_so() {
    // One sequence: the context gets a spare one to evaluate spans on.
    let config = EngineConfig { reuse_after_change: true, ..one_sequence_config(smollm2_path()) };
    let engine = Engine::start(config.clone()).expect("the model loads");
    run(&engine, request(&system("16:00:24", "off"), None));
    // The clock longer by some tokens, and the kitchen light's state changed: two spans, the
    // second after what follows the first was moved.
    let changed = system("4:01 in the afternoon on Sunday", "unavailable");
    let (reused, first) = run(&engine, request(&changed, None));
    let cache = &reused.timings.cache;
    eprintln!("{cache:?} {:?}", reused.text);
    assert_eq!(cache.reason, Some(CacheMiss::ReusedAfterChange));
    let changes = cache.changes.as_ref().expect("the spans are reported");
    assert_eq!(changes.spans.len(), 2, "{changes:?}");
    assert!(changes.spans[0].new_len > changes.spans[0].old_len, "the clock grew: {changes:?}");
    assert!(changes.kept > 500, "what follows the clock was kept: {changes:?}");
    assert_eq!(cache.reused, reused.usage.cached_tokens, "cached tokens are those not evaluated");
    assert_eq!(cache.prefilled + cache.reused, reused.usage.prompt_tokens);
    assert!(cache.prefilled < 60, "only the spans and the newest turn were evaluated: {cache:?}");

    let (exact, exact_first) = exact(&config, &changed);
    let apart = farthest(&first, &exact_first);
    eprintln!("first token's log-probabilities at most {apart} apart; exact {:?}", exact.text);
    // Moved positions or a span evaluated in the wrong place give another distribution
    // altogether; the approximation's own distance is measured in docs/cache.md.
    assert!(apart < 0.5, "{first:?} vs {exact_first:?}");
}

#[test]
fn with_every_kept_token_evaluated_again_the_reply_is_a_fresh_context_s() {
    let rules = ChangeRules { redo: 100_000, min_saving: 0, ..ChangeRules::default() };
    let config = EngineConfig { reuse_after_change: true, change_rules: rules, ..one_sequence_config(smollm2_path()) };
    let engine = Engine::start(config.clone()).expect("the model loads");
    let before = request(&system("16:00:24", "off"), None);
    run(&engine, before.clone());
    let changed = system("4:01 in the afternoon on Sunday", "off");
    let (reused, first) = run(&engine, request(&changed, None));
    let cache = reused.timings.cache.clone();
    let changes = cache.changes.clone().expect("reused past the clock");
    assert_eq!(changes.kept, 0, "nothing kept: {changes:?}");
    // A fresh context evaluating the same split: the first prompt, then from the change to
    // where the reuse ended, then the rest.
    let fresh = Engine::start(EngineConfig { cache_ram_mib: 0, reuse_after_change: false, ..config.clone() })
        .expect("the model loads");
    let tokens = |request: &GenerationRequest| fresh.tokenize_blocking(&request.prompt).expect("tokenized");
    let split =
        |tokens: Vec<_>| GenerationRequest { prompt: Prompt::Tokens(tokens), max_tokens: Some(0), ..request("", None) };
    let new = tokens(&request(&changed, None));
    let end = (cache.reused + changes.evaluated) as usize;
    run(&fresh, split(tokens(&before)));
    run(&fresh, split(new[..end].to_vec()));
    let (exact, exact_first) =
        run(&fresh, GenerationRequest { prompt: Prompt::Tokens(new), ..request("", Some(false)) });
    assert_eq!(exact.timings.cache.prefilled, cache.prefilled - changes.evaluated, "the same split");
    let apart = farthest(&first, &exact_first);
    eprintln!("{apart} {:?} {:?}", reused.text, exact.text);
    // Cells placed elsewhere in the cache change llama.cpp's sums (docs/serving.md): by up to
    // 0.2 on this model for another split of the same prompt, llama.cpp's own yardstick.
    assert!(apart < 0.2, "{first:?} vs {exact_first:?}");
    assert_eq!(reused.text, exact.text);
}

#[test]
fn a_request_that_does_not_accept_the_approximation_never_reuses_its_cells() {
    // Four sequences (the default): a free one evaluates the spans.
    let config = common::test_config(smollm2_path());
    let engine = Engine::start(config.clone()).expect("the model loads");
    // Off by default: the request asks for it.
    let (first_turn, _) = run(&engine, request(&system("16:00:24", "off"), None));
    assert_eq!(first_turn.timings.cache.changes, None);
    let changed = system("16:05:41", "off");
    let (reused, _) = run(&engine, request(&changed, Some(true)));
    assert_eq!(reused.timings.cache.reason, Some(CacheMiss::ReusedAfterChange));
    let clock_at = reused.timings.cache.changes.as_ref().expect("spans").spans[0].at;
    assert_eq!(common::settled_cache(&engine).live_approximate_from, Some(clock_at), "/cache says where");
    // The same prompt again, without the approximation: the cells kept past the clock are
    // evaluated again, and the reply is the exact one.
    let (again, _) = run(&engine, request(&changed, None));
    let cache = &again.timings.cache;
    assert_eq!(cache.reason, Some(CacheMiss::ApproximateCells), "{cache:?}");
    assert!(cache.reused <= clock_at, "nothing kept past the change: {cache:?}");
    let (exact, _) = exact(&config, &changed);
    assert_eq!(again.text, exact.text);
    // Now exact again: the next request reuses all of it.
    let (third, _) = run(&engine, request(&changed, None));
    assert_eq!(third.timings.cache.reason, Some(CacheMiss::PromptShorter));
    assert_eq!(common::settled_cache(&engine).live_approximate_from, None);
}

#[test]
fn a_kept_conversation_sharing_the_moved_cells_is_not_disturbed() {
    // Four sequences: X's first turn, then Y (another question, the same system prompt)
    // displaces X, which stays kept in its cells, sharing the system prompt's with Y. Y's
    // next turn changes the clock's length, which moves the cells after it: X's shared cells
    // must not move with them. X's next turn (exact) then equals a fresh context's.
    let config = EngineConfig { cache_min_tokens: 32, ..common::test_config(smollm2_path()) };
    let engine = Engine::start(config.clone()).expect("the model loads");
    let clock = system("16:00:24", "off");
    let ask = |system: &str, question: &str, reuse: Option<bool>| GenerationRequest {
        prompt: Prompt::chat(vec![ChatMessage::system(system), ChatMessage::user(question)], Vec::new()),
        max_tokens: Some(12),
        sampling: SamplingParams::greedy(),
        reuse_after_change: reuse,
        ..GenerationRequest::chat(Vec::new())
    };
    generate(&engine, ask(&clock, "Which lights are in Room 2? Name them, please.", None));
    generate(&engine, ask(&clock, "Is light 7 on? Answer yes or no, nothing more than that.", None));
    let kept = common::settled_cache(&engine).kept;
    assert_eq!(kept.len(), 1, "X is kept in its cells: {kept:?}");
    assert!(kept[0].shared > 500 && kept[0].shared < kept[0].tokens, "sharing the system prompt: {kept:?}");
    let moved = generate(&engine, ask(&system("4:01 in the afternoon", "off"), "Is light 7 on?", Some(true)));
    assert_eq!(moved.timings.cache.reason, Some(CacheMiss::ReusedAfterChange), "{:?}", moved.timings.cache);
    let x = ask(&clock, "Which lights are in Room 2? Name them, please.", None);
    let again = generate(&engine, x.clone());
    let fresh = Engine::start(EngineConfig { cache_ram_mib: 0, ..config }).expect("the model loads");
    let expected = generate(&fresh, x);
    eprintln!("{:?}\n{:?}\n{:?}", again.timings.cache, again.text, expected.text);
    assert_eq!(again.text, expected.text, "X's cells were not moved under it");
}

/// Reply tokens a prefill generated ahead after a reuse past changes are adopted only by a
/// request that accepts the approximation; another evaluates its prompt again and answers
/// exactly.
#[test]
fn tokens_generated_ahead_from_approximate_cells_go_only_to_a_request_that_accepts_them() {
    let config = common::test_config(smollm2_path());
    let engine = Engine::start(config.clone()).expect("the model loads");
    run(&engine, request(&system("16:00:24", "off"), None));
    let changed = system("16:05:41", "off");
    let ahead = GenerationRequest { pregenerate: Some(8), ..request(&changed, Some(true)) };
    let report = engine.prefill(ahead).expect("queued").wait_blocking().expect("prefilled");
    assert_eq!(report.timings.cache.reason, Some(CacheMiss::ReusedAfterChange), "{:?}", report.timings.cache);
    let (exact_again, _) = run(&engine, request(&changed, Some(false)));
    let cache = &exact_again.timings.cache;
    assert_eq!(cache.adopted, 0, "nothing generated from approximate cells: {cache:?}");
    assert_eq!(cache.reason, Some(CacheMiss::ApproximateCells), "{cache:?}");
    let (exact, _) = exact(&config, &changed);
    assert_eq!(exact_again.text, exact.text);
}

/// Another conversation took the live sequence between two turns of a Home Assistant one,
/// whose clock (first) and a device's state moved meanwhile: the turn is served from where the
/// conversation was kept, past the changes, with the first token's distribution near the
/// exact one. One sequence: it was saved to the RAM store; four: kept in its cells.
#[test]
fn a_conversation_another_displaced_is_reused_past_its_changes() {
    for (config, source) in [
        (one_sequence_config(smollm2_path()), firstword::CacheSource::Ram),
        (common::test_config(smollm2_path()), firstword::CacheSource::Kept),
    ] {
        let config = EngineConfig { reuse_after_change: true, cache_min_tokens: 32, ..config };
        let engine = Engine::start(config.clone()).expect("the model loads");
        run(&engine, request(&system("16:00:24", "off"), None));
        // Another conversation that opens with the new clock line: it shares more of the next
        // turn's start than the displaced one does, which only a reuse past changes outweighs.
        let title = ChatMessage::system("Current time is 16:07:53.\nYou write short titles for chats.");
        let other = GenerationRequest {
            prompt: Prompt::chat(vec![title, ChatMessage::user("Lights at home.")], Vec::new()),
            max_tokens: Some(8),
            sampling: SamplingParams::greedy(),
            ..GenerationRequest::chat(Vec::new())
        };
        generate(&engine, other);
        let changed = system("16:07:53", "on");
        let (reused, first) = run(&engine, request(&changed, None));
        let cache = &reused.timings.cache;
        eprintln!("{cache:?}");
        assert_eq!((cache.reason, cache.source), (Some(CacheMiss::ReusedAfterChange), source), "{cache:?}");
        let changes = cache.changes.as_ref().expect("the spans are reported");
        assert!(changes.kept > 500, "what follows the clock was kept: {changes:?}");
        assert!(cache.prefilled < 60, "only the spans and the newest turn were evaluated: {cache:?}");
        let (_, exact_first) = exact(&config, &changed);
        let apart = farthest(&first, &exact_first);
        assert!(apart < 0.5, "{first:?} vs {exact_first:?}");
    }
}

/// A model with a sliding window (gemma-3): a span evaluated in the middle of the prompt needs
/// the window before it, whose cells llama.cpp would write new tokens over once they fell out
/// of the sequence's window; the guard sequence keeps them all. Four turns, the clock and the
/// kitchen light (both deep inside the window's past by then) changing each time, the history
/// growing, the clock's length changing once (what follows it moves): every turn is reused
/// past its changes (without the guard the third is not: sequence 0 lost its first positions,
/// and the cache was dropped), and its first token's distribution stays near the exact one.
#[test]
fn a_sliding_window_is_reused_past_changes_with_every_cell_kept() {
    let config = EngineConfig { reuse_after_change: true, ..common::test_config(common::gemma3_path()) };
    let engine = Engine::start(config.clone()).expect("the model loads");
    let mut history = Vec::new();
    for (turn, (clock, kitchen)) in
        [("16:00:24", "off"), ("16:03:10", "on"), ("4:07 in the afternoon", "off"), ("16:12:05", "on")]
            .into_iter()
            .enumerate()
    {
        let mut messages = vec![ChatMessage::system(system(clock, kitchen))];
        messages.extend(history.iter().cloned());
        messages.push(ChatMessage::user(format!("Turn {turn}: is light 7 on? Answer yes or no.")));
        let ask = GenerationRequest { prompt: Prompt::chat(messages.clone(), Vec::new()), ..request("", None) };
        let (reply, first) = run(&engine, ask.clone());
        let cache = &reply.timings.cache;
        eprintln!("turn {turn}: {cache:?} {:?}", reply.text);
        if turn > 0 {
            assert_eq!(cache.reason, Some(CacheMiss::ReusedAfterChange), "{cache:?}");
            let changes = cache.changes.as_ref().expect("the spans are reported");
            assert!(changes.kept > 400, "what follows the changes was kept: {changes:?}");
            let fresh = Engine::start(EngineConfig { cache_ram_mib: 0, reuse_after_change: false, ..config.clone() })
                .expect("the model loads");
            let (exact, exact_first) = run(&fresh, GenerationRequest { reuse_after_change: Some(false), ..ask });
            let apart = farthest_probability(&first, &exact_first);
            eprintln!(
                "first token's probabilities at most {apart} apart: {first:?} {exact_first:?} exact {:?}",
                exact.text
            );
            assert!(apart < 0.05, "{first:?} vs {exact_first:?}");
        }
        history.push(messages.pop().expect("the question"));
        history.push(ChatMessage::assistant(reply.text.clone()));
    }
}

/// With the small window cache (`--swa-small`), which holds only the last window, the reuse is
/// refused: the reply says why, and is the exact one.
#[test]
fn a_small_window_cache_keeps_exact_reuse_and_says_why() {
    let config =
        EngineConfig { reuse_after_change: true, swa_full: false, ..common::test_config(common::gemma3_path()) };
    let engine = Engine::start(config.clone()).expect("the model loads");
    run(&engine, request(&system("16:00:24", "off"), None));
    let changed = system("16:07:53", "on");
    let (again, _) = run(&engine, request(&changed, None));
    let cache = &again.timings.cache;
    assert_eq!(cache.reason, Some(CacheMiss::CannotReuseAfterChange), "{cache:?}");
    assert_eq!(cache.changes, None);
    let (exact, _) = exact(&config, &changed);
    assert_eq!(again.text, exact.text);
}
