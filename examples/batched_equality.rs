//! Whether a greedy reply generated beside another sequence, in shared batches of one llama.cpp
//! context, is the reply generated alone: the measurement behind serving several conversations
//! in one context (docs/cache.md, "Several sequences in one context").
//!
//! ```text
//! cargo run --release --example batched_equality -- MODEL.gguf [pairs] [tokens]
//! ```
//! For each of `pairs` prompt pairs (P, Q), in one context with two sequences and a unified KV
//! cache, P's greedy reply of `tokens` tokens is generated three ways, each from a cleared cache
//! with P's prompt evaluated in the same chunks:
//! - **alone**: one token a step;
//! - **beside**: Q's prompt evaluated too (its own batch), then P's and Q's next tokens in one
//!   batch every step;
//! - **mixed**: after P's fourth token, Q's whole prompt goes into the batch of P's next token
//!   (a new request's prompt chunk beside a streaming reply), then both one token a step.
//!
//! It prints how many of P's replies differ from alone (tokens and text), and where.

use std::num::NonZeroU32;
use std::path::PathBuf;

use llama_cpp_2::context::params::LlamaContextParams;
use llama_cpp_2::context::LlamaContext;
use llama_cpp_2::llama_backend::LlamaBackend;
use llama_cpp_2::llama_batch::LlamaBatch;
use llama_cpp_2::model::params::LlamaModelParams;
use llama_cpp_2::model::LlamaModel;
use llama_cpp_2::token::LlamaToken;

const N_BATCH: usize = 512;
/// P's tokens generated alone before Q's prompt joins its batch (mixed).
const MIXED_AFTER: usize = 4;

fn argmax(logits: &[f32]) -> LlamaToken {
    let best = logits.iter().enumerate().max_by(|a, b| a.1.total_cmp(b.1)).map_or(0, |(i, _)| i);
    LlamaToken(best as i32)
}

/// Evaluates `tokens` of `seq` from position 0 in chunks of [`N_BATCH`]; the greedy next token.
fn prompt(ctx: &mut LlamaContext, tokens: &[LlamaToken], seq: i32) -> LlamaToken {
    let mut batch = LlamaBatch::new(N_BATCH, 1);
    for (c, chunk) in tokens.chunks(N_BATCH).enumerate() {
        batch.clear();
        for (j, &token) in chunk.iter().enumerate() {
            let pos = c * N_BATCH + j;
            batch.add(token, pos as i32, &[seq], pos == tokens.len() - 1).expect("batch room");
        }
        ctx.decode(&mut batch).expect("decode");
    }
    argmax(ctx.get_logits_ith(batch.n_tokens() - 1))
}

/// One step: each `(seq, token, pos)` decoded in one batch (logits for each); the greedy next
/// tokens, in order.
fn step(ctx: &mut LlamaContext, tokens: &[(i32, LlamaToken, usize)]) -> Vec<LlamaToken> {
    let mut batch = LlamaBatch::new(tokens.len().max(1), 2);
    for &(seq, token, pos) in tokens {
        batch.add(token, pos as i32, &[seq], true).expect("batch room");
    }
    ctx.decode(&mut batch).expect("decode");
    (0..tokens.len()).map(|i| argmax(ctx.get_logits_ith(i as i32))).collect()
}

/// Extends P's reply `out` (its prompt `p_len` tokens long) alone, a token a step, to `n` tokens.
fn alone_until(ctx: &mut LlamaContext, p_len: usize, out: &mut Vec<LlamaToken>, n: usize) {
    while out.len() < n {
        let last = *out.last().expect("one");
        out.push(step(ctx, &[(0, last, p_len + out.len() - 1)])[0]);
    }
}

/// Extends P's reply `out` to `n` tokens beside Q's, whose next token is `other` at `other_pos`:
/// both in one batch every step.
fn both_until(
    ctx: &mut LlamaContext,
    p_len: usize,
    out: &mut Vec<LlamaToken>,
    (mut other, mut other_pos): (LlamaToken, usize),
    n: usize,
) {
    while out.len() < n {
        let last = *out.last().expect("one");
        let next = step(ctx, &[(0, last, p_len + out.len() - 1), (1, other, other_pos)]);
        out.push(next[0]);
        other = next[1];
        other_pos += 1;
    }
}

fn alone(ctx: &mut LlamaContext, p: &[LlamaToken], n: usize) -> Vec<LlamaToken> {
    ctx.clear_kv_cache();
    let mut out = vec![prompt(ctx, p, 0)];
    alone_until(ctx, p.len(), &mut out, n);
    out
}

