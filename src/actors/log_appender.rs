//! LogAppender: the metadata log's storage thread and the handle in front of
//! it (DESIGN.md §1, §4).
//!
//! sled calls block (and its flush fsyncs), so the store lives on a dedicated
//! `std::thread`, fed by a crossbeam channel. The thread **group-commits**: it
//! blocks for one command, drains whatever else is already queued (at most
//! [`MAX_GROUP_COMMANDS`]), applies them strictly in the order they were
//! sent, and when any `Flush` was among them issues *one* `store.flush()` and
//! reports [`StorageEvent::Flushed`].
//!
//! Why a plain handle and not an actix actor in front of the thread: every
//! command would then cross two queues (actor mailbox, then channel) and the
//! per-sender parking of an actix mailbox can reorder `send`s. The handle
//! pushes straight onto one FIFO channel, so "strictly in the order sent" is a
//! property of the channel, a batch costs one thread hop, and nothing ever
//! blocks the arbiter: pushing is non-blocking and replies come back on
//! oneshot channels that the caller awaits.
//!
//! A storage error on a write or flush is fatal for the node: the thread
//! logs it with `error!`, reports [`StorageEvent::Failed`] and exits; every
//! later command fails with [`AppenderError::Stopped`] and pending replies
//! are dropped (their receivers see the error). Nothing is swallowed. A
//! failed read only fails its reader, which is answered with the error
//! ([`ReadResult`]): a dropped reply always means the thread has stopped.
//!
//! Reads below the log start are answered from the newest snapshot, which
//! holds every record below its end with its offset; the snapshot files
//! (KIP-630: writing, installing one fetched from the leader) are handled
//! here too, in order with the log's writes. Chunks of a snapshot served to
//! fetchers, and reads below the log start, are read on a thread of their
//! own (`ChunkServer`): a snapshot file never changes once written, and
//! opening one validates all of it (~150 ms for 107 MiB), which must not
//! hold up the log's appends and flushes.
//!
//! [`LogAppender::spawn_task`] runs the same loop on a task of the current
//! runtime instead of a thread, for stores that never block: the
//! actor-level simulator runs whole nodes that way on a paused clock.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender, TryRecvError, TrySendError};
use tokio::sync::{mpsc, oneshot, Notify};
use tracing::{debug, error, info, warn};

use crate::messages::{Batch, SnapshotId};
use crate::raft::{ElectionState, Epoch, NodeId, Offset};
use crate::storage::snapshot::{self, BatchCursor, SnapshotInstaller, SnapshotMeta, SnapshotReader, SnapshotWriter};
use crate::storage::{self, LogStore, StorageError};

/// Most commands applied between two flushes (one group commit).
pub const MAX_GROUP_COMMANDS: usize = 4096;

/// Most commands queued for the storage thread. A backlog this deep means the
/// disk has effectively stalled; the caller treats it as fatal (QuorumState)
/// or as an unavailable node (reads).
pub const MAX_QUEUED_COMMANDS: usize = 1 << 16;

/// A queue of at most [`MAX_QUEUED_COMMANDS`] items (see [`try_send_bounded`]),
/// which takes memory only for what it holds. A crossbeam `bounded` channel
/// allocates and initialises all its slots up front: the two of 65,536 slots
/// each (commands and snapshot chunk reads) were 8.5 MiB of every node's RSS,
/// idle or not.
fn command_queue<T>() -> (Sender<T>, Receiver<T>) {
    crossbeam_channel::unbounded()
}

/// Sends `item` unless [`MAX_QUEUED_COMMANDS`] are queued already. Two
/// senders may both pass the check: the bound is a stall detector, not an
/// exact capacity.
fn try_send_bounded<T>(tx: &Sender<T>, item: T) -> Result<(), TrySendError<T>> {
    if tx.len() >= MAX_QUEUED_COMMANDS {
        return Err(TrySendError::Full(item));
    }
    tx.try_send(item)
}

/// What the storage thread needs from a store: the [`LogStore`] contract plus
/// the high-watermark hint the sled backend uses to tell a torn tail (above
/// the hint: truncated at open) from corruption of committed data (below it:
/// a hard error).
pub trait AppenderStore: LogStore {
    /// Everything below `hw` is committed and durable on this node.
    fn set_high_watermark_hint(&mut self, hw: Offset) -> storage::Result<()>;

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
    fn read(&self, from: Offset, until: Offset, max_bytes: usize) -> storage::Result<Vec<Batch>>;
}

impl SharedLogReader for crate::storage::SledReader {
    fn read(&self, from: Offset, until: Offset, max_bytes: usize) -> storage::Result<Vec<Batch>> {
        crate::storage::SledReader::read(self, from, until, max_bytes)
    }
}

impl AppenderStore for crate::storage::SledStore {
    fn set_high_watermark_hint(&mut self, hw: Offset) -> storage::Result<()> {
        // Persisted with the next flush.
        crate::storage::SledStore::set_high_watermark_hint(self, hw);
        Ok(())
    }

    fn high_watermark_hint(&self) -> Offset {
        crate::storage::SledStore::high_watermark_hint(self)
    }

    fn shared_reader(&self) -> Option<Box<dyn SharedLogReader>> {
        Some(Box::new(self.reader()))
    }
}

/// Adapts a store without a high-watermark hint (the in-memory store of the
/// simulator and of tests).
pub struct NoHint<S>(pub S);

impl<S: LogStore> LogStore for NoHint<S> {
    fn election_state(&self) -> storage::Result<ElectionState> {
        self.0.election_state()
    }
    fn write_election_state(&mut self, state: &ElectionState) -> storage::Result<()> {
        self.0.write_election_state(state)
    }
    fn append(&mut self, batch: &Batch) -> storage::Result<()> {
        self.0.append(batch)
    }
    fn truncate(&mut self, end_offset: Offset) -> storage::Result<()> {
        self.0.truncate(end_offset)
    }
    fn flush(&mut self) -> storage::Result<()> {
        self.0.flush()
    }
    fn read(&self, from: Offset, until: Offset, max_bytes: usize) -> storage::Result<Vec<Batch>> {
        self.0.read(from, until, max_bytes)
    }
    fn delete_before(&mut self, offset: Offset) -> storage::Result<()> {
        self.0.delete_before(offset)
    }
    fn reset(&mut self, start_offset: Offset, start_epoch: Epoch) -> storage::Result<()> {
        self.0.reset(start_offset, start_epoch)
    }
    fn start_offset(&self) -> Offset {
        self.0.start_offset()
    }
    fn start_epoch(&self) -> Epoch {
        self.0.start_epoch()
    }
    fn end_offset(&self) -> Offset {
        self.0.end_offset()
    }
    fn epoch_cache(&self) -> Vec<(Epoch, Offset)> {
        self.0.epoch_cache()
    }
}

impl<S: LogStore> AppenderStore for NoHint<S> {
    fn set_high_watermark_hint(&mut self, _hw: Offset) -> storage::Result<()> {
        Ok(())
    }
}

/// What the storage thread reports to the QuorumState actor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StorageEvent {
    /// One flush completed: every log write up to `durable_end` is durable,
    /// and so is every mutation (append or truncate) among the first
    /// `mutations` ever sent. A truncation sent after those may still remove
    /// part of `[.., durable_end)`; the receiver accounts for that.
    Flushed { durable_end: Offset, mutations: u64 },
    /// The store failed; the thread has stopped. Fatal for the node.
    Failed(String),
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AppenderError {
    #[error("the storage thread has stopped")]
    Stopped,
    #[error("the storage thread is {0} commands behind")]
    Overloaded(usize),
}

/// The answer to [`LogAppender::read`]: the batches, or why the read failed
/// (the storage thread keeps running; the reader may retry).
pub type ReadResult = Result<Vec<Batch>, String>;

/// What the storage thread has done since it started, for `GET /metrics`
/// (etcd's `wal_fsync_duration_seconds`, Kafka's log flush rate): shared
/// counters the thread bumps and any handle reads.
#[derive(Debug, Default)]
struct StorageCounters {
    flushes: AtomicU64,
    flush_nanos: AtomicU64,
    appended_batches: AtomicU64,
    appended_bytes: AtomicU64,
}

/// A reading of the storage thread's counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct StorageStats {
    /// Durability points (one flush plus fdatasync each).
    pub flushes_total: u64,
    /// Time spent in them.
    pub flush_seconds_total: f64,
    pub appended_batches_total: u64,
    pub appended_bytes_total: u64,
}

enum Command {
    Append(Batch),
    Truncate(Offset),
    Flush,
    WriteElection(ElectionState, oneshot::Sender<()>),
    Read {
        from: Offset,
        until: Offset,
        max_bytes: usize,
        reply: oneshot::Sender<ReadResult>,
    },
    SetHighWatermarkHint(Offset),
    Shutdown(oneshot::Sender<()>),
    CreateSnapshot {
        id: SnapshotId,
        previous: Option<SnapshotId>,
        reply: oneshot::Sender<Result<SnapshotMeta, String>>,
    },
    ReadSnapshotChunk {
        id: SnapshotId,
        position: u64,
        max_bytes: usize,
        reply: oneshot::Sender<Result<SnapshotChunk, String>>,
    },
    WriteSnapshotChunk {
        id: SnapshotId,
        size: u64,
        position: u64,
        bytes: Vec<u8>,
        written: oneshot::Sender<()>,
    },
    InstallSnapshot {
        id: SnapshotId,
        reply: oneshot::Sender<Result<SnapshotMeta, String>>,
    },
    DeleteSnapshot(SnapshotId),
    /// Compact the log below the end of this snapshot, which now holds
    /// every record below the log start.
    DeleteBefore(SnapshotId),
}

/// A piece of a snapshot file, for a FetchSnapshot response.
#[derive(Debug)]
pub struct SnapshotChunk {
    pub size: u64,
    pub bytes: Vec<u8>,
}

/// The snapshot files beside the log (KIP-630), handled on the storage
/// thread so that their writes are ordered with the log's.
struct SnapshotFiles {
    dir: Option<PathBuf>,
    /// Snapshot chunks for fetchers and reads below the log start, when no
    /// [`ChunkServer`] thread serves them (a store run on a task).
    chunks: ChunkServer,
    /// The snapshot being received from the leader.
    installing: Option<SnapshotInstaller>,
    /// The newest snapshot: it holds every record below the log start.
    latest: Option<SnapshotId>,
}

impl SnapshotFiles {
    fn new(dir: Option<PathBuf>) -> Self {
        SnapshotFiles {
            chunks: ChunkServer::new(dir.clone()),
            dir,
            installing: None,
            latest: None,
        }
    }

    fn dir(&self) -> Result<&PathBuf, String> {
        self.dir
            .as_ref()
            .ok_or_else(|| "this node keeps no snapshot files".to_string())
    }

