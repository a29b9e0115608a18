//! The weighted verdict: switch to another server or stay with the incumbent, decided the way a
//! careful person decides. Each metric is a ratio against the incumbent (quality: the mean
//! blind score over the units both were graded on; decode speed; warm time to first token and
//! peak memory inverted, so that more is better), weighted (quality 0.40, decode 0.25, TTFT
//! 0.20, memory 0.15 unless `--weights` says otherwise) over the metrics both have. A server
//! that fails a must-have (the tool check, the media silent-failure probe) is never chosen; a
//! server is chosen only when its weighted score beats the incumbent's by the margin and its
//! answers are not worse beyond their own spread: a faster wrong answer loses to a slower right
//! one. Pure: figures and grades in, the verdict out.

use std::collections::BTreeMap;

use serde::Serialize;

use super::error::WeightsError;
use super::quality::ServerFigures;

/// The weights of the four metrics.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Weights {
    /// Mean blind quality score.
    pub quality: f64,
    /// Decode speed after the long prompt.
    pub decode: f64,
    /// Warm time to first token (inverted).
    pub ttft: f64,
    /// Peak resident memory (inverted).
    pub rss: f64,
}

impl Default for Weights {
    /// Quality 0.40, decode 0.25, TTFT 0.20, memory 0.15.
    fn default() -> Self {
        Self { quality: 0.40, decode: 0.25, ttft: 0.20, rss: 0.15 }
    }
}

impl std::str::FromStr for Weights {
    type Err = WeightsError;

    /// `quality=0.4,decode=0.25,ttft=0.2,rss=0.15` (missing ones are 0).
    fn from_str(text: &str) -> Result<Self, WeightsError> {
        let mut weights = Self { quality: 0.0, decode: 0.0, ttft: 0.0, rss: 0.0 };
        for part in text.split(',').filter(|p| !p.trim().is_empty()) {
            let (key, value) = part.split_once('=').ok_or_else(|| WeightsError::NotKeyValue(part.to_string()))?;
            let value: f64 = value
                .trim()
                .parse()
                .ok()
                .filter(|v: &f64| v.is_finite() && *v >= 0.0)
                .ok_or_else(|| WeightsError::NotANumber { key: key.to_string(), value: value.to_string() })?;
            match key.trim() {
                "quality" => weights.quality = value,
                "decode" => weights.decode = value,
                "ttft" => weights.ttft = value,
                "rss" => weights.rss = value,
                other => return Err(WeightsError::Unknown(other.to_string())),
            }
        }
        if weights.quality + weights.decode + weights.ttft + weights.rss <= 0.0 {
            return Err(WeightsError::AllZero);
        }
        Ok(weights)
    }
}

/// What the verdict is decided by, besides the figures.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Rules {
    /// The metrics' weights.
    pub weights: Weights,
    /// The server in use now.
    pub incumbent: String,
    /// How much a weighted score must beat the incumbent's by (0.05: 5%).
    pub switch_margin: f64,
}

/// A mean with its spread (the standard error: the sample standard deviation over √n; 0 for
/// one value) and the number of values.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Estimate {
    /// The mean.
    pub mean: f64,
    /// Its standard error.
    pub spread: f64,
    /// How many values.
    pub n: usize,
}

impl Estimate {
    /// The estimate of `values`; `None` for none.
    #[must_use]
    pub fn of(values: &[f64]) -> Option<Self> {
        let n = values.len();
        if n == 0 {
            return None;
        }
        let mean = values.iter().sum::<f64>() / n as f64;
        let spread = if n > 1 {
            let variance = values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (n - 1) as f64;
            (variance / n as f64).sqrt()
        } else {
            0.0
        };
        Some(Self { mean, spread, n })
    }
}

