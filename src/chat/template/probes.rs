//! How a template wants an assistant's earlier calls, probed once when it is compiled: the
//! call arguments as objects or as text, and a message with calls and no text as `""` or none.

use super::{CallArguments, CallContent, ChatMessage, ChatTemplate, TemplateKwargs};
use crate::chat::{Role, ToolCall};

/// The forms a template receives earlier calls in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Forms {
    pub arguments: CallArguments,
    pub content: CallContent,
}

impl Default for Forms {
    fn default() -> Self {
        Self { arguments: CallArguments::Object, content: CallContent::Empty }
    }
}

impl ChatTemplate {
    /// The forms this template takes earlier calls in: a message with calls and no text has
    /// content `""` unless the template drops the calls then and writes them with none; the
    /// arguments are objects unless the template fails on an object and renders the text (a
    /// template that writes `'\n' + arguments`).
    pub(super) fn probe_forms(&self) -> Forms {
        let mut call = ChatMessage::assistant("");
        call.tool_calls.push(ToolCall {
            id: "call_1".into(),
            name: "tool1".into(),
            arguments: r#"{"arg": "FWPROBEVALUE"}"#.into(),
        });
        let mut result = ChatMessage::new(Role::Tool, "result");
        result.tool_call_id = Some("call_1".into());
        result.name = Some("tool1".into());
        let messages = [ChatMessage::user("question"), call, result];
        let tools = serde_json::json!([{"type": "function", "function": {"name": "tool1", "description": "A tool",
            "parameters": {"type": "object", "properties": {"arg": {"type": "string"}}, "required": ["arg"]}}}]);
        let render = |arguments, content| {
            self.render_as(&messages, Some(&tools), false, &TemplateKwargs::new(), Forms { arguments, content })
        };
        let arguments_for = |content| {
            if render(CallArguments::Object, content).is_err() && render(CallArguments::Text, content).is_ok() {
                CallArguments::Text
            } else {
                CallArguments::Object
            }
        };
        let writes_call = |content| {
            let arguments = arguments_for(content);
            render(arguments, content).is_ok_and(|text| text.contains("FWPROBEVALUE"))
        };
        let content = if !writes_call(CallContent::Empty) && writes_call(CallContent::None) {
            CallContent::None
        } else {
            CallContent::Empty
        };
        Forms { arguments: arguments_for(content), content }
    }

    /// How this template receives the arguments of earlier tool calls.
    #[must_use]
    pub fn call_arguments(&self) -> CallArguments {
        self.forms.arguments
    }

    /// What this template receives as the content of an earlier assistant message that made
    /// calls and wrote no text.
    #[must_use]
    pub fn call_content(&self) -> CallContent {
        self.forms.content
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call_message(content: &str) -> ChatMessage {
        let mut message = ChatMessage::assistant(content);
        message.tool_calls.push(ToolCall { id: "c".into(), name: "f".into(), arguments: r#"{"a": 1}"#.into() });
        message
    }

    #[test]
    fn a_template_that_writes_calls_only_without_content_gets_none() {
        let source = "{% for m in messages %}{% if m.content is none %}{% for c in m.tool_calls %}\
            {{ '<call>' + c.function.name + '\\n' + c.function.arguments }}{% endfor %}\
            {% else %}{{ '<text>' + m.content }}{% endif %}{% endfor %}";
        let t = ChatTemplate::new(source, "", "").expect("compiles");
        assert_eq!((t.call_content(), t.call_arguments()), (CallContent::None, CallArguments::Text));
        let render = |message| t.render(&[message], None, false, &TemplateKwargs::new()).expect("renders");
        assert_eq!(render(call_message("")), "<call>f\n{\"a\": 1}");
        // A message with text keeps it (and this template then drops its calls, as transformers does).
        assert_eq!(render(call_message("Checking.")), "<text>Checking.");
        assert_eq!(render(ChatMessage::assistant("")), "<text>", "no calls: content stays \"\"");
    }

    #[test]
    fn templates_that_write_calls_either_way_get_empty_content() {
        let source = "{% for m in messages %}{{ m.content is none }}{% for c in m.tool_calls or [] %}\
            {{ c.function.arguments | tojson }}{% endfor %}{% endfor %}";
        let t = ChatTemplate::new(source, "", "").expect("compiles");
        assert_eq!((t.call_content(), t.call_arguments()), (CallContent::Empty, CallArguments::Object));
        assert_eq!(
            t.render(&[call_message("")], None, false, &TemplateKwargs::new()).expect("renders"),
            "False{\"a\": 1}"
        );
    }
}
