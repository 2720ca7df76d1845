//! Pipeline configuration: YAML, `${VAR}` from the environment, validated up
//! front with errors that name the field.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Deserializer};
use weir_contract::{ContextField, Mode};

use weir_core::commit::CommitPolicy;
use weir_runtime::Limits;
use weir_runtime::capability::blobstore::BlobLimits;
use weir_runtime::capability::log::LogLimits;
use weir_runtime::engine::CompileLimits;
use weir_runtime::network::NetworkLimits;
use weir_source::mysql::MysqlConfig;
use weir_source::postgres::PostgresConfig;

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read pipeline config {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {detail}")]
    Invalid { path: PathBuf, detail: String },
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PipelineConfig {
    /// The pipeline's id: positions and epochs are kept under it.
    pub pipeline: String,
    /// Where the position store and the component cache live.
    #[serde(default = "default_state_dir")]
    pub state_dir: PathBuf,
    pub source: SourceConfig,
    #[serde(default)]
    pub batch: BatchConfig,
    #[serde(default, deserialize_with = "policy")]
    pub commit_policy: CommitPolicy,
    /// Context columns to materialize in the destination.
    #[serde(default)]
    pub metadata: Vec<MetadataConfig>,
    /// Per-table mapping onto destinations, keyed by source table name.
    #[serde(default)]
    pub tables: BTreeMap<String, TableConfig>,
    pub sinks: Vec<SinkConfig>,
    /// The folder relative paths are resolved against (the config file's).
    #[serde(skip)]
    pub base_dir: PathBuf,
    /// The pipeline file itself, which no sink's root may contain.
    #[serde(skip)]
    pub file: PathBuf,
}

fn default_state_dir() -> PathBuf {
    PathBuf::from(".weir")
}

/// Where changes come from: exactly one kind.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum SourceConfig {
    /// The built-in deterministic change generator.
    Generator(GeneratorSourceConfig),
    /// A PostgreSQL database, through logical replication (pgoutput).
    Postgres(PostgresConfig),
    /// A MySQL or MariaDB server, through its binlog.
    Mysql(MysqlConfig),
}

impl SourceConfig {
    /// The servers the source connects to (none for the generator).
    pub fn endpoints(&self) -> Result<Vec<weir_source::Endpoint>, String> {
        match self {
            SourceConfig::Generator(_) => Ok(Vec::new()),
            SourceConfig::Postgres(pg) => pg.endpoints(),
            SourceConfig::Mysql(my) => my.endpoints(),
        }
    }

