//! The connection to Redis: our own socket, the `redis` crate's protocol.
//!
//! The `redis` crate builds for wasm32-wasip2, but its `Client` opens the
//! socket itself, and a sink's socket must come from one place that the host
//! grants (today `std::net`, which is wasi:sockets in the component; later
//! the SDK's helper). So [`connect`] opens the socket, and [`Link`] speaks
//! RESP over it with the crate's command packing, reply parser and error
//! types, by implementing its `ConnectionLike`.

use std::io::{self, Write};
use std::net::TcpStream;

use redis::{Cmd, ConnectionLike, ErrorKind, Parser, RedisError, RedisResult, Value};
use weir_sdk::{SinkError, log};

use crate::config::Settings;

/// Opens a TCP connection to `address` (`host:port`), through the SDK so
/// the same grant applies natively as in the host (`grants.tcp`). The only
/// place the sink opens a socket.
pub fn connect(address: &str) -> io::Result<TcpStream> {
    weir_sdk::net::tcp_connect(address)
}

/// One open, authenticated connection with the database selected.
pub struct Link {
    stream: TcpStream,
    parser: Parser,
    database: i64,
    /// False after an I/O or protocol error: replies may be out of step.
    open: bool,
}

impl Link {
    /// Connects, authenticates and selects the database. Network failures
    /// are retryable; a refused password or database is fatal, naming the
    /// config key.
    pub fn open(settings: &Settings) -> Result<Link, SinkError> {
        let address = &settings.address;
        let stream = connect(address).map_err(|e| match e.kind() {
            // Not granted: no retry changes that, the pipeline file must.
            io::ErrorKind::PermissionDenied => {
                SinkError::Fatal(format!("cannot connect to Redis at {address}: {e}"))
            }
            _ => SinkError::Retryable(format!("cannot connect to Redis at {address}: {e}")),
        })?;
        for (what, set) in [
            ("read", stream.set_read_timeout(Some(settings.timeout))),
            ("write", stream.set_write_timeout(Some(settings.timeout))),
        ] {
            // Without one, a silent server is still cut by the host's
            // per-call bound; say so rather than fail.
            if let Err(e) = set {
                log::warn(format!("Redis at {address}: no socket {what} timeout: {e}"));
            }
        }
        // Only latency: each commit is one request and one small reply.
        let _ = stream.set_nodelay(true);
        let mut link = Link {
            stream,
            parser: Parser::new(),
            database: i64::from(settings.database),
            open: true,
        };
        link.handshake(settings)?;
        Ok(link)
    }

    fn handshake(&mut self, settings: &Settings) -> Result<(), SinkError> {
        let address = &settings.address;
        if let Some(password) = &settings.password {
            let mut auth = redis::cmd("AUTH");
            if let Some(user) = &settings.username {
                auth.arg(user);
            }
            auth.arg(password);
            auth.query::<()>(self).map_err(|e| match classify(&e) {
                Class::Retry => retryable(address, "AUTH", &e),
                _ => SinkError::Fatal(format!(
                    "config keys `username`/`password`: Redis at {address} refused them: {}",
                    detail(&e)
                )),
            })?;
        }
        if settings.database != 0 {
            redis::cmd("SELECT")
                .arg(settings.database)
                .query::<()>(self)
                .map_err(|e| match classify(&e) {
                    Class::Retry => retryable(address, "SELECT", &e),
                    Class::Auth => auth_needed(address, &e),
                    _ => SinkError::Fatal(format!(
                        "config key `database`: Redis at {address} cannot select {}: {}",
                        settings.database,
                        detail(&e)
                    )),
                })?;
        }
        if settings.wait_aof {
            // Asks for nothing new (we wrote nothing yet) but fails at once
            // on a server without WAITAOF (before 7.2) or without an AOF.
            redis::cmd("WAITAOF")
                .arg(1)
                .arg(0)
                .arg(duration_ms(settings))
                .query::<Vec<i64>>(self)
                .map_err(|e| match classify(&e) {
                    Class::Retry => retryable(address, "WAITAOF", &e),
                    Class::Auth => auth_needed(address, &e),
                    _ => SinkError::Fatal(format!(
                        "config key `wait_aof`: Redis at {address} cannot wait for its AOF \
                         (it needs Redis 7.2 or newer with `appendonly yes`): {}",
                        detail(&e)
                    )),
                })?;
        } else {
            // Fails early, and with a clear message, on a server that needs
            // a password the operator did not give.
            redis::cmd("PING")
                .query::<()>(self)
                .map_err(|e| to_sink_error(address, "PING", &e))?;
        }
        Ok(())
    }

