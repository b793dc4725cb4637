//! The harness's own record of one node's log, kept from the actions it
//! carries out: the current log (what the engine appended and truncated) and
//! the durable log (what a crash would leave).
//!
//! It exists so that the checkers can ask "does node n hold batch (base,
//! epoch, crc), currently or durably?" in O(log n) without copying the
//! store, and it is cross-checked against the store at every crash.

use std::rc::Rc;

use kraft::messages::Batch;
use kraft::raft::{Epoch, Offset};

/// One batch as the checkers see it.
#[derive(Clone, Debug)]
pub struct Entry {
    pub base: Offset,
    /// Exclusive end.
    pub next: Offset,
    pub epoch: Epoch,
    pub crc: u32,
    /// Hash of every (base, epoch, crc) from the log start up to and
    /// including this batch: two entries with equal chains have identical
    /// prefixes (log matching in O(1)).
    pub chain: u64,
    pub batch: Rc<Batch>,
}

impl Entry {
    pub fn same_batch(&self, other: &Entry) -> bool {
        self.base == other.base && self.next == other.next && self.epoch == other.epoch && self.crc == other.crc
    }

    pub fn describe(&self) -> String {
        format!(
            "[{}..{}) epoch {} crc {:08x}",
            self.base, self.next, self.epoch, self.crc
        )
    }
}

/// Invariant: `entries` is contiguous from offset 0; the durable log is
/// `entries[..durable_prefix]` followed by `durable_tail` (batches that were
/// truncated away but whose truncation is not yet flushed).
#[derive(Clone, Debug, Default)]
pub struct LogMirror {
    entries: Vec<Entry>,
    durable_prefix: usize,
    durable_tail: Vec<Entry>,
}

pub fn chain_hash(prev: u64, base: Offset, epoch: Epoch, crc: u32, next: Offset) -> u64 {
    let mut h = prev ^ 0x9e37_79b9_7f4a_7c15;
    for v in [base as u64, epoch as u32 as u64, crc as u64, next as u64] {
        h ^= v;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
        h ^= h >> 29;
    }
    h
}

impl LogMirror {
    pub fn new() -> Self {
        Self::default()
    }

    /// A log recovered from durable batches (all durable).
    pub fn from_batches(batches: Vec<Batch>) -> Self {
        let mut log = LogMirror::new();
        for b in batches {
            log.append(b);
        }
        log.flush();
        log
    }

    pub fn entries(&self) -> &[Entry] {
        &self.entries
    }

    pub fn end(&self) -> Offset {
        self.entries.last().map(|e| e.next).unwrap_or(0)
    }

    pub fn last_epoch(&self) -> Epoch {
        self.entries.last().map(|e| e.epoch).unwrap_or(0)
    }

    /// Appends at the end and returns the new entry.
    pub fn append(&mut self, batch: Batch) -> &Entry {
        assert_eq!(batch.base_offset, self.end(), "mirror append not contiguous");
        let prev = self.entries.last().map(|e| e.chain).unwrap_or(0);
        let next = batch.next_offset();
        let entry = Entry {
            base: batch.base_offset,
            next,
            epoch: batch.epoch,
            crc: batch.crc,
            chain: chain_hash(prev, batch.base_offset, batch.epoch, batch.crc, next),
            batch: Rc::new(batch),
        };
        self.entries.push(entry);
        self.entries.last().unwrap()
    }

    /// True when `end_offset` is a batch boundary of the current log (or at
    /// or past its end).
    pub fn is_boundary(&self, end_offset: Offset) -> bool {
        end_offset >= self.end() || self.entries.binary_search_by_key(&end_offset, |e| e.base).is_ok()
    }

    /// Removes every batch at or above `end_offset`; returns them.
    pub fn truncate(&mut self, end_offset: Offset) -> Vec<Entry> {
        let cut = self.entries.partition_point(|e| e.base < end_offset);
        if cut >= self.entries.len() {
            return Vec::new();
        }
        if cut < self.durable_prefix {
            // Durable batches stay on disk until the next flush.
            let mut tail: Vec<Entry> = self.entries[cut..self.durable_prefix].to_vec();
            tail.append(&mut self.durable_tail);
            self.durable_tail = tail;
            self.durable_prefix = cut;
        }
        self.entries.split_off(cut)
    }

