//! A metadata seed of the actor-level simulator: the nodes run the metadata
//! image (`node.state_machine = "metadata"`, observers as brokers that
//! register themselves) and the clients are a controller's: brokers
//! register and heartbeat, topics are created and deleted, partition
//! leaders change their ISR, each on a random node (a follower forwards
//! it to the active controller).
//!
//! Checked after every image any node publishes: every node's image at
//! the same offset is the same (a fingerprint of its records); within one
//! node incarnation a partition's leader epoch and partition epoch never go
//! back; no fenced or unregistered broker leads a partition; a broker's
//! epoch is the offset of its RegisterBroker record. At the end, after the
//! faults heal: every node has replayed everything (a record that did not
//! replay would stop it), and every topic whose creation was acknowledged
//! (and that nobody tried to delete) is in every node's image with the id
//! it was acknowledged with: nothing acknowledged is lost, nothing is
//! applied twice.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::rc::Rc;

use actix::prelude::*;
use kraft::messages::Record;
use kraft::metadata::controller::{
    supported_features, BrokerRegistrationRequest, ControllerError, IsrChange, NewTopic, TopicLayout,
};
use kraft::metadata::image::MetadataImage;
use kraft::metadata::records::{BrokerId, MetadataRecord, NO_LEADER};
use kraft::node::{MetadataUpdate, NodeHandle, Operation};
use kraft::raft::{NodeId, Offset};
use rand::rngs::SmallRng;
use rand::Rng;
use uuid::Uuid;

use super::world::Checker;

/// The brokers the workload registers itself (the observers register on
/// their own, with their node ids).
const FAKE_BROKERS: [BrokerId; 4] = [1, 2, 3, 4];

/// What the workload knows and what it was told.
#[derive(Default)]
pub struct Workload {
    /// Fake broker → (incarnation, epoch once a registration was answered).
    brokers: BTreeMap<BrokerId, (Uuid, Option<i64>)>,
    next_topic: u64,
    /// Topics whose creation was acknowledged, with the id.
    acked_topics: BTreeMap<String, Uuid>,
    /// Topics someone tried to delete (the outcome may be unknown).
    deleting: BTreeSet<String>,
    /// Every image's fingerprint by the offset it reflects.
    fingerprints: BTreeMap<Offset, (NodeId, u32)>,
    pub ops_acked: u64,
    pub ops_refused: u64,
    /// Images checked.
    pub images: u64,
}

pub type Shared = Rc<RefCell<Workload>>;

/// Subscribes to a node incarnation's images and checks each.
pub struct ImageRecorder {
    pub node: NodeId,
    pub last: Option<MetadataImage>,
    pub workload: Shared,
    pub checker: Rc<RefCell<Checker>>,
}

impl Actor for ImageRecorder {
    type Context = Context<Self>;
}

impl Handler<MetadataUpdate> for ImageRecorder {
    type Result = ();

