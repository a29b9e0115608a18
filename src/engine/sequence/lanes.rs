//! Lanes: other conversations' replies computed in the live sequence's context, beside it
//! (`--parallel`). A request that arrives while a reply streams takes a free sequence of the
//! unified KV cache: it shares the cells of the longest prefix a live sequence holds (tagged,
//! not copied), its prompt is evaluated in chunks between the streaming replies' steps, and
//! its tokens then go into the same batch as theirs, one step for all. What goes into each
//! step is decided by the pure scheduler ([`crate::engine::schedule`]); this carries it out.
//!
//! A prompt chunk is decoded in a call of its own, never in the batch of a reply's token: a
//! reply's numbers then never depend on a prompt evaluated beside it (llama.cpp's kernels sum
//! a token's products differently in a large batch; see docs/serving.md). A lane that ends
//! leaves its conversation in the RAM store for its next turn, and in its cells, kept
//! ([`super::kept`]), until they or its sequence are needed.

use std::time::{Duration, Instant};

use llama_cpp_2::token::LlamaToken;
use tokio::sync::mpsc::UnboundedSender;

use super::kept::Kept;
use super::lane_media::{next_chunk, ChunkOutcome, LaneChunk};
use super::LiveSequence;
use crate::engine::decoder::SharedPart;
use crate::engine::media::{whole_media_prefix, MediaSpan};
use crate::engine::queue::Admission;
use crate::engine::reply::{Generating, Halt, Picked, Reply};
use crate::engine::sampling::Logits;
use crate::engine::schedule::{next_batch, Limits, Need, Pending, SeqId, StepCost, Waiter, Work};
use crate::engine::{CacheReport, EngineError, Event, LaneCounts, RequestPath, SharedSteps, Timings, Usage};

/// The speech floor: a streaming reply a person reads gets a token at least this often while
/// other work shares its steps (12 tokens a second, faster than speech).
pub(crate) const SPEECH_FLOOR: Duration = Duration::from_millis(83);

/// Fewest prompt tokens a step evaluates while a prompt waits, whatever the floor says.
const MIN_PROMPT_CHUNK: u32 = 16;

/// The sequence of the live sequence (the one the cache policy, the store and the disk serve).
pub(super) const HOME: SeqId = 0;

/// Sequence 0's part in a step of the lanes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum HomePart {
    /// Sequence 0 generates nothing now (it is idle, or evaluates a prompt).
    Absent,
    /// Its next token, in the same batch as the lanes' tokens.
    Rides(LlamaToken),
    /// It generates in a batch of its own, right after the lanes' step: its token and a
    /// drafter's drafts (the drafter follows sequence 0's batches alone).
    Apart,
}

/// What a lane calls with its reply's text before the client has it.
pub(crate) type Remember<'m> = Box<dyn FnOnce(&str) + 'm>;

/// A request admitted beside the live sequence's reply, ready to take a lane.
pub(crate) struct LaneStart<'m> {
    /// Its prompt's tokens.
    pub(crate) prompt: Vec<LlamaToken>,
    /// Where the prompt's media lie (evaluated whole, through the projector).
    pub(crate) media: Vec<MediaSpan>,
    /// The most tokens its reply may have.
    pub(crate) limit: u32,
    /// Its reply, begun ([`Reply::begin`]).
    pub(crate) reply: Reply<'m>,
    /// Its generation state.
    pub(crate) generating: Generating<'m>,
    /// Where its events go.
    pub(crate) events: UnboundedSender<Event>,
    /// The prompt opened the model's reasoning.
    pub(crate) in_reasoning: bool,
    /// What the request cost before it was admitted.
    pub(crate) request: Option<RequestPath>,
    /// Called with the reply's text before the client has it (the chat format remembers the
    /// calls it made, for the next turn's rendering).
    pub(crate) remember: Remember<'m>,
    /// Its place in the queue's admission count, held until it ends.
    pub(crate) admitted: Admission,
}

