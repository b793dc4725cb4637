//! The client protocol: what a client and the client listener
//! (`listeners.client`) exchange.
//!
//! Framed like the raft listener's traffic: a u32 big-endian length, then
//! bincode 1.3.3 (fixint, big-endian) of a [`ClientFrame`]. A frame starts
//! with the protocol version and the request's correlation id (10 bytes),
//! so a server can answer a frame of another version, or one that does not
//! decode, with the id its client is waiting for.
//!
//! A client may send several requests without waiting; they are answered
//! in the order they were sent, each with its own correlation id.

use serde::{Deserialize, Serialize};
use serde_bytes::ByteBuf;

use super::codec::{self, CodecError};
use super::controller::{Operation, OperationAnswer};
use super::records::RecordPage;
use crate::metadata::controller::ControllerError;
use crate::types::{AppendError, Appended, NodeId, Offset, QuorumStatus};

/// The version of the client protocol, first in every frame.
pub const CLIENT_PROTOCOL_VERSION: u16 = 1;

/// Bytes of a frame before its body: the version and the correlation id.
pub const CLIENT_HEADER_BYTES: usize = 2 + 8;

/// One request or answer and its header.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClientFrame<B> {
    pub version: u16,
    /// Chosen by the client; its answer carries the same one.
    pub correlation_id: u64,
    pub body: B,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ClientRequest {
    /// Appends the records as one batch of data records; answered
    /// [`ClientResponse::Appended`] once they are committed. Sent to a
    /// follower, the batch is forwarded to the leader.
    Append { records: Vec<ByteBuf> },
    /// This node's view of the quorum: [`ClientResponse::Quorum`].
    Quorum,
    /// Committed records from offset `from` (>= 0), at most `max` of them
    /// (and at most 10,000; a page holds a few MiB at most, but always at
    /// least one whole batch), as `GET /v1/log` reads them but with each
    /// record as the log holds it: [`ClientResponse::Records`]. `max` 0
    /// gives an empty page. Read from this node: a follower's high
    /// watermark may trail the leader's. A connection has at most two
    /// reads in flight; requests after a third wait behind it.
    Read { from: Offset, max: u32 },
    /// A controller operation, on a node whose `node.state_machine` is
    /// `"metadata"`: as `NodeHandle::operate` runs it, forwarded to the
    /// active controller and answered [`ClientResponse::Operated`] once its
    /// records are committed and this node's image shows them; refused
    /// [`ClientError::Controller`] with Kafka's error name.
    /// [`Operation::FenceExpired`] is the controller's own: BadRequest.
    Operate(Operation),
    /// [`ClientRequest::Read`] once this node has caught up with a read
    /// index from the leader (`NodeHandle::read_barrier`): the page sees
    /// every append acknowledged before the request, by any node.
    ReadLinearizable { from: Offset, max: u32 },
    /// A bearer token from the node's tokens file (`security.tokens_file`):
    /// answered [`ClientResponse::Authenticated`] with its scope, which
    /// holds for the rest of the connection; an unknown token is
    /// [`ClientError::Unauthenticated`]. On a node with tokens, every
    /// request before it is refused so. On a node without, any token is
    /// answered `Admin`.
    Authenticate { token: String },
}

/// What a connection's token allows (`security.tokens_file`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Scope {
    /// Reads: `Read`, `ReadLinearizable`, `Quorum`; every HTTP `GET`.
    Read,
    /// Reads and writes: also `Append`, `Operate`; every other HTTP method.
    Admin,
}

impl ClientRequest {
    /// What the request needs of a connection's token.
    pub fn needs(&self) -> Scope {
        match self {
            ClientRequest::Append { .. } | ClientRequest::Operate(_) => Scope::Admin,
            ClientRequest::Quorum
            | ClientRequest::Read { .. }
            | ClientRequest::ReadLinearizable { .. }
            | ClientRequest::Authenticate { .. } => Scope::Read,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ClientResponse {
    Appended(Appended),
    Quorum(QuorumStatus),
    Error(ClientError),
    Records(RecordPage),
    Operated(OperationAnswer),
    Authenticated(Scope),
}

/// Why a request was not done; the same cases, and the same codes, as
/// the HTTP API's errors.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum ClientError {
    /// The frame does not decode, is of another protocol version, or asks
    /// for something invalid (no records). Nothing was written.
    #[error("bad request: {0}")]
    BadRequest(String),
    /// The frame is larger than the listener takes; the connection is
    /// closed after this answer. Nothing was written.
    #[error("payload too large: {0}")]
    PayloadTooLarge(String),
    /// No leader is known, or it could not be reached. Nothing was written.
    #[error("not the leader; leader is {leader_id:?}")]
    NotLeader {
        leader_id: Option<NodeId>,
        /// The leader's raft listener (`host:port`), when known.
        leader_endpoint: Option<String>,
    },
    /// Leadership was lost after the records were handed over: they may or
    /// may not commit. Never retried behind the caller's back.
    #[error("outcome unknown: {0}")]
    OutcomeUnknown(String),
    /// The node refused the records (more than a batch holds, or the log
    /// is full). Nothing was written.
    #[error("rejected: {0}")]
    Rejected(String),
    /// The node is shutting down or overloaded. Nothing was written.
    #[error("unavailable: {0}")]
    Unavailable(String),
    /// The node does not do that in its mode: raw appends to a node whose
    /// log holds metadata records. Nothing was written.
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// The controller refused the operation (its [`ControllerError::code`]
    /// is Kafka's error name), or its outcome is unknown
    /// (`OUTCOME_UNKNOWN`: it may still commit).
    #[error(transparent)]
    Controller(ControllerError),
    /// No token came, or one the node does not list (HTTP 401). Nothing
    /// was done.
    #[error("unauthenticated: {0}")]
    Unauthenticated(String),
    /// The token's scope does not allow the request: a read token on a
    /// write (HTTP 403). Nothing was done.
    #[error("not authorized: {0}")]
    Forbidden(String),
}

impl ClientResponse {
    /// The answer's kind, for messages (a page of records is too long to
    /// print whole).
    pub fn kind(&self) -> &'static str {
        match self {
            ClientResponse::Appended(_) => "Appended",
            ClientResponse::Quorum(_) => "Quorum",
            ClientResponse::Error(_) => "Error",
            ClientResponse::Records(_) => "Records",
            ClientResponse::Operated(_) => "Operated",
            ClientResponse::Authenticated(_) => "Authenticated",
        }
    }
}

impl ClientError {
    /// The stable code, as the HTTP API's `error` field spells it.
    pub fn code(&self) -> &'static str {
        match self {
            ClientError::BadRequest(_) => "BAD_REQUEST",
            ClientError::PayloadTooLarge(_) => "PAYLOAD_TOO_LARGE",
            ClientError::NotLeader { .. } => "NOT_LEADER",
            ClientError::OutcomeUnknown(_) => "OUTCOME_UNKNOWN",
            ClientError::Rejected(_) => "REJECTED",
            ClientError::Unavailable(_) => "UNAVAILABLE",
            ClientError::Unsupported(_) => "UNSUPPORTED",
            ClientError::Controller(err) => err.code(),
            ClientError::Unauthenticated(_) => "UNAUTHENTICATED",
            ClientError::Forbidden(_) => "CLUSTER_AUTHORIZATION_FAILED",
        }
    }
}

