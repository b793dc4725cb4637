//! `config.toml`: the model (the README's "Configuration"), validation and command-line
//! overrides.
//!
//! Configuration is untrusted input, so it is validated once, here, into the
//! typed [`Config`] (STYLE.md rule 7). Loading goes in three steps:
//!
//! 1. the file is parsed as TOML and every `key=value` override is written
//!    over it (the value is read as a TOML value, or as a plain string when it
//!    does not parse as one: `listeners.http=127.0.0.1:0` is a string,
//!    `node.id=2` an integer, `quorum.voters=["1@h:9093"]` an array);
//! 2. the result is deserialized into `Raw*` structs with
//!    `#[serde(deny_unknown_fields)]`, so a misspelt key or table is an error
//!    instead of a silently ignored line;
//! 3. every value is checked and converted into [`Config`]. An error names
//!    where the value came from (the file or a command-line override), the
//!    key, the value and what was expected, e.g.
//!    `config.toml: quorum.election_timeout_ms = -5: expected a positive integer (milliseconds)`.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use toml::{Table, Value};

use crate::raft::snapshot_policy::SnapshotSettings;
use crate::raft::{NodeId, RaftConfig};

/// `log.max_batch_bytes` may not exceed Kafka's 8 MiB batch limit.
pub const MAX_BATCH_BYTES_LIMIT: u64 = crate::messages::MAX_BATCH_BYTES as u64;

/// Smallest `listeners.max_frame_bytes`: one 8 MiB fetch response plus 1 MiB
/// of headroom for the envelope. A smaller limit would make a follower refuse
/// the leader's full fetch responses forever (replication would stall).
pub const MIN_MAX_FRAME_BYTES: u64 = MAX_BATCH_BYTES_LIMIT + 1024 * 1024;

/// Largest accepted millisecond value (ten years). Far above any sensible
/// setting, and low enough that `Instant + Duration` can never overflow.
pub const MAX_MS: u64 = 10 * 365 * 24 * 3600 * 1000;

/// Longest `node.cluster_id`.
pub const MAX_CLUSTER_ID_LEN: usize = 255;

const TLS_FILE_EXPECTED: &str = "a path to a PEM file, or \"\" for none";
const TOKENS_FILE_EXPECTED: &str = "a path to a tokens file, or \"\" for none";
const SOCKET_ADDR_EXPECTED: &str = "a socket address ip:port, e.g. \"127.0.0.1:9093\"";

/// Most `listeners.http_workers`.
pub const MAX_HTTP_WORKERS: usize = 64;

/// Defaults of the README's "Configuration", one constant per key.
pub mod defaults {
    pub const NODE_ID: i32 = 1;
    pub const DATA_DIR: &str = "./data/node-1";
    pub const CLUSTER_ID: &str = "kraft-local";
    pub const STATE_MACHINE: super::StateMachineKind = super::StateMachineKind::Metadata;
    /// Kafka's combined mode: a voter that also registers as a broker.
    pub const ROLES: &[super::NodeRole] = &[super::NodeRole::Broker, super::NodeRole::Controller];
    pub const RAFT_LISTENER: &str = "127.0.0.1:9093";
    pub const HTTP_LISTENER: &str = "127.0.0.1:8080";
    pub const MAX_FRAME_BYTES: u64 = 16 * 1024 * 1024;
    /// No HTTP worker threads: the API is served on the node's own thread
    /// (see `listeners.http_workers`).
    pub const HTTP_WORKERS: usize = 0;
    pub const VOTERS: &[&str] = &["1@127.0.0.1:9093"];
    pub const ELECTION_TIMEOUT_MS: u64 = 1000;
    pub const FETCH_TIMEOUT_MS: u64 = 2000;
    pub const RETRY_BACKOFF_MS: u64 = 20;
    pub const REQUEST_TIMEOUT_MS: u64 = 2000;
    /// The shortest request timeout: a parked fetch waits half of it, and
    /// below 2 ms that half is 0, so idle followers would fetch in a busy
    /// loop. 10 ms keeps an idle follower below 200 fetches a second.
    pub const MIN_REQUEST_TIMEOUT_MS: u64 = 10;
    pub const ELECTION_BACKOFF_MAX_MS: u64 = 1000;
    pub const APPEND_LINGER_MS: u64 = 0;
    pub const MAX_IDLE_INTERVAL_MS: u64 = 500;
    pub const HEARTBEAT_INTERVAL_MS: u64 = 2000;
    pub const SESSION_TIMEOUT_MS: u64 = 9000;
    pub const MAX_BATCH_BYTES: u64 = 8 * 1024 * 1024;
    pub const RETENTION_BYTES: u64 = 100 * 1024 * 1024;
    pub const RETENTION_MS: u64 = 7 * 24 * 3600 * 1000;
    pub const CLEANER_INTERVAL_MS: u64 = 60_000;
    pub const SNAPSHOT_MAX_BYTES_BETWEEN: u64 = 20 * 1024 * 1024;
    pub const SNAPSHOT_MAX_INTERVAL_MS: u64 = 3_600_000;
}

/// Where a value came from, for error messages: the file, or the command line.
const OVERRIDE_ORIGIN: &str = "command-line override";

/// Why a configuration was refused. Every variant names where the problem is.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{origin}: not valid TOML: {message}")]
    Syntax { origin: String, message: String },
    /// A key or table that kraft does not know (usually a typo).
    #[error("{origin}: {location}: {message}")]
    UnknownKey {
        origin: String,
        /// `[quorum]`, or `top level` for an unknown table.
        location: String,
        message: String,
    },
    /// An override that is not `table.key=value`.
    #[error("bad override `{text}`: {reason}")]
    BadOverride { text: String, reason: String },
    /// A value of the wrong type or out of range.
    #[error("{origin}: {key} = {value}: expected {expected}")]
    Invalid {
        origin: String,
        /// The dotted key, e.g. `quorum.voters`.
        key: String,
        /// The value as given (TOML syntax).
        value: String,
        expected: String,
    },
}

impl ConfigError {
    /// The dotted key an `Invalid` error is about.
    pub fn key(&self) -> Option<&str> {
        match self {
            ConfigError::Invalid { key, .. } => Some(key),
            _ => None,
        }
    }
}

/// A validated configuration. Every field has the default of the README's "Configuration".
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    pub node: NodeConfig,
    pub listeners: ListenersConfig,
    pub quorum: QuorumConfig,
    pub metadata: MetadataConfig,
    pub broker: BrokerConfig,
    pub log: LogConfig,
    pub snapshot: SnapshotConfig,
    pub security: SecurityConfig,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum NodeRole {
    /// A voter.
    Controller,
    /// An observer: fetches and replays, never votes.
    Broker,
}

