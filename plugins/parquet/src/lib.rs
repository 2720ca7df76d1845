//! Parquet files sink: every committed batch becomes one Parquet file.
//!
//! At-least-once, idempotent on replay. `write` stages batches in memory;
//! `commit` writes each staged batch of the table to
//! `[<prefix>/]<destination, '.' as '/'>/<batch id>.parquet` (snappy) with
//! `blob::put`. A replayed batch has the same id, so it overwrites its file
//! instead of adding one.
//!
//! Files keep every column, including the control columns `__op` and `__pos`:
//! together they are a change log. To read the table, take per key the row
//! with the greatest `__pos` (positions compare byte by byte) and drop keys
//! whose last operation is `delete`.
//!
//! Config keys:
//! - `prefix` (optional): folder under the granted root for all files.

use std::collections::HashMap;

use parquet::arrow::ArrowWriter;
use parquet::basic::Compression;
use parquet::file::properties::WriterProperties;
use sha2::{Digest, Sha256};
use weir_sdk::{Batch, CommitRequest, Config, RecordBatch, Result, Sink, SinkError, blob, log};

/// The sink. One instance per loaded plugin.
#[derive(Default)]
pub struct ParquetSink {
    /// Folder under the root, without leading or trailing `/`; may be empty.
    prefix: String,
    /// Batches written but not committed, per table name, in arrival order.
    staged: HashMap<String, Vec<Batch>>,
}

impl Sink for ParquetSink {
    fn open(&mut self, _pipeline: &str, config: &Config) -> Result<()> {
        let prefix = config.get("prefix").unwrap_or("").trim_matches('/');
        if prefix
            .split('/')
            .any(|s| (s.is_empty() && !prefix.is_empty()) || s == "." || s == "..")
            || prefix.contains('\\')
        {
            return Err(SinkError::Fatal(format!(
                "config key `prefix`: {prefix:?} is not a relative folder path"
            )));
        }
        self.prefix = prefix.to_string();
        Ok(())
    }

    fn write(&mut self, batch: Batch) -> Result<()> {
        self.staged
            .entry(batch.table.name.clone())
            .or_default()
            .push(batch);
        Ok(())
    }

    fn commit(&mut self, request: CommitRequest) -> Result<()> {
        let Some(batches) = self.staged.get(&request.table) else {
            return Ok(());
        };
        for batch in batches {
            // An empty batch only advances the position, which the host keeps.
            if batch.is_empty() {
                continue;
            }
            let path = self.object_path(batch);
            let file = encode(batch.records()).map_err(|e| {
                SinkError::Poison(format!(
                    "batch {} of table {}: cannot encode as Parquet: {e}",
                    batch.id, batch.table.name
                ))
            })?;
            blob::put(&path, &file)?;
            log::debug(format!(
                "{}: wrote {} rows to {path}",
                batch.table.name,
                batch.num_rows()
            ));
        }
        // Only now: on a failure above everything stays staged and a retry
        // rewrites the same paths.
        self.staged.remove(&request.table);
        Ok(())
    }

    fn abort(&mut self, table: &str) {
        self.staged.remove(table);
    }
}

impl ParquetSink {
    /// `[<prefix>/]<destination with '.' as '/'>/<batch id>.parquet`.
    fn object_path(&self, batch: &Batch) -> String {
        let folder = batch.table.destination.replace('.', "/");
        let name = file_stem(&batch.id);
        if self.prefix.is_empty() {
            format!("{folder}/{name}.parquet")
        } else {
            format!("{}/{folder}/{name}.parquet", self.prefix)
        }
    }
}

/// The batch id when it is a safe file name; otherwise (a `/`, a space, ...)
/// the hex SHA-256 of the id, which is just as deterministic.
fn file_stem(id: &str) -> String {
    let safe = !id.is_empty()
        && !id.starts_with('.')
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'+' | b'='));
    if safe {
        id.to_string()
    } else {
        hex::encode(Sha256::digest(id.as_bytes()))
    }
}

/// One Parquet file holding `records`, snappy-compressed.
fn encode(records: &RecordBatch) -> std::result::Result<Vec<u8>, parquet::errors::ParquetError> {
    let props = WriterProperties::builder()
        .set_compression(Compression::SNAPPY)
        .build();
    let mut writer = ArrowWriter::try_new(Vec::new(), records.schema(), Some(props))?;
    writer.write(records)?;
    writer.into_inner()
}

weir_sdk::export_sink!(ParquetSink);

#[cfg(test)]
mod tests {
    use std::fs::File;
    use std::path::{Path, PathBuf};
    use std::sync::Arc;

    use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
    use weir_sdk::arrow_array::{ArrayRef, BinaryArray, Int64Array, StringArray};
    use weir_sdk::native::{NativeSink, encode_ipc};
    use weir_sdk::{BatchMeta, Table};

    use super::*;

