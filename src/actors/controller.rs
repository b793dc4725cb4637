//! The Controller actor: on the active leader of a node in `"metadata"`
//! mode, it turns admin operations into metadata records (the rules are in
//! `crate::metadata::controller`), appends them, and answers once they are
//! committed (docs/ARCHITECTURE.md, "The controller").
//!
//! **When it acts.** It is active from the moment its node's replay of the
//! log has reached the start of an epoch this node leads (the listeners
//! announce this node's leadership only then), until another leader or
//! epoch is announced. A new active controller starts from that image, so
//! it sees every record any earlier controller committed; if the log has
//! no `metadata.version` yet, it writes one first. Requests to an inactive
//! controller are answered NOT_CONTROLLER with the leader it knows.
//!
//! **One batch at a time.** Operations queue; when no batch is in flight,
//! every queued operation is validated in turn against the controller's
//! image (each seeing the records of the ones before it) and the records of
//! those that pass are appended as one proposal (at most
//! [`MAX_RECORDS_PER_OPERATION`] records). Once it commits, the records are
//! replayed on the image at their real offsets (a registered broker's
//! epoch is its record's offset) and each operation is answered. So the
//! image the controller validates against is always exactly the committed
//! log up to its own last batch: nothing is validated against records that
//! may not be written. A batch refused before it was written (NotLeader,
//! Rejected, Unavailable) answers its operations with that, and changes
//! nothing; one whose outcome is unknown (leadership lost after the
//! hand-over) answers OUTCOME_UNKNOWN, and the controller is inactive until
//! its node leads a new epoch.
//!
//! **Sessions.** Brokers' heartbeats are soft state here (never written):
//! an unfenced broker silent for `broker.session_timeout_ms` is fenced. A
//! new active controller gives every registered broker a fresh session.

use std::collections::VecDeque;
use std::time::Duration;

use tokio::time::Instant;

use actix::prelude::*;
use rand::rngs::SmallRng;
use rand::SeedableRng;
use tokio::sync::oneshot;
use tracing::{info, warn};

use crate::actors::quorum_state::{Propose, QuorumState};
use crate::messages::actor::{ControllerInbound, LeaderChanged};
pub use crate::messages::controller::{
    decode_answer, encode_answer, encode_operation, HeartbeatAnswer, Operation, OperationAnswer, MAX_OPERATION_BYTES,
};
use crate::messages::RaftResponse;
use crate::metadata::controller::{self as ops, ControllerError, MAX_RECORDS_PER_OPERATION};
use crate::metadata::heartbeats::Sessions;
use crate::metadata::image::{MetadataDelta, MetadataImage};
use crate::metadata::records::MetadataRecord;
use crate::metadata::replay::MetadataUpdate;
use crate::types::{AppendError, Epoch, NodeId, Offset};

/// How often sessions are checked for expiry.
const SESSION_CHECK_MS: u64 = 100;

/// What a committed operation answers.
#[derive(Clone, Debug)]
pub struct Answer {
    /// The controller's image once the operation's records (if any) were
    /// committed: what the caller may read its result from.
    pub image: MetadataImage,
    /// A registration's broker epoch.
    pub broker_epoch: Option<i64>,
    /// A heartbeat's answer: (is_fenced, is_caught_up, should_shut_down).
    pub heartbeat: Option<HeartbeatAnswer>,
    /// An AlterPartition's refusal of each change, in order (None: done).
    pub refusals: Vec<Option<ControllerError>>,
}

impl Answer {
    /// The answer as it travels: the image's offset instead of the image.
    pub fn remote(self) -> OperationAnswer {
        OperationAnswer {
            offset: self.image.offset,
            broker_epoch: self.broker_epoch,
            heartbeat: self.heartbeat,
            refusals: self.refusals,
        }
    }
}

/// Runs an operation on the active controller.
#[derive(Message)]
#[rtype(result = "Result<Answer, ControllerError>")]
pub struct Operate(pub Operation);

struct Queued {
    operation: Operation,
    reply: oneshot::Sender<Result<Answer, ControllerError>>,
}

