//! The newest batches of the log, kept in memory by the QuorumState actor so
//! that the leader answers a follower's fetch at the log end at once.
//!
//! Without it every fetch read goes through the storage thread's queue, and
//! a read queued while the thread is inside a flush (pwrite, sync_file_range
//! and fdatasync: about a millisecond here) waits for that flush. A follower
//! then receives the leader's newest batch one leader flush late, and every
//! commit pays the leader's flush and the follower's one after the other
//! instead of side by side. Kafka's leader serves the same reads from the
//! page cache.
//!
//! It is filled only while this node leads (an append sent in any other
//! role empties it).
//!
//! The cache mirrors exactly the mutations the actor sends to the storage
//! thread, in the same order (appends, truncations, snapshot installs), so a
//! read it answers equals what the store would answer after every command
//! sent before it. It only ever holds a contiguous run of batches that ends
//! at the log end; a read that starts below that run goes to the store.
//!
//! A batch is served from here as soon as it was sent to storage, possibly
//! before the store applied it: the leader may ship records before its own
//! write and fsync (docs/ARCHITECTURE.md, "Protocol rules"); it counts itself toward the high
//! watermark only with flushed offsets, and a storage failure stops it.

use std::collections::VecDeque;

use crate::messages::Batch;
use crate::raft::Offset;
use crate::storage::ReadBudget;

/// How many bytes of the newest batches are kept: one maximal batch (with
/// its header), and a fraction of a second of a busy leader's small ones
/// (80,000 records of 100 B), while a follower at the log end is a few
/// milliseconds behind. A loaded leader holds all of it for good, so it
/// counts against the RSS target of issue 4: in `bench state` (1M records
/// of 100 B), with fetch answers of 1 MiB, the leader peaked at 109-115
/// MiB (during its own snapshot) holding two maximal batches, 98-101 MiB
/// holding one.
pub const TAIL_CACHE_BYTES: usize = crate::messages::MAX_BATCH_BYTES + 64;

pub struct TailCache {
    /// Contiguous: each batch starts where the one before ends.
    batches: VecDeque<Batch>,
    bytes: usize,
    max_bytes: usize,
}

impl TailCache {
    pub fn new(max_bytes: usize) -> TailCache {
        TailCache {
            batches: VecDeque::new(),
            bytes: 0,
            max_bytes,
        }
    }

    /// A batch was sent to the store at the log end.
    pub fn on_append(&mut self, batch: &Batch) {
        if self
            .batches
            .back()
            .is_some_and(|last| last.next_offset() != batch.base_offset)
        {
            // Not contiguous with what is held (cannot happen while the
            // actor reports every mutation): start over from this batch.
            self.clear();
        }
        self.bytes += batch.size_bytes();
        self.batches.push_back(batch.clone());
        while self.bytes > self.max_bytes {
            let Some(evicted) = self.batches.pop_front() else { break };
            self.bytes -= evicted.size_bytes();
        }
    }

    /// Every batch at or above `end_offset` was removed from the log.
    pub fn on_truncate(&mut self, end_offset: Offset) {
        while let Some(last) = self.batches.back() {
            if last.base_offset < end_offset && last.next_offset() <= end_offset {
                break;
            }
            if last.base_offset < end_offset {
                // A cut inside a batch: the store refuses those, so this
                // never happens; hold nothing rather than half a batch.
                self.clear();
                return;
            }
            self.bytes -= last.size_bytes();
            self.batches.pop_back();
        }
    }

    /// The log was replaced (a snapshot installed) or its history is no
    /// longer known here.
    pub fn clear(&mut self) {
        self.batches.clear();
        self.bytes = 0;
    }

