//! The image of the cluster (Kafka's `image` package): what the committed
//! metadata records say, as of one offset. A [`MetadataImage`] never
//! changes; a [`MetadataDelta`] replays records on top of one and yields the
//! next. The maps are persistent (`imbl`), so the next image shares every
//! broker, topic and config the records did not touch: publishing an image
//! after each commit costs the delta, not the cluster, and an image can be
//! written to a snapshot on another thread while replay goes on.

use std::collections::BTreeSet;
use std::sync::Arc;

use imbl::OrdMap;
use uuid::Uuid;

use super::records::*;
use crate::types::{Epoch, Offset};

/// A registered broker, as the image holds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BrokerRegistration {
    pub id: BrokerId,
    /// The offset of its RegisterBroker record.
    pub epoch: i64,
    pub incarnation_id: Uuid,
    pub listeners: Vec<BrokerEndpoint>,
    pub features: Vec<BrokerFeature>,
    pub rack: Option<String>,
    pub fenced: bool,
    pub in_controlled_shutdown: bool,
}

/// One partition's replicas and leadership.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PartitionRegistration {
    pub replicas: Vec<BrokerId>,
    pub isr: Vec<BrokerId>,
    pub removing_replicas: Vec<BrokerId>,
    pub adding_replicas: Vec<BrokerId>,
    /// The leader, or [`NO_LEADER`].
    pub leader: BrokerId,
    /// Grows by one with every leader change.
    pub leader_epoch: i32,
    /// Grows by one with every change.
    pub partition_epoch: i32,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TopicImage {
    pub name: String,
    pub id: Uuid,
    pub partitions: Partitions,
}

/// A topic's partitions by id, which are dense from 0 (Kafka's). Shared by
/// every image until one of them changes; then the topic's list is copied.
/// A persistent map would share more of it, but its nodes hold 64 slots
/// each: with topics of a few partitions that was about 770 bytes of
/// memory per partition, where a list takes its partitions' size.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Partitions(Arc<Vec<PartitionRegistration>>);

impl Partitions {
    pub fn get(&self, id: &i32) -> Option<&PartitionRegistration> {
        usize::try_from(*id).ok().and_then(|i| self.0.get(i))
    }

    pub fn contains_key(&self, id: &i32) -> bool {
        self.get(id).is_some()
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// (id, partition), by id.
    pub fn iter(&self) -> impl Iterator<Item = (i32, &PartitionRegistration)> {
        self.0.iter().enumerate().map(|(i, p)| (i as i32, p))
    }

    pub fn keys(&self) -> impl Iterator<Item = i32> + '_ {
        0..self.0.len() as i32
    }

    pub fn values(&self) -> impl Iterator<Item = &PartitionRegistration> {
        self.0.iter()
    }

    /// Adds partition `id`, which must be the next one.
    fn push(&mut self, id: i32, partition: PartitionRegistration) -> Result<(), String> {
        if usize::try_from(id).ok() != Some(self.0.len()) {
            return Err(format!(
                "partition {id} is not the next one (there are {})",
                self.0.len()
            ));
        }
        Arc::make_mut(&mut self.0).push(partition);
        Ok(())
    }

    fn get_mut(&mut self, id: &i32) -> Option<&mut PartitionRegistration> {
        let i = usize::try_from(*id).ok().filter(|i| *i < self.0.len())?;
        Arc::make_mut(&mut self.0).get_mut(i)
    }
}

