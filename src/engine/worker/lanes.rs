//! Requests beside the reply being generated: between two of its steps, the request at the
//! head of the queue takes a lane ([`crate::engine::sequence::LaneStart`]) when it can be
//! served there, so it starts at once instead of waiting for the reply to end. What cannot
//! (a prompt that must be shortened, not enough free cells, a prefill, media without a
//! projector) waits its turn as before, and nothing behind it overtakes it.

use std::sync::atomic::Ordering;
use std::sync::mpsc::{RecvTimeoutError, TryRecvError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use llama_cpp_2::token::LlamaToken;

use super::{overflow, Session};
use crate::engine::media::is_placeholder;
use crate::engine::reply::{ReasoningLimit, Reply};
use crate::engine::sequence::{LaneStart, Remember};
use crate::engine::{Command, EngineError, Event, Job, Prompt};

impl<'m> Session<'m> {
    /// The next command: one left for its turn first, else the queue's next, waiting up to
    /// `timeout` (not at all while lanes have work).
    pub(super) fn next_command(&mut self, timeout: Duration) -> Result<Command, RecvTimeoutError> {
        if let Some(command) = self.deferred.pop_front() {
            return Ok(command);
        }
        if self.sequence.lanes_busy() {
            return self.commands.try_recv().map_err(|e| match e {
                TryRecvError::Empty => RecvTimeoutError::Timeout,
                TryRecvError::Disconnected => RecvTimeoutError::Disconnected,
            });
        }
        self.commands.recv_timeout(timeout)
    }

    /// Between two steps of the reply under way (which may hold up to `reserved` cells of the
    /// context): gives the requests at the head of the queue a lane while they can take one.
    pub(super) fn admit_waiting(&mut self, reserved: usize) {
        self.admit_while_open(reserved);
        self.publish_lanes();
    }

    /// Publishes the cache status when the lanes changed since it was last published (one
    /// took a request, one ended), so `/metrics` follows them while a reply streams.
    pub(super) fn publish_lanes(&mut self) {
        if self.sequence.lane_counts() != self.signals.cache_status.lock().lanes {
            self.publish_cache_status();
        }
    }

    /// Gives the head of the queue lanes while one is open and it can take one.
    fn admit_while_open(&mut self, reserved: usize) {
        while self.sequence.lanes_open() && self.deferred.is_empty() {
            let command = match self.commands.try_recv() {
                Ok(command) => command,
                Err(_) => return,
            };
            let Command::Generate(job) = command else {
                self.deferred.push_back(command);
                return;
            };
            if let Some(job) = self.take_lane(job, reserved) {
                self.deferred.push_back(Command::Generate(job));
                return;
            }
        }
    }

    /// Serves `job` in a lane; the job back when it must wait for its turn.
    fn take_lane(&mut self, mut job: Box<Job>, reserved: usize) -> Option<Box<Job>> {
        if job.events.is_closed() {
            // The client left while the request was queued: dropped without running.
            self.signals.waiting_generations.fetch_sub(1, Ordering::Relaxed);
            return None;
        }
        if !job.request.media.is_empty() && !self.sequence.lanes_take_media() {
            return Some(job);
        }
        let prompt = std::mem::replace(&mut job.prompt, super::PromptInput::Tokens(Vec::new()));
        let text = prompt.text().map(str::to_owned);
        // Its media as the job prepared them (the projector holds the live sequence's job's).
        let brought = std::mem::take(&mut job.media);
        let tokenized = self.prompt_tokens_brought(prompt, &job.request.media, &brought);
        job.media = brought;
        let (tokens, media) = match tokenized {
            Ok(tokenized) => tokenized,
            Err(e) => {
                self.signals.waiting_generations.fetch_sub(1, Ordering::Relaxed);
                let _ = job.events.send(Event::Failed(e));
                return None;
            }
        };
        let n_ctx = self.sequence.n_ctx();
        let restore = |job: &mut Box<Job>, tokens: Vec<LlamaToken>| {
            job.prompt = match text.clone() {
                // Media are found again from the text's markers.
                Some(text) if tokens.iter().any(|&token| is_placeholder(token)) => super::PromptInput::Text(text),
                Some(text) => super::PromptInput::Tokenized { text, tokens },
                None => super::PromptInput::Tokens(tokens.iter().map(|t| t.0).collect()),
            };
        };
        // A prompt that must be shortened (or refused) takes the usual path.
        let Ok(limit) = overflow::reply_limit(tokens.len() as u32, &job.request, n_ctx, self.n_predict) else {
            restore(&mut job, tokens);
            return Some(job);
        };
        // The cells it needs beyond the prefix it can share (none of a prefix a sliding window
        // no longer covers).
        let (source, shared) = self.sequence.longest_live_prefix(&tokens);
        let needs = tokens.len() - shared + limit as usize;
        // Kept conversations give their cells up for it, its own source's aside.
        let free = self.sequence.room_beside_kept(reserved + needs, Some(source)).saturating_sub(reserved);
        if needs > free {
            restore(&mut job, tokens);
            return Some(job);
        }
        let (picker, reasoning, in_reasoning) = match self.reply_picker(&job.request, text.as_deref()) {
            Ok(picked) => picked,
            Err(e) => {
                self.signals.waiting_generations.fetch_sub(1, Ordering::Relaxed);
                let _ = job.events.send(Event::Failed(e));
                return None;
            }
        };
        self.signals.waiting_generations.fetch_sub(1, Ordering::Relaxed);
        let matching = Instant::now();
        let request = &job.request;
        let budget = request.reasoning_budget.or(self.reasoning_budget);
        let answer_tokens = request.grammar.as_ref().and_then(|grammar| self.smallest_answer(grammar));
        let signals = self.signals;
        let mut reply =
            Reply::new(job.events.clone(), Arc::clone(&job.finish_requested), &signals.shutting_down, limit)
                .with_reasoning(reasoning.map(|format| ReasoningLimit { format, budget, answer_tokens }))
                .with_answer(answer_tokens);
        let generating = reply.begin(&self.tokenizer, request, picker, n_ctx as usize);
        let chat = Arc::clone(&self.chat);
        let tools = match &request.prompt {
            Prompt::Chat { tools, .. } => Some(tools.clone()),
            _ => None,
        };
        let remember: Remember<'m> = Box::new(move |text: &str| {
            if let Some(tools) = tools {
                let _ = chat.reply_message(text, in_reasoning, &tools);
            }
        });
        let clock = job.clock.take().map(|mut clock| {
            clock.taken();
            clock.finish(matching.elapsed())
        });
        let start = LaneStart {
            prompt: tokens,
            media,
            limit,
            reply,
            generating,
            events: job.events.clone(),
            in_reasoning,
            request: clock,
            remember,
            admitted: job._admitted,
        };
        if !self.sequence.admit_lane(start, free) {
            // Checked open above: a lane cannot have been taken meanwhile.
            let _ = job.events.send(Event::Failed(EngineError::Internal("no lane was free".into())));
        }
        None
    }

    /// Steps the lanes until `needed` cells are free beside them for `prompt` (a request about
    /// to be served as the live sequence's), or none is busy any more. Kept conversations give
    /// their cells up first, but the one that holds the most of `prompt` (its cells are the
    /// prompt's, sequence 0 takes them over).
    pub(super) fn make_room(&mut self, prompt: &[LlamaToken], needed: usize) {
        let n_ctx = self.sequence.n_ctx() as usize;
        let continued = self.sequence.longest_kept_prefix(prompt, prompt.len().saturating_sub(1));
        let (spare, held) = continued.map_or((None, 0), |(seq, held)| (Some(seq), held));
        self.sequence.room_beside_kept(needed.saturating_sub(held), spare);
        while self.sequence.lanes_busy() && needed + self.sequence.lanes_reserved() > n_ctx {
            if self.signals.shutting_down.load(Ordering::Relaxed) {
                return;
            }
            self.sequence.step_lanes();
        }
    }
}
