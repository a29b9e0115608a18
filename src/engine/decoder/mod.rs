//! The target context and whatever drafts for it. Every batch the target evaluates and every
//! cut of its cache goes through here, so a drafter's own context always mirrors the target's.

use std::time::Duration;

use std::sync::Arc;

use llama_cpp_2::context::LlamaContext;
use llama_cpp_2::llama_batch::LlamaBatch;
use llama_cpp_2::token::LlamaToken;
use llama_cpp_2::DecodeError;

mod drafters;
mod lanes;
mod window_guard;

pub(crate) use lanes::SharedPart;
pub(crate) use window_guard::WindowGuard;

use super::ffi::{sequence_state, sequence_state_size, set_sequence_state, set_threads, stop_decodes_with, DecodeStop};
use super::media::projector::{Projector, Segment};
use super::store::StateBytes;
use super::threads::ThreadCounts;
use super::EngineError;
pub(crate) use drafters::{ModelDrafter, MtpDrafter};

/// What a batch for the target holds.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum BatchKind {
    /// Prompt tokens before the prompt's last batch (no logits).
    Prompt,
    /// The prompt's last batch: logits for its last token. An MTP drafter sees it only when the
    /// first draft is asked for, so its work does not delay the first token.
    PromptEnd,
    /// A picked token and the drafts after it: logits for every one.
    Generated,
}

impl BatchKind {
    fn logits(self) -> Logits {
        match self {
            Self::Prompt => Logits::None,
            Self::PromptEnd => Logits::Last,
            Self::Generated => Logits::All,
        }
    }
}

/// Which positions of a batch get logits.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Logits {
    /// None (prompt batches before the last).
    None,
    /// Only the last token (prompt evaluation, plain generation).
    Last,
    /// Every token (verifying drafts).
    All,
}

/// The target context, alone or with a drafter.
pub(crate) enum Decoder<'m> {
    /// No speculation; with a guard where a sliding window's cells must all stay
    /// ([`WindowGuard`]).
    Plain(LlamaContext<'m>, Option<WindowGuard>),
    /// The model's MTP heads draft, in their own context fed with the target's hidden states.
    Mtp(MtpDrafter<'m>),
    /// A separate draft model with the same vocabulary.
    Model(ModelDrafter<'m>),
}

/// A drafter's proposal.
pub(crate) struct Proposal {
    /// The drafted tokens.
    pub drafts: Vec<LlamaToken>,
    /// Time spent first following the target's cache (prompt tokens the drafter had not seen),
    /// a cost of the turn rather than of this step.
    pub catch_up_time: Duration,
}

/// A saved sequence: the target's state and its drafter's, with the tokens a draft model's
/// context held (an MTP context mirrors the target's tokens). The bytes are shared, so the
/// disk cache writes what the RAM store holds without a copy.
#[derive(Clone)]
pub(crate) struct SavedState {
    target: Arc<Vec<u8>>,
    drafter: Option<(Arc<Vec<u8>>, Vec<LlamaToken>)>,
}

impl SavedState {
    /// A state read back from a disk file whose checksum and header (model, build, context
    /// parameters) matched this engine's: exactly the bytes an earlier [`Decoder::save`] of
    /// such a context produced.
    pub(crate) fn from_verified(target: Vec<u8>, drafter: Option<(Vec<u8>, Vec<LlamaToken>)>) -> Self {
        Self { target: Arc::new(target), drafter: drafter.map(|(bytes, tokens)| (Arc::new(bytes), tokens)) }
    }

    /// The target's state bytes.
    pub(crate) fn target_bytes(&self) -> &[u8] {
        &self.target
    }

    /// The drafter's state bytes and the tokens a draft model's context held.
    pub(crate) fn drafter(&self) -> Option<(&[u8], &[LlamaToken])> {
        self.drafter.as_ref().map(|(bytes, tokens)| (bytes.as_slice(), tokens.as_slice()))
    }
}

impl StateBytes for SavedState {
    fn byte_len(&self) -> usize {
        self.target.len() + self.drafter.as_ref().map_or(0, |(state, _)| state.len())
    }
}

impl std::fmt::Debug for SavedState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SavedState").field("bytes", &self.byte_len()).finish()
    }
}

/// Sequence `seq`'s state of `ctx`.
fn save_sequence(ctx: &LlamaContext<'_>, seq: i32) -> Option<Arc<Vec<u8>>> {
    let state = sequence_state(ctx, seq).map(Arc::new);
    if state.is_none() {
        tracing::warn!("saving the KV state failed: llama.cpp wrote another size than it announced");
    }
    state
}