fn beside(ctx: &mut LlamaContext, p: &[LlamaToken], q: &[LlamaToken], n: usize) -> Vec<LlamaToken> {
    ctx.clear_kv_cache();
    let mut out = vec![prompt(ctx, p, 0)];
    let other = prompt(ctx, q, 1);
    both_until(ctx, p.len(), &mut out, (other, q.len()), n);
    out
}

fn mixed(ctx: &mut LlamaContext, p: &[LlamaToken], q: &[LlamaToken], n: usize) -> Vec<LlamaToken> {
    ctx.clear_kv_cache();
    let mut out = vec![prompt(ctx, p, 0)];
    alone_until(ctx, p.len(), &mut out, MIXED_AFTER.min(n));
    if out.len() >= n {
        return out;
    }
    // P's next token and Q's whole prompt in one batch.
    let mut batch = LlamaBatch::new(1 + q.len(), 2);
    let last = *out.last().expect("one");
    batch.add(last, (p.len() + out.len() - 1) as i32, &[0], true).expect("batch room");
    for (i, &token) in q.iter().enumerate() {
        batch.add(token, i as i32, &[1], i == q.len() - 1).expect("batch room");
    }
    ctx.decode(&mut batch).expect("decode");
    out.push(argmax(ctx.get_logits_ith(0)));
    let other = argmax(ctx.get_logits_ith(q.len() as i32));
    both_until(ctx, p.len(), &mut out, (other, q.len()), n);
    out
}

fn text(model: &LlamaModel, tokens: &[LlamaToken]) -> String {
    let vocab = model.vocab();
    let bytes: Vec<u8> = tokens.iter().flat_map(|&t| vocab.token_to_piece(t, true, None)).collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// The `i`th prompt: facts of varied length, then a question.
fn prompt_text(i: usize) -> String {
    let facts = firstword::bench::synthetic_system_prompt(40 + (i * 37) % 260);
    let topics = ["trains", "gardens", "harbors", "bakeries", "rivers", "libraries"];
    format!("{facts}\nQuestion {i}: what do the facts say about {}? Answer:", topics[i % topics.len()])
}

fn main() {
    let mut args = std::env::args().skip(1);
    let path = PathBuf::from(args.next().unwrap_or_else(|| "models/SmolLM2-135M-Instruct.Q4_1.gguf".into()));
    let pairs: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(100);
    let n: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(32);
    let threads: i32 = std::env::var("THREADS").ok().and_then(|t| t.parse().ok()).unwrap_or(2);

    let backend = LlamaBackend::init().expect("backend");
    let model = LlamaModel::load_from_file(&backend, &path, &LlamaModelParams::default()).expect("model loads");
    let params = LlamaContextParams::default()
        .with_n_ctx(NonZeroU32::new(4096))
        .with_n_batch(N_BATCH as u32)
        .with_n_ubatch(N_BATCH as u32)
        .with_n_seq_max(2)
        .with_kv_unified(true)
        .with_n_threads(threads)
        .with_n_threads_batch(threads);
    let mut ctx = model.new_context(&backend, params).expect("context");
    let tokenize = |s: &str| model.vocab().tokenize(s.as_bytes(), true, false);

    let (mut beside_tokens, mut beside_text, mut mixed_tokens, mut mixed_text) = (0, 0, 0, 0);
    for i in 0..pairs {
        let p = tokenize(&prompt_text(i));
        let q = tokenize(&prompt_text(i + pairs));
        let reference = alone(&mut ctx, &p, n);
        for (way, reply, tokens_differ, text_differs) in [
            ("beside", beside(&mut ctx, &p, &q, n), &mut beside_tokens, &mut beside_text),
            ("mixed", mixed(&mut ctx, &p, &q, n), &mut mixed_tokens, &mut mixed_text),
        ] {
            if reply != reference {
                *tokens_differ += 1;
                let at = reply.iter().zip(&reference).take_while(|(a, b)| a == b).count();
                let (a, b) = (text(&model, &reference), text(&model, &reply));
                if a != b {
                    *text_differs += 1;
                }
                println!("pair {i} ({} prompt tokens), {way}: differs from alone at token {at}", p.len());
            }
        }
    }
    println!(
        "{}: {pairs} pairs, {n} tokens each: beside differs in {beside_tokens} (text {beside_text}), mixed differs in {mixed_tokens} (text {mixed_text})",
        path.display()
    );
}
