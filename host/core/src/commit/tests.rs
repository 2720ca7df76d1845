//! Crash tests for the commit core: a deterministic simulation of a source,
//! a sink with `positions`, a sink without, and the position store. A run is
//! cut short before its k-th action (as SIGKILL would), everything volatile
//! is thrown away, and a new run recovers from what was durable. For every k
//! the destinations are then compared with the source of truth.

use std::collections::{BTreeMap, BTreeSet};

use super::*;

const TABLES: [&str; 2] = ["a", "b"];

/// The `ordinal`th change of transaction `tx`, in the layout the generator
/// uses (the core only compares the bytes).
fn tx_pos(tx: u64, ordinal: u32) -> Position {
    let mut order = tx.to_be_bytes().to_vec();
    order.extend_from_slice(&ordinal.to_be_bytes());
    Position::streaming(&order)
}

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
                pos: tx_pos(tx, ordinal),
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

/// The crash: an effect that never happens, and nothing after it.
#[derive(Debug)]
struct Crashed;

/// The simulated host process: the executor's effects over the durable
/// [`World`], plus what a crash throws away (staged batches).
struct Sim<'w> {
    world: &'w mut World,
    /// The changes of the batch on offer, for the table on offer.
    batch: Vec<Change>,
    staged: BTreeMap<SinkId, Vec<Change>>,
    steps: usize,
    crash_at: Option<usize>,
    /// The kind of every step taken, in order.
    kinds: Vec<&'static str>,
    /// A sink whose stage calls fail, and how.
    fail: Option<(SinkId, Failure)>,
    /// Whether a checkpoint must be covered by the positioned sink in every
    /// table (the whole-pipeline runs; unit tests drive one table).
    strict: bool,
    commits: Vec<CommitRequest>,
    disabled: Vec<SinkId>,
}

impl<'w> Sim<'w> {
    fn new(world: &'w mut World, crash_at: Option<usize>) -> Self {
        Sim {
            world,
            batch: Vec::new(),
            staged: BTreeMap::new(),
            steps: 0,
            crash_at,
            kinds: Vec::new(),
            fail: None,
            strict: true,
            commits: Vec::new(),
            disabled: Vec::new(),
        }
    }

    /// Counts one step that changes something, crashing before it if it
    /// is the chosen one.
    fn step(&mut self, kind: &'static str) -> Result<(), Crashed> {
        if self.crash_at == Some(self.steps) {
            return Err(Crashed);
        }
        self.steps += 1;
        self.kinds.push(kind);
        Ok(())
    }

    fn call(&mut self, call: SinkCall) -> Result<Result<(), Failure>, Crashed> {
        match call {
            SinkCall::Stage { sink, after, .. } => {
                self.step("stage")?;
                if let Some((failing, failure)) = &self.fail
                    && *failing == sink
                {
                    return Ok(Err(failure.clone()));
                }
                let keep = self
                    .batch
                    .iter()
                    .filter(|c| after.as_ref().is_none_or(|a| c.pos > *a))
                    .cloned();
                self.staged.entry(sink).or_default().extend(keep);
            }
            SinkCall::Commit { sink, request } => {
                self.step("commit")?;
                self.commits.push(request.clone());
                let batch = self.staged.remove(&sink).unwrap_or_default();
                let table = TABLES
                    .into_iter()
                    .find(|t| *t == request.table)
                    .expect("a known table");
                if sink == POSITIONED {
                    let entry = self.world.positioned.entry(table).or_default();
                    if let Some((_, epoch)) = &entry.1
                        && request.epoch < *epoch
                    {
                        return Ok(Err(Failure {
                            kind: FailureKind::Fenced,
                            message: format!("epoch {epoch} committed"),
                        }));
                    }
                    entry.0.extend(batch);
                    entry.1 = Some((request.high, request.epoch));
                } else {
                    self.world.plain.entry(table).or_default().extend(batch);
                }
            }
        }
        Ok(Ok(()))
    }
}

