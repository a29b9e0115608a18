//! The inference thread: owns the backend, the model and one long-lived context, and serves
//! queued jobs one at a time, reusing the KV cache's longest common token prefix.

use std::num::NonZeroU32;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use std::collections::VecDeque;
use std::path::Path;

use llama_cpp_2::context::params::{LlamaContextParams, LlamaContextType};
use llama_cpp_2::llama_backend::LlamaBackend;
use llama_cpp_2::model::params::LlamaModelParams;
use llama_cpp_2::model::LlamaModel;
use llama_cpp_2::speculative::{MtpSpeculative, MtpSpeculativeParams};
use llama_cpp_2::token::LlamaToken;
use llama_cpp_2::{send_logs_to_tracing, LogOptions};
use tokio::sync::mpsc::UnboundedSender;

use super::decoder::{Decoder, Logits, ModelDrafter, MtpDrafter};
use super::prefix::{common_prefix_len, plan_reuse, window_covers};
use super::sampling::TokenPicker;
use super::speculation::{vocabulary_difference, DraftDepth, Drafter, SpeculationPlan};
use super::text::{StopMatcher, StopScan, Utf8Stream};
use super::{
    Command, DraftStats, EngineConfig, EngineError, Event, FinishReason, FlashAttention, Job, ModelInfo, Timings, Usage,
};
use crate::chat::{ChatTemplate, ModelTemplateFacts};
use crate::tools::ToolFormat;

/// A prompt after template rendering, before tokenization.
#[derive(Debug)]
pub(crate) enum PromptInput {
    Text(String),
    Tokens(Vec<i32>),
}

/// Context size used when the user gives none: enough for a long system prompt and a
/// conversation, without allocating a 32K+ KV cache nobody asked for.
const DEFAULT_CTX_CAP: u32 = 8192;

/// llama.cpp's backend is process-wide and may be initialised once; every engine in the
/// process shares it (tests, a draft model).
fn backend() -> Result<&'static LlamaBackend, EngineError> {
    static BACKEND: OnceLock<Result<LlamaBackend, String>> = OnceLock::new();
    BACKEND
        .get_or_init(|| {
            send_logs_to_tracing(LogOptions::default());
            LlamaBackend::init().map_err(|e| e.to_string())
        })
        .as_ref()
        .map_err(|e| EngineError::LoadFailed(format!("llama.cpp backend: {e}")))
}

/// Body of the inference thread.
pub(super) fn run(
    config: &EngineConfig,
    report: impl FnOnce(Result<(ModelInfo, ChatTemplate), EngineError>),
    commands: &Receiver<Command>,
    shutting_down: &AtomicBool,
) {
    let loaded = SpeculationPlan::decide(&config.speculation, &config.model_path).and_then(|plan| {
        let backend = backend()?;
        let load_mtp = matches!(plan.drafter, Drafter::Mtp { .. });
        let model = load_model(backend, &config.model_path, config.n_gpu_layers, load_mtp, config)?;
        let draft_model = match &plan.drafter {
            Drafter::Model(path) => Some(load_draft_model(backend, &model, path, config)?),
            _ => None,
        };
        Ok((backend, model, draft_model, plan))
    });
    let (backend, model, draft_model, plan) = match loaded {
        Ok(loaded) => loaded,
        Err(e) => return report(Err(e)),
    };
    let session = Session::new(backend, &model, draft_model.as_ref(), &plan, config, shutting_down);
    let mut session = match session {
        Ok((session, info, template)) => {
            report(Ok((info, template)));
            session
        }
        Err(e) => return report(Err(e)),
    };
    loop {
        if shutting_down.load(Ordering::Relaxed) {
            // New submissions are refused by now: fail what is still queued, then stop.
            for command in commands.try_iter() {
                if let Command::Generate(job) = command {
                    let _ = job.events.send(Event::Failed(EngineError::ShuttingDown));
                }
            }
            break;
        }
        match commands.recv_timeout(Duration::from_millis(100)) {
            // The client left while the request was queued: drop it without running.
            Ok(Command::Generate(job)) if job.events.is_closed() => {}
            Ok(Command::Generate(job)) => session.serve(*job),
            Ok(Command::Tokenize { prompt, reply }) => {
                let tokens = session.tokenize(prompt).map(|tokens| tokens.into_iter().map(|t| t.0).collect());
                let _ = reply.send(tokens);
            }
            Ok(Command::Idle(reply)) => {
                let _ = reply.send(());
            }
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => break,
        }
    }
}

