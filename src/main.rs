//! The `firstword` command line: parses flags, sets up logging, starts the engine and serves.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::LazyLock;

use clap::{Args, Parser, Subcommand, ValueEnum};
use firstword::engine::{EngineConfig, FlashAttention, SpecMode, SpeculationConfig, LLAMA_CPP_BUILD};
use firstword::Engine;
use tracing_subscriber::EnvFilter;

/// `firstword --version`: this crate's version and the llama.cpp it links.
static VERSION: LazyLock<String> = LazyLock::new(|| format!("{} ({LLAMA_CPP_BUILD})", env!("CARGO_PKG_VERSION")));

/// Lowest time-to-first-token local inference behind an OpenAI-compatible API.
#[derive(Parser)]
#[command(version = VERSION.as_str())]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve a GGUF model over the OpenAI chat-completions API.
    Serve(ServeArgs),
    /// Measure cold/warm TTFT, tool calls, decode speed and an interleaved job on any
    /// OpenAI-compatible servers, side by side, and decide between them.
    Bench(BenchArgs),
}

#[derive(Args)]
struct BenchArgs {
    /// Server base URL (repeat to compare servers; they run in turn each repetition).
    #[arg(long = "url", required = true)]
    urls: Vec<String>,
    /// Names for the servers, in --url order [default: the URLs].
    #[arg(long = "name")]
    names: Vec<String>,
    /// Process ids of the servers, in --url order, to report their peak memory.
    #[arg(long = "pid")]
    pids: Vec<u32>,
    /// Size of the generated system prompt, in tokens (approximate).
    #[arg(long = "system-tokens", default_value_t = 4000, conflicts_with = "system_prompt_file")]
    system_tokens: usize,
    /// Use this file as the system prompt instead.
    #[arg(long = "system-prompt-file")]
    system_prompt_file: Option<PathBuf>,
    /// Conversation turns (the first is cold).
    #[arg(long, default_value_t = 5)]
    turns: u32,
    /// Repetitions.
    #[arg(long, default_value_t = 3)]
    reps: u32,
    /// Tokens generated per conversation turn.
    #[arg(long = "turn-tokens", default_value_t = 32)]
    turn_tokens: u32,
    /// Tokens generated in the decode-speed scenarios.
    #[arg(long = "decode-tokens", default_value_t = 128)]
    decode_tokens: u32,
    /// `model` sent in requests.
    #[arg(long, default_value = "default")]
    model: String,
    /// Write one CSV row per request here.
    #[arg(long)]
    csv: Option<PathBuf>,
    /// Draw TTFT per turn per server into this SVG file.
    #[arg(long)]
    plot: Option<PathBuf>,
    /// Also print a weighted score, e.g. quality=0.4,decode=0.25,ttft=0.2,rss=0.15.
    #[arg(long)]
    weights: Option<firstword::bench::Weights>,
    /// Per-request timeout in seconds.
    #[arg(long, default_value_t = 600)]
    timeout: u64,
}

impl BenchArgs {
    fn config(&self) -> anyhow::Result<firstword::bench::BenchConfig> {
        let system_prompt = match &self.system_prompt_file {
            Some(path) => std::fs::read_to_string(path).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?,
            None => firstword::bench::synthetic_system_prompt(self.system_tokens),
        };
        let targets = self
            .urls
            .iter()
            .enumerate()
            .map(|(i, url)| firstword::bench::Target {
                name: self.names.get(i).cloned().unwrap_or_else(|| url.clone()),
                url: url.clone(),
                pid: self.pids.get(i).copied(),
            })
            .collect();
        Ok(firstword::bench::BenchConfig {
            targets,
            system_prompt,
            turns: self.turns.max(1),
            reps: self.reps.max(1),
            model: self.model.clone(),
            turn_tokens: self.turn_tokens,
            decode_tokens: self.decode_tokens,
            timeout: std::time::Duration::from_secs(self.timeout),
        })
    }
}

#[tokio::main]
async fn bench(args: &BenchArgs) -> anyhow::Result<()> {
    let config = args.config()?;
    let outputs = firstword::bench::Outputs { csv: args.csv.clone(), plot: args.plot.clone(), weights: args.weights };
    firstword::bench::execute(&config, &outputs).await.map_err(|e| anyhow::anyhow!(e))
}

#[derive(Clone, Copy, ValueEnum)]
enum FlashAttnArg {
    Auto,
    On,
    Off,
}

#[derive(Clone, Copy, ValueEnum)]
enum SpecArg {
    Auto,
    None,
    Mtp,
    Draft,
}

