//! The inbound raft listener (docs/ARCHITECTURE.md, "Wire format").
//!
//! [`serve`] binds the raft listener and accepts peer connections. Each
//! connection gets two tasks on the current arbiter (so the hop to the
//! QuorumState actor stays on one thread when it lives there too):
//!
//! - a **reader** that reads frames (u32 big-endian length + bincode
//!   envelope), checks them, and hands every request to the handler as an
//!   [`InboundRequest`]; it waits for the handler's mailbox (`send`), which
//!   is the connection's backpressure, but never for a response;
//! - a **writer** that owns the write half and writes each response, with
//!   its request's correlation id, as soon as the handler answers. Responses
//!   may leave in any order: a Fetch parked for 500 ms does not hold back a
//!   Vote that arrived after it.
//!
//! Untrusted input never panics the node, and a frame's buffer grows with
//! the bytes that arrive, not with the length the peer claims: a length
//! prefix above `max_frame_bytes`, a frame that does not decode, a truncated
//! frame or a response sent on an inbound connection closes that connection
//! only. A request carrying another cluster's id is answered with
//! `Error(InconsistentClusterId)` (another wire version: `InvalidRequest`)
//! and the connection stays open. A peer that half-closes after its last
//! request still gets the answers before the connection is closed.
//!
//! Bounds: at most [`MAX_CONNECTIONS`] connections. When the listener is
//! full, a new connection takes the place of the least recently used one
//! among those that await no answer (a frame read or an answer written is
//! a use), as Kafka closes the least recently used connection to make room
//! for an inter-broker one at its broker-wide limit (KIP-402). A replica's
//! connection awaits its parked fetch's answer, or was used a moment ago,
//! so connections that only hold a place go first, and a peer that
//! reconnects is not shut out by them. When every connection awaits an
//! answer, the new one is refused.
//!
//! Per connection at most
//! [`MAX_IN_FLIGHT_PER_CONNECTION`] requests whose answers are not yet
//! written to the socket, and of those at most
//! [`MAX_LOG_ANSWERS_PER_CONNECTION`] Fetch and FetchSnapshot requests,
//! whose answers carry up to 1 MiB of log each (8 MiB when one batch is
//! larger). Past either bound the reader stops reading, which pushes back
//! on the peer through TCP: a peer that sends fetches but never reads the
//! answers holds at most 4 of them in the node's memory, not 256.
//!
//! Timeouts ([`ConnectionLimits`]): a connection on which no frame
//! arrives for [`IDLE_TIMEOUT`] (Kafka's `connections.max.idle.ms`) is
//! closed, which also reclaims the place of a peer that vanished without a
//! FIN (a host that lost power leaves a half-open connection that reports
//! nothing by itself), and of one that trickles a frame; a peer's own
//! RequestManager opens a new connection with its next request. An answer
//! the peer does not read within [`WRITE_TIMEOUT`] closes the connection,
//! so a peer that stops reading holds its answers' memory for that long at
//! most, not for as long as it keeps the connection open.
//!
//! Across connections: the answers made and not yet written, all
//! connections together, take at most [`MAX_UNWRITTEN_ANSWER_BYTES`] (the
//! writer takes answers from the handler while a write waits for its peer,
//! so each is counted from the moment it is made). Past that, the
//! connections whose peers have taken nothing for longest are closed until
//! the rest fit. A replica takes its answers within milliseconds, so peers
//! that send fetches and read nothing (1,024 of them could otherwise hold
//! four answers of 1-8 MiB each, gigabytes, for a minute) go first.

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use actix::Recipient;
use futures::stream::{FuturesUnordered, StreamExt};
use tokio::io::AsyncWrite;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot, watch, Notify, OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;
use tokio_rustls::TlsAcceptor;
use tracing::{debug, error, info, warn};

use crate::messages::actor::InboundRequest;
use crate::messages::codec::{self, Body, Envelope, WIRE_VERSION};
use crate::messages::rpc::{ErrorCode, RaftRequest, RaftResponse};
use crate::raft::NodeId;

