//! The live sequence: the one context's KV cache (through the [`Decoder`], drafter included)
//! and the exact token list it holds. Every evaluation and every cut goes through here, so the
//! list never disagrees with the cache, and the guards that keep a reused prefix correct (the
//! sliding window, recurrent state that rolls back only so far) sit in one place. Saving it
//! to, and restoring it from, the RAM store and the disk cache is in [`saved`].

use std::sync::Arc;
use std::time::{Duration, Instant};

use llama_cpp_2::context::LlamaContext;
use llama_cpp_2::token::LlamaToken;

use super::decoder::{BatchKind, Decoder, Proposal, SavedState};
use super::disk::DiskCache;
use super::ffi::{DecodeStop, StopCheck};
use super::media::projector::{MediaPreparer, Projector, Segment};
use super::media::{is_placeholder, MediaSpan};
use super::policy::{self, CacheShape, EvaluationPlan, LiveView, RestoreCosts};
use super::prefix::{common_prefix_len, window_covers};
use super::schedule::SeqId;
use super::store::StateStore;
use super::threads::ThreadGovernor;
use super::{CacheMiss, CacheSource, EngineError};

mod change;
mod kept;
mod lane_media;
mod lane_prefix;
mod lane_store;
mod lanes;
mod restore;
mod saved;

pub(crate) use change::ChangesReused;
use lanes::{HomePart, Lanes};
pub(crate) use lanes::{LaneStart, Remember};

/// The token list the KV cache holds (prompt and generated tokens), with the cache itself.
pub(crate) struct LiveSequence<'m> {
    decoder: Decoder<'m>,
    /// Exactly what the target's cache holds, position by position.
    cached: Vec<LlamaToken>,
    /// Most tokens one decode call takes (the context's logical batch).
    n_batch: usize,
    /// What the cache can do: recurrent state, a sliding window.
    shape: CacheShape,
    /// Recurrent-state snapshots per sequence (`n_rs_seq`): the deepest rollback.
    rs_snapshots: usize,
    /// How many of the last cached positions the cache can drop now (recurrent models).
    rewindable: usize,
    /// Other prompts' states in RAM; `None` when off.
    store: Option<StateStore<SavedState>>,
    /// Shortest sequence worth saving to the store.
    min_save: usize,
    /// Checkpoints are taken (models whose cache cannot be cut everywhere), every this many
    /// tokens of a long prefill (0: only at each prompt's end).
    checkpoint_every: Option<usize>,
    /// The cache holds a prompt just prefilled, to save as a checkpoint before it changes
    /// (after the first token is out, so it costs nothing in time to first token).
    checkpoint_pending: bool,
    /// States kept across restarts; `None` when off.
    disk: Option<DiskCache>,
    /// Where the live sequence came from: [`CacheSource::Disk`] when it was restored at
    /// start-up and no prompt has used it yet, else [`CacheSource::Live`].
    origin: CacheSource,
    /// Measured costs of disk restores and prefills, for the policy's disk margin.
    costs: RestoreCosts,
    /// The positions of the reply generated after the last prompt (its evaluated tokens), so
    /// a next turn that cuts it is explained and, where the cache cannot be cut, checkpointed.
    reply: Option<(usize, usize)>,
    /// Sets llama.cpp's threads before a batch, following the machine's load; `None`: the
    /// configured counts always.
    threads: Option<ThreadGovernor>,
    /// What may stop a decode midway (a reply's client that left); `None` where decodes are
    /// never stopped (a drafter, recurrent state, a context llama.cpp's callback could not be
    /// set on). Declared after `decoder`, so the context it is set on is dropped first.
    decode_stop: Option<Arc<DecodeStop>>,
    /// Other requests' sequences in the same context (`--parallel`).
    lanes: Lanes<'m>,
    /// The projector's part that evaluates a lane's media (`--mmproj`).
    lane_media: Option<Arc<MediaPreparer>>,
    /// A sequence beside the lanes' kept for evaluating a prompt's changed spans
    /// ([`change`]), where the context has one (`--reuse-after-change` with one sequence).
    spare_seq: Option<SeqId>,
    /// Whether prompts reuse the cache past changed spans unless they say otherwise.
    change_default: bool,
    /// The limits of a reuse past changes.
    change_rules: policy::ChangeRules,
    /// The first position whose cells a reuse past changes kept from an older text (they were
    /// computed attending to it): only prompts that accept the approximation reuse them, and
    /// the live sequence is not saved, kept or checkpointed while it holds such cells.
    approximate_from: Option<usize>,
}

