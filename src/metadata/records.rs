//! The metadata log's records, with the names and apiKeys of Kafka's
//! (`metadata/src/main/resources/common/metadata/*.json`).
//!
//! The raft layer replicates opaque data records; a metadata record is
//! the bytes of one data record, framed as
//!
//! ```text
//! api_key: u16 (big-endian) | version: u16 (big-endian) | body
//! ```
//!
//! where the body is the bincode encoding of that record type at that
//! version, with variable-width integers (a small id or count is one
//! byte: a partition record takes about 40 bytes, where fixed-width ones
//! took about 100), a byte limit, and no trailing bytes. Every type is at version 0 in this
//! build. A record whose apiKey this build does not know, or whose version
//! is newer than it knows, is an error that names it: replay stops on it,
//! loudly, rather than skip what it cannot read.

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use bincode::Options;

/// A broker's id (`node.id` of a broker or combined node).
pub type BrokerId = i32;

/// The most bytes one metadata record's body may take when decoded: a
/// batch holds at most 8 MiB.
const MAX_RECORD_BYTES: u64 = 8 << 20;

/// The body encoding: variable-width integers, big-endian where fixed,
/// at most `limit` bytes, nothing after the value.
fn body_options(limit: u64) -> impl Options {
    bincode::DefaultOptions::new()
        .with_varint_encoding()
        .with_big_endian()
        .with_limit(limit)
        .reject_trailing_bytes()
}

fn encode<T: Serialize>(value: &T) -> Vec<u8> {
    body_options(u64::MAX)
        .serialize(value)
        .expect("in-memory values always encode")
}

/// The frame before the body: apiKey and version.
const HEADER_BYTES: usize = 4;

/// The record types: each variant's name is Kafka's (without "Record"),
/// then its apiKey and the newest version this build reads and writes.
/// The enum, its apiKeys, its encoding and its decoding all come from this
/// one list.
macro_rules! metadata_records {
    ($($variant:ident($record:ident) = $api_key:literal, version $version:literal;)*) => {
        /// One metadata record.
        #[derive(Clone, Debug, PartialEq, Eq)]
        pub enum MetadataRecord {
            $($variant($record),)*
        }

        /// Every record type this build knows: its name, apiKey and
        /// newest version.
        pub const RECORD_TYPES: &[(&str, u16, u16)] = &[$((stringify!($variant), $api_key, $version),)*];

        impl MetadataRecord {
            /// Kafka's apiKey of this record's type.
            pub fn api_key(&self) -> u16 {
                match self {
                    $(MetadataRecord::$variant(_) => $api_key,)*
                }
            }

            /// The record's fields as JSON (`GET /v1/log` in metadata mode).
            pub fn fields_json(&self) -> serde_json::Value {
                match self {
                    $(MetadataRecord::$variant(r) => serde_json::to_value(r).unwrap_or(serde_json::Value::Null),)*
                }
            }

            fn encode_body(&self) -> Vec<u8> {
                match self {
                    $(MetadataRecord::$variant(r) => encode(r),)*
                }
            }

            /// The body as the type `frame` names (one this build knows).
            fn decode_body(frame: &Frame, body: &[u8]) -> Result<MetadataRecord, RecordError> {
                match frame.api_key {
                    $($api_key => Ok(MetadataRecord::$variant(frame.read(body)?)),)*
                    _ => unreachable!("frames are read only for known apiKeys"),
                }
            }
        }
    };
}

metadata_records! {
    RegisterBroker(RegisterBrokerRecord) = 0, version 0;
    UnregisterBroker(UnregisterBrokerRecord) = 1, version 0;
    Topic(TopicRecord) = 2, version 0;
    Partition(PartitionRecord) = 3, version 0;
    Config(ConfigRecord) = 4, version 0;
    PartitionChange(PartitionChangeRecord) = 5, version 0;
    FenceBroker(FenceBrokerRecord) = 7, version 0;
    UnfenceBroker(UnfenceBrokerRecord) = 8, version 0;
    RemoveTopic(RemoveTopicRecord) = 9, version 0;
    FeatureLevel(FeatureLevelRecord) = 12, version 0;
    BrokerRegistrationChange(BrokerRegistrationChangeRecord) = 17, version 0;
    NoOp(NoOpRecord) = 20, version 0;
}

