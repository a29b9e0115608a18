//! The verdict of a run directory: the servers' figures as the run measured them, the blind
//! grades of the chosen grader, the verdict printed as a table and its sentence, and written as
//! `verdict.json` and `verdict.svg` (each metric's ratio against the incumbent and the
//! weighted score, per server).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use plotters::prelude::*;
use serde_json::json;

use super::error::BenchError;
use super::media::ProbeVerdict;
use super::quality::{agreement, latest_grades, Agreement, Grader, RunDir, ServerFigures};
use super::report::Summary;
use super::verdict::{verdict, Rules, Verdict};

/// The figures the verdict weighs, from the run's summaries: decode after the long prompt,
/// mean warm TTFT, peak memory, and the must-haves failed.
#[must_use]
pub fn server_figures(summaries: &[Summary]) -> Vec<ServerFigures> {
    summaries
        .iter()
        .map(|s| {
            let mut vetoes = Vec::new();
            let (passed, total) = s.tool_passes;
            if total > 0 && passed < total {
                vetoes.push(format!(
                    "tool check failed {} of {total}{}",
                    total - passed,
                    s.tool_failure.as_ref().map_or(String::new(), |why| format!(": {why}"))
                ));
            }
            for (what, probe) in s.media.iter().flat_map(|m| [("audio", m.audio.as_ref()), ("image", m.image.as_ref())])
            {
                if let Some(failure @ ProbeVerdict::Same { .. }) = probe {
                    vetoes.push(format!("{what} probe {failure}"));
                }
            }
            ServerFigures {
                name: s.server.clone(),
                decode_tok_s: s.decode_long.map(|d| d.median),
                warm_ttft_ms: s.warm_ttft_mean,
                peak_rss_mb: s.peak_rss_mb,
                vetoes,
            }
        })
        .collect()
}

/// The verdict of `dir` by `grader`'s grades, with the judge's agreement with the person.
///
/// # Errors
/// [`BenchError::Quality`]: the directory cannot be read; [`BenchError::Verdict`]: the
/// incumbent was not measured.
pub fn run_verdict(dir: &RunDir, rules: &Rules, grader: Grader) -> Result<(Verdict, Option<Agreement>), BenchError> {
    let figures = dir.figures().map_err(BenchError::Quality)?;
    let grades = dir.grades().map_err(BenchError::Quality)?;
    let graded: Vec<BTreeMap<String, f64>> =
        latest_grades(&grades, grader).into_values().map(|g| g.scores.clone()).collect();
    let verdict = verdict(&figures, &graded, rules).map_err(BenchError::Verdict)?;
    Ok((verdict, agreement(&grades)))
}

/// Writes `verdict.json` and `verdict.svg` into the run directory.
///
/// # Errors
/// [`BenchError::Quality`] or [`BenchError::Drawing`].
pub fn write_verdict(
    dir: &RunDir,
    verdict: &Verdict,
    grader: Grader,
    agreement: Option<Agreement>,
) -> Result<(), BenchError> {
    let value = json!({"graded_by": grader, "verdict": verdict, "judge_agreement": agreement});
    let text = serde_json::to_string_pretty(&value).unwrap_or_default();
    dir.write("verdict.json", text.as_bytes()).map_err(BenchError::Quality)?;
    plot_verdict(verdict, &dir.file("verdict.svg"))
}

fn cell(value: Option<f64>) -> String {
    value.map_or_else(|| "-".to_string(), |v| format!("{v:.2}"))
}

/// The verdict as text: its sentence, the table of ratios, the judge's agreement.
#[must_use]
pub fn verdict_text(verdict: &Verdict, grader: Grader, agreement: Option<&Agreement>) -> String {
    let who = match grader {
        Grader::Person => "a person",
        Grader::Judge => "the judge model",
    };
    let mut text = format!("verdict (quality graded blind by {who}): {}\n", verdict.reason);
    let _ = writeln!(
        text,
        "  server | quality (mean ± spread, items) | ×quality | ×decode | ×ttft | ×rss | weighted | vetoes"
    );
    for s in &verdict.servers {
        let quality =
            s.quality.map_or_else(|| "-".to_string(), |q| format!("{:.2} ± {:.2}, {}", q.mean, q.spread, q.n));
        let _ = writeln!(
            text,
            "  {} | {quality} | {} | {} | {} | {} | {} | {}",
            s.name,
            cell(s.ratios.quality),
            cell(s.ratios.decode),
            cell(s.ratios.ttft),
            cell(s.ratios.rss),
            cell(s.weighted),
            if s.vetoes.is_empty() { "-".to_string() } else { s.vetoes.join("; ") }
        );
    }
    if let Some(a) = agreement {
        let share = if a.pairs == 0 { 0.0 } else { 100.0 * a.agreeing as f64 / a.pairs as f64 };
        let _ = writeln!(
            text,
            "  the judge's grades agree with the person's on {} of {} comparisons ({share:.0}%); scores differ by {:.2} on average",
            a.agreeing, a.pairs, a.mean_abs_difference
        );
        for (server, (person, judge)) in &a.means {
            let _ = writeln!(text, "  {server}: mean score {person:.2} from the person, {judge:.2} from the judge");
        }
    }
    text
}

