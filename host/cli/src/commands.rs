//! The `weir` command line: its commands, and what each prints
//! ([`render`]). Errors come back as one sentence for `main` to print.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use clap::{Parser, Subcommand};

use weir_metrics::PipelineMetrics;
use weir_pipeline::config::PipelineConfig;
use weir_pipeline::{self, Control, RunHost, RunOptions};
use weir_runtime::{WasmEngine, plugin};

use crate::conformance::Guarantee;
use crate::{ctl, maintain, render, scaffold};

#[derive(Parser)]
#[command(
    name = "weir",
    version,
    about = "Exactly-once change data capture into WebAssembly sinks"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand)]
pub enum Command {
    /// Run a pipeline until its source ends (bounded) or Ctrl-C.
    Run {
        pipeline: PathBuf,
        /// Stop the generator source after this many changes.
        #[arg(long)]
        max_changes: Option<u64>,
        /// Print the run's report as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Show where every sink stands for every table.
    Status {
        /// The pipeline file; with --server, TENANT/PIPELINE.
        #[arg(value_name = "PIPELINE.yaml | TENANT/PIPELINE")]
        pipeline: PathBuf,
        /// Print the status as JSON (with --server, the server's as it is).
        #[arg(long)]
        json: bool,
        /// Ask this `weir serve` (the store of a pipeline that runs is
        /// locked; only the server can say where it stands).
        #[arg(long, env = "WEIR_SERVER")]
        server: Option<String>,
        /// The operator's or the tenant's token, with --server.
        #[arg(long, env = "WEIR_TOKEN", hide_env_values = true)]
        token: Option<String>,
    },
    /// Show the tables a pipeline's source gives its sinks: every column of
    /// their batches with its Arrow type, the key and the mode (what a
    /// sink's `write` receives; docs/sink-authors.md).
    Tables {
        pipeline: PathBuf,
        /// Print the tables as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Run many tenants' pipelines and the admin API until SIGTERM
    /// (docs/serve.md).
    Serve { host_file: PathBuf },
    /// Steer a running `weir serve`: pipelines, plugin swaps, readiness.
    Ctl(ctl::CtlArgs),
    /// Maintain a pipeline's destinations now: compact small files and
    /// expire old snapshots (docs/maintenance.md). Safe beside a running
    /// `weir run` of the same pipeline.
    Maintain {
        pipeline: PathBuf,
        /// Only this sink (default: every sink that exports maintenance).
        #[arg(long)]
        sink: Option<String>,
        /// Only this source table (repeat for more; default: every table
        /// the pipeline wrote).
        #[arg(long = "table", value_name = "TABLE")]
        tables: Vec<String>,
        /// Compact (with neither --compact nor --expire: both).
        #[arg(long)]
        compact: bool,
        /// Expire old snapshots and delete the files only they referenced.
        #[arg(long)]
        expire: bool,
    },
    /// Work with plugin files.
    Plugin {
        #[command(subcommand)]
        command: PluginCommand,
    },
}

#[derive(Subcommand)]
pub enum PluginCommand {
    /// Show a plugin's contract version, capabilities, imports, digest and size.
    Inspect {
        file: PathBuf,
        #[arg(long)]
        json: bool,
        /// Where compiled components are cached.
        #[arg(long, default_value = ".weir/component-cache")]
        cache_dir: PathBuf,
    },
    /// Run a sink through fixed scenarios (delivery, replays, crashes at
    /// each step of a commit, abort, fencing, store failures) in a temporary
    /// root, and say what it guarantees (docs/plugin-test.md).
    Test {
        file: PathBuf,
        /// The sink's config, grants and limits, and the reader that shows
        /// what it wrote (`verify`); without a reader nothing is verified.
        #[arg(long)]
        config: Option<PathBuf>,
        #[arg(long)]
        json: bool,
        /// Where compiled components are cached.
        #[arg(long, default_value = ".weir/component-cache")]
        cache_dir: PathBuf,
    },
    /// Write a new sink project into a new folder: a JSON Lines sink to
    /// make your own, against the weir SDK, that builds on its own (in Rust
    /// a crate with native unit tests; in Python or JavaScript a module and
    /// its build script), a pipeline from the generator into it, a `weir
    /// plugin test` config and a README with the commands.
    New {
        /// The sink's name (letters, digits, `-` and `_`): its crate's or
        /// module's, its pipeline's and its sink's.
        name: String,
        /// The sink's language.
        #[arg(long, value_enum, default_value_t = scaffold::Lang::Rust)]
        lang: scaffold::Lang,
        /// The project's folder, which must be missing or empty [default: ./NAME].
        #[arg(long, value_name = "PATH")]
        dir: Option<PathBuf>,
        /// The weir SDK's folder (`sdk` in a weir source tree; it is not on
        /// a registry) [default: the one this weir was built from].
        #[arg(long, value_name = "PATH")]
        sdk: Option<PathBuf>,
    },
}

/// Exit code of a run that finished with an optional sink disabled (it is
/// behind and catches up on the next run).
const EXIT_SINK_DISABLED: u8 = 3;

/// Exit code of a plugin test whose reader could not say what the sink
/// wrote (neither a pass nor a failure).
const EXIT_CANNOT_VERIFY: u8 = 4;

/// Carries out one command. `Err` is the sentence to print.
pub fn dispatch(command: Command) -> Result<ExitCode, String> {
    weir_pipeline::failpoint::arm_from_env()?;
    match command {
        Command::Run {
            pipeline,
            max_changes,
            json,
        } => {
            let config = PipelineConfig::load(&pipeline).map_err(|e| e.to_string())?;
            let io = io_runtime()?;
            let stop = Arc::new(AtomicBool::new(false));
            io.spawn(stop_on_signals(stop.clone()));
            let engine = WasmEngine::new(&config.cache_dir()).map_err(|e| e.to_string())?;
            let control = Control::with_stop(stop, PipelineMetrics::detached());
            let host = RunHost {
                io: io.handle(),
                engine: &engine,
                control: &control,
                tenant: None,
                store: None,
            };
            let result = weir_pipeline::run(
                &config,
                &RunOptions {
                    max_changes,
                    ..RunOptions::default()
                },
                &host,
            );
            // A sink thread left behind (it overran its deadline) may still
            // hold blocking I/O on this runtime; it must not hold the exit.
            io.shutdown_timeout(SHUTDOWN_GRACE);
            let report = result.map_err(|e| format!("pipeline `{}`: {e}", config.pipeline))?;
            render::run_report(&report, json);
            if report.disabled.is_empty() {
                Ok(ExitCode::SUCCESS)
            } else {
                Ok(ExitCode::from(EXIT_SINK_DISABLED))
            }
        }
        Command::Status {
            pipeline,
            json,
            server: Some(server),
            token,
        } => {
            // WEIR_SERVER exported for `weir ctl` also lands here, so the
            // refusal of a file path says why a name was expected.
            let name = pipeline
                .to_str()
                .unwrap_or_default()
                .parse::<ctl::PipelineName>()
                .map_err(|e| {
                    format!(
                        "{e} (with --server or WEIR_SERVER set, `weir status` asks the server \
                         for TENANT/PIPELINE; unset WEIR_SERVER to read a pipeline file)"
                    )
                })?;
            let client = ctl::AdminClient::new(&server, token)?;
            ctl::remote_status(&client, &name, json)
        }
        Command::Tables { pipeline, json } => {
            let config = PipelineConfig::load(&pipeline).map_err(|e| e.to_string())?;
            let io = io_runtime()?;
            let tables =
                weir_pipeline::status::tables(&config, io.handle()).map_err(|e| e.to_string())?;
            render::tables(&tables, json);
            Ok(ExitCode::SUCCESS)
        }
        Command::Status {
            pipeline,
            json,
            server: None,
            token: _,
        } => {
            let config = PipelineConfig::load(&pipeline).map_err(|e| e.to_string())?;
            let io = io_runtime()?;
            let status =
                weir_pipeline::status::status(&config, io.handle()).map_err(|e| e.to_string())?;
            render::status(&status, json);
            Ok(ExitCode::SUCCESS)
        }
        Command::Plugin {
            command:
                PluginCommand::Inspect {
                    file,
                    json,
                    cache_dir,
                },
        } => {
            let engine = WasmEngine::new(&cache_dir).map_err(|e| e.to_string())?;
            let info = plugin::inspect(&engine, &file).map_err(|e| e.to_string())?;
            render::plugin_info(&info, json);
            Ok(ExitCode::SUCCESS)
        }
        Command::Plugin {
            command:
                PluginCommand::Test {
                    file,
                    config,
                    json,
                    cache_dir,
                },
        } => {
            let engine = WasmEngine::new(&cache_dir).map_err(|e| e.to_string())?;
            let io = io_runtime()?;
            let report = crate::conformance::run(&engine, &file, config.as_deref(), io.handle());
            io.shutdown_timeout(SHUTDOWN_GRACE);
            let report = report?;
            render::plugin_test(&report, json);
            Ok(ExitCode::from(match report.guarantee {
                Guarantee::ExactlyOnce | Guarantee::AtLeastOnce => 0,
                Guarantee::Fails => 1,
                Guarantee::CannotVerify => EXIT_CANNOT_VERIFY,
            }))
        }
        Command::Plugin {
            command:
                PluginCommand::New {
                    name,
                    lang,
                    dir,
                    sdk,
                },
        } => {
            let created = scaffold::create(&scaffold::NewSink {
                name,
                lang,
                dir,
                sdk,
            })?;
            print!("{}", created.summary());
            Ok(ExitCode::SUCCESS)
        }
        Command::Maintain {
            pipeline,
            sink,
            tables,
            compact,
            expire,
        } => {
            let what = [("compact", compact), ("expire", expire)]
                .into_iter()
                .filter(|(_, asked)| *asked)
                .map(|(name, _)| name.to_string())
                .collect();
            let args = maintain::MaintainArgs {
                pipeline: &pipeline,
                sink: sink.as_deref(),
                tables: &tables,
                what,
            };
            let io = io_runtime()?;
            let done = maintain::maintain(&args, io.handle());
            io.shutdown_timeout(SHUTDOWN_GRACE);
            for sink in done? {
                println!("sink {}:", sink.sink);
                for line in sink.report.lines() {
                    println!("  {line}");
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Serve { host_file } => weir_serve::serve(&host_file),
        Command::Ctl(args) => ctl::dispatch(args),
    }
}

/// How long the exit waits for I/O still under way on the runtime.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(2);

/// Ctrl-C or SIGTERM: the first asks the run to stop at the next commit
/// boundary (a call under way ends within its wall-clock deadline); the
/// second exits at once (128 + the signal's number), saying which sink
/// calls were still under way. Nothing uncommitted was acknowledged, so the
/// next run resumes from the last checkpoint.
async fn stop_on_signals(stop: Arc<AtomicBool>) {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut interrupt), Ok(mut terminate)) = (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    ) else {
        tracing::warn!("cannot listen for Ctrl-C or SIGTERM; stop weir with SIGKILL");
        return;
    };
    loop {
        let (name, code) = tokio::select! {
            _ = interrupt.recv() => ("Ctrl-C", 130),
            _ = terminate.recv() => ("SIGTERM", 143),
        };
        if !stop.swap(true, Ordering::Relaxed) {
            tracing::warn!("{name}: stopping at the next commit boundary (again to exit at once)");
            continue;
        }
        let in_flight = weir_runtime::worker::calls_in_flight();
        let in_flight = if in_flight.is_empty() {
            "no sink call was under way".to_string()
        } else {
            format!("still under way: {}", in_flight.join("; "))
        };
        eprintln!(
            "weir: {name} again: exiting at once; {in_flight}; \
             nothing uncommitted was acknowledged, the next run resumes from the last checkpoint"
        );
        std::process::exit(code);
    }
}

/// The process's shared tokio runtime: it carries the blob stores', the
/// source's queries and the signal handler's I/O, while sink threads and
/// the pipeline block on it from outside. (A Postgres source's replication
/// stream is read on a runtime of its own, see `source::postgres::reader`.)
fn io_runtime() -> Result<tokio::runtime::Runtime, String> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("weir-io")
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the I/O runtime: {e}"))
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    fn parse(args: &[&str]) -> Command {
        Cli::try_parse_from(std::iter::once("weir").chain(args.iter().copied()))
            .expect("parses")
            .command
    }

    #[test]
    fn maintain_takes_tables_and_kinds() {
        let Command::Maintain {
            pipeline,
            sink,
            tables,
            compact,
            expire,
        } = parse(&[
            "maintain",
            "p.yaml",
            "--sink",
            "lake",
            "--table",
            "a",
            "--table",
            "b",
            "--compact",
        ])
        else {
            panic!("not maintain")
        };
        assert_eq!(pipeline, PathBuf::from("p.yaml"));
        assert_eq!(sink.as_deref(), Some("lake"));
        assert_eq!(tables, ["a", "b"]);
        assert!(compact && !expire);
    }

    #[test]
    fn plugin_new_takes_a_name_and_folders() {
        let Command::Plugin {
            command:
                PluginCommand::New {
                    name,
                    lang,
                    dir,
                    sdk,
                },
        } = parse(&["plugin", "new", "my-sink", "--dir", "d", "--sdk", "s"])
        else {
            panic!("not plugin new")
        };
        assert_eq!(name, "my-sink");
        assert_eq!(lang, scaffold::Lang::Rust);
        assert_eq!(dir, Some(PathBuf::from("d")));
        assert_eq!(sdk, Some(PathBuf::from("s")));
        let Command::Plugin {
            command: PluginCommand::New { lang, dir, sdk, .. },
        } = parse(&["plugin", "new", "my-sink", "--lang", "js"])
        else {
            panic!("not plugin new")
        };
        assert_eq!(lang, scaffold::Lang::Js);
        assert!(dir.is_none() && sdk.is_none());
    }

    #[test]
    fn serve_takes_the_host_file() {
        let Command::Serve { host_file } = parse(&["serve", "host.yaml"]) else {
            panic!("not serve")
        };
        assert_eq!(host_file, PathBuf::from("host.yaml"));
        assert!(
            Cli::try_parse_from(["weir", "serve"]).is_err(),
            "the file is required"
        );
    }

    #[test]
    fn status_with_a_server_takes_a_token_too() {
        let Command::Status {
            pipeline,
            json,
            server,
            token,
        } = parse(&[
            "status",
            "acme/orders",
            "--server",
            "http://h:1",
            "--token",
            "t0ken",
            "--json",
        ])
        else {
            panic!("not status")
        };
        assert_eq!(pipeline, PathBuf::from("acme/orders"));
        assert!(json);
        assert_eq!(server.as_deref(), Some("http://h:1"));
        assert_eq!(token.as_deref(), Some("t0ken"));
    }

    #[test]
    fn status_with_a_server_refuses_a_file_path_before_asking() {
        // Nothing listens on a port of TEST-NET-1; the refusal must come
        // from the name check, not from a connection attempt.
        let error = dispatch(parse(&[
            "status",
            "pipelines/acme/orders.yaml",
            "--server",
            "http://192.0.2.1:9",
        ]))
        .expect_err("refused");
        assert!(error.contains("TENANT/PIPELINE"), "{error}");
        assert!(error.contains("unset WEIR_SERVER"), "{error}");
    }
}
