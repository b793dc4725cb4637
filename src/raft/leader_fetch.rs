//! The leader's side of replication: answering Fetch and FetchSnapshot
//! requests, holding fetches until there is something to send (Kafka's
//! fetch purgatory), and moving the high watermark as voters acknowledge.
//! Part of the Leader role (see `leader.rs`).
//!
//! The rules it carries (KIP-595, KIP-630): a fetch is checked against the
//! leader's log (Kafka's `validateOffsetAndEpoch`) and a replica that
//! diverged is told where to truncate; one below the log start, or that
//! would truncate to it, gets the snapshot instead; a voter's fetch offset
//! is its durable log end and counts toward the high watermark, which
//! moves only past this epoch's first record and never backwards; a
//! voter's Fetch or FetchSnapshot counts toward check-quorum.

use crate::messages::{
    DivergingEpoch, ErrorCode, FetchRequest, FetchSnapshotRequest, FetchSnapshotResponse, RaftResponse, SnapshotId,
};

use super::node::{Action, RaftNode, Role};
use super::{Epoch, NodeId, Offset};

/// A Fetch the leader holds until data arrives, the high watermark moves,
/// or `deadline_ms` passes (Kafka's fetch purgatory).
/// Most observers a leader tracks at once.
pub const MAX_OBSERVERS: usize = 1024;

/// Most bytes of batches the leader reads for one Fetch answer, whatever
/// the fetcher asks for (its first batch is always sent whole, so a batch
/// of up to [`MAX_BATCH_BYTES`](crate::messages::MAX_BATCH_BYTES) still goes through).
///
/// An answer is held in memory twice before it leaves (the batches read,
/// then the frame they are encoded into), and a replica catching up asks
/// for [`MAX_BATCH_BYTES`](crate::messages::MAX_BATCH_BYTES) each time. A leader serving the whole log of 1M
/// records of 100 B to a fresh observer in answers of 8 MiB peaked at
/// 98-136 MiB of RSS (`bench state`, 10 runs), most of all near the log
/// end, where an answer is first copied out of the tail cache; in answers
/// of 1 MiB at 75-85 MiB, the join taking 0.94-1.22 s instead of 0.90-0.92
/// s. Kafka serves fetches from the page cache (sendfile), not the heap. A
/// fetcher gets the rest in its next fetches.
pub const FETCH_READ_MAX_BYTES: usize = 1 << 20;

/// Most bytes of a snapshot the leader sends in one FetchSnapshot answer,
/// whatever the fetcher asks for (Kafka's followers ask for 8 MiB, and so
/// do kraft's). A chunk is held in memory on both sides, as read and as the
/// frame it is encoded into, like a Fetch answer (see
/// [`FETCH_READ_MAX_BYTES`]). A fresh observer fetching a 107 MiB snapshot
/// peaked at 36-115 MiB of RSS in chunks of 8 MiB and at 17-19 MiB in
/// chunks of 1 MiB, and caught up in 0.8-1.2 s instead of 1.5-2.0 s
/// (`bench state`, three alternated pairs).
pub const SNAPSHOT_CHUNK_MAX_BYTES: usize = 1 << 20;

/// The log range a Fetch response must carry; the shell reads it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReadRange {
    pub from: Offset,
    /// Exclusive; never past what the leader had appended when it decided.
    pub until: Offset,
    pub max_bytes: usize,
}

#[derive(Clone, Debug)]
pub(super) struct ParkedFetch {
    pub(super) replica: NodeId,
    pub(super) request_id: u64,
    pub(super) fetch_offset: Offset,
    pub(super) max_bytes: u32,
    pub(super) deadline_ms: u64,
}