/// Most connections the listener keeps open at once; past it a new one
/// takes the place of the least recently used one that awaits no answer.
pub const MAX_CONNECTIONS: usize = 1024;

/// Most requests of one connection that the handler may hold unanswered
/// or whose answers wait to be written.
pub const MAX_IN_FLIGHT_PER_CONNECTION: usize = 256;

/// Most Fetch and FetchSnapshot requests of one connection that the
/// handler may hold or whose answers wait to be written. A replica has one
/// fetch in flight at a time.
pub const MAX_LOG_ANSWERS_PER_CONNECTION: usize = 4;

/// Bytes read from a socket per system call (frames are parsed from this).
const READ_BUFFER_BYTES: usize = 64 * 1024;

/// A connection on which no frame arrives for this long is closed: Kafka's
/// `connections.max.idle.ms` default. Every replica fetches at least every
/// `fetch_timeout_ms`, so only connections used for elections alone (and
/// dead ones) ever sit idle that long.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(600);

/// An answer the peer has not taken whole within this long closes the
/// connection: a replica whose link moves less than a fetch answer (1 MiB,
/// 8 MiB at most) or a snapshot chunk (1 MiB) a minute could not keep up
/// anyway, and its own request timeout gives up on the answer much sooner.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(60);

/// Most bytes of answers made and not yet written, all connections
/// together; past it the connections whose peers have taken nothing for
/// longest are closed.
/// Eight of the largest fetch answers (8 MiB), or 64 of the usual 1 MiB.
pub const MAX_UNWRITTEN_ANSWER_BYTES: usize = 64 * 1024 * 1024;

/// How many connections the listener keeps, how long one may sit idle,
/// and how long it may wait for its peer to read an answer; see the module
/// documentation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnectionLimits {
    pub max_connections: usize,
    pub idle: Duration,
    pub write: Duration,
    pub unwritten_answer_bytes: usize,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        ConnectionLimits {
            max_connections: MAX_CONNECTIONS,
            idle: IDLE_TIMEOUT,
            write: WRITE_TIMEOUT,
            unwritten_answer_bytes: MAX_UNWRITTEN_ANSWER_BYTES,
        }
    }
}

/// Why reading a frame failed. Every variant closes the connection.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    #[error("frame of {len} bytes exceeds max_frame_bytes = {limit}")]
    TooLarge { len: u64, limit: u64 },
    #[error("connection closed in the middle of a frame ({got} of {expected} bytes)")]
    Truncated { expected: u64, got: u64 },
    #[error("read failed: {0}")]
    Io(#[from] std::io::Error),
}

/// Reads one frame body (the bytes after the length prefix).
///
/// `Ok(None)` is a clean end of stream at a frame boundary. The buffer grows
/// with the bytes that actually arrive, never to the claimed length up front,
/// so a peer cannot make us allocate memory it has not sent.
pub(crate) async fn read_frame<R: AsyncRead + Unpin>(
    reader: &mut R,
    max_frame_bytes: u64,
) -> Result<Option<Vec<u8>>, FrameError> {
    let mut prefix = [0u8; 4];
    let mut filled = 0;
    while filled < prefix.len() {
        let n = reader.read(&mut prefix[filled..]).await?;
        if n == 0 {
            if filled == 0 {
                return Ok(None);
            }
            return Err(FrameError::Truncated {
                expected: 4,
                got: filled as u64,
            });
        }
        filled += n;
    }
    let len = u64::from(u32::from_be_bytes(prefix));
    if len > max_frame_bytes {
        return Err(FrameError::TooLarge {
            len,
            limit: max_frame_bytes,
        });
    }
    let mut body = Vec::with_capacity(len.min(READ_BUFFER_BYTES as u64) as usize);
    (&mut *reader).take(len).read_to_end(&mut body).await?;
    if (body.len() as u64) < len {
        return Err(FrameError::Truncated {
            expected: len,
            got: body.len() as u64,
        });
    }
    Ok(Some(body))
}

