//! One model's way of writing conversations: its chat template plus its tool-call format.

use std::path::Path;

use super::tools::{prepare_messages, CallMemory, ParsedPiece, ToolCallParser, ToolDefinition, ToolFormat, ToolSet};
use super::{
    ChatMessage, ChatTemplate, Landmarks, ModelTemplateFacts, ReasoningFormat, ReasoningSplitter, TemplateError,
    TemplateKwargs, TemplateSource, ToolCall,
};

/// A stand-in for the next user message when rendering what comes before it (private-use
/// characters no real text contains).
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
    reasoning: Option<ReasoningFormat>,
    /// The calls the model generated, written back as generated when a client re-serializes them.
    memory: CallMemory,
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
        let reasoning = ReasoningFormat::detect(template.source());
        let tool_format = ToolFormat::detect(&template, reasoning);
        Self { template, source, tool_format, reasoning, memory: CallMemory::default() }
    }

    /// Where the template came from.
    #[must_use]
    pub fn source(&self) -> &TemplateSource {
        &self.source
    }

    /// The template's Jinja source.
    #[must_use]
    pub fn template_text(&self) -> &str {
        self.template.source()
    }

    /// The tool-call format the template writes.
    #[must_use]
    pub fn tool_format(&self) -> &ToolFormat {
        &self.tool_format
    }

    /// The markers the template writes around a model's reasoning; `None` for models that do
    /// not think.
    #[must_use]
    pub fn reasoning(&self) -> Option<ReasoningFormat> {
        self.reasoning
    }

    /// The prompt text of a conversation offering `tools` (possibly none), ending with the
    /// assistant's generation prompt.
    ///
    /// # Errors
    /// [`TemplateError::Render`] when the template rejects the messages.
    pub fn render(&self, messages: &[ChatMessage], tools: &[ToolDefinition]) -> Result<RenderedChat, TemplateError> {
        self.render_with(messages, tools, &TemplateKwargs::new())
    }

    /// [`Self::render`] with extra template variables (`enable_thinking`, ...).
    ///
    /// Earlier calls and tool results are written the same way whether or not this turn carries
    /// tools, so a follow-up without them still shows the model its history.
    ///
    /// # Errors
    /// [`TemplateError::Render`] when the template rejects the messages.
    pub fn render_with(
        &self,
        messages: &[ChatMessage],
        tools: &[ToolDefinition],
        kwargs: &TemplateKwargs,
    ) -> Result<RenderedChat, TemplateError> {
        let messages = self.memory.restore(messages);
        let messages = prepare_messages(&self.tool_format, &messages, tools);
        let definitions = (self.tool_format.template_renders_tools() && !tools.is_empty())
            .then(|| serde_json::Value::Array(tools.iter().map(ToolDefinition::to_openai_json).collect()));
        let text = self.template.render(&messages, definitions.as_ref(), true, kwargs)?;
        let landmarks = Landmarks::locate(&text, &messages);
        Ok(RenderedChat { text, landmarks })
    }

    /// A reply's text as the assistant message a client sends back: reasoning (where the model
    /// thinks) apart from the answer, and the calls in the answer (when the request offered
    /// `tools`) apart from its text. `opened` tells whether the prompt opened the reasoning. The
    /// calls are remembered as the model wrote them (see [`CallMemory`]).
    #[must_use]
    pub fn reply_message(&self, reply: &str, opened: bool, tools: &[ToolDefinition]) -> ChatMessage {
        let mut message = match self.reasoning {
            None => ChatMessage::assistant(reply),
            Some(format) => {
                let mut splitter = ReasoningSplitter::new(format, opened);
                let (mut split, rest) = (splitter.push(reply), splitter.finish());
                split.reasoning.push_str(&rest.reasoning);
                split.content.push_str(&rest.content);
                let mut message = ChatMessage::assistant(split.content);
                message.reasoning = (!split.reasoning.is_empty()).then_some(split.reasoning);
                message
            }
        };
        if tools.is_empty() && self.tool_format.text_recipient().is_some() {
            // The reply's text recipient (functionary v3.2's `all\n`) is the template's to write.
            let mut parser = ToolCallParser::new(self.tool_format.clone()).without_calls();
            let mut pieces = parser.push(&message.content);
            pieces.extend(parser.finish().0);
            message.content = content_of(pieces);
        } else if !tools.is_empty() {
            // The tools' schemas tell a parameter's JSON value from its text.
            let tool_set = ToolSet::new(tools.to_vec()).ok();
            let mut parser = ToolCallParser::new(self.tool_format.clone());
            if let Some(tool_set) = &tool_set {
                parser = parser.with_tools(tool_set);
            }
            let mut pieces = parser.push(&message.content);
            let (rest, calls) = parser.finish();
            pieces.extend(rest);
            let calls: Vec<ToolCall> = calls
                .into_iter()
                .filter(|call| call.complete)
                .enumerate()
                .map(|(i, call)| ToolCall { id: format!("call_{i}"), name: call.name, arguments: call.arguments })
                .collect();
            if !calls.is_empty() || self.tool_format.text_recipient().is_some() {
                message.content = content_of(pieces);
            }
            if !calls.is_empty() {
                self.memory.remember(&calls);
                message.tool_calls = calls;
            }
        }
        message
    }

    /// The next prompt's text up to the next user message's words: `messages` and `reply` as
    /// the template writes them (it may trim the reply, or drop its reasoning), then the end
    /// of the assistant turn and the user turn's opening; found by rendering the conversation
    /// with a stand-in for the next message. `None` when the template rejects it.
    #[must_use]
    pub fn next_turn_prefix(
        &self,
        messages: &[ChatMessage],
        tools: &[ToolDefinition],
        kwargs: &TemplateKwargs,
        reply: ChatMessage,
    ) -> Option<String> {
        let mut next = messages.to_vec();
        next.push(reply);
        next.push(ChatMessage::user(USER_MARK));
        let mut text = self.render_with(&next, tools, kwargs).ok()?.text;
        text.truncate(text.find(USER_MARK)?);
        Some(text)
    }
}

