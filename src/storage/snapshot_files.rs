//! The snapshot files beside the log (KIP-630) as the storage thread keeps
//! them: writing a snapshot from the log, receiving one from the leader,
//! deleting old ones, and reading batches back from one.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use tracing::{error, warn};

use super::chunk_server::ChunkServer;
use super::snapshot::{self, BatchCursor, SnapshotInstaller, SnapshotMeta, SnapshotReader, SnapshotWriter};
use super::{AppenderStore, StorageError};
use crate::messages::{Batch, Record, SnapshotId};
use crate::raft::Offset;

/// A piece of a snapshot file, for a FetchSnapshot response.
#[derive(Debug)]
pub struct SnapshotChunk {
    pub size: u64,
    pub bytes: Vec<u8>,
}

/// The snapshot files beside the log (KIP-630), handled on the storage
/// thread so that their writes are ordered with the log's.
pub(crate) struct SnapshotFiles {
    pub(crate) dir: Option<PathBuf>,
    /// Snapshot chunks for fetchers and reads below the log start, when no
    /// [`ChunkServer`] thread serves them (a store run on a task).
    pub(crate) chunks: ChunkServer,
    /// The snapshot being received from the leader.
    pub(crate) installing: Option<SnapshotInstaller>,
    /// The newest snapshot: it holds every record below the log start, or
    /// (with `hold_state`) the state they made.
    pub(crate) latest: Option<SnapshotId>,
    /// The snapshots hold a state machine's state, not the log's records.
    pub(crate) hold_state: bool,
}

impl SnapshotFiles {
    pub(crate) fn new(dir: Option<PathBuf>) -> Self {
        SnapshotFiles {
            chunks: ChunkServer::new(dir.clone()),
            dir,
            installing: None,
            latest: None,
            hold_state: false,
        }
    }

    pub(crate) fn dir(&self) -> Result<&PathBuf, StorageError> {
        self.dir.as_ref().ok_or_else(no_snapshot_files)
    }

