//! Typed messages between the transport and the actors, and what a node
//! delivers to its registered listeners ([`Committed`], [`LeaderChanged`],
//! [`Listener`]). Actor-private messages live at the top of each actor's
//! file.

use actix::{Message, Recipient};

use super::records::CommittedRecord;
use super::rpc::{RaftRequest, RaftResponse};
use crate::types::{Epoch, NodeId, Offset};

/// Why an outbound request produced no response.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TransportError {
    #[error("cannot connect to node {0}: {1}")]
    Connect(NodeId, String),
    #[error("connection to node {0} lost: {1}")]
    Disconnected(NodeId, String),
    #[error("request to node {0} timed out")]
    Timeout(NodeId),
    #[error("unknown destination node {0}")]
    UnknownNode(NodeId),
}

/// A request a peer sent us, with the way back to that peer's connection.
/// Dropping `reply` without sending sends nothing (the peer times out).
#[derive(Message)]
#[rtype(result = "()")]
pub struct InboundRequest {
    pub from: NodeId,
    pub request: RaftRequest,
    pub reply: tokio::sync::oneshot::Sender<RaftResponse>,
}

/// A [`RaftRequest::Controller`] a peer sent, for this node's controller;
/// its answer goes down `reply` as a `RaftResponse::Controller`.
#[derive(Message)]
#[rtype(result = "()")]
pub struct ControllerInbound {
    pub from: NodeId,
    pub bytes: Vec<u8>,
    pub reply: tokio::sync::oneshot::Sender<RaftResponse>,
}

/// Asks the RequestManager to send `request` to voter `to`.
#[derive(Message, Debug)]
#[rtype(result = "()")]
pub struct SendRequest {
    pub to: NodeId,
    pub correlation_id: u64,
    pub request: RaftRequest,
    /// After this long without an answer the RequestManager reports
    /// `Timeout`: the sender's own deadline for the request (the engine's,
    /// for the protocol's requests), so that one clock decides.
    pub timeout_ms: u64,
}

/// The outcome of a [`SendRequest`], delivered to the QuorumState actor.
#[derive(Message, Debug)]
#[rtype(result = "()")]
pub struct RequestOutcome {
    pub from: NodeId,
    pub correlation_id: u64,
    pub result: Result<RaftResponse, TransportError>,
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

/// Delivered, on a node whose snapshots hold a state machine's state
/// (`node.state_machine = "metadata"`), to a listener that takes snapshots
/// when its next record is below the newest snapshot's end (at
/// registration, or after the node installed a snapshot from the leader):
/// the state as of `id.end_offset`, to replace whatever the listener built
/// so far. [`Committed`] records follow from `id.end_offset` on (Kafka's
/// `handleLoadSnapshot`).
#[derive(Message, Clone, Debug)]
#[rtype(result = "()")]
pub struct LoadSnapshot {
    pub id: crate::messages::SnapshotId,
    /// The snapshot's data records, in order.
    pub records: std::sync::Arc<Vec<crate::messages::Record>>,
}

/// A listener registration: committed records, leader changes and, on a
/// node whose snapshots hold a state, snapshots to load.
#[derive(Clone)]
pub struct Listener {
    pub committed: Recipient<Committed>,
    pub leader_changed: Option<Recipient<LeaderChanged>>,
    /// None on such a node: the listener starts at the log start instead
    /// (what came before is only in the snapshot), and after a snapshot
    /// install it goes on from the new log start.
    pub load_snapshot: Option<Recipient<LoadSnapshot>>,
}
