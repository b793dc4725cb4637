//! LogAppender: the handle in front of the storage thread
//! ([`crate::storage::storage_thread`]), which owns the store and
//! group-commits the metadata log (docs/ARCHITECTURE.md, "Actors and
//! threads" and "Durability points").
//!
//! Why a plain handle and not an actix actor in front of the thread: every
//! command would then cross two queues (actor mailbox, then channel) and the
//! per-sender parking of an actix mailbox can reorder `send`s. The handle
//! pushes straight onto one FIFO channel, so "strictly in the order sent" is a
//! property of the channel, a batch costs one thread hop, and nothing ever
//! blocks the arbiter: pushing is non-blocking and replies come back on
//! oneshot channels that the caller awaits.
//!
//! After a storage error the thread has stopped: every later command fails
//! with [`AppenderError::Stopped`] and pending replies are dropped (their
//! receivers see the error). A failed read only fails its reader, which is
//! answered with the error: a dropped reply always means the thread has
//! stopped.
//!
//! Chunks of a snapshot served to fetchers, and reads below the log start,
//! go to the chunk server thread when there is one, beside the storage
//! thread.
//!
//! [`LogAppender::spawn_task`] runs the same loop on a task of the current
//! runtime instead of a thread, for stores that never block: the
//! actor-level simulator runs whole nodes that way on a paused clock.

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use crossbeam_channel::{Sender, TrySendError};
use tokio::sync::{mpsc, oneshot, Notify};

use crate::messages::{Batch, Record, SnapshotId};
use crate::raft::{ElectionState, NodeId, Offset};
use crate::storage::chunk_server::{ChunkRead, ChunkServer, CHUNK_READER_IDLE};
use crate::storage::queue::{command_queue, try_send_bounded};
use crate::storage::snapshot::SnapshotMeta;
use crate::storage::storage_thread::{Command, StorageCounters, StorageThread};
use crate::storage::{AppenderStore, StorageError};
pub use crate::storage::{ReadResult, SnapshotChunk, StateRecords, StorageEvent, StorageStats};

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AppenderError {
    #[error("the storage thread has stopped")]
    Stopped,
    #[error("the storage thread is {0} commands behind")]
    Overloaded(usize),
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
    /// The storage thread, which waits in `storage::queue::next_command`.
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
        let worker = StorageThread::new(store, snapshot_dir, events, counters.clone());
        let task = tokio::task::spawn_local(worker.run_task(rx, woken, flush_delay));
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
    ) -> Result<oneshot::Receiver<Result<SnapshotMeta, StorageError>>, AppenderError> {
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
    ) -> Result<oneshot::Receiver<Result<SnapshotChunk, StorageError>>, AppenderError> {
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
    ) -> Result<oneshot::Receiver<Result<SnapshotMeta, StorageError>>, AppenderError> {
        let (reply, rx) = oneshot::channel();
        self.push(Command::InstallSnapshot { id, reply })?;
        Ok(rx)
    }

    /// Tells the storage thread that the snapshots hold a state machine's
    /// state: from then on a read below the log start is refused.
    pub fn snapshots_hold_state(&self) -> Result<(), AppenderError> {
        self.push(Command::SnapshotsHoldState)
    }

    /// Writes the snapshot `id` from a state machine's `records`, produced
    /// on the thread that writes the file.
    pub fn write_state_snapshot(
        &self,
        id: SnapshotId,
        records: StateRecords,
    ) -> Result<oneshot::Receiver<Result<SnapshotMeta, StorageError>>, AppenderError> {
        let (reply, rx) = oneshot::channel();
        self.push(Command::WriteStateSnapshot { id, records, reply })?;
        Ok(rx)
    }

    /// Every data record of the local snapshot `id`: a state machine's
    /// state, to load.
    pub fn read_state_snapshot(
        &self,
        id: SnapshotId,
    ) -> Result<oneshot::Receiver<Result<Vec<Record>, StorageError>>, AppenderError> {
        let (reply, rx) = oneshot::channel();
        self.push(Command::ReadStateSnapshot { id, reply })?;
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

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::messages::Record;
    use crate::raft::Epoch;
    use crate::storage::queue::{next_command, MAX_QUEUED_COMMANDS};
    use crate::storage::snapshot::{self, SnapshotReader, SnapshotWriter};
    use crate::storage::snapshot_files::{write_snapshot, NOT_CANCELLED, SNAPSHOT_TRIM_EVERY_BYTES};
    use crate::storage::{self, LogStore, MemoryStore, SharedLogReader, StorageError};
    use crossbeam_channel::RecvTimeoutError;
    use std::path::Path;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::{Arc, Mutex};
    use std::time::Instant;

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

    /// Holds the caller at `gate` if it is armed (once; the gate disarms).
    fn pass(gate: &FlushGate) {
        let armed = gate.lock().unwrap().take();
        if let Some((entered, release)) = armed {
            let _ = entered.send(());
            let _ = release.recv();
        }
    }

    /// A store (a memory store unless replaced) that counts flushes, can
    /// hold a flush or an election-state write until released (to queue
    /// commands behind it deterministically, or to see what runs while it
    /// is not yet durable) and can be told to fail appends or flushes.
    pub(crate) struct TestStore {
        inner: Box<dyn LogStore>,
        flushes: Arc<AtomicUsize>,
        pub(crate) gate: FlushGate,
        /// Like `gate`, for the next election-state write.
        pub(crate) election_gate: FlushGate,
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
            pass(&self.election_gate);
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
            pass(&self.gate);
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
            election_gate: Arc::default(),
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
            assert!(matches!(e, StorageError::Cancelled(_)), "{e}");
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
        assert!(matches!(error, StorageError::Cancelled(_)), "{error}");
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

    /// A chunked batch whose flush fails (docs/ARCHITECTURE.md, "Durability points"): the
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
            block_on(read).unwrap().expect("read"),
            vec![chunked],
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
        assert!(error.to_string().contains("no snapshot files"), "{error}");
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
