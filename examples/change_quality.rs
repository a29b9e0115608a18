//! What reuse past changed spans (`--reuse-after-change`) costs in quality: Home Assistant
//! style sessions replayed on an engine that reuses past the changes and on one that does
//! not, the same prompts on both, turn by turn (docs/cache.md, "Reuse past a change").
//!
//! ```text
//! cargo run --release --example change_quality -- MODEL.gguf [TEMPLATE.jinja|-] [sessions] [entities]
//! ```
//! Layouts, as Home Assistant writes its system message (`homeassistant/helpers/llm.py` and
//! custom conversation integrations): `clock-last` (instructions, the devices with their
//! states as YAML, then "Current time is …"), `clock-first` ("Current Time: …" first, then a
//! CSV of every device's state). Each session has four turns a minute or so apart; between
//! turns the clock moves and one or two devices change state, and the history grows with the
//! replies. From the second turn on, each turn's first token is compared: the KL divergence
//! of the exact next-token distribution from the reused one's (over the likeliest 20 tokens
//! both list, the rest as one bucket: a lower bound of the full divergence), whether the
//! likeliest token is the same, and whether the greedy reply (24 tokens) is the same, for a
//! neighbourhood of 0, 16 and 64 tokens evaluated again after each span. With the prompt
//! tokens evaluated and the prompt times of both. The `resplit` row is llama.cpp's own
//! yardstick: the exact engine's turn against the same prompt evaluated whole in a fresh
//! cache (another split of the same tokens, nothing approximated).

use std::path::PathBuf;
use std::time::Duration;

use firstword::bench::{HeadLayout, Home, HOME_ASKS};
use firstword::engine::ChangeRules;
use firstword::{CacheMiss, ChatMessage, Engine, EngineConfig, Event, GenerationRequest, Prompt, SamplingParams};

const REDO: [usize; 3] = [0, 16, 64];

/// A reply: its text, its first token's likeliest 20 with log-probabilities, the prompt
/// tokens it evaluated, its prompt time and whether it reused past changes.
struct Reply {
    text: String,
    first: Vec<(i32, f32)>,
    evaluated: u32,
    prompt: Duration,
    reused: bool,
}

fn run(engine: &Engine, messages: &[ChatMessage]) -> Reply {
    let request = GenerationRequest {
        prompt: Prompt::chat(messages.to_vec(), Vec::new()),
        max_tokens: Some(24),
        logprobs: Some(20),
        sampling: SamplingParams::greedy(),
        ..GenerationRequest::chat(Vec::new())
    };
    let mut generation = engine.submit(request).expect("submitted");
    let (mut text, mut first) = (String::new(), Vec::new());
    while let Some(event) = generation.next_blocking() {
        match event {
            Event::Text(piece) => text.push_str(&piece),
            Event::Logprobs(tokens) if first.is_empty() => {
                first = tokens[0].top.iter().map(|c| (c.token, c.logprob)).collect();
            }
            Event::Finished { timings, .. } => {
                let cache = &timings.cache;
                let reused = cache.reason == Some(CacheMiss::ReusedAfterChange);
                return Reply { text, first, evaluated: cache.prefilled, prompt: timings.prompt, reused };
            }
            Event::Failed(e) => panic!("generation failed: {e}"),
            Event::Started { .. } | Event::Logprobs(_) => {}
        }
    }
    panic!("no Finished event");
}

/// KL(exact ‖ reused) over the tokens both list among their likeliest, the rest one bucket.
fn kl(exact: &[(i32, f32)], reused: &[(i32, f32)]) -> f64 {
    let both: Vec<(f64, f64)> = (exact.iter())
        .filter_map(|(t, p)| {
            reused.iter().find(|(u, _)| u == t).map(|(_, q)| (f64::from(*p).exp(), f64::from(*q).exp()))
        })
        .collect();
    let rest_p = (1.0 - both.iter().map(|b| b.0).sum::<f64>()).max(1e-12);
    let rest_q = (1.0 - both.iter().map(|b| b.1).sum::<f64>()).max(1e-12);
    both.iter().map(|(p, q)| p * (p / q).ln()).sum::<f64>() + rest_p * (rest_p / rest_q).ln()
}

#[derive(Default)]
struct Tally {
    turns: usize,
    reused: usize,
    kl: Vec<f64>,
    top1_same: usize,
    reply_same: usize,
    evaluated: u64,
    prompt: Duration,
}

