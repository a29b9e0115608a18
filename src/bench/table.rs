//! The summary table printed on stdout: one line per server (the text scenarios' columns when
//! they ran, the media scenario's when it ran), then its tool failure, speculative-decoding
//! acceptance and media details.

use super::home::HeadLayout;
use super::media::MediaSummary;
use super::report::{HeadSummary, Spread, Summary};

/// A column of the table: its header and its cell for a server.
struct Column {
    header: &'static str,
    cell: fn(&Summary) -> String,
}

/// The text scenarios' columns.
const TEXT: [Column; 19] = [
    Column { header: "cold TTFT ms", cell: |s| show(s.cold_ttft) },
    Column { header: "warm TTFT ms (mean)", cell: |s| s.warm_ttft_mean.map_or("-".into(), |w| format!("{w:.1}")) },
    Column { header: "warm TTFT ms", cell: |s| show(s.warm_ttft) },
    Column { header: "warm first sentence ms", cell: |s| show(s.warm_first_sentence) },
    Column { header: "tool", cell: tool },
    Column { header: "decode short tok/s", cell: |s| show(s.decode_short) },
    Column { header: "decode long tok/s", cell: |s| show(s.decode_long) },
    Column { header: "TTFT after interleaved job ms", cell: |s| show(s.after_interleave_ttft) },
    Column { header: "alternating TTFT ms (× warm)", cell: alternating },
    Column { header: "spoken TTFT ms (× warm)", cell: |s| spoken(s.spoken_ttft, s) },
    Column { header: "spoken +1 word TTFT ms (× warm)", cell: |s| spoken(s.spoken_added_ttft, s) },
    Column { header: "preemptive resent TTFT ms (× warm)", cell: |s| times_warm(s.preemptive_ttft, s) },
    Column { header: "barge-in TTFT ms (× warm)", cell: |s| times_warm(s.barge_in_ttft, s) },
    Column { header: "TTFT after restart ms (× warm)", cell: |s| times_warm(s.restart_ttft, s) },
    Column { header: "satellites TTFT ms (× warm)", cell: |s| times_warm(s.satellites_ttft, s) },
    Column {
        header: "second request while a reply streams TTFT ms (× alone)",
        cell: |s| times(s.second_while_streaming_ttft, s.second_alone_ttft),
    },
    Column { header: "reply beside it tok/s", cell: |s| show(s.beside_tok_s) },
    Column { header: "shared reply ms (× alone)", cell: |s| times(s.stream_shared_ms, s.stream_alone_ms) },
    Column { header: "errors", cell: |s| s.errors.to_string() },
];

/// The media scenario's columns.
const MEDIA: [Column; 3] = [
    Column {
        header: "transcription WER (mean)",
        cell: |s| match &s.media {
            Some(MediaSummary { wer_mean: Some(wer), .. }) => format!("{wer:.2}"),
            Some(MediaSummary { transcription_refused: true, .. }) => "refused".into(),
            _ => "-".into(),
        },
    },
    Column {
        header: "audio probe",
        cell: |s| s.media.as_ref().and_then(|m| m.audio.as_ref()).map_or("-".into(), |v| v.label().into()),
    },
    Column {
        header: "image probe",
        cell: |s| s.media.as_ref().and_then(|m| m.image.as_ref()).map_or("-".into(), |v| v.label().into()),
    },
];

/// The changed-head scenario's columns: the fixed layout's follow-up turns, then each clock
/// layout's against them.
const QUALITY: [Column; 2] = [
    Column { header: "quality set: answered", cell: |s| format!("{} of {}", s.quality_answers.0, s.quality_answers.1) },
    Column { header: "quality set: TTFT ms", cell: |s| show(s.quality_ttft) },
];

