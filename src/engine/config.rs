//! Engine configuration as plain data (the CLI maps its flags onto it).

use std::path::PathBuf;

/// Flash attention policy, as llama.cpp's `--flash-attn`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum FlashAttention {
    /// Let llama.cpp decide per backend.
    #[default]
    Auto,
    /// Always on.
    On,
    /// Always off.
    Off,
}

/// What a chat request whose conversation no longer fits the context gets.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ContextOverflow {
    /// A 400 naming the prompt's tokens and the context's size.
    #[default]
    Refuse,
    /// The oldest whole turns are left out (a tool call goes with its result; the leading
    /// system messages and the newest turn stay) until the prompt fits with room for the
    /// reply, and down to three quarters of the context when turns must go, so that the next
    /// turns of the conversation leave out the same ones and keep their cache. The response
    /// says how many messages were left out. Only the newest turn not fitting is refused.
    DropOldest,
}

/// How the offloaded layers are split over several devices, as llama.cpp's `--split-mode`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SplitMode {
    /// One device (`main_gpu`) takes them all.
    None,
    /// Whole layers (and their KV cache) per device, by the tensor split.
    #[default]
    Layer,
    /// Rows of each weight across the devices (backends that support it).
    Row,
    /// llama.cpp's tensor parallelism over the devices.
    Tensor,
}

/// Everything needed to start an [`Engine`](crate::Engine).
#[derive(Clone, Debug)]
pub struct EngineConfig {
    /// Path of the GGUF model.
    pub model_path: PathBuf,
    /// Context size in tokens; `None`: the model's training context, at most 8192.
    pub ctx_size: Option<u32>,
    /// Threads for generation (one token at a time).
    pub threads: u32,
    /// Threads for prompt evaluation.
    pub threads_batch: u32,
    /// Keep `threads` and `threads_batch` whatever else runs; otherwise (the default) they are
    /// the most llama.cpp uses, and it uses fewer while other processes keep cores busy
    /// (Linux): its spinning workers collapse when a core they need is taken.
    pub fixed_threads: bool,
    /// Logical batch: most prompt tokens submitted per decode call.
    pub batch_size: u32,
    /// Physical batch: most tokens llama.cpp computes at once.
    pub ubatch_size: u32,
    /// Layers offloaded to the GPU (ignored by CPU builds).
    pub n_gpu_layers: u32,
    /// How the offloaded layers are split over the devices.
    pub split_mode: SplitMode,
    /// Each device's share of the offloaded layers, in the devices' order (the RPC servers
    /// first, then the local GPUs); empty: by their free memory, as llama.cpp does.
    pub tensor_split: Vec<f32>,
    /// The device used with [`SplitMode::None`], an index in that order.
    pub main_gpu: u32,
    /// Let the CPU keep some weights in repacked layouts its kernels compute faster with
    /// (llama.cpp's default; `--no-repack` turns it off). An RPC server's CPU never repacks, so
    /// a model split over one computes those weights as a local `--no-repack` run does.
    pub repack: bool,
    /// llama.cpp RPC servers whose devices take layers (llama.cpp's `--rpc`), checked and
    /// connected at start.
    pub rpc: Vec<super::RpcEndpoint>,
    /// How long a llama.cpp call may wait on the RPC servers per micro-batch (or per 256 MiB
    /// of a state copy) before the process ends, naming them: a server that stops answering
    /// without closing its connection would otherwise hold every request forever.
    pub rpc_timeout: std::time::Duration,
    /// Flash attention policy.
    pub flash_attention: FlashAttention,
    /// Keep the full-size KV cache for sliding-window layers, so any cut of the prompt can be
    /// reused. Off saves memory on SWA models but forces a full prefill when a cut falls outside
    /// the window.
    pub swa_full: bool,
    /// Lock the model in RAM.
    pub mlock: bool,
    /// Memory-map the model file (faster start, pages shared with the page cache).
    pub mmap: bool,
    /// A Jinja chat template overriding the one in the GGUF.
    pub chat_template_file: Option<PathBuf>,
    /// A multimodal projector (llama.cpp's `mmproj` GGUF) for image and audio input.
    pub mmproj: Option<PathBuf>,
    /// How many requests may wait while one is generating.
    pub queue_size: usize,
    /// Sequences the one context serves at once: a request arriving while a reply streams is
    /// evaluated beside it instead of waiting (1: one at a time).
    pub parallel: u32,
    /// Reuse the cache past short changed spans near a prompt's start (a clock line), an
    /// approximation ([`crate::engine::ChangeRules`], docs/cache.md): the default for requests
    /// that do not say. With one sequence, the context gets a spare one for it.
    pub reuse_after_change: bool,
    /// The limits of a reuse past changes, whenever one is made.
    pub change_rules: super::ChangeRules,
    /// What a chat request that does not fit the context gets.
    pub context_overflow: ContextOverflow,
    /// Most tokens generated for a request that sets no `max_tokens`; `None`: until the
    /// context is full.
    pub n_predict: Option<u32>,
    /// Most tokens a model that thinks may spend on its reasoning when a request sets no
    /// budget of its own; `None`: no limit.
    pub reasoning_budget: Option<u32>,
    /// Speculative decoding (MTP heads or a draft model).
    pub speculation: super::SpeculationConfig,
    /// Host RAM, in MiB, for the KV states of other prompts (the state store): a request with
    /// another prefix no longer costs the conversation its cache. 0 turns the store off. More
    /// than the memory available at start-up is refused, except the default, which is then
    /// lowered to half of it.
    pub cache_ram_mib: u64,
    /// Shortest cached sequence worth saving to the store before another prefix takes over
    /// (and shortest prompt worth a checkpoint).
    pub cache_min_tokens: u32,
    /// For models whose cache cannot be cut everywhere (recurrent and hybrid ones, a
    /// sliding window with the small SWA cache): a checkpoint every this many tokens of a
    /// long prefill, besides the one at each prompt's end; 0: only at the end.
    pub checkpoint_every: u32,
    /// The disk cache's directory: sequence states kept across restarts (the first turn after
    /// one is warm). `None`: no disk cache (the library's default; the command line's is the
    /// platform cache directory, see [`EngineConfig::default_cache_dir`]).
    pub cache_dir: Option<PathBuf>,
    /// The disk cache's budget in MiB, for the whole directory (least recently used files go
    /// first).
    pub cache_disk_mib: u64,
    /// Prompts prefilled at start, before the engine reports ready (a long system prompt the
    /// first request will share): that request is then cached. See
    /// [`crate::api::warm_prompt`] for reading them from chat-completions JSON or text.
    pub warm: Vec<super::Prompt>,
    /// After a chat reply, evaluate what the template writes before the next user's words
    /// (the end of the assistant turn, the user turn's opening), so the next turn prefills
    /// only those words. Off for recurrent models, whose cache could not cut it when the next
    /// request is of another shape.
    pub anticipate_next_turn: bool,
    /// How long the engine waits with nothing to do after a reply before it copies the
    /// conversation for the disk cache: the user is reading or listening, and a tool result or
    /// the next partial transcript, which come sooner, never wait for the copy.
    pub persist_after_idle: std::time::Duration,
    /// Reply tokens a prefill generates after its prompt and parks for the request that
    /// follows, when the prefill does not say ([`crate::GenerationRequest::pregenerate`]); 0:
    /// none.
    pub pregenerate: u32,
    /// How long parked reply tokens wait for their request.
    pub park_for: std::time::Duration,
    /// How long the engine waits after a reply, before it readies the cache for the
    /// conversation's next turn, for a request sent right after it (an automation, a title
    /// request, another satellite): one that comes in that time is served first, and the
    /// preparation (up to a batch of the reply's tail evaluated again) is skipped, since a turn
    /// of the same conversation evaluates that tail itself. Zero: the preparation always runs
    /// first (the library's default, so that turns sent back to back cache the same way
    /// whatever the timing; the command line's is [`Self::DEFAULT_NEXT_REQUEST_GRACE`]).
    pub next_request_grace: std::time::Duration,
}

