//! What a tenant of `weir serve` may run: every admission and count check
//! in one place. A pipeline file is read without the host's environment,
//! its state put where the host keeps the tenant's, its blob roots and
//! plugin paths held inside the tenant's folders, its grants within the
//! tenant's, the servers its source reaches granted to the tenant (each
//! source says which it reaches), and the tenant's pipelines counted
//! against its bounds.

use std::collections::BTreeMap;
use std::path::{Component, Path, PathBuf};

use weir_pipeline::config::PipelineConfig;
use weir_pipeline::plugin_ref;
use weir_source::Endpoint;

use crate::tenant::{Tenant, TenantRoot, made};

/// Why an operation was not done; the admin API maps each to a status.
#[derive(Debug)]
pub enum Refusal {
    /// 400: the input is wrong.
    Invalid(String),
    /// 404: no such pipeline (or not the caller's).
    NotFound(String),
    /// 409: the pipeline's state forbids it.
    Conflict(String),
    /// 422: the plugin was refused; the old one keeps running.
    Plugin(String),
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::Invalid(m)
            | Refusal::NotFound(m)
            | Refusal::Conflict(m)
            | Refusal::Plugin(m) => f.write_str(m),
        }
    }
}

impl Tenant {
    /// Reads a pipeline file of this tenant deployed as `name` and makes it
    /// safe to run: every error names `file` and the key.
    pub fn admit(&self, name: &str, text: &str, file: &Path) -> Result<PipelineConfig, String> {
        // Before the name reaches a path: `..` would put the state in the
        // tenant's state root.
        weir_pipeline::config::check_name("pipeline name", name)
            .map_err(|e| format!("{}: {e}", file.display()))?;
        // `${VAR}` reaches only the variables the host file gives the
        // tenant: the host's environment holds the tokens, and other
        // tenants' secrets.
        let mut config = PipelineConfig::parse(text, file, &self.pipelines_dir, |var| {
            self.config
                .env
                .iter()
                .any(|own| own == var)
                .then(|| std::env::var(var).ok())
                .flatten()
        })
        .map_err(|e| {
            let e = e.to_string();
            if e.contains("environment variable") {
                format!(
                    "{e}; under weir serve a pipeline file reads only the variables listed in \
                     tenants.{}.env in the host file",
                    self.name
                )
            } else {
                e
            }
        })?;
        let invalid = |detail: String| format!("{}: {detail}", file.display());
        let kind = config.source.kind();
        config
            .source
            .endpoints()
            .and_then(|endpoints| self.check_source_endpoints(kind, &endpoints))
            .map_err(|e| invalid(format!("source.{kind}: {e}")))?;
        if config.pipeline != name {
            return Err(invalid(format!(
                "pipeline: `{}` differs from the name it is deployed as (`{name}`)",
                config.pipeline
            )));
        }
        if config.state_dir != Path::new(".weir") {
            return Err(invalid(
                "state_dir: not allowed under weir serve (the host keeps every pipeline's \
                 positions and epochs in its own state folder)"
                    .into(),
            ));
        }
        config.state_dir = self.state_dir.join("pipelines").join(name);
        for (i, sink) in config.sinks.iter_mut().enumerate() {
            let field = format!("sinks[{i}]");
            let (url, options) = self
                .sink_root(name, &sink.blob_store.url)
                .map_err(|e| invalid(format!("{field}.blob_store.url: {e}")))?;
            if !sink.blob_store.options.is_empty() {
                return Err(invalid(format!(
                    "{field}.blob_store.options: not allowed under weir serve (roots are places \
                     in the tenant's root, whose options are the host's)"
                )));
            }
            sink.blob_store.url = url;
            sink.blob_store.options = options;
            if let Some(valve) = &mut sink.dead_letter {
                let (url, options) = self
                    .sink_root(name, &valve.url)
                    .map_err(|e| invalid(format!("{field}.dead_letter.url: {e}")))?;
                if !valve.options.is_empty() {
                    return Err(invalid(format!(
                        "{field}.dead_letter.options: not allowed under weir serve (the \
                         dead-letter location is a place in the tenant's root)"
                    )));
                }
                valve.url = url;
                valve.options = options;
            }
            sink.plugin = match plugin_ref::uploaded(&sink.plugin) {
                Some(sha256) => self.uploaded_plugin(&sink.name, sha256),
                None => self.plugin_path(&sink.plugin),
            }
            .map_err(|e| invalid(format!("{field}.plugin: {e}")))?;
            // A sink's own bounds on what the host shares may not pass its
            // tenant's: the tenant's count would refuse the rest anyway,
            // but a file asking for more is said to be wrong where it is.
            let most_sockets = self.config.max_sockets as u64;
            for (key, asked) in [
                ("max_tcp_connections", sink.limits.max_tcp_connections),
                (
                    "max_concurrent_requests",
                    sink.limits.max_concurrent_requests,
                ),
            ] {
                if asked > most_sockets {
                    return Err(invalid(format!(
                        "{field}.limits.{key}: {asked} is more than tenant `{}`'s max_sockets \
                         of {most_sockets} (tenants.{}.max_sockets in the host file)",
                        self.name, self.name
                    )));
                }
            }
            let asked = sink
                .grants
                .parse()
                .map_err(|e| invalid(format!("{field}.{e}")))?;
            if let Err((kind, pattern)) = self.grants.check_within(&asked) {
                return Err(invalid(format!(
                    "{field}.{}: `{pattern}` is not within tenant `{}`'s grants \
                     (tenants.{}.{} in the host file)",
                    kind.key(),
                    self.name,
                    self.name,
                    kind.key()
                )));
            }
        }
        Ok(config)
    }

