//! `weir serve` in a test: a host file written from values, the real
//! binary started on a free loopback port with random tokens, a blocking
//! client for its admin API (docs/serve.md), and new versions of a plugin
//! to swap in. The process is killed when the guard drops, also when the
//! test panics; its log is kept in a file the test can search.

use std::collections::BTreeMap;
use std::fmt;
use std::fs::File;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use rand::Rng;
use rand::distr::Alphanumeric;
use serde::Serialize;
use serde_json::Value;
use sha2::{Digest, Sha256};
use ureq::AsSendBody;
use ureq::http::Request;
use wasm_encoder::{
    Component, ComponentSection, CustomSection, InstanceSection, MemorySection, MemoryType, Module,
    ModuleArg, ModuleSection,
};
use wasmparser::{Parser, Payload};

use crate::command::weir_command;
use crate::pipeline::PipelineBuilder;

/// The environment variable the operator token is passed in.
const OPERATOR_TOKEN_ENV: &str = "WEIR_TEST_OPERATOR_TOKEN";

/// How long one admin request may take before the test gives up on it:
/// a plugin upload waits for compiling and instantiating the new version.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(120);

/// How long `weir serve` may take to answer `/health` after it starts.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// One tenant of the host file, with the limits a test does not care about
/// set high enough not to get in the way.
#[derive(Clone, Debug)]
pub struct Tenant {
    name: String,
    max_pipelines: u32,
    max_memory_mb: u64,
    max_stored_mb: u64,
    log_lines_per_second: u64,
    log_burst: u64,
    http: Vec<String>,
    tcp: Vec<String>,
    max_instances: Option<usize>,
    max_sockets: Option<usize>,
    postgres: Vec<String>,
    /// A root on object storage instead of a folder: its URL and options.
    object_root: Option<(String, BTreeMap<String, String>)>,
}

impl Tenant {
    /// Tenant `name`, its root `data/<name>`: 4 pipelines, 1024 MiB of sink
    /// memory, 10 GiB stored, 1000 log lines a second, no network grants.
    pub fn new(name: &str) -> Self {
        Tenant {
            name: name.into(),
            max_pipelines: 4,
            max_memory_mb: 1024,
            max_stored_mb: 10_240,
            log_lines_per_second: 1000,
            log_burst: 2000,
            http: Vec::new(),
            tcp: Vec::new(),
            max_instances: None,
            max_sockets: None,
            postgres: Vec::new(),
            object_root: None,
        }
    }

    /// The slots of the host's instance pool its sinks may hold together
    /// (the host's default when not set).
    pub fn max_instances(mut self, slots: usize) -> Self {
        self.max_instances = Some(slots);
        self
    }

    /// The sockets and HTTP connections its sinks may hold together (the
    /// host's default when not set).
    pub fn max_sockets(mut self, sockets: usize) -> Self {
        self.max_sockets = Some(sockets);
        self
    }

    /// The most pipelines the tenant may have.
    pub fn max_pipelines(mut self, pipelines: u32) -> Self {
        self.max_pipelines = pipelines;
        self
    }

    /// The sum of `memory_mb` over the tenant's sink instances.
    pub fn max_memory_mb(mut self, mb: u64) -> Self {
        self.max_memory_mb = mb;
        self
    }

    /// What all the tenant's blob stores may hold together.
    pub fn max_stored_mb(mut self, mb: u64) -> Self {
        self.max_stored_mb = mb;
        self
    }

    /// Log lines per second and burst, for all the tenant's sinks together.
    pub fn log_rate(mut self, lines_per_second: u64, burst: u64) -> Self {
        self.log_lines_per_second = lines_per_second;
        self.log_burst = burst;
        self
    }

    /// Lets the tenant's sinks be granted HTTP to `pattern`.
    pub fn grant_http(mut self, pattern: &str) -> Self {
        self.http.push(pattern.into());
        self
    }

    /// Lets its pipelines read the Postgres servers `pattern` (`host:port`)
    /// matches (`sources.postgres`).
    pub fn grant_postgres(mut self, pattern: &str) -> Self {
        self.postgres.push(pattern.into());
        self
    }

    /// Lets the tenant's sinks be granted TCP to `pattern`.
    pub fn grant_tcp(mut self, pattern: &str) -> Self {
        self.tcp.push(pattern.into());
        self
    }

