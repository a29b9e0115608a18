//! The inference thread: owns the backend, the model and one long-lived context, and serves
//! queued jobs one at a time, reusing the KV cache's longest common token prefix.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use llama_cpp_2::llama_backend::LlamaBackend;
use llama_cpp_2::model::LlamaModel;
use llama_cpp_2::token::LlamaToken;
use tokio::sync::mpsc::UnboundedSender;

use super::decoder::{BatchKind, Decoder};
use super::ffi::effective_sliding_window;
use super::load::{create_decoder, Models};
use super::prefix::{common_prefix_len, plan_reuse, window_covers};
use super::sampling::TokenPicker;
use super::speculation::{DraftDepth, SpeculationPlan};
use super::text::{longest_run, StopMatcher, StopScan, Utf8Stream};
use super::{Command, DraftStats, EngineConfig, EngineError, Event, FinishReason, Job, ModelInfo, Timings, Usage};
use crate::chat::{ChatFormat, ModelTemplateFacts};

/// Longest run of characters of one kind a text prompt may hold (see [`longest_run`]). With
/// the inference thread's reserved stack, llama.cpp's `std::regex` pre-tokenizers were measured
/// to split far longer runs; real text has none this long.
pub(crate) const MAX_PROMPT_RUN: usize = 65_536;

/// A prompt after template rendering, before tokenization.
#[derive(Debug)]
pub(crate) enum PromptInput {
    Text(String),
    Tokens(Vec<i32>),
}

