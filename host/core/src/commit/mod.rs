//! The commit/recovery state machine: synchronous and I/O-free. Its
//! decisions are all in this file; what goes in and out of it is in
//! `messages.rs`, and `executor.rs` is the one loop that carries its
//! actions out over an [`Effects`] implementation.
//!
//! The executor feeds it what it learned (what each sink and the position
//! store say on start, and how each call it was told to make turned out) and
//! carries out the [`Action`]s it returns. Because nothing here does I/O, a
//! test can stop before any step, throw the core away as a crash would, and
//! start a new one from what was durable: see `tests.rs`.
//!
//! The invariants it keeps (numbers from the design brief):
//! 1. A checkpoint moves only after a sink acknowledged a durable commit.
//! 2. Per sink and table, batches commit in position order, one at a time.
//! 3. On start a sink with `positions` is asked and wins over the store,
//!    which is then repaired to match.
//! 4. The source resumes from the minimum committed position over all sinks;
//!    a replayed change already committed for a sink is never re-applied.
//! 6. Every commit carries this run's fencing epoch, raised above any epoch
//!    a positioned sink has seen; sinks' claims (positions past the
//!    source's ceiling, epochs past [`MAX_EPOCH`]) are refused, not believed.
//! 8. The commit policy is evaluated before any checkpoint moves.
//!
//! A positioned sink's commits may be recorded in the store later than they
//! happen ([`Core::defer_positioned_records`]): the sink is its own record,
//! so a store behind it is the state a crash after its commit leaves
//! anyway, and recovery repairs it. The checkpoint waits for the record, so
//! the store never stands behind what the source was told to release.

mod executor;
mod messages;

use std::collections::BTreeMap;

use crate::position::Position;

pub use messages::{
    Action, ClaimRefused, CommitPolicy, CommitRequest, Event, Failure, FailureKind, MAX_EPOCH,
    Origin, Record, Resume, SinkCall, SinkClaim, SinkId, SinkSpec, Stop,
};

pub use executor::{
    CrashPoint, Effects, ExecError, commit_batch, record_deferred, recover as recover_all,
};

#[derive(Clone, Debug, PartialEq, Eq)]
enum Step {
    Staging,
    Committing,
    Recording,
    Done,
}

#[derive(Debug)]
struct InFlight {
    table: String,
    low: Position,
    high: Position,
    steps: BTreeMap<SinkId, Step>,
}

#[derive(Debug)]
struct SinkSlot {
    spec: SinkSpec,
    committed: BTreeMap<String, (Position, Origin)>,
    /// Tables whose newest commit the store lacks (deferred records), with
    /// the position the store holds for them.
    unrecorded: BTreeMap<String, Option<Position>>,
    disabled: Option<String>,
}

/// The state machine for one pipeline run.
#[derive(Debug)]
pub struct Core {
    pipeline: String,
    epoch: u64,
    policy: CommitPolicy,
    tables: Vec<String>,
    sinks: Vec<SinkSlot>,
    in_flight: Option<InFlight>,
    checkpoint: Option<Position>,
    /// Batches of this run every sink in it is done with.
    batches_committed: u64,
    /// The newest epoch a positioned sink reported on start, and which.
    newest_claimed_epoch: Option<(u64, SinkId, String)>,
    /// The furthest position the source can have produced, when it knows.
    source_head: Option<Position>,
    /// Whether positioned sinks' commits wait for [`Core::record_deferred`]
    /// instead of being recorded one by one.
    defer_positioned: bool,
}

impl Core {
    pub fn new(
        pipeline: impl Into<String>,
        epoch: u64,
        policy: CommitPolicy,
        tables: Vec<String>,
        sinks: Vec<SinkSpec>,
    ) -> Self {
        Core {
            pipeline: pipeline.into(),
            epoch,
            policy,
            tables,
            sinks: sinks
                .into_iter()
                .map(|spec| SinkSlot {
                    spec,
                    committed: BTreeMap::new(),
                    unrecorded: BTreeMap::new(),
                    disabled: None,
                })
                .collect(),
            in_flight: None,
            checkpoint: None,
            batches_committed: 0,
            newest_claimed_epoch: None,
            source_head: None,
            defer_positioned: false,
        }
    }

