//! `firstword bench` against a live firstword on the real model (every scenario measured, tool
//! check PASS, the alternating conversations' later turns served from the state store) and against a mock server that answers wrongly (FAIL with the reason, errors
//! counted, no crash); the media scenario against firstword with the tiny projectors (clips
//! spoken by espeak-ng transcribed with a word error rate, media a projector does not take
//! refused, the degenerate projector's refusal reported as "refused", not a pass) and against
//! mock servers that answer every input alike (the probe's FAILURE) or each differently (PASS).

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use common::media::{audio_projector, degenerate_projector, vision_projector};
use common::{exclusive_server, smollm2_path, spawn_server, test_config};
use firstword::bench::{
    decide, run, summarize, table, BenchConfig, Conversation, ProbeVerdict, Row, Scenario, Scenarios, Summary, Target,
};
use firstword::{Engine, EngineConfig};
use serde_json::{json, Value};

fn config(url: String, name: &str) -> BenchConfig {
    BenchConfig {
        targets: vec![Target { name: name.into(), url, pid: None, restart: None, serve: None }],
        system_prompt: firstword::bench::synthetic_system_prompt(300),
        turns: 3,
        reps: 1,
        model: "default".into(),
        turn_tokens: 16,
        decode_tokens: 32,
        timeout: Duration::from_secs(300),
        vad: BenchConfig::DEFAULT_VAD,
        pregenerate: BenchConfig::DEFAULT_PREGENERATE,
        busy_cores: 0,
        scenarios: Scenarios::Text,
        home_entities: BenchConfig::DEFAULT_HOME_ENTITIES,
        quality: None,
    }
}

fn scenario_rows(rows: &[Row], scenario: Scenario) -> Vec<&Row> {
    rows.iter().filter(|r| r.scenario == scenario).collect()
}

/// The alternating scenario's rows: A1 B1 A2 B2 … for the configured turns.
fn assert_alternating_order(rows: &[Row], turns: u32) {
    let order: Vec<(Option<Conversation>, u32)> =
        scenario_rows(rows, Scenario::Alternating).iter().map(|r| (r.conversation, r.turn)).collect();
    let expected: Vec<(Option<Conversation>, u32)> =
        (1..=turns).flat_map(|turn| [(Some(Conversation::A), turn), (Some(Conversation::B), turn)]).collect();
    assert_eq!(order, expected);
}

