//! Vote granting (KIP-595) and pre-vote (KIP-996) rules, and the handling
//! of a Vote request, which every role answers (a candidate's or
//! prospective's own round of requests is in `election_round.rs`).

use crate::messages::{ErrorCode, RaftResponse, VoteRequest, VoteResponse};

use super::node::{RaftNode, Role};
use super::{ElectionState, Epoch, NodeId, Offset};

/// Kafka's `isLogUpToDate`: the candidate's log is at least as long as ours,
/// comparing (last epoch, end offset) **lexicographically** — the bug
/// actix-raft shipped compared the fields one by one.
pub fn is_log_up_to_date(
    candidate_last_epoch: Epoch,
    candidate_end_offset: Offset,
    our_last_epoch: Epoch,
    our_end_offset: Offset,
) -> bool {
    (candidate_last_epoch, candidate_end_offset) >= (our_last_epoch, our_end_offset)
}

/// What the receiver of a Vote knows about its current epoch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VoterView {
    /// The receiver's vote in its current epoch, if any.
    pub voted_for: Option<NodeId>,
    /// The leader it knows in its current epoch, if any (itself if leader).
    pub leader_id: Option<NodeId>,
    /// True while it is a follower that fetched successfully from a live
    /// leader within the fetch timeout (pre-votes are refused then).
    pub leader_is_live: bool,
    /// True when the receiver is (or was, Resigned) the leader of its epoch.
    pub is_or_was_leader: bool,
}

/// Decides a real vote for `candidate` in the receiver's current epoch
/// (the receiver has already moved to the candidate's epoch if it was
/// higher). Grant iff no leader is known in this epoch, we voted for nobody
/// else in it, and the candidate's log is up to date.
pub fn grant_vote(view: VoterView, candidate: NodeId, log_up_to_date: bool) -> bool {
    if view.is_or_was_leader || view.leader_id.is_some() {
        return false;
    }
    match view.voted_for {
        Some(voted) if voted != candidate => false,
        _ => log_up_to_date,
    }
}

/// Decides a pre-vote. It changes no state: grant iff the candidate's log
/// is up to date and we have not heard from a live leader within the fetch
/// timeout (KIP-996), and we are not the leader ourselves.
pub fn grant_pre_vote(view: VoterView, log_up_to_date: bool) -> bool {
    !view.is_or_was_leader && !view.leader_is_live && log_up_to_date
}

impl RaftNode {
    /// What this node knows of its epoch, for the rules above.
    fn voter_view(&self) -> VoterView {
        let now = self.now_ms;
        let fetch_timeout = self.config.fetch_timeout_ms;
        let leader_is_live = match &self.role {
            Role::Follower(f) => {
                !f.leader_resigned
                    && f.last_fetch_success_ms
                        .map(|t| now < t + fetch_timeout)
                        .unwrap_or(false)
            }
            _ => false,
        };
        let leader_id = match &self.role {
            Role::Follower(f) => Some(f.leader_id),
            Role::Leader(_) | Role::Resigned(_) => Some(self.config.node_id),
            // Prospective and Unattached keep what was persisted of this epoch.
            Role::Prospective(_) | Role::Unattached(_) => self.election.leader_id,
            Role::Candidate(_) => None,
        };
        VoterView {
            voted_for: self.election.voted_for,
            leader_id,
            leader_is_live,
            is_or_was_leader: matches!(self.role, Role::Leader(_) | Role::Resigned(_)),
        }
    }