#[derive(Args)]
struct ServeArgs {
    /// Path of the GGUF model to serve.
    #[arg(short = 'm', long = "model", env = "FIRSTWORD_MODEL")]
    model: PathBuf,
    /// Address to listen on. The default keeps the server on this machine.
    #[arg(long, env = "FIRSTWORD_HOST", default_value = "127.0.0.1")]
    host: String,
    /// Port to listen on.
    #[arg(long, env = "FIRSTWORD_PORT", default_value_t = 8080)]
    port: u16,
    /// Context size in tokens [default: the model's training context, at most 8192].
    #[arg(short = 'c', long = "ctx-size", env = "FIRSTWORD_CTX_SIZE")]
    ctx_size: Option<u32>,
    /// Threads for generation [default: physical cores].
    #[arg(short = 't', long, env = "FIRSTWORD_THREADS")]
    threads: Option<u32>,
    /// Threads for prompt evaluation [default: physical cores].
    #[arg(long = "threads-batch", env = "FIRSTWORD_THREADS_BATCH")]
    threads_batch: Option<u32>,
    /// Logical batch size: most prompt tokens per decode call.
    #[arg(short = 'b', long = "batch-size", env = "FIRSTWORD_BATCH_SIZE", default_value_t = EngineConfig::DEFAULT_BATCH_SIZE)]
    batch_size: u32,
    /// Physical batch size: most tokens computed at once.
    #[arg(long = "ubatch-size", visible_alias = "ub", env = "FIRSTWORD_UBATCH_SIZE", default_value_t = EngineConfig::DEFAULT_UBATCH_SIZE)]
    ubatch_size: u32,
    /// Layers to offload to the GPU (GPU builds only).
    #[arg(long = "n-gpu-layers", visible_alias = "ngl", env = "FIRSTWORD_N_GPU_LAYERS", default_value_t = EngineConfig::DEFAULT_N_GPU_LAYERS)]
    n_gpu_layers: u32,
    /// Flash attention: on, off, or auto (llama.cpp decides per backend).
    #[arg(long = "flash-attn", visible_alias = "fa", env = "FIRSTWORD_FLASH_ATTN", value_enum, default_value = "auto")]
    flash_attn: FlashAttnArg,
    /// For sliding-window models, keep a small window-sized KV cache instead of a full one.
    /// Saves memory; a turn that edits text older than the window is then prefilled in full.
    #[arg(long = "swa-small", env = "FIRSTWORD_SWA_SMALL")]
    swa_small: bool,
    /// Lock the model in RAM (no swapping).
    #[arg(long, env = "FIRSTWORD_MLOCK")]
    mlock: bool,
    /// Read the model into memory instead of memory-mapping it.
    #[arg(long = "no-mmap", env = "FIRSTWORD_NO_MMAP")]
    no_mmap: bool,
    /// Jinja chat template to use instead of the one in the GGUF.
    #[arg(long = "chat-template-file", env = "FIRSTWORD_CHAT_TEMPLATE_FILE")]
    chat_template_file: Option<PathBuf>,
    /// Requests that may wait while one generates; more get 503 with Retry-After.
    #[arg(long = "queue-size", env = "FIRSTWORD_QUEUE_SIZE", default_value_t = EngineConfig::DEFAULT_QUEUE_SIZE)]
    queue_size: usize,
    /// Most tokens generated for a request that sets no max_tokens (-1: until the context is
    /// full). Stops a model caught in a loop.
    #[arg(short = 'n', long = "n-predict", visible_alias = "predict", env = "FIRSTWORD_N_PREDICT", default_value_t = i64::from(EngineConfig::DEFAULT_N_PREDICT), allow_negative_numbers = true, value_parser = clap::value_parser!(i64).range(-1..=i64::from(u32::MAX)))]
    n_predict: i64,
    /// Speculative decoding: auto (the model's MTP heads if the GGUF has NextN layers, else
    /// --draft-model if given, else none), none, mtp, or draft.
    #[arg(long, env = "FIRSTWORD_SPEC", value_enum, default_value = "auto")]
    spec: SpecArg,
    /// A smaller model with the same vocabulary that drafts tokens for the served one.
    #[arg(long = "draft-model", visible_alias = "md", env = "FIRSTWORD_DRAFT_MODEL")]
    draft_model: Option<PathBuf>,
    /// Layers of the draft model to offload to the GPU (GPU builds only).
    #[arg(long = "n-gpu-layers-draft", visible_alias = "ngld", env = "FIRSTWORD_N_GPU_LAYERS_DRAFT", default_value_t = EngineConfig::DEFAULT_N_GPU_LAYERS)]
    n_gpu_layers_draft: u32,
    /// Most tokens drafted per step [default: 3 with MTP heads, 16 with a draft model]; the
    /// depth verified adapts to the acceptance rate below it.
    #[arg(long = "draft-max", env = "FIRSTWORD_DRAFT_MAX")]
    draft_max: Option<u32>,
    /// Fewest drafted tokens worth verifying.
    #[arg(long = "draft-min", env = "FIRSTWORD_DRAFT_MIN", default_value_t = 0)]
    draft_min: u32,
    /// Drafting stops at a token the drafter is less sure of than this.
    #[arg(long = "draft-p-min", env = "FIRSTWORD_DRAFT_P_MIN", default_value_t = 0.75)]
    draft_p_min: f32,
    /// Draft on every step even while drafting measures slower than plain decoding (by default
    /// it then pauses, probing again every few steps); for measuring a drafter.
    #[arg(long = "spec-always", env = "FIRSTWORD_SPEC_ALWAYS")]
    spec_always: bool,
}

