//! One source's share of the matrix: build its pipeline with every sink,
//! then kill, restart to caught up and check every sink, again and again.
//!
//! Each kill run starts with a backlog (the generator's bound raised, rows
//! written to Postgres or MariaDB), so the kill can land mid-work; the
//! restart after it runs until caught up, which is when every sink can be
//! compared with the whole truth. A database's first kills aim at its
//! backfill instead; while it lasts there is no restart between kills, and
//! each check asks only that what the sinks hold is right (the database is
//! still then). Postgres and MariaDB run one loop ([`run_database`]).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use weir_source::commit_order::StreamPosition;

use super::holdings::{
    self, Differences, Held, TableShape, Truth, generator_shapes, held_in_iceberg, held_in_parquet,
    held_in_positioned,
};
use super::{
    Aim, Attempt, Dice, Phase, SinkKind, Source, SourceReport, Spec, aimed_run, exact_positions,
    mysql, pg, phase_of, recover, store_file,
};
use crate::common::{self, SinkBuilder};
use crate::iceberg_support::Lake;
use crate::mysql_support::{self, Maria};
use crate::postgres_support::{self, Pg, PgPipeline};

/// Where each sink of a session keeps its data.
struct Destinations {
    dir: std::path::PathBuf,
    sinks: Vec<SinkKind>,
}

impl Destinations {
    fn root(&self, kind: SinkKind) -> std::path::PathBuf {
        common::sink_root(&self.dir, kind.sink_name())
    }

    fn lake(&self) -> Lake {
        Lake {
            root: self.root(SinkKind::Iceberg),
        }
    }

    fn iceberg_sink(&self) -> SinkBuilder {
        let lake = self.lake();
        SinkBuilder::new(
            SinkKind::Iceberg.sink_name(),
            common::plugin("weir-iceberg-sink"),
        )
        .blob_store(&lake.root)
        .limits(1024, 120_000)
        .retries(2)
        .config("warehouse", &lake.warehouse())
    }

    /// Compares every sink with the truth. `reader` reads Iceberg
    /// (`duckdb`, or `native` for the `iceberg` crate); `partial`: a backfill cut short.
    fn check(
        &self,
        shapes: &[TableShape],
        truth: &BTreeMap<String, Truth>,
        reader: &str,
        partial: bool,
    ) -> BTreeMap<SinkKind, Differences> {
        let mut found = BTreeMap::new();
        for &kind in &self.sinks {
            let held: Vec<Held> = match kind {
                SinkKind::Positioned => shapes
                    .iter()
                    .map(|s| held_in_positioned(&self.root(kind), s))
                    .collect(),
                SinkKind::Parquet => shapes
                    .iter()
                    .map(|s| held_in_parquet(&self.root(kind), s))
                    .collect(),
                SinkKind::Iceberg => held_in_iceberg(&self.lake(), shapes, reader),
            };
            let mut sum = Differences::default();
            for (shape, held) in shapes.iter().zip(&held) {
                sum += holdings::compare(&truth[&shape.name], held, partial);
            }
            found.insert(kind, sum);
        }
        found
    }
}

/// The Iceberg reader of each source's last check: pyiceberg, a second
/// reader beside the DuckDB of every other check, unless
/// `WEIR_MATRIX_FINAL_READER` names `duckdb` or `native` (the `iceberg`
/// crate) instead.
fn final_reader() -> &'static str {
    match std::env::var("WEIR_MATRIX_FINAL_READER").as_deref() {
        Ok("native") => "native",
        Ok("duckdb") => "duckdb",
        Ok("pyiceberg") | Err(_) => "pyiceberg",
        Ok(other) => {
            panic!("WEIR_MATRIX_FINAL_READER={other}: `pyiceberg`, `duckdb` or `native`")
        }
    }
}

/// When to stop aiming: enough kills landed, too many attempts, or the
/// time budget spent.
struct Pace {
    wanted: usize,
    max_attempts: usize,
    started: Instant,
    budget: Option<Duration>,
}

impl Pace {
    fn new(spec: &Spec, source: Source) -> Pace {
        let wanted = spec.kills_for(source);
        Pace {
            wanted,
            max_attempts: wanted + (wanted / 2).max(2),
            started: Instant::now(),
            budget: spec.budget_for(source),
        }
    }

