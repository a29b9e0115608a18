//! Validating an OpenAI request and turning it into an engine request.
//!
//! Ranges follow OpenAI's API; anything this server cannot honour is refused with a 400 naming
//! the field, never silently ignored.

use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use tokio::sync::Semaphore;

use super::error::{ApiError, Refusal};
use super::extract::parse_json;
use super::limits::{check_schema, check_stops, too_many, MAX_LOGIT_BIAS, MAX_TOOLS};
use super::wire::{ChatCompletionRequest, Content, Stop, WireMessage};
use crate::chat::tools::{request_grammar, OutputSchema, ToolChoice, ToolDefinition, ToolFormat, ToolSet};
use crate::chat::{ChatMessage, Role, ToolCall};
use crate::engine::{GenerationRequest, ModelInfo, Prompt, SamplingParams, LARGE_STACK_BYTES};

/// A validated request: what to run and how to answer.
#[derive(Debug)]
pub(crate) struct ChatJob {
    /// What the engine runs.
    pub request: GenerationRequest,
    /// Answer as server-sent events.
    pub stream: bool,
    /// Streams end with a usage chunk (`stream_options.include_usage`).
    pub include_usage: bool,
    /// The model name to answer with (the request's, else the loaded model's).
    pub model: String,
    /// How the generated text becomes the answer.
    pub output: OutputPlan,
}

/// How the generated text becomes the answer.
#[derive(Debug)]
pub(crate) struct OutputPlan {
    /// The format calls are written in.
    pub format: ToolFormat,
    /// Tools the model may call; `None` when calls are not allowed (text is then plain content).
    pub tools: Option<ToolSet>,
    /// The schema a JSON reply must match.
    pub schema: Option<OutputSchema>,
}

fn in_range(param: &str, value: Option<f64>, min: f64, max: f64) -> Result<Option<f32>, ApiError> {
    match value {
        Some(v) if !(min..=max).contains(&v) => {
            Err(ApiError::invalid(param, format!("'{param}' must be between {min} and {max}, got {v}")))
        }
        other => Ok(other.map(|v| v as f32)),
    }
}

