//! The MySQL/MariaDB source's settings: `source.mysql` as a pipeline config
//! spells it, and the few pipeline-wide facts the source needs beside it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use serde::Deserialize;

use super::position::BinlogCoord;

/// `source.mysql` in a pipeline config.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MysqlConfig {
    /// The server's host name or address.
    pub host: String,
    #[serde(default = "default_port")]
    pub port: u16,
    pub user: String,
    /// Usually `${VAR}`, so the file holds no secret.
    #[serde(default)]
    pub password: String,
    /// The id weir registers with when it reads the binlog, as a replica
    /// does: unique among the server's replicas, not 0.
    pub server_id: u32,
    /// The tables to read: `db.table`, or patterns where `*` stands for any
    /// run of characters (`shop.*`, `shop.order_*`, `*.events`).
    pub tables: Vec<String>,
    /// Key columns for tables without a primary key or a unique key of
    /// not-null columns, by `db.table`.
    #[serde(default)]
    pub keys: BTreeMap<String, Vec<String>>,
    /// Rows per backfill chunk.
    #[serde(default = "default_chunk_rows")]
    pub chunk_rows: usize,
    /// End the run once the stream has reached the binlog position the
    /// server had when the run started (for batch-style runs and tests).
    #[serde(default)]
    pub exit_when_caught_up: bool,
    /// The heartbeat period asked of the server: an idle server still
    /// sends an event this often, so a dead connection is noticed.
    #[serde(default = "default_heartbeat_ms")]
    pub heartbeat_ms: u64,
    /// How long to keep trying to reconnect after the server went away.
    #[serde(default = "default_reconnect_ms")]
    pub reconnect_timeout_ms: u64,
    /// One transaction to leave out whole, by the binlog position of its
    /// start as the error that stopped the run names it
    /// (`binlog.000003:1234`): the way past a stop that would replay after
    /// every restart, such as a TRUNCATE. Its changes reach no sink; the
    /// position moves past it.
    #[serde(default)]
    pub skip_transaction_at: Option<String>,
}

fn default_port() -> u16 {
    3306
}
fn default_chunk_rows() -> usize {
    10_000
}
fn default_heartbeat_ms() -> u64 {
    5_000
}
fn default_reconnect_ms() -> u64 {
    120_000
}

impl MysqlConfig {
    /// The server the source connects to.
    pub fn endpoints(&self) -> Result<Vec<crate::Endpoint>, String> {
        if self.host.trim().is_empty() {
            return Err("host: empty; name the server to connect to".into());
        }
        Ok(vec![crate::Endpoint::Tcp {
            host: self.host.clone(),
            port: self.port,
        }])
    }

    /// Checks what can be checked without a server. The error names the
    /// field (relative to `source.mysql`) and what is wrong with it.
    pub fn validate(&self) -> Result<(), String> {
        self.endpoints()?;
        if self.port == 0 {
            return Err("port: 0 is not a port".into());
        }
        if self.user.is_empty() {
            return Err("user: empty".into());
        }
        if self.server_id == 0 {
            return Err(
                "server_id: 0 is not allowed (a replica with id 0 is refused by the server); \
                 choose an id no other replica of the server uses"
                    .into(),
            );
        }
        if self.tables.is_empty() {
            return Err(
                "tables: name at least one table (`db.table` or a pattern like `db.*`)".into(),
            );
        }
        for (i, pattern) in self.tables.iter().enumerate() {
            TablePattern::parse(pattern).map_err(|e| format!("tables[{i}]: {e}"))?;
        }
        for (table, columns) in &self.keys {
            if table.split_once('.').is_none() {
                return Err(format!("keys: `{table}` is not `db.table`"));
            }
            if columns.is_empty() {
                return Err(format!("keys.{table}: name at least one column"));
            }
        }
        if self.chunk_rows == 0 {
            return Err("chunk_rows: must be at least 1".into());
        }
        if !(100..=3_600_000).contains(&self.heartbeat_ms) {
            return Err(format!(
                "heartbeat_ms: {} is outside 100..=3600000",
                self.heartbeat_ms
            ));
        }
        if let Some(text) = &self.skip_transaction_at {
            BinlogCoord::parse_file_and_offset(text).map_err(|e| {
                format!(
                    "skip_transaction_at: `{text}` {e}: write the start of the transaction as \
                     the error that stopped the run names it (e.g. binlog.000003:1234)"
                )
            })?;
        }
        Ok(())
    }

    /// The tables to read, as patterns (checked by [`Self::validate`]).
    pub(super) fn patterns(&self) -> Vec<TablePattern> {
        self.tables
            .iter()
            .filter_map(|p| TablePattern::parse(p).ok())
            .collect()
    }

    pub(super) fn skip_transaction(&self) -> Option<BinlogCoord> {
        self.skip_transaction_at
            .as_deref()
            .and_then(|t| BinlogCoord::parse_file_and_offset(t).ok())
    }

