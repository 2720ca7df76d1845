//! Exactly-once into Redis under SIGKILL: `weir run` (generator into the
//! WASM Redis sink: two tables upserted, one appended as a stream) is
//! killed mid-backlog again and again at seeded random moments, and once
//! at each named crash point (before the sink's commit, between the sink's
//! commit and the host's store write, after the store write), then drained
//! by a last run. After every kill Redis is read back and compared with the
//! generator's change log applied up to the position Redis itself records
//! for each table: no row missing, none extra, none from a later change, no
//! stream entry twice or lost. At the end it must equal the oracle.
//!
//! A kill that did not land mid-backlog (the run had finished, or had not
//! committed anything new yet) does not count; too few that did, or a crash
//! point that was not reached, is reported as INCONCLUSIVE, not as a pass.
//!
//! `WEIR_CRASH_SEED` replays a kill schedule; `WEIR_REDIS_CRASH_KILLS` (12 by
//! default) sets how many random kills must land, and the backlog grows with
//! it, for a long run.

use crate::common;

use std::fs::File;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{ExitStatus, Stdio};
use std::time::{Duration, Instant};

use common::*;
use weir_source::change::Change;

const SEED: u64 = 43;
/// Source changes per random kill: enough backlog that the generator,
/// paced, outlasts every kill.
const CHANGES_PER_KILL: u64 = 10_000;
/// Where the crash points come in: after this many random kills landed.
const CRASH_POINTS: [(usize, &str); 3] = [
    (3, "before-sink-commit"),
    (6, "after-sink-commit"),
    (9, "after-store-write"),
];

fn redis_pipeline(dir: &Path, server: &RedisServer, changes: u64, pace_us: u64) -> PipelineBuilder {
    workload(SEED, changes, 400)
        .pace_us(pace_us)
        // Recorded in the host's store every two or three commits (a batch
        // takes about 120 ms at this pace), not once a second as by
        // default: the store lags Redis by several batches, and
        // `after-store-write` still comes often enough to aim at.
        .record_positioned_ms(250)
        .table("shop.customers", TableMode::Upsert, "crm.customers")
        .table("shop.orders", TableMode::Append, "shop.orders")
        .metadata("op", "op")
        .metadata("pos", "pos")
        .sink(
            sink("cache", "weir-redis-sink", dir)
                .grant_tcp(&server.address())
                .config("address", &server.address()),
        )
}

fn view() -> RedisView {
    RedisView::new("test", &tables())
        .table("shop.customers", false, "crm.customers")
        .table("shop.orders", true, "shop.orders")
        .op_field("op")
        .pos_field("pos")
}

/// How many changes of `log` the positions in `content` cover.
fn committed_changes(content: &RedisContent, log: &[Change]) -> usize {
    let at = content.committed();
    log.iter()
        .filter(|c| {
            at.get(&c.table.name)
                .is_some_and(|p| c.pos.as_bytes() <= p.as_slice())
        })
        .count()
}

/// Starts `weir run`, its stderr into `log`.
fn start(pipeline: &Path, log: &Path, failpoint: Option<&str>) -> std::process::Child {
    let mut command = weir_command();
    command
        .args(["run", pipeline.to_str().unwrap()])
        .env("WEIR_LOG", "error")
        .stdout(Stdio::null())
        .stderr(File::create(log).unwrap());
    if let Some(spec) = failpoint {
        command.env("WEIR_FAILPOINT", spec);
    }
    command.spawn().expect("weir starts")
}

