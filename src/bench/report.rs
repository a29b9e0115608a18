//! Rows, per-server summaries, the decision rule and the optional weighted score.

use std::io::Write;

use serde::Serialize;

use super::error::NoDecision;
use super::home::HeadLayout;
use super::media::{media_summary, MediaSummary};

/// Which measurement a row belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Scenario {
    /// A: the first request of a session with the long system prompt.
    Cold,
    /// B: turns 2.. of the same conversation, history resent.
    Warm,
    /// C: a streamed forced tool call.
    ToolStream,
    /// C: the same, not streamed.
    ToolNonStream,
    /// C: the follow-up with the assistant's calls and a tool result.
    ToolFollowUp,
    /// D: decode speed with a short prompt.
    DecodeShort,
    /// D: decode speed after the long prompt.
    DecodeLong,
    /// E: a summarization with another system prompt, between two turns.
    InterleavedJob,
    /// E: the conversation's next turn after that job.
    AfterInterleave,
    /// F: two conversations with different long system prompts, turns interleaved (A1 B1 A2
    /// B2 …); `turn` is the turn of the row's [`Row::conversation`].
    Alternating,
    /// P: the conversation's next turn spoken a word at a time (150 words a minute); a server
    /// that answers `/v1/prefill` gets the transcript so far after every word; the request is
    /// sent after the end-of-turn pause (its TTFT is what the user waits for). The final
    /// transcript is the last partial one.
    Spoken,
    /// P, the final transcript one word longer than the last partial one (the recogniser
    /// settled the last word only at the end of the turn).
    SpokenAdded,
    /// The request sent on the interim transcript as soon as the user stops, cancelled by the
    /// client (connection dropped) after its first tokens, and sent again after the end-of-turn
    /// pause (LiveKit's preemptive generation): the row is the request sent again.
    Preemptive,
    /// Barge-in: a reply cancelled after its first sentence (or its first 12 deltas, without
    /// one: the user interrupted); the row is the next turn, whose history carries the reply
    /// cut to what was spoken.
    BargeIn,
    /// R: the conversation's next turn after the server was restarted (by the target's
    /// restart command), the last text scenario of a repetition.
    Restart,
    /// T: two satellites (kitchen A, office B), each its own conversation with the same system
    /// prompt and its own area line, turns in alternation A1 B1 A2 B2 …; `turn` is the turn of
    /// the row's [`Row::conversation`].
    Satellites,
    /// T: the office's next command, alone (the reference for [`Scenario::SecondWhileStreaming`]).
    SecondAlone,
    /// T: the kitchen's long reply (`decode_tokens`), alone.
    StreamAlone,
    /// T: the same long reply again, the office's next command sent while it streams;
    /// [`Row::beside_tok_s`] is its decode rate while that command waited for its first token.
    StreamShared,
    /// T: the office's next command (as long as the one alone), sent after the long reply's
    /// 8th delta: what a second speaker waits behind a streaming reply.
    SecondWhileStreaming,
    /// Media: a spoken sentence (espeak-ng) sent as an `input_audio` part with "Transcribe
    /// this audio."; `turn` is the clip (from 1), [`Row::wer`] the answer's word error rate.
    Transcription,
    /// Media, the silent-failure probe: one of the spoken clips asked "Describe this."; `turn`
    /// is the clip. Distinct clips must get distinct answers.
    ProbeAudio,
    /// Media, the silent-failure probe: one of the pictures asked "Describe this."; `turn` is
    /// the picture.
    ProbeImage,
    /// H: a Home Assistant session whose system message never changes; `turn` from 1.
    HeadFixed,
    /// H: the same home with every device's state and the clock at the end of the system
    /// message, both moving between turns.
    HeadClockLast,
    /// H: the clock as the system message's first line, then every device's state.
    HeadClockFirst,
    /// H: the clock-last layout with nothing moving between turns.
    HeadUnchanged,
    /// Q: one item of the quality set (`--quality`), answered for blind grading; `turn` is the
    /// item's position in the set, from 1 (each sample in turn).
    Quality,
}

