//! `weir:sink@0.1.0` (frozen in `wit/since_v0.1.0/`): its bindings, the host
//! side of its imports, and the conversions between the host's types and
//! this version's WIT types.

use wasmtime::Store;
use wasmtime::component::{HasData, Instance, InstancePre, Linker};
use weir_core::{CommitRequest, Position};

use crate::capability::HasCapabilities;
use crate::capability::blobstore::{self as host_blob, BlobScope};
use crate::capability::log::{LogLevel, SinkLog};
use crate::types::{BatchHeader, OptionalExport, SinkClaim, SinkError, TableDescription};
use crate::wit::Answer;

wasmtime::component::bindgen!({
    // The sink contract and the maintenance package built on it.
    path: ["../../wit/since_v0.1.0", "../../wit/maintenance/since_v0.1.0"],
    // The widest world: every optional export is looked up only when the
    // plugin has it (see `ExportIndices::new`).
    world: "weir:maintenance/maintained-sink-plugin",
    // A blob call may trap the sink instead of answering: that is how a
    // test host crashes it in the middle of a commit (`BlobError::Crash`).
    imports: { "weir:sink/blobstore": trappable },
});

use self::exports::weir::maintenance::maintenance;
use self::exports::weir::sink::{positions, sink};
use self::weir::sink::{blobstore, log, types};

/// The package version, as it appears in import and export names.
pub const VERSION: &str = "0.1.0";

/// The `maintenance` export a plugin of this version may have: its own
/// package, built on this version's types (`wit/maintenance/since_v0.1.0/`).
pub const MAINTENANCE_EXPORT: &str = "weir:maintenance/maintenance@0.1.0";

/// Adds this version's interfaces: `types`, and `blobstore` and `log`
/// served by the instance's capability states.
pub fn add_to_linker<T: HasCapabilities>(linker: &mut Linker<T>) -> wasmtime::Result<()> {
    types::add_to_linker::<T, TypesHost>(linker, |_| TypesHost)?;
    blobstore::add_to_linker::<T, BlobstoreHost>(linker, |state| {
        state.capabilities().blobstore.as_ref()
    })?;
    log::add_to_linker::<T, LogHost>(linker, |state| &state.capabilities().log)
}

/// `types` has no functions; this serves it.
struct TypesHost;

impl HasData for TypesHost {
    type Data<'a> = TypesHost;
}

impl types::Host for TypesHost {}

/// Serves `blobstore` from the instance's blob scope alone.
struct BlobstoreHost;

impl HasData for BlobstoreHost {
    type Data<'a> = &'a BlobScope;
}

impl blobstore::Host for &BlobScope {
    fn get(&mut self, path: String) -> BlobAnswer<Vec<u8>> {
        answer(BlobScope::get(self, &path))
    }

    fn get_range(&mut self, path: String, offset: u64, length: u64) -> BlobAnswer<Vec<u8>> {
        answer(BlobScope::get_range(self, &path, offset, length))
    }

    fn put(&mut self, path: String, data: Vec<u8>) -> BlobAnswer<()> {
        answer(BlobScope::put(self, &path, data))
    }

    fn put_if_absent(&mut self, path: String, data: Vec<u8>) -> BlobAnswer<()> {
        answer(BlobScope::put_if_absent(self, &path, data))
    }

    fn list(&mut self, prefix: String) -> BlobAnswer<Vec<blobstore::ObjectMeta>> {
        answer(BlobScope::list(self, &prefix).map(|listed| {
            listed
                .into_iter()
                .map(|m| blobstore::ObjectMeta {
                    path: m.path,
                    size: m.size,
                })
                .collect()
        }))
    }

    fn delete(&mut self, path: String) -> BlobAnswer<()> {
        answer(BlobScope::delete(self, &path))
    }
}

/// What a blob call gives the sink: an answer, or a trap.
type BlobAnswer<T> = wasmtime::Result<Result<T, blobstore::BlobError>>;

/// A blob call's answer to the sink, or the trap of an injected crash.
fn answer<T>(result: Result<T, host_blob::BlobError>) -> BlobAnswer<T> {
    match result {
        Err(host_blob::BlobError::Crash(message)) => Err(wasmtime::format_err!(message)),
        other => Ok(other.map_err(blobstore::BlobError::from)),
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
            // Turned into a trap by `answer` before it gets here.
            E::Crash(m) => Self::Io(m),
        }
    }
}

/// Serves `log` from the instance's log alone.
struct LogHost;

impl HasData for LogHost {
    type Data<'a> = &'a SinkLog;
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
    maintenance: Option<maintenance::GuestIndices>,
}

