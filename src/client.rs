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
//! A [`Client`] sends one request at a time and waits for its answer; for
//! requests in parallel, open one client per task (each is one
//! connection). It works on any tokio runtime. A connection that failed is
//! opened again by the next request.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use serde_bytes::ByteBuf;
use tokio::io::{AsyncWriteExt, BufReader};
use tokio::net::{lookup_host, TcpStream, ToSocketAddrs};

use crate::actors::transport::read_frame;
use crate::messages::client::{self, ClientFrame, ClientRequest, ClientResponse, CLIENT_PROTOCOL_VERSION};
use crate::node::{Appended, QuorumStatus, RecordPage};
use crate::raft::Offset;

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
    NotSent { addr: SocketAddr, source: std::io::Error },
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
    read < 0 && std::io::Error::last_os_error().kind() == std::io::ErrorKind::WouldBlock
}

/// One connection to a node's client listener.
pub struct Client {
    addr: SocketAddr,
    /// `None` until connected, and after a request failed on it.
    stream: Option<BufReader<TcpStream>>,
    /// When `stream` last brought an answer.
    answered_at: Instant,
    next_correlation_id: u64,
    frame: Vec<u8>,
}

impl Client {
    /// Connects to the client listener at `addr` (the first address it
    /// resolves to).
    pub async fn connect<A: ToSocketAddrs>(addr: A) -> Result<Client, Error> {
        let resolved = lookup_host(addr).await;
        let addr = resolved
            .and_then(|mut addrs| {
                addrs
                    .next()
                    .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::AddrNotAvailable, "resolved to no address"))
            })
            .map_err(|source| Error::NotSent {
                addr: SocketAddr::from(([0, 0, 0, 0], 0)),
                source,
            })?;
        let mut client = Client {
            addr,
            stream: None,
            answered_at: Instant::now(),
            next_correlation_id: 0,
            frame: Vec::new(),
        };
        client.stream = Some(client.open().await?);
        Ok(client)
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

    /// This node's view of the quorum, as `GET /v1/quorum` shows it.
    pub async fn quorum(&mut self) -> Result<QuorumStatus, Error> {
        match self.call(ClientRequest::Quorum).await? {
            ClientResponse::Quorum(status) => Ok(status),
            other => Err(self.unexpected(&other)),
        }
    }

    async fn open(&self) -> Result<BufReader<TcpStream>, Error> {
        let stream = TcpStream::connect(self.addr).await.map_err(|source| Error::NotSent {
            addr: self.addr,
            source,
        })?;
        // Requests are small and each waits for its answer.
        let _ = stream.set_nodelay(true);
        Ok(BufReader::new(stream))
    }

    /// Sends one request and reads its answer. The connection is kept only
    /// if both went through, so that a request dropped half way (a timeout
    /// around it) never leaves a stale answer for the next one.
    async fn call(&mut self, body: ClientRequest) -> Result<ClientResponse, Error> {
        let mut stream = match self.stream.take() {
            Some(stream)
                if stream.buffer().is_empty()
                    && (self.answered_at.elapsed() < QUIET || still_open(stream.get_ref())) =>
            {
                stream
            }
            _ => self.open().await?,
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
                source: std::io::Error::new(std::io::ErrorKind::InvalidInput, err),
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
        let protocol = |reason: String| Error::Protocol { addr, reason };
        let header = client::peek_header(&frame)
            .ok_or_else(|| protocol(format!("an answer of {} bytes has no header", frame.len())))?;
        if header.version != CLIENT_PROTOCOL_VERSION {
            return Err(protocol(format!(
                "an answer of protocol version {}, not {CLIENT_PROTOCOL_VERSION}",
                header.version
            )));
        }
        if header.correlation_id != correlation_id {
            return Err(protocol(format!(
                "the answer to request {} came for request {correlation_id}",
                header.correlation_id
            )));
        }
        let answer: ClientResponse =
            client::decode_body(&frame).map_err(|err| protocol(format!("the answer does not decode: {err}")))?;
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