    /// From here on, a positioned sink's commit finishes its batch without
    /// a store write: [`Core::unrecorded`] gathers what the store lacks, to
    /// be written in one transaction when the caller chooses (a cluster's
    /// store is a round trip to etcd, which would otherwise bound every
    /// commit). Until then the checkpoint stays where the store stands.
    pub fn defer_positioned_records(&mut self) {
        self.defer_positioned = true;
    }

    /// The positions positioned sinks committed in this run that the store
    /// does not hold yet, one record per sink and table.
    pub fn unrecorded(&self) -> Vec<Record> {
        self.sinks
            .iter()
            .enumerate()
            .flat_map(|(sink, slot)| {
                slot.unrecorded.keys().map(move |table| Record {
                    sink,
                    table: table.clone(),
                    position: slot.committed.get(table).map(|(p, _)| p.clone()),
                })
            })
            .collect()
    }

    /// The store now holds `records` (taken from [`Core::unrecorded`]);
    /// returns the checkpoint that may move with them.
    ///
    /// Panics while a batch is in flight: records are made between batches.
    pub fn record_deferred(&mut self, records: &[Record]) -> Vec<Action> {
        assert!(
            self.in_flight.is_none(),
            "deferred records are written between batches"
        );
        self.note_recorded(records);
        self.move_checkpoint()
    }

    /// The store now holds `records`, written along with a batch's own
    /// records; the checkpoint moves when that batch settles.
    pub fn note_recorded(&mut self, records: &[Record]) {
        for record in records {
            let slot = &mut self.sinks[record.sink];
            let now = slot.committed.get(&record.table).map(|(p, _)| p);
            if now == record.position.as_ref() {
                slot.unrecorded.remove(&record.table);
            } else if let Some(stored) = slot.unrecorded.get_mut(&record.table) {
                *stored = record.position.clone();
            }
        }
    }

    pub fn pipeline(&self) -> &str {
        &self.pipeline
    }

    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Replaces this run's epoch, after recovery found a newer one in use.
    /// Panics once a batch has been offered: commits of one run share one epoch.
    pub fn set_epoch(&mut self, epoch: u64) {
        assert!(
            self.in_flight.is_none() && self.checkpoint.is_none(),
            "the epoch is fixed once batches flow"
        );
        self.epoch = epoch;
    }

    pub fn sink_spec(&self, sink: SinkId) -> &SinkSpec {
        &self.sinks[sink].spec
    }

    /// Tells the core the furthest position the source can have produced:
    /// a sink that claims to have committed beyond it is refused, so no
    /// sink can make the host acknowledge what the source never produced.
    pub fn set_source_head(&mut self, head: Option<Position>) {
        self.source_head = head;
    }

    pub fn sink_count(&self) -> usize {
        self.sinks.len()
    }

    /// Tells the core what the sink (if it has `positions`) and the store
    /// say about one table. Returns the store repairs to make: the sink wins.
    pub fn recover(
        &mut self,
        sink: SinkId,
        table: &str,
        from_sink: Option<SinkClaim>,
        from_store: Option<Position>,
    ) -> Result<Vec<Action>, ClaimRefused> {
        let slot = &mut self.sinks[sink];
        if !slot.spec.positioned {
            set_committed(&mut slot.committed, table, from_store, Origin::Store);
            return Ok(Vec::new());
        }
        if let Some(claim) = &from_sink
            && let Some(why) = impossible(claim, self.source_head.as_ref())
        {
            let refused = ClaimRefused {
                sink: slot.spec.name.clone(),
                table: table.to_string(),
                claim: why.0,
                why: why.1,
            };
            if slot.spec.required {
                return Err(refused);
            }
            // An optional liar loses its place in this run, not the run: it
            // is disabled, and keeps what the store says so that a later
            // run replays for it rather than believe it.
            let reason = refused.to_string();
            slot.disabled = Some(reason.clone());
            set_committed(&mut slot.committed, table, from_store, Origin::Store);
            return Ok(vec![Action::Disable { sink, reason }]);
        }
        if let Some(claim) = &from_sink
            && self
                .newest_claimed_epoch
                .as_ref()
                .is_none_or(|(seen, _, _)| claim.epoch > *seen)
        {
            self.newest_claimed_epoch = Some((claim.epoch, sink, table.to_string()));
        }
        let position = from_sink.map(|c| c.position);
        let repair = (position != from_store).then(|| {
            Action::Record(Record {
                sink,
                table: table.to_string(),
                position: position.clone(),
            })
        });
        set_committed(&mut slot.committed, table, position, Origin::Sink);
        Ok(repair.into_iter().collect())
    }