/// Each metric's ratio against the incumbent (more is better; `None`: missing on either side).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Ratios {
    /// Mean blind score over the units both were graded on.
    pub quality: Option<f64>,
    /// Decode speed.
    pub decode: Option<f64>,
    /// Incumbent's warm TTFT over this server's.
    pub ttft: Option<f64>,
    /// Incumbent's peak memory over this server's.
    pub rss: Option<f64>,
}

/// One server in the verdict.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ServerVerdict {
    /// The server.
    pub name: String,
    /// Its mean blind score.
    pub quality: Option<Estimate>,
    /// Its score minus the incumbent's, unit by unit (matched pairs); `None` for the incumbent
    /// or without common graded units.
    pub quality_difference: Option<Estimate>,
    /// The ratios against the incumbent.
    pub ratios: Ratios,
    /// The weighted score (the incumbent's is 1), over the metrics both have.
    pub weighted: Option<f64>,
    /// Must-haves it failed.
    pub vetoes: Vec<String>,
}

/// Switch or stay.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "decision", content = "server", rename_all = "lowercase")]
pub enum Decision {
    /// Switch to this server.
    Switch(String),
    /// Stay with the incumbent.
    Stay,
}

/// The verdict, with its reason in one sentence.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Verdict {
    /// Switch or stay.
    #[serde(flatten)]
    pub decision: Decision,
    /// Why, in one sentence.
    pub reason: String,
    /// What it was decided by.
    pub rules: Rules,
    /// Every server, the incumbent first.
    pub servers: Vec<ServerVerdict>,
}

/// Why there is no verdict at all.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum VerdictError {
    /// The incumbent is not one of the servers measured.
    #[error("--incumbent {0:?} is not one of the servers measured")]
    UnknownIncumbent(String),
}

/// `a / b` for two positive, finite numbers.
fn ratio(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) if a > 0.0 && b > 0.0 && a.is_finite() && b.is_finite() => Some(a / b),
        _ => None,
    }
}

/// `server`'s verdict line against `incumbent`.
fn judge_server(
    server: &ServerFigures,
    incumbent: &ServerFigures,
    graded: &[BTreeMap<String, f64>],
    weights: Weights,
) -> ServerVerdict {
    let own: Vec<f64> = graded.iter().filter_map(|unit| unit.get(&server.name).copied()).collect();
    let paired: Vec<(f64, f64)> =
        graded.iter().filter_map(|unit| Some((*unit.get(&server.name)?, *unit.get(&incumbent.name)?))).collect();
    let is_incumbent = server.name == incumbent.name;
    let differences: Vec<f64> = paired.iter().map(|(s, i)| s - i).collect();
    let quality_ratio = if paired.is_empty() {
        None
    } else {
        ratio(Some(paired.iter().map(|p| p.0).sum()), Some(paired.iter().map(|p| p.1).sum()))
    };
    let ratios = Ratios {
        quality: quality_ratio,
        decode: ratio(server.decode_tok_s, incumbent.decode_tok_s),
        ttft: ratio(incumbent.warm_ttft_ms, server.warm_ttft_ms),
        rss: ratio(incumbent.peak_rss_mb, server.peak_rss_mb),
    };
    let weighted_terms = [
        (weights.quality, ratios.quality),
        (weights.decode, ratios.decode),
        (weights.ttft, ratios.ttft),
        (weights.rss, ratios.rss),
    ];
    let (sum, total) = weighted_terms
        .iter()
        .filter(|(w, _)| *w > 0.0)
        .filter_map(|(w, r)| r.map(|r| (w * r, *w)))
        .fold((0.0, 0.0), |(s, t), (ws, w)| (s + ws, t + w));
    ServerVerdict {
        name: server.name.clone(),
        quality: Estimate::of(&own),
        quality_difference: if is_incumbent { None } else { Estimate::of(&differences) },
        ratios,
        weighted: (total > 0.0).then(|| sum / total),
        vetoes: server.vetoes.clone(),
    }
}

/// Whether a server's answers are worse than the incumbent's beyond their own spread.
fn worse(difference: &Estimate) -> bool {
    difference.mean < -difference.spread
}

