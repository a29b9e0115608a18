//! The inference thread: owns the backend, the model and one long-lived context, and serves
//! queued jobs one at a time. Serving a job is a short sequence of steps (tokenize, check the
//! limits, reuse the cached prefix, prefill, generate) whose failure is reported in one place,
//! followed by the cache's upkeep for the next turn.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};

use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use llama_cpp_2::model::LlamaModel;
use llama_cpp_2::token::LlamaToken;
use tokio::sync::mpsc::UnboundedSender;

use super::disk::{ContextShape, WriteHold};
use super::ffi::effective_sliding_window;
use super::load::{create_decoder, Contexts, Models};
use super::media::projector::MediaPreparer;
use super::media::projector::Projector;
use super::media::{media_share, MediaSupport};
use super::policy::Purpose;
use super::reply::{Halt, ReasoningLimit, Reply};
use super::sampling::TokenPicker;
use super::sequence::LiveSequence;
use super::speculation::{DraftDepth, Speculating};
use super::threads::{ThreadCounts, ThreadGovernor};
use super::tokenizer::Tokenizer;
use super::{
    CacheStatus, Command, ContextOverflow, EngineConfig, EngineError, Event, GenerationRequest, Job, ModelInfo,
    ParkingCounts, Prompt, ReasoningFormat, RequestClock, Signals, Timings, Usage,
};
use crate::chat::{ChatFormat, Grammar, Landmarks, ModelTemplateFacts, ReasoningSplitter};
use evaluate::{Evaluated, NextTurn};
use explain::PromptParts;
use overflow::{FittedPrompt, LastDrop};
use parked::Parked;
use setup::{check_cache_budget, open_disk_cache};

mod evaluate;
mod explain;
mod faults;
mod lanes;
mod media;
mod overflow;
mod parked;
mod prefill;
mod setup;

pub(crate) use faults::panic_message;

/// How long a shutdown waits for the disk cache's files: within the 10 s container runtimes
/// give before they kill, after open responses had their grace.
pub(super) const SHUTDOWN_WRITE_LIMIT: Duration = Duration::from_secs(5);

/// The tokens kept for an answer that must match a grammar whose shortest text cannot be
/// worked out (a grammar firstword did not write).
const UNREAD_ANSWER_TOKENS: u32 = 32;

/// A prompt after template rendering, before tokenization.
#[derive(Debug)]
pub(crate) enum PromptInput {
    /// Text, tokenized with the model's BOS rule.
    Text(String),
    /// Token ids, checked against the vocabulary.
    Tokens(Vec<i32>),
    /// Text already tokenized with the model's BOS rule (on a conversion thread).
    Tokenized {
        /// The text.
        text: String,
        /// Its tokens, as [`Tokenizer::prompt_tokens`] gives them for `text`.
        tokens: Vec<LlamaToken>,
    },
}

impl PromptInput {
    /// The prompt's text (none for token prompts).
    pub(crate) fn text(&self) -> Option<&str> {
        match self {
            Self::Text(text) | Self::Tokenized { text, .. } => Some(text),
            Self::Tokens(_) => None,
        }
    }
}

/// Renders chat prompts through the model's chat format, with where their parts lie; other
/// prompts pass through (and have no parts).
pub(crate) fn render_prompt(chat: &ChatFormat, prompt: &Prompt) -> Result<(PromptInput, Landmarks), EngineError> {
    Ok(match prompt {
        Prompt::Chat { messages, tools, template_kwargs } => {
            let rendered = chat.render_with(messages, tools, template_kwargs)?;
            (PromptInput::Text(rendered.text), rendered.landmarks)
        }
        Prompt::Text(text) => (PromptInput::Text(text.clone()), Landmarks::default()),
        Prompt::Tokens(tokens) => (PromptInput::Tokens(tokens.clone()), Landmarks::default()),
    })
}

/// What a loaded engine hands its handles: the model's facts, its chat format, its tokenizer
/// and, with a projector, what prepares media.
pub(super) type Ready = (ModelInfo, Arc<ChatFormat>, Tokenizer, Option<Arc<MediaPreparer>>);