/// Handle of a running raft listener. Dropping it shuts the listener down
/// like [`RaftServer::shutdown`].
#[must_use = "dropping the RaftServer shuts the listener down"]
pub struct RaftServer {
    local_addr: SocketAddr,
    shutdown: watch::Sender<bool>,
}

impl RaftServer {
    /// The bound address (the real port when `serve` was given port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Stops accepting and closes every connection; unanswered requests are
    /// dropped (their senders time out). Returns at once; the tasks finish
    /// at their next poll.
    pub fn shutdown(&self) {
        self.shutdown.send_replace(true);
    }
}

impl Drop for RaftServer {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// What every connection of one listener shares.
struct Shared {
    /// With TLS: a peer must present a certificate from the cluster's CA.
    tls: Option<TlsAcceptor>,
    cluster_id: String,
    local_id: NodeId,
    max_frame_bytes: u64,
    handler: Recipient<InboundRequest>,
    limits: ConnectionLimits,
    /// The connections that hold a place (at most `limits.max_connections`;
    /// one that gave its place up may still be closing).
    connections: RefCell<Connections>,
    /// Bytes of the answers made and not yet written, all connections
    /// together (see [`Unwritten`]), but for those of connections told to
    /// close for it.
    unwritten_bytes: Cell<usize>,
    /// Set when those pass their budget, so that it warns once per
    /// overload; cleared once they are under half of it.
    unwritten_warned: Cell<bool>,
}

#[derive(Default)]
struct Connections {
    next_id: u64,
    open: HashMap<u64, Rc<Activity>>,
    /// Set when the listener fills up, so that it warns once per overload;
    /// cleared once a tenth of the places are free again.
    full_warned: bool,
}

/// What the listener knows of one connection's use.
struct Activity {
    peer: SocketAddr,
    /// When it last read a frame or wrote an answer (its accept, before).
    last_used: Cell<Instant>,
    /// Requests read whose answers are not yet written or dropped.
    awaited: Cell<usize>,
    /// Bytes of its answers made and not yet written (see [`Unwritten`]).
    unwritten: Cell<usize>,
    /// While it has answers to write: when its peer last took some of
    /// them, or when the first was made if it has taken none since.
    stalled_since: Cell<Option<Instant>>,
    /// Set when it is told to close for the listener's budget of answers:
    /// its answers no longer count toward that budget.
    closing: Cell<bool>,
    /// Notified when a newer connection takes its place.
    evicted: Notify,
}

impl Activity {
    fn used(&self) {
        self.last_used.set(Instant::now());
    }

    /// Its peer took some of its answers.
    fn wrote(&self) {
        if self.stalled_since.get().is_some() {
            self.stalled_since.set(Some(Instant::now()));
        }
    }

