//! The QuorumState's reads of the log: batches for Fetch answers (from the
//! tail cache, else queued on the storage thread) and snapshot chunks for
//! FetchSnapshot answers, both bounded by `MAX_FETCH_READS`; and committed
//! records for clients (`ReadCommitted`), bounded by `MAX_CLIENT_READS`.

use super::*;
use crate::messages::FetchSnapshotResponse;
use crate::raft::ReadRange;

impl Handler<ReadCommitted> for QuorumState {
    type Result = ResponseFuture<Result<RecordPage, NodeError>>;

    fn handle(&mut self, msg: ReadCommitted, ctx: &mut Self::Context) -> Self::Result {
        self.tick();
        self.drive(ctx);
        // The executed high watermark: every batch below it has been queued
        // to storage, so a read queued now sees exactly the committed log.
        let high_watermark = self.executed_high_watermark;
        let log_start_offset = self.node.log().start_offset();
        // Below the log start the records come from the newest snapshot,
        // which holds every one of them; unless it holds a state machine's
        // state: then the log is read from its start.
        let from = match self.state_machine {
            Some(_) => msg.from.max(log_start_offset),
            None => msg.from.max(0),
        };
        let max = msg.max.min(READ_COMMITTED_MAX_RECORDS);
        let empty = RecordPage {
            high_watermark,
            log_start_offset,
            records: Vec::new(),
        };
        if from >= high_watermark || max == 0 {
            return Box::pin(ready(Ok(empty)));
        }
        if self.client_reads >= MAX_CLIENT_READS {
            return Box::pin(ready(Err(NodeError::Busy(format!(
                "{MAX_CLIENT_READS} log reads are already in progress; try again"
            )))));
        }
        let batches = match self.appender.read(from, high_watermark, READ_COMMITTED_MAX_BYTES) {
            Ok(batches) => batches,
            Err(e) => return Box::pin(ready(Err(NodeError::Storage(format!("cannot read the log: {e}"))))),
        };
        // The read stays counted until the storage thread has answered it,
        // even if the client goes away first.
        self.client_reads += 1;
        let (tx, rx) = oneshot::channel();
        ctx.spawn(wrap_future::<_, Self>(batches).map(move |result, act, _ctx| {
            act.client_reads -= 1;
            let _ = tx.send(result);
        }));
        Box::pin(async move {
            let batches = rx
                .await
                .ok()
                .and_then(Result::ok)
                .ok_or_else(|| NodeError::Stopped("the storage thread stopped".into()))?
                .map_err(|e| NodeError::Storage(format!("cannot read the log: {e}")))?;
            let records = committed_records(batches, from, high_watermark, max)?;
            Ok(RecordPage {
                high_watermark,
                log_start_offset,
                records,
            })
        })
    }
}

impl QuorumState {
    /// Carries out a `RespondFetch`: the answer as the engine made it, or
    /// filled with the batches of its range, from the tail cache when it
    /// holds them, else read on the storage thread (at most
    /// [`MAX_FETCH_READS`] queued; past that the fetch is answered with a
    /// storage error, which the fetcher retries). Err: the storage thread
    /// is gone, which is fatal.
    pub(super) fn answer_fetch(
        &mut self,
        request_id: u64,
        mut response: FetchResponse,
        read: Option<ReadRange>,
    ) -> Result<(), String> {
        let Some(reply) = self.inbound.remove(&request_id) else {
            debug!(request_id, "fetch response for a request that is no longer waiting");
            return Ok(());
        };
        let Some(range) = read else {
            let _ = reply.send(RaftResponse::Fetch(response));
            return Ok(());
        };
        if let Some(batches) = self.tail.read(range.from, range.until, range.max_bytes) {
            let records: u64 = batches.iter().map(|b| b.record_count as u64).sum();
            self.metrics.fetch_records_total.fetch_add(records, Ordering::Relaxed);
            let _ = reply.send(RaftResponse::Fetch(complete_fetch(response, Ok(batches))));
            return Ok(());
        }
        let Some(queued) = FetchRead::start(&self.fetch_reads, request_id) else {
            response.error = ErrorCode::KafkaStorageError;
            let _ = reply.send(RaftResponse::Fetch(response));
            return Ok(());
        };
        // The read is queued behind every append sent so far and
        // answered without waiting for a flush (the leader may
        // ship records before its own fsync; it counts itself
        // toward the high watermark only after it).
        let batches = match self.appender.read(range.from, range.until, range.max_bytes) {
            Ok(batches) => batches,
            Err(e) => return Err(format!("cannot queue a fetch read: {e}")),
        };
        let fetched = self.metrics.fetch_records_total.clone();
        actix::spawn(async move {
            // A dropped reply means the storage thread failed; it
            // reported that itself and the node is stopping.
            let read = batches.await;
            drop(queued);
            if let Ok(read) = read {
                let response = complete_fetch(response, read);
                let records: u64 = response.batches.iter().map(|b| b.record_count as u64).sum();
                fetched.fetch_add(records, Ordering::Relaxed);
                let _ = reply.send(RaftResponse::Fetch(response));
            }
        });
        Ok(())
    }

