//! Ollama's request fields mapped into the OpenAI chat-completions body they mean, so that the
//! one conversion (`convert.rs`) checks and builds the engine request. Only what has no OpenAI
//! counterpart is decided here: the names of the options, `images`, `format`, `think`, and the
//! ids tool results answer (Ollama's history carries none).

use serde_json::{json, Map, Value};

use super::super::error::ApiError;
use crate::engine::ModelInfo;

/// What an Ollama body asks for beside the chat it becomes.
pub(super) struct Mapped {
    /// The OpenAI chat-completions body.
    pub body: Value,
    /// Answer as an NDJSON stream (Ollama's default) or one object.
    pub stream: bool,
    /// `/api/generate` with `raw`: the prompt, sent as it is instead of the templated turn.
    pub raw: Option<String>,
}

/// `options` Ollama clients send that the one resident model and its context make moot
/// (runner and load settings, and sampler kinds this server does not have): accepted, ignored.
const IGNORED_OPTIONS: &[&str] = &[
    "num_ctx",
    "num_keep",
    "num_batch",
    "num_gpu",
    "main_gpu",
    "use_mmap",
    "num_thread",
    "low_vram",
    "typical_p",
    "tfs_z",
    "mirostat",
    "mirostat_tau",
    "mirostat_eta",
    "penalize_newline",
    "numa",
    "vocab_only",
    "f16_kv",
    "use_mlock",
    "logits_all",
    "embedding_only",
];

/// `options` with the same meaning (and name) as an OpenAI/llama-server sampling field.
const SAMPLING_OPTIONS: &[&str] = &[
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "repeat_penalty",
    "repeat_last_n",
    "presence_penalty",
    "frequency_penalty",
    "stop",
];

/// The body as a JSON object.
///
/// # Errors
/// A 400 when it is not JSON or not an object.
pub(super) fn object(bytes: &[u8]) -> Result<Map<String, Value>, ApiError> {
    match super::super::extract::parse_json::<Value>(bytes)? {
        Value::Object(map) => Ok(map),
        _ => Err(ApiError::json(None, "the request body must be a JSON object")),
    }
}

/// `POST /api/chat`'s body as a chat-completions body.
///
/// # Errors
/// A 400 naming the field at fault, or 404 for a model this server does not serve.
pub(super) fn chat(mut body: Map<String, Value>, model: &ModelInfo) -> Result<Mapped, ApiError> {
    let mut openai = common(&mut body, model)?;
    let messages = match body.remove("messages") {
        Some(Value::Array(messages)) => messages,
        None | Some(Value::Null) => Vec::new(),
        Some(_) => return Err(ApiError::invalid("messages", "'messages' must be an array")),
    };
    openai.insert("messages".into(), Value::Array(messages_of(messages)?));
    if let Some(tools) = body.remove("tools").filter(|t| !t.is_null()) {
        openai.insert("tools".into(), tools);
    }
    Ok(Mapped { stream: stream(&body)?, body: Value::Object(openai), raw: None })
}

/// `POST /api/generate`'s body as a chat-completions body: `system` and `prompt` (with its
/// `images`) the conversation's turns. With `raw` the prompt is sent as it is, untemplated:
/// [`Mapped::raw`] holds it, and the job's prompt is replaced by it after conversion.
///
/// # Errors
/// As [`chat`]; also a 400 for `suffix` and `template`, which this server does not take, and
/// for `images` with `raw` (a raw prompt has no place for them).
pub(super) fn generate(mut body: Map<String, Value>, model: &ModelInfo) -> Result<Mapped, ApiError> {
    let mut openai = common(&mut body, model)?;
    for field in ["suffix", "template"] {
        if body.get(field).is_some_and(|v| !v.is_null() && v != "") {
            return Err(ApiError::invalid(field, format!("'{field}' is not supported by this server")));
        }
    }
    let text = |field: &str, body: &mut Map<String, Value>| match body.remove(field) {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::String(text)) => Ok(text),
        Some(_) => Err(ApiError::invalid(field, format!("'{field}' must be a string"))),
    };
    let prompt = text("prompt", &mut body)?;
    let system = text("system", &mut body)?;
    let raw = match body.get("raw") {
        None | Some(Value::Null | Value::Bool(false)) => false,
        Some(Value::Bool(true)) => true,
        Some(_) => return Err(ApiError::invalid("raw", "'raw' must be true or false")),
    };
    let images = body.remove("images").filter(|v| !v.is_null());
    if raw && images.is_some() {
        return Err(ApiError::invalid("images", "a 'raw' prompt cannot take 'images'; send them without 'raw'"));
    }
    let mut user = json!({"role": "user", "content": prompt});
    if let Some(images) = images {
        user["images"] = images;
    }
    let mut messages = Vec::new();
    if !system.is_empty() && !raw {
        messages.push(json!({"role": "system", "content": system}));
    }
    messages.push(user);
    openai.insert("messages".into(), Value::Array(messages_of(messages)?));
    let stream = stream(&body)?;
    Ok(Mapped { stream, body: Value::Object(openai), raw: raw.then_some(prompt) })
}

