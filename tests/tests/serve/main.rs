//! `weir serve`: tenants and their bounds, the admin API and `weir ctl`,
//! the watched folder, metrics, plugins swapped while pipelines run and
//! uploaded for pipeline files to name, the bounds a hostile client or
//! tenant meets, and hosts sharing pipelines
//! through etcd (with the chaos run).

#[path = "../common/mod.rs"]
mod common;
#[path = "../iceberg_support/mod.rs"]
mod iceberg_support;
#[path = "../postgres_support/mod.rs"]
mod postgres_support;

mod chaos;
mod cluster;
mod cluster_postgres;
mod hardening;
mod hot_swap;
mod ops;
mod shared_resources;
mod tenants;
mod test_cluster;
mod uploads;

/// Every file in `folder`, hidden ones too, sorted (none when it is
/// missing).
fn files_in(folder: &std::path::Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(folder)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}