/// A request being served in a sequence of its own.
struct Lane<'m> {
    seq: SeqId,
    /// What the sequence holds, position by position.
    tokens: Vec<LlamaToken>,
    /// Of these, the first ones whose cells sequence 0 holds too (counted there).
    shared: usize,
    /// The prompt; `tokens` holds all of it once it is evaluated.
    prompt: Vec<LlamaToken>,
    /// Where the prompt's media lie.
    media: Vec<MediaSpan>,
    /// The most positions the lane may come to hold.
    reserve: usize,
    /// A picked token waiting for its evaluation in the next step.
    next: Option<LlamaToken>,
    reply: Reply<'m>,
    generating: Generating<'m>,
    events: UnboundedSender<Event>,
    admitted: Instant,
    /// When its first token was picked.
    first_token: Option<Instant>,
    /// When its last token was picked.
    last_token: Option<Instant>,
    prompt_time: Duration,
    cache: CacheReport,
    request: Option<RequestPath>,
    remember: Option<Remember<'m>>,
    /// Most other replies that shared a step with this one.
    beside: u32,
    _admitted: Admission,
}

impl Lane<'_> {
    fn prompt_left(&self) -> usize {
        self.prompt.len().saturating_sub(self.tokens.len())
    }
}

/// The lanes of the live sequence's context.
pub(crate) struct Lanes<'m> {
    lanes: Vec<Lane<'m>>,
    /// Sequences no lane holds and nothing is kept in.
    pub(super) free: Vec<SeqId>,
    /// Conversations kept in their cells ([`super::kept`]).
    pub(super) kept: Vec<Kept>,
    /// Counts keeps and uses, for the kept sequences' age.
    ticks: u64,
    /// Sequences beside sequence 0.
    pool: usize,
    /// What a step has been costing, measured.
    cost: StepCost,
    /// Tokens one decode takes.
    n_batch: u32,
    /// When the live sequence's reply last picked a token (it rides the lanes' steps).
    home_last_token: Option<Instant>,
    /// Lanes served to their end, for the metrics.
    served: u64,
    /// Most lanes' replies that rode a step with the live sequence's reply under way.
    home_beside: u32,
    /// When the live sequence's reply began (with the tokens it evaluated since, what its
    /// reader has banked: [`crate::engine::schedule::reader_due`]).
    home_first_token: Option<Instant>,
}

impl<'m> Lanes<'m> {
    /// `n_seq_max - 1` lanes beside sequence 0 (none for one sequence).
    pub(crate) fn new(n_seq_max: u32, n_batch: usize) -> Self {
        Self {
            lanes: Vec::new(),
            free: (1..n_seq_max as SeqId).rev().collect(),
            kept: Vec::new(),
            ticks: 0,
            pool: n_seq_max.saturating_sub(1) as usize,
            cost: StepCost { per_step: Duration::from_millis(15), per_token: Duration::from_millis(1) },
            n_batch: n_batch as u32,
            home_last_token: None,
            served: 0,
            home_beside: 0,
            home_first_token: None,
        }
    }

    /// The live sequence's reply begins: no lane has shared its steps yet.
    pub(crate) fn begin_home_reply(&mut self) {
        self.home_beside = 0;
        self.home_first_token = Some(Instant::now());
        self.home_last_token = None;
    }

    /// The live sequence's reply evaluated a token.
    pub(crate) fn home_token_out(&mut self) {
        self.home_last_token = Some(Instant::now());
    }

    /// Whether a lane is free, or can be (a kept sequence dropped).
    pub(crate) fn open(&self) -> bool {
        !self.free.is_empty() || !self.kept.is_empty()
    }

    /// Sequences beside sequence 0.
    pub(super) fn pool(&self) -> usize {
        self.pool
    }

    /// The next count of keeps and uses.
    pub(super) fn tick(&mut self) -> u64 {
        self.ticks += 1;
        self.ticks
    }

    /// Whether any lane is serving a request.
    pub(crate) fn busy(&self) -> bool {
        !self.lanes.is_empty()
    }

    /// What lane `seq` holds, and its prompt's length.
    pub(super) fn progress(&self, seq: SeqId) -> Option<(&[LlamaToken], usize)> {
        let lane = self.lanes.iter().find(|lane| lane.seq == seq)?;
        Some((lane.tokens.as_slice(), lane.prompt.len()))
    }

