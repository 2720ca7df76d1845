//! Crash tests for the commit core: a deterministic simulation of a source,
//! a sink with `positions`, a sink without, and the position store. A run is
//! cut short before its k-th action (as SIGKILL would), everything volatile
//! is thrown away, and a new run recovers from what was durable. For every k
//! the destinations are then compared with the source of truth.

use std::collections::{BTreeMap, BTreeSet};

use super::*;

const TABLES: [&str; 2] = ["a", "b"];

#[derive(Clone, Debug, PartialEq)]
struct Change {
    table: &'static str,
    key: u32,
    value: Option<u32>, // None: delete
    pos: Position,
}

/// 12 transactions over two tables, with updates, deletes and re-inserts.
fn source() -> Vec<Vec<Change>> {
    let mut txs = Vec::new();
    for tx in 1..=12u64 {
        let mut changes = Vec::new();
        for ordinal in 0..((tx % 3) + 1) as u32 {
            let table = TABLES[((tx + ordinal as u64) % 2) as usize];
            let key = ((tx * 7 + ordinal as u64) % 5) as u32;
            let value = if (tx + ordinal as u64).is_multiple_of(4) {
                None
            } else {
                Some(tx as u32 * 100 + ordinal)
            };
            changes.push(Change {
                table,
                key,
                value,
                pos: Position::stream(tx, ordinal),
            });
        }
        txs.push(changes);
    }
    txs
}

fn expected() -> BTreeMap<&'static str, BTreeMap<u32, u32>> {
    let mut state: BTreeMap<&str, BTreeMap<u32, u32>> = BTreeMap::new();
    for c in source().into_iter().flatten() {
        let t = state.entry(c.table).or_default();
        match c.value {
            Some(v) => t.insert(c.key, v),
            None => t.remove(&c.key),
        };
    }
    for t in TABLES {
        state.entry(t).or_default();
    }
    state
}

/// A positioned sink's table: applied changes and (position, epoch),
/// committed together.
type PositionedTable = (Vec<Change>, Option<(Position, u64)>);

/// Durable state of everything outside the host process.
#[derive(Default, Clone)]
struct World {
    /// Sink with `positions`: per table, applied changes and the position,
    /// committed together.
    positioned: BTreeMap<&'static str, PositionedTable>,
    /// Sink without `positions`: an append-only change log per table.
    plain: BTreeMap<&'static str, Vec<Change>>,
    /// The host's out-of-sink store.
    store: BTreeMap<(SinkId, String), Position>,
    epoch: u64,
    /// Every checkpoint the host acknowledged to the source.
    acknowledged: Vec<Position>,
}

const POSITIONED: SinkId = 0;
const PLAIN: SinkId = 1;

fn specs() -> Vec<SinkSpec> {
    vec![
        SinkSpec {
            name: "exact".into(),
            required: true,
            positioned: true,
        },
        SinkSpec {
            name: "log".into(),
            required: true,
            positioned: false,
        },
    ]
}

enum RunEnd {
    Finished,
    Crashed,
}

