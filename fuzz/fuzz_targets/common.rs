//! What several targets share: the reading of an input's header bytes, chunkings of a text,
//! the tools of the tool-call targets, and llama.cpp's grammar parser.

#![allow(dead_code)] // Each target uses part of it.

use std::sync::OnceLock;

use firstword::chat::tools::{ToolDefinition, ToolFormat, ToolSet};
use llama_cpp_2::llama_backend::LlamaBackend;
use llama_cpp_2::model::params::LlamaModelParams;
use llama_cpp_2::model::LlamaModel;
use llama_cpp_2::sampling::LlamaSampler;
use serde_json::json;

/// The format a header byte names: `(b - '0') % n` over [`ToolFormat::examples`] (so the seeds'
/// `'0'`..`'8'` are the formats in its order: generic, hermes, llama3, mistral, gemma4,
/// functiongemma, lfm2's pythonic, qwen3-coder's xml, deepseek's name+json).
pub fn format(byte: u8) -> ToolFormat {
    let formats = ToolFormat::examples();
    formats[usize::from(byte.wrapping_sub(b'0')) % formats.len()].clone()
}

/// `text` cut at char boundaries into pieces of 1 to 8 chars, their lengths drawn from `seed`
/// (one seed in eight cuts it one char at a time).
pub fn chunks(text: &str, seed: u64) -> Vec<&str> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let longest = 1 + (state >> 61);
    let mut pieces = Vec::new();
    let mut rest = text;
    while !rest.is_empty() {
        // xorshift64
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        let chars = 1 + (state % longest) as usize;
        let at = rest.char_indices().nth(chars).map_or(rest.len(), |(i, _)| i);
        pieces.push(&rest[..at]);
        rest = &rest[at..];
    }
    pieces
}

/// The tools of the tool-call targets, built once: a key with a `:` for Gemma's parser, an
/// enum, an integer, and a tool without arguments.
pub fn tools() -> &'static ToolSet {
    static TOOLS: OnceLock<ToolSet> = OnceLock::new();
    TOOLS.get_or_init(|| {
        let tool = |name: &str, parameters| ToolDefinition { name: name.into(), description: None, parameters };
        ToolSet::new(vec![
            tool(
                "get_weather",
                json!({"type": "object", "properties": {"city": {"type": "string"}, "a:b": {"type": "string"},
                "unit": {"enum": ["celsius", "fahrenheit"]}}, "required": ["city"]}),
            ),
            tool(
                "set_timer",
                json!({"type": "object", "properties": {"minutes": {"type": "integer"}}, "required": ["minutes"]}),
            ),
            tool("now", json!({"type": "object", "properties": {}})),
        ])
        .expect("the tools are valid")
    })
}

/// Whether llama.cpp's grammar parser (the one generation uses) accepts `gbnf` with `root`.
/// Loads SmolLM2's vocabulary once: a grammar sampler needs one, not weights.
pub fn llama_cpp_parses(gbnf: &str, root: &str) -> bool {
    static VOCAB: OnceLock<(LlamaBackend, LlamaModel)> = OnceLock::new();
    let (_, model) = VOCAB.get_or_init(|| {
        llama_cpp_2::send_logs_to_tracing(llama_cpp_2::LogOptions::default().with_logs_enabled(false));
        let backend = LlamaBackend::init().expect("llama.cpp initializes");
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../models/SmolLM2-135M-Instruct.Q4_1.gguf");
        let params = LlamaModelParams::default().with_vocab_only(true);
        let model = LlamaModel::load_from_file(&backend, path, &params)
            .unwrap_or_else(|e| panic!("{path} loads (make models fetches it): {e}"));
        (backend, model)
    });
    LlamaSampler::grammar(model, gbnf, root).is_ok()
}
