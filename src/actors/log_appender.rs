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
//! A storage error is fatal for the node: the thread logs it with `error!`,
//! reports [`StorageEvent::Failed`] and exits; every later command fails with
//! [`AppenderError::Stopped`] and pending replies are dropped (their receivers
//! see the error). Nothing is swallowed.

use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use crossbeam_channel::{Receiver, Sender, TrySendError};
use tokio::sync::{mpsc, oneshot, Notify};
use tracing::{debug, error, info};

use crate::messages::Batch;
use crate::raft::{ElectionState, Epoch, NodeId, Offset};
use crate::storage::{self, LogStore, StorageError};

/// Most commands applied between two flushes (one group commit).
pub const MAX_GROUP_COMMANDS: usize = 4096;

/// Most commands queued for the storage thread. A backlog this deep means the
/// disk has effectively stalled; the caller treats it as fatal (QuorumState)
/// or as an unavailable node (reads).
pub const MAX_QUEUED_COMMANDS: usize = 1 << 16;

/// What the storage thread needs from a store: the [`LogStore`] contract plus
/// the high-watermark hint the sled backend uses to tell a torn tail (above
/// the hint: truncated at open) from corruption of committed data (below it:
/// a hard error).
pub trait AppenderStore: LogStore {
    /// Everything below `hw` is committed and durable on this node.
    fn set_high_watermark_hint(&mut self, hw: Offset) -> storage::Result<()>;
}

