//! Loading: the llama.cpp backend, the model (with its MTP tensors when they are used), the
//! draft model, and the target context with its drafter.

use std::num::NonZeroU32;
use std::path::Path;
use std::sync::OnceLock;

use llama_cpp_2::context::params::{LlamaContextParams, LlamaContextType};
use llama_cpp_2::context::LlamaContext;
use llama_cpp_2::llama_backend::LlamaBackend;
use llama_cpp_2::llama_batch::LlamaBatch;
use llama_cpp_2::model::LlamaModel;
use llama_cpp_2::speculative::{MtpSpeculative, MtpSpeculativeParams};
use llama_cpp_2::token::LlamaToken;

use super::decoder::{Decoder, ModelDrafter, MtpDrafter, WindowGuard};
use super::ffi::devices::Placement;
use super::ffi::{send_llama_logs_to_tracing, watch_flash_attention};
use super::remote::{self, DeviceInfo};
use super::speculation::{vocabulary_difference, Drafter, SpecMode, SpeculationPlan};
use super::{EngineConfig, EngineError, FlashAttention, SpeculationError, SplitMode};

/// Context size used when the user gives none: enough for a long system prompt and a
/// conversation, without allocating a 32K+ KV cache nobody asked for.
const DEFAULT_CTX_CAP: u32 = 8192;

/// llama.cpp's backend is process-wide and may be initialised once; every engine in the
/// process shares it (tests, a draft model).
pub(super) fn backend() -> Result<&'static LlamaBackend, EngineError> {
    static BACKEND: OnceLock<Result<LlamaBackend, String>> = OnceLock::new();
    BACKEND
        .get_or_init(|| {
            send_llama_logs_to_tracing();
            LlamaBackend::init().map_err(|e| e.to_string())
        })
        .as_ref()
        .map_err(|e| EngineError::LoadFailed(format!("llama.cpp backend: {e}")))
}

/// What the inference thread loads once: the models and the speculation plan.
pub(super) struct Models {
    pub backend: &'static LlamaBackend,
    /// Shared with the handles' tokenizer.
    pub model: std::sync::Arc<LlamaModel>,
    pub draft_model: Option<LlamaModel>,
    pub plan: SpeculationPlan,
    /// The devices the model may use (the start-up log, `/v1/models`).
    pub devices: Vec<DeviceInfo>,
}

impl Models {
    pub(super) fn load(config: &EngineConfig) -> Result<Self, EngineError> {
        check_readable(&config.model_path)?;
        let mut plan = SpeculationPlan::decide(&config.speculation, &config.model_path)?;
        if config.mmproj.is_some() && plan.drafter != Drafter::None {
            // A drafter would have to see the media's embeddings too.
            if config.speculation.mode != SpecMode::Auto {
                return Err(EngineError::LoadFailed(
                    "--mmproj cannot be combined with speculative decoding yet (--spec mtp / --draft-model)".into(),
                ));
            }
            tracing::info!("speculative decoding off: a projector (--mmproj) is loaded");
            plan.drafter = Drafter::None;
            plan.reason = "a projector (--mmproj) is loaded".into();
        }
        let backend = backend()?;
        if config.tensor_split.len() > llama_cpp_2::model::params::LLAMA_CPP_MAX_DEVICES {
            return Err(EngineError::LoadFailed(format!(
                "the tensor split names {} devices; llama.cpp places layers on at most {}",
                config.tensor_split.len(),
                llama_cpp_2::model::params::LLAMA_CPP_MAX_DEVICES
            )));
        }
        remote::connect(&config.rpc, config.rpc_timeout)?;
        let devices = remote::explicit_devices(&config.rpc);
        let load_mtp = matches!(plan.drafter, Drafter::Mtp { .. });
        let placement = Placement {
            n_gpu_layers: config.n_gpu_layers,
            split_mode: config.split_mode,
            main_gpu: config.main_gpu,
            tensor_split: &config.tensor_split,
            devices: devices.as_deref(),
            mmap: config.mmap,
            mlock: config.mlock,
            load_mtp,
            repack: config.repack,
        };
        let model = load_model(&config.model_path, &placement)?;
        // The draft model stays on this machine: its steps must not wait on the network.
        let local_devices = remote::explicit_devices(&[]);
        let local = Placement {
            n_gpu_layers: config.speculation.n_gpu_layers_draft,
            split_mode: SplitMode::Layer,
            main_gpu: 0,
            tensor_split: &[],
            devices: local_devices.as_deref(),
            load_mtp: false,
            ..placement
        };
        let draft_model = match &plan.drafter {
            Drafter::Model(path) => Some(load_draft_model(&model, path, &local)?),
            _ => None,
        };
        let devices = remote::shown_devices(&config.rpc);
        Ok(Self { backend, model: std::sync::Arc::new(model), draft_model, plan, devices })
    }
}

