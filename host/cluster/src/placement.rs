//! Where each pipeline should run: a pure function of what the leader read
//! from etcd and of the time, so every rule is tested without a cluster.
//!
//! - A pipeline stays where it is placed while its host is a member.
//! - A departed host's pipelines wait `placement_delay` (a host that blips
//!   and comes back keeps them), then go to the least loaded members.
//! - A new pipeline goes to the least loaded member at once.
//! - When one member runs two or more pipelines more than another (a host
//!   joined), one pipeline moves from the busiest to the idlest per plan,
//!   never one that moved within the cool-down: no pipeline moves twice in
//!   a row because of one join.
//! - Moves of placed pipelines (departed or rebalanced) are rate-limited.
//!
//! Load is the count of pipelines, then their declared memory.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::keys::PipelineId;

/// What placement weighs of a pipeline (the value of its `pipelines/` key).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Weight {
    /// The memory its sinks may take, as its pipeline file declares.
    pub memory_mb: u64,
}

/// What the leader read.
#[derive(Debug, Clone, Default)]
pub struct View {
    pub members: BTreeSet<String>,
    pub pipelines: BTreeMap<PipelineId, Weight>,
    pub placements: BTreeMap<PipelineId, String>,
}

/// One change to write: `to` None removes the placement (the pipeline is
/// no longer defined).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Move {
    pub id: PipelineId,
    pub from: Option<String>,
    pub to: Option<String>,
}

pub struct Placer {
    delay: Duration,
    moves_per_minute: u32,
    /// When each departed host was first seen gone.
    departed: BTreeMap<String, Instant>,
    /// The recent moves of placed pipelines, for the rate limit.
    recent: VecDeque<Instant>,
    /// When each pipeline last moved, for the cool-down.
    moved: BTreeMap<PipelineId, Instant>,
}

/// A pipeline that moved is not moved to rebalance again within this.
const COOL_DOWN: Duration = Duration::from_secs(60);

impl Placer {
    pub fn new(delay: Duration, moves_per_minute: u32) -> Self {
        Placer {
            delay,
            moves_per_minute,
            departed: BTreeMap::new(),
            recent: VecDeque::new(),
            moved: BTreeMap::new(),
        }
    }

    pub fn plan(&mut self, view: &View, now: Instant) -> Vec<Move> {
        let mut moves = Vec::new();
        while self
            .recent
            .front()
            .is_some_and(|at| now.duration_since(*at) >= Duration::from_secs(60))
        {
            self.recent.pop_front();
        }
        // Hosts seen gone, since when; a host back is forgiven.
        let placed_on: BTreeSet<&String> = view.placements.values().collect();
        self.departed
            .retain(|host, _| !view.members.contains(host) && placed_on.contains(host));
        for host in placed_on {
            if !view.members.contains(host) {
                self.departed.entry(host.clone()).or_insert(now);
            }
        }
        let mut load: BTreeMap<String, (usize, u64)> =
            view.members.iter().map(|m| (m.clone(), (0, 0))).collect();
        for (id, host) in &view.placements {
            if let (Some(entry), Some(weight)) = (load.get_mut(host), view.pipelines.get(id)) {
                entry.0 += 1;
                entry.1 += weight.memory_mb;
            }
        }
        for id in view.placements.keys() {
            if !view.pipelines.contains_key(id) {
                moves.push(Move {
                    id: id.clone(),
                    from: view.placements.get(id).cloned(),
                    to: None,
                });
            }
        }
        if view.members.is_empty() {
            return moves;
        }
        for (id, weight) in &view.pipelines {
            let from = view.placements.get(id);
            let due = match from {
                None => true,
                Some(host) if view.members.contains(host) => false,
                Some(host) => {
                    let gone_since = self.departed.get(host).copied().unwrap_or(now);
                    let waited = now.duration_since(gone_since) >= self.delay;
                    waited && self.may_move()
                }
            };
            if !due {
                continue;
            }
            let to = least_loaded(&load);
            let entry = load.get_mut(&to).expect("a member");
            entry.0 += 1;
            entry.1 += weight.memory_mb;
            if from.is_some() {
                self.recent.push_back(now);
                self.moved.insert(id.clone(), now);
            }
            moves.push(Move {
                id: id.clone(),
                from: from.cloned(),
                to: Some(to),
            });
        }
        // Rebalance one pipeline at a time, only once nothing else moves.
        if moves.is_empty() && self.may_move() {
            let busiest = load
                .iter()
                .max_by_key(|(_, l)| l.0)
                .map(|(h, l)| (h.clone(), l.0));
            let idlest = least_loaded(&load);
            if let Some((busiest, count)) = busiest
                && count >= load[&idlest].0 + 2
            {
                let candidate = view
                    .placements
                    .iter()
                    .filter(|(id, host)| {
                        **host == busiest
                            && view.pipelines.contains_key(*id)
                            && self
                                .moved
                                .get(*id)
                                .is_none_or(|at| now.duration_since(*at) >= COOL_DOWN)
                    })
                    .map(|(id, _)| id.clone())
                    .next();
                if let Some(id) = candidate {
                    self.recent.push_back(now);
                    self.moved.insert(id.clone(), now);
                    moves.push(Move {
                        id,
                        from: Some(busiest),
                        to: Some(idlest),
                    });
                }
            }
        }
        self.moved.retain(|id, at| {
            view.pipelines.contains_key(id) && now.duration_since(*at) < COOL_DOWN
        });
        moves
    }