    /// Every server a source connects to must be granted to the tenant
    /// (`tenants.<name>.sources.<kind>` in the host file); a Unix socket
    /// never is.
    fn check_source_endpoints(&self, kind: &str, endpoints: &[Endpoint]) -> Result<(), String> {
        for endpoint in endpoints {
            let (name, port) = match endpoint {
                Endpoint::Tcp { host, port } => (host.to_ascii_lowercase(), *port),
                Endpoint::Unix(path) => {
                    return Err(format!(
                        "`{path}` is a Unix socket, which is not allowed under weir serve"
                    ));
                }
            };
            let Some(sources) = self.sources.of(kind) else {
                return Err(format!("a {kind} source connects to no server"));
            };
            let allowed = match name.parse::<std::net::IpAddr>() {
                Ok(ip) => sources.allows_ip(ip, port).is_some(),
                Err(_) => sources.allows_tcp_name(&name, port).is_some(),
            };
            if !allowed {
                return Err(format!(
                    "`{name}:{port}` is not granted to tenant `{}` (tenants.{}.sources.{kind} in \
                     the host file)",
                    self.name, self.name
                ));
            }
        }
        Ok(())
    }

    /// Adds to a load error that names a missing grant whether the tenant
    /// could be granted it at all.
    pub fn explain(&self, message: String) -> String {
        for (key, none) in [
            ("grants.http", self.grants.http.is_empty()),
            ("grants.tcp", self.grants.tcp.is_empty()),
        ] {
            if message.contains(&format!("no `{key}`")) && none {
                return format!(
                    "{message} (tenant `{}` is granted none: tenants.{}.{key} in the host file)",
                    self.name, self.name
                );
            }
        }
        message
    }

    /// Whether the tenant may run `config` (from `file`) beside its other
    /// pipelines, given as the `memory_mb` each of them takes (the one
    /// `config` replaces left out): a new pipeline must fit under
    /// `max_pipelines`, and every pipeline's sinks under `max_memory_mb`
    /// together.
    pub fn check_counts(
        &self,
        config: &PipelineConfig,
        file: &Path,
        others: &[u64],
        replaces_one: bool,
    ) -> Result<(), Refusal> {
        if !replaces_one && others.len() >= self.config.max_pipelines {
            return Err(Refusal::Conflict(format!(
                "tenant `{}` already has {} pipelines, its max_pipelines",
                self.name,
                others.len()
            )));
        }
        let memory: u64 = others.iter().sum::<u64>() + config.sinks_memory_mb();
        if memory > self.config.max_memory_mb {
            return Err(Refusal::Invalid(format!(
                "{}: the sinks' memory_mb would bring tenant `{}` to {memory} MiB, over its \
                 max_memory_mb of {} MiB",
                file.display(),
                self.name,
                self.config.max_memory_mb
            )));
        }
        Ok(())
    }