/// Runs the pipeline over the whole source, flushing every `flush_every`
/// transactions, and crashes before action number `crash_at` if given.
fn run(world: &mut World, flush_every: usize, crash_at: Option<usize>) -> RunEnd {
    world.epoch += 1;
    let table_names: Vec<String> = TABLES.iter().map(|t| t.to_string()).collect();
    let mut core = Core::new(
        "p",
        world.epoch,
        CommitPolicy::Required,
        table_names.clone(),
        specs(),
    );
    let mut steps = 0usize;
    let mut queue: Vec<Action> = Vec::new();
    for table in TABLES {
        let from_sink = world
            .positioned
            .get(table)
            .and_then(|(_, p)| p.as_ref().map(|(p, _)| p.clone()));
        for sink in [POSITIONED, PLAIN] {
            let from_store = world.store.get(&(sink, table.to_string())).cloned();
            let from_sink = (sink == POSITIONED).then(|| from_sink.clone()).flatten();
            queue.extend(core.recover(sink, table, from_sink, from_store));
        }
    }
    for action in queue.drain(..) {
        let Action::Record {
            sink,
            table,
            position,
        } = action
        else {
            panic!("recovery asked for {action:?}")
        };
        match position {
            Some(p) => world.store.insert((sink, table), p),
            None => world.store.remove(&(sink, table)),
        };
    }
    let resume = core.resume();
    let txs: Vec<Vec<Change>> = source()
        .into_iter()
        .map(|tx| {
            tx.into_iter()
                .filter(|c| match &resume {
                    Resume::FromStart => true,
                    Resume::After(p) => c.pos > *p,
                })
                .collect::<Vec<_>>()
        })
        .filter(|tx| !tx.is_empty())
        .collect();

    let mut staged: BTreeMap<(SinkId, &str), Vec<Change>> = BTreeMap::new();
    for chunk in txs.chunks(flush_every) {
        let high = chunk.last().unwrap().last().unwrap().pos.clone();
        for table in TABLES {
            let rows: Vec<Change> = chunk
                .iter()
                .flatten()
                .filter(|c| c.table == table)
                .cloned()
                .collect();
            let low = rows.first().map_or(high.clone(), |c| c.pos.clone());
            let mut queue = core.offer(table, low, high.clone());
            while !queue.is_empty() {
                let action = queue.remove(0);
                if crash_at == Some(steps) {
                    return RunEnd::Crashed;
                }
                steps += 1;
                let event = match action {
                    Action::Stage { sink, after, .. } => {
                        let keep = rows
                            .iter()
                            .filter(|c| after.as_ref().is_none_or(|a| c.pos > *a))
                            .cloned();
                        staged.entry((sink, table)).or_default().extend(keep);
                        Event::Staged { sink }
                    }
                    Action::Commit { sink, request } => {
                        let batch = staged.remove(&(sink, table)).unwrap_or_default();
                        if sink == POSITIONED {
                            let entry = world.positioned.entry(table).or_default();
                            if let Some((_, epoch)) = &entry.1 {
                                assert!(request.epoch >= *epoch, "zombie commit accepted");
                            }
                            entry.0.extend(batch);
                            entry.1 = Some((request.high, request.epoch));
                        } else {
                            world.plain.entry(table).or_default().extend(batch);
                        }
                        Event::Committed { sink }
                    }
                    Action::Record {
                        sink,
                        table,
                        position,
                    } => {
                        world.store.insert((sink, table), position.unwrap());
                        Event::Recorded { sink }
                    }
                    Action::Checkpoint { position } => {
                        for t in TABLES {
                            let (_, durable) = &world.positioned[t];
                            assert!(
                                durable.as_ref().is_some_and(|(p, _)| *p >= position),
                                "checkpoint {position} passed what the required sink holds for {t}"
                            );
                        }
                        world.acknowledged.push(position);
                        continue;
                    }
                    Action::Disable { .. } => panic!("no sink fails here"),
                };
                queue.extend(core.handle(event).expect("no sink fails here"));
            }
            assert!(!core.busy());
        }
    }
    RunEnd::Finished
}

/// Applies a change log in position order (last change per key wins).
fn reduce(log: &[Change]) -> BTreeMap<u32, u32> {
    let mut sorted = log.to_vec();
    sorted.sort_by(|a, b| a.pos.cmp(&b.pos));
    let mut state = BTreeMap::new();
    for c in sorted {
        match c.value {
            Some(v) => state.insert(c.key, v),
            None => state.remove(&c.key),
        };
    }
    state
}

struct Verdict {
    plain_duplicates: usize,
}

fn verify(world: &World) -> Verdict {
    let expected = expected();
    let mut plain_duplicates = 0;
    for table in TABLES {
        let (log, position) = world.positioned.get(table).cloned().unwrap_or_default();
        let mut seen = BTreeSet::new();
        for c in &log {
            assert!(
                seen.insert(c.pos.clone()),
                "positioned sink applied {:?} twice",
                c.pos
            );
        }
        assert_eq!(
            reduce(&log),
            expected[table],
            "positioned sink, table {table}"
        );
        assert_eq!(
            position.map(|(p, _)| p),
            Some(source().last().unwrap().last().unwrap().pos.clone())
        );

        let plain = world.plain.get(table).cloned().unwrap_or_default();
        assert_eq!(reduce(&plain), expected[table], "plain sink, table {table}");
        let unique: BTreeSet<_> = plain.iter().map(|c| c.pos.clone()).collect();
        plain_duplicates += plain.len() - unique.len();
    }
    // A new run may acknowledge the same position again, never a lower one.
    for pair in world.acknowledged.windows(2) {
        assert!(pair[0] <= pair[1], "checkpoint moved backwards");
    }
    Verdict { plain_duplicates }
}

