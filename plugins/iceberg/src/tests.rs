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

fn root(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("weir-iceberg-test-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn sink(dir: &Path) -> NativeSink<IcebergSink> {
    let mut sink = NativeSink::new(IcebergSink::default(), dir);
    sink.open(
        "p1",
        &[("warehouse".into(), format!("file://{}", dir.display()))],
    )
    .unwrap();
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
    let meta = BatchMeta {
        table: t.clone(),
        id,
        low: vec![0],
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

/// The table as the crate's scan sees it: id -> name.
fn scan(dir: &Path) -> BTreeMap<i64, Option<String>> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let metadata = format!("file://{}", newest_metadata(dir).display());
    runtime.block_on(async {
        let table = StaticTable::from_metadata_file(
            &metadata,
            TableIdent::from_strs(["sales", "orders"]).unwrap(),
            FileIO::new_with_fs(),
        )
        .await
        .unwrap();
        let batches: Vec<RecordBatch> = table
            .scan()
            .build()
            .unwrap()
            .to_arrow()
            .await
            .unwrap()
            .try_collect()
            .await
            .unwrap();
        let mut out = BTreeMap::new();
        for b in batches {
            let ids = b.column_by_name("id").unwrap().as_primitive::<Int64Type>();
            let names = arrow_cast::cast(
                b.column_by_name("name").unwrap(),
                &arrow_schema::DataType::Utf8,
            )
            .unwrap();
            let names = names.as_string::<i32>();
            for i in 0..b.num_rows() {
                let name = (!names.is_null(i)).then(|| names.value(i).to_string());
                assert!(
                    out.insert(ids.value(i), name).is_none(),
                    "duplicate key {}",
                    ids.value(i)
                );
            }
        }
        out
    })
}

fn expect(pairs: &[(i64, &str)]) -> BTreeMap<i64, Option<String>> {
    pairs
        .iter()
        .map(|(k, v)| (*k, Some(v.to_string())))
        .collect()
}

#[test]
fn upsert_applies_updates_and_deletes_through_equality_deletes() {
    let dir = root("upsert");
    let mut s = sink(&dir);
    let t = table(Mode::Upsert);
    assert_eq!(s.committed("p1", T).unwrap(), None);
    write(
        &mut s,
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
    assert_eq!(scan(&dir), expect(&[(1, "a"), (2, "b"), (3, "c")]));

    // Two batches in one commit: the later change to a key wins; deleting a
    // missing key is fine.
    write(
        &mut s,
        &t,
        &rows(&[(1, "update", Some("a2")), (2, "delete", None)], 4),
    )
    .unwrap();
    write(
        &mut s,
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
    assert_eq!(scan(&dir), expect(&[(1, "a3"), (3, "c"), (4, "d")]));

    // A deleted key comes back.
    write(&mut s, &t, &rows(&[(2, "insert", Some("b2"))], 9)).unwrap();
    s.commit(request(9, 1)).unwrap();
    assert_eq!(
        scan(&dir),
        expect(&[(1, "a3"), (2, "b2"), (3, "c"), (4, "d")])
    );

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
    let current = metadata["current-snapshot-id"].as_i64().unwrap();
    let snapshot = metadata["snapshots"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["snapshot-id"].as_i64() == Some(current))
        .unwrap();
    let summary = &snapshot["summary"];
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
    let t = table(Mode::Upsert);
    let mut a = sink(&dir);
    let mut b = sink(&dir);
    write(&mut a, &t, &rows(&[(1, "insert", Some("a"))], 1)).unwrap();
    a.commit(request(1, 1)).unwrap();
    // b read the table at position 1, then a (older epoch) moved on.
    assert_eq!(b.committed("p1", T).unwrap().unwrap().position, vec![1]);
    write(&mut a, &t, &rows(&[(2, "insert", Some("b"))], 2)).unwrap();
    a.commit(request(2, 1)).unwrap();
    write(&mut b, &t, &rows(&[(2, "insert", Some("b"))], 2)).unwrap();
    let e = b.commit(request(2, 2)).unwrap_err();
    assert!(matches!(e, SinkError::Fatal(_)), "{e}");
    assert_eq!(scan(&dir), expect(&[(1, "a"), (2, "b")]));
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
    let e = s
        .open(
            "p1",
            &[
                ("warehouse".into(), "file:///x".into()),
                ("catalog".into(), "rest".into()),
            ],
        )
        .unwrap_err();
    assert!(
        matches!(&e, SinkError::Fatal(m) if m.contains("catalog")),
        "{e}"
    );
    assert_eq!(destination_path("sales.orders").unwrap(), "sales/orders");
    assert_eq!(destination_path("orders").unwrap(), "default/orders");
    assert_eq!(destination_path("a.b.c").unwrap(), "a/b/c");
    assert!(destination_path("a..b").is_err());
    assert!(destination_path("_weir.x").is_err());
}
