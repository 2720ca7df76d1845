//! The MySQL/MariaDB source: a backfill of every table read, in one
//! consistent snapshot, then the binlog from that snapshot's coordinates,
//! as whole transactions in commit order (a big one in pieces as it
//! arrives, so memory stays bounded). docs/mysql.md explains the design:
//! server settings, positions, the backfill's snapshot, and the stops.
//!
//! One phase per module: `setup` checks the server and finds the tables,
//! `backfill` reads them in key order, `stream` reads the binlog, `types`
//! turns the server's values into the pipeline's, and `position` lays out
//! where each change sits.

mod backfill;
mod config;
mod flavor;
mod position;
mod row_image;
mod schema_file;
mod session;
mod setup;
mod stream;
mod types;

use std::path::PathBuf;
use std::sync::Arc;

pub use config::{MysqlConfig, MysqlSettings};
pub use position::describe;

use super::{Source, SourceError};
use crate::change::{TableSchema, Transaction};
use crate::postgres::PieceLimits;
use backfill::Backfill;
use position::{BackfillPlace, BinlogCoord};
use schema_file::SchemaFile;
use session::Session;
use setup::Table;
use stream::Stream;
use weir_core::position::Position;

/// The MySQL/MariaDB source (see the module documentation).
pub struct MysqlSource {
    config: MysqlConfig,
    /// Where the first backfill's stream starts, kept for later runs.
    start_file: StartFile,
    /// The tables' shapes, kept for later runs.
    schema_file: SchemaFile,
    session: Session,
    tables: Vec<Table>,
    backfill: Option<Backfill>,
    stream: Option<Stream>,
    /// The last position handed on (at first, the resume point).
    emitted: Option<Position>,
    limits: PieceLimits,
}

impl MysqlSource {
    /// Connects, checks the server's settings and the user's privileges,
    /// and reads the tables' columns and keys.
    pub fn open(settings: MysqlSettings) -> Result<MysqlSource, SourceError> {
        let MysqlSettings {
            config,
            pipeline,
            append_tables,
            state_dir,
            io,
            stop,
        } = settings;
        let mut session = Session::new(io, config.opts(), stop);
        setup::check_server(&mut session)?;
        setup::check_privileges(&mut session)?;
        let tables = setup::load_tables(&mut session, &config, &append_tables)?;
        let schema_file = SchemaFile::new(&state_dir, &pipeline);
        schema_file.check(tables.iter().map(Table::shape))?;
        let start_file = StartFile(state_dir.join(format!("mysql-{pipeline}-stream-start.json")));
        Ok(MysqlSource {
            schema_file,
            start_file,
            config,
            session,
            tables,
            backfill: None,
            stream: None,
            emitted: None,
            limits: PieceLimits::default(),
        })
    }

    /// Hands on a transaction bigger than `limits` in pieces as it arrives.
    pub fn with_piece_limits(mut self, limits: PieceLimits) -> MysqlSource {
        self.limits = limits;
        self
    }

    fn index_of(&self, name: &str) -> Option<usize> {
        self.tables.iter().position(|t| t.name == name)
    }
}

/// The stream's start of the pipeline's first backfill, in its state
/// folder: written before that backfill hands on a row, read by every later
/// run that backfills again.
struct StartFile(PathBuf);

impl StartFile {
    fn read(&self) -> Result<Option<BinlogCoord>, SourceError> {
        let text = match std::fs::read_to_string(&self.0) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        let bad = || {
            SourceError::Config(format!(
                "{} is not a binlog coordinate: remove it only together with the sinks' data",
                self.0.display()
            ))
        };
        let value: serde_json::Value = serde_json::from_str(&text).map_err(|_| bad())?;
        let number = |field: &str| {
            value[field]
                .as_u64()
                .and_then(|n| u32::try_from(n).ok())
                .ok_or_else(bad)
        };
        Ok(Some(BinlogCoord {
            file: number("file")?,
            offset: number("offset")?,
        }))
    }

    fn write(&self, at: BinlogCoord) -> Result<(), SourceError> {
        let text = serde_json::json!({"file": at.file, "offset": at.offset}).to_string();
        replace_durably(&self.0, text.as_bytes())
    }
}

