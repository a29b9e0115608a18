//! The inference engine: one thread owns llama.cpp's model and its one long-lived context.
//!
//! Callers hold a cheap, clonable [`Engine`] handle. [`Engine::submit`] renders the prompt,
//! queues the request (bounded FIFO) and returns a [`Generation`]: a stream of [`Event`]s. The
//! inference thread reuses the longest token prefix its KV cache shares with each new prompt and
//! prefills only the rest. Dropping a `Generation` cancels it at the next token.

mod config;
mod decoder;
mod disk;
mod error;
mod exit;
mod ffi;
mod handles;
mod llama_log;
mod load;
mod logprobs;
pub mod media;
mod policy;
mod prefix;
mod queue;
mod remote;
mod reply;
mod request;
mod request_path;
mod runs;
mod sampling;
mod schedule;
mod sequence;
mod speculation;
mod stall;
mod store;
mod text;
mod threads;
mod token_memo;
mod tokenizer;
mod worker;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::{Condvar, Mutex};
use tokio::sync::{mpsc as tokio_mpsc, oneshot, Notify};

use crate::chat::tools::ToolFormat;
use crate::chat::{ChatFormat, Landmarks};
pub use crate::chat::{Grammar, ReasoningFormat, TemplateSource};
pub(crate) use media::projector::PreparedMedia;
use queue::{Admission, QueuedPrefill};
use tokenizer::Tokenizer;

pub use config::{physical_cores, ContextOverflow, EngineConfig, FlashAttention, SplitMode};
pub use error::{EngineError, SpeculationError};
pub use handles::{EngineLoad, Generation, PendingPrefill};
pub use policy::ChangeRules;
pub use remote::{private_address, probe, serve_rpc, DeviceInfo, RpcEndpoint, RpcProbeError, RpcServerOptions};
pub use request::{
    CacheEntryKind, CacheEntryStatus, CacheMiss, CacheReport, CacheSource, CacheStatus, Candidate, ChangedSpanReport,
    ChangesReport, DiskStatus, DraftStats, Event, FinishReason, GenerationRequest, KeptStatus, LaneCounts,
    ParkingCounts, PrefillReport, Prompt, ReplyCut, SharedSteps, Timings, TokenLogprob, Usage, CEILING_MIN_ROOM,
    MAX_PREGENERATE, MAX_TOP_LOGPROBS,
};
pub(crate) use request_path::RequestClock;
pub use request_path::RequestPath;
pub use sampling::SamplingParams;
pub use speculation::{SpecMode, SpeculationConfig};
pub use threads::{ThreadCounts, ThreadsInUse};
pub(crate) use worker::panic_message;

/// Stack reserved for every thread that tokenizes: some pre-tokenizers fall back to
/// `std::regex`, which recurses once per character of a match (10,000 spaces overflow a 2 MiB
/// stack). Reserved address space, not memory used.
pub(crate) const LARGE_STACK_BYTES: usize = 256 << 20;

/// The linked llama.cpp, as vendored by the pinned `llama-cpp-sys-2` crate.
pub const LLAMA_CPP_BUILD: &str = "llama.cpp vendored by llama-cpp-sys-2 0.1.160";

/// Facts about the loaded model and context.
#[derive(Clone, Debug)]
pub struct ModelInfo {
    /// Model name shown to clients (the file name without `.gguf`).
    pub id: String,
    /// `general.architecture`.
    pub architecture: String,
    /// Context size of the live context.
    pub n_ctx: u32,
    /// Context size the model was trained with.
    pub n_ctx_train: u32,
    /// Vocabulary size.
    pub n_vocab: i32,
    /// Sliding-window size, for models with sliding-window attention.
    pub n_swa: Option<u32>,
    /// Where the chat template came from.
    pub template_source: TemplateSource,
    /// The tool-call format of the chat template.
    pub tool_format: ToolFormat,
    /// The markers the chat template writes around the model's reasoning; `None` for models
    /// that do not think.
    pub reasoning: Option<ReasoningFormat>,
    /// Generation threads.
    pub threads: u32,
    /// Prompt-evaluation threads.
    pub threads_batch: u32,
    /// The media the projector (`--mmproj`) takes; none without one.
    pub media: media::MediaSupport,
    /// The model's parameters (weights), as llama.cpp counts them.
    pub n_params: u64,
    /// Bytes of the model's tensors.
    pub size_bytes: u64,
    /// `general.file_type`: llama.cpp's number for the quantization, when the file says.
    pub file_type: Option<u32>,
    /// The devices the model may use: the CPU, then those that take offloaded layers (the RPC
    /// servers' first), with their memory after loading.
    pub devices: Vec<DeviceInfo>,
}

