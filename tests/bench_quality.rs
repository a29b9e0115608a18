//! `firstword bench --quality` end to end: firstword over SmolLM2 and a mock server answer a
//! small quality set (matched pairs, each answer kept in the run directory); a judge that
//! always prefers the answer shown first is cancelled out by the two orders; a judge that
//! answers garbage is reported unit by unit, never a crash and never a grade; the verdict is
//! made from the grades and written as verdict.json and verdict.svg.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use common::exclusive_server;
use firstword::bench::quality::{
    judge_run, latest_grades, Grader, JudgeConfig, QualityRun, QualitySet, RunDir, ServerFigures,
};
use firstword::bench::{run, verdict, BenchConfig, Decision, Rules, Scenario, Scenarios, Target, Weights};
use serde_json::{json, Value};

/// The mock candidate's one answer to everything.
const MOCK_ANSWER: &str = "I cannot help with that right now.";

/// Three items: a fact, a home command with tools, a follow-up.
const SET: &str = r#"{"id": "capital", "messages": [{"role": "user", "content": "What is the capital of France?"}], "reference": "Paris.", "max_tokens": 24}
{"id": "light", "messages": [{"role": "user", "content": "Turn on the kitchen light."}], "tools": "home", "max_tokens": 48}
{"id": "sister", "messages": [{"role": "user", "content": "My sister is Anna."}, {"role": "assistant", "content": "Nice."}, {"role": "user", "content": "What is my sister's name?"}], "max_tokens": 24}
"#;

