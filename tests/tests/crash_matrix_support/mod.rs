//! The crash matrix (docs/crash-matrix.md): what to run, from the
//! environment; how one kill is aimed and whether it landed; checking every
//! destination against the source of truth after the restart; and the
//! one-screen report.

pub mod holdings;
pub mod mysql;
pub mod pg;
mod report;
pub mod sessions;

use std::collections::BTreeMap;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};
use weir_source::commit_order::StreamPosition;

use rand::{Rng as _, SeedableRng};
use rand_chacha::ChaCha8Rng;
use weir_core::position::Position;

use crate::common;
use crate::postgres_support::Running;
use holdings::Differences;
pub use report::print_report;

/// The sources the matrix knows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Source {
    Generator,
    Postgres,
    /// MariaDB through its binlog (the MySQL source).
    Mysql,
}

impl Source {
    pub fn name(self) -> &'static str {
        match self {
            Source::Generator => "generator",
            Source::Postgres => "postgres",
            Source::Mysql => "mysql",
        }
    }
}

/// The sinks the matrix knows, each with the sink name its pipelines give it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum SinkKind {
    /// The positioned fixture: exactly once, a change log.
    Positioned,
    /// The Parquet sink: at least once, a change log.
    Parquet,
    /// The Iceberg sink in upsert mode: exactly once, mirrors the source.
    Iceberg,
}

impl SinkKind {
    pub fn name(self) -> &'static str {
        match self {
            SinkKind::Positioned => "positioned",
            SinkKind::Parquet => "parquet",
            SinkKind::Iceberg => "iceberg",
        }
    }

    /// The sink's name inside the pipeline (and its folder).
    pub fn sink_name(self) -> &'static str {
        match self {
            SinkKind::Positioned => "exact",
            SinkKind::Parquet => "lake",
            SinkKind::Iceberg => "iceberg",
        }
    }

    pub fn exactly_once(self) -> bool {
        !matches!(self, SinkKind::Parquet)
    }
}

/// What to run, from the environment (scripts/crash-matrix sets it); the
/// defaults are the bounded matrix `cargo test` runs.
#[derive(Clone, Debug)]
pub struct Spec {
    pub sources: Vec<Source>,
    /// Always holds the positioned fixture: its positions tell where a kill
    /// landed.
    pub sinks: Vec<SinkKind>,
    /// Kills that must land, over all sources (split evenly).
    pub kills: usize,
    pub seed: u64,
    /// The most inconclusive attempts a source may have, in percent of its
    /// attempts.
    pub max_inconclusive_percent: usize,
    /// Stop aiming new kills after this long (the kills so far are
    /// reported and checked).
    pub budget: Option<Duration>,
}

/// Kills per source when WEIR_MATRIX_KILLS is not set: one at each aim.
const DEFAULT_KILLS_PER_SOURCE: usize = 5;
/// The sources when WEIR_MATRIX_SOURCES is not set.
const DEFAULT_SOURCES: &str = "generator,postgres,mysql";
const DEFAULT_MAX_INCONCLUSIVE_PERCENT: usize = 25;

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

impl Spec {
    pub fn from_env() -> Spec {
        let sources = env("WEIR_MATRIX_SOURCES")
            .unwrap_or_else(|| DEFAULT_SOURCES.into())
            .split(',')
            .map(|s| match s.trim() {
                "generator" => Source::Generator,
                "postgres" => Source::Postgres,
                "mysql" => Source::Mysql,
                other => panic!(
                    "WEIR_MATRIX_SOURCES: unknown source `{other}` (known: generator, postgres, mysql)"
                ),
            })
            .collect::<Vec<_>>();
        let mut sinks = vec![SinkKind::Positioned];
        for s in env("WEIR_MATRIX_SINKS")
            .unwrap_or_else(|| "positioned,parquet,iceberg".into())
            .split(',')
        {
            let kind = match s.trim() {
                "positioned" => SinkKind::Positioned,
                "parquet" => SinkKind::Parquet,
                "iceberg" => SinkKind::Iceberg,
                other => panic!(
                    "WEIR_MATRIX_SINKS: unknown sink `{other}` (known: positioned, parquet, iceberg)"
                ),
            };
            if !sinks.contains(&kind) {
                sinks.push(kind);
            }
        }
        let number = |name: &str, default: u64| -> u64 {
            env(name).map_or(default, |v| {
                v.trim()
                    .parse()
                    .unwrap_or_else(|_| panic!("{name}={v}: not a whole number"))
            })
        };
        let seed = env("WEIR_CRASH_SEED").map_or_else(rand::random, |v| {
            v.trim()
                .parse()
                .unwrap_or_else(|_| panic!("WEIR_CRASH_SEED={v}: not a whole number"))
        });
        let kills = number(
            "WEIR_MATRIX_KILLS",
            (DEFAULT_KILLS_PER_SOURCE * sources.len()) as u64,
        ) as usize;
        assert!(
            kills >= sources.len(),
            "WEIR_MATRIX_KILLS={kills}: at least one kill per source"
        );
        Spec {
            sources,
            sinks,
            kills,
            seed,
            max_inconclusive_percent: number(
                "WEIR_MATRIX_MAX_INCONCLUSIVE_PERCENT",
                DEFAULT_MAX_INCONCLUSIVE_PERCENT as u64,
            ) as usize,
            budget: env("WEIR_MATRIX_BUDGET_SECS").map(|v| {
                Duration::from_secs(
                    v.trim().parse().unwrap_or_else(|_| {
                        panic!("WEIR_MATRIX_BUDGET_SECS={v}: not a whole number")
                    }),
                )
            }),
        }
    }

