//! The webhook sink as a plugin in a pipeline, through the host's
//! `wasi:http`: a receiver this test runs (the service the sink posts to)
//! records every request; the run is killed between the sink's commit and
//! the host's record of it and run again, so a batch is delivered twice. The receiver's copies of one
//! `Idempotency-Key` must be identical, and the rows, reduced by key in
//! `__pos` order, must equal the generator's oracle: nothing missing.

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::sync::{Arc, Mutex};

use arrow_array::{ArrayRef, BinaryArray, RecordBatch, cast::AsArray};
use arrow_schema::{DataType, Field, Schema};
use common::*;
use weir_sdk::{OP_COLUMN, POS_COLUMN};

const SEED: u64 = 33;
const CHANGES: u64 = 3_000;

/// One POST as the receiver got it.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Delivery {
    key: String,
    table: String,
    low: String,
    high: String,
    body: Vec<u8>,
}

type Log = Arc<Mutex<Vec<Delivery>>>;

/// Receives on 127.0.0.1, answers every POST `200`, and logs it.
fn receiver() -> (u16, Log) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let log = Log::default();
    let kept = log.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let log = kept.clone();
            std::thread::spawn(move || serve(stream, &log));
        }
    });
    (port, log)
}

fn serve(stream: TcpStream, log: &Log) {
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut writer = stream;
    loop {
        let mut request_line = String::new();
        if reader.read_line(&mut request_line).unwrap_or(0) == 0 {
            return;
        }
        let mut headers = BTreeMap::new();
        loop {
            let mut line = String::new();
            if reader.read_line(&mut line).unwrap_or(0) == 0 {
                return;
            }
            let line = line.trim_end();
            if line.is_empty() {
                break;
            }
            if let Some((name, value)) = line.split_once(':') {
                headers.insert(name.trim().to_ascii_lowercase(), value.trim().to_string());
            }
        }
        let length: usize = headers
            .get("content-length")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        let mut body = vec![0; length];
        if reader.read_exact(&mut body).is_err() {
            return;
        }
        let header = |name: &str| headers.get(name).cloned().unwrap_or_default();
        log.lock().unwrap().push(Delivery {
            key: header("idempotency-key"),
            table: header("weir-table"),
            low: header("weir-position-low"),
            high: header("weir-position-high"),
            body,
        });
        if writer
            .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
            .is_err()
        {
            return;
        }
    }
}

/// The rows of one delivery's body as a record batch with the host's
/// column types (read back with arrow-json, the inverse of the sink's
/// writer), `__pos` turned back from hex into bytes.
fn rows(table: &weir_source::change::TableSchema, body: &[u8]) -> RecordBatch {
    let mut fields: Vec<Field> = table
        .columns
        .iter()
        .map(|c| Field::new(&c.name, c.data_type.clone(), true))
        .collect();
    fields.push(Field::new(OP_COLUMN, DataType::Utf8, false));
    fields.push(Field::new(POS_COLUMN, DataType::Utf8, false));
    let schema = Arc::new(Schema::new(fields));
    let mut reader = arrow_json::ReaderBuilder::new(schema.clone())
        .build(body)
        .expect("a JSON lines reader");
    let batch = reader
        .next()
        .expect("at least one row")
        .expect("the body reads with the table's types");
    assert!(reader.next().is_none(), "the body fit one read");
    let positions: BinaryArray = batch
        .column(batch.num_columns() - 1)
        .as_string::<i32>()
        .iter()
        .map(|hex_text| Some(hex::decode(hex_text.expect("__pos is never null")).unwrap()))
        .collect();
    let mut columns: Vec<ArrayRef> = batch.columns().to_vec();
    *columns.last_mut().unwrap() = Arc::new(positions);
    let mut fields: Vec<Field> = schema.fields().iter().map(|f| f.as_ref().clone()).collect();
    *fields.last_mut().unwrap() = Field::new(POS_COLUMN, DataType::Binary, false);
    RecordBatch::try_new(Arc::new(Schema::new(fields)), columns).unwrap()
}

