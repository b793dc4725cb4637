//! Where a new topic's replicas go: striped over the racks, as Kafka's
//! controller places them.
//!
//! The unfenced brokers are lined up rack by rack in turn (the first of
//! each rack, then the second of each, ...), each rack's brokers shuffled,
//! so that neighbours in the line sit in different racks. Partition `p`
//! takes `replication_factor` neighbours starting at a random place plus
//! `p`: its first replica, the leader, moves one broker along the line per
//! partition, so the leaders spread evenly, and no broker holds two
//! replicas of one partition. Fenced brokers are used only when the
//! unfenced ones are too few to fill a partition, and never lead.

use std::collections::BTreeMap;

use rand::seq::SliceRandom;
use rand::Rng;

use super::records::BrokerId;

/// A broker as placement sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Candidate {
    pub id: BrokerId,
    pub rack: Option<String>,
    pub fenced: bool,
}

/// Why replicas cannot be placed, with Kafka's error names.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PlacementError {
    #[error("INVALID_REPLICATION_FACTOR: {0}")]
    InvalidReplicationFactor(String),
    #[error("INVALID_PARTITIONS: {0}")]
    InvalidPartitions(String),
}

/// The replicas of each of `partitions` new partitions, the leader first.
pub fn place(
    brokers: &[Candidate],
    partitions: usize,
    replication_factor: usize,
    rng: &mut impl Rng,
) -> Result<Vec<Vec<BrokerId>>, PlacementError> {
    if partitions == 0 {
        return Err(PlacementError::InvalidPartitions(
            "the number of partitions must be at least 1".into(),
        ));
    }
    if replication_factor == 0 {
        return Err(PlacementError::InvalidReplicationFactor(
            "the replication factor must be at least 1".into(),
        ));
    }
    if replication_factor > brokers.len() {
        return Err(PlacementError::InvalidReplicationFactor(format!(
            "the replication factor {replication_factor} is larger than the {} registered brokers",
            brokers.len()
        )));
    }
    let unfenced = striped(brokers.iter().filter(|b| !b.fenced), rng);
    if unfenced.is_empty() {
        return Err(PlacementError::InvalidReplicationFactor(
            "all brokers are currently fenced".into(),
        ));
    }
    let fenced = striped(brokers.iter().filter(|b| b.fenced), rng);
    let (start, fenced_start) = (rng.gen_range(0..unfenced.len()), rng.gen_range(0..fenced.len().max(1)));
    let from_unfenced = replication_factor.min(unfenced.len());
    Ok((0..partitions)
        .map(|p| {
            let mut replicas: Vec<BrokerId> = (0..from_unfenced)
                .map(|i| unfenced[(start + p + i) % unfenced.len()])
                .collect();
            replicas
                .extend((0..replication_factor - from_unfenced).map(|i| fenced[(fenced_start + p + i) % fenced.len()]));
            replicas
        })
        .collect())
}

