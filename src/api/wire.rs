//! OpenAI chat-completions wire types. Lenient on input (many shapes accepted, unknown fields
//! ignored); the conversion into strict engine types lives in `convert`. The fields chat
//! shares with text completions are in `sampling`.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::limits::BoundedList;
use super::logprobs::ChatLogprobs;

/// `POST /v1/chat/completions` body: the chat's own fields (the shared ones are read from the
/// same body as [`super::sampling::SamplingFields`]).
#[derive(Debug, Deserialize)]
pub(super) struct ChatCompletionRequest {
    /// Read up to [`super::limits::MAX_MESSAGES`]; more are counted, not kept.
    #[serde(deserialize_with = "super::limits::bounded_messages")]
    pub messages: BoundedList<WireMessage>,
    pub max_completion_tokens: Option<i64>,
    pub logprobs: Option<bool>,
    pub top_logprobs: Option<i64>,
    pub tools: Option<Vec<Value>>,
    pub tool_choice: Option<Value>,
    pub parallel_tool_calls: Option<bool>,
    pub response_format: Option<Value>,
    /// Extra chat template variables (llama-server's name), e.g. `{"enable_thinking": false}`.
    pub chat_template_kwargs: Option<serde_json::Map<String, Value>>,
    /// OpenAI's reasoning effort, given to the template as `reasoning_effort`.
    pub reasoning_effort: Option<String>,
    /// Most tokens the model's reasoning may take.
    pub reasoning_budget: Option<i64>,
    /// `/v1/prefill`: reply tokens to generate after the prompt and park for the request that
    /// follows (0 to `MAX_PREGENERATE`); the server's `--pregenerate` when absent.
    pub pregenerate: Option<i64>,
}

/// One message as clients send it.
#[derive(Debug, Deserialize)]
pub(super) struct WireMessage {
    pub role: String,
    #[serde(default)]
    pub content: Option<Content>,
    pub name: Option<String>,
    pub tool_calls: Option<Vec<WireToolCall>>,
    pub tool_call_id: Option<String>,
    /// An earlier reply's reasoning, as this server (and llama-server, vLLM) sends it.
    pub reasoning_content: Option<String>,
}

/// `content`: a string or an array of typed parts.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub(super) enum Content {
    Text(String),
    Parts(Vec<ContentPart>),
}

/// One content part: `text`, or (with a projector) `image_url` or `input_audio`, whose
/// fields stay JSON until the part is read.
#[derive(Debug, Deserialize)]
pub(super) struct ContentPart {
    #[serde(rename = "type")]
    pub kind: String,
    pub text: Option<String>,
    #[serde(flatten)]
    pub fields: serde_json::Map<String, serde_json::Value>,
}

/// A tool call in an assistant message of the history.
#[derive(Debug, Deserialize)]
pub(super) struct WireToolCall {
    pub id: Option<String>,
    pub function: WireFunctionCall,
}

/// The function part of a tool call.
#[derive(Debug, Deserialize)]
pub(super) struct WireFunctionCall {
    pub name: String,
    /// JSON text per the spec; some clients send an object.
    pub arguments: Option<Value>,
}

/// `usage` in responses.
#[derive(Debug, Serialize)]
pub(super) struct WireUsage {
    pub prompt_tokens: u32,
    pub completion_tokens: u32,
    pub total_tokens: u32,
    pub prompt_tokens_details: PromptTokensDetails,
    pub completion_tokens_details: CompletionTokensDetails,
}

/// `usage.prompt_tokens_details`.
#[derive(Debug, Serialize)]
pub(super) struct PromptTokensDetails {
    pub cached_tokens: u32,
}

/// `usage.completion_tokens_details`.
#[derive(Debug, Serialize)]
pub(super) struct CompletionTokensDetails {
    /// Tokens the model spent inside its reasoning.
    pub reasoning_tokens: u32,
}

/// `timings.shared`: the sequence a reply was served in and the most other replies computed
/// in one of its steps.
#[derive(Debug, Serialize)]
pub(super) struct WireShared {
    pub sequence: u32,
    pub replies_beside: u32,
}

