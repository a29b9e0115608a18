//! Each model family's tool-call format: how a call is opened, written and closed, how earlier
//! calls are written back into the prompt, and how call ids look.

use serde_json::Value;

use super::ToolDefinition;
use crate::chat::ToolCall;

/// A tool-call format, detected from the chat template.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ToolFormat {
    /// Templates without tool support: firstword describes the tools in the system message and
    /// asks for Hermes-style `<tool_call>{"name": …, "arguments": …}</tool_call>` calls.
    Generic,
    /// Hermes 2 Pro, Qwen 2.5/3: `<tool_call>\n{"name": …, "arguments": …}\n</tool_call>`.
    Hermes,
    /// Llama 3.x: a bare `{"name": …, "parameters": …}` object, optionally after `<|python_tag|>`.
    Llama3,
    /// Mistral (Nemo, Small): `[TOOL_CALLS][{"name": …, "arguments": …}, …]`.
    Mistral,
    /// Gemma 4: `<|tool_call>call:name{key:<|"|>text<|"|>,n:1}<tool_call|>`.
    Gemma4,
    /// FunctionGemma: `<start_function_call>call:name{key:<escape>text<escape>}<end_function_call>`.
    FunctionGemma,
}

/// How the call after an opener is written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Body {
    /// A JSON object with `"name"` and the arguments under `args_key`.
    Json {
        /// `arguments` or `parameters`.
        args_key: &'static str,
    },
    /// Gemma's `call:name{key:value,…}` with strings between `quote` markers.
    Gemma {
        /// The string delimiter.
        quote: &'static str,
    },
}

/// Where calls sit in the output.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Layout {
    /// Each call between `open` and `close`; several calls follow each other.
    Tagged {
        /// Starts a call.
        open: &'static str,
        /// Ends a call.
        close: &'static str,
    },
    /// `open` followed by a JSON list of calls.
    List {
        /// Starts the list.
        open: &'static str,
    },
    /// A bare JSON object starting with `{"name"` that opens the reply, or the same after
    /// `<|python_tag|>`.
    BareJson,
}

/// Llama 3's marker for a call in code-interpreter style.
pub(crate) const PYTHON_TAG: &str = "<|python_tag|>";
/// How a bare Llama 3 call begins.
pub(crate) const BARE_JSON_OPENER: &str = "{\"name\"";

impl ToolFormat {
    /// Every format, in declaration order (for tests and tools that go through them all).
    pub const ALL: &'static [Self] =
        &[Self::Generic, Self::Hermes, Self::Llama3, Self::Mistral, Self::Gemma4, Self::FunctionGemma];

    /// Detects the format a chat template writes calls in. Templates that do not describe a
    /// known format get [`ToolFormat::Generic`].
    #[must_use]
    pub fn detect(template: &str) -> Self {
        if template.contains("<|tool_call>call:") {
            Self::Gemma4
        } else if template.contains("<start_function_call>") {
            Self::FunctionGemma
        } else if template.contains("[TOOL_CALLS]") {
            Self::Mistral
        } else if template.contains("<tool_call>") && !template.contains("<function=") {
            Self::Hermes
        } else if template.contains("<|start_header_id|>") && template.contains("tools") {
            Self::Llama3
        } else {
            Self::Generic
        }
    }

