//! Validating an OpenAI request and turning it into an engine request.
//!
//! Ranges follow OpenAI's API; anything this server cannot honour is refused with a 400 naming
//! the field, never silently ignored.

use serde_json::Value;

use super::error::{ApiError, Refusal};
use super::extract::parse_json;
use super::limits::{check_schema, too_many, BoundedList, MAX_MESSAGES, MAX_TOOLS};
use super::sampling::{token_limit, SamplingFields};
use super::wire::{ChatCompletionRequest, Content, WireMessage};
use crate::chat::tools::{request_grammar, OutputSchema, ToolChoice, ToolDefinition, ToolFormat, ToolSet};
use crate::chat::{ChatMessage, Grammar, ReasoningFormat, Role, TemplateKwargs, ToolCall};
use crate::engine::{GenerationRequest, ModelInfo, Prompt, MAX_PREGENERATE, MAX_TOP_LOGPROBS};

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
    /// The markers of a thinking model's reasoning, which the answer leaves out.
    pub reasoning: Option<ReasoningFormat>,
}

/// A chat-completions body: the chat's own fields and those it shares with text completions,
/// read from the same bytes.
#[derive(Debug)]
pub(crate) struct ChatBody {
    chat: ChatCompletionRequest,
    shared: SamplingFields,
}

/// The `reasoning_effort` values OpenAI defines.
const REASONING_EFFORTS: &[&str] = &["none", "minimal", "low", "medium", "high", "xhigh"];

/// Template variables the conversation itself sets; a request cannot replace them.
const RESERVED_TEMPLATE_VARIABLES: &[&str] = &["messages", "tools", "add_generation_prompt", "bos_token", "eos_token"];

impl ChatBody {
    /// Parses a body.
    ///
    /// # Errors
    /// A 400 naming the field at fault.
    pub(crate) fn parse(bytes: &[u8]) -> Result<Self, ApiError> {
        Ok(Self { chat: parse_json(bytes)?, shared: parse_json(bytes)? })
    }

    /// Validates the request against the model and builds the engine request.
    pub(crate) fn into_job(self, model: &ModelInfo) -> Result<ChatJob, ApiError> {
        let Self { chat, mut shared } = self;
        let sampling = shared.sampling(model)?;
        let logprobs = chat_logprobs(chat.logprobs, chat.top_logprobs)?;
        let mut media = MediaParts::new(&model.media);
        let messages = convert_messages(chat.messages, &mut media)?;
        let definitions = convert_tools(chat.tools.unwrap_or_default(), FunctionShape::Nested)?;
        let choice = convert_tool_choice(chat.tool_choice, FunctionShape::Nested)?;
        let schema = convert_output_format(chat.response_format, "response_format", FunctionShape::Nested)?;
        let parallel = chat.parallel_tool_calls.unwrap_or(true);
        let constraints = Constraints::new(model, &definitions, &choice, parallel, schema)?;
        let max_tokens = match chat.max_completion_tokens {
            Some(_) => token_limit("max_completion_tokens", chat.max_completion_tokens)?,
            None => token_limit("max_tokens", shared.max_tokens)?,
        };
        let mut stop = shared.stops()?;
        stop.extend(constraints.stop);
        let template_kwargs = template_kwargs(chat.chat_template_kwargs, chat.reasoning_effort, "reasoning_effort")?;
        Ok(ChatJob {
            request: GenerationRequest {
                prompt: Prompt::Chat { messages, tools: definitions, template_kwargs },
                max_tokens,
                max_tokens_is_ceiling: false,
                stop,
                sampling,
                grammar: constraints.grammar,
                preserved_tokens: constraints.preserved_tokens,
                logprobs,
                reasoning_budget: reasoning_budget("reasoning_budget", chat.reasoning_budget)?,
                pregenerate: pregenerate(chat.pregenerate)?,
                reuse_after_change: shared.reuse_after_change,
                media: media.into_inputs(),
            },
            stream: shared.stream.unwrap_or(false),
            include_usage: shared.include_usage(),
            model: shared.model_name(model),
            output: constraints.output,
        })
    }
}