    /// The kills one source must land.
    pub fn kills_for(&self, source: Source) -> usize {
        let index = self.sources.iter().position(|s| *s == source).unwrap();
        let share = self.kills / self.sources.len();
        share + usize::from(index < self.kills % self.sources.len())
    }

    /// The time one source may spend aiming kills.
    pub fn budget_for(&self, source: Source) -> Option<Duration> {
        self.budget
            .map(|b| b.mul_f64(self.kills_for(source) as f64 / self.kills.max(1) as f64))
    }
}

/// The named crash points of `host/pipeline/src/failpoint.rs`.
pub const POINTS: [&str; 4] = [
    "before-sink-commit",
    "after-sink-commit",
    "after-store-write",
    "after-source-ack",
];

/// Where a kill is aimed: a random moment, or a named crash point.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Aim {
    Random,
    Point(&'static str),
}

impl Aim {
    pub fn all() -> Vec<Aim> {
        std::iter::once(Aim::Random)
            .chain(POINTS.iter().map(|p| Aim::Point(p)))
            .collect()
    }

    pub fn label(self) -> &'static str {
        match self {
            Aim::Random => "random moment",
            Aim::Point(name) => name,
        }
    }
}

/// The phase of the source a kill landed in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Phase {
    Backfill,
    Stream,
}

impl Phase {
    pub fn name(self) -> &'static str {
        match self {
            Phase::Backfill => "backfill",
            Phase::Stream => "stream",
        }
    }
}

/// One aimed kill and what became of it.
#[derive(Clone, Debug)]
pub struct Attempt {
    pub number: usize,
    pub aim: Aim,
    pub aimed_phase: Phase,
    /// Where it landed; None when inconclusive.
    pub landed: Option<Phase>,
    pub inconclusive: Option<String>,
    /// The host's position store was deleted after this kill.
    pub store_lost: bool,
    /// From the restart to caught up.
    pub recovery: Option<Duration>,
    /// How long the aimed run lived (with the status calls around it).
    pub lived: Duration,
}

/// What one source's share of the matrix found.
#[derive(Debug, Default)]
pub struct SourceReport {
    pub source: Option<Source>,
    pub attempts: Vec<Attempt>,
    /// Per sink: what the checks after every restart found, summed (for
    /// duplicates: the new ones each check found).
    pub per_sink: BTreeMap<SinkKind, SinkTally>,
    /// Why this source fails, if it does.
    pub problems: Vec<String>,
    /// Why aiming stopped early, if it did.
    pub stopped_early: Option<String>,
    /// What losing the position store did, where it did not end in a check.
    pub boundary: Vec<String>,
    pub wall: Duration,
}

#[derive(Clone, Debug, Default)]
pub struct SinkTally {
    pub checks: usize,
    pub found: Differences,
    /// Duplicates that appeared in checks after the store was deleted.
    pub replays_after_store_loss: usize,
    /// Duplicates the destination held at the last check.
    pub held_duplicates: usize,
}

impl SourceReport {
    pub fn landed(&self) -> usize {
        self.attempts.iter().filter(|a| a.landed.is_some()).count()
    }

    pub fn inconclusive(&self) -> usize {
        self.attempts.len() - self.landed()
    }