const HEAD: [Column; 8] = [
    Column { header: "fixed head: tokens evaluated", cell: |s| head(s, HeadLayout::Fixed, |h| h.evaluated) },
    Column { header: "fixed head: TTFT ms", cell: |s| head(s, HeadLayout::Fixed, |h| h.ttft) },
    Column {
        header: "unchanged: tokens evaluated (× fixed)",
        cell: |s| head(s, HeadLayout::Unchanged, |h| h.evaluated),
    },
    Column { header: "unchanged: TTFT ms (× fixed)", cell: |s| head(s, HeadLayout::Unchanged, |h| h.ttft) },
    Column {
        header: "clock last: tokens evaluated (× fixed)",
        cell: |s| head(s, HeadLayout::ClockLast, |h| h.evaluated),
    },
    Column { header: "clock last: TTFT ms (× fixed)", cell: |s| head(s, HeadLayout::ClockLast, |h| h.ttft) },
    Column {
        header: "clock first: tokens evaluated (× fixed)",
        cell: |s| head(s, HeadLayout::ClockFirst, |h| h.evaluated),
    },
    Column { header: "clock first: TTFT ms (× fixed)", cell: |s| head(s, HeadLayout::ClockFirst, |h| h.ttft) },
];

/// Peak memory, last.
const RSS: Column = Column { header: "peak RSS MB", cell: |s| s.peak_rss_mb.map_or("-".into(), |m| format!("{m:.0}")) };

/// The summary table, as printed on stdout.
#[must_use]
pub fn table(summaries: &[Summary]) -> String {
    let text = summaries.iter().any(Summary::ran_text);
    let media = summaries.iter().any(|s| s.media.is_some());
    let changed_head = summaries.iter().any(|s| !s.changed_head.is_empty());
    let quality = summaries.iter().any(|s| s.quality_answers.1 > 0);
    let columns: Vec<&Column> = (if text { &TEXT[..] } else { &[] })
        .iter()
        .chain(if media { &MEDIA[..] } else { &[] })
        .chain(if changed_head { &HEAD[..] } else { &[] })
        .chain(if quality { &QUALITY[..] } else { &[] })
        .chain([&RSS])
        .collect();
    let mut out = String::from("server");
    for column in &columns {
        out.push_str(" | ");
        out.push_str(column.header);
    }
    out.push('\n');
    for s in summaries {
        out.push_str(&s.server);
        for column in &columns {
            out.push_str(" | ");
            out.push_str(&(column.cell)(s));
        }
        out.push('\n');
        details(s, &mut out);
    }
    out
}

