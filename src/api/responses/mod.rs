//! OpenAI's Responses API: `POST /v1/responses` (streamed or not), `GET /v1/responses/{id}` and
//! `DELETE /v1/responses/{id}`, on the same engine, prefix cache and error envelope as chat.
//!
//! A response is a chat turn: `instructions` become the system message, the input items the
//! conversation ([`input`]), and with `previous_response_id` the stored conversation comes
//! first ([`store`]), so a client sends only its new input and the prompt still continues the
//! cache. The answer is shaped as chat's is (calls, JSON, reasoning) and framed as Responses
//! events ([`stream`]).

mod input;
mod store;
mod stream;
mod wire;

use std::sync::Arc;

use axum::extract::{Path, Request, State};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};

pub(crate) use store::ResponseStore;

use super::admission::{prepare_job, Prepared};
use super::answer::AnswerShaper;
use super::chat::{random_id, run_to_end, start, stream_response};
use super::convert::{
    convert_output_format, convert_tool_choice, convert_tools, reasoning_budget, template_kwargs, top_logprobs,
    Constraints, FunctionShape, MediaParts, OutputPlan,
};
use super::error::{ApiError, Refusal};
use super::extract::parse_json;
use super::limits::{check_metadata, too_many, MAX_MESSAGES, MAX_RESPONSE_CHAIN};
use super::logprobs::short_number;
use super::request_log::RequestRecord;
use super::sampling::{token_limit, SamplingFields};
use super::{unix_now, AppState};
use crate::chat::{ChatMessage, Role, ToolCall};
use crate::engine::media::{MediaInput, MAX_MEDIA_PARTS};
use crate::engine::{FinishReason, GenerationRequest, ModelInfo, Prompt, Usage};
use input::input_messages;
use store::{json_bytes, StoredResponse};
use stream::ResponseFramer;
use wire::{
    CreateResponse, Deleted, Echo, IncompleteDetails, InputTokensDetails, OutputItem, OutputTokensDetails,
    ResponseError, ResponseObject, ResponseUsage,
};

/// What `include` names to get the output text's log-probabilities.
const INCLUDE_LOGPROBS: &str = "message.output_text.logprobs";

/// A validated response request.
struct ResponseJob {
    request: GenerationRequest,
    output: OutputPlan,
    stream: bool,
    answering: Answering,
}

/// What answering a response needs beside the engine's events: its identity, what it echoes,
/// and where it is stored when done.
struct Answering {
    id: String,
    created_at: u64,
    echo: Echo,
    /// This turn's input, stored with its output.
    input: Vec<ChatMessage>,
    /// The media its input holds, stored with it.
    input_media: Vec<MediaInput>,
    /// The stored response this one continues.
    parent: Option<Arc<StoredResponse>>,
    /// Where the response goes when done (`None`: not stored).
    store: Option<Arc<ResponseStore>>,
}

impl Answering {
    fn object(&self, status: &'static str, output: Vec<OutputItem>) -> ResponseObject {
        ResponseObject {
            id: self.id.clone(),
            object: "response",
            created_at: self.created_at,
            status,
            error: None,
            incomplete_details: None,
            output,
            usage: None,
            background: false,
            echo: self.echo.clone(),
        }
    }

    /// The response while it is generated.
    fn in_progress(&self) -> ResponseObject {
        self.object("in_progress", Vec::new())
    }

    /// The finished response, stored when asked.
    fn finish(self, output: Vec<OutputItem>, reason: FinishReason, usage: Usage) -> ResponseObject {
        let status = if reason == FinishReason::Length { "incomplete" } else { "completed" };
        let mut response = self.object(status, output);
        if reason == FinishReason::Length {
            response.incomplete_details = Some(IncompleteDetails { reason: "max_output_tokens" });
        }
        response.usage = Some(ResponseUsage {
            input_tokens: usage.prompt_tokens,
            input_tokens_details: InputTokensDetails {
                cached_tokens: usage.cached_tokens,
                cache_write_tokens: usage.prompt_tokens - usage.cached_tokens,
            },
            output_tokens: usage.completion_tokens,
            output_tokens_details: OutputTokensDetails { reasoning_tokens: usage.reasoning_tokens },
            total_tokens: usage.prompt_tokens + usage.completion_tokens,
        });
        if let Some(store) = &self.store {
            let mut turn = self.input;
            turn.push(assistant_turn(&response.output));
            store.put(Arc::new(StoredResponse::new(self.parent, turn, self.input_media, response.clone())));
        }
        response
    }

    /// The response that failed with `error` after `output`.
    fn failed(self, output: Vec<OutputItem>, error: &ApiError) -> ResponseObject {
        let mut response = self.object("failed", output);
        let code = error.code().unwrap_or("server_error").to_string();
        response.error = Some(ResponseError { code, message: error.to_string() });
        response
    }
}

