//! The host file of `weir serve`: where it listens, where it keeps state,
//! which folder it watches, and its tenants with their bounds and grants.
//! Read once at start; every error names the file and the key.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use weir_pipeline::config::GrantsConfig;
use weir_runtime::tenant::TenantBounds;

/// The shortest token accepted: a short token is a guessable one.
const MIN_TOKEN_CHARS: usize = 16;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostConfig {
    /// The admin API's address (also `/metrics`, `/health`, `/ready`).
    pub listen: SocketAddr,
    /// Positions, epochs, uploaded plugins and the component cache.
    pub state_dir: PathBuf,
    /// Watched: `<tenant>/<pipeline>.yaml`.
    pub pipelines_dir: PathBuf,
    #[serde(default = "default_watch_interval_ms")]
    pub watch_interval_ms: u64,
    /// SIGTERM: the bound on the exit.
    #[serde(default = "default_shutdown_grace_ms")]
    pub shutdown_grace_ms: u64,
    #[serde(default)]
    pub operator_token_env: Option<String>,
    #[serde(default)]
    pub operator_token_file: Option<PathBuf>,
    #[serde(default)]
    pub restart: RestartConfig,
    #[serde(default)]
    pub admin: AdminConfig,
    /// Several hosts sharing the work through etcd; alone without it.
    #[serde(default)]
    pub cluster: Option<weir_cluster::ClusterConfig>,
    pub tenants: BTreeMap<String, TenantConfig>,
    /// The host file's folder; relative paths are resolved against it.
    #[serde(skip)]
    pub base_dir: PathBuf,
    #[serde(skip)]
    pub file: PathBuf,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RestartConfig {
    #[serde(default = "default_first_backoff_ms")]
    pub first_backoff_ms: u64,
    #[serde(default = "default_max_backoff_ms")]
    pub max_backoff_ms: u64,
    /// Failures in a row after which a pipeline is parked.
    #[serde(default = "default_max_failures")]
    pub max_failures: u32,
    /// A plugin version swapped in that makes its pipeline fail before it
    /// committed this many batches is rolled back to the version before,
    /// on its own, and the pipeline restarted (0: never, the default).
    #[serde(default)]
    pub rollback_within_commits: u64,
}

impl Default for RestartConfig {
    fn default() -> Self {
        RestartConfig {
            first_backoff_ms: default_first_backoff_ms(),
            max_backoff_ms: default_max_backoff_ms(),
            max_failures: default_max_failures(),
            rollback_within_commits: 0,
        }
    }
}

impl RestartConfig {
    /// The pause before the restart that follows `failures` failures in a
    /// row (1 for the first).
    pub fn backoff(&self, failures: u32) -> Duration {
        let doublings = failures.saturating_sub(1).min(20);
        let ms = self
            .first_backoff_ms
            .saturating_mul(1 << doublings)
            .min(self.max_backoff_ms);
        Duration::from_millis(ms)
    }
}

/// The admin API's bounds: what one client, or all of them, may hold of
/// the host before it is cut off. Every field has a default; docs/serve.md
/// lists them.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdminConfig {
    /// From the connection's start (or the end of its last answer) to the
    /// end of a request's headers.
    #[serde(default = "default_header_timeout_ms")]
    pub header_timeout_ms: u64,
    /// From the end of a request's headers to the end of its body.
    #[serde(default = "default_body_timeout_ms")]
    pub body_timeout_ms: u64,
    /// How long a connection may send and take nothing while no request of
    /// it is being handled.
    #[serde(default = "default_idle_timeout_ms")]
    pub idle_timeout_ms: u64,
    /// Open connections, all clients together; one more is closed at once.
    #[serde(default = "default_max_connections")]
    pub max_connections: usize,
    /// Open connections from one client address.
    #[serde(default = "default_max_connections_per_client")]
    pub max_connections_per_client: usize,
    /// The largest plugin upload; a larger declared length is refused
    /// before any of the body is read.
    #[serde(default = "default_max_plugin_mb")]
    pub max_plugin_mb: u64,
    /// How long a plugin uploaded on its own (`PUT /v1/tenants/{t}/plugins/
    /// {sha256}`) is kept while no pipeline file names it: the apply that
    /// names it follows its upload, and must find it there.
    #[serde(default = "default_upload_hold_ms")]
    pub upload_hold_ms: u64,
    /// `/metrics` without a token (every tenant's series); by default it
    /// takes the operator's token (every series) or a tenant's (its own).
    #[serde(default)]
    pub open_metrics: bool,
}

impl Default for AdminConfig {
    fn default() -> Self {
        AdminConfig {
            header_timeout_ms: default_header_timeout_ms(),
            body_timeout_ms: default_body_timeout_ms(),
            idle_timeout_ms: default_idle_timeout_ms(),
            max_connections: default_max_connections(),
            max_connections_per_client: default_max_connections_per_client(),
            max_plugin_mb: default_max_plugin_mb(),
            upload_hold_ms: default_upload_hold_ms(),
            open_metrics: false,
        }
    }
}