    /// Writes the snapshot `id` here, on the storage thread (for stores
    /// without a [`SharedLogReader`]); see [`write_snapshot`].
    fn create(
        &mut self,
        store: &dyn AppenderStore,
        id: SnapshotId,
        previous: Option<SnapshotId>,
    ) -> Result<SnapshotMeta, String> {
        let dir = self.dir()?.clone();
        check_snapshot_reaches(previous, store.start_offset())?;
        let meta = write_snapshot(
            &dir,
            id,
            previous,
            &|from, until, max| store.read(from, until, max),
            &NOT_CANCELLED,
        )?;
        self.use_latest(id);
        Ok(meta)
    }

    fn write_chunk(&mut self, id: SnapshotId, size: u64, position: u64, bytes: &[u8]) {
        let fresh = position == 0 || self.installing.as_ref().map(|i| i.id()) != Some(id);
        if fresh {
            // Dropping an earlier installer removes its partial file.
            self.installing = None;
            let Ok(dir) = self.dir() else { return };
            match SnapshotInstaller::create(dir, id, size) {
                Ok(installer) => self.installing = Some(installer),
                Err(e) => {
                    error!("cannot start receiving snapshot {id:?}: {e}");
                    return;
                }
            }
        }
        let Some(installer) = &mut self.installing else { return };
        if let Err(e) = installer.write_chunk(position, bytes) {
            // The install will fail and the engine fetches it again.
            error!("snapshot {id:?}: chunk at {position} refused: {e}");
            self.installing = None;
        }
    }

    fn finish_install(&mut self, id: SnapshotId) -> Result<SnapshotMeta, String> {
        let meta = match self.installing.take() {
            Some(installer) if installer.id() == id => installer.finish().map_err(|e| e.to_string())?,
            _ => return Err(format!("no complete transfer of snapshot {id:?}")),
        };
        self.use_latest(id);
        Ok(meta)
    }

    /// Deletes every snapshot file that ends before `id` (failures are
    /// only logged: a leftover file is harmless and deleted next time).
    fn delete_older_than(&mut self, id: SnapshotId) {
        let Ok(dir) = self.dir() else { return };
        let older = match snapshot::list(dir) {
            Ok(ids) => ids.into_iter().filter(|o| o.end_offset < id.end_offset),
            Err(e) => return warn!("cannot list the snapshots: {e}"),
        };
        for old in older.collect::<Vec<_>>() {
            if let Err(e) = snapshot::delete(dir, old) {
                warn!("cannot delete snapshot {old:?}: {e}");
            }
        }
    }

    fn use_latest(&mut self, id: SnapshotId) {
        self.latest = Some(id);
    }
}

/// The batches of `reader` holding `[from, until)` (at most about
/// `max_bytes`), scanning from `cursor`, which stands at a batch whose base
/// offset `base` is at or below `from`; both are left where the next
/// sequential read resumes.
fn read_batches(
    reader: &SnapshotReader,
    cursor: &mut BatchCursor,
    base: &mut Offset,
    from: Offset,
    until: Offset,
    max_bytes: usize,
) -> Result<Vec<Batch>, String> {
    let mut batches = reader.batches_from(*cursor);
    let mut found = Vec::new();
    let mut bytes = 0;
    loop {
        let at = batches.cursor();
        let Some(batch) = batches.next() else { break };
        let batch = batch.map_err(|e| e.to_string())?;
        if batch.base_offset >= until || (!found.is_empty() && bytes >= max_bytes) {
            // Resume at this batch next time.
            (*cursor, *base) = (at, batch.base_offset);
            break;
        }
        (*cursor, *base) = (batches.cursor(), batch.next_offset());
        if batch.next_offset() > from {
            bytes += batch.size_bytes();
            found.push(batch);
        }
    }
    if found.is_empty() && from < until {
        return Err(format!("the newest snapshot holds nothing at offset {from}"));
    }
    Ok(found)
}

fn copy_batch(writer: &mut SnapshotWriter, batch: &Batch) -> Result<(), String> {
    writer.append_batch(batch).map_err(|e| e.to_string())
}

/// Never set: for snapshots written on the storage thread.
static NOT_CANCELLED: AtomicBool = AtomicBool::new(false);

/// The log below its start is in `previous` (the newest snapshot), so a
/// snapshot built from both misses nothing.
fn check_snapshot_reaches(previous: Option<SnapshotId>, log_start: Offset) -> Result<(), String> {
    let next = previous.map_or(0, |p| p.end_offset);
    if next < log_start {
        return Err(format!(
            "the log starts at {log_start} but the snapshot below it ends at {next}"
        ));
    }
    Ok(())
}

/// Writes the snapshot ending at `id.end_offset` into `dir`: the records of
/// the `previous` snapshot, then the log's from there (read with `read`),
/// batch by batch with their offsets and epochs (the raw-record state
/// machine's state is its whole committed log). Gives up, removing the
/// partial file, once `cancel` is set.
fn write_snapshot(
    dir: &Path,
    id: SnapshotId,
    previous: Option<SnapshotId>,
    read: &dyn Fn(Offset, Offset, usize) -> storage::Result<Vec<Batch>>,
    cancel: &AtomicBool,
) -> Result<SnapshotMeta, String> {
    let cancelled = || -> Result<(), String> {
        match cancel.load(Ordering::Relaxed) {
            true => Err(format!("writing snapshot {id:?} was cancelled")),
            false => Ok(()),
        }
    };
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64);
    let mut writer = SnapshotWriter::create(dir, id, now_ms).map_err(|e| e.to_string())?;
    let mut next = 0;
    if let Some(previous) = previous {
        let reader = SnapshotReader::open(&snapshot::path_of(dir, previous)).map_err(|e| e.to_string())?;
        for batch in reader.batches() {
            cancelled()?;
            copy_batch(&mut writer, &batch.map_err(|e| e.to_string())?)?;
        }
        next = previous.end_offset;
    }
    let mut trimmed_at = writer.bytes_written();
    while next < id.end_offset {
        cancelled()?;
        let batches = read(next, id.end_offset, 1 << 20).map_err(|e| e.to_string())?;
        let Some(last) = batches.last() else {
            return Err(format!("the log has nothing at offset {next}"));
        };
        next = last.next_offset();
        for batch in batches.iter().filter(|b| b.base_offset < id.end_offset) {
            copy_batch(&mut writer, batch)?;
        }
        if writer.bytes_written() >= trimmed_at + SNAPSHOT_TRIM_EVERY_BYTES {
            // The pages sled reads in for this thread replace, in its
            // cache, pages another thread allocated: those are freed into
            // that thread's arena, which would keep them all.
            storage::return_free_memory();
            trimmed_at = writer.bytes_written();
        }
    }
    writer.freeze().map_err(|e| e.to_string())
}

/// How much the storage thread appends or reads before it hands freed
/// memory back at its next idle moment.
const TRIM_EVERY_BYTES: u64 = 32 << 20;

/// How much snapshot a [`write_snapshot`] copies from the log between two
/// [`storage::return_free_memory`] calls (each takes 10-80 ms). The pages
/// sled reads for the snapshot thread land in that thread's arena while
/// those they evict are freed into the storage thread's, which keeps them:
/// a leader's RSS rose by ~25 MiB within the first 32 MiB of a snapshot of
/// 1M records (to 98-101 MiB in `bench state`), and peaked at 83-89 MiB
/// when trimming every 8 MiB, its snapshots no slower (392-454 ms).
const SNAPSHOT_TRIM_EVERY_BYTES: u64 = 8 << 20;

/// Reads local snapshot files: chunks for FetchSnapshot answers, and
/// batches below the log start. Runs on a thread of its own beside the
/// storage thread ([`ChunkServer::spawn`]), or inside it for a store run
/// on a task.
struct ChunkServer {
    dir: Option<PathBuf>,
    /// The snapshot being served, opened (and so validated, all of it) once.
    serving: Option<SnapshotReader>,
    /// The newest snapshot opened (validated once) for reads below the log
    /// start, with where the last of those stopped: the cursor and the base
    /// offset of the batch there (a read from there on resumes, any other
    /// seeks with the reader's index; neither scans the file again).
    below: Option<(SnapshotReader, BatchCursor, Offset)>,
    /// Snapshot files opened (each open validates the whole file) to read
    /// below the log start.
    validations: u64,
}

/// How long the [`ChunkServer`] keeps a snapshot open without a read. A
/// transfer asks for its next chunk as soon as it wrote the last one.
const CHUNK_READER_IDLE: Duration = Duration::from_secs(5);

/// A read for [`ChunkServer::spawn`]'s thread.
enum ChunkRead {
    /// A chunk of snapshot `id` for a FetchSnapshot answer.
    Chunk {
        id: SnapshotId,
        position: u64,
        max_bytes: usize,
        reply: oneshot::Sender<Result<SnapshotChunk, String>>,
    },
    /// Batches below the log start, from the newest snapshot `latest`
    /// (None: the newest valid one in the directory).
    Below {
        latest: Option<SnapshotId>,
        from: Offset,
        until: Offset,
        max_bytes: usize,
        reply: oneshot::Sender<ReadResult>,
    },
}

impl ChunkRead {
    /// Answers the read with an error instead of serving it.
    fn refuse(self, why: &str) {
        // A closed receiver means the reader went away.
        match self {
            ChunkRead::Chunk { reply, .. } => {
                let _ = reply.send(Err(why.to_string()));
            }
            ChunkRead::Below { reply, .. } => {
                let _ = reply.send(Err(why.to_string()));
            }
        }
    }
}

impl ChunkServer {
    fn new(dir: Option<PathBuf>) -> ChunkServer {
        ChunkServer {
            dir,
            serving: None,
            below: None,
            validations: 0,
        }
    }

    /// Starts a thread serving reads of the snapshots in `dir` until every
    /// sender is gone. Files are opened by id: one deleted since is
    /// answered with an error, one open already is read to its end. After
    /// `idle` without a read the file is closed, so that one the cleaner
    /// has deleted meanwhile frees its disk space.
    fn spawn(node_id: NodeId, dir: PathBuf, idle: Duration) -> std::io::Result<Sender<ChunkRead>> {
        let (tx, rx) = command_queue::<ChunkRead>();
        let mut server = ChunkServer::new(Some(dir));
        std::thread::Builder::new()
            .name(format!("kraft-chunks-{node_id}"))
            .spawn(move || loop {
                // A closed receiver means the reader went away.
                match rx.recv_timeout(idle) {
                    Ok(ChunkRead::Chunk {
                        id,
                        position,
                        max_bytes,
                        reply,
                    }) => {
                        let _ = reply.send(server.read_chunk(id, position, max_bytes));
                    }
                    Ok(ChunkRead::Below {
                        latest,
                        from,
                        until,
                        max_bytes,
                        reply,
                    }) => {
                        let read = server.read_below(latest, from, until, max_bytes);
                        if let Err(e) = &read {
                            warn!("read of [{from}, {until}) from the snapshot failed: {e}");
                        }
                        let _ = reply.send(read);
                    }
                    Err(RecvTimeoutError::Timeout) => {
                        let served = server.serving.take().is_some() | server.below.take().is_some();
                        if served {
                            // What it read was freed on other threads, into
                            // this thread's arena, which would keep it.
                            storage::return_free_memory();
                        }
                    }
                    Err(RecvTimeoutError::Disconnected) => return,
                }
            })?;
        Ok(tx)
    }

