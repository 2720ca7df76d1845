//! What the end-to-end test files share beyond `weir-test-support`: the
//! sink presets they use. Everything of the support crate is re-exported,
//! so a test file needs only `use common::*`.

#![allow(dead_code, unused_imports)]

use std::path::{Path, PathBuf};

pub use weir_test_support::*;

/// The generator's tables, as the host sees them.
pub fn tables() -> Vec<std::sync::Arc<weir_source::change::TableSchema>> {
    shop_tables()
}

/// Where sink `name` of a pipeline in `dir` keeps its blobs.
pub fn sink_root(dir: &Path, name: &str) -> PathBuf {
    dir.join("out").join(name)
}

/// Sink `name` running the plugin crate `crate_name`, storing into
/// [`sink_root`], with the limits and single retry the tests assume.
pub fn sink(name: &str, crate_name: &str, dir: &Path) -> SinkBuilder {
    SinkBuilder::new(name, plugin(crate_name))
        .blob_store(&sink_root(dir, name))
        .limits(256, 30_000)
        .retries(1)
}

/// The generator stream `(seed, max_changes)` batched by `max_rows`, with
/// the linger and heartbeat the tests assume.
pub fn workload(seed: u64, max_changes: u64, max_rows: usize) -> PipelineBuilder {
    PipelineBuilder::generator(seed, max_changes)
        .max_rows(max_rows)
        .linger_ms(20)
        .heartbeat_ms(200)
}

/// A tenant's steady pipeline under `weir serve` while another tenant
/// attacks: the generator stream `(seed, max_changes)` at one change per
/// `pace_us`, into the positioned fixture as sink `sink`. Deployed again
/// with pace 0, it runs to its end at once.
pub fn paced_positioned(
    name: &str,
    sink: &str,
    seed: u64,
    max_changes: u64,
    pace_us: u64,
) -> PipelineBuilder {
    PipelineBuilder::generator(seed, max_changes)
        .name(name)
        .pace_us(pace_us)
        .max_rows(500)
        .linger_ms(200)
        .heartbeat_ms(200)
        .sink(
            SinkBuilder::new(sink, plugin("weir-fixture-positioned"))
                .limits(64, 30_000)
                .retries(1),
        )
}
