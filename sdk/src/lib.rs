//! Write a sink for weir.
//!
//! A weir sink is a WebAssembly component that receives row changes for one
//! table at a time and makes them durable in a destination. This crate hides
//! the component plumbing: implement [`Sink`] (and [`Positions`] if your
//! destination can store a position atomically with its data), export the
//! type with [`export_sink!`] or [`export_positioned_sink!`], and build with
//! `cargo build --release --target wasm32-wasip2`.
//!
//! ```no_run
//! use weir_sdk::{Batch, CommitRequest, Result, Sink};
//!
//! #[derive(Default)]
//! struct Counter {
//!     staged: usize,
//! }
//!
//! impl Sink for Counter {
//!     fn write(&mut self, batch: Batch) -> Result<()> {
//!         self.staged += batch.num_rows();
//!         Ok(())
//!     }
//!
//!     fn commit(&mut self, request: CommitRequest) -> Result<()> {
//!         weir_sdk::log::info(format!("{}: {} rows", request.table, self.staged));
//!         self.staged = 0;
//!         Ok(())
//!     }
//! }
//!
//! weir_sdk::export_sink!(Counter);
//! ```
//!
//! The host calls `open` once, then `write` for each batch (already decoded
//! from Arrow IPC into a [`Batch`]) and `commit` for each table when the
//! staged batches must become durable. Return `Ok` from `commit` only once the
//! data survives a crash: the host moves its checkpoint as soon as you do.
//!
//! A sink that reaches a service (an HTTP endpoint, a TCP server) does so
//! with [`net`], and only where the operator granted it.
//!
//! The same sink also runs natively, without WebAssembly, through
//! [`native::NativeSink`]: use it in unit tests and to measure what the
//! sandbox costs.

pub use arrow_array;
pub use arrow_array::RecordBatch;
/// Arrow's casts and its display of any value as text, for a sink that
/// writes values without knowing each column's type up front:
///
/// ```
/// use std::sync::Arc;
/// use weir_sdk::arrow_array::{ArrayRef, Decimal128Array, TimestampMicrosecondArray};
/// use weir_sdk::arrow_cast::display::{ArrayFormatter, FormatOptions};
///
/// let balance: ArrayRef =
///     Arc::new(Decimal128Array::from(vec![Some(1250), None]).with_precision_and_scale(12, 2).unwrap());
/// let at: ArrayRef = Arc::new(TimestampMicrosecondArray::from(vec![0]).with_timezone("+00:00"));
/// let options = FormatOptions::default().with_null("NULL");
/// let text = |array: &ArrayRef, row| {
///     ArrayFormatter::try_new(array.as_ref(), &options).unwrap().value(row).to_string()
/// };
/// assert_eq!(text(&balance, 0), "12.50");
/// assert_eq!(text(&balance, 1), "NULL");
/// assert_eq!(text(&at, 0), "1970-01-01T00:00:00Z");
/// ```
pub use arrow_cast;
pub use arrow_schema;

mod batch;
pub mod blob;
mod config;
mod error;
pub mod log;
// The C library's byte comparisons, replaced in the WebAssembly build;
// natively compiled only to be tested.
#[cfg(any(target_arch = "wasm32", test))]
mod mem;
#[cfg(any(not(target_arch = "wasm32"), doc))]
pub mod native;
pub mod net;

#[cfg(target_arch = "wasm32")]
#[doc(hidden)]
pub mod __private;

pub use batch::{Batch, BatchMeta, MetadataColumn, Table};
// One definition of these, in the contract crate, so a sink and the host
// cannot spell a control column or an operation differently.
pub use blob::BlobError;
pub use config::Config;
pub use error::{Result, SinkError};
pub use weir_contract::{Mode, OP_COLUMN, Op, POS_COLUMN};