    /// The environment variable its token is passed in.
    fn token_env(&self) -> String {
        let upper: String = self
            .name
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() {
                    c.to_ascii_uppercase()
                } else {
                    '_'
                }
            })
            .collect();
        format!("WEIR_TEST_TOKEN_{upper}")
    }

    fn root(&self) -> String {
        format!("data/{}", self.name)
    }

    /// The tenant's root on object storage (`s3://bucket/prefix`), with the
    /// object store's options (`root_options` in the host file).
    pub fn object_root(mut self, url: &str, options: BTreeMap<String, String>) -> Self {
        self.object_root = Some((url.into(), options));
        self
    }
}

/// The host file as docs/serve.md describes it. JSON is valid YAML.
#[derive(Serialize)]
struct HostFile {
    listen: String,
    state_dir: &'static str,
    pipelines_dir: String,
    watch_interval_ms: u64,
    shutdown_grace_ms: u64,
    operator_token_env: &'static str,
    restart: Restart,
    #[serde(skip_serializing_if = "serde_json::Map::is_empty")]
    admin: serde_json::Map<String, Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    cluster: Option<serde_json::Map<String, Value>>,
    tenants: BTreeMap<String, TenantEntry>,
}

#[derive(Clone, Copy, Debug, Serialize)]
struct Restart {
    first_backoff_ms: u64,
    max_backoff_ms: u64,
    max_failures: u32,
    rollback_within_commits: u64,
}

#[derive(Serialize)]
struct TenantEntry {
    token_env: String,
    root: String,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    root_options: BTreeMap<String, String>,
    max_pipelines: u32,
    max_memory_mb: u64,
    max_stored_mb: u64,
    log_lines_per_second: u64,
    log_burst: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_instances: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_sockets: Option<usize>,
    grants: Grants,
    sources: Sources,
}

#[derive(Serialize)]
struct Sources {
    postgres: Vec<String>,
}

#[derive(Serialize)]
struct Grants {
    http: Vec<String>,
    tcp: Vec<String>,
}

/// How a [`ServeHost`] is set up before it starts.
#[derive(Clone, Debug)]
pub struct ServeHostBuilder {
    tenants: Vec<Tenant>,
    watch_interval_ms: u64,
    shutdown_grace_ms: u64,
    restart: Restart,
    log_filter: String,
    admin: serde_json::Map<String, Value>,
    max_open_files: Option<u64>,
    cluster: Option<serde_json::Map<String, Value>>,
    shared: Option<PathBuf>,
    /// Tokens derived from this instead of drawn at random: hosts of one
    /// cluster built with the same take the same tokens.
    token_seed: Option<String>,
    own_pipelines: bool,
}

impl ServeHostBuilder {
    /// Keeps this host's pipelines folder its own (under its folder) even
    /// with [`ServeHostBuilder::shared`]: only the tenants' data is shared,
    /// and a cluster's plugin store keeps the folders alike.
    pub fn own_pipelines_folder(mut self) -> Self {
        self.own_pipelines = true;
        self
    }

    /// Joins the cluster on `etcd` as host `name`: the host file's
    /// `cluster:` with these and the settings a test gives with
    /// [`ServeHostBuilder::cluster_setting`].
    pub fn cluster(mut self, endpoint: &str, name: &str) -> Self {
        let mut section = serde_json::Map::new();
        section.insert("endpoints".into(), Value::from(vec![endpoint.to_string()]));
        section.insert("name".into(), Value::from(name));
        self.cluster = Some(section);
        self
    }

    /// Sets `cluster.<key>` (after [`ServeHostBuilder::cluster`]).
    pub fn cluster_setting(mut self, key: &str, value: impl Into<Value>) -> Self {
        self.cluster
            .as_mut()
            .expect("cluster() first")
            .insert(key.into(), value.into());
        self
    }

    /// Puts the pipelines folder and the tenants' roots under `dir`, which
    /// the cluster's hosts share (each keeps its own state folder).
    pub fn shared(mut self, dir: &Path) -> Self {
        self.shared = Some(dir.to_path_buf());
        self
    }
    /// Takes tokens derived from `seed`, as every host built with the same
    /// seed does: the hosts of a cluster, which forward a caller's token to
    /// each other, take the same tokens.
    pub fn shared_tokens(mut self, seed: &str) -> Self {
        self.token_seed = Some(seed.to_string());
        self
    }

