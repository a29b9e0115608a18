//! One path for every prompt: a request's (chat, completions, responses), a partial transcript's
//! (`/v1/prefill`) and a start-up `--warm` prompt's. Fitted to the context, planned by the cache
//! policy, carried out by the live sequence, explained, and evaluated in chunks that stop for a
//! client that left, a shutdown, or (for a prefill) a request waiting behind it. After the job,
//! one upkeep readies the cache for the next turn.

use std::cell::Cell;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use llama_cpp_2::token::LlamaToken;
use tokio::sync::mpsc::UnboundedSender;

use super::overflow::FittedPrompt;
use super::{PromptInput, PromptParts, Session};
use crate::engine::media::{MediaInput, MediaSpan};
use crate::engine::policy::{self, Derivation, PartialMarks, Purpose};
use crate::engine::reply::{still_wanted, Halt};
use crate::engine::sequence::PromptMedia;
use crate::engine::{CacheMiss, CacheReport, CacheSource, Command, Event, Prompt, RequestPath};

/// Prompt tokens a prefill evaluates between checks for a waiting generation request: about a
/// second of a small model on a 2-core CPU, a few milliseconds on a GPU.
const PREFILL_CHUNK: usize = 128;

/// A prompt evaluated into the cache.
pub(super) struct Evaluated {
    /// Prompt tokens the cache held before (the rest was evaluated, or is to be).
    pub(super) cached: usize,
    /// Prompt tokens evaluated now.
    pub(super) evaluated: usize,
    /// The batch index holding the last evaluated token's logits.
    pub(super) logits_index: i32,
    /// What the cache did, and why not more.
    pub(super) cache: CacheReport,
    /// Time spent evaluating.
    pub(super) time: Duration,
    /// A prefill stopped early for a request waiting behind it.
    pub(super) yielded: bool,
    /// What the request cost before its prompt was evaluated (requests with a clock).
    pub(super) request: Option<RequestPath>,
}

/// What the upkeep after a reply needs to anticipate the next turn.
pub(super) struct NextTurn<'p> {
    /// The conversation evaluated (shortened, where it was).
    pub(super) prompt: &'p Prompt,
    /// Its media.
    pub(super) media: &'p [MediaInput],
    /// Its rendered text.
    pub(super) prompt_text: String,
    /// The reply's text, as sent.
    pub(super) reply: &'p str,
    /// The prompt opened the model's reasoning.
    pub(super) reasoning_opened: bool,
}

