//! The metadata resources of the HTTP API (a node in `"metadata"` mode):
//! reads of the image this node replayed, each saying which offset it
//! reflects, and the controller's operations, answered once committed.
//!
//! | route | answer |
//! |---|---|
//! | `GET /v1/image` | `{"offset", "epoch", "features", "brokers", "topics", "configs"}` |
//! | `GET /v1/brokers`, `GET /v1/brokers/{id}` | `{"offset", "brokers": [...]}`, one broker |
//! | `POST /v1/brokers` `{"id", "incarnation_id", "listeners", "rack"}` | `{"id", "epoch"}` |
//! | `POST /v1/brokers/{id}/heartbeat` `{"epoch", "metadata_offset", "want_fence", "want_shutdown"}` | `{"is_fenced", "is_caught_up", "should_shut_down"}` |
//! | `DELETE /v1/brokers/{id}` | `{"id"}` |
//! | `GET /v1/topics` | `{"offset", "topics": [{"name", "id", "partitions"}]}` |
//! | `POST /v1/topics` `{"name", "partitions", "replication_factor", "configs"}` or `{"name", "assignments", "configs"}` | the topic |
//! | `GET /v1/topics/{name}`, `DELETE /v1/topics/{name}` | the topic, `{"name", "id"}` |
//! | `POST /v1/topics/{name}/partitions` `{"count"}` | the topic |
//! | `GET /v1/configs/{topic\|broker}/{name}` | `{"offset", "configs": {key: value}}` |
//! | `PATCH /v1/configs/{topic\|broker}/{name}` `{"set": {}, "delete": []}` | the same, once committed |
//! | `GET /v1/features`, `PATCH /v1/features` `{name: level}` | `{"offset", "features": {name: level}}` |
//! | `POST /v1/partitions/alter` (AlterPartition) | `{"offset", "topics": [{"topic_id", "partitions": [{"partition", "error", "leader", "leader_epoch", "partition_epoch", "isr"}]}]}` |
//! | `POST /v1/partitions/elect` `{"topic", "partition"}` | the partition with its preferred replica leading |
//!
//! Errors carry Kafka's names (see [`ApiError`]).

use std::collections::BTreeMap;

use actix_web::{web, HttpRequest, HttpResponse};
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::{json, Value};
use uuid::Uuid;

use super::{ApiError, NodeApi};
use crate::messages::controller::HeartbeatAnswer;
use crate::messages::Record;
use crate::metadata::controller::{
    supported_features, BrokerRegistrationRequest, ConfigChange, ControllerError, IsrChange, NewTopic, TopicLayout,
};
use crate::metadata::image::{BrokerRegistration, MetadataImage, TopicImage};
use crate::metadata::records::{
    BrokerEndpoint, BrokerFeature, BrokerId, MetadataRecord, CONFIG_RESOURCE_BROKER, CONFIG_RESOURCE_TOPIC,
};
use crate::node::Operation;
use crate::node::RecordPage;

/// Kafka's SecurityProtocol names, by id.
const SECURITY_PROTOCOLS: [&str; 4] = ["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"];

/// The image of a node that keeps one.
fn image_of<N: NodeApi>(node: &N) -> Result<MetadataImage, ApiError> {
    node.metadata_image().ok_or_else(|| {
        ApiError::from(ControllerError::InvalidRequest(
            "this node keeps no metadata image: node.state_machine is not \"metadata\"".to_string(),
        ))
    })
}

/// The image of a node that keeps one, for a read: with
/// `?consistency=linearizable`, once it reflects every write acknowledged
/// before the request (see [`super::consistent`]).
async fn read_image<N: NodeApi>(node: &N, req: &HttpRequest) -> Result<MetadataImage, ApiError> {
    image_of(node)?;
    super::consistent(node, req).await?;
    image_of(node)
}

/// A request body as `T`, with a message naming what was expected.
fn body<T: DeserializeOwned>(bytes: &[u8], expected: &str) -> Result<T, ApiError> {
    serde_json::from_slice(bytes).map_err(|e| ApiError::bad_request(format!("body must be {expected}: {e}")))
}

