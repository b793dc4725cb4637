//! The Resigned role (Kafka's `ResignedState`): a leader that gave up its
//! epoch and tells the other voters so with EndQuorumEpoch, naming its
//! preferred successors, until each acknowledges or a new epoch begins.
//!
//! Enters it: a Leader shutting down (`resign`) or failing check-quorum; a
//! node restarting as the leader of its persisted epoch.
//!
//! Leaves it: for Prospective when its election timeout runs out (a single
//! voter restarting as the former leader does not wait; one that resigned
//! to shut down does); for Unattached or Follower on a higher epoch. It
//! never follows another leader of its own epoch.
//!
//! The rules it carries (KIP-595): a resigned leader grants no vote in its
//! epoch (see `vote.rs`); EndQuorumEpoch lists the other voters best
//! replicated first, and a voter receiving it (handled here too) shortens
//! its wait by its rank in that list, so the best-replicated voter
//! campaigns first.

use std::collections::{BTreeMap, BTreeSet};

use crate::messages::{EndQuorumEpochRequest, ErrorCode, QuorumEpochResponse, RaftRequest, RaftResponse};

use super::node::{RaftNode, RequestKind, Role, ELECTION_BACKOFF_BASE_MS};
use super::NodeId;

#[derive(Debug)]
pub(super) struct ResignedState {
    pub(super) election_deadline_ms: u64,
    pub(super) preferred_successors: Vec<NodeId>,
    /// Voters that acknowledged our EndQuorumEpoch.
    pub(super) acked: BTreeSet<NodeId>,
    pub(super) retry_at_ms: BTreeMap<NodeId, u64>,
    /// A single voter restarting as former leader campaigns at once; one that
    /// resigned to shut down must not.
    pub(super) campaign_at_once: bool,
}

impl RaftNode {
    pub(super) fn new_resigned(&mut self, preferred_successors: Vec<NodeId>) -> ResignedState {
        ResignedState {
            election_deadline_ms: self.now_ms + self.random_election_timeout(),
            preferred_successors,
            acked: BTreeSet::new(),
            retry_at_ms: self.other_voters_due_now(),
            campaign_at_once: false,
        }
    }

    /// Earliest time at which a Resigned leader has something to do.
    pub(super) fn resigned_deadline_ms(&self, r: &ResignedState) -> u64 {
        let pending = r
            .retry_at_ms
            .iter()
            .filter(|(id, _)| !r.acked.contains(id))
            .map(|(_, t)| *t)
            .min();
        r.election_deadline_ms.min(pending.unwrap_or(u64::MAX))
    }

    pub(super) fn poll_resigned(&mut self) {
        let now = self.now_ms;
        let Role::Resigned(r) = &self.role else { return };
        if now >= r.election_deadline_ms || r.campaign_at_once {
            self.become_prospective();
            return;
        }
        let due: Vec<NodeId> = r
            .retry_at_ms
            .iter()
            .filter(|(id, t)| !r.acked.contains(id) && now >= **t)
            .map(|(id, _)| *id)
            .collect();
        let request = RaftRequest::EndQuorumEpoch(EndQuorumEpochRequest {
            epoch: self.election.epoch,
            leader_id: self.config.node_id,
            preferred_successors: r.preferred_successors.clone(),
        });
        let retry = self.config.retry_backoff_ms.max(1);
        for to in due {
            if !self.has_inflight_to(to, RequestKind::EndQuorumEpoch) {
                self.send(to, RequestKind::EndQuorumEpoch, request.clone());
            }
            if let Role::Resigned(r) = &mut self.role {
                r.retry_at_ms.insert(to, now + retry);
            }
        }
    }

    /// A voter answered our EndQuorumEpoch.
    pub(super) fn handle_end_quorum_epoch_response(&mut self, from: NodeId, current: bool, resp: QuorumEpochResponse) {
        if !self.maybe_follow_response_epoch(resp.epoch, resp.leader_id) && current {
            if let Role::Resigned(state) = &mut self.role {
                if resp.error == ErrorCode::None {
                    state.acked.insert(from);
                }
            }
        }
    }

    /// Another voter's EndQuorumEpoch: its leader resigned.
    pub(super) fn handle_end_quorum_epoch(&mut self, from: NodeId, request_id: u64, req: EndQuorumEpochRequest) {
        let mut error = ErrorCode::None;
        // As for BeginQuorumEpoch: only the voter that leads (or led) may
        // resign, and it says so itself.
        if !self.config.is_voter() || !self.config.voters.contains_key(&req.leader_id) {
            error = ErrorCode::InconsistentVoterSet;
        } else if req.epoch < self.election.epoch {
            error = ErrorCode::FencedLeaderEpoch;
        } else if req.leader_id == self.config.node_id || req.leader_id != from {
            error = ErrorCode::InvalidRequest;
        } else {
            // Shorten our wait by our rank among the preferred successors, so
            // the best-replicated voter campaigns first (KIP-595).
            let backoff = self.end_quorum_backoff_ms(&req.preferred_successors);
            if req.epoch > self.election.epoch {
                self.become_unattached_or_follower(req.epoch, None);
            }
            let now = self.now_ms;
            match &mut self.role {
                Role::Follower(f) if f.leader_id == req.leader_id => {
                    f.leader_resigned = true;
                    f.fetch_deadline_ms = f.fetch_deadline_ms.min(now + backoff);
                }
                Role::Unattached(u) => {
                    u.election_deadline_ms = u.election_deadline_ms.min(now + backoff);
                }
                _ => {}
            }
        }
        let response = RaftResponse::EndQuorumEpoch(QuorumEpochResponse {
            error,
            epoch: self.election.epoch,
            leader_id: self.leader_id(),
        });
        self.respond(from, request_id, response);
    }

    fn end_quorum_backoff_ms(&self, successors: &[NodeId]) -> u64 {
        match successors.iter().position(|id| *id == self.config.node_id) {
            Some(0) => 0,
            Some(rank) => {
                let shift = (rank as u32 - 1).min(20);
                (ELECTION_BACKOFF_BASE_MS << shift).min(self.config.election_backoff_max_ms)
            }
            None => self.config.election_backoff_max_ms,
        }
    }
}
