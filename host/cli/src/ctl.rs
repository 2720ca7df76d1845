//! `weir ctl`: the admin API of a running `weir serve` (docs/serve.md), from
//! the command line. Also asked by `weir status --server`, because the store
//! of a pipeline that runs is locked and only the server can say where it
//! stands.

use std::fmt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::str::FromStr;
use std::time::Duration;

use clap::{Args, Subcommand};
use http::Method;
use serde::de::DeserializeOwned;
use serde_json::Value;
use url::Url;
use weir_serve::api::{
    ApiError, Applied, Deleted, PipelineList, PipelineStatus, Readiness, Steered, Swapped, Uploaded,
};

use super::render;

mod plugins;

/// Where `weir serve` listens unless told otherwise (its documented default).
pub const DEFAULT_SERVER: &str = "http://127.0.0.1:7070";

/// A server that accepts no connection within this is down or unreachable.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// The bound on one exchange. Generous because a plugin replacement answers
/// only once the new version compiled and the pipeline reached its next
/// commit boundary.
const EXCHANGE_TIMEOUT: Duration = Duration::from_secs(300);

#[derive(Args, Debug)]
pub struct CtlArgs {
    #[command(flatten)]
    pub server: ServerArgs,
    /// Print the server's JSON reply as it is (pretty).
    #[arg(long, global = true)]
    pub json: bool,
    #[command(subcommand)]
    pub command: CtlCommand,
}

/// Which server to ask, and as whom.
#[derive(Args, Debug)]
pub struct ServerArgs {
    /// The admin API of `weir serve` (plain http).
    #[arg(long, env = "WEIR_SERVER", default_value = DEFAULT_SERVER, global = true)]
    pub server: String,
    /// The operator's or a tenant's token. Prefer the environment variable:
    /// a flag is visible to everyone who can list the machine's processes.
    #[arg(long, env = "WEIR_TOKEN", hide_env_values = true, global = true)]
    pub token: Option<String>,
}

/// How a pipeline is named on the command line, in help and errors.
const NAME: &str = "TENANT/PIPELINE";

#[derive(Subcommand, Debug)]
pub enum CtlCommand {
    /// The pipelines the token reaches, with their state.
    List,
    /// Create a pipeline, or change it, from a pipeline file.
    Apply {
        #[arg(value_name = NAME)]
        pipeline: PipelineName,
        /// The pipeline's YAML file, sent as it is (but for --plugin).
        file: PathBuf,
        /// A plugin one or more sinks name (a path from the pipeline file's
        /// folder, or absolute): it is uploaded to the tenant first, and
        /// those sinks' `plugin:` values are sent as `sha256:<digest>`.
        /// Repeatable.
        #[arg(long = "plugin", value_name = "FILE")]
        plugins: Vec<PathBuf>,
    },
    /// State, per sink plugin and table position, lag, last error.
    Status {
        #[arg(value_name = NAME)]
        pipeline: PipelineName,
    },
    /// Stop taking changes at the next commit boundary.
    Pause {
        #[arg(value_name = NAME)]
        pipeline: PipelineName,
    },
    /// Take changes again (also un-parks a parked pipeline).
    Resume {
        #[arg(value_name = NAME)]
        pipeline: PipelineName,
    },
    /// Stop at a commit boundary, and stay stopped.
    Stop {
        #[arg(value_name = NAME)]
        pipeline: PipelineName,
    },
    /// Start a stopped or parked pipeline.
    Start {
        #[arg(value_name = NAME)]
        pipeline: PipelineName,
    },
    /// Stop the pipeline and remove its definition (its positions are kept).
    Delete {
        #[arg(value_name = NAME)]
        pipeline: PipelineName,
    },
    /// Replace a sink's plugin at the next commit boundary; the old version
    /// keeps running if the new one is refused.
    Replace {
        #[arg(value_name = NAME)]
        pipeline: PipelineName,
        #[arg(value_parser = clap::builder::NonEmptyStringValueParser::new())]
        sink: String,
        /// The new version's `.wasm` component.
        plugin: PathBuf,
        /// Refuse the upload unless the file has this digest (64 hex digits).
        #[arg(long, value_parser = parse_sha256)]
        sha256: Option<String>,
    },
    /// Swap a sink back to the plugin version it ran before.
    Rollback {
        #[arg(value_name = NAME)]
        pipeline: PipelineName,
        #[arg(value_parser = clap::builder::NonEmptyStringValueParser::new())]
        sink: String,
    },
    /// Exit 0 when every pipeline that should run runs; else say which do not
    /// and exit 1.
    Ready,
    /// The server's metrics, in Prometheus text format.
    Metrics,
}

