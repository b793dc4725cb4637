//! The active controller's operations (Kafka's QuorumController and its
//! managers), as plain functions: each validates a request against an
//! image (the committed one plus what the controller appended and has not
//! yet seen committed) and returns the records that carry it out, which the
//! controller appends as one batch. Nothing here does I/O or keeps time.

use std::collections::BTreeMap;

use rand::Rng;
use uuid::Uuid;

use super::configs::{check_topic_config, is_topic_config_key};
use super::image::{MetadataImage, PartitionRegistration};
use super::partitions;
use super::placement::{place, Candidate, PlacementError};
use super::records::*;
use super::topics::check_new_topic_name;
use crate::types::{NodeId, Offset};

/// At most this many records in one operation's batch (Kafka's
/// `MAX_RECORDS_PER_USER_OP`).
pub const MAX_RECORDS_PER_OPERATION: usize = 10_000;

/// The `metadata.version` feature every new log starts with.
pub const METADATA_VERSION: &str = "metadata.version";
/// The level this build writes and understands.
pub const METADATA_VERSION_LEVEL: i16 = 1;

/// Why an operation was refused, with Kafka's error names.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error, serde::Serialize, serde::Deserialize)]
pub enum ControllerError {
    #[error("TOPIC_ALREADY_EXISTS: {0}")]
    TopicAlreadyExists(String),
    #[error("UNKNOWN_TOPIC_OR_PARTITION: {0}")]
    UnknownTopicOrPartition(String),
    #[error("INVALID_TOPIC_EXCEPTION: {0}")]
    InvalidTopic(String),
    #[error("INVALID_PARTITIONS: {0}")]
    InvalidPartitions(String),
    #[error("INVALID_REPLICATION_FACTOR: {0}")]
    InvalidReplicationFactor(String),
    #[error("INVALID_REPLICA_ASSIGNMENT: {0}")]
    InvalidReplicaAssignment(String),
    #[error("INVALID_CONFIG: {0}")]
    InvalidConfig(String),
    #[error("INVALID_REQUEST: {0}")]
    InvalidRequest(String),
    #[error("BROKER_ID_NOT_REGISTERED: {0}")]
    BrokerIdNotRegistered(String),
    #[error("STALE_BROKER_EPOCH: {0}")]
    StaleBrokerEpoch(String),
    #[error("DUPLICATE_BROKER_REGISTRATION: {0}")]
    DuplicateBrokerRegistration(String),
    #[error("FENCED_LEADER_EPOCH: {0}")]
    FencedLeaderEpoch(String),
    #[error("INVALID_UPDATE_VERSION: {0}")]
    InvalidUpdateVersion(String),
    #[error("NOT_LEADER_OR_FOLLOWER: {0}")]
    NotLeaderOrFollower(String),
    #[error("INELIGIBLE_REPLICA: {0}")]
    IneligibleReplica(String),
    #[error("PREFERRED_LEADER_NOT_AVAILABLE: {0}")]
    PreferredLeaderNotAvailable(String),
    #[error("NOT_CONTROLLER: {message}")]
    NotController { leader_id: Option<NodeId>, message: String },
    /// The records were appended but leadership was lost before they
    /// committed: they may still commit under the next leader.
    #[error("OUTCOME_UNKNOWN: {0}")]
    OutcomeUnknown(String),
    /// The node cannot take the operation now (stopping, overloaded).
    #[error("UNAVAILABLE: {0}")]
    Unavailable(String),
}

impl ControllerError {
    /// Kafka's name of the error.
    pub fn code(&self) -> &'static str {
        match self {
            ControllerError::TopicAlreadyExists(_) => "TOPIC_ALREADY_EXISTS",
            ControllerError::UnknownTopicOrPartition(_) => "UNKNOWN_TOPIC_OR_PARTITION",
            ControllerError::InvalidTopic(_) => "INVALID_TOPIC_EXCEPTION",
            ControllerError::InvalidPartitions(_) => "INVALID_PARTITIONS",
            ControllerError::InvalidReplicationFactor(_) => "INVALID_REPLICATION_FACTOR",
            ControllerError::InvalidReplicaAssignment(_) => "INVALID_REPLICA_ASSIGNMENT",
            ControllerError::InvalidConfig(_) => "INVALID_CONFIG",
            ControllerError::InvalidRequest(_) => "INVALID_REQUEST",
            ControllerError::BrokerIdNotRegistered(_) => "BROKER_ID_NOT_REGISTERED",
            ControllerError::StaleBrokerEpoch(_) => "STALE_BROKER_EPOCH",
            ControllerError::DuplicateBrokerRegistration(_) => "DUPLICATE_BROKER_REGISTRATION",
            ControllerError::FencedLeaderEpoch(_) => "FENCED_LEADER_EPOCH",
            ControllerError::InvalidUpdateVersion(_) => "INVALID_UPDATE_VERSION",
            ControllerError::NotLeaderOrFollower(_) => "NOT_LEADER_OR_FOLLOWER",
            ControllerError::IneligibleReplica(_) => "INELIGIBLE_REPLICA",
            ControllerError::PreferredLeaderNotAvailable(_) => "PREFERRED_LEADER_NOT_AVAILABLE",
            ControllerError::NotController { .. } => "NOT_CONTROLLER",
            ControllerError::OutcomeUnknown(_) => "OUTCOME_UNKNOWN",
            ControllerError::Unavailable(_) => "UNAVAILABLE",
        }
    }

    /// The text after the name.
    pub fn message(&self) -> String {
        let text = self.to_string();
        match text.split_once(": ") {
            Some((_, message)) => message.to_string(),
            None => text,
        }
    }
}

impl From<PlacementError> for ControllerError {
    fn from(e: PlacementError) -> Self {
        match e {
            PlacementError::InvalidReplicationFactor(m) => ControllerError::InvalidReplicationFactor(m),
            PlacementError::InvalidPartitions(m) => ControllerError::InvalidPartitions(m),
        }
    }
}

pub type Result<T> = std::result::Result<T, ControllerError>;

/// The features this build supports, with their level ranges: what a
/// broker of this build registers, and the most a controller of it
/// finalizes.
pub const SUPPORTED_FEATURES: &[(&str, i16, i16)] = &[(METADATA_VERSION, 1, METADATA_VERSION_LEVEL)];

