//! When a node writes a snapshot and when it compacts its log (KIP-630), as
//! plain decisions the QuorumState actor carries out (docs/SNAPSHOTS.md). Keys: `[snapshot]`
//! `max_bytes_between` and `max_interval_ms` (when to write one), `[log]`
//! `retention_bytes`, `retention_ms` and `cleaner_interval_ms` (when to
//! delete the log below the newest snapshot, and older snapshots).
//!
//! The raw-record state machine's snapshot holds every committed record
//! with its offset, so nothing a listener or a client can still ask for is
//! lost by compaction: reads below the log start are answered from the
//! newest snapshot.

use crate::messages::SnapshotId;
use crate::raft::{LogView, Offset};

/// The policy's settings (the keys above, already validated).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SnapshotSettings {
    pub max_bytes_between: u64,
    pub max_interval_ms: u64,
    pub retention_bytes: u64,
    pub retention_ms: u64,
    pub cleaner_interval_ms: u64,
}

/// A snapshot file this node holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeldSnapshot {
    pub id: SnapshotId,
    pub size_bytes: u64,
    /// When it was written (or found at start), in the actor's clock.
    pub made_ms: u64,
}

/// What the cleaner decided: compact the log below `start`, then delete
/// the snapshot files in `delete` (every one older than the newest).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Compaction {
    pub start: SnapshotId,
    pub delete: Vec<SnapshotId>,
}

#[derive(Debug)]
pub struct SnapshotPolicy {
    max_bytes_between: u64,
    max_interval_ms: u64,
    retention_bytes: u64,
    retention_ms: u64,
    cleaner_interval_ms: u64,
    /// Ascending by end offset.
    held: Vec<HeldSnapshot>,
    /// Log bytes appended since the newest snapshot (or the start).
    bytes_since: u64,
    /// When the newest snapshot was written, or the node started.
    since_ms: u64,
    /// The end of the last batch appended that holds data records (at the
    /// start, the log end: any of it may). Control records and the idle
    /// leader's NoOps alone never make a snapshot due by time.
    data_end: Offset,
    next_clean_ms: u64,
}

impl SnapshotPolicy {
    /// `held`: the valid snapshot files found at start, any order.
    /// `log_end`: the log's end at start.
    pub fn new(settings: SnapshotSettings, mut held: Vec<HeldSnapshot>, log_end: Offset, now_ms: u64) -> Self {
        held.sort_by_key(|h| h.id.end_offset);
        SnapshotPolicy {
            max_bytes_between: settings.max_bytes_between,
            max_interval_ms: settings.max_interval_ms,
            retention_bytes: settings.retention_bytes,
            retention_ms: settings.retention_ms,
            cleaner_interval_ms: settings.cleaner_interval_ms,
            held,
            bytes_since: 0,
            since_ms: now_ms,
            data_end: log_end,
            next_clean_ms: now_ms + settings.cleaner_interval_ms,
        }
    }

    /// Where a snapshot written now would end, if it is worth writing: at
    /// the committed prefix that is also flushed here (`committed_end`, the
    /// high watermark whose appends are queued to storage; both it and the
    /// flushed end are batch boundaries), with the epoch of the record just
    /// below. None when that is no newer than the newest snapshot held.
    pub fn snapshot_point(&self, committed_end: Offset, log: &LogView) -> Option<SnapshotId> {
        let end = Self::committed_flushed_end(committed_end, log);
        let newer = self.latest().is_none_or(|latest| end > latest.end_offset) && end > 0;
        newer.then(|| SnapshotId {
            end_offset: end,
            epoch: log.epoch_before(end),
        })
    }

    /// The committed prefix that is also flushed here: what a snapshot may
    /// hold, and the log may be compacted below.
    pub fn committed_flushed_end(committed_end: Offset, log: &LogView) -> Offset {
        committed_end.min(log.flushed_end())
    }

    pub fn latest(&self) -> Option<SnapshotId> {
        self.held.last().map(|h| h.id)
    }

    pub fn latest_held(&self) -> Option<HeldSnapshot> {
        self.held.last().copied()
    }

    /// A batch of `bytes` was appended, ending at `end`; `data` when it
    /// holds data records.
    pub fn on_appended(&mut self, bytes: usize, end: Offset, data: bool) {
        self.bytes_since += bytes as u64;
        if data {
            self.data_end = self.data_end.max(end);
        }
    }

