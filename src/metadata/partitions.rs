//! Partition leadership rules the controller applies: who leads a
//! partition (the first of its replicas, in their order, that is in the
//! ISR and may lead), and what fencing a broker does to a partition (it
//! leaves the ISR and, if it led, the leadership goes to the next in line).

use super::image::PartitionRegistration;
use super::records::{BrokerId, PartitionChangeRecord, NO_LEADER};
use uuid::Uuid;

/// The leader a partition should have: the first replica (preferred
/// first) in the ISR for which `may_lead` holds (unfenced, not shutting
/// down), or none.
pub fn elect(partition: &PartitionRegistration, may_lead: impl Fn(BrokerId) -> bool) -> Option<BrokerId> {
    partition
        .replicas
        .iter()
        .copied()
        .find(|r| partition.isr.contains(r) && may_lead(*r))
}

/// The change fencing `broker` makes to one partition, if any: it leaves
/// the ISR (unless it is the last member: an ISR is never empty, the last
/// one stays as the one that has every committed record), and a partition
/// it led gets the next leader [`elect`] finds among the others, or none.
pub fn fence(
    topic_id: Uuid,
    partition_id: i32,
    partition: &PartitionRegistration,
    broker: BrokerId,
    may_lead: impl Fn(BrokerId) -> bool,
) -> Option<PartitionChangeRecord> {
    let in_isr = partition.isr.contains(&broker);
    let leads = partition.leader == broker;
    if !in_isr && !leads {
        return None;
    }
    let isr: Vec<BrokerId> = match partition
        .isr
        .iter()
        .copied()
        .filter(|r| *r != broker)
        .collect::<Vec<_>>()
    {
        rest if rest.is_empty() => partition.isr.clone(),
        rest => rest,
    };
    // The new ISR is the old one without `broker`, which may not lead.
    let leader = leads.then(|| elect(partition, |r| r != broker && may_lead(r)).unwrap_or(NO_LEADER));
    Some(PartitionChangeRecord {
        partition_id,
        topic_id,
        isr: (isr != partition.isr).then_some(isr),
        leader,
        replicas: None,
        removing_replicas: None,
        adding_replicas: None,
    })
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn partition(replicas: &[BrokerId], isr: &[BrokerId], leader: BrokerId) -> PartitionRegistration {
        PartitionRegistration {
            replicas: replicas.to_vec(),
            isr: isr.to_vec(),
            removing_replicas: vec![],
            adding_replicas: vec![],
            leader,
            leader_epoch: 3,
            partition_epoch: 5,
        }
    }

    #[test]
    fn the_preferred_replica_leads_when_it_is_in_the_isr_and_may() {
        let p = partition(&[1, 2, 3], &[2, 3, 1], 2);
        assert_eq!(elect(&p, |_| true), Some(1), "replica order, not ISR order");
        assert_eq!(elect(&p, |r| r != 1), Some(2));
        let out_of_sync = partition(&[1, 2, 3], &[3], 3);
        assert_eq!(elect(&out_of_sync, |_| true), Some(3));
        assert_eq!(elect(&out_of_sync, |r| r != 3), None);
    }

    #[test]
    fn a_fenced_leader_hands_over_to_the_next_in_line_and_leaves_the_isr() {
        let id = Uuid::from_bytes([1; 16]);
        let p = partition(&[1, 2, 3], &[1, 2, 3], 1);
        let change = fence(id, 0, &p, 1, |_| true).unwrap();
        assert_eq!((change.isr, change.leader), (Some(vec![2, 3]), Some(2)));
        // A follower leaves the ISR; the leader stays.
        let change = fence(id, 0, &p, 3, |_| true).unwrap();
        assert_eq!((change.isr, change.leader), (Some(vec![1, 2]), None));
        // Not a member: nothing to do.
        assert_eq!(fence(id, 0, &partition(&[1, 2, 3], &[1, 2], 1), 3, |_| true), None);
        // The last in the ISR stays there, leading nothing.
        let change = fence(id, 0, &partition(&[1, 2], &[1], 1), 1, |_| true).unwrap();
        assert_eq!((change.isr, change.leader), (None, Some(NO_LEADER)));
    }

    proptest! {
        #[test]
        fn after_fencing_the_broker_leads_nothing_and_the_isr_is_never_empty(
            replicas in proptest::sample::subsequence(vec![1, 2, 3, 4, 5], 1..=5).prop_shuffle(),
            isr_mask in any::<u8>(),
            fenced in 1i32..6,
            others_may_lead in any::<u8>(),
        ) {
            let mut isr: Vec<BrokerId> = replicas.iter().copied().filter(|r| isr_mask & (1 << r) != 0).collect();
            if isr.is_empty() {
                isr.push(replicas[0]);
            }
            let leader = isr[0];
            let p = partition(&replicas, &isr, leader);
            let may_lead = |r: BrokerId| others_may_lead & (1 << r) != 0;
            if let Some(change) = fence(Uuid::nil(), 0, &p, fenced, may_lead) {
                let new_isr = change.isr.clone().unwrap_or(p.isr.clone());
                let new_leader = change.leader.unwrap_or(p.leader);
                prop_assert!(!new_isr.is_empty());
                prop_assert!(new_isr.len() == 1 || !new_isr.contains(&fenced), "{:?}", new_isr);
                prop_assert_ne!(new_leader, fenced);
                if new_leader != NO_LEADER {
                    prop_assert!(new_isr.contains(&new_leader));
                    prop_assert!(new_leader == p.leader || may_lead(new_leader));
                }
            } else {
                prop_assert!(!isr.contains(&fenced) && leader != fenced);
            }
        }
    }
}