/// [`SUPPORTED_FEATURES`] as a registration carries them.
pub fn supported_features() -> Vec<BrokerFeature> {
    SUPPORTED_FEATURES
        .iter()
        .map(|(name, min, max)| BrokerFeature {
            name: name.to_string(),
            min_supported: *min,
            max_supported: *max,
        })
        .collect()
}

/// The records that finalize `levels` (level 0 removes a feature): each
/// must be supported by this build and by every registered broker;
/// `metadata.version` is never removed nor lowered.
pub fn update_features(image: &MetadataImage, levels: &BTreeMap<String, i16>) -> Result<Vec<MetadataRecord>> {
    let mut records = Vec::new();
    for (name, level) in levels {
        let refuse = |why: String| {
            Err(ControllerError::InvalidUpdateVersion(format!(
                "{name} = {level}: {why}"
            )))
        };
        if *level < 0 {
            return refuse("a feature level is 0 (removed) or more".into());
        }
        let current = image.features.get(name).copied().unwrap_or(0);
        if *level == current {
            continue;
        }
        if name == METADATA_VERSION && *level < current {
            return refuse(format!("metadata.version is {current} and is never lowered"));
        }
        if *level > 0 {
            match SUPPORTED_FEATURES.iter().find(|(n, _, _)| n == name) {
                Some((_, min, max)) if (*min..=*max).contains(level) => {}
                Some((_, min, max)) => return refuse(format!("the controller supports {min} to {max}")),
                None => return refuse("the controller does not know this feature".into()),
            }
            for broker in image.brokers.values() {
                let supported = broker.features.iter().find(|f| &f.name == name);
                if !supported.is_some_and(|f| (f.min_supported..=f.max_supported).contains(level)) {
                    return refuse(format!("broker {} does not support it", broker.id));
                }
            }
        }
        records.push(MetadataRecord::FeatureLevel(FeatureLevelRecord {
            name: name.clone(),
            feature_level: *level,
        }));
    }
    Ok(records)
}

/// One partition's ISR change asked by its leader (AlterPartition).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct IsrChange {
    pub topic_id: Uuid,
    pub partition: i32,
    /// The leader epoch and partition epoch the leader knows.
    pub leader_epoch: i32,
    pub partition_epoch: i32,
    pub new_isr: Vec<BrokerId>,
}

/// The records of an AlterPartition from broker `broker_id` (at
/// `broker_epoch`), and each change's refusal if it was refused: only the
/// partition's leader may change its ISR, at the partition's current
/// leader epoch (else FENCED_LEADER_EPOCH) and partition epoch (else
/// INVALID_UPDATE_VERSION); the new ISR holds the leader, only replicas,
/// and only unfenced brokers (else INELIGIBLE_REPLICA).
pub fn alter_partitions(
    image: &MetadataImage,
    broker_id: BrokerId,
    broker_epoch: i64,
    changes: &[IsrChange],
) -> Result<(Vec<MetadataRecord>, Vec<Option<ControllerError>>)> {
    registered(image, broker_id, broker_epoch)?;
    check_record_count(changes.len())?;
    let mut records = Vec::new();
    let mut refusals = Vec::new();
    for change in changes {
        match alter_partition(image, broker_id, change) {
            Ok(record) => {
                records.extend(record);
                refusals.push(None);
            }
            Err(e) => refusals.push(Some(e)),
        }
    }
    Ok((records, refusals))
}

fn alter_partition(image: &MetadataImage, broker_id: BrokerId, change: &IsrChange) -> Result<Option<MetadataRecord>> {
    let unknown = || ControllerError::UnknownTopicOrPartition(format!("{}-{}", change.topic_id, change.partition));
    let partition = image
        .topics_by_id
        .get(&change.topic_id)
        .and_then(|t| t.partitions.get(&change.partition))
        .ok_or_else(unknown)?;
    if partition.leader != broker_id {
        return Err(ControllerError::NotLeaderOrFollower(format!(
            "broker {broker_id} does not lead the partition (broker {} does)",
            partition.leader
        )));
    }
    if change.leader_epoch != partition.leader_epoch {
        return Err(ControllerError::FencedLeaderEpoch(format!(
            "the leader epoch is {}, not {}",
            partition.leader_epoch, change.leader_epoch
        )));
    }
    if change.partition_epoch != partition.partition_epoch {
        return Err(ControllerError::InvalidUpdateVersion(format!(
            "the partition epoch is {}, not {}",
            partition.partition_epoch, change.partition_epoch
        )));
    }
    let mut seen = Vec::new();
    for r in &change.new_isr {
        if seen.contains(r) || !partition.replicas.contains(r) {
            return Err(ControllerError::IneligibleReplica(format!(
                "broker {r} is not a replica of the partition, or is named twice"
            )));
        }
        if *r != broker_id
            && !image
                .brokers
                .get(r)
                .is_some_and(|b| !b.fenced && !b.in_controlled_shutdown)
        {
            return Err(ControllerError::IneligibleReplica(format!(
                "broker {r} is fenced or shutting down"
            )));
        }
        seen.push(*r);
    }
    if !change.new_isr.contains(&broker_id) {
        return Err(ControllerError::IneligibleReplica(
            "the new ISR must hold its leader".into(),
        ));
    }
    if change.new_isr == partition.isr {
        return Ok(None);
    }
    Ok(Some(MetadataRecord::PartitionChange(PartitionChangeRecord {
        partition_id: change.partition,
        topic_id: change.topic_id,
        isr: Some(change.new_isr.clone()),
        leader: None,
        replicas: None,
        removing_replicas: None,
        adding_replicas: None,
    })))
}

/// The record that makes a partition's preferred replica (its first) the
/// leader, none when it leads already; PREFERRED_LEADER_NOT_AVAILABLE when
/// it is not in the ISR or may not lead.
pub fn elect_preferred(image: &MetadataImage, topic: &str, partition_id: i32) -> Result<Option<MetadataRecord>> {
    let unknown = || ControllerError::UnknownTopicOrPartition(format!("{topic}-{partition_id}"));
    let topic = image.topic(topic).ok_or_else(unknown)?;
    let partition = topic.partitions.get(&partition_id).ok_or_else(unknown)?;
    let preferred = partition.replicas[0];
    if partition.leader == preferred {
        return Ok(None);
    }
    if !partition.isr.contains(&preferred) || !may_lead(image, preferred) {
        return Err(ControllerError::PreferredLeaderNotAvailable(format!(
            "broker {preferred} is not in the ISR {:?} or may not lead",
            partition.isr
        )));
    }
    Ok(Some(MetadataRecord::PartitionChange(PartitionChangeRecord {
        partition_id,
        topic_id: topic.id,
        isr: None,
        leader: Some(preferred),
        replicas: None,
        removing_replicas: None,
        adding_replicas: None,
    })))
}

