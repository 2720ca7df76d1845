//! The `weir` command.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use clap::{Parser, Subcommand};

use weir::config::PipelineConfig;
use weir::pipeline::{self, RunOptions};
use weir::runtime::WasmEngine;
use weir::runtime::plugin;

#[derive(Parser)]
#[command(
    name = "weir",
    version,
    about = "Exactly-once change data capture into WebAssembly sinks"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
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
        pipeline: PathBuf,
        #[arg(long)]
        json: bool,
    },
    /// Work with plugin files.
    Plugin {
        #[command(subcommand)]
        command: PluginCommand,
    },
}

#[derive(Subcommand)]
enum PluginCommand {
    /// Show a plugin's contract version, capabilities, imports, digest and size.
    Inspect {
        file: PathBuf,
        #[arg(long)]
        json: bool,
        /// Where compiled components are cached.
        #[arg(long, default_value = ".weir/component-cache")]
        cache_dir: PathBuf,
    },
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("WEIR_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    match dispatch(cli.command) {
        Ok(code) => code,
        Err(message) => {
            eprintln!("weir: {message}");
            ExitCode::from(1)
        }
    }
}

fn dispatch(command: Command) -> Result<ExitCode, String> {
    match command {
        Command::Run {
            pipeline,
            max_changes,
            json,
        } => {
            let config = PipelineConfig::load(&pipeline).map_err(|e| e.to_string())?;
            let stop = Arc::new(AtomicBool::new(false));
            {
                let stop = stop.clone();
                std::thread::spawn(move || {
                    let runtime = tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build();
                    if let Ok(runtime) = runtime {
                        runtime.block_on(async {
                            let _ = tokio::signal::ctrl_c().await;
                        });
                        stop.store(true, Ordering::Relaxed);
                    }
                });
            }
            let report = pipeline::run(&config, &RunOptions { max_changes }, stop)
                .map_err(|e| format!("pipeline `{}`: {e}", config.pipeline))?;
            if json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&report).expect("serializable")
                );
            } else {
                println!(
                    "pipeline `{}` (epoch {}): {} changes in {} transactions, {} batches committed, checkpoint {}",
                    report.pipeline,
                    report.epoch,
                    report.changes,
                    report.transactions,
                    report.batches_committed,
                    report.checkpoint.as_deref().unwrap_or("(none)")
                );
            }
            if report.disabled.is_empty() {
                Ok(ExitCode::SUCCESS)
            } else {
                for (sink, reason) in &report.disabled {
                    eprintln!(
                        "weir: optional sink `{sink}` was disabled and is behind: {reason}; \
                         fix it and run again to catch it up"
                    );
                }
                Ok(ExitCode::from(3))
            }
        }
        Command::Status { pipeline, json } => {
            let config = PipelineConfig::load(&pipeline).map_err(|e| e.to_string())?;
            let status = weir::status::status(&config).map_err(|e| e.to_string())?;
            if json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&status).expect("serializable")
                );
            } else {
                println!(
                    "pipeline `{}`, epoch {}, source head {}",
                    status.pipeline,
                    status.epoch.map_or("-".to_string(), |e| e.to_string()),
                    status.source_head.as_deref().unwrap_or("(unbounded)")
                );
                for sink in &status.sinks {
                    println!(
                        "sink `{}` ({}, {}){}",
                        sink.sink,
                        if sink.required {
                            "required"
                        } else {
                            "optional"
                        },
                        if sink.positioned {
                            "exactly-once: positions kept by the sink"
                        } else {
                            "at-least-once: positions kept by the host"
                        },
                        sink.error
                            .as_deref()
                            .map(|e| format!(" error: {e}"))
                            .unwrap_or_default()
                    );
                    for t in &sink.tables {
                        println!(
                            "  {:<24} {:>16}  from {:<5}  lag {}{}",
                            t.table,
                            t.position.as_deref().unwrap_or("-"),
                            t.source,
                            t.lag_transactions
                                .map_or("-".to_string(), |l| format!("{l} transactions")),
                            t.store_position
                                .as_deref()
                                .map(|s| format!("  (store says {s})"))
                                .unwrap_or_default()
                        );
                    }
                }
            }
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
            if json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&info).expect("serializable")
                );
            } else {
                println!("plugin       {}", info.path.display());
                println!("sha256       {}", info.sha256);
                println!("size         {} bytes", info.size);
                println!("contract     weir:sink@{}", info.wit_version);
                println!(
                    "capabilities {}",
                    if info.capabilities.is_empty() {
                        "none (at-least-once: the host keeps positions)".to_string()
                    } else {
                        format!("{} (exactly-once)", info.capabilities.join(", "))
                    }
                );
                println!("imports      {}", info.imports.join("\n             "));
                println!("exports      {}", info.exports.join("\n             "));
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}
