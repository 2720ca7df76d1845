//! Redis for tests: a private `redis-server` per test ([`RedisServer`]),
//! a dump of what a key space holds ([`dump`]), and, with the `host`
//! feature, the Redis sink's content read back as the oracle's values
//! ([`RedisView`]) and compared with the generator's change log.
//!
//! The reader follows docs/sinks/redis.md, not the sink's code: it parses
//! every key under the sink's prefix, decodes every field by the documented
//! rendering of its column's type, and renders the decoded value again to
//! check the text is the one canonical text for it. A key it cannot place,
//! a field no column has, or text that is not a rendering is a failure that
//! names the key and field.
//!
//! A test file that imports the support crate with a glob (`use
//! common::*`) sees this module under the name `redis`; it reaches the
//! `redis` crate itself as `::redis`.

use std::collections::BTreeMap;
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Debian's server, or the one `REDIS_SERVER` names.
fn server_binary() -> PathBuf {
    std::env::var_os("REDIS_SERVER")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/bin/redis-server"))
}

/// A `redis-server` on a free loopback port, without persistence, in a
/// folder of its own; killed when dropped, also when the test panics.
pub struct RedisServer {
    child: Option<Child>,
    port: u16,
    dir: tempfile::TempDir,
    extra: Vec<String>,
    /// What the test's own clients authenticate with, if the server wants it.
    password: Option<String>,
}

impl RedisServer {
    /// A server with the default settings.
    pub fn start() -> RedisServer {
        RedisServer::start_with(&[], None)
    }

    /// Starts with extra `redis-server` arguments; `password` is what the
    /// test's clients authenticate with.
    pub fn start_with(extra: &[&str], password: Option<&str>) -> RedisServer {
        let port = {
            let probe = TcpListener::bind("127.0.0.1:0").expect("a free port");
            probe.local_addr().expect("a bound address").port()
        };
        let mut server = RedisServer {
            child: None,
            port,
            dir: tempfile::tempdir().expect("a temporary folder"),
            extra: extra.iter().map(|s| s.to_string()).collect(),
            password: password.map(str::to_string),
        };
        server.launch();
        server
    }

    fn launch(&mut self) {
        let binary = server_binary();
        let child = Command::new(&binary)
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(self.dir.path())
            .args(["--logfile", "redis.log"])
            .args(&self.extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "cannot start {} (scripts/setup installs it; REDIS_SERVER points elsewhere): {e}",
                    binary.display()
                )
            });
        self.child = Some(child);
        self.wait_ready();
    }

    /// Until the server answers PING (or refuses it for want of a password,
    /// which is an answer too).
    fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                let log =
                    std::fs::read_to_string(self.dir.path().join("redis.log")).unwrap_or_default();
                panic!("redis-server exited with {status}:\n{log}");
            }
            if let Ok(client) = ::redis::Client::open(format!("redis://127.0.0.1:{}/", self.port))
                && let Ok(mut con) = client.get_connection()
            {
                match ::redis::cmd("PING").query::<String>(&mut con) {
                    Ok(_) => return,
                    Err(e) if e.code().is_some() => return,
                    Err(_) => {}
                }
            }
            assert!(
                Instant::now() < deadline,
                "redis-server on port {} did not answer within 15 s",
                self.port
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// `127.0.0.1:<port>`, as the sink's `address` and a `grants.tcp` entry.
    pub fn address(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// Kills the server; the port stays this server's for [`Self::restart`].
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        // Until the port refuses, a call could still reach the dying server.
        let deadline = Instant::now() + Duration::from_secs(5);
        while TcpStream::connect(self.address()).is_ok() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Freezes the server (SIGSTOP): connections stay open, nothing answers.
    pub fn freeze(&self) {
        self.signal("-STOP");
    }

    /// Lets a frozen server go on (SIGCONT).
    pub fn thaw(&self) {
        self.signal("-CONT");
    }

    fn signal(&self, which: &str) {
        let pid = self
            .child
            .as_ref()
            .expect("the server runs")
            .id()
            .to_string();
        let status = Command::new("kill")
            .args([which, &pid])
            .status()
            .expect("kill runs");
        assert!(status.success(), "kill {which} {pid}: {status}");
    }

    /// Starts the server again on the same port (empty: nothing persists).
    pub fn restart(&mut self) {
        self.stop();
        self.launch();
    }

    /// A client of the test's own, on database `db`.
    pub fn client_on(&self, db: u32) -> ::redis::Connection {
        let auth = match &self.password {
            Some(p) => format!(":{p}@"),
            None => String::new(),
        };
        ::redis::Client::open(format!("redis://{auth}127.0.0.1:{}/{db}", self.port))
            .and_then(|c| c.get_connection())
            .expect("a client connection")
    }

    /// A client of the test's own, on database 0.
    pub fn client(&self) -> ::redis::Connection {
        self.client_on(0)
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            // SIGKILL ends a frozen process too.
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// What one key holds, as compared byte for byte between two dumps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Dumped {
    /// Field -> value.
    Hash(BTreeMap<String, String>),
    /// Entry ID and fields, in stream order.
    Stream(Vec<(String, Vec<(String, String)>)>),
    /// Any other type, by name; its content is not read.
    Other(String),
}

/// Every key whose name starts with `prefix` (all keys for `""`), with
/// what it holds. Stream entry IDs are kept: a dump taken after a run that
/// wrote nothing equals the one taken before, entry for entry.
pub fn dump(con: &mut ::redis::Connection, prefix: &str) -> BTreeMap<String, Dumped> {
    let keys = scan(con, prefix);
    let types = pipelined(con, &keys, |pipe, key| {
        pipe.cmd("TYPE").arg(key);
    });
    let mut out = BTreeMap::new();
    for (key, kind) in keys.into_iter().zip(types) {
        let kind: String = kind;
        let dumped = match kind.as_str() {
            "hash" => Dumped::Hash(
                ::redis::cmd("HGETALL")
                    .arg(&key)
                    .query(con)
                    .unwrap_or_else(|e| panic!("HGETALL {key:?}: {e}")),
            ),
            "stream" => Dumped::Stream(stream_entries(con, &key)),
            _ => Dumped::Other(kind),
        };
        out.insert(key, dumped);
    }
    out
}

/// Every key starting with `prefix`, sorted, by SCAN (not KEYS: the
/// server keeps answering other clients).
fn scan(con: &mut ::redis::Connection, prefix: &str) -> Vec<String> {
    // MATCH is a glob: the prefix's own glob characters are escaped.
    let mut pattern = String::new();
    for c in prefix.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            pattern.push('\\');
        }
        pattern.push(c);
    }
    pattern.push('*');
    let mut keys = Vec::new();
    let mut cursor = 0u64;
    loop {
        let (next, batch): (u64, Vec<Vec<u8>>) = ::redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(&pattern)
            .arg("COUNT")
            .arg(1000)
            .query(con)
            .unwrap_or_else(|e| panic!("SCAN {pattern:?}: {e}"));
        for key in batch {
            let key = String::from_utf8(key)
                .unwrap_or_else(|e| panic!("a Redis key is not UTF-8: {:?}", e.as_bytes()));
            keys.push(key);
        }
        cursor = next;
        if cursor == 0 {
            break;
        }
    }
    // SCAN may return a key twice.
    keys.sort();
    keys.dedup();
    keys
}