/// An operation of the batch in flight: its records' index in the batch.
struct Planned {
    first_record: usize,
    records: usize,
    refusals: Vec<Option<ControllerError>>,
    operation: Operation,
    reply: oneshot::Sender<Result<Answer, ControllerError>>,
}

pub struct Controller {
    node_id: NodeId,
    quorum: Addr<QuorumState>,
    /// The newest image the node replayed.
    latest: MetadataImage,
    /// The image the controller validates against while active: the
    /// committed log up to its own last batch.
    image: MetadataImage,
    /// The epoch this node leads, once the controller is active in it.
    active: Option<Epoch>,
    leader: Option<NodeId>,
    /// The last epoch announced.
    epoch: Epoch,
    queue: VecDeque<Queued>,
    in_flight: bool,
    sessions: Sessions,
    started: Instant,
    rng: SmallRng,
}

impl Controller {
    /// `seed` seeds its randomness (placement's start, topic ids).
    pub fn new(node_id: NodeId, quorum: Addr<QuorumState>, session_timeout_ms: u64, seed: u64) -> Controller {
        Controller {
            node_id,
            quorum,
            latest: MetadataImage::empty(),
            image: MetadataImage::empty(),
            active: None,
            leader: None,
            epoch: 0,
            queue: VecDeque::new(),
            in_flight: false,
            sessions: Sessions::new(session_timeout_ms),
            started: Instant::now(),
            rng: SmallRng::seed_from_u64(seed),
        }
    }

    fn now_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    fn not_controller(&self) -> ControllerError {
        ControllerError::NotController {
            leader_id: self.leader,
            message: match self.leader {
                Some(leader) if leader != self.node_id => format!("the active controller is node {leader}"),
                _ => "no active controller is known yet; retry".to_string(),
            },
        }
    }

    fn activate(&mut self, epoch: Epoch, ctx: &mut Context<Self>) {
        info!(
            node_id = self.node_id,
            epoch,
            offset = self.latest.offset,
            "the controller is active"
        );
        self.active = Some(epoch);
        self.image = self.latest.clone();
        let now = self.now_ms();
        self.sessions = Sessions::new(self.sessions.timeout_ms());
        for broker in self.image.brokers.values().filter(|b| !b.fenced) {
            self.sessions.touch(broker.id, now);
        }
        self.pump(ctx);
    }

    fn deactivate(&mut self) {
        if self.active.take().is_some() {
            info!(node_id = self.node_id, "the controller is inactive");
        }
        let error = self.not_controller();
        for queued in self.queue.drain(..) {
            let _ = queued.reply.send(Err(error.clone()));
        }
    }

    /// Forms and appends the next batch, if none is in flight.
    fn pump(&mut self, ctx: &mut Context<Self>) {
        let Some(epoch) = self.active else { return };
        if self.in_flight {
            return;
        }
        let mut scratch = MetadataDelta::new(&self.image);
        let mut records: Vec<MetadataRecord> = ops::bootstrap(&self.image);
        let mut planned = Vec::new();
        let mut next_offset = self.image.offset.max(0) + 1;
        for record in &records {
            let _ = scratch.replay(next_offset, epoch, record);
            next_offset += 1;
        }
        let now = self.now_ms();
        while let Some(queued) = self.queue.pop_front() {
            let planned_image = scratch.image().clone();
            let plan = self.plan(&planned_image, &queued.operation, now);
            let (op_records, refusals) = match plan {
                Ok(plan) => plan,
                Err(e) => {
                    let _ = queued.reply.send(Err(e));
                    continue;
                }
            };
            if op_records.is_empty() {
                // Nothing to write: answered from the image as it stands
                // (after the records planned before it commit, if any).
                if records.is_empty() {
                    let answer = self.answer(&queued.operation, &planned_image, None, refusals);
                    let _ = queued.reply.send(answer);
                    continue;
                }
            }
            if !records.is_empty() && records.len() + op_records.len() > MAX_RECORDS_PER_OPERATION {
                self.queue.push_front(queued);
                break;
            }
            let mut fits = true;
            for record in &op_records {
                if let Err(e) = scratch.replay(next_offset, epoch, record) {
                    // A rule of the controller let through a record replay
                    // refuses: a bug, refused here rather than written.
                    warn!("an operation's records do not replay: {e}");
                    fits = false;
                    break;
                }
                next_offset += 1;
            }
            if !fits {
                // Replay again without it: the delta may hold part of it.
                scratch = MetadataDelta::new(&self.image);
                next_offset = self.image.offset.max(0) + 1;
                for record in &records {
                    let _ = scratch.replay(next_offset, epoch, record);
                    next_offset += 1;
                }
                let _ = queued.reply.send(Err(ControllerError::InvalidRequest(
                    "the operation conflicts with the metadata; nothing was written".to_string(),
                )));
                continue;
            }
            planned.push(Planned {
                first_record: records.len(),
                records: op_records.len(),
                refusals,
                operation: queued.operation,
                reply: queued.reply,
            });
            records.extend(op_records);
        }
        if records.is_empty() {
            return;
        }
        self.in_flight = true;
        let encoded = records.iter().map(MetadataRecord::encode).collect();
        let appended = self.quorum.send(Propose { records: encoded });
        ctx.spawn(appended.into_actor(self).map(move |result, act, ctx| {
            act.in_flight = false;
            let result = match result {
                Ok(result) => result,
                Err(e) => Err(AppendError::Unavailable(format!("the node is stopped ({e})"))),
            };
            act.on_appended(epoch, records, planned, result, ctx);
            act.pump(ctx);
        }));
    }