    fn read_chunk(&mut self, id: SnapshotId, position: u64, max_bytes: usize) -> Result<SnapshotChunk, String> {
        if self.serving.as_ref().map(|r| r.id()) != Some(id) {
            let dir = self
                .dir
                .as_ref()
                .ok_or_else(|| "this node keeps no snapshot files".to_string())?;
            // Forget the previous one first: a failed open leaves none.
            self.serving = None;
            self.serving = Some(SnapshotReader::open(&snapshot::path_of(dir, id)).map_err(|e| e.to_string())?);
        }
        let reader = self.serving.as_ref().expect("opened above");
        let bytes = reader.read_chunk(position, max_bytes).map_err(|e| e.to_string())?;
        Ok(SnapshotChunk {
            size: reader.size_bytes(),
            bytes,
        })
    }

    /// Batches holding `[from, until)` from the newest snapshot (every
    /// record below the log start is in it, with its offset).
    ///
    /// The snapshot is opened, and so validated, once: the file never
    /// changes. A read starts where the previous one stopped when that is
    /// at or below `from` (a listener reading on), else at the reader's
    /// seek sample below `from` (another reader, or one going back), so it
    /// costs the distance it reads, not a pass over the whole file.
    fn read_below(
        &mut self,
        latest: Option<SnapshotId>,
        from: Offset,
        until: Offset,
        max_bytes: usize,
    ) -> Result<Vec<Batch>, String> {
        // Without a newest snapshot named, the one found last time serves.
        let latest = latest.or(self.below.as_ref().map(|(r, _, _)| r.id()));
        let open = matches!(&self.below, Some((r, _, _)) if Some(r.id()) == latest);
        if !open {
            self.validations += 1;
            let dir = self
                .dir
                .as_ref()
                .ok_or_else(|| "this node keeps no snapshot files".to_string())?;
            let reader = match latest {
                Some(id) => SnapshotReader::open(&snapshot::path_of(dir, id)).map_err(|e| e.to_string())?,
                None => match snapshot::newest_valid(dir).map_err(|e| e.to_string())? {
                    Some((reader, _)) => reader,
                    None => return Err("no snapshot holds the records below the log start".to_string()),
                },
            };
            let cursor = reader.batches().cursor();
            self.below = Some((reader, cursor, 0));
        }
        let (reader, cursor, base) = self.below.as_mut().expect("set above");
        let (sampled, sampled_base) = reader.seek(from);
        if *base > from || sampled.position() > cursor.position() {
            (*cursor, *base) = (sampled, sampled_base);
        }
        let read = read_batches(reader, cursor, base, from, until, max_bytes);
        if read.is_err() {
            // The file changed after it was validated: validate it again
            // next time rather than trust anything read from it.
            self.below = None;
        }
        read
    }
}

/// A snapshot being written on a thread of its own.
struct SnapshotThread {
    cancel: Arc<AtomicBool>,
    thread: JoinHandle<()>,
}

impl SnapshotThread {
    /// Waits for it, cancelling it first if `cancel`.
    fn stop(self, cancel: bool) {
        if cancel {
            self.cancel.store(true, Ordering::Relaxed);
        }
        if self.thread.join().is_err() {
            error!("the snapshot thread panicked");
        }
    }
}

/// The handle to the storage thread. Cheap to clone; every clone feeds the
/// same FIFO queue. Only the QuorumState actor sends mutations (append,
/// truncate, election state), so their order is its order.
#[derive(Clone)]
pub struct LogAppender {
    tx: Sender<Command>,
    /// The storage thread, or the task of a task-run store
    /// ([`LogAppender::spawn_task`]): woken after every push, and when a
    /// handle is dropped. Declared after `tx` so that a dropped handle's
    /// sender is gone before the wake-up.
    wake: Waker,
    counters: Arc<StorageCounters>,
    /// The [`ChunkServer`] thread, when there is one; else chunks are read
    /// by the storage thread (a store run on a task).
    chunks: Option<Sender<ChunkRead>>,
}

/// Wakes the store's worker after every push, and on drop too, so that it
/// sees the queue disconnected once the last handle is gone.
#[derive(Clone)]
enum Waker {
    /// The storage thread, which waits in [`next_command`].
    Thread(std::thread::Thread),
    /// A task-run store ([`LogAppender::spawn_task`]).
    Task(Arc<Notify>),
}

impl Waker {
    fn wake(&self) {
        match self {
            // An atomic swap; a system call only if the thread is parked.
            Waker::Thread(thread) => thread.unpark(),
            Waker::Task(notify) => notify.notify_one(),
        }
    }
}

impl Drop for Waker {
    fn drop(&mut self) {
        self.wake();
    }
}

/// Where the store's work runs; await [`StorageWorker::join`] after
/// [`LogAppender::shutdown`].
pub enum StorageWorker {
    Thread(JoinHandle<()>),
    Task(tokio::task::JoinHandle<()>),
}

impl StorageWorker {
    /// Waits for the worker to end; false if it panicked.
    pub async fn join(self) -> bool {
        match self {
            StorageWorker::Thread(thread) => {
                matches!(tokio::task::spawn_blocking(move || thread.join()).await, Ok(Ok(())))
            }
            StorageWorker::Task(task) => task.await.is_ok(),
        }
    }
}

impl LogAppender {
    /// Starts the storage thread over `store`. Flush completions and the
    /// fatal error go to `events`.
    pub fn spawn(
        node_id: NodeId,
        store: Box<dyn AppenderStore>,
        snapshot_dir: Option<PathBuf>,
        events: mpsc::UnboundedSender<StorageEvent>,
    ) -> std::io::Result<(LogAppender, JoinHandle<()>)> {
        let (tx, rx) = command_queue();
        let counters = Arc::new(StorageCounters::default());
        let chunks = match &snapshot_dir {
            Some(dir) => Some(ChunkServer::spawn(node_id, dir.clone(), CHUNK_READER_IDLE)?),
            None => None,
        };
        let mut worker = StorageThread::new(store, snapshot_dir, events, counters.clone());
        worker.name = format!("kraft-snapshot-{node_id}");
        worker.chunks = chunks.clone();
        let thread = std::thread::Builder::new()
            .name(format!("kraft-storage-{node_id}"))
            .spawn(move || worker.run(rx))?;
        let appender = LogAppender {
            tx,
            wake: Waker::Thread(thread.thread().clone()),
            counters,
            chunks,
        };
        Ok((appender, thread))
    }

    /// Runs the store on a task of the current tokio runtime instead of a
    /// thread: for stores that never block (the in-memory store), so that
    /// a single-threaded runtime with a paused clock runs the whole node
    /// deterministically (the actor-level simulator). Must be called inside
    /// a `LocalSet` (an actix System). A group of commands is applied at
    /// once, reads answered; when it holds a Flush, the flush itself then
    /// takes `flush_delay` of (virtual) time, standing in for the disk's
    /// fsync: what is sent meanwhile forms the next group, and a crash in
    /// between loses the group's writes.
    pub fn spawn_task(
        store: Box<dyn AppenderStore>,
        snapshot_dir: Option<PathBuf>,
        events: mpsc::UnboundedSender<StorageEvent>,
        flush_delay: Duration,
    ) -> (LogAppender, tokio::task::JoinHandle<()>) {
        let (tx, rx) = command_queue();
        let wake = Arc::new(Notify::new());
        let woken = wake.clone();
        let counters = Arc::new(StorageCounters::default());
        let mut worker = StorageThread::new(store, snapshot_dir, events, counters.clone());
        let task = tokio::task::spawn_local(async move {
            let mut group: Vec<Command> = Vec::with_capacity(64);
            let exit = loop {
                match rx.try_recv() {
                    Ok(command) => group.push(command),
                    Err(TryRecvError::Empty) => {
                        woken.notified().await;
                        continue;
                    }
                    // Every handle is gone: finish like a shutdown.
                    Err(TryRecvError::Disconnected) => break Exit::Shutdown(None),
                }
                fill(&rx, &mut group);
                let applied = match worker.apply_group(&mut group) {
                    Ok(applied) => applied,
                    Err(()) => break Exit::Failed,
                };
                if applied.flush {
                    if !flush_delay.is_zero() {
                        tokio::time::sleep(flush_delay).await;
                    }
                    if worker.flush_and_report().is_err() {
                        break Exit::Failed;
                    }
                }
                if let Some(reply) = applied.shutdown {
                    break Exit::Shutdown(Some(reply));
                }
            };
            worker.finish(exit);
        });
        (
            LogAppender {
                tx,
                wake: Waker::Task(wake),
                counters,
                chunks: None,
            },
            task,
        )
    }

    /// The storage thread's counters now.
    pub fn stats(&self) -> StorageStats {
        let c = &self.counters;
        StorageStats {
            flushes_total: c.flushes.load(Ordering::Relaxed),
            flush_seconds_total: c.flush_nanos.load(Ordering::Relaxed) as f64 / 1e9,
            appended_batches_total: c.appended_batches.load(Ordering::Relaxed),
            appended_bytes_total: c.appended_bytes.load(Ordering::Relaxed),
        }
    }

    fn push(&self, command: Command) -> Result<(), AppenderError> {
        let pushed = try_send_bounded(&self.tx, command);
        self.wake.wake();
        match pushed {
            Ok(()) => Ok(()),
            Err(TrySendError::Full(_)) => Err(AppenderError::Overloaded(self.tx.len())),
            Err(TrySendError::Disconnected(_)) => Err(AppenderError::Stopped),
        }
    }

    /// Appends at the log end; readable by later reads at once, durable after
    /// the next flush.
    pub fn append(&self, batch: Batch) -> Result<(), AppenderError> {
        self.push(Command::Append(batch))
    }

    /// Removes every batch at or above `end_offset`.
    pub fn truncate(&self, end_offset: Offset) -> Result<(), AppenderError> {
        self.push(Command::Truncate(end_offset))
    }

    /// Asks for every earlier write to be made durable; completion arrives
    /// as [`StorageEvent::Flushed`].
    pub fn flush(&self) -> Result<(), AppenderError> {
        self.push(Command::Flush)
    }

    /// Writes the election state; the receiver resolves once it is durable
    /// (and fails if the store failed).
    pub fn write_election(&self, state: ElectionState) -> Result<oneshot::Receiver<()>, AppenderError> {
        let (reply, rx) = oneshot::channel();
        self.push(Command::WriteElection(state, reply))?;
        Ok(rx)
    }

