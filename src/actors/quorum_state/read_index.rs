//! Linearizable reads (etcd's ReadIndex, confirmed through the log): the
//! leader takes a barrier ([`RaftNode::read_barrier`]) and answers with its
//! high watermark once the high watermark passes it; the node that reads
//! waits until its own high watermark reaches that index, then reads its
//! own log or image. Barriers of one epoch die with it: a leader that
//! lost its role answers NOT_LEADER, and the reader asks again.

use super::*;
use crate::messages::ReadIndexResponse;

/// A read index from this node, which must lead ([`AppendError::NotLeader`]
/// names the leader otherwise): resolves with an offset below which every
/// record committed before the request lies.
#[derive(Message, Debug)]
#[rtype(result = "Result<Offset, AppendError>")]
pub struct ReadIndex;

/// Resolves once this node's high watermark reaches the offset (at once if
/// it has), with the high watermark.
#[derive(Message, Debug)]
#[rtype(result = "Result<Offset, NodeError>")]
pub struct WaitCommitted(pub Offset);

type IndexReply = Box<dyn FnOnce(Result<Offset, AppendError>)>;

/// Barriers waiting for the high watermark to pass them, and readers
/// waiting for it to reach their index.
#[derive(Default)]
pub(super) struct ReadIndexes {
    /// (epoch, barrier, reply): answered once the high watermark passes
    /// the barrier in that epoch.
    barriers: Vec<(i32, Offset, IndexReply)>,
    waiters: Vec<(Offset, oneshot::Sender<Result<Offset, NodeError>>)>,
}

impl ReadIndexes {
    /// The high watermark moved to `hw`.
    pub(super) fn on_high_watermark(&mut self, hw: Offset) {
        let (passed, waiting): (Vec<_>, Vec<_>) = std::mem::take(&mut self.barriers)
            .into_iter()
            .partition(|(_, barrier, _)| hw > *barrier);
        self.barriers = waiting;
        for (_, _, reply) in passed {
            reply(Ok(hw));
        }
        let (reached, waiting): (Vec<_>, Vec<_>) = std::mem::take(&mut self.waiters)
            .into_iter()
            .partition(|(index, _)| hw >= *index);
        self.waiters = waiting;
        for (_, reply) in reached {
            let _ = reply.send(Ok(hw));
        }
    }

    /// The role changed: barriers of any other epoch than a leader's
    /// current one can no longer be vouched for.
    pub(super) fn on_role(&mut self, info: &RoleInfo, me: NodeId) {
        let leading = info.role == RoleKind::Leader;
        let (kept, dropped): (Vec<_>, Vec<_>) = std::mem::take(&mut self.barriers)
            .into_iter()
            .partition(|(epoch, _, _)| leading && *epoch == info.epoch);
        self.barriers = kept;
        let leader_id = info.leader_id.filter(|id| *id != me);
        for (_, _, reply) in dropped {
            reply(Err(AppendError::NotLeader {
                leader_id,
                leader_endpoint: None,
            }));
        }
    }
}

impl QuorumState {
    /// Takes a barrier for `reply`, or refuses it: NOT_LEADER with the
    /// leader this node knows.
    fn read_index(&mut self, now: u64, reply: IndexReply) {
        match self.node.read_barrier(now) {
            Some(barrier) => {
                let epoch = self.node.role().epoch;
                self.read_indexes.barriers.push((epoch, barrier, reply));
                // The barrier is the log's end: the high watermark passes
                // it at a later HighWatermark action.
            }
            None => {
                let leader_id = self.node.role().leader_id.filter(|id| *id != self.node_id);
                reply(Err(AppendError::NotLeader {
                    leader_endpoint: self.leader_endpoint(leader_id),
                    leader_id,
                }));
            }
        }
    }

    /// A peer asks this node, taken for the leader, for a read index.
    pub(super) fn inbound_read_index(&mut self, now: u64, reply: oneshot::Sender<RaftResponse>) {
        self.read_index(
            now,
            Box::new(move |result| {
                let answer = match result {
                    Ok(index) => ReadIndexResponse::Index(index),
                    Err(AppendError::NotLeader { leader_id, .. }) => ReadIndexResponse::NotLeader { leader_id },
                    Err(e) => ReadIndexResponse::Unavailable { reason: e.to_string() },
                };
                let _ = reply.send(RaftResponse::ReadIndex(answer));
            }),
        );
    }
}

impl Handler<ReadIndex> for QuorumState {
    type Result = ResponseFuture<Result<Offset, AppendError>>;

    fn handle(&mut self, _msg: ReadIndex, ctx: &mut Self::Context) -> Self::Result {
        let now = self.tick();
        let (tx, rx) = oneshot::channel();
        self.read_index(
            now,
            Box::new(move |result| {
                let _ = tx.send(result);
            }),
        );
        self.drive(ctx);
        Box::pin(async move {
            rx.await
                .unwrap_or_else(|_| Err(AppendError::Unavailable("the node is stopping".to_string())))
        })
    }
}

impl Handler<WaitCommitted> for QuorumState {
    type Result = ResponseFuture<Result<Offset, NodeError>>;

    fn handle(&mut self, msg: WaitCommitted, ctx: &mut Self::Context) -> Self::Result {
        self.tick();
        self.drive(ctx);
        let hw = self.executed_high_watermark;
        if hw >= msg.0 {
            return Box::pin(ready(Ok(hw)));
        }
        let (tx, rx) = oneshot::channel();
        self.read_indexes.waiters.push((msg.0, tx));
        Box::pin(async move {
            rx.await
                .unwrap_or_else(|_| Err(NodeError::Stopped("the node is stopping".to_string())))
        })
    }
}
