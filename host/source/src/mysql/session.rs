//! The source's query connection: statements on the process's I/O runtime,
//! driven from the pipeline's thread, each given up on when the run is
//! asked to stop; and the server's errors turned into [`SourceError`]s.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use mysql_async::prelude::*;
use mysql_async::{Conn, Opts, Row};

use super::flavor::Flavor;
use crate::SourceError;

const STOP_POLL: Duration = Duration::from_millis(100);

pub(super) struct Session {
    /// The kind of server, once the settings were read.
    pub flavor: Flavor,
    io: tokio::runtime::Handle,
    opts: Opts,
    conn: Option<Conn>,
    stop: Arc<AtomicBool>,
}

impl Session {
    pub fn new(io: tokio::runtime::Handle, opts: Opts, stop: Arc<AtomicBool>) -> Session {
        Session {
            flavor: Flavor::MariaDb,
            io,
            opts,
            conn: None,
            stop,
        }
    }

    pub fn io(&self) -> &tokio::runtime::Handle {
        &self.io
    }

    pub fn opts(&self) -> &Opts {
        &self.opts
    }

    pub fn stop_flag(&self) -> Arc<AtomicBool> {
        self.stop.clone()
    }

    /// Runs `work` on the runtime until it ends or the run is asked to stop.
    pub fn block_on<T>(&self, work: impl Future<Output = T>) -> Result<T, SourceError> {
        run(&self.io, &self.stop, work)
            .ok_or_else(|| SourceError::Unavailable("the run was asked to stop".into()))
    }

    /// The open connection (a new one if there is none).
    pub fn conn(&mut self) -> Result<&mut Conn, SourceError> {
        if self.conn.is_none() {
            let opts = self.opts.clone();
            let conn = self.block_on(async move {
                let mut conn = Conn::new(opts).await?;
                // Values of TIMESTAMP columns are read in UTC, text in
                // UTF-8. A backfill reads a table as one result, which waits
                // in the server's send while the sinks commit: the server
                // gives up on a client that reads nothing for
                // net_write_timeout (60 s by default), here ten minutes.
                conn.query_drop("SET time_zone = '+00:00', NAMES utf8mb4, net_write_timeout = 600")
                    .await?;
                Ok::<_, mysql_async::Error>(conn)
            })?;
            self.conn = Some(conn.map_err(|e| server_error("connecting", e))?);
        }
        Ok(self.conn.as_mut().expect("connected above"))
    }

