//! The client listener (`listeners.client`): the client protocol
//! ([`crate::messages::client`]) served on the calling thread, the node's
//! in the server binary, next to the HTTP API.
//!
//! It does what `POST /v1/append` and `GET /v1/quorum` do, without HTTP and
//! JSON: a request is one length-prefixed bincode frame and so is its
//! answer. Appends go through the same [`AppendFunnel`] as the HTTP API's,
//! so the appends of every connection that arrive in one turn of the
//! thread go to the node as one message.
//!
//! Each connection is one task. A client may send requests without waiting
//! for answers; they are answered in the order they came, and one write
//! carries every answer that is ready. Bounds, per connection:
//! - at most [`ClientLimits::max_in_flight`] requests (64) awaiting their
//!   answers, of them at most [`MAX_READS_IN_FLIGHT`] reads (2), and at
//!   most [`ClientLimits::max_frame_bytes`] of their frames (a frame alone
//!   may take all of it):
//!   past either, the listener reads nothing more until answers go out, and
//!   TCP pushes back on the client;
//! - a frame over `max_frame_bytes` (the batch limit plus a little) is
//!   answered `PayloadTooLarge` with its correlation id (once its header
//!   arrived), and the connection closes once its earlier requests are
//!   answered (reading and dropping, for up to a second, what the client
//!   still sends, so that the answers are not lost to a TCP reset); the
//!   read buffer grows with the bytes that arrive, never to a length a
//!   client claims;
//! - a frame that does not decode, or of another protocol version, is
//!   answered `BadRequest` and the connection stays open (frames are
//!   delimited by their length, so the next one is read as usual);
//! - a frame must arrive whole within [`ClientLimits::frame_timeout`]
//!   (60 s) of its first bytes, or the connection is closed; a read buffer
//!   grown for a large frame is given back once the frame is taken;
//! - a connection with no request and no answer pending for
//!   [`ClientLimits::idle_timeout`] (10 min, Kafka's
//!   `connections.max.idle.ms`) is closed, and so is one whose client does
//!   not take an answer within [`ClientLimits::write_timeout`] (60 s).
//!
//! At most [`ClientLimits::max_connections`] connections are served at
//! once; further ones wait in the listen backlog. Stopping closes the
//! listener, stops reading, and lets every connection write the answers
//! of what it had read (for at most 5 s).

use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use futures::future::{FutureExt, LocalBoxFuture};
use futures::stream::{FuturesOrdered, StreamExt};
use serde_bytes::ByteBuf;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::watch;
use tokio::time::Instant;

use super::funnel::AppendFunnel;
use super::local::{self, LocalServer};
use super::{ApiSecurity, NodeApi, Tokens};
use crate::actors::transport::{split, split_tcp, ReadHalf, WriteHalf, IDLE_TIMEOUT, WRITE_TIMEOUT};
use crate::messages::client::{
    self, ClientError, ClientFrame, ClientRequest, ClientResponse, Scope, CLIENT_HEADER_BYTES, CLIENT_PROTOCOL_VERSION,
};
use crate::messages::controller::Operation;

/// Most requests of one connection awaiting their answers.
pub const MAX_IN_FLIGHT: usize = 64;
/// Most `Read`s of one connection awaiting their answers: a page may hold
/// megabytes, and what was read stays in memory until its client takes it.
pub const MAX_READS_IN_FLIGHT: usize = 2;
/// What a frame may hold beyond a batch of `log.max_batch_bytes`: its
/// header and the request's own fields. A batch's records take more bytes
/// in the log (12 each beyond their text) than in a frame (8).
pub const FRAME_SLACK_BYTES: usize = 4096;
/// Longest a frame may take to arrive (see [`ClientLimits::frame_timeout`]).
pub const FRAME_TIMEOUT: Duration = Duration::from_secs(60);
/// Bytes read from a connection at a time, at most.
const READ_CHUNK_BYTES: usize = 64 * 1024;
/// Largest read buffer a connection keeps once the frames in it are taken.
const KEPT_BUFFER_BYTES: usize = 4 * READ_CHUNK_BYTES;
/// How long, and for how many bytes, a connection closed after a refused
/// frame, or by a stop, reads and drops what its client still sends before
/// closing: so that the answers it wrote last reach a client that is still
/// writing instead of being lost to a TCP reset.
const LINGER: Duration = Duration::from_secs(1);
const LINGER_BYTES: usize = 64 * 1024 * 1024;

/// The client listener's bounds; see the module documentation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClientLimits {
    /// Largest frame a client may send.
    pub max_frame_bytes: usize,
    pub max_in_flight: usize,
    pub max_connections: usize,
    pub idle_timeout: Duration,
    pub write_timeout: Duration,
    /// Longest a frame may take to arrive once its first bytes did, while
    /// the listener reads.
    pub frame_timeout: Duration,
}

