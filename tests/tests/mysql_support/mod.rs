//! Shared helpers for the tests against a real MariaDB server: the private
//! server (scripts/mariadb), a database per test, and SQL through the
//! `mariadb` command-line client as `weir_admin`.
//!
//! Rows come back as the client's batch output: tab-separated, with tab,
//! newline, backslash and NUL escaped (`\t`, `\n`, `\\`, `\0`; undone by
//! [`Maria::rows`]) and NULL printed as `NULL`, so a string `'NULL'` reads
//! as NULL too. The text is read as UTF-8 (invalid bytes replaced): select
//! binary columns as `HEX(col)`.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use arrow_array::cast::AsArray;
use weir_source::change::Value;

use crate::common;

/// The user tests set up databases and run SQL as (all privileges).
pub const ADMIN_USER: &str = "weir_admin";
pub const ADMIN_PASSWORD: &str = "weir_admin";
/// The user the pipeline connects as: REPLICATION SLAVE, REPLICATION
/// CLIENT and SELECT on everything (what docs/mysql.md asks for).
pub const USER: &str = "weir";
pub const PASSWORD: &str = "weir";

/// The private server, started by [`server`].
pub struct Maria {
    pub port: u16,
}

/// Starts the private server if needed (scripts/mariadb start, which
/// serializes concurrent callers) and returns it.
pub fn server() -> Maria {
    let out = script("start");
    let url = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let port = url
        .strip_prefix("mysql://weir:weir@127.0.0.1:")
        .and_then(|rest| rest.strip_suffix('/'))
        .and_then(|port| port.parse().ok())
        .unwrap_or_else(|| panic!("scripts/mariadb start printed no URL: {url:?}"));
    Maria { port }
}

/// Stops and starts the server again (same data, same port): every
/// connection to it breaks.
pub fn restart_server() {
    script("restart");
}

fn script(command: &str) -> std::process::Output {
    let out = Command::new(common::workspace().join("scripts/mariadb"))
        .arg(command)
        .output()
        .expect("scripts/mariadb runs");
    assert!(
        out.status.success(),
        "scripts/mariadb {command} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

impl Maria {
    /// The pipeline user's URL, without a database.
    pub fn url(&self) -> String {
        format!("mysql://{USER}:{PASSWORD}@127.0.0.1:{}/", self.port)
    }

    /// A fresh, empty database `db` (utf8mb4).
    pub fn fresh_db(&self, db: &str) {
        self.sql(
            "",
            &format!(
                "DROP DATABASE IF EXISTS `{db}`;\nCREATE DATABASE `{db}` CHARACTER SET utf8mb4;"
            ),
        );
    }

    /// Runs SQL as `weir_admin` in database `db` (none when empty),
    /// stopping at the first error; returns the client's output (see the
    /// module's documentation).
    pub fn sql(&self, db: &str, sql: &str) -> String {
        self.try_sql(db, sql)
            .unwrap_or_else(|e| panic!("mariadb failed: {e}\nSQL: {}", clip(sql)))
    }

    /// [`Maria::sql`], with the client's error (its stderr) on failure.
    pub fn try_sql(&self, db: &str, sql: &str) -> Result<String, String> {
        let port = self.port.to_string();
        let mut command = Command::new("mariadb");
        // --no-defaults: nothing from /etc/mysql or ~/.my.cnf; the client's
        // character set set outright (its default follows the locale).
        command.args([
            "--no-defaults",
            "--protocol=TCP",
            "--host=127.0.0.1",
            "--port",
            &port,
            "--user",
            ADMIN_USER,
            &format!("--password={ADMIN_PASSWORD}"),
            "--default-character-set=utf8mb4",
            "--batch",
            "--skip-column-names",
        ]);
        if !db.is_empty() {
            command.args(["--database", db]);
        }
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("the mariadb client runs (scripts/setup installs it)");
        // A failing statement ends the client early: its stderr says why.
        let _ = child.stdin.take().unwrap().write_all(sql.as_bytes());
        let out = child.wait_with_output().unwrap();
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).into_owned())
        }
    }

    /// One value from a query, trimmed.
    pub fn value(&self, db: &str, sql: &str) -> String {
        self.sql(db, sql).trim().to_string()
    }

    /// The rows of a query's result: NULL as `None`, the client's escapes
    /// undone. Select binary columns as `HEX(col)`; a string `'NULL'`
    /// reads as `None` (the client prints both alike).
    pub fn rows(&self, db: &str, sql: &str) -> Vec<Vec<Option<String>>> {
        parse_rows(&self.sql(db, sql))
    }

    /// `SHOW MASTER STATUS`: the binary log being written and the position
    /// at its end.
    pub fn master_status(&self) -> (String, u64) {
        let rows = self.rows("", "SHOW MASTER STATUS");
        let row = rows
            .first()
            .unwrap_or_else(|| panic!("SHOW MASTER STATUS returned no row: is log_bin on?"));
        let file = row[0].clone().expect("a binary log file");
        let position = row[1]
            .as_deref()
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("SHOW MASTER STATUS: a position, not {:?}", row[1]));
        (file, position)
    }
}