/// `TENANT/PIPELINE`, as the admin API names a pipeline.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PipelineName {
    pub tenant: String,
    pub pipeline: String,
}

impl FromStr for PipelineName {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        match text.split_once('/') {
            Some((tenant, pipeline))
                if !tenant.is_empty() && !pipeline.is_empty() && !pipeline.contains('/') =>
            {
                Ok(PipelineName {
                    tenant: tenant.to_string(),
                    pipeline: pipeline.to_string(),
                })
            }
            _ => Err(format!(
                "`{text}` is not TENANT/PIPELINE: it needs exactly one `/` with a name on each side, \
                 as in acme/orders"
            )),
        }
    }
}

impl fmt::Display for PipelineName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.tenant, self.pipeline)
    }
}

/// A pinned digest: 64 hex digits, kept lowercase as the server prints them.
fn parse_sha256(text: &str) -> Result<String, String> {
    if text.len() == 64 && text.bytes().all(|b| b.is_ascii_hexdigit()) {
        Ok(text.to_ascii_lowercase())
    } else {
        Err(format!(
            "`{text}` is not a sha256 digest (64 hex digits, as `weir plugin inspect` prints)"
        ))
    }
}

/// Carries out one `weir ctl` command. `Err` is the sentence to print.
pub fn dispatch(args: CtlArgs) -> Result<ExitCode, String> {
    let client = AdminClient::new(&args.server.server, args.server.token)?;
    let as_json = args.json;
    match args.command {
        CtlCommand::List => {
            let reply = client.expect_success(client.get(&["v1", "pipelines"], true)?)?;
            client.show::<PipelineList>(
                &reply,
                as_json,
                "a list of pipelines",
                render::pipeline_list,
            );
        }
        CtlCommand::Apply {
            pipeline,
            file,
            plugins,
        } => apply(&client, &pipeline, &file, &plugins, as_json)?,
        CtlCommand::Status { pipeline } => {
            return remote_status(&client, &pipeline, as_json);
        }
        CtlCommand::Pause { pipeline } => client.steer(&pipeline, "pause", "paused", as_json)?,
        CtlCommand::Resume { pipeline } => client.steer(&pipeline, "resume", "resumed", as_json)?,
        CtlCommand::Stop { pipeline } => client.steer(&pipeline, "stop", "stopped", as_json)?,
        CtlCommand::Start { pipeline } => client.steer(&pipeline, "start", "started", as_json)?,
        CtlCommand::Delete { pipeline } => {
            let url = client.pipeline_url(&pipeline, &[]);
            let reply =
                client.expect_success(client.send(Method::DELETE, url, None, true, ())?)?;
            client.show(&reply, as_json, "a deleted pipeline", |_: &Deleted| {
                render::pipeline_done(&pipeline, "deleted (its positions are kept)")
            });
        }
        CtlCommand::Replace {
            pipeline,
            sink,
            plugin,
            sha256,
        } => {
            let wasm = std::fs::read(&plugin)
                .map_err(|e| format!("cannot read the plugin {}: {e}", plugin.display()))?;
            let mut url = client.pipeline_url(&pipeline, &["sinks", &sink, "plugin"]);
            if let Some(digest) = &sha256 {
                url.query_pairs_mut().append_pair("sha256", digest);
            }
            let reply = client.send(Method::PUT, url, Some("application/wasm"), true, wasm)?;
            let reply = client.expect_success(reply)?;
            client.show(&reply, as_json, "a plugin swap", |swapped: &Swapped| {
                render::swap(&pipeline, &sink, "replaced", swapped)
            });
        }
        CtlCommand::Rollback { pipeline, sink } => {
            let url = client.pipeline_url(&pipeline, &["sinks", &sink, "rollback"]);
            let reply = client.expect_success(client.send(Method::POST, url, None, true, ())?)?;
            client.show(&reply, as_json, "a plugin swap", |swapped: &Swapped| {
                render::swap(&pipeline, &sink, "rolled back", swapped)
            });
        }
        CtlCommand::Ready => {
            let reply = client.get(&["ready"], false)?;
            // 503 is an answer here (not ready, and which pipelines are
            // not), not a failure to ask.
            let (ready, reply) = match reply.status {
                503 => (false, reply),
                _ => (true, client.expect_success(reply)?),
            };
            client.show::<Readiness>(&reply, as_json, "a readiness report", render::readiness);
            if !ready {
                return Ok(ExitCode::from(1));
            }
        }
        CtlCommand::Metrics => {
            let reply = client.expect_success(client.get(&["metrics"], false)?)?;
            render::server_text(&reply.body);
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `weir ctl apply`: uploads each `--plugin` file, then sends the pipeline
/// file with the sinks that run one naming its upload.
fn apply(
    client: &AdminClient,
    pipeline: &PipelineName,
    file: &Path,
    plugins: &[PathBuf],
    as_json: bool,
) -> Result<(), String> {
    let yaml = read_file(file, "pipeline file")?;
    // Whatever can be refused here is, before anything is sent.
    let mut uploads = Vec::new();
    for upload in plugins::sinks_running(file, &yaml, plugins)? {
        let wasm = std::fs::read(&upload.file)
            .map_err(|e| format!("cannot read the plugin {}: {e}", upload.file.display()))?;
        let sha256 = weir_runtime::engine::digest(&wasm);
        uploads.push((upload, sha256, wasm));
    }
    let yaml = plugins::with_references(
        &yaml,
        uploads
            .iter()
            .map(|(upload, sha256, _)| (upload, sha256.as_str())),
    );
    let mut uploaded = Vec::new();
    for (upload, sha256, wasm) in uploads {
        let size = wasm.len() as u64;
        let reply = client.upload_plugin(&pipeline.tenant, &sha256, wasm)?;
        let already_there = serde_json::from_str::<Uploaded>(&reply.body).is_ok_and(|u| !u.new);
        if !as_json {
            render::uploaded(&upload.file, &upload.sinks, &sha256, size, already_there);
        }
        uploaded.push(serde_json::json!({
            "file": upload.file.display().to_string(),
            "sinks": upload.sinks,
            "sha256": sha256,
            "size": size,
            "new": !already_there,
        }));
    }
    let url = client.pipeline_url(pipeline, &[]);
    let reply = client.send(Method::PUT, url, Some("application/yaml"), true, yaml)?;
    let reply = client.expect_success(reply)?;
    match reply.json() {
        // One JSON document: the apply's reply with what was uploaded for it.
        Some(Value::Object(mut applied)) if as_json && !uploaded.is_empty() => {
            applied.insert("uploaded".into(), Value::Array(uploaded));
            render::server_json(&Value::Object(applied));
        }
        _ => client.show(
            &reply,
            as_json,
            "an applied pipeline",
            |applied: &Applied| render::applied(pipeline, applied),
        ),
    }
    Ok(())
}

/// `weir ctl status` and `weir status --server`: one pipeline as the server
/// sees it.
pub fn remote_status(
    client: &AdminClient,
    pipeline: &PipelineName,
    as_json: bool,
) -> Result<ExitCode, String> {
    let url = client.pipeline_url(pipeline, &[]);
    let reply = client.expect_success(client.send(Method::GET, url, None, true, ())?)?;
    client.show::<PipelineStatus>(
        &reply,
        as_json,
        "a pipeline's status",
        render::server_status,
    );
    Ok(ExitCode::SUCCESS)
}

fn read_file(path: &Path, what: &str) -> Result<String, String> {
    std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read the {what} {}: {e}", path.display()))
}

/// A client of one server's admin API.
pub struct AdminClient {
    base: Url,
    /// Sent only to the authenticated routes; never printed.
    token: Option<String>,
    agent: ureq::Agent,
}

/// What the server answered, whatever its status.
pub struct Reply {
    pub status: u16,
    pub body: String,
}

impl Reply {
    fn json(&self) -> Option<Value> {
        serde_json::from_str(&self.body).ok()
    }

    /// The body as it came: pretty when it is JSON.
    fn print_as_sent(&self) {
        match self.json() {
            Some(value) => render::server_json(&value),
            None => render::server_text(&self.body),
        }
    }
}

impl AdminClient {
    pub fn new(server: &str, token: Option<String>) -> Result<Self, String> {
        let mut base = Url::parse(server).map_err(|e| {
            format!("--server `{server}` is not a URL ({e}); give it as http://HOST:PORT")
        })?;
        if base.scheme() != "http" {
            return Err(format!(
                "--server `{server}`: the admin API speaks plain http only; give it as \
                 http://HOST:PORT (and reach a remote host through a tunnel)"
            ));
        }
        base.set_query(None);
        base.set_fragment(None);
        let agent = ureq::Agent::config_builder()
            // Error statuses carry the server's explanation in the body.
            .http_status_as_error(false)
            // The admin API never redirects; following one would carry the
            // token somewhere the operator did not name.
            .max_redirects(0)
            .max_redirects_will_error(false)
            .timeout_connect(Some(CONNECT_TIMEOUT))
            .timeout_global(Some(EXCHANGE_TIMEOUT))
            .build()
            .new_agent();
        Ok(AdminClient {
            base,
            token: token.filter(|t| !t.is_empty()),
            agent,
        })
    }

    /// The server as the operator named it, for messages.
    fn server(&self) -> &str {
        self.base.as_str().trim_end_matches('/')
    }

    /// The server's URL with these path segments appended, each encoded.
    pub fn url(&self, segments: &[&str]) -> Url {
        let mut url = self.base.clone();
        url.path_segments_mut()
            .expect("an http URL can be a base")
            .pop_if_empty()
            .extend(segments);
        url
    }

    /// `/v1/pipelines/{tenant}/{pipeline}` and then `rest`.
    pub fn pipeline_url(&self, name: &PipelineName, rest: &[&str]) -> Url {
        let mut segments = vec!["v1", "pipelines", &name.tenant, &name.pipeline];
        segments.extend_from_slice(rest);
        self.url(&segments)
    }

    fn get(&self, segments: &[&str], authenticated: bool) -> Result<Reply, String> {
        self.send(Method::GET, self.url(segments), None, authenticated, ())
    }

    /// `PUT /v1/tenants/{tenant}/plugins/{sha256}` with the plugin's bytes:
    /// the server keeps them for pipeline files to name by the digest.
    fn upload_plugin(&self, tenant: &str, sha256: &str, wasm: Vec<u8>) -> Result<Reply, String> {
        let url = self.url(&["v1", "tenants", tenant, "plugins", sha256]);
        let reply = self.send(Method::PUT, url, Some("application/wasm"), true, wasm)?;
        self.expect_success(reply)
    }

    /// POST `/v1/pipelines/{tenant}/{pipeline}/{verb}`, and says what came of it.
    fn steer(
        &self,
        name: &PipelineName,
        verb: &str,
        done: &str,
        as_json: bool,
    ) -> Result<(), String> {
        let url = self.pipeline_url(name, &[verb]);
        let reply = self.expect_success(self.send(Method::POST, url, None, true, ())?)?;
        self.show(
            &reply,
            as_json,
            "a steered pipeline",
            |steered: &Steered| render::steered(name, done, steered),
        );
        Ok(())
    }

    /// Prints a reply: with `--json` as the server sent it, else read as a
    /// `T` (`expected` says what that is) and laid out by `readable`.
    fn show<T: DeserializeOwned>(
        &self,
        reply: &Reply,
        as_json: bool,
        expected: &str,
        readable: impl FnOnce(&T),
    ) {
        if as_json {
            return reply.print_as_sent();
        }
        match self.read(reply, expected) {
            Ok(typed) => readable(&typed),
            // The server did what was asked; only its answer is strange (a
            // server of another version, or not weir at that address).
            // What it said is better shown than hidden.
            Err(why) => {
                eprintln!("weir: {why}; its reply as it came:");
                reply.print_as_sent();
            }
        }
    }

    /// The reply read as a `T`, or one sentence naming the server and what
    /// was expected of it.
    fn read<T: DeserializeOwned>(&self, reply: &Reply, expected: &str) -> Result<T, String> {
        serde_json::from_str(&reply.body).map_err(|e| {
            format!(
                "{}: the reply is not {expected} as this weir reads it ({e})",
                self.server()
            )
        })
    }

    /// One exchange. `Err` only when no answer came.
    pub fn send(
        &self,
        method: Method,
        url: Url,
        content_type: Option<&str>,
        authenticated: bool,
        body: impl ureq::AsSendBody,
    ) -> Result<Reply, String> {
        let route = format!("{method} {}", url.path());
        let mut request = http::Request::builder().method(method).uri(url.as_str());
        if let Some(content_type) = content_type {
            request = request.header(http::header::CONTENT_TYPE, content_type);
        }
        if authenticated && let Some(token) = &self.token {
            request = request.header(http::header::AUTHORIZATION, format!("Bearer {token}"));
        }
        // The only way to fail here is a header value the http crate
        // refuses: a token with a control character in it.
        let request = request.body(body).map_err(|_| {
            "the token holds a character a header cannot carry (check --token or WEIR_TOKEN)"
                .to_string()
        })?;
        let unreachable = |e: ureq::Error| {
            format!(
                "cannot reach the weir server at {} ({route}): {e}; is `weir serve` running \
                 there? (--server or WEIR_SERVER)",
                self.server()
            )
        };
        let mut response = self.agent.run(request).map_err(unreachable)?;
        let status = response.status().as_u16();
        let body = response.body_mut().read_to_string().map_err(|e| {
            format!(
                "{}: {route}: the reply could not be read: {e}",
                self.server()
            )
        })?;
        Ok(Reply { status, body })
    }

    /// A 2xx reply, or the server's error as one sentence.
    pub fn expect_success(&self, reply: Reply) -> Result<Reply, String> {
        if (200..300).contains(&reply.status) {
            return Ok(reply);
        }
        let said = serde_json::from_str::<ApiError>(&reply.body);
        let mut message = match said {
            Ok(ApiError { error }) => error,
            Err(_) => {
                let body = reply.body.trim();
                let reason = http::StatusCode::from_u16(reply.status)
                    .ok()
                    .and_then(|s| s.canonical_reason())
                    .unwrap_or("");
                match body.is_empty() {
                    true => format!("HTTP {} {reason}", reply.status),
                    false => format!("HTTP {} {reason}: {}", reply.status, first_line(body)),
                }
            }
        };
        if reply.status == 401 && self.token.is_none() {
            message.push_str(" (no token was given: set WEIR_TOKEN or pass --token)");
        }
        Err(format!("{}: {message}", self.server()))
    }
}

/// Error pages can be long; one line is enough to say what went wrong.
fn first_line(text: &str) -> &str {
    text.lines().next().unwrap_or(text)
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;
    use crate::commands::{Cli, Command};

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("weir").chain(args.iter().copied()))
    }

    fn ctl(args: &[&str]) -> CtlArgs {
        match parse(args).expect("parses").command {
            Command::Ctl(ctl) => ctl,
            _ => panic!("`{}` is not a ctl command", args.join(" ")),
        }
    }

    fn name(tenant: &str, pipeline: &str) -> PipelineName {
        PipelineName {
            tenant: tenant.into(),
            pipeline: pipeline.into(),
        }
    }

    #[test]
    fn a_pipeline_name_is_a_tenant_and_a_pipeline() {
        assert_eq!("acme/orders".parse(), Ok(name("acme", "orders")));
        assert_eq!(name("acme", "orders").to_string(), "acme/orders");
    }

    #[test]
    fn a_pipeline_name_needs_exactly_one_slash_and_both_names() {
        for bad in ["", "/", "acme", "acme/", "/orders", "acme/orders/x", "a//b"] {
            let error = bad.parse::<PipelineName>().expect_err(bad);
            assert!(error.contains("TENANT/PIPELINE"), "{bad}: {error}");
        }
    }

    #[test]
    fn a_bad_pipeline_name_is_refused_before_anything_is_sent() {
        // An unroutable server: had the name passed, the send would fail
        // with a connection error instead of the parse error.
        let error = parse(&["ctl", "--server", "http://192.0.2.1:9", "pause", "acme"])
            .err()
            .expect("refused");
        assert_eq!(error.kind(), clap::error::ErrorKind::ValueValidation);
        assert!(error.to_string().contains("TENANT/PIPELINE"), "{error}");
    }

    #[test]
    fn ctl_options_go_before_or_after_the_subcommand() {
        let before = ctl(&[
            "ctl",
            "--server",
            "http://h:1",
            "--token",
            "t0ken",
            "--json",
            "list",
        ]);
        let after = ctl(&[
            "ctl",
            "list",
            "--server",
            "http://h:1",
            "--token",
            "t0ken",
            "--json",
        ]);
        for args in [before, after] {
            assert_eq!(args.server.server, "http://h:1");
            assert_eq!(args.server.token.as_deref(), Some("t0ken"));
            assert!(args.json);
            assert!(matches!(args.command, CtlCommand::List));
        }
    }

    #[test]
    fn every_pipeline_verb_parses_its_name() {
        for verb in ["status", "pause", "resume", "stop", "start", "delete"] {
            let args = ctl(&["ctl", verb, "acme/orders"]);
            let got = match args.command {
                CtlCommand::Status { pipeline }
                | CtlCommand::Pause { pipeline }
                | CtlCommand::Resume { pipeline }
                | CtlCommand::Stop { pipeline }
                | CtlCommand::Start { pipeline }
                | CtlCommand::Delete { pipeline } => pipeline,
                other => panic!("{verb} parsed as {other:?}"),
            };
            assert_eq!(got, name("acme", "orders"), "{verb}");
        }
    }

    #[test]
    fn apply_takes_a_name_a_file_and_plugins_to_upload() {
        let args = ctl(&["ctl", "apply", "acme/orders", "orders.yaml"]);
        let CtlCommand::Apply {
            pipeline,
            file,
            plugins,
        } = args.command
        else {
            panic!("{:?}", args.command)
        };
        assert_eq!(pipeline, name("acme", "orders"));
        assert_eq!(file, PathBuf::from("orders.yaml"));
        assert!(plugins.is_empty());
        let args = ctl(&[
            "ctl",
            "apply",
            "acme/orders",
            "orders.yaml",
            "--plugin",
            "lake.wasm",
            "--plugin",
            "/opt/audit.wasm",
        ]);
        let CtlCommand::Apply { plugins, .. } = args.command else {
            panic!("{:?}", args.command)
        };
        assert_eq!(
            plugins,
            [PathBuf::from("lake.wasm"), PathBuf::from("/opt/audit.wasm")]
        );
        assert!(
            parse(&["ctl", "apply", "acme/orders"]).is_err(),
            "the file is required"
        );
    }

    #[test]
    fn replace_takes_a_sink_a_file_and_an_optional_digest() {
        let digest = "AB".repeat(32);
        let args = ctl(&[
            "ctl",
            "replace",
            "acme/orders",
            "lake",
            "sink.wasm",
            "--sha256",
            &digest,
        ]);
        let CtlCommand::Replace {
            pipeline,
            sink,
            plugin,
            sha256,
        } = args.command
        else {
            panic!("{:?}", args.command)
        };
        assert_eq!(pipeline, name("acme", "orders"));
        assert_eq!(sink, "lake");
        assert_eq!(plugin, PathBuf::from("sink.wasm"));
        assert_eq!(sha256, Some("ab".repeat(32)), "kept lowercase");

        let args = ctl(&["ctl", "replace", "acme/orders", "lake", "sink.wasm"]);
        assert!(matches!(
            args.command,
            CtlCommand::Replace { sha256: None, .. }
        ));
    }

    #[test]
    fn a_digest_that_is_not_64_hex_digits_is_refused() {
        for bad in ["abc", &"g".repeat(64), &"a".repeat(63), &"a".repeat(65)] {
            let parsed = parse(&[
                "ctl",
                "replace",
                "acme/orders",
                "lake",
                "s.wasm",
                "--sha256",
                bad,
            ]);
            assert!(parsed.is_err(), "{bad} was accepted");
        }
    }

    #[test]
    fn rollback_ready_and_metrics_parse() {
        let args = ctl(&["ctl", "rollback", "acme/orders", "lake"]);
        assert!(
            matches!(&args.command, CtlCommand::Rollback { pipeline, sink }
                if *pipeline == name("acme", "orders") && sink == "lake")
        );
        assert!(
            parse(&["ctl", "rollback", "acme/orders", ""]).is_err(),
            "empty sink"
        );
        assert!(matches!(ctl(&["ctl", "ready"]).command, CtlCommand::Ready));
        assert!(matches!(
            ctl(&["ctl", "metrics"]).command,
            CtlCommand::Metrics
        ));
    }

    #[test]
    fn the_token_never_shows_in_help() {
        // clap prints an env-backed option's current value in --help unless
        // told not to; the token must not leak that way.
        let mut command = <Cli as clap::CommandFactory>::command();
        let ctl = command.find_subcommand_mut("ctl").expect("ctl");
        let help = ctl.render_long_help().to_string();
        assert!(help.contains("WEIR_TOKEN"), "{help}");
        let token = ctl
            .get_arguments()
            .find(|a| a.get_id() == "token")
            .expect("--token");
        assert!(token.is_hide_env_values_set());
    }

    #[test]
    fn urls_are_built_under_the_server_with_names_encoded() {
        let client = AdminClient::new("http://127.0.0.1:7070/", None).unwrap();
        assert_eq!(
            client
                .pipeline_url(&name("acme", "orders"), &["sinks", "lake", "plugin"])
                .as_str(),
            "http://127.0.0.1:7070/v1/pipelines/acme/orders/sinks/lake/plugin"
        );
        assert_eq!(
            client
                .url(&["v1", "tenants", "acme", "plugins", "ab12"])
                .as_str(),
            "http://127.0.0.1:7070/v1/tenants/acme/plugins/ab12"
        );
        // A sink name is one path segment whatever it holds.
        assert_eq!(
            client.url(&["v1", "pipelines", "a b", "c?d"]).as_str(),
            "http://127.0.0.1:7070/v1/pipelines/a%20b/c%3Fd"
        );
        let behind_a_prefix = AdminClient::new("http://proxy:80/weir", None).unwrap();
        assert_eq!(
            behind_a_prefix.url(&["ready"]).as_str(),
            "http://proxy/weir/ready"
        );
    }

    #[test]
    fn a_server_that_is_not_plain_http_is_refused() {
        for bad in ["127.0.0.1:7070", "https://weir.example", "not a url"] {
            let error = AdminClient::new(bad, None).err().expect(bad);
            assert!(error.contains("http://HOST:PORT"), "{bad}: {error}");
        }
    }

    #[test]
    fn server_errors_become_one_sentence_naming_the_server() {
        let client = AdminClient::new("http://127.0.0.1:7070", None).unwrap();
        let error = |status: u16, body: &str| {
            client
                .expect_success(Reply {
                    status,
                    body: body.into(),
                })
                .err()
                .expect("an error status")
        };
        assert_eq!(
            error(404, r#"{"error":"no pipeline acme/orders"}"#),
            "http://127.0.0.1:7070: no pipeline acme/orders"
        );
        assert_eq!(
            error(500, "boom\nstack"),
            "http://127.0.0.1:7070: HTTP 500 Internal Server Error: boom"
        );
        assert!(error(401, r#"{"error":"no token"}"#).contains("set WEIR_TOKEN"));
        assert!(
            client
                .expect_success(Reply {
                    status: 200,
                    body: "{}".into()
                })
                .is_ok()
        );
    }

    #[test]
    fn a_reply_of_another_shape_names_the_server_and_what_was_expected() {
        let client = AdminClient::new("http://127.0.0.1:7070", None).unwrap();
        let reply = |body: &str| Reply {
            status: 200,
            body: body.into(),
        };
        let error = client
            .read::<PipelineStatus>(&reply(r#"{"live": "odd"}"#), "a pipeline's status")
            .expect_err("not a status");
        assert!(
            error.starts_with("http://127.0.0.1:7070: the reply is not a pipeline's status"),
            "{error}"
        );
        assert!(
            client
                .read::<Readiness>(&reply("<html>"), "a readiness report")
                .is_err()
        );
        let status = client
            .read::<PipelineStatus>(&reply(r#"{"state": "paused", "new": 1}"#), "a status")
            .expect("a status");
        assert_eq!(status.state, weir_serve::api::State::Paused);
    }

    #[test]
    fn a_server_that_is_down_is_named() {
        // Bind and drop a listener: nothing listens on that port afterwards.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let server = format!("http://127.0.0.1:{port}");
        let client = AdminClient::new(&server, Some("a-token-of-16-chars".into())).unwrap();
        let error = client
            .get(&["v1", "pipelines"], true)
            .err()
            .expect("refused");
        assert!(error.contains(&server), "{error}");
        assert!(error.contains("GET /v1/pipelines"), "{error}");
        assert!(!error.contains("a-token-of-16-chars"), "{error}");
    }
}