impl Effects for Sim<'_> {
    type Error = Crashed;

    fn stored(&mut self, sink: SinkId, table: &str) -> Result<Option<Position>, Crashed> {
        Ok(self.world.store.get(&(sink, table.to_string())).cloned())
    }

    fn sink_committed(&mut self, sink: SinkId, table: &str) -> Result<Option<SinkClaim>, Crashed> {
        assert_eq!(sink, POSITIONED, "only positioned sinks are asked");
        Ok(self
            .world
            .positioned
            .get(table)
            .and_then(|(_, p)| p.clone())
            .map(|(position, epoch)| SinkClaim { position, epoch }))
    }

    fn raise_epoch(&mut self, at_least: u64) -> Result<u64, Crashed> {
        self.step("epoch")?;
        self.world.epoch = self.world.epoch.max(at_least);
        Ok(self.world.epoch)
    }

    fn call_sinks(&mut self, calls: Vec<SinkCall>) -> Result<Vec<Result<(), Failure>>, Crashed> {
        calls.into_iter().map(|call| self.call(call)).collect()
    }

    fn record(&mut self, records: &[Record]) -> Result<(), Crashed> {
        self.step("record")?;
        for r in records {
            let key = (r.sink, r.table.clone());
            match &r.position {
                Some(p) => self.world.store.insert(key, p.clone()),
                None => self.world.store.remove(&key),
            };
        }
        Ok(())
    }

    fn checkpoint(&mut self, position: &Position) -> Result<(), Crashed> {
        self.step("checkpoint")?;
        for t in TABLES.into_iter().filter(|_| self.strict) {
            let durable = self.world.positioned.get(t).and_then(|(_, p)| p.as_ref());
            assert!(
                durable.is_some_and(|(p, _)| p >= position),
                "checkpoint {position} passed what the required sink holds for {t}"
            );
            let stored = self.world.store.get(&(POSITIONED, t.to_string()));
            assert!(
                stored.is_some_and(|p| p >= position),
                "checkpoint {position} passed what the store holds for the positioned sink in {t}"
            );
        }
        self.world.acknowledged.push(position.clone());
        Ok(())
    }

    fn disable(&mut self, sink: SinkId, _table: &str, _reason: &str) -> Result<(), Crashed> {
        self.staged.remove(&sink);
        self.disabled.push(sink);
        Ok(())
    }

    fn reached(&mut self, _point: CrashPoint) -> Result<(), Crashed> {
        Ok(())
    }
}

fn new_core(epoch: u64, policy: CommitPolicy, sinks: Vec<SinkSpec>) -> Core {
    Core::new(
        "p",
        epoch,
        policy,
        TABLES.iter().map(|t| t.to_string()).collect(),
        sinks,
    )
}

/// Runs the pipeline over the whole source through the executor, flushing
/// every `flush_every` transactions, and crashes before step `crash_at` if
/// given. Returns how it ended and the kinds of the steps it took.
fn run(
    world: &mut World,
    flush_every: usize,
    crash_at: Option<usize>,
) -> (RunEnd, Vec<&'static str>) {
    run_recording(world, flush_every, crash_at, None, true)
}