    /// The lowest epoch this run may commit under, when a positioned sink
    /// has seen this run's epoch or a newer one (the store was lost, or
    /// another host ran the pipeline last): this run is the newest now, so
    /// it must fence that one, not be fenced by it.
    pub fn epoch_floor(&self) -> Result<Option<u64>, ClaimRefused> {
        let Some((seen, sink, table)) = &self.newest_claimed_epoch else {
            return Ok(None);
        };
        if *seen < self.epoch {
            return Ok(None);
        }
        match seen.checked_add(1).filter(|floor| *floor <= MAX_EPOCH) {
            Some(floor) => Ok(Some(floor)),
            None => Err(ClaimRefused {
                sink: self.sinks[*sink].spec.name.clone(),
                table: table.clone(),
                claim: format!("epoch {seen}"),
                why: "no later epoch exists to fence it with".into(),
            }),
        }
    }

    /// The position every sink has committed for every table, or `FromStart`
    /// when some sink lacks some table entirely.
    pub fn resume(&self) -> Resume {
        self.resume_without(&[])
    }

    /// Like [`Core::resume`], leaving out the sinks in `left_out`.
    pub fn resume_without(&self, left_out: &[SinkId]) -> Resume {
        let mut lowest: Option<Position> = None;
        for (sink, slot) in self.sinks.iter().enumerate() {
            if left_out.contains(&sink) {
                continue;
            }
            match slot.lowest(&self.tables) {
                None => return Resume::FromStart,
                Some(p) => lowest = min_position(lowest, p),
            }
        }
        match lowest {
            Some(p) => Resume::After(p),
            None => Resume::FromStart,
        }
    }

    /// The lowest position a sink has committed over every table; `None`
    /// when it lacks one of them entirely.
    pub fn sink_lowest(&self, sink: SinkId) -> Option<Position> {
        self.sinks[sink].lowest(&self.tables)
    }

    /// A sink's committed position for a table and where it came from.
    pub fn committed(&self, sink: SinkId, table: &str) -> Option<(&Position, Origin)> {
        self.sinks[sink]
            .committed
            .get(table)
            .map(|(p, origin)| (p, *origin))
    }

    pub fn is_disabled(&self, sink: SinkId) -> Option<&str> {
        self.sinks[sink].disabled.as_deref()
    }

    /// Every sink out of this run, in sink order, by name with the reason:
    /// whatever disabled it (it could not start, its claim was refused, it
    /// was left behind, or it failed), the core holds why.
    pub fn disabled_sinks(&self) -> impl Iterator<Item = (&str, &str)> {
        self.sinks.iter().filter_map(|slot| {
            let reason = slot.disabled.as_deref()?;
            Some((slot.spec.name.as_str(), reason))
        })
    }

    /// Keeps a sink out of this run from the start (it could not be loaded);
    /// its positions stay as recovered, so a later run replays for it.
    pub fn disable(&mut self, sink: SinkId, reason: String) {
        self.sinks[sink].disabled = Some(reason);
    }

