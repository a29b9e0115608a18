//! Speculative decoding settings: which drafter runs (the model's own MTP heads, a separate
//! draft model, or none), why, and how many tokens it proposes per step.

use std::path::{Path, PathBuf};

use llama_cpp_2::gguf::GgufContext;

use super::EngineError;

/// Which speculative decoding to use, as `--spec`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SpecMode {
    /// MTP when the GGUF has NextN layers, else the draft model if one is given, else none.
    #[default]
    Auto,
    /// No speculation.
    None,
    /// The model's multi-token-prediction (NextN) heads draft for it.
    Mtp,
    /// A separate, smaller model with the same vocabulary drafts.
    Draft,
}

/// Speculative decoding settings.
#[derive(Clone, Debug, PartialEq)]
pub struct SpeculationConfig {
    /// Which drafter to use.
    pub mode: SpecMode,
    /// The draft model, for [`SpecMode::Draft`] (and `Auto` without NextN layers).
    pub draft_model: Option<PathBuf>,
    /// Layers of the draft model offloaded to the GPU (GPU builds only).
    pub n_gpu_layers_draft: u32,
    /// Most tokens drafted per step; `None`: 3 for MTP heads, 16 for a draft model. The depth
    /// actually verified adapts to the acceptance rate below this ceiling.
    pub draft_max: Option<u32>,
    /// Fewest tokens worth verifying; shorter drafts are dropped.
    pub draft_min: u32,
    /// Drafting stops at the first token the drafter is less sure of than this probability.
    pub draft_p_min: f32,
    /// Draft on every step, even while drafting measures slower than plain decoding (which
    /// otherwise pauses it); for measuring a drafter.
    pub always: bool,
}

impl Default for SpeculationConfig {
    fn default() -> Self {
        Self {
            mode: SpecMode::Auto,
            draft_model: None,
            n_gpu_layers_draft: super::EngineConfig::DEFAULT_N_GPU_LAYERS,
            draft_max: None,
            draft_min: 0,
            draft_p_min: 0.75,
            always: false,
        }
    }
}

/// Default ceiling for MTP heads: a single trained head degrades fast when chained.
const MTP_DRAFT_MAX: u32 = 3;
/// Default ceiling for a draft model (llama-server's).
const MODEL_DRAFT_MAX: u32 = 16;

/// The drafter chosen at start-up.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Drafter {
    None,
    /// The model's NextN layers (this many).
    Mtp {
        layers: u32,
    },
    /// A separate draft model.
    Model(PathBuf),
}

/// What start-up decided: the drafter, its limits, and the reason (for the log).
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct SpeculationPlan {
    pub drafter: Drafter,
    pub draft_max: u32,
    pub draft_min: u32,
    pub p_min: f32,
    pub always: bool,
    pub reason: String,
}

impl SpeculationPlan {
    /// Decides the drafter from the settings and the model file's metadata (read without
    /// loading the weights).
    pub(crate) fn decide(config: &SpeculationConfig, model_path: &Path) -> Result<Self, EngineError> {
        let layers = nextn_layers(model_path);
        let invalid = |message: String| Err(EngineError::SpeculationSetup(message));
        let (drafter, reason) = match (config.mode, layers, &config.draft_model) {
            (SpecMode::None, _, _) => (Drafter::None, "--spec none".to_string()),
            (SpecMode::Mtp, 0, _) => {
                return invalid(format!(
                    "--spec mtp: {} has no MTP (NextN) layers (no `<arch>.nextn_predict_layers` in its metadata); use --spec draft with --draft-model, or --spec none",
                    model_path.display()
                ))
            }
            (SpecMode::Mtp, n, _) | (SpecMode::Auto, n @ 1.., _) => {
                (Drafter::Mtp { layers: n }, format!("the model has {n} MTP (NextN) layer(s)"))
            }
            (SpecMode::Draft | SpecMode::Auto, _, Some(path)) => {
                (Drafter::Model(path.clone()), format!("draft model {}", path.display()))
            }
            (SpecMode::Draft, _, None) => return invalid("--spec draft needs --draft-model PATH".into()),
            (SpecMode::Auto, _, None) => (Drafter::None, "the model has no MTP (NextN) layers and no --draft-model is given".into()),
        };
        if config.mode == SpecMode::None && config.draft_model.is_some() {
            tracing::warn!("--draft-model is ignored with --spec none");
        }
        let draft_max = config.draft_max.unwrap_or(match drafter {
            Drafter::Mtp { .. } => MTP_DRAFT_MAX,
            _ => MODEL_DRAFT_MAX,
        });
        if draft_max == 0 || draft_max > 64 {
            return invalid(format!("--draft-max must be between 1 and 64, got {draft_max}"));
        }
        if config.draft_min > draft_max {
            return invalid(format!("--draft-min ({}) is larger than --draft-max ({draft_max})", config.draft_min));
        }
        if !(0.0..=1.0).contains(&config.draft_p_min) {
            return invalid(format!("--draft-p-min must be between 0 and 1, got {}", config.draft_p_min));
        }
        Ok(Self {
            drafter,
            draft_max,
            draft_min: config.draft_min,
            p_min: config.draft_p_min,
            always: config.always,
            reason,
        })
    }
}

