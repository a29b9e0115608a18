//! The command line's flags: clap structs, grouped as `firstword serve --help` shows them, and
//! their translation into the library's plain config types.

mod bench;

pub(crate) use bench::{BenchAction, BenchArgs};

use std::path::PathBuf;
use std::sync::LazyLock;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};
use firstword::api::{AllowedHosts, ApiKeys, CorsOrigins, ServeOptions};
use firstword::engine::{
    ContextOverflow, EngineConfig, EngineError, FlashAttention, Prompt, RpcEndpoint, RpcServerOptions, SpecMode,
    SpeculationConfig, SpeculationError, SplitMode, LLAMA_CPP_BUILD,
};

/// `firstword --version`: this crate's version and the llama.cpp it links.
static VERSION: LazyLock<String> = LazyLock::new(|| format!("{} ({LLAMA_CPP_BUILD})", env!("CARGO_PKG_VERSION")));

/// Lowest time-to-first-token local inference behind an OpenAI-compatible API.
#[derive(Parser)]
#[command(version = VERSION.as_str())]
pub(crate) struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Subcommand)]
pub(crate) enum Command {
    /// Serve a GGUF model over the OpenAI chat-completions API.
    Serve(ServeArgs),
    /// Measure cold/warm TTFT, tool calls, decode speed and an interleaved job on any
    /// OpenAI-compatible servers, side by side, and decide between them; grade their answers
    /// blind (`bench grade`) and decide (`bench verdict`).
    Bench(BenchArgs),
    /// Serve this machine's devices (its GPUs, or its CPU) to a firstword or llama-server
    /// started with --rpc on another machine, as llama.cpp's rpc-server does. Listens only on
    /// loopback or a private address: the protocol has no authentication.
    RpcServer(RpcServerArgs),
}

/// `firstword rpc-server`.
#[derive(Args)]
pub(crate) struct RpcServerArgs {
    /// Address to listen on: this machine's address on a private network (or 127.0.0.1).
    #[arg(long, env = "FIRSTWORD_RPC_HOST", default_value = "127.0.0.1")]
    pub host: String,
    /// Port to listen on.
    #[arg(short = 'p', long, env = "FIRSTWORD_RPC_PORT", default_value_t = 50052)]
    pub port: u16,
    /// Threads of a CPU device [default: physical cores].
    #[arg(short = 't', long, env = "FIRSTWORD_THREADS")]
    pub threads: Option<u32>,
    /// Keep the large tensors a client sends in this directory, so that its next start loads
    /// the model faster.
    #[arg(long = "cache-dir", env = "FIRSTWORD_RPC_CACHE_DIR")]
    pub cache_dir: Option<PathBuf>,
    /// Serve only these devices (ggml's names: CUDA0, Metal, CPU; repeatable) [default: the
    /// GPUs, or the CPU without one].
    #[arg(long = "device", value_name = "NAME")]
    pub devices: Vec<String>,
}

impl RpcServerArgs {
    /// What the library's RPC server is told.
    pub(crate) fn options(&self) -> RpcServerOptions {
        RpcServerOptions {
            host: self.host.clone(),
            port: self.port,
            threads: self.threads.unwrap_or_else(firstword::engine::physical_cores),
            cache_dir: self.cache_dir.clone(),
            devices: self.devices.clone(),
        }
    }
}

/// `firstword serve`.
#[derive(Args)]
pub(crate) struct ServeArgs {
    /// The model and how it is loaded.
    #[command(flatten)]
    pub model: ModelArgs,
    /// The live context.
    #[command(flatten)]
    pub context: ContextArgs,
    /// The KV cache.
    #[command(flatten)]
    pub cache: CacheArgs,
    /// Speculative decoding.
    #[command(flatten)]
    pub speculation: SpeculationArgs,
    /// Listening and requests.
    #[command(flatten)]
    pub server: ServerArgs,
}

