//! What callers send to the engine and the events they get back.
//!
//! These are the engine's own types: the HTTP layer translates OpenAI wire types into them and
//! back, so the engine knows nothing about JSON or SSE.

use std::time::{Duration, SystemTime};

use crate::chat::tools::ToolDefinition;
use crate::chat::{ChatMessage, Grammar, TemplateKwargs};
use crate::engine::{EngineError, RequestPath, SamplingParams};

/// The text to continue.
#[derive(Clone, Debug)]
pub enum Prompt {
    /// A conversation, rendered through the model's chat template with a generation prompt.
    Chat {
        /// The conversation so far.
        messages: Vec<ChatMessage>,
        /// Functions the model may call: given to templates that render tools, described in the
        /// system message for the others (see [`crate::chat::tools::prepare_messages`]).
        tools: Vec<ToolDefinition>,
        /// Extra variables for the chat template (`enable_thinking`, `reasoning_effort`, ...).
        template_kwargs: TemplateKwargs,
    },
    /// Raw text, tokenized as is (special tokens in it are parsed).
    Text(String),
    /// Token ids, evaluated as given.
    Tokens(Vec<i32>),
}

impl Prompt {
    /// A conversation offering `tools`, rendered with no extra template variables.
    #[must_use]
    pub fn chat(messages: Vec<ChatMessage>, tools: Vec<ToolDefinition>) -> Self {
        Self::Chat { messages, tools, template_kwargs: TemplateKwargs::new() }
    }
}

/// One generation request.
#[derive(Clone, Debug)]
pub struct GenerationRequest {
    /// What to continue.
    pub prompt: Prompt,
    /// Most tokens to generate; `None`: the engine's `n_predict` cap
    /// ([`EngineConfig::n_predict`](crate::EngineConfig)), else until the context is full. `Some(0)` only prefills
    /// the prompt into the cache (useful to warm it before the user finishes speaking).
    pub max_tokens: Option<u32>,
    /// `max_tokens` is a ceiling, not room the reply needs: the reply gets at most `max_tokens`
    /// and at most what the context has left after the prompt, and the request is refused only
    /// when the prompt leaves no room for a short reply ([`CEILING_MIN_ROOM`] tokens). `false`
    /// (OpenAI's and llama-server's meaning): the prompt and `max_tokens` must fit the context
    /// together, else `context_length_exceeded`. Transcriptions set it: their `max_tokens` is a
    /// cap on a model that does not stop, not a length asked for.
    pub max_tokens_is_ceiling: bool,
    /// Generation ends before the first occurrence of any of these strings.
    pub stop: Vec<String>,
    /// How tokens are chosen.
    pub sampling: SamplingParams,
    /// A grammar the output must follow (tool calls, JSON output).
    pub grammar: Option<Grammar>,
    /// Special tokens to show as text (tool-call markers); other special tokens are not shown.
    pub preserved_tokens: Vec<String>,
    /// Report each generated token's log-probability ([`Event::Logprobs`]) with this many of
    /// the likeliest tokens at its position (at most [`MAX_TOP_LOGPROBS`]); `None`: none.
    pub logprobs: Option<u32>,
    /// Most tokens a model that thinks may spend on its reasoning: then the engine writes the
    /// end of the reasoning itself and the answer starts. Applies to chat prompts whose template
    /// thinks; `None`: the engine's default ([`EngineConfig::reasoning_budget`](crate::EngineConfig)).
    pub reasoning_budget: Option<u32>,
    /// For a prefill ([`crate::Engine::prefill`]): reply tokens to generate after the prompt and
    /// park, for the request that follows with the same prompt and settings to adopt (its first
    /// tokens are then out at once). `None`: the engine's default
    /// ([`EngineConfig::pregenerate`](crate::EngineConfig)); ignored by other requests.
    pub pregenerate: Option<u32>,
    /// Reuse the cache past short changed spans of the prompt, an approximation
    /// ([`crate::engine::ChangeRules`]); `None`: the engine's default
    /// ([`EngineConfig::reuse_after_change`](crate::EngineConfig)).
    pub reuse_after_change: Option<bool>,
    /// The media parts of a chat prompt, each standing where its
    /// [`marker`](crate::engine::media::MediaInput::marker) is in a message's text.
    pub media: Vec<crate::engine::media::MediaInput>,
}