    /// Tells the connection to close for the listener's budget of
    /// answers, whose count no longer includes its answers.
    fn close_for_unwritten(&self, shared: &Shared) {
        self.closing.set(true);
        shared
            .unwritten_bytes
            .set(shared.unwritten_bytes.get() - self.unwritten.replace(0));
        self.stalled_since.set(None);
        self.evicted.notify_one();
    }
}

/// One request's claim on its connection's [`Activity::awaited`], from
/// the moment it is read until its answer is written or dropped.
struct Awaited(Rc<Activity>);

impl Awaited {
    fn new(activity: &Rc<Activity>) -> Awaited {
        activity.awaited.set(activity.awaited.get() + 1);
        Awaited(activity.clone())
    }
}

impl Drop for Awaited {
    fn drop(&mut self) {
        self.0.awaited.set(self.0.awaited.get() - 1);
        self.0.used();
    }
}

/// One answer's claim on the listener's budget of answers made and not
/// yet written ([`ConnectionLimits::unwritten_answer_bytes`]), from its
/// encoding until it is written or dropped.
struct Unwritten {
    shared: Rc<Shared>,
    activity: Rc<Activity>,
    bytes: usize,
}

impl Unwritten {
    /// Takes `bytes` of the budget. Past it, closes the connections whose
    /// peers have taken nothing for longest (this one, if it is such), until
    /// the rest fit; a connection that alone holds more than the budget is
    /// left, since closing it would make room for nothing.
    fn new(shared: &Rc<Shared>, activity: &Rc<Activity>, bytes: usize) -> Unwritten {
        // A connection already told to close no longer counts.
        let bytes = if activity.closing.get() { 0 } else { bytes };
        if activity.unwritten.get() == 0 {
            activity.stalled_since.set(Some(Instant::now()));
        }
        activity.unwritten.set(activity.unwritten.get() + bytes);
        shared.unwritten_bytes.set(shared.unwritten_bytes.get() + bytes);
        let budget = shared.limits.unwritten_answer_bytes;
        if shared.unwritten_bytes.get() > budget {
            if !shared.unwritten_warned.replace(true) {
                warn!(
                    total = shared.unwritten_bytes.get(),
                    budget,
                    "raft answers made and not yet written exceed their budget; closing the connections \
                     whose peers have taken nothing for longest"
                );
            }
            let mut connections = shared.connections.borrow_mut();
            while shared.unwritten_bytes.get() > budget {
                let stalled_longest = connections
                    .open
                    .iter()
                    .filter(|(_, activity)| activity.unwritten.get() > 0)
                    .filter_map(|(id, activity)| Some((*id, activity.stalled_since.get()?)))
                    .min_by_key(|(_, since)| *since)
                    .map(|(id, _)| id);
                let Some(id) = stalled_longest else { break };
                if connections.open[&id].unwritten.get() == shared.unwritten_bytes.get() {
                    break;
                }
                let closed = connections.open.remove(&id).expect("found above");
                debug!(peer = %closed.peer, unwritten = closed.unwritten.get(),
                    stalled = ?closed.stalled_since.get().map(|s| s.elapsed()),
                    "closing the raft connection whose peer has taken nothing for longest");
                closed.close_for_unwritten(shared);
            }
        }
        Unwritten {
            shared: shared.clone(),
            activity: activity.clone(),
            bytes,
        }
    }
}

impl Drop for Unwritten {
    fn drop(&mut self) {
        let (shared, activity) = (&self.shared, &self.activity);
        if !activity.closing.get() {
            shared.unwritten_bytes.set(shared.unwritten_bytes.get() - self.bytes);
            activity.unwritten.set(activity.unwritten.get() - self.bytes);
            if activity.unwritten.get() == 0 {
                activity.stalled_since.set(None);
            }
        }
        if shared.unwritten_bytes.get() < shared.limits.unwritten_answer_bytes / 2 {
            shared.unwritten_warned.set(false);
        }
    }
}

/// Binds the raft listener on `addr` and serves it on the current actix
/// arbiter (must be called inside an actix `System`). Every request goes to
/// `handler`; its answer goes back on the connection it came from.
pub async fn serve(
    addr: SocketAddr,
    cluster_id: String,
    local_id: NodeId,
    max_frame_bytes: u64,
    handler: Recipient<InboundRequest>,
    tls: Option<TlsAcceptor>,
) -> std::io::Result<RaftServer> {
    serve_with(
        addr,
        cluster_id,
        local_id,
        max_frame_bytes,
        handler,
        ConnectionLimits::default(),
        tls,
    )
    .await
}

/// [`serve`] with other connection limits than the defaults.
pub async fn serve_with(
    addr: SocketAddr,
    cluster_id: String,
    local_id: NodeId,
    max_frame_bytes: u64,
    handler: Recipient<InboundRequest>,
    limits: ConnectionLimits,
    tls: Option<TlsAcceptor>,
) -> std::io::Result<RaftServer> {
    let listener = TcpListener::bind(addr).await?;
    let local_addr = listener.local_addr()?;
    let (shutdown_tx, shutdown_rx) = watch::channel(false);
    let shared = Rc::new(Shared {
        tls,
        cluster_id,
        local_id,
        max_frame_bytes,
        handler,
        limits: ConnectionLimits {
            max_connections: limits.max_connections.max(1),
            ..limits
        },
        connections: RefCell::default(),
        unwritten_bytes: Cell::new(0),
        unwritten_warned: Cell::new(false),
    });
    actix_rt::spawn(accept_loop(listener, shared, shutdown_rx));
    info!(%local_addr, node_id = local_id, "raft listener started");
    Ok(RaftServer {
        local_addr,
        shutdown: shutdown_tx,
    })
}

/// Resolves once shutdown is requested (or the `RaftServer` is dropped).
async fn shutdown_requested(shutdown: &mut watch::Receiver<bool>) {
    let _ = shutdown.wait_for(|stop| *stop).await;
}

async fn accept_loop(listener: TcpListener, shared: Rc<Shared>, mut shutdown: watch::Receiver<bool>) {
    let local_addr = listener.local_addr().ok();
    loop {
        let accepted = tokio::select! {
            _ = shutdown_requested(&mut shutdown) => break,
            accepted = listener.accept() => accepted,
        };
        match accepted {
            Ok((stream, peer)) => {
                let Some(slot) = ConnectionSlot::take(shared.clone(), peer) else {
                    // Every connection awaits an answer: this one is closed.
                    continue;
                };
                if let Err(e) = stream.set_nodelay(true) {
                    debug!(%peer, error = %e, "cannot set TCP_NODELAY");
                }
                match shared.tls.clone() {
                    None => {
                        actix_rt::spawn(connection(split_tcp(stream), peer, slot, shutdown.clone()));
                    }
                    // The handshake in the connection's own task: a slow
                    // one holds its place, not the listener.
                    Some(acceptor) => {
                        let shutdown = shutdown.clone();
                        actix_rt::spawn(async move {
                            match tokio::time::timeout(crate::tls::HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                                Ok(Ok(tls)) => connection(split(tls), peer, slot, shutdown).await,
                                Ok(Err(e)) => warn!(%peer, "raft connection refused: TLS handshake failed: {e}"),
                                Err(_) => {
                                    warn!(%peer, "raft connection refused: no TLS handshake within {:?}", crate::tls::HANDSHAKE_TIMEOUT)
                                }
                            }
                        });
                    }
                }
            }
            Err(e) => {
                // Usually out of file descriptors: back off instead of spinning.
                warn!(error = %e, "accept failed on the raft listener");
                tokio::select! {
                    _ = shutdown_requested(&mut shutdown) => break,
                    _ = tokio::time::sleep(Duration::from_millis(100)) => {}
                }
            }
        }
    }
    info!(local_addr = ?local_addr, "raft listener stopped");
}

/// Work for a connection's writer, in the order the reader produced it.
enum Outbound {
    /// A frame to write as is (a refusal the reader answered itself).
    Ready { frame: Vec<u8>, permits: Permits },
    /// A response the handler will send on `reply`.
    Pending {
        correlation_id: u64,
        reply: oneshot::Receiver<RaftResponse>,
        permits: Permits,
    },
}

/// The places a request takes in its connection's bounds, given back once
/// its answer is written (or dropped).
struct Permits {
    _in_flight: OwnedSemaphorePermit,
    /// Fetch and FetchSnapshot only.
    _log_answer: Option<OwnedSemaphorePermit>,
    _awaited: Awaited,
}

/// A connection's read half, over TCP or TLS.
pub(crate) type ReadHalf = Box<dyn AsyncRead + Send + Unpin>;
/// A connection's write half, over TCP or TLS.
pub(crate) type WriteHalf = Box<dyn AsyncWrite + Send + Unpin>;

/// The halves of a TCP stream (without the lock `tokio::io::split` takes).
pub(crate) fn split_tcp(stream: TcpStream) -> (ReadHalf, WriteHalf) {
    let (read, write) = stream.into_split();
    (Box::new(read), Box::new(write))
}

/// The halves of any stream (a TLS one).
pub(crate) fn split<S: AsyncRead + AsyncWrite + Send + Unpin + 'static>(stream: S) -> (ReadHalf, WriteHalf) {
    let (read, write) = tokio::io::split(stream);
    (Box::new(read), Box::new(write))
}

