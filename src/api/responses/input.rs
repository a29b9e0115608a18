//! The Responses API's input items as a conversation: messages, function calls (joined to the
//! assistant turn that made them), their outputs (tool messages), and reasoning (kept with the
//! assistant turn it preceded).

use serde_json::Value;

use super::wire::Input;
use crate::api::convert::MediaParts;
use crate::api::error::{ApiError, Refusal};
use crate::chat::{ChatMessage, Role, ToolCall};

/// Most input items per request (as many as messages).
pub(super) const MAX_ITEMS: usize = crate::api::limits::MAX_MESSAGES;

/// The messages of `input`.
///
/// # Errors
/// A 400 naming the item (`input[3].type`) for items and content this server cannot use.
pub(super) fn input_messages(input: Input, media: &mut MediaParts<'_>) -> Result<Vec<ChatMessage>, ApiError> {
    let items = match input {
        Input::Text(text) => return Ok(vec![ChatMessage::user(text)]),
        Input::Items(items) => items,
    };
    if items.len() > MAX_ITEMS {
        return Err(crate::api::limits::too_many("input", "input items", items.len(), MAX_ITEMS));
    }
    let mut messages: Vec<ChatMessage> = Vec::new();
    // Reasoning waiting for the assistant turn it preceded.
    let mut reasoning: Option<String> = None;
    for (i, item) in items.iter().enumerate() {
        let param = |field: &str| format!("input[{i}]{field}");
        let kind = match item.get("type") {
            None | Some(Value::Null) if item.get("role").is_some() => "message",
            Some(Value::String(kind)) => kind.as_str(),
            _ => return Err(ApiError::invalid(param(".type"), "an input item needs a 'type'")),
        };
        match kind {
            "message" => {
                let role = match item.get("role").and_then(Value::as_str) {
                    Some("user") => Role::User,
                    Some("assistant") => Role::Assistant,
                    Some("system" | "developer") => Role::System,
                    other => {
                        return Err(ApiError::invalid(
                            param(".role"),
                            format!("role {other:?} is not one of user, assistant, system, developer"),
                        ))
                    }
                };
                let mut message = ChatMessage::new(role, content_text(item.get("content"), &param(".content"), media)?);
                if role == Role::Assistant {
                    message.reasoning = reasoning.take();
                }
                messages.push(message);
            }
            "function_call" => {
                let text = |field: &str| {
                    item.get(field)
                        .and_then(Value::as_str)
                        .map(str::to_string)
                        .ok_or_else(|| ApiError::invalid(param(&format!(".{field}")), format!("a function call needs '{field}'")))
                };
                let call = ToolCall { id: text("call_id")?, name: text("name")?, arguments: text("arguments")? };
                // Calls right after an assistant message (or another call) belong to that turn.
                match messages.last_mut() {
                    Some(last) if last.role == Role::Assistant && reasoning.is_none() => last.tool_calls.push(call),
                    _ => {
                        let mut turn = ChatMessage::assistant("");
                        turn.reasoning = reasoning.take();
                        turn.tool_calls.push(call);
                        messages.push(turn);
                    }
                }
            }
            "function_call_output" => {
                let call_id = item
                    .get("call_id")
                    .and_then(Value::as_str)
                    .ok_or_else(|| ApiError::invalid(param(".call_id"), "a function call output needs 'call_id'"))?;
                let mut message =
                    ChatMessage::new(Role::Tool, content_text(item.get("output"), &param(".output"), media)?);
                message.tool_call_id = Some(call_id.to_string());
                messages.push(message);
            }
            "reasoning" => {
                let text = reasoning_text(item);
                reasoning = Some(match reasoning.take() {
                    Some(earlier) => format!("{earlier}\n{text}"),
                    None => text,
                });
            }
            other => {
                return Err(ApiError::refused(
                    Refusal::UnsupportedContent,
                    param(".type"),
                    format!("input items of type '{other}' are not supported; use message, function_call, function_call_output or reasoning items"),
                ))
            }
        }
    }
    if messages.is_empty() {
        return Err(ApiError::invalid("input", "'input' must contain at least one message"));
    }
    Ok(messages)
}

