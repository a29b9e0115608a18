//! Embedding firstword without HTTP: load a model, ask two questions, watch the cache work.
//!
//! `cargo run --release --example chat -- models/SmolLM2-135M-Instruct.Q4_1.gguf`

use std::io::Write;

use firstword::{ChatMessage, Engine, EngineConfig, Event, GenerationRequest};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let model = std::env::args().nth(1).unwrap_or_else(|| "models/SmolLM2-135M-Instruct.Q4_1.gguf".into());
    let engine = Engine::start(EngineConfig::new(model))?;
    let mut conversation = vec![ChatMessage::system("You are a friendly assistant. Answer in one sentence.")];
    for question in ["What is the tallest mountain on Earth?", "And the second tallest?"] {
        conversation.push(ChatMessage::user(question));
        let mut request = GenerationRequest::chat(conversation.clone());
        request.max_tokens = Some(64);
        let mut generation = engine.submit(request)?;
        let mut answer = String::new();
        print!("> {question}\n< ");
        while let Some(event) = generation.next_blocking() {
            match event {
                Event::Text(text) => {
                    print!("{text}");
                    std::io::stdout().flush()?;
                    answer.push_str(&text);
                }
                Event::Finished { usage, timings, .. } => println!(
                    "\n  [{} prompt tokens, {} from cache, prefill {:.0} ms]",
                    usage.prompt_tokens,
                    usage.cached_tokens,
                    timings.prompt.as_secs_f64() * 1e3
                ),
                Event::Failed(e) => return Err(e.into()),
                Event::Started { .. } | Event::Logprobs(_) => {}
            }
        }
        conversation.push(ChatMessage::assistant(answer));
    }
    Ok(())
}
