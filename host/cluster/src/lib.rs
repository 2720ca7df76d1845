//! `weir serve` on several machines, sharing one etcd.
//!
//! Each host keeps a lease ([`session`]); a pipeline has one owner at a
//! time, by an assignment key on the owner's lease, and every claim raises
//! the pipeline's fencing epoch in the same transaction ([`claims`]). A
//! lease alone never gives mutual exclusion (a stalled host does not know
//! its lease ran out), so the epoch is the fence and it reaches every
//! writer: the position store in etcd ([`store`]) writes only under a
//! compare on the epoch and the assignment, sinks with `positions` refuse
//! an older epoch, and an owner stops committing on its own monotonic
//! clock before its lease can run out. One host at a time leads and places
//! pipelines on hosts ([`placement`], a pure function of what it reads).
//!
//! [`keys`] says where each of these lives in etcd.

pub mod claims;
pub mod config;
pub mod keys;
pub mod placement;
pub mod session;
pub mod store;

pub use config::ClusterConfig;
pub use keys::{Keys, PipelineId};
pub use session::Session;
pub use store::EtcdStore;

/// What can go wrong talking to etcd.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    #[error("etcd ({endpoints}): {detail}")]
    Etcd { endpoints: String, detail: String },
    #[error("etcd ({endpoints}) did not answer within {timeout_ms} ms ({what})")]
    Timeout {
        endpoints: String,
        timeout_ms: u64,
        what: &'static str,
    },
    #[error("{0}")]
    Config(String),
    #[error("etcd holds a value this host cannot read at `{key}`: {detail}")]
    Corrupt { key: String, detail: String },
}
pub use etcd_client;
