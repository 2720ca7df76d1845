//! An Iceberg REST catalog for tests: a private server per test
//! ([`IcebergRestServer`]), so that a sink speaking the Iceberg REST
//! protocol meets a catalog whose commit checks are not ours.
//!
//! The server (tests/support/iceberg_rest/server.py) is a thin HTTP front
//! over pyiceberg's own `SqlCatalog` on a SQLite file: requirement checks,
//! metadata updates and the compare-and-swap are pyiceberg's code; the front
//! maps the spec's routes onto it, and adds test-only fault injection
//! ([`IcebergRestServer::inject`]) for uncertain-commit tests.
//!
//! What the tests check is read back through the REST endpoint by readers we
//! did not write: pyiceberg's `RestCatalog`
//! ([`IcebergRestServer::rows_via_pyiceberg`]) and DuckDB's iceberg
//! extension attached to the catalog ([`IcebergRestServer::rows_via_duckdb`]),
//! in the canonical forms of tests/readers/read_iceberg.py.
//!
//! With `WEIR_ICEBERG_REST_URI` (and `WEIR_ICEBERG_REST_TOKEN`) set, no
//! server is started and the same API points at that catalog; fault
//! injection then answers `Err`.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::command::workspace;
use crate::moto::MotoServer;

/// The helper every client call goes through: pyiceberg's `RestCatalog` or
/// DuckDB's iceberg extension on the endpoint in the environment, then the
/// command in `argv[2]`. Rows come out in read_iceberg.py's canonical forms
/// (its functions are imported, so every reader of the tests agrees).
const CLIENT: &str = r#"
import json, os, sys, warnings
sys.path.insert(0, os.path.join(sys.argv[1], "tests", "readers"))
from read_iceberg import canonical_column, duckdb_connection, s3_settings

# pyiceberg warns that a default OAuth2 server URI is deprecated; it is set.
warnings.simplefilter("ignore", DeprecationWarning)
uri = os.environ["WEIR_REST_URI"].rstrip("/")
token = os.environ.get("WEIR_REST_TOKEN")
credential = os.environ.get("WEIR_REST_CREDENTIAL")

def catalog():
    from pyiceberg.catalog import load_catalog
    properties = {"uri": uri}
    if credential:
        properties["credential"] = credential
        properties["oauth2-server-uri"] = uri + "/v1/oauth/tokens"
    elif token:
        properties["token"] = token
    s3 = s3_settings()
    if s3 is not None:
        endpoint, key, secret, region = s3
        properties.update({
            "s3.endpoint": endpoint,
            "s3.access-key-id": key,
            "s3.secret-access-key": secret,
            "s3.region": region,
            "s3.force-virtual-addressing": "false",
        })
    return load_catalog("rest", type="rest", **properties)

def rows(table):
    columns = table.column_names
    canon = [canonical_column(table.column(i)) for i in range(len(columns))]
    return {"columns": columns, "rows": [list(r) for r in zip(*canon)] if canon else []}

def quote(text):
    return "'" + text.replace("'", "''") + "'"

def ident(text):
    return '"' + text.replace('"', '""') + '"'

command = sys.argv[2]
if command == "pyiceberg":
    # [[namespace, name], ...]: one Python start reads them all.
    wanted, rest = json.loads(sys.argv[3]), catalog()
    print(json.dumps([rows(rest.load_table((*ns, name)).scan().to_arrow()) for ns, name in wanted]))