impl ExportIndices {
    /// Finds `sink`, and each of `optional`.
    pub fn new<T: 'static>(
        pre: &InstancePre<T>,
        optional: &[OptionalExport],
    ) -> wasmtime::Result<Self> {
        let mut indices = ExportIndices {
            sink: sink::GuestIndices::new(pre)?,
            positions: None,
            maintenance: None,
        };
        for export in optional {
            match export {
                OptionalExport::Positions => {
                    indices.positions = Some(positions::GuestIndices::new(pre)?)
                }
                OptionalExport::Maintenance => {
                    indices.maintenance = Some(maintenance::GuestIndices::new(pre)?)
                }
            }
        }
        Ok(indices)
    }

    /// The exports of one instance.
    pub fn load<T: HasCapabilities>(
        &self,
        store: &mut Store<T>,
        instance: &Instance,
    ) -> wasmtime::Result<SinkExports> {
        Ok(SinkExports {
            sink: self.sink.load(&mut *store, instance)?,
            positions: match &self.positions {
                Some(indices) => Some(indices.load(&mut *store, instance)?),
                None => None,
            },
            maintenance: match &self.maintenance {
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
    maintenance: Option<maintenance::Guest>,
}

impl SinkExports {
    pub fn open<T: HasCapabilities>(
        &self,
        store: &mut Store<T>,
        pipeline: &str,
        config: &[(String, String)],
    ) -> Answer<()> {
        let answer = self.sink.call_open(&mut *store, pipeline, config)?;
        Ok(answer.map_err(|e| sink_error(store, e)))
    }

    pub fn write<T: HasCapabilities>(
        &self,
        store: &mut Store<T>,
        header: &BatchHeader,
        ipc: &[u8],
    ) -> Answer<()> {
        let answer = self.sink.call_write(&mut *store, &batch(header), ipc)?;
        Ok(answer.map_err(|e| sink_error(store, e)))
    }

    pub fn commit<T: HasCapabilities>(
        &self,
        store: &mut Store<T>,
        request: &CommitRequest,
    ) -> Answer<()> {
        let request = types::CommitRequest {
            table: request.table.clone(),
            high: request.high.as_bytes().to_vec(),
            pipeline: request.pipeline.clone(),
            epoch: request.epoch,
        };
        let answer = self.sink.call_commit(&mut *store, &request)?;
        Ok(answer.map_err(|e| sink_error(store, e)))
    }

    pub fn abort<T: HasCapabilities>(
        &self,
        store: &mut Store<T>,
        table: &str,
    ) -> wasmtime::Result<()> {
        self.sink.call_abort(store, table)
    }

    /// The sink's record of `table`; `None` from a sink without `positions`.
    pub fn committed<T: HasCapabilities>(
        &self,
        store: &mut Store<T>,
        pipeline: &str,
        table: &str,
    ) -> Answer<Option<SinkClaim>> {
        let Some(positions) = &self.positions else {
            return Ok(Ok(None));
        };
        let answer = positions.call_committed(&mut *store, pipeline, table)?;
        Ok(answer
            .map(|found| {
                found.map(|c| SinkClaim {
                    position: Position::from_bytes(c.position),
                    epoch: c.epoch,
                })
            })
            .map_err(|e| sink_error(store, e)))
    }
}

impl SinkExports {
    /// The sink's maintenance report; `None` from a sink without
    /// `maintenance`. The report is cut and escaped like an error message.
    pub fn maintain<T: HasCapabilities>(
        &self,
        store: &mut Store<T>,
        pipeline: &str,
        tables: &[String],
        what: &[String],
    ) -> Answer<Option<String>> {
        let Some(maintenance) = &self.maintenance else {
            return Ok(Ok(None));
        };
        let answer = maintenance.call_maintain(&mut *store, pipeline, tables, what)?;
        Ok(answer
            .map(|report| Some(bounded_report(&report)))
            .map_err(|e| sink_error(store, e)))
    }
}

/// The most of a maintenance report the host shows.
pub const MAX_REPORT_BYTES: usize = 16 << 10;

/// A plugin's report as the operator may see it: at most
/// [`MAX_REPORT_BYTES`], cut at a character boundary, and no control
/// characters but newlines and tabs (a terminal would obey them).
fn bounded_report(report: &str) -> String {
    let mut out = String::with_capacity(report.len().min(MAX_REPORT_BYTES));
    for c in report.chars() {
        let shown = match c {
            '\n' | '\t' => c.to_string(),
            c if c.is_control() => c.escape_default().to_string(),
            c => c.to_string(),
        };
        if out.len() + shown.len() > MAX_REPORT_BYTES {
            out.push_str(" [cut]");
            break;
        }
        out.push_str(&shown);
    }
    out
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
fn sink_error<T: HasCapabilities>(store: &mut Store<T>, error: types::SinkError) -> SinkError {
    use types::SinkError as E;
    let log = &store.data_mut().capabilities().log;
    match error {
        E::Retryable(m) => SinkError::Retryable(log.error_message(&m)),
        E::Poison(m) => SinkError::Poison(log.error_message(&m)),
        E::Fenced(m) => SinkError::Fenced(log.error_message(&m)),
        E::Fatal(m) => SinkError::Fatal(log.error_message(&m)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_report_is_bounded_and_escaped() {
        assert_eq!(bounded_report("ok\nnext"), "ok\nnext");
        assert_eq!(bounded_report("\u{1b}[2Jx"), "\\u{1b}[2Jx");
        let long = bounded_report(&"é".repeat(MAX_REPORT_BYTES));
        assert!(long.len() <= MAX_REPORT_BYTES + " [cut]".len());
        assert!(long.ends_with(" [cut]"));
    }
}
