//! The rows' CSV, the summaries, the decision rule and the weighted score.

use super::*;

fn row(server: &str, rep: u32, scenario: Scenario, turn: u32, ttft: f64) -> Row {
    Row { ttft_ms: Some(ttft), http_status: 200, ..Row::new(server, rep, scenario, turn) }
}

fn rows(server: &str, cold: f64, warm: f64, tool_ok: bool) -> Vec<Row> {
    let mut rows = vec![row(server, 1, Scenario::Cold, 1, cold), row(server, 1, Scenario::Warm, 2, warm)];
    for scenario in [Scenario::ToolStream, Scenario::ToolNonStream, Scenario::ToolFollowUp] {
        let mut r = row(server, 1, scenario, 0, 10.0);
        if !tool_ok && scenario == Scenario::ToolStream {
            r.error = "tool call came back as JSON in content".into();
        }
        rows.push(r);
    }
    rows
}

#[test]
fn csv_has_the_documented_columns() {
    let mut out = Vec::new();
    write_csv(&rows("a", 1.0, 2.0, true), &mut out).expect("csv");
    let text = String::from_utf8(out).expect("utf8");
    assert_eq!(
        text.lines().next(),
        Some("server,rep,scenario,turn,ttft_ms,first_sentence_ms,total_ms,prompt_tokens,cached_tokens,completion_tokens,decode_tok_s,draft_n,draft_n_accepted,http_status,error,conversation,cache_source,cache_reason,prefills,cache_save_ms,cache_restore_ms,restarted_peak_rss_mb,adopted_tokens,pause_ms,cancelled_ttft_ms,cut_chars,wer,reply,beside_tok_s")
    );
    assert!(text.contains("a,1,cold,1,1.0,,,,,,,,,200,,,,"), "{text}");
}

#[test]
fn the_tool_check_comes_first_then_warm_ttft() {
    let all = [rows("fast-but-broken", 100.0, 10.0, false), rows("slower", 200.0, 50.0, true)].concat();
    let summaries = summarize(&all, &[]);
    assert!(!summaries[0].tool_pass());
    assert_eq!(summaries[0].tool_failure.as_deref(), Some("ToolStream: tool call came back as JSON in content"));
    assert!(decide(&summaries).expect("decision").starts_with("slower "));
}

#[test]
fn warm_ttft_within_five_percent_is_decided_on_cold_ttft() {
    let all = [rows("a", 900.0, 100.0, true), rows("b", 500.0, 104.0, true), rows("c", 100.0, 200.0, true)].concat();
    let decision = decide(&summarize(&all, &[])).expect("decision");
    assert!(decision.starts_with("b "), "{decision}");
    let clear = [rows("a", 900.0, 100.0, true), rows("b", 500.0, 110.0, true)].concat();
    assert!(decide(&summarize(&clear, &[])).expect("decision").starts_with("a "));
}

#[test]
fn the_reason_given_is_the_step_that_decided() {
    // Only one server passes the tool check: that decides, although its warm TTFT is higher.
    let tool_check = [rows("fast-but-broken", 100.0, 290.0, false), rows("correct", 200.0, 320.0, true)].concat();
    let decision = decide(&summarize(&tool_check, &[])).expect("decision");
    assert_eq!(decision, "correct (the only one of 2 servers that passes the tool check; TTFT did not decide)");
    let alone = decide(&summarize(&rows("solo", 100.0, 320.0, true), &[])).expect("decision");
    assert_eq!(alone, "solo (the only server measured; it passes the tool check)");
    // Several pass and one is more than 5% ahead on warm TTFT: that decides.
    let warm = [rows("a", 900.0, 290.0, true), rows("b", 100.0, 320.0, true), rows("c", 1.0, 10.0, false)].concat();
    let decision = decide(&summarize(&warm, &[])).expect("decision");
    assert_eq!(decision, "a (lowest mean warm TTFT of the 2 servers that pass the tool check: 290 ms vs 320 ms)");
    // Within 5% of each other: cold TTFT decides.
    let cold = [rows("a", 900.0, 300.0, true), rows("b", 500.0, 310.0, true)].concat();
    let decision = decide(&summarize(&cold, &[])).expect("decision");
    assert_eq!(
        decision,
        "b (2 servers that pass the tool check are within 5% of the best mean warm TTFT (300 ms); lowest cold TTFT: 500 ms vs 900 ms)"
    );
}

#[test]
fn no_passing_server_means_no_decision() {
    let none = decide(&summarize(&rows("a", 1.0, 1.0, false), &[])).expect_err("no decision");
    assert_eq!(none.to_string(), "no server passed the tool check; no decision");
}