impl<'a> IntoIterator for &'a Partitions {
    type Item = (i32, &'a PartitionRegistration);
    type IntoIter = Box<dyn Iterator<Item = (i32, &'a PartitionRegistration)> + 'a>;

    fn into_iter(self) -> Self::IntoIter {
        Box::new(self.iter())
    }
}

impl std::ops::Index<&i32> for Partitions {
    type Output = PartitionRegistration;

    fn index(&self, id: &i32) -> &PartitionRegistration {
        self.get(id).expect("no such partition")
    }
}

/// A resource that has configs: a topic, a broker, or the cluster default
/// (a broker resource with an empty name).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ConfigResource {
    /// [`CONFIG_RESOURCE_TOPIC`] or [`CONFIG_RESOURCE_BROKER`].
    pub resource_type: i8,
    pub name: String,
}

/// The cluster as the committed records up to `offset` describe it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MetadataImage {
    /// The offset of the last record replayed (-1 for none).
    pub offset: Offset,
    /// The leader epoch of that record.
    pub epoch: Epoch,
    /// Finalized feature levels by name.
    pub features: OrdMap<String, i16>,
    pub brokers: OrdMap<BrokerId, BrokerRegistration>,
    pub topics_by_id: OrdMap<Uuid, TopicImage>,
    pub topic_ids_by_name: OrdMap<String, Uuid>,
    pub configs: OrdMap<ConfigResource, OrdMap<String, String>>,
}

/// Records that do not fit the image they are replayed on: the log is not
/// one this node can follow, and replay stops on it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("cannot replay the {record} record at offset {offset}: {reason}")]
pub struct ReplayError {
    pub offset: Offset,
    pub record: &'static str,
    pub reason: String,
}

/// What a delta changed, for the listeners of the next image.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Changes {
    pub features: BTreeSet<String>,
    pub brokers: BTreeSet<BrokerId>,
    /// Topics created or changed (by id).
    pub topics: BTreeSet<Uuid>,
    /// Topics removed, with their names.
    pub removed_topics: BTreeSet<(Uuid, String)>,
    pub configs: BTreeSet<ConfigResource>,
}

impl MetadataImage {
    /// The image before any record.
    pub fn empty() -> MetadataImage {
        MetadataImage {
            offset: -1,
            epoch: 0,
            features: OrdMap::new(),
            brokers: OrdMap::new(),
            topics_by_id: OrdMap::new(),
            topic_ids_by_name: OrdMap::new(),
            configs: OrdMap::new(),
        }
    }

    pub fn topic(&self, name: &str) -> Option<&TopicImage> {
        self.topic_ids_by_name
            .get(name)
            .and_then(|id| self.topics_by_id.get(id))
    }

    /// The image as records that rebuild it on an empty one, in the order
    /// of Kafka's snapshots: features, brokers, topics each followed by its
    /// partitions, configs. What a snapshot of the image holds.
    pub fn records(&self) -> Vec<MetadataRecord> {
        let mut records = Vec::new();
        for (name, level) in &self.features {
            records.push(MetadataRecord::FeatureLevel(FeatureLevelRecord {
                name: name.clone(),
                feature_level: *level,
            }));
        }
        for broker in self.brokers.values() {
            records.push(MetadataRecord::RegisterBroker(RegisterBrokerRecord {
                broker_id: broker.id,
                incarnation_id: broker.incarnation_id,
                broker_epoch: broker.epoch,
                endpoints: broker.listeners.clone(),
                features: broker.features.clone(),
                rack: broker.rack.clone(),
                fenced: broker.fenced,
                in_controlled_shutdown: broker.in_controlled_shutdown,
            }));
        }
        for topic in self.topics_by_id.values() {
            records.push(MetadataRecord::Topic(TopicRecord {
                name: topic.name.clone(),
                topic_id: topic.id,
            }));
            for (id, p) in &topic.partitions {
                records.push(MetadataRecord::Partition(PartitionRecord {
                    partition_id: id,
                    topic_id: topic.id,
                    replicas: p.replicas.clone(),
                    isr: p.isr.clone(),
                    removing_replicas: p.removing_replicas.clone(),
                    adding_replicas: p.adding_replicas.clone(),
                    leader: p.leader,
                    leader_epoch: p.leader_epoch,
                    partition_epoch: p.partition_epoch,
                }));
            }
        }
        for (resource, keys) in &self.configs {
            for (name, value) in keys {
                records.push(MetadataRecord::Config(ConfigRecord {
                    resource_type: resource.resource_type,
                    resource_name: resource.name.clone(),
                    name: name.clone(),
                    value: Some(value.clone()),
                }));
            }
        }
        records
    }