    fn on_appended(
        &mut self,
        epoch: Epoch,
        records: Vec<MetadataRecord>,
        planned: Vec<Planned>,
        result: Result<crate::types::Appended, AppendError>,
        _ctx: &mut Context<Self>,
    ) {
        let appended = match result {
            Ok(appended) => appended,
            Err(e) => {
                let error = match e {
                    AppendError::NotLeader { leader_id, .. } => {
                        self.leader = leader_id;
                        self.not_controller()
                    }
                    AppendError::OutcomeUnknown(m) => {
                        // The batch may still commit under the next leader:
                        // this controller's image may lack it, so it acts
                        // no more in this epoch.
                        self.deactivate();
                        ControllerError::OutcomeUnknown(m)
                    }
                    AppendError::Rejected(m) | AppendError::Unsupported(m) => ControllerError::InvalidRequest(m),
                    AppendError::Unavailable(m) => ControllerError::Unavailable(m),
                };
                for p in planned {
                    let _ = p.reply.send(Err(error.clone()));
                }
                return;
            }
        };
        if self.active != Some(epoch) {
            // Committed, but this controller is no longer the one: its
            // successor's image has these records.
        } else {
            let mut delta = MetadataDelta::new(&self.image);
            for (i, record) in records.iter().enumerate() {
                if let Err(e) = delta.replay(appended.base_offset + i as Offset, appended.epoch, record) {
                    warn!("a committed batch does not replay on the controller's image: {e}");
                }
            }
            self.image = delta.apply().0;
        }
        let now = self.now_ms();
        for p in planned {
            // The offset of the operation's last record (a registration's).
            let last = (p.records > 0).then(|| appended.base_offset + (p.first_record + p.records) as Offset - 1);
            if let Operation::RegisterBroker(request) = &p.operation {
                self.sessions.touch(request.broker_id, now);
            }
            let answer = self.answer(&p.operation, &self.image, last, p.refusals);
            let _ = p.reply.send(answer);
        }
    }

    /// The records `operation` takes on `image`.
    fn plan(
        &mut self,
        image: &MetadataImage,
        operation: &Operation,
        now: u64,
    ) -> Result<(Vec<MetadataRecord>, Vec<Option<ControllerError>>), ControllerError> {
        if let Operation::AlterPartitions {
            broker_id,
            broker_epoch,
            changes,
        } = operation
        {
            return ops::alter_partitions(image, *broker_id, *broker_epoch, changes);
        }
        self.plan_records(image, operation, now)
            .map(|records| (records, Vec::new()))
    }