/// The client's batch output as rows (see [`Maria::rows`]).
pub fn parse_rows(text: &str) -> Vec<Vec<Option<String>>> {
    text.lines()
        .map(|line| {
            line.split('\t')
                .map(|field| (field != "NULL").then(|| unescape(field)))
                .collect()
        })
        .collect()
}

/// Undoes the client's batch escapes: `\t`, `\n`, `\\`, `\0`. Anything else
/// after a backslash is kept as it is.
fn unescape(field: &str) -> String {
    let mut out = String::with_capacity(field.len());
    let mut chars = field.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('t') => out.push('\t'),
            Some('n') => out.push('\n'),
            Some('\\') => out.push('\\'),
            Some('0') => out.push('\0'),
            Some(other) => {
                out.push('\\');
                out.push(other);
            }
            None => out.push('\\'),
        }
    }
    out
}

fn clip(s: &str) -> &str {
    let mut end = s.len().min(400);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

// ------------------------------------------------- pipelines and sinks

/// How a column is compared: MariaDB renders it with an SQL expression,
/// the sink's value is rendered to the same text.
#[derive(Clone, Copy, Debug)]
pub enum Canon {
    /// Integers (also BIGINT UNSIGNED, a decimal(20,0) in the sink).
    Int,
    /// DECIMAL(p, s): MariaDB prints every digit of the scale.
    Decimal(u32),
    /// FLOAT: compared as its exact value widened to a double (MariaDB's
    /// own text of a FLOAT keeps six digits).
    Float32,
    /// DOUBLE.
    Float64,
    Date,
    /// DATETIME and TIMESTAMP, to the microsecond (TIMESTAMP in UTC).
    DateTime,
    Time,
    Text,
    /// Bytes, as upper-case hex.
    Hex,
    /// BIT(n) as its number.
    Bits,
}

impl Canon {
    /// The SQL expression MariaDB renders column `c` with.
    pub fn sql(self, c: &str) -> String {
        let c = format!("`{c}`");
        match self {
            Canon::Int | Canon::Decimal(_) | Canon::Float64 => format!("CAST({c} AS CHAR)"),
            Canon::Float32 => format!("CAST(CAST({c} AS DOUBLE) AS CHAR)"),
            Canon::Date => format!("DATE_FORMAT({c}, '%Y-%m-%d')"),
            Canon::DateTime => format!("DATE_FORMAT({c}, '%Y-%m-%d %H:%i:%s.%f')"),
            Canon::Time => format!("TIME_FORMAT({c}, '%H:%i:%s.%f')"),
            Canon::Text => c,
            Canon::Hex => format!("HEX({c})"),
            Canon::Bits => format!("CAST({c} + 0 AS CHAR)"),
        }
    }

    /// MariaDB's text, normalized where two spellings mean one value.
    pub fn normalize(self, text: &str) -> String {
        match self {
            Canon::Float32 | Canon::Float64 => {
                format!("{}", text.parse::<f64>().expect("a double"))
            }
            _ => text.to_string(),
        }
    }

    /// The sink's value as MariaDB would print it; None for null.
    pub fn render(self, value: &Value) -> Option<String> {
        Some(match (self, value) {
            (_, Value::Null) => return None,
            (Canon::Int, Value::Int32(v)) => v.to_string(),
            (Canon::Int, Value::Int64(v)) => v.to_string(),
            (Canon::Int, Value::Decimal128(v)) => v.to_string(),
            (Canon::Decimal(scale), Value::Decimal128(v)) => decimal_text(*v, scale),
            (Canon::Float32 | Canon::Float64, Value::Float64(v)) => format!("{v}"),
            (Canon::Date, Value::Date32(days)) => civil(i64::from(*days)),
            (Canon::DateTime, Value::TimestampMicros(us)) => {
                let secs = us.div_euclid(1_000_000);
                let frac = us.rem_euclid(1_000_000);
                let day = secs.div_euclid(86_400);
                let s = secs.rem_euclid(86_400);
                format!(
                    "{} {:02}:{:02}:{:02}.{frac:06}",
                    civil(day),
                    s / 3600,
                    s / 60 % 60,
                    s % 60
                )
            }
            (Canon::Time, Value::Int64(us)) => {
                let s = us / 1_000_000;
                format!(
                    "{:02}:{:02}:{:02}.{:06}",
                    s / 3600,
                    s / 60 % 60,
                    s % 60,
                    us % 1_000_000
                )
            }
            (Canon::Text, Value::Utf8(s)) => s.clone(),
            (Canon::Hex, Value::Binary(b)) => b.iter().map(|x| format!("{x:02X}")).collect(),
            (Canon::Bits, Value::Bool(b)) => u8::from(*b).to_string(),
            (Canon::Bits, Value::Binary(b)) => b
                .iter()
                .fold(0u64, |n, x| n << 8 | u64::from(*x))
                .to_string(),
            (canon, other) => panic!("a {canon:?} column holds {other:?} in the sink"),
        })
    }
}

fn decimal_text(v: i128, scale: u32) -> String {
    let sign = if v < 0 { "-" } else { "" };
    let digits = format!("{:0>width$}", v.unsigned_abs(), width = scale as usize + 1);
    if scale == 0 {
        return format!("{sign}{digits}");
    }
    let (whole, frac) = digits.split_at(digits.len() - scale as usize);
    format!("{sign}{whole}.{frac}")
}

/// `YYYY-MM-DD` of a day count since 1970-01-01.
fn civil(days: i64) -> String {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02}")
}

