//! JSON schema → GBNF grammar, through the request limits as the endpoint applies them.
//!
//! Input: a JSON schema (inputs that are not JSON are skipped). It is sent as a tool's
//! parameters (`tool_choice` `required` or `auto`, by the input's length) and as the
//! `response_format` schema, for the call format the length picks (`common::format`).
//!
//! Checks: the limits in `api/limits.rs` keep llama.cpp's converter from crashing or hanging
//! (libFuzzer's `-timeout` reports a slow input); a refused schema is a 4xx; and every grammar
//! built from an accepted one parses in llama.cpp's grammar parser, the one generation uses.

#![no_main]

mod common;

use firstword::engine::media::MediaSupport;
use firstword::engine::TemplateSource;
use firstword::fuzzing::Api;
use firstword::ModelInfo;
use libfuzzer_sys::fuzz_target;
use serde_json::{json, Value};

fuzz_target!(|data: &[u8]| {
    let Ok(schema) = serde_json::from_slice::<Value>(data) else { return };
    let format = common::format(data.len() as u8);
    let model = ModelInfo {
        id: "fuzz-model".into(),
        architecture: "llama".into(),
        n_ctx: 4096,
        n_ctx_train: 8192,
        n_vocab: 32_000,
        n_swa: None,
        template_source: TemplateSource::Gguf,
        tool_format: format,
        reasoning: None,
        threads: 1,
        threads_batch: 1,
        media: MediaSupport::default(),
        n_params: 135_000_000,
        size_bytes: 90_000_000,
        file_type: Some(3),
    };
    let messages = json!([{"role": "user", "content": "Go."}]);
    let choice = if data.len() % 2 == 0 { "required" } else { "auto" };
    let bodies = [
        json!({"messages": messages, "tool_choice": choice,
            "tools": [{"type": "function", "function": {"name": "f", "parameters": schema}}]}),
        json!({"messages": messages, "response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}}),
    ];
    for body in bodies {
        match Api::validate_request(body.to_string().as_bytes(), &model) {
            Ok(request) => {
                let grammar = request.grammar.expect("a grammar for calls or a schema");
                assert!(common::llama_cpp_parses(&grammar.gbnf, &grammar.root), "llama.cpp rejects:\n{}", grammar.gbnf);
            }
            Err(error) => assert!(error.status().is_client_error(), "{:?}: {error}", error.status()),
        }
    }
});
