//! What both sink benchmarks feed a sink: the generator's changes batched as
//! the host would batch them, already encoded as Arrow IPC.

use std::sync::Arc;
use std::time::Duration;

use weir::batch::{BatchLimits, Batcher};
use weir::runtime::{BatchHeader, CommitRequest, TableDescription};
use weir::source::Source;
use weir::source::generator::{Generator, GeneratorConfig};
use weir_sdk::native::encode_ipc;

pub struct Prepared {
    pub header: BatchHeader,
    pub ipc: Vec<u8>,
}

impl Prepared {
    /// The commit that follows the batch, for the wasmtime host.
    pub fn commit_request(&self) -> CommitRequest {
        CommitRequest {
            table: self.header.table.name.clone(),
            high: self.header.high.clone(),
            pipeline: "bench".into(),
            epoch: 1,
        }
    }

    /// The batch's header as the SDK's native runner takes it.
    pub fn native_meta(&self) -> weir_sdk::BatchMeta {
        let table = &self.header.table;
        weir_sdk::BatchMeta {
            table: weir_sdk::Table {
                name: table.name.clone(),
                key_columns: table.key_columns.clone(),
                mode: table.mode,
                destination: table.destination.clone(),
                metadata: Vec::new(),
            },
            id: self.header.id.clone(),
            low: self.header.low.as_bytes().to_vec(),
            high: self.header.high.as_bytes().to_vec(),
            rows: self.header.rows,
        }
    }

    /// The commit that follows the batch, for the native runner.
    pub fn native_commit(&self) -> weir_sdk::CommitRequest {
        weir_sdk::CommitRequest {
            table: self.header.table.name.clone(),
            high: self.header.high.as_bytes().to_vec(),
            pipeline: "bench".into(),
            epoch: 1,
        }
    }
}

/// Upsert-mode batches of `changes` generator changes and their row count.
pub fn prepare(changes: u64, max_rows: usize) -> (Vec<Prepared>, usize) {
    let mut source = Generator::new(GeneratorConfig {
        seed: 99,
        max_changes: Some(changes),
    });
    let mut batcher = Batcher::new(
        source.tables(),
        BatchLimits {
            max_rows,
            max_bytes: 64 << 20,
            linger: Duration::from_secs(3600),
        },
        Vec::new(),
    );
    let mut flushes = Vec::new();
    while let Some(tx) = source.next_transaction().unwrap() {
        flushes.extend(batcher.push(tx).unwrap());
    }
    flushes.extend(batcher.flush(false));
    let mut out = Vec::new();
    let mut rows = 0;
    for flush in flushes {
        for batch in flush.batches {
            rows += batch.rows();
            out.push(Prepared {
                header: BatchHeader {
                    table: Arc::new(TableDescription {
                        name: batch.table.name.clone(),
                        key_columns: batch.table.key_names(),
                        mode: weir_sdk::Mode::Upsert,
                        destination: batch.table.name.clone(),
                        metadata: Vec::new(),
                    }),
                    id: batch.id.clone(),
                    low: batch.low.clone(),
                    high: batch.high.clone(),
                    rows: batch.rows() as u32,
                },
                ipc: encode_ipc(&batch.records),
            });
        }
    }
    (out, rows)
}
