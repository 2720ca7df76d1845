//! The Postgres source against a real server (scripts/pg starts a private
//! cluster; each test makes a database of its own): change capture,
//! backfill, types, TOAST, publications, big transactions, stops, claims
//! and SIGKILLs, each compared with Postgres itself; and a server the
//! source cannot reach.
//!
//! `bench` holds the benchmark, ignored under `cargo test`: run it with
//! `cargo test --release -p weir-tests --test postgres -- --ignored --nocapture`.

#[path = "../common/mod.rs"]
mod common;
#[path = "../iceberg_support/mod.rs"]
mod iceberg_support;
#[path = "../postgres_support/mod.rs"]
mod postgres_support;

mod backfill_kills;
mod bench;
mod big_tx;
mod cdc;
mod claims;
mod crash;
mod fidelity;
mod publication;
mod reach;
mod starting;
mod stops;
mod toast;
mod types;
