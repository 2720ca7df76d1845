//! The Iceberg sink with its warehouse on S3: a private moto server, the
//! sink's blob store `s3://weir-lake/lake`, and readers that go through the
//! S3 API themselves, as a user's engine would: DuckDB (httpfs) and
//! pyiceberg (pyarrow's S3 file system). Both must return the generator's
//! state at the committed positions, and a second run must change nothing.

use crate::common;
use crate::iceberg_support;

use common::{SinkBuilder, TableMode, tables, text, weir};
use iceberg_support::*;
use weir_test_support::moto::MotoServer;

const BUCKET: &str = "weir-lake";
const SEED: u64 = 17;
const CHANGES: u64 = 3_000;

#[test]
fn upsert_tables_on_s3_are_read_through_s3_by_duckdb_and_pyiceberg() {
    let moto = MotoServer::start();
    moto.create_bucket(BUCKET);
    let dir = tempfile::tempdir().unwrap();
    let warehouse = format!("s3://{BUCKET}/lake");
    let sink = SinkBuilder::new("iceberg", common::plugin("weir-iceberg-sink"))
        .blob_store_url(&warehouse)
        .limits(1024, 120_000)
        .retries(2)
        .config("warehouse", &warehouse);
    let pipeline = tables()
        .iter()
        .fold(common::PipelineBuilder::generator(SEED, CHANGES), |p, t| {
            p.table(&t.name, TableMode::Upsert, &destination(&t.name))
        })
        .name("s3up")
        .sink(sink)
        .max_rows(300)
        .linger_ms(20)
        .heartbeat_ms(500)
        .metadata("pos", "change_pos")
        .state_dir("state");
    // The builder has no key for blob-store options: add them to the JSON.
    let mut json: serde_json::Value = serde_json::from_str(&pipeline.text()).unwrap();
    json["sinks"][0]["blob_store"]["options"] =
        serde_json::to_value(moto.blob_store_options()).unwrap();
    let file = dir.path().join("s3up.yaml");
    std::fs::write(&file, serde_json::to_string_pretty(&json).unwrap()).unwrap();

    let out = weir(&["run", file.to_str().unwrap()], &[]);
    assert!(out.status.success(), "weir run failed: {}", text(&out));
    assert!(
        !dir.path().join("lake").exists(),
        "the sink fell back to a local folder"
    );

    // Where each table stands, from a copy of the metadata: the truth to
    // compare with is the generator's state at exactly those positions.
    let copy = tempfile::tempdir().unwrap();
    assert!(moto.download(BUCKET, "lake/", copy.path()) > 0);
    let lake = Lake {
        root: copy.path().to_path_buf(),
    };
    let want = upsert_state_at(SEED, CHANGES, &lake.committed_positions("s3up"));
    let keys = assert_tables_read_through_s3(&moto, BUCKET, "lake/", &want);

    // Done is done: a second run writes no object.
    let out = weir(&["run", file.to_str().unwrap()], &[]);
    assert!(
        out.status.success(),
        "the second run failed: {}",
        text(&out)
    );
    assert_eq!(
        moto.keys(BUCKET, "lake/"),
        keys,
        "the second run changed the lake"
    );
}