impl ClientLimits {
    /// The bounds for a node whose batches hold at most `max_batch_bytes`
    /// (`log.max_batch_bytes`): frames up to that plus
    /// [`FRAME_SLACK_BYTES`], and as many connections as the HTTP API
    /// serves at once but with half of its share of the process's open
    /// files (the two together stay below the limit, leaving the raft
    /// listener and the log their descriptors).
    pub fn for_batch_bytes(max_batch_bytes: usize) -> ClientLimits {
        ClientLimits {
            max_frame_bytes: max_batch_bytes.saturating_add(FRAME_SLACK_BYTES),
            max_in_flight: MAX_IN_FLIGHT,
            max_connections: local::connection_bound(local::open_file_limit() / 2),
            idle_timeout: IDLE_TIMEOUT,
            write_timeout: WRITE_TIMEOUT,
            frame_timeout: FRAME_TIMEOUT,
        }
    }
}

/// Binds `addr` and serves the client protocol for `node` on the current
/// thread, which must run an actix runtime. Returns the server and the
/// bound address (port 0 picks a free port).
pub(crate) fn serve_here<N: NodeApi>(
    node: N,
    addr: SocketAddr,
    limits: ClientLimits,
    security: ApiSecurity,
) -> std::io::Result<(LocalServer, SocketAddr)> {
    let (listener, bound) = local::bind(addr)?;
    let ApiSecurity { tokens, tls } = security;
    let acceptor = tls.map(tokio_rustls::TlsAcceptor::from);
    let server = LocalServer::spawn(move |stop| async move {
        let funnel = AppendFunnel::new(node.clone());
        let limits = Rc::new(limits);
        let max_connections = limits.max_connections;
        let connection_stop = stop.clone();
        local::serve_bounded(listener, max_connections, stop, "client listener", move |stream| {
            let (node, funnel, limits, tokens, stop) = (
                node.clone(),
                funnel.clone(),
                limits.clone(),
                tokens.clone(),
                connection_stop.clone(),
            );
            let acceptor = acceptor.clone();
            async move {
                if let Err(err) = stream.set_nodelay(true) {
                    tracing::debug!("client listener: cannot set TCP_NODELAY: {err}");
                }
                let halves = match acceptor {
                    None => split_tcp(stream),
                    Some(acceptor) => {
                        let peer = stream.peer_addr().ok();
                        match tokio::time::timeout(crate::tls::HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                            Ok(Ok(stream)) => split(stream),
                            Ok(Err(err)) => {
                                return tracing::info!(?peer, "client listener: TLS handshake failed: {err}");
                            }
                            Err(_) => return tracing::info!(?peer, "client listener: no TLS handshake in time"),
                        }
                    }
                };
                connection(halves, node, funnel, limits, tokens, stop).await
            }
        })
        .await;
    });
    Ok((server, bound))
}

/// An answer to come: its correlation id, its answer, and what its request
/// holds of the connection's bounds.
type Answer = LocalBoxFuture<'static, (u64, ClientResponse, InFlight)>;

/// What a request holds of its connection's bounds until its answer goes
/// out.
#[derive(Clone, Copy, Debug)]
struct InFlight {
    /// Its frame's bytes.
    bytes: usize,
    /// Whether it is a `Read` (see [`MAX_READS_IN_FLIGHT`]).
    read: bool,
}

impl InFlight {
    fn bytes(bytes: usize) -> InFlight {
        InFlight { bytes, read: false }
    }
}

/// A frame's request, or the refusal that answers it.
enum Decoded {
    Request(u64, ClientRequest),
    Refused(u64, ClientError),
}

/// One connection's state between turns of its task.
struct Connection<N> {
    node: N,
    funnel: Rc<AppendFunnel<N>>,
    limits: Rc<ClientLimits>,
    /// The node's tokens, if it has any; then `scope` is what the
    /// connection's `Authenticate` allowed (none yet: only `Authenticate`
    /// is taken).
    tokens: Option<Arc<Tokens>>,
    scope: Option<Scope>,
    /// Bytes read and not yet taken as frames, from `consumed` on.
    input: Vec<u8>,
    consumed: usize,
    answers: FuturesOrdered<Answer>,
    /// Bytes of the frames whose answers are in `answers`.
    in_flight_bytes: usize,
    /// Of `answers`, the reads.
    reads_in_flight: usize,
    /// False once the client closed its side, a frame was too large or the
    /// listener is stopping: what was read is answered, then the
    /// connection closes.
    reading: bool,
    /// The next whole frame waits for answers to go out: it does not fit
    /// in what `in_flight_bytes` leaves, or it is a `Read` while
    /// [`MAX_READS_IN_FLIGHT`] are in flight.
    next_frame_waits: bool,
    /// A frame was refused as too large (its rest is still on the way), or
    /// the listener stopped while the client may still be sending: the
    /// close lingers (see [`LINGER`]).
    linger_on_close: bool,
}