    pub(super) fn heartbeat(&self) -> Duration {
        Duration::from_millis(self.heartbeat_ms)
    }

    pub(super) fn reconnect_timeout(&self) -> Duration {
        Duration::from_millis(self.reconnect_timeout_ms)
    }

    /// Connection options for mysql_async.
    pub(super) fn opts(&self) -> mysql_async::Opts {
        mysql_async::OptsBuilder::default()
            .ip_or_hostname(self.host.clone())
            .tcp_port(self.port)
            .user(Some(self.user.clone()))
            .pass(Some(self.password.clone()))
            .prefer_socket(false)
            .into()
    }
}

/// `db.table` where either part may hold `*` (any run of characters).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct TablePattern {
    db: String,
    table: String,
}

impl TablePattern {
    pub fn parse(text: &str) -> Result<TablePattern, String> {
        let Some((db, table)) = text.split_once('.') else {
            return Err(format!(
                "`{text}` is not `db.table` (or a pattern such as `db.*`)"
            ));
        };
        if db.is_empty() || table.is_empty() || table.contains('.') {
            return Err(format!(
                "`{text}` is not `db.table` (or a pattern such as `db.*`)"
            ));
        }
        Ok(TablePattern {
            db: db.to_string(),
            table: table.to_string(),
        })
    }

    pub fn matches(&self, db: &str, table: &str) -> bool {
        glob(&self.db, db) && glob(&self.table, table)
    }
}

/// `*` matches any run of characters; everything else itself.
fn glob(pattern: &str, text: &str) -> bool {
    match pattern.split_once('*') {
        None => pattern == text,
        Some((head, rest)) => {
            let Some(after) = text.strip_prefix(head) else {
                return false;
            };
            (0..=after.len())
                .filter(|&i| after.is_char_boundary(i))
                .any(|i| glob(rest, &after[i..]))
        }
    }
}

/// Everything [`MysqlSource::open`](super::MysqlSource::open) needs: its
/// own config plus what it must know of the pipeline around it.
#[derive(Debug, Clone)]
pub struct MysqlSettings {
    pub config: MysqlConfig,
    /// The pipeline's id: the stream's start of its first backfill is kept
    /// under it in `state_dir`.
    pub pipeline: String,
    /// Tables (`db.table`) the pipeline writes in append mode: they may
    /// lack a key.
    pub append_tables: BTreeSet<String>,
    /// The pipeline's state directory, where the source keeps the shapes
    /// of the tables it read (to catch DDL done while weir was stopped).
    pub state_dir: PathBuf,
    /// The process's I/O runtime, which the source's connections run on.
    pub io: tokio::runtime::Handle,
    /// Set when the run is asked to stop: a wait for a server that is away
    /// ends at once.
    pub stop: Arc<AtomicBool>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> MysqlConfig {
        MysqlConfig {
            host: "127.0.0.1".into(),
            port: 3306,
            user: "weir".into(),
            password: String::new(),
            server_id: 77,
            tables: vec!["shop.*".into()],
            keys: BTreeMap::new(),
            chunk_rows: 10,
            exit_when_caught_up: false,
            heartbeat_ms: 1_000,
            reconnect_timeout_ms: 1_000,
            skip_transaction_at: None,
        }
    }

    #[test]
    fn patterns_match_db_and_table_with_stars() {
        let p = TablePattern::parse("shop.order_*").unwrap();
        assert!(p.matches("shop", "order_lines"));
        assert!(p.matches("shop", "order_"));
        assert!(!p.matches("shop", "orders"));
        assert!(!p.matches("shop2", "order_lines"));
        let any_db = TablePattern::parse("*.events").unwrap();
        assert!(any_db.matches("a", "events") && any_db.matches("b", "events"));
        assert!(!any_db.matches("a", "events2"));
        assert!(TablePattern::parse("*.*").unwrap().matches("x", "y"));
    }

    #[test]
    fn a_wrong_field_is_named() {
        type Case = (fn(&mut MysqlConfig), &'static str);
        let cases: [Case; 6] = [
            (|c| c.server_id = 0, "server_id:"),
            (|c| c.tables.clear(), "tables:"),
            (|c| c.tables = vec!["orders".into()], "tables[0]:"),
            (|c| c.chunk_rows = 0, "chunk_rows:"),
            (|c| c.host = " ".into(), "host:"),
            (
                |c| c.skip_transaction_at = Some("binlog:12".into()),
                "skip_transaction_at:",
            ),
        ];
        for (change, field) in cases {
            let mut c = config();
            change(&mut c);
            let said = c.validate().unwrap_err();
            assert!(said.starts_with(field), "{said} should start with {field}");
        }
        let mut c = config();
        c.skip_transaction_at = Some("binlog.000003:1234".into());
        assert_eq!(c.validate(), Ok(()));
        assert_eq!(
            c.skip_transaction(),
            Some(BinlogCoord {
                file: 3,
                offset: 1234
            })
        );
    }
}