impl AppenderStore for crate::storage::SledStore {
    fn set_high_watermark_hint(&mut self, hw: Offset) -> storage::Result<()> {
        // Persisted with the next flush.
        crate::storage::SledStore::set_high_watermark_hint(self, hw);
        Ok(())
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
    fn start_offset(&self) -> Offset {
        self.0.start_offset()
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

enum Command {
    Append(Batch),
    Truncate(Offset),
    Flush,
    WriteElection(ElectionState, oneshot::Sender<()>),
    Read {
        from: Offset,
        until: Offset,
        max_bytes: usize,
        reply: oneshot::Sender<Vec<Batch>>,
    },
    SetHighWatermarkHint(Offset),
    Shutdown(oneshot::Sender<()>),
}

/// The handle to the storage thread. Cheap to clone; every clone feeds the
/// same FIFO queue. Only the QuorumState actor sends mutations (append,
/// truncate, election state), so their order is its order.
#[derive(Clone)]
pub struct LogAppender {
    tx: Sender<Command>,
    /// Set when the store runs on a task ([`LogAppender::spawn_task`]):
    /// woken after every push.
    wake: Option<Arc<Notify>>,
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
        events: mpsc::UnboundedSender<StorageEvent>,
    ) -> std::io::Result<(LogAppender, JoinHandle<()>)> {
        let (tx, rx) = crossbeam_channel::bounded(MAX_QUEUED_COMMANDS);
        let thread = std::thread::Builder::new()
            .name(format!("kraft-storage-{node_id}"))
            .spawn(move || {
                StorageThread {
                    store,
                    events,
                    mutations: 0,
                }
                .run(rx)
            })?;
        Ok((LogAppender { tx, wake: None }, thread))
    }

    /// Runs the store on a task of the current tokio runtime instead of a
    /// thread: for stores that never block (the in-memory store), so that
    /// a single-threaded runtime with a paused clock runs the whole node
    /// deterministically (the actor-level simulator). Each group of
    /// commands waits `flush_delay` of (virtual) time before it is applied,
    /// standing in for the disk.
    pub fn spawn_task(
        store: Box<dyn AppenderStore>,
        events: mpsc::UnboundedSender<StorageEvent>,
        flush_delay: Duration,
    ) -> (LogAppender, tokio::task::JoinHandle<()>) {
        let (tx, rx) = crossbeam_channel::bounded(MAX_QUEUED_COMMANDS);
        let wake = Arc::new(Notify::new());
        let woken = wake.clone();
        let task = tokio::task::spawn_local(async move {
            let mut worker = StorageThread {
                store,
                events,
                mutations: 0,
            };
            let mut group: Vec<Command> = Vec::with_capacity(64);
            let exit = loop {
                if rx.is_empty() {
                    // Only this task holds the notifier: every handle is gone.
                    if Arc::strong_count(&woken) == 1 {
                        break Exit::Shutdown(None);
                    }
                    woken.notified().await;
                    continue;
                }
                fill(&rx, &mut group);
                // The disk's time: what is sent meanwhile forms the next group.
                if !flush_delay.is_zero() && group.iter().any(|c| matches!(c, Command::Flush)) {
                    tokio::time::sleep(flush_delay).await;
                }
                if let Some(exit) = worker.apply(&mut group) {
                    break exit;
                }
            };
            worker.finish(exit);
        });
        (LogAppender { tx, wake: Some(wake) }, task)
    }

    fn push(&self, command: Command) -> Result<(), AppenderError> {
        let pushed = self.tx.try_send(command);
        if let Some(wake) = &self.wake {
            wake.notify_one();
        }
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
    /// does not wait for a flush.
    pub fn read(
        &self,
        from: Offset,
        until: Offset,
        max_bytes: usize,
    ) -> Result<oneshot::Receiver<Vec<Batch>>, AppenderError> {
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

    /// Applies everything queued, flushes once more and stops the thread.
    /// The receiver resolves when the store is flushed (it errs if the thread
    /// had already stopped).
    pub fn shutdown(&self) -> Result<oneshot::Receiver<()>, AppenderError> {
        let (reply, rx) = oneshot::channel();
        let sent = self.tx.send(Command::Shutdown(reply));
        if let Some(wake) = &self.wake {
            wake.notify_one();
        }
        match sent {
            Ok(()) => Ok(rx),
            Err(_) => Err(AppenderError::Stopped),
        }
    }
}

impl Drop for LogAppender {
    fn drop(&mut self) {
        // A task-run store notices the last handle going (see spawn_task).
        if let Some(wake) = &self.wake {
            wake.notify_one();
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
    events: mpsc::UnboundedSender<StorageEvent>,
    /// Appends and truncates applied so far (see [`StorageEvent::Flushed`]).
    mutations: u64,
}

/// Why the thread's loop ends.
enum Exit {
    Shutdown(Option<oneshot::Sender<()>>),
    Failed,
}

impl StorageThread {
    fn run(mut self, rx: Receiver<Command>) {
        let mut group: Vec<Command> = Vec::with_capacity(64);
        let exit = loop {
            match rx.recv() {
                Ok(command) => group.push(command),
                // Every handle is gone: finish like a shutdown.
                Err(_) => break Exit::Shutdown(None),
            }
            fill(&rx, &mut group);
            if let Some(exit) = self.apply(&mut group) {
                break exit;
            }
        };
        self.finish(exit);
    }

    /// Applies one group; `Some` when the loop must end.
    fn apply(&mut self, group: &mut Vec<Command>) -> Option<Exit> {
        match self.apply_group(group) {
            Ok(None) => None,
            Ok(Some(reply)) => Some(Exit::Shutdown(Some(reply))),
            Err(()) => Some(Exit::Failed),
        }
    }

    fn finish(mut self, exit: Exit) {
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

    /// Applies one group in order; returns the shutdown reply when a
    /// Shutdown was reached (later commands of the group are dropped).
    fn apply_group(&mut self, group: &mut Vec<Command>) -> Result<Option<oneshot::Sender<()>>, ()> {
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
                    let batches = check(&self.events, self.store.read(from, until, max_bytes), || {
                        format!("read of [{from}, {until})")
                    })?;
                    let _ = reply.send(batches);
                }
                Command::SetHighWatermarkHint(hw) => {
                    check(&self.events, self.store.set_high_watermark_hint(hw), || {
                        format!("high-watermark hint {hw}")
                    })?;
                }
                Command::Shutdown(reply) => {
                    let dropped = commands.count();
                    if dropped > 0 {
                        debug!(dropped, "commands queued after Shutdown are dropped");
                    }
                    return Ok(Some(reply));
                }
            }
        }
        drop(commands);
        if flush_requested {
            self.flush_and_report()?;
        }
        Ok(None)
    }

    /// One durability point for the whole group, then the report.
    fn flush_and_report(&mut self) -> Result<(), ()> {
        check(&self.events, self.store.flush(), || "flush".to_string())?;
        let event = StorageEvent::Flushed {
            durable_end: self.store.end_offset(),
            mutations: self.mutations,
        };
        // A closed receiver means the QuorumState actor has stopped; the
        // write is durable all the same and nobody is left to tell.
        let _ = self.events.send(event);
        Ok(())
    }
}

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
mod tests {
    use super::*;
    use crate::messages::Record;
    use crate::storage::MemoryStore;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{Arc, Mutex};

    /// A memory store that counts flushes, can hold the first one until
    /// released (to queue commands behind it deterministically) and can be
    /// told to fail appends.
    struct TestStore {
        inner: MemoryStore,
        flushes: Arc<AtomicUsize>,
        /// (entered, release): the first flush says it started, then waits.
        gate: Option<(std::sync::mpsc::Sender<()>, std::sync::mpsc::Receiver<()>)>,
        fail_appends: bool,
        hints: Arc<Mutex<Vec<Offset>>>,
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
            self.inner.append(batch)
        }
        fn truncate(&mut self, end_offset: Offset) -> storage::Result<()> {
            self.inner.truncate(end_offset)
        }
        fn flush(&mut self) -> storage::Result<()> {
            if let Some((entered, release)) = self.gate.take() {
                let _ = entered.send(());
                let _ = release.recv();
            }
            self.flushes.fetch_add(1, Ordering::SeqCst);
            self.inner.flush()
        }
        fn read(&self, from: Offset, until: Offset, max_bytes: usize) -> storage::Result<Vec<Batch>> {
            self.inner.read(from, until, max_bytes)
        }
        fn start_offset(&self) -> Offset {
            self.inner.start_offset()
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
    }

    fn store() -> (TestStore, Arc<AtomicUsize>) {
        let flushes = Arc::new(AtomicUsize::new(0));
        let store = TestStore {
            inner: MemoryStore::new(),
            flushes: flushes.clone(),
            gate: None,
            fail_appends: false,
            hints: Arc::default(),
        };
        (store, flushes)
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
        let (appender, thread) = LogAppender::spawn(1, Box::new(store), events).unwrap();
        appender.append(batch(0, 1, 2)).unwrap();
        appender.append(batch(2, 1, 1)).unwrap();
        let read = appender.read(0, 3, 1 << 20).unwrap();
        let batches = block_on(read).unwrap();
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
        let batches = block_on(appender.read(2, 5, 1 << 20).unwrap()).unwrap();
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

    #[test]
    fn flushes_queued_behind_a_flush_in_progress_become_one_group_commit() {
        let (mut store, flushes) = store();
        let (release, gate) = std::sync::mpsc::channel();
        let (entered_tx, entered) = std::sync::mpsc::channel();
        store.gate = Some((entered_tx, gate));
        let (events, mut events_rx) = mpsc::unbounded_channel();
        let (appender, thread) = LogAppender::spawn(1, Box::new(store), events).unwrap();

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
        let (appender, thread) = LogAppender::spawn(1, Box::new(store), events).unwrap();
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

    #[test]
    fn the_high_watermark_hint_reaches_the_store() {
        let (store, _) = store();
        let hints = store.hints.clone();
        let (events, _events_rx) = mpsc::unbounded_channel();
        let (appender, thread) = LogAppender::spawn(1, Box::new(store), events).unwrap();
        appender.set_high_watermark_hint(7).unwrap();
        block_on(appender.shutdown().unwrap()).unwrap();
        thread.join().unwrap();
        assert_eq!(*hints.lock().unwrap(), vec![7]);
    }
}
