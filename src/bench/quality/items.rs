//! The quality set: prompts a voice assistant meets, each with an optional reference answer
//! and rubric notes, from a JSONL file (`--quality FILE`) or the built-in set.

use std::path::Path;

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use super::super::media::MediaInputs;
use super::QualityError;

/// The built-in set: short facts, home commands with tools, follow-ups that need the history or
/// a tool's result, refusals, summaries.
const BUILTIN: &str = include_str!("builtin.jsonl");

/// The system message every built-in item is asked under.
pub const VOICE_SYSTEM: &str = "You are a voice assistant in a smart home. Your answers are spoken aloud: \
    answer in one or two short sentences, without markdown or lists. Use a tool when the user asks you to \
    act on a device, a timer or the weather.";

/// Tokens an item may generate unless it says otherwise.
pub const DEFAULT_MAX_TOKENS: u32 = 160;

/// One prompt of the quality set.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QualityItem {
    /// Unique within the set; names the item in the answers and grades.
    pub id: String,
    /// The conversation, as OpenAI chat messages. A content part `{"type": "bench_clip",
    /// "clip": N}` or `{"type": "bench_picture", "picture": N}` stands for the media
    /// scenario's N-th spoken clip or picture.
    pub messages: Vec<Value>,
    /// OpenAI tools, or `"home"`: the home tools (turn on, turn off, timer, weather).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools: Option<Value>,
    /// What a good answer says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reference: Option<String>,
    /// Notes for the grader beyond the rubric.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rubric: Option<String>,
    /// Tokens the answer may take ([`DEFAULT_MAX_TOKENS`] unless given).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u32>,
}

impl QualityItem {
    /// Whether a content part stands for one of the media scenario's clips or pictures.
    #[must_use]
    pub fn uses_media(&self) -> bool {
        self.messages.iter().any(|m| m["content"].as_array().is_some_and(|parts| parts.iter().any(is_media_stand_in)))
    }

    /// The tools sent with the item, `"home"` spelled out.
    #[must_use]
    pub fn tools(&self) -> Option<Value> {
        match &self.tools {
            Some(Value::String(name)) if name == "home" => Some(home_tools()),
            other => other.clone(),
        }
    }

    /// The chat-completions body: streamed, greedy for sample 0, otherwise sampled at
    /// temperature 0.7 with the sample's number as seed (the same for every server: matched
    /// pairs). Media stand-ins become `media`'s parts.
    #[must_use]
    pub(in crate::bench) fn body(&self, model: &str, sample: u32, media: Option<&MediaInputs>) -> Value {
        let messages: Vec<Value> = self.messages.iter().map(|m| with_media(m, media)).collect();
        let mut body = json!({"model": model, "messages": messages,
            "max_tokens": self.max_tokens.unwrap_or(DEFAULT_MAX_TOKENS), "stream": true,
            "stream_options": {"include_usage": true}});
        if sample == 0 {
            body["temperature"] = json!(0);
        } else {
            body["temperature"] = json!(0.7);
            body["seed"] = json!(sample);
        }
        if let Some(tools) = self.tools() {
            body["tools"] = tools;
            body["tool_choice"] = json!("auto");
        }
        body
    }
}

fn is_media_stand_in(part: &Value) -> bool {
    matches!(part["type"].as_str(), Some("bench_clip" | "bench_picture"))
}

/// `message` with its media stand-ins replaced by `media`'s parts (left as they are without
/// media: the server then refuses the part, and the answer records its error).
fn with_media(message: &Value, media: Option<&MediaInputs>) -> Value {
    let (Some(parts), Some(media)) = (message["content"].as_array(), media) else { return message.clone() };
    let parts: Vec<Value> = parts
        .iter()
        .map(|part| {
            let index = |key: &str| part[key].as_u64().and_then(|n| usize::try_from(n).ok());
            match part["type"].as_str() {
                Some("bench_clip") => index("clip")
                    .and_then(|n| media.clips.get(n))
                    .map_or_else(|| part.clone(), |clip| super::super::media::audio_part(&clip.wav)),
                Some("bench_picture") => index("picture")
                    .and_then(|n| media.images.get(n))
                    .map_or_else(|| part.clone(), |image| super::super::media::image_part(image)),
                _ => part.clone(),
            }
        })
        .collect();
    let mut message = message.clone();
    message["content"] = Value::Array(parts);
    message
}

/// The home tools of the built-in set: Home Assistant's intents for devices, and the bench's
/// timer and weather tools.
#[must_use]
pub fn home_tools() -> Value {
    let device = |name: &str, description: &str| {
        json!({"type": "function", "function": {"name": name, "description": description,
            "parameters": {"type": "object", "properties": {
                "name": {"type": "string", "description": "The device's name"},
                "area": {"type": "string", "description": "The room"},
                "domain": {"type": "string", "enum": ["light", "switch", "fan", "cover"]}},
            "additionalProperties": false}}})
    };
    let mut tools = vec![
        device("HassTurnOn", "Turns on or opens a device or all devices of a kind in an area"),
        device("HassTurnOff", "Turns off or closes a device or all devices of a kind in an area"),
    ];
    tools.extend(super::super::bench_tools().as_array().cloned().unwrap_or_default());
    Value::Array(tools)
}

/// A quality set, in order.
#[derive(Clone, Debug, PartialEq)]
pub struct QualitySet {
    /// The items.
    pub items: Vec<QualityItem>,
}

