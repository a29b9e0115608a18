//! Everything about what a model reads and writes as text: conversations and chat templates
//! (the exact prompt text a model was trained on), tool definitions and the prompts that
//! describe them, the grammars that constrain output, and the streaming parsers that turn
//! generated text back into tool calls.
//!
//! Pure: knows nothing about the KV cache, llama.cpp or HTTP, and imports nothing else of the
//! crate.
//!
//! # What a chat template sees
//!
//! [`ChatTemplate`] renders with the context Hugging Face transformers' `apply_chat_template`
//! gives a template for the same OpenAI-style conversation (`tests/template_collection.rs`
//! compares the two on every template of llama.cpp's collection):
//! - `messages`: one map per message, keys in this order and only where they have a value:
//!   `thinking` (an assistant's earlier reasoning, first, as transformers copies it for gpt-oss
//!   templates), `role` (`system`, `user`, `assistant` or `tool`; a `developer` message arrives
//!   as `system`), `content` (a string: text parts joined, a null content `""`; none for an
//!   assistant's calls without text where the template writes calls only then,
//!   [`CallContent`]), `name` (when the client sent one), `tool_calls` (assistant messages:
//!   `[{"id", "type": "function", "function": {"name", "arguments"}}]`), `tool_call_id` (tool
//!   results) and `reasoning_content` (the same reasoning as `thinking`).
//! - A call's `arguments` are the object the client's JSON text holds (what transformers
//!   documents and its own server passes), or that text where a template can only write text:
//!   [`CallArguments`], probed once per template (functionary v3.2 writes `'\n' + arguments`).
//!   Text that is not a JSON object stays text.
//! - `tools`: the request's tools as `[{"type": "function", "function": {"name", "description",
//!   "parameters"}}]`, or none (not undefined) without tools, as transformers passes
//!   `tools=None`: `tools is defined` holds, `tools is iterable` does not. `documents` is none.
//! - `add_generation_prompt`, `bos_token`, `eos_token`, then the request's template variables
//!   (`chat_template_kwargs`, `enable_thinking`, `reasoning_effort`), which never replace the
//!   names above.
//!
//! Values behave as in transformers' jinja2: `{{ value }}` and `|string` print Python's `str`
//! (a dict as `{'type': 'function'}`, `None`, `True`), `tojson` is `json.dumps` with its
//! `indent`, `ensure_ascii`, `separators` and `sort_keys`, `{% generation %}` blocks render
//! their body, `raise_exception` fails the rendering with its message and `strftime_now` prints
//! the local time. Where firstword knowingly differs (Python cannot iterate `None`, jinja2's
//! `map` is a generator `tojson` refuses, jinja2 HTML-escapes a string added to a `|safe` one)
//! the test lists the case and why.

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
pub use message::{CallArguments, CallContent, ChatMessage, Role, ToolCall};
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
