//! Typed messages between the transport and the actors. Actor-private
//! messages live at the top of each actor's file.

use actix::Message;

use super::rpc::{RaftRequest, RaftResponse};
use crate::raft::NodeId;

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

/// Asks the RequestManager to send `request` to voter `to`.
#[derive(Message, Debug)]
#[rtype(result = "()")]
pub struct SendRequest {
    pub to: NodeId,
    pub correlation_id: u64,
    pub request: RaftRequest,
}

/// The outcome of a [`SendRequest`], delivered to the QuorumState actor.
#[derive(Message, Debug)]
#[rtype(result = "()")]
pub struct RequestOutcome {
    pub from: NodeId,
    pub correlation_id: u64,
    pub result: Result<RaftResponse, TransportError>,
}