#[tokio::test]
async fn every_scenario_measures_firstword_and_the_tool_check_passes() {
    let (_guard, server) = exclusive_server().await;
    let mut firstword = config(format!("{}/v1", server.base), "firstword");
    // A restart command that restarts nothing: scenario R still waits for /health and measures.
    firstword.targets[0].restart = Some("echo no restart here".into());
    let rows = run(&firstword, |_| {}).await.expect("bench runs");
    for scenario in [
        Scenario::Cold,
        Scenario::Warm,
        Scenario::ToolStream,
        Scenario::ToolNonStream,
        Scenario::ToolFollowUp,
        Scenario::DecodeShort,
        Scenario::DecodeLong,
        Scenario::InterleavedJob,
        Scenario::AfterInterleave,
        Scenario::Alternating,
        Scenario::Spoken,
        Scenario::SpokenAdded,
        Scenario::Preemptive,
        Scenario::BargeIn,
        Scenario::Restart,
        Scenario::Satellites,
        Scenario::SecondAlone,
        Scenario::StreamAlone,
        Scenario::StreamShared,
        Scenario::SecondWhileStreaming,
    ] {
        let found = scenario_rows(&rows, scenario);
        assert!(!found.is_empty(), "no {scenario:?} row");
        for row in found {
            assert_eq!(row.error, "", "{row:?}");
            assert_eq!(row.http_status, 200, "{row:?}");
            assert!(row.ttft_ms.is_some_and(|t| t > 0.0), "{row:?}");
        }
    }
    assert_eq!(scenario_rows(&rows, Scenario::Warm).len(), 2);
    let warm = scenario_rows(&rows, Scenario::Warm);
    assert!(warm.iter().all(|r| r.cached_tokens.unwrap_or(0) > 300), "warm turns are served from the cache: {warm:?}");
    assert!(scenario_rows(&rows, Scenario::DecodeShort)[0].decode_tok_s.is_some_and(|d| d > 0.0));
    assert_alternating_order(&rows, 3);
    let later: Vec<&Row> = scenario_rows(&rows, Scenario::Alternating).into_iter().filter(|r| r.turn > 1).collect();
    let cached: Vec<_> = later.iter().map(|r| (r.conversation, r.turn, r.cached_tokens, r.ttft_ms)).collect();
    assert!(
        later.iter().all(|r| r.cached_tokens.unwrap_or(0) > 300),
        "the state store keeps the other conversation: {cached:?}"
    );
    // The spoken turn was prefilled while "spoken": the request evaluated only its last words.
    let spoken = scenario_rows(&rows, Scenario::Spoken)[0];
    assert!(spoken.prefills.is_some_and(|n| n >= 4), "{spoken:?}");
    let evaluated = spoken.prompt_tokens.unwrap_or(0) - spoken.cached_tokens.unwrap_or(0);
    assert!(evaluated <= 16, "the spoken turn evaluated {evaluated} tokens: {spoken:?}");
    assert_eq!(spoken.pause_ms, Some(500.0), "{spoken:?}");
    // The variant's final transcript adds a word no partial had: prefills came all the same.
    let added = scenario_rows(&rows, Scenario::SpokenAdded)[0];
    assert!(added.prefills.is_some_and(|n| n >= 4), "{added:?}");
    // The preemptive request was cancelled after its first deltas; sent again, it found its
    // prompt in the cache.
    let preemptive = scenario_rows(&rows, Scenario::Preemptive)[0];
    assert!(preemptive.cancelled_ttft_ms.is_some_and(|t| t > 0.0), "{preemptive:?}");
    assert!(preemptive.cached_tokens.unwrap_or(0) > 300, "{preemptive:?}");
    // The barge-in's next turn carries the reply cut to its first sentence, and reuses the
    // conversation before it.
    let barge_in = scenario_rows(&rows, Scenario::BargeIn)[0];
    assert!(barge_in.cut_chars.is_some_and(|n| n > 0), "{barge_in:?}");
    assert!(barge_in.cancelled_ttft_ms.is_some(), "{barge_in:?}");
    assert!(barge_in.cached_tokens.unwrap_or(0) > 300, "{barge_in:?}");
    let summaries = summarize(&rows, &[]);
    assert!(summaries[0].tool_pass(), "{:?}", summaries[0].tool_failure);
    assert!(summaries[0].spoken_ttft.is_some(), "{:?}", summaries[0]);
    assert!(summaries[0].alternating_ttft.is_some(), "{:?}", summaries[0]);
    assert!(summaries[0].restart_ttft.is_some(), "{:?}", summaries[0]);
    for ttft in [summaries[0].spoken_added_ttft, summaries[0].preemptive_ttft, summaries[0].barge_in_ttft] {
        assert!(ttft.is_some(), "{:?}", summaries[0]);
    }
    assert!(table(&summaries).contains("barge-in TTFT ms (× warm)"));
    assert!(table(&summaries).contains("TTFT after restart ms (× warm)"));
    // T: the satellites share their system prompt, so each one's later turns are warm; the
    // second command was sent while the long reply streamed (no error says it had ended).
    let satellites: Vec<&Row> = scenario_rows(&rows, Scenario::Satellites).into_iter().filter(|r| r.turn > 1).collect();
    assert_eq!(satellites.len(), 4, "{satellites:?}");
    assert!(satellites.iter().all(|r| r.cached_tokens.unwrap_or(0) > 300), "{satellites:?}");
    let shared = scenario_rows(&rows, Scenario::StreamShared)[0];
    assert!(shared.beside_tok_s.is_some(), "{shared:?}");
    assert!(shared.completion_tokens.is_some_and(|n| n > 8), "{shared:?}");
    for ttft in [summaries[0].second_alone_ttft, summaries[0].second_while_streaming_ttft, summaries[0].satellites_ttft]
    {
        assert!(ttft.is_some(), "{:?}", summaries[0]);
    }
    assert!(table(&summaries).contains("second request while a reply streams TTFT ms (× alone)"));
    // R is the conversation's next turn: it continues the conversation.
    let restart = scenario_rows(&rows, Scenario::Restart)[0];
    assert!(restart.cached_tokens.unwrap_or(0) > 300, "{restart:?}");
    assert!(decide(&summaries).expect("a decision").starts_with("firstword"));
}