impl RaftNode {
    pub(super) fn handle_fetch_request(&mut self, request_id: u64, req: FetchRequest) {
        let replica = req.replica_id;
        let reply_error = |node: &mut Self, error: ErrorCode| {
            let response = node.fetch_error(error);
            node.actions.push(Action::RespondFetch {
                to: replica,
                request_id,
                response,
                read: None,
            });
        };
        if !matches!(self.role, Role::Leader(_)) {
            return reply_error(self, ErrorCode::NotLeaderOrFollower);
        }
        if req.current_epoch < self.election.epoch {
            return reply_error(self, ErrorCode::FencedLeaderEpoch);
        }
        if req.current_epoch > self.election.epoch {
            return reply_error(self, ErrorCode::UnknownLeaderEpoch);
        }
        if replica == self.config.node_id || req.fetch_offset < 0 {
            return reply_error(self, ErrorCode::InvalidRequest);
        }
        // KIP-630: a replica below our log start, or one that would have to
        // truncate to (or below) it to agree with us, gets our snapshot.
        let start = self.log.start_offset();
        let diverging = self.validate_fetch_position(req.fetch_offset, req.last_fetched_epoch);
        let needs_snapshot =
            req.fetch_offset < start || (start > 0 && diverging.is_some_and(|d| d.end_offset <= start));
        if needs_snapshot || diverging.is_some() {
            let mut response = self.fetch_error(ErrorCode::None);
            if needs_snapshot {
                response.snapshot_id = Some(self.snapshot_at_log_start());
            } else {
                response.diverging_epoch = diverging;
            }
            self.actions.push(Action::RespondFetch {
                to: replica,
                request_id,
                response,
                read: None,
            });
            return;
        }
        // Observers are whoever fetches; bound how many a leader tracks (and
        // parks fetches for) so that unknown peers cannot grow it for ever.
        if let Role::Leader(leader) = &self.role {
            let known = leader.voters.contains_key(&replica) || leader.observers.contains_key(&replica);
            if !known && leader.observers.len() >= MAX_OBSERVERS {
                return reply_error(self, ErrorCode::BrokerNotAvailable);
            }
        }
        // A valid position: it is the replica's log end (durable for voters).
        self.drain_for_fetch(req.fetch_offset);
        let now = self.now_ms;
        let end = self.log.end_offset();
        let check_quorum_ms = self.check_quorum_ms();
        let majority = self.config.majority();
        let Role::Leader(leader) = &mut self.role else {
            unreachable!()
        };
        let is_voter = leader.record_fetch(replica, req.fetch_offset, end, now, check_quorum_ms, majority);
        let told = leader.replica(replica).map_or(0, |r| r.high_watermark_sent);
        let hw_before = self.high_watermark;
        if is_voter {
            self.maybe_advance_leader_high_watermark();
        }
        // A replica may have only one parked fetch; an older one is answered.
        if let Some(i) = self.parked.iter().position(|p| p.replica == replica) {
            let old = self.parked.remove(i);
            self.complete_parked(old);
        }
        let mut parked = ParkedFetch {
            replica,
            request_id,
            fetch_offset: req.fetch_offset,
            max_bytes: req.max_bytes,
            deadline_ms: now + req.max_wait_ms.min(self.config.fetch_max_wait_ms),
        };
        // Behind on the high watermark: its own fetch moved it, or another
        // replica's did since it was last told.
        let behind = self.high_watermark != hw_before || told < self.high_watermark;
        let linger = self.high_watermark_linger_ms();
        if req.fetch_offset < end || req.max_wait_ms == 0 || (behind && linger == 0) {
            self.complete_parked(parked);
        } else {
            if behind {
                parked.deadline_ms = parked.deadline_ms.min(now + linger);
            }
            self.parked.push(parked);
        }
    }

    /// The snapshot a replica below the log start must fetch: the newest
    /// local one (the log start only moves up to a snapshot's end).
    fn snapshot_at_log_start(&self) -> SnapshotId {
        let start = self.log.start_offset();
        match self.latest_snapshot {
            Some(id) if id.end_offset >= start => id,
            _ => SnapshotId {
                end_offset: start,
                epoch: self.log.epoch_before(start),
            },
        }
    }

    pub(super) fn handle_fetch_snapshot_request(&mut self, from: NodeId, request_id: u64, req: FetchSnapshotRequest) {
        let now = self.now_ms;
        let error = if !matches!(self.role, Role::Leader(_)) {
            ErrorCode::NotLeaderOrFollower
        } else if req.current_epoch < self.election.epoch {
            ErrorCode::FencedLeaderEpoch
        } else if req.current_epoch > self.election.epoch {
            ErrorCode::UnknownLeaderEpoch
        } else if req.replica_id != from || from == self.config.node_id {
            ErrorCode::InvalidRequest
        } else if self.latest_snapshot != Some(req.snapshot_id) {
            ErrorCode::SnapshotNotFound
        } else {
            ErrorCode::None
        };
        let response = FetchSnapshotResponse {
            error,
            epoch: self.election.epoch,
            leader_id: self.leader_id(),
            snapshot_id: req.snapshot_id,
            size: 0,
            position: req.position,
            bytes: Vec::new(),
        };
        if error != ErrorCode::None {
            self.respond(from, request_id, RaftResponse::FetchSnapshot(response));
            return;
        }
        // A voter fetching a snapshot is alive for check-quorum, as in Kafka.
        let check_quorum_ms = self.check_quorum_ms();
        let majority = self.config.majority();
        if let Role::Leader(leader) = &mut self.role {
            leader.record_alive(from, now, check_quorum_ms, majority);
        }
        self.actions.push(Action::RespondFetchSnapshot {
            to: from,
            request_id,
            response,
            max_bytes: (req.max_bytes as usize).min(SNAPSHOT_CHUNK_MAX_BYTES),
        });
    }

    /// Kafka's `validateOffsetAndEpoch`: None when (offset, epoch) is a
    /// prefix of our log, else where the replica must truncate to.
    fn validate_fetch_position(&self, fetch_offset: Offset, last_fetched_epoch: Epoch) -> Option<DivergingEpoch> {
        if fetch_offset == self.log.start_offset() && last_fetched_epoch == self.log.epoch_before(fetch_offset) {
            return None;
        }
        match self.log.end_offset_for_epoch(last_fetched_epoch) {
            Some((epoch, end_offset)) if epoch == last_fetched_epoch && fetch_offset <= end_offset => None,
            Some((epoch, end_offset)) => Some(DivergingEpoch {
                epoch,
                end_offset: end_offset.min(fetch_offset),
            }),
            None => Some(DivergingEpoch {
                epoch: self.log.epoch_before(self.log.start_offset()),
                end_offset: self.log.start_offset(),
            }),
        }
    }