/// The brokers lined up rack by rack in turn, each rack shuffled; the
/// racks (brokers without one form their own) in name order.
fn striped<'a>(brokers: impl Iterator<Item = &'a Candidate>, rng: &mut impl Rng) -> Vec<BrokerId> {
    let mut racks: BTreeMap<Option<&str>, Vec<BrokerId>> = BTreeMap::new();
    for broker in brokers {
        racks.entry(broker.rack.as_deref()).or_default().push(broker.id);
    }
    let mut racks: Vec<Vec<BrokerId>> = racks.into_values().collect();
    for rack in &mut racks {
        rack.sort_unstable();
        rack.shuffle(rng);
    }
    let deepest = racks.iter().map(Vec::len).max().unwrap_or(0);
    (0..deepest)
        .flat_map(|depth| racks.iter().filter_map(move |rack| rack.get(depth).copied()))
        .collect()
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeSet, HashMap};

    use proptest::prelude::*;
    use rand::rngs::SmallRng;
    use rand::SeedableRng;

    use super::*;

    fn broker(id: BrokerId, rack: Option<&str>, fenced: bool) -> Candidate {
        Candidate {
            id,
            rack: rack.map(str::to_string),
            fenced,
        }
    }

    /// Up to 12 brokers, some fenced, on up to 4 racks (or none).
    fn brokers() -> impl Strategy<Value = Vec<Candidate>> {
        proptest::collection::vec((0u8..5, any::<bool>()), 1..12).prop_map(|spec| {
            spec.into_iter()
                .enumerate()
                .map(|(i, (rack, fenced))| {
                    let rack = (rack < 4).then(|| format!("r{rack}"));
                    broker(i as BrokerId + 1, rack.as_deref(), fenced)
                })
                .collect()
        })
    }

    proptest! {
        #[test]
        fn no_broker_holds_two_replicas_of_a_partition_and_only_an_unfenced_one_leads(
            brokers in brokers(), partitions in 1usize..40, rf in 1usize..5, seed: u64,
        ) {
            let mut rng = SmallRng::seed_from_u64(seed);
            match place(&brokers, partitions, rf, &mut rng) {
                Ok(placed) => {
                    prop_assert_eq!(placed.len(), partitions);
                    let fenced: BTreeSet<BrokerId> = brokers.iter().filter(|b| b.fenced).map(|b| b.id).collect();
                    let unfenced = brokers.len() - fenced.len();
                    for replicas in &placed {
                        prop_assert_eq!(replicas.len(), rf);
                        let distinct: BTreeSet<_> = replicas.iter().collect();
                        prop_assert_eq!(distinct.len(), rf, "{:?}", replicas);
                        prop_assert!(!fenced.contains(&replicas[0]), "fenced leader in {:?}", replicas);
                        // Fenced brokers only where the unfenced ones are too few.
                        let used_fenced = replicas.iter().filter(|id| fenced.contains(id)).count();
                        prop_assert_eq!(used_fenced, rf.saturating_sub(unfenced), "{:?}", replicas);
                    }
                }
                Err(PlacementError::InvalidReplicationFactor(_)) => {
                    prop_assert!(rf > brokers.len() || brokers.iter().all(|b| b.fenced));
                }
                Err(e) => prop_assert!(false, "{e}"),
            }
        }

        #[test]
        fn leaders_spread_within_one_partition_per_broker(
            count in 1usize..10, partitions in 1usize..60, rf in 1usize..4, seed: u64,
        ) {
            let brokers: Vec<Candidate> = (1..=count as BrokerId).map(|id| broker(id, None, false)).collect();
            let rf = rf.min(count);
            let placed = place(&brokers, partitions, rf, &mut SmallRng::seed_from_u64(seed)).unwrap();
            let mut led: HashMap<BrokerId, usize> = brokers.iter().map(|b| (b.id, 0)).collect();
            for replicas in &placed {
                *led.get_mut(&replicas[0]).unwrap() += 1;
            }
            let (least, most) = (led.values().min().unwrap(), led.values().max().unwrap());
            prop_assert!(most - least <= 1, "{:?}", led);
        }

        #[test]
        fn replicas_spread_over_racks_when_there_are_enough(
            racks in 1usize..5, per_rack in 1usize..4, partitions in 1usize..30, rf in 1usize..5, seed: u64,
        ) {
            let rf = rf.min(racks);
            let brokers: Vec<Candidate> = (0..racks * per_rack)
                .map(|i| broker(i as BrokerId + 1, Some(&format!("r{}", i % racks)), false))
                .collect();
            let rack_of: HashMap<BrokerId, String> =
                brokers.iter().map(|b| (b.id, b.rack.clone().unwrap())).collect();
            let placed = place(&brokers, partitions, rf, &mut SmallRng::seed_from_u64(seed)).unwrap();
            for replicas in &placed {
                let used: BTreeSet<&String> = replicas.iter().map(|id| &rack_of[id]).collect();
                prop_assert_eq!(used.len(), rf, "{:?}", replicas);
            }
        }
    }

    /// When fenced brokers must fill replicas, they are taken in turn like
    /// the unfenced ones: never twice in a partition, evenly over the
    /// partitions.
    #[test]
    fn fenced_brokers_filling_replicas_are_spread_like_the_others() {
        let brokers = [
            broker(1, None, false),
            broker(2, None, true),
            broker(3, None, true),
            broker(4, None, true),
        ];
        for seed in 0..20 {
            let placed = place(&brokers, 3, 3, &mut SmallRng::seed_from_u64(seed)).unwrap();
            let mut held: HashMap<BrokerId, usize> = HashMap::new();
            for replicas in &placed {
                assert_eq!(replicas[0], 1, "the unfenced broker leads: {placed:?}");
                assert_eq!(replicas.iter().collect::<BTreeSet<_>>().len(), 3, "{placed:?}");
                for id in replicas {
                    *held.entry(*id).or_default() += 1;
                }
            }
            assert_eq!((held[&2], held[&3], held[&4]), (2, 2, 2), "seed {seed}: {placed:?}");
        }
    }

    #[test]
    fn too_few_brokers_or_nothing_to_place_are_clear_errors() {
        let mut rng = SmallRng::seed_from_u64(1);
        let two = [broker(1, None, false), broker(2, None, false)];
        let error = place(&two, 1, 3, &mut rng).unwrap_err();
        assert_eq!(
            error.to_string(),
            "INVALID_REPLICATION_FACTOR: the replication factor 3 is larger than the 2 registered brokers"
        );
        assert!(matches!(
            place(&two, 0, 1, &mut rng),
            Err(PlacementError::InvalidPartitions(_))
        ));
        assert!(matches!(
            place(&two, 1, 0, &mut rng),
            Err(PlacementError::InvalidReplicationFactor(_))
        ));
        let fenced = [broker(1, None, true)];
        let error = place(&fenced, 1, 1, &mut rng).unwrap_err();
        assert!(
            error.to_string().contains("all brokers are currently fenced"),
            "{error}"
        );
    }
}
