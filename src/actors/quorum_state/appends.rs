//! The QuorumState's appends: a client's append is proposed here, forwarded
//! to the leader or refused, as the engine routes it
//! (`RaftNode::route_append`); an append a follower forwarded is proposed
//! on the leader and answered at commit.

use super::*;

impl QuorumState {
    /// Registers an accepted proposal with the purgatory.
    pub(super) fn register(&mut self, proposed: Proposed, complete: fetch_purgatory::Completion) -> Result<(), String> {
        post(&self.purgatory, Register { proposed, complete }).map_err(|e| format!("fetch purgatory: {e}"))
    }

    /// Refuses new appends while shutting down; every other bound is the
    /// engine's (`raft::admission`).
    pub(super) fn refuse_if_stopping(&self) -> Result<(), AppendError> {
        if self.shutting_down.is_some() || self.is_stopping() {
            return Err(AppendError::Unavailable("the node is shutting down".into()));
        }
        Ok(())
    }

    /// The client's view of a refusal: nothing was written.
    pub(super) fn refusal(&self, e: ProposeError) -> AppendError {
        match e {
            ProposeError::NotLeader { leader_id, .. } => AppendError::NotLeader {
                leader_id,
                leader_endpoint: self.leader_endpoint(leader_id),
            },
            ProposeError::DiskBehind { .. } | ProposeError::CommitBehind { .. } => {
                AppendError::Unavailable(e.to_string())
            }
            e => AppendError::Rejected(e.to_string()),
        }
    }

    pub(super) fn leader_endpoint(&self, leader: Option<NodeId>) -> Option<String> {
        leader.and_then(|id| self.voters.get(&id).cloned())
    }

    /// A local append: proposed here on the leader, forwarded to the leader
    /// from anywhere else.
    pub(super) fn propose_local(
        &mut self,
        now: u64,
        records: Vec<Vec<u8>>,
        ctx: &mut Context<Self>,
    ) -> BoxFuture<'static, Result<Appended, AppendError>> {
        let (reply, outcome) = oneshot::channel();
        self.propose_each(now, vec![(records, reply)], ctx);
        async move {
            outcome.await.unwrap_or_else(|_| {
                Err(AppendError::OutcomeUnknown(
                    "the node stopped before the records committed".into(),
                ))
            })
        }
        .boxed()
    }

    /// Local appends, each with its own reply, proposed in order: on the
    /// leader all of them join the accumulator before it drains (one batch
    /// for a whole hand-over of HTTP requests); anywhere else each goes
    /// where the engine routes it ([`RaftNode::route_append`]). A reply
    /// dropped unanswered means the node stopped: the outcome is unknown.
    pub(super) fn propose_each(&mut self, now: u64, groups: Vec<(Vec<Vec<u8>>, AppendReply)>, ctx: &mut Context<Self>) {
        let mut accepted = Vec::with_capacity(groups.len());
        for (records, reply) in groups {
            if let Err(e) = self.refuse_if_stopping() {
                let _ = reply.send(Err(e));
                continue;
            }
            match self.node.route_append(&records) {
                AppendRoute::Propose => {
                    accepted.push((records.into_iter().map(Record::Data).collect::<Vec<_>>(), reply))
                }
                AppendRoute::Forward(leader_id) => self.forward(leader_id, records, reply),
                AppendRoute::Refuse(e) => drop(reply.send(Err(self.refusal(e)))),
            }
        }
        if accepted.is_empty() {
            return;
        }
        let (proposals, replies): (Vec<_>, Vec<_>) = accepted.into_iter().unzip();
        let outcomes = self.node.propose_many(now, proposals);
        for (outcome, reply) in outcomes.into_iter().zip(replies) {
            match outcome {
                Ok(proposed) => {
                    if let Err(e) = self.register(proposed, Box::new(move |result| drop(reply.send(result)))) {
                        return self.fatal(ctx, e);
                    }
                }
                Err(e) => drop(reply.send(Err(self.refusal(e)))),
            }
        }
    }

    /// A local append on a node that does not lead, relayed to the leader.
    pub(super) fn forward(&mut self, leader_id: NodeId, records: Vec<Vec<u8>>, reply: AppendReply) {
        let forwarded = self.forwarder.send(Forward { leader_id, records });
        actix::spawn(async move {
            let outcome = forwarded
                .await
                .unwrap_or_else(|_| Err(AppendError::Unavailable("the append forwarder stopped".into())));
            // A closed reply: the client went away; the outcome stands.
            let _ = reply.send(outcome);
        });
    }

    /// A follower forwarded a client's append (`RaftRequest::Append`): not
    /// for the engine. Proposed on the leader and answered at commit.
    pub(super) fn handle_forwarded_append(
        &mut self,
        now: u64,
        request: AppendRequest,
        reply: oneshot::Sender<RaftResponse>,
        ctx: &mut Context<Self>,
    ) {
        let answer = |response: AppendResponse| RaftResponse::Append(response);
        if let Err(e) = self.refuse_if_stopping() {
            debug!("refusing a forwarded append: {e}");
            let _ = reply.send(answer(AppendResponse::NotLeader { leader_id: None }));
            return;
        }
        // Before the role: a node whose disk is behind says so, leader or
        // not, so the follower that forwarded it answers Unavailable.
        if let Err(e) = self.node.admit() {
            let _ = reply.send(answer(AppendResponse::Unavailable { reason: e.to_string() }));
            return;
        }
        let records = request
            .records
            .into_iter()
            .map(|bytes| Record::Data(bytes.into_vec()))
            .collect();
        match self.node.propose(now, records) {
            Ok(proposed) => {
                let complete = Box::new(move |result: Result<Appended, AppendError>| {
                    let response = match result {
                        Ok(a) => AppendResponse::Committed {
                            base_offset: a.base_offset,
                            last_offset: a.last_offset,
                            epoch: a.epoch,
                        },
                        // The records were accepted: whatever went wrong
                        // after that leaves their fate open.
                        Err(AppendError::OutcomeUnknown(reason)) | Err(AppendError::Unavailable(reason)) => {
                            AppendResponse::OutcomeUnknown { reason }
                        }
                        Err(AppendError::Rejected(reason)) => AppendResponse::Rejected { reason },
                        Err(AppendError::NotLeader { leader_id, .. }) => AppendResponse::NotLeader { leader_id },
                    };
                    let _ = reply.send(answer(response));
                });
                if let Err(e) = self.register(proposed, complete) {
                    self.fatal(ctx, e);
                }
            }
            Err(ProposeError::NotLeader { leader_id, .. }) => {
                let _ = reply.send(answer(AppendResponse::NotLeader { leader_id }));
            }
            Err(e @ (ProposeError::DiskBehind { .. } | ProposeError::CommitBehind { .. })) => {
                let _ = reply.send(answer(AppendResponse::Unavailable { reason: e.to_string() }));
            }
            Err(e) => {
                let _ = reply.send(answer(AppendResponse::Rejected { reason: e.to_string() }));
            }
        }
    }
}
