//! SIGKILL `weir run` with the Postgres source at random moments, during the
//! backfill and during streaming, while a workload keeps writing; and
//! restart Postgres under a running stream. After a draining run the
//! positioned sink must equal the source tables exactly, and at every kill
//! the slot's confirmed_flush_lsn must not have passed what the sink had
//! committed.
//!
//! The tests of this file restart the shared test cluster, so they take a
//! lock and run one at a time.

use crate::common;
use crate::postgres_support;
use weir_source::commit_order::StreamPosition;

use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use postgres_support::*;
use weir_core::position::Position;

static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// The highest confirmed_flush_lsn a committed streaming position allows:
/// its commit LSN, or the next byte when it stands after a whole
/// transaction (ordinal u32::MAX).
fn confirmable(p: &Position) -> u64 {
    match p.as_stream() {
        Some((lsn, u32::MAX)) => lsn + 1,
        Some((lsn, _)) => lsn,
        None => 0,
    }
}

/// The sink's lowest committed position over all tables (None: some table
/// has nothing yet).
fn sink_low(pipeline: &std::path::Path) -> Option<Position> {
    let status = common::status(pipeline);
    let positions = common::positions_of(&status, "exact");
    let mut low: Option<Position> = None;
    for p in positions.values() {
        let p = Position::from_bytes(p.clone()?);
        if low.as_ref().is_none_or(|l| p < *l) {
            low = Some(p);
        }
    }
    low
}

