//! The engine: one node's protocol state machine.

use std::collections::BTreeMap;

use crate::messages::{Batch, DescribeQuorumResponse, FetchResponse, RaftRequest, RaftResponse, Record};

use super::{ElectionState, Epoch, LogView, NodeId, Offset};

/// Protocol settings (the `quorum.*` keys, already validated).
#[derive(Clone, Debug)]
pub struct RaftConfig {
    pub node_id: NodeId,
    /// Voter ids with their raft endpoints (`host:port`).
    pub voters: BTreeMap<NodeId, String>,
    /// This node's raft endpoint, sent in BeginQuorumEpoch.
    pub local_endpoint: String,
    pub election_timeout_ms: u64,
    pub fetch_timeout_ms: u64,
    pub retry_backoff_ms: u64,
    pub request_timeout_ms: u64,
    pub election_backoff_max_ms: u64,
    pub append_linger_ms: u64,
    pub max_batch_bytes: usize,
    pub max_idle_interval_ms: u64,
    /// Longest a follower asks the leader to park its fetch (Kafka: 500 ms).
    pub fetch_max_wait_ms: u64,
    /// Largest fetch response a follower asks for (8 MiB).
    pub fetch_max_bytes: u32,
    /// The leader forgets an observer after this long without a fetch (300 s).
    pub observer_session_ms: u64,
}

impl RaftConfig {
    /// Defaults of DESIGN.md §6 for a node in the given voter set.
    pub fn new(node_id: NodeId, voters: BTreeMap<NodeId, String>, local_endpoint: String) -> Self {
        RaftConfig {
            node_id,
            voters,
            local_endpoint,
            election_timeout_ms: 1000,
            fetch_timeout_ms: 2000,
            retry_backoff_ms: 20,
            request_timeout_ms: 2000,
            election_backoff_max_ms: 1000,
            append_linger_ms: 0,
            max_batch_bytes: crate::messages::MAX_BATCH_BYTES,
            max_idle_interval_ms: 500,
            fetch_max_wait_ms: 500,
            fetch_max_bytes: crate::messages::MAX_BATCH_BYTES as u32,
            observer_session_ms: 300_000,
        }
    }

    pub fn is_voter(&self) -> bool {
        self.voters.contains_key(&self.node_id)
    }

    pub fn majority(&self) -> usize {
        self.voters.len() / 2 + 1
    }
}

/// The role names of the HTTP API and metrics.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RoleKind {
    Unattached,
    Prospective,
    Candidate,
    Leader,
    Follower,
    Resigned,
}

impl RoleKind {
    pub fn as_str(self) -> &'static str {
        match self {
            RoleKind::Unattached => "unattached",
            RoleKind::Prospective => "prospective",
            RoleKind::Candidate => "candidate",
            RoleKind::Leader => "leader",
            RoleKind::Follower => "follower",
            RoleKind::Resigned => "resigned",
        }
    }

    /// Kafka's `current-state` metric value.
    pub fn metric_code(self) -> i32 {
        match self {
            RoleKind::Unattached => 0,
            RoleKind::Prospective => 1,
            RoleKind::Candidate => 2,
            RoleKind::Leader => 3,
            RoleKind::Follower => 4,
            RoleKind::Resigned => 5,
        }
    }
}

/// Who this node is right now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RoleInfo {
    pub role: RoleKind,
    pub epoch: Epoch,
    pub leader_id: Option<NodeId>,
    pub voted_for: Option<NodeId>,
    /// False for an observer (a `broker` node).
    pub is_voter: bool,
}

/// The log range a Fetch response must carry; the shell reads it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReadRange {
    pub from: Offset,
    /// Exclusive; never past what the leader had appended when it decided.
    pub until: Offset,
    pub max_bytes: usize,
}

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
}

/// What the engine asks its shell to do. See the module docs of
/// [`crate::raft`] for the ordering contract.
#[derive(Clone, Debug, PartialEq)]
pub enum Action {
    /// Make this election state durable before carrying out anything after it.
    PersistElection(ElectionState),
    /// Append at the log end; readable at once, durable after a later Flush.
    AppendBatch(Batch),
    /// Remove every batch at or above this offset (a batch boundary).
    Truncate { end_offset: Offset },
    /// Make all earlier log writes durable, then report `on_flushed`.
    Flush,
    /// Send a request to a voter; the answer comes back through
    /// `handle_response` (or `handle_request_failed`) with this id.
    Send { to: NodeId, correlation_id: u64, request: RaftRequest },
    /// Answer the request the shell delivered with `request_id`.
    Respond { to: NodeId, request_id: u64, response: RaftResponse },
    /// Answer a Fetch: fill `response.batches` from `read` (when set), then send.
    RespondFetch { to: NodeId, request_id: u64, response: FetchResponse, read: Option<ReadRange> },
    /// The high watermark moved forward to this offset.
    HighWatermark(Offset),
    /// Role, epoch or leader changed.
    RoleChanged(RoleInfo),
}

/// One node's Raft state machine. Filled in below.
pub struct RaftNode {
    _private: (),
}

impl RaftNode {
    /// Starts a node from its recovered state (DESIGN.md §2 restart rules).
    /// `seed` feeds the node's own RNG (election jitter, backoff).
    pub fn new(_config: RaftConfig, _election: ElectionState, _log: LogView, _now_ms: u64, _seed: u64) -> Self {
        todo!()
    }

    /// Drains the actions produced so far, in order.
    pub fn take_actions(&mut self) -> Vec<Action> {
        todo!()
    }

    /// Advances timers to `now_ms`.
    pub fn tick(&mut self, _now_ms: u64) {
        todo!()
    }

    /// A request from peer `from`; answer with `request_id`.
    pub fn handle_request(&mut self, _now_ms: u64, _from: NodeId, _request_id: u64, _request: RaftRequest) {
        todo!()
    }

    /// The response to our `Send` with `correlation_id`.
    pub fn handle_response(&mut self, _now_ms: u64, _from: NodeId, _correlation_id: u64, _response: RaftResponse) {
        todo!()
    }

    /// Our `Send` with `correlation_id` failed (connection lost, timeout).
    pub fn handle_request_failed(&mut self, _now_ms: u64, _to: NodeId, _correlation_id: u64) {
        todo!()
    }

    /// Offers records to the leader's batch accumulator.
    pub fn propose(&mut self, _now_ms: u64, _records: Vec<Record>) -> Result<Proposed, ProposeError> {
        todo!()
    }

    /// Storage reports that every log write up to `durable_end` is durable.
    pub fn on_flushed(&mut self, _now_ms: u64, _durable_end: Offset) {
        todo!()
    }

    /// Graceful shutdown: a leader resigns and sends EndQuorumEpoch.
    pub fn resign(&mut self, _now_ms: u64) {
        todo!()
    }

    pub fn role(&self) -> RoleInfo {
        todo!()
    }

    pub fn high_watermark(&self) -> Offset {
        todo!()
    }

    pub fn log(&self) -> &LogView {
        todo!()
    }

    /// The leader's view of every replica (DescribeQuorum); others report
    /// empty replica lists.
    pub fn describe(&self, _now_ms: u64) -> DescribeQuorumResponse {
        todo!()
    }

    /// Earliest time at which `tick` has something to do.
    pub fn next_deadline_ms(&self) -> u64 {
        todo!()
    }
}