/// H against a firstword that reuses past changed spans: every turn answered, the fixed and
/// unchanged layouts' follow-ups warm, the clock layouts' follow-ups reused past the clock and
/// the changed states (most of the prompt kept), and the table compares them with the fixed
/// layout.
#[tokio::test]
async fn the_changed_head_scenario_measures_each_layout() {
    let engine =
        Engine::start(EngineConfig { reuse_after_change: true, ..test_config(smollm2_path()) }).expect("loads");
    let server = spawn_server(engine);
    let mut config = config(server.base.clone(), "firstword");
    config.scenarios = Scenarios::ChangedHead;
    config.home_entities = 24;
    let rows = run(&config, |_| {}).await.expect("bench runs");
    assert_eq!(rows.len(), 12, "four layouts of three turns, nothing else: {rows:?}");
    for row in &rows {
        assert_eq!((row.http_status, row.error.as_str()), (200, ""), "{row:?}");
        if row.turn == 1 {
            continue;
        }
        let (prompt, evaluated) = (row.prompt_tokens.unwrap_or(0), row.evaluated_tokens().unwrap_or(u64::MAX));
        assert!(prompt > 400 && evaluated * 4 < prompt, "most of the prompt kept: {row:?}");
        let reason = row.cache_reason.as_deref();
        match row.scenario {
            Scenario::HeadFixed | Scenario::HeadUnchanged => {
                assert_ne!(reason, Some("reused-after-change"), "{row:?}");
            }
            _ => assert_eq!(reason, Some("reused-after-change"), "{row:?}"),
        }
    }
    let summaries = summarize(&rows, &[]);
    assert_eq!(summaries[0].changed_head.len(), 4, "{:?}", summaries[0]);
    // The unchanged layout's prompt is the clock-last one, its turns as warm as the fixed ones.
    let prompts = |scenario| scenario_rows(&rows, scenario).iter().map(|r| r.prompt_tokens).collect::<Vec<_>>();
    let (unchanged, clock_last) = (prompts(Scenario::HeadUnchanged), prompts(Scenario::HeadClockLast));
    let (a, b) = (unchanged[0].unwrap_or(0), clock_last[0].unwrap_or(0));
    assert!(a > 400 && a.abs_diff(b) <= 4, "the clock-last text (its nonce aside): {unchanged:?} {clock_last:?}");
    assert!(table(&summaries).contains("unchanged: TTFT ms (× fixed)"));
    assert!(table(&summaries).contains("clock first: tokens evaluated (× fixed)"));
}

