//! Everything that can go wrong in the engine, as values callers can act on.

use std::path::PathBuf;

use crate::chat::TemplateError;

/// An engine failure. The API layer maps each variant to one HTTP status in one place.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum EngineError {
    /// The model file does not exist or cannot be read.
    #[error("cannot read model file {path}: {reason}")]
    ModelUnreadable {
        /// The path given.
        path: PathBuf,
        /// What the OS said.
        reason: String,
    },
    /// llama.cpp refused the file (corrupt, not GGUF, unsupported architecture).
    #[error("llama.cpp could not load {path} (corrupt file, not GGUF, or an unsupported architecture; run with RUST_LOG=llama-cpp-2=info for its log)")]
    ModelLoad {
        /// The path given.
        path: PathBuf,
    },
    /// An RPC server of `--rpc` cannot be used.
    #[error("cannot use the RPC server at {endpoint}: {reason}. Run `firstword rpc-server --host <its private address> --port <port>` there (or llama.cpp's rpc-server built from the same llama.cpp), on a trusted network")]
    Rpc {
        /// `HOST:PORT`.
        endpoint: String,
        /// What was found there.
        reason: String,
    },
    /// `firstword rpc-server` cannot serve.
    #[error("rpc-server: {0}")]
    RpcServe(String),
    /// `--rpc` was given to a build without llama.cpp's RPC backend.
    #[error("this build has no RPC backend (llama.cpp was built without GGML_RPC): build again after `cargo clean -p llama-cpp-sys-2`")]
    RpcUnavailable,
    /// The inference context could not be created (often: not enough memory for the KV cache).
    #[error("could not create a {n_ctx}-token context: {reason}")]
    ContextCreate {
        /// Requested context size.
        n_ctx: u32,
        /// What went wrong.
        reason: String,
    },
    /// Speculative decoding cannot run as configured.
    #[error("speculative decoding: {0}")]
    SpeculationSetup(#[from] SpeculationError),
    /// The state store's budget (`cache_ram_mib`) is larger than the memory available.
    #[error("`cache_ram_mib` is {requested_mib} MiB but only {available_mib} MiB of memory is available")]
    CacheBudget {
        /// The budget asked for.
        requested_mib: u64,
        /// `MemAvailable` at start-up.
        available_mib: u64,
    },
    /// No usable chat template could be found or compiled.
    #[error("chat template: {0}")]
    TemplateSetup(String),
    /// The model is still loading.
    #[error("the model is still loading")]
    Loading,
    /// Loading failed earlier; the engine cannot serve.
    #[error("the model failed to load: {0}")]
    LoadFailed(String),
    /// Too many requests are already waiting.
    #[error("server busy: {capacity} requests are already waiting")]
    QueueFull {
        /// The queue's capacity.
        capacity: usize,
    },
    /// The engine is shutting down.
    #[error("the server is shutting down")]
    ShuttingDown,
    /// Rendering the chat template failed for these messages.
    #[error(transparent)]
    Template(#[from] TemplateError),
    /// The prompt rendered to no tokens.
    #[error("the prompt is empty")]
    EmptyPrompt,
    /// A media part (image, audio) cannot be used.
    #[error("{part}: {reason}")]
    Media {
        /// Where the request holds it (`messages[1].content[0]`).
        part: String,
        /// Why.
        reason: String,
    },
    /// A prompt token id is outside the vocabulary.
    #[error("token id {token} is outside the vocabulary (0..{n_vocab})")]
    InvalidToken {
        /// The offending id.
        token: i32,
        /// Vocabulary size.
        n_vocab: i32,
    },
    /// A text prompt holds more characters of one kind in a row (letters, digits, spaces,
    /// symbols) than the tokenizer can split safely.
    #[error("the prompt contains {run} characters in a row that the tokenizer would read as one word (letters with their marks, digits, spaces or symbols); at most {max} are accepted")]
    PromptRunTooLong {
        /// The longest run found.
        run: usize,
        /// The limit.
        max: usize,
    },
    /// llama.cpp refused to drop rejected drafts from the cache in the middle of a reply, so
    /// the reply cannot go on from a known state.
    #[error(
        "llama.cpp could not drop rejected drafts from the KV cache at position {position}; the cache was cleared"
    )]
    CacheCut {
        /// Where the cut was asked for.
        position: usize,
    },
    /// Prompt plus requested completion do not fit the context.
    #[error("this request needs {needed} tokens ({prompt_tokens} in the prompt + {max_tokens} to generate) but the context holds {n_ctx}; shorten the prompt or lower max_tokens")]
    ContextOverflow {
        /// Tokens in the prompt.
        prompt_tokens: u32,
        /// Tokens requested for the completion.
        max_tokens: u32,
        /// Their sum.
        needed: u32,
        /// Context size.
        n_ctx: u32,
    },
    /// The request's grammar does not parse.
    #[error("invalid grammar: {0}")]
    InvalidGrammar(String),
    /// Generation reached a point where the grammar allows no token.
    #[error("constrained generation failed: {0}")]
    GrammarDeadEnd(String),
    /// llama.cpp failed to evaluate a batch.
    #[error("llama.cpp decode failed: {0}")]
    Decode(String),
    /// A reply's decode step was stopped midway because its client had left: the reply ends
    /// as cancelled (never sent to a client).
    #[error("the decode step was stopped: the client left")]
    DecodeStopped,
    /// The inference thread panicked while serving this request (a bug): the request was
    /// abandoned, the cache cleared, and the thread serves the next request.
    #[error("internal error while serving this request ({0}); the cache was cleared and the server goes on")]
    Internal(String),
    /// The inference thread stopped after a failure it could not recover from: nothing more
    /// can be served (the `firstword` binary exits non-zero so a supervisor restarts it).
    #[error("the inference thread stopped after a failure it could not recover from: {0}")]
    EngineDied(String),
}