fn check_readable(path: &Path) -> Result<(), EngineError> {
    std::fs::File::open(path)
        .map(drop)
        .map_err(|e| EngineError::ModelUnreadable { path: path.to_path_buf(), reason: e.to_string() })
}

/// Loads a model placed as `placement` says. MTP tensors only when they exist and are used
/// (`load_mtp`): an MTP context on a model loaded without them aborts the process inside
/// llama.cpp.
fn load_model(path: &Path, placement: &Placement<'_>) -> Result<LlamaModel, EngineError> {
    check_readable(path)?;
    super::ffi::devices::load_model(path, placement).ok_or_else(|| EngineError::ModelLoad { path: path.to_path_buf() })
}

/// Loads the draft model and checks that its tokens mean what the target's mean.
fn load_draft_model(target: &LlamaModel, path: &Path, placement: &Placement<'_>) -> Result<LlamaModel, EngineError> {
    let draft = load_model(path, placement)?;
    let texts = |model: &LlamaModel| -> Vec<Vec<u8>> {
        let vocab = model.vocab();
        (0..model.n_vocab())
            .map(|id| vocab.text(LlamaToken(id)).map(|t| t.to_bytes().to_vec()).unwrap_or_default())
            .collect()
    };
    let (target_texts, draft_texts) = (texts(target), texts(&draft));
    let difference =
        vocabulary_difference(target_texts.iter().map(Vec::as_slice), draft_texts.iter().map(Vec::as_slice));
    match difference {
        Some(difference) => Err(SpeculationError::DifferentVocabulary { draft: path.to_path_buf(), difference }.into()),
        None => Ok(draft),
    }
}

/// The target context and its drafter, as [`create_decoder`] made them.
pub(super) struct Contexts<'m> {
    /// The contexts.
    pub(super) decoder: Decoder<'m>,
    /// The logical batch size.
    pub(super) n_batch: usize,
    /// The recurrent-state snapshots the target keeps (`n_rs_seq`).
    pub(super) rs_snapshots: u32,
    /// Sequences the context holds at once (`--parallel`, where the model and the drafter
    /// allow more than one).
    pub(super) n_seq_max: u32,
    /// A sequence beyond those, held for evaluating a prompt's changed spans
    /// (`--reuse-after-change` where the context serves one sequence).
    pub(super) spare_seq: Option<i32>,
    /// Whether the target computes attention with flash attention: `on` or `off`, what
    /// llama.cpp chose for an `auto` policy (`auto` only if it did not say).
    pub(super) flash_attention: &'static str,
}