/// A server that gets things wrong the ways peers do.
async fn wrong_answers(State(calls): State<Arc<AtomicUsize>>, Json(body): Json<Value>) -> Response {
    let n = calls.fetch_add(1, Ordering::SeqCst);
    if n == 1 {
        return (StatusCode::INTERNAL_SERVER_ERROR, "boom").into_response();
    }
    let text = if body.get("tools").is_some() {
        r#"{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}"#
    } else {
        "Fine. Thanks for asking."
    };
    if body["stream"] == true {
        // No usage, no role chunk: only content deltas and [DONE].
        let chunk = json!({"choices": [{"index": 0, "delta": {"content": text}, "finish_reason": "stop"}]});
        let sse = format!("data: {chunk}\n\ndata: [DONE]\n\n");
        return ([("content-type", "text/event-stream")], sse).into_response();
    }
    Json(json!({"choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}]}))
        .into_response()
}

#[tokio::test]
async fn a_wrong_server_fails_with_reasons_and_counted_errors() {
    let calls = Arc::new(AtomicUsize::new(0));
    let app = Router::new().route("/v1/chat/completions", post(wrong_answers)).with_state(calls);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let address = listener.local_addr().expect("address");
    tokio::spawn(async move { axum::serve(listener, app).await });

    let mut mock = config(format!("http://{address}"), "mock");
    mock.targets[0].restart = Some("echo cannot restart >&2; exit 3".into());
    let rows = run(&mock, |_| {}).await.expect("bench runs");
    let restart = scenario_rows(&rows, Scenario::Restart)[0];
    assert!(
        restart.error.starts_with("restart command failed") && restart.error.contains("cannot restart"),
        "{restart:?}"
    );
    let failed_turn = rows.iter().find(|r| r.http_status == 500).expect("the HTTP 500 is recorded");
    assert!(failed_turn.error.starts_with("HTTP 500"), "{failed_turn:?}");
    let tool = scenario_rows(&rows, Scenario::ToolStream)[0];
    assert_eq!(tool.error, "tool call came back as JSON in content");
    assert_eq!(scenario_rows(&rows, Scenario::ToolNonStream)[0].error, "tool call came back as JSON in content");
    assert!(scenario_rows(&rows, Scenario::ToolFollowUp)[0].error.starts_with("skipped"));
    assert!(scenario_rows(&rows, Scenario::Cold)[0].prompt_tokens.is_none(), "no usage was sent");
    assert_alternating_order(&rows, 3);

    // The mock has no /v1/prefill: the spoken turn is still measured, with no prefills.
    let spoken = scenario_rows(&rows, Scenario::Spoken)[0];
    assert_eq!(spoken.prefills, Some(0), "{spoken:?}");
    let summaries = summarize(&rows, &[]);
    // The mock's one-chunk reply cannot be cancelled after its third delta.
    let preemptive = scenario_rows(&rows, Scenario::Preemptive)[0];
    assert!(preemptive.error.contains("the reply ended before it was cancelled"), "{preemptive:?}");
    // The mock's one-chunk reply ends before the together scenario's second request is sent.
    let second = scenario_rows(&rows, Scenario::SecondWhileStreaming)[0];
    assert_eq!(second.error, "the long reply ended before its 8th delta", "{second:?}");
    assert_eq!(
        summaries[0].errors, 4,
        "the HTTP 500, the preemptive request, the second request not sent while a reply streamed and the failed restart"
    );
    assert!(table(&summaries).contains("no /v1/prefill"), "{}", table(&summaries));
    assert!(!summaries[0].tool_pass());
    assert!(decide(&summaries).is_err(), "no server passed: no decision");

    // Unreachable: every request is an error row, nothing panics.
    let gone = run(&config("http://127.0.0.1:9".into(), "gone"), |_| {}).await.expect("bench runs");
    assert!(
        gone.iter().all(|r| r.http_status == 0 && (r.error.contains("unreachable") || r.error.starts_with("skipped"))),
        "{gone:?}"
    );
}

/// The media scenario alone against `targets` (name, URL).
fn media_config(targets: &[(&str, String)]) -> BenchConfig {
    let mut config = config(String::new(), "");
    config.targets = targets
        .iter()
        .map(|(name, url)| Target { name: (*name).into(), url: url.clone(), pid: None, restart: None, serve: None })
        .collect();
    config.scenarios = Scenarios::Media;
    config
}

/// The summary of server `name`.
fn summary_of<'a>(summaries: &'a [Summary], name: &str) -> &'a Summary {
    summaries.iter().find(|s| s.server == name).unwrap_or_else(|| panic!("no summary of {name}"))
}

/// A verdict over answers that all came (the fixtures' random weights decide which).
fn all_answered(verdict: Option<&ProbeVerdict>) -> bool {
    matches!(verdict, Some(ProbeVerdict::Distinct { inputs: 4 } | ProbeVerdict::Same { of: 4, .. }))
}

#[tokio::test]
async fn the_media_scenario_transcribes_probes_and_reports_refusals() {
    let with = |projector| {
        spawn_server(
            Engine::start(EngineConfig { mmproj: Some(projector), ..test_config(smollm2_path()) }).expect("loads"),
        )
    };
    let (audio, vision, degenerate) = (with(audio_projector()), with(vision_projector()), with(degenerate_projector()));
    let config = media_config(&[
        ("audio", audio.base.clone()),
        ("vision", format!("{}/v1", vision.base)),
        ("degenerate", degenerate.base.clone()),
    ]);
    let rows = run(&config, |_| {}).await.expect("espeak-ng speaks the clips (make test installs it)");
    assert!(rows.iter().all(|r| r.scenario.is_media()), "--media-only runs nothing else");
    let of = |server: &str, scenario: Scenario| -> Vec<&Row> {
        rows.iter().filter(|r| r.server == server && r.scenario == scenario).collect()
    };

    // The audio projector: every clip transcribed (noise: random weights), its WER measured.
    let transcriptions = of("audio", Scenario::Transcription);
    assert_eq!(transcriptions.len(), 4);
    for row in &transcriptions {
        assert_eq!((row.http_status, row.error.as_str()), (200, ""), "{row:?}");
        assert!(row.wer.is_some_and(|w| w.is_finite() && w >= 0.0), "{row:?}");
        assert!(row.reply.is_some() && row.prompt_tokens.is_some_and(|n| n > 60), "the clip's tokens: {row:?}");
    }
    let summaries = summarize(&rows, &[]);
    let media = |name| summary_of(&summaries, name).media.clone().expect("media summary");
    let audio_summary = media("audio");
    assert_eq!(audio_summary.wer.len(), 4);
    assert!(audio_summary.wer_mean.is_some_and(|w| w.is_finite() && w >= 0.0), "{audio_summary:?}");
    assert!(all_answered(audio_summary.audio.as_ref()), "{audio_summary:?}");
    match &audio_summary.image {
        Some(ProbeVerdict::Refused { message }) => assert!(message.contains("takes no image input"), "{message}"),
        other => panic!("an audio projector refuses pictures: {other:?}"),
    }

    // The vision projector: the pictures answered, audio refused.
    let vision_summary = media("vision");
    assert!(all_answered(vision_summary.image.as_ref()), "{vision_summary:?}");
    assert!(matches!(vision_summary.audio, Some(ProbeVerdict::Refused { .. })), "{vision_summary:?}");
    assert!(vision_summary.transcription_refused && vision_summary.wer_mean.is_none(), "{vision_summary:?}");

    // The degenerate projector is refused at load: every media request is refused, and the
    // report says so, not a pass.
    let degenerate_summary = media("degenerate");
    for verdict in [&degenerate_summary.audio, &degenerate_summary.image] {
        match verdict {
            Some(ProbeVerdict::Refused { message }) => assert!(message.contains("same output"), "{message}"),
            other => panic!("the degenerate projector's media are refused: {other:?}"),
        }
    }
    assert!(degenerate_summary.transcription_refused, "{degenerate_summary:?}");
    assert_eq!(summary_of(&summaries, "degenerate").errors, 0, "refusals are verdicts, not errors");

    let text = table(&summaries);
    assert!(
        text.starts_with("server | transcription WER (mean) | audio probe | image probe | peak RSS MB\n"),
        "{text}"
    );
    assert!(text.contains("\ndegenerate | refused | refused | refused | -\n"), "{text}");
    assert!(text.contains("  audio transcription WER per clip: "), "{text}");
}

/// A mock media server: at `/same/…` every request gets one fluent sentence (HTTP 200), at
/// `/distinct/…` each input its own answer.
async fn media_answers(distinct: bool, Json(body): Json<Value>) -> Response {
    let text = if distinct {
        use std::hash::{Hash, Hasher};
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        body["messages"][0]["content"][0].to_string().hash(&mut hasher);
        format!("I notice input {:016x}.", hasher.finish())
    } else {
        "The recording is of a person speaking clearly in a quiet room.".to_string()
    };
    let chunk = json!({"choices": [{"index": 0, "delta": {"content": text}, "finish_reason": "stop"}]});
    ([("content-type", "text/event-stream")], format!("data: {chunk}\n\ndata: [DONE]\n\n")).into_response()
}

#[tokio::test]
async fn the_same_answer_to_every_input_is_a_failure_whatever_the_status() {
    let app = Router::new()
        .route("/same/v1/chat/completions", post(|body| media_answers(false, body)))
        .route("/distinct/v1/chat/completions", post(|body| media_answers(true, body)));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let address = listener.local_addr().expect("address");
    tokio::spawn(async move { axum::serve(listener, app).await });

    let config =
        media_config(&[("same", format!("http://{address}/same")), ("distinct", format!("http://{address}/distinct"))]);
    let rows = run(&config, |_| {}).await.expect("bench runs");
    assert!(rows.iter().all(|r| r.http_status == 200 && r.error.is_empty()), "{rows:?}");
    let summaries = summarize(&rows, &[]);
    let same = summary_of(&summaries, "same").media.clone().expect("media");
    assert!(same.wer_mean.is_some_and(|w| w > 0.5), "{same:?}");
    for verdict in [same.audio, same.image] {
        match verdict {
            Some(ProbeVerdict::Same { inputs, of: 4, answer }) => {
                assert_eq!(inputs, [1, 2, 3, 4]);
                assert!(answer.starts_with("The recording is"), "{answer}");
            }
            other => panic!("one answer to four inputs is a failure: {other:?}"),
        }
    }
    let distinct = summary_of(&summaries, "distinct").media.clone().expect("media");
    assert_eq!(
        (distinct.audio, distinct.image),
        (Some(ProbeVerdict::Distinct { inputs: 4 }), Some(ProbeVerdict::Distinct { inputs: 4 }))
    );
    let text = table(&summaries);
    assert!(text.contains("\nsame | ") && text.contains(" | FAILURE | FAILURE | -\n"), "{text}");
    assert!(text.contains(" | PASS | PASS | -\n"), "{text}");
    assert!(
        text.contains("  same audio probe: FAILURE: inputs 1, 2, 3, 4 of 4 (all distinct) got the same answer"),
        "{text}"
    );
}
