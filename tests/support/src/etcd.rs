//! etcd for tests: a private `etcd` per test (Debian's `etcd-server`, or
//! the binary `ETCD` names) on free loopback ports, with its data in a
//! folder of its own; killed when dropped, also when the test panics. A
//! test can stop it (SIGSTOP) and let it go on (SIGCONT), as a stalled
//! coordinator looks to its clients, watch keys change as they happen, and
//! count the requests etcd received.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

fn binary() -> PathBuf {
    std::env::var_os("ETCD")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/bin/etcd"))
}

fn free_port() -> u16 {
    let probe = TcpListener::bind("127.0.0.1:0").expect("a free port");
    probe.local_addr().expect("a bound address").port()
}

pub struct Etcd {
    child: Child,
    client_port: u16,
    dir: tempfile::TempDir,
}

impl Etcd {
    /// Starts a one-member etcd and waits until it answers.
    pub fn start() -> Etcd {
        let dir = tempfile::tempdir().expect("a temporary folder");
        let client_port = free_port();
        let peer_port = free_port();
        let client = format!("http://127.0.0.1:{client_port}");
        let peer = format!("http://127.0.0.1:{peer_port}");
        let log = std::fs::File::create(dir.path().join("etcd.log")).expect("etcd's log");
        let child = Command::new(binary())
            .arg("--name=test")
            .arg(format!("--data-dir={}", dir.path().join("data").display()))
            .arg(format!("--listen-client-urls={client}"))
            .arg(format!("--advertise-client-urls={client}"))
            .arg(format!("--listen-peer-urls={peer}"))
            .arg(format!("--initial-advertise-peer-urls={peer}"))
            .arg(format!("--initial-cluster=test={peer}"))
            // Tests write little; keep etcd's own start and fsyncs cheap.
            .arg("--unsafe-no-fsync")
            .arg("--log-level=warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "cannot start {} ({e}); scripts/setup installs etcd-server",
                    binary().display()
                )
            });
        let etcd = Etcd {
            child,
            client_port,
            dir,
        };
        etcd.wait_until_serving();
        etcd
    }

    /// `http://127.0.0.1:PORT`, what a host file's `cluster.endpoints` names.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.client_port)
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Stops the process where it is (SIGSTOP): it holds its connections
    /// and answers nothing.
    pub fn pause(&self) {
        signal(self.child.id(), libc::SIGSTOP);
    }

    /// Lets a paused etcd go on (SIGCONT).
    pub fn resume(&self) {
        signal(self.child.id(), libc::SIGCONT);
    }

    /// A key's value as etcd holds it now, read with `etcdctl`.
    pub fn get(&self, key: &str) -> Option<String> {
        let out = Command::new("etcdctl")
            .env("ETCDCTL_API", "3")
            .arg(format!("--endpoints={}", self.endpoint()))
            .args(["get", "--print-value-only", key])
            .output()
            .expect("etcdctl runs (scripts/setup installs etcd-client)");
        assert!(
            out.status.success(),
            "etcdctl get {key}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let text = String::from_utf8_lossy(&out.stdout).trim_end().to_string();
        (!text.is_empty()).then_some(text)
    }

    /// Every key under `prefix`, with its value, read with `etcdctl`.
    pub fn list(&self, prefix: &str) -> Vec<(String, String)> {
        let out = Command::new("etcdctl")
            .env("ETCDCTL_API", "3")
            .arg(format!("--endpoints={}", self.endpoint()))
            .args(["get", "--prefix", prefix])
            .output()
            .expect("etcdctl runs");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let lines: Vec<&str> = text.lines().collect();
        lines
            .chunks(2)
            .filter(|pair| pair.len() == 2)
            .map(|pair| (pair[0].to_string(), pair[1].to_string()))
            .collect()
    }

    /// Every change of a key under `prefix` since etcd started, then each
    /// as it happens (`etcdctl watch`), until the watch is dropped.
    pub fn watch(&self, prefix: &str) -> Watch {
        Watch::start(&self.endpoint(), prefix)
    }

    /// The requests etcd received so far, by gRPC method (`Range`, `Txn`,
    /// `Put`, `LeaseKeepAlive`, ...), from its own `/metrics`: every unary
    /// call counts one, every message on a stream (a lease renewal, a
    /// watch request) one. Whoever sent them: the hosts, and `etcdctl` when
    /// a test asks etcd something.
    pub fn requests_received(&self) -> BTreeMap<String, u64> {
        let page = ureq::get(format!("{}/metrics", self.endpoint()))
            .call()
            .and_then(|mut reply| reply.body_mut().read_to_string())
            .unwrap_or_else(|e| panic!("etcd's /metrics: {e}"));
        let mut received = BTreeMap::new();
        for line in page.lines() {
            let Some(labels) = line.strip_prefix("grpc_server_msg_received_total{") else {
                continue;
            };
            let method = labels
                .split(',')
                .find_map(|label| label.strip_prefix("grpc_method=\""))
                .and_then(|rest| rest.split('"').next());
            let count = line.rsplit(' ').next().and_then(|n| n.parse::<f64>().ok());
            if let (Some(method), Some(count)) = (method, count) {
                *received.entry(method.to_string()).or_insert(0) += count as u64;
            }
        }
        received
    }

    /// Whether the process is stopped now (a SIGSTOP landed).
    pub fn is_stopped(&self) -> bool {
        is_stopped(self.child.id())
    }

    /// etcd's own log, for failure messages.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("etcd.log")).unwrap_or_default()
    }

    fn wait_until_serving(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let reachable = TcpStream::connect(("127.0.0.1", self.client_port)).is_ok();
            if reachable {
                let health = Command::new("etcdctl")
                    .env("ETCDCTL_API", "3")
                    .arg(format!("--endpoints={}", self.endpoint()))
                    .args(["endpoint", "health"])
                    .output();
                if health.is_ok_and(|out| out.status.success()) {
                    return;
                }
            }
            assert!(
                Instant::now() < deadline,
                "etcd did not serve within 30 s:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        // A paused etcd must go on to die.
        signal(self.child.id(), libc::SIGCONT);
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Sends `signal` to process `pid`; a process already gone is no error.
pub fn signal(pid: u32, signal: libc::c_int) {
    let pid = libc::pid_t::try_from(pid).expect("a pid fits pid_t");
    // SAFETY: kill(2) with a valid signal number; at worst the process is
    // gone (ESRCH), which is fine for a test that is ending it.
    unsafe {
        libc::kill(pid, signal);
    }
}

/// Whether every thread of process `pid` is stopped by a signal now (state
/// `T` in `/proc/<pid>/task/*/stat`); false when it is gone.
pub fn is_stopped(pid: u32) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return false;
    };
    let mut any = false;
    for task in tasks.flatten() {
        let Ok(stat) = std::fs::read_to_string(task.path().join("stat")) else {
            return false;
        };
        // The state follows the command name, which is in parentheses and
        // may itself hold spaces or parentheses.
        let stopped = stat
            .rsplit_once(") ")
            .is_some_and(|(_, rest)| rest.starts_with('T'));
        if !stopped {
            return false;
        }
        any = true;
    }
    any
}

