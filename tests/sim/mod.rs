//! The deterministic cluster simulator (docs/ARCHITECTURE.md, "Testing"), VOPR-style.
//!
//! Several [`RaftNode`](kraft::raft::RaftNode)s run in one thread on virtual
//! time. Every source of nondeterminism — message delays, loss, duplication,
//! partitions, crashes, disk latency, client traffic and the engines' own
//! seeds — is drawn from one RNG seeded by the run's seed, so a run is a pure
//! function of its seed. The invariants of docs/ARCHITECTURE.md, "Protocol rules" are checked after
//! every step, one checker per property (`invariants.rs`).
//!
//! Layout:
//! - `params.rs`: the fault mix and engine settings each seed draws.
//! - `log_mirror.rs`: the harness's own view of each node's current and
//!   durable log (cheap for the checkers to query).
//! - `store.rs`: each node's disk (`MemoryStore`, which loses unflushed
//!   writes on `crash()`).
//! - `cluster.rs`: the event queue, the network, the disk and the executor of
//!   the engine's `Action`s.
//! - `invariants.rs`: the safety checkers.
//! - `trace.rs`: the trace hash and the optional event trace.
//! - `runner.rs`: many seeds over two threads, totals, replay commands.

#![allow(dead_code)]

pub mod cluster;
pub mod invariants;
pub mod log_mirror;
pub mod params;
pub mod runner;
pub mod store;
pub mod trace;