/// A table under test: its name in the sink (`db.table`), its columns with
/// how each is compared, and the key's column indexes.
#[derive(Clone)]
pub struct MyTable {
    pub db: String,
    pub table: String,
    pub columns: Vec<(String, Canon)>,
    pub key: Vec<usize>,
}

pub type Rows = BTreeMap<Vec<Option<String>>, Vec<Option<String>>>;

impl MyTable {
    pub fn new(db: &str, table: &str, columns: &[(&str, Canon)], key: &[usize]) -> MyTable {
        MyTable {
            db: db.into(),
            table: table.into(),
            columns: columns.iter().map(|(n, c)| (n.to_string(), *c)).collect(),
            key: key.to_vec(),
        }
    }

    pub fn name(&self) -> String {
        format!("{}.{}", self.db, self.table)
    }

    fn key_of(&self, row: &[Option<String>]) -> Vec<Option<String>> {
        self.key.iter().map(|&k| row[k].clone()).collect()
    }

    /// The table as MariaDB has it, every column rendered as text.
    pub fn server_rows(&self, maria: &Maria) -> Rows {
        let select: Vec<String> = self.columns.iter().map(|(n, c)| c.sql(n)).collect();
        let sql = format!(
            "SET time_zone = '+00:00'; SELECT {} FROM `{}`",
            select.join(", "),
            self.table
        );
        maria
            .rows(&self.db, &sql)
            .into_iter()
            .map(|row| {
                let row: Vec<Option<String>> = row
                    .into_iter()
                    .zip(&self.columns)
                    .map(|(v, (_, canon))| v.map(|t| canon.normalize(&t)))
                    .collect();
                (self.key_of(&row), row)
            })
            .collect()
    }

    /// The positioned sink's rows after its changes in position order (a
    /// delete removes the key), and how many changes it holds twice.
    /// Columns a batch lacks read as null.
    pub fn sink_rows(&self, root: &Path) -> (Rows, usize) {
        let mut log: Vec<(Vec<u8>, String, Vec<Option<String>>)> = Vec::new();
        for batch in common::read_positioned(root, &self.name()) {
            let ops = batch
                .column_by_name("__op")
                .expect("__op")
                .as_string::<i32>()
                .clone();
            let pos = batch
                .column_by_name("__pos")
                .expect("__pos")
                .as_binary::<i32>()
                .clone();
            for row in 0..batch.num_rows() {
                let values = self
                    .columns
                    .iter()
                    // Batches from before a column was added lack it: null.
                    .map(|(name, canon)| {
                        let array = batch.column_by_name(name)?;
                        canon.render(&common::value_at(array.as_ref(), row))
                    })
                    .collect();
                log.push((pos.value(row).to_vec(), ops.value(row).to_string(), values));
            }
        }
        log.sort_by(|a, b| a.0.cmp(&b.0));
        let before = log.len();
        log.dedup_by(|a, b| a.0 == b.0);
        let duplicates = before - log.len();
        let mut state = Rows::new();
        for (_, op, values) in log {
            let key = self.key_of(&values);
            if op == "delete" {
                state.remove(&key);
            } else {
                state.insert(key, values);
            }
        }
        (state, duplicates)
    }
}