    fn handle(&mut self, msg: MetadataUpdate, _ctx: &mut Context<Self>) {
        let image = msg.image;
        self.workload.borrow_mut().images += 1;
        let mut checker = self.checker.borrow_mut();
        if image.offset >= 0 {
            let fingerprint = image.fingerprint();
            let mut workload = self.workload.borrow_mut();
            match workload.fingerprints.get(&image.offset) {
                Some((other, seen)) if *seen != fingerprint => checker.fail(format!(
                    "node {} and node {other} hold different images at offset {}",
                    self.node, image.offset
                )),
                Some(_) => {}
                None => {
                    workload.fingerprints.insert(image.offset, (self.node, fingerprint));
                }
            }
        }
        if let Some(last) = &self.last {
            if image.offset < last.offset {
                checker.fail(format!(
                    "node {}: the image went back from offset {} to {}",
                    self.node, last.offset, image.offset
                ));
            }
            for (id, topic) in &image.topics_by_id {
                let Some(before) = last.topics_by_id.get(id) else {
                    continue;
                };
                for (partition, now) in &topic.partitions {
                    let Some(was) = before.partitions.get(&partition) else {
                        continue;
                    };
                    if now.leader_epoch < was.leader_epoch || now.partition_epoch < was.partition_epoch {
                        checker.fail(format!(
                            "node {}: {}-{partition} went back from epochs {}/{} to {}/{}",
                            self.node,
                            topic.name,
                            was.leader_epoch,
                            was.partition_epoch,
                            now.leader_epoch,
                            now.partition_epoch
                        ));
                    }
                }
            }
        }
        for topic in image.topics_by_id.values() {
            for (partition, p) in &topic.partitions {
                if p.leader == NO_LEADER {
                    continue;
                }
                if image.brokers.get(&p.leader).is_none_or(|b| b.fenced) {
                    checker.fail(format!(
                        "node {} at offset {}: {}-{partition} is led by broker {}, which is fenced or gone",
                        self.node, image.offset, topic.name, p.leader
                    ));
                }
            }
        }
        for broker in image.brokers.values() {
            // An offset no listener delivered (below a snapshot) is unknown.
            let delivered = checker
                .committed
                .get(broker.epoch as usize)
                .filter(|(epoch, _)| *epoch >= 0);
            let registered_here = delivered.map(|(_, record)| match record {
                Record::Data(bytes) => matches!(
                    MetadataRecord::decode(bytes),
                    Ok(MetadataRecord::RegisterBroker(r)) if r.broker_id == broker.id
                ),
                _ => false,
            });
            if broker.epoch > image.offset || registered_here == Some(false) {
                checker.fail(format!(
                    "node {} at offset {}: broker {} has epoch {}, which is not the offset of its registration",
                    self.node, image.offset, broker.id, broker.epoch
                ));
            }
        }
        self.last = Some(image);
    }
}

/// One controller operation on `node`, drawn with `rng`; its outcome is
/// folded into the workload when it comes.
pub fn operate(node: NodeHandle, rng: &mut SmallRng, workload: &Shared, checker: &Rc<RefCell<Checker>>) {
    let image = node.metadata_image().unwrap_or_else(MetadataImage::empty);
    let operation = {
        let mut w = workload.borrow_mut();
        match rng.gen_range(0..10) {
            0..=2 => {
                let id = FAKE_BROKERS[rng.gen_range(0..FAKE_BROKERS.len())];
                let fresh = rng.gen_bool(0.2);
                let entry = w
                    .brokers
                    .entry(id)
                    .or_insert_with(|| (Uuid::from_u128(rng.gen()), None));
                if fresh {
                    *entry = (Uuid::from_u128(rng.gen()), None);
                }
                Operation::RegisterBroker(BrokerRegistrationRequest {
                    broker_id: id,
                    incarnation_id: entry.0,
                    listeners: Vec::new(),
                    rack: Some(format!("rack-{}", id % 2)),
                    features: supported_features(),
                })
            }
            3..=5 => {
                let known: Vec<(BrokerId, i64)> = w
                    .brokers
                    .iter()
                    .filter_map(|(id, (_, epoch))| epoch.map(|e| (*id, e)))
                    .collect();
                let Some(&(id, epoch)) = known.get(rng.gen_range(0..known.len().max(1))) else {
                    return;
                };
                Operation::BrokerHeartbeat {
                    broker_id: id,
                    broker_epoch: epoch,
                    metadata_offset: image.offset,
                    want_fence: rng.gen_bool(0.05),
                    want_shutdown: false,
                }
            }
            6..=7 => {
                w.next_topic += 1;
                let partitions = rng.gen_range(1..=3);
                let replication_factor = rng.gen_range(1..=2);
                Operation::CreateTopic(NewTopic {
                    name: format!("t{}", w.next_topic),
                    layout: TopicLayout::Counts {
                        partitions,
                        replication_factor,
                    },
                    configs: BTreeMap::new(),
                })
            }
            8 => {
                let names: Vec<String> = w.acked_topics.keys().cloned().collect();
                let Some(name) = names.get(rng.gen_range(0..names.len().max(1))).cloned() else {
                    return;
                };
                w.deleting.insert(name.clone());
                Operation::DeleteTopic { name }
            }
            _ => {
                // A leader (one of the fake brokers) changes an ISR: it
                // drops a member, or takes in every unfenced replica.
                let mut candidates = Vec::new();
                for topic in image.topics_by_id.values() {
                    for (partition, p) in &topic.partitions {
                        if let Some((_, Some(epoch))) = w.brokers.get(&p.leader) {
                            candidates.push((topic.id, partition, p.clone(), p.leader, *epoch));
                        }
                    }
                }
                let Some((topic_id, partition, p, leader, epoch)) =
                    candidates.get(rng.gen_range(0..candidates.len().max(1))).cloned()
                else {
                    return;
                };
                let new_isr = if p.isr.len() > 1 && rng.gen_bool(0.5) {
                    p.isr
                        .iter()
                        .copied()
                        .filter(|r| *r == leader || rng.gen_bool(0.5))
                        .collect()
                } else {
                    p.replicas
                        .iter()
                        .copied()
                        .filter(|r| *r == leader || image.brokers.get(r).is_some_and(|b| !b.fenced))
                        .collect()
                };
                Operation::AlterPartitions {
                    broker_id: leader,
                    broker_epoch: epoch,
                    changes: vec![IsrChange {
                        topic_id,
                        partition,
                        leader_epoch: p.leader_epoch,
                        partition_epoch: p.partition_epoch,
                        new_isr,
                    }],
                }
            }
        }
    };
    let workload = workload.clone();
    let checker = checker.clone();
    actix_rt::spawn(async move {
        let result = node.operate(operation.clone()).await;
        let mut w = workload.borrow_mut();
        match result {
            Ok(answer) => {
                w.ops_acked += 1;
                match &operation {
                    Operation::RegisterBroker(request) => {
                        if let Some(entry) = w.brokers.get_mut(&request.broker_id) {
                            if entry.0 == request.incarnation_id {
                                entry.1 = answer.broker_epoch;
                            }
                        }
                    }
                    Operation::CreateTopic(topic) => match answer.image.topic(&topic.name) {
                        Some(created) => {
                            w.acked_topics.insert(topic.name.clone(), created.id);
                        }
                        None => checker
                            .borrow_mut()
                            .fail(format!("topic {} acknowledged, not in the answer's image", topic.name)),
                    },
                    _ => {}
                }
            }
            Err(ControllerError::InvalidRequest(why)) => checker
                .borrow_mut()
                .fail(format!("a valid operation was refused: {why}: {operation:?}")),
            Err(ControllerError::StaleBrokerEpoch(_) | ControllerError::BrokerIdNotRegistered(_)) => {
                // Registered again meanwhile: that epoch is gone.
                w.ops_refused += 1;
                if let Operation::BrokerHeartbeat {
                    broker_id,
                    broker_epoch,
                    ..
                } = &operation
                {
                    if let Some(entry) = w.brokers.get_mut(broker_id) {
                        if entry.1 == Some(*broker_epoch) {
                            entry.1 = None;
                        }
                    }
                }
            }
            Err(_) => w.ops_refused += 1,
        }
    });
}