/// A loaded model's facts plus what rendering and tokenizing need.
struct Loaded {
    info: ModelInfo,
    chat: Arc<ChatFormat>,
    tokenizer: Tokenizer,
    /// Prepares media off the inference thread (with a projector).
    media: Option<Arc<media::projector::MediaPreparer>>,
}

impl std::fmt::Debug for Loaded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Loaded").field("info", &self.info).finish_non_exhaustive()
    }
}

impl Loaded {
    /// Renders chat prompts through the model's chat format, with where their parts lie;
    /// other prompts pass through (and have no parts).
    fn render(&self, prompt: &Prompt) -> Result<(worker::PromptInput, Landmarks), EngineError> {
        worker::render_prompt(&self.chat, prompt)
    }
}

#[derive(Debug)]
enum LoadState {
    Loading,
    Ready(Arc<Loaded>),
    Failed(EngineError),
    /// The inference thread stopped after serving began, for this reason.
    Died(String),
}

/// What the inference thread is asked to do, in queue order.
enum Command {
    Generate(Box<Job>),
    /// A job that only evaluates its prompt (gone when a newer one replaced it meanwhile).
    Prefill(Arc<QueuedPrefill>),
    /// Answered once everything queued before it has been served.
    Idle(mpsc::Sender<()>),
}

/// A queued request: tokens or text to evaluate, and where its events go.
struct Job {
    prompt: worker::PromptInput,
    /// Where a prefill's report goes (prefill jobs only; failures go to `events`).
    report: Option<oneshot::Sender<PrefillReport>>,
    /// Where the prompt's parts lie, to explain a cache miss.
    landmarks: Landmarks,
    request: GenerationRequest,
    events: tokio_mpsc::UnboundedSender<Event>,
    /// Set by [`Generation::finish_now`].
    finish_requested: Arc<AtomicBool>,
    /// The request's clock on its way to llama.cpp (requests that came through the API).
    clock: Option<RequestClock>,
    /// Its media, decoded and tokenized before it was queued.
    media: PreparedMedia,
    /// Counts the job as admitted until it is served or dropped.
    _admitted: Admission,
}

struct Shared {
    state: Mutex<LoadState>,
    state_changed: Condvar,
    state_notify: Notify,
    commands: queue::Sender,
    queue_size: usize,
    /// Generations admitted and not yet finished (the running one included).
    admitted: Arc<AtomicUsize>,
    signals: Arc<Signals>,
    worker: Mutex<Option<std::thread::JoinHandle<()>>>,
}

/// What the handles and the inference thread both read and write.
#[derive(Default)]
struct Signals {
    /// Set once: stop serving.
    shutting_down: AtomicBool,
    /// What the cache holds, as the inference thread last published it.
    cache_status: Mutex<CacheStatus>,
    /// The disk writer's counters, read live (set once the disk cache is open).
    disk_counters: Mutex<Option<disk::DiskCounters>>,
    /// Generation jobs queued and not taken by the inference thread yet: a running prefill
    /// yields to them.
    waiting_generations: AtomicUsize,
    /// The threads llama.cpp computes with now.
    threads: Arc<threads::PublishedThreads>,
}

impl Shared {
    /// Joins the inference thread if it ends by `deadline` (polled: a join cannot time out);
    /// leaves it running otherwise, and when called on it.
    fn join_worker_by(&self, deadline: std::time::Instant) {
        let mut worker = self.worker.lock();
        let Some(handle) = worker.as_ref() else { return };
        if handle.thread().id() == std::thread::current().id() {
            return;
        }
        while !handle.is_finished() && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        if handle.is_finished() {
            if let Some(handle) = worker.take() {
                let _ = handle.join();
            }
        }
    }
}

impl Drop for Shared {
    /// The last handle is gone: stop the inference thread and wait for it, so llama.cpp is idle
    /// (and its memory freed) before the caller goes on, e.g. to exit the process.
    fn drop(&mut self) {
        self.signals.shutting_down.store(true, Ordering::Relaxed);
        if let Some(worker) = self.worker.get_mut().take() {
            if worker.thread().id() != std::thread::current().id() {
                let _ = worker.join();
            }
        }
    }
}

