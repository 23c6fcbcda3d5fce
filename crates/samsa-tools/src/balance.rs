//! The rebalance planner: where each partition's replicas should live so
//! that replicas and preferred leaders spread evenly over the brokers that
//! may hold them, moving as little as it can. Pure: brokers and the
//! current placement in, the placements that change out; `samsa cluster
//! rebalance` and `decommission` execute what it returns.
//!
//! The plan, in order:
//! 1. replicas on brokers that may not hold any (excluded: being
//!    decommissioned, or gone from the metadata) are replaced, each by the
//!    least-loaded eligible broker, preferring a rack the partition does
//!    not use yet (when brokers declare `broker.rack`);
//! 2. while the most-loaded eligible broker holds two replicas more than
//!    the least-loaded one, one replica moves from it to the least-loaded
//!    broker, a follower replica before a leader and never onto a rack the
//!    partition already uses when it did not before;
//! 3. the preferred leader (the first replica) of each partition becomes
//!    the member leading the fewest partitions so far, the current one on
//!    a tie; then, while the busiest leader leads two partitions more than
//!    another member of one of them, that member takes one over.
//!
//! Invariants: a planned replica list has the partition's replication
//! factor, no broker twice and only eligible brokers; a partition whose
//! list comes out unchanged is not in the plan.

use std::collections::{BTreeMap, BTreeSet};

use anyhow::{bail, Result};

/// A broker that may be given replicas, with its rack.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Broker {
    pub id: i32,
    pub rack: Option<String>,
}

/// One partition's replicas, preferred leader first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    pub topic: String,
    pub partition: i32,
    pub replicas: Vec<i32>,
}

