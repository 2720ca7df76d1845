//! What weir's tests share, so that every test means the same thing by
//! "the expected state", "the rows a sink holds" or "a pipeline":
//!
//! - the generator's oracle and the one reducer (`apply_change`), from
//!   the `weir` crate's `test-support` feature;
//! - [`pipeline`]: pipeline configs built as values, not text;
//! - [`command`]: the built `weir` binary and plugins, and running them;
//! - [`read`]: reading what sinks wrote with readers we did not write;
//! - [`expect`]: comparing that with the oracle;
//! - [`batches`]: record batches as the host hands them to a sink;
//! - [`kill`]: when crash tests kill the host;
//! - [`measure`]: a child's own CPU time and peak memory (feature `host`);
//! - [`redis`]: a private `redis-server` per test, and what the Redis sink
//!   wrote read back and compared with the oracle;
//! - [`iceberg_rest`]: a private Iceberg REST catalog per test (pyiceberg's
//!   `SqlCatalog` behind the REST protocol, with fault injection), and
//!   tables read back through it with pyiceberg and DuckDB;
//! - [`serve`]: `weir serve` per test, its admin API, and new versions of
//!   a plugin to swap in (feature `serve`, on by default).
//!
//! The default feature `host` brings in the `weir` crate (oracle, readers,
//! expectations); without it the crate is light enough for a sink's own tests.

pub mod batches;
pub mod command;
#[cfg(feature = "serve")]
pub mod etcd;
#[cfg(feature = "host")]
pub mod expect;
pub mod iceberg_rest;
pub mod kill;
#[cfg(feature = "host")]
pub mod measure;
pub mod moto;
pub mod pipeline;
#[cfg(feature = "host")]
pub mod read;
pub mod redis;
#[cfg(feature = "serve")]
pub mod serve;

pub use self::redis::RedisServer;
#[cfg(feature = "host")]
pub use self::redis::{RedisContent, RedisView, StoredRow};
pub use batches::BatchBuilder;
pub use command::{
    plugin, plugin_target_dir, positions_of, run_killed_at, shared_component_cache, sink_progress,
    status, text, weir, weir_bin, weir_command, workspace,
};
#[cfg(feature = "host")]
pub use expect::{
    OracleDifferences, Reduced, assert_parquet_complete, assert_positioned_exact,
    assert_table_matches, positioned_differences, reduce,
};
pub use kill::{KillSchedule, depth};
pub use pipeline::{PipelineBuilder, SinkBuilder, TableMode};
#[cfg(feature = "host")]
pub use read::{PositionedCommits, ReadChange, changes, read_parquet, read_positioned, value_at};
#[cfg(feature = "serve")]
pub use serve::{
    Reply, ServeHost, Tenant, pipeline_path, sha256_hex, with_custom_section, with_extra_memories,
};
#[cfg(feature = "host")]
pub use weir_source::generator::oracle::{
    ExpectedState, KeyPart, Rows, apply_change, change_log, expected_state, row_key, shop_tables,
};
