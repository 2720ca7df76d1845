//! Component glue used by the export macros. Not part of the API: nothing
//! here is stable.

use std::cell::RefCell;
use std::thread::LocalKey;

use crate::{
    Batch, BatchMeta, CommitRequest, Config, Maintenance, MetadataColumn, Mode, Positions, Sink,
    SinkError, Table,
};

/// Bindings for the `sink-plugin` world. The SDK's blob and log modules use
/// its imports; `export_sink!` uses its export macro.
pub mod sink_plugin {
    wit_bindgen::generate!({
        world: "sink-plugin",
        path: "../wit/since_v0.1.0",
        pub_export_macro: true,
        export_macro_name: "__export_sink_plugin",
        default_bindings_module: "weir_sdk::__private::sink_plugin",
    });
}

/// Bindings for the `positions` export alone.
///
/// A second `generate!` of the whole `positioned-sink-plugin` world would
/// define the crate-level export macro of the `sink` interface a second time,
/// so this module binds a one-line world that only exports `positions`
/// (sharing the types of [`sink_plugin`]). `export_positioned_sink!` invokes
/// both export macros; the component built from them has the imports and
/// exports of `positioned-sink-plugin`.
pub mod positions_export {
    wit_bindgen::generate!({
        inline: "
            package weir:sdk-glue;

            world positions-export {
                export weir:sink/positions@0.1.0;
            }
        ",
        world: "positions-export",
        path: "../wit/since_v0.1.0",
        pub_export_macro: true,
        export_macro_name: "__export_positions",
        default_bindings_module: "weir_sdk::__private::positions_export",
        with: {
            "weir:sink/types@0.1.0": crate::__private::sink_plugin::weir::sink::types,
        },
    });
}

/// Bindings for the `maintenance` export alone, for the same reason as
/// [`positions_export`]: `export_positioned_sink!(T, maintenance)` invokes
/// its export macro beside the other two, which makes the component's world
/// `weir:maintenance/maintained-sink-plugin` (its own package, built on the
/// sink contract's types).
pub mod maintenance_export {
    wit_bindgen::generate!({
        inline: "
            package weir:sdk-glue;

            world maintenance-export {
                export weir:maintenance/maintenance@0.1.0;
            }
        ",
        world: "maintenance-export",
        path: ["../wit/since_v0.1.0", "../wit/maintenance/since_v0.1.0"],
        pub_export_macro: true,
        export_macro_name: "__export_maintenance",
        default_bindings_module: "weir_sdk::__private::maintenance_export",
        with: {
            "weir:sink/types@0.1.0": crate::__private::sink_plugin::weir::sink::types,
        },
    });
}

use sink_plugin::weir::sink::types as wit;

pub use positions_export::exports::weir::sink::positions::CommittedPosition as WitCommittedPosition;
pub use wit::{Batch as WitBatch, CommitRequest as WitCommitRequest, SinkError as WitSinkError};

/// Where the export macros keep the plugin's single sink instance.
pub type Slot<S> = LocalKey<RefCell<Option<S>>>;

fn with_sink<S: Sink + Default, R>(slot: &'static Slot<S>, f: impl FnOnce(&mut S) -> R) -> R {
    slot.with(|cell| {
        let mut sink = cell.borrow_mut();
        f(sink.get_or_insert_with(S::default))
    })
}

fn to_wit(e: SinkError) -> WitSinkError {
    match e {
        SinkError::Retryable(m) => WitSinkError::Retryable(m),
        SinkError::Poison(m) => WitSinkError::Poison(m),
        SinkError::Fenced(m) => WitSinkError::Fenced(m),
        SinkError::Fatal(m) => WitSinkError::Fatal(m),
    }
}

fn batch_meta(batch: WitBatch) -> Result<BatchMeta, WitSinkError> {
    let wit::Table {
        name,
        key_columns,
        mode,
        destination,
        metadata,
    } = batch.table;
    let Some(mode) = Mode::parse(&mode) else {
        return Err(WitSinkError::Poison(format!(
            "batch {} of table {name}: unknown mode {mode:?}",
            batch.id
        )));
    };
    Ok(BatchMeta {
        table: Table {
            name,
            key_columns,
            mode,
            destination,
            metadata: metadata
                .into_iter()
                .map(|m| MetadataColumn {
                    source: m.source,
                    name: m.name,
                })
                .collect(),
        },
        id: batch.id,
        low: batch.low,
        high: batch.high,
        rows: batch.rows,
    })
}

pub fn open<S: Sink + Default>(
    slot: &'static Slot<S>,
    pipeline: String,
    config: Vec<(String, String)>,
) -> Result<(), WitSinkError> {
    let config: Config = config.into_iter().collect();
    with_sink(slot, |s| s.open(&pipeline, &config)).map_err(to_wit)
}

pub fn write<S: Sink + Default>(
    slot: &'static Slot<S>,
    batch: WitBatch,
    ipc: Vec<u8>,
) -> Result<(), WitSinkError> {
    let meta = batch_meta(batch)?;
    let batch = Batch::decode_owned(meta, ipc).map_err(to_wit)?;
    with_sink(slot, |s| s.write(batch)).map_err(to_wit)
}

pub fn commit<S: Sink + Default>(
    slot: &'static Slot<S>,
    request: WitCommitRequest,
) -> Result<(), WitSinkError> {
    let request = CommitRequest {
        table: request.table,
        high: request.high,
        pipeline: request.pipeline,
        epoch: request.epoch,
    };
    with_sink(slot, |s| s.commit(request)).map_err(to_wit)
}

pub fn abort<S: Sink + Default>(slot: &'static Slot<S>, table: String) {
    with_sink(slot, |s| s.abort(&table))
}

pub fn committed<S: Positions + Default>(
    slot: &'static Slot<S>,
    pipeline: String,
    table: String,
) -> Result<Option<WitCommittedPosition>, WitSinkError> {
    let found = with_sink(slot, |s| s.committed(&pipeline, &table)).map_err(to_wit)?;
    Ok(found.map(|c| WitCommittedPosition {
        position: c.position,
        epoch: c.epoch,
    }))
}

pub fn maintain<S: Maintenance + Default>(
    slot: &'static Slot<S>,
    pipeline: String,
    tables: Vec<String>,
    what: Vec<String>,
) -> Result<String, WitSinkError> {
    with_sink(slot, |s| s.maintain(&pipeline, &tables, &what)).map_err(to_wit)
}
