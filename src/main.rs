//! The `rproxy` binary: parse the command line, set up logging, run.
//! Exit codes: 0 success, 64 bad usage, 1 runtime failure.

use std::process::ExitCode;

use clap::Parser;
use rproxy::cli::{Cli, run};

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(error) => {
            let usage_error = error.use_stderr();
            // --help and --version print to stdout and succeed.
            let _ = error.print();
            return if usage_error {
                ExitCode::from(64)
            } else {
                ExitCode::SUCCESS
            };
        }
    };
    // Under inetd, stderr may be the connection itself: nothing is written
    // there then (logs go to a journald or file stderr, as systemd or a
    // wrapper sets up).
    let quiet = rproxy::inetd::stderr_is_the_connection();
    let filter = if quiet {
        tracing_subscriber::EnvFilter::new("off")
    } else {
        tracing_subscriber::EnvFilter::try_from_default_env()
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"))
    };
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            if !quiet {
                eprintln!("rproxy: {error:#}");
            }
            if error.downcast_ref::<rproxy::cli::UsageError>().is_some() {
                ExitCode::from(64)
            } else {
                ExitCode::FAILURE
            }
        }
    }
}
