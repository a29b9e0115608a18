//! The summary table printed on stdout: one line per server, then its tool failure and
//! speculative-decoding acceptance.

use super::report::{Spread, Summary};

/// The summary table, as printed on stdout.
#[must_use]
pub fn table(summaries: &[Summary]) -> String {
    let mut out = String::from(
        "server | cold TTFT ms | warm TTFT ms (mean) | warm TTFT ms | warm first sentence ms | tool | decode short tok/s | decode long tok/s | TTFT after interleaved job ms | alternating TTFT ms (× warm) | spoken TTFT ms (× warm) | spoken +1 word TTFT ms (× warm) | preemptive resent TTFT ms (× warm) | barge-in TTFT ms (× warm) | TTFT after restart ms (× warm) | errors | peak RSS MB\n",
    );
    for s in summaries {
        let tool =
            if s.tool_pass() { "PASS".to_string() } else { format!("FAIL {}/{}", s.tool_passes.0, s.tool_passes.1) };
        out.push_str(&format!(
            "{} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {}\n",
            s.server,
            show(s.cold_ttft),
            s.warm_ttft_mean.map_or("-".into(), |w| format!("{w:.1}")),
            show(s.warm_ttft),
            show(s.warm_first_sentence),
            tool,
            show(s.decode_short),
            show(s.decode_long),
            show(s.after_interleave_ttft),
            alternating(s),
            spoken(s.spoken_ttft, s),
            spoken(s.spoken_added_ttft, s),
            times_warm(s.preemptive_ttft, s),
            times_warm(s.barge_in_ttft, s),
            times_warm(s.restart_ttft, s),
            s.errors,
            s.peak_rss_mb.map_or("-".into(), |m| format!("{m:.0}")),
        ));
        if s.spoken_prefills == Some(0) {
            out.push_str(&format!(
                "  {} has no /v1/prefill: its spoken turns were measured without prefills\n",
                s.server
            ));
        }
        if let Some(reason) = &s.tool_failure {
            out.push_str(&format!("  {} tool check: {reason}\n", s.server));
        }
        if let Some((drafted, accepted)) = s.drafts.filter(|&(drafted, _)| drafted > 0) {
            out.push_str(&format!(
                "  {} speculative decoding: {accepted} of {drafted} drafted tokens accepted ({:.0}%)\n",
                s.server,
                100.0 * accepted as f64 / drafted as f64
            ));
        }
    }
    out
}

fn show(value: Option<Spread>) -> String {
    value.map_or("-".to_string(), |s| s.to_string())
}

/// The alternating conversations' TTFT after their first turns, and its median over the warm
/// TTFT's median: near 1 when a second conversation does not cost the first its cache.
fn alternating(s: &Summary) -> String {
    times_warm(s.alternating_ttft, s)
}

/// A spoken turn's TTFT and its ratio to the warm TTFT, and whether the server prefilled.
fn spoken(ttft: Option<Spread>, s: &Summary) -> String {
    let prefills = if s.spoken_prefills == Some(0) { ", no /v1/prefill" } else { "" };
    times_warm(ttft, s) + prefills
}

/// A TTFT and its median over the warm TTFT's median.
fn times_warm(ttft: Option<Spread>, s: &Summary) -> String {
    let ratio = match (ttft, s.warm_ttft) {
        (Some(ttft), Some(warm)) if warm.median > 0.0 => format!(" (×{:.2})", ttft.median / warm.median),
        _ => String::new(),
    };
    show(ttft) + &ratio
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::{summarize, Conversation, Row, Scenario};

    #[test]
    fn alternating_turns_after_the_first_are_compared_with_warm_turns() {
        let row = |scenario, conversation, turn, ttft| Row {
            ttft_ms: Some(ttft),
            conversation,
            ..Row::new("s", 1, scenario, turn)
        };
        let rows = [
            row(Scenario::Warm, None, 2, 100.0),
            row(Scenario::Alternating, Some(Conversation::A), 1, 5000.0),
            row(Scenario::Alternating, Some(Conversation::B), 1, 5000.0),
            row(Scenario::Alternating, Some(Conversation::A), 2, 150.0),
            row(Scenario::Alternating, Some(Conversation::B), 2, 110.0),
        ];
        let summaries = summarize(&rows, &[]);
        let line = table(&summaries).lines().nth(1).map(String::from).unwrap_or_default();
        assert!(line.contains(" | 150.0 (110.0–150.0) (×1.50) | "), "{line}");
    }
}
