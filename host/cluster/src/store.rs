//! The out-of-sink position store of a pipeline in a cluster: its
//! positions and epoch in etcd, every write a transaction that holds only
//! while this host still owns the pipeline on the lease it claimed it with
//! and the epoch is still this run's. A host that lost its assignment, or
//! a run another run of the same pipeline overtook, cannot move a position.

use std::sync::{Arc, Mutex, PoisonError};

use etcd_client::{Compare, CompareOp, Txn, TxnOp};

use weir_core::position::Position;
use weir_pipeline::store::{Entry, PositionStore, StoreError, Stored};

use crate::ClusterError;
use crate::claims::next_epoch;
use crate::keys::PipelineId;
use crate::session::Session;

pub struct EtcdStore {
    session: Arc<Session>,
    id: PipelineId,
    /// The lease the pipeline was claimed on.
    lease: Option<i64>,
    /// The epoch this run took, once it took one.
    epoch: Mutex<Option<u64>>,
}

impl EtcdStore {
    /// The store of `id`, held by this host on `lease` (from
    /// [`crate::claims::Claim::Taken`]).
    pub fn new(session: Arc<Session>, id: PipelineId, lease: i64) -> Self {
        EtcdStore {
            session,
            id,
            lease: Some(lease),
            epoch: Mutex::new(None),
        }
    }

    /// A store that may only read: what `weir status` and the admin API
    /// show of a pipeline another host runs.
    pub fn reader(session: Arc<Session>, id: PipelineId) -> Self {
        EtcdStore {
            session,
            id,
            lease: None,
            epoch: Mutex::new(None),
        }
    }

    fn my_epoch(&self) -> Option<u64> {
        *self.epoch.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn set_epoch(&self, epoch: u64) {
        *self.epoch.lock().unwrap_or_else(PoisonError::into_inner) = Some(epoch);
    }

    fn fenced(&self, detail: String) -> StoreError {
        self.session.metrics().fenced();
        StoreError::Fenced {
            pipeline: self.id.to_string(),
            detail,
        }
    }

    fn lease_or_fenced(&self) -> Result<i64, StoreError> {
        self.lease
            .ok_or_else(|| self.fenced("this host only reads it; it does not own it".into()))
    }

    /// Why a write under the owner's compares failed: the assignment moved,
    /// or the epoch did.
    fn why_refused(&self) -> StoreError {
        let owner = self.session.wait(self.session.owner(&self.id));
        let epoch = self.session.wait(self.session.read_epoch(&self.id));
        let mine = self.my_epoch();
        let detail = match (owner, epoch) {
            (Ok(owner), _) if owner.as_deref() != Some(self.session.name()) => format!(
                "its assignment is {} now; this host ({}) lost it",
                owner.map_or("free".to_string(), |o| format!("held by `{o}`")),
                self.session.name()
            ),
            (_, Ok(stored)) if Some(stored.epoch) != mine => format!(
                "its epoch is {} now, and this run holds {}",
                stored.epoch,
                mine.map_or("none".to_string(), |e| e.to_string())
            ),
            _ => format!(
                "this host's lease {:x} no longer holds its assignment",
                self.lease.unwrap_or(0)
            ),
        };
        self.fenced(detail)
    }

    /// Raises the epoch to `target(current)` while this host holds the
    /// pipeline; returns the epoch now in force.
    fn move_epoch(
        &self,
        target: impl Fn(u64) -> Result<u64, ClusterError>,
    ) -> Result<u64, StoreError> {
        let lease = self.lease_or_fenced()?;
        let key = self.session.keys().epoch(&self.id);
        for _ in 0..8 {
            let stored = self
                .session
                .wait(self.session.read_epoch(&self.id))
                .map_err(shared)?;
            let epoch = target(stored.epoch).map_err(shared)?;
            let mut compares = self.session.holds(&self.id, lease);
            compares.push(Compare::mod_revision(
                key.clone(),
                CompareOp::Equal,
                stored.revision,
            ));
            let txn = Txn::new().when(compares).and_then([TxnOp::put(
                key.clone(),
                epoch.to_string(),
                None,
            )]);
            if self
                .session
                .transact(txn, "raising an epoch")
                .map_err(shared)?
            {
                self.set_epoch(epoch);
                return Ok(epoch);
            }
            let owner = self
                .session
                .wait(self.session.owner(&self.id))
                .map_err(shared)?;
            if owner.as_deref() != Some(self.session.name()) {
                return Err(self.why_refused());
            }
        }
        Err(self.fenced("its epoch kept moving under this run".into()))
    }

    fn check_pipeline(&self, pipeline: &str) -> Result<(), StoreError> {
        if pipeline == self.id.name {
            Ok(())
        } else {
            Err(StoreError::Shared(format!(
                "the store of {} was asked about pipeline `{pipeline}`",
                self.id
            )))
        }
    }
}

impl PositionStore for EtcdStore {
    fn next_epoch(&self, pipeline: &str) -> Result<u64, StoreError> {
        self.check_pipeline(pipeline)?;
        let id = self.id.clone();
        self.move_epoch(move |current| next_epoch(&id, current))
    }