    fn root(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("weir-parquet-test-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    fn rows(ids: &[i64], ops: &[&str]) -> RecordBatch {
        let pos: Vec<Vec<u8>> = ids.iter().map(|i| i.to_be_bytes().to_vec()).collect();
        RecordBatch::try_from_iter([
            ("id", Arc::new(Int64Array::from(ids.to_vec())) as ArrayRef),
            (
                "__op",
                Arc::new(StringArray::from(ops.to_vec())) as ArrayRef,
            ),
            (
                "__pos",
                Arc::new(BinaryArray::from_iter_values(pos)) as ArrayRef,
            ),
        ])
        .unwrap()
    }

    fn meta(table: &str, id: &str, rb: &RecordBatch) -> BatchMeta {
        let mut t = Table::new(table);
        t.destination = "sales.orders".into();
        BatchMeta {
            table: t,
            id: id.into(),
            low: vec![0],
            high: vec![9],
            rows: rb.num_rows() as u32,
        }
    }

    fn commit(table: &str) -> CommitRequest {
        CommitRequest {
            table: table.into(),
            high: vec![9],
            pipeline: "p".into(),
            epoch: 1,
        }
    }

    fn files(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .map(|d| {
                d.map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default();
        names.sort();
        names
    }

    fn read(path: &Path) -> RecordBatch {
        let reader = ParquetRecordBatchReaderBuilder::try_new(File::open(path).unwrap())
            .unwrap()
            .build()
            .unwrap();
        let batches: Vec<RecordBatch> = reader.map(|b| b.unwrap()).collect();
        assert_eq!(batches.len(), 1);
        batches.into_iter().next().unwrap()
    }

    #[test]
    fn commit_writes_one_file_per_batch_with_all_columns() {
        let dir = root("commit");
        let mut sink = NativeSink::new(ParquetSink::default(), &dir);
        sink.open("p", &[("prefix".into(), "lake".into())]).unwrap();
        let a = rows(&[1, 2], &["insert", "update"]);
        let b = rows(&[1], &["delete"]);
        sink.write(meta("public.orders", "b1", &a), &encode_ipc(&a))
            .unwrap();
        sink.write(meta("public.orders", "b2", &b), &encode_ipc(&b))
            .unwrap();
        let out = dir.join("lake/sales/orders");
        // Nothing visible before commit.
        assert!(files(&out).is_empty());
        sink.commit(commit("public.orders")).unwrap();
        assert_eq!(files(&out), ["b1.parquet", "b2.parquet"]);
        assert_eq!(read(&out.join("b1.parquet")), a);
        assert_eq!(read(&out.join("b2.parquet")), b);
        // Staged data is gone: a second commit writes nothing new.
        std::fs::remove_file(out.join("b1.parquet")).unwrap();
        sink.commit(commit("public.orders")).unwrap();
        assert_eq!(files(&out), ["b2.parquet"]);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn replay_overwrites_and_empty_commit_writes_nothing() {
        let dir = root("replay");
        let mut sink = NativeSink::new(ParquetSink::default(), &dir);
        sink.open("p", &[]).unwrap();
        sink.commit(commit("public.orders")).unwrap();
        assert!(!dir.exists() || files(&dir).is_empty());

        let a = rows(&[1, 2], &["insert", "insert"]);
        for _ in 0..2 {
            sink.write(meta("public.orders", "b1", &a), &encode_ipc(&a))
                .unwrap();
            sink.commit(commit("public.orders")).unwrap();
        }
        assert_eq!(files(&dir.join("sales/orders")), ["b1.parquet"]);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn abort_drops_staged_and_tables_are_separate() {
        let dir = root("abort");
        let mut sink = NativeSink::new(ParquetSink::default(), &dir);
        sink.open("p", &[]).unwrap();
        let a = rows(&[1], &["insert"]);
        sink.write(meta("public.orders", "b1", &a), &encode_ipc(&a))
            .unwrap();
        let mut other = meta("public.items", "i1", &a);
        other.table.destination = "public.items".into();
        sink.write(other, &encode_ipc(&a)).unwrap();
        sink.abort("public.orders");
        sink.commit(commit("public.orders")).unwrap();
        assert!(files(&dir.join("sales/orders")).is_empty());
        sink.commit(commit("public.items")).unwrap();
        assert_eq!(files(&dir.join("public/items")), ["i1.parquet"]);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn unsafe_ids_are_hashed_and_bad_prefix_is_fatal() {
        assert_eq!(file_stem("orders-0001"), "orders-0001");
        assert_eq!(file_stem("a/b").len(), 64);
        assert_eq!(file_stem(".."), file_stem(".."));
        assert_ne!(file_stem(".."), "..");
        let mut sink = NativeSink::new(ParquetSink::default(), root("prefix"));
        let e = sink
            .open("p", &[("prefix".into(), "a/../b".into())])
            .unwrap_err();
        assert!(
            matches!(&e, SinkError::Fatal(m) if m.contains("prefix")),
            "{e}"
        );
    }
}