/// `<arch>.nextn_predict_layers` from the GGUF header; 0 when absent or unreadable.
fn nextn_layers(model_path: &Path) -> u32 {
    let Some(gguf) = GgufContext::from_file(model_path) else { return 0 };
    let arch_key = gguf.find_key("general.architecture");
    if arch_key < 0 || gguf.kv_type(arch_key) != llama_cpp_sys_2::GGUF_TYPE_STRING {
        return 0;
    }
    let Some(arch) = gguf.val_str(arch_key) else { return 0 };
    let key = gguf.find_key(&format!("{arch}.nextn_predict_layers"));
    if key < 0 {
        return 0;
    }
    match gguf.kv_type(key) {
        llama_cpp_sys_2::GGUF_TYPE_UINT32 => gguf.val_u32(key),
        llama_cpp_sys_2::GGUF_TYPE_INT32 => u32::try_from(gguf.val_i32(key)).unwrap_or(0),
        _ => 0,
    }
}

/// The first difference between two vocabularies (size, then token texts), for the error that
/// refuses a draft model whose tokens would mean something else to the target.
pub(crate) fn vocabulary_difference<'a>(
    target: impl ExactSizeIterator<Item = &'a [u8]>,
    draft: impl ExactSizeIterator<Item = &'a [u8]>,
) -> Option<String> {
    if target.len() != draft.len() {
        return Some(format!("the target has {} tokens, the draft model {}", target.len(), draft.len()));
    }
    target.zip(draft).enumerate().find(|(_, (a, b))| a != b).map(|(id, (a, b))| {
        format!(
            "token {id} is {:?} in the target and {:?} in the draft model",
            String::from_utf8_lossy(a),
            String::from_utf8_lossy(b)
        )
    })
}

/// How many drafted tokens to verify next. The depth follows the recent run of accepted drafts,
/// so a drafter that is often wrong costs little and one that is usually right is used deeply;
/// and speculation pauses (depth 0) while it measures slower per token than plain decoding,
/// which it does whenever drafting costs more than it saves (a draft model nearly as large as
/// the target, a tiny target). The way not taken is measured again after [`PROBE_EVERY`]
/// steps, and after twice as many each time a measurement confirms the choice (up to
/// [`MAX_PROBE_INTERVAL`]), so probing a losing drafter costs little.
#[derive(Clone, Debug)]
pub(crate) struct DraftDepth {
    ceiling: usize,
    /// Moving average of accepted drafts per step (a fully accepted step counts one more, as
    /// the drafter might have gone on being right).
    average_run: f32,
    /// Moving averages of seconds per generated token, without and with drafts.
    plain_cost: Option<f32>,
    draft_cost: Option<f32>,
    /// Steps since the way not preferred was last measured, and how many to wait.
    since_probe: u64,
    probe_interval: u64,
    /// The preference when the step being measured was chosen as a probe.
    probing: Option<bool>,
    /// Never pause drafting.
    always: bool,
}