/// One change of a watched key: a put (`value` Some) or a delete.
#[derive(Clone, Debug)]
pub struct WatchEvent {
    /// When the test read it: when the change was made plus the watch's
    /// delivery (for a change made before the watch began: when it began).
    pub seen: Instant,
    pub key: String,
    pub value: Option<String>,
}

/// `etcdctl watch --prefix`, read on a thread of its own into a list the
/// test reads at any time; the child is killed when the watch drops.
pub struct Watch {
    child: Child,
    events: Arc<Mutex<Vec<WatchEvent>>>,
    ended: Arc<Mutex<bool>>,
}

impl Watch {
    fn start(endpoint: &str, prefix: &str) -> Watch {
        let mut child = Command::new("etcdctl")
            .env("ETCDCTL_API", "3")
            .arg(format!("--endpoints={endpoint}"))
            // From etcd's first revision: no change is missed however late
            // etcdctl subscribes (the tests' etcd never compacts).
            .args(["watch", "--rev=1", "--prefix", prefix])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("etcdctl runs (scripts/setup installs etcd-client)");
        let stdout = child.stdout.take().expect("etcdctl's stdout");
        let events = Arc::new(Mutex::new(Vec::new()));
        let ended = Arc::new(Mutex::new(false));
        let (into, ended_flag) = (events.clone(), ended.clone());
        std::thread::spawn(move || {
            // etcdctl prints each event as three lines: PUT or DELETE, the
            // key, the value (empty for a delete).
            let mut lines = BufReader::new(stdout).lines();
            while let (Some(Ok(kind)), Some(Ok(key)), Some(Ok(value))) =
                (lines.next(), lines.next(), lines.next())
            {
                let event = WatchEvent {
                    seen: Instant::now(),
                    key,
                    value: (kind == "PUT").then_some(value),
                };
                into.lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push(event);
            }
            *ended_flag.lock().unwrap_or_else(PoisonError::into_inner) = true;
        });
        Watch {
            child,
            events,
            ended,
        }
    }

    /// Every event so far, oldest first.
    pub fn events(&self) -> Vec<WatchEvent> {
        self.events
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Whether the watch ended (etcdctl exited): later changes are missed.
    pub fn ended(&self) -> bool {
        *self.ended.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