pub(super) fn broker_json(broker: &BrokerRegistration) -> Value {
    json!({
        "id": broker.id,
        "epoch": broker.epoch,
        "incarnation_id": broker.incarnation_id,
        "listeners": broker.listeners.iter().map(|l| json!({
            "name": l.name,
            "host": l.host,
            "port": l.port,
            "security_protocol": SECURITY_PROTOCOLS.get(l.security_protocol as usize).copied().unwrap_or("UNKNOWN"),
        })).collect::<Vec<_>>(),
        "rack": broker.rack,
        "fenced": broker.fenced,
        "in_controlled_shutdown": broker.in_controlled_shutdown,
    })
}

fn topic_json(image: &MetadataImage, topic: &TopicImage) -> Value {
    let configs = image
        .configs
        .iter()
        .find(|(resource, _)| resource.resource_type == CONFIG_RESOURCE_TOPIC && resource.name == topic.name)
        .map(|(_, keys)| keys.iter().map(|(k, v)| (k.clone(), json!(v))).collect())
        .unwrap_or_else(serde_json::Map::new);
    json!({
        "offset": image.offset,
        "name": topic.name,
        "id": topic.id,
        "partitions": topic.partitions.iter().map(|(id, p)| json!({
            "partition": id,
            "replicas": p.replicas,
            "isr": p.isr,
            "leader": p.leader,
            "leader_epoch": p.leader_epoch,
            "partition_epoch": p.partition_epoch,
        })).collect::<Vec<_>>(),
        "configs": configs,
    })
}

fn configs_of(image: &MetadataImage, resource_type: i8, name: &str) -> Value {
    let configs: serde_json::Map<String, Value> = image
        .configs
        .iter()
        .find(|(r, _)| r.resource_type == resource_type && r.name == name)
        .map(|(_, keys)| keys.iter().map(|(k, v)| (k.clone(), json!(v))).collect())
        .unwrap_or_default();
    json!({ "offset": image.offset, "configs": configs })
}

/// A page of the log of a metadata node: each data record decoded, its
/// `kind` the record type's name (`TopicRecord`) and `record` its fields.
pub(super) fn log_page(page: RecordPage) -> Value {
    let records: Vec<Value> = page
        .records
        .iter()
        .map(|committed| {
            let mut entry = json!({
                "offset": committed.offset,
                "epoch": committed.epoch,
                "kind": committed.record.kind(),
            });
            if let Record::Data(bytes) = &committed.record {
                match MetadataRecord::decode(bytes) {
                    Ok(record) => {
                        entry["kind"] = json!(format!("{}Record", record.name()));
                        entry["record"] = record.fields_json();
                    }
                    Err(e) => {
                        entry["kind"] = json!("undecodable");
                        entry["error"] = json!(e.to_string());
                    }
                }
            }
            entry
        })
        .collect();
    json!({
        "high_watermark": page.high_watermark,
        "log_start_offset": page.log_start_offset,
        "records": records,
    })
}

pub(super) async fn image<N: NodeApi>(node: web::Data<N>, req: HttpRequest) -> Result<HttpResponse, ApiError> {
    let image = read_image(node.get_ref(), &req).await?;
    let configs: Vec<Value> = image
        .configs
        .iter()
        .map(|(resource, keys)| {
            json!({
                "resource_type": if resource.resource_type == CONFIG_RESOURCE_TOPIC { "topic" } else { "broker" },
                "name": resource.name,
                "configs": keys.iter().map(|(k, v)| (k.clone(), json!(v))).collect::<serde_json::Map<_, _>>(),
            })
        })
        .collect();
    Ok(HttpResponse::Ok().json(json!({
        "offset": image.offset,
        "epoch": image.epoch,
        "features": image.features.iter().map(|(k, v)| (k.clone(), json!(v))).collect::<serde_json::Map<_, _>>(),
        "brokers": image.brokers.values().map(broker_json).collect::<Vec<_>>(),
        "topics": image.topics_by_id.values().map(|t| topic_json(&image, t)).collect::<Vec<_>>(),
        "configs": configs,
    })))
}

pub(super) async fn brokers<N: NodeApi>(node: web::Data<N>, req: HttpRequest) -> Result<HttpResponse, ApiError> {
    let image = read_image(node.get_ref(), &req).await?;
    Ok(HttpResponse::Ok().json(json!({
        "offset": image.offset,
        "brokers": image.brokers.values().map(broker_json).collect::<Vec<_>>(),
    })))
}

