//! The Raft RPCs of Kafka's KRaft dialect (KIP-595, KIP-630, KIP-996) as
//! plain data. Every request and response travels inside an
//! [`Envelope`](super::codec::Envelope) that carries the cluster id.

use serde::{Deserialize, Serialize};

use super::records::Batch;
use crate::types::{Epoch, NodeId, Offset};

/// Kafka's error codes, the subset the quorum uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ErrorCode {
    None,
    /// The request's epoch is older than the receiver's.
    FencedLeaderEpoch,
    /// The request's epoch is newer than the receiver knows.
    UnknownLeaderEpoch,
    /// The receiver is not the leader (a fetch sent to a non-leader).
    NotLeaderOrFollower,
    /// The sender belongs to another cluster.
    InconsistentClusterId,
    /// The request needs a voter and the sender (or receiver) is not one.
    InconsistentVoterSet,
    /// The request could not be understood.
    InvalidRequest,
    /// The receiver is shutting down or failed.
    BrokerNotAvailable,
    /// The snapshot asked for is not (or no longer) the one served.
    SnapshotNotFound,
    /// A FetchSnapshot position past the snapshot's size.
    PositionOutOfRange,
    /// The receiver could not read its log to answer (Kafka's
    /// KAFKA_STORAGE_ERROR); the sender retries after its backoff.
    KafkaStorageError,
}