/// Steps before the way not preferred is first measured again.
pub(crate) const PROBE_EVERY: u64 = 16;
/// Longest wait between measurements.
pub(crate) const MAX_PROBE_INTERVAL: u64 = 1024;
/// While drafting is paused, a probe waits while the drafter would first have to evaluate more
/// than this many tokens it has not seen (a paused draft model falls behind the target), until
/// the interval has grown to its longest.
pub(crate) const PROBE_MAX_BACKLOG: usize = 32;

impl DraftDepth {
    pub(crate) fn new(ceiling: u32, always: bool) -> Self {
        let ceiling = ceiling.max(1) as usize;
        Self {
            ceiling,
            average_run: ceiling.min(4) as f32 - 1.0,
            plain_cost: None,
            draft_cost: None,
            since_probe: 0,
            probe_interval: PROBE_EVERY,
            probing: None,
            always,
        }
    }

    fn prefers_drafts(&self) -> bool {
        match (self.plain_cost, self.draft_cost) {
            (Some(plain), Some(drafts)) => drafts <= plain,
            _ => true,
        }
    }

    /// Tokens to draft and verify in the next step, for a drafter `backlog()` tokens behind
    /// the target (asked only when a paused drafter is due for a probe); 0 for a plain step.
    pub(crate) fn next(&mut self, backlog: impl FnOnce() -> usize) -> usize {
        let drafting = ((self.average_run + 1.0).round() as usize).clamp(1, self.ceiling);
        if self.always {
            return drafting;
        }
        if self.plain_cost.is_none() {
            return 0;
        }
        let prefer_drafts = self.prefers_drafts();
        self.since_probe += 1;
        let probe = self.since_probe >= self.probe_interval
            && (prefer_drafts || self.probe_interval >= MAX_PROBE_INTERVAL || backlog() <= PROBE_MAX_BACKLOG);
        if probe {
            self.since_probe = 0;
            self.probing = Some(prefer_drafts);
        }
        if prefer_drafts != probe {
            drafting
        } else {
            0
        }
    }

    /// Records a verified step: `proposed` drafts, of which the first `accepted` matched.
    pub(crate) fn record(&mut self, proposed: usize, accepted: usize) {
        if proposed == 0 {
            return;
        }
        let run = if accepted == proposed { accepted + 1 } else { accepted };
        self.average_run = 0.7 * self.average_run + 0.3 * run as f32;
    }

