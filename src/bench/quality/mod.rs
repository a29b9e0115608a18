//! Quality, graded blind: the quality set ([`QualitySet`]), each server's answers, the
//! grading units (the distinct answers to one item under shuffled labels), the grades a person
//! or a judge model gives, and the run's directory that keeps them all as files.
//!
//! A run directory holds `items.jsonl` (the set as asked), `answers.jsonl` (one line per
//! server, item and sample), `secret` (the seed of the labels' order: the grading page never
//! sends it), `speed.json` (each server's measured figures), `grades.jsonl` (appended as
//! grades are given) and, once decided, `verdict.json` and `verdict.svg`.

mod ask;
mod items;
mod judge;
mod store;
mod units;

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

pub use ask::QualityRun;
pub use items::{home_tools, QualityItem, QualitySet, DEFAULT_MAX_TOKENS, VOICE_SYSTEM};
pub use judge::{judge_run, judge_unit, JudgeConfig, JudgeReport};
pub use store::{RunDir, ServerFigures};
pub use units::{answer_text, units, Choice, Unit, UnitKey};

/// A tool call in an answer.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AnsweredCall {
    /// The function's name.
    pub name: String,
    /// Its arguments, as the server sent them.
    pub arguments: String,
}

/// One server's answer to one item and sample.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Answer {
    /// The item's id.
    pub item: String,
    /// The sample (0: greedy).
    pub sample: u32,
    /// The server's name.
    pub server: String,
    /// The content text.
    pub content: String,
    /// The tool calls.
    #[serde(default)]
    pub tool_calls: Vec<AnsweredCall>,
    /// The final `finish_reason`.
    #[serde(default)]
    pub finish_reason: Option<String>,
    /// Why there is no answer (empty when there is one).
    #[serde(default)]
    pub error: String,
    /// Time to the first token, ms.
    #[serde(default)]
    pub ttft_ms: Option<f64>,
    /// Time to the whole answer, ms.
    #[serde(default)]
    pub total_ms: Option<f64>,
}

/// Who gave a grade.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Grader {
    /// A person, on the grading page.
    Person,
    /// A judge model (`--judge`).
    Judge,
}

impl std::str::FromStr for Grader {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        match text {
            "person" => Ok(Self::Person),
            "judge" => Ok(Self::Judge),
            other => Err(format!("{other:?}: use person or judge")),
        }
    }
}

/// One unit's grade: a score from 1 to 5 per server (servers that gave the same answer share
/// it).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Grade {
    /// The item and sample.
    #[serde(flatten)]
    pub key: UnitKey,
    /// Who graded.
    pub grader: Grader,
    /// Score per server.
    pub scores: BTreeMap<String, f64>,
    /// The grader marked the answers as equally good.
    #[serde(default)]
    pub tie: bool,
    /// The judge's reasoning, for each order the answers were shown in.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reasoning: Vec<String>,
    /// When, as RFC 3339.
    pub at: String,
}

/// The last grade each unit got from `grader` (a unit graded again keeps its newest grade).
#[must_use]
pub fn latest_grades(grades: &[Grade], grader: Grader) -> BTreeMap<UnitKey, &Grade> {
    grades.iter().filter(|g| g.grader == grader).map(|g| (g.key.clone(), g)).collect()
}

/// How a judge's grades agree with a person's on the units both graded: for every pair of
/// servers in a unit, whether both prefer the same one (or both see a tie), and each server's
/// mean score from each grader side by side.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Agreement {
    /// Per server, its mean score from the person and from the judge, over the units both
    /// graded.
    pub means: BTreeMap<String, (f64, f64)>,
    /// Pairs compared.
    pub pairs: usize,
    /// Pairs where the preference agrees.
    pub agreeing: usize,
    /// Mean absolute difference between the two graders' scores, per server and unit.
    pub mean_abs_difference: f64,
}

