//! One round of vote requests, shared by the Prospective role (pre-votes)
//! and the Candidate role (votes): who granted, who refused, when to ask a
//! silent voter again, and when the round times out.
//!
//! A round asks every other voter, re-asks a silent one only after its
//! request timed out (or failed, after the retry backoff), and counts the
//! answers; `prospective.rs` and `candidate.rs` decide what a majority of
//! grants or of refusals means for their role.

use std::collections::{BTreeMap, BTreeSet};

use crate::messages::{RaftRequest, VoteRequest, VoteResponse};

use super::node::{Inflight, RaftNode, RequestKind, Role};
use super::{Epoch, NodeId};

#[derive(Debug)]
pub(super) struct ElectionRound {
    pub(super) granted: BTreeSet<NodeId>,
    pub(super) rejected: BTreeSet<NodeId>,
    /// Per voter: earliest time to (re-)send our request.
    pub(super) retry_at_ms: BTreeMap<NodeId, u64>,
    pub(super) election_deadline_ms: u64,
}

impl RaftNode {
    pub(super) fn new_round(&mut self) -> ElectionRound {
        let me = self.config.node_id;
        ElectionRound {
            granted: BTreeSet::from([me]),
            rejected: BTreeSet::new(),
            retry_at_ms: self.other_voters_due_now(),
            election_deadline_ms: self.now_ms + self.random_election_timeout(),
        }
    }

    pub(super) fn min_retry(round: &ElectionRound) -> u64 {
        round
            .retry_at_ms
            .iter()
            .filter(|(id, _)| !round.granted.contains(id) && !round.rejected.contains(id))
            .map(|(_, t)| *t)
            .min()
            .unwrap_or(u64::MAX)
    }

    pub(super) fn send_election_requests(&mut self, request: RaftRequest, kind: RequestKind) {
        let now = self.now_ms;
        let round = match &self.role {
            Role::Prospective(round) => round,
            Role::Candidate(c) => &c.round,
            _ => return,
        };
        let due: Vec<NodeId> = round
            .retry_at_ms
            .iter()
            .filter(|(id, t)| !round.granted.contains(id) && !round.rejected.contains(id) && now >= **t)
            .map(|(id, _)| *id)
            .collect();
        for to in due {
            if self.has_inflight_to(to, kind) {
                continue;
            }
            self.send(to, kind, request.clone());
            // Re-ask a silent voter only after the request timed out.
            let retry = now + self.config.request_timeout_ms;
            match &mut self.role {
                Role::Prospective(round) => round.retry_at_ms.insert(to, retry),
                Role::Candidate(c) => c.round.retry_at_ms.insert(to, retry),
                _ => None,
            };
        }
    }

    pub(super) fn vote_request(&self, epoch: Epoch, pre_vote: bool) -> RaftRequest {
        // Only the durable log is claimed to other nodes.
        let end = self.log.flushed_end();
        RaftRequest::Vote(VoteRequest {
            epoch,
            candidate_id: self.config.node_id,
            last_epoch: self.log.epoch_before(end),
            last_epoch_end_offset: end,
            pre_vote,
        })
    }

    pub(super) fn handle_vote_response(&mut self, from: NodeId, sent: Inflight, current: bool, resp: VoteResponse) {
        if self.maybe_follow_response_epoch(resp.epoch, resp.leader_id) {
            return;
        }
        if !current {
            return;
        }
        match (&mut self.role, sent.kind) {
            (Role::Prospective(round), RequestKind::PreVote) => {
                if resp.vote_granted {
                    round.granted.insert(from);
                } else {
                    round.rejected.insert(from);
                }
                self.maybe_win_pre_vote();
            }
            (Role::Candidate(c), RequestKind::Vote) if resp.epoch == self.election.epoch => {
                if resp.vote_granted {
                    c.round.granted.insert(from);
                } else {
                    c.round.rejected.insert(from);
                }
                self.maybe_win_election();
            }
            _ => {}
        }
    }
}