/// The text of parsed pieces.
fn content_of(pieces: Vec<ParsedPiece>) -> String {
    pieces
        .into_iter()
        .filter_map(|piece| match piece {
            ParsedPiece::Content(text) => Some(text),
            _ => None,
        })
        .collect()
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
    fn the_next_prompt_starts_with_the_reply_and_the_user_turns_opening() {
        let format = chatml();
        let messages = [ChatMessage::system("S"), ChatMessage::user("Hi")];
        let prompt = format.render(&messages, &[]).expect("renders").text;
        let prefix = format
            .next_turn_prefix(&messages, &[], &TemplateKwargs::new(), ChatMessage::assistant("Hello!"))
            .expect("a prefix");
        assert_eq!(prefix, format!("{prompt}Hello!<|im_end|>\n<|im_start|>user\n"));
        let mut next = messages.to_vec();
        next.push(ChatMessage::assistant("Hello!"));
        next.push(ChatMessage::user("Weather?"));
        assert!(format.render(&next, &[]).expect("renders").text.starts_with(&prefix));
    }

    #[test]
    fn a_reply_the_template_trims_is_written_as_the_template_writes_it() {
        let source = "{% for m in messages %}<{{ m.role }}>{{ m.content | trim }}</{{ m.role }}>{% endfor %}";
        let template = ChatTemplate::new(source, "", "").expect("compiles");
        let format = ChatFormat::new(template, TemplateSource::File("t".into()));
        let reply = format.reply_message("Hello! \n", false, &[]);
        let prefix =
            format.next_turn_prefix(&[ChatMessage::user("Hi")], &[], &TemplateKwargs::new(), reply).expect("a prefix");
        assert_eq!(prefix, "<user>Hi</user><assistant>Hello!</assistant><user>");
    }

    #[test]
    fn a_thinking_reply_goes_back_split_and_the_template_decides_what_it_keeps() {
        let source = "{% for m in messages %}<{{ m.role }}>{% if m.reasoning_content %}<think>{{ m.reasoning_content }}</think>{% endif %}{{ m.content }}</{{ m.role }}>{% endfor %}\
            {% if add_generation_prompt %}<assistant><think>{% endif %}";
        let template = ChatTemplate::new(source, "", "").expect("compiles");
        let format = ChatFormat::new(template, TemplateSource::File("t".into()));
        assert_eq!(format.reasoning(), Some(ReasoningFormat::KNOWN[2]));
        let reply = format.reply_message("\nHm.\n</think>\n\nHello!", true, &[]);
        assert_eq!((reply.reasoning.as_deref(), reply.content.as_str()), (Some("Hm."), "Hello!"));
        let plain = chatml().reply_message("<think>x</think>y", false, &[]);
        assert_eq!((plain.reasoning, plain.content.as_str()), (None, "<think>x</think>y"), "no reasoning format");
        let prefix =
            format.next_turn_prefix(&[ChatMessage::user("Hi")], &[], &TemplateKwargs::new(), reply).expect("a prefix");
        assert_eq!(prefix, "<user>Hi</user><assistant><think>Hm.</think>Hello!</assistant><user>");
    }
}