    /// Adds a tenant.
    pub fn tenant(mut self, tenant: Tenant) -> Self {
        self.tenants.push(tenant);
        self
    }

    /// How often the pipelines folder is looked at (default 200 ms).
    pub fn watch_interval_ms(mut self, ms: u64) -> Self {
        self.watch_interval_ms = ms;
        self
    }

    /// The bound on the exit after SIGTERM (default 10 s).
    pub fn shutdown_grace_ms(mut self, ms: u64) -> Self {
        self.shutdown_grace_ms = ms;
        self
    }

    /// A failed pipeline's restarts: the first back-off, its cap, and the
    /// failures in a row after which it is parked (default 200 ms, 2 s, 3).
    pub fn restart(
        mut self,
        first_backoff_ms: u64,
        max_backoff_ms: u64,
        max_failures: u32,
    ) -> Self {
        self.restart = Restart {
            first_backoff_ms,
            max_backoff_ms,
            max_failures,
            ..self.restart
        };
        self
    }

    /// A version swapped in that fails its pipeline before this many
    /// commits is rolled back on its own (`restart.rollback_within_commits`;
    /// default 0, never).
    pub fn rollback_within_commits(mut self, commits: u64) -> Self {
        self.restart.rollback_within_commits = commits;
        self
    }

    /// Sets `admin.<key>` in the host file (the API's timeouts and caps;
    /// docs/serve.md); unset keys keep the host's defaults.
    pub fn admin(mut self, key: &str, value: impl Into<Value>) -> Self {
        self.admin.insert(key.into(), value.into());
        self
    }

    /// Starts the host with at most `descriptors` open files (its
    /// RLIMIT_NOFILE), so a test can run it out of them.
    pub fn max_open_files(mut self, descriptors: u64) -> Self {
        self.max_open_files = Some(descriptors);
        self
    }

    /// The host's `WEIR_LOG` filter (default `info`).
    pub fn log(mut self, filter: &str) -> Self {
        self.log_filter = filter.into();
        self
    }

    /// Writes the host file into a fresh temporary folder, starts
    /// `weir serve` on it and waits until `/health` answers 200.
    pub fn start(self) -> ServeHost {
        let dir = tempfile::tempdir().expect("a temporary folder");
        let port = free_port();
        let token = |name: &str| match &self.token_seed {
            Some(seed) => sha256_hex(format!("{seed}/{name}").as_bytes())[..32].to_string(),
            None => random_token(),
        };
        let operator_token = token("operator");
        let mut tokens = BTreeMap::new();
        let mut entries = BTreeMap::new();
        for tenant in &self.tenants {
            tokens.insert(
                tenant.name.clone(),
                token(&format!("tenant {}", tenant.name)),
            );
            entries.insert(
                tenant.name.clone(),
                TenantEntry {
                    token_env: tenant.token_env(),
                    root: match (&tenant.object_root, &self.shared) {
                        (Some((url, _)), _) => url.clone(),
                        (None, Some(shared)) => shared.join(tenant.root()).display().to_string(),
                        (None, None) => tenant.root(),
                    },
                    root_options: tenant
                        .object_root
                        .as_ref()
                        .map(|(_, options)| options.clone())
                        .unwrap_or_default(),
                    max_pipelines: tenant.max_pipelines,
                    max_memory_mb: tenant.max_memory_mb,
                    max_stored_mb: tenant.max_stored_mb,
                    log_lines_per_second: tenant.log_lines_per_second,
                    log_burst: tenant.log_burst,
                    max_instances: tenant.max_instances,
                    max_sockets: tenant.max_sockets,
                    grants: Grants {
                        http: tenant.http.clone(),
                        tcp: tenant.tcp.clone(),
                    },
                    sources: Sources {
                        postgres: tenant.postgres.clone(),
                    },
                },
            );
            // Where the tenant's pipelines name their plugins.
            let base = self
                .shared
                .clone()
                .filter(|_| !self.own_pipelines)
                .unwrap_or_else(|| dir.path().to_path_buf());
            std::fs::create_dir_all(base.join("pipelines").join(&tenant.name))
                .expect("the tenant's pipelines folder");
        }
        let host_file = HostFile {
            listen: format!("127.0.0.1:{port}"),
            state_dir: "state",
            pipelines_dir: match &self.shared {
                Some(shared) if !self.own_pipelines => {
                    shared.join("pipelines").display().to_string()
                }
                _ => "pipelines".into(),
            },
            cluster: self.cluster.clone(),
            watch_interval_ms: self.watch_interval_ms,
            shutdown_grace_ms: self.shutdown_grace_ms,
            operator_token_env: OPERATOR_TOKEN_ENV,
            restart: self.restart,
            admin: self.admin.clone(),
            tenants: entries,
        };
        let host_path = dir.path().join("host.yaml");
        let text = serde_json::to_string_pretty(&host_file).expect("the host file serializes");
        std::fs::write(&host_path, text).expect("the host file is written");

        let log = dir.path().join("serve.log");
        let mut env = vec![(OPERATOR_TOKEN_ENV.to_string(), operator_token.clone())];
        for tenant in &self.tenants {
            env.push((tenant.token_env(), tokens[&tenant.name].clone()));
        }
        let launch = Launch {
            log_filter: self.log_filter.clone(),
            max_open_files: self.max_open_files,
            env,
        };
        let child = launch.spawn(dir.path(), &log);
        let agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(REQUEST_TIMEOUT))
            .build()
            .into();
        let mut host = ServeHost {
            launch,
            shared: self.shared.clone(),
            own_pipelines: self.own_pipelines,
            dir,
            child,
            exited: None,
            port,
            operator_token,
            tokens,
            log,
            agent,
        };
        host.wait_until_healthy();
        host
    }
}

