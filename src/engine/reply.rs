//! The generation loop: picks tokens one by one from the live sequence's logits, streams their
//! text (held back where it may be a stop string or half a character), and ends the reply on
//! an end-of-generation token, a stop string, the token limit, or the client's request.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use llama_cpp_2::token::LlamaToken;
use tokio::sync::mpsc::UnboundedSender;

use super::logprobs::{token_logprob, LogprobQueue};
use super::sampling::{Logits, TokenPicker};
use super::sequence::LiveSequence;
use super::speculation::Speculating;
use super::text::{StopMatcher, StopScan, Utf8Stream};
use super::tokenizer::Tokenizer;
use super::{EngineError, Event, FinishReason, GenerationRequest, ReasoningFormat};

/// Why a request ended without a finished reply.
pub(super) enum Halt {
    /// Sent to the client as [`Event::Failed`].
    Failed(EngineError),
    /// The client went away; nothing more to send.
    Cancelled,
}

impl From<EngineError> for Halt {
    fn from(e: EngineError) -> Self {
        match e {
            // Stopped because the client left.
            EngineError::DecodeStopped => Self::Cancelled,
            e => Self::Failed(e),
        }
    }
}

/// Whether a request may go on with its next batch: not when the engine is stopping or the
/// client has left.
pub(super) fn still_wanted(shutting_down: &AtomicBool, events: &UnboundedSender<Event>) -> Result<(), Halt> {
    if shutting_down.load(Ordering::Relaxed) {
        return Err(Halt::Failed(EngineError::ShuttingDown));
    }
    if events.is_closed() {
        return Err(Halt::Cancelled);
    }
    Ok(())
}

/// The reply to one request as it is generated.
pub(super) struct Reply<'j> {
    events: UnboundedSender<Event>,
    /// Set by the client to end the reply early.
    finish_requested: Arc<AtomicBool>,
    shutting_down: &'j AtomicBool,
    /// Most tokens to generate.
    limit: u32,
    /// Tokens generated.
    tokens: u32,
    /// Of these, those generated inside the model's reasoning.
    reasoning_tokens: u32,
    /// All text sent.
    text: String,
    /// Log-probabilities waiting for their text, when the request asked for them.
    logprobs: Option<LogprobQueue>,
    /// A thinking model's reasoning markers and budget (chat prompts of templates that think).
    reasoning: Option<ReasoningLimit>,
    /// Tokens taken from a parked generation, already in the cache.
    adopted: u32,
    /// The parked generation this reply adopts, while it follows it.
    replay: Option<Replay<'j>>,
    /// Every token picked with its logits, to park the reply if the client leaves.
    recording: Option<Recording>,
    /// When the answer must match a grammar (a required call, JSON): the tokens of the smallest
    /// answer it accepts. A complete answer then ends where another would not fit
    /// ([`Reply::pick`]).
    answer_tokens: Option<u32>,
}

/// A reply's picked tokens, each with the logits it was picked from (and those of the step
/// that was next when the reply stopped), kept so that a reply whose client left can be parked
/// for the same request sent again. Dropped past `most` steps: the logits are large.
pub(super) struct Recording {
    /// The picked tokens, in order.
    pub(super) tokens: Vec<LlamaToken>,
    /// The logits of each step, one per vocabulary token.
    pub(super) logits: Vec<Vec<f32>>,
    /// Most steps recorded.
    most: usize,
}

/// Reply tokens a prefill generated ahead (a parked generation), for the request to adopt:
/// each token with the logits it was picked from, and the logits after the last one unless it
/// ended the reply. The cache holds the prompt and these tokens.
#[derive(Clone, Copy)]
pub(super) struct Replay<'p> {
    /// The parked tokens, in order.
    pub(super) tokens: &'p [LlamaToken],
    /// The logits each was picked from (one more, after the last, where it did not end the reply).
    pub(super) logits: &'p [Vec<f32>],
    /// The prompt's length: the first parked token's position.
    pub(super) prompt_len: usize,
}

/// A thinking model's reasoning in a reply: its markers and how many tokens it may take.
#[derive(Clone, Copy, Debug)]
pub(super) struct ReasoningLimit {
    /// The model's reasoning markers.
    pub(super) format: ReasoningFormat,
    /// Most reasoning tokens before the engine closes the reasoning itself.
    pub(super) budget: Option<u32>,
    /// When the answer must match a grammar (a required call, JSON): the tokens of the
    /// smallest answer it accepts, for which the reasoning keeps room ([`answer_room`]).
    pub(super) answer_tokens: Option<u32>,
}