/// The output items as the assistant turn a later response continues.
fn assistant_turn(output: &[OutputItem]) -> ChatMessage {
    let mut message = ChatMessage::assistant("");
    let mut reasoning = Vec::new();
    for item in output {
        match item {
            OutputItem::Reasoning { content, .. } => reasoning.extend(content.iter().map(|c| c.text.as_str())),
            OutputItem::Message { content, .. } => message.content.extend(content.iter().map(|c| c.text.as_str())),
            OutputItem::FunctionCall { call_id, name, arguments, .. } => message.tool_calls.push(ToolCall {
                id: call_id.clone(),
                name: name.clone(),
                arguments: arguments.clone(),
            }),
        }
    }
    message.reasoning = (!reasoning.is_empty()).then(|| reasoning.join("\n"));
    message
}

impl ResponseJob {
    /// Parses and checks a body; the stored conversation of `previous_response_id` comes from
    /// `store`.
    fn new(bytes: &[u8], model: &ModelInfo, store: &Arc<ResponseStore>) -> Result<Self, ApiError> {
        let body: CreateResponse = parse_json(bytes)?;
        refuse_unsupported(&body)?;
        check_metadata(body.metadata.as_ref(), body.user.as_deref())?;
        let parent =
            match &body.previous_response_id {
                Some(id) => Some(store.get(id).ok_or_else(|| ApiError::ResponseNotFound {
                    id: id.clone(),
                    param: Some("previous_response_id"),
                })?),
                None => None,
            };
        if let Some(length) = parent.as_ref().map(|p| p.chain_length()).filter(|&n| n >= MAX_RESPONSE_CHAIN) {
            return Err(ApiError::refused(
                Refusal::Limit,
                "previous_response_id",
                format!(
                    "a chain of previous_response_id may hold at most {MAX_RESPONSE_CHAIN} responses; this one holds {length} already (start a new chain with the conversation as input)"
                ),
            ));
        }
        let mut parts = MediaParts::new(&model.media);
        let input =
            input_messages(body.input.ok_or_else(|| ApiError::invalid("input", "'input' is required"))?, &mut parts)?;
        // This turn's media are stored with it; the request holds the whole chain's.
        let input_media = parts.into_inputs();
        let mut media = parent.as_ref().map(|p| p.media()).unwrap_or_default();
        let stored = media.len();
        media.extend(
            input_media.iter().filter(|m| !media.iter().any(|held| held.id == m.id)).cloned().collect::<Vec<_>>(),
        );
        if media.len() > MAX_MEDIA_PARTS {
            return Err(ApiError::refused(
                Refusal::Limit,
                "input",
                format!(
                    "a conversation may hold at most {MAX_MEDIA_PARTS} images and audio clips, the stored chain \
                     and this input together; this one would hold {} ({stored} stored, {} new): start a new chain \
                     with the conversation as input, leaving out pictures or clips it no longer needs",
                    media.len(),
                    media.len() - stored
                ),
            ));
        }
        let earlier = body.instructions.iter().count() + parent.as_ref().map_or(0, |p| p.message_count());
        if earlier + input.len() > MAX_MESSAGES {
            return Err(too_many(
                "input",
                "messages (instructions, the stored conversation and the input together)",
                earlier + input.len(),
                MAX_MESSAGES,
            ));
        }
        let mut messages = Vec::new();
        messages.extend(body.instructions.iter().map(|text| ChatMessage::new(Role::System, text.clone())));
        messages.extend(parent.iter().flat_map(|p| p.conversation()));
        messages.extend(input.iter().cloned());

        let given_tools = body.tools.unwrap_or_default();
        let definitions = convert_tools(given_tools.clone(), FunctionShape::Flat)?;
        let choice = convert_tool_choice(body.tool_choice.clone(), FunctionShape::Flat)?;
        let format = body.text.and_then(|t| t.format);
        let schema = convert_output_format(format.clone(), "text.format", FunctionShape::Flat)?;
        let parallel = body.parallel_tool_calls.unwrap_or(true);
        let constraints = Constraints::new(model, &definitions, &choice, parallel, schema)?;
        let sampling = SamplingFields { temperature: body.temperature, top_p: body.top_p, ..SamplingFields::default() }
            .sampling(model)?;
        let max_output_tokens = token_limit("max_output_tokens", body.max_output_tokens)?;
        let include = body.include.unwrap_or_default();
        let top = top_logprobs(body.top_logprobs)?;
        let logprobs =
            (include.iter().any(|i| i == INCLUDE_LOGPROBS) || top.is_some_and(|n| n > 0)).then(|| top.unwrap_or(0));
        let effort = body.reasoning.and_then(|r| r.effort);
        let kwargs = template_kwargs(None, effort.clone(), "reasoning.effort")?;
        let store_it = body.store.unwrap_or(true) && store.enabled();
        let mut echo = Echo {
            instructions: body.instructions,
            max_output_tokens,
            model: body.model.filter(|m| !m.is_empty()).unwrap_or_else(|| model.id.clone()),
            parallel_tool_calls: parallel,
            previous_response_id: body.previous_response_id,
            reasoning: json!({"effort": effort, "summary": null}),
            store: store_it,
            temperature: short_number(sampling.temperature),
            text: json!({"format": format.unwrap_or_else(|| json!({"type": "text"}))}),
            tool_choice: body.tool_choice.unwrap_or_else(|| json!("auto")),
            tools: given_tools,
            top_p: short_number(sampling.top_p),
            truncation: "disabled",
            metadata: body.metadata.unwrap_or_else(|| json!({})),
            user: body.user,
            json_bytes: 0,
        };
        echo.json_bytes = json_bytes(&echo);
        Ok(Self {
            request: GenerationRequest {
                prompt: Prompt::Chat { messages, tools: definitions, template_kwargs: kwargs },
                max_tokens: max_output_tokens,
                max_tokens_is_ceiling: false,
                stop: constraints.stop,
                sampling,
                grammar: constraints.grammar,
                preserved_tokens: constraints.preserved_tokens,
                logprobs,
                reasoning_budget: reasoning_budget("reasoning_budget", body.reasoning_budget)?,
                pregenerate: None,
                reuse_after_change: None,
                media,
            },
            output: constraints.output,
            stream: body.stream.unwrap_or(false),
            answering: Answering {
                id: format!("resp_{}", random_id()),
                created_at: unix_now(),
                echo,
                input,
                input_media,
                parent,
                store: store_it.then(|| Arc::clone(store)),
            },
        })
    }
}