/// How `weir serve` is started on a host file, the first time and again.
#[derive(Clone, Debug)]
struct Launch {
    log_filter: String,
    max_open_files: Option<u64>,
    /// The operator's and the tenants' tokens, by variable.
    env: Vec<(String, String)>,
}

impl Launch {
    /// Starts `weir serve` on `dir`'s host file, adding its output to `log`.
    fn spawn(&self, dir: &Path, log: &Path) -> Child {
        let out = File::options()
            .create(true)
            .append(true)
            .open(log)
            .expect("the log file");
        let err = out.try_clone().expect("the log file, twice");
        let mut command = weir_command();
        command
            .arg("serve")
            .arg(dir.join("host.yaml"))
            .current_dir(dir)
            .env("WEIR_LOG", &self.log_filter)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err);
        for (variable, value) in &self.env {
            command.env(variable, value);
        }
        if let Some(descriptors) = self.max_open_files {
            limit_open_files(&mut command, descriptors);
        }
        command.spawn().expect("`weir serve` starts")
    }
}

/// A running `weir serve`, killed when dropped.
pub struct ServeHost {
    launch: Launch,
    dir: tempfile::TempDir,
    /// The folder the cluster's hosts share, if any.
    shared: Option<PathBuf>,
    /// The pipelines folder is this host's own even with `shared`.
    own_pipelines: bool,
    child: Child,
    exited: Option<ExitStatus>,
    port: u16,
    operator_token: String,
    tokens: BTreeMap<String, String>,
    log: PathBuf,
    agent: ureq::Agent,
}

/// An answer of the admin API: its HTTP status and its body as text.
#[derive(Clone, Debug)]
pub struct Reply {
    pub code: u16,
    pub body: String,
}

impl Reply {
    /// The body as JSON; panics, showing the reply, if it is not.
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.body)
            .unwrap_or_else(|e| panic!("the reply is not JSON ({e}): {self}"))
    }

    /// A 2xx status.
    pub fn is_success(&self) -> bool {
        (200..300).contains(&self.code)
    }

    /// The `error` of an error reply, or the whole body if it has none.
    pub fn error(&self) -> String {
        serde_json::from_str::<Value>(&self.body)
            .ok()
            .and_then(|v| v["error"].as_str().map(str::to_string))
            .unwrap_or_else(|| self.body.clone())
    }
}

impl fmt::Display for Reply {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "HTTP {}: {}", self.code, self.body)
    }
}

impl ServeHost {
    /// A host with no tenants yet; add them with [`ServeHostBuilder::tenant`].
    pub fn builder() -> ServeHostBuilder {
        ServeHostBuilder {
            tenants: Vec::new(),
            watch_interval_ms: 200,
            shutdown_grace_ms: 10_000,
            restart: Restart {
                first_backoff_ms: 200,
                max_backoff_ms: 2_000,
                max_failures: 3,
                rollback_within_commits: 0,
            },
            log_filter: "info".into(),
            admin: serde_json::Map::new(),
            max_open_files: None,
            cluster: None,
            shared: None,
            token_seed: None,
            own_pipelines: false,
        }
    }

