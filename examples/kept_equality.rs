//! How often a conversation's next turn continued from its kept cells (`--parallel` > 1: a
//! conversation another one displaced stays in its cells) differs from the same turn continued
//! from a copy restored into an otherwise empty cache, which gives what a fresh context gives
//! (docs/serving.md, "Greedy replies beside others").
//!
//! ```text
//! cargo run --release --example kept_equality -- MODEL.gguf [conversations] [on|off]
//! ```
//! For each conversation X: X's first turn, another conversation's turn Y (the same system
//! prompt, another question: it displaces X), then X's second turn, all greedy, 24 tokens. One
//! engine with four sequences continues X's second turn from its kept cells (Y's stay beside
//! them); one with a single sequence restores X from the RAM store. One thread each, flash
//! attention as the last argument says (`auto` when absent). It prints how many second turns
//! differ and where, how far apart the first token's log-probabilities are at most (and for
//! the same prompt evaluated in another split on a third engine without a store, llama.cpp's
//! own yardstick), and where the kept engine's second turns came from. With
//! `KEPT_EQUALITY_NO_Y=1` the other conversation's turn is left out: X's second turn then
//! continues its live cells, the earlier conversations' kept cells beside them.

use std::path::PathBuf;

use firstword::engine::FlashAttention;
use firstword::{CacheSource, ChatMessage, Engine, EngineConfig, Event, GenerationRequest, Prompt, SamplingParams};

const ASKS: [&str; 10] = [
    "Which facts mention trains?",
    "Which facts mention gardens?",
    "Turn on the office light and say so.",
    "What is the warmest room?",
    "Summarise the facts about libraries.",
    "Which region has the most museums?",
    "Close the garage door, please.",
    "What do the facts say about harbors?",
    "Set the kitchen timer for ten minutes.",
    "Name two facts about mountains.",
];

fn request(messages: Vec<ChatMessage>) -> GenerationRequest {
    GenerationRequest {
        prompt: Prompt::chat(messages, Vec::new()),
        max_tokens: Some(24),
        logprobs: Some(5),
        sampling: SamplingParams::greedy(),
        ..GenerationRequest::chat(Vec::new())
    }
}

/// A reply: its text, where its prompt's cache came from, and the likeliest five tokens at
/// its first token with their log-probabilities.
struct Reply {
    text: String,
    source: CacheSource,
    first: Vec<(i32, f32)>,
}

fn run(engine: &Engine, messages: Vec<ChatMessage>) -> Reply {
    let mut generation = engine.submit(request(messages)).expect("submitted");
    let mut text = String::new();
    let mut first = Vec::new();
    while let Some(event) = generation.next_blocking() {
        match event {
            Event::Text(piece) => text.push_str(&piece),
            Event::Logprobs(tokens) if first.is_empty() => {
                first = tokens[0].top.iter().map(|c| (c.token, c.logprob)).collect();
            }
            Event::Finished { timings, .. } => return Reply { text, source: timings.cache.source, first },
            Event::Failed(e) => panic!("generation failed: {e}"),
            Event::Started { .. } | Event::Logprobs(_) => {}
        }
    }
    panic!("no Finished event");
}

/// The largest difference between the log-probabilities two replies give the same token among
/// their first token's likeliest five.
fn largest_difference(a: &Reply, b: &Reply) -> f32 {
    (a.first.iter())
        .filter_map(|(token, logprob)| {
            b.first.iter().find(|(t, _)| t == token).map(|(_, other)| (logprob - other).abs())
        })
        .fold(0.0, f32::max)
}

/// X's first turn, Y's turn, X's second turn: the second turn.
fn turns(engine: &Engine, system: &str, x: &str, y: &str) -> Reply {
    let first = vec![ChatMessage::system(system), ChatMessage::user(x)];
    let reply = run(engine, first.clone()).text;
    if std::env::var_os("KEPT_EQUALITY_NO_Y").is_none() {
        run(engine, vec![ChatMessage::system(system), ChatMessage::user(y)]);
    }
    let mut second = first;
    second.push(ChatMessage::assistant(reply));
    second.push(ChatMessage::user("Thanks. And in one more sentence?"));
    run(engine, second)
}

fn main() {
    let mut args = std::env::args().skip(1);
    let model = PathBuf::from(args.next().expect("usage: kept_equality MODEL.gguf [conversations] [on|off]"));
    let conversations: usize = args.next().map_or(100, |n| n.parse().expect("conversations"));
    let flash_attention = match args.next().as_deref() {
        Some("on") => FlashAttention::On,
        Some("off") => FlashAttention::Off,
        _ => FlashAttention::Auto,
    };
    let config = EngineConfig {
        threads: 1,
        threads_batch: 1,
        fixed_threads: true,
        ctx_size: Some(4096),
        cache_min_tokens: 32,
        flash_attention,
        ..EngineConfig::new(model)
    };
    let kept = Engine::start(EngineConfig { parallel: 4, ..config.clone() }).expect("the model loads");
    let restored = Engine::start(EngineConfig { parallel: 1, ..config.clone() }).expect("the model loads");
    // The same turns with no store: X's second turn is evaluated from the system prompt on,
    // another split of the same prompt (llama.cpp's own rounding between two splits).
    let resplit = Engine::start(EngineConfig { parallel: 1, cache_ram_mib: 0, ..config }).expect("the model loads");
    let mut largest_resplit: f32 = 0.0;
    let system = firstword::bench::synthetic_system_prompt(300);
    let mut differ = Vec::new();
    let mut largest: f32 = 0.0;
    let mut sources = std::collections::BTreeMap::new();
    for i in 0..conversations {
        let x = format!("{} (question {i})", ASKS[i % 10]);
        let y = format!("{} (question {})", ASKS[(i * 3 + 1) % 10], i + 1000);
        let from_kept = turns(&kept, &system, &x, &y);
        let from_copy = turns(&restored, &system, &x, &y);
        *sources.entry(from_kept.source.as_str()).or_insert(0) += 1;
        let (a, b) = (&from_kept.text, &from_copy.text);
        let at = (a != b).then(|| a.chars().zip(b.chars()).take_while(|(x, y)| x == y).count());
        if let Some(at) = at {
            differ.push(at);
        }
        let difference = largest_difference(&from_kept, &from_copy);
        let from_resplit = turns(&resplit, &system, &x, &y);
        largest_resplit = largest_resplit.max(largest_difference(&from_resplit, &from_copy));
        largest = largest.max(difference);
        eprintln!(
            "conversation {i}: {} {at:?}, first token's log-probabilities within {difference}",
            from_kept.source.as_str()
        );
    }
    println!(
        "{conversations} conversations, flash attention {flash_attention:?}: the second turn differs in {} (first difference at characters {differ:?}); its first token's log-probabilities (likeliest five) within {largest} (another split of the same prompt, no store: within {largest_resplit}); kept engine's second turns from {sources:?}",
        differ.len()
    );
}