/// What chat and generate share: the model, `options`, `format`, `think` and `keep_alive`.
pub(super) fn common(body: &mut Map<String, Value>, model: &ModelInfo) -> Result<Map<String, Value>, ApiError> {
    let name = match body.get("model") {
        None | Some(Value::Null) => None,
        Some(Value::String(name)) => Some(name.as_str()),
        Some(_) => return Err(ApiError::invalid("model", "'model' must be a string")),
    };
    super::check_model(name, model)?;
    let mut openai = Map::new();
    openai.insert("model".into(), Value::String(super::tagged_name(model)));
    options(body.remove("options"), &mut openai)?;
    if let Some(format) = format(body.remove("format"))? {
        openai.insert("response_format".into(), format);
    }
    match body.remove("think") {
        None | Some(Value::Null | Value::Bool(true)) => {}
        // No reasoning: the template's switch off (`enable_thinking` false).
        Some(Value::Bool(false)) => {
            openai.insert("reasoning_effort".into(), json!("none"));
        }
        Some(Value::String(level)) if ["low", "medium", "high"].contains(&level.as_str()) => {
            openai.insert("reasoning_effort".into(), Value::String(level));
        }
        Some(_) => {
            return Err(ApiError::invalid("think", "'think' must be true, false, \"low\", \"medium\" or \"high\""))
        }
    }
    keep_alive(body.get("keep_alive"))?;
    Ok(openai)
}

/// `stream`: true unless the body says false (Ollama's default).
fn stream(body: &Map<String, Value>) -> Result<bool, ApiError> {
    match body.get("stream") {
        None | Some(Value::Null) => Ok(true),
        Some(Value::Bool(stream)) => Ok(*stream),
        Some(_) => Err(ApiError::invalid("stream", "'stream' must be true or false")),
    }
}

/// `options` into the sampling fields; `num_predict` into `max_tokens`.
fn options(options: Option<Value>, openai: &mut Map<String, Value>) -> Result<(), ApiError> {
    let options = match options {
        None | Some(Value::Null) => return Ok(()),
        Some(Value::Object(options)) => options,
        Some(_) => return Err(ApiError::invalid("options", "'options' must be an object")),
    };
    for (name, value) in options {
        if value.is_null() {
            continue;
        }
        if SAMPLING_OPTIONS.contains(&name.as_str()) {
            openai.insert(name, value);
        } else if name == "num_predict" {
            match value.as_i64() {
                // -1: no limit; -2: until the context is full. Either way the server's limit.
                Some(-1 | -2) => {}
                Some(n) if n > 0 => {
                    openai.insert("max_tokens".into(), json!(n));
                }
                _ => {
                    return Err(ApiError::invalid(
                        "options.num_predict",
                        "'num_predict' must be a number of tokens, or -1 for no limit",
                    ))
                }
            }
        } else if name == "num_ctx" {
            if value.as_u64().is_none_or(|n| n == 0) {
                return Err(ApiError::invalid("options.num_ctx", "'num_ctx' must be a positive number of tokens"));
            }
        } else if !IGNORED_OPTIONS.contains(&name.as_str()) {
            return Err(ApiError::invalid(format!("options.{name}"), format!("unknown option '{name}'")));
        }
    }
    Ok(())
}

/// `format`: `"json"` (any JSON object) or a JSON schema, as the grammar-constrained
/// `response_format` they mean.
fn format(format: Option<Value>) -> Result<Option<Value>, ApiError> {
    match format {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) if s.is_empty() => Ok(None),
        Some(Value::String(s)) if s == "json" => Ok(Some(json!({"type": "json_object"}))),
        Some(schema @ Value::Object(_)) => {
            Ok(Some(json!({"type": "json_schema", "json_schema": {"name": "format", "schema": schema}})))
        }
        Some(_) => Err(ApiError::invalid("format", "'format' must be \"json\" or a JSON schema object")),
    }
}

/// `keep_alive`: accepted (a duration string such as `"5m"`, seconds, `-1` or `0`) and
/// ignored: the one model stays loaded until the server stops.
fn keep_alive(value: Option<&Value>) -> Result<(), ApiError> {
    match value {
        None | Some(Value::Null | Value::Number(_) | Value::String(_)) => Ok(()),
        Some(_) => Err(ApiError::invalid("keep_alive", "'keep_alive' must be a duration (\"5m\") or a number")),
    }
}

