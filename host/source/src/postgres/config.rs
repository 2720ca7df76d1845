//! The Postgres source's settings: `source.postgres` as a pipeline config
//! spells it, and the few pipeline-wide facts the source needs beside it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use serde::Deserialize;

use super::catalog::parse_lsn;

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
    /// The commit LSN (`X/Y`, as Postgres prints it) of one transaction to
    /// leave out whole: the operator's escape from a stop that replays
    /// after every restart, such as a TRUNCATE. Its changes reach no sink;
    /// the position moves past it, so it is acknowledged.
    #[serde(default)]
    pub skip_transaction_at: Option<String>,
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
    /// The servers `dsn` names, each with its port (libpq's default 5432
    /// where none is given). A DSN without a host would reach whatever
    /// libpq's defaults reach: it must say.
    pub fn endpoints(&self) -> Result<Vec<crate::Endpoint>, String> {
        use tokio_postgres::config::Host;
        let parsed: tokio_postgres::Config = self
            .dsn
            .parse()
            .map_err(|e| format!("cannot be read: {e}"))?;
        let ports = parsed.get_ports();
        let endpoints = parsed
            .get_hosts()
            .iter()
            .enumerate()
            .map(|(i, host)| match host {
                Host::Tcp(name) => crate::Endpoint::Tcp {
                    host: name.clone(),
                    port: ports.get(i).or(ports.first()).copied().unwrap_or(5432),
                },
                Host::Unix(path) => crate::Endpoint::Unix(path.display().to_string()),
            })
            .collect::<Vec<_>>();
        if endpoints.is_empty() {
            return Err("names no host; name the server to connect to".into());
        }
        Ok(endpoints)
    }

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
        if let Some(text) = &self.skip_transaction_at
            && strict_lsn(text).is_none()
        {
            return Err(format!(
                "skip_transaction_at: `{text}` is not an LSN: write the commit LSN as Postgres \
                 prints it, two hexadecimal numbers split by `/` (e.g. 0/16B3748), as the \
                 error that stopped the run names it"
            ));
        }
        Ok(())
    }

    /// The commit LSN of the transaction to leave out, if any (checked by
    /// [`Self::validate`]).
    pub(super) fn skip_transaction_lsn(&self) -> Option<u64> {
        self.skip_transaction_at.as_deref().and_then(strict_lsn)
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

/// An LSN as Postgres prints it: two hexadecimal numbers of at most 8
/// digits each, split by `/`.
fn strict_lsn(text: &str) -> Option<u64> {
    let (hi, lo) = text.trim().split_once('/')?;
    let part = |p: &str| (1..=8).contains(&p.len()) && p.chars().all(|c| c.is_ascii_hexdigit());
    (part(hi) && part(lo))
        .then(|| parse_lsn(text.trim()))
        .flatten()
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
    /// The process's I/O runtime, which the source's query connection runs
    /// on (its replication client has a thread of its own).
    pub io: tokio::runtime::Handle,
    /// The run holds a fenced claim on the pipeline (a cluster's new owner):
    /// a walsender an earlier owner left on the slot is ended rather than
    /// waited out, since that owner can no longer commit.
    pub take_over_slot: bool,
    /// Set when the run is asked to stop (a signal, the supervisor): a
    /// wait for a server that is away ends at once, and so does a
    /// connection attempt under way.
    pub stop: Arc<AtomicBool>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_skip(at: &str) -> PostgresConfig {
        PostgresConfig {
            dsn: "host=localhost user=weir".into(),
            publication: "weir_cdc".into(),
            slot: "weir_cdc".into(),
            create_publication_for: Vec::new(),
            keys: BTreeMap::new(),
            chunk_rows: 10,
            exit_when_caught_up: false,
            status_interval_ms: 1_000,
            heartbeat_ms: 0,
            reconnect_timeout_ms: 1_000,
            skip_transaction_at: Some(at.into()),
        }
    }

    #[test]
    fn skip_transaction_at_takes_an_lsn_as_postgres_prints_it() {
        let config = with_skip("1/6B374D8");
        assert_eq!(config.validate(), Ok(()));
        assert_eq!(config.skip_transaction_lsn(), Some(0x1_06B3_74D8));
        for wrong in [
            "16B374D8",
            "0/",
            "x/1",
            "1/+1",
            "123456789/0",
            "0/16B3748 1",
        ] {
            let said = with_skip(wrong).validate().unwrap_err();
            assert!(
                said.starts_with("skip_transaction_at:") && said.contains(wrong),
                "{said}"
            );
        }
    }
}
