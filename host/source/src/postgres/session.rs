//! The source's ordinary (non-replication) connection, and the handle of
//! the runtime it runs on (the process's shared I/O runtime): catalog
//! reads, backfill `COPY`, TOAST look-ups, heartbeats. A lost connection
//! is reopened and the call retried until the reconnect timeout, or until
//! the run is asked to stop.

use std::error::Error as _;
use std::future::Future;
use std::pin::Pin;
use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use backon::{BlockingRetryable, ExponentialBuilder};
use tokio_postgres::Client;
use tokio_postgres::config::Host;
use tokio_postgres::error::SqlState;

use super::catalog;
use super::decode::SESSION_SETTINGS;
use crate::SourceError;

/// The first pause between attempts while the server is away; each
/// pause after it doubles, up to [`MAX_RETRY_DELAY`].
const RETRY_DELAY: Duration = Duration::from_millis(500);
/// The longest pause between attempts: a server back is seen within it,
/// and a long outage logs a line every few seconds, not twice a second.
const MAX_RETRY_DELAY: Duration = Duration::from_secs(5);
/// How often a pause looks whether the run was asked to stop.
const STOP_POLL: Duration = Duration::from_millis(50);
/// How long one attempt to open a connection may take when the
/// connection string sets no `connect_timeout`: an address that drops
/// packets would otherwise hold an attempt for the kernel's minutes.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// How the source waits for a server that is away: pauses growing from
/// half a second to a few seconds, each cut short when the run is asked
/// to stop (`stop`, which the signal handler or the supervisor sets).
#[derive(Clone)]
pub(super) struct Patience {
    stop: Arc<AtomicBool>,
}

impl Patience {
    pub fn new(stop: Arc<AtomicBool>) -> Patience {
        Patience { stop }
    }

    pub fn stopped(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }

    fn backoff(&self) -> ExponentialBuilder {
        ExponentialBuilder::new()
            .with_min_delay(RETRY_DELAY)
            .with_max_delay(MAX_RETRY_DELAY)
            .with_factor(2.0)
            .without_max_times()
    }

    /// Calls `attempt` until it succeeds, fails in a way `may_clear` says
    /// waiting will not fix, `deadline` passes, or the run is asked to stop.
    /// Each failure is logged as `say` puts it, with when the next attempt
    /// comes; the error a wait ended with says why it ended
    /// ([`Patience::gave_up`]).
    pub fn retry<T, E>(
        &self,
        deadline: Instant,
        attempt: impl FnMut() -> Result<T, E>,
        may_clear: impl Fn(&E) -> bool,
        say: impl Fn(&E) -> String,
    ) -> Result<T, E> {
        attempt
            .retry(self.backoff())
            .sleep(self.sleeper(deadline))
            .when(|e| may_clear(e) && Instant::now() < deadline && !self.stopped())
            .notify(|e, pause| {
                let left = deadline.saturating_duration_since(Instant::now());
                tracing::warn!(
                    "{}; trying again in {:.1} s (giving up in {:.1} s)",
                    say(e),
                    pause.min(left).as_secs_f64(),
                    left.as_secs_f64()
                )
            })
            .call()
    }