elif command == "duckdb":
    wanted = json.loads(sys.argv[3])
    con = duckdb_connection()
    # DuckDB talks to a REST catalog through httpfs's HTTP client, which
    # duckdb_connection() loads only for S3; loaded by file path as well.
    if not con.execute("SELECT loaded FROM duckdb_extensions() WHERE extension_name = 'httpfs'").fetchone()[0]:
        import glob, duckdb_extension_httpfs
        base = os.path.dirname(duckdb_extension_httpfs.__file__)
        con.execute(f"LOAD {quote(sorted(glob.glob(os.path.join(base, 'extensions', '*', 'httpfs.duckdb_extension')))[-1])}")
    if credential:
        client_id, _, client_secret = credential.partition(":")
        con.execute(
            f"CREATE SECRET weir_rest (TYPE iceberg, CLIENT_ID {quote(client_id)}, "
            f"CLIENT_SECRET {quote(client_secret)}, OAUTH2_SERVER_URI {quote(uri + '/v1/oauth/tokens')})"
        )
        auth = "SECRET weir_rest"
    elif token:
        con.execute(f"CREATE SECRET weir_rest (TYPE iceberg, TOKEN {quote(token)})")
        auth = "SECRET weir_rest"
    else:
        auth = "AUTHORIZATION_TYPE 'none'"
    # No vended credentials: the data files are read with the S3 secret
    # duckdb_connection() made, or from local files. Nested namespaces are
    # then one schema name, levels joined by ".".
    con.execute(
        f"ATTACH '' AS weir_rest (TYPE iceberg, ENDPOINT {quote(uri)}, {auth}, "
        "ACCESS_DELEGATION_MODE 'none', SUPPORT_NESTED_NAMESPACES true)"
    )
    read = []
    for namespace, name in wanted:
        result = con.execute(f"SELECT * FROM weir_rest.{ident('.'.join(namespace))}.{ident(name)}")
        table = result.to_arrow_table() if hasattr(result, "to_arrow_table") else result.fetch_arrow_table()
        read.append(rows(table))
    print(json.dumps(read))
elif command == "prefix":
    print(json.dumps(catalog().properties.get("prefix")))
elif command == "exec":
    import pyarrow as pa
    exec(sys.argv[3], {"catalog": catalog(), "pa": pa, "json": json})
else:
    sys.exit(f"unknown command {command}")
"#;

/// The project's virtualenv Python, which scripts/setup gives pyiceberg,
/// SQLAlchemy and DuckDB.
fn python() -> PathBuf {
    let python = workspace().join(".venv/bin/python");
    assert!(
        python.exists(),
        "{} is missing: run scripts/setup (it installs pyiceberg, SQLAlchemy and DuckDB)",
        python.display()
    );
    python
}

/// Where and how the catalog's FileIO and the test's readers reach S3.
#[derive(Debug, Clone)]
pub struct S3Settings {
    /// `http://host:port`, path-style addressing.
    pub endpoint: String,
    pub access_key: String,
    pub secret_key: String,
    pub region: String,
}

impl S3Settings {
    /// The settings of a moto server (the same credentials its sinks use).
    pub fn of(moto: &MotoServer) -> S3Settings {
        let options = moto.blob_store_options();
        S3Settings {
            endpoint: moto.endpoint(),
            access_key: options["aws_access_key_id"].clone(),
            secret_key: options["aws_secret_access_key"].clone(),
            region: options["aws_region"].clone(),
        }
    }
}

/// Rows a reader read, in read_iceberg.py's canonical forms (text, null as
/// `None`), sorted so two readers' reads compare equal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RestRows {
    pub columns: Vec<String>,
    pub rows: Vec<Vec<Option<String>>>,
}

/// How to start an [`IcebergRestServer`]; [`IcebergRestServer::builder`].
#[derive(Debug, Clone, Default)]
pub struct IcebergRestBuilder {
    prefix: Option<String>,
    token: Option<String>,
    client: Option<(String, String)>,
    token_ttl: Option<Duration>,
    s3: Option<S3Settings>,
    warehouse: Option<String>,
}

impl IcebergRestBuilder {
    /// Serve under `/v1/{prefix}/`, announced in `/v1/config`'s overrides.
    pub fn prefix(mut self, prefix: &str) -> Self {
        self.prefix = Some(prefix.to_string());
        self
    }

    /// Require `Authorization: Bearer {token}`.
    pub fn token(mut self, token: &str) -> Self {
        self.token = Some(token.to_string());
        self
    }

    /// Issue tokens at `POST /v1/oauth/tokens` to this OAuth2 client (and
    /// require one). The test's readers then use these credentials.
    pub fn client_credentials(mut self, client_id: &str, client_secret: &str) -> Self {
        self.client = Some((client_id.to_string(), client_secret.to_string()));
        self
    }

    /// How long an issued token is valid (whole seconds; the server's
    /// default is an hour). An expired token is answered 401.
    pub fn token_ttl(mut self, ttl: Duration) -> Self {
        self.token_ttl = Some(ttl);
        self
    }

    /// Tables live on moto's S3 under `warehouse` (`s3://bucket/path`; the
    /// bucket must exist). The catalog's FileIO and the readers use moto.
    pub fn s3(mut self, moto: &MotoServer, warehouse: &str) -> Self {
        self.s3 = Some(S3Settings::of(moto));
        self.warehouse = Some(warehouse.to_string());
        self
    }

