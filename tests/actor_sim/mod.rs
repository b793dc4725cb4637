//! The actor-level simulator's parts: `disk.rs` (a node's crashable
//! in-memory disk), `net.rs` (the in-memory network), `world.rs` (one seed:
//! nodes, faults, clients, checks).

pub mod disk;
pub mod net;
pub mod world;
