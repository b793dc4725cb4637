//! Durable state of one node: the election state and the metadata log.
//!
//! Two backends implement [`LogStore`]: [`sled_store::SledStore`] for
//! production and [`memory::MemoryStore`] for the simulator, which loses
//! every write not yet flushed when it "crashes". One test suite
//! (`tests/storage_suite.rs`) runs against both.

pub mod memory;
pub mod sled_store;

use crate::messages::Batch;
use crate::raft::{ElectionState, Epoch, NodeId, Offset};

// pub use memory::MemoryStore;
// pub use sled_store::SledStore;

#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    #[error("storage I/O error: {0}")]
    Io(#[from] std::io::Error),
    #[error("sled error: {0}")]
    Sled(String),
    /// The data directory belongs to another cluster or node (like Kafka's
    /// meta.properties check). The node refuses to start.
    #[error("data directory {dir} belongs to {found}, but this node is configured as {expected}")]
    IdentityMismatch { dir: String, found: String, expected: String },
    /// A batch below the recoverable tail is damaged: never served, never
    /// silently dropped.
    #[error("corrupt log batch at offset {offset}: {reason}")]
    Corrupt { offset: Offset, reason: String },
    /// The caller broke the log's contract (non-contiguous append, truncation
    /// inside a batch). A bug, reported rather than written.
    #[error("invalid log operation: {0}")]
    Invalid(String),
}

pub type Result<T> = std::result::Result<T, StorageError>;

/// The metadata log plus the election state of one node.
///
/// Contract:
/// - `append` takes a batch whose `base_offset == end_offset()`; it is
///   readable at once and durable after the next `flush`.
/// - `truncate(o)` removes every batch with `base_offset >= o`; `o` must be a
///   batch boundary (or the end). Durable after the next `flush`.
/// - `flush` returns once every earlier append and truncate is on stable
///   storage (for sled: `flush()` + `fdatasync` of its data file).
/// - `write_election_state` is durable when it returns.
/// - `read(from, until, max_bytes)` returns the batches that hold offsets in
///   `[from, until)`, in order, stopping once `max_bytes` is reached but
///   always returning at least one batch when `from < until` and `from` is in
///   the log.
pub trait LogStore: Send + 'static {
    fn election_state(&self) -> Result<ElectionState>;
    fn write_election_state(&mut self, state: &ElectionState) -> Result<()>;

    fn append(&mut self, batch: &Batch) -> Result<()>;
    fn truncate(&mut self, end_offset: Offset) -> Result<()>;
    fn flush(&mut self) -> Result<()>;
    fn read(&self, from: Offset, until: Offset, max_bytes: usize) -> Result<Vec<Batch>>;

    /// First offset held in the log (0 until snapshots move it).
    fn start_offset(&self) -> Offset;
    /// Offset after the last batch (exclusive end).
    fn end_offset(&self) -> Offset;
    /// (epoch, start offset) of every epoch with a batch in the log,
    /// ascending: the epoch cache, rebuilt from the log at open.
    fn epoch_cache(&self) -> Vec<(Epoch, Offset)>;
}

/// Who owns a data directory; checked at open.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Identity {
    pub cluster_id: String,
    pub node_id: NodeId,
    pub format_version: u32,
}

pub const FORMAT_VERSION: u32 = 1;