/// Body of the inference thread.
pub(super) fn run(
    config: &EngineConfig,
    report: impl FnOnce(Result<(ModelInfo, ChatFormat), EngineError>),
    commands: &Receiver<Command>,
    shutting_down: &AtomicBool,
) {
    let Models { backend, model, draft_model, plan } = match Models::load(config) {
        Ok(models) => models,
        Err(e) => return report(Err(e)),
    };
    let session = Session::new(backend, &model, draft_model.as_ref(), &plan, config, shutting_down);
    let mut session = match session {
        Ok((session, info, chat)) => {
            report(Ok((info, chat)));
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

/// The live context and the exact token list its KV cache holds (prompt and generated tokens).
struct Session<'m> {
    model: &'m LlamaModel,
    decoder: Decoder<'m>,
    /// How many drafted tokens to verify per step.
    depth: DraftDepth,
    cached: Vec<LlamaToken>,
    n_swa: Option<u32>,
    /// The model keeps recurrent state, which can be cut only within the last batch.
    recurrent: bool,
    /// Recurrent-state snapshots per sequence (`n_rs_seq`): the deepest rollback.
    rs_snapshots: usize,
    /// How many of the last cached positions the cache can drop now (recurrent models).
    rewindable: usize,
    n_batch: usize,
    /// Most tokens generated when a request sets no limit.
    n_predict: Option<u32>,
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
    /// When the last step started (after the drafter caught up), with speculation on.
    step_started: Option<Instant>,
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
    ) -> Result<(Self, ModelInfo, ChatFormat), EngineError> {
        let architecture = model.meta_val_str("general.architecture").unwrap_or_default();
        // The window llama.cpp applies, which the GGUF key alone does not always tell.
        let n_swa = effective_sliding_window(model);
        let n_ctx_train = model.n_ctx_train();
        let (decoder, n_batch, rs_snapshots) = create_decoder(backend, model, draft_model, plan, config)?;

        let vocab = model.vocab();
        let token_text = |t: LlamaToken| String::from_utf8_lossy(&vocab.token_to_piece(t, true, None)).into_owned();
        let bos_text = token_text(vocab.bos());
        let facts = ModelTemplateFacts {
            gguf_template: model.chat_template(None).ok().and_then(|t| t.to_string().ok()),
            architecture: architecture.clone(),
            bos_token: bos_text.clone(),
            eos_token: token_text(vocab.eos()),
        };
        let chat = ChatFormat::for_model(&facts, config.chat_template_file.as_deref())
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
            template_source: chat.source().clone(),
            tool_format: chat.tool_format(),
            threads: config.threads,
            threads_batch: config.threads_batch,
        };
        let session = Self {
            model,
            decoder,
            depth: DraftDepth::new(plan.draft_max, plan.always),
            cached: Vec::new(),
            n_swa,
            recurrent: model.is_recurrent() || model.is_hybrid(),
            rs_snapshots: rs_snapshots as usize,
            rewindable: 0,
            n_batch,
            n_predict: config.n_predict,
            bos_text,
            shutting_down,
        };
        Ok((session, info, chat))
    }

    fn tokenize(&self, prompt: PromptInput) -> Result<Vec<LlamaToken>, EngineError> {
        let vocab = self.model.vocab();
        let tokens = match prompt {
            PromptInput::Text(text) => {
                let run = longest_run(&text);
                if run > MAX_PROMPT_RUN {
                    return Err(EngineError::PromptRunTooLong { run, max: MAX_PROMPT_RUN });
                }
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
        let Job { prompt, request, events, finish_requested, _admitted } = job;
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
        let limit = request.max_tokens.or(self.n_predict).unwrap_or(u32::MAX).min(n_ctx - prompt_tokens);
        // llama.cpp allocates the penalty window up front: never more than the context.
        let mut sampling = request.sampling.clone();
        sampling.repeat_last_n = sampling.repeat_last_n.clamp(0, n_ctx as i32);
        let picker = match TokenPicker::new(self.model, &sampling, request.grammar.as_ref()) {
            Ok(picker) => picker,
            Err(e) => {
                let _ = events.send(Event::Failed(e));
                return;
            }
        };

        // What the drafter evaluated for the last reply's upkeep is no part of this request.
        self.decoder.take_catch_up();
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
        if let Err(e) = self.end_round(&mut speculating) {
            // The reply itself is complete; only the cache for the next turn is lost.
            tracing::warn!("{e}");
        }
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
        // After the answer: the MTP context catches up with a prompt batch it has not seen yet.
        self.decoder.mirror_pending();
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
        let n_ctx = self.decoder.target().n_ctx() as usize;
        if common == self.cached.len()
            || redo > self.n_batch
            || canonical.len() >= n_ctx
            || self.shutting_down.load(Ordering::Relaxed)
        {
            return;
        }
        if !window_covers(self.decoder.target().kv_cache_seq_pos_min(0), common, self.n_swa) || !self.cut(common) {
            return;
        }
        tracing::debug!(
            common,
            redo,
            cached = self.cached.len(),
            "re-evaluating the reply as the next turn will send it"
        );
        // A strict prefix (the reply ended in held-back stop text) needs only the cut.
        if redo > 0 {
            if let Err(e) = self.decode(&canonical[common..], BatchKind::Prompt) {
                tracing::warn!("re-evaluating the reply failed: {e}");
            }
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
        if keep > 0 && !self.cut(keep) {
            tracing::warn!(keep, cached = self.cached.len(), "the KV cache cannot be cut there; prefilling in full");
            keep = 0;
        }
        if keep == 0 {
            self.decoder.clear();
            self.cached.clear();
        }
        keep
    }

    /// Drops every cached position from `keep` on. False, and nothing cut, where the cache
    /// cannot be cut: recurrent state (Mamba, and the recurrent layers of hybrid models) rolls
    /// back only through llama.cpp's snapshots of the last batch's tokens, and llama.cpp
    /// accepts a deeper cut than those hold and then computes from a wrong state.
    fn cut(&mut self, keep: usize) -> bool {
        if keep >= self.cached.len() {
            return true;
        }
        if self.recurrent && self.cached.len() - keep > self.rewindable {
            return false;
        }
        if !self.decoder.truncate(keep) {
            return false;
        }
        self.cached.truncate(keep);
        // A rollback is single-use until the next batch.
        self.rewindable = 0;
        true
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
            let kind = if i + 1 == chunks { BatchKind::PromptEnd } else { BatchKind::Prompt };
            last_index = self.decode(chunk, kind)?;
        }
        Ok(Some(last_index))
    }

    /// Evaluates tokens at the next cache positions and records them as cached; returns the
    /// batch index of the last token. On failure the cache is cleared, since llama.cpp's state
    /// is then unknown.
    fn decode(&mut self, tokens: &[LlamaToken], kind: BatchKind) -> Result<i32, EngineError> {
        if tokens.is_empty() {
            return Err(EngineError::Decode("nothing to evaluate".into()));
        }
        if let Err(e) = self.decoder.decode(tokens, self.cached.len(), kind) {
            self.decoder.clear();
            self.cached.clear();
            self.rewindable = 0;
            return Err(e);
        }
        self.cached.extend_from_slice(tokens);
        self.rewindable = (tokens.len() - 1).min(self.rs_snapshots);
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
        let started = Instant::now();
        if let Some(previous) = speculating.step_started {
            let generated = speculating.proposed - speculating.drafts.len() + 1;
            self.depth.record_cost(speculating.proposed > 0, (started - previous).as_secs_f32(), generated);
        }
        self.end_round(speculating)?;
        // The verify batch (the token and its drafts) must fit one llama.cpp batch.
        let room = room.min(self.n_batch.saturating_sub(1));
        let (drafts, catch_up_time) = if self.decoder.speculates() {
            match self.depth.next(|| self.decoder.backlog(&self.cached)).min(room) {
                0 => (Vec::new(), Duration::ZERO),
                depth => {
                    let proposal = self.decoder.propose(&self.cached, token, depth);
                    (proposal.drafts, proposal.catch_up_time)
                }
            }
        } else {
            (Vec::new(), Duration::ZERO)
        };
        // A step's cost leaves out the drafter's catch-up with the prompt.
        speculating.step_started = self.decoder.speculates().then_some(started + catch_up_time);
        let mut batch = Vec::with_capacity(drafts.len() + 1);
        batch.push(token);
        batch.extend_from_slice(&drafts);
        self.decode(&batch, BatchKind::Generated)?;
        speculating.proposed = drafts.len();
        speculating.drafted += drafts.len() as u32;
        speculating.drafts = drafts.into();
        speculating.row = 0;
        Ok(0)
    }

    /// Ends a verification step: drafts that no picked token matched leave both caches, the
    /// drafter learns how many were right, and the draft depth adapts.
    ///
    /// # Errors
    /// [`EngineError::CacheCut`] when llama.cpp cannot drop the rejected drafts: the cache is
    /// then cleared, and the reply must not go on from it.
    fn end_round(&mut self, speculating: &mut Speculating) -> Result<(), EngineError> {
        if speculating.proposed == 0 {
            return Ok(());
        }
        let unused = speculating.drafts.len();
        let accepted = speculating.proposed - unused;
        if unused > 0 {
            let keep = self.cached.len() - unused;
            if !self.cut(keep) {
                self.decoder.clear();
                self.cached.clear();
                speculating.drafts.clear();
                speculating.proposed = 0;
                return Err(EngineError::CacheCut { position: keep });
            }
        }
        self.decoder.settle(accepted);
        self.depth.record(speculating.proposed, accepted);
        speculating.accepted += accepted as u32;
        speculating.drafts.clear();
        speculating.proposed = 0;
        Ok(())
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
            // Stop strings cut free text only, never constrained output (a call, JSON).
            let scan =
                if picker.constraining() { StopScan::Continue(stops.finish() + &text) } else { stops.push(&text) };
            match scan {
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
        let rest = utf8.finish();
        let scan = if picker.constraining() { StopScan::Continue(stops.finish() + &rest) } else { stops.push(&rest) };
        let (reason, tail) = match scan {
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