/// (exclusive end offset, epoch) of a snapshot (KIP-630).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct SnapshotId {
    pub end_offset: Offset,
    pub epoch: Epoch,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VoteRequest {
    /// The candidate's epoch (for a pre-vote: the epoch it would campaign in).
    pub epoch: Epoch,
    pub candidate_id: NodeId,
    /// Epoch of the last batch in the candidate's durable log.
    pub last_epoch: Epoch,
    /// End offset (exclusive) of the candidate's durable log.
    pub last_epoch_end_offset: Offset,
    pub pre_vote: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VoteResponse {
    pub error: ErrorCode,
    /// The responder's current epoch and the leader it knows in it.
    pub epoch: Epoch,
    pub leader_id: Option<NodeId>,
    pub vote_granted: bool,
    pub pre_vote: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BeginQuorumEpochRequest {
    pub epoch: Epoch,
    pub leader_id: NodeId,
    pub leader_endpoint: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EndQuorumEpochRequest {
    pub epoch: Epoch,
    pub leader_id: NodeId,
    /// Voters ordered by how far they have replicated, best first.
    pub preferred_successors: Vec<NodeId>,
}

/// Answer to BeginQuorumEpoch and EndQuorumEpoch.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct QuorumEpochResponse {
    pub error: ErrorCode,
    pub epoch: Epoch,
    pub leader_id: Option<NodeId>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FetchRequest {
    pub replica_id: NodeId,
    /// The epoch the fetcher believes current.
    pub current_epoch: Epoch,
    /// The fetcher's log end offset; for a voter it is durable.
    pub fetch_offset: Offset,
    /// Epoch of the batch just below `fetch_offset` (0 for an empty log).
    pub last_fetched_epoch: Epoch,
    pub max_wait_ms: u64,
    pub max_bytes: u32,
}

/// The leader's answer when the fetcher's log diverges from its own: the
/// fetcher truncates to at most `end_offset` and fetches again.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DivergingEpoch {
    pub epoch: Epoch,
    pub end_offset: Offset,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FetchResponse {
    pub error: ErrorCode,
    pub epoch: Epoch,
    pub leader_id: Option<NodeId>,
    /// Kafka's high watermark: the first offset not yet committed.
    pub high_watermark: Offset,
    pub log_start_offset: Offset,
    pub diverging_epoch: Option<DivergingEpoch>,
    /// Set when the fetch offset is below the log start: fetch this snapshot.
    pub snapshot_id: Option<SnapshotId>,
    pub batches: Vec<Batch>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FetchSnapshotRequest {
    pub replica_id: NodeId,
    pub current_epoch: Epoch,
    pub snapshot_id: SnapshotId,
    pub position: u64,
    pub max_bytes: u32,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FetchSnapshotResponse {
    pub error: ErrorCode,
    pub epoch: Epoch,
    pub leader_id: Option<NodeId>,
    pub snapshot_id: SnapshotId,
    pub size: u64,
    pub position: u64,
    #[serde(with = "serde_bytes")]
    pub bytes: Vec<u8>,
}

/// One replica's progress as the leader sees it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicaInfo {
    pub id: NodeId,
    /// None until the replica has fetched in this epoch.
    pub log_end_offset: Option<Offset>,
    /// How long ago the replica last fetched (relative, so clocks need not agree).
    pub last_fetch_ms_ago: Option<u64>,
    /// How long ago the replica was last caught up to the leader's log end.
    pub last_caught_up_ms_ago: Option<u64>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DescribeQuorumResponse {
    pub error: ErrorCode,
    pub leader_id: Option<NodeId>,
    pub leader_epoch: Epoch,
    pub high_watermark: Offset,
    pub voters: Vec<ReplicaInfo>,
    pub observers: Vec<ReplicaInfo>,
}

/// A client write forwarded by a follower to the leader (like Kafka's
/// request forwarding to the active controller). Not part of the Raft
/// protocol: the QuorumState actor answers it once the records commit.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AppendRequest {
    pub records: Vec<serde_bytes::ByteBuf>,
}

/// Most groups in one [`AppendManyRequest`] (a hand-over of the HTTP or
/// client-protocol funnel holds at most as many).
pub const MAX_APPEND_GROUPS: usize = 1024;

/// Client writes a follower forwards together: each group is one client's
/// append, with its own outcome. The leader proposes all of them at once,
/// into the same accumulator (and so the same group commit) as its own
/// clients' appends, and answers once every group has its outcome, in the
/// order of the groups ([`RaftResponse::AppendMany`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AppendManyRequest {
    /// At most [`MAX_APPEND_GROUPS`]; the leader refuses a request with
    /// more (`InvalidRequest`) rather than answer each.
    pub groups: Vec<AppendRequest>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum AppendResponse {
    /// Committed at these offsets by the leader of `epoch`.
    Committed {
        base_offset: Offset,
        last_offset: Offset,
        epoch: Epoch,
    },
    /// The receiver is not the leader; it names the leader it knows.
    NotLeader { leader_id: Option<NodeId> },
    /// Leadership was lost before the records committed: they may or may
    /// not be in the log. Never retried on the caller's behalf.
    OutcomeUnknown { reason: String },
    /// The request was refused (empty, too large).
    Rejected { reason: String },
    /// The leader cannot take writes right now (overloaded, shutting down);
    /// nothing was written and the caller may retry.
    Unavailable { reason: String },
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum RaftRequest {
    Vote(VoteRequest),
    BeginQuorumEpoch(BeginQuorumEpochRequest),
    EndQuorumEpoch(EndQuorumEpochRequest),
    Fetch(FetchRequest),
    FetchSnapshot(FetchSnapshotRequest),
    DescribeQuorum,
    Append(AppendRequest),
    // New variants go last: bincode numbers them in order.
    AppendMany(AppendManyRequest),
    /// An operation for the active controller (metadata mode), forwarded
    /// by a node that is not it: opaque here, encoded by the metadata layer.
    Controller(#[serde(with = "serde_bytes")] Vec<u8>),
    /// A read index for a linearizable read on the sender (etcd's
    /// ReadIndex): answered [`RaftResponse::ReadIndex`].
    ReadIndex,
}

/// The leader's answer to a [`RaftRequest::ReadIndex`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ReadIndexResponse {
    /// Everything committed before the request reached the leader lies
    /// below this offset: the leader's high watermark once a majority had
    /// followed it, in its epoch, after the request came.
    Index(Offset),
    /// The receiver is not the leader; it names the leader it knows.
    NotLeader { leader_id: Option<NodeId> },
    /// The leader gave no index in time, or is stopping.
    Unavailable { reason: String },
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum RaftResponse {
    Vote(VoteResponse),
    BeginQuorumEpoch(QuorumEpochResponse),
    EndQuorumEpoch(QuorumEpochResponse),
    Fetch(FetchResponse),
    FetchSnapshot(FetchSnapshotResponse),
    DescribeQuorum(DescribeQuorumResponse),
    Append(AppendResponse),
    /// Sent in place of any response when the request was refused before it
    /// reached the protocol (wrong cluster id, undecodable body).
    Error(ErrorCode),
    /// One outcome per group of an [`AppendManyRequest`], in its order.
    AppendMany(Vec<AppendResponse>),
    /// The controller's answer to a [`RaftRequest::Controller`], encoded by
    /// the metadata layer.
    Controller(#[serde(with = "serde_bytes")] Vec<u8>),
    ReadIndex(ReadIndexResponse),
}

impl RaftRequest {
    /// Kafka's API name, for logs and metrics.
    pub fn api_name(&self) -> &'static str {
        match self {
            RaftRequest::Vote(_) => "Vote",
            RaftRequest::BeginQuorumEpoch(_) => "BeginQuorumEpoch",
            RaftRequest::EndQuorumEpoch(_) => "EndQuorumEpoch",
            RaftRequest::Fetch(_) => "Fetch",
            RaftRequest::FetchSnapshot(_) => "FetchSnapshot",
            RaftRequest::DescribeQuorum => "DescribeQuorum",
            RaftRequest::Append(_) => "Append",
            RaftRequest::AppendMany(_) => "AppendMany",
            RaftRequest::Controller(_) => "Controller",
            RaftRequest::ReadIndex => "ReadIndex",
        }
    }
}