/// The model and how it is loaded.
#[derive(Args)]
#[command(next_help_heading = "Model")]
pub(crate) struct ModelArgs {
    /// Path of the GGUF model to serve.
    #[arg(short = 'm', long = "model", env = "FIRSTWORD_MODEL")]
    pub path: PathBuf,
    /// Jinja chat template to use instead of the one in the GGUF.
    #[arg(long = "chat-template-file", env = "FIRSTWORD_CHAT_TEMPLATE_FILE")]
    pub chat_template_file: Option<PathBuf>,
    /// Multimodal projector GGUF (llama.cpp's mmproj file made for this model): image and
    /// audio parts in chat messages.
    #[arg(long = "mmproj", env = "FIRSTWORD_MMPROJ")]
    pub mmproj: Option<PathBuf>,
    /// Layers to offload to the GPU (GPU builds only).
    #[arg(long = "n-gpu-layers", visible_alias = "ngl", env = "FIRSTWORD_N_GPU_LAYERS", default_value_t = EngineConfig::DEFAULT_N_GPU_LAYERS)]
    pub n_gpu_layers: u32,
    /// llama.cpp RPC servers whose devices take layers, as llama-server's --rpc
    /// (HOST:PORT, comma-separated; `firstword rpc-server` or llama.cpp's rpc-server runs
    /// there). Each must answer at start. Their devices come first, then the local GPUs.
    #[arg(long = "rpc", value_name = "HOST:PORT,...", env = "FIRSTWORD_RPC", value_delimiter = ',')]
    pub rpc: Vec<RpcEndpoint>,
    /// Seconds a llama.cpp call may wait on the RPC servers per 512-token micro-batch before
    /// firstword exits, naming them (a server that stops answering would hold every request).
    #[arg(long = "rpc-timeout", value_name = "SECONDS", env = "FIRSTWORD_RPC_TIMEOUT", default_value_t = EngineConfig::DEFAULT_RPC_TIMEOUT.as_secs(), value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub rpc_timeout: u64,
    /// How offloaded layers are split over several devices.
    #[arg(
        long = "split-mode",
        visible_alias = "sm",
        env = "FIRSTWORD_SPLIT_MODE",
        value_enum,
        default_value = "layer"
    )]
    pub split_mode: SplitModeArg,
    /// Each device's share of the offloaded layers, in order (the RPC servers first, then the
    /// local GPUs), e.g. 3,1 [default: by free memory].
    #[arg(long = "tensor-split", visible_alias = "ts", value_name = "N0,N1,...", env = "FIRSTWORD_TENSOR_SPLIT", value_delimiter = ',', value_parser = parse_share)]
    pub tensor_split: Vec<f32>,
    /// The device that takes every offloaded layer with --split-mode none (an index in the
    /// same order).
    #[arg(long = "main-gpu", visible_alias = "mg", env = "FIRSTWORD_MAIN_GPU", default_value_t = 0)]
    pub main_gpu: u32,
    /// Keep every weight in its file's layout on the CPU (llama.cpp's --no-repack): slower
    /// CPU kernels, and the same sums as a CPU rpc-server's, which never repacks.
    #[arg(long = "no-repack", env = "FIRSTWORD_NO_REPACK")]
    pub no_repack: bool,
    /// Lock the model in RAM (no swapping).
    #[arg(long, env = "FIRSTWORD_MLOCK")]
    pub mlock: bool,
    /// Read the model into memory instead of memory-mapping it.
    #[arg(long = "no-mmap", env = "FIRSTWORD_NO_MMAP")]
    pub no_mmap: bool,
}

/// `--split-mode`'s values.
#[derive(Clone, Copy, ValueEnum)]
pub(crate) enum SplitModeArg {
    /// One device (--main-gpu) takes every offloaded layer.
    None,
    /// Whole layers per device.
    Layer,
    /// Rows of each weight across the devices.
    Row,
    /// llama.cpp's tensor parallelism.
    Tensor,
}

/// One `--tensor-split` share: a finite number, zero or more.
fn parse_share(text: &str) -> Result<f32, String> {
    text.trim()
        .parse::<f32>()
        .ok()
        .filter(|share| share.is_finite() && *share >= 0.0)
        .ok_or_else(|| format!("`{text}` is not a share (a number, 0 or more)"))
}

