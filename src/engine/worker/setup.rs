//! Setting up the inference thread: the state store's budget and the disk cache.

use llama_cpp_2::model::LlamaModel;

use super::super::disk::{ContextShape, DiskCache, Fingerprint, ModelIdentity};
use super::super::{EngineConfig, EngineError, LLAMA_CPP_BUILD};
use crate::chat::ChatFormat;

/// Opens the disk cache under `root` for this model and context (`whole_only`: see
/// [`super::LiveSequence::whole_only`]).
pub(super) fn open_disk_cache(
    root: &std::path::Path,
    config: &EngineConfig,
    model: &LlamaModel,
    draft_model: Option<&LlamaModel>,
    context: ContextShape,
    chat: &ChatFormat,
    whole_only: bool,
) -> std::io::Result<DiskCache> {
    let architecture = |model: &LlamaModel| model.meta_val_str("general.architecture").unwrap_or_default();
    let draft_model = match (draft_model, &config.speculation.draft_model) {
        (Some(draft), Some(path)) => Some(ModelIdentity::of(path, &architecture(draft))?),
        _ => None,
    };
    let fingerprint = Fingerprint {
        model: ModelIdentity::of(&config.model_path, &architecture(model))?,
        draft_model,
        llama_cpp: LLAMA_CPP_BUILD.to_string(),
        context,
        template_hash: Fingerprint::template_hash(chat.template_text()),
    };
    let budget = config.cache_disk_mib.saturating_mul(1 << 20);
    DiskCache::open(root, budget, &config.model_path, fingerprint, whole_only)
}

/// The state store's budget in MiB: a budget larger than the memory available now is refused,
/// except the default, which is lowered to half of it (small machines start without a flag).
pub(super) fn check_cache_budget(requested_mib: u64) -> Result<u64, EngineError> {
    match available_memory_mib() {
        Some(available_mib)
            if requested_mib > available_mib / 2 && requested_mib == EngineConfig::DEFAULT_CACHE_RAM_MIB =>
        {
            tracing::info!(available_mib, "state store budget lowered to half the available memory");
            Ok(available_mib / 2)
        }
        Some(available_mib) if requested_mib > available_mib => {
            Err(EngineError::CacheBudget { requested_mib, available_mib })
        }
        _ => Ok(requested_mib),
    }
}

/// `MemAvailable` from `/proc/meminfo`, where there is one.
fn available_memory_mib() -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = meminfo.lines().find(|line| line.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024)
}