    pub(super) fn handle_vote_request(&mut self, from: NodeId, request_id: u64, req: VoteRequest) {
        let refuse = |node: &Self, error: ErrorCode| {
            RaftResponse::Vote(VoteResponse {
                error,
                epoch: node.election.epoch,
                leader_id: node.leader_id(),
                vote_granted: false,
                pre_vote: req.pre_vote,
            })
        };
        if !self.config.is_voter() || !self.config.voters.contains_key(&req.candidate_id) || from != req.candidate_id {
            let response = refuse(self, ErrorCode::InconsistentVoterSet);
            self.respond(from, request_id, response);
            return;
        }
        if req.candidate_id == self.config.node_id {
            // Only a peer claiming this node's id sends that: granting it
            // would cast this node's vote for a candidacy it never ran.
            tracing::warn!(from, "refused a Vote naming this node as its candidate");
            let response = refuse(self, ErrorCode::InvalidRequest);
            self.respond(from, request_id, response);
            return;
        }
        if req.epoch < self.election.epoch {
            let response = refuse(self, ErrorCode::FencedLeaderEpoch);
            self.respond(from, request_id, response);
            return;
        }
        let log_ok = is_log_up_to_date(
            req.last_epoch,
            req.last_epoch_end_offset,
            self.log.last_epoch(),
            self.log.end_offset(),
        );
        if req.pre_vote {
            // A pre-vote changes nothing, not even our epoch.
            let granted = grant_pre_vote(self.voter_view(), log_ok);
            let response = RaftResponse::Vote(VoteResponse {
                error: ErrorCode::None,
                epoch: self.election.epoch,
                leader_id: self.leader_id(),
                vote_granted: granted,
                pre_vote: true,
            });
            self.respond(from, request_id, response);
            return;
        }
        if req.epoch > self.election.epoch {
            self.become_unattached_or_follower(req.epoch, None);
        }
        let granted = grant_vote(self.voter_view(), req.candidate_id, log_ok);
        if granted {
            // Persist the vote, then switch, then reply.
            let persist = ElectionState {
                epoch: self.election.epoch,
                voted_for: Some(req.candidate_id),
                leader_id: None,
            };
            let mut unattached = self.new_unattached();
            if let Role::Unattached(current) = &self.role {
                // Granting the same vote again keeps the timer.
                if self.election.voted_for == Some(req.candidate_id) {
                    unattached.election_deadline_ms = current.election_deadline_ms;
                }
            }
            self.transition(Role::Unattached(unattached), Some(persist));
        }
        let response = RaftResponse::Vote(VoteResponse {
            error: ErrorCode::None,
            epoch: self.election.epoch,
            leader_id: self.leader_id(),
            vote_granted: granted,
            pre_vote: false,
        });
        self.respond(from, request_id, response);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FREE: VoterView = VoterView {
        voted_for: None,
        leader_id: None,
        leader_is_live: false,
        is_or_was_leader: false,
    };

    #[test]
    fn log_comparison_is_lexicographic() {
        // A higher last epoch wins even with a shorter log.
        assert!(is_log_up_to_date(5, 10, 4, 100));
        // A lower last epoch loses even with a longer log.
        assert!(!is_log_up_to_date(4, 100, 5, 10));
        // Same epoch: the longer (or equal) log wins.
        assert!(is_log_up_to_date(5, 10, 5, 10));
        assert!(!is_log_up_to_date(5, 9, 5, 10));
    }

    #[test]
    fn grants_once_per_epoch() {
        assert!(grant_vote(FREE, 2, true));
        let voted = VoterView {
            voted_for: Some(2),
            ..FREE
        };
        assert!(
            grant_vote(voted, 2, true),
            "a repeated request from the same candidate is granted again"
        );
        assert!(!grant_vote(voted, 3, true), "never a second candidate in one epoch");
    }

    #[test]
    fn refuses_a_stale_log_or_a_known_leader() {
        assert!(!grant_vote(FREE, 2, false));
        assert!(!grant_vote(
            VoterView {
                leader_id: Some(1),
                ..FREE
            },
            2,
            true
        ));
        assert!(!grant_vote(
            VoterView {
                is_or_was_leader: true,
                ..FREE
            },
            2,
            true
        ));
    }

    #[test]
    fn pre_vote_refused_while_the_leader_is_live() {
        assert!(grant_pre_vote(FREE, true));
        assert!(!grant_pre_vote(FREE, false));
        let following = VoterView {
            leader_id: Some(1),
            leader_is_live: true,
            ..FREE
        };
        assert!(!grant_pre_vote(following, true));
        let lost_leader = VoterView {
            leader_id: Some(1),
            leader_is_live: false,
            ..FREE
        };
        assert!(
            grant_pre_vote(lost_leader, true),
            "a follower that timed out grants pre-votes"
        );
        // A pre-vote ignores an earlier vote: it changes no state.
        assert!(grant_pre_vote(
            VoterView {
                voted_for: Some(3),
                ..FREE
            },
            true
        ));
    }
}
