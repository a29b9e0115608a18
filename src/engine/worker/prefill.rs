//! Prefill jobs: a prompt evaluated into the cache without generating (a voice pipeline's
//! partial transcript, a `--warm` prompt), in small chunks that yield to a generation request
//! waiting behind (see [`super::evaluate`]).

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc::UnboundedSender;

use super::{render_prompt, PromptInput, Session};
use crate::chat::Landmarks;
use crate::engine::policy::Purpose;
use crate::engine::reply::Halt;
use crate::engine::{Event, GenerationRequest, Job, PrefillReport, Prompt, Timings};

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
            match self.prefill_steps(input, landmarks, &request, &events, Purpose::Warm) {
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
        // A newer partial transcript: what the last one generated ahead is of no use now.
        self.discard_parked();
        match self.prefill_steps(prompt, landmarks, &request, &events, Purpose::Partial) {
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
        self.upkeep(None);
    }

    /// Fits the prompt to the context (shortening the conversation as the request itself would
    /// be) and evaluates it as [`Session::evaluate_prompt`] does for `purpose`, until done or
    /// until a generation request waits.
    fn prefill_steps(
        &mut self,
        prompt: PromptInput,
        landmarks: Landmarks,
        request: &GenerationRequest,
        events: &UnboundedSender<Event>,
        purpose: Purpose,
    ) -> Result<PrefillReport, Halt> {
        let fitted = self.fit_prompt(prompt, landmarks, request)?;
        let evaluated = self.evaluate_prompt(&fitted, purpose, events, false)?;
        // Reply tokens generated ahead, once the whole prompt is in the cache.
        let whole = evaluated.cached + evaluated.evaluated == fitted.tokens.len();
        let pregenerated_tokens = match purpose {
            Purpose::Partial if whole && !evaluated.yielded => {
                let n = request.pregenerate.unwrap_or(self.pregenerate);
                self.pregenerate(&fitted, request, evaluated.logits_index, n, events)
            }
            _ => 0,
        };
        let timings = Timings {
            prompt: evaluated.time,
            generation: Duration::ZERO,
            draft: None,
            cache: evaluated.cache,
            request: evaluated.request,
            shared: None,
        };
        Ok(PrefillReport {
            prompt_tokens: fitted.tokens.len() as u32,
            cached_tokens: evaluated.cached as u32,
            prefilled_tokens: evaluated.evaluated as u32,
            complete: !evaluated.yielded,
            superseded: false,
            pregenerated_tokens,
            timings,
        })
    }
}