    /// A short name for logs and `/v1/models`.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::Generic => "generic",
            Self::Hermes => "hermes",
            Self::Llama3 => "llama3",
            Self::Mistral => "mistral",
            Self::Gemma4 => "gemma4",
            Self::FunctionGemma => "functiongemma",
        }
    }

    /// Whether the chat template itself renders `tools` and assistant `tool_calls`; otherwise
    /// firstword writes them into the messages (see [`super::prepare_messages`]).
    #[must_use]
    pub fn template_renders_tools(self) -> bool {
        self != Self::Generic
    }

    pub(crate) fn layout(self) -> Layout {
        match self {
            Self::Generic | Self::Hermes => Layout::Tagged { open: "<tool_call>", close: "</tool_call>" },
            Self::Llama3 => Layout::BareJson,
            Self::Mistral => Layout::List { open: "[TOOL_CALLS]" },
            Self::Gemma4 => Layout::Tagged { open: "<|tool_call>", close: "<tool_call|>" },
            Self::FunctionGemma => Layout::Tagged { open: "<start_function_call>", close: "<end_function_call>" },
        }
    }

    pub(crate) fn body(self) -> Body {
        match self {
            Self::Llama3 => Body::Json { args_key: "parameters" },
            Self::Gemma4 => Body::Gemma { quote: "<|\"|>" },
            Self::FunctionGemma => Body::Gemma { quote: "<escape>" },
            Self::Generic | Self::Hermes | Self::Mistral => Body::Json { args_key: "arguments" },
        }
    }

    /// Texts that start a call wherever they appear in free text: the triggers of a lazy
    /// grammar, and stop strings when calls are not allowed.
    #[must_use]
    pub fn openers(self) -> Vec<&'static str> {
        match self.layout() {
            Layout::Tagged { open, .. } | Layout::List { open } => vec![open],
            Layout::BareJson => vec![PYTHON_TAG],
        }
    }

    /// Texts that start a call only where they open the reply (after optional whitespace):
    /// Llama 3's bare `{"name"`. Elsewhere they are ordinary text, so they are never stop
    /// strings.
    #[must_use]
    pub fn anchored_openers(self) -> Vec<&'static str> {
        match self.layout() {
            Layout::BareJson => vec![BARE_JSON_OPENER],
            Layout::Tagged { .. } | Layout::List { .. } => Vec::new(),
        }
    }

    /// The arguments key of a bare JSON call opening the reply (`{"name": …, KEY: {…}}`): the
    /// format's own for JSON formats, OpenAI's `arguments` for the others.
    pub(crate) fn bare_args_key(self) -> &'static str {
        match self.body() {
            Body::Json { args_key } => args_key,
            Body::Gemma { .. } => "arguments",
        }
    }

    /// Every marker of the format (openers, closers, quotes): the special tokens that must
    /// be shown as text for the parser to see them.
    #[must_use]
    pub fn markers(self) -> Vec<&'static str> {
        let mut markers = match self.layout() {
            Layout::Tagged { open, close } => vec![open, close],
            Layout::List { open } => vec![open],
            Layout::BareJson => vec![PYTHON_TAG],
        };
        if let Body::Gemma { quote } = self.body() {
            markers.push(quote);
        }
        markers
    }

    /// A fresh call id. Mistral's templates require 9 alphanumerics; others use OpenAI's style.
    #[must_use]
    pub fn new_call_id(self) -> String {
        match self {
            Self::Mistral => std::iter::repeat_with(fastrand::alphanumeric).take(9).collect(),
            _ => format!("call_{}", std::iter::repeat_with(fastrand::alphanumeric).take(24).collect::<String>()),
        }
    }

    /// A call as the generic format writes it (the form the grammar and the tool prompt use),
    /// so a call sent back in the history renders to the text the model generated.
    pub(crate) fn write_generic_call(call: &ToolCall) -> String {
        let arguments = call.arguments.trim();
        let arguments = if arguments.is_empty() { "{}" } else { arguments };
        format!(
            "<tool_call>\n{{\"name\": {}, \"arguments\": {arguments}}}\n</tool_call>",
            Value::String(call.name.clone())
        )
    }
}

/// The system-message text that teaches a model without native tool support the generic format.
pub(crate) fn generic_tool_prompt(tools: &[ToolDefinition]) -> String {
    let mut text = String::from(
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n\
         You are provided with function signatures within <tools></tools> XML tags:\n<tools>",
    );
    for tool in tools {
        text.push('\n');
        text.push_str(&crate::chat::python_json(&tool.to_openai_json()));
    }
    text.push_str(
        "\n</tools>\n\nFor each function call, return a json object with function name and arguments within \
         <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call>",
    );
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_are_detected_from_template_markers() {
        assert_eq!(ToolFormat::detect("{{ '<tool_call>\\n' }}{{ tool_call.name }}"), ToolFormat::Hermes);
        assert_eq!(ToolFormat::detect("{{ '[TOOL_CALLS][' }}"), ToolFormat::Mistral);
        assert_eq!(
            ToolFormat::detect("<|start_header_id|>ipython{% if tools %}{{ '\"parameters\": ' }}{% endif %}"),
            ToolFormat::Llama3
        );
        assert_eq!(ToolFormat::detect("{{- '<|tool_call>call:' + function['name'] -}}"), ToolFormat::Gemma4);
        assert_eq!(ToolFormat::detect("<start_function_call>call:"), ToolFormat::FunctionGemma);
        assert_eq!(ToolFormat::detect("<tool_call>\n<function={{ name }}>"), ToolFormat::Generic);
        assert_eq!(ToolFormat::detect("<|im_start|>{{ message['role'] }}"), ToolFormat::Generic);
    }

    #[test]
    fn mistral_ids_fit_its_template() {
        let id = ToolFormat::Mistral.new_call_id();
        assert_eq!(id.len(), 9);
        assert!(id.chars().all(|c| c.is_ascii_alphanumeric()));
        assert!(ToolFormat::Hermes.new_call_id().starts_with("call_"));
    }

    #[test]
    fn generic_prompt_lists_tools_and_the_call_form() {
        let tool = ToolDefinition {
            name: "get_weather".into(),
            description: None,
            parameters: serde_json::json!({"type": "object", "properties": {"city": {"type": "string"}}}),
        };
        let prompt = generic_tool_prompt(&[tool]);
        assert!(
            prompt.contains(
                r#"{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object""#
            ),
            "{prompt}"
        );
        assert!(prompt
            .ends_with("<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call>"));
        let call = ToolCall { id: "c".into(), name: "get_weather".into(), arguments: r#"{"city": "Paris"}"#.into() };
        assert_eq!(
            ToolFormat::write_generic_call(&call),
            "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>"
        );
    }
}