    /// Applies the matrix's rule for refusing to pass vacuously.
    pub fn judge(&mut self, spec: &Spec, wanted: usize) {
        let attempts = self.attempts.len();
        let inconclusive = self.inconclusive();
        if !self.problems.is_empty() {
            // Aiming stopped at the first failed check: judging the landings
            // of kills never made would only bury the failure.
            self.stopped_early = Some("the first failed check".into());
            return;
        }
        if attempts == 0 {
            self.problems.push("no kill was attempted".into());
            return;
        }
        if inconclusive * 100 > attempts * spec.max_inconclusive_percent {
            self.problems.push(format!(
                "{inconclusive} of {attempts} kills inconclusive, more than {}%",
                spec.max_inconclusive_percent
            ));
        }
        // Each aim must have landed once, when there were kills enough to
        // try every one.
        if wanted >= Aim::all().len() {
            for aim in Aim::all() {
                if !self
                    .attempts
                    .iter()
                    .any(|a| a.aim == aim && a.landed.is_some())
                {
                    self.problems
                        .push(format!("no kill at {} landed", aim.label()));
                }
            }
        }
        if self.landed() == 0 {
            self.problems
                .push("no kill landed: nothing was proven".into());
        }
    }

    /// One line per kill, as it happens, so a long matrix shows its way.
    pub fn trace(&self, found: &BTreeMap<SinkKind, Differences>, checked_in: Duration) {
        let Some(a) = self.attempts.last() else {
            return;
        };
        let landed = match (&a.landed, &a.inconclusive) {
            (Some(phase), _) => format!("landed in the {}", phase.name()),
            (None, Some(why)) => format!("INCONCLUSIVE ({why})"),
            (None, None) => "?".into(),
        };
        let checks: Vec<String> = found
            .iter()
            .map(|(k, d)| {
                format!(
                    "{} d{} g{} r{} p{}",
                    k.name(),
                    d.duplicates,
                    d.gaps,
                    d.resurrected,
                    d.phantoms
                )
            })
            .collect();
        println!(
            "{} kill {} at {}{} after {:.1}s: {landed}; recovered in {}; checked in {:.1}s: {}",
            self.source.map_or("?", |s| s.name()),
            a.number,
            a.aim.label(),
            if a.store_lost { " + store deleted" } else { "" },
            a.lived.as_secs_f64(),
            a.recovery
                .map_or("-".into(), |d| format!("{:.1}s", d.as_secs_f64())),
            checked_in.as_secs_f64(),
            checks.join(", ")
        );
    }

    /// A fresh pipeline with empty destinations starts: duplicates are
    /// counted from nothing again.
    pub fn new_episode(&mut self) {
        for tally in self.per_sink.values_mut() {
            tally.held_duplicates = 0;
        }
    }

    /// Records one check of every sink; failures of the guarantees become
    /// problems.
    pub fn record_check(
        &mut self,
        attempt: usize,
        found: &BTreeMap<SinkKind, Differences>,
        store_lost: bool,
        checked_in: Duration,
    ) {
        self.trace(found, checked_in);
        for (kind, diff) in found {
            let tally = self.per_sink.entry(*kind).or_default();
            tally.checks += 1;
            let new_duplicates = diff.duplicates.saturating_sub(tally.held_duplicates);
            tally.held_duplicates = diff.duplicates;
            tally.found += Differences {
                duplicates: new_duplicates,
                ..*diff
            };
            if store_lost {
                tally.replays_after_store_loss += new_duplicates;
            }
            let mut wrong = Vec::new();
            if kind.exactly_once() && diff.duplicates > 0 {
                wrong.push(format!("{} duplicates", diff.duplicates));
            }
            if diff.gaps > 0 {
                wrong.push(format!("{} gaps", diff.gaps));
            }
            if diff.resurrected > 0 {
                wrong.push(format!("{} resurrected deletes", diff.resurrected));
            }
            if diff.phantoms > 0 {
                wrong.push(format!("{} rows the source never had", diff.phantoms));
            }
            if !wrong.is_empty() {
                self.problems.push(format!(
                    "after kill {attempt}: {} holds {}",
                    kind.name(),
                    wrong.join(", ")
                ));
            }
            if store_lost && !kind.exactly_once() && new_duplicates == 0 {
                self.problems.push(format!(
                    "after kill {attempt} the store was deleted, yet {} shows no replay",
                    kind.name()
                ));
            }
        }
    }
}

/// Kill delays, failpoint hits and batch sizes, all from the one seed.
pub struct Dice(ChaCha8Rng);

impl Dice {
    /// Dice for one source (`stream`) of the run with `seed`: the sources
    /// draw independently, so running one alone draws what it drew beside
    /// the other.
    pub fn new(seed: u64, stream: u64) -> Dice {
        Dice(ChaCha8Rng::seed_from_u64(
            seed ^ stream.wrapping_mul(0x9e37_79b9_7f4a_7c15),
        ))
    }

    /// A number in `low..high` (`low` when the range is empty).
    pub fn between(&mut self, low: u64, high: u64) -> u64 {
        self.0.random_range(low..high.max(low + 1))
    }
}