/// Which of the alternating scenario's two conversations a row belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum Conversation {
    /// The one with the configured system prompt.
    A,
    /// The one with another synthetic system prompt of about the same size.
    B,
}

impl Scenario {
    /// The changed-head scenario's rows of `layout`.
    #[must_use]
    pub fn changed_head(layout: HeadLayout) -> Self {
        match layout {
            HeadLayout::Fixed => Self::HeadFixed,
            HeadLayout::ClockLast => Self::HeadClockLast,
            HeadLayout::ClockFirst => Self::HeadClockFirst,
            HeadLayout::Unchanged => Self::HeadUnchanged,
        }
    }

    /// Whether this is one of C's tool checks (they decide pass or fail, not the error count).
    #[must_use]
    pub fn is_tool(self) -> bool {
        matches!(self, Self::ToolStream | Self::ToolNonStream | Self::ToolFollowUp)
    }

    /// Whether this is one of the media scenario's requests (their failures are verdicts, not
    /// errors).
    #[must_use]
    pub fn is_media(self) -> bool {
        matches!(self, Self::Transcription | Self::ProbeAudio | Self::ProbeImage)
    }

    /// Whether this is one of the changed-head scenario's turns.
    #[must_use]
    pub fn is_changed_head(self) -> bool {
        matches!(self, Self::HeadFixed | Self::HeadClockLast | Self::HeadClockFirst | Self::HeadUnchanged)
    }

    /// Whether this is a turn of the conversation (A, B, the turn after E's job, or after R's
    /// restart).
    #[must_use]
    pub fn is_conversation_turn(self) -> bool {
        matches!(self, Self::Cold | Self::Warm | Self::AfterInterleave | Self::Restart)
    }
}

/// One request's measurements: one CSV row.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Row {
    /// Server name.
    pub server: String,
    /// Repetition, from 1.
    pub rep: u32,
    /// Scenario.
    pub scenario: Scenario,
    /// Conversation turn (1 = cold), 0 where not a turn.
    pub turn: u32,
    /// Request sent → first delta with content or tool calls.
    pub ttft_ms: Option<f64>,
    /// Request sent → the first sentence is complete (`.`, `!` or `?` then space or end).
    pub first_sentence_ms: Option<f64>,
    /// Request sent → response complete.
    pub total_ms: Option<f64>,
    /// From the server's usage, when reported.
    pub prompt_tokens: Option<u64>,
    /// From `usage.prompt_tokens_details.cached_tokens`, when reported.
    pub cached_tokens: Option<u64>,
    /// From usage, or counted deltas.
    pub completion_tokens: Option<u64>,
    /// Generated tokens per second after the first.
    pub decode_tok_s: Option<f64>,
    /// Tokens drafted by speculative decoding, from llama-server-style `timings.draft_n`.
    pub draft_n: Option<u64>,
    /// Of these, accepted (`timings.draft_n_accepted`).
    pub draft_n_accepted: Option<u64>,
    /// HTTP status (0: no answer).
    pub http_status: u16,
    /// Why the request failed or the check did not pass; empty when fine.
    pub error: String,
    /// The alternating scenario's conversation; empty in other scenarios.
    pub conversation: Option<Conversation>,
    /// Where the server took the prompt's cache from (`timings.cache.source`), when reported.
    pub cache_source: Option<String>,
    /// Why (`timings.cache.reason`), when reported.
    pub cache_reason: Option<String>,
    /// The spoken scenario: prefills of the partial transcript the server answered (0: it
    /// has no `/v1/prefill`); empty in other scenarios.
    pub prefills: Option<u32>,
    /// Time the server spent saving its live state for this request (`timings.cache.save_ms`).
    pub cache_save_ms: Option<f64>,
    /// Time it spent restoring a stored state (`timings.cache.restore_ms`).
    pub cache_restore_ms: Option<f64>,
    /// The restart scenario: the peak memory of the process that was restarted (VmHWM, MB),
    /// read just before the restart; empty in other scenarios.
    pub restarted_peak_rss_mb: Option<f64>,
    /// Reply tokens the server had generated ahead and this request adopted
    /// (`timings.cache.adopted`), when reported.
    pub adopted_tokens: Option<u64>,
    /// The spoken and preemptive scenarios: the end-of-turn pause before the request, ms.
    pub pause_ms: Option<f64>,
    /// The preemptive and barge-in scenarios: TTFT of the request that was cancelled.
    pub cancelled_ttft_ms: Option<f64>,
    /// The barge-in scenario: characters of the cancelled reply kept in the history (what was
    /// spoken).
    pub cut_chars: Option<u32>,
    /// The transcription scenario: the answer's word error rate against the sentence spoken.
    pub wer: Option<f64>,
    /// The media scenario: the answer's text.
    pub reply: Option<String>,
    /// The together scenario's shared long reply: its deltas a second while the second request
    /// waited for its first token.
    pub beside_tok_s: Option<f64>,
}

