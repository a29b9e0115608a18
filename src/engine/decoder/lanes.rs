//! What the decoder does for lanes (`--parallel`) and for a reuse past changed spans: several
//! sequences' tokens in one batch, cells shared between sequences, a lane's state saved,
//! restored and dropped, sequence 0's positions removed and moved. Only the target context:
//! lanes and changed spans run without a drafter (a drafter follows sequence 0 alone).

use llama_cpp_2::llama_batch::LlamaBatch;
use llama_cpp_2::token::LlamaToken;
use llama_cpp_2::DecodeError;

use super::{save_sequence, Decoder, SavedState};
use crate::engine::ffi::set_sequence_state;
use crate::engine::media::projector::{MediaPreparer, Segment};
use crate::engine::EngineError;

/// One sequence's tokens in a batch several sequences share ([`Decoder::decode_shared`]).
#[derive(Clone, Copy, Debug)]
pub(crate) struct SharedPart<'t> {
    /// The sequence.
    pub(crate) seq: i32,
    /// Its tokens, at positions `start..`.
    pub(crate) tokens: &'t [LlamaToken],
    /// The position of its first token.
    pub(crate) start: usize,
}

impl Decoder<'_> {
    /// Evaluates several sequences' tokens in one batch, the logits of each part's last token
    /// kept; returns each part's batch index of them, in order. With a drafter (which follows
    /// sequence 0 alone), only other sequences' tokens: an MTP context is first shown the
    /// prompt batch it has not seen, whose hidden states this batch replaces. The caller
    /// drops the parts' sequences on failure.
    pub(crate) fn decode_shared(&mut self, parts: &[SharedPart<'_>]) -> Result<Vec<i32>, EngineError> {
        self.decode_parts(parts, true)
    }

    /// Evaluates one sequence's tokens with no logits at all (a changed span, read by nothing
    /// but the tokens after it: the output layer, as large as the rest of a small model with a
    /// large vocabulary, is not computed). The caller drops the sequence on failure.
    pub(crate) fn decode_span(&mut self, part: SharedPart<'_>) -> Result<(), EngineError> {
        self.decode_parts(&[part], false).map(drop)
    }

    /// [`Self::decode_shared`], with each part's last logits (`logits`) or none.
    fn decode_parts(&mut self, parts: &[SharedPart<'_>], logits: bool) -> Result<Vec<i32>, EngineError> {
        fail::fail_point!("engine::decode", |_| Err(EngineError::Decode("failure injected at engine::decode".into())));
        let step = (self.target().n_ubatch() as usize).max(1);
        if let [part] = parts {
            if self.guards_window() && part.tokens.len() > step {
                return self.decode_part_by_micro_batch(*part, step, logits);
            }
        }
        if self.speculates() && parts.iter().any(|part| part.seq == 0) {
            return Err(EngineError::Internal("sequence 0 shares a batch beside its drafter".into()));
        }
        if let Self::Mtp(mtp) = self {
            mtp.flush();
        }
        let total = parts.iter().map(|part| part.tokens.len()).sum::<usize>();
        self.guard_before(total);
        let ctx = self.target_mut();
        let mut batch = LlamaBatch::new(total.max(1), 1);
        let mut rows = Vec::with_capacity(parts.len());
        for part in parts {
            for (i, &token) in part.tokens.iter().enumerate() {
                let last = logits && i + 1 == part.tokens.len();
                batch
                    .add(token, (part.start + i) as i32, &[part.seq], last)
                    .map_err(|e| EngineError::Decode(e.to_string()))?;
            }
            rows.push(batch.n_tokens() - 1);
        }
        let units = crate::engine::stall::ubatches(total, ctx.n_ubatch());
        crate::engine::stall::watched(units, || {
            let decoded = ctx.decode(&mut batch);
            if crate::engine::stall::active() {
                crate::engine::ffi::synchronize(ctx);
            }
            decoded
        })
        .map_err(|e| match e {
            DecodeError::Unknown(2) => EngineError::DecodeStopped,
            e => EngineError::Decode(e.to_string()),
        })?;
        Ok(rows)
    }

    /// One sequence's long batch one micro-batch a call (with a window guard, as
    /// [`Decoder::decode`] does), its last token's row as [`Self::decode_shared`] gives it; a
    /// failure drops what the earlier calls placed.
    fn decode_part_by_micro_batch(
        &mut self,
        part: SharedPart<'_>,
        step: usize,
        logits: bool,
    ) -> Result<Vec<i32>, EngineError> {
        let mut rows = Vec::new();
        for (index, tokens) in part.tokens.chunks(step).enumerate() {
            let chunk = SharedPart { tokens, start: part.start + index * step, ..part };
            match self.decode_parts(&[chunk], logits) {
                Ok(last) => rows = last,
                Err(e) => {
                    if index > 0 && !self.cut_sequence(part.seq, part.start) {
                        tracing::warn!(seq = part.seq, "llama.cpp did not drop a failed batch's first micro-batches");
                    }
                    return Err(e);
                }
            }
        }
        Ok(rows)
    }

    /// Evaluates a media `segment` into sequence `seq` (a lane's) at positions `start..`,
    /// through the projector's `media` (see [`MediaPreparer::evaluate`]). Only without a
    /// drafter (start-up turns speculation off with a projector). The caller drops what the
    /// sequence holds past `start` on failure.
    pub(crate) fn decode_lane_media(
        &mut self,
        seq: i32,
        media: &MediaPreparer,
        segment: &Segment,
        start: usize,
        n_batch: usize,
    ) -> Result<(), EngineError> {
        self.guard_before(usize::MAX);
        match self {
            Self::Plain(target, _) => media.evaluate(segment, target, start, seq, n_batch),
            _ => Err(EngineError::Internal("media evaluated with a drafter".into())),
        }
    }

    /// Makes sequence `to` hold sequence 0's first `upto` positions. In a unified cache the
    /// cells are tagged with both sequences: nothing is copied.
    pub(crate) fn share_prefix(&mut self, from: i32, to: i32, upto: usize) -> bool {
        self.target_mut().kv_cache_seq_cp(from, to, Some(0), Some(upto as u32)).is_ok()
    }

    /// Drops sequence 0's positions `from..to` (a changed span, [`crate::engine::policy::plan_changes`]).
    pub(crate) fn remove_positions(&mut self, from: usize, to: usize) -> bool {
        self.guard_dropped();
        self.target_mut().kv_cache_seq_rm(0, Some(from as u32), Some(to as u32)).is_ok()
    }

    /// Moves sequence 0's positions from `from` on by `delta` (llama.cpp rotates their keys
    /// when it next decodes). Only where the cache can move positions
    /// ([`crate::engine::ffi::can_shift_positions`]), and never over cells another sequence
    /// holds too: a cell has one position for all its sequences.
    pub(crate) fn shift_positions(&mut self, from: usize, delta: isize) -> bool {
        self.guard_dropped();
        self.target_mut().kv_cache_seq_add(0, Some(from as u32), None, delta as i32).is_ok()
    }

    /// Tags sequence `from`'s cells at positions `start..end` with sequence `to` too.
    pub(crate) fn share_range(&mut self, from: i32, to: i32, start: usize, end: usize) -> bool {
        self.target_mut().kv_cache_seq_cp(from, to, Some(start as u32), Some(end as u32)).is_ok()
    }

    /// Whether the target's cache can move positions.
    pub(crate) fn can_shift(&self) -> bool {
        matches!(self, Self::Plain(..)) && crate::engine::ffi::can_shift_positions(self.target())
    }

    /// Drops sequence `seq`'s positions from `keep` on (a kept sequence a lane continues).
    pub(crate) fn cut_sequence(&mut self, seq: i32, keep: usize) -> bool {
        self.guard_dropped();
        self.target_mut().kv_cache_seq_rm(seq, Some(keep as u32), None).is_ok()
    }

    /// Drops every cell of sequence `seq` (a lane's; never sequence 0's, see [`Self::clear`]).
    pub(crate) fn drop_sequence(&mut self, seq: i32) {
        self.guard_dropped();
        let ctx = self.target_mut();
        if ctx.kv_cache_seq_rm(seq, None, None).is_err() {
            tracing::warn!(seq, "llama.cpp did not drop a sequence's cells");
        }
    }

    /// Makes sequence `seq` (a lane's) hold a saved state's first `keep` positions: the
    /// target's state only (lanes run without a drafter). False, and the sequence empty, when
    /// llama.cpp refused the state or it does not end where `held` says.
    pub(crate) fn restore_lane(&mut self, seq: i32, state: &SavedState, held: usize, keep: usize) -> bool {
        self.guard_before(usize::MAX);
        let ctx = self.target_mut();
        let restored = set_sequence_state(ctx, &state.target, seq)
            && i64::from(ctx.kv_cache_seq_pos_max(seq)) + 1 == held as i64
            && (keep >= held || ctx.kv_cache_seq_rm(seq, Some(keep as u32), None).is_ok());
        if !restored {
            tracing::warn!(seq, "a stored KV state was not restored into a lane");
            self.drop_sequence(seq);
        }
        restored
    }

    /// The state of sequence `seq` (a lane's), for the state store: the target's only (lanes
    /// run without a drafter).
    pub(crate) fn save_lane(&self, seq: i32) -> Option<SavedState> {
        let target = save_sequence(self.target(), seq)?;
        Some(SavedState { target, drafter: None })
    }
}