    /// The image a snapshot's `records` rebuild (in the order
    /// [`MetadataImage::records`] writes them), reflecting every offset
    /// below `end_offset`, the last of them in `epoch`.
    pub fn from_records(
        end_offset: Offset,
        epoch: Epoch,
        records: impl IntoIterator<Item = MetadataRecord>,
    ) -> Result<MetadataImage, ReplayError> {
        let mut delta = MetadataDelta::new(&MetadataImage::empty());
        // The records stand for the state, not for log offsets: they are
        // replayed in order, and the image then reflects the snapshot's end.
        for (i, record) in records.into_iter().enumerate() {
            delta.replay(i as Offset, epoch, &record)?;
        }
        let (mut image, _) = delta.apply();
        image.offset = end_offset - 1;
        image.epoch = epoch;
        Ok(image)
    }

    /// A checksum of the image's content (CRC32C of its records), the
    /// same on every node whose image holds the same cluster.
    pub fn fingerprint(&self) -> u32 {
        self.records()
            .iter()
            .fold(0, |crc, record| crc32c::crc32c_append(crc, &record.encode()))
    }
}

/// Records replayed on top of an image.
pub struct MetadataDelta {
    /// The next image as replayed so far (shares what is unchanged).
    next: MetadataImage,
    changes: Changes,
}

impl MetadataDelta {
    pub fn new(base: &MetadataImage) -> MetadataDelta {
        MetadataDelta {
            next: base.clone(),
            changes: Changes::default(),
        }
    }

    /// The image as replayed so far.
    pub fn image(&self) -> &MetadataImage {
        &self.next
    }

    /// Replays the bytes of one committed data record.
    pub fn replay_bytes(&mut self, offset: Offset, epoch: Epoch, bytes: &[u8]) -> Result<(), ReplayError> {
        let record = MetadataRecord::decode(bytes).map_err(|e| ReplayError {
            offset,
            record: "metadata",
            reason: e.to_string(),
        })?;
        self.replay(offset, epoch, &record)
    }

