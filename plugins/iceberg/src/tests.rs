//! The sink run natively through `weir_sdk::native`, its tables read back by
//! the `iceberg` crate's own scan (with its local file system, not our
//! storage).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::Int64Type;
use arrow_array::{Array, ArrayRef, Int32Array, Int64Array, StringArray};
use futures::TryStreamExt;
use iceberg::TableIdent;
use iceberg::io::FileIO;
use iceberg::table::StaticTable;
use weir_sdk::native::{NativeSink, encode_ipc};
use weir_sdk::{BatchMeta, CommitRequest, Committed, Mode, Op, RecordBatch, SinkError, Table};
use weir_test_support::BatchBuilder;

use super::*;

const T: &str = "shop.orders";

pub(crate) fn root(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("weir-iceberg-test-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn sink(dir: &Path) -> NativeSink<IcebergSink> {
    sink_with(dir, &[])
}

/// A sink with extra configuration entries.
fn sink_with(dir: &Path, config: &[(&str, &str)]) -> NativeSink<IcebergSink> {
    let mut sink = NativeSink::new(IcebergSink::default(), dir);
    let mut entries = vec![("warehouse".to_string(), format!("file://{}", dir.display()))];
    entries.extend(config.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    sink.open("p1", &entries).unwrap();
    sink
}

fn table(mode: Mode) -> Table {
    Table {
        name: T.into(),
        key_columns: vec!["id".into()],
        mode,
        destination: "sales.orders".into(),
        metadata: Vec::new(),
    }
}

/// Rows `(id, op, name)`; positions from `first_pos`.
fn rows(changes: &[(i64, &str, Option<&str>)], first_pos: u8) -> RecordBatch {
    BatchBuilder::new()
        .int64("id", changes.iter().map(|c| c.0))
        .utf8("name", changes.iter().map(|c| c.2))
        .changes(
            changes
                .iter()
                .map(|c| Op::parse(c.1).expect("an operation")),
            (first_pos..).take(changes.len()).map(|p| [p]),
        )
        .build()
}

fn write(sink: &mut NativeSink<IcebergSink>, t: &Table, rb: &RecordBatch) -> Result<()> {
    // One id per position range, as the host makes them: the sink keeps
    // one copy of a batch written twice.
    let positions = rb
        .column_by_name("__pos")
        .and_then(|c| c.as_any().downcast_ref::<arrow_array::BinaryArray>())
        .expect("a __pos column");
    let id = match positions.len() {
        0 => "b-empty".to_string(),
        n => format!(
            "b-{}-{}",
            hex::encode(positions.value(0)),
            hex::encode(positions.value(n - 1))
        ),
    };
    // As the host cuts them: the batch starts at its first change.
    let low = match positions.len() {
        0 => vec![0],
        _ => positions.value(0).to_vec(),
    };
    let meta = BatchMeta {
        table: t.clone(),
        id,
        low,
        high: vec![1],
        rows: rb.num_rows() as u32,
    };
    sink.write(meta, &encode_ipc(rb))
}

fn request(high: u8, epoch: u64) -> CommitRequest {
    CommitRequest {
        table: T.into(),
        high: vec![high],
        pipeline: "p1".into(),
        epoch,
    }
}

fn newest_metadata(dir: &Path) -> PathBuf {
    let meta = dir.join("sales/orders/metadata");
    let hint = std::fs::read_to_string(meta.join("version-hint.text")).unwrap();
    meta.join(format!("v{}.metadata.json", hint.trim()))
}

/// Every row of the table whose metadata file is at `location`, as the
/// crate's own scan (with its local file system, not our storage) reads it.
pub(crate) fn scan_metadata(location: &str) -> Vec<RecordBatch> {
    // One thread: the iceberg crate's equality-delete loader can miss a
    // wake-up on a multi-thread runtime and hang the scan.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let table = StaticTable::from_metadata_file(
            location,
            TableIdent::from_strs(["sales", "orders"]).unwrap(),
            FileIO::new_with_fs(),
        )
        .await
        .unwrap();
        table
            .scan()
            .build()
            .unwrap()
            .to_arrow()
            .await
            .unwrap()
            .try_collect()
            .await
            .unwrap()
    })
}

/// The `name` column of a batch the crate's scan read, as text.
pub(crate) fn names_of(batch: &RecordBatch) -> Vec<Option<String>> {
    let names = arrow_cast::cast(
        batch.column_by_name("name").unwrap(),
        &arrow_schema::DataType::Utf8,
    )
    .unwrap();
    names
        .as_string::<i32>()
        .iter()
        .map(|name| name.map(str::to_string))
        .collect()
}

/// The table as the crate's scan sees it: id -> name.
fn scan(dir: &Path) -> BTreeMap<i64, Option<String>> {
    let batches = scan_metadata(&format!("file://{}", newest_metadata(dir).display()));
    let mut out = BTreeMap::new();
    for b in batches {
        let ids = b.column_by_name("id").unwrap().as_primitive::<Int64Type>();
        for (id, name) in ids.values().iter().zip(names_of(&b)) {
            assert!(out.insert(*id, name).is_none(), "duplicate key {id}");
        }
    }
    out
}

fn expect(pairs: &[(i64, &str)]) -> BTreeMap<i64, Option<String>> {
    pairs
        .iter()
        .map(|(k, v)| (*k, Some(v.to_string())))
        .collect()
}

/// The snapshot summary of the table's current snapshot.
fn current_summary(dir: &Path) -> serde_json::Value {
    let metadata: serde_json::Value =
        serde_json::from_slice(&std::fs::read(newest_metadata(dir)).unwrap()).unwrap();
    let current = metadata["current-snapshot-id"].as_i64().unwrap();
    metadata["snapshots"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["snapshot-id"].as_i64() == Some(current))
        .unwrap()["summary"]
        .clone()
}

/// Writes the three commits of the upsert tests and checks the rows.
fn three_upsert_commits(dir: &Path, s: &mut NativeSink<IcebergSink>) {
    let t = table(Mode::Upsert);
    assert_eq!(s.committed("p1", T).unwrap(), None);
    write(
        s,
        &t,
        &rows(
            &[
                (1, "insert", Some("a")),
                (2, "insert", Some("b")),
                (3, "insert", Some("c")),
            ],
            1,
        ),
    )
    .unwrap();
    s.commit(request(3, 1)).unwrap();
    assert_eq!(scan(dir), expect(&[(1, "a"), (2, "b"), (3, "c")]));

    // Two batches in one commit: the later change to a key wins; deleting a
    // missing key is fine.
    write(
        s,
        &t,
        &rows(&[(1, "update", Some("a2")), (2, "delete", None)], 4),
    )
    .unwrap();
    write(
        s,
        &t,
        &rows(
            &[
                (1, "update", Some("a3")),
                (9, "delete", None),
                (4, "insert", Some("d")),
            ],
            6,
        ),
    )
    .unwrap();
    s.commit(request(8, 1)).unwrap();
    assert_eq!(scan(dir), expect(&[(1, "a3"), (3, "c"), (4, "d")]));

    // A deleted key comes back.
    write(s, &t, &rows(&[(2, "insert", Some("b2"))], 9)).unwrap();
    s.commit(request(9, 1)).unwrap();
    assert_eq!(
        scan(dir),
        expect(&[(1, "a3"), (2, "b2"), (3, "c"), (4, "d")])
    );
}

