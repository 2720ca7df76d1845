//! hello-sink: the smallest useful weir sink.
//!
//! Every committed batch becomes one JSON Lines file, `<table>/<batch id>.jsonl`,
//! one object per row: the table's columns plus `op` (`insert`, `update`,
//! `delete` or `read`).

use std::collections::HashMap;
use std::sync::Arc;

use weir_sdk::arrow_array::{ArrayRef, StringArray};
use weir_sdk::arrow_schema::{DataType, Field, Schema};
use weir_sdk::{Batch, CommitRequest, Config, RecordBatch, Result, Sink, SinkError, blob};

/// The sink; the host creates one with `Default`.
#[derive(Default)]
pub struct HelloSink {
    // Nothing may become visible before `commit`, so `write` only stages.
    staged: HashMap<String, Vec<Batch>>,
}

impl Sink for HelloSink {
    // hello-sink has no settings: any key the operator wrote is a mistake
    // worth stopping the pipeline for, not one to ignore.
    fn open(&mut self, _pipeline: &str, config: &Config) -> Result<()> {
        config.reject_unknown(&[])
    }

    fn write(&mut self, batch: Batch) -> Result<()> {
        let table = batch.table.name.clone();
        self.staged.entry(table).or_default().push(batch);
        Ok(())
    }

    fn commit(&mut self, request: CommitRequest) -> Result<()> {
        for batch in self.staged.get(&request.table).into_iter().flatten() {
            // Named after the batch id: a batch replayed after a crash
            // overwrites its file instead of adding a duplicate.
            let path = format!("{}/{}.jsonl", batch.table.name, batch.id);
            // `?` turns a failed put into an error the host understands:
            // a store hiccup is retried, a denied path stops the pipeline.
            blob::put(&path, &to_json_lines(batch)?)?;
        }
        // Drop the staged batches only once all of them are durable: if a put
        // failed, the host retries the commit and we write them again.
        self.staged.remove(&request.table);
        Ok(())
    }

    fn abort(&mut self, table: &str) {
        self.staged.remove(table);
    }
}

/// The batch's data columns plus `op`, one JSON object per line.
fn to_json_lines(batch: &Batch) -> Result<Vec<u8>> {
    // `data()` leaves out the control columns `__op` and `__pos`.
    let data = batch.data();
    let ops: StringArray = batch.ops().iter().map(|op| Some(op.as_str())).collect();

    let mut fields = data.schema().fields().to_vec();
    fields.push(Arc::new(Field::new("op", DataType::Utf8, false)));
    let mut columns = data.columns().to_vec();
    columns.push(Arc::new(ops) as ArrayRef);

    // A value JSON cannot hold is a poison batch: retrying will not help.
    let poison = |e: weir_sdk::arrow_schema::ArrowError| {
        SinkError::Poison(format!("batch {} of {}: {e}", batch.id, batch.table.name))
    };
    let rows = RecordBatch::try_new(Arc::new(Schema::new(fields)), columns).map_err(poison)?;
    let mut writer = arrow_json::LineDelimitedWriter::new(Vec::new());
    writer.write(&rows).map_err(poison)?;
    writer.finish().map_err(poison)?;
    Ok(writer.into_inner())
}

weir_sdk::export_sink!(HelloSink);

#[cfg(test)]
mod tests {
    use weir_sdk::arrow_array::{BinaryArray, Int64Array};
    use weir_sdk::native::{NativeSink, encode_ipc};
    use weir_sdk::{BatchMeta, Table};

    use super::*;

    #[test]
    fn writes_json_lines_at_commit() {
        let root = std::env::temp_dir().join(format!("hello-sink-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let mut sink = NativeSink::new(HelloSink::default(), &root);
        sink.open("p", &[]).unwrap();

        let rows = RecordBatch::try_from_iter([
            ("id", Arc::new(Int64Array::from(vec![1, 2])) as ArrayRef),
            (
                "__op",
                Arc::new(StringArray::from(vec!["insert", "delete"])) as ArrayRef,
            ),
            (
                "__pos",
                Arc::new(BinaryArray::from_iter_values([[1u8], [2]])) as ArrayRef,
            ),
        ])
        .unwrap();
        let meta = BatchMeta {
            table: Table::new("orders"),
            id: "b1".into(),
            low: vec![1],
            high: vec![2],
            rows: 2,
        };
        sink.write(meta, &encode_ipc(&rows)).unwrap();
        sink.commit(CommitRequest {
            table: "orders".into(),
            high: vec![2],
            pipeline: "p".into(),
            epoch: 1,
        })
        .unwrap();

        let written = std::fs::read_to_string(root.join("orders/b1.jsonl")).unwrap();
        assert_eq!(
            written,
            "{\"id\":1,\"op\":\"insert\"}\n{\"id\":2,\"op\":\"delete\"}\n"
        );
        let _ = std::fs::remove_dir_all(&root);
    }
}
