//! Shortening a conversation that no longer fits the context: its oldest whole turns go, the
//! instructions before them stay.

use super::message::{ChatMessage, Role};

/// A conversation seen as the instructions it opens with (its leading system messages) and
/// its turns: each turn starts at a user message and runs to the next one, so an assistant's
/// tool calls and the tools' results stay with the turn that asked for them.
#[derive(Debug)]
pub struct Turns<'c> {
    messages: &'c [ChatMessage],
    /// Where the instructions end and each turn starts.
    starts: Vec<usize>,
}

impl<'c> Turns<'c> {
    /// Splits `messages` into instructions and turns. Messages after the instructions but
    /// before the first user message (an assistant's greeting) form the first turn.
    #[must_use]
    pub fn of(messages: &'c [ChatMessage]) -> Self {
        let instructions = messages.iter().take_while(|m| m.role == Role::System).count();
        let mut starts = vec![instructions];
        starts.extend(
            messages.iter().enumerate().skip(instructions + 1).filter(|(_, m)| m.role == Role::User).map(|(i, _)| i),
        );
        if instructions == messages.len() {
            starts.clear();
        }
        Self { messages, starts }
    }

    /// How many turns there are.
    #[must_use]
    pub fn len(&self) -> usize {
        self.starts.len()
    }

    /// Whether there is no turn (only instructions, or nothing).
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.starts.is_empty()
    }

    /// The conversation without its `n` oldest turns, and how many messages that leaves out;
    /// `None` unless at least one turn (the newest) remains.
    #[must_use]
    pub fn without_oldest(&self, n: usize) -> Option<(Vec<ChatMessage>, usize)> {
        if n >= self.starts.len() {
            return None;
        }
        let instructions = self.starts[0];
        let kept_from = self.starts[n];
        let mut kept = self.messages[..instructions].to_vec();
        kept.extend_from_slice(&self.messages[kept_from..]);
        Some((kept, kept_from - instructions))
    }

    /// The messages of the `n` oldest turns (what [`Turns::without_oldest`] leaves out).
    #[must_use]
    pub fn oldest(&self, n: usize) -> &'c [ChatMessage] {
        match (self.starts.first(), self.starts.get(n)) {
            (Some(&first), Some(&end)) => &self.messages[first..end],
            (Some(&first), None) => &self.messages[first..],
            _ => &[],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chat::ToolCall;

    fn roles(messages: &[ChatMessage]) -> Vec<Role> {
        messages.iter().map(|m| m.role).collect()
    }

    fn conversation() -> Vec<ChatMessage> {
        let mut call = ChatMessage::assistant("");
        call.tool_calls =
            vec![ToolCall { id: "c1".into(), name: "weather".into(), arguments: serde_json::json!({}).to_string() }];
        vec![
            ChatMessage::system("rules"),
            ChatMessage::user("one"),
            call,
            ChatMessage { tool_call_id: Some("c1".into()), ..ChatMessage::new(Role::Tool, "sunny") },
            ChatMessage::assistant("It is sunny."),
            ChatMessage::user("two"),
            ChatMessage::assistant("2"),
            ChatMessage::user("three"),
        ]
    }

    #[test]
    fn a_tool_call_and_its_result_go_with_their_turn() {
        let messages = conversation();
        let turns = Turns::of(&messages);
        assert_eq!(turns.len(), 3);
        let (kept, dropped) = turns.without_oldest(1).expect("two turns remain");
        assert_eq!(dropped, 4);
        assert_eq!(roles(&kept), [Role::System, Role::User, Role::Assistant, Role::User]);
        assert_eq!(kept[1].content, "two");
        assert_eq!(roles(turns.oldest(1)), [Role::User, Role::Assistant, Role::Tool, Role::Assistant]);
        let (kept, dropped) = turns.without_oldest(2).expect("the newest turn remains");
        assert_eq!((roles(&kept), dropped), (vec![Role::System, Role::User], 6));
        assert!(turns.without_oldest(3).is_none(), "the newest turn is never dropped");
    }

    #[test]
    fn conversations_without_instructions_or_turns() {
        let messages = vec![ChatMessage::assistant("Hello!"), ChatMessage::user("hi"), ChatMessage::user("again")];
        let turns = Turns::of(&messages);
        assert_eq!(turns.len(), 3, "a greeting before the first user message is a turn of its own");
        assert_eq!(turns.without_oldest(2).map(|(kept, n)| (roles(&kept), n)), Some((vec![Role::User], 2)));
        let only_rules = vec![ChatMessage::system("rules")];
        assert!(Turns::of(&only_rules).is_empty());
        assert!(Turns::of(&[]).is_empty());
        assert!(Turns::of(&only_rules).oldest(1).is_empty());
    }
}
