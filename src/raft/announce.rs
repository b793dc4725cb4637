//! When a node's metadata listeners are told who leads (Kafka's
//! `ListenerContext.maybeFireLeaderChange`; docs/ARCHITECTURE.md,
//! "Protocol rules": "Leader rules").
//!
//! Another node's leadership (or that none is known) is told as soon as
//! the role change is seen. This node's own leadership is told only from
//! the record stream, once the listener has been given the LeaderChange
//! control record of the current epoch (the epoch start offset): a
//! listener that acted as leader before then would act on a stale image.

use super::{Epoch, NodeId, RoleInfo, RoleKind};
use crate::messages::Record;

/// Who leads which epoch, as listeners are told it (`LeaderChanged`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Leadership {
    pub epoch: Epoch,
    pub leader_id: Option<NodeId>,
}

/// The leader change to tell listeners of as soon as `role` is seen on
/// node `node_id`; None when it leads (or is about to say so), which the
/// record stream announces instead.
pub fn leader_change_on_role(role: &RoleInfo, node_id: NodeId) -> Option<Leadership> {
    if role.role == RoleKind::Leader || role.leader_id == Some(node_id) {
        return None;
    }
    Some(Leadership {
        epoch: role.epoch,
        leader_id: role.leader_id,
    })
}

/// The leader change a committed `record` of a batch of `record_epoch`
/// announces, given the node's current epoch: the LeaderChange record that
/// starts the current epoch. Records of earlier epochs announce nothing
/// (their leaders are gone).
pub fn leader_change_in_stream(
    record: &Record,
    record_epoch: Epoch,
    current_epoch: Option<Epoch>,
) -> Option<Leadership> {
    match record {
        Record::LeaderChange { leader_id, .. } if Some(record_epoch) == current_epoch => Some(Leadership {
            epoch: record_epoch,
            leader_id: Some(*leader_id),
        }),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn role(role: RoleKind, epoch: Epoch, leader_id: Option<NodeId>) -> RoleInfo {
        RoleInfo {
            role,
            epoch,
            leader_id,
            voted_for: None,
            is_voter: true,
        }
    }

    #[test]
    fn another_leader_or_none_is_told_at_once_but_never_this_nodes_own() {
        let told = leader_change_on_role(&role(RoleKind::Follower, 4, Some(2)), 1);
        assert_eq!(
            told,
            Some(Leadership {
                epoch: 4,
                leader_id: Some(2)
            })
        );
        let none = leader_change_on_role(&role(RoleKind::Unattached, 5, None), 1);
        assert_eq!(
            none,
            Some(Leadership {
                epoch: 5,
                leader_id: None
            })
        );
        assert_eq!(leader_change_on_role(&role(RoleKind::Leader, 4, Some(1)), 1), None);
        // Resigned, or restarting as the former leader: still not told at once.
        assert_eq!(leader_change_on_role(&role(RoleKind::Resigned, 4, Some(1)), 1), None);
    }

    #[test]
    fn only_the_leader_change_record_of_the_current_epoch_announces() {
        let record = Record::LeaderChange {
            leader_id: 1,
            voters: vec![1, 2, 3],
            granting_voters: vec![1, 2],
        };
        assert_eq!(
            leader_change_in_stream(&record, 4, Some(4)),
            Some(Leadership {
                epoch: 4,
                leader_id: Some(1)
            })
        );
        assert_eq!(leader_change_in_stream(&record, 3, Some(4)), None, "an earlier epoch's");
        assert_eq!(leader_change_in_stream(&record, 4, None), None, "no role seen yet");
        assert_eq!(leader_change_in_stream(&Record::NoOp, 4, Some(4)), None);
    }
}