/// The records a new log starts with: `metadata.version`.
pub fn bootstrap(image: &MetadataImage) -> Vec<MetadataRecord> {
    if image.features.contains_key(METADATA_VERSION) {
        return Vec::new();
    }
    vec![MetadataRecord::FeatureLevel(FeatureLevelRecord {
        name: METADATA_VERSION.to_string(),
        feature_level: METADATA_VERSION_LEVEL,
    })]
}

/// A broker's registration request.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct BrokerRegistrationRequest {
    pub broker_id: BrokerId,
    pub incarnation_id: Uuid,
    pub listeners: Vec<BrokerEndpoint>,
    pub rack: Option<String>,
    pub features: Vec<BrokerFeature>,
}

/// What registering a broker takes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Registration {
    /// This incarnation is registered already, with this epoch.
    Known(i64),
    /// The records that register it: the last is its RegisterBroker
    /// (fenced, its epoch the offset the record gets), after those that
    /// fence an earlier registration of the same id, whose partitions it
    /// must not go on leading.
    New(Vec<MetadataRecord>),
}

/// What registering a broker takes (see [`Registration`]).
/// `session_alive` says whether the broker's current registration has
/// heartbeaten within its session: a new incarnation is refused then.
pub fn register_broker(
    image: &MetadataImage,
    request: &BrokerRegistrationRequest,
    session_alive: bool,
) -> Result<Registration> {
    if request.broker_id < 0 {
        return Err(ControllerError::InvalidRequest(format!(
            "a broker id is at least 0, not {}",
            request.broker_id
        )));
    }
    if let Some(existing) = image.brokers.get(&request.broker_id) {
        if existing.incarnation_id == request.incarnation_id {
            return Ok(Registration::Known(existing.epoch));
        }
        if session_alive {
            return Err(ControllerError::DuplicateBrokerRegistration(format!(
                "broker {} is registered with incarnation {} whose session is alive",
                request.broker_id, existing.incarnation_id
            )));
        }
    }
    let mut records = fence_broker(image, request.broker_id, false);
    records.push(MetadataRecord::RegisterBroker(RegisterBrokerRecord {
        broker_id: request.broker_id,
        incarnation_id: request.incarnation_id,
        broker_epoch: EPOCH_OF_THIS_RECORD,
        endpoints: request.listeners.clone(),
        features: request.features.clone(),
        rack: request.rack.clone(),
        fenced: true,
        in_controlled_shutdown: false,
    }));
    Ok(Registration::New(records))
}

/// The registration of broker `id`, checked against the epoch it claims.
pub fn registered(image: &MetadataImage, id: BrokerId, epoch: i64) -> Result<&super::image::BrokerRegistration> {
    let broker = image
        .brokers
        .get(&id)
        .ok_or_else(|| ControllerError::BrokerIdNotRegistered(format!("broker {id} is not registered")))?;
    if broker.epoch != epoch {
        return Err(ControllerError::StaleBrokerEpoch(format!(
            "broker {id} is registered with epoch {}, not {epoch}",
            broker.epoch
        )));
    }
    Ok(broker)
}

/// Whether broker `id` may lead partitions in `image`: registered,
/// unfenced and not shutting down.
pub fn may_lead(image: &MetadataImage, id: BrokerId) -> bool {
    image
        .brokers
        .get(&id)
        .is_some_and(|b| !b.fenced && !b.in_controlled_shutdown)
}

/// Whether broker `id` leads any partition.
pub fn leads_any(image: &MetadataImage, id: BrokerId) -> bool {
    image
        .topics_by_id
        .values()
        .any(|t| t.partitions.values().any(|p| p.leader == id))
}

/// The records that fence broker `id` (or, with `shutting_down`, move it
/// into controlled shutdown): it leaves every ISR, the partitions it led
/// get a new leader from their ISR, then its registration changes.
pub fn fence_broker(image: &MetadataImage, id: BrokerId, shutting_down: bool) -> Vec<MetadataRecord> {
    let Some(broker) = image.brokers.get(&id) else {
        return Vec::new();
    };
    let mut records = Vec::new();
    for topic in image.topics_by_id.values() {
        for (partition_id, partition) in &topic.partitions {
            let change = partitions::fence(topic.id, partition_id, partition, id, |r| r != id && may_lead(image, r));
            if let Some(change) = change {
                records.push(MetadataRecord::PartitionChange(change));
            }
        }
    }
    let change = if shutting_down {
        BrokerRegistrationChangeRecord {
            broker_id: id,
            broker_epoch: broker.epoch,
            fenced: None,
            in_controlled_shutdown: Some(true),
        }
    } else {
        BrokerRegistrationChangeRecord {
            broker_id: id,
            broker_epoch: broker.epoch,
            fenced: Some(true),
            in_controlled_shutdown: None,
        }
    };
    if (shutting_down && !broker.in_controlled_shutdown) || (!shutting_down && !broker.fenced) {
        records.push(MetadataRecord::BrokerRegistrationChange(change));
    }
    records
}

/// The records that unfence broker `id`: its registration changes, then
/// each partition it replicates that has no leader gets one.
pub fn unfence_broker(image: &MetadataImage, id: BrokerId) -> Vec<MetadataRecord> {
    let Some(broker) = image.brokers.get(&id) else {
        return Vec::new();
    };
    let mut records = vec![MetadataRecord::BrokerRegistrationChange(
        BrokerRegistrationChangeRecord {
            broker_id: id,
            broker_epoch: broker.epoch,
            fenced: Some(false),
            in_controlled_shutdown: None,
        },
    )];
    for topic in image.topics_by_id.values() {
        for (partition_id, partition) in &topic.partitions {
            if partition.leader == NO_LEADER && partition.isr.contains(&id) {
                let leader = partitions::elect(partition, |r| r == id || may_lead(image, r));
                if let Some(leader) = leader {
                    records.push(MetadataRecord::PartitionChange(PartitionChangeRecord {
                        partition_id,
                        topic_id: topic.id,
                        isr: None,
                        leader: Some(leader),
                        replicas: None,
                        removing_replicas: None,
                        adding_replicas: None,
                    }));
                }
            }
        }
    }
    records
}

