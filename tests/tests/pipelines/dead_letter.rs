//! The dead-letter valve: a positioned sink that refuses the rows whose
//! `id` is a multiple of seven. With the valve on, those rows are set aside
//! (one JSON object each, named by position) and the rest commits; every
//! change of the generator is then in the sink or set aside, once, across a
//! kill between the setting aside and the commit. Past its bound the valve
//! stops the pipeline as a poison batch always did.

use crate::common;

use std::collections::BTreeSet;
use std::io::Cursor;
use std::path::Path;
use std::sync::Arc;

use arrow_schema::{Field, Schema};
use common::*;
use weir_source::change::{Op, TableSchema};

const SEED: u64 = 17;
const CHANGES: u64 = 2_000;
const EVERY: i64 = 7;

fn refusing_sink(dir: &Path, max_rows: u64) -> SinkBuilder {
    sink("exact", "weir-fixture-positioned", dir)
        .config("refuse_column", "id")
        .config("refuse_every", &EVERY.to_string())
        .dead_letter(dir.join("dead").to_str().unwrap(), max_rows, 1.0)
}

fn refusing_pipeline(dir: &Path, max_rows: u64, linger_ms: u64) -> PipelineBuilder {
    PipelineBuilder::generator(SEED, CHANGES)
        .name("dead-letter-test")
        .max_rows(250)
        .linger_ms(linger_ms)
        .sink(refusing_sink(dir, max_rows))
}

fn refused(values: &[weir_source::change::Value], table: &TableSchema) -> bool {
    table
        .columns
        .iter()
        .position(|c| c.name == "id")
        .is_some_and(
            |i| matches!(values[i], weir_source::change::Value::Int64(id) if id % EVERY == 0),
        )
}

/// Every dead-letter record of a table, as the change it holds, read with
/// arrow-json against the table's columns.
fn set_aside(dir: &Path, table: &TableSchema) -> Vec<ReadChange> {
    let folder = dir.join("dead/dead-letter-test/exact").join(&table.name);
    let Ok(entries) = std::fs::read_dir(&folder) else {
        return Vec::new();
    };
    let schema = Arc::new(Schema::new(
        table
            .columns
            .iter()
            .map(|c| Field::new(&c.name, c.data_type.clone(), true))
            .collect::<Vec<_>>(),
    ));
    let mut out = Vec::new();
    for entry in entries {
        let path = entry.unwrap().path();
        let record: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        let position = record["position"].as_str().unwrap();
        assert_eq!(
            path.file_stem().unwrap().to_str().unwrap(),
            position,
            "a record is named by its position"
        );
        assert!(
            record["error"].as_str().unwrap().contains("is refused"),
            "the sink's reason is kept: {record}"
        );
        let line = serde_json::to_vec(&record["row"]).unwrap();
        let mut reader = arrow_json::ReaderBuilder::new(schema.clone())
            .build(Cursor::new(line))
            .unwrap();
        let row = reader.next().unwrap().unwrap();
        let op = [Op::Insert, Op::Update, Op::Delete, Op::Read]
            .into_iter()
            .find(|op| op.as_str() == record["op"].as_str().unwrap())
            .unwrap();
        out.push(ReadChange {
            op,
            pos: (0..position.len())
                .step_by(2)
                .map(|i| u8::from_str_radix(&position[i..i + 2], 16).unwrap())
                .collect(),
            values: (0..table.columns.len())
                .map(|c| value_at(row.column(c).as_ref(), 0))
                .collect(),
        });
    }
    out
}

