//! In-memory backend for the deterministic simulator (docs/ARCHITECTURE.md, "Testing"): the same
//! [`LogStore`] contract as sled, plus a [`MemoryStore::crash`] that loses
//! every log write not yet flushed, the way a power cut loses what was not
//! fsynced.
//!
//! The simulator runs millions of events, so the store keeps `Batch`es as
//! they are (no encoding) and never copies the whole log on a flush or a
//! crash. Instead of a separate durable copy it keeps the *difference*
//! between the visible log and the durable image:
//!
//! ```text
//! visible log:   batches[..durable_prefix] ++ batches[durable_prefix..]   (unflushed appends)
//! durable image: batches[..durable_prefix] ++ truncated_durable           (unflushed truncations)
//! ```
//!
//! `flush` and `crash` then cost O(writes since the last flush).
//!
//! Both start at `start_offset`: `delete_before` and `reset`, the only
//! operations that move it, flush first and are durable on return, so the
//! visible log and the durable image always share their start (and its
//! epoch), and a crash never moves it.

use super::{check_append, check_election_transition, EpochCache, LogStore, ReadBudget, Result, StorageError};
use crate::messages::Batch;
use crate::raft::{ElectionState, Epoch, Offset};

/// A [`LogStore`] held in memory that can [`crash`](MemoryStore::crash).
///
/// Reads see unflushed writes (as with sled); the election state is durable
/// as soon as `write_election_state` returns, per the contract.
#[derive(Clone, Debug, Default)]
pub struct MemoryStore {
    election: ElectionState,
    /// First offset of the log, visible and durable alike (0 until
    /// `delete_before` or `reset` moves it).
    start_offset: Offset,
    /// Epoch of the record just below `start_offset` (0 at offset 0).
    /// Invariant: no batch of the log has a lower epoch.
    start_epoch: Epoch,
    /// The visible log, contiguous from `start_offset`.
    /// Invariant: `batches[i + 1].base_offset == batches[i].next_offset()`,
    /// `batches[0].base_offset == start_offset`, epochs never decrease.
    batches: Vec<Batch>,
    /// How many leading batches of `batches` are also in the durable image.
    /// Invariant: `durable_prefix <= batches.len()`.
    durable_prefix: usize,
    /// Durable batches that an unflushed truncation removed from the visible
    /// log, in log order. They follow `batches[..durable_prefix]` in the
    /// durable image and come back on a crash.
    /// Invariant: empty right after a flush; when not empty its first batch
    /// starts where `batches[..durable_prefix]` ends (`start_offset` when
    /// that prefix is empty).
    truncated_durable: Vec<Batch>,
    /// Epoch cache of the visible log.
    epochs: EpochCache,
}

impl MemoryStore {
    pub fn new() -> Self {
        Self::default()
    }

    /// Loses every append and truncate since the last `flush`, as a node
    /// that loses power does. The election state survives (it is durable
    /// when written). Costs O(writes since the last flush).
    pub fn crash(&mut self) {
        let kept_end = self.durable_prefix_end();
        self.batches.truncate(self.durable_prefix);
        self.epochs.truncate(kept_end);
        for batch in self.truncated_durable.drain(..) {
            self.epochs.on_append(batch.epoch, batch.base_offset);
            self.batches.push(batch);
        }
        self.durable_prefix = self.batches.len();
        self.check_invariants();
    }

    /// The batches that would survive a crash now, in log order: what this
    /// node "durably holds" for the simulator's high-watermark checks.
    pub fn durable_batches(&self) -> Vec<Batch> {
        self.durable_iter().cloned().collect()
    }

