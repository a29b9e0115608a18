//! The llama.cpp calls `llama-cpp-2` does not wrap safely, in the only module allowed `unsafe`:
//! the model's sliding window, a sequence's state as plain bytes (the state store keeps them in
//! RAM and writes them to disk; `llama-cpp-2`'s safe `SeqState` cannot be written), and what
//! llama.cpp chose for an `auto` flash-attention policy (read from its log), and the threads a
//! context computes with.
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

/// Bytes [`sequence_state`] would write for sequence 0 now (llama.cpp counts them without
/// copying the tensors).
pub(crate) fn sequence_state_size(ctx: &LlamaContext<'_>) -> usize {
    ctx.state_seq_get_size_ext(0, LlamaStateSeqFlags::empty())
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

/// Sets the threads llama.cpp computes with: `generation` for single-token batches, `batch`
/// for prompt batches (`llama_set_n_threads`, which `llama-cpp-2` does not wrap). False,
/// and nothing changed, when the context's pointer could not be found.
pub(crate) fn set_threads(ctx: &mut LlamaContext<'_>, generation: u32, batch: u32) -> bool {
    let Some(raw) = context_pointer(&format!("{ctx:?}")) else { return false };
    let (Ok(generation), Ok(batch)) = (i32::try_from(generation), i32::try_from(batch)) else { return false };
    // SAFETY: `llama-cpp-2` (pinned to =0.1.160) prints a context as `LlamaContext { context:
    // 0x… }`, the address of its `llama_context`, live while `ctx` is borrowed; the call only
    // stores the two counts in the context's parameters, read at the next decode on this thread.
    unsafe { llama_cpp_sys_2::llama_set_n_threads(raw as *mut llama_cpp_sys_2::llama_context, generation, batch) };
    true
}

/// The `llama_context` address in `llama-cpp-2`'s `Debug` text of a context.
fn context_pointer(debug: &str) -> Option<usize> {
    let rest = debug.strip_prefix("LlamaContext { context: 0x")?;
    let hex = rest.strip_suffix(" }")?;
    usize::from_str_radix(hex, 16).ok().filter(|&address| address != 0)
}

/// Sends llama.cpp's and ggml's log to `tracing` (see `llama_log`), in place of llama-cpp-2's
/// bridge, which aborts the process on a continuation piece with no message before it.
pub(crate) fn send_llama_logs_to_tracing() {
    // SAFETY: `log_to_tracing` has the callback's signature and uses no user data;
    // `llama_log_set` sets ggml's callback too, and ggml's is set explicitly all the same.
    unsafe {
        llama_cpp_sys_2::llama_log_set(Some(log_to_tracing), std::ptr::null_mut());
        llama_cpp_sys_2::ggml_log_set(Some(log_to_tracing), std::ptr::null_mut());
        // libmtmd (`--mmproj`) and its helpers log on their own, to stderr unless told.
        llama_cpp_sys_2::mtmd_helper_log_set(Some(log_to_tracing), std::ptr::null_mut());
    }
}

/// llama.cpp's and ggml's log callback: one message piece to `llama_log`.
unsafe extern "C" fn log_to_tracing(
    level: llama_cpp_sys_2::ggml_log_level,
    text: *const std::os::raw::c_char,
    _user_data: *mut std::ffi::c_void,
) {
    if text.is_null() {
        return;
    }
    // SAFETY: llama.cpp passes a NUL-terminated message, valid for this call.
    let message = unsafe { std::ffi::CStr::from_ptr(text) }.to_string_lossy();
    super::llama_log::log_piece(level, &message);
}

/// The log callback llama.cpp had before [`watch_flash_attention`] put its own in, and what
/// that one saw.
struct FlashAttentionWatch {
    /// llama.cpp's callback and its user data (as an address: the pointer is llama-cpp-2's
    /// state, which lives as long as the process).
    previous: (llama_cpp_sys_2::ggml_log_callback, usize),
    /// Each choice llama.cpp logged, in order: true for on.
    choices: Vec<bool>,
}

static FLASH_ATTENTION_WATCH: std::sync::Mutex<Option<FlashAttentionWatch>> = std::sync::Mutex::new(None);

/// Held while a context is created under the watch: llama.cpp's log callback is one for the
/// process, so engines starting at the same time (tests, a library user) take turns.
static CONTEXT_CREATION: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Runs `create` (which creates contexts) and returns what llama.cpp chose for flash attention
/// in each context that resolved an `auto` policy, in order (true: on). llama.cpp has no call
/// that tells; it logs the choice while it creates the context, so its log callback is
/// wrapped meanwhile (every message still goes on to llama-cpp-2's), and ggml's is left as is.
pub(crate) fn watch_flash_attention<T>(create: impl FnOnce() -> T) -> (T, Vec<bool>) {
    let _turn = CONTEXT_CREATION.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let mut callback: llama_cpp_sys_2::ggml_log_callback = None;
    let mut user_data: *mut std::ffi::c_void = std::ptr::null_mut();
    let mut ggml_callback: llama_cpp_sys_2::ggml_log_callback = None;
    let mut ggml_user_data: *mut std::ffi::c_void = std::ptr::null_mut();
    // SAFETY: the getters write the current callbacks and user data to valid locals; the
    // setters take a callback of the right signature (or the ones just read back). Only the
    // inference thread creates contexts, once, at start-up.
    unsafe {
        llama_cpp_sys_2::llama_log_get(&mut callback, &mut user_data);
        llama_cpp_sys_2::ggml_log_get(&mut ggml_callback, &mut ggml_user_data);
    }
    if let Ok(mut watch) = FLASH_ATTENTION_WATCH.lock() {
        *watch = Some(FlashAttentionWatch { previous: (callback, user_data as usize), choices: Vec::new() });
    }
    // SAFETY: see above; `llama_log_set` sets ggml's callback too, so ggml's is put back.
    unsafe {
        llama_cpp_sys_2::llama_log_set(Some(watch_log), std::ptr::null_mut());
        llama_cpp_sys_2::ggml_log_set(ggml_callback, ggml_user_data);
    }
    let created = create();
    // SAFETY: see above.
    unsafe {
        llama_cpp_sys_2::llama_log_set(callback, user_data);
        llama_cpp_sys_2::ggml_log_set(ggml_callback, ggml_user_data);
    }
    // The previous callback stays recorded: a message another thread began meanwhile still
    // reaches it.
    let choices =
        FLASH_ATTENTION_WATCH.lock().ok().and_then(|mut watch| watch.as_mut().map(|w| std::mem::take(&mut w.choices)));
    (created, choices.unwrap_or_default())
}

/// llama.cpp's log callback while [`watch_flash_attention`] runs: notes a flash-attention
/// choice, then passes the message on.
unsafe extern "C" fn watch_log(
    level: llama_cpp_sys_2::ggml_log_level,
    text: *const std::os::raw::c_char,
    _user_data: *mut std::ffi::c_void,
) {
    if text.is_null() {
        return;
    }
    // SAFETY: llama.cpp passes a NUL-terminated message, valid for this call.
    let message = unsafe { std::ffi::CStr::from_ptr(text) }.to_bytes();
    let previous = FLASH_ATTENTION_WATCH.lock().ok().and_then(|mut watch| {
        let watch = watch.as_mut()?;
        if let Some(choice) = flash_attention_choice(message) {
            watch.choices.push(choice);
        }
        Some(watch.previous)
    });
    if let Some((Some(callback), user_data)) = previous {
        // SAFETY: the callback and user data llama.cpp had before, called as llama.cpp would.
        unsafe { callback(level, text, user_data as *mut std::ffi::c_void) };
    }
}

/// The flash-attention choice a llama.cpp log message reports, if it is one
/// (`llama_context::resolve_fused_ops` in the pinned release).
pub(crate) fn flash_attention_choice(message: &[u8]) -> Option<bool> {
    let has = |needle: &[u8]| message.windows(needle.len()).any(|window| window == needle);
    if has(b"Flash Attention enabled") {
        Some(true)
    } else if has(b"Flash Attention not supported") {
        Some(false)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::{context_pointer, flash_attention_choice};

    #[test]
    fn the_flash_attention_choice_is_read_from_llama_cpp_s_messages() {
        assert_eq!(flash_attention_choice(b"resolve_fused_ops: Flash Attention enabled\n"), Some(true));
        assert_eq!(
            flash_attention_choice(b"resolve_fused_ops: Flash Attention not supported, set to disabled\n"),
            Some(false)
        );
        assert_eq!(flash_attention_choice(b"llama_context: flash_attn = auto\n"), None);
        assert_eq!(flash_attention_choice(b"resolve_fused_ops: fused Gated Delta Net enabled\n"), None);
    }

    #[test]
    fn the_context_address_is_read_from_its_debug_text() {
        assert_eq!(context_pointer("LlamaContext { context: 0x5603a1b2c3d0 }"), Some(0x5603_a1b2_c3d0));
        assert_eq!(context_pointer("LlamaContext { context: 0x0 }"), None);
        assert_eq!(context_pointer("LlamaContext { context: Ptr(0x5603a1b2c3d0) }"), None);
        assert_eq!(context_pointer("LlamaContext { context: 0x56zz }"), None);
    }
}