    /// Reads the batches holding `[from, until)` (at most about `max_bytes`,
    /// at least one batch), after every command sent before it. The answer
    /// does not wait for a flush. A read that fails is answered with the
    /// error; the receiver fails only if the storage thread has stopped.
    pub fn read(
        &self,
        from: Offset,
        until: Offset,
        max_bytes: usize,
    ) -> Result<oneshot::Receiver<ReadResult>, AppenderError> {
        let (reply, rx) = oneshot::channel();
        self.push(Command::Read {
            from,
            until,
            max_bytes,
            reply,
        })?;
        Ok(rx)
    }

    /// Tells the store that everything below `hw` is committed and durable.
    pub fn set_high_watermark_hint(&self, hw: Offset) -> Result<(), AppenderError> {
        self.push(Command::SetHighWatermarkHint(hw))
    }

    /// Writes the snapshot `id` (records of `previous`, then of the log up to
    /// `id.end_offset`, which must be committed and flushed).
    pub fn create_snapshot(
        &self,
        id: SnapshotId,
        previous: Option<SnapshotId>,
    ) -> Result<oneshot::Receiver<Result<SnapshotMeta, String>>, AppenderError> {
        let (reply, rx) = oneshot::channel();
        self.push(Command::CreateSnapshot { id, previous, reply })?;
        Ok(rx)
    }

    /// Reads a chunk of the local snapshot `id` for a FetchSnapshot answer,
    /// on the `ChunkServer` thread when there is one: never queued behind
    /// the log's writes and flushes, nor they behind it.
    pub fn read_snapshot_chunk(
        &self,
        id: SnapshotId,
        position: u64,
        max_bytes: usize,
    ) -> Result<oneshot::Receiver<Result<SnapshotChunk, String>>, AppenderError> {
        let (reply, rx) = oneshot::channel();
        match &self.chunks {
            Some(chunks) => try_send_bounded(
                chunks,
                ChunkRead::Chunk {
                    id,
                    position,
                    max_bytes,
                    reply,
                },
            )
            .map_err(|e| match e {
                TrySendError::Full(_) => AppenderError::Overloaded(chunks.len()),
                TrySendError::Disconnected(_) => AppenderError::Stopped,
            })?,
            None => self.push(Command::ReadSnapshotChunk {
                id,
                position,
                max_bytes,
                reply,
            })?,
        }
        Ok(rx)
    }

    /// Writes a chunk of the snapshot being fetched from the leader. The
    /// receiver resolves once the chunk is in the file, or was refused (the
    /// install then fails and the transfer starts over); the caller waits
    /// for it before it takes the next chunk, so that a disk slower than the
    /// network does not queue the snapshot in memory.
    pub fn write_snapshot_chunk(
        &self,
        id: SnapshotId,
        size: u64,
        position: u64,
        bytes: Vec<u8>,
    ) -> Result<oneshot::Receiver<()>, AppenderError> {
        let (written, rx) = oneshot::channel();
        self.push(Command::WriteSnapshotChunk {
            id,
            size,
            position,
            bytes,
            written,
        })?;
        Ok(rx)
    }

    /// Validates and installs the fetched snapshot, then replaces the log by
    /// an empty one starting at its end (durable when the reply is Ok).
    pub fn install_snapshot(
        &self,
        id: SnapshotId,
    ) -> Result<oneshot::Receiver<Result<SnapshotMeta, String>>, AppenderError> {
        let (reply, rx) = oneshot::channel();
        self.push(Command::InstallSnapshot { id, reply })?;
        Ok(rx)
    }

    /// Deletes an old snapshot file (a failure is only logged).
    pub fn delete_snapshot(&self, id: SnapshotId) -> Result<(), AppenderError> {
        self.push(Command::DeleteSnapshot(id))
    }

    /// Compacts the log below the end of `snapshot` (durable once
    /// applied); reads below the new log start are then answered from it.
    pub fn delete_before(&self, snapshot: SnapshotId) -> Result<(), AppenderError> {
        self.push(Command::DeleteBefore(snapshot))
    }

    /// Applies everything queued, flushes once more and stops the thread.
    /// The receiver resolves when the store is flushed (it errs if the thread
    /// had already stopped).
    /// With a task-run store the queue is never waited on (that would
    /// block the very thread the task runs on): a full queue is
    /// `Overloaded`, and the task ends once every handle is dropped.
    pub fn shutdown(&self) -> Result<oneshot::Receiver<()>, AppenderError> {
        let (reply, rx) = oneshot::channel();
        if matches!(self.wake, Waker::Task(_)) {
            self.push(Command::Shutdown(reply))?;
            return Ok(rx);
        }
        let sent = self.tx.send(Command::Shutdown(reply));
        self.wake.wake();
        match sent {
            Ok(()) => Ok(rx),
            Err(_) => Err(AppenderError::Stopped),
        }
    }
}

/// The storage thread's next command, waiting at most `timeout` (without
/// one, until a command comes or every handle is gone).
///
/// An empty queue parks the thread at once; every push unparks it
/// ([`Waker::Thread`]). crossbeam's own `recv` first spins and then calls
/// `sched_yield` up to four times before it parks, and on two busy vCPUs
/// a yield could keep the thread off the CPU for 1-2 ms while a command
/// pushed meanwhile, finding no parked receiver to wake, waited for it
/// (traced at C=256: BENCHMARKS.md, session of 2026-12-06, sixth).
fn next_command<T>(rx: &Receiver<T>, timeout: Option<Duration>) -> Result<T, RecvTimeoutError> {
    let deadline = timeout.map(|timeout| Instant::now() + timeout);
    loop {
        match rx.try_recv() {
            Ok(command) => return Ok(command),
            Err(TryRecvError::Disconnected) => return Err(RecvTimeoutError::Disconnected),
            Err(TryRecvError::Empty) => {}
        }
        // A push between the look above and the park leaves the thread's
        // token set, and the park returns at once; a wake-up for nothing
        // (a token meant for another wait on this thread) only loops.
        match deadline {
            None => std::thread::park(),
            Some(deadline) => match deadline.checked_duration_since(Instant::now()) {
                Some(left) if !left.is_zero() => std::thread::park_timeout(left),
                _ => return Err(RecvTimeoutError::Timeout),
            },
        }
    }
}

/// Adds whatever else is queued to `group`, up to [`MAX_GROUP_COMMANDS`].
fn fill(rx: &Receiver<Command>, group: &mut Vec<Command>) {
    while group.len() < MAX_GROUP_COMMANDS {
        match rx.try_recv() {
            Ok(command) => group.push(command),
            Err(_) => break,
        }
    }
}

struct StorageThread {
    store: Box<dyn AppenderStore>,
    snapshots: SnapshotFiles,
    /// The snapshot being written beside this thread, if any.
    snapshot_thread: Option<SnapshotThread>,
    /// The name its thread gets.
    name: String,
    /// At how many bytes appended and read freed memory was last handed
    /// back (see `trim_due`).
    trimmed_at_bytes: u64,
    /// Bytes of batches read so far.
    read_bytes: u64,
    events: mpsc::UnboundedSender<StorageEvent>,
    /// Appends and truncates applied so far (see [`StorageEvent::Flushed`]).
    mutations: u64,
    counters: Arc<StorageCounters>,
    /// The [`ChunkServer`] thread that answers reads below the log start,
    /// when there is one.
    chunks: Option<Sender<ChunkRead>>,
}

/// What one group asked for besides its writes and reads.
struct Applied {
    /// A Flush was among the commands: one durability point for all.
    flush: bool,
    shutdown: Option<oneshot::Sender<()>>,
}

/// Why the thread's loop ends.
enum Exit {
    Shutdown(Option<oneshot::Sender<()>>),
    Failed,
}

impl StorageThread {
    fn new(
        store: Box<dyn AppenderStore>,
        snapshot_dir: Option<PathBuf>,
        events: mpsc::UnboundedSender<StorageEvent>,
        counters: Arc<StorageCounters>,
    ) -> StorageThread {
        StorageThread {
            store,
            snapshots: SnapshotFiles::new(snapshot_dir),
            snapshot_thread: None,
            name: "kraft-snapshot".to_string(),
            trimmed_at_bytes: 0,
            read_bytes: 0,
            events,
            mutations: 0,
            counters,
            chunks: None,
        }
    }

    fn run(mut self, rx: Receiver<Command>) {
        let mut group: Vec<Command> = Vec::with_capacity(64);
        let exit = loop {
            let received = next_command(&rx, self.trim_due().then_some(IDLE_BEFORE_TRIM));
            match received {
                Ok(command) => group.push(command),
                Err(RecvTimeoutError::Timeout) => {
                    self.return_free_memory();
                    continue;
                }
                // Every handle is gone: finish like a shutdown.
                Err(RecvTimeoutError::Disconnected) => break Exit::Shutdown(None),
            }
            fill(&rx, &mut group);
            let applied = match self.apply_group(&mut group) {
                Ok(applied) => applied,
                Err(()) => break Exit::Failed,
            };
            if applied.flush && self.flush_and_report().is_err() {
                break Exit::Failed;
            }
            if let Some(reply) = applied.shutdown {
                break Exit::Shutdown(Some(reply));
            }
        };
        self.finish(exit);
    }

    fn finish(mut self, exit: Exit) {
        // The snapshot thread reads the store: it ends first.
        self.stop_snapshot_thread(true);
        match exit {
            Exit::Shutdown(reply) => {
                if self.flush_and_report().is_ok() {
                    info!(
                        end_offset = self.store.end_offset(),
                        "storage thread stopped; log flushed"
                    );
                    if let Some(reply) = reply {
                        let _ = reply.send(());
                    }
                }
            }
            Exit::Failed => error!("storage thread stopped after a storage error"),
        }
    }