/// llama-server's `timings` object.
#[derive(Debug, Serialize)]
pub(super) struct WireTimings {
    pub cache_n: u32,
    pub prompt_n: u32,
    pub prompt_ms: f64,
    pub prompt_per_token_ms: f64,
    pub prompt_per_second: f64,
    pub predicted_n: u32,
    pub predicted_ms: f64,
    pub predicted_per_token_ms: f64,
    pub predicted_per_second: f64,
    /// Tokens drafted by speculative decoding (absent when it is off).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub draft_n: Option<u32>,
    /// Drafted tokens the model accepted.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub draft_n_accepted: Option<u32>,
    /// What the cache did for the prompt.
    pub cache: WireCache,
    /// Other requests' replies computed in the same steps (`--parallel`; absent when the
    /// reply ran alone).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shared: Option<WireShared>,
    /// Messages of the oldest turns left out to fit the context (`--context-overflow
    /// drop-oldest`; absent when none was).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dropped_messages: Option<u32>,
    /// The request's arrival to its prompt's evaluation: what it cost before llama.cpp was
    /// called (absent for requests not measured).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub request_ms: Option<f64>,
    /// `request_ms` stage by stage.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub request: Option<WireRequestPath>,
}

/// `timings.request`: the stages of `request_ms`, in milliseconds.
#[derive(Debug, Serialize)]
pub(super) struct WireRequestPath {
    /// Arrival to the body read.
    pub read_ms: f64,
    /// The body parsed and checked.
    pub parse_ms: f64,
    /// The chat template rendered.
    pub render_ms: f64,
    /// The prompt tokenized.
    pub tokenize_ms: f64,
    /// Prompt tokens kept from an earlier prompt's tokenization.
    pub tokens_kept: u32,
    /// Queued to taken by the inference thread.
    pub queue_ms: f64,
    /// Tokens compared with the cache and the reuse planned.
    pub match_ms: f64,
}

/// `timings.cache`: where the reused prompt tokens came from, and why not more.
#[derive(Debug, Serialize)]
pub(super) struct WireCache {
    /// `live`, `ram`, `checkpoint` or `none`.
    pub source: &'static str,
    pub reused: u32,
    pub prefilled: u32,
    /// Token index where the prompt left what the source held; null where it continued it.
    pub diverged_at: Option<u32>,
    /// Why the cache did not serve more (null: it served all it shared with the prompt).
    pub reason: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub save_ms: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub restore_ms: Option<f64>,
    /// Reply tokens a prefill generated ahead that this request adopted (absent: none).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub adopted: Option<u32>,
    /// Where the prompt cut the reply the cache held (barge-in; absent: it did not).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reply_cut: Option<WireReplyCut>,
    /// The changed spans the cache was reused past (`reason` `reused-after-change`; absent:
    /// it was not).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub changes: Option<WireChanges>,
}

/// `timings.cache.changes`: the spans evaluated anew and the cached tokens kept after them.
#[derive(Debug, Serialize)]
pub(super) struct WireChanges {
    /// Each span: `at` (prompt position), `old_len` (tokens in the cache), `new_len` (in the
    /// prompt).
    pub spans: Vec<WireChangedSpan>,
    /// Cached tokens kept after the spans, computed attending to the old spans.
    pub kept: u32,
    /// Prompt tokens evaluated for the spans and the neighbourhoods after them.
    pub evaluated: u32,
}

/// One span of [`WireChanges`].
#[derive(Debug, Serialize)]
pub(super) struct WireChangedSpan {
    pub at: u32,
    pub old_len: u32,
    pub new_len: u32,
}

/// `timings.cache.reply_cut`: the reply tokens the prompt kept of those the cache held.
#[derive(Debug, Serialize)]
pub(super) struct WireReplyCut {
    pub kept: u32,
    pub held: u32,
}

