//! The voice scenarios: a turn spoken a word at a time with a prefill after every word (P,
//! and its variant whose final transcript adds a word), the preemptive request cancelled and
//! sent again, and the barge-in whose next turn carries the reply cut to what was spoken.

use std::time::Duration;

use serde_json::{json, Value};

use super::client::{prefill, send, send_cancelled, spoken_part, CancelAt};
use super::report::{Row, Scenario};
use super::{base, ServerRun};

/// The spoken scenarios' utterance (19 words: about 7.6 s at 150 words a minute).
const SPOKEN: &str =
    "Could you remind me which of the facts you know mention trains and which of them mention gardens please";

/// The variant's utterance, whose last word the recogniser settles only at the end of the turn.
const SPOKEN_ADDED: &str = "And which of the facts you know mention rivers or harbors or satellites tell me briefly";

/// The preemptive scenario's question.
const PREEMPTIVE: &str = "Which facts mention libraries? Answer in one sentence.";

/// The barge-in scenario's question (a reply of several sentences to interrupt), and what the
/// user says when interrupting.
const INTERRUPTED: &str = "Tell me everything you know about the bakeries, in several sentences.";
const INTERRUPTION: &str = "Sorry, stop there. Which facts mention harbors?";

/// 150 words a minute.
const WORD_TIME: Duration = Duration::from_millis(400);

/// Deltas the preemptive request streams before the client cancels it.
const PREEMPTIVE_DELTAS: u64 = 3;

/// Deltas after which the barge-in's reply is interrupted when its first sentence has not
/// ended yet.
const BARGE_IN_DELTAS: u64 = 12;

/// The partial transcripts a recogniser sends while `utterance` is spoken, one per word: all
/// of it (the final transcript is the last partial one), or, when `final_adds_word`, all but
/// the last word (which the final transcript adds).
pub(super) fn partial_transcripts(utterance: &str, final_adds_word: bool) -> Vec<String> {
    let words: Vec<&str> = utterance.split_whitespace().collect();
    let partials = if final_adds_word { words.len().saturating_sub(1) } else { words.len() };
    (1..=partials).map(|n| words[..n].join(" ")).collect()
}

