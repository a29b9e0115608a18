//! The preemptive case: a request whose client leaves while the reply's next token is being
//! evaluated, sent again at once. The decode step in progress is stopped midway (nobody reads
//! its token), so the request sent again is not queued behind it: the cache holds only what
//! was evaluated before the client left, the request picks its first token from the parked
//! logits (nothing evaluated before it), and its answer is the one it gives alone. One test in
//! its own binary: it holds the engine at failpoints other tests' engines would reach.

mod common;

use common::{generate, settled_cache, smollm2_path, test_config, Hold};
use firstword::{ChatMessage, Engine, Event, GenerationRequest, Prompt, SamplingParams};

#[test]
#[cfg_attr(not(feature = "failpoints"), ignore = "holds the engine at failpoints: needs --features failpoints")]
fn a_client_that_leaves_during_a_decode_step_stops_it() {
    let _scenario = fail::FailScenario::setup();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_time().build().expect("runtime");
    let messages = vec![
        ChatMessage::system("You are a helpful home assistant."),
        ChatMessage::user("Describe a lighthouse at night."),
    ];
    let request = GenerationRequest {
        prompt: Prompt::chat(messages, Vec::new()),
        max_tokens: Some(40),
        sampling: SamplingParams::greedy(),
        ..GenerationRequest::chat(Vec::new())
    };
    let expected = generate(&Engine::start(test_config(smollm2_path())).expect("SmolLM2 loads"), request.clone());

    let parking = Engine::start(test_config(smollm2_path())).expect("SmolLM2 loads");
    // Held once the prompt is evaluated, before the reply's first token is picked.
    let at_token = Hold::at("engine::token");
    let mut generation = parking.submit(request.clone()).expect("submitted");
    runtime.block_on(at_token.reached());
    let prompt_tokens = match generation.next_blocking() {
        Some(Event::Started { prompt_tokens, .. }) => prompt_tokens,
        other => panic!("the reply started: {other:?}"),
    };
    // Then held in the first token's decode step, where the client leaves.
    let at_decode = Hold::at("engine::decode");
    at_token.release();
    runtime.block_on(at_decode.reached());
    drop(generation);
    at_decode.release();

    let status = settled_cache(&parking);
    assert_eq!(
        status.live_tokens, prompt_tokens,
        "the step the client left during was stopped: the cache holds the prompt alone"
    );
    assert_eq!(status.parking.parked, 1, "{:?}", status.parking);
    let answer = generate(&parking, request);
    let cache = answer.timings.cache.clone();
    eprintln!("{cache:?}\nsent again {:?}\nalone {:?}", answer.text, expected.text);
    assert_eq!(
        (&answer.text, answer.reason, answer.usage.completion_tokens),
        (&expected.text, expected.reason, expected.usage.completion_tokens),
        "the answer is the one the request gives alone"
    );
    assert_eq!(cache.prefilled, 0, "the first token comes from the parked logits: {cache:?}");
    assert_eq!(cache.reused, prompt_tokens, "{cache:?}");
    assert_eq!(settled_cache(&parking).parking.adopted, 1);
}
