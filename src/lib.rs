//! kraft: Kafka's KRaft metadata quorum as an actix actor system over sled.

pub mod actors;
pub mod api;
mod broker;
pub mod client;
pub mod config;
#[doc(hidden)]
pub mod fuzzing;
pub mod messages;
pub mod metadata;
pub mod node;
pub mod raft;
pub mod storage;
pub mod tls;
pub mod types;
