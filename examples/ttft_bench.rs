//! Time-to-first-token benchmark against any OpenAI-compatible server (firstword or
//! llama-server), interleaving servers so machine drift hits all of them equally.
//!
//! ```text
//! cargo run --release --example ttft_bench -- \
//!     --server firstword=http://127.0.0.1:8080@PID --server llama-server=http://127.0.0.1:8081@PID \
//!     --system-tokens 4000 --turns 5 --reps 3
//! ```
//! Per server: cold TTFT (turn 1, a system prompt never seen before), warm TTFT (mean of turns
//! 2..), their ratio, decode tok/s with a short prompt and after the long one, and peak RSS
//! (VmHWM of the given PID).

use std::time::{Duration, Instant};

use serde_json::{json, Value};

struct Server {
    name: String,
    url: String,
    pid: Option<u32>,
}

#[derive(Default)]
struct Samples {
    cold_ms: Vec<f64>,
    warm_ms: Vec<f64>,
    decode_short: Vec<f64>,
    decode_long: Vec<f64>,
}

struct Turn {
    ttft: Duration,
    prompt_tokens: u64,
    text: String,
    decode_tok_s: f64,
}

fn median(values: &[f64]) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        f64::NAN
    } else {
        v[v.len() / 2]
    }
}

fn mean(values: &[f64]) -> f64 {
    values.iter().sum::<f64>() / values.len().max(1) as f64
}

/// ~`tokens` tokens of varied text; `nonce` makes each repetition's prompt unseen (cold).
fn system_prompt(tokens: usize, nonce: &str) -> String {
    let topics = ["rivers", "mountains", "libraries", "trains", "gardens", "satellites", "bakeries", "harbors"];
    let mut text = format!("Session {nonce}. You are a helpful voice assistant. Facts you know:\n");
    let mut i = 0;
    // SmolLM2 and Gemma tokenize this text at about 2.7 characters per token.
    while text.len() * 3 / 8 < tokens {
        let topic = topics[i % topics.len()];
        text.push_str(&format!(
            "Fact {i}: the {topic} of region {} are known for feature {} since {}.\n",
            i * 7 % 97,
            i * 13 % 31,
            1800 + i * 37 % 200
        ));
        i += 1;
    }
    text
}

async fn stream_turn(
    client: &reqwest::Client,
    server: &Server,
    messages: &[Value],
    max_tokens: u32,
) -> anyhow::Result<Turn> {
    let body = json!({
        "model": "bench", "messages": messages, "max_tokens": max_tokens, "temperature": 0,
        "stream": true, "stream_options": {"include_usage": true}
    });
    let start = Instant::now();
    let mut response = client.post(format!("{}/v1/chat/completions", server.url)).json(&body).send().await?;
    anyhow::ensure!(response.status().is_success(), "HTTP {}", response.status());
    let (mut buffer, mut text) = (String::new(), String::new());
    let (mut first, mut last) = (None, start.elapsed());
    let (mut completion_tokens, mut prompt_tokens) = (0u64, 0u64);
    while let Some(chunk) = response.chunk().await? {
        buffer.push_str(&String::from_utf8_lossy(&chunk));
        while let Some(end) = buffer.find("\n\n") {
            let event: String = buffer.drain(..end + 2).collect();
            let Some(data) = event.lines().find_map(|l| l.strip_prefix("data: ")) else { continue };
            if data == "[DONE]" {
                continue;
            }
            let value: Value = serde_json::from_str(data)?;
            if let Some(content) = value["choices"].get(0).and_then(|c| c["delta"]["content"].as_str()) {
                if !content.is_empty() {
                    first.get_or_insert(start.elapsed());
                    last = start.elapsed();
                    text.push_str(content);
                }
            }
            if let Some(n) = value["usage"]["completion_tokens"].as_u64() {
                completion_tokens = n;
                prompt_tokens = value["usage"]["prompt_tokens"].as_u64().unwrap_or(0);
            }
        }
    }
    let ttft = first.ok_or_else(|| anyhow::anyhow!("no content streamed"))?;
    let decode_window = (last - ttft).as_secs_f64();
    let decode_tok_s = if completion_tokens > 1 && decode_window > 0.0 {
        (completion_tokens - 1) as f64 / decode_window
    } else {
        f64::NAN
    };
    Ok(Turn { ttft, prompt_tokens, text, decode_tok_s })
}

