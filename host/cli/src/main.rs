//! The `weir` command: [`commands`] parses and dispatches, [`ctl`] talks
//! to a running `weir serve`, [`maintain`] runs a sink's maintenance,
//! [`conformance`] is `weir plugin test`, [`scaffold`] is `weir plugin new`,
//! and [`render`] prints answers.
//! What each command does lives in the crates below (weir-pipeline,
//! weir-serve, weir-runtime, weir-source).

mod commands;
mod conformance;
mod ctl;
mod maintain;
mod render;
mod scaffold;

use std::process::ExitCode;

use clap::Parser;

/// The allocator. A source hands every change from the I/O runtime's
/// threads to the pipeline's, which frees it: glibc's allocator took an
/// arena lock for each of those frees and then consolidated its arenas,
/// which was most of the time both threads spent in the MySQL benchmark
/// (docs/mysql.md, Performance). mimalloc frees across threads without a
/// lock. Built without transparent huge pages (the crate's `no_thp`): with
/// them a run's resident set was about twice glibc's (62 MB against 34 for
/// a run of no rows); without, it is 42 MB (46 for a 200,000-row
/// transaction, against 39).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some(weir_runtime::compiler::COMPILE_ARG) {
        return weir_runtime::compiler::child_main(&args[2..]);
    }
    // Plugins compile in child processes of this binary, bounded by CPU
    // time; without a path to it they compile in process.
    if let Ok(program) = std::env::current_exe() {
        weir_runtime::compiler::compile_in_child_processes(program);
    }
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("WEIR_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = commands::Cli::parse();
    match commands::dispatch(cli.command) {
        Ok(code) => code,
        Err(message) => {
            eprintln!("weir: {message}");
            ExitCode::from(1)
        }
    }
}
