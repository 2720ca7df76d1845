//! What committing through an Iceberg REST catalog costs against the
//! file-system catalog: the same Arrow IPC batches (generator, upsert mode)
//! through the same compiled component in one process, alternating rounds,
//! one side with `catalog: filesystem`, the other with `catalog: rest` on
//! the suite's test catalog (pyiceberg's SqlCatalog behind the REST routes,
//! on this machine). Compilation is excluded (once, before the rounds); the
//! catalog server's start is excluded; table creation is included on both
//! sides.
//!
//! Prints rows/s back to back, the time per commit of each, and what the
//! REST side's rate is when commits come once a second (the pipeline's
//! usual linger): the rate is then bound by the interval unless a commit
//! takes longer. Not a pass/fail test (the machines are shared).
//!
//! `cargo bench -p weir-tests --bench iceberg_rest` (after scripts/build-plugins
//! and scripts/setup). `ICEBERG_BENCH_CHANGES` sets the workload size
//! (default 100000), `ICEBERG_BENCH_ROWS` the rows per commit (default 2000).

use std::sync::Arc;
use std::time::Duration;

use weir_runtime::Limits;
use weir_runtime::network::{NetworkGrants, NetworkLimits, SinkNetwork};
use weir_test_support::iceberg_rest::IcebergRestServer;

mod support;
use support::{Best, InProcess, components_dir, prepare, scratch_dir};

/// Rounds of each side; the best of them counts.
const ROUNDS: usize = 3;

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() {
    let wasm = components_dir().join("weir_iceberg_sink.wasm");
    let changes = env_or("ICEBERG_BENCH_CHANGES", 100_000);
    let per_commit = env_or("ICEBERG_BENCH_ROWS", 2_000) as usize;
    let (batches, rows) = prepare(changes, per_commit);
    let commits = batches.len();
    println!("{commits} commits of up to {per_commit} rows, {rows} rows after last-write-wins");

    let scratch = scratch_dir();
    let host = InProcess::new(scratch.path());
    let catalog = IcebergRestServer::builder()
        .warehouse(&format!("file://{}", scratch.path().display()))
        .start();
    let grants = Arc::new(NetworkGrants::parse([catalog.uri()], None::<&str>).unwrap());
    let loaded = host.load(&wasm, &grants);
    let limits = Limits {
        memory_bytes: 2 << 30,
        call_timeout: Duration::from_secs(120),
        log: Default::default(),
    };

    let mut files = Best::new();
    let mut rest = Best::new();
    for round in 0..ROUNDS {
        for side in ["files", "rest"] {
            let root = scratch.path().join(format!("{side}-{round}"));
            std::fs::create_dir_all(&root).unwrap();
            let mut config = vec![(
                "warehouse".to_string(),
                format!("file://{}", root.display()),
            )];
            let network = if side == "rest" {
                config.extend([
                    ("catalog".to_string(), "rest".to_string()),
                    ("catalog_uri".to_string(), catalog.uri().to_string()),
                    (
                        "catalog_table_location".to_string(),
                        "warehouse".to_string(),
                    ),
                ]);
                SinkNetwork::new("bench", grants.clone(), NetworkLimits::default())
            } else {
                SinkNetwork::none("bench")
            };
            let mut instance = host.instance(&loaded, &root, network, &limits);
            instance.open("bench", &config).unwrap();
            // A namespace per side and round: every round's tables are
            // new, in the shared catalog too. Made before the clock starts.
            let headers: Vec<_> = batches
                .iter()
                .map(|p| {
                    let mut header = p.header.clone();
                    let mut table = (*header.table).clone();
                    let name = table.name.rsplit('.').next().unwrap().to_string();
                    table.destination = format!("{side}{round}.{name}");
                    header.table = Arc::new(table);
                    header
                })
                .collect();
            let best = if side == "rest" {
                &mut rest
            } else {
                &mut files
            };
            best.time(|| {
                for (p, header) in batches.iter().zip(&headers) {
                    instance.write(header, &p.ipc).unwrap();
                    instance.commit(&p.commit_request()).unwrap();
                }
            });
        }
        println!(
            "round {round}: files {:?}, rest {:?} (best so far)",
            files.wall, rest.wall
        );
    }
    let rate = |d: Duration| rows as f64 / d.as_secs_f64();
    let per = |d: Duration| d / commits as u32;
    let (wall_ratio, cpu_ratio) = rest.ratio_to(&files);
    println!(
        "back to back, best of {ROUNDS}: files {:.0} rows/s ({:?} a commit), rest {:.0} rows/s \
         ({:?} a commit); rest/files time ratio {wall_ratio:.2} (CPU time ratio {cpu_ratio:.2}, \
         this process only: the catalog's own work is in its server)",
        rate(files.wall),
        per(files.wall),
        rate(rest.wall),
        per(rest.wall),
    );
    // A commit a second: each side's rate is its rows per commit over the
    // longer of the interval and its commit time.
    let second = Duration::from_secs(1);
    let paced = |d: Duration| per_commit as f64 / per(d).max(second).as_secs_f64();
    println!(
        "a commit a second, {per_commit} rows each: files {:.0} rows/s, rest {:.0} rows/s, \
         rest/files rate {:.2}",
        paced(files.wall),
        paced(rest.wall),
        paced(rest.wall) / paced(files.wall)
    );
}
