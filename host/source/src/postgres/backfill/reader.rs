//! One table's streaming read: a thread that runs the backfill's COPY
//! and hands its rows on in pieces through a bounded channel.

use std::sync::Arc;
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures::StreamExt;
use tokio_postgres::{CancelToken, Client};

use super::rows::{CopyFormat, RowReader};
use crate::SourceError;
use crate::change::SnapshotRows;
use crate::postgres::copy_binary::BinaryRows;
use crate::postgres::session::classify;
use crate::postgres::table::Table;

/// A piece of rows the reader hands on ends at this many bytes of COPY
/// text, or at [`PIECE_ROWS`] rows, or where a transaction ends.
const PIECE_BYTES: usize = 1 << 20;
const PIECE_ROWS: usize = 4096;
/// How many pieces the reader may be ahead of the pipeline: with
/// [`PIECE_BYTES`], what bounds the memory the read-ahead takes.
const PIECES_AHEAD: usize = 4;

/// What the reader hands on, in order.
pub(super) enum Piece {
    /// Rows in key order; `chunk_end`: the last row of a transaction.
    Rows { rows: SnapshotRows, chunk_end: bool },
    /// The table is read to its end.
    End,
    /// The read failed; nothing follows.
    Failed(SourceError),
}

/// One table's streaming read, on a thread of its own.
pub(super) struct Reader {
    /// Taken on drop, so that a reader waiting to hand on a piece stops.
    pieces: Option<Receiver<Piece>>,
    thread: Option<JoinHandle<()>>,
    /// Ends the query on the server when the read is dropped unfinished.
    cancel: CancelToken,
    rt: tokio::runtime::Handle,
    /// Whether the reader said its last word (End or Failed).
    finished: bool,
}

impl Reader {
    /// Starts the read of `rows`' table with `sql` (a `COPY ... TO
    /// STDOUT`) on `client`, whose runtime is `rt`; `in_chunk` rows of the
    /// current transaction of `limit` rows are read already.
    pub(super) fn start(
        client: Arc<Client>,
        sql: String,
        rows: RowReader,
        in_chunk: usize,
        limit: usize,
        rt: tokio::runtime::Handle,
    ) -> Result<Reader, SourceError> {
        let (pieces_in, pieces) = sync_channel(PIECES_AHEAD);
        let cancel = client.cancel_token();
        let thread_rt = rt.clone();
        let thread = std::thread::Builder::new()
            .name("weir-backfill".into())
            .spawn(move || {
                thread_rt.block_on(read_table(&client, &sql, rows, in_chunk, limit, &pieces_in))
            })?;
        Ok(Reader {
            pieces: Some(pieces),
            thread: Some(thread),
            cancel,
            rt,
            finished: false,
        })
    }

    pub(super) fn next_piece(&mut self) -> Piece {
        let piece = self
            .pieces
            .as_ref()
            .and_then(|pieces| pieces.recv().ok())
            .unwrap_or_else(|| {
                Piece::Failed(SourceError::Invalid(
                    "the backfill's reader thread ended without handing on its rows".into(),
                ))
            });
        self.finished = !matches!(piece, Piece::Rows { .. });
        piece
    }
}

impl Drop for Reader {
    fn drop(&mut self) {
        self.pieces = None;
        if self.finished {
            if let Some(thread) = self.thread.take() {
                let _ = thread.join();
            }
            return;
        }
        // Stopped mid-table (the run stops, or failed): the server would
        // otherwise send the rest of the table before the connection could
        // serve anything else. The thread ends on its own once the query does.
        let cancel = self.cancel.clone();
        let cancelled = self.rt.block_on(async move {
            tokio::time::timeout(
                Duration::from_secs(5),
                cancel.cancel_query(tokio_postgres::NoTls),
            )
            .await
        });
        if !matches!(cancelled, Ok(Ok(()))) {
            tracing::debug!("could not cancel the backfill's COPY; its connection ends it");
        }
    }
}

/// Reads one table with `sql` (a `COPY ... TO STDOUT`) and hands its rows
/// on in pieces, `in_chunk` rows into a transaction of `limit` rows.
async fn read_table(
    client: &Client,
    sql: &str,
    mut rows: RowReader,
    mut in_chunk: usize,
    limit: usize,
    out: &SyncSender<Piece>,
) {
    let what = format!("reading the backfill of table {}", rows.table.schema.name);
    let read = async {
        let fail = |e: tokio_postgres::Error| classify(&what, client.is_closed(), &e);
        let stream = client.copy_out(sql).await.map_err(fail)?;
        let mut stream = std::pin::pin!(stream);
        let commit_ts = now_micros();
        let mut bytes = 0;
        // After each row: hands on the piece when it is due; false when the
        // backfill stopped reading (so does this thread).
        let mut row_read = |rows: &mut RowReader, bytes: &mut usize| {
            in_chunk += 1;
            let chunk_end = in_chunk >= limit;
            if chunk_end || *bytes >= PIECE_BYTES || rows.len() >= PIECE_ROWS {
                let rows = rows.take(commit_ts);
                if out.send(Piece::Rows { rows, chunk_end }).is_err() {
                    return false;
                }
                if chunk_end {
                    in_chunk = 0;
                }
                *bytes = 0;
            }
            true
        };
        let mut binary = (rows.format == CopyFormat::Binary).then(BinaryRows::default);
        let malformed = |table: &Table, e: String| {
            SourceError::Invalid(format!(
                "table {}: the backfill's binary COPY: {e}",
                table.info.qualified()
            ))
        };
        while let Some(data) = stream.next().await {
            let data = data.map_err(fail)?;
            bytes += data.len();
            let Some(binary) = &mut binary else {
                // Text: the server sends a line per message.
                rows.read(&data)?;
                if !row_read(&mut rows, &mut bytes) {
                    return Ok(false);
                }
                continue;
            };
            binary.push(data);
            while let Some(fields) = binary.next_row().map_err(|e| malformed(&rows.table, e))? {
                rows.read_binary(&fields)?;
                if !row_read(&mut rows, &mut bytes) {
                    return Ok(false);
                }
            }
        }
        if let Some(binary) = &binary {
            binary.finish().map_err(|e| malformed(&rows.table, e))?;
        }
        if rows.len() > 0 {
            let rows = Piece::Rows {
                rows: rows.take(commit_ts),
                chunk_end: false,
            };
            if out.send(rows).is_err() {
                return Ok(false);
            }
        }
        Ok::<bool, SourceError>(true)
    };
    let last = match read.await {
        Ok(true) => Piece::End,
        Ok(false) => return,
        Err(e) => Piece::Failed(e),
    };
    let _ = out.send(last);
}

fn now_micros() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as i64)
}