/// The workload's probe that the cluster lives: a topic created through
/// the node that leads; the offset its answer's image reflects.
pub async fn probe(node: &NodeHandle, n: u64) -> Option<Offset> {
    let topic = Operation::CreateTopic(NewTopic {
        name: format!("probe-{n}"),
        layout: TopicLayout::Counts {
            partitions: 1,
            replication_factor: 1,
        },
        configs: BTreeMap::new(),
    });
    // Without an unfenced broker the probe cannot place its topic; a
    // feature update to the current level writes nothing but needs an
    // active controller, so it stands in.
    match node.operate(topic).await {
        Ok(answer) => Some(answer.image.offset),
        Err(ControllerError::InvalidReplicationFactor(_)) => {
            let levels = node.metadata_image()?.features.clone().into_iter().collect();
            node.operate(Operation::UpdateFeatures { levels })
                .await
                .ok()
                .map(|a| a.image.offset)
        }
        Err(_) => None,
    }
}

/// At the end: every acknowledged topic nobody tried to delete is in
/// `image` with its acknowledged id.
pub fn check_final(node: NodeId, image: &MetadataImage, workload: &Workload, checker: &mut Checker) {
    for (name, id) in &workload.acked_topics {
        if workload.deleting.contains(name) {
            continue;
        }
        match image.topic(name) {
            Some(topic) if topic.id == *id => {}
            Some(topic) => checker.fail(format!(
                "node {node}: topic {name} has id {}, acknowledged as {id}",
                topic.id
            )),
            None => checker.fail(format!("node {node}: acknowledged topic {name} is missing")),
        }
    }
}
