//! `firstword bench`'s flags, and its two subcommands: `bench grade` (the blind grading page)
//! and `bench verdict` (the weighted verdict of a run directory).

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Subcommand};
use firstword::bench::quality::{Grader, JudgeConfig, QualityRun, QualitySet, RunDir};
use firstword::bench::{BenchConfig, Outputs, Scenarios, Target, VerdictOptions, Weights};

/// `firstword bench`.
#[derive(Args)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub(crate) struct BenchArgs {
    /// Grade a run's answers blind, or decide.
    #[command(subcommand)]
    pub action: Option<BenchAction>,
    /// Server base URL (repeat to compare servers; they run in turn each repetition).
    #[arg(long = "url", required = true)]
    pub urls: Vec<String>,
    /// Names for the servers, in --url order [default: the URLs].
    #[arg(long = "name")]
    pub names: Vec<String>,
    /// Process ids of the servers, in --url order, to report their peak memory.
    #[arg(long = "pid")]
    pub pids: Vec<u32>,
    /// Shell commands that restart the servers, in --url order (one per server, or none):
    /// scenario R then measures the conversation's first turn after a restart. Each returns
    /// once its server is restarted; its last line of output, if a number, is the new pid.
    #[arg(long = "restart", value_name = "COMMAND")]
    pub restarts: Vec<String>,
    /// Start and stop a server yourself: NAME (a --name) is started with COMMAND (a shell
    /// command that serves on that server's --url) before its turn in each repetition and
    /// stopped after, so only one candidate is in memory at a time; the order alternates per
    /// repetition. Its peak memory is read before it stops.
    #[arg(long = "serve", value_name = "NAME=COMMAND")]
    pub serves: Vec<String>,
    /// Size of the generated system prompt, in tokens (approximate).
    #[arg(long = "system-tokens", default_value_t = 4000, conflicts_with = "system_prompt_file")]
    pub system_tokens: usize,
    /// Use this file as the system prompt instead.
    #[arg(long = "system-prompt-file")]
    pub system_prompt_file: Option<PathBuf>,
    /// Conversation turns (the first is cold).
    #[arg(long, default_value_t = 5)]
    pub turns: u32,
    /// Repetitions.
    #[arg(long, default_value_t = 3)]
    pub reps: u32,
    /// Tokens generated per conversation turn.
    #[arg(long = "turn-tokens", default_value_t = 32)]
    pub turn_tokens: u32,
    /// Tokens generated in the decode-speed scenarios.
    #[arg(long = "decode-tokens", default_value_t = 128)]
    pub decode_tokens: u32,
    /// `model` sent in requests.
    #[arg(long, default_value = "default")]
    pub model: String,
    /// Write one CSV row per request here.
    #[arg(long)]
    pub csv: Option<PathBuf>,
    /// Draw TTFT per turn per server into this SVG file.
    #[arg(long)]
    pub plot: Option<PathBuf>,
    /// Print the weighted verdict with these weights [default with --quality:
    /// quality=0.4,decode=0.25,ttft=0.2,rss=0.15].
    #[arg(long)]
    pub weights: Option<Weights>,
    /// The verdict: the server in use now [default: the first --url].
    #[arg(long)]
    pub incumbent: Option<String>,
    /// The verdict: how much another server's weighted score must beat the incumbent's by.
    #[arg(long = "switch-margin", default_value_t = VerdictOptions::DEFAULT_SWITCH_MARGIN)]
    pub switch_margin: f64,
    /// Also answer a quality set for blind grading: a JSONL file, or the built-in set when no
    /// file is given. The answers go into --run-dir.
    #[arg(long, num_args = 0..=1, default_missing_value = "builtin", value_name = "FILE")]
    pub quality: Option<PathBuf>,
    /// Run only the quality set (no speed scenarios).
    #[arg(long = "quality-only", requires = "quality", conflicts_with_all = ["media", "media_only", "together_only", "changed_head_only"])]
    pub quality_only: bool,
    /// Seeded samples per quality item (1: one greedy answer).
    #[arg(long = "quality-samples", default_value_t = 1)]
    pub quality_samples: u32,
    /// Where a quality run keeps its answers, grades and verdict [default:
    /// bench-runs/YYYYMMDD-HHMMSS].
    #[arg(long = "run-dir")]
    pub run_dir: Option<PathBuf>,
    /// A judge model's server (any OpenAI-compatible URL) that also grades the answers blind.
    #[command(flatten)]
    pub judge: JudgeArgs,
    /// Whose blind grades the verdict counts: person, or judge (only when asked: the judge
    /// never decides alone otherwise).
    #[arg(long = "verdict-by", default_value = "person")]
    pub verdict_by: Grader,
    /// Per-request timeout in seconds.
    #[arg(long, default_value_t = 600)]
    pub timeout: u64,
    /// The voice scenarios' end-of-turn pause, ms: silence after the last word before the
    /// final request (what a voice pipeline's VAD waits).
    #[arg(long = "vad-ms", default_value_t = BenchConfig::DEFAULT_VAD.as_millis() as u64)]
    pub vad_ms: u64,
    /// Reply tokens each prefill of the spoken scenarios asks to generate ahead (`pregenerate`).
    #[arg(long = "pregenerate", default_value_t = BenchConfig::DEFAULT_PREGENERATE)]
    pub pregenerate: u32,
    /// Keep this many cores busy for the whole run (a spinning thread each, pinned nowhere):
    /// measures the servers next to other work.
    #[arg(long = "busy-cores", default_value_t = 0)]
    pub busy_cores: u32,
    /// Also run the media scenario, for servers started with a projector (--mmproj): sentences
    /// spoken by espeak-ng sent as input_audio parts to transcribe (word error rate), and the
    /// silent-failure probe (distinct clips and pictures must get distinct answers).
    #[arg(long)]
    pub media: bool,
    /// Run only the media scenario.
    #[arg(long = "media-only", conflicts_with = "media")]
    pub media_only: bool,
    /// Run only the together scenario (several conversations at once).
    #[arg(long = "together-only", conflicts_with_all = ["media", "media_only"])]
    pub together_only: bool,
    /// Run only the changed-head scenario: Home Assistant sessions with a fixed system message,
    /// with the clock (and the devices' states) at its end, and with the clock first.
    #[arg(long = "changed-head-only", conflicts_with_all = ["media", "media_only", "together_only"])]
    pub changed_head_only: bool,
    /// Devices in the changed-head scenario's home.
    #[arg(long = "home-entities", default_value_t = BenchConfig::DEFAULT_HOME_ENTITIES)]
    pub home_entities: usize,
}

