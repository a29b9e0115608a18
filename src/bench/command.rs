//! The whole `firstword bench` run: requests with a progress bar, then CSV, chart, summary
//! table, decision and optional score.

use std::path::PathBuf;

use indicatif::{ProgressBar, ProgressStyle};

use super::{
    check_plot_path, decide, load_average, peak_rss_mb, plot, run, scores, summarize, table, write_csv, BenchConfig,
    BenchError, Scenarios, Weights,
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
    for target in &config.targets {
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
    /// Weights for the optional score.
    pub weights: Option<Weights>,
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
    let total = u64::from(config.reps) * per_rep;
    let bar = ProgressBar::new(total);
    bar.set_style(
        ProgressStyle::with_template("{bar:30} {pos}/{len} requests, {elapsed} {msg}")
            .map_err(BenchError::ProgressBar)?,
    );
    let mut highest_load = load_before.unwrap_or(0.0);
    let rows = run(config, |row| {
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

    let rss: Vec<(String, f64)> =
        config.targets.iter().filter_map(|t| t.pid.and_then(peak_rss_mb).map(|mb| (t.name.clone(), mb))).collect();
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
    if let Some(weights) = outputs.weights.filter(|_| config.scenarios.text()) {
        for (server, score) in scores(&summaries, weights) {
            println!("score {server}: {score:.3}");
        }
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
