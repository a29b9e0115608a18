//! Layers on other machines through llama.cpp's RPC backend (`ggml-rpc`): the endpoints `--rpc`
//! names, checked here before llama.cpp sees them (it aborts the process on one it cannot reach
//! or that answers in another protocol), and the addresses `firstword rpc-server` may listen on
//! (the protocol has no authentication: never a public one).

use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream, ToSocketAddrs};
use std::str::FromStr;
use std::time::Duration;

use parking_lot::Mutex;

use super::ffi::devices::{
    add_rpc_server, before_abort, device_list, device_memory, rpc_server_registered, DeviceFacts, DeviceKind,
    RpcSetupError,
};
use super::EngineError;

/// The RPC protocol version this build's `ggml-rpc` speaks (`RPC_PROTO_MAJOR_VERSION` and
/// `RPC_PROTO_MINOR_VERSION` in `ggml-rpc.h`): llama.cpp refuses a server of another major
/// version or a newer minor one.
const PROTOCOL: (u8, u8) = (7, 0);

/// `RPC_CMD_HELLO`, the first command of every connection.
const HELLO: u8 = 14;

/// Bytes of the connection capabilities a HELLO carries both ways (`RPC_CONN_CAPS_SIZE`).
const CAPS: usize = 24;

/// How long the check of one endpoint waits to connect, and then for its answer.
pub(crate) const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// One `HOST:PORT` of `--rpc`, as llama.cpp parses it (the host is what precedes the last `:`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RpcEndpoint {
    host: String,
    port: u16,
}

impl RpcEndpoint {
    /// The port.
    #[must_use]
    pub fn port(&self) -> u16 {
        self.port
    }
}

impl std::fmt::Display for RpcEndpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.host, self.port)
    }
}

impl FromStr for RpcEndpoint {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let text = text.trim();
        let (host, port) = text.rsplit_once(':').ok_or_else(|| format!("`{text}` is not HOST:PORT"))?;
        // llama.cpp resolves the host as given: a bracketed IPv6 address would not resolve.
        if host.is_empty() || host.contains(['[', ']', ',', ' ']) || host.contains(':') {
            return Err(format!("`{text}`: the host must be a name or an IPv4 address (HOST:PORT)"));
        }
        let port = port.parse::<u16>().ok().filter(|&p| p > 0).ok_or_else(|| format!("`{text}`: bad port"))?;
        Ok(Self { host: host.to_string(), port })
    }
}

/// Why an endpoint cannot be used.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RpcProbeError {
    /// No connection: nothing listens there, or the host cannot be reached or resolved.
    #[error("cannot connect ({0})")]
    Unreachable(String),
    /// It accepted but did not answer the protocol's greeting in time: an RPC server serves one
    /// client at a time (another is connected), or something else listens there.
    #[error("it accepted the connection but did not answer the RPC greeting in {}s (an RPC server serves one client at a time: is another firstword or llama-server using it?)", PROBE_TIMEOUT.as_secs())]
    Silent,
    /// It answered, but not as an RPC server.
    #[error("what listens there is not an RPC server")]
    NotRpc,
    /// An RPC server of a protocol this build cannot speak.
    #[error("its RPC protocol is {0}.{1}.{2}, this build speaks {major}.{minor}.x (build both from the same llama.cpp)", major = PROTOCOL.0, minor = PROTOCOL.1)]
    Version(u8, u8, u8),
}