#[test]
fn upsert_applies_updates_and_deletes_through_position_deletes() {
    let dir = root("upsert");
    let mut s = sink(&dir);
    three_upsert_commits(&dir, &mut s);
    // 3 + 2 + 1 data rows; keys 1 and 2 had rows to delete (9 is unknown,
    // 4 is new, and 2 was gone when it came back): no equality deletes.
    let summary = current_summary(&dir);
    assert_eq!(summary["total-records"], "6");
    assert_eq!(summary["total-position-deletes"], "2");
    assert_eq!(summary["total-equality-deletes"], "0");
    assert_eq!(summary["total-data-files"], "3");
    assert_eq!(summary["total-delete-files"], "1");
    assert_index_matches_table(&mut s, &dir);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn upsert_applies_updates_and_deletes_through_equality_deletes() {
    let dir = root("upsert-eq");
    let mut s = sink_with(&dir, &[("delete_mode", "equality")]);
    three_upsert_commits(&dir, &mut s);
    assert!(s.sink().key_indexes.is_empty());
    // committed() from a fresh instance (a restarted host).
    let mut fresh = sink(&dir);
    assert_eq!(
        fresh.committed("p1", T).unwrap(),
        Some(Committed {
            position: vec![9],
            epoch: 1
        })
    );
    assert_eq!(fresh.committed("other", T).unwrap(), None);

    // The summary totals add up: 3 + 2 + 1 data rows; every changed key
    // is deleted first: 3 + 4 + 1.
    let metadata: serde_json::Value =
        serde_json::from_slice(&std::fs::read(newest_metadata(&dir)).unwrap()).unwrap();
    let summary = current_summary(&dir);
    assert_eq!(summary["total-records"], "6");
    assert_eq!(summary["total-equality-deletes"], "8");
    assert_eq!(summary["total-data-files"], "3");
    assert_eq!(summary["total-delete-files"], "3");
    assert_eq!(summary[POSITION_KEY], "09");
    assert_eq!(summary[EPOCH_KEY], "1");
    assert_eq!(summary[PIPELINE_KEY], "p1");
    assert_eq!(metadata["format-version"], 2);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn append_keeps_every_change_and_empty_commits_advance() {
    let dir = root("append");
    let mut s = sink(&dir);
    let t = table(Mode::Append);
    write(
        &mut s,
        &t,
        &rows(&[(1, "insert", Some("a")), (1, "update", Some("b"))], 1),
    )
    .unwrap();
    s.commit(request(2, 1)).unwrap();
    write(&mut s, &t, &rows(&[(1, "delete", None)], 3)).unwrap();
    s.commit(request(3, 1)).unwrap();
    // An empty batch still moves the position.
    write(&mut s, &t, &rows(&[], 4)).unwrap();
    s.commit(request(7, 1)).unwrap();
    assert_eq!(
        sink(&dir).committed("p1", T).unwrap().unwrap().position,
        vec![7]
    );
    // Three rows for key 1 (the scan helper refuses duplicate keys, so count
    // the files' rows through the summary).
    let metadata: serde_json::Value =
        serde_json::from_slice(&std::fs::read(newest_metadata(&dir)).unwrap()).unwrap();
    let snapshots = metadata["snapshots"].as_array().unwrap();
    assert_eq!(snapshots.len(), 3);
    let last = snapshots
        .iter()
        .find(|s| s["snapshot-id"] == metadata["current-snapshot-id"])
        .unwrap();
    assert_eq!(last["summary"]["total-records"], "3");
    assert_eq!(last["summary"]["total-delete-files"], "0");
    // The same position again with nothing staged adds no snapshot.
    write(&mut s, &t, &rows(&[], 8)).unwrap();
    s.commit(request(7, 1)).unwrap();
    let again: serde_json::Value =
        serde_json::from_slice(&std::fs::read(newest_metadata(&dir)).unwrap()).unwrap();
    assert_eq!(again["snapshots"].as_array().unwrap().len(), 3);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn an_older_epoch_is_fenced_and_writes_nothing_visible() {
    let dir = root("fence");
    let t = table(Mode::Upsert);
    let mut zombie = sink(&dir);
    write(&mut zombie, &t, &rows(&[(1, "insert", Some("a"))], 1)).unwrap();
    zombie.commit(request(1, 1)).unwrap();

    let mut newer = sink(&dir);
    assert_eq!(newer.committed("p1", T).unwrap().unwrap().epoch, 1);
    write(&mut newer, &t, &rows(&[(2, "insert", Some("b"))], 2)).unwrap();
    newer.commit(request(2, 2)).unwrap();

    // The zombie's view is stale: it loses the race, reloads, sees epoch 2.
    write(&mut zombie, &t, &rows(&[(3, "insert", Some("zombie"))], 3)).unwrap();
    let e = zombie.commit(request(3, 1)).unwrap_err();
    assert!(matches!(e, SinkError::Fenced(_)), "{e}");
    // A fresh zombie knows before writing anything.
    let mut fresh = sink(&dir);
    write(&mut fresh, &t, &rows(&[(4, "insert", Some("zombie"))], 4)).unwrap();
    let e = fresh.commit(request(4, 1)).unwrap_err();
    assert!(matches!(e, SinkError::Fenced(_)), "{e}");
    assert_eq!(scan(&dir), expect(&[(1, "a"), (2, "b")]));
    assert_eq!(
        sink(&dir).committed("p1", T).unwrap(),
        Some(Committed {
            position: vec![2],
            epoch: 2
        })
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_host_that_falls_behind_a_same_pipeline_commit_stops_instead_of_duplicating() {
    let dir = root("behind");
    let t = table(Mode::Append);
    let mut a = sink(&dir);
    let mut b = sink(&dir);
    write(&mut a, &t, &rows(&[(1, "insert", Some("a"))], 1)).unwrap();
    a.commit(request(1, 1)).unwrap();
    // b read the table at position 1, then a (older epoch) moved on.
    assert_eq!(b.committed("p1", T).unwrap().unwrap().position, vec![1]);
    write(&mut a, &t, &rows(&[(2, "insert", Some("b"))], 2)).unwrap();
    a.commit(request(2, 1)).unwrap();
    let records = || current_summary(&dir)["total-records"].clone();
    assert_eq!(records(), "2");
    // b's batch reaches past what a committed: part of it is in the table
    // already, so committing it would hold those rows twice. b stops.
    write(
        &mut b,
        &t,
        &rows(&[(2, "insert", Some("b")), (3, "insert", Some("c"))], 2),
    )
    .unwrap();
    let e = b.commit(request(3, 2)).unwrap_err();
    assert!(matches!(e, SinkError::Fatal(_)), "{e}");
    assert_eq!(records(), "2");
    // So does a host that reads the table only when it commits (it lost
    // its copy, or never had one): its batch starts inside what the table
    // holds.
    let mut d = sink(&dir);
    write(
        &mut d,
        &t,
        &rows(&[(2, "insert", Some("b")), (3, "insert", Some("c"))], 2),
    )
    .unwrap();
    let e = d.commit(request(3, 2)).unwrap_err();
    assert!(
        matches!(&e, SinkError::Fatal(m) if m.contains("inside the staged changes")),
        "{e}"
    );
    assert_eq!(records(), "2");
    // A batch the table already holds whole (a commit whose answer was
    // lost, then sent again) is committed, and nothing is written twice.
    let mut c = sink(&dir);
    write(&mut c, &t, &rows(&[(2, "insert", Some("b"))], 2)).unwrap();
    c.commit(request(2, 2)).unwrap();
    assert_eq!(records(), "2");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn two_pipelines_share_a_table_and_retry_lost_races() {
    let dir = root("race");
    let t = table(Mode::Append);
    let mut a = sink(&dir);
    let mut b = NativeSink::new(IcebergSink::default(), &dir);
    b.open(
        "p2",
        &[("warehouse".into(), format!("file://{}", dir.display()))],
    )
    .unwrap();
    let p2 = |high: u8| CommitRequest {
        pipeline: "p2".into(),
        ..request(high, 1)
    };
    write(&mut a, &t, &rows(&[(1, "insert", Some("a"))], 1)).unwrap();
    a.commit(request(1, 1)).unwrap();
    assert_eq!(b.committed("p2", T).unwrap(), None);
    write(&mut b, &t, &rows(&[(2, "insert", Some("b"))], 2)).unwrap();
    b.commit(p2(2)).unwrap();
    // Each one's cached version is now stale in turn: both lose the race
    // once, rebuild on the winner's version and succeed.
    write(&mut a, &t, &rows(&[(3, "insert", Some("c"))], 3)).unwrap();
    a.commit(request(3, 1)).unwrap();
    write(&mut b, &t, &rows(&[(4, "insert", Some("d"))], 4)).unwrap();
    b.commit(p2(4)).unwrap();
    assert_eq!(
        scan(&dir),
        expect(&[(1, "a"), (2, "b"), (3, "c"), (4, "d")])
    );
    assert_eq!(a.committed("p1", T).unwrap().unwrap().position, vec![3]);
    assert_eq!(b.committed("p2", T).unwrap().unwrap().position, vec![4]);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn schema_evolution_adds_columns_and_widens_types_and_refuses_the_rest() {
    let dir = root("evolve");
    let mut s = sink(&dir);
    let t = table(Mode::Upsert);
    let base = |extra: Option<(&str, ArrayRef)>, id: i64, pos: u8| {
        let mut batch = BatchBuilder::new()
            .int64("id", [id])
            .utf8("name", [Some("x")]);
        if let Some((name, array)) = extra {
            batch = batch.column(name, array);
        }
        batch.changes([Op::Insert], [[pos]]).build()
    };
    let qty32: ArrayRef = Arc::new(Int32Array::from(vec![5]));
    write(&mut s, &t, &base(Some(("qty", qty32)), 1, 1)).unwrap();
    s.commit(request(1, 1)).unwrap();
    // Wider type and a new column in one batch.
    let qty64: ArrayRef = Arc::new(Int64Array::from(vec![1i64 << 40]));
    let mut with_note = base(Some(("qty", qty64)), 2, 2);
    let note: ArrayRef = Arc::new(StringArray::from(vec!["hello"]));
    with_note = {
        let mut cols: Vec<(String, ArrayRef)> = with_note
            .schema()
            .fields()
            .iter()
            .zip(with_note.columns())
            .map(|(f, c)| (f.name().clone(), c.clone()))
            .collect();
        cols.insert(3, ("note".into(), note));
        RecordBatch::try_from_iter(cols).unwrap()
    };
    write(&mut s, &t, &with_note).unwrap();
    s.commit(request(2, 1)).unwrap();
    let metadata: serde_json::Value =
        serde_json::from_slice(&std::fs::read(newest_metadata(&dir)).unwrap()).unwrap();
    let current = metadata["current-schema-id"].as_i64().unwrap();
    let schema = metadata["schemas"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["schema-id"].as_i64() == Some(current))
        .unwrap();
    let fields = schema["fields"].as_array().unwrap();
    let qty = fields.iter().find(|f| f["name"] == "qty").unwrap();
    assert_eq!(qty["type"], "long");
    assert!(fields.iter().any(|f| f["name"] == "note"));
    assert_eq!(scan(&dir).len(), 2);

    // A column that turns into a string cannot be promoted: poison, and
    // nothing moves.
    let bad: ArrayRef = Arc::new(StringArray::from(vec!["many"]));
    write(&mut s, &t, &base(Some(("qty", bad)), 3, 3)).unwrap();
    let e = s.commit(request(3, 1)).unwrap_err();
    assert!(
        matches!(&e, SinkError::Poison(m) if m.contains("qty") && m.contains("cannot promote")),
        "{e}"
    );
    s.abort(T);
    assert_eq!(s.committed("p1", T).unwrap().unwrap().position, vec![2]);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn small_batches_of_one_commit_share_one_data_file() {
    let dir = root("files");
    let mut s = sink(&dir);
    let t = table(Mode::Append);
    for i in 0..20 {
        write(&mut s, &t, &rows(&[(i, "insert", Some("x"))], i as u8)).unwrap();
    }
    s.commit(request(20, 1)).unwrap();
    let data: Vec<_> = std::fs::read_dir(dir.join("sales/orders/data"))
        .unwrap()
        .collect();
    assert_eq!(data.len(), 1);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn configuration_is_checked() {
    let dir = root("config");
    let mut s = NativeSink::new(IcebergSink::default(), &dir);
    let e = s.open("p1", &[]).unwrap_err();
    assert!(
        matches!(&e, SinkError::Fatal(m) if m.contains("warehouse")),
        "{e}"
    );
    let e = s
        .open("p1", &[("warehouse".into(), "/not/a/url".into())])
        .unwrap_err();
    assert!(
        matches!(&e, SinkError::Fatal(m) if m.contains("warehouse")),
        "{e}"
    );
    for (key, value) in [
        ("catalog", "rest"),
        ("delete_mode", "positions"),
        ("index_checkpoint_commits", "0"),
        ("index_checkpoint_commits", "many"),
    ] {
        let e = s
            .open(
                "p1",
                &[
                    ("warehouse".into(), "file:///x".into()),
                    (key.into(), value.into()),
                ],
            )
            .unwrap_err();
        assert!(
            matches!(&e, SinkError::Fatal(m) if m.contains(key)),
            "{key}: {e}"
        );
    }
    assert_eq!(destination_path("sales.orders").unwrap(), "sales/orders");
    assert_eq!(destination_path("orders").unwrap(), "default/orders");
    assert_eq!(destination_path("a.b.c").unwrap(), "a/b/c");
    assert!(destination_path("a..b").is_err());
    assert!(destination_path("_weir.x").is_err());
    let _ = std::fs::remove_dir_all(&dir);
}

/// The in-memory key index of the sink equals one rebuilt from the table's
/// files (with the same hash secret): every new row was mapped to the file
/// and row it was written to.
fn assert_index_matches_table(s: &mut NativeSink<IcebergSink>, dir: &Path) {
    let sink = s.sink();
    let index = sink
        .key_indexes
        .get("sales/orders")
        .expect("the sink keeps an index");
    let settings = sink.settings.as_ref().unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let rebuilt = weir_sdk::native::with_blob_root(dir, || {
        let loaded = settings.catalog.load("sales/orders").unwrap().unwrap();
        let ids = index.hasher().field_ids().to_vec();
        let types = index::key_types(&loaded.metadata, &ids).unwrap();
        let hasher = index::KeyHasher::new(index.hasher().secret(), ids, types).unwrap();
        runtime
            .block_on(index::Index::rebuild_with(
                &settings.file_io,
                &loaded.metadata,
                hasher,
            ))
            .unwrap()
    });
    assert_eq!(index.snapshot_id(), rebuilt.snapshot_id());
    assert_eq!(index_entries(index), index_entries(&rebuilt));
}

/// An index's entries, sorted, for comparing two indexes with one secret.
fn index_entries(index: &index::Index) -> Vec<(u64, u64, String, u32)> {
    let mut v: Vec<_> = index
        .locations()
        .map(|(k, p, r)| (k.0, k.1, p.to_string(), r))
        .collect();
    v.sort();
    v
}

/// A deterministic stream of upsert changes over a few keys, committed in
/// small groups, with the rows the table must hold after each commit.
struct Workload {
    commits: Vec<Vec<RecordBatch>>,
    truth: Vec<BTreeMap<i64, Option<String>>>,
}

fn workload(seed: u64, commits: usize, keys: i64) -> Workload {
    let mut state = seed;
    let mut next = move || {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        state >> 33
    };
    let mut model: BTreeMap<i64, Option<String>> = BTreeMap::new();
    let mut pos: u8 = 1;
    let mut out = Workload {
        commits: Vec::new(),
        truth: Vec::new(),
    };
    for c in 0..commits {
        let mut batches = Vec::new();
        for _ in 0..2 {
            let mut changes = Vec::new();
            let mut names = Vec::new();
            for _ in 0..(3 + next() % 5) {
                let key = (next() % keys as u64) as i64;
                let op = if model.contains_key(&key) {
                    if next() % 3 == 0 { "delete" } else { "update" }
                } else {
                    "insert"
                };
                let name = format!("k{key}-c{c}-{}", next() % 1000);
                if op == "delete" {
                    model.remove(&key);
                } else {
                    model.insert(key, Some(name.clone()));
                }
                changes.push((key, op));
                names.push(name);
            }
            let triples: Vec<(i64, &str, Option<&str>)> = changes
                .iter()
                .zip(&names)
                .map(|((k, op), n)| (*k, *op, (*op != "delete").then_some(n.as_str())))
                .collect();
            batches.push(rows(&triples, pos));
            pos = pos.wrapping_add(triples.len() as u8);
        }
        out.commits.push(batches);
        out.truth.push(model.clone());
    }
    out
}

/// Commits `load.commits[c]` at position `c + 1`.
fn commit_number(s: &mut NativeSink<IcebergSink>, load: &Workload, c: usize) -> Result<()> {
    let t = table(Mode::Upsert);
    for batch in &load.commits[c] {
        write(s, &t, batch)?;
    }
    s.commit(request(c as u8 + 1, 1))
}

fn checkpoints(dir: &Path) -> Vec<PathBuf> {
    match std::fs::read_dir(dir.join("_weir/index/sales/orders")) {
        Ok(entries) => entries.map(|e| e.unwrap().path()).collect(),
        Err(_) => Vec::new(),
    }
}

#[test]
fn rows_map_to_their_data_files_when_files_roll() {
    let dir = root("roll");
    let mut s = sink_with(&dir, &[("target_file_size_mb", "1")]);
    let t = table(Mode::Upsert);
    // ~64 bytes of poorly compressible text per row: 12 batches of 5,000
    // rows roll over into several 1 MB files within one commit.
    let text = |i: i64| format!("{:064x}", (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
    for b in 0..12i64 {
        let ids: Vec<i64> = (b * 5000..(b + 1) * 5000).collect();
        let names: Vec<String> = ids.iter().map(|&i| text(i)).collect();
        let batch = BatchBuilder::new()
            .int64("id", ids.iter().copied())
            .utf8("name", names.iter().map(|n| Some(n.as_str())))
            .changes(
                ids.iter().map(|_| Op::Insert),
                ids.iter().map(|&i| (i as u32).to_be_bytes()),
            )
            .build();
        write(&mut s, &t, &batch).unwrap();
    }
    s.commit(request(1, 1)).unwrap();
    let files = std::fs::read_dir(dir.join("sales/orders/data"))
        .unwrap()
        .count();
    assert!(files >= 3, "only {files} data files: the test did not roll");
    assert_index_matches_table(&mut s, &dir);
    // An update of a key in each file deletes its row by position.
    let keys = [7i64, 20_011, 41_999, 59_999];
    let batch = BatchBuilder::new()
        .int64("id", keys)
        .utf8("name", keys.iter().map(|_| Some("new")))
        .changes(keys.iter().map(|_| Op::Update), [[9u8; 4]; 4])
        .build();
    write(&mut s, &t, &batch).unwrap();
    s.commit(request(2, 1)).unwrap();
    let read = scan(&dir);
    assert_eq!(read.len(), 60_000);
    for (k, v) in &read {
        let want = if keys.contains(k) {
            "new".to_string()
        } else {
            text(*k)
        };
        assert_eq!(v.as_deref(), Some(want.as_str()), "key {k}");
    }
    assert_eq!(current_summary(&dir)["total-position-deletes"], "4");
    assert_index_matches_table(&mut s, &dir);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A crash at `point` during commit `at`: the instance is dropped; a new
/// one finds the committed position, goes on, and the table and its index
/// agree with the model.
fn crash_and_continue(name: &str, point: &'static str, config: &[(&str, &str)]) {
    let dir = root(name);
    let load = workload(7, 8, 12);
    let at = 4;
    let mut s = sink_with(&dir, config);
    for c in 0..at {
        commit_number(&mut s, &load, c).unwrap();
    }
    index::CRASH_AT.with(|p| p.set(Some(point)));
    let e = commit_number(&mut s, &load, at).unwrap_err();
    assert!(
        matches!(&e, SinkError::Fatal(m) if m.contains("injected crash")),
        "the crash at {point} did not happen: {e}"
    );
    drop(s);
    let mut s = sink_with(&dir, config);
    // The metadata commit landed before the crash: the host resumes after it.
    let done = s.committed("p1", T).unwrap().unwrap().position[0] as usize;
    assert_eq!(done, at + 1, "the crashed commit did not land");
    assert_eq!(scan(&dir), load.truth[at]);
    for c in done..load.commits.len() {
        commit_number(&mut s, &load, c).unwrap();
        assert_eq!(scan(&dir), load.truth[c], "after commit {c}");
    }
    assert_index_matches_table(&mut s, &dir);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_crash_between_the_metadata_commit_and_the_checkpoint_loses_nothing() {
    crash_and_continue(
        "crash-commit",
        "after-metadata-commit",
        &[("index_checkpoint_commits", "1")],
    );
}

#[test]
fn a_crash_between_the_checkpoint_and_removing_older_ones_loses_nothing() {
    crash_and_continue(
        "crash-checkpoint",
        "after-checkpoint-write",
        &[("index_checkpoint_commits", "1")],
    );
}

#[test]
fn a_crash_after_the_commit_with_a_checkpoint_commits_behind_is_replayed() {
    // Checkpoints every 3 commits: the new instance replays from an older
    // checkpoint through snapshots with position deletes.
    crash_and_continue(
        "crash-replay",
        "after-metadata-commit",
        &[("index_checkpoint_commits", "3")],
    );
}

#[test]
fn torn_corrupt_and_missing_checkpoints_are_rebuilt_from_the_table() {
    let dir = root("torn");
    let load = workload(11, 9, 10);
    let config = [("index_checkpoint_commits", "2")];
    let mut s = sink_with(&dir, &config);
    for c in 0..3 {
        commit_number(&mut s, &load, c).unwrap();
    }
    drop(s);
    type Damage = fn(&Path);
    let damage: [(&str, Damage); 3] = [
        ("torn", |p| {
            let bytes = std::fs::read(p).unwrap();
            std::fs::write(p, &bytes[..bytes.len() - 5]).unwrap();
        }),
        ("corrupt", |p| {
            let mut bytes = std::fs::read(p).unwrap();
            let middle = bytes.len() / 2;
            bytes[middle] ^= 0x40;
            std::fs::write(p, bytes).unwrap();
        }),
        ("missing", |p| std::fs::remove_file(p).unwrap()),
    ];
    let mut c = 3;
    for (what, harm) in damage {
        let stored = checkpoints(&dir);
        assert_eq!(
            stored.len(),
            1,
            "{what}: one checkpoint expected: {stored:?}"
        );
        harm(&stored[0]);
        let mut s = sink_with(&dir, &config);
        for _ in 0..2 {
            commit_number(&mut s, &load, c).unwrap();
            assert_eq!(scan(&dir), load.truth[c], "{what}: after commit {c}");
            c += 1;
        }
        assert_index_matches_table(&mut s, &dir);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_table_written_with_equality_deletes_continues_with_position_deletes() {
    let dir = root("switch");
    let load = workload(5, 8, 10);
    let mut s = sink_with(&dir, &[("delete_mode", "equality")]);
    for c in 0..4 {
        commit_number(&mut s, &load, c).unwrap();
    }
    drop(s);
    let mut s = sink(&dir);
    for c in 4..8 {
        commit_number(&mut s, &load, c).unwrap();
        assert_eq!(scan(&dir), load.truth[c], "after commit {c}");
    }
    assert!(current_summary(&dir)["total-position-deletes"] != "0");
    assert_index_matches_table(&mut s, &dir);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn checkpoints_are_written_every_n_commits_and_older_ones_removed() {
    let dir = root("every");
    let load = workload(3, 7, 10);
    let mut s = sink_with(&dir, &[("index_checkpoint_commits", "3")]);
    let mut seen = Vec::new();
    for c in 0..7 {
        commit_number(&mut s, &load, c).unwrap();
        seen.push(checkpoints(&dir).len());
    }
    // The first commit rebuilds (an empty table) and stores nothing; then
    // one checkpoint from the third commit on, never more than one.
    assert_eq!(seen, vec![0, 0, 1, 1, 1, 1, 1]);
    let name = checkpoints(&dir)[0]
        .file_name()
        .unwrap()
        .to_string_lossy()
        .into_owned();
    let metadata: serde_json::Value =
        serde_json::from_slice(&std::fs::read(newest_metadata(&dir)).unwrap()).unwrap();
    let snapshots = metadata["snapshots"].as_array().unwrap();
    let current = metadata["current-snapshot-id"].clone();
    let parent = snapshots
        .iter()
        .find(|s| s["snapshot-id"] == current)
        .unwrap()["parent-snapshot-id"]
        .clone();
    // It names the sixth snapshot, the current one's parent.
    assert_eq!(name, format!("{parent}.idx"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_lost_race_against_new_files_is_retried_against_them() {
    let dir = root("race-upsert");
    let t = table(Mode::Upsert);
    let mut a = sink(&dir);
    let mut b = NativeSink::new(IcebergSink::default(), &dir);
    b.open(
        "p2",
        &[("warehouse".into(), format!("file://{}", dir.display()))],
    )
    .unwrap();
    write(
        &mut a,
        &t,
        &rows(&[(1, "insert", Some("a")), (2, "insert", Some("b"))], 1),
    )
    .unwrap();
    a.commit(request(2, 1)).unwrap();
    // Another writer moves key 1 to a new file after `a` read the table.
    assert_eq!(b.committed("p2", T).unwrap(), None);
    write(&mut b, &t, &rows(&[(1, "update", Some("from b"))], 3)).unwrap();
    b.commit(CommitRequest {
        pipeline: "p2".into(),
        ..request(3, 1)
    })
    .unwrap();
    // `a` computed its deletes against the files it knew: it must not
    // commit them, and its retry deletes the row `b` wrote.
    write(
        &mut a,
        &t,
        &rows(&[(1, "update", Some("a2")), (2, "delete", None)], 4),
    )
    .unwrap();
    let e = a.commit(request(5, 1)).unwrap_err();
    assert!(matches!(e, SinkError::Retryable(_)), "{e}");
    assert_eq!(scan(&dir), expect(&[(1, "from b"), (2, "b")]));
    a.commit(request(5, 1)).unwrap();
    assert_eq!(scan(&dir), expect(&[(1, "a2")]));
    assert_index_matches_table(&mut a, &dir);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn catch_up_replays_this_sinks_commits_and_refuses_a_replace() {
    let dir = root("replace");
    let load = workload(13, 3, 8);
    let mut s = sink_with(&dir, &[("index_checkpoint_commits", "2")]);
    for c in 0..3 {
        commit_number(&mut s, &load, c).unwrap();
    }
    // The checkpoint names the second snapshot; the table is at the third.
    let stored = checkpoints(&dir);
    assert_eq!(stored.len(), 1, "{stored:?}");
    let checkpoint_id: i64 = stored[0]
        .file_stem()
        .unwrap()
        .to_string_lossy()
        .parse()
        .unwrap();
    let text = std::fs::read_to_string(newest_metadata(&dir)).unwrap();
    let metadata: iceberg::spec::TableMetadata = serde_json::from_str(&text).unwrap();
    assert_ne!(metadata.current_snapshot_id(), Some(checkpoint_id));
    // The same table, as if its last snapshot were a compaction.
    let mut json: serde_json::Value = serde_json::from_str(&text).unwrap();
    let current = json["current-snapshot-id"].clone();
    for snapshot in json["snapshots"].as_array_mut().unwrap() {
        if snapshot["snapshot-id"] == current {
            snapshot["summary"]["operation"] = "replace".into();
        }
    }
    let replaced: iceberg::spec::TableMetadata = serde_json::from_value(json).unwrap();

    let sink = s.sink();
    let in_memory = sink.key_indexes.get("sales/orders").unwrap();
    let file_io = &sink.settings.as_ref().unwrap().file_io;
    let bytes = std::fs::read(&stored[0]).unwrap();
    let ids = in_memory.hasher().field_ids().to_vec();
    let types = index::key_types(&metadata, &ids).unwrap();
    let decode =
        || index::Index::decode(&bytes, metadata.uuid(), checkpoint_id, &ids, &types).unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    weir_sdk::native::with_blob_root(&dir, || {
        let mut behind = decode();
        let why = runtime
            .block_on(behind.catch_up(file_io, &replaced))
            .unwrap();
        assert!(
            why.as_deref().is_some_and(|w| w.contains("replace")),
            "{why:?}"
        );
        let mut behind = decode();
        let why = runtime
            .block_on(behind.catch_up(file_io, &metadata))
            .unwrap();
        assert_eq!(why, None);
        assert_eq!(behind.snapshot_id(), in_memory.snapshot_id());
        assert_eq!(index_entries(&behind), index_entries(in_memory));
        // Another table's checkpoint is refused.
        assert!(
            index::Index::decode(&bytes, uuid::Uuid::new_v4(), checkpoint_id, &ids, &types)
                .is_err()
        );
    });
    let _ = std::fs::remove_dir_all(&dir);
}

/// Every live file of the table's current snapshot, as its manifests list it.
fn live_files(dir: &Path) -> Vec<iceberg::spec::DataFile> {
    let metadata: iceberg::spec::TableMetadata =
        serde_json::from_slice(&std::fs::read(newest_metadata(dir)).unwrap()).unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let Some(snapshot) = metadata.current_snapshot() else {
        return Vec::new();
    };
    runtime
        .block_on(index::live_files(&FileIO::new_with_fs(), snapshot))
        .unwrap()
        .into_iter()
        .map(|(f, _)| f)
        .collect()
}

/// Every data file carries a partition value of the table's one field, the
/// rows spread over more than one partition, and every position-delete file
/// is of the partition of each data file it names.
fn assert_files_partitioned(dir: &Path) {
    use iceberg::spec::DataContentType;
    let files = live_files(dir);
    let partition_of: std::collections::HashMap<String, iceberg::spec::Struct> = files
        .iter()
        .filter(|f| f.content_type() == DataContentType::Data)
        .map(|f| (f.file_path().to_string(), f.partition().clone()))
        .collect();
    let distinct: std::collections::HashSet<_> = partition_of.values().collect();
    assert!(distinct.len() > 1, "one partition only: {distinct:?}");
    assert!(distinct.iter().all(|p| p.fields().len() == 1));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let mut checked = 0;
    for file in &files {
        if file.content_type() != DataContentType::PositionDeletes {
            continue;
        }
        assert_eq!(file.partition().fields().len(), 1, "{}", file.file_path());
        let mut named = Vec::new();
        runtime
            .block_on(index::read_position_deletes(
                &FileIO::new_with_fs(),
                file,
                |path, _| named.push(path.to_string()),
            ))
            .unwrap();
        for path in named {
            // A data file deleted entirely may be gone from the snapshot.
            if let Some(p) = partition_of.get(&path) {
                assert_eq!(
                    p,
                    file.partition(),
                    "{} deletes from {path}",
                    file.file_path()
                );
                checked += 1;
            }
        }
    }
    assert!(checked > 0, "no position delete was checked");
}

/// The partition of every index entry's file, for comparing two indexes.
fn index_partitions(index: &index::Index) -> Vec<(u64, u64, Vec<u8>)> {
    let mut v: Vec<_> = index
        .locations()
        .map(|(k, _, _)| {
            let (file, _) = index.locate(&k).unwrap();
            (k.0, k.1, partition::encode(&file.partition))
        })
        .collect();
    v.sort();
    v
}

fn assert_partitioned_index_matches_table(s: &mut NativeSink<IcebergSink>, dir: &Path) {
    assert_index_matches_table(s, dir);
    let sink = s.sink();
    let index = sink.key_indexes.get("sales/orders").unwrap();
    let settings = sink.settings.as_ref().unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let rebuilt = weir_sdk::native::with_blob_root(dir, || {
        let loaded = settings.catalog.load("sales/orders").unwrap().unwrap();
        let ids = index.hasher().field_ids().to_vec();
        let types = index::key_types(&loaded.metadata, &ids).unwrap();
        let hasher = index::KeyHasher::new(index.hasher().secret(), ids, types).unwrap();
        runtime
            .block_on(index::Index::rebuild_with(
                &settings.file_io,
                &loaded.metadata,
                hasher,
            ))
            .unwrap()
    });
    let live = index_partitions(index);
    assert!(live.iter().all(|(_, _, p)| !p.is_empty()));
    assert_eq!(live, index_partitions(&rebuilt));
}

#[test]
fn a_partitioned_upsert_table_deletes_by_position_within_partitions() {
    let dir = root("part-upsert");
    let config = [
        ("partition.sales.orders", "bucket(4, id)"),
        ("index_checkpoint_commits", "3"),
        // No compaction: the live index is compared with the files the
        // commits wrote (tests/tests/iceberg/partitions.rs compacts).
        ("compact_min_files", "0"),
    ];
    let mut s = sink_with(&dir, &config);
    let load = workload(11, 12, 16);
    for c in 0..8 {
        commit_number(&mut s, &load, c).unwrap();
        assert_eq!(scan(&dir), load.truth[c], "after commit {c}");
    }
    assert_partitioned_index_matches_table(&mut s, &dir);
    assert_files_partitioned(&dir);
    let metadata: serde_json::Value =
        serde_json::from_slice(&std::fs::read(newest_metadata(&dir)).unwrap()).unwrap();
    let spec = &metadata["partition-specs"][0]["fields"];
    assert_eq!(spec[0]["transform"], "bucket[4]");
    assert_eq!(spec[0]["name"], "id_bucket");
    assert_eq!(summary_number(&dir, "total-equality-deletes"), 0);
    assert!(summary_number(&dir, "total-position-deletes") > 0);

    // A restarted sink reads the index back from its checkpoint (with the
    // files' partitions) and goes on.
    drop(s);
    let mut s = sink_with(&dir, &config);
    assert_eq!(s.committed("p1", T).unwrap().unwrap().position, vec![8]);
    for c in 8..12 {
        commit_number(&mut s, &load, c).unwrap();
        assert_eq!(scan(&dir), load.truth[c], "after commit {c}");
    }
    assert_partitioned_index_matches_table(&mut s, &dir);
    assert_files_partitioned(&dir);

    // Lost checkpoints: the index is rebuilt from the table, partitions too.
    drop(s);
    std::fs::remove_dir_all(dir.join("_weir/index")).unwrap();
    let mut s = sink_with(&dir, &config);
    let t = table(Mode::Upsert);
    let keys: Vec<i64> = load.truth[11].keys().copied().take(3).collect();
    let batch = BatchBuilder::new()
        .int64("id", keys.iter().copied())
        .utf8("name", keys.iter().map(|_| Some("last")))
        .changes(keys.iter().map(|_| Op::Update), [[200u8]; 3])
        .build();
    write(&mut s, &t, &batch).unwrap();
    s.commit(request(13, 1)).unwrap();
    let mut truth = load.truth[11].clone();
    for k in &keys {
        truth.insert(*k, Some("last".into()));
    }
    assert_eq!(scan(&dir), truth);
    assert_partitioned_index_matches_table(&mut s, &dir);
    let _ = std::fs::remove_dir_all(&dir);
}

fn summary_number(dir: &Path, key: &str) -> u64 {
    current_summary(dir)[key].as_str().unwrap().parse().unwrap()
}

#[test]
fn a_partitioned_upsert_table_in_equality_mode_deletes_within_partitions() {
    let dir = root("part-upsert-eq");
    let mut s = sink_with(
        &dir,
        &[
            ("partition.sales.orders", "identity(id)"),
            ("delete_mode", "equality"),
            ("compact_min_files", "0"),
        ],
    );
    let load = workload(5, 6, 10);
    for c in 0..6 {
        commit_number(&mut s, &load, c).unwrap();
        assert_eq!(scan(&dir), load.truth[c], "after commit {c}");
    }
    let files = live_files(&dir);
    let deletes: Vec<_> = files
        .iter()
        .filter(|f| f.content_type() == iceberg::spec::DataContentType::EqualityDeletes)
        .collect();
    assert!(!deletes.is_empty());
    // identity(id): each delete file holds the keys of its one partition.
    assert!(deletes.iter().all(|f| f.partition().fields().len() == 1));
    assert!(deletes.iter().all(|f| f.record_count() >= 1));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn an_append_table_partitions_by_day_of_any_column() {
    use arrow_array::TimestampMicrosecondArray;
    let dir = root("part-append");
    let mut s = sink_with(
        &dir,
        &[("partition.sales.orders", "day(ts), truncate(1, name)")],
    );
    let t = table(Mode::Append);
    let day = 86_400_000_000i64;
    let ids: Vec<i64> = (0..40).collect();
    let names: Vec<String> = ids.iter().map(|i| format!("{}x", i % 3)).collect();
    let ts =
        TimestampMicrosecondArray::from_iter_values(ids.iter().map(|i| 19_000 * day + i * day / 9))
            .with_timezone("UTC");
    let batch = BatchBuilder::new()
        .int64("id", ids.iter().copied())
        .utf8("name", names.iter().map(|n| Some(n.as_str())))
        .column("ts", Arc::new(ts))
        .changes(
            ids.iter().map(|_| Op::Insert),
            ids.iter().map(|&i| [i as u8]),
        )
        .build();
    write(&mut s, &t, &batch).unwrap();
    s.commit(request(40, 1)).unwrap();
    let read = scan(&dir);
    assert_eq!(read.len(), 40);
    for (i, name) in &read {
        assert_eq!(name.as_deref(), Some(format!("{}x", i % 3).as_str()));
    }
    let files = live_files(&dir);
    // 40 rows over 5 days, 3 name prefixes: 15 partitions.
    let partitions: std::collections::HashSet<_> =
        files.iter().map(|f| f.partition().clone()).collect();
    assert_eq!(partitions.len(), 15, "{partitions:?}");
    assert_eq!(files.len(), 15);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn partition_specs_are_checked() {
    let dir = root("part-config");
    // Syntax: at open, naming the key and the bad term.
    for (value, bad) in [
        ("bucket(id)", "bucket"),
        ("bucket(0, id)", "bucket(0, id)"),
        ("day(ts), nope(id)", "nope"),
        ("day(ts),", "term 2"),
        ("day(ts", "parentheses"),
        ("truncate(x, name)", "truncate width"),
        ("identity(a b)", "column name"),
    ] {
        let mut s = NativeSink::new(IcebergSink::default(), &dir);
        let e = s
            .open(
                "p1",
                &[
                    ("warehouse".into(), format!("file://{}", dir.display())),
                    ("partition.sales.orders".into(), value.into()),
                ],
            )
            .unwrap_err();
        assert!(
            matches!(&e, SinkError::Fatal(m) if m.contains("partition.sales.orders") && m.contains(bad)),
            "{value}: {e}"
        );
    }
    let mut s = NativeSink::new(IcebergSink::default(), &dir);
    let e = s
        .open(
            "p1",
            &[
                ("warehouse".into(), format!("file://{}", dir.display())),
                ("partition.orders".into(), "identity(id)".into()),
                ("partition.default.orders".into(), "identity(id)".into()),
            ],
        )
        .unwrap_err();
    assert!(
        matches!(&e, SinkError::Fatal(m) if m.contains("both")),
        "{e}"
    );

    // Against the table: at create, naming the column.
    for (mode, value, bad) in [
        (Mode::Upsert, "identity(name)", "not a key column"),
        (
            Mode::Upsert,
            "bucket(4, nope)",
            "`nope` is not a top-level column",
        ),
        (Mode::Append, "day(id)", "does not apply to column `id`"),
    ] {
        let mut s = sink_with(&dir, &[("partition.sales.orders", value)]);
        let t = table(mode);
        write(&mut s, &t, &rows(&[(1, "insert", Some("a"))], 1)).unwrap();
        let e = s.commit(request(1, 1)).unwrap_err();
        assert!(
            matches!(&e, SinkError::Fatal(m) if m.contains("partition.sales.orders") && m.contains(bad)),
            "{value}: {e}"
        );
        assert!(!dir.join("sales/orders").exists());
    }

    // An existing table keeps its spec when the config asks for another.
    let mut s = sink(&dir);
    let t = table(Mode::Upsert);
    write(&mut s, &t, &rows(&[(1, "insert", Some("a"))], 1)).unwrap();
    s.commit(request(1, 1)).unwrap();
    drop(s);
    let mut s = sink_with(&dir, &[("partition.sales.orders", "bucket(4, id)")]);
    write(&mut s, &t, &rows(&[(1, "update", Some("b"))], 2)).unwrap();
    s.commit(request(2, 1)).unwrap();
    assert_eq!(scan(&dir), expect(&[(1, "b")]));
    let metadata: serde_json::Value =
        serde_json::from_slice(&std::fs::read(newest_metadata(&dir)).unwrap()).unwrap();
    assert_eq!(
        metadata["partition-specs"][0]["fields"],
        serde_json::json!([])
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn partition_values_round_trip_through_checkpoint_bytes() {
    use iceberg::spec::{Literal, Struct};
    let values = Struct::from_iter([
        None,
        Some(Literal::int(7)),
        Some(Literal::long(-3)),
        Some(Literal::string("a/b=c")),
        Some(Literal::bool(true)),
        Some(Literal::binary(vec![0, 1, 2])),
        Some(Literal::double(1.5)),
        Some(Literal::decimal(12345)),
        Some(Literal::uuid(uuid::Uuid::from_u128(99))),
    ]);
    let bytes = partition::encode(&values);
    assert_eq!(partition::decode(&bytes).unwrap(), values);
    assert!(partition::encode(&Struct::empty()).is_empty());
    assert!(partition::decode(&bytes[..bytes.len() - 1]).is_err());
}

/// Rows per key `(a, b)` of a table keyed on two columns, as the crate's
/// scan reads them.
fn scan_two_column_keys(dir: &Path) -> BTreeMap<(i64, i64), Vec<String>> {
    let batches = scan_metadata(&format!("file://{}", newest_metadata(dir).display()));
    let mut out: BTreeMap<(i64, i64), Vec<String>> = BTreeMap::new();
    for b in batches {
        let a = b.column_by_name("a").unwrap().as_primitive::<Int64Type>();
        let k = b.column_by_name("b").unwrap().as_primitive::<Int64Type>();
        for ((a, k), name) in a.values().iter().zip(k.values()).zip(names_of(&b)) {
            out.entry((*a, *k))
                .or_default()
                .push(name.unwrap_or_default());
        }
    }
    out
}

/// The iceberg crate keeps a table's key fields in a hash set, so each load
/// of the metadata may list a two-column key in the other order. The host's
/// recovery reloads the metadata between commits (`committed`) while the
/// key index stays in memory; keys hashed in one order and looked up in the
/// other are not found, and an update lands beside the old row (or, where
/// a key read backwards is another key, deletes that one). Seen as
/// duplicate keys in an upsert table with `weir maintain` running beside
/// the pipeline (each lost race reloads the metadata).
#[test]
fn a_two_column_key_is_found_whatever_order_a_metadata_load_lists_it_in() {
    let dir = root("two-column-key-order");
    let mut s = sink(&dir);
    let t = Table {
        key_columns: vec!["a".into(), "b".into()],
        ..table(Mode::Upsert)
    };
    // No key is another read backwards: a look-up in the wrong order must
    // miss (for (1, 2) it would find (2, 1), and delete that row instead:
    // a loss beside the duplicate).
    let keys: [(i64, i64); 4] = [(1, 10), (1, 20), (2, 10), (3, 30)];
    // Each load is a new hash set whose order is a coin toss: in 24 of
    // them it differs from the index's (6 failures in 6 runs without the
    // fix).
    for round in 0..24u8 {
        let name = format!("round {round}");
        let op = if round == 0 { "insert" } else { "update" };
        let rb = BatchBuilder::new()
            .int64("a", keys.iter().map(|k| k.0))
            .int64("b", keys.iter().map(|k| k.1))
            .utf8("name", keys.iter().map(|_| Some(name.as_str())))
            .changes(
                keys.iter().map(|_| Op::parse(op).unwrap()),
                (round * 4 + 1..).take(keys.len()).map(|p| [p]),
            )
            .build();
        write(&mut s, &t, &rb).unwrap();
        s.commit(request(round * 4 + 4, 1)).unwrap();
        // As the host's recovery asks: the table's metadata is read anew.
        s.committed("p1", T).unwrap();
    }
    let rows = scan_two_column_keys(&dir);
    let last = "round 23".to_string();
    for key in keys {
        assert_eq!(rows.get(&key), Some(&vec![last.clone()]), "key {key:?}");
    }
    assert_eq!(rows.len(), keys.len());
    assert_index_matches_table(&mut s, &dir);
    let _ = std::fs::remove_dir_all(&dir);
}
