//! The `cluster:` section of a host file.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use crate::keys::check_name;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterConfig {
    /// etcd's client URLs (`http://host:2379`, or `https://` with `tls`).
    pub endpoints: Vec<String>,
    /// This host's name in the cluster: unique, stable across restarts.
    pub name: String,
    /// The lease's time-to-live: a host that stops renewing loses its
    /// pipelines this long after its last renewal.
    #[serde(default = "default_lease_ttl_s")]
    pub lease_ttl_s: u64,
    /// Every key weir writes lies under this prefix (one cluster per prefix).
    #[serde(default = "default_prefix")]
    pub prefix: String,
    /// How long the leader waits before it moves a departed host's
    /// pipelines: a host that blips and comes back keeps them.
    #[serde(default = "default_placement_delay_ms")]
    pub placement_delay_ms: u64,
    /// The leader moves at most this many pipelines a minute (departed
    /// hosts' and rebalancing alike), so a storm stays a drizzle.
    #[serde(default = "default_max_moves_per_minute")]
    pub max_moves_per_minute: u32,
    /// The bound on each request to etcd.
    #[serde(default = "default_request_timeout_ms")]
    pub request_timeout_ms: u64,
    /// etcd's own authentication: the user, and the environment variable
    /// holding its password.
    #[serde(default)]
    pub user: Option<String>,
    #[serde(default)]
    pub password_env: Option<String>,
    #[serde(default)]
    pub tls: Option<TlsConfig>,
    /// Where the plugins of the pipelines folder are kept by digest, for
    /// every host: a folder every host mounts, or object storage
    /// (`s3://bucket/prefix`). With it, each host's pipelines folder is a
    /// copy of one set of files kept in etcd (a pipeline applied on any
    /// host reaches all); without it, the hosts must share one folder.
    #[serde(default)]
    pub plugin_store: Option<String>,
    /// The object store's options for a `plugin_store` URL (endpoint,
    /// region, credentials: object_store's names, as a sink's
    /// `blob_store.options`); `${VAR}` in a value reads the host's
    /// environment, so secrets stay out of the file.
    #[serde(default)]
    pub plugin_store_options: BTreeMap<String, String>,
    /// The admin API's address as the other hosts reach it (`host:port`),
    /// which they forward status and steering requests to; by default the
    /// host file's `listen`.
    #[serde(default)]
    pub advertise: Option<String>,
}

/// TLS to etcd: the CA that signed etcd's certificate, and this host's
/// certificate and key where etcd asks clients for one.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsConfig {
    pub ca_file: PathBuf,
    #[serde(default)]
    pub cert_file: Option<PathBuf>,
    #[serde(default)]
    pub key_file: Option<PathBuf>,
    /// The name etcd's certificate is checked against, when it is not the
    /// endpoint's host.
    #[serde(default)]
    pub domain: Option<String>,
}

fn default_lease_ttl_s() -> u64 {
    10
}
fn default_prefix() -> String {
    "/weir".into()
}
fn default_placement_delay_ms() -> u64 {
    3_000
}
fn default_max_moves_per_minute() -> u32 {
    60
}
fn default_request_timeout_ms() -> u64 {
    2_000
}

impl ClusterConfig {
    /// Checks what serde cannot; `at` names the section in errors.
    pub fn check(&self, at: &str) -> Result<(), String> {
        if self.endpoints.is_empty() {
            return Err(format!("{at}.endpoints: name at least one etcd endpoint"));
        }
        for endpoint in &self.endpoints {
            let scheme_ok = endpoint.starts_with("http://") || endpoint.starts_with("https://");
            if !scheme_ok {
                return Err(format!(
                    "{at}.endpoints: `{endpoint}` is not an http:// or https:// URL"
                ));
            }
            if endpoint.starts_with("https://") && self.tls.is_none() {
                return Err(format!(
                    "{at}.endpoints: `{endpoint}` is https but {at}.tls is not set (give its ca_file)"
                ));
            }
        }
        check_name(&format!("{at}.name"), &self.name)?;
        if !(2..=300).contains(&self.lease_ttl_s) {
            return Err(format!(
                "{at}.lease_ttl_s: {} is out of range (2 to 300 seconds)",
                self.lease_ttl_s
            ));
        }
        if !self.prefix.starts_with('/') || self.prefix.ends_with('/') || self.prefix.len() < 2 {
            return Err(format!(
                "{at}.prefix: `{}` must start with `/` and not end with one",
                self.prefix
            ));
        }
        if !(100..=60_000).contains(&self.request_timeout_ms) {
            return Err(format!(
                "{at}.request_timeout_ms: {} is out of range (100 to 60000)",
                self.request_timeout_ms
            ));
        }
        if self.request_timeout() * 3 > self.lease_ttl() {
            return Err(format!(
                "{at}.request_timeout_ms: {} ms leaves no room for renewals within a lease of {} s; \
                 keep it under a third of the lease",
                self.request_timeout_ms, self.lease_ttl_s
            ));
        }
        if self.max_moves_per_minute == 0 {
            return Err(format!(
                "{at}.max_moves_per_minute: 0 would never move a dead host's pipelines"
            ));
        }
        match &self.plugin_store {
            Some(store) if store.trim().is_empty() => {
                return Err(format!("{at}.plugin_store: empty (a folder or a URL)"));
            }
            None if !self.plugin_store_options.is_empty() => {
                return Err(format!(
                    "{at}.plugin_store_options: set, but {at}.plugin_store is not"
                ));
            }
            _ => {}
        }
        if let Some(address) = &self.advertise {
            let port = address
                .rsplit_once(':')
                .and_then(|(host, port)| (!host.is_empty()).then_some(port));
            if port
                .and_then(|p| p.parse::<u16>().ok())
                .is_none_or(|p| p == 0)
            {
                return Err(format!(
                    "{at}.advertise: `{address}` is not `host:port` (the address other hosts \
                     reach this host's admin API at)"
                ));
            }
        }
        if self.user.is_some() != self.password_env.is_some() {
            return Err(format!("{at}: give both user and password_env, or neither"));
        }
        if let Some(tls) = &self.tls
            && tls.cert_file.is_some() != tls.key_file.is_some()
        {
            return Err(format!(
                "{at}.tls: give both cert_file and key_file, or neither"
            ));
        }
        Ok(())
    }

