//! The `weir` command; everything it does lives in [`weir::cli`].

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("WEIR_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = weir::cli::Cli::parse();
    match weir::cli::dispatch(cli.command) {
        Ok(code) => code,
        Err(message) => {
            eprintln!("weir: {message}");
            ExitCode::from(1)
        }
    }
}
