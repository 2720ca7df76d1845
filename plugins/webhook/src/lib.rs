//! The webhook sink: POSTs each committed batch to an HTTP endpoint as JSON
//! Lines. At-least-once: a batch may arrive more than once, always with
//! the same `Idempotency-Key` (the batch id) and the same body, so the
//! receiver deduplicates by that key. See `docs/sinks/webhook.md`.
//!
//! `write` encodes the batch and stages it; `commit` POSTs the table's
//! staged batches in position order, one request per batch, and returns
//! once every one was answered with a 2xx. A batch that was answered is
//! not sent again by this instance; a failed commit leaves the rest
//! staged for the host's retry.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use weir_sdk::arrow_array::{ArrayRef, StringArray};
use weir_sdk::arrow_schema::{ArrowError, DataType, Field, Schema};
use weir_sdk::net::http::{HttpError, Request, Response};
use weir_sdk::{
    Batch, CommitRequest, Config, OP_COLUMN, POS_COLUMN, RecordBatch, Result, Sink, SinkError,
};

/// Config key: the URL every batch is POSTed to (`http://` or `https://`).
pub const URL_KEY: &str = "url";
/// Config key: how long to wait, in milliseconds, to connect and then for
/// each part of the answer.
pub const TIMEOUT_KEY: &str = "timeout_ms";
/// Config key prefix: `headers.<name>` adds header `<name>` to every
/// request.
pub const HEADER_PREFIX: &str = "headers.";

/// The default of [`TIMEOUT_KEY`].
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// Request header: the batch id, the same each time the batch is sent.
pub const IDEMPOTENCY_KEY: &str = "Idempotency-Key";
/// Request header: the pipeline that commits.
pub const PIPELINE_HEADER: &str = "Weir-Pipeline";
/// Request header: the table's name in the source.
pub const TABLE_HEADER: &str = "Weir-Table";
/// Request header: the destination name the operator chose for the table.
pub const DESTINATION_HEADER: &str = "Weir-Destination";
/// Request header: hex of the position of the batch's first change.
pub const POSITION_LOW_HEADER: &str = "Weir-Position-Low";
/// Request header: hex of the position the table is at once the batch is
/// committed.
pub const POSITION_HIGH_HEADER: &str = "Weir-Position-High";
/// Request header: the number of rows (lines) in the body.
pub const ROWS_HEADER: &str = "Weir-Rows";
/// The body's media type.
pub const CONTENT_TYPE: &str = "application/x-ndjson";

/// Headers the sink sets itself; `headers.<name>` may not replace them.
const OWN_HEADERS: [&str; 10] = [
    IDEMPOTENCY_KEY,
    PIPELINE_HEADER,
    TABLE_HEADER,
    DESTINATION_HEADER,
    POSITION_LOW_HEADER,
    POSITION_HIGH_HEADER,
    ROWS_HEADER,
    "Content-Type",
    "Content-Length",
    "Host",
];

/// How much of an error answer's body goes into the error message.
const MAX_REASON_CHARS: usize = 200;

/// The largest answer body read. Receivers answer with a line or two; a
/// bigger answer fails the request (as a fatal error) instead of filling
/// the sink's memory.
const MAX_ANSWER_BYTES: usize = 1 << 20;

/// Where and how to send.
#[derive(Debug, Clone)]
struct Settings {
    url: String,
    headers: Vec<(String, String)>,
    timeout: Duration,
}