/// [`run`], with the positioned sink's records deferred and written every
/// `record_every` committed batches (and once at the end) when given, and
/// without the plain sink unless `plain`.
fn run_recording(
    world: &mut World,
    flush_every: usize,
    crash_at: Option<usize>,
    record_every: Option<usize>,
    plain: bool,
) -> (RunEnd, Vec<&'static str>) {
    world.epoch += 1;
    let sinks = specs().into_iter().filter(|s| plain || s.positioned);
    let mut core = new_core(world.epoch, CommitPolicy::Required, sinks.collect());
    if record_every.is_some() {
        core.defer_positioned_records();
    }
    let mut sim = Sim::new(world, crash_at);
    let tables: Vec<String> = TABLES.iter().map(|t| t.to_string()).collect();
    let resume = match recover_all(&mut core, &tables, &[], &mut sim) {
        Ok(resume) => resume,
        Err(ExecError::Effect(Crashed)) => return (RunEnd::Crashed, sim.kinds),
        Err(e) => panic!("recovery failed: {e:?}"),
    };
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
    let mut batches = 0;
    for chunk in txs.chunks(flush_every) {
        let high = chunk.last().unwrap().last().unwrap().pos.clone();
        for table in TABLES {
            sim.batch = chunk
                .iter()
                .flatten()
                .filter(|c| c.table == table)
                .cloned()
                .collect();
            let low = sim.batch.first().map_or(high.clone(), |c| c.pos.clone());
            match commit_batch(&mut core, table, low, high.clone(), &mut sim) {
                Ok(()) => assert!(!core.busy()),
                Err(ExecError::Effect(Crashed)) => return (RunEnd::Crashed, sim.kinds),
                Err(e) => panic!("no sink fails here: {e:?}"),
            }
            batches += 1;
            if record_every.is_some_and(|every| batches % every == 0)
                && let Err(ExecError::Effect(Crashed)) = record_deferred(&mut core, &mut sim)
            {
                return (RunEnd::Crashed, sim.kinds);
            }
        }
    }
    if record_every.is_some()
        && let Err(ExecError::Effect(Crashed)) = record_deferred(&mut core, &mut sim)
    {
        return (RunEnd::Crashed, sim.kinds);
    }
    (RunEnd::Finished, sim.kinds)
}

/// Applies a change log in position order: the last change per key wins.
fn reduce(log: &[Change]) -> BTreeMap<u32, u32> {
    let mut sorted = log.to_vec();
    sorted.sort_by(|a, b| a.pos.cmp(&b.pos));
    sorted.into_iter().fold(BTreeMap::new(), |mut state, c| {
        match c.value {
            Some(v) => state.insert(c.key, v),
            None => state.remove(&c.key),
        };
        state
    })
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

        if world.plain.is_empty() {
            // A pipeline of the positioned sink alone.
            continue;
        }
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

/// The kinds of the steps an uninterrupted first run takes.
fn clean_run_steps(flush_every: usize) -> Vec<&'static str> {
    let mut world = World::default();
    let (end, kinds) = run(&mut world, flush_every, None);
    assert!(matches!(end, RunEnd::Finished));
    kinds
}

#[test]
fn clean_run_is_exact_without_duplicates() {
    for flush_every in [1, 2, 5] {
        let mut world = World::default();
        assert!(matches!(
            run(&mut world, flush_every, None).0,
            RunEnd::Finished
        ));
        assert_eq!(verify(&world).plain_duplicates, 0);
    }
}

#[test]
fn crash_before_every_step_loses_nothing_and_duplicates_only_in_the_plain_sink() {
    for flush_every in [1, 3] {
        let clean = clean_run_steps(flush_every);
        assert!(
            clean.len() > 20,
            "the run is too short to crash in the middle"
        );
        let mut saw_duplicates = false;
        let mut crash_kinds = BTreeSet::new();
        for (crash_at, kind) in clean.iter().enumerate() {
            let mut world = World::default();
            let (end, taken) = run(&mut world, flush_every, Some(crash_at));
            assert!(matches!(end, RunEnd::Crashed));
            // A crashed first run takes exactly the clean run's first steps,
            // so the crash landed before a step of this kind.
            assert_eq!(taken, clean[..crash_at]);
            crash_kinds.insert(*kind);
            assert!(matches!(
                run(&mut world, flush_every, None).0,
                RunEnd::Finished
            ));
            let verdict = verify(&world);
            saw_duplicates |= verdict.plain_duplicates > 0;
        }
        assert!(
            saw_duplicates,
            "a crash between the plain sink's commit and the store write must replay"
        );
        for kind in ["stage", "commit", "record", "checkpoint"] {
            assert!(
                crash_kinds.contains(kind),
                "no crash landed before a {kind}"
            );
        }
    }
}