fn load_model(
    backend: &LlamaBackend,
    path: &Path,
    n_gpu_layers: u32,
    load_mtp: bool,
    config: &EngineConfig,
) -> Result<LlamaModel, EngineError> {
    std::fs::File::open(path)
        .map_err(|e| EngineError::ModelUnreadable { path: path.to_path_buf(), reason: e.to_string() })?;
    // MTP tensors only when they exist and are used: an MTP context on a model loaded without
    // them aborts the process inside llama.cpp.
    let params = LlamaModelParams::default()
        .with_n_gpu_layers(n_gpu_layers)
        .with_use_mmap(config.mmap)
        .with_use_mlock(config.mlock)
        .with_load_mtp(load_mtp);
    LlamaModel::load_from_file(backend, path, &params).map_err(|_| EngineError::ModelLoad { path: path.to_path_buf() })
}

/// Loads the draft model and checks that its tokens mean what the target's mean.
fn load_draft_model(
    backend: &LlamaBackend,
    target: &LlamaModel,
    path: &Path,
    config: &EngineConfig,
) -> Result<LlamaModel, EngineError> {
    let draft = load_model(backend, path, config.speculation.n_gpu_layers_draft, false, config)?;
    let texts = |model: &LlamaModel| -> Vec<Vec<u8>> {
        let vocab = model.vocab();
        (0..model.n_vocab())
            .map(|id| vocab.text(LlamaToken(id)).map(|t| t.to_bytes().to_vec()).unwrap_or_default())
            .collect()
    };
    let (target_texts, draft_texts) = (texts(target), texts(&draft));
    let difference =
        vocabulary_difference(target_texts.iter().map(Vec::as_slice), draft_texts.iter().map(Vec::as_slice));
    match difference {
        Some(difference) => Err(EngineError::SpeculationSetup(format!(
            "the draft model {} has a different vocabulary: {difference}",
            path.display()
        ))),
        None => Ok(draft),
    }
}

/// The live context and the exact token list its KV cache holds (prompt and generated tokens).
struct Session<'m> {
    model: &'m LlamaModel,
    decoder: Decoder<'m>,
    /// How many drafted tokens to verify per step.
    depth: DraftDepth,
    cached: Vec<LlamaToken>,
    n_swa: Option<u32>,
    n_batch: usize,
    bos_text: String,
    shutting_down: &'m AtomicBool,
}

/// The reply to one request as it is generated.
struct Reply<'j> {
    events: &'j UnboundedSender<Event>,
    /// Set by the client to end the reply early.
    finish_requested: &'j AtomicBool,
    /// Tokens generated.
    tokens: u32,
    /// All text sent.
    text: String,
}

impl Reply<'_> {
    /// Sends text to the client; false if the client is gone.
    fn send(&mut self, text: String) -> bool {
        if text.is_empty() {
            return true;
        }
        self.text.push_str(&text);
        self.events.send(Event::Text(text)).is_ok()
    }
}

/// Drafts verified in the target's last batch, and the reply's totals.
#[derive(Default)]
struct Speculating {
    /// Drafts whose logits follow in the last batch, not yet matched by a picked token.
    drafts: VecDeque<LlamaToken>,
    /// Drafts in the last batch.
    proposed: usize,
    /// Batch row of the logits for the next token.
    row: i32,
    drafted: u32,
    accepted: u32,
}

/// How a generation loop ended.
enum Outcome {
    Finished(FinishReason),
    /// The client went away; nothing more to send.
    Cancelled,
    Failed(EngineError),
}