/// The live context: its size, threads and batches.
#[derive(Args)]
#[command(next_help_heading = "Context")]
pub(crate) struct ContextArgs {
    /// Context size in tokens [default: the model's training context, at most 8192].
    #[arg(short = 'c', long = "ctx-size", env = "FIRSTWORD_CTX_SIZE")]
    pub ctx_size: Option<u32>,
    /// A conversation longer than the context: refuse it (400 naming both counts), or leave
    /// out its oldest whole turns, keeping the system prompt (the response's
    /// `timings.dropped_messages` says how many messages).
    #[arg(long = "context-overflow", env = "FIRSTWORD_CONTEXT_OVERFLOW", value_enum, default_value = "refuse")]
    pub context_overflow: ContextOverflowArg,
    /// Threads for generation [default: physical cores].
    #[arg(short = 't', long, env = "FIRSTWORD_THREADS")]
    pub threads: Option<u32>,
    /// Threads for prompt evaluation [default: physical cores].
    #[arg(long = "threads-batch", env = "FIRSTWORD_THREADS_BATCH")]
    pub threads_batch: Option<u32>,
    /// Always compute with -t and --threads-batch threads. By default they are the most used,
    /// and fewer run while other processes keep cores busy (llama.cpp's spinning workers
    /// collapse when a core they need is taken).
    #[arg(long = "fixed-threads", env = "FIRSTWORD_FIXED_THREADS")]
    pub fixed_threads: bool,
    /// Logical batch size: most prompt tokens per decode call.
    #[arg(short = 'b', long = "batch-size", env = "FIRSTWORD_BATCH_SIZE", default_value_t = EngineConfig::DEFAULT_BATCH_SIZE)]
    pub batch_size: u32,
    /// Physical batch size: most tokens computed at once.
    #[arg(long = "ubatch-size", visible_alias = "ub", env = "FIRSTWORD_UBATCH_SIZE", default_value_t = EngineConfig::DEFAULT_UBATCH_SIZE)]
    pub ubatch_size: u32,
    /// Flash attention: on, off, or auto (llama.cpp decides per backend).
    #[arg(long = "flash-attn", visible_alias = "fa", env = "FIRSTWORD_FLASH_ATTN", value_enum, default_value = "auto")]
    pub flash_attn: FlashAttnArg,
}