/// The least margin kept for an answer that must match a grammar, past its smallest form.
pub(super) const ANSWER_MARGIN: u32 = 16;

/// The tokens a reply must still have when its reasoning ends, for an answer that must match
/// a grammar: the end of the reasoning the engine writes (`close_tokens`), the smallest answer
/// the grammar accepts (`answer_tokens`), and a margin of half as many again, at least
/// [`ANSWER_MARGIN`] (values longer than the smallest, whitespace).
#[must_use]
pub(super) fn answer_room(close_tokens: u32, answer_tokens: u32) -> u32 {
    close_tokens.saturating_add(answer_tokens).saturating_add((answer_tokens / 2).max(ANSWER_MARGIN))
}

/// Whether the engine ends the reasoning now, with `generated` of the reply's `limit` tokens
/// out, `reasoning` of them reasoning: its `budget` is spent, or no more tokens are left than
/// the `room` the answer must keep ([`answer_room`]).
#[must_use]
pub(super) fn reasoning_must_end(
    limit: u32,
    generated: u32,
    reasoning: u32,
    budget: Option<u32>,
    room: Option<u32>,
) -> bool {
    budget.is_some_and(|budget| reasoning >= budget) || room.is_some_and(|room| limit.saturating_sub(generated) <= room)
}

impl<'j> Reply<'j> {
    /// An empty reply of at most `limit` tokens, sent to `events`.
    pub(super) fn new(
        events: UnboundedSender<Event>,
        finish_requested: Arc<AtomicBool>,
        shutting_down: &'j AtomicBool,
        limit: u32,
    ) -> Self {
        Self {
            events,
            finish_requested,
            shutting_down,
            limit,
            tokens: 0,
            reasoning_tokens: 0,
            text: String::new(),
            logprobs: None,
            reasoning: None,
            adopted: 0,
            replay: None,
            recording: None,
            answer_tokens: None,
        }
    }

    /// The answer must match a grammar whose smallest answer is `answer_tokens` long (`None`:
    /// free text, or a lazy grammar).
    pub(super) fn with_answer(mut self, answer_tokens: Option<u32>) -> Self {
        self.answer_tokens = answer_tokens;
        self
    }

    /// The reply records its tokens and their logits, up to `most` steps (see [`Recording`]).
    pub(super) fn with_recording(mut self, most: Option<usize>) -> Self {
        self.recording = most.map(|most| Recording { tokens: Vec::new(), logits: Vec::new(), most });
        self
    }

    /// What the reply recorded (none past its limit, or when it did not record).
    pub(super) fn take_recording(&mut self) -> Option<Recording> {
        self.recording.take()
    }

    /// Whether the reply still follows the parked generation it adopted (it has not parted
    /// ways with it): the cache then holds all of the parked tokens.
    pub(super) fn replaying(&self) -> bool {
        self.replay.is_some()
    }

    /// Records the logits of step `step` (once per step).
    fn record_logits(&mut self, step: usize, logits: Logits<'_, '_>) {
        let Some(recording) = self.recording.as_mut() else { return };
        if recording.logits.len() != step {
            return;
        }
        if step >= recording.most {
            self.recording = None;
        } else {
            recording.logits.push(logits.values().to_vec());
        }
    }

    /// The reply adopts a parked generation of its prompt (see [`Reply::generate`]).
    pub(super) fn with_replay(mut self, replay: Option<Replay<'j>>) -> Self {
        self.replay = replay;
        self
    }

    /// Tokens taken from a parked generation.
    pub(super) fn adopted(&self) -> u32 {
        self.adopted
    }

    /// The reply follows a thinking model's reasoning under `limit`.
    pub(super) fn with_reasoning(mut self, limit: Option<ReasoningLimit>) -> Self {
        self.reasoning = limit;
        self
    }

    /// Tokens generated.
    pub(super) fn tokens(&self) -> u32 {
        self.tokens
    }

    /// Tokens generated inside the model's reasoning.
    pub(super) fn reasoning_tokens(&self) -> u32 {
        self.reasoning_tokens
    }

    /// All text sent, the reply as the client has it.
    pub(super) fn into_text(self) -> String {
        self.text
    }