#[test]
fn refused_rows_are_set_aside_and_every_change_is_in_the_sink_or_set_aside_once() {
    let dir = tempfile::tempdir().unwrap();
    let pipeline = refusing_pipeline(dir.path(), 1_000, 20).write_in(dir.path());

    // Killed after rows were set aside and before the sink committed them:
    // the replay writes the same records again, never a second copy.
    run_killed_at(&pipeline, "before-sink-commit@6");
    let before_restart: usize = shop_tables()
        .iter()
        .map(|t| set_aside(dir.path(), t).len())
        .sum();
    assert!(
        before_restart > 0,
        "INCONCLUSIVE: nothing was set aside before the kill"
    );
    let out = weir(&["run", pipeline.to_str().unwrap()], &[]);
    let report = text(&out);
    assert!(out.status.success(), "{report}");
    assert!(
        report.contains("dead-letter"),
        "the run does not say it set rows aside: {report}"
    );

    let expected = expected_state(SEED, CHANGES);
    let mut total_set_aside = 0;
    for table in shop_tables() {
        let committed = changes(
            &table,
            &read_positioned(&sink_root(dir.path(), "exact"), &table.name),
        );
        let aside = set_aside(dir.path(), &table);
        for change in &committed {
            assert!(
                !refused(&change.values, &table),
                "{}: the sink holds a row it refuses: {change:?}",
                table.name
            );
        }
        for change in &aside {
            assert!(
                refused(&change.values, &table),
                "{}: a row the sink takes was set aside: {change:?}",
                table.name
            );
        }
        let in_sink: BTreeSet<&Vec<u8>> = committed.iter().map(|c| &c.pos).collect();
        let both: Vec<_> = aside.iter().filter(|c| in_sink.contains(&c.pos)).collect();
        assert!(
            both.is_empty(),
            "{}: changes in both places: {both:?}",
            table.name
        );
        total_set_aside += aside.len();
        let reduced = reduce(&table, committed.into_iter().chain(aside).collect());
        assert_eq!(reduced.duplicates, 0, "{}: changes held twice", table.name);
        assert_table_matches(
            "the sink and its dead-letter location together",
            &expected,
            &table.name,
            &reduced.state,
        );
    }
    assert!(total_set_aside > 0, "INCONCLUSIVE: no row was refused");
    // `weir status` counts them where they are.
    let status = status(&pipeline);
    let counted: u64 = status["sinks"][0]["tables"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["dead_letter_rows"].as_u64().expect("a count per table"))
        .sum();
    assert_eq!(counted, total_set_aside as u64, "{status}");
}

#[test]
fn a_batch_with_more_refused_rows_than_the_bound_still_stops_the_pipeline() {
    let dir = tempfile::tempdir().unwrap();
    let pipeline = refusing_pipeline(dir.path(), 2, 600_000).write_in(dir.path());
    let out = weir(&["run", pipeline.to_str().unwrap()], &[]);
    let report = text(&out);
    assert_eq!(out.status.code(), Some(1), "{report}");
    for needle in [
        "`exact`",
        "poison",
        "dead_letter.max_rows is 2",
        "nothing was advanced",
    ] {
        assert!(report.contains(needle), "missing {needle:?} in: {report}");
    }
    // Nothing of the stopped batch was set aside, and the sink holds no
    // change at or past it: a later run with a wider bound starts there.
    let status = status(&pipeline);
    let stopped_at = positions_of(&status, "exact");
    for table in shop_tables() {
        let held = stopped_at[&table.name].clone();
        for change in set_aside(dir.path(), &table) {
            assert!(
                held.as_ref().is_some_and(|at| change.pos <= *at),
                "{}: a row past the committed position was set aside",
                table.name
            );
        }
    }
    refusing_pipeline(dir.path(), 1_000, 600_000).write(&pipeline);
    let out = weir(&["run", pipeline.to_str().unwrap()], &[]);
    assert!(out.status.success(), "{}", text(&out));
}

#[test]
fn a_dead_letter_location_inside_a_sinks_root_is_refused_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let inside = sink_root(dir.path(), "exact").join("refused");
    let pipeline = PipelineBuilder::generator(SEED, 100)
        .sink(
            sink("exact", "weir-fixture-positioned", dir.path()).dead_letter(
                inside.to_str().unwrap(),
                10,
                1.0,
            ),
        )
        .write_in(dir.path());
    let out = weir(&["run", pipeline.to_str().unwrap()], &[]);
    let report = text(&out);
    assert!(!out.status.success(), "{report}");
    for needle in ["sinks[0].dead_letter.url", "sink `exact`", "overlaps"] {
        assert!(report.contains(needle), "missing {needle:?} in: {report}");
    }
}