/// Checks that an RPC server of this protocol answers at `endpoint`: connects, greets it as
/// llama.cpp does, reads its version and hangs up (the server then waits for its next client).
///
/// # Errors
/// [`RpcProbeError`] saying what was found instead.
pub fn probe(endpoint: &RpcEndpoint, timeout: Duration) -> Result<(), RpcProbeError> {
    let addresses: Vec<SocketAddr> = (endpoint.host.as_str(), endpoint.port)
        .to_socket_addrs()
        .map_err(|e| RpcProbeError::Unreachable(format!("cannot resolve {}: {e}", endpoint.host)))?
        .collect();
    let mut last = String::from("no address");
    let mut stream = None;
    for address in addresses {
        match TcpStream::connect_timeout(&address, timeout) {
            // Nothing listened, and the kernel picked the same port to connect from (an
            // ephemeral port): the socket met itself, and would echo the greeting back.
            Ok(s) if s.local_addr().ok() == s.peer_addr().ok() => last = "nothing listens there".into(),
            Ok(s) => {
                stream = Some(s);
                break;
            }
            Err(e) => last = e.to_string(),
        }
    }
    let mut stream = stream.ok_or(RpcProbeError::Unreachable(last))?;
    stream.set_read_timeout(Some(timeout)).map_err(|e| RpcProbeError::Unreachable(e.to_string()))?;
    stream.set_write_timeout(Some(timeout)).map_err(|e| RpcProbeError::Unreachable(e.to_string()))?;
    let mut hello = vec![HELLO];
    hello.extend_from_slice(&(CAPS as u64).to_le_bytes());
    hello.extend_from_slice(&[0; CAPS]);
    stream.write_all(&hello).map_err(|e| RpcProbeError::Unreachable(e.to_string()))?;
    let mut answer = [0u8; 8 + 4 + CAPS];
    stream.read_exact(&mut answer).map_err(|e| match e.kind() {
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => RpcProbeError::Silent,
        _ => RpcProbeError::NotRpc,
    })?;
    check_greeting(&answer)
}

/// Reads a server's answer to HELLO: its size (8 bytes, little-endian), then the version.
fn check_greeting(answer: &[u8; 8 + 4 + CAPS]) -> Result<(), RpcProbeError> {
    let mut size = [0u8; 8];
    size.copy_from_slice(&answer[..8]);
    if u64::from_le_bytes(size) != (4 + CAPS) as u64 {
        return Err(RpcProbeError::NotRpc);
    }
    let (major, minor, patch) = (answer[8], answer[9], answer[10]);
    if major != PROTOCOL.0 || minor > PROTOCOL.1 {
        return Err(RpcProbeError::Version(major, minor, patch));
    }
    Ok(())
}

/// The endpoints this process drives, for the message written before ggml aborts.
static DRIVEN: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// Checks every endpoint ([`probe`]) and registers each with llama.cpp, in order, so that its
/// devices can hold layers. Refuses at the first that cannot be used, naming it and what to run
/// there.
///
/// # Errors
/// [`EngineError::Rpc`] naming the endpoint; [`EngineError::RpcUnavailable`] when llama.cpp
/// was built without its RPC backend.
pub(crate) fn connect(endpoints: &[RpcEndpoint], timeout: Duration) -> Result<(), EngineError> {
    if !endpoints.is_empty() {
        let named: Vec<String> = endpoints.iter().map(ToString::to_string).collect();
        super::stall::watch(timeout, named.join(", "));
    }
    for endpoint in endpoints {
        if rpc_server_registered(&endpoint.to_string()) {
            continue;
        }
        probe(endpoint, PROBE_TIMEOUT)
            .map_err(|e| EngineError::Rpc { endpoint: endpoint.to_string(), reason: e.to_string() })?;
        before_abort(explain_abort);
        DRIVEN.lock().push(endpoint.to_string());
        match add_rpc_server(&endpoint.to_string()) {
            Ok(()) => tracing::info!(%endpoint, "RPC server connected"),
            Err(RpcSetupError::NoBackend) => return Err(EngineError::RpcUnavailable),
            Err(RpcSetupError::NoDevices) => {
                return Err(EngineError::Rpc { endpoint: endpoint.to_string(), reason: "it offers no device".into() })
            }
        }
    }
    Ok(())
}

/// Written before ggml aborts the process: with RPC servers, most often one of them stopped
/// answering mid-computation, and ggml-rpc cannot go on without it.
fn explain_abort(message: &str) {
    let driven = DRIVEN.lock().join(", ");
    if driven.is_empty() {
        tracing::error!("llama.cpp stops the process: {message}");
    } else {
        tracing::error!(
            "llama.cpp stops the process: {message}. The model's layers are on the RPC servers {driven}: one \
             stopped answering (stopped, crashed, or the network dropped) and llama.cpp cannot go on without \
             it. Start it again, then firstword (a service manager's restart does: firstword refuses to start \
             until every server answers)."
        );
    }
}