    /// Why to stop before the next attempt, if it is time.
    fn stop(&self, report: &SourceReport) -> Option<Option<String>> {
        if report.landed() >= self.wanted {
            return Some(None);
        }
        if report.attempts.len() >= self.max_attempts {
            return Some(Some(format!(
                "{} attempts made, the most allowed for {} kills",
                self.max_attempts, self.wanted
            )));
        }
        if let Some(budget) = self.budget
            && self.started.elapsed() >= budget
        {
            return Some(Some(format!("the time budget of {budget:?} was spent")));
        }
        None
    }
}

/// How long after a run's first commit a random kill lands: up to half as
/// long as the last restart took to catch up (at most 1.5 s), so it lands
/// inside the backlog rather than after its end.
fn random_delay(dice: &mut Dice, last_run: Option<Duration>) -> Duration {
    let high = last_run.map_or(600, |d| (d.as_millis() as u64 / 2).clamp(100, 1_500));
    Duration::from_millis(dice.between(0, high))
}

/// Kills per episode: a fresh pipeline (new destinations, new stream or
/// database) after this many, so that reading every destination after
/// each kill does not grow with the length of the matrix (DuckDB's scan of
/// an upsert table slows with every commit's equality-delete file).
const EPISODE_KILLS: usize = 10;

/// Writes the generator pipeline of one episode.
struct GeneratorPipeline<'a> {
    destinations: &'a Destinations,
    stream_seed: u64,
    file: std::path::PathBuf,
}

impl GeneratorPipeline<'_> {
    fn write(&self, max_changes: u64, max_rows: usize) -> std::path::PathBuf {
        let dir = &self.destinations.dir;
        // Paced, and batches that linger, so a backlog lasts a second or
        // two and commits a few times per table: kills land inside it.
        // Positioned sinks' commits recorded in the host's store at each
        // commit, or deferred by a few commits: both are crashed into (the
        // default second would leave `after-store-write` to one pass a run).
        let record_ms = [0, 150, 400][max_rows % 3];
        let mut builder = common::workload(self.stream_seed, max_changes, max_rows)
            .name("matrix")
            .pace_us(1_000)
            .linger_ms(100)
            .record_positioned_ms(record_ms);
        for &kind in &self.destinations.sinks {
            builder = builder.sink(match kind {
                SinkKind::Positioned => {
                    common::sink(kind.sink_name(), "weir-fixture-positioned", dir)
                }
                SinkKind::Parquet => common::sink(kind.sink_name(), "weir-parquet-sink", dir),
                SinkKind::Iceberg => self.destinations.iceberg_sink(),
            });
        }
        builder.write(&self.file)
    }
}

