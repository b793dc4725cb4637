//! The `kraft` server binary: one quorum node plus its HTTP API.
//!
//! ```text
//! kraft [run] [--config FILE] [--set KEY=VALUE]...
//! ```
//!
//! `run` is the default subcommand and `config.toml` the default file;
//! `--set` overrides any key of the file (`--set node.id=2`). Exit codes:
//! 0 after a graceful shutdown (SIGTERM/SIGINT), 1 when the node cannot
//! start or fails, 2 for a bad command line, config file or value.

use std::io::IsTerminal;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use actix_rt::task::JoinHandle;
use actix_web::dev::ServerHandle;
use clap::{Parser, Subcommand};
use tokio::signal::unix::{signal, Signal, SignalKind};
use tracing_subscriber::EnvFilter;

use kraft::api::{ApiSecurity, ClientLimits, LocalHttpServer, Tokens};
use kraft::config::Config;
use kraft::node::{self, NodeHandle};

/// Longest a graceful shutdown of the node may take before the process
/// exits anyway (a leader's EndQuorumEpoch is best effort).
const NODE_SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(10);
/// How often the binary checks that the node is still running.
const STOPPED_POLL_INTERVAL: Duration = Duration::from_millis(250);

#[derive(Debug, Parser)]
#[command(
    name = "kraft",
    version,
    about = "Kafka's KRaft metadata quorum: one node and its HTTP API"
)]
struct Cli {
    /// The config file (TOML; the repository's config.toml documents every key).
    #[arg(long, value_name = "FILE", default_value = "config.toml", global = true)]
    config: PathBuf,
    /// Override a config key, e.g. `--set node.id=2`; may be repeated, and
    /// later ones win.
    #[arg(long = "set", value_name = "KEY=VALUE", value_parser = kraft::config::parse_override, global = true)]
    overrides: Vec<(String, String)>,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run a node until SIGTERM or SIGINT (the default).
    Run,
    /// Ask the node running with this config (at its `listeners.http`) to
    /// write a snapshot now; prints the snapshot as JSON.
    Snapshot,
    /// Write a development CA and a certificate for each node (ca.pem,
    /// ca.key, node-<id>.pem, node-<id>.key) for the `security.tls_*` keys.
    Certs {
        /// The directory to write them into.
        #[arg(long, value_name = "DIR")]
        out: PathBuf,
        /// The node ids, e.g. `1,2,3`.
        #[arg(long, value_delimiter = ',', required = true)]
        nodes: Vec<i32>,
        /// The host names and IP addresses every node is reached at.
        #[arg(long, value_delimiter = ',', default_value = "127.0.0.1,localhost")]
        hosts: Vec<String>,
    },
}

fn main() -> ExitCode {
    // clap prints its own usage errors and exits with code 2.
    let cli = Cli::parse();
    init_logging();
    if let Some(Command::Certs { out, nodes, hosts }) = &cli.command {
        return match kraft::tls::generate(out, nodes, hosts) {
            Ok(written) => {
                for path in written {
                    println!("{}", path.display());
                }
                ExitCode::SUCCESS
            }
            Err(err) => {
                eprintln!("kraft: certs: {err}");
                ExitCode::from(1)
            }
        };
    }
    let config = match Config::load(&cli.config, &cli.overrides) {
        Ok(config) => config,
        Err(err) => {
            // The error names the file or override, the key, the value and
            // what was expected.
            eprintln!("kraft: bad configuration: {err}");
            return ExitCode::from(2);
        }
    };
    let tokens = match &config.security.tokens_file {
        None => None,
        Some(path) => match Tokens::load(path) {
            Ok(tokens) => Some(Arc::new(tokens)),
            Err(err) => {
                eprintln!("kraft: bad tokens file (security.tokens_file): {err}");
                return ExitCode::from(2);
            }
        },
    };
    let tls = match &config.security.tls {
        None => None,
        Some(files) => match kraft::tls::Tls::load(files) {
            Ok(tls) => Some(tls),
            Err(err) => {
                eprintln!("kraft: bad TLS files (security.tls_*): {err}");
                return ExitCode::from(2);
            }
        },
    };
    match cli.command.unwrap_or(Command::Run) {
        Command::Certs { .. } => unreachable!("handled above"),
        Command::Run => {
            let security = ApiSecurity {
                tokens,
                tls: tls.map(|tls| tls.server),
            };
            let code = actix_rt::System::new().block_on(run(config, security));
            ExitCode::from(code)
        }
        Command::Snapshot => match request_snapshot(
            config.listeners.http,
            tokens.as_ref().and_then(|tokens| tokens.admin_token()),
            config.security.tls.as_ref().map(|files| files.ca_file.as_path()),
        ) {
            Ok(body) => {
                println!("{body}");
                ExitCode::SUCCESS
            }
            Err(err) => {
                eprintln!("kraft: snapshot: {err}");
                ExitCode::from(1)
            }
        },
    }
}

