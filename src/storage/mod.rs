//! Durable state of one node: the election state and the metadata log.
//!
//! Two backends implement [`LogStore`]: [`sled_store::SledStore`] for
//! production and [`memory::MemoryStore`] for the simulator, which loses
//! every write not yet flushed when it "crashes". One test suite
//! (`tests/storage_suite.rs`) runs against both.
//!
//! The store lives on the storage thread ([`storage_thread`]), which
//! group-commits the log's writes; snapshot files are kept beside it
//! ([`snapshot`] for the file format, `snapshot_files` for what the thread
//! does with them) and read by the chunk server thread (`chunk_server`).
//! The handle the actors hold is `actors::log_appender::LogAppender`.

pub(crate) mod chunk_server;
pub mod memory;
pub(crate) mod queue;
pub mod sled_store;
pub mod snapshot;
pub(crate) mod snapshot_files;
pub mod storage_thread;
pub mod tail_cache;

use crate::messages::Batch;
use crate::raft::{ElectionState, Epoch, NodeId, Offset};

pub use memory::MemoryStore;
pub use queue::MAX_QUEUED_COMMANDS;
pub use sled_store::SledStore;
pub use snapshot::{SnapshotError, SnapshotInstaller, SnapshotMeta, SnapshotReader, SnapshotWriter};
pub use snapshot_files::{SnapshotChunk, StateRecords};
pub use storage_thread::{ReadResult, StorageEvent, StorageStats, MAX_GROUP_COMMANDS};

#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    #[error("storage I/O error: {0}")]
    Io(#[from] std::io::Error),
    #[error("sled error: {0}")]
    Sled(String),
    /// The data directory belongs to another cluster or node (like Kafka's
    /// meta.properties check). The node refuses to start.
    #[error("data directory {dir} belongs to {found}, but this node is configured as {expected}")]
    IdentityMismatch {
        dir: String,
        found: String,
        expected: String,
    },
    /// A batch below the recoverable tail is damaged: never served, never
    /// silently dropped.
    #[error("corrupt log batch at offset {offset}: {reason}")]
    Corrupt { offset: Offset, reason: String },
    /// The data directory as a whole is damaged or inconsistent (sled lost
    /// its contents or went back behind `quorum.checkpoint`, a file or value
    /// outside the log cannot be read). Nothing is removed; the node
    /// refuses to start.
    #[error("damaged data directory: {0}")]
    Damaged(String),
    /// The caller broke the log's contract (non-contiguous append, truncation
    /// inside a batch). A bug, reported rather than written.
    #[error("invalid log operation: {0}")]
    Invalid(String),
    /// A change made in several writes (a compaction, a reset) failed part
    /// way, so the store's view of the log no longer matches its disk. Every
    /// later call is refused with this error; reopening the store recovers a
    /// consistent log from the disk.
    #[error("the store is unusable: {0}; reopen it to recover")]
    Poisoned(String),
    /// A snapshot file could not be written, read or installed.
    #[error(transparent)]
    Snapshot(#[from] SnapshotError),
    /// No snapshot file holds what was asked for: the node keeps none, none
    /// holds the records below the log start, or no transfer of the one to
    /// install is complete.
    #[error("{0}")]
    NoSnapshot(String),
    /// Writing a snapshot was given up (the node stops, or a snapshot from
    /// the leader replaces the log it read); its partial file is removed.
    #[error("writing snapshot {0:?} was cancelled")]
    Cancelled(crate::messages::SnapshotId),
    /// Writing a snapshot was abandoned without an answer: its thread or the
    /// storage thread stopped (a partial file is removed at the next start).
    #[error("writing snapshot {0:?} was abandoned: its thread or the storage thread stopped")]
    Abandoned(crate::messages::SnapshotId),
    /// The snapshot reader's queue is full or it has stopped; the reader
    /// may retry.
    #[error("the snapshot reader is overloaded or stopped")]
    ReaderBusy,
    /// A read below the log start on a node whose snapshots hold a state
    /// machine's state, not the log's records: what came before the log
    /// start is only there as that state (load the snapshot instead).
    #[error(
        "offset {from} is below the log start {start}; what came before is only in the newest snapshot of the state"
    )]
    BelowLogStart { from: Offset, start: Offset },
}

pub type Result<T> = std::result::Result<T, StorageError>;

