//! Rows per second into Redis through weir's Redis sink, against a plain
//! native Rust program writing the same rows to the same server with the
//! same client library. Prints rows/s of each side and the ratio, measured
//! in one run; not a pass/fail test (the machines are shared).
//!
//! Every side is fed the same input: the generator's changes batched as the
//! host batches them (upsert mode, last write per key wins in a batch),
//! already encoded as Arrow IPC, and writes it batch by batch into one
//! private `redis-server` (no persistence), flushed before each side's
//! turn. Each side's clock runs from its first batch to its last commit:
//! start-up, compiling the component, instantiating it, opening the sink
//! and connecting are outside it, for every side. Best of three rounds,
//! sides alternating within a round.
//!
//! - **weir (wasm)**: the component `weir_redis_sink.wasm`, in process,
//!   through weir's runtime (wasmtime, the host's limits, the TCP grant
//!   checked at connect): per batch `write` (IPC decoded and rendered in
//!   the guest) then `commit` (one `EVALSHA` of the commit script: fence,
//!   replay check, key types, `DEL`+`HSET` per row, the position).
//! - **sink (native)**: the same sink crate compiled natively and run by
//!   `weir_sdk::native`: the same work without WebAssembly, so the gap to
//!   the wasm side is what the sandbox costs.
//! - **plain program (native)**: what one would write without weir, with
//!   the `redis` crate: per batch, decode the IPC, render every value as
//!   docs/sinks/redis.md says, and send `DEL`+`HSET` per row and the
//!   position in one `MULTI`/`EXEC`, pipelined. No fence, no replay check,
//!   no key-type check: it is the floor.
//!
//! Before timing, one round's results are compared key by key: all three
//! sides must leave the same Redis content, or the comparison would be of
//! different work.
//!
//! As context, not part of the ratio: a whole `weir run` of the same
//! generator stream into the same sink (process start, the component from
//! the compile cache, generator, batching, the host's position store), in
//! source changes per second.
//!
//! `cargo bench -p weir-tests --bench redis_throughput` after
//! scripts/build-plugins (and `cargo build --release -p weir` for the
//! `weir run` line). `REDIS_BENCH_CHANGES` sets the workload size (default
//! 200000), `REDIS_BENCH_ROWS` the batch size (default 5000).

use std::collections::BTreeMap;
use std::io::Cursor;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow_array::cast::AsArray;
use weir_runtime::Limits;
use weir_runtime::network::{NetworkGrants, NetworkLimits, SinkNetwork};
use weir_sdk::native::NativeSink;
use weir_source::change::Op;
use weir_test_support::redis::{Dumped, dump, escape_key_part, render_value};
use weir_test_support::{PipelineBuilder, RedisServer, SinkBuilder, value_at};

mod support;
use support::{InProcess, Prepared, components_dir, prepare};

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The plain program: one connection, one MULTI/EXEC per batch.
struct PlainWriter {
    con: ::redis::Connection,
}

