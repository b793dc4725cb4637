//! A client of the client protocol ([`crate::messages::client`]), for a
//! node's `listeners.client`: appends and the quorum's status over one TCP
//! connection, without HTTP.
//!
//! ```no_run
//! # async fn example() -> Result<(), kraft::client::Error> {
//! let mut client = kraft::client::Client::connect("127.0.0.1:9092").await?;
//! let appended = client.append(vec![b"hello".to_vec(), b"world".to_vec()]).await?;
//! println!("committed at offsets {}..={}", appended.base_offset, appended.last_offset);
//! # Ok(())
//! # }
//! ```
//!
//! A [`Client`] sends one request at a time and waits for its answer. It
//! works on any tokio runtime. A connection that failed is opened again by
//! the next request. A [`Producer`] takes appends from any number of tasks
//! and pipelines them over one connection.

use std::collections::VecDeque;
use std::io;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_bytes::ByteBuf;
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{lookup_host, TcpStream, ToSocketAddrs};
use tokio::sync::{mpsc, oneshot};

use crate::actors::transport::{self, read_frame, split_tcp, ReadHalf, WriteHalf};
use crate::api::MAX_IN_FLIGHT;
use crate::messages::client::{self, ClientFrame, ClientRequest, ClientResponse, CLIENT_PROTOCOL_VERSION};
use crate::messages::controller::{Operation, OperationAnswer};
use crate::messages::Record;
use crate::node::{Appended, QuorumStatus, RecordPage};
use crate::raft::Offset;
use rustls::pki_types::ServerName;
use std::sync::Arc;
use tokio::io::{AsyncRead, AsyncWrite};

pub use crate::messages::client::ClientError;

/// Largest answer a client reads; a node's answers are far smaller.
const MAX_ANSWER_BYTES: u64 = 16 * 1024 * 1024;

/// Why a request failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The node answered with an error (see [`ClientError`] for what was
    /// written in each case).
    #[error(transparent)]
    Node(#[from] ClientError),
    /// The request was not sent whole: the node did nothing with it.
    #[error("cannot reach {addr}: {source}")]
    NotSent { addr: SocketAddr, source: io::Error },
    /// The request was sent but no answer came (the connection failed or
    /// the node stopped): an append may or may not commit. Not retried.
    #[error("no answer from {addr} to a request it was sent (an append may or may not commit): {reason}")]
    NoAnswer { addr: SocketAddr, reason: String },
    /// The answer is not what the protocol allows (another version, the
    /// wrong correlation id, bytes that do not decode): the outcome of the
    /// request is unknown, as for [`Error::NoAnswer`].
    #[error("unexpected answer from {addr}: {reason}")]
    Protocol { addr: SocketAddr, reason: String },
}

/// A connection whose last answer came this recently is used without
/// [`still_open`]'s look (a system call): a node closes only connections
/// that were idle for far longer, or when it stops, which can happen at
/// any moment anyway.
const QUIET: Duration = Duration::from_millis(50);

/// Whether the node may still read what is sent on `stream`: it has not
/// closed the connection (it does so after a while idle, when nothing is
/// pending) and sent nothing unasked. Looked at before a request goes out
/// on a connection used before, so that a request written into a closed
/// connection, which would end in [`Error::NoAnswer`] although the node
/// never saw it, goes out on a new one instead. A close that comes after
/// this look still ends so.
fn still_open(stream: &TcpStream) -> bool {
    use std::os::fd::AsRawFd;
    let mut byte = 0u8;
    // SAFETY: recv(2) writes at most one byte into `byte`, which lives
    // across the call; MSG_PEEK leaves the byte (if any) in the socket and
    // MSG_DONTWAIT never blocks the thread.
    let read = unsafe {
        libc::recv(
            stream.as_raw_fd(),
            std::ptr::addr_of_mut!(byte).cast(),
            1,
            libc::MSG_PEEK | libc::MSG_DONTWAIT,
        )
    };
    // -1 with EAGAIN: nothing to read, the connection is open. 0: the node
    // closed it; any other error: it is broken; a byte: an answer nobody
    // asked for.
    read < 0 && io::Error::last_os_error().kind() == io::ErrorKind::WouldBlock
}

/// The first address `addr` resolves to.
async fn resolve<A: ToSocketAddrs>(addr: A) -> Result<SocketAddr, Error> {
    lookup_host(addr)
        .await
        .and_then(|mut addrs| {
            addrs
                .next()
                .ok_or_else(|| io::Error::new(io::ErrorKind::AddrNotAvailable, "resolved to no address"))
        })
        .map_err(|source| Error::NotSent {
            addr: SocketAddr::from(([0, 0, 0, 0], 0)),
            source,
        })
}

/// Longest a connection attempt may take, by default.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// A new connection to `addr`, within `timeout`.
async fn open(addr: SocketAddr, timeout: Duration) -> io::Result<TcpStream> {
    let stream = tokio::time::timeout(timeout, TcpStream::connect(addr))
        .await
        .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, format!("no connection within {timeout:?}")))??;
    // Requests are small and each waits for its answer.
    let _ = stream.set_nodelay(true);
    Ok(stream)
}

/// How a client connects: with a token, with TLS.
#[derive(Clone, Default)]
pub struct ConnectOptions {
    /// Sent as `Authenticate` first on every connection (a node with
    /// `security.tokens_file`).
    pub token: Option<String>,
    /// TLS (a node with `security.tls_*`): the configuration, trusting the
    /// cluster's CA ([`crate::tls::client_config`]), and the name the
    /// node's certificate must hold.
    pub tls: Option<(Arc<rustls::ClientConfig>, ServerName<'static>)>,
}

impl ConnectOptions {
    /// TLS with the CA in `ca_file`, for a node whose certificate names
    /// `host` (an IP address or a DNS name).
    pub fn with_tls(mut self, ca_file: &std::path::Path, host: &str) -> Result<ConnectOptions, crate::tls::TlsError> {
        let config = crate::tls::client_config(ca_file)?;
        let name = crate::tls::server_name(host)?;
        self.tls = Some((config, name));
        Ok(self)
    }

