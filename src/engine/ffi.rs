//! The one llama.cpp call `llama-cpp-2` does not wrap, in the only module allowed `unsafe`.
#![allow(unsafe_code)]

use llama_cpp_2::model::LlamaModel;

// `LlamaModel` must be exactly one pointer for the read below to be sound.
const _: () = assert!(std::mem::size_of::<LlamaModel>() == std::mem::size_of::<*const ()>());

/// The sliding-window size llama.cpp itself uses for `model`, `None` without one. It can differ
/// from the GGUF's `<arch>.attention.sliding_window` key: llama.cpp sets windows for some
/// architectures when the key is missing (Gemma 2: 4096; Llama 4's chunks: 8192; EXAONE 4,
/// SmallThinker: 4096).
pub(crate) fn effective_sliding_window(model: &LlamaModel) -> Option<u32> {
    // SAFETY: `LlamaModel` is `#[repr(transparent)]` over llama-cpp-2's `Ptr`, itself
    // `#[repr(transparent)]` over `NonNull<llama_model>` (llama-cpp-2 is pinned to =0.1.160;
    // the size is asserted above), so its bytes are the non-null model pointer, valid while
    // `model` is borrowed. `llama_model_n_swa` only reads a field of the model.
    let n_swa = unsafe {
        let raw: *const llama_cpp_sys_2::llama_model = std::mem::transmute_copy(model);
        llama_cpp_sys_2::llama_model_n_swa(raw)
    };
    u32::try_from(n_swa).ok().filter(|&n| n > 0)
}
