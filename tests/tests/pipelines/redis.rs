//! The Redis sink end to end: `weir run` streams the generator into the
//! WASM Redis sink, which reaches a private `redis-server` only through the
//! TCP grant the pipeline gives it. What Redis then holds is read back with
//! the `redis` crate's client, decoded by the documented rendering, and
//! compared with the generator's oracle: every row exact, every append
//! stream holding each change once, nothing extra. Also: a second run adds
//! nothing, a sink without the grant is refused at load, and Redis down at
//! start fails the run clearly, after which a new run completes exact. And
//! the comparison itself is shown to fail on a duplicate, a gap, an extra
//! key, a changed or lost row and a value the sink would not render so.

use crate::common;

use std::collections::BTreeMap;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::Path;

use common::*;
use weir_test_support::redis::{Dumped, dump};

const SEED: u64 = 31;
const CHANGES: u64 = 4_000;

/// The Redis sink under the prefix `e2e`, granted exactly its server.
fn redis_sink(dir: &Path, server: &RedisServer) -> SinkBuilder {
    sink("cache", "weir-redis-sink", dir)
        .grant_tcp(&server.address())
        .config("address", &server.address())
        .config("prefix", "e2e")
}

/// Customers upserted under another name, orders appended as a stream,
/// order items upserted by their composite key; every row carries the
/// change's operation and position.
fn mixed(workload: PipelineBuilder) -> PipelineBuilder {
    workload
        .table("shop.customers", TableMode::Upsert, "crm.customers")
        .table("shop.orders", TableMode::Append, "shop.orders")
        .metadata("op", "op")
        .metadata("pos", "pos")
}

/// How [`mixed`] lands in Redis.
fn mixed_view() -> RedisView {
    RedisView::new("test", &tables())
        .prefix("e2e")
        .table("shop.customers", false, "crm.customers")
        .table("shop.orders", true, "shop.orders")
        .op_field("op")
        .pos_field("pos")
}

/// Everything in the server, with the position hashes' epochs left out: a
/// run that writes nothing may still record its newer epoch.
fn data_and_positions(con: &mut ::redis::Connection) -> BTreeMap<String, Dumped> {
    let mut all = dump(con, "");
    for (key, value) in all.iter_mut() {
        if key.starts_with("e2e:__weir:")
            && let Dumped::Hash(fields) = value
        {
            fields.remove("epoch");
        }
    }
    all
}

#[test]
fn the_generator_lands_in_redis_exactly_and_a_second_run_adds_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let server = RedisServer::start();
    let mut con = server.client();
    let workload = mixed(workload(SEED, CHANGES, 250)).sink(redis_sink(dir.path(), &server));
    let pipeline = workload.write_in(dir.path());

    let out = weir(&["run", pipeline.to_str().unwrap()], &[]);
    assert!(out.status.success(), "the run failed: {}", text(&out));
    let log: Vec<_> = change_log(SEED, CHANGES).collect();
    let expected = expected_state(SEED, CHANGES);
    let view = mixed_view();
    let first = view.assert_complete("first run", &mut con, &log, &expected);
    for table in tables() {
        assert!(
            first.positions.contains_key(&table.name),
            "no position for {} in Redis",
            table.name
        );
    }
    let rows: usize = first.rows.values().map(|r| r.len()).sum();
    let entries: usize = first.streams.values().map(Vec::len).sum();
    assert!(
        rows > 100 && entries > 100,
        "too small to prove anything: {rows} rows, {entries} stream entries"
    );

    let before = data_and_positions(&mut con);
    let out = weir(&["run", pipeline.to_str().unwrap()], &[]);
    assert!(
        out.status.success(),
        "the second run failed: {}",
        text(&out)
    );
    let after = data_and_positions(&mut con);
    let changed: Vec<&String> = before
        .keys()
        .chain(after.keys())
        .filter(|k| before.get(*k) != after.get(*k))
        .take(5)
        .collect();
    assert!(
        changed.is_empty(),
        "the second run changed Redis; first keys that differ: {changed:?}"
    );
    view.assert_complete("second run", &mut con, &log, &expected);
    println!("{rows} rows and {entries} stream entries exact; a second run changed nothing");
}