impl<'m> Session<'m> {
    fn new(
        backend: &LlamaBackend,
        model: &'m LlamaModel,
        draft_model: Option<&'m LlamaModel>,
        plan: &SpeculationPlan,
        config: &EngineConfig,
        shutting_down: &'m AtomicBool,
    ) -> Result<(Self, ModelInfo, ChatTemplate), EngineError> {
        let architecture = model.meta_val_str("general.architecture").unwrap_or_default();
        let n_swa = model
            .meta_val_str(&format!("{architecture}.attention.sliding_window"))
            .ok()
            .and_then(|v| v.parse::<u32>().ok())
            .filter(|&n| n > 0);
        let n_ctx_train = model.n_ctx_train();
        let n_ctx = config.ctx_size.unwrap_or_else(|| n_ctx_train.min(DEFAULT_CTX_CAP)).max(16);
        let flash = match config.flash_attention {
            FlashAttention::Auto => llama_cpp_sys_2::LLAMA_FLASH_ATTN_TYPE_AUTO,
            FlashAttention::On => llama_cpp_sys_2::LLAMA_FLASH_ATTN_TYPE_ENABLED,
            FlashAttention::Off => llama_cpp_sys_2::LLAMA_FLASH_ATTN_TYPE_DISABLED,
        };
        let n_batch = config.batch_size.clamp(1, n_ctx);
        let params = LlamaContextParams::default()
            .with_n_ctx(NonZeroU32::new(n_ctx))
            .with_n_batch(n_batch)
            .with_n_ubatch(config.ubatch_size.clamp(1, n_batch))
            .with_n_threads(config.threads.max(1) as i32)
            .with_n_threads_batch(config.threads_batch.max(1) as i32)
            .with_flash_attention_policy(flash)
            .with_swa_full(config.swa_full);
        let context_error =
            |e: llama_cpp_2::LlamaContextLoadError| EngineError::ContextCreate { n_ctx, reason: e.to_string() };
        let ctx = model.new_context(backend, params.clone()).map_err(context_error)?;
        let decoder = match (&plan.drafter, draft_model) {
            (Drafter::Mtp { .. }, _) => {
                let draft = model
                    .new_context(backend, params.with_context_type(LlamaContextType::Mtp))
                    .map_err(context_error)?;
                let limits = MtpSpeculativeParams {
                    n_max: plan.draft_max as i32,
                    n_min: plan.draft_min as i32,
                    p_min: plan.p_min,
                };
                let spec = MtpSpeculative::new(ctx, draft, limits)
                    .map_err(|e| EngineError::SpeculationSetup(format!("MTP: {e}")))?;
                Decoder::Mtp(MtpDrafter::new(spec))
            }
            (Drafter::Model(_), Some(draft_model)) => {
                let draft = draft_model.new_context(backend, params).map_err(context_error)?;
                Decoder::Model(ModelDrafter::new(ctx, draft, n_batch as usize, plan.p_min, plan.draft_min as usize))
            }
            _ => Decoder::Plain(ctx),
        };
        match &plan.drafter {
            Drafter::None => tracing::info!("speculative decoding off: {}", plan.reason),
            drafter => tracing::info!(
                "speculative decoding with {}: {}; draft max {}, min {}, p-min {}",
                if matches!(drafter, Drafter::Mtp { .. }) { "MTP heads" } else { "a draft model" },
                plan.reason,
                plan.draft_max,
                plan.draft_min,
                plan.p_min
            ),
        }

        let vocab = model.vocab();
        let token_text = |t: LlamaToken| String::from_utf8_lossy(&vocab.token_to_piece(t, true, None)).into_owned();
        let bos_text = token_text(vocab.bos());
        let facts = ModelTemplateFacts {
            gguf_template: model.chat_template(None).ok().and_then(|t| t.to_string().ok()),
            architecture: architecture.clone(),
            bos_token: bos_text.clone(),
            eos_token: token_text(vocab.eos()),
        };
        let (template, template_source) = ChatTemplate::for_model(&facts, config.chat_template_file.as_deref())
            .map_err(|e| EngineError::TemplateSetup(e.to_string()))?;

        let id = config
            .model_path
            .file_name()
            .map(|n| n.to_string_lossy().trim_end_matches(".gguf").to_string())
            .unwrap_or_default();
        let info = ModelInfo {
            id,
            architecture,
            n_ctx: decoder.target().n_ctx(),
            n_ctx_train,
            n_vocab: model.n_vocab(),
            n_swa,
            template_source,
            tool_format: ToolFormat::detect(template.source()),
            threads: config.threads,
            threads_batch: config.threads_batch,
        };
        let session = Self {
            model,
            decoder,
            depth: DraftDepth::new(plan.draft_max),
            cached: Vec::new(),
            n_swa,
            n_batch: n_batch as usize,
            bos_text,
            shutting_down,
        };
        Ok((session, info, template))
    }