    /// Applies one group in order, without its flush; stops at a Shutdown
    /// (later commands of the group are dropped).
    fn apply_group(&mut self, group: &mut Vec<Command>) -> Result<Applied, ()> {
        let mut flush_requested = false;
        let mut commands = group.drain(..);
        for command in commands.by_ref() {
            match command {
                Command::Append(batch) => {
                    let base = batch.base_offset;
                    check(&self.events, self.store.append(&batch), || {
                        format!("append of the batch at offset {base}")
                    })?;
                    self.mutations += 1;
                    self.counters.appended_batches.fetch_add(1, Ordering::Relaxed);
                    self.counters
                        .appended_bytes
                        .fetch_add(batch.size_bytes() as u64, Ordering::Relaxed);
                }
                Command::Truncate(end_offset) => {
                    check(&self.events, self.store.truncate(end_offset), || {
                        format!("truncation to offset {end_offset}")
                    })?;
                    self.mutations += 1;
                }
                Command::Flush => flush_requested = true,
                Command::WriteElection(state, reply) => {
                    // Durable when write_election_state returns (LogStore contract).
                    check(&self.events, self.store.write_election_state(&state), || {
                        format!("write of election state {state:?}")
                    })?;
                    let _ = reply.send(());
                }
                Command::Read {
                    from,
                    until,
                    max_bytes,
                    reply,
                } => {
                    // A read that fails is answered with the error (the
                    // reader decides whether to retry); it never stops the
                    // node.
                    let start = self.store.start_offset();
                    let read = if from < start {
                        let latest = self.snapshots.latest;
                        let until = until.min(start);
                        match &self.chunks {
                            // The snapshot never changes: read it beside
                            // this thread, which it would hold up for the
                            // validation of a whole file at first.
                            Some(chunks) => {
                                let below = ChunkRead::Below {
                                    latest,
                                    from,
                                    until,
                                    max_bytes,
                                    reply,
                                };
                                if let Err(e) = try_send_bounded(chunks, below) {
                                    e.into_inner().refuse("the snapshot reader is overloaded or stopped");
                                }
                                continue;
                            }
                            None => self.snapshots.chunks.read_below(latest, from, until, max_bytes),
                        }
                    } else {
                        self.store.read(from, until, max_bytes).map_err(|e| e.to_string())
                    };
                    match &read {
                        Ok(batches) => self.read_bytes += batches.iter().map(|b| b.size_bytes() as u64).sum::<u64>(),
                        Err(e) => warn!("read of [{from}, {until}) failed: {e}"),
                    }
                    // A closed receiver means the reader went away.
                    let _ = reply.send(read);
                }
                Command::SetHighWatermarkHint(hw) => {
                    check(&self.events, self.store.set_high_watermark_hint(hw), || {
                        format!("high-watermark hint {hw}")
                    })?;
                }
                Command::CreateSnapshot { id, previous, reply } => self.create_snapshot(id, previous, reply),
                Command::ReadSnapshotChunk {
                    id,
                    position,
                    max_bytes,
                    reply,
                } => {
                    let _ = reply.send(self.snapshots.chunks.read_chunk(id, position, max_bytes));
                }
                Command::WriteSnapshotChunk {
                    id,
                    size,
                    position,
                    bytes,
                    written,
                } => {
                    self.snapshots.write_chunk(id, size, position, &bytes);
                    let _ = written.send(());
                }
                Command::InstallSnapshot { id, reply } => match self.finish_install(id) {
                    Ok(meta) => {
                        // Older snapshots end below the new log start.
                        self.snapshots.delete_older_than(id);
                        // The snapshot is durable; now the log restarts at its end.
                        check(&self.events, self.store.reset(id.end_offset, id.epoch), || {
                            format!("reset of the log to snapshot {id:?}")
                        })?;
                        // Durable on return, so not a mutation a later flush
                        // report must cover.
                        let _ = reply.send(Ok(meta));
                    }
                    Err(e) => {
                        let _ = reply.send(Err(e));
                    }
                },
                Command::DeleteSnapshot(id) => {
                    if let Ok(dir) = self.snapshots.dir() {
                        if let Err(e) = snapshot::delete(dir, id) {
                            warn!("cannot delete snapshot {id:?}: {e}");
                        }
                    }
                }
                Command::DeleteBefore(snapshot) => {
                    let offset = snapshot.end_offset;
                    if self.snapshots.latest.is_none_or(|l| l.end_offset < offset) {
                        // Written on the snapshot thread: from now on it
                        // answers the reads below the log start.
                        self.snapshots.use_latest(snapshot);
                    }
                    check(&self.events, self.store.delete_before(offset), || {
                        format!("compaction of the log below {offset}")
                    })?;
                    storage::return_free_memory();
                }
                Command::Shutdown(reply) => {
                    let dropped = commands.count();
                    if dropped > 0 {
                        debug!(dropped, "commands queued after Shutdown are dropped");
                    }
                    // The final flush comes with the shutdown itself.
                    return Ok(Applied {
                        flush: false,
                        shutdown: Some(reply),
                    });
                }
            }
        }
        Ok(Applied {
            flush: flush_requested,
            shutdown: None,
        })
    }

    /// Writes the snapshot `id` on a thread of its own when the store can
    /// be read from there, else here. Only committed and flushed offsets
    /// are read, which no later command changes: appends go on meanwhile,
    /// and a truncation never reaches below the high watermark. The reply
    /// comes from whichever thread wrote it.
    fn create_snapshot(
        &mut self,
        id: SnapshotId,
        previous: Option<SnapshotId>,
        reply: oneshot::Sender<Result<SnapshotMeta, String>>,
    ) {
        // The QuorumState actor writes one at a time: an earlier one has
        // answered already, and its thread is ending if not gone.
        self.stop_snapshot_thread(false);
        let (dir, reader) = match (self.snapshots.dir(), self.store.shared_reader()) {
            (Ok(dir), Some(reader)) => (dir.clone(), reader),
            _ => {
                let _ = reply.send(self.snapshots.create(&*self.store, id, previous));
                return;
            }
        };
        if let Err(e) = check_snapshot_reaches(previous, self.store.start_offset()) {
            let _ = reply.send(Err(e));
            return;
        }
        let cancel = Arc::new(AtomicBool::new(false));
        let cancelled = cancel.clone();
        let spawned = std::thread::Builder::new().name(self.name.clone()).spawn(move || {
            let read = |from, until, max| reader.read(from, until, max);
            let written = write_snapshot(&dir, id, previous, &read, &cancelled);
            drop(reader);
            storage::return_free_memory();
            let _ = reply.send(written);
        });
        match spawned {
            Ok(thread) => self.snapshot_thread = Some(SnapshotThread { cancel, thread }),
            // The reply went with the closure: the requester sees the
            // snapshot abandoned.
            Err(e) => error!(?id, "cannot start a thread to write the snapshot: {e}"),
        }
    }

    fn stop_snapshot_thread(&mut self, cancel: bool) {
        if let Some(thread) = self.snapshot_thread.take() {
            thread.stop(cancel);
        }
    }

    /// Installs the snapshot fetched from the leader. A snapshot still being
    /// written here is given up first: the log it reads is about to be
    /// replaced.
    fn finish_install(&mut self, id: SnapshotId) -> Result<SnapshotMeta, String> {
        self.stop_snapshot_thread(true);
        self.snapshots.finish_install(id)
    }

    /// One durability point for the whole group, then the report.
    fn flush_and_report(&mut self) -> Result<(), ()> {
        let started = Instant::now();
        check(&self.events, self.store.flush(), || "flush".to_string())?;
        let took = started.elapsed().as_nanos().try_into().unwrap_or(u64::MAX);
        self.counters.flushes.fetch_add(1, Ordering::Relaxed);
        self.counters.flush_nanos.fetch_add(took, Ordering::Relaxed);
        let event = StorageEvent::Flushed {
            durable_end: self.store.end_offset(),
            mutations: self.mutations,
        };
        // A closed receiver means the QuorumState actor has stopped; the
        // write is durable all the same and nobody is left to tell.
        let _ = self.events.send(event);
        Ok(())
    }

    /// True once enough was appended or read since freed memory was last
    /// handed back: the thread then does so when it finds itself idle for
    /// [`IDLE_BEFORE_TRIM`]. Batches cross threads (decoded on the actor
    /// thread and freed here after their write; read here and freed there
    /// after they were sent), and glibc keeps what is freed in the arena it
    /// came from: a follower that caught up on 8 MiB fetch answers kept ~70
    /// MiB it no longer used, and so did a leader serving them. Only when
    /// idle, because a trim takes 10-80 ms here (measured in `bench
    /// embedded`), and nothing may wait for it.
    fn trim_due(&self) -> bool {
        let moved = self.counters.appended_bytes.load(Ordering::Relaxed) + self.read_bytes;
        moved.saturating_sub(self.trimmed_at_bytes) >= TRIM_EVERY_BYTES
    }

    fn return_free_memory(&mut self) {
        storage::return_free_memory();
        self.trimmed_at_bytes = self.counters.appended_bytes.load(Ordering::Relaxed) + self.read_bytes;
    }
}

/// See [`StorageThread::trim_due`].
const IDLE_BEFORE_TRIM: Duration = Duration::from_millis(200);

