//! The Candidate role (Kafka's `CandidateState`): a voter that won a
//! pre-vote, moved to the next epoch, voted for itself and asks the other
//! voters for their votes in that epoch.
//!
//! Enters it: a Prospective whose pre-vote a majority granted (the new
//! epoch and its own vote persisted first); a node restarting with its own
//! vote and no leader in its persisted epoch (it asks again, same epoch).
//!
//! Leaves it: for Leader when a majority grants its vote; when the election
//! times out or a majority refuses, it waits out an exponential backoff
//! and then campaigns again through a pre-vote (Candidate → Prospective);
//! for Follower when a leader of its epoch is named, or for Unattached or
//! Follower on a higher epoch.
//!
//! The rules it carries: a vote is granted only to a candidate whose log is
//! at least as up to date as the voter's (KIP-595); failed candidacies back
//! off exponentially (Kafka's binary exponential backoff); and a candidate
//! campaigns again only through a pre-vote (KIP-996), so one whose log is
//! behind does not keep bumping the epoch and resetting every other
//! voter's election timer.

use super::election_round::ElectionRound;
use super::node::{RaftNode, RequestKind, Role};
use super::ElectionState;

#[derive(Debug)]
pub(super) struct CandidateState {
    pub(super) round: ElectionRound,
    /// Consecutive failed candidacies (for the exponential backoff).
    pub(super) retries: u32,
    /// Set once the election timed out or was lost: the next candidacy
    /// starts at this time.
    pub(super) backoff_until_ms: Option<u64>,
}

impl RaftNode {
    pub(super) fn become_candidate(&mut self, retries: u32) {
        let Some(epoch) = self.election.epoch.checked_add(1) else {
            return self.give_up_elections();
        };
        let me = self.config.node_id;
        let persist = ElectionState {
            epoch,
            voted_for: Some(me),
            leader_id: None,
        };
        let round = self.new_round();
        self.transition(
            Role::Candidate(CandidateState {
                round,
                retries,
                backoff_until_ms: None,
            }),
            Some(persist),
        );
        self.maybe_win_election();
    }

    /// Earliest time at which a Candidate has something to do.
    pub(super) fn candidate_deadline_ms(&self, c: &CandidateState) -> u64 {
        match c.backoff_until_ms {
            Some(t) => t,
            None => c.round.election_deadline_ms.min(Self::min_retry(&c.round)),
        }
    }

    pub(super) fn poll_candidate(&mut self) {
        let now = self.now_ms;
        let Role::Candidate(c) = &self.role else { return };
        if let Some(until) = c.backoff_until_ms {
            if now >= until {
                // Campaign again only through a pre-vote (KIP-996): a
                // candidate whose log is behind must not keep bumping the
                // epoch, which resets every other voter's election timer.
                self.election_retries = c.retries + 1;
                self.become_prospective();
            }
            return;
        }
        let lost = c.round.rejected.len() >= self.config.majority();
        if now >= c.round.election_deadline_ms || lost {
            let backoff = self.election_backoff_ms(c.retries);
            if let Role::Candidate(c) = &mut self.role {
                c.backoff_until_ms = Some(now + backoff);
            }
            return;
        }
        let request = self.vote_request(self.election.epoch, false);
        self.send_election_requests(request, RequestKind::Vote);
    }

    pub(super) fn maybe_win_election(&mut self) {
        if let Role::Candidate(c) = &self.role {
            if c.backoff_until_ms.is_none() && c.round.granted.len() >= self.config.majority() {
                self.become_leader();
            }
        }
    }
}
