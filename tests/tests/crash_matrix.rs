//! The crash matrix (docs/crash-matrix.md): for every source (the generator,
//! a real Postgres, a real MariaDB read by the MySQL source) and every sink
//! (the positioned fixture, Parquet, Iceberg), SIGKILL `weir run` at random
//! moments and at every named crash point, in the backfill and while
//! streaming; restart it until caught up and compare every destination
//! with the source of truth (the generator's seed, Postgres or MariaDB
//! itself; Iceberg read by DuckDB), counting duplicates, gaps and
//! resurrected deletes. Every seventh kill the host also loses its
//! position store. Kills that did not land where
//! aimed are inconclusive, never a pass.
//!
//! Bounded under `cargo test`; scripts/crash-matrix runs it long:
//! `scripts/crash-matrix --source generator,postgres,mysql --sinks
//! positioned,parquet,iceberg --kills 200 --seed 42`.
//!
//! A test binary of its own, unlike the other areas: it points
//! `WEIR_COMPONENT_CACHE` at the tests' shared cache for every episode, an
//! environment change no other test of the process may see.

mod common;
mod crash_matrix_support;
mod iceberg_support;
mod mysql_support;
mod postgres_support;

use crash_matrix_support::sessions::{run_generator, run_mysql, run_postgres};
use crash_matrix_support::{Source, Spec, print_report};

#[test]
fn every_sink_stays_exact_or_complete_across_kills_at_every_point_of_every_source() {
    let spec = Spec::from_env();
    // Every episode of the matrix is a new pipeline with its own state
    // folder; one component cache for all of them compiles each plugin once
    // (the tests' shared one: the other tests have compiled most already).
    let cache = common::shared_component_cache();
    // SAFETY: set before this test starts any thread or process, and it is
    // the only test of this binary: nothing reads the environment meanwhile.
    unsafe { std::env::set_var("WEIR_COMPONENT_CACHE", &cache) };
    println!(
        "crash matrix seed: {} (set WEIR_CRASH_SEED to replay it)",
        spec.seed
    );
    let reports: Vec<_> = spec
        .sources
        .iter()
        .map(|source| match source {
            Source::Generator => run_generator(&spec),
            Source::Postgres => run_postgres(&spec),
            Source::Mysql => run_mysql(&spec),
        })
        .collect();
    print_report(&spec, &reports);
    let failed: Vec<String> = reports
        .iter()
        .filter(|r| !r.problems.is_empty())
        .map(|r| r.source.unwrap().name().to_string())
        .collect();
    assert!(
        failed.is_empty(),
        "the crash matrix failed for {} (see the report above)",
        failed.join(", ")
    );
}