fn peak_rss_mb(pid: u32) -> Option<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kb: f64 =
        status.lines().find_map(|l| l.strip_prefix("VmHWM:"))?.trim().trim_end_matches("kB").trim().parse().ok()?;
    Some(kb / 1024.0)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut servers = Vec::new();
    let (mut system_tokens, mut turns, mut reps) = (4000usize, 5usize, 3usize);
    let mut iter = args.iter();
    while let Some(arg) = iter.next() {
        let mut value = || iter.next().cloned().ok_or_else(|| anyhow::anyhow!("{arg} needs a value"));
        match arg.as_str() {
            "--server" => {
                let spec = value()?;
                let (name, rest) = spec.split_once('=').ok_or_else(|| anyhow::anyhow!("--server NAME=URL[@PID]"))?;
                let (url, pid) = match rest.split_once('@') {
                    Some((url, pid)) => (url.to_string(), Some(pid.parse()?)),
                    None => (rest.to_string(), None),
                };
                servers.push(Server { name: name.to_string(), url, pid });
            }
            "--system-tokens" => system_tokens = value()?.parse()?,
            "--turns" => turns = value()?.parse()?,
            "--reps" => reps = value()?.parse()?,
            other => anyhow::bail!("unknown argument {other}"),
        }
    }
    anyhow::ensure!(!servers.is_empty(), "give at least one --server NAME=URL[@PID]");
    let client = reqwest::Client::builder().timeout(Duration::from_secs(600)).build()?;
    let questions = [
        "Which facts mention trains?",
        "And gardens?",
        "Which region has feature 3?",
        "Summarise in one line.",
        "Anything about harbors?",
        "Thanks, what else?",
    ];
    let mut samples: Vec<Samples> = servers.iter().map(|_| Samples::default()).collect();
    for rep in 0..reps {
        for (server, stats) in servers.iter().zip(samples.iter_mut()) {
            let short = [json!({"role": "user", "content": "Write a long story about a dragon who learns to bake."})];
            let turn = stream_turn(&client, server, &short, 128).await?;
            stats.decode_short.push(turn.decode_tok_s);

            let system = system_prompt(system_tokens, &format!("{rep}-{}-{}", server.name, std::process::id()));
            let mut messages = vec![json!({"role": "system", "content": system})];
            for t in 0..turns {
                messages.push(json!({"role": "user", "content": questions[t % questions.len()]}));
                let turn = stream_turn(&client, server, &messages, 32).await?;
                let ms = turn.ttft.as_secs_f64() * 1e3;
                eprintln!(
                    "rep {rep} {:<14} turn {} prompt {:>5} tokens ttft {ms:>9.1} ms decode {:>6.1} tok/s",
                    server.name,
                    t + 1,
                    turn.prompt_tokens,
                    turn.decode_tok_s
                );
                if t == 0 {
                    stats.cold_ms.push(ms);
                } else {
                    stats.warm_ms.push(ms);
                }
                stats.decode_long.push(turn.decode_tok_s);
                messages.push(json!({"role": "assistant", "content": turn.text}));
            }
        }
    }
    println!(
        "\n{:<14} {:>12} {:>12} {:>10} {:>14} {:>14} {:>12}",
        "server", "cold ms", "warm ms", "warm/cold", "decode short", "decode 4K", "peak RSS MB"
    );
    for (server, stats) in servers.iter().zip(&samples) {
        let (cold, warm) = (median(&stats.cold_ms), mean(&stats.warm_ms));
        println!(
            "{:<14} {:>12.1} {:>12.1} {:>10.4} {:>14.1} {:>14.1} {:>12}",
            server.name,
            cold,
            warm,
            warm / cold,
            median(&stats.decode_short),
            median(&stats.decode_long),
            server.pid.and_then(peak_rss_mb).map_or("-".to_string(), |mb| format!("{mb:.0}")),
        );
    }
    println!("(cold: median of {reps} reps; warm: mean of turns 2..{turns} over all reps; decode: medians)");
    Ok(())
}
