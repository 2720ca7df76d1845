//! The Iceberg sink on an Iceberg REST catalog: the test catalog of
//! tests/support/iceberg_rest (pyiceberg's `SqlCatalog` behind the REST
//! routes), or any catalog `WEIR_ICEBERG_REST_URI` names. Tables are read
//! back through the catalog by pyiceberg's `RestCatalog` and by DuckDB's
//! iceberg extension attached to it, and compared with the generator's
//! state at the positions the tables' snapshots record.

use crate::common;
use crate::iceberg_support;

use std::collections::BTreeMap;

use common::{SinkBuilder, TableMode, tables, text, weir};
use iceberg_support::*;
use weir_test_support::iceberg_rest::IcebergRestServer;
use weir_test_support::moto::MotoServer;

const SEED: u64 = 23;
const CHANGES: u64 = 2_000;

/// The generator's tables in `mode`, into an Iceberg sink on `catalog`
/// whose data lives under `warehouse` (the blob store's URL); `extra`
/// config entries are added to the sink's.
fn rest_pipeline(
    name: &str,
    catalog: &IcebergRestServer,
    warehouse: &str,
    blob_root: BlobRoot,
    extra: &[(&str, &str)],
) -> common::PipelineBuilder {
    let mut sink = SinkBuilder::new("iceberg", common::plugin("weir-iceberg-sink"))
        .limits(1024, 120_000)
        .retries(3)
        .grant_http(catalog.uri())
        .config("warehouse", warehouse)
        .config("catalog", "rest")
        .config("catalog_uri", catalog.uri());
    sink = match blob_root {
        BlobRoot::Folder(root) => sink.blob_store(&root),
        BlobRoot::Url(url) => sink.blob_store_url(&url),
    };
    if let Some((id, secret)) = catalog.client_credentials() {
        sink = sink.config("catalog_credential", &format!("{id}:{secret}"));
    } else if let Some(token) = catalog.token() {
        sink = sink.config("catalog_token", token);
    }
    for (key, value) in extra {
        sink = sink.config(key, value);
    }
    tables()
        .iter()
        .fold(common::PipelineBuilder::generator(SEED, CHANGES), |p, t| {
            p.table(&t.name, TableMode::Upsert, &destination(&t.name))
        })
        .name(name)
        .sink(sink)
        .max_rows(200)
        .linger_ms(20)
        .metadata("pos", "change_pos")
        .state_dir("state")
}

enum BlobRoot {
    Folder(std::path::PathBuf),
    Url(String),
}

/// `lake.orders` -> (["lake"], "orders").
fn split(destination: &str) -> (Vec<&str>, &str) {
    let mut parts: Vec<&str> = destination.split('.').collect();
    let table = parts.pop().unwrap();
    (parts, table)
}

/// The position each source table's newest weir snapshot records, read
/// through the catalog with pyiceberg.
fn committed_through(catalog: &IcebergRestServer, pipeline: &str) -> BTreeMap<String, Vec<u8>> {
    let mut committed = BTreeMap::new();
    for table in tables() {
        let destination = destination(&table.name);
        let printed = catalog.pyiceberg(&format!(
            r#"
t = catalog.load_table({destination:?})
found = None
snapshot = t.current_snapshot()
while snapshot is not None and found is None:
    props = snapshot.summary.additional_properties if snapshot.summary else {{}}
    if props.get("weir.pipeline") == {pipeline:?} and props.get("weir.table") == {name:?}:
        found = props["weir.position"]
    parent = snapshot.parent_snapshot_id
    snapshot = t.snapshot_by_id(parent) if parent is not None else None
print(json.dumps(found))
"#,
            name = table.name,
        ));
        let found: Option<String> = serde_json::from_str(printed.trim())
            .unwrap_or_else(|e| panic!("{}: {e}: {printed}", table.name));
        let hex = found.unwrap_or_else(|| panic!("{}: nothing committed", table.name));
        committed.insert(table.name.clone(), hex::decode(hex).unwrap());
    }
    committed
}

/// Every table read through the catalog by both readers equals the
/// generator's state at its committed position, with no key twice.
fn assert_tables_exact(catalog: &IcebergRestServer, pipeline: &str) {
    let committed = committed_through(catalog, pipeline);
    let want = upsert_state_at(SEED, CHANGES, &committed);
    for table in tables() {
        let destination = destination(&table.name);
        let (namespace, name) = split(&destination);
        let columns = column_names(&table, &["change_pos"]);
        for (reader, rows) in [
            ("pyiceberg", catalog.rows_via_pyiceberg(&namespace, name)),
            ("duckdb", catalog.rows_via_duckdb(&namespace, name)),
        ] {
            let read = Read {
                columns: rows.columns,
                rows: rows.rows,
            };
            let got = read.project(&columns);
            assert_eq!(
                duplicate_keys(&table, &got),
                0,
                "{reader}: {destination} holds a key twice"
            );
            assert_rows(
                &format!("{reader} through the REST catalog, {}", table.name),
                &want[&table.name],
                &got,
            );
        }
        println!(
            "{}: {} rows, equal in pyiceberg and DuckDB through the REST catalog",
            table.name,
            want[&table.name].len()
        );
    }
}