    /// The warehouse new tables go under (`file:///...`), instead of a
    /// folder of the server's own.
    pub fn warehouse(mut self, warehouse: &str) -> Self {
        self.warehouse = Some(warehouse.to_string());
        self
    }

    /// S3 settings of another S3 server, and the warehouse on it.
    pub fn s3_settings(mut self, settings: S3Settings, warehouse: &str) -> Self {
        self.s3 = Some(settings);
        self.warehouse = Some(warehouse.to_string());
        self
    }

    /// Starts the server (or, with `WEIR_ICEBERG_REST_URI` set, points at
    /// that catalog instead) and waits until it answers.
    pub fn start(self) -> IcebergRestServer {
        if let Ok(uri) = std::env::var("WEIR_ICEBERG_REST_URI") {
            return IcebergRestServer::external(self, uri);
        }
        IcebergRestServer::local(self)
    }
}

/// A private Iceberg REST catalog on a free loopback port, its state in a
/// temporary folder (SQLite file and, unless S3, the warehouse); killed when
/// dropped, also when the test panics.
pub struct IcebergRestServer {
    /// `None` for an external catalog (`WEIR_ICEBERG_REST_URI`).
    child: Option<Child>,
    port: Option<u16>,
    uri: String,
    prefix: Option<String>,
    token: Option<String>,
    client: Option<(String, String)>,
    s3: Option<S3Settings>,
    warehouse: Option<String>,
    /// The server's request log and errors, shown if it dies or never answers.
    log: Option<tempfile::NamedTempFile>,
    _dir: Option<tempfile::TempDir>,
}

impl IcebergRestServer {
    /// A server without prefix, auth or S3, its warehouse on local disk.
    pub fn start() -> IcebergRestServer {
        IcebergRestServer::builder().start()
    }

    pub fn builder() -> IcebergRestBuilder {
        IcebergRestBuilder::default()
    }

    fn local(options: IcebergRestBuilder) -> IcebergRestServer {
        let dir = tempfile::tempdir().expect("a temporary folder");
        let warehouse = options
            .warehouse
            .clone()
            .unwrap_or_else(|| format!("file://{}", dir.path().join("lake").display()));
        let log = tempfile::NamedTempFile::new().expect("a log file");
        let mut command = Command::new(python());
        command
            .arg(workspace().join("tests/support/iceberg_rest/server.py"))
            .args(["--host", "127.0.0.1", "--port", "0"])
            .arg("--db")
            .arg(dir.path().join("catalog.db"))
            .args(["--warehouse", &warehouse]);
        if let Some(prefix) = &options.prefix {
            command.args(["--prefix", prefix]);
        }
        if let Some(token) = &options.token {
            command.args(["--token", token]);
        }
        if let Some((id, secret)) = &options.client {
            command.args(["--client-id", id, "--client-secret", secret]);
        }
        if let Some(ttl) = options.token_ttl {
            command.args(["--token-ttl", &ttl.as_secs().max(1).to_string()]);
        }
        if let Some(s3) = &options.s3 {
            command.args([
                "--s3-endpoint",
                &s3.endpoint,
                "--s3-access-key",
                &s3.access_key,
                "--s3-secret-key",
                &s3.secret_key,
                "--s3-region",
                &s3.region,
            ]);
        }
        let mut child = command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(log.reopen().expect("the log file"))
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start the Iceberg REST test server: {e}"));

        // The server binds port 0 itself and says which port it got: no
        // window in which another process can take a probed port.
        let stdout = child.stdout.take().expect("piped stdout");
        let (sender, receiver) = mpsc::channel();
        std::thread::spawn(move || {
            let mut lines = BufReader::new(stdout).lines();
            if let Some(Ok(line)) = lines.next() {
                let _ = sender.send(line);
            }
            // Drained to the end, so a stray print never blocks the server.
            for _ in lines {}
        });
        let mut server = IcebergRestServer {
            child: Some(child),
            port: None,
            uri: String::new(),
            prefix: options.prefix.clone(),
            token: options.token.clone(),
            client: options.client.clone(),
            s3: options.s3.clone(),
            warehouse: Some(warehouse),
            log: Some(log),
            _dir: Some(dir),
        };
        let port = server.wait_listening(&receiver);
        server.port = Some(port);
        server.uri = format!("http://127.0.0.1:{port}");
        server
    }

