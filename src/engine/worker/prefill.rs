//! Prefill jobs: a prompt evaluated into the cache without generating (a voice pipeline's
//! partial transcript), in small chunks that yield to a generation request waiting behind.

use std::cell::Cell;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::mpsc::UnboundedSender;

use super::{render_prompt, PromptInput, PromptParts, Session};
use crate::chat::Landmarks;
use crate::engine::reply::{still_wanted, Halt};
use crate::engine::sequence::Displaced;
use crate::engine::{Event, GenerationRequest, Job, PrefillReport, Prompt, Timings};

/// Prompt tokens a prefill evaluates between checks for a waiting generation request: about a
/// second of a small model on a 2-core CPU, a few milliseconds on a GPU.
const PREFILL_CHUNK: usize = 128;

impl Session<'_> {
    /// Prefills each of `prompts` in turn (the start-up `--warm` prompts), before the engine
    /// reports ready; one that cannot be rendered or evaluated is skipped with a warning.
    pub(super) fn warm(&mut self, prompts: &[Prompt]) {
        let chat = Arc::clone(&self.chat);
        // Nobody waits on these events; the receiver is kept so the prefill is not cancelled.
        let (events, _receiver) = tokio::sync::mpsc::unbounded_channel();
        for (i, prompt) in prompts.iter().enumerate() {
            let (input, landmarks) = match render_prompt(&chat, prompt) {
                Ok(rendered) => rendered,
                Err(e) => {
                    tracing::warn!("warm prompt {}: {e}; skipped", i + 1);
                    continue;
                }
            };
            let request = GenerationRequest { prompt: prompt.clone(), ..GenerationRequest::chat(Vec::new()) };
            match self.prefill_steps(input, landmarks, &request, &events) {
                Ok(report) => tracing::info!(
                    tokens = report.prompt_tokens,
                    prefilled = report.prefilled_tokens,
                    ms = report.timings.prompt.as_secs_f32() * 1000.0,
                    "warm prompt {} prefilled",
                    i + 1
                ),
                Err(Halt::Failed(e)) => tracing::warn!("warm prompt {}: {e}; skipped", i + 1),
                Err(Halt::Cancelled) => return,
            }
            self.sequence.save_pending_checkpoint();
        }
        // A warm prompt is worth keeping across a restart.
        self.sequence.persist();
        self.publish_cache_status();
    }

    /// Serves a prefill, whose events end with `Prefilled` or `Failed` (one that a newer
    /// prefill replaced while it waited never gets here: see [`crate::engine::queue`]).
    pub(super) fn serve_prefill(&mut self, job: Job) {
        let Job { prompt, landmarks, request, events, report: report_to, .. } = job;
        let Some(report_to) = report_to else { return };
        match self.prefill_steps(prompt, landmarks, &request, &events) {
            Ok(report) => {
                self.sequence.save_pending_checkpoint();
                self.publish_cache_status();
                let _ = report_to.send(report);
            }
            Err(Halt::Failed(e)) => {
                let _ = events.send(Event::Failed(e));
            }
            Err(Halt::Cancelled) => tracing::debug!("client left; prefill stopped"),
        }
        self.sequence.save_pending_checkpoint();
        self.sequence.mirror_pending();
        self.publish_cache_status();
    }

    /// Tokenize, check the context (shortening the conversation as the request itself would
    /// be), reuse the cached prefix, and evaluate the rest until done or until a generation
    /// request waits.
    fn prefill_steps(
        &mut self,
        prompt: PromptInput,
        landmarks: Landmarks,
        request: &GenerationRequest,
        events: &UnboundedSender<Event>,
    ) -> Result<PrefillReport, Halt> {
        let fitted = self.fit_prompt(prompt, landmarks, request)?;
        let tokens = fitted.tokens;
        let parts = PromptParts { text: fitted.text.as_deref(), landmarks: fitted.landmarks };
        let prompt_tokens = tokens.len() as u32;
        self.sequence.take_catch_up();
        let displaced = if fitted.shortened.is_some() { Displaced::Forget } else { Displaced::Save };
        let reuse = self.sequence.reuse_prefix(&tokens, displaced);
        let cache = self.explain(&reuse, &tokens, parts);
        let keep = reuse.keep;
        events
            .send(Event::Started { prompt_tokens, cached_tokens: keep as u32, in_reasoning: false })
            .map_err(|_| Halt::Cancelled)?;
        let started = Instant::now();
        let signals = self.signals;
        let yielded = Cell::new(false);
        let outcome = self.sequence.prefill(&tokens[keep..], PREFILL_CHUNK, || {
            // The tests hold a prefill here, between two chunks.
            fail::fail_point!("engine::prefill_chunk");
            still_wanted(&signals.shutting_down, events)?;
            if signals.waiting_generations.load(Ordering::Relaxed) > 0 {
                yielded.set(true);
                return Err(Halt::Cancelled);
            }
            Ok(())
        });
        match outcome {
            Ok(_) => {}
            Err(Halt::Cancelled) if yielded.get() => tracing::debug!("prefill yields to a waiting request"),
            Err(halt) => return Err(halt),
        }
        let prefilled_tokens = self.sequence.tokens().len().saturating_sub(keep) as u32;
        let timings = Timings { prompt: started.elapsed(), generation: Duration::ZERO, draft: None, cache };
        Ok(PrefillReport {
            prompt_tokens,
            cached_tokens: keep as u32,
            prefilled_tokens,
            complete: !yielded.get(),
            superseded: false,
            timings,
        })
    }
}
