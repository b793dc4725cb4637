//! Everything that travels: records and batches, the Raft RPCs, the frame
//! codec, the client protocol, and the typed messages the actors exchange.

pub mod actor;
pub mod client;
pub mod codec;
pub mod controller;
pub mod records;
pub mod rpc;

pub use codec::{Body, CodecError, Envelope};
pub use records::{Batch, Record, MAX_BATCH_BYTES, MAX_ENCODED_BATCH_BYTES};
pub use rpc::*;
