//! The HTTP API served on the calling thread, without worker threads.
//!
//! actix-web's [`HttpServer`](actix_web::HttpServer) always runs its
//! workers on threads of their own, so every append crosses from a worker
//! to the node's actor thread and its answer crosses back: two thread
//! wake-ups per hand-over, on a machine where waiting for a CPU costs as
//! much as the commit itself (BENCHMARKS.md). [`LocalHttpServer`] accepts
//! and serves the connections on the thread it is started on (the node's,
//! in the server binary), with the same routes, limits and answers.
//!
//! Like actix-web's server it serves at most a bounded number of
//! connections at once ([`max_connections`]); while that many are open it
//! stops accepting, and new connections wait in the listen backlog until
//! one closes. The bound is also kept below the process's file descriptor
//! limit, so that clients alone can never take the descriptors the raft
//! listener, the outbound connections and the storage need.
//!
//! Stopping is graceful: the listener closes at once, idle keep-alive
//! connections are closed, requests in flight get their answers, and
//! whatever is still open after [`SHUTDOWN_TIMEOUT_S`] is dropped.

use std::net::SocketAddr;
use std::rc::Rc;
use std::time::Duration;

use actix_rt::net::TcpStream;
use actix_service::{map_config, IntoServiceFactory, Service, ServiceFactory, ServiceFactoryExt};
use actix_web::dev::AppConfig;
use tokio::net::TcpSocket;
use tokio::sync::watch;
use tokio::task::JoinSet;

use super::{routes, ApiSecurity, NodeApi, SHUTDOWN_TIMEOUT_S};

/// Connections waiting to be accepted, as actix-web's `HttpServer`.
const BACKLOG: u32 = 1024;
/// How long an idle connection is kept open, as actix-web's `HttpServer`.
pub(crate) const KEEP_ALIVE: Duration = Duration::from_secs(5);
/// Longest a client may take to send a request's head, as actix-web's
/// `HttpServer`.
const CLIENT_REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a connection is drained after the server decides to close it,
/// as actix-web's `HttpServer` (actix-http's own default is 0: a client
/// still sending an oversize body would see a reset instead of the 413).
const CLIENT_DISCONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// Most connections served at once, as actix-web's `HttpServer` per worker.
const MAX_CONNECTIONS: usize = 25_600;
/// The fewest connections [`max_connections`] allows, whatever the
/// descriptor limit.
const MIN_CONNECTIONS: usize = 64;

/// Most connections the API serves at once: [`MAX_CONNECTIONS`], or half
/// the process's soft limit on open files if that is lower (but at least
/// [`MIN_CONNECTIONS`]).
pub(crate) fn max_connections() -> usize {
    connection_bound(open_file_limit())
}

/// The process's soft limit on open files (`ulimit -n`).
pub(crate) fn open_file_limit() -> usize {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit only writes the struct it is given.
    match unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } {
        0 => usize::try_from(limit.rlim_cur).unwrap_or(usize::MAX),
        _ => usize::MAX,
    }
}

/// [`max_connections`] for a limit of `files` open files.
pub(crate) fn connection_bound(files: usize) -> usize {
    (files / 2).clamp(MIN_CONNECTIONS, MAX_CONNECTIONS)
}

/// Pause after an accept error that is about the process (out of file
/// descriptors, out of memory) rather than one connection, as actix-server.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(500);

/// A server on one thread: the HTTP API (see the module documentation) or
/// the client listener ([`super::client_listener`]). Dropping it stops it
/// gracefully in the background; [`LocalServer::stop`] waits for that to
/// finish.
pub struct LocalServer {
    stopping: watch::Sender<bool>,
    /// The accepting task; `None` once [`LocalServer::ended`] saw it end.
    accept: Option<actix_rt::task::JoinHandle<()>>,
}

/// The HTTP API on one thread.
pub type LocalHttpServer = LocalServer;