async fn connection<N: NodeApi>(
    (mut reader, mut writer): (ReadHalf, WriteHalf),
    node: N,
    funnel: Rc<AppendFunnel<N>>,
    limits: Rc<ClientLimits>,
    tokens: Option<Arc<Tokens>>,
    mut stop: watch::Receiver<bool>,
) {
    let idle_timeout = limits.idle_timeout;
    let write_timeout = limits.write_timeout;
    let mut conn = Connection::new(node, funnel, limits, tokens);
    let idle = tokio::time::sleep(idle_timeout);
    tokio::pin!(idle);
    // While part of a frame is buffered and more is read: when all of it
    // must have come.
    let frame_timeout = conn.limits.frame_timeout;
    let frame_deadline = tokio::time::sleep(frame_timeout);
    tokio::pin!(frame_deadline);
    let mut awaiting_frame = false;
    // One future for the life of the connection, not one per turn.
    let stopping = async move {
        let _ = stop.wait_for(|&stopping| stopping).await;
    };
    tokio::pin!(stopping);
    let mut out = Vec::new();
    loop {
        let took = conn.take_frames();
        if !conn.reading && conn.answers.is_empty() {
            break;
        }
        let wants_input = conn.wants_input();
        let awaited = awaiting_frame;
        awaiting_frame = wants_input && conn.frame_started();
        if awaiting_frame && (took || !awaited) {
            frame_deadline.as_mut().reset(Instant::now() + frame_timeout);
        }
        if wants_input && conn.input.capacity() - conn.input.len() < READ_CHUNK_BYTES / 4 {
            conn.input.reserve(READ_CHUNK_BYTES);
        }
        tokio::select! {
            biased;
            () = &mut stopping, if conn.reading => {
                conn.reading = false;
                conn.linger_on_close = true;
            }
            Some(answer) = conn.answers.next() => {
                conn.answered(answer, &mut out);
                // Every other answer that is ready goes in the same write.
                while let Some(Some(answer)) = conn.answers.next().now_or_never() {
                    conn.answered(answer, &mut out);
                }
                match tokio::time::timeout(write_timeout, writer.write_all(&out)).await {
                    Ok(Ok(())) => {}
                    Ok(Err(err)) => {
                        tracing::debug!("client listener: write failed: {err}");
                        return;
                    }
                    Err(_) => {
                        tracing::debug!("client listener: an answer not taken in {write_timeout:?}; closing");
                        return;
                    }
                }
                out.clear();
                if out.capacity() > KEPT_BUFFER_BYTES {
                    // A page of records went out; keep a small buffer.
                    out = Vec::new();
                }
                idle.as_mut().reset(Instant::now() + idle_timeout);
            }
            read = reader.read_buf(&mut conn.input), if wants_input => match read {
                Ok(0) => {
                    if conn.input.len() > conn.consumed {
                        tracing::debug!(
                            "client listener: the client closed in the middle of a frame ({} bytes of it arrived)",
                            conn.input.len() - conn.consumed
                        );
                    }
                    conn.reading = false;
                }
                Ok(_) => idle.as_mut().reset(Instant::now() + idle_timeout),
                Err(err) => {
                    tracing::debug!("client listener: read failed: {err}");
                    return;
                }
            },
            () = idle.as_mut(), if conn.answers.is_empty() => {
                tracing::debug!("client listener: no request for {idle_timeout:?}; closing");
                return;
            }
            () = frame_deadline.as_mut(), if awaiting_frame => {
                tracing::debug!("client listener: a frame not sent whole within {frame_timeout:?}; closing");
                return;
            }
            else => return,
        }
    }
    if conn.linger_on_close {
        linger(reader, writer).await;
    }
}

/// Closes a connection whose client may still be sending: our side first,
/// then what arrives is read and dropped for a while (see [`LINGER`]).
async fn linger(mut reader: ReadHalf, mut writer: WriteHalf) {
    if writer.shutdown().await.is_err() {
        return;
    }
    let mut sink = vec![0; READ_CHUNK_BYTES];
    let mut dropped = 0;
    let _ = tokio::time::timeout(LINGER, async {
        while dropped < LINGER_BYTES {
            match reader.read(&mut sink).await {
                Ok(0) | Err(_) => return,
                Ok(n) => dropped += n,
            }
        }
    })
    .await;
}