    /// Each lane's sequence and the tokens it holds.
    pub(super) fn held(&self) -> impl Iterator<Item = (SeqId, &[LlamaToken])> + '_ {
        self.lanes.iter().map(|lane| (lane.seq, lane.tokens.as_slice()))
    }

    /// Lanes serving a request now.
    pub(crate) fn running(&self) -> usize {
        self.lanes.len()
    }

    /// Lanes served to their end since start.
    pub(crate) fn served(&self) -> u64 {
        self.served
    }

    /// Whether a lane's reply streams (its next token waits for a step).
    fn streaming(&self) -> bool {
        self.lanes.iter().any(|lane| lane.next.is_some())
    }

    /// Cells the lanes hold or may come to hold, beyond what they share with sequence 0.
    pub(crate) fn reserved(&self) -> usize {
        self.lanes.iter().map(|lane| lane.reserve - lane.shared).sum()
    }

    /// Sequence 0 was cut to `keep` positions: cells past it are the lanes' and the kept
    /// sequences' own now.
    pub(crate) fn home_cut(&mut self, keep: usize) {
        for lane in &mut self.lanes {
            lane.shared = lane.shared.min(keep);
        }
        for kept in &mut self.kept {
            kept.shared = kept.shared.min(keep);
        }
    }

    /// What the scheduler sees: the lanes' needs, and sequence 0's (`home`), at `now` since
    /// `epoch`.
    fn pending(&self, epoch: Instant, home: Option<Need>) -> Vec<Pending> {
        let at = |instant: Instant| instant.saturating_duration_since(epoch);
        let mut pending: Vec<Pending> = home
            .map(|need| Pending { seq: HOME, waiter: Waiter::Person, since: Duration::ZERO, need })
            .into_iter()
            .collect();
        for lane in &self.lanes {
            let need = match (lane.next, lane.last_token, lane.first_token) {
                (Some(_), Some(last), Some(first)) => {
                    Need::Token { last_at: at(last), wanted: 1, first_at: at(first), produced: lane.reply.tokens() }
                }
                _ => Need::Prompt { remaining: lane.prompt_left().max(1) as u32 },
            };
            pending.push(Pending { seq: lane.seq, waiter: Waiter::Person, since: at(lane.admitted), need });
        }
        pending
    }

    fn limits(&self) -> Limits {
        Limits { n_batch: self.n_batch, min_gap: SPEECH_FLOOR, min_chunk: MIN_PROMPT_CHUNK }
    }

    /// Learns a step's cost from a decode of `tokens` tokens (`prompt`: a prompt chunk) that
    /// took `took`.
    fn measured(&mut self, tokens: usize, prompt: bool, took: Duration) {
        let blend = |old: Duration, new: Duration| (old * 3 + new) / 4;
        if prompt && tokens >= MIN_PROMPT_CHUNK as usize {
            let per_token = took.saturating_sub(self.cost.per_step) / tokens as u32;
            self.cost.per_token = blend(self.cost.per_token, per_token);
        } else if !prompt {
            let per_step = took.saturating_sub(self.cost.per_token * tokens as u32);
            self.cost.per_step = blend(self.cost.per_step, per_step);
        }
    }
}

impl<'m> LiveSequence<'m> {
    /// Gives `start` a lane: a free sequence holding the longest prefix of its prompt a live
    /// sequence or the RAM store holds (at least one prompt token is left to evaluate, for the
    /// logits; a stored state only when its prompt and whole reply fit the `free` cells, since
    /// its cells are its own), its [`Event::Started`] sent. False, and nothing done, when no
    /// lane is free.
    pub(crate) fn admit_lane(&mut self, start: LaneStart<'m>, free: usize) -> bool {
        let source = self.longest_live_prefix(&start.prompt);
        let from_kept = self.lanes.kept.iter().any(|kept| kept.seq == source.0);
        let seq =
            if from_kept { Some(source.0) } else { self.lanes.free.pop().or_else(|| self.drop_oldest_kept(None)) };
        let Some(seq) = seq else { return false };
        let LaneStart { prompt, media, limit, reply, generating, events, in_reasoning, request, remember, admitted } =
            start;
        let reserve = prompt.len() + limit as usize;
        let (mut keep, mut shared, mut cache) = self.lane_prefix(seq, &prompt, source, reserve <= free);
        // A media is evaluated whole: a prefix that ends inside one goes back to its start.
        let bounds: Vec<(usize, usize)> = media.iter().map(|span| (span.start, span.end())).collect();
        let whole = whole_media_prefix(&bounds, keep);
        if whole < keep {
            // A recurrent state cannot be cut: the lane starts from nothing then.
            let whole = if self.decoder.cut_sequence(seq, whole) {
                whole
            } else {
                self.decoder.drop_sequence(seq);
                0
            };
            (keep, shared) = (whole, shared.min(whole));
            (cache.reused, cache.prefilled) = (whole as u32, (prompt.len() - whole) as u32);
        }
        let started = Event::Started { prompt_tokens: prompt.len() as u32, cached_tokens: keep as u32, in_reasoning };
        tracing::debug!(seq, prompt = prompt.len(), reused = keep, source = ?cache.source, "a request takes a lane");
        let lane = Lane {
            seq,
            tokens: prompt[..keep].to_vec(),
            shared,
            prompt,
            media,
            reserve,
            next: None,
            reply,
            generating,
            events,
            admitted: Instant::now(),
            first_token: None,
            last_token: None,
            prompt_time: Duration::ZERO,
            cache,
            request,
            remember: Some(remember),
            beside: 0,
            _admitted: admitted,
        };
        if lane.events.send(started).is_err() {
            self.decoder.drop_sequence(seq);
            self.lanes.free.push(seq);
            return true;
        }
        self.lanes.lanes.push(lane);
        // Tests see here when a request took its lane.
        fail::fail_point!("engine::lane_admitted");
        true
    }