async fn connection(
    (read_half, write_half): (ReadHalf, WriteHalf),
    peer: SocketAddr,
    slot: ConnectionSlot,
    mut shutdown: watch::Receiver<bool>,
) {
    let shared = &slot.shared;
    let activity = &slot.activity;
    debug!(%peer, "raft connection accepted");
    let (outbound_tx, outbound_rx) = mpsc::channel(MAX_IN_FLIGHT_PER_CONNECTION);
    let mut writer = actix_rt::spawn(write_loop(
        write_half,
        outbound_rx,
        shared.clone(),
        activity.clone(),
        peer,
    ));
    let evicted = activity.evicted.notified();
    tokio::pin!(evicted);
    let end = tokio::select! {
        // Told to close before reading what may already have arrived.
        biased;
        _ = shutdown_requested(&mut shutdown) => {
            debug!(%peer, "closing raft connection: listener shut down");
            ReadEnd::Abort
        }
        _ = &mut evicted => {
            debug!(%peer, "closing raft connection: a newer one took its place");
            ReadEnd::Abort
        }
        end = read_loop(read_half, peer, shared, activity, outbound_tx) => end,
        // The writer ends first only when it failed or timed out.
        _ = &mut writer => ReadEnd::Abort,
    };
    if end == ReadEnd::PeerClosed {
        // A peer may half-close after its last request (a one-shot tool
        // does): answer what it asked before closing our side.
        tokio::select! {
            _ = shutdown_requested(&mut shutdown) => {}
            _ = &mut evicted => {}
            _ = &mut writer => {}
        }
    }
    writer.abort();
}