impl<N: NodeApi> Connection<N> {
    fn new(
        node: N,
        funnel: Rc<AppendFunnel<N>>,
        limits: Rc<ClientLimits>,
        tokens: Option<Arc<Tokens>>,
    ) -> Connection<N> {
        Connection {
            node,
            funnel,
            limits,
            tokens,
            scope: None,
            input: Vec::new(),
            consumed: 0,
            answers: FuturesOrdered::new(),
            in_flight_bytes: 0,
            reads_in_flight: 0,
            reading: true,
            next_frame_waits: false,
            linger_on_close: false,
        }
    }

    /// Reading more is allowed: the connection is open for requests, its
    /// bounds have room, and the next frame fits in them.
    fn wants_input(&self) -> bool {
        self.reading && !self.next_frame_waits && self.answers.len() < self.limits.max_in_flight
    }

    /// Takes every whole frame the buffer holds, as far as the bounds
    /// allow, and starts its request. True if it took one.
    fn take_frames(&mut self) -> bool {
        self.next_frame_waits = false;
        let mut took = false;
        while self.wants_input() {
            let buffered = &self.input[self.consumed..];
            let Some(prefix) = buffered.get(..4) else {
                break;
            };
            let len = u32::from_be_bytes(prefix.try_into().expect("four bytes")) as usize;
            if len > self.limits.max_frame_bytes {
                // Wait for the header, so that the refusal carries the id
                // its client waits for.
                let Some(header) = buffered.get(4..).and_then(client::peek_header) else {
                    break;
                };
                let correlation_id = header.correlation_id;
                let refusal = ClientError::PayloadTooLarge(format!(
                    "a frame of {len} bytes is over the client listener's limit of {} bytes",
                    self.limits.max_frame_bytes
                ));
                self.answers.push_back(ready(
                    correlation_id,
                    ClientResponse::Error(refusal),
                    InFlight::bytes(0),
                ));
                self.reading = false;
                self.linger_on_close = true;
                self.input = Vec::new();
                self.consumed = 0;
                return took;
            }
            if self.in_flight_bytes + len > self.limits.max_frame_bytes {
                // Taken once answers give bytes back; until then nothing
                // more is read. (With nothing in flight a frame always
                // fits: a larger one was refused above.)
                self.next_frame_waits = true;
                break;
            }
            let Some(frame) = buffered.get(4..4 + len) else {
                break;
            };
            let answer = match decode(frame) {
                Decoded::Request(_, ClientRequest::Read { .. } | ClientRequest::ReadLinearizable { .. })
                    if self.reads_in_flight >= MAX_READS_IN_FLIGHT =>
                {
                    // A page of records is large: taken once a read is
                    // answered.
                    self.next_frame_waits = true;
                    break;
                }
                Decoded::Request(id, ClientRequest::Authenticate { token }) => {
                    let answer = self.authenticate(token.as_bytes());
                    ready(id, answer, InFlight::bytes(len))
                }
                Decoded::Request(id, request) => match self.refusal(&request) {
                    Some(refusal) => ready(id, ClientResponse::Error(refusal), InFlight::bytes(len)),
                    None => {
                        self.reads_in_flight += usize::from(matches!(
                            request,
                            ClientRequest::Read { .. } | ClientRequest::ReadLinearizable { .. }
                        ));
                        self.start(id, request, len)
                    }
                },
                Decoded::Refused(id, refusal) => ready(id, ClientResponse::Error(refusal), InFlight::bytes(len)),
            };
            self.consumed += 4 + len;
            self.in_flight_bytes += len;
            self.answers.push_back(answer);
            took = true;
        }
        if self.consumed > 0 {
            self.input.drain(..self.consumed);
            self.consumed = 0;
        }
        // A large frame grew the buffer; what is left of it is small.
        if self.input.capacity() > KEPT_BUFFER_BYTES && self.input.len() <= READ_CHUNK_BYTES {
            self.input.shrink_to(READ_CHUNK_BYTES);
        }
        took
    }

    /// Whether the buffer holds part of a frame that has not arrived whole.
    fn frame_started(&self) -> bool {
        self.input.len() > self.consumed
    }

    /// Takes a connection's token: with tokens, its scope holds for the
    /// requests that follow (an unknown token leaves none); without, any
    /// token may do anything.
    fn authenticate(&mut self, token: &[u8]) -> ClientResponse {
        let Some(tokens) = &self.tokens else {
            return ClientResponse::Authenticated(Scope::Admin);
        };
        self.scope = tokens.scope_of(token);
        match self.scope {
            Some(scope) => ClientResponse::Authenticated(scope),
            None => ClientResponse::Error(ClientError::Unauthenticated("the token is not valid here".to_string())),
        }
    }

    /// Why the connection's token does not allow `request`, if it does not.
    fn refusal(&self, request: &ClientRequest) -> Option<ClientError> {
        let tokens = self.tokens.as_ref()?;
        match self.scope {
            None => Some(ClientError::Unauthenticated(
                "this node requires a token: send Authenticate first (security.tokens_file)".to_string(),
            )),
            Some(scope) => tokens.check_scope(scope, request.needs()).err(),
        }
    }