    /// One step of the lanes alone (nothing of sequence 0's rides it).
    pub(crate) fn step_lanes(&mut self) {
        if let Err(e) = self.lanes_step(HomePart::Absent) {
            tracing::warn!("a step of the lanes failed: {e}");
        }
    }

    /// How many of a prompt's `remaining` tokens sequence 0 evaluates in its next chunk (at
    /// most `chunk`): all of them while no lane streams, else what the speech floor allows.
    pub(super) fn home_chunk(&self, remaining: usize, chunk: usize) -> usize {
        if !self.lanes.streaming() {
            return chunk;
        }
        let epoch = self.lanes.lanes.iter().map(|lane| lane.admitted).min().unwrap_or_else(Instant::now);
        let home = Need::Prompt { remaining: remaining.max(1) as u32 };
        let pending = self.lanes.pending(epoch, Some(home));
        let now = Instant::now().saturating_duration_since(epoch);
        let batch = next_batch(now, &pending, self.lanes.cost, self.lanes.limits());
        batch.entry(HOME).map_or(MIN_PROMPT_CHUNK as usize, |entry| entry.tokens as usize).clamp(1, chunk)
    }

    /// Evaluates the lanes' part of a step, and sequence 0's next token in the same batch as
    /// their replies' tokens when it rides it; returns the batch index of its logits. The
    /// scheduler counts sequence 0's reply whether it rides or steps apart. A lane's prompt
    /// chunk, when the scheduler gives one, is decoded first in a call of its own (see the
    /// module's note); a lane whose prompt is then complete picks its first token and joins
    /// the batch. After the batch, every lane picks its next token; a lane whose reply ends is
    /// answered, stored and freed. Lanes that fail are answered with the error; sequence 0's
    /// own failure is returned.
    pub(super) fn lanes_step(&mut self, home_part: HomePart) -> Result<Option<i32>, EngineError> {
        let now = Instant::now();
        let epoch = self.lanes.lanes.iter().map(|lane| lane.admitted).min().unwrap_or(now);
        let home = match home_part {
            HomePart::Rides(token) => Some(token),
            HomePart::Absent | HomePart::Apart => None,
        };
        let home_need = (home_part != HomePart::Absent).then(|| Need::Token {
            last_at: self.lanes.home_last_token.unwrap_or(now).saturating_duration_since(epoch),
            wanted: 1,
            first_at: self.lanes.home_first_token.unwrap_or(now).saturating_duration_since(epoch),
            produced: self.reply.map_or(0, |(start, end)| end.saturating_sub(start)) as u32 + 1,
        });
        let pending = self.lanes.pending(epoch, home_need);
        let batch = next_batch(now.saturating_duration_since(epoch), &pending, self.lanes.cost, self.lanes.limits());
        if let Some(entry) = batch.entries.iter().find(|entry| entry.work == Work::Prompt && entry.seq != HOME) {
            let started = Instant::now();
            self.lane_prompt_chunk(entry.seq, entry.tokens as usize);
            tracing::debug!(seq = entry.seq, tokens = entry.tokens, ms = started.elapsed().as_secs_f64() * 1e3, cost = ?self.lanes.cost, "a lane's prompt chunk");
        }
        let mut parts = Vec::new();
        if let Some(token) = home {
            parts.push((HOME, token, self.cached.len()));
        }
        for lane in &self.lanes.lanes {
            if let Some(token) = lane.next {
                parts.push((lane.seq, token, lane.tokens.len()));
            }
        }
        if parts.is_empty() {
            return Ok(None);
        }
        let tokens: Vec<[LlamaToken; 1]> = parts.iter().map(|&(_, token, _)| [token]).collect();
        let shared: Vec<SharedPart<'_>> = parts
            .iter()
            .zip(&tokens)
            .map(|(&(seq, _, start), token)| SharedPart { seq, tokens: token, start })
            .collect();
        let started = Instant::now();
        let rows = match self.decoder.decode_shared(&shared) {
            Ok(rows) => rows,
            Err(EngineError::DecodeStopped) => {
                // Sequence 0's client left midway; llama.cpp dropped the batch's positions,
                // and the lanes' tokens are evaluated in the next step.
                return Err(EngineError::DecodeStopped);
            }
            Err(e) => {
                let failed: Vec<SeqId> = parts.iter().map(|&(seq, ..)| seq).filter(|&seq| seq != HOME).collect();
                for seq in failed {
                    self.end_lane(seq, Err(EngineError::Decode(e.to_string())));
                }
                return if home.is_some() { Err(e) } else { Ok(None) };
            }
        };
        self.lanes.measured(parts.len(), false, started.elapsed());
        if home_part == HomePart::Apart {
            // Sequence 0's own batch follows: its reply ran beside these.
            self.lanes.home_beside = self.lanes.home_beside.max(parts.len() as u32);
        }
        tracing::debug!(replies = parts.len(), ms = started.elapsed().as_secs_f64() * 1e3, "the replies' step");

        let mut home_row = None;
        for (&(seq, token, _), &row) in parts.iter().zip(&rows) {
            // Sequence 0's reply, stepping apart, ran beside them too.
            let beside = parts.len() as u32 - 1 + u32::from(home_part == HomePart::Apart);
            if seq == HOME {
                home_row = Some(row);
                self.lanes.home_beside = self.lanes.home_beside.max(beside);
                continue;
            }
            if let Some(lane) = self.lanes.lanes.iter_mut().find(|lane| lane.seq == seq) {
                lane.tokens.push(token);
                lane.next = None;
                lane.beside = lane.beside.max(beside);
            }
            self.checkpoint_lane_reply(seq);
            self.lane_pick(seq, row);
        }
        Ok(home_row)
    }