    fn wait_listening(&mut self, lines: &mpsc::Receiver<String>) -> u16 {
        // Importing pyiceberg and SQLAlchemy takes seconds on a busy machine.
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            match lines.recv_timeout(Duration::from_millis(50)) {
                Ok(line) => {
                    let port = line
                        .strip_prefix("listening on ")
                        .and_then(|p| p.trim().parse().ok());
                    return port.unwrap_or_else(|| {
                        panic!(
                            "the Iceberg REST test server printed {line:?}, not its port:\n{}",
                            self.log_text()
                        )
                    });
                }
                // Not yet, or stdout closed: has the server died?
                Err(waiting) => {
                    let child = self.child.as_mut().expect("a local server");
                    if let Ok(Some(status)) = child.try_wait() {
                        panic!(
                            "the Iceberg REST test server exited with {status}:\n{}",
                            self.log_text()
                        );
                    }
                    if waiting == mpsc::RecvTimeoutError::Disconnected {
                        std::thread::sleep(Duration::from_millis(50));
                    }
                }
            }
            assert!(
                Instant::now() < deadline,
                "the Iceberg REST test server did not listen within 60 s:\n{}",
                self.log_text()
            );
        }
    }

    fn external(options: IcebergRestBuilder, uri: String) -> IcebergRestServer {
        let mut server = IcebergRestServer {
            child: None,
            port: None,
            uri: uri.trim_end_matches('/').to_string(),
            prefix: None,
            token: std::env::var("WEIR_ICEBERG_REST_TOKEN").ok(),
            client: None,
            s3: options.s3,
            warehouse: None,
            log: None,
            _dir: None,
        };
        // The catalog's own prefix, as its /v1/config says (pyiceberg asks).
        let out = server.client(&["prefix"]);
        assert!(
            out.status.success(),
            "the Iceberg REST catalog at {} (WEIR_ICEBERG_REST_URI) does not answer:\n{}",
            server.uri,
            String::from_utf8_lossy(&out.stderr)
        );
        server.prefix = serde_json::from_slice(&out.stdout).expect("the prefix is JSON");
        server
    }

    /// The server's log (empty for an external catalog).
    pub fn log_text(&self) -> String {
        self.log
            .as_ref()
            .map(|log| std::fs::read_to_string(log.path()).unwrap_or_default())
            .unwrap_or_default()
    }

    /// The catalog's base URI, `http://127.0.0.1:<port>` (clients add `/v1/...`).
    pub fn uri(&self) -> &str {
        &self.uri
    }

    /// The prefix the catalog's `/v1/config` announces, if any.
    pub fn prefix(&self) -> Option<&str> {
        self.prefix.as_deref()
    }

    /// The bearer token the catalog requires (`--token`), if any.
    pub fn token(&self) -> Option<&str> {
        self.token.as_deref()
    }

    /// The OAuth2 client the catalog issues tokens to, if any.
    pub fn client_credentials(&self) -> Option<(&str, &str)> {
        self.client
            .as_ref()
            .map(|(id, secret)| (id.as_str(), secret.as_str()))
    }

    /// The warehouse new tables go under (`None` for an external catalog).
    pub fn warehouse(&self) -> Option<&str> {
        self.warehouse.as_deref()
    }

    /// Whether the API points at `WEIR_ICEBERG_REST_URI` rather than a
    /// server of its own.
    pub fn is_external(&self) -> bool {
        self.child.is_none()
    }

    /// Sets test-only faults (`POST /test/faults`), e.g.
    /// `{"commit_status": 503, "times": 1}` (the next commit is answered
    /// 503 and not applied) or `{"drop_answer_after_commit": 1}` (the next
    /// commit is applied, then the connection closed without an answer).
    /// Answers the pending faults; `Err` against an external catalog.
    pub fn inject(&self, faults: serde_json::Value) -> Result<serde_json::Value, String> {
        let (status, body) = self.test_http("POST", "/test/faults", &faults.to_string())?;
        if status != 200 {
            return Err(format!("POST /test/faults answered {status}: {body}"));
        }
        serde_json::from_str(&body).map_err(|e| format!("POST /test/faults answered {body:?}: {e}"))
    }

    /// Applied commits per table (`"ns.table"`, levels joined by "."),
    /// including commits whose answer a fault dropped; `Err` against an
    /// external catalog.
    pub fn commits(&self) -> Result<BTreeMap<String, u64>, String> {
        let (status, body) = self.test_http("GET", "/test/commits", "")?;
        if status != 200 {
            return Err(format!("GET /test/commits answered {status}: {body}"));
        }
        serde_json::from_str(&body).map_err(|e| format!("GET /test/commits answered {body:?}: {e}"))
    }

    /// One request to the test-only routes, over a plain connection (the
    /// crate has no HTTP client without the `serve` feature).
    fn test_http(&self, method: &str, path: &str, body: &str) -> Result<(u16, String), String> {
        let Some(port) = self.port else {
            return Err(format!(
                "fault injection is not supported against an external catalog ({})",
                self.uri
            ));
        };
        let mut stream =
            TcpStream::connect(("127.0.0.1", port)).map_err(|e| format!("connecting: {e}"))?;
        stream
            .set_read_timeout(Some(Duration::from_secs(30)))
            .map_err(|e| e.to_string())?;
        write!(
            stream,
            "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\
             Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .map_err(|e| format!("sending: {e}"))?;
        let mut response = String::new();
        stream
            .read_to_string(&mut response)
            .map_err(|e| format!("reading: {e}"))?;
        let status = response
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| format!("not an HTTP answer: {response:?}"))?;
        let body = response
            .split_once("\r\n\r\n")
            .map(|(_, body)| body.to_string())
            .unwrap_or_default();
        Ok((status, body))
    }

    /// The table's rows as pyiceberg's `RestCatalog` loads and scans it
    /// through this catalog.
    pub fn rows_via_pyiceberg(&self, namespace: &[&str], table: &str) -> RestRows {
        self.read("pyiceberg", namespace, table)
    }

    /// The table's rows as DuckDB's iceberg extension reads them with the
    /// catalog attached (`ATTACH '' (TYPE iceberg, ENDPOINT ...)`, a bearer
    /// token or OAuth2 secret when the catalog wants one).
    pub fn rows_via_duckdb(&self, namespace: &[&str], table: &str) -> RestRows {
        self.read("duckdb", namespace, table)
    }

    fn read(&self, reader: &str, namespace: &[&str], table: &str) -> RestRows {
        self.read_all(reader, &[(namespace, table)])
            .pop()
            .expect("one table read")
    }

    /// Several tables' rows (namespace, name) with one reader, in the
    /// order given, from one Python start (each start costs about a second
    /// of CPU, most of a short read).
    pub fn rows_of_tables(&self, reader: &str, tables: &[(&[&str], &str)]) -> Vec<RestRows> {
        assert!(
            matches!(reader, "pyiceberg" | "duckdb"),
            "no reader {reader}"
        );
        self.read_all(reader, tables)
    }

    fn read_all(&self, reader: &str, tables: &[(&[&str], &str)]) -> Vec<RestRows> {
        let wanted = serde_json::to_string(tables).expect("names are JSON");
        let out = self.client(&[reader, &wanted]);
        let names: Vec<String> = tables
            .iter()
            .map(|(ns, name)| format!("{}.{name}", ns.join(".")))
            .collect();
        assert!(
            out.status.success(),
            "reading {names:?} with {reader} through {} failed:\n{}\nserver log:\n{}",
            self.uri,
            String::from_utf8_lossy(&out.stderr),
            self.log_text()
        );
        let read: Vec<serde_json::Value> =
            serde_json::from_slice(&out.stdout).expect("the rows are JSON");
        assert_eq!(read.len(), tables.len(), "one answer per table");
        read.iter().map(rest_rows).collect()
    }
}

