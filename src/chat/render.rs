//! One model's way of writing conversations: its chat template plus its tool-call format.

use std::path::Path;

use super::tools::{prepare_messages, ToolDefinition, ToolFormat};
use super::{ChatMessage, ChatTemplate, Landmarks, ModelTemplateFacts, TemplateError, TemplateSource};

/// A conversation's prompt text and where its parts lie in it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RenderedChat {
    /// The prompt text.
    pub text: String,
    /// Where its first message and its history end.
    pub landmarks: Landmarks,
}

/// How a model's conversations (with or without tools) become prompt text.
#[derive(Debug)]
pub struct ChatFormat {
    template: ChatTemplate,
    source: TemplateSource,
    tool_format: ToolFormat,
}

impl ChatFormat {
    /// The chat template for a model (see [`ChatTemplate::for_model`]) and the tool-call format
    /// it writes.
    ///
    /// # Errors
    /// The template file is unreadable, the template does not compile, or none is known.
    pub fn for_model(facts: &ModelTemplateFacts, template_file: Option<&Path>) -> Result<Self, TemplateError> {
        let (template, source) = ChatTemplate::for_model(facts, template_file)?;
        Ok(Self::new(template, source))
    }

    /// The format of an already compiled template.
    #[must_use]
    pub fn new(template: ChatTemplate, source: TemplateSource) -> Self {
        let tool_format = ToolFormat::detect(template.source());
        Self { template, source, tool_format }
    }

    /// Where the template came from.
    #[must_use]
    pub fn source(&self) -> &TemplateSource {
        &self.source
    }

    /// The tool-call format the template writes.
    #[must_use]
    pub fn tool_format(&self) -> ToolFormat {
        self.tool_format
    }

    /// The prompt text of a conversation offering `tools` (possibly none), ending with the
    /// assistant's generation prompt.
    ///
    /// Earlier calls and tool results are written the same way whether or not this turn carries
    /// tools, so a follow-up without them still shows the model its history.
    ///
    /// # Errors
    /// [`TemplateError::Render`] when the template rejects the messages.
    pub fn render(&self, messages: &[ChatMessage], tools: &[ToolDefinition]) -> Result<RenderedChat, TemplateError> {
        let messages = prepare_messages(self.tool_format, messages, tools);
        let definitions = (self.tool_format.template_renders_tools() && !tools.is_empty())
            .then(|| serde_json::Value::Array(tools.iter().map(ToolDefinition::to_openai_json).collect()));
        let text = self.template.render(&messages, definitions.as_ref(), true)?;
        let landmarks = Landmarks::locate(&text, &messages);
        Ok(RenderedChat { text, landmarks })
    }
}