/// Why speculative decoding cannot run as configured. Messages name the offending
/// [`SpeculationConfig`](super::SpeculationConfig) field as `speculation.<field>`.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum SpeculationError {
    /// [`SpecMode::Mtp`](super::SpecMode::Mtp) for a model without MTP (NextN) layers.
    #[error("`speculation.mode` is `Mtp` but {} has no MTP (NextN) layers (no `<arch>.nextn_predict_layers` in its metadata); use `Draft` with a `speculation.draft_model`, or `None`", model.display())]
    NoMtpLayers {
        /// The served model.
        model: PathBuf,
    },
    /// [`SpecMode::Draft`](super::SpecMode::Draft) without a draft model.
    #[error("`speculation.mode` is `Draft` but no `speculation.draft_model` is set")]
    NoDraftModel,
    /// `draft_max` outside 1..=64.
    #[error("`speculation.draft_max` must be between 1 and 64, got {0}")]
    DraftMaxOutOfRange(u32),
    /// `draft_min` above `draft_max`.
    #[error("`speculation.draft_min` ({min}) is larger than `speculation.draft_max` ({max})")]
    DraftMinAboveMax {
        /// `draft_min`.
        min: u32,
        /// `draft_max` (the default for the drafter when unset).
        max: u32,
    },
    /// `draft_p_min` outside 0..=1.
    #[error("`speculation.draft_p_min` must be between 0 and 1, got {0}")]
    DraftPMinOutOfRange(f32),
    /// The draft model's vocabulary differs from the served model's.
    #[error("the draft model {} has a different vocabulary: {difference}", draft.display())]
    DifferentVocabulary {
        /// `speculation.draft_model`.
        draft: PathBuf,
        /// The first difference found.
        difference: String,
    },
    /// Speculation was asked for on a recurrent or hybrid model whose state llama.cpp cannot
    /// roll back.
    #[error("the model's recurrent state cannot be rolled back by llama.cpp for this architecture, and verifying drafts needs that")]
    CannotRollBack,
    /// llama.cpp could not set up the MTP drafter.
    #[error("MTP: {0}")]
    Mtp(String),
}
