//! Where the parts of a rendered conversation lie in its prompt text: the first message (the
//! system prompt, tools included), the earlier turns (history) and the newest turn. A cache
//! miss is explained by the part the prompt diverged in.

use super::{ChatMessage, Role};

/// Byte offsets in a rendered prompt where its parts end.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Landmarks {
    /// Where the first message's part ends: the second message's text starts there (what the
    /// template writes around the first message, tool definitions included, belongs to it).
    /// `None` for a conversation of one message.
    pub first_message_end: Option<usize>,
    /// Where the history ends: the text of the first message after the last assistant message
    /// (the newest turn) starts there.
    pub history_end: Option<usize>,
    /// Where the newest message's last word starts (with the whitespace before it), when that
    /// message is the user's: a later form of a partial transcript keeps what comes before and
    /// may change that word.
    pub last_word_start: Option<usize>,
}

/// The part of a prompt a position falls in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PromptPart {
    /// The first message.
    FirstMessage,
    /// An earlier turn.
    History,
    /// The newest turn (or a prompt without landmarks).
    NewestTurn,
}

impl Landmarks {
    /// Finds the parts of `text`, the rendering of `messages`, by locating each message's text
    /// in order. Messages whose text the template changed (or that have none) are skipped; a
    /// landmark whose message cannot be found is `None`.
    #[must_use]
    pub fn locate(text: &str, messages: &[ChatMessage]) -> Self {
        let mut starts = Vec::with_capacity(messages.len());
        let mut last_span = None;
        let mut cursor = 0;
        for message in messages {
            let found = find_from(text, cursor, &message.content);
            last_span = found;
            if let Some((start, end)) = found {
                cursor = end;
                starts.push(Some(start));
            } else {
                starts.push(None);
            }
        }
        let first_located_from = |from: usize| starts.iter().skip(from).find_map(|start| *start);
        let first_message_end = (messages.len() > 1).then(|| first_located_from(1)).flatten();
        let newest_turn = messages.iter().rposition(|m| m.role == Role::Assistant).map_or(1, |i| i + 1);
        let history_end = if newest_turn <= 1 { first_message_end } else { first_located_from(newest_turn) };
        let newest_is_user = messages.last().is_some_and(|m| m.role == Role::User);
        let last_word_start = last_span.filter(|_| newest_is_user).map(|(start, end)| last_word(text, start, end));
        Self { first_message_end, history_end, last_word_start }
    }

    /// The part byte `offset` of the prompt falls in.
    #[must_use]
    pub fn part_at(&self, offset: usize) -> PromptPart {
        if self.first_message_end.is_some_and(|end| offset < end) {
            PromptPart::FirstMessage
        } else if self.history_end.is_some_and(|end| offset < end) {
            PromptPart::History
        } else {
            PromptPart::NewestTurn
        }
    }
}

/// Where the last word of `text[start..end]` starts, with the whitespace before it (`start`
/// for a single word).
fn last_word(text: &str, start: usize, end: usize) -> usize {
    let span = text[start..end].trim_end();
    let Some(word_start) =
        span.rfind(char::is_whitespace).map(|at| at + span[at..].chars().next().map_or(1, char::len_utf8))
    else {
        return start;
    };
    let before = span[..word_start].trim_end_matches(char::is_whitespace);
    start + before.len()
}