/// The least room a reply whose `max_tokens` is a ceiling
/// ([`GenerationRequest::max_tokens_is_ceiling`]) must have after its prompt (or `max_tokens`,
/// if less): a prompt that leaves less is refused.
pub const CEILING_MIN_ROOM: u32 = 16;

/// Most tokens a prefill may generate ahead ([`GenerationRequest::pregenerate`]).
pub const MAX_PREGENERATE: u32 = 256;

/// Most alternatives [`GenerationRequest::logprobs`] may ask for (OpenAI's `top_logprobs` limit).
pub const MAX_TOP_LOGPROBS: u32 = 20;

impl GenerationRequest {
    /// A chat request with default sampling and no limits.
    #[must_use]
    pub fn chat(messages: Vec<ChatMessage>) -> Self {
        Self {
            prompt: Prompt::chat(messages, Vec::new()),
            max_tokens: None,
            max_tokens_is_ceiling: false,
            stop: Vec::new(),
            sampling: SamplingParams::default(),
            grammar: None,
            preserved_tokens: Vec::new(),
            logprobs: None,
            reasoning_budget: None,
            pregenerate: None,
            reuse_after_change: None,
            media: Vec::new(),
        }
    }
}

/// Why generation ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// The model ended its turn or a stop string was reached.
    Stop,
    /// `max_tokens` or the context size was reached.
    Length,
}

/// Token counts of one request.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    /// Tokens in the prompt, cached ones included.
    pub prompt_tokens: u32,
    /// Prompt tokens whose KV was reused from the previous request.
    pub cached_tokens: u32,
    /// Tokens generated.
    pub completion_tokens: u32,
    /// Messages of the oldest turns left out because the conversation did not fit the
    /// context ([`ContextOverflow::DropOldest`](crate::engine::ContextOverflow::DropOldest)).
    pub dropped_messages: u32,
    /// Of the generated tokens, those spent inside the model's reasoning.
    pub reasoning_tokens: u32,
}

/// Where the time of one request went.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Timings {
    /// Time spent evaluating the uncached part of the prompt.
    pub prompt: Duration,
    /// Time from the first to the last generated token.
    pub generation: Duration,
    /// Speculative decoding's counts, when it is on.
    pub draft: Option<DraftStats>,
    /// Where the reused prompt tokens came from, and why not more.
    pub cache: CacheReport,
    /// What the request cost before its prompt was evaluated, stage by stage (`None` for
    /// requests that did not come through [`crate::api`]'s conversion path, e.g. a warm prompt).
    pub request: Option<RequestPath>,
    /// Whether other requests' replies shared the reply's steps (`None`: it ran alone).
    pub shared: Option<SharedSteps>,
}

/// How a reply shared the context's steps with other requests (`--parallel`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SharedSteps {
    /// The sequence it was served in (0: the live sequence; others: lanes beside it).
    pub sequence: u32,
    /// Most other replies that were computed in the same step as one of its tokens.
    pub replies_beside: u32,
}

/// What the cache did for one prompt: where its reused tokens came from and, when it could
/// not serve more of it, why.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CacheReport {
    /// Where the reused tokens came from.
    pub source: CacheSource,
    /// Prompt tokens not evaluated again.
    pub reused: u32,
    /// Prompt tokens evaluated.
    pub prefilled: u32,
    /// The first prompt position that differs from what the source held (`None`: the prompt
    /// continues all of it, or nothing was held).
    pub diverged_at: Option<u32>,
    /// Why the cache did not serve more (`None`: it served everything it held in common).
    pub reason: Option<CacheMiss>,
    /// Time spent saving the live sequence to the store before this prompt took it over.
    pub save: Option<Duration>,
    /// Time spent restoring a stored state.
    pub restore: Option<Duration>,
    /// Reply tokens a prefill generated ahead (a parked generation) that this request adopted:
    /// they were sent at once, without evaluating anything.
    pub adopted: u32,
    /// Where the prompt cut the reply the cache held (a barge-in's next turn), if it did.
    pub reply_cut: Option<ReplyCut>,
    /// The changed spans the cache was reused past, where it was (an approximation:
    /// [`CacheMiss::ReusedAfterChange`]).
    pub changes: Option<ChangesReport>,
}