/// What a request's tools, tool choice and output schema make of its generation.
#[derive(Debug)]
pub(crate) struct Constraints {
    /// The grammar of calls and JSON output.
    pub grammar: Option<Grammar>,
    /// Stop strings that keep a call from starting where calls are not allowed.
    pub stop: Vec<String>,
    /// The call format's markers, shown as text.
    pub preserved_tokens: Vec<String>,
    /// How the generated text becomes the answer.
    pub output: OutputPlan,
}

impl Constraints {
    /// The constraints of `definitions` (checked) under `choice`, with `parallel` calls or
    /// not, and a JSON reply's `schema`.
    ///
    /// # Errors
    /// Tools that cannot be used, or a choice naming no given tool.
    pub(crate) fn new(
        model: &ModelInfo,
        definitions: &[ToolDefinition],
        choice: &ToolChoice,
        parallel: bool,
        schema: Option<OutputSchema>,
    ) -> Result<Self, ApiError> {
        let tools = ToolSet::new(definitions.to_vec())?;
        tools.check_choice(choice)?;
        let grammar = request_grammar(&model.tool_format, &tools, choice, parallel, schema.as_ref());
        let calls_allowed = !tools.is_empty() && *choice != ToolChoice::None;
        // Without calls allowed the tools stay in the prompt (so it stays cached), but a call
        // must not start.
        let stop = if tools.is_empty() || calls_allowed { Vec::new() } else { model.tool_format.openers() };
        let preserved_tokens = if tools.is_empty() { Vec::new() } else { model.tool_format.markers() };
        let output = OutputPlan {
            format: model.tool_format.clone(),
            tools: calls_allowed.then_some(tools),
            schema,
            reasoning: model.reasoning,
        };
        Ok(Self { grammar, stop, preserved_tokens, output })
    }
}

/// `logprobs` and `top_logprobs`: how many alternatives each token's entry lists, `None`
/// when log-probabilities are off.
fn chat_logprobs(logprobs: Option<bool>, top: Option<i64>) -> Result<Option<u32>, ApiError> {
    let top = top_logprobs(top)?;
    if let (Some(n), false) = (top, logprobs == Some(true)) {
        return Err(ApiError::invalid("top_logprobs", format!("'top_logprobs' ({n}) needs 'logprobs': true")));
    }
    Ok((logprobs == Some(true)).then_some(top.unwrap_or(0)))
}

/// `top_logprobs`, checked against OpenAI's range.
///
/// # Errors
/// A 400 outside 0..=20.
pub(crate) fn top_logprobs(top: Option<i64>) -> Result<Option<u32>, ApiError> {
    match top {
        Some(n) if !(0..=i64::from(MAX_TOP_LOGPROBS)).contains(&n) => Err(ApiError::invalid(
            "top_logprobs",
            format!("'top_logprobs' must be between 0 and {MAX_TOP_LOGPROBS}, got {n}"),
        )),
        top => Ok(top.map(|n| n as u32)),
    }
}

/// `reasoning_budget` (the field `param`): a count of tokens, or -1 for no limit (overriding
/// the server's).
pub(crate) fn reasoning_budget(param: &str, budget: Option<i64>) -> Result<Option<u32>, ApiError> {
    match budget {
        None => Ok(None),
        Some(-1) => Ok(Some(u32::MAX)),
        Some(n) if n < 0 => {
            Err(ApiError::invalid(param, format!("'{param}' must be a number of tokens, or -1 for no limit; got {n}")))
        }
        Some(n) => Ok(Some(u32::try_from(n).unwrap_or(u32::MAX))),
    }
}

/// A prefill's `pregenerate`: a number of tokens up to [`MAX_PREGENERATE`].
fn pregenerate(value: Option<i64>) -> Result<Option<u32>, ApiError> {
    match value {
        None => Ok(None),
        Some(n) if (0..=i64::from(MAX_PREGENERATE)).contains(&n) => Ok(Some(n as u32)),
        Some(n) => Err(ApiError::invalid(
            "pregenerate",
            format!("'pregenerate' must be a number of tokens from 0 to {MAX_PREGENERATE}; got {n}"),
        )),
    }
}