/// Refuses, by name, what this server cannot do instead of ignoring it.
fn refuse_unsupported(body: &CreateResponse) -> Result<(), ApiError> {
    let set = |value: &Option<Value>| value.as_ref().is_some_and(|v| !v.is_null());
    let refusals = [
        (body.background == Some(true), "background", "background responses are not supported"),
        (set(&body.conversation), "conversation", "the Conversations API is not supported; use previous_response_id"),
        (set(&body.prompt), "prompt", "prompt templates are not supported"),
        (set(&body.max_tool_calls), "max_tool_calls", "'max_tool_calls' is not supported; parallel_tool_calls false allows one call"),
        (
            body.truncation.as_deref().is_some_and(|t| t != "disabled"),
            "truncation",
            "only truncation 'disabled' is supported per request; start firstword with --context-overflow drop-oldest to leave out the oldest turns",
        ),
    ];
    match refusals.into_iter().find(|(refused, _, _)| *refused) {
        Some((_, param, message)) => Err(ApiError::invalid(param, message)),
        None => Ok(()),
    }
}

/// `POST /v1/responses`.
pub(super) async fn create_response(
    State(state): State<Arc<AppState>>,
    request: Request,
) -> Result<Response, ApiError> {
    let record = RequestRecord::of(&request);
    let model = state.engine.model_info()?;
    let store = Arc::clone(&state.responses);
    let into_job = move |bytes: &[u8]| ResponseJob::new(bytes, &model, &store);
    let Prepared { value: (job, rendered), permit } =
        prepare_job(&state, request, into_job, |job: &ResponseJob| &job.request).await?;
    let (events, in_reasoning) = start(&state, job.request, rendered, permit).await?;
    let mut framer = ResponseFramer::new(job.answering, AnswerShaper::new(job.output, in_reasoning));
    if job.stream {
        return Ok(stream_response(events, framer, record).into_response());
    }
    // A whole response is the stream's final object.
    run_to_end(events, &mut framer, &record).await;
    Ok(Json(framer.into_outcome()?).into_response())
}

/// `GET /v1/responses/{id}`.
pub(super) async fn get_response(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
) -> Result<Json<ResponseObject>, ApiError> {
    let stored = state.responses.get(&id).ok_or(ApiError::ResponseNotFound { id, param: None })?;
    Ok(Json(stored.object.clone()))
}

/// `DELETE /v1/responses/{id}`.
pub(super) async fn delete_response(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
) -> Result<Json<Deleted>, ApiError> {
    if !state.responses.remove(&id) {
        return Err(ApiError::ResponseNotFound { id, param: None });
    }
    Ok(Json(Deleted { id, object: "response", deleted: true }))
}

#[cfg(feature = "fuzzing")]
impl crate::fuzzing::Api {
    /// Parses and validates a `POST /v1/responses` body as the endpoint does (with an empty
    /// store: a `previous_response_id` is unknown): the engine request, or the error the client
    /// would get.
    ///
    /// # Errors
    /// The [`ApiError`] the endpoint answers with.
    pub fn validate_response(body: &[u8], model: &ModelInfo) -> Result<GenerationRequest, ApiError> {
        ResponseJob::new(body, model, &Arc::new(ResponseStore::bounded(0, 0))).map(|job| job.request)
    }
}

#[cfg(test)]
mod tests;