/// A broker joins (or rejoins with a new incarnation). Its epoch is the
/// offset of this record.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegisterBrokerRecord {
    pub broker_id: BrokerId,
    /// Unique per start of the broker process.
    pub incarnation_id: Uuid,
    pub broker_epoch: i64,
    pub endpoints: Vec<BrokerEndpoint>,
    /// The features the broker supports, with their level ranges.
    pub features: Vec<BrokerFeature>,
    pub rack: Option<String>,
    pub fenced: bool,
    pub in_controlled_shutdown: bool,
}

/// One listener a broker advertises (`name://host:port`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BrokerEndpoint {
    pub name: String,
    pub host: String,
    pub port: u16,
    /// Kafka's SecurityProtocol id (0 PLAINTEXT, 1 SSL, 2 SASL_PLAINTEXT,
    /// 3 SASL_SSL).
    pub security_protocol: i16,
}

/// A feature a broker supports: the levels from `min_supported` to
/// `max_supported`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BrokerFeature {
    pub name: String,
    pub min_supported: i16,
    pub max_supported: i16,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct UnregisterBrokerRecord {
    pub broker_id: BrokerId,
    pub broker_epoch: i64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopicRecord {
    pub name: String,
    pub topic_id: Uuid,
}

/// A partition as created (or as a snapshot holds it).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartitionRecord {
    pub partition_id: i32,
    pub topic_id: Uuid,
    pub replicas: Vec<BrokerId>,
    pub isr: Vec<BrokerId>,
    pub removing_replicas: Vec<BrokerId>,
    pub adding_replicas: Vec<BrokerId>,
    /// The leader, or [`NO_LEADER`].
    pub leader: BrokerId,
    pub leader_epoch: i32,
    pub partition_epoch: i32,
}

/// A partition's leader when it has none.
pub const NO_LEADER: BrokerId = -1;

/// Kafka's ConfigResource types that kraft keeps configs for.
pub const CONFIG_RESOURCE_TOPIC: i8 = 2;
pub const CONFIG_RESOURCE_BROKER: i8 = 4;

/// One config key set (`value: Some`) or deleted (`None`) on a resource: a
/// topic, a broker, or the cluster default (a broker resource with an
/// empty name).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConfigRecord {
    /// [`CONFIG_RESOURCE_TOPIC`] or [`CONFIG_RESOURCE_BROKER`].
    pub resource_type: i8,
    pub resource_name: String,
    pub name: String,
    pub value: Option<String>,
}

/// What changed in a partition; `None` is "unchanged".
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartitionChangeRecord {
    pub partition_id: i32,
    pub topic_id: Uuid,
    pub isr: Option<Vec<BrokerId>>,
    /// The new leader ([`NO_LEADER`] for none). A new leader starts a new
    /// leader epoch.
    pub leader: Option<BrokerId>,
    pub replicas: Option<Vec<BrokerId>>,
    pub removing_replicas: Option<Vec<BrokerId>>,
    pub adding_replicas: Option<Vec<BrokerId>>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FenceBrokerRecord {
    pub id: BrokerId,
    pub epoch: i64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct UnfenceBrokerRecord {
    pub id: BrokerId,
    pub epoch: i64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemoveTopicRecord {
    pub topic_id: Uuid,
}

/// A finalized feature level (`metadata.version` first in every log);
/// level 0 removes the feature.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FeatureLevelRecord {
    pub name: String,
    pub feature_level: i16,
}

/// A change to a registered broker; `None` is "unchanged".
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BrokerRegistrationChangeRecord {
    pub broker_id: BrokerId,
    pub broker_epoch: i64,
    pub fenced: Option<bool>,
    pub in_controlled_shutdown: Option<bool>,
}

/// Written by an idle active controller so the log moves (and its
/// followers see it alive); changes nothing.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NoOpRecord {}

/// Why bytes are not a metadata record this build can apply.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RecordError {
    #[error("a metadata record of {len} bytes is shorter than its {HEADER_BYTES}-byte apiKey and version")]
    Truncated { len: usize },
    #[error("unknown metadata record apiKey {api_key} (version {version}): written by a newer kraft?")]
    UnknownApiKey { api_key: u16, version: u16 },
    #[error("{name} record (apiKey {api_key}) version {version} is newer than this build reads (up to {newest})")]
    NewerVersion {
        name: &'static str,
        api_key: u16,
        version: u16,
        newest: u16,
    },
    #[error("{name} record (apiKey {api_key}) version {version} does not decode: {reason}")]
    Malformed {
        name: &'static str,
        api_key: u16,
        version: u16,
        reason: String,
    },
}

impl MetadataRecord {
    /// Kafka's name of this record's type (without "Record").
    pub fn name(&self) -> &'static str {
        record_type(self.api_key()).expect("every variant is in RECORD_TYPES").0
    }

    /// The record as the bytes of one data record: apiKey, version, body.
    pub fn encode(&self) -> Vec<u8> {
        let body = self.encode_body();
        let mut bytes = Vec::with_capacity(HEADER_BYTES + body.len());
        bytes.extend_from_slice(&self.api_key().to_be_bytes());
        let (_, version) = record_type(self.api_key()).expect("every variant is in RECORD_TYPES");
        bytes.extend_from_slice(&version.to_be_bytes());
        bytes.extend_from_slice(&body);
        bytes
    }

    /// Reads one record from the bytes of a data record. Never panics on
    /// any input.
    pub fn decode(bytes: &[u8]) -> Result<MetadataRecord, RecordError> {
        let (Some(key), Some(version)) = (bytes.get(0..2), bytes.get(2..HEADER_BYTES)) else {
            return Err(RecordError::Truncated { len: bytes.len() });
        };
        let api_key = u16::from_be_bytes([key[0], key[1]]);
        let version = u16::from_be_bytes([version[0], version[1]]);
        let Some((name, newest)) = record_type(api_key) else {
            return Err(RecordError::UnknownApiKey { api_key, version });
        };
        if version > newest {
            return Err(RecordError::NewerVersion {
                name,
                api_key,
                version,
                newest,
            });
        }
        let frame = Frame { name, api_key, version };
        MetadataRecord::decode_body(&frame, &bytes[HEADER_BYTES..])
    }
}

