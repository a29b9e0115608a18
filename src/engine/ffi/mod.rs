//! The llama.cpp calls `llama-cpp-2` does not wrap safely, in the only module allowed `unsafe`:
//! the model's sliding window, a sequence's state as plain bytes (the state store keeps them in
//! RAM and writes them to disk; `llama-cpp-2`'s safe `SeqState` cannot be written), and what
//! llama.cpp chose for an `auto` flash-attention policy (read from its log), and the threads a
//! context computes with, and the check that stops a reply's decode step midway once its client
//! has left, and the hook that runs when the process exits; in `devices.rs`, the model placed on
//! the devices the user chose, RPC servers registered and served, and ggml's abort message.
#![allow(unsafe_code)]

pub(crate) mod devices;

use std::sync::Arc;

use llama_cpp_2::context::session::LlamaStateSeqFlags;
use llama_cpp_2::context::LlamaContext;
use llama_cpp_2::model::LlamaModel;

use super::threads::ThreadCounts;

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

/// Bytes [`sequence_state`] would write for sequence `seq` now (llama.cpp counts them without
/// copying the tensors).
pub(crate) fn sequence_state_size(ctx: &LlamaContext<'_>, seq: i32) -> usize {
    ctx.state_seq_get_size_ext(seq, LlamaStateSeqFlags::empty())
}

/// Sequence `seq`'s whole state (KV cells, recurrent state, positions), as llama.cpp
/// serialises it. `None` if llama.cpp wrote another number of bytes than it announced.
pub(crate) fn sequence_state(ctx: &LlamaContext<'_>, seq: i32) -> Option<Vec<u8>> {
    let flags = LlamaStateSeqFlags::empty();
    let size = ctx.state_seq_get_size_ext(seq, flags);
    let mut bytes = vec![0u8; size];
    // SAFETY: `bytes` holds `size` bytes, which is what llama.cpp computed (with the same
    // writer logic, on this thread, with nothing evaluated in between) that it writes for
    // sequence `seq` with these flags.
    let written = super::stall::watched(super::stall::state_units(size), || unsafe {
        ctx.state_seq_get_data_ext(bytes.as_mut_ptr(), seq, flags)
    });
    (written == size).then_some(bytes)
}

/// Replaces sequence `seq`'s state with `bytes` (a state saved from any sequence); false if
/// llama.cpp refused them (the sequence is then in an unknown state: the caller clears it).
///
/// Only ever called with bytes [`sequence_state`] produced for a context of the same model,
/// llama.cpp build and state-shaping parameters: in RAM they never left the process, and a
/// disk file is used only after its checksum and the header naming all of these matched
/// (`engine::disk`). llama.cpp still checks the layout (cell counts, layer and type sizes).
pub(crate) fn set_sequence_state(ctx: &mut LlamaContext<'_>, bytes: &[u8], seq: i32) -> bool {
    // SAFETY: `bytes` is a state llama.cpp serialised for this model and context shape (see
    // above); llama.cpp reads at most `bytes.len()` bytes from it.
    super::stall::watched(super::stall::state_units(bytes.len()), || unsafe {
        ctx.state_seq_set_data_ext(bytes, seq, LlamaStateSeqFlags::empty())
    })
}

/// Sets the threads llama.cpp computes with: `generation` for single-token batches, `batch`
/// for prompt batches (`llama_set_n_threads`, which `llama-cpp-2` does not wrap), and returns
/// what llama.cpp then reports for the context (`llama_n_threads`, `llama_n_threads_batch`).
/// `None`, and nothing changed, when the context's pointer could not be found or is not this
/// context's ([`context_pointer`]).
pub(crate) fn set_threads(ctx: &mut LlamaContext<'_>, counts: ThreadCounts) -> Option<ThreadCounts> {
    let raw = context_pointer(ctx)?;
    let (generation, batch) = (i32::try_from(counts.generation).ok()?, i32::try_from(counts.batch).ok()?);
    // SAFETY: `raw` is this context's `llama_context` (checked by `context_pointer`), live while
    // `ctx` is borrowed mutably; the call only stores the two counts in the context's
    // parameters, read at the next decode on this thread; the getters read them back.
    let (generation, batch) = unsafe {
        llama_cpp_sys_2::llama_set_n_threads(raw, generation, batch);
        (llama_cpp_sys_2::llama_n_threads(raw), llama_cpp_sys_2::llama_n_threads_batch(raw))
    };
    Some(ThreadCounts { generation: u32::try_from(generation).ok()?, batch: u32::try_from(batch).ok()? })
}