    /// Starts `request`, whose frame took `len` bytes.
    fn start(&self, id: u64, request: ClientRequest, len: usize) -> Answer {
        match request {
            ClientRequest::Append { records } => {
                let appended = self.funnel.append(records.into_iter().map(ByteBuf::into_vec).collect());
                async move {
                    let answer = match appended.await {
                        Ok(appended) => ClientResponse::Appended(appended),
                        Err(err) => ClientResponse::Error(err.into()),
                    };
                    (id, answer, InFlight::bytes(len))
                }
                .boxed_local()
            }
            ClientRequest::Read { from, max } | ClientRequest::ReadLinearizable { from, max } => {
                let node = self.node.clone();
                let linearizable = matches!(request, ClientRequest::ReadLinearizable { .. });
                async move {
                    let max = usize::try_from(max).unwrap_or(usize::MAX);
                    let barrier = match linearizable {
                        true => node.read_barrier().await.map(drop),
                        false => Ok(()),
                    };
                    let answer = match barrier {
                        Err(err) => ClientResponse::Error(err.into()),
                        Ok(()) => match node.read_records(from, max).await {
                            Ok(page) => ClientResponse::Records(page),
                            Err(err) => ClientResponse::Error(ClientError::Unavailable(err.reason().to_string())),
                        },
                    };
                    (id, answer, InFlight { bytes: len, read: true })
                }
                .boxed_local()
            }
            ClientRequest::Operate(operation) => {
                let node = self.node.clone();
                async move {
                    let answer = match node.operate(operation).await {
                        Ok(answer) => ClientResponse::Operated(answer.remote()),
                        Err(err) => ClientResponse::Error(ClientError::Controller(err)),
                    };
                    (id, answer, InFlight::bytes(len))
                }
                .boxed_local()
            }
            ClientRequest::Authenticate { .. } => {
                unreachable!("taken in take_frames")
            }
            ClientRequest::Quorum => {
                let node = self.node.clone();
                async move {
                    let answer = match node.describe().await {
                        Ok(status) => ClientResponse::Quorum(status),
                        Err(err) => ClientResponse::Error(ClientError::Unavailable(err.reason().to_string())),
                    };
                    (id, answer, InFlight::bytes(len))
                }
                .boxed_local()
            }
        }
    }

    /// Encodes an answer into `out` and gives back what its request held.
    fn answered(&mut self, (correlation_id, body, held): (u64, ClientResponse, InFlight), out: &mut Vec<u8>) {
        self.in_flight_bytes -= held.bytes;
        self.reads_in_flight -= usize::from(held.read);
        let frame = ClientFrame {
            version: CLIENT_PROTOCOL_VERSION,
            correlation_id,
            body,
        };
        if let Err(err) = client::encode_frame_into(&frame, out) {
            // No answer of this node comes near 4 GiB; should one, its
            // client still gets an answer in its place.
            let refusal = ClientError::Unavailable(format!("the answer cannot be framed: {err}"));
            let frame = ClientFrame {
                body: ClientResponse::Error(refusal),
                ..frame
            };
            client::encode_frame_into(&frame, out).expect("a short error frames");
        }
    }
}

fn ready(correlation_id: u64, answer: ClientResponse, held: InFlight) -> Answer {
    futures::future::ready((correlation_id, answer, held)).boxed_local()
}

