//! Decode speed with and without a grammar, on the engine directly (no HTTP), interleaved.
//!
//! ```text
//! cargo run --release --example constrained_decode -- models/SmolLM2-135M-Instruct.Q4_1.gguf [reps] [tokens]
//! ```
//! Each repetition runs the same prompt (tools described in it) three ways — free text, a
//! JSON-schema reply (every token checked against the grammar) and forced tool calls — with the
//! same seed, and reports median generated tokens per second and the constrained/free ratios.

use std::path::PathBuf;

use firstword::chat::tools::{request_grammar, OutputSchema, ToolChoice, ToolDefinition, ToolFormat, ToolSet};
use firstword::{ChatMessage, Engine, EngineConfig, Event, GenerationRequest, Grammar, Prompt, SamplingParams};
use serde_json::json;

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied().unwrap_or(f64::NAN)
}

/// Generates with `grammar`; returns (tokens, tokens per second of the generation phase).
fn run(
    engine: &Engine,
    format: &ToolFormat,
    tools: &[ToolDefinition],
    grammar: Option<Grammar>,
    tokens: u32,
    seed: u32,
) -> (u32, f64) {
    let messages = vec![
        ChatMessage::system("You are a helpful assistant for a smart home."),
        ChatMessage::user("Tell me a long story about the weather in Paris, then set a timer."),
    ];
    let request = GenerationRequest {
        prompt: Prompt::chat(messages, tools.to_vec()),
        max_tokens: Some(tokens),
        sampling: SamplingParams { seed: Some(seed), ..SamplingParams::default() },
        grammar,
        preserved_tokens: format.markers(),
        ..GenerationRequest::chat(Vec::new())
    };
    let mut generation = engine.submit(request).expect("submitted");
    while let Some(event) = generation.next_blocking() {
        match event {
            Event::Finished { usage, timings, .. } => {
                let seconds = timings.generation.as_secs_f64().max(1e-9);
                return (usage.completion_tokens, f64::from(usage.completion_tokens) / seconds);
            }
            Event::Failed(e) => panic!("generation failed: {e}"),
            Event::Started { .. } | Event::Text(_) | Event::Logprobs(_) => {}
        }
    }
    panic!("no Finished event");
}

fn main() {
    let mut args = std::env::args().skip(1);
    let model = PathBuf::from(args.next().unwrap_or_else(|| "models/SmolLM2-135M-Instruct.Q4_1.gguf".into()));
    let reps: u32 = args.next().and_then(|a| a.parse().ok()).unwrap_or(5);
    let tokens: u32 = args.next().and_then(|a| a.parse().ok()).unwrap_or(128);
    let engine = Engine::start(EngineConfig { ctx_size: Some(4096), ..EngineConfig::new(model) }).expect("model loads");
    let format = engine.model_info().expect("loaded").tool_format;

    let specs = vec![ToolDefinition {
        name: "get_weather".into(),
        description: Some("Current weather in a city".into()),
        parameters: json!({"type": "object", "properties": {"city": {"type": "string"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["city", "unit"]}),
    }];
    let tools = ToolSet::new(specs.clone()).expect("tools");
    let story = OutputSchema::new(&json!({"type": "object", "properties": {"title": {"type": "string"},
        "story": {"type": "string"}}, "required": ["title", "story"]}))
    .expect("schema");
    let json_grammar = request_grammar(&format, &ToolSet::default(), &ToolChoice::Auto, true, Some(&story));
    let call_grammar = request_grammar(&format, &tools, &ToolChoice::Required, true, None);

    let (mut free, mut json_out, mut calls) = (Vec::new(), Vec::new(), Vec::new());
    for rep in 0..reps {
        let (n_free, free_rate) = run(&engine, &format, &specs, None, tokens, rep);
        let (n_json, json_rate) = run(&engine, &format, &specs, json_grammar.clone(), tokens, rep);
        let (n_call, call_rate) = run(&engine, &format, &specs, call_grammar.clone(), tokens, rep);
        println!(
            "rep {rep}: free {n_free} tok {free_rate:.1} tok/s | json_schema {n_json} tok {json_rate:.1} tok/s | tool call {n_call} tok {call_rate:.1} tok/s"
        );
        free.push(free_rate);
        json_out.push(json_rate);
        calls.push(call_rate);
    }
    let (free, json_out, calls) = (median(&mut free), median(&mut json_out), median(&mut calls));
    println!(
        "median tok/s: free {free:.1}, json_schema {json_out:.1} ({:.2}x), tool call {calls:.1} ({:.2}x)",
        json_out / free,
        calls / free
    );
}
