//! Devices: the model loaded onto the devices and with the split the user chose (`llama-cpp-2`'s
//! model parameters cannot carry a tensor split), llama.cpp's RPC servers registered as devices,
//! this machine's devices served to another (`firstword rpc-server`), and the message written
//! when ggml aborts the process.

use std::collections::HashSet;
use std::ffi::{c_char, CStr, CString};
use std::path::Path;
use std::sync::OnceLock;

use llama_cpp_2::model::LlamaModel;
use parking_lot::Mutex;

use crate::engine::config::SplitMode;

/// Where a model's layers go and how its file is read.
pub(crate) struct Placement<'a> {
    /// Layers offloaded to the devices (the rest stay on the CPU).
    pub n_gpu_layers: u32,
    /// How the offloaded layers are split over the devices.
    pub split_mode: SplitMode,
    /// The one device used with [`SplitMode::None`].
    pub main_gpu: u32,
    /// Each device's share of the offloaded layers (empty: llama.cpp's, by free memory).
    pub tensor_split: &'a [f32],
    /// The devices, as indices of ggml's device list, in order; `None`: llama.cpp's default.
    pub devices: Option<&'a [usize]>,
    /// Memory-map the file.
    pub mmap: bool,
    /// Lock it in RAM.
    pub mlock: bool,
    /// Load the MTP heads too.
    pub load_mtp: bool,
    /// Let the CPU use its extra buffer types (repacked weights).
    pub repack: bool,
}

/// Loads the GGUF at `path` placed as `placement` says; `None` if llama.cpp could not (its log
/// says why) or a device index is out of range.
pub(crate) fn load_model(path: &Path, placement: &Placement<'_>) -> Option<LlamaModel> {
    let path = CString::new(path.to_str()?).ok()?;
    // SAFETY: returns a plain struct of defaults.
    let mut params = unsafe { llama_cpp_sys_2::llama_model_default_params() };
    params.n_gpu_layers = i32::try_from(placement.n_gpu_layers).unwrap_or(i32::MAX);
    params.split_mode = match placement.split_mode {
        SplitMode::None => llama_cpp_sys_2::LLAMA_SPLIT_MODE_NONE,
        SplitMode::Layer => llama_cpp_sys_2::LLAMA_SPLIT_MODE_LAYER,
        SplitMode::Row => llama_cpp_sys_2::LLAMA_SPLIT_MODE_ROW,
        SplitMode::Tensor => llama_cpp_sys_2::LLAMA_SPLIT_MODE_TENSOR,
    };
    params.main_gpu = i32::try_from(placement.main_gpu).unwrap_or(i32::MAX);
    params.load_mode = match (placement.mmap, placement.mlock) {
        (false, false) => llama_cpp_sys_2::LLAMA_LOAD_MODE_NONE,
        (true, false) => llama_cpp_sys_2::LLAMA_LOAD_MODE_MMAP,
        (false, true) => llama_cpp_sys_2::LLAMA_LOAD_MODE_MLOCK,
        (true, true) => llama_cpp_sys_2::LLAMA_LOAD_MODE_MMAP_MLOCK,
    };
    params.load_mtp = placement.load_mtp;
    params.use_extra_bufts = placement.repack;
    // llama.cpp reads one share per device it uses, at most `llama_max_devices()` of them.
    // SAFETY: reads a constant.
    let max_devices = unsafe { llama_cpp_sys_2::llama_max_devices() };
    let mut split = placement.tensor_split.to_vec();
    if !split.is_empty() {
        if split.len() > max_devices {
            return None;
        }
        split.resize(max_devices, 0.0);
        params.tensor_split = split.as_ptr();
    }
    let mut devices = match placement.devices {
        Some(indices) => Some(device_pointers(indices)?),
        None => None,
    };
    if let Some(devices) = devices.as_mut() {
        params.devices = devices.as_mut_ptr();
    }
    // SAFETY: `path` is a C string; `params` points at `split` and `devices` (null-terminated),
    // both alive until the call returns, which is as long as llama.cpp reads them.
    let raw = unsafe { llama_cpp_sys_2::llama_model_load_from_file(path.as_ptr(), params) };
    if raw.is_null() {
        return None;
    }
    // SAFETY: `LlamaModel` is `#[repr(transparent)]` over a non-null `llama_model` pointer
    // (llama-cpp-2 pinned to =0.1.160, size asserted in `super`); `raw` is non-null and owned
    // by nobody else, and `LlamaModel`'s drop frees it with `llama_model_free`, as its own
    // `load_from_file` would.
    Some(unsafe { std::mem::transmute::<*mut llama_cpp_sys_2::llama_model, LlamaModel>(raw) })
}