/// Body of the inference thread. Returns when the engine shuts down, or with why it cannot go
/// on (see [`faults`]); a failed load is reported through `report`.
pub(super) fn run(
    config: &EngineConfig,
    report: impl FnOnce(Result<Ready, EngineError>),
    commands: &Receiver<Command>,
    signals: &Signals,
) -> Result<(), String> {
    let loaded = check_cache_budget(config.cache_ram_mib).and_then(|mib| Ok((mib, Models::load(config)?)));
    let (cache_ram_mib, models) = match loaded {
        Ok(loaded) => loaded,
        Err(e) => {
            report(Err(e));
            return Ok(());
        }
    };
    let (mut session, info) = match Session::new(&models, config, cache_ram_mib, signals, commands) {
        Ok(started) => started,
        Err(e) => {
            report(Err(e));
            return Ok(());
        }
    };
    session.warm(&config.warm);
    let media = session.projector.as_ref().map(Projector::preparer);
    report(Ok((info, Arc::clone(&session.chat), session.tokenizer.clone(), media)));
    let mut idle_since = Instant::now();
    loop {
        if signals.shutting_down.load(Ordering::Relaxed) {
            // New submissions are refused by now: fail what is still queued, then stop.
            for command in session.deferred.drain(..).chain(commands.try_iter()) {
                let job = match command {
                    Command::Generate(job) => Some(job),
                    Command::Prefill(queued) => queued.take(),
                    Command::Idle(_) => None,
                };
                if let Some(job) = job {
                    let _ = job.events.send(Event::Failed(EngineError::ShuttingDown));
                }
            }
            break;
        }
        match session.next_command(Duration::from_millis(100)) {
            Ok(command) => {
                // The disk writer waits while a request or prefill runs (not while the engine
                // waits for it to write).
                session.hold_disk_writes(!matches!(command, Command::Idle(_)));
                let handled = session.handle_isolated(command);
                session.hold_disk_writes(false);
                handled?;
                idle_since = Instant::now();
            }
            Err(RecvTimeoutError::Timeout) if session.sequence.lanes_busy() => {
                session.hold_disk_writes(true);
                session.sequence.step_lanes();
                session.hold_disk_writes(false);
                session.publish_lanes();
                idle_since = Instant::now();
            }
            Err(RecvTimeoutError::Timeout) => session.on_idle(idle_since.elapsed()),
            Err(RecvTimeoutError::Disconnected) => break,
        }
    }
    session.sequence.end_lanes();
    session.sequence.persist_before_exit(SHUTDOWN_WRITE_LIMIT);
    Ok(())
}

/// The model, its live sequence, and what carries over from one request to the next.
struct Session<'m> {
    model: &'m LlamaModel,
    sequence: LiveSequence<'m>,
    /// How many drafted tokens to verify per step, learned across replies.
    depth: DraftDepth,
    /// Most tokens generated when a request sets no limit.
    n_predict: Option<u32>,
    /// Most reasoning tokens when a request sets no budget.
    reasoning_budget: Option<u32>,
    tokenizer: Tokenizer,
    /// Shared with the handles: shutdown, the published cache status, waiting requests.
    signals: &'m Signals,
    /// The model's chat format (shared with the handles, which render prompts).
    chat: Arc<ChatFormat>,
    /// After a reply, evaluate what the template writes before the next user's words.
    anticipate: bool,
    /// What a chat that does not fit the context gets.
    context_overflow: ContextOverflow,
    /// The oldest turns the last shortened conversation left out.
    last_drop: LastDrop,
    /// A reply changed the conversation since it was last copied for the disk cache.
    persist_due: bool,
    /// Idle time after a reply before that copy.
    persist_after_idle: Duration,
    /// Reply tokens the last prefill generated ahead, for the request that follows.
    parked: Option<Parked>,
    /// How long parked tokens wait for their request.
    park_for: Duration,
    /// How long a reply's upkeep waits for a request sent right after it.
    next_request_grace: Duration,
    /// Holds the disk cache's writer while the engine computes.
    disk_writes: Option<WriteHold>,
    /// Reply tokens a prefill generates ahead when it does not say.
    pregenerate: u32,
    /// What became of parked generations, for the cache status.
    parking: ParkingCounts,
    /// The clock of the job being served, until its prompt's evaluation starts.
    clock: Option<RequestClock>,
    /// The multimodal projector (`--mmproj`), if one is loaded.
    projector: Option<Projector>,
    /// The queue's receiving end.
    commands: &'m Receiver<Command>,
    /// Commands taken from the queue to see whether they could take a lane, and left for
    /// their turn (they are served before anything newer).
    deferred: VecDeque<Command>,
}