    /// Everything current becomes durable.
    pub fn flush(&mut self) {
        self.durable_prefix = self.entries.len();
        self.durable_tail.clear();
    }

    /// Loses every unflushed write. Returns (removed, restored) entries.
    pub fn crash(&mut self) -> (Vec<Entry>, Vec<Entry>) {
        let removed = self.entries.split_off(self.durable_prefix);
        let restored = std::mem::take(&mut self.durable_tail);
        self.entries.extend(restored.iter().cloned());
        self.durable_prefix = self.entries.len();
        (removed, restored)
    }

    /// The batch holding `offset`.
    pub fn find(&self, offset: Offset) -> Option<&Entry> {
        let i = self.entries.partition_point(|e| e.next <= offset);
        self.entries.get(i).filter(|e| e.base <= offset)
    }

    /// The batch starting at `base`.
    pub fn find_base(&self, base: Offset) -> Option<&Entry> {
        self.entries
            .binary_search_by_key(&base, |e| e.base)
            .ok()
            .map(|i| &self.entries[i])
    }

    /// Does the durable log hold exactly this batch?
    pub fn durably_holds(&self, want: &Entry) -> bool {
        let prefix = &self.entries[..self.durable_prefix];
        if let Ok(i) = prefix.binary_search_by_key(&want.base, |e| e.base) {
            return prefix[i].same_batch(want);
        }
        self.durable_tail.iter().any(|e| e.same_batch(want))
    }

    /// The durable log, in order.
    pub fn durable_entries(&self) -> impl Iterator<Item = &Entry> {
        self.entries[..self.durable_prefix]
            .iter()
            .chain(self.durable_tail.iter())
    }

    pub fn durable_end(&self) -> Offset {
        self.durable_entries().last().map(|e| e.next).unwrap_or(0)
    }

    /// The end of the longest prefix of the *current* log that is on disk:
    /// below it, a crash leaves exactly the batches the node reads now. (The
    /// durable log may reach further with batches the node has truncated
    /// away, which it no longer claims.)
    pub fn durable_prefix_end(&self) -> Offset {
        self.entries[..self.durable_prefix].last().map(|e| e.next).unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kraft::messages::Record;

    fn batch(base: Offset, epoch: Epoch, n: usize) -> Batch {
        Batch::new(base, epoch, &vec![Record::NoOp; n])
    }

    #[test]
    fn crash_restores_the_durable_log_including_unflushed_truncations() {
        let mut log = LogMirror::new();
        log.append(batch(0, 1, 2));
        log.append(batch(2, 1, 1));
        log.flush();
        log.truncate(2);
        log.append(batch(2, 2, 3));
        assert_eq!(log.end(), 5);
        assert!(log.durably_holds(&LogMirror::from_batches(vec![batch(0, 1, 2), batch(2, 1, 1)]).entries()[1]));
        let (removed, restored) = log.crash();
        assert_eq!(removed.len(), 1);
        assert_eq!(restored.len(), 1);
        assert_eq!(log.end(), 3);
        assert_eq!(log.entries()[1].epoch, 1);
        assert_eq!(log.find(1).unwrap().base, 0);
        assert_eq!(log.find(2).unwrap().base, 2);
        assert!(log.find(3).is_none());
    }

    #[test]
    fn durable_prefix_end_counts_only_flushed_batches_of_the_current_log() {
        let mut log = LogMirror::new();
        log.append(batch(0, 1, 2));
        assert_eq!(log.durable_prefix_end(), 0);
        log.flush();
        log.append(batch(2, 1, 3));
        assert_eq!(log.durable_prefix_end(), 2);
        log.flush();
        // A truncation and a new batch past it: the old batch is still the
        // durable one at 2, so only [0, 2) is the current log on disk.
        log.truncate(2);
        log.append(batch(2, 2, 4));
        assert_eq!((log.durable_prefix_end(), log.durable_end(), log.end()), (2, 5, 6));
        log.flush();
        assert_eq!(log.durable_prefix_end(), 6);
    }
}