    /// Records what one step cost: `seconds` for `tokens` generated, with or without drafts.
    pub(crate) fn record_cost(&mut self, drafted: bool, seconds: f32, tokens: usize) {
        let per_token = seconds / tokens.max(1) as f32;
        let probed = self.probing.take();
        let average = if drafted { &mut self.draft_cost } else { &mut self.plain_cost };
        // A probe's measurement replaces the way's stale average; others move it.
        *average = Some(match (*average, probed) {
            (Some(old), None) => 0.7 * old + 0.3 * per_token,
            _ => per_token,
        });
        if let Some(preferred) = probed {
            self.probe_interval = if self.prefers_drafts() == preferred {
                (2 * self.probe_interval).min(MAX_PROBE_INTERVAL)
            } else {
                PROBE_EVERY
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(mode: SpecMode, draft: Option<&str>) -> Result<SpeculationPlan, EngineError> {
        let config = SpeculationConfig { mode, draft_model: draft.map(PathBuf::from), ..SpeculationConfig::default() };
        // A file that is not GGUF reads as "no NextN layers".
        SpeculationPlan::decide(&config, Path::new(file!()))
    }

    #[test]
    fn modes_without_nextn_layers() {
        assert_eq!(plan(SpecMode::Auto, None).expect("plan").drafter, Drafter::None);
        assert_eq!(plan(SpecMode::None, Some("d.gguf")).expect("plan").drafter, Drafter::None);
        let auto = plan(SpecMode::Auto, Some("d.gguf")).expect("plan");
        assert_eq!(auto.drafter, Drafter::Model("d.gguf".into()));
        assert_eq!(auto.draft_max, MODEL_DRAFT_MAX);
        assert!(plan(SpecMode::Mtp, None).expect_err("refused").to_string().contains("no MTP (NextN) layers"));
        assert!(plan(SpecMode::Draft, None).expect_err("refused").to_string().contains("--draft-model"));
    }

    #[test]
    fn limits_are_checked() {
        let decide = |draft_max, draft_min, draft_p_min| {
            let config = SpeculationConfig {
                mode: SpecMode::Draft,
                draft_model: Some("d.gguf".into()),
                draft_max,
                draft_min,
                draft_p_min,
                ..SpeculationConfig::default()
            };
            SpeculationPlan::decide(&config, Path::new(file!())).map(|p| p.draft_max)
        };
        assert_eq!(decide(Some(4), 2, 0.5).expect("plan"), 4);
        assert!(decide(Some(0), 0, 0.5).is_err());
        assert!(decide(Some(4), 5, 0.5).is_err());
        assert!(decide(Some(4), 0, 1.5).is_err());
    }

    #[test]
    fn vocabularies_must_match_in_size_and_text() {
        let a: Vec<&[u8]> = vec![b"<s>", b"he", b"llo"];
        let b: Vec<&[u8]> = vec![b"<s>", b"he", b"lo"];
        assert_eq!(vocabulary_difference(a.clone().into_iter(), a.clone().into_iter()), None);
        assert!(vocabulary_difference(a.clone().into_iter(), b.into_iter())
            .expect("differs")
            .starts_with("token 2 is \"llo\""));
        assert!(vocabulary_difference(a.clone().into_iter(), a[..2].iter().copied())
            .expect("differs")
            .contains("3 tokens"));
    }

    #[test]
    fn depth_follows_acceptance() {
        let mut depth = DraftDepth::new(8, false);
        assert_eq!(depth.next(|| 0), 0, "plain decoding is measured first");
        depth.record_cost(false, 0.010, 1);
        let start = depth.next(|| 0);
        for _ in 0..10 {
            let d = depth.next(|| 0);
            depth.record(d, d);
        }
        assert_eq!(depth.next(|| 0), 8, "all accepted: up to the ceiling");
        for _ in 0..10 {
            let d = depth.next(|| 0);
            depth.record(d, 0);
        }
        assert_eq!(depth.next(|| 0), 1, "none accepted: one token");
        assert!(start > 1 && start <= 4);
        let mut half = DraftDepth::new(8, false);
        half.record_cost(false, 0.010, 1);
        for _ in 0..20 {
            half.record(4, 2);
        }
        assert_eq!(half.next(|| 0), 3);
    }

    /// Drives `depth` for `steps` steps where a plain step costs `plain` and a drafting step
    /// `drafting` seconds per token; returns how many steps drafted.
    fn drafting_steps(depth: &mut DraftDepth, steps: usize, backlog: usize, plain: f32, drafting: f32) -> usize {
        (0..steps)
            .filter(|_| {
                let drafts = depth.next(|| backlog);
                depth.record_cost(drafts > 0, if drafts > 0 { drafting } else { plain }, 1);
                drafts > 0
            })
            .count()
    }

    #[test]
    fn drafting_pauses_while_it_is_slower_and_probes_back_off() {
        let mut depth = DraftDepth::new(4, false);
        assert_eq!(depth.next(|| 0), 0, "plain decoding is measured first");
        depth.record_cost(false, 0.010, 1);
        // Slower drafts: tried once, then only probed, ever more rarely (16, 32, 64, ... steps).
        let slow = drafting_steps(&mut depth, 2000, 0, 0.010, 0.030);
        assert!((5..=9).contains(&slow), "{slow} drafting steps of 2000");
        // Faster drafts win back at the next probe and then draft nearly always.
        let fast = drafting_steps(&mut depth, 2000, 0, 0.010, 0.004);
        assert!(fast > 1900, "{fast} drafting steps of 2000");
        // A paused draft model far behind is probed only at the longest interval.
        let mut behind = DraftDepth::new(4, false);
        behind.record_cost(false, 0.010, 1);
        behind.record_cost(true, 0.030, 1);
        let probes = drafting_steps(&mut behind, 2 * MAX_PROBE_INTERVAL as usize, PROBE_MAX_BACKLOG + 1, 0.010, 0.030);
        assert!(probes <= 2, "{probes} probes far behind");
        let mut always = DraftDepth::new(4, true);
        always.record_cost(false, 0.001, 1);
        always.record_cost(true, 1.0, 1);
        assert!((0..100).all(|_| always.next(|| 0) > 0));
    }
}