/// A topic to create: counts (placed by the controller) or explicit
/// assignments, and configs.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct NewTopic {
    pub name: String,
    pub layout: TopicLayout,
    pub configs: BTreeMap<String, String>,
}

#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum TopicLayout {
    Counts { partitions: i32, replication_factor: i16 },
    Assignments(Vec<Vec<BrokerId>>),
}

/// The records that create `topic`, with its new id.
pub fn create_topic(
    image: &MetadataImage,
    topic: &NewTopic,
    rng: &mut impl Rng,
) -> Result<(Uuid, Vec<MetadataRecord>)> {
    if image.topic_ids_by_name.contains_key(&topic.name) {
        return Err(ControllerError::TopicAlreadyExists(format!(
            "topic {:?} exists",
            topic.name
        )));
    }
    check_new_topic_name(&topic.name, &image.topic_ids_by_name).map_err(|e| ControllerError::InvalidTopic(e.0))?;
    for (key, value) in &topic.configs {
        check_topic_config(key, value).map_err(|e| ControllerError::InvalidConfig(e.0))?;
    }
    let assignments = match &topic.layout {
        TopicLayout::Counts {
            partitions,
            replication_factor,
        } => {
            if *partitions < 1 {
                return Err(ControllerError::InvalidPartitions(format!(
                    "a topic has at least 1 partition, not {partitions}"
                )));
            }
            if *replication_factor < 1 {
                return Err(ControllerError::InvalidReplicationFactor(format!(
                    "the replication factor is at least 1, not {replication_factor}"
                )));
            }
            check_record_count(*partitions as usize + topic.configs.len() + 1)?;
            place(
                &candidates(image),
                *partitions as usize,
                *replication_factor as usize,
                rng,
            )?
        }
        TopicLayout::Assignments(assignments) => {
            check_assignments(image, assignments)?;
            check_record_count(assignments.len() + topic.configs.len() + 1)?;
            assignments.clone()
        }
    };
    // Never an id the image holds (a replay of the Topic record would fail
    // on every node).
    let topic_id = loop {
        let id = uuid::Builder::from_random_bytes(rng.gen()).into_uuid();
        if !image.topics_by_id.contains_key(&id) {
            break id;
        }
    };
    let mut records = vec![MetadataRecord::Topic(TopicRecord {
        name: topic.name.clone(),
        topic_id,
    })];
    records.extend(partition_records(image, topic_id, 0, assignments));
    records.extend(topic.configs.iter().map(|(key, value)| {
        MetadataRecord::Config(ConfigRecord {
            resource_type: CONFIG_RESOURCE_TOPIC,
            resource_name: topic.name.clone(),
            name: key.clone(),
            value: Some(value.clone()),
        })
    }));
    Ok((topic_id, records))
}

/// The records that delete topic `name`.
pub fn delete_topic(image: &MetadataImage, name: &str) -> Result<Vec<MetadataRecord>> {
    let topic = image
        .topic(name)
        .ok_or_else(|| ControllerError::UnknownTopicOrPartition(format!("no topic is named {name:?}")))?;
    Ok(vec![MetadataRecord::RemoveTopic(RemoveTopicRecord {
        topic_id: topic.id,
    })])
}

/// The records that take topic `name` to `count` partitions, the new ones
/// placed like the existing ones' replication factor.
pub fn create_partitions(
    image: &MetadataImage,
    name: &str,
    count: i32,
    rng: &mut impl Rng,
) -> Result<Vec<MetadataRecord>> {
    let topic = image
        .topic(name)
        .ok_or_else(|| ControllerError::UnknownTopicOrPartition(format!("no topic is named {name:?}")))?;
    let current = topic.partitions.len() as i32;
    if count <= current {
        return Err(ControllerError::InvalidPartitions(format!(
            "topic {name:?} has {current} partitions; the new count must be larger, not {count}"
        )));
    }
    let added = (count - current) as usize;
    check_record_count(added)?;
    let replication_factor = topic.partitions.values().next().map_or(1, |p| p.replicas.len());
    let assignments = place(&candidates(image), added, replication_factor, rng)?;
    Ok(partition_records(image, topic.id, current, assignments).collect())
}

/// A config change on one resource: keys to set, keys to delete.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ConfigChange {
    pub set: BTreeMap<String, String>,
    pub delete: Vec<String>,
}

/// The records of an incremental config change on a topic
/// ([`CONFIG_RESOURCE_TOPIC`]) or a broker ([`CONFIG_RESOURCE_BROKER`];
/// the empty name is the cluster default).
pub fn alter_configs(
    image: &MetadataImage,
    resource_type: i8,
    name: &str,
    change: &ConfigChange,
) -> Result<Vec<MetadataRecord>> {
    match resource_type {
        CONFIG_RESOURCE_TOPIC => {
            if image.topic(name).is_none() {
                return Err(ControllerError::UnknownTopicOrPartition(format!(
                    "no topic is named {name:?}"
                )));
            }
            for (key, value) in &change.set {
                check_topic_config(key, value).map_err(|e| ControllerError::InvalidConfig(e.0))?;
            }
            for key in &change.delete {
                check_topic_config_key(key)?;
            }
        }
        CONFIG_RESOURCE_BROKER => {
            if !name.is_empty() {
                let id: BrokerId = name.parse().map_err(|_| {
                    ControllerError::InvalidRequest(format!("a broker resource is named by its id, not {name:?}"))
                })?;
                if id < 0 {
                    return Err(ControllerError::InvalidRequest(format!(
                        "a broker id is at least 0, not {id}"
                    )));
                }
            }
            for key in change.set.keys().chain(change.delete.iter()) {
                if key.is_empty() {
                    return Err(ControllerError::InvalidConfig("a config key may not be empty".into()));
                }
            }
        }
        other => {
            return Err(ControllerError::InvalidRequest(format!(
                "no config resource type {other}"
            )));
        }
    }
    if change.set.keys().any(|k| change.delete.contains(k)) {
        return Err(ControllerError::InvalidRequest(
            "a key may not be both set and deleted".into(),
        ));
    }
    check_record_count(change.set.len() + change.delete.len())?;
    let record = |key: &String, value: Option<String>| {
        MetadataRecord::Config(ConfigRecord {
            resource_type,
            resource_name: name.to_string(),
            name: key.clone(),
            value,
        })
    };
    Ok(change
        .set
        .iter()
        .map(|(k, v)| record(k, Some(v.clone())))
        .chain(change.delete.iter().map(|k| record(k, None)))
        .collect())
}