impl From<AppendError> for ClientError {
    fn from(err: AppendError) -> Self {
        match err {
            AppendError::NotLeader {
                leader_id,
                leader_endpoint,
            } => ClientError::NotLeader {
                leader_id,
                leader_endpoint,
            },
            AppendError::OutcomeUnknown(message) => ClientError::OutcomeUnknown(message),
            AppendError::Rejected(message) => ClientError::Rejected(message),
            AppendError::Unavailable(message) => ClientError::Unavailable(message),
            AppendError::Unsupported(message) => ClientError::Unsupported(message),
        }
    }
}

/// A frame's header, read before its body.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClientHeader {
    pub version: u16,
    pub correlation_id: u64,
}

/// The header at the start of a frame body (the bytes after the length
/// prefix), if that many bytes are there.
pub fn peek_header(frame: &[u8]) -> Option<ClientHeader> {
    let version = u16::from_be_bytes(frame.get(..2)?.try_into().ok()?);
    let correlation_id = u64::from_be_bytes(frame.get(2..CLIENT_HEADER_BYTES)?.try_into().ok()?);
    Some(ClientHeader {
        version,
        correlation_id,
    })
}

/// Decodes the body of a frame whose header was read with
/// [`peek_header`]. Never panics on untrusted bytes.
pub fn decode_body<B: serde::de::DeserializeOwned>(frame: &[u8]) -> Result<B, CodecError> {
    let body = frame
        .get(CLIENT_HEADER_BYTES..)
        .ok_or_else(|| CodecError::Decode(format!("a frame of {} bytes has no header", frame.len())))?;
    codec::decode_bounded(body, body.len() as u64)
}

/// Appends `frame`, length prefix first, to `out`
/// ([`codec::encode_frame_into`]: a body over `u32::MAX` bytes is an
/// error and leaves `out` as it was).
pub fn encode_frame_into<B: Serialize>(frame: &ClientFrame<B>, out: &mut Vec<u8>) -> Result<(), CodecError> {
    codec::encode_frame_into(frame, out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_frame_round_trips_and_its_header_is_readable_before_its_body() {
        let request = ClientFrame {
            version: CLIENT_PROTOCOL_VERSION,
            correlation_id: 0x0102_0304_0506_0708,
            body: ClientRequest::Append {
                records: vec![ByteBuf::from(b"a".to_vec()), ByteBuf::from(Vec::new())],
            },
        };
        let mut out = vec![9, 9];
        encode_frame_into(&request, &mut out).unwrap();
        assert_eq!(&out[..2], &[9, 9], "what was in the buffer stays");
        let len = u32::from_be_bytes(out[2..6].try_into().unwrap()) as usize;
        let frame = &out[6..];
        assert_eq!(frame.len(), len);
        assert_eq!(
            peek_header(frame),
            Some(ClientHeader {
                version: CLIENT_PROTOCOL_VERSION,
                correlation_id: 0x0102_0304_0506_0708
            })
        );
        assert_eq!(decode_body::<ClientRequest>(frame).unwrap(), request.body);
    }

    #[test]
    fn short_or_garbled_frames_are_errors_not_panics() {
        assert_eq!(peek_header(&[0, 1, 2]), None);
        assert!(decode_body::<ClientRequest>(&[0; 5]).is_err());
        // A header, then a variant that does not exist.
        let mut frame = vec![0, 1, 0, 0, 0, 0, 0, 0, 0, 7];
        frame.extend_from_slice(&[0, 0, 0, 9]);
        assert!(decode_body::<ClientRequest>(&frame).is_err());
        // A record that claims more bytes than the frame holds.
        let mut frame = vec![0, 1, 0, 0, 0, 0, 0, 0, 0, 7];
        frame.extend_from_slice(&0u32.to_be_bytes()); // Append
        frame.extend_from_slice(&1u64.to_be_bytes()); // one record
        frame.extend_from_slice(&u64::MAX.to_be_bytes()); // of 2^64-1 bytes
        assert!(decode_body::<ClientRequest>(&frame).is_err());
    }
}