impl Row {
    /// A row for `server`/`rep`/`scenario`/`turn` with nothing measured yet.
    #[must_use]
    pub fn new(server: &str, rep: u32, scenario: Scenario, turn: u32) -> Self {
        Self {
            server: server.to_string(),
            rep,
            scenario,
            turn,
            ttft_ms: None,
            first_sentence_ms: None,
            total_ms: None,
            prompt_tokens: None,
            cached_tokens: None,
            completion_tokens: None,
            decode_tok_s: None,
            draft_n: None,
            draft_n_accepted: None,
            http_status: 0,
            error: String::new(),
            conversation: None,
            cache_source: None,
            cache_reason: None,
            prefills: None,
            cache_save_ms: None,
            cache_restore_ms: None,
            restarted_peak_rss_mb: None,
            adopted_tokens: None,
            pause_ms: None,
            cancelled_ttft_ms: None,
            cut_chars: None,
            wer: None,
            reply: None,
            beside_tok_s: None,
        }
    }

    fn ok(&self) -> bool {
        self.error.is_empty()
    }

    /// The prompt tokens the server evaluated: `prompt_tokens` less `cached_tokens`, where it
    /// reported both.
    #[must_use]
    pub fn evaluated_tokens(&self) -> Option<u64> {
        Some(self.prompt_tokens?.saturating_sub(self.cached_tokens?))
    }
}

/// Writes the rows as CSV (header first).
///
/// # Errors
/// Writing failed.
pub fn write_csv(rows: &[Row], out: impl Write) -> Result<(), csv::Error> {
    let mut writer = csv::Writer::from_writer(out);
    for row in rows {
        writer.serialize(row)?;
    }
    writer.flush()?;
    Ok(())
}

/// Median and range of some values.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Spread {
    /// The median (upper median for even counts).
    pub median: f64,
    /// Smallest value.
    pub min: f64,
    /// Largest value.
    pub max: f64,
}

impl Spread {
    fn of(values: &[f64]) -> Option<Self> {
        let mut sorted: Vec<f64> = values.iter().copied().filter(|v| v.is_finite()).collect();
        sorted.sort_by(f64::total_cmp);
        Some(Self { median: *sorted.get(sorted.len() / 2)?, min: *sorted.first()?, max: *sorted.last()? })
    }
}

impl std::fmt::Display for Spread {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:.1} ({:.1}–{:.1})", self.median, self.min, self.max)
    }
}