/// `POST /v1/prefill`'s answer.
#[derive(Debug, Serialize)]
pub(super) struct PrefillAnswer {
    /// `prefill`.
    pub object: &'static str,
    pub model: String,
    pub prompt_tokens: u32,
    /// Of these, how many the cache held before.
    pub cached_tokens: u32,
    /// How many this call evaluated.
    pub prefilled_tokens: u32,
    /// The whole prompt is cached now (false: it yielded to a chat request first).
    pub complete: bool,
    /// A newer prefill arrived before this one ran, so it did nothing.
    pub superseded: bool,
    /// Reply tokens generated after the prompt and parked for the request that follows.
    pub pregenerated_tokens: u32,
    pub timings: PrefillTimings,
}

/// `POST /v1/prefill`'s `timings`.
#[derive(Debug, Serialize)]
pub(super) struct PrefillTimings {
    pub prompt_ms: f64,
    /// As in a completion's timings.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub request_ms: Option<f64>,
    /// As in a completion's timings.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub request: Option<WireRequestPath>,
    /// What the cache did (absent when superseded).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cache: Option<WireCache>,
}

/// `GET /cache`: the live sequence and the RAM store.
#[derive(Debug, Serialize)]
pub(super) struct CacheView {
    pub live_tokens: u32,
    /// The store's budget (0: off).
    pub budget_bytes: u64,
    pub used_bytes: u64,
    /// Tokens between checkpoints of a long prefill, for models that take checkpoints.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub checkpoint_every: Option<u32>,
    /// Most recently used first.
    pub entries: Vec<CacheEntryView>,
    /// The disk cache; `null` when off.
    pub disk: Option<DiskCacheView>,
    /// The media kept decoded and tokenized, in their share of `--cache-ram`; absent without a
    /// projector.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub media: Option<MediaCacheView>,
    /// Conversations kept in their cells (`--parallel`), most recently used first.
    pub kept: Vec<KeptView>,
    /// Where the live sequence's cells kept past a changed span begin (absent: it holds none).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub live_approximate_from: Option<u32>,
}

/// A kept conversation in `GET /cache`.
#[derive(Debug, Serialize)]
pub(super) struct KeptView {
    /// Its sequence.
    pub sequence: i32,
    /// Tokens it holds.
    pub tokens: u32,
    /// Of these, those whose cells the live sequence shares.
    pub shared: u32,
}

/// The kept media in `GET /cache`.
#[derive(Debug, Serialize)]
pub(super) struct MediaCacheView {
    /// Media kept.
    pub entries: u32,
    /// Their share of `--cache-ram`.
    pub budget_bytes: u64,
    /// Bytes they hold (an upper estimate of libmtmd's preprocessed input).
    pub used_bytes: u64,
}

/// The disk cache in `GET /cache`.
#[derive(Debug, Serialize)]
pub(super) struct DiskCacheView {
    /// This model's directory.
    pub dir: String,
    /// For the whole cache directory.
    pub budget_bytes: u64,
    /// Every model's files.
    pub used_bytes: u64,
    /// Bytes written since the server started (bases and delta segments, headers included).
    pub bytes_written: u64,
    /// Memory held for the signatures the next turns' deltas are computed from.
    pub signature_bytes: u64,
    /// This model's entries, most recently used first.
    pub entries: Vec<CacheEntryView>,
    /// Why the disk cache is off for the rest of the process (its writer thread stopped);
    /// `null` while it works.
    pub off: Option<String>,
    /// Why this instance reads the directory only (another instance with the same settings
    /// writes it); `null` while it writes.
    pub read_only: Option<String>,
}

/// One stored entry of `GET /cache`.
#[derive(Debug, Serialize)]
pub(super) struct CacheEntryView {
    /// `snapshot` or `checkpoint`.
    pub kind: &'static str,
    pub tokens: u32,
    pub bytes: u64,
    /// Unix time (seconds) it was saved or last restored.
    pub last_used: f64,
}

/// Non-streaming response.
#[derive(Debug, Serialize)]
pub(super) struct ChatCompletion<'a> {
    pub id: &'a str,
    pub object: &'static str,
    pub created: u64,
    pub model: &'a str,
    pub system_fingerprint: &'static str,
    pub choices: [Choice; 1],
    pub usage: WireUsage,
    pub timings: WireTimings,
}

