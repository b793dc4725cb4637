//! The leader's batch accumulator (Kafka's `BatchAccumulator`): proposals
//! get their offsets at once and are written as one batch per drain.

use crate::messages::Record;

use super::Offset;

/// Records waiting to be written as one batch.
///
/// Invariant: `bytes` is the sum of `Record::encoded_len` of `records`, and
/// never exceeds the batch cap the leader was configured with.
#[derive(Debug, Default)]
pub struct BatchAccumulator {
    records: Vec<Record>,
    bytes: usize,
    /// When the oldest waiting record arrived (linger starts there).
    first_append_ms: Option<u64>,
}

impl BatchAccumulator {
    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// True when adding `extra` bytes would overflow `max_bytes`.
    pub fn would_overflow(&self, extra: usize, max_bytes: usize) -> bool {
        !self.records.is_empty() && self.bytes + extra > max_bytes
    }

    pub fn add(&mut self, records: Vec<Record>, bytes: usize, now_ms: u64) {
        self.first_append_ms.get_or_insert(now_ms);
        self.records.extend(records);
        self.bytes += bytes;
    }

    /// When the linger of the oldest record runs out.
    pub fn linger_deadline_ms(&self, linger_ms: u64) -> Option<u64> {
        self.first_append_ms.map(|t| t + linger_ms)
    }

    /// Offset the next proposal's first record gets, given the log end.
    pub fn next_offset(&self, log_end: Offset) -> Offset {
        log_end + self.records.len() as Offset
    }

    /// Takes everything waiting.
    pub fn drain(&mut self) -> Vec<Record> {
        self.bytes = 0;
        self.first_append_ms = None;
        std::mem::take(&mut self.records)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn it_overflows_only_when_something_waits_and_the_sum_passes_the_cap() {
        let mut accumulator = BatchAccumulator::default();
        assert!(
            !accumulator.would_overflow(200, 100),
            "an empty one takes anything the cap allows"
        );
        accumulator.add(vec![Record::NoOp], 60, 0);
        assert!(!accumulator.would_overflow(40, 100), "60 + 40 fits in 100");
        assert!(accumulator.would_overflow(41, 100), "60 + 41 does not");
        assert_eq!(accumulator.next_offset(10), 11);
        assert_eq!(accumulator.drain(), vec![Record::NoOp]);
        assert!(accumulator.is_empty() && accumulator.bytes() == 0);
    }
}
