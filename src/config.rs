//! `config.toml`: the model (DESIGN.md §6), validation and command-line
//! overrides. (Loading, validation and overrides are being written.)

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;

use crate::raft::NodeId;

/// A validated configuration. Every field has the default of DESIGN.md §6.
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    pub node: NodeConfig,
    pub listeners: ListenersConfig,
    pub quorum: QuorumConfig,
    pub metadata: MetadataConfig,
    pub broker: BrokerConfig,
    pub log: LogConfig,
    pub snapshot: SnapshotConfig,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NodeRole {
    /// A voter.
    Controller,
    /// An observer: fetches and replays, never votes.
    Broker,
}

#[derive(Clone, Debug, PartialEq)]
pub struct NodeConfig {
    pub id: NodeId,
    pub roles: Vec<NodeRole>,
    pub data_dir: PathBuf,
    pub cluster_id: String,
}

#[derive(Clone, Debug, PartialEq)]
pub struct ListenersConfig {
    pub raft: SocketAddr,
    pub http: SocketAddr,
    /// Largest frame accepted on the raft listener (default 16 MiB).
    pub max_frame_bytes: u64,
}

#[derive(Clone, Debug, PartialEq)]
pub struct QuorumConfig {
    /// id → `host:port` of every voter.
    pub voters: BTreeMap<NodeId, String>,
    pub election_timeout_ms: u64,
    pub fetch_timeout_ms: u64,
    pub retry_backoff_ms: u64,
    pub request_timeout_ms: u64,
    pub election_backoff_max_ms: u64,
    pub append_linger_ms: u64,
}

#[derive(Clone, Debug, PartialEq)]
pub struct MetadataConfig {
    pub max_idle_interval_ms: u64,
}

#[derive(Clone, Debug, PartialEq)]
pub struct BrokerConfig {
    pub heartbeat_interval_ms: u64,
    pub session_timeout_ms: u64,
}

#[derive(Clone, Debug, PartialEq)]
pub struct LogConfig {
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