pub fn run_generator(spec: &Spec) -> SourceReport {
    let source = Source::Generator;
    let mut report = SourceReport {
        source: Some(source),
        ..SourceReport::default()
    };
    let started = Instant::now();
    let tmp = tempfile::tempdir().unwrap();
    let mut dice = Dice::new(spec.seed, 1);
    // Each kill run works through this many more changes of the stream.
    let step: u64 = 3_000;
    let shapes = generator_shapes();
    let pace = Pace::new(spec, source);
    let aims = Aim::all();
    let mut last_run: Option<Duration> = None;
    let mut episode = 0;
    'episodes: while report.problems.is_empty() && pace.stop(&report).is_none() {
        episode += 1;
        report.new_episode();
        let dir = tmp.path().join(format!("episode-{episode}"));
        std::fs::create_dir_all(&dir).unwrap();
        let destinations = Destinations {
            dir: dir.clone(),
            sinks: spec.sinks.clone(),
        };
        let stream_seed = spec.seed.wrapping_add(episode);
        let pipeline = GeneratorPipeline {
            destinations: &destinations,
            stream_seed,
            file: dir.join("matrix.yaml"),
        };
        // A first run, not killed, compiles the components (cached after),
        // so the kills measure recovery, not compilation.
        let mut max_changes = 500;
        if let Err(output) = recover(&pipeline.write(max_changes, 200), &[]) {
            report.problems.push(format!(
                "the first run of episode {episode} failed: {output}"
            ));
            break;
        }
        for _ in 0..EPISODE_KILLS {
            if !report.problems.is_empty() {
                break 'episodes;
            }
            if let Some(why) = pace.stop(&report) {
                report.stopped_early = why;
                break 'episodes;
            }
            let number = report.attempts.len() + 1;
            let aim = aims[(number - 1) % aims.len()];
            max_changes += step;
            // Other batch limits on every run, so a replayed batch gets
            // another id and an at-least-once sink's replays show as
            // duplicates.
            let kill_rows = dice.between(100, 1_000) as usize;
            let file = pipeline.write(max_changes, kill_rows);
            let before = exact_positions(&file);
            let delay = random_delay(&mut dice, last_run);
            let hit = dice.between(1, 8);
            let log = dir.join(format!("kill-{number}.log"));
            let run_started = Instant::now();
            let mut landing = aimed_run(
                &file,
                &[],
                aim,
                delay,
                hit,
                Duration::from_secs(60),
                &destinations.root(SinkKind::Positioned),
                &log,
            );
            let lived = run_started.elapsed();
            let after = exact_positions(&file);
            if landing.is_ok() && aim == Aim::Random && after == before {
                landing = Err("the run committed nothing before the kill".into());
            }
            // Every seventh kill, the host also loses its position store.
            let store_lost = number % 7 == 3;
            if store_lost {
                std::fs::remove_file(store_file(&dir)).ok();
            }
            let mut recover_rows = dice.between(100, 1_000) as usize;
            if recover_rows == kill_rows {
                recover_rows += 1;
            }
            pipeline.write(max_changes, recover_rows);
            let recovery = match recover(&file, &[]) {
                Ok(took) => took,
                Err(output) => {
                    report
                        .problems
                        .push(format!("the restart after kill {number} failed: {output}"));
                    break 'episodes;
                }
            };
            last_run = Some(recovery);
            report.attempts.push(Attempt {
                number,
                aim,
                aimed_phase: Phase::Stream,
                landed: landing.as_ref().ok().map(|()| Phase::Stream),
                inconclusive: landing.err(),
                store_lost,
                recovery: Some(recovery),
                lived,
            });
            let checking = Instant::now();
            let truth = holdings::generator_truth(stream_seed, max_changes);
            let last = pace.stop(&report).is_some();
            let reader = if last { final_reader() } else { "duckdb" };
            let found = destinations.check(&shapes, &truth, reader, false);
            report.record_check(number, &found, store_lost, checking.elapsed());
        }
    }
    report.judge(spec, pace.wanted);
    report.wall = started.elapsed();
    report
}

/// What the kill loop of a database source needs of it: Postgres and
/// MariaDB run the same loop ([`run_database`]), each with its own
/// database, pipeline file, workload and truth.
trait DatabaseSource {
    type Workload: Send + 'static;

    fn source(&self) -> Source;
    /// The dice stream of the seed this source draws from.
    fn dice_stream(&self) -> u64;
    /// The variable that makes the pipeline file end its run once caught
    /// up (`exit_when_caught_up`).
    fn exit_variable(&self) -> &'static str;
    fn shapes(&self) -> Vec<TableShape>;
    /// A fresh database for `episode` holding the schema and `accounts`
    /// accounts (with their transfers and lines), and its workload.
    fn fresh(&mut self, episode: u64, seed: u64, accounts: u64) -> Self::Workload;
    /// Writes the episode's pipeline file into the destinations' folder:
    /// the positioned fixture as `exact`, then `extra_sinks`.
    fn pipeline(
        &self,
        destinations: &Destinations,
        extra_sinks: &str,
        max_rows: usize,
    ) -> std::path::PathBuf;
    /// The backlog a run aimed at the stream starts with.
    fn backlog(&self, workload: &mut Self::Workload);
    /// Writes workload transactions on a thread of its own until `stop`.
    fn writer(
        &self,
        workload: Self::Workload,
        stop: Arc<AtomicBool>,
    ) -> std::thread::JoinHandle<Self::Workload>;
    /// The database's rows, in canonical form.
    fn truth(&self) -> BTreeMap<String, Truth>;
    /// A guarantee of the source's own that a kill which landed in the
    /// stream broke, if any (Postgres: the slot confirmed past a sink).
    fn broken_after_kill(&self, pipeline: &std::path::Path, sinks: &[SinkKind]) -> Option<String>;
    /// What a restart must name if it refuses after the position store was
    /// lost (Postgres: the slot, which cannot replay to a sink without
    /// positions); None when it must not refuse.
    fn refusal_names(&self) -> Option<&'static str>;
}