/// One table's rows as the client prints them.
fn rest_rows(json: &serde_json::Value) -> RestRows {
    let columns = json["columns"]
        .as_array()
        .expect("columns")
        .iter()
        .map(|c| c.as_str().expect("a column name").to_string())
        .collect();
    let mut rows: Vec<Vec<Option<String>>> = json["rows"]
        .as_array()
        .expect("rows")
        .iter()
        .map(|r| {
            r.as_array()
                .expect("a row")
                .iter()
                .map(|v| v.as_str().map(str::to_string))
                .collect()
        })
        .collect();
    rows.sort();
    RestRows { columns, rows }
}

impl IcebergRestServer {
    /// Runs Python with `catalog` (pyiceberg's `RestCatalog` on this
    /// catalog, with its auth and S3 settings), `pa` (pyarrow) and `json`
    /// bound; answers what it printed. For a test's own set-up, e.g.
    /// `catalog.create_namespace("shop")`.
    pub fn pyiceberg(&self, code: &str) -> String {
        let out = self.client(&["exec", code]);
        assert!(
            out.status.success(),
            "pyiceberg on {} failed:\n{}\nserver log:\n{}",
            self.uri,
            String::from_utf8_lossy(&out.stderr),
            self.log_text()
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn client(&self, args: &[&str]) -> Output {
        let mut command = Command::new(python());
        command
            .args(["-c", CLIENT])
            .arg(workspace())
            .args(args)
            .env("WEIR_REST_URI", &self.uri)
            .env_remove("WEIR_REST_TOKEN")
            .env_remove("WEIR_REST_CREDENTIAL")
            .env_remove("WEIR_S3_ENDPOINT")
            // Nothing of the machine's own AWS set-up may leak in.
            .env_remove("AWS_PROFILE")
            .env_remove("AWS_SESSION_TOKEN")
            .env_remove("AWS_ENDPOINT_URL");
        // OAuth2 when the catalog issues tokens (it exercises more), else
        // the static token.
        if let Some((id, secret)) = &self.client {
            command.env("WEIR_REST_CREDENTIAL", format!("{id}:{secret}"));
        } else if let Some(token) = &self.token {
            command.env("WEIR_REST_TOKEN", token);
        }
        if let Some(s3) = &self.s3 {
            command
                .env("WEIR_S3_ENDPOINT", &s3.endpoint)
                .env("AWS_ACCESS_KEY_ID", &s3.access_key)
                .env("AWS_SECRET_ACCESS_KEY", &s3.secret_key)
                .env("AWS_DEFAULT_REGION", &s3.region);
        }
        command.output().expect("python runs")
    }
}

impl Drop for IcebergRestServer {
    fn drop(&mut self) {
        if let Some(child) = &mut self.child {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The server answers pyiceberg's `RestCatalog`, a fault stops one
    /// commit without applying it, and both readers read the same rows
    /// through the endpoint.
    #[test]
    fn iceberg_rest_round_trip() {
        let server = IcebergRestServer::start();
        // Unique, so the test can also run against an external catalog.
        let namespace = format!(
            "weir_rest_{}_{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_millis()
        );
        if !server.is_external() {
            let pending = server
                .inject(serde_json::json!({"commit_status": 503, "times": 1}))
                .expect("faults are injectable");
            assert_eq!(pending["times"], 1);
        }
        let external = if server.is_external() {
            "True"
        } else {
            "False"
        };
        let printed = server.pyiceberg(&format!(
            r#"
from pyiceberg.exceptions import ServiceUnavailableError
catalog.create_namespace("{namespace}")
schema = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("name", pa.string())])
table = catalog.create_table(("{namespace}", "customers"), schema=schema)
rows = pa.table({{"id": [1, 2, 3], "name": ["ada", None, "grace"]}}, schema=schema)
if not {external}:
    try:
        table.append(rows)
        raise SystemExit("the injected 503 did not stop the commit")
    except ServiceUnavailableError:
        print("503")
    table = catalog.load_table(("{namespace}", "customers"))
table.append(rows)
print(len(catalog.load_table(("{namespace}", "customers")).metadata.snapshots))
"#
        ));
        let expected_output = if server.is_external() {
            "1\n"
        } else {
            "503\n1\n"
        };
        assert_eq!(
            printed,
            expected_output,
            "server log:\n{}",
            server.log_text()
        );
        if !server.is_external() {
            let commits = server.commits().expect("commits are counted");
            assert_eq!(commits.get(&format!("{namespace}.customers")), Some(&1));
        }

        let want = RestRows {
            columns: vec!["id".into(), "name".into()],
            rows: vec![
                vec![Some("1".into()), Some("ada".into())],
                vec![Some("2".into()), None],
                vec![Some("3".into()), Some("grace".into())],
            ],
        };
        assert_eq!(server.rows_via_pyiceberg(&[&namespace], "customers"), want);
        assert_eq!(server.rows_via_duckdb(&[&namespace], "customers"), want);
    }
}
