//! A follower's forwarded appends (docs/ARCHITECTURE.md, "A commit's
//! path"): the appends of one hand-over that go to the leader leave as one
//! `RaftRequest::AppendMany` (split only past one batch's size or
//! `MAX_APPEND_GROUPS` appends), sent by
//! QuorumState straight to the RequestManager kept for them, and each
//! append's outcome goes to its own reply when the leader answers.
//!
//! The requests go over a RequestManager of their own: a forwarded append
//! is answered only when its records commit, and if it shared the
//! RequestManager of the protocol (one request in flight per destination)
//! it could hold up this node's Fetch to the same leader, which the commit
//! may itself be waiting for. Their outcomes come back to QuorumState with
//! the engine's; their correlation ids have [`FORWARDED`] set, which the
//! engine's never do.

use std::collections::{BTreeMap, HashMap};

use actix::prelude::*;
use tracing::{debug, error};

use crate::messages::actor::{RequestOutcome, SendRequest, TransportError};
use crate::messages::{
    AppendManyRequest, AppendRequest, AppendResponse, ErrorCode, RaftRequest, RaftResponse, Record, MAX_APPEND_GROUPS,
};
use crate::raft::NodeId;
use crate::types::{AppendError, AppendReply, Appended};

/// Most client appends a node has forwarded and not yet heard back about;
/// more are answered Unavailable (nothing written).
const MAX_FORWARDED_PENDING: usize = 10_000;

/// The bit set in the correlation id of every forwarded request (the
/// engine numbers its own requests from 1 up and never reaches it).
pub(crate) const FORWARDED: u64 = 1 << 63;

/// One request in flight: the leader it went to and the replies of its
/// groups, in order.
struct PendingForward {
    leader_id: NodeId,
    replies: Vec<AppendReply>,
}

/// The forwarded appends in flight and where their requests go.
pub(crate) struct Forwarding {
    requests: Recipient<SendRequest>,
    voters: BTreeMap<NodeId, String>,
    /// How long the leader has to answer a forwarded append
    /// (`quorum.request_timeout_ms`); then its outcome is unknown.
    timeout_ms: u64,
    /// Most record bytes (as a batch counts them) in one request: one
    /// batch's worth (`log.max_batch_bytes`), so that a request fits any
    /// frame a single append fits.
    max_request_bytes: usize,
    pending: HashMap<u64, PendingForward>,
    /// Client appends in `pending`.
    pending_appends: usize,
    next_correlation_id: u64,
}

impl Forwarding {
    pub(crate) fn new(
        requests: Recipient<SendRequest>,
        voters: BTreeMap<NodeId, String>,
        timeout_ms: u64,
        max_request_bytes: usize,
    ) -> Self {
        Forwarding {
            requests,
            voters,
            timeout_ms,
            max_request_bytes,
            pending: HashMap::new(),
            pending_appends: 0,
            next_correlation_id: FORWARDED | 1,
        }
    }

    /// Whether `correlation_id` is a forwarded request's.
    pub(crate) fn owns(correlation_id: u64) -> bool {
        correlation_id & FORWARDED != 0
    }

    /// Sends `groups` (all for `leader_id`) in requests of at most
    /// `max_request_bytes` (one append alone may fill one) and
    /// [`MAX_APPEND_GROUPS`] appends, in order.
    pub(crate) fn forward(&mut self, leader_id: NodeId, groups: Vec<(Vec<Vec<u8>>, AppendReply)>) {
        let mut request = Vec::new();
        let mut bytes = 0;
        for (records, reply) in groups {
            if self.pending_appends + request.len() >= MAX_FORWARDED_PENDING {
                let _ = reply.send(Err(AppendError::Unavailable(format!(
                    "{} forwarded appends are already in flight",
                    self.pending_appends + request.len()
                ))));
                continue;
            }
            let size: usize = records.iter().map(|r| Record::data_encoded_len(r.len())).sum();
            if !request.is_empty() && (bytes + size > self.max_request_bytes || request.len() == MAX_APPEND_GROUPS) {
                self.send(leader_id, std::mem::take(&mut request));
                bytes = 0;
            }
            bytes += size;
            request.push((records, reply));
        }
        if !request.is_empty() {
            self.send(leader_id, request);
        }
    }

