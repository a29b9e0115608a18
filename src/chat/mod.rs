//! Conversations and chat templates: turning messages into the exact prompt text a model was
//! trained on. Knows nothing about the KV cache or HTTP.

mod message;
mod pyjson;
mod template;

pub use message::{ChatMessage, Role, ToolCall};
pub use template::{ChatTemplate, ModelTemplateFacts, TemplateError, TemplateSource};

/// `value` as Python's `json.dumps` writes it (what templates and tool prompts show models).
pub(crate) fn python_json(value: &serde_json::Value) -> String {
    pyjson::dumps(value, None)
}