/// A reply generated to its end, its last event not sent yet.
struct CompletedReply {
    /// [`Event::Finished`].
    finished: Event,
    /// The reply's text, as sent.
    text: String,
    /// The prompt's text (none for token prompts).
    prompt_text: Option<String>,
    /// The conversation evaluated, when its oldest turns were left out.
    shortened: Option<Prompt>,
    /// The prompt opened the model's reasoning.
    reasoning_opened: bool,
}

impl<'m> Session<'m> {
    fn new(
        models: &'m Models,
        config: &EngineConfig,
        cache_ram_mib: u64,
        signals: &'m Signals,
        commands: &'m Receiver<Command>,
    ) -> Result<(Self, ModelInfo), EngineError> {
        let Models { backend, model: shared_model, draft_model, plan, devices } = models;
        let model: &LlamaModel = shared_model;
        let draft_model = draft_model.as_ref();
        let architecture = model.meta_val_str("general.architecture").unwrap_or_default();
        // The window llama.cpp applies, which the GGUF key alone does not always tell.
        let n_swa = effective_sliding_window(model);
        let n_ctx_train = model.n_ctx_train();
        let Contexts { decoder, n_batch, rs_snapshots, n_seq_max, spare_seq, flash_attention } =
            create_decoder(backend, model, draft_model, plan, config)?;
        let recurrent = model.is_recurrent() || model.is_hybrid();
        let mut sequence = LiveSequence::new(decoder, n_batch, n_swa, recurrent, rs_snapshots as usize, n_seq_max);
        sequence.reuse_past_changes(config.reuse_after_change, config.change_rules, spare_seq);
        let mut budget = usize::try_from(cache_ram_mib.saturating_mul(1 << 20)).unwrap_or(usize::MAX);
        let projector = match &config.mmproj {
            Some(path) => {
                // Prepared media hold their share of --cache-ram; the state store the rest.
                let share = media_share(budget);
                budget -= share;
                Some(Projector::load(path, shared_model, config.threads, config.n_gpu_layers > 0, share)?)
            }
            None => None,
        };
        let threads = ThreadCounts { generation: config.threads.max(1), batch: config.threads_batch.max(1) };
        let governor = ThreadGovernor::new(threads, !config.fixed_threads, Arc::clone(&signals.threads));
        sequence.govern_threads(governor);
        // Checkpoints where a cache cannot be cut everywhere: recurrent state; a sliding window
        // (the small SWA cache drops what is older, and a restored state, full SWA cache
        // included, holds only the last window), so a prompt that leaves a stored
        // conversation early (a rewritten reply) still finds its own prompt's state.
        let takes_checkpoints = recurrent || n_swa.is_some();
        let checkpoint_every = takes_checkpoints.then_some(config.checkpoint_every as usize);
        sequence.keep_states(budget, config.cache_min_tokens as usize, checkpoint_every);

        let tokenizer = Tokenizer::new(Arc::clone(shared_model));
        let token_text = |t: LlamaToken| String::from_utf8_lossy(&tokenizer.piece(t)).into_owned();
        let facts = ModelTemplateFacts {
            gguf_template: model.chat_template(None).ok().and_then(|t| t.to_string().ok()),
            architecture: architecture.clone(),
            bos_token: tokenizer.bos_text().to_string(),
            eos_token: token_text(model.vocab().eos()),
        };
        let chat = ChatFormat::for_model(&facts, config.chat_template_file.as_deref())
            .map_err(|e| EngineError::TemplateSetup(e.to_string()))?;
        let mut disk_writes = None;
        if let Some(root) = &config.cache_dir {
            let shape = ContextShape {
                n_ctx: sequence.n_ctx(),
                kv_types: "f16/f16".into(),
                swa_full: config.swa_full,
                flash_attention: flash_attention.into(),
                n_seq_max,
                n_rs_seq: rs_snapshots,
                drafter: sequence.drafter_name().into(),
                projector: ContextShape::projector_of(config.mmproj.as_deref())
                    .map_err(|e| EngineError::LoadFailed(format!("--mmproj: {e}")))?,
            };
            match open_disk_cache(root, config, model, draft_model, shape, &chat, sequence.shape().whole_only()) {
                Ok(disk) => {
                    *signals.disk_counters.lock() = Some(disk.counters());
                    disk_writes = Some(disk.write_hold());
                    sequence.keep_on_disk(disk);
                }
                Err(e) => tracing::warn!("disk cache off: {} cannot be used: {e}", root.display()),
            }
        }

        let id = config
            .model_path
            .file_name()
            .map(|n| n.to_string_lossy().trim_end_matches(".gguf").to_string())
            .unwrap_or_default();
        let info = ModelInfo {
            id,
            architecture,
            n_ctx: sequence.n_ctx(),
            n_ctx_train,
            n_vocab: model.n_vocab(),
            n_swa,
            template_source: chat.source().clone(),
            tool_format: chat.tool_format().clone(),
            reasoning: chat.reasoning(),
            threads: config.threads,
            threads_batch: config.threads_batch,
            media: MediaSupport::default(),
            n_params: model.n_params(),
            size_bytes: model.size(),
            file_type: model.meta_val_str("general.file_type").ok().and_then(|t| t.parse().ok()),
            devices: devices.clone(),
        };
        let session = Self {
            model,
            sequence,
            depth: DraftDepth::new(plan.draft_max, plan.always),
            n_predict: config.n_predict,
            reasoning_budget: config.reasoning_budget,
            tokenizer,
            signals,
            chat: Arc::new(chat),
            anticipate: config.anticipate_next_turn && !recurrent,
            context_overflow: config.context_overflow,
            last_drop: LastDrop::default(),
            persist_due: false,
            persist_after_idle: config.persist_after_idle,
            parked: None,
            park_for: config.park_for,
            next_request_grace: config.next_request_grace,
            disk_writes,
            pregenerate: config.pregenerate,
            parking: ParkingCounts::default(),
            clock: None,
            projector,
            commands,
            deferred: VecDeque::new(),
        };
        let mut session = session;
        if let Some(preparer) = session.projector.as_ref().map(Projector::preparer) {
            session.sequence.evaluate_lane_media_with(preparer);
        }
        // The probe evaluates on the context (clearing it): before the conversation comes back.
        session.probe_projector();
        session.sequence.restore_last_conversation();
        let info =
            ModelInfo { media: session.projector.as_ref().map(|p| p.support().clone()).unwrap_or_default(), ..info };
        session.publish_cache_status();
        Ok((session, info))
    }

