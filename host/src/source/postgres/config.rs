//! The Postgres source's settings: `source.postgres` as a pipeline config
//! spells it, and the few pipeline-wide facts the source needs beside it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use serde::Deserialize;

/// `source.postgres` in a pipeline config.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PostgresConfig {
    /// libpq-style connection string or URL (`host=... user=... dbname=...`).
    pub dsn: String,
    /// The publication whose tables are replicated; created if missing
    /// (from `create_publication_for`).
    pub publication: String,
    /// The logical replication slot; created if missing on the first run.
    pub slot: String,
    /// Tables to create the publication for when it does not exist yet:
    /// `schema.table`, `schema.*` (every table of the schema) or `*` (every
    /// table of the database outside the system schemas).
    #[serde(default)]
    pub create_publication_for: Vec<String>,
    /// Key columns for tables without a primary key, by `schema.table`.
    #[serde(default)]
    pub keys: BTreeMap<String, Vec<String>>,
    /// Rows per backfill chunk.
    #[serde(default = "default_chunk_rows")]
    pub chunk_rows: usize,
    /// End the run once the stream has reached the WAL position the
    /// database had when the run started (for batch-style runs and tests).
    #[serde(default)]
    pub exit_when_caught_up: bool,
    /// How often the acknowledged position is reported to the server.
    #[serde(default = "default_status_interval_ms")]
    pub status_interval_ms: u64,
    /// When nothing arrived for this long, write a logical decoding message
    /// (`pg_logical_emit_message`) so that an idle or filtered database
    /// still moves the acknowledged position; 0 turns it off.
    #[serde(default = "default_heartbeat_ms")]
    pub heartbeat_ms: u64,
    /// How long to keep trying to reconnect after the server went away.
    #[serde(default = "default_reconnect_ms")]
    pub reconnect_timeout_ms: u64,
}

fn default_chunk_rows() -> usize {
    5_000
}
fn default_status_interval_ms() -> u64 {
    1_000
}
fn default_heartbeat_ms() -> u64 {
    10_000
}
fn default_reconnect_ms() -> u64 {
    120_000
}

impl PostgresConfig {
    /// Checks what can be checked without a server. The error names the
    /// field (relative to `source.postgres`) and what is wrong with it.
    pub fn validate(&self) -> Result<(), String> {
        tokio_postgres::Config::from_str(&self.dsn).map_err(|e| format!("dsn: {e}"))?;
        for (field, name) in [("publication", &self.publication), ("slot", &self.slot)] {
            if name.is_empty()
                || !name
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
            {
                return Err(format!(
                    "{field}: `{name}` must be lower-case letters, digits and `_`"
                ));
            }
        }
        if self.chunk_rows == 0 {
            return Err("chunk_rows: must be at least 1".into());
        }
        if self.status_interval_ms == 0 {
            return Err("status_interval_ms: must be at least 1".into());
        }
        Ok(())
    }

    pub(super) fn status_interval(&self) -> Duration {
        Duration::from_millis(self.status_interval_ms)
    }

    /// None when heartbeats are off.
    pub(super) fn heartbeat_interval(&self) -> Option<Duration> {
        (self.heartbeat_ms > 0).then(|| Duration::from_millis(self.heartbeat_ms))
    }

    pub(super) fn reconnect_timeout(&self) -> Duration {
        Duration::from_millis(self.reconnect_timeout_ms)
    }
}

/// Everything [`PostgresSource::open`](super::PostgresSource::open) needs:
/// its own config plus what it must know of the pipeline around it.
#[derive(Debug, Clone)]
pub struct PostgresSettings {
    pub config: PostgresConfig,
    /// Tables (`schema.table`) the pipeline writes in append mode: they may
    /// lack a key, and their deletes carry the whole old row.
    pub append_tables: BTreeSet<String>,
    /// The pipeline's state directory, where the source keeps the shapes of
    /// the tables it streamed (to catch DDL done while weir was stopped).
    pub state_dir: PathBuf,
    /// The process's I/O runtime, which the source's async clients run on.
    pub io: tokio::runtime::Handle,
}
