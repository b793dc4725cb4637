//! The Unattached role (Kafka's `UnattachedState`): a node in an epoch
//! with no known leader, waiting for one to appear or for its election
//! timeout to run out.
//!
//! Enters it: a node starting with no leader or candidacy of its persisted
//! epoch (an observer without a known leader always); any role that sees a
//! higher epoch naming no leader (`become_unattached_or_follower`); an
//! Unattached or Prospective voter granting a vote (the vote persisted
//! first, see `vote.rs`); a Prospective whose pre-vote failed and that knew
//! no leader of its epoch;
//! an observer whose leader stopped answering its fetches; and a node whose
//! epoch is at its largest value (`give_up_elections`, with no election
//! timeout).
//!
//! Leaves it: for Prospective when a voter's election timeout runs out (at
//! once for a single voter); for Follower when a leader of its epoch or a
//! later one is learnt; for Unattached again in a later epoch or when it
//! grants a vote.
//!
//! The rules it carries: a voter votes at most once per epoch, and the vote
//! is durable before the answer (KIP-595); it campaigns only through a
//! pre-vote, never by bumping the epoch at once (KIP-996). An observer,
//! which never campaigns, looks for the leader by fetching from a random
//! voter. A resigning leader's EndQuorumEpoch shortens the election timeout
//! (see `resigned.rs`).

use rand::Rng;

use super::node::{RaftNode, Role};
use super::NodeId;

#[derive(Debug)]
pub(super) struct UnattachedState {
    pub(super) election_deadline_ms: u64,
    /// Observers look for the leader by fetching from a random voter.
    pub(super) next_discovery_ms: u64,
}

impl RaftNode {
    pub(super) fn new_unattached(&mut self) -> UnattachedState {
        let deadline = self.now_ms + self.random_election_timeout();
        UnattachedState {
            election_deadline_ms: deadline,
            next_discovery_ms: self.now_ms,
        }
    }

    /// Earliest time at which an Unattached node has something to do: a
    /// voter's election timeout, or an observer's next look for the leader.
    pub(super) fn unattached_deadline_ms(&self, s: &UnattachedState) -> u64 {
        if self.config.is_voter() {
            s.election_deadline_ms
        } else if !self.may_fetch() {
            u64::MAX
        } else {
            s.next_discovery_ms
        }
    }

    pub(super) fn poll_unattached(&mut self) {
        let now = self.now_ms;
        let Role::Unattached(state) = &self.role else { return };
        if self.config.is_voter() {
            // A single voter needs nobody: it campaigns at once.
            if now >= state.election_deadline_ms || self.is_only_voter() {
                self.become_prospective();
            }
        } else if now >= state.next_discovery_ms && self.may_fetch() {
            // Its fetch offset is its log end: only once that is durable,
            // as for a follower (`may_fetch`).
            // An observer knows the voters but not the leader: ask one.
            let voters: Vec<NodeId> = self.config.voters.keys().copied().collect();
            let to = voters[self.rng.gen_range(0..voters.len())];
            if let Role::Unattached(state) = &mut self.role {
                state.next_discovery_ms = now + self.config.retry_backoff_ms.max(1);
            }
            self.send_fetch(to);
        }
    }

    /// No epoch follows [`Epoch::MAX`](i32::MAX), so no election can
    /// start: the node waits Unattached, without an election deadline, and
    /// still follows a leader of this epoch. Only a damaged election state
    /// or a peer that sent that epoch gets a node here (a new epoch per
    /// election would take decades); it is reported, never a panic or a
    /// wrapped epoch.
    pub(super) fn give_up_elections(&mut self) {
        if matches!(&self.role, Role::Unattached(s) if s.election_deadline_ms == u64::MAX) {
            return;
        }
        tracing::error!(
            epoch = self.election.epoch,
            "the epoch is at its largest value: this node can start no election (a damaged election state, \
             or a peer sent that epoch); it follows a leader of this epoch if one appears"
        );
        let mut state = self.new_unattached();
        state.election_deadline_ms = u64::MAX;
        self.transition(Role::Unattached(state), None);
    }
}
