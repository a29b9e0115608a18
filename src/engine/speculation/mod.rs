//! Speculative decoding: the settings, which drafter runs (the model's own MTP heads, a
//! separate draft model, or none) and why, how many tokens it proposes per step
//! ([`DraftDepth`]), and the bookkeeping of each verification step ([`Speculating`]).

mod depth;
mod step;

use std::path::{Path, PathBuf};

use llama_cpp_2::gguf::GgufContext;

pub(crate) use depth::DraftDepth;
pub(crate) use step::Speculating;

use super::{EngineError, SpeculationError};

/// Which speculative decoding to use.
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
        let invalid = |error: SpeculationError| Err(EngineError::SpeculationSetup(error));
        let (drafter, reason) = match (config.mode, layers, &config.draft_model) {
            (SpecMode::None, _, _) => (Drafter::None, "`speculation.mode` is `None`".to_string()),
            (SpecMode::Mtp, 0, _) => return invalid(SpeculationError::NoMtpLayers { model: model_path.to_path_buf() }),
            (SpecMode::Mtp, n, _) | (SpecMode::Auto, n @ 1.., _) => {
                (Drafter::Mtp { layers: n }, format!("the model has {n} MTP (NextN) layer(s)"))
            }
            (SpecMode::Draft | SpecMode::Auto, _, Some(path)) => {
                (Drafter::Model(path.clone()), format!("draft model {}", path.display()))
            }
            (SpecMode::Draft, _, None) => return invalid(SpeculationError::NoDraftModel),
            (SpecMode::Auto, _, None) => {
                (Drafter::None, "the model has no MTP (NextN) layers and no `speculation.draft_model` is set".into())
            }
        };
        if config.mode == SpecMode::None && config.draft_model.is_some() {
            tracing::warn!("`speculation.draft_model` is ignored: `speculation.mode` is `None`");
        }
        let draft_max = config.draft_max.unwrap_or(match drafter {
            Drafter::Mtp { .. } => MTP_DRAFT_MAX,
            _ => MODEL_DRAFT_MAX,
        });
        if draft_max == 0 || draft_max > 64 {
            return invalid(SpeculationError::DraftMaxOutOfRange(draft_max));
        }
        if config.draft_min > draft_max {
            return invalid(SpeculationError::DraftMinAboveMax { min: config.draft_min, max: draft_max });
        }
        if !(0.0..=1.0).contains(&config.draft_p_min) {
            return invalid(SpeculationError::DraftPMinOutOfRange(config.draft_p_min));
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
        assert!(plan(SpecMode::Draft, None).expect_err("refused").to_string().contains("`speculation.draft_model`"));
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
}