impl<P: FnMut(&Row)> ServerRun<'_, P> {
    /// The voice scenarios, each the conversation's next turn: P (transcript unchanged since
    /// the last partial), P with a word added, preemptive, barge-in.
    pub(super) async fn voice_scenarios(&mut self, messages: &mut Vec<Value>, first_turn: u32) {
        self.spoken_turn(messages, first_turn, Scenario::Spoken, SPOKEN).await;
        self.spoken_turn(messages, first_turn + 1, Scenario::SpokenAdded, SPOKEN_ADDED).await;
        self.preemptive_turn(messages, first_turn + 2).await;
        self.barge_in(messages, first_turn + 3).await;
    }

    /// P: `utterance` spoken a word at a time (150 words a minute). After every word the
    /// transcript so far goes to `/v1/prefill` (with `pregenerate`), as a speech recogniser's
    /// partial results would (the first call probes: a server that does not answer it gets no
    /// more); the chat request goes after the end-of-turn pause (`--vad-ms`), and its TTFT is
    /// what the user waits for. For [`Scenario::SpokenAdded`] the last word reaches only the
    /// final transcript.
    async fn spoken_turn(&mut self, messages: &mut Vec<Value>, turn: u32, scenario: Scenario, utterance: &str) {
        let words = utterance.split_whitespace().count();
        let partials = partial_transcripts(utterance, scenario == Scenario::SpokenAdded);
        let base = base(&self.target.url).to_string();
        let started = tokio::time::Instant::now();
        let mut supported = None;
        let mut pending = Vec::new();
        for (i, transcript) in partials.iter().enumerate() {
            tokio::time::sleep_until(started + WORD_TIME * (i as u32 + 1)).await;
            if supported == Some(false) {
                continue;
            }
            let mut partial = messages.clone();
            partial.push(json!({"role": "user", "content": transcript}));
            let mut body = self.body(&partial, 1, false);
            body["pregenerate"] = json!(self.config.pregenerate);
            let call = prefill(self.client.clone(), base.clone(), body);
            if supported.is_none() {
                let status = call.await;
                supported = Some(status == Some(200));
            } else {
                // Later calls do not wait: the recogniser goes on while the server works.
                pending.push(tokio::spawn(call));
            }
        }
        // The last word is out, then the pause that ends the turn.
        tokio::time::sleep_until(started + WORD_TIME * words as u32 + self.config.vad).await;
        messages.push(json!({"role": "user", "content": utterance}));
        let body = self.body(messages, self.config.turn_tokens, true);
        let mut row = Row { pause_ms: Some(ms(self.config.vad)), ..self.row(scenario, turn) };
        let reply = send(self.client, &base, &body, &mut row).await;
        let mut answered = u32::from(supported == Some(true));
        for call in pending {
            answered += u32::from(matches!(call.await, Ok(Some(200))));
        }
        row.prefills = Some(answered);
        self.record(row);
        messages.push(json!({"role": "assistant", "content": reply.content}));
    }

    /// Preemptive: the whole chat request sent on the interim transcript as soon as the user
    /// stops, cancelled by the client after its first deltas, and sent again once the
    /// end-of-turn pause confirmed the same transcript; the row is the request sent again.
    async fn preemptive_turn(&mut self, messages: &mut Vec<Value>, turn: u32) {
        let base = base(&self.target.url).to_string();
        messages.push(json!({"role": "user", "content": PREEMPTIVE}));
        let body = self.body(messages, self.config.turn_tokens, true);
        let mut row = Row { pause_ms: Some(ms(self.config.vad)), ..self.row(Scenario::Preemptive, turn) };
        let sent = tokio::time::Instant::now();
        match send_cancelled(self.client, &base, &body, CancelAt::Deltas(PREEMPTIVE_DELTAS)).await {
            Ok((_, ttft)) => row.cancelled_ttft_ms = Some(ttft),
            Err(error) => row.error = format!("the preemptive request: {error}"),
        }
        tokio::time::sleep_until(sent + self.config.vad).await;
        let reply = if row.error.is_empty() {
            send(self.client, &base, &body, &mut row).await
        } else {
            super::client::ServerReply::default()
        };
        self.record(row);
        messages.push(json!({"role": "assistant", "content": reply.content}));
    }

    /// Barge-in: a reply cancelled once its first sentence is out, or after
    /// [`BARGE_IN_DELTAS`] deltas without one (the user interrupted it); the next turn's
    /// history carries the reply cut to that sentence (or to what came), the part spoken. The
    /// row is that next turn.
    async fn barge_in(&mut self, messages: &mut Vec<Value>, turn: u32) {
        let base = base(&self.target.url).to_string();
        messages.push(json!({"role": "user", "content": INTERRUPTED}));
        // Room for a few sentences: the cancel comes after the first.
        let body = self.body(messages, self.config.turn_tokens.max(96), true);
        let mut row = self.row(Scenario::BargeIn, turn);
        let at = CancelAt::FirstSentence { or_deltas: BARGE_IN_DELTAS };
        let spoken = match send_cancelled(self.client, &base, &body, at).await {
            Ok((content, ttft)) => {
                row.cancelled_ttft_ms = Some(ttft);
                spoken_part(&content).to_string()
            }
            Err(error) => {
                row.error = format!("the interrupted reply: {error}");
                String::new()
            }
        };
        row.cut_chars = Some(spoken.chars().count() as u32);
        messages.push(json!({"role": "assistant", "content": spoken}));
        messages.push(json!({"role": "user", "content": INTERRUPTION}));
        let reply = if row.error.is_empty() {
            let body = self.body(messages, self.config.turn_tokens, true);
            send(self.client, &base, &body, &mut row).await
        } else {
            super::client::ServerReply::default()
        };
        self.record(row);
        messages.push(json!({"role": "assistant", "content": reply.content}));
    }
}

fn ms(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1e3
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partial_transcripts_grow_a_word_at_a_time() {
        assert_eq!(partial_transcripts("one two  three", false), ["one", "one two", "one two three"]);
        // The final transcript adds the last word: no partial holds it.
        assert_eq!(partial_transcripts("one two three", true), ["one", "one two"]);
        assert!(partial_transcripts("", true).is_empty());
        assert_eq!(partial_transcripts(SPOKEN, false).last().map(String::as_str), Some(SPOKEN));
        assert_eq!(partial_transcripts(SPOKEN_ADDED, true).len(), SPOKEN_ADDED.split_whitespace().count() - 1);
    }
}