    fn tokenize(&self, prompt: PromptInput) -> Result<Vec<LlamaToken>, EngineError> {
        let vocab = self.model.vocab();
        let tokens = match prompt {
            PromptInput::Text(text) => {
                // A template that writes the BOS text itself must not get a second one.
                let add_bos = vocab.should_add_bos() && (self.bos_text.is_empty() || !text.starts_with(&self.bos_text));
                vocab.tokenize(text.as_bytes(), add_bos, true)
            }
            PromptInput::Tokens(ids) => {
                let n_vocab = self.model.n_vocab();
                if let Some(&token) = ids.iter().find(|&&t| t < 0 || t >= n_vocab) {
                    return Err(EngineError::InvalidToken { token, n_vocab });
                }
                ids.into_iter().map(LlamaToken).collect()
            }
        };
        if tokens.is_empty() {
            return Err(EngineError::EmptyPrompt);
        }
        Ok(tokens)
    }

    fn serve(&mut self, job: Job) {
        let Job { prompt, request, events, finish_requested } = job;
        let prompt_text = match &prompt {
            PromptInput::Text(text) => Some(text.clone()),
            PromptInput::Tokens(_) => None,
        };
        let tokens = match self.tokenize(prompt) {
            Ok(tokens) => tokens,
            Err(e) => {
                let _ = events.send(Event::Failed(e));
                return;
            }
        };
        let n_ctx = self.decoder.target().n_ctx();
        let prompt_tokens = tokens.len() as u32;
        let requested = request.max_tokens.unwrap_or(0);
        if prompt_tokens >= n_ctx || prompt_tokens.saturating_add(requested) > n_ctx {
            let _ = events.send(Event::Failed(EngineError::ContextOverflow {
                prompt_tokens,
                max_tokens: requested,
                needed: prompt_tokens.saturating_add(requested),
                n_ctx,
            }));
            return;
        }
        let limit = request.max_tokens.unwrap_or(n_ctx - prompt_tokens);
        let picker = match TokenPicker::new(self.model, &request.sampling, request.grammar.as_ref()) {
            Ok(picker) => picker,
            Err(e) => {
                let _ = events.send(Event::Failed(e));
                return;
            }
        };

        let keep = self.reuse_prefix(&tokens);
        if events.send(Event::Started { prompt_tokens, cached_tokens: keep as u32 }).is_err() {
            return;
        }
        let prefill_start = Instant::now();
        let logits_index = match self.prefill(&tokens[keep..], &events) {
            Ok(Some(index)) => index,
            Ok(None) => return,
            Err(e) => {
                let _ = events.send(Event::Failed(e));
                return;
            }
        };
        let prompt_time = prefill_start.elapsed();

        let generation_start = Instant::now();
        let mut reply = Reply { events: &events, finish_requested: &finish_requested, tokens: 0, text: String::new() };
        let mut speculating = Speculating::default();
        self.decoder.begin_reply();
        let outcome = self.generate(&request, picker, limit, logits_index, &mut reply, &mut speculating);
        self.end_round(&mut speculating);
        let usage = Usage { prompt_tokens, cached_tokens: keep as u32, completion_tokens: reply.tokens };
        match outcome {
            Outcome::Finished(reason) => {
                let draft = self.decoder.speculates().then_some(DraftStats {
                    drafted: speculating.drafted,
                    accepted: speculating.accepted,
                    catch_up: self.decoder.take_catch_up(),
                });
                let timings = Timings { prompt: prompt_time, generation: generation_start.elapsed(), draft };
                let _ = events.send(Event::Finished { reason, usage, timings });
                if let Some(prompt_text) = prompt_text {
                    self.align_with_text(prompt_text + &reply.text);
                }
            }
            Outcome::Failed(e) => {
                let _ = events.send(Event::Failed(e));
            }
            Outcome::Cancelled => tracing::debug!("client left; generation stopped"),
        }
        // The last sampled token (end-of-turn, or the one that hit the limit) was never
        // evaluated: the next turn prefills it with its new suffix, in the same batch, for free.
    }