/// Writes random transactions until told to stop; returns how many.
fn workload_thread(
    pg_port: String,
    db: &'static str,
    stop: Arc<AtomicBool>,
    seed: u64,
) -> std::thread::JoinHandle<u64> {
    std::thread::spawn(move || {
        let pg = Pg { port: pg_port };
        let mut rng = Rng::seeded(seed);
        let mut n = 0;
        let mut base = 100_000u64;
        while !stop.load(Ordering::Relaxed) {
            let sql = workload(&mut rng, 20, base, false);
            base += 20;
            // The server may be restarting: a failed batch is simply lost
            // (it rolled back), the next one goes on.
            if pg.try_sql(db, &sql).is_ok() {
                n += 20;
            } else {
                std::thread::sleep(Duration::from_millis(200));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        n
    })
}

#[test]
fn sigkill_during_backfill_and_streaming_loses_nothing_and_never_acknowledges_ahead() {
    let _serial = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let pg = cluster();
    let db = "weir_crash";
    let dsn = pg.fresh_db(db);
    pg.sql(db, SCHEMA);
    let mut rng = Rng::seeded(0xc0ff_ee00_1234_5678);
    // Big enough, in small enough commits, that the backfill spans several kills.
    pg.sql(db, &initial_load(20_000, 80_000, 40, &mut rng));

    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("exact");
    let mut p = PgPipeline::new(&dsn, &TABLES);
    p.chunk_rows = 100;
    p.max_rows = 100;
    let pipeline = p.write(dir.path(), &root);

    let seed = std::env::var("WEIR_CRASH_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
                | 1
        });
    println!("kill schedule seed: {seed} (set WEIR_CRASH_SEED to replay it)");
    let mut delays = Rng::seeded(seed);

    let stop = Arc::new(AtomicBool::new(false));
    let writer = workload_thread(pg.port.clone(), db, stop.clone(), seed ^ 0x9e37_79b9);

    let (mut in_backfill, mut in_stream, mut kills) = (0, 0, 0);
    let mut before: Option<Position> = None;
    let mut backfill_confirmed: Option<u64> = None;
    let started = Instant::now();
    let log = dir.path().join("weir.log");
    // On a loaded machine a kill lands after fewer rows: up to 80 kills,
    // so the backfill still ends and the stream still gets its kills.
    while (kills < 12 || in_backfill < 3 || in_stream < 4)
        && kills < 80
        && started.elapsed() < Duration::from_secs(300)
    {
        let mut child = spawn_weir(&pipeline, &log);
        let delay = Duration::from_millis(600 + delays.below(1400));
        std::thread::sleep(delay);
        let exited = child.try_wait().unwrap();
        child.kill().ok(); // SIGKILL
        child.wait().unwrap();
        if let Some(status) = exited {
            panic!(
                "weir exited by itself ({status}) instead of running until killed: {}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
        }
        kills += 1;
        let after = sink_low(&pipeline);
        let confirmed = pg.confirmed_flush(db, &slot_of(&dsn));
        // The invariant, checked at every kill.
        match (&after, confirmed) {
            (Some(p), Some(c)) if p.as_stream().is_some() => {
                let lsn = confirmable(p);
                assert!(
                    c <= lsn,
                    "kill {kills}: confirmed_flush_lsn {c:X} passed the sink's committed {lsn:X}"
                );
            }
            (_, Some(c)) => {
                // Backfill (or nothing committed): the slot has not moved from its start.
                let first = *backfill_confirmed.get_or_insert(c);
                assert_eq!(
                    c, first,
                    "kill {kills}: the slot moved ({first:X} -> {c:X}) before the backfill was committed"
                );
            }
            (_, None) => {}
        }
        let moved = after.is_some() && after != before;
        let phase = match &after {
            Some(p) if p.as_snapshot().is_some() && moved => {
                in_backfill += 1;
                "mid-backfill"
            }
            Some(p) if p.as_stream().is_some() && moved => {
                in_stream += 1;
                "mid-stream"
            }
            _ => "no progress",
        };
        println!(
            "kill {kills} after {delay:?}: sink at {} -> {phase}; confirmed_flush {}",
            after.as_ref().map_or("-".into(), |p| p.to_string()),
            confirmed.map_or("-".into(), |c| format!("{c:X}"))
        );
        let streaming = after.as_ref().is_some_and(|p| p.as_stream().is_some());
        before = after;
        if streaming && in_backfill < 2 {
            break; // the backfill is over: more kills cannot land in it
        }
    }
    stop.store(true, Ordering::Relaxed);
    let written = writer.join().unwrap();
    if kills < 10 || in_backfill < 2 || in_stream < 3 {
        panic!(
            "INCONCLUSIVE: {kills} kills, {in_backfill} mid-backfill and {in_stream} mid-stream \
             (need 10, 2 and 3); nothing was proven about recovery"
        );
    }
    drain(&pipeline);
    assert_sink_equals_postgres(&pg, db, &root, &table_defs(false));
    let low = sink_low(&pipeline).expect("every table committed");
    let confirmed = pg.confirmed_flush(db, &slot_of(&dsn)).unwrap();
    assert!(confirmed <= confirmable(&low));
    println!(
        "{kills} kills ({in_backfill} mid-backfill, {in_stream} mid-stream) under a workload of {written} transactions: sink equals Postgres"
    );
}

#[test]
fn a_postgres_restart_mid_stream_is_survived_without_loss_or_duplicates() {
    let _serial = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let pg = cluster();
    let db = "weir_restart";
    let dsn = pg.fresh_db(db);
    pg.sql(db, SCHEMA);
    let mut rng = Rng::seeded(0xabad_1dea_0000_0001);
    pg.sql(db, &initial_load(500, 300, 10, &mut rng));
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("exact");
    let pipeline = PgPipeline::new(&dsn, &TABLES).write(dir.path(), &root);
    let log = dir.path().join("weir.log");
    let mut child = spawn_weir(&pipeline, &log);

    // Wait until the run is streaming (the backfill is committed).
    let deadline = Instant::now() + Duration::from_secs(60);
    while sink_low_from_files(&root).is_none_or(|p| p.as_stream().is_none()) {
        assert!(
            Instant::now() < deadline,
            "the run never reached streaming: {}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    pg.sql(db, &workload(&mut rng, 1500, 10_000, false));
    restart_cluster();
    pg.sql(db, &workload(&mut rng, 300, 20_000, false));
    std::thread::sleep(Duration::from_secs(3));
    assert!(
        child.try_wait().unwrap().is_none(),
        "weir did not survive the restart: {}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    child.kill().ok();
    child.wait().ok();
    let said = std::fs::read_to_string(&log).unwrap_or_default();
    if !said.contains("reconnecting") {
        panic!("INCONCLUSIVE: the restart did not break a live stream: {said}");
    }
    drain(&pipeline);
    assert_sink_equals_postgres(&pg, db, &root, &table_defs(false));
}

/// The lowest committed position over the sink's tables, read from the
/// fixture's files (weir status would contend with the running weir's store).
fn sink_low_from_files(root: &std::path::Path) -> Option<Position> {
    let mut low: Option<Position> = None;
    for table in TABLES {
        let batches = common::read_positioned(root, table);
        let last = batches.last()?;
        let hex = last.schema().metadata().get("weir.position")?.clone();
        let p = Position::from_hex(&hex).ok()?;
        if low.as_ref().is_none_or(|l| p < *l) {
            low = Some(p);
        }
    }
    low
}