    /// Leaves out of the run every optional sink that stands behind
    /// `first_available`, the lowest position from which the source can
    /// still give every later change: the changes in between are gone, so
    /// such a sink cannot catch up. Each is disabled (the reason says what
    /// it misses and the way out) and the run resumes for the others. A
    /// required sink behind it stays in: the source refuses to resume for
    /// it, and the run stops before anything is acknowledged. A sink in
    /// its backfill resumes its backfill, which nothing has released.
    pub fn leave_behind(
        &mut self,
        resume: Resume,
        first_available: &Position,
    ) -> (Resume, Vec<Action>) {
        let Resume::After(lowest) = &resume else {
            return (resume, Vec::new());
        };
        if lowest.is_snapshot() || lowest >= first_available {
            return (resume, Vec::new());
        }
        let mut actions = Vec::new();
        for (sink, slot) in self.sinks.iter_mut().enumerate() {
            if slot.spec.required || slot.disabled.is_some() {
                continue;
            }
            if let Some(at) = slot.lowest(&self.tables)
                && !at.is_snapshot()
                && at < *first_available
            {
                let reason = format!(
                    "it stands at {at}, behind what the source still holds ({first_available}): \
                     the changes in between are gone, so it cannot catch up; re-create its data \
                     (empty its destination and its positions) to have it filled again"
                );
                slot.disabled = Some(reason.clone());
                actions.push(Action::Disable { sink, reason });
            }
        }
        if actions.is_empty() {
            return (resume, actions);
        }
        let disabled: Vec<SinkId> = (0..self.sinks.len())
            .filter(|&s| self.sinks[s].disabled.is_some())
            .collect();
        (self.resume_without(&disabled), actions)
    }

    /// Whether sink `sink` may take a new version of its plugin at this
    /// commit boundary. It must still be in the run, and keep exporting
    /// `positions` or not, as the running version did: the run recovered
    /// its positions one way or the other. The new version's claims are
    /// checked table by table with [`Core::check_swap_claim`].
    pub fn admit_swap(&self, sink: SinkId, new_is_positioned: bool) -> Result<(), String> {
        let slot = &self.sinks[sink];
        if slot.disabled.is_some() {
            return Err(format!(
                "sink `{}` is out of this run; restart the pipeline to load a new version",
                slot.spec.name
            ));
        }
        if new_is_positioned != slot.spec.positioned {
            let (old, new) = match slot.spec.positioned {
                true => ("exports", "does not"),
                false => ("does not export", "does"),
            };
            return Err(format!(
                "the running version {old} `positions` and the new one {new}; a swap must keep \
                 it (stop the pipeline and change the pipeline file instead)"
            ));
        }
        Ok(())
    }

    /// Whether a new positioned version's claim for `table` is where the
    /// run knows the sink stands: a version that does not read what the
    /// running one wrote would replay or skip changes.
    pub fn check_swap_claim(
        &self,
        sink: SinkId,
        table: &str,
        claimed: Option<&Position>,
    ) -> Result<(), String> {
        let known = self.committed(sink, table).map(|(p, _)| p);
        if claimed == known {
            return Ok(());
        }
        let shown =
            |p: Option<&Position>| p.map_or_else(|| "the start".to_string(), ToString::to_string);
        Err(format!(
            "the new version says table `{table}` stands at {}, the pipeline knows {}; it does \
             not read what the running version wrote",
            shown(claimed),
            shown(known)
        ))
    }

    pub fn checkpoint(&self) -> Option<&Position> {
        self.checkpoint.as_ref()
    }

    /// The batches offered in this run that every sink in it is done with:
    /// each committed it, already had it (a replay), or was disabled over
    /// it. A batch that stopped the pipeline does not count.
    pub fn batches_committed(&self) -> u64 {
        self.batches_committed
    }