/// One server's results over all repetitions.
#[derive(Clone, Debug, PartialEq)]
pub struct Summary {
    /// Server name.
    pub server: String,
    /// Cold TTFT, ms.
    pub cold_ttft: Option<Spread>,
    /// Mean warm TTFT (turns 2..), ms: the decision's main criterion.
    pub warm_ttft_mean: Option<f64>,
    /// Warm TTFT over all warm turns, ms.
    pub warm_ttft: Option<Spread>,
    /// Time to the first sentence on warm turns, ms.
    pub warm_first_sentence: Option<Spread>,
    /// Repetitions whose three tool checks all passed, of all repetitions.
    pub tool_passes: (u32, u32),
    /// The first tool failure's reason, if any.
    pub tool_failure: Option<String>,
    /// Decode tok/s with a short prompt.
    pub decode_short: Option<Spread>,
    /// Decode tok/s after the long prompt.
    pub decode_long: Option<Spread>,
    /// TTFT of the turn after an interleaved job, ms.
    pub after_interleave_ttft: Option<Spread>,
    /// TTFT of the alternating conversations' turns after their first, ms.
    pub alternating_ttft: Option<Spread>,
    /// TTFT of the spoken turn (prefilled while "speaking" where the server can).
    pub spoken_ttft: Option<Spread>,
    /// Prefills the server answered in the spoken turns (0: it has no `/v1/prefill`).
    pub spoken_prefills: Option<u32>,
    /// TTFT of the spoken turn whose final transcript added a word, ms.
    pub spoken_added_ttft: Option<Spread>,
    /// TTFT of the preemptive request sent again after its cancel, ms.
    pub preemptive_ttft: Option<Spread>,
    /// TTFT of the turn after a barge-in, ms.
    pub barge_in_ttft: Option<Spread>,
    /// TTFT of the turn after a restart, ms.
    pub restart_ttft: Option<Spread>,
    /// TTFT of the satellites' turns after their first, ms.
    pub satellites_ttft: Option<Spread>,
    /// TTFT of the office's command alone, ms.
    pub second_alone_ttft: Option<Spread>,
    /// TTFT of the office's command sent while the kitchen's reply streams, ms.
    pub second_while_streaming_ttft: Option<Spread>,
    /// The kitchen's long reply alone, request to its end, ms.
    pub stream_alone_ms: Option<Spread>,
    /// The same reply with the office's command sent while it streams, ms.
    pub stream_shared_ms: Option<Spread>,
    /// The shared reply's deltas a second while the command waited for its first token.
    pub beside_tok_s: Option<Spread>,
    /// Requests that failed (HTTP or protocol errors, not tool-check failures).
    pub errors: usize,
    /// Peak resident memory (VmHWM), MB, when a PID was given.
    pub peak_rss_mb: Option<f64>,
    /// Speculative decoding over all answers that reported it: (drafted, accepted).
    pub drafts: Option<(u64, u64)>,
    /// The media scenario's results, when it ran.
    pub media: Option<MediaSummary>,
    /// The changed-head scenario's follow-up turns per layout, when it ran (fixed first).
    pub changed_head: Vec<HeadSummary>,
    /// The quality set's answers that came, of those asked (none asked: it did not run).
    pub quality_answers: (u32, u32),
    /// Their time to first token, ms.
    pub quality_ttft: Option<Spread>,
}

/// One layout's follow-up turns (2..) in the changed-head scenario.
#[derive(Clone, Debug, PartialEq)]
pub struct HeadSummary {
    /// The layout.
    pub layout: HeadLayout,
    /// Prompt tokens evaluated per turn.
    pub evaluated: Option<Spread>,
    /// TTFT, ms.
    pub ttft: Option<Spread>,
}

impl Summary {
    /// Whether every repetition's tool checks passed.
    #[must_use]
    pub fn tool_pass(&self) -> bool {
        self.tool_passes.1 > 0 && self.tool_passes.0 == self.tool_passes.1
    }

    /// Whether the text scenarios ran (every repetition of them holds the tool check).
    #[must_use]
    pub fn ran_text(&self) -> bool {
        self.tool_passes.1 > 0
    }
}