impl QualitySet {
    /// The built-in set, each item asked under [`VOICE_SYSTEM`].
    #[must_use]
    pub fn builtin() -> Self {
        let mut set = Self::parse(BUILTIN).unwrap_or_else(|e| unreachable!("the built-in set parses: {e}"));
        for item in &mut set.items {
            item.messages.insert(0, json!({"role": "system", "content": VOICE_SYSTEM}));
        }
        set
    }

    /// Reads a JSONL quality set.
    ///
    /// # Errors
    /// [`QualityError::Read`] when the file cannot be read, or as [`Self::parse`].
    pub fn load(path: &Path) -> Result<Self, QualityError> {
        let text =
            std::fs::read_to_string(path).map_err(|error| QualityError::Read { path: path.to_path_buf(), error })?;
        Self::parse(&text)
    }

    /// Parses JSONL: one item per line, blank lines skipped.
    ///
    /// # Errors
    /// [`QualityError::BadItem`] (a line that is not an item, with its number),
    /// [`QualityError::DuplicateId`], [`QualityError::Empty`].
    pub fn parse(text: &str) -> Result<Self, QualityError> {
        let mut items: Vec<QualityItem> = Vec::new();
        for (index, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
            let item: QualityItem = serde_json::from_str(line)
                .map_err(|error| QualityError::BadItem { line: index + 1, message: error.to_string() })?;
            if item.messages.is_empty() {
                return Err(QualityError::BadItem { line: index + 1, message: "no messages".into() });
            }
            if items.iter().any(|i| i.id == item.id) {
                return Err(QualityError::DuplicateId(item.id));
            }
            items.push(item);
        }
        if items.is_empty() {
            return Err(QualityError::Empty);
        }
        Ok(Self { items })
    }

    /// Whether any item needs the media scenario's clips or pictures.
    #[must_use]
    pub fn uses_media(&self) -> bool {
        self.items.iter().any(QualityItem::uses_media)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_builtin_set_fits_a_voice_assistant() {
        let set = QualitySet::builtin();
        assert!(set.items.len() >= 20, "{}", set.items.len());
        assert!(set.items.iter().all(|i| i.messages[0]["role"] == "system" && i.reference.is_some()));
        let with_tools = set.items.iter().filter(|i| i.tools.is_some()).count();
        let follow_ups = set.items.iter().filter(|i| i.messages.len() > 2).count();
        assert!(with_tools >= 4 && follow_ups >= 3, "{with_tools} with tools, {follow_ups} follow-ups");
        assert!(!set.uses_media());
    }

    #[test]
    fn greedy_and_sampled_bodies_are_the_same_for_every_server() {
        let item = &QualitySet::builtin().items[8];
        let greedy = item.body("m", 0, None);
        assert_eq!(greedy["temperature"], 0);
        assert!(greedy.get("seed").is_none());
        assert_eq!(greedy["tools"].as_array().map(Vec::len), Some(4));
        let sampled = item.body("m", 2, None);
        assert_eq!((sampled["temperature"].as_f64(), sampled["seed"].as_u64()), (Some(0.7), Some(2)));
    }

    #[test]
    fn bad_sets_are_refused_with_the_line() {
        assert!(matches!(QualitySet::parse("\n\n"), Err(QualityError::Empty)));
        let line_two = "{\"id\": \"a\", \"messages\": [{\"role\": \"user\", \"content\": \"x\"}]}\n{\"id\": 3}";
        assert!(matches!(QualitySet::parse(line_two), Err(QualityError::BadItem { line: 2, .. })));
        let twice = "{\"id\": \"a\", \"messages\": [{}]}\n{\"id\": \"a\", \"messages\": [{}]}";
        assert!(matches!(QualitySet::parse(twice), Err(QualityError::DuplicateId(id)) if id == "a"));
        let unknown = "{\"id\": \"a\", \"messages\": [{}], \"referense\": \"typo\"}";
        assert!(matches!(QualitySet::parse(unknown), Err(QualityError::BadItem { line: 1, .. })));
    }

    #[test]
    fn media_stand_ins_become_the_media_scenarios_parts() {
        use super::super::super::media::SpokenClip;
        let set = QualitySet::parse(
            "{\"id\": \"a\", \"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"bench_clip\", \"clip\": 0}, \
             {\"type\": \"bench_picture\", \"picture\": 0}, {\"type\": \"bench_clip\", \"clip\": 9}, {\"type\": \"text\", \"text\": \"Describe.\"}]}]}",
        )
        .expect("set");
        let media =
            MediaInputs { clips: vec![SpokenClip { text: "hi", wav: b"RIFF".to_vec() }], images: vec![b"BM".to_vec()] };
        let parts = set.items[0].body("m", 0, Some(&media))["messages"][0]["content"].clone();
        assert_eq!(parts[0]["input_audio"]["data"], "UklGRg==");
        assert_eq!(parts[1]["image_url"]["url"], "data:image/bmp;base64,Qk0=");
        assert_eq!(
            parts[2]["type"], "bench_clip",
            "a clip the scenario lacks stays as written (the server refuses it)"
        );
        assert_eq!(parts[3]["text"], "Describe.");
    }

    #[test]
    fn media_stand_ins_are_found() {
        let set = QualitySet::parse(
            "{\"id\": \"a\", \"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"bench_clip\", \"clip\": 1}]}]}",
        )
        .expect("set");
        assert!(set.uses_media());
    }
}