    /// Sends text to the client, after the log-probabilities of the tokens it completes;
    /// false if the client is gone.
    fn send(&mut self, text: String) -> bool {
        if text.is_empty() {
            return true;
        }
        self.text.push_str(&text);
        let sent = self.text.len();
        if let Some(ready) = self.logprobs.as_mut().map(|queue| queue.release(sent)).filter(|r| !r.is_empty()) {
            if self.events.send(Event::Logprobs(ready)).is_err() {
                return false;
            }
        }
        self.events.send(Event::Text(text)).is_ok()
    }

    /// Sends what is left (and the log-probabilities of the tokens that gave it) and ends the
    /// reply with `reason`, unless the client is gone.
    fn end(&mut self, tail: String, reason: FinishReason) -> Result<FinishReason, Halt> {
        if !self.send(tail) {
            return Err(Halt::Cancelled);
        }
        let sent = self.text.len();
        if let Some(rest) = self.logprobs.as_mut().map(|queue| queue.release_rest(sent)).filter(|r| !r.is_empty()) {
            self.events.send(Event::Logprobs(rest)).map_err(|_| Halt::Cancelled)?;
        }
        Ok(reason)
    }

    /// Starts the reply's generation with `picker`: what the text stream holds back, the
    /// markers shown, the forced end of the reasoning (see [`Reply::pick`]).
    pub(super) fn begin<'p>(
        &mut self,
        tokenizer: &Tokenizer,
        request: &GenerationRequest,
        picker: TokenPicker<'p>,
        n_ctx: usize,
    ) -> Generating<'p> {
        let vocab = tokenizer.model().vocab();
        // Markers that are single special tokens are shown (the reasoning's too, so the text
        // can be split); other special tokens are not.
        let reasoning = self.reasoning;
        // Harmony's `<|channel|>analysis<|message|>` is three tokens, each shown.
        let markers = reasoning.iter().flat_map(|r| {
            let pieces = [r.format.open, r.format.close, r.format.resume, r.format.answer_open];
            let tokens = pieces.into_iter().flat_map(crate::chat::tools::token_pieces);
            pieces.into_iter().chain(tokens).collect::<Vec<_>>()
        });
        let preserved: Vec<LlamaToken> = request
            .preserved_tokens
            .iter()
            .map(String::as_str)
            .chain(markers)
            .filter_map(|text| match vocab.tokenize(text.as_bytes(), false, true).as_slice() {
                [token] => Some(*token),
                _ => None,
            })
            .collect();
        let top_logprobs = request.logprobs.map(|n| n as usize);
        self.logprobs = top_logprobs.map(|_| LogprobQueue::default());
        let close = reasoning.map(|r| vocab.tokenize(r.format.forced_close.as_bytes(), false, true));
        let room = reasoning
            .and_then(|r| r.answer_tokens)
            .zip(close.as_ref())
            .map(|(answer, close)| answer_room(close.len() as u32, answer));
        let another_answer = self.answer_tokens.map(|answer| answer_room(0, answer));
        Generating {
            another_answer,
            picker,
            tokenizer: tokenizer.clone(),
            utf8: Utf8Stream::default(),
            stops: StopMatcher::new(&request.stop),
            preserved,
            top_logprobs,
            forced: None,
            close,
            room,
            n_ctx,
        }
    }

    /// The saved logits of the next step, while the reply follows a parked generation that
    /// has them; otherwise the caller reads the context's.
    pub(super) fn replayed_logits(&self) -> Option<Logits<'j, 'j>> {
        let step = self.tokens as usize;
        self.replay.and_then(|replay| replay.logits.get(step)).map(|saved| Logits::Saved(saved))
    }

    /// One step of the reply: picks the next token from `logits` (the end of the reasoning
    /// is written in place of sampled tokens once its budget is spent, or once an answer that
    /// must match a grammar needs the tokens left: [`reasoning_must_end`]), streams its text
    /// (held back where it may be a stop string or half a character), and says what the caller
    /// does next. `evaluated` is how many positions the sequence holds for good (drafts of
    /// the last batch not counted). With a replay ([`Reply::with_replay`]), the parked tokens
    /// are picked again from their saved logits by this request's own sampler: as long as it
    /// picks the same ones, nothing is evaluated; where it parts ways, the caller cuts the
    /// rest and generation goes on as usual. The last picked token is never evaluated: the
    /// next turn's prefill does that.
    pub(super) fn pick(
        &mut self,
        generating: &mut Generating<'_>,
        logits: Logits<'_, '_>,
        evaluated: usize,
    ) -> Result<Picked, Halt> {
        if self.tokens >= self.limit {
            return self.finish(generating, FinishReason::Length).map(Picked::Done);
        }
        let step = self.tokens as usize;
        // Before the client is checked: a reply parked when it left needs the next logits.
        self.record_logits(step, logits);
        still_wanted(self.shutting_down, &self.events)?;
        if self.finish_requested.load(Ordering::Relaxed) {
            return self.finish(generating, FinishReason::Stop).map(Picked::Done);
        }
        fail::fail_point!("engine::token");
        let thinking = generating.picker.in_reasoning();
        if let (Some(limit), Some(close)) = (self.reasoning, generating.close.as_ref()) {
            let end = reasoning_must_end(self.limit, self.tokens, self.reasoning_tokens, limit.budget, generating.room);
            if thinking && generating.forced.is_none() && end {
                generating.forced = Some(close.iter().copied().collect());
            }
        }
        // A complete answer (the grammar may end here: a whole call, a closed JSON value) that
        // the model goes on from by opening something the grammar cannot end inside (a further
        // parallel call) ends here instead, once another answer would not fit: `max_tokens`
        // would cut it and the reply end with `length`. Free text the grammar may end anywhere
        // in (a text reply's words) goes on.
        let left = self.limit.saturating_sub(self.tokens);
        let complete = generating.another_answer.is_some_and(|another| left <= another)
            && !thinking
            && generating.forced.is_none()
            && generating.picker.answer_may_end();
        let picker = &mut generating.picker;
        let token = match generating.forced.as_mut().and_then(VecDeque::pop_front) {
            Some(token) => {
                picker.force(token)?;
                token
            }
            None => picker.pick(logits)?,
        };
        if complete && !generating.tokenizer.model().vocab().is_eog(token) && !generating.picker.answer_may_end() {
            return self.finish(generating, FinishReason::Stop).map(Picked::Done);
        }
        if let Some(recording) = self.recording.as_mut() {
            recording.tokens.push(token);
        }
        let vocab = generating.tokenizer.model().vocab();
        if vocab.is_eog(token) {
            return self.finish(generating, FinishReason::Stop).map(Picked::Done);
        }
        self.tokens += 1;
        self.reasoning_tokens += u32::from(thinking);
        let piece = vocab.token_to_piece(token, generating.preserved.contains(&token), None);
        let text = generating.utf8.push(&piece);
        if let (Some(queue), Some(top)) = (self.logprobs.as_mut(), generating.top_logprobs) {
            queue.push(token_logprob(&generating.tokenizer, logits.values(), token, piece, top), text.len());
        }
        // Stop strings cut free text only, never constrained output (a call, JSON).
        let scan = if generating.picker.constraining() {
            StopScan::Continue(generating.stops.finish() + &text)
        } else {
            generating.stops.push(&text)
        };
        match scan {
            StopScan::Continue(text) => {
                if !self.send(text) {
                    return Err(Halt::Cancelled);
                }
            }
            StopScan::Stopped(text) => return self.end(text, FinishReason::Stop).map(Picked::Done),
        }
        if self.tokens >= self.limit || evaluated >= generating.n_ctx {
            return self.finish(generating, FinishReason::Length).map(Picked::Done);
        }
        let mut cut_to = None;
        if let Some(parked) = self.replay {
            if parked.tokens.get(step) == Some(&token) {
                // Parked and evaluated already.
                self.adopted += 1;
                return Ok(Picked::Held);
            }
            // This request parts ways with the parked tokens: they leave the cache.
            cut_to = Some(parked.prompt_len + step);
            self.replay = None;
        }
        let room = ((self.limit - self.tokens) as usize).min(generating.n_ctx - evaluated) - 1;
        Ok(Picked::Evaluate { token, room, cut_to })
    }

    /// Releases what was held back (an unfinished character, text that looked like a stop)
    /// and ends the reply with `reason`.
    fn finish(&mut self, generating: &mut Generating<'_>, reason: FinishReason) -> Result<FinishReason, Halt> {
        let rest = generating.utf8.finish();
        let stops = &mut generating.stops;
        let scan = if generating.picker.constraining() {
            StopScan::Continue(stops.finish() + &rest)
        } else {
            stops.push(&rest)
        };
        match scan {
            StopScan::Continue(text) => {
                let tail = text + &stops.finish();
                self.end(tail, reason)
            }
            StopScan::Stopped(text) => self.end(text, FinishReason::Stop),
        }
    }

    /// One step of the reply in the live sequence: picks the next token from the logits at
    /// `logits_index` (or the replay's) and evaluates it (with drafts, through `speculating`),
    /// moving `logits_index` to its logits. The reason, once the reply has ended.
    pub(super) fn step(
        &mut self,
        generating: &mut Generating<'_>,
        sequence: &mut LiveSequence<'_>,
        speculating: &mut Speculating<'_>,
        logits_index: &mut i32,
    ) -> Result<Option<FinishReason>, Halt> {
        // Positions evaluated for good (drafts in the last batch are still tentative).
        let evaluated = sequence.tokens().len() - speculating.pending();
        let logits = match self.replayed_logits() {
            Some(saved) => saved,
            None => Logits::Context(sequence.target(), *logits_index),
        };
        match self.pick(generating, logits, evaluated)? {
            Picked::Done(reason) => return Ok(Some(reason)),
            Picked::Held => {}
            Picked::Evaluate { token, room, cut_to } => {
                if let Some(keep) = cut_to {
                    if !sequence.cut(keep) {
                        return Err(Halt::Failed(EngineError::Decode("the parked tokens could not be cut".into())));
                    }
                }
                *logits_index = speculating.advance(sequence, token, room)?;
                sequence.checkpoint_reply();
            }
        }
        Ok(None)
    }
}

