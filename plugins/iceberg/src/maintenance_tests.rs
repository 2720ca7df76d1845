//! Compaction and expiry run natively on tables the sink wrote, read back by
//! the `iceberg` crate's own scan (with its local file system, not our
//! storage) and compared with a model of the source; crashes are injected
//! at every blob write of a maintenance run.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use arrow_array::cast::AsArray;
use arrow_array::types::Int64Type;
use iceberg::io::FileIO;
use iceberg::spec::TableMetadata;
use weir_sdk::native::{NativeSink, encode_ipc};
use weir_sdk::{BatchMeta, CommitRequest, Committed, Mode, Op, Table};
use weir_test_support::BatchBuilder;

use super::*;
use crate::IcebergSink;

const T: &str = "shop.orders";
const P: &str = "p1";

type Model = BTreeMap<i64, String>;

fn root(name: &str) -> PathBuf {
    let dir =
        std::env::temp_dir().join(format!("weir-iceberg-maint-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A sink on `dir` with maintenance `policy` (config pairs) and no
/// maintenance at commit boundaries unless the policy says so.
fn sink(dir: &Path, policy: &[(&str, &str)]) -> NativeSink<IcebergSink> {
    let mut config = vec![
        ("warehouse".to_string(), format!("file://{}", dir.display())),
        ("compact_min_files".to_string(), "0".to_string()),
        (
            "expire_snapshots_older_than".to_string(),
            "never".to_string(),
        ),
    ];
    for (k, v) in policy {
        config.retain(|(key, _)| key != k);
        config.push((k.to_string(), v.to_string()));
    }
    let mut sink = NativeSink::new(IcebergSink::default(), dir);
    sink.open(P, &config).unwrap();
    sink
}

fn table() -> Table {
    Table {
        name: T.into(),
        key_columns: vec!["id".into()],
        mode: Mode::Upsert,
        destination: "sales.orders".into(),
        metadata: Vec::new(),
    }
}

/// The changes of commit `n` (deterministic): a few new keys, updates and
/// deletes of older ones.
fn changes(n: u32) -> Vec<(i64, Op, Option<String>)> {
    let n = i64::from(n);
    let mut out = vec![
        (n * 3, Op::Insert, Some(format!("new-{n}"))),
        (n * 3 + 1, Op::Insert, Some(format!("new-{n}"))),
    ];
    if n >= 1 {
        out.push(((n * 7) % (n * 3), Op::Update, Some(format!("upd-{n}"))));
    }
    if n >= 2 && n % 2 == 0 {
        out.push(((n * 5 + 1) % (n * 3), Op::Delete, None));
    }
    // One key per batch: the last change wins.
    let mut seen = BTreeSet::new();
    out.retain(|c| seen.insert(c.0));
    out
}

/// Writes and commits commit `n` through the sink and applies it to the
/// model.
fn commit(sink: &mut NativeSink<IcebergSink>, model: &mut Model, n: u32) {
    commit_rows(sink, model, n, changes(n));
}

/// Writes and commits `rows` as commit `n` (its positions) through the sink
/// and applies them to the model.
fn commit_rows(
    sink: &mut NativeSink<IcebergSink>,
    model: &mut Model,
    n: u32,
    rows: Vec<(i64, Op, Option<String>)>,
) {
    let position = |i: usize| (n * 16 + i as u32).to_be_bytes();
    let batch = BatchBuilder::new()
        .int64("id", rows.iter().map(|r| r.0))
        .utf8("name", rows.iter().map(|r| r.2.as_deref()))
        .changes(rows.iter().map(|r| r.1), (0..rows.len()).map(position))
        .build();
    let meta = BatchMeta {
        table: table(),
        id: format!("b-{n}"),
        low: position(0).to_vec(),
        high: position(15).to_vec(),
        rows: batch.num_rows() as u32,
    };
    sink.write(meta, &encode_ipc(&batch)).unwrap();
    // As the host does: a retryable answer (a lost race it could not
    // rebuild on) keeps the batch staged and commits again.
    let mut attempts = 0;
    while let Err(e) = sink.commit(request(n)) {
        attempts += 1;
        assert!(
            matches!(e, weir_sdk::SinkError::Retryable(_)) && attempts < 3,
            "commit {n}: {e}"
        );
    }
    for (key, op, name) in rows {
        match op {
            Op::Delete => {
                model.remove(&key);
            }
            _ => {
                model.insert(key, name.unwrap());
            }
        }
    }
}

fn request(n: u32) -> CommitRequest {
    CommitRequest {
        table: T.into(),
        high: (n * 16 + 15).to_be_bytes().to_vec(),
        pipeline: P.into(),
        epoch: 1,
    }
}

/// A table written by `commits` commits, and its model.
fn written(dir: &Path, commits: u32) -> Model {
    let mut s = sink(dir, &[]);
    let mut model = Model::new();
    for n in 0..commits {
        commit(&mut s, &mut model, n);
    }
    model
}

fn newest_metadata(dir: &Path) -> PathBuf {
    let meta = dir.join("sales/orders/metadata");
    let newest = std::fs::read_dir(&meta)
        .unwrap()
        .filter_map(|e| {
            let name = e.unwrap().file_name().into_string().unwrap();
            name.strip_prefix('v')?
                .strip_suffix(".metadata.json")?
                .parse::<u64>()
                .ok()
        })
        .max()
        .unwrap();
    meta.join(format!("v{newest}.metadata.json"))
}

fn metadata(dir: &Path) -> TableMetadata {
    serde_json::from_slice(&std::fs::read(newest_metadata(dir)).unwrap()).unwrap()
}

/// One thread: the `iceberg` crate's equality-delete loader (0.10.1) can
/// lose a wake-up between two worker threads and hang a scan forever.
fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// The table as the crate's scan sees it (its own file IO): id -> name.
fn scan(dir: &Path) -> Model {
    let location = format!("file://{}", newest_metadata(dir).display());
    let batches = crate::tests::scan_metadata(&location);
    let mut out = Model::new();
    for b in batches {
        let ids = b.column_by_name("id").unwrap().as_primitive::<Int64Type>();
        for (id, name) in ids.values().iter().zip(crate::tests::names_of(&b)) {
            let previous = out.insert(*id, name.expect("every row has a name"));
            assert!(previous.is_none(), "duplicate key {id}");
        }
    }
    out
}

fn total(dir: &Path, key: &str) -> u64 {
    let metadata = metadata(dir);
    let snapshot = metadata.current_snapshot().unwrap();
    snapshot.summary().additional_properties[key]
        .parse()
        .unwrap()
}

/// Every file the table's snapshots reference (manifest lists, manifests,
/// data and delete files), as local paths.
fn referenced(dir: &Path) -> BTreeSet<PathBuf> {
    let metadata = metadata(dir);
    let file_io = FileIO::new_with_fs();
    let local = |location: &str| PathBuf::from(location.strip_prefix("file://").unwrap());
    runtime().block_on(async {
        let mut out = BTreeSet::new();
        for snapshot in metadata.snapshots() {
            out.insert(local(snapshot.manifest_list()));
            let list = read_list(&file_io, &metadata, snapshot.manifest_list())
                .await
                .unwrap();
            for manifest_file in &list {
                out.insert(local(&manifest_file.manifest_path));
                let manifest = manifest_file.load_manifest(&file_io).await.unwrap();
                for entry in manifest.entries().iter().filter(|e| e.is_alive()) {
                    out.insert(local(entry.file_path()));
                }
            }
        }
        out
    })
}

/// The Avro and Parquet files under the table's folder.
fn on_disk(dir: &Path) -> BTreeSet<PathBuf> {
    fn walk(dir: &Path, out: &mut BTreeSet<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, out);
            } else if path
                .extension()
                .is_some_and(|e| e == "avro" || e == "parquet")
            {
                out.insert(path);
            }
        }
    }
    let mut out = BTreeSet::new();
    walk(&dir.join("sales/orders"), &mut out);
    out
}