    /// Does what one command asks.
    fn handle(&mut self, command: Command) {
        match command {
            Command::Generate(mut job) => {
                self.signals.waiting_generations.fetch_sub(1, Ordering::Relaxed);
                self.take_clock(&mut job);
                self.hold_media(&mut job);
                // The client left while the request was queued: drop it without running.
                if !job.events.is_closed() {
                    self.serve(*job);
                }
            }
            // Replaced by a newer prefill while it waited (answered then), or the client left.
            Command::Prefill(queued) => match queued.take() {
                Some(mut job) if !job.events.is_closed() => {
                    self.take_clock(&mut job);
                    self.hold_media(&mut job);
                    self.serve_prefill(*job);
                }
                _ => {}
            },
            Command::Idle(reply) => {
                self.persist_now();
                self.sequence.wait_for_disk(SHUTDOWN_WRITE_LIMIT);
                // What GET /cache shows once the files are written (or the disk cache is off).
                self.publish_cache_status();
                let _ = reply.send(());
            }
        }
    }

    /// Starts serving `job`: its clock, if it has one, says it was taken now.
    fn take_clock(&mut self, job: &mut Job) {
        self.clock = job.clock.take().map(|mut clock| {
            clock.taken();
            clock
        });
    }

    /// Holds the media `job` brought, prepared on the thread that converted it, for as long as
    /// it is served (and its next turn anticipated).
    fn hold_media(&mut self, job: &mut Job) {
        if let Some(projector) = self.projector.as_mut() {
            projector.hold(std::mem::take(&mut job.media));
        }
    }