impl ChatCompletionRequest {
    /// Validates the request against the model and builds the engine request.
    pub(crate) fn into_job(self, model: &ModelInfo) -> Result<ChatJob, ApiError> {
        if let Some(n) = self.n.filter(|&n| n != 1) {
            return Err(ApiError::invalid("n", format!("only n=1 is supported, got {n}")));
        }
        if self.logprobs == Some(true) || self.top_logprobs.is_some_and(|n| n > 0) {
            return Err(ApiError::invalid("logprobs", "logprobs are not supported by this server"));
        }
        let messages = convert_messages(self.messages)?;
        let definitions = convert_tools(self.tools.unwrap_or_default())?;
        let choice = convert_tool_choice(self.tool_choice)?;
        let tools = ToolSet::new(definitions.clone())?;
        tools.check_choice(&choice)?;
        let schema = convert_response_format(self.response_format)?;
        let parallel = self.parallel_tool_calls.unwrap_or(true);
        let grammar = request_grammar(model.tool_format, &tools, &choice, parallel, schema.as_ref());

        let max_tokens = match self.max_completion_tokens.or(self.max_tokens) {
            None => None,
            Some(m) if m < 1 => {
                let param = if self.max_completion_tokens.is_some() { "max_completion_tokens" } else { "max_tokens" };
                return Err(ApiError::invalid(param, format!("'{param}' must be at least 1, got {m}")));
            }
            Some(m) => Some(u32::try_from(m).unwrap_or(u32::MAX)),
        };
        let defaults = SamplingParams::default();
        let top_k = match self.top_k {
            Some(k) if k < 0 => return Err(ApiError::invalid("top_k", format!("'top_k' must be 0 or more, got {k}"))),
            Some(k) => i32::try_from(k).unwrap_or(i32::MAX),
            None => defaults.top_k,
        };
        let repeat_last_n = match self.repeat_last_n {
            Some(n) if n < 0 || n > i64::from(model.n_ctx) => {
                return Err(ApiError::invalid(
                    "repeat_last_n",
                    format!("'repeat_last_n' must be between 0 and the context size {}, got {n}", model.n_ctx),
                ))
            }
            Some(n) => i32::try_from(n).unwrap_or(i32::MAX),
            None => defaults.repeat_last_n,
        };
        let sampling = SamplingParams {
            temperature: in_range("temperature", self.temperature, 0.0, 2.0)?.unwrap_or(defaults.temperature),
            top_p: in_range("top_p", self.top_p, 0.0, 1.0)?.unwrap_or(defaults.top_p),
            top_k,
            min_p: in_range("min_p", self.min_p, 0.0, 1.0)?.unwrap_or(defaults.min_p),
            // Any integer is a valid seed; llama.cpp takes 32 bits.
            seed: self.seed.map(|s| s as u32),
            presence_penalty: in_range("presence_penalty", self.presence_penalty, -2.0, 2.0)?.unwrap_or(0.0),
            frequency_penalty: in_range("frequency_penalty", self.frequency_penalty, -2.0, 2.0)?.unwrap_or(0.0),
            repeat_penalty: match in_range("repeat_penalty", self.repeat_penalty, 0.0, 10.0)? {
                Some(p) if p <= 0.0 => {
                    return Err(ApiError::invalid("repeat_penalty", "'repeat_penalty' must be above 0 (1 disables it)"))
                }
                other => other.unwrap_or(defaults.repeat_penalty),
            },
            repeat_last_n,
            logit_bias: convert_logit_bias(self.logit_bias, model.n_vocab)?,
        };
        let mut stop = match self.stop {
            None => Vec::new(),
            Some(Stop::One(s)) => vec![s],
            Some(Stop::Many(list)) => list,
        };
        check_stops(&stop)?;
        let calls_allowed = !tools.is_empty() && choice != ToolChoice::None;
        if !tools.is_empty() && !calls_allowed {
            // The tools stay in the prompt (so it stays cached), but a call must not start.
            stop.extend(model.tool_format.openers().into_iter().map(String::from));
        }
        let include_usage = self.stream_options.and_then(|o| o.include_usage).unwrap_or(false);
        Ok(ChatJob {
            request: GenerationRequest {
                prompt: Prompt::Chat { messages, tools: definitions },
                max_tokens,
                stop,
                sampling,
                grammar,
                preserved_tokens: if tools.is_empty() {
                    Vec::new()
                } else {
                    model.tool_format.markers().into_iter().map(String::from).collect()
                },
            },
            stream: self.stream.unwrap_or(false),
            include_usage,
            model: self.model.filter(|m| !m.is_empty()).unwrap_or_else(|| model.id.clone()),
            output: OutputPlan { format: model.tool_format, tools: calls_allowed.then_some(tools), schema },
        })
    }
}

/// Longest a request may take to become an engine job (the schema limits keep real ones far
/// below it); past it the request is refused, though its conversion runs to its end.
const PREPARE_TIMEOUT: Duration = Duration::from_secs(5);

/// Validates `body` and builds its job on a thread of its own with a large stack, off the
/// async runtime: llama.cpp's schema converter and the schema validator recurse, and a
/// conversion takes CPU time that must not stall other connections. At most `permits`
/// conversions run at once (one that timed out keeps its permit until it ends).
pub(crate) async fn prepare_job(
    permits: &Arc<Semaphore>,
    body: ChatCompletionRequest,
    model: ModelInfo,
) -> Result<ChatJob, ApiError> {
    let busy = || ApiError::Busy("prepared");
    let permit = tokio::time::timeout(PREPARE_TIMEOUT, Arc::clone(permits).acquire_owned())
        .await
        .map_err(|_| busy())?
        .map_err(|_| busy())?;
    let (answer, result) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("firstword-prepare".into())
        .stack_size(LARGE_STACK_BYTES)
        .spawn(move || {
            let _ = answer.send(body.into_job(&model));
            drop(permit);
        })
        .map_err(|e| ApiError::Internal(format!("cannot start a thread: {e}")))?;
    match tokio::time::timeout(PREPARE_TIMEOUT, result).await {
        Ok(Ok(job)) => job,
        Ok(Err(_)) => Err(ApiError::Internal("preparing the request failed unexpectedly".into())),
        Err(_) => Err(ApiError::PrepareTimeout(PREPARE_TIMEOUT)),
    }
}