/// One command per key, sent in pipelines of a thousand.
fn pipelined<T: ::redis::FromRedisValue>(
    con: &mut ::redis::Connection,
    keys: &[String],
    command: impl Fn(&mut ::redis::Pipeline, &str),
) -> Vec<T> {
    let mut out = Vec::with_capacity(keys.len());
    for chunk in keys.chunks(1000) {
        let mut pipe = ::redis::pipe();
        for key in chunk {
            command(&mut pipe, key);
        }
        let replies: Vec<T> = pipe
            .query(con)
            .unwrap_or_else(|e| panic!("a pipeline of {} commands: {e}", chunk.len()));
        out.extend(replies);
    }
    out
}

type Entry = (String, Vec<(String, String)>);

fn stream_entries(con: &mut ::redis::Connection, key: &str) -> Vec<Entry> {
    let entries: Vec<(String, Vec<String>)> = ::redis::cmd("XRANGE")
        .arg(key)
        .arg("-")
        .arg("+")
        .query(con)
        .unwrap_or_else(|e| panic!("XRANGE {key:?}: {e}"));
    entries
        .into_iter()
        .map(|(id, flat)| {
            assert!(
                flat.len() % 2 == 0,
                "stream {key:?} entry {id}: odd field list"
            );
            let fields = flat
                .chunks(2)
                .map(|p| (p[0].clone(), p[1].clone()))
                .collect();
            (id, fields)
        })
        .collect()
}