/// The verdict over the servers' `figures` and the blind grades (`graded`: one map per graded
/// unit, the score each server's answer got).
///
/// # Errors
/// [`VerdictError::UnknownIncumbent`]: the incumbent is not among `figures`.
pub fn verdict(
    figures: &[ServerFigures],
    graded: &[BTreeMap<String, f64>],
    rules: &Rules,
) -> Result<Verdict, VerdictError> {
    let incumbent = figures
        .iter()
        .find(|f| f.name == rules.incumbent)
        .ok_or_else(|| VerdictError::UnknownIncumbent(rules.incumbent.clone()))?;
    let mut servers = vec![judge_server(incumbent, incumbent, graded, rules.weights)];
    servers.extend(
        figures.iter().filter(|f| f.name != incumbent.name).map(|f| judge_server(f, incumbent, graded, rules.weights)),
    );
    let (decision, reason) = decide(&servers, rules);
    Ok(Verdict { decision, reason, rules: rules.clone(), servers })
}

/// The decision and its reason; `servers[0]` is the incumbent.
fn decide(servers: &[ServerVerdict], rules: &Rules) -> (Decision, String) {
    let incumbent = &servers[0];
    let name = &incumbent.name;
    let incumbent_vetoed = !incumbent.vetoes.is_empty();
    let needed = if incumbent_vetoed { 0.0 } else { 1.0 + rules.switch_margin };
    let eligible = |s: &ServerVerdict| {
        s.vetoes.is_empty()
            && s.quality_difference.is_some_and(|d| !worse(&d))
            && s.weighted.is_some_and(|w| w >= needed)
    };
    let best = servers[1..].iter().filter(|s| eligible(s)).fold(None::<&ServerVerdict>, |best, s| match best {
        Some(b) if b.weighted >= s.weighted => Some(b),
        _ => Some(s),
    });
    if let Some(winner) = best {
        let difference = winner.quality_difference.expect("eligible servers have a quality difference");
        let why = if incumbent_vetoed {
            format!("{name} fails a must-have ({})", incumbent.vetoes.join("; "))
        } else {
            format!(
                "weighted score {:.2} against {name}'s 1.00 (margin {:.0}%)",
                winner.weighted.unwrap_or(0.0),
                rules.switch_margin * 100.0
            )
        };
        let reason = format!(
            "switch to {}: {why}, and its answers are not worse (quality {:+.2} ± {:.2} over {} items)",
            winner.name, difference.mean, difference.spread, difference.n
        );
        return (Decision::Switch(winner.name.clone()), reason);
    }
    // The strongest contender on speed and memory explains why nobody wins.
    let contender = servers[1..].iter().fold(None::<&ServerVerdict>, |best, s| match best {
        Some(b) if b.weighted >= s.weighted => Some(b),
        _ => Some(s),
    });
    let reason = match contender {
        None => format!("stay with {name}: no other server was measured"),
        Some(other) if !other.vetoes.is_empty() => {
            format!("stay with {name}: {} fails a must-have ({})", other.name, other.vetoes.join("; "))
        }
        Some(other) => match other.quality_difference {
            None => format!("stay with {name}: {} has no blind quality grades next to {name}'s, and speed alone does not decide", other.name),
            Some(d) if worse(&d) => format!(
                "stay with {name}: {} scores {:.2} on the weights but its answers are worse ({:+.2} ± {:.2} over {} items)",
                other.name,
                other.weighted.unwrap_or(0.0),
                d.mean,
                d.spread,
                d.n
            ),
            Some(_) => format!(
                "stay with {name}: {} scores {:.2} against 1.00, within the {:.0}% margin",
                other.name,
                other.weighted.unwrap_or(0.0),
                rules.switch_margin * 100.0
            ),
        },
    };
    (Decision::Stay, reason)
}

#[cfg(test)]
mod tests;