    fn raise_epoch(&self, pipeline: &str, at_least: u64) -> Result<u64, StoreError> {
        self.check_pipeline(pipeline)?;
        self.move_epoch(move |current| Ok(current.max(at_least)))
    }

    fn current_epoch(&self, pipeline: &str) -> Result<Option<u64>, StoreError> {
        self.check_pipeline(pipeline)?;
        let stored = self
            .session
            .wait(self.session.read_epoch(&self.id))
            .map_err(shared)?;
        Ok((stored.revision != 0).then_some(stored.epoch))
    }

    fn get(&self, pipeline: &str, sink: &str, table: &str) -> Result<Option<Position>, StoreError> {
        self.check_pipeline(pipeline)?;
        let key = self.session.keys().position(&self.id, sink, table);
        let mut client = self.session.client();
        let found = self
            .session
            .wait(async {
                client
                    .get(key, None)
                    .await
                    .map_err(|e| self.session.error_of("reading a position", e))
            })
            .map_err(shared)?;
        Ok(found
            .kvs()
            .first()
            .map(|kv| Position::from_bytes(kv.value().to_vec())))
    }

    fn put_all(&self, pipeline: &str, entries: &[Entry]) -> Result<(), StoreError> {
        self.check_pipeline(pipeline)?;
        if entries.is_empty() {
            return Ok(());
        }
        let lease = self.lease_or_fenced()?;
        let Some(epoch) = self.my_epoch() else {
            return Err(self.fenced("this run has taken no epoch".into()));
        };
        let mut compares = self.session.holds(&self.id, lease);
        compares.push(Compare::value(
            self.session.keys().epoch(&self.id),
            CompareOp::Equal,
            epoch.to_string(),
        ));
        let operations: Vec<TxnOp> = entries
            .iter()
            .map(|entry| {
                let key = self
                    .session
                    .keys()
                    .position(&self.id, &entry.sink, &entry.table);
                match &entry.position {
                    Some(position) => TxnOp::put(key, position.as_bytes().to_vec(), None),
                    None => TxnOp::delete(key, None),
                }
            })
            .collect();
        let txn = Txn::new().when(compares).and_then(operations);
        if self
            .session
            .transact(txn, "writing positions")
            .map_err(shared)?
        {
            Ok(())
        } else {
            Err(self.why_refused())
        }
    }

    fn list(&self, pipeline: &str) -> Result<Vec<Stored>, StoreError> {
        self.check_pipeline(pipeline)?;
        let prefix = self.session.keys().positions(&self.id);
        let mut out = Vec::new();
        for (rest, value) in self
            .session
            .under(&prefix, "listing positions")
            .map_err(shared)?
        {
            let Some((sink, table)) = rest.split_once('/') else {
                continue;
            };
            out.push(Stored {
                sink: sink.to_string(),
                table: table.to_string(),
                position: Position::from_bytes(value),
            });
        }
        Ok(out)
    }

    fn may_commit(&self, pipeline: &str) -> Result<(), StoreError> {
        self.check_pipeline(pipeline)?;
        let lease = self.lease_or_fenced()?;
        self.session
            .may_commit(lease)
            .map_err(|detail| self.fenced(detail))
    }
}

fn shared(error: ClusterError) -> StoreError {
    StoreError::Shared(error.to_string())
}
