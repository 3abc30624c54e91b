//! The command line: clap definitions, one module per subcommand.

pub mod accelerator;
mod admin;
pub mod auth;
pub mod cache;
pub mod check;
pub mod client;
pub mod demo;
pub mod hsync;
pub mod limits;
pub mod log;
mod serving;
pub mod systemd;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

pub use crate::config::UsageError;
use crate::config::{AcceleratorSettings, ClientSettings, Settings, flag_defaults};

/// rproxy: an HTTP proxy pair that sends rsync deltas instead of whole
/// responses.
#[derive(Debug, Parser)]
#[command(version = env!("RPROXY_VERSION"), about, long_about = None)]
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
    /// Lists, shows and purges the entries of a client proxy's cache.
    #[command(subcommand)]
    Cache(cache::CacheCommand),
    /// Checks a role's configuration file (and flags) and prints the
    /// effective configuration as TOML, as `nginx -t` does: exit 0, or 64
    /// with the line or key at fault.
    Check(check::CheckArgs),
}

/// Parses the process's command line, with each role's defaults (from
/// [`AcceleratorSettings`] and [`ClientSettings`]) shown in `--help`.
///
/// # Errors
/// A bad command line, or `--help`/`--version` (clap's error prints them).
pub fn try_parse() -> Result<Cli, clap::Error> {
    Cli::from_arg_matches(&command().try_get_matches()?)
}

/// The command line's definition, with each role's defaults shown in the
/// help of its flags. The flags themselves have no clap default: one not
/// given must leave the `--config` file's value, and the defaults live in
/// the settings only.
pub fn command() -> clap::Command {
    Cli::command()
        .mut_subcommand("accelerator", show_defaults::<AcceleratorSettings>)
        .mut_subcommand("client", show_defaults::<ClientSettings>)
}

/// Appends `[default: …]` to the help of each flag of `S`'s role with a
/// default, as clap does for its own defaults.
fn show_defaults<S: Settings>(mut role: clap::Command) -> clap::Command {
    for (key, value) in flag_defaults::<S>() {
        role = role.mut_arg(key.replace('-', "_"), |arg| {
            let shown = |help: Option<&clap::builder::StyledStr>| {
                help.map(|help| format!("{help} [default: {value}]"))
            };
            let (help, long_help) = (shown(arg.get_help()), shown(arg.get_long_help()));
            let arg = match help {
                Some(help) => arg.help(help),
                None => arg,
            };
            match long_help {
                Some(long_help) => arg.long_help(long_help),
                None => arg,
            }
        });
    }
    role
}

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
        Command::Check(args) => check::run(args),
        Command::Cache(command) => cache::run(command),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn long_help(role: &str) -> String {
        command()
            .find_subcommand_mut(role)
            .expect("a role")
            .render_long_help()
            .to_string()
    }

    #[test]
    fn the_help_shows_each_default_from_the_settings() {
        command().debug_assert();
        let accelerator = long_help("accelerator");
        for shown in [
            "[default: 1G]",
            "[default: 256M]",
            "[default: 30s]",
            "[default: 64K]",
        ] {
            assert!(accelerator.contains(shown), "{shown} in {accelerator}");
        }
        let client = long_help("client");
        for shown in [
            "[default: cache/client]",
            "[default: 5m]",
            "[default: 4608]",
        ] {
            assert!(client.contains(shown), "{shown} in {client}");
        }
    }

    #[test]
    fn a_flag_not_given_leaves_the_file_and_one_given_overrides_it() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("client.toml");
        std::fs::write(&file, "cache-size = \"2G\"\nlock-timeout = 7\n").unwrap();
        let parse = |extra: &[&str]| {
            let line = ["rproxy", "client", "--config", file.to_str().unwrap()];
            match Cli::try_parse_from(line.iter().chain(extra))
                .unwrap()
                .command
            {
                Command::Client(args) => args.settings().unwrap(),
                _ => unreachable!(),
            }
        };
        let from_file = parse(&[]);
        assert_eq!(from_file.cache_size, crate::config::Size::gib(2));
        assert_eq!(from_file.lock_timeout, std::time::Duration::from_secs(7));
        let overridden = parse(&["--lock-timeout", "100ms", "--cache-size", "512M"]);
        assert_eq!(overridden.cache_size, crate::config::Size::mib(512));
        assert_eq!(
            overridden.lock_timeout,
            std::time::Duration::from_millis(100)
        );
        assert_eq!(overridden.max_object, ClientSettings::default().max_object);
    }

    #[test]
    fn every_size_flag_takes_units() {
        let line = [
            "rproxy",
            "accelerator",
            "--basis-store",
            "256M",
            "--max-stored-body",
            "8M",
            "--max-signature",
            "24K",
            "--max-encode-len",
            "1G",
            "--max-spool",
            "64K",
            "--max-head",
            "64K",
            "--max-target",
            "8K",
            "--connect-timeout",
            "4s",
            "--origin-timeout",
            "1m",
            "--queue-hold-grace",
            "500ms",
            "--header-read-timeout",
            "10",
            "--password-check-wait",
            "2s",
            "--min-upload-rate",
            "1K",
        ];
        let Command::Accelerator(args) = Cli::try_parse_from(line).unwrap().command else {
            unreachable!()
        };
        let settings = args.settings().unwrap();
        assert_eq!(settings.basis_store, crate::config::Size::mib(256));
        assert_eq!(
            settings.queue_hold_grace,
            std::time::Duration::from_millis(500)
        );
        assert_eq!(
            settings
                .limits
                .to_limits()
                .unwrap()
                .min_upload_bytes_per_sec,
            1024
        );
    }
}