fn last_position(n: u32) -> Option<Committed> {
    Some(Committed {
        position: request(n).high,
        epoch: 1,
    })
}

fn strings(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| s.to_string()).collect()
}

#[test]
fn compaction_rewrites_small_files_into_one_and_later_deletes_still_apply() {
    let dir = root("compact");
    let mut model = written(&dir, 24);
    assert_eq!(scan(&dir), model);
    assert_eq!(total(&dir, "total-data-files"), 24);
    assert!(total(&dir, "total-delete-files") > 0);

    let mut s = sink(&dir, &[]);
    let report = s.maintain(P, &[], &strings(&["compact"])).unwrap();
    assert!(report.contains("compacted 24 data files"), "{report}");
    assert_eq!(scan(&dir), model);
    assert_eq!(total(&dir, "total-data-files"), 1);
    // Every data file was rewritten, so no delete applies to anything.
    assert_eq!(total(&dir, "total-delete-files"), 0);
    assert_eq!(total(&dir, "total-records"), model.len() as u64);
    let current = metadata(&dir);
    let snapshot = current.current_snapshot().unwrap();
    assert_eq!(
        snapshot.summary().operation,
        iceberg::spec::Operation::Replace
    );
    assert_eq!(s.committed(P, T).unwrap(), last_position(23));

    // Commits after the compaction update and delete keys it rewrote.
    for n in 24..30 {
        commit(&mut s, &mut model, n);
        assert_eq!(scan(&dir), model, "after commit {n}");
    }
    // Nothing left worth compacting is not an error.
    let again = sink(&dir, &[("compact_target_file_size_mb", "1")])
        .maintain(P, &strings(&[T]), &strings(&["compact"]))
        .unwrap();
    assert!(again.contains("compacted 7 data files"), "{again}");
    assert_eq!(scan(&dir), model);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn expiry_drops_old_snapshots_and_every_file_only_they_referenced() {
    let dir = root("expire");
    let model = written(&dir, 20);
    let mut s = sink(
        &dir,
        &[
            ("expire_snapshots_older_than", "0s"),
            ("keep_snapshots", "1"),
        ],
    );
    s.maintain(P, &[], &strings(&["compact"])).unwrap();
    let before = on_disk(&dir);
    let report = s.maintain(P, &[], &strings(&["expire"])).unwrap();
    assert!(report.contains("expired 20 snapshots"), "{report}");
    assert_eq!(metadata(&dir).snapshots().count(), 1);
    assert_eq!(scan(&dir), model);
    // What is left on disk is exactly what the kept snapshots reference.
    let left = on_disk(&dir);
    assert_eq!(left, referenced(&dir));
    assert!(left.len() < before.len());
    // The position is still found, also by a fresh instance.
    assert_eq!(sink(&dir, &[]).committed(P, T).unwrap(), last_position(19));
    let unknown = s.maintain(P, &[], &strings(&["vacuum"])).unwrap_err();
    assert!(unknown.to_string().contains("vacuum"), "{unknown}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_policy_runs_at_commit_boundaries() {
    let dir = root("boundary");
    let mut s = sink(
        &dir,
        &[
            ("compact_min_files", "4"),
            ("expire_snapshots_older_than", "0s"),
            ("keep_snapshots", "2"),
        ],
    );
    let mut model = Model::new();
    for n in 0..40 {
        commit(&mut s, &mut model, n);
        assert!(total(&dir, "total-data-files") < 4, "commit {n}");
    }
    assert_eq!(scan(&dir), model);
    // Expiry runs once 16 snapshots can go.
    let snapshots = metadata(&dir).snapshots().count();
    assert!(snapshots < 2 + 16 + 1, "{snapshots} snapshots");
    assert_eq!(sink(&dir, &[]).committed(P, T).unwrap(), last_position(39));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_commit_that_wins_the_race_makes_compaction_plan_again() {
    let dir = root("race");
    let mut model = written(&dir, 10);
    let mut maintainer = sink(&dir, &[]);
    let mut writer = sink(&dir, &[]);
    // The maintainer plans on this version; the writer commits after it.
    let settings = maintainer.sink().settings.as_ref().unwrap();
    let stale = weir_sdk::native::with_blob_root(&dir, || {
        settings.catalog.load("sales/orders").unwrap().unwrap()
    });
    commit(&mut writer, &mut model, 10);
    let before = on_disk(&dir);
    let policy = Policy::default();
    let round = weir_sdk::native::with_blob_root(&dir, || {
        let work = TableWork {
            settings,
            path: "sales/orders",
            policy: &policy,
        };
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
            .block_on(work.compact_round(&stale, 1))
            .unwrap()
    });
    assert!(matches!(round, Round::Lost));
    // It removed what it wrote; the winner's update is there.
    assert_eq!(on_disk(&dir), before);
    assert_eq!(scan(&dir), model);
    maintainer.maintain(P, &[], &[]).unwrap();
    assert_eq!(scan(&dir), model);
    assert_eq!(total(&dir, "total-data-files"), 1);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_commit_that_loses_the_race_to_a_compaction_still_applies_its_changes() {
    let dir = root("lost-to-compaction");
    let mut model = written(&dir, 6);
    // The writer knows the table as of its own last commit ...
    let mut writer = sink(&dir, &[]);
    commit(&mut writer, &mut model, 6);
    // ... then another process compacts every file it knows away ...
    sink(&dir, &[])
        .maintain(P, &[], &strings(&["compact"]))
        .unwrap();
    assert_eq!(total(&dir, "total-data-files"), 1);
    // ... and the writer's next commit, which updates and deletes keys of
    // those files, loses the race for the version and commits after it.
    for n in 7..10 {
        commit(&mut writer, &mut model, n);
        assert_eq!(scan(&dir), model, "commit {n}");
    }
    assert_eq!(writer.committed(P, T).unwrap(), last_position(9));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_commit_that_loses_the_race_to_a_compaction_that_kept_the_file_counts_still_applies() {
    let dir = root("lost-to-count-keeping-compaction");
    let partitioned = [("partition.sales.orders", "bucket(2, id)")];
    let mut model = Model::new();
    // One commit: one data file in each of the two partitions, no deletes.
    let mut writer = sink(&dir, &partitioned);
    let keys = 0..8i64;
    let insert = keys
        .clone()
        .map(|k| (k, Op::Insert, Some(format!("a-{k}"))));
    commit_rows(&mut writer, &mut model, 0, insert.collect());
    let counts = || {
        (
            total(&dir, "total-data-files"),
            total(&dir, "total-delete-files"),
        )
    };
    assert_eq!(
        counts(),
        (2, 0),
        "the set-up wants a file in each partition"
    );
    // Our compaction leaves a file alone in its partition be ...
    let replaced = metadata(&dir).current_snapshot().unwrap().snapshot_id();
    let report = sink(&dir, &partitioned)
        .maintain(P, &[], &strings(&["compact"]))
        .unwrap();
    assert!(
        report.contains("no data files worth compacting"),
        "{report}"
    );
    let now = metadata(&dir);
    assert_eq!(now.current_snapshot().unwrap().snapshot_id(), replaced);
    // ... but another engine may rewrite both files, one per partition (to
    // sort them, say): a `replace` that leaves the table's file and
    // delete-file counts as they were.
    let maintainer = sink(&dir, &[]);
    let settings = maintainer.sink().settings.as_ref().unwrap();
    let policy = Policy::default();
    let round = weir_sdk::native::with_blob_root(&dir, || {
        let work = TableWork {
            settings,
            path: "sales/orders",
            policy: &policy,
        };
        let base = settings.catalog.load("sales/orders").unwrap().unwrap();
        runtime().block_on(work.rewrite_every_file(&base)).unwrap()
    });
    assert!(matches!(round, Round::Committed { .. }));
    let now = metadata(&dir);
    let snapshot = now.current_snapshot().unwrap();
    assert_ne!(snapshot.snapshot_id(), replaced, "nothing was compacted");
    assert_eq!(snapshot.summary().operation, Operation::Replace);
    assert_eq!(counts(), (2, 0), "the compaction changed the file counts");
    // The writer, which knows the table as it was, updates every key: its
    // position deletes name the files the compaction removed, so it must
    // compute them again against the new ones.
    let update = keys.map(|k| (k, Op::Update, Some(format!("b-{k}"))));
    commit_rows(&mut writer, &mut model, 1, update.collect());
    assert_eq!(scan(&dir), model);
    assert_eq!(writer.committed(P, T).unwrap(), last_position(1));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_commit_after_another_process_expired_every_snapshot_it_knew_still_applies() {
    let dir = root("expired-under-writer");
    let mut model = written(&dir, 6);
    // The writer knows the table (and holds a key index) as of its own
    // last commit ...
    let mut writer = sink(&dir, &[]);
    commit(&mut writer, &mut model, 6);
    // ... then another process compacts, and expires every snapshot but
    // the compaction's, deleting the manifest lists and manifests the
    // writer's loaded version names ...
    sink(
        &dir,
        &[
            ("expire_snapshots_older_than", "0s"),
            ("keep_snapshots", "1"),
        ],
    )
    .maintain(P, &[], &[])
    .unwrap();
    assert_eq!(
        metadata(&dir).snapshots().count(),
        1,
        "the expiry left older snapshots"
    );
    // ... and the writer's next commits, whose first reads a file that is
    // gone, retry from the newest version (retryable, never fatal).
    for n in 7..10 {
        commit(&mut writer, &mut model, n);
        assert_eq!(scan(&dir), model, "commit {n}");
    }
    assert_eq!(writer.committed(P, T).unwrap(), last_position(9));
    let _ = std::fs::remove_dir_all(&dir);
}

/// Runs `what` on a fresh table once per blob write, crashing at that write,
/// until a run needs no crash; after each crash the table reads exactly the
/// model and a retry completes. Returns how many writes the run makes.
fn crash_at_every_write(name: &str, what: &str, policy: &[(&str, &str)]) -> u64 {
    const COMMITS: u32 = 6;
    for at in 1..=60 {
        let dir = root(&format!("{name}-{at}"));
        let model = written(&dir, COMMITS);
        let mut s = sink(&dir, policy);
        if what == "expire" {
            // So that expiry has data, delete files and manifests to delete.
            s.maintain(P, &[], &strings(&["compact"])).unwrap();
        }
        s.crash_at_write(at);
        let result = s.maintain(P, &[], &strings(&[what]));
        let (crashed, writes) = s.crashed();
        drop(s);
        if !crashed {
            result.unwrap();
            let _ = std::fs::remove_dir_all(&dir);
            return writes;
        }
        // A crash at the version hint (or a delete after the commit) is one
        // the run survives: it only lost a hint or left garbage.
        if let Err(e) = &result {
            assert!(e.to_string().contains("crashed here"), "{e}");
        }
        let label = format!("{what}, crash at write {at}");
        assert_eq!(scan(&dir), model, "{label}");
        let mut fresh = sink(&dir, policy);
        assert_eq!(
            fresh.committed(P, T).unwrap(),
            last_position(COMMITS - 1),
            "{label}"
        );
        fresh.maintain(P, &[], &strings(&[what])).unwrap();
        assert_eq!(scan(&dir), model, "{label}, retried");
        match what {
            "compact" => assert_eq!(total(&dir, "total-data-files"), 1, "{label}"),
            _ => assert_eq!(metadata(&dir).snapshots().count(), 1, "{label}"),
        }
        // Whatever the crash left unreferenced, nothing referenced is gone.
        let left = on_disk(&dir);
        assert!(referenced(&dir).is_subset(&left), "{label}");
        // An expiry records what it deletes right after its commit (write 1)
        // and the version hint (write 2): interrupted anywhere else, the
        // retry finishes the deletes and leaves exactly what is referenced.
        if what == "expire" && !(2..=3).contains(&at) {
            assert_eq!(left, referenced(&dir), "{label}");
            assert!(
                !dir.join("_weir/expired/sales/orders")
                    .read_dir()
                    .is_ok_and(|mut d| d.next().is_some()),
                "{label}"
            );
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
    panic!("{what} still crashed after 60 writes");
}

#[test]
fn a_crash_at_any_write_of_a_compaction_leaves_the_table_exact() {
    let writes = crash_at_every_write("crash-compact", "compact", &[]);
    // Data file, rewritten manifests, added manifest, list, metadata, hint.
    assert!(writes >= 5, "{writes} writes");
}

#[test]
fn a_crash_at_any_write_of_an_expiry_leaves_the_table_exact() {
    let policy = [
        ("expire_snapshots_older_than", "0s"),
        ("keep_snapshots", "1"),
    ];
    let writes = crash_at_every_write("crash-expire", "expire", &policy);
    // Metadata, hint, then one delete per file only the expired snapshots
    // referenced: data and delete files, manifests, manifest lists.
    assert!(writes > 20, "{writes} writes");
}

#[test]
fn retention_parses() {
    assert_eq!(
        parse_retention("7d").unwrap(),
        Some(std::time::Duration::from_secs(7 * 86400))
    );
    assert_eq!(
        parse_retention("12h").unwrap(),
        Some(std::time::Duration::from_secs(12 * 3600))
    );
    assert_eq!(
        parse_retention("0s").unwrap(),
        Some(std::time::Duration::ZERO)
    );
    assert_eq!(parse_retention("never").unwrap(), None);
    assert!(parse_retention("7").is_err());
    assert!(parse_retention("d").is_err());
    assert!(parse_retention("1.5h").is_err());
}