    /// A bearer token sent on every connection.
    pub fn with_token(mut self, token: impl Into<String>) -> ConnectOptions {
        self.token = Some(token.into());
        self
    }
}

impl std::fmt::Debug for ConnectOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnectOptions")
            .field("token", &self.token.as_ref().map(|_| "…"))
            .field("tls", &self.tls.as_ref().map(|(_, name)| name))
            .finish()
    }
}

/// A connection to a node, over TCP or TLS.
enum Stream {
    Plain(TcpStream),
    Tls(Box<tokio_rustls::client::TlsStream<TcpStream>>),
}

impl Stream {
    fn tcp(&self) -> &TcpStream {
        match self {
            Stream::Plain(tcp) => tcp,
            Stream::Tls(tls) => tls.get_ref().0,
        }
    }

    fn into_halves(self) -> (ReadHalf, WriteHalf) {
        match self {
            Stream::Plain(tcp) => split_tcp(tcp),
            Stream::Tls(tls) => transport::split(*tls),
        }
    }
}

impl AsyncRead for Stream {
    fn poll_read(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(tcp) => std::pin::Pin::new(tcp).poll_read(cx, buf),
            Stream::Tls(tls) => std::pin::Pin::new(tls.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Stream {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Plain(tcp) => std::pin::Pin::new(tcp).poll_write(cx, buf),
            Stream::Tls(tls) => std::pin::Pin::new(tls.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(tcp) => std::pin::Pin::new(tcp).poll_flush(cx),
            Stream::Tls(tls) => std::pin::Pin::new(tls.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(tcp) => std::pin::Pin::new(tcp).poll_shutdown(cx),
            Stream::Tls(tls) => std::pin::Pin::new(tls.as_mut()).poll_shutdown(cx),
        }
    }
}

/// [`open`], its TLS handshake (with `options.tls`), then, with a token,
/// the connection's `Authenticate` (correlation id 0: the first frame of a
/// new connection).
async fn open_as(addr: SocketAddr, timeout: Duration, options: &ConnectOptions) -> Result<Stream, Error> {
    let tcp = open(addr, timeout)
        .await
        .map_err(|source| Error::NotSent { addr, source })?;
    let mut stream = match &options.tls {
        None => Stream::Plain(tcp),
        Some((config, name)) => {
            let connector = tokio_rustls::TlsConnector::from(config.clone());
            let tls = tokio::time::timeout(timeout, connector.connect(name.clone(), tcp))
                .await
                .map_err(|_| Error::NotSent {
                    addr,
                    source: io::Error::new(io::ErrorKind::TimedOut, "no TLS handshake in time"),
                })?
                .map_err(|source| Error::NotSent { addr, source })?;
            Stream::Tls(Box::new(tls))
        }
    };
    let Some(token) = &options.token else {
        return Ok(stream);
    };
    let request = ClientFrame {
        version: CLIENT_PROTOCOL_VERSION,
        correlation_id: 0,
        body: ClientRequest::Authenticate { token: token.clone() },
    };
    let mut frame = Vec::new();
    client::encode_frame_into(&request, &mut frame).map_err(|err| Error::NotSent {
        addr,
        source: io::Error::new(io::ErrorKind::InvalidInput, err),
    })?;
    stream
        .write_all(&frame)
        .await
        .map_err(|source| Error::NotSent { addr, source })?;
    let answer = match read_frame(&mut stream, MAX_ANSWER_BYTES).await {
        Ok(Some(answer)) => answer,
        Ok(None) => {
            return Err(Error::NoAnswer {
                addr,
                reason: "the node closed the connection".to_owned(),
            })
        }
        Err(err) => {
            return Err(Error::NoAnswer {
                addr,
                reason: err.to_string(),
            })
        }
    };
    match answer_to(&answer, 0).map_err(|reason| Error::Protocol { addr, reason })? {
        ClientResponse::Authenticated(_) => Ok(stream),
        ClientResponse::Error(refusal) => Err(Error::Node(refusal)),
        other => Err(Error::Protocol {
            addr,
            reason: format!("an answer of the wrong kind to Authenticate: {}", other.kind()),
        }),
    }
}

/// The answer that `frame` (without its length prefix) carries for the
/// request `correlation_id`, or why it is not one.
fn answer_to(frame: &[u8], correlation_id: u64) -> Result<ClientResponse, String> {
    let header =
        client::peek_header(frame).ok_or_else(|| format!("an answer of {} bytes has no header", frame.len()))?;
    if header.version != CLIENT_PROTOCOL_VERSION {
        return Err(format!(
            "an answer of protocol version {}, not {CLIENT_PROTOCOL_VERSION}",
            header.version
        ));
    }
    if header.correlation_id != correlation_id {
        return Err(format!(
            "the answer to request {} came for request {correlation_id}",
            header.correlation_id
        ));
    }
    client::decode_body(frame).map_err(|err| format!("the answer does not decode: {err}"))
}

/// One connection to a node's client listener.
pub struct Client {
    addr: SocketAddr,
    /// `None` until connected, and after a request failed on it.
    stream: Option<BufReader<Stream>>,
    /// When `stream` last brought an answer.
    answered_at: Instant,
    next_correlation_id: u64,
    frame: Vec<u8>,
    /// Its token and TLS, used on every connection this client opens.
    options: ConnectOptions,
}

impl Client {
    /// Connects to the client listener at `addr` (the first address it
    /// resolves to).
    pub async fn connect<A: ToSocketAddrs>(addr: A) -> Result<Client, Error> {
        Client::connect_with_options(addr, ConnectOptions::default()).await
    }

    /// [`Client::connect`] to a node with a tokens file: every connection
    /// the client opens authenticates with `token` first. A token the node
    /// does not list fails with [`ClientError::Unauthenticated`]; a read
    /// token's writes fail with [`ClientError::Forbidden`].
    pub async fn connect_with_token<A: ToSocketAddrs>(addr: A, token: impl Into<String>) -> Result<Client, Error> {
        Client::connect_with_options(addr, ConnectOptions::default().with_token(token)).await
    }

    /// [`Client::connect`] with a token, TLS or both ([`ConnectOptions`]).
    pub async fn connect_with_options<A: ToSocketAddrs>(addr: A, options: ConnectOptions) -> Result<Client, Error> {
        let addr = resolve(addr).await?;
        Ok(Client {
            addr,
            stream: Some(BufReader::new(open_as(addr, CONNECT_TIMEOUT, &options).await?)),
            answered_at: Instant::now(),
            // 0 is the connection's Authenticate.
            next_correlation_id: 0,
            frame: Vec::new(),
            options,
        })
    }

    /// The address this client sends to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Appends `records` as one batch of data records; resolves once they
    /// are committed, with where they landed. Sent to a follower, the batch
    /// is forwarded to the leader.
    pub async fn append(&mut self, records: Vec<Vec<u8>>) -> Result<Appended, Error> {
        let records = records.into_iter().map(ByteBuf::from).collect();
        match self.call(ClientRequest::Append { records }).await? {
            ClientResponse::Appended(appended) => Ok(appended),
            other => Err(self.unexpected(&other)),
        }
    }

    /// Committed records from offset `from` (at most `max`, and at most
    /// 10,000; a page holds a few MiB at most, but always at least one
    /// whole batch), each as the log holds it: a data
    /// record's bytes exactly as appended, control records
    /// (`LeaderChange`, `NoOp`) included so that offsets are contiguous.
    /// Offsets below the log start come from the node's newest snapshot;
    /// a page ends at the log start, ask again from there. Read from the
    /// node this client talks to.
    pub async fn read(&mut self, from: Offset, max: u32) -> Result<RecordPage, Error> {
        match self.call(ClientRequest::Read { from, max }).await? {
            ClientResponse::Records(page) => Ok(page),
            other => Err(self.unexpected(&other)),
        }
    }

    /// [`Client::read`] once the node has caught up with a read index from
    /// the leader: the page sees every append acknowledged before the
    /// call, by any node (a linearizable read). NotLeader or Unavailable
    /// when no read index came; nothing was done, ask again.
    pub async fn read_linearizable(&mut self, from: Offset, max: u32) -> Result<RecordPage, Error> {
        match self.call(ClientRequest::ReadLinearizable { from, max }).await? {
            ClientResponse::Records(page) => Ok(page),
            other => Err(self.unexpected(&other)),
        }
    }

    /// This node's view of the quorum, as `GET /v1/quorum` shows it.
    pub async fn quorum(&mut self) -> Result<QuorumStatus, Error> {
        match self.call(ClientRequest::Quorum).await? {
            ClientResponse::Quorum(status) => Ok(status),
            other => Err(self.unexpected(&other)),
        }
    }

    /// Runs a controller operation on a node whose `node.state_machine` is
    /// `"metadata"` (forwarded to the active controller); resolves once its
    /// records are committed and the node's image shows them. A refusal is
    /// [`Error::Node`] with [`ClientError::Controller`] (Kafka's error
    /// name in its `code()`).
    pub async fn operate(&mut self, operation: Operation) -> Result<OperationAnswer, Error> {
        match self.call(ClientRequest::Operate(operation)).await? {
            ClientResponse::Operated(answer) => Ok(answer),
            other => Err(self.unexpected(&other)),
        }
    }

    /// Sends one request and reads its answer. The connection is kept only
    /// if both went through, so that a request dropped half way (a timeout
    /// around it) never leaves a stale answer for the next one.
    async fn call(&mut self, body: ClientRequest) -> Result<ClientResponse, Error> {
        let mut stream = match self.stream.take() {
            Some(stream)
                if stream.buffer().is_empty()
                    && (self.answered_at.elapsed() < QUIET || still_open(stream.get_ref().tcp())) =>
            {
                stream
            }
            _ => BufReader::new(open_as(self.addr, CONNECT_TIMEOUT, &self.options).await?),
        };
        self.next_correlation_id = self.next_correlation_id.wrapping_add(1);
        let correlation_id = self.next_correlation_id;
        self.frame.clear();
        let request = ClientFrame {
            version: CLIENT_PROTOCOL_VERSION,
            correlation_id,
            body,
        };
        if let Err(err) = client::encode_frame_into(&request, &mut self.frame) {
            self.stream = Some(stream);
            return Err(Error::NotSent {
                addr: self.addr,
                source: io::Error::new(io::ErrorKind::InvalidInput, err),
            });
        }
        if let Err(source) = stream.get_mut().write_all(&self.frame).await {
            return Err(Error::NotSent {
                addr: self.addr,
                source,
            });
        }
        let addr = self.addr;
        let no_answer = |reason: String| Error::NoAnswer { addr, reason };
        let frame = match read_frame(&mut stream, MAX_ANSWER_BYTES).await {
            Ok(Some(frame)) => {
                self.answered_at = Instant::now();
                frame
            }
            Ok(None) => return Err(no_answer("the node closed the connection".to_owned())),
            Err(err) => return Err(no_answer(err.to_string())),
        };
        let answer = answer_to(&frame, correlation_id).map_err(|reason| Error::Protocol { addr, reason })?;
        if let ClientResponse::Error(refusal) = answer {
            // The node closes the connection after this one.
            if !matches!(refusal, ClientError::PayloadTooLarge(_)) {
                self.stream = Some(stream);
            }
            return Err(Error::Node(refusal));
        }
        self.stream = Some(stream);
        Ok(answer)
    }

    fn unexpected(&mut self, answer: &ClientResponse) -> Error {
        self.stream = None;
        Error::Protocol {
            addr: self.addr,
            reason: format!("an answer of the wrong kind: {}", answer.kind()),
        }
    }
}

/// Appends queued for a [`Producer`]'s connection, at most; past this,
/// [`Producer::append`] waits for room.
const PRODUCER_QUEUE: usize = 1024;
/// Room a producer's read buffer is given whenever it runs low.
const READ_BYTES: usize = 64 * 1024;
/// Largest output buffer a producer keeps once its frames are written.
const KEPT_OUTPUT_BYTES: usize = 1024 * 1024;

/// How a [`Producer`] waits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProducerOptions {
    /// Longest a connection attempt may take ([`CONNECT_TIMEOUT`], 10 s).
    pub connect_timeout: Duration,
    /// Longest the oldest append on a connection may wait for its answer
    /// (30 s by default, as Kafka's `request.timeout.ms`). Past it the
    /// node is taken for unreachable: the connection is closed, its appends
    /// fail as the connection's failure makes them fail, and the next
    /// append opens a new one. A node answers an append when it commits,
    /// or with an error when it cannot: within seconds while it runs.
    pub answer_timeout: Duration,
    /// Most bytes of appends waiting together that go out as one batch
    /// (256 KiB by default): each record counts with 12 bytes more, as a
    /// batch stores it, and an append larger than this goes alone. 0 sends
    /// every append alone. A node whose `log.max_batch_bytes` is smaller
    /// refuses such a batch (as too large, or `Rejected`); its appends are
    /// then sent again one by one, which is safe since the node wrote none
    /// of them, and the producer's batches stay below half the refused
    /// one's size from then on.
    pub max_batch_bytes: usize,
}

impl Default for ProducerOptions {
    fn default() -> Self {
        ProducerOptions {
            connect_timeout: CONNECT_TIMEOUT,
            answer_timeout: Duration::from_secs(30),
            max_batch_bytes: 256 * 1024,
        }
    }
}

/// Appends from any number of tasks over one connection, pipelined: an
/// append is written as soon as it is made, without waiting for the
/// answers of those before it, and up to [`MAX_IN_FLIGHT`] (the listener's
/// bound) wait for their answers at once. This is how one process gets
/// the quorum's throughput from a single connection; a [`Client`] waits
/// for each answer before it sends the next request.
///
/// Appends that wait together for the connection (made while earlier
/// ones were being written, or with [`MAX_IN_FLIGHT`] awaiting answers) go
/// out as one batch, up to [`ProducerOptions::max_batch_bytes`]: they
/// commit together or not at all, at consecutive offsets, and each caller
/// gets the offsets of its own records. A lone append goes out at once;
/// nothing waits for others to join it.
///
/// A producer is a handle (clone it for each task) to a task, spawned on
/// the tokio runtime that called [`Producer::connect`], which owns the
/// connection. Appends written over one connection to a leader are
/// proposed in the order they were made: of two appends made one after the
/// other (the second after the first's call began) that both commit on one
/// connection, the first has the lower offsets. An append that fails does
/// not stop those made after it. (One whose outcome is unknown after its
/// connection failed may still be taken by the node after appends sent on
/// the next connection, and one sent again after a refusal, see below,
/// lands after appends made later that were already on their way.) An append whose caller stopped waiting before it
/// was written is not sent.
///
/// When the connection fails, or the oldest append waits longer than
/// [`ProducerOptions::answer_timeout`], every append waiting for an answer
/// fails: with [`Error::NotSent`] if its frame was not wholly written (the
/// node cannot have taken it), else with [`Error::NoAnswer`] or
/// [`Error::Protocol`] (it may or may not commit). Nothing the node may
/// have taken is sent again. What it cannot have taken is: the appends
/// sent after a frame it refused as too large (it closes the connection
/// and reads nothing more), and the appends of a batch of several that it
/// refused as too large or `Rejected` (each is sent again alone; one that
/// is refused alone gets the node's error). The next append opens a new
/// connection; when that fails, it and every append queued behind it fail
/// [`Error::NotSent`]. The task ends once every handle is dropped and
/// every answer is in.
///
/// ```no_run
/// # async fn example() -> Result<(), kraft::client::Error> {
/// let producer = kraft::client::Producer::connect("127.0.0.1:9092").await?;
/// let appends = (0..100).map(|i| {
///     let producer = producer.clone();
///     async move { producer.append(vec![format!("record {i}").into_bytes()]).await }
/// });
/// for appended in futures::future::join_all(appends).await {
///     println!("committed at {}", appended?.base_offset);
/// }
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct Producer {
    addr: SocketAddr,
    jobs: mpsc::Sender<Job>,
}

/// One append on its way to a [`Producer`]'s connection.
struct Job {
    records: Vec<ByteBuf>,
    answer: Answer,
    /// It goes in a batch of its own: it was in a batch of several that the
    /// node refused (as too large, or `Rejected`).
    alone: bool,
    /// Its place in the order appends were taken from the queue: appends
    /// sent again go back in that order.
    seq: u64,
}

impl Producer {
    /// Connects to the client listener at `addr` (the first address it
    /// resolves to) and spawns the task that serves the connection on the
    /// current tokio runtime.
    pub async fn connect<A: ToSocketAddrs>(addr: A) -> Result<Producer, Error> {
        Producer::connect_with(addr, ProducerOptions::default()).await
    }

    /// [`Producer::connect`] with other timeouts.
    pub async fn connect_with<A: ToSocketAddrs>(addr: A, options: ProducerOptions) -> Result<Producer, Error> {
        Producer::connect_with_options(addr, options, ConnectOptions::default()).await
    }

    /// [`Producer::connect_with`] to a node with a tokens file: every
    /// connection authenticates with `token` first (as
    /// [`Client::connect_with_token`]).
    pub async fn connect_with_token<A: ToSocketAddrs>(
        addr: A,
        options: ProducerOptions,
        token: impl Into<String>,
    ) -> Result<Producer, Error> {
        Producer::connect_with_options(addr, options, ConnectOptions::default().with_token(token)).await
    }

    /// [`Producer::connect_with`] with a token, TLS or both
    /// ([`ConnectOptions`]), on every connection.
    pub async fn connect_with_options<A: ToSocketAddrs>(
        addr: A,
        options: ProducerOptions,
        connect: ConnectOptions,
    ) -> Result<Producer, Error> {
        let addr = resolve(addr).await?;
        let stream = open_as(addr, options.connect_timeout, &connect).await?;
        let (jobs, queue) = mpsc::channel(PRODUCER_QUEUE);
        let mut pipeline = Pipeline {
            addr,
            options,
            queue,
            front: VecDeque::new(),
            max_batch_bytes: options.max_batch_bytes,
            taken: 0,
            connection: Some(PipelinedConnection::new(stream)),
            connect,
        };
        tokio::spawn(async move { pipeline.run().await });
        Ok(Producer { addr, jobs })
    }

    /// The address this producer sends to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Appends `records` as one batch of data records; resolves once they
    /// are committed, as [`Client::append`] does.
    pub async fn append(&self, records: Vec<Vec<u8>>) -> Result<Appended, Error> {
        let (answer, answered) = oneshot::channel();
        let job = Job {
            records: records.into_iter().map(ByteBuf::from).collect(),
            answer,
            alone: false,
            seq: 0,
        };
        let ended = "the producer's connection task has ended";
        if self.jobs.send(job).await.is_err() {
            return Err(Error::NotSent {
                addr: self.addr,
                source: io::Error::other(ended),
            });
        }
        answered.await.unwrap_or_else(|_| {
            Err(Error::NoAnswer {
                addr: self.addr,
                reason: ended.to_owned(),
            })
        })
    }
}

/// The task behind a [`Producer`].
struct Pipeline {
    addr: SocketAddr,
    options: ProducerOptions,
    queue: mpsc::Receiver<Job>,
    /// Appends to send before anything still queued: one taken from the
    /// queue that did not fit in the last batch, and those of a refused
    /// batch or sent after it, which the node did not take.
    front: VecDeque<Job>,
    /// The largest batch to make now ([`ProducerOptions::max_batch_bytes`],
    /// lowered by refusals).
    max_batch_bytes: usize,
    /// Appends taken from the queue so far (the next one's `seq`).
    taken: u64,
    /// `None` from a failure until an append needs a connection again.
    connection: Option<PipelinedConnection>,
    /// Its token and TLS, used on every connection.
    connect: ConnectOptions,
}

impl Pipeline {
    async fn run(&mut self) {
        // Every handle is dropped: nothing more will be queued. (Then no
        // append waits for an answer either, since `append` borrows its
        // handle; what is still in flight is answered all the same.)
        let mut closed = false;
        let answer_timeout = self.options.answer_timeout;
        // When the oldest append awaiting its answer must have it, as
        // armed in `answer_deadline`.
        let mut armed: Option<Instant> = None;
        let answer_deadline = tokio::time::sleep(answer_timeout);
        tokio::pin!(answer_deadline);
        loop {
            let Some(connection) = self.connection.as_mut() else {
                let Some(job) = next_job(&mut self.front, &mut self.queue, &mut self.taken).await else {
                    return;
                };
                match open_as(self.addr, self.options.connect_timeout, &self.connect).await {
                    Ok(stream) => {
                        // The appends queued meanwhile join it in the
                        // next turn.
                        self.front.push_front(job);
                        self.connection = Some(PipelinedConnection::new(stream));
                    }
                    Err(err) => {
                        // The appends queued meanwhile would each wait for
                        // an attempt of their own.
                        let addr = self.addr;
                        let not_sent = || match &err {
                            Error::Node(refusal) => Error::Node(refusal.clone()),
                            Error::NotSent { source, .. } => Error::NotSent {
                                addr,
                                source: io::Error::new(source.kind(), source.to_string()),
                            },
                            other => Error::NotSent {
                                addr,
                                source: io::Error::other(other.to_string()),
                            },
                        };
                        let _ = job.answer.send(Err(not_sent()));
                        for job in self.front.drain(..) {
                            let _ = job.answer.send(Err(not_sent()));
                        }
                        while let Ok(job) = self.queue.try_recv() {
                            let _ = job.answer.send(Err(not_sent()));
                        }
                    }
                }
                continue;
            };
            if closed && connection.sent.is_empty() && self.front.is_empty() {
                return;
            }
            let deadline = connection.sent.front().map(|sent| sent.sent_at + answer_timeout);
            if let Some(at) = deadline.filter(|_| deadline != armed) {
                answer_deadline.as_mut().reset(at.into());
                armed = deadline;
            }
            if connection.input.capacity() - connection.input.len() < READ_BYTES / 4 {
                connection.input.reserve(READ_BYTES);
            }
            let room = connection.sent.len() < MAX_IN_FLIGHT;
            let unwritten = connection.written < connection.out.len();
            // Answers first: a close the node sent is seen before more is
            // written into the connection.
            let ended = tokio::select! {
                biased;
                read = connection.reader.read_buf(&mut connection.input) => match read {
                    // With nothing pending (the node closes a connection
                    // idle for long) this fails nothing; the next append
                    // opens a new connection.
                    Ok(0) => Some(Ended::Io("the node closed the connection".to_owned())),
                    Ok(_) => match connection.take_answers() {
                        Err(reason) => Some(Ended::Protocol(reason)),
                        // It closes the connection; nothing more sent on it counts.
                        Ok(()) if connection.refused => Some(Ended::Io("the node closed the connection".to_owned())),
                        Ok(()) => None,
                    },
                    Err(err) => Some(Ended::Io(format!("read failed: {err}"))),
                },
                () = &mut answer_deadline, if deadline.is_some() => {
                    Some(Ended::Io(format!("no answer within {answer_timeout:?}")))
                }
                written = connection.writer.write(&connection.out[connection.written..]), if unwritten => match written {
                    Ok(0) => Some(Ended::Io("the connection takes no more bytes".to_owned())),
                    Ok(n) => {
                        connection.wrote(n);
                        None
                    }
                    Err(err) => Some(Ended::Io(format!("write failed: {err}"))),
                },
                job = next_job(&mut self.front, &mut self.queue, &mut self.taken), if room && (!closed || !self.front.is_empty()) => {
                    let Some(job) = job else {
                        closed = true;
                        continue;
                    };
                    // Whatever else is queued goes out in the same write,
                    // in as few batches as fit.
                    let max_bytes = self.max_batch_bytes;
                    let mut batch = Batch::default();
                    let mut next = Some(job);
                    while let Some(job) = next.take() {
                        if let Err(job) = batch.add(job, max_bytes) {
                            if connection.sent.len() + 1 >= MAX_IN_FLIGHT {
                                self.front.push_front(job);
                                break;
                            }
                            connection.push(std::mem::take(&mut batch), self.addr);
                            let first = batch.add(job, max_bytes);
                            debug_assert!(first.is_ok(), "an empty batch takes any append");
                        }
                        next = match self.front.pop_front().map(Ok).unwrap_or_else(|| {
                            self.queue.try_recv().map(|job| numbered(job, &mut self.taken))
                        }) {
                            Ok(job) => Some(job),
                            Err(mpsc::error::TryRecvError::Empty) => None,
                            Err(mpsc::error::TryRecvError::Disconnected) => {
                                closed = true;
                                None
                            }
                        };
                    }
                    connection.push(batch, self.addr);
                    None
                }
            };
            let Some(connection) = self.connection.as_mut() else {
                continue;
            };
            if let Some(bytes) = connection.smaller_batches.take() {
                self.max_batch_bytes = self.max_batch_bytes.min(bytes);
            }
            let mut again = std::mem::take(&mut connection.again);
            if let Some(ended) = ended {
                if let Some(connection) = self.connection.take() {
                    again.extend(connection.fail(self.addr, ended));
                }
            }
            // In the order they were taken from the queue, among what waits
            // in `front` (sent again earlier, or taken after them).
            for job in again {
                let at = self.front.partition_point(|waiting| waiting.seq < job.seq);
                self.front.insert(at, job);
            }
        }
    }
}

/// The next append to send: the first in `front`, else the next queued.
/// Cancel-safe: an append is taken from `front` only by the poll that
/// returns it.
async fn next_job(front: &mut VecDeque<Job>, queue: &mut mpsc::Receiver<Job>, taken: &mut u64) -> Option<Job> {
    match front.pop_front() {
        Some(job) => Some(job),
        None => Some(numbered(queue.recv().await?, taken)),
    }
}

/// `job`, just taken from the queue, with its place in the order.
fn numbered(mut job: Job, taken: &mut u64) -> Job {
    job.seq = *taken;
    *taken += 1;
    job
}

/// Where the answer for an append's records goes.
type Answer = oneshot::Sender<Result<Appended, Error>>;

/// Appends that go out as one `Append` frame, their records one after the
/// other. Each keeps its records until answered, to be sent again alone
/// if the node refuses the batch.
#[derive(Default)]
struct Batch {
    jobs: Vec<Job>,
    /// Their bytes as a batch stores them.
    bytes: usize,
    /// It holds an append that goes alone: one without records (the node
    /// refuses it), or one from a refused batch.
    alone: bool,
}

impl Batch {
    /// Adds `job` if it fits in `max_bytes` (an empty batch takes any), or
    /// gives it back. An append whose caller stopped waiting is dropped.
    fn add(&mut self, job: Job, max_bytes: usize) -> Result<(), Job> {
        if job.answer.is_closed() {
            return Ok(());
        }
        let bytes: usize = job.records.iter().map(|r| Record::data_encoded_len(r.len())).sum();
        let alone = job.alone || job.records.is_empty();
        if !self.jobs.is_empty() && (self.alone || alone || self.bytes.saturating_add(bytes) > max_bytes) {
            return Err(job);
        }
        self.bytes = self.bytes.saturating_add(bytes);
        self.alone |= alone;
        self.jobs.push(job);
        Ok(())
    }
}

/// The body of a batch's frame: `ClientRequest::Append` of its appends'
/// records one after the other, encoded in place (the same bytes as that
/// request built from them; see the test).
struct AppendOf<'a>(&'a [Job]);

impl Serialize for AppendOf<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStructVariant;
        let mut append = serializer.serialize_struct_variant("ClientRequest", 0, "Append", 1)?;
        append.serialize_field("records", &RecordsOf(self.0))?;
        append.end()
    }
}