/// What a node replays its committed log into (`node.state_machine`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StateMachineKind {
    /// The metadata image: the records are Kafka's metadata records, written
    /// by the active controller; raw appends are refused.
    Metadata,
    /// A replicated, ordered log of raw records: every committed record is
    /// kept, and snapshots hold the log's history.
    Log,
}

impl StateMachineKind {
    /// The name used in `node.state_machine`.
    pub fn as_str(self) -> &'static str {
        match self {
            StateMachineKind::Metadata => "metadata",
            StateMachineKind::Log => "log",
        }
    }
}

impl NodeRole {
    /// The name used in `node.roles`.
    pub fn as_str(self) -> &'static str {
        match self {
            NodeRole::Controller => "controller",
            NodeRole::Broker => "broker",
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct NodeConfig {
    /// ≥ 0.
    pub id: NodeId,
    /// Non-empty, no duplicates.
    pub roles: Vec<NodeRole>,
    pub data_dir: PathBuf,
    /// Non-empty, `[A-Za-z0-9._-]`, at most 255 characters.
    pub cluster_id: String,
    /// What the committed log is replayed into.
    pub state_machine: StateMachineKind,
}

#[derive(Clone, Debug, PartialEq)]
pub struct ListenersConfig {
    pub raft: SocketAddr,
    pub http: SocketAddr,
    /// The client protocol's listener (`crate::messages::client`); `None`
    /// (the default) serves none.
    pub client: Option<SocketAddr>,
    /// Largest frame accepted on the raft listener (default 16 MiB).
    pub max_frame_bytes: u64,
    /// Worker threads serving the HTTP API, 0..=[`MAX_HTTP_WORKERS`];
    /// 0 (the default) serves it on the node's own thread.
    pub http_workers: usize,
    /// What a broker registers as its listeners; empty (the default):
    /// `PLAINTEXT://` at the HTTP listener's address.
    pub advertised: Vec<AdvertisedListener>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct QuorumConfig {
    /// id → `host:port` of every voter. Non-empty; contains `node.id` iff the
    /// node is a controller.
    pub voters: BTreeMap<NodeId, String>,
    pub election_timeout_ms: u64,
    pub fetch_timeout_ms: u64,
    pub retry_backoff_ms: u64,
    pub request_timeout_ms: u64,
    pub election_backoff_max_ms: u64,
    /// May be 0 (drain whenever the log appender is idle).
    pub append_linger_ms: u64,
}

#[derive(Clone, Debug, PartialEq)]
pub struct MetadataConfig {
    pub max_idle_interval_ms: u64,
}

#[derive(Clone, Debug, PartialEq)]
pub struct BrokerConfig {
    /// Less than `session_timeout_ms`.
    pub heartbeat_interval_ms: u64,
    pub session_timeout_ms: u64,
    /// The rack a broker registers with (Kafka's `broker.rack`).
    pub rack: Option<String>,
}

/// A listener a broker advertises: `name://host:port` (Kafka's
/// `advertised.listeners`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AdvertisedListener {
    pub name: String,
    pub host: String,
    pub port: u16,
}

#[derive(Clone, Debug, PartialEq)]
pub struct LogConfig {
    /// 1 ..= 8 MiB.
    pub max_batch_bytes: usize,
    pub retention_bytes: u64,
    pub retention_ms: u64,
    pub cleaner_interval_ms: u64,
}

#[derive(Clone, Debug, PartialEq)]
pub struct SnapshotConfig {
    pub max_bytes_between: u64,
    pub max_interval_ms: u64,
}

/// `[security]`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SecurityConfig {
    /// The bearer tokens of the HTTP API and the client protocol
    /// (`crate::api::auth`); `None` (the default, an empty string in the
    /// file): no token is asked for.
    pub tokens_file: Option<PathBuf>,
    /// TLS on every listener, mutual between nodes (`crate::tls`): the
    /// three `tls_*_file` keys, all set or none (the default).
    pub tls: Option<crate::tls::TlsFiles>,
}

impl Default for Config {
    /// The single-node default of the README's "Configuration" (the repository's `config.toml`).
    fn default() -> Self {
        use defaults::*;
        Config {
            node: NodeConfig {
                id: NODE_ID,
                roles: ROLES.to_vec(),
                data_dir: PathBuf::from(DATA_DIR),
                cluster_id: CLUSTER_ID.to_string(),
                state_machine: STATE_MACHINE,
            },
            listeners: ListenersConfig {
                raft: RAFT_LISTENER
                    .parse()
                    .expect("default raft listener is a socket address"),
                http: HTTP_LISTENER
                    .parse()
                    .expect("default http listener is a socket address"),
                client: None,
                max_frame_bytes: MAX_FRAME_BYTES,
                http_workers: HTTP_WORKERS,
                advertised: Vec::new(),
            },
            quorum: QuorumConfig {
                voters: VOTERS
                    .iter()
                    .map(|v| parse_voter(v).expect("default voters are well formed"))
                    .collect(),
                election_timeout_ms: ELECTION_TIMEOUT_MS,
                fetch_timeout_ms: FETCH_TIMEOUT_MS,
                retry_backoff_ms: RETRY_BACKOFF_MS,
                request_timeout_ms: REQUEST_TIMEOUT_MS,
                election_backoff_max_ms: ELECTION_BACKOFF_MAX_MS,
                append_linger_ms: APPEND_LINGER_MS,
            },
            metadata: MetadataConfig {
                max_idle_interval_ms: MAX_IDLE_INTERVAL_MS,
            },
            broker: BrokerConfig {
                heartbeat_interval_ms: HEARTBEAT_INTERVAL_MS,
                session_timeout_ms: SESSION_TIMEOUT_MS,
                rack: None,
            },
            log: LogConfig {
                max_batch_bytes: MAX_BATCH_BYTES as usize,
                retention_bytes: RETENTION_BYTES,
                retention_ms: RETENTION_MS,
                cleaner_interval_ms: CLEANER_INTERVAL_MS,
            },
            snapshot: SnapshotConfig {
                max_bytes_between: SNAPSHOT_MAX_BYTES_BETWEEN,
                max_interval_ms: SNAPSHOT_MAX_INTERVAL_MS,
            },
            security: SecurityConfig::default(),
        }
    }
}

impl Config {
    /// The snapshot policy's settings: `[snapshot]` and `[log]`'s retention
    /// keys.
    pub fn snapshot_settings(&self) -> SnapshotSettings {
        SnapshotSettings {
            max_bytes_between: self.snapshot.max_bytes_between,
            max_interval_ms: self.snapshot.max_interval_ms,
            retention_bytes: self.log.retention_bytes,
            retention_ms: self.log.retention_ms,
            cleaner_interval_ms: self.log.cleaner_interval_ms,
        }
    }