/// The chat template's extra variables: `kwargs` as given (none may replace the
/// conversation's own), and the reasoning `effort` (from the field `effort_param`) as
/// `reasoning_effort`; effort `none` also sets `enable_thinking` false, the switch of
/// Qwen3-style templates, unless the request sets it.
pub(crate) fn template_kwargs(
    kwargs: Option<TemplateKwargs>,
    effort: Option<String>,
    effort_param: &str,
) -> Result<TemplateKwargs, ApiError> {
    let mut kwargs = kwargs.unwrap_or_default();
    if let Some(reserved) = kwargs.keys().find(|key| RESERVED_TEMPLATE_VARIABLES.contains(&key.as_str())) {
        return Err(ApiError::invalid(
            format!("chat_template_kwargs.{reserved}"),
            format!("'{reserved}' is set by the conversation itself and cannot be given as a template variable"),
        ));
    }
    if let Some(effort) = effort {
        if !REASONING_EFFORTS.contains(&effort.as_str()) {
            return Err(ApiError::invalid(
                effort_param,
                format!("'{effort_param}' must be one of {}, got {effort:?}", REASONING_EFFORTS.join(", ")),
            ));
        }
        if effort == "none" {
            kwargs.entry("enable_thinking").or_insert(Value::Bool(false));
        }
        kwargs.entry("reasoning_effort").or_insert(Value::String(effort));
    }
    Ok(kwargs)
}

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
        return Ok(Prompt::Chat { messages, tools: Vec::new(), template_kwargs: TemplateKwargs::new() });
    }
    let body: ChatCompletionRequest = parse_json(text.as_bytes())?;
    let no_media = crate::engine::media::MediaSupport::default();
    let messages = convert_messages(body.messages, &mut MediaParts::new(&no_media))?;
    let tools = convert_tools(body.tools.unwrap_or_default(), FunctionShape::Nested)?;
    Ok(Prompt::Chat { messages, tools, template_kwargs: TemplateKwargs::new() })
}

/// Where an API puts a function's fields: chat completions nest them under `function`
/// (`{"type": "function", "function": {"name", …}}`), the Responses API writes them flat
/// (`{"type": "function", "name", …}`), in tools and in a named `tool_choice` alike.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FunctionShape {
    /// Chat completions.
    Nested,
    /// The Responses API.
    Flat,
}

impl FunctionShape {
    /// The object holding a function's fields in `tool`, and the path prefix of its fields.
    fn function<'v>(
        self,
        tool: &'v Value,
        param: &str,
    ) -> Result<(&'v serde_json::Map<String, Value>, String), ApiError> {
        match self {
            Self::Nested => tool
                .get("function")
                .and_then(Value::as_object)
                .map(|function| (function, format!("{param}.function")))
                .ok_or_else(|| {
                    ApiError::invalid(format!("{param}.function"), "a function tool needs a 'function' object")
                }),
            Self::Flat => tool
                .as_object()
                .map(|function| (function, param.to_string()))
                .ok_or_else(|| ApiError::invalid(param, "a tool must be an object")),
        }
    }
}

/// `tools`: function tools only, in the API's `shape`.
pub(crate) fn convert_tools(tools: Vec<Value>, shape: FunctionShape) -> Result<Vec<ToolDefinition>, ApiError> {
    if tools.len() > MAX_TOOLS {
        return Err(too_many("tools", "tools", tools.len(), MAX_TOOLS));
    }
    tools
        .iter()
        .enumerate()
        .map(|(i, tool)| {
            let param = format!("tools[{i}]");
            match tool.get("type").and_then(Value::as_str) {
                Some("function") => {}
                Some(other) => {
                    return Err(ApiError::invalid(
                        format!("{param}.type"),
                        format!("tool type '{other}' is not supported; only 'function' tools are"),
                    ))
                }
                None => return Err(ApiError::invalid(format!("{param}.type"), "a tool needs \"type\": \"function\"")),
            }
            let (function, param) = shape.function(tool, &param)?;
            let name = function
                .get("name")
                .and_then(Value::as_str)
                .ok_or_else(|| ApiError::invalid(format!("{param}.name"), "a function needs a 'name' string"))?;
            let description = match function.get("description") {
                None | Some(Value::Null) => None,
                Some(Value::String(text)) => Some(text.clone()),
                Some(_) => return Err(ApiError::invalid(format!("{param}.description"), "must be a string")),
            };
            // No parameters: a function without arguments.
            let parameters = match function.get("parameters") {
                None | Some(Value::Null) => serde_json::json!({"type": "object", "properties": {}}),
                Some(schema) => {
                    check_schema(&format!("{param}.parameters"), schema)?;
                    schema.clone()
                }
            };
            Ok(ToolDefinition { name: name.to_string(), description, parameters })
        })
        .collect()
}