/// `tools`: each `{"type": "function", "function": {"name", "description"?, "parameters"?}}`.
/// A start-up prompt (`--warm FILE`) from a file's text: a chat-completions body (`messages`
/// and `tools`; the rest is ignored) when it is a JSON object, else a system prompt, followed by
/// an empty user message so the part every conversation shares (the system turn and the next
/// turn's opening) is what gets cached.
///
/// # Errors
/// A JSON object that is no valid chat-completions body, with the same message the endpoint
/// would give.
pub fn warm_prompt(text: &str) -> Result<Prompt, ApiError> {
    if !text.trim_start().starts_with('{') {
        let messages = vec![ChatMessage::system(text.trim_end()), ChatMessage::user("")];
        return Ok(Prompt::Chat { messages, tools: Vec::new() });
    }
    let body: ChatCompletionRequest = parse_json(text.as_bytes())?;
    let messages = convert_messages(body.messages)?;
    let tools = convert_tools(body.tools.unwrap_or_default())?;
    Ok(Prompt::Chat { messages, tools })
}

fn convert_tools(tools: Vec<Value>) -> Result<Vec<ToolDefinition>, ApiError> {
    if tools.len() > MAX_TOOLS {
        return Err(too_many("tools", "tools", tools.len(), MAX_TOOLS));
    }
    tools
        .into_iter()
        .enumerate()
        .map(|(i, tool)| {
            let param = |field: &str| format!("tools[{i}]{field}");
            match tool.get("type").and_then(Value::as_str) {
                Some("function") => {}
                Some(other) => {
                    return Err(ApiError::invalid(
                        param(".type"),
                        format!("tool type '{other}' is not supported; only 'function' tools are"),
                    ))
                }
                None => return Err(ApiError::invalid(param(".type"), "a tool needs \"type\": \"function\"")),
            }
            let function = tool
                .get("function")
                .and_then(Value::as_object)
                .ok_or_else(|| ApiError::invalid(param(".function"), "a function tool needs a 'function' object"))?;
            let name = function
                .get("name")
                .and_then(Value::as_str)
                .ok_or_else(|| ApiError::invalid(param(".function.name"), "a function needs a 'name' string"))?;
            let description = match function.get("description") {
                None | Some(Value::Null) => None,
                Some(Value::String(text)) => Some(text.clone()),
                Some(_) => return Err(ApiError::invalid(param(".function.description"), "must be a string")),
            };
            // No parameters: a function without arguments.
            let parameters = match function.get("parameters") {
                None | Some(Value::Null) => serde_json::json!({"type": "object", "properties": {}}),
                Some(schema) => {
                    check_schema(&param(".function.parameters"), schema)?;
                    schema.clone()
                }
            };
            Ok(ToolDefinition { name: name.to_string(), description, parameters })
        })
        .collect()
}

/// `tool_choice`: `"auto"`, `"none"`, `"required"` or `{"type": "function", "function": {"name"}}`.
fn convert_tool_choice(choice: Option<Value>) -> Result<ToolChoice, ApiError> {
    let invalid = || {
        ApiError::refused(
            Refusal::ToolChoice,
            "tool_choice",
            "tool_choice must be \"auto\", \"none\", \"required\" or {\"type\": \"function\", \"function\": {\"name\": ...}}",
        )
    };
    Ok(match choice {
        None | Some(Value::Null) => ToolChoice::Auto,
        Some(Value::String(choice)) => match choice.as_str() {
            "auto" => ToolChoice::Auto,
            "none" => ToolChoice::None,
            "required" => ToolChoice::Required,
            _ => return Err(invalid()),
        },
        Some(object) => {
            let name = object.get("function").and_then(|f| f.get("name")).and_then(Value::as_str);
            match (object.get("type").and_then(Value::as_str), name) {
                (Some("function"), Some(name)) => ToolChoice::Function(name.to_string()),
                _ => return Err(invalid()),
            }
        }
    })
}

/// `response_format`: `text`, `json_object` or `json_schema` (`{"json_schema": {"schema"}}`).
fn convert_response_format(format: Option<Value>) -> Result<Option<OutputSchema>, ApiError> {
    let Some(format) = format.filter(|f| !f.is_null()) else { return Ok(None) };
    match format.get("type").and_then(Value::as_str) {
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(OutputSchema::new(&serde_json::json!({"type": "object"}))?)),
        Some("json_schema") => {
            let schema = format.get("json_schema").and_then(|s| s.get("schema")).ok_or_else(|| {
                ApiError::invalid("response_format.json_schema.schema", "json_schema mode needs 'json_schema.schema'")
            })?;
            check_schema("response_format.json_schema.schema", schema)?;
            OutputSchema::new(schema).map(Some).map_err(|e| {
                ApiError::refused(Refusal::ResponseFormat, "response_format.json_schema.schema", e.to_string())
            })
        }
        _ => Err(ApiError::invalid(
            "response_format.type",
            "response_format.type must be \"text\", \"json_object\" or \"json_schema\"",
        )),
    }
}

