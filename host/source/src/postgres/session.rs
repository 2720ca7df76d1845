//! The source's ordinary (non-replication) connection, and the handle of
//! the runtime it runs on (the process's shared I/O runtime): catalog
//! reads, backfill `COPY`, TOAST look-ups, heartbeats. A lost connection
//! is reopened and the call retried until the reconnect timeout.

use std::future::Future;
use std::pin::Pin;
use std::str::FromStr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use backon::{BlockingRetryable, ConstantBuilder};
use tokio_postgres::Client;
use tokio_postgres::error::SqlState;

use super::catalog;
use super::decode::SESSION_SETTINGS;
use crate::SourceError;

/// Pause between attempts while the server is away.
const RETRY_DELAY: Duration = Duration::from_millis(500);

/// A query on a borrowed client, as [`Session::query`] runs it.
pub(super) type QueryFuture<'c, T> =
    Pin<Box<dyn Future<Output = Result<T, tokio_postgres::Error>> + 'c>>;

/// The runtime handle and the query connection (opened on first use).
pub(super) struct Session {
    rt: tokio::runtime::Handle,
    dsn: tokio_postgres::Config,
    /// Shared with a backfill reader streaming a `COPY` on another thread.
    client: Option<Arc<Client>>,
    /// How many connections were opened: a change tells that session state
    /// (an open transaction, an imported snapshot) was lost in between.
    connections: u64,
    reconnect_timeout: Duration,
    /// Whether a query waits (within `reconnect_timeout`) for a server
    /// that is away; see [`Session::without_waiting`].
    waits: bool,
}

impl Session {
    /// Parses the connection string; connects nothing yet.
    pub fn new(
        dsn: &str,
        reconnect_timeout: Duration,
        rt: tokio::runtime::Handle,
    ) -> Result<Session, SourceError> {
        let mut dsn = tokio_postgres::Config::from_str(dsn)
            .map_err(|e| SourceError::Config(format!("dsn: {e}")))?;
        dsn.options(session_options());
        dsn.application_name("weir");
        Ok(Session {
            rt,
            dsn,
            client: None,
            connections: 0,
            reconnect_timeout,
            waits: true,
        })
    }

    pub fn dsn(&self) -> &tokio_postgres::Config {
        &self.dsn
    }

    /// The number of the connection in use (0 before the first): a query
    /// that runs on another number than an earlier one ran on another session.
    pub fn connection_number(&self) -> u64 {
        self.connections
    }

    /// The runtime the query connection runs on.
    pub fn runtime(&self) -> &tokio::runtime::Handle {
        &self.rt
    }

    /// The query connection itself (opened, within the reconnect timeout,
    /// if it is not), for a caller that streams on it from another thread.
    /// Anything else sent on it waits until that caller's query is done.
    pub fn shared_client(&mut self, what: &str) -> Result<Arc<Client>, SourceError> {
        self.query(what, |_| Box::pin(async { Ok(()) }))?;
        Ok(self.client.clone().expect("connected"))
    }

    /// Whether the query connection is gone (or was never opened).
    pub fn is_closed(&self) -> bool {
        self.client.as_ref().is_none_or(|c| c.is_closed())
    }

