//! ControllerClient: how a node that is not the active controller (a
//! follower, a broker) hands a controller operation to the one that is, as
//! a `RaftRequest::Controller` on the raft listener (Kafka's brokers reach
//! the controller on its controller listener the same way); and how it asks
//! the leader for a linearizable read's index (`RaftRequest::ReadIndex`).
//! Each request gets one answer: the leader's, or why none came (see
//! [`Forward`] and [`ForwardReadIndex`]).

use std::collections::HashMap;

use actix::prelude::*;
use tokio::sync::oneshot;

use crate::actors::controller::{decode_answer, encode_operation, Operation, OperationAnswer};
use crate::messages::actor::{RequestOutcome, SendRequest, TransportError};
use crate::messages::{RaftRequest, RaftResponse, ReadIndexResponse};
use crate::metadata::controller::ControllerError;
use crate::types::NodeId;
use crate::types::{AppendError, Offset};

/// Sends `operation` to voter `to`, taken for the active controller. The
/// answer is the controller's; NOT_CONTROLLER when `to` is not it (any
/// more); UNAVAILABLE when it could not be reached (nothing was done);
/// OUTCOME_UNKNOWN when the connection was lost or timed out after the
/// request left (it may have been carried out).
#[derive(Message)]
#[rtype(result = "Result<OperationAnswer, ControllerError>")]
pub struct Forward {
    pub to: NodeId,
    pub operation: Operation,
}

/// Asks voter `to`, taken for the leader, for a read index.
#[derive(Message)]
#[rtype(result = "Result<Offset, AppendError>")]
pub struct ForwardReadIndex {
    pub to: NodeId,
}

enum Pending {
    Operation(oneshot::Sender<Result<OperationAnswer, ControllerError>>),
    ReadIndex(oneshot::Sender<Result<Offset, AppendError>>),
}

pub struct ControllerClient {
    requests: Recipient<SendRequest>,
    timeout_ms: u64,
    next_id: u64,
    pending: HashMap<u64, Pending>,
}

impl ControllerClient {
    /// `requests` is a RequestManager of its own whose outcomes come back
    /// here; each request times out after `timeout_ms`.
    pub fn new(requests: Recipient<SendRequest>, timeout_ms: u64) -> ControllerClient {
        ControllerClient {
            requests,
            timeout_ms,
            next_id: 0,
            pending: HashMap::new(),
        }
    }
}

impl Actor for ControllerClient {
    type Context = Context<Self>;
}

impl Handler<Forward> for ControllerClient {
    type Result = ResponseFuture<Result<OperationAnswer, ControllerError>>;

    fn handle(&mut self, msg: Forward, _ctx: &mut Self::Context) -> Self::Result {
        let id = self.next_id;
        self.next_id += 1;
        let (reply, answer) = oneshot::channel();
        self.pending.insert(id, Pending::Operation(reply));
        self.requests.do_send(SendRequest {
            to: msg.to,
            correlation_id: id,
            request: RaftRequest::Controller(encode_operation(&msg.operation)),
            timeout_ms: self.timeout_ms,
        });
        Box::pin(async move {
            answer
                .await
                .unwrap_or_else(|_| Err(ControllerError::Unavailable("the node is stopping".to_string())))
        })
    }
}

impl Handler<ForwardReadIndex> for ControllerClient {
    type Result = ResponseFuture<Result<Offset, AppendError>>;

    fn handle(&mut self, msg: ForwardReadIndex, _ctx: &mut Self::Context) -> Self::Result {
        let id = self.next_id;
        self.next_id += 1;
        let (reply, answer) = oneshot::channel();
        self.pending.insert(id, Pending::ReadIndex(reply));
        self.requests.do_send(SendRequest {
            to: msg.to,
            correlation_id: id,
            request: RaftRequest::ReadIndex,
            timeout_ms: self.timeout_ms,
        });
        Box::pin(async move {
            answer
                .await
                .unwrap_or_else(|_| Err(AppendError::Unavailable("the node is stopping".to_string())))
        })
    }
}

/// What a read index request's outcome says. A read asks for nothing to
/// be written: every failure may be retried.
fn read_index_of(msg: RequestOutcome) -> Result<Offset, AppendError> {
    let not_leader = |leader_id| AppendError::NotLeader {
        leader_id,
        leader_endpoint: None,
    };
    match msg.result {
        Ok(RaftResponse::ReadIndex(ReadIndexResponse::Index(index))) => Ok(index),
        Ok(RaftResponse::ReadIndex(ReadIndexResponse::NotLeader { leader_id })) => Err(not_leader(leader_id)),
        Ok(RaftResponse::ReadIndex(ReadIndexResponse::Unavailable { reason })) => Err(AppendError::Unavailable(reason)),
        Ok(_) => Err(not_leader(None)),
        Err(e) => Err(AppendError::Unavailable(format!(
            "no read index from node {}: {e}",
            msg.from
        ))),
    }
}

impl Handler<RequestOutcome> for ControllerClient {
    type Result = ();

    fn handle(&mut self, msg: RequestOutcome, _ctx: &mut Self::Context) {
        let reply = match self.pending.remove(&msg.correlation_id) {
            None => return,
            Some(Pending::ReadIndex(reply)) => {
                let _ = reply.send(read_index_of(msg));
                return;
            }
            Some(Pending::Operation(reply)) => reply,
        };
        let answer = match msg.result {
            Ok(RaftResponse::Controller(bytes)) => decode_answer(&bytes),
            Ok(RaftResponse::Error(code)) => Err(ControllerError::NotController {
                leader_id: None,
                message: format!("node {} runs no controller ({code:?})", msg.from),
            }),
            Ok(other) => Err(ControllerError::Unavailable(format!(
                "node {} answered a controller operation with {:?}",
                msg.from,
                std::mem::discriminant(&other)
            ))),
            Err(TransportError::Connect(..) | TransportError::UnknownNode(_)) => {
                Err(ControllerError::Unavailable(format!(
                    "the active controller (node {}) cannot be reached; nothing was done",
                    msg.from
                )))
            }
            Err(e) => Err(ControllerError::OutcomeUnknown(format!(
                "{e}; the operation may or may not have been carried out"
            ))),
        };
        let _ = reply.send(answer);
    }
}