/// The lines under a server's: what its numbers leave out.
fn details(s: &Summary, out: &mut String) {
    if s.spoken_prefills == Some(0) {
        out.push_str(&format!("  {} has no /v1/prefill: its spoken turns were measured without prefills\n", s.server));
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
    let Some(media) = &s.media else { return };
    if !media.wer.is_empty() {
        let each: Vec<String> = media.wer.iter().map(|w| format!("{w:.2}")).collect();
        out.push_str(&format!("  {} transcription WER per clip: {}\n", s.server, each.join(", ")));
    }
    if let Some(error) = &media.transcription_error {
        out.push_str(&format!("  {} transcription: {error}\n", s.server));
    }
    for (what, verdict) in [("audio", &media.audio), ("image", &media.image)] {
        if let Some(verdict) = verdict {
            out.push_str(&format!("  {} {what} probe: {verdict}\n", s.server));
        }
    }
}

fn tool(s: &Summary) -> String {
    if s.tool_pass() {
        "PASS".to_string()
    } else {
        format!("FAIL {}/{}", s.tool_passes.0, s.tool_passes.1)
    }
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
    times(ttft, s.warm_ttft)
}

/// A layout's follow-up measure in the changed-head scenario, and for a clock layout its median
/// over the fixed layout's.
fn head(s: &Summary, layout: HeadLayout, measure: fn(&HeadSummary) -> Option<Spread>) -> String {
    let of = |layout: HeadLayout| s.changed_head.iter().find(|h| h.layout == layout).and_then(measure);
    match layout {
        HeadLayout::Fixed => show(of(layout)),
        _ => times(of(layout), of(HeadLayout::Fixed)),
    }
}

/// A measure and its median over a reference's median.
fn times(value: Option<Spread>, reference: Option<Spread>) -> String {
    let ratio = match (value, reference) {
        (Some(value), Some(reference)) if reference.median > 0.0 => {
            format!(" (×{:.2})", value.median / reference.median)
        }
        _ => String::new(),
    };
    show(value) + &ratio
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

    #[test]
    fn a_media_only_run_shows_the_media_columns_and_why_a_probe_failed() {
        let row = |scenario, turn, reply: &str| Row {
            http_status: 200,
            reply: Some(reply.into()),
            wer: (scenario == Scenario::Transcription).then_some(1.5),
            ..Row::new("s", 1, scenario, turn)
        };
        let refused = |turn| Row {
            http_status: 400,
            error: "HTTP 400: no pictures".into(),
            ..Row::new("s", 1, Scenario::ProbeImage, turn)
        };
        let rows = [
            row(Scenario::Transcription, 1, "noise"),
            row(Scenario::ProbeAudio, 1, "The same."),
            row(Scenario::ProbeAudio, 2, "The same."),
            refused(1),
            refused(2),
        ];
        let text = table(&summarize(&rows, &[]));
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "server | transcription WER (mean) | audio probe | image probe | peak RSS MB");
        assert_eq!(lines[1], "s | 1.50 | FAILURE | refused | -");
        assert!(
            text.contains(
                "  s audio probe: FAILURE: inputs 1, 2 of 2 (all distinct) got the same answer: \"The same.\"\n"
            ),
            "{text}"
        );
        assert!(text.contains("  s image probe: refused: HTTP 400: no pictures\n"), "{text}");
        assert!(text.contains("  s transcription WER per clip: 1.50\n"), "{text}");
    }

    #[test]
    fn a_changed_head_run_compares_follow_up_turns_with_the_fixed_layout() {
        let row = |scenario, turn, prompt, cached, ttft| Row {
            http_status: 200,
            prompt_tokens: Some(prompt),
            cached_tokens: Some(cached),
            ttft_ms: Some(ttft),
            ..Row::new("s", 1, scenario, turn)
        };
        let rows = [
            row(Scenario::HeadFixed, 1, 2000, 0, 5000.0),
            row(Scenario::HeadFixed, 2, 2040, 2000, 100.0),
            row(Scenario::HeadFixed, 3, 2080, 2040, 120.0),
            row(Scenario::HeadClockLast, 1, 2500, 0, 6000.0),
            row(Scenario::HeadClockLast, 2, 2540, 2480, 180.0),
            row(Scenario::HeadClockLast, 3, 2580, 2520, 200.0),
            row(Scenario::HeadClockFirst, 1, 2500, 0, 6000.0),
            row(Scenario::HeadClockFirst, 2, 2540, 0, 6100.0),
            Row { error: "HTTP 500".into(), ..row(Scenario::HeadClockFirst, 3, 2580, 2580, 1.0) },
        ];
        let text = table(&summarize(&rows, &[]));
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[0],
            "server | fixed head: tokens evaluated | fixed head: TTFT ms | unchanged: tokens evaluated (× fixed) \
             | unchanged: TTFT ms (× fixed) | clock last: tokens evaluated (× fixed) | clock last: TTFT ms (× fixed) | clock first: tokens evaluated (× fixed) | clock first: TTFT ms (× fixed) \
             | peak RSS MB"
        );
        assert_eq!(
            lines[1],
            "s | 40.0 (40.0–40.0) | 120.0 (100.0–120.0) | - | - | 60.0 (60.0–60.0) (×1.50) | 200.0 (180.0–200.0) (×1.67) \
             | 2540.0 (2540.0–2540.0) (×63.50) | 6100.0 (6100.0–6100.0) (×50.83) | -",
            "turn 1 and failed turns left out"
        );
    }
}
