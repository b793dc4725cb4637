//! The Leader role (Kafka's `LeaderState`): the voter that won the
//! election of its epoch. It alone appends to the log (proposals go through
//! its batch accumulator), tracks every replica's progress, and moves the
//! high watermark; its side of replication (Fetch, FetchSnapshot, parked
//! fetches, the high watermark's advance) is in `leader_fetch.rs`.
//!
//! Enters it: a Candidate that a majority of voters voted for (its own
//! leadership persisted first); its first batch is the epoch's
//! LeaderChange record.
//!
//! Leaves it: for Resigned when it shuts down (`resign`) or fails
//! check-quorum (no majority of voters fetched within 1.5 × the fetch
//! timeout); for Unattached or Follower on a higher epoch. Leaving answers
//! its parked fetches and drops the records not yet written (their
//! proposals fail).
//!
//! The rules it carries (KIP-595): a leader commits nothing of older epochs
//! until a record of its own epoch commits, so the high watermark moves
//! only past the LeaderChange record, to what a majority of voters holds
//! durably, and never backwards; it keeps sending BeginQuorumEpoch to voters
//! that do not fetch, so one that moved on to a later epoch says so and the
//! leader steps down; it resigns on check-quorum failure rather than lead
//! a minority.

use std::collections::{BTreeMap, BTreeSet};

use super::node::{Action, RaftNode, RequestKind, Role};
use super::{ElectionState, Epoch, NodeId, Offset};
use crate::messages::{Batch, BeginQuorumEpochRequest, ErrorCode, RaftRequest, Record, ReplicaInfo};

/// Where an accepted proposal will land. It completes when the high
/// watermark passes `last_offset` while `epoch` is still this node's leader
/// epoch, and fails when leadership of `epoch` is lost first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Proposed {
    pub base_offset: Offset,
    pub last_offset: Offset,
    pub epoch: Epoch,
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ProposeError {
    #[error("not the leader (leader: {leader_id:?}, epoch {epoch})")]
    NotLeader { leader_id: Option<NodeId>, epoch: Epoch },
    #[error("batch of {bytes} bytes exceeds the limit of {limit} bytes")]
    TooLarge { bytes: usize, limit: usize },
    #[error("a proposal needs at least one record")]
    Empty,
    /// [`super::admission::MAX_UNFLUSHED_BYTES`] wait for the disk.
    #[error("{bytes} bytes of appends are waiting for the disk")]
    DiskBehind { bytes: usize },
    /// [`super::admission::MAX_AWAITING_COMMIT`] proposals wait for their commit.
    #[error("{appends} appends are already waiting to commit")]
    CommitBehind { appends: usize },
    /// The records would take the log past [`super::MAX_LOG_OFFSET`].
    #[error(
        "the log is full: the next record would be at offset {next_offset}, and no record goes past offset {}",
        super::MAX_LOG_OFFSET
    )]
    LogFull { next_offset: Offset },
}

/// One replica's progress in the leader's epoch.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReplicaState {
    /// The replica's log end offset from its last valid Fetch in this epoch
    /// (for a voter: durable). None until it has fetched in this epoch.
    pub end_offset: Option<Offset>,
    pub last_fetch_ms: Option<u64>,
    pub last_caught_up_ms: Option<u64>,
    /// The high watermark in the last fetch answer it was sent. A fetch
    /// that finds the high watermark past it is answered at once, so a
    /// replica whose own fetch did not move the high watermark (the other
    /// follower's did) learns it now, not when its fetch's wait runs out.
    pub high_watermark_sent: Offset,
}

#[derive(Clone, Debug)]
pub struct LeaderState {
    pub epoch: Epoch,
    pub local_id: NodeId,
    /// Offset of this epoch's LeaderChange record. The high watermark moves
    /// only once it is past this offset (KIP-595: a leader commits nothing
    /// of older epochs until an entry of its own epoch commits).
    pub epoch_start_offset: Offset,
    /// Every voter except this node.
    pub voters: BTreeMap<NodeId, ReplicaState>,
    pub observers: BTreeMap<NodeId, ReplicaState>,
    pub granting_voters: BTreeSet<NodeId>,
    /// Voters that fetched since the check-quorum timer was last reset.
    fetched_since_check: BTreeSet<NodeId>,
    /// The leader resigns if no majority fetched by then (1.5 × fetch timeout).
    pub check_quorum_deadline_ms: u64,
    /// When to re-send BeginQuorumEpoch to voters that have not fetched.
    pub begin_quorum_resend_ms: u64,
    /// When the last batch was appended (for idle NoOp records).
    pub last_append_ms: u64,
}

