//! Everything about what a model reads and writes as text: conversations and chat templates
//! (the exact prompt text a model was trained on), tool definitions and the prompts that
//! describe them, the grammars that constrain output, and the streaming parsers that turn
//! generated text back into tool calls.
//!
//! Pure: knows nothing about the KV cache, llama.cpp or HTTP, and imports nothing else of the
//! crate.

mod grammar;
mod history;
mod landmarks;
mod message;
mod pyjson;
mod reasoning;
mod render;
mod template;
pub mod tools;

pub use grammar::Grammar;
pub use history::Turns;
pub use landmarks::{Landmarks, PromptPart};
pub use message::{CallArguments, ChatMessage, Role, ToolCall};
pub use reasoning::{ReasoningFormat, ReasoningSplitter, Split};
pub use render::{ChatFormat, RenderedChat};
#[cfg(feature = "fuzzing")]
pub(crate) use template::RenderLimits;
pub use template::{ChatTemplate, ModelTemplateFacts, TemplateError, TemplateSource};

/// Extra variables a chat template is rendered with (`enable_thinking`, `reasoning_effort`,
/// ...), beside the conversation itself.
pub type TemplateKwargs = serde_json::Map<String, serde_json::Value>;

/// `value` as Python's `json.dumps` writes it (what templates and tool prompts show models).
fn python_json(value: &serde_json::Value) -> String {
    pyjson::dumps(value, None)
}