/// What a reuse past changed spans did: the spans evaluated anew, and the cached tokens kept
/// after them although they were computed attending to the old spans.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ChangesReport {
    /// Each span: where it starts in the prompt, its length in the cache and in the prompt.
    pub spans: Vec<ChangedSpanReport>,
    /// Cached tokens kept after the spans.
    pub kept: u32,
    /// Prompt tokens evaluated for the spans and the neighbourhoods after them.
    pub evaluated: u32,
}

/// One changed span of a [`ChangesReport`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ChangedSpanReport {
    /// Where it starts in the prompt.
    pub at: u32,
    /// Its length in the cache.
    pub old_len: u32,
    /// Its length in the prompt.
    pub new_len: u32,
}

/// Where a prompt left the cache inside the reply it held: the next turn after a barge-in,
/// whose assistant message is cut to what was spoken. Everything up to the cut is kept (on
/// models whose cache cannot be cut there, up to the newest checkpoint before it).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReplyCut {
    /// Reply tokens the prompt keeps before it leaves the reply.
    pub kept: u32,
    /// Reply tokens the cache held.
    pub held: u32,
}

/// Where a prompt's reused tokens came from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CacheSource {
    /// The live sequence (the previous request's cache).
    Live,
    /// Another conversation's cells kept in the context under a sequence of their own
    /// (`--parallel`): continued where they are, nothing copied.
    Kept,
    /// A snapshot of another sequence, restored from the RAM store.
    Ram,
    /// A checkpoint of an earlier prompt, restored from the RAM store.
    Checkpoint,
    /// A state saved on disk (by this run or an earlier one), restored.
    Disk,
    /// Nothing was reused.
    #[default]
    None,
}

/// Why a prompt was not served more from the cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CacheMiss {
    /// Nothing was cached.
    Cold,
    /// The prompt differs inside its first message (the system prompt, tools included).
    SystemPromptChanged,
    /// The prompt differs inside an earlier turn: history was rewritten (dropped reasoning,
    /// an edited message, a reply re-rendered differently).
    HistoryChanged,
    /// The prompt is a prefix of what the cache holds (a regenerated reply); its last token is
    /// evaluated again.
    PromptShorter,
    /// A stored snapshot (in RAM or on disk) served the prompt better than the live sequence.
    Restored,
    /// A checkpoint served the prompt: the live cache could not be cut where it diverged.
    Checkpoint,
    /// The sliding-window cache no longer holds what the shared prefix needs.
    SwaWindow,
    /// The model's recurrent state cannot be rolled back to where the prompt diverged, and no
    /// checkpoint covered it.
    CannotRewind,
    /// An entry that would have served the prompt was evicted to stay within the budget.
    Evicted,
    /// The prompt cut the reply the cache held (barge-in; where: [`CacheReport::reply_cut`]).
    ReplyCut,
    /// The prompt holds another image or clip where the cache held one.
    MediaChanged,
    /// The prompt changed in short spans and the cache was reused past them, an approximation
    /// (where: [`CacheReport::changes`]).
    ReusedAfterChange,
    /// The prompt changed in short spans that reuse past changes would have kept what follows,
    /// but this cache cannot move its positions now (recurrent state, a sliding window without
    /// its full-size cache, a drafter, or lanes running beside).
    CannotReuseAfterChange,
    /// The cache held more of the prompt, but as a reuse past changes kept it (computed with
    /// an older text), which this request did not accept: evaluated again.
    ApproximateCells,
}

impl CacheMiss {
    /// The name clients see in `timings.cache.reason`.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Cold => "cold",
            Self::SystemPromptChanged => "system-prompt-changed",
            Self::HistoryChanged => "history-changed",
            Self::PromptShorter => "prompt-shorter",
            Self::Restored => "restored",
            Self::Checkpoint => "checkpoint",
            Self::SwaWindow => "swa-window",
            Self::CannotRewind => "cannot-rewind",
            Self::Evicted => "evicted",
            Self::ReplyCut => "reply-cut",
            Self::MediaChanged => "media-changed",
            Self::ReusedAfterChange => "reused-after-change",
            Self::CannotReuseAfterChange => "cannot-reuse-after-change",
            Self::ApproximateCells => "approximate-cells",
        }
    }
}