    /// Replays one committed record at `offset`. A record that does not
    /// fit the image changes nothing and is an error.
    pub fn replay(&mut self, offset: Offset, epoch: Epoch, record: &MetadataRecord) -> Result<(), ReplayError> {
        let fail = |reason: String| ReplayError {
            offset,
            record: record.name(),
            reason,
        };
        if offset <= self.next.offset {
            return Err(fail(format!("the image already reflects offset {}", self.next.offset)));
        }
        let image = &mut self.next;
        match record {
            MetadataRecord::FeatureLevel(r) => {
                if r.feature_level == 0 {
                    image.features.remove(&r.name);
                } else {
                    image.features.insert(r.name.clone(), r.feature_level);
                }
                self.changes.features.insert(r.name.clone());
            }
            MetadataRecord::RegisterBroker(r) => {
                image.brokers.insert(
                    r.broker_id,
                    BrokerRegistration {
                        id: r.broker_id,
                        // A controller writes the record before it knows
                        // its offset, which is the broker's epoch.
                        epoch: if r.broker_epoch < 0 { offset } else { r.broker_epoch },
                        incarnation_id: r.incarnation_id,
                        listeners: r.endpoints.clone(),
                        features: r.features.clone(),
                        rack: r.rack.clone(),
                        fenced: r.fenced,
                        in_controlled_shutdown: r.in_controlled_shutdown,
                    },
                );
                self.changes.brokers.insert(r.broker_id);
            }
            MetadataRecord::UnregisterBroker(r) => {
                broker_at(image, r.broker_id, r.broker_epoch).map_err(fail)?;
                image.brokers.remove(&r.broker_id);
                self.changes.brokers.insert(r.broker_id);
            }
            MetadataRecord::FenceBroker(r) => {
                set_broker(image, r.id, r.epoch, |b| b.fenced = true).map_err(fail)?;
                self.changes.brokers.insert(r.id);
            }
            MetadataRecord::UnfenceBroker(r) => {
                set_broker(image, r.id, r.epoch, |b| b.fenced = false).map_err(fail)?;
                self.changes.brokers.insert(r.id);
            }
            MetadataRecord::BrokerRegistrationChange(r) => {
                set_broker(image, r.broker_id, r.broker_epoch, |b| {
                    if let Some(fenced) = r.fenced {
                        b.fenced = fenced;
                    }
                    if let Some(shutting_down) = r.in_controlled_shutdown {
                        b.in_controlled_shutdown = shutting_down;
                    }
                })
                .map_err(fail)?;
                self.changes.brokers.insert(r.broker_id);
            }
            MetadataRecord::Topic(r) => {
                if image.topic_ids_by_name.contains_key(&r.name) {
                    return Err(fail(format!("a topic named {:?} exists", r.name)));
                }
                if image.topics_by_id.contains_key(&r.topic_id) {
                    return Err(fail(format!("a topic with id {} exists", r.topic_id)));
                }
                image.topic_ids_by_name.insert(r.name.clone(), r.topic_id);
                image.topics_by_id.insert(
                    r.topic_id,
                    TopicImage {
                        name: r.name.clone(),
                        id: r.topic_id,
                        partitions: Partitions::default(),
                    },
                );
                self.changes.topics.insert(r.topic_id);
            }
            MetadataRecord::Partition(r) => {
                let topic = topic_mut(image, r.topic_id).map_err(fail)?;
                if topic.partitions.contains_key(&r.partition_id) {
                    return Err(fail(format!("partition {} of {} exists", r.partition_id, topic.name)));
                }
                let name = topic.name.clone();
                topic
                    .partitions
                    .push(
                        r.partition_id,
                        PartitionRegistration {
                            replicas: r.replicas.clone(),
                            isr: r.isr.clone(),
                            removing_replicas: r.removing_replicas.clone(),
                            adding_replicas: r.adding_replicas.clone(),
                            leader: r.leader,
                            leader_epoch: r.leader_epoch,
                            partition_epoch: r.partition_epoch,
                        },
                    )
                    .map_err(|e| fail(format!("{name}: {e}")))?;
                self.changes.topics.insert(r.topic_id);
            }
            MetadataRecord::PartitionChange(r) => {
                let topic = topic_mut(image, r.topic_id).map_err(fail)?;
                let name = topic.name.clone();
                let partition = topic
                    .partitions
                    .get_mut(&r.partition_id)
                    .ok_or_else(|| fail(format!("{name} has no partition {}", r.partition_id)))?;
                merge(partition, r);
                self.changes.topics.insert(r.topic_id);
            }
            MetadataRecord::RemoveTopic(r) => {
                let Some(topic) = image.topics_by_id.remove(&r.topic_id) else {
                    return Err(fail(format!("no topic has id {}", r.topic_id)));
                };
                image.topic_ids_by_name.remove(&topic.name);
                // A topic's configs go with it.
                let resource = ConfigResource {
                    resource_type: CONFIG_RESOURCE_TOPIC,
                    name: topic.name.clone(),
                };
                if image.configs.remove(&resource).is_some() {
                    self.changes.configs.insert(resource);
                }
                self.changes.topics.remove(&r.topic_id);
                self.changes.removed_topics.insert((r.topic_id, topic.name));
            }
            MetadataRecord::Config(r) => {
                let resource = ConfigResource {
                    resource_type: r.resource_type,
                    name: r.resource_name.clone(),
                };
                let mut keys = image.configs.get(&resource).cloned().unwrap_or_default();
                match &r.value {
                    Some(value) => {
                        keys.insert(r.name.clone(), value.clone());
                    }
                    None => {
                        keys.remove(&r.name);
                    }
                }
                if keys.is_empty() {
                    image.configs.remove(&resource);
                } else {
                    image.configs.insert(resource.clone(), keys);
                }
                self.changes.configs.insert(resource);
            }
            MetadataRecord::NoOp(_) => {}
        }
        image.offset = offset;
        image.epoch = epoch;
        Ok(())
    }