#[test]
fn a_sink_without_the_tcp_grant_is_refused_at_load() {
    let dir = tempfile::tempdir().unwrap();
    let server = RedisServer::start();
    let ungranted = sink("cache", "weir-redis-sink", dir.path())
        .config("address", &server.address())
        .config("prefix", "e2e");
    let pipeline = workload(SEED, 300, 100)
        .sink(ungranted)
        .write_in(dir.path());
    let out = weir(&["run", pipeline.to_str().unwrap()], &[]);
    let report = text(&out);
    assert_eq!(out.status.code(), Some(1), "{report}");
    for needle in ["weir_redis_sink.wasm", "grants.tcp"] {
        assert!(report.contains(needle), "missing {needle:?} in: {report}");
    }
    assert!(
        dump(&mut server.client(), "").is_empty(),
        "the refused sink wrote to Redis"
    );
}

#[test]
fn redis_down_at_start_fails_the_run_clearly_and_a_later_run_is_exact() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = RedisServer::start();
    server.stop();
    // All tables upserted under the default prefix, no context fields.
    let plain = sink("cache", "weir-redis-sink", dir.path())
        .grant_tcp(&server.address())
        .config("address", &server.address());
    let workload = workload(SEED, 1_500, 200).sink(plain);
    let pipeline = workload.write_in(dir.path());

    let out = weir(&["run", pipeline.to_str().unwrap()], &[]);
    let report = text(&out);
    assert!(!out.status.success(), "ran without Redis: {report}");
    let cause = format!("cannot connect to Redis at {}", server.address());
    for needle in [cause.as_str(), "retryable", "cache"] {
        assert!(report.contains(needle), "missing {needle:?} in: {report}");
    }

    server.restart();
    let out = weir(&["run", pipeline.to_str().unwrap()], &[]);
    assert!(
        out.status.success(),
        "the run after Redis came back failed: {}",
        text(&out)
    );
    let log: Vec<_> = change_log(SEED, 1_500).collect();
    let view = RedisView::new("test", &tables());
    view.assert_complete(
        "after Redis came back",
        &mut server.client(),
        &log,
        &expected_state(SEED, 1_500),
    );
}

/// Tampers with `key`, expects the comparison to fail with a message
/// holding `needle`, then puts the key back as it was (DUMP/RESTORE).
fn assert_caught(
    view: &RedisView,
    con: &mut ::redis::Connection,
    log: &[weir_source::change::Change],
    key: &str,
    needle: &str,
    tamper: impl FnOnce(&mut ::redis::Connection),
) {
    let saved: Option<Vec<u8>> = ::redis::cmd("DUMP").arg(key).query(con).unwrap();
    tamper(con);
    let outcome = catch_unwind(AssertUnwindSafe(|| {
        view.assert_exact("tampered", con, log);
    }));
    let _: () = ::redis::cmd("DEL").arg(key).query(con).unwrap();
    if let Some(saved) = saved {
        let _: () = ::redis::cmd("RESTORE")
            .arg(key)
            .arg(0)
            .arg(saved)
            .query(con)
            .unwrap();
    }
    let error = outcome.expect_err(&format!("tampering with {key} went unnoticed"));
    let message = error
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| error.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_default();
    assert!(
        message.contains(needle),
        "tampering with {key}: the failure does not say {needle:?}: {message}"
    );
    // Put back, it compares equal again.
    view.assert_exact("restored", con, log);
}

