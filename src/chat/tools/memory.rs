//! The calls a model generated, as it wrote them. Clients send earlier calls back with their
//! arguments re-serialized (`{"city":"Paris"}` where the model wrote `{"city": "Paris"}`); a
//! call in the history that is JSON-equal to a remembered one is written back as the model wrote
//! it, so the prompt keeps the generated text and the next turn reuses the cache.

use std::collections::VecDeque;

use parking_lot::Mutex;
use serde_json::Value;

use crate::chat::{ChatMessage, Role, ToolCall};

/// How many generated calls are remembered (the newest).
const REMEMBERED: usize = 64;

/// A generated call: its function, its arguments as a value and as written.
#[derive(Clone, Debug, PartialEq)]
struct Generated {
    name: String,
    value: Value,
    written: String,
}

/// The most recent generated calls.
#[derive(Debug, Default)]
pub struct CallMemory {
    calls: Mutex<VecDeque<Generated>>,
}

impl CallMemory {
    /// Remembers calls as the model wrote them (arguments that are no JSON are not kept).
    pub fn remember(&self, calls: &[ToolCall]) {
        let mut remembered = self.calls.lock();
        for call in calls {
            let Ok(value) = serde_json::from_str::<Value>(&call.arguments) else { continue };
            let generated = Generated { name: call.name.clone(), value, written: call.arguments.clone() };
            remembered.retain(|g| g != &generated);
            remembered.push_back(generated);
            while remembered.len() > REMEMBERED {
                remembered.pop_front();
            }
        }
    }

    /// `messages` with every assistant call that is JSON-equal to a remembered one (same
    /// function, same arguments) written as the model wrote it.
    #[must_use]
    pub fn restore(&self, messages: &[ChatMessage]) -> Vec<ChatMessage> {
        let remembered = self.calls.lock();
        if remembered.is_empty() {
            return messages.to_vec();
        }
        messages
            .iter()
            .map(|message| {
                if message.role != Role::Assistant || message.tool_calls.is_empty() {
                    return message.clone();
                }
                let mut restored = message.clone();
                for call in &mut restored.tool_calls {
                    let Ok(value) = serde_json::from_str::<Value>(&call.arguments) else { continue };
                    if let Some(generated) = remembered.iter().rev().find(|g| g.name == call.name && g.value == value) {
                        call.arguments.clone_from(&generated.written);
                    }
                }
                restored
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(arguments: &str) -> ToolCall {
        ToolCall { id: "call_1".into(), name: "get_weather".into(), arguments: arguments.into() }
    }

    #[test]
    fn a_reserialized_call_is_written_back_as_generated() {
        let memory = CallMemory::default();
        memory.remember(&[call("{ \"city\" : \"Paris\", \"n\": 1.0 }")]);
        let mut sent = ChatMessage::assistant("");
        sent.tool_calls = vec![call("{\"n\":1.0,\"city\":\"Paris\"}")];
        let restored = memory.restore(&[ChatMessage::user("Hi"), sent.clone()]);
        assert_eq!(restored[1].tool_calls[0].arguments, "{ \"city\" : \"Paris\", \"n\": 1.0 }");
        // Other arguments, or another function, are left as they are.
        sent.tool_calls = vec![call("{\"city\":\"Lyon\"}")];
        assert_eq!(memory.restore(&[sent.clone()])[0], sent);
        let mut other = sent.clone();
        other.tool_calls[0].name = "set_timer".into();
        other.tool_calls[0].arguments = "{\"n\":1.0,\"city\":\"Paris\"}".into();
        assert_eq!(memory.restore(&[other.clone()])[0], other);
    }

    #[test]
    fn only_the_newest_calls_are_kept() {
        let memory = CallMemory::default();
        for i in 0..REMEMBERED + 10 {
            memory.remember(&[call(&format!("{{\"i\": {i}}}"))]);
        }
        let mut sent = ChatMessage::assistant("");
        sent.tool_calls = vec![call("{\"i\":0}")];
        assert_eq!(memory.restore(&[sent.clone()])[0], sent, "forgotten");
        sent.tool_calls = vec![call(&format!("{{\"i\":{}}}", REMEMBERED + 9))];
        assert_eq!(memory.restore(&[sent])[0].tool_calls[0].arguments, format!("{{\"i\": {}}}", REMEMBERED + 9));
    }
}
