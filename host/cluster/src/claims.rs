//! Claims: a pipeline's assignment key, created on the owner's lease only
//! where none exists, with its fencing epoch raised in the same
//! transaction; and the epoch itself, which every later write compares.

use etcd_client::{Compare, CompareOp, GetOptions, KeyValue, PutOptions, Txn, TxnOp};

use weir_core::commit::MAX_EPOCH;

use crate::ClusterError;
use crate::keys::PipelineId;
use crate::session::Session;

/// Tries to take a pipeline for this host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Claim {
    /// Taken, on `lease`, at `epoch`.
    Taken { lease: i64, epoch: u64 },
    /// Another host holds it (or held it an instant ago).
    Held,
}

/// An epoch as stored (decimal), with the revision it was written at (0
/// where none was).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoredEpoch {
    pub epoch: u64,
    pub revision: i64,
}

/// How many times a transaction is tried again when only the epoch moved
/// under it (another run of the same owner raised it): more means a bug.
const EPOCH_RACES: usize = 8;

impl Session {
    /// Runs `txn`; whether its compares held. `what` names it in errors.
    pub fn transact(&self, txn: Txn, what: &str) -> Result<bool, ClusterError> {
        let mut client = self.client();
        self.wait(async {
            client
                .txn(txn)
                .await
                .map(|done| done.succeeded())
                .map_err(|e| self.error_of(what, e))
        })
    }

    /// Every key under `prefix`, as the rest of the key after it (keys that
    /// are not UTF-8 are left out), with its value.
    pub fn under(&self, prefix: &str, what: &str) -> Result<Vec<(String, Vec<u8>)>, ClusterError> {
        let mut client = self.client();
        let found = self.wait(async {
            client
                .get(prefix, Some(GetOptions::new().with_prefix()))
                .await
                .map_err(|e| self.error_of(what, e))
        })?;
        Ok(found
            .kvs()
            .iter()
            .filter_map(|kv| {
                let rest = kv.key().strip_prefix(prefix.as_bytes())?;
                Some((
                    std::str::from_utf8(rest).ok()?.to_string(),
                    kv.value().to_vec(),
                ))
            })
            .collect())
    }

    pub async fn read_epoch(&self, id: &PipelineId) -> Result<StoredEpoch, ClusterError> {
        let key = self.keys().epoch(id);
        let found = self
            .client()
            .get(key.clone(), None)
            .await
            .map_err(|e| self.error_of("reading an epoch", e))?;
        match found.kvs().first() {
            None => Ok(StoredEpoch {
                epoch: 0,
                revision: 0,
            }),
            Some(kv) => Ok(StoredEpoch {
                epoch: parse_epoch(&key, kv)?,
                revision: kv.mod_revision(),
            }),
        }
    }

    /// Claims `id` for this host if no host holds it: the assignment key on
    /// this host's lease and the epoch raised, in one transaction.
    pub async fn claim(&self, id: &PipelineId) -> Result<Claim, ClusterError> {
        let assignment = self.keys().assignment(id);
        let epoch_key = self.keys().epoch(id);
        for _ in 0..EPOCH_RACES {
            let lease = self.lease();
            let stored = self.read_epoch(id).await?;
            let next = next_epoch(id, stored.epoch)?;
            let txn = Txn::new()
                .when([
                    Compare::create_revision(assignment.clone(), CompareOp::Equal, 0),
                    Compare::mod_revision(epoch_key.clone(), CompareOp::Equal, stored.revision),
                ])
                .and_then([
                    TxnOp::put(
                        assignment.clone(),
                        self.name(),
                        Some(PutOptions::new().with_lease(lease)),
                    ),
                    TxnOp::put(epoch_key.clone(), next.to_string(), None),
                ]);
            let done = self
                .client()
                .txn(txn)
                .await
                .map_err(|e| self.error_of("claiming a pipeline", e))?;
            if done.succeeded() {
                return Ok(Claim::Taken { lease, epoch: next });
            }
            if self.owner(id).await?.is_some() {
                return Ok(Claim::Held);
            }
        }
        Err(ClusterError::Etcd {
            endpoints: self.config().endpoints_text(),
            detail: format!("claiming {id}: its epoch kept moving under the claim"),
        })
    }

    /// Gives `id` up, if this host holds it on `lease`.
    pub async fn release(&self, id: &PipelineId, lease: i64) -> Result<bool, ClusterError> {
        let assignment = self.keys().assignment(id);
        let txn = Txn::new()
            .when(self.holds(id, lease))
            .and_then([TxnOp::delete(assignment, None)]);
        let done = self
            .client()
            .txn(txn)
            .await
            .map_err(|e| self.error_of("giving up a pipeline", e))?;
        Ok(done.succeeded())
    }

    /// The host that holds `id`, if any.
    pub async fn owner(&self, id: &PipelineId) -> Result<Option<String>, ClusterError> {
        let found = self
            .client()
            .get(self.keys().assignment(id), None)
            .await
            .map_err(|e| self.error_of("reading an assignment", e))?;
        Ok(found
            .kvs()
            .first()
            .map(|kv| String::from_utf8_lossy(kv.value()).into_owned()))
    }

    /// The compares that hold while this host owns `id` on `lease`.
    pub(crate) fn holds(&self, id: &PipelineId, lease: i64) -> Vec<Compare> {
        let assignment = self.keys().assignment(id);
        vec![
            Compare::value(assignment.clone(), CompareOp::Equal, self.name()),
            Compare::lease(assignment, CompareOp::Equal, lease),
        ]
    }
}

/// The epoch after `epoch`, refused at the top of the range rather than
/// wrapped to one every sink has seen.
pub(crate) fn next_epoch(id: &PipelineId, epoch: u64) -> Result<u64, ClusterError> {
    epoch
        .checked_add(1)
        .filter(|n| *n <= MAX_EPOCH)
        .ok_or_else(|| ClusterError::Config(format!("pipeline {id} has used every fencing epoch")))
}

pub(crate) fn parse_epoch(key: &str, kv: &KeyValue) -> Result<u64, ClusterError> {
    std::str::from_utf8(kv.value())
        .ok()
        .and_then(|text| text.parse::<u64>().ok())
        .filter(|epoch| *epoch <= MAX_EPOCH)
        .ok_or_else(|| ClusterError::Corrupt {
            key: key.to_string(),
            detail: format!(
                "`{}` is not an epoch",
                String::from_utf8_lossy(kv.value())
                    .chars()
                    .take(40)
                    .collect::<String>()
            ),
        })
}