/// The `__pos` of every row of a delivery's body.
fn positions_in(body: &[u8]) -> BTreeSet<String> {
    body.split(|b| *b == b'\n')
        .filter(|line| !line.is_empty())
        .map(|line| {
            let row: serde_json::Value =
                serde_json::from_slice(line).expect("a JSON object per line");
            row[POS_COLUMN].as_str().expect("__pos as hex").to_string()
        })
        .collect()
}

fn webhook(dir: &Path, port: u16) -> SinkBuilder {
    sink("hooks", "weir-webhook-sink", dir)
        .grant_http(&format!("http://127.0.0.1:{port}"))
        .config("url", &format!("http://127.0.0.1:{port}/changes"))
}

#[test]
fn every_change_arrives_and_a_replayed_batch_is_the_same_request() {
    let dir = tempfile::tempdir().unwrap();
    let (port, log) = receiver();
    let pipeline = workload(SEED, CHANGES, 100)
        .sink(webhook(dir.path(), port))
        .write_in(dir.path());

    // Killed after the sink's 6th commit returned and before the host
    // recorded it: the next run replays what that commit delivered.
    run_killed_at(&pipeline, "after-sink-commit@6");
    let delivered_before_kill = log.lock().unwrap().len();
    assert!(
        delivered_before_kill > 0,
        "nothing was delivered before the kill"
    );

    let out = weir(&["run", pipeline.to_str().unwrap()], &[]);
    assert!(out.status.success(), "{}", text(&out));

    let deliveries = log.lock().unwrap().clone();
    assert!(
        deliveries.len() > delivered_before_kill,
        "the second run sent nothing"
    );
    // Copies of one batch are the same request.
    let mut by_key: BTreeMap<&str, &Delivery> = BTreeMap::new();
    let mut repeated = 0;
    for delivery in &deliveries {
        assert!(
            !delivery.key.is_empty(),
            "a request without Idempotency-Key"
        );
        if let Some(first) = by_key.insert(&delivery.key, delivery) {
            assert_eq!(
                first, delivery,
                "two different requests under one Idempotency-Key"
            );
            repeated += 1;
        }
    }
    if repeated == 0 {
        panic!("INCONCLUSIVE: the replay after the kill delivered no batch twice");
    }

    // No gap: taken in order, each batch of a table holds exactly the last
    // change per key of the generator's changes since the batch before it
    // (up to its high position), and the last one reaches the table's last
    // change. A lost batch would leave its changes in no batch's rows.
    let log: Vec<_> = weir_source::generator::oracle::change_log(SEED, CHANGES).collect();
    for table in tables() {
        let mut batches: Vec<&Delivery> = by_key
            .values()
            .copied()
            .filter(|d| d.table == table.name)
            .collect();
        batches.sort_by(|a, b| a.high.cmp(&b.high));
        let mut after = String::new();
        for batch in batches {
            let mut last = BTreeMap::new();
            for change in log.iter().filter(|c| c.table.name == table.name) {
                let pos = change.pos.to_hex();
                if after < pos && pos <= batch.high {
                    last.insert(format!("{:?}", change.key_values()), pos);
                }
            }
            let expected: BTreeSet<String> = last.into_values().collect();
            assert_eq!(
                positions_in(&batch.body),
                expected,
                "{}: batch {} ({}..={}) after {after}",
                table.name,
                batch.key,
                batch.low,
                batch.high
            );
            after = batch.high.clone();
        }
        if let Some(final_change) = log.iter().rfind(|c| c.table.name == table.name) {
            assert!(
                final_change.pos.to_hex() <= after,
                "{}: its last change {} reached the receiver in no batch",
                table.name,
                final_change.pos
            );
        }
    }

    // Every change arrived: the rows reduce to the oracle, table by table.
    let expected = expected_state(SEED, CHANGES);
    for table in tables() {
        let batches: Vec<RecordBatch> = deliveries
            .iter()
            .filter(|d| d.table == table.name)
            .map(|d| rows(&table, &d.body))
            .collect();
        let reduced = reduce(&table, changes(&table, &batches));
        assert_table_matches("webhook", &expected, &table.name, &reduced.state);
    }
}