#[test]
fn deferred_records_survive_a_crash_before_every_step_and_leave_the_store_whole() {
    let shapes = [(1, 3, true), (3, 2, true), (1, 3, false), (2, 100, false)];
    for (flush_every, record_every, plain) in shapes {
        let steps = |world: &mut World, crash_at, record_every| {
            run_recording(world, flush_every, crash_at, record_every, plain)
        };
        let (end, clean) = steps(&mut World::default(), None, Some(record_every));
        assert!(matches!(end, RunEnd::Finished));
        let (_, per_commit) = steps(&mut World::default(), None, None);
        let records = |kinds: &[&str]| kinds.iter().filter(|k| **k == "record").count();
        // With the plain sink its records are made each commit and the
        // deferred ones ride along; alone, the positioned sink's records
        // are made every `record_every` batches.
        assert!(
            records(&clean) <= records(&per_commit)
                && (plain || records(&clean) < records(&per_commit)),
            "deferring made {} store writes, recording each commit {}",
            records(&clean),
            records(&per_commit)
        );
        let mut crash_kinds = BTreeSet::new();
        for (crash_at, kind) in clean.iter().enumerate() {
            let mut world = World::default();
            let (end, taken) = steps(&mut world, Some(crash_at), Some(record_every));
            assert!(matches!(end, RunEnd::Crashed));
            assert_eq!(taken, clean[..crash_at]);
            crash_kinds.insert(*kind);
            // The next run defers again, or records each commit (the
            // pipeline file's choice may change between runs).
            let next = (crash_at % 2 == 0).then_some(record_every);
            assert!(matches!(steps(&mut world, None, next).0, RunEnd::Finished));
            verify(&world);
            // After a run that ended, the store holds where the sink stands.
            for table in TABLES {
                let sink = world.positioned[table].1.as_ref().map(|(p, _)| p);
                let stored = world.store.get(&(POSITIONED, table.to_string()));
                assert_eq!(stored, sink, "store of table {table} after the run");
            }
        }
        for kind in ["stage", "commit", "record", "checkpoint"] {
            assert!(
                crash_kinds.contains(kind),
                "no crash landed before a {kind}"
            );
        }
    }
}

#[test]
fn with_deferred_records_the_checkpoint_waits_for_the_store() {
    let mut world = World::default();
    let mut sim = Sim::new(&mut world, None);
    sim.strict = false;
    let mut core = new_core(1, CommitPolicy::Required, vec![specs()[0].clone()]);
    core.defer_positioned_records();
    let tables: Vec<String> = TABLES.iter().map(|t| t.to_string()).collect();
    recover_all(&mut core, &tables, &[], &mut sim).unwrap();
    for table in TABLES {
        commit_batch(&mut core, table, tx_pos(1, 0), tx_pos(1, 3), &mut sim).unwrap();
    }
    commit_batch(&mut core, TABLES[0], tx_pos(2, 0), tx_pos(2, 1), &mut sim).unwrap();
    assert!(
        sim.world.acknowledged.is_empty(),
        "acknowledged before the record"
    );
    assert!(
        sim.world.store.is_empty(),
        "recorded before it was asked to"
    );
    assert_eq!(core.unrecorded().len(), TABLES.len());
    assert!(record_deferred(&mut core, &mut sim).unwrap());
    assert_eq!(sim.kinds.iter().filter(|k| **k == "record").count(), 1);
    let stored = |table: &str| {
        sim.world
            .store
            .get(&(POSITIONED, table.to_string()))
            .cloned()
    };
    assert_eq!(stored(TABLES[0]), Some(tx_pos(2, 1)));
    assert_eq!(stored(TABLES[1]), Some(tx_pos(1, 3)));
    assert_eq!(sim.world.acknowledged, vec![tx_pos(1, 3)]);
    assert!(core.unrecorded().is_empty());
    assert!(
        !record_deferred(&mut core, &mut sim).unwrap(),
        "nothing left to record"
    );
}

#[test]
fn losing_the_store_keeps_the_positioned_sink_exact_and_shows_duplicates_in_the_plain_one() {
    let total = clean_run_steps(2).len();
    let mut world = World::default();
    assert!(matches!(
        run(&mut world, 2, Some(total / 2)).0,
        RunEnd::Crashed
    ));
    world.store.clear();
    // The plain sink now restarts from the beginning, below what was
    // acknowledged before: a source that already released it (Postgres)
    // cannot serve that replay, which is why losing the store costs sinks
    // without `positions` their guarantee. Here the source can replay.
    world.acknowledged.clear();
    assert!(matches!(run(&mut world, 2, None).0, RunEnd::Finished));
    let verdict = verify(&world);
    assert!(
        verdict.plain_duplicates > 0,
        "without its positions the plain sink must see a replay (duplicates, not loss)"
    );
}

