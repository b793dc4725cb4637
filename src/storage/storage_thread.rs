//! The storage thread: the store lives on a dedicated `std::thread` (sled
//! calls block, and its flush fsyncs), fed by one FIFO queue. It
//! **group-commits**: it waits for one command, takes whatever else is
//! queued (at most [`MAX_GROUP_COMMANDS`]), applies them strictly in the
//! order they were sent, and when any `Flush` was among them issues *one*
//! `store.flush()` and reports [`StorageEvent::Flushed`].
//!
//! A storage error on a write or flush is fatal for the node: the thread
//! logs it with `error!`, reports [`StorageEvent::Failed`] and exits. A
//! failed read only fails its reader, which is answered with the error
//! ([`ReadResult`]).
//!
//! The same turn (take a group, apply it, make it durable) also runs on a
//! task of the current runtime (`StorageThread::run_task`) for stores that
//! never block: the actor-level simulator runs whole nodes that way on a
//! paused clock.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender, TryRecvError};
use tokio::sync::{mpsc, oneshot, Notify};
use tracing::{debug, error, info, warn};

use super::chunk_server::ChunkRead;
use super::queue::{next_command, try_send_bounded};
use super::snapshot::{self, SnapshotMeta};
use super::snapshot_files::{
    check_snapshot_reaches, read_state_snapshot, write_snapshot, write_state_snapshot, SnapshotChunk, SnapshotFiles,
    SnapshotThread, StateRecords, NOT_CANCELLED,
};
use super::{AppenderStore, StorageError};
use crate::messages::{Batch, Record, SnapshotId};
use crate::raft::{ElectionState, Offset};
pub use crate::types::StorageStats;

/// Most commands applied between two flushes (one group commit).
pub const MAX_GROUP_COMMANDS: usize = 4096;

/// What the storage thread reports to the QuorumState actor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StorageEvent {
    /// One flush completed: every log write up to `durable_end` is durable,
    /// and so is every mutation (append or truncate) among the first
    /// `mutations` ever sent. A truncation sent after those may still remove
    /// part of `[.., durable_end)`: the engine, which knows which flush it
    /// asked for, counts only what that flush covered (`mutations` says the
    /// same in the storage thread's own terms; its tests check it).
    Flushed { durable_end: Offset, mutations: u64 },
    /// The store failed; the thread has stopped. Fatal for the node.
    Failed(String),
}

/// The answer to `LogAppender::read`: the batches, or why the read failed
/// (the storage thread keeps running; the reader may retry).
pub type ReadResult = Result<Vec<Batch>, StorageError>;

/// What the storage thread has done since it started, for `GET /metrics`
/// (etcd's `wal_fsync_duration_seconds`, Kafka's log flush rate): shared
/// counters the thread bumps and any handle reads.
#[derive(Debug, Default)]
pub(crate) struct StorageCounters {
    pub(crate) flushes: AtomicU64,
    pub(crate) flush_nanos: AtomicU64,
    pub(crate) appended_batches: AtomicU64,
    pub(crate) appended_bytes: AtomicU64,
}

pub(crate) enum Command {
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
        reply: oneshot::Sender<Result<SnapshotMeta, StorageError>>,
    },
    ReadSnapshotChunk {
        id: SnapshotId,
        position: u64,
        max_bytes: usize,
        reply: oneshot::Sender<Result<SnapshotChunk, StorageError>>,
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
        reply: oneshot::Sender<Result<SnapshotMeta, StorageError>>,
    },
    DeleteSnapshot(SnapshotId),
    /// From now on the snapshots hold a state machine's state, not the
    /// log's records: reads below the log start are refused
    /// ([`StorageError::BelowLogStart`]). Sent once, before any read.
    SnapshotsHoldState,
    /// Write the snapshot `id` from a state machine's records.
    WriteStateSnapshot {
        id: SnapshotId,
        records: StateRecords,
        reply: oneshot::Sender<Result<SnapshotMeta, StorageError>>,
    },
    /// Every data record of the snapshot `id`.
    ReadStateSnapshot {
        id: SnapshotId,
        reply: oneshot::Sender<Result<Vec<Record>, StorageError>>,
    },
    /// Compact the log below the end of this snapshot, which now holds
    /// every record below the log start.
    DeleteBefore(SnapshotId),
}

/// Adds whatever else is queued to `group`, up to [`MAX_GROUP_COMMANDS`].
pub(crate) fn fill(rx: &Receiver<Command>, group: &mut Vec<Command>) {
    while group.len() < MAX_GROUP_COMMANDS {
        match rx.try_recv() {
            Ok(command) => group.push(command),
            Err(_) => break,
        }
    }
}

