//! The null sink: every batch crosses the host/plugin boundary and is decoded
//! from Arrow IPC (the SDK does that before `write` sees it), then dropped.
//! What a pipeline achieves into it is what the source, the batcher, the
//! commit core and the WebAssembly boundary cost, with no destination at all.
//! Benchmarks only: it keeps no data, so it has nothing to be exactly-once
//! about.

use weir_sdk::{Batch, CommitRequest, Result, Sink};

#[derive(Default)]
pub struct NullSink {
    rows: u64,
}

impl Sink for NullSink {
    fn write(&mut self, batch: Batch) -> Result<()> {
        // Touch the decoded rows so the work cannot be skipped.
        self.rows += std::hint::black_box(batch.num_rows()) as u64;
        Ok(())
    }

    fn commit(&mut self, _request: CommitRequest) -> Result<()> {
        Ok(())
    }
}

weir_sdk::export_sink!(NullSink);