/// A request to make everything staged for one table durable and visible.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CommitRequest {
    /// The table to commit, as in [`Table::name`] of the batches staged for it.
    pub table: String,
    /// The position the table is at once this commit is durable. A sink with
    /// [`Positions`] stores it atomically with the data and returns it from
    /// [`Positions::committed`]. Positions compare byte by byte.
    pub high: Vec<u8>,
    /// The pipeline that commits; several pipelines may share a destination.
    pub pipeline: String,
    /// Fencing epoch: grows by one each time a host starts the pipeline. A
    /// sink with [`Positions`] must return [`SinkError::Fenced`] when this is
    /// lower than an epoch it already committed for the table.
    pub epoch: u64,
}

/// What a table's last durable commit recorded, as returned by
/// [`Positions::committed`].
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Committed {
    /// The [`CommitRequest::high`] of the last durable commit.
    pub position: Vec<u8>,
    /// The [`CommitRequest::epoch`] of that commit.
    pub epoch: u64,
}

/// A sink: stages batches per table and commits them.
///
/// The host creates one instance (with `Default`) per loaded plugin and calls
/// it from one thread. For each table, batches arrive in position order and a
/// batch never mixes tables; `commit` for a table makes everything staged for
/// that table durable in one step. A sink that only implements this trait is
/// at-least-once: after a crash the host replays batches that may already be
/// in the destination, with the same [`Batch::id`], so name what you write
/// after the id (or apply by key) to stay idempotent.
pub trait Sink: 'static {
    /// Called once, before any other call, with the pipeline id and the
    /// `config` map the operator wrote for this sink. Reject configuration
    /// you cannot use with [`SinkError::Fatal`] naming the key (see
    /// [`Config::require`]). The default accepts anything.
    fn open(&mut self, pipeline: &str, config: &Config) -> Result<()> {
        let _ = (pipeline, config);
        Ok(())
    }

    /// Stages one batch. Nothing staged may become visible before
    /// [`Sink::commit`] for its table. Return [`SinkError::Poison`] for a
    /// batch the destination can never hold.
    fn write(&mut self, batch: Batch) -> Result<()>;

    /// Makes everything staged for `request.table` durable and visible in one
    /// step; return `Ok` only when it is durable. A commit with nothing
    /// staged is valid (the position still advances). On error the host keeps
    /// the staged data staged and retries ([`SinkError::Retryable`]) or stops.
    fn commit(&mut self, request: CommitRequest) -> Result<()>;

    /// Drops everything staged for `table` and not yet committed. The default
    /// does nothing, which is only right for a sink that stages nothing.
    fn abort(&mut self, table: &str) {
        let _ = table;
    }
}

/// Optional capability: the sink stores the position atomically with its
/// data, which makes it exactly-once.
///
/// Export a type implementing this with [`export_positioned_sink!`]. On start
/// the host asks [`Positions::committed`] where each table stands and trusts
/// the answer over its own records, so every successful [`Sink::commit`] must
/// record `request.high` and `request.epoch` in the same atomic step as the
/// data, also when nothing was staged.
///
/// In the same step, compare the table's stored position with the `low` of
/// the first batch staged since the last commit (the host cuts each batch
/// after where it last read the table stands). At or past `request.high`:
/// the table holds the batch already (a commit whose answer was lost, or a
/// stalled older host's); write nothing and succeed. At or past `low` but
/// short of `high`: another host committed part of these changes after this
/// one read the table (a commit frozen inside the sink until the pipeline
/// moved); return [`SinkError::Fatal`], so the run recovers from the table,
/// rather than hold those changes twice. `weir plugin test` checks this in
/// its `commit-inside-staged` scenario.
pub trait Positions: Sink {
    /// Where `table` stands for `pipeline`: the `high` and `epoch` of its last
    /// durable commit, or `None` if nothing was ever committed for it.
    fn committed(&mut self, pipeline: &str, table: &str) -> Result<Option<Committed>>;
}