struct RecordsOf<'a>(&'a [Job]);

impl Serialize for RecordsOf<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeSeq;
        let records = self.0.iter().flat_map(|job| &job.records);
        let mut seq = serializer.serialize_seq(Some(records.clone().count()))?;
        for record in records {
            seq.serialize_element(record)?;
        }
        seq.end()
    }
}

/// A batch whose frame went into the connection's output.
struct Sent {
    correlation_id: u64,
    /// Where its frame ends in the connection's byte stream: the node has
    /// all of it once that many bytes are written.
    ends_at: u64,
    /// When it went into the output.
    sent_at: Instant,
    /// Its bytes as a batch stores them.
    bytes: usize,
    jobs: Vec<Job>,
}

struct PipelinedConnection {
    reader: ReadHalf,
    writer: WriteHalf,
    /// Frames to write; `out[..written]` are written.
    out: Vec<u8>,
    written: usize,
    /// Bytes written over the connection's life.
    stream_written: u64,
    /// Bytes read and not yet taken as answers.
    input: Vec<u8>,
    /// Appends awaiting their answers, in the order they were sent (the
    /// order the node answers in).
    sent: VecDeque<Sent>,
    /// The node refused a frame as too large: it closes the connection
    /// and takes nothing sent after that frame.
    refused: bool,
    /// Appends of batches the node refused, to send again one by one.
    again: Vec<Job>,
    /// Half the smallest refused batch's size: batches must not exceed it.
    smaller_batches: Option<usize>,
    /// The largest batch the node took on this connection: a batch no
    /// larger that is `Rejected` was not refused for its size (the log is
    /// full).
    largest_taken: usize,
    next_correlation_id: u64,
}