impl Session<'_> {
    /// Makes the cache hold `fitted`'s tokens as the cache policy plans, sends
    /// [`Event::Started`] (with `in_reasoning`), and evaluates what the cache did not hold, as far
    /// as `purpose` needs.
    pub(super) fn evaluate_prompt(
        &mut self,
        fitted: &FittedPrompt,
        purpose: Purpose,
        events: &UnboundedSender<Event>,
        in_reasoning: bool,
    ) -> Result<Evaluated, Halt> {
        let tokens = &fitted.tokens;
        let parts = PromptParts { text: fitted.text.as_deref(), landmarks: fitted.landmarks, media: &fitted.media };
        // What the drafter evaluated for the last reply's upkeep is no part of this job.
        self.sequence.take_catch_up();
        let derivation = match &fitted.full_tokens {
            Some(full) => Derivation::Shortened { full },
            None => Derivation::AsSent,
        };
        let matching = Instant::now();
        let media_changed = !fitted.media.is_empty() && self.media_changed(tokens);
        let mut reuse = self.sequence.reuse_prefix(tokens, derivation, fitted.approximate);
        self.keep_media_whole(&mut reuse, &fitted.media);
        let mut cache = self.explain(&reuse, tokens, parts);
        if media_changed
            && reuse.obstacle.is_none()
            && matches!(reuse.source, CacheSource::Live | CacheSource::Kept | CacheSource::None)
        {
            cache.reason = Some(CacheMiss::MediaChanged);
        }
        // The compare and the plan, without the state copies the cache report times itself.
        let stored = cache.save.unwrap_or_default() + cache.restore.unwrap_or_default();
        let request = self.clock.take().map(|clock| clock.finish(matching.elapsed().saturating_sub(stored)));
        let keep = reuse.keep;
        let respanned = reuse.evaluated_inside();
        let started = Event::Started {
            prompt_tokens: tokens.len() as u32,
            cached_tokens: (keep - respanned) as u32,
            in_reasoning,
        };
        events.send(started).map_err(|_| Halt::Cancelled)?;

        let marks =
            if purpose == Purpose::Partial { self.partial_marks(tokens, parts) } else { PartialMarks::default() };
        let plan = policy::plan_evaluation(
            self.sequence.shape(),
            self.sequence.takes_checkpoints(),
            purpose,
            tokens.len(),
            keep,
            marks,
            self.sequence.min_save(),
        );
        let signals = self.signals;
        let yielded = Cell::new(false);
        let (chunk, yields) = match purpose {
            Purpose::Reply => (self.sequence.n_batch(), false),
            Purpose::Partial | Purpose::Warm => (PREFILL_CHUNK, true),
        };
        let time = Instant::now();
        let media = PromptMedia { spans: &fitted.media, projector: self.projector.as_mut() };
        let outcome = self.sequence.prefill(&tokens[keep..plan.evaluate_to], chunk, plan, media, || {
            if yields {
                // The tests hold a prefill here, between two chunks.
                fail::fail_point!("engine::prefill_chunk");
            }
            still_wanted(&signals.shutting_down, events)?;
            if yields && signals.waiting_generations.load(Ordering::Relaxed) > 0 {
                yielded.set(true);
                return Err(Halt::Cancelled);
            }
            Ok(())
        });
        let logits_index = match outcome {
            Ok(index) => index,
            Err(Halt::Cancelled) if yielded.get() => {
                tracing::debug!("prefill yields to a waiting request");
                0
            }
            Err(halt) => return Err(halt),
        };
        let evaluated = self.sequence.tokens().len().saturating_sub(keep) + respanned;
        Ok(Evaluated {
            cached: keep - respanned,
            evaluated,
            logits_index,
            cache,
            time: time.elapsed(),
            yielded: yielded.get(),
            request,
        })
    }

    /// For a request that adopts the parked generation of its prompt: the cache holds the
    /// prompt (and the parked tokens), so nothing is evaluated; sends [`Event::Started`].
    pub(super) fn adopt_parked(
        &mut self,
        fitted: &FittedPrompt,
        events: &UnboundedSender<Event>,
        in_reasoning: bool,
    ) -> Result<Evaluated, Halt> {
        self.sequence.take_catch_up();
        let request = self.clock.take().map(|clock| clock.finish(Duration::ZERO));
        let prompt_tokens = fitted.tokens.len();
        let started =
            Event::Started { prompt_tokens: prompt_tokens as u32, cached_tokens: prompt_tokens as u32, in_reasoning };
        events.send(started).map_err(|_| Halt::Cancelled)?;
        let cache = CacheReport {
            source: CacheSource::Live,
            reused: prompt_tokens as u32,
            prefilled: 0,
            diverged_at: None,
            reason: None,
            save: None,
            restore: None,
            adopted: 0,
            reply_cut: None,
            changes: None,
        };
        Ok(Evaluated {
            cached: prompt_tokens,
            evaluated: 0,
            logits_index: 0,
            cache,
            time: Duration::ZERO,
            yielded: false,
            request,
        })
    }

    /// Where a partial transcript's turn opens and its last word starts, in tokens.
    fn partial_marks(&self, tokens: &[LlamaToken], parts: PromptParts<'_>) -> PartialMarks {
        let Some(text) = parts.text else { return PartialMarks::default() };
        let within = |offset: Option<usize>| offset.map(|offset| self.tokens_within(tokens, text, offset, parts.media));
        PartialMarks { opening: within(parts.landmarks.history_end), stable: within(parts.landmarks.last_word_start) }
    }

    /// How many of `tokens` (the tokenization of `text`, with `media`) lie wholly within its
    /// first `offset` bytes.
    fn tokens_within(&self, tokens: &[LlamaToken], text: &str, offset: usize, media: &[MediaSpan]) -> usize {
        // A BOS the tokenizer added is not in the text.
        let mut end = 0usize;
        let mut skip = self.added_bos(tokens, text);
        let mut count = 0;
        for piece in self.text_lengths(tokens, media) {
            if skip > 0 {
                skip -= 1;
                count += 1;
                continue;
            }
            end += piece;
            if end > offset {
                break;
            }
            count += 1;
        }
        count
    }

    /// 1 when the tokenizer added a BOS that `text` does not start with, else 0.
    pub(super) fn added_bos(&self, tokens: &[LlamaToken], text: &str) -> usize {
        let vocab = self.model.vocab();
        let added = tokens.first() == Some(&vocab.bos())
            && vocab.should_add_bos()
            && !text.starts_with(self.tokenizer.bos_text());
        usize::from(added)
    }

    /// Readies the cache once the client has its answer: the prompt's checkpoint, the next turn
    /// anticipated after a reply (unless a request sent right after the reply is waiting:
    /// [`crate::EngineConfig::next_request_grace`]), the drafter caught up, the status
    /// published. The copy for the disk cache waits until the engine has been idle a moment
    /// ([`crate::EngineConfig::persist_after_idle`]).
    pub(super) fn upkeep(&mut self, next_turn: Option<NextTurn<'_>>) {
        self.sequence.save_pending_checkpoint();
        if let Some(next) = next_turn {
            if !self.request_waiting(self.next_request_grace) {
                self.prepare_next_turn(next.prompt, next.media, next.prompt_text, next.reply, next.reasoning_opened);
            }
            self.persist_due = true;
        }
        self.sequence.save_pending_checkpoint();
        // After the answer: the MTP context catches up with a prompt batch it has not seen yet.
        self.sequence.mirror_pending();
        self.publish_cache_status();
    }

    /// With nothing to do for `idle`: drops parked tokens past their time, and copies the
    /// conversation for the disk cache once the engine has been idle long enough after a reply.
    pub(super) fn on_idle(&mut self, idle: Duration) {
        self.expire_parked();
        if self.persist_due && idle >= self.persist_after_idle {
            self.persist_now();
        }
    }

    /// Copies the conversation for the disk cache if a reply changed it since the last copy.
    pub(super) fn persist_now(&mut self) {
        if std::mem::take(&mut self.persist_due) && self.sequence.unpersisted() {
            self.sequence.persist();
            self.publish_cache_status();
        }
    }

    /// After a reply, makes the cache hold the tokenizer's own split of prompt + reply text,
    /// which is what the next turn sends (it is tokenized from text). A model's sampled tokens
    /// are not always that split (grammar-constrained output especially); without this the
    /// next turn's cache would stop inside the reply. With `anticipate`, a chat reply is
    /// followed by what the template writes before the next user's words (the end of the
    /// assistant turn, the user turn's opening), evaluated now, so the next turn prefills only
    /// those words and its generation prompt (a next request of another shape just cuts them).
    /// Runs while the user reads or listens; skipped when the difference is larger than one
    /// batch. A thinking model's reply goes into the next turn as clients send it back:
    /// reasoning apart from the answer (`reasoning_opened`: the prompt opened it).
    fn prepare_next_turn(
        &mut self,
        prompt: &Prompt,
        media: &[MediaInput],
        prompt_text: String,
        reply: &str,
        reasoning_opened: bool,
    ) {
        if self.signals.shutting_down.load(Ordering::Relaxed) {
            return;
        }
        let next_prefix = match prompt {
            Prompt::Chat { messages, tools, template_kwargs } if self.anticipate => {
                let reply = self.chat.reply_message(reply, reasoning_opened, tools);
                self.chat.next_turn_prefix(messages, tools, template_kwargs, reply)
            }
            _ => None,
        };
        let anticipated = next_prefix.is_some();
        let text = next_prefix.unwrap_or(prompt_text + reply);
        let Ok((canonical, _)) = self.prompt_tokens(PromptInput::Text(text), media) else { return };
        self.sequence.rewrite_tail(&canonical);
        // A request that came while the tail was evaluated again goes first; so does one that
        // comes while a draft model catches up, a batch at a time.
        if anticipated && !self.request_waiting(Duration::ZERO) && self.sequence.extend_to(&canonical) {
            while !self.sequence.follow_drafter() && !self.request_waiting(Duration::ZERO) {}
        }
    }

    /// After a reply, with a grace ([`crate::EngineConfig::next_request_grace`]) set: whether a
    /// request (a generation or a prefill) is waiting, or comes within `wait` (not waited for
    /// while lanes have steps to take). What is taken from the queue to see it is left for its
    /// turn, first. Always false without a grace, so the next turn is readied whatever the
    /// timing.
    fn request_waiting(&mut self, wait: Duration) -> bool {
        let is_request = |command: &Command| matches!(command, Command::Generate(_) | Command::Prefill(_));
        if self.next_request_grace.is_zero() {
            return false;
        }
        if self.deferred.iter().any(is_request) {
            return true;
        }
        let command = if wait.is_zero() || self.sequence.lanes_busy() {
            self.commands.try_recv().ok()
        } else {
            self.commands.recv_timeout(wait).ok()
        };
        command.is_some_and(|command| {
            let request = is_request(&command);
            self.deferred.push_back(command);
            request
        })
    }
}