/// A device a model's layers may be placed on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceInfo {
    /// ggml's name (`CPU`, `CUDA0`, `RPC0`).
    pub name: String,
    /// What it is (the CPU's or GPU's name; an RPC device's endpoint).
    pub description: String,
    /// The ggml backend (`CPU`, `CUDA`, `Metal`, `RPC`).
    pub backend: String,
    /// Its memory, in bytes.
    pub memory_total: u64,
    /// Its memory free when asked, in bytes.
    pub memory_free: u64,
}

/// The devices (indices in ggml's device list) to give llama.cpp for a model whose engine
/// drives the RPC servers `rpc` (already [`connect`]ed); `None` for llama.cpp's own default.
/// Asks no device anything.
pub(crate) fn explicit_devices(rpc: &[RpcEndpoint]) -> Option<Vec<usize>> {
    let all = device_list();
    // llama.cpp's default takes every registered RPC server's devices: told explicitly as soon
    // as one is registered in this process, so that another engine's servers are not used.
    all.iter().any(|d| d.backend == "RPC").then(|| model_devices(&all, rpc))
}

/// Every device a model placed for `rpc` may use, the CPU's first, with its memory as the
/// device reports it now (an RPC device asks its server): the start-up log and `/v1/models`.
pub(crate) fn shown_devices(rpc: &[RpcEndpoint]) -> Vec<DeviceInfo> {
    let all = device_list();
    let chosen = model_devices(&all, rpc);
    (all.iter().filter(|d| d.kind == DeviceKind::Cpu))
        .chain(chosen.iter().filter_map(|&index| all.iter().find(|d| d.index == index)))
        .map(|d| {
            let (memory_free, memory_total) = device_memory(d.index).unwrap_or_default();
            DeviceInfo {
                name: d.name.clone(),
                description: d.description.clone(),
                backend: d.backend.clone(),
                memory_total,
                memory_free,
            }
        })
        .collect()
}

/// llama.cpp's default order: the RPC servers' devices first (in `rpc`'s order), then the
/// local GPUs, or the integrated ones where there is no discrete GPU.
fn model_devices(all: &[DeviceFacts], rpc: &[RpcEndpoint]) -> Vec<usize> {
    let remote = rpc.iter().flat_map(|endpoint| {
        let endpoint = endpoint.to_string();
        all.iter().filter(move |d| d.backend == "RPC" && d.description == endpoint).map(|d| d.index)
    });
    let local = |kind: DeviceKind| all.iter().filter(move |d| d.kind == kind && d.backend != "RPC").map(|d| d.index);
    let gpus: Vec<usize> = local(DeviceKind::Gpu).collect();
    let locals = if gpus.is_empty() { local(DeviceKind::IntegratedGpu).collect() } else { gpus };
    remote.chain(locals).collect()
}

/// The devices `firstword rpc-server` serves: the GPUs (discrete or integrated), or the CPU
/// where there is none; those named in `names` when given. `Err` names one not found.
pub(crate) fn served_devices(names: &[String]) -> Result<Vec<(usize, String)>, String> {
    let all: Vec<DeviceFacts> = device_list().into_iter().filter(|d| d.backend != "RPC").collect();
    let describe = |d: &DeviceFacts| {
        let total = device_memory(d.index).map_or(0, |(_, total)| total);
        format!("{} ({}, {} MiB)", d.name, d.description, total >> 20)
    };
    if !names.is_empty() {
        return names
            .iter()
            .map(|name| {
                all.iter().find(|d| d.name.eq_ignore_ascii_case(name)).map(|d| (d.index, describe(d))).ok_or_else(
                    || {
                        let known: Vec<&str> = all.iter().map(|d| d.name.as_str()).collect();
                        format!("no device `{name}` (this machine has {})", known.join(", "))
                    },
                )
            })
            .collect();
    }
    let of = |kinds: &[DeviceKind]| -> Vec<(usize, String)> {
        all.iter().filter(|d| kinds.contains(&d.kind)).map(|d| (d.index, describe(d))).collect()
    };
    let gpus = of(&[DeviceKind::Gpu, DeviceKind::IntegratedGpu]);
    Ok(if gpus.is_empty() { of(&[DeviceKind::Cpu]) } else { gpus })
}