fn check_topic_config_key(key: &str) -> Result<()> {
    if is_topic_config_key(key) {
        return Ok(());
    }
    Err(ControllerError::InvalidConfig(format!("unknown topic config {key:?}")))
}

fn check_record_count(count: usize) -> Result<()> {
    if count > MAX_RECORDS_PER_OPERATION {
        return Err(ControllerError::InvalidRequest(format!(
            "the operation would write {count} records; at most {MAX_RECORDS_PER_OPERATION} are written at once"
        )));
    }
    Ok(())
}

fn candidates(image: &MetadataImage) -> Vec<Candidate> {
    image
        .brokers
        .values()
        .filter(|b| !b.in_controlled_shutdown)
        .map(|b| Candidate {
            id: b.id,
            rack: b.rack.clone(),
            fenced: b.fenced,
        })
        .collect()
}

fn check_assignments(image: &MetadataImage, assignments: &[Vec<BrokerId>]) -> Result<()> {
    let invalid = |m: String| Err(ControllerError::InvalidReplicaAssignment(m));
    if assignments.is_empty() {
        return invalid("at least one partition must be assigned".into());
    }
    let factor = assignments[0].len();
    for (i, replicas) in assignments.iter().enumerate() {
        if replicas.is_empty() {
            return invalid(format!("partition {i} has no replicas"));
        }
        if replicas.len() != factor {
            return invalid(format!(
                "partition {i} has {} replicas, partition 0 has {factor}: every partition has as many",
                replicas.len()
            ));
        }
        for (j, r) in replicas.iter().enumerate() {
            if replicas[..j].contains(r) {
                return invalid(format!("partition {i} names broker {r} twice"));
            }
            if !image.brokers.contains_key(r) {
                return invalid(format!("partition {i} names broker {r}, which is not registered"));
            }
        }
    }
    Ok(())
}

/// Partition records for `assignments`, numbered from `first`: the first
/// replica that may lead leads, and the ISR is every replica.
fn partition_records(
    image: &MetadataImage,
    topic_id: Uuid,
    first: i32,
    assignments: Vec<Vec<BrokerId>>,
) -> impl Iterator<Item = MetadataRecord> + '_ {
    assignments.into_iter().enumerate().map(move |(i, replicas)| {
        let registration = PartitionRegistration {
            replicas: replicas.clone(),
            isr: replicas.clone(),
            removing_replicas: Vec::new(),
            adding_replicas: Vec::new(),
            leader: NO_LEADER,
            leader_epoch: 0,
            partition_epoch: 0,
        };
        let leader = partitions::elect(&registration, |r| may_lead(image, r)).unwrap_or(NO_LEADER);
        MetadataRecord::Partition(PartitionRecord {
            partition_id: first + i as i32,
            topic_id,
            replicas: replicas.clone(),
            isr: replicas,
            removing_replicas: Vec::new(),
            adding_replicas: Vec::new(),
            leader,
            leader_epoch: 0,
            partition_epoch: 0,
        })
    })
}

/// A registration's offset as its epoch, once known: a controller writes
/// RegisterBroker records with this epoch, and replay gives the broker the
/// record's own offset.
pub const EPOCH_OF_THIS_RECORD: i64 = -1;