/// The KV cache.
#[derive(Args)]
#[command(next_help_heading = "Cache")]
pub(crate) struct CacheArgs {
    /// For sliding-window models, keep a small window-sized KV cache instead of a full one.
    /// Saves memory; a turn that edits text older than the window is then prefilled in full.
    #[arg(long = "swa-small", env = "FIRSTWORD_SWA_SMALL")]
    pub swa_small: bool,
    /// Host RAM (MiB) for the KV states of other prompts, so an interleaved request does not
    /// cost the conversation its cache; 0 turns the store off.
    #[arg(long = "cache-ram", value_name = "MIB", env = "FIRSTWORD_CACHE_RAM", default_value_t = EngineConfig::DEFAULT_CACHE_RAM_MIB)]
    pub cache_ram: u64,
    /// Shortest cached sequence (tokens) worth saving before another prompt takes the context.
    #[arg(long = "cache-min-tokens", env = "FIRSTWORD_CACHE_MIN_TOKENS", default_value_t = EngineConfig::DEFAULT_CACHE_MIN_TOKENS)]
    pub cache_min_tokens: u32,
    /// Models whose cache cannot be cut everywhere (recurrent, hybrid, --swa-small): a
    /// checkpoint every N tokens of a long prefill, besides the one at each prompt's end (0:
    /// only there).
    #[arg(long = "checkpoint-every", value_name = "N", env = "FIRSTWORD_CHECKPOINT_EVERY", default_value_t = EngineConfig::DEFAULT_CHECKPOINT_EVERY)]
    pub checkpoint_every: u32,
    /// Keep KV states on disk here, so the first turn after a restart is warm [default: the
    /// platform cache directory, e.g. ~/.cache/firstword].
    #[arg(long = "cache-dir", value_name = "DIR", env = "FIRSTWORD_CACHE_DIR")]
    pub cache_dir: Option<PathBuf>,
    /// No disk cache.
    #[arg(long = "no-cache-dir", env = "FIRSTWORD_NO_CACHE_DIR", conflicts_with = "cache_dir")]
    pub no_cache_dir: bool,
    /// Disk space (MiB) for the cache directory, every model's files together; the least
    /// recently used go first.
    #[arg(long = "cache-disk", value_name = "MIB", env = "FIRSTWORD_CACHE_DISK", default_value_t = EngineConfig::DEFAULT_CACHE_DISK_MIB)]
    pub cache_disk: u64,
    /// Prefill this at start, before /health reports ready (repeatable): a chat-completions
    /// JSON body (messages, tools) or a text file used as the system prompt. The first
    /// request that shares it is then cached.
    #[arg(long = "warm", value_name = "FILE")]
    pub warm: Vec<PathBuf>,
    /// Do not evaluate the next turn's opening (the end of the assistant turn, the user turn's
    /// header) after a reply; it is evaluated by default, off the time to first token.
    #[arg(long = "no-anticipate", env = "FIRSTWORD_NO_ANTICIPATE")]
    pub no_anticipate: bool,
    /// Reply tokens a /v1/prefill generates after the prompt and parks, so the request that
    /// follows with the same prompt has its first words at once (a prefill's `pregenerate`
    /// overrides it; 0: none).
    #[arg(long = "pregenerate", value_name = "N", env = "FIRSTWORD_PREGENERATE", default_value_t = EngineConfig::DEFAULT_PREGENERATE, value_parser = clap::value_parser!(u32).range(0..=i64::from(firstword::engine::MAX_PREGENERATE)))]
    pub pregenerate: u32,
    /// Reuse the cache past short changed spans near a prompt's start (a clock line, an
    /// entity's state): what follows them is kept though it was computed with the old text,
    /// an approximation (docs/cache.md); a request's `reuse_after_change` overrides it.
    #[arg(long = "reuse-after-change", env = "FIRSTWORD_REUSE_AFTER_CHANGE")]
    pub reuse_after_change: bool,
    /// With reuse past changes: tokens after each changed span evaluated again rather than
    /// kept, so they attend to the new text.
    #[arg(long = "reuse-redo", value_name = "N", env = "FIRSTWORD_REUSE_REDO", default_value_t = firstword::engine::ChangeRules::default().redo)]
    pub reuse_redo: usize,
    /// Seconds parked reply tokens wait for their request.
    #[arg(long = "park-seconds", value_name = "S", env = "FIRSTWORD_PARK_SECONDS", default_value_t = EngineConfig::DEFAULT_PARK_FOR.as_secs())]
    pub park_seconds: u64,
    /// Milliseconds the engine waits after a reply for a request sent right after it (an
    /// automation, a title request, another satellite), which is then served before the
    /// cache is readied for the next turn (0: the next turn is readied first).
    #[arg(long = "next-request-grace-ms", value_name = "MS", env = "FIRSTWORD_NEXT_REQUEST_GRACE_MS", default_value_t = EngineConfig::DEFAULT_NEXT_REQUEST_GRACE.as_millis() as u64, value_parser = clap::value_parser!(u64).range(0..=10_000))]
    pub next_request_grace_ms: u64,
}

/// Speculative decoding.
#[derive(Args)]
#[command(next_help_heading = "Speculative decoding")]
pub(crate) struct SpeculationArgs {
    /// Speculative decoding: auto (the model's MTP heads if the GGUF has NextN layers, else
    /// --draft-model if given, else none), none, mtp, or draft.
    #[arg(long, env = "FIRSTWORD_SPEC", value_enum, default_value = "auto")]
    pub spec: SpecArg,
    /// A smaller model with the same vocabulary that drafts tokens for the served one.
    #[arg(long = "draft-model", visible_alias = "md", env = "FIRSTWORD_DRAFT_MODEL")]
    pub draft_model: Option<PathBuf>,
    /// Layers of the draft model to offload to the GPU (GPU builds only).
    #[arg(long = "n-gpu-layers-draft", visible_alias = "ngld", env = "FIRSTWORD_N_GPU_LAYERS_DRAFT", default_value_t = EngineConfig::DEFAULT_N_GPU_LAYERS)]
    pub n_gpu_layers_draft: u32,
    /// Most tokens drafted per step [default: 3 with MTP heads, 16 with a draft model]; the
    /// depth verified adapts to the acceptance rate below it.
    #[arg(long = "draft-max", env = "FIRSTWORD_DRAFT_MAX")]
    pub draft_max: Option<u32>,
    /// Fewest drafted tokens worth verifying.
    #[arg(long = "draft-min", env = "FIRSTWORD_DRAFT_MIN", default_value_t = 0)]
    pub draft_min: u32,
    /// Drafting stops at a token the drafter is less sure of than this.
    #[arg(long = "draft-p-min", env = "FIRSTWORD_DRAFT_P_MIN", default_value_t = 0.75)]
    pub draft_p_min: f32,
    /// Draft on every step even while drafting measures slower than plain decoding (by default
    /// it then pauses, probing again every few steps); for measuring a drafter.
    #[arg(long = "spec-always", env = "FIRSTWORD_SPEC_ALWAYS")]
    pub spec_always: bool,
}