impl LeaderState {
    pub fn new(
        epoch: Epoch,
        local_id: NodeId,
        voters: impl Iterator<Item = NodeId>,
        granting_voters: BTreeSet<NodeId>,
        epoch_start_offset: Offset,
        now_ms: u64,
        check_quorum_ms: u64,
    ) -> Self {
        LeaderState {
            epoch,
            local_id,
            epoch_start_offset,
            voters: voters
                .filter(|id| *id != local_id)
                .map(|id| (id, ReplicaState::default()))
                .collect(),
            observers: BTreeMap::new(),
            granting_voters,
            fetched_since_check: BTreeSet::new(),
            check_quorum_deadline_ms: now_ms + check_quorum_ms,
            begin_quorum_resend_ms: now_ms,
            last_append_ms: now_ms,
        }
    }

    /// Records a valid fetch from `replica` at `fetch_offset`. Returns true
    /// when the replica is a voter.
    pub fn record_fetch(
        &mut self,
        replica: NodeId,
        fetch_offset: Offset,
        leader_end_offset: Offset,
        now_ms: u64,
        check_quorum_ms: u64,
        majority: usize,
    ) -> bool {
        let is_voter = self.voters.contains_key(&replica);
        let state = if is_voter {
            self.voters.get_mut(&replica).expect("checked")
        } else {
            self.observers.entry(replica).or_default()
        };
        state.end_offset = Some(fetch_offset);
        state.last_fetch_ms = Some(now_ms);
        if fetch_offset >= leader_end_offset {
            state.last_caught_up_ms = Some(now_ms);
        }
        self.record_alive(replica, now_ms, check_quorum_ms, majority);
        is_voter
    }

    /// What this leader knows of `replica` (a voter or a tracked observer).
    pub fn replica(&self, replica: NodeId) -> Option<&ReplicaState> {
        self.voters.get(&replica).or_else(|| self.observers.get(&replica))
    }

    pub fn replica_mut(&mut self, replica: NodeId) -> Option<&mut ReplicaState> {
        match self.voters.get_mut(&replica) {
            Some(state) => Some(state),
            None => self.observers.get_mut(&replica),
        }
    }

    /// A voter was heard from (a Fetch or a FetchSnapshot): it counts toward
    /// check-quorum. Anyone else is ignored.
    pub fn record_alive(&mut self, replica: NodeId, now_ms: u64, check_quorum_ms: u64, majority: usize) {
        if !self.voters.contains_key(&replica) {
            return;
        }
        self.fetched_since_check.insert(replica);
        // The leader counts itself.
        if self.fetched_since_check.len() + 1 >= majority {
            self.fetched_since_check.clear();
            self.check_quorum_deadline_ms = now_ms + check_quorum_ms;
        }
    }

    /// The high watermark a majority of voters durably holds, counting this
    /// node's **flushed** end offset; None while it is not past the epoch
    /// start offset.
    pub fn compute_high_watermark(&self, local_flushed_end: Offset, majority: usize) -> Option<Offset> {
        let mut ends: Vec<Offset> = self.voters.values().filter_map(|r| r.end_offset).collect();
        ends.push(local_flushed_end);
        if ends.len() < majority {
            return None;
        }
        ends.sort_unstable_by(|a, b| b.cmp(a));
        let hw = ends[majority - 1];
        (hw > self.epoch_start_offset).then_some(hw)
    }

    /// Voters that have not fetched in this epoch, or not within
    /// `within_ms` before `now_ms`. The leader sends them BeginQuorumEpoch
    /// again (as Kafka does for voters silent for half the fetch timeout):
    /// one that moved on to a later epoch answers with it, and the leader
    /// steps down instead of leaving it stranded there.
    pub fn voters_not_fetching(&self, now_ms: u64, within_ms: u64) -> Vec<NodeId> {
        self.voters
            .iter()
            .filter(|(_, r)| r.last_fetch_ms.is_none_or(|at| now_ms.saturating_sub(at) >= within_ms))
            .map(|(id, _)| *id)
            .collect()
    }

    /// Other voters ordered by replicated offset, best first (EndQuorumEpoch).
    pub fn preferred_successors(&self) -> Vec<NodeId> {
        let mut voters: Vec<(NodeId, Offset)> = self
            .voters
            .iter()
            .map(|(id, r)| (*id, r.end_offset.unwrap_or(-1)))
            .collect();
        voters.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        voters.into_iter().map(|(id, _)| id).collect()
    }

