//! Sinks that lie about where they stand. A positioned sink's answer to
//! `committed` is untrusted: an epoch no host hands out must neither brick
//! the pipeline nor fence the honest sinks, and the liar is named.

use crate::common;

use common::*;

const SEED: u64 = 11;
const CHANGES: u64 = 800;

/// An epoch so close to the end of the range that `+ 1` (the next run's
/// epoch) would wrap: the claim the issue found bricking pipelines.
const LYING_EPOCH: &str = "18446744073709551614";

fn honest(dir: &std::path::Path) -> SinkBuilder {
    sink("exact", "weir-fixture-positioned", dir)
}

fn liar(dir: &std::path::Path, required: bool) -> SinkBuilder {
    sink("liar", "weir-fixture-positioned", dir)
        .required(required)
        .config("lie_epoch", LYING_EPOCH)
}

#[test]
fn an_optional_liar_about_its_epoch_is_disabled_and_cannot_brick_the_pipeline() {
    let dir = tempfile::tempdir().unwrap();
    let with_liar = workload(SEED, CHANGES, 200)
        .sink(honest(dir.path()))
        .sink(liar(dir.path(), false))
        .write_in(dir.path());
    let out = weir(&["run", with_liar.to_str().unwrap()], &[]);
    let report = text(&out);
    assert_eq!(out.status.code(), Some(3), "{report}");
    for needle in ["`liar`", &format!("epoch {LYING_EPOCH}")] {
        assert!(report.contains(needle), "missing {needle:?} in: {report}");
    }
    let expected = expected_state(SEED, CHANGES);
    assert_positioned_exact(&sink_root(dir.path(), "exact"), &expected);

    // Without the liar, the pipeline runs on: its epoch was never pushed to
    // the end of the range, so nothing wraps and nothing is fenced.
    let honest_only = workload(SEED, CHANGES, 200)
        .sink(honest(dir.path()))
        .write_in(dir.path());
    for _ in 0..2 {
        let out = weir(&["run", honest_only.to_str().unwrap()], &[]);
        assert!(out.status.success(), "{}", text(&out));
    }
    let epoch = status(&honest_only)["epoch"].as_u64().unwrap();
    assert!(epoch < 10, "the epoch ran away to {epoch}");
    assert_positioned_exact(&sink_root(dir.path(), "exact"), &expected);
}

#[test]
fn a_required_liar_about_its_epoch_stops_the_run_before_anything_is_committed() {
    let dir = tempfile::tempdir().unwrap();
    let pipeline = workload(SEED, CHANGES, 200)
        .sink(honest(dir.path()))
        .sink(liar(dir.path(), true))
        .write_in(dir.path());
    let out = weir(&["run", pipeline.to_str().unwrap()], &[]);
    let report = text(&out);
    assert_eq!(out.status.code(), Some(1), "{report}");
    for needle in ["`liar`", &format!("epoch {LYING_EPOCH}"), "cannot be true"] {
        assert!(report.contains(needle), "missing {needle:?} in: {report}");
    }
    let status = status(&pipeline);
    for (table, position) in positions_of(&status, "exact") {
        assert_eq!(position, None, "the honest sink advanced on {table}");
    }
}