impl BenchArgs {
    /// The benchmark's configuration.
    ///
    /// # Errors
    /// The system prompt file cannot be read.
    pub(crate) fn config(&self) -> anyhow::Result<BenchConfig> {
        let system_prompt = match &self.system_prompt_file {
            Some(path) => std::fs::read_to_string(path).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?,
            None => firstword::bench::synthetic_system_prompt(self.system_tokens),
        };
        let targets = self
            .urls
            .iter()
            .enumerate()
            .map(|(i, url)| Target {
                name: self.names.get(i).cloned().unwrap_or_else(|| url.clone()),
                url: url.clone(),
                pid: self.pids.get(i).copied(),
                restart: self.restarts.get(i).cloned(),
                serve: None,
            })
            .collect::<Vec<Target>>();
        let mut targets = targets;
        for spec in &self.serves {
            let (name, command) = spec
                .split_once('=')
                .filter(|(name, command)| !name.is_empty() && !command.trim().is_empty())
                .ok_or_else(|| anyhow::anyhow!("--serve {spec:?}: expected NAME=COMMAND"))?;
            let target = targets.iter_mut().find(|t| t.name == name).ok_or_else(|| {
                anyhow::anyhow!("--serve {name}: no --name {name} (name the --url it will listen on)")
            })?;
            target.serve = Some(command.to_string());
        }
        Ok(BenchConfig {
            targets,
            system_prompt,
            turns: self.turns.max(1),
            reps: self.reps.max(1),
            model: self.model.clone(),
            turn_tokens: self.turn_tokens,
            decode_tokens: self.decode_tokens,
            timeout: Duration::from_secs(self.timeout),
            vad: Duration::from_millis(self.vad_ms),
            pregenerate: self.pregenerate,
            busy_cores: self.busy_cores,
            home_entities: self.home_entities.max(1),
            quality: self.quality_run()?,
            scenarios: match (self.media, self.media_only, self.together_only) {
                _ if self.quality_only => Scenarios::QualityOnly,
                _ if self.changed_head_only => Scenarios::ChangedHead,
                (_, _, true) => Scenarios::Together,
                (_, true, _) => Scenarios::Media,
                (true, false, _) => Scenarios::TextAndMedia,
                (false, false, false) => Scenarios::Text,
            },
        })
    }