/// Waits for `child` up to `limit`; None if it still runs.
fn wait_up_to(child: &mut std::process::Child, limit: Duration) -> Option<ExitStatus> {
    let started = Instant::now();
    while started.elapsed() < limit {
        if let Some(status) = child.try_wait().unwrap() {
            return Some(status);
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    None
}

#[test]
fn sigkill_at_random_moments_and_at_every_crash_point_keeps_redis_exact() {
    let kills: usize = std::env::var("WEIR_REDIS_CRASH_KILLS")
        .ok()
        .and_then(|k| k.parse().ok())
        .unwrap_or(12)
        .max(CRASH_POINTS.last().unwrap().0);
    let changes = CHANGES_PER_KILL * kills as u64;
    let dir = tempfile::tempdir().unwrap();
    let server = RedisServer::start();
    let mut con = server.client();
    let pipeline = redis_pipeline(dir.path(), &server, changes, 300).write_in(dir.path());
    let log: Vec<Change> = change_log(SEED, changes).collect();
    let view = view();

    // Loads (and compiles, once, into the cache) the component, so that
    // the first kill does not land while it compiles.
    status(&pipeline);
    let mut delays = KillSchedule::from_env_or_random();

    let mut landed = 0;
    let mut points_hit = 0;
    let mut attempts = 0;
    let mut progress = 0;
    let mut epoch = 0;
    while (landed < kills || points_hit < CRASH_POINTS.len()) && attempts < 2 * kills + 10 {
        attempts += 1;
        let run_log = dir.path().join(format!("run-{attempts}.log"));
        let point = CRASH_POINTS
            .get(points_hit)
            .filter(|(after, _)| landed >= *after)
            .map(|(_, name)| *name);
        let label = match point {
            Some(name) => {
                // A few commits in, so that it dies mid-backlog. The store
                // is written every two or three commits, so its point is
                // aimed at fewer hits.
                let hit = match name {
                    "after-store-write" => delays.next_ms(2, 14),
                    _ => delays.next_ms(6, 40),
                };
                let mut child = start(&pipeline, &run_log, Some(&format!("{name}@{hit}")));
                let exit = wait_up_to(&mut child, Duration::from_secs(60));
                child.kill().ok();
                child.wait().unwrap();
                let stderr = std::fs::read_to_string(&run_log).unwrap();
                if exit.and_then(|e| e.signal()) != Some(libc::SIGKILL)
                    || !stderr.contains(&format!("failpoint {name} reached"))
                {
                    panic!(
                        "INCONCLUSIVE: the run armed with {name}@{hit} did not die there \
                         ({exit:?}): {stderr}"
                    );
                }
                if name == "after-sink-commit" {
                    // Proof it died between the two: Redis is ahead of the
                    // host's store for some table.
                    let status = status(&pipeline);
                    let ahead = status["sinks"][0]["tables"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .any(|t| !t["store_position"].is_null());
                    assert!(
                        ahead,
                        "INCONCLUSIVE: after {name} no table shows Redis ahead of the store: \
                         {status}"
                    );
                }
                points_hit += 1;
                format!("attempt {attempts}, crash point {name}@{hit}")
            }
            None => {
                let delay = Duration::from_millis(delays.next_ms(600, 1_800));
                let mut child = start(&pipeline, &run_log, None);
                let finished = wait_up_to(&mut child, delay);
                child.kill().ok(); // SIGKILL
                child.wait().unwrap();
                if let Some(exit) = finished {
                    println!(
                        "attempt {attempts}: the run ended by itself ({exit}) before its kill"
                    );
                }
                format!("attempt {attempts}, kill after {delay:?}")
            }
        };

        // Exact at the positions Redis records, after every kill.
        let content = view.assert_exact(&label, &mut con, &log);
        let now = committed_changes(&content, &log);
        let newest = content
            .positions
            .values()
            .map(|(_, e)| *e)
            .max()
            .unwrap_or(0);
        assert!(
            newest >= epoch,
            "{label}: the newest epoch in Redis went back from {epoch} to {newest}"
        );
        epoch = newest;
        let mid_backlog = now > progress && now < log.len();
        if point.is_some() {
            assert!(
                mid_backlog,
                "INCONCLUSIVE: {label} did not land mid-backlog ({progress} -> {now} of {} \
                 changes committed)",
                log.len()
            );
        } else if mid_backlog {
            landed += 1;
        }
        println!(
            "{label}: {now} of {} changes committed (epoch {newest}) -> {}",
            log.len(),
            if mid_backlog {
                "mid-backlog, exact"
            } else {
                "not mid-backlog, exact"
            }
        );
        progress = now;
        if now == log.len() {
            break;
        }
    }
    if landed < kills || points_hit < CRASH_POINTS.len() {
        panic!(
            "INCONCLUSIVE: {landed} of {attempts} random kills landed mid-backlog (need \
             {kills}), {points_hit} of {} crash points reached; nothing was proven about \
             recovery",
            CRASH_POINTS.len()
        );
    }

    // Drain the rest unpaced: the changes are the same, only sooner.
    redis_pipeline(dir.path(), &server, changes, 0).write(&pipeline);
    let out = weir(&["run", pipeline.to_str().unwrap()], &[]);
    assert!(out.status.success(), "the final run failed: {}", text(&out));
    let content = view.assert_complete("final", &mut con, &log, &expected_state(SEED, changes));
    let rows: usize = content.rows.values().map(|r| r.len()).sum();
    let entries: usize = content.streams.values().map(Vec::len).sum();
    println!(
        "{landed} random kills and {points_hit} crash points landed mid-backlog, Redis exact \
         after each; final: {rows} rows and {entries} stream entries equal the oracle"
    );
}
