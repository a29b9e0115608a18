//! Chat messages as the engine and templates see them.

use serde_json::{json, Map, Value};

/// Who wrote a message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// Instructions for the assistant (OpenAI `system` and `developer`).
    System,
    /// The human.
    User,
    /// The model.
    Assistant,
    /// A tool's result, answering an assistant's tool call.
    Tool,
}

impl Role {
    /// The role name chat templates expect.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::System => "system",
            Self::User => "user",
            Self::Assistant => "assistant",
            Self::Tool => "tool",
        }
    }
}

/// A tool call the assistant made earlier in the conversation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ToolCall {
    /// The call's id, echoed by the tool message that answers it.
    pub id: String,
    /// The function called.
    pub name: String,
    /// The arguments, as JSON text.
    pub arguments: String,
}

/// One message of a conversation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChatMessage {
    /// Who wrote it.
    pub role: Role,
    /// Its text (text parts already joined).
    pub content: String,
    /// Optional participant name.
    pub name: Option<String>,
    /// Tool calls made by an assistant message.
    pub tool_calls: Vec<ToolCall>,
    /// For tool messages: the id of the call this answers.
    pub tool_call_id: Option<String>,
    /// For assistant messages: the reasoning that preceded the text (templates of models
    /// that think show it as `reasoning_content`, usually only in the newest turns).
    pub reasoning: Option<String>,
}

impl ChatMessage {
    /// A message with just a role and text.
    #[must_use]
    pub fn new(role: Role, content: impl Into<String>) -> Self {
        Self { role, content: content.into(), name: None, tool_calls: Vec::new(), tool_call_id: None, reasoning: None }
    }

    /// A system message.
    #[must_use]
    pub fn system(content: impl Into<String>) -> Self {
        Self::new(Role::System, content)
    }

    /// A user message.
    #[must_use]
    pub fn user(content: impl Into<String>) -> Self {
        Self::new(Role::User, content)
    }

    /// An assistant message.
    #[must_use]
    pub fn assistant(content: impl Into<String>) -> Self {
        Self::new(Role::Assistant, content)
    }

    /// The message as Hugging Face templates receive it from transformers' `apply_chat_template`
    /// (see the module docs of [`crate::chat`] for the whole context).
    pub(crate) fn to_template_value(&self, arguments: CallArguments, call_content: CallContent) -> Value {
        let mut object = Map::new();
        // transformers copies a message's reasoning to `thinking` (first, for gpt-oss templates)
        // and `reasoning_content`.
        if let Some(reasoning) = &self.reasoning {
            object.insert("thinking".into(), json!(reasoning));
        }
        object.insert("role".into(), json!(self.role.as_str()));
        let no_text = self.role == Role::Assistant && !self.tool_calls.is_empty() && self.content.is_empty();
        if no_text && call_content == CallContent::None {
            object.insert("content".into(), Value::Null);
        } else {
            object.insert("content".into(), json!(self.content));
        }
        if let Some(name) = &self.name {
            object.insert("name".into(), json!(name));
        }
        if !self.tool_calls.is_empty() {
            let calls: Vec<Value> = self.tool_calls.iter().map(|call| call.to_template_value(arguments)).collect();
            object.insert("tool_calls".into(), Value::Array(calls));
        }
        if let Some(id) = &self.tool_call_id {
            object.insert("tool_call_id".into(), json!(id));
        }
        if let Some(reasoning) = &self.reasoning {
            object.insert("reasoning_content".into(), json!(reasoning));
        }
        Value::Object(object)
    }
}

/// How a chat template receives the arguments of earlier tool calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CallArguments {
    /// As the JSON object they hold, as transformers documents it and its own server passes them
    /// (templates write them with `tojson`, or read their keys). Arguments that are not a JSON
    /// object's text are passed as text.
    Object,
    /// As the JSON text the client sent, for templates that can only write them as text
    /// (functionary v3.2 writes `'\n' + arguments`).
    Text,
}

/// What a chat template receives as the `content` of an assistant message that makes calls and
/// holds no text.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CallContent {
    /// `""`, what most templates test with `if message.content` (or print).
    Empty,
    /// None (a client's `"content": null`, as llama.cpp passes it), for templates that write
    /// calls only then (DeepSeek-R1-Distill-Llama's `message['content'] is none`): with `""` they
    /// drop the calls. Transformers drops keys whose value is None, so it renders no calls with
    /// such a template.
    None,
}

impl ToolCall {
    /// `{"id", "type": "function", "function": {"name", "arguments"}}`, as OpenAI clients send it.
    fn to_template_value(&self, form: CallArguments) -> Value {
        let arguments = match form {
            CallArguments::Object => serde_json::from_str::<Value>(&self.arguments)
                .ok()
                .filter(Value::is_object)
                .unwrap_or_else(|| Value::String(self.arguments.clone())),
            CallArguments::Text => Value::String(self.arguments.clone()),
        };
        json!({"id": self.id, "type": "function", "function": {"name": self.name, "arguments": arguments}})
    }
}
