//! Chat-template rendering: arbitrary conversations through real model templates (SmolLM2's,
//! from its GGUF, and firstword's built-in Gemma one), and arbitrary template sources under
//! small render limits.
//!
//! Input: byte 0 % 3 picks the template (seeds: `'0'` an arbitrary one, `'1'` SmolLM2, `'2'`
//! Gemma); the rest is records separated by 0x1E. With `'0'` the first record is the template
//! source. Each other record is a message or a tool by its first byte: `s`, `u`, `a`, `t`
//! (system, user, assistant, tool), `f` (a tool: name 0x1F description 0x1F parameters JSON) or
//! `r` (the reply for the next-turn prefix); any other byte is a user message. Within an
//! assistant message, 0x1F separates its text from calls (name 0x1F arguments, repeated);
//! within a tool message, its text from the id of the call it answers.
//!
//! Checks, real templates: rendering succeeds and equals what the template means, written out
//! in Rust (after firstword's tool preparation); the landmarks lie inside the text, in order;
//! the next turn's prefix starts the next turn's prompt. Arbitrary templates: rendering ends
//! within the fuel, and the output never exceeds its bound (libFuzzer's `-timeout` and
//! `-rss_limit_mb` report inputs that take too long or too much memory anyway).

#![no_main]

use std::sync::OnceLock;

use firstword::chat::tools::{prepare_messages, ToolDefinition, ToolFormat};
use firstword::chat::{ChatFormat, ChatTemplate, TemplateError, TemplateKwargs, TemplateSource};
use firstword::fuzzing::template_with_limits;
use firstword::{ChatMessage, Role};
use libfuzzer_sys::fuzz_target;

const SMOLLM2: &str = include_str!("../templates/smollm2.jinja");
const GEMMA: &str = include_str!("../../src/chat/templates/gemma.jinja");
const SMOLLM2_DEFAULT_SYSTEM: &str =
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n";
/// The limits arbitrary templates render under: small, so inputs that reach them stay fast.
const FUEL: u64 = 20_000;
const OUTPUT_BYTES: usize = 1 << 16;

static SMOLLM2_FORMAT: OnceLock<ChatFormat> = OnceLock::new();
static GEMMA_FORMAT: OnceLock<ChatFormat> = OnceLock::new();