/// Creates the target context and its drafter.
pub(super) fn create_decoder<'m>(
    backend: &LlamaBackend,
    model: &'m LlamaModel,
    draft_model: Option<&'m LlamaModel>,
    plan: &SpeculationPlan,
    config: &EngineConfig,
) -> Result<Contexts<'m>, EngineError> {
    let n_ctx_train = model.n_ctx_train();
    let n_ctx = config.ctx_size.unwrap_or_else(|| n_ctx_train.min(DEFAULT_CTX_CAP)).max(16);
    let flash = match config.flash_attention {
        FlashAttention::Auto => llama_cpp_sys_2::LLAMA_FLASH_ATTN_TYPE_AUTO,
        FlashAttention::On => llama_cpp_sys_2::LLAMA_FLASH_ATTN_TYPE_ENABLED,
        FlashAttention::Off => llama_cpp_sys_2::LLAMA_FLASH_ATTN_TYPE_DISABLED,
    };
    let n_batch = config.batch_size.clamp(1, n_ctx);
    let speculating = plan.drafter != Drafter::None;
    let rs_snapshots = if speculating { plan.draft_max } else { 0 };
    let recurrent = model.is_recurrent() || model.is_hybrid();
    // llama.cpp reserves an output row per sequence in every batch: no more sequences than a
    // batch holds (it aborts the process otherwise).
    let parallel = config.parallel.min(n_batch);
    if parallel < config.parallel {
        tracing::info!("{parallel} sequences, not {}: no more than the batch size (-b {n_batch})", config.parallel);
    }
    let n_seq_max = sequences(parallel, speculating, recurrent);
    // Reuse past changes evaluates spans on a sequence beside sequence 0: the lanes' free
    // ones, or this one where there are none; with a sliding window, only where every cell of
    // the full-size window cache is kept, by one more sequence (the guard).
    let window = crate::engine::ffi::effective_sliding_window(model);
    let refused = past_changes_refused(speculating, recurrent, window.is_some(), config.swa_full);
    let reuse_past_changes = config.reuse_after_change && refused.is_none();
    let spare_seq = (reuse_past_changes && n_seq_max == 1 && n_batch > 1).then_some(1);
    let n_seq_held = n_seq_max + u32::from(spare_seq.is_some());
    let window_guard = window
        .filter(|_| reuse_past_changes && n_seq_held < n_batch)
        .map(|n_swa| WindowGuard::new(n_seq_held as i32, n_swa));
    if config.reuse_after_change {
        match (refused, window) {
            (Some(why), _) => tracing::info!("reuse past changes off for this model: {why}"),
            (None, Some(n_swa)) if window_guard.is_some() => {
                tracing::info!("reuse past changes on a sliding window of {n_swa}: one more sequence keeps every cell")
            }
            _ => {}
        }
    }
    let params = LlamaContextParams::default()
        .with_n_ctx(NonZeroU32::new(n_ctx))
        .with_n_batch(n_batch)
        .with_n_ubatch(config.ubatch_size.clamp(1, n_batch))
        .with_n_threads(config.threads.max(1) as i32)
        .with_n_threads_batch(config.threads_batch.max(1) as i32)
        .with_flash_attention_policy(flash)
        .with_swa_full(config.swa_full)
        // One pool of cells for all sequences: one conversation alone can fill the context,
        // and memory does not grow with --parallel.
        .with_n_seq_max(n_seq_held + u32::from(window_guard.is_some()))
        .with_kv_unified(true)
        // Recurrent state a verification step may have to roll back: one per draft (llama.cpp
        // keeps it only for architectures that support the rollback).
        .with_n_rs_seq(rs_snapshots);
    let context_error =
        |e: llama_cpp_2::LlamaContextLoadError| EngineError::ContextCreate { n_ctx, reason: e.to_string() };
    let (created, choices) = watch_flash_attention(|| model.new_context(backend, params.clone()));
    let mut ctx = created.map_err(context_error)?;
    let flash_attention = match (config.flash_attention, choices.first()) {
        (FlashAttention::On, _) | (FlashAttention::Auto, Some(true)) => "on",
        (FlashAttention::Off, _) | (FlashAttention::Auto, Some(false)) => "off",
        (FlashAttention::Auto, None) => "auto",
    };
    let mut drafter = plan.drafter.clone();
    if speculating && (model.is_recurrent() || model.is_hybrid()) && !can_drop_tail(&mut ctx, model) {
        if config.speculation.mode != SpecMode::Auto {
            return Err(SpeculationError::CannotRollBack.into());
        }
        tracing::warn!("speculative decoding off: {}", SpeculationError::CannotRollBack);
        drafter = Drafter::None;
    }
    let decoder = match (&drafter, draft_model) {
        (Drafter::Mtp { .. }, _) => {
            let draft =
                model.new_context(backend, params.with_context_type(LlamaContextType::Mtp)).map_err(context_error)?;
            let limits =
                MtpSpeculativeParams { n_max: plan.draft_max as i32, n_min: plan.draft_min as i32, p_min: plan.p_min };
            let spec = MtpSpeculative::new(ctx, draft, limits).map_err(|e| SpeculationError::Mtp(e.to_string()))?;
            Decoder::Mtp(MtpDrafter::new(spec))
        }
        (Drafter::Model(_), Some(draft_model)) => {
            // The draft context drops what it drafted token by token: no snapshots for that, so
            // a recurrent draft model re-evaluates instead of rolling back to a wrong state.
            let draft = draft_model.new_context(backend, params.with_n_rs_seq(0)).map_err(context_error)?;
            Decoder::Model(ModelDrafter::new(ctx, draft, n_batch as usize, plan.p_min, plan.draft_min as usize))
        }
        _ => Decoder::Plain(ctx, window_guard),
    };
    match &drafter {
        Drafter::None if speculating => {}
        Drafter::None => tracing::info!("speculative decoding off: {}", plan.reason),
        drafter => tracing::info!(
            "speculative decoding with {}: {}; draft max {}, min {}, p-min {}",
            if matches!(drafter, Drafter::Mtp { .. }) { "MTP heads" } else { "a draft model" },
            plan.reason,
            plan.draft_max,
            plan.draft_min,
            plan.p_min
        ),
    }
    let rs_snapshots = if drafter == Drafter::None { 0 } else { rs_snapshots };
    Ok(Contexts { decoder, n_batch: n_batch as usize, rs_snapshots, n_seq_max, spare_seq, flash_attention })
}

