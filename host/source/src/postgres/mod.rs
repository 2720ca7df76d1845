//! The Postgres source: a backfill of every published table, then the
//! logical replication stream (pgoutput), as transactions in commit order
//! (a big one in pieces as it arrives, so memory stays bounded).
//! docs/postgres.md explains the design: positions, snapshot consistency,
//! TOAST, DDL, big transactions, and why these crates.
//!
//! One phase per module: `setup` finds the tables and where to start,
//! `backfill` reads the tables in key order (`keys`), `stream` runs
//! the replication session, `decoder` turns its messages into changes
//! without I/O, and `toast` fills the values pgoutput leaves out.

mod backfill;
mod catalog;
mod config;
mod copy_binary;
pub mod decode;
mod decoder;
mod keys;
mod pgoutput;
mod reader;
mod session;
mod setup;
mod stream;
mod table;
mod toast;

use crate::commit_order::{StreamPosition, stream_position};
use std::sync::Arc;

pub use config::{PostgresConfig, PostgresSettings};
pub use decoder::PieceLimits;

use super::{Source, SourceError};
use crate::change::{TableSchema, Transaction};
use backfill::Backfill;
use reader::ReaderThread;
use session::{Patience, Session};
use setup::SchemaFile;
use stream::Stream;
use table::Tables;
use weir_core::position::Position;

/// The Postgres source (see the module documentation).
pub struct PostgresSource {
    // Dropped before the context, whose runtime their clients run on.
    backfill: Option<Backfill>,
    stream: Stream,
    cx: Context,
}

/// What every phase works with.
struct Context {
    config: PostgresConfig,
    session: Session,
    /// Where the replication client runs (dropped after it).
    reader: ReaderThread,
    tables: Tables,
    schema_file: SchemaFile,
    emitted: Emitted,
    /// See [`PostgresSettings::take_over_slot`].
    take_over_slot: bool,
}

/// The last position handed on (at first, the resume point): nothing at or
/// before it is emitted again, so the positions emitted only ever grow.
#[derive(Default)]
struct Emitted(Option<Position>);

impl Emitted {
    /// Whether `pos` lies at or before what was emitted.
    fn covers(&self, pos: &Position) -> bool {
        self.0.as_ref().is_some_and(|last| pos <= last)
    }

    /// [`Emitted::covers`] for the stream position (`lsn`, `ordinal`),
    /// without building it (this is asked for every streamed change).
    fn covers_stream(&self, lsn: u64, ordinal: u32) -> bool {
        match self.0.as_ref() {
            None => false,
            Some(last) => match last.as_stream() {
                Some(at) => (lsn, ordinal) <= at,
                // Backfill positions sort before every stream position.
                None => false,
            },
        }
    }

    fn advance(&mut self, pos: Position) {
        self.0 = Some(pos);
    }

    fn last(&self) -> Option<&Position> {
        self.0.as_ref()
    }
}

impl PostgresSource {
    /// Connects and reads the publication's tables, and checks them against
    /// the shapes the last run kept. Creates nothing: the slot and a
    /// missing publication are made by `resume_after`.
    pub fn open(settings: PostgresSettings) -> Result<PostgresSource, SourceError> {
        let PostgresSettings {
            config,
            append_tables,
            state_dir,
            io,
            take_over_slot,
            stop,
        } = settings;
        let mut session = Session::new(
            &config.dsn,
            config.reconnect_timeout(),
            io,
            Patience::new(stop),
        )?;
        let schema_file = SchemaFile::new(&state_dir, &config.slot);
        let recorded = schema_file.read();
        let mut tables = setup::load_tables(&mut session, &config, &append_tables, &recorded)?;
        schema_file.check(&recorded, &tables)?;
        schema_file.carry_present_since(&recorded, &mut tables);
        let reader = ReaderThread::start(reader::paces(session.dsn()))?;
        Ok(PostgresSource {
            backfill: None,
            stream: Stream::new(&config.publication),
            cx: Context {
                config,
                session,
                reader,
                tables,
                schema_file,
                emitted: Emitted::default(),
                take_over_slot,
            },
        })
    }

    /// Hands on a transaction bigger than `limits` in pieces as it arrives
    /// (default: the batcher's default limits). The pipeline passes its
    /// batch limits: a transaction that fits a batch stays whole.
    pub fn with_piece_limits(mut self, limits: PieceLimits) -> PostgresSource {
        self.stream.set_piece_limits(limits);
        self
    }
}

impl Source for PostgresSource {
    fn tables(&self) -> Vec<Arc<TableSchema>> {
        self.cx.tables.iter().map(|t| t.schema.clone()).collect()
    }

    fn resume_after(&mut self, after: Option<&Position>) -> Result<(), SourceError> {
        let mut start = setup::start(&mut self.cx, after)?;
        self.stream.prepare(&mut start);
        self.backfill = start.backfill;
        self.cx.schema_file.save(&self.cx.tables);
        Ok(())
    }

    fn next_transaction(&mut self) -> Result<Option<Transaction>, SourceError> {
        if let Some(backfill) = &mut self.backfill {
            if let Some(tx) = backfill.next_chunk(&mut self.cx)? {
                return Ok(Some(tx));
            }
            self.backfill = None;
            self.stream.start_gated(&self.cx);
        }
        self.stream.next(&mut self.cx)
    }

    fn head(&self) -> Option<Position> {
        None
    }

    /// Every change the server has logged lies at or before its current WAL
    /// insert position, so no commit can sit past it.
    fn ceiling(&mut self) -> Result<Option<Position>, SourceError> {
        let lsn = setup::current_wal_lsn(&mut self.cx.session)?;
        Ok(lsn.map(|lsn| stream_position(lsn, u32::MAX)))
    }

    fn acknowledge(&mut self, pos: &Position) -> Result<(), SourceError> {
        self.stream.acknowledge(pos);
        Ok(())
    }

    fn lag_bytes(&self) -> Option<u64> {
        self.stream.lag_bytes()
    }

    /// Everything committed before the slot's confirmed position is gone
    /// from the server: a sink must stand at least just before it.
    fn first_available(&mut self) -> Result<Option<Position>, SourceError> {
        let acked = setup::confirmed_flush(&mut self.cx)?;
        Ok(acked
            .filter(|&lsn| lsn > 0)
            .map(|lsn| stream_position(lsn - 1, u32::MAX)))
    }
}

impl Drop for PostgresSource {
    fn drop(&mut self) {
        self.stream.shutdown(&mut self.cx);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn covers_stream_answers_as_covers_does() {
        let mut emitted = Emitted::default();
        assert!(!emitted.covers_stream(5, 0));
        emitted.advance(Position::snapshot("public.t", b"k"));
        assert!(!emitted.covers_stream(0, 0));
        for last in [(10, 3), (10, u32::MAX), (11, 0)] {
            emitted.advance(stream_position(last.0, last.1));
            for lsn in [9, 10, 11, 12] {
                for ordinal in [0, 2, 3, 4, u32::MAX] {
                    assert_eq!(
                        emitted.covers_stream(lsn, ordinal),
                        emitted.covers(&stream_position(lsn, ordinal)),
                        "{last:?} against ({lsn}, {ordinal})"
                    );
                }
            }
        }
    }
}