impl EngineConfig {
    /// Default logical batch size (llama-server's).
    pub const DEFAULT_BATCH_SIZE: u32 = 2048;
    /// Default physical batch size (llama-server's).
    pub const DEFAULT_UBATCH_SIZE: u32 = 512;
    /// Default GPU layers: all of them (ignored by CPU builds).
    pub const DEFAULT_N_GPU_LAYERS: u32 = 999;
    /// Default number of requests that may wait.
    pub const DEFAULT_QUEUE_SIZE: usize = 16;
    /// Default sequences served at once (llama-server's default slots).
    pub const DEFAULT_PARALLEL: u32 = 4;
    /// Default cap on generated tokens when a request sets none: a model caught in a loop
    /// stops after about half a minute at small-model speeds instead of filling the context.
    pub const DEFAULT_N_PREDICT: u32 = 2048;
    /// Default state-store budget in MiB (llama-server's `--cache-ram` is 8192; a 4K-token
    /// state of a small model is tens of MiB).
    pub const DEFAULT_CACHE_RAM_MIB: u64 = 2048;
    /// Default shortest sequence worth saving to the state store.
    pub const DEFAULT_CACHE_MIN_TOKENS: u32 = 256;
    /// Default disk cache budget in MiB.
    pub const DEFAULT_CACHE_DISK_MIB: u64 = 4096;
    /// Default tokens between checkpoints of a long prefill: a 4–8K system prompt gets one
    /// inside it, so an edit after its first 4K tokens still keeps those.
    pub const DEFAULT_CHECKPOINT_EVERY: u32 = 4096;
    /// Default reply tokens a prefill generates ahead: about the first sentence of a spoken
    /// answer, which a voice pipeline can start speaking at once.
    pub const DEFAULT_PREGENERATE: u32 = 16;
    /// Default time parked reply tokens wait for their request: longer than a voice pipeline's
    /// end-of-turn silence.
    pub const DEFAULT_PARK_FOR: std::time::Duration = std::time::Duration::from_secs(10);
    /// The command line's wait for a request sent right after a reply
    /// ([`Self::next_request_grace`]): longer than a local client takes to read a reply's end
    /// and send its next request, far shorter than a person's next turn.
    pub const DEFAULT_NEXT_REQUEST_GRACE: std::time::Duration = std::time::Duration::from_millis(50);
    /// Default wait on the RPC servers per micro-batch: far longer than a GPU or a CPU takes
    /// for 512 tokens of any model that fits a home machine.
    pub const DEFAULT_RPC_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);
    /// Default idle time after a reply before the conversation is copied for the disk cache.
    pub const DEFAULT_PERSIST_AFTER_IDLE: std::time::Duration = std::time::Duration::from_secs(1);

    /// Defaults for a model path: sizes like llama-server's, threads = physical cores.
    #[must_use]
    pub fn new(model_path: impl Into<PathBuf>) -> Self {
        let cores = physical_cores();
        Self {
            model_path: model_path.into(),
            ctx_size: None,
            threads: cores,
            threads_batch: cores,
            fixed_threads: false,
            batch_size: Self::DEFAULT_BATCH_SIZE,
            ubatch_size: Self::DEFAULT_UBATCH_SIZE,
            n_gpu_layers: Self::DEFAULT_N_GPU_LAYERS,
            split_mode: SplitMode::Layer,
            tensor_split: Vec::new(),
            main_gpu: 0,
            repack: true,
            rpc: Vec::new(),
            rpc_timeout: Self::DEFAULT_RPC_TIMEOUT,
            flash_attention: FlashAttention::Auto,
            swa_full: true,
            mlock: false,
            mmap: true,
            chat_template_file: None,
            mmproj: None,
            queue_size: Self::DEFAULT_QUEUE_SIZE,
            parallel: Self::DEFAULT_PARALLEL,
            reuse_after_change: false,
            change_rules: super::ChangeRules::default(),
            context_overflow: ContextOverflow::Refuse,
            n_predict: Some(Self::DEFAULT_N_PREDICT),
            reasoning_budget: None,
            speculation: super::SpeculationConfig::default(),
            cache_ram_mib: Self::DEFAULT_CACHE_RAM_MIB,
            cache_min_tokens: Self::DEFAULT_CACHE_MIN_TOKENS,
            checkpoint_every: Self::DEFAULT_CHECKPOINT_EVERY,
            cache_dir: None,
            cache_disk_mib: Self::DEFAULT_CACHE_DISK_MIB,
            warm: Vec::new(),
            anticipate_next_turn: true,
            persist_after_idle: Self::DEFAULT_PERSIST_AFTER_IDLE,
            pregenerate: Self::DEFAULT_PREGENERATE,
            park_for: Self::DEFAULT_PARK_FOR,
            next_request_grace: std::time::Duration::ZERO,
        }
    }

    /// The platform's cache directory for firstword (`$XDG_CACHE_HOME/firstword` or
    /// `~/.cache/firstword` on Linux, `~/Library/Caches/firstword` on macOS); `None` where
    /// there is none.
    #[must_use]
    pub fn default_cache_dir() -> Option<PathBuf> {
        dirs::cache_dir().map(|dir| dir.join("firstword"))
    }
}

/// Number of physical CPU cores (hyper-threads share execution units, which hurts llama.cpp's
/// spinning worker threads); falls back to the logical count where it cannot tell.
#[must_use]
pub fn physical_cores() -> u32 {
    let logical = std::thread::available_parallelism().map_or(1, |n| n.get() as u32);
    let Ok(cpuinfo) = std::fs::read_to_string("/proc/cpuinfo") else { return logical };
    let mut cores = std::collections::HashSet::new();
    let mut physical_id = "";
    for line in cpuinfo.lines() {
        if let Some((key, value)) = line.split_once(':') {
            match key.trim() {
                "physical id" => physical_id = value.trim(),
                "core id" => {
                    cores.insert((physical_id.to_string(), value.trim().to_string()));
                }
                _ => {}
            }
        }
    }
    if cores.is_empty() {
        logical
    } else {
        (cores.len() as u32).min(logical).max(1)
    }
}