/// A message's text and its pictures (data URLs) as content parts, where Ollama places them:
/// each picture at the next `[img]` marker of the text while one is left (the marker replaced),
/// the others before the text, in order.
fn pictures_in_text(text: &str, urls: Vec<String>) -> Vec<Value> {
    const MARKER: &str = "[img]";
    let image = |url: String| json!({"type": "image_url", "image_url": {"url": url}});
    let at_markers = text.matches(MARKER).count().min(urls.len());
    let mut urls = urls.into_iter();
    let placed: Vec<String> = urls.by_ref().take(at_markers).collect();
    let mut parts: Vec<Value> = urls.map(image).collect();
    let mut rest = text;
    for url in placed {
        let (before, after) = rest.split_once(MARKER).expect("counted");
        if !before.is_empty() {
            parts.push(json!({"type": "text", "text": before}));
        }
        parts.push(image(url));
        rest = after;
    }
    parts.push(json!({"type": "text", "text": rest}));
    parts
}

/// Ollama's messages as chat-completions messages: `images` into image parts, `thinking`
/// into `reasoning_content`, calls given ids, and each tool result answering the oldest
/// unanswered call (of its `tool_name`, when it says).
fn messages_of(messages: Vec<Value>) -> Result<Vec<Value>, ApiError> {
    let mut unanswered: Vec<(String, String)> = Vec::new();
    messages
        .into_iter()
        .enumerate()
        .map(|(i, message)| {
            let Value::Object(mut message) = message else {
                return Err(ApiError::invalid(format!("messages[{i}]"), "a message must be an object"));
            };
            if let Some(images) = message.remove("images").filter(|v| !v.is_null()) {
                let Value::Array(images) = images else {
                    return Err(ApiError::invalid(format!("messages[{i}].images"), "'images' must be an array"));
                };
                let text = match message.remove("content") {
                    Some(Value::String(text)) => text,
                    _ => String::new(),
                };
                let mut urls = Vec::with_capacity(images.len());
                for (j, image) in images.into_iter().enumerate() {
                    let Value::String(data) = image else {
                        return Err(ApiError::invalid(
                            format!("messages[{i}].images[{j}]"),
                            "an image must be base64 text",
                        ));
                    };
                    urls.push(format!("data:image;base64,{data}"));
                }
                message.insert("content".into(), Value::Array(pictures_in_text(&text, urls)));
            }
            if let Some(thinking) = message.remove("thinking") {
                message.insert("reasoning_content".into(), thinking);
            }
            if let Some(Value::Array(calls)) = message.get_mut("tool_calls") {
                for (j, call) in calls.iter_mut().enumerate() {
                    let id = format!("call_{i}_{j}");
                    let name = call.pointer("/function/name").and_then(Value::as_str).unwrap_or_default().to_string();
                    if let Value::Object(call) = call {
                        call.entry("id").or_insert_with(|| Value::String(id.clone()));
                        call.entry("type").or_insert_with(|| json!("function"));
                        let id = call.get("id").and_then(Value::as_str).unwrap_or(&id).to_string();
                        unanswered.push((id, name));
                    }
                }
            }
            if message.get("role").and_then(Value::as_str) == Some("tool") && !message.contains_key("tool_call_id") {
                let name = message.remove("tool_name").or_else(|| message.get("name").cloned());
                let name = name.as_ref().and_then(Value::as_str);
                let at = unanswered.iter().position(|(_, called)| name.is_none_or(|n| n == called)).or(
                    // A result naming no call made: it answers the oldest all the same.
                    (!unanswered.is_empty()).then_some(0),
                );
                let id = match at {
                    Some(at) => unanswered.remove(at).0,
                    None => format!("call_{i}"),
                };
                if let Some(name) = name {
                    message.insert("name".into(), json!(name));
                }
                message.insert("tool_call_id".into(), Value::String(id));
            }
            Ok(Value::Object(message))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use serde_json::{json, Value};

    use super::pictures_in_text;

    fn kinds(parts: &[Value]) -> Vec<String> {
        parts
            .iter()
            .map(|part| match part["type"].as_str() {
                Some("text") => format!("text:{}", part["text"].as_str().unwrap_or_default()),
                _ => format!("image:{}", part["image_url"]["url"].as_str().unwrap_or_default()),
            })
            .collect()
    }

    #[test]
    fn pictures_go_before_the_text_or_at_its_img_markers_as_ollama_places_them() {
        let urls = |n: usize| (0..n).map(|i| format!("u{i}")).collect::<Vec<_>>();
        assert_eq!(kinds(&pictures_in_text("What is this?", urls(2))), ["image:u0", "image:u1", "text:What is this?"]);
        assert_eq!(
            kinds(&pictures_in_text("Compare [img] with [img].", urls(2))),
            ["text:Compare ", "image:u0", "text: with ", "image:u1", "text:."]
        );
        // More pictures than markers: the rest go first; more markers: the rest stay text.
        assert_eq!(kinds(&pictures_in_text("[img] and", urls(2))), ["image:u1", "image:u0", "text: and"]);
        assert_eq!(kinds(&pictures_in_text("[img] [img]", urls(1))), ["image:u0", "text: [img]"]);
        assert_eq!(pictures_in_text("", Vec::new()), vec![json!({"type": "text", "text": ""})]);
    }
}