impl Settings {
    fn from_config(config: &Config) -> Result<Settings> {
        let url = config.require(URL_KEY)?.to_string();
        let timeout_ms: u64 = config.parse(TIMEOUT_KEY, DEFAULT_TIMEOUT.as_millis() as u64)?;
        if timeout_ms == 0 {
            return Err(SinkError::Fatal(format!(
                "config key `{TIMEOUT_KEY}`: must be at least 1 (milliseconds)"
            )));
        }
        let mut headers = Vec::new();
        for (key, value) in config.iter() {
            if key == URL_KEY || key == TIMEOUT_KEY {
                continue;
            }
            let Some(name) = key.strip_prefix(HEADER_PREFIX) else {
                return Err(SinkError::Fatal(format!(
                    "config key `{key}` is unknown; the webhook sink reads `{URL_KEY}`, \
                     `{TIMEOUT_KEY}` and `{HEADER_PREFIX}<name>`"
                )));
            };
            if let Some(own) = OWN_HEADERS.iter().find(|h| h.eq_ignore_ascii_case(name)) {
                return Err(SinkError::Fatal(format!(
                    "config key `{key}`: the sink sets `{own}` itself"
                )));
            }
            headers.push((name.to_string(), value.to_string()));
        }
        let settings = Settings {
            url,
            headers,
            timeout: Duration::from_millis(timeout_ms),
        };
        // Refuse a malformed URL or header now, not at the first commit.
        settings.request().validate().map_err(|e| {
            SinkError::Fatal(format!(
                "config keys `{URL_KEY}` / `{HEADER_PREFIX}*`: {}",
                e.message()
            ))
        })?;
        Ok(settings)
    }

    /// A POST to the URL with the operator's headers.
    fn request(&self) -> Request {
        let mut request = Request::post(&self.url)
            .timeout(self.timeout)
            .max_response_bytes(MAX_ANSWER_BYTES);
        for (name, value) in &self.headers {
            request = request.header(name, value);
        }
        request
    }
}

/// A batch encoded and waiting for its table's commit.
#[derive(Debug, Clone)]
struct Staged {
    id: String,
    table: String,
    destination: String,
    low: Vec<u8>,
    high: Vec<u8>,
    rows: usize,
    body: Vec<u8>,
}

/// The sink. One instance per loaded plugin.
#[derive(Default)]
pub struct WebhookSink {
    settings: Option<Settings>,
    /// Batches written and not yet delivered, per table, in position order.
    staged: HashMap<String, VecDeque<Staged>>,
}

impl Sink for WebhookSink {
    fn open(&mut self, _pipeline: &str, config: &Config) -> Result<()> {
        self.settings = Some(Settings::from_config(config)?);
        Ok(())
    }

    fn write(&mut self, batch: Batch) -> Result<()> {
        // Batches without rows are not sent: there is nothing to deliver,
        // and the host keeps the position.
        if batch.is_empty() {
            return Ok(());
        }
        let staged = Staged {
            body: json_lines(&batch)?,
            rows: batch.num_rows(),
            id: batch.id,
            table: batch.table.name,
            destination: batch.table.destination,
            low: batch.low,
            high: batch.high,
        };
        self.staged
            .entry(staged.table.clone())
            .or_default()
            .push_back(staged);
        Ok(())
    }

    fn commit(&mut self, request: CommitRequest) -> Result<()> {
        let settings = self.settings.as_ref().ok_or_else(|| {
            SinkError::Fatal("commit before open: the sink has no configuration".into())
        })?;
        let Some(queue) = self.staged.get_mut(&request.table) else {
            return Ok(());
        };
        let (mut batches, mut rows) = (0, 0);
        while let Some(batch) = queue.front() {
            deliver(settings, &request.pipeline, batch)?;
            batches += 1;
            rows += batch.rows;
            // Answered: a retry of this commit does not send it again.
            queue.pop_front();
        }
        self.staged.remove(&request.table);
        if batches > 0 {
            weir_sdk::log::info(format!(
                "{}: delivered {batches} batch(es), {rows} row(s), to {}",
                request.table, settings.url
            ));
        }
        Ok(())
    }

    fn abort(&mut self, table: &str) {
        self.staged.remove(table);
    }
}