/// Decodes can be stopped by a check until this is dropped ([`LiveSequence::stop_decodes_while`]).
pub(crate) struct StopWhile(Arc<DecodeStop>);

impl Drop for StopWhile {
    fn drop(&mut self) {
        self.0.set(None);
    }
}

/// A prompt's media, and the projector that evaluates them (none for prompts without media).
pub(crate) struct PromptMedia<'p> {
    /// Where each media's tokens lie in the prompt.
    pub(crate) spans: &'p [MediaSpan],
    /// The projector.
    pub(crate) projector: Option<&'p mut Projector>,
}

/// What reusing the cache did for one prompt.
#[derive(Clone, Debug)]
pub(crate) struct Reuse {
    /// Prompt tokens the cache holds now; the rest is prefilled.
    pub(crate) keep: usize,
    /// Where they came from.
    pub(crate) source: CacheSource,
    /// The first prompt position that differs from what the source (or, with no source, the
    /// live sequence) held; `None` where the prompt continues all of it.
    pub(crate) diverged_at: Option<usize>,
    /// What kept the cache from serving the prefix it shares with the prompt, if anything.
    pub(crate) obstacle: Option<CacheMiss>,
    /// Time spent saving the live sequence before the prompt took it over.
    pub(crate) save: Option<Duration>,
    /// Time spent restoring a stored state.
    pub(crate) restore: Option<Duration>,
    /// Where the prompt cut the reply the live sequence held (barge-in), if it did.
    pub(crate) reply_cut: Option<policy::Cut>,
    /// The changed spans the cache was reused past, where it was ([`change`]).
    pub(crate) changes: Option<ChangesReused>,
}

impl Reuse {
    /// Nothing reused yet, from `source`.
    pub(crate) fn nothing(source: CacheSource) -> Self {
        Self {
            keep: 0,
            source,
            diverged_at: None,
            obstacle: None,
            save: None,
            restore: None,
            reply_cut: None,
            changes: None,
        }
    }

    /// Records a reuse past changes that `plan` carried out (`done`): the cache holds the
    /// prompt's tokens up to the plan's end.
    pub(crate) fn past_changes(&mut self, plan: &policy::ChangePlan, done: ChangesReused) {
        self.keep = plan.end;
        self.diverged_at = Some(plan.prefix);
        self.obstacle = Some(CacheMiss::ReusedAfterChange);
        self.reply_cut = None;
        self.changes = Some(done);
    }

    /// Tokens among the `keep` the cache holds that a reuse past changes evaluated (the spans
    /// and their neighbourhoods): not reused.
    pub(crate) fn evaluated_inside(&self) -> usize {
        self.changes.as_ref().map_or(0, |changes| changes.evaluated)
    }
}

impl<'m> LiveSequence<'m> {
    /// An empty sequence over a fresh `decoder`, whose context takes `n_batch` tokens per
    /// decode and keeps `rs_snapshots` recurrent-state snapshots (`recurrent` models).
    pub(crate) fn new(
        decoder: Decoder<'m>,
        n_batch: usize,
        n_swa: Option<u32>,
        recurrent: bool,
        rs_snapshots: usize,
        n_seq_max: u32,
    ) -> Self {
        let mut decoder = decoder;
        // A recurrent state stopped midway may be half written: its decodes always finish.
        let stop = Arc::new(DecodeStop::default());
        let decode_stop = (!recurrent && decoder.stop_decodes_with(&stop)).then_some(stop);
        Self {
            decoder,
            cached: Vec::new(),
            n_batch,
            shape: CacheShape { recurrent, n_swa },
            rs_snapshots,
            rewindable: 0,
            store: None,
            min_save: usize::MAX,
            checkpoint_every: None,
            checkpoint_pending: false,
            disk: None,
            origin: CacheSource::Live,
            costs: RestoreCosts::default(),
            reply: None,
            threads: None,
            decode_stop,
            lanes: Lanes::new(n_seq_max, n_batch),
            lane_media: None,
            spare_seq: None,
            change_default: false,
            change_rules: policy::ChangeRules::default(),
            approximate_from: None,
        }
    }