impl Destinations {
    /// The `sinks:` entries of the sinks besides the positioned fixture,
    /// as YAML list items.
    fn extra_sinks_yaml(&self) -> String {
        let mut yaml = String::new();
        for &kind in &self.sinks {
            let root = self.root(kind);
            yaml.push_str(&match kind {
                SinkKind::Positioned => continue, // the pipeline's own `exact`
                SinkKind::Parquet => format!(
                    "  - name: {}\n    plugin: {}\n    blob_store: {{ url: {} }}\n    retries: 1\n",
                    kind.sink_name(),
                    common::plugin("weir-parquet-sink").display(),
                    root.display()
                ),
                SinkKind::Iceberg => format!(
                    "  - name: {}\n    plugin: {}\n    blob_store: {{ url: {} }}\n    retries: 2\n    limits: {{ memory_mb: 1024, call_timeout_ms: 120000 }}\n    config: {{ warehouse: \"file://{}\" }}\n",
                    kind.sink_name(),
                    common::plugin("weir-iceberg-sink").display(),
                    root.display(),
                    root.display()
                ),
            });
        }
        yaml
    }
}

/// Drops the matrix's database and slot when the session ends, even on a
/// panic, so no slot is left pinning the cluster's WAL.
struct PgDatabase<'a> {
    pg: &'a Pg,
    name: &'static str,
}

impl Drop for PgDatabase<'_> {
    fn drop(&mut self) {
        let _ = self.pg.try_sql(
            "weir",
            &format!(
                "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE database = '{0}' AND active_pid IS NOT NULL;\n\
                 SELECT pg_sleep(0.5);\n\
                 SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE database = '{0}';\n\
                 DROP DATABASE IF EXISTS {0} WITH (FORCE);",
                self.name
            ),
        );
    }
}

/// Whether the slot confirmed more than every sink has committed; the
/// positioned fixture and Iceberg answer from their own positions (as
/// `weir status` reports them), the Parquet sink from the host's store.
fn acknowledged_ahead(
    pg: &Pg,
    db: &str,
    dsn: &str,
    pipeline: &std::path::Path,
    sinks: &[SinkKind],
) -> Option<String> {
    let confirmed = pg.confirmed_flush(db, &postgres_support::slot_of(dsn))?;
    let status = common::status(pipeline);
    for kind in sinks {
        for (table, position) in common::positions_of(&status, kind.sink_name()) {
            let committed = position.map(weir_core::position::Position::from_bytes);
            // The most a committed position allows the slot to confirm: its
            // commit LSN, or the next byte after a whole transaction.
            let allowed = match committed.as_ref().and_then(|p| p.as_stream()) {
                Some((lsn, u32::MAX)) => lsn + 1,
                Some((lsn, _)) => lsn,
                None => 0,
            };
            if confirmed > allowed {
                return Some(format!(
                    "the slot confirmed {confirmed:X}, past {} of {table} at {allowed:X}",
                    kind.name()
                ));
            }
        }
    }
    None
}

/// The Postgres side: the private cluster's database `weir_matrix`.
struct Postgres<'a> {
    pg: &'a Pg,
    db: &'static str,
    dsn: String,
}