    /// A sink's root: a relative folder path inside `<root>/<pipeline>`,
    /// made if missing, that resolves (links too) inside the tenant's root.
    /// A sink's root `url` (a relative path) in pipeline `pipeline`'s
    /// part of the tenant's root: the URL or folder the sink gets, and the
    /// object store's options.
    fn sink_root(
        &self,
        pipeline: &str,
        url: &str,
    ) -> Result<(String, BTreeMap<String, String>), String> {
        let relative = Path::new(url);
        let plain = !url.contains(':')
            && relative.is_relative()
            && relative
                .components()
                .all(|c| matches!(c, Component::Normal(_) | Component::CurDir))
            && relative
                .components()
                .any(|c| matches!(c, Component::Normal(_)));
        if !plain {
            return Err(format!(
                "`{url}` must be a relative folder path without `..` or a scheme: under weir \
                 serve a sink's root lies in its tenant's root"
            ));
        }
        let tenant_root = match &self.root {
            TenantRoot::Folder(folder) => folder,
            TenantRoot::Objects { url: root, options } => {
                // No links in object storage: the path's parts are the place.
                let parts: Vec<&str> = relative
                    .components()
                    .filter_map(|c| match c {
                        Component::Normal(part) => part.to_str(),
                        _ => None,
                    })
                    .collect();
                return Ok((
                    format!("{root}/{pipeline}/{}", parts.join("/")),
                    options.clone(),
                ));
            }
        };
        let wanted = tenant_root.join(pipeline).join(relative);
        let out = || {
            format!(
                "`{url}` leads out of tenant `{}`'s root (through a link)",
                self.name
            )
        };
        // The deepest part that exists (a link counts, even a dangling
        // one) must resolve inside the root before anything is made: a
        // link must not get a folder made at its far end.
        let mut existing = wanted.clone();
        while std::fs::symlink_metadata(&existing).is_err() {
            if !existing.pop() {
                return Err(out());
            }
        }
        let resolved = existing.canonicalize().map_err(|_| out())?;
        if !resolved.starts_with(tenant_root) {
            return Err(out());
        }
        let root = made(&wanted, "the root")?;
        if !root.starts_with(tenant_root) {
            return Err(out());
        }
        Ok((root.display().to_string(), BTreeMap::new()))
    }

    /// The upload a sink names as `sha256:<digest>`: a plugin the tenant
    /// uploaded with that digest (kept in its uploads by digest).
    pub fn uploaded_plugin(&self, sink: &str, sha256: &str) -> Result<PathBuf, String> {
        if !plugin_ref::is_digest(sha256) {
            return Err(format!(
                "sink `{sink}`: `{}{sha256}` is not a reference to an uploaded plugin: \
                 `{}` takes a sha256 digest, 64 hex digits",
                plugin_ref::PREFIX,
                plugin_ref::PREFIX
            ));
        }
        let sha256 = sha256.to_ascii_lowercase();
        let path = self.uploads_dir().join(format!("{sha256}.wasm"));
        if !path.is_file() {
            return Err(format!(
                "sink `{sink}` names the uploaded plugin {}, which tenant `{}` has not \
                 uploaded; upload it with `weir ctl apply --plugin FILE` (or PUT \
                 /v1/tenants/{}/plugins/{sha256})",
                plugin_ref::reference(&sha256),
                self.name,
                self.name
            ));
        }
        Ok(path)
    }