/// Whether `appended` covers exactly the records of `jobs` (one batch's
/// appends), so that it can be split among them.
fn split(appended: Appended, jobs: &[Job]) -> Result<(), String> {
    let records: usize = jobs.iter().map(|job| job.records.len()).sum();
    let covered = appended
        .last_offset
        .checked_sub(appended.base_offset)
        .and_then(|span| span.checked_add(1));
    if covered == i64::try_from(records).ok() {
        Ok(())
    } else {
        Err(format!(
            "an answer for offsets {}..={} to an append of {records} records",
            appended.base_offset, appended.last_offset
        ))
    }
}

/// Why a producer's connection ended.
enum Ended {
    Io(String),
    /// The node sent what the protocol does not allow.
    Protocol(String),
}

impl Ended {
    fn reason(&self) -> &str {
        match self {
            Ended::Io(reason) | Ended::Protocol(reason) => reason,
        }
    }
}

impl PipelinedConnection {
    fn new(stream: Stream) -> PipelinedConnection {
        let (reader, writer) = stream.into_halves();
        PipelinedConnection {
            reader,
            writer,
            out: Vec::new(),
            written: 0,
            stream_written: 0,
            input: Vec::new(),
            sent: VecDeque::new(),
            refused: false,
            again: Vec::new(),
            smaller_batches: None,
            largest_taken: 0,
            next_correlation_id: 0,
        }
    }

