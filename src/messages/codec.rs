//! The wire format (DESIGN.md §5): one frame = u32 big-endian length +
//! bincode (1.3.3, fixint, explicit byte limit) of an [`Envelope`].

use bincode::Options;
use serde::{de::DeserializeOwned, Deserialize, Serialize};

use super::rpc::{RaftRequest, RaftResponse};
use crate::raft::NodeId;

/// Wire format version carried in every envelope.
pub const WIRE_VERSION: u16 = 1;

#[derive(Debug, thiserror::Error)]
pub enum CodecError {
    #[error("frame of {len} bytes exceeds the limit of {limit} bytes")]
    FrameTooLarge { len: u64, limit: u64 },
    #[error("undecodable bytes: {0}")]
    Decode(String),
    #[error("invalid content: {0}")]
    Invalid(String),
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Body {
    Request(RaftRequest),
    Response(RaftResponse),
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Envelope {
    pub version: u16,
    /// Node id of the sender (a client tool may use -1).
    pub source_id: NodeId,
    pub correlation_id: u64,
    pub cluster_id: String,
    pub body: Body,
}

fn options(limit: u64) -> impl Options {
    bincode::DefaultOptions::new()
        .with_fixint_encoding()
        .with_big_endian()
        .with_limit(limit)
        .reject_trailing_bytes()
}

/// Decodes untrusted bytes with fixint encoding and a byte limit; never panics.
pub fn decode_bounded<T: DeserializeOwned>(bytes: &[u8], limit: u64) -> Result<T, CodecError> {
    if bytes.len() as u64 > limit {
        return Err(CodecError::FrameTooLarge {
            len: bytes.len() as u64,
            limit,
        });
    }
    options(limit)
        .deserialize(bytes)
        .map_err(|e| CodecError::Decode(e.to_string()))
}

/// Encodes a value in the same format `decode_bounded` reads.
pub fn encode<T: Serialize>(value: &T) -> Vec<u8> {
    options(u64::MAX)
        .serialize(value)
        .expect("in-memory values always encode")
}

/// Encodes an envelope as one frame: length prefix + body.
pub fn encode_frame(envelope: &Envelope) -> Vec<u8> {
    let body = encode(envelope);
    let mut frame = Vec::with_capacity(4 + body.len());
    frame.extend_from_slice(&(body.len() as u32).to_be_bytes());
    frame.extend_from_slice(&body);
    frame
}

/// Decodes the bytes of one frame (after its length prefix).
pub fn decode_frame(body: &[u8], max_frame_bytes: u64) -> Result<Envelope, CodecError> {
    decode_bounded(body, max_frame_bytes)
}
