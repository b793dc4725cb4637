//! The leaf of the crate: identifiers and the plain data types every layer
//! shares (what a node answers about an append, its quorum and its
//! metrics). Nothing here imports another module of the crate, so
//! dependencies run one way (docs/ARCHITECTURE.md, "Layers and modules").

use serde::{Deserialize, Serialize};
use tokio::sync::oneshot;

/// A node id (≥ 0).
pub type NodeId = i32;
/// A leader epoch (starts at 0; the first election makes it 1).
pub type Epoch = i32;
/// A log offset; offsets are contiguous from the log start offset.
pub type Offset = i64;
/// The largest end offset a log may have. Half the type's range: a log
/// appending a million records a second reaches it in 146,000 years, and
/// with every offset a peer can send checked against it (batches, snapshot
/// ids), offset arithmetic cannot overflow however far a lying leader
/// pushes a node (a snapshot id it made up can move a log's start there).
pub const MAX_LOG_OFFSET: Offset = Offset::MAX / 2;

/// Where committed records landed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Appended {
    pub base_offset: Offset,
    pub last_offset: Offset,
    pub epoch: Epoch,
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AppendError {
    /// No leader is known, or the known one could not be reached. Nothing
    /// was written.
    #[error("not the leader; leader is {leader_id:?}")]
    NotLeader {
        leader_id: Option<NodeId>,
        leader_endpoint: Option<String>,
    },
    /// Leadership was lost (or the leader became unreachable) after the
    /// records were handed over: they may or may not commit. Never retried
    /// behind the caller's back.
    #[error("outcome unknown: {0}")]
    OutcomeUnknown(String),
    /// Empty or oversized request; nothing was written.
    #[error("rejected: {0}")]
    Rejected(String),
    /// The node is shutting down or has failed.
    #[error("node unavailable: {0}")]
    Unavailable(String),
    /// The node takes no raw records: its log holds metadata records,
    /// which only its controller writes (`node.state_machine =
    /// "metadata"`). Nothing was written.
    #[error("unsupported: {0}")]
    Unsupported(String),
}

/// Where one append's outcome goes.
pub type AppendReply = oneshot::Sender<Result<Appended, AppendError>>;

/// Why a node could not answer a read of the log, a description, its
/// metrics or a snapshot request. Each kind is this node's own, passing
/// trouble: the caller may try again later or ask another node (HTTP 503,
/// the client protocol's `Unavailable`).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum NodeError {
    /// The node has stopped, or is stopping: its actors no longer answer.
    #[error("node unavailable: {0}")]
    Stopped(String),
    /// As much of this work as the node takes at once is under way.
    #[error("node unavailable: {0}")]
    Busy(String),
    /// There is nothing to do it with yet (no committed record to snapshot).
    #[error("node unavailable: {0}")]
    NotReady(String),
    /// The log or a snapshot could not be read or written: the storage
    /// layer's error, as its text (this leaf module cannot name it).
    #[error("node unavailable: {0}")]
    Storage(String),
    /// This node does not do that in its mode (`node.state_machine`).
    #[error("unsupported: {0}")]
    Unsupported(String),
}

impl NodeError {
    /// What went wrong, without the "node unavailable" prefix.
    pub fn reason(&self) -> &str {
        match self {
            NodeError::Stopped(r)
            | NodeError::Busy(r)
            | NodeError::NotReady(r)
            | NodeError::Storage(r)
            | NodeError::Unsupported(r) => r,
        }
    }
}

/// One replica's progress as the leader sees it (`GET /v1/quorum`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicaStatus {
    pub id: NodeId,
    pub log_end_offset: Option<Offset>,
    pub last_fetch_ms_ago: Option<u64>,
    pub last_caught_up_ms_ago: Option<u64>,
}

/// The body of `GET /v1/quorum`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct QuorumStatus {
    pub cluster_id: String,
    pub node_id: NodeId,
    /// unattached, prospective, candidate, leader, follower, resigned, observer
    pub role: String,
    pub leader_id: Option<NodeId>,
    pub leader_epoch: Epoch,
    pub high_watermark: Offset,
    pub log_start_offset: Offset,
    pub log_end_offset: Offset,
    pub voters: Vec<ReplicaStatus>,
    pub observers: Vec<ReplicaStatus>,
}

/// What `/metrics` exports (Kafka's raft metric names).
#[derive(Clone, Debug, Default, Serialize)]
pub struct MetricsSnapshot {
    /// RoleKind::metric_code
    pub current_state: i32,
    pub current_leader: i32,
    pub current_epoch: Epoch,
    pub high_watermark: Offset,
    pub log_end_offset: Offset,
    pub commit_latency_avg_ms: f64,
    pub commit_latency_max_ms: f64,
    pub commits_total: u64,
    pub append_records_total: u64,
    pub fetch_records_total: u64,
    pub election_latency_avg_ms: f64,
    pub election_latency_max_ms: f64,
    pub elections_total: u64,
    /// Fetch requests this node answered (as leader: its followers' and
    /// observers' fetch cycles).
    pub fetch_requests_total: u64,
    /// Forwarded-append requests this node received from followers and
    /// observers (each carries one or more clients' appends).
    pub forwarded_requests_total: u64,
    /// Clients' appends those requests carried.
    pub forwarded_appends_total: u64,
    pub storage: StorageStats,
    pub uptime_ms: u64,
}

/// A reading of the storage thread's counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct StorageStats {
    /// Durability points (one flush plus fdatasync each).
    pub flushes_total: u64,
    /// Time spent in them.
    pub flush_seconds_total: f64,
    pub appended_batches_total: u64,
    pub appended_bytes_total: u64,
}