    /// Serves one job, whose events end with `Finished` or `Failed` (or with nothing more once
    /// the client has left), then prepares the cache for the next turn.
    fn serve(&mut self, job: Job) {
        let Job { prompt, landmarks, request, events, finish_requested, .. } = job;
        match self.run_steps(prompt, landmarks, &request, &events, &finish_requested) {
            Ok(CompletedReply { finished, text, prompt_text, shortened, reasoning_opened }) => {
                // A reply that ended at its first token left the prompt's checkpoint due.
                self.sequence.save_pending_checkpoint();
                // What GET /cache shows once the client has its answer.
                self.publish_cache_status();
                // The reply's calls are remembered before the client has them: its next turn
                // (rendered when it is submitted) writes them back as the model wrote them.
                if let Prompt::Chat { tools, .. } = &request.prompt {
                    let _ = self.chat.reply_message(&text, reasoning_opened, tools);
                }
                let _ = events.send(finished);
                let next_turn = prompt_text.map(|prompt_text| NextTurn {
                    prompt: shortened.as_ref().unwrap_or(&request.prompt),
                    media: &request.media,
                    prompt_text,
                    reply: &text,
                    reasoning_opened,
                });
                self.upkeep(next_turn);
            }
            Err(Halt::Failed(e)) => {
                let _ = events.send(Event::Failed(e));
                self.upkeep(None);
            }
            Err(Halt::Cancelled) => {
                tracing::debug!("client left; generation stopped");
                self.upkeep(None);
            }
        }
    }

    /// Makes the disk cache's writer wait (`held`) or go on: its checksums and deltas would
    /// take a core from the request being evaluated.
    fn hold_disk_writes(&self, held: bool) {
        if let Some(hold) = &self.disk_writes {
            hold.set(held);
        }
    }

    /// Publishes what the cache holds for [`super::Engine::cache_status`].
    fn publish_cache_status(&self) {
        *self.signals.cache_status.lock() =
            CacheStatus { parking: self.parking, lanes: self.sequence.lane_counts(), ..self.sequence.status() };
    }

    /// One request's steps, up to its complete reply: tokenize, check the limits, reuse the
    /// cached prefix, prefill the rest, generate.
    fn run_steps(
        &mut self,
        prompt: PromptInput,
        landmarks: Landmarks,
        request: &GenerationRequest,
        events: &UnboundedSender<Event>,
        finish_requested: &Arc<AtomicBool>,
    ) -> Result<CompletedReply, Halt> {
        let fitted = self.fit_prompt(prompt, landmarks, request)?;
        let prompt_tokens = fitted.tokens.len() as u32;
        // Room beside the lanes for the prompt and its whole reply.
        let reserved = fitted.tokens.len() + fitted.limit as usize;
        self.make_room(&fitted.tokens, reserved);
        let (picker, reasoning, reasoning_opened) = self.reply_picker(request, fitted.text.as_deref())?;
        let parked = self.take_parked(&fitted.tokens, fitted.approximate);
        let Evaluated { cached, logits_index, mut cache, time: prompt_time, request: request_path, .. } = match &parked
        {
            Some(_) => self.adopt_parked(&fitted, events, reasoning_opened)?,
            None => self.evaluate_prompt(&fitted, Purpose::Reply, events, reasoning_opened)?,
        };
        let FittedPrompt { text: prompt_text, limit, shortened, dropped_messages, .. } = fitted;
        let cached_tokens = cached as u32;
        let signals = self.signals;
        let shutting_down = &signals.shutting_down;

        let generation_start = Instant::now();
        let budget = request.reasoning_budget.or(self.reasoning_budget);
        let answer_tokens = request.grammar.as_ref().and_then(|grammar| self.smallest_answer(grammar));
        let mut reply = Reply::new(events.clone(), Arc::clone(finish_requested), shutting_down, limit)
            .with_reasoning(reasoning.map(|format| ReasoningLimit { format, budget, answer_tokens }))
            .with_answer(answer_tokens)
            .with_replay(parked.as_ref().map(Parked::replay))
            .with_recording(self.recorded_steps());
        let mut generating = reply.begin(&self.tokenizer, request, picker, self.sequence.n_ctx() as usize);
        // The depth is lent to this reply's speculation and learned back after it.
        let mut depth = self.depth.clone();
        let mut speculating = Speculating::new(&mut depth);
        self.sequence.begin_reply(fitted.tokens.len());
        // A client that leaves during a decode step stops it there: the next request (the same
        // one sent again, often) is not kept waiting for a token nobody reads.
        let watched = events.clone();
        let stop_while = self.sequence.stop_decodes_while(Box::new(move || watched.is_closed()));
        let mut logits_index = logits_index;
        let outcome = loop {
            match reply.step(&mut generating, &mut self.sequence, &mut speculating, &mut logits_index) {
                Ok(None) => {}
                Ok(Some(reason)) => break Ok(reason),
                Err(halt) => break Err(halt),
            }
            // A request that arrived meanwhile shares the next steps, where it can; not once
            // this reply's client has left (a barge-in's next turn, sent at once): the reply
            // ends at its next step, and the request continues its cells on sequence 0.
            if !events.is_closed() {
                self.admit_waiting(reserved);
            }
        };
        drop(stop_while);
        cache.adopted = reply.adopted();
        if let Err(e) = speculating.end_round(&mut self.sequence) {
            // The reply itself is complete; only the cache for the next turn is lost.
            tracing::warn!("{e}");
        }
        let draft = self.sequence.speculates().then(|| speculating.stats(self.sequence.take_catch_up()));
        self.depth = depth;
        let reason = match outcome {
            Ok(reason) => reason,
            Err(Halt::Cancelled) => {
                // The client left: what it was given stays parked for the same request again.
                let left = (reply.replaying(), reply.take_recording());
                drop(reply);
                self.park_left(&fitted.tokens, parked, left);
                return Err(Halt::Cancelled);
            }
            Err(halt) => return Err(halt),
        };
        let usage = Usage {
            prompt_tokens,
            cached_tokens,
            completion_tokens: reply.tokens(),
            dropped_messages,
            reasoning_tokens: reply.reasoning_tokens(),
        };
        let timings = Timings {
            prompt: prompt_time,
            generation: generation_start.elapsed(),
            draft,
            cache,
            request: request_path,
            shared: self.sequence.home_shared(),
        };
        let finished = Event::Finished { reason, usage, timings };
        Ok(CompletedReply { finished, text: reply.into_text(), prompt_text, shortened, reasoning_opened })
    }