/// A local warehouse, a catalog that wants OAuth2 client credentials and
/// a route prefix; commits answered 503 (not applied) and commits applied
/// whose answer is lost, during the run. Then a second run changes nothing.
#[test]
fn upsert_tables_through_a_rest_catalog_are_exact_across_lost_and_refused_answers() {
    let dir = tempfile::tempdir().unwrap();
    let lake = dir.path().join("lake");
    std::fs::create_dir_all(&lake).unwrap();
    let warehouse = format!("file://{}", lake.display());
    let catalog = IcebergRestServer::builder()
        .prefix("weirtest")
        .client_credentials("weir", "weir-secret")
        .warehouse(&warehouse)
        .start();
    let external = catalog.is_external();
    if !external {
        // Two commits refused before they apply, then two that apply and
        // whose answers never arrive: the sink must find the latter landed
        // and commit nothing twice.
        catalog
            .inject(serde_json::json!({"commit_status": 503, "times": 2}))
            .unwrap();
        catalog
            .inject(serde_json::json!({"drop_answer_after_commit": 2}))
            .unwrap();
    }
    let pipeline = rest_pipeline("restup", &catalog, &warehouse, BlobRoot::Folder(lake), &[]);
    let file = pipeline.write_in(dir.path());
    let out = weir(&["run", file.to_str().unwrap()], &[("WEIR_LOG", "info")]);
    assert!(
        out.status.success(),
        "weir run failed: {}\ncatalog log:\n{}",
        text(&out),
        catalog.log_text()
    );
    if !external {
        let pending = catalog
            .inject(serde_json::json!({}))
            .expect("the fault route answers");
        assert_eq!(
            pending,
            serde_json::json!({"commit_status": null, "times": 0, "drop_answer_after_commit": 0}),
            "INCONCLUSIVE: not every planted fault met a commit"
        );
        let said = text(&out);
        assert!(
            said.contains("the table shows it landed"),
            "no lost answer was resolved by reloading: {said}"
        );
    }
    assert_tables_exact(&catalog, "restup");

    // Done is done: a second run commits nothing.
    let before = catalog.commits().ok();
    let out = weir(&["run", file.to_str().unwrap()], &[]);
    assert!(
        out.status.success(),
        "the second run failed: {}",
        text(&out)
    );
    if let Some(before) = before {
        assert_eq!(
            catalog.commits().unwrap(),
            before,
            "the second run committed"
        );
    }
    assert_tables_exact(&catalog, "restup");
}

/// Data on S3 (moto), the catalog's FileIO on the same bucket; DuckDB and
/// pyiceberg read the data files through S3 themselves.
#[test]
fn upsert_tables_through_a_rest_catalog_with_data_on_s3_are_exact() {
    let moto = MotoServer::start();
    moto.create_bucket("weir-rest-lake");
    let warehouse = "s3://weir-rest-lake/lake";
    let catalog = IcebergRestServer::builder()
        .token("weir-static-token")
        .s3(&moto, warehouse)
        .start();
    let dir = tempfile::tempdir().unwrap();
    let pipeline = rest_pipeline(
        "rests3",
        &catalog,
        warehouse,
        BlobRoot::Url(warehouse.to_string()),
        &[],
    );
    // The builder has no key for blob-store options: add them to the JSON.
    let mut json: serde_json::Value = serde_json::from_str(&pipeline.text()).unwrap();
    json["sinks"][0]["blob_store"]["options"] =
        serde_json::to_value(moto.blob_store_options()).unwrap();
    let file = dir.path().join("rests3.yaml");
    std::fs::write(&file, serde_json::to_string_pretty(&json).unwrap()).unwrap();
    let out = weir(&["run", file.to_str().unwrap()], &[]);
    assert!(
        out.status.success(),
        "weir run failed: {}\ncatalog log:\n{}",
        text(&out),
        catalog.log_text()
    );
    assert!(
        !moto.keys("weir-rest-lake", "lake/").is_empty(),
        "nothing was written to the bucket"
    );
    assert_tables_exact(&catalog, "rests3");
}

/// A catalog that keeps tables outside the sink's blob store: refused at
/// the first table, naming both places, and nothing left in the catalog.
#[test]
fn a_table_the_catalog_keeps_outside_the_blob_store_is_refused_naming_both() {
    let dir = tempfile::tempdir().unwrap();
    let lake = dir.path().join("lake");
    let elsewhere = dir.path().join("elsewhere");
    std::fs::create_dir_all(&lake).unwrap();
    std::fs::create_dir_all(&elsewhere).unwrap();
    let catalog = IcebergRestServer::builder()
        .warehouse(&format!("file://{}", elsewhere.display()))
        .start();
    if catalog.is_external() {
        return;
    }
    let warehouse = format!("file://{}", lake.display());
    let pipeline = rest_pipeline("restout", &catalog, &warehouse, BlobRoot::Folder(lake), &[]);
    let file = pipeline.write_in(dir.path());
    let out = weir(&["run", file.to_str().unwrap()], &[]);
    let said = text(&out);
    assert!(!out.status.success(), "the run succeeded: {said}");
    assert!(
        said.contains("outside this sink's blob store")
            && said.contains(&elsewhere.display().to_string())
            && said.contains(&warehouse),
        "the error does not name both places: {said}"
    );
    let listed =
        catalog.pyiceberg("print(json.dumps([list(t) for t in catalog.list_tables('lake')]))");
    assert_eq!(listed.trim(), "[]", "a refused table stayed in the catalog");
}
