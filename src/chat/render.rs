//! One model's way of writing conversations: its chat template plus its tool-call format.

use std::path::Path;

use super::tools::{prepare_messages, ToolDefinition, ToolFormat};
use super::{ChatMessage, ChatTemplate, Landmarks, ModelTemplateFacts, TemplateError, TemplateSource};

/// Stand-ins for the reply and the next user message when rendering what the template writes
/// between them (private-use characters no real text contains).
const REPLY_MARK: &str = "\u{E000}firstword-reply\u{E000}";
const USER_MARK: &str = "\u{E001}firstword-user\u{E001}";

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

    /// What the template writes after the reply to `messages` and before the next user
    /// message's text (the end of the assistant turn, the user turn's opening), found by
    /// rendering the conversation with stand-ins for both. `None` when the conversation with
    /// a reply does not begin with `prompt`, the text [`ChatFormat::render`] gave for
    /// `messages` (a template that rewrites earlier turns), or the template rejects it.
    #[must_use]
    pub fn next_turn_opening(
        &self,
        messages: &[ChatMessage],
        tools: &[ToolDefinition],
        prompt: &str,
    ) -> Option<String> {
        let mut next = messages.to_vec();
        next.push(ChatMessage::assistant(REPLY_MARK));
        next.push(ChatMessage::user(USER_MARK));
        let text = self.render(&next, tools).ok()?.text;
        let after_reply = text.strip_prefix(prompt)?.strip_prefix(REPLY_MARK)?;
        after_reply.find(USER_MARK).map(|end| after_reply[..end].to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chatml() -> ChatFormat {
        let source = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}\
            {% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";
        let template = ChatTemplate::new(source, "", "").expect("compiles");
        ChatFormat::new(template, TemplateSource::File("test".into()))
    }

    #[test]
    fn the_next_turn_opens_with_the_end_of_the_reply_and_the_user_header() {
        let format = chatml();
        let messages = [ChatMessage::system("S"), ChatMessage::user("Hi")];
        let prompt = format.render(&messages, &[]).expect("renders").text;
        let opening = format.next_turn_opening(&messages, &[], &prompt);
        assert_eq!(opening.as_deref(), Some("<|im_end|>\n<|im_start|>user\n"));
        // The next prompt, with the reply and the user's words, starts with prompt + reply +
        // opening.
        let mut next = messages.to_vec();
        next.push(ChatMessage::assistant("Hello!"));
        next.push(ChatMessage::user("Weather?"));
        let next_prompt = format.render(&next, &[]).expect("renders").text;
        assert!(next_prompt.starts_with(&format!("{prompt}Hello!{}", opening.expect("opening"))));
    }

    #[test]
    fn a_template_that_rewrites_earlier_turns_has_no_opening() {
        let source = "{% for m in messages %}{% if loop.last %}<{{ m.role }}>{{ m.content }}{% else %}[{{ m.role }}]{% endif %}{% endfor %}";
        let format =
            ChatFormat::new(ChatTemplate::new(source, "", "").expect("compiles"), TemplateSource::File("t".into()));
        let messages = [ChatMessage::user("Hi")];
        let prompt = format.render(&messages, &[]).expect("renders").text;
        assert_eq!(format.next_turn_opening(&messages, &[], &prompt), None);
    }
}