pub(crate) struct StorageThread {
    store: Box<dyn AppenderStore>,
    snapshots: SnapshotFiles,
    /// The snapshot being written beside this thread, if any.
    snapshot_thread: Option<SnapshotThread>,
    /// The name the snapshot thread gets.
    pub(crate) name: String,
    /// At how many bytes appended and read freed memory was last handed
    /// back (see `trim_due`).
    trimmed_at_bytes: u64,
    /// Bytes of batches read so far.
    read_bytes: u64,
    events: mpsc::UnboundedSender<StorageEvent>,
    /// Appends and truncates applied so far (see [`StorageEvent::Flushed`]).
    mutations: u64,
    counters: Arc<StorageCounters>,
    /// The `ChunkServer` thread that answers reads below the log start,
    /// when there is one.
    pub(crate) chunks: Option<Sender<ChunkRead>>,
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
    pub(crate) fn new(
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

    /// The group-commit loop on a thread of its own: waits for a command
    /// (handing freed memory back when idle long enough), then takes a turn.
    pub(crate) fn run(mut self, rx: Receiver<Command>) {
        let mut group: Vec<Command> = Vec::with_capacity(64);
        let exit = loop {
            match next_command(&rx, self.trim_due().then_some(IDLE_BEFORE_TRIM)) {
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
            if let Some(exit) = self.complete(applied) {
                break exit;
            }
        };
        self.finish(exit);
    }

    /// The same loop on a task of the current runtime, for stores that
    /// never block (the actor-level simulator). `woken` is notified after
    /// every push. When a group holds a Flush, the flush takes
    /// `flush_delay` of (virtual) time, standing in for the disk's fsync:
    /// what is sent meanwhile forms the next group, and a crash in between
    /// loses the group's writes. A group that writes the election state
    /// waits as long (at least 1 ms) before it is applied, so that a crash
    /// meanwhile loses that write too, and whatever the node did before the
    /// write was durable can be told from what it did after.
    pub(crate) async fn run_task(mut self, rx: Receiver<Command>, woken: Arc<Notify>, flush_delay: Duration) {
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
            if group.iter().any(|c| matches!(c, Command::WriteElection(..))) {
                tokio::time::sleep(flush_delay.max(Duration::from_millis(1))).await;
            }
            let applied = match self.apply_group(&mut group) {
                Ok(applied) => applied,
                Err(()) => break Exit::Failed,
            };
            if applied.flush && !flush_delay.is_zero() {
                tokio::time::sleep(flush_delay).await;
            }
            if let Some(exit) = self.complete(applied) {
                break exit;
            }
        };
        self.finish(exit);
    }

    /// The end of a turn: one durability point for the group if it asked
    /// for one, then the shutdown if it asked for that.
    fn complete(&mut self, applied: Applied) -> Option<Exit> {
        if applied.flush && self.flush_and_report().is_err() {
            return Some(Exit::Failed);
        }
        applied.shutdown.map(|reply| Exit::Shutdown(Some(reply)))
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
                    let read = if from < start && self.snapshots.hold_state {
                        Err(StorageError::BelowLogStart { from, start })
                    } else if from < start {
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
                                    e.into_inner().refuse();
                                }
                                continue;
                            }
                            None => self.snapshots.chunks.read_below(latest, from, until, max_bytes),
                        }
                    } else {
                        self.store.read(from, until, max_bytes)
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
                Command::SnapshotsHoldState => self.snapshots.hold_state = true,
                Command::WriteStateSnapshot { id, records, reply } => self.create_state_snapshot(id, records, reply),
                Command::ReadStateSnapshot { id, reply } => match &self.chunks {
                    // A whole snapshot is read and validated beside this
                    // thread, like the reads below the log start.
                    Some(chunks) => {
                        if let Err(e) = try_send_bounded(chunks, ChunkRead::State { id, reply }) {
                            e.into_inner().refuse();
                        }
                    }
                    None => {
                        let read = self.snapshots.dir().and_then(|dir| read_state_snapshot(dir, id));
                        let _ = reply.send(read);
                    }
                },
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
                    super::return_free_memory();
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
        reply: oneshot::Sender<Result<SnapshotMeta, StorageError>>,
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
            super::return_free_memory();
            let _ = reply.send(written);
        });
        match spawned {
            Ok(thread) => self.snapshot_thread = Some(SnapshotThread { cancel, thread }),
            // The reply went with the closure: the requester sees the
            // snapshot abandoned.
            Err(e) => error!(?id, "cannot start a thread to write the snapshot: {e}"),
        }
    }

    /// Writes the snapshot `id` from a state machine's `records`: on a
    /// thread of its own when this one serves a thread-backed store (with a
    /// chunk server), else here (a store run on a task, which never
    /// blocks). The reply comes from whichever thread wrote it.
    fn create_state_snapshot(
        &mut self,
        id: SnapshotId,
        records: StateRecords,
        reply: oneshot::Sender<Result<SnapshotMeta, StorageError>>,
    ) {
        self.stop_snapshot_thread(false);
        let dir = match self.snapshots.dir() {
            Ok(dir) => dir.clone(),
            Err(e) => {
                let _ = reply.send(Err(e));
                return;
            }
        };
        if self.chunks.is_none() {
            let written = write_state_snapshot(&dir, id, records, &NOT_CANCELLED);
            if written.is_ok() {
                self.snapshots.use_latest(id);
            }
            let _ = reply.send(written);
            return;
        }
        let cancel = Arc::new(AtomicBool::new(false));
        let cancelled = cancel.clone();
        let spawned = std::thread::Builder::new().name(self.name.clone()).spawn(move || {
            let written = write_state_snapshot(&dir, id, records, &cancelled);
            super::return_free_memory();
            let _ = reply.send(written);
        });
        match spawned {
            Ok(thread) => self.snapshot_thread = Some(SnapshotThread { cancel, thread }),
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
    fn finish_install(&mut self, id: SnapshotId) -> Result<SnapshotMeta, StorageError> {
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
        super::return_free_memory();
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

/// How much the storage thread appends or reads before it hands freed
/// memory back at its next idle moment.
const TRIM_EVERY_BYTES: u64 = 32 << 20;