    /// Answers every append of the request the outcome is for.
    pub(crate) fn on_outcome(&mut self, msg: RequestOutcome) {
        let Some(pending) = self.pending.get(&msg.correlation_id) else {
            debug!(
                correlation_id = msg.correlation_id,
                "answer to a forwarded append nobody waits for"
            );
            return;
        };
        let outcomes = self.outcomes(pending.leader_id, pending.replies.len(), msg.result);
        self.answer(msg.correlation_id, |_| outcomes);
    }

    /// The node stops: every append still waiting hears its outcome is
    /// unknown (the leader may still commit it).
    pub(crate) fn stop(&mut self) {
        for (_, pending) in self.pending.drain() {
            for reply in pending.replies {
                let _ = reply.send(Err(AppendError::OutcomeUnknown(
                    "the node stopped before the leader answered".into(),
                )));
            }
        }
        self.pending_appends = 0;
    }

    /// Sends one request of `groups` (all for `leader_id`).
    fn send(&mut self, leader_id: NodeId, groups: Vec<(Vec<Vec<u8>>, AppendReply)>) {
        let correlation_id = self.next_correlation_id;
        self.next_correlation_id += 1;
        let (records, replies): (Vec<_>, Vec<_>) = groups.into_iter().unzip();
        let groups = records
            .into_iter()
            .map(|records| AppendRequest {
                records: records.into_iter().map(serde_bytes::ByteBuf::from).collect(),
            })
            .collect();
        self.pending_appends += replies.len();
        self.pending
            .insert(correlation_id, PendingForward { leader_id, replies });
        let request = SendRequest {
            to: leader_id,
            correlation_id,
            request: RaftRequest::AppendMany(AppendManyRequest { groups }),
            timeout_ms: self.timeout_ms,
        };
        // Past a full mailbox: the request manager's queue is bounded by
        // MAX_FORWARDED_PENDING appends, not by the mailbox. (Should the
        // manager close between the two sends, the request is lost with it;
        // the manager closes only as the node stops, and `stop` answers
        // every pending append.)
        let sent = match self.requests.try_send(request) {
            Err(SendError::Full(request)) => {
                self.requests.do_send(request);
                Ok(())
            }
            other => other,
        };
        if sent.is_err() {
            error!("the request manager of forwarded appends is gone");
            let unavailable = Err(AppendError::Unavailable("the request manager stopped".into()));
            self.answer(correlation_id, |n| vec![unavailable; n]);
        }
    }

    fn not_leader(&self, leader_id: Option<NodeId>) -> AppendError {
        let leader_endpoint = leader_id.and_then(|id| self.voters.get(&id).cloned());
        AppendError::NotLeader {
            leader_id,
            leader_endpoint,
        }
    }

    /// One group's outcome from the leader's answer to it.
    fn group_outcome(&self, response: AppendResponse) -> Result<Appended, AppendError> {
        match response {
            AppendResponse::Committed {
                base_offset,
                last_offset,
                epoch,
            } => Ok(Appended {
                base_offset,
                last_offset,
                epoch,
            }),
            AppendResponse::NotLeader { leader_id } => Err(self.not_leader(leader_id)),
            AppendResponse::OutcomeUnknown { reason } => Err(AppendError::OutcomeUnknown(reason)),
            AppendResponse::Rejected { reason } => Err(AppendError::Rejected(reason)),
            AppendResponse::Unavailable { reason } => Err(AppendError::Unavailable(reason)),
        }
    }

    /// The outcome of every group of a request, from the leader's answer
    /// or the transport's failure.
    fn outcomes(
        &self,
        leader_id: NodeId,
        groups: usize,
        result: Result<RaftResponse, TransportError>,
    ) -> Vec<Result<Appended, AppendError>> {
        let all = |error: AppendError| vec![Err(error); groups];
        match result {
            Ok(RaftResponse::AppendMany(answers)) if answers.len() == groups => {
                answers.into_iter().map(|a| self.group_outcome(a)).collect()
            }
            // Refused before it reached the leader's protocol: nothing written.
            Ok(RaftResponse::Error(ErrorCode::BrokerNotAvailable)) => all(self.not_leader(None)),
            Ok(RaftResponse::Error(code)) => all(AppendError::Rejected(format!(
                "node {leader_id} refused the append: {code:?}"
            ))),
            // The leader took the request: what it did with it is not known.
            Ok(other) => all(AppendError::OutcomeUnknown(format!(
                "unexpected answer from node {leader_id}: {}",
                describe(&other)
            ))),
            // Never connected: nothing was sent.
            Err(TransportError::Connect(..)) | Err(TransportError::UnknownNode(_)) => {
                all(self.not_leader(Some(leader_id)))
            }
            // Sent, then lost: the records may or may not commit.
            Err(e @ TransportError::Disconnected(..)) | Err(e @ TransportError::Timeout(_)) => {
                all(AppendError::OutcomeUnknown(e.to_string()))
            }
        }
    }