    /// After a reply, makes the cache hold the tokenizer's own split of prompt + reply text,
    /// which is what the next turn sends (it is tokenized from text). A model's sampled tokens
    /// are not always that split (grammar-constrained output especially); without this the
    /// next turn's cache would stop inside the reply. Runs while the user reads or listens;
    /// skipped when the difference is larger than one batch.
    fn align_with_text(&mut self, full_text: String) {
        let Ok(canonical) = self.tokenize(PromptInput::Text(full_text)) else { return };
        let common = common_prefix_len(&self.cached, &canonical);
        let redo = canonical.len() - common;
        if common == self.cached.len() || redo > self.n_batch || self.shutting_down.load(Ordering::Relaxed) {
            return;
        }
        if !window_covers(self.decoder.target().kv_cache_seq_pos_min(0), common, self.n_swa)
            || !self.decoder.truncate(common)
        {
            return;
        }
        tracing::debug!(
            common,
            redo,
            cached = self.cached.len(),
            "re-evaluating the reply as the next turn will send it"
        );
        self.cached.truncate(common);
        if let Err(e) = self.decode(&canonical[common..], Logits::None, false) {
            tracing::warn!("re-evaluating the reply failed: {e}");
        }
    }

    /// Cuts the KV cache to the longest prefix shared with `tokens`; returns how many it kept.
    fn reuse_prefix(&mut self, tokens: &[LlamaToken]) -> usize {
        let mut keep = plan_reuse(&self.cached, tokens);
        let pos_min = self.decoder.target().kv_cache_seq_pos_min(0);
        tracing::debug!(keep, cached = self.cached.len(), prompt = tokens.len(), pos_min, "prefix reuse");
        if keep > 0 && !window_covers(pos_min, keep, self.n_swa) {
            tracing::info!(
                keep,
                n_swa = self.n_swa,
                pos_min,
                "the sliding-window cache no longer holds what this prefix needs; prefilling in full"
            );
            keep = 0;
        }
        if keep > 0 && !self.decoder.truncate(keep) {
            tracing::warn!(keep, "llama.cpp could not cut the KV cache; prefilling in full");
            keep = 0;
        }
        if keep == 0 {
            self.decoder.clear();
        }
        self.cached.truncate(keep);
        keep
    }

    /// Evaluates `tokens` after the cache in `n_batch` chunks. Returns the batch index holding
    /// the last token's logits, or `None` if the client left or the engine is stopping.
    fn prefill(&mut self, tokens: &[LlamaToken], events: &UnboundedSender<Event>) -> Result<Option<i32>, EngineError> {
        let mut last_index = 0;
        let chunks = tokens.len().div_ceil(self.n_batch);
        for (i, chunk) in tokens.chunks(self.n_batch).enumerate() {
            if self.shutting_down.load(Ordering::Relaxed) {
                let _ = events.send(Event::Failed(EngineError::ShuttingDown));
                return Ok(None);
            }
            if events.is_closed() {
                return Ok(None);
            }
            // The last batch reaches an MTP drafter only after the first token is out.
            let last = i + 1 == chunks;
            last_index = self.decode(chunk, if last { Logits::Last } else { Logits::None }, last)?;
        }
        Ok(Some(last_index))
    }

    /// Evaluates tokens at the next cache positions and records them as cached; returns the
    /// batch index of the last token. On failure the cache is cleared, since llama.cpp's state
    /// is then unknown.
    fn decode(&mut self, tokens: &[LlamaToken], logits: Logits, mirror_later: bool) -> Result<i32, EngineError> {
        if let Err(e) = self.decoder.decode(tokens, self.cached.len(), logits, mirror_later) {
            self.decoder.clear();
            self.cached.clear();
            return Err(e);
        }
        self.cached.extend_from_slice(tokens);
        Ok(tokens.len() as i32 - 1)
    }

    /// Makes the picked `token` part of the cache and returns the batch index of the logits
    /// that follow it. A token the last batch drafted is already there; otherwise the drafts
    /// left are dropped and `token` is evaluated with up to `room` new drafts after it, all
    /// verified in that one batch.
    fn advance(&mut self, token: LlamaToken, speculating: &mut Speculating, room: usize) -> Result<i32, EngineError> {
        if speculating.drafts.front() == Some(&token) {
            speculating.drafts.pop_front();
            speculating.row += 1;
            return Ok(speculating.row);
        }
        self.end_round(speculating);
        let depth = self.depth.next().min(room);
        let drafts = if self.decoder.speculates() && depth > 0 {
            self.decoder.propose(&self.cached, token, depth)
        } else {
            Vec::new()
        };
        let mut batch = Vec::with_capacity(drafts.len() + 1);
        batch.push(token);
        batch.extend_from_slice(&drafts);
        let logits = if drafts.is_empty() { Logits::Last } else { Logits::All };
        self.decode(&batch, logits, false)?;
        speculating.proposed = drafts.len();
        speculating.drafted += drafts.len() as u32;
        speculating.drafts = drafts.into();
        speculating.row = 0;
        Ok(0)
    }

