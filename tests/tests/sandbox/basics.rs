//! Plugins that trap, loop forever, exhaust their memory or refuse a batch:
//! each ends with an error naming the sink, table and position, the host
//! survives where the config says to keep going, the other sinks finish,
//! and the failed sink's positions do not advance past the failed batch.

use crate::common;

use common::*;

const SEED: u64 = 3;
const CHANGES: u64 = 1_500;

fn exact_beside(other: SinkBuilder, dir: &std::path::Path) -> std::path::PathBuf {
    workload(SEED, CHANGES, 300)
        .sink(sink("exact", "weir-fixture-positioned", dir))
        .sink(other)
        .write_in(dir)
}

/// Runs `exact` (required) beside a misbehaving optional sink and checks the
/// run finishes for `exact` while the bad sink is disabled with `cause`.
fn misbehaving_optional_sink(crate_name: &str, cause: &str, memory_mb: u64, timeout_ms: u64) {
    let dir = tempfile::tempdir().unwrap();
    let bad = sink("bad", crate_name, dir.path())
        .required(false)
        .limits(memory_mb, timeout_ms);
    let pipeline = exact_beside(bad, dir.path());
    let out = weir(&["run", pipeline.to_str().unwrap()], &[]);
    let report = text(&out);
    assert_eq!(out.status.code(), Some(3), "{report}");
    for needle in ["`bad`", "table `shop.", "positions", cause] {
        assert!(report.contains(needle), "missing {needle:?} in: {report}");
    }
    assert_positioned_exact(
        &sink_root(dir.path(), "exact"),
        &expected_state(SEED, CHANGES),
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
    let poison = sink("picky", "weir-fixture-poison", dir.path()).config("table", "shop.orders");
    let pipeline = exact_beside(poison, dir.path());
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
    let poison = sink("picky", "weir-fixture-poison", dir.path())
        .required(false)
        .config("table", "shop.orders");
    let pipeline = exact_beside(poison, dir.path());
    let out = weir(&["run", pipeline.to_str().unwrap()], &[]);
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    assert_positioned_exact(
        &sink_root(dir.path(), "exact"),
        &expected_state(SEED, CHANGES),
    );
}