/// Whether a decode in progress should stop (called from llama.cpp's compute threads).
pub(crate) type StopCheck = Box<dyn Fn() -> bool + Send + Sync>;

/// The check llama.cpp's abort callback asks between a decode's graph nodes (the CPU backend
/// asks after every node; others not at all): none outside a reply's steps.
#[derive(Default)]
pub(crate) struct DecodeStop(parking_lot::Mutex<Option<StopCheck>>);

impl DecodeStop {
    /// Sets the check the next decodes ask (`None`: they are never stopped).
    pub(crate) fn set(&self, check: Option<StopCheck>) {
        *self.0.lock() = check;
    }

    /// Whether the check says stop. Never waits: while the check is being replaced it says go on.
    pub(crate) fn requested(&self) -> bool {
        self.0.try_lock().is_some_and(|check| check.as_ref().is_some_and(|check| check()))
    }
}

/// Lets `stop` end `ctx`'s decodes midway (`llama_set_abort_callback`): llama.cpp then removes
/// the positions of the micro-batch it was computing from the cache and `llama_decode` returns 2.
/// The caller keeps `stop` alive (its `Arc`) as long as `ctx`. False, and nothing set, when the
/// context's pointer could not be found ([`context_pointer`]).
pub(crate) fn stop_decodes_with(ctx: &mut LlamaContext<'_>, stop: &Arc<DecodeStop>) -> bool {
    let Some(raw) = context_pointer(ctx) else { return false };
    // SAFETY: `raw` is this context's `llama_context` (checked by `context_pointer`); the call
    // stores the callback and its data in the context. The data is the `DecodeStop` the caller
    // keeps alive as long as the context (documented above), read only through `&`.
    unsafe {
        llama_cpp_sys_2::llama_set_abort_callback(
            raw,
            Some(decode_stop_requested),
            Arc::as_ptr(stop).cast_mut().cast::<std::ffi::c_void>(),
        );
    }
    true
}

/// llama.cpp's abort callback: asks the [`DecodeStop`] at `data`.
unsafe extern "C" fn decode_stop_requested(data: *mut std::ffi::c_void) -> bool {
    // SAFETY: `data` is the `DecodeStop` given to `stop_decodes_with`, alive as long as the
    // context that calls this; it is shared (`Sync`) and only read here.
    let stop = unsafe { &*data.cast_const().cast::<DecodeStop>() };
    stop.requested()
}

/// Waits until `ctx`'s computations have ended (`llama_synchronize`): a decode may return while
/// a backend still computes (a GPU, an RPC server), and the wait would then come in the next
/// read of its logits. Nothing happens when the context's pointer could not be found.
pub(crate) fn synchronize(ctx: &mut LlamaContext<'_>) {
    if let Some(raw) = context_pointer(ctx) {
        // SAFETY: `raw` is this context's `llama_context` (checked by `context_pointer`), live
        // and borrowed mutably here; the call waits for its scheduler.
        unsafe { llama_cpp_sys_2::llama_synchronize(raw) };
    }
}

/// Whether `ctx`'s cache can move positions (`llama_memory_can_shift`: llama.cpp aborts on a
/// move it cannot apply). False where the context cannot be reached.
pub(crate) fn can_shift_positions(ctx: &LlamaContext<'_>) -> bool {
    // SAFETY: a checked live context's pointer (see `context_pointer`); both calls only read.
    context_pointer(ctx)
        .is_some_and(|raw| unsafe { llama_cpp_sys_2::llama_memory_can_shift(llama_cpp_sys_2::llama_get_memory(raw)) })
}

/// The address of `ctx`'s `llama_context`, which `llama-cpp-2` keeps private: read from its
/// `Debug` text ([`debug_address`]), then checked against what the safe wrapper reports
/// through its own pointer (the context size, batch and micro-batch sizes), so that a
/// `llama-cpp-2` whose `Debug` prints another address (the crate is pinned to =0.1.160, whose
/// text is `LlamaContext { context: 0x… }`) is refused rather than written through.
fn context_pointer(ctx: &LlamaContext<'_>) -> Option<*mut llama_cpp_sys_2::llama_context> {
    checked_address(&format!("{ctx:?}"), (ctx.n_ctx(), ctx.n_batch(), ctx.n_ubatch()))
}

