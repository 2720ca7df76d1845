//! `weir:sink@0.1.0` (frozen in `wit/since_v0.1.0/`): its bindings, the host
//! side of its imports, and the conversions between the host's types and
//! this version's WIT types.

use wasmtime::Store;
use wasmtime::component::{HasData, HasSelf, Instance, InstancePre, Linker};
use weir_core::{CommitRequest, Position};

use crate::runtime::capability::blobstore::{self as host_blob, BlobScope};
use crate::runtime::capability::log::{LogLevel, SinkLog};
use crate::runtime::instance::HostState;
use crate::runtime::types::{BatchHeader, SinkError, SinkPosition, TableDescription};
use crate::runtime::wit::Answer;

wasmtime::component::bindgen!({
    path: "../wit/since_v0.1.0",
    world: "positioned-sink-plugin",
});

use self::exports::weir::sink::{positions, sink};
use self::weir::sink::{blobstore, log, types};

/// The package version, as it appears in import and export names.
pub const VERSION: &str = "0.1.0";

/// Adds the interfaces that belong to no capability (`types`).
pub fn add_shared_to_linker(linker: &mut Linker<HostState>) -> wasmtime::Result<()> {
    types::add_to_linker::<HostState, HasSelf<HostState>>(linker, |state| state)
}

impl types::Host for HostState {}

/// Serves `blobstore` from the instance's blob scope alone.
struct BlobstoreHost;

impl HasData for BlobstoreHost {
    type Data<'a> = &'a BlobScope;
}

/// Adds `blobstore`, served by the scope `state` picks out of an instance.
pub fn link_blobstore(
    linker: &mut Linker<HostState>,
    state: fn(&mut HostState) -> &BlobScope,
) -> wasmtime::Result<()> {
    blobstore::add_to_linker::<HostState, BlobstoreHost>(linker, state)
}

impl blobstore::Host for &BlobScope {
    fn get(&mut self, path: String) -> Result<Vec<u8>, blobstore::BlobError> {
        Ok(BlobScope::get(self, &path)?)
    }

    fn get_range(
        &mut self,
        path: String,
        offset: u64,
        length: u64,
    ) -> Result<Vec<u8>, blobstore::BlobError> {
        Ok(BlobScope::get_range(self, &path, offset, length)?)
    }

    fn put(&mut self, path: String, data: Vec<u8>) -> Result<(), blobstore::BlobError> {
        Ok(BlobScope::put(self, &path, data)?)
    }

    fn put_if_absent(&mut self, path: String, data: Vec<u8>) -> Result<(), blobstore::BlobError> {
        Ok(BlobScope::put_if_absent(self, &path, data)?)
    }

    fn list(&mut self, prefix: String) -> Result<Vec<blobstore::ObjectMeta>, blobstore::BlobError> {
        Ok(BlobScope::list(self, &prefix)?
            .into_iter()
            .map(|m| blobstore::ObjectMeta {
                path: m.path,
                size: m.size,
            })
            .collect())
    }

    fn delete(&mut self, path: String) -> Result<(), blobstore::BlobError> {
        Ok(BlobScope::delete(self, &path)?)
    }
}

impl From<host_blob::BlobError> for blobstore::BlobError {
    fn from(error: host_blob::BlobError) -> Self {
        use host_blob::BlobError as E;
        match error {
            E::NotFound(m) => Self::NotFound(m),
            E::AlreadyExists(m) => Self::AlreadyExists(m),
            E::Denied(m) => Self::Denied(m),
            E::Io(m) => Self::Io(m),
        }
    }
}

/// Serves `log` from the instance's log alone.
struct LogHost;

impl HasData for LogHost {
    type Data<'a> = &'a SinkLog;
}

/// Adds `log`, served by the log `state` picks out of an instance.
pub fn link_log(
    linker: &mut Linker<HostState>,
    state: fn(&mut HostState) -> &SinkLog,
) -> wasmtime::Result<()> {
    log::add_to_linker::<HostState, LogHost>(linker, state)
}

impl log::Host for &SinkLog {
    fn log(&mut self, level: log::Level, message: String) {
        let level = match level {
            log::Level::Trace => LogLevel::Trace,
            log::Level::Debug => LogLevel::Debug,
            log::Level::Info => LogLevel::Info,
            log::Level::Warn => LogLevel::Warn,
            log::Level::Error => LogLevel::Error,
        };
        self.write(level, &message);
    }
}

