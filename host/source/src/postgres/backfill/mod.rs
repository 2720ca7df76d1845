//! The backfill: every table of the publication in name order, each in
//! key order, read by one streaming `COPY ... TO STDOUT` per table. A reader
//! thread decodes its rows straight into Arrow arrays and hands them on in
//! pieces through a bounded channel, so the server goes on sending while
//! the pipeline commits; every `chunk_rows` rows are one transaction for
//! the pipeline.
//!
//! Here: which table to read and from where, retries, and the slot's
//! snapshot. `reader` is the reader thread; `rows` writes the COPY and
//! decodes its lines into Arrow.

mod reader;
mod rows;

use std::io::IsTerminal;
use std::time::{Duration, Instant};

use super::Context;
use super::decode::literal;
use super::keys::decode_key_texts;
use super::setup::add_columns_seen_by_snapshot;
use super::table::Table;
use crate::SourceError;
use crate::change::{SnapshotRows, Transaction};
use reader::{Piece, Reader};
use rows::{CopyFormat, RowReader, copy_sql};
use weir_core::position::Position;

/// Pause before reading a table again after its connection was lost.
const RETRY_DELAY: Duration = Duration::from_millis(500);

/// Where the backfill stands.
pub(super) struct Backfill {
    /// Indexes of the tables still to read, in name order.
    queue: Vec<usize>,
    /// Within the first table of the queue: the key to read after.
    after_key: Option<Vec<String>>,
    /// The position of the last row the reader handed on, in the first
    /// table of the queue: where a read that lost its connection resumes.
    last_read: Option<Position>,
    /// The streaming read of the first table of the queue.
    reader: Option<Reader>,
    /// Set when a read failed in a way a new connection may get past:
    /// until when it is tried again.
    retry_until: Option<Instant>,
    /// The slot's exported snapshot, to read every table in.
    snapshot: Option<SlotSnapshot>,
    /// Whether the query session is inside the transaction that imported it.
    in_snapshot_tx: bool,
    /// The query connection that imported the snapshot: a read on any other
    /// would not see the database as of the slot's start.
    snapshot_connection: Option<u64>,
    /// Shows on a terminal only.
    show_progress: bool,
    bar: Option<indicatif::ProgressBar>,
}

/// The snapshot a slot exported when it was created.
pub(super) struct SlotSnapshot {
    pub name: String,
    /// The slot's consistent point: the snapshot sees every transaction
    /// committed before it, the slot streams every one committed after.
    pub consistent_point: u64,
}

impl Backfill {
    /// A backfill of tables `first..table_count` (all of them, or from
    /// where a previous run stopped: after `key` in table `first`), read in
    /// `snapshot` when there is one.
    pub fn new(
        table_count: usize,
        resume: Option<(usize, Vec<String>)>,
        snapshot: Option<SlotSnapshot>,
    ) -> Backfill {
        let (first, after_key) = match resume {
            Some((table, key)) => (table, Some(key)),
            None => (0, None),
        };
        Backfill {
            queue: (first..table_count).collect(),
            after_key,
            last_read: None,
            reader: None,
            retry_until: None,
            snapshot,
            in_snapshot_tx: false,
            snapshot_connection: None,
            show_progress: std::io::stderr().is_terminal(),
            bar: None,
        }
    }

    /// The next `chunk_rows` rows (fewer at a table's end) as one
    /// transaction; None once every table is read.
    pub fn next_chunk(&mut self, cx: &mut Context) -> Result<Option<Transaction>, SourceError> {
        let limit = cx.config.chunk_rows.max(1);
        let mut chunk: Vec<SnapshotRows> = Vec::new();
        loop {
            let Some(&t) = self.queue.first() else {
                self.finish(cx);
                return Ok(None);
            };
            if cx.tables[t].departed.is_some() {
                // No longer published, perhaps gone: the stream gives it
                // its last changes, there is nothing to read.
                self.queue.remove(0);
                (self.after_key, self.last_read) = (None, None);
                continue;
            }
            self.enter_snapshot(cx)?;
            self.show(&cx.tables[t]);
            if self.reader.is_none() {
                let in_chunk = chunk.iter().map(SnapshotRows::len).sum();
                self.reader = Some(self.start_reader(cx, t, in_chunk, limit)?);
            }
            let reader = self.reader.as_mut().expect("started above");
            match reader.next_piece() {
                Piece::Rows { rows, chunk_end } => {
                    self.retry_until = None;
                    if !rows.is_empty() {
                        self.last_read = Some(rows.position(rows.len() - 1));
                        chunk.push(rows);
                    }
                    if chunk_end {
                        self.check_still_in_snapshot(cx, &cx.tables[t])?;
                        return Ok(Some(self.hand_on(cx, chunk)));
                    }
                }
                Piece::End => {
                    self.reader = None;
                    self.check_still_in_snapshot(cx, &cx.tables[t])?;
                    self.table_done(&cx.tables[t]);
                    if !chunk.is_empty() {
                        return Ok(Some(self.hand_on(cx, chunk)));
                    }
                }
                Piece::Failed(e) => {
                    self.reader = None;
                    self.read_failed(cx, t, e)?;
                }
            }
        }
    }

