//! The whole `firstword bench` run: requests with a progress bar, then CSV, chart, summary
//! table, decision and optional score.

use std::path::PathBuf;

use indicatif::{ProgressBar, ProgressStyle};

use super::quality::{judge_run, Grader, JudgeConfig, RunDir};
use super::verdict_report::{run_verdict, server_figures, verdict_text, write_verdict};
use super::{
    check_plot_path, decide, load_average, peak_rss_mb, plot, run_measured, summarize, table, write_csv, BenchConfig,
    BenchError, Rules, Scenarios, Verdict, Weights,
};

/// Rows per server and repetition of the text scenarios: the turns, the four voice turns, the
/// interleaved job and the turn after it, two decode runs, three tool checks, the two
/// alternating conversations' turns, and the turn after a restart where the server has a
/// restart command; then the media scenario's requests where it runs; the together
/// scenario's (the satellites' turns, the command alone, the long reply alone, the two at
/// once) when it runs alone; the changed-head scenario's turns in each of its three layouts
/// when it runs alone.
fn requests_per_run(config: &BenchConfig, restarts: bool) -> u64 {
    let turns = u64::from(config.turns);
    let text = if config.scenarios.text() { turns + 4 + 2 + 2 + 3 + 2 * turns + u64::from(restarts) } else { 0 };
    let together = if config.scenarios == Scenarios::Together { 2 * turns + 4 } else { 0 };
    let changed_head = if config.scenarios == Scenarios::ChangedHead { 3 * turns } else { 0 };
    text + together + changed_head + if config.scenarios.media() { super::media::media_requests() } else { 0 }
}

/// Fails early, with the server named, when a server does not answer at all.
async fn check_reachable(config: &BenchConfig) -> Result<(), BenchError> {
    let client = reqwest::Client::builder()
        .timeout(std::time::Duration::from_secs(10))
        .build()
        .map_err(BenchError::HttpClient)?;
    for target in config.targets.iter().filter(|t| t.serve.is_none()) {
        let url = format!("{}/v1/models", super::base(&target.url));
        if let Err(error) = client.get(&url).send().await {
            return Err(BenchError::Unreachable { name: target.name.clone(), url, error });
        }
    }
    Ok(())
}

/// Where the results go besides stdout.
#[derive(Clone, Debug, Default)]
pub struct Outputs {
    /// One CSV row per request.
    pub csv: Option<PathBuf>,
    /// The TTFT chart (SVG).
    pub plot: Option<PathBuf>,
    /// The weighted verdict (`--quality`, or `--weights` given).
    pub verdict: Option<VerdictOptions>,
    /// The judge model that grades the quality answers (`--judge`).
    pub judge: Option<JudgeConfig>,
}

/// How the weighted verdict is made.
#[derive(Clone, Debug)]
pub struct VerdictOptions {
    /// The metrics' weights.
    pub weights: Weights,
    /// The server in use now [default: the first measured].
    pub incumbent: Option<String>,
    /// How much a weighted score must beat the incumbent's by.
    pub switch_margin: f64,
    /// Whose blind grades count: a person's, unless the judge's are asked for.
    pub by: Grader,
}

impl VerdictOptions {
    /// The margin unless asked otherwise: 5%.
    pub const DEFAULT_SWITCH_MARGIN: f64 = 0.05;

    /// The verdict's rules, the incumbent `first` (the first server measured) unless named.
    fn rules(&self, first: Option<String>) -> Rules {
        let incumbent = self.incumbent.clone().or(first).unwrap_or_default();
        Rules { weights: self.weights, incumbent, switch_margin: self.switch_margin }
    }
}

impl Default for VerdictOptions {
    fn default() -> Self {
        Self {
            weights: Weights::default(),
            incumbent: None,
            switch_margin: Self::DEFAULT_SWITCH_MARGIN,
            by: Grader::Person,
        }
    }
}

/// The verdict of a run directory by `options`, printed and written next to the answers
/// (`verdict.json`, `verdict.svg`).
///
/// # Errors
/// The directory cannot be read or written, or the incumbent was not measured.
pub fn decide_run(dir: &RunDir, options: &VerdictOptions) -> Result<Verdict, BenchError> {
    let first = dir.figures().map_err(BenchError::Quality)?.first().map(|f| f.name.clone());
    let (verdict, agreement) = run_verdict(dir, &options.rules(first), options.by)?;
    print!("{}", verdict_text(&verdict, options.by, agreement.as_ref()));
    write_verdict(dir, &verdict, options.by, agreement)?;
    Ok(verdict)
}

/// Has the judge grade every unit of the run it has not graded yet, with a line per failure.
///
/// # Errors
/// The directory cannot be read or a grade not written.
pub async fn judge(dir: &RunDir, config: &JudgeConfig) -> Result<(), BenchError> {
    eprintln!("the judge at {} grades the answers blind", config.url);
    let report = judge_run(dir, config, |key, outcome| {
        if let Err(why) = outcome {
            eprintln!("  judge: {} sample {}: {why}", key.item, key.sample);
        }
    })
    .await
    .map_err(BenchError::Quality)?;
    println!(
        "judge: {} units graded now, {} before, {} without a usable grade",
        report.graded,
        report.already,
        report.failures.len()
    );
    Ok(())
}