impl PlainWriter {
    fn write(&mut self, batch: &Prepared) {
        let table = &batch.header.table;
        let reader = arrow_ipc::reader::StreamReader::try_new(Cursor::new(&batch.ipc), None)
            .expect("the batch's IPC");
        let mut transaction = ::redis::pipe();
        transaction.atomic();
        for records in reader {
            let records = records.expect("a record batch");
            let schema = records.schema();
            let ops = records
                .column_by_name(weir_sdk::OP_COLUMN)
                .expect("__op")
                .as_string::<i32>()
                .clone();
            let data: Vec<usize> = (0..schema.fields().len())
                .filter(|&i| !schema.field(i).name().starts_with("__"))
                .collect();
            let keys: Vec<usize> = table
                .key_columns
                .iter()
                .map(|k| schema.index_of(k).expect("a key column"))
                .collect();
            for row in 0..records.num_rows() {
                let render = |i: usize| {
                    render_value(
                        &value_at(records.column(i).as_ref(), row),
                        schema.field(i).data_type(),
                    )
                    .expect("a value with a rendering")
                };
                let mut key = format!("weir:{}", escape_key_part(&table.destination));
                for &i in &keys {
                    key.push(':');
                    key.push_str(&escape_key_part(&render(i).expect("a non-null key")));
                }
                transaction.cmd("DEL").arg(&key).ignore();
                if Op::parse(ops.value(row)) == Some(Op::Delete) {
                    continue;
                }
                let mut hset = ::redis::cmd("HSET");
                hset.arg(&key);
                for &i in &data {
                    if let Some(text) = render(i) {
                        hset.arg(schema.field(i).name()).arg(text);
                    }
                }
                transaction.add_command(hset).ignore();
            }
        }
        transaction
            .cmd("HSET")
            .arg(format!(
                "weir:__weir:bench:{}",
                escape_key_part(&table.name)
            ))
            .arg("epoch")
            .arg("1")
            .arg("position")
            .arg(hex::encode(batch.header.high.as_bytes()))
            .ignore();
        let () = transaction.query(&mut self.con).expect("MULTI/EXEC");
    }
}

fn flush(server: &RedisServer) {
    let () = ::redis::cmd("FLUSHALL")
        .query(&mut server.client())
        .expect("FLUSHALL");
}

/// CPU seconds the server has used so far (user and system, all threads):
/// how much of a side's time Redis spent working for it.
fn redis_cpu(server: &RedisServer) -> f64 {
    let info: String = ::redis::cmd("INFO")
        .arg("cpu")
        .query(&mut server.client())
        .expect("INFO cpu");
    info.lines()
        .filter_map(|line| line.split_once(':'))
        .filter(|(name, _)| matches!(*name, "used_cpu_user" | "used_cpu_sys"))
        .map(|(_, value)| value.trim().parse::<f64>().expect("a CPU time"))
        .sum()
}

fn first_difference(
    a: &BTreeMap<String, Dumped>,
    b: &BTreeMap<String, Dumped>,
) -> Option<(String, Option<Dumped>, Option<Dumped>)> {
    a.keys()
        .chain(b.keys())
        .find(|k| a.get(*k) != b.get(*k))
        .map(|k| (k.clone(), a.get(k).cloned(), b.get(k).cloned()))
}

