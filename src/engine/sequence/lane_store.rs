//! What a lane leaves in the RAM store and the disk cache: its conversation when it ends, and,
//! on models whose cache cannot be cut everywhere (a sliding window, a recurrent state), the checkpoints sequence
//! 0 would take of the same prompt and reply — at the prompt's end once its first token is out,
//! every `--checkpoint-every` tokens of a long prompt, and every few reply tokens once the
//! window has dropped positions. The same pure rules decide ([`policy::plan_evaluation`],
//! [`policy::reply_checkpoint_due`]); a lane's next turn, or sequence 0's, restores them as it
//! restores sequence 0's.

use std::time::Instant;

use llama_cpp_2::token::LlamaToken;

use super::LiveSequence;
use crate::engine::policy::{self, LiveView, PartialMarks, Purpose};
use crate::engine::schedule::SeqId;
use crate::engine::CacheEntryKind;

impl LiveSequence<'_> {
    /// Saves lane `seq`, which holds `tokens`, in the RAM store (a conversation worth keeping)
    /// and queues it for the disk cache's writer (the same bytes, written on its own thread
    /// when the engine is not computing), so its next turn is warm after a restart too.
    pub(super) fn keep_lane(&mut self, seq: SeqId, tokens: Vec<LlamaToken>) {
        if tokens.len() >= self.min_save {
            if let Some(state) = self.decoder.save_lane(seq) {
                self.write_to_disk(&tokens, &state, CacheEntryKind::Snapshot);
                self.insert(tokens, state, CacheEntryKind::Snapshot);
            }
        }
    }

    /// Lane `seq`'s prompt is evaluated and its first token out: the prompt's checkpoint,
    /// where the cache policy takes one at a reply prompt's end.
    pub(super) fn checkpoint_lane_prompt(&mut self, seq: SeqId) {
        let Some((tokens, prompt_len)) = self.lanes.progress(seq) else { return };
        let plan = policy::plan_evaluation(
            self.shape,
            self.takes_checkpoints(),
            Purpose::Reply,
            prompt_len,
            0,
            PartialMarks::default(),
            self.min_save,
        );
        if plan.checkpoint_end && tokens.len() == prompt_len {
            self.checkpoint_lane(seq);
        }
    }

    /// A chunk of lane `seq`'s prompt took it from `before` tokens to what it holds: a
    /// checkpoint when that passed a multiple of `--checkpoint-every` (the prompt's end is
    /// checkpointed once its first token is out instead).
    pub(super) fn checkpoint_lane_prefill(&mut self, seq: SeqId, before: usize) {
        let Some((tokens, prompt_len)) = self.lanes.progress(seq) else { return };
        let held = tokens.len();
        if held < prompt_len && self.periodic_checkpoint_due(before, held) {
            self.checkpoint_lane(seq);
        }
    }

    /// Lane `seq`'s reply token was evaluated: a checkpoint where the cache policy says a later
    /// cut inside the reply could not be served from its cells.
    pub(super) fn checkpoint_lane_reply(&mut self, seq: SeqId) {
        let Some((tokens, prompt_len)) = self.lanes.progress(seq) else { return };
        let view = LiveView {
            tokens,
            rewindable: 0,
            pos_min: self.decoder.target().kv_cache_seq_pos_min(seq),
            reply_start: Some(prompt_len),
        };
        if policy::reply_checkpoint_due(self.shape, self.takes_checkpoints(), view, prompt_len, self.min_save) {
            self.checkpoint_lane(seq);
        }
    }

    /// Saves what lane `seq` holds now as a checkpoint.
    fn checkpoint_lane(&mut self, seq: SeqId) {
        let Some((tokens, _)) = self.lanes.progress(seq) else { return };
        let tokens = tokens.to_vec();
        let started = Instant::now();
        if let Some(state) = self.decoder.save_lane(seq) {
            tracing::debug!(
                seq,
                tokens = tokens.len(),
                ms = started.elapsed().as_secs_f32() * 1000.0,
                "a lane's checkpoint taken"
            );
            self.insert(tokens, state, CacheEntryKind::Checkpoint);
        }
    }
}