/// How one `weir run` aimed at a kill ended, when it did not land.
type Landing = Result<(), String>;

/// How many commits the positioned fixture under `root` has made (one
/// file per commit and table): cheap enough to poll while a run lives.
pub fn fixture_commits(root: &Path) -> usize {
    let Ok(tables) = std::fs::read_dir(root) else {
        return 0;
    };
    tables
        .flatten()
        .filter_map(|t| std::fs::read_dir(t.path()).ok())
        .map(|files| files.count())
        .sum()
}

/// Runs `weir run` on `pipeline` with `envs` and kills it as `aim` says:
/// SIGKILL `delay` after the positioned fixture under `fixture` made its
/// first commit of this run (so the kill lands mid-work, not during the
/// start), or the crash point's own SIGKILL at its `hit`th pass (given up
/// on after `patience`). `Err` says why the kill is inconclusive.
#[allow(clippy::too_many_arguments)]
pub fn aimed_run(
    pipeline: &Path,
    envs: &[(&str, String)],
    aim: Aim,
    delay: Duration,
    hit: u64,
    patience: Duration,
    fixture: &Path,
    log: &Path,
) -> Landing {
    let commits_before = fixture_commits(fixture);
    let mut command = common::weir_command();
    command
        .args(["run", pipeline.to_str().unwrap()])
        .env("WEIR_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).expect("a log file"));
    for (k, v) in envs {
        command.env(k, v);
    }
    if let Aim::Point(name) = aim {
        command.env("WEIR_FAILPOINT", format!("{name}@{hit}"));
    }
    let mut child = Running(command.spawn().expect("weir runs"));
    let spawned = Instant::now();
    // For a random kill: unset until the first commit of this run.
    let mut deadline = match aim {
        Aim::Random => None,
        Aim::Point(_) => Some(spawned + patience),
    };
    let exited = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break Some(status);
        }
        let now = Instant::now();
        if deadline.is_none() {
            if fixture_commits(fixture) > commits_before {
                deadline = Some(now + delay);
            } else if now >= spawned + patience {
                break None;
            }
        }
        if deadline.is_some_and(|d| now >= d) {
            break None;
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    child.kill().ok(); // SIGKILL
    child.wait().ok();
    let said = || {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        let tail: Vec<&str> = text.lines().rev().take(3).collect();
        tail.into_iter().rev().collect::<Vec<_>>().join(" | ")
    };
    match (aim, exited) {
        (Aim::Random, None) if fixture_commits(fixture) == commits_before => {
            Err(format!("the run committed nothing within {patience:?}"))
        }
        (Aim::Random, None) => Ok(()),
        (Aim::Random, Some(status)) => Err(format!(
            "the run ended by itself ({status}) before the kill, {delay:?} after its first commit: {}",
            said()
        )),
        (Aim::Point(name), None) => {
            Err(format!("{name}@{hit} was not reached within {patience:?}"))
        }
        (Aim::Point(name), Some(status)) => {
            let text = std::fs::read_to_string(log).unwrap_or_default();
            if status.signal() == Some(libc::SIGKILL)
                && text.contains(&format!("failpoint {name} reached"))
            {
                Ok(())
            } else {
                Err(format!(
                    "the run ended ({status}) without reaching {name}@{hit}: {}",
                    said()
                ))
            }
        }
    }
}

/// The positioned sink's committed position per table, from `weir status`.
pub fn exact_positions(pipeline: &Path) -> BTreeMap<String, Option<Position>> {
    let status = common::status(pipeline);
    common::positions_of(&status, SinkKind::Positioned.sink_name())
        .into_iter()
        .map(|(t, p)| (t, p.map(Position::from_bytes)))
        .collect()
}

/// The phase positions stand in: the backfill while any table has nothing
/// or a snapshot position.
pub fn phase_of(positions: &BTreeMap<String, Option<Position>>) -> Phase {
    if positions
        .values()
        .all(|p| p.as_ref().is_some_and(|p| p.as_stream().is_some()))
    {
        Phase::Stream
    } else {
        Phase::Backfill
    }
}

/// Runs `weir run` to the end (the generator's bound, or Postgres caught
/// up); returns how long it took, or its output when it failed.
pub fn recover(pipeline: &Path, envs: &[(&str, &str)]) -> Result<Duration, String> {
    let started = Instant::now();
    let out = common::weir(&["run", pipeline.to_str().unwrap()], envs);
    if out.status.success() {
        Ok(started.elapsed())
    } else {
        Err(common::text(&out))
    }
}

/// The host's position store of a pipeline whose state is `state`.
pub fn store_file(dir: &Path) -> PathBuf {
    dir.join("state/positions.redb")
}