    /// Lets `check` stop the decodes midway, where they can be stopped, until the returned
    /// guard is dropped (also when a panic unwinds past it: a check left behind would stop the
    /// next request's decodes). A decode it stops fails with [`EngineError::DecodeStopped`].
    pub(crate) fn stop_decodes_while(&self, check: StopCheck) -> Option<StopWhile> {
        let stop = self.decode_stop.as_ref()?;
        stop.set(Some(check));
        Some(StopWhile(Arc::clone(stop)))
    }

    /// Lets `governor` set the threads before each batch. The counts the contexts were
    /// created with are set once first: that changes nothing, and shows that llama.cpp's
    /// contexts can be reached and report back what is set; where they cannot, the counts
    /// stay as configured.
    pub(crate) fn govern_threads(&mut self, mut governor: ThreadGovernor) {
        let configured = governor.configured();
        let read = self.decoder.set_threads(configured);
        if let Some(read) = read {
            governor.applied(read);
        }
        if read == Some(configured) {
            self.threads = governor.adaptive().then_some(governor);
        } else if governor.adaptive() {
            tracing::warn!(?read, "llama.cpp's thread counts cannot be changed here: they stay as configured");
        }
    }

    /// Sets the counts `governor` asked for before a batch, and publishes what llama.cpp then
    /// reports; if that is not what was set, the governor stops (the counts stay as they are).
    fn follow_threads(&mut self, batch_tokens: usize) {
        let Some(counts) = self.threads.as_mut().and_then(|governor| governor.before_batch(batch_tokens)) else {
            return;
        };
        let read = self.decoder.set_threads(counts);
        let Some(governor) = self.threads.as_mut() else { return };
        if let Some(read) = read {
            governor.applied(read);
        }
        if read != Some(counts) {
            tracing::warn!(
                ?counts,
                ?read,
                "llama.cpp did not take the thread counts set: they no longer follow the machine"
            );
            self.threads = None;
        }
    }

    /// What the cache can do.
    pub(crate) fn shape(&self) -> CacheShape {
        self.shape
    }

    /// The tokens of the live sequence a prompt may reuse: all of them where it accepts
    /// cells a reuse past changes kept from an older text, else those before such cells.
    fn reusable_tokens(&self, approximate: bool) -> &[LlamaToken] {
        match self.approximate_from {
            Some(from) if !approximate => &self.cached[..from.min(self.cached.len())],
            _ => &self.cached,
        }
    }

    /// Whether the live sequence holds cells a reuse past changes kept from an older text.
    pub(crate) fn approximate(&self) -> bool {
        self.approximate_from.is_some()
    }

    /// Whether a request that `asked` (or, `None`, the engine's default) accepts such cells.
    pub(crate) fn accepts_approximate(&self, asked: Option<bool>) -> bool {
        asked.unwrap_or(self.change_default)
    }