/// What `firstword rpc-server` serves, and where.
#[derive(Clone, Debug)]
pub struct RpcServerOptions {
    /// The address to listen on: this machine's address on a private network, or loopback.
    pub host: String,
    /// The port (llama.cpp's rpc-server's default is 50052).
    pub port: u16,
    /// Threads of a CPU device.
    pub threads: u32,
    /// Keeps the large tensors a client sends, so that its next start loads faster.
    pub cache_dir: Option<std::path::PathBuf>,
    /// ggml's names of the devices to serve (`CUDA0`, `CPU`); empty: the GPUs, or the CPU.
    pub devices: Vec<String>,
}

/// Serves this machine's devices to one RPC client at a time (a firstword or llama-server
/// started with `--rpc`), until the process ends.
///
/// # Errors
/// [`EngineError::RpcServe`]: an address that is not private, a device not found, a build
/// without the RPC backend, or a port that cannot be bound.
pub fn serve_rpc(options: &RpcServerOptions) -> Result<(), EngineError> {
    let refuse = |why: String| EngineError::RpcServe(why);
    let address = (options.host.as_str(), options.port)
        .to_socket_addrs()
        .map_err(|e| refuse(format!("cannot resolve {}: {e}", options.host)))?
        .find(SocketAddr::is_ipv4)
        .ok_or_else(|| refuse(format!("{} has no IPv4 address (llama.cpp's RPC listens on IPv4)", options.host)))?;
    if !private_address(address.ip()) {
        return Err(refuse(format!(
            "refusing to listen on {}: llama.cpp's RPC protocol has no authentication, and whoever reaches the port \
             can read and write this machine's model memory. Listen on this machine's address on a private network \
             (192.168.x.x, 10.x.x.x, 172.16-31.x.x, a Tailscale 100.x address) or 127.0.0.1",
            address.ip()
        )));
    }
    super::load::backend()?;
    let devices = served_devices(&options.devices).map_err(refuse)?;
    let indices: Vec<usize> = devices.iter().map(|(index, _)| *index).collect();
    let names: Vec<&str> = devices.iter().map(|(_, name)| name.as_str()).collect();
    tracing::info!("serving {} over RPC at {address}, one client at a time", names.join(", "));
    // Bound here first: ggml-rpc only prints a failure to bind.
    drop(std::net::TcpListener::bind(address).map_err(|e| refuse(format!("cannot listen on {address}: {e}")))?);
    super::ffi::devices::serve_rpc(
        &address.to_string(),
        options.cache_dir.as_deref(),
        options.threads as usize,
        &indices,
    )
    .map_err(|e| match e {
        RpcSetupError::NoBackend => EngineError::RpcUnavailable,
        RpcSetupError::NoDevices => refuse("no device to serve".into()),
    })?;
    Err(refuse(format!("the RPC server at {address} stopped (llama.cpp's message above says why)")))
}