impl LocalServer {
    /// Spawns `run` on the current thread, which must run an actix
    /// runtime; `run` ends once `stop` turns true or its sender is dropped.
    pub(crate) fn spawn<F>(run: impl FnOnce(watch::Receiver<bool>) -> F) -> LocalServer
    where
        F: std::future::Future<Output = ()> + 'static,
    {
        let (stopping, stop) = watch::channel(false);
        LocalServer {
            stopping,
            accept: Some(actix_rt::spawn(run(stop))),
        }
    }

    /// Closes the listener, lets in-flight requests finish (for at most
    /// 5 s) and resolves once every connection is closed.
    pub async fn stop(self) {
        let _ = self.stopping.send(true);
        if let Some(accept) = self.accept {
            let _ = accept.await;
        }
    }

    /// Resolves only if the server ends without being stopped, which
    /// happens only when the HTTP API's routes cannot be set up (logged).
    pub async fn ended(&mut self) {
        match &mut self.accept {
            Some(accept) => {
                let _ = accept.await;
                self.accept = None;
            }
            None => std::future::pending().await,
        }
    }
}

/// Binds `addr` and serves the API for `node` on the current thread, which
/// must run an actix (or tokio local) runtime, closing connections idle for
/// `keep_alive` and serving at most `max_connections` at once. Returns the
/// server and the bound address (port 0 picks a free port).
pub(crate) fn serve_here<N: NodeApi>(
    node: N,
    addr: SocketAddr,
    max_body_bytes: usize,
    keep_alive: Duration,
    max_connections: usize,
    security: ApiSecurity,
) -> std::io::Result<(LocalHttpServer, SocketAddr)> {
    let (listener, bound) = bind(addr)?;
    let server = LocalServer::spawn(|stop| {
        run(
            listener,
            node,
            max_body_bytes,
            keep_alive,
            max_connections,
            security,
            stop,
        )
    });
    Ok((server, bound))
}

/// A listening socket on `addr` (port 0 picks a free port), with
/// `SO_REUSEADDR` and a backlog of [`BACKLOG`], and the address it is on.
pub(crate) fn bind(addr: SocketAddr) -> std::io::Result<(tokio::net::TcpListener, SocketAddr)> {
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    let listener = socket.listen(BACKLOG)?;
    let bound = listener.local_addr()?;
    Ok((listener, bound))
}

/// Accepts until told to stop (or until the server is dropped), then
/// drains the connections.
async fn run<N: NodeApi>(
    listener: tokio::net::TcpListener,
    node: N,
    max_body_bytes: usize,
    keep_alive: Duration,
    max_connections: usize,
    security: ApiSecurity,
    stop: watch::Receiver<bool>,
) {
    // The same service over TCP or TLS: the stream type differs, so it is
    // built in each arm.
    macro_rules! h1 {
        () => {{
            let drain = stop.clone();
            let node = node.clone();
            let app = super::app(security.tokens.clone()).configure(move |cfg| routes(cfg, node, max_body_bytes));
            actix_http::HttpService::build()
                .keep_alive(keep_alive)
                .client_request_timeout(CLIENT_REQUEST_TIMEOUT)
                .client_disconnect_timeout(CLIENT_DISCONNECT_TIMEOUT)
                // Each connection's dispatcher stops keeping its connection
                // alive once this resolves: idle ones close, busy ones after
                // answering. actix-web's own server uses this hook;
                // actix-http hides it from its documentation, and
                // Cargo.lock pins the version that has it.
                .graceful_shutdown_signal(move || {
                    let mut drain = drain.clone();
                    async move {
                        let _ = drain.wait_for(|&stopping| stopping).await;
                    }
                })
                .h1(map_config(
                    app.into_factory().map_err(|err: actix_web::Error| err.error_response()),
                    // Only used to build URLs, which the API never does.
                    |_| AppConfig::default(),
                ))
        }};
    }
    match security.tls.clone() {
        None => serve_with(h1!().tcp(), listener, max_connections, stop).await,
        Some(config) => serve_with(h1!().rustls_0_23((*config).clone()), listener, max_connections, stop).await,
    }
}

