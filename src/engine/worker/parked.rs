//! Parked generations: reply tokens a prefill generates after its prompt (`pregenerate`), with
//! the request's own sampler, while the user is still speaking or the voice pipeline waits out
//! the end-of-turn silence; and the tokens a request had generated when its client left (a
//! preemptive request cancelled on a changed transcript, a retry), which stay parked as they
//! are (nothing more is generated for them). The request that follows with the same prompt
//! adopts them: its own
//! sampler picks each parked token again from the logits it was picked from (so the reply is
//! the one it would have produced alone: same grammar, seed, penalties), and as long as it picks
//! the same ones nothing is evaluated; where it parts ways, the rest leaves the cache. Any other
//! job discards them.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use llama_cpp_2::token::LlamaToken;
use tokio::sync::mpsc::UnboundedSender;

use super::overflow::FittedPrompt;
use super::Session;
use crate::engine::decoder::BatchKind;
use crate::engine::reply::{Recording, Replay};
use crate::engine::sampling::Logits;
use crate::engine::{Event, GenerationRequest};

/// Most bytes of logits one parked generation keeps (one vector per token: 0.2 MB for
/// SmolLM2's vocabulary, 1 MB for gemma's): the generation stops there.
const MAX_PARKED_LOGIT_BYTES: usize = 64 << 20;

/// Reply tokens generated ahead of the request, with the logits each was picked from.
pub(super) struct Parked {
    /// The prompt they follow.
    prompt: Vec<LlamaToken>,
    /// The tokens, in order (the last may end the reply).
    tokens: Vec<LlamaToken>,
    /// The logits each token was picked from, and those after the last one unless it ended
    /// the reply.
    logits: Vec<Vec<f32>>,
    /// The last token ended the reply (it was not evaluated).
    ended: bool,
    /// When they were parked.
    at: Instant,
}

impl Parked {
    /// Whether a request for `prompt` can adopt them now: the same prompt, the cache still
    /// holds it and the parked tokens, and they are no older than `limit`.
    pub(super) fn adoptable(&self, prompt: &[LlamaToken], cached: &[LlamaToken], limit: Duration) -> bool {
        self.prompt == prompt
            && self.at.elapsed() <= limit
            && cached.len() == self.prompt.len() + self.evaluated()
            && cached.starts_with(&self.prompt)
            && cached[self.prompt.len()..] == self.tokens[..self.evaluated()]
    }

    /// Parked tokens the cache holds (all but one that ended the reply).
    fn evaluated(&self) -> usize {
        self.tokens.len() - usize::from(self.ended)
    }

    /// What the adopting request replays.
    pub(super) fn replay(&self) -> Replay<'_> {
        Replay { tokens: &self.tokens, logits: &self.logits, prompt_len: self.prompt.len() }
    }
}

