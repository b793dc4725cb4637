//! The in-memory network: stands in for the TCP transport (the raft
//! listener and the RequestManager) behind the same typed messages. Every
//! request a node sends gets exactly one [`RequestOutcome`], as from the
//! RequestManager: the response, or a transport error after the request
//! timeout. Delays, loss, duplication and cut links are drawn from the
//! seeded RNG; reordering follows from the random delays.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::rc::Rc;
use std::time::Duration;

use actix::prelude::*;
use kraft::messages::actor::{InboundRequest, RequestOutcome, SendRequest, TransportError};
use kraft::messages::{RaftRequest, RaftResponse};
use kraft::raft::NodeId;
use rand::rngs::SmallRng;
use rand::Rng;
use tokio::time::Instant;

use super::disk::Disk;

#[derive(Clone, Copy, Debug)]
pub struct Faults {
    /// Chance that a request, or its response, is lost.
    pub loss: f64,
    /// Chance that a request is delivered twice.
    pub duplicate: f64,
    /// One-way delay, drawn uniformly from this range (ms).
    pub delay_ms: (u64, u64),
}

impl Faults {
    pub const NONE: Faults = Faults {
        loss: 0.0,
        duplicate: 0.0,
        delay_ms: (0, 1),
    };
}

struct Endpoint {
    incarnation: u64,
    inbound: Recipient<InboundRequest>,
}

struct NetState {
    rng: SmallRng,
    faults: Faults,
    request_timeout: Duration,
    endpoints: BTreeMap<NodeId, Endpoint>,
    /// Directed links that drop everything.
    cut: BTreeSet<(NodeId, NodeId)>,
    /// Every node's disk, to check that what a node says was durable
    /// when it said it.
    disks: BTreeMap<NodeId, Disk>,
    /// Acknowledgements seen before what they vouch for was durable.
    violations: Vec<String>,
    pub sent: u64,
    pub lost: u64,
}

#[derive(Clone)]
pub struct Net(Rc<RefCell<NetState>>);

/// What the network decided for one request when it was sent.
struct Plan {
    there: Duration,
    back: Duration,
    lost_there: bool,
    lost_back: bool,
    duplicate: bool,
}

impl Net {
    pub fn new(rng: SmallRng, request_timeout: Duration) -> Self {
        Net(Rc::new(RefCell::new(NetState {
            rng,
            faults: Faults::NONE,
            request_timeout,
            endpoints: BTreeMap::new(),
            cut: BTreeSet::new(),
            disks: BTreeMap::new(),
            violations: Vec::new(),
            sent: 0,
            lost: 0,
        })))
    }

    pub fn set_faults(&self, faults: Faults) {
        self.0.borrow_mut().faults = faults;
    }

    /// Makes `incarnation` of node `id` reachable (a restart).
    pub fn attach(&self, id: NodeId, incarnation: u64, inbound: Recipient<InboundRequest>) {
        self.0
            .borrow_mut()
            .endpoints
            .insert(id, Endpoint { incarnation, inbound });
    }

    /// Node `id` keeps its log and election state on `disk`.
    pub fn watch_disk(&self, id: NodeId, disk: Disk) {
        self.0.borrow_mut().disks.insert(id, disk);
    }

    /// What was acknowledged before it was durable, since the last call.
    pub fn take_violations(&self) -> Vec<String> {
        std::mem::take(&mut self.0.borrow_mut().violations)
    }

    /// A Fetch at offset X tells the leader that its sender holds the log
    /// below X: that must survive a crash of the sender when it is sent.
    fn check_request(&self, from: NodeId, request: &RaftRequest) {
        let RaftRequest::Fetch(fetch) = request else { return };
        let mut state = self.0.borrow_mut();
        let Some(durable) = state.disks.get(&from).map(Disk::durable_end) else {
            return;
        };
        if fetch.fetch_offset > durable {
            let what = format!(
                "node {from} fetched from offset {} while its log was durable only below {durable}",
                fetch.fetch_offset
            );
            state.violations.push(what);
        }
    }

    /// A vote granted must be durable when the answer leaves its voter.
    fn check_response(&self, voter: NodeId, request: &RaftRequest, response: &RaftResponse) {
        let (RaftRequest::Vote(vote), RaftResponse::Vote(answer)) = (request, response) else {
            return;
        };
        if !answer.vote_granted || answer.pre_vote {
            return;
        }
        let mut state = self.0.borrow_mut();
        let Some(durable) = state.disks.get(&voter).map(Disk::durable_election) else {
            return;
        };
        if durable.epoch != answer.epoch || durable.voted_for != Some(vote.candidate_id) {
            let what = format!(
                "node {voter} granted its vote to {} in epoch {} while its durable election state was {durable:?}",
                vote.candidate_id, answer.epoch
            );
            state.violations.push(what);
        }
    }

