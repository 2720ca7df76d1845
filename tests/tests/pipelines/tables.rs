//! `weir tables` against what a sink received: a generator pipeline with a
//! metadata column and a renamed, append-mode table runs into the Parquet
//! sink, which keeps every column of every batch as it got it. Each table's
//! files must have exactly the columns `weir tables --json` lists, in its
//! order and with its Arrow types, and a column it calls not null must hold
//! no null outside delete rows (a key none at all).

use crate::common;

use arrow_array::Array;
use arrow_array::cast::AsArray;
use common::*;
use serde_json::Value;
use weir_sdk::OP_COLUMN;

#[test]
fn weir_tables_lists_the_columns_types_and_nulls_the_sink_received() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("lake");
    let pipeline = PipelineBuilder::generator(5, 2_000)
        .metadata("commit_ts", "committed_at")
        .table("shop.orders", TableMode::Append, "orders_log")
        .sink(SinkBuilder::new("lake", plugin("weir-parquet-sink")).blob_store(&root))
        .write_in(dir.path());

    let out = weir(&["tables", pipeline.to_str().unwrap(), "--json"], &[]);
    assert!(out.status.success(), "weir tables failed: {}", text(&out));
    let tables: Value = serde_json::from_slice(&out.stdout).expect("weir tables --json is JSON");
    let tables = tables.as_array().expect("a list of tables");
    assert_eq!(
        tables.len(),
        3,
        "the generator has three tables: {tables:?}"
    );

    let out = weir(&["run", pipeline.to_str().unwrap()], &[]);
    assert!(out.status.success(), "the run failed: {}", text(&out));

    for table in tables {
        let name = table["table"].as_str().unwrap();
        let destination = table["destination"].as_str().unwrap();
        let expected_mode = if name == "shop.orders" {
            "append"
        } else {
            "upsert"
        };
        assert_eq!(table["mode"], expected_mode, "{name}");
        let listed: Vec<(String, String)> = table["columns"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| {
                (
                    c["name"].as_str().unwrap().to_string(),
                    c["arrow_type"].as_str().unwrap().to_string(),
                )
            })
            .collect();

        let batches = read_parquet(&root, destination);
        assert!(
            !batches.is_empty(),
            "{name}: nothing written to {destination}"
        );
        for batch in &batches {
            let received: Vec<(String, String)> = batch
                .schema()
                .fields()
                .iter()
                .map(|f| (f.name().clone(), f.data_type().to_string()))
                .collect();
            assert_eq!(
                listed, received,
                "{name}: `weir tables` and the sink's batch disagree"
            );
            let ops = batch
                .column_by_name(OP_COLUMN)
                .expect("the op column")
                .as_string::<i32>();
            for column in table["columns"].as_array().unwrap() {
                let role = column["role"].as_str().unwrap();
                if !matches!(role, "key" | "column") || column["nullable"] == true {
                    continue;
                }
                let column_name = column["name"].as_str().unwrap();
                let values = batch.column_by_name(column_name).unwrap();
                for row in 0..batch.num_rows() {
                    // A delete row carries its key and nulls elsewhere.
                    let may_be_null = role == "column" && ops.value(row) == "delete";
                    assert!(
                        may_be_null || !values.is_null(row),
                        "{name}.{column_name}: null in a {} row, but `weir tables` says not null",
                        ops.value(row)
                    );
                }
            }
        }
    }
}