/// Summarizes the rows of each server, in the order servers first appear.
#[must_use]
pub fn summarize(rows: &[Row], peak_rss_mb: &[(String, f64)]) -> Vec<Summary> {
    let mut servers: Vec<&str> = Vec::new();
    for row in rows {
        if !servers.contains(&row.server.as_str()) {
            servers.push(&row.server);
        }
    }
    servers
        .into_iter()
        .map(|server| {
            let mine: Vec<&Row> = rows.iter().filter(|r| r.server == server).collect();
            let values = |scenario: Scenario, field: fn(&Row) -> Option<f64>| -> Vec<f64> {
                mine.iter().filter(|r| r.scenario == scenario && r.ok()).filter_map(|r| field(r)).collect()
            };
            let warm = values(Scenario::Warm, |r| r.ttft_ms);
            let reps: Vec<u32> = {
                let mut reps: Vec<u32> = (mine.iter())
                    .filter(|r| {
                        !r.scenario.is_media() && !r.scenario.is_changed_head() && r.scenario != Scenario::Quality
                    })
                    .map(|r| r.rep)
                    .collect();
                reps.dedup();
                reps
            };
            let tool_rows = |rep: u32| mine.iter().filter(move |r| r.rep == rep && r.scenario.is_tool());
            let passed =
                reps.iter().filter(|&&rep| tool_rows(rep).count() == 3 && tool_rows(rep).all(|r| r.ok())).count();
            let tool_failure =
                mine.iter().find(|r| r.scenario.is_tool() && !r.ok()).map(|r| format!("{:?}: {}", r.scenario, r.error));
            Summary {
                server: server.to_string(),
                cold_ttft: Spread::of(&values(Scenario::Cold, |r| r.ttft_ms)),
                warm_ttft_mean: (!warm.is_empty()).then(|| warm.iter().sum::<f64>() / warm.len() as f64),
                warm_ttft: Spread::of(&warm),
                warm_first_sentence: Spread::of(&values(Scenario::Warm, |r| r.first_sentence_ms)),
                tool_passes: (passed as u32, reps.len() as u32),
                tool_failure,
                decode_short: Spread::of(&values(Scenario::DecodeShort, |r| r.decode_tok_s)),
                decode_long: Spread::of(&values(Scenario::DecodeLong, |r| r.decode_tok_s)),
                after_interleave_ttft: Spread::of(&values(Scenario::AfterInterleave, |r| r.ttft_ms)),
                alternating_ttft: Spread::of(&values(Scenario::Alternating, |r| r.ttft_ms.filter(|_| r.turn > 1))),
                spoken_ttft: Spread::of(&values(Scenario::Spoken, |r| r.ttft_ms)),
                spoken_prefills: mine.iter().filter_map(|r| r.prefills).reduce(|a, b| a + b),
                spoken_added_ttft: Spread::of(&values(Scenario::SpokenAdded, |r| r.ttft_ms)),
                preemptive_ttft: Spread::of(&values(Scenario::Preemptive, |r| r.ttft_ms)),
                barge_in_ttft: Spread::of(&values(Scenario::BargeIn, |r| r.ttft_ms)),
                restart_ttft: Spread::of(&values(Scenario::Restart, |r| r.ttft_ms)),
                satellites_ttft: Spread::of(&values(Scenario::Satellites, |r| r.ttft_ms.filter(|_| r.turn > 1))),
                second_alone_ttft: Spread::of(&values(Scenario::SecondAlone, |r| r.ttft_ms)),
                second_while_streaming_ttft: Spread::of(&values(Scenario::SecondWhileStreaming, |r| r.ttft_ms)),
                stream_alone_ms: Spread::of(&values(Scenario::StreamAlone, |r| r.total_ms)),
                stream_shared_ms: Spread::of(&values(Scenario::StreamShared, |r| r.total_ms)),
                beside_tok_s: Spread::of(&values(Scenario::StreamShared, |r| r.beside_tok_s)),
                errors: mine.iter().filter(|r| !r.ok() && !r.scenario.is_tool() && !r.scenario.is_media()).count(),
                // A restarted process's peak, read before its restart, counts too.
                peak_rss_mb: peak_rss_mb
                    .iter()
                    .filter(|(name, _)| name == server)
                    .map(|(_, mb)| *mb)
                    .chain(mine.iter().filter_map(|r| r.restarted_peak_rss_mb))
                    .reduce(f64::max),
                drafts: mine.iter().filter(|r| r.ok()).fold(None, |total, r| match (r.draft_n, r.draft_n_accepted) {
                    (Some(drafted), Some(accepted)) => {
                        let (d, a) = total.unwrap_or((0, 0));
                        Some((d + drafted, a + accepted))
                    }
                    _ => total,
                }),
                media: media_summary(&mine),
                changed_head: head_summaries(&mine),
                quality_answers: {
                    let asked = mine.iter().filter(|r| r.scenario == Scenario::Quality);
                    (asked.clone().filter(|r| r.ok()).count() as u32, asked.count() as u32)
                },
                quality_ttft: Spread::of(&values(Scenario::Quality, |r| r.ttft_ms)),
            }
        })
        .collect()
}