    fn plan_records(
        &mut self,
        image: &MetadataImage,
        operation: &Operation,
        now: u64,
    ) -> Result<Vec<MetadataRecord>, ControllerError> {
        match operation {
            Operation::RegisterBroker(request) => {
                let alive = self.sessions.alive(request.broker_id, now);
                Ok(match ops::register_broker(image, request, alive)? {
                    ops::Registration::Known(_) => Vec::new(),
                    ops::Registration::New(records) => records,
                })
            }
            Operation::BrokerHeartbeat {
                broker_id,
                broker_epoch,
                metadata_offset,
                want_fence,
                want_shutdown,
            } => {
                let broker = ops::registered(image, *broker_id, *broker_epoch)?.clone();
                self.sessions.touch(*broker_id, now);
                if broker.fenced {
                    if *want_shutdown || *want_fence || !ops::caught_up(broker.epoch, *metadata_offset) {
                        return Ok(Vec::new());
                    }
                    return Ok(ops::unfence_broker(image, *broker_id));
                }
                if *want_fence {
                    return Ok(ops::fence_broker(image, *broker_id, false));
                }
                if *want_shutdown {
                    return Ok(ops::fence_broker(image, *broker_id, true));
                }
                Ok(Vec::new())
            }
            Operation::UnregisterBroker { broker_id } => {
                let broker = image.brokers.get(broker_id).ok_or_else(|| {
                    ControllerError::BrokerIdNotRegistered(format!("broker {broker_id} is not registered"))
                })?;
                let mut records = ops::fence_broker(image, *broker_id, false);
                records.push(MetadataRecord::UnregisterBroker(
                    crate::metadata::records::UnregisterBrokerRecord {
                        broker_id: *broker_id,
                        broker_epoch: broker.epoch,
                    },
                ));
                self.sessions.forget(*broker_id);
                Ok(records)
            }
            Operation::CreateTopic(topic) => Ok(ops::create_topic(image, topic, &mut self.rng)?.1),
            Operation::DeleteTopic { name } => ops::delete_topic(image, name),
            Operation::CreatePartitions { name, count } => ops::create_partitions(image, name, *count, &mut self.rng),
            Operation::AlterConfigs {
                resource_type,
                name,
                change,
            } => ops::alter_configs(image, *resource_type, name, change),
            Operation::UpdateFeatures { levels } => ops::update_features(image, levels),
            Operation::ElectPreferred { topic, partition } => {
                Ok(ops::elect_preferred(image, topic, *partition)?.into_iter().collect())
            }
            Operation::FenceExpired {
                broker_id,
                broker_epoch,
            } => {
                // A heartbeat may have come while this waited in the queue.
                let current = image
                    .brokers
                    .get(broker_id)
                    .is_some_and(|b| b.epoch == *broker_epoch && !b.fenced);
                if !current || self.sessions.alive(*broker_id, now) {
                    return Ok(Vec::new());
                }
                info!(broker = broker_id, "fencing a broker whose session expired");
                Ok(ops::fence_broker(image, *broker_id, false))
            }
            Operation::AlterPartitions { .. } => unreachable!("planned by plan"),
        }
    }

    /// The answer to `operation` once its records (up to `last`, if any)
    /// are in `image`.
    fn answer(
        &self,
        operation: &Operation,
        image: &MetadataImage,
        last: Option<Offset>,
        refusals: Vec<Option<ControllerError>>,
    ) -> Result<Answer, ControllerError> {
        let mut answer = Answer {
            image: image.clone(),
            broker_epoch: None,
            heartbeat: None,
            refusals,
        };
        match operation {
            Operation::RegisterBroker(request) => {
                let broker = image.brokers.get(&request.broker_id);
                answer.broker_epoch = last.or(broker.map(|b| b.epoch));
            }
            Operation::BrokerHeartbeat {
                broker_id,
                metadata_offset,
                want_shutdown,
                ..
            } => {
                let Some(broker) = image.brokers.get(broker_id) else {
                    return Err(ControllerError::BrokerIdNotRegistered(format!(
                        "broker {broker_id} is not registered"
                    )));
                };
                // A broker may stop once it asked to and leads nothing: in
                // controlled shutdown, or fenced.
                let asked = broker.in_controlled_shutdown || (broker.fenced && *want_shutdown);
                answer.heartbeat = Some(HeartbeatAnswer {
                    is_fenced: broker.fenced,
                    is_caught_up: ops::caught_up(broker.epoch, *metadata_offset),
                    should_shut_down: asked && !ops::leads_any(image, *broker_id),
                });
            }
            _ => {}
        }
        Ok(answer)
    }

