//! `firstword bench grade RUN_DIR`: a page on localhost where a person grades a quality run
//! blind, one unit at a time. The page gets the prompt, the reference, the rubric notes and the
//! answers under their shuffled labels (A, B, C …), never the servers' names: those come back
//! only in the answer to a unit's grade, once the grade is on disk. Every request reads the
//! run directory again, so the file is the one record: a crash or a closed tab loses nothing,
//! and grading resumes at the first unit the person has not graded.
//!
//! The page and its script and style are embedded in the binary (nothing is fetched from any
//! network) and served under a policy that allows this origin only. Requests addressed to any
//! host but this machine, and grades posted from another origin, are refused with 403.

mod access;
mod error;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::quality::{latest_grades, Grade, Grader, RunDir, Unit, UnitKey};
pub use error::GradeError;

/// The page: its markup, script and style, each served from this origin.
const PAGE: &str = include_str!("page.html");
/// The page's script.
const SCRIPT: &str = include_str!("page.js");
/// The page's own style, on top of the console's.
const STYLE: &str = include_str!("page.css");

/// This origin's files and API only: no inline script, no other origin, no framing.
const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
     connect-src 'self'; img-src data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// The lowest and highest score of the rubric.
const SCORES: std::ops::RangeInclusive<f64> = 1.0..=5.0;

/// What the handlers share: the run, and a lock that makes "not graded yet, so append" one step.
#[derive(Debug)]
struct Grading {
    /// The run being graded.
    dir: RunDir,
    /// Held while a grade is checked and appended (two quick submits store one grade).
    writing: parking_lot::Mutex<()>,
}

/// The grading page and its API over `dir`: `GET /` (the page), `GET /api/next` (the first unit
/// not graded yet, without the servers' names), `POST /api/grade` (stores a grade, then says
/// which servers wrote each label).
pub fn grading_router(dir: RunDir) -> Router {
    let grading = Arc::new(Grading { dir, writing: parking_lot::Mutex::new(()) });
    Router::new()
        .route("/", get(page))
        .route("/grade.js", get(script))
        .route("/console.css", get(console_style))
        .route("/grade.css", get(style))
        .route("/api/next", get(next_unit))
        .route("/api/grade", post(grade_unit))
        .fallback(not_found)
        .with_state(grading)
        .layer(axum::middleware::from_fn(access::refuse_other_hosts_and_origins))
}

/// Serves the grading page on `listener` until the process ends; prints nothing.
///
/// # Errors
/// The listener fails to accept connections.
pub async fn serve_grading(dir: RunDir, listener: tokio::net::TcpListener) -> std::io::Result<()> {
    axum::serve(listener, grading_router(dir)).await
}

/// How far the grading has come.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
struct Progress {
    /// Units the person has graded.
    graded: usize,
    /// Units in the run.
    total: usize,
}

/// A unit as the page shows it: everything but who wrote what.
#[derive(Debug, Serialize)]
struct ShownUnit {
    /// The item's id.
    item: String,
    /// The sample (0: greedy).
    sample: u32,
    /// The conversation asked, as OpenAI chat messages.
    messages: Vec<Value>,
    /// The names of the tools the servers were offered.
    tools: Vec<String>,
    /// What a good answer says.
    reference: Option<String>,
    /// Notes for the grader beyond the rubric.
    rubric: Option<String>,
    /// The distinct answers, in label order.
    choices: Vec<ShownChoice>,
}

/// One answer as the page shows it.
#[derive(Debug, Serialize)]
struct ShownChoice {
    /// `A`, `B`, ….
    label: String,
    /// The answer's text and tool calls.
    text: String,
}

/// `GET /api/next`'s answer.
#[derive(Debug, Serialize)]
struct NextUnit {
    /// How far the grading has come.
    progress: Progress,
    /// The first unit not graded yet; `None` when all are.
    unit: Option<ShownUnit>,
}

/// `POST /api/grade`'s body.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PostedGrade {
    /// The item's id.
    item: String,
    /// The sample.
    sample: u32,
    /// A score from 1 to 5 for every label.
    scores: BTreeMap<String, f64>,
    /// The answers are equally good (then every score is the same).
    #[serde(default)]
    tie: bool,
}

/// `POST /api/grade`'s answer: the grade is stored, so the servers may be named.
#[derive(Debug, Serialize)]
struct Revealed {
    /// The item's id.
    item: String,
    /// The sample.
    sample: u32,
    /// The servers behind each label.
    reveal: BTreeMap<String, Vec<String>>,
    /// How far the grading has come, this grade included.
    progress: Progress,
}

/// `GET /`: the page.
async fn page() -> Response {
    served("text/html; charset=utf-8", PAGE)
}

/// `GET /grade.js`: the page's script.
async fn script() -> Response {
    served("text/javascript; charset=utf-8", SCRIPT)
}

/// `GET /console.css`: the console's look, which the page builds on.
async fn console_style() -> Response {
    served(crate::api::CSS, crate::api::CONSOLE_STYLE)
}

/// `GET /grade.css`: the page's own rules, after the console's.
async fn style() -> Response {
    served(crate::api::CSS, STYLE)
}

/// `body` with its type and this page's security headers.
fn served(content_type: &'static str, body: &'static str) -> Response {
    crate::api::page_file(content_type, CONTENT_SECURITY_POLICY, body)
}

/// A JSON answer that no cache keeps (it changes with every grade).
fn fresh<T: Serialize>(value: T) -> Response {
    ([(header::CACHE_CONTROL, HeaderValue::from_static("no-store"))], Json(value)).into_response()
}