    /// The live sequence as the cache policy sees it.
    fn view(&self) -> LiveView<'_> {
        LiveView {
            tokens: &self.cached,
            rewindable: self.rewindable,
            pos_min: self.decoder.target().kv_cache_seq_pos_min(0),
            reply_start: self.reply.map(|(start, _)| start),
        }
    }

    /// The tokens the cache holds, in position order.
    pub(crate) fn tokens(&self) -> &[LlamaToken] {
        &self.cached
    }

    /// The target context, for its logits.
    pub(crate) fn target(&self) -> &LlamaContext<'m> {
        self.decoder.target()
    }

    /// Context size in tokens.
    pub(crate) fn n_ctx(&self) -> u32 {
        self.decoder.target().n_ctx()
    }

    /// Most tokens one decode call takes.
    pub(crate) fn n_batch(&self) -> usize {
        self.n_batch
    }

    /// Whether the cache can drop every position from `keep` on.
    fn can_cut(&self, keep: usize) -> bool {
        policy::can_cut(self.shape, self.view(), keep)
    }

    /// Drops every cached position from `keep` on. False, and nothing cut, where the cache
    /// cannot be cut: recurrent state (Mamba, and the recurrent layers of hybrid models) rolls
    /// back only through llama.cpp's snapshots of the last batch's tokens, and llama.cpp
    /// accepts a deeper cut than those hold and then computes from a wrong state.
    pub(crate) fn cut(&mut self, keep: usize) -> bool {
        if keep >= self.cached.len() {
            return true;
        }
        if !self.can_cut(keep) {
            return false;
        }
        self.save_pending_checkpoint();
        if !self.decoder.truncate(keep) {
            return false;
        }
        self.cached.truncate(keep);
        self.approximate_from = self.approximate_from.filter(|&from| from < keep);
        self.lanes.home_cut(keep);
        self.reply = self.reply.filter(|&(start, _)| keep > start).map(|(start, end)| (start, end.min(keep)));
        // A rollback is single-use until the next batch.
        self.rewindable = 0;
        true
    }

    /// Empties the cache, the drafter's included.
    pub(crate) fn clear(&mut self) {
        self.checkpoint_pending = false;
        self.decoder.clear();
        self.cached.clear();
        self.approximate_from = None;
        self.lanes.home_cut(0);
        self.rewindable = 0;
        self.reply = None;
    }

    /// Evaluates tokens at the next cache positions and records them as cached; returns the
    /// batch index of the last token. On failure the cache is cleared, since llama.cpp's state
    /// is then unknown.
    pub(crate) fn decode(&mut self, tokens: &[LlamaToken], kind: BatchKind) -> Result<i32, EngineError> {
        if tokens.is_empty() {
            return Err(EngineError::Decode("nothing to evaluate".into()));
        }
        if tokens.iter().any(|&t| is_placeholder(t)) {
            // A media's tokens are evaluated whole, through the projector (`decode_media`).
            return Err(EngineError::Internal("a media's placeholder tokens evaluated as text".into()));
        }
        self.save_pending_checkpoint();
        self.room_for(tokens.len());
        self.follow_threads(tokens.len());
        // With lanes busy, a single generated token rides their step; anything else waits
        // for their step first (see `lanes`). With a drafter, sequence 0's tokens never ride:
        // its drafter follows sequence 0's own batches (an MTP context reads their hidden
        // states), and its drafts are verified in them.
        let generates = self.lanes.busy() && kind == BatchKind::Generated;
        let decoded = if generates && tokens.len() == 1 && !self.decoder.speculates() {
            self.lanes_step(HomePart::Rides(tokens[0])).and_then(|row| {
                row.ok_or_else(|| EngineError::Internal("the shared step lost sequence 0's token".into()))
            })
        } else {
            if self.lanes.busy() {
                self.lanes_step(if generates { HomePart::Apart } else { HomePart::Absent })?;
            }
            self.decoder.decode(tokens, self.cached.len(), kind)
        };
        let last_row = match decoded {
            // llama.cpp removed the stopped token's position: the cache holds what it held.
            Err(EngineError::DecodeStopped) if tokens.len() == 1 => return Err(EngineError::DecodeStopped),
            Err(e) => {
                self.clear();
                return Err(e);
            }
            Ok(row) => row,
        };
        self.cached.extend_from_slice(tokens);
        self.rewindable = (tokens.len() - 1).min(self.rs_snapshots);
        if let (BatchKind::Generated, Some((_, end))) = (kind, self.reply.as_mut()) {
            *end = self.cached.len();
            self.lanes.home_token_out();
        }
        Ok(last_row)
    }

    /// Evaluates a media's tokens at the next cache positions, through the projector, and
    /// records them as cached. On failure the cache is cleared.
    pub(crate) fn decode_media(&mut self, projector: &mut Projector, segment: &Segment) -> Result<(), EngineError> {
        self.save_pending_checkpoint();
        self.room_for(segment.tokens.len());
        self.follow_threads(segment.tokens.len());
        if let Err(e) = self.decoder.decode_media(projector, segment, self.cached.len(), self.n_batch) {
            self.clear();
            return Err(e);
        }
        self.cached.extend_from_slice(&segment.tokens);
        self.rewindable = 0;
        Ok(())
    }

    /// Evaluates prompt `tokens` after the cache in chunks of `chunk` tokens (at most
    /// `n_batch`), each media of `media` whole, taking the checkpoints `plan` says (see
    /// [`policy::plan_evaluation`]) and one every `checkpoint_every` tokens of a long prefill;
    /// returns the batch index holding the last token's logits. A media `tokens` ends inside
    /// is left out (a partial evaluation). `go_on` runs before each chunk, so a long prefill
    /// can be abandoned between chunks (what was evaluated stays cached); its error is
    /// returned as is.
    pub(crate) fn prefill<E: From<EngineError>>(
        &mut self,
        tokens: &[LlamaToken],
        chunk: usize,
        plan: EvaluationPlan,
        mut media: PromptMedia<'_>,
        mut go_on: impl FnMut() -> Result<(), E>,
    ) -> Result<i32, E> {
        let chunk = chunk.clamp(1, self.n_batch);
        let start = self.cached.len();
        let mut last_index = 0;
        let mut done = 0;
        while done < tokens.len() {
            go_on()?;
            let before = self.cached.len();
            let started = Instant::now();
            let next = if let Some(span) = media.spans.iter().find(|span| span.start == start + done) {
                if span.end() > start + tokens.len() {
                    break;
                }
                let projector = media
                    .projector
                    .as_deref_mut()
                    .ok_or_else(|| EngineError::Internal("media in a prompt without a projector".into()))?;
                self.decode_media(projector, &span.segment)?;
                done + span.segment.tokens.len()
            } else {
                let mut next = (done + self.home_chunk(tokens.len() - done, chunk)).min(tokens.len());
                if let Some(at) = plan.checkpoint_at.and_then(|at| at.checked_sub(start)) {
                    if at > done && at < next {
                        next = at;
                    }
                }
                if let Some(span) = media.spans.iter().find(|s| s.start > start + done && s.start < start + next) {
                    next = span.start - start;
                }
                let last = next == tokens.len();
                last_index =
                    self.decode(&tokens[done..next], if last { BatchKind::PromptEnd } else { BatchKind::Prompt })?;
                next
            };
            let last = next == tokens.len();
            self.costs.record_prefill(next - done, started.elapsed().as_secs_f64());
            done = next;
            let held = self.cached.len();
            if plan.checkpoint_at == Some(held) {
                self.save_checkpoint();
            } else if last {
                self.checkpoint_pending = plan.checkpoint_end;
            } else if self.periodic_checkpoint_due(before, held) {
                self.save_checkpoint();
            }
        }
        Ok(last_index)
    }

    /// Whether a long prefill that went from `before` to `held` cached tokens passed a multiple
    /// of `checkpoint_every`.
    fn periodic_checkpoint_due(&self, before: usize, held: usize) -> bool {
        match self.checkpoint_every {
            Some(every) if every > 0 && held >= self.min_save => before / every != held / every,
            _ => false,
        }
    }

    /// Whether checkpoints are taken at all (models whose cache cannot be cut everywhere,
    /// with the state store on).
    pub(crate) fn takes_checkpoints(&self) -> bool {
        self.checkpoint_every.is_some()
    }

    /// Shortest sequence worth saving.
    pub(crate) fn min_save(&self) -> usize {
        self.min_save
    }

    /// Makes the cache hold `tokens` by re-evaluating where they diverge from it, when that
    /// costs at most one batch and the cache can be cut there; otherwise leaves it as it is.
    /// Nothing is done when the cache already is a prefix of `tokens`: the rest is evaluated
    /// with the next prompt anyway.
    pub(crate) fn rewrite_tail(&mut self, tokens: &[LlamaToken]) {
        let common = common_prefix_len(&self.cached, tokens);
        let redo = tokens.len() - common;
        if common == self.cached.len() || redo > self.n_batch || tokens.len() >= self.n_ctx() as usize {
            return;
        }
        if !window_covers(self.decoder.target().kv_cache_seq_pos_min(0), common, self.shape.n_swa) || !self.cut(common)
        {
            return;
        }
        tracing::debug!(common, redo, cached = self.cached.len(), "re-evaluating the cache's tail");
        // A strict prefix (e.g. held-back stop text) needs only the cut.
        if redo > 0 {
            if let Err(e) = self.decode(&tokens[common..], BatchKind::Prompt) {
                tracing::warn!("re-evaluating the cache's tail failed: {e}");
            }
        }
    }

    /// Evaluates the rest of `tokens` where the cache holds a prefix of them, when that is at
    /// most one batch and fits the context: what the next prompt will start with anyway.
    /// Whether it did.
    pub(crate) fn extend_to(&mut self, tokens: &[LlamaToken]) -> bool {
        let held = self.cached.len();
        if held == 0
            || held >= tokens.len()
            || tokens.len() - held > self.n_batch
            || tokens.len() >= self.n_ctx() as usize
        {
            return false;
        }
        if !tokens.starts_with(&self.cached) {
            return false;
        }
        tracing::debug!(tokens = tokens.len() - held, "evaluating the next turn's opening");
        if let Err(e) = self.decode(&tokens[held..], BatchKind::Prompt) {
            tracing::warn!("evaluating the next turn's opening failed: {e}");
            return false;
        }
        true
    }

    /// Brings a draft model's context up to the cache by at most one batch (while the user
    /// listens, instead of at the next reply's first drafts); whether it holds all of it.
    pub(crate) fn follow_drafter(&mut self) -> bool {
        self.decoder.follow(&self.cached, self.n_batch)
    }

    /// Whether anything drafts.
    pub(crate) fn speculates(&self) -> bool {
        self.decoder.speculates()
    }

    /// What drafts: `none`, `mtp` or `model`.
    pub(crate) fn drafter_name(&self) -> &'static str {
        self.decoder.drafter_name()
    }

    /// Up to `max` drafts likely to follow the cache + `id_last` (the token just picked, not
    /// evaluated yet).
    pub(crate) fn propose(&mut self, id_last: LlamaToken, max: usize) -> Proposal {
        self.decoder.propose(&self.cached, id_last, max)
    }

    /// Cached tokens the drafter would have to evaluate before drafting after them.
    pub(crate) fn backlog(&self) -> usize {
        self.decoder.backlog(&self.cached)
    }

    /// The target verified the last proposal: its first `accepted` drafts were right.
    pub(crate) fn settle(&mut self, accepted: usize) {
        self.decoder.settle(accepted);
    }

    /// A new reply starts after the first `prompt_len` tokens the cache holds (the rest, if
    /// any, a parked generation it adopts). An MTP drafter begins it with the cache as its
    /// history.
    pub(crate) fn begin_reply(&mut self, prompt_len: usize) {
        self.reply = Some((prompt_len.min(self.cached.len()), self.cached.len()));
        self.lanes.begin_home_reply();
        self.decoder.begin_reply();
    }

    /// After a reply token was evaluated: checkpoints the reply where the cache policy says a
    /// later cut inside it could not be served from the live cache
    /// ([`policy::reply_checkpoint_due`]). Not while drafts are pending (speculative decoding):
    /// the cache then holds tokens not picked yet.
    pub(crate) fn checkpoint_reply(&mut self) {
        let Some((start, _)) = self.reply else { return };
        if !self.speculates()
            && policy::reply_checkpoint_due(self.shape, self.takes_checkpoints(), self.view(), start, self.min_save)
        {
            self.save_checkpoint();
        }
    }

    /// Tokens the drafter evaluated to follow the cache since the last call.
    pub(crate) fn take_catch_up(&mut self) -> u32 {
        self.decoder.take_catch_up()
    }

    /// Shows an MTP drafter the prompt batch it has not seen yet, so the next request does
    /// not pay for it.
    pub(crate) fn mirror_pending(&mut self) {
        self.decoder.mirror_pending();
    }
}
