//! A positioned sink that claims a position the server never wrote, against
//! a real Postgres: weir must not acknowledge it to the replication slot
//! (the server would drop WAL every sink still needs), and must name the
//! sink. The lie comes from the positioned fixture's `lie_position`.

use crate::common;
use crate::postgres_support;
use weir_source::commit_order::stream_position;

use std::path::Path;

use common::{plugin, positions_of, status, text, weir};
use postgres_support::*;
use weir_core::position::Position;

fn liar_entry(dir: &Path, required: bool, lie: &Position) -> String {
    format!(
        "  - name: liar\n    plugin: {}\n    required: {required}\n    blob_store: {{ url: {} }}\n    \
         retries: 1\n    config: {{ lie_position: \"{}\" }}\n",
        plugin("weir-fixture-positioned").display(),
        dir.join("liar").display(),
        lie.to_hex()
    )
}

fn current_lsn(pg: &Pg, db: &str) -> u64 {
    parse_lsn(&pg.value(db, "SELECT pg_current_wal_lsn()")).expect("an LSN")
}

/// A database with the test schema and some rows, and a position far past
/// anything its server has written.
fn database_and_lie(pg: &Pg, db: &str, seed: u64) -> (String, Position) {
    let dsn = pg.fresh_db(db);
    pg.sql(db, SCHEMA);
    let mut rng = Rng::seeded(seed);
    pg.sql(db, &initial_load(60, 40, 4, &mut rng));
    let lie = stream_position(current_lsn(pg, db) + (1 << 40), 0);
    (dsn, lie)
}

fn assert_slot_not_past_the_server(pg: &Pg, db: &str, dsn: &str) {
    let confirmed = pg.confirmed_flush(db, &slot_of(dsn)).unwrap_or(0);
    let head = current_lsn(pg, db);
    assert!(
        confirmed <= head,
        "the slot was acknowledged at {confirmed:X}, past the server's {head:X}"
    );
}

#[test]
fn a_required_sink_claiming_a_position_past_the_server_stops_the_run_unacknowledged() {
    let pg = cluster();
    let db = "weir_liar_required";
    let (dsn, lie) = database_and_lie(&pg, db, 0x11a2_0001);
    let dir = tempfile::tempdir().unwrap();
    let mut pipeline = PgPipeline::new(&dsn, &TABLES);
    pipeline.extra_sinks = liar_entry(dir.path(), true, &lie);
    let pipeline = pipeline.write(dir.path(), &dir.path().join("exact"));

    let out = weir(
        &["run", pipeline.to_str().unwrap()],
        &[("WEIR_PG_EXIT", "true")],
    );
    let report = text(&out);
    assert_eq!(out.status.code(), Some(1), "{report}");
    for needle in [
        "`liar`",
        &lie.to_string(),
        "cannot be true",
        "nothing was acknowledged",
    ] {
        assert!(report.contains(needle), "missing {needle:?} in: {report}");
    }
    assert_slot_not_past_the_server(&pg, db, &dsn);
    for (table, position) in positions_of(&status(&pipeline), "exact") {
        assert_eq!(position, None, "the honest sink advanced on {table}");
    }
}

#[test]
fn an_optional_sink_claiming_a_position_past_the_server_is_disabled_and_the_rest_is_exact() {
    let pg = cluster();
    let db = "weir_liar_optional";
    let (dsn, lie) = database_and_lie(&pg, db, 0x11a2_0002);
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("exact");
    let mut pipeline = PgPipeline::new(&dsn, &TABLES);
    pipeline.extra_sinks = liar_entry(dir.path(), false, &lie);
    let pipeline = pipeline.write(dir.path(), &root);

    let out = weir(
        &["run", pipeline.to_str().unwrap()],
        &[("WEIR_PG_EXIT", "true")],
    );
    let report = text(&out);
    assert_eq!(out.status.code(), Some(3), "{report}");
    for needle in ["`liar`", &lie.to_string(), "cannot be true"] {
        assert!(report.contains(needle), "missing {needle:?} in: {report}");
    }
    assert_sink_equals_postgres(&pg, db, &root, &table_defs(false));
    assert_slot_not_past_the_server(&pg, db, &dsn);
    let confirmed = pg.confirmed_flush(db, &slot_of(&dsn)).expect("the slot");
    assert!(
        confirmed > 0,
        "the honest sink's progress was never acknowledged"
    );
}
