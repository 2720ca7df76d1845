//! What writing a sink in another language costs: the same generator backlog
//! (Arrow IPC batches as the host makes them) into hello-sink (Rust) and into
//! the same JSON Lines sink written in Python (examples/python-sink) and
//! JavaScript (examples/js-sink), all as components in one
//! process. Prints each sink's first compile time, rows/s and per-row cost
//! relative to Rust; not a pass/fail test (the machines are shared).
//!
//! Timed: `write` + `commit` of every batch into a fresh instance (decoding
//! Arrow, building JSON, the blob puts to a local folder), best of 3 rounds.
//! Not timed: compiling the component (measured once, separately, then
//! loaded from the warm cache) and instantiating it.
//!
//! `cargo bench -p weir-tests --bench language_sinks` (after scripts/build-plugins).

use std::time::{Duration, Instant};

use weir_runtime::Limits;
use weir_runtime::network::SinkNetwork;

// Shared with sink_overhead, whose native runner this benchmark does not use.
#[allow(dead_code)]
mod support;
use support::{InProcess, components_dir, prepare};

/// One sink to measure: its language and component file.
struct Entry {
    language: &'static str,
    file: &'static str,
}

const SINKS: &[Entry] = &[
    Entry {
        language: "rust (hello-sink)",
        file: "hello_sink.wasm",
    },
    Entry {
        language: "python (examples/python-sink)",
        file: "python_sink.wasm",
    },
    Entry {
        language: "javascript (examples/js-sink)",
        file: "js_sink.wasm",
    },
];

fn main() {
    let components = components_dir();
    let (batches, rows) = prepare(50_000, 1_000);
    println!(
        "{} batches, {rows} rows after last-write-wins",
        batches.len()
    );
    println!(
        "timed: write+commit of every batch (Arrow decode, JSON, blob puts); not timed: compile (shown apart), instantiate"
    );

    let scratch = tempfile::tempdir().unwrap();
    let host = InProcess::new(scratch.path());
    let limits = Limits {
        memory_bytes: 1 << 30,
        call_timeout: Duration::from_secs(120),
        log: Default::default(),
    };

    let mut rust_per_row = None;
    for entry in SINKS {
        let wasm = components.join(entry.file);
        assert!(
            wasm.exists(),
            "{} is missing: run scripts/build-plugins",
            wasm.display()
        );
        let size = std::fs::metadata(&wasm).unwrap().len();
        // The first load compiles (the cache is empty); the second is warm.
        let started = Instant::now();
        host.load(&wasm, &Default::default());
        let compile = started.elapsed();
        let loaded = host.load(&wasm, &Default::default());

        let mut best = Duration::MAX;
        for round in 0..3 {
            let root = scratch.path().join(format!("{}-{round}", entry.file));
            let mut instance = host.instance(&loaded, &root, SinkNetwork::none("bench"), &limits);
            instance.open("bench", &[]).unwrap();
            let started = Instant::now();
            for p in &batches {
                instance.write(&p.header, &p.ipc).unwrap();
                instance.commit(&p.commit_request()).unwrap();
            }
            best = best.min(started.elapsed());
        }
        let per_row = best.as_secs_f64() / rows as f64;
        let rust = *rust_per_row.get_or_insert(per_row);
        println!(
            "{:<32} {:>6.1} MB, first compile {:>6.1} s, {:>9.0} rows/s, {:>6.2} us/row, {:>6.1}x rust's per-row cost",
            entry.language,
            size as f64 / 1e6,
            compile.as_secs_f64(),
            rows as f64 / best.as_secs_f64(),
            per_row * 1e6,
            per_row / rust
        );
    }
}
