//! The `firstword` command line: parses flags ([`cli`]), sets up logging, starts the engine and
//! serves, or runs the benchmark.

mod cli;

use std::net::SocketAddr;
use std::process::ExitCode;

use clap::Parser;
use firstword::engine::LLAMA_CPP_BUILD;
use firstword::{Engine, EngineConfig};
use tracing_subscriber::EnvFilter;

use cli::{BenchAction, BenchArgs, Cli, Command, RpcServerArgs, ServeArgs};

fn main() -> ExitCode {
    let cli = Cli::parse();
    // Built for the fault tests only: failures injected from `FAILPOINTS`.
    #[cfg(feature = "failpoints")]
    let _failpoints = fail::FailScenario::setup();
    // llama.cpp's own log is routed into tracing under `llama-cpp-2`; quiet unless asked for.
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info,llama-cpp-2=warn"));
    tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).init();
    let result = match &cli.command {
        Command::Serve(args) => serve(args),
        Command::Bench(args) => bench(args),
        Command::RpcServer(args) => rpc_server(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e:#}");
            ExitCode::FAILURE
        }
    }
}

#[tokio::main]
async fn serve(args: &ServeArgs) -> anyhow::Result<()> {
    let address: SocketAddr = tokio::net::lookup_host((args.server.host.as_str(), args.server.port))
        .await?
        .next()
        .ok_or_else(|| anyhow::anyhow!("cannot resolve {}", args.server.host))?;
    let listener =
        tokio::net::TcpListener::bind(address).await.map_err(|e| anyhow::anyhow!("cannot listen on {address}: {e}"))?;
    let address = listener.local_addr()?;
    let options = args.server.serve_options()?;
    if !address.ip().is_loopback() && !options.api_keys.required() {
        tracing::warn!(
            "listening on {address}, beyond this machine, without an API key: anyone who can reach it may use it (--api-key)"
        );
    }
    let config = EngineConfig { warm: args.warm_prompts()?, ..args.engine_config() };
    // Listen first, so /health answers 503 while the model loads (and warms).
    let engine = Engine::spawn(config);
    let served = firstword::api::serve_with(listener, engine.clone(), options, stop_serving(engine.clone()));
    let mut server = tokio::spawn(served);
    let info = tokio::select! {
        info = engine.wait_ready() => info.map_err(|e| anyhow::anyhow!(cli::in_flag_terms(&e)))?,
        served = &mut server => return served?.map_err(Into::into),
    };
    for device in &info.devices {
        tracing::info!(
            "device {} ({}, {}): {} MiB, {} MiB free",
            device.name,
            device.backend,
            device.description,
            device.memory_total >> 20,
            device.memory_free >> 20
        );
    }
    tracing::info!(
        "firstword {} ready: model {} (arch {}), context {} tokens{}, template {}, tool calls {}, threads {}/{} (gen/batch), {}, listening on http://{address}",
        env!("CARGO_PKG_VERSION"),
        args.model.path.display(),
        info.architecture,
        info.n_ctx,
        info.n_swa.map_or(String::new(), |n| format!(", sliding window {n}")),
        info.template_source,
        info.tool_format.name(),
        info.threads,
        info.threads_batch,
        LLAMA_CPP_BUILD,
    );
    tracing::info!("console: open {} in a browser", console_url(address));
    // The server ends after a shutdown signal, once open responses have closed, or when the
    // engine cannot serve any more: then exit non-zero, so that systemd restarts the server.
    server.await??;
    if let Err(e @ firstword::EngineError::EngineDied(_)) = engine.model_info() {
        return Err(anyhow::anyhow!("{e}; exiting so that a supervisor restarts firstword"));
    }
    // Let llama.cpp finish its last step before the process exits.
    engine.shutdown();
    tokio::task::spawn_blocking(move || engine.wait_stopped()).await?;
    tracing::info!("stopped");
    Ok(())
}

/// The console's address for a browser on this machine: a server bound to every address
/// (`0.0.0.0`, `::`) is reached through loopback.
fn console_url(address: SocketAddr) -> String {
    let ip = match address.ip() {
        std::net::IpAddr::V4(ip) if ip.is_unspecified() => std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST),
        std::net::IpAddr::V6(ip) if ip.is_unspecified() => std::net::IpAddr::V6(std::net::Ipv6Addr::LOCALHOST),
        ip => ip,
    };
    format!("http://{}/", SocketAddr::new(ip, address.port()))
}

/// Resolves when the server should stop: on a shutdown signal, or once the inference thread
/// has died (`/health` answers 503 while open responses end).
async fn stop_serving(engine: Engine) {
    tokio::select! {
        () = shutdown_signal(engine.clone()) => {},
        died = engine.wait_died() => tracing::error!("stopping the server: {died}"),
    }
}

/// Resolves on Ctrl-C or SIGTERM, after telling the engine to end running generations.
async fn shutdown_signal(engine: Engine) {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {},
        () = terminate => {},
    }
    tracing::info!("shutting down: ending running generations, refusing new requests");
    engine.shutdown();
}

/// `firstword rpc-server`: serves until the process is stopped.
fn rpc_server(args: &RpcServerArgs) -> anyhow::Result<()> {
    firstword::engine::serve_rpc(&args.options()).map_err(Into::into)
}

#[tokio::main]
async fn bench(args: &BenchArgs) -> anyhow::Result<()> {
    match &args.action {
        None => firstword::bench::execute(&args.config()?, &args.outputs()).await?,
        Some(BenchAction::Verdict(verdict)) => {
            let (dir, options, judge) = verdict.parts()?;
            if let Some(judge) = &judge {
                firstword::bench::judge(&dir, judge).await?;
            }
            firstword::bench::decide_run(&dir, &options)?;
        }
        Some(BenchAction::Grade(grade)) => {
            let dir = firstword::bench::quality::RunDir::open(&grade.run_dir)?;
            let units = dir.units()?;
            let listener = tokio::net::TcpListener::bind(("127.0.0.1", grade.port))
                .await
                .map_err(|e| anyhow::anyhow!("cannot listen on 127.0.0.1:{}: {e} (--port)", grade.port))?;
            println!(
                "grade {} units blind at http://{} (Ctrl-C when done; grades are saved as they are given)",
                units.len(),
                listener.local_addr()?
            );
            firstword::bench::grade::serve_grading(dir, listener).await?;
        }
    }
    Ok(())
}