/// Where the server listens and what it accepts.
#[derive(Args)]
#[command(next_help_heading = "Server")]
pub(crate) struct ServerArgs {
    /// Address to listen on. The default keeps the server on this machine.
    #[arg(long, env = "FIRSTWORD_HOST", default_value = "127.0.0.1")]
    pub host: String,
    /// Port to listen on.
    #[arg(long, env = "FIRSTWORD_PORT", default_value_t = 8080)]
    pub port: u16,
    /// Requests that may wait while one generates; more get 503 with Retry-After.
    #[arg(long = "queue-size", env = "FIRSTWORD_QUEUE_SIZE", default_value_t = EngineConfig::DEFAULT_QUEUE_SIZE)]
    pub queue_size: usize,
    /// Requests served at once in the one context (llama-server's -np): one arriving while a
    /// reply streams starts at once, its prompt evaluated between the reply's tokens.
    #[arg(long = "parallel", visible_alias = "np", env = "FIRSTWORD_PARALLEL", default_value_t = EngineConfig::DEFAULT_PARALLEL, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub parallel: u32,
    /// Most tokens generated for a request that sets no max_tokens (-1: until the context is
    /// full). Stops a model caught in a loop.
    #[arg(short = 'n', long = "n-predict", visible_alias = "predict", env = "FIRSTWORD_N_PREDICT", default_value_t = i64::from(EngineConfig::DEFAULT_N_PREDICT), allow_negative_numbers = true, value_parser = clap::value_parser!(i64).range(-1..=i64::from(u32::MAX)))]
    pub n_predict: i64,
    /// Most tokens a model that thinks may spend on its reasoning when a request sets no
    /// reasoning_budget (-1: no limit); then the end of the reasoning is written for it and the
    /// answer starts.
    #[arg(long = "reasoning-budget", env = "FIRSTWORD_REASONING_BUDGET", default_value_t = -1, allow_negative_numbers = true, value_parser = clap::value_parser!(i64).range(-1..=i64::from(u32::MAX)))]
    pub reasoning_budget: i64,
    /// Responses of the Responses API kept in memory for previous_response_id (least recently
    /// used dropped first; 0: none kept).
    #[arg(long = "responses-store", value_name = "N", env = "FIRSTWORD_RESPONSES_STORE", default_value_t = ServeOptions::DEFAULT_RESPONSES_STORE)]
    pub responses_store: usize,
    /// Most MiB the stored responses may hold, each charged for the whole conversation it keeps
    /// (least recently used dropped first; 0: none kept).
    #[arg(long = "responses-store-mib", value_name = "MIB", env = "FIRSTWORD_RESPONSES_STORE_MIB", default_value_t = ServeOptions::DEFAULT_RESPONSES_STORE_BYTES >> 20)]
    pub responses_store_mib: usize,
    /// Require this key (`Authorization: Bearer KEY`) on every route but /health.
    #[arg(long = "api-key", value_name = "KEY", env = "FIRSTWORD_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// Require one of the keys in this file (one per line; `#` comments), like --api-key.
    #[arg(long = "api-key-file", value_name = "FILE", env = "FIRSTWORD_API_KEY_FILE")]
    pub api_key_file: Option<PathBuf>,
    /// Let browser pages of this origin call the API (CORS; repeatable; `*` for any origin).
    /// Off by default: browsers refuse cross-origin calls.
    #[arg(long = "cors-origin", value_name = "ORIGIN")]
    pub cors_origins: Vec<String>,
    /// Also serve requests addressed to this host name (repeatable; comma-separated in the
    /// variable; `*` for any). localhost, IP addresses and --host are always served; any other
    /// name gets 403, so a web page cannot reach the server by DNS rebinding. Name the machine's
    /// host names here when clients use them (`--host 0.0.0.0` on a home network).
    #[arg(long = "allowed-host", value_name = "NAME", env = "FIRSTWORD_ALLOWED_HOSTS", value_delimiter = ',')]
    pub allowed_hosts: Vec<String>,
    /// Largest request body accepted, in bytes (413 beyond it).
    #[arg(long = "max-body-bytes", value_name = "BYTES", env = "FIRSTWORD_MAX_BODY_BYTES", default_value_t = ServeOptions::DEFAULT_MAX_BODY_BYTES)]
    pub max_body_bytes: usize,
}