/// One of the listener's places, held for as long as a connection's task
/// lives (however it ends) or until a newer connection takes it.
struct ConnectionSlot {
    shared: Rc<Shared>,
    id: u64,
    activity: Rc<Activity>,
}

impl ConnectionSlot {
    /// Takes a place for a connection from `peer`. When all are taken, the
    /// least recently used connection that awaits no answer is told to
    /// close and its place is this one's; when every one awaits an answer,
    /// there is no place (`None`).
    fn take(shared: Rc<Shared>, peer: SocketAddr) -> Option<ConnectionSlot> {
        let max = shared.limits.max_connections;
        let mut connections = shared.connections.borrow_mut();
        if connections.open.len() >= max {
            let unused_longest = connections
                .open
                .iter()
                .filter(|(_, activity)| activity.awaited.get() == 0)
                .min_by_key(|(_, activity)| activity.last_used.get())
                .map(|(id, _)| *id);
            let closed = unused_longest.and_then(|id| connections.open.remove(&id));
            if !connections.full_warned {
                connections.full_warned = true;
                warn!(%peer, limit = max,
                    "raft listener full; each new connection takes the place of the least recently used one \
                     that awaits no answer, or is refused while every one awaits an answer");
            }
            let Some(activity) = closed else {
                debug!(%peer, "raft listener full and every connection awaits an answer; refusing this one");
                return None;
            };
            activity.evicted.notify_one();
            debug!(%peer, closed = %activity.peer, unused = ?activity.last_used.get().elapsed(),
                "raft listener full; closing the least recently used connection");
        } else if connections.open.len() < max - max / 10 {
            connections.full_warned = false;
        }
        let id = connections.next_id;
        connections.next_id += 1;
        let activity = Rc::new(Activity {
            peer,
            last_used: Cell::new(Instant::now()),
            awaited: Cell::new(0),
            unwritten: Cell::new(0),
            stalled_since: Cell::new(None),
            closing: Cell::new(false),
            evicted: Notify::new(),
        });
        connections.open.insert(id, activity.clone());
        debug_assert!(connections.open.len() <= max);
        drop(connections);
        Some(ConnectionSlot { shared, id, activity })
    }
}

impl Drop for ConnectionSlot {
    fn drop(&mut self) {
        // Gone already when a newer connection took the place.
        self.shared.connections.borrow_mut().open.remove(&self.id);
    }
}

/// How a connection's reader stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ReadEnd {
    /// Clean end of stream at a frame boundary: pending answers are still sent.
    PeerClosed,
    /// Protocol violation, I/O error or shutdown: close at once.
    Abort,
}