    /// Reads `path`, applies `overrides` (`("quorum.voters", "[\"1@h:9093\"]")`)
    /// and validates the result.
    pub fn load(path: &Path, overrides: &[(String, String)]) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Self::parse(&path.display().to_string(), &text, overrides)
    }

    /// Like [`Config::load`] for a TOML text already in memory; errors name
    /// it `config.toml`.
    pub fn from_toml_str(text: &str, overrides: &[(String, String)]) -> Result<Config, ConfigError> {
        Self::parse("config.toml", text, overrides)
    }

    /// True if the node is a voter.
    pub fn is_controller(&self) -> bool {
        self.node.roles.contains(&NodeRole::Controller)
    }

    /// True if the node runs the broker role (an observer unless it is also a
    /// controller).
    pub fn is_broker(&self) -> bool {
        self.node.roles.contains(&NodeRole::Broker)
    }

    /// The protocol configuration of this node.
    ///
    /// The endpoint this node announces in BeginQuorumEpoch is its own voter
    /// entry when it has one (the address peers are told to use; the
    /// listener may be bound to `0.0.0.0`), else `listeners.raft`.
    pub fn raft_config(&self) -> RaftConfig {
        let local_endpoint = self
            .quorum
            .voters
            .get(&self.node.id)
            .cloned()
            .unwrap_or_else(|| self.listeners.raft.to_string());
        let mut raft = RaftConfig::new(self.node.id, self.quorum.voters.clone(), local_endpoint);
        raft.election_timeout_ms = self.quorum.election_timeout_ms;
        raft.fetch_timeout_ms = self.quorum.fetch_timeout_ms;
        raft.retry_backoff_ms = self.quorum.retry_backoff_ms;
        raft.request_timeout_ms = self.quorum.request_timeout_ms;
        raft.election_backoff_max_ms = self.quorum.election_backoff_max_ms;
        raft.append_linger_ms = self.quorum.append_linger_ms;
        raft.max_batch_bytes = self.log.max_batch_bytes;
        raft.max_idle_interval_ms = self.metadata.max_idle_interval_ms;
        // A parked fetch must come back before the fetcher's request times
        // out, or every idle fetch would end as a transport timeout.
        raft.fetch_max_wait_ms = raft.fetch_max_wait_ms.min(self.quorum.request_timeout_ms / 2);
        raft
    }

    fn parse(origin: &str, text: &str, overrides: &[(String, String)]) -> Result<Config, ConfigError> {
        let mut root: Table = text.parse().map_err(|e: toml::de::Error| ConfigError::Syntax {
            origin: origin.to_string(),
            message: e.to_string().trim_end().to_string(),
        })?;
        let overridden = apply_overrides(&mut root, origin, overrides)?;
        let ctx = Ctx {
            file: origin,
            overridden: &overridden,
        };
        let raw = RawConfig::from_table(root, origin)?;
        ctx.validate(raw)
    }
}

/// Splits a command-line `key=value` into its parts (the value may contain
/// `=`).
pub fn parse_override(text: &str) -> Result<(String, String), ConfigError> {
    match text.split_once('=') {
        Some((key, value)) if !key.trim().is_empty() => Ok((key.trim().to_string(), value.trim().to_string())),
        _ => Err(ConfigError::BadOverride {
            text: text.to_string(),
            reason: "expected table.key=value, e.g. node.id=2".to_string(),
        }),
    }
}

/// Writes every override over `root`. Returns the overridden keys with the
/// text they were given. Unknown keys in the overrides are reported here,
/// as the override's fault rather than the file's.
fn apply_overrides(
    root: &mut Table,
    origin: &str,
    overrides: &[(String, String)],
) -> Result<BTreeMap<String, String>, ConfigError> {
    let mut only_overrides = Table::new();
    let mut overridden = BTreeMap::new();
    for (key, text) in overrides {
        let bad = |reason: &str| ConfigError::BadOverride {
            text: format!("{key}={text}"),
            reason: reason.to_string(),
        };
        let (table, field) = match key.split_once('.') {
            Some((t, f)) if !t.is_empty() && !f.is_empty() && !f.contains('.') => (t, f),
            _ => return Err(bad("expected a key of the form table.key, e.g. node.id")),
        };
        let value = parse_override_value(text);
        match only_overrides
            .entry(table.to_string())
            .or_insert_with(|| Value::Table(Table::new()))
        {
            Value::Table(t) => {
                t.insert(field.to_string(), value.clone());
            }
            _ => unreachable!("only tables are inserted at the top level"),
        }
        match root
            .entry(table.to_string())
            .or_insert_with(|| Value::Table(Table::new()))
        {
            Value::Table(t) => {
                t.insert(field.to_string(), value);
            }
            other => {
                return Err(ConfigError::Invalid {
                    origin: origin.to_string(),
                    key: table.to_string(),
                    value: other.to_string(),
                    expected: "a table".to_string(),
                })
            }
        }
        overridden.insert(key.clone(), text.clone());
    }
    RawConfig::from_table(only_overrides, OVERRIDE_ORIGIN)?;
    Ok(overridden)
}

/// An override's value: a TOML value if it parses as exactly one, else the
/// text as a string (so `listeners.http=127.0.0.1:0` needs no quotes).
fn parse_override_value(text: &str) -> Value {
    if let Ok(mut table) = format!("v = {text}").parse::<Table>() {
        if table.len() == 1 {
            if let Some(value) = table.remove("v") {
                return value;
            }
        }
    }
    Value::String(text.to_string())
}