/// `tool_choice`: `"auto"`, `"none"`, `"required"` or a named function in the API's `shape`.
pub(crate) fn convert_tool_choice(choice: Option<Value>, shape: FunctionShape) -> Result<ToolChoice, ApiError> {
    let invalid = || {
        let named = match shape {
            FunctionShape::Nested => "{\"type\": \"function\", \"function\": {\"name\": ...}}",
            FunctionShape::Flat => "{\"type\": \"function\", \"name\": ...}",
        };
        ApiError::refused(
            Refusal::ToolChoice,
            "tool_choice",
            format!("tool_choice must be \"auto\", \"none\", \"required\" or {named}"),
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
            let name = shape.function(&object, "tool_choice").ok().and_then(|(f, _)| f.get("name")?.as_str());
            match (object.get("type").and_then(Value::as_str), name) {
                (Some("function"), Some(name)) => ToolChoice::Function(name.to_string()),
                _ => return Err(invalid()),
            }
        }
    })
}

/// The schema of a JSON reply: `format` is chat's `response_format` (`{"type", "json_schema":
/// {"schema"}}`, shape [`FunctionShape::Nested`]) or the Responses API's `text.format`
/// (`{"type", "schema"}`, flat), found at `param`; `text`, `json_object` or `json_schema`.
pub(crate) fn convert_output_format(
    format: Option<Value>,
    param: &str,
    shape: FunctionShape,
) -> Result<Option<OutputSchema>, ApiError> {
    let Some(format) = format.filter(|f| !f.is_null()) else { return Ok(None) };
    match format.get("type").and_then(Value::as_str) {
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(OutputSchema::new(&serde_json::json!({"type": "object"}))?)),
        Some("json_schema") => {
            let (holder, schema_param) = match shape {
                FunctionShape::Nested => (format.get("json_schema"), format!("{param}.json_schema.schema")),
                FunctionShape::Flat => (Some(&format), format!("{param}.schema")),
            };
            let schema = holder
                .and_then(|h| h.get("schema"))
                .ok_or_else(|| ApiError::invalid(schema_param.as_str(), "json_schema mode needs a 'schema'"))?;
            check_schema(&schema_param, schema)?;
            OutputSchema::new(schema)
                .map(Some)
                .map_err(|e| ApiError::refused(Refusal::ResponseFormat, schema_param, e.to_string()))
        }
        _ => Err(ApiError::invalid(
            format!("{param}.type"),
            format!("{param}.type must be \"text\", \"json_object\" or \"json_schema\""),
        )),
    }
}

fn convert_messages(
    messages: BoundedList<WireMessage>,
    media: &mut MediaParts<'_>,
) -> Result<Vec<ChatMessage>, ApiError> {
    let messages = messages.within("messages", "messages", MAX_MESSAGES)?;
    if messages.is_empty() {
        return Err(ApiError::invalid("messages", "'messages' must contain at least one message"));
    }
    messages.into_iter().enumerate().map(|(i, m)| convert_message(i, m, media)).collect()
}

fn convert_message(index: usize, message: WireMessage, media: &mut MediaParts<'_>) -> Result<ChatMessage, ApiError> {
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
                        let part_param = param(&format!("content[{j}]"));
                        let fields = Value::Object(part.fields);
                        match media.marker(kind, &fields, &part_param)? {
                            Some(marker) => texts.push(marker),
                            None => {
                                return Err(ApiError::refused(
                                    Refusal::UnsupportedContent,
                                    format!("{part_param}.type"),
                                    format!("this server has no backend for {kind} input; it takes text, image_url and input_audio parts"),
                                ))
                            }
                        }
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
    Ok(ChatMessage {
        role,
        content,
        name: message.name,
        tool_calls,
        tool_call_id: message.tool_call_id,
        reasoning: message.reasoning_content.filter(|r| !r.is_empty()),
    })
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
        ChatBody::parse(body)?.into_job(model).map(|job| job.request)
    }
}

#[cfg(test)]
mod tests;

mod media;
pub(crate) use media::MediaParts;