/// Optional capability: maintenance of the destination on demand, run by
/// `weir maintain` (compacting small files, expiring old versions, ...).
///
/// Export a type implementing this with
/// `export_positioned_sink!(MySink, maintenance)`. The host calls it from its
/// own process while a pipeline may be committing to the same destination
/// from another, and may be killed at any step: the work must leave the
/// destination readable and exact whatever happens, and must never undo a
/// commit it raced with.
pub trait Maintenance: Sink {
    /// Maintains the destinations of `pipeline`'s tables named in `tables`
    /// (source table names, as in [`Table::name`]; empty for every table the
    /// pipeline wrote). `what` names the kinds of work to do (empty for all
    /// the sink knows); refuse a name you do not know with
    /// [`SinkError::Fatal`]. Returns a short report for the operator (the
    /// host shows at most 16 KiB of it).
    fn maintain(&mut self, pipeline: &str, tables: &[String], what: &[String]) -> Result<String>;
}

/// Exports a [`Sink`] as the plugin's implementation of the `sink-plugin`
/// world (a sink without positions: at-least-once).
///
/// Call it once, at the top level of your `cdylib` crate, with a type that
/// implements [`Sink`] and `Default`:
///
/// ```ignore
/// weir_sdk::export_sink!(MySink);
/// ```
///
/// The instance is created with `Default` on the host's first call. In a
/// native build (for tests) the macro only checks the type.
#[cfg(target_arch = "wasm32")]
#[macro_export]
macro_rules! export_sink {
    ($ty:ty) => {
        const _: () = {
            ::std::thread_local! {
                static __WEIR_SINK: ::core::cell::RefCell<::core::option::Option<$ty>> =
                    const { ::core::cell::RefCell::new(::core::option::Option::None) };
            }
            struct __WeirSinkExport;
            $crate::__weir_sink_guest!(
                __WeirSinkExport,
                __WEIR_SINK,
                $crate::__private::sink_plugin::exports::weir::sink::sink::Guest
            );
            $crate::__private::sink_plugin::__export_sink_plugin!(
                __WeirSinkExport with_types_in $crate::__private::sink_plugin
            );
        };
    };
}

/// Exports a [`Sink`] as the plugin's implementation of the `sink-plugin`
/// world (a sink without positions: at-least-once).
///
/// Call it once, at the top level of your `cdylib` crate, with a type that
/// implements [`Sink`] and `Default`:
///
/// ```ignore
/// weir_sdk::export_sink!(MySink);
/// ```
///
/// The instance is created with `Default` on the host's first call. In a
/// native build (for tests) the macro only checks the type.
#[cfg(not(target_arch = "wasm32"))]
#[macro_export]
macro_rules! export_sink {
    ($ty:ty) => {
        const _: fn() = || {
            fn exportable<S: $crate::Sink + ::core::default::Default>() {}
            exportable::<$ty>();
        };
    };
}

/// Exports a [`Sink`] + [`Positions`] as the plugin's implementation of the
/// `positioned-sink-plugin` world (a sink with positions: exactly-once).
///
/// Call it once, at the top level of your `cdylib` crate, with a type that
/// implements [`Positions`] and `Default`:
///
/// ```ignore
/// weir_sdk::export_positioned_sink!(MySink);
/// ```
///
/// A sink that also implements [`Maintenance`] exports it too (the
/// `weir:maintenance/maintained-sink-plugin` world, in
/// `wit/maintenance/since_v0.1.0/`) with
/// `weir_sdk::export_positioned_sink!(MySink, maintenance);`.
///
/// The instance is created with `Default` on the host's first call. In a
/// native build (for tests) the macro only checks the type.
#[cfg(target_arch = "wasm32")]
#[macro_export]
macro_rules! export_positioned_sink {
    ($ty:ty, maintenance) => {
        $crate::__weir_positioned_sink!($ty, {
            impl $crate::__private::maintenance_export::exports::weir::maintenance::maintenance::Guest
                for __WeirSinkExport
            {
                fn maintain(
                    pipeline: ::std::string::String,
                    tables: ::std::vec::Vec<::std::string::String>,
                    what: ::std::vec::Vec<::std::string::String>,
                ) -> ::core::result::Result<::std::string::String, $crate::__private::WitSinkError>
                {
                    $crate::__private::maintain(&__WEIR_SINK, pipeline, tables, what)
                }
            }
            $crate::__private::maintenance_export::__export_maintenance!(
                __WeirSinkExport with_types_in $crate::__private::maintenance_export
            );
        });
    };
    ($ty:ty) => {
        $crate::__weir_positioned_sink!($ty, {});
    };
}

