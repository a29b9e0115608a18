//! Writing tools and earlier calls into the conversation for templates that cannot.

use super::{ToolDefinition, ToolFormat};
use crate::chat::{ChatMessage, Role};

/// The messages to render for a conversation offering `tools` (possibly none).
///
/// Templates with native tool support get the messages unchanged (they render `tools`,
/// `tool_calls` and tool results themselves); templates that render the tools but not the calls
/// (LFM2's) get each assistant's calls written into its text as the format writes them. For the
/// others ([`ToolFormat::generic`]):
/// - the tool definitions and the call format open the system message (one is added if there
///   is none), identically on every turn, so the prefix stays cached: before the system
///   message's own text, which may change from turn to turn (Home Assistant's clock line)
///   while the tools do not; only when there are tools;
/// - an assistant's earlier calls are written into its text exactly as the generic format
///   writes them, so the history renders to the tokens the model generated;
/// - tool results become user turns inside `<tool_response>` tags.
///
/// The history is written so on every turn, with or without tools: a follow-up without
/// `tools` still shows the model what it called and what came back.
#[must_use]
pub fn prepare_messages(format: &ToolFormat, messages: &[ChatMessage], tools: &[ToolDefinition]) -> Vec<ChatMessage> {
    if format.template_renders_calls() {
        return messages.to_vec();
    }
    if format.template_renders_tools() {
        return messages.iter().map(|message| with_calls_in_text(format, message, tools)).collect();
    }
    if format.tools_in_user_turn() {
        return in_user_turns(format, messages, tools);
    }
    let mut prepared: Vec<ChatMessage> = Vec::with_capacity(messages.len() + 1);
    if !tools.is_empty() {
        let instructions = generic_tool_prompt(tools);
        match messages.first() {
            Some(first) if first.role == Role::System => {
                prepared.push(ChatMessage::system(format!("{instructions}\n\n{}", first.content)));
            }
            _ => prepared.push(ChatMessage::system(instructions)),
        }
    }
    let skip = usize::from(!tools.is_empty() && messages.first().is_some_and(|m| m.role == Role::System));
    for message in &messages[skip..] {
        prepared.push(match message.role {
            Role::Assistant => with_calls_in_text(format, message, tools),
            Role::Tool => ChatMessage::user(format!("<tool_response>\n{}\n</tool_response>", message.content)),
            _ => message.clone(),
        });
    }
    prepared
}

/// The generic format for a template that refuses a system message and wants user and
/// assistant turns to alternate (Gemma 2): the tool description (before the system message's
/// text, when there is one, which may change while the tools do not) opens the first user turn, and the results of one reply's calls
/// make one user turn. Without tools a system message is left to the template.
fn in_user_turns(format: &ToolFormat, messages: &[ChatMessage], tools: &[ToolDefinition]) -> Vec<ChatMessage> {
    let mut prepared: Vec<ChatMessage> = Vec::with_capacity(messages.len());
    let mut described = tools.is_empty();
    let mut instructions = if described { String::new() } else { generic_tool_prompt(tools) };
    let mut messages = messages;
    if let (false, Some((first, rest))) = (described, messages.split_first()) {
        if first.role == Role::System {
            instructions = format!("{instructions}\n\n{}", first.content);
            messages = rest;
        }
    }
    for message in messages {
        match message.role {
            Role::Assistant => prepared.push(with_calls_in_text(format, message, tools)),
            Role::Tool => {
                let result = format!("<tool_response>\n{}\n</tool_response>", message.content);
                match prepared.last_mut() {
                    Some(last) if last.role == Role::User && last.content.ends_with("</tool_response>") => {
                        last.content.push('\n');
                        last.content.push_str(&result);
                    }
                    _ => prepared.push(ChatMessage::user(result)),
                }
            }
            Role::User if !described => {
                described = true;
                prepared.push(ChatMessage::user(format!("{instructions}\n\n{}", message.content)));
            }
            _ => prepared.push(message.clone()),
        }
    }
    prepared
}