    /// Writes `batch`'s frame into the output, to go out with the rest.
    fn push(&mut self, batch: Batch, addr: SocketAddr) {
        if batch.jobs.is_empty() {
            return;
        }
        self.next_correlation_id = self.next_correlation_id.wrapping_add(1);
        let correlation_id = self.next_correlation_id;
        let request = ClientFrame {
            version: CLIENT_PROTOCOL_VERSION,
            correlation_id,
            body: AppendOf(&batch.jobs),
        };
        if let Err(err) = client::encode_frame_into(&request, &mut self.out) {
            for job in batch.jobs {
                let source = io::Error::new(io::ErrorKind::InvalidInput, err.to_string());
                let _ = job.answer.send(Err(Error::NotSent { addr, source }));
            }
            return;
        }
        self.sent.push_back(Sent {
            correlation_id,
            ends_at: self.stream_written + (self.out.len() - self.written) as u64,
            sent_at: Instant::now(),
            bytes: batch.bytes,
            jobs: batch.jobs,
        });
    }

    /// Takes `n` more bytes as written. The output keeps only what is not
    /// written yet (at most [`MAX_IN_FLIGHT`] frames) and as much again.
    fn wrote(&mut self, n: usize) {
        self.written += n;
        self.stream_written += n as u64;
        if self.written == self.out.len() {
            self.out.clear();
            self.written = 0;
            if self.out.capacity() > KEPT_OUTPUT_BYTES {
                self.out = Vec::new();
            }
        } else if self.written > self.out.len() / 2 {
            self.out.drain(..self.written);
            self.written = 0;
        }
    }