/// Any other path: 404 with the envelope.
async fn not_found(uri: Uri) -> GradeError {
    GradeError::NotFound(uri.path().to_string())
}

/// Runs file work off the async threads (appending a grade waits for the disk).
async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, GradeError> + Send + 'static,
) -> Result<T, GradeError> {
    tokio::task::spawn_blocking(work).await.map_err(|e| GradeError::Interrupted(e.to_string()))?
}

/// `GET /api/next`: the first unit the person has not graded, and the progress.
async fn next_unit(State(grading): State<Arc<Grading>>) -> Result<Response, GradeError> {
    let next = blocking(move || {
        let units = grading.dir.units()?;
        let grades = grading.dir.grades()?;
        Ok(next_of(&units, &grades))
    })
    .await?;
    Ok(fresh(next))
}

/// `POST /api/grade`: checks the grade against the unit, appends it, then reveals the servers.
async fn grade_unit(
    State(grading): State<Arc<Grading>>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, GradeError> {
    let is_json = headers
        .get(header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .is_some_and(|kind| kind.trim_start().to_ascii_lowercase().starts_with("application/json"));
    if !is_json {
        return Err(GradeError::BadBody("send the grade as application/json".into()));
    }
    let posted: PostedGrade = serde_json::from_slice(&body).map_err(|e| GradeError::BadBody(e.to_string()))?;
    let revealed = blocking(move || {
        let _writing = grading.writing.lock();
        let units = grading.dir.units()?;
        let grades = grading.dir.grades()?;
        let key = UnitKey { item: posted.item.clone(), sample: posted.sample };
        let unit = units
            .iter()
            .find(|unit| unit.key == key)
            .ok_or_else(|| GradeError::UnknownUnit { item: key.item.clone(), sample: key.sample })?;
        if latest_grades(&grades, Grader::Person).contains_key(&key) {
            return Err(GradeError::AlreadyGraded { item: key.item, sample: key.sample });
        }
        let grade = grade_of(unit, &posted, chrono::Utc::now().to_rfc3339())?;
        grading.dir.append_grade(&grade)?;
        let graded = graded_units(&units, &grades) + 1;
        Ok(Revealed {
            item: key.item,
            sample: key.sample,
            reveal: unit.reveal(),
            progress: Progress { graded, total: units.len() },
        })
    })
    .await?;
    Ok(fresh(revealed))
}

/// How many of `units` the person has graded.
fn graded_units(units: &[Unit], grades: &[Grade]) -> usize {
    let graded = latest_grades(grades, Grader::Person);
    units.iter().filter(|unit| graded.contains_key(&unit.key)).count()
}

/// The progress and the first unit the person has not graded, without the servers' names.
fn next_of(units: &[Unit], grades: &[Grade]) -> NextUnit {
    let graded = latest_grades(grades, Grader::Person);
    let progress = Progress { graded: graded_units(units, grades), total: units.len() };
    let unit = units.iter().find(|unit| !graded.contains_key(&unit.key)).map(shown);
    NextUnit { progress, unit }
}

/// What the page may see of `unit`: labels and texts, no servers.
fn shown(unit: &Unit) -> ShownUnit {
    let tools = unit
        .item
        .tools()
        .and_then(|tools| tools.as_array().cloned())
        .unwrap_or_default()
        .iter()
        .filter_map(|tool| tool["function"]["name"].as_str().or_else(|| tool["name"].as_str()).map(str::to_string))
        .collect();
    ShownUnit {
        item: unit.key.item.clone(),
        sample: unit.key.sample,
        messages: unit.item.messages.clone(),
        tools,
        reference: unit.item.reference.clone(),
        rubric: unit.item.rubric.clone(),
        choices: unit.choices.iter().map(|c| ShownChoice { label: c.label.clone(), text: c.text.clone() }).collect(),
    }
}

/// The person's grade of `unit` from the posted scores per label.
///
/// # Errors
/// [`GradeError::BadScores`]: a label without a score, an unknown label, a score that is not a
/// whole number from 1 to 5, or a tie whose scores differ.
fn grade_of(unit: &Unit, posted: &PostedGrade, at: String) -> Result<Grade, GradeError> {
    let labels: Vec<&str> = unit.choices.iter().map(|c| c.label.as_str()).collect();
    if let Some(unknown) = posted.scores.keys().find(|label| !labels.contains(&label.as_str())) {
        return Err(GradeError::BadScores(format!("no answer is labelled {unknown:?} (the labels are {labels:?})")));
    }
    let missing: Vec<&str> = labels.iter().copied().filter(|label| !posted.scores.contains_key(*label)).collect();
    if !missing.is_empty() {
        return Err(GradeError::BadScores(format!("score every answer: {missing:?} have no score")));
    }
    if let Some((label, score)) = posted.scores.iter().find(|(_, s)| !SCORES.contains(*s) || s.fract() != 0.0) {
        return Err(GradeError::BadScores(format!("scores are whole numbers from 1 to 5, not {score} ({label})")));
    }
    let first = posted.scores.values().next().copied();
    if posted.tie && posted.scores.values().any(|score| Some(*score) != first) {
        return Err(GradeError::BadScores("a tie gives every answer the same score".into()));
    }
    let scores = unit
        .scores_by_server(&posted.scores)
        .ok_or_else(|| GradeError::BadScores("the scores do not fit the unit's answers".into()))?;
    Ok(Grade { key: unit.key.clone(), grader: Grader::Person, scores, tie: posted.tie, reasoning: vec![], at })
}