/// Replaces the file at `path` with `bytes` in one step (a new file synced,
/// renamed over the old one, the folder synced): a crash leaves the old
/// contents or the new, never part of either.
fn replace_durably(path: &std::path::Path, bytes: &[u8]) -> Result<(), SourceError> {
    let dir = path.parent().unwrap_or(std::path::Path::new("."));
    std::fs::create_dir_all(dir)?;
    let temporary = path.with_extension("json.tmp");
    let mut file = std::fs::File::create(&temporary)?;
    std::io::Write::write_all(&mut file, bytes)?;
    file.sync_all()?;
    std::fs::rename(&temporary, path)?;
    std::fs::File::open(dir)?.sync_all()?;
    Ok(())
}

impl Source for MysqlSource {
    fn tables(&self) -> Vec<Arc<TableSchema>> {
        self.tables.iter().map(|t| t.schema.clone()).collect()
    }

    fn resume_after(&mut self, after: Option<&Position>) -> Result<(), SourceError> {
        let chunk_rows = self.config.chunk_rows;
        let from = match after {
            None => {
                // A table without a committed position (a first run, or a
                // table added since) backfills everything again; what
                // earlier runs committed is dropped by position, and the
                // stream replays from the first backfill's snapshot.
                let earlier = self.start_file.read()?;
                let backfill =
                    Backfill::fresh(self.tables.len(), chunk_rows, earlier, &mut self.session)?;
                let from = backfill.stream_from;
                if earlier.is_none() {
                    self.start_file.write(from)?;
                }
                self.backfill = Some(backfill);
                from
            }
            Some(position) if position.is_snapshot() => {
                let (table, place) =
                    BackfillPlace::of(position).ok_or_else(|| SourceError::Resume {
                        position: position.clone(),
                        reason: "it is not a backfill position of the MySQL source".into(),
                    })?;
                let first = self.index_of(&table).ok_or_else(|| SourceError::Resume {
                    position: position.clone(),
                    reason: format!(
                        "the backfill stopped in table {table}, which is no longer one of the \
                         tables read: put it back in source.mysql.tables until the backfill is \
                         done, or start over under a new pipeline id"
                    ),
                })?;
                let from = place.stream_from;
                self.backfill = Some(Backfill::resumed(
                    self.tables.len(),
                    first,
                    place,
                    chunk_rows,
                ));
                from
            }
            Some(position) => {
                let (coord, _) = BinlogCoord::of(position).ok_or_else(|| SourceError::Resume {
                    position: position.clone(),
                    reason: "it is not a binlog position of the MySQL source".into(),
                })?;
                coord
            }
        };
        // A stream that could not start where it must is a stop now, not
        // after the backfill.
        setup::file_of(&mut self.session, from)?;
        self.emitted = after.cloned();
        let catch_up = if self.config.exit_when_caught_up {
            Some(setup::current_position(&mut self.session)?)
        } else {
            None
        };
        self.schema_file
            .save(self.tables.iter().map(Table::shape))?;
        self.stream = Some(Stream::new(
            self.schema_file.clone(),
            &self.tables,
            from,
            catch_up,
            &self.config,
            self.limits,
        ));
        Ok(())
    }

    fn next_transaction(&mut self) -> Result<Option<Transaction>, SourceError> {
        if let Some(backfill) = &mut self.backfill {
            if let Some(tx) = backfill.next_chunk(&self.tables, &mut self.session)? {
                self.emitted = Some(tx.end.clone());
                return Ok(Some(tx));
            }
            self.backfill = None;
        }
        let stream = self.stream.as_mut().ok_or_else(|| {
            SourceError::Config("the MySQL source was read before resume_after".into())
        })?;
        stream.next(&mut self.session, &mut self.emitted)
    }

    fn head(&self) -> Option<Position> {
        None
    }

    /// Every change the server has logged lies before the end of its binlog.
    fn ceiling(&mut self) -> Result<Option<Position>, SourceError> {
        Ok(Some(
            setup::current_position(&mut self.session)?.position(0),
        ))
    }

    /// The server keeps its binlog by age, not by what replicas confirmed:
    /// there is nothing to release.
    fn acknowledge(&mut self, _pos: &Position) -> Result<(), SourceError> {
        Ok(())
    }
}
