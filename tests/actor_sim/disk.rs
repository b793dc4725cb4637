//! Each node's disk: a [`MemoryStore`] that outlives the node's
//! incarnations, plus a real directory for its snapshot files. A crash
//! loses what was not flushed and kills the old incarnation's handle —
//! every later call through it fails — as a process that dies takes its
//! file descriptors with it. Snapshot files are fsynced before they are
//! renamed into place, so a crash keeps them (a partial one is removed at
//! the next start). The snapshot directory moves at each crash (to
//! `snapshots-<generation>`), so that the dead incarnation's storage task,
//! still draining its queue, can no more touch the files than a killed
//! process could.

use std::sync::{Arc, Mutex};

use kraft::messages::Batch;
use kraft::raft::{ElectionState, Epoch, Offset};
use kraft::storage::AppenderStore;
use kraft::storage::{self, LogStore, MemoryStore, StorageError};

struct DiskState {
    store: MemoryStore,
    /// Bumped by every crash; a handle of an older generation is dead.
    generation: u64,
    /// Every flush fails (and makes nothing durable) from now on.
    flushes_fail: bool,
}

#[derive(Clone)]
pub struct Disk(Arc<Mutex<DiskState>>, Arc<tempfile::TempDir>);

impl Disk {
    pub fn new() -> Self {
        let state = DiskState {
            store: MemoryStore::new(),
            generation: 0,
            flushes_fail: false,
        };
        let disk = Disk(
            Arc::new(Mutex::new(state)),
            Arc::new(tempfile::tempdir().expect("a snapshot dir")),
        );
        std::fs::create_dir(disk.snapshot_dir()).expect("the first snapshot dir");
        disk
    }

    fn snapshot_dir_of(&self, generation: u64) -> std::path::PathBuf {
        self.1.path().join(format!("snapshots-{generation}"))
    }

    /// Where the current incarnation keeps its snapshots.
    pub fn snapshot_dir(&self) -> std::path::PathBuf {
        self.snapshot_dir_of(self.0.lock().unwrap().generation)
    }

    /// Where the durable log starts now.
    pub fn start_offset(&self) -> Offset {
        self.0.lock().unwrap().store.start_offset()
    }

    /// The store as a new incarnation sees it.
    pub fn open(&self) -> DiskHandle {
        let generation = self.0.lock().unwrap().generation;
        DiskHandle {
            disk: self.clone(),
            generation,
        }
    }

    /// What a crash now would leave of the log: where it would end.
    pub fn durable_end(&self) -> Offset {
        self.0.lock().unwrap().store.durable_end_offset()
    }

    /// The election state a crash now would leave.
    pub fn durable_election(&self) -> ElectionState {
        self.0
            .lock()
            .unwrap()
            .store
            .election_state()
            .expect("an in-memory read")
    }

    /// A failing device: every later flush fails, and makes nothing durable.
    pub fn fail_flushes(&self) {
        self.0.lock().unwrap().flushes_fail = true;
    }

    /// Power loss: unflushed writes are gone and open handles are dead.
    pub fn crash(&self) {
        let mut state = self.0.lock().unwrap();
        state.store.crash();
        let (old, new) = (
            self.snapshot_dir_of(state.generation),
            self.snapshot_dir_of(state.generation + 1),
        );
        std::fs::rename(old, new).expect("the snapshot dir moves");
        state.generation += 1;
    }
}

pub struct DiskHandle {
    disk: Disk,
    generation: u64,
}

impl DiskHandle {
    fn live<T>(&self, op: impl FnOnce(&mut MemoryStore) -> storage::Result<T>) -> storage::Result<T> {
        let mut state = self.disk.0.lock().unwrap();
        if state.generation != self.generation {
            return Err(StorageError::Io(std::io::Error::other("the node crashed")));
        }
        op(&mut state.store)
    }

    fn peek<T>(&self, read: impl FnOnce(&MemoryStore) -> T) -> T {
        read(&self.disk.0.lock().unwrap().store)
    }
}

impl LogStore for DiskHandle {
    fn election_state(&self) -> storage::Result<ElectionState> {
        self.peek(|store| store.election_state())
    }
    fn write_election_state(&mut self, state: &ElectionState) -> storage::Result<()> {
        self.live(|store| store.write_election_state(state))
    }
    fn append(&mut self, batch: &Batch) -> storage::Result<()> {
        self.live(|store| store.append(batch))
    }
    fn truncate(&mut self, end_offset: Offset) -> storage::Result<()> {
        self.live(|store| store.truncate(end_offset))
    }
    fn flush(&mut self) -> storage::Result<()> {
        if self.disk.0.lock().unwrap().flushes_fail {
            return Err(StorageError::Io(std::io::Error::other("the disk failed a flush")));
        }
        self.live(|store| store.flush())
    }
    fn read(&self, from: Offset, until: Offset, max_bytes: usize) -> storage::Result<Vec<Batch>> {
        self.live(|store| store.read(from, until, max_bytes))
    }
    fn delete_before(&mut self, offset: Offset) -> storage::Result<()> {
        self.live(|store| store.delete_before(offset))
    }
    fn reset(&mut self, start_offset: Offset, start_epoch: Epoch) -> storage::Result<()> {
        self.live(|store| store.reset(start_offset, start_epoch))
    }
    fn start_offset(&self) -> Offset {
        self.peek(|store| store.start_offset())
    }
    fn start_epoch(&self) -> Epoch {
        self.peek(|store| store.start_epoch())
    }
    fn end_offset(&self) -> Offset {
        self.peek(|store| store.end_offset())
    }
    fn epoch_cache(&self) -> Vec<(Epoch, Offset)> {
        self.peek(|store| store.epoch_cache())
    }
}

impl AppenderStore for DiskHandle {
    fn set_high_watermark_hint(&mut self, _hw: Offset) -> storage::Result<()> {
        Ok(())
    }
}