impl CacheSource {
    /// The name clients see in `timings.cache.source`.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Live => "live",
            Self::Kept => "kept",
            Self::Ram => "ram",
            Self::Checkpoint => "checkpoint",
            Self::Disk => "disk",
            Self::None => "none",
        }
    }
}

/// What the cache holds now: the live sequence, the RAM store and the disk cache.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CacheStatus {
    /// Tokens the live sequence holds.
    pub live_tokens: u32,
    /// The store's budget in bytes (0: the store is off).
    pub budget_bytes: u64,
    /// Bytes the store holds.
    pub used_bytes: u64,
    /// Tokens between checkpoints of a long prefill (0: only at each prompt's end), for
    /// models that take checkpoints.
    pub checkpoint_every: Option<u32>,
    /// The stored entries, most recently used first.
    pub entries: Vec<CacheEntryStatus>,
    /// The disk cache, when on.
    pub disk: Option<DiskStatus>,
    /// Parked generations since the engine started.
    pub parking: ParkingCounts,
    /// Requests served beside the live sequence's reply (`--parallel`).
    pub lanes: LaneCounts,
    /// The media kept decoded and tokenized (with a projector), read live.
    pub media: Option<crate::engine::media::MediaCacheStatus>,
    /// Conversations kept in their cells (`--parallel`), most recently used first.
    pub kept: Vec<KeptStatus>,
    /// Where the live sequence's cells kept past a changed span begin (computed with an older
    /// text: only requests that accept reuse past changes reuse them); `None` when it holds none.
    pub live_approximate_from: Option<u32>,
}

/// A conversation kept in its cells under a sequence of its own.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KeptStatus {
    /// Its sequence in the context.
    pub sequence: i32,
    /// Tokens it holds.
    pub tokens: u32,
    /// Of these, the first ones whose cells the live sequence holds too.
    pub shared: u32,
}

/// Requests served in lanes: sequences of their own beside the live sequence's reply.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LaneCounts {
    /// Lanes serving a request now.
    pub running: u32,
    /// Requests served to their end in a lane since start.
    pub served: u64,
    /// Conversations kept in their cells under a sequence of their own, for a next turn that
    /// continues them with nothing restored.
    pub kept: u32,
}

/// What became of parked generations (a prefill's pregenerated tokens, the reply of a client
/// that left) since the engine started.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ParkingCounts {
    /// Generations parked.
    pub parked: u64,
    /// Parked generations a request adopted.
    pub adopted: u64,
    /// Parked generations dropped: another request or a newer prefill came, or the park time
    /// ran out.
    pub discarded: u64,
}

/// What the disk cache holds.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DiskStatus {
    /// This model's directory.
    pub dir: std::path::PathBuf,
    /// The budget in bytes, for the whole cache directory.
    pub budget_bytes: u64,
    /// Bytes the cache directory holds (every model's files).
    pub used_bytes: u64,
    /// Bytes this process's disk cache writer wrote (bases and delta segments, headers
    /// included) since it started.
    pub bytes_written: u64,
    /// Memory the writer holds for the files' last states' signatures (what the next turn's
    /// delta is computed from).
    pub signature_bytes: u64,
    /// This model's entries (written or being written), most recently used first.
    pub entries: Vec<CacheEntryStatus>,
    /// Why the disk cache is off for the rest of the process (its writer thread stopped);
    /// `None` while it works.
    pub off: Option<String>,
    /// Why this instance reads the directory only (another instance with the same settings
    /// writes it); `None` while it writes.
    pub read_only: Option<String>,
}

/// One stored entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CacheEntryStatus {
    /// Why it was saved.
    pub kind: CacheEntryKind,
    /// Tokens its state holds.
    pub tokens: u32,
    /// Bytes of its state.
    pub bytes: u64,
    /// When it was saved or last restored.
    pub last_used: SystemTime,
}