/// The byte span of `needle` (or of it trimmed, as templates often write it) in `text` from
/// `from` on; `None` for an empty needle or one not found.
fn find_from(text: &str, from: usize, needle: &str) -> Option<(usize, usize)> {
    let rest = text.get(from..)?;
    [needle, needle.trim()]
        .into_iter()
        .filter(|n| !n.is_empty())
        .find_map(|n| rest.find(n).map(|at| (from + at, from + at + n.len())))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A ChatML-like rendering.
    fn chatml(messages: &[ChatMessage]) -> String {
        let mut text = String::new();
        for m in messages {
            let role = match m.role {
                Role::System => "system",
                Role::User => "user",
                Role::Assistant => "assistant",
                Role::Tool => "tool",
            };
            text.push_str(&format!("<|im_start|>{role}\n{}<|im_end|>\n", m.content));
        }
        text + "<|im_start|>assistant\n"
    }

    /// Where `needle` starts in `text`.
    fn at(text: &str, needle: &str) -> usize {
        text.find(needle).expect("in the text")
    }

    fn conversation() -> Vec<ChatMessage> {
        vec![
            ChatMessage::system("You are helpful."),
            ChatMessage::user("Hi"),
            ChatMessage::assistant("Hello!"),
            ChatMessage::user("Weather?"),
        ]
    }

    #[test]
    fn each_part_ends_where_the_next_part_starts() {
        let messages = conversation();
        let text = chatml(&messages);
        let landmarks = Landmarks::locate(&text, &messages);
        assert_eq!(landmarks.first_message_end, text.find("Hi"));
        assert_eq!(landmarks.history_end, text.find("Weather?"));
        assert_eq!(landmarks.part_at(at(&text, "helpful")), PromptPart::FirstMessage);
        // The second message's header belongs to the first part.
        assert_eq!(landmarks.part_at(at(&text, "Hi") - 1), PromptPart::FirstMessage);
        assert_eq!(landmarks.part_at(at(&text, "Hello")), PromptPart::History);
        assert_eq!(landmarks.part_at(at(&text, "Weather")), PromptPart::NewestTurn);
        assert_eq!(landmarks.part_at(text.len()), PromptPart::NewestTurn);
    }

    #[test]
    fn the_newest_user_message_s_last_word_is_found_with_its_whitespace() {
        let mut messages = conversation();
        messages[3] = ChatMessage::user("What is the  weather in\u{a0}Paris ");
        let text = chatml(&messages);
        let landmarks = Landmarks::locate(&text, &messages);
        assert_eq!(landmarks.last_word_start, Some(at(&text, "\u{a0}Paris")));
        assert_eq!(
            &text[landmarks.history_end.expect("history")..landmarks.last_word_start.expect("last word")],
            "What is the  weather in"
        );
        // After an assistant message there is no transcript to continue.
        let text = chatml(&messages[..3]);
        assert_eq!(Landmarks::locate(&text, &messages[..3]).last_word_start, None);
    }

    #[test]
    fn a_first_turn_has_no_history() {
        let messages = conversation()[..2].to_vec();
        let text = chatml(&messages);
        let landmarks = Landmarks::locate(&text, &messages);
        assert_eq!(landmarks.history_end, landmarks.first_message_end);
        assert_eq!(landmarks.part_at(at(&text, "Hi")), PromptPart::NewestTurn);
    }

    #[test]
    fn a_single_message_is_all_newest_turn() {
        let messages = vec![ChatMessage::user("Hi")];
        let text = chatml(&messages);
        let landmarks = Landmarks::locate(&text, &messages);
        assert_eq!((landmarks.first_message_end, landmarks.history_end), (None, None));
        assert_eq!(landmarks.last_word_start, text.find("Hi"), "a single word starts where its message does");
        assert_eq!(landmarks.part_at(0), PromptPart::NewestTurn);
    }

    #[test]
    fn a_system_prompt_folded_into_the_first_user_turn_is_still_the_first_part() {
        // Gemma's templates write the system text at the top of the first user turn.
        let messages = conversation();
        let text = "<start_of_turn>user\nYou are helpful.\n\nHi<end_of_turn>\n<start_of_turn>model\nHello!<end_of_turn>\n<start_of_turn>user\nWeather?<end_of_turn>\n<start_of_turn>model\n";
        let landmarks = Landmarks::locate(text, &messages);
        assert_eq!(landmarks.part_at(at(text, "helpful")), PromptPart::FirstMessage);
        assert_eq!(landmarks.part_at(at(text, "Hello")), PromptPart::History);
    }

    #[test]
    fn texts_are_located_in_order_and_trimmed_text_is_found() {
        // The same text twice: the second message is found after the first.
        let messages = vec![ChatMessage::system("same"), ChatMessage::user("  same  "), ChatMessage::user("x")];
        let text = "S:same U:same U:x";
        let landmarks = Landmarks::locate(text, &messages);
        assert_eq!(landmarks.first_message_end, Some(9));
    }

    #[test]
    fn messages_without_text_are_skipped() {
        let mut messages = conversation();
        messages[2].content.clear();
        let text = chatml(&messages);
        let landmarks = Landmarks::locate(&text, &messages);
        assert_eq!(landmarks.history_end, text.find("Weather?"));
    }
}
