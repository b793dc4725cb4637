//! The leader's view of its replicas and the high watermark (Kafka's
//! `LeaderState`).

use std::collections::{BTreeMap, BTreeSet};

use super::{Epoch, NodeId, Offset};
use crate::messages::ReplicaInfo;

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