/// POSTs one batch and judges the answer.
fn deliver(settings: &Settings, pipeline: &str, batch: &Staged) -> Result<()> {
    let request = settings
        .request()
        .header("Content-Type", CONTENT_TYPE)
        .header(IDEMPOTENCY_KEY, header_text(&batch.id))
        .header(PIPELINE_HEADER, header_text(pipeline))
        .header(TABLE_HEADER, header_text(&batch.table))
        .header(DESTINATION_HEADER, header_text(&batch.destination))
        .header(POSITION_LOW_HEADER, hex::encode(&batch.low))
        .header(POSITION_HIGH_HEADER, hex::encode(&batch.high))
        .header(ROWS_HEADER, batch.rows.to_string())
        .body(batch.body.clone());
    let what = format!("batch {} of table {}", batch.id, batch.table);
    let response = request.send().map_err(|e| match e {
        HttpError::Timeout(_) | HttpError::Connection(_) => {
            SinkError::Retryable(format!("{what}: {e}"))
        }
        HttpError::Denied(_) | HttpError::Invalid(_) | HttpError::TooLarge(_) => {
            SinkError::Fatal(format!("{what}: {e}"))
        }
    })?;
    judge(&settings.url, &what, &response)
}

/// 2xx: delivered. 5xx, 429 (too many requests) and 408 (request timeout):
/// the receiver may take it later. Anything else: it never will.
fn judge(url: &str, what: &str, response: &Response) -> Result<()> {
    let status = response.status;
    if response.is_success() {
        return Ok(());
    }
    let message = format!(
        "{url} answered {status} to {what}: {}",
        first_line(&response.text())
    );
    match status {
        408 | 429 | 500..=599 => Err(SinkError::Retryable(message)),
        300..=399 => Err(SinkError::Fatal(format!(
            "{message} (redirects are not followed: set `{URL_KEY}` to the final location)"
        ))),
        _ => Err(SinkError::Fatal(message)),
    }
}

/// The first non-empty line of an answer, at most [`MAX_REASON_CHARS`]
/// characters, for an error message.
fn first_line(text: &str) -> String {
    let line = text.lines().map(str::trim).find(|l| !l.is_empty());
    let Some(line) = line else {
        return "(empty body)".into();
    };
    let mut shown: String = line.chars().take(MAX_REASON_CHARS).collect();
    if line.chars().count() > MAX_REASON_CHARS {
        shown.push('…');
    }
    shown
}