    /// Starts the streaming read of table `t` after the last row read, on
    /// the query connection (in the snapshot's transaction when there is
    /// one); `in_chunk` rows of the current transaction are read already.
    fn start_reader(
        &mut self,
        cx: &mut Context,
        t: usize,
        in_chunk: usize,
        limit: usize,
    ) -> Result<Reader, SourceError> {
        let table = &cx.tables[t];
        if let Some(pos) = &self.last_read {
            let key = pos
                .as_snapshot()
                .and_then(|(_, key)| decode_key_texts(&table.key_orders(), key))
                .ok_or_else(|| {
                    SourceError::Invalid(format!(
                        "table {}: the backfill cannot read its own last position {pos} back",
                        table.info.qualified()
                    ))
                })?;
            self.after_key = Some(key);
        }
        let client = cx.session.shared_client("reading a table's backfill")?;
        let table = &cx.tables[t];
        self.check_still_in_snapshot(cx, table)?;
        let rows = RowReader::new(table);
        let sql = copy_sql(table, self.after_key.as_deref(), rows.format);
        let format = match rows.format {
            CopyFormat::Text => "text",
            CopyFormat::Binary => "binary",
        };
        tracing::debug!(table = %table.schema.name, "backfill reads the table in {format} COPY");
        Reader::start(
            client,
            sql,
            rows,
            in_chunk,
            limit,
            cx.session.runtime().clone(),
        )
    }

    /// A read that failed: the run stops, unless the failure was the
    /// connection and no snapshot is lost with it (then the table is read
    /// again after its last row read, within the reconnect timeout).
    fn read_failed(
        &mut self,
        cx: &mut Context,
        t: usize,
        e: SourceError,
    ) -> Result<(), SourceError> {
        if !e.is_transient() {
            return Err(e);
        }
        if self.snapshot.is_some() {
            return Err(lost_snapshot(&cx.tables[t], &e));
        }
        let until = *self
            .retry_until
            .get_or_insert_with(|| Instant::now() + cx.config.reconnect_timeout());
        if Instant::now() >= until {
            return Err(e);
        }
        tracing::warn!("{e}; reading the table again after its last row read");
        std::thread::sleep(RETRY_DELAY);
        Ok(())
    }

    /// The rows read as one transaction, ending at the last one.
    fn hand_on(&mut self, cx: &mut Context, reads: Vec<SnapshotRows>) -> Transaction {
        let last = reads.last().expect("a chunk has rows");
        let end = last.position(last.len() - 1);
        cx.emitted.advance(end.clone());
        let tx = Transaction::of_reads(reads, end);
        if let Some(bar) = &self.bar {
            bar.inc(tx.rows() as u64);
        }
        tx
    }

    /// Imports the slot's snapshot before the first read.
    fn enter_snapshot(&mut self, cx: &mut Context) -> Result<(), SourceError> {
        let Some(SlotSnapshot {
            name,
            consistent_point,
        }) = &self.snapshot
        else {
            return Ok(());
        };
        if self.in_snapshot_tx {
            return Ok(());
        }
        let sql = format!(
            "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY; SET TRANSACTION SNAPSHOT {}",
            literal(name)
        );
        cx.session.execute("importing the slot's snapshot", &sql)?;
        self.in_snapshot_tx = true;
        self.snapshot_connection = Some(cx.session.connection_number());
        tracing::info!(snapshot = %name, "backfill reads the slot's exported snapshot");
        // Tried once: read on another connection, the catalog would not be
        // the snapshot's, and the snapshot is lost with the connection
        // anyway (the first read notices and stops the run).
        let (session, tables) = (&mut cx.session, &mut cx.tables);
        let grew = session.without_waiting(|session| {
            add_columns_seen_by_snapshot(session, &cx.config, tables, *consistent_point)
        })?;
        if grew {
            cx.schema_file.save(&cx.tables);
        }
        Ok(())
    }

    /// A lost connection ends the transaction that held the snapshot, and
    /// the session reconnects on its own: rows read since come from the
    /// current data, not from the slot's start, so the run stops rather than
    /// mix the two. The next run resumes after the last committed chunk.
    fn check_still_in_snapshot(&self, cx: &Context, table: &Table) -> Result<(), SourceError> {
        match self.snapshot_connection {
            Some(n) if n != cx.session.connection_number() || cx.session.is_closed() => {
                Err(lost_snapshot(table, &"the connection was closed"))
            }
            _ => Ok(()),
        }
    }

    fn show(&mut self, table: &Table) {
        if self.bar.is_some() || !self.show_progress {
            return;
        }
        let estimate = table.info.estimated_rows;
        let bar = if estimate > 0.0 {
            indicatif::ProgressBar::new(estimate as u64)
        } else {
            indicatif::ProgressBar::new_spinner()
        };
        bar.set_style(
            indicatif::ProgressStyle::with_template(
                "backfill {msg} [{bar:30}] {pos}/~{len} rows ({per_sec})",
            )
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        bar.set_message(table.info.qualified());
        self.bar = Some(bar);
    }

    fn table_done(&mut self, table: &Table) {
        if let Some(bar) = self.bar.take() {
            bar.finish();
        }
        tracing::info!(table = %table.schema.name, "backfill of the table complete");
        self.queue.remove(0);
        self.after_key = None;
        self.last_read = None;
    }

    fn finish(&mut self, cx: &mut Context) {
        if self.in_snapshot_tx {
            // Only a read-only snapshot ends here; a failure loses nothing.
            let _ = cx.session.execute("ending the backfill snapshot", "COMMIT");
            self.in_snapshot_tx = false;
        }
        tracing::info!("backfill complete; streaming");
    }
}

fn lost_snapshot(table: &Table, cause: &dyn std::fmt::Display) -> SourceError {
    SourceError::Unavailable(format!(
        "the backfill of table {} lost the connection that held the slot's exported snapshot \
         ({cause}), so what it reads now would not be the database as of the slot's start; \
         stopping rather than go on outside the snapshot. Run again: the backfill resumes after \
         its last committed chunk",
        table.schema.name
    ))
}