/// A record's type and version, read from its frame.
struct Frame {
    name: &'static str,
    api_key: u16,
    version: u16,
}

impl Frame {
    /// The body as the record type the frame names.
    fn read<T: serde::de::DeserializeOwned>(&self, body: &[u8]) -> Result<T, RecordError> {
        let decoded = match body.len() as u64 > MAX_RECORD_BYTES {
            true => Err(format!("{} bytes, more than {MAX_RECORD_BYTES}", body.len())),
            false => body_options(MAX_RECORD_BYTES)
                .deserialize(body)
                .map_err(|e| e.to_string()),
        };
        decoded.map_err(|reason| RecordError::Malformed {
            name: self.name,
            api_key: self.api_key,
            version: self.version,
            reason,
        })
    }
}

/// The name and newest version of the record type with `api_key`.
fn record_type(api_key: u16) -> Option<(&'static str, u16)> {
    RECORD_TYPES
        .iter()
        .find(|(_, key, _)| *key == api_key)
        .map(|(name, _, version)| (*name, *version))
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn uuid(n: u8) -> Uuid {
        Uuid::from_bytes([n; 16])
    }

    /// One record of every type, with every field away from its default.
    fn one_of_each() -> Vec<MetadataRecord> {
        vec![
            MetadataRecord::RegisterBroker(RegisterBrokerRecord {
                broker_id: 4,
                incarnation_id: uuid(1),
                broker_epoch: 17,
                endpoints: vec![BrokerEndpoint {
                    name: "PLAINTEXT".into(),
                    host: "127.0.0.1".into(),
                    port: 9092,
                    security_protocol: 0,
                }],
                features: vec![BrokerFeature {
                    name: "metadata.version".into(),
                    min_supported: 1,
                    max_supported: 3,
                }],
                rack: Some("r1".into()),
                fenced: true,
                in_controlled_shutdown: false,
            }),
            MetadataRecord::UnregisterBroker(UnregisterBrokerRecord {
                broker_id: 4,
                broker_epoch: 17,
            }),
            MetadataRecord::Topic(TopicRecord {
                name: "orders".into(),
                topic_id: uuid(2),
            }),
            MetadataRecord::Partition(PartitionRecord {
                partition_id: 3,
                topic_id: uuid(2),
                replicas: vec![4, 5, 6],
                isr: vec![4, 5],
                removing_replicas: vec![6],
                adding_replicas: vec![7],
                leader: 4,
                leader_epoch: 2,
                partition_epoch: 9,
            }),
            MetadataRecord::Config(ConfigRecord {
                resource_type: CONFIG_RESOURCE_TOPIC,
                resource_name: "orders".into(),
                name: "retention.ms".into(),
                value: None,
            }),
            MetadataRecord::PartitionChange(PartitionChangeRecord {
                partition_id: 3,
                topic_id: uuid(2),
                isr: Some(vec![4]),
                leader: Some(NO_LEADER),
                replicas: None,
                removing_replicas: Some(vec![]),
                adding_replicas: None,
            }),
            MetadataRecord::FenceBroker(FenceBrokerRecord { id: 5, epoch: 30 }),
            MetadataRecord::UnfenceBroker(UnfenceBrokerRecord { id: 5, epoch: 30 }),
            MetadataRecord::RemoveTopic(RemoveTopicRecord { topic_id: uuid(2) }),
            MetadataRecord::FeatureLevel(FeatureLevelRecord {
                name: "metadata.version".into(),
                feature_level: 3,
            }),
            MetadataRecord::BrokerRegistrationChange(BrokerRegistrationChangeRecord {
                broker_id: 5,
                broker_epoch: 30,
                fenced: Some(false),
                in_controlled_shutdown: Some(true),
            }),
            MetadataRecord::NoOp(NoOpRecord {}),
        ]
    }

    #[test]
    fn every_record_type_has_kafkas_api_key_and_reads_back_as_written() {
        let records = one_of_each();
        let keys: Vec<(&str, u16)> = records.iter().map(|r| (r.name(), r.api_key())).collect();
        let kafka: Vec<(&str, u16)> = RECORD_TYPES.iter().map(|(name, key, _)| (*name, *key)).collect();
        assert_eq!(keys, kafka, "one record per type, in apiKey order");
        for record in records {
            let bytes = record.encode();
            assert_eq!(bytes[..2], record.api_key().to_be_bytes());
            assert_eq!(bytes[2..4], [0, 0], "version 0");
            assert_eq!(MetadataRecord::decode(&bytes), Ok(record));
        }
    }

    #[test]
    fn an_unknown_api_key_is_an_error_that_names_it() {
        for api_key in [6u16, 10, 21, u16::MAX] {
            let mut bytes = api_key.to_be_bytes().to_vec();
            bytes.extend_from_slice(&[0, 0]);
            let error = MetadataRecord::decode(&bytes).unwrap_err();
            assert_eq!(error, RecordError::UnknownApiKey { api_key, version: 0 });
            assert!(error.to_string().contains(&format!("apiKey {api_key}")), "{error}");
        }
    }

    #[test]
    fn a_version_newer_than_this_build_reads_is_an_error_that_names_it() {
        let mut bytes = MetadataRecord::Topic(TopicRecord {
            name: "t".into(),
            topic_id: uuid(1),
        })
        .encode();
        bytes[2..4].copy_from_slice(&1u16.to_be_bytes());
        let error = MetadataRecord::decode(&bytes).unwrap_err();
        assert_eq!(
            error,
            RecordError::NewerVersion {
                name: "Topic",
                api_key: 2,
                version: 1,
                newest: 0
            }
        );
        assert!(
            error.to_string().contains("Topic record (apiKey 2) version 1"),
            "{error}"
        );
    }

    #[test]
    fn short_cut_or_padded_records_are_errors() {
        assert_eq!(
            MetadataRecord::decode(&[0, 2, 0]),
            Err(RecordError::Truncated { len: 3 })
        );
        let whole = MetadataRecord::FenceBroker(FenceBrokerRecord { id: 1, epoch: 2 }).encode();
        let cut = &whole[..whole.len() - 1];
        assert!(matches!(
            MetadataRecord::decode(cut),
            Err(RecordError::Malformed {
                name: "FenceBroker",
                ..
            })
        ));
        let mut padded = whole.clone();
        padded.push(0);
        assert!(matches!(
            MetadataRecord::decode(&padded),
            Err(RecordError::Malformed {
                name: "FenceBroker",
                ..
            })
        ));
    }

    proptest! {
        #[test]
        fn any_bytes_decode_or_fail_without_panicking(bytes in proptest::collection::vec(any::<u8>(), 0..64), key in 0u16..24) {
            let mut framed = key.to_be_bytes().to_vec();
            framed.extend_from_slice(&[0, 0]);
            framed.extend_from_slice(&bytes);
            let _ = MetadataRecord::decode(&bytes);
            if let Ok(record) = MetadataRecord::decode(&framed) {
                prop_assert_eq!(MetadataRecord::decode(&record.encode()), Ok(record));
            }
        }
    }
}