    /// The quality scenario: the set read, the run directory made.
    fn quality_run(&self) -> anyhow::Result<Option<QualityRun>> {
        let Some(path) = &self.quality else { return Ok(None) };
        let set = if path.as_os_str() == "builtin" { QualitySet::builtin() } else { QualitySet::load(path)? };
        let dir_path = self.run_dir.clone().unwrap_or_else(|| {
            PathBuf::from("bench-runs").join(chrono::Local::now().format("%Y%m%d-%H%M%S").to_string())
        });
        let dir = RunDir::create(&dir_path)?;
        dir.write_items(&set)?;
        Ok(Some(QualityRun { set, samples: self.quality_samples.max(1), dir }))
    }

    /// Where the results go besides the terminal.
    pub(crate) fn outputs(&self) -> Outputs {
        let verdict = (self.quality.is_some() || self.weights.is_some()).then(|| VerdictOptions {
            weights: self.weights.unwrap_or_default(),
            incumbent: self.incumbent.clone(),
            switch_margin: self.switch_margin,
            by: self.verdict_by,
        });
        Outputs { csv: self.csv.clone(), plot: self.plot.clone(), verdict, judge: self.judge.config(self.timeout) }
    }
}

/// The judge model's server.
#[derive(Args)]
pub(crate) struct JudgeArgs {
    /// The judge's base URL: it grades the quality answers blind (both orders, position bias
    /// cancelled).
    #[arg(long = "judge", value_name = "URL")]
    pub judge_url: Option<String>,
    /// `model` sent to the judge.
    #[arg(long = "judge-model", default_value = "default")]
    pub judge_model: String,
}

impl JudgeArgs {
    fn config(&self, timeout_s: u64) -> Option<JudgeConfig> {
        self.judge_url.as_ref().map(|url| JudgeConfig {
            url: url.clone(),
            model: self.judge_model.clone(),
            timeout: Duration::from_secs(timeout_s),
        })
    }
}

/// `firstword bench grade` and `firstword bench verdict`.
#[derive(Subcommand)]
pub(crate) enum BenchAction {
    /// Serve the blind grading page of a run directory on this machine: one item at a time,
    /// the answers under shuffled labels, the servers named only after the scores are saved.
    Grade(GradeArgs),
    /// The weighted verdict of a run directory (switch or stay), printed and written as
    /// verdict.json and verdict.svg; with --judge, a judge model grades first.
    Verdict(VerdictArgs),
}

/// `firstword bench grade`.
#[derive(Args)]
pub(crate) struct GradeArgs {
    /// The run directory (--run-dir of the quality run).
    pub run_dir: PathBuf,
    /// The port on 127.0.0.1.
    #[arg(long, default_value_t = 8090)]
    pub port: u16,
}

/// `firstword bench verdict`.
#[derive(Args)]
pub(crate) struct VerdictArgs {
    /// The run directory.
    pub run_dir: PathBuf,
    /// The metrics' weights.
    #[arg(long, default_value = "quality=0.4,decode=0.25,ttft=0.2,rss=0.15")]
    pub weights: Weights,
    /// The server in use now [default: the first measured].
    #[arg(long)]
    pub incumbent: Option<String>,
    /// How much another server's weighted score must beat the incumbent's by.
    #[arg(long = "switch-margin", default_value_t = VerdictOptions::DEFAULT_SWITCH_MARGIN)]
    pub switch_margin: f64,
    /// Whose blind grades count: person, or judge.
    #[arg(long, default_value = "person")]
    pub by: Grader,
    /// A judge model that grades the answers it has not graded yet, first.
    #[command(flatten)]
    pub judge: JudgeArgs,
    /// Per-request timeout for the judge, in seconds.
    #[arg(long, default_value_t = 600)]
    pub timeout: u64,
}

impl VerdictArgs {
    /// The run directory, the verdict's options and the judge.
    pub(crate) fn parts(&self) -> anyhow::Result<(RunDir, VerdictOptions, Option<JudgeConfig>)> {
        let options = VerdictOptions {
            weights: self.weights,
            incumbent: self.incumbent.clone(),
            switch_margin: self.switch_margin,
            by: self.by,
        };
        Ok((RunDir::open(&self.run_dir)?, options, self.judge.config(self.timeout)))
    }
}
