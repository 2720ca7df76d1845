//! Reading a destination back through the operator's reader, and comparing
//! what it shows with what the test host committed.
//!
//! The harness never looks at the sink's storage itself: what a sink wrote
//! is whatever the operator's reader (a program they trust) prints.

use std::collections::BTreeMap;
use std::fmt;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::config::{Shows, VerifyConfig};

/// One row as the harness compares it: the fields it sent, and the change
/// kind where the reader shows changes. Other fields a reader prints are
/// ignored; a missing field counts as null.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Row {
    pub id: i64,
    pub name: Option<String>,
    pub amount: Option<i64>,
    pub note: Option<String>,
    /// `insert`, `update`, `delete` or `read`; `None` in a state reading.
    pub op: Option<String>,
}

impl fmt::Display for Row {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{{id: {}", self.id)?;
        if let Some(op) = &self.op {
            write!(f, ", op: {op}")?;
        }
        match &self.name {
            Some(name) => write!(f, ", name: {name:?}")?,
            None => write!(f, ", name: null")?,
        }
        match self.amount {
            Some(amount) => write!(f, ", amount: {amount}")?,
            None => write!(f, ", amount: null")?,
        }
        if let Some(note) = &self.note {
            write!(f, ", note: {note:?}")?;
        }
        write!(f, "}}")
    }
}

/// The most a reader may print for one table.
const MAX_READER_OUTPUT: u64 = 256 << 20;

/// The operator's reader, ready to run.
pub struct Reader {
    program: String,
    args: Vec<String>,
    dir: PathBuf,
    pub shows: Shows,
    timeout: Duration,
}

impl Reader {
    pub fn new(config: &VerifyConfig, base_dir: &Path) -> Reader {
        Reader {
            program: config.command[0].clone(),
            args: config.command[1..].to_vec(),
            dir: base_dir.to_path_buf(),
            shows: config.shows,
            timeout: config.timeout(),
        }
    }

    /// What the destination holds of `table`. `Err` means the reader could
    /// not say (it failed, hung or printed something else than rows).
    pub fn read(&self, root: &Path, table: &str, pipeline: &str) -> Result<Vec<Row>, String> {
        let mut child = Command::new(&self.program)
            .args(&self.args)
            .current_dir(&self.dir)
            .env("WEIR_TEST_ROOT", root)
            .env("WEIR_TEST_TABLE", table)
            .env("WEIR_TEST_PIPELINE", pipeline)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("the reader `{}` did not start: {e}", self.program))?;
        // Drained on their own threads, so a reader that prints a lot does
        // not block on a full pipe while we wait for it.
        let stdout = child.stdout.take().map(drain);
        let stderr = child.stderr.take().map(drain);
        let deadline = Instant::now() + self.timeout;
        let status = loop {
            match child.try_wait() {
                Ok(Some(status)) => break status,
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(10))
                }
                Ok(None) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(format!(
                        "the reader did not finish within {} ms (verify.timeout_ms)",
                        self.timeout.as_millis()
                    ));
                }
                Err(e) => return Err(format!("waiting for the reader: {e}")),
            }
        };
        let stdout = stdout
            .map(|t| t.join().unwrap_or_default())
            .unwrap_or_default();
        let stderr = stderr
            .map(|t| t.join().unwrap_or_default())
            .unwrap_or_default();
        if !status.success() {
            let said = String::from_utf8_lossy(&stderr);
            let said = said.trim();
            let tail = &said[said.len().saturating_sub(400)..];
            return Err(format!("the reader failed ({status}) for {table}: {tail}"));
        }
        let text = String::from_utf8(stdout)
            .map_err(|_| format!("the reader printed bytes that are not UTF-8 for {table}"))?;
        text.lines()
            .enumerate()
            .filter(|(_, line)| !line.trim().is_empty())
            .map(|(i, line)| {
                parse_row(line, self.shows)
                    .map_err(|why| format!("the reader's line {} for {table}: {why}", i + 1))
            })
            .collect()
    }
}

fn drain(mut from: impl Read + Send + 'static) -> std::thread::JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        let mut bytes = Vec::new();
        let _ = (&mut from).take(MAX_READER_OUTPUT).read_to_end(&mut bytes);
        bytes
    })
}

fn parse_row(line: &str, shows: Shows) -> Result<Row, String> {
    let value: Value = serde_json::from_str(line).map_err(|e| format!("not JSON: {e}"))?;
    let Value::Object(fields) = value else {
        return Err("not a JSON object".into());
    };
    let field = |name: &str| fields.get(name).filter(|v| !v.is_null());
    let integer = |name: &str| -> Result<Option<i64>, String> {
        match field(name) {
            None => Ok(None),
            Some(Value::Number(n)) => n
                .as_i64()
                .map(Some)
                .ok_or_else(|| format!("`{name}` is {n}, not an integer")),
            // Stores that keep text only (Redis hashes) print numbers as
            // strings; the value is what counts.
            Some(Value::String(s)) => s
                .parse()
                .map(Some)
                .map_err(|_| format!("`{name}` is {s:?}, not an integer")),
            Some(other) => Err(format!("`{name}` is {other}, not an integer")),
        }
    };
    let text = |name: &str| -> Result<Option<String>, String> {
        match field(name) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(other) => Err(format!("`{name}` is {other}, not a string")),
        }
    };
    let id = integer("id")?.ok_or("no `id`")?;
    let op = match shows {
        Shows::State => None,
        Shows::Changes => Some(text("op")?.ok_or("no `op` (the reader shows changes)")?),
    };
    Ok(Row {
        id,
        name: text("name")?,
        amount: integer("amount")?,
        note: text("note")?,
        op,
    })
}