    /// The folder holding the host file, its state, pipelines and data.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// `http://127.0.0.1:PORT`.
    pub fn base_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The process id of `weir serve`.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Everything the host wrote to stdout and stderr so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The operator's token: it reaches every pipeline.
    pub fn operator_token(&self) -> &str {
        &self.operator_token
    }

    /// Tenant `tenant`'s token.
    pub fn token(&self, tenant: &str) -> &str {
        self.tokens
            .get(tenant)
            .unwrap_or_else(|| panic!("no tenant {tenant} in this host"))
    }

    /// `<pipelines_dir>/<tenant>/`: the watched folder of the tenant's
    /// pipeline files, where their plugin paths are resolved.
    pub fn pipelines_dir(&self, tenant: &str) -> PathBuf {
        let base = if self.own_pipelines {
            self.dir.path()
        } else {
            self.base()
        };
        base.join("pipelines").join(tenant)
    }

    /// Where the pipelines and the tenants' data lie: the shared folder of
    /// a cluster, or the host's own.
    fn base(&self) -> &Path {
        self.shared.as_deref().unwrap_or(self.dir.path())
    }

    /// The tenant's root: every blob store of its sinks lies in it.
    pub fn tenant_root(&self, tenant: &str) -> PathBuf {
        self.base().join("data").join(tenant)
    }

    /// Where a sink whose blob store `url` is relative (by default its
    /// name) keeps its blobs: `<tenant root>/<pipeline>/<url>`.
    pub fn sink_root(&self, tenant: &str, pipeline: &str, url: &str) -> PathBuf {
        self.tenant_root(tenant).join(pipeline).join(url)
    }

    /// Writes a plugin into the tenant's pipelines folder, where a pipeline
    /// names it by `file_name`.
    pub fn add_plugin(&self, tenant: &str, file_name: &str, bytes: &[u8]) -> PathBuf {
        let path = self.pipelines_dir(tenant).join(file_name);
        let partial = partial_path(&path);
        std::fs::write(&partial, bytes)
            .and_then(|()| std::fs::rename(&partial, &path))
            .unwrap_or_else(|e| panic!("cannot write {}: {e}", path.display()));
        path
    }

    /// Creates or changes a test pipeline through the API: copies every
    /// sink's plugin into the tenant's pipelines folder and puts the
    /// pipeline as [`PipelineBuilder::for_serve`] writes it.
    pub fn deploy(&self, tenant: &str, pipeline: &PipelineBuilder, token: &str) -> Reply {
        for plugin in pipeline.plugins() {
            let name = plugin.file_name().expect("a plugin path names a file");
            let target = self.pipelines_dir(tenant).join(name);
            if plugin.is_absolute() && plugin != target {
                // Copied beside it and renamed into place, as an operator
                // should: the hosts watching the folder (every host of a
                // cluster sharing it) must never read a plugin half copied.
                let partial = partial_path(&target);
                std::fs::copy(plugin, &partial)
                    .and_then(|_| std::fs::rename(&partial, &target))
                    .unwrap_or_else(|e| {
                        panic!(
                            "cannot copy {} into the pipelines folder: {e}",
                            plugin.display()
                        )
                    });
            }
        }
        let text = pipeline.clone().for_serve().text();
        self.put_pipeline(tenant, pipeline.pipeline_name(), &text, token)
    }

    /// `PUT /v1/pipelines/{tenant}/{pipeline}` with the pipeline's YAML.
    pub fn put_pipeline(&self, tenant: &str, pipeline: &str, yaml: &str, token: &str) -> Reply {
        let path = pipeline_path(tenant, pipeline);
        self.send("PUT", &path, Some(token), Some(yaml.as_bytes()))
    }

    /// `GET /v1/pipelines/{tenant}/{pipeline}?local=true`, which must
    /// answer 200: this host's own view (in a cluster, a host that does not
    /// run the pipeline would otherwise answer with its owner's).
    pub fn status(&self, tenant: &str, pipeline: &str, token: &str) -> Value {
        let reply = self.get_with(&local(&pipeline_path(tenant, pipeline)), token);
        assert_eq!(reply.code, 200, "status of {tenant}/{pipeline}: {reply}");
        reply.json()
    }

    /// `GET /v1/pipelines`: the pipelines the token reaches.
    pub fn list(&self, token: &str) -> Reply {
        self.get_with("/v1/pipelines", token)
    }

