//! RequestManager: the outbound half of the raft transport (docs/ARCHITECTURE.md, "Actors and threads").
//!
//! # Messages
//!
//! Handled:
//! - [`SendRequest`] — send `request` to voter `to` with the caller's
//!   correlation id. Exactly one [`RequestOutcome`] follows for every
//!   `SendRequest`: the peer's response, or a [`TransportError`]
//!   (`UnknownNode` at once for an id not in the voter set, `Connect` when
//!   the connection cannot be opened, `Disconnected` when it breaks,
//!   `Timeout` after the request's own `timeout_ms`, which for the
//!   protocol's requests is the engine's deadline: one clock).
//!
//! Sent:
//! - [`RequestOutcome`] to the `outcome` recipient (the QuorumState actor),
//!   with `send` so that a full mailbox pushes back instead of dropping, and
//!   a closed one is logged as an error.
//!
//! # Shape
//!
//! The actor is a router: it encodes the frame and hands it to the task of
//! its destination. Each destination has one long-lived task (spawned on the
//! first request) that owns the connection's bookkeeping — the requests in
//! flight and their deadlines — and, while connected, one reader and one
//! writer task for the socket. Nothing is spawned per request, and no I/O
//! runs on the actor.
//!
//! Connections are opened lazily, one per destination. A failed connection
//! fails every request in flight on it and is reopened by the next request
//! (the caller's retry backoff spaces the attempts). Responses are matched
//! by correlation id, so any number of requests may be in flight on one
//! connection and answered in any order.
//!
//! Three rules beyond the obvious ones:
//! - When a request times out and nothing at all has arrived on its
//!   connection since it was sent, the connection is presumed dead (a
//!   half-open TCP connection reports no error by itself) and is closed,
//!   failing the rest of its requests with `Disconnected`, like Kafka's
//!   NetworkClient does on a request timeout.
//! - When a request times out before its frame was even written whole (the
//!   peer has stopped reading this connection: a leader holding back a
//!   follower's forwarded appends, say), the connection is closed too.
//!   Otherwise the frames of requests already failed as timed out would
//!   pile up behind it without bound, and be delivered, and acted on, once
//!   the peer read again.
//! - A response whose envelope names another node than the destination is
//!   refused and the connection closed: counting node 3's vote as node 2's
//!   would break election safety.

use std::cell::Cell;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::time::Duration;

