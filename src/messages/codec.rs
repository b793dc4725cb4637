//! The wire format (docs/ARCHITECTURE.md, "Wire format"): one frame = u32 big-endian length +
//! bincode (1.3.3, fixint, explicit byte limit) of an [`Envelope`].

use bincode::Options;
use serde::{de::DeserializeOwned, Deserialize, Serialize};

use super::rpc::{RaftRequest, RaftResponse};
use crate::types::NodeId;

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

/// [`decode_bounded`] into a value that may borrow from `bytes`.
pub fn decode_borrowed<'a, T: Deserialize<'a>>(bytes: &'a [u8], limit: u64) -> Result<T, CodecError> {
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

/// Appends `value` to `out` as one frame: a u32 big-endian length, then
/// its encoding (as [`encode`]), written in place. A body of more than
/// `u32::MAX` bytes cannot be framed: `out` is left as it was and the
/// error says so. The raft listener's frames and the client protocol's
/// are both made here.
pub fn encode_frame_into<T: Serialize>(value: &T, out: &mut Vec<u8>) -> Result<(), CodecError> {
    let prefix_at = out.len();
    out.extend_from_slice(&[0; 4]);
    options(u64::MAX)
        .serialize_into(&mut *out, value)
        .expect("in-memory values always encode");
    let body = out.len() - prefix_at - 4;
    let Ok(len) = u32::try_from(body) else {
        out.truncate(prefix_at);
        return Err(CodecError::FrameTooLarge {
            len: body as u64,
            limit: u64::from(u32::MAX),
        });
    };
    out[prefix_at..prefix_at + 4].copy_from_slice(&len.to_be_bytes());
    Ok(())
}

/// Encodes an envelope as one frame: length prefix + body.
///
/// The body is encoded in place after the prefix (its size is computed
/// first), not encoded and then copied: a fetch answer is up to 8 MiB.
pub fn encode_frame(envelope: &Envelope) -> Vec<u8> {
    let len = options(u64::MAX)
        .serialized_size(envelope)
        .expect("in-memory values always encode");
    let mut frame = Vec::with_capacity(4 + len as usize);
    encode_frame_into(envelope, &mut frame).expect("an envelope holds at most a few batches of 8 MiB");
    frame
}

/// Decodes the bytes of one frame (after its length prefix).
pub fn decode_frame(body: &[u8], max_frame_bytes: u64) -> Result<Envelope, CodecError> {
    decode_bounded(body, max_frame_bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::messages::rpc::FetchResponse;
    use crate::messages::{Batch, ErrorCode, Record};

    #[test]
    fn a_frame_is_the_length_of_its_body_then_the_body() {
        let envelope = Envelope {
            version: WIRE_VERSION,
            source_id: 2,
            correlation_id: 7,
            cluster_id: "c".to_string(),
            body: Body::Response(RaftResponse::Fetch(FetchResponse {
                error: ErrorCode::None,
                epoch: 3,
                leader_id: Some(2),
                high_watermark: 10,
                log_start_offset: 0,
                diverging_epoch: None,
                snapshot_id: None,
                batches: vec![Batch::new(0, 3, &[Record::Data(vec![7; 5000]), Record::NoOp])],
            })),
        };
        let frame = encode_frame(&envelope);
        let body = encode(&envelope);
        assert_eq!(frame[..4], (body.len() as u32).to_be_bytes());
        assert_eq!(frame[4..], body[..]);
        assert_eq!(frame.capacity(), frame.len(), "allocated once, to size");
        let decoded: Envelope = decode_frame(&frame[4..], 1 << 20).unwrap();
        assert_eq!(decoded, envelope);
    }
}