/// The request in `frame` (the bytes after its length prefix), or why it
/// is refused.
fn decode(frame: &[u8]) -> Decoded {
    let len = frame.len();
    let Some(header) = client::peek_header(frame) else {
        return Decoded::Refused(
            0,
            ClientError::BadRequest(format!(
                "a frame of {len} bytes is shorter than the {CLIENT_HEADER_BYTES}-byte header"
            )),
        );
    };
    let id = header.correlation_id;
    if header.version != CLIENT_PROTOCOL_VERSION {
        return Decoded::Refused(
            id,
            ClientError::BadRequest(format!(
                "client protocol version {} is not served here; this node speaks version {CLIENT_PROTOCOL_VERSION}",
                header.version
            )),
        );
    }
    let refused = |message: String| Decoded::Refused(id, ClientError::BadRequest(message));
    match client::decode_body::<ClientRequest>(frame) {
        Err(err) => refused(format!("the request does not decode: {err}")),
        Ok(ClientRequest::Append { records }) if records.is_empty() => {
            refused("records must hold at least one record".to_owned())
        }
        Ok(ClientRequest::Read { from, .. } | ClientRequest::ReadLinearizable { from, .. }) if from < 0 => {
            refused(format!("from: expected an offset >= 0, got {from}"))
        }
        Ok(ClientRequest::Operate(Operation::FenceExpired { .. })) => {
            refused("FenceExpired is the controller's own operation".to_owned())
        }
        Ok(request) => Decoded::Request(id, request),
    }
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;

    use tokio::io::AsyncReadExt;
    use tokio::net::TcpStream;

    use proptest::prelude::*;

    use super::*;
    use crate::node::{AppendError, Appended, MetricsSnapshot, NodeError, QuorumStatus, RecordPage, SnapshotInfo};
    use crate::raft::Offset;
    use crate::types::AppendReply;

    /// Takes appends and answers none of them until told to.
    #[derive(Clone, Default)]
    struct Held {
        replies: Rc<RefCell<Vec<AppendReply>>>,
        reads: Rc<RefCell<Vec<tokio::sync::oneshot::Sender<RecordPage>>>>,
    }

    impl NodeApi for Held {
        async fn append(&self, _: Vec<Vec<u8>>) -> Result<Appended, AppendError> {
            unimplemented!("appends come through append_each")
        }
        fn append_each(&self, groups: Vec<(Vec<Vec<u8>>, AppendReply)>) {
            self.replies
                .borrow_mut()
                .extend(groups.into_iter().map(|(_, reply)| reply));
        }
        async fn describe(&self) -> Result<QuorumStatus, NodeError> {
            Err(NodeError::Stopped("not in this test".into()))
        }
        async fn read_records(&self, _: Offset, _: usize) -> Result<RecordPage, NodeError> {
            let (page, read) = tokio::sync::oneshot::channel();
            self.reads.borrow_mut().push(page);
            read.await.map_err(|_| NodeError::Stopped("not answered".into()))
        }
        async fn metrics(&self) -> Result<MetricsSnapshot, NodeError> {
            unimplemented!()
        }
        async fn create_snapshot(&self) -> Result<SnapshotInfo, NodeError> {
            unimplemented!()
        }
    }

    /// What a client may send: frames of every kind, and garbage.
    fn piece() -> impl Strategy<Value = Vec<u8>> {
        let records = proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..40), 0..4);
        prop_oneof![
            (any::<u64>(), records).prop_map(|(id, records)| frame_of(
                id,
                ClientRequest::Append {
                    records: records.into_iter().map(ByteBuf::from).collect()
                }
            )),
            (any::<u64>(), any::<i64>(), any::<u32>())
                .prop_map(|(id, from, max)| frame_of(id, ClientRequest::Read { from, max })),
            any::<u64>().prop_map(|id| frame_of(id, ClientRequest::Quorum)),
            // A frame of another version, or cut short, or padded.
            (any::<u64>(), any::<u16>()).prop_map(|(id, version)| {
                let mut frame = frame_of(id, ClientRequest::Quorum);
                frame[4..6].copy_from_slice(&version.to_be_bytes());
                frame
            }),
            (any::<u64>(), 0usize..20).prop_map(|(id, cut)| {
                let mut frame = frame_of(id, ClientRequest::Quorum);
                let body = frame.len() - 4;
                let len = body.saturating_sub(cut) as u32;
                frame.truncate(4 + len as usize);
                frame[..4].copy_from_slice(&len.to_be_bytes());
                frame
            }),
            // A length prefix and anything after it.
            (0u32..400, proptest::collection::vec(any::<u8>(), 0..60)).prop_map(|(len, rest)| {
                let mut frame = len.to_be_bytes().to_vec();
                frame.extend(rest);
                frame
            }),
            proptest::collection::vec(any::<u8>(), 0..60),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

        #[test]
        fn any_bytes_decode_to_a_request_or_a_refusal_with_the_frames_id(
            id in any::<u64>(),
            version in prop_oneof![Just(CLIENT_PROTOCOL_VERSION), any::<u16>()],
            body in proptest::collection::vec(any::<u8>(), 0..120),
            headed in any::<bool>(),
        ) {
            let mut frame = Vec::new();
            if headed {
                frame.extend(version.to_be_bytes());
                frame.extend(id.to_be_bytes());
            }
            frame.extend(&body);
            let got = match decode(&frame) {
                Decoded::Request(got, _) | Decoded::Refused(got, _) => got,
            };
            match client::peek_header(&frame) {
                Some(header) => prop_assert_eq!(got, header.correlation_id),
                None => prop_assert_eq!(got, 0),
            }
        }

        /// Whatever a client sends, cut wherever TCP cuts it, is taken
        /// apart without a panic and within the connection's bounds.
        #[test]
        fn any_stream_is_taken_within_the_bounds(
            pieces in proptest::collection::vec(piece(), 0..30),
            cuts in proptest::collection::vec(1usize..200, 1..40),
        ) {
            let stream: Vec<u8> = pieces.concat();
            let limits = ClientLimits {
                max_frame_bytes: 300,
                max_in_flight: 8,
                ..ClientLimits::for_batch_bytes(crate::messages::MAX_BATCH_BYTES)
            };
            actix_rt::System::new().block_on(async move {
                let node = Held::default();
                let funnel = AppendFunnel::new(node.clone());
                let mut conn = Connection::new(node, funnel, Rc::new(limits), None);
                let mut at = 0;
                for cut in cuts.iter().cycle() {
                    if at >= stream.len() || !conn.wants_input() {
                        break;
                    }
                    let end = (at + cut).min(stream.len());
                    conn.input.extend_from_slice(&stream[at..end]);
                    at = end;
                    conn.take_frames();
                    assert!(conn.answers.len() <= 8, "{} requests in flight", conn.answers.len());
                    assert!(conn.reads_in_flight <= MAX_READS_IN_FLIGHT);
                    assert!(conn.in_flight_bytes <= 300, "{} bytes in flight", conn.in_flight_bytes);
                    // What waits in the buffer is at most one frame and what
                    // came with it in one read.
                    assert!(conn.input.len() <= 4 + 300 + 200, "{} bytes buffered", conn.input.len());
                }
            });
        }
    }

    fn frame_of(correlation_id: u64, body: ClientRequest) -> Vec<u8> {
        let mut out = Vec::new();
        let frame = ClientFrame {
            version: CLIENT_PROTOCOL_VERSION,
            correlation_id,
            body,
        };
        client::encode_frame_into(&frame, &mut out).unwrap();
        out
    }

    /// The listener on a free port, without tokens or TLS.
    fn serve_plain(node: Held, limits: ClientLimits) -> (LocalServer, SocketAddr) {
        serve_here(node, "127.0.0.1:0".parse().unwrap(), limits, ApiSecurity::default()).unwrap()
    }

    #[actix_rt::test]
    async fn a_connection_has_no_more_than_max_reads_in_flight_and_later_requests_wait_behind_them() {
        let node = Held::default();
        let limits = ClientLimits::for_batch_bytes(crate::messages::MAX_BATCH_BYTES);
        let (server, addr) = serve_plain(node.clone(), limits);
        let mut bytes = Vec::new();
        for id in 0..5 {
            bytes.extend(frame_of(id, ClientRequest::Read { from: 0, max: 10 }));
        }
        bytes.extend(append_frame(5, 10));
        let mut stream = TcpStream::connect(addr).await.unwrap();
        stream.write_all(&bytes).await.unwrap();
        settle().await;
        assert_eq!(node.reads.borrow().len(), MAX_READS_IN_FLIGHT);
        assert!(
            node.replies.borrow().is_empty(),
            "requests after a waiting read wait too"
        );
        // One page out: one more read in.
        let page = RecordPage {
            high_watermark: 0,
            log_start_offset: 0,
            records: Vec::new(),
        };
        let _ = node.reads.borrow_mut().remove(0).send(page);
        settle().await;
        assert_eq!(
            node.reads.borrow().len(),
            MAX_READS_IN_FLIGHT,
            "one answered, one more taken"
        );
        let mut prefix = [0; 4];
        stream.read_exact(&mut prefix).await.unwrap();
        let mut body = vec![0; u32::from_be_bytes(prefix) as usize];
        stream.read_exact(&mut body).await.unwrap();
        assert_eq!(client::peek_header(&body).unwrap().correlation_id, 0);
        std::mem::forget(server);
    }

    fn append_frame(correlation_id: u64, bytes: usize) -> Vec<u8> {
        let mut out = Vec::new();
        let frame = ClientFrame {
            version: CLIENT_PROTOCOL_VERSION,
            correlation_id,
            body: ClientRequest::Append {
                records: vec![ByteBuf::from(vec![7; bytes])],
            },
        };
        client::encode_frame_into(&frame, &mut out).unwrap();
        out
    }

    async fn settle() {
        for _ in 0..50 {
            tokio::task::yield_now().await;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    /// Requests past a connection's bounds are left unread until answers go
    /// out: the node is handed no more than the bounds allow.
    async fn handed_over(limits: ClientLimits, frames: usize, bytes: usize) -> (Held, usize, TcpStream) {
        let node = Held::default();
        let (_server, addr) = serve_plain(node.clone(), limits);
        let mut stream = TcpStream::connect(addr).await.unwrap();
        let mut all = Vec::new();
        for i in 0..frames {
            all.extend(append_frame(i as u64, bytes));
        }
        stream.write_all(&all).await.unwrap();
        settle().await;
        let taken = node.replies.borrow().len();
        std::mem::forget(_server);
        (node, taken, stream)
    }

    #[actix_rt::test]
    async fn a_connection_takes_no_more_requests_than_max_in_flight_until_answers_go_out() {
        let limits = ClientLimits {
            max_in_flight: 4,
            ..ClientLimits::for_batch_bytes(crate::messages::MAX_BATCH_BYTES)
        };
        let (node, taken, mut stream) = handed_over(limits, 10, 1).await;
        assert_eq!(taken, 4);
        // Answering the first two lets two more in, and their answers out,
        // in order.
        let replies: Vec<AppendReply> = node.replies.borrow_mut().drain(..2).collect();
        for (i, reply) in replies.into_iter().enumerate() {
            let _ = reply.send(Ok(Appended {
                base_offset: i as Offset,
                last_offset: i as Offset,
                epoch: 1,
            }));
        }
        settle().await;
        assert_eq!(node.replies.borrow().len(), 4, "two answered, two more taken");
        for expected in 0..2u64 {
            let mut prefix = [0; 4];
            stream.read_exact(&mut prefix).await.unwrap();
            let mut body = vec![0; u32::from_be_bytes(prefix) as usize];
            stream.read_exact(&mut body).await.unwrap();
            assert_eq!(client::peek_header(&body).unwrap().correlation_id, expected);
        }
    }

    #[actix_rt::test]
    async fn a_connection_takes_no_more_request_bytes_than_max_frame_bytes_until_answers_go_out() {
        let limits = ClientLimits {
            max_frame_bytes: 10_000,
            ..ClientLimits::for_batch_bytes(crate::messages::MAX_BATCH_BYTES)
        };
        // Frames of about 4 KB: two fit in the bound, a third would not.
        let (node, taken, _stream) = handed_over(limits, 10, 4000).await;
        assert_eq!(taken, 2);
        // An answer gives its frame's bytes back: one more is taken.
        let reply = node.replies.borrow_mut().remove(0);
        let _ = reply.send(Err(AppendError::Unavailable("refused".to_owned())));
        settle().await;
        assert_eq!(node.replies.borrow().len(), 2, "one answered, one more taken");
    }

    /// A listener for a held node whose frames must arrive whole within
    /// `frame_timeout`.
    fn serve_with_frame_timeout(frame_timeout: Duration) -> (Held, LocalServer, SocketAddr) {
        let limits = ClientLimits {
            frame_timeout,
            ..ClientLimits::for_batch_bytes(crate::messages::MAX_BATCH_BYTES)
        };
        let node = Held::default();
        let (server, addr) = serve_plain(node.clone(), limits);
        (node, server, addr)
    }

    #[actix_rt::test]
    async fn frames_that_keep_arriving_whole_keep_the_connection_though_each_read_ends_inside_one() {
        let (node, server, addr) = serve_with_frame_timeout(Duration::from_millis(500));
        let frame_len = append_frame(0, 100).len();
        let mut bytes = Vec::new();
        for i in 0..5 {
            bytes.extend(append_frame(i, 100));
        }
        // Half a frame, then writes that each finish a frame and start the
        // next: part of a frame is buffered all along, for far longer than
        // the timeout, but each frame arrives whole within it.
        let mut cuts = vec![0, frame_len / 2];
        while cuts.last().unwrap() + frame_len < bytes.len() {
            cuts.push(cuts.last().unwrap() + frame_len);
        }
        cuts.push(bytes.len());
        let mut stream = TcpStream::connect(addr).await.unwrap();
        for pair in cuts.windows(2) {
            let _ = stream.write_all(&bytes[pair[0]..pair[1]]).await;
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        settle().await;
        assert_eq!(
            node.replies.borrow().len(),
            5,
            "every frame taken on the one connection"
        );
        std::mem::forget(server);
    }

    #[actix_rt::test]
    async fn a_frame_that_does_not_arrive_whole_in_time_closes_the_connection() {
        let (node, server, addr) = serve_with_frame_timeout(Duration::from_millis(200));
        let frame = append_frame(1, 100);
        // Whole frames, slowly, keep the connection.
        let mut stream = TcpStream::connect(addr).await.unwrap();
        for _ in 0..3 {
            stream.write_all(&frame).await.unwrap();
            tokio::time::sleep(Duration::from_millis(120)).await;
        }
        settle().await;
        assert_eq!(node.replies.borrow().len(), 3);
        // Half a frame, then nothing.
        stream.write_all(&frame[..frame.len() / 2]).await.unwrap();
        let mut byte = [0u8; 1];
        let read = tokio::time::timeout(Duration::from_secs(10), stream.read(&mut byte)).await;
        assert!(
            matches!(read, Ok(Ok(0)) | Ok(Err(_))),
            "closed once the frame was late: {read:?}"
        );
        std::mem::forget(server);
    }
}