/// The offset a heartbeat's metadata has to reach for the broker to be
/// unfenced: its registration.
pub fn caught_up(broker_epoch: i64, metadata_offset: Offset) -> bool {
    metadata_offset >= broker_epoch
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metadata::image::MetadataDelta;
    use rand::rngs::SmallRng;
    use rand::SeedableRng;

    /// `image` with `records` replayed after its offset.
    fn with(image: &MetadataImage, records: &[MetadataRecord]) -> MetadataImage {
        let mut delta = MetadataDelta::new(image);
        for (i, record) in records.iter().enumerate() {
            delta.replay(image.offset + 1 + i as Offset, 1, record).unwrap();
        }
        delta.apply().0
    }

    fn request(id: BrokerId, rack: Option<&str>) -> BrokerRegistrationRequest {
        BrokerRegistrationRequest {
            broker_id: id,
            incarnation_id: Uuid::new_v4(),
            listeners: Vec::new(),
            rack: rack.map(str::to_string),
            features: supported_features(),
        }
    }

    /// The records of a registration that is not known yet.
    fn new_registration(image: &MetadataImage, request: &BrokerRegistrationRequest) -> Vec<MetadataRecord> {
        match register_broker(image, request, false).unwrap() {
            Registration::New(records) => records,
            known => panic!("{known:?}"),
        }
    }

    /// An image with brokers `ids`, registered and unfenced.
    fn cluster(ids: &[BrokerId]) -> MetadataImage {
        let mut image = with(&MetadataImage::empty(), &bootstrap(&MetadataImage::empty()));
        for id in ids {
            image = with(&image, &new_registration(&image, &request(*id, None)));
            image = with(&image, &unfence_broker(&image, *id));
        }
        image
    }

    fn counts(name: &str, partitions: i32, replication_factor: i16) -> NewTopic {
        NewTopic {
            name: name.to_string(),
            layout: TopicLayout::Counts {
                partitions,
                replication_factor,
            },
            configs: BTreeMap::new(),
        }
    }

    fn rng() -> SmallRng {
        SmallRng::seed_from_u64(7)
    }

    #[test]
    fn a_new_log_starts_with_metadata_version_once() {
        let records = bootstrap(&MetadataImage::empty());
        assert_eq!(records.len(), 1);
        let image = with(&MetadataImage::empty(), &records);
        assert_eq!(image.features.get(METADATA_VERSION), Some(&METADATA_VERSION_LEVEL));
        assert!(bootstrap(&image).is_empty());
    }

    #[test]
    fn a_registration_gets_its_records_offset_as_epoch_and_the_same_incarnation_keeps_it() {
        let image = cluster(&[]);
        let first = request(1, Some("a"));
        let image = with(&image, &new_registration(&image, &first));
        let broker = &image.brokers[&1];
        assert_eq!(broker.epoch, image.offset, "the epoch is the record's offset");
        assert!(broker.fenced, "a new registration is fenced");
        assert_eq!(
            register_broker(&image, &first, true).unwrap(),
            Registration::Known(broker.epoch)
        );
        // Another incarnation while the session lives is refused; once it
        // expired, it registers anew.
        let second = request(1, Some("a"));
        assert!(matches!(
            register_broker(&image, &second, true),
            Err(ControllerError::DuplicateBrokerRegistration(_))
        ));
        assert!(matches!(
            register_broker(&image, &second, false).unwrap(),
            Registration::New(_)
        ));
        assert!(matches!(
            register_broker(&image, &request(-1, None), false),
            Err(ControllerError::InvalidRequest(_))
        ));
    }

    #[test]
    fn a_new_incarnation_takes_its_predecessors_leadership_away_first() {
        let image = cluster(&[1, 2]);
        let assigned = NewTopic {
            name: "orders".into(),
            layout: TopicLayout::Assignments(vec![vec![1, 2]]),
            configs: BTreeMap::new(),
        };
        let (_, records) = create_topic(&image, &assigned, &mut rng()).unwrap();
        let image = with(&image, &records);
        let again = with(&image, &new_registration(&image, &request(1, None)));
        let p = &again.topic("orders").unwrap().partitions[&0];
        assert_eq!((p.leader, p.isr.clone()), (2, vec![2]));
        assert!(again.brokers[&1].fenced && again.brokers[&1].epoch == again.offset);
    }

    #[test]
    fn heartbeats_name_unknown_brokers_and_stale_epochs() {
        let image = cluster(&[1]);
        let epoch = image.brokers[&1].epoch;
        assert!(registered(&image, 1, epoch).is_ok());
        assert!(matches!(
            registered(&image, 2, epoch),
            Err(ControllerError::BrokerIdNotRegistered(_))
        ));
        assert!(matches!(
            registered(&image, 1, epoch - 1),
            Err(ControllerError::StaleBrokerEpoch(_))
        ));
        assert!(!caught_up(epoch, epoch - 1) && caught_up(epoch, epoch));
    }

    #[test]
    fn a_topic_is_placed_on_unfenced_brokers_with_the_first_replica_leading() {
        let image = cluster(&[1, 2, 3]);
        let (id, records) = create_topic(&image, &counts("orders", 6, 3), &mut rng()).unwrap();
        let image = with(&image, &records);
        let topic = image.topic("orders").unwrap();
        assert_eq!(topic.id, id);
        assert_eq!(topic.partitions.len(), 6);
        for p in topic.partitions.values() {
            assert_eq!(p.replicas.len(), 3);
            assert_eq!(p.isr, p.replicas, "the ISR is every replica");
            assert_eq!(p.leader, p.replicas[0], "the first replica leads");
        }
        let mut leaders: Vec<_> = topic.partitions.values().map(|p| p.leader).collect();
        leaders.sort();
        assert_eq!(leaders, vec![1, 1, 2, 2, 3, 3], "leaders spread evenly");
    }

    #[test]
    fn topic_creation_errors_have_kafkas_names() {
        let image = cluster(&[1, 2]);
        let (_, records) = create_topic(&image, &counts("orders", 1, 1), &mut rng()).unwrap();
        let image = with(&image, &records);
        let code = |topic: NewTopic| create_topic(&image, &topic, &mut rng()).unwrap_err().code();
        assert_eq!(code(counts("orders", 1, 1)), "TOPIC_ALREADY_EXISTS");
        assert_eq!(code(counts("a b", 1, 1)), "INVALID_TOPIC_EXCEPTION");
        assert_eq!(code(counts("..", 1, 1)), "INVALID_TOPIC_EXCEPTION");
        assert_eq!(code(counts("new", 0, 1)), "INVALID_PARTITIONS");
        assert_eq!(code(counts("new", 1, 0)), "INVALID_REPLICATION_FACTOR");
        assert_eq!(code(counts("new", 1, 3)), "INVALID_REPLICATION_FACTOR", "two brokers");
        // A topic is written as one record and one a partition, at most
        // 10,000 records in all.
        assert_eq!(code(counts("new", 10_000, 1)), "INVALID_REQUEST", "10,001 records");
        assert!(create_topic(&image, &counts("new", 9_999, 1), &mut rng()).is_ok());
        let mut configs = counts("new", 1, 1);
        configs.configs.insert("retention.ms".into(), "soon".into());
        assert_eq!(code(configs), "INVALID_CONFIG");
        let assigned = |assignments: Vec<Vec<BrokerId>>| NewTopic {
            name: "new".into(),
            layout: TopicLayout::Assignments(assignments),
            configs: BTreeMap::new(),
        };
        assert_eq!(code(assigned(vec![vec![1, 1]])), "INVALID_REPLICA_ASSIGNMENT");
        assert_eq!(code(assigned(vec![vec![1], vec![1, 2]])), "INVALID_REPLICA_ASSIGNMENT");
        assert_eq!(code(assigned(vec![vec![9]])), "INVALID_REPLICA_ASSIGNMENT");
        assert_eq!(code(assigned(vec![])), "INVALID_REPLICA_ASSIGNMENT");
        assert!(create_topic(&image, &assigned(vec![vec![2, 1], vec![1, 2]]), &mut rng()).is_ok());
        // Its configs count among the 10,000 records too, either layout.
        let retention = |mut topic: NewTopic| {
            topic.configs.insert("retention.ms".into(), "1000".into());
            topic
        };
        assert_eq!(code(retention(counts("new", 9_999, 1))), "INVALID_REQUEST");
        assert_eq!(code(retention(assigned(vec![vec![1]; 9_999]))), "INVALID_REQUEST");
        assert!(create_topic(&image, &retention(assigned(vec![vec![1]; 9_998])), &mut rng()).is_ok());
    }

    #[test]
    fn deleting_and_growing_a_topic() {
        let image = cluster(&[1, 2]);
        let (_, records) = create_topic(&image, &counts("orders", 2, 2), &mut rng()).unwrap();
        let image = with(&image, &records);
        let grown = with(&image, &create_partitions(&image, "orders", 5, &mut rng()).unwrap());
        let topic = grown.topic("orders").unwrap();
        assert_eq!(topic.partitions.keys().collect::<Vec<_>>(), vec![0, 1, 2, 3, 4]);
        assert!(
            topic.partitions.values().all(|p| p.replicas.len() == 2),
            "the topic's replication factor"
        );
        assert_eq!(
            create_partitions(&image, "orders", 2, &mut rng()).unwrap_err().code(),
            "INVALID_PARTITIONS"
        );
        assert_eq!(
            create_partitions(&image, "nope", 3, &mut rng()).unwrap_err().code(),
            "UNKNOWN_TOPIC_OR_PARTITION"
        );
        let deleted = with(&image, &delete_topic(&image, "orders").unwrap());
        assert!(deleted.topic("orders").is_none());
        assert_eq!(
            delete_topic(&deleted, "orders").unwrap_err().code(),
            "UNKNOWN_TOPIC_OR_PARTITION"
        );
    }

    #[test]
    fn fencing_a_broker_moves_its_leaderships_and_unfencing_restores_leaderless_partitions() {
        let image = cluster(&[1, 2]);
        let assigned = NewTopic {
            name: "orders".into(),
            layout: TopicLayout::Assignments(vec![vec![1, 2], vec![2, 1]]),
            configs: BTreeMap::new(),
        };
        let solo = NewTopic {
            name: "solo".into(),
            layout: TopicLayout::Assignments(vec![vec![1]]),
            configs: BTreeMap::new(),
        };
        let (_, records) = create_topic(&image, &assigned, &mut rng()).unwrap();
        let image = with(&image, &records);
        let (_, records) = create_topic(&image, &solo, &mut rng()).unwrap();
        let image = with(&image, &records);
        let fenced = with(&image, &fence_broker(&image, 1, false));
        assert!(fenced.brokers[&1].fenced);
        assert!(!leads_any(&fenced, 1), "a fenced broker leads nothing");
        let topic = fenced.topic("orders").unwrap();
        assert_eq!(
            (topic.partitions[&0].leader, topic.partitions[&0].isr.clone()),
            (2, vec![2])
        );
        assert_eq!(topic.partitions[&1].isr, vec![2]);
        let solo = &fenced.topic("solo").unwrap().partitions[&0];
        assert_eq!(
            (solo.leader, solo.isr.clone()),
            (NO_LEADER, vec![1]),
            "the ISR never empties"
        );
        assert!(topic.partitions[&0].leader_epoch > image.topic("orders").unwrap().partitions[&0].leader_epoch);
        let back = with(&fenced, &unfence_broker(&fenced, 1));
        assert!(!back.brokers[&1].fenced);
        assert_eq!(
            back.topic("solo").unwrap().partitions[&0].leader,
            1,
            "its leaderless partition"
        );
        // Controlled shutdown moves leadership too, without fencing.
        let shutting = with(&image, &fence_broker(&image, 2, true));
        assert!(shutting.brokers[&2].in_controlled_shutdown && !shutting.brokers[&2].fenced);
        assert!(!leads_any(&shutting, 2));
    }

    #[test]
    fn features_are_finalized_only_at_levels_every_broker_supports() {
        let image = cluster(&[1, 2]);
        let levels = |pairs: &[(&str, i16)]| pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect();
        assert!(
            update_features(&image, &levels(&[(METADATA_VERSION, 1)]))
                .unwrap()
                .is_empty(),
            "no change"
        );
        let code = |pairs: &[(&str, i16)]| update_features(&image, &levels(pairs)).unwrap_err().code();
        assert_eq!(
            code(&[(METADATA_VERSION, 0)]),
            "INVALID_UPDATE_VERSION",
            "never removed"
        );
        assert_eq!(
            code(&[(METADATA_VERSION, 2)]),
            "INVALID_UPDATE_VERSION",
            "past what is supported"
        );
        assert_eq!(code(&[("no.such.feature", 1)]), "INVALID_UPDATE_VERSION");
        assert_eq!(code(&[(METADATA_VERSION, -1)]), "INVALID_UPDATE_VERSION");
        // A broker that supports nothing holds every feature back.
        let mut lacking = request(3, None);
        lacking.features.clear();
        let image = with(&image, &new_registration(&image, &lacking));
        let without = with(&MetadataImage::empty(), &[]);
        assert!(matches!(
            update_features(&image, &levels(&[(METADATA_VERSION, 1)])),
            Ok(records) if records.is_empty()
        ));
        assert_eq!(
            update_features(&without, &levels(&[(METADATA_VERSION, 1)]))
                .unwrap()
                .len(),
            1,
            "a log without metadata.version gets it"
        );
        // With no broker to hold it back, the controller's own range does.
        assert!(
            update_features(&without, &levels(&[(METADATA_VERSION, METADATA_VERSION_LEVEL + 1)])).is_err(),
            "past what this controller supports, with no broker registered"
        );
        // Level 0 removes a feature, one this controller does not know too
        // (a newer build finalized it): no broker or range check holds it.
        let mut newer = without.clone();
        newer.features.insert("newer.feature".to_string(), 2);
        assert_eq!(
            update_features(&newer, &levels(&[("newer.feature", 0)])).unwrap(),
            vec![MetadataRecord::FeatureLevel(FeatureLevelRecord {
                name: "newer.feature".into(),
                feature_level: 0,
            })]
        );
        // A broker of this build registers what the build supports, so it
        // holds back no level its controller would finalize.
        let fresh = MetadataImage::empty();
        let registered = with(&fresh, &new_registration(&fresh, &request(1, None)));
        assert_eq!(
            update_features(&registered, &levels(&[(METADATA_VERSION, METADATA_VERSION_LEVEL)]))
                .unwrap()
                .len(),
            1
        );
    }

    #[test]
    fn an_isr_change_is_taken_only_from_the_leader_at_the_current_epochs() {
        let image = cluster(&[1, 2, 3]);
        let assigned = NewTopic {
            name: "orders".into(),
            layout: TopicLayout::Assignments(vec![vec![1, 2, 3]]),
            configs: BTreeMap::new(),
        };
        let (topic_id, records) = create_topic(&image, &assigned, &mut rng()).unwrap();
        let image = with(&image, &records);
        let epoch = |id| image.brokers[&id].epoch;
        let change = |isr: Vec<BrokerId>, leader_epoch, partition_epoch| IsrChange {
            topic_id,
            partition: 0,
            leader_epoch,
            partition_epoch,
            new_isr: isr,
        };
        let (records, refusals) = alter_partitions(&image, 1, epoch(1), &[change(vec![1, 2], 0, 0)]).unwrap();
        assert_eq!(refusals, vec![None]);
        let shrunk = with(&image, &records);
        let p = &shrunk.topics_by_id[&topic_id].partitions[&0];
        assert_eq!((p.isr.clone(), p.leader_epoch, p.partition_epoch), (vec![1, 2], 0, 1));
        // Stale epochs, another leader, bad members: refused, nothing written.
        let refused = |image: &MetadataImage, broker: BrokerId, c: IsrChange| {
            let (records, refusals) = alter_partitions(image, broker, image.brokers[&broker].epoch, &[c]).unwrap();
            assert!(records.is_empty());
            refusals[0].as_ref().unwrap().code()
        };
        assert_eq!(refused(&shrunk, 1, change(vec![1], 0, 0)), "INVALID_UPDATE_VERSION");
        assert_eq!(refused(&shrunk, 1, change(vec![1], 1, 1)), "FENCED_LEADER_EPOCH");
        assert_eq!(refused(&shrunk, 2, change(vec![2], 0, 1)), "NOT_LEADER_OR_FOLLOWER");
        assert_eq!(refused(&shrunk, 1, change(vec![1, 9], 0, 1)), "INELIGIBLE_REPLICA");
        assert_eq!(
            refused(&shrunk, 1, change(vec![2, 3], 0, 1)),
            "INELIGIBLE_REPLICA",
            "without its leader"
        );
        let fenced = with(&shrunk, &fence_broker(&shrunk, 3, false));
        let epochs = &fenced.topics_by_id[&topic_id].partitions[&0];
        assert_eq!(
            refused(
                &fenced,
                1,
                change(vec![1, 2, 3], epochs.leader_epoch, epochs.partition_epoch)
            ),
            "INELIGIBLE_REPLICA",
            "a fenced broker does not rejoin"
        );
        assert_eq!(
            alter_partitions(&image, 1, epoch(1) + 1, &[]).unwrap_err().code(),
            "STALE_BROKER_EPOCH"
        );
    }

    #[test]
    fn the_preferred_replica_is_elected_when_it_may_lead() {
        let image = cluster(&[1, 2]);
        let assigned = NewTopic {
            name: "orders".into(),
            layout: TopicLayout::Assignments(vec![vec![1, 2]]),
            configs: BTreeMap::new(),
        };
        let (_, records) = create_topic(&image, &assigned, &mut rng()).unwrap();
        let image = with(&image, &records);
        assert_eq!(elect_preferred(&image, "orders", 0).unwrap(), None, "it leads already");
        let fenced = with(&image, &fence_broker(&image, 1, false));
        assert_eq!(
            elect_preferred(&fenced, "orders", 0).unwrap_err().code(),
            "PREFERRED_LEADER_NOT_AVAILABLE"
        );
        // Back, but out of the ISR until its leader takes it in.
        let back = with(&fenced, &unfence_broker(&fenced, 1));
        assert_eq!(back.topic("orders").unwrap().partitions[&0].leader, 2);
        assert!(elect_preferred(&back, "orders", 0).is_err());
        let p = &back.topic("orders").unwrap().partitions[&0];
        let id = back.topic("orders").unwrap().id;
        let rejoined = IsrChange {
            topic_id: id,
            partition: 0,
            leader_epoch: p.leader_epoch,
            partition_epoch: p.partition_epoch,
            new_isr: vec![2, 1],
        };
        let (records, _) = alter_partitions(&back, 2, back.brokers[&2].epoch, &[rejoined]).unwrap();
        let rejoined = with(&back, &records);
        let elected = with(&rejoined, &[elect_preferred(&rejoined, "orders", 0).unwrap().unwrap()]);
        assert_eq!(elected.topic("orders").unwrap().partitions[&0].leader, 1);
        assert_eq!(
            elect_preferred(&image, "nope", 0).unwrap_err().code(),
            "UNKNOWN_TOPIC_OR_PARTITION"
        );
        assert_eq!(
            elect_preferred(&image, "orders", 5).unwrap_err().code(),
            "UNKNOWN_TOPIC_OR_PARTITION"
        );
    }

    #[test]
    fn config_changes_are_validated_per_resource() {
        let image = cluster(&[1]);
        let (_, records) = create_topic(&image, &counts("orders", 1, 1), &mut rng()).unwrap();
        let image = with(&image, &records);
        let change = |set: &[(&str, &str)], delete: &[&str]| ConfigChange {
            set: set.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
            delete: delete.iter().map(|k| k.to_string()).collect(),
        };
        let set = alter_configs(
            &image,
            CONFIG_RESOURCE_TOPIC,
            "orders",
            &change(&[("retention.ms", "100")], &[]),
        );
        let image = with(&image, &set.unwrap());
        let resource = super::super::image::ConfigResource {
            resource_type: CONFIG_RESOURCE_TOPIC,
            name: "orders".into(),
        };
        assert_eq!(
            image.configs[&resource].get("retention.ms").map(String::as_str),
            Some("100")
        );
        let deleted = alter_configs(&image, CONFIG_RESOURCE_TOPIC, "orders", &change(&[], &["retention.ms"]));
        assert!(with(&image, &deleted.unwrap()).configs.get(&resource).is_none());
        let code = |kind, name, c: ConfigChange| alter_configs(&image, kind, name, &c).unwrap_err().code();
        assert_eq!(
            code(CONFIG_RESOURCE_TOPIC, "orders", change(&[("bogus", "1")], &[])),
            "INVALID_CONFIG"
        );
        assert_eq!(
            code(CONFIG_RESOURCE_TOPIC, "orders", change(&[], &["bogus"])),
            "INVALID_CONFIG"
        );
        assert_eq!(
            code(CONFIG_RESOURCE_TOPIC, "nope", change(&[], &[])),
            "UNKNOWN_TOPIC_OR_PARTITION"
        );
        assert_eq!(code(CONFIG_RESOURCE_BROKER, "x", change(&[], &[])), "INVALID_REQUEST");
        assert_eq!(code(CONFIG_RESOURCE_BROKER, "-1", change(&[], &[])), "INVALID_REQUEST");
        let broker_0 = alter_configs(
            &image,
            CONFIG_RESOURCE_BROKER,
            "0",
            &change(&[("log.retention.ms", "5")], &[]),
        );
        assert_eq!(broker_0.unwrap().len(), 1, "broker ids start at 0");
        assert_eq!(
            code(
                CONFIG_RESOURCE_TOPIC,
                "orders",
                change(&[("retention.ms", "1")], &["retention.ms"])
            ),
            "INVALID_REQUEST"
        );
        // The cluster default (a broker resource with no name) takes any key.
        let default = alter_configs(
            &image,
            CONFIG_RESOURCE_BROKER,
            "",
            &change(&[("log.retention.ms", "5")], &[]),
        );
        assert_eq!(default.unwrap().len(), 1);
    }
}
