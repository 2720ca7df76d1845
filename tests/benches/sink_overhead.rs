//! What running a sink as WebAssembly costs: the Parquet sink fed the same
//! Arrow IPC batches once through the wasmtime host and once natively through
//! `weir_sdk::native`, in one process, alternating rounds. Prints rows/s of
//! each and the ratio; not a pass/fail test (the machines are shared).
//!
//! `cargo bench -p weir-tests --bench sink_overhead` (after scripts/build-plugins).

use std::time::{Duration, Instant};

use weir::runtime::Limits;
use weir::runtime::network::SinkNetwork;
use weir_sdk::native::NativeSink;

mod support;
use support::{InProcess, components_dir, prepare};

fn main() {
    let wasm = components_dir().join("weir_parquet_sink.wasm");
    let (batches, rows) = prepare(200_000, 5_000);
    println!(
        "{} batches, {rows} rows after last-write-wins",
        batches.len()
    );

    let scratch = tempfile::tempdir().unwrap();
    let host = InProcess::new(scratch.path());
    let loaded = host.load(&wasm, &Default::default());
    let limits = Limits {
        memory_bytes: 1 << 30,
        call_timeout: Duration::from_secs(60),
        log: Default::default(),
    };

    let mut wasm_best = Duration::MAX;
    let mut native_best = Duration::MAX;
    for round in 0..3 {
        let root = scratch.path().join(format!("wasm-{round}"));
        let mut instance = host.instance(&loaded, &root, SinkNetwork::none("bench"), &limits);
        instance.open("bench", &[]).unwrap();
        let started = Instant::now();
        for p in &batches {
            instance.write(&p.header, &p.ipc).unwrap();
            instance.commit(&p.commit_request()).unwrap();
        }
        wasm_best = wasm_best.min(started.elapsed());

        let root = scratch.path().join(format!("native-{round}"));
        std::fs::create_dir_all(&root).unwrap();
        let mut native = NativeSink::new(weir_parquet_sink::ParquetSink::default(), root);
        native.open("bench", &[]).unwrap();
        let started = Instant::now();
        for p in &batches {
            native.write(p.native_meta(), &p.ipc).unwrap();
            native.commit(p.native_commit()).unwrap();
        }
        native_best = native_best.min(started.elapsed());
    }
    let rate = |d: Duration| rows as f64 / d.as_secs_f64();
    println!(
        "parquet sink, best of 3: wasm {:.0} rows/s, native {:.0} rows/s, wasm/native time ratio {:.2}",
        rate(wasm_best),
        rate(native_best),
        wasm_best.as_secs_f64() / native_best.as_secs_f64()
    );
}