fn temp_dir(name: &str) -> std::path::PathBuf {
    let dir =
        std::env::temp_dir().join(format!("firstword-quality-{name}-{}-{}", std::process::id(), fastrand::u32(..)));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

fn config(targets: Vec<Target>, quality: QualityRun) -> BenchConfig {
    BenchConfig {
        targets,
        system_prompt: String::new(),
        turns: 1,
        reps: 1,
        model: "default".into(),
        turn_tokens: 16,
        decode_tokens: 16,
        timeout: Duration::from_secs(300),
        vad: BenchConfig::DEFAULT_VAD,
        pregenerate: BenchConfig::DEFAULT_PREGENERATE,
        busy_cores: 0,
        scenarios: Scenarios::QualityOnly,
        home_entities: BenchConfig::DEFAULT_HOME_ENTITIES,
        quality: Some(quality),
    }
}

/// The mock candidate: one streamed sentence, whatever is asked.
async fn mock_candidate(Json(_body): Json<Value>) -> Response {
    let chunk = json!({"choices": [{"index": 0, "delta": {"content": MOCK_ANSWER}, "finish_reason": "stop"}]});
    ([("content-type", "text/event-stream")], format!("data: {chunk}\n\ndata: [DONE]\n\n")).into_response()
}

/// What the mock judges saw: each request's user message.
type Seen = Arc<Mutex<Vec<String>>>;

/// A judge that gives the answer shown first 5 and every other 2.
async fn biased_judge(State(seen): State<Seen>, Json(body): Json<Value>) -> Response {
    let prompt = body["messages"][1]["content"].as_str().unwrap_or_default().to_string();
    let answers = prompt.matches("\nAnswer ").count();
    seen.lock().expect("judge log").push(prompt);
    let scores: Vec<u32> = (0..answers).map(|i| if i == 0 { 5 } else { 2 }).collect();
    let content = json!({"reasoning": "The first answer is best.", "scores": scores}).to_string();
    Json(json!({"choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}]}))
        .into_response()
}

/// A judge that rambles instead of grading.
async fn garbage_judge(Json(_body): Json<Value>) -> Response {
    let content = "Both answers have their merits, and I would rather not choose.";
    Json(json!({"choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}]}))
        .into_response()
}

async fn serve(app: Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let address = listener.local_addr().expect("address");
    tokio::spawn(async move { axum::serve(listener, app).await });
    format!("http://{address}")
}

#[tokio::test]
async fn a_quality_run_is_answered_graded_blind_and_decided() {
    let (_guard, server) = exclusive_server().await;
    let mock = serve(Router::new().route("/v1/chat/completions", post(mock_candidate))).await;
    let path = temp_dir("e2e");
    let dir = RunDir::create(&path).expect("run dir");
    let set = QualitySet::parse(SET).expect("set");
    dir.write_items(&set).expect("items");
    let targets = vec![
        Target { name: "firstword".into(), url: format!("{}/v1", server.base), pid: None, restart: None, serve: None },
        Target { name: "mock".into(), url: mock, pid: None, restart: None, serve: None },
    ];
    let rows = run(&config(targets, QualityRun { set, samples: 1, dir: dir.clone() }), |_| {}).await.expect("runs");

    // Every item answered by both, timed like any other request, and kept in the directory.
    assert_eq!(rows.len(), 6, "{rows:?}");
    assert!(rows.iter().all(|r| r.scenario == Scenario::Quality && r.http_status == 200 && r.error.is_empty()));
    assert!(rows.iter().all(|r| r.ttft_ms.is_some()), "{rows:?}");
    let answers = dir.answers().expect("answers");
    assert_eq!(answers.len(), 6);
    let firstword_answers: Vec<_> = answers.iter().filter(|a| a.server == "firstword").collect();
    assert!(firstword_answers.iter().all(|a| a.sample == 0 && a.content != MOCK_ANSWER), "{firstword_answers:?}");
    let light = firstword_answers.iter().find(|a| a.item == "light").expect("light");
    assert!(!light.content.is_empty() || !light.tool_calls.is_empty(), "{light:?}");

    // The judge sees anonymous answers, twice per unit, and its position bias cancels.
    let seen: Seen = Arc::default();
    let judge_url =
        serve(Router::new().route("/v1/chat/completions", post(biased_judge)).with_state(seen.clone())).await;
    let judge = JudgeConfig { url: judge_url, model: "judge".into(), timeout: Duration::from_secs(30) };
    let report = judge_run(&dir, &judge, |_, _| {}).await.expect("judge run");
    assert_eq!((report.graded, report.already, report.failures.len()), (3, 0, 0), "{report:?}");
    let prompts = seen.lock().expect("judge log").clone();
    assert_eq!(prompts.len(), 6, "both orders of each unit's two answers");
    for prompt in &prompts {
        assert!(!prompt.contains("firstword") && !prompt.contains("mock"), "not blind: {prompt}");
    }
    let grades = dir.grades().expect("grades");
    let judged = latest_grades(&grades, Grader::Judge);
    assert_eq!(judged.len(), 3);
    for grade in judged.values() {
        assert_eq!(grade.scores["firstword"], 3.5, "{grade:?}");
        assert_eq!(grade.scores["mock"], 3.5, "{grade:?}");
        assert!(grade.tie && grade.reasoning.len() == 2, "{grade:?}");
    }
    // A second judge run finds nothing left to grade.
    let again = judge_run(&dir, &judge, |_, _| {}).await.expect("judge run");
    assert_eq!((again.graded, again.already), (0, 3));

    // The verdict by the judge's grades (as asked): equal quality and equal figures stay within
    // the margin, the same verdict the pure function gives.
    let figures = [
        ServerFigures { name: "firstword".into(), warm_ttft_ms: Some(100.0), ..ServerFigures::default() },
        ServerFigures { name: "mock".into(), warm_ttft_ms: Some(100.0), ..ServerFigures::default() },
    ];
    dir.write_figures(&figures).expect("figures");
    let rules = Rules { weights: Weights::default(), incumbent: "firstword".into(), switch_margin: 0.05 };
    let options = firstword::bench::VerdictOptions {
        incumbent: Some("firstword".into()),
        by: Grader::Judge,
        ..Default::default()
    };
    let decided = firstword::bench::decide_run(&dir, &options).expect("verdict");
    assert_eq!(decided.decision, Decision::Stay, "{}", decided.reason);
    assert!(decided.reason.contains("within the 5% margin"), "{}", decided.reason);
    let graded: Vec<_> = judged.values().map(|g| g.scores.clone()).collect();
    assert_eq!(verdict(&figures, &graded, &rules).expect("verdict"), decided);
    let written: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.file("verdict.json")).expect("verdict.json")).expect("JSON");
    assert_eq!((written["graded_by"].as_str(), written["verdict"]["decision"].as_str()), (Some("judge"), Some("stay")));
    assert!(std::fs::read_to_string(dir.file("verdict.svg")).expect("verdict.svg").contains("<svg"));
    // By the person's grades (none yet): speed alone does not decide.
    let by_person = firstword::bench::decide_run(&dir, &firstword::bench::VerdictOptions::default()).expect("verdict");
    assert!(by_person.reason.contains("no blind quality grades"), "{}", by_person.reason);
    std::fs::remove_dir_all(&path).expect("clean up");
}

#[tokio::test]
async fn a_judge_that_answers_garbage_is_reported_and_grades_nothing() {
    let path = temp_dir("garbage");
    let dir = RunDir::create(&path).expect("run dir");
    let set = QualitySet::parse(SET).expect("set");
    dir.write_items(&set).expect("items");
    for item in &set.items {
        for (server, content) in [("a", "Paris."), ("b", "Lyon.")] {
            let answer = firstword::bench::quality::Answer {
                item: item.id.clone(),
                server: server.into(),
                content: content.into(),
                ..Default::default()
            };
            dir.append_answer(&answer).expect("answer");
        }
    }
    let judge_url = serve(Router::new().route("/v1/chat/completions", post(garbage_judge))).await;
    let judge = JudgeConfig { url: judge_url, model: "judge".into(), timeout: Duration::from_secs(30) };
    let mut failures_seen = 0;
    let report =
        judge_run(&dir, &judge, |_, outcome| failures_seen += usize::from(outcome.is_err())).await.expect("run");
    assert_eq!((report.graded, failures_seen), (0, 3));
    for (_, why) in &report.failures {
        assert!(why.contains("no JSON object") && why.contains("Both answers have their merits"), "{why}");
    }
    assert!(dir.grades().expect("grades").is_empty());
    // An unreachable judge: the same, with the reason.
    let gone = JudgeConfig { url: "http://127.0.0.1:9".into(), model: "judge".into(), timeout: Duration::from_secs(5) };
    let report = judge_run(&dir, &gone, |_, _| {}).await.expect("run");
    assert!(report.failures.iter().all(|(_, why)| why.contains("unreachable")), "{report:?}");
    std::fs::remove_dir_all(&path).expect("clean up");
}

/// A port nobody listens on now, below Linux's ephemeral range (32768 and up), so that no
/// other test's server, bound to port 0, can take it before the served command does.
fn free_port() -> u16 {
    loop {
        let port = fastrand::u16(20_000..32_000);
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
}

fn listens(port: u16) -> bool {
    std::net::TcpStream::connect_timeout(&([127, 0, 0, 1], port).into(), Duration::from_millis(500)).is_ok()
}

/// `--serve`: each server started before its turn and stopped after it, the other one never
/// resident at the same time, the order alternated per repetition, the peak memory read
/// before each stop; a command that does not serve stops the run with its log.
#[tokio::test]
async fn served_servers_run_one_at_a_time_in_alternating_order() {
    let (_guard, _server) = exclusive_server().await;
    let cache = temp_dir("serve-cache");
    std::fs::create_dir_all(&cache).expect("cache dir");
    let ports = [free_port(), free_port()];
    let targets: Vec<Target> = ["a", "b"]
        .iter()
        .zip(ports)
        .map(|(name, port)| {
            let command = format!(
                "echo {name} >> {starts}; {} serve -m {} --port {port} --cache-dir {}/{name}",
                env!("CARGO_BIN_EXE_firstword"),
                common::smollm2_path().display(),
                cache.display(),
                starts = cache.join("starts").display(),
            );
            Target {
                name: (*name).into(),
                url: format!("http://127.0.0.1:{port}"),
                pid: None,
                restart: None,
                serve: Some(command),
            }
        })
        .collect();
    let path = temp_dir("serve");
    let dir = RunDir::create(&path).expect("run dir");
    let set = QualitySet::parse(SET.lines().next().expect("a line")).expect("set");
    let mut served = config(targets, QualityRun { set, samples: 1, dir });
    served.reps = 2;
    // The quality set is asked in the first repetition: while each answer is recorded, only
    // its own server listens.
    let mut seen: Vec<(String, bool, bool)> = Vec::new();
    let (rows, peaks) = firstword::bench::run_measured(&served, |row| {
        seen.push((row.server.clone(), listens(ports[0]), listens(ports[1])));
    })
    .await
    .expect("runs");
    assert_eq!(rows.len(), 2, "{rows:?}");
    assert_eq!(seen, [("a".to_string(), true, false), ("b".to_string(), false, true)]);
    assert!(!listens(ports[0]) && !listens(ports[1]), "both stopped");
    // Every repetition starts both, the second b first.
    assert_eq!(std::fs::read_to_string(cache.join("starts")).expect("starts"), "a\nb\nb\na\n");
    let names: Vec<&str> = peaks.iter().map(|(name, _)| name.as_str()).collect();
    assert_eq!(names, ["a", "b"]);
    assert!(peaks.iter().all(|(_, mb)| *mb > 50.0), "{peaks:?}");

    let broken = Target {
        name: "broken".into(),
        url: format!("http://127.0.0.1:{}", free_port()),
        pid: None,
        restart: None,
        serve: Some("echo no model here >&2; exit 3".into()),
    };
    let dir = RunDir::create(&temp_dir("serve-broken")).expect("run dir");
    let set = QualitySet::parse(SET.lines().next().expect("a line")).expect("set");
    let error = firstword::bench::run(&config(vec![broken], QualityRun { set, samples: 1, dir }), |_| {})
        .await
        .expect_err("does not serve");
    let text = error.to_string();
    assert!(text.starts_with("--serve broken: the command exited") && text.contains("no model here"), "{text}");
    std::fs::remove_dir_all(&path).expect("clean up");
    let _ = std::fs::remove_dir_all(&cache);
}
