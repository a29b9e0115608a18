//! The run: every server, repetition after repetition, each one's scenarios in turn (the
//! order alternated per repetition when the bench starts the servers itself, `--serve`).

use super::media::MediaInputs;
use super::report::Row;
use super::serve::Served;
use super::BusyLoad;
use super::{base, BenchConfig, BenchError, Scenarios, ServerRun};

/// Runs every scenario for every server and repetition; `progress` is called after each
/// request with the row. Never panics on server misbehaviour: it ends up in the rows.
///
/// # Errors
/// As [`run_measured`].
pub async fn run(config: &BenchConfig, progress: impl FnMut(&Row)) -> Result<Vec<Row>, BenchError> {
    Ok(run_measured(config, progress).await?.0)
}

/// [`run`], and the peak memory of the servers the bench started itself (`--serve`), read
/// before each was stopped (the highest of its repetitions), MB.
///
/// # Errors
/// [`BenchError::HttpClient`]: the HTTP client cannot be built; for the media scenario,
/// [`BenchError::NoEspeak`] or [`BenchError::Espeak`]: its clips cannot be spoken;
/// [`BenchError::Serve`]: a server the bench starts does not come up;
/// [`BenchError::Quality`]: an answer cannot be written to the run directory.
pub async fn run_measured(
    config: &BenchConfig,
    mut progress: impl FnMut(&Row),
) -> Result<(Vec<Row>, Vec<(String, f64)>), BenchError> {
    // A fresh connection per request, for every server alike: a pooled keep-alive connection
    // that the server closed while idle fails the next request on the client's side.
    let client = reqwest::Client::builder()
        .timeout(config.timeout)
        .pool_max_idle_per_host(0)
        .build()
        .map_err(BenchError::HttpClient)?;
    let quality_media = config.quality.as_ref().is_some_and(|q| q.set.uses_media());
    let media = if config.scenarios.media() || quality_media { Some(MediaInputs::prepare().await?) } else { None };
    let _busy = BusyLoad::start(config.busy_cores);
    let mut rows = Vec::new();
    let mut pids: Vec<Option<u32>> = config.targets.iter().map(|t| t.pid).collect();
    let mut served_peaks: Vec<(String, f64)> = Vec::new();
    let alternate = config.targets.iter().any(|t| t.serve.is_some());
    for rep in 1..=config.reps {
        let mut order: Vec<usize> = (0..config.targets.len()).collect();
        if alternate && rep % 2 == 0 {
            order.reverse();
        }
        for index in order {
            let target = &config.targets[index];
            let served = match &target.serve {
                Some(command) => Some(Served::start(&target.name, command, base(&target.url), config.timeout).await?),
                None => None,
            };
            let mut bench = ServerRun {
                config,
                client: &client,
                target,
                pid: &mut pids[index],
                rep,
                rows: &mut rows,
                progress: &mut progress,
            };
            if config.scenarios.text() {
                bench.text_scenarios().await;
            }
            if config.scenarios == Scenarios::Together {
                bench.together_scenario().await;
            }
            if config.scenarios == Scenarios::ChangedHead {
                bench.changed_head_scenario().await;
            }
            if let Some(media) = media.as_ref().filter(|_| config.scenarios.media()) {
                bench.media_scenarios(media).await;
            }
            if let Some(quality) = config.quality.as_ref().filter(|_| rep == 1) {
                bench.quality_scenario(quality, media.as_ref()).await.map_err(BenchError::Quality)?;
            }
            if let Some(served) = served {
                if let Some(mb) = served.peak_rss_mb() {
                    match served_peaks.iter_mut().find(|(name, _)| *name == target.name) {
                        Some((_, peak)) => *peak = peak.max(mb),
                        None => served_peaks.push((target.name.clone(), mb)),
                    }
                }
                served.stop().await;
            }
        }
    }
    Ok((rows, served_peaks))
}