/// Why a stored entry was saved.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CacheEntryKind {
    /// The live sequence, saved before another prompt took the context; it becomes the live
    /// sequence again when restored (and leaves the store).
    Snapshot,
    /// A prompt's state at the end of its prefill (or every `checkpoint_every` tokens of it),
    /// for models whose cache cannot be cut; it stays in the store when restored.
    Checkpoint,
}

impl CacheEntryKind {
    /// The name `GET /cache` shows.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Snapshot => "snapshot",
            Self::Checkpoint => "checkpoint",
        }
    }
}

/// What speculative decoding did for one reply.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DraftStats {
    /// Tokens drafted and verified.
    pub drafted: u32,
    /// Of these, how many the target accepted.
    pub accepted: u32,
    /// Prompt tokens the drafter's own context evaluated to follow the target (a cached turn
    /// costs it only the new suffix; MTP's is the target's prompt evaluation itself).
    pub catch_up: u32,
}

/// Events of one generation, in order: `Started`, any number of `Text`, then `Finished` or
/// `Failed`. A `Failed` may also come first, instead of `Started`.
#[derive(Debug)]
// `Finished` (its timings) is the large one and comes once per generation: boxing it would
// allocate for every reply to save a few hundred bytes per queued event.
#[allow(clippy::large_enum_variant)]
pub enum Event {
    /// The prompt was accepted and is being evaluated.
    Started {
        /// Tokens in the prompt.
        prompt_tokens: u32,
        /// Of these, how many the KV cache already held.
        cached_tokens: u32,
        /// The prompt opened the model's reasoning (its template ends the generation prompt
        /// with the open marker): the reply starts inside it, without the marker.
        in_reasoning: bool,
    },
    /// The log-probabilities of generated tokens (when the request asked for them), sent just
    /// before the [`Event::Text`] that holds their text. Tokens whose text was held back as a
    /// stop string are left out.
    Logprobs(Vec<TokenLogprob>),
    /// Newly generated text (whole UTF-8 characters, stop strings withheld).
    Text(String),
    /// Generation ended normally.
    Finished {
        /// Why it ended.
        reason: FinishReason,
        /// Token counts.
        usage: Usage,
        /// Time spent.
        timings: Timings,
    },
    /// Generation could not start or was interrupted.
    Failed(EngineError),
}

/// A generated token's log-probability and the likeliest tokens at its position, under the
/// model's own distribution (log-softmax of the logits, before sampling settings such as
/// temperature, penalties, logit bias or a grammar).
#[derive(Clone, Debug, PartialEq)]
pub struct TokenLogprob {
    /// The token generated.
    pub chosen: Candidate,
    /// The likeliest tokens, most likely first (as many as asked for).
    pub top: Vec<Candidate>,
}

/// One token and its log-probability.
#[derive(Clone, Debug, PartialEq)]
pub struct Candidate {
    /// Its id.
    pub token: i32,
    /// Its text's bytes (part of a UTF-8 character where a token splits one).
    pub bytes: Vec<u8>,
    /// Natural log of its probability.
    pub logprob: f32,
}

/// What one prefill did ([`crate::Engine::prefill`]).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PrefillReport {
    /// Tokens in the prompt.
    pub prompt_tokens: u32,
    /// Of these, how many the cache already held.
    pub cached_tokens: u32,
    /// How many this prefill evaluated.
    pub prefilled_tokens: u32,
    /// Everything worth evaluating ahead of the request is cached now: the whole prompt, or, on
    /// a model whose cache cannot be cut (recurrent state), all but the newest message's last
    /// word and what the template writes after it, which the next partial may change. False
    /// when the prefill yielded to a generation request (or was superseded) first.
    pub complete: bool,
    /// A newer prefill was submitted before this one ran, so it did nothing.
    pub superseded: bool,
    /// Reply tokens generated after the prompt and parked for the request that follows
    /// ([`GenerationRequest::pregenerate`]).
    pub pregenerated_tokens: u32,
    /// Where the time went and what the cache did (no generation).
    pub timings: Timings,
}