/// Reads requests until the peer closes the connection or breaks the
/// protocol.
async fn read_loop(
    read_half: ReadHalf,
    peer: SocketAddr,
    shared: &Shared,
    activity: &Rc<Activity>,
    outbound: mpsc::Sender<Outbound>,
) -> ReadEnd {
    let mut reader = BufReader::with_capacity(READ_BUFFER_BYTES, read_half);
    let in_flight = Arc::new(Semaphore::new(MAX_IN_FLIGHT_PER_CONNECTION));
    let log_answers = Arc::new(Semaphore::new(MAX_LOG_ANSWERS_PER_CONNECTION));
    loop {
        let idle = shared.limits.idle;
        let Ok(read) = tokio::time::timeout(idle, read_frame(&mut reader, shared.max_frame_bytes)).await else {
            debug!(%peer, ?idle, "no frame within the idle timeout; closing raft connection");
            return ReadEnd::Abort;
        };
        let body = match read {
            Ok(Some(body)) => body,
            Ok(None) => {
                debug!(%peer, "raft connection closed by peer");
                return ReadEnd::PeerClosed;
            }
            Err(FrameError::Io(e)) => {
                debug!(%peer, error = %e, "raft connection failed");
                return ReadEnd::Abort;
            }
            Err(e) => {
                warn!(%peer, error = %e, "closing raft connection");
                return ReadEnd::Abort;
            }
        };
        activity.used();
        let envelope = match codec::decode_frame(&body, shared.max_frame_bytes) {
            Ok(envelope) => envelope,
            Err(e) => {
                warn!(%peer, error = %e, "undecodable frame; closing raft connection");
                return ReadEnd::Abort;
            }
        };
        drop(body);
        let Envelope {
            version,
            source_id,
            correlation_id,
            cluster_id,
            body,
        } = envelope;
        let request = match body {
            Body::Request(request) => request,
            Body::Response(_) => {
                warn!(%peer, source_id, "response on an inbound connection; closing raft connection");
                return ReadEnd::Abort;
            }
        };
        // Bounds the requests this connection has in flight; waiting here
        // stops reading, which pushes back on the peer through TCP.
        let Ok(in_flight_permit) = in_flight.clone().acquire_owned().await else {
            return ReadEnd::Abort;
        };
        let log_answer = if matches!(request, RaftRequest::Fetch(_) | RaftRequest::FetchSnapshot(_)) {
            let Ok(permit) = log_answers.clone().acquire_owned().await else {
                return ReadEnd::Abort;
            };
            Some(permit)
        } else {
            None
        };
        let permits = Permits {
            _in_flight: in_flight_permit,
            _log_answer: log_answer,
            _awaited: Awaited::new(activity),
        };

        let refusal = if cluster_id != shared.cluster_id {
            warn!(%peer, source_id, their_cluster_id = %cluster_id, api = request.api_name(),
                "request from another cluster; answering InconsistentClusterId");
            Some(ErrorCode::InconsistentClusterId)
        } else if version != WIRE_VERSION {
            warn!(%peer, source_id, version, "unsupported wire version; answering InvalidRequest");
            Some(ErrorCode::InvalidRequest)
        } else {
            None
        };
        if let Some(code) = refusal {
            let frame = response_frame(shared, correlation_id, RaftResponse::Error(code));
            if outbound.send(Outbound::Ready { frame, permits }).await.is_err() {
                return ReadEnd::Abort;
            }
            continue;
        }

        let (reply, reply_rx) = oneshot::channel();
        if let Err(e) = shared
            .handler
            .send(InboundRequest {
                from: source_id,
                request,
                reply,
            })
            .await
        {
            error!(%peer, error = %e, "raft request handler is gone; closing raft connection");
            return ReadEnd::Abort;
        }
        let pending = Outbound::Pending {
            correlation_id,
            reply: reply_rx,
            permits,
        };
        if outbound.send(pending).await.is_err() {
            // The writer stopped (write error): nothing more can be answered.
            return ReadEnd::Abort;
        }
    }
}

