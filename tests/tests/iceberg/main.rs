//! The Iceberg sink end to end: tables read back by readers we did not
//! write (pyiceberg, DuckDB, the iceberg crate), nested types, partitions,
//! position deletes, maintenance, SIGKILLs and zombies, tables on S3
//! (moto's server), and tables in an Iceberg REST catalog.

#[path = "../common/mod.rs"]
mod common;
#[path = "../iceberg_support/mod.rs"]
mod iceberg_support;

mod crash;
mod maintenance;
mod nested;
mod partitions;
mod position_deletes;
mod readers;
mod rest;
mod s3;