    /// Evaluates lane `seq`'s next prompt chunk: up to `tokens` tokens of text (stopping where
    /// a media starts), or the media that starts there, whole. When that completes the prompt,
    /// the lane picks its first token.
    fn lane_prompt_chunk(&mut self, seq: SeqId, tokens: usize) {
        let Some(lane) = self.lanes.lanes.iter().find(|lane| lane.seq == seq) else { return };
        let start = lane.tokens.len();
        let started = Instant::now();
        let (chunk, outcome) = match next_chunk(start, tokens, lane.prompt.len(), &lane.media) {
            Some(LaneChunk::Text { end }) => {
                let chunk = lane.prompt[start..end].to_vec();
                let outcome = match self.decoder.decode_shared(&[SharedPart { seq, tokens: &chunk, start }]) {
                    Ok(rows) => {
                        self.lanes.measured(chunk.len(), true, started.elapsed());
                        ChunkOutcome::Logits(rows[0])
                    }
                    // Sequence 0's client left midway (its check stops any decode): llama.cpp
                    // dropped the chunk's positions, evaluated again in the next step.
                    Err(EngineError::DecodeStopped) => ChunkOutcome::Again,
                    Err(e) => ChunkOutcome::Failed(e),
                };
                (chunk, outcome)
            }
            Some(LaneChunk::Media { index }) => {
                let span = lane.media[index].clone();
                (span.segment.tokens.clone(), self.lane_media(seq, &span))
            }
            None => {
                (Vec::new(), ChunkOutcome::Failed(EngineError::Internal("a lane's prompt stopped in a media".into())))
            }
        };
        let row = match outcome {
            ChunkOutcome::Again => return,
            ChunkOutcome::Failed(e) => return self.end_lane(seq, Err(e)),
            ChunkOutcome::Logits(row) => Some(row),
            ChunkOutcome::Done => None,
        };
        let Some(lane) = self.lanes.lanes.iter_mut().find(|lane| lane.seq == seq) else { return };
        lane.tokens.extend_from_slice(&chunk);
        lane.prompt_time += started.elapsed();
        if let (0, Some(row)) = (lane.prompt_left(), row) {
            self.lane_pick(seq, row);
        } else {
            self.checkpoint_lane_prefill(seq, start);
        }
    }