    /// Drops observers that have not fetched for `session_ms`.
    pub fn expire_observers(&mut self, now_ms: u64, session_ms: u64) {
        self.observers
            .retain(|_, r| r.last_fetch_ms.map(|t| now_ms < t + session_ms).unwrap_or(false));
    }

    pub fn describe(&self, now_ms: u64, local_end: Offset) -> (Vec<ReplicaInfo>, Vec<ReplicaInfo>) {
        let info = |id: NodeId, r: &ReplicaState| ReplicaInfo {
            id,
            log_end_offset: r.end_offset,
            last_fetch_ms_ago: r.last_fetch_ms.map(|t| now_ms.saturating_sub(t)),
            last_caught_up_ms_ago: r.last_caught_up_ms.map(|t| now_ms.saturating_sub(t)),
        };
        let mut voters = vec![ReplicaInfo {
            id: self.local_id,
            log_end_offset: Some(local_end),
            last_fetch_ms_ago: Some(0),
            last_caught_up_ms_ago: Some(0),
        }];
        voters.extend(self.voters.iter().map(|(id, r)| info(*id, r)));
        voters.sort_by_key(|r| r.id);
        let observers = self.observers.iter().map(|(id, r)| info(*id, r)).collect();
        (voters, observers)
    }
}

impl RaftNode {
    pub(super) fn become_leader(&mut self) {
        let me = self.config.node_id;
        let epoch = self.election.epoch;
        let granting = match &self.role {
            Role::Candidate(c) => c.round.granted.clone(),
            _ => unreachable!("only a candidate becomes leader"),
        };
        let epoch_start = self.log.end_offset();
        let check_quorum_ms = self.check_quorum_ms();
        let leader = LeaderState::new(
            epoch,
            me,
            self.config.voters.keys().copied(),
            granting.clone(),
            epoch_start,
            self.now_ms,
            check_quorum_ms,
        );
        let persist = ElectionState {
            epoch,
            voted_for: Some(me),
            leader_id: Some(me),
        };
        self.election_retries = 1;
        self.transition(Role::Leader(Box::new(leader)), Some(persist));
        // The first batch of every epoch is its LeaderChange record.
        let record = Record::LeaderChange {
            leader_id: me,
            voters: self.config.voters.keys().copied().collect(),
            granting_voters: granting.into_iter().collect(),
        };
        self.append_as_leader(vec![record]);
    }

    /// Earliest time at which a Leader has something to do. Only deadlines
    /// that `poll` acts on count, or a shell would spin.
    pub(super) fn leader_deadline_ms(&self, l: &LeaderState) -> u64 {
        let mut t = u64::MAX;
        if self.config.majority() > 1 {
            t = t.min(l.check_quorum_deadline_ms);
        }
        if self.accumulator.is_empty() {
            t = t.min(l.last_append_ms + self.config.max_idle_interval_ms);
        } else if self.config.append_linger_ms > 0 {
            let linger = self.accumulator.linger_deadline_ms(self.config.append_linger_ms);
            t = t.min(linger.unwrap_or(u64::MAX));
        }
        if !l.voters.is_empty() {
            t = t.min(l.begin_quorum_resend_ms);
        }
        t
    }

    pub(super) fn poll_leader(&mut self) {
        let now = self.now_ms;
        let majority = self.config.majority();
        let fetch_timeout = self.config.fetch_timeout_ms;
        let Role::Leader(leader) = &mut self.role else { return };
        if majority > 1 && now >= leader.check_quorum_deadline_ms {
            // Check-quorum: no majority fetched within 1.5 × fetch timeout.
            tracing::warn!(epoch = self.election.epoch, "check-quorum failed: resigning");
            let successors = leader.preferred_successors();
            let resigned = self.new_resigned(successors);
            self.transition(Role::Resigned(resigned), None);
            self.poll_resigned();
            return;
        }
        leader.expire_observers(now, self.config.observer_session_ms);
        if now >= leader.begin_quorum_resend_ms {
            let interval = (fetch_timeout / 2).max(1);
            leader.begin_quorum_resend_ms = now + interval;
            let targets = leader.voters_not_fetching(now, interval);
            let request = RaftRequest::BeginQuorumEpoch(BeginQuorumEpochRequest {
                epoch: self.election.epoch,
                leader_id: self.config.node_id,
                leader_endpoint: self.config.local_endpoint.clone(),
            });
            for to in targets {
                if !self.has_inflight_to(to, RequestKind::BeginQuorumEpoch) {
                    self.send(to, RequestKind::BeginQuorumEpoch, request.clone());
                }
            }
        }
        self.maybe_drain_accumulator();
        let Role::Leader(leader) = &self.role else { return };
        if self.accumulator.is_empty() && now >= leader.last_append_ms + self.config.max_idle_interval_ms {
            self.append_as_leader(vec![Record::NoOp]);
        }
    }

