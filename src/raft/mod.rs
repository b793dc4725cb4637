//! The pure protocol: Kafka's Raft dialect (KIP-595 + KIP-996 pre-vote) as a
//! single-threaded state machine with no I/O, no clock and no hidden
//! randomness.
//!
//! [`RaftNode`] takes inputs — a request or response from a peer, a tick with
//! the current time, a proposal, a storage completion — and returns
//! [`Action`]s for the shell to carry out **in order**:
//!
//! 1. `PersistElection` must be durable before any later action runs
//!    (persist, then switch, then reply).
//! 2. `AppendBatch`/`Truncate` change the log and are readable at once; they
//!    become durable at the next `Flush`, whose completion the shell reports
//!    with [`RaftNode::on_flushed`].
//! 3. `Send`/`Respond`/`RespondFetch` go to the network.
//!
//! The production shell (the actors) and the deterministic simulator drive
//! the same code.

pub mod accumulator;
pub mod admission;
pub mod announce;
mod candidate;
pub mod commit;
pub mod election;
mod election_round;
mod follower;
pub mod leader;
mod leader_fetch;
pub mod log_view;
pub mod node;
mod prospective;
mod resigned;
pub mod snapshot_policy;
mod unattached;
pub mod vote;

pub use election::ElectionState;
pub use log_view::LogView;
pub use node::{
    Action, AppendRoute, ProposeError, Proposed, RaftConfig, RaftNode, ReadRange, RoleInfo, RoleKind,
    UnexpectedInstall, FETCH_READ_MAX_BYTES, SNAPSHOT_CHUNK_MAX_BYTES,
};

pub use crate::types::{Epoch, NodeId, Offset, MAX_LOG_OFFSET};

#[cfg(test)]
mod hostile_tests;
#[cfg(test)]
mod tests;
