//! In-memory backend for the deterministic simulator (DESIGN.md §8): the same
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
    /// The visible log, contiguous from offset 0.
    /// Invariant: `batches[i + 1].base_offset == batches[i].next_offset()`,
    /// `batches[0].base_offset == 0`, epochs never decrease.
    batches: Vec<Batch>,
    /// How many leading batches of `batches` are also in the durable image.
    /// Invariant: `durable_prefix <= batches.len()`.
    durable_prefix: usize,
    /// Durable batches that an unflushed truncation removed from the visible
    /// log, in log order. They follow `batches[..durable_prefix]` in the
    /// durable image and come back on a crash.
    /// Invariant: empty right after a flush; when not empty its first batch
    /// starts where `batches[..durable_prefix]` ends.
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
            None => 0,
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

    fn start_offset(&self) -> Offset {
        0
    }

    fn end_offset(&self) -> Offset {
        self.batches.last().map(Batch::next_offset).unwrap_or(0)
    }

    fn epoch_cache(&self) -> Vec<(Epoch, Offset)> {
        self.epochs.to_vec()
    }
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