/// What the storage thread needs from a store: the [`LogStore`] contract plus
/// the high-watermark hint the sled backend uses to tell a torn tail (above
/// the hint: truncated at open) from corruption of committed data (below it:
/// a hard error).
pub trait AppenderStore: LogStore {
    /// Everything below `hw` is committed and durable on this node.
    fn set_high_watermark_hint(&mut self, hw: Offset) -> Result<()>;

    /// The hint as the store holds it (recovered at open): everything
    /// below it was committed. 0 for a store that keeps none.
    fn high_watermark_hint(&self) -> Offset {
        0
    }

    /// A handle that reads the log from another thread, if the store has
    /// one: snapshots are then written on a thread of their own while the
    /// storage thread goes on appending and flushing. Without one (the
    /// in-memory store of the simulator) they are written on the storage
    /// thread, in order with everything else.
    fn shared_reader(&self) -> Option<Box<dyn SharedLogReader>> {
        None
    }
}

/// Reads the log from a thread other than the storage thread (see
/// [`AppenderStore::shared_reader`]): only committed, flushed offsets are
/// read that way, and those never change.
pub trait SharedLogReader: Send + 'static {
    /// Same rules as [`LogStore::read`].
    fn read(&self, from: Offset, until: Offset, max_bytes: usize) -> Result<Vec<Batch>>;
}

impl SharedLogReader for SledReader {
    fn read(&self, from: Offset, until: Offset, max_bytes: usize) -> Result<Vec<Batch>> {
        SledReader::read(self, from, until, max_bytes)
    }
}

impl AppenderStore for SledStore {
    fn set_high_watermark_hint(&mut self, hw: Offset) -> Result<()> {
        // Persisted with the next flush.
        SledStore::set_high_watermark_hint(self, hw);
        Ok(())
    }

    fn high_watermark_hint(&self) -> Offset {
        SledStore::high_watermark_hint(self)
    }

    fn shared_reader(&self) -> Option<Box<dyn SharedLogReader>> {
        Some(Box::new(self.reader()))
    }
}

impl AppenderStore for MemoryStore {
    /// The simulator's store keeps no hint: everything it holds is as
    /// committed as the simulator's checks say.
    fn set_high_watermark_hint(&mut self, _hw: Offset) -> Result<()> {
        Ok(())
    }
}

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
/// - `delete_before(o)` (compaction below a snapshot whose end is `o`)
///   removes every batch that lies wholly below `o`; the log then starts at
///   the first batch kept, or at `o` when none is (`o == end_offset()`).
///   `o` must not pass the durable end: only committed, flushed batches are
///   compacted. Durable when it returns (it flushes).
/// - `reset(o, epoch)` (a snapshot ending at `o` in `epoch` was installed)
///   replaces the whole log by an empty one that starts at `o`, which may
///   lie beyond the current end. Durable when it returns (it flushes).
/// - `start_epoch()` is the epoch of the record just below the log start:
///   0 for a log that starts at 0, else the epoch of the last batch
///   `delete_before` removed, or the `epoch` given to `reset`.
/// - The log start and its epoch survive a reopen (sled keeps them in its
///   meta tree), also when the log is empty.
/// - A backend that makes `delete_before` or `reset` in several writes and
///   fails part way is *poisoned*: every later call that returns a
///   `Result` fails with [`StorageError::Poisoned`] (the others report its
///   view from before the failure) until it is reopened.
pub trait LogStore: Send + 'static {
    fn election_state(&self) -> Result<ElectionState>;
    fn write_election_state(&mut self, state: &ElectionState) -> Result<()>;

    fn append(&mut self, batch: &Batch) -> Result<()>;
    fn truncate(&mut self, end_offset: Offset) -> Result<()>;
    fn flush(&mut self) -> Result<()>;
    fn read(&self, from: Offset, until: Offset, max_bytes: usize) -> Result<Vec<Batch>>;

    /// Removes every batch wholly below `offset`; durable on return.
    fn delete_before(&mut self, offset: Offset) -> Result<()>;
    /// Replaces the log by an empty one starting at `start_offset`; durable
    /// on return.
    fn reset(&mut self, start_offset: Offset, start_epoch: Epoch) -> Result<()>;

    /// First offset held in the log (0 until snapshots move it).
    fn start_offset(&self) -> Offset;
    /// Epoch of the record just below the log start (0 at offset 0).
    fn start_epoch(&self) -> Epoch;
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

