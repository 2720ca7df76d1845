//! Sinks that lie about where they stand. A positioned sink's answer to
//! `committed` is untrusted: an epoch no host hands out must neither brick
//! the pipeline nor fence the honest sinks, a position past the end of the
//! generator's stream is not checkpointed, and the liar is named.

use crate::common;

use common::*;
use weir_core::position::Position;
use weir_source::commit_order::{StreamPosition, stream_position};

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

/// The generator's head for `(SEED, CHANGES)` by the oracle (its last
/// change), and a position past it: the start of the next transaction.
fn head_and_beyond() -> (Position, Position) {
    let head = change_log(SEED, CHANGES).last().expect("a stream").pos;
    let (tx, _) = head.as_stream().expect("a streaming position");
    (head, stream_position(tx + 1, 0))
}

fn position_liar(dir: &std::path::Path, required: bool, lie: &Position) -> SinkBuilder {
    sink("liar", "weir-fixture-positioned", dir)
        .required(required)
        .config("lie_position", &lie.to_hex())
}

/// No table of `sink` stands past `head` in what `weir status` reads.
fn assert_nothing_past(pipeline: &std::path::Path, sink: &str, head: &Position) {
    for (table, position) in positions_of(&status(pipeline), sink) {
        if let Some(position) = position {
            let position = Position::from_bytes(position);
            assert!(
                position <= *head,
                "{sink} stands at {position} on {table}, past the generator's head {head}"
            );
        }
    }
}

#[test]
fn a_required_liar_about_its_position_past_the_generator_stops_the_run_before_anything_is_committed()
 {
    let dir = tempfile::tempdir().unwrap();
    let (head, lie) = head_and_beyond();
    let pipeline = workload(SEED, CHANGES, 200)
        .sink(honest(dir.path()))
        .sink(position_liar(dir.path(), true, &lie))
        .write_in(dir.path());
    let out = weir(&["run", pipeline.to_str().unwrap()], &[]);
    let report = text(&out);
    assert_eq!(out.status.code(), Some(1), "{report}");
    for needle in [
        "sink `liar` claims",
        &format!("position {lie} for table `"),
        "cannot be true",
        &format!("nothing past {head}"),
    ] {
        assert!(report.contains(needle), "missing {needle:?} in: {report}");
    }
    for (table, position) in positions_of(&status(&pipeline), "exact") {
        assert_eq!(position, None, "the honest sink advanced on {table}");
    }
    assert_nothing_past(&pipeline, "liar", &head);
}

#[test]
fn an_optional_liar_about_its_position_past_the_generator_is_disabled_and_the_rest_is_exact() {
    let dir = tempfile::tempdir().unwrap();
    let (head, lie) = head_and_beyond();
    let pipeline = workload(SEED, CHANGES, 200)
        .sink(honest(dir.path()))
        .sink(position_liar(dir.path(), false, &lie))
        .write_in(dir.path());
    let out = weir(&["run", pipeline.to_str().unwrap()], &[]);
    let report = text(&out);
    assert_eq!(out.status.code(), Some(3), "{report}");
    for needle in ["`liar`", &lie.to_string(), &head.to_string()] {
        assert!(report.contains(needle), "missing {needle:?} in: {report}");
    }
    assert_positioned_exact(
        &sink_root(dir.path(), "exact"),
        &expected_state(SEED, CHANGES),
    );
    assert_nothing_past(&pipeline, "liar", &head);
}