use actix::{Actor, Context, Handler, Recipient};
use tokio::io::{AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::{debug, error, info, warn};

use super::transport::{read_frame, split, split_tcp, FrameError, ReadHalf, WriteHalf};
use crate::messages::actor::{RequestOutcome, SendRequest, TransportError};
use crate::messages::codec::{self, Body, Envelope, WIRE_VERSION};
use crate::messages::rpc::{ErrorCode, RaftResponse};
use crate::raft::NodeId;
use tokio_rustls::TlsConnector;

/// Frames smaller than this are coalesced into one write with the frames
/// queued behind them.
const COALESCE_BYTES: usize = 64 * 1024;

/// Bytes read from a socket per system call.
const READ_BUFFER_BYTES: usize = 64 * 1024;

/// Owns the outbound connections to the other voters.
pub struct RequestManager {
    local_id: NodeId,
    cluster_id: String,
    /// id → `host:port` of every voter we may send to.
    voters: BTreeMap<NodeId, String>,
    /// How long opening a connection may take (`quorum.request_timeout_ms`);
    /// each request carries its own timeout.
    request_timeout: Duration,
    /// Largest response frame accepted from a peer.
    max_frame_bytes: u64,
    outcome: Recipient<RequestOutcome>,
    /// With TLS: this node's certificate, and the CA peers' are checked
    /// against.
    tls: Option<TlsConnector>,
    /// The request queue of each destination's task.
    destinations: HashMap<NodeId, mpsc::UnboundedSender<Outgoing>>,
}

impl RequestManager {
    pub fn new(
        local_id: NodeId,
        cluster_id: String,
        voters: BTreeMap<NodeId, String>,
        request_timeout_ms: u64,
        max_frame_bytes: u64,
        outcome: Recipient<RequestOutcome>,
        tls: Option<TlsConnector>,
    ) -> Self {
        assert!(request_timeout_ms > 0, "request_timeout_ms must be positive");
        RequestManager {
            local_id,
            cluster_id,
            voters,
            request_timeout: Duration::from_millis(request_timeout_ms),
            max_frame_bytes,
            outcome,
            tls,
            destinations: HashMap::new(),
        }
    }

    fn spawn_destination(&self, to: NodeId, endpoint: String) -> mpsc::UnboundedSender<Outgoing> {
        let (tx, rx) = mpsc::unbounded_channel();
        let destination = Destination {
            next_seq: 1,
            to,
            endpoint,
            cluster_id: self.cluster_id.clone(),
            request_timeout: self.request_timeout,
            max_frame_bytes: self.max_frame_bytes,
            outcome: self.outcome.clone(),
            tls: self.tls.clone(),
            in_flight: HashMap::new(),
            deadlines: BTreeSet::new(),
            connecting: None,
            queued: Vec::new(),
            connection: None,
            failing: false,
        };
        actix_rt::spawn(destination.run(rx));
        tx
    }
}

impl Actor for RequestManager {
    type Context = Context<Self>;

    fn started(&mut self, _ctx: &mut Self::Context) {
        info!(node_id = self.local_id, voters = ?self.voters, "request manager started");
    }

    fn stopped(&mut self, _ctx: &mut Self::Context) {
        // Dropping the queues makes every destination task fail what it has
        // in flight (each SendRequest still gets its outcome) and exit.
        self.destinations.clear();
        info!(node_id = self.local_id, "request manager stopped");
    }
}

impl Handler<SendRequest> for RequestManager {
    type Result = ();

    fn handle(&mut self, msg: SendRequest, _ctx: &mut Self::Context) {
        let SendRequest {
            to,
            correlation_id,
            request,
            timeout_ms,
        } = msg;
        let Some(endpoint) = self.voters.get(&to) else {
            warn!(to, api = request.api_name(), "request to a node that is not a voter");
            let outcome = RequestOutcome {
                from: to,
                correlation_id,
                result: Err(TransportError::UnknownNode(to)),
            };
            let recipient = self.outcome.clone();
            actix_rt::spawn(async move { deliver(&recipient, outcome).await });
            return;
        };
        let frame = codec::encode_frame(&Envelope {
            version: WIRE_VERSION,
            source_id: self.local_id,
            correlation_id,
            cluster_id: self.cluster_id.clone(),
            body: Body::Request(request),
        });
        let outgoing = Outgoing {
            correlation_id,
            frame,
            deadline: Instant::now() + Duration::from_millis(timeout_ms),
        };
        let outgoing = match self.destinations.get(&to) {
            Some(queue) => match queue.send(outgoing) {
                Ok(()) => return,
                // The task is gone (it only exits once its queue closes, so
                // this is defensive): start a new one.
                Err(mpsc::error::SendError(outgoing)) => outgoing,
            },
            None => outgoing,
        };
        let queue = self.spawn_destination(to, endpoint.clone());
        if queue.send(outgoing).is_err() {
            unreachable!("a destination task just spawned holds its queue's receiver");
        }
        self.destinations.insert(to, queue);
    }
}

/// Delivers one outcome. A closed mailbox means the node is going down (the
/// QuorumState actor stops before the request managers do): nothing is left
/// to tell, so it is only noted.
async fn deliver(recipient: &Recipient<RequestOutcome>, outcome: RequestOutcome) {
    let (from, correlation_id) = (outcome.from, outcome.correlation_id);
    if let Err(e) = recipient.send(outcome).await {
        debug!(from, correlation_id, error = %e, "request outcome dropped: its actor has stopped");
    }
}

/// One request on its way to a destination's task.
struct Outgoing {
    correlation_id: u64,
    frame: Vec<u8>,
    /// When the request times out (set when the actor accepted it).
    deadline: Instant,
}

/// A request sent (or queued to be sent) and not yet answered.
struct InFlight {
    /// When the destination task took it.
    accepted_at: Instant,
    /// Its frame's place in the order of frames handed to the connection's
    /// writer; `None` while it waits for the connection to open.
    seq: Option<u64>,
}

/// What a connection's reader and writer tell the destination task.
enum ConnectionEvent {
    Response(Envelope),
    /// The connection is unusable; the reason is for the outcome and logs.
    Closed(String),
}

/// An open connection: a writer fed with frames and a reader reporting
/// responses. Dropping it stops both tasks and closes the socket.
struct Connection {
    /// Frames for the writer, each with its sequence number.
    frames: mpsc::UnboundedSender<(u64, Vec<u8>)>,
    /// The sequence number of the last frame the writer wrote whole.
    written: Rc<Cell<u64>>,
    events: mpsc::UnboundedReceiver<ConnectionEvent>,
    /// When a frame last arrived (or the connection opened).
    last_received_at: Instant,
    reader: JoinHandle<()>,
    writer: JoinHandle<()>,
}

impl Drop for Connection {
    fn drop(&mut self) {
        self.reader.abort();
        self.writer.abort();
    }
}

type ConnectFuture = Pin<Box<dyn Future<Output = std::io::Result<(ReadHalf, WriteHalf)>>>>;

/// The bookkeeping of one destination, run as one task.
///
/// Invariants: `connecting` and `connection` are never both set; `queued`
/// is empty unless `connecting` is set; every key of `in_flight` has an
/// entry in `deadlines`, which is ordered by deadline (requests carry
/// timeouts of their own). Each request leaves `in_flight` exactly
/// once, and that is when its outcome is delivered.
struct Destination {
    /// The sequence number of the next frame handed to a writer.
    next_seq: u64,
    to: NodeId,
    endpoint: String,
    cluster_id: String,
    request_timeout: Duration,
    max_frame_bytes: u64,
    outcome: Recipient<RequestOutcome>,
    tls: Option<TlsConnector>,
    in_flight: HashMap<u64, InFlight>,
    /// (deadline, correlation id); entries already answered are skipped.
    deadlines: BTreeSet<(Instant, u64)>,
    connecting: Option<ConnectFuture>,
    /// Frames waiting for the connection being opened.
    queued: Vec<(u64, Vec<u8>)>,
    connection: Option<Connection>,
    /// The last connection attempt failed (to log repeated failures quietly).
    failing: bool,
}

/// Awaits `future` if there is one; otherwise never resolves.
async fn maybe<F: Future + Unpin>(future: Option<&mut F>) -> F::Output {
    match future {
        Some(future) => future.await,
        None => std::future::pending().await,
    }
}

/// Receives from `events` if there is a connection; otherwise never resolves.
async fn maybe_event(connection: Option<&mut Connection>) -> Option<ConnectionEvent> {
    match connection {
        Some(connection) => connection.events.recv().await,
        None => std::future::pending().await,
    }
}

impl Destination {
    async fn run(mut self, mut requests: mpsc::UnboundedReceiver<Outgoing>) {
        // One timer for the earliest deadline, reset rather than recreated.
        let timer = tokio::time::sleep_until(Instant::now());
        tokio::pin!(timer);
        loop {
            let next_deadline = self.deadlines.first().map(|&(deadline, _)| deadline);
            if let Some(deadline) = next_deadline {
                if timer.deadline() != deadline {
                    timer.as_mut().reset(deadline);
                }
            }
            tokio::select! {
                request = requests.recv() => match request {
                    Some(request) => self.on_request(request).await,
                    None => break,
                },
                connected = maybe(self.connecting.as_mut()) => self.on_connected(connected).await,
                event = maybe_event(self.connection.as_mut()) => self.on_event(event).await,
                _ = &mut timer, if next_deadline.is_some() => {
                    self.on_deadlines().await
                }
            }
        }
        // The RequestManager is gone; every request still gets its outcome.
        self.connecting = None;
        self.connection = None;
        self.fail_all(|to| TransportError::Disconnected(to, "request manager stopped".to_string()))
            .await;
    }

    async fn on_request(&mut self, request: Outgoing) {
        let Outgoing {
            correlation_id,
            frame,
            deadline,
        } = request;
        if self.in_flight.contains_key(&correlation_id) {
            // The caller reused an id still in flight: its response could not
            // be told apart. Refuse the new request, keep the old one.
            error!(
                to = self.to,
                correlation_id, "correlation id already in flight; refusing the request"
            );
            let reason = format!("correlation id {correlation_id} is already in flight");
            let outcome = RequestOutcome {
                from: self.to,
                correlation_id,
                result: Err(TransportError::Disconnected(self.to, reason)),
            };
            deliver(&self.outcome, outcome).await;
            return;
        }
        let mut request = InFlight {
            accepted_at: Instant::now(),
            seq: None,
        };
        self.deadlines.insert((deadline, correlation_id));
        if let Some(connection) = &self.connection {
            let seq = self.next_seq;
            self.next_seq += 1;
            request.seq = Some(seq);
            self.in_flight.insert(correlation_id, request);
            // A send error means the writer has stopped; its Closed event
            // is already queued and will fail this request.
            let _ = connection.frames.send((seq, frame));
            return;
        }
        self.in_flight.insert(correlation_id, request);
        self.queued.push((correlation_id, frame));
        if self.connecting.is_none() {
            self.connecting = Some(Box::pin(connect(
                self.endpoint.clone(),
                self.request_timeout,
                self.tls.clone(),
            )));
        }
    }

    async fn on_connected(&mut self, connected: std::io::Result<(ReadHalf, WriteHalf)>) {
        self.connecting = None;
        let queued = std::mem::take(&mut self.queued);
        let (read_half, write_half) = match connected {
            Ok(halves) => halves,
            Err(e) => {
                if self.failing {
                    debug!(to = self.to, endpoint = %self.endpoint, error = %e, "cannot connect");
                } else {
                    warn!(to = self.to, endpoint = %self.endpoint, error = %e, "cannot connect");
                }
                self.failing = true;
                let reason = e.to_string();
                self.fail_all(|to| TransportError::Connect(to, reason.clone())).await;
                return;
            }
        };
        if self.failing {
            info!(to = self.to, endpoint = %self.endpoint, "connected");
        } else {
            debug!(to = self.to, endpoint = %self.endpoint, "connected");
        }
        self.failing = false;
        let (frames_tx, frames_rx) = mpsc::unbounded_channel();
        let (events_tx, events_rx) = mpsc::unbounded_channel();
        let written = Rc::new(Cell::new(self.next_seq - 1));
        let reader = actix_rt::spawn(read_responses(read_half, self.max_frame_bytes, events_tx.clone()));
        let writer = actix_rt::spawn(write_frames(write_half, frames_rx, written.clone(), events_tx));
        for (correlation_id, frame) in queued {
            // Requests that timed out while we connected are not sent.
            if let Some(request) = self.in_flight.get_mut(&correlation_id) {
                request.seq = Some(self.next_seq);
                let _ = frames_tx.send((self.next_seq, frame));
                self.next_seq += 1;
            }
        }
        self.connection = Some(Connection {
            frames: frames_tx,
            written,
            events: events_rx,
            last_received_at: Instant::now(),
            reader,
            writer,
        });
    }

    async fn on_event(&mut self, event: Option<ConnectionEvent>) {
        let envelope = match event {
            Some(ConnectionEvent::Response(envelope)) => envelope,
            Some(ConnectionEvent::Closed(reason)) => return self.disconnect(reason).await,
            None => return self.disconnect("connection tasks ended".to_string()).await,
        };
        if envelope.source_id != self.to {
            // The endpoint we know for `to` is another node: counting its
            // answers (votes!) as `to`'s would be unsafe.
            let reason = format!("{} answered as node {}", self.endpoint, envelope.source_id);
            error!(to = self.to, reason = %reason, "wrong node at voter endpoint; closing the connection");
            return self.disconnect(reason).await;
        }
        if let Some(connection) = &mut self.connection {
            connection.last_received_at = Instant::now();
        }
        let Body::Response(mut response) = envelope.body else {
            return self
                .disconnect("peer sent a request on an outbound connection".to_string())
                .await;
        };
        if envelope.cluster_id != self.cluster_id && response != RaftResponse::Error(ErrorCode::InconsistentClusterId) {
            warn!(to = self.to, their_cluster_id = %envelope.cluster_id, "response from another cluster");
            response = RaftResponse::Error(ErrorCode::InconsistentClusterId);
        }
        let correlation_id = envelope.correlation_id;
        if self.in_flight.remove(&correlation_id).is_none() {
            debug!(
                to = self.to,
                correlation_id, "response to a request no longer in flight (timed out)"
            );
            return;
        }
        let outcome = RequestOutcome {
            from: self.to,
            correlation_id,
            result: Ok(response),
        };
        deliver(&self.outcome, outcome).await;
    }

    async fn on_deadlines(&mut self) {
        let now = Instant::now();
        let mut timed_out = Vec::new();
        let mut connection_silent = false;
        let mut connection_stuck = false;
        while let Some(&(deadline, correlation_id)) = self.deadlines.first() {
            if deadline > now {
                break;
            }
            self.deadlines.pop_first();
            if let Some(request) = self.in_flight.remove(&correlation_id) {
                if let Some(connection) = &self.connection {
                    connection_silent |= connection.last_received_at <= request.accepted_at;
                    connection_stuck |= request.seq.is_some_and(|seq| seq > connection.written.get());
                }
                timed_out.push(correlation_id);
            }
        }
        for correlation_id in timed_out {
            debug!(to = self.to, correlation_id, "request timed out");
            let outcome = RequestOutcome {
                from: self.to,
                correlation_id,
                result: Err(TransportError::Timeout(self.to)),
            };
            deliver(&self.outcome, outcome).await;
        }
        if connection_silent {
            // Nothing at all arrived since the request was sent: the
            // connection is presumably dead (a half-open TCP connection never
            // reports an error by itself). Start afresh with the next request.
            warn!(
                to = self.to,
                "no response within the request timeout; closing the connection"
            );
            self.disconnect("no response within the request timeout".to_string())
                .await;
        } else if connection_stuck {
            // The peer has not read one request whole in a request timeout:
            // what is queued behind it has timed out or will, and must not
            // reach the peer later.
            warn!(
                to = self.to,
                "a request timed out before its frame could be written whole; closing the connection"
            );
            self.disconnect("a request's frame could not be written whole within the request timeout".to_string())
                .await;
        }
    }

    /// Drops the connection and fails everything in flight on it.
    async fn disconnect(&mut self, reason: String) {
        if self.connection.take().is_some() {
            debug!(to = self.to, reason = %reason, "connection closed");
        }
        self.fail_all(|to| TransportError::Disconnected(to, reason.clone()))
            .await;
    }

    async fn fail_all(&mut self, error: impl Fn(NodeId) -> TransportError) {
        self.deadlines.clear();
        self.queued.clear();
        let mut failed: Vec<u64> = self
            .in_flight
            .drain()
            .map(|(correlation_id, _)| correlation_id)
            .collect();
        failed.sort_unstable();
        for correlation_id in failed {
            let outcome = RequestOutcome {
                from: self.to,
                correlation_id,
                result: Err(error(self.to)),
            };
            deliver(&self.outcome, outcome).await;
        }
    }
}

/// Opens a connection (with `tls`, and its handshake: the peer's
/// certificate must come from the CA and name the endpoint's host), giving
/// up after `timeout`.
async fn connect(
    endpoint: String,
    timeout: Duration,
    tls: Option<TlsConnector>,
) -> std::io::Result<(ReadHalf, WriteHalf)> {
    let open = async {
        let stream = TcpStream::connect(endpoint.as_str()).await?;
        if let Err(e) = stream.set_nodelay(true) {
            debug!(%endpoint, error = %e, "cannot set TCP_NODELAY");
        }
        match tls {
            None => Ok(split_tcp(stream)),
            Some(connector) => {
                let name = crate::tls::server_name(&endpoint)?;
                let stream = connector
                    .connect(name, stream)
                    .await
                    .map_err(|e| std::io::Error::new(e.kind(), format!("TLS handshake with {endpoint} failed: {e}")))?;
                Ok(split(stream))
            }
        }
    };
    match tokio::time::timeout(timeout, open).await {
        Ok(result) => result,
        Err(_) => Err(std::io::Error::new(std::io::ErrorKind::TimedOut, "connect timed out")),
    }
}

/// Reads response frames until the connection fails; the last event is
/// always `Closed`.
async fn read_responses(read_half: ReadHalf, max_frame_bytes: u64, events: mpsc::UnboundedSender<ConnectionEvent>) {
    let mut reader = BufReader::with_capacity(READ_BUFFER_BYTES, read_half);
    let reason = loop {
        let body = match read_frame(&mut reader, max_frame_bytes).await {
            Ok(Some(body)) => body,
            Ok(None) => break "closed by peer".to_string(),
            Err(e @ FrameError::Io(_)) => break e.to_string(),
            Err(e) => {
                warn!(error = %e, "bad frame from a peer; closing the connection");
                break e.to_string();
            }
        };
        match codec::decode_frame(&body, max_frame_bytes) {
            Ok(envelope) => {
                if events.send(ConnectionEvent::Response(envelope)).is_err() {
                    return;
                }
            }
            Err(e) => {
                warn!(error = %e, "undecodable frame from a peer; closing the connection");
                break format!("undecodable frame: {e}");
            }
        }
    };
    let _ = events.send(ConnectionEvent::Closed(reason));
}

/// Writes frames in order, coalescing small ones queued together, and
/// keeps `written` at the sequence number of the last frame written whole.
async fn write_frames(
    mut write_half: WriteHalf,
    mut frames: mpsc::UnboundedReceiver<(u64, Vec<u8>)>,
    written: Rc<Cell<u64>>,
    events: mpsc::UnboundedSender<ConnectionEvent>,
) {
    while let Some((mut last, mut buffer)) = frames.recv().await {
        while buffer.len() < COALESCE_BYTES {
            match frames.try_recv() {
                Ok((seq, frame)) => {
                    buffer.extend_from_slice(&frame);
                    last = seq;
                }
                Err(_) => break,
            }
        }
        if let Err(e) = write_half.write_all(&buffer).await {
            let _ = events.send(ConnectionEvent::Closed(format!("write failed: {e}")));
            return;
        }
        written.set(last);
    }
}