    /// Node `id` is down: nothing reaches it, nothing it sent arrives.
    pub fn detach(&self, id: NodeId) {
        self.0.borrow_mut().endpoints.remove(&id);
    }

    pub fn cut(&self, from: NodeId, to: NodeId) {
        self.0.borrow_mut().cut.insert((from, to));
    }

    pub fn heal(&self) {
        self.0.borrow_mut().cut.clear();
    }

    pub fn counts(&self) -> (u64, u64) {
        let state = self.0.borrow();
        (state.sent, state.lost)
    }

    /// The `connect` of a [`kraft::node::CustomNode`]: senders for
    /// `incarnation` of node `from`.
    pub fn connector(
        &self,
        from: NodeId,
        incarnation: u64,
    ) -> impl Fn(Recipient<RequestOutcome>) -> Recipient<SendRequest> {
        let net = self.clone();
        move |outcomes| {
            Link {
                net: net.clone(),
                from,
                incarnation,
                outcomes,
            }
            .start()
            .recipient()
        }
    }

    fn is_up(&self, id: NodeId, incarnation: u64) -> bool {
        self.0
            .borrow()
            .endpoints
            .get(&id)
            .is_some_and(|e| e.incarnation == incarnation)
    }

    /// The way into `to` if the link from `from` carries traffic now.
    fn route(&self, from: NodeId, to: NodeId) -> Option<Recipient<InboundRequest>> {
        let state = self.0.borrow();
        if state.cut.contains(&(from, to)) || !state.endpoints.contains_key(&from) {
            return None;
        }
        state.endpoints.get(&to).map(|e| e.inbound.clone())
    }

    fn plan(&self) -> (Plan, Duration) {
        let mut state = self.0.borrow_mut();
        let faults = state.faults;
        let (lo, hi) = faults.delay_ms;
        let rng = &mut state.rng;
        let plan = Plan {
            there: Duration::from_millis(rng.gen_range(lo..hi.max(lo + 1))),
            back: Duration::from_millis(rng.gen_range(lo..hi.max(lo + 1))),
            lost_there: rng.gen_bool(faults.loss),
            lost_back: rng.gen_bool(faults.loss),
            duplicate: rng.gen_bool(faults.duplicate),
        };
        state.sent += 1;
        if plan.lost_there || plan.lost_back {
            state.lost += 1;
        }
        (plan, state.request_timeout)
    }
}

/// One node incarnation's sender (what the RequestManager is in
/// production).
struct Link {
    net: Net,
    from: NodeId,
    incarnation: u64,
    outcomes: Recipient<RequestOutcome>,
}

impl Actor for Link {
    type Context = Context<Self>;
}

impl Handler<SendRequest> for Link {
    type Result = ();

    fn handle(&mut self, msg: SendRequest, _ctx: &mut Context<Self>) {
        if !self.net.is_up(self.from, self.incarnation) {
            return; // a crashed incarnation sends nothing
        }
        self.net.check_request(self.from, &msg.request);
        let (plan, timeout) = self.net.plan();
        let net = self.net.clone();
        let from = self.from;
        let outcomes = self.outcomes.clone();
        actix_rt::spawn(async move {
            let deadline = Instant::now() + timeout;
            let result = exchange(&net, from, &msg, plan, deadline).await;
            if let Err(TransportError::Timeout(_)) = result {
                tokio::time::sleep_until(deadline).await;
            }
            outcomes.do_send(RequestOutcome {
                from: msg.to,
                correlation_id: msg.correlation_id,
                result,
            });
        });
    }
}

async fn exchange(
    net: &Net,
    from: NodeId,
    msg: &SendRequest,
    plan: Plan,
    deadline: Instant,
) -> Result<kraft::messages::RaftResponse, TransportError> {
    let to = msg.to;
    tokio::time::sleep(plan.there).await;
    if plan.lost_there {
        return Err(TransportError::Timeout(to));
    }
    let Some(inbound) = net.route(from, to) else {
        return Err(TransportError::Connect(to, "unreachable".to_string()));
    };
    if plan.duplicate {
        let (reply, _ignored) = tokio::sync::oneshot::channel();
        inbound.do_send(InboundRequest {
            from,
            request: msg.request.clone(),
            reply,
        });
    }
    let (reply, response) = tokio::sync::oneshot::channel();
    inbound.do_send(InboundRequest {
        from,
        request: msg.request.clone(),
        reply,
    });
    let response = match tokio::time::timeout_at(deadline, response).await {
        Ok(Ok(response)) => response,
        Ok(Err(_)) => return Err(TransportError::Disconnected(to, "no answer".to_string())),
        Err(_) => return Err(TransportError::Timeout(to)),
    };
    net.check_response(to, &msg.request, &response);
    tokio::time::sleep(plan.back).await;
    if plan.lost_back || net.route(to, from).is_none() || Instant::now() > deadline {
        return Err(TransportError::Timeout(to));
    }
    Ok(response)
}