/// A reply's generation under way: its sampler, and what its text stream holds back.
pub(super) struct Generating<'p> {
    picker: TokenPicker<'p>,
    tokenizer: Tokenizer,
    utf8: Utf8Stream,
    stops: StopMatcher,
    /// Special tokens whose text is shown.
    preserved: Vec<LlamaToken>,
    /// Log-probabilities asked for, per token.
    top_logprobs: Option<usize>,
    /// The end of the reasoning, written token by token once the budget is spent or the
    /// answer a grammar requires needs the tokens left.
    forced: Option<VecDeque<LlamaToken>>,
    /// The tokens that end the reasoning.
    close: Option<Vec<LlamaToken>>,
    /// The tokens the answer keeps when it must match a grammar ([`answer_room`]).
    room: Option<u32>,
    /// The tokens another answer would need after a complete one (an answer that must match a
    /// grammar): with no more left, a complete answer ends there.
    another_answer: Option<u32>,
    /// Context size in tokens.
    n_ctx: usize,
}

/// What a reply's step leaves to its caller.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Picked {
    /// Evaluate `token` (with up to `room` drafts after it), after cutting the cache to
    /// `cut_to` positions where it says so (a parked generation the reply parts ways with).
    Evaluate {
        /// The token picked.
        token: LlamaToken,
        /// Most drafts that may follow it.
        room: usize,
        /// Positions to keep before evaluating it.
        cut_to: Option<usize>,
    },
    /// The token was parked and is evaluated already.
    Held,
    /// The reply ended.
    Done(FinishReason),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_answer_keeps_its_smallest_form_the_closing_text_and_a_margin() {
        assert_eq!(answer_room(5, 20), 5 + 20 + ANSWER_MARGIN);
        assert_eq!(answer_room(5, 60), 5 + 60 + 30, "half the answer again past 32 tokens");
        assert_eq!(answer_room(u32::MAX, 60), u32::MAX);
    }

    #[test]
    fn the_reasoning_ends_when_its_budget_is_spent_or_only_the_answers_room_is_left() {
        // No budget, no answer to keep: it never ends on the engine's word.
        assert!(!reasoning_must_end(200, 199, 199, None, None));
        assert!(reasoning_must_end(200, 10, 4, Some(4), None));
        assert!(!reasoning_must_end(200, 10, 3, Some(4), None));
        // 200 tokens, 41 kept for the answer: the reasoning takes at most 159.
        let room = Some(answer_room(5, 20));
        assert!(!reasoning_must_end(200, 158, 158, None, room));
        assert!(reasoning_must_end(200, 159, 159, None, room));
        // A limit under the room ends the reasoning at once.
        assert!(reasoning_must_end(30, 0, 0, None, room));
        // Whichever comes first.
        assert!(reasoning_must_end(200, 20, 20, Some(20), room));
        assert!(reasoning_must_end(200, 170, 100, Some(150), room));
        // Past the limit (a replay's tokens) it still ends.
        assert!(reasoning_must_end(200, 250, 250, None, room));
    }
}