/// The placements that change (see the module docs); `brokers` are the
/// eligible brokers.
pub fn plan(brokers: &[Broker], current: &[Placement]) -> Result<Vec<Placement>> {
    if brokers.is_empty() {
        bail!("no broker is left to hold the partitions");
    }
    let rack: BTreeMap<i32, Option<&str>> =
        brokers.iter().map(|b| (b.id, b.rack.as_deref())).collect();
    let racks_of = |replicas: &[i32]| -> BTreeSet<Option<&str>> {
        replicas
            .iter()
            .filter_map(|b| rack.get(b).copied().flatten())
            .map(Some)
            .collect()
    };
    let mut load: BTreeMap<i32, usize> = rack.keys().map(|&b| (b, 0)).collect();
    let mut planned: Vec<Vec<i32>> = current
        .iter()
        .map(|p| {
            p.replicas
                .iter()
                .copied()
                .filter(|b| rack.contains_key(b))
                .collect()
        })
        .collect();
    for replicas in &planned {
        for b in replicas {
            *load.entry(*b).or_default() += 1;
        }
    }

    // 1. Replace replicas on brokers that may not hold them, in place.
    for (p, replicas) in current.iter().zip(planned.iter_mut()) {
        if p.replicas.len() > rack.len() {
            bail!(
                "{}-{} has {} replicas but only {} brokers may hold them",
                p.topic,
                p.partition,
                p.replicas.len(),
                rack.len()
            );
        }
        let mut rebuilt = Vec::with_capacity(p.replicas.len());
        for b in &p.replicas {
            if rack.contains_key(b) {
                rebuilt.push(*b);
                continue;
            }
            let used: Vec<i32> = replicas.iter().chain(&rebuilt).copied().collect();
            let used_racks = racks_of(&used);
            let choice = load
                .iter()
                .filter(|(c, _)| !used.contains(c))
                .min_by_key(|(c, n)| {
                    let rack_used = rack
                        .get(c)
                        .copied()
                        .flatten()
                        .is_some_and(|r| used_racks.contains(&Some(r)));
                    (rack_used, **n, **c)
                })
                .map(|(c, _)| *c);
            let Some(choice) = choice else {
                bail!(
                    "no broker left for a replica of {}-{}",
                    p.topic,
                    p.partition
                );
            };
            *load.entry(choice).or_default() += 1;
            rebuilt.push(choice);
        }
        *replicas = rebuilt;
    }

    // 2. Even out the replica counts, one move at a time.
    let max_moves = planned.iter().map(Vec::len).sum::<usize>() * 2;
    for _ in 0..max_moves {
        let Some((&most, &high)) = load.iter().max_by_key(|(b, n)| (**n, -**b)) else {
            break;
        };
        let Some((&least, &low)) = load.iter().min_by_key(|(b, n)| (**n, **b)) else {
            break;
        };
        if high <= low + 1 {
            break;
        }
        let candidate = planned
            .iter()
            .enumerate()
            .filter(|(_, r)| r.contains(&most) && !r.contains(&least))
            .filter(|(_, r)| {
                // Never put two replicas on one rack that did not share one.
                let Some(target_rack) = rack.get(&least).copied().flatten() else {
                    return true;
                };
                let others: Vec<i32> = r.iter().copied().filter(|b| *b != most).collect();
                !racks_of(&others).contains(&Some(target_rack))
            })
            .min_by_key(|(i, r)| (r.first() == Some(&most), *i))
            .map(|(i, _)| i);
        let Some(i) = candidate else { break };
        for b in planned[i].iter_mut() {
            if *b == most {
                *b = least;
            }
        }
        *load.entry(most).or_default() -= 1;
        *load.entry(least).or_default() += 1;
    }

    // 3. Spread the preferred leaders.
    let mut leads: BTreeMap<i32, usize> = BTreeMap::new();
    for (p, replicas) in current.iter().zip(planned.iter_mut()) {
        let current_first = p.replicas.first().copied();
        let Some(&leader) = replicas.iter().min_by_key(|b| {
            (
                leads.get(b).copied().unwrap_or(0),
                Some(**b) != current_first,
                **b,
            )
        }) else {
            continue;
        };
        *leads.entry(leader).or_default() += 1;
        if let Some(pos) = replicas.iter().position(|b| *b == leader) {
            let b = replicas.remove(pos);
            replicas.insert(0, b);
        }
    }
    // The greedy pass favours brokers met early; hand leaderships from the
    // busiest leader to the idlest member of one of its partitions.
    for b in rack.keys() {
        leads.entry(*b).or_default();
    }
    for _ in 0..planned.len() * 2 {
        let Some((&most, &high)) = leads.iter().max_by_key(|(b, n)| (**n, -**b)) else {
            break;
        };
        let handover = planned
            .iter()
            .enumerate()
            .filter(|(_, r)| r.first() == Some(&most))
            .filter_map(|(i, r)| {
                let (to, n) = r[1..]
                    .iter()
                    .map(|b| (*b, leads.get(b).copied().unwrap_or(0)))
                    .min_by_key(|(b, n)| (*n, *b))?;
                (n + 1 < high).then_some((i, to, n))
            })
            .min_by_key(|(i, _, n)| (*n, *i));
        let Some((i, to, _)) = handover else { break };
        if let Some(pos) = planned[i].iter().position(|b| *b == to) {
            let b = planned[i].remove(pos);
            planned[i].insert(0, b);
        }
        *leads.entry(most).or_default() -= 1;
        *leads.entry(to).or_default() += 1;
    }

    Ok(current
        .iter()
        .zip(planned)
        .filter(|(p, replicas)| p.replicas != *replicas)
        .map(|(p, replicas)| Placement {
            topic: p.topic.clone(),
            partition: p.partition,
            replicas,
        })
        .collect())
}

/// The plan as Kafka's `kafka-reassign-partitions.sh` reads it.
pub fn reassignment_json(plan: &[Placement]) -> serde_json::Value {
    serde_json::json!({
        "version": 1,
        "partitions": plan
            .iter()
            .map(|p| serde_json::json!({
                "topic": p.topic,
                "partition": p.partition,
                "replicas": p.replicas,
            }))
            .collect::<Vec<_>>(),
    })
}