    /// True when a snapshot is due and `committed_end` (the committed,
    /// flushed end: where it would end) is past the newest one.
    ///
    /// Due after `max_interval_ms` if data records came meanwhile (an idle
    /// leader appends a NoOp every `max_idle_interval_ms`, and a snapshot
    /// here rewrites the whole history, so an idle cluster must not write
    /// one every interval), or after as many bytes of new records
    /// as the larger of `max_bytes_between` and the newest snapshot. The
    /// raw-record snapshot holds the whole committed log, so each one costs
    /// what the log has ever held: one every `max_bytes_between` alone
    /// would write a quadratic total, while growing the gap with the
    /// snapshot keeps everything ever written to snapshots below about
    /// twice the log (as a growing vector's copies are).
    pub fn snapshot_due(&self, now_ms: u64, committed_end: Offset) -> bool {
        let newer = self.latest().is_none_or(|l| committed_end > l.end_offset) && committed_end > 0;
        let newest_bytes = self.latest_held().map_or(0, |h| h.size_bytes);
        let due = self.bytes_since >= self.max_bytes_between.max(newest_bytes)
            || (self.data_end > self.latest().map_or(0, |l| l.end_offset)
                && now_ms.saturating_sub(self.since_ms) >= self.max_interval_ms);
        newer && due
    }

    pub fn on_created(&mut self, id: SnapshotId, size_bytes: u64, now_ms: u64) {
        self.held.retain(|h| h.id != id);
        self.held.push(HeldSnapshot {
            id,
            size_bytes,
            made_ms: now_ms,
        });
        self.held.sort_by_key(|h| h.id.end_offset);
        if self.latest() == Some(id) {
            self.bytes_since = 0;
            self.since_ms = now_ms;
        }
    }

    /// Once every `cleaner_interval_ms`: when the log between `log_start`
    /// and the newest snapshot's end holds more than `retention_bytes`, or
    /// its oldest part is older than `retention_ms`, compact it up to the
    /// newest snapshot and delete the older snapshots. The size is read off
    /// the snapshots themselves (each holds every record below its end).
    /// Nothing is decided while the newest snapshot ends past
    /// `compactable_end` (what is committed and flushed here).
    pub fn compaction(&mut self, now_ms: u64, log_start: Offset, compactable_end: Offset) -> Option<Compaction> {
        if now_ms < self.next_clean_ms {
            return None;
        }
        self.next_clean_ms = now_ms + self.cleaner_interval_ms;
        let newest = *self.held.last()?;
        if newest.id.end_offset <= log_start {
            return self.stale_files(newest);
        }
        if newest.id.end_offset > compactable_end {
            return None;
        }
        let at_start = self.held.iter().find(|h| h.id.end_offset == log_start);
        let below_bytes = newest.size_bytes.saturating_sub(at_start.map_or(0, |h| h.size_bytes));
        // The oldest log still kept was written after the snapshot it
        // follows, or at the oldest snapshot we know of.
        let oldest_ms = at_start.or(self.held.first()).map_or(newest.made_ms, |h| h.made_ms);
        let expired = now_ms.saturating_sub(oldest_ms) >= self.retention_ms;
        if below_bytes > self.retention_bytes || expired {
            let delete = self.older_than(newest);
            self.held.retain(|h| h.id == newest.id);
            return Some(Compaction {
                start: newest.id,
                delete,
            });
        }
        None
    }

    /// The log already starts at the newest snapshot: only older files may
    /// be left (a restart after a compaction that did not delete them).
    fn stale_files(&mut self, newest: HeldSnapshot) -> Option<Compaction> {
        let delete = self.older_than(newest);
        if delete.is_empty() {
            return None;
        }
        self.held.retain(|h| h.id == newest.id);
        Some(Compaction {
            start: newest.id,
            delete,
        })
    }

