//! Two tenants on one `weir serve`: tenant B streams a paced generator
//! pipeline into the positioned fixture from the first minute to the last,
//! while tenant A tries everything docs/serve.md says a tenant cannot do:
//! name B's blob root (`..`, an absolute path, a `file://` URL, a link in
//! its own root), read the host's environment through `${VAR}`, reach out
//! of its root through the blob API, store past its quota, flood the log,
//! spin, blow its memory and trap mid-commit until it is parked, exceed its
//! pipeline and memory bounds, ask for grants beyond its own, and steer B's
//! pipeline with its own token.
//!
//! Every attempt must be refused with an error naming what and where, or
//! contained to A. After each one, B must still be running its own
//! definition and plugin, and nothing of A's may appear in B's root. At the
//! end B's destination must equal the generator's oracle exactly.

use crate::common;
use weir_source::commit_order::StreamPosition;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::*;
use serde_json::Value;
use weir_core::position::Position;

const TENANT_A: &str = "A";
const TENANT_B: &str = "B";

const B_PIPELINE: &str = "orders";
/// B's sink has a name no sink of A has: the host's log names a sink's
/// lines by the sink alone.
const B_SINK: &str = "b-lake";
const B_SEED: u64 = 41;
const B_CHANGES: u64 = 30_000;
/// About 125 changes a second: B outlasts every attempt of A (the whole
/// stream would take about four minutes); the test lifts the pace once A
/// is done, so B finishes in seconds.
const B_PACE_US: u64 = 20_000;

/// The environment variables `ServeHost` passes the tokens in
/// (tests/support/src/serve.rs): what a `${VAR}` of A's would aim at.
const OPERATOR_TOKEN_ENV: &str = "WEIR_TEST_OPERATOR_TOKEN";
const B_TOKEN_ENV: &str = "WEIR_TEST_TOKEN_B";

/// The host's restarts: a failed pipeline waits 500 ms, then 1 s, and is
/// parked at its third failure in a row.
const FIRST_BACKOFF_MS: u64 = 500;
const MAX_BACKOFF_MS: u64 = 2_000;
const MAX_FAILURES: u32 = 3;

/// Tenant A's bounds. Its seven runtime attempts, 64 MiB each, fit in its
/// memory and fill its pipelines.
const A_MAX_PIPELINES: u32 = 7;
const A_MAX_MEMORY_MB: u64 = 512;
const A_SINK_MEMORY_MB: u64 = 64;
const A_MAX_STORED_MB: u64 = 1;
const A_LOG_RATE: u64 = 20;
const A_LOG_BURST: u64 = 40;
const A_HTTP_GRANT: &str = "https://*.a.example";

/// How long A's pipelines may take to be parked: compiling four plugins on
/// a busy machine, then three runs and two back-offs each.
const PARK_TIMEOUT: Duration = Duration::from_secs(120);

/// How long the flood lasts inside the hoard fixture's one `write`.
const FLOOD_MS: u64 = 3_000;

fn start_host() -> ServeHost {
    ServeHost::builder()
        .tenant(
            Tenant::new(TENANT_A)
                .max_pipelines(A_MAX_PIPELINES)
                .max_memory_mb(A_MAX_MEMORY_MB)
                .max_stored_mb(A_MAX_STORED_MB)
                .log_rate(A_LOG_RATE, A_LOG_BURST)
                .grant_http(A_HTTP_GRANT),
        )
        .tenant(Tenant::new(TENANT_B))
        .restart(FIRST_BACKOFF_MS, MAX_BACKOFF_MS, MAX_FAILURES)
        // The sinks' own lines at debug: the positioned fixture logs each
        // commit there, which is how B's lines show in the host's log.
        .log("info,weir_runtime::capability::log=debug")
        .start()
}

fn b_pipeline(pace_us: u64) -> PipelineBuilder {
    paced_positioned(B_PIPELINE, B_SINK, B_SEED, B_CHANGES, pace_us)
}

/// One of A's pipelines: a bounded generator into one required sink.
fn a_pipeline(name: &str, sink: SinkBuilder) -> PipelineBuilder {
    PipelineBuilder::generator(7, 2_000)
        .name(name)
        .max_rows(200)
        .linger_ms(20)
        .heartbeat_ms(200)
        .sink(sink)
}

/// Sink `name` of A running the fixture crate `crate_name`, within A's
/// memory share, failing at once rather than retrying.
fn a_sink(name: &str, crate_name: &str, call_timeout_ms: u64) -> SinkBuilder {
    SinkBuilder::new(name, plugin(crate_name))
        .limits(A_SINK_MEMORY_MB, call_timeout_ms)
        .retries(0)
}

/// What B is and must stay, and the checks made after each attempt of A.
struct BWitness {
    definition: String,
    sha256: String,
    changes_seen: u64,
}

impl BWitness {
    fn new(host: &ServeHost) -> Self {
        let status = b_status(host);
        BWitness {
            definition: b_definition(host),
            sha256: status["plugins"][B_SINK]["sha256"]
                .as_str()
                .expect("B's plugin digest")
                .to_string(),
            changes_seen: changes_of(&status),
        }
    }

    /// B runs its own definition and plugin, and nothing but its commits
    /// lies in B's root.
    fn unharmed(&self, host: &ServeHost, after: &str) {
        let status = b_status(host);
        assert_eq!(
            status["state"], "running",
            "after {after}: B is not running: {status}"
        );
        assert_eq!(
            status["plugins"][B_SINK]["sha256"], self.sha256,
            "after {after}: B's plugin changed: {status}"
        );
        assert_eq!(
            b_definition(host),
            self.definition,
            "after {after}: B's pipeline file changed"
        );
        let foreign = foreign_in_b_root(host);
        assert!(
            foreign.is_empty(),
            "after {after}: B's root holds what B's sink did not write: {foreign:?}"
        );
        let uploads = host.dir().join("state/tenants/B/plugins");
        let uploaded = list_files(&uploads);
        assert!(
            uploaded.is_empty(),
            "after {after}: plugins were uploaded for B: {uploaded:?}"
        );
    }

