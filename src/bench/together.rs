//! T, the together scenario: two satellites of one home (kitchen and office), each its own
//! conversation with the same system prompt and its own area line. They speak in turn first;
//! then the office's command is measured alone, the kitchen's long reply alone, and both again
//! at once: the office's next command sent while the kitchen's reply streams. What a second
//! request waits behind a streaming reply, and what the reply loses meanwhile.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::client::{send, send_watched};
use super::report::{Conversation, Row, Scenario};
use super::ServerRun;

/// The streaming reply's deltas before the second request is sent: it streams by then.
const STREAMING_AFTER_DELTAS: u64 = 8;

/// The office's two commands: one measured alone, one while the kitchen's reply streams (as
/// long as each other in words, so both evaluate about as many tokens).
const COMMANDS: [&str; 2] = ["Turn on the office light.", "Turn off the office light."];

/// The kitchen's request for a long reply.
const LONG_REQUEST: &str = "Tell me a long story about a kitchen robot who learns to cook.";

impl<P: FnMut(&Row)> ServerRun<'_, P> {
    /// T: the satellites' turns in alternation, the office's command alone, the kitchen's long
    /// reply alone, then the two at once.
    pub(super) async fn together_scenario(&mut self) {
        let shared = self.nonce("Satellites. ") + &self.config.system_prompt;
        let system =
            |area: &str| json!({"role": "system", "content": format!("{shared}You answer the {area} satellite.\n")});
        let mut satellites = [(Conversation::A, vec![system("kitchen")]), (Conversation::B, vec![system("office")])];
        for turn in 1..=self.config.turns {
            for (conversation, messages) in &mut satellites {
                let row = Row { conversation: Some(*conversation), ..self.row(Scenario::Satellites, turn) };
                self.turn(messages, row).await;
            }
        }
        let [(_, kitchen), (_, mut office)] = satellites;

        office.push(json!({"role": "user", "content": COMMANDS[0]}));
        let body = self.body(&office, self.config.turn_tokens, true);
        let reply = self.request(self.row(Scenario::SecondAlone, 0), body).await;
        office.push(json!({"role": "assistant", "content": reply.content}));
        office.push(json!({"role": "user", "content": COMMANDS[1]}));

        let mut long = kitchen;
        long.push(json!({"role": "user", "content": LONG_REQUEST}));
        let long = self.body(&long, self.config.decode_tokens, true);
        self.request(self.row(Scenario::StreamAlone, 0), long.clone()).await;

        let command = self.body(&office, self.config.turn_tokens, true);
        let (streamed, second) = self.at_once(&long, &command).await;
        self.record(streamed);
        self.record(second);
    }

    /// Sends `long`, and `second` once `long` streams; their rows, `long`'s with its decode
    /// rate while `second` waited for its first token.
    async fn at_once(&self, long: &Value, second: &Value) -> (Row, Row) {
        let base = super::base(&self.target.url);
        let (progress, mut deltas) = tokio::sync::watch::channel(0u64);
        let mut streamed = self.row(Scenario::StreamShared, 0);
        let mut row = self.row(Scenario::SecondWhileStreaming, 0);
        let start = Instant::now();
        let first = send_watched(self.client, base, long, &mut streamed, Some(progress));
        let then = async {
            // The sender is dropped when the long reply ends: the second request goes then at
            // the latest, and says it did not find the reply streaming.
            let ended = deltas.wait_for(|&n| n >= STREAMING_AFTER_DELTAS).await.is_err();
            let sent = start.elapsed();
            let reply = send(self.client, base, second, &mut row).await;
            if ended && row.error.is_empty() {
                row.error = format!("the long reply ended before its {STREAMING_AFTER_DELTAS}th delta");
            }
            (sent, reply)
        };
        let (long_reply, (sent, _)) = tokio::join!(first, then);
        if let Some(ttft) = row.ttft_ms {
            let waited = (sent, sent + Duration::from_secs_f64(ttft / 1e3));
            streamed.beside_tok_s = rate_within(&long_reply.delta_at, waited);
        }
        (streamed, row)
    }
}

/// Deltas a second within `window` (since the request), counted from the last delta before it
/// to the last one inside, so a window between two deltas reads as no progress: none when
/// none came before it.
fn rate_within(delta_at: &[Duration], window: (Duration, Duration)) -> Option<f64> {
    let (from, to) = window;
    let before = delta_at.iter().rposition(|&at| at <= from)?;
    let inside = delta_at.iter().filter(|&&at| at > from && at <= to).count();
    let span = to.saturating_sub(delta_at[before]).as_secs_f64();
    (span > 0.0).then(|| inside as f64 / span)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(values: &[u64]) -> Vec<Duration> {
        values.iter().map(|&v| Duration::from_millis(v)).collect()
    }

    #[test]
    fn the_rate_counts_the_deltas_inside_the_window() {
        // Every 10 ms; the window 45–95 ms holds 50, 60, 70, 80, 90: five in 55 ms from 40.
        let deltas = ms(&[0, 10, 20, 30, 40, 50, 60, 70, 80, 90, 100]);
        let rate = rate_within(&deltas, (Duration::from_millis(45), Duration::from_millis(95))).expect("a rate");
        assert!((rate - 5.0 / 0.055).abs() < 1e-6, "{rate}");
    }

    #[test]
    fn a_reply_stalled_through_the_window_has_no_rate_but_zero() {
        let deltas = ms(&[0, 10, 20, 900]);
        let rate = rate_within(&deltas, (Duration::from_millis(25), Duration::from_millis(800)));
        assert_eq!(rate, Some(0.0));
    }

    #[test]
    fn a_window_before_any_delta_has_no_rate() {
        assert_eq!(rate_within(&ms(&[100, 110]), (Duration::from_millis(5), Duration::from_millis(50))), None);
    }
}
