//! When the caller of an accepted proposal is answered: the commit rule as
//! a client sees it (KIP-595; docs/ARCHITECTURE.md, "Protocol rules":
//! "Leader rules").
//!
//! A proposal accepted by the leader of epoch E (offsets
//! `[base_offset, last_offset]`) is **committed** once the high watermark,
//! the first offset not known to be committed, passes `last_offset` while
//! this node still leads E. Its outcome becomes **unknown** as soon as a
//! role change shows that leadership of E is gone for good (a later epoch,
//! or E in another role): the records may still commit under the next
//! leader, so the caller must never be told they failed. Until either
//! happens it waits.
//!
//! The shell (`actors::fetch_purgatory`) and the simulator's durability
//! checker both answer proposals with [`proposal_outcome`], so the rule is
//! written once and every simulated acknowledgement is checked against the
//! log.

use super::{Epoch, Offset, Proposed, RoleInfo, RoleKind};

/// What the caller of an accepted proposal is told now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProposalOutcome {
    /// Nothing is known yet: keep waiting.
    Pending,
    /// Committed at its offsets: the high watermark passed its last offset
    /// while this node led its epoch.
    Committed,
    /// Leadership of its epoch is gone: the records may or may not commit.
    Unknown,
}

/// The outcome of `proposed` given the latest high watermark and role this
/// node has seen (`None`: no role seen yet, which decides nothing).
pub fn proposal_outcome(proposed: &Proposed, high_watermark: Offset, role: Option<&RoleInfo>) -> ProposalOutcome {
    if leadership_lost(role, proposed.epoch) {
        ProposalOutcome::Unknown
    } else if proposed.last_offset < high_watermark && leads(role, proposed.epoch) {
        ProposalOutcome::Committed
    } else {
        ProposalOutcome::Pending
    }
}

/// True when `role` shows that leadership of `epoch` is gone for good: a
/// later epoch, or this epoch in another role. An unknown role or an
/// earlier epoch says nothing yet (a proposal of an epoch not yet
/// announced to the caller's side stays pending).
pub fn leadership_lost(role: Option<&RoleInfo>, epoch: Epoch) -> bool {
    match role {
        Some(role) => role.epoch > epoch || (role.epoch == epoch && role.role != RoleKind::Leader),
        None => false,
    }
}

fn leads(role: Option<&RoleInfo>, epoch: Epoch) -> bool {
    matches!(role, Some(role) if role.epoch == epoch && role.role == RoleKind::Leader)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn role(role: RoleKind, epoch: Epoch) -> RoleInfo {
        RoleInfo {
            role,
            epoch,
            leader_id: Some(1),
            voted_for: None,
            is_voter: true,
        }
    }

    const PROPOSED: Proposed = Proposed {
        base_offset: 10,
        last_offset: 12,
        epoch: 3,
    };

    #[test]
    fn committed_only_once_the_high_watermark_passes_the_last_offset_while_leading() {
        let leader = role(RoleKind::Leader, 3);
        assert_eq!(proposal_outcome(&PROPOSED, 12, Some(&leader)), ProposalOutcome::Pending);
        assert_eq!(
            proposal_outcome(&PROPOSED, 13, Some(&leader)),
            ProposalOutcome::Committed
        );
        // No role seen yet decides nothing, whatever the high watermark.
        assert_eq!(proposal_outcome(&PROPOSED, 13, None), ProposalOutcome::Pending);
    }

    #[test]
    fn unknown_once_leadership_of_its_epoch_is_gone_even_past_the_high_watermark() {
        for lost in [
            role(RoleKind::Follower, 3),
            role(RoleKind::Resigned, 3),
            role(RoleKind::Leader, 4),
        ] {
            assert_eq!(
                proposal_outcome(&PROPOSED, 13, Some(&lost)),
                ProposalOutcome::Unknown,
                "{lost:?}"
            );
        }
    }

    #[test]
    fn an_earlier_epoch_says_nothing_yet() {
        let earlier = role(RoleKind::Follower, 2);
        assert_eq!(
            proposal_outcome(&PROPOSED, 13, Some(&earlier)),
            ProposalOutcome::Pending
        );
    }
}
