//! ControllerClient: how a node that is not the active controller (a
//! follower, a broker) hands a controller operation to the one that is, as
//! a `RaftRequest::Controller` on the raft listener (Kafka's brokers reach
//! the controller on its controller listener the same way). Each request
//! gets one answer: the controller's, or why none came (see
//! [`Forward`]).

use std::collections::HashMap;

use actix::prelude::*;
use tokio::sync::oneshot;

use crate::actors::controller::{decode_answer, encode_operation, Operation, OperationAnswer};
use crate::messages::actor::{RequestOutcome, SendRequest, TransportError};
use crate::messages::{RaftRequest, RaftResponse};
use crate::metadata::controller::ControllerError;
use crate::types::NodeId;

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

pub struct ControllerClient {
    requests: Recipient<SendRequest>,
    timeout_ms: u64,
    next_id: u64,
    pending: HashMap<u64, oneshot::Sender<Result<OperationAnswer, ControllerError>>>,
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
        self.pending.insert(id, reply);
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

impl Handler<RequestOutcome> for ControllerClient {
    type Result = ();

    fn handle(&mut self, msg: RequestOutcome, _ctx: &mut Self::Context) {
        let Some(reply) = self.pending.remove(&msg.correlation_id) else {
            return;
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
