//! The Prospective role (Kafka's `ProspectiveState`, KIP-996): a voter
//! that asks the other voters whether they would vote for it, before it
//! bumps the epoch. Its state is one [`ElectionRound`] of pre-votes.
//!
//! Enters it: an Unattached voter whose election timeout ran out (at once
//! for a single voter); a Follower whose leader stopped answering its
//! fetches; a Resigned leader whose election timeout ran out (at once for
//! a single voter restarting as the former leader); a Candidate whose
//! election timed out or was lost, once its backoff ran out.
//!
//! Leaves it: for Candidate (epoch + 1) when a majority grants the pre-vote;
//! when the pre-vote times out or a majority refuses it, for Follower of the
//! leader it left in this epoch if it had one, else for Unattached
//! (`prospective_lost`); for Unattached or Follower on a higher epoch; for
//! Follower on its epoch's BeginQuorumEpoch, or when a response names the
//! leader of its epoch and it knew no leader of this epoch; for Unattached
//! when it grants a vote (see `vote.rs`).
//!
//! The rule it carries (KIP-996): a pre-vote changes no state, neither the
//! epoch nor a vote, on either side; a voter refuses it while it hears from
//! a live leader, so a node cut off from the leader cannot disrupt a
//! working quorum by bumping the epoch.

use super::election_round::ElectionRound;
use super::node::{RaftNode, RequestKind, Role};
use super::Epoch;

impl RaftNode {
    pub(super) fn become_prospective(&mut self) {
        if self.election.epoch == Epoch::MAX {
            self.give_up_elections();
            return;
        }
        let round = self.new_round();
        self.transition(Role::Prospective(round), None);
        self.maybe_win_pre_vote();
    }

    /// Earliest time at which a Prospective node has something to do.
    pub(super) fn prospective_deadline_ms(&self, round: &ElectionRound) -> u64 {
        round.election_deadline_ms.min(Self::min_retry(round))
    }

    pub(super) fn poll_prospective(&mut self) {
        let now = self.now_ms;
        let Role::Prospective(round) = &self.role else { return };
        let lost = round.rejected.len() >= self.config.majority();
        if now >= round.election_deadline_ms || lost {
            self.prospective_lost();
            return;
        }
        let Some(epoch) = self.election.epoch.checked_add(1) else {
            return self.give_up_elections();
        };
        let request = self.vote_request(epoch, true);
        self.send_election_requests(request, RequestKind::PreVote);
    }

    /// A pre-vote that failed (timed out, or a majority refused) goes back
    /// to following the leader this node left, if it had one in this epoch
    /// (it may be alive after all: a refusal says somebody still hears it),
    /// else to Unattached (Kafka's `prospectiveTransitionAfterElectionLoss`).
    fn prospective_lost(&mut self) {
        let me = self.config.node_id;
        match self.election.leader_id.filter(|l| *l != me) {
            Some(leader) => self.become_follower(self.election.epoch, leader),
            None => {
                let role = Role::Unattached(self.new_unattached());
                self.transition(role, None);
            }
        }
    }

    pub(super) fn maybe_win_pre_vote(&mut self) {
        if let Role::Prospective(round) = &self.role {
            if round.granted.len() >= self.config.majority() {
                self.become_candidate(self.election_retries.max(1));
            }
        }
    }
}
