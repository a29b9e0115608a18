//! Conversations and chat templates: turning messages into the exact prompt text a model was
//! trained on. Knows nothing about the KV cache or HTTP.

mod message;
mod pyjson;
mod template;

pub use message::{ChatMessage, Role, ToolCall};
pub use template::{ChatTemplate, ModelTemplateFacts, TemplateError, TemplateSource};