    /// `POST .../pause`.
    pub fn pause(&self, tenant: &str, pipeline: &str, token: &str) -> Reply {
        self.post(tenant, pipeline, "pause", token)
    }

    /// `POST .../resume`.
    pub fn resume(&self, tenant: &str, pipeline: &str, token: &str) -> Reply {
        self.post(tenant, pipeline, "resume", token)
    }

    /// `POST .../stop`.
    pub fn stop(&self, tenant: &str, pipeline: &str, token: &str) -> Reply {
        self.post(tenant, pipeline, "stop", token)
    }

    /// `POST .../start`.
    pub fn start(&self, tenant: &str, pipeline: &str, token: &str) -> Reply {
        self.post(tenant, pipeline, "start", token)
    }

    /// `DELETE /v1/pipelines/{tenant}/{pipeline}`.
    pub fn delete(&self, tenant: &str, pipeline: &str, token: &str) -> Reply {
        self.send(
            "DELETE",
            &pipeline_path(tenant, pipeline),
            Some(token),
            None,
        )
    }

    /// `PUT .../sinks/{sink}/plugin` with the `.wasm` as the body, pinned
    /// by `?sha256=` when given.
    pub fn replace_plugin(
        &self,
        tenant: &str,
        pipeline: &str,
        sink: &str,
        wasm: &[u8],
        sha256: Option<&str>,
        token: &str,
    ) -> Reply {
        let mut path = format!("{}/sinks/{sink}/plugin", pipeline_path(tenant, pipeline));
        if let Some(digest) = sha256 {
            path += &format!("?sha256={digest}");
        }
        self.send("PUT", &path, Some(token), Some(wasm))
    }

    /// `PUT /v1/tenants/{tenant}/plugins/{sha256}` with `wasm` as the body:
    /// a plugin kept for pipeline files to name as `sha256:<digest>`.
    pub fn upload_plugin(&self, tenant: &str, sha256: &str, wasm: &[u8], token: &str) -> Reply {
        let path = format!("/v1/tenants/{tenant}/plugins/{sha256}");
        self.send("PUT", &path, Some(token), Some(wasm))
    }

    /// `<state_dir>/tenants/<tenant>/plugins`: the tenant's uploaded
    /// plugins, each kept as `<sha256>.wasm`.
    pub fn uploads_dir(&self, tenant: &str) -> PathBuf {
        self.dir
            .path()
            .join("state")
            .join("tenants")
            .join(tenant)
            .join("plugins")
    }

    /// `weir ctl ARGS` against this host with `token`; its output.
    pub fn ctl(&self, args: &[&str], token: &str) -> std::process::Output {
        weir_command()
            .arg("ctl")
            .args(args)
            .env("WEIR_SERVER", self.base_url())
            .env("WEIR_TOKEN", token)
            .env("WEIR_LOG", "warn")
            .output()
            .expect("weir ctl runs")
    }

    /// Stops `weir serve` with SIGTERM (it must exit successfully within
    /// its shutdown grace and 5 s more) and starts it again on the same
    /// host file, folders, port and tokens; waits until `/health` answers.
    pub fn restart(&mut self, shutdown_grace: Duration) {
        self.sigterm();
        let bound = shutdown_grace + Duration::from_secs(5);
        let status = self
            .wait_exit(bound)
            .unwrap_or_else(|| panic!("`weir serve` still runs {bound:?} after SIGTERM"));
        assert!(
            status.success(),
            "`weir serve` exited with {status} after SIGTERM\n{}",
            self.log_tail(60)
        );
        self.child = self.launch.spawn(self.dir.path(), &self.log);
        self.exited = None;
        self.wait_until_healthy();
    }

    /// `POST .../sinks/{sink}/rollback`.
    pub fn rollback(&self, tenant: &str, pipeline: &str, sink: &str, token: &str) -> Reply {
        let path = format!("{}/sinks/{sink}/rollback", pipeline_path(tenant, pipeline));
        self.send("POST", &path, Some(token), Some(&[]))
    }

    /// An unauthenticated `GET` (`/health`, `/ready`).
    pub fn get(&self, path: &str) -> Reply {
        self.send("GET", path, None, None)
    }

    /// A `GET` with a bearer token.
    pub fn get_with(&self, path: &str, token: &str) -> Reply {
        self.send("GET", path, Some(token), None)
    }