fn broker_id(text: &str) -> Result<BrokerId, ApiError> {
    text.parse::<BrokerId>().ok().filter(|id| *id >= 0).ok_or_else(|| {
        ApiError::bad_request(format!(
            "a broker id is an integer >= 0, not {:?}",
            super::truncated(text)
        ))
    })
}

pub(super) async fn broker<N: NodeApi>(
    node: web::Data<N>,
    path: web::Path<String>,
    req: HttpRequest,
) -> Result<HttpResponse, ApiError> {
    let id = broker_id(&path)?;
    let image = read_image(node.get_ref(), &req).await?;
    let broker = image.brokers.get(&id).ok_or_else(|| {
        ApiError::from(ControllerError::BrokerIdNotRegistered(format!(
            "broker {id} is not registered"
        )))
    })?;
    let mut answer = broker_json(broker);
    answer["offset"] = json!(image.offset);
    Ok(HttpResponse::Ok().json(answer))
}

/// Every write body of the metadata resources, decoded from `data` (for
/// the fuzz targets).
pub(super) fn fuzz_bodies(data: &[u8]) {
    let _ = body::<RegisterBody>(data, "");
    let _ = body::<HeartbeatBody>(data, "");
    let _ = body::<CreateTopicBody>(data, "");
    let _ = body::<PartitionsBody>(data, "");
    let _ = body::<ConfigsBody>(data, "");
    let _ = body::<AlterBody>(data, "");
    let _ = body::<ElectBody>(data, "");
    let _ = body::<BTreeMap<String, i16>>(data, "");
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ListenerBody {
    name: String,
    host: String,
    port: u16,
    #[serde(default)]
    security_protocol: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RegisterBody {
    id: BrokerId,
    incarnation_id: Uuid,
    #[serde(default)]
    listeners: Vec<ListenerBody>,
    #[serde(default)]
    rack: Option<String>,
    /// What the broker supports; this build's features when not given.
    #[serde(default)]
    features: Option<Vec<FeatureBody>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FeatureBody {
    name: String,
    min_supported: i16,
    max_supported: i16,
}

/// Listeners as a registration carries them.
pub(crate) fn endpoints(listeners: Vec<(String, String, u16, Option<String>)>) -> Result<Vec<BrokerEndpoint>, String> {
    listeners
        .into_iter()
        .map(|(name, host, port, protocol)| {
            let protocol = protocol.unwrap_or_else(|| "PLAINTEXT".to_string());
            let security_protocol = SECURITY_PROTOCOLS
                .iter()
                .position(|p| *p == protocol)
                .ok_or_else(|| format!("security_protocol {protocol:?} is not one of {SECURITY_PROTOCOLS:?}"))?;
            if name.is_empty() || host.is_empty() {
                return Err("a listener has a name and a host".to_string());
            }
            Ok(BrokerEndpoint {
                name,
                host,
                port,
                security_protocol: security_protocol as i16,
            })
        })
        .collect()
}

pub(super) async fn register_broker<N: NodeApi>(
    node: web::Data<N>,
    bytes: web::Bytes,
) -> Result<HttpResponse, ApiError> {
    const EXPECTED: &str =
        "{\"id\": int, \"incarnation_id\": uuid, \"listeners\": [{\"name\", \"host\", \"port\", \"security_protocol\"}], \"rack\": string|null}";
    let request: RegisterBody = body(&bytes, EXPECTED)?;
    let listeners = endpoints(
        request
            .listeners
            .into_iter()
            .map(|l| (l.name, l.host, l.port, l.security_protocol))
            .collect(),
    )
    .map_err(ApiError::bad_request)?;
    let answer = node
        .operate(Operation::RegisterBroker(BrokerRegistrationRequest {
            broker_id: request.id,
            incarnation_id: request.incarnation_id,
            listeners,
            rack: request.rack,
            features: match request.features {
                Some(features) => features
                    .into_iter()
                    .map(|f| BrokerFeature {
                        name: f.name,
                        min_supported: f.min_supported,
                        max_supported: f.max_supported,
                    })
                    .collect(),
                None => supported_features(),
            },
        }))
        .await?;
    Ok(HttpResponse::Ok().json(json!({ "id": request.id, "epoch": answer.broker_epoch })))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct HeartbeatBody {
    epoch: i64,
    metadata_offset: i64,
    #[serde(default)]
    want_fence: bool,
    #[serde(default)]
    want_shutdown: bool,
}

pub(super) async fn heartbeat<N: NodeApi>(
    node: web::Data<N>,
    path: web::Path<String>,
    bytes: web::Bytes,
) -> Result<HttpResponse, ApiError> {
    let id = broker_id(&path)?;
    let request: HeartbeatBody = body(
        &bytes,
        "{\"epoch\": int, \"metadata_offset\": int, \"want_fence\": bool, \"want_shutdown\": bool}",
    )?;
    let answer = node
        .operate(Operation::BrokerHeartbeat {
            broker_id: id,
            broker_epoch: request.epoch,
            metadata_offset: request.metadata_offset,
            want_fence: request.want_fence,
            want_shutdown: request.want_shutdown,
        })
        .await?;
    let answer = answer.heartbeat.unwrap_or(HeartbeatAnswer {
        is_fenced: true,
        is_caught_up: false,
        should_shut_down: false,
    });
    Ok(HttpResponse::Ok().json(answer))
}

pub(super) async fn unregister_broker<N: NodeApi>(
    node: web::Data<N>,
    path: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let id = broker_id(&path)?;
    node.operate(Operation::UnregisterBroker { broker_id: id }).await?;
    Ok(HttpResponse::Ok().json(json!({ "id": id })))
}

pub(super) async fn topics<N: NodeApi>(node: web::Data<N>, req: HttpRequest) -> Result<HttpResponse, ApiError> {
    let image = read_image(node.get_ref(), &req).await?;
    let topics: Vec<Value> = image
        .topic_ids_by_name
        .iter()
        .filter_map(|(_, id)| image.topics_by_id.get(id))
        .map(|t| json!({ "name": t.name, "id": t.id, "partitions": t.partitions.len() }))
        .collect();
    Ok(HttpResponse::Ok().json(json!({ "offset": image.offset, "topics": topics })))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CreateTopicBody {
    name: String,
    partitions: Option<i32>,
    replication_factor: Option<i16>,
    assignments: Option<Vec<Vec<BrokerId>>>,
    #[serde(default)]
    configs: BTreeMap<String, String>,
}

fn unknown_topic(name: &str) -> ApiError {
    ApiError::from(ControllerError::UnknownTopicOrPartition(format!(
        "no topic is named {:?}",
        super::truncated(name)
    )))
}

/// The topic `name` as `image` shows it.
fn topic_answer(image: &MetadataImage, name: &str) -> Result<HttpResponse, ApiError> {
    let topic = image.topic(name).ok_or_else(|| unknown_topic(name))?;
    Ok(HttpResponse::Ok().json(topic_json(image, topic)))
}

pub(super) async fn create_topic<N: NodeApi>(node: web::Data<N>, bytes: web::Bytes) -> Result<HttpResponse, ApiError> {
    const EXPECTED: &str = "{\"name\": string, \"partitions\": int, \"replication_factor\": int, \"configs\": {}} \
                            or {\"name\": string, \"assignments\": [[broker ids]], \"configs\": {}}";
    let request: CreateTopicBody = body(&bytes, EXPECTED)?;
    let layout = match (request.partitions, request.replication_factor, request.assignments) {
        (None, None, Some(assignments)) => TopicLayout::Assignments(assignments),
        (Some(partitions), Some(replication_factor), None) => TopicLayout::Counts {
            partitions,
            replication_factor,
        },
        (Some(partitions), None, None) => TopicLayout::Counts {
            partitions,
            replication_factor: 1,
        },
        _ => return Err(ApiError::bad_request(format!("body must be {EXPECTED}"))),
    };
    let name = request.name.clone();
    let answer = node
        .operate(Operation::CreateTopic(NewTopic {
            name: request.name,
            layout,
            configs: request.configs,
        }))
        .await?;
    topic_answer(&answer.image, &name)
}

pub(super) async fn topic<N: NodeApi>(
    node: web::Data<N>,
    path: web::Path<String>,
    req: HttpRequest,
) -> Result<HttpResponse, ApiError> {
    topic_answer(&read_image(node.get_ref(), &req).await?, &path)
}

pub(super) async fn delete_topic<N: NodeApi>(
    node: web::Data<N>,
    path: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let name = path.into_inner();
    let id = node.metadata_image().and_then(|i| i.topic(&name).map(|t| t.id));
    node.operate(Operation::DeleteTopic { name: name.clone() }).await?;
    Ok(HttpResponse::Ok().json(json!({ "name": name, "id": id })))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PartitionsBody {
    count: i32,
}

pub(super) async fn create_partitions<N: NodeApi>(
    node: web::Data<N>,
    path: web::Path<String>,
    bytes: web::Bytes,
) -> Result<HttpResponse, ApiError> {
    let name = path.into_inner();
    let request: PartitionsBody = body(&bytes, "{\"count\": int (the new total)}")?;
    let answer = node
        .operate(Operation::CreatePartitions {
            name: name.clone(),
            count: request.count,
        })
        .await?;
    topic_answer(&answer.image, &name)
}

fn resource_type(kind: &str) -> Result<i8, ApiError> {
    match kind {
        "topic" => Ok(CONFIG_RESOURCE_TOPIC),
        "broker" => Ok(CONFIG_RESOURCE_BROKER),
        other => Err(ApiError::NotFound(format!(
            "configs are kept for \"topic\" and \"broker\" resources, not {:?}",
            super::truncated(other)
        ))),
    }
}

pub(super) async fn configs<N: NodeApi>(
    node: web::Data<N>,
    path: web::Path<(String, String)>,
    req: HttpRequest,
) -> Result<HttpResponse, ApiError> {
    let (kind, name) = path.into_inner();
    let image = read_image(node.get_ref(), &req).await?;
    read_configs(&image, &kind, &name)
}

fn read_configs(image: &MetadataImage, kind: &str, name: &str) -> Result<HttpResponse, ApiError> {
    let resource_type = resource_type(kind)?;
    if resource_type == CONFIG_RESOURCE_TOPIC && image.topic(name).is_none() {
        return Err(unknown_topic(name));
    }
    Ok(HttpResponse::Ok().json(configs_of(image, resource_type, name)))
}

/// `/v1/configs/broker/` (the cluster default): the same with an empty name.
pub(super) async fn default_configs<N: NodeApi>(
    node: web::Data<N>,
    path: web::Path<String>,
    req: HttpRequest,
) -> Result<HttpResponse, ApiError> {
    let image = read_image(node.get_ref(), &req).await?;
    read_configs(&image, &path, "")
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ConfigsBody {
    #[serde(default)]
    set: BTreeMap<String, String>,
    #[serde(default)]
    delete: Vec<String>,
}

pub(super) async fn alter_configs<N: NodeApi>(
    node: web::Data<N>,
    path: web::Path<(String, String)>,
    bytes: web::Bytes,
) -> Result<HttpResponse, ApiError> {
    let (kind, name) = path.into_inner();
    write_configs(node.get_ref(), &kind, name, &bytes).await
}

async fn write_configs<N: NodeApi>(node: &N, kind: &str, name: String, bytes: &[u8]) -> Result<HttpResponse, ApiError> {
    let resource_type = resource_type(kind)?;
    let request: ConfigsBody = body(bytes, "{\"set\": {key: value}, \"delete\": [key]}")?;
    let answer = node
        .operate(Operation::AlterConfigs {
            resource_type,
            name: name.clone(),
            change: ConfigChange {
                set: request.set,
                delete: request.delete,
            },
        })
        .await?;
    Ok(HttpResponse::Ok().json(configs_of(&answer.image, resource_type, &name)))
}

pub(super) async fn alter_default_configs<N: NodeApi>(
    node: web::Data<N>,
    path: web::Path<String>,
    bytes: web::Bytes,
) -> Result<HttpResponse, ApiError> {
    write_configs(node.get_ref(), &path, String::new(), &bytes).await
}

fn features_json(image: &MetadataImage) -> Value {
    json!({
        "offset": image.offset,
        "features": image.features.iter().map(|(k, v)| (k.clone(), json!(v))).collect::<serde_json::Map<_, _>>(),
    })
}

pub(super) async fn features<N: NodeApi>(node: web::Data<N>, req: HttpRequest) -> Result<HttpResponse, ApiError> {
    Ok(HttpResponse::Ok().json(features_json(&read_image(node.get_ref(), &req).await?)))
}

pub(super) async fn update_features<N: NodeApi>(
    node: web::Data<N>,
    bytes: web::Bytes,
) -> Result<HttpResponse, ApiError> {
    let levels: BTreeMap<String, i16> = body(&bytes, "{name: level, ...} (level 0 removes a feature)")?;
    let answer = node.operate(Operation::UpdateFeatures { levels }).await?;
    Ok(HttpResponse::Ok().json(features_json(&answer.image)))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AlterBody {
    broker_id: BrokerId,
    broker_epoch: i64,
    topics: Vec<AlterTopicBody>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AlterTopicBody {
    topic_id: Uuid,
    partitions: Vec<AlterPartitionBody>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AlterPartitionBody {
    partition: i32,
    leader_epoch: i32,
    partition_epoch: i32,
    new_isr: Vec<BrokerId>,
}

/// AlterPartition: each partition's result, with Kafka's error name when
/// it was refused, else the partition as it now is.
pub(super) async fn alter_partitions<N: NodeApi>(
    node: web::Data<N>,
    bytes: web::Bytes,
) -> Result<HttpResponse, ApiError> {
    let request: AlterBody = body(
        &bytes,
        "{\"broker_id\", \"broker_epoch\", \"topics\": [{\"topic_id\", \"partitions\": [{\"partition\", \"leader_epoch\", \"partition_epoch\", \"new_isr\"}]}]}",
    )?;
    let changes: Vec<IsrChange> = request
        .topics
        .iter()
        .flat_map(|t| {
            t.partitions.iter().map(|p| IsrChange {
                topic_id: t.topic_id,
                partition: p.partition,
                leader_epoch: p.leader_epoch,
                partition_epoch: p.partition_epoch,
                new_isr: p.new_isr.clone(),
            })
        })
        .collect();
    let answer = node
        .operate(Operation::AlterPartitions {
            broker_id: request.broker_id,
            broker_epoch: request.broker_epoch,
            changes: changes.clone(),
        })
        .await?;
    let mut results = changes
        .iter()
        .zip(answer.refusals.iter().chain(std::iter::repeat(&None)));
    let topics: Vec<Value> = request
        .topics
        .iter()
        .map(|t| {
            let partitions: Vec<Value> = t
                .partitions
                .iter()
                .map(|_| {
                    let (change, refusal) = results.next().expect("one result per change");
                    let now = answer
                        .image
                        .topics_by_id
                        .get(&change.topic_id)
                        .and_then(|topic| topic.partitions.get(&change.partition));
                    let mut result = json!({
                        "partition": change.partition,
                        "error": refusal.as_ref().map(ControllerError::code),
                    });
                    if let Some(refusal) = refusal {
                        result["message"] = json!(refusal.message());
                    }
                    if let Some(p) = now {
                        result["leader"] = json!(p.leader);
                        result["leader_epoch"] = json!(p.leader_epoch);
                        result["partition_epoch"] = json!(p.partition_epoch);
                        result["isr"] = json!(p.isr);
                    }
                    result
                })
                .collect();
            json!({ "topic_id": t.topic_id, "partitions": partitions })
        })
        .collect();
    Ok(HttpResponse::Ok().json(json!({ "offset": answer.image.offset, "topics": topics })))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ElectBody {
    topic: String,
    partition: i32,
}

/// A preferred-leader election: the partition as it now is.
pub(super) async fn elect_leader<N: NodeApi>(node: web::Data<N>, bytes: web::Bytes) -> Result<HttpResponse, ApiError> {
    let request: ElectBody = body(&bytes, "{\"topic\": string, \"partition\": int}")?;
    let answer = node
        .operate(Operation::ElectPreferred {
            topic: request.topic.clone(),
            partition: request.partition,
        })
        .await?;
    let partition = answer
        .image
        .topic(&request.topic)
        .and_then(|t| t.partitions.get(&request.partition))
        .ok_or_else(|| unknown_topic(&request.topic))?;
    Ok(HttpResponse::Ok().json(json!({
        "offset": answer.image.offset,
        "topic": request.topic,
        "partition": request.partition,
        "leader": partition.leader,
        "leader_epoch": partition.leader_epoch,
        "partition_epoch": partition.partition_epoch,
        "isr": partition.isr,
    })))
}