#[test]
fn the_comparison_catches_duplicates_gaps_extra_keys_and_changed_rows() {
    let dir = tempfile::tempdir().unwrap();
    let server = RedisServer::start();
    let mut con = server.client();
    let (seed, changes) = (37, 1_200);
    let pipeline = mixed(workload(seed, changes, 100))
        .sink(redis_sink(dir.path(), &server))
        .write_in(dir.path());
    let out = weir(&["run", pipeline.to_str().unwrap()], &[]);
    assert!(out.status.success(), "the run failed: {}", text(&out));
    let log: Vec<_> = change_log(seed, changes).collect();
    let view = mixed_view();
    let content = view.assert_exact("as written", &mut con, &log);

    let stream = "e2e:shop.orders";
    let entries: Vec<(String, Vec<(String, String)>)> = match &dump(&mut con, stream)[stream] {
        Dumped::Stream(entries) => entries.clone(),
        other => panic!("{stream} holds {other:?}"),
    };
    let (middle_id, middle_fields) = entries[entries.len() / 2].clone();
    assert_caught(&view, &mut con, &log, stream, "1 duplicated", |con| {
        let mut xadd = ::redis::cmd("XADD");
        xadd.arg(stream).arg("*");
        for (field, value) in &middle_fields {
            xadd.arg(field).arg(value);
        }
        let _: String = xadd.query(con).unwrap();
    });
    assert_caught(&view, &mut con, &log, stream, "1 missing", |con| {
        let _: () = ::redis::cmd("XDEL")
            .arg(stream)
            .arg(&middle_id)
            .query(con)
            .unwrap();
    });

    let (key, _) = content.rows["shop.customers"].iter().next().unwrap();
    let weir_test_support::KeyPart::Int64(id) = key[0] else {
        panic!("customer key {key:?}")
    };
    let row = format!("e2e:crm.customers:{id}");
    assert_caught(&view, &mut con, &log, &row, "differing", |con| {
        let _: () = ::redis::cmd("HSET")
            .arg(&row)
            .arg("name")
            .arg("someone else")
            .query(con)
            .unwrap();
    });
    assert_caught(&view, &mut con, &log, &row, "missing", |con| {
        let _: () = ::redis::cmd("DEL").arg(&row).query(con).unwrap();
    });
    assert_caught(
        &view,
        &mut con,
        &log,
        &row,
        "not the documented text",
        |con| {
            let _: () = ::redis::cmd("HSET")
                .arg(&row)
                .arg("signup_date")
                .arg("2024-1-2")
                .query(con)
                .unwrap();
        },
    );
    assert_caught(&view, &mut con, &log, &row, "fields no column", |con| {
        let _: () = ::redis::cmd("HSET")
            .arg(&row)
            .arg("nickname")
            .arg("x")
            .query(con)
            .unwrap();
    });
    // A well-formed row of a customer the source never had.
    let ghost = "e2e:crm.customers:99999999";
    let mut fields: BTreeMap<String, String> =
        ::redis::cmd("HGETALL").arg(&row).query(&mut con).unwrap();
    fields.insert("id".into(), "99999999".into());
    assert_caught(
        &view,
        &mut con,
        &log,
        ghost,
        "extra [[Int64(99999999)]]",
        |con| {
            let mut hset = ::redis::cmd("HSET");
            hset.arg(ghost);
            for (field, value) in &fields {
                hset.arg(field).arg(value);
            }
            let _: () = hset.query(con).unwrap();
        },
    );
    let stray = "e2e:leftover";
    assert_caught(
        &view,
        &mut con,
        &log,
        stray,
        "no table of pipeline",
        |con| {
            let _: () = ::redis::cmd("SET").arg(stray).arg("x").query(con).unwrap();
        },
    );
    // A table whose position is gone must hold nothing.
    let position = "e2e:__weir:test:shop.order_items";
    assert_caught(&view, &mut con, &log, position, "found", |con| {
        let _: () = ::redis::cmd("DEL").arg(position).query(con).unwrap();
    });
}