/// A real template's format, compiled once.
fn real(format: &'static OnceLock<ChatFormat>, source: &str, bos: &str, eos: &str) -> &'static ChatFormat {
    format.get_or_init(|| {
        let template = ChatTemplate::new(source, bos, eos).expect("a real template compiles");
        ChatFormat::new(template, TemplateSource::Gguf)
    })
}

fuzz_target!(|data: &[u8]| {
    let Some((&selector, rest)) = data.split_first() else { return };
    let rest = String::from_utf8_lossy(rest);
    let mut records = rest.split('\x1e');
    let arbitrary;
    let format = match selector % 3 {
        0 => {
            let Ok(template) = template_with_limits(records.next().unwrap_or_default(), FUEL, OUTPUT_BYTES) else {
                return;
            };
            arbitrary = ChatFormat::new(template, TemplateSource::File("fuzz".into()));
            &arbitrary
        }
        1 => real(&SMOLLM2_FORMAT, SMOLLM2, "<|im_start|>", "<|im_end|>"),
        _ => real(&GEMMA_FORMAT, GEMMA, "<bos>", "<eos>"),
    };
    let (messages, tools, reply) = conversation(records);
    let rendered = format.render(&messages, &tools);
    let oracle = match selector % 3 {
        0 => {
            match &rendered {
                Ok(rendered) => assert!(rendered.text.len() <= OUTPUT_BYTES, "{} bytes", rendered.text.len()),
                Err(e) => assert!(matches!(e, TemplateError::Render(_) | TemplateError::Limit(_)), "{e}"),
            }
            let _ = format.next_turn_prefix(&messages, &tools, &TemplateKwargs::new(), format.reply_message(&reply, false, &tools));
            return;
        }
        1 => smollm2,
        _ => gemma,
    };
    let rendered = rendered.expect("real templates render every conversation");
    let prepared = prepare_messages(&ToolFormat::generic(), &messages, &tools);
    assert_eq!(rendered.text, oracle(&prepared), "what the template means");
    let ends = [rendered.landmarks.first_message_end, rendered.landmarks.history_end];
    for end in ends.into_iter().flatten() {
        assert!(rendered.text.is_char_boundary(end), "landmark {end} in {:?}", rendered.text);
    }
    if let [Some(first), Some(history)] = ends {
        assert!(first <= history, "landmarks in order");
    }
    let prefix = format
        .next_turn_prefix(&messages, &tools, &TemplateKwargs::new(), format.reply_message(&reply, false, &tools))
        .expect("a next-turn prefix");
    let mut next = messages;
    next.extend([ChatMessage::assistant(reply), ChatMessage::user("And then?")]);
    let next = format.render(&next, &tools).expect("the next turn renders");
    assert!(next.text.starts_with(&prefix), "the prefix {prefix:?} starts the next turn {:?}", next.text);
});

/// The messages, tools and next-turn reply the records describe.
fn conversation<'a>(records: impl Iterator<Item = &'a str>) -> (Vec<ChatMessage>, Vec<ToolDefinition>, String) {
    let (mut messages, mut tools, mut reply) = (Vec::new(), Vec::new(), String::from("Sure."));
    for record in records {
        let (kind, body) = record.split_at(record.chars().next().map_or(0, char::len_utf8));
        let mut fields = body.split('\x1f');
        let text = fields.next().unwrap_or_default();
        match kind {
            "f" => tools.push(ToolDefinition {
                name: text.to_string(),
                description: fields.next().map(str::to_string),
                parameters: fields
                    .next()
                    .and_then(|p| serde_json::from_str(p).ok())
                    .unwrap_or_else(|| serde_json::json!({"type": "object"})),
            }),
            "r" => reply = body.to_string(),
            "a" => {
                let mut message = ChatMessage::assistant(text);
                while let (Some(name), arguments) = (fields.next(), fields.next()) {
                    message.tool_calls.push(firstword::chat::ToolCall {
                        id: format!("call_{}", message.tool_calls.len()),
                        name: name.to_string(),
                        arguments: arguments.unwrap_or("{}").to_string(),
                    });
                }
                messages.push(message);
            }
            "t" => {
                let mut message = ChatMessage::new(Role::Tool, text);
                message.tool_call_id = fields.next().map(str::to_string);
                messages.push(message);
            }
            "s" => messages.push(ChatMessage::system(text)),
            "u" => messages.push(ChatMessage::user(text)),
            _ => messages.push(ChatMessage::user(record)),
        }
    }
    (messages, tools, reply)
}

/// SmolLM2's template: ChatML turns, its default system turn first when there is none.
fn smollm2(messages: &[ChatMessage]) -> String {
    let mut out = String::new();
    if messages.first().is_some_and(|m| m.role != Role::System) {
        out.push_str(SMOLLM2_DEFAULT_SYSTEM);
    }
    for m in messages {
        out.push_str(&format!("<|im_start|>{}\n{}<|im_end|>\n", m.role.as_str(), m.content));
    }
    out + "<|im_start|>assistant\n"
}

/// The built-in Gemma template: system texts folded into the first other turn, `model` turns
/// for the assistant, `user` turns for the rest, each text trimmed.
fn gemma(messages: &[ChatMessage]) -> String {
    let system: String =
        messages.iter().filter(|m| m.role == Role::System).map(|m| format!("{}\n\n", m.content)).collect();
    let mut out = String::from("<bos>");
    for (i, m) in messages.iter().filter(|m| m.role != Role::System).enumerate() {
        let role = if m.role == Role::Assistant { "model" } else { "user" };
        let first = if i == 0 { system.as_str() } else { "" };
        out.push_str(&format!("<start_of_turn>{role}\n{first}{}<end_of_turn>\n", m.content.trim()));
    }
    out + "<start_of_turn>model\n"
}