impl ServerArgs {
    /// The HTTP server's options: body limit, API keys (read from the key file), CORS, host names.
    ///
    /// # Errors
    /// The key file cannot be read or holds no key; a CORS origin or host name is not valid.
    pub(crate) fn serve_options(&self) -> anyhow::Result<ServeOptions> {
        let mut keys: Vec<String> = self.api_key.iter().cloned().collect();
        if let Some(path) = &self.api_key_file {
            let text =
                std::fs::read_to_string(path).map_err(|e| anyhow::anyhow!("--api-key-file {}: {e}", path.display()))?;
            let from_file = ApiKeys::parse_file(&text);
            if from_file.is_empty() {
                anyhow::bail!("--api-key-file {}: no key in it", path.display());
            }
            keys.extend(from_file);
        }
        if self.api_key.as_deref() == Some("") {
            anyhow::bail!("--api-key is empty");
        }
        let cors_origins = CorsOrigins::parse(&self.cors_origins).map_err(|e| anyhow::anyhow!("--cors-origin: {e}"))?;
        let allowed_hosts =
            AllowedHosts::parse(&self.host, &self.allowed_hosts).map_err(|e| anyhow::anyhow!("--allowed-host: {e}"))?;
        Ok(ServeOptions {
            max_body_bytes: self.max_body_bytes,
            api_keys: ApiKeys::new(keys),
            cors_origins,
            allowed_hosts,
            responses_store: self.responses_store,
            responses_store_bytes: self.responses_store_mib.saturating_mul(1 << 20),
            ..ServeOptions::default()
        })
    }
}

/// `--context-overflow`.
#[derive(Clone, Copy, ValueEnum)]
pub(crate) enum ContextOverflowArg {
    /// 400 with the prompt's tokens and the context size.
    Refuse,
    /// Leave out the oldest whole turns.
    DropOldest,
}

/// `--flash-attn`.
#[derive(Clone, Copy, ValueEnum)]
pub(crate) enum FlashAttnArg {
    /// llama.cpp decides per backend.
    Auto,
    /// Always.
    On,
    /// Never.
    Off,
}

/// `--spec`.
#[derive(Clone, Copy, ValueEnum)]
pub(crate) enum SpecArg {
    /// MTP heads if the model has them, else the draft model if given, else none.
    Auto,
    /// No speculative decoding.
    None,
    /// The model's own MTP (NextN) heads.
    Mtp,
    /// A separate draft model.
    Draft,
}

impl ServeArgs {
    /// The `--warm` files as prompts.
    ///
    /// # Errors
    /// A file that cannot be read, or JSON that is no chat-completions body.
    pub(crate) fn warm_prompts(&self) -> anyhow::Result<Vec<Prompt>> {
        self.cache
            .warm
            .iter()
            .map(|path| {
                let text = std::fs::read_to_string(path)
                    .map_err(|e| anyhow::anyhow!("--warm {}: cannot read it: {e}", path.display()))?;
                firstword::api::warm_prompt(&text).map_err(|e| anyhow::anyhow!("--warm {}: {e}", path.display()))
            })
            .collect()
    }