impl Tally {
    /// One follow-up turn: `reply` against the `exact` one.
    fn count(&mut self, exact: &Reply, reply: &Reply) {
        self.turns += 1;
        self.reused += usize::from(reply.reused);
        self.kl.push(kl(&exact.first, &reply.first));
        self.top1_same += usize::from(exact.first.first().map(|f| f.0) == reply.first.first().map(|f| f.0));
        self.reply_same += usize::from(exact.text == reply.text);
        self.evaluated += u64::from(reply.evaluated);
        self.prompt += reply.prompt;
    }
}

fn main() {
    let mut args = std::env::args().skip(1);
    let model =
        PathBuf::from(args.next().expect("usage: change_quality MODEL.gguf [TEMPLATE|-] [sessions] [entities]"));
    let template = args.next().filter(|t| t != "-").map(PathBuf::from);
    let sessions: usize = args.next().map_or(3, |n| n.parse().expect("sessions"));
    let entities: usize = args.next().map_or(24, |n| n.parse().expect("entities"));
    let base = EngineConfig {
        threads: 2,
        threads_batch: 2,
        fixed_threads: true,
        ctx_size: Some(8192),
        parallel: 1,
        chat_template_file: template.clone(),
        ..EngineConfig::new(&model)
    };
    let exact_engine = Engine::start(base.clone()).expect("the model loads");
    let whole = Engine::start(EngineConfig { cache_ram_mib: 0, ..base.clone() }).expect("the model loads");
    let reusing: Vec<Engine> = (REDO.iter())
        .map(|&redo| {
            let change_rules = ChangeRules { redo, ..ChangeRules::default() };
            Engine::start(EngineConfig { reuse_after_change: true, change_rules, ..base.clone() }).expect("loads")
        })
        .collect();
    let name = |p: &PathBuf| p.file_name().map_or(String::new(), |n| n.to_string_lossy().into_owned());
    println!(
        "model {}, template {}, {sessions} sessions of 4 turns, {entities} devices",
        name(&model),
        template.as_ref().map_or("the model's".into(), name)
    );
    println!("| layout | redo | turns reused | KL mean | KL max | same top token | same reply | tokens evaluated (exact) | prompt ms (exact) |");
    println!("|---|---|---|---|---|---|---|---|---|");
    for layout in [HeadLayout::ClockLast, HeadLayout::ClockFirst] {
        let mut tallies: Vec<Tally> = REDO.iter().map(|_| Tally::default()).collect();
        let mut exact_tally = Tally::default();
        let mut resplit = Tally::default();
        for session in 0..sessions {
            let mut home = Home::new(entities);
            let mut history: Vec<ChatMessage> = Vec::new();
            for turn in 0..4 {
                let minutes = session * 97 + turn * 3 + (turn * turn) % 2;
                if turn > 0 {
                    home.step(session * 4 + turn);
                }
                let mut messages = vec![ChatMessage::system(home.system(layout, minutes))];
                messages.extend(history.iter().cloned());
                messages.push(ChatMessage::user(HOME_ASKS[(session * 3 + turn) % HOME_ASKS.len()]));
                let exact = run(&exact_engine, &messages);
                let replies: Vec<Reply> = reusing.iter().map(|engine| run(engine, &messages)).collect();
                if turn > 0 {
                    // Another conversation first, so the prompt is evaluated whole.
                    run(&whole, &[ChatMessage::user("Hello.")]);
                    resplit.count(&exact, &run(&whole, &messages));
                    exact_tally.count(&exact, &exact);
                    for (tally, reply) in tallies.iter_mut().zip(&replies) {
                        tally.count(&exact, reply);
                    }
                }
                // Both continue with the exact reply, so every turn's prompt is the same on all.
                history.push(messages.pop().expect("the user turn"));
                history.push(ChatMessage::assistant(exact.text));
            }
        }
        let rows = tallies.iter().zip(REDO.map(|redo| redo.to_string())).chain([(&resplit, "resplit".to_string())]);
        for (tally, redo) in rows {
            let n = tally.turns.max(1);
            let mean = tally.kl.iter().sum::<f64>() / n as f64;
            let max = tally.kl.iter().copied().fold(0.0, f64::max);
            println!(
                "| {} | {redo} | {}/{} | {mean:.4} | {max:.4} | {}/{n} | {}/{n} | {} ({}) | {:.0} ({:.0}) |",
                layout.name(),
                tally.reused,
                tally.turns,
                tally.top1_same,
                tally.reply_same,
                tally.evaluated / n as u64,
                exact_tally.evaluated / n as u64,
                tally.prompt.as_secs_f64() * 1e3 / n as f64,
                exact_tally.prompt.as_secs_f64() * 1e3 / n as f64,
            );
        }
    }
}