/// The data directory's layout, in `meta.properties` and in sled's meta
/// tree. 2: batches above 4 KiB are a head value plus chunks. 3: the
/// checkpoint file (`quorum.checkpoint`) is written at every open before
/// `meta.properties`, so a directory of version 3 without one has lost it
/// and is refused. A directory of an older version (one value per batch,
/// no checkpoint yet: still read as such) is upgraded at open, so that a
/// build that knows only the older version refuses it afterwards instead
/// of reading chunked batches as a damaged tail.
pub const FORMAT_VERSION: u32 = 3;

/// The first format version whose directories always hold a checkpoint
/// file beside `meta.properties`.
pub const CHECKPOINT_FORMAT_VERSION: u32 = 3;

/// The oldest layout this build reads (and upgrades at open).
pub const OLDEST_FORMAT_VERSION: u32 = 1;

/// Largest encoded batch ([`Batch::encoded_len`]) a backend accepts, and the decode limit for a
/// stored value: [`crate::messages::MAX_ENCODED_BATCH_BYTES`], the largest
/// batch that verifies. A batch the store could not decode again is refused
/// at `append` rather than written ([`Batch::records`] decodes any payload
/// it holds).
pub const MAX_STORED_BATCH_BYTES: usize = crate::messages::MAX_ENCODED_BATCH_BYTES;

/// Checks every backend makes before it accepts a batch, so that both
/// backends refuse exactly the same appends.
///
/// `end_offset` is the log end and `last_epoch` the epoch of the last batch
/// (`None` for an empty log).
pub(crate) fn check_append(end_offset: Offset, last_epoch: Option<Epoch>, batch: &Batch) -> Result<()> {
    if batch.base_offset != end_offset {
        return Err(StorageError::Invalid(format!(
            "append of a batch at offset {} to a log that ends at {end_offset}",
            batch.base_offset
        )));
    }
    // On its encoding, what sled stores and decodes again with this limit:
    // a batch that passes is always read back. Checked before `verify`,
    // which refuses it too, so that the error says what is wrong.
    if batch.encoded_len() > MAX_STORED_BATCH_BYTES {
        return Err(StorageError::Invalid(format!(
            "append of a batch encoded in {} bytes at offset {}, above the limit of {MAX_STORED_BATCH_BYTES}",
            batch.encoded_len(),
            batch.base_offset
        )));
    }
    if !batch.verify() {
        return Err(StorageError::Invalid(format!(
            "append of a batch at offset {} whose CRC does not match its contents \
             or whose {} records run past the largest offset",
            batch.base_offset, batch.record_count
        )));
    }
    if let Some(last) = last_epoch {
        if batch.epoch < last {
            return Err(StorageError::Invalid(format!(
                "append of a batch of epoch {} at offset {} after a batch of epoch {last}",
                batch.epoch, batch.base_offset
            )));
        }
    }
    Ok(())
}

/// Checks every backend makes before it persists an election state: the
/// invariants documented on [`ElectionState`]. A violation is a protocol bug,
/// refused before it reaches the disk.
pub(crate) fn check_election_transition(current: &ElectionState, next: &ElectionState) -> Result<()> {
    if next.epoch < current.epoch {
        return Err(StorageError::Invalid(format!(
            "election state epoch would go back from {} to {}",
            current.epoch, next.epoch
        )));
    }
    if next.epoch == current.epoch {
        if let (Some(old), Some(new)) = (current.voted_for, next.voted_for) {
            if old != new {
                return Err(StorageError::Invalid(format!(
                    "vote in epoch {} would change from node {old} to node {new}",
                    next.epoch
                )));
            }
        }
    }
    Ok(())
}

/// The epoch cache both backends keep: (epoch, first offset of that epoch),
/// one entry per epoch with a batch in the log.
///
/// Invariant: strictly ascending in both epoch and offset.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct EpochCache {
    entries: Vec<(Epoch, Offset)>,
}

impl EpochCache {
    /// The epoch of the last batch, `None` for an empty log.
    pub(crate) fn last_epoch(&self) -> Option<Epoch> {
        self.entries.last().map(|(epoch, _)| *epoch)
    }