    /// Like [`Self::unharmed`], and B takes changes: more than at the last
    /// look, within a few seconds.
    fn unharmed_and_moving(&mut self, host: &ServeHost, after: &str) {
        self.unharmed(host, after);
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let changes = changes_of(&b_status(host));
            if changes > self.changes_seen {
                self.changes_seen = changes;
                return;
            }
            assert!(
                Instant::now() < deadline,
                "after {after}: B took no change in 10 s ({changes} in all)"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

fn b_status(host: &ServeHost) -> Value {
    host.status(TENANT_B, B_PIPELINE, host.operator_token())
}

fn changes_of(status: &Value) -> u64 {
    status["live"]["changes"].as_u64().unwrap_or(0)
}

fn b_definition(host: &ServeHost) -> String {
    let file = host
        .pipelines_dir(TENANT_B)
        .join(format!("{B_PIPELINE}.yaml"));
    std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()))
}

/// Everything in B's root that is not B's sink's folder, its tables'
/// folders, or a commit object of the positioned fixture in them (or the
/// temporary file of a put under way).
fn foreign_in_b_root(host: &ServeHost) -> Vec<PathBuf> {
    let root = host.tenant_root(TENANT_B);
    let tables: Vec<String> = shop_tables().iter().map(|t| t.name.clone()).collect();
    let mut foreign = Vec::new();
    let mut folders = vec![root.clone()];
    while let Some(folder) = folders.pop() {
        for entry in std::fs::read_dir(&folder).into_iter().flatten().flatten() {
            let path = entry.path();
            let relative = path.strip_prefix(&root).unwrap().to_path_buf();
            let parts: Vec<String> = relative
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect();
            let kind = entry.file_type().unwrap();
            let expected = match parts.as_slice() {
                [pipeline] => pipeline == B_PIPELINE && kind.is_dir(),
                [_, sink] => sink == B_SINK && kind.is_dir(),
                [_, _, table] => tables.contains(table) && kind.is_dir(),
                [_, _, _, file] => {
                    kind.is_file() && (is_commit_object(file) || file.starts_with(".weir-tmp-"))
                }
                _ => false,
            };
            if !expected {
                foreign.push(relative);
            } else if kind.is_dir() {
                folders.push(path);
            }
        }
    }
    foreign
}

fn is_commit_object(name: &str) -> bool {
    name.strip_suffix(".arrow")
        .is_some_and(|digits| digits.len() == 20 && digits.bytes().all(|b| b.is_ascii_digit()))
}

fn list_files(folder: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(folder)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .collect()
}

/// Asserts a refused deploy: `code`, every needle in the error, no file
/// written into A's watched folder, and no such pipeline.
fn assert_refused_deploy(host: &ServeHost, reply: &Reply, name: &str, code: u16, needles: &[&str]) {
    assert_eq!(
        reply.code, code,
        "deploying A/{name}: expected {code}, got {reply}"
    );
    let error = reply.error();
    for needle in needles {
        assert!(
            error.contains(needle),
            "deploying A/{name}: the refusal does not say {needle:?}: {error}"
        );
    }
    let file = host.pipelines_dir(TENANT_A).join(format!("{name}.yaml"));
    assert!(
        !file.exists(),
        "deploying A/{name}: the refused file was written to {}",
        file.display()
    );
    let status = host.get_with(
        &format!("/v1/pipelines/{TENANT_A}/{name}"),
        host.operator_token(),
    );
    assert_eq!(
        status.code, 404,
        "A/{name} exists after a refused deploy: {status}"
    );
}

/// The file name `PipelineBuilder::for_serve` gives the plugin of crate
/// `crate_name`.
fn plugin_file_name(crate_name: &str) -> String {
    plugin(crate_name)
        .file_name()
        .unwrap()
        .to_string_lossy()
        .into_owned()
}

/// A's pipeline `name`, as `deploy` would put it, with `from` replaced by
/// `to` in its text: a key the builder cannot write.
fn put_edited(host: &ServeHost, pipeline: &PipelineBuilder, from: &str, to: &str) -> Reply {
    for plugin in pipeline.plugins() {
        host.add_plugin(
            TENANT_A,
            &plugin.file_name().unwrap().to_string_lossy(),
            &std::fs::read(plugin).unwrap(),
        );
    }
    let text = pipeline.clone().for_serve().text();
    assert!(text.contains(from), "{from:?} is not in {text}");
    let edited = text.replace(from, to);
    host.put_pipeline(
        TENANT_A,
        pipeline.pipeline_name(),
        &edited,
        host.token(TENANT_A),
    )
}

/// `blob_store.url` aimed at B's root: `..`, an absolute path, a `file://`
/// URL, and a link A planted in its own root.
fn a_cannot_name_b_root(host: &ServeHost, b: &BWitness) {
    let b_sink_root = host.sink_root(TENANT_B, B_PIPELINE, B_SINK);
    let absolute = b_sink_root.to_str().unwrap().to_string();
    let attempts = [
        ("dots", "../../B/orders/b-lake".to_string(), "without `..`"),
        ("absolute", absolute.clone(), "must be a relative folder"),
        ("url", format!("file://{absolute}"), "or a scheme"),
    ];
    for (name, url, because) in attempts {
        // The builder keeps only relative roots for `weir serve`: the
        // others are written into the text.
        let pipeline = a_pipeline(name, a_sink("lake", "weir-fixture-positioned", 30_000));
        let reply = put_edited(
            host,
            &pipeline,
            "\"url\": \"lake\"",
            &format!("\"url\": \"{url}\""),
        );
        let file = format!("pipelines/{TENANT_A}/{name}.yaml");
        assert_refused_deploy(
            host,
            &reply,
            name,
            400,
            &[&file, "sinks[0].blob_store.url", &url, because],
        );
        b.unharmed(host, &format!("blob_store.url {url:?}"));
    }

    // A link in A's root where the sink's root would be, into B's root.
    let linked = host.tenant_root(TENANT_A).join("linked");
    std::fs::create_dir_all(&linked).unwrap();
    std::os::unix::fs::symlink(host.tenant_root(TENANT_B), linked.join("lake")).unwrap();
    let pipeline = a_pipeline("linked", a_sink("lake", "weir-fixture-positioned", 30_000));
    let reply = host.deploy(TENANT_A, &pipeline, host.token(TENANT_A));
    assert_refused_deploy(
        host,
        &reply,
        "linked",
        400,
        &[
            "pipelines/A/linked.yaml",
            "sinks[0].blob_store.url",
            "leads out of tenant `A`'s root",
        ],
    );
    b.unharmed(host, "a blob root through a link into B's root");
}

/// `${VAR}` naming the host's tokens, and plugin paths into B's folder.
fn a_cannot_read_the_host_environment_or_b_plugins(host: &ServeHost, b: &BWitness) {
    let secrets = [
        host.operator_token().to_string(),
        host.token(TENANT_B).to_string(),
    ];
    for variable in [OPERATOR_TOKEN_ENV, B_TOKEN_ENV] {
        let name = format!("env-{}", variable.to_lowercase().replace('_', "-"));
        let pipeline = a_pipeline(
            &name,
            a_sink("lake", "weir-fixture-positioned", 30_000)
                .config("secret", &format!("${{{variable}}}")),
        );
        let reply = host.deploy(TENANT_A, &pipeline, host.token(TENANT_A));
        let file = format!("pipelines/A/{name}.yaml");
        assert_refused_deploy(host, &reply, &name, 400, &[&file, variable, "line "]);
        for secret in &secrets {
            assert!(
                !reply.body.contains(secret.as_str()),
                "the refusal of `${{{variable}}}` shows a token: {reply}"
            );
        }
        b.unharmed(host, &format!("`${{{variable}}}`"));
    }

    // B's plugin, by a path out of A's pipelines folder and by its
    // absolute path.
    let positioned = plugin_file_name("weir-fixture-positioned");
    let b_plugin = host.pipelines_dir(TENANT_B).join(&positioned);
    assert!(
        b_plugin.exists(),
        "B's plugin is not at {}",
        b_plugin.display()
    );
    let quoted = format!("\"plugin\": \"{positioned}\"");
    for (name, path) in [
        ("plugin-dots", format!("../B/{positioned}")),
        ("plugin-absolute", b_plugin.to_str().unwrap().to_string()),
    ] {
        let pipeline = a_pipeline(name, a_sink("lake", "weir-fixture-positioned", 30_000));
        let reply = put_edited(host, &pipeline, &quoted, &format!("\"plugin\": \"{path}\""));
        assert_refused_deploy(
            host,
            &reply,
            name,
            400,
            &[
                &format!("pipelines/A/{name}.yaml"),
                "sinks[0].plugin",
                "outside tenant `A`'s pipelines folder",
            ],
        );
        b.unharmed(host, &format!("plugin path {path:?}"));
    }
}

/// Grants beyond A's: any TCP (A has none), HTTP to hosts, schemes and
/// ports its one pattern does not cover.
fn a_cannot_grant_itself_more(host: &ServeHost, b: &BWitness) {
    let tcp = a_pipeline(
        "grab-tcp",
        a_sink("lake", "weir-fixture-positioned", 30_000).grant_tcp("10.1.0.0/16:6379"),
    );
    let reply = host.deploy(TENANT_A, &tcp, host.token(TENANT_A));
    assert_refused_deploy(
        host,
        &reply,
        "grab-tcp",
        400,
        &[
            "pipelines/A/grab-tcp.yaml",
            "sinks[0].grants.tcp",
            "10.1.0.0/16:6379",
            "tenants.A.grants.tcp",
        ],
    );
    b.unharmed(host, "grants.tcp beyond A's");
    // The last one is no narrower grant at all: refused as a pattern.
    let within = "not within tenant `A`'s grants (tenants.A.grants.http";
    for (i, (pattern, because)) in [
        ("https://b.example", within),
        ("https://x.a.example.b.example", within),
        ("http://x.a.example", within),
        ("https://x.a.example:8443", within),
        ("https://*", "grants every host"),
    ]
    .into_iter()
    .enumerate()
    {
        let name = format!("grab-http-{i}");
        let pipeline = a_pipeline(
            &name,
            a_sink("lake", "weir-fixture-positioned", 30_000).grant_http(pattern),
        );
        let reply = host.deploy(TENANT_A, &pipeline, host.token(TENANT_A));
        assert_refused_deploy(
            host,
            &reply,
            &name,
            400,
            &[
                &format!("pipelines/A/{name}.yaml"),
                "sinks[0].grants.http",
                pattern,
                because,
            ],
        );
        b.unharmed(host, &format!("grants.http {pattern}"));
    }
}

/// One pipeline whose sinks ask more memory than A has at all.
fn a_cannot_take_more_memory_than_its_bound(host: &ServeHost, b: &BWitness) {
    let pipeline = a_pipeline(
        "greedy",
        SinkBuilder::new("lake", plugin("weir-fixture-positioned"))
            .limits(A_MAX_MEMORY_MB + 1, 30_000),
    );
    let reply = host.deploy(TENANT_A, &pipeline, host.token(TENANT_A));
    assert_refused_deploy(
        host,
        &reply,
        "greedy",
        400,
        &[
            "pipelines/A/greedy.yaml",
            "memory_mb",
            &format!("over its max_memory_mb of {A_MAX_MEMORY_MB} MiB"),
        ],
    );
    b.unharmed(host, "memory_mb over A's max_memory_mb");
}

/// A's token on B's pipeline: every route answers 404 exactly as for a
/// pipeline that does not exist, and B is untouched.
fn a_token_cannot_reach_b(host: &ServeHost, b: &BWitness) {
    let a = host.token(TENANT_A);
    let wasm = std::fs::read(plugin("weir-fixture-positioned")).unwrap();
    let other_version = with_custom_section(&wasm, "weir-test-intruder", b"A");
    let b_yaml = b_pipeline(0).for_serve().text();
    type Attempt<'a> = (&'a str, Box<dyn Fn(&str) -> Reply + 'a>);
    let attempts: Vec<Attempt> = vec![
        (
            "GET status",
            Box::new(|p| host.get_with(&format!("/v1/pipelines/B/{p}"), a)),
        ),
        ("pause", Box::new(|p| host.pause(TENANT_B, p, a))),
        ("resume", Box::new(|p| host.resume(TENANT_B, p, a))),
        ("stop", Box::new(|p| host.stop(TENANT_B, p, a))),
        ("start", Box::new(|p| host.start(TENANT_B, p, a))),
        ("delete", Box::new(|p| host.delete(TENANT_B, p, a))),
        (
            "PUT plugin",
            Box::new(|p| host.replace_plugin(TENANT_B, p, B_SINK, &other_version, None, a)),
        ),
        (
            "rollback",
            Box::new(|p| host.rollback(TENANT_B, p, B_SINK, a)),
        ),
        (
            "PUT pipeline",
            Box::new(|p| host.put_pipeline(TENANT_B, p, &b_yaml, a)),
        ),
    ];
    for (what, attempt) in &attempts {
        let reply = attempt(B_PIPELINE);
        assert_eq!(
            reply.code, 404,
            "{what} of B/orders with A's token: {reply}"
        );
        // What A learns must not tell B's pipeline from one that is not
        // there: the same answer for a name nobody deployed.
        let missing = attempt("no-such-pipeline");
        assert_eq!(
            (reply.code, reply.error().replace(B_PIPELINE, "?")),
            (
                missing.code,
                missing.error().replace("no-such-pipeline", "?")
            ),
            "{what} with A's token tells B/orders from a missing pipeline"
        );
        b.unharmed(host, &format!("{what} of B/orders with A's token"));
    }

    // Creating a pipeline in B with A's token: 404, no file, no folder.
    let intruder = b_pipeline(0).name("intruder").for_serve().text();
    let reply = host.put_pipeline(TENANT_B, "intruder", &intruder, a);
    assert_eq!(
        reply.code, 404,
        "creating B/intruder with A's token: {reply}"
    );
    assert!(!host.pipelines_dir(TENANT_B).join("intruder.yaml").exists());
    assert!(!host.tenant_root(TENANT_B).join("intruder").exists());
    let as_operator = host.get_with("/v1/pipelines/B/intruder", host.operator_token());
    assert_eq!(as_operator.code, 404, "B/intruder exists: {as_operator}");
    // The upload above must not have been kept anywhere either.
    let a_uploads = list_files(&host.dir().join("state/tenants/A/plugins"));
    assert!(a_uploads.is_empty(), "uploads kept for A: {a_uploads:?}");

    // A's list shows none of B's pipelines.
    let listed = host.list(a);
    assert_eq!(listed.code, 200, "{listed}");
    let pipelines = listed.json()["pipelines"].clone();
    for entry in pipelines.as_array().unwrap() {
        assert_eq!(entry["tenant"], TENANT_A, "A's list shows {entry}");
    }
    b.unharmed(host, "creating B/intruder with A's token");
}

/// No token, an unknown token, an empty one: 401, saying what is wrong.
fn no_token_or_a_wrong_one_is_unauthorized(host: &ServeHost, b: &BWitness) {
    let b_path = format!("/v1/pipelines/{TENANT_B}/{B_PIPELINE}");
    let wrong = format!("{}x", host.token(TENANT_B));
    for (what, reply) in [
        ("no token, list", host.get("/v1/pipelines")),
        ("no token, status", host.get(&b_path)),
        ("wrong token, status", host.get_with(&b_path, &wrong)),
        (
            "wrong token, pause",
            host.pause(TENANT_B, B_PIPELINE, &wrong),
        ),
        (
            "wrong token, delete",
            host.delete(TENANT_B, B_PIPELINE, &wrong),
        ),
        ("empty token, stop", host.stop(TENANT_B, B_PIPELINE, "")),
    ] {
        assert_eq!(reply.code, 401, "{what}: {reply}");
        assert!(
            reply.error().contains("token") || reply.error().contains("Authorization"),
            "{what}: the refusal does not say what is missing: {reply}"
        );
        b.unharmed(host, what);
    }
}

/// One of A's runtime attempts that must end parked.
struct ToPark {
    pipeline: &'static str,
    /// Words its reason must hold.
    words: Vec<&'static str>,
    /// Whether each of its runs fails before committing anything, so it
    /// runs exactly `MAX_FAILURES` times. Not so for the quota attempt: a
    /// restart may still commit a small (empty) object under the quota,
    /// which starts the count of failures in a row again.
    fails_at_once: bool,
}

/// A's runtime attempts, deployed side by side: what must end parked.
fn deploy_runtime_attempts(host: &ServeHost) -> Vec<ToPark> {
    // A link inside the escaping sink's own root, into B's sink root.
    let peek_root = host.sink_root(TENANT_A, "peek-link", "bad");
    std::fs::create_dir_all(&peek_root).unwrap();
    std::os::unix::fs::symlink(
        host.sink_root(TENANT_B, B_PIPELINE, B_SINK),
        peek_root.join("b"),
    )
    .unwrap();
    let first_object = "shop.orders/00000000000000000001.arrow";
    let hoard_get = |path: &str| {
        a_sink("bad", "weir-fixture-hoard", 10_000)
            .config("mode", "huge-get")
            .config("path", path)
    };
    let pipelines = [
        a_pipeline(
            "peek-dots",
            hoard_get(&format!("../../../B/orders/b-lake/{first_object}")),
        ),
        a_pipeline("peek-link", hoard_get(&format!("b/{first_object}"))),
        PipelineBuilder::generator(9, 20_000)
            .name("quota")
            .max_rows(500)
            .linger_ms(20)
            .heartbeat_ms(200)
            .sink(a_sink("a-lake", "weir-fixture-positioned", 30_000)),
        a_pipeline(
            "flood",
            a_sink("noisy", "weir-fixture-hoard", 30_000)
                .config("mode", "log-flood")
                .config("size_mb", "1")
                .config("flood_ms", &FLOOD_MS.to_string()),
        ),
        a_pipeline("spin", a_sink("spinner", "weir-fixture-spin", 300)),
        a_pipeline("hog", a_sink("hogger", "weir-fixture-hog", 10_000)),
        a_pipeline(
            "trap",
            a_sink("trapper", "weir-fixture-stall", 10_000).config("mode", "panic-in-commit"),
        ),
    ];
    for pipeline in &pipelines {
        let reply = host.deploy(TENANT_A, pipeline, host.token(TENANT_A));
        assert!(
            reply.is_success(),
            "deploying A/{}: {reply}",
            pipeline.pipeline_name()
        );
    }
    let to_park = |pipeline, words: &[&'static str]| ToPark {
        pipeline,
        words: words.to_vec(),
        fails_at_once: pipeline != "quota",
    };
    vec![
        to_park(
            "peek-dots",
            &["`bad`", "denied", "`..` segment", "../../../B/orders"],
        ),
        to_park(
            "peek-link",
            &["`bad`", "denied", "follows a link out of the granted root"],
        ),
        to_park(
            "quota",
            &["`a-lake`", "tenant `A`'s quota", "tenants.A.max_stored_mb"],
        ),
        to_park("spin", &["`spinner`", "CPU deadline"]),
        to_park("hog", &["`hogger`", "memory limit of 64 MiB"]),
        to_park(
            "trap",
            &["`trapper`", "trapped", "stall fixture panics on purpose"],
        ),
    ]
}

/// With its seven pipelines deployed, an eighth is refused (409), and so
/// is growing one of them past A's memory (400); the grown one is unchanged.
fn a_cannot_exceed_its_pipelines_or_memory(host: &ServeHost, b: &BWitness) {
    let eighth = a_pipeline("eighth", a_sink("lake", "weir-fixture-positioned", 30_000));
    let reply = host.deploy(TENANT_A, &eighth, host.token(TENANT_A));
    assert_refused_deploy(
        host,
        &reply,
        "eighth",
        409,
        &[
            "tenant `A`",
            &format!("already has {A_MAX_PIPELINES} pipelines"),
            "max_pipelines",
        ],
    );
    b.unharmed(host, "an eighth pipeline of A");

    let spin_file = host.pipelines_dir(TENANT_A).join("spin.yaml");
    let before = std::fs::read_to_string(&spin_file).unwrap();
    let grown = a_pipeline(
        "spin",
        SinkBuilder::new("spinner", plugin("weir-fixture-spin"))
            .limits(A_MAX_MEMORY_MB - A_SINK_MEMORY_MB, 300)
            .retries(0),
    );
    let reply = host.deploy(TENANT_A, &grown, host.token(TENANT_A));
    assert_eq!(reply.code, 400, "growing A/spin past A's memory: {reply}");
    for needle in [
        "pipelines/A/spin.yaml",
        "memory_mb",
        &format!("over its max_memory_mb of {A_MAX_MEMORY_MB} MiB"),
    ] {
        assert!(
            reply.error().contains(needle),
            "the refusal does not say {needle:?}: {reply}"
        );
    }
    assert_eq!(
        std::fs::read_to_string(&spin_file).unwrap(),
        before,
        "A/spin's file changed though its change was refused"
    );
    b.unharmed(host, "growing A/spin past A's memory");
}

/// The host's log without terminal colours.
fn plain_log(host: &ServeHost) -> String {
    let log = host.log();
    let mut out = String::with_capacity(log.len());
    let mut chars = log.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' && chars.peek() == Some(&'[') {
            // An escape sequence ends with its first letter.
            for next in chars.by_ref() {
                if next.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// Seconds since midnight of a log line's leading timestamp
/// (`2026-01-01T12:34:56.789012Z ...`).
fn line_time(line: &str) -> Option<f64> {
    let clock = line.get(11..26)?;
    let mut parts = clock.split(':');
    let hours: f64 = parts.next()?.parse().ok()?;
    let minutes: f64 = parts.next()?.parse().ok()?;
    let seconds: f64 = parts.next()?.parse().ok()?;
    Some(hours * 3600.0 + minutes * 60.0 + seconds)
}

/// A's flood: its lines pass at A's rate and are reported dropped, B's
/// lines go on appearing, and `/health` answers throughout.
fn a_flood_is_rate_limited(host: &ServeHost, b: &BWitness) {
    let deadline = Instant::now() + PARK_TIMEOUT;
    while !plain_log(host).contains("flood line") {
        assert!(
            Instant::now() < deadline,
            "the flood never started\n{}",
            host.log_tail(60)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // The flood is under way: the host must answer while it lasts.
    let mut slowest = Duration::ZERO;
    let probing = Instant::now();
    while probing.elapsed() < Duration::from_millis(FLOOD_MS * 2 / 3) {
        let asked = Instant::now();
        let reply = host.get("/health");
        slowest = slowest.max(asked.elapsed());
        assert_eq!(reply.code, 200, "/health during the flood: {reply}");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        slowest < Duration::from_secs(2),
        "/health took {slowest:?} during the flood"
    );
    let report = "logged too fast for its tenant `A`";
    let deadline = Instant::now() + Duration::from_secs(30);
    while !plain_log(host).contains(report) {
        assert!(
            Instant::now() < deadline,
            "no report of A's dropped lines\n{}",
            host.log_tail(60)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // Let the flood end, so its last lines and reports are in.
    host.wait_for_state(TENANT_A, "flood", "finished", PARK_TIMEOUT);

    let log = plain_log(host);
    let flood: Vec<&str> = log.lines().filter(|l| l.contains("flood line")).collect();
    let first = line_time(flood[0]).expect("a timestamp");
    let last = line_time(flood[flood.len() - 1]).expect("a timestamp");
    // A's burst, then its rate for as long as lines came, and a second of
    // slack; A's other sinks' lines only lower what the flood could pass.
    let allowed = A_LOG_BURST + A_LOG_RATE * ((last - first).ceil() as u64 + 1);
    assert!(
        (flood.len() as u64) <= allowed,
        "{} of A's flood lines reached the log in {:.1} s; A's rate allows {allowed}",
        flood.len(),
        last - first
    );
    let reports: Vec<&str> = log.lines().filter(|l| l.contains(report)).collect();
    for needle in [
        "sink `noisy`",
        "lines dropped",
        &format!("tenants.A.log_lines_per_second = {A_LOG_RATE}"),
        &format!("tenants.A.log_burst = {A_LOG_BURST}"),
    ] {
        assert!(
            reports.iter().any(|l| l.contains(needle)),
            "no report of A's dropped lines says {needle:?}: {reports:?}"
        );
    }
    let b_lines = log
        .lines()
        .filter(|l| l.contains(&format!("sink=\"{B_SINK}\"")) && l.contains("committed"))
        .filter(|l| line_time(l).is_some_and(|t| first <= t && t <= last))
        .count();
    assert!(
        b_lines > 0,
        "none of B's lines reached the log while A flooded it ({:.1} s)",
        last - first
    );
    assert!(
        !log.lines()
            .any(|l| l.contains(&format!("sink `{B_SINK}` logged too fast"))),
        "B's lines were dropped for A's flood"
    );
    println!(
        "flood: {} of A's lines passed in {:.1} s (A allows {allowed}); {b_lines} of B's lines \
         meanwhile; /health at worst {slowest:?}",
        flood.len(),
        last - first
    );
    b.unharmed(host, "A's log flood");
}

/// The value of a pipeline's `weir_pipeline_restarts_total`.
fn restarts(host: &ServeHost, tenant: &str, pipeline: &str) -> f64 {
    let page = host.get_with("/metrics", host.operator_token());
    assert_eq!(page.code, 200, "{page}");
    let tenant_label = format!("tenant=\"{tenant}\"");
    let pipeline_label = format!("pipeline=\"{pipeline}\"");
    page.body
        .lines()
        .find(|l| {
            l.starts_with("weir_pipeline_restarts_total{")
                && l.contains(&tenant_label)
                && l.contains(&pipeline_label)
        })
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no restart count for {tenant}/{pipeline}: {}", page.body))
}

/// Every runtime attempt ends parked with its cause, after at most
/// `MAX_FAILURES` runs spaced by the back-off, and stays parked.
fn a_failing_pipelines_are_parked_not_hammered(host: &ServeHost, to_park: &[ToPark], b: &BWitness) {
    for attempt in to_park {
        let pipeline = attempt.pipeline;
        let status = host.wait_for_state(TENANT_A, pipeline, "parked", PARK_TIMEOUT);
        let reason = status["reason"].as_str().unwrap_or_default();
        let parked_after = format!("parked after {MAX_FAILURES} failures in a row");
        for word in attempt.words.iter().copied().chain([parked_after.as_str()]) {
            assert!(
                reason.contains(word),
                "A/{pipeline} is parked without saying {word:?}: {reason}"
            );
        }
        assert_eq!(status["failures"], MAX_FAILURES, "A/{pipeline}: {status}");
        b.unharmed(host, &format!("A/{pipeline} parked"));
    }
    // Twice the longest back-off more: nothing parked may run again.
    let counted: BTreeMap<&str, f64> = to_park
        .iter()
        .map(|a| (a.pipeline, restarts(host, TENANT_A, a.pipeline)))
        .collect();
    std::thread::sleep(Duration::from_millis(2 * MAX_BACKOFF_MS));
    let log = plain_log(host);
    let ready = host.get("/ready");
    assert_eq!(ready.code, 503, "/ready with parked pipelines: {ready}");
    for attempt in to_park {
        let pipeline = attempt.pipeline;
        let status = host.status(TENANT_A, pipeline, host.operator_token());
        assert_eq!(status["state"], "parked", "A/{pipeline}: {status}");
        let now = restarts(host, TENANT_A, pipeline);
        assert_eq!(
            now, counted[pipeline],
            "A/{pipeline} restarted while parked"
        );
        let entry = ready.json()["not_running"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["pipeline"] == format!("A/{pipeline}"))
            .cloned();
        let entry = entry.unwrap_or_else(|| panic!("/ready does not name A/{pipeline}: {ready}"));
        assert_eq!(entry["state"], "parked", "{ready}");
        if !attempt.fails_at_once {
            continue;
        }
        assert!(
            now <= f64::from(MAX_FAILURES),
            "A/{pipeline} was restarted {now} times; max_failures is {MAX_FAILURES}"
        );
        let runs = run_times(&log, pipeline);
        assert_eq!(
            runs.failures.len(),
            MAX_FAILURES as usize,
            "A/{pipeline}'s failures; its lines:\n{}",
            lines_of(&log, pipeline)
        );
        assert!(
            runs.starts.len() <= MAX_FAILURES as usize,
            "A/{pipeline} ran {} times; its lines:\n{}",
            runs.starts.len(),
            lines_of(&log, pipeline)
        );
        assert_eq!(now, f64::from(MAX_FAILURES - 1), "A/{pipeline}'s restarts");
        // Each restart waited its back-off after the failure before it.
        for (i, failed) in runs
            .failures
            .iter()
            .enumerate()
            .take(runs.failures.len() - 1)
        {
            let backoff = (FIRST_BACKOFF_MS << i).min(MAX_BACKOFF_MS) as f64 / 1000.0;
            let next = runs.starts.iter().find(|start| *start > failed);
            let next = next.unwrap_or_else(|| {
                panic!(
                    "A/{pipeline} did not start again after failure {}; its lines:\n{}",
                    i + 1,
                    lines_of(&log, pipeline)
                )
            });
            assert!(
                next - failed >= backoff * 0.9,
                "A/{pipeline} started again {:.3} s after failure {}, before its back-off of \
                 {backoff} s",
                next - failed,
                i + 1
            );
        }
        // A sink that never committed advanced nothing.
        let sinks = status["live"]["sinks"].as_object().unwrap();
        for (sink, state) in sinks {
            for (table, t) in state["tables"].as_object().unwrap() {
                assert!(
                    t["position"].is_null(),
                    "A/{pipeline}'s sink {sink} advanced on {table}: {status}"
                );
            }
        }
    }
    let mentions_b = ready.json()["not_running"]
        .as_array()
        .unwrap()
        .iter()
        .any(|e| e["pipeline"].as_str().is_some_and(|p| p.starts_with("B/")));
    assert!(!mentions_b, "/ready names B's pipeline: {ready}");
    b.unharmed(host, "A's pipelines parked");
}

/// The lines of the host's log about A's pipeline `pipeline`.
fn lines_of(log: &str, pipeline: &str) -> String {
    let span = format!("pipeline{{tenant=A pipeline={pipeline}}}");
    let field = format!("pipeline=A/{pipeline}");
    let lines: Vec<&str> = log
        .lines()
        .filter(|l| l.contains(&span) || l.trim_end().ends_with(&field))
        .collect();
    lines.join("\n")
}

/// When a pipeline's runs started and failed, by the host's log.
struct Runs {
    starts: Vec<f64>,
    failures: Vec<f64>,
}

fn run_times(log: &str, pipeline: &str) -> Runs {
    let span = format!("pipeline{{tenant=A pipeline={pipeline}}}");
    let failed = format!("pipeline=A/{pipeline}");
    let mut runs = Runs {
        starts: Vec::new(),
        failures: Vec::new(),
    };
    for line in log.lines() {
        if line.contains(&span) && line.contains("weir_pipeline: starting") {
            runs.starts.extend(line_time(line));
        } else if line.contains("run failed:") && line.trim_end().ends_with(&failed) {
            runs.failures.extend(line_time(line));
        }
    }
    runs
}

/// The newest commit object of each table under a positioned root, as
/// the position it records.
fn durable_positions(root: &Path) -> BTreeMap<String, Position> {
    let mut out = BTreeMap::new();
    for table in shop_tables() {
        let newest = list_files(&root.join(&table.name))
            .into_iter()
            .filter(|p| is_commit_object(&p.file_name().unwrap().to_string_lossy()))
            .max();
        if let Some(file) = newest {
            let reader =
                arrow_ipc::reader::FileReader::try_new(std::fs::File::open(&file).unwrap(), None)
                    .unwrap_or_else(|e| panic!("{}: {e}", file.display()));
            let hex_text = reader.schema().metadata()["weir.position"].clone();
            out.insert(table.name.clone(), Position::from_hex(&hex_text).unwrap());
        }
    }
    out
}

/// `"183/2"`, as the status shows a generator position, as its parts.
fn stream_parts(text: &str) -> (u64, u32) {
    let (commit, ordinal) = text
        .split_once('/')
        .unwrap_or_else(|| panic!("not a generator position: {text}"));
    (commit.parse().unwrap(), ordinal.parse().unwrap())
}

/// A position as the core writes it in an error (`stream 0x…`, the raw
/// order bytes: the core does not know the source's layout), as its parts.
fn error_position_parts(text: &str) -> (u64, u32) {
    let order = text
        .strip_prefix("stream 0x")
        .and_then(|hex_text| hex::decode(hex_text).ok())
        .unwrap_or_else(|| panic!("not a streaming position: {text}"));
    parts_of(&Position::streaming(&order))
}

fn parts_of(position: &Position) -> (u64, u32) {
    position.as_stream().expect("a generator position")
}

/// The per-table positions the status shows for a sink.
fn status_positions(status: &Value, sink: &str) -> BTreeMap<String, Option<String>> {
    status["live"]["sinks"][sink]["tables"]
        .as_object()
        .map(|tables| {
            tables
                .iter()
                .map(|(t, v)| (t.clone(), v["position"].as_str().map(str::to_string)))
                .collect()
        })
        .unwrap_or_default()
}

/// A's storage: refused at its quota, its root within it, and the
/// positions its status shows, from its first failure to its parking,
/// never ahead of what its root durably holds nor past the failed batch.
fn a_quota_holds_and_positions_stay_durable(host: &ServeHost, b: &BWitness) {
    let root = host.sink_root(TENANT_A, "quota", "a-lake");
    let mut backoffs = 0;
    let mut last_shown: BTreeMap<String, (u64, u32)> = BTreeMap::new();
    let deadline = Instant::now() + PARK_TIMEOUT;
    let (parked, durable) = loop {
        let status = host.status(TENANT_A, "quota", host.operator_token());
        let state = status["state"].as_str().unwrap_or_default().to_string();
        if state == "backoff" || state == "parked" {
            // No run is under way: the status and the root are still.
            let durable = durable_positions(&root);
            for (table, shown) in status_positions(&status, "a-lake") {
                let Some(shown) = shown else { continue };
                let shown = stream_parts(&shown);
                let held = durable.get(&table).map(parts_of);
                assert!(
                    held.is_some_and(|held| shown <= held),
                    "A/quota ({state}) shows {table} at {shown:?}, ahead of its root's {held:?}"
                );
                let before = last_shown.insert(table.clone(), shown);
                assert!(
                    before.is_none_or(|before| before <= shown),
                    "A/quota's {table} went back from {before:?} to {shown:?}"
                );
            }
            if let Some(checkpoint) = status["live"]["checkpoint"].as_str() {
                let newest = durable.values().map(parts_of).max();
                assert!(
                    newest.is_some_and(|n| stream_parts(checkpoint) <= n),
                    "A/quota's checkpoint {checkpoint} is past what its root holds: {durable:?}"
                );
            }
            backoffs += usize::from(state == "backoff");
            if state == "parked" {
                break (status, durable);
            }
        }
        assert!(
            Instant::now() < deadline,
            "A/quota was not parked: {status}"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(backoffs > 0, "A/quota was never seen backing off");
    // The failed batch did not land: the table it failed for stands before
    // the batch's last position. (Not necessarily before its first: after a
    // backoff the run resumes from the lowest table, so a batch can start
    // with changes this table already holds.)
    let reason = parked["reason"].as_str().unwrap();
    let failed_table = reason
        .split("for table `")
        .nth(1)
        .and_then(|r| r.split('`').next())
        .unwrap_or_else(|| panic!("the reason names no table: {reason}"));
    let high = reason
        .split("at positions ")
        .nth(1)
        .and_then(|r| r.split("..=").nth(1))
        .and_then(|r| r.split(':').next())
        .map(error_position_parts)
        .unwrap_or_else(|| panic!("the reason names no positions: {reason}"));
    if let Some(held) = durable.get(failed_table) {
        assert!(
            parts_of(held) < high,
            "{failed_table} holds {held} in A's root, not before the end {high:?} of the failed batch"
        );
    }
    assert!(
        reason.contains("nothing was advanced"),
        "A/quota's reason does not say nothing advanced: {reason}"
    );
    let stored = stored_bytes(&host.tenant_root(TENANT_A));
    assert!(
        stored <= A_MAX_STORED_MB << 20,
        "A's root holds {stored} bytes, over its quota of {A_MAX_STORED_MB} MiB"
    );
    assert!(
        stored > (A_MAX_STORED_MB << 20) / 2,
        "A's root holds only {stored} bytes: the quota was not what stopped it"
    );
    println!(
        "quota: A's root holds {stored} bytes of {} allowed; A/quota parked with {durable:?} \
         durable, failed on {failed_table} up to {high:?}",
        A_MAX_STORED_MB << 20
    );
    b.unharmed(host, "A's storage quota");
}

fn stored_bytes(root: &Path) -> u64 {
    let mut total = 0;
    for entry in std::fs::read_dir(root).into_iter().flatten().flatten() {
        let kind = entry.file_type().unwrap();
        if kind.is_dir() {
            total += stored_bytes(&entry.path());
        } else if kind.is_file() {
            total += entry.metadata().unwrap().len();
        }
    }
    total
}

#[test]
fn tenant_a_is_refused_or_contained_while_tenant_b_runs_exact() {
    let started = Instant::now();
    let host = start_host();
    let reply = host.deploy(TENANT_B, &b_pipeline(B_PACE_US), host.token(TENANT_B));
    assert!(reply.is_success(), "deploying B/orders: {reply}");
    host.wait_for_state(TENANT_B, B_PIPELINE, "running", Duration::from_secs(60));
    let mut b = BWitness::new(&host);

    // Refused at deploy or at the door.
    a_cannot_name_b_root(&host, &b);
    a_cannot_read_the_host_environment_or_b_plugins(&host, &b);
    a_cannot_grant_itself_more(&host, &b);
    a_cannot_take_more_memory_than_its_bound(&host, &b);
    a_token_cannot_reach_b(&host, &b);
    no_token_or_a_wrong_one_is_unauthorized(&host, &b);
    b.unharmed_and_moving(&host, "the refusals");
    let refusals = started.elapsed();

    // Contained while they run. The quota attempt is watched from its
    // first failure on, beside the others.
    let to_park = deploy_runtime_attempts(&host);
    std::thread::scope(|scope| {
        let quota = scope.spawn(|| a_quota_holds_and_positions_stay_durable(&host, &b));
        a_cannot_exceed_its_pipelines_or_memory(&host, &b);
        a_flood_is_rate_limited(&host, &b);
        if let Err(panic) = quota.join() {
            std::panic::resume_unwind(panic);
        }
    });
    a_failing_pipelines_are_parked_not_hammered(&host, &to_park, &b);
    b.unharmed_and_moving(&host, "A's runtime attempts");
    let contained = started.elapsed();

    // B's own change: no pace, so the rest of its stream comes at once.
    let b_before_lift = changes_of(&b_status(&host));
    let reply = host.deploy(TENANT_B, &b_pipeline(0), host.token(TENANT_B));
    assert!(reply.is_success(), "lifting B's pace: {reply}");
    let finished = host.wait_for_state(TENANT_B, B_PIPELINE, "finished", Duration::from_secs(180));
    assert!(
        finished["reason"].is_null(),
        "B finished with a reason: {finished}"
    );
    let b_finished = started.elapsed();
    assert_positioned_exact(
        &host.sink_root(TENANT_B, B_PIPELINE, B_SINK),
        &expected_state(B_SEED, B_CHANGES),
    );
    let foreign = foreign_in_b_root(&host);
    assert!(foreign.is_empty(), "B's root holds {foreign:?}");
    println!(
        "refusals done at {refusals:?}, runtime attempts contained at {contained:?} (B had taken \
         {b_before_lift} of its {B_CHANGES} changes), B finished at {b_finished:?} ({} \
         changes in its last run) and found exact at {:?}",
        changes_of(&finished),
        started.elapsed()
    );
}

/// A link in A's root into B's root, with a folder below it as the sink's
/// root: the deploy is refused, and must leave nothing behind in B's root.
#[test]
fn a_link_into_b_root_leaves_nothing_there() {
    let host = ServeHost::builder()
        .tenant(Tenant::new(TENANT_A))
        .tenant(Tenant::new(TENANT_B))
        .start();
    let b_root = host.tenant_root(TENANT_B);
    let linked = host.tenant_root(TENANT_A).join("linked");
    std::fs::create_dir_all(&linked).unwrap();
    std::os::unix::fs::symlink(&b_root, linked.join("into-b")).unwrap();
    let before = list_files(&b_root);
    let pipeline = a_pipeline(
        "linked",
        a_sink("lake", "weir-fixture-positioned", 30_000).blob_store_url("into-b/planted"),
    );
    let reply = host.deploy(TENANT_A, &pipeline, host.token(TENANT_A));
    assert_refused_deploy(
        &host,
        &reply,
        "linked",
        400,
        &[
            "pipelines/A/linked.yaml",
            "sinks[0].blob_store.url",
            "leads out of tenant `A`'s root",
        ],
    );
    assert_eq!(
        list_files(&b_root),
        before,
        "the refused deploy of A created a folder in B's root"
    );
}

/// `weir serve` started here rather than through `ServeHost`, which passes
/// the host no environment of the test's choosing: the host file written
/// from `tenants`, every token in its own variable, plus `extra` in the
/// environment. Pipelines are deployed through the watched folder and seen
/// in the log, so no client is needed. Killed when dropped.
struct ServeWithEnvironment {
    dir: tempfile::TempDir,
    child: std::process::Child,
}

impl ServeWithEnvironment {
    /// `extra`: (owning tenant, variable, value); each variable is listed
    /// in its owner's `env` in the host file and set for the host.
    fn start(tenants: &[&str], extra: &[(&str, &str, &str)]) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let token_env = |tenant: &str| format!("WEIR_TEST_TOKEN_{}", tenant.to_uppercase());
        let mut entries = serde_json::Map::new();
        for tenant in tenants {
            std::fs::create_dir_all(dir.path().join("pipelines").join(tenant)).unwrap();
            let own: Vec<&str> = extra
                .iter()
                .filter(|(owner, _, _)| owner == tenant)
                .map(|(_, variable, _)| *variable)
                .collect();
            let entry = serde_json::json!({
                "token_env": token_env(tenant),
                "root": format!("data/{tenant}"),
                "env": own,
            });
            entries.insert(tenant.to_string(), entry);
        }
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let listen = listener.local_addr().unwrap().to_string();
        drop(listener);
        let host_file = serde_json::json!({
            "listen": listen,
            "state_dir": "state",
            "pipelines_dir": "pipelines",
            "watch_interval_ms": 100,
            "operator_token_env": "WEIR_TEST_OPERATOR_TOKEN",
            "tenants": entries,
        });
        let host_path = dir.path().join("host.yaml");
        std::fs::write(&host_path, host_file.to_string()).unwrap();
        let log = std::fs::File::create(dir.path().join("serve.log")).unwrap();
        let mut command = weir_command();
        command
            .arg("serve")
            .arg(&host_path)
            .current_dir(dir.path())
            .env("WEIR_LOG", "info")
            .env("NO_COLOR", "1")
            .env("WEIR_TEST_OPERATOR_TOKEN", "operator-token-of-this-test")
            .stdin(std::process::Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log);
        for tenant in tenants {
            command.env(token_env(tenant), format!("token-of-tenant-{tenant}-here"));
        }
        for (_, name, value) in extra {
            command.env(name, value);
        }
        let child = command.spawn().expect("`weir serve` starts");
        ServeWithEnvironment { dir, child }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("serve.log")).unwrap_or_default()
    }

    /// Puts `pipeline` (with the positioned fixture beside it) into the
    /// tenant's watched folder.
    fn place(&self, tenant: &str, pipeline: &PipelineBuilder) {
        let folder = self.dir.path().join("pipelines").join(tenant);
        for plugin in pipeline.plugins() {
            std::fs::copy(plugin, folder.join(plugin.file_name().unwrap())).unwrap();
        }
        pipeline.clone().for_serve().write_in(&folder);
    }

    /// Waits for the first log line `wanted` picks.
    fn wait_for_line(&self, what: &str, wanted: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let log = self.log();
            if let Some(line) = log.lines().find(|l| wanted(l)) {
                return line.to_string();
            }
            assert!(
                Instant::now() < deadline,
                "no line about {what} in the log of weir serve:\n{log}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for ServeWithEnvironment {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A tenant's `${WEIR_TENANT_<NAME>_*}` variables are its own: tenant
/// `acme` must not read those of tenant `acme_eu`, whose prefix
/// (`WEIR_TENANT_ACME_EU_`) begins with its own (`WEIR_TENANT_ACME_`).
#[test]
fn a_tenant_cannot_read_the_variables_of_a_tenant_whose_name_extends_its_own() {
    let variable = "WEIR_TENANT_ACME_EU_PASSWORD";
    let host =
        ServeWithEnvironment::start(&["acme", "acme_eu"], &[("acme_eu", variable, "eu-secret")]);
    let reading = |name: &str| {
        a_pipeline(
            name,
            SinkBuilder::new("lake", plugin("weir-fixture-positioned"))
                .limits(64, 30_000)
                .config("password", &format!("${{{variable}}}")),
        )
    };
    // The owner reads it: the variable is there to be read.
    host.place("acme_eu", &reading("own"));
    host.wait_for_line("acme_eu/own created", |l| {
        l.contains("created") && l.ends_with("pipeline=acme_eu/own")
    });
    host.place("acme", &reading("steal"));
    // Refused (naming its file) or created: whichever the host logs.
    let line = host.wait_for_line("acme/steal", |l| {
        l.contains("steal.yaml") || l.ends_with("pipeline=acme/steal")
    });
    assert!(
        line.contains("pipeline file refused") && line.contains(variable),
        "tenant `acme` read `{variable}` of tenant `acme_eu`: {line}"
    );
}