    /// Lane `seq` picks its next token from the logits at batch row `row`.
    fn lane_pick(&mut self, seq: SeqId, row: i32) {
        let target = self.decoder.target();
        let Some(lane) = self.lanes.lanes.iter_mut().find(|lane| lane.seq == seq) else { return };
        let evaluated = lane.tokens.len();
        let picked = lane.reply.pick(&mut lane.generating, Logits::Context(target, row), evaluated);
        match picked {
            Ok(Picked::Evaluate { token, .. }) => {
                let now = Instant::now();
                let first = lane.first_token.is_none();
                lane.next = Some(token);
                lane.first_token.get_or_insert(now);
                lane.last_token = Some(now);
                if first {
                    // Its first token is out: the prompt's checkpoint costs it nothing.
                    self.checkpoint_lane_prompt(seq);
                }
            }
            Ok(Picked::Held) => {}
            Ok(Picked::Done(reason)) => self.end_lane(seq, Ok(reason)),
            Err(Halt::Cancelled) => self.end_lane(seq, Err(EngineError::DecodeStopped)),
            Err(Halt::Failed(e)) => self.end_lane(seq, Err(e)),
        }
    }

    /// Ends lane `seq`: its reply finished for `outcome`'s reason (answered, its conversation
    /// kept in the RAM store for its next turn), failed (answered with the error), or its
    /// client left ([`EngineError::DecodeStopped`]: nothing to answer). Its conversation stays
    /// in its cells, kept ([`super::kept`]), unless it failed: its sequence is free again then.
    fn end_lane(&mut self, seq: SeqId, outcome: Result<crate::engine::FinishReason, EngineError>) {
        let Some(index) = self.lanes.lanes.iter().position(|lane| lane.seq == seq) else { return };
        let mut lane = self.lanes.lanes.swap_remove(index);
        match outcome {
            Ok(reason) => {
                let generation = lane.first_token.map_or(Duration::ZERO, |first| first.elapsed());
                let usage = Usage {
                    prompt_tokens: lane.prompt.len() as u32,
                    cached_tokens: lane.cache.reused,
                    completion_tokens: lane.reply.tokens(),
                    dropped_messages: 0,
                    reasoning_tokens: lane.reply.reasoning_tokens(),
                };
                let timings = Timings {
                    prompt: lane.prompt_time,
                    generation,
                    draft: None,
                    cache: lane.cache,
                    request: lane.request.take(),
                    shared: Some(SharedSteps { sequence: seq as u32, replies_beside: lane.beside }),
                };
                let events = lane.events.clone();
                let text = lane.reply.into_text();
                if let Some(remember) = lane.remember.take() {
                    remember(&text);
                }
                let _ = events.send(Event::Finished { reason, usage, timings });
                self.lanes.served += 1;
            }
            Err(EngineError::DecodeStopped) => {
                // What it held serves the same request sent again.
                tracing::debug!(seq, "a lane's client left");
            }
            Err(e) => {
                let _ = lane.events.send(Event::Failed(e));
                self.decoder.drop_sequence(seq);
                self.lanes.free.push(seq);
                return;
            }
        }
        self.keep_lane(seq, lane.tokens.clone());
        self.keep_lane_cells(seq, lane.tokens, lane.shared);
    }
}

impl LiveSequence<'_> {
    /// What the lanes are doing.
    pub(crate) fn lane_counts(&self) -> LaneCounts {
        LaneCounts { running: self.lanes.running() as u32, served: self.lanes.served(), kept: self.kept_count() as u32 }
    }

    /// Cells the lanes hold or may come to hold beyond sequence 0's.
    pub(crate) fn lanes_reserved(&self) -> usize {
        self.lanes.reserved()
    }

    /// Most lanes' replies that shared a step with the live sequence's reply since it began
    /// ([`LiveSequence::begin_reply`]); `None` when none did.
    pub(crate) fn home_shared(&self) -> Option<SharedSteps> {
        (self.lanes.home_beside > 0).then_some(SharedSteps { sequence: 0, replies_beside: self.lanes.home_beside })
    }

    /// Whether a lane is serving a request.
    pub(crate) fn lanes_busy(&self) -> bool {
        self.lanes.busy()
    }

    /// Whether a request could take a lane now.
    pub(crate) fn lanes_open(&self) -> bool {
        self.lanes.open()
    }

    /// Lanes end with the engine: their clients are told it shuts down.
    pub(crate) fn end_lanes(&mut self) {
        let seqs: Vec<SeqId> = self.lanes.lanes.iter().map(|lane| lane.seq).collect();
        for seq in seqs {
            self.end_lane(seq, Err(EngineError::ShuttingDown));
        }
    }
}
