//! How often a greedy reply served beside another (`--parallel`, lanes) differs from the same
//! request served alone, through the engine as the server runs it (docs/serving.md, "Greedy
//! replies beside others").
//!
//! ```text
//! cargo run --release --example lanes_equality -- MODEL.gguf [pairs] [tokens] [b_tokens]
//! ```
//! For each of `pairs` pairs, A asks for a story of `tokens` tokens (its end-of-turn tokens
//! banned, so it streams that long) and B a short command (`b_tokens`, 24 by default; 1: B's
//! prompt is evaluated in a lane but no step is shared), both after the same system prompt.
//! One engine serves A then B one after the other; another serves A and sends B after A's
//! fourth piece of text, so B takes a lane and their tokens share steps. Both engines run one
//! thread and end each pair with the same short request, so every prompt is split the same way
//! (A's after the system prompt that request left; B's after the system prompt A's sequence
//! holds). It prints, for A and for B, how many replies differ and where the first
//! difference lies.

use std::path::PathBuf;
use std::sync::mpsc;
use std::thread;

use firstword::{ChatMessage, Engine, EngineConfig, Event, GenerationRequest, Prompt, SamplingParams};

const ANIMALS: [&str; 10] = ["dragon", "cat", "robot", "owl", "fox", "whale", "knight", "bee", "ghost", "giant"];
const PLACES: [&str; 10] =
    ["kitchen", "garden", "lighthouse", "library", "forest", "train", "castle", "market", "school", "boat"];
const ROOMS: [&str; 10] =
    ["office", "kitchen", "hallway", "bedroom", "garage", "bathroom", "porch", "attic", "cellar", "living room"];

fn request(system: &str, user: &str, max_tokens: u32, banned: &[i32]) -> GenerationRequest {
    GenerationRequest {
        prompt: Prompt::chat(vec![ChatMessage::system(system), ChatMessage::user(user)], Vec::new()),
        max_tokens: Some(max_tokens),
        sampling: SamplingParams {
            logit_bias: banned.iter().map(|&token| (token, f32::NEG_INFINITY)).collect(),
            ..SamplingParams::greedy()
        },
        ..GenerationRequest::chat(Vec::new())
    }
}

/// Reads a generation to its end; `signal` gets one message after its fourth piece of text.
fn read(mut generation: firstword::Generation, signal: Option<mpsc::Sender<()>>) -> String {
    let mut text = String::new();
    let mut pieces = 0;
    while let Some(event) = generation.next_blocking() {
        match event {
            Event::Text(piece) => {
                text.push_str(&piece);
                pieces += 1;
                if pieces == 4 {
                    if let Some(signal) = &signal {
                        let _ = signal.send(());
                    }
                }
            }
            Event::Finished { .. } => return text,
            Event::Failed(e) => panic!("generation failed: {e}"),
            Event::Started { .. } | Event::Logprobs(_) => {}
        }
    }
    text
}

/// Where two texts first differ, in characters; `None` when they are the same.
fn first_difference(a: &str, b: &str) -> Option<usize> {
    (a != b).then(|| a.chars().zip(b.chars()).take_while(|(x, y)| x == y).count())
}

fn main() {
    let mut args = std::env::args().skip(1);
    let model = PathBuf::from(args.next().expect("usage: lanes_equality MODEL.gguf [pairs] [tokens] [b_tokens]"));
    let pairs: usize = args.next().map_or(100, |n| n.parse().expect("pairs"));
    let tokens: u32 = args.next().map_or(64, |n| n.parse().expect("tokens"));
    let b_tokens: u32 = args.next().map_or(24, |n| n.parse().expect("b_tokens"));
    let config = EngineConfig {
        threads: 1,
        threads_batch: 1,
        fixed_threads: true,
        parallel: 2,
        ctx_size: Some(4096),
        ..EngineConfig::new(model)
    };
    let alone = Engine::start(config.clone()).expect("the model loads");
    let together = Engine::start(config).expect("the model loads");
    let banned: Vec<i32> = ["<|im_end|>", "<|endoftext|>", "<end_of_turn>", "<eos>"]
        .iter()
        .filter_map(|text| {
            let ids = alone.tokenize_blocking(&Prompt::Text((*text).into())).ok()?;
            (ids.len() == 1).then(|| ids[0])
        })
        .collect();
    let system = firstword::bench::synthetic_system_prompt(300);
    let (mut a_differ, mut b_differ) = (Vec::new(), Vec::new());
    for i in 0..pairs {
        let story = format!("Tell me a long story about a {} in a {}.", ANIMALS[i % 10], PLACES[(i / 10) % 10]);
        let question = format!("Turn on the {} light and say so.", ROOMS[(i * 7) % 10]);
        let a_alone = read(alone.submit(request(&system, &story, tokens, &banned)).expect("submitted"), None);
        let b_alone = read(alone.submit(request(&system, &question, b_tokens, &[])).expect("submitted"), None);
        let (signal, fourth) = mpsc::channel();
        let a = together.submit(request(&system, &story, tokens, &banned)).expect("submitted");
        let a = thread::spawn(move || read(a, Some(signal)));
        fourth.recv().expect("A streams");
        let b_beside = read(together.submit(request(&system, &question, b_tokens, &[])).expect("submitted"), None);
        let a_beside = a.join().expect("reader");
        // The same last request on both engines, so the next pair's prompts are split alike.
        for engine in [&alone, &together] {
            read(engine.submit(request(&system, "Hi.", 1, &[])).expect("submitted"), None);
        }
        if let Some(at) = first_difference(&a_alone, &a_beside) {
            a_differ.push(at);
        }
        if let Some(at) = first_difference(&b_alone, &b_beside) {
            b_differ.push(at);
        }
        eprintln!(
            "pair {i}: A {:?}, B {:?}",
            first_difference(&a_alone, &a_beside),
            first_difference(&b_alone, &b_beside)
        );
    }
    let lanes = together.cache_status().lanes;
    println!(
        "{pairs} pairs, A {tokens} tokens, B {b_tokens}: A differs in {} (first difference at characters {:?}), B in {} ({:?}); {} requests served in lanes",
        a_differ.len(),
        a_differ,
        b_differ.len(),
        b_differ,
        lanes.served
    );
}