    /// The store's answer to `read(from, until, max_bytes)` (the batches
    /// holding `[from, until)`, at least one, then while they fit in
    /// `max_bytes`), if every batch of it is held; `None` sends the read to
    /// the store.
    pub fn read(&self, from: Offset, until: Offset, max_bytes: usize) -> Option<Vec<Batch>> {
        let first = self.batches.front()?;
        let last = self.batches.back()?;
        if from < first.base_offset || from >= last.next_offset() {
            return None;
        }
        if from >= until {
            return Some(Vec::new());
        }
        let index = self.batches.partition_point(|b| b.next_offset() <= from);
        let mut budget = ReadBudget::new(max_bytes);
        Some(
            self.batches
                .range(index..)
                .take_while(|b| b.base_offset < until && budget.try_take(b.size_bytes()))
                .cloned()
                .collect(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::messages::Record;
    use crate::storage::{LogStore, MemoryStore};

    fn batch(base: Offset, count: usize, bytes: usize) -> Batch {
        let records: Vec<Record> = (0..count).map(|i| Record::Data(vec![i as u8; bytes])).collect();
        Batch::new(base, 1, &records)
    }

    /// Every read the cache answers equals the store's answer after the
    /// same mutations.
    #[test]
    fn answers_match_the_store() {
        let mut cache = TailCache::new(2_000);
        let mut store = MemoryStore::new();
        let mut next = 0;
        for (i, count) in [3, 1, 4, 1, 5, 9, 2, 6].into_iter().enumerate() {
            let b = batch(next, count, 40 + i * 10);
            next = b.next_offset();
            cache.on_append(&b);
            store.append(&b).unwrap();
        }
        cache.on_truncate(14);
        store.truncate(14).unwrap();
        let b = batch(14, 3, 70);
        cache.on_append(&b);
        store.append(&b).unwrap();
        let end = store.end_offset();
        let mut answered = 0;
        for from in 0..end + 2 {
            for until in [from, from + 1, from + 5, end] {
                for max_bytes in [1, 150, 400, 10_000] {
                    if let Some(cached) = cache.read(from, until, max_bytes) {
                        answered += 1;
                        assert_eq!(
                            cached,
                            store.read(from, until, max_bytes).unwrap(),
                            "read({from}, {until}, {max_bytes})"
                        );
                    }
                }
            }
        }
        assert!(answered > 0);
        // The oldest batches were evicted: reads there go to the store.
        assert!(cache.bytes <= 2_000);
        assert_eq!(cache.read(0, end, 10_000), None);
        assert_eq!(cache.read(end, end + 1, 10_000), None);
    }

    /// The cache a leader keeps holds one maximal batch, and no more.
    #[test]
    fn the_leaders_cache_holds_one_maximal_batch() {
        let mut cache = TailCache::new(TAIL_CACHE_BYTES);
        let first = Batch::new(0, 1, &[Record::Data(vec![1; crate::messages::MAX_BATCH_BYTES - 64])]);
        assert!(first.size_bytes() <= TAIL_CACHE_BYTES, "{}", first.size_bytes());
        cache.on_append(&first);
        assert_eq!(cache.read(0, 1, usize::MAX), Some(vec![first]));
        let second = Batch::new(1, 1, &[Record::Data(vec![2; crate::messages::MAX_BATCH_BYTES - 64])]);
        cache.on_append(&second);
        assert_eq!(cache.read(0, 2, usize::MAX), None, "the first was evicted");
        assert_eq!(cache.read(1, 2, usize::MAX), Some(vec![second]));
        assert!(cache.bytes <= TAIL_CACHE_BYTES);
    }

    #[test]
    fn a_gap_or_a_cut_inside_a_batch_starts_over() {
        let mut cache = TailCache::new(10_000);
        cache.on_append(&batch(0, 2, 10));
        cache.on_append(&batch(5, 1, 10));
        assert_eq!(cache.read(0, 6, 10_000), None);
        assert_eq!(cache.read(5, 6, 10_000).map(|b| b.len()), Some(1));
        cache.on_append(&batch(6, 4, 10));
        cache.on_truncate(8);
        assert_eq!(cache.read(5, 10, 10_000), None);
        assert_eq!(cache.bytes, 0);
    }
}