/// A message's `content` (or a call output's `output`): text, or a list of text and (with a
/// projector) `input_image` / `input_audio` parts, each media standing as its marker.
fn content_text(content: Option<&Value>, param: &str, media: &mut MediaParts<'_>) -> Result<String, ApiError> {
    match content {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::String(text)) => Ok(text.clone()),
        Some(Value::Array(parts)) => {
            let mut texts = Vec::with_capacity(parts.len());
            for (j, part) in parts.iter().enumerate() {
                let kind = part.get("type").and_then(Value::as_str).unwrap_or("");
                if let Some(marker) = media.marker(kind, part, &format!("{param}[{j}]"))? {
                    texts.push(marker);
                    continue;
                }
                match (kind, part.get("text").and_then(Value::as_str)) {
                    ("input_text" | "output_text" | "text", Some(text)) => texts.push(text.to_string()),
                    // A refusal the model wrote earlier is part of its turn.
                    ("refusal", _) => texts.extend(part.get("refusal").and_then(Value::as_str).map(str::to_string)),
                    ("input_text" | "output_text" | "text", None) => {
                        return Err(ApiError::invalid(format!("{param}[{j}].text"), "a text part needs 'text'"))
                    }
                    (kind, _) => {
                        return Err(ApiError::refused(
                            Refusal::UnsupportedContent,
                            format!("{param}[{j}].type"),
                            format!("this server has no backend for '{kind}' content; it takes text, input_image and input_audio parts"),
                        ))
                    }
                }
            }
            Ok(texts.join("\n"))
        }
        Some(_) => Err(ApiError::invalid(param, "must be a string or a list of content parts")),
    }
}

/// A reasoning item's text: its `content` (reasoning text), else its summary.
fn reasoning_text(item: &Value) -> String {
    let texts = |field: &str| -> Vec<String> {
        item.get(field)
            .and_then(Value::as_array)
            .map(|parts| parts.iter().filter_map(|p| p.get("text")?.as_str().map(str::to_string)).collect())
            .unwrap_or_default()
    };
    let content = texts("content");
    if content.is_empty() {
        texts("summary").join("\n")
    } else {
        content.join("\n")
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn messages(items: Value) -> Result<Vec<ChatMessage>, ApiError> {
        let support = crate::engine::media::MediaSupport::default();
        input_messages(Input::Items(items.as_array().expect("a list").clone()), &mut MediaParts::new(&support))
    }

    #[test]
    fn text_input_is_one_user_message() {
        let support = crate::engine::media::MediaSupport::default();
        let got = input_messages(Input::Text("Hi".into()), &mut MediaParts::new(&support)).expect("ok");
        assert_eq!(got, vec![ChatMessage::user("Hi")]);
    }

    #[test]
    fn a_function_call_round_trip_becomes_an_assistant_turn_and_a_tool_message() {
        let got = messages(json!([
            {"role": "developer", "content": "Be brief."},
            {"role": "user", "content": [{"type": "input_text", "text": "Weather in Paris?"}]},
            {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "Use the tool."}]},
            {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{\"city\":\"Paris\"}"},
            {"type": "function_call", "call_id": "call_2", "name": "get_time", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "call_1", "output": "21C"},
            {"type": "function_call_output", "call_id": "call_2", "output": [{"type": "input_text", "text": "noon"}]},
        ]))
        .expect("accepted");
        assert_eq!(got.len(), 5);
        assert_eq!((got[0].role, got[0].content.as_str()), (Role::System, "Be brief."));
        assert_eq!(got[2].role, Role::Assistant);
        assert_eq!(got[2].reasoning.as_deref(), Some("Use the tool."));
        let names: Vec<&str> = got[2].tool_calls.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["get_weather", "get_time"]);
        assert_eq!(
            (got[3].role, got[3].tool_call_id.as_deref(), got[3].content.as_str()),
            (Role::Tool, Some("call_1"), "21C")
        );
        assert_eq!(got[4].content, "noon");
    }

    #[test]
    fn an_assistant_message_and_its_calls_are_one_turn() {
        let got = messages(json!([
            {"role": "user", "content": "Hi"},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Let me check.", "annotations": []}]},
            {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
        ]))
        .expect("accepted");
        assert_eq!(got.len(), 2);
        assert_eq!((got[1].content.as_str(), got[1].tool_calls.len()), ("Let me check.", 1));
    }

    #[test]
    fn unusable_items_are_refused_by_name() {
        let cases = [
            (json!([{"type": "item_reference", "id": "msg_1"}]), "input[0].type"),
            (
                json!([{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]),
                "input[0].content[0].type",
            ),
            (json!([{"role": "wizard", "content": "x"}]), "input[0].role"),
            (json!([{"type": "function_call", "name": "f", "arguments": "{}"}]), "input[0].call_id"),
            (json!([{"type": "function_call_output", "output": "x"}]), "input[0].call_id"),
            (json!([{"content": "no role"}]), "input[0].type"),
            (json!([]), "input"),
        ];
        for (items, param) in cases {
            let error = messages(items.clone()).expect_err(&items.to_string());
            assert_eq!(error.param().as_deref(), Some(param), "{items}: {error}");
        }
    }
}