    /// A sleep that ends early once the run is asked to stop, and never
    /// runs past `deadline`: the last attempt is made at the deadline, not
    /// a whole pause after it.
    fn sleeper(&self, deadline: Instant) -> impl Fn(Duration) + 'static {
        let stop = self.stop.clone();
        move |pause: Duration| {
            let until = (Instant::now() + pause).min(deadline);
            while !stop.load(Ordering::Relaxed) {
                let left = until.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    break;
                }
                std::thread::sleep(left.min(STOP_POLL));
            }
        }
    }

    /// Runs `work` on `rt` until it ends or the run is asked to stop
    /// (None): a connection attempt under way does not hold a stop.
    pub fn until_stopped<T>(
        &self,
        rt: &tokio::runtime::Handle,
        work: impl Future<Output = T>,
    ) -> Option<T> {
        let stop = self.stop.clone();
        rt.block_on(async move {
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

    /// The error a wait ended with, saying so when it ended because the
    /// run was asked to stop rather than because the timeout passed.
    pub fn gave_up(&self, error: SourceError) -> SourceError {
        match error {
            SourceError::Unavailable(message) if self.stopped() => SourceError::Unavailable(
                format!("{message}; stopped waiting: the run was asked to stop"),
            ),
            other => other,
        }
    }
}

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
    patience: Patience,
}

impl Session {
    /// Parses the connection string; connects nothing yet.
    pub fn new(
        dsn: &str,
        reconnect_timeout: Duration,
        rt: tokio::runtime::Handle,
        patience: Patience,
    ) -> Result<Session, SourceError> {
        let mut dsn = tokio_postgres::Config::from_str(dsn)
            .map_err(|e| SourceError::Config(format!("dsn: {e}")))?;
        dsn.options(session_options());
        dsn.application_name("weir");
        if dsn.get_connect_timeout().is_none() {
            dsn.connect_timeout(CONNECT_TIMEOUT);
        }
        Ok(Session {
            rt,
            dsn,
            client: None,
            connections: 0,
            reconnect_timeout,
            waits: true,
            patience,
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
        let patience = self.patience.clone();
        patience
            .retry(
                deadline,
                || self.attempt(what, &f),
                SourceError::is_transient,
                SourceError::to_string,
            )
            .map_err(|e| patience.gave_up(e))
    }

    /// How the source waits for a server that is away.
    pub fn patience(&self) -> &Patience {
        &self.patience
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
            let connecting = async move {
                let (client, connection) = dsn.connect(tokio_postgres::NoTls).await?;
                tokio::spawn(async move {
                    if let Err(e) = connection.await {
                        tracing::debug!("postgres query connection ended: {e}");
                    }
                });
                Ok::<_, tokio_postgres::Error>(client)
            };
            let client = match self.patience.until_stopped(&self.rt, connecting) {
                None => {
                    return Err(unavailable(
                        &format!("cannot connect to Postgres at {}", targets(&self.dsn)),
                        "the attempt was cut short",
                    ));
                }
                Some(connected) => connected.map_err(|e| connect_failure(&self.dsn, &e))?,
            };
            self.client = Some(Arc::new(client));
            self.connections += 1;
        }
        Ok(())
    }
}

/// Where a connection string points, as an operator would write it:
/// `host:port` for each host it names, a socket folder for a Unix socket.
pub(super) fn targets(dsn: &tokio_postgres::Config) -> String {
    let ports = dsn.get_ports();
    let port = |i: usize| ports.get(i).or(ports.first()).copied().unwrap_or(5432);
    let named: Vec<String> = dsn
        .get_hosts()
        .iter()
        .enumerate()
        .map(|(i, host)| match host {
            Host::Tcp(name) if name.contains(':') => format!("[{name}]:{}", port(i)),
            Host::Tcp(name) => format!("{name}:{}", port(i)),
            Host::Unix(folder) => format!("the socket in {} (port {})", folder.display(), port(i)),
        })
        .collect();
    match named.as_slice() {
        [] => format!("localhost:{}", port(0)),
        _ => named.join(", "),
    }
}

/// One sentence on a connection that could not be opened: where to and
/// why, in the words an operator acts on. Refused, timed out and a server
/// starting or stopping may clear by waiting ([`SourceError::Unavailable`]);
/// an unknown user, a refused password or a missing database will not, and
/// end the run at once ([`SourceError::Config`]).
pub(super) fn connect_failure(
    dsn: &tokio_postgres::Config,
    e: &tokio_postgres::Error,
) -> SourceError {
    let at = format!("cannot connect to Postgres at {}", targets(dsn));
    let user = dsn.get_user().unwrap_or("(no user given)");
    if let Some(db) = e.as_db_error() {
        let code = db.code();
        let said = format!("{} (SQLSTATE {})", db.message(), code.code());
        if code == &SqlState::INVALID_PASSWORD
            || code == &SqlState::INVALID_AUTHORIZATION_SPECIFICATION
        {
            return SourceError::Config(format!(
                "{at}: authentication failed for user `{user}`: {said}"
            ));
        }
        if code == &SqlState::INVALID_CATALOG_NAME {
            let database = dsn.get_dbname().unwrap_or(user);
            return SourceError::Config(format!(
                "{at}: database `{database}` does not exist: {said}"
            ));
        }
        if is_connection_trouble(code) {
            return unavailable(&at, said);
        }
        return SourceError::Config(format!("{at}: {said}"));
    }
    let mut io = None;
    let mut next = e.source();
    while let Some(inner) = next {
        if let Some(found) = inner.downcast_ref::<std::io::Error>() {
            io = Some(found);
            break;
        }
        next = inner.source();
    }
    let cause = match io.map(std::io::Error::kind) {
        Some(std::io::ErrorKind::ConnectionRefused) => {
            "connection refused (no server listens there: is it running, and on that address and port?)"
                .to_string()
        }
        Some(std::io::ErrorKind::TimedOut) => "timed out".to_string(),
        Some(std::io::ErrorKind::NotFound) => {
            "no such socket (is the server running, with its socket in that folder?)".to_string()
        }
        _ => error_chain(e),
    };
    unavailable(&at, cause)
}

/// An error and every error under it, `outer: inner: …`, each said once
/// (tokio-postgres's own text omits the cause: "error connecting to server").
fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut said: Vec<String> = Vec::new();
    let mut next = Some(e);
    while let Some(error) = next {
        let text = error.to_string();
        if !said.iter().any(|s| s.contains(&text)) {
            said.push(text);
        }
        next = error.source();
    }
    said.join(": ")
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