/// How a reading differs from what was committed; empty when equal.
#[derive(Debug, Default)]
pub struct Difference {
    /// Rows shown more often than committed, with how many extra.
    pub repeated: Vec<(Row, usize)>,
    /// Committed rows not shown.
    pub missing: Vec<Row>,
    /// Rows shown that were never committed.
    pub unexpected: Vec<Row>,
}

impl Difference {
    pub fn between(expected: &[Row], seen: &[Row]) -> Difference {
        let mut counts: BTreeMap<&Row, (usize, usize)> = BTreeMap::new();
        for row in expected {
            counts.entry(row).or_default().0 += 1;
        }
        for row in seen {
            counts.entry(row).or_default().1 += 1;
        }
        let mut difference = Difference::default();
        for (row, (want, got)) in counts {
            match (want, got) {
                (0, _) => difference.unexpected.push(row.clone()),
                (w, g) if g > w => difference.repeated.push((row.clone(), g - w)),
                (w, g) if g < w => difference.missing.push(row.clone()),
                _ => {}
            }
        }
        difference
    }

    pub fn is_empty(&self) -> bool {
        self.repeated.is_empty() && self.missing.is_empty() && self.unexpected.is_empty()
    }
}

impl fmt::Display for Difference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts = Vec::new();
        // Each kind of difference has one usual cause: named with it, so an
        // author reads the fix and not only the symptom.
        if !self.repeated.is_empty() {
            let extra: usize = self.repeated.iter().map(|(_, n)| n).sum();
            parts.push(format!(
                "{extra} duplicate row(s), e.g. {} shown {} time(s) too many \
                 (usually a batch the host sent again was added again: name what a batch \
                 writes by its `batch.id`, the same on every replay, so that a replay \
                 replaces the first attempt; or store positions with the data)",
                self.repeated[0].0, self.repeated[0].1
            ));
        }
        if !self.missing.is_empty() {
            parts.push(format!(
                "{} committed row(s) missing, e.g. {} (usually `commit` returned before \
                 the data was durable, or wrote only some of the batches staged since the \
                 last commit)",
                self.missing.len(),
                self.missing[0]
            ));
        }
        if !self.unexpected.is_empty() {
            parts.push(format!(
                "{} row(s) that were never committed, e.g. {} (usually `write` made rows \
                 visible before `commit`, or `abort` left staged rows behind: both may \
                 only stage and drop)",
                self.unexpected.len(),
                self.unexpected[0]
            ));
        }
        write!(f, "{}", parts.join("; "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(id: i64, op: Option<&str>) -> Row {
        Row {
            id,
            name: Some(format!("n{id}")),
            amount: Some(id * 10),
            note: None,
            op: op.map(String::from),
        }
    }

    #[test]
    fn numbers_may_come_as_strings_and_missing_fields_are_null() {
        let parsed = parse_row(
            r#"{"id":"3","name":"n3","amount":30,"__pos":"aa","extra":1}"#,
            Shows::State,
        )
        .unwrap();
        assert_eq!(parsed, row(3, None));
        let change = parse_row(r#"{"id":4,"op":"delete"}"#, Shows::Changes).unwrap();
        assert_eq!(change.op.as_deref(), Some("delete"));
        assert_eq!(change.name, None);
        assert!(parse_row(r#"{"id":1}"#, Shows::Changes).is_err());
        assert!(parse_row(r#"{"name":"x"}"#, Shows::State).is_err());
        assert!(parse_row(r#"[1]"#, Shows::State).is_err());
        assert!(parse_row(r#"{"id":1.5}"#, Shows::State).is_err());
    }

    #[test]
    fn a_difference_tells_duplicates_gaps_and_strangers_apart() {
        let expected = [row(1, None), row(2, None), row(3, None)];
        let seen = [row(1, None), row(1, None), row(3, None), row(9, None)];
        let d = Difference::between(&expected, &seen);
        assert_eq!(d.repeated, [(row(1, None), 1)]);
        assert_eq!(d.missing, [row(2, None)]);
        assert_eq!(d.unexpected, [row(9, None)]);
        let text = d.to_string();
        assert!(text.contains("1 duplicate"), "{text}");
        // Each with its usual cause.
        assert!(text.contains("`batch.id`"), "{text}");
        assert!(text.contains("before the data was durable"), "{text}");
        assert!(text.contains("visible before `commit`"), "{text}");
        assert!(Difference::between(&expected, &expected).is_empty());
    }
}
