//! What running a sink as WebAssembly costs: the Parquet sink fed the same
//! Arrow IPC batches once through the wasmtime host and once natively through
//! `weir_sdk::native`, in one process, alternating rounds. Prints rows/s of
//! each and the ratio of wall-clock and of CPU times; not a pass/fail test
//! (the machines are shared).
//!
//! `cargo bench -p weir-tests --bench sink_overhead` (after scripts/build-plugins).

use std::time::Duration;

use weir_runtime::Limits;
use weir_runtime::network::SinkNetwork;
use weir_sdk::native::NativeSink;

mod support;
use support::{Best, InProcess, components_dir, prepare, scratch_dir};

/// Rounds of each side; the best of them counts.
const ROUNDS: usize = 5;

fn main() {
    let wasm = components_dir().join("weir_parquet_sink.wasm");
    let (batches, rows) = prepare(200_000, 5_000);
    println!(
        "{} batches, {rows} rows after last-write-wins",
        batches.len()
    );

    let scratch = scratch_dir();
    let host = InProcess::new(scratch.path());
    let loaded = host.load(&wasm, &Default::default());
    let limits = Limits {
        memory_bytes: 1 << 30,
        call_timeout: Duration::from_secs(60),
        log: Default::default(),
    };

    let mut wasm = Best::new();
    let mut native = Best::new();
    for round in 0..ROUNDS {
        let root = scratch.path().join(format!("wasm-{round}"));
        let mut instance = host.instance(&loaded, &root, SinkNetwork::none("bench"), &limits);
        instance.open("bench", &[]).unwrap();
        wasm.time(|| {
            for p in &batches {
                instance.write(&p.header, &p.ipc).unwrap();
                instance.commit(&p.commit_request()).unwrap();
            }
        });

        let root = scratch.path().join(format!("native-{round}"));
        std::fs::create_dir_all(&root).unwrap();
        let mut sink = NativeSink::new(weir_parquet_sink::ParquetSink::default(), root);
        sink.open("bench", &[]).unwrap();
        native.time(|| {
            for p in &batches {
                sink.write(p.native_meta(), &p.ipc).unwrap();
                sink.commit(p.native_commit()).unwrap();
            }
        });
    }
    let rate = |d: Duration| rows as f64 / d.as_secs_f64();
    let (wall_ratio, cpu_ratio) = wasm.ratio_to(&native);
    println!(
        "parquet sink, best of {ROUNDS}: wasm {:.0} rows/s, native {:.0} rows/s, \
         wasm/native time ratio {wall_ratio:.2} (CPU time ratio {cpu_ratio:.2})",
        rate(wasm.wall),
        rate(native.wall),
    );
}