/// Runs the benchmark and prints the report.
///
/// # Errors
/// Bad settings ([`BenchError::NoTargets`], [`BenchError::NotSvg`]), a server that does not
/// answer at all ([`BenchError::Unreachable`]), the HTTP client, or writing the CSV or chart.
/// Server failures after that are not errors: they are counted in the report.
pub async fn execute(config: &BenchConfig, outputs: &Outputs) -> Result<(), BenchError> {
    if config.targets.is_empty() {
        return Err(BenchError::NoTargets);
    }
    if let Some(path) = &outputs.plot {
        check_plot_path(path)?;
    }
    check_reachable(config).await?;
    if config.busy_cores > 0 {
        eprintln!("{} cores kept busy by spinning threads for the whole run (--busy-cores)", config.busy_cores);
    }
    let load_before = load_average();
    if let Some(load) = load_before.filter(|&l| l > 0.5) {
        eprintln!("warning: load average {load:.2} before the run; other work on this machine skews the numbers");
    }
    let per_rep: u64 = config.targets.iter().map(|t| requests_per_run(config, t.restart.is_some())).sum();
    let quality = config.quality.as_ref().map_or(0, |q| q.requests() * config.targets.len() as u64);
    let total = u64::from(config.reps) * per_rep + quality;
    let bar = ProgressBar::new(total);
    bar.set_style(
        ProgressStyle::with_template("{bar:30} {pos}/{len} requests, {elapsed} {msg}")
            .map_err(BenchError::ProgressBar)?,
    );
    let mut highest_load = load_before.unwrap_or(0.0);
    let (rows, served_peaks) = run_measured(config, |row| {
        bar.inc(1);
        let ttft = row.ttft_ms.map_or(String::new(), |t| format!(" ttft {t:.0} ms"));
        let error = if row.error.is_empty() { String::new() } else { format!(" ERROR {}", row.error) };
        bar.set_message(format!("rep {} {} {:?}{ttft}{error}", row.rep, row.server, row.scenario));
        if let Some(load) = load_average() {
            highest_load = highest_load.max(load);
        }
    })
    .await?;
    bar.finish_and_clear();

    let mut rss: Vec<(String, f64)> = config
        .targets
        .iter()
        .filter(|t| t.serve.is_none())
        .filter_map(|t| t.pid.and_then(peak_rss_mb).map(|mb| (t.name.clone(), mb)))
        .collect();
    rss.extend(served_peaks);
    if let Some(path) = &outputs.csv {
        let file = std::fs::File::create(path).map_err(|error| BenchError::CreateCsv { path: path.clone(), error })?;
        write_csv(&rows, file).map_err(|error| BenchError::WriteCsv { path: path.clone(), error })?;
    }
    if let Some(path) = &outputs.plot {
        plot(&rows, path)?;
    }
    let summaries = summarize(&rows, &rss);
    println!("{}", table(&summaries));
    // The decision rests on the text scenarios (the tool check, warm TTFT).
    if config.scenarios.text() {
        match decide(&summaries) {
            Ok(winner) => println!("decision: {winner}"),
            Err(none) => println!("decision: {none}"),
        }
    }
    if let Some(quality) = &config.quality {
        quality.dir.write_figures(&server_figures(&summaries)).map_err(BenchError::Quality)?;
        println!("answers to the quality set are in {}", quality.dir.path().display());
        if let Some(judge_config) = &outputs.judge {
            judge(&quality.dir, judge_config).await?;
        }
        if let Some(options) = &outputs.verdict {
            decide_run(&quality.dir, options)?;
        }
        println!(
            "grade them blind: firstword bench grade {0}, then firstword bench verdict {0}",
            quality.dir.path().display()
        );
    } else if let Some(options) = &outputs.verdict {
        // No quality set: the verdict says that speed alone does not decide.
        let rules = options.rules(config.targets.first().map(|t| t.name.clone()));
        let verdict = super::verdict(&server_figures(&summaries), &[], &rules).map_err(BenchError::Verdict)?;
        print!("{}", verdict_text(&verdict, options.by, None));
    }
    if !rss.is_empty() {
        println!("peak RSS is VmHWM from /proc; unified-memory GPUs (Apple, some APUs) keep model buffers outside it");
    }
    // The servers themselves load the machine: warn only beyond what one request at a time explains.
    let cores = std::thread::available_parallelism().map_or(1, usize::from) as f64;
    // The busy cores asked for are load too.
    if highest_load > cores + 1.0 + f64::from(config.busy_cores) {
        println!("warning: load average reached {highest_load:.2} on {cores} CPUs; repeat on an idle machine");
    }
    Ok(())
}
