//! The QuorumState's appends: a client's append is proposed here, forwarded
//! to the leader or refused, as the engine routes it
//! (`RaftNode::route_append`); an append a follower forwarded is proposed
//! on the leader and answered at commit.

use std::sync::{Arc, Mutex};

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
    /// where the engine routes it ([`RaftNode::route_append`]), and those
    /// forwarded go to the leader together, as one `AppendMany` (or as few
    /// as their size allows) handed straight to the request manager. A
    /// reply dropped unanswered means the node stopped: the outcome is
    /// unknown.
    pub(super) fn propose_each(&mut self, now: u64, groups: Vec<(Vec<Vec<u8>>, AppendReply)>, ctx: &mut Context<Self>) {
        let mut accepted = Vec::with_capacity(groups.len());
        let mut forwarded = Vec::new();
        let mut forward_to = None;
        for (records, reply) in groups {
            if let Err(e) = self.refuse_if_stopping() {
                let _ = reply.send(Err(e));
                continue;
            }
            match self.node.route_append(&records) {
                AppendRoute::Propose => {
                    accepted.push((records.into_iter().map(Record::Data).collect::<Vec<_>>(), reply))
                }
                AppendRoute::Forward(leader_id) => {
                    // Nothing in this loop changes the engine's view: one
                    // leader for the whole hand-over.
                    forward_to = Some(leader_id);
                    forwarded.push((records, reply));
                }
                AppendRoute::Refuse(e) => drop(reply.send(Err(self.refusal(e)))),
            }
        }
        if let Some(leader_id) = forward_to {
            self.forwarding.forward(leader_id, forwarded);
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

    /// Appends a follower forwarded (`RaftRequest::AppendMany`, or one
    /// `RaftRequest::Append` from an older follower): not for the engine.
    /// Proposed here together, into the same accumulator as this node's
    /// own clients' appends; `answer` gets one response per group, in
    /// order, once every group has its outcome.
    pub(super) fn handle_forwarded_appends(
        &mut self,
        now: u64,
        groups: Vec<AppendRequest>,
        answer: impl FnOnce(Vec<AppendResponse>) + Send + 'static,
        ctx: &mut Context<Self>,
    ) {
        let count = groups.len();
        self.metrics.forwarded_requests_total += 1;
        self.metrics.forwarded_appends_total += count as u64;
        if let Err(e) = self.refuse_if_stopping() {
            debug!("refusing forwarded appends: {e}");
            return answer(vec![AppendResponse::NotLeader { leader_id: None }; count]);
        }
        // Before the role: a node whose disk is behind says so, leader or
        // not, so the follower that forwarded it answers Unavailable.
        if let Err(e) = self.node.admit() {
            return answer(vec![response_of(Err(self.refusal(e))); count]);
        }
        let proposals: Vec<Vec<Record>> = groups
            .into_iter()
            .map(|group| {
                group
                    .records
                    .into_iter()
                    .map(|bytes| Record::Data(bytes.into_vec()))
                    .collect::<Vec<_>>()
            })
            .collect();
        let outcomes = self.node.propose_many(now, proposals);
        let gathered = Gathered::new(count, answer);
        for (index, outcome) in outcomes.into_iter().enumerate() {
            match outcome {
                Ok(proposed) => {
                    let watched = gathered.clone();
                    let complete = Box::new(move |result| Gathered::fill(&watched, index, committed_answer(result)));
                    if let Err(e) = self.register(proposed, complete) {
                        // This group and those after it were proposed but
                        // will never be watched: their fate is open.
                        for unwatched in index..count {
                            let reason = format!("the node failed: {e}");
                            Gathered::fill(&gathered, unwatched, AppendResponse::OutcomeUnknown { reason });
                        }
                        return self.fatal(ctx, e);
                    }
                }
                Err(e) => Gathered::fill(&gathered, index, response_of(Err(self.refusal(e)))),
            }
        }
    }
}

/// The answers to one forwarded request as its groups get their outcomes;
/// the last one sends them all.
struct Gathered {
    answers: Vec<Option<AppendResponse>>,
    missing: usize,
    answer: Option<Box<dyn FnOnce(Vec<AppendResponse>) + Send>>,
}

impl Gathered {
    fn new(count: usize, answer: impl FnOnce(Vec<AppendResponse>) + Send + 'static) -> Arc<Mutex<Gathered>> {
        let gathered = Arc::new(Mutex::new(Gathered {
            answers: vec![None; count],
            missing: count,
            answer: Some(Box::new(answer)),
        }));
        if count == 0 {
            Gathered::send_if_complete(&mut gathered.lock().expect("not poisoned"));
        }
        gathered
    }

    /// Group `index`'s answer, unless it has one already.
    fn fill(gathered: &Mutex<Gathered>, index: usize, response: AppendResponse) {
        let mut gathered = gathered.lock().expect("not poisoned");
        if gathered.answers[index].is_none() {
            gathered.answers[index] = Some(response);
            gathered.missing -= 1;
        }
        Gathered::send_if_complete(&mut gathered);
    }

    fn send_if_complete(gathered: &mut Gathered) {
        if gathered.missing == 0 {
            if let Some(answer) = gathered.answer.take() {
                answer(gathered.answers.drain(..).flatten().collect());
            }
        }
    }
}

/// A forwarded group's answer once its records were proposed: as the
/// outcome says, except that being unable to go on after the records were
/// accepted leaves their fate open.
fn committed_answer(result: Result<Appended, AppendError>) -> AppendResponse {
    match result {
        Err(AppendError::Unavailable(reason)) => AppendResponse::OutcomeUnknown { reason },
        other => response_of(other),
    }
}

/// An append's outcome as the forwarding follower hears it (its
/// `Forwarding` turns it back into the same outcome).
fn response_of(result: Result<Appended, AppendError>) -> AppendResponse {
    match result {
        Ok(a) => AppendResponse::Committed {
            base_offset: a.base_offset,
            last_offset: a.last_offset,
            epoch: a.epoch,
        },
        Err(AppendError::NotLeader { leader_id, .. }) => AppendResponse::NotLeader { leader_id },
        Err(AppendError::Rejected(reason) | AppendError::Unsupported(reason)) => AppendResponse::Rejected { reason },
        Err(AppendError::Unavailable(reason)) => AppendResponse::Unavailable { reason },
        Err(AppendError::OutcomeUnknown(reason)) => AppendResponse::OutcomeUnknown { reason },
    }
}