    /// Leaving the leader role: parked fetches are answered with the new
    /// state, and records not yet written are dropped (their proposals fail
    /// through the RoleChanged action).
    pub(super) fn abandon_leadership(&mut self) {
        self.accumulator.drain();
        self.backlog.on_leadership_ended();
        for parked in std::mem::take(&mut self.parked) {
            let response = self.fetch_error(ErrorCode::NotLeaderOrFollower);
            self.actions.push(Action::RespondFetch {
                to: parked.replica,
                request_id: parked.request_id,
                response,
                read: None,
            });
        }
    }

    /// Gives `records` their offsets in the accumulator (draining it first
    /// if they would overflow it).
    pub(super) fn accumulate(&mut self, records: Vec<Record>) -> Result<Proposed, ProposeError> {
        let epoch = self.election.epoch;
        if !matches!(self.role, Role::Leader(_)) {
            let leader_id = self.leader_id().filter(|id| *id != self.config.node_id);
            return Err(ProposeError::NotLeader { leader_id, epoch });
        }
        self.admit()?;
        if records.is_empty() {
            return Err(ProposeError::Empty);
        }
        let bytes: usize = records.iter().map(Record::encoded_len).sum();
        if bytes > self.config.max_batch_bytes {
            return Err(ProposeError::TooLarge {
                bytes,
                limit: self.config.max_batch_bytes,
            });
        }
        if self.accumulator.would_overflow(bytes, self.config.max_batch_bytes) {
            self.drain_accumulator();
        }
        let base_offset = self.accumulator.next_offset(self.log.end_offset());
        if base_offset > super::MAX_LOG_OFFSET - records.len() as Offset {
            return Err(ProposeError::LogFull {
                next_offset: base_offset,
            });
        }
        let last_offset = base_offset + records.len() as Offset - 1;
        self.accumulator.add(records, bytes, self.now_ms);
        self.backlog.on_accepted(last_offset);
        Ok(Proposed {
            base_offset,
            last_offset,
            epoch,
        })
    }

    /// With linger 0 the accumulator drains whenever no flush is in flight,
    /// and what arrives during a flush goes into the next batch (group
    /// commit), unless a replica is waiting for it: a parked fetch, or one
    /// that arrives at the log end, takes what is there at once (see
    /// [`Self::drain_for_fetch`]). With a linger it drains when the oldest
    /// record has waited that long. A full accumulator always drains.
    fn maybe_drain_accumulator(&mut self) {
        if self.accumulator.is_empty() {
            return;
        }
        let linger = self.config.append_linger_ms;
        let due = if linger == 0 {
            self.flush_target.is_none() || !self.parked.is_empty()
        } else {
            self.accumulator
                .linger_deadline_ms(linger)
                .map(|t| self.now_ms >= t)
                .unwrap_or(false)
        };
        if due || self.accumulator.bytes() >= self.config.max_batch_bytes {
            self.drain_accumulator();
        }
    }

    /// With linger 0, a fetch at the log end takes the records waiting for
    /// the leader's flush at once: the follower writes and flushes them
    /// while the leader's flush runs, instead of after it (the commit still
    /// needs the leader's flush or the other follower's).
    pub(super) fn drain_for_fetch(&mut self, fetch_offset: Offset) {
        if self.config.append_linger_ms == 0 && fetch_offset >= self.log.end_offset() {
            self.drain_accumulator();
        }
    }

    fn drain_accumulator(&mut self) {
        let records = self.accumulator.drain();
        if !records.is_empty() {
            self.append_as_leader(records);
        }
    }