    pub fn is_open(&self) -> bool {
        self.open
    }

    fn read_reply(&mut self) -> RedisResult<Value> {
        loop {
            let reply = self.parser.parse_value(&mut self.stream);
            match reply {
                // A RESP3 push is not the answer to our command.
                Ok(Value::Push { .. }) => continue,
                Ok(value) => return Ok(value),
                Err(e) => {
                    self.open = false;
                    return Err(e);
                }
            }
        }
    }

    fn send(&mut self, packed: &[u8]) -> RedisResult<()> {
        self.stream.write_all(packed).map_err(|e| {
            self.open = false;
            RedisError::from(e)
        })
    }
}

impl ConnectionLike for Link {
    fn req_packed_command(&mut self, cmd: &[u8]) -> RedisResult<Value> {
        self.send(cmd)?;
        self.read_reply()
    }

    fn req_packed_commands(
        &mut self,
        cmd: &[u8],
        offset: usize,
        count: usize,
    ) -> RedisResult<Vec<Value>> {
        self.send(cmd)?;
        let mut replies = Vec::with_capacity(count);
        for index in 0..offset + count {
            let reply = self.read_reply()?;
            if index >= offset {
                replies.push(reply);
            }
        }
        Ok(replies)
    }

    fn get_db(&self) -> i64 {
        self.database
    }

    fn check_connection(&mut self) -> bool {
        redis::cmd("PING").query::<()>(self).is_ok()
    }

    fn is_open(&self) -> bool {
        self.open
    }
}

/// What the sink makes of a Redis error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    /// Worth another try: the network, a loading or busy server, a failover.
    Retry,
    /// The server wants credentials, or other ones.
    Auth,
    /// Anything else: the sink cannot go on as configured.
    Fatal,
}

pub fn classify(e: &RedisError) -> Class {
    if e.is_io_error() || e.is_timeout() || e.is_connection_dropped() || e.is_connection_refusal() {
        return Class::Retry;
    }
    if e.kind() == ErrorKind::AuthenticationFailed {
        return Class::Auth;
    }
    match e.code() {
        // Loading a dump, running a long script, failing to persist, out of
        // memory, a replica just promoted or demoted, cluster hiccups.
        Some(
            "LOADING" | "BUSY" | "MISCONF" | "OOM" | "READONLY" | "TRYAGAIN" | "MASTERDOWN"
            | "CLUSTERDOWN",
        ) => Class::Retry,
        Some("NOAUTH" | "WRONGPASS" | "NOPERM") => Class::Auth,
        Some("ERR") if detail(e).contains("max number of clients") => Class::Retry,
        _ => Class::Fatal,
    }
}

/// The error as one sentence for the host, by its class.
pub fn to_sink_error(address: &str, what: &str, e: &RedisError) -> SinkError {
    match classify(e) {
        Class::Retry => retryable(address, what, e),
        Class::Auth => auth_needed(address, e),
        Class::Fatal => {
            SinkError::Fatal(format!("Redis at {address} refused {what}: {}", detail(e)))
        }
    }
}

fn retryable(address: &str, what: &str, e: &RedisError) -> SinkError {
    SinkError::Retryable(format!("Redis at {address}: {what} failed: {}", detail(e)))
}

fn auth_needed(address: &str, e: &RedisError) -> SinkError {
    SinkError::Fatal(format!(
        "Redis at {address} refused the sink's credentials or permissions (config keys \
         `username`/`password`): {}",
        detail(e)
    ))
}

/// The server's words when there are some, else the whole error.
fn detail(e: &RedisError) -> String {
    match (e.code(), e.detail()) {
        (Some(code), Some(detail)) => format!("{code} {detail}"),
        _ => e.to_string(),
    }
}

/// `WAITAOF`'s timeout argument: the socket timeout, so the reply comes
/// before the read gives up.
pub fn duration_ms(settings: &Settings) -> u64 {
    u64::try_from(settings.timeout.as_millis())
        .unwrap_or(u64::MAX)
        .saturating_sub(100)
        .max(1)
}

/// Runs `cmd`, turning failure into a sink error naming `what`.
pub fn run<T: redis::FromRedisValue>(
    link: &mut Link,
    address: &str,
    what: &str,
    cmd: &Cmd,
) -> Result<T, SinkError> {
    cmd.query(link)
        .map_err(|e| to_sink_error(address, what, &e))
}