fn claim(position: &Position) -> Option<SinkClaim> {
    Some(SinkClaim {
        position: position.clone(),
        epoch: 1,
    })
}

#[test]
fn the_sink_wins_over_the_store_and_the_store_is_repaired() {
    let mut core = Core::new("p", 2, CommitPolicy::Required, vec!["a".into()], specs());
    let sink_says = tx_pos(9, 0);
    let store_says = tx_pos(4, 0);
    let repairs = core
        .recover(POSITIONED, "a", claim(&sink_says), Some(store_says.clone()))
        .unwrap();
    assert_eq!(
        repairs,
        vec![Action::Record(Record {
            sink: POSITIONED,
            table: "a".into(),
            position: Some(sink_says.clone()),
        })]
    );
    assert_eq!(
        core.committed(POSITIONED, "a"),
        Some((&sink_says, Origin::Sink))
    );
    // The plain sink only has the store.
    let repairs = core.recover(PLAIN, "a", None, Some(store_says.clone()));
    assert!(repairs.unwrap().is_empty());
    assert_eq!(
        core.committed(PLAIN, "a"),
        Some((&store_says, Origin::Store))
    );
    assert_eq!(core.resume(), Resume::After(store_says));
    // A sink that lost its table (it says nothing) wins too: the store entry goes.
    let repairs = core
        .recover(POSITIONED, "a", None, Some(sink_says))
        .unwrap();
    assert_eq!(
        repairs,
        vec![Action::Record(Record {
            sink: POSITIONED,
            table: "a".into(),
            position: None,
        })]
    );
    assert_eq!(core.resume(), Resume::FromStart);
}

#[test]
fn replayed_batches_are_dropped_for_sinks_that_have_them() {
    let mut core = Core::new("p", 3, CommitPolicy::Required, vec!["a".into()], specs());
    core.recover(POSITIONED, "a", claim(&tx_pos(5, 0)), None)
        .unwrap();
    core.recover(PLAIN, "a", None, Some(tx_pos(2, 0))).unwrap();
    let actions = core.offer("a", tx_pos(3, 0), tx_pos(4, 0));
    assert_eq!(
        actions,
        vec![Action::Call(SinkCall::Stage {
            sink: PLAIN,
            table: "a".into(),
            after: Some(tx_pos(2, 0)),
        })]
    );
}

#[test]
fn a_run_takes_an_epoch_above_any_a_sink_has_seen() {
    let mut world = World {
        epoch: 3,
        ..Default::default()
    };
    world
        .positioned
        .insert("a", (Vec::new(), Some((tx_pos(1, 0), 9))));
    let mut core = new_core(world.epoch, CommitPolicy::Required, specs());
    let mut sim = Sim::new(&mut world, None);
    let tables: Vec<String> = TABLES.iter().map(|t| t.to_string()).collect();
    recover_all(&mut core, &tables, &[], &mut sim).unwrap();
    assert_eq!(core.epoch(), 10);
    assert_eq!(world.epoch, 10, "the store holds the raised epoch");
}

#[test]
fn a_position_claim_beyond_the_source_head_is_refused_naming_the_sink() {
    let mut core = Core::new("p", 1, CommitPolicy::Required, vec!["a".into()], specs());
    core.set_source_head(Some(tx_pos(10, 3)));
    let honest = claim(&tx_pos(10, 3));
    assert!(core.recover(POSITIONED, "a", honest, None).is_ok());
    let lie = claim(&tx_pos(11, 0));
    let refused = core.recover(POSITIONED, "a", lie, None).unwrap_err();
    assert_eq!(refused.sink, "exact");
    let text = refused.to_string();
    assert!(
        text.contains(&tx_pos(11, 0).to_string()) && text.contains(&tx_pos(10, 3).to_string()),
        "{text}"
    );
    assert_eq!(
        core.committed(POSITIONED, "a").map(|(p, _)| p.clone()),
        Some(tx_pos(10, 3)),
        "the lie moved nothing"
    );
}