    /// A committed record that is not a metadata record (a control record:
    /// LeaderChange, the raft layer's NoOp) at `offset`: the image changes
    /// nothing but reflects that offset from now on.
    pub fn advance(&mut self, offset: Offset, epoch: Epoch) {
        if offset > self.next.offset {
            self.next.offset = offset;
            self.next.epoch = epoch;
        }
    }

    /// The next image, and what changed on the way to it.
    pub fn apply(self) -> (MetadataImage, Changes) {
        (self.next, self.changes)
    }
}

/// The registration of broker `id` at `epoch`.
fn broker_at(image: &MetadataImage, id: BrokerId, epoch: i64) -> Result<&BrokerRegistration, String> {
    match image.brokers.get(&id) {
        None => Err(format!("broker {id} is not registered")),
        Some(b) if b.epoch != epoch => Err(format!("broker {id} has epoch {}, not {epoch}", b.epoch)),
        Some(b) => Ok(b),
    }
}

fn set_broker(
    image: &mut MetadataImage,
    id: BrokerId,
    epoch: i64,
    change: impl FnOnce(&mut BrokerRegistration),
) -> Result<(), String> {
    broker_at(image, id, epoch)?;
    change(image.brokers.get_mut(&id).expect("checked above"));
    Ok(())
}

fn topic_mut(image: &mut MetadataImage, id: Uuid) -> Result<&mut TopicImage, String> {
    image
        .topics_by_id
        .get_mut(&id)
        .ok_or_else(|| format!("no topic has id {id}"))
}

