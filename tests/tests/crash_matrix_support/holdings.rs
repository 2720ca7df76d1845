//! What a destination holds and what the source of truth says it should,
//! both as rows of canonical strings (tests/readers/read_iceberg.py's
//! forms), so one comparison serves every source and every sink and counts
//! duplicates, gaps and resurrected deletes instead of stopping at the
//! first difference.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;

use arrow_array::RecordBatch;
use arrow_array::cast::AsArray;
use weir_source::change::Op;
/// The context columns every change log carries (weir-contract's names).
const OP_COLUMN: &str = "__op";
const POS_COLUMN: &str = "__pos";

use crate::common;
use crate::iceberg_support::{Lake, Read, canonical_arrow, canonical_value, python, read_native};

/// A row: one canonical value per column of the source table, None for null.
pub type Row = Vec<Option<String>>;
/// The key columns' canonical values.
pub type Key = Vec<Option<String>>;

/// A source table as the matrix compares it: its name and columns, and
/// which of them form the key.
#[derive(Clone, Debug)]
pub struct TableShape {
    pub name: String,
    pub columns: Vec<String>,
    pub key: Vec<usize>,
}

impl TableShape {
    pub fn key_of(&self, row: &Row) -> Key {
        self.key.iter().map(|&i| row[i].clone()).collect()
    }
}

/// One table as a destination holds it.
#[derive(Default, Debug)]
pub struct Held {
    /// The table's rows by key, after applying a change log in position
    /// order (change-log sinks) or as read (Iceberg upsert tables).
    pub state: BTreeMap<Key, Row>,
    /// Changes held more than once (same position), or keys held more than
    /// once (a table that mirrors the source).
    pub duplicates: usize,
    /// Every position held, where the destination keeps one per change.
    pub positions: Option<BTreeSet<Vec<u8>>>,
}

/// One table as the source of truth has it.
#[derive(Default, Debug)]
pub struct Truth {
    pub state: BTreeMap<Key, Row>,
    /// Every key the table ever had (to tell a resurrected delete from a
    /// row nobody wrote), where the truth knows its history.
    pub ever: Option<BTreeSet<Key>>,
    /// Every change's position, where the truth knows them (the generator):
    /// a destination must hold no other.
    pub positions: Option<BTreeSet<Vec<u8>>>,
}

/// What comparing one destination table with the truth found.
#[derive(Clone, Copy, Default, Debug, PartialEq, Eq)]
pub struct Differences {
    pub duplicates: usize,
    /// Rows of the source the destination lacks or holds an older value
    /// of: a change that never arrived.
    pub gaps: usize,
    /// Keys the source deleted that the destination holds again.
    pub resurrected: usize,
    /// Keys or change positions the source never had.
    pub phantoms: usize,
}

impl std::ops::AddAssign for Differences {
    fn add_assign(&mut self, other: Self) {
        self.duplicates += other.duplicates;
        self.gaps += other.gaps;
        self.resurrected += other.resurrected;
        self.phantoms += other.phantoms;
    }
}

/// Compares a table a destination holds with the truth. With `partial`
/// (a backfill cut short), keys the destination does not hold yet are not
/// gaps; everything it does hold must still be right.
///
/// Gaps are counted on the rows, not on positions: the batcher keeps only
/// the last change per key of a batch, so a change log rightly lacks the
/// positions of changes that a later one in the same batch replaced.
pub fn compare(truth: &Truth, held: &Held, partial: bool) -> Differences {
    let mut found = Differences {
        duplicates: held.duplicates,
        ..Differences::default()
    };
    for (key, row) in &truth.state {
        match held.state.get(key) {
            Some(got) if got == row => {}
            None if partial => {}
            _ => found.gaps += 1,
        }
    }
    for key in held.state.keys() {
        if truth.state.contains_key(key) {
            continue;
        }
        match &truth.ever {
            Some(ever) if !ever.contains(key) => found.phantoms += 1,
            _ => found.resurrected += 1,
        }
    }
    // A position the source never produced is a change nobody made.
    if let (Some(want), Some(have)) = (&truth.positions, &held.positions) {
        found.phantoms += have.difference(want).count();
    }
    found
}

/// Applies one change to a table's rows: a delete removes the key, any
/// other change puts the row.
pub fn apply(state: &mut BTreeMap<Key, Row>, key: Key, deleted: bool, row: Row) {
    if deleted {
        state.remove(&key);
    } else {
        state.insert(key, row);
    }
}

/// Reads a change log (the positioned fixture's Arrow files, the Parquet
/// sink's files): every row with `__op` and `__pos`, reduced in position
/// order; duplicates are positions seen twice.
pub fn held_from_change_log(shape: &TableShape, batches: &[RecordBatch]) -> Held {
    let delete = Op::Delete.as_str();
    let mut log: Vec<(Vec<u8>, bool, Row)> = Vec::new();
    for batch in batches.iter().filter(|b| b.num_rows() > 0) {
        let ops = batch.column_by_name(OP_COLUMN).expect("__op column");
        let ops = ops.as_string::<i32>();
        let positions = batch.column_by_name(POS_COLUMN).expect("__pos column");
        let positions = positions.as_binary::<i32>();
        let columns: Vec<_> = shape
            .columns
            .iter()
            .map(|c| {
                batch
                    .column_by_name(c)
                    .unwrap_or_else(|| panic!("{}: column {c} missing", shape.name))
            })
            .collect();
        for row in 0..batch.num_rows() {
            let values = columns
                .iter()
                .map(|a| canonical_arrow(a.as_ref(), row))
                .collect();
            log.push((
                positions.value(row).to_vec(),
                ops.value(row) == delete,
                values,
            ));
        }
    }
    log.sort_by(|a, b| a.0.cmp(&b.0));
    let before = log.len();
    log.dedup_by(|a, b| a.0 == b.0);
    let mut held = Held {
        duplicates: before - log.len(),
        positions: Some(log.iter().map(|c| c.0.clone()).collect()),
        ..Held::default()
    };
    for (_, deleted, row) in log {
        apply(&mut held.state, shape.key_of(&row), deleted, row);
    }
    held
}