    /// The log start moved up to `start_offset`: parked fetches below it
    /// are answered with the snapshot.
    ///
    /// Defensive, and no test can reach it: a fetch is parked only at the
    /// log end and answered as soon as a record is appended past it
    /// (`poll_parked`), while the log start never passes the flushed end.
    /// It keeps a parked fetch from reading below the log start should
    /// either rule change. (cargo-mutants' `replace with ()` of it is
    /// equivalent for that reason.)
    pub(super) fn answer_parked_below_log_start(&mut self, start_offset: Offset) {
        let (below, above): (Vec<ParkedFetch>, Vec<ParkedFetch>) = std::mem::take(&mut self.parked)
            .into_iter()
            .partition(|p| p.fetch_offset < start_offset);
        self.parked = above;
        for parked in below {
            let mut response = self.fetch_error(ErrorCode::None);
            response.snapshot_id = Some(self.snapshot_at_log_start());
            self.actions.push(Action::RespondFetch {
                to: parked.replica,
                request_id: parked.request_id,
                response,
                read: None,
            });
        }
    }

    /// Answers a parked fetch with whatever it can have now.
    fn complete_parked(&mut self, parked: ParkedFetch) {
        let end = self.log.end_offset();
        let high_watermark = self.high_watermark;
        if let Role::Leader(leader) = &mut self.role {
            if let Some(replica) = leader.replica_mut(parked.replica) {
                replica.high_watermark_sent = high_watermark;
            }
        }
        let response = self.fetch_error(ErrorCode::None);
        let read = (parked.fetch_offset < end).then_some(ReadRange {
            from: parked.fetch_offset,
            until: end,
            max_bytes: (parked.max_bytes as usize).min(FETCH_READ_MAX_BYTES),
        });
        self.actions.push(Action::RespondFetch {
            to: parked.replica,
            request_id: parked.request_id,
            response,
            read,
        });
    }

    /// Completes parked fetches whose data arrived or whose wait ran out.
    pub(super) fn poll_parked(&mut self) {
        if self.parked.is_empty() {
            return;
        }
        let now = self.now_ms;
        let end = self.log.end_offset();
        let (ready, waiting): (Vec<ParkedFetch>, Vec<ParkedFetch>) = std::mem::take(&mut self.parked)
            .into_iter()
            .partition(|p| p.fetch_offset < end || now >= p.deadline_ms);
        self.parked = waiting;
        for parked in ready {
            self.complete_parked(parked);
        }
    }

    /// How long a fetch behind on the high watermark may stay parked now:
    /// `high_watermark_linger_ms` while this leader holds nothing
    /// uncommitted (its whole log is below the high watermark and nothing
    /// waits to be appended; its own flush may still run, the followers'
    /// made the majority), so that only a new write can come next; 0
    /// while writes are in flight, as Kafka does. Those writes keep
    /// followers fetching anyway, and holding a fetch back then made them
    /// take smaller batches sooner (`ab` at 256 clients, BENCHMARKS.md).
    fn high_watermark_linger_ms(&self) -> u64 {
        if self.log.end_offset() == self.high_watermark && self.accumulator.is_empty() {
            self.config.high_watermark_linger_ms
        } else {
            0
        }
    }

    /// Answers at once the parked fetches of replicas not yet told the
    /// current high watermark.
    pub(super) fn complete_parked_behind_on_high_watermark(&mut self) {
        let Role::Leader(leader) = &self.role else { return };
        let hw = self.high_watermark;
        let (behind, rest): (Vec<ParkedFetch>, Vec<ParkedFetch>) = std::mem::take(&mut self.parked)
            .into_iter()
            .partition(|p| leader.replica(p.replica).is_none_or(|r| r.high_watermark_sent < hw));
        self.parked = rest;
        for parked in behind {
            self.complete_parked(parked);
        }
    }

    /// The high watermark moved: every parked fetch is answered within
    /// `high_watermark_linger_ms`, sooner if records come.
    fn tell_parked_of_high_watermark(&mut self) {
        let linger = self.high_watermark_linger_ms();
        if linger == 0 {
            for parked in std::mem::take(&mut self.parked) {
                self.complete_parked(parked);
            }
            return;
        }
        let deadline = self.now_ms + linger;
        for parked in &mut self.parked {
            parked.deadline_ms = parked.deadline_ms.min(deadline);
        }
    }

    pub(super) fn maybe_advance_leader_high_watermark(&mut self) {
        let Role::Leader(leader) = &self.role else { return };
        let Some(hw) = leader.compute_high_watermark(self.log.flushed_end(), self.config.majority()) else {
            return;
        };
        // The leader's HW never moves backwards.
        if hw > self.high_watermark {
            self.high_watermark = hw;
            self.backlog.on_high_watermark(hw);
            self.actions.push(Action::HighWatermark(hw));
            self.tell_parked_of_high_watermark();
        }
    }
}