/// The changed-head scenario's layouts that have rows, over their turns after the first.
fn head_summaries(rows: &[&Row]) -> Vec<HeadSummary> {
    HeadLayout::ALL
        .into_iter()
        .filter_map(|layout| {
            let scenario = Scenario::changed_head(layout);
            let follow_ups: Vec<&Row> =
                rows.iter().copied().filter(|r| r.scenario == scenario && r.turn > 1 && r.ok()).collect();
            let ran = rows.iter().any(|r| r.scenario == scenario);
            ran.then(|| HeadSummary {
                layout,
                evaluated: Spread::of(
                    &follow_ups.iter().filter_map(|r| r.evaluated_tokens()).map(|n| n as f64).collect::<Vec<_>>(),
                ),
                ttft: Spread::of(&follow_ups.iter().filter_map(|r| r.ttft_ms).collect::<Vec<_>>()),
            })
        })
        .collect()
}

/// The decision rule: a server must pass the tool check; among those, the lowest mean warm
/// TTFT wins; servers within 5% of it are tie-broken on cold TTFT. The reason given is the
/// step that decided: the tool check alone when only one server passed it (whatever the
/// others' TTFT), warm TTFT when one passing server is clearly ahead, cold TTFT otherwise.
///
/// # Errors
/// [`NoDecision`]: no server passed the tool check.
pub fn decide(summaries: &[Summary]) -> Result<String, NoDecision> {
    let passing: Vec<&Summary> = summaries.iter().filter(|s| s.tool_pass() && s.warm_ttft_mean.is_some()).collect();
    let warm = |s: &Summary| s.warm_ttft_mean.unwrap_or(f64::INFINITY);
    let best_warm = passing.iter().map(|s| warm(s)).min_by(f64::total_cmp).ok_or(NoDecision)?;
    let (close, behind): (Vec<&Summary>, Vec<&Summary>) = passing.iter().partition(|s| warm(s) <= best_warm * 1.05);
    let cold = |s: &Summary| s.cold_ttft.map_or(f64::INFINITY, |c| c.median);
    let winner = close.iter().copied().min_by(|a, b| cold(a).total_cmp(&cold(b))).ok_or(NoDecision)?;
    let ms = |value: f64| if value.is_finite() { format!("{value:.0} ms") } else { "not measured".to_string() };
    let why = if passing.len() == 1 {
        if summaries.len() == 1 {
            "the only server measured; it passes the tool check".to_string()
        } else {
            format!("the only one of {} servers that passes the tool check; TTFT did not decide", summaries.len())
        }
    } else if close.len() == 1 {
        let next = behind.iter().map(|s| warm(s)).min_by(f64::total_cmp).unwrap_or(f64::INFINITY);
        format!(
            "lowest mean warm TTFT of the {} servers that pass the tool check: {} vs {}",
            passing.len(),
            ms(best_warm),
            ms(next)
        )
    } else {
        let runner_up = close.iter().filter(|s| s.server != winner.server).map(|s| cold(s)).min_by(f64::total_cmp);
        format!(
            "{} servers that pass the tool check are within 5% of the best mean warm TTFT ({}); lowest cold TTFT: {} vs {}",
            close.len(),
            ms(best_warm),
            ms(cold(winner)),
            ms(runner_up.unwrap_or(f64::INFINITY))
        )
    };
    Ok(format!("{} ({why})", winner.server))
}

#[cfg(test)]
mod tests;
