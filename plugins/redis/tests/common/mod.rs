//! A private redis-server per test (weir-test-support's guard), the sink
//! opened against it, and Arrow batches for the sink.

#![allow(dead_code)] // each test file uses its own part

use std::collections::BTreeMap;
use std::sync::Arc;

use weir_redis_sink::RedisSink;
use weir_sdk::arrow_array::{ArrayRef, BinaryArray, RecordBatch, StringArray};
use weir_sdk::native::{NativeSink, encode_ipc};
use weir_sdk::{BatchMeta, CommitRequest, Mode, Result, Table};
/// The one guard of a private redis-server, shared with the end-to-end tests.
pub use weir_test_support::RedisServer;

/// A sink opened against `server` with `extra` config entries.
pub fn open_sink(server: &RedisServer, extra: &[(&str, &str)]) -> Result<NativeSink<RedisSink>> {
    let mut config = vec![("address".to_string(), server.address())];
    config.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    let mut sink = NativeSink::new(
        RedisSink::default(),
        std::env::temp_dir().join("weir-redis-unused-root"),
    )
    .grant_tcp(&server.address());
    sink.open("p1", &config)?;
    Ok(sink)
}

pub fn sink(server: &RedisServer) -> NativeSink<RedisSink> {
    open_sink(server, &[]).expect("the sink opens")
}

/// An upsert table keyed by `keys`.
pub fn upsert_table(name: &str, keys: &[&str]) -> Table {
    let mut table = Table::new(name);
    table.key_columns = keys.iter().map(|k| k.to_string()).collect();
    table.mode = Mode::Upsert;
    table
}

/// An append table (no key).
pub fn append_table(name: &str) -> Table {
    Table::new(name)
}

/// `columns` plus `__op` (one per row) and `__pos` (the row number).
pub fn rows(columns: Vec<(&str, ArrayRef)>, ops: &[&str]) -> RecordBatch {
    let pos: Vec<Vec<u8>> = (0..ops.len())
        .map(|i| (i as u32).to_be_bytes().to_vec())
        .collect();
    let mut all = columns;
    all.push((
        "__op",
        Arc::new(StringArray::from(ops.to_vec())) as ArrayRef,
    ));
    all.push((
        "__pos",
        Arc::new(BinaryArray::from_iter_values(pos)) as ArrayRef,
    ));
    RecordBatch::try_from_iter(all).expect("a record batch")
}

/// Writes `batch` with no `low` (the tests' positions are row numbers, not
/// the commits'): the sink then cannot tell where its changes start.
pub fn write(
    sink: &mut NativeSink<RedisSink>,
    table: &Table,
    id: &str,
    batch: &RecordBatch,
) -> Result<()> {
    write_from(sink, table, id, batch, &[])
}

/// Writes `batch` as a batch whose first change is at `low`.
pub fn write_from(
    sink: &mut NativeSink<RedisSink>,
    table: &Table,
    id: &str,
    batch: &RecordBatch,
    low: &[u8],
) -> Result<()> {
    let meta = BatchMeta {
        table: table.clone(),
        id: id.into(),
        low: low.to_vec(),
        high: vec![0xff],
        rows: batch.num_rows() as u32,
    };
    sink.write(meta, &encode_ipc(batch))
}

pub fn commit(
    sink: &mut NativeSink<RedisSink>,
    table: &str,
    high: &[u8],
    epoch: u64,
) -> Result<()> {
    sink.commit(CommitRequest {
        table: table.into(),
        high: high.to_vec(),
        pipeline: "p1".into(),
        epoch,
    })
}

/// A hash as field -> value.
pub fn hash(con: &mut redis::Connection, key: &str) -> BTreeMap<String, String> {
    redis::cmd("HGETALL").arg(key).query(con).expect("HGETALL")
}

/// Every entry of a stream, as its fields in order.
pub fn stream(con: &mut redis::Connection, key: &str) -> Vec<Vec<(String, String)>> {
    let entries: Vec<(String, Vec<String>)> = redis::cmd("XRANGE")
        .arg(key)
        .arg("-")
        .arg("+")
        .query(con)
        .expect("XRANGE");
    entries
        .into_iter()
        .map(|(_, flat)| {
            flat.chunks(2)
                .map(|p| (p[0].clone(), p[1].clone()))
                .collect()
        })
        .collect()
}

pub fn keys(con: &mut redis::Connection) -> Vec<String> {
    let mut all: Vec<String> = redis::cmd("KEYS").arg("*").query(con).expect("KEYS");
    all.sort();
    all
}

pub fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}