    fn older_than(&self, newest: HeldSnapshot) -> Vec<SnapshotId> {
        self.held.iter().filter(|h| h.id != newest.id).map(|h| h.id).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(held: Vec<HeldSnapshot>) -> SnapshotPolicy {
        let settings = SnapshotSettings {
            max_bytes_between: 1000,
            max_interval_ms: 60_000,
            retention_bytes: 5000,
            retention_ms: 600_000,
            cleaner_interval_ms: 1000,
        };
        SnapshotPolicy::new(settings, held, 0, 0)
    }

    fn held(end_offset: Offset, size_bytes: u64, made_ms: u64) -> HeldSnapshot {
        HeldSnapshot {
            id: SnapshotId { end_offset, epoch: 1 },
            size_bytes,
            made_ms,
        }
    }

    #[test]
    fn a_snapshot_ends_at_the_committed_and_flushed_prefix_and_only_past_the_newest() {
        let mut log = LogView::empty();
        log.append(0, 4, 1);
        log.append(4, 10, 2);
        log.on_flushed(4);
        let p = policy(vec![]);
        assert_eq!(p.snapshot_point(0, &log), None, "nothing committed");
        assert_eq!(
            p.snapshot_point(10, &log),
            Some(SnapshotId {
                end_offset: 4,
                epoch: 1
            }),
            "committed but not flushed here: not in the snapshot"
        );
        log.on_flushed(10);
        assert_eq!(
            p.snapshot_point(10, &log),
            Some(SnapshotId {
                end_offset: 10,
                epoch: 2
            })
        );
        assert_eq!(
            p.snapshot_point(4, &log),
            Some(SnapshotId {
                end_offset: 4,
                epoch: 1
            }),
            "flushed but not committed: not in the snapshot"
        );
        let p = policy(vec![held(10, 100, 0)]);
        assert_eq!(p.snapshot_point(10, &log), None, "no newer than the newest held");
    }

    #[test]
    fn a_snapshot_is_due_after_enough_bytes_or_time_and_only_past_the_newest() {
        let mut p = policy(vec![]);
        assert!(!p.snapshot_due(10, 50), "nothing appended, no time passed");
        p.on_appended(999, 40, true);
        assert!(!p.snapshot_due(10, 50));
        p.on_appended(1, 50, true);
        assert!(p.snapshot_due(10, 50));
        assert!(!p.snapshot_due(10, 0), "nothing committed");
        p.on_created(
            SnapshotId {
                end_offset: 50,
                epoch: 1,
            },
            900,
            10,
        );
        assert!(!p.snapshot_due(10, 80), "the counter restarts");
        assert!(!p.snapshot_due(70_000, 50), "not past the newest");
        assert!(!p.snapshot_due(70_010, 80), "max_interval_ms passed, but no data since");
        p.on_appended(50, 80, false);
        assert!(!p.snapshot_due(70_010, 80), "control records and NoOps are not data");
        p.on_appended(50, 81, true);
        assert!(p.snapshot_due(70_010, 81), "max_interval_ms passed, data since");
    }

    #[test]
    fn the_gap_between_snapshots_grows_with_the_newest_snapshot() {
        let mut p = policy(vec![]);
        let mut end = 0;
        let mut written_bytes = 0;
        let mut log_bytes = 0;
        for _ in 0..1000 {
            end += 1;
            p.on_appended(100, end, true);
            log_bytes += 100;
            if p.snapshot_due(0, end) {
                // Each snapshot holds the whole log.
                written_bytes += log_bytes;
                p.on_created(
                    SnapshotId {
                        end_offset: end,
                        epoch: 1,
                    },
                    log_bytes,
                    0,
                );
            }
        }
        // 1000, 2000, 4000, 8000, 16000, 32000, 64000: not one every 1000
        // bytes (which would have written 5,050,000).
        assert_eq!(p.latest().map(|l| l.end_offset), Some(640));
        assert_eq!(written_bytes, 127_000);
        assert!(written_bytes < 2 * log_bytes);
    }

    #[test]
    fn the_cleaner_compacts_once_the_part_below_the_newest_snapshot_is_too_big() {
        let mut p = policy(vec![held(100, 3000, 0)]);
        assert_eq!(
            p.compaction(500, 0, Offset::MAX),
            None,
            "not before the cleaner interval"
        );
        assert_eq!(p.compaction(1000, 0, Offset::MAX), None, "3000 bytes below: kept");
        p.on_created(
            SnapshotId {
                end_offset: 200,
                epoch: 1,
            },
            6000,
            1500,
        );
        assert_eq!(p.compaction(1500, 0, Offset::MAX), None, "the cleaner ran at 1000");
        let compaction = p
            .compaction(2000, 0, Offset::MAX)
            .expect("6000 > 5000 bytes below the newest");
        assert_eq!(compaction.start.end_offset, 200);
        assert_eq!(
            compaction.delete,
            vec![SnapshotId {
                end_offset: 100,
                epoch: 1
            }]
        );
        assert_eq!(p.compaction(3000, 200, Offset::MAX), None, "nothing left to do");
    }

    #[test]
    fn the_cleaner_waits_until_the_newest_snapshot_is_flushed_and_committed_here() {
        let mut p = policy(vec![held(100, 9000, 0)]);
        assert_eq!(p.compaction(1000, 0, 99), None);
        assert_eq!(p.compaction(2000, 0, 100).map(|c| c.start.end_offset), Some(100));
    }

    #[test]
    fn the_cleaner_measures_only_the_log_still_kept() {
        // The log starts at 100 already: only 7000 - 4000 bytes are kept.
        let mut p = policy(vec![held(100, 4000, 0), held(300, 7000, 0)]);
        assert_eq!(p.compaction(1000, 100, Offset::MAX), None);
    }

    #[test]
    fn the_cleaner_compacts_a_part_older_than_retention_ms() {
        let mut p = policy(vec![held(100, 10, 0)]);
        assert_eq!(p.compaction(1000, 0, Offset::MAX), None);
        let compaction = p.compaction(600_000, 0, Offset::MAX).expect("older than retention_ms");
        assert_eq!((compaction.start.end_offset, compaction.delete), (100, vec![]));
    }

    #[test]
    fn older_snapshot_files_left_by_a_restart_are_deleted() {
        let mut p = policy(vec![held(100, 10, 0), held(200, 20, 0)]);
        let compaction = p.compaction(1000, 200, Offset::MAX).expect("stale files");
        assert_eq!(
            compaction.delete,
            vec![SnapshotId {
                end_offset: 100,
                epoch: 1
            }]
        );
        assert_eq!(p.latest().map(|l| l.end_offset), Some(200));
    }
}