/// Handle to the inference thread. Cheap to clone; the thread stops when the last handle is
/// dropped or [`Engine::shutdown`] is called.
#[derive(Clone)]
pub struct Engine {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine").field("state", &*self.shared.state.lock()).finish()
    }
}

impl Engine {
    /// Starts the inference thread and returns at once; the model loads in the background.
    /// Use [`Engine::wait_ready`] (async) or [`Engine::wait_ready_blocking`].
    ///
    /// # Panics
    /// If the OS cannot start a thread.
    #[must_use]
    pub fn spawn(config: EngineConfig) -> Self {
        // Admission bounds the jobs; the channel also holds the entries of prefills replaced
        // after a generation was queued behind them (at most one per queued generation).
        let (commands, command_rx) = mpsc::sync_channel(2 * config.queue_size + 2);
        let shared = Arc::new(Shared {
            state: Mutex::new(LoadState::Loading),
            state_changed: Condvar::new(),
            state_notify: Notify::new(),
            commands: queue::Sender::new(commands, config.queue_size),
            queue_size: config.queue_size,
            admitted: Arc::new(AtomicUsize::new(0)),
            signals: Arc::new(Signals::default()),
            worker: Mutex::new(None),
        });
        let reporter = Arc::downgrade(&shared);
        let died_reporter = Arc::downgrade(&shared);
        let signals = Arc::clone(&shared.signals);
        let worker = std::thread::Builder::new()
            .name("firstword-inference".into())
            .stack_size(LARGE_STACK_BYTES)
            .spawn(move || {
                let report = move |result: Result<worker::Ready, EngineError>| {
                    if let Some(shared) = reporter.upgrade() {
                        if result.is_ok() {
                            exit::hook_after_load();
                        }
                        *shared.state.lock() = match result {
                            Ok((info, chat, tokenizer, media)) => {
                                LoadState::Ready(Arc::new(Loaded { info, chat, tokenizer, media }))
                            }
                            Err(e) => LoadState::Failed(e),
                        };
                        shared.state_changed.notify_all();
                        shared.state_notify.notify_waiters();
                    }
                };
                // A panic the worker could not recover from (or one outside any request) ends
                // the thread; the handles then answer `EngineDied`.
                let served = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    worker::run(&config, report, &command_rx, &signals)
                }));
                let died = served.unwrap_or_else(|panic| Err(worker::panic_message(&*panic)));
                if let (Err(reason), Some(shared)) = (died, died_reporter.upgrade()) {
                    tracing::error!("the inference thread stopped: {reason}");
                    *shared.state.lock() = LoadState::Died(reason);
                    shared.state_changed.notify_all();
                    shared.state_notify.notify_waiters();
                }
            })
            .expect("spawn the inference thread");
        *shared.worker.lock() = Some(worker);
        exit::track(&shared);
        Self { shared }
    }

    /// Starts the engine and blocks until the model is loaded.
    ///
    /// # Errors
    /// The load failure: missing or corrupt model, context too large for memory, no template.
    pub fn start(config: EngineConfig) -> Result<Self, EngineError> {
        let engine = Self::spawn(config);
        engine.wait_ready_blocking()?;
        Ok(engine)
    }

    /// Blocks until the model is loaded.
    ///
    /// # Errors
    /// The load failure.
    pub fn wait_ready_blocking(&self) -> Result<ModelInfo, EngineError> {
        let mut state = self.shared.state.lock();
        loop {
            match &*state {
                LoadState::Loading => self.shared.state_changed.wait(&mut state),
                LoadState::Ready(loaded) => return Ok(loaded.info.clone()),
                LoadState::Failed(e) => return Err(e.clone()),
                LoadState::Died(reason) => return Err(EngineError::EngineDied(reason.clone())),
            }
        }
    }

    /// Waits until the model is loaded.
    ///
    /// # Errors
    /// The load failure.
    pub async fn wait_ready(&self) -> Result<ModelInfo, EngineError> {
        loop {
            let notified = self.shared.state_notify.notified();
            // The load failure itself (as `wait_ready_blocking` gives it), not `LoadFailed`.
            match &*self.shared.state.lock() {
                LoadState::Ready(loaded) => return Ok(loaded.info.clone()),
                LoadState::Failed(e) => return Err(e.clone()),
                LoadState::Died(reason) => return Err(EngineError::EngineDied(reason.clone())),
                LoadState::Loading => {}
            }
            notified.await;
        }
    }

    /// Waits until the inference thread has stopped after a failure it could not recover
    /// from; returns that [`EngineError::EngineDied`]. Never resolves for an engine that
    /// serves until it is shut down (a failed load is [`Engine::wait_ready`]'s answer). A
    /// supervisor (the `firstword` binary) exits non-zero then, so that systemd or a
    /// container runtime restarts it.
    pub async fn wait_died(&self) -> EngineError {
        loop {
            let notified = self.shared.state_notify.notified();
            if let LoadState::Died(reason) = &*self.shared.state.lock() {
                return EngineError::EngineDied(reason.clone());
            }
            notified.await;
        }
    }

    /// Facts about the model, once loaded.
    ///
    /// # Errors
    /// [`EngineError::Loading`] while loading, or the load failure.
    pub fn model_info(&self) -> Result<ModelInfo, EngineError> {
        self.loaded().map(|loaded| loaded.info.clone())
    }

    fn loaded(&self) -> Result<Arc<Loaded>, EngineError> {
        match &*self.shared.state.lock() {
            LoadState::Loading => Err(EngineError::Loading),
            LoadState::Ready(loaded) => Ok(Arc::clone(loaded)),
            LoadState::Failed(e) => Err(EngineError::LoadFailed(e.to_string())),
            LoadState::Died(reason) => Err(EngineError::EngineDied(reason.clone())),
        }
    }

    /// Renders and queues a request. Events arrive on the returned [`Generation`]; the first is
    /// `Started` or `Failed` (e.g. the prompt does not fit the context). Rendering runs on the
    /// calling thread (a long conversation takes a while: not on an async runtime's worker).
    ///
    /// # Errors
    /// Not loaded yet, shutting down, queue full, or the chat template rejected the messages.
    pub fn submit(&self, request: GenerationRequest) -> Result<Generation, EngineError> {
        let rendered = self.render_untokenized(&request.prompt)?.with_media(self.prepare_media(&request.media)?);
        self.submit_rendered(request, rendered)
    }

    /// Renders a prompt through the model's chat template (other prompts pass through), ready
    /// for [`Engine::submit_rendered`]: the API renders on its conversion threads, off the
    /// async runtime.
    ///
    /// # Errors
    /// Not loaded yet, or the chat template rejected the messages.
    ///
    /// A chat prompt is tokenized too (errors are left for the inference thread to report, as
    /// for any prompt), keeping the tokens of the beginning it shares with a recent one: call it
    /// on a thread with [`LARGE_STACK_BYTES`] of stack (the API's conversion threads).
    pub(crate) fn render(&self, prompt: &Prompt) -> Result<RenderedPrompt, EngineError> {
        let loaded = self.loaded()?;
        let start = std::time::Instant::now();
        let (input, landmarks) = loaded.render(prompt)?;
        let mut path = RequestPath { render: start.elapsed(), ..RequestPath::default() };
        let input = match input {
            worker::PromptInput::Text(text) if matches!(prompt, Prompt::Chat { .. }) => {
                let start = std::time::Instant::now();
                let tokenized = loaded.tokenizer.chat_tokens(&text);
                path.tokenize = start.elapsed();
                match tokenized {
                    Ok(memo) => {
                        path.tokens_kept = memo.kept as u32;
                        worker::PromptInput::Tokenized { text, tokens: memo.tokens }
                    }
                    Err(_) => worker::PromptInput::Text(text),
                }
            }
            other => other,
        };
        Ok(RenderedPrompt { input, landmarks, path, clock: None, media: PreparedMedia::default() })
    }

    /// Decodes and tokenizes a request's media on the calling thread (the API's conversion
    /// threads; see [`media::projector`]), for [`RenderedPrompt::with_media`]. Nothing without
    /// a projector (the inference thread then refuses media).
    ///
    /// # Errors
    /// Not loaded, or [`EngineError::Media`] naming a part that cannot be decoded.
    pub(crate) fn prepare_media(&self, media: &[media::MediaInput]) -> Result<PreparedMedia, EngineError> {
        match &self.loaded()?.media {
            Some(preparer) if !media.is_empty() => preparer.prepare_all(media),
            _ => Ok(PreparedMedia::default()),
        }
    }

    /// [`Engine::render`] without tokenizing (for callers whose thread may have a small
    /// stack: the inference thread tokenizes).
    fn render_untokenized(&self, prompt: &Prompt) -> Result<RenderedPrompt, EngineError> {
        let (input, landmarks) = self.loaded()?.render(prompt)?;
        Ok(RenderedPrompt {
            input,
            landmarks,
            path: RequestPath::default(),
            clock: None,
            media: PreparedMedia::default(),
        })
    }

    /// Queues `request`, whose prompt [`Engine::render`] rendered as `rendered`.
    ///
    /// # Errors
    /// As [`Engine::submit`], but for the template.
    pub(crate) fn submit_rendered(
        &self,
        request: GenerationRequest,
        rendered: RenderedPrompt,
    ) -> Result<Generation, EngineError> {
        let waiting = &self.shared.signals.waiting_generations;
        waiting.fetch_add(1, Ordering::Relaxed);
        let queued = self.queue(request, rendered, None);
        if queued.is_err() {
            waiting.fetch_sub(1, Ordering::Relaxed);
        }
        let (events, finish_requested) = queued?;
        Ok(Generation { events, finish_requested })
    }

    /// Evaluates a request's prompt into the cache without generating, so the request itself
    /// (or a longer one: the same conversation with more words) later prefills only the rest.
    /// Built for a voice pipeline that sends each partial transcript: the prompt is evaluated
    /// in small chunks and yields to a generation request waiting behind it at the next chunk
    /// (what it evaluated stays cached), and a prefill still queued when a newer one is queued
    /// is answered as superseded at once (its place in the queue freed). Wait for its
    /// [`PrefillReport`] with [`PendingPrefill::wait`].
    ///
    /// # Errors
    /// As [`Engine::submit`].
    pub fn prefill(&self, request: GenerationRequest) -> Result<PendingPrefill, EngineError> {
        let rendered = self.render_untokenized(&request.prompt)?.with_media(self.prepare_media(&request.media)?);
        self.prefill_rendered(request, rendered)
    }

    /// [`Engine::prefill`] of a prompt [`Engine::render`] rendered.
    ///
    /// # Errors
    /// As [`Engine::submit_rendered`].
    pub(crate) fn prefill_rendered(
        &self,
        request: GenerationRequest,
        rendered: RenderedPrompt,
    ) -> Result<PendingPrefill, EngineError> {
        let (report, report_rx) = oneshot::channel();
        let (events, _) = self.queue(request, rendered, Some(report))?;
        Ok(PendingPrefill { events, report: report_rx })
    }

    /// Admits `request` and queues it with its `rendered` prompt (a prefill when `report` is
    /// given); returns its event receiver and its finish-now flag.
    fn queue(
        &self,
        request: GenerationRequest,
        rendered: RenderedPrompt,
        report: Option<oneshot::Sender<PrefillReport>>,
    ) -> Result<(tokio_mpsc::UnboundedReceiver<Event>, Arc<AtomicBool>), EngineError> {
        self.loaded()?;
        self.ensure_room()?;
        let admitted = Admission::take(&self.shared.admitted, self.shared.queue_size + 1)
            .ok_or(EngineError::QueueFull { capacity: self.shared.queue_size })?;
        let RenderedPrompt { input: prompt, landmarks, clock, media, .. } = rendered;
        let clock = clock.map(|mut clock| {
            clock.queued();
            clock
        });
        let (events, receiver) = tokio_mpsc::unbounded_channel();
        let finish_requested = Arc::new(AtomicBool::new(false));
        let job = Job {
            prompt,
            report,
            landmarks,
            request,
            events,
            finish_requested: Arc::clone(&finish_requested),
            clock,
            media,
            _admitted: admitted,
        };
        self.shared.commands.send(Box::new(job))?;
        Ok((receiver, finish_requested))
    }

    /// Fails as a submission now would for lack of room: queue full (one request runs and
    /// `queue_size` wait) or shutting down. Lets callers refuse before reading a large request.
    ///
    /// # Errors
    /// [`EngineError::QueueFull`] or [`EngineError::ShuttingDown`].
    pub fn ensure_room(&self) -> Result<(), EngineError> {
        if self.shared.signals.shutting_down.load(Ordering::Relaxed) {
            return Err(EngineError::ShuttingDown);
        }
        if self.shared.admitted.load(Ordering::Relaxed) > self.shared.queue_size {
            return Err(EngineError::QueueFull { capacity: self.shared.queue_size });
        }
        Ok(())
    }

    /// Requests admitted and not finished: the one being served (with its upkeep after the
    /// reply) and those queued.
    #[must_use]
    pub fn load(&self) -> EngineLoad {
        let admitted = self.shared.admitted.load(Ordering::Relaxed);
        EngineLoad { busy: admitted > 0, waiting: admitted.saturating_sub(1) }
    }

    /// What the cache holds: the live sequence and the RAM store's entries, as of the end of
    /// the last request (never waits for a running one); the disk writer's counters as they
    /// stand now (its writes come after the request, once the engine is idle).
    #[must_use]
    pub fn cache_status(&self) -> CacheStatus {
        let mut status = self.shared.signals.cache_status.lock().clone();
        status.media = self.loaded().ok().and_then(|loaded| loaded.media.as_ref().map(|media| media.status()));
        if let (Some(disk), Some(counters)) = (&mut status.disk, &*self.shared.signals.disk_counters.lock()) {
            disk.bytes_written = counters.bytes_written();
            disk.signature_bytes = counters.signature_bytes();
        }
        status
    }

    /// The threads llama.cpp computes with now, and the load of other processes that decided
    /// them (see [`EngineConfig::fixed_threads`]).
    #[must_use]
    pub fn threads(&self) -> ThreadsInUse {
        self.shared.signals.threads.read()
    }

    /// Blocks until every request queued before this call has been served, including the cache
    /// upkeep that follows each reply (the disk cache's files written, for up to 5 s), so
    /// llama.cpp is idle until the next submission. Call it
    /// before the process exits while a handle is still alive elsewhere (a static, another
    /// thread): exiting while llama.cpp computes can crash in its teardown. Not for use inside an
    /// async runtime's worker. Returns at once while the model loads or after it failed.
    pub fn wait_idle_blocking(&self) {
        if self.loaded().is_err() {
            return;
        }
        let (reply, answer) = mpsc::channel();
        if self.shared.commands.commands().send(Command::Idle(reply)).is_ok() {
            let _ = answer.recv();
        }
    }

    /// Stops serving: the running generation ends with [`EngineError::ShuttingDown`] at its next
    /// token, queued ones fail the same way, and new submissions are refused.
    pub fn shutdown(&self) {
        self.shared.signals.shutting_down.store(true, Ordering::Relaxed);
    }

    /// Blocks until the inference thread has stopped after [`Engine::shutdown`], so the process
    /// can exit while llama.cpp is idle. Returns at once if it already stopped.
    pub fn wait_stopped(&self) {
        let worker = self.shared.worker.lock().take();
        if let Some(worker) = worker {
            let _ = worker.join();
        }
    }
}

