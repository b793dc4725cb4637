//! The fault harness's pieces: real nodes behind per-link proxies.

pub mod cluster;
pub mod proxy;
