//! AppendForwarder: sends a follower's local appends to the leader as
//! `RaftRequest::Append` and relays the leader's answer (docs/ARCHITECTURE.md,
//! "A commit's path").
//!
//! It has its *own* RequestManager: a forwarded append is answered only
//! when its records commit, and if it shared the RequestManager of the
//! protocol (one request in flight per destination) it could hold up this
//! node's Fetch to the same leader, which the commit may itself be waiting
//! for. A separate manager also keeps its correlation ids apart from the
//! engine's.

use std::collections::{BTreeMap, HashMap};

use actix::fut::wrap_future;
use actix::prelude::*;
use futures::future::ready;
use tokio::sync::oneshot;
use tracing::{debug, error};

use crate::messages::actor::{RequestOutcome, SendRequest, TransportError};
use crate::messages::{AppendRequest, AppendResponse, ErrorCode, RaftRequest, RaftResponse};
use crate::raft::NodeId;
use crate::types::{AppendError, Appended};

/// Most appends a follower has forwarded and not yet heard back about.
const MAX_FORWARDED_PENDING: usize = 10_000;

/// Forward these records to the leader as `RaftRequest::Append`.
#[derive(Message, Debug)]
#[rtype(result = "Result<Appended, AppendError>")]
pub struct Forward {
    pub leader_id: NodeId,
    pub records: Vec<Vec<u8>>,
}

/// Fail everything pending and stop.
#[derive(Message, Debug)]
#[rtype(result = "()")]
pub struct StopForwarder;

struct PendingForward {
    leader_id: NodeId,
    reply: oneshot::Sender<Result<Appended, AppendError>>,
}

/// Sends a follower's local appends to the leader and relays the answer
/// (see the module doc for why it has a RequestManager of its own).
pub struct AppendForwarder {
    requests: Recipient<SendRequest>,
    voters: BTreeMap<NodeId, String>,
    /// How long the leader has to answer a forwarded append
    /// (`quorum.request_timeout_ms`); then its outcome is unknown.
    timeout_ms: u64,
    pending: HashMap<u64, PendingForward>,
    next_correlation_id: u64,
}

impl AppendForwarder {
    pub fn new(requests: Recipient<SendRequest>, voters: BTreeMap<NodeId, String>, timeout_ms: u64) -> Self {
        AppendForwarder {
            requests,
            voters,
            timeout_ms,
            pending: HashMap::new(),
            next_correlation_id: 1,
        }
    }

    fn not_leader(&self, leader_id: Option<NodeId>) -> AppendError {
        let leader_endpoint = leader_id.and_then(|id| self.voters.get(&id).cloned());
        AppendError::NotLeader {
            leader_id,
            leader_endpoint,
        }
    }

    fn outcome(
        &self,
        leader_id: NodeId,
        result: Result<RaftResponse, TransportError>,
    ) -> Result<Appended, AppendError> {
        match result {
            Ok(RaftResponse::Append(AppendResponse::Committed {
                base_offset,
                last_offset,
                epoch,
            })) => Ok(Appended {
                base_offset,
                last_offset,
                epoch,
            }),
            Ok(RaftResponse::Append(AppendResponse::NotLeader { leader_id })) => Err(self.not_leader(leader_id)),
            Ok(RaftResponse::Append(AppendResponse::OutcomeUnknown { reason })) => {
                Err(AppendError::OutcomeUnknown(reason))
            }
            Ok(RaftResponse::Append(AppendResponse::Rejected { reason })) => Err(AppendError::Rejected(reason)),
            Ok(RaftResponse::Append(AppendResponse::Unavailable { reason })) => Err(AppendError::Unavailable(reason)),
            // Refused before it reached the leader's protocol: nothing written.
            Ok(RaftResponse::Error(ErrorCode::BrokerNotAvailable)) => Err(self.not_leader(None)),
            Ok(RaftResponse::Error(code)) => Err(AppendError::Rejected(format!(
                "node {leader_id} refused the append: {code:?}"
            ))),
            Ok(other) => Err(AppendError::OutcomeUnknown(format!(
                "unexpected answer from node {leader_id}: {other:?}"
            ))),
            // Never connected: nothing was sent.
            Err(TransportError::Connect(..)) | Err(TransportError::UnknownNode(_)) => {
                Err(self.not_leader(Some(leader_id)))
            }
            // Sent, then lost: the records may or may not commit.
            Err(e @ TransportError::Disconnected(..)) | Err(e @ TransportError::Timeout(_)) => {
                Err(AppendError::OutcomeUnknown(e.to_string()))
            }
        }
    }
}

impl Actor for AppendForwarder {
    type Context = Context<Self>;

    fn stopped(&mut self, _ctx: &mut Self::Context) {
        for (_, pending) in self.pending.drain() {
            let _ = pending.reply.send(Err(AppendError::OutcomeUnknown(
                "the node stopped before the leader answered".into(),
            )));
        }
    }
}

impl Handler<Forward> for AppendForwarder {
    type Result = ResponseFuture<Result<Appended, AppendError>>;

    fn handle(&mut self, msg: Forward, ctx: &mut Self::Context) -> Self::Result {
        if self.pending.len() >= MAX_FORWARDED_PENDING {
            let error = AppendError::Unavailable(format!(
                "{} forwarded appends are already in flight",
                self.pending.len()
            ));
            return Box::pin(ready(Err(error)));
        }
        let correlation_id = self.next_correlation_id;
        self.next_correlation_id += 1;
        let (reply, answer) = oneshot::channel();
        self.pending.insert(
            correlation_id,
            PendingForward {
                leader_id: msg.leader_id,
                reply,
            },
        );
        let records = msg.records.into_iter().map(serde_bytes::ByteBuf::from).collect();
        let request = SendRequest {
            to: msg.leader_id,
            correlation_id,
            request: RaftRequest::Append(AppendRequest { records }),
            timeout_ms: self.timeout_ms,
        };
        ctx.spawn(
            wrap_future::<_, Self>(self.requests.send(request)).map(move |sent, act, _ctx| {
                if sent.is_err() {
                    error!("the append forwarder's request manager is gone");
                    if let Some(pending) = act.pending.remove(&correlation_id) {
                        let _ = pending
                            .reply
                            .send(Err(AppendError::Unavailable("the request manager stopped".into())));
                    }
                }
            }),
        );
        Box::pin(async move {
            answer.await.unwrap_or_else(|_| {
                Err(AppendError::OutcomeUnknown(
                    "the node stopped before the leader answered".into(),
                ))
            })
        })
    }
}

impl Handler<RequestOutcome> for AppendForwarder {
    type Result = ();

    fn handle(&mut self, msg: RequestOutcome, _ctx: &mut Self::Context) {
        let Some(pending) = self.pending.remove(&msg.correlation_id) else {
            debug!(
                correlation_id = msg.correlation_id,
                "answer to a forwarded append nobody waits for"
            );
            return;
        };
        let outcome = self.outcome(pending.leader_id, msg.result);
        let _ = pending.reply.send(outcome);
    }
}

impl Handler<StopForwarder> for AppendForwarder {
    type Result = ();

    fn handle(&mut self, _msg: StopForwarder, ctx: &mut Self::Context) {
        ctx.stop();
    }
}