/// How many actions an uninterrupted run takes.
fn actions_in_clean_run(flush_every: usize) -> usize {
    let mut n = 0;
    loop {
        let mut world = World::default();
        match run(&mut world, flush_every, Some(n)) {
            RunEnd::Crashed => n += 1,
            RunEnd::Finished => return n,
        }
    }
}

#[test]
fn clean_run_is_exact_without_duplicates() {
    for flush_every in [1, 2, 5] {
        let mut world = World::default();
        assert!(matches!(
            run(&mut world, flush_every, None),
            RunEnd::Finished
        ));
        assert_eq!(verify(&world).plain_duplicates, 0);
    }
}

#[test]
fn crash_before_every_action_loses_nothing_and_duplicates_only_in_the_plain_sink() {
    for flush_every in [1, 3] {
        let total = actions_in_clean_run(flush_every);
        assert!(total > 20, "the run is too short to crash in the middle");
        let mut saw_duplicates = false;
        let mut crash_kinds = BTreeSet::new();
        for crash_at in 0..total {
            let mut world = World::default();
            // Which action the crash lands before, to prove every kind was hit.
            crash_kinds.insert(kind_of_action(flush_every, crash_at));
            assert!(matches!(
                run(&mut world, flush_every, Some(crash_at)),
                RunEnd::Crashed
            ));
            assert!(matches!(
                run(&mut world, flush_every, None),
                RunEnd::Finished
            ));
            let verdict = verify(&world);
            saw_duplicates |= verdict.plain_duplicates > 0;
        }
        assert!(
            saw_duplicates,
            "a crash between the plain sink's commit and the store write must replay"
        );
        for kind in ["stage", "commit", "record"] {
            assert!(
                crash_kinds.contains(kind),
                "no crash landed before a {kind}"
            );
        }
    }
}

/// The kind of the action a run executes as its `index`-th step.
fn kind_of_action(flush_every: usize, index: usize) -> &'static str {
    // A crashed first run executes exactly the first actions of a clean
    // first run, so replaying the clean schedule names them.
    let mut kinds = Vec::new();
    record_kinds(flush_every, &mut kinds);
    kinds.get(index).copied().unwrap_or("none")
}

fn record_kinds(flush_every: usize, kinds: &mut Vec<&'static str>) {
    let mut core = Core::new(
        "p",
        1,
        CommitPolicy::Required,
        TABLES.iter().map(|t| t.to_string()).collect(),
        specs(),
    );
    for chunk in source().chunks(flush_every) {
        let high = chunk.last().unwrap().last().unwrap().pos.clone();
        for table in TABLES {
            let mut queue = core.offer(table, high.clone(), high.clone());
            while !queue.is_empty() {
                let action = queue.remove(0);
                let event = match action {
                    Action::Stage { sink, .. } => {
                        kinds.push("stage");
                        Event::Staged { sink }
                    }
                    Action::Commit { sink, .. } => {
                        kinds.push("commit");
                        Event::Committed { sink }
                    }
                    Action::Record { sink, .. } => {
                        kinds.push("record");
                        Event::Recorded { sink }
                    }
                    Action::Checkpoint { .. } => {
                        kinds.push("checkpoint");
                        continue;
                    }
                    Action::Disable { .. } => unreachable!(),
                };
                queue.extend(core.handle(event).unwrap());
            }
        }
    }
}