/// Compares the positioned sink with MariaDB, table by table, row by row,
/// and refuses any change the sink holds twice.
pub fn assert_sink_equals_server(maria: &Maria, root: &Path, tables: &[MyTable]) {
    for table in tables {
        let want = table.server_rows(maria);
        let (got, duplicates) = table.sink_rows(root);
        assert_eq!(
            duplicates,
            0,
            "{}: the sink holds {duplicates} changes twice",
            table.name()
        );
        let missing: Vec<_> = want
            .keys()
            .filter(|k| !got.contains_key(*k))
            .take(3)
            .collect();
        let extra: Vec<_> = got
            .keys()
            .filter(|k| !want.contains_key(*k))
            .take(3)
            .collect();
        let differ: Vec<String> = want
            .iter()
            .filter(|(k, v)| got.get(*k).is_some_and(|g| g != *v))
            .take(2)
            .map(|(k, v)| format!("{k:?}:\n  mariadb {v:?}\n  sink    {:?}", got[k]))
            .collect();
        assert!(
            missing.is_empty() && extra.is_empty() && differ.is_empty(),
            "{}: mariadb has {} rows, the sink {}; missing {missing:?}; extra {extra:?}; differing:\n{}",
            table.name(),
            want.len(),
            got.len(),
            differ.join("\n")
        );
        println!("{}: {} rows equal", table.name(), want.len());
    }
}

/// A pipeline file for the MySQL source into the positioned sink at
/// `root`; `exit_when_caught_up` comes from WEIR_MY_EXIT (default false),
/// so one file serves the endless runs and the draining run.
pub struct MyPipeline {
    pub port: u16,
    pub tables: Vec<String>,
    pub server_id: u32,
    pub chunk_rows: usize,
    pub max_rows: usize,
    pub user: String,
    pub extra_source: String,
}

impl MyPipeline {
    pub fn new(maria: &Maria, tables: &[&str], server_id: u32) -> MyPipeline {
        MyPipeline {
            port: maria.port,
            tables: tables.iter().map(|t| t.to_string()).collect(),
            server_id,
            chunk_rows: 200,
            max_rows: 500,
            user: USER.into(),
            extra_source: String::new(),
        }
    }

    pub fn write(&self, dir: &Path, root: &Path) -> PathBuf {
        let yaml = format!(
            "pipeline: mytest\nstate_dir: state\nsource:\n  mysql:\n    host: 127.0.0.1\n    port: {}\n    user: {}\n    password: {}\n    server_id: {}\n    tables: [{}]\n    chunk_rows: {}\n    heartbeat_ms: 500\n    reconnect_timeout_ms: 30000\n    exit_when_caught_up: ${{WEIR_MY_EXIT:-false}}\n{}batch: {{ max_rows: {}, linger_ms: 50, heartbeat_ms: 300 }}\nsinks:\n  - name: exact\n    plugin: {}\n    blob_store: {{ url: {} }}\n",
            self.port,
            self.user,
            self.user,
            self.server_id,
            self.tables.join(", "),
            self.chunk_rows,
            self.extra_source,
            self.max_rows,
            common::plugin("weir-fixture-positioned").display(),
            root.display(),
        );
        let path = dir.join("pipeline.yaml");
        std::fs::write(&path, yaml).unwrap();
        path
    }
}

/// Runs the pipeline to the binlog's end and returns its output.
pub fn drain(pipeline: &Path) -> std::process::Output {
    common::weir(
        &["run", pipeline.to_str().unwrap()],
        &[("WEIR_MY_EXIT", "true")],
    )
}

pub fn spawn_weir(pipeline: &Path, log: &Path) -> Child {
    common::weir_command()
        .args(["run", pipeline.to_str().unwrap()])
        .env("WEIR_LOG", "info")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).unwrap())
        .spawn()
        .unwrap()
}

/// SIGINT, then waits (SIGKILL after 20 s).
pub fn interrupt(child: &mut Child) {
    let _ = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status();
    let started = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if started.elapsed() > Duration::from_secs(20) {
            child.kill().ok();
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}
