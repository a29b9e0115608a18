//! Speculation during one reply: which drafts of the last batch are still waiting to be
//! matched, where the next logits are, and what each verification step cost and accepted.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use llama_cpp_2::token::LlamaToken;

use super::DraftDepth;
use crate::engine::decoder::BatchKind;
use crate::engine::sequence::LiveSequence;
use crate::engine::{DraftStats, EngineError};

/// Drafts verified in the target's last batch, and the reply's totals. Without a drafter
/// every step is a plain one-token batch.
pub(crate) struct Speculating<'d> {
    /// The draft depth, learned across replies.
    depth: &'d mut DraftDepth,
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

impl<'d> Speculating<'d> {
    /// A reply starts, drafting as deep as `depth` says.
    pub(crate) fn new(depth: &'d mut DraftDepth) -> Self {
        Self { depth, drafts: VecDeque::new(), proposed: 0, row: 0, step_started: None, drafted: 0, accepted: 0 }
    }

    /// Drafts in the sequence's last batch that are still tentative.
    pub(crate) fn pending(&self) -> usize {
        self.drafts.len()
    }

    /// The reply's drafting totals, with the drafter's `catch_up` with the prompt.
    pub(crate) fn stats(&self, catch_up: u32) -> DraftStats {
        DraftStats { drafted: self.drafted, accepted: self.accepted, catch_up }
    }

    /// Makes the picked `token` part of the sequence and returns the batch index of the logits
    /// that follow it. A token the last batch drafted is already there; otherwise the drafts
    /// left are dropped and `token` is evaluated with up to `room` new drafts after it, all
    /// verified in that one batch.
    pub(crate) fn advance(
        &mut self,
        sequence: &mut LiveSequence<'_>,
        token: LlamaToken,
        room: usize,
    ) -> Result<i32, EngineError> {
        if self.drafts.front() == Some(&token) {
            self.drafts.pop_front();
            self.row += 1;
            return Ok(self.row);
        }
        let started = Instant::now();
        if let Some(previous) = self.step_started {
            let generated = self.proposed - self.drafts.len() + 1;
            self.depth.record_cost(self.proposed > 0, (started - previous).as_secs_f32(), generated);
        }
        self.end_round(sequence)?;
        // The verify batch (the token and its drafts) must fit one llama.cpp batch.
        let room = room.min(sequence.n_batch().saturating_sub(1));
        // While other requests run in lanes, a drafter that would first have to catch up with
        // the prompt waits: its catch-up would slow every step they share.
        let behind_lanes = sequence.lanes_busy() && sequence.backlog() > 0;
        let (drafts, catch_up_time) = if sequence.speculates() && !behind_lanes {
            match self.depth.next(|| sequence.backlog()).min(room) {
                0 => (Vec::new(), Duration::ZERO),
                depth => {
                    let proposal = sequence.propose(token, depth);
                    (proposal.drafts, proposal.catch_up_time)
                }
            }
        } else {
            (Vec::new(), Duration::ZERO)
        };
        // A step's cost leaves out the drafter's catch-up with the prompt.
        self.step_started = sequence.speculates().then_some(started + catch_up_time);
        let mut batch = Vec::with_capacity(drafts.len() + 1);
        batch.push(token);
        batch.extend_from_slice(&drafts);
        sequence.decode(&batch, BatchKind::Generated)?;
        self.proposed = drafts.len();
        self.drafted += drafts.len() as u32;
        self.drafts = drafts.into();
        self.row = 0;
        Ok(0)
    }

    /// Ends a verification step: drafts that no picked token matched leave both caches, the
    /// drafter learns how many were right, and the draft depth adapts.
    ///
    /// # Errors
    /// [`EngineError::CacheCut`] when llama.cpp cannot drop the rejected drafts: the cache is
    /// then cleared, and the reply must not go on from it.
    pub(crate) fn end_round(&mut self, sequence: &mut LiveSequence<'_>) -> Result<(), EngineError> {
        if self.proposed == 0 {
            return Ok(());
        }
        let unused = self.drafts.len();
        let accepted = self.proposed - unused;
        if unused > 0 {
            let keep = sequence.tokens().len() - unused;
            if !sequence.cut(keep) {
                sequence.clear();
                self.drafts.clear();
                self.proposed = 0;
                return Err(EngineError::CacheCut { position: keep });
            }
        }
        sequence.settle(accepted);
        self.depth.record(self.proposed, accepted);
        self.accepted += accepted as u32;
        self.drafts.clear();
        self.proposed = 0;
        Ok(())
    }
}