    /// Ends the connection. After a frame refused as too large, the node
    /// took nothing sent after it: those appends are given back, to be
    /// sent again. Otherwise every append awaiting its answer fails, as
    /// not sent when the node cannot have taken it, else with the outcome
    /// unknown.
    fn fail(self, addr: SocketAddr, ended: Ended) -> Vec<Job> {
        let written = self.stream_written;
        let jobs = self.sent.into_iter().flat_map(|sent| {
            let Sent { ends_at, jobs, .. } = sent;
            jobs.into_iter().map(move |job| (ends_at, job))
        });
        // After a refusal as too large the node took nothing more, unless
        // it answered again (a protocol error): then nothing is sent again.
        if self.refused && !matches!(ended, Ended::Protocol(_)) {
            return jobs.map(|(_, job)| job).collect();
        }
        for (ends_at, job) in jobs {
            let error = if ends_at > written {
                Error::NotSent {
                    addr,
                    source: io::Error::new(
                        io::ErrorKind::ConnectionAborted,
                        format!("{} before the whole request was written", ended.reason()),
                    ),
                }
            } else {
                match &ended {
                    Ended::Io(reason) => Error::NoAnswer {
                        addr,
                        reason: reason.clone(),
                    },
                    Ended::Protocol(reason) => Error::Protocol {
                        addr,
                        reason: reason.clone(),
                    },
                }
            };
            let _ = job.answer.send(Err(error));
        }
        Vec::new()
    }