fn main() {
    let workspace = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace.join("target"));
    let wasm = components_dir().join("weir_redis_sink.wasm");
    let changes = env_or("REDIS_BENCH_CHANGES", 200_000);
    let max_rows = env_or("REDIS_BENCH_ROWS", 5_000) as usize;
    let (batches, rows) = prepare(changes, max_rows);
    println!(
        "{changes} generator changes: {} batches, {rows} rows after last-write-wins",
        batches.len()
    );

    let server = RedisServer::start();
    let address = server.address();
    let config = vec![("address".to_string(), address.clone())];
    let scratch = tempfile::tempdir().unwrap();
    let host = InProcess::new(scratch.path());
    let grants = NetworkGrants::parse(Vec::<String>::new(), [address.as_str()]).unwrap();
    let loaded = host.load(&wasm, &grants);
    let limits = Limits {
        memory_bytes: 1 << 30,
        call_timeout: Duration::from_secs(60),
        log: Default::default(),
    };

    let run_wasm = || {
        let network = SinkNetwork::new("bench", Arc::new(grants.clone()), NetworkLimits::default());
        let root = scratch.path().join("unused");
        let mut instance = host.instance(&loaded, &root, network, &limits);
        instance.open("bench", &config).unwrap();
        let started = Instant::now();
        for p in &batches {
            instance.write(&p.header, &p.ipc).unwrap();
            instance.commit(&p.commit_request()).unwrap();
        }
        started.elapsed()
    };
    let run_native_sink = || {
        let mut sink = NativeSink::new(
            weir_redis_sink::RedisSink::default(),
            scratch.path().join("unused"),
        )
        .grant_tcp(&address);
        sink.open("bench", &config).unwrap();
        let started = Instant::now();
        for p in &batches {
            sink.write(p.native_meta(), &p.ipc).unwrap();
            sink.commit(p.native_commit()).unwrap();
        }
        started.elapsed()
    };
    let run_plain = || {
        let mut writer = PlainWriter {
            con: server.client(),
        };
        let started = Instant::now();
        for p in &batches {
            writer.write(p);
        }
        started.elapsed()
    };

    // Same work: each side leaves the same keys, fields and positions.
    let mut contents = Vec::new();
    for (side, run) in [
        ("weir (wasm)", &run_wasm as &dyn Fn() -> Duration),
        ("sink (native)", &run_native_sink),
        ("plain program", &run_plain),
    ] {
        flush(&server);
        run();
        contents.push((side, dump(&mut server.client(), "")));
    }
    let (reference, want) = &contents[0];
    for (side, got) in &contents[1..] {
        if let Some((key, a, b)) = first_difference(want, got) {
            panic!("{reference} and {side} differ at {key}: {a:?} vs {b:?}");
        }
    }
    println!("all three sides leave the same {} Redis keys", want.len());

    // Per side: the best time, and the Redis CPU time of that run.
    let mut best = [(Duration::MAX, 0.0); 3];
    for _round in 0..3 {
        for (slot, run) in [
            &run_wasm as &dyn Fn() -> Duration,
            &run_native_sink,
            &run_plain,
        ]
        .into_iter()
        .enumerate()
        {
            flush(&server);
            let cpu = redis_cpu(&server);
            let took = run();
            let cpu = redis_cpu(&server) - cpu;
            if took < best[slot].0 {
                best[slot] = (took, cpu);
            }
        }
    }
    let rate = |d: Duration| rows as f64 / d.as_secs_f64();
    for ((side, _), (took, cpu)) in contents.iter().zip(best) {
        println!(
            "{side:>14}: {:>7.0} rows/s ({took:.2?}, of which Redis used {cpu:.2} s CPU)",
            rate(took)
        );
    }
    let [wasm_best, sink_best, plain_best] = best.map(|(took, _)| took);
    println!(
        "time ratio: weir (wasm) / plain program {:.2}; weir (wasm) / sink (native) {:.2}; \
         sink (native) / plain program {:.2}",
        wasm_best.as_secs_f64() / plain_best.as_secs_f64(),
        wasm_best.as_secs_f64() / sink_best.as_secs_f64(),
        sink_best.as_secs_f64() / plain_best.as_secs_f64()
    );

    weir_run(&server, changes, max_rows, &target, &wasm);
}

/// A whole `weir run` of the same stream, for context.
fn weir_run(
    server: &RedisServer,
    changes: u64,
    max_rows: usize,
    target: &std::path::Path,
    wasm: &std::path::Path,
) {
    let bin = std::env::var_os("WEIR_BIN").map_or(target.join("release/weir"), PathBuf::from);
    if !bin.exists() {
        println!("weir run: skipped, {} is not built", bin.display());
        return;
    }
    flush(server);
    let dir = tempfile::tempdir().unwrap();
    let pipeline = PipelineBuilder::generator(99, changes)
        .max_rows(max_rows)
        .sink(
            SinkBuilder::new("cache", wasm)
                .blob_store(&dir.path().join("unused"))
                .grant_tcp(&server.address())
                .config("address", &server.address()),
        )
        .write_in(dir.path());
    let run = |args: &[&str]| {
        let out = std::process::Command::new(&bin)
            .args(args)
            .arg(&pipeline)
            .env("WEIR_LOG", "warn")
            .output()
            .expect("weir runs");
        assert!(
            out.status.success(),
            "weir {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    // Compiles the component into the pipeline's cache, as a first run would.
    run(&["status"]);
    let started = Instant::now();
    run(&["run"]);
    let took = started.elapsed();
    println!(
        "weir run (process start to exit, generator to Redis): {changes} changes in {took:.2?}, \
         {:.0} changes/s",
        changes as f64 / took.as_secs_f64()
    );
}
