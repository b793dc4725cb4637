//! Embedding: start a kraft node's actors inside the caller's actix System
//! and drive it through a [`NodeHandle`]. The server binary is a thin user
//! of this API plus the HTTP layer in [`crate::api`].

use actix::{Message, Recipient};
use serde::Serialize;

use crate::config::Config;
use crate::messages::Record;
use crate::raft::{Epoch, NodeId, Offset};

/// Where committed records landed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
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
    NotLeader { leader_id: Option<NodeId>, leader_endpoint: Option<String> },
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
}

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("storage: {0}")]
    Storage(#[from] crate::storage::StorageError),
    #[error("cannot bind {what} listener on {addr}: {source}")]
    Bind { what: &'static str, addr: String, source: std::io::Error },
    #[error("{0}")]
    Other(String),
}

#[derive(Debug, thiserror::Error)]
#[error("node unavailable: {0}")]
pub struct NodeError(pub String);

/// One replica's progress as the leader sees it (`GET /v1/quorum`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ReplicaStatus {
    pub id: NodeId,
    pub log_end_offset: Option<Offset>,
    pub last_fetch_ms_ago: Option<u64>,
    pub last_caught_up_ms_ago: Option<u64>,
}

/// The body of `GET /v1/quorum`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
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

/// One committed record as `GET /v1/log` shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct LogEntry {
    pub offset: Offset,
    pub epoch: Epoch,
    /// data, leader_change, noop
    pub kind: String,
    /// The text of a data record (lossy UTF-8); None for control records.
    pub value: Option<String>,
}

/// The body of `GET /v1/log`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct LogPage {
    pub high_watermark: Offset,
    pub log_start_offset: Offset,
    pub records: Vec<LogEntry>,
}

/// A committed record delivered to a listener.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CommittedRecord {
    pub offset: Offset,
    pub epoch: Epoch,
    pub record: Record,
}

/// Delivered to every registered listener, in log order, each committed
/// record exactly once per registration (from offset 0 / the log start).
#[derive(Message, Clone, Debug)]
#[rtype(result = "()")]
pub struct Committed {
    pub records: Vec<CommittedRecord>,
    pub high_watermark: Offset,
}

/// Delivered to listeners when the leader changes. On the leader itself it
/// is delivered only once the listener has been given every record up to
/// the leader's epoch start offset (its LeaderChange record).
#[derive(Message, Clone, Debug, PartialEq, Eq)]
#[rtype(result = "()")]
pub struct LeaderChanged {
    pub epoch: Epoch,
    pub leader_id: Option<NodeId>,
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
    pub uptime_ms: u64,
}

/// A listener registration: committed records and leader changes.
#[derive(Clone)]
pub struct Listener {
    pub committed: Recipient<Committed>,
    pub leader_changed: Option<Recipient<LeaderChanged>>,
}