#[test]
fn losing_the_store_keeps_the_positioned_sink_exact_and_shows_duplicates_in_the_plain_one() {
    let total = actions_in_clean_run(2);
    let mut world = World::default();
    assert!(matches!(
        run(&mut world, 2, Some(total / 2)),
        RunEnd::Crashed
    ));
    world.store.clear();
    // The plain sink now restarts from the beginning, below what was
    // acknowledged before: a source that already released it (Postgres)
    // cannot serve that replay, which is why losing the store costs sinks
    // without `positions` their guarantee. Here the source can replay.
    world.acknowledged.clear();
    assert!(matches!(run(&mut world, 2, None), RunEnd::Finished));
    let verdict = verify(&world);
    assert!(
        verdict.plain_duplicates > 0,
        "without its positions the plain sink must see a replay (duplicates, not loss)"
    );
}

#[test]
fn the_sink_wins_over_the_store_and_the_store_is_repaired() {
    let mut core = Core::new("p", 2, CommitPolicy::Required, vec!["a".into()], specs());
    let sink_says = Position::stream(9, 0);
    let store_says = Position::stream(4, 0);
    let repairs = core.recover(
        POSITIONED,
        "a",
        Some(sink_says.clone()),
        Some(store_says.clone()),
    );
    assert_eq!(
        repairs,
        vec![Action::Record {
            sink: POSITIONED,
            table: "a".into(),
            position: Some(sink_says.clone()),
        }]
    );
    assert_eq!(
        core.committed(POSITIONED, "a"),
        Some((&sink_says, Origin::Sink))
    );
    // The plain sink only has the store.
    assert!(
        core.recover(PLAIN, "a", None, Some(store_says.clone()))
            .is_empty()
    );
    assert_eq!(
        core.committed(PLAIN, "a"),
        Some((&store_says, Origin::Store))
    );
    assert_eq!(core.resume(), Resume::After(store_says));
    // A sink that lost its table (it says nothing) wins too: the store entry goes.
    let repairs = core.recover(POSITIONED, "a", None, Some(sink_says));
    assert_eq!(
        repairs,
        vec![Action::Record {
            sink: POSITIONED,
            table: "a".into(),
            position: None,
        }]
    );
    assert_eq!(core.resume(), Resume::FromStart);
}

#[test]
fn replayed_batches_are_dropped_for_sinks_that_have_them() {
    let mut core = Core::new("p", 3, CommitPolicy::Required, vec!["a".into()], specs());
    core.recover(POSITIONED, "a", Some(Position::stream(5, 0)), None);
    core.recover(PLAIN, "a", None, Some(Position::stream(2, 0)));
    let actions = core.offer("a", Position::stream(3, 0), Position::stream(4, 0));
    assert_eq!(
        actions,
        vec![Action::Stage {
            sink: PLAIN,
            table: "a".into(),
            after: Some(Position::stream(2, 0)),
        }]
    );
}

fn drive_ok(
    core: &mut Core,
    mut queue: Vec<Action>,
    fail: Option<(SinkId, Failure)>,
) -> Result<Vec<Action>, Box<Stop>> {
    let mut seen = Vec::new();
    while !queue.is_empty() {
        let action = queue.remove(0);
        seen.push(action.clone());
        let event = match &action {
            Action::Stage { sink, .. } => match &fail {
                Some((s, failure)) if s == sink => Event::Failed {
                    sink: *sink,
                    failure: failure.clone(),
                },
                _ => Event::Staged { sink: *sink },
            },
            Action::Commit { sink, .. } => Event::Committed { sink: *sink },
            Action::Record { sink, .. } => Event::Recorded { sink: *sink },
            Action::Checkpoint { .. } | Action::Disable { .. } => continue,
        };
        queue.extend(core.handle(event)?);
    }
    Ok(seen)
}

#[test]
fn a_failing_required_sink_stops_without_a_checkpoint() {
    let mut core = Core::new("p", 1, CommitPolicy::Required, vec!["a".into()], specs());
    let failure = Failure {
        kind: FailureKind::Poison,
        message: "bad decimal".into(),
    };
    let offered = core.offer("a", Position::stream(1, 0), Position::stream(1, 2));
    let stop = drive_ok(&mut core, offered, Some((PLAIN, failure))).unwrap_err();
    assert_eq!(stop.sink, "log");
    assert_eq!(stop.table, "a");
    let text = stop.to_string();
    assert!(
        text.contains("1/0") && text.contains("1/2") && text.contains("bad decimal"),
        "{text}"
    );
    assert_eq!(core.checkpoint(), None);
}