/// Whether an RPC server may listen on `ip`: this machine (loopback) or a private network
/// (RFC 1918, shared CGNAT space as Tailscale uses, link-local, IPv6 unique-local). Never an
/// unspecified (every interface) or public address: the protocol has no authentication, and
/// whoever reaches the port can read and write the server's memory buffers.
#[must_use]
pub fn private_address(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => {
            let [a, b, ..] = v4.octets();
            v4.is_loopback() || v4.is_private() || v4.is_link_local() || (a == 100 && (64..128).contains(&b))
        }
        IpAddr::V6(v6) => {
            let first = v6.segments()[0];
            v6.is_loopback() || (first & 0xfe00) == 0xfc00 || (first & 0xffc0) == 0xfe80
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn device(index: usize, name: &str, backend: &str, kind: DeviceKind, description: &str) -> DeviceFacts {
        DeviceFacts { index, name: name.into(), description: description.into(), backend: backend.into(), kind }
    }

    #[test]
    fn a_model_takes_its_own_rpc_servers_first_then_the_local_gpus() {
        use DeviceKind::{Cpu, Gpu, IntegratedGpu};
        let all = [
            device(0, "CPU", "CPU", Cpu, "Ryzen"),
            device(1, "Vulkan0", "Vulkan", IntegratedGpu, "Radeon 780M"),
            device(2, "RPC0", "RPC", Gpu, "10.0.0.2:50052"),
            device(3, "RPC1", "RPC", Gpu, "10.0.0.3:50052"),
            device(4, "RPC2", "RPC", Gpu, "10.0.0.3:50052"),
        ];
        let endpoint = |text: &str| text.parse::<RpcEndpoint>().expect("valid");
        assert_eq!(model_devices(&all, &[endpoint("10.0.0.3:50052"), endpoint("10.0.0.2:50052")]), [3, 4, 2, 1]);
        // Another engine's server is not taken.
        assert_eq!(model_devices(&all, &[endpoint("10.0.0.2:50052")]), [2, 1]);
        assert_eq!(model_devices(&all, &[]), [1]);
        let with_gpu = [
            device(0, "CPU", "CPU", Cpu, ""),
            device(1, "CUDA0", "CUDA", Gpu, ""),
            device(2, "Vulkan0", "Vulkan", IntegratedGpu, ""),
        ];
        assert_eq!(model_devices(&with_gpu, &[]), [1]);
    }

    #[test]
    fn endpoints_are_parsed_as_llama_cpp_parses_them() {
        let endpoint: RpcEndpoint = "192.168.1.20:50052".parse().expect("valid");
        assert_eq!(endpoint.to_string(), "192.168.1.20:50052");
        assert_eq!(endpoint.port(), 50052);
        assert_eq!("gpu-box.lan:1".parse::<RpcEndpoint>().map(|e| e.to_string()), Ok("gpu-box.lan:1".into()));
        for bad in ["", "host", ":50052", "host:", "host:0", "host:70000", "[::1]:50052", "::1:50052", "a b:1"] {
            assert!(bad.parse::<RpcEndpoint>().is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn only_private_addresses_may_serve_rpc() {
        for ok in [
            "127.0.0.1",
            "10.0.0.5",
            "172.16.3.4",
            "192.168.1.20",
            "100.101.102.103",
            "169.254.1.1",
            "::1",
            "fd7a:115c::1",
            "fe80::1",
        ] {
            assert!(private_address(ok.parse().expect("ip")), "{ok} refused");
        }
        for public in ["0.0.0.0", "8.8.8.8", "172.32.0.1", "100.128.0.1", "::", "2001:db8::1", "2a00:1450::1"] {
            assert!(!private_address(public.parse().expect("ip")), "{public} allowed");
        }
    }

    #[test]
    fn the_greeting_is_checked_for_size_and_version() {
        let greeting = |size: u64, major: u8, minor: u8| {
            let mut answer = [0u8; 8 + 4 + CAPS];
            answer[..8].copy_from_slice(&size.to_le_bytes());
            answer[8] = major;
            answer[9] = minor;
            answer
        };
        assert_eq!(check_greeting(&greeting(28, 7, 0)), Ok(()));
        assert_eq!(check_greeting(&greeting(28, 7, 1)), Err(RpcProbeError::Version(7, 1, 0)));
        assert_eq!(check_greeting(&greeting(28, 6, 0)), Err(RpcProbeError::Version(6, 0, 0)));
        assert_eq!(check_greeting(&greeting(0x5054_5448, 7, 0)), Err(RpcProbeError::NotRpc));
    }

    #[test]
    fn an_endpoint_where_nothing_listens_is_unreachable() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
        let port = listener.local_addr().expect("address").port();
        drop(listener);
        let endpoint: RpcEndpoint = format!("127.0.0.1:{port}").parse().expect("valid");
        assert!(matches!(probe(&endpoint, PROBE_TIMEOUT), Err(RpcProbeError::Unreachable(_))));
    }

    #[test]
    fn a_server_that_accepts_and_stays_silent_or_speaks_http_is_named() {
        let silent = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
        let endpoint: RpcEndpoint =
            format!("127.0.0.1:{}", silent.local_addr().expect("address").port()).parse().expect("valid");
        assert_eq!(probe(&endpoint, Duration::from_millis(200)), Err(RpcProbeError::Silent));
        let http = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
        let endpoint: RpcEndpoint =
            format!("127.0.0.1:{}", http.local_addr().expect("address").port()).parse().expect("valid");
        let answer = std::thread::spawn(move || {
            let (mut client, _) = http.accept().expect("the probe connects");
            let mut request = [0u8; 1 + 8 + CAPS];
            client.read_exact(&mut request).expect("the greeting");
            client.write_all(b"HTTP/1.1 400 Bad Request\r\n\r\nno such thing here at all").expect("answer");
        });
        assert_eq!(probe(&endpoint, PROBE_TIMEOUT), Err(RpcProbeError::NotRpc));
        answer.join().expect("the fake server");
    }
}