    /// Ends a verification step: drafts that no picked token matched leave both caches, the
    /// drafter learns how many were right, and the draft depth adapts.
    fn end_round(&mut self, speculating: &mut Speculating) {
        if speculating.proposed == 0 {
            return;
        }
        let unused = speculating.drafts.len();
        let accepted = speculating.proposed - unused;
        if unused > 0 {
            let keep = self.cached.len() - unused;
            self.cached.truncate(keep);
            if !self.decoder.truncate(keep) {
                tracing::warn!(keep, "llama.cpp could not drop rejected drafts; clearing the cache");
                self.decoder.clear();
                self.cached.clear();
            }
        }
        self.decoder.settle(accepted);
        self.depth.record(speculating.proposed, accepted);
        speculating.accepted += accepted as u32;
        speculating.drafts.clear();
        speculating.proposed = 0;
    }

    fn generate(
        &mut self,
        request: &super::GenerationRequest,
        mut picker: TokenPicker<'_>,
        limit: u32,
        mut logits_index: i32,
        reply: &mut Reply<'_>,
        speculating: &mut Speculating,
    ) -> Outcome {
        let vocab = self.model.vocab();
        let mut utf8 = Utf8Stream::default();
        let mut stops = StopMatcher::new(&request.stop);
        let n_ctx = self.decoder.target().n_ctx() as usize;
        // Markers that are single special tokens are shown; other special tokens are not.
        let preserved: Vec<LlamaToken> = request
            .preserved_tokens
            .iter()
            .filter_map(|text| match vocab.tokenize(text.as_bytes(), false, true).as_slice() {
                [token] => Some(*token),
                _ => None,
            })
            .collect();
        let reason = loop {
            if reply.tokens >= limit {
                break FinishReason::Length;
            }
            if self.shutting_down.load(Ordering::Relaxed) {
                return Outcome::Failed(EngineError::ShuttingDown);
            }
            if reply.events.is_closed() {
                return Outcome::Cancelled;
            }
            if reply.finish_requested.load(Ordering::Relaxed) {
                break FinishReason::Stop;
            }
            let token = match picker.pick(self.decoder.target(), logits_index) {
                Ok(token) => token,
                Err(e) => return Outcome::Failed(e),
            };
            if vocab.is_eog(token) {
                break FinishReason::Stop;
            }
            reply.tokens += 1;
            let piece = vocab.token_to_piece(token, preserved.contains(&token), None);
            let text = utf8.push(&piece);
            match stops.push(&text) {
                StopScan::Continue(text) => {
                    if !reply.send(text) {
                        return Outcome::Cancelled;
                    }
                }
                StopScan::Stopped(text) => {
                    return if reply.send(text) { Outcome::Finished(FinishReason::Stop) } else { Outcome::Cancelled };
                }
            }
            // Positions evaluated for good (drafts in the last batch are still tentative).
            let evaluated = self.cached.len() - speculating.drafts.len();
            if reply.tokens >= limit || evaluated >= n_ctx {
                break FinishReason::Length;
            }
            let room = ((limit - reply.tokens) as usize).min(n_ctx - evaluated) - 1;
            logits_index = match self.advance(token, speculating, room) {
                Ok(index) => index,
                Err(e) => return Outcome::Failed(e),
            };
        };
        // Release what was held back: an unfinished character, text that looked like a stop.
        let (reason, tail) = match stops.push(&utf8.finish()) {
            StopScan::Continue(text) => (reason, text + &stops.finish()),
            StopScan::Stopped(text) => (FinishReason::Stop, text),
        };
        if reply.send(tail) {
            Outcome::Finished(reason)
        } else {
            Outcome::Cancelled
        }
    }
}