    /// Hands out the answers that `input` holds whole. An answer that does
    /// not belong to the oldest append awaiting one, or does not decode,
    /// is an error: the connection is no longer usable.
    fn take_answers(&mut self) -> Result<(), String> {
        let mut consumed = 0;
        loop {
            let buffered = &self.input[consumed..];
            let Some(prefix) = buffered.get(..4) else { break };
            let len = u32::from_be_bytes(prefix.try_into().expect("four bytes")) as u64;
            if len > MAX_ANSWER_BYTES {
                return Err(format!(
                    "an answer of {len} bytes, over the limit of {MAX_ANSWER_BYTES}"
                ));
            }
            let Some(frame) = buffered.get(4..4 + len as usize) else {
                break;
            };
            if self.refused {
                // The node reads nothing after a frame it refuses as too
                // large; an answer now may be for records it wrote, which
                // must not be sent again.
                return Err("an answer after a refusal as too large".to_owned());
            }
            let Some(sent) = self.sent.pop_front() else {
                return Err("an answer to no request".to_owned());
            };
            match answer_to(frame, sent.correlation_id) {
                Ok(ClientResponse::Appended(appended)) => {
                    if let Err(reason) = split(appended, &sent.jobs) {
                        self.sent.push_front(sent);
                        return Err(reason);
                    }
                    self.largest_taken = self.largest_taken.max(sent.bytes);
                    let mut base_offset = appended.base_offset;
                    for job in sent.jobs {
                        let last_offset = base_offset + job.records.len() as i64 - 1;
                        let _ = job.answer.send(Ok(Appended {
                            base_offset,
                            last_offset,
                            epoch: appended.epoch,
                        }));
                        base_offset = last_offset + 1;
                    }
                }
                Ok(ClientResponse::Error(refusal)) => {
                    self.refused |= matches!(refusal, ClientError::PayloadTooLarge(_));
                    let too_large = matches!(refusal, ClientError::PayloadTooLarge(_) | ClientError::Rejected(_));
                    if too_large && sent.jobs.len() > 1 {
                        // The node wrote none of it, and may take each
                        // append alone (a full log refuses them again).
                        let for_its_size =
                            matches!(refusal, ClientError::PayloadTooLarge(_)) || sent.bytes > self.largest_taken;
                        if for_its_size {
                            let half = sent.bytes / 2;
                            self.smaller_batches = Some(self.smaller_batches.map_or(half, |bytes| bytes.min(half)));
                        }
                        self.again
                            .extend(sent.jobs.into_iter().map(|job| Job { alone: true, ..job }));
                    } else {
                        for job in sent.jobs {
                            let _ = job.answer.send(Err(Error::Node(refusal.clone())));
                        }
                    }
                }
                Ok(other) => {
                    self.sent.push_front(sent);
                    return Err(format!("an answer of the wrong kind: {}", other.kind()));
                }
                Err(reason) => {
                    self.sent.push_front(sent);
                    return Err(reason);
                }
            }
            consumed += 4 + len as usize;
        }
        self.input.drain(..consumed);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_is_encoded_as_an_append_of_all_its_records() {
        let jobs: Vec<Job> = [vec!["a", "bc"], vec![], vec!["def"]]
            .into_iter()
            .map(|records| Job {
                records: records
                    .into_iter()
                    .map(|r| ByteBuf::from(r.as_bytes().to_vec()))
                    .collect(),
                answer: oneshot::channel().0,
                alone: false,
                seq: 0,
            })
            .collect();
        fn frame<B>(body: B) -> ClientFrame<B> {
            ClientFrame {
                version: CLIENT_PROTOCOL_VERSION,
                correlation_id: 7,
                body,
            }
        }
        let (mut in_place, mut built) = (Vec::new(), Vec::new());
        client::encode_frame_into(&frame(AppendOf(&jobs)), &mut in_place).unwrap();
        let records = jobs.iter().flat_map(|job| job.records.clone()).collect();
        client::encode_frame_into(&frame(ClientRequest::Append { records }), &mut built).unwrap();
        assert_eq!(in_place, built);
    }

    fn batch_of(job: Job) -> Batch {
        let mut batch = Batch::default();
        assert!(batch.add(job, 0).is_ok());
        batch
    }

    #[tokio::test]
    async fn a_producers_output_keeps_only_what_is_not_written_yet() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let mut connection = PipelinedConnection::new(Stream::Plain(TcpStream::connect(addr).await.unwrap()));
        let mut answers = Vec::new();
        for _ in 0..3 {
            let (answer, answered) = oneshot::channel();
            answers.push(answered);
            let records = vec![ByteBuf::from(vec![0u8; 1000])];
            connection.push(
                batch_of(Job {
                    records,
                    answer,
                    alone: false,
                    seq: 0,
                }),
                addr,
            );
        }
        let frame = connection.out.len() / 3;
        assert_eq!(connection.sent[2].ends_at, 3 * frame as u64);
        // Two frames of three written: only the third is kept.
        connection.wrote(2 * frame);
        assert_eq!((connection.out.len(), connection.written), (frame, 0));
        assert_eq!(connection.stream_written, 2 * frame as u64);
        // Less than half of what is kept written: nothing moves.
        connection.wrote(frame / 4);
        assert_eq!((connection.out.len(), connection.written), (frame, frame / 4));
        connection.wrote(frame - frame / 4);
        assert_eq!((connection.out.len(), connection.written), (0, 0));
        assert_eq!(connection.stream_written, 3 * frame as u64);
    }

    #[tokio::test]
    async fn an_append_whose_caller_stopped_waiting_is_not_sent() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let mut connection = PipelinedConnection::new(Stream::Plain(TcpStream::connect(addr).await.unwrap()));
        let (answer, answered) = oneshot::channel();
        drop(answered);
        connection.push(
            batch_of(Job {
                records: vec![ByteBuf::from(b"x".to_vec())],
                answer,
                alone: false,
                seq: 0,
            }),
            addr,
        );
        assert!(connection.out.is_empty() && connection.sent.is_empty());
    }
}
