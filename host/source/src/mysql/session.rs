//! The source's query connection: statements on the process's I/O runtime,
//! driven from the pipeline's thread, each given up on when the run is
//! asked to stop; and the server's errors turned into [`SourceError`]s.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use mysql_async::prelude::*;
use mysql_async::{Conn, Opts};

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
                // Values of TIMESTAMP columns are read in UTC, text in UTF-8.
                conn.query_drop("SET time_zone = '+00:00', NAMES utf8mb4")
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

    /// Starts a prepared statement with `params` on the runtime, with the
    /// connection moved into it, so that the pipeline's thread can work on
    /// meanwhile; [`Session::finish`] takes its rows and gives the
    /// connection back. Until then the session has no connection of its
    /// own (a statement in between would open another, outside any
    /// transaction of this one).
    pub fn start_exec<T: FromRow + Send + 'static>(
        &mut self,
        what: &str,
        sql: String,
        params: Vec<mysql_async::Value>,
    ) -> Result<Pending<T>, SourceError> {
        self.conn()?;
        let mut conn = self.conn.take().expect("connected above");
        let task = self.io.spawn(async move {
            let result = conn.exec::<T, _, _>(sql, params).await;
            (conn, result)
        });
        Ok(Pending {
            what: what.to_string(),
            task,
        })
    }

    /// The rows of a statement [`Session::start_exec`] started, once it
    /// ends, with its connection back in the session.
    pub fn finish<T: Send + 'static>(
        &mut self,
        mut pending: Pending<T>,
    ) -> Result<Vec<T>, SourceError> {
        let (io, stop) = (self.io.clone(), self.stop.clone());
        match run(&io, &stop, &mut pending.task) {
            Some(Ok((conn, result))) => {
                self.conn = Some(conn);
                self.settle(&pending.what, Some(result))
            }
            Some(Err(e)) => {
                self.conn = None;
                Err(SourceError::Unavailable(format!("{}: {e}", pending.what)))
            }
            None => self.settle(&pending.what, None),
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

/// A statement running on the runtime with the session's connection;
/// dropped unfinished, the statement and its connection end.
pub(super) struct Pending<T> {
    what: String,
    #[allow(clippy::type_complexity)]
    task: tokio::task::JoinHandle<(Conn, Result<Vec<T>, mysql_async::Error>)>,
}

impl<T> Drop for Pending<T> {
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