/// The one choice of a non-streaming response.
#[derive(Debug, Serialize)]
pub(super) struct Choice {
    pub index: u32,
    pub message: ResponseMessage,
    pub finish_reason: &'static str,
    pub logprobs: Option<ChatLogprobs>,
}

/// The assistant's message. `content` is null when the reply is only tool calls.
#[derive(Debug, Serialize)]
pub(super) struct ResponseMessage {
    pub role: &'static str,
    pub content: Option<String>,
    /// The model's reasoning, apart from the answer (models that think).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ResponseToolCall>,
}

/// A complete tool call of a non-streaming response.
#[derive(Debug, Serialize)]
pub(super) struct ResponseToolCall {
    pub id: String,
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub function: FunctionCall,
}

/// A called function and its arguments (JSON text).
#[derive(Debug, Serialize)]
pub(super) struct FunctionCall {
    pub name: String,
    pub arguments: String,
}

/// A completion object whose choices are `C`: a chat stream's chunk (`chat.completion.chunk`)
/// or a text completion, whole or a stream's chunk (`text_completion`).
#[derive(Debug, Serialize)]
pub(super) struct CompletionObject<'a, C> {
    pub id: &'a str,
    pub object: &'static str,
    pub created: u64,
    pub model: &'a str,
    pub system_fingerprint: &'static str,
    pub choices: Vec<C>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<WireUsage>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timings: Option<WireTimings>,
}

/// The choice of a chunk.
#[derive(Debug, Serialize)]
pub(super) struct ChunkChoice {
    pub index: u32,
    pub delta: Delta,
    pub finish_reason: Option<&'static str>,
    pub logprobs: Option<ChatLogprobs>,
}

/// What a chunk adds.
#[derive(Debug, Default, Serialize)]
pub(super) struct Delta {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    /// More of the model's reasoning.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<[ToolCallDelta; 1]>,
}

/// Part of a streamed tool call. The first delta of a call carries `id`, `type` and the name
/// (with empty arguments); later ones only argument fragments, so concatenating clients never
/// see a name or id twice.
#[derive(Debug, Serialize)]
pub(super) struct ToolCallDelta {
    pub index: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<&'static str>,
    pub function: FunctionDelta,
}

/// The function part of a [`ToolCallDelta`].
#[derive(Debug, Serialize)]
pub(super) struct FunctionDelta {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    pub arguments: String,
}

/// `GET /v1/models` body.
#[derive(Debug, Serialize)]
pub(super) struct ModelList {
    pub object: &'static str,
    pub data: Vec<ModelCard>,
}

/// One model of the list.
#[derive(Debug, Serialize)]
pub(super) struct ModelCard {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub owned_by: &'static str,
    pub meta: ModelMeta,
}

/// Extra facts about the model (llama-server shows similar ones).
#[derive(Debug, Serialize)]
pub(super) struct ModelMeta {
    pub architecture: String,
    pub n_ctx: u32,
    pub n_ctx_train: u32,
    pub n_vocab: i32,
    pub chat_template: String,
    pub tool_format: &'static str,
    /// The markers of the model's reasoning (`["<think>", "</think>"]`); null for models
    /// that do not think.
    pub reasoning_markers: Option<[&'static str; 2]>,
    /// What media the projector (`--mmproj`) takes: `["image", "audio"]`, none without one
    /// or when the load-time probe refused it.
    pub input_media: Vec<&'static str>,
    /// Why media input is refused although a projector is loaded.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub media_refused: Option<String>,
    /// The devices the model may use: the CPU, then those that take offloaded layers (an RPC
    /// server's are named by its endpoint).
    pub devices: Vec<DeviceView>,
}

/// One device of `/v1/models`' `meta.devices`.
#[derive(Debug, Serialize)]
pub(super) struct DeviceView {
    /// ggml's name (`CPU`, `CUDA0`, `RPC0`).
    pub name: String,
    /// What it is; an RPC device's `HOST:PORT`.
    pub description: String,
    /// The ggml backend (`CPU`, `CUDA`, `RPC`).
    pub backend: String,
    /// Its memory, in bytes.
    pub memory_total: u64,
    /// Its memory free after the model loaded, in bytes.
    pub memory_free: u64,
}