/// An assistant message with its calls written after its text, as the model wrote them.
fn with_calls_in_text(format: &ToolFormat, message: &ChatMessage, tools: &[ToolDefinition]) -> ChatMessage {
    if message.role != Role::Assistant || message.tool_calls.is_empty() {
        return message.clone();
    }
    let calls = format.write_calls(&message.tool_calls, tools);
    ChatMessage { content: format!("{}{calls}", message.content), tool_calls: Vec::new(), ..message.clone() }
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
    use crate::chat::ToolCall;

    fn tool() -> ToolDefinition {
        ToolDefinition {
            name: "get_weather".into(),
            description: None,
            parameters: serde_json::json!({"type": "object"}),
        }
    }

    #[test]
    fn generic_appends_tools_to_the_system_message_and_writes_history_calls() {
        let mut assistant = ChatMessage::assistant("Checking. ");
        assistant.tool_calls.push(ToolCall {
            id: "call_1".into(),
            name: "get_weather".into(),
            arguments: "{\"city\": \"Oslo\"}".into(),
        });
        let mut result = ChatMessage::new(Role::Tool, "{\"temp\": 3}");
        result.tool_call_id = Some("call_1".into());
        let messages = vec![ChatMessage::system("Be brief."), ChatMessage::user("Weather?"), assistant, result];
        let prepared = prepare_messages(&ToolFormat::generic(), &messages, &[tool()]);
        assert_eq!(prepared.len(), 4);
        assert!(prepared[0].content.starts_with("# Tools"), "{}", prepared[0].content);
        assert!(prepared[0].content.contains("</tool_call>\n\nBe brief."), "{}", prepared[0].content);
        assert_eq!(
            prepared[2].content,
            "Checking. <tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>"
        );
        assert!(prepared[2].tool_calls.is_empty());
        assert_eq!(prepared[3].role, Role::User);
        assert_eq!(prepared[3].content, "<tool_response>\n{\"temp\": 3}\n</tool_response>");
    }

    #[test]
    fn generic_writes_the_history_on_a_turn_without_tools() {
        let mut assistant = ChatMessage::assistant("");
        assistant.tool_calls.push(ToolCall { id: "c".into(), name: "get_weather".into(), arguments: "{}".into() });
        let mut result = ChatMessage::new(Role::Tool, "sunny");
        result.tool_call_id = Some("c".into());
        let messages = vec![ChatMessage::system("Be brief."), ChatMessage::user("Weather?"), assistant, result];
        let prepared = prepare_messages(&ToolFormat::generic(), &messages, &[]);
        assert_eq!(prepared[0], ChatMessage::system("Be brief."), "no tool definitions without tools");
        assert_eq!(prepared[2].content, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {}}\n</tool_call>");
        assert_eq!(prepared[3], ChatMessage::user("<tool_response>\nsunny\n</tool_response>"));
    }

    #[test]
    fn generic_adds_a_system_message_when_there_is_none() {
        let prepared = prepare_messages(&ToolFormat::generic(), &[ChatMessage::user("Hi")], &[tool()]);
        assert_eq!(prepared[0].role, Role::System);
        assert_eq!(prepared[1], ChatMessage::user("Hi"));
    }

    #[test]
    fn a_template_without_system_turns_gets_the_tools_in_the_first_user_turn() {
        let source =
            "{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}\
            {% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}";
        let template = crate::chat::ChatTemplate::new(source, "", "").expect("compiles");
        let format = ToolFormat::detect(&template, None);
        assert!(format.tools_in_user_turn());
        let mut assistant = ChatMessage::assistant("");
        assistant.tool_calls = ["a", "b"]
            .map(|id| ToolCall { id: id.into(), name: "get_weather".into(), arguments: "{}".into() })
            .to_vec();
        let mut messages = vec![ChatMessage::system("Be brief."), ChatMessage::user("Weather?"), assistant];
        for (id, text) in [("a", "sunny"), ("b", "warm")] {
            let mut result = ChatMessage::new(Role::Tool, text);
            result.tool_call_id = Some(id.into());
            messages.push(result);
        }
        let prepared = prepare_messages(&format, &messages, &[tool()]);
        let roles: Vec<Role> = prepared.iter().map(|m| m.role).collect();
        assert_eq!(roles, [Role::User, Role::Assistant, Role::User]);
        assert!(prepared[0].content.starts_with("# Tools"), "{}", prepared[0].content);
        assert!(prepared[0].content.contains("</tool_call>\n\nBe brief."), "{}", prepared[0].content);
        assert!(prepared[0].content.ends_with("\n\nWeather?"));
        assert_eq!(
            prepared[2].content,
            "<tool_response>\nsunny\n</tool_response>\n<tool_response>\nwarm\n</tool_response>"
        );
        assert!(template.render(&prepared, None, true, &crate::chat::TemplateKwargs::new()).is_ok());
    }

    #[test]
    fn native_formats_leave_messages_to_the_template() {
        let messages = vec![ChatMessage::user("Hi")];
        assert_eq!(prepare_messages(&ToolFormat::hermes(), &messages, &[tool()]), messages);
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
            ToolFormat::generic().write_calls(&[call], &[]),
            "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>"
        );
    }
}