#[test]
fn a_failing_optional_sink_is_disabled_and_the_others_go_on() {
    let mut sinks = specs();
    sinks[PLAIN].required = false;
    let mut core = Core::new("p", 1, CommitPolicy::Required, vec!["a".into()], sinks);
    let failure = Failure {
        kind: FailureKind::Broken,
        message: "trap".into(),
    };
    let offered = core.offer("a", Position::stream(1, 0), Position::stream(1, 0));
    let seen = drive_ok(&mut core, offered, Some((PLAIN, failure))).unwrap();
    assert!(
        seen.iter()
            .any(|a| matches!(a, Action::Disable { sink: PLAIN, .. }))
    );
    assert_eq!(core.checkpoint(), Some(&Position::stream(1, 0)));
    assert!(core.is_disabled(PLAIN).unwrap().contains("trap"));
    // The disabled sink keeps its (absent) position, so the next run replays for it.
    assert_eq!(core.resume(), Resume::FromStart);
    let offered = core.offer("a", Position::stream(2, 0), Position::stream(2, 0));
    assert!(
        offered
            .iter()
            .all(|a| !matches!(a, Action::Stage { sink: PLAIN, .. }))
    );
}

#[test]
fn a_fenced_optional_sink_still_stops_the_pipeline() {
    let mut sinks = specs();
    sinks[POSITIONED].required = false;
    let mut core = Core::new("p", 1, CommitPolicy::Required, vec!["a".into()], sinks);
    let failure = Failure {
        kind: FailureKind::Fenced,
        message: "epoch 7 committed".into(),
    };
    let offered = core.offer("a", Position::stream(1, 0), Position::stream(1, 0));
    assert!(drive_ok(&mut core, offered, Some((POSITIONED, failure))).is_err());
}

#[test]
fn policies_decide_when_the_checkpoint_moves() {
    let three = || {
        vec![
            SinkSpec {
                name: "r".into(),
                required: true,
                positioned: true,
            },
            SinkSpec {
                name: "o1".into(),
                required: false,
                positioned: false,
            },
            SinkSpec {
                name: "o2".into(),
                required: false,
                positioned: false,
            },
        ]
    };
    let lagging = Position::stream(1, 0);
    let ahead = Position::stream(5, 0);
    let checkpoint_for = |policy| {
        let mut core = Core::new("p", 1, policy, vec!["a".into()], three());
        core.recover(0, "a", Some(lagging.clone()), None);
        core.recover(1, "a", None, Some(lagging.clone()));
        core.recover(2, "a", None, None);
        // Sinks 0 and 1 take the batch; sink 2 (never committed) fails and is disabled.
        let offered = core.offer("a", ahead.clone(), ahead.clone());
        let failure = Failure {
            kind: FailureKind::Broken,
            message: "x".into(),
        };
        drive_ok(&mut core, offered, Some((2, failure))).unwrap();
        core.checkpoint().cloned()
    };
    assert_eq!(checkpoint_for(CommitPolicy::Required), Some(ahead.clone()));
    assert_eq!(checkpoint_for(CommitPolicy::Quorum), Some(ahead.clone()));
    assert_eq!(checkpoint_for(CommitPolicy::All), None);
}

#[test]
fn commits_carry_the_runs_epoch() {
    let mut core = Core::new(
        "pipe",
        42,
        CommitPolicy::Required,
        vec!["a".into()],
        specs(),
    );
    let offered = core.offer("a", Position::stream(1, 0), Position::stream(1, 0));
    let seen = drive_ok(&mut core, offered, None).unwrap();
    let commits: Vec<_> = seen
        .iter()
        .filter_map(|a| match a {
            Action::Commit { request, .. } => Some(request),
            _ => None,
        })
        .collect();
    assert_eq!(commits.len(), 2);
    assert!(
        commits
            .iter()
            .all(|r| r.epoch == 42 && r.pipeline == "pipe")
    );
}