    /// Records a batch appended at the log end. The caller has already
    /// checked (with [`check_append`]) that its epoch does not go back.
    pub(crate) fn on_append(&mut self, epoch: Epoch, base_offset: Offset) {
        match self.entries.last() {
            Some((last, _)) if *last == epoch => {}
            Some((last, start)) => {
                debug_assert!(epoch > *last && base_offset > *start, "epoch cache would not ascend");
                self.entries.push((epoch, base_offset));
            }
            None => self.entries.push((epoch, base_offset)),
        }
    }

    /// Forgets every epoch that starts at or above the new log end.
    pub(crate) fn truncate(&mut self, end_offset: Offset) {
        while matches!(self.entries.last(), Some((_, start)) if *start >= end_offset) {
            self.entries.pop();
        }
    }

    /// The epoch of the batch holding `offset`, for an offset inside the
    /// log (`None` below the first epoch).
    pub(crate) fn epoch_at(&self, offset: Offset) -> Option<Epoch> {
        let holders = self.entries.partition_point(|(_, start)| *start <= offset);
        holders.checked_sub(1).map(|index| self.entries[index].0)
    }

    /// Forgets the front of the log once it starts at `start_offset` and
    /// ends at `end_offset`: the epochs left without a batch go, and the
    /// first epoch kept starts at `start_offset` (the base of the first
    /// batch kept). A log left empty has no epoch.
    pub(crate) fn truncate_front(&mut self, start_offset: Offset, end_offset: Offset) {
        if start_offset >= end_offset {
            self.entries.clear();
            return;
        }
        // The epoch holding `start_offset` is the last one starting at or
        // below it; every epoch before it ends at or below `start_offset`.
        let holder = self
            .entries
            .partition_point(|(_, start)| *start <= start_offset)
            .saturating_sub(1);
        self.entries.drain(..holder);
        if let Some((_, first)) = self.entries.first_mut() {
            *first = (*first).max(start_offset);
        }
    }

    /// Forgets every epoch (the log was emptied).
    pub(crate) fn clear(&mut self) {
        self.entries.clear();
    }

    pub(crate) fn to_vec(&self) -> Vec<(Epoch, Offset)> {
        self.entries.clone()
    }
}

/// The `max_bytes` rule of [`LogStore::read`], shared by the backends: take
/// batches while they fit, but always the first one, so that a reader makes
/// progress past a batch larger than its budget.
pub(crate) struct ReadBudget {
    max_bytes: usize,
    used_bytes: usize,
    taken: usize,
}

impl ReadBudget {
    pub(crate) fn new(max_bytes: usize) -> Self {
        ReadBudget {
            max_bytes,
            used_bytes: 0,
            taken: 0,
        }
    }

    /// True (and the batch is counted) when a batch of `size_bytes` may be
    /// added to the response.
    pub(crate) fn try_take(&mut self, size_bytes: usize) -> bool {
        let fits = self.used_bytes.saturating_add(size_bytes) <= self.max_bytes;
        if self.taken == 0 || fits {
            self.used_bytes = self.used_bytes.saturating_add(size_bytes);
            self.taken += 1;
            true
        } else {
            false
        }
    }
}

pub use sled_store::SledReader;

/// Hands the memory a large one-off job freed (a snapshot written, a log
/// compacted) back to the system. glibc keeps what a thread frees in
/// that thread's arena, and a snapshot thread's arena is otherwise left
/// holding tens of MiB it will not use again: `bench state` measured a
/// node at 102-123 MiB right after a snapshot of 1M records, against 64-85
/// MiB with one arena for the whole process. Likewise a compaction reads
/// every page it removes into sled's cache, evicting pages other threads
/// allocated.
pub(crate) fn return_free_memory() {
    #[cfg(test)]
    TRIMS_ON_THIS_THREAD.with(|trims| trims.set(trims.get() + 1));
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        let started = std::time::Instant::now();
        // SAFETY: malloc_trim only returns memory the allocator holds free;
        // it touches no live allocation and may be called from any thread.
        let released = unsafe { libc::malloc_trim(0) };
        tracing::debug!(
            released = released == 1,
            took_us = started.elapsed().as_micros() as u64,
            "freed memory handed back to the system"
        );
    }
}

#[cfg(test)]
thread_local! {
    /// [`return_free_memory`] calls made on this thread, for tests.
    static TRIMS_ON_THIS_THREAD: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// How many times this thread has handed freed memory back.
#[cfg(test)]
pub(crate) fn trims_on_this_thread() -> u64 {
    TRIMS_ON_THIS_THREAD.with(|trims| trims.get())
}
