//! The chunk server: a thread of its own that reads local snapshot files,
//! chunks for FetchSnapshot answers and batches below the log start, so
//! that opening (and validating) a large file never holds up the log's
//! appends and flushes.

use std::path::PathBuf;
use std::time::Duration;

use crossbeam_channel::{RecvTimeoutError, Sender};
use tokio::sync::oneshot;
use tracing::warn;

use super::queue::command_queue;
use super::snapshot::{self, BatchCursor, SnapshotReader};
use super::snapshot_files::no_snapshot_files;
use super::snapshot_files::{read_batches, read_state_snapshot, SnapshotChunk};
use super::storage_thread::ReadResult;
use super::StorageError;
use crate::messages::{Batch, Record, SnapshotId};
use crate::raft::{NodeId, Offset};

/// Reads local snapshot files: chunks for FetchSnapshot answers, and
/// batches below the log start. Runs on a thread of its own beside the
/// storage thread ([`ChunkServer::spawn`]), or inside it for a store run
/// on a task.
pub(crate) struct ChunkServer {
    pub(crate) dir: Option<PathBuf>,
    /// The snapshot being served, opened (and so validated, all of it) once.
    pub(crate) serving: Option<SnapshotReader>,
    /// The newest snapshot opened (validated once) for reads below the log
    /// start, with where the last of those stopped: the cursor and the base
    /// offset of the batch there (a read from there on resumes, any other
    /// seeks with the reader's index; neither scans the file again).
    pub(crate) below: Option<(SnapshotReader, BatchCursor, Offset)>,
    /// Snapshot files opened (each open validates the whole file) to read
    /// below the log start.
    pub(crate) validations: u64,
}

/// How long the [`ChunkServer`] keeps a snapshot open without a read. A
/// transfer asks for its next chunk as soon as it wrote the last one.
pub(crate) const CHUNK_READER_IDLE: Duration = Duration::from_secs(5);

/// A read for [`ChunkServer::spawn`]'s thread.
pub(crate) enum ChunkRead {
    /// A chunk of snapshot `id` for a FetchSnapshot answer.
    Chunk {
        id: SnapshotId,
        position: u64,
        max_bytes: usize,
        reply: oneshot::Sender<Result<SnapshotChunk, StorageError>>,
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
    /// Every data record of snapshot `id` (a state machine's snapshot).
    State {
        id: SnapshotId,
        reply: oneshot::Sender<Result<Vec<Record>, StorageError>>,
    },
}

impl ChunkRead {
    /// Answers the read with an error instead of serving it.
    pub(crate) fn refuse(self) {
        // A closed receiver means the reader went away.
        match self {
            ChunkRead::Chunk { reply, .. } => {
                let _ = reply.send(Err(StorageError::ReaderBusy));
            }
            ChunkRead::Below { reply, .. } => {
                let _ = reply.send(Err(StorageError::ReaderBusy));
            }
            ChunkRead::State { reply, .. } => {
                let _ = reply.send(Err(StorageError::ReaderBusy));
            }
        }
    }
}

impl ChunkServer {
    pub(crate) fn new(dir: Option<PathBuf>) -> ChunkServer {
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
    pub(crate) fn spawn(node_id: NodeId, dir: PathBuf, idle: Duration) -> std::io::Result<Sender<ChunkRead>> {
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
                    Ok(ChunkRead::State { id, reply }) => {
                        let read = server
                            .dir
                            .as_deref()
                            .ok_or_else(no_snapshot_files)
                            .and_then(|dir| read_state_snapshot(dir, id));
                        if let Err(e) = &read {
                            warn!("reading snapshot {id:?} failed: {e}");
                        }
                        let _ = reply.send(read);
                        super::return_free_memory();
                    }
                    Err(RecvTimeoutError::Timeout) => {
                        let served = server.serving.take().is_some() | server.below.take().is_some();
                        if served {
                            // What it read was freed on other threads, into
                            // this thread's arena, which would keep it.
                            super::return_free_memory();
                        }
                    }
                    Err(RecvTimeoutError::Disconnected) => return,
                }
            })?;
        Ok(tx)
    }

    pub(crate) fn read_chunk(
        &mut self,
        id: SnapshotId,
        position: u64,
        max_bytes: usize,
    ) -> Result<SnapshotChunk, StorageError> {
        if self.serving.as_ref().map(|r| r.id()) != Some(id) {
            let dir = self.dir.as_ref().ok_or_else(no_snapshot_files)?;
            // Forget the previous one first: a failed open leaves none.
            self.serving = None;
            self.serving = Some(SnapshotReader::open(&snapshot::path_of(dir, id))?);
        }
        let reader = self.serving.as_ref().expect("opened above");
        let bytes = reader.read_chunk(position, max_bytes)?;
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
    pub(crate) fn read_below(
        &mut self,
        latest: Option<SnapshotId>,
        from: Offset,
        until: Offset,
        max_bytes: usize,
    ) -> Result<Vec<Batch>, StorageError> {
        // Without a newest snapshot named, the one found last time serves.
        let latest = latest.or(self.below.as_ref().map(|(r, _, _)| r.id()));
        let open = matches!(&self.below, Some((r, _, _)) if Some(r.id()) == latest);
        if !open {
            self.validations += 1;
            let dir = self.dir.as_ref().ok_or_else(no_snapshot_files)?;
            let reader = match latest {
                Some(id) => SnapshotReader::open(&snapshot::path_of(dir, id))?,
                None => match snapshot::newest_valid(dir)? {
                    Some((reader, _)) => reader,
                    None => {
                        return Err(StorageError::NoSnapshot(
                            "no snapshot holds the records below the log start".to_string(),
                        ))
                    }
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