/// Empties sequence 0 of the target, leaving other sequences' cells (the lanes') alone; the
/// whole cache where llama.cpp refuses.
fn clear_sequence_zero(ctx: &mut LlamaContext<'_>) {
    if ctx.kv_cache_seq_rm(0, None, None).is_err() {
        ctx.clear_kv_cache();
    }
}

fn build_batch(tokens: &[LlamaToken], start: usize, logits: Logits) -> Result<LlamaBatch<'static>, EngineError> {
    let mut batch = LlamaBatch::new(tokens.len().max(1), 1);
    for (i, &token) in tokens.iter().enumerate() {
        let wants = logits == Logits::All || (logits == Logits::Last && i + 1 == tokens.len());
        batch.add(token, (start + i) as i32, &[0], wants).map_err(|e| EngineError::Decode(e.to_string()))?;
    }
    Ok(batch)
}

impl<'m> Decoder<'m> {
    /// The target context (logits, sizes).
    pub(crate) fn target(&self) -> &LlamaContext<'m> {
        match self {
            Self::Plain(ctx, _) => ctx,
            Self::Mtp(mtp) => mtp.spec.target_context(),
            Self::Model(model) => &model.target,
        }
    }

    /// Lets `stop` end a decode of the target midway (see [`stop_decodes_with`]); only without
    /// a drafter, whose context would have to follow. False where it could not be set. The
    /// caller keeps `stop` as long as the decoder.
    pub(crate) fn stop_decodes_with(&mut self, stop: &Arc<DecodeStop>) -> bool {
        match self {
            Self::Plain(ctx, _) => stop_decodes_with(ctx, stop),
            Self::Mtp(_) | Self::Model(_) => false,
        }
    }

    fn target_mut(&mut self) -> &mut LlamaContext<'m> {
        match self {
            Self::Plain(ctx, _) => ctx,
            Self::Mtp(mtp) => mtp.spec.target_context_mut(),
            Self::Model(model) => &mut model.target,
        }
    }

    /// The sequence state, for the state store: the target's, with the drafter's own context
    /// (an MTP context holds the hidden states of what the target evaluated; a draft model's
    /// would otherwise have to evaluate the whole restored prompt again after the first token).
    pub(crate) fn save(&mut self) -> Option<SavedState> {
        if let Self::Mtp(mtp) = self {
            mtp.flush();
        }
        let target = save_sequence(self.target(), 0)?;
        let drafter = match self {
            Self::Plain(..) => None,
            Self::Mtp(mtp) => Some((save_sequence(mtp.spec.draft_context_mut(), 0)?, Vec::new())),
            Self::Model(model) => Some((save_sequence(&model.draft, 0)?, model.cached.clone())),
        };
        Some(SavedState { target, drafter })
    }

    /// Bytes [`Decoder::save`] would copy now, the drafter's included (counted, not copied).
    pub(crate) fn state_size(&mut self) -> usize {
        let target = sequence_state_size(self.target(), 0);
        target
            + match self {
                Self::Plain(..) => 0,
                Self::Mtp(mtp) => sequence_state_size(mtp.spec.draft_context_mut(), 0),
                Self::Model(model) => sequence_state_size(&model.draft, 0),
            }
    }

    /// Replaces the cache with a saved state. False, and the cache empty, when llama.cpp
    /// refused the target's state; a drafter context that refuses its own is emptied (its
    /// drafts are then rejected more often, or it catches up again: never accepted wrongly).
    pub(crate) fn restore(&mut self, state: &SavedState) -> bool {
        self.clear();
        fail::fail_point!("engine::restore", |_| false);
        self.guard_before(usize::MAX);
        let ctx = self.target_mut();
        if !set_sequence_state(ctx, &state.target, 0) {
            tracing::warn!("restoring a KV state failed: llama.cpp refused it");
            clear_sequence_zero(ctx);
            return false;
        }
        let Some((drafter, tokens)) = &state.drafter else { return true };
        let restored = match self {
            Self::Plain(..) => true,
            Self::Mtp(mtp) => set_sequence_state(mtp.spec.draft_context_mut(), drafter, 0),
            Self::Model(model) => {
                set_sequence_state(&mut model.draft, drafter, 0) && {
                    model.cached.clone_from(tokens);
                    true
                }
            }
        };
        if !restored {
            tracing::warn!("restoring the drafter's state failed; it starts over");
            self.clear_drafter();
        }
        true
    }

    /// Empties the drafter's context.
    fn clear_drafter(&mut self) {
        match self {
            Self::Plain(..) => {}
            Self::Mtp(mtp) => mtp.spec.draft_context_mut().clear_kv_cache(),
            Self::Model(model) => {
                model.draft.clear_kv_cache();
                model.cached.clear();
            }
        }
    }

    /// What drafts: `none`, `mtp` or `model`.
    pub(crate) fn drafter_name(&self) -> &'static str {
        match self {
            Self::Plain(..) => "none",
            Self::Mtp(_) => "mtp",
            Self::Model(_) => "model",
        }
    }

    /// Whether anything drafts.
    pub(crate) fn speculates(&self) -> bool {
        !matches!(self, Self::Plain(..))
    }

    /// Whether the drafter's context mirrors what the target evaluated for sequence 0 (MTP:
    /// the target's hidden states), rather than following its tokens on its own.
    pub(crate) fn mirrors_target(&self) -> bool {
        matches!(self, Self::Mtp(_))
    }

    /// Evaluates `tokens` at positions `start..` in the target; an MTP drafter sees the batch
    /// too (see [`BatchKind::PromptEnd`] for when); returns the row of the last token's logits.
    /// The caller clears the cache on failure. With a window guard, a prompt batch longer than
    /// a micro-batch is evaluated one micro-batch a call, so the guard holds each one's cells
    /// before the next is placed; a failure then drops what the earlier calls placed, as
    /// llama.cpp does for one call.
    pub(crate) fn decode(&mut self, tokens: &[LlamaToken], start: usize, kind: BatchKind) -> Result<i32, EngineError> {
        fail::fail_point!("engine::decode", |_| Err(EngineError::Decode("failure injected at engine::decode".into())));
        let step = (self.target().n_ubatch() as usize).max(1);
        if !self.guards_window() || kind == BatchKind::Generated || tokens.len() <= step {
            self.decode_call(tokens, start, kind)?;
            return Ok(tokens.len() as i32 - 1);
        }
        let chunks = tokens.chunks(step).count();
        let mut last_row = 0;
        for (index, chunk) in tokens.chunks(step).enumerate() {
            let kind = if index + 1 == chunks { kind } else { BatchKind::Prompt };
            if let Err(e) = self.decode_call(chunk, start + index * step, kind) {
                if index > 0 && !self.truncate(start) {
                    tracing::warn!("llama.cpp did not drop a failed batch's first micro-batches");
                }
                return Err(e);
            }
            last_row = chunk.len() as i32 - 1;
        }
        Ok(last_row)
    }

    /// One llama.cpp call for [`Self::decode`].
    fn decode_call(&mut self, tokens: &[LlamaToken], start: usize, kind: BatchKind) -> Result<(), EngineError> {
        let mut batch = build_batch(tokens, start, kind.logits())?;
        if let Self::Mtp(mtp) = self {
            mtp.flush();
        }
        self.guard_before(tokens.len());
        let units = super::stall::ubatches(tokens.len(), self.target().n_ubatch());
        let ctx = self.target_mut();
        super::stall::watched(units, || {
            let decoded = ctx.decode(&mut batch);
            if super::stall::active() {
                super::ffi::synchronize(ctx);
            }
            decoded
        })
        .map_err(|e| match e {
            // llama.cpp's code for a decode its abort callback stopped ([`Self::stop_decodes_with`]).
            DecodeError::Unknown(2) => EngineError::DecodeStopped,
            e => EngineError::Decode(e.to_string()),
        })?;
        if let Self::Mtp(mtp) = self {
            if kind != BatchKind::Generated {
                mtp.catch_up += tokens.len() as u32;
            }
            if kind == BatchKind::PromptEnd {
                mtp.deferred = Some((tokens.to_vec(), start));
            } else {
                mtp.mirror(&batch, start);
            }
        }
        Ok(())
    }

    /// Evaluates a media's tokens at positions `start..` in the target (see
    /// [`Projector::evaluate`]). Only without a drafter (which would have to see the media's
    /// embeddings too: start-up turns speculation off with a projector). The caller clears the
    /// cache on failure.
    pub(crate) fn decode_media(
        &mut self,
        projector: &mut Projector,
        segment: &Segment,
        start: usize,
        n_batch: usize,
    ) -> Result<(), EngineError> {
        self.guard_before(usize::MAX);
        match self {
            Self::Plain(target, _) => projector.evaluate(segment, target, start, n_batch),
            _ => Err(EngineError::Internal("media evaluated with a drafter".into())),
        }
    }

    /// Sets the threads of the target's and the drafter's contexts (see [`super::threads`]) and
    /// returns the counts llama.cpp then reports for them; `None` when a context could not be
    /// reached or two report different counts.
    pub(crate) fn set_threads(&mut self, counts: ThreadCounts) -> Option<ThreadCounts> {
        let both = |a: Option<ThreadCounts>, b: Option<ThreadCounts>| a.filter(|a| Some(*a) == b);
        match self {
            Self::Plain(ctx, _) => set_threads(ctx, counts),
            Self::Mtp(mtp) => {
                let target = set_threads(mtp.spec.target_context_mut(), counts);
                both(target, set_threads(mtp.spec.draft_context_mut(), counts))
            }
            Self::Model(model) => {
                let target = set_threads(&mut model.target, counts);
                both(target, set_threads(&mut model.draft, counts))
            }
        }
    }

    /// Drops every cached position from `keep` on, in the target and the MTP context (a draft
    /// model's context is matched against the target's tokens when it next drafts). False if
    /// llama.cpp refused, and then nothing was cut.
    pub(crate) fn truncate(&mut self, keep: usize) -> bool {
        if let Self::Mtp(mtp) = self {
            mtp.flush();
        }
        if self.target_mut().kv_cache_seq_rm(0, Some(keep as u32), None).is_err() {
            return false;
        }
        self.guard_dropped();
        if let Self::Mtp(mtp) = self {
            if mtp.spec.draft_context_mut().kv_cache_seq_rm(0, Some(keep as u32), None).is_err() {
                mtp.spec.draft_context_mut().clear_kv_cache();
            }
        }
        true
    }

    /// Empties every cache.
    pub(crate) fn clear(&mut self) {
        if let Self::Mtp(mtp) = self {
            mtp.deferred = None;
        }
        clear_sequence_zero(self.target_mut());
        self.guard_dropped();
        self.clear_drafter();
    }

    /// Shows an MTP drafter the prompt batch it has not seen yet (the reply ended before any
    /// draft was asked for), so the next request does not pay for it.
    pub(crate) fn mirror_pending(&mut self) {
        if let Self::Mtp(mtp) = self {
            mtp.flush();
        }
    }

    /// A new reply starts.
    pub(crate) fn begin_reply(&mut self) {
        if let Self::Mtp(mtp) = self {
            mtp.begun = false;
        }
    }

    /// Up to `max` tokens likely to follow `history` + `id_last` (the target's cache holds
    /// `history`; `id_last` is the token just picked, not evaluated yet).
    pub(crate) fn propose(&mut self, history: &[LlamaToken], id_last: LlamaToken, max: usize) -> Proposal {
        match self {
            Self::Plain(..) => Proposal { drafts: Vec::new(), catch_up_time: Duration::ZERO },
            Self::Mtp(mtp) => mtp.propose(history, id_last, max),
            Self::Model(model) => model.propose(history, id_last, max),
        }
    }

    /// Brings a draft model's context up to `history` by at most `most` tokens now (while the
    /// user listens) instead of at the next reply's first drafts; whether it holds all of it
    /// (an MTP context follows every batch already; a failed evaluation gives up: true).
    pub(crate) fn follow(&mut self, history: &[LlamaToken], most: usize) -> bool {
        let Self::Model(model) = self else { return true };
        model.follow(history, most).unwrap_or_else(|e| {
            tracing::warn!("draft model: {e}");
            true
        })
    }

    /// Tokens of `history` the drafter would have to evaluate before drafting after it (an MTP
    /// context follows every batch and is never behind).
    pub(crate) fn backlog(&self, history: &[LlamaToken]) -> usize {
        match self {
            Self::Model(model) => model.backlog(history),
            Self::Plain(..) | Self::Mtp(_) => 0,
        }
    }

    /// Tokens of the target's cache the drafter's context evaluated since the last call (to
    /// follow prompts, not to draft or verify): a cached turn costs it only the new suffix.
    pub(crate) fn take_catch_up(&mut self) -> u32 {
        match self {
            Self::Plain(..) => 0,
            Self::Mtp(mtp) => std::mem::take(&mut mtp.catch_up),
            Self::Model(model) => std::mem::take(&mut model.catch_up),
        }
    }

    /// The target verified the last proposal: its first `accepted` tokens were right.
    pub(crate) fn settle(&mut self, accepted: usize) {
        if let Self::Mtp(mtp) = self {
            mtp.settle(accepted);
        }
    }
}