    fn may_move(&self) -> bool {
        self.recent.len() < self.moves_per_minute as usize
    }
}

fn least_loaded(load: &BTreeMap<String, (usize, u64)>) -> String {
    load.iter()
        .min_by_key(|(host, l)| (l.0, l.1, (*host).clone()))
        .map(|(h, _)| h.clone())
        .expect("at least one member")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(n: usize) -> PipelineId {
        PipelineId::new("t", &format!("p{n}"))
    }

    fn view(members: &[&str], pipelines: usize, placed: &[(usize, &str)]) -> View {
        View {
            members: members.iter().map(|m| m.to_string()).collect(),
            pipelines: (0..pipelines).map(|n| (id(n), Weight::default())).collect(),
            placements: placed
                .iter()
                .map(|(n, h)| (id(*n), h.to_string()))
                .collect(),
        }
    }

    fn apply(view: &mut View, moves: &[Move]) {
        for m in moves {
            match &m.to {
                Some(to) => view.placements.insert(m.id.clone(), to.clone()),
                None => view.placements.remove(&m.id),
            };
        }
    }

    fn counts(view: &View) -> BTreeMap<String, usize> {
        let mut out = BTreeMap::new();
        for host in view.placements.values() {
            *out.entry(host.clone()).or_default() += 1;
        }
        out
    }

    #[test]
    fn new_pipelines_spread_over_the_members() {
        let mut placer = Placer::new(Duration::from_secs(5), 60);
        let mut v = view(&["a", "b", "c"], 6, &[]);
        let moves = placer.plan(&v, Instant::now());
        assert_eq!(moves.len(), 6);
        apply(&mut v, &moves);
        assert_eq!(counts(&v).values().copied().collect::<Vec<_>>(), [2, 2, 2]);
    }

    #[test]
    fn a_departed_hosts_pipelines_wait_out_the_delay_then_move() {
        let mut placer = Placer::new(Duration::from_secs(5), 60);
        let start = Instant::now();
        let mut v = view(&["a", "b"], 4, &[(0, "a"), (1, "b"), (2, "c"), (3, "c")]);
        assert!(placer.plan(&v, start).is_empty(), "a blip moves nothing");
        assert!(placer.plan(&v, start + Duration::from_secs(4)).is_empty());
        let moves = placer.plan(&v, start + Duration::from_secs(5));
        assert_eq!(moves.len(), 2);
        assert!(moves.iter().all(|m| m.from.as_deref() == Some("c")));
        apply(&mut v, &moves);
        assert_eq!(counts(&v).values().copied().collect::<Vec<_>>(), [2, 2]);
    }

    #[test]
    fn a_host_back_within_the_delay_keeps_its_pipelines() {
        let mut placer = Placer::new(Duration::from_secs(5), 60);
        let start = Instant::now();
        let gone = view(&["a"], 2, &[(0, "a"), (1, "b")]);
        assert!(placer.plan(&gone, start).is_empty());
        let back = view(&["a", "b"], 2, &[(0, "a"), (1, "b")]);
        assert!(
            placer
                .plan(&back, start + Duration::from_secs(3))
                .is_empty()
        );
        // Gone again: the delay starts over.
        assert!(
            placer
                .plan(&gone, start + Duration::from_secs(6))
                .is_empty()
        );
        assert_eq!(placer.plan(&gone, start + Duration::from_secs(11)).len(), 1);
    }

    #[test]
    fn moves_are_rate_limited() {
        let mut placer = Placer::new(Duration::ZERO, 3);
        let start = Instant::now();
        let placed: Vec<(usize, &str)> = (0..10).map(|n| (n, "gone")).collect();
        let mut v = view(&["a", "b"], 10, &placed);
        let first = placer.plan(&v, start);
        assert_eq!(first.len(), 3);
        apply(&mut v, &first);
        assert!(placer.plan(&v, start + Duration::from_secs(30)).is_empty());
        assert_eq!(placer.plan(&v, start + Duration::from_secs(61)).len(), 3);
    }

    #[test]
    fn a_joining_host_takes_pipelines_one_at_a_time_and_none_moves_twice() {
        let mut placer = Placer::new(Duration::from_secs(5), 60);
        let start = Instant::now();
        let placed: Vec<(usize, &str)> = (0..6)
            .map(|n| (n, if n % 2 == 0 { "a" } else { "b" }))
            .collect();
        let mut v = view(&["a", "b", "c"], 6, &placed);
        let mut moved = BTreeMap::<PipelineId, usize>::new();
        for step in 0..10 {
            let moves = placer.plan(&v, start + Duration::from_secs(step));
            assert!(moves.len() <= 1, "{moves:?}");
            for m in &moves {
                *moved.entry(m.id.clone()).or_default() += 1;
            }
            apply(&mut v, &moves);
        }
        assert_eq!(counts(&v).values().copied().collect::<Vec<_>>(), [2, 2, 2]);
        assert!(moved.values().all(|n| *n == 1), "{moved:?}");
        assert_eq!(moved.len(), 2);
    }

    #[test]
    fn a_pipeline_no_longer_defined_loses_its_placement() {
        let mut placer = Placer::new(Duration::from_secs(5), 60);
        let v = view(&["a"], 1, &[(0, "a"), (7, "a")]);
        let moves = placer.plan(&v, Instant::now());
        assert_eq!(
            moves,
            [Move {
                id: id(7),
                from: Some("a".into()),
                to: None
            }]
        );
    }
}
