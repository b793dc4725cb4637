//! The actor-level simulator's parts: `disk.rs` (a node's crashable
//! in-memory disk), `net.rs` (the in-memory network), `world.rs` (one seed:
//! nodes, faults, clients, checks), `metadata.rs` (the controller workload
//! and the image checks of a metadata seed).

pub mod disk;
pub mod metadata;
pub mod net;
pub mod world;