/// Passes a success through; on a storage error logs it loudly, reports it
/// to the QuorumState actor and tells the caller to stop the thread.
fn check<T>(
    events: &mpsc::UnboundedSender<StorageEvent>,
    result: Result<T, StorageError>,
    what: impl FnOnce() -> String,
) -> Result<T, ()> {
    result.map_err(|e| {
        let message = format!("storage failure during {}: {e}", what());
        error!("FATAL: {message}; the node stops");
        let _ = events.send(StorageEvent::Failed(message));
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::messages::Record;
    use crate::storage::MemoryStore;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{Arc, Mutex};

    #[test]
    fn a_command_queue_refuses_past_its_bound_and_takes_again_once_drained() {
        let (tx, rx) = command_queue::<usize>();
        for i in 0..MAX_QUEUED_COMMANDS {
            try_send_bounded(&tx, i).unwrap();
        }
        match try_send_bounded(&tx, MAX_QUEUED_COMMANDS) {
            Err(TrySendError::Full(refused)) => assert_eq!(refused, MAX_QUEUED_COMMANDS),
            other => panic!("a full queue took a command: {other:?}"),
        }
        assert_eq!(rx.recv().unwrap(), 0);
        try_send_bounded(&tx, MAX_QUEUED_COMMANDS).unwrap();

        let (tx, rx) = command_queue::<usize>();
        drop(rx);
        assert!(matches!(try_send_bounded(&tx, 0), Err(TrySendError::Disconnected(0))));
    }

    /// (entered, release): the next flush says it started on `entered`,
    /// then waits for a token on `release` (or for its sender to drop).
    /// Shared, so that a test can arm it after the store moved to its thread.
    pub(crate) type FlushGate = Arc<Mutex<Option<(std::sync::mpsc::Sender<()>, std::sync::mpsc::Receiver<()>)>>>;

    /// A store (a memory store unless replaced) that counts flushes, can
    /// hold a flush until released (to queue commands behind it
    /// deterministically) and can be told to fail appends or flushes.
    pub(crate) struct TestStore {
        inner: Box<dyn LogStore>,
        flushes: Arc<AtomicUsize>,
        pub(crate) gate: FlushGate,
        fail_appends: bool,
        fail_flushes: bool,
        hints: Arc<Mutex<Vec<Offset>>>,
        /// What [`AppenderStore::shared_reader`] reads, if it has one.
        shared: Option<Arc<SharedTestLog>>,
    }

    /// The log as another thread reads it: a copy of every append. Each
    /// read returns the one batch holding `from`, after saying so on
    /// `entered` and waiting for a token on `release` (or for `release` to
    /// be dropped).
    struct SharedTestLog {
        batches: Mutex<Vec<Batch>>,
        entered: Mutex<std::sync::mpsc::Sender<()>>,
        release: Mutex<std::sync::mpsc::Receiver<()>>,
    }

    struct SharedTestReader(Arc<SharedTestLog>);

    impl SharedLogReader for SharedTestReader {
        fn read(&self, from: Offset, _until: Offset, _max_bytes: usize) -> storage::Result<Vec<Batch>> {
            let _ = self.0.entered.lock().unwrap().send(());
            let _ = self.0.release.lock().unwrap().recv();
            let batches = self.0.batches.lock().unwrap();
            Ok(batches
                .iter()
                .filter(|b| b.base_offset <= from && from < b.next_offset())
                .cloned()
                .collect())
        }
    }

    impl LogStore for TestStore {
        fn election_state(&self) -> storage::Result<ElectionState> {
            self.inner.election_state()
        }
        fn write_election_state(&mut self, state: &ElectionState) -> storage::Result<()> {
            self.inner.write_election_state(state)
        }
        fn append(&mut self, batch: &Batch) -> storage::Result<()> {
            if self.fail_appends {
                return Err(StorageError::Io(std::io::Error::other("disk on fire")));
            }
            if let Some(shared) = &self.shared {
                shared.batches.lock().unwrap().push(batch.clone());
            }
            self.inner.append(batch)
        }
        fn truncate(&mut self, end_offset: Offset) -> storage::Result<()> {
            self.inner.truncate(end_offset)
        }
        fn flush(&mut self) -> storage::Result<()> {
            let gate = self.gate.lock().unwrap().take();
            if let Some((entered, release)) = gate {
                let _ = entered.send(());
                let _ = release.recv();
            }
            self.flushes.fetch_add(1, Ordering::SeqCst);
            if self.fail_flushes {
                return Err(StorageError::Io(std::io::Error::other("fdatasync failed")));
            }
            self.inner.flush()
        }
        fn read(&self, from: Offset, until: Offset, max_bytes: usize) -> storage::Result<Vec<Batch>> {
            self.inner.read(from, until, max_bytes)
        }
        fn delete_before(&mut self, offset: Offset) -> storage::Result<()> {
            self.inner.delete_before(offset)
        }
        fn reset(&mut self, start_offset: Offset, start_epoch: Epoch) -> storage::Result<()> {
            self.inner.reset(start_offset, start_epoch)
        }
        fn start_offset(&self) -> Offset {
            self.inner.start_offset()
        }
        fn start_epoch(&self) -> Epoch {
            self.inner.start_epoch()
        }
        fn end_offset(&self) -> Offset {
            self.inner.end_offset()
        }
        fn epoch_cache(&self) -> Vec<(Epoch, Offset)> {
            self.inner.epoch_cache()
        }
    }

    impl AppenderStore for TestStore {
        fn set_high_watermark_hint(&mut self, hw: Offset) -> storage::Result<()> {
            self.hints.lock().unwrap().push(hw);
            Ok(())
        }

        fn shared_reader(&self) -> Option<Box<dyn SharedLogReader>> {
            let shared = self.shared.clone()?;
            Some(Box::new(SharedTestReader(shared)))
        }
    }

    /// A [`TestStore`] over a memory store, and its flush count.
    pub(crate) fn store() -> (TestStore, Arc<AtomicUsize>) {
        let flushes = Arc::new(AtomicUsize::new(0));
        let store = TestStore {
            inner: Box::new(MemoryStore::new()),
            flushes: flushes.clone(),
            gate: Arc::default(),
            fail_appends: false,
            fail_flushes: false,
            hints: Arc::default(),
            shared: None,
        };
        (store, flushes)
    }

    /// A store with a shared reader: `entered` hears of every read it
    /// starts, `release` lets one go on (dropping it lets all go on).
    fn shared_store() -> (TestStore, std::sync::mpsc::Receiver<()>, std::sync::mpsc::Sender<()>) {
        let (entered_tx, entered) = std::sync::mpsc::channel();
        let (release, release_rx) = std::sync::mpsc::channel();
        let (mut store, _) = store();
        store.shared = Some(Arc::new(SharedTestLog {
            batches: Mutex::default(),
            entered: Mutex::new(entered_tx),
            release: Mutex::new(release_rx),
        }));
        (store, entered, release)
    }

    /// The next event, or None after `LIVENESS_WAIT` (a hang, not a
    /// timing check).
    fn next_event(events: &mut mpsc::UnboundedReceiver<StorageEvent>) -> Option<StorageEvent> {
        let deadline = Instant::now() + LIVENESS_WAIT;
        while Instant::now() < deadline {
            match events.try_recv() {
                Ok(event) => return Some(event),
                Err(mpsc::error::TryRecvError::Empty) => std::thread::sleep(Duration::from_millis(5)),
                Err(mpsc::error::TryRecvError::Disconnected) => return None,
            }
        }
        None
    }

    /// How long a test waits for something that must happen before it
    /// calls it a hang.
    const LIVENESS_WAIT: Duration = Duration::from_secs(30);

    /// A storage thread over [`shared_store`] with snapshot files in a
    /// fresh directory, holding [0, 4) flushed (its flush event taken).
    #[allow(clippy::type_complexity)]
    fn flushed_shared_appender() -> (
        tempfile::TempDir,
        LogAppender,
        JoinHandle<()>,
        mpsc::UnboundedReceiver<StorageEvent>,
        std::sync::mpsc::Receiver<()>,
        std::sync::mpsc::Sender<()>,
    ) {
        let dir = tempfile::tempdir().unwrap();
        let (store, entered, release) = shared_store();
        let (events, mut events_rx) = mpsc::unbounded_channel();
        let (appender, thread) = LogAppender::spawn(1, Box::new(store), Some(dir.path().into()), events).unwrap();
        appender.append(batch(0, 1, 2)).unwrap();
        appender.append(batch(2, 1, 2)).unwrap();
        appender.flush().unwrap();
        assert!(matches!(
            next_event(&mut events_rx),
            Some(StorageEvent::Flushed { durable_end: 4, .. })
        ));
        (dir, appender, thread, events_rx, entered, release)
    }

    #[test]
    fn appends_and_flushes_go_on_while_a_snapshot_is_written() {
        let (_dir, appender, thread, mut events_rx, entered, release) = flushed_shared_appender();

        let id = SnapshotId {
            end_offset: 4,
            epoch: 1,
        };
        let mut created = appender.create_snapshot(id, None).unwrap();
        entered
            .recv_timeout(LIVENESS_WAIT)
            .expect("the snapshot is read through the shared reader");
        // The snapshot's read is held; the log goes on.
        appender.append(batch(4, 1, 1)).unwrap();
        appender.flush().unwrap();
        assert_eq!(
            next_event(&mut events_rx),
            Some(StorageEvent::Flushed {
                durable_end: 5,
                mutations: 3
            }),
            "the flush did not wait for the snapshot"
        );
        assert!(created.try_recv().is_err(), "the snapshot is still being written");

        drop(release);
        let meta = block_on(created).unwrap().expect("written");
        let reader = SnapshotReader::open(&meta.path).unwrap();
        let bases: Vec<Offset> = reader.batches().map(|b| b.unwrap().base_offset).collect();
        assert_eq!(bases, vec![0, 2], "the log up to its end, not what came after");
        block_on(appender.shutdown().unwrap()).unwrap();
        thread.join().unwrap();
    }

    #[test]
    fn shutdown_waits_for_the_snapshot_thread() {
        let (dir, appender, thread, _events_rx, entered, release) = flushed_shared_appender();
        let id = SnapshotId {
            end_offset: 4,
            epoch: 1,
        };
        let mut created = appender.create_snapshot(id, None).unwrap();
        entered.recv_timeout(LIVENESS_WAIT).unwrap();
        let shutdown = appender.shutdown().unwrap();
        let releaser = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(200));
            drop(release);
        });
        block_on(shutdown).unwrap();
        // The store (which the snapshot thread reads) is closed only after
        // that thread has ended, so its answer is in already.
        let answer = created.try_recv().expect("answered before the shutdown finished");
        if let Err(e) = answer {
            assert!(e.contains("cancelled"), "{e}");
        }
        thread.join().unwrap();
        releaser.join().unwrap();
        let part_files = std::fs::read_dir(dir.path())
            .unwrap()
            .filter(|e| e.as_ref().unwrap().file_name().to_string_lossy().ends_with(".part"))
            .count();
        assert_eq!(part_files, 0, "no partial snapshot is left behind");
    }

    /// A snapshot copied from the log hands freed memory back every
    /// SNAPSHOT_TRIM_EVERY_BYTES it writes.
    #[test]
    fn a_snapshot_hands_freed_memory_back_every_8_mib() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = MemoryStore::new();
        let record_bytes = 256 << 10;
        let records: Vec<Record> = (0..4u8).map(|i| Record::Data(vec![i; record_bytes])).collect();
        // 40 batches of 1 MiB: 40 MiB of snapshot.
        for _ in 0..40 {
            store.append(&Batch::new(store.end_offset(), 1, &records)).unwrap();
        }
        let id = SnapshotId {
            end_offset: store.end_offset(),
            epoch: 1,
        };
        let read = |from, until, max| store.read(from, until, max);
        let trims_before = storage::trims_on_this_thread();
        let meta = write_snapshot(dir.path(), id, None, &read, &NOT_CANCELLED).unwrap();
        let trims = storage::trims_on_this_thread() - trims_before;
        assert!(meta.size_bytes >= 40 << 20, "{meta:?}");
        assert_eq!(trims, meta.size_bytes / SNAPSHOT_TRIM_EVERY_BYTES, "{meta:?}");
        assert_eq!(trims, 5);
    }

    #[test]
    fn a_cancelled_snapshot_stops_and_removes_its_partial_file() {
        let dir = tempfile::tempdir().unwrap();
        let cancel = AtomicBool::new(false);
        let id = SnapshotId {
            end_offset: 4,
            epoch: 1,
        };
        let read = |from: Offset, _until: Offset, _max: usize| {
            cancel.store(true, Ordering::Relaxed);
            Ok(vec![batch(from, 1, 2)])
        };
        let error = write_snapshot(dir.path(), id, None, &read, &cancel).expect_err("cancelled");
        assert!(error.contains("cancelled"), "{error}");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0, "nothing left");
    }

    /// A storage thread with snapshots in `dir`, held inside the flush of
    /// its first batch until `release` is dropped.
    fn held_in_a_flush(
        dir: &Path,
    ) -> (
        LogAppender,
        JoinHandle<()>,
        std::sync::mpsc::Sender<()>,
        mpsc::UnboundedReceiver<StorageEvent>,
    ) {
        let (store, _) = store();
        let (entered_tx, entered) = std::sync::mpsc::channel();
        let (release, gate) = std::sync::mpsc::channel::<()>();
        *store.gate.lock().unwrap() = Some((entered_tx, gate));
        let (events, events_rx) = mpsc::unbounded_channel();
        let (appender, thread) = LogAppender::spawn(1, Box::new(store), Some(dir.into()), events).unwrap();
        appender.append(batch(0, 1, 2)).unwrap();
        appender.flush().unwrap();
        entered.recv_timeout(LIVENESS_WAIT).expect("the flush started");
        (appender, thread, release, events_rx)
    }

    #[test]
    fn snapshot_chunks_are_served_while_the_storage_thread_is_held_in_a_flush() {
        let dir = tempfile::tempdir().unwrap();
        let id = SnapshotId {
            end_offset: 4,
            epoch: 1,
        };
        // One storage thread writes the snapshot...
        {
            let (store, _) = store();
            let (events, mut events_rx) = mpsc::unbounded_channel();
            let (appender, thread) = LogAppender::spawn(1, Box::new(store), Some(dir.path().into()), events).unwrap();
            appender.append(batch(0, 1, 2)).unwrap();
            appender.append(batch(2, 1, 2)).unwrap();
            appender.flush().unwrap();
            next_event(&mut events_rx).unwrap();
            block_on(appender.create_snapshot(id, None).unwrap()).unwrap().unwrap();
            block_on(appender.shutdown().unwrap()).unwrap();
            thread.join().unwrap();
        }
        let file = std::fs::read(snapshot::path_of(dir.path(), id)).unwrap();

        // ...and the next one serves it while its flush hangs.
        let (appender, thread, release, mut events_rx) = held_in_a_flush(dir.path());
        let mut reply = appender.read_snapshot_chunk(id, 0, 1 << 20).unwrap();
        let deadline = Instant::now() + LIVENESS_WAIT;
        let chunk = loop {
            match reply.try_recv() {
                Ok(chunk) => break chunk.expect("the snapshot is there"),
                Err(oneshot::error::TryRecvError::Empty) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(5))
                }
                Err(e) => panic!("no chunk while the storage thread is held in a flush: {e:?}"),
            }
        };
        assert_eq!(
            (chunk.size, chunk.bytes.as_slice()),
            (file.len() as u64, file.as_slice())
        );
        // A file that is not there is an error, not a hang.
        let missing = SnapshotId {
            end_offset: 8,
            epoch: 1,
        };
        assert!(block_on(appender.read_snapshot_chunk(missing, 0, 1 << 20).unwrap())
            .unwrap()
            .is_err());

        drop(release);
        assert!(matches!(
            next_event(&mut events_rx),
            Some(StorageEvent::Flushed { durable_end: 2, .. })
        ));
        block_on(appender.shutdown().unwrap()).unwrap();
        thread.join().unwrap();
    }

    #[test]
    fn a_fetched_snapshot_chunk_is_reported_written_only_once_it_is_in_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let id = SnapshotId {
            end_offset: 4,
            epoch: 1,
        };
        let (appender, thread, release, mut events_rx) = held_in_a_flush(dir.path());

        // Queued behind the held flush: not written, and not reported.
        let bytes = vec![5u8; 4096];
        let mut written = appender.write_snapshot_chunk(id, 1 << 20, 0, bytes.clone()).unwrap();
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(written.try_recv(), Err(oneshot::error::TryRecvError::Empty));

        drop(release);
        block_on(written).expect("reported once written");
        let part = dir.path().join(format!("{}.part", snapshot::file_name(id)));
        assert_eq!(std::fs::read(&part).unwrap(), bytes, "the chunk is in the file");
        assert!(matches!(
            next_event(&mut events_rx),
            Some(StorageEvent::Flushed { durable_end: 2, .. })
        ));
        block_on(appender.shutdown().unwrap()).unwrap();
        thread.join().unwrap();
    }

    /// The chunk thread closes its file once idle: one the cleaner deleted
    /// meanwhile frees its disk space (Linux: `/proc/self/fd`).
    #[cfg(target_os = "linux")]
    #[test]
    fn an_idle_chunk_server_closes_the_snapshot_it_served() {
        let dir = tempfile::tempdir().unwrap();
        let id = SnapshotId {
            end_offset: 2,
            epoch: 1,
        };
        let mut writer = SnapshotWriter::create(dir.path(), id, 0).unwrap();
        writer.append_batch(&batch(0, 1, 2)).unwrap();
        writer.freeze().unwrap();
        let path = snapshot::path_of(dir.path(), id);
        // An open file's link; a deleted one's reads "<path> (deleted)".
        let held_open = || {
            std::fs::read_dir("/proc/self/fd").unwrap().any(|fd| {
                std::fs::read_link(fd.unwrap().path())
                    .is_ok_and(|target| target.to_string_lossy().starts_with(&*path.to_string_lossy()))
            })
        };
        let chunks = ChunkServer::spawn(1, dir.path().into(), Duration::from_secs(2)).unwrap();
        let (reply, answer) = oneshot::channel();
        chunks
            .send(ChunkRead::Chunk {
                id,
                position: 0,
                max_bytes: 1 << 20,
                reply,
            })
            .unwrap();
        assert!(block_on(answer).unwrap().is_ok());
        assert!(held_open(), "served, so open (for the idle time)");
        snapshot::delete(dir.path(), id).unwrap();
        let deadline = Instant::now() + LIVENESS_WAIT;
        while held_open() {
            assert!(Instant::now() < deadline, "the deleted snapshot is still open");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Reads below the log start come from the newest snapshot, read beside
    /// the storage thread: one that takes long (the first opens and
    /// validates the whole file) does not hold up the log's writes and
    /// flushes. Here the "snapshot" is a FIFO, whose open waits for a writer.
    #[cfg(target_os = "linux")]
    #[test]
    fn a_read_below_the_log_start_does_not_hold_up_the_log() {
        let dir = tempfile::tempdir().unwrap();
        let id = SnapshotId {
            end_offset: 4,
            epoch: 1,
        };
        let path = snapshot::path_of(dir.path(), id);
        let made = std::process::Command::new("mkfifo").arg(&path).status().unwrap();
        assert!(made.success());
        // The log starts at the snapshot's end.
        let (mut store, _) = store();
        store.inner.reset(4, 1).unwrap();
        let (events, mut events_rx) = mpsc::unbounded_channel();
        let (appender, thread) = LogAppender::spawn(1, Box::new(store), Some(dir.path().into()), events).unwrap();
        let below = appender.read(0, 4, 1 << 20).unwrap();
        appender.append(batch(4, 1, 1)).unwrap();
        appender.flush().unwrap();
        assert!(
            matches!(
                next_event(&mut events_rx),
                Some(StorageEvent::Flushed { durable_end: 5, .. })
            ),
            "the flush waited for the read below the log start"
        );
        // A writer lets the open go on; the empty "snapshot" is refused.
        drop(std::fs::OpenOptions::new().write(true).open(&path).unwrap());
        assert!(block_on(below).unwrap().is_err());
        block_on(appender.shutdown().unwrap()).unwrap();
        thread.join().unwrap();
    }

    #[test]
    fn reads_below_the_log_start_use_the_snapshot_it_was_compacted_to() {
        let dir = tempfile::tempdir().unwrap();
        let (store, _entered, release) = shared_store();
        drop(release);
        let (events, mut events_rx) = mpsc::unbounded_channel();
        let (appender, thread) = LogAppender::spawn(1, Box::new(store), Some(dir.path().into()), events).unwrap();
        let mut previous = None;
        for end in [4, 8] {
            appender.append(batch(end - 4, 1, 2)).unwrap();
            appender.append(batch(end - 2, 1, 2)).unwrap();
            appender.flush().unwrap();
            next_event(&mut events_rx).unwrap();
            let id = SnapshotId {
                end_offset: end,
                epoch: 1,
            };
            block_on(appender.create_snapshot(id, previous).unwrap())
                .unwrap()
                .unwrap();
            appender.delete_before(id).unwrap();
            let below = block_on(appender.read(end - 4, end, 1 << 20).unwrap()).unwrap();
            let bases: Vec<Offset> = below
                .expect("answered from the snapshot")
                .iter()
                .map(|b| b.base_offset)
                .collect();
            assert_eq!(bases, vec![end - 4, end - 2]);
            previous = Some(id);
        }
        block_on(appender.shutdown().unwrap()).unwrap();
        thread.join().unwrap();
    }

    fn batch(base: Offset, epoch: Epoch, n: usize) -> Batch {
        let records: Vec<Record> = (0..n).map(|i| Record::Data(vec![i as u8])).collect();
        Batch::new(base, epoch, &records)
    }

    fn block_on<F: std::future::Future>(f: F) -> F::Output {
        futures::executor::block_on(f)
    }

    #[test]
    fn commands_apply_in_order_and_reads_see_earlier_appends_before_any_flush() {
        let (store, flushes) = store();
        let (events, mut events_rx) = mpsc::unbounded_channel();
        let (appender, thread) = LogAppender::spawn(1, Box::new(store), None, events).unwrap();
        appender.append(batch(0, 1, 2)).unwrap();
        appender.append(batch(2, 1, 1)).unwrap();
        let read = appender.read(0, 3, 1 << 20).unwrap();
        let batches = block_on(read).unwrap().unwrap();
        assert_eq!(batches.iter().map(|b| b.base_offset).collect::<Vec<_>>(), vec![0, 2]);
        assert_eq!(flushes.load(Ordering::SeqCst), 0, "a read does not wait for a flush");

        appender.truncate(2).unwrap();
        appender.append(batch(2, 2, 3)).unwrap();
        appender.flush().unwrap();
        let event = block_on(events_rx.recv()).unwrap();
        assert_eq!(
            event,
            StorageEvent::Flushed {
                durable_end: 5,
                mutations: 4
            }
        );
        let batches = block_on(appender.read(2, 5, 1 << 20).unwrap()).unwrap().unwrap();
        assert_eq!(batches.len(), 1);
        assert_eq!(
            batches[0].epoch, 2,
            "the read sees the truncation and the append after it"
        );

        let durable = appender
            .write_election(ElectionState {
                epoch: 2,
                voted_for: Some(1),
                leader_id: None,
            })
            .unwrap();
        block_on(durable).expect("election state written");
        block_on(appender.shutdown().unwrap()).unwrap();
        thread.join().unwrap();
    }

    /// Dropping the last handle ends the storage thread like a shutdown:
    /// it flushes what it holds first.
    #[test]
    fn the_storage_thread_flushes_and_ends_once_every_handle_is_dropped() {
        let (store, flushes) = store();
        let (events, mut events_rx) = mpsc::unbounded_channel();
        let (appender, thread) = LogAppender::spawn(1, Box::new(store), None, events).unwrap();
        let other = appender.clone();
        appender.append(batch(0, 1, 2)).unwrap();
        // The thread has applied the append and waits again once a read
        // behind it is answered.
        block_on(appender.read(0, 2, 1 << 20).unwrap()).unwrap().unwrap();
        drop(appender);
        drop(other);
        let (ended_tx, ended_rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || ended_tx.send(thread.join().is_ok()));
        let ended = ended_rx.recv_timeout(Duration::from_secs(60));
        assert_eq!(ended, Ok(true), "the storage thread must end once its handles are gone");
        assert_eq!(flushes.load(Ordering::SeqCst), 1, "it flushes what it holds first");
        assert_eq!(
            block_on(events_rx.recv()),
            Some(StorageEvent::Flushed {
                durable_end: 2,
                mutations: 1
            })
        );
    }

    /// The storage thread parks whenever its queue is empty (it does not
    /// spin or yield first), so every push must wake it, and so must the
    /// drop of the last handle: a flush asked of a parked thread is done,
    /// round after round, and the thread ends with its handles.
    #[test]
    fn a_parked_storage_thread_wakes_for_every_push_and_for_its_last_handle() {
        let (store, flushes) = store();
        let (events, mut events_rx) = mpsc::unbounded_channel();
        let (appender, thread) = LogAppender::spawn(1, Box::new(store), None, events).unwrap();
        for round in 0..3i64 {
            // Time for the thread to park (it parks either way; a shorter
            // wait only tests the path where the push comes first).
            std::thread::sleep(Duration::from_millis(20));
            appender.append(batch(round * 2, 1, 2)).unwrap();
            appender.flush().unwrap();
            assert!(
                matches!(
                    next_event(&mut events_rx),
                    Some(StorageEvent::Flushed { durable_end, .. }) if durable_end == round * 2 + 2
                ),
                "round {round}: the parked thread did not take the flush"
            );
        }
        std::thread::sleep(Duration::from_millis(20));
        drop(appender);
        let (ended_tx, ended_rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || ended_tx.send(thread.join().is_ok()));
        assert_eq!(
            ended_rx.recv_timeout(LIVENESS_WAIT),
            Ok(true),
            "the parked thread must end with its last handle"
        );
        // The three asked for, and the one every thread makes as it ends.
        assert_eq!(flushes.load(Ordering::SeqCst), 4);
    }

    #[test]
    fn next_command_times_out_and_sees_the_queue_disconnected() {
        let (tx, rx) = command_queue::<u32>();
        assert_eq!(
            next_command(&rx, Some(Duration::from_millis(5))),
            Err(RecvTimeoutError::Timeout)
        );
        tx.send(7).unwrap();
        assert_eq!(
            next_command(&rx, Some(Duration::ZERO)),
            Ok(7),
            "a queued command comes before any wait"
        );
        drop(tx);
        assert_eq!(next_command(&rx, None), Err(RecvTimeoutError::Disconnected));
    }

    #[test]
    fn flushes_queued_behind_a_flush_in_progress_become_one_group_commit() {
        let (store, flushes) = store();
        let (release, gate) = std::sync::mpsc::channel();
        let (entered_tx, entered) = std::sync::mpsc::channel();
        *store.gate.lock().unwrap() = Some((entered_tx, gate));
        let (events, mut events_rx) = mpsc::unbounded_channel();
        let (appender, thread) = LogAppender::spawn(1, Box::new(store), None, events).unwrap();

        appender.append(batch(0, 1, 1)).unwrap();
        appender.flush().unwrap();
        // The thread is inside the first flush: what follows queues up.
        entered.recv().unwrap();
        for i in 1..=10 {
            appender.append(batch(i, 1, 1)).unwrap();
            appender.flush().unwrap();
        }
        release.send(()).unwrap();
        assert_eq!(
            block_on(events_rx.recv()).unwrap(),
            StorageEvent::Flushed {
                durable_end: 1,
                mutations: 1
            }
        );
        assert_eq!(
            block_on(events_rx.recv()).unwrap(),
            StorageEvent::Flushed {
                durable_end: 11,
                mutations: 11
            }
        );
        assert_eq!(
            flushes.load(Ordering::SeqCst),
            2,
            "ten queued flushes cost one store flush"
        );
        block_on(appender.shutdown().unwrap()).unwrap();
        thread.join().unwrap();
        assert!(events_rx.try_recv().is_ok(), "the shutdown flush is reported too");
    }

    #[test]
    fn a_storage_error_is_reported_and_stops_the_thread() {
        let (mut store, _) = store();
        store.fail_appends = true;
        let (events, mut events_rx) = mpsc::unbounded_channel();
        let (appender, thread) = LogAppender::spawn(1, Box::new(store), None, events).unwrap();
        appender.append(batch(0, 1, 1)).unwrap();
        let read = appender.read(0, 1, 1024).unwrap();
        match block_on(events_rx.recv()).unwrap() {
            StorageEvent::Failed(message) => assert!(message.contains("disk on fire"), "{message}"),
            other => panic!("expected a failure, got {other:?}"),
        }
        assert!(block_on(read).is_err(), "commands after the failure are not answered");
        thread.join().unwrap();
        assert_eq!(appender.flush(), Err(AppenderError::Stopped));
        assert!(block_on(events_rx.recv()).is_none(), "the thread is gone");
    }

    /// A chunked batch whose flush fails (DESIGN.md §4, STYLE.md §6): the
    /// failure is reported instead of a flush, so nothing is acknowledged
    /// as durable, and the thread stops.
    #[test]
    fn a_failed_flush_of_a_chunked_batch_is_reported_and_stops_the_thread() {
        let dir = tempfile::tempdir().unwrap();
        let (mut store, flushes) = store();
        store.inner = Box::new(crate::storage::SledStore::open(dir.path(), "c", 1).unwrap());
        store.fail_flushes = true;
        let (events, mut events_rx) = mpsc::unbounded_channel();
        let (appender, thread) = LogAppender::spawn(1, Box::new(store), None, events).unwrap();
        let chunked = Batch::new(
            0,
            1,
            &[Record::Data(vec![
                7;
                3 * crate::storage::sled_store::MAX_LOG_VALUE_BYTES
            ])],
        );
        appender.append(chunked.clone()).unwrap();
        let read = appender.read(0, 1, usize::MAX).unwrap();
        assert_eq!(
            block_on(read).unwrap(),
            Ok(vec![chunked]),
            "the append itself went through"
        );
        appender.flush().unwrap();
        match block_on(events_rx.recv()).unwrap() {
            StorageEvent::Failed(message) => {
                assert!(
                    message.contains("flush") && message.contains("fdatasync failed"),
                    "{message}"
                )
            }
            other => panic!("expected the failure, got {other:?}"),
        }
        thread.join().unwrap();
        assert_eq!(flushes.load(Ordering::SeqCst), 1, "no flush was tried again");
        assert!(
            block_on(events_rx.recv()).is_none(),
            "no event follows: nothing was flushed"
        );
        assert_eq!(appender.append(batch(1, 1, 1)), Err(AppenderError::Stopped));
    }

    #[test]
    fn a_failed_read_is_answered_with_its_error_and_the_thread_keeps_running() {
        let (store, _) = store();
        let (events, mut events_rx) = mpsc::unbounded_channel();
        let (appender, thread) = LogAppender::spawn(1, Box::new(store), None, events).unwrap();
        appender.append(batch(0, 1, 2)).unwrap();
        appender.append(batch(2, 1, 1)).unwrap();
        appender.flush().unwrap();
        block_on(events_rx.recv()).unwrap();
        appender
            .delete_before(SnapshotId {
                end_offset: 2,
                epoch: 1,
            })
            .unwrap();
        // Below the log start, and this node keeps no snapshot files.
        let failed = block_on(appender.read(0, 2, 1 << 20).unwrap()).expect("answered, not dropped");
        let error = failed.expect_err("nothing holds offset 0");
        assert!(error.contains("no snapshot files"), "{error}");
        let batches = block_on(appender.read(2, 3, 1 << 20).unwrap()).unwrap().unwrap();
        assert_eq!(batches[0].base_offset, 2, "the thread still serves reads");
        block_on(appender.shutdown().unwrap()).unwrap();
        thread.join().unwrap();
    }

    /// A snapshot of `n` offsets in batches of 2 records, each record
    /// holding its own offset (about 100 bytes).
    fn snapshot_of(dir: &std::path::Path, n: Offset) -> SnapshotId {
        let id = SnapshotId {
            end_offset: n,
            epoch: 1,
        };
        let mut writer = SnapshotWriter::create(dir, id, 0).unwrap();
        for base in (0..n).step_by(2) {
            let records: Vec<Record> = (base..(base + 2).min(n)).map(record_at).collect();
            writer.append(base, 1, &records).unwrap();
        }
        writer.freeze().unwrap();
        id
    }

    fn record_at(offset: Offset) -> Record {
        Record::Data(offset.to_be_bytes().repeat(12))
    }

    /// Checks that `batches` hold `from` first and are contiguous, with the
    /// right records; returns the offset after them.
    fn check_read(batches: &[Batch], from: Offset) -> Offset {
        let first = batches.first().expect("at least one batch");
        assert!(
            first.base_offset <= from && from < first.next_offset(),
            "read from {from}: {first:?}"
        );
        let mut next = first.base_offset;
        for batch in batches {
            assert_eq!(batch.base_offset, next, "contiguous");
            let expected: Vec<Record> = (next..batch.next_offset()).map(record_at).collect();
            assert_eq!(batch.records().unwrap(), expected);
            next = batch.next_offset();
        }
        next
    }

    #[test]
    fn alternating_readers_below_the_log_start_validate_the_snapshot_once() {
        let dir = tempfile::tempdir().unwrap();
        let end = 6_000;
        let id = snapshot_of(dir.path(), end);
        let mut files = ChunkServer::new(Some(dir.path().to_path_buf()));
        // Two listeners from offset 0, the second one starting later, take
        // turns reading pages of about 4 KiB: each read goes back to where
        // the other one stopped.
        let mut cursors: [Offset; 2] = [0, 0];
        let mut reads = 0;
        while cursors.iter().any(|c| *c < end) {
            for (i, cursor) in cursors.iter_mut().enumerate() {
                if *cursor >= end || (i == 1 && reads < 10) {
                    continue;
                }
                let batches = files.read_below(Some(id), *cursor, end, 4096).unwrap();
                *cursor = check_read(&batches, *cursor);
                reads += 1;
            }
        }
        assert!(reads > 200, "{reads} reads");
        // And reads anywhere, backwards too, including inside a batch.
        for from in [5_999, 1, 3_001, 0, 4_096, 2_047, 5_000, 17] {
            let batches = files.read_below(Some(id), from, end, 1).unwrap();
            check_read(&batches, from);
        }
        assert_eq!(files.validations, 1, "the snapshot is validated once, not per read");
    }

    #[test]
    fn the_high_watermark_hint_reaches_the_store() {
        let (store, _) = store();
        let hints = store.hints.clone();
        let (events, _events_rx) = mpsc::unbounded_channel();
        let (appender, thread) = LogAppender::spawn(1, Box::new(store), None, events).unwrap();
        appender.set_high_watermark_hint(7).unwrap();
        block_on(appender.shutdown().unwrap()).unwrap();
        thread.join().unwrap();
        assert_eq!(*hints.lock().unwrap(), vec![7]);
    }
}