    /// Answers the groups of request `correlation_id` (if still pending)
    /// with `outcomes(number of groups)`.
    fn answer(&mut self, correlation_id: u64, outcomes: impl FnOnce(usize) -> Vec<Result<Appended, AppendError>>) {
        let Some(pending) = self.pending.remove(&correlation_id) else {
            return;
        };
        let count = pending.replies.len();
        self.pending_appends -= count;
        for (reply, outcome) in pending.replies.into_iter().zip(outcomes(count)) {
            // A closed reply: the client went away; the outcome stands.
            let _ = reply.send(outcome);
        }
    }
}

/// The kind of an unexpected response, for an error message.
fn describe(response: &RaftResponse) -> String {
    match response {
        RaftResponse::Append(a) => format!("Append({a:?})"),
        RaftResponse::AppendMany(answers) => format!("AppendMany with {} answers", answers.len()),
        other => format!("{other:?}").chars().take(200).collect(),
    }
}

#[cfg(test)]
mod tests {
    use tokio::sync::{mpsc, oneshot};

    use super::super::test_support::Wire;
    use super::*;

    const LEADER: NodeId = 1;

    fn forwarding(max_request_bytes: usize) -> (Forwarding, mpsc::UnboundedReceiver<SendRequest>) {
        let (tx, sent) = mpsc::unbounded_channel();
        let voters = [(LEADER, "127.0.0.1:9001".to_string())].into();
        let forwarding = Forwarding::new(Wire(tx).start().recipient(), voters, 1_000, max_request_bytes);
        (forwarding, sent)
    }

    /// An append as `Forwarding` queues it, and the answer its caller awaits.
    type Queued = (Vec<Vec<u8>>, AppendReply);
    type Answer = oneshot::Receiver<Result<Appended, AppendError>>;

    /// `n` appends of one record of `bytes` bytes, and their answers.
    fn appends(n: usize, bytes: usize) -> (Vec<Queued>, Vec<Answer>) {
        (0..n)
            .map(|i| {
                let (reply, answer) = oneshot::channel();
                ((vec![vec![i as u8; bytes]], reply), answer)
            })
            .unzip()
    }

    fn groups_of(request: &SendRequest) -> Vec<usize> {
        match &request.request {
            RaftRequest::AppendMany(many) => many.groups.iter().map(|g| g.records.len()).collect(),
            other => panic!("{other:?}"),
        }
    }

    fn outcome(request: &SendRequest, result: Result<RaftResponse, TransportError>) -> RequestOutcome {
        RequestOutcome {
            from: LEADER,
            correlation_id: request.correlation_id,
            result,
        }
    }

    #[actix_rt::test]
    async fn appends_handed_over_together_go_in_one_request_split_only_by_size() {
        // A 30-byte record counts 42 bytes in a batch: two fit in 100.
        let (mut forwarding, mut sent) = forwarding(100);
        let (groups, _answers) = appends(5, 30);
        forwarding.forward(LEADER, groups);
        let mut requests = Vec::new();
        for _ in 0..3 {
            let request = sent.recv().await.unwrap();
            assert_eq!(request.to, LEADER);
            assert!(Forwarding::owns(request.correlation_id), "{request:?}");
            requests.push(groups_of(&request));
        }
        assert_eq!(requests, [vec![1, 1], vec![1, 1], vec![1]]);
        // One append larger than the bound still goes, alone.
        let (groups, _answers) = appends(1, 500);
        forwarding.forward(LEADER, groups);
        assert_eq!(groups_of(&sent.recv().await.unwrap()), [1]);
        // However small, at most MAX_APPEND_GROUPS appends a request.
        let (mut forwarding, mut sent) = self::forwarding(1 << 20);
        let (groups, _answers) = appends(MAX_APPEND_GROUPS + 1, 1);
        forwarding.forward(LEADER, groups);
        assert_eq!(groups_of(&sent.recv().await.unwrap()).len(), MAX_APPEND_GROUPS);
        assert_eq!(groups_of(&sent.recv().await.unwrap()).len(), 1);
        assert!(!Forwarding::owns(1), "the engine's ids are not forwarded ones");
    }