    /// Fences the unfenced brokers whose sessions expired.
    fn check_sessions(&mut self, ctx: &mut Context<Self>) {
        if self.active.is_none() {
            return;
        }
        let now = self.now_ms();
        for id in self.sessions.expired(now) {
            self.sessions.forget(id);
            let Some(broker) = self.image.brokers.get(&id) else {
                continue;
            };
            if broker.fenced {
                continue;
            }
            let (reply, _) = oneshot::channel();
            self.queue.push_back(Queued {
                operation: Operation::FenceExpired {
                    broker_id: id,
                    broker_epoch: broker.epoch,
                },
                reply,
            });
        }
        self.pump(ctx);
    }
}

impl Actor for Controller {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        ctx.run_interval(Duration::from_millis(SESSION_CHECK_MS), |act, ctx| {
            act.check_sessions(ctx)
        });
    }
}

impl Handler<MetadataUpdate> for Controller {
    type Result = ();

    fn handle(&mut self, msg: MetadataUpdate, _ctx: &mut Self::Context) {
        self.latest = msg.image;
    }
}

impl Handler<LeaderChanged> for Controller {
    type Result = ();

    fn handle(&mut self, msg: LeaderChanged, ctx: &mut Self::Context) {
        self.leader = msg.leader_id;
        self.epoch = msg.epoch;
        if msg.leader_id == Some(self.node_id) {
            if self.active != Some(msg.epoch) {
                self.deactivate();
                self.activate(msg.epoch, ctx);
            }
        } else {
            self.deactivate();
        }
    }
}

impl Handler<ControllerInbound> for Controller {
    type Result = ();

    fn handle(&mut self, msg: ControllerInbound, ctx: &mut Self::Context) {
        let operation = match crate::messages::codec::decode_bounded::<Operation>(&msg.bytes, MAX_OPERATION_BYTES) {
            Ok(operation) => operation,
            Err(e) => {
                warn!(from = msg.from, "a forwarded controller operation does not decode: {e}");
                let refused = Err(ControllerError::InvalidRequest(format!(
                    "the operation does not decode: {e}"
                )));
                let _ = msg.reply.send(RaftResponse::Controller(encode_answer(&refused)));
                return;
            }
        };
        let answered = <Self as Handler<Operate>>::handle(self, Operate(operation), ctx);
        let reply = msg.reply;
        ctx.spawn(
            async move {
                let answer = answered.await.map(Answer::remote);
                let _ = reply.send(RaftResponse::Controller(encode_answer(&answer)));
            }
            .into_actor(self),
        );
    }
}

impl Handler<Operate> for Controller {
    type Result = ResponseFuture<Result<Answer, ControllerError>>;

    fn handle(&mut self, msg: Operate, ctx: &mut Self::Context) -> Self::Result {
        if self.active.is_none() {
            let error = self.not_controller();
            return Box::pin(async move { Err(error) });
        }
        // A heartbeat counts when it arrives, not when its turn comes: a
        // batch in flight must not let its session expire.
        if let Operation::BrokerHeartbeat {
            broker_id,
            broker_epoch,
            ..
        } = &msg.0
        {
            if ops::registered(&self.image, *broker_id, *broker_epoch).is_ok() {
                let now = self.now_ms();
                self.sessions.touch(*broker_id, now);
            }
        }
        let (reply, answer) = oneshot::channel();
        self.queue.push_back(Queued {
            operation: msg.0,
            reply,
        });
        self.pump(ctx);
        Box::pin(async move {
            answer
                .await
                .unwrap_or_else(|_| Err(ControllerError::Unavailable("the controller stopped".to_string())))
        })
    }
}
