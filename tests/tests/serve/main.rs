//! `weir serve`: tenants and their bounds, the admin API and `weir ctl`,
//! the watched folder, metrics, and plugins swapped while pipelines run.

#[path = "../common/mod.rs"]
mod common;

mod hot_swap;
mod ops;
mod shared_resources;
mod tenants;