    /// Carries out a `RespondFetchSnapshot`: the chunk is read beside the
    /// storage thread (the chunk server), within the same bound as fetch
    /// reads.
    pub(super) fn answer_snapshot_chunk(
        &mut self,
        request_id: u64,
        mut response: FetchSnapshotResponse,
        max_bytes: usize,
    ) -> Result<(), String> {
        let Some(reply) = self.inbound.remove(&request_id) else {
            return Ok(());
        };
        let Some(queued) = FetchRead::start(&self.fetch_reads, request_id) else {
            response.error = ErrorCode::KafkaStorageError;
            let _ = reply.send(RaftResponse::FetchSnapshot(response));
            return Ok(());
        };
        let chunk = self
            .appender
            .read_snapshot_chunk(response.snapshot_id, response.position, max_bytes);
        let chunk = match chunk {
            Ok(chunk) => chunk,
            Err(e) => return Err(format!("cannot queue a snapshot read: {e}")),
        };
        actix::spawn(async move {
            let chunk = chunk.await;
            drop(queued);
            match chunk {
                Ok(Ok(chunk)) => {
                    response.size = chunk.size;
                    response.bytes = chunk.bytes;
                }
                Ok(Err(e)) => {
                    warn!(id = ?response.snapshot_id, "cannot serve the snapshot: {e}");
                    response.error = ErrorCode::SnapshotNotFound;
                }
                // The thread reading it stopped: the next read
                // is refused, and that stops the node.
                Err(_) => return,
            }
            let _ = reply.send(RaftResponse::FetchSnapshot(response));
        });
        Ok(())
    }
}

/// One queued fetch read, counted in `QuorumState::fetch_reads` until it
/// is dropped (its answer came, or the storage side went away).
pub(super) struct FetchRead(Arc<AtomicUsize>);

impl FetchRead {
    /// Counts one more queued read, or None when [`MAX_FETCH_READS`] are
    /// queued already (the fetch is then answered with a storage error).
    pub(super) fn start(fetch_reads: &Arc<AtomicUsize>, request_id: u64) -> Option<FetchRead> {
        if fetch_reads.load(Ordering::Relaxed) >= MAX_FETCH_READS {
            debug!(
                request_id,
                "{MAX_FETCH_READS} fetch reads are queued; answering a storage error"
            );
            return None;
        }
        fetch_reads.fetch_add(1, Ordering::Relaxed);
        Some(FetchRead(fetch_reads.clone()))
    }
}