impl DatabaseSource for Postgres<'_> {
    type Workload = pg::Workload;

    fn source(&self) -> Source {
        Source::Postgres
    }

    fn dice_stream(&self) -> u64 {
        2
    }

    fn exit_variable(&self) -> &'static str {
        "WEIR_PG_EXIT"
    }

    fn shapes(&self) -> Vec<TableShape> {
        pg::shapes()
    }

    fn fresh(&mut self, episode: u64, seed: u64, accounts: u64) -> pg::Workload {
        self.dsn = self.pg.fresh_db(self.db);
        self.pg.sql(self.db, pg::SCHEMA);
        self.pg.sql(self.db, &pg::initial_load(accounts));
        pg::Workload::new(seed.wrapping_add(episode), accounts)
    }

    fn pipeline(
        &self,
        destinations: &Destinations,
        extra_sinks: &str,
        max_rows: usize,
    ) -> std::path::PathBuf {
        let mut p = PgPipeline::new(&self.dsn, &pg::TABLES);
        p.chunk_rows = 100;
        p.max_rows = max_rows;
        p.extra_sinks = extra_sinks.to_string();
        p.write(&destinations.dir, &destinations.root(SinkKind::Positioned))
    }

    fn backlog(&self, workload: &mut pg::Workload) {
        self.pg.sql(self.db, &workload.transactions(150));
    }

    fn writer(
        &self,
        mut workload: pg::Workload,
        stop: Arc<AtomicBool>,
    ) -> std::thread::JoinHandle<pg::Workload> {
        let port = self.pg.port.clone();
        let db = self.db;
        std::thread::spawn(move || {
            let pg = Pg { port };
            while !stop.load(Ordering::Relaxed) {
                pg.sql(db, &workload.transactions(10));
                std::thread::sleep(Duration::from_millis(20));
            }
            workload
        })
    }

    fn truth(&self) -> BTreeMap<String, Truth> {
        pg::truth(self.pg, self.db)
    }

    fn broken_after_kill(&self, pipeline: &std::path::Path, sinks: &[SinkKind]) -> Option<String> {
        acknowledged_ahead(self.pg, self.db, &self.dsn, pipeline, sinks)
    }

    fn refusal_names(&self) -> Option<&'static str> {
        Some("slot")
    }
}

pub fn run_postgres(spec: &Spec) -> SourceReport {
    let pg = postgres_support::cluster();
    let db = "weir_matrix";
    let _database = PgDatabase { pg: &pg, name: db };
    run_database(
        spec,
        &mut Postgres {
            pg: &pg,
            db,
            dsn: String::new(),
        },
    )
}

/// The MySQL side: the private MariaDB's database `weir_matrix`, read with
/// another replica id in each episode. Nothing is acknowledged to the
/// server (it keeps its binlog by age), so there is no check of what was
/// released; the database is left on the server at the end, for a look
/// after a failure (the next session starts it afresh).
struct MariaDb {
    maria: Maria,
    server_id: u32,
}

impl DatabaseSource for MariaDb {
    type Workload = mysql::Workload;

    fn source(&self) -> Source {
        Source::Mysql
    }

    fn dice_stream(&self) -> u64 {
        3
    }

    fn exit_variable(&self) -> &'static str {
        "WEIR_MY_EXIT"
    }

    fn shapes(&self) -> Vec<TableShape> {
        mysql::shapes()
    }

    fn fresh(&mut self, episode: u64, seed: u64, accounts: u64) -> mysql::Workload {
        // A replica id per episode (each episode is a new pipeline), none
        // of the MySQL tests' (51xx to 53xx).
        self.server_id = 7_700 + episode as u32;
        self.maria.fresh_db(mysql::DB);
        self.maria.sql(mysql::DB, mysql::SCHEMA);
        self.maria.sql(mysql::DB, &mysql::initial_load(accounts));
        mysql::Workload::new(seed.wrapping_add(episode), accounts)
    }

    fn pipeline(
        &self,
        destinations: &Destinations,
        extra_sinks: &str,
        max_rows: usize,
    ) -> std::path::PathBuf {
        mysql::pipeline(
            &self.maria,
            self.server_id,
            &destinations.dir,
            &destinations.root(SinkKind::Positioned),
            extra_sinks,
            max_rows,
        )
    }

    /// As Postgres' backlog, with a transaction bigger than any batch in
    /// its middle, so kills land inside one handed on in pieces.
    fn backlog(&self, workload: &mut mysql::Workload) {
        let mut sql = workload.transactions(75);
        sql.push_str(&workload.big_transaction());
        sql.push_str(&workload.transactions(75));
        self.maria.sql(mysql::DB, &sql);
    }

    fn writer(
        &self,
        mut workload: mysql::Workload,
        stop: Arc<AtomicBool>,
    ) -> std::thread::JoinHandle<mysql::Workload> {
        let port = self.maria.port;
        std::thread::spawn(move || {
            let maria = Maria { port };
            while !stop.load(Ordering::Relaxed) {
                maria.sql(mysql::DB, &workload.transactions(10));
                std::thread::sleep(Duration::from_millis(20));
            }
            workload
        })
    }

    fn truth(&self) -> BTreeMap<String, Truth> {
        mysql::truth(&self.maria)
    }

    fn broken_after_kill(&self, _: &std::path::Path, _: &[SinkKind]) -> Option<String> {
        None
    }

    /// A sink without positions is backfilled again from a new snapshot,
    /// streaming from the first one's binlog coordinates (docs/mysql.md,
    /// Backfill): there is nothing to refuse.
    fn refusal_names(&self) -> Option<&'static str> {
        None
    }
}