/// A PartitionChange on a partition: what it names changes; a leader named
/// (even the same one) starts a new leader epoch; every change starts a
/// new partition epoch.
fn merge(partition: &mut PartitionRegistration, change: &PartitionChangeRecord) {
    if let Some(isr) = &change.isr {
        partition.isr = isr.clone();
    }
    if let Some(replicas) = &change.replicas {
        partition.replicas = replicas.clone();
    }
    if let Some(removing) = &change.removing_replicas {
        partition.removing_replicas = removing.clone();
    }
    if let Some(adding) = &change.adding_replicas {
        partition.adding_replicas = adding.clone();
    }
    if let Some(leader) = change.leader {
        partition.leader = leader;
        partition.leader_epoch += 1;
    }
    partition.partition_epoch += 1;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn uuid(n: u8) -> Uuid {
        Uuid::from_bytes([n; 16])
    }

    fn register(id: BrokerId, epoch: i64) -> MetadataRecord {
        MetadataRecord::RegisterBroker(RegisterBrokerRecord {
            broker_id: id,
            incarnation_id: uuid(id as u8),
            broker_epoch: epoch,
            endpoints: vec![BrokerEndpoint {
                name: "PLAINTEXT".into(),
                host: "127.0.0.1".into(),
                port: 9092 + id as u16,
                security_protocol: 0,
            }],
            features: vec![],
            rack: None,
            fenced: true,
            in_controlled_shutdown: false,
        })
    }

    fn topic(name: &str, id: u8) -> MetadataRecord {
        MetadataRecord::Topic(TopicRecord {
            name: name.into(),
            topic_id: uuid(id),
        })
    }

    fn partition(topic: u8, id: i32, replicas: &[BrokerId]) -> MetadataRecord {
        MetadataRecord::Partition(PartitionRecord {
            partition_id: id,
            topic_id: uuid(topic),
            replicas: replicas.to_vec(),
            isr: replicas.to_vec(),
            removing_replicas: vec![],
            adding_replicas: vec![],
            leader: replicas[0],
            leader_epoch: 0,
            partition_epoch: 0,
        })
    }

    fn config(resource_type: i8, name: &str, key: &str, value: Option<&str>) -> MetadataRecord {
        MetadataRecord::Config(ConfigRecord {
            resource_type,
            resource_name: name.into(),
            name: key.into(),
            value: value.map(str::to_string),
        })
    }

    /// Replays `records` at offsets from `from` on `image`.
    fn replay(image: &MetadataImage, from: Offset, records: &[MetadataRecord]) -> (MetadataImage, Changes) {
        let mut delta = MetadataDelta::new(image);
        for (i, record) in records.iter().enumerate() {
            delta.replay(from + i as Offset, 1, record).unwrap();
        }
        delta.apply()
    }

    /// A cluster of three brokers, two topics and some configs.
    fn cluster() -> MetadataImage {
        let records = [
            MetadataRecord::FeatureLevel(FeatureLevelRecord {
                name: "metadata.version".into(),
                feature_level: 1,
            }),
            register(1, 1),
            register(2, 2),
            register(3, 3),
            topic("orders", 10),
            partition(10, 0, &[1, 2, 3]),
            partition(10, 1, &[2, 3, 1]),
            topic("users", 11),
            partition(11, 0, &[3, 1, 2]),
            config(CONFIG_RESOURCE_TOPIC, "orders", "retention.ms", Some("1000")),
            config(CONFIG_RESOURCE_BROKER, "", "min.insync.replicas", Some("2")),
        ];
        replay(&MetadataImage::empty(), 0, &records).0
    }

    #[test]
    fn records_build_the_image_and_say_what_changed() {
        let image = cluster();
        assert_eq!((image.offset, image.epoch), (10, 1));
        assert_eq!(image.features.get("metadata.version"), Some(&1));
        assert_eq!(image.brokers.len(), 3);
        assert!(image.brokers[&2].fenced, "registered fenced");
        let orders = image.topic("orders").unwrap();
        assert_eq!(orders.id, uuid(10));
        assert_eq!(orders.partitions[&1].leader, 2);
        let (next, changes) = replay(
            &image,
            11,
            &[
                MetadataRecord::BrokerRegistrationChange(BrokerRegistrationChangeRecord {
                    broker_id: 2,
                    broker_epoch: 2,
                    fenced: Some(false),
                    in_controlled_shutdown: None,
                }),
                config(CONFIG_RESOURCE_TOPIC, "orders", "retention.ms", None),
                MetadataRecord::NoOp(NoOpRecord {}),
            ],
        );
        assert!(!next.brokers[&2].fenced);
        assert_eq!(next.offset, 13);
        assert!(!next.configs.contains_key(&ConfigResource {
            resource_type: CONFIG_RESOURCE_TOPIC,
            name: "orders".into()
        }));
        assert_eq!(changes.brokers, BTreeSet::from([2]));
        assert_eq!(changes.configs.len(), 1);
        assert!(changes.topics.is_empty());
        // The image it came from is as it was.
        assert!(image.brokers[&2].fenced);
        assert_eq!(image, cluster());
    }

    #[test]
    fn a_partition_change_moves_only_what_it_names_and_the_epochs_grow() {
        let image = cluster();
        let change = |isr: Option<Vec<BrokerId>>, leader: Option<BrokerId>| {
            MetadataRecord::PartitionChange(PartitionChangeRecord {
                partition_id: 0,
                topic_id: uuid(10),
                isr,
                leader,
                replicas: None,
                removing_replicas: None,
                adding_replicas: None,
            })
        };
        let (next, changes) = replay(&image, 11, &[change(Some(vec![1, 2]), None)]);
        let p = &next.topic("orders").unwrap().partitions[&0];
        assert_eq!(
            (p.isr.clone(), p.leader, p.leader_epoch, p.partition_epoch),
            (vec![1, 2], 1, 0, 1)
        );
        assert_eq!(p.replicas, [1, 2, 3], "replicas unchanged");
        assert_eq!(changes.topics, BTreeSet::from([uuid(10)]));
        let (next, _) = replay(&next, 12, &[change(None, Some(2)), change(None, Some(NO_LEADER))]);
        let p = &next.topic("orders").unwrap().partitions[&0];
        assert_eq!((p.leader, p.leader_epoch, p.partition_epoch), (NO_LEADER, 2, 3));
    }

    #[test]
    fn removing_a_topic_removes_its_partitions_name_and_configs() {
        let image = cluster();
        let (next, changes) = replay(
            &image,
            11,
            &[MetadataRecord::RemoveTopic(RemoveTopicRecord { topic_id: uuid(10) })],
        );
        assert!(next.topic("orders").is_none());
        assert!(!next.topics_by_id.contains_key(&uuid(10)));
        assert_eq!(next.configs.len(), 1, "only the cluster default is left");
        assert_eq!(
            changes.removed_topics,
            BTreeSet::from([(uuid(10), "orders".to_string())])
        );
        // The name is free again, under a new id.
        let (again, _) = replay(&next, 12, &[topic("orders", 12)]);
        assert_eq!(again.topic("orders").unwrap().id, uuid(12));
    }

    #[test]
    fn records_that_do_not_fit_the_image_are_errors_and_change_nothing() {
        let image = cluster();
        let cases = [
            (topic("orders", 99), "a topic named \"orders\" exists"),
            (topic("other", 10), "exists"),
            (partition(99, 0, &[1]), "no topic has id"),
            (partition(10, 0, &[1]), "partition 0 of orders exists"),
            (
                MetadataRecord::FenceBroker(FenceBrokerRecord { id: 9, epoch: 1 }),
                "broker 9 is not registered",
            ),
            (
                MetadataRecord::UnfenceBroker(UnfenceBrokerRecord { id: 1, epoch: 7 }),
                "broker 1 has epoch 1, not 7",
            ),
            (
                MetadataRecord::RemoveTopic(RemoveTopicRecord { topic_id: uuid(99) }),
                "no topic has id",
            ),
        ];
        for (record, expected) in cases {
            let mut delta = MetadataDelta::new(&image);
            let error = delta.replay(11, 1, &record).unwrap_err();
            assert_eq!((error.offset, error.record), (11, record.name()));
            assert!(error.to_string().contains(expected), "{error} lacks {expected:?}");
            assert_eq!(delta.image(), &image, "{record:?} changed the image");
        }
        let mut delta = MetadataDelta::new(&image);
        let stale = delta.replay(10, 1, &MetadataRecord::NoOp(NoOpRecord {})).unwrap_err();
        assert!(stale.to_string().contains("already reflects offset 10"), "{stale}");
    }

    #[test]
    fn an_unreadable_record_stops_replay_with_its_offset() {
        let mut delta = MetadataDelta::new(&MetadataImage::empty());
        let mut bytes = MetadataRecord::NoOp(NoOpRecord {}).encode();
        bytes[2..4].copy_from_slice(&9u16.to_be_bytes());
        let error = delta.replay_bytes(5, 1, &bytes).unwrap_err();
        assert_eq!(error.offset, 5);
        assert!(
            error.to_string().contains("NoOp record (apiKey 20) version 9"),
            "{error}"
        );
        assert_eq!(delta.image(), &MetadataImage::empty());
    }

    #[test]
    fn an_image_rebuilt_from_its_own_records_is_the_same_image() {
        let (image, _) = replay(
            &cluster(),
            11,
            &[
                MetadataRecord::PartitionChange(PartitionChangeRecord {
                    partition_id: 1,
                    topic_id: uuid(10),
                    isr: Some(vec![2]),
                    leader: Some(2),
                    replicas: None,
                    removing_replicas: Some(vec![1]),
                    adding_replicas: None,
                }),
                MetadataRecord::BrokerRegistrationChange(BrokerRegistrationChangeRecord {
                    broker_id: 3,
                    broker_epoch: 3,
                    fenced: Some(false),
                    in_controlled_shutdown: Some(true),
                }),
            ],
        );
        let records = image.records();
        assert!(matches!(records[0], MetadataRecord::FeatureLevel(_)), "features first");
        let mut delta = MetadataDelta::new(&MetadataImage::empty());
        for (i, record) in records.iter().enumerate() {
            delta.replay(i as Offset, 1, record).unwrap();
        }
        let (rebuilt, _) = delta.apply();
        let content = |i: &MetadataImage| {
            (
                i.features.clone(),
                i.brokers.clone(),
                i.topics_by_id.clone(),
                i.configs.clone(),
            )
        };
        assert_eq!(content(&rebuilt), content(&image));
        assert_eq!(rebuilt.fingerprint(), image.fingerprint());
        assert_ne!(cluster().fingerprint(), image.fingerprint());
    }
}