impl Drop for FetchRead {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A fetch answer once its read is done: the batches read, or, when the
/// read failed, none and Kafka's KAFKA_STORAGE_ERROR, which the follower
/// retries after its backoff (rather than waiting out its request timeout
/// for an answer that never comes).
pub(super) fn complete_fetch(mut response: FetchResponse, read: ReadResult) -> FetchResponse {
    match read {
        Ok(batches) => response.batches = batches,
        Err(e) => {
            warn!("a fetch is answered with a storage error: {e}");
            response.error = ErrorCode::KafkaStorageError;
            response.batches = Vec::new();
        }
    }
    response
}

/// The records of `batches` in `[from, until)`, at most `max`, contiguous
/// from `from`.
pub(super) fn committed_records(
    batches: Vec<Batch>,
    from: Offset,
    until: Offset,
    max: usize,
) -> Result<Vec<CommittedRecord>, NodeError> {
    let mut entries = Vec::new();
    let mut expected = from;
    'batches: for batch in batches {
        let records = batch.records().map_err(|e| {
            NodeError::Storage(format!(
                "committed batch at offset {} does not decode: {e}",
                batch.base_offset
            ))
        })?;
        for (i, record) in records.into_iter().enumerate() {
            let offset = batch.base_offset + i as Offset;
            if offset < expected {
                continue;
            }
            if offset >= until || entries.len() >= max {
                break 'batches;
            }
            if offset != expected {
                return Err(NodeError::Storage(format!(
                    "gap in the committed log: expected offset {expected}, found {offset}"
                )));
            }
            entries.push(CommittedRecord {
                offset,
                epoch: batch.epoch,
                record,
            });
            expected += 1;
        }
    }
    Ok(entries)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    pub(super) fn committed_records_are_contiguous_and_bounded_and_shown_as_text_for_http() {
        let b0 = Batch::new(
            0,
            1,
            &[Record::LeaderChange {
                leader_id: 1,
                voters: vec![1],
                granting_voters: vec![1],
            }],
        );
        let b1 = Batch::new(
            1,
            1,
            &[
                Record::Data(b"a".to_vec()),
                Record::Data(vec![0xff, 0x00, 0xfe]),
                Record::NoOp,
            ],
        );
        let all = committed_records(vec![b0.clone(), b1.clone()], 0, 4, 100).unwrap();
        assert_eq!(all.iter().map(|e| e.offset).collect::<Vec<_>>(), vec![0, 1, 2, 3]);
        assert_eq!(all[0].record.kind(), "leader_change");
        assert_eq!(all[1].record, Record::Data(b"a".to_vec()));
        assert_eq!(all[2].record, Record::Data(vec![0xff, 0x00, 0xfe]), "bytes as appended");
        assert_eq!(all[3].record, Record::NoOp);
        // From the middle of a batch, bounded by the high watermark and max.
        let some = committed_records(vec![b1.clone()], 2, 4, 1).unwrap();
        assert_eq!(some.len(), 1);
        assert_eq!(some[0].offset, 2);
        let below_hw = committed_records(vec![b0, b1], 0, 2, 100).unwrap();
        assert_eq!(below_hw.len(), 2);
        // The HTTP API's page: kinds as words, data as (lossy) text.
        let page = crate::messages::records::LogPage::from(RecordPage {
            high_watermark: 4,
            log_start_offset: 0,
            records: all,
        });
        let shown: Vec<(&str, Option<&str>)> = page
            .records
            .iter()
            .map(|e| (e.kind.as_str(), e.value.as_deref()))
            .collect();
        assert_eq!(
            shown,
            [
                ("leader_change", None),
                ("data", Some("a")),
                ("data", Some("\u{fffd}\u{0}\u{fffd}")),
                ("noop", None)
            ]
        );
    }

    #[test]
    pub(super) fn a_fetch_whose_read_failed_is_answered_with_a_storage_error() {
        let response = FetchResponse {
            error: ErrorCode::None,
            epoch: 3,
            leader_id: Some(1),
            high_watermark: 10,
            log_start_offset: 0,
            diverging_epoch: None,
            snapshot_id: None,
            batches: Vec::new(),
        };
        let batch = Batch::new(4, 3, &[Record::NoOp]);
        let read = complete_fetch(response.clone(), Ok(vec![batch.clone()]));
        assert_eq!((read.error, read.batches), (ErrorCode::None, vec![batch]));
        let failed = complete_fetch(
            response.clone(),
            Err(StorageError::Io(std::io::Error::other("disk on fire"))),
        );
        assert_eq!(
            failed,
            FetchResponse {
                error: ErrorCode::KafkaStorageError,
                ..response
            }
        );
    }

    #[test]
    pub(super) fn committed_records_reject_a_gap() {
        let b = Batch::new(5, 1, &[Record::NoOp]);
        assert!(committed_records(vec![b], 3, 10, 100).is_err());
    }
}