impl Session<'_> {
    /// How many steps a reply records to be parked if its client leaves: none where nothing is
    /// parked (speculative decoding, recurrent state, no park time), else as many as the
    /// logits budget holds.
    pub(super) fn recorded_steps(&self) -> Option<usize> {
        let parks = !self.sequence.speculates() && !self.sequence.shape().recurrent && !self.park_for.is_zero();
        let per_token = (self.model.n_vocab().max(1) as usize) * std::mem::size_of::<f32>();
        parks.then_some(MAX_PARKED_LOGIT_BYTES / per_token)
    }

    /// A reply to `prompt` whose client left: parks what the cache holds of it for the same
    /// request sent again. `adopted` is the parked generation it adopted, whole again in the
    /// cache if the reply still followed it (`left.0`); else the reply's recording (`left.1`)
    /// holds its tokens and logits. Nothing is parked where the recording stopped short of what
    /// the cache holds.
    pub(super) fn park_left(
        &mut self,
        prompt: &[LlamaToken],
        adopted: Option<Parked>,
        left: (bool, Option<Recording>),
    ) {
        let parked = match (adopted, left) {
            (Some(parked), (true, _)) => Some(parked),
            (_, (false, Some(Recording { mut tokens, mut logits, .. }))) => {
                let cached = self.sequence.tokens();
                let n = cached.len().saturating_sub(prompt.len());
                let whole = cached.starts_with(prompt)
                    && tokens.len() >= n
                    && logits.len() > n
                    && cached[prompt.len()..] == tokens[..n];
                tokens.truncate(n);
                logits.truncate(n + 1);
                whole.then(|| Parked { prompt: prompt.to_vec(), tokens, logits, ended: false, at: Instant::now() })
            }
            _ => None,
        };
        if let Some(mut parked) = parked {
            tracing::debug!(tokens = parked.tokens.len(), "the reply of a client that left is parked");
            parked.at = Instant::now();
            self.parked = Some(parked);
            self.parking.parked += 1;
        }
    }

    /// The parked generation, for a request whose prompt is `prompt`: adopted if it can be,
    /// else discarded. A request that does not accept cells kept past a changed span
    /// (`approximate`) never adopts tokens generated after them.
    pub(super) fn take_parked(&mut self, prompt: &[LlamaToken], approximate: bool) -> Option<Parked> {
        let parked = self.parked.take()?;
        let from_approximate = self.sequence.approximate() && !approximate;
        if !from_approximate && parked.adoptable(prompt, self.sequence.tokens(), self.park_for) {
            self.parking.adopted += 1;
            Some(parked)
        } else {
            self.parking.discarded += 1;
            None
        }
    }

    /// Discards the parked generation, if any (a newer prefill came).
    pub(super) fn discard_parked(&mut self) {
        if self.parked.take().is_some() {
            self.parking.discarded += 1;
        }
    }

    /// Drops parked tokens older than the park time (their memory, at idle).
    pub(super) fn expire_parked(&mut self) {
        if self.parked.as_ref().is_some_and(|parked| parked.at.elapsed() > self.park_for) {
            self.discard_parked();
            self.publish_cache_status();
        }
    }

    /// After a prefill evaluated all of `fitted`'s prompt (its last token's logits at
    /// `index`): generates up to `n` reply tokens with the request's sampler and parks them.
    /// Stops at the end of the reply, the request's token limit, a request waiting behind, a
    /// client that left, or the logits budget. Returns how many were parked. Nothing is parked
    /// where the drafter would have to follow (speculative decoding) or the cache cannot drop
    /// tokens the request does not take (recurrent state).
    pub(super) fn pregenerate(
        &mut self,
        fitted: &FittedPrompt,
        request: &GenerationRequest,
        mut index: i32,
        n: u32,
        events: &UnboundedSender<Event>,
    ) -> u32 {
        self.discard_parked();
        if n == 0 || self.sequence.speculates() || self.sequence.shape().recurrent {
            return 0;
        }
        let Ok((mut picker, ..)) = self.reply_picker(request, fitted.text.as_deref()) else { return 0 };
        let vocab = self.model.vocab();
        let most = n.min(fitted.limit) as usize;
        let per_token = (self.model.n_vocab().max(1) as usize) * std::mem::size_of::<f32>();
        let most = most.min(MAX_PARKED_LOGIT_BYTES / per_token).max(1);
        let signals = self.signals;
        let mut parked = Parked {
            prompt: fitted.tokens.clone(),
            tokens: Vec::new(),
            logits: Vec::new(),
            ended: false,
            at: Instant::now(),
        };
        while parked.tokens.len() < most {
            // The tests hold the generation here, before its check for a waiting request.
            fail::fail_point!("engine::pregenerate");
            if signals.waiting_generations.load(Ordering::Relaxed) > 0
                || signals.shutting_down.load(Ordering::Relaxed)
                || events.is_closed()
            {
                break;
            }
            let logits = self.sequence.target().get_logits_ith(index).to_vec();
            let Ok(token) = picker.pick(Logits::Saved(&logits)) else { break };
            parked.logits.push(logits);
            parked.tokens.push(token);
            if vocab.is_eog(token) {
                parked.ended = true;
                break;
            }
            match self.sequence.decode(&[token], BatchKind::Generated) {
                Ok(last) => index = last,
                Err(e) => {
                    tracing::warn!("generating ahead failed: {e}");
                    return 0;
                }
            }
        }
        if !parked.ended && !parked.tokens.is_empty() {
            parked.logits.push(self.sequence.target().get_logits_ith(index).to_vec());
        }
        let count = parked.tokens.len() as u32;
        tracing::debug!(tokens = count, ended = parked.ended, "reply tokens parked");
        if count > 0 {
            parked.at = Instant::now();
            self.parked = Some(parked);
            self.parking.parked += 1;
        }
        count
    }
}