/// Why a context cannot reuse past changed spans (`--reuse-after-change`), if it cannot: a
/// drafter, a recurrent state, or a sliding window with the small window cache (a span needs
/// the window before it, which only the full-size cache and its guard keep).
fn past_changes_refused(speculating: bool, recurrent: bool, window: bool, swa_full: bool) -> Option<&'static str> {
    if speculating {
        Some("a drafter follows sequence 0 alone")
    } else if recurrent {
        Some("a recurrent state cannot keep what follows a change")
    } else if window && !swa_full {
        Some("--swa-small keeps only the last window, which a changed span needs before it")
    } else {
        None
    }
}

/// How many sequences the context holds: `parallel`, or one where requests cannot share its
/// steps: a recurrent model that drafts (its drafts' rollback snapshots follow sequence 0's
/// batches alone), whose requests then wait their turn, as the start-up log says. With a
/// drafter, the drafter follows sequence 0 alone and the other sequences' replies are not
/// drafted.
fn sequences(parallel: u32, speculating: bool, recurrent: bool) -> u32 {
    let parallel = parallel.max(1);
    if parallel == 1 {
        return 1;
    }
    if speculating && recurrent {
        tracing::info!(
            "one sequence: a model with a recurrent state drafts; a request arriving while a reply streams waits for it (--parallel {parallel} asked)"
        );
        return 1;
    }
    let drafted = if speculating { " (replies that start while another streams are not drafted)" } else { "" };
    tracing::info!(
        "{parallel} sequences share the context{drafted}: a request arriving while a reply streams starts at once"
    );
    parallel
}

/// Whether the context can drop the last position of a sequence, as rejecting a draft does:
/// measured on two tokens, then the cache is emptied. Recurrent state can only be rolled back
/// where llama.cpp keeps snapshots for it (`n_rs_seq`, some architectures only).
fn can_drop_tail(ctx: &mut LlamaContext<'_>, model: &LlamaModel) -> bool {
    let token = model.vocab().bos();
    let mut batch = LlamaBatch::new(2, 1);
    let built = batch.add(token, 0, &[0], false).is_ok() && batch.add(token, 1, &[0], true).is_ok();
    let dropped = built && ctx.decode(&mut batch).is_ok() && ctx.kv_cache_seq_rm(0, Some(1), None).is_ok();
    ctx.clear_kv_cache();
    dropped
}

#[cfg(test)]
mod tests {
    use super::past_changes_refused;

    #[test]
    fn reuse_past_changes_is_refused_only_where_the_cache_cannot_carry_it_out() {
        assert_eq!(past_changes_refused(false, false, false, false), None);
        assert_eq!(past_changes_refused(false, false, true, true), None, "a window with its full cache");
        assert!(past_changes_refused(false, false, true, false).is_some_and(|why| why.contains("--swa-small")));
        assert!(past_changes_refused(true, false, false, true).is_some_and(|why| why.contains("drafter")));
        assert!(past_changes_refused(false, true, false, true).is_some_and(|why| why.contains("recurrent")));
    }
}