/// The address in `debug` ([`debug_address`]) if the context there has `shape` (context,
/// batch and micro-batch sizes).
fn checked_address(debug: &str, shape: (u32, u32, u32)) -> Option<*mut llama_cpp_sys_2::llama_context> {
    let raw = debug_address(debug)? as *mut llama_cpp_sys_2::llama_context;
    // SAFETY: in the pinned release the address is a live context's own `llama_context` (the
    // callers hold the context it was printed from); the getters only read fields of it. The
    // check is what guards a different release, whose text could name something else.
    let found = unsafe {
        (llama_cpp_sys_2::llama_n_ctx(raw), llama_cpp_sys_2::llama_n_batch(raw), llama_cpp_sys_2::llama_n_ubatch(raw))
    };
    (found == shape).then_some(raw)
}

/// The `llama_context` address in `llama-cpp-2`'s `Debug` text of a context.
fn debug_address(debug: &str) -> Option<usize> {
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

/// Has `hook` run when the process exits (the C library's `atexit`), before the destructors of
/// the static objects llama.cpp constructed until now. False if the C library had no room.
pub(crate) fn at_process_exit(hook: extern "C" fn()) -> bool {
    extern "C" {
        fn atexit(hook: extern "C" fn()) -> std::os::raw::c_int;
    }
    // SAFETY: `atexit` only stores the pointer; `hook` is a function, valid for the whole run,
    // and as an `extern "C" fn` it cannot unwind into the C library (a panic aborts).
    unsafe { atexit(hook) == 0 }
}

#[cfg(test)]
mod tests {
    use super::{checked_address, debug_address, flash_attention_choice, set_threads};
    use crate::engine::threads::ThreadCounts;
    use llama_cpp_2::context::params::LlamaContextParams;
    use llama_cpp_2::model::params::LlamaModelParams;
    use llama_cpp_2::model::LlamaModel;
    use std::num::NonZeroU32;

    #[test]
    fn the_threads_are_set_on_the_context_itself_and_read_back() {
        let backend = crate::engine::load::backend().expect("llama.cpp's backend");
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/models/SmolLM2-135M-Instruct.Q4_1.gguf");
        let model = LlamaModel::load_from_file(backend, path, &LlamaModelParams::default()).expect("SmolLM2 loads");
        let params = |n_ctx: u32| {
            LlamaContextParams::default()
                .with_n_ctx(NonZeroU32::new(n_ctx))
                .with_n_batch(128)
                .with_n_ubatch(64)
                .with_n_threads(2)
                .with_n_threads_batch(2)
        };
        let mut small = model.new_context(backend, params(256)).expect("a context");
        let mut large = model.new_context(backend, params(512)).expect("another");
        let shape = |ctx: &llama_cpp_2::context::LlamaContext<'_>| (ctx.n_ctx(), ctx.n_batch(), ctx.n_ubatch());
        // The address printed is the context's: its sizes are the ones the wrapper reports.
        assert!(checked_address(&format!("{small:?}"), shape(&small)).is_some());
        assert!(checked_address(&format!("{large:?}"), shape(&large)).is_some());
        // Another (real) context's address is refused: its sizes differ.
        assert_eq!(checked_address(&format!("{large:?}"), shape(&small)), None);
        // What is set is what llama.cpp then reports for the context.
        let set = ThreadCounts { generation: 1, batch: 3 };
        assert_eq!(set_threads(&mut small, set), Some(set));
        let other = ThreadCounts { generation: 3, batch: 1 };
        assert_eq!(set_threads(&mut large, other), Some(other));
    }

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
        assert_eq!(debug_address("LlamaContext { context: 0x5603a1b2c3d0 }"), Some(0x5603_a1b2_c3d0));
        assert_eq!(debug_address("LlamaContext { context: 0x0 }"), None);
        assert_eq!(debug_address("LlamaContext { context: Ptr(0x5603a1b2c3d0) }"), None);
        assert_eq!(debug_address("LlamaContext { context: 0x56zz }"), None);
    }
}
