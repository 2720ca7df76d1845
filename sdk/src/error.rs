//! What a sink tells the host when a call fails.

use std::fmt;

use crate::blob::BlobError;

/// The result type of every [`Sink`](crate::Sink) call.
pub type Result<T, E = SinkError> = std::result::Result<T, E>;

/// What went wrong, and so what the host should do about it. The message is
/// logged by the host and shown to the operator: say what failed and why.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum SinkError {
    /// Transient (a timeout, a lost race, a throttled store). The host retries
    /// the same call with backoff; staged data stays staged.
    Retryable(String),
    /// This batch can never be written (a value the destination cannot hold,
    /// an incompatible schema change). The host stops the pipeline without
    /// advancing past the batch. Name the table and what is wrong.
    Poison(String),
    /// A newer host owns this table (its commit carried a higher epoch). The
    /// host stops at once and commits nothing more.
    Fenced(String),
    /// The sink cannot go on (bad configuration, corrupt destination).
    Fatal(String),
}

impl SinkError {
    /// The message, without the kind.
    pub fn message(&self) -> &str {
        match self {
            SinkError::Retryable(m)
            | SinkError::Poison(m)
            | SinkError::Fenced(m)
            | SinkError::Fatal(m) => m,
        }
    }

    /// The kind as the WIT names it: `retryable`, `poison`, `fenced` or `fatal`.
    pub fn kind(&self) -> &'static str {
        match self {
            SinkError::Retryable(_) => "retryable",
            SinkError::Poison(_) => "poison",
            SinkError::Fenced(_) => "fenced",
            SinkError::Fatal(_) => "fatal",
        }
    }
}

impl fmt::Display for SinkError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.kind(), self.message())
    }
}

impl std::error::Error for SinkError {}

/// A failed blob call: `io` is worth a retry, anything else means the sink
/// is misconfigured or the destination is not what it expects.
impl From<BlobError> for SinkError {
    fn from(e: BlobError) -> Self {
        match e {
            BlobError::Io(_) => SinkError::Retryable(e.to_string()),
            BlobError::NotFound(_) | BlobError::AlreadyExists(_) | BlobError::Denied(_) => {
                SinkError::Fatal(e.to_string())
            }
        }
    }
}