/// One part of a key as the sink writes it: `\` becomes `\\`, `:` `\:`.
pub fn escape_key_part(part: &str) -> String {
    let mut out = String::with_capacity(part.len());
    for c in part.chars() {
        if c == '\\' || c == ':' {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

#[cfg(feature = "host")]
pub use self::content::*;

#[cfg(feature = "host")]
mod content {
    use std::collections::{BTreeMap, BTreeSet};
    use std::sync::Arc;

    use arrow_schema::{DataType, TimeUnit};
    use chrono::{Datelike, NaiveDate, Timelike};
    use weir_source::change::{Change, Op, TableSchema, Value};
    use weir_source::generator::oracle::{ExpectedState, KeyPart, Rows, apply_change, row_key};

    use super::{Dumped, dump, escape_key_part};

    /// The parts of a key (after its prefix), unescaped; `None` when an escape
    /// is not one the sink writes.
    fn split_key_parts(rest: &str) -> Option<Vec<String>> {
        let mut parts = vec![String::new()];
        let mut chars = rest.chars();
        while let Some(c) = chars.next() {
            match c {
                '\\' => match chars.next() {
                    Some(escaped @ ('\\' | ':')) => parts.last_mut()?.push(escaped),
                    _ => return None,
                },
                ':' => parts.push(String::new()),
                c => parts.last_mut()?.push(c),
            }
        }
        Some(parts)
    }

    /// The text the Redis sink stores for `value` in a column of
    /// `data_type` (docs/sinks/redis.md, "Value rendering"); `None` for a
    /// null, which is a field the hash or entry does not have. Covers the
    /// types weir's sources produce, lists aside.
    pub fn render_value(value: &Value, data_type: &DataType) -> Result<Option<String>, String> {
        Ok(Some(match (value, data_type) {
            (Value::Null, _) => return Ok(None),
            (Value::Bool(b), DataType::Boolean) => b.to_string(),
            (Value::Int32(v), DataType::Int32) => v.to_string(),
            (Value::Int64(v), DataType::Int64) => v.to_string(),
            (Value::Float64(v), DataType::Float64) => render_float(*v),
            (Value::Decimal128(v), DataType::Decimal128(_, scale)) => render_decimal(*v, *scale),
            (Value::Utf8(s), DataType::Utf8) => s.clone(),
            (Value::Binary(b), DataType::Binary) => hex::encode(b),
            (Value::Date32(days), DataType::Date32) => match *days {
                i32::MAX => "infinity".into(),
                i32::MIN => "-infinity".into(),
                days => render_date(
                    NaiveDate::from_num_days_from_ce_opt(days.saturating_add(EPOCH_FROM_CE))
                        .ok_or_else(|| format!("date {days} lies outside the calendar"))?,
                ),
            },
            (Value::TimestampMicros(micros), DataType::Timestamp(TimeUnit::Microsecond, zone)) => {
                match *micros {
                    i64::MAX => "infinity".into(),
                    i64::MIN => "-infinity".into(),
                    micros => {
                        let instant = chrono::DateTime::from_timestamp_micros(micros)
                            .ok_or_else(|| format!("timestamp {micros} lies outside the calendar"))?
                            .naive_utc();
                        format!(
                            "{}T{:02}:{:02}:{:02}.{:06}{}",
                            render_date(instant.date()),
                            instant.hour(),
                            instant.minute(),
                            instant.second(),
                            micros.rem_euclid(1_000_000),
                            if zone.is_some() { "Z" } else { "" }
                        )
                    }
                }
            }
            (value, data_type) => {
                return Err(format!(
                    "no documented rendering of {value:?} in a {data_type} column"
                ));
            }
        }))
    }

    /// Days between 0001-01-01 (day 1 of the common era) and 1970-01-01.
    const EPOCH_FROM_CE: i32 = 719_163;

    fn render_date(date: NaiveDate) -> String {
        let year = date.year();
        let (month, day) = (date.month(), date.day());
        if (0..=9999).contains(&year) {
            format!("{year:04}-{month:02}-{day:02}")
        } else {
            format!("{year:+05}-{month:02}-{day:02}")
        }
    }

    /// Shortest round-trip text: plain for 1e-5 <= |v| < 1e16 (and zero),
    /// scientific otherwise; `NaN`, `inf`, `-inf`.
    fn render_float(v: f64) -> String {
        if v.is_nan() {
            "NaN".into()
        } else if v.is_infinite() {
            if v > 0.0 { "inf" } else { "-inf" }.into()
        } else if v == 0.0 || (1e-5..1e16).contains(&v.abs()) {
            format!("{v}")
        } else {
            format!("{v:e}")
        }
    }

    /// Exact: `scale` digits after the point; a negative scale appends zeros.
    fn render_decimal(unscaled: i128, scale: i8) -> String {
        let sign = if unscaled < 0 { "-" } else { "" };
        let digits = unscaled.unsigned_abs().to_string();
        if scale <= 0 {
            let zeros = if unscaled == 0 {
                0
            } else {
                usize::from(scale.unsigned_abs())
            };
            return format!("{sign}{digits}{}", "0".repeat(zeros));
        }
        let scale = usize::from(scale.unsigned_abs());
        let padded = format!("{digits:0>width$}", width = scale + 1);
        let (whole, fraction) = padded.split_at(padded.len() - scale);
        format!("{sign}{whole}.{fraction}")
    }

    /// The value the sink's text stands for in a column of `data_type`:
    /// parsed, then rendered again, and refused unless that gives the same
    /// text (the sink writes one text per value).
    pub fn decode_value(text: &str, data_type: &DataType) -> Result<Value, String> {
        let value = parse_value(text, data_type)?;
        let again = render_value(&value, data_type)?;
        if again.as_deref() != Some(text) {
            return Err(format!(
                "{text:?} reads as {value:?}, whose rendering is {again:?}: not the documented text"
            ));
        }
        Ok(value)
    }

    fn parse_value(text: &str, data_type: &DataType) -> Result<Value, String> {
        let bad = |what: &str| format!("{text:?} is not {what}");
        Ok(match data_type {
            DataType::Boolean => match text {
                "true" => Value::Bool(true),
                "false" => Value::Bool(false),
                _ => return Err(bad("`true` or `false`")),
            },
            DataType::Int32 => Value::Int32(text.parse().map_err(|_| bad("an int32"))?),
            DataType::Int64 => Value::Int64(text.parse().map_err(|_| bad("an int64"))?),
            DataType::Float64 => Value::Float64(text.parse().map_err(|_| bad("a float"))?),
            DataType::Decimal128(_, scale) => Value::Decimal128(
                parse_decimal(text, *scale).ok_or_else(|| bad("a decimal of this scale"))?,
            ),
            DataType::Utf8 => Value::Utf8(text.to_string()),
            DataType::Binary => Value::Binary(hex::decode(text).map_err(|_| bad("hex"))?),
            DataType::Date32 => Value::Date32(match text {
                "infinity" => i32::MAX,
                "-infinity" => i32::MIN,
                _ => days_since_epoch(parse_date(text).ok_or_else(|| bad("a date"))?),
            }),
            DataType::Timestamp(TimeUnit::Microsecond, zone) => {
                Value::TimestampMicros(match text {
                    "infinity" => i64::MAX,
                    "-infinity" => i64::MIN,
                    _ => parse_timestamp(text, zone.is_some())
                        .ok_or_else(|| bad("a timestamp of this column"))?,
                })
            }
            other => return Err(format!("this reader has no decoding for {other} columns")),
        })
    }

    /// Rendering the result again checks what this lets through (leading
    /// zeros, the zeros a negative scale appends).
    fn parse_decimal(text: &str, scale: i8) -> Option<i128> {
        let (negative, body) = match text.strip_prefix('-') {
            Some(rest) => (true, rest),
            None => (false, text),
        };
        let digits = if scale > 0 {
            let (whole, fraction) = body.split_once('.')?;
            if fraction.len() != usize::from(scale.unsigned_abs()) {
                return None;
            }
            format!("{whole}{fraction}")
        } else {
            body.to_string()
        };
        if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        let mut magnitude: i128 = digits.parse().ok()?;
        if scale < 0 {
            magnitude /= 10_i128.checked_pow(u32::from(scale.unsigned_abs()))?;
        }
        Some(if negative { -magnitude } else { magnitude })
    }

    /// `YYYY-MM-DD`, or a signed year of any width.
    fn parse_date(text: &str) -> Option<NaiveDate> {
        let (sign, body) = match text.as_bytes().first()? {
            b'+' => (1, &text[1..]),
            b'-' => (-1, &text[1..]),
            _ => (1, text),
        };
        let mut parts = body.splitn(3, '-');
        let year: i32 = parts.next()?.parse().ok()?;
        let month: u32 = parts.next()?.parse().ok()?;
        let day: u32 = parts.next()?.parse().ok()?;
        NaiveDate::from_ymd_opt(sign * year, month, day)
    }

    fn days_since_epoch(date: NaiveDate) -> i32 {
        date.num_days_from_ce() - EPOCH_FROM_CE
    }

    /// `<date>THH:MM:SS.ffffff`, with a `Z` exactly when the column is zoned.
    fn parse_timestamp(text: &str, zoned: bool) -> Option<i64> {
        let text = if zoned { text.strip_suffix('Z')? } else { text };
        let (date, time) = text.split_once('T')?;
        let date = parse_date(date)?;
        let (clock, fraction) = time.split_once('.')?;
        if fraction.len() != 6 {
            return None;
        }
        let micros: u32 = fraction.parse().ok()?;
        let mut hms = clock.split(':').map(|p| p.parse::<u32>().ok());
        let (h, m, s) = (hms.next()??, hms.next()??, hms.next()??);
        let instant = date.and_hms_micro_opt(h, m, s, micros)?;
        Some(instant.and_utc().timestamp_micros())
    }

    /// How one source table lands in the sink's Redis.
    #[derive(Clone, Debug)]
    pub struct RedisTable {
        pub schema: Arc<TableSchema>,
        /// The pipeline's `as:` (the source name by default).
        pub destination: String,
        /// One stream of every change, rather than a hash per row.
        pub append: bool,
    }

    /// What one Redis sink of one pipeline holds, and how to read it: the
    /// sink's `prefix`, the pipeline's name and table mapping, and the
    /// context columns it names (`metadata:`), of which this reader knows
    /// `op` and `pos`.
    #[derive(Clone, Debug)]
    pub struct RedisView {
        pub prefix: String,
        pub pipeline: String,
        pub tables: Vec<RedisTable>,
        /// The field that holds `op`, if the pipeline delivers it.
        pub op_field: Option<String>,
        /// The field that holds `pos` (hex), if the pipeline delivers it.
        pub pos_field: Option<String>,
    }

    /// One row or stream entry as stored: the table's columns in order
    /// (null where the field is absent) and the context fields.
    #[derive(Clone, Debug, PartialEq)]
    pub struct StoredRow {
        pub values: Vec<Value>,
        pub op: Option<Op>,
        pub pos: Option<Vec<u8>>,
    }

    /// Everything under the sink's prefix, decoded.
    #[derive(Clone, Debug, Default)]
    pub struct RedisContent {
        /// Source table -> committed position and epoch.
        pub positions: BTreeMap<String, (Vec<u8>, u64)>,
        /// Upsert tables: source table -> rows by key.
        pub rows: BTreeMap<String, Rows<StoredRow>>,
        /// Append tables: source table -> every entry, in stream order.
        pub streams: BTreeMap<String, Vec<StoredRow>>,
    }

    impl RedisContent {
        /// Where each table stands, without epochs.
        pub fn committed(&self) -> BTreeMap<String, Vec<u8>> {
            self.positions
                .iter()
                .map(|(t, (p, _))| (t.clone(), p.clone()))
                .collect()
        }
    }

    impl RedisView {
        /// `tables` in upsert mode under their own names, pipeline
        /// `pipeline`, the sink's default prefix `weir`, no context fields.
        pub fn new(pipeline: &str, tables: &[Arc<TableSchema>]) -> Self {
            RedisView {
                prefix: "weir".into(),
                pipeline: pipeline.into(),
                tables: tables
                    .iter()
                    .map(|t| RedisTable {
                        schema: t.clone(),
                        destination: t.name.clone(),
                        append: false,
                    })
                    .collect(),
                op_field: None,
                pos_field: None,
            }
        }

        /// The sink's `prefix`.
        pub fn prefix(mut self, prefix: &str) -> Self {
            self.prefix = prefix.into();
            self
        }

        /// Table `table` goes to `destination`, appended or upserted.
        pub fn table(mut self, table: &str, append: bool, destination: &str) -> Self {
            let mapping = self
                .tables
                .iter_mut()
                .find(|t| t.schema.name == table)
                .unwrap_or_else(|| panic!("no table {table} in this view"));
            mapping.append = append;
            mapping.destination = destination.into();
            self
        }

        /// The context column `op` arrives as field `name`.
        pub fn op_field(mut self, name: &str) -> Self {
            self.op_field = Some(name.into());
            self
        }

        /// The context column `pos` arrives as field `name`.
        pub fn pos_field(mut self, name: &str) -> Self {
            self.pos_field = Some(name.into());
            self
        }

        fn position_key(&self, table: &str) -> String {
            format!(
                "{}:__weir:{}:{}",
                self.prefix,
                escape_key_part(&self.pipeline),
                escape_key_part(table)
            )
        }

        /// Reads every key under `<prefix>:` and decodes it; panics, naming
        /// the key, on anything the sink would not have written: a key no
        /// table or position explains, a wrong type, a field no column has,
        /// a value that is not its column's rendering, a row whose key does
        /// not match its key columns.
        pub fn read(&self, con: &mut ::redis::Connection) -> RedisContent {
            let mut content = RedisContent::default();
            for table in &self.tables {
                if table.append {
                    content
                        .streams
                        .insert(table.schema.name.clone(), Vec::new());
                } else {
                    content.rows.insert(table.schema.name.clone(), Rows::new());
                }
            }
            let positions: BTreeMap<String, &RedisTable> = self
                .tables
                .iter()
                .map(|t| (self.position_key(&t.schema.name), t))
                .collect();
            let mut unexplained = Vec::new();
            let head = format!("{}:", self.prefix);
            for (key, dumped) in dump(con, &head) {
                if let Some(table) = positions.get(&key) {
                    let Dumped::Hash(fields) = &dumped else {
                        panic!("position key {key:?} holds {dumped:?}, not a hash");
                    };
                    content
                        .positions
                        .insert(table.schema.name.clone(), position(&key, fields));
                    continue;
                }
                let parts = split_key_parts(&key[head.len()..])
                    .unwrap_or_else(|| panic!("key {key:?}: an escape the sink does not write"));
                let Some(table) = self.tables.iter().find(|t| t.destination == parts[0]) else {
                    unexplained.push(key);
                    continue;
                };
                let name = table.schema.name.clone();
                match (table.append, &dumped) {
                    (true, Dumped::Stream(entries)) if parts.len() == 1 => {
                        let decoded = entries
                            .iter()
                            .map(|(id, fields)| {
                                let what = format!("stream {key:?} entry {id}");
                                let mut map = BTreeMap::new();
                                for (field, value) in fields {
                                    if map.insert(field.clone(), value.clone()).is_some() {
                                        panic!("{what}: field {field:?} twice");
                                    }
                                }
                                self.stored_row(&what, table, &map)
                            })
                            .collect();
                        content.streams.insert(name, decoded);
                    }
                    (false, Dumped::Hash(fields)) if parts.len() == 1 + table.schema.key.len() => {
                        let what = format!("hash {key:?}");
                        let row = self.stored_row(&what, table, fields);
                        let key_values: Vec<Value> = table
                            .schema
                            .key
                            .iter()
                            .zip(&parts[1..])
                            .map(|(&column, part)| {
                                let column = &table.schema.columns[column];
                                decode_value(part, &column.data_type).unwrap_or_else(|e| {
                                    panic!("{what}: key part for column {}: {e}", column.name)
                                })
                            })
                            .collect();
                        let in_fields: Vec<Value> = table
                            .schema
                            .key
                            .iter()
                            .map(|&i| row.values[i].clone())
                            .collect();
                        assert_eq!(
                            key_values, in_fields,
                            "{what}: the key names other values than its key fields"
                        );
                        let rows = content.rows.get_mut(&name).expect("listed above");
                        rows.insert(row_key(&table.schema, &row.values), row);
                    }
                    _ => unexplained.push(key),
                }
            }
            assert!(
                unexplained.is_empty(),
                "{} keys under prefix {:?} that no table of pipeline {} explains (wrong type, \
                 wrong number of key parts, or an unknown destination): {:?}",
                unexplained.len(),
                self.prefix,
                self.pipeline,
                &unexplained[..unexplained.len().min(5)]
            );
            content
        }

        /// A hash or entry's fields as a row of `table`.
        fn stored_row(
            &self,
            what: &str,
            table: &RedisTable,
            fields: &BTreeMap<String, String>,
        ) -> StoredRow {
            let mut seen = 0;
            let mut values = Vec::with_capacity(table.schema.columns.len());
            for column in &table.schema.columns {
                values.push(match fields.get(&column.name) {
                    None => Value::Null,
                    Some(text) => {
                        seen += 1;
                        decode_value(text, &column.data_type)
                            .unwrap_or_else(|e| panic!("{what}, field {}: {e}", column.name))
                    }
                });
            }
            let op = self.op_field.as_ref().and_then(|f| fields.get(f)).map(|t| {
                seen += 1;
                Op::parse(t).unwrap_or_else(|| panic!("{what}: op {t:?} is no operation"))
            });
            let pos = self
                .pos_field
                .as_ref()
                .and_then(|f| fields.get(f))
                .map(|t| {
                    seen += 1;
                    hex::decode(t).unwrap_or_else(|_| panic!("{what}: pos {t:?} is not hex"))
                });
            if seen != fields.len() {
                let known: BTreeSet<&str> = table
                    .schema
                    .columns
                    .iter()
                    .map(|c| c.name.as_str())
                    .chain(self.op_field.as_deref())
                    .chain(self.pos_field.as_deref())
                    .collect();
                let extra: Vec<&String> = fields
                    .keys()
                    .filter(|f| !known.contains(f.as_str()))
                    .collect();
                panic!(
                    "{what}: fields no column of {} has: {extra:?}",
                    table.schema.name
                );
            }
            for (field, present) in [
                (&self.op_field, op.is_some()),
                (&self.pos_field, pos.is_some()),
            ] {
                if let Some(field) = field {
                    assert!(present, "{what}: no field {field:?}");
                }
            }
            StoredRow { values, op, pos }
        }

        /// What Redis must hold when each table stands where `committed`
        /// says (a table missing from it holds nothing): `log` applied up
        /// to each table's position.
        pub fn expected_at(
            &self,
            log: &[Change],
            committed: &BTreeMap<String, Vec<u8>>,
        ) -> RedisContent {
            self.expected(log, |table, pos| {
                committed.get(table).is_some_and(|at| pos <= at.as_slice())
            })
        }

        /// What Redis must hold once every change of `log` is committed.
        pub fn expected_after(&self, log: &[Change]) -> RedisContent {
            self.expected(log, |_, _| true)
        }

        /// `log` applied where `committed(table, position)` says a change
        /// is committed.
        fn expected(
            &self,
            log: &[Change],
            committed: impl Fn(&str, &[u8]) -> bool,
        ) -> RedisContent {
            let mut want = RedisContent::default();
            let mut append = BTreeMap::new();
            for table in &self.tables {
                append.insert(table.schema.name.as_str(), table.append);
                if table.append {
                    want.streams.insert(table.schema.name.clone(), Vec::new());
                } else {
                    want.rows.insert(table.schema.name.clone(), Rows::new());
                }
            }
            for change in log {
                let name = change.table.name.as_str();
                if !committed(name, change.pos.as_bytes()) {
                    continue;
                }
                let row = StoredRow {
                    values: change.values.clone(),
                    op: self.op_field.as_ref().map(|_| change.op),
                    pos: self
                        .pos_field
                        .as_ref()
                        .map(|_| change.pos.as_bytes().to_vec()),
                };
                match append.get(name) {
                    Some(true) => want.streams.get_mut(name).expect("listed").push(row),
                    Some(false) => {
                        let rows = want.rows.get_mut(name).expect("listed");
                        apply_change(rows, row_key(&change.table, &change.values), change.op, row);
                    }
                    None => panic!("the log has table {name}, which this view does not map"),
                }
            }
            want
        }

        /// Reads Redis and compares it with `log` applied up to the
        /// positions Redis itself records, per table: every upsert row
        /// exact (no key missing, none extra, none from a later change, no
        /// deleted row back), every stream exactly the table's changes up
        /// to its position (none twice, none missing, none extra, in
        /// order). Returns what it read.
        pub fn assert_exact(
            &self,
            label: &str,
            con: &mut ::redis::Connection,
            log: &[Change],
        ) -> RedisContent {
            let got = self.read(con);
            let want = self.expected_at(log, &got.committed());
            for (table, rows) in &want.rows {
                assert_rows_equal(label, table, rows, &got.rows[table]);
            }
            for (table, entries) in &want.streams {
                assert_stream_equal(label, table, entries, &got.streams[table]);
            }
            got
        }

        /// [`Self::assert_exact`], and every table at the end of the
        /// stream: equal to the oracle's `expected` state (the source of
        /// truth), every append stream holding all of its table's changes.
        pub fn assert_complete(
            &self,
            label: &str,
            con: &mut ::redis::Connection,
            log: &[Change],
            expected: &ExpectedState,
        ) -> RedisContent {
            let got = self.assert_exact(label, con, log);
            let all = self.expected_after(log);
            for table in &self.tables {
                let name = &table.schema.name;
                if table.append {
                    assert_stream_equal(label, name, &all.streams[name], &got.streams[name]);
                    // The stream reduced by key is the table's final state.
                    let mut reduced: Rows = Rows::new();
                    for row in &got.streams[name] {
                        let op = row.op.unwrap_or_else(|| {
                            panic!("{label}: append table {name} without an op field")
                        });
                        let key = row_key(&table.schema, &row.values);
                        apply_change(&mut reduced, key, op, row.values.clone());
                    }
                    crate::assert_table_matches(label, expected, name, &reduced);
                } else {
                    let values: Rows = got.rows[name]
                        .iter()
                        .map(|(k, r)| (k.clone(), r.values.clone()))
                        .collect();
                    crate::assert_table_matches(label, expected, name, &values);
                    assert_rows_equal(label, name, &all.rows[name], &got.rows[name]);
                }
            }
            got
        }
    }

    fn position(key: &str, fields: &BTreeMap<String, String>) -> (Vec<u8>, u64) {
        let keys: Vec<&str> = fields.keys().map(String::as_str).collect();
        assert_eq!(keys, ["epoch", "position"], "position hash {key:?}: fields");
        let hex_text = &fields["position"];
        assert!(
            hex_text
                .bytes()
                .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')),
            "position hash {key:?}: position {hex_text:?} is not lowercase hex"
        );
        let position = hex::decode(hex_text)
            .unwrap_or_else(|_| panic!("position hash {key:?}: position {hex_text:?}"));
        let epoch = fields["epoch"]
            .parse()
            .unwrap_or_else(|_| panic!("position hash {key:?}: epoch {:?}", fields["epoch"]));
        (position, epoch)
    }

    fn assert_rows_equal(label: &str, table: &str, want: &Rows<StoredRow>, got: &Rows<StoredRow>) {
        if want == got {
            return;
        }
        let missing: Vec<&Vec<KeyPart>> = want
            .keys()
            .filter(|k| !got.contains_key(*k))
            .take(3)
            .collect();
        let extra: Vec<&Vec<KeyPart>> = got
            .keys()
            .filter(|k| !want.contains_key(*k))
            .take(3)
            .collect();
        let differ: Vec<String> = want
            .iter()
            .filter(|(k, v)| got.get(*k).is_some_and(|g| g != *v))
            .take(2)
            .map(|(k, v)| format!("{k:?}: want {v:?}, got {:?}", got[k]))
            .collect();
        panic!(
            "{label}, Redis table {table}: {} rows expected, {} found; missing {missing:?}; \
             extra {extra:?}; differing {differ:?}",
            want.len(),
            got.len()
        );
    }

    fn assert_stream_equal(label: &str, table: &str, want: &[StoredRow], got: &[StoredRow]) {
        if want == got {
            return;
        }
        // Name the kind of difference by position where there is one.
        let positions = |rows: &[StoredRow]| -> Vec<Option<Vec<u8>>> {
            rows.iter().map(|r| r.pos.clone()).collect()
        };
        let (want_pos, got_pos) = (positions(want), positions(got));
        let mut seen = BTreeSet::new();
        let duplicates = got_pos.iter().filter(|p| !seen.insert(*p)).count();
        let wanted: BTreeSet<_> = want_pos.iter().collect();
        let present: BTreeSet<_> = got_pos.iter().collect();
        let missing = wanted.difference(&present).count();
        let extra = present.difference(&wanted).count();
        let first = want
            .iter()
            .zip(got)
            .position(|(w, g)| w != g)
            .unwrap_or(want.len().min(got.len()));
        panic!(
            "{label}, Redis stream of {table}: {} entries expected, {} found; {duplicates} \
             duplicated, {missing} missing, {extra} the source never produced (or past the \
             committed position); first difference at entry {first}: want {:?}, got {:?}",
            want.len(),
            got.len(),
            want.get(first),
            got.get(first)
        );
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        fn round_trip(value: Value, data_type: DataType, text: &str) {
            assert_eq!(
                render_value(&value, &data_type).unwrap().as_deref(),
                Some(text)
            );
            assert_eq!(decode_value(text, &data_type).unwrap(), value);
        }

        #[test]
        fn documented_renderings_read_back() {
            let utc = DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into()));
            let wall = DataType::Timestamp(TimeUnit::Microsecond, None);
            round_trip(Value::Int64(-42), DataType::Int64, "-42");
            round_trip(Value::Bool(true), DataType::Boolean, "true");
            round_trip(Value::Float64(0.1), DataType::Float64, "0.1");
            round_trip(Value::Float64(100.0), DataType::Float64, "100");
            round_trip(Value::Float64(-0.0), DataType::Float64, "-0");
            round_trip(Value::Float64(1e300), DataType::Float64, "1e300");
            round_trip(Value::Float64(2.5e-7), DataType::Float64, "2.5e-7");
            round_trip(Value::Float64(f64::NEG_INFINITY), DataType::Float64, "-inf");
            round_trip(
                Value::Decimal128(1990),
                DataType::Decimal128(10, 2),
                "19.90",
            );
            round_trip(Value::Decimal128(-5), DataType::Decimal128(10, 2), "-0.05");
            round_trip(Value::Decimal128(0), DataType::Decimal128(10, 2), "0.00");
            round_trip(Value::Decimal128(12), DataType::Decimal128(10, -2), "1200");
            round_trip(Value::Binary(vec![0xca, 0xfe]), DataType::Binary, "cafe");
            round_trip(Value::Binary(vec![]), DataType::Binary, "");
            round_trip(Value::Date32(0), DataType::Date32, "1970-01-01");
            round_trip(Value::Date32(-1), DataType::Date32, "1969-12-31");
            let days = |y, m, d| days_since_epoch(NaiveDate::from_ymd_opt(y, m, d).unwrap());
            round_trip(
                Value::Date32(days(10_000, 1, 1)),
                DataType::Date32,
                "+10000-01-01",
            );
            round_trip(
                Value::Date32(days(-1, 12, 31)),
                DataType::Date32,
                "-0001-12-31",
            );
            assert_eq!(days(-1, 12, 31), -719_163 - 366);
            round_trip(Value::Date32(i32::MAX), DataType::Date32, "infinity");
            round_trip(
                Value::TimestampMicros(1_704_164_645_123_456),
                utc.clone(),
                "2024-01-02T03:04:05.123456Z",
            );
            round_trip(
                Value::TimestampMicros(-1),
                wall.clone(),
                "1969-12-31T23:59:59.999999",
            );
            round_trip(Value::TimestampMicros(i64::MIN), utc.clone(), "-infinity");
        }

        #[test]
        fn texts_the_sink_does_not_write_are_refused() {
            let utc = DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into()));
            for (text, data_type) in [
                ("19.9", DataType::Decimal128(10, 2)),
                ("1e2", DataType::Float64),
                ("100.0", DataType::Float64),
                ("CAFE", DataType::Binary),
                ("TRUE", DataType::Boolean),
                ("+42", DataType::Int64),
                ("2024-1-02", DataType::Date32),
                ("2024-01-02T03:04:05.123456", utc.clone()),
                ("2024-01-02T03:04:05Z", utc),
            ] {
                assert!(
                    decode_value(text, &data_type).is_err(),
                    "{text:?} as {data_type} was accepted"
                );
            }
        }

        #[test]
        fn key_parts_unescape() {
            assert_eq!(split_key_parts(r"t:a\:b:c\\").unwrap(), ["t", "a:b", r"c\"]);
            assert_eq!(split_key_parts(r"t:a\x"), None);
            assert_eq!(escape_key_part(r"a:b\c"), r"a\:b\\c");
        }
    }
}