    /// A plugin path, resolved inside the tenant's pipelines folder or its
    /// uploads.
    pub fn plugin_path(&self, path: &Path) -> Result<PathBuf, String> {
        let joined = if path.is_absolute() {
            path.to_path_buf()
        } else {
            self.pipelines_dir.join(path)
        };
        let resolved = joined
            .canonicalize()
            .map_err(|e| format!("`{}`: {e}", path.display()))?;
        let uploads = self.uploads_dir().canonicalize().ok();
        let inside = resolved.starts_with(&self.pipelines_dir)
            || uploads.is_some_and(|u| resolved.starts_with(u));
        if !inside {
            return Err(format!(
                "`{}` lies outside tenant `{}`'s pipelines folder",
                path.display(),
                self.name
            ));
        }
        Ok(resolved)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host_file::HostConfig;

    /// Two tenants in a temporary folder, with a plugin file each.
    fn host(dir: &Path) -> HostConfig {
        let text = "listen: 127.0.0.1:0\nstate_dir: state\npipelines_dir: pipelines\n\
            operator_token_env: WEIR_TEST_OPERATOR\n\
            tenants:\n\
            \x20 a:\n    token_env: WEIR_TEST_TOKEN_A\n    root: data/a\n    env: [WEIR_TENANT_A_SECRET]\n\
            \x20   grants: { http: [\"https://*.a.example\"], tcp: [\"10.1.0.0/16:6379\"] }\n\
            \x20   sources: { postgres: [\"db.a.example:5432\"], mysql: [\"my.a.example:3306\"] }\n\
            \x20 b:\n    token_env: WEIR_TEST_TOKEN_B\n    root: data/b\n    env: [WEIR_TENANT_B_SECRET]\n";
        // SAFETY: set before any thread of this test reads the environment;
        // every test sets the same values.
        unsafe {
            std::env::set_var("WEIR_TEST_TOKEN_A", "token-of-tenant-a-0123456789");
            std::env::set_var("WEIR_TEST_TOKEN_B", "token-of-tenant-b-0123456789");
            std::env::set_var("WEIR_TENANT_A_SECRET", "from-a");
            std::env::set_var("WEIR_TENANT_B_SECRET", "from-b");
        }
        let host = HostConfig::parse(text, &dir.join("host.yaml"), dir).unwrap();
        for tenant in ["a", "b"] {
            let folder = dir.join("pipelines").join(tenant);
            std::fs::create_dir_all(&folder).unwrap();
            std::fs::write(folder.join("sink.wasm"), b"not looked at here").unwrap();
        }
        host
    }

    fn pipeline(sink_extra: &str) -> String {
        format!(
            "pipeline: p\nsource: {{ generator: {{ seed: 1 }} }}\nsinks:\n  - name: s\n    \
             plugin: sink.wasm\n    blob_store: {{ url: lake }}\n{sink_extra}"
        )
    }

    #[test]
    fn a_pipeline_is_held_inside_its_tenant() {
        let dir = tempfile::tempdir().unwrap();
        let host = host(dir.path());
        let a = Tenant::open(&host, "a", None).unwrap();
        let config = a.admit("p", &pipeline(""), Path::new("p.yaml")).unwrap();
        let root = PathBuf::from(&config.sinks[0].blob_store.url);
        assert!(
            root.starts_with(a.root.folder().unwrap()) && root.ends_with("p/lake"),
            "{root:?}"
        );
        assert!(config.state_dir.starts_with(&a.state_dir));
        assert!(config.sinks[0].plugin.starts_with(&a.pipelines_dir));
    }

    #[test]
    fn a_tenant_root_on_object_storage_holds_its_sinks_under_its_prefix() {
        let dir = tempfile::tempdir().unwrap();
        let mut host = host(dir.path());
        let a = host.tenants.get_mut("a").unwrap();
        a.root = "s3://lake-bucket/tenants/a/".into();
        a.root_options = BTreeMap::from([
            ("aws_region".to_string(), "eu-west-1".to_string()),
            (
                "aws_secret_access_key".to_string(),
                "${WEIR_TENANT_A_SECRET}".to_string(),
            ),
        ]);
        let a = Tenant::open(&host, "a", None).unwrap();
        let b = Tenant::open(&host, "b", None).unwrap();
        assert!(!a.root.overlaps(&b.root));
        let config = a
            .admit(
                "p",
                &pipeline("    dead_letter: { url: ./refused/here }\n"),
                Path::new("p.yaml"),
            )
            .unwrap();
        let sink = &config.sinks[0];
        assert_eq!(sink.blob_store.url, "s3://lake-bucket/tenants/a/p/lake");
        assert_eq!(
            sink.blob_store
                .options
                .get("aws_secret_access_key")
                .map(String::as_str),
            Some("from-a"),
            "the options' ${{VAR}} is read from the host's environment"
        );
        let valve = sink.dead_letter.as_ref().unwrap();
        assert_eq!(valve.url, "s3://lake-bucket/tenants/a/p/refused/here");
        assert_eq!(valve.options, sink.blob_store.options);
        for url in ["../b/lake", "s3://lake-bucket/elsewhere", "/abs"] {
            let error = a
                .admit(
                    "p",
                    &pipeline("").replace("url: lake", &format!("url: {url}")),
                    Path::new("p.yaml"),
                )
                .unwrap_err();
            assert!(error.contains("blob_store.url"), "{url}: {error}");
        }
        // A prefix inside another tenant's is an overlap; a sibling is not.
        let nested = TenantRoot::Objects {
            url: "s3://lake-bucket/tenants/a/deeper".into(),
            options: BTreeMap::new(),
        };
        let sibling = TenantRoot::Objects {
            url: "s3://lake-bucket/tenants/ab".into(),
            options: BTreeMap::new(),
        };
        assert!(a.root.overlaps(&nested) && nested.overlaps(&a.root));
        assert!(!a.root.overlaps(&sibling));
        // A URL that names no place, and options for a folder, are refused.
        let mut bad = host.clone();
        bad.tenants.get_mut("a").unwrap().root = "s3://".into();
        assert!(Tenant::open(&bad, "a", None).is_err_and(|e| e.contains("tenants.a.root")));
        let mut bad = host.clone();
        bad.tenants.get_mut("b").unwrap().root_options =
            BTreeMap::from([("aws_region".to_string(), "x".to_string())]);
        assert!(Tenant::open(&bad, "b", None).is_err_and(|e| e.contains("root_options")));
    }

    #[test]
    fn a_dead_letter_location_is_held_inside_its_tenant() {
        let dir = tempfile::tempdir().unwrap();
        let host = host(dir.path());
        let a = Tenant::open(&host, "a", None).unwrap();
        let config = a
            .admit(
                "p",
                &pipeline("    dead_letter: { url: refused }\n"),
                Path::new("p.yaml"),
            )
            .unwrap();
        let valve = PathBuf::from(&config.sinks[0].dead_letter.as_ref().unwrap().url);
        assert!(
            valve.starts_with(a.root.folder().unwrap()) && valve.ends_with("p/refused"),
            "{valve:?}"
        );
        for valve in [
            "{ url: \"../../b/p\" }",
            "{ url: \"s3://bucket/x\" }",
            "{ url: refused, options: { aws_region: x } }",
        ] {
            let error = a
                .admit(
                    "p",
                    &pipeline(&format!("    dead_letter: {valve}\n")),
                    Path::new("p.yaml"),
                )
                .unwrap_err();
            assert!(error.contains("sinks[0].dead_letter"), "{valve}: {error}");
        }
    }

    #[test]
    fn escapes_from_the_tenant_are_refused_naming_the_key() {
        let dir = tempfile::tempdir().unwrap();
        let host = host(dir.path());
        let a = Tenant::open(&host, "a", None).unwrap();
        let b = Tenant::open(&host, "b", None).unwrap();
        let refused = |text: String, key: &str| {
            let error = a.admit("p", &text, Path::new("p.yaml")).unwrap_err();
            assert!(error.contains(key), "expected `{key}` in: {error}");
        };
        for url in [
            "../../b/p",
            "/tmp/elsewhere",
            "file:///tmp/x",
            "s3://bucket/x",
            ".",
        ] {
            refused(
                pipeline("").replace("url: lake", &format!("url: \"{url}\"")),
                "blob_store.url",
            );
        }
        // A link in A's root that leads into B's.
        std::os::unix::fs::symlink(
            b.root.folder().unwrap(),
            a.root.folder().unwrap().join("into-b"),
        )
        .unwrap();
        std::fs::create_dir_all(a.root.folder().unwrap().join("p")).unwrap();
        std::os::unix::fs::symlink(
            b.root.folder().unwrap(),
            a.root.folder().unwrap().join("p").join("lake"),
        )
        .unwrap();
        refused(pipeline(""), "leads out of tenant `a`'s root");
        std::fs::remove_file(a.root.folder().unwrap().join("p").join("lake")).unwrap();
        // B's plugin, by a path out of A's folder.
        refused(
            pipeline("").replace("plugin: sink.wasm", "plugin: ../b/sink.wasm"),
            "sinks[0].plugin",
        );
        refused(
            format!("{}state_dir: elsewhere\n", pipeline("")),
            "state_dir",
        );
        refused(
            pipeline("").replace("pipeline: p", "pipeline: q"),
            "differs from the name",
        );
        refused(
            pipeline("    grants: { tcp: [\"10.2.0.1:6379\"] }\n"),
            "grants.tcp",
        );
        refused(
            pipeline("    grants: { http: [\"https://b.example\"] }\n"),
            "grants.http",
        );
        // Another tenant's variable, and the host's own, are not there.
        refused(
            pipeline("    config: { k: \"${WEIR_TENANT_B_SECRET}\" }\n"),
            "WEIR_TENANT_B_SECRET",
        );
        refused(
            pipeline("    config: { k: \"${WEIR_TEST_TOKEN_A}\" }\n"),
            "WEIR_TEST_TOKEN_A",
        );
        let own = a
            .admit(
                "p",
                &pipeline("    config: { k: \"${WEIR_TENANT_A_SECRET}\" }\n"),
                Path::new("p.yaml"),
            )
            .unwrap();
        assert_eq!(own.sinks[0].config["k"], "from-a");
        // Grants within the tenant's are taken.
        a.admit(
            "p",
            &pipeline(
                "    grants: { http: [\"https://api.a.example\"], tcp: [\"10.1.2.3:6379\"] }\n",
            ),
            Path::new("p.yaml"),
        )
        .unwrap();
    }

    #[test]
    fn an_uploaded_plugin_is_named_by_its_digest_and_only_the_tenants_own() {
        let dir = tempfile::tempdir().unwrap();
        let host = host(dir.path());
        let a = Tenant::open(&host, "a", None).unwrap();
        let b = Tenant::open(&host, "b", None).unwrap();
        let digest = "0123456789abcdef".repeat(4);
        std::fs::create_dir_all(a.uploads_dir()).unwrap();
        std::fs::write(a.uploads_dir().join(format!("{digest}.wasm")), b"\0asm").unwrap();
        let named = |reference: &str| {
            pipeline("").replace("plugin: sink.wasm", &format!("plugin: {reference}"))
        };
        let config = a
            .admit(
                "p",
                &named(&format!("sha256:{digest}")),
                Path::new("p.yaml"),
            )
            .unwrap();
        assert_eq!(
            config.sinks[0].plugin,
            a.uploads_dir().join(format!("{digest}.wasm"))
        );
        // Upper case names the same upload.
        let upper = format!("sha256:{}", digest.to_ascii_uppercase());
        a.admit("p", &named(&upper), Path::new("p.yaml")).unwrap();
        // Tenant B has not uploaded it: A's upload is not B's.
        let error = b
            .admit(
                "p",
                &named(&format!("sha256:{digest}")),
                Path::new("p.yaml"),
            )
            .unwrap_err();
        assert!(
            error.contains(&format!(
                "sinks[0].plugin: sink `s` names the uploaded plugin sha256:{digest}, which \
                 tenant `b` has not uploaded; upload it with `weir ctl apply --plugin FILE`"
            )),
            "{error}"
        );
        for bad in ["sha256:abc", "sha256:../../a/plugins/x"] {
            let error = a.admit("p", &named(bad), Path::new("p.yaml")).unwrap_err();
            assert!(
                error.contains("is not a reference to an uploaded plugin"),
                "{bad}: {error}"
            );
        }
    }

    fn postgres_pipeline(dsn: &str) -> String {
        pipeline("").replace(
            "source: { generator: { seed: 1 } }",
            &format!("source: {{ postgres: {{ dsn: \"{dsn}\", publication: p, slot: s }} }}"),
        )
    }

    #[test]
    fn a_database_must_be_granted_to_the_tenant() {
        let dir = tempfile::tempdir().unwrap();
        let host = host(dir.path());
        let a = Tenant::open(&host, "a", None).unwrap();
        let admit = |dsn: &str| a.admit("p", &postgres_pipeline(dsn), Path::new("p.yaml"));
        admit("host=db.a.example user=x dbname=y").unwrap();
        for dsn in [
            "host=db.b.example user=x",
            "host=db.a.example port=6543 user=x",
            "host=/var/run/postgresql user=x",
            "postgresql://x@10.0.0.1:5432/y",
            "user=x dbname=y",
        ] {
            let error = admit(dsn).expect_err(dsn);
            assert!(error.contains("source.postgres: "), "{error}");
        }
    }

    #[test]
    fn a_mysql_server_must_be_granted_to_the_tenant_as_one() {
        let dir = tempfile::tempdir().unwrap();
        let host = host(dir.path());
        let a = Tenant::open(&host, "a", None).unwrap();
        let mysql = |host: &str, port: u16| {
            pipeline("").replace(
                "source: { generator: { seed: 1 } }",
                &format!(
                    "source: {{ mysql: {{ host: \"{host}\", port: {port}, user: u, server_id: 9, tables: [\"d.*\"] }} }}"
                ),
            )
        };
        a.admit("p", &mysql("my.a.example", 3306), Path::new("p.yaml"))
            .unwrap();
        // The Postgres grant does not let a MySQL source reach that server.
        for (host, port) in [
            ("db.a.example", 5432),
            ("my.a.example", 3307),
            ("my.b.example", 3306),
        ] {
            let error = a
                .admit("p", &mysql(host, port), Path::new("p.yaml"))
                .expect_err(host);
            assert!(
                error.contains("source.mysql: ") && error.contains("sources.mysql"),
                "{error}"
            );
        }
    }
}