/// Where this version's exports sit in a pre-instantiated plugin.
pub struct ExportIndices {
    sink: sink::GuestIndices,
    positions: Option<positions::GuestIndices>,
}

impl ExportIndices {
    /// Finds `sink`, and `positions` when the plugin exports it.
    pub fn new(pre: &InstancePre<HostState>, positioned: bool) -> wasmtime::Result<Self> {
        Ok(ExportIndices {
            sink: sink::GuestIndices::new(pre)?,
            positions: match positioned {
                true => Some(positions::GuestIndices::new(pre)?),
                false => None,
            },
        })
    }

    /// The exports of one instance.
    pub fn load(
        &self,
        store: &mut Store<HostState>,
        instance: &Instance,
    ) -> wasmtime::Result<SinkExports> {
        Ok(SinkExports {
            sink: self.sink.load(&mut *store, instance)?,
            positions: match &self.positions {
                Some(indices) => Some(indices.load(&mut *store, instance)?),
                None => None,
            },
        })
    }
}

/// One instance's exports: host types in, WIT types across, host types out.
pub struct SinkExports {
    sink: sink::Guest,
    positions: Option<positions::Guest>,
}

impl SinkExports {
    pub fn open(
        &self,
        store: &mut Store<HostState>,
        pipeline: &str,
        config: &[(String, String)],
    ) -> Answer<()> {
        let answer = self.sink.call_open(&mut *store, pipeline, config)?;
        Ok(answer.map_err(|e| sink_error(store, e)))
    }

    pub fn write(
        &self,
        store: &mut Store<HostState>,
        header: &BatchHeader,
        ipc: &[u8],
    ) -> Answer<()> {
        let answer = self.sink.call_write(&mut *store, &batch(header), ipc)?;
        Ok(answer.map_err(|e| sink_error(store, e)))
    }

    pub fn commit(&self, store: &mut Store<HostState>, request: &CommitRequest) -> Answer<()> {
        let request = types::CommitRequest {
            table: request.table.clone(),
            high: request.high.as_bytes().to_vec(),
            pipeline: request.pipeline.clone(),
            epoch: request.epoch,
        };
        let answer = self.sink.call_commit(&mut *store, &request)?;
        Ok(answer.map_err(|e| sink_error(store, e)))
    }

    pub fn abort(&self, store: &mut Store<HostState>, table: &str) -> wasmtime::Result<()> {
        self.sink.call_abort(store, table)
    }

    /// The sink's record of `table`; `None` from a sink without `positions`.
    pub fn committed(
        &self,
        store: &mut Store<HostState>,
        pipeline: &str,
        table: &str,
    ) -> Answer<Option<SinkPosition>> {
        let Some(positions) = &self.positions else {
            return Ok(Ok(None));
        };
        let answer = positions.call_committed(&mut *store, pipeline, table)?;
        Ok(answer
            .map(|found| {
                found.map(|c| SinkPosition {
                    position: Position::from_bytes(c.position),
                    epoch: c.epoch,
                })
            })
            .map_err(|e| sink_error(store, e)))
    }
}

fn batch(header: &BatchHeader) -> types::Batch {
    types::Batch {
        table: table(&header.table),
        id: header.id.clone(),
        low: header.low.as_bytes().to_vec(),
        high: header.high.as_bytes().to_vec(),
        rows: header.rows,
    }
}

fn table(table: &TableDescription) -> types::Table {
    types::Table {
        name: table.name.clone(),
        key_columns: table.key_columns.clone(),
        mode: table.mode.as_str().to_string(),
        destination: table.destination.clone(),
        metadata: table
            .metadata
            .iter()
            .map(|m| types::MetadataColumn {
                source: m.field.wit_name().to_string(),
                name: m.name.clone(),
            })
            .collect(),
    }
}

/// A sink's error in host terms, its message cut and escaped by the
/// instance's log limits (`limits.max_message_bytes`) before the host logs,
/// retries or stores it: a sink may return megabytes, and newlines.
fn sink_error(store: &Store<HostState>, error: types::SinkError) -> SinkError {
    use types::SinkError as E;
    let log = &store.data().capabilities.log;
    match error {
        E::Retryable(m) => SinkError::Retryable(log.error_message(&m)),
        E::Poison(m) => SinkError::Poison(log.error_message(&m)),
        E::Fenced(m) => SinkError::Fenced(log.error_message(&m)),
        E::Fatal(m) => SinkError::Fatal(log.error_message(&m)),
    }
}