    /// Like [`durable_batches`](Self::durable_batches), without cloning.
    pub fn durable_iter(&self) -> impl Iterator<Item = &Batch> + '_ {
        self.batches[..self.durable_prefix]
            .iter()
            .chain(self.truncated_durable.iter())
    }

    /// The end offset of the durable image (what survives a crash now).
    pub fn durable_end_offset(&self) -> Offset {
        match self.truncated_durable.last() {
            Some(batch) => batch.next_offset(),
            None => self.durable_prefix_end(),
        }
    }

    /// True when some append or truncation would be lost by a crash.
    pub fn has_unflushed(&self) -> bool {
        self.durable_prefix < self.batches.len() || !self.truncated_durable.is_empty()
    }

    fn durable_prefix_end(&self) -> Offset {
        match self.durable_prefix.checked_sub(1) {
            Some(last) => self.batches[last].next_offset(),
            None => self.start_offset,
        }
    }

    /// Index of the batch holding `offset`, if the visible log holds it.
    fn index_of(&self, offset: Offset) -> Option<usize> {
        let index = self.batches.partition_point(|batch| batch.next_offset() <= offset);
        match self.batches.get(index) {
            Some(batch) if batch.base_offset <= offset => Some(index),
            _ => None,
        }
    }

    /// Debug-build check of the invariants written on the fields. It only
    /// looks at the unflushed part, so that it stays O(writes since the last
    /// flush) like the operations it checks.
    fn check_invariants(&self) {
        if cfg!(debug_assertions) {
            assert!(self.durable_prefix <= self.batches.len(), "durable prefix past the log");
            if let Some(first) = self.batches.first().or(self.truncated_durable.first()) {
                assert_eq!(first.base_offset, self.start_offset, "log does not begin at its start");
                assert!(first.epoch >= self.start_epoch, "epoch below the start epoch");
            }
            let mut next = self.durable_prefix_end();
            for batch in &self.truncated_durable {
                assert_eq!(batch.base_offset, next, "durable image is not contiguous");
                next = batch.next_offset();
            }
            let mut next = self.durable_prefix_end();
            for batch in &self.batches[self.durable_prefix..] {
                assert_eq!(batch.base_offset, next, "visible log is not contiguous");
                next = batch.next_offset();
            }
        }
    }
}

impl LogStore for MemoryStore {
    fn election_state(&self) -> Result<ElectionState> {
        Ok(self.election.clone())
    }

    fn write_election_state(&mut self, state: &ElectionState) -> Result<()> {
        check_election_transition(&self.election, state)?;
        self.election = state.clone();
        Ok(())
    }

    fn append(&mut self, batch: &Batch) -> Result<()> {
        check_append(self.end_offset(), self.epochs.last_epoch(), batch)?;
        if self.batches.is_empty() && batch.epoch < self.start_epoch {
            return Err(below_start_epoch(batch, self.start_epoch));
        }
        self.epochs.on_append(batch.epoch, batch.base_offset);
        self.batches.push(batch.clone());
        Ok(())
    }

    fn truncate(&mut self, end_offset: Offset) -> Result<()> {
        if end_offset < self.start_offset() {
            return Err(StorageError::Invalid(format!(
                "truncation to {end_offset}, below the log start {}",
                self.start_offset()
            )));
        }
        let Some(index) = self.index_of(end_offset) else {
            // At or past the end: nothing to remove.
            return Ok(());
        };
        let batch = &self.batches[index];
        if batch.base_offset != end_offset {
            return Err(StorageError::Invalid(format!(
                "truncation to {end_offset}, inside the batch [{}, {}]",
                batch.base_offset,
                batch.last_offset()
            )));
        }
        let mut removed = self.batches.split_off(index);
        if index < self.durable_prefix {
            // Durable batches leave the visible log but stay in the durable
            // image until the next flush; they go in front of any removed
            // earlier, which all sit above the old durable prefix. The
            // unflushed batches above them are simply gone.
            removed.truncate(self.durable_prefix - index);
            removed.append(&mut self.truncated_durable);
            self.truncated_durable = removed;
            self.durable_prefix = index;
        }
        self.epochs.truncate(end_offset);
        self.check_invariants();
        Ok(())
    }