impl ServeArgs {
    fn engine_config(&self) -> EngineConfig {
        let defaults = EngineConfig::new(&self.model);
        EngineConfig {
            ctx_size: self.ctx_size,
            threads: self.threads.unwrap_or(defaults.threads),
            threads_batch: self.threads_batch.unwrap_or(defaults.threads_batch),
            batch_size: self.batch_size,
            ubatch_size: self.ubatch_size,
            n_gpu_layers: self.n_gpu_layers,
            flash_attention: match self.flash_attn {
                FlashAttnArg::Auto => FlashAttention::Auto,
                FlashAttnArg::On => FlashAttention::On,
                FlashAttnArg::Off => FlashAttention::Off,
            },
            swa_full: !self.swa_small,
            mlock: self.mlock,
            mmap: !self.no_mmap,
            chat_template_file: self.chat_template_file.clone(),
            queue_size: self.queue_size,
            n_predict: u32::try_from(self.n_predict).ok(),
            speculation: SpeculationConfig {
                mode: match self.spec {
                    SpecArg::Auto => SpecMode::Auto,
                    SpecArg::None => SpecMode::None,
                    SpecArg::Mtp => SpecMode::Mtp,
                    SpecArg::Draft => SpecMode::Draft,
                },
                draft_model: self.draft_model.clone(),
                n_gpu_layers_draft: self.n_gpu_layers_draft,
                draft_max: self.draft_max,
                draft_min: self.draft_min,
                draft_p_min: self.draft_p_min,
                always: self.spec_always,
            },
            ..defaults
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // llama.cpp's own log is routed into tracing under `llama-cpp-2`; quiet unless asked for.
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info,llama-cpp-2=warn"));
    tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).init();
    let result = match &cli.command {
        Command::Serve(args) => serve(args),
        Command::Bench(args) => bench(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e:#}");
            ExitCode::FAILURE
        }
    }
}

#[tokio::main]
async fn serve(args: &ServeArgs) -> anyhow::Result<()> {
    let address: SocketAddr = tokio::net::lookup_host((args.host.as_str(), args.port))
        .await?
        .next()
        .ok_or_else(|| anyhow::anyhow!("cannot resolve {}", args.host))?;
    let listener =
        tokio::net::TcpListener::bind(address).await.map_err(|e| anyhow::anyhow!("cannot listen on {address}: {e}"))?;
    let address = listener.local_addr()?;
    // Listen first, so /health answers 503 while the model loads.
    let engine = Engine::spawn(args.engine_config());
    let mut server = tokio::spawn(firstword::api::serve(listener, engine.clone(), shutdown_signal(engine.clone())));
    let info = tokio::select! {
        info = engine.wait_ready() => info?,
        served = &mut server => return served?.map_err(Into::into),
    };
    tracing::info!(
        "firstword {} ready: model {} (arch {}), context {} tokens{}, template {}, tool calls {}, threads {}/{} (gen/batch), {}, listening on http://{address}",
        env!("CARGO_PKG_VERSION"),
        args.model.display(),
        info.architecture,
        info.n_ctx,
        info.n_swa.map_or(String::new(), |n| format!(", sliding window {n}")),
        info.template_source,
        info.tool_format.name(),
        info.threads,
        info.threads_batch,
        LLAMA_CPP_BUILD,
    );
    // The server ends after a shutdown signal, once open responses have closed.
    server.await??;
    // Let llama.cpp finish its last step before the process exits.
    engine.shutdown();
    tokio::task::spawn_blocking(move || engine.wait_stopped()).await?;
    tracing::info!("stopped");
    Ok(())
}

/// Resolves on Ctrl-C or SIGTERM, after telling the engine to end running generations.
async fn shutdown_signal(engine: Engine) {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {},
        () = terminate => {},
    }
    tracing::info!("shutting down: ending running generations, refusing new requests");
    engine.shutdown();
}