    /// Writes the snapshot `id` here, on the storage thread (for stores
    /// without a [`SharedLogReader`](super::SharedLogReader)); see [`write_snapshot`].
    pub(crate) fn create(
        &mut self,
        store: &dyn AppenderStore,
        id: SnapshotId,
        previous: Option<SnapshotId>,
    ) -> Result<SnapshotMeta, StorageError> {
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

    pub(crate) fn write_chunk(&mut self, id: SnapshotId, size: u64, position: u64, bytes: &[u8]) {
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

    pub(crate) fn finish_install(&mut self, id: SnapshotId) -> Result<SnapshotMeta, StorageError> {
        let meta = match self.installing.take() {
            Some(installer) if installer.id() == id => installer.finish()?,
            _ => {
                return Err(StorageError::NoSnapshot(format!(
                    "no complete transfer of snapshot {id:?}"
                )))
            }
        };
        self.use_latest(id);
        Ok(meta)
    }

    /// Deletes every snapshot file that ends before `id` (failures are
    /// only logged: a leftover file is harmless and deleted next time).
    pub(crate) fn delete_older_than(&mut self, id: SnapshotId) {
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

    pub(crate) fn use_latest(&mut self, id: SnapshotId) {
        self.latest = Some(id);
    }
}

/// The batches of `reader` holding `[from, until)` (at most about
/// `max_bytes`), scanning from `cursor`, which stands at a batch whose base
/// offset `base` is at or below `from`; both are left where the next
/// sequential read resumes.
pub(crate) fn read_batches(
    reader: &SnapshotReader,
    cursor: &mut BatchCursor,
    base: &mut Offset,
    from: Offset,
    until: Offset,
    max_bytes: usize,
) -> Result<Vec<Batch>, StorageError> {
    let mut batches = reader.batches_from(*cursor);
    let mut found = Vec::new();
    let mut bytes = 0;
    loop {
        let at = batches.cursor();
        let Some(batch) = batches.next() else { break };
        let batch = batch?;
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
        return Err(StorageError::NoSnapshot(format!(
            "the newest snapshot holds nothing at offset {from}"
        )));
    }
    Ok(found)
}

pub(crate) fn copy_batch(writer: &mut SnapshotWriter, batch: &Batch) -> Result<(), StorageError> {
    Ok(writer.append_batch(batch)?)
}

/// Never set: for snapshots written on the storage thread.
pub(crate) static NOT_CANCELLED: AtomicBool = AtomicBool::new(false);

/// The log below its start is in `previous` (the newest snapshot), so a
/// snapshot built from both misses nothing.
pub(crate) fn check_snapshot_reaches(previous: Option<SnapshotId>, log_start: Offset) -> Result<(), StorageError> {
    let next = previous.map_or(0, |p| p.end_offset);
    if next < log_start {
        return Err(StorageError::NoSnapshot(format!(
            "the log starts at {log_start} but the snapshot below it ends at {next}"
        )));
    }
    Ok(())
}

/// Writes the snapshot ending at `id.end_offset` into `dir`: the records of
/// the `previous` snapshot, then the log's from there (read with `read`),
/// batch by batch with their offsets and epochs (the raw-record state
/// machine's state is its whole committed log). Gives up, removing the
/// partial file, once `cancel` is set.
pub(crate) fn write_snapshot(
    dir: &Path,
    id: SnapshotId,
    previous: Option<SnapshotId>,
    read: &dyn Fn(Offset, Offset, usize) -> super::Result<Vec<Batch>>,
    cancel: &AtomicBool,
) -> Result<SnapshotMeta, StorageError> {
    let cancelled = || -> Result<(), StorageError> {
        match cancel.load(Ordering::Relaxed) {
            true => Err(StorageError::Cancelled(id)),
            false => Ok(()),
        }
    };
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64);
    let mut writer = SnapshotWriter::create(dir, id, now_ms)?;
    let mut next = 0;
    if let Some(previous) = previous {
        let reader = SnapshotReader::open(&snapshot::path_of(dir, previous))?;
        for batch in reader.batches() {
            cancelled()?;
            copy_batch(&mut writer, &batch?)?;
        }
        next = previous.end_offset;
    }
    let mut trimmed_at = writer.bytes_written();
    while next < id.end_offset {
        cancelled()?;
        let batches = read(next, id.end_offset, 1 << 20)?;
        let Some(last) = batches.last() else {
            return Err(StorageError::Corrupt {
                offset: next,
                reason: "the log has nothing here to copy into the snapshot".to_string(),
            });
        };
        next = last.next_offset();
        for batch in batches.iter().filter(|b| b.base_offset < id.end_offset) {
            copy_batch(&mut writer, batch)?;
        }
        if writer.bytes_written() >= trimmed_at + SNAPSHOT_TRIM_EVERY_BYTES {
            // The pages sled reads in for this thread replace, in its
            // cache, pages another thread allocated: those are freed into
            // that thread's arena, which would keep them all.
            super::return_free_memory();
            trimmed_at = writer.bytes_written();
        }
    }
    Ok(writer.freeze()?)
}

/// How much snapshot a [`write_snapshot`] copies from the log between two
/// [`super::return_free_memory`] calls (each takes 10-80 ms). The pages
/// sled reads for the snapshot thread land in that thread's arena while
/// those they evict are freed into the storage thread's, which keeps them:
/// a leader's RSS rose by ~25 MiB within the first 32 MiB of a snapshot of
/// 1M records (to 98-101 MiB in `bench state`), and peaked at 83-89 MiB
/// when trimming every 8 MiB, its snapshots no slower (392-454 ms).
pub(crate) const SNAPSHOT_TRIM_EVERY_BYTES: u64 = 8 << 20;

/// A state machine's state as the records of a snapshot, produced on the
/// thread that writes the file (see [`write_state_snapshot`]).
pub type StateRecords = Box<dyn Iterator<Item = Record> + Send>;

/// Most records in one data batch of a state snapshot.
pub const STATE_SNAPSHOT_BATCH_RECORDS: usize = 1024;
/// Most bytes of records in one data batch of a state snapshot.
const STATE_SNAPSHOT_BATCH_BYTES: usize = 1 << 20;

/// Writes the snapshot `id` into `dir` from a state machine's `records`
/// (not from the log): batches of at most [`STATE_SNAPSHOT_BATCH_RECORDS`]
/// records or about 1 MiB, each with base offset 0 and the snapshot's epoch
/// (the records stand for the state, not for log offsets). Gives up,
/// removing the partial file, once `cancel` is set.
pub(crate) fn write_state_snapshot(
    dir: &Path,
    id: SnapshotId,
    records: StateRecords,
    cancel: &AtomicBool,
) -> Result<SnapshotMeta, StorageError> {
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64);
    let mut writer = SnapshotWriter::create(dir, id, now_ms)?;
    let mut batch = Vec::with_capacity(STATE_SNAPSHOT_BATCH_RECORDS);
    let mut bytes = 0;
    for record in records {
        bytes += match &record {
            Record::Data(data) => data.len() + 8,
            _ => 64,
        };
        batch.push(record);
        if batch.len() >= STATE_SNAPSHOT_BATCH_RECORDS || bytes >= STATE_SNAPSHOT_BATCH_BYTES {
            if cancel.load(Ordering::Relaxed) {
                return Err(StorageError::Cancelled(id));
            }
            writer.append(0, id.epoch, &batch)?;
            batch.clear();
            bytes = 0;
        }
    }
    if !batch.is_empty() {
        writer.append(0, id.epoch, &batch)?;
    }
    Ok(writer.freeze()?)
}

/// Every data record of the snapshot `id` in `dir`, in order (the file is
/// validated whole first).
pub(crate) fn read_state_snapshot(dir: &Path, id: SnapshotId) -> Result<Vec<Record>, StorageError> {
    let reader = SnapshotReader::open(&snapshot::path_of(dir, id))?;
    let records = reader.records().collect::<Result<Vec<Record>, _>>()?;
    Ok(records)
}

/// A snapshot being written on a thread of its own.
pub(crate) struct SnapshotThread {
    pub(crate) cancel: Arc<AtomicBool>,
    pub(crate) thread: JoinHandle<()>,
}

impl SnapshotThread {
    /// Waits for it, cancelling it first if `cancel`.
    pub(crate) fn stop(self, cancel: bool) {
        if cancel {
            self.cancel.store(true, Ordering::Relaxed);
        }
        if self.thread.join().is_err() {
            error!("the snapshot thread panicked");
        }
    }
}

/// The error of a node that keeps no snapshot files (a store run without a
/// snapshot directory).
pub(crate) fn no_snapshot_files() -> StorageError {
    StorageError::NoSnapshot("this node keeps no snapshot files".to_string())
}