    /// Polls the pipeline's status on this host (its own view, with the
    /// operator's token) until its `state` is `state`, and returns that
    /// status; panics with the last status and the log's tail after
    /// `timeout`.
    pub fn wait_for_state(
        &self,
        tenant: &str,
        pipeline: &str,
        state: &str,
        timeout: Duration,
    ) -> Value {
        let deadline = Instant::now() + timeout;
        let path = local(&pipeline_path(tenant, pipeline));
        loop {
            let reply = self.get_with(&path, &self.operator_token);
            if reply.code == 200 && reply.json()["state"] == state {
                return reply.json();
            }
            if Instant::now() >= deadline {
                panic!(
                    "{tenant}/{pipeline} is not {state} after {timeout:?}; its status: {reply}\n{}",
                    self.log_tail(60)
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Kills `weir serve` at once (SIGKILL), as a machine that dies.
    pub fn sigkill(&mut self) {
        crate::etcd::signal(self.child.id(), libc::SIGKILL);
        let _ = self.child.wait().map(|status| self.exited = Some(status));
    }

    /// Stops `weir serve` where it is (SIGSTOP), as a stalled machine: it
    /// holds its connections and does nothing until [`ServeHost::sigcont`].
    pub fn sigstop(&self) {
        crate::etcd::signal(self.child.id(), libc::SIGSTOP);
    }

    /// Lets a stopped `weir serve` go on (SIGCONT).
    pub fn sigcont(&self) {
        crate::etcd::signal(self.child.id(), libc::SIGCONT);
    }

    /// Sends SIGTERM to `weir serve`.
    pub fn sigterm(&self) {
        let pid = libc::pid_t::try_from(self.child.id()).expect("a pid fits pid_t");
        // SAFETY: kill(2) with a pid we spawned and still hold (not reaped,
        // so it cannot have been reused) and a valid signal number.
        let result = unsafe { libc::kill(pid, libc::SIGTERM) };
        assert_eq!(
            result,
            0,
            "SIGTERM to {pid}: {}",
            std::io::Error::last_os_error()
        );
    }

    /// Waits up to `timeout` for `weir serve` to exit; `None` if it still
    /// runs.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.try_exit() {
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The last `lines` lines of the log, headed, for failure messages.
    pub fn log_tail(&self, lines: usize) -> String {
        let log = self.log();
        let all: Vec<&str> = log.lines().collect();
        let tail = all[all.len().saturating_sub(lines)..].join("\n");
        format!("--- the last {lines} lines of weir serve's log ---\n{tail}")
    }

    fn try_exit(&mut self) -> Option<ExitStatus> {
        if self.exited.is_none() {
            self.exited = self.child.try_wait().expect("waiting for weir serve");
        }
        self.exited
    }

    fn post(&self, tenant: &str, pipeline: &str, action: &str, token: &str) -> Reply {
        let path = format!("{}/{action}", pipeline_path(tenant, pipeline));
        self.send("POST", &path, Some(token), Some(&[]))
    }

    fn send(&self, method: &str, path: &str, token: Option<&str>, body: Option<&[u8]>) -> Reply {
        let mut request = Request::builder()
            .method(method)
            .uri(format!("{}{path}", self.base_url()));
        if let Some(token) = token {
            request = request.header("Authorization", format!("Bearer {token}"));
        }
        let what = format!("{method} {path}");
        match body {
            Some(bytes) => self.run(&what, request.body(bytes)),
            None => self.run(&what, request.body(())),
        }
    }

    fn run(
        &self,
        what: &str,
        request: Result<Request<impl AsSendBody>, ureq::http::Error>,
    ) -> Reply {
        let request = request.unwrap_or_else(|e| panic!("{what}: not a request: {e}"));
        let mut response = self
            .agent
            .run(request)
            .unwrap_or_else(|e| panic!("{what}: {e}\n{}", self.log_tail(40)));
        let code = response.status().as_u16();
        let body = response
            .body_mut()
            .read_to_string()
            .unwrap_or_else(|e| panic!("{what}: reading the reply: {e}"));
        Reply { code, body }
    }

    fn wait_until_healthy(&mut self) {
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if let Some(status) = self.try_exit() {
                panic!(
                    "`weir serve` exited with {status} before answering /health\n{}",
                    self.log_tail(80)
                );
            }
            let url = format!("{}/health", self.base_url());
            if let Ok(response) = self.agent.get(&url).call()
                && response.status() == 200
            {
                return;
            }
            if Instant::now() >= deadline {
                panic!(
                    "`weir serve` did not answer /health within {START_TIMEOUT:?}\n{}",
                    self.log_tail(80)
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for ServeHost {
    fn drop(&mut self) {
        if self.try_exit().is_none() {
            self.sigcont();
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        if std::thread::panicking() {
            eprintln!("{}", self.log_tail(120));
        }
    }
}

/// Sets the child's RLIMIT_NOFILE (soft and hard) before it runs.
fn limit_open_files(command: &mut Command, descriptors: u64) {
    use std::os::unix::process::CommandExt as _;
    let limit = libc::rlimit {
        rlim_cur: descriptors as libc::rlim_t,
        rlim_max: descriptors as libc::rlim_t,
    };
    // SAFETY: setrlimit(2) is async-signal-safe, the only kind of call
    // allowed between fork and exec; `limit` is a plain value copied in.
    unsafe {
        command.pre_exec(move || {
            if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) == 0 {
                Ok(())
            } else {
                Err(std::io::Error::last_os_error())
            }
        });
    }
}

pub fn pipeline_path(tenant: &str, pipeline: &str) -> String {
    format!("/v1/pipelines/{tenant}/{pipeline}")
}

/// `path` asking for the host's own view, not the owner's in a cluster.
fn local(path: &str) -> String {
    format!("{path}?local=true")
}

/// A loopback port nobody listens on now. Another process could take it
/// before `weir serve` binds it; then the start fails, naming the address.
fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("a free loopback port");
    listener.local_addr().expect("its address").port()
}

/// 32 random letters and digits.
fn random_token() -> String {
    rand::rng()
        .sample_iter(&Alphanumeric)
        .take(32)
        .map(char::from)
        .collect()
}

/// The SHA-256 of `bytes`, in lower-case hex (what `?sha256=` takes).
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// `component` with a custom section (id 0) `name` holding `payload`
/// appended: the same code under a new digest, a "new version" of a plugin
/// for swap tests.
pub fn with_custom_section(wasm: &[u8], name: &str, payload: &[u8]) -> Vec<u8> {
    let mut out = wasm.to_vec();
    CustomSection {
        name: name.into(),
        data: payload.into(),
    }
    .append_to_component(&mut out);
    out
}

/// How many core modules `component` holds at its top level.
fn top_level_modules(component: &[u8]) -> u32 {
    let mut depth = 0u32;
    let mut modules = 0;
    for payload in Parser::new(0).parse_all(component) {
        match payload.expect("a valid component") {
            Payload::ModuleSection { .. } => {
                if depth == 0 {
                    modules += 1;
                }
                depth += 1;
            }
            Payload::ComponentSection { .. } => depth += 1,
            Payload::End(_) => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    modules
}

/// `component` with `count` more core modules, each declaring one linear
/// memory of `mib` MiB and instantiated with the component: the memory is
/// held from instantiation on, though the sink never touches it. Over the
/// sink's memory limit, the component compiles and fails to instantiate.
pub fn with_extra_memories(component: &[u8], count: u32, mib: u32) -> Vec<u8> {
    let first = top_level_modules(component);
    let mut extra = Component::new();
    for _ in 0..count {
        let mut memories = MemorySection::new();
        memories.memory(MemoryType {
            minimum: u64::from(mib) * 16,
            maximum: None,
            memory64: false,
            shared: false,
            page_size_log2: None,
        });
        let mut module = Module::new();
        module.section(&memories);
        extra.section(&ModuleSection(&module));
    }
    let mut instances = InstanceSection::new();
    for i in 0..count {
        instances.instantiate(first + i, Vec::<(&str, ModuleArg)>::new());
    }
    extra.section(&instances);
    let extra = extra.finish();
    // Sections follow an 8-byte preamble; the component's own sections stay
    // first, so its indices are untouched and the new modules come after.
    let mut out = component.to_vec();
    out.extend_from_slice(&extra[8..]);
    out
}

/// A hidden name beside `path` (the watched folder skips hidden files), to
/// write a file under before renaming it into place.
fn partial_path(path: &Path) -> PathBuf {
    let name = path
        .file_name()
        .expect("a file path")
        .to_string_lossy()
        .into_owned();
    path.with_file_name(format!(".{name}.partial-{}", std::process::id()))
}