/// `POST /v1/snapshot` to a running node over plain HTTP/1.1 (with the
/// first admin token of the node's tokens file, if it has one); the body
/// on a 200, else an error with the status line and body.
fn request_snapshot(
    http: std::net::SocketAddr,
    token: Option<String>,
    ca_file: Option<&std::path::Path>,
) -> Result<String, String> {
    use std::io::{Read, Write};
    let mut addr = http;
    if addr.ip().is_unspecified() {
        addr.set_ip(std::net::Ipv4Addr::LOCALHOST.into());
    }
    let tcp = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(5))
        .map_err(|e| format!("cannot reach the node at {addr}: {e}"))?;
    // Writing a large snapshot takes a while; waiting is the point.
    tcp.set_read_timeout(Some(Duration::from_secs(600)))
        .map_err(|e| e.to_string())?;
    let mut stream: Box<dyn ReadWrite> = match ca_file {
        None => Box::new(tcp),
        Some(ca_file) => {
            let config = kraft::tls::client_config(ca_file).map_err(|e| e.to_string())?;
            let name = kraft::tls::server_name(&addr.to_string()).map_err(|e| e.to_string())?;
            let connection = rustls::ClientConnection::new(config, name).map_err(|e| e.to_string())?;
            Box::new(rustls::StreamOwned::new(connection, tcp))
        }
    };
    let authorization = token.map(|token| format!("Authorization: Bearer {token}\r\n"));
    let request = format!(
        "POST /v1/snapshot HTTP/1.1\r\nHost: {addr}\r\n{}Content-Length: 0\r\nConnection: close\r\n\r\n",
        authorization.unwrap_or_default()
    );
    stream
        .write_all(request.as_bytes())
        .map_err(|e| format!("cannot send the request: {e}"))?;
    let mut response = String::new();
    stream
        .read_to_string(&mut response)
        .map_err(|e| format!("no answer from {addr}: {e}"))?;
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or((response.as_str(), ""));
    let status = head.lines().next().unwrap_or_default();
    if status.split_whitespace().nth(1) == Some("200") {
        Ok(body.trim().to_string())
    } else {
        Err(format!("{status}: {}", body.trim()))
    }
}

trait ReadWrite: std::io::Read + std::io::Write {}
impl<T: std::io::Read + std::io::Write> ReadWrite for T {}

/// Logs go to stderr; `RUST_LOG` filters them (default `info`).
fn init_logging() {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        // No colour codes in files and pipes.
        .with_ansi(std::io::stderr().is_terminal())
        .init();
}

/// Runs the node and its HTTP API until a signal; returns the exit code.
async fn run(config: Config, security: ApiSecurity) -> u8 {
    // Installed first so that a signal during start-up is a graceful
    // shutdown, not the default action (death).
    let (mut sigterm, mut sigint) = match (signal(SignalKind::terminate()), signal(SignalKind::interrupt())) {
        (Ok(term), Ok(int)) => (term, int),
        (Err(err), _) | (_, Err(err)) => {
            eprintln!("kraft: cannot install signal handlers: {err}");
            return 1;
        }
    };
    let node_id = config.node.id;
    let http_addr = config.listeners.http;
    // Not raced against the signals: start-up is short, and a signal that
    // arrives meanwhile is buffered and handled as soon as it is done.
    let handle = match node::start(config.clone()).await {
        Ok(handle) => handle,
        Err(err) => {
            eprintln!("kraft: node {node_id} cannot start: {err}");
            return 1;
        }
    };
    let mut api = match Api::bind(&handle, &config, security.clone()) {
        Ok(api) => api,
        Err(err) => {
            eprintln!("kraft: node {node_id} cannot bind the http listener on {http_addr}: {err}");
            shut_down(&handle).await;
            return 1;
        }
    };
    // Tests parse this line to learn ephemeral ports: keep its shape.
    eprintln!(
        "kraft node {node_id}: raft on {}, http on {}",
        handle.raft_addr(),
        api.addr()
    );
    let client = match config.listeners.client {
        None => None,
        Some(addr) => {
            let limits = ClientLimits::for_batch_bytes(config.log.max_batch_bytes);
            match kraft::api::client_server_here(handle.clone(), addr, limits, security.clone()) {
                Ok((server, bound)) => {
                    eprintln!("kraft node {node_id}: client protocol on {bound}");
                    Some(server)
                }
                Err(err) => {
                    eprintln!("kraft: node {node_id} cannot bind the client listener on {addr}: {err}");
                    shut_down(&handle).await;
                    api.stop().await;
                    return 1;
                }
            }
        }
    };

    let code = tokio::select! {
        name = next_signal(&mut sigterm, &mut sigint) => {
            tracing::info!("{name} received, shutting down");
            0
        }
        () = node_stopped(&handle) => {
            eprintln!("kraft: node {node_id} stopped on its own (see the log above); exiting");
            1
        }
        failure = api.failed() => {
            eprintln!("kraft: node {node_id}: {failure}");
            1
        }
    };
    // The node first (a leader resigns with EndQuorumEpoch, pending appends
    // fail instead of hanging), then the HTTP server and the client
    // listener, which let in-flight requests finish with those answers.
    tokio::select! {
        () = shut_down(&handle) => {}
        name = next_signal(&mut sigterm, &mut sigint) => {
            eprintln!("kraft: node {node_id}: second {name}, exiting without a graceful shutdown");
            return 1;
        }
    }
    match client {
        Some(client) => futures::join!(api.stop(), client.stop()).0,
        None => api.stop().await,
    }
    tracing::info!("node {node_id} stopped");
    code
}

