//! S3 for tests: a private moto server per test ([`MotoServer`]), moto's
//! own S3 API on a free loopback port, so a sink's `s3://` blob store meets
//! a real S3 protocol and not a stand-in of ours.
//!
//! What the tests check is read back with boto3 (the AWS SDK that comes
//! with moto), a client we did not write: [`MotoServer::keys`] lists,
//! [`MotoServer::download`] copies a prefix into a folder for the readers
//! in [`crate::read`].

use std::collections::BTreeMap;
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::command::workspace;

/// The credentials moto accepts (any); the sink's options and the test's
/// own client use the same, as a real deployment would.
const ACCESS_KEY: &str = "weir-test";
const SECRET_KEY: &str = "weir-test-secret";
const REGION: &str = "us-east-1";

/// The helper every boto3 call goes through: one client on the server's
/// endpoint, then the command in `argv[2]`. Kept here rather than in a file
/// so the module is the whole of the test's S3 side.
const CLIENT: &str = r#"
import json, os, sys
import boto3
from botocore.config import Config
s3 = boto3.client(
    "s3",
    endpoint_url=sys.argv[1],
    region_name=os.environ["AWS_DEFAULT_REGION"],
    config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1}),
)
command = sys.argv[2]
if command == "create-bucket":
    s3.create_bucket(Bucket=sys.argv[3])
elif command == "list":
    keys = {}
    pages = s3.get_paginator("list_objects_v2").paginate(Bucket=sys.argv[3], Prefix=sys.argv[4])
    for page in pages:
        for item in page.get("Contents", []):
            keys[item["Key"]] = item["ETag"].strip('"')
    print(json.dumps(keys))
elif command == "download":
    bucket, prefix, into = sys.argv[3], sys.argv[4], sys.argv[5]
    count = 0
    pages = s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
    for page in pages:
        for item in page.get("Contents", []):
            relative = item["Key"][len(prefix):].lstrip("/")
            target = os.path.join(into, relative)
            os.makedirs(os.path.dirname(target), exist_ok=True)
            s3.download_file(bucket, item["Key"], target)
            count += 1
    print(count)
else:
    sys.exit(f"unknown command {command}")
"#;

/// The project's virtualenv Python, which scripts/setup gives moto and boto3.
fn python() -> PathBuf {
    let python = workspace().join(".venv/bin/python");
    assert!(
        python.exists(),
        "{} is missing: run scripts/setup (it installs moto's server mode)",
        python.display()
    );
    python
}

/// A moto server on a free loopback port, its state in memory; killed when
/// dropped, also when the test panics.
pub struct MotoServer {
    child: Child,
    port: u16,
    /// Holds moto's own output, shown if it dies or never answers.
    log: tempfile::NamedTempFile,
}

impl MotoServer {
    /// Starts `python -m moto.server` and waits until it answers S3 calls.
    pub fn start() -> MotoServer {
        let port = {
            let probe = TcpListener::bind("127.0.0.1:0").expect("a free port");
            probe.local_addr().expect("a bound address").port()
        };
        let log = tempfile::NamedTempFile::new().expect("a log file");
        let child = Command::new(python())
            .args([
                "-m",
                "moto.server",
                "-H",
                "127.0.0.1",
                "-p",
                &port.to_string(),
            ])
            .stdin(Stdio::null())
            .stdout(log.reopen().expect("the log file"))
            .stderr(log.reopen().expect("the log file"))
            .spawn()
            .unwrap_or_else(|e| {
                panic!("cannot start moto's server (scripts/setup installs it): {e}")
            });
        let mut server = MotoServer { child, port, log };
        server.wait_ready();
        server
    }

    fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("moto's server exited with {status}:\n{}", self.log_text());
            }
            if TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
                // Listening is not serving yet: one real S3 call proves it,
                // and a missing bucket is an S3 answer too.
                let probe = self.client(&["list", "weir-readiness-probe", ""]);
                if probe.status.success()
                    || String::from_utf8_lossy(&probe.stderr).contains("NoSuchBucket")
                {
                    return;
                }
            }
            assert!(
                Instant::now() < deadline,
                "moto's server on port {} did not answer within 30 s:\n{}",
                self.port,
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(self.log.path()).unwrap_or_default()
    }

    /// `http://127.0.0.1:<port>`, the sink's `aws_endpoint`.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Creates `bucket` (a real S3 CreateBucket call).
    pub fn create_bucket(&self, bucket: &str) {
        let out = self.client(&["create-bucket", bucket]);
        assert!(
            out.status.success(),
            "creating bucket {bucket} on moto failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// The `blob_store.options` a sink needs to reach this server: its
    /// endpoint over plain HTTP, a region, and credentials (moto takes any).
    pub fn blob_store_options(&self) -> BTreeMap<String, String> {
        [
            ("aws_endpoint", self.endpoint()),
            ("aws_region", REGION.to_string()),
            ("aws_access_key_id", ACCESS_KEY.to_string()),
            ("aws_secret_access_key", SECRET_KEY.to_string()),
            ("aws_allow_http", "true".to_string()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
    }

    /// Every object under `prefix` in `bucket`, by key, with its ETag: two
    /// listings are equal only if no object was added, removed or rewritten.
    pub fn keys(&self, bucket: &str, prefix: &str) -> BTreeMap<String, String> {
        let out = self.client(&["list", bucket, prefix]);
        assert!(
            out.status.success(),
            "listing s3://{bucket}/{prefix} on moto failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).expect("the listing is JSON")
    }

    /// Copies every object under `prefix` into `into`, keyed by its path
    /// below the prefix (so `into` reads like the sink's root on disk);
    /// returns how many objects there were.
    pub fn download(&self, bucket: &str, prefix: &str, into: &Path) -> usize {
        let into_text = into.to_str().expect("test paths are UTF-8");
        let out = self.client(&["download", bucket, prefix, into_text]);
        assert!(
            out.status.success(),
            "downloading s3://{bucket}/{prefix} from moto failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout)
            .trim()
            .parse()
            .expect("the download prints its count")
    }

    fn client(&self, args: &[&str]) -> Output {
        Command::new(python())
            .args(["-c", CLIENT, &self.endpoint()])
            .args(args)
            .env("AWS_ACCESS_KEY_ID", ACCESS_KEY)
            .env("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
            .env("AWS_DEFAULT_REGION", REGION)
            // Nothing of the machine's own AWS set-up may leak in.
            .env_remove("AWS_PROFILE")
            .env_remove("AWS_SESSION_TOKEN")
            .env_remove("AWS_ENDPOINT_URL")
            .output()
            .expect("python runs")
    }
}

impl Drop for MotoServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