    #[actix_rt::test]
    async fn each_append_gets_its_own_answer_and_a_request_lost_after_sending_leaves_all_unknown() {
        let (mut forwarding, mut sent) = forwarding(1 << 20);
        let (groups, answers) = appends(3, 10);
        forwarding.forward(LEADER, groups);
        let request = sent.recv().await.unwrap();
        let committed = AppendResponse::Committed {
            base_offset: 10,
            last_offset: 10,
            epoch: 2,
        };
        let answers_sent = vec![
            committed,
            AppendResponse::Rejected { reason: "no".into() },
            AppendResponse::NotLeader { leader_id: Some(3) },
        ];
        forwarding.on_outcome(outcome(&request, Ok(RaftResponse::AppendMany(answers_sent))));
        let mut outcomes = Vec::new();
        for answer in answers {
            outcomes.push(answer.await.unwrap());
        }
        assert_eq!(
            outcomes[0],
            Ok(Appended {
                base_offset: 10,
                last_offset: 10,
                epoch: 2
            })
        );
        assert!(
            matches!(outcomes[1], Err(AppendError::Rejected(_))),
            "{:?}",
            outcomes[1]
        );
        assert!(
            matches!(outcomes[2], Err(AppendError::NotLeader { leader_id: Some(3), .. })),
            "{:?}",
            outcomes[2]
        );

        // Lost after sending, or answered with the wrong number of
        // answers: every append's outcome is unknown.
        let lost = [
            Err(TransportError::Timeout(LEADER)),
            Ok(RaftResponse::AppendMany(vec![AppendResponse::Rejected {
                reason: "one".into(),
            }])),
        ];
        for result in lost {
            let (groups, answers) = appends(2, 10);
            forwarding.forward(LEADER, groups);
            let request = sent.recv().await.unwrap();
            forwarding.on_outcome(outcome(&request, result));
            for answer in answers {
                let outcome = answer.await.unwrap();
                assert!(matches!(outcome, Err(AppendError::OutcomeUnknown(_))), "{outcome:?}");
            }
        }
        // Refused before the leader's protocol saw it: nothing written.
        let (groups, answers) = appends(2, 10);
        forwarding.forward(LEADER, groups);
        let request = sent.recv().await.unwrap();
        forwarding.on_outcome(outcome(&request, Ok(RaftResponse::Error(ErrorCode::InvalidRequest))));
        for answer in answers {
            let outcome = answer.await.unwrap();
            assert!(matches!(outcome, Err(AppendError::Rejected(_))), "{outcome:?}");
        }
        // Lost with its connection: unknown.
        let (groups, answers) = appends(1, 10);
        forwarding.forward(LEADER, groups);
        let request = sent.recv().await.unwrap();
        forwarding.on_outcome(outcome(
            &request,
            Err(TransportError::Disconnected(LEADER, "reset".into())),
        ));
        let lost = answers.into_iter().next().unwrap().await.unwrap();
        assert!(matches!(lost, Err(AppendError::OutcomeUnknown(_))), "{lost:?}");
        // Never connected: nothing was written (NotLeader).
        let (groups, answers) = appends(2, 10);
        forwarding.forward(LEADER, groups);
        let request = sent.recv().await.unwrap();
        forwarding.on_outcome(outcome(
            &request,
            Err(TransportError::Connect(LEADER, "refused".into())),
        ));
        for answer in answers {
            let outcome = answer.await.unwrap();
            assert!(matches!(outcome, Err(AppendError::NotLeader { .. })), "{outcome:?}");
        }
        // Stopping answers what still waits: outcome unknown.
        let (groups, answers) = appends(1, 10);
        forwarding.forward(LEADER, groups);
        forwarding.stop();
        for answer in answers {
            let outcome = answer.await.unwrap();
            assert!(matches!(outcome, Err(AppendError::OutcomeUnknown(_))), "{outcome:?}");
        }
    }

    #[actix_rt::test]
    async fn past_the_bound_of_appends_in_flight_the_rest_are_refused_unwritten() {
        let (mut forwarding, mut sent) = forwarding(1 << 30);
        let (groups, mut answers) = appends(MAX_FORWARDED_PENDING + 1, 1);
        forwarding.forward(LEADER, groups);
        let refused = answers.pop().unwrap().await.unwrap();
        assert!(matches!(refused, Err(AppendError::Unavailable(_))), "{refused:?}");
        let mut carried = 0;
        while carried < MAX_FORWARDED_PENDING {
            carried += groups_of(&sent.recv().await.unwrap()).len();
        }
        assert_eq!(carried, MAX_FORWARDED_PENDING);
    }
}
