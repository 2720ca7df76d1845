//! A private redis-server per test, and Arrow batches for the sink.

#![allow(dead_code)] // each test file uses its own part

use std::collections::BTreeMap;
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use weir_redis_sink::RedisSink;
use weir_sdk::arrow_array::{ArrayRef, BinaryArray, RecordBatch, StringArray};
use weir_sdk::native::{NativeSink, encode_ipc};
use weir_sdk::{BatchMeta, CommitRequest, Mode, Result, Table};

/// Debian's server; `REDIS_SERVER` points elsewhere.
fn server_binary() -> PathBuf {
    std::env::var_os("REDIS_SERVER")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/bin/redis-server"))
}

/// A redis-server on a free loopback port, without persistence, in its own
/// folder; killed when dropped, also when the test panics.
pub struct RedisServer {
    child: Option<Child>,
    port: u16,
    dir: tempfile::TempDir,
    extra: Vec<String>,
    /// For the test's own client when the server wants one.
    password: Option<String>,
}

impl RedisServer {
    pub fn start() -> RedisServer {
        RedisServer::start_with(&[], None)
    }

    /// Starts with extra `redis-server` arguments; `password` is what the
    /// test's client authenticates with.
    pub fn start_with(extra: &[&str], password: Option<&str>) -> RedisServer {
        let port = {
            let probe = TcpListener::bind("127.0.0.1:0").expect("a free port");
            probe.local_addr().unwrap().port()
        };
        let mut server = RedisServer {
            child: None,
            port,
            dir: tempfile::tempdir().expect("a temporary folder"),
            extra: extra.iter().map(|s| s.to_string()).collect(),
            password: password.map(str::to_string),
        };
        server.launch();
        server
    }

    fn launch(&mut self) {
        let binary = server_binary();
        let child = Command::new(&binary)
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(self.dir.path())
            .args(["--logfile", "redis.log"])
            .args(&self.extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "cannot start {} (scripts/setup installs it): {e}",
                    binary.display()
                )
            });
        self.child = Some(child);
        self.wait_ready();
    }

    /// Until the server answers PING (or refuses it for a password, which is
    /// an answer too).
    fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                let log =
                    std::fs::read_to_string(self.dir.path().join("redis.log")).unwrap_or_default();
                panic!("redis-server exited with {status}:\n{log}");
            }
            if let Ok(client) = redis::Client::open(format!("redis://127.0.0.1:{}/", self.port))
                && let Ok(mut con) = client.get_connection()
            {
                match redis::cmd("PING").query::<String>(&mut con) {
                    Ok(_) => return,
                    Err(e) if e.code().is_some() => return,
                    Err(_) => {}
                }
            }
            assert!(
                Instant::now() < deadline,
                "redis-server on port {} did not answer",
                self.port
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn address(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Kills the server; the port stays this server's for `restart`.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        // Until the port refuses, a call could still reach the dying server.
        let deadline = Instant::now() + Duration::from_secs(5);
        while TcpStream::connect(self.address()).is_ok() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Freezes the server (SIGSTOP): connections stay open, nothing answers.
    pub fn freeze(&self) {
        self.signal("-STOP");
    }

    /// Lets a frozen server go on (SIGCONT).
    pub fn thaw(&self) {
        self.signal("-CONT");
    }

    fn signal(&self, which: &str) {
        let pid = self
            .child
            .as_ref()
            .expect("the server runs")
            .id()
            .to_string();
        let status = Command::new("kill")
            .args([which, &pid])
            .status()
            .expect("kill runs");
        assert!(status.success(), "kill {which} {pid}: {status}");
    }

    /// Starts the server again on the same port (empty: nothing persists).
    pub fn restart(&mut self) {
        self.stop();
        self.launch();
    }

    /// A client of the test's own, on database `db`.
    pub fn client_on(&self, db: u32) -> redis::Connection {
        let auth = match &self.password {
            Some(p) => format!(":{p}@"),
            None => String::new(),
        };
        redis::Client::open(format!("redis://{auth}127.0.0.1:{}/{db}", self.port))
            .and_then(|c| c.get_connection())
            .expect("a client connection")
    }

    pub fn client(&self) -> redis::Connection {
        self.client_on(0)
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            // SIGKILL ends a frozen process too.
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A sink opened against `server` with `extra` config entries.
pub fn open_sink(server: &RedisServer, extra: &[(&str, &str)]) -> Result<NativeSink<RedisSink>> {
    let mut config = vec![("address".to_string(), server.address())];
    config.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    let mut sink = NativeSink::new(
        RedisSink::default(),
        std::env::temp_dir().join("weir-redis-unused-root"),
    );
    sink.open("p1", &config)?;
    Ok(sink)
}

pub fn sink(server: &RedisServer) -> NativeSink<RedisSink> {
    open_sink(server, &[]).expect("the sink opens")
}

/// An upsert table keyed by `keys`.
pub fn upsert_table(name: &str, keys: &[&str]) -> Table {
    let mut table = Table::new(name);
    table.key_columns = keys.iter().map(|k| k.to_string()).collect();
    table.mode = Mode::Upsert;
    table
}

/// An append table (no key).
pub fn append_table(name: &str) -> Table {
    Table::new(name)
}

/// `columns` plus `__op` (one per row) and `__pos` (the row number).
pub fn rows(columns: Vec<(&str, ArrayRef)>, ops: &[&str]) -> RecordBatch {
    let pos: Vec<Vec<u8>> = (0..ops.len())
        .map(|i| (i as u32).to_be_bytes().to_vec())
        .collect();
    let mut all = columns;
    all.push((
        "__op",
        Arc::new(StringArray::from(ops.to_vec())) as ArrayRef,
    ));
    all.push((
        "__pos",
        Arc::new(BinaryArray::from_iter_values(pos)) as ArrayRef,
    ));
    RecordBatch::try_from_iter(all).expect("a record batch")
}

pub fn write(
    sink: &mut NativeSink<RedisSink>,
    table: &Table,
    id: &str,
    batch: &RecordBatch,
) -> Result<()> {
    let meta = BatchMeta {
        table: table.clone(),
        id: id.into(),
        low: vec![0],
        high: vec![0xff],
        rows: batch.num_rows() as u32,
    };
    sink.write(meta, &encode_ipc(batch))
}

pub fn commit(
    sink: &mut NativeSink<RedisSink>,
    table: &str,
    high: &[u8],
    epoch: u64,
) -> Result<()> {
    sink.commit(CommitRequest {
        table: table.into(),
        high: high.to_vec(),
        pipeline: "p1".into(),
        epoch,
    })
}

/// A hash as field -> value.
pub fn hash(con: &mut redis::Connection, key: &str) -> BTreeMap<String, String> {
    redis::cmd("HGETALL").arg(key).query(con).expect("HGETALL")
}

/// Every entry of a stream, as its fields in order.
pub fn stream(con: &mut redis::Connection, key: &str) -> Vec<Vec<(String, String)>> {
    let entries: Vec<(String, Vec<String>)> = redis::cmd("XRANGE")
        .arg(key)
        .arg("-")
        .arg("+")
        .query(con)
        .expect("XRANGE");
    entries
        .into_iter()
        .map(|(_, flat)| {
            flat.chunks(2)
                .map(|p| (p[0].clone(), p[1].clone()))
                .collect()
        })
        .collect()
}

pub fn keys(con: &mut redis::Connection) -> Vec<String> {
    let mut all: Vec<String> = redis::cmd("KEYS").arg("*").query(con).expect("KEYS");
    all.sort();
    all
}

pub fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}