#[test]
fn an_optional_sink_with_an_impossible_claim_is_disabled_and_the_run_goes_on() {
    let mut sinks = specs();
    sinks[POSITIONED].required = false;
    let mut core = Core::new("p", 1, CommitPolicy::Required, vec!["a".into()], sinks);
    let lie = SinkClaim {
        position: tx_pos(1, 0),
        epoch: u64::MAX - 1,
    };
    let store_says = tx_pos(1, 0);
    let actions = core
        .recover(POSITIONED, "a", Some(lie), Some(store_says.clone()))
        .unwrap();
    assert!(
        matches!(&actions[..], [Action::Disable { sink: POSITIONED, reason }] if reason.contains("exact")),
        "{actions:?}"
    );
    assert!(core.is_disabled(POSITIONED).is_some());
    assert_eq!(core.epoch_floor(), Ok(None), "the lie raised no epoch");
    assert_eq!(
        core.committed(POSITIONED, "a"),
        Some((&store_says, Origin::Store))
    );
}

#[test]
fn an_impossible_epoch_claim_is_refused_naming_the_sink() {
    for lie in [u64::MAX, u64::MAX - 1, MAX_EPOCH] {
        let mut core = Core::new("p", 4, CommitPolicy::Required, vec!["a".into()], specs());
        let claim = SinkClaim {
            position: tx_pos(1, 0),
            epoch: lie,
        };
        let refused = core
            .recover(POSITIONED, "a", Some(claim), None)
            .unwrap_err();
        assert_eq!(refused.sink, "exact");
        assert!(
            refused.to_string().contains(&format!("epoch {lie}")),
            "{refused}"
        );
        assert_eq!(core.epoch_floor(), Ok(None), "the lie moved nothing");
    }
    // The largest honest claim still leaves room to fence it.
    let mut core = Core::new("p", 4, CommitPolicy::Required, vec!["a".into()], specs());
    let claim = SinkClaim {
        position: tx_pos(1, 0),
        epoch: MAX_EPOCH - 1,
    };
    core.recover(POSITIONED, "a", Some(claim), None).unwrap();
    assert_eq!(core.epoch_floor(), Ok(Some(MAX_EPOCH)));
}

/// Offers one batch of table `a` and runs it through the executor, with
/// `fail` making one sink's stage call fail.
fn drive(
    core: &mut Core,
    low: Position,
    high: Position,
    fail: Option<(SinkId, Failure)>,
) -> (
    Result<(), ExecError<Crashed>>,
    Vec<CommitRequest>,
    Vec<SinkId>,
) {
    let mut world = World::default();
    let mut sim = Sim::new(&mut world, None);
    sim.fail = fail;
    sim.strict = false;
    let result = commit_batch(core, "a", low, high, &mut sim);
    (result, sim.commits, sim.disabled)
}

