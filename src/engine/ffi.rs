//! The llama.cpp calls `llama-cpp-2` does not wrap safely, in the only module allowed `unsafe`:
//! the model's sliding window, and a sequence's state as plain bytes (the state store keeps
//! them in RAM and writes them to disk; `llama-cpp-2`'s safe `SeqState` cannot be written).
#![allow(unsafe_code)]

use llama_cpp_2::context::session::LlamaStateSeqFlags;
use llama_cpp_2::context::LlamaContext;
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

/// Sequence 0's whole state (KV cells, recurrent state, positions), as llama.cpp serialises it.
/// `None` if llama.cpp wrote another number of bytes than it announced.
pub(crate) fn sequence_state(ctx: &LlamaContext<'_>) -> Option<Vec<u8>> {
    let flags = LlamaStateSeqFlags::empty();
    let size = ctx.state_seq_get_size_ext(0, flags);
    let mut bytes = vec![0u8; size];
    // SAFETY: `bytes` holds `size` bytes, which is what llama.cpp computed (with the same
    // writer logic, on this thread, with nothing evaluated in between) that it writes for
    // sequence 0 with these flags.
    let written = unsafe { ctx.state_seq_get_data_ext(bytes.as_mut_ptr(), 0, flags) };
    (written == size).then_some(bytes)
}

/// Replaces sequence 0's state with `bytes`; false if llama.cpp refused them (the sequence is
/// then in an unknown state: the caller clears it).
///
/// Only ever called with bytes [`sequence_state`] produced for a context of the same model,
/// llama.cpp build and state-shaping parameters: in RAM they never left the process, and a
/// disk file is used only after its checksum and the header naming all of these matched
/// (`engine::disk`). llama.cpp still checks the layout (cell counts, layer and type sizes).
pub(crate) fn set_sequence_state(ctx: &mut LlamaContext<'_>, bytes: &[u8]) -> bool {
    // SAFETY: `bytes` is a state llama.cpp serialised for this model and context shape (see
    // above); llama.cpp reads at most `bytes.len()` bytes from it.
    unsafe { ctx.state_seq_set_data_ext(bytes, 0, LlamaStateSeqFlags::empty()) }
}