/// ggml's devices at `indices`, null-terminated; `None` if one is out of range.
fn device_pointers(indices: &[usize]) -> Option<Vec<llama_cpp_sys_2::ggml_backend_dev_t>> {
    // SAFETY: reads the registry's count.
    let count = unsafe { llama_cpp_sys_2::ggml_backend_dev_count() };
    let mut devices = Vec::with_capacity(indices.len() + 1);
    for &index in indices {
        if index >= count {
            return None;
        }
        // SAFETY: `index` is below the count; devices are never unregistered.
        devices.push(unsafe { llama_cpp_sys_2::ggml_backend_dev_get(index) });
    }
    devices.push(std::ptr::null_mut());
    Some(devices)
}

/// What kind of device ggml says one is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum DeviceKind {
    /// The CPU.
    Cpu,
    /// A discrete GPU, or an RPC server's device.
    Gpu,
    /// An integrated GPU.
    IntegratedGpu,
    /// Anything else (an accelerator the CPU's buffers use).
    Other,
}

/// A device of ggml's list, without its memory (asking an RPC device's memory is a network
/// call, and ggml aborts the process if its server has gone).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct DeviceFacts {
    /// Its index in ggml's list.
    pub index: usize,
    /// ggml's name (`CPU`, `CUDA0`, `RPC0`).
    pub name: String,
    /// What it is; an RPC device's endpoint.
    pub description: String,
    /// Its backend's name (`CPU`, `CUDA`, `RPC`).
    pub backend: String,
    /// Its kind.
    pub kind: DeviceKind,
}

/// ggml's devices, in its order.
pub(crate) fn device_list() -> Vec<DeviceFacts> {
    let text = |ptr: *const c_char| {
        if ptr.is_null() {
            String::new()
        } else {
            // SAFETY: ggml returns C strings it keeps for the device's (the process') life.
            unsafe { CStr::from_ptr(ptr) }.to_string_lossy().into_owned()
        }
    };
    // SAFETY: reads the registry's count.
    let count = unsafe { llama_cpp_sys_2::ggml_backend_dev_count() };
    (0..count)
        .map(|index| {
            // SAFETY: `index` is below the count; these calls read the device's own fields
            // (none asks an RPC server anything).
            unsafe {
                let device = llama_cpp_sys_2::ggml_backend_dev_get(index);
                let kind = match llama_cpp_sys_2::ggml_backend_dev_type(device) {
                    llama_cpp_sys_2::GGML_BACKEND_DEVICE_TYPE_CPU => DeviceKind::Cpu,
                    llama_cpp_sys_2::GGML_BACKEND_DEVICE_TYPE_GPU => DeviceKind::Gpu,
                    llama_cpp_sys_2::GGML_BACKEND_DEVICE_TYPE_IGPU => DeviceKind::IntegratedGpu,
                    _ => DeviceKind::Other,
                };
                let backend =
                    llama_cpp_sys_2::ggml_backend_reg_name(llama_cpp_sys_2::ggml_backend_dev_backend_reg(device));
                DeviceFacts {
                    index,
                    name: text(llama_cpp_sys_2::ggml_backend_dev_name(device)),
                    description: text(llama_cpp_sys_2::ggml_backend_dev_description(device)),
                    backend: text(backend),
                    kind,
                }
            }
        })
        .collect()
}

/// The device's memory, `(free, total)` bytes; an RPC device asks its server.
pub(crate) fn device_memory(index: usize) -> Option<(u64, u64)> {
    // SAFETY: reads the registry's count.
    if index >= unsafe { llama_cpp_sys_2::ggml_backend_dev_count() } {
        return None;
    }
    let (mut free, mut total) = (0usize, 0usize);
    // SAFETY: `index` is below the count; the call writes the two numbers.
    unsafe {
        llama_cpp_sys_2::ggml_backend_dev_memory(llama_cpp_sys_2::ggml_backend_dev_get(index), &mut free, &mut total)
    };
    Some((free as u64, total as u64))
}

/// Why an RPC server could not be added.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RpcSetupError {
    /// llama.cpp was built without its RPC backend.
    NoBackend,
    /// The server reported no device.
    NoDevices,
}

/// The endpoints registered in this process (llama.cpp's registry would list an endpoint's
/// devices twice if it were registered twice).
static REGISTERED: Mutex<Option<HashSet<String>>> = Mutex::new(None);

/// Whether `endpoint` is registered in this process already (its one connection is open: an RPC
/// server serves one client at a time, so a second engine of the process shares it).
pub(crate) fn rpc_server_registered(endpoint: &str) -> bool {
    REGISTERED.lock().as_ref().is_some_and(|set| set.contains(endpoint))
}