    /// Runs `f` on the query connection, reconnecting (within the reconnect
    /// timeout) when the connection is lost or the server is restarting.
    pub fn query<T>(
        &mut self,
        what: &str,
        f: impl for<'c> Fn(&'c Client) -> QueryFuture<'c, T>,
    ) -> Result<T, SourceError> {
        if !self.waits {
            return self.attempt(what, &f);
        }
        let deadline = Instant::now() + self.reconnect_timeout;
        (|| self.attempt(what, &f))
            .retry(
                ConstantBuilder::new()
                    .with_delay(RETRY_DELAY)
                    .without_max_times(),
            )
            .when(|e| e.is_transient() && Instant::now() < deadline)
            .notify(|e, _| tracing::warn!("{e}; retrying"))
            .call()
    }

    /// Runs `f` with every query of it tried once: a server that is away
    /// fails it at once (transient) instead of being waited for. For the
    /// streaming phase, whose look-ups must not hold up the replication
    /// stream: a stopping server waits for that stream's last confirmation
    /// before it goes, so waiting for it here would wait for ourselves.
    pub fn without_waiting<R>(&mut self, f: impl FnOnce(&mut Session) -> R) -> R {
        let waits = std::mem::replace(&mut self.waits, false);
        let result = f(self);
        self.waits = waits;
        result
    }

    /// How long a query waits for a server that is away.
    pub fn reconnect_timeout(&self) -> Duration {
        self.reconnect_timeout
    }

    /// Runs statements that return nothing we need.
    pub fn execute(&mut self, what: &str, sql: &str) -> Result<(), SourceError> {
        self.query(what, |c| {
            let sql = sql.to_owned();
            Box::pin(async move { c.batch_execute(&sql).await })
        })
    }

    /// The rows of a query, as text.
    pub fn rows(&mut self, what: &str, sql: &str) -> Result<Vec<Vec<Option<String>>>, SourceError> {
        self.query(what, |c| {
            let sql = sql.to_owned();
            Box::pin(async move { catalog::rows(c, &sql).await })
        })
    }

    fn attempt<T>(
        &mut self,
        what: &str,
        f: &impl for<'c> Fn(&'c Client) -> QueryFuture<'c, T>,
    ) -> Result<T, SourceError> {
        self.connect()?;
        let client = self.client.as_ref().expect("connected");
        let result = self.rt.block_on(f(client));
        let closed = client.is_closed();
        let result = result.map_err(|e| classify(what, closed, &e));
        if result.as_ref().is_err_and(SourceError::is_transient) {
            // The next attempt opens a new connection.
            self.client = None;
        }
        result
    }

    fn connect(&mut self) -> Result<(), SourceError> {
        if self.client.as_ref().is_none_or(|c| c.is_closed()) {
            let dsn = self.dsn.clone();
            let client = self
                .rt
                .block_on(async move {
                    let (client, connection) = dsn.connect(tokio_postgres::NoTls).await?;
                    tokio::spawn(async move {
                        if let Err(e) = connection.await {
                            tracing::debug!("postgres query connection ended: {e}");
                        }
                    });
                    Ok::<_, tokio_postgres::Error>(client)
                })
                .map_err(|e| unavailable("cannot connect to Postgres", db_message(&e)))?;
            self.client = Some(Arc::new(client));
            self.connections += 1;
        }
        Ok(())
    }
}

/// Whether a failed query may succeed on a new connection: the connection
/// broke, or the server reported a connection problem (class 08) or that
/// it is stopping or starting (class 57, operator intervention).
pub(super) fn classify(
    what: &str,
    connection_closed: bool,
    e: &tokio_postgres::Error,
) -> SourceError {
    if connection_closed || e.as_db_error().is_none() {
        return unavailable(what, e);
    }
    match e.code() {
        Some(code) if is_connection_trouble(code) => unavailable(what, db_message(e)),
        _ => SourceError::Invalid(format!("{what}: {}", db_message(e))),
    }
}

/// SQLSTATE classes 08 (connection exception) and 57 (operator
/// intervention: shutdown, restart, cannot connect now).
pub(super) fn is_connection_trouble(code: &SqlState) -> bool {
    let class = &code.code()[..2];
    class == "08" || class == "57"
}

pub(super) fn unavailable(what: &str, e: impl std::fmt::Display) -> SourceError {
    SourceError::Unavailable(format!("{what}: {e}"))
}

fn db_message(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!("{} (SQLSTATE {})", db.message(), db.code().code()),
        None => e.to_string(),
    }
}

/// The `options` startup parameter that pins [`SESSION_SETTINGS`].
pub(super) fn session_options() -> String {
    SESSION_SETTINGS
        .iter()
        .map(|(k, v)| format!("-c {k}={v}"))
        .collect::<Vec<_>>()
        .join(" ")
}
