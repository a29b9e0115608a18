//! The Responses API's wire types: the request, its input items, and the response object with
//! its output items, as OpenAI's API reference and the official SDKs define them.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::api::logprobs::ChatTokenLogprob;

/// `POST /v1/responses` body. Fields this server cannot honour are refused by name when set.
#[derive(Debug, Deserialize)]
pub(crate) struct CreateResponse {
    pub model: Option<String>,
    pub input: Option<Input>,
    pub instructions: Option<String>,
    pub tools: Option<Vec<Value>>,
    pub tool_choice: Option<Value>,
    pub parallel_tool_calls: Option<bool>,
    pub max_output_tokens: Option<i64>,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub top_logprobs: Option<i64>,
    pub include: Option<Vec<String>>,
    pub text: Option<TextOptions>,
    pub reasoning: Option<ReasoningOptions>,
    pub stream: Option<bool>,
    pub store: Option<bool>,
    pub previous_response_id: Option<String>,
    pub metadata: Option<Value>,
    pub user: Option<String>,
    pub truncation: Option<String>,
    pub background: Option<bool>,
    pub conversation: Option<Value>,
    pub prompt: Option<Value>,
    pub max_tool_calls: Option<Value>,
    /// firstword's extension, as in chat completions.
    pub reasoning_budget: Option<i64>,
}

/// `input`: one user message as text, or a list of items.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub(crate) enum Input {
    Text(String),
    Items(Vec<Value>),
}

/// `text`: the output's format.
#[derive(Debug, Deserialize)]
pub(crate) struct TextOptions {
    pub format: Option<Value>,
}

/// `reasoning`: the effort a thinking model should spend (the summary is not produced).
#[derive(Debug, Deserialize)]
pub(crate) struct ReasoningOptions {
    pub effort: Option<String>,
}

/// What a response echoes of its request.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct Echo {
    pub instructions: Option<String>,
    pub max_output_tokens: Option<u32>,
    pub model: String,
    pub parallel_tool_calls: bool,
    pub previous_response_id: Option<String>,
    pub reasoning: Value,
    pub store: bool,
    pub temperature: Value,
    pub text: Value,
    pub tool_choice: Value,
    pub tools: Vec<Value>,
    pub top_p: Value,
    pub truncation: &'static str,
    pub metadata: Value,
    pub user: Option<String>,
    /// The length of this echo as JSON, counted once on the conversion thread (for the store).
    #[serde(skip)]
    pub json_bytes: usize,
}

/// The response object.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct ResponseObject {
    pub id: String,
    pub object: &'static str,
    pub created_at: u64,
    /// `in_progress`, `completed`, `incomplete` or `failed`.
    pub status: &'static str,
    pub error: Option<ResponseError>,
    pub incomplete_details: Option<IncompleteDetails>,
    pub output: Vec<OutputItem>,
    pub usage: Option<ResponseUsage>,
    pub background: bool,
    #[serde(flatten)]
    pub echo: Echo,
}

/// Why a response failed.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct ResponseError {
    pub code: String,
    pub message: String,
}

/// Why a response is incomplete.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct IncompleteDetails {
    pub reason: &'static str,
}

/// One output item.
#[derive(Clone, Debug, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub(crate) enum OutputItem {
    /// The model's reasoning.
    Reasoning { id: String, summary: Vec<Value>, content: Vec<ReasoningText>, status: &'static str },
    /// The assistant's text.
    Message { id: String, status: &'static str, role: &'static str, content: Vec<OutputText> },
    /// A function call.
    FunctionCall { id: String, call_id: String, name: String, arguments: String, status: &'static str },
}

/// A reasoning item's text.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct ReasoningText {
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub text: String,
}

impl ReasoningText {
    pub(crate) fn new(text: String) -> Self {
        Self { kind: "reasoning_text", text }
    }
}

/// A message item's text.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct OutputText {
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub text: String,
    pub annotations: Vec<Value>,
    pub logprobs: Vec<ChatTokenLogprob>,
}

impl OutputText {
    pub(crate) fn new(text: String, logprobs: Vec<ChatTokenLogprob>) -> Self {
        Self { kind: "output_text", text, annotations: Vec::new(), logprobs }
    }
}

/// `usage`.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct ResponseUsage {
    pub input_tokens: u32,
    pub input_tokens_details: InputTokensDetails,
    pub output_tokens: u32,
    pub output_tokens_details: OutputTokensDetails,
    pub total_tokens: u32,
}

/// `usage.input_tokens_details`.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct InputTokensDetails {
    /// Input tokens the cache held.
    pub cached_tokens: u32,
    /// Input tokens evaluated (and so written to the cache).
    pub cache_write_tokens: u32,
}

/// `usage.output_tokens_details`.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct OutputTokensDetails {
    pub reasoning_tokens: u32,
}

/// `DELETE /v1/responses/{id}` answer.
#[derive(Debug, Serialize)]
pub(crate) struct Deleted {
    pub id: String,
    pub object: &'static str,
    pub deleted: bool,
}
