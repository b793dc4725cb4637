//! The engine's view of its log: bounds, what is durable, and the epoch
//! cache (epoch → start offset). It holds no record data.

use super::{Epoch, Offset};

/// Invariants: `start_offset <= flushed_end <= end_offset`... except right
/// after a truncation, where `flushed_end` is lowered with `end_offset`;
/// `epochs` is strictly ascending in both epoch and start offset, and every
/// start offset lies in `[start_offset, end_offset)`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogView {
    start_offset: Offset,
    /// Epoch of the record just below `start_offset` (0 for an empty log).
    start_epoch: Epoch,
    end_offset: Offset,
    /// Everything below this offset is on stable storage.
    flushed_end: Offset,
    epochs: Vec<(Epoch, Offset)>,
}

impl LogView {
    /// A view of a recovered log: everything in it is durable.
    pub fn new(start_offset: Offset, start_epoch: Epoch, end_offset: Offset, epochs: Vec<(Epoch, Offset)>) -> Self {
        assert!(
            start_offset <= end_offset,
            "log start {start_offset} past end {end_offset}"
        );
        for pair in epochs.windows(2) {
            assert!(
                pair[0].0 < pair[1].0 && pair[0].1 < pair[1].1,
                "epoch cache not ascending: {epochs:?}"
            );
        }
        LogView {
            start_offset,
            start_epoch,
            end_offset,
            flushed_end: end_offset,
            epochs,
        }
    }

    pub fn empty() -> Self {
        LogView::new(0, 0, 0, Vec::new())
    }

    pub fn start_offset(&self) -> Offset {
        self.start_offset
    }

    pub fn end_offset(&self) -> Offset {
        self.end_offset
    }

    pub fn flushed_end(&self) -> Offset {
        self.flushed_end
    }

    pub fn epochs(&self) -> &[(Epoch, Offset)] {
        &self.epochs
    }

    /// Epoch of the last record in the log (0 when empty).
    pub fn last_epoch(&self) -> Epoch {
        self.epochs.last().map(|e| e.0).unwrap_or(self.start_epoch)
    }

    /// Epoch of the record just below `offset` (for `last_fetched_epoch`
    /// and vote requests).
    pub fn epoch_before(&self, offset: Offset) -> Epoch {
        self.epochs
            .iter()
            .rev()
            .find(|(_, start)| *start < offset)
            .map(|e| e.0)
            .unwrap_or(self.start_epoch)
    }

    /// Kafka's `endOffsetForEpoch`: the largest epoch `<= epoch` in the log
    /// and the offset where it ends (the start of the next epoch, or the log
    /// end). `None` when the log has no epoch that old (below the start).
    pub fn end_offset_for_epoch(&self, epoch: Epoch) -> Option<(Epoch, Offset)> {
        let idx = self.epochs.iter().rposition(|(e, _)| *e <= epoch);
        match idx {
            Some(i) => {
                let end = self.epochs.get(i + 1).map(|e| e.1).unwrap_or(self.end_offset);
                Some((self.epochs[i].0, end))
            }
            None if epoch >= self.start_epoch => {
                // Only the (snapshot) prefix is that old.
                let end = self.epochs.first().map(|e| e.1).unwrap_or(self.end_offset);
                Some((self.start_epoch, end))
            }
            None => None,
        }
    }

    /// Records an appended batch.
    pub fn append(&mut self, base_offset: Offset, next_offset: Offset, epoch: Epoch) {
        assert_eq!(base_offset, self.end_offset, "non-contiguous append");
        assert!(next_offset > base_offset, "empty batch");
        match self.epochs.last() {
            Some((last, _)) if *last == epoch => {}
            Some((last, _)) => {
                assert!(epoch > *last, "append of epoch {epoch} after epoch {last}");
                self.epochs.push((epoch, base_offset));
            }
            None => {
                assert!(
                    epoch >= self.start_epoch,
                    "append of epoch {epoch} below the start epoch"
                );
                self.epochs.push((epoch, base_offset));
            }
        }
        self.end_offset = next_offset;
    }