    /// Offers the next batch of one table: its first change's position and
    /// the position the table stands at once it is committed. Returns the
    /// stage actions for the sinks that do not have it yet. A sink already at
    /// or past `high` gets nothing: the batch is a replay for it.
    ///
    /// Panics if a batch is still in flight: batches go one at a time.
    pub fn offer(&mut self, table: &str, low: Position, high: Position) -> Vec<Action> {
        assert!(
            self.in_flight.is_none(),
            "a batch is still in flight; finish it before offering another"
        );
        let mut steps = BTreeMap::new();
        let mut actions = Vec::new();
        for (sink, slot) in self.sinks.iter().enumerate() {
            if slot.disabled.is_some() {
                continue;
            }
            let after = slot.committed.get(table).map(|(p, _)| p.clone());
            if after.as_ref().is_some_and(|a| *a >= high) {
                continue;
            }
            steps.insert(sink, Step::Staging);
            actions.push(Action::Call(SinkCall::Stage {
                sink,
                table: table.to_string(),
                after,
            }));
        }
        self.in_flight = Some(InFlight {
            table: table.to_string(),
            low,
            high,
            steps,
        });
        actions.extend(self.settle_if_done());
        actions
    }

    /// True while an offered batch has sinks that have not finished with it.
    pub fn busy(&self) -> bool {
        self.in_flight.is_some()
    }

    /// Feeds back how an action turned out.
    pub fn handle(&mut self, event: Event) -> Result<Vec<Action>, Box<Stop>> {
        let flight = self
            .in_flight
            .as_mut()
            .expect("an event arrived with no batch in flight");
        let mut actions = Vec::new();
        match event {
            Event::Staged { sink } => {
                advance(&mut flight.steps, sink, Step::Staging, Step::Committing);
                actions.push(Action::Call(SinkCall::Commit {
                    sink,
                    request: CommitRequest {
                        table: flight.table.clone(),
                        high: flight.high.clone(),
                        pipeline: self.pipeline.clone(),
                        epoch: self.epoch,
                    },
                }));
            }
            Event::Committed { sink } => {
                // The sink has it durably: from here on a replay must skip it,
                // whether or not the store write below survives a crash.
                let slot = &mut self.sinks[sink];
                let before = slot
                    .committed
                    .insert(flight.table.clone(), (flight.high.clone(), Origin::ThisRun));
                if self.defer_positioned && slot.spec.positioned {
                    advance(&mut flight.steps, sink, Step::Committing, Step::Done);
                    // What the store holds stays the oldest unrecorded
                    // commit's predecessor until a record is made.
                    slot.unrecorded
                        .entry(flight.table.clone())
                        .or_insert_with(|| before.map(|(p, _)| p));
                } else {
                    advance(&mut flight.steps, sink, Step::Committing, Step::Recording);
                    actions.push(Action::Record(Record {
                        sink,
                        table: flight.table.clone(),
                        position: Some(flight.high.clone()),
                    }));
                }
            }
            Event::Recorded { sink } => {
                advance(&mut flight.steps, sink, Step::Recording, Step::Done);
            }
            Event::Failed { sink, failure } => {
                let slot = &mut self.sinks[sink];
                if slot.spec.required || failure.kind == FailureKind::Fenced {
                    return Err(Box::new(Stop {
                        sink: slot.spec.name.clone(),
                        table: flight.table.clone(),
                        low: flight.low.clone(),
                        high: flight.high.clone(),
                        failure,
                    }));
                }
                let reason = format!(
                    "table `{}` at positions {}..={}: {}",
                    flight.table, flight.low, flight.high, failure.message
                );
                slot.disabled = Some(reason.clone());
                flight.steps.remove(&sink);
                actions.push(Action::Disable { sink, reason });
            }
        }
        actions.extend(self.settle_if_done());
        Ok(actions)
    }

    /// Closes the batch once every sink is done with it, and moves the
    /// checkpoint if the policy allows.
    fn settle_if_done(&mut self) -> Vec<Action> {
        let done = self
            .in_flight
            .as_ref()
            .is_some_and(|f| f.steps.values().all(|s| *s == Step::Done));
        if !done {
            return Vec::new();
        }
        self.in_flight = None;
        self.batches_committed += 1;
        self.move_checkpoint()
    }

    /// Moves the checkpoint to where the policy's sinks stand, recorded,
    /// if that is further than it was.
    fn move_checkpoint(&mut self) -> Vec<Action> {
        match self.policy_position() {
            Some(p) if self.checkpoint.as_ref().is_none_or(|c| p > *c) => {
                self.checkpoint = Some(p.clone());
                vec![Action::Checkpoint { position: p }]
            }
            _ => Vec::new(),
        }
    }

