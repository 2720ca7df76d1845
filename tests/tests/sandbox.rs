//! Plugins that trap, loop forever, exhaust their memory or refuse a batch:
//! each ends with an error naming the sink, table and position, the host
//! survives where the config says to keep going, the other sinks finish,
//! and the failed sink's positions do not advance past the failed batch.

mod common;

use common::*;
use weir::source::generator::expected_state;

const WORKLOAD: Workload = Workload {
    seed: 3,
    max_changes: 1_500,
    max_rows: 300,
    linger_ms: 20,
    pace_us: 0,
};

/// Runs `exact` (required) beside a misbehaving optional sink and checks the
/// run finishes for `exact` while the bad sink is disabled with `cause`.
fn misbehaving_optional_sink(crate_name: &str, cause: &str, memory_mb: u64, timeout_ms: u64) {
    let dir = tempfile::tempdir().unwrap();
    let exact = SinkDef::new("exact", "weir-fixture-positioned", dir.path());
    let exact_root = exact.root.clone();
    let bad = SinkDef::new("bad", crate_name, dir.path())
        .optional()
        .limits(memory_mb, timeout_ms);
    let pipeline = write_pipeline(dir.path(), &WORKLOAD, &[exact, bad]);
    let out = weir(&["run", pipeline.to_str().unwrap()], &[]);
    let report = text(&out);
    assert_eq!(out.status.code(), Some(3), "{report}");
    for needle in ["`bad`", "table `shop.", "positions", cause] {
        assert!(report.contains(needle), "missing {needle:?} in: {report}");
    }
    assert_positioned_exact(
        &exact_root,
        &expected_state(WORKLOAD.seed, WORKLOAD.max_changes),
    );
    let status = status(&pipeline);
    for (table, position) in positions_of(&status, "bad") {
        assert_eq!(position, None, "the failed sink advanced on {table}");
    }
}

#[test]
fn a_trapping_sink_is_disabled_and_the_host_goes_on() {
    misbehaving_optional_sink("weir-fixture-trap", "trapped", 256, 10_000);
}

#[test]
fn a_sink_that_loops_forever_hits_its_cpu_deadline() {
    misbehaving_optional_sink("weir-fixture-spin", "CPU deadline", 256, 300);
}

#[test]
fn a_sink_that_exhausts_memory_hits_its_limit() {
    misbehaving_optional_sink("weir-fixture-hog", "memory limit of 64 MiB", 64, 10_000);
}

#[test]
fn a_poison_batch_in_a_required_sink_stops_the_pipeline_without_advancing() {
    let dir = tempfile::tempdir().unwrap();
    let exact = SinkDef::new("exact", "weir-fixture-positioned", dir.path());
    let poison =
        SinkDef::new("picky", "weir-fixture-poison", dir.path()).config("table", "shop.orders");
    let pipeline = write_pipeline(dir.path(), &WORKLOAD, &[exact, poison]);
    let out = weir(&["run", pipeline.to_str().unwrap()], &[]);
    let report = text(&out);
    assert_eq!(out.status.code(), Some(1), "{report}");
    for needle in ["`picky`", "poison", "`shop.orders`", "nothing was advanced"] {
        assert!(report.contains(needle), "missing {needle:?} in: {report}");
    }
    let status = status(&pipeline);
    let picky = positions_of(&status, "picky");
    assert_eq!(picky["shop.orders"], None, "the poisoned table advanced");
    // Running again refuses again at the same place: nothing was skipped.
    let again = weir(&["run", pipeline.to_str().unwrap()], &[]);
    assert_eq!(again.status.code(), Some(1), "{}", text(&again));
}

#[test]
fn a_poison_batch_in_an_optional_sink_disables_only_that_sink() {
    let dir = tempfile::tempdir().unwrap();
    let exact = SinkDef::new("exact", "weir-fixture-positioned", dir.path());
    let exact_root = exact.root.clone();
    let poison = SinkDef::new("picky", "weir-fixture-poison", dir.path())
        .optional()
        .config("table", "shop.orders");
    let pipeline = write_pipeline(dir.path(), &WORKLOAD, &[exact, poison]);
    let out = weir(&["run", pipeline.to_str().unwrap()], &[]);
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    assert_positioned_exact(
        &exact_root,
        &expected_state(WORKLOAD.seed, WORKLOAD.max_changes),
    );
}