    fn flush(&mut self) -> Result<()> {
        self.truncated_durable.clear();
        self.durable_prefix = self.batches.len();
        Ok(())
    }

    fn read(&self, from: Offset, until: Offset, max_bytes: usize) -> Result<Vec<Batch>> {
        if from < self.start_offset() {
            return Err(StorageError::Invalid(format!(
                "read from {from}, below the log start {}",
                self.start_offset()
            )));
        }
        if from >= until {
            return Ok(Vec::new());
        }
        let Some(first) = self.index_of(from) else {
            return Ok(Vec::new());
        };
        let mut budget = ReadBudget::new(max_bytes);
        let batches = self.batches[first..]
            .iter()
            .take_while(|batch| batch.base_offset < until && budget.try_take(batch.size_bytes()))
            .cloned()
            .collect();
        Ok(batches)
    }

    /// Flushes, then drops the front batches. `offset` may not pass the
    /// end of the flushed part of the visible log (`batches[..durable_prefix]`):
    /// the durable end, or below it when an unflushed truncation and appends
    /// replaced durable batches (those appends are not flushed either).
    fn delete_before(&mut self, offset: Offset) -> Result<()> {
        let flushed_end = self.durable_prefix_end();
        if offset > flushed_end {
            return Err(StorageError::Invalid(format!(
                "compaction below {offset}, past {flushed_end}, the end of the flushed log: \
                 only flushed batches are compacted"
            )));
        }
        self.flush()?;
        // Every batch is durable now: the durable prefix is the whole log.
        let removed = self.batches.partition_point(|batch| batch.next_offset() <= offset);
        if let Some(last_removed) = removed.checked_sub(1) {
            self.start_epoch = self.batches[last_removed].epoch;
            self.start_offset = self.batches.get(removed).map_or(offset, |kept| kept.base_offset);
            self.batches.drain(..removed);
            self.durable_prefix = self.batches.len();
            self.epochs.truncate_front(self.start_offset, self.end_offset());
        }
        self.check_invariants();
        Ok(())
    }

    fn reset(&mut self, start_offset: Offset, start_epoch: Epoch) -> Result<()> {
        check_reset(start_offset, start_epoch)?;
        // Pending appends and truncations go too: nothing a crash could
        // bring back is left.
        self.batches.clear();
        self.truncated_durable.clear();
        self.durable_prefix = 0;
        self.epochs.clear();
        self.start_offset = start_offset;
        self.start_epoch = start_epoch;
        self.check_invariants();
        Ok(())
    }

    fn start_offset(&self) -> Offset {
        self.start_offset
    }

    fn start_epoch(&self) -> Epoch {
        self.start_epoch
    }

    fn end_offset(&self) -> Offset {
        self.batches.last().map_or(self.start_offset, Batch::next_offset)
    }

    fn epoch_cache(&self) -> Vec<(Epoch, Offset)> {
        self.epochs.to_vec()
    }
}

/// The arguments `reset` refuses in both backends.
pub(crate) fn check_reset(start_offset: Offset, start_epoch: Epoch) -> Result<()> {
    if start_offset < 0 || start_epoch < 0 {
        return Err(StorageError::Invalid(format!(
            "reset of the log to start at offset {start_offset} in epoch {start_epoch}: negative"
        )));
    }
    Ok(())
}