impl AdminConfig {
    pub fn header_timeout(&self) -> Duration {
        Duration::from_millis(self.header_timeout_ms)
    }
    pub fn body_timeout(&self) -> Duration {
        Duration::from_millis(self.body_timeout_ms)
    }
    pub fn idle_timeout(&self) -> Duration {
        Duration::from_millis(self.idle_timeout_ms)
    }
    pub fn upload_hold(&self) -> Duration {
        Duration::from_millis(self.upload_hold_ms)
    }
    pub fn max_plugin_bytes(&self) -> usize {
        usize::try_from(self.max_plugin_mb << 20).unwrap_or(usize::MAX)
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenantConfig {
    #[serde(default)]
    pub token_env: Option<String>,
    #[serde(default)]
    pub token_file: Option<PathBuf>,
    /// Every blob-store root of the tenant's sinks lies in here: a folder,
    /// or object storage by URL (`s3://bucket/prefix`).
    pub root: String,
    /// The object store's options for a `root` URL (endpoint, region,
    /// credentials: object_store's names); `${VAR}` in a value reads the
    /// host's environment. The host's, not the tenant's: its pipeline
    /// files may not set a sink's options.
    #[serde(default)]
    pub root_options: BTreeMap<String, String>,
    #[serde(default = "default_max_pipelines")]
    pub max_pipelines: usize,
    /// The sum of `memory_mb` over its sink instances.
    #[serde(default = "default_max_memory_mb")]
    pub max_memory_mb: u64,
    /// What its sinks' blob stores may hold, all together.
    #[serde(default = "default_max_stored_mb")]
    pub max_stored_mb: u64,
    #[serde(default = "default_log_lines_per_second")]
    pub log_lines_per_second: u64,
    #[serde(default = "default_log_burst")]
    pub log_burst: u64,
    /// The slots of the host's instance pool its sinks may hold together
    /// (one per sink instance; a given-up instance still running counts
    /// until it ends). The host sizes its pool to the tenants' shares.
    #[serde(default = "default_max_instances")]
    pub max_instances: usize,
    /// The sockets and HTTP connections its sinks may hold together; no
    /// sink's `limits.max_tcp_connections` or `max_concurrent_requests`
    /// may be more.
    #[serde(default = "default_max_sockets")]
    pub max_sockets: usize,
    /// The most any of its sinks may be granted.
    #[serde(default)]
    pub grants: GrantsConfig,
    /// The databases its pipelines may read, as `host:port` patterns (the
    /// syntax of `grants.tcp`); none by default. The host connects to them,
    /// so without this a tenant could point the host anywhere it reaches.
    #[serde(default)]
    pub sources: SourceGrantsConfig,
    /// The environment variables its pipeline files may name in `${VAR}`
    /// (its secrets); none by default. A variable belongs to one tenant.
    #[serde(default)]
    pub env: Vec<String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SourceGrantsConfig {
    #[serde(default)]
    pub postgres: Vec<String>,
    #[serde(default)]
    pub mysql: Vec<String>,
}

fn default_watch_interval_ms() -> u64 {
    1000
}
fn default_shutdown_grace_ms() -> u64 {
    10_000
}
fn default_first_backoff_ms() -> u64 {
    1000
}
fn default_max_backoff_ms() -> u64 {
    60_000
}
fn default_max_failures() -> u32 {
    5
}
fn default_header_timeout_ms() -> u64 {
    10_000
}
/// A 256 MiB upload at about 1 MB/s.
fn default_body_timeout_ms() -> u64 {
    300_000
}
fn default_idle_timeout_ms() -> u64 {
    60_000
}
/// Well under the usual descriptor limit of 1024, which the host's own
/// files, sockets and pipelines share.
fn default_max_connections() -> usize {
    512
}
fn default_max_connections_per_client() -> usize {
    64
}
fn default_max_plugin_mb() -> u64 {
    256
}
/// The longest hold: an upload never applied must give its bytes back
/// some day (and a time that far ahead is still a time).
const MOST_UPLOAD_HOLD_MS: u64 = 30 * 24 * 3_600_000;

/// An hour: far longer than an upload takes to be followed by its apply,
/// short enough that an upload never applied gives its bytes back.
fn default_upload_hold_ms() -> u64 {
    3_600_000
}
fn default_max_pipelines() -> usize {
    8
}
fn default_max_memory_mb() -> u64 {
    1024
}
// A tenant's shares default to the runtime's own (`TenantBounds`); these
// only restate them in the units the file is written in.
fn default_max_stored_mb() -> u64 {
    TenantBounds::default().max_stored_bytes >> 20
}
fn default_log_lines_per_second() -> u64 {
    TenantBounds::default().log_lines_per_second
}
fn default_log_burst() -> u64 {
    TenantBounds::default().log_burst
}
fn default_max_instances() -> usize {
    TenantBounds::default().max_instances
}
fn default_max_sockets() -> usize {
    TenantBounds::default().max_sockets
}

/// The most `max_instances` one tenant may be given: the host reserves
/// address space for every slot of its pool.
pub const MOST_INSTANCES_PER_TENANT: usize = 1024;

impl HostConfig {
    pub fn load(path: &Path) -> Result<HostConfig, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read host file {}: {e}", path.display()))?;
        let base_dir = path
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_else(|| PathBuf::from("."));
        Self::parse(&text, path, &base_dir)
    }

    pub fn parse(text: &str, path: &Path, base_dir: &Path) -> Result<HostConfig, String> {
        let invalid = |detail: String| format!("{}: {detail}", path.display());
        let mut host: HostConfig =
            serde_saphyr::from_str(text).map_err(|e| invalid(e.to_string()))?;
        host.base_dir = base_dir.to_path_buf();
        host.file = path.to_path_buf();
        host.validate().map_err(invalid)?;
        Ok(host)
    }

    fn validate(&self) -> Result<(), String> {
        if let Some(cluster) = &self.cluster {
            cluster.check("cluster")?;
        }
        if self.operator_token_env.is_some() == self.operator_token_file.is_some() {
            return Err(
                "set exactly one of operator_token_env and operator_token_file".to_string(),
            );
        }
        if self.watch_interval_ms < 10 {
            return Err(format!(
                "watch_interval_ms: {} is below 10",
                self.watch_interval_ms
            ));
        }
        if self.restart.first_backoff_ms == 0
            || self.restart.max_backoff_ms < self.restart.first_backoff_ms
        {
            return Err(
                "restart: first_backoff_ms must be at least 1 and at most max_backoff_ms"
                    .to_string(),
            );
        }
        let admin = &self.admin;
        for (key, ms) in [
            ("header_timeout_ms", admin.header_timeout_ms),
            ("body_timeout_ms", admin.body_timeout_ms),
            ("idle_timeout_ms", admin.idle_timeout_ms),
        ] {
            if ms < 10 {
                return Err(format!("admin.{key}: {ms} is below 10"));
            }
        }
        if admin.max_connections == 0 || admin.max_connections_per_client == 0 {
            return Err(
                "admin: max_connections and max_connections_per_client must be at least 1"
                    .to_string(),
            );
        }
        if !(1..=4096).contains(&admin.max_plugin_mb) {
            return Err(format!(
                "admin.max_plugin_mb: {} is outside 1..=4096",
                admin.max_plugin_mb
            ));
        }
        if admin.upload_hold_ms > MOST_UPLOAD_HOLD_MS {
            return Err(format!(
                "admin.upload_hold_ms: {} is over {MOST_UPLOAD_HOLD_MS} (30 days)",
                admin.upload_hold_ms
            ));
        }
        if self.tenants.is_empty() {
            return Err("tenants: at least one tenant is needed".to_string());
        }
        let mut owners: BTreeMap<&str, &str> = BTreeMap::new();
        for (name, tenant) in &self.tenants {
            for variable in &tenant.env {
                let plain = !variable.is_empty()
                    && variable
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || c == '_');
                if !plain {
                    return Err(format!(
                        "tenants.{name}.env: `{variable}` is not a variable name (letters, digits, `_`)"
                    ));
                }
                if let Some(other) = owners.insert(variable, name) {
                    return Err(format!(
                        "tenants.{name}.env: `{variable}` is already tenant `{other}`'s; a \
                         variable belongs to one tenant"
                    ));
                }
            }
        }
        for (name, tenant) in &self.tenants {
            let field = format!("tenants.{name}");
            weir_pipeline::config::check_name(&field, name)?;
            if tenant.token_env.is_some() == tenant.token_file.is_some() {
                return Err(format!(
                    "{field}: set exactly one of token_env and token_file"
                ));
            }
            if tenant.max_pipelines == 0 || tenant.max_memory_mb == 0 || tenant.max_stored_mb == 0 {
                return Err(format!(
                    "{field}: max_pipelines, max_memory_mb and max_stored_mb must be at least 1"
                ));
            }
            if tenant.max_stored_mb > 1 << 30 || tenant.max_memory_mb > 1 << 30 {
                return Err(format!(
                    "{field}: max_stored_mb and max_memory_mb must be at most {}",
                    1u64 << 30
                ));
            }
            if !(1..=MOST_INSTANCES_PER_TENANT).contains(&tenant.max_instances) {
                return Err(format!(
                    "{field}.max_instances: {} is outside 1..={MOST_INSTANCES_PER_TENANT}",
                    tenant.max_instances
                ));
            }
            if !(1..=1 << 20).contains(&tenant.max_sockets) {
                return Err(format!(
                    "{field}.max_sockets: {} is outside 1..={}",
                    tenant.max_sockets,
                    1 << 20
                ));
            }
            if tenant.log_lines_per_second == 0 || tenant.log_burst == 0 {
                return Err(format!(
                    "{field}: log_lines_per_second and log_burst must be at least 1"
                ));
            }
            tenant.grants.parse().map_err(|e| format!("{field}.{e}"))?;
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

    pub fn operator_token(&self) -> Result<String, String> {
        read_token(
            "operator_token",
            self.operator_token_env.as_deref(),
            self.operator_token_file.as_ref().map(|f| self.resolve(f)),
        )
    }

    pub fn tenant_token(&self, tenant: &str) -> Result<String, String> {
        let config = &self.tenants[tenant];
        read_token(
            &format!("tenants.{tenant}.token"),
            config.token_env.as_deref(),
            config.token_file.as_ref().map(|f| self.resolve(f)),
        )
    }
}

fn read_token(field: &str, env: Option<&str>, file: Option<PathBuf>) -> Result<String, String> {
    let token = match (env, file) {
        (Some(var), _) => std::env::var(var)
            .map_err(|_| format!("{field}: the environment variable {var} is not set"))?,
        (None, Some(file)) => std::fs::read_to_string(&file)
            .map_err(|e| format!("{field}: cannot read {}: {e}", file.display()))?,
        (None, None) => return Err(format!("{field}: no token source")),
    };
    let token = token.trim().to_string();
    if token.chars().count() < MIN_TOKEN_CHARS {
        return Err(format!(
            "{field}: the token is shorter than {MIN_TOKEN_CHARS} characters"
        ));
    }
    Ok(token)
}

/// A place given as a folder (a path, or a `file://` URL), not a URL of an
/// object store: its path. Tenant roots and the plugin store are either.
pub fn local_folder(place: &str) -> Option<PathBuf> {
    match place.strip_prefix("file://") {
        Some(path) => Some(PathBuf::from(path)),
        None if !place.contains("://") => Some(PathBuf::from(place)),
        None => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<HostConfig, String> {
        HostConfig::parse(text, Path::new("host.yaml"), Path::new("."))
    }

    const MINIMAL: &str = "listen: 127.0.0.1:7070\nstate_dir: s\npipelines_dir: p\n\
        operator_token_env: OP\ntenants:\n  acme:\n    token_env: T\n    root: data/acme\n";

    #[test]
    fn a_minimal_host_file_is_read_with_defaults() {
        let host = parse(MINIMAL).unwrap();
        assert_eq!(host.tenants["acme"].max_pipelines, 8);
        assert_eq!(host.admin.max_connections, 512);
        assert_eq!(host.admin.max_plugin_bytes(), 256 << 20);
        assert!(!host.admin.open_metrics);
        assert_eq!(host.admin.upload_hold(), Duration::from_secs(3600));
        assert_eq!(host.restart.backoff(1), Duration::from_secs(1));
        assert_eq!(host.restart.backoff(3), Duration::from_secs(4));
        assert_eq!(host.restart.backoff(30), Duration::from_secs(60));
    }

    #[test]
    fn bad_host_files_are_refused_naming_the_key() {
        let unknown = parse(&format!("{MINIMAL}    colour: blue\n")).unwrap_err();
        assert!(unknown.contains("colour"), "{unknown}");
        let two = parse(&MINIMAL.replace(
            "operator_token_env: OP\n",
            "operator_token_env: OP\noperator_token_file: f\n",
        ))
        .unwrap_err();
        assert!(two.contains("operator_token_env"), "{two}");
        let bad_name = parse(&MINIMAL.replace("acme:", "a/b:")).unwrap_err();
        assert!(bad_name.contains("tenants.a/b"), "{bad_name}");
        let dots = parse(&MINIMAL.replace("acme:", "'..':")).unwrap_err();
        assert!(dots.contains("tenants..."), "{dots}");
        let admin = parse(&format!("admin:\n  max_connections: 0\n{MINIMAL}")).unwrap_err();
        assert!(admin.contains("admin: max_connections"), "{admin}");
        let forever = parse(&format!(
            "admin:\n  upload_hold_ms: {}\n{MINIMAL}",
            u64::MAX
        ))
        .unwrap_err();
        assert!(forever.contains("admin.upload_hold_ms"), "{forever}");
        let grant = parse(&format!(
            "{MINIMAL}    grants:\n      http: [\"ftp://x\"]\n"
        ))
        .unwrap_err();
        assert!(grant.contains("tenants.acme.grants.http"), "{grant}");
    }
}