/// `value` as a header value: visible ASCII as is, every other byte of its
/// UTF-8 (and `%` itself) percent-encoded, so any table name fits.
fn header_text(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for byte in value.bytes() {
        if byte.is_ascii_graphic() && byte != b'%' {
            out.push(byte as char);
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

/// One JSON object per row: the batch's columns by name (the data and the
/// metadata columns the operator asked for), `__op` (`insert`, `update`,
/// `delete` or `read`) and `__pos` (hex of the row's position). Nulls are
/// written as `null`.
fn json_lines(batch: &Batch) -> Result<Vec<u8>> {
    let data = batch.data();
    let ops: StringArray = batch.ops().iter().map(|op| Some(op.as_str())).collect();
    let positions: StringArray = batch
        .positions()
        .iter()
        .map(|p| p.map(hex::encode))
        .collect();
    let mut fields = data.schema().fields().to_vec();
    fields.push(Arc::new(Field::new(OP_COLUMN, DataType::Utf8, false)));
    fields.push(Arc::new(Field::new(POS_COLUMN, DataType::Utf8, false)));
    let mut columns = data.columns().to_vec();
    columns.push(Arc::new(ops) as ArrayRef);
    columns.push(Arc::new(positions) as ArrayRef);
    // A value JSON cannot hold will not become writable on a retry.
    let poison = |e: ArrowError| {
        SinkError::Poison(format!(
            "batch {} of table {}: cannot write it as JSON: {e}",
            batch.id, batch.table.name
        ))
    };
    let rows = RecordBatch::try_new(Arc::new(Schema::new(fields)), columns).map_err(poison)?;
    let mut writer = arrow_json::WriterBuilder::new()
        .with_explicit_nulls(true)
        .build::<_, arrow_json::writer::LineDelimited>(Vec::new());
    writer.write(&rows).map_err(poison)?;
    writer.finish().map_err(poison)?;
    Ok(writer.into_inner())
}

weir_sdk::export_sink!(WebhookSink);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_text_keeps_ascii_and_encodes_the_rest() {
        assert_eq!(header_text("public.orders"), "public.orders");
        assert_eq!(
            header_text("ventes.commandes_été"),
            "ventes.commandes_%C3%A9t%C3%A9"
        );
        assert_eq!(header_text("a b%c"), "a%20b%25c");
    }

    #[test]
    fn rows_are_json_lines_as_documented() {
        use weir_sdk::arrow_array::{
            BinaryArray, Decimal128Array, Int64Array, TimestampMicrosecondArray,
        };
        use weir_sdk::{BatchMeta, Table};

        let records = RecordBatch::try_from_iter([
            ("id", Arc::new(Int64Array::from(vec![7, 9])) as ArrayRef),
            (
                "total",
                Arc::new(
                    Decimal128Array::from(vec![Some(1990), None])
                        .with_precision_and_scale(10, 2)
                        .unwrap(),
                ) as ArrayRef,
            ),
            (
                "paid_at",
                Arc::new(
                    TimestampMicrosecondArray::from(vec![Some(1_700_000_000_000_000), None])
                        .with_timezone("+00:00"),
                ) as ArrayRef,
            ),
            (
                "blob",
                Arc::new(BinaryArray::from_opt_vec(vec![Some(&[0xCA, 0xFE]), None])) as ArrayRef,
            ),
            (
                OP_COLUMN,
                Arc::new(StringArray::from(vec!["update", "delete"])) as ArrayRef,
            ),
            (
                POS_COLUMN,
                Arc::new(BinaryArray::from_iter_values([[0x01, 0xA0], [0x01, 0xA1]])) as ArrayRef,
            ),
        ])
        .unwrap();
        let meta = BatchMeta {
            table: Table::new("public.orders"),
            id: "b".into(),
            low: vec![1],
            high: vec![2],
            rows: 2,
        };
        let batch = Batch::from_records(meta, records).unwrap();
        let text = String::from_utf8(json_lines(&batch).unwrap()).unwrap();
        assert_eq!(
            text,
            "{\"id\":7,\"total\":19.90,\"paid_at\":\"2023-11-14T22:13:20Z\",\
             \"blob\":\"cafe\",\"__op\":\"update\",\"__pos\":\"01a0\"}\n\
             {\"id\":9,\"total\":null,\"paid_at\":null,\"blob\":null,\
             \"__op\":\"delete\",\"__pos\":\"01a1\"}\n"
        );
    }

    #[test]
    fn first_line_is_bounded() {
        assert_eq!(first_line("\n  bad row 7\nmore"), "bad row 7");
        assert_eq!(first_line(""), "(empty body)");
        let long = "x".repeat(500);
        let shown = first_line(&long);
        assert_eq!(shown.chars().count(), MAX_REASON_CHARS + 1);
        assert!(shown.ends_with('…'));
    }

    #[test]
    fn statuses_map_to_what_the_host_should_do() {
        let answer = |status| Response {
            status,
            headers: Vec::new(),
            body: b"why\nmore".to_vec(),
        };
        let judged = |status| judge("http://x", "batch b", &answer(status));
        for ok in [200, 201, 202, 204] {
            assert!(judged(ok).is_ok(), "{ok}");
        }
        for retry in [408, 429, 500, 502, 503, 504] {
            assert!(
                matches!(judged(retry), Err(SinkError::Retryable(_))),
                "{retry}"
            );
        }
        for fatal in [301, 302, 400, 401, 403, 404, 409, 413, 422] {
            let e = judged(fatal).unwrap_err();
            assert!(matches!(e, SinkError::Fatal(_)), "{fatal}");
            assert!(e.message().contains(&fatal.to_string()), "{e}");
            assert!(
                e.message().contains("why") && !e.message().contains("more"),
                "{e}"
            );
        }
    }
}