/// The refusal, in both backends, of a first batch whose epoch is below the
/// epoch of the record before the log start (epochs never go back, across
/// the start too).
pub(crate) fn below_start_epoch(batch: &Batch, start_epoch: Epoch) -> StorageError {
    StorageError::Invalid(format!(
        "append of a batch of epoch {} at offset {}, below the epoch {start_epoch} of the record before the log start",
        batch.epoch, batch.base_offset
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::messages::Record;

    fn batch(base: Offset, epoch: Epoch, records: usize) -> Batch {
        Batch::new(base, epoch, &vec![Record::NoOp; records])
    }

    fn offsets(batches: &[Batch]) -> Vec<Offset> {
        batches.iter().map(|b| b.base_offset).collect()
    }

    #[test]
    fn epoch_cache_front_truncation() {
        let mut cache = EpochCache::default();
        for (epoch, base) in [(1, 0), (1, 2), (3, 4), (3, 6), (5, 8)] {
            cache.on_append(epoch, base);
        }
        // Batches end at 10.
        assert_eq!(cache.to_vec(), vec![(1, 0), (3, 4), (5, 8)]);
        assert_eq!(
            [0, 3, 4, 7, 8, 100].map(|o| cache.epoch_at(o)),
            [Some(1), Some(1), Some(3), Some(3), Some(5), Some(5)]
        );
        assert_eq!(cache.epoch_at(-1), None);
        let mut front = cache.clone();
        front.truncate_front(0, 10);
        assert_eq!(front, cache, "nothing below the first batch");
        front.truncate_front(2, 10);
        assert_eq!(front.to_vec(), vec![(1, 2), (3, 4), (5, 8)]);
        front.truncate_front(4, 10);
        assert_eq!(front.to_vec(), vec![(3, 4), (5, 8)]);
        front.truncate_front(8, 10);
        assert_eq!(front.to_vec(), vec![(5, 8)]);
        front.truncate_front(10, 10);
        assert_eq!(front.to_vec(), vec![]);
        cache.truncate_front(6, 10);
        assert_eq!(cache.to_vec(), vec![(3, 6), (5, 8)]);
        cache.clear();
        assert_eq!(cache.last_epoch(), None);
    }

    #[test]
    fn compaction_keeps_the_durable_image_consistent() {
        let mut store = MemoryStore::new();
        for (base, epoch) in [(0, 1), (2, 1), (4, 2)] {
            store.append(&batch(base, epoch, 2)).unwrap();
        }
        store.flush().unwrap();
        store.truncate(4).unwrap();
        store.delete_before(2).unwrap();
        assert_eq!(offsets(&store.durable_batches()), vec![2]);
        assert_eq!((store.start_offset(), store.durable_end_offset()), (2, 4));
        store.append(&batch(4, 3, 1)).unwrap();
        store.crash();
        assert_eq!(offsets(&store.read(2, 100, usize::MAX).unwrap()), vec![2]);
        assert_eq!(store.epoch_cache(), vec![(1, 2)]);
    }

    #[test]
    fn crash_restores_durable_batches_removed_by_several_truncations() {
        let mut store = MemoryStore::new();
        for (base, epoch) in [(0, 1), (2, 1), (4, 2), (6, 2)] {
            store.append(&batch(base, epoch, 2)).unwrap();
        }
        store.flush().unwrap();
        store.truncate(6).unwrap();
        store.append(&batch(6, 3, 1)).unwrap();
        store.truncate(2).unwrap();
        assert_eq!(offsets(&store.durable_batches()), vec![0, 2, 4, 6]);
        assert_eq!(store.durable_end_offset(), 8);
        store.crash();
        assert_eq!(offsets(&store.read(0, 100, usize::MAX).unwrap()), vec![0, 2, 4, 6]);
        assert_eq!(store.epoch_cache(), vec![(1, 0), (2, 4)]);
        assert!(!store.has_unflushed());
    }

    #[test]
    fn flush_makes_the_truncation_durable() {
        let mut store = MemoryStore::new();
        store.append(&batch(0, 1, 1)).unwrap();
        store.append(&batch(1, 1, 1)).unwrap();
        store.flush().unwrap();
        store.truncate(1).unwrap();
        store.append(&batch(1, 2, 3)).unwrap();
        store.flush().unwrap();
        store.append(&batch(4, 2, 1)).unwrap();
        store.crash();
        assert_eq!(store.end_offset(), 4);
        assert_eq!(store.epoch_cache(), vec![(1, 0), (2, 1)]);
    }
}