    /// The engine's configuration.
    pub(crate) fn engine_config(&self) -> EngineConfig {
        let defaults = EngineConfig::new(&self.model.path);
        let (model, context, speculation) = (&self.model, &self.context, &self.speculation);
        EngineConfig {
            ctx_size: context.ctx_size,
            context_overflow: match context.context_overflow {
                ContextOverflowArg::Refuse => ContextOverflow::Refuse,
                ContextOverflowArg::DropOldest => ContextOverflow::DropOldest,
            },
            threads: context.threads.unwrap_or(defaults.threads),
            threads_batch: context.threads_batch.unwrap_or(defaults.threads_batch),
            fixed_threads: context.fixed_threads,
            batch_size: context.batch_size,
            ubatch_size: context.ubatch_size,
            n_gpu_layers: model.n_gpu_layers,
            split_mode: match model.split_mode {
                SplitModeArg::None => SplitMode::None,
                SplitModeArg::Layer => SplitMode::Layer,
                SplitModeArg::Row => SplitMode::Row,
                SplitModeArg::Tensor => SplitMode::Tensor,
            },
            tensor_split: model.tensor_split.clone(),
            main_gpu: model.main_gpu,
            rpc: model.rpc.clone(),
            rpc_timeout: Duration::from_secs(model.rpc_timeout),
            repack: !model.no_repack,
            flash_attention: match context.flash_attn {
                FlashAttnArg::Auto => FlashAttention::Auto,
                FlashAttnArg::On => FlashAttention::On,
                FlashAttnArg::Off => FlashAttention::Off,
            },
            swa_full: !self.cache.swa_small,
            cache_ram_mib: self.cache.cache_ram,
            cache_min_tokens: self.cache.cache_min_tokens,
            checkpoint_every: self.cache.checkpoint_every,
            cache_dir: match (&self.cache.cache_dir, self.cache.no_cache_dir) {
                (_, true) => None,
                (Some(dir), false) => Some(dir.clone()),
                (None, false) => EngineConfig::default_cache_dir(),
            },
            cache_disk_mib: self.cache.cache_disk,
            anticipate_next_turn: !self.cache.no_anticipate,
            pregenerate: self.cache.pregenerate,
            reuse_after_change: self.cache.reuse_after_change,
            change_rules: firstword::engine::ChangeRules {
                redo: self.cache.reuse_redo,
                ..firstword::engine::ChangeRules::default()
            },
            park_for: Duration::from_secs(self.cache.park_seconds),
            next_request_grace: Duration::from_millis(self.cache.next_request_grace_ms),
            mlock: model.mlock,
            mmap: !model.no_mmap,
            chat_template_file: model.chat_template_file.clone(),
            mmproj: model.mmproj.clone(),
            queue_size: self.server.queue_size,
            parallel: self.server.parallel,
            n_predict: u32::try_from(self.server.n_predict).ok(),
            reasoning_budget: u32::try_from(self.server.reasoning_budget).ok(),
            speculation: SpeculationConfig {
                mode: match speculation.spec {
                    SpecArg::Auto => SpecMode::Auto,
                    SpecArg::None => SpecMode::None,
                    SpecArg::Mtp => SpecMode::Mtp,
                    SpecArg::Draft => SpecMode::Draft,
                },
                draft_model: speculation.draft_model.clone(),
                n_gpu_layers_draft: speculation.n_gpu_layers_draft,
                draft_max: speculation.draft_max,
                draft_min: speculation.draft_min,
                draft_p_min: speculation.draft_p_min,
                always: speculation.spec_always,
            },
            ..defaults
        }
    }
}

/// An engine error in the command line's terms: the flags to change instead of the
/// [`EngineConfig`] fields the library names.
pub(crate) fn in_flag_terms(error: &EngineError) -> String {
    match error {
        EngineError::SpeculationSetup(setup) => {
            let advice = match setup {
                SpeculationError::NoMtpLayers { model } => format!(
                    "--spec mtp: {} has no MTP (NextN) layers (no `<arch>.nextn_predict_layers` in its metadata); use --spec draft with --draft-model, or --spec none",
                    model.display()
                ),
                SpeculationError::NoDraftModel => "--spec draft needs --draft-model PATH".into(),
                SpeculationError::DraftMaxOutOfRange(max) => format!("--draft-max must be between 1 and 64, got {max}"),
                SpeculationError::DraftMinAboveMax { min, max } => {
                    format!("--draft-min ({min}) is larger than --draft-max ({max})")
                }
                SpeculationError::DraftPMinOutOfRange(p) => format!("--draft-p-min must be between 0 and 1, got {p}"),
                SpeculationError::CannotRollBack => format!("{setup}; --spec none serves it without"),
                other => other.to_string(),
            };
            format!("speculative decoding: {advice}")
        }
        EngineError::TemplateSetup(_) => format!("{error} (--chat-template-file)"),
        EngineError::CacheBudget { requested_mib, available_mib } => format!(
            "--cache-ram {requested_mib} is more than the {available_mib} MiB of memory available; lower it (0 turns the state store off)"
        ),
        EngineError::ContextCreate { .. } => format!("{error} (-c/--ctx-size sets the context size)"),
        other => other.to_string(),
    }
}