    /// The kind of source, as a pipeline file names it under `source`.
    pub fn kind(&self) -> &'static str {
        match self {
            SourceConfig::Generator(_) => "generator",
            SourceConfig::Postgres(_) => "postgres",
            SourceConfig::Mysql(_) => "mysql",
        }
    }

    /// The generator's pause between transactions; zero for other sources.
    pub fn pace(&self) -> Duration {
        match self {
            SourceConfig::Generator(g) => Duration::from_micros(g.pace_us),
            SourceConfig::Postgres(_) | SourceConfig::Mysql(_) => Duration::ZERO,
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GeneratorSourceConfig {
    #[serde(default = "default_seed")]
    pub seed: u64,
    /// Stop after this many changes; absent means run until stopped.
    pub max_changes: Option<u64>,
    /// Pause between transactions, to make an endless stream gentle.
    #[serde(default)]
    pub pace_us: u64,
}

fn default_seed() -> u64 {
    42
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BatchConfig {
    #[serde(default = "default_max_rows")]
    pub max_rows: usize,
    #[serde(default = "default_max_bytes")]
    pub max_bytes: usize,
    #[serde(default = "default_linger_ms")]
    pub linger_ms: u64,
    /// How often idle tables are committed at the current position, so that
    /// they never hold back recovery or the source's acknowledgement. A
    /// heartbeat due while a commit is in flight rides on the next flush
    /// made for any reason (a full batch, the linger), or is flushed once
    /// that commit ends.
    #[serde(default = "default_heartbeat_ms")]
    pub heartbeat_ms: u64,
    /// How often what sinks with `positions` committed is copied into the
    /// host's position store. They hold their own positions, so the copy is
    /// for `weir status` and the source's acknowledgement, which waits for
    /// it; on a cluster each copy is an etcd transaction, kept off the
    /// commit path this way. 1000 (the default): once a second, and when the
    /// run pauses, stops or ends; 0: with every commit. (A slowdown once
    /// blamed on the deferral, an Iceberg pipeline on S3 in the cluster
    /// tests, was the run loop's heartbeat cutting a batch per transaction
    /// once commits outlasted it, with deferral or without.)
    #[serde(default = "default_record_positioned_ms")]
    pub record_positioned_ms: u64,
}

fn default_max_rows() -> usize {
    10_000
}
fn default_max_bytes() -> usize {
    16 << 20
}
fn default_linger_ms() -> u64 {
    500
}
fn default_heartbeat_ms() -> u64 {
    5_000
}
fn default_record_positioned_ms() -> u64 {
    1_000
}

impl Default for BatchConfig {
    fn default() -> Self {
        BatchConfig {
            max_rows: default_max_rows(),
            max_bytes: default_max_bytes(),
            linger_ms: default_linger_ms(),
            heartbeat_ms: default_heartbeat_ms(),
            record_positioned_ms: default_record_positioned_ms(),
        }
    }
}

impl BatchConfig {
    pub fn linger(&self) -> Duration {
        Duration::from_millis(self.linger_ms)
    }
    pub fn heartbeat(&self) -> Duration {
        Duration::from_millis(self.heartbeat_ms)
    }
    /// None: positioned sinks' commits are recorded one by one.
    pub fn record_positioned(&self) -> Option<Duration> {
        (self.record_positioned_ms > 0).then(|| Duration::from_millis(self.record_positioned_ms))
    }
}

fn policy<'de, D: Deserializer<'de>>(deserializer: D) -> Result<CommitPolicy, D::Error> {
    let text = String::deserialize(deserializer)?;
    CommitPolicy::parse(&text).ok_or_else(|| {
        let known: Vec<&str> = CommitPolicy::ALL.iter().map(|p| p.as_str()).collect();
        serde::de::Error::custom(format!(
            "commit_policy: `{text}` is not one of {}",
            known.join(", ")
        ))
    })
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MetadataConfig {
    /// One of op, pos, commit_ts, ingest_ts, snapshot, phase.
    #[serde(deserialize_with = "context_field")]
    pub from: ContextField,
    /// The destination column name.
    #[serde(rename = "as")]
    pub name: String,
}

fn context_field<'de, D: Deserializer<'de>>(deserializer: D) -> Result<ContextField, D::Error> {
    let text = String::deserialize(deserializer)?;
    text.parse().map_err(serde::de::Error::custom)
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TableConfig {
    /// `upsert` (the default; a keyless table is appended anyway) or `append`.
    #[serde(default, deserialize_with = "mode")]
    pub mode: Mode,
    /// Destination name; defaults to the source name.
    #[serde(rename = "as")]
    pub destination: Option<String>,
}

fn mode<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Mode, D::Error> {
    let text = String::deserialize(deserializer)?;
    Mode::parse(&text).ok_or_else(|| {
        serde::de::Error::custom(format!("mode: `{text}` is not `upsert` or `append`"))
    })
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SinkConfig {
    pub name: String,
    /// Path to the sink's `.wasm` component.
    pub plugin: PathBuf,
    /// Refuse the plugin unless its sha256 is this.
    pub sha256: Option<String>,
    /// A required sink that fails stops the pipeline; an optional one is
    /// disabled and the rest go on.
    #[serde(default = "yes")]
    pub required: bool,
    pub blob_store: BlobStoreConfig,
    /// Passed to the sink's `open` as is.
    #[serde(default)]
    pub config: BTreeMap<String, String>,
    #[serde(default)]
    pub limits: LimitsConfig,
    /// The hosts and ports the sink may reach; nothing by default.
    #[serde(default)]
    pub grants: GrantsConfig,
    /// How often a retryable error is retried before the sink counts as failed.
    #[serde(default = "default_retries")]
    pub retries: u32,
    /// Off unless set: where rows the sink refuses as poison are set aside
    /// so that the rest of their batch commits (docs/dead-letter.md).
    #[serde(default)]
    pub dead_letter: Option<DeadLetterConfig>,
}

/// `sinks[].dead_letter`: the valve for rows a sink refuses.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeadLetterConfig {
    /// Where the refused rows are written: a folder, `memory://` or an
    /// object store URL, as `blob_store.url` (under `weir serve`, a folder
    /// in the tenant's root).
    pub url: String,
    /// Options for the object store, as `blob_store.options`.
    #[serde(default)]
    pub options: BTreeMap<String, String>,
    /// The most rows of one batch that may be set aside; a batch with more
    /// refused rows still stops the pipeline.
    #[serde(default = "default_dead_letter_max_rows")]
    pub max_rows: u64,
    /// The largest share of one batch's rows that may be set aside, from 0
    /// (exclusive) to 1; past it the batch still stops the pipeline.
    #[serde(default = "default_dead_letter_max_share")]
    pub max_share: f64,
}

fn default_dead_letter_max_rows() -> u64 {
    100
}
fn default_dead_letter_max_share() -> f64 {
    1.0
}

fn yes() -> bool {
    true
}
fn default_retries() -> u32 {
    5
}

impl DeadLetterConfig {
    fn validate(&self, field: &str) -> Result<(), String> {
        if self.url.trim().is_empty() {
            return Err(format!("{field}.url: empty"));
        }
        if self.url.starts_with("memory:") {
            return Err(format!(
                "{field}.url: `{}` would lose the rows set aside when the host stops; name a \
                 folder or an object store",
                self.url
            ));
        }
        if self.max_rows == 0 {
            return Err(format!(
                "{field}.max_rows: must be at least 1 (leave `dead_letter` out to stop on every refused row)"
            ));
        }
        if !(self.max_share > 0.0 && self.max_share <= 1.0) {
            return Err(format!(
                "{field}.max_share: {} is outside (0, 1]",
                self.max_share
            ));
        }
        Ok(())
    }

    /// How many of a batch's `rows` may be set aside.
    pub fn allowed(&self, rows: usize) -> usize {
        let by_share = (self.max_share * rows as f64).floor() as usize;
        by_share.min(usize::try_from(self.max_rows).unwrap_or(usize::MAX))
    }
}

/// `sinks[].grants`: outgoing network access, as patterns (see
/// `weir_contract::grants` for their syntax).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GrantsConfig {
    /// `scheme://host[:port]` the sink may send HTTP requests to.
    #[serde(default)]
    pub http: Vec<String>,
    /// `host:port` the sink may open TCP connections to.
    #[serde(default)]
    pub tcp: Vec<String>,
}

impl GrantsConfig {
    /// The parsed grants; the error names the entry and what is wrong.
    pub fn parse(&self) -> Result<weir_contract::grants::Grants, String> {
        for (key, list) in [("http", &self.http), ("tcp", &self.tcp)] {
            for (j, pattern) in list.iter().enumerate() {
                let checked = match key {
                    "http" => weir_contract::grants::HttpGrant::parse(pattern).map(|_| ()),
                    _ => weir_contract::grants::TcpGrant::parse(pattern).map(|_| ()),
                };
                checked.map_err(|e| format!("grants.{key}[{j}] `{pattern}`: {}", e.why))?;
            }
        }
        weir_contract::grants::Grants::parse(&self.http, &self.tcp).map_err(|e| e.to_string())
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BlobStoreConfig {
    /// A folder (relative to the config file), `file://`, `memory://`, or an
    /// object store URL such as `s3://bucket/prefix`.
    pub url: String,
    /// Options for the object store (`aws_region`, `aws_endpoint`, ...).
    #[serde(default)]
    pub options: BTreeMap<String, String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitsConfig {
    #[serde(default = "default_memory_mb")]
    pub memory_mb: u64,
    #[serde(default = "default_call_timeout_ms")]
    pub call_timeout_ms: u64,
    /// The most bytes the sink may keep under its blob root; unset means
    /// [`BlobLimits::DEFAULT_MAX_STORED_BYTES`], or
    /// [`BlobLimits::DEFAULT_MAX_STORED_BYTES_MEMORY`] for a `memory://` root (which the host holds in its own memory).
    #[serde(default)]
    pub max_stored_mb: Option<u64>,
    /// The largest object one put may write or one get may read (a get is
    /// also bounded by `memory_mb`: the sink could not hold more).
    #[serde(default = "default_max_object_mb")]
    pub max_object_mb: u64,
    /// The most entries one `list` may return.
    #[serde(default = "default_max_list_entries")]
    pub max_list_entries: u64,
    /// The longest log message or error message the host keeps of the
    /// sink; longer ones are cut and marked.
    #[serde(default = "default_max_message_bytes")]
    pub max_message_bytes: u64,
    /// Log lines per second the sink may write on average...
    #[serde(default = "default_log_lines_per_second")]
    pub log_lines_per_second: u64,
    /// ...and at once, after a quiet spell; the rest is dropped and counted.
    #[serde(default = "default_log_burst")]
    pub log_burst: u64,
    /// The largest plugin file the host reads and compiles.
    #[serde(default = "default_max_plugin_mb")]
    pub max_plugin_mb: u64,
    /// The CPU time compiling the plugin may use (a cached plugin is not
    /// compiled again): the compiling process is ended past it, counted in
    /// whole seconds, however busy the machine is.
    #[serde(default = "default_compile_cpu_ms")]
    pub compile_cpu_ms: u64,
    /// How long compiling may take on the clock: a backstop for a compile
    /// that cannot run at all.
    #[serde(default = "default_compile_timeout_ms")]
    pub compile_timeout_ms: u64,
    /// Outgoing HTTP: connecting (TLS included), waiting for the response
    /// head, and waiting between pieces of its body.
    #[serde(default = "default_http_connect_timeout_ms")]
    pub http_connect_timeout_ms: u64,
    #[serde(default = "default_http_first_byte_timeout_ms")]
    pub http_first_byte_timeout_ms: u64,
    #[serde(default = "default_http_between_bytes_timeout_ms")]
    pub http_between_bytes_timeout_ms: u64,
    /// The largest HTTP response body the sink may read.
    #[serde(default = "default_max_response_mb")]
    pub max_response_mb: u64,
    /// HTTP requests in flight at once.
    #[serde(default = "default_max_concurrent_requests")]
    pub max_concurrent_requests: u64,
    /// TCP connections (sockets) open at once.
    #[serde(default = "default_max_tcp_connections")]
    pub max_tcp_connections: u64,
}

// Each default is the capability's own (it owns its limits and their
// defaults); these only restate them in the units the file is written in.
fn default_memory_mb() -> u64 {
    (Limits::default().memory_bytes >> 20) as u64
}
fn default_call_timeout_ms() -> u64 {
    Limits::default().call_timeout.as_millis() as u64
}
fn default_max_object_mb() -> u64 {
    BlobLimits::DEFAULT_MAX_OBJECT_BYTES >> 20
}
fn default_max_list_entries() -> u64 {
    BlobLimits::DEFAULT_MAX_LIST_ENTRIES as u64
}
fn default_max_message_bytes() -> u64 {
    LogLimits::default().max_message_bytes as u64
}
fn default_log_lines_per_second() -> u64 {
    LogLimits::default().lines_per_second
}
fn default_log_burst() -> u64 {
    LogLimits::default().burst
}
fn default_max_plugin_mb() -> u64 {
    CompileLimits::default().max_bytes >> 20
}
fn default_compile_cpu_ms() -> u64 {
    CompileLimits::default().cpu.as_millis() as u64
}
fn default_compile_timeout_ms() -> u64 {
    CompileLimits::default().timeout.as_millis() as u64
}
fn default_http_connect_timeout_ms() -> u64 {
    NetworkLimits::default().connect_timeout.as_millis() as u64
}
fn default_http_first_byte_timeout_ms() -> u64 {
    NetworkLimits::default().first_byte_timeout.as_millis() as u64
}
fn default_http_between_bytes_timeout_ms() -> u64 {
    NetworkLimits::default().between_bytes_timeout.as_millis() as u64
}
fn default_max_response_mb() -> u64 {
    NetworkLimits::default().max_response_bytes >> 20
}
fn default_max_concurrent_requests() -> u64 {
    NetworkLimits::default().max_concurrent_requests as u64
}
fn default_max_tcp_connections() -> u64 {
    NetworkLimits::default().max_tcp_connections as u64
}

impl LimitsConfig {
    // The one place the file's limits become the capabilities' own.

    /// The bounds on each call into the sink: memory, wall clock, log.
    pub fn call_limits(&self) -> Limits {
        Limits {
            memory_bytes: usize::try_from(self.memory_mb.saturating_mul(1 << 20))
                .unwrap_or(usize::MAX),
            call_timeout: Duration::from_millis(self.call_timeout_ms),
            log: LogLimits {
                max_message_bytes: usize::try_from(self.max_message_bytes).unwrap_or(usize::MAX),
                lines_per_second: self.log_lines_per_second,
                burst: self.log_burst,
            },
        }
    }

    /// The bounds on the sink's outgoing network use.
    pub fn network_limits(&self) -> NetworkLimits {
        NetworkLimits {
            connect_timeout: Duration::from_millis(self.http_connect_timeout_ms),
            first_byte_timeout: Duration::from_millis(self.http_first_byte_timeout_ms),
            between_bytes_timeout: Duration::from_millis(self.http_between_bytes_timeout_ms),
            max_response_bytes: self.max_response_mb.saturating_mul(1 << 20),
            max_concurrent_requests: self.max_concurrent_requests as usize,
            max_tcp_connections: self.max_tcp_connections as usize,
        }
    }

    /// What loading the sink's plugin may cost.
    pub fn compile_limits(&self) -> CompileLimits {
        CompileLimits {
            max_bytes: self.max_plugin_mb.saturating_mul(1 << 20),
            cpu: Duration::from_millis(self.compile_cpu_ms),
            timeout: Duration::from_millis(self.compile_timeout_ms),
        }
    }

    /// What sink `sink` may store and hold through its blob root at `url`.
    pub fn blob_limits(&self, sink: &str, url: &str) -> BlobLimits {
        let object = self.max_object_mb.saturating_mul(1 << 20);
        BlobLimits {
            sink: sink.to_string(),
            max_stored_bytes: self.max_stored_bytes(url),
            max_put_bytes: object,
            // The sink could not hold more than its memory.
            max_read_bytes: object.min(self.memory_mb.saturating_mul(1 << 20)),
            max_list_entries: usize::try_from(self.max_list_entries).unwrap_or(usize::MAX),
        }
    }

    /// The quota of a root at `url`, in bytes.
    pub fn max_stored_bytes(&self, url: &str) -> u64 {
        match self.max_stored_mb {
            Some(mb) => mb.saturating_mul(1 << 20),
            None => BlobLimits::default_max_stored_bytes(url),
        }
    }

    /// Refuses byte and log limits that are zero or absurd, naming the field.
    fn validate_bytes(&self, field: &str) -> Result<(), String> {
        let checks = [
            ("max_stored_mb", self.max_stored_mb.unwrap_or(1), 1, 1 << 40),
            ("max_object_mb", self.max_object_mb, 1, 1 << 20),
            ("max_list_entries", self.max_list_entries, 1, 1 << 32),
            ("max_message_bytes", self.max_message_bytes, 64, 1 << 30),
            (
                "log_lines_per_second",
                self.log_lines_per_second,
                1,
                1 << 32,
            ),
            ("log_burst", self.log_burst, 1, 1 << 32),
            ("max_plugin_mb", self.max_plugin_mb, 1, 1 << 16),
            ("compile_cpu_ms", self.compile_cpu_ms, 100, 1 << 32),
            ("compile_timeout_ms", self.compile_timeout_ms, 100, 1 << 32),
            (
                "http_connect_timeout_ms",
                self.http_connect_timeout_ms,
                10,
                1 << 32,
            ),
            (
                "http_first_byte_timeout_ms",
                self.http_first_byte_timeout_ms,
                10,
                1 << 32,
            ),
            (
                "http_between_bytes_timeout_ms",
                self.http_between_bytes_timeout_ms,
                10,
                1 << 32,
            ),
            ("max_response_mb", self.max_response_mb, 1, 1 << 20),
            (
                "max_concurrent_requests",
                self.max_concurrent_requests,
                1,
                1 << 16,
            ),
            ("max_tcp_connections", self.max_tcp_connections, 1, 1 << 16),
        ];
        for (name, value, low, high) in checks {
            if !(low..=high).contains(&value) {
                return Err(format!("{field}.{name}: {value} is outside {low}..={high}"));
            }
        }
        Ok(())
    }
}

impl Default for LimitsConfig {
    fn default() -> Self {
        LimitsConfig {
            memory_mb: default_memory_mb(),
            call_timeout_ms: default_call_timeout_ms(),
            max_stored_mb: None,
            max_object_mb: default_max_object_mb(),
            max_list_entries: default_max_list_entries(),
            max_message_bytes: default_max_message_bytes(),
            log_lines_per_second: default_log_lines_per_second(),
            log_burst: default_log_burst(),
            max_plugin_mb: default_max_plugin_mb(),
            compile_cpu_ms: default_compile_cpu_ms(),
            compile_timeout_ms: default_compile_timeout_ms(),
            http_connect_timeout_ms: default_http_connect_timeout_ms(),
            http_first_byte_timeout_ms: default_http_first_byte_timeout_ms(),
            http_between_bytes_timeout_ms: default_http_between_bytes_timeout_ms(),
            max_response_mb: default_max_response_mb(),
            max_concurrent_requests: default_max_concurrent_requests(),
            max_tcp_connections: default_max_tcp_connections(),
        }
    }
}

impl PipelineConfig {
    /// The sum of `memory_mb` over the pipeline's sinks.
    pub fn sinks_memory_mb(&self) -> u64 {
        self.sinks.iter().map(|s| s.limits.memory_mb).sum()
    }

    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        let base_dir = path
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_else(|| PathBuf::from("."));
        Self::parse(&text, path, &base_dir, |name| std::env::var(name).ok())
    }

    /// Parses and validates; `env` looks up `${VAR}` references.
    pub fn parse(
        text: &str,
        path: &Path,
        base_dir: &Path,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Self, ConfigError> {
        let invalid = |detail: String| ConfigError::Invalid {
            path: path.to_path_buf(),
            detail,
        };
        let expanded = interpolate(text, &env).map_err(invalid)?;
        let mut config: PipelineConfig =
            serde_saphyr::from_str(&expanded).map_err(|e| invalid(e.to_string()))?;
        config.base_dir = base_dir.to_path_buf();
        config.file = path.to_path_buf();
        config.validate().map_err(invalid)?;
        Ok(config)
    }

    fn validate(&self) -> Result<(), String> {
        check_name("pipeline", &self.pipeline)?;
        match &self.source {
            SourceConfig::Postgres(pg) => {
                pg.validate().map_err(|e| format!("source.postgres.{e}"))?;
            }
            SourceConfig::Mysql(my) => my.validate().map_err(|e| format!("source.mysql.{e}"))?,
            SourceConfig::Generator(_) => {}
        }
        if self.sinks.is_empty() {
            return Err("sinks: at least one sink is needed".into());
        }
        let mut names = std::collections::BTreeSet::new();
        for (i, sink) in self.sinks.iter().enumerate() {
            check_name(&format!("sinks[{i}].name"), &sink.name)?;
            if !names.insert(&sink.name) {
                return Err(format!("sinks[{i}].name: `{}` is used twice", sink.name));
            }
            if sink.limits.memory_mb == 0
                || sink.limits.memory_mb << 20 > weir_runtime::engine::MAX_PLUGIN_MEMORY as u64
            {
                return Err(format!(
                    "sinks[{i}].limits.memory_mb: {} is outside 1..={}",
                    sink.limits.memory_mb,
                    weir_runtime::engine::MAX_PLUGIN_MEMORY >> 20
                ));
            }
            if sink.limits.call_timeout_ms < 10 {
                return Err(format!(
                    "sinks[{i}].limits.call_timeout_ms: {} is below 10",
                    sink.limits.call_timeout_ms
                ));
            }
            sink.limits.validate_bytes(&format!("sinks[{i}].limits"))?;
            sink.grants.parse().map_err(|e| format!("sinks[{i}].{e}"))?;
            if sink.blob_store.url.trim().is_empty() {
                return Err(format!("sinks[{i}].blob_store.url: empty"));
            }
            if let Some(valve) = &sink.dead_letter {
                valve.validate(&format!("sinks[{i}].dead_letter"))?;
            }
        }
        if self.batch.max_rows == 0 {
            return Err("batch.max_rows: must be at least 1".into());
        }
        if self.batch.max_bytes < 1024 {
            return Err("batch.max_bytes: must be at least 1024".into());
        }
        if self.batch.heartbeat_ms == 0 {
            return Err("batch.heartbeat_ms: must be at least 1".into());
        }
        for (i, m) in self.metadata.iter().enumerate() {
            if m.name.is_empty() || m.name.starts_with("__") {
                return Err(format!(
                    "metadata[{i}].as: `{}` must be non-empty and not start with `__` (reserved)",
                    m.name
                ));
            }
        }
        Ok(())
    }

    pub fn resolve(&self, path: &Path) -> PathBuf {
        if path.is_absolute() {
            path.to_path_buf()
        } else {
            self.base_dir.join(path)
        }
    }

    pub fn state_dir(&self) -> PathBuf {
        self.resolve(&self.state_dir)
    }

    pub fn store_path(&self) -> PathBuf {
        self.state_dir().join("positions.redb")
    }

    /// Where compiled plugins are kept: `WEIR_COMPONENT_CACHE` if set (one
    /// cache shared by several pipelines: a large plugin compiles once),
    /// else beside the pipeline's state.
    pub fn cache_dir(&self) -> PathBuf {
        component_cache_dir(&self.state_dir())
    }
}

/// Where compiled plugins are kept for state kept in `state_dir`:
/// `WEIR_COMPONENT_CACHE` if set, else `<state_dir>/component-cache`.
pub fn component_cache_dir(state_dir: &Path) -> PathBuf {
    match std::env::var_os(COMPONENT_CACHE_VAR) {
        Some(shared) if !shared.is_empty() => PathBuf::from(shared),
        _ => state_dir.join("component-cache"),
    }
}

/// The environment variable naming a component cache shared by pipelines.
pub const COMPONENT_CACHE_VAR: &str = "WEIR_COMPONENT_CACHE";

/// The one rule for tenant, pipeline and sink names, wherever they come
/// from (a host file, a pipeline file, the watched folder, the admin API's
/// path); `field` says which name and where, for the error.
pub fn check_name(field: &str, name: &str) -> Result<(), String> {
    // A name becomes a folder (a tenant's, a pipeline's state) and a file
    // name in the watched folder: `.` and `..` would name the folder above,
    // and a leading `.` a file the watcher skips as hidden.
    let ok = !name.is_empty()
        && name.len() <= MAX_NAME_CHARS
        && !name.starts_with('.')
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{field}: `{}` must be 1-{MAX_NAME_CHARS} characters of letters, digits, `-`, `_` or \
             `.`, not starting with `.`",
            name.escape_debug()
        ))
    }
}

/// The longest tenant, pipeline or sink name.
pub const MAX_NAME_CHARS: usize = 128;

/// Replaces `${VAR}` and `${VAR:-default}`; `$${` stays a literal `${`.
pub fn interpolate(text: &str, env: &impl Fn(&str) -> Option<String>) -> Result<String, String> {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        if let Some(stripped) = after.strip_prefix("${") {
            out.push_str("${");
            rest = stripped;
            continue;
        }
        let Some(body) = after.strip_prefix('{') else {
            out.push('$');
            rest = after;
            continue;
        };
        let Some(end) = body.find('}') else {
            let line = text[..text.len() - rest.len() + i].lines().count().max(1);
            return Err(format!("line {line}: `${{` without a closing `}}`"));
        };
        let reference = &body[..end];
        let (name, default) = match reference.split_once(":-") {
            Some((n, d)) => (n, Some(d)),
            None => (reference, None),
        };
        match (env(name), default) {
            (Some(value), _) => out.push_str(&value),
            (None, Some(d)) => out.push_str(d),
            (None, None) => {
                let line = text[..text.len() - rest.len() + i].lines().count().max(1);
                return Err(format!(
                    "line {line}: environment variable `{name}` is not set (write `${{{name}:-default}}` to give a default)"
                ));
            }
        }
        rest = &body[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

#[cfg(test)]
mod tests {
    #[test]
    fn names_that_would_lead_out_of_a_folder_are_refused() {
        for bad in [
            "",
            ".",
            "..",
            ".hidden",
            "a/b",
            "a\\b",
            "a\nb",
            "a\0",
            "é",
            &"x".repeat(129),
        ] {
            let error = super::check_name("pipeline name", bad).unwrap_err();
            assert!(error.starts_with("pipeline name: `"), "{error}");
        }
        for good in ["orders", "a.b", "a..b", "A-1_x", &"x".repeat(128)] {
            super::check_name("pipeline name", good).unwrap();
        }
    }

    use super::*;

    const GOOD: &str = r#"
pipeline: demo
source:
  generator: { seed: 7, max_changes: 100 }
metadata:
  - { from: commit_ts, as: committed_at }
sinks:
  - name: lake
    plugin: ${PLUGINS}/parquet.wasm
    blob_store: { url: "${OUT:-out}/lake" }
"#;

    fn parse(text: &str, env: &[(&str, &str)]) -> Result<PipelineConfig, ConfigError> {
        let vars: BTreeMap<String, String> = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        PipelineConfig::parse(text, Path::new("p.yaml"), Path::new("/base"), |n| {
            vars.get(n).cloned()
        })
    }

    #[test]
    fn parses_with_environment_and_defaults() {
        let c = parse(GOOD, &[("PLUGINS", "/plugins")]).unwrap();
        assert_eq!(c.sinks[0].plugin, PathBuf::from("/plugins/parquet.wasm"));
        assert_eq!(c.sinks[0].blob_store.url, "out/lake");
        assert!(c.sinks[0].required);
        assert_eq!(c.batch.max_rows, 10_000);
        assert_eq!(c.store_path(), PathBuf::from("/base/.weir/positions.redb"));
    }

    #[test]
    fn errors_name_the_field_or_variable() {
        let err = parse(GOOD, &[]).unwrap_err().to_string();
        assert!(err.contains("`PLUGINS`") && err.contains("line 9"), "{err}");

        let typo = GOOD.replace("blob_store:", "blob_stor:");
        let err = parse(&typo, &[("PLUGINS", "/p")]).unwrap_err().to_string();
        assert!(err.contains("blob_stor"), "{err}");

        let bad_meta = GOOD.replace("commit_ts", "commit_time");
        let err = parse(&bad_meta, &[("PLUGINS", "/p")])
            .unwrap_err()
            .to_string();
        // The YAML parser points at the value: line and column, with the
        // line quoted, and the accepted spellings.
        assert!(
            err.contains("line 6 column 13")
                && err.contains("commit_time")
                && err.contains("commit_ts"),
            "{err}"
        );

        let dup = format!(
            "{GOOD}  - name: lake\n    plugin: x.wasm\n    blob_store: {{ url: memory:// }}\n"
        );
        let err = parse(&dup, &[("PLUGINS", "/p")]).unwrap_err().to_string();
        assert!(
            err.contains("sinks[1].name") && err.contains("twice"),
            "{err}"
        );

        let limits = GOOD.replace(
            "    blob_store:",
            "    limits: { memory_mb: 99999 }\n    blob_store:",
        );
        let err = parse(&limits, &[("PLUGINS", "/p")])
            .unwrap_err()
            .to_string();
        assert!(err.contains("sinks[0].limits.memory_mb"), "{err}");

        let grants = GOOD.replace(
            "    blob_store:",
            "    grants: { http: [\"https://hooks.example.com\"], tcp: [\"redis\"] }\n    blob_store:",
        );
        let err = parse(&grants, &[("PLUGINS", "/p")])
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("sinks[0].grants.tcp[0] `redis`") && err.contains("port"),
            "{err}"
        );
        let granted = GOOD.replace(
            "    blob_store:",
            "    grants: { tcp: [\"10.0.0.0/8:6379\"] }\n    blob_store:",
        );
        let config = parse(&granted, &[("PLUGINS", "/p")]).unwrap();
        assert_eq!(config.sinks[0].grants.parse().unwrap().tcp.len(), 1);
    }
    #[test]
    fn a_dead_letter_valve_is_checked_where_it_is_written() {
        let with = |valve: &str| {
            GOOD.replace(
                "    blob_store:",
                &format!("    dead_letter: {valve}\n    blob_store:"),
            )
        };
        let config = parse(&with("{ url: out/refused }"), &[("PLUGINS", "/p")]).unwrap();
        let valve = config.sinks[0].dead_letter.as_ref().unwrap();
        assert_eq!((valve.max_rows, valve.max_share), (100, 1.0));
        for (valve, needle) in [
            ("{ url: \"memory://\" }", "sinks[0].dead_letter.url"),
            (
                "{ url: out/refused, max_rows: 0 }",
                "sinks[0].dead_letter.max_rows",
            ),
            (
                "{ url: out/refused, max_share: 1.5 }",
                "sinks[0].dead_letter.max_share",
            ),
            (
                "{ url: out/refused, max_share: 0 }",
                "sinks[0].dead_letter.max_share",
            ),
            ("{ url: out/refused, max_row: 3 }", "max_row"),
        ] {
            let err = parse(&with(valve), &[("PLUGINS", "/p")])
                .unwrap_err()
                .to_string();
            assert!(err.contains(needle), "{valve}: {err}");
        }
    }
}
