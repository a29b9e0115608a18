//! Model-free tests of the API: fixtures shared by the modules' tests, a scripted engine
//! ([`fake`]) and the router's tests over it ([`router`]).

mod access;
mod admission;
mod console;
mod fake;
mod ollama;
mod request_log;
mod router;

use serde_json::{json, Value};

use super::convert::OutputPlan;
use crate::chat::tools::{OutputSchema, ToolDefinition, ToolFormat, ToolSet};
use crate::engine::{
    CacheMiss, CacheReport, CacheSource, Event, FinishReason, ModelInfo, TemplateSource, Timings, Usage,
};

/// A loaded model as the engine would describe it.
pub(super) fn model() -> ModelInfo {
    ModelInfo {
        id: "test-model".into(),
        architecture: "llama".into(),
        n_ctx: 4096,
        n_ctx_train: 8192,
        n_vocab: 32_000,
        n_swa: None,
        template_source: TemplateSource::Gguf,
        tool_format: ToolFormat::hermes(),
        reasoning: None,
        threads: 2,
        threads_batch: 2,
        media: crate::engine::media::MediaSupport::default(),
        n_params: 134_515_008,
        size_bytes: 91_000_000,
        file_type: Some(3),
        devices: vec![crate::engine::DeviceInfo {
            name: "CPU".into(),
            description: "a test CPU".into(),
            backend: "CPU".into(),
            memory_total: 1 << 34,
            memory_free: 1 << 33,
        }],
    }
}

/// `set_timer(minutes: integer)`, the one tool of these tests.
pub(super) fn timer_tool() -> ToolDefinition {
    ToolDefinition {
        name: "set_timer".into(),
        description: None,
        parameters: json!({"type": "object", "properties": {"minutes": {"type": "integer"}}, "required": ["minutes"]}),
    }
}

/// Replies that may call `set_timer`, in the generic (Hermes-style) format.
pub(super) fn calls_plan() -> OutputPlan {
    let tools = ToolSet::new(vec![timer_tool()]).expect("tools");
    OutputPlan { format: ToolFormat::generic(), tools: Some(tools), schema: None, reasoning: None }
}

/// Plain text replies, or JSON ones matching `schema`.
pub(super) fn text_plan(schema: Option<Value>) -> OutputPlan {
    let schema = schema.map(|s| OutputSchema::new(&s).expect("schema"));
    OutputPlan { format: ToolFormat::generic(), tools: None, schema, reasoning: None }
}

/// A call as the generic format writes it.
pub(super) fn call_text(name: &str, arguments: &str) -> String {
    format!("<tool_call>\n{{\"name\": \"{name}\", \"arguments\": {arguments}}}\n</tool_call>")
}

/// The usage every scripted `Finished` reports.
pub(super) const USAGE: Usage =
    Usage { prompt_tokens: 10, cached_tokens: 4, completion_tokens: 3, dropped_messages: 0, reasoning_tokens: 0 };

/// A `Finished` event with [`USAGE`].
/// What the scripted cache did: a restore from the RAM store.
pub(super) const CACHE: CacheReport = CacheReport {
    source: CacheSource::Ram,
    reused: 4,
    prefilled: 6,
    diverged_at: None,
    reason: Some(CacheMiss::Restored),
    save: None,
    restore: Some(std::time::Duration::from_millis(2)),
    adopted: 0,
    reply_cut: None,
    changes: None,
};

pub(super) fn finished(reason: FinishReason) -> Event {
    Event::Finished { reason, usage: USAGE, timings: Timings { cache: CACHE, ..Timings::default() } }
}