/// Writes responses as they become ready, in whatever order that is.
async fn write_loop(
    mut write_half: WriteHalf,
    mut outbound: mpsc::Receiver<Outbound>,
    shared: Rc<Shared>,
    activity: Rc<Activity>,
    peer: SocketAddr,
) {
    let mut pending = FuturesUnordered::new();
    // Answers ready to write, in order; each holds its request's permits
    // and its claim on the listener's budget until it is written. Answers
    // are taken off `pending` while a write waits for the peer, so that
    // the budget counts every answer made, not only the one being written.
    let mut queue: VecDeque<Queued> = VecDeque::new();
    // Bytes of the front answer written so far, and when it must be whole.
    let mut written = 0;
    let deadline = tokio::time::sleep_until(Instant::now());
    tokio::pin!(deadline);
    // False once the reader has stopped; the answers still pending are
    // written, then the writer stops.
    let mut receiving = true;
    loop {
        if !receiving && pending.is_empty() && queue.is_empty() {
            return;
        }
        let front = queue.front().map_or(&[][..], |q| &q.frame[written..]);
        let event = tokio::select! {
            // Writing first: a frame the peer takes is done before anything
            // else is looked at (and the timer is not armed needlessly).
            biased;
            result = write_half.write(front), if !front.is_empty() => WriterEvent::Wrote(result),
            item = outbound.recv(), if receiving => match item {
                None => WriterEvent::ReaderStopped,
                Some(Outbound::Ready { frame, permits }) => WriterEvent::Ready(frame, permits),
                Some(Outbound::Pending { correlation_id, reply, permits }) => {
                    pending.push(async move { (correlation_id, reply.await, permits) });
                    continue;
                }
            },
            Some((correlation_id, answer, permits)) = pending.next(), if !pending.is_empty() => match answer {
                Ok(response) => WriterEvent::Ready(response_frame(&shared, correlation_id, response), permits),
                Err(_) => {
                    // The handler chose not to answer; the peer times out.
                    debug!(%peer, correlation_id, "request dropped without a response");
                    continue;
                }
            },
            _ = &mut deadline, if !front.is_empty() => {
                warn!(%peer, timeout = ?shared.limits.write,
                    "the peer read no answer within the write timeout; closing raft connection");
                return;
            }
            // Not reached: the check above leaves a branch enabled.
            else => return,
        };
        match event {
            WriterEvent::ReaderStopped => receiving = false,
            WriterEvent::Ready(frame, permits) => {
                if queue.is_empty() {
                    deadline.as_mut().reset(Instant::now() + shared.limits.write);
                }
                queue.push_back(Queued {
                    unwritten: Unwritten::new(&shared, &activity, frame.len()),
                    frame,
                    _permits: permits,
                });
            }
            WriterEvent::Wrote(Ok(0)) => {
                debug!(%peer, "the peer closed its side; closing raft connection");
                return;
            }
            WriterEvent::Wrote(Ok(n)) => {
                written += n;
                activity.wrote();
                if queue.front().is_some_and(|q| written == q.frame.len()) {
                    queue.pop_front();
                    written = 0;
                    deadline.as_mut().reset(Instant::now() + shared.limits.write);
                }
            }
            WriterEvent::Wrote(Err(e)) => {
                debug!(%peer, error = %e, "write failed; closing raft connection");
                return;
            }
        }
    }
}

/// What a connection's writer waited for.
enum WriterEvent {
    ReaderStopped,
    Ready(Vec<u8>, Permits),
    Wrote(std::io::Result<usize>),
}

/// An answer ready to write.
struct Queued {
    frame: Vec<u8>,
    #[allow(dead_code)] // held for its Drop
    unwritten: Unwritten,
    /// The request's places in its connection's bounds.
    _permits: Permits,
}

fn response_frame(shared: &Shared, correlation_id: u64, response: RaftResponse) -> Vec<u8> {
    codec::encode_frame(&Envelope {
        version: WIRE_VERSION,
        source_id: shared.local_id,
        correlation_id,
        cluster_id: shared.cluster_id.clone(),
        body: Body::Response(response),
    })
}