    /// The most tokens a reply to `prompt_tokens` may have (see [`overflow::reply_limit`]).
    ///
    /// # Errors
    /// [`EngineError::ContextOverflow`] when the prompt and the room the reply needs do not fit.
    fn limit(&self, prompt_tokens: u32, request: &GenerationRequest) -> Result<u32, EngineError> {
        overflow::reply_limit(prompt_tokens, request, self.sequence.n_ctx(), self.n_predict)
    }

    /// The tokens of the smallest answer an eager `grammar` (a required call, JSON) accepts,
    /// [`UNREAD_ANSWER_TOKENS`] when its shortest text cannot be worked out; `None` for a lazy
    /// grammar, whose answer may be free text.
    fn smallest_answer(&self, grammar: &Grammar) -> Option<u32> {
        if !grammar.is_eager() {
            return None;
        }
        let Some(text) = grammar.shortest_text() else { return Some(UNREAD_ANSWER_TOKENS) };
        Some(self.tokenizer.model().vocab().tokenize(text.as_bytes(), false, true).len() as u32)
    }

    /// The sampler for a request's reply, with the model's reasoning format (chat prompts of a
    /// template that thinks) and whether `prompt_text` opened the reasoning.
    fn reply_picker(
        &self,
        request: &GenerationRequest,
        prompt_text: Option<&str>,
    ) -> Result<(TokenPicker<'m>, Option<ReasoningFormat>, bool), EngineError> {
        let reasoning = match &request.prompt {
            Prompt::Chat { .. } => self.chat.reasoning(),
            _ => None,
        };
        let opened = reasoning.zip(prompt_text).is_some_and(|(format, text)| format.opened_by(text));
        let picker = self.picker(request, reasoning.map(|format| ReasoningSplitter::new(format, opened)))?;
        Ok((picker, reasoning, opened))
    }

    /// The request's sampler chain and grammar, following the reasoning of a model that thinks.
    fn picker(
        &self,
        request: &GenerationRequest,
        reasoning: Option<ReasoningSplitter>,
    ) -> Result<TokenPicker<'m>, EngineError> {
        // llama.cpp allocates the penalty window up front: never more than the context.
        let mut sampling = request.sampling.clone();
        sampling.repeat_last_n = sampling.repeat_last_n.clamp(0, self.sequence.n_ctx() as i32);
        TokenPicker::new(self.model, &sampling, request.grammar.as_ref(), reasoning)
    }
}
