//! Generator pipelines into the other sinks, run as `weir run` and
//! killed: SIGKILL recovery for positioned and Parquet sinks, Redis (a
//! private redis-server), the webhook sink, and blob roots on S3 (moto);
//! and `weir tables` checked against the columns a sink received.

#[path = "../common/mod.rs"]
mod common;

mod crash_recovery;
mod dead_letter;
mod redis;
mod redis_crash;
mod s3_blob_store;
mod tables;
mod webhook;