/// The chart: per server, each metric's ratio against the incumbent and the weighted score.
fn plot_verdict(verdict: &Verdict, path: &Path) -> Result<(), BenchError> {
    let metrics = ["quality", "decode", "TTFT", "memory", "weighted"];
    let values: Vec<[Option<f64>; 5]> = verdict
        .servers
        .iter()
        .map(|s| [s.ratios.quality, s.ratios.decode, s.ratios.ttft, s.ratios.rss, s.weighted])
        .collect();
    let highest = values.iter().flatten().flatten().fold(1.0f64, |a, &b| a.max(b)) * 1.15;
    let root = SVGBackend::new(path, (900, 520)).into_drawing_area();
    let draw = |e: &dyn std::fmt::Display| BenchError::Drawing { path: path.to_path_buf(), message: e.to_string() };
    root.fill(&WHITE).map_err(|e| draw(&e))?;
    let slots = (metrics.len() * (verdict.servers.len() + 1)) as f64;
    let mut chart = ChartBuilder::on(&root)
        .caption(format!("Against {} (= 1): more is better", verdict.rules.incumbent), ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..slots, 0.0..highest)
        .map_err(|e| draw(&e))?;
    let group = verdict.servers.len() + 1;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(slots as usize + 1)
        .x_label_formatter(&|x| {
            let slot = x.floor() as usize;
            if slot % group == group / 2 && slot / group < metrics.len() {
                metrics[slot / group].to_string()
            } else {
                String::new()
            }
        })
        .y_desc("ratio against the incumbent")
        .draw()
        .map_err(|e| draw(&e))?;
    for (i, (server, row)) in verdict.servers.iter().zip(&values).enumerate() {
        let color = Palette99::pick(i).to_rgba();
        let bars = row.iter().enumerate().filter_map(|(m, v)| {
            let x = (m * group + i) as f64;
            v.map(|v| Rectangle::new([(x + 0.1, 0.0), (x + 0.9, v)], color.filled()))
        });
        chart
            .draw_series(bars)
            .map_err(|e| draw(&e))?
            .label(server.name.as_str())
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], color.filled()));
    }
    chart.draw_series(LineSeries::new([(0.0, 1.0), (slots, 1.0)], BLACK.stroke_width(1))).map_err(|e| draw(&e))?;
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(|e| draw(&e))?;
    root.present().map_err(|e| draw(&e))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::verdict::{Decision, Weights};
    use super::*;

    #[test]
    fn the_text_names_the_grader_and_every_server() {
        let figures = [
            ServerFigures { name: "a".into(), decode_tok_s: Some(10.0), ..ServerFigures::default() },
            ServerFigures {
                name: "b".into(),
                decode_tok_s: Some(20.0),
                vetoes: vec!["tool check failed 3 of 3".into()],
                ..ServerFigures::default()
            },
        ];
        let rules = Rules { weights: Weights::default(), incumbent: "a".into(), switch_margin: 0.05 };
        let verdict = verdict(&figures, &[], &rules).expect("verdict");
        assert_eq!(verdict.decision, Decision::Stay);
        let text = verdict_text(&verdict, Grader::Judge, None);
        let agreement = Agreement {
            means: [("a".to_string(), (4.0, 3.5))].into(),
            pairs: 4,
            agreeing: 3,
            mean_abs_difference: 0.5,
        };
        let both = verdict_text(&verdict, Grader::Person, Some(&agreement));
        assert!(
            both.contains("agree with the person's on 3 of 4 comparisons (75%)")
                && both.contains("  a: mean score 4.00 from the person, 3.50 from the judge"),
            "{both}"
        );
        assert!(text.starts_with("verdict (quality graded blind by the judge model): stay with a: b fails"), "{text}");
        assert!(text.contains("  b | - | - | 2.00 | - | - | 2.00 | tool check failed 3 of 3"), "{text}");
        let path = std::env::temp_dir().join(format!("firstword-verdict-{}.svg", std::process::id()));
        plot_verdict(&verdict, &path).expect("verdict");
        let svg = std::fs::read_to_string(&path).expect("verdict");
        assert!(svg.contains("Against a (= 1)") && svg.contains("weighted"), "{svg}");
        std::fs::remove_file(path).expect("verdict");
    }
}