    /// Every row of `sql`, or the server's error named by `what`.
    pub fn rows<T: FromRow + Send + 'static>(
        &mut self,
        what: &str,
        sql: &str,
    ) -> Result<Vec<T>, SourceError> {
        let sql = sql.to_string();
        let (io, stop) = (self.io.clone(), self.stop.clone());
        let conn = self.conn()?;
        let result = run(&io, &stop, conn.query::<T, _>(sql));
        self.settle(what, result)
    }

    /// Rows of a prepared statement with `params`.
    pub fn exec<T: FromRow + Send + 'static>(
        &mut self,
        what: &str,
        sql: &str,
        params: Vec<mysql_async::Value>,
    ) -> Result<Vec<T>, SourceError> {
        let sql = sql.to_string();
        let (io, stop) = (self.io.clone(), self.stop.clone());
        let conn = self.conn()?;
        let result = run(&io, &stop, conn.exec::<T, _, _>(sql, params));
        self.settle(what, result)
    }

    /// Reads the rows of a prepared statement with `params` on the
    /// runtime, `chunk` rows at a time and up to [`ROWS_AHEAD`] chunks
    /// ahead, with the connection moved into the reading task: the server
    /// sends and the task parses while the pipeline's thread converts.
    /// [`Session::next_rows`] takes the chunks; once they are all taken the
    /// connection is back in the session. Meanwhile the session has no
    /// connection of its own (a statement in between would open another,
    /// outside this one's transaction).
    pub fn stream_rows(
        &mut self,
        what: &str,
        sql: String,
        params: Vec<mysql_async::Value>,
        chunk: usize,
    ) -> Result<RowStream, SourceError> {
        self.conn()?;
        let mut conn = self.conn.take().expect("connected above");
        let chunk = chunk.max(1);
        let (tx, rx) = tokio::sync::mpsc::channel(ROWS_AHEAD);
        let task = self.io.spawn(async move {
            let read = async {
                let mut result = conn.exec_iter(sql, params).await?;
                let mut rows = Vec::with_capacity(chunk);
                while let Some(row) = result.next().await? {
                    rows.push(row);
                    if rows.len() == chunk {
                        let full = std::mem::replace(&mut rows, Vec::with_capacity(chunk));
                        if tx.send(Ok(full)).await.is_err() {
                            return Ok(false);
                        }
                    }
                }
                if !rows.is_empty() && tx.send(Ok(rows)).await.is_err() {
                    return Ok(false);
                }
                Ok::<_, mysql_async::Error>(true)
            };
            match read.await {
                Ok(true) => Some(conn),
                // Nobody reads on: the rest of the result stays unread,
                // and the connection cannot be used again.
                Ok(false) => None,
                Err(e) => {
                    let _ = tx.send(Err(e)).await;
                    None
                }
            }
        });
        Ok(RowStream {
            what: what.to_string(),
            rx,
            task,
        })
    }

    /// The next chunk of `stream`'s rows, or None once they are all read
    /// (and the connection is back in the session).
    pub fn next_rows(&mut self, stream: &mut RowStream) -> Result<Option<Vec<Row>>, SourceError> {
        let (io, stop) = (self.io.clone(), self.stop.clone());
        // Ready chunks are taken without a trip through the runtime.
        let next = match stream.rx.try_recv() {
            Ok(chunk) => Some(Some(chunk)),
            Err(tokio::sync::mpsc::error::TryRecvError::Disconnected) => Some(None),
            Err(tokio::sync::mpsc::error::TryRecvError::Empty) => run(&io, &stop, stream.rx.recv()),
        };
        match next {
            Some(Some(Ok(rows))) => Ok(Some(rows)),
            Some(Some(Err(e))) => self.settle(&stream.what, Some(Err(e))),
            Some(None) => match run(&io, &stop, &mut stream.task) {
                Some(Ok(Some(conn))) => {
                    self.conn = Some(conn);
                    Ok(None)
                }
                Some(_) => {
                    self.conn = None;
                    Err(SourceError::Unavailable(format!(
                        "{}: the reading task ended early",
                        stream.what
                    )))
                }
                None => self.settle(&stream.what, None),
            },
            None => self.settle(&stream.what, None),
        }
    }

    /// Runs statements whose results do not matter.
    pub fn run(&mut self, what: &str, sql: &str) -> Result<(), SourceError> {
        let sql = sql.to_string();
        let (io, stop) = (self.io.clone(), self.stop.clone());
        let conn = self.conn()?;
        let result = run(&io, &stop, conn.query_drop(sql));
        self.settle(what, result)
    }

    fn settle<T>(
        &mut self,
        what: &str,
        result: Option<Result<T, mysql_async::Error>>,
    ) -> Result<T, SourceError> {
        match result {
            Some(Ok(value)) => Ok(value),
            Some(Err(e)) => {
                // A connection that failed a statement is not trusted again.
                if !matches!(e, mysql_async::Error::Server(_)) {
                    self.conn = None;
                }
                Err(server_error(what, e))
            }
            None => {
                self.conn = None;
                Err(SourceError::Unavailable(format!(
                    "{what}: the run was asked to stop"
                )))
            }
        }
    }

    /// Drops the connection (ending any transaction on it).
    pub fn reset(&mut self) {
        self.conn = None;
    }
}

/// Chunks of rows read ahead of the pipeline by [`Session::stream_rows`]:
/// enough to keep the server and the parsing busy while a chunk is
/// converted, few enough to bound memory by `chunk_rows`.
const ROWS_AHEAD: usize = 2;

/// A statement's rows, read on the runtime with the session's connection;
/// dropped unfinished, the statement and its connection end.
pub(super) struct RowStream {
    what: String,
    rx: tokio::sync::mpsc::Receiver<Result<Vec<Row>, mysql_async::Error>>,
    task: tokio::task::JoinHandle<Option<Conn>>,
}

impl Drop for RowStream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn run<T>(
    io: &tokio::runtime::Handle,
    stop: &AtomicBool,
    work: impl Future<Output = T>,
) -> Option<T> {
    io.block_on(async {
        let asked = async {
            while !stop.load(Ordering::Relaxed) {
                tokio::time::sleep(STOP_POLL).await;
            }
        };
        tokio::select! {
            done = work => Some(done),
            () = asked => None,
        }
    })
}

/// The server's error code, for the checks that tell a missing privilege
/// from other failures.
pub(super) fn error_code(error: &SourceError) -> Option<u16> {
    match error {
        SourceError::Config(text) | SourceError::Invalid(text) | SourceError::Unavailable(text) => {
            let (_, rest) = text.split_once("(server error ")?;
            rest.split(')').next()?.parse().ok()
        }
        _ => None,
    }
}

/// A server or connection error while doing `what`: a server's refusal is
/// a configuration problem (privileges, a missing table), anything else
/// may pass.
pub(super) fn server_error(what: &str, error: mysql_async::Error) -> SourceError {
    match error {
        mysql_async::Error::Server(e) => {
            SourceError::Config(format!("{what}: {} (server error {})", e.message, e.code))
        }
        other => SourceError::Unavailable(format!("{what}: {other}")),
    }
}