/// The agreement of the judge's grades with the person's; `None` when no unit has both.
#[must_use]
pub fn agreement(grades: &[Grade]) -> Option<Agreement> {
    let person = latest_grades(grades, Grader::Person);
    let judge = latest_grades(grades, Grader::Judge);
    let (mut pairs, mut agreeing, mut differences) = (0, 0, Vec::new());
    let mut sums: BTreeMap<String, (f64, f64, usize)> = BTreeMap::new();
    for (key, p) in &person {
        let Some(j) = judge.get(key) else { continue };
        let servers: Vec<&String> = p.scores.keys().filter(|s| j.scores.contains_key(*s)).collect();
        for s in &servers {
            differences.push((p.scores[*s] - j.scores[*s]).abs());
            let sum = sums.entry((*s).clone()).or_default();
            *sum = (sum.0 + p.scores[*s], sum.1 + j.scores[*s], sum.2 + 1);
        }
        for (i, a) in servers.iter().enumerate() {
            for b in &servers[i + 1..] {
                pairs += 1;
                let prefers = |g: &Grade| g.scores[*a].total_cmp(&g.scores[*b]);
                if prefers(p) == prefers(j) {
                    agreeing += 1;
                }
            }
        }
    }
    if differences.is_empty() {
        return None;
    }
    let mean_abs_difference = differences.iter().sum::<f64>() / differences.len() as f64;
    let means = sums.into_iter().map(|(s, (p, j, n))| (s, (p / n as f64, j / n as f64))).collect();
    Some(Agreement { means, pairs, agreeing, mean_abs_difference })
}

/// What is wrong with a quality set, a run directory or a grade.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum QualityError {
    /// A file cannot be read.
    #[error("{}: {error}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        error: std::io::Error,
    },
    /// A file cannot be written.
    #[error("{}: {error}", path.display())]
    Write {
        /// The file.
        path: PathBuf,
        /// Why.
        error: std::io::Error,
    },
    /// A line of a quality set is not an item.
    #[error("line {line}: not a quality item: {message}")]
    BadItem {
        /// The line's number, from 1.
        line: usize,
        /// Why.
        message: String,
    },
    /// Two items share an id.
    #[error("two items have the id {0:?}")]
    DuplicateId(String),
    /// The set has no item.
    #[error("the quality set has no item")]
    Empty,
    /// A line of a run directory's file does not parse.
    #[error("{}: line {line}: {message}", path.display())]
    BadLine {
        /// The file.
        path: PathBuf,
        /// The line's number, from 1.
        line: usize,
        /// Why.
        message: String,
    },
    /// The directory holds no answers to grade.
    #[error("{}: no answers to grade (run firstword bench --quality --run-dir DIR first)", .0.display())]
    NoAnswers(PathBuf),
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grade(item: &str, grader: Grader, scores: &[(&str, f64)]) -> Grade {
        Grade {
            key: UnitKey { item: item.into(), sample: 0 },
            grader,
            scores: scores.iter().map(|(s, v)| ((*s).to_string(), *v)).collect(),
            tie: false,
            reasoning: vec![],
            at: String::new(),
        }
    }

    #[test]
    fn agreement_counts_pairs_with_the_same_preference() {
        let grades = [
            grade("a", Grader::Person, &[("x", 5.0), ("y", 2.0)]),
            grade("a", Grader::Judge, &[("x", 4.0), ("y", 3.0)]),
            grade("b", Grader::Person, &[("x", 3.0), ("y", 3.0)]),
            grade("b", Grader::Judge, &[("x", 2.0), ("y", 4.0)]),
            grade("c", Grader::Judge, &[("x", 1.0), ("y", 1.0)]),
        ];
        let agreement = agreement(&grades).expect("grades");
        assert_eq!((agreement.pairs, agreement.agreeing), (2, 1));
        assert!((agreement.mean_abs_difference - 1.0).abs() < 1e-9);
        assert_eq!(agreement.means["x"], (4.0, 3.0));
        assert_eq!(agreement.means["y"], (2.5, 3.5));
        assert_eq!(super::agreement(&grades[..1]), None);
    }

    #[test]
    fn a_unit_graded_again_keeps_its_newest_grade() {
        let grades = [grade("a", Grader::Person, &[("x", 1.0)]), grade("a", Grader::Person, &[("x", 4.0)])];
        assert_eq!(latest_grades(&grades, Grader::Person)[&UnitKey { item: "a".into(), sample: 0 }].scores["x"], 4.0);
        assert!(latest_grades(&grades, Grader::Judge).is_empty());
    }
}