/// Serves every connection `listener` accepts with a service of `factory`.
async fn serve_with<F>(
    factory: F,
    listener: tokio::net::TcpListener,
    max_connections: usize,
    stop: watch::Receiver<bool>,
) where
    F: ServiceFactory<TcpStream, Config = (), Response = (), InitError = ()>,
    F::Service: 'static,
    F::Error: std::fmt::Display,
{
    let service = match factory.new_service(()).await {
        Ok(service) => Rc::new(service),
        Err(()) => {
            tracing::error!("the HTTP API could not be set up; it is not served");
            return;
        }
    };
    serve_bounded(listener, max_connections, stop, "http", move |stream| {
        serve_connection(service.clone(), stream)
    })
    .await;
}

/// Accepts connections on `listener` and serves each with `serve` on the
/// current thread, at most `max_connections` at once (further ones wait in
/// the listen backlog), until `stop` turns true or its sender is dropped.
/// Then closes the listener and waits at most [`SHUTDOWN_TIMEOUT_S`] for
/// the connections to end; what is left is dropped. `what` names the
/// listener in the log.
pub(crate) async fn serve_bounded<F, Fut>(
    listener: tokio::net::TcpListener,
    max_connections: usize,
    mut stop: watch::Receiver<bool>,
    what: &'static str,
    mut serve: F,
) where
    F: FnMut(TcpStream) -> Fut,
    Fut: std::future::Future<Output = ()> + 'static,
{
    let max_connections = max_connections.max(1);
    let mut connections = JoinSet::new();
    let mut warned_full = false;
    loop {
        let full = connections.len() >= max_connections;
        tokio::select! {
            accepted = listener.accept(), if !full => match accepted {
                Ok((stream, _peer)) => {
                    connections.spawn_local(serve(stream));
                }
                Err(err) => {
                    tracing::warn!("{what}: accept failed: {err}");
                    if !is_per_connection(&err) {
                        tokio::time::sleep(ACCEPT_BACKOFF).await;
                    }
                }
            },
            // Full: the next connection is accepted once one of these ends.
            Some(_) = connections.join_next(), if full => {}
            // A send of `true` or a dropped server.
            _ = stop.wait_for(|&stopping| stopping) => break,
        }
        // Finished connections are reaped here so the set stays small.
        while connections.try_join_next().is_some() {}
        // Once per overload, not once per connection replaced at the cap:
        // warned again only after the count fell a tenth below it.
        if connections.len() >= max_connections && !warned_full {
            warned_full = true;
            tracing::warn!(
                "{what}: {max_connections} connections open, the most served at once; \
                 new ones wait until one closes"
            );
        } else if connections.len() < max_connections - max_connections / 10 {
            warned_full = false;
        }
    }
    drop(listener);
    let drained = tokio::time::timeout(Duration::from_secs(SHUTDOWN_TIMEOUT_S), async {
        while connections.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        tracing::warn!(
            "{what}: {} connection(s) still open after {SHUTDOWN_TIMEOUT_S} s; closing them",
            connections.len()
        );
    }
    // Dropping the set aborts what is left.
}

async fn serve_connection<S>(service: Rc<S>, stream: TcpStream)
where
    S: Service<TcpStream, Response = ()>,
    S::Error: std::fmt::Display,
{
    // A client that goes away mid-request is its own business.
    if let Err(err) = service.call(stream).await {
        tracing::debug!("http: connection ended with {err}");
    }
}

/// Accept errors that concern one connection (it was reset before it was
/// accepted), after which the next accept can follow at once.
fn is_per_connection(err: &std::io::Error) -> bool {
    use std::io::ErrorKind::{ConnectionAborted, ConnectionRefused, ConnectionReset, Interrupted};
    matches!(
        err.kind(),
        ConnectionAborted | ConnectionRefused | ConnectionReset | Interrupted
    )
}