/// Registers the RPC server at `endpoint` (`HOST:PORT`) with ggml, as llama.cpp's `--rpc`
/// does: its devices join ggml's device list, described by the endpoint. Connects to it, and
/// ggml **aborts the process** if it cannot or if the server does not greet it: the caller
/// checks the endpoint first ([`crate::engine::remote::probe`]).
pub(crate) fn add_rpc_server(endpoint: &str) -> Result<(), RpcSetupError> {
    let mut registered = REGISTERED.lock();
    if registered.as_ref().is_some_and(|set| set.contains(endpoint)) {
        return Ok(());
    }
    let add = rpc_function(c"ggml_backend_rpc_add_server")?;
    // SAFETY: ggml-rpc returns this function for this name:
    // `ggml_backend_reg_t ggml_backend_rpc_add_server(const char * endpoint)`.
    let add: unsafe extern "C" fn(*const c_char) -> llama_cpp_sys_2::ggml_backend_reg_t =
        unsafe { std::mem::transmute(add) };
    let endpoint_c = CString::new(endpoint).map_err(|_| RpcSetupError::NoDevices)?;
    // SAFETY: a C string; the function copies it.
    let reg = unsafe { add(endpoint_c.as_ptr()) };
    if reg.is_null() {
        return Err(RpcSetupError::NoDevices);
    }
    // SAFETY: `reg` is the registry entry ggml-rpc made for the endpoint (kept for the process).
    unsafe { llama_cpp_sys_2::ggml_backend_register(reg) };
    registered.get_or_insert_with(HashSet::new).insert(endpoint.to_string());
    Ok(())
}

/// A function of ggml-rpc's, by name.
fn rpc_function(name: &CStr) -> Result<*mut std::ffi::c_void, RpcSetupError> {
    // SAFETY: looks a name up in ggml's registry.
    let rpc = unsafe { llama_cpp_sys_2::ggml_backend_reg_by_name(c"RPC".as_ptr()) };
    if rpc.is_null() {
        return Err(RpcSetupError::NoBackend);
    }
    // SAFETY: `rpc` is a live registry entry; `name` a C string.
    let function = unsafe { llama_cpp_sys_2::ggml_backend_reg_get_proc_address(rpc, name.as_ptr()) };
    if function.is_null() {
        return Err(RpcSetupError::NoBackend);
    }
    Ok(function)
}

/// Serves the devices at `indices` to RPC clients at `endpoint` (`HOST:PORT`), one client at a
/// time, computing with `threads` on a CPU device; `cache_dir` keeps large tensors a client
/// sent, so a restarted client's model loads faster. Returns only when it could not start
/// (ggml-rpc printed why).
pub(crate) fn serve_rpc(
    endpoint: &str,
    cache_dir: Option<&Path>,
    threads: usize,
    indices: &[usize],
) -> Result<(), RpcSetupError> {
    let start = rpc_function(c"ggml_backend_rpc_start_server")?;
    // SAFETY: ggml-rpc returns this function for this name: `void
    // ggml_backend_rpc_start_server(const char * endpoint, const char * cache_dir, size_t
    // n_threads, size_t n_devices, ggml_backend_dev_t * devices)`.
    let start: unsafe extern "C" fn(
        *const c_char,
        *const c_char,
        usize,
        usize,
        *mut llama_cpp_sys_2::ggml_backend_dev_t,
    ) = unsafe { std::mem::transmute(start) };
    let mut devices = device_pointers(indices).ok_or(RpcSetupError::NoDevices)?;
    let endpoint = CString::new(endpoint).map_err(|_| RpcSetupError::NoDevices)?;
    let cache_dir = cache_dir.and_then(Path::to_str).and_then(|dir| CString::new(dir).ok());
    // SAFETY: C strings and `indices.len()` live device pointers, alive while the server runs.
    unsafe {
        start(
            endpoint.as_ptr(),
            cache_dir.as_ref().map_or(std::ptr::null(), |dir| dir.as_ptr()),
            threads,
            indices.len(),
            devices.as_mut_ptr(),
        );
    }
    Ok(())
}

/// What runs before ggml aborts the process.
static ABORT_HOOK: OnceLock<fn(&str)> = OnceLock::new();

/// Has `hook` called with ggml's message before ggml aborts the process (ggml-rpc aborts when
/// a server it drives stops answering). The first hook set stays.
pub(crate) fn before_abort(hook: fn(&str)) {
    if ABORT_HOOK.set(hook).is_ok() {
        // SAFETY: stores a function pointer; `abort_message` cannot unwind into C (a panic in
        // an `extern "C" fn` aborts, which is what follows anyway).
        unsafe { llama_cpp_sys_2::ggml_set_abort_callback(Some(abort_message)) };
    }
}

/// ggml's abort callback: hands its message to the hook.
unsafe extern "C" fn abort_message(message: *const c_char) {
    let text = if message.is_null() {
        String::new()
    } else {
        // SAFETY: ggml passes a C string it formatted, alive during the call.
        unsafe { CStr::from_ptr(message) }.to_string_lossy().into_owned()
    };
    if let Some(hook) = ABORT_HOOK.get() {
        hook(text.trim_end());
    }
}
