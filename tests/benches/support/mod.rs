//! What both sink benchmarks feed a sink: the generator's changes batched as
//! the host would batch them, already encoded as Arrow IPC.

use std::time::Duration;

use weir::batch::{BatchLimits, Batcher};
use weir::pipeline::encode_ipc;
use weir::runtime::bindings::v0_1_0::types as wit;
use weir::source::Source;
use weir::source::generator::{Generator, GeneratorConfig};

pub struct Prepared {
    pub meta: wit::Batch,
    pub ipc: Vec<u8>,
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
                meta: wit::Batch {
                    table: wit::Table {
                        name: batch.table.name.clone(),
                        key_columns: batch.table.key_names(),
                        mode: "upsert".into(),
                        destination: batch.table.name.clone(),
                        metadata: Vec::new(),
                    },
                    id: batch.id.clone(),
                    low: batch.low.as_bytes().to_vec(),
                    high: batch.high.as_bytes().to_vec(),
                    rows: batch.rows() as u32,
                },
                ipc: encode_ipc(&batch.records).unwrap(),
            });
        }
    }
    (out, rows)
}