fn convert_logit_bias(
    bias: Option<std::collections::BTreeMap<String, f64>>,
    n_vocab: i32,
) -> Result<Vec<(i32, f32)>, ApiError> {
    let bias = bias.unwrap_or_default();
    if bias.len() > MAX_LOGIT_BIAS {
        return Err(too_many("logit_bias", "logit_bias entries", bias.len(), MAX_LOGIT_BIAS));
    }
    let mut out = Vec::new();
    for (key, value) in bias {
        let token = key.parse::<i32>().ok().filter(|t| (0..n_vocab).contains(t)).ok_or_else(|| {
            ApiError::invalid("logit_bias", format!("'{key}' is not a token id of this model (0..{n_vocab})"))
        })?;
        if !(-100.0..=100.0).contains(&value) {
            return Err(ApiError::invalid(
                "logit_bias",
                format!("bias for token {key} must be between -100 and 100, got {value}"),
            ));
        }
        out.push((token, value as f32));
    }
    Ok(out)
}

fn convert_messages(messages: Vec<WireMessage>) -> Result<Vec<ChatMessage>, ApiError> {
    if messages.is_empty() {
        return Err(ApiError::invalid("messages", "'messages' must contain at least one message"));
    }
    messages.into_iter().enumerate().map(|(i, m)| convert_message(i, m)).collect()
}

fn convert_message(index: usize, message: WireMessage) -> Result<ChatMessage, ApiError> {
    let param = |field: &str| format!("messages[{index}].{field}");
    let role = match message.role.as_str() {
        "system" | "developer" => Role::System,
        "user" => Role::User,
        "assistant" => Role::Assistant,
        "tool" => Role::Tool,
        other => {
            return Err(ApiError::invalid(
                param("role"),
                format!("unknown role '{other}'; expected system, developer, user, assistant or tool"),
            ))
        }
    };
    let content = match message.content {
        None => String::new(),
        Some(Content::Text(text)) => text,
        Some(Content::Parts(parts)) => {
            let mut texts = Vec::with_capacity(parts.len());
            for (j, part) in parts.into_iter().enumerate() {
                match (part.kind.as_str(), part.text) {
                    ("text", Some(text)) => texts.push(text),
                    ("text", None) => {
                        return Err(ApiError::invalid(param(&format!("content[{j}].text")), "text part without 'text'"))
                    }
                    (kind, _) => {
                        let what = match kind {
                            "image_url" | "image" => "image",
                            "input_audio" | "audio" => "audio",
                            "file" => "file",
                            _ => kind,
                        };
                        return Err(ApiError::refused(
                            Refusal::UnsupportedContent,
                            param(&format!("content[{j}].type")),
                            format!("this server has no backend for {what} input; only text content is supported"),
                        ));
                    }
                }
            }
            texts.join("\n")
        }
    };
    let tool_calls = message
        .tool_calls
        .unwrap_or_default()
        .into_iter()
        .enumerate()
        .map(|(j, call)| ToolCall {
            id: call.id.unwrap_or_else(|| format!("call_{index}_{j}")),
            name: call.function.name,
            arguments: match call.function.arguments {
                None | Some(Value::Null) => "{}".to_string(),
                Some(Value::String(text)) => text,
                Some(object) => object.to_string(),
            },
        })
        .collect();
    if role == Role::Tool && message.tool_call_id.as_deref().is_none_or(str::is_empty) {
        return Err(ApiError::invalid(param("tool_call_id"), "a tool message needs the 'tool_call_id' it answers"));
    }
    Ok(ChatMessage { role, content, name: message.name, tool_calls, tool_call_id: message.tool_call_id })
}

#[cfg(feature = "fuzzing")]
impl crate::fuzzing::Api {
    /// Parses and validates a chat-completions body as `POST /v1/chat/completions` does (on the
    /// calling thread, without the conversion permits and timeout) for the model `model`
    /// describes: the engine request, or the error the client would get.
    ///
    /// # Errors
    /// The [`ApiError`] the endpoint answers with.
    pub fn validate_request(body: &[u8], model: &ModelInfo) -> Result<GenerationRequest, ApiError> {
        parse_json::<ChatCompletionRequest>(body)?.into_job(model).map(|job| job.request)
    }
}

#[cfg(test)]
mod tests;