    pub fn lease_ttl(&self) -> Duration {
        Duration::from_secs(self.lease_ttl_s)
    }

    /// How often the lease is renewed: five times a time-to-live, so one
    /// or two lost renewals do not cost the host its pipelines.
    pub fn renew_every(&self) -> Duration {
        self.lease_ttl() / 5
    }

    /// How old the last confirmed renewal may be while this host still
    /// commits: the time-to-live less a quarter of it (at least a second),
    /// which covers a commit under way and the two clocks' rates.
    pub fn commit_bound(&self) -> Duration {
        let ttl = self.lease_ttl();
        ttl - (ttl / 4).max(Duration::from_secs(1))
    }

    pub fn request_timeout(&self) -> Duration {
        Duration::from_millis(self.request_timeout_ms)
    }

    pub fn placement_delay(&self) -> Duration {
        Duration::from_millis(self.placement_delay_ms)
    }

    pub fn endpoints_text(&self) -> String {
        self.endpoints.join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(text: &str) -> ClusterConfig {
        serde_json::from_str(text).unwrap()
    }

    #[test]
    fn a_lease_leaves_room_for_renewals_and_a_commit() {
        let c = config(r#"{"endpoints": ["http://127.0.0.1:2379"], "name": "a"}"#);
        c.check("cluster").unwrap();
        assert_eq!(c.renew_every(), Duration::from_secs(2));
        assert_eq!(c.commit_bound(), Duration::from_millis(7_500));
        let short = config(r#"{"endpoints": ["http://e:1"], "name": "a", "lease_ttl_s": 2}"#);
        assert_eq!(short.commit_bound(), Duration::from_secs(1));
    }

    #[test]
    fn mistakes_are_named_by_key() {
        let cases = [
            (r#"{"endpoints": [], "name": "a"}"#, "cluster.endpoints"),
            (r#"{"endpoints": ["e:1"], "name": "a"}"#, "not an http"),
            (
                r#"{"endpoints": ["https://e:1"], "name": "a"}"#,
                "cluster.tls",
            ),
            (
                r#"{"endpoints": ["http://e:1"], "name": "a/b"}"#,
                "cluster.name",
            ),
            (
                r#"{"endpoints": ["http://e:1"], "name": "a", "lease_ttl_s": 1}"#,
                "lease_ttl_s",
            ),
            (
                r#"{"endpoints": ["http://e:1"], "name": "a", "prefix": "x"}"#,
                "cluster.prefix",
            ),
            (
                r#"{"endpoints": ["http://e:1"], "name": "a", "lease_ttl_s": 3, "request_timeout_ms": 2000}"#,
                "third of the lease",
            ),
            (
                r#"{"endpoints": ["http://e:1"], "name": "a", "user": "u"}"#,
                "password_env",
            ),
            (
                r#"{"endpoints": ["http://e:1"], "name": "a", "plugin_store_options": {"aws_region": "x"}}"#,
                "cluster.plugin_store is not",
            ),
            (
                r#"{"endpoints": ["http://e:1"], "name": "a", "plugin_store": " "}"#,
                "cluster.plugin_store: empty",
            ),
        ];
        for (text, expected) in cases {
            let error = config(text).check("cluster").unwrap_err();
            assert!(error.contains(expected), "{text}: {error}");
        }
        for address in ["host-a", ":7300", "host-a:", "host-a:0", "host-a:70000"] {
            let text = format!(
                r#"{{"endpoints": ["http://e:1"], "name": "a", "advertise": "{address}"}}"#
            );
            let error = config(&text).check("cluster").unwrap_err();
            assert!(error.contains("cluster.advertise"), "{address}: {error}");
        }
        for address in ["host-a.internal:7300", "10.0.0.7:7300", "[::1]:7300"] {
            let text = format!(
                r#"{{"endpoints": ["http://e:1"], "name": "a", "advertise": "{address}"}}"#
            );
            config(&text).check("cluster").unwrap();
        }
    }
}
