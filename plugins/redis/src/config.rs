//! The sink's `config:` map, checked once in `open`.

use std::time::Duration;

use weir_sdk::{Config, Result, SinkError};

/// Every key the sink understands; anything else is a typo worth stopping for.
const KNOWN_KEYS: [&str; 8] = [
    "address",
    "prefix",
    "database",
    "username",
    "password",
    "timeout_ms",
    "wait_aof",
    "max_commit_mb",
];

/// The checked configuration.
#[derive(Clone, PartialEq, Eq)]
pub struct Settings {
    /// `host:port` of the Redis server.
    pub address: String,
    /// First part of every key the sink writes.
    pub prefix: String,
    /// The logical database (`SELECT`).
    pub database: u32,
    /// ACL user; `None` is the default user.
    pub username: Option<String>,
    /// Password for `AUTH`; `None` skips authentication.
    pub password: Option<String>,
    /// Read and write timeout of the socket.
    pub timeout: Duration,
    /// Wait after each commit until Redis has fsynced it to its AOF.
    pub wait_aof: bool,
    /// The most rendered bytes one table's commit may carry.
    pub max_commit_bytes: usize,
}

impl std::fmt::Debug for Settings {
    // Keeps the password out of logs and test output.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Settings")
            .field("address", &self.address)
            .field("prefix", &self.prefix)
            .field("database", &self.database)
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "<set>"))
            .field("timeout", &self.timeout)
            .field("wait_aof", &self.wait_aof)
            .field("max_commit_bytes", &self.max_commit_bytes)
            .finish()
    }
}

/// Below the host's default wall-clock bound per call (60 s), so a stuck
/// server surfaces as a retryable error from the sink, not a killed call.
const DEFAULT_TIMEOUT_MS: u64 = 10_000;
/// One commit is one script run that blocks Redis while it runs, and while
/// it is sent the sink holds three copies of it (the staged changes, the
/// command, its packed bytes) inside the host's default 512 MiB limit.
const DEFAULT_MAX_COMMIT_MB: usize = 64;

impl Settings {
    /// Checks the operator's configuration; every refusal is
    /// [`SinkError::Fatal`] naming the key.
    pub fn parse(config: &Config) -> Result<Settings> {
        if let Some((key, _)) = config.iter().find(|(k, _)| !KNOWN_KEYS.contains(k)) {
            return Err(fatal(
                key,
                format!(
                    "is not a setting of the Redis sink (known: {})",
                    KNOWN_KEYS.join(", ")
                ),
            ));
        }
        let address = config.require("address")?.trim().to_string();
        check_address(&address)?;
        let prefix = config.get("prefix").unwrap_or("weir").to_string();
        if prefix.is_empty() {
            return Err(fatal("prefix", "must not be empty".into()));
        }
        let database = config.parse("database", 0u32)?;
        let username = config.get("username").map(str::to_string);
        let password = config.get("password").map(str::to_string);
        if username.is_some() && password.is_none() {
            return Err(fatal(
                "password",
                "is required when `username` is set (AUTH needs both)".into(),
            ));
        }
        let timeout_ms = config.parse("timeout_ms", DEFAULT_TIMEOUT_MS)?;
        if timeout_ms == 0 {
            return Err(fatal("timeout_ms", "must be at least 1".into()));
        }
        let wait_aof = config.parse("wait_aof", false)?;
        let max_commit_mb = config.parse("max_commit_mb", DEFAULT_MAX_COMMIT_MB)?;
        let max_commit_bytes = max_commit_mb
            .checked_mul(1024 * 1024)
            .filter(|&b| b > 0)
            .ok_or_else(|| fatal("max_commit_mb", format!("{max_commit_mb} is out of range")))?;
        Ok(Settings {
            address,
            prefix,
            database,
            username,
            password,
            timeout: Duration::from_millis(timeout_ms),
            wait_aof,
            max_commit_bytes,
        })
    }
}

/// `host:port` with a non-empty host and a port in 1..=65535; an IPv6
/// literal goes in brackets (`[::1]:6379`).
fn check_address(address: &str) -> Result<()> {
    let bad = |why: &str| fatal("address", format!("{address:?} {why}; expected host:port"));
    let (host, port) = address.rsplit_once(':').ok_or_else(|| bad("has no port"))?;
    if host.is_empty() {
        return Err(bad("has no host"));
    }
    if host.contains(':') && !(host.starts_with('[') && host.ends_with(']')) {
        return Err(bad("has an IPv6 host without brackets"));
    }
    match port.parse::<u16>() {
        Ok(p) if p > 0 => Ok(()),
        _ => Err(bad("has no valid port")),
    }
}

fn fatal(key: &str, why: String) -> SinkError {
    SinkError::Fatal(format!("config key `{key}`: {why}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(entries: &[(&str, &str)]) -> Result<Settings> {
        Settings::parse(&Config::new(entries.iter().copied()))
    }

    fn fatal_naming(result: Result<Settings>, key: &str) {
        match result {
            Err(SinkError::Fatal(m)) => assert!(m.contains(&format!("`{key}`")), "{m}"),
            other => panic!("expected fatal naming {key}, got {other:?}"),
        }
    }

    #[test]
    fn defaults() {
        let s = parse(&[("address", "127.0.0.1:6379")]).unwrap();
        assert_eq!(s.prefix, "weir");
        assert_eq!(s.database, 0);
        assert_eq!(s.timeout, Duration::from_secs(10));
        assert!(!s.wait_aof);
        assert_eq!(s.max_commit_bytes, 64 << 20);
        assert!(parse(&[("address", "[::1]:6379")]).is_ok());
        assert!(parse(&[("address", "redis.internal:1")]).is_ok());
    }

    #[test]
    fn refusals_name_the_key() {
        fatal_naming(parse(&[]), "address");
        for bad in [
            "localhost",
            ":6379",
            "host:",
            "host:0",
            "host:70000",
            "::1:6379",
        ] {
            fatal_naming(parse(&[("address", bad)]), "address");
        }
        let a = ("address", "h:1");
        fatal_naming(parse(&[a, ("prefix", "")]), "prefix");
        fatal_naming(parse(&[a, ("database", "one")]), "database");
        fatal_naming(parse(&[a, ("database", "-1")]), "database");
        fatal_naming(parse(&[a, ("username", "u")]), "password");
        fatal_naming(parse(&[a, ("timeout_ms", "0")]), "timeout_ms");
        fatal_naming(parse(&[a, ("wait_aof", "yes")]), "wait_aof");
        fatal_naming(parse(&[a, ("max_commit_mb", "0")]), "max_commit_mb");
        fatal_naming(parse(&[a, ("adress", "h:1")]), "adress");
    }

    #[test]
    fn debug_hides_the_password() {
        let s = parse(&[("address", "h:1"), ("password", "hunter2")]).unwrap();
        assert!(!format!("{s:?}").contains("hunter2"));
    }
}
