//! What running the Iceberg sink as WebAssembly costs: the same Arrow IPC
//! batches (generator, upsert mode, so every commit writes a data file and,
//! for the keys it changes again, a position-delete file) through the wasmtime host and natively through
//! `weir_sdk::native`, in one process, alternating rounds. Prints rows/s of
//! each and the ratio of wall-clock and of CPU times; not a pass/fail test
//! (the machines are shared).
//!
//! `cargo bench -p weir-tests --bench iceberg_overhead` (after scripts/build-plugins).
//! `ICEBERG_BENCH_CHANGES` sets the workload size (default 200000).

use std::time::{Duration, Instant};

use weir_runtime::Limits;
use weir_runtime::network::SinkNetwork;
use weir_sdk::native::NativeSink;

mod support;
use support::{Best, InProcess, components_dir, prepare, scratch_dir};

/// `total-records` of a table's current snapshot, from its newest metadata.
fn total_records(table: &std::path::Path) -> u64 {
    let meta = table.join("metadata");
    let hint = std::fs::read_to_string(meta.join("version-hint.text")).unwrap();
    let json: serde_json::Value = serde_json::from_slice(
        &std::fs::read(meta.join(format!("v{}.metadata.json", hint.trim()))).unwrap(),
    )
    .unwrap();
    let current = &json["current-snapshot-id"];
    json["snapshots"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| &s["snapshot-id"] == current)
        .map(|s| {
            s["summary"]["total-records"]
                .as_str()
                .unwrap()
                .parse()
                .unwrap()
        })
        .unwrap_or(0)
}

/// Rounds of each side; the best of them counts.
const ROUNDS: usize = 3;

fn main() {
    let wasm = components_dir().join("weir_iceberg_sink.wasm");
    let changes = std::env::var("ICEBERG_BENCH_CHANGES")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(200_000);
    let (batches, rows) = prepare(changes, 10_000);
    println!(
        "{} batches, {rows} rows after last-write-wins; wasm {} ({} bytes)",
        batches.len(),
        wasm.display(),
        std::fs::metadata(&wasm).map(|m| m.len()).unwrap_or(0)
    );

    let scratch = scratch_dir();
    println!("scratch folder {}", scratch.path().display());
    let host = InProcess::new(scratch.path());
    let started = Instant::now();
    let loaded = host.load(&wasm, &Default::default());
    println!("component compiled in {:?}", started.elapsed());
    let limits = Limits {
        memory_bytes: 2 << 30,
        call_timeout: Duration::from_secs(120),
        log: Default::default(),
    };

    let mut wasm = Best::new();
    let mut native = Best::new();
    for round in 0..ROUNDS {
        let root = scratch.path().join(format!("wasm-{round}"));
        std::fs::create_dir_all(&root).unwrap();
        let config = vec![(
            "warehouse".to_string(),
            format!("file://{}", root.display()),
        )];
        let mut instance = host.instance(&loaded, &root, SinkNetwork::none("bench"), &limits);
        instance.open("bench", &config).unwrap();
        wasm.time(|| {
            for p in &batches {
                instance.write(&p.header, &p.ipc).unwrap();
                instance.commit(&p.commit_request()).unwrap();
            }
        });

        let root = scratch.path().join(format!("native-{round}"));
        std::fs::create_dir_all(&root).unwrap();
        let config = vec![(
            "warehouse".to_string(),
            format!("file://{}", root.display()),
        )];
        let mut sink = NativeSink::new(weir_iceberg_sink::IcebergSink::default(), root);
        sink.open("bench", &config).unwrap();
        native.time(|| {
            for p in &batches {
                sink.write(p.native_meta(), &p.ipc).unwrap();
                sink.commit(p.native_commit()).unwrap();
            }
        });
        let records = |side: &str| -> u64 {
            ["customers", "orders", "order_items"]
                .iter()
                .map(|t| total_records(&scratch.path().join(format!("{side}-{round}/shop/{t}"))))
                .sum()
        };
        let (w, n) = (records("wasm"), records("native"));
        assert_eq!(w, n, "the WASM and native runs wrote different row counts");
        println!("round {round}: both wrote {w} data rows");
        println!(
            "round {round}: wasm {:?}, native {:?} (best so far)",
            wasm.wall, native.wall
        );
    }
    let rate = |d: Duration| rows as f64 / d.as_secs_f64();
    let (wall_ratio, cpu_ratio) = wasm.ratio_to(&native);
    println!(
        "iceberg sink (upsert), best of {ROUNDS}: wasm {:.0} rows/s, native {:.0} rows/s, \
         wasm/native time ratio {wall_ratio:.2} (CPU time ratio {cpu_ratio:.2})",
        rate(wasm.wall),
        rate(native.wall),
    );
}
