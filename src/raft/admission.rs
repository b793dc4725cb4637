//! Admission: how much a node takes in while its disk or its quorum lags
//! behind (etcd raft's `MaxUncommittedEntriesSize` plays the same part).
//!
//! Two bounds, both checked before an append is accepted, whether it is
//! proposed here or forwarded to the leader from here:
//!
//! - [`MAX_UNFLUSHED_BYTES`] of batches handed to storage and not yet
//!   durable, plus the records waiting in the accumulator: a stalled disk
//!   must not turn into unbounded memory;
//! - [`MAX_AWAITING_COMMIT`] proposals accepted by this leader and not yet
//!   committed: a quorum that stopped acknowledging must not either.
//!
//! A refused append was written nowhere; the caller may retry it.

use std::collections::VecDeque;

use super::{Offset, ProposeError};

/// Most bytes of appended batches waiting for a flush (with the records in
/// the accumulator) before new appends are refused.
pub const MAX_UNFLUSHED_BYTES: usize = 64 * 1024 * 1024;

/// Most proposals this leader has accepted and not yet seen committed
/// before new ones are refused.
pub const MAX_AWAITING_COMMIT: usize = 100_000;

/// What waits for the disk and for the quorum.
#[derive(Debug, Default)]
pub(super) struct Backlog {
    /// `(next_offset, bytes)` of every batch handed to storage and not yet
    /// durable, in log order. Invariant: `unflushed_bytes` is the sum of
    /// the bytes.
    unflushed: VecDeque<(Offset, usize)>,
    unflushed_bytes: usize,
    /// The last offset of every proposal accepted in this leadership and not
    /// yet committed, ascending (proposals take offsets in order).
    awaiting_commit: VecDeque<Offset>,
}

impl Backlog {
    /// A batch ending before `next_offset` went to storage.
    pub(super) fn on_append(&mut self, next_offset: Offset, bytes: usize) {
        self.unflushed.push_back((next_offset, bytes));
        self.unflushed_bytes += bytes;
    }

    /// The log was cut at `end_offset`: batches past it wait for nothing.
    pub(super) fn on_truncate(&mut self, end_offset: Offset) {
        while let Some(&(next_offset, bytes)) = self.unflushed.back() {
            if next_offset <= end_offset {
                break;
            }
            self.unflushed.pop_back();
            self.unflushed_bytes -= bytes;
        }
    }

    /// Everything below `durable_end` is durable.
    pub(super) fn on_flushed(&mut self, durable_end: Offset) {
        while let Some(&(next_offset, bytes)) = self.unflushed.front() {
            if next_offset > durable_end {
                break;
            }
            self.unflushed.pop_front();
            self.unflushed_bytes -= bytes;
        }
    }

    /// The log was replaced (a snapshot installed): nothing of it waits.
    pub(super) fn on_log_replaced(&mut self) {
        self.unflushed.clear();
        self.unflushed_bytes = 0;
    }

    /// A proposal ending at `last_offset` was accepted.
    pub(super) fn on_accepted(&mut self, last_offset: Offset) {
        debug_assert!(self.awaiting_commit.back().is_none_or(|last| *last < last_offset));
        self.awaiting_commit.push_back(last_offset);
    }

    /// Everything below `high_watermark` is committed.
    pub(super) fn on_high_watermark(&mut self, high_watermark: Offset) {
        while self.awaiting_commit.front().is_some_and(|last| *last < high_watermark) {
            self.awaiting_commit.pop_front();
        }
    }

    /// Leadership ended: its proposals' outcomes are unknown, and they no
    /// longer wait here.
    pub(super) fn on_leadership_ended(&mut self) {
        self.awaiting_commit.clear();
    }

    /// Refuses a new append while `accumulated_bytes` (the accumulator's)
    /// and the unflushed batches reach [`MAX_UNFLUSHED_BYTES`], or while
    /// [`MAX_AWAITING_COMMIT`] proposals wait for their commit.
    pub(super) fn admit(&self, accumulated_bytes: usize) -> Result<(), ProposeError> {
        let bytes = self.unflushed_bytes + accumulated_bytes;
        if bytes >= MAX_UNFLUSHED_BYTES {
            return Err(ProposeError::DiskBehind { bytes });
        }
        let appends = self.awaiting_commit.len();
        if appends >= MAX_AWAITING_COMMIT {
            return Err(ProposeError::CommitBehind { appends });
        }
        Ok(())
    }

    #[cfg(test)]
    fn unflushed_bytes(&self) -> usize {
        self.unflushed_bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unflushed_bytes_count_until_flushed_or_truncated_and_refuse_at_the_bound() {
        let mut b = Backlog::default();
        b.on_append(10, MAX_UNFLUSHED_BYTES / 2);
        b.on_append(20, MAX_UNFLUSHED_BYTES / 2 - 1);
        assert_eq!(b.admit(0), Ok(()));
        assert_eq!(
            b.admit(1),
            Err(ProposeError::DiskBehind {
                bytes: MAX_UNFLUSHED_BYTES
            }),
            "the accumulator's bytes count too"
        );
        b.on_flushed(15);
        assert_eq!(
            b.unflushed_bytes(),
            MAX_UNFLUSHED_BYTES / 2 - 1,
            "only whole batches below the durable end"
        );
        b.on_flushed(19);
        assert_eq!(
            b.unflushed_bytes(),
            MAX_UNFLUSHED_BYTES / 2 - 1,
            "offset 19 is not durable yet"
        );
        b.on_flushed(20);
        assert_eq!(b.unflushed_bytes(), 0, "a batch ending at the durable end is durable");
        b.on_append(20, MAX_UNFLUSHED_BYTES / 2 - 1);
        b.on_truncate(10);
        assert_eq!(b.unflushed_bytes(), 0, "a truncated batch waits for nothing");
        b.on_append(30, 5);
        b.on_log_replaced();
        assert_eq!(b.unflushed_bytes(), 0);
    }

    #[test]
    fn accepted_proposals_wait_until_the_high_watermark_passes_them_or_leadership_ends() {
        let mut b = Backlog::default();
        for last in 0..MAX_AWAITING_COMMIT as Offset {
            b.on_accepted(last);
        }
        assert_eq!(
            b.admit(0),
            Err(ProposeError::CommitBehind {
                appends: MAX_AWAITING_COMMIT
            })
        );
        b.on_high_watermark(1);
        assert_eq!(b.admit(0), Ok(()), "the proposal ending at 0 committed");
        b.on_accepted(MAX_AWAITING_COMMIT as Offset);
        assert!(b.admit(0).is_err());
        b.on_leadership_ended();
        assert_eq!(b.admit(0), Ok(()));
    }
}