// ---------------------------------------------------------------------------
// Raw, unvalidated shape of the file. Values stay `toml::Value` so the
// validation step can report the value as given, whatever its type.

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    node: Option<Value>,
    listeners: Option<Value>,
    quorum: Option<Value>,
    metadata: Option<Value>,
    broker: Option<Value>,
    log: Option<Value>,
    snapshot: Option<Value>,
    security: Option<Value>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawNode {
    id: Option<Value>,
    roles: Option<Value>,
    data_dir: Option<Value>,
    cluster_id: Option<Value>,
    state_machine: Option<Value>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawListeners {
    raft: Option<Value>,
    http: Option<Value>,
    client: Option<Value>,
    max_frame_bytes: Option<Value>,
    http_workers: Option<Value>,
    advertised: Option<Value>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawQuorum {
    voters: Option<Value>,
    election_timeout_ms: Option<Value>,
    fetch_timeout_ms: Option<Value>,
    retry_backoff_ms: Option<Value>,
    request_timeout_ms: Option<Value>,
    election_backoff_max_ms: Option<Value>,
    append_linger_ms: Option<Value>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawMetadata {
    max_idle_interval_ms: Option<Value>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawBroker {
    heartbeat_interval_ms: Option<Value>,
    session_timeout_ms: Option<Value>,
    rack: Option<Value>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawLog {
    max_batch_bytes: Option<Value>,
    retention_bytes: Option<Value>,
    retention_ms: Option<Value>,
    cleaner_interval_ms: Option<Value>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawSnapshot {
    max_bytes_between: Option<Value>,
    max_interval_ms: Option<Value>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawSecurity {
    tokens_file: Option<Value>,
    tls_ca_file: Option<Value>,
    tls_cert_file: Option<Value>,
    tls_key_file: Option<Value>,
}

/// The raw tables, each checked for unknown keys.
struct RawTables {
    node: RawNode,
    listeners: RawListeners,
    quorum: RawQuorum,
    metadata: RawMetadata,
    broker: RawBroker,
    log: RawLog,
    snapshot: RawSnapshot,
    security: RawSecurity,
}

impl RawConfig {
    /// Deserializes `root` table by table, so an unknown key is reported
    /// with the table it is in.
    fn from_table(root: Table, origin: &str) -> Result<RawTables, ConfigError> {
        let raw: RawConfig = Value::Table(root)
            .try_into()
            .map_err(|e: toml::de::Error| ConfigError::UnknownKey {
                origin: origin.to_string(),
                location: "top level".to_string(),
                message: e.message().trim_end().to_string(),
            })?;
        Ok(RawTables {
            node: table(origin, "node", raw.node)?,
            listeners: table(origin, "listeners", raw.listeners)?,
            quorum: table(origin, "quorum", raw.quorum)?,
            metadata: table(origin, "metadata", raw.metadata)?,
            broker: table(origin, "broker", raw.broker)?,
            log: table(origin, "log", raw.log)?,
            snapshot: table(origin, "snapshot", raw.snapshot)?,
            security: table(origin, "security", raw.security)?,
        })
    }
}

fn table<T: for<'de> Deserialize<'de> + Default>(
    origin: &str,
    name: &str,
    value: Option<Value>,
) -> Result<T, ConfigError> {
    match value {
        None => Ok(T::default()),
        Some(value @ Value::Table(_)) => value.try_into().map_err(|e: toml::de::Error| ConfigError::UnknownKey {
            origin: origin.to_string(),
            location: format!("[{name}]"),
            message: e.message().trim_end().to_string(),
        }),
        Some(other) => Err(ConfigError::Invalid {
            origin: origin.to_string(),
            key: name.to_string(),
            value: other.to_string(),
            expected: "a table".to_string(),
        }),
    }
}

// ---------------------------------------------------------------------------
// The rules every configuration is held to, whether it was read from a file
// (`Ctx::validate`, which names the file and the value as written) or built
// in code ([`Config::check`]). Each rule is written once, here.

/// A key in milliseconds: `min..=MAX_MS`.
#[derive(Clone, Copy)]
struct MsKey {
    key: &'static str,
    min: u64,
}

impl MsKey {
    fn holds(self, value: u64) -> bool {
        (self.min..=MAX_MS).contains(&value)
    }

    fn expected(self, value: i128) -> String {
        if value > i128::from(MAX_MS) {
            return format!("at most {MAX_MS} (milliseconds, ten years)");
        }
        match self.min {
            0 => "a non-negative integer (milliseconds)".to_string(),
            1 => "a positive integer (milliseconds)".to_string(),
            min => format!("an integer of milliseconds, at least {min}"),
        }
    }
}

/// A key in bytes: `min..=max`.
#[derive(Clone, Copy)]
struct BytesKey {
    key: &'static str,
    min: u64,
    max: u64,
}

impl BytesKey {
    fn holds(self, value: u64) -> bool {
        (self.min..=self.max).contains(&value)
    }

    fn expected(self) -> String {
        if self.max == u64::MAX {
            format!("an integer of bytes, at least {}", self.min)
        } else {
            format!("an integer of bytes between {} and {}", self.min, self.max)
        }
    }
}

mod keys {
    use super::{defaults::MIN_REQUEST_TIMEOUT_MS, BytesKey, MsKey, MAX_BATCH_BYTES_LIMIT, MIN_MAX_FRAME_BYTES};

    const fn ms(key: &'static str, min: u64) -> MsKey {
        MsKey { key, min }
    }

    pub(super) const ELECTION_TIMEOUT: MsKey = ms("quorum.election_timeout_ms", 1);
    pub(super) const FETCH_TIMEOUT: MsKey = ms("quorum.fetch_timeout_ms", 1);
    pub(super) const RETRY_BACKOFF: MsKey = ms("quorum.retry_backoff_ms", 1);
    pub(super) const REQUEST_TIMEOUT: MsKey = ms("quorum.request_timeout_ms", MIN_REQUEST_TIMEOUT_MS);
    pub(super) const ELECTION_BACKOFF_MAX: MsKey = ms("quorum.election_backoff_max_ms", 1);
    pub(super) const APPEND_LINGER: MsKey = ms("quorum.append_linger_ms", 0);
    pub(super) const MAX_IDLE_INTERVAL: MsKey = ms("metadata.max_idle_interval_ms", 1);
    pub(super) const HEARTBEAT_INTERVAL: MsKey = ms("broker.heartbeat_interval_ms", 1);
    pub(super) const SESSION_TIMEOUT: MsKey = ms("broker.session_timeout_ms", 1);
    pub(super) const RETENTION: MsKey = ms("log.retention_ms", 1);
    pub(super) const CLEANER_INTERVAL: MsKey = ms("log.cleaner_interval_ms", 1);
    pub(super) const SNAPSHOT_INTERVAL: MsKey = ms("snapshot.max_interval_ms", 1);

    pub(super) const MAX_FRAME: BytesKey = BytesKey {
        key: "listeners.max_frame_bytes",
        min: MIN_MAX_FRAME_BYTES,
        max: u32::MAX as u64,
    };
    pub(super) const MAX_BATCH: BytesKey = BytesKey {
        key: "log.max_batch_bytes",
        min: 1,
        max: MAX_BATCH_BYTES_LIMIT,
    };
    pub(super) const RETENTION_BYTES: BytesKey = BytesKey {
        key: "log.retention_bytes",
        min: 1,
        max: u64::MAX,
    };
    pub(super) const SNAPSHOT_BYTES: BytesKey = BytesKey {
        key: "snapshot.max_bytes_between",
        min: 1,
        max: u64::MAX,
    };
}

const NODE_ID_EXPECTED: &str = "a non-negative integer (node id)";
const ADVERTISED_EXPECTED: &str =
    "a list of distinct listeners NAME://host:port, e.g. [\"PLAINTEXT://localhost:9092\"] (NAME of [A-Z0-9_])";
const RACK_EXPECTED: &str = "a rack name of at most 255 characters, or \"\" for none";

/// `NAME://host:port`, NAME of `[A-Za-z0-9_]`, host non-empty.
fn parse_advertised(entry: &str) -> Option<AdvertisedListener> {
    let (name, address) = entry.split_once("://")?;
    let (host, port) = address.rsplit_once(':')?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let well_formed =
        !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') && !host.is_empty();
    let port: u16 = port.parse().ok()?;
    well_formed.then(|| AdvertisedListener {
        name: name.to_ascii_uppercase(),
        host: host.to_string(),
        port,
    })
}

const STATE_MACHINE_EXPECTED: &str = "\"metadata\" (the metadata image) or \"log\" (a replicated log of raw records)";
const ROLES_EXPECTED: &str =
    "a non-empty list of distinct roles from \"controller\", \"broker\", e.g. [\"controller\"]";
const DATA_DIR_EXPECTED: &str = "a non-empty path";
const CLUSTER_ID_EXPECTED: &str = "a non-empty string of at most 255 characters from [A-Za-z0-9._-]";
const VOTERS_EXPECTED: &str = "a non-empty list of \"id@host:port\" voters with distinct ids and endpoints, \
     e.g. [\"1@127.0.0.1:9093\", \"2@127.0.0.1:9094\"]";

fn http_workers_expected() -> String {
    format!("an integer between 0 (the node's own thread) and {MAX_HTTP_WORKERS} (threads)")
}

fn cluster_id_is_well_formed(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= MAX_CLUSTER_ID_LEN
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// A controller is a voter and a broker-only node is not: what
/// `quorum.voters` should have been, if it breaks that rule.
fn membership_expected(id: NodeId, is_controller: bool, voters: &BTreeMap<NodeId, String>) -> Option<String> {
    match (is_controller, voters.contains_key(&id)) {
        (true, false) => Some(format!(
            "an entry for node.id {id} (node.roles includes \"controller\", so this node is a voter)"
        )),
        (false, true) => Some(format!(
            "no entry for node.id {id} (a broker-only node is an observer, not a voter)"
        )),
        _ => None,
    }
}

/// A broker's session outlives several heartbeats: what the blamed key
/// should have been, if it does not.
fn session_expected(blame_session: bool, heartbeat_interval_ms: u64, session_timeout_ms: u64) -> Option<String> {
    if session_timeout_ms > heartbeat_interval_ms {
        None
    } else if blame_session {
        Some(format!(
            "more than broker.heartbeat_interval_ms ({heartbeat_interval_ms})"
        ))
    } else {
        Some(format!("less than broker.session_timeout_ms ({session_timeout_ms})"))
    }
}

/// Where a [`Config::check`] error comes from.
const BUILT_ORIGIN: &str = "config built in code";

impl Config {
    /// Checks a configuration built in code against the rules a
    /// `config.toml` is held to ([`Config::load`] applies them already).
    /// [`crate::node::start`] calls it, so a value that would make a node
    /// misbehave (a 0 ms request timeout, a heartbeat longer than the
    /// session, a controller missing from the voters) is an error before
    /// anything starts. Two differences from a file: byte counts may go up
    /// to `u64::MAX`, where TOML's integers stop at `i64::MAX`, and a lone
    /// voter that is this node may give port 0 (nobody dials it).
    pub fn check(&self) -> Result<(), ConfigError> {
        // The value as a TOML literal: `5`, `"a b"`, `["1@h:9093"]`.
        let invalid = |key: &str, value: String, expected: String| ConfigError::Invalid {
            origin: BUILT_ORIGIN.to_string(),
            key: key.to_string(),
            value,
            expected,
        };
        let string = |s: &str| Value::String(s.to_string()).to_string();
        let node = &self.node;
        if node.id < 0 {
            return Err(invalid("node.id", node.id.to_string(), NODE_ID_EXPECTED.into()));
        }
        let distinct: BTreeSet<_> = node.roles.iter().collect();
        if node.roles.is_empty() || distinct.len() != node.roles.len() {
            let names = node.roles.iter().map(|r| Value::String(r.as_str().into())).collect();
            return Err(invalid(
                "node.roles",
                Value::Array(names).to_string(),
                ROLES_EXPECTED.into(),
            ));
        }
        let data_dir = node.data_dir.to_string_lossy();
        if data_dir.trim().is_empty() {
            return Err(invalid("node.data_dir", string(&data_dir), DATA_DIR_EXPECTED.into()));
        }
        if !cluster_id_is_well_formed(&node.cluster_id) {
            let value = string(&node.cluster_id);
            return Err(invalid("node.cluster_id", value, CLUSTER_ID_EXPECTED.into()));
        }

        let listeners = &self.listeners;
        if !keys::MAX_FRAME.holds(listeners.max_frame_bytes) {
            let key = keys::MAX_FRAME;
            return Err(invalid(key.key, listeners.max_frame_bytes.to_string(), key.expected()));
        }
        if listeners.http_workers > MAX_HTTP_WORKERS {
            return Err(invalid(
                "listeners.http_workers",
                listeners.http_workers.to_string(),
                http_workers_expected(),
            ));
        }

        let voters = &self.quorum.voters;
        let entries = || {
            let entries = voters
                .iter()
                .map(|(id, endpoint)| Value::String(format!("{id}@{endpoint}")));
            Value::Array(entries.collect()).to_string()
        };
        let endpoints: BTreeSet<_> = voters.values().collect();
        // A lone voter that is this node is never dialled, so it may keep
        // port 0 of a listener bound to a free port (`NodeHandle::raft_addr`).
        let lone_self = voters.len() == 1 && voters.contains_key(&node.id);
        let well_formed = voters.iter().all(|(id, endpoint)| {
            let endpoint = match endpoint.strip_suffix(":0") {
                Some(host) if lone_self => format!("{host}:1"),
                _ => endpoint.clone(),
            };
            *id >= 0 && parse_voter(&format!("{id}@{endpoint}")) == Some((*id, endpoint))
        });
        if voters.is_empty() || endpoints.len() != voters.len() || !well_formed {
            return Err(invalid("quorum.voters", entries(), VOTERS_EXPECTED.into()));
        }
        if let Some(expected) = membership_expected(node.id, self.is_controller(), voters) {
            return Err(invalid("quorum.voters", entries(), expected));
        }

        for (key, value) in self.ms_values() {
            if !key.holds(value) {
                return Err(invalid(key.key, value.to_string(), key.expected(value.into())));
            }
        }
        let broker = &self.broker;
        if let Some(expected) = session_expected(true, broker.heartbeat_interval_ms, broker.session_timeout_ms) {
            return Err(invalid(
                keys::SESSION_TIMEOUT.key,
                broker.session_timeout_ms.to_string(),
                expected,
            ));
        }
        for (key, value) in [
            (keys::MAX_BATCH, self.log.max_batch_bytes as u64),
            (keys::RETENTION_BYTES, self.log.retention_bytes),
            (keys::SNAPSHOT_BYTES, self.snapshot.max_bytes_between),
        ] {
            if !key.holds(value) {
                return Err(invalid(key.key, value.to_string(), key.expected()));
            }
        }
        Ok(())
    }

    /// Every millisecond key with its value.
    fn ms_values(&self) -> [(MsKey, u64); 12] {
        let (quorum, broker) = (&self.quorum, &self.broker);
        [
            (keys::ELECTION_TIMEOUT, quorum.election_timeout_ms),
            (keys::FETCH_TIMEOUT, quorum.fetch_timeout_ms),
            (keys::RETRY_BACKOFF, quorum.retry_backoff_ms),
            (keys::REQUEST_TIMEOUT, quorum.request_timeout_ms),
            (keys::ELECTION_BACKOFF_MAX, quorum.election_backoff_max_ms),
            (keys::APPEND_LINGER, quorum.append_linger_ms),
            (keys::MAX_IDLE_INTERVAL, self.metadata.max_idle_interval_ms),
            (keys::HEARTBEAT_INTERVAL, broker.heartbeat_interval_ms),
            (keys::SESSION_TIMEOUT, broker.session_timeout_ms),
            (keys::RETENTION, self.log.retention_ms),
            (keys::CLEANER_INTERVAL, self.log.cleaner_interval_ms),
            (keys::SNAPSHOT_INTERVAL, self.snapshot.max_interval_ms),
        ]
    }
}

// ---------------------------------------------------------------------------
// Validation.

struct Ctx<'a> {
    /// Name of the file (or `config.toml` for a string).
    file: &'a str,
    /// Keys given on the command line, with their text.
    overridden: &'a BTreeMap<String, String>,
}

impl Ctx<'_> {
    fn origin(&self, key: &str) -> String {
        if self.overridden.contains_key(key) {
            OVERRIDE_ORIGIN.to_string()
        } else {
            self.file.to_string()
        }
    }

    fn invalid(&self, key: &str, value: &Value, expected: impl Into<String>) -> ConfigError {
        ConfigError::Invalid {
            origin: self.origin(key),
            key: key.to_string(),
            value: value.to_string(),
            expected: expected.into(),
        }
    }

    /// An integer in `min..=max`.
    fn int(&self, key: &str, value: &Value, min: i64, max: i64, expected: &str) -> Result<i64, ConfigError> {
        match value {
            Value::Integer(n) if (min..=max).contains(n) => Ok(*n),
            _ => Err(self.invalid(key, value, expected)),
        }
    }

    /// Milliseconds within `key`'s bounds.
    fn ms(&self, key: MsKey, value: Option<Value>, default: u64) -> Result<u64, ConfigError> {
        match value {
            None => Ok(default),
            Some(Value::Integer(n)) if n >= 0 && key.holds(n as u64) => Ok(n as u64),
            Some(Value::Integer(n)) => Err(self.invalid(key.key, &Value::Integer(n), key.expected(n.into()))),
            Some(other) => Err(self.invalid(key.key, &other, key.expected(0))),
        }
    }

    /// Bytes within `key`'s bounds (TOML's integers stop at `i64::MAX`).
    fn bytes(&self, key: BytesKey, value: Option<Value>, default: u64) -> Result<u64, ConfigError> {
        match value {
            None => Ok(default),
            Some(Value::Integer(n)) if n >= 0 && key.holds(n as u64) => Ok(n as u64),
            Some(other) => Err(self.invalid(key.key, &other, key.expected())),
        }
    }

    /// A string; an override that parsed as another TOML type is taken as
    /// the text it was given (`node.cluster_id=123`).
    fn string(&self, key: &str, value: &Value, expected: &str) -> Result<String, ConfigError> {
        match value {
            Value::String(s) => Ok(s.clone()),
            _ => match self.overridden.get(key) {
                Some(text) if !matches!(value, Value::Array(_) | Value::Table(_)) => Ok(text.clone()),
                _ => Err(self.invalid(key, value, expected)),
            },
        }
    }

    fn socket_addr(&self, key: &str, value: Option<Value>, default: &str) -> Result<SocketAddr, ConfigError> {
        let Some(value) = value else {
            return Ok(default.parse().expect("defaults are valid socket addresses"));
        };
        self.parse_socket_addr(key, &value, SOCKET_ADDR_EXPECTED)
    }

    fn parse_socket_addr(&self, key: &str, value: &Value, expected: &str) -> Result<SocketAddr, ConfigError> {
        let text = self.string(key, value, expected)?;
        text.trim().parse().map_err(|_| self.invalid(key, value, expected))
    }

    /// A socket address, or `None` when the key is absent or empty.
    fn optional_socket_addr(&self, key: &str, value: Option<Value>) -> Result<Option<SocketAddr>, ConfigError> {
        const EXPECTED: &str = "a socket address ip:port, e.g. \"127.0.0.1:9092\", or \"\" for none";
        let Some(value) = value else {
            return Ok(None);
        };
        if self.string(key, &value, EXPECTED)?.trim().is_empty() {
            return Ok(None);
        }
        self.parse_socket_addr(key, &value, EXPECTED).map(Some)
    }

    /// A list of strings, given as a TOML array or as one comma-separated
    /// string (Kafka's form: `controller,broker`).
    fn string_list(&self, key: &str, value: &Value, expected: &str) -> Result<Vec<String>, ConfigError> {
        match value {
            Value::Array(items) => items
                .iter()
                .map(|item| match item {
                    Value::String(s) => Ok(s.trim().to_string()),
                    _ => Err(self.invalid(key, value, expected)),
                })
                .collect(),
            Value::String(s) => Ok(s.split(',').map(|part| part.trim().to_string()).collect()),
            _ => Err(self.invalid(key, value, expected)),
        }
    }

    fn validate(&self, raw: RawTables) -> Result<Config, ConfigError> {
        use defaults::*;

        // [node]
        let id = match raw.node.id {
            None => NODE_ID,
            Some(v) => self.int("node.id", &v, 0, i32::MAX as i64, NODE_ID_EXPECTED)? as NodeId,
        };
        let roles = match raw.node.roles {
            None => ROLES.to_vec(),
            Some(v) => self.roles(&v)?,
        };
        let data_dir = match raw.node.data_dir {
            None => PathBuf::from(DATA_DIR),
            Some(v) => {
                let s = self.string("node.data_dir", &v, DATA_DIR_EXPECTED)?;
                if s.trim().is_empty() {
                    return Err(self.invalid("node.data_dir", &v, DATA_DIR_EXPECTED));
                }
                PathBuf::from(s)
            }
        };
        let cluster_id = match raw.node.cluster_id {
            None => CLUSTER_ID.to_string(),
            Some(v) => {
                let s = self.string("node.cluster_id", &v, CLUSTER_ID_EXPECTED)?;
                if !cluster_id_is_well_formed(&s) {
                    return Err(self.invalid("node.cluster_id", &v, CLUSTER_ID_EXPECTED));
                }
                s
            }
        };

        let state_machine = match raw.node.state_machine {
            None => STATE_MACHINE,
            Some(v) => match self.string("node.state_machine", &v, STATE_MACHINE_EXPECTED)?.as_str() {
                "metadata" => StateMachineKind::Metadata,
                "log" => StateMachineKind::Log,
                _ => return Err(self.invalid("node.state_machine", &v, STATE_MACHINE_EXPECTED)),
            },
        };

        // [listeners]
        let raft = self.socket_addr("listeners.raft", raw.listeners.raft, RAFT_LISTENER)?;
        let http = self.socket_addr("listeners.http", raw.listeners.http, HTTP_LISTENER)?;
        let client = self.optional_socket_addr("listeners.client", raw.listeners.client)?;
        let max_frame_bytes = self.bytes(keys::MAX_FRAME, raw.listeners.max_frame_bytes, MAX_FRAME_BYTES)?;
        let http_workers = match raw.listeners.http_workers {
            None => HTTP_WORKERS,
            Some(v) => self.int(
                "listeners.http_workers",
                &v,
                0,
                MAX_HTTP_WORKERS as i64,
                &http_workers_expected(),
            )? as usize,
        };

        let advertised = match raw.listeners.advertised {
            None => Vec::new(),
            Some(v) => self.advertised(&v)?,
        };

        // [quorum]
        let voters_value = raw
            .quorum
            .voters
            .unwrap_or_else(|| Value::Array(VOTERS.iter().map(|v| Value::String(v.to_string())).collect()));
        let voters = self.voters(&voters_value)?;
        if let Some(expected) = membership_expected(id, roles.contains(&NodeRole::Controller), &voters) {
            return Err(self.invalid("quorum.voters", &voters_value, expected));
        }
        if let Some(endpoint) = voters.get(&id) {
            let voter_port = endpoint.rsplit_once(':').and_then(|(_, p)| p.parse::<u16>().ok());
            if raft.port() != 0 && voter_port != Some(raft.port()) {
                tracing::warn!(
                    node_id = id,
                    listener = %raft,
                    voter_endpoint = %endpoint,
                    "listeners.raft port differs from this node's quorum.voters entry; peers will dial the voter entry"
                );
            }
        }
        let quorum = QuorumConfig {
            voters,
            election_timeout_ms: self.ms(
                keys::ELECTION_TIMEOUT,
                raw.quorum.election_timeout_ms,
                ELECTION_TIMEOUT_MS,
            )?,
            fetch_timeout_ms: self.ms(keys::FETCH_TIMEOUT, raw.quorum.fetch_timeout_ms, FETCH_TIMEOUT_MS)?,
            retry_backoff_ms: self.ms(keys::RETRY_BACKOFF, raw.quorum.retry_backoff_ms, RETRY_BACKOFF_MS)?,
            request_timeout_ms: self.ms(keys::REQUEST_TIMEOUT, raw.quorum.request_timeout_ms, REQUEST_TIMEOUT_MS)?,
            election_backoff_max_ms: self.ms(
                keys::ELECTION_BACKOFF_MAX,
                raw.quorum.election_backoff_max_ms,
                ELECTION_BACKOFF_MAX_MS,
            )?,
            append_linger_ms: self.ms(keys::APPEND_LINGER, raw.quorum.append_linger_ms, APPEND_LINGER_MS)?,
        };

        // [metadata]
        let metadata = MetadataConfig {
            max_idle_interval_ms: self.ms(
                keys::MAX_IDLE_INTERVAL,
                raw.metadata.max_idle_interval_ms,
                MAX_IDLE_INTERVAL_MS,
            )?,
        };

        // [broker]
        let heartbeat_interval_ms = self.ms(
            keys::HEARTBEAT_INTERVAL,
            raw.broker.heartbeat_interval_ms,
            HEARTBEAT_INTERVAL_MS,
        )?;
        let session_value = raw.broker.session_timeout_ms.clone();
        let session_timeout_ms = self.ms(keys::SESSION_TIMEOUT, raw.broker.session_timeout_ms, SESSION_TIMEOUT_MS)?;
        // Blame the key that was set; with both defaults this cannot happen.
        let blame_session = session_value.is_some();
        if let Some(expected) = session_expected(blame_session, heartbeat_interval_ms, session_timeout_ms) {
            let (key, value) = match session_value {
                Some(v) => (keys::SESSION_TIMEOUT.key, v),
                None => (
                    keys::HEARTBEAT_INTERVAL.key,
                    Value::Integer(heartbeat_interval_ms as i64),
                ),
            };
            return Err(self.invalid(key, &value, expected));
        }
        let rack = match raw.broker.rack {
            None => None,
            Some(v) => {
                let rack = self.string("broker.rack", &v, RACK_EXPECTED)?;
                match rack.trim() {
                    "" => None,
                    rack if rack.len() > 255 => return Err(self.invalid("broker.rack", &v, RACK_EXPECTED)),
                    rack => Some(rack.to_string()),
                }
            }
        };
        let broker = BrokerConfig {
            heartbeat_interval_ms,
            session_timeout_ms,
            rack,
        };

        // [log]
        let log = LogConfig {
            max_batch_bytes: self.bytes(keys::MAX_BATCH, raw.log.max_batch_bytes, MAX_BATCH_BYTES)? as usize,
            retention_bytes: self.bytes(keys::RETENTION_BYTES, raw.log.retention_bytes, RETENTION_BYTES)?,
            retention_ms: self.ms(keys::RETENTION, raw.log.retention_ms, RETENTION_MS)?,
            cleaner_interval_ms: self.ms(keys::CLEANER_INTERVAL, raw.log.cleaner_interval_ms, CLEANER_INTERVAL_MS)?,
        };

        // [snapshot]
        let snapshot = SnapshotConfig {
            max_bytes_between: self.bytes(
                keys::SNAPSHOT_BYTES,
                raw.snapshot.max_bytes_between,
                SNAPSHOT_MAX_BYTES_BETWEEN,
            )?,
            max_interval_ms: self.ms(
                keys::SNAPSHOT_INTERVAL,
                raw.snapshot.max_interval_ms,
                SNAPSHOT_MAX_INTERVAL_MS,
            )?,
        };

        Ok(Config {
            node: NodeConfig {
                id,
                roles,
                data_dir,
                cluster_id,
                state_machine,
            },
            listeners: ListenersConfig {
                raft,
                http,
                client,
                max_frame_bytes,
                http_workers,
                advertised,
            },
            quorum,
            metadata,
            broker,
            log,
            snapshot,
            security: SecurityConfig {
                tokens_file: self.optional_path(
                    "security.tokens_file",
                    raw.security.tokens_file.clone(),
                    TOKENS_FILE_EXPECTED,
                )?,
                tls: self.tls_files(raw.security)?,
            },
        })
    }

    /// A path, or `None` for an absent key or an empty string.
    fn optional_path(&self, key: &str, value: Option<Value>, expected: &str) -> Result<Option<PathBuf>, ConfigError> {
        let Some(value) = value else { return Ok(None) };
        let s = self.string(key, &value, expected)?;
        Ok((!s.trim().is_empty()).then(|| PathBuf::from(s)))
    }

    /// The three TLS files, all or none.
    fn tls_files(&self, raw: RawSecurity) -> Result<Option<crate::tls::TlsFiles>, ConfigError> {
        let keys = [
            "security.tls_ca_file",
            "security.tls_cert_file",
            "security.tls_key_file",
        ];
        let values = [raw.tls_ca_file, raw.tls_cert_file, raw.tls_key_file];
        let mut paths = Vec::with_capacity(3);
        for (key, value) in keys.iter().zip(values) {
            paths.push(self.optional_path(key, value, TLS_FILE_EXPECTED)?);
        }
        match paths.as_slice() {
            [None, None, None] => Ok(None),
            [Some(ca), Some(cert), Some(key)] => Ok(Some(crate::tls::TlsFiles {
                ca_file: ca.clone(),
                cert_file: cert.clone(),
                key_file: key.clone(),
            })),
            _ => {
                let unset = keys[paths.iter().position(Option::is_none).expect("one is unset")];
                Err(self.invalid(
                    unset,
                    &Value::String(String::new()),
                    "a path: the three security.tls_*_file keys are set together or not at all",
                ))
            }
        }
    }

    fn advertised(&self, value: &Value) -> Result<Vec<AdvertisedListener>, ConfigError> {
        let mut listeners: Vec<AdvertisedListener> = Vec::new();
        for entry in self.string_list("listeners.advertised", value, ADVERTISED_EXPECTED)? {
            if entry.is_empty() {
                continue;
            }
            let listener = parse_advertised(&entry)
                .ok_or_else(|| self.invalid("listeners.advertised", value, ADVERTISED_EXPECTED))?;
            if listeners.iter().any(|l| l.name == listener.name) {
                return Err(self.invalid("listeners.advertised", value, ADVERTISED_EXPECTED));
            }
            listeners.push(listener);
        }
        Ok(listeners)
    }

    fn roles(&self, value: &Value) -> Result<Vec<NodeRole>, ConfigError> {
        const EXPECTED: &str = ROLES_EXPECTED;
        let names = self.string_list("node.roles", value, EXPECTED)?;
        let mut roles = Vec::with_capacity(names.len());
        for name in &names {
            let role = match name.as_str() {
                "controller" => NodeRole::Controller,
                "broker" => NodeRole::Broker,
                _ => return Err(self.invalid("node.roles", value, EXPECTED)),
            };
            if roles.contains(&role) {
                return Err(self.invalid("node.roles", value, EXPECTED));
            }
            roles.push(role);
        }
        if roles.is_empty() {
            return Err(self.invalid("node.roles", value, EXPECTED));
        }
        Ok(roles)
    }

    fn voters(&self, value: &Value) -> Result<BTreeMap<NodeId, String>, ConfigError> {
        const EXPECTED: &str = VOTERS_EXPECTED;
        let entries = self.string_list("quorum.voters", value, EXPECTED)?;
        let mut voters = BTreeMap::new();
        let mut endpoints = BTreeSet::new();
        for entry in &entries {
            let (id, endpoint) = parse_voter(entry).ok_or_else(|| self.invalid("quorum.voters", value, EXPECTED))?;
            if !endpoints.insert(endpoint.clone()) || voters.insert(id, endpoint).is_some() {
                return Err(self.invalid("quorum.voters", value, EXPECTED));
            }
        }
        if voters.is_empty() {
            return Err(self.invalid("quorum.voters", value, EXPECTED));
        }
        Ok(voters)
    }
}

/// Parses one `id@host:port` voter entry. The host is a name, an IPv4
/// address or a bracketed IPv6 address; the port is 1..=65535.
fn parse_voter(entry: &str) -> Option<(NodeId, String)> {
    let (id, endpoint) = entry.trim().split_once('@')?;
    if id.is_empty() || !id.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let id: NodeId = id.parse().ok()?;
    let (host, port) = endpoint.rsplit_once(':')?;
    let port: u16 = port.parse().ok()?;
    if port == 0 || host.is_empty() {
        return None;
    }
    let host_ok = if let Some(inner) = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        inner.parse::<std::net::Ipv6Addr>().is_ok()
    } else {
        host.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_'))
    };
    if !host_ok {
        return None;
    }
    Some((id, endpoint.to_string()))
}