    pub(super) fn append_as_leader(&mut self, records: Vec<Record>) {
        let epoch = self.election.epoch;
        let now = self.now_ms;
        let Role::Leader(leader) = &mut self.role else {
            unreachable!("only a leader appends")
        };
        leader.last_append_ms = now;
        let end = self.log.end_offset();
        if end > super::MAX_LOG_OFFSET - records.len() as Offset {
            // Only a snapshot id a leader made up can bring a log here;
            // proposals are refused before, so these are our own records.
            tracing::error!(end, "the log is full; the leader appends nothing more");
            return;
        }
        let batch = Batch::new(end, epoch, &records);
        self.log.append(batch.base_offset, batch.next_offset(), epoch);
        self.backlog.on_append(batch.next_offset(), batch.size_bytes());
        self.actions.push(Action::AppendBatch(batch));
        // Followers may read the batch before our own flush completes.
        self.poll_parked();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn leader(voters: &[NodeId], epoch_start: Offset) -> LeaderState {
        LeaderState::new(3, 1, voters.iter().copied(), BTreeSet::from([1]), epoch_start, 0, 3000)
    }

    #[test]
    fn high_watermark_needs_a_majority() {
        let mut l = leader(&[1, 2, 3], 0);
        assert_eq!(l.compute_high_watermark(10, 2), None, "only the leader has fetched");
        l.record_fetch(2, 7, 10, 1, 3000, 2);
        assert_eq!(l.compute_high_watermark(10, 2), Some(7));
        l.record_fetch(3, 9, 10, 1, 3000, 2);
        assert_eq!(l.compute_high_watermark(10, 2), Some(9));
    }

    #[test]
    fn high_watermark_counts_only_the_leaders_flushed_offset() {
        let mut l = leader(&[1, 2, 3], 0);
        l.record_fetch(2, 10, 10, 1, 3000, 2);
        l.record_fetch(3, 10, 10, 1, 3000, 2);
        // The leader has appended up to 10 but flushed only 4: the two
        // followers still form a majority with each other.
        assert_eq!(l.compute_high_watermark(4, 2), Some(10));
        let mut l = leader(&[1, 2, 3, 4, 5], 0);
        l.record_fetch(2, 10, 10, 1, 3000, 3);
        l.record_fetch(3, 10, 10, 1, 3000, 3);
        assert_eq!(
            l.compute_high_watermark(4, 3),
            Some(4),
            "the leader's unflushed tail does not count"
        );
    }

    #[test]
    fn high_watermark_waits_for_the_epoch_start() {
        let mut l = leader(&[1, 2, 3], 5);
        l.record_fetch(2, 5, 6, 1, 3000, 2);
        assert_eq!(
            l.compute_high_watermark(6, 2),
            None,
            "offset 5 (LeaderChange) is not committed yet"
        );
        l.record_fetch(2, 6, 6, 2, 3000, 2);
        assert_eq!(l.compute_high_watermark(6, 2), Some(6));
    }

    #[test]
    fn single_voter_commits_its_own_flushed_end() {
        let l = leader(&[1], 0);
        assert_eq!(l.compute_high_watermark(1, 1), Some(1));
        assert_eq!(l.compute_high_watermark(0, 1), None);
    }

    #[test]
    fn check_quorum_timer_resets_on_a_majority_of_fetches() {
        let mut l = leader(&[1, 2, 3, 4, 5], 0);
        assert_eq!(l.check_quorum_deadline_ms, 3000);
        l.record_fetch(2, 0, 1, 1000, 3000, 3);
        assert_eq!(
            l.check_quorum_deadline_ms, 3000,
            "leader + one voter is not a majority of five"
        );
        l.record_fetch(2, 0, 1, 1500, 3000, 3);
        assert_eq!(l.check_quorum_deadline_ms, 3000, "the same voter twice still is not");
        l.record_fetch(3, 0, 1, 2000, 3000, 3);
        assert_eq!(l.check_quorum_deadline_ms, 5000);
        // Observers never count.
        l.record_fetch(9, 0, 1, 2500, 3000, 3);
        l.record_fetch(8, 0, 1, 2600, 3000, 3);
        assert_eq!(l.check_quorum_deadline_ms, 5000);
        assert_eq!(l.observers.len(), 2);
    }

    #[test]
    fn preferred_successors_are_ordered_by_replicated_offset() {
        let mut l = leader(&[1, 2, 3, 4], 0);
        l.record_fetch(2, 5, 10, 1, 3000, 3);
        l.record_fetch(3, 9, 10, 1, 3000, 3);
        assert_eq!(l.preferred_successors(), vec![3, 2, 4]);
    }

    #[test]
    fn idle_observers_are_forgotten() {
        let mut l = leader(&[1, 2, 3], 0);
        l.record_fetch(9, 0, 1, 1000, 3000, 2);
        l.expire_observers(300_999, 300_000);
        assert_eq!(l.observers.len(), 1);
        l.expire_observers(301_000, 300_000);
        assert!(l.observers.is_empty());
    }
}
