//! The command line: clap definitions, one module per subcommand.

pub mod accelerator;
pub mod auth;
pub mod client;
pub mod demo;
pub mod hsync;
pub mod limits;
mod serving;

use clap::{Parser, Subcommand};

/// rproxy: an HTTP proxy pair that sends rsync deltas instead of whole
/// responses.
#[derive(Debug, Parser)]
#[command(version, about, long_about = None)]
pub struct Cli {
    /// What to run.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// The hsync/1 codec as command-line tools: sign, encode, decode, stats.
    #[command(subcommand)]
    Hsync(hsync::HsyncCommand),
    /// Reverse proxy in front of an origin: answers clients that offer
    /// hsync with a delta stream, passes everything else through.
    Accelerator(accelerator::AcceleratorArgs),
    /// Caching forward proxy and gateway near the users: sends the
    /// signature of the best cached basis upstream, rebuilds and verifies
    /// the delta, and caches the result.
    Client(client::ClientArgs),
    /// The whole pipeline on loopback: an origin serving a folder, an
    /// accelerator, a client proxy; fetches an older then a newer release
    /// through them and reports the bytes saved.
    Demo(demo::DemoArgs),
    /// Manages the users file of --auth-file: add, remove, list.
    #[command(subcommand)]
    Passwd(auth::PasswdCommand),
}

/// A bad flag or configuration: the process exits with 64.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct UsageError(pub String);

/// Runs a parsed command line.
///
/// # Errors
/// Whatever the command reports; the message says what to do.
pub fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Hsync(command) => hsync::run(command),
        Command::Accelerator(args) => accelerator::run(args),
        Command::Client(args) => client::run(args),
        Command::Demo(args) => demo::run(args),
        Command::Passwd(command) => auth::run(command),
    }
}