/// Every table of an Iceberg lake, read by `reader`: `duckdb` (DuckDB's
/// iceberg extension) or `pyiceberg`, each with all tables in one Python
/// process, or `native` (the `iceberg` crate). Upsert tables are position
/// deletes by default, which all three read. A table without metadata
/// holds nothing.
pub fn held_in_iceberg(lake: &Lake, shapes: &[TableShape], reader: &str) -> Vec<Held> {
    let metadata: Vec<Option<std::path::PathBuf>> =
        shapes.iter().map(|s| lake.metadata(&s.name)).collect();
    let present: Vec<&std::path::PathBuf> = metadata.iter().flatten().collect();
    let reads: Vec<Read> = match reader {
        _ if present.is_empty() => Vec::new(),
        "native" => present.iter().map(|m| read_native(m)).collect(),
        "duckdb" | "pyiceberg" => read_with_python(lake, reader, &present),
        other => panic!("no Iceberg reader {other}"),
    };
    let mut reads = reads.into_iter();
    shapes
        .iter()
        .zip(&metadata)
        .map(|(shape, metadata)| {
            if metadata.is_none() {
                return Held::default();
            }
            let read = reads.next().expect("one read per table");
            let mut held = Held::default();
            for values in read.project(&shape.columns) {
                if held.state.insert(shape.key_of(&values), values).is_some() {
                    held.duplicates += 1;
                }
            }
            held
        })
        .collect()
}

/// Reads the tables with `reader` (`duckdb` or `pyiceberg`) in one Python
/// process.
fn read_with_python(lake: &Lake, reader: &str, metadata: &[&std::path::PathBuf]) -> Vec<Read> {
    let script =
        common::workspace().join("tests/tests/crash_matrix_support/read_iceberg_tables.py");
    let out = Command::new(python())
        .arg(script)
        .arg(reader)
        .args(metadata)
        .output()
        .expect("python runs");
    assert!(
        out.status.success(),
        "{reader} could not read the lake at {}: {}",
        lake.root.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("reader JSON");
    let text = |v: &serde_json::Value| v.as_str().map(str::to_string);
    json.as_array()
        .expect("a list of tables")
        .iter()
        .map(|table| Read {
            columns: table["columns"]
                .as_array()
                .unwrap()
                .iter()
                .map(|c| c.as_str().unwrap().to_string())
                .collect(),
            rows: table["rows"]
                .as_array()
                .unwrap()
                .iter()
                .map(|r| r.as_array().unwrap().iter().map(text).collect())
                .collect(),
        })
        .collect()
}

/// The generator's tables.
pub fn generator_shapes() -> Vec<TableShape> {
    common::tables()
        .iter()
        .map(|t| TableShape {
            name: t.name.clone(),
            columns: t.columns.iter().map(|c| c.name.clone()).collect(),
            key: t.key.clone(),
        })
        .collect()
}

/// The truth of the generator stream `(seed, max_changes)`: each table's
/// final rows, every key it ever had, every change's position.
pub fn generator_truth(seed: u64, max_changes: u64) -> BTreeMap<String, Truth> {
    let mut truth: BTreeMap<String, Truth> = common::tables()
        .iter()
        .map(|t| {
            let empty = Truth {
                ever: Some(BTreeSet::new()),
                positions: Some(BTreeSet::new()),
                ..Truth::default()
            };
            (t.name.clone(), empty)
        })
        .collect();
    for change in common::change_log(seed, max_changes) {
        let table = &change.table;
        let row: Row = table
            .columns
            .iter()
            .zip(&change.values)
            .map(|(c, v)| canonical_value(v, &c.data_type))
            .collect();
        let key: Key = table.key.iter().map(|&i| row[i].clone()).collect();
        let entry = truth.get_mut(&table.name).expect("a generator table");
        entry.ever.as_mut().unwrap().insert(key.clone());
        entry
            .positions
            .as_mut()
            .unwrap()
            .insert(change.pos.as_bytes().to_vec());
        apply(&mut entry.state, key, change.op == Op::Delete, row);
    }
    truth
}

/// What the positioned fixture under `root` holds for `shape`.
pub fn held_in_positioned(root: &Path, shape: &TableShape) -> Held {
    held_from_change_log(shape, &common::read_positioned(root, &shape.name))
}

/// What the Parquet sink under `root` holds for `shape`.
pub fn held_in_parquet(root: &Path, shape: &TableShape) -> Held {
    held_from_change_log(shape, &common::read_parquet(root, &shape.name))
}