/// The HTTP API, served as `listeners.http_workers` asks.
enum Api {
    /// On this thread, the node's (`http_workers = 0`).
    Here(LocalHttpServer, SocketAddr),
    /// On worker threads of its own.
    Workers {
        server: ServerHandle,
        task: JoinHandle<std::io::Result<()>>,
        addr: SocketAddr,
    },
}

impl Api {
    fn bind(handle: &NodeHandle, config: &Config, security: ApiSecurity) -> std::io::Result<Api> {
        let (http, max_body_bytes) = (config.listeners.http, config.log.max_batch_bytes);
        Ok(match config.listeners.http_workers {
            0 => {
                let (server, addr) = kraft::api::http_server_here(handle.clone(), http, max_body_bytes, security)?;
                Api::Here(server, addr)
            }
            workers => {
                let (server, addr) =
                    kraft::api::http_server_with(handle.clone(), http, max_body_bytes, workers, security)?;
                Api::Workers {
                    server: server.handle(),
                    task: actix_rt::spawn(server),
                    addr,
                }
            }
        })
    }

    fn addr(&self) -> SocketAddr {
        match self {
            Api::Here(_, addr) | Api::Workers { addr, .. } => *addr,
        }
    }

    /// Resolves, with what happened, only if the server stops on its own.
    async fn failed(&mut self) -> String {
        match self {
            // It logs accept errors and goes on: it ends on its own only
            // if it could not be set up.
            Api::Here(server, _) => {
                server.ended().await;
                "http server could not be set up (see the log above)".to_owned()
            }
            Api::Workers { task, .. } => match task.await {
                Ok(Ok(())) => "http server stopped unexpectedly".to_owned(),
                Ok(Err(err)) => format!("http server failed: {err}"),
                Err(err) => format!("http server task failed: {err}"),
            },
        }
    }

    /// Stops accepting, lets in-flight requests finish (bounded) and
    /// resolves once the server is down.
    async fn stop(self) {
        match self {
            Api::Here(server, _) => server.stop().await,
            Api::Workers { server, .. } => server.stop(true).await,
        }
    }
}

async fn shut_down(handle: &NodeHandle) {
    if tokio::time::timeout(NODE_SHUTDOWN_TIMEOUT, handle.shutdown())
        .await
        .is_err()
    {
        tracing::warn!("node shutdown took over {NODE_SHUTDOWN_TIMEOUT:?}; exiting anyway");
    }
}

/// Resolves once the node has stopped without being asked to (a fatal
/// storage or actor error).
async fn node_stopped(handle: &NodeHandle) {
    while !handle.is_stopped() {
        tokio::time::sleep(STOPPED_POLL_INTERVAL).await;
    }
}

/// Waits for SIGTERM or SIGINT and names it.
async fn next_signal(sigterm: &mut Signal, sigint: &mut Signal) -> &'static str {
    tokio::select! {
        _ = sigterm.recv() => "SIGTERM",
        _ = sigint.recv() => "SIGINT",
    }
}