    /// Records a truncation to `end_offset`.
    pub fn truncate(&mut self, end_offset: Offset) {
        assert!(end_offset >= self.start_offset, "truncation below the log start");
        if end_offset >= self.end_offset {
            return;
        }
        self.epochs.retain(|(_, start)| *start < end_offset);
        self.end_offset = end_offset;
        self.flushed_end = self.flushed_end.min(end_offset);
    }

    /// The log now starts at `start_offset` (a batch boundary that is
    /// durable), whose previous record has `start_epoch`: everything below
    /// was compacted into a snapshot.
    pub fn advance_start(&mut self, start_offset: Offset, start_epoch: Epoch) {
        assert!(
            start_offset >= self.start_offset && start_offset <= self.flushed_end,
            "log start {start_offset} outside [{}, {}]",
            self.start_offset,
            self.flushed_end
        );
        // The epoch of the record at the new start, if there is one.
        let covering = self
            .epochs
            .iter()
            .rev()
            .find(|(_, start)| *start <= start_offset)
            .copied();
        self.epochs.retain(|(_, start)| *start > start_offset);
        if let Some((epoch, _)) = covering.filter(|_| start_offset < self.end_offset) {
            self.epochs.insert(0, (epoch, start_offset));
        }
        self.start_offset = start_offset;
        self.start_epoch = start_epoch;
    }

    /// Storage made everything below `durable_end` durable.
    pub fn on_flushed(&mut self, durable_end: Offset) {
        self.flushed_end = self.flushed_end.max(durable_end.min(self.end_offset));
    }

    /// True when there are writes not yet durable.
    pub fn has_unflushed(&self) -> bool {
        self.flushed_end < self.end_offset
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> LogView {
        // epoch 1 at [0,3), epoch 3 at [3,7), epoch 4 at [7,10)
        LogView::new(0, 0, 10, vec![(1, 0), (3, 3), (4, 7)])
    }

    #[test]
    fn end_offset_for_epoch_finds_the_largest_epoch_not_above() {
        let log = sample();
        assert_eq!(log.end_offset_for_epoch(1), Some((1, 3)));
        assert_eq!(log.end_offset_for_epoch(2), Some((1, 3)));
        assert_eq!(log.end_offset_for_epoch(3), Some((3, 7)));
        assert_eq!(log.end_offset_for_epoch(4), Some((4, 10)));
        assert_eq!(log.end_offset_for_epoch(9), Some((4, 10)));
        assert_eq!(log.end_offset_for_epoch(0), Some((0, 0)));
    }

    #[test]
    fn epoch_before_reads_the_epoch_of_the_previous_record() {
        let log = sample();
        assert_eq!(log.epoch_before(0), 0);
        assert_eq!(log.epoch_before(3), 1);
        assert_eq!(log.epoch_before(4), 3);
        assert_eq!(log.epoch_before(10), 4);
    }

    #[test]
    fn advancing_the_start_keeps_the_epochs_above_it() {
        let mut log = sample();
        log.advance_start(5, 3);
        assert_eq!((log.start_offset(), log.end_offset()), (5, 10));
        assert_eq!(log.epochs(), &[(3, 5), (4, 7)]);
        assert_eq!(log.epoch_before(5), 3);
        assert_eq!(log.epoch_before(8), 4);
        assert_eq!(log.end_offset_for_epoch(1), None, "epoch 1 is below the start now");
        log.advance_start(10, 4);
        assert_eq!(log.epochs(), &[] as &[(Epoch, Offset)]);
        assert_eq!((log.last_epoch(), log.epoch_before(10)), (4, 4));
        log.append(10, 12, 4);
        assert_eq!(log.epochs(), &[(4, 10)]);
    }

    #[test]
    fn truncate_drops_epochs_and_lowers_flushed_end() {
        let mut log = sample();
        log.truncate(7);
        assert_eq!(log.end_offset(), 7);
        assert_eq!(log.last_epoch(), 3);
        assert_eq!(log.flushed_end(), 7);
        log.append(7, 9, 5);
        assert_eq!(log.epochs(), &[(1, 0), (3, 3), (5, 7)]);
        assert!(log.has_unflushed());
        log.on_flushed(9);
        assert!(!log.has_unflushed());
    }
}