    /// The position up to which the policy's sinks have all committed, and
    /// the store recorded, over every table.
    fn policy_position(&self) -> Option<Position> {
        let per_sink: Vec<(bool, Option<Position>)> = self
            .sinks
            .iter()
            .map(|slot| (slot.spec.required, slot.lowest_recorded(&self.tables)))
            .collect();
        match self.policy {
            CommitPolicy::Required => {
                let required: Vec<_> = per_sink.iter().filter(|(r, _)| *r).collect();
                if required.is_empty() {
                    // With no required sink, "required" degrades to "all":
                    // acknowledging what nobody committed would lose it.
                    return min_all(per_sink.iter());
                }
                min_all(required.into_iter())
            }
            CommitPolicy::All => min_all(per_sink.iter()),
            CommitPolicy::Quorum => {
                let needed = self.sinks.len() / 2 + 1;
                let mut reached: Vec<Position> =
                    per_sink.iter().filter_map(|(_, p)| p.clone()).collect();
                if reached.len() < needed {
                    return None;
                }
                reached.sort_by(|a, b| b.cmp(a));
                Some(reached[needed - 1].clone())
            }
        }
    }
}

/// Why a sink's claim cannot be true, as (what it claims, why not), or
/// None when it can be.
fn impossible(claim: &SinkClaim, source_head: Option<&Position>) -> Option<(String, String)> {
    if let Some(head) = source_head
        && claim.position > *head
    {
        return Some((
            format!("position {}", claim.position),
            format!("the source has produced nothing past {head}"),
        ));
    }
    if claim.epoch >= MAX_EPOCH {
        return Some((
            format!("epoch {}", claim.epoch),
            format!("no host hands out epochs of {MAX_EPOCH} or more"),
        ));
    }
    None
}

impl SinkSlot {
    /// The lowest position this sink has committed over `tables`, or None
    /// if it lacks one of them entirely.
    fn lowest(&self, tables: &[String]) -> Option<Position> {
        let mut lowest = None;
        for table in tables {
            let (p, _) = self.committed.get(table)?;
            lowest = min_position(lowest, p.clone());
        }
        lowest
    }

    /// Like [`SinkSlot::lowest`], counting for each table only what the
    /// store holds as well.
    fn lowest_recorded(&self, tables: &[String]) -> Option<Position> {
        let mut lowest = None;
        for table in tables {
            let position = match self.unrecorded.get(table) {
                Some(stored) => stored.clone()?,
                None => self.committed.get(table)?.0.clone(),
            };
            lowest = min_position(lowest, position);
        }
        lowest
    }
}

/// The lowest position every one of `sinks` has committed, or None if one
/// of them lacks a table.
fn min_all<'a>(sinks: impl Iterator<Item = &'a (bool, Option<Position>)>) -> Option<Position> {
    let mut lowest = None;
    for (_, p) in sinks {
        lowest = min_position(lowest, p.clone()?);
    }
    lowest
}

fn min_position(lowest: Option<Position>, candidate: Position) -> Option<Position> {
    match lowest {
        Some(l) if l <= candidate => Some(l),
        _ => Some(candidate),
    }
}

fn set_committed(
    committed: &mut BTreeMap<String, (Position, Origin)>,
    table: &str,
    position: Option<Position>,
    origin: Origin,
) {
    match position {
        Some(p) => committed.insert(table.to_string(), (p, origin)),
        None => committed.remove(table),
    };
}

fn advance(steps: &mut BTreeMap<SinkId, Step>, sink: SinkId, from: Step, to: Step) {
    let step = steps
        .get_mut(&sink)
        .unwrap_or_else(|| panic!("sink {sink} is not part of the batch in flight"));
    assert_eq!(*step, from, "sink {sink}: event out of order");
    *step = to;
}

#[cfg(test)]
mod tests;