pub fn run_mysql(spec: &Spec) -> SourceReport {
    run_database(
        spec,
        &mut MariaDb {
            maria: mysql_support::server(),
            server_id: 0,
        },
    )
}

/// The kills of a database source: per episode a fresh database, its
/// first kills aimed at the backfill, the rest at the stream with writes
/// while the run lives.
fn run_database<D: DatabaseSource>(spec: &Spec, db: &mut D) -> SourceReport {
    let source = db.source();
    let mut report = SourceReport {
        source: Some(source),
        ..SourceReport::default()
    };
    let started = Instant::now();
    let pace = Pace::new(spec, source);
    let tmp = tempfile::tempdir().unwrap();
    let mut dice = Dice::new(spec.seed, db.dice_stream());
    let shapes = db.shapes();
    let exit = [(db.exit_variable(), "true")];
    let aims = Aim::all();
    let mut last_run: Option<Duration> = None;
    let mut episode = 0;
    'episodes: while report.problems.is_empty() && pace.stop(&report).is_none() {
        episode += 1;
        report.new_episode();
        // About one kill in five aims at the backfill; the initial load is
        // sized so it outlasts them.
        let episode_kills = EPISODE_KILLS.min(pace.wanted - report.landed());
        let backfill_kills = episode_kills.div_ceil(5);
        let first_attempt = report.attempts.len();
        let accounts = 2_500 * backfill_kills as u64;
        let mut workload = Some(db.fresh(episode, spec.seed, accounts));
        let dir = tmp.path().join(format!("episode-{episode}"));
        std::fs::create_dir_all(&dir).unwrap();
        let destinations = Destinations {
            dir: dir.clone(),
            sinks: spec.sinks.clone(),
        };
        let extra_sinks = destinations.extra_sinks_yaml();
        let write = |max_rows: usize| db.pipeline(&destinations, &extra_sinks, max_rows);
        let mut in_backfill = true;
        let mut truth = db.truth();
        for _ in 0..episode_kills {
            if !report.problems.is_empty() {
                break 'episodes;
            }
            if let Some(why) = pace.stop(&report) {
                report.stopped_early = why;
                break 'episodes;
            }
            let number = report.attempts.len() + 1;
            // The first run may compile the components: aim it at a crash
            // point, which waits for it, rather than at a random moment. Each
            // episode shifts the turn by two, so over episodes every aim
            // gets its kills in the backfill (the first two of an episode).
            let aim = aims[(number + 2 * (episode as usize - 1)) % aims.len()];
            let backfill_landed = report.attempts[first_attempt..]
                .iter()
                .filter(|a| a.landed == Some(Phase::Backfill))
                .count();
            let aimed_phase = if in_backfill && backfill_landed < backfill_kills {
                Phase::Backfill
            } else {
                Phase::Stream
            };
            let kill_rows = dice.between(50, 400) as usize;
            let pipeline = write(kill_rows);
            let before = exact_positions(&pipeline);
            // A backlog to work through, and writes while the run lives.
            let stop = Arc::new(AtomicBool::new(false));
            let running_writer = (aimed_phase == Phase::Stream).then(|| {
                let mut w = workload.take().unwrap();
                db.backlog(&mut w);
                db.writer(w, stop.clone())
            });
            let delay = random_delay(&mut dice, last_run);
            let hit = dice.between(1, 8);
            let log = dir.join(format!("kill-{number}.log"));
            let run_started = Instant::now();
            let mut landing = aimed_run(
                &pipeline,
                &[],
                aim,
                delay,
                hit,
                Duration::from_secs(60),
                &destinations.root(SinkKind::Positioned),
                &log,
            );
            let lived = run_started.elapsed();
            stop.store(true, Ordering::Relaxed);
            if let Some(handle) = running_writer {
                workload = Some(handle.join().expect("the workload writer"));
            }
            let after = exact_positions(&pipeline);
            if landing.is_ok() && aim == Aim::Random && after == before {
                landing = Err("the run committed nothing before the kill".into());
            }
            let landed_in = phase_of(&after);
            if landed_in == Phase::Stream
                && let Some(broken) = db.broken_after_kill(&pipeline, &destinations.sinks)
            {
                report
                    .problems
                    .push(format!("after kill {number}: {broken}"));
            }
            if landing.is_ok() && landed_in != aimed_phase {
                landing = Err(format!(
                    "aimed at the {}, landed in the {}",
                    aimed_phase.name(),
                    landed_in.name()
                ));
            }
            let mut attempt = Attempt {
                number,
                aim,
                aimed_phase,
                landed: landing.as_ref().ok().map(|()| landed_in),
                inconclusive: landing.err(),
                store_lost: false,
                recovery: None,
                lived,
            };
            let backfill_left =
                backfill_kills > backfill_landed + usize::from(attempt.landed.is_some());
            if aimed_phase == Phase::Backfill && landed_in == Phase::Backfill && backfill_left {
                // Kills go on into the same backfill; what the sinks hold so far
                // must already be right.
                report.attempts.push(attempt);
                let checking = Instant::now();
                let found = destinations.check(&shapes, &truth, "duckdb", true);
                report.record_check(number, &found, false, checking.elapsed());
                continue;
            }
            in_backfill = false;
            let recover_rows = dice.between(50, 400) as usize;
            write(recover_rows);
            // Every seventh kill, the host also loses its position store. The
            // sinks with positions answer for themselves; a sink without starts
            // from nothing. The restart must catch that sink up (Postgres: a
            // new backfill, or a refusal naming the slot, which cannot replay
            // that far, and then the store is put back and the matrix goes on;
            // MySQL: a new backfill streaming from the first one's start).
            // Never may it skip ahead silently: the check below sees replays.
            if number % 7 == 3 && landed_in == Phase::Stream {
                attempt.store_lost = true;
                let store = store_file(&dir);
                let kept = dir.join("positions.kept");
                std::fs::copy(&store, &kept).expect("a copy of the position store");
                std::fs::remove_file(&store).unwrap();
                let refusal = db
                    .refusal_names()
                    .filter(|_| destinations.sinks.iter().any(|s| !s.exactly_once()));
                match (recover(&pipeline, &exit), refusal) {
                    (Err(output), Some(name)) => {
                        let said = output
                            .lines()
                            .find(|l| l.contains(name))
                            .unwrap_or("(no line names it)")
                            .trim()
                            .chars()
                            .take(240)
                            .collect::<String>();
                        report.boundary.push(format!(
                            "kill {number}: store deleted -> the restart refused: {said}"
                        ));
                        if !output.contains(name) {
                            report.problems.push(format!(
                                "after kill {number} the store was deleted and the restart failed without naming the {name}: {output}"
                            ));
                        }
                        std::fs::rename(&kept, &store).unwrap();
                    }
                    (Err(output), None) => {
                        let why = if db.refusal_names().is_some() {
                            "though every sink keeps its own position"
                        } else {
                            "though the source can backfill a sink without positions again"
                        };
                        report.problems.push(format!(
                            "after kill {number} the store was deleted and the restart failed, {why}: {output}"
                        ));
                        break 'episodes;
                    }
                    (Ok(took), _) => {
                        attempt.recovery = Some(took);
                        report.boundary.push(format!(
                            "kill {number}: store deleted -> the restart caught up in {:.1}s",
                            took.as_secs_f64()
                        ));
                    }
                }
            }
            match recover(&pipeline, &exit) {
                Ok(took) => {
                    let took = *attempt.recovery.get_or_insert(took);
                    last_run = Some(took);
                }
                Err(output) => {
                    report
                        .problems
                        .push(format!("the restart after kill {number} failed: {output}"));
                    report.attempts.push(attempt);
                    break 'episodes;
                }
            }
            let store_lost = attempt.store_lost;
            report.attempts.push(attempt);
            let checking = Instant::now();
            truth = db.truth();
            let last = pace.stop(&report).is_some();
            let reader = if last { final_reader() } else { "duckdb" };
            let found = destinations.check(&shapes, &truth, reader, false);
            report.record_check(number, &found, store_lost, checking.elapsed());
        }
    }
    report.judge(spec, pace.wanted);
    report.wall = started.elapsed();
    report
}