/// A prompt rendered through the chat template, with where its parts lie: what
/// [`Engine::render`] gives and [`Engine::submit_rendered`] queues.
#[derive(Debug)]
pub(crate) struct RenderedPrompt {
    input: worker::PromptInput,
    landmarks: Landmarks,
    /// What rendering (and tokenizing) it cost.
    path: RequestPath,
    /// The request's clock, once [`RenderedPrompt::timed`] gave it one.
    clock: Option<RequestClock>,
    /// Its media, prepared ([`Engine::prepare_media`]).
    media: PreparedMedia,
}

impl RenderedPrompt {
    /// Starts the request's clock at `arrived`, with the body read in `read` and parsed in
    /// `parse`; rendering's own costs are added. The engine then measures the rest and reports
    /// the stages in the request's [`Timings::request`].
    pub(crate) fn timed(mut self, arrived: std::time::Instant, read: Duration, parse: Duration) -> Self {
        let mut clock = RequestClock::since(arrived);
        *clock.path_mut() = RequestPath { read, parse, ..self.path };
        self.clock = Some(clock);
        self
    }

    /// The prompt with its `media` prepared, which the job holds until it is served.
    pub(crate) fn with_media(self, media: PreparedMedia) -> Self {
        Self { media, ..self }
    }

    /// A rendering of nothing, for a fake engine.
    #[cfg(test)]
    pub(crate) fn empty() -> Self {
        Self {
            input: worker::PromptInput::Text(String::new()),
            landmarks: Landmarks::default(),
            path: RequestPath::default(),
            clock: None,
            media: PreparedMedia::default(),
        }
    }
}