/// Reads Kafka's reassignment JSON (`{"version":1,"partitions":[{"topic",
/// "partition","replicas"}]}`); `log_dirs` entries are ignored.
pub fn parse_reassignment_json(text: &str) -> Result<Vec<Placement>> {
    #[derive(serde::Deserialize)]
    struct File {
        partitions: Vec<Entry>,
    }
    #[derive(serde::Deserialize)]
    struct Entry {
        topic: String,
        partition: i32,
        replicas: Vec<i32>,
    }
    let file: File = serde_json::from_str(text)?;
    Ok(file
        .partitions
        .into_iter()
        .map(|e| Placement {
            topic: e.topic,
            partition: e.partition,
            replicas: e.replicas,
        })
        .collect())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn brokers(ids: &[i32]) -> Vec<Broker> {
        ids.iter().map(|&id| Broker { id, rack: None }).collect()
    }

    fn placements(lists: &[&[i32]]) -> Vec<Placement> {
        lists
            .iter()
            .enumerate()
            .map(|(i, r)| Placement {
                topic: "t".into(),
                partition: i32::try_from(i).unwrap(),
                replicas: r.to_vec(),
            })
            .collect()
    }

    fn apply(current: &[Placement], plan: &[Placement]) -> Vec<Vec<i32>> {
        current
            .iter()
            .map(|p| {
                plan.iter()
                    .find(|q| q.partition == p.partition)
                    .map_or_else(|| p.replicas.clone(), |q| q.replicas.clone())
            })
            .collect()
    }

    fn counts(after: &[Vec<i32>]) -> (BTreeMap<i32, usize>, BTreeMap<i32, usize>) {
        let mut replicas = BTreeMap::new();
        let mut leaders = BTreeMap::new();
        for r in after {
            for b in r {
                *replicas.entry(*b).or_default() += 1;
            }
            *leaders.entry(r[0]).or_default() += 1;
        }
        (replicas, leaders)
    }

    #[test]
    fn a_new_broker_gets_its_share_of_replicas_and_leaders() {
        let current = placements(&[&[1, 2, 3][..]; 6]);
        let moves = plan(&brokers(&[1, 2, 3, 4]), &current).unwrap();
        let after = apply(&current, &moves);
        let (replicas, leaders) = counts(&after);
        assert_eq!(replicas.values().sum::<usize>(), 18);
        assert!(
            replicas.values().all(|n| (4..=5).contains(n)),
            "{replicas:?}"
        );
        assert!(leaders.values().all(|n| *n <= 2), "{leaders:?}");
        assert_eq!(leaders.len(), 4, "every broker leads some: {leaders:?}");
        for r in &after {
            assert_eq!(r.len(), 3);
            assert_eq!(r.iter().collect::<BTreeSet<_>>().len(), 3, "{r:?}");
        }
    }

    #[test]
    fn growing_from_three_to_five_spreads_leaders_within_one() {
        let rotations: [&[i32]; 3] = [&[1, 2, 3], &[2, 3, 1], &[3, 1, 2]];
        let current = placements(&(0..27).map(|i| rotations[i % 3]).collect::<Vec<_>>());
        let moves = plan(&brokers(&[1, 2, 3, 4, 5]), &current).unwrap();
        let (replicas, leaders) = counts(&apply(&current, &moves));
        let spread =
            |m: &BTreeMap<i32, usize>| m.values().max().unwrap() - m.values().min().unwrap();
        assert_eq!(leaders.len(), 5, "{leaders:?}");
        assert!(spread(&replicas) <= 1, "{replicas:?}");
        assert!(spread(&leaders) <= 1, "{leaders:?}");
    }

    #[test]
    fn decommissioning_moves_every_replica_off_the_broker() {
        let current = placements(&[&[1, 2, 3], &[2, 3, 1], &[3, 1, 2], &[1, 3, 2]]);
        let moves = plan(&brokers(&[2, 3, 4]), &current).unwrap();
        let after = apply(&current, &moves);
        for r in &after {
            assert!(!r.contains(&1), "{after:?}");
            assert_eq!(r.iter().collect::<BTreeSet<_>>().len(), 3);
        }
        assert!(
            plan(&brokers(&[2, 3]), &current).is_err(),
            "RF 3 on 2 brokers"
        );
    }

    #[test]
    fn a_balanced_cluster_needs_no_moves_and_racks_are_spread() {
        let current = placements(&[&[1, 2, 3], &[2, 3, 1], &[3, 1, 2]]);
        assert!(plan(&brokers(&[1, 2, 3]), &current).unwrap().is_empty());

        let racked = vec![
            Broker {
                id: 1,
                rack: Some("a".into()),
            },
            Broker {
                id: 2,
                rack: Some("a".into()),
            },
            Broker {
                id: 3,
                rack: Some("b".into()),
            },
            Broker {
                id: 4,
                rack: Some("b".into()),
            },
        ];
        let current = placements(&[&[1, 5], &[3, 5]]);
        let after = apply(&current, &plan(&racked, &current).unwrap());
        assert_eq!(after[0].len(), 2);
        assert!(
            after[0].contains(&1) && (after[0].contains(&3) || after[0].contains(&4)),
            "{after:?}"
        );
        assert!(
            after[1].contains(&3) && (after[1].contains(&1) || after[1].contains(&2)),
            "{after:?}"
        );
    }

    #[test]
    fn reassignment_json_round_trips() {
        let moves = placements(&[&[2, 3, 4]]);
        let text = reassignment_json(&moves).to_string();
        assert_eq!(parse_reassignment_json(&text).unwrap(), moves);
    }
}
