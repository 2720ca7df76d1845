//! A benchmark, not a timed test (ignored by default; run it with
//! `cargo test --release -p weir-tests --test postgres_bench -- --ignored --nocapture`).
//!
//! On one prepared backlog (WEIR_BENCH_ROWS rows, default 500k, in 10-row
//! transactions) it prints: weir's rows/s streaming it into a sink that only
//! decodes and keeps each batch in memory (the positioned fixture on a
//! `memory://` store), pg_recvlogical's rows/s decoding the same backlog from
//! a twin slot, and the server's own decode rate
//! (`pg_logical_slot_peek_binary_changes` on a third slot), with the ratios;
//! then weir's backfill rows/s against `\copy (select ...) to /dev/null`.

mod common;
mod postgres_support;

use std::process::Command;
use std::time::Instant;

use postgres_support::*;

fn timed(what: &str, f: impl FnOnce()) -> f64 {
    let started = Instant::now();
    f();
    let secs = started.elapsed().as_secs_f64();
    println!("{what}: {secs:.2} s");
    secs
}

#[test]
#[ignore = "a benchmark: run it by hand with --ignored --nocapture"]
fn streaming_and_backfill_rates_against_postgres_own_tools() {
    let rows: u64 = std::env::var("WEIR_BENCH_ROWS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(500_000);
    let pg = cluster();
    let db = "weir_bench";
    let dsn = pg.fresh_db(db);
    pg.sql(
        db,
        "CREATE TABLE bench (id bigint PRIMARY KEY, a int4, b text, c numeric(10,2), d timestamptz);\n\
         CREATE PUBLICATION weir_pub FOR TABLE bench;",
    );
    let dir = tempfile::tempdir().unwrap();
    let mut p = PgPipeline::new(&dsn, &["public.bench"]);
    p.chunk_rows = 10_000;
    p.max_rows = 10_000;
    let pipeline = p.write(dir.path(), &dir.path().join("unused"));
    // The null sink: every batch crosses into WebAssembly and is decoded
    // there, then dropped, so the boundary cost counts and no destination does.
    let yaml = std::fs::read_to_string(&pipeline).unwrap();
    let yaml = yaml
        .replace(
            &format!("url: {}", dir.path().join("unused").display()),
            "url: \"memory://\"",
        )
        .replace("weir_fixture_positioned.wasm", "weir_null_sink.wasm");
    assert!(yaml.contains("weir_null_sink.wasm"), "{yaml}");
    std::fs::write(&pipeline, yaml).unwrap();
    // First run: creates the slot at an empty table and commits a position,
    // so the next run streams the backlog.
    drain(&pipeline);
    for slot in ["bench_twin", "bench_peek"] {
        pg.sql(
            db,
            &format!("SELECT pg_create_logical_replication_slot('{slot}', 'pgoutput');"),
        );
    }
    let transactions = rows / 10;
    timed(
        &format!("prepare {rows} rows in {transactions} transactions"),
        || {
            pg.sql(
            db,
            &format!(
                "DO $$ BEGIN FOR t IN 0..{} LOOP \
                   INSERT INTO bench SELECT t * 10 + g, g, md5((t * 10 + g)::text), (t % 1000) + 0.5, \
                     timestamptz '2024-01-01 00:00:00+00' + (t * interval '1 second') \
                   FROM generate_series(1, 10) g; COMMIT; END LOOP; END $$;",
                transactions - 1
            ),
        );
        },
    );
    let end = pg.value(db, "SELECT pg_current_wal_insert_lsn()");

    let weir_secs = timed("weir streaming into the decode-and-drop sink", || {
        drain(&pipeline)
    });
    let recv_secs = timed("pg_recvlogical from a twin slot", || {
        let out = Command::new("pg_recvlogical")
            .args([
                "-d",
                &dsn,
                "--slot",
                "bench_twin",
                "--start",
                "-E",
                &end,
                "-o",
                "proto_version=1",
                "-o",
                "publication_names=weir_pub",
                "-f",
                "/dev/null",
            ])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    });
    let peek_secs = timed("server decode (peek on a third slot)", || {
        pg.sql(
            db,
            "SELECT count(*) FROM pg_logical_slot_peek_binary_changes('bench_peek', NULL, NULL, \
             'proto_version', '1', 'publication_names', 'weir_pub');",
        );
    });
    let rate = |secs: f64| rows as f64 / secs;
    println!(
        "\nstreaming {rows} rows: weir {:.0} rows/s, pg_recvlogical {:.0} rows/s, server decode {:.0} rows/s\n\
         weir / pg_recvlogical = {:.2}, weir / server decode = {:.2}",
        rate(weir_secs),
        rate(recv_secs),
        rate(peek_secs),
        recv_secs / weir_secs,
        peek_secs / weir_secs
    );

    // Backfill: a new pipeline (new slot, no positions) over the same table.
    let dir2 = tempfile::tempdir().unwrap();
    let mut p2 = PgPipeline::new(&dsn, &["public.bench"]);
    p2.slot = "bench_backfill".into();
    p2.chunk_rows = 10_000;
    p2.max_rows = 10_000;
    let pipeline2 = p2.write(dir2.path(), &dir2.path().join("unused"));
    let yaml = std::fs::read_to_string(&pipeline2).unwrap().replace(
        &format!("url: {}", dir2.path().join("unused").display()),
        "url: \"memory://\"",
    );
    std::fs::write(&pipeline2, yaml).unwrap();
    // Compile the plugin into this state dir first, outside the timing.
    let backfill_secs = timed("weir backfill (includes start-up)", || drain(&pipeline2));
    let copy_secs = timed("psql \\copy (select * from bench) to /dev/null", || {
        pg.sql(db, "\\copy (SELECT * FROM bench) TO '/dev/null'");
    });
    println!(
        "\nbackfill {rows} rows: weir {:.0} rows/s, \\copy {:.0} rows/s, weir / \\copy = {:.2}",
        rate(backfill_secs),
        rate(copy_secs),
        copy_secs / backfill_secs
    );
    for slot in ["bench_twin", "bench_peek", "bench_backfill"] {
        let _ = pg.try_sql(db, &format!("SELECT pg_drop_replication_slot('{slot}');"));
    }
}
