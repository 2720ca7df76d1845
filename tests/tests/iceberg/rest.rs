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
use iceberg_support::Row;
use iceberg_support::*;
use weir_test_support::iceberg_rest::{IcebergRestServer, RestRows};
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
    rest_pipeline_of(name, CHANGES, catalog, warehouse, blob_root, extra)
}

/// [`rest_pipeline`] over the first `changes` changes.
fn rest_pipeline_of(
    name: &str,
    changes: u64,
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
        .fold(common::PipelineBuilder::generator(SEED, changes), |p, t| {
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

/// A temporary folder with the blob root `lake` in it, and the warehouse
/// URL readers reach that root at.
fn local_lake() -> (tempfile::TempDir, std::path::PathBuf, String) {
    let dir = tempfile::tempdir().unwrap();
    let lake = dir.path().join("lake");
    std::fs::create_dir_all(&lake).unwrap();
    let warehouse = format!("file://{}", lake.display());
    (dir, lake, warehouse)
}

/// Writes `pipeline` to `file` with its sink's blob store given `moto`'s
/// options (the builder has no key for blob-store options).
fn write_on_s3(
    pipeline: &common::PipelineBuilder,
    moto: &MotoServer,
    file: &std::path::Path,
) -> std::path::PathBuf {
    let mut json: serde_json::Value = serde_json::from_str(&pipeline.text()).unwrap();
    json["sinks"][0]["blob_store"]["options"] =
        serde_json::to_value(moto.blob_store_options()).unwrap();
    std::fs::write(file, serde_json::to_string_pretty(&json).unwrap()).unwrap();
    file.to_path_buf()
}

/// `lake.orders` -> (["lake"], "orders").
fn split(destination: &str) -> (Vec<&str>, &str) {
    let mut parts: Vec<&str> = destination.split('.').collect();
    let table = parts.pop().unwrap();
    (parts, table)
}

/// The position each source table's newest weir snapshot records, read
/// through the catalog with pyiceberg (none for a table not created yet or
/// not committed by `pipeline`).
fn committed_through(catalog: &IcebergRestServer, pipeline: &str) -> BTreeMap<String, Vec<u8>> {
    // One Python for every table: each start is a second of CPU.
    let wanted: Vec<(String, String)> = tables()
        .iter()
        .map(|t| (t.name.clone(), destination(&t.name)))
        .collect();
    let printed = catalog.pyiceberg(&format!(
        r#"
from pyiceberg.exceptions import NoSuchTableError
found = {{}}
for name, destination in {wanted}:
    try:
        t = catalog.load_table(destination)
        snapshot = t.current_snapshot()
    except NoSuchTableError:
        snapshot = None
    while snapshot is not None and name not in found:
        props = snapshot.summary.additional_properties if snapshot.summary else {{}}
        if props.get("weir.pipeline") == {pipeline:?} and props.get("weir.table") == name:
            found[name] = props["weir.position"]
        parent = snapshot.parent_snapshot_id
        snapshot = t.snapshot_by_id(parent) if parent is not None else None
print(json.dumps(found))
"#,
        wanted = serde_json::to_string(&wanted).unwrap(),
    ));
    let found: BTreeMap<String, String> =
        serde_json::from_str(printed.trim()).unwrap_or_else(|e| panic!("{e}: {printed}"));
    found
        .into_iter()
        .map(|(table, hex)| (table, hex::decode(hex).unwrap()))
        .collect()
}

/// Every table read through the catalog by both readers equals the
/// generator's state at its committed position, with no key twice.
fn assert_tables_exact(catalog: &IcebergRestServer, pipeline: &str) {
    assert_tables_exact_at(catalog, pipeline, CHANGES);
}

/// [`assert_tables_exact`] for a stream of `changes` changes.
fn assert_tables_exact_at(catalog: &IcebergRestServer, pipeline: &str, changes: u64) {
    let committed = committed_through(catalog, pipeline);
    for table in tables() {
        assert!(
            committed.contains_key(&table.name),
            "{}: nothing committed",
            table.name
        );
    }
    assert_committed_exact(catalog, pipeline, changes, &["pyiceberg", "duckdb"]);
}

/// Every table `pipeline` committed to is exact at its position in each of
/// `readers` (a table not created yet must have nothing to hold).
fn assert_committed_exact(
    catalog: &IcebergRestServer,
    pipeline: &str,
    changes: u64,
    readers: &[&str],
) {
    let committed = committed_through(catalog, pipeline);
    let want = upsert_state_at(SEED, changes, &committed);
    // Not created yet (a host killed early): nothing to hold.
    let (created, not_yet): (Vec<_>, Vec<_>) = tables()
        .into_iter()
        .partition(|t| committed.contains_key(&t.name));
    for table in not_yet {
        assert!(want[&table.name].is_empty(), "{}", table.name);
    }
    let destinations: Vec<String> = created.iter().map(|t| destination(&t.name)).collect();
    let names: Vec<(Vec<&str>, &str)> = destinations.iter().map(|d| split(d)).collect();
    let names: Vec<(&[&str], &str)> = names.iter().map(|(ns, n)| (ns.as_slice(), *n)).collect();
    // One Python per reader for every table.
    let read: Vec<(&str, Vec<RestRows>)> = readers
        .iter()
        .map(|&reader| (reader, catalog.rows_of_tables(reader, &names)))
        .collect();
    for (i, table) in created.iter().enumerate() {
        let destination = &destinations[i];
        let columns = column_names(table, &["change_pos"]);
        for (reader, by_table) in &read {
            let reader = *reader;
            let rows = by_table[i].clone();
            let read = Read {
                columns: rows.columns,
                rows: rows.rows,
            };
            let got = read.project(&columns);
            assert_eq!(
                duplicate_keys(table, &got),
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
    let (dir, lake, warehouse) = local_lake();
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
        assert!(
            pending["times"] == 0 && pending["drop_answer_after_commit"] == 0,
            "INCONCLUSIVE: not every planted fault met a commit: {pending}"
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
    let file = write_on_s3(&pipeline, &moto, &dir.path().join("rests3.yaml"));
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

/// Appends `rows` rows to `destination` with pyiceberg, as another writer
/// of the table would: keys `-start-1, -start-2, ...` (the generator's are
/// positive), every other column a fixed value of its type.
fn foreign_append(catalog: &IcebergRestServer, destination: &str, start: i64, rows: i64) {
    catalog.pyiceberg(&format!(
        r#"
import datetime, decimal
t = catalog.load_table({destination:?})
schema = t.schema().as_arrow()
def value(field, i):
    kind = field.type
    if field.name == "id":
        return -{start} - 1 - i
    if pa.types.is_integer(kind):
        return 0
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        return "foreign"
    if pa.types.is_boolean(kind):
        return False
    if pa.types.is_date(kind):
        return datetime.date(2000, 1, 1)
    if pa.types.is_timestamp(kind):
        return datetime.datetime(2000, 1, 1, tzinfo=datetime.timezone.utc if kind.tz else None)
    if pa.types.is_decimal(kind):
        return decimal.Decimal(0)
    if pa.types.is_binary(kind) or pa.types.is_large_binary(kind):
        return b""
    return None
arrays = [pa.array([value(f, i) for i in range({rows})], type=f.type) for f in schema]
rows = pa.Table.from_arrays(arrays, schema=schema)
# weir commits several times a second: past pyiceberg's own four retries,
# this writer keeps trying, as a persistent one would.
from pyiceberg.exceptions import CommitFailedException
for attempt in range(50):
    try:
        t.append(rows)
        break
    except CommitFailedException:
        t = catalog.load_table({destination:?})
else:
    raise SystemExit("the other writer never got its commit in")
"#
    ));
}

/// Another writer (pyiceberg) commits to a table while weir does, and a
/// zombie weir at an older epoch wakes after a newer host took over: weir
/// rebases over the other writer's snapshots and keeps its rows, the zombie
/// is refused, nothing is lost or doubled.
#[test]
fn weir_rebases_over_another_writer_and_a_zombie_at_an_older_epoch_is_refused() {
    let (dir, lake, warehouse) = local_lake();
    let catalog = IcebergRestServer::builder().warehouse(&warehouse).start();
    let (seed, changes) = (SEED, CHANGES);
    let host = |state_dir: &str, pace_us: u64| {
        rest_pipeline(
            "restzombie",
            &catalog,
            &warehouse,
            BlobRoot::Folder(lake.clone()),
            &[],
        )
        .pace_us(pace_us)
        .state_dir(state_dir)
    };
    // Host A (epoch 1) commits a little and freezes, not knowing it lost
    // its place (a long pause, a partition).
    let a = host("state-a", 2_000).write_in(dir.path());
    let mut zombie = common::weir_command()
        .args(["run", a.to_str().unwrap()])
        .env("WEIR_LOG", "error")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let started = std::time::Instant::now();
    while committed_through_any(&catalog).is_none() {
        assert!(
            started.elapsed() < std::time::Duration::from_secs(60),
            "INCONCLUSIVE: host A committed nothing within a minute"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    // SAFETY: signalling our own child process.
    unsafe { libc::kill(zombie.id() as i32, libc::SIGSTOP) };

    // Host B (its own store, so epoch 2 from the tables) drains the stream,
    // paced, while another writer appends to the customers table.
    let b_dir = dir.path().join("b");
    std::fs::create_dir_all(&b_dir).unwrap();
    let b = host("state-b", 3_000).write_in(&b_dir);
    let b_run = common::weir_command()
        .args(["run", b.to_str().unwrap(), "--json"])
        .env("WEIR_LOG", "info")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let customers = destination("shop.customers");
    let mut appended = 0;
    // While B runs (about six seconds at this pace): each append is a
    // Python start and a commit, about a second.
    for round in 0..4 {
        foreign_append(&catalog, &customers, round * 3, 3);
        appended += 3;
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let b_out = b_run.wait_with_output().unwrap();
    let b_said = String::from_utf8_lossy(&b_out.stderr).into_owned();
    assert!(b_out.status.success(), "host B failed: {b_said}");
    let report: serde_json::Value = serde_json::from_slice(&b_out.stdout).unwrap();
    assert_eq!(report["epoch"], 2, "host B did not take over: {report}");
    if !b_said.contains("another writer committed Iceberg table")
        && !b_said.contains("took a new snapshot during the commit")
    {
        panic!(
            "INCONCLUSIVE: host B never met the other writer's commits (it finished before \
             them?): {b_said}"
        );
    }

    // The zombie wakes and tries to go on: refused.
    let before = catalog.commits().ok();
    let (status, message) = wake_and_wait(&mut zombie);
    assert!(!status.success(), "the zombie was not refused: {message}");
    assert!(
        message.contains("fenced") || message.contains("epoch"),
        "the zombie's failure does not say it was fenced: {message}"
    );
    if let Some(before) = before {
        assert_eq!(
            catalog.commits().unwrap(),
            before,
            "the zombie committed to the catalog"
        );
    }

    // Every table exact at the end of the stream, the other writer's rows
    // all kept, once each.
    let committed = committed_through(&catalog, "restzombie");
    let want = upsert_state_at(seed, changes, &committed);
    let tables = tables();
    let destinations: Vec<String> = tables.iter().map(|t| destination(&t.name)).collect();
    let read_by = |reader: &str| {
        let names: Vec<(Vec<&str>, &str)> = destinations.iter().map(|d| split(d)).collect();
        let names: Vec<(&[&str], &str)> = names.iter().map(|(ns, n)| (ns.as_slice(), *n)).collect();
        catalog.rows_of_tables(reader, &names)
    };
    let (by_pyiceberg, by_duckdb) = (read_by("pyiceberg"), read_by("duckdb"));
    for (i, table) in tables.iter().enumerate() {
        let destination = &destinations[i];
        let columns = column_names(table, &["change_pos"]);
        for (reader, rows) in [
            ("pyiceberg", by_pyiceberg[i].clone()),
            ("duckdb", by_duckdb[i].clone()),
        ] {
            let read = Read {
                columns: rows.columns,
                rows: rows.rows,
            };
            let (foreign, ours): (Vec<Row>, Vec<Row>) = read
                .project(&columns)
                .into_iter()
                .partition(|row| row[0].as_deref().is_some_and(|id| id.starts_with('-')));
            if *destination == customers {
                let mut ids: Vec<&str> = foreign.iter().filter_map(|r| r[0].as_deref()).collect();
                ids.sort();
                ids.dedup();
                assert_eq!(
                    (foreign.len(), ids.len()),
                    (appended as usize, appended as usize),
                    "{reader}: the other writer's rows in {destination}"
                );
            } else {
                assert!(foreign.is_empty(), "{reader}: {foreign:?}");
            }
            assert_eq!(duplicate_keys(table, &ours), 0, "{reader}: {destination}");
            assert_rows(
                &format!("{reader} after the zombie, {}", table.name),
                &want[&table.name],
                &ours,
            );
        }
    }
}

/// Whether any table has a snapshot yet (host A's first commit).
fn committed_through_any(catalog: &IcebergRestServer) -> Option<()> {
    let printed = catalog.pyiceberg(&format!(
        r#"
found = False
for name in {names:?}:
    try:
        t = catalog.load_table(name)
    except Exception:
        continue
    if t.current_snapshot() is not None:
        found = True
print(json.dumps(found))
"#,
        names = tables()
            .iter()
            .map(|t| destination(&t.name))
            .collect::<Vec<_>>()
    ));
    (printed.trim() == "true").then_some(())
}

/// Each table's current `total-data-files` and `total-delete-files`, and
/// how many snapshots it keeps, through the catalog (one Python for all).
fn files_and_snapshots(catalog: &IcebergRestServer) -> BTreeMap<String, (u64, u64, usize)> {
    let names: Vec<String> = tables().iter().map(|t| destination(&t.name)).collect();
    let printed = catalog.pyiceberg(&format!(
        r#"
seen = {{}}
for name in {names}:
    t = catalog.load_table(name)
    summary = t.current_snapshot().summary
    seen[name] = [int(summary["total-data-files"]), int(summary["total-delete-files"]), len(t.metadata.snapshots)]
print(json.dumps(seen))
"#,
        names = serde_json::to_string(&names).unwrap()
    ));
    serde_json::from_str(printed.trim()).unwrap_or_else(|e| panic!("{e}: {printed}"))
}

/// Compaction and snapshot expiry (`weir maintain`) commit through the
/// REST catalog as through files: one data file and one snapshot left,
/// no position moved, every reader equal to the stream after it, and the
/// pipeline goes on over the compacted tables.
#[test]
fn maintenance_through_a_rest_catalog_compacts_and_expires_and_readers_agree() {
    const SMALL: u64 = 600;
    // The data on S3: compaction writes there, and expiry deletes there.
    let moto = MotoServer::start();
    moto.create_bucket("weir-rest-maintenance");
    let warehouse = "s3://weir-rest-maintenance/lake";
    let catalog = IcebergRestServer::builder()
        .token("weir-static-token")
        .s3(&moto, warehouse)
        .start();
    let dir = tempfile::tempdir().unwrap();
    let write = |changes: u64, file: &str, policy: &[(&str, &str)]| {
        let pipeline = rest_pipeline_of(
            "restmt",
            changes,
            &catalog,
            warehouse,
            BlobRoot::Url(warehouse.to_string()),
            policy,
        )
        .max_rows(25);
        write_on_s3(&pipeline, &moto, &dir.path().join(file))
    };
    let no_maintenance = [
        ("compact_min_files", "0"),
        ("expire_snapshots_older_than", "never"),
    ];
    let run = write(SMALL, "run.yaml", &no_maintenance);
    let out = weir(&["run", run.to_str().unwrap()], &[]);
    assert!(out.status.success(), "weir run failed: {}", text(&out));
    let before = committed_through(&catalog, "restmt");
    for (table, (files, _, _)) in files_and_snapshots(&catalog) {
        assert!(files > 5, "{table}: only {files} data files");
    }

    let maintain = write(
        SMALL,
        "maintain.yaml",
        &[
            ("expire_snapshots_older_than", "0s"),
            ("keep_snapshots", "1"),
        ],
    );
    let out = weir(&["maintain", maintain.to_str().unwrap()], &[]);
    assert!(out.status.success(), "weir maintain failed: {}", text(&out));
    let report = String::from_utf8_lossy(&out.stdout);
    assert!(
        report.contains("compacted") && report.contains("expired"),
        "{report}"
    );
    assert_eq!(
        committed_through(&catalog, "restmt"),
        before,
        "maintenance moved a position"
    );
    let after = files_and_snapshots(&catalog);
    assert_eq!(after.len(), tables().len(), "{after:?}");
    for (table, counts) in after {
        assert_eq!(counts, (1, 0, 1), "{table}");
    }
    // Expiry deleted what no snapshot left references from the bucket.
    let parquet: Vec<String> = moto
        .keys("weir-rest-maintenance", "lake/")
        .into_keys()
        .filter(|k| k.ends_with(".parquet"))
        .collect();
    assert_eq!(parquet.len(), tables().len(), "{parquet:?}");
    assert_tables_exact_at(&catalog, "restmt", SMALL);

    let more = write(SMALL + 300, "run.yaml", &no_maintenance);
    let out = weir(&["run", more.to_str().unwrap()], &[]);
    assert!(out.status.success(), "weir run failed: {}", text(&out));
    assert_tables_exact_at(&catalog, "restmt", SMALL + 300);
}

/// Waits up to a minute for the catalog to say `holding` is `want`.
fn wait_for_holding(catalog: &IcebergRestServer, want: u64, what: &str) {
    let started = std::time::Instant::now();
    loop {
        let faults = catalog.inject(serde_json::json!({})).unwrap();
        if faults["holding"] == want {
            return;
        }
        assert!(
            started.elapsed() < std::time::Duration::from_secs(60),
            "INCONCLUSIVE: {what} did not happen within a minute: {faults}"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// SIGKILLs of `weir run` around the catalog's answer: while a commit the
/// catalog applied waits for its answer (the host dies not knowing it
/// landed), and while a commit waits before the catalog applies it (it
/// lands after its host died: once before the next host starts, once
/// while it runs). After each, every table is exact; nothing is twice.
#[test]
fn sigkills_around_the_catalogs_answer_leave_every_table_exact() {
    let (dir, lake, warehouse) = local_lake();
    let catalog = IcebergRestServer::builder().warehouse(&warehouse).start();
    if catalog.is_external() {
        return;
    }
    let pipeline = rest_pipeline(
        "restkill",
        &catalog,
        &warehouse,
        BlobRoot::Folder(lake),
        &[],
    )
    .pace_us(2_000)
    .write_in(dir.path());
    let start = || {
        common::weir_command()
            .args(["run", pipeline.to_str().unwrap()])
            .env("WEIR_LOG", "error")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap()
    };
    let kill = |mut child: std::process::Child| {
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
    };
    // Only the generator's state at the committed positions, whole and
    // once, is acceptable after any of these (pyiceberg after each kill,
    // DuckDB too at the end).
    let exact = |label: &str| {
        println!("{label}");
        assert_committed_exact(&catalog, "restkill", CHANGES, &["pyiceberg"]);
    };

    // A run killed while the catalog holds one of its commits (`fault`).
    let killed_holding = |fault: &str, ms: u64| {
        catalog.inject(serde_json::json!({ fault: ms })).unwrap();
        let run = start();
        wait_for_holding(&catalog, 1, &format!("a commit held ({fault})"));
        kill(run);
    };

    // 1. Applied, answer held, host killed: it never learns it landed.
    killed_holding("hold_answer_after_commit_ms", 1_500);
    wait_for_holding(&catalog, 0, "the held answer going out");
    exact("after a kill while the catalog held the answer of an applied commit");

    // 2. Held before it applies, host killed; it lands after the host died
    // and before the next one starts.
    killed_holding("hold_before_commit_ms", 1_000);
    wait_for_holding(&catalog, 0, "the held commit applying");
    exact("after a commit landed once its host was dead");

    // 3. The same, with the next host already running when it lands: that
    // host either finds its batch in the table or stops, naming the commit
    // it did not expect, rather than write anything twice.
    killed_holding("hold_before_commit_ms", 1_000);
    let next = start();
    wait_for_holding(&catalog, 0, "the held commit applying");
    let out = next.wait_with_output().unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() || said.contains("after this host read it"),
        "the host running while a dead host's commit landed failed otherwise: {said}"
    );
    println!(
        "the host running while a dead host's commit landed {}",
        if out.status.success() {
            "finished"
        } else {
            "stopped, naming the commit it did not expect"
        }
    );
    exact("after a dead host's commit landed under a running one");

    // And the stream ends exact.
    let out = weir(&["run", pipeline.to_str().unwrap()], &[]);
    assert!(out.status.success(), "the final run failed: {}", text(&out));
    assert_tables_exact(&catalog, "restkill");
    let committed = committed_through(&catalog, "restkill");
    let end = upsert_state_at(SEED, CHANGES, &committed);
    let whole = common::expected_state(SEED, CHANGES);
    for table in tables() {
        assert_eq!(
            end[&table.name].len(),
            whole.tables[&table.name].len(),
            "{} is not at the end of the stream",
            table.name
        );
    }
}

/// Partition specs through the catalog, with the data on S3: the spec the
/// sink's config gives a new table is the one the catalog holds (by column
/// name: the catalog may number the fields anew), every data file carries
/// a partition value, the rows read back exact, and with compaction at
/// commit boundaries the snapshots still added position deletes along the
/// way.
#[test]
fn partitioned_tables_through_a_rest_catalog_keep_their_spec_and_rows() {
    const FEW: u64 = 800;
    let moto = MotoServer::start();
    moto.create_bucket("weir-rest-parts");
    let warehouse = "s3://weir-rest-parts/lake";
    let catalog = IcebergRestServer::builder()
        .token("weir-static-token")
        .s3(&moto, warehouse)
        .start();
    let dir = tempfile::tempdir().unwrap();
    let pipeline = rest_pipeline_of(
        "restpart",
        FEW,
        &catalog,
        warehouse,
        BlobRoot::Url(warehouse.to_string()),
        &[
            ("partition.lake.orders", "bucket(4, id)"),
            ("partition.lake.customers", "bucket(2, id)"),
            (
                "partition.lake.order_items",
                "bucket(3, order_id), identity(line)",
            ),
            ("compact_min_files", "4"),
        ],
    );
    let file = write_on_s3(&pipeline, &moto, &dir.path().join("restpart.yaml"));
    let out = weir(&["run", file.to_str().unwrap()], &[]);
    assert!(out.status.success(), "weir run failed: {}", text(&out));
    assert!(
        !moto.keys("weir-rest-parts", "lake/").is_empty(),
        "nothing was written to the bucket"
    );
    let mut position_deletes = 0;
    for (table, fields, most) in [
        ("lake.orders", serde_json::json!([["id", "bucket[4]"]]), 4),
        (
            "lake.customers",
            serde_json::json!([["id", "bucket[2]"]]),
            2,
        ),
        (
            "lake.order_items",
            serde_json::json!([["order_id", "bucket[3]"], ["line", "identity"]]),
            usize::MAX,
        ),
    ] {
        let printed = catalog.pyiceberg(&format!(
            r#"
t = catalog.load_table({table:?})
spec = t.spec()
fields = [[t.schema().find_field(f.source_id).name, str(f.transform)] for f in spec.fields]
partitions = sorted({{str(task.file.partition) for task in t.scan().plan_files()}})
deletes = sum(int(s.summary.additional_properties.get("added-position-deletes") or 0) for s in t.snapshots() if s.summary)
print(json.dumps({{"fields": fields, "partitions": partitions, "deletes": deletes}}))
"#
        ));
        let seen: serde_json::Value = serde_json::from_str(printed.trim()).unwrap();
        assert_eq!(seen["fields"], fields, "{table}: {seen}");
        let partitions = seen["partitions"].as_array().unwrap().len();
        assert!(
            (2..=most).contains(&partitions),
            "{table}: files in {partitions} partitions: {seen}"
        );
        position_deletes += seen["deletes"].as_u64().unwrap();
    }
    assert!(position_deletes > 0, "no position delete was written");
    assert_tables_exact_at(&catalog, "restpart", FEW);
}

/// A sink on a REST catalog whose entry does not grant the catalog's host:
/// the plugin loads (its network use is optional), and the first request
/// stops the run with a message naming the grant to add.
#[test]
fn a_rest_catalog_without_its_grant_is_refused_naming_the_grant() {
    let (dir, lake, warehouse) = local_lake();
    let catalog = IcebergRestServer::builder().warehouse(&warehouse).start();
    let pipeline = rest_pipeline_of(
        "restnogrant",
        200,
        &catalog,
        &warehouse,
        BlobRoot::Folder(lake),
        &[],
    );
    let mut json: serde_json::Value = serde_json::from_str(&pipeline.text()).unwrap();
    json["sinks"][0]
        .as_object_mut()
        .unwrap()
        .remove("grants")
        .expect("the builder granted the catalog");
    let file = dir.path().join("restnogrant.yaml");
    std::fs::write(&file, serde_json::to_string_pretty(&json).unwrap()).unwrap();
    let out = weir(&["run", file.to_str().unwrap()], &[]);
    let said = text(&out);
    assert!(!out.status.success(), "the run succeeded: {said}");
    assert!(
        said.contains("may not reach the Iceberg REST catalog") && said.contains("grants.http"),
        "the refusal does not name the grant: {said}"
    );
}