#[test]
fn a_failing_required_sink_stops_without_a_checkpoint() {
    let mut core = Core::new("p", 1, CommitPolicy::Required, vec!["a".into()], specs());
    let failure = Failure {
        kind: FailureKind::Poison,
        message: "bad decimal".into(),
    };
    let low = tx_pos(1, 0);
    let high = tx_pos(1, 2);
    let (result, _, _) = drive(&mut core, low, high, Some((PLAIN, failure)));
    let Err(ExecError::Stopped(stop)) = result else {
        panic!("the pipeline must stop: {result:?}");
    };
    assert_eq!(stop.sink, "log");
    assert_eq!(stop.table, "a");
    let text = stop.to_string();
    assert!(
        text.contains(&tx_pos(1, 0).to_string())
            && text.contains(&tx_pos(1, 2).to_string())
            && text.contains("bad decimal"),
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
    let at = tx_pos(1, 0);
    let (result, _, disabled) = drive(&mut core, at.clone(), at, Some((PLAIN, failure)));
    result.unwrap();
    assert_eq!(disabled, vec![PLAIN]);
    assert_eq!(core.checkpoint(), Some(&tx_pos(1, 0)));
    assert!(core.is_disabled(PLAIN).unwrap().contains("trap"));
    // The disabled sink keeps its (absent) position, so the next run replays for it.
    assert_eq!(core.resume(), Resume::FromStart);
    let offered = core.offer("a", tx_pos(2, 0), tx_pos(2, 0));
    assert!(
        offered
            .iter()
            .all(|a| !matches!(a, Action::Call(SinkCall::Stage { sink: PLAIN, .. })))
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
    let at = tx_pos(1, 0);
    let (result, _, _) = drive(&mut core, at.clone(), at, Some((POSITIONED, failure)));
    assert!(matches!(result, Err(ExecError::Stopped(_))));
}

/// A required positioned sink `r`, then two optional plain ones.
fn one_required_two_optional() -> Vec<SinkSpec> {
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
}

#[test]
fn policies_decide_when_the_checkpoint_moves() {
    let three = one_required_two_optional;
    let lagging = tx_pos(1, 0);
    let ahead = tx_pos(5, 0);
    let checkpoint_for = |policy| {
        let mut core = Core::new("p", 1, policy, vec!["a".into()], three());
        core.recover(0, "a", claim(&lagging), None).unwrap();
        core.recover(1, "a", None, Some(lagging.clone())).unwrap();
        core.recover(2, "a", None, None).unwrap();
        // Sinks 0 and 1 take the batch; sink 2 (never committed) fails and is disabled.
        let failure = Failure {
            kind: FailureKind::Broken,
            message: "x".into(),
        };
        let (result, _, _) = drive(&mut core, ahead.clone(), ahead.clone(), Some((2, failure)));
        result.unwrap();
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
    let at = tx_pos(1, 0);
    let (result, commits, _) = drive(&mut core, at.clone(), at, None);
    result.unwrap();
    assert_eq!(commits.len(), 2);
    assert!(
        commits
            .iter()
            .all(|r| r.epoch == 42 && r.pipeline == "pipe")
    );
}

/// Two sinks, the plain one optional, both recovered at the given positions.
fn core_with_optional_plain(exact_at: Position, plain_at: Position) -> Core {
    let mut specs = specs();
    specs[PLAIN].required = false;
    let mut core = Core::new("p", 1, CommitPolicy::Required, vec!["a".into()], specs);
    core.recover(POSITIONED, "a", claim(&exact_at), None)
        .unwrap();
    core.recover(PLAIN, "a", None, Some(plain_at)).unwrap();
    core
}

#[test]
fn an_optional_sink_behind_what_the_source_holds_is_left_behind() {
    let mut core = core_with_optional_plain(tx_pos(9, 0), tx_pos(2, 0));
    let resume = core.resume();
    assert_eq!(resume, Resume::After(tx_pos(2, 0)));
    let (resume, actions) = core.leave_behind(resume, &tx_pos(5, 0));
    assert_eq!(resume, Resume::After(tx_pos(9, 0)));
    assert!(
        matches!(&actions[..], [Action::Disable { sink: PLAIN, reason }] if reason.contains("cannot catch up")),
        "{actions:?}"
    );
    assert!(core.is_disabled(PLAIN).is_some());
    assert!(core.is_disabled(POSITIONED).is_none());
}

#[test]
fn required_sinks_and_sinks_in_their_backfill_are_not_left_behind() {
    // The plain sink is required here: it stays, and the source refuses.
    let mut core = Core::new("p", 1, CommitPolicy::Required, vec!["a".into()], specs());
    core.recover(POSITIONED, "a", claim(&tx_pos(9, 0)), None)
        .unwrap();
    core.recover(PLAIN, "a", None, Some(tx_pos(2, 0))).unwrap();
    let (resume, actions) = core.leave_behind(core.resume(), &tx_pos(5, 0));
    assert_eq!(resume, Resume::After(tx_pos(2, 0)));
    assert!(actions.is_empty());
    // An optional sink mid-backfill resumes its backfill.
    let backfill = Position::snapshot("a", b"k");
    let mut core = core_with_optional_plain(tx_pos(9, 0), backfill.clone());
    let (resume, actions) = core.leave_behind(core.resume(), &tx_pos(5, 0));
    assert_eq!(resume, Resume::After(backfill));
    assert!(actions.is_empty());
}

#[test]
fn a_swap_keeps_the_positions_export_and_the_positions() {
    let core = core_with_optional_plain(tx_pos(9, 0), tx_pos(2, 0));
    assert!(core.admit_swap(POSITIONED, true).is_ok());
    let refused = core.admit_swap(POSITIONED, false).unwrap_err();
    assert!(refused.contains("a swap must keep it"), "{refused}");
    let refused = core.admit_swap(PLAIN, true).unwrap_err();
    assert!(refused.contains("does not export `positions`"), "{refused}");
    assert!(
        core.check_swap_claim(POSITIONED, "a", Some(&tx_pos(9, 0)))
            .is_ok()
    );
    let refused = core
        .check_swap_claim(POSITIONED, "a", Some(&tx_pos(3, 0)))
        .unwrap_err();
    assert!(
        refused.contains("does not read what the running version wrote"),
        "{refused}"
    );
    let refused = core.check_swap_claim(POSITIONED, "a", None).unwrap_err();
    assert!(refused.contains("stands at the start"), "{refused}");
}

#[test]
fn a_disabled_sink_takes_no_swap() {
    let mut core = core_with_optional_plain(tx_pos(9, 0), tx_pos(2, 0));
    core.disable(PLAIN, "could not load".into());
    let refused = core.admit_swap(PLAIN, false).unwrap_err();
    assert!(refused.contains("out of this run"), "{refused}");
}

#[test]
fn the_core_names_every_disabled_sink_with_the_reason() {
    let sinks = one_required_two_optional();
    let mut core = Core::new("pipe", 1, CommitPolicy::Required, vec!["a".into()], sinks);
    assert_eq!(core.pipeline(), "pipe");
    assert_eq!(core.disabled_sinks().count(), 0);
    core.disable(2, "could not load".into());
    let failure = Failure {
        kind: FailureKind::Broken,
        message: "trap".into(),
    };
    let at = tx_pos(1, 0);
    let (result, _, _) = drive(&mut core, at.clone(), at, Some((1, failure)));
    result.unwrap();
    let disabled: Vec<(&str, &str)> = core.disabled_sinks().collect();
    assert_eq!(disabled.len(), 2, "{disabled:?}");
    assert_eq!(disabled[0].0, "o1");
    assert!(disabled[0].1.contains("trap"), "{disabled:?}");
    assert_eq!(disabled[1], ("o2", "could not load"));
}

#[test]
fn a_batch_counts_as_committed_once_every_sink_is_done_with_it() {
    let mut sinks = specs();
    sinks[PLAIN].required = false;
    let mut core = Core::new("p", 1, CommitPolicy::Required, vec!["a".into()], sinks);
    assert_eq!(core.batches_committed(), 0);
    let first = tx_pos(1, 0);
    let (result, _, _) = drive(&mut core, first.clone(), first.clone(), None);
    result.unwrap();
    assert_eq!(core.batches_committed(), 1);
    // A replay every sink already holds is seen through all the same.
    let (result, commits, _) = drive(&mut core, first.clone(), first, None);
    result.unwrap();
    assert!(commits.is_empty(), "{commits:?}");
    assert_eq!(core.batches_committed(), 2);
    // So is a batch an optional sink failed over: the others committed it.
    let broken = Failure {
        kind: FailureKind::Broken,
        message: "trap".into(),
    };
    let second = tx_pos(2, 0);
    let (result, _, _) = drive(&mut core, second.clone(), second, Some((PLAIN, broken)));
    result.unwrap();
    assert_eq!(core.batches_committed(), 3);
    // A batch that stops the pipeline is not.
    let poison = Failure {
        kind: FailureKind::Poison,
        message: "bad decimal".into(),
    };
    let third = tx_pos(3, 0);
    let (result, _, _) = drive(&mut core, third.clone(), third, Some((POSITIONED, poison)));
    assert!(matches!(result, Err(ExecError::Stopped(_))), "{result:?}");
    assert_eq!(core.batches_committed(), 3);
}