/// The body of `export_positioned_sink!`, with `$extra` exports that use
/// the same instance. Not part of the API.
#[cfg(target_arch = "wasm32")]
#[doc(hidden)]
#[macro_export]
macro_rules! __weir_positioned_sink {
    ($ty:ty, { $($extra:tt)* }) => {
        const _: () = {
            ::std::thread_local! {
                static __WEIR_SINK: ::core::cell::RefCell<::core::option::Option<$ty>> =
                    const { ::core::cell::RefCell::new(::core::option::Option::None) };
            }
            struct __WeirSinkExport;
            $crate::__weir_sink_guest!(
                __WeirSinkExport,
                __WEIR_SINK,
                $crate::__private::sink_plugin::exports::weir::sink::sink::Guest
            );
            impl $crate::__private::positions_export::exports::weir::sink::positions::Guest
                for __WeirSinkExport
            {
                fn committed(
                    pipeline: ::std::string::String,
                    table: ::std::string::String,
                ) -> ::core::result::Result<
                    ::core::option::Option<$crate::__private::WitCommittedPosition>,
                    $crate::__private::WitSinkError,
                > {
                    $crate::__private::committed(&__WEIR_SINK, pipeline, table)
                }
            }
            $crate::__private::sink_plugin::__export_sink_plugin!(
                __WeirSinkExport with_types_in $crate::__private::sink_plugin
            );
            $crate::__private::positions_export::__export_positions!(
                __WeirSinkExport with_types_in $crate::__private::positions_export
            );
            $($extra)*
        };
    };
}

/// Exports a [`Sink`] + [`Positions`] as the plugin's implementation of the
/// `positioned-sink-plugin` world (a sink with positions: exactly-once).
///
/// Call it once, at the top level of your `cdylib` crate, with a type that
/// implements [`Positions`] and `Default`:
///
/// ```ignore
/// weir_sdk::export_positioned_sink!(MySink);
/// ```
///
/// A sink that also implements [`Maintenance`] exports it too (the
/// `weir:maintenance/maintained-sink-plugin` world, in
/// `wit/maintenance/since_v0.1.0/`) with
/// `weir_sdk::export_positioned_sink!(MySink, maintenance);`.
///
/// The instance is created with `Default` on the host's first call. In a
/// native build (for tests) the macro only checks the type.
#[cfg(not(target_arch = "wasm32"))]
#[macro_export]
macro_rules! export_positioned_sink {
    ($ty:ty, maintenance) => {
        const _: fn() = || {
            fn exportable<S: $crate::Positions + $crate::Maintenance + ::core::default::Default>() {
            }
            exportable::<$ty>();
        };
    };
    ($ty:ty) => {
        const _: fn() = || {
            fn exportable<S: $crate::Positions + ::core::default::Default>() {}
            exportable::<$ty>();
        };
    };
}

/// Implements a world's `sink` guest trait by forwarding to the instance in
/// `$slot`. Not part of the API.
#[cfg(target_arch = "wasm32")]
#[doc(hidden)]
#[macro_export]
macro_rules! __weir_sink_guest {
    ($export:ident, $slot:ident, $guest:path) => {
        impl $guest for $export {
            fn open(
                pipeline: ::std::string::String,
                config: ::std::vec::Vec<(::std::string::String, ::std::string::String)>,
            ) -> ::core::result::Result<(), $crate::__private::WitSinkError> {
                $crate::__private::open(&$slot, pipeline, config)
            }

            fn write(
                batch: $crate::__private::WitBatch,
                ipc: ::std::vec::Vec<u8>,
            ) -> ::core::result::Result<(), $crate::__private::WitSinkError> {
                $crate::__private::write(&$slot, batch, ipc)
            }

            fn commit(
                request: $crate::__private::WitCommitRequest,
            ) -> ::core::result::Result<(), $crate::__private::WitSinkError> {
                $crate::__private::commit(&$slot, request)
            }

            fn abort(table: ::std::string::String) {
                $crate::__private::abort(&$slot, table)
            }
        }
    };
}
