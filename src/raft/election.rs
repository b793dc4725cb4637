//! The election state every voter persists before acting on it (Kafka's
//! `quorum-state` file).

use serde::{Deserialize, Serialize};

use super::{Epoch, NodeId};

/// What a node must remember across a crash.
///
/// Invariants: the persisted `epoch` never decreases; within one epoch
/// `voted_for` is set at most once (never changed to another candidate).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ElectionState {
    pub epoch: Epoch,
    /// The candidate this node voted for in `epoch` (itself when it was candidate).
    pub voted_for: Option<NodeId>,
    /// The leader this node knew in `epoch` (itself when it was leader).
    pub leader_id: Option<NodeId>,
}

impl ElectionState {
    pub fn unattached(epoch: Epoch) -> Self {
        ElectionState {
            epoch,
            voted_for: None,
            leader_id: None,
        }
    }
}
