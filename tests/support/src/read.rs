//! Reading back what sinks wrote, with readers we did not write (arrow-ipc,
//! parquet), as the changes they hold.

use std::path::{Path, PathBuf};

use arrow_array::cast::AsArray;
use arrow_array::{Array, RecordBatch};
use weir_contract::{OP_COLUMN, POS_COLUMN};
pub use weir_source::batch::value_at;
use weir_source::change::{Op, TableSchema, Value};

/// Reads every Arrow IPC file the positioned fixture committed for a table,
/// in commit order.
pub fn read_positioned(root: &Path, table: &str) -> Vec<RecordBatch> {
    let dir = root.join(table);
    let mut files: Vec<PathBuf> = match std::fs::read_dir(&dir) {
        Ok(entries) => entries.map(|e| e.unwrap().path()).collect(),
        Err(_) => return Vec::new(),
    };
    files.retain(|p| p.extension().is_some_and(|e| e == "arrow"));
    files.sort();
    let mut out = Vec::new();
    for file in files {
        let reader =
            arrow_ipc::reader::FileReader::try_new(std::fs::File::open(&file).unwrap(), None)
                .unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        for batch in reader {
            out.push(batch.unwrap());
        }
    }
    out
}

/// Reads every Parquet file the Parquet sink wrote for a destination table.
pub fn read_parquet(root: &Path, destination: &str) -> Vec<RecordBatch> {
    let dir = root.join(destination.replace('.', "/"));
    let mut files = Vec::new();
    collect_files(&dir, "parquet", &mut files);
    files.sort();
    let mut out = Vec::new();
    for file in files {
        let reader = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(
            std::fs::File::open(&file).unwrap(),
        )
        .unwrap()
        .build()
        .unwrap();
        for batch in reader {
            out.push(batch.unwrap());
        }
    }
    out
}

fn collect_files(dir: &Path, ext: &str, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries {
        let path = entry.unwrap().path();
        if path.is_dir() {
            collect_files(&path, ext, out);
        } else if path.extension().is_some_and(|e| e == ext) {
            out.push(path);
        }
    }
}

/// One change read back from a destination.
#[derive(Clone, Debug)]
pub struct ReadChange {
    pub op: Op,
    pub pos: Vec<u8>,
    pub values: Vec<Value>,
}

fn parse_op(text: &str) -> Op {
    [Op::Insert, Op::Update, Op::Delete, Op::Read]
        .into_iter()
        .find(|op| op.as_str() == text)
        .unwrap_or_else(|| panic!("unknown operation {text:?} in {OP_COLUMN}"))
}

/// Every row of the batches as a change, with the table's columns decoded.
pub fn changes(table: &TableSchema, batches: &[RecordBatch]) -> Vec<ReadChange> {
    let mut out = Vec::new();
    for batch in batches {
        if batch.num_rows() == 0 {
            continue;
        }
        let ops = batch.column_by_name(OP_COLUMN).expect("__op column");
        let ops = ops.as_string::<i32>();
        let positions = batch.column_by_name(POS_COLUMN).expect("__pos column");
        let positions = positions.as_binary::<i32>();
        let columns: Vec<&dyn Array> = table
            .columns
            .iter()
            .map(|c| {
                batch
                    .column_by_name(&c.name)
                    .unwrap_or_else(|| panic!("{}: column {} missing", table.name, c.name))
                    .as_ref()
            })
            .collect();
        for row in 0..batch.num_rows() {
            out.push(ReadChange {
                op: parse_op(ops.value(row)),
                pos: positions.value(row).to_vec(),
                values: columns.iter().map(|a| value_at(*a, row)).collect(),
            });
        }
    }
    out
}

/// How many commits the positioned fixture made under one root, over every
/// generator table, read cheaply enough to poll: the fixture writes commit
/// `n` of a table as `<table>/<n, 20 digits>.arrow` and never skips a
/// number, so each poll only looks for the files after the last one seen.
pub struct PositionedCommits {
    root: PathBuf,
    /// Per table: its name and the highest commit number seen.
    tables: Vec<(String, u64)>,
}

impl PositionedCommits {
    pub fn new(root: &Path) -> Self {
        PositionedCommits {
            root: root.to_path_buf(),
            tables: weir_source::generator::oracle::shop_tables()
                .iter()
                .map(|table| (table.name.clone(), 0))
                .collect(),
        }
    }

    /// The commits made so far, over every table.
    pub fn count(&mut self) -> u64 {
        for (table, seen) in &mut self.tables {
            let dir = self.root.join(table.as_str());
            while dir.join(format!("{:020}.arrow", *seen + 1)).exists() {
                *seen += 1;
            }
        }
        self.tables.iter().map(|(_, seen)| seen).sum()
    }
}
