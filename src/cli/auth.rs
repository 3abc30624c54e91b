//! Proxy authentication on the command line: the `--auth-file` flags both
//! roles share, and `rproxy passwd`, which writes that file.

use std::io::{BufRead, IsTerminal};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use clap::{Args, Subcommand};

use super::UsageError;
use crate::config::units::parse_duration;
use crate::config::{AuthSettings, override_with_flags};
use crate::http::auth::{AuthFile, Authenticator};

/// The authentication flags of both proxies (`[auth]` in the file); their
/// defaults are [`AuthSettings`]'s.
#[derive(Debug, Args)]
pub struct AuthArgs {
    /// Users file (written by `rproxy passwd`): every request must then
    /// carry `Proxy-Authorization: Basic` for one of its users, or gets 407.
    #[arg(long, value_name = "FILE")]
    pub auth_file: Option<PathBuf>,
    /// The realm named in the 407 challenge.
    #[arg(long)]
    pub realm: Option<String>,
    /// Passwords checked at once. A check is an argon2id hash holding
    /// 19 MiB (with rproxy passwd's parameters) for tens of milliseconds,
    /// so this bounds their memory at N × 19 MiB (38 MiB by default).
    /// A credential that passed is remembered for five minutes and needs
    /// no check.
    #[arg(long, value_name = "N")]
    pub max_password_checks: Option<usize>,
    /// Time a password check waits for its turn when
    /// --max-password-checks are running, before the request gets 429 with
    /// Retry-After (0: at once): 30s, 5m, 100ms or seconds. Waiting costs
    /// no thread and no hash memory.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub password_check_wait: Option<Duration>,
    /// Failed logins per address in any 60 seconds: an address with N in
    /// the last 60 seconds gets 429 without a password check until the
    /// oldest of them is 60 seconds old (a sliding minute, so no 60-second
    /// span holds more than N). A check counts as failed until it passes,
    /// so a burst gets no more than N checks. Credentials that passed in
    /// the last five minutes still get through from that address.
    #[arg(long, value_name = "N")]
    pub max_login_failures: Option<u32>,
    /// Addresses whose failed logins are counted at once: memory for
    /// them is at most N × (360 + 4 × --max-login-failures) bytes (40 MB
    /// at the defaults; about 310 bytes each once grown). When all are
    /// taken, the address whose last failure leaves the minute first is
    /// forgotten, so many addresses (an IPv6 block) can neither grow the
    /// table nor keep new clients from logging in.
    #[arg(long, value_name = "N")]
    pub max_login_failure_addresses: Option<usize>,
}

impl AuthArgs {
    /// Sets the authentication settings given as flags.
    pub fn apply(&self, settings: &mut AuthSettings) {
        override_with_flags!(settings, self;
            plain: realm, max_password_checks, password_check_wait, max_login_failures,
                max_login_failure_addresses;
            optional: auth_file;
            switches: );
    }
}

/// The authenticator, when a users file is given; warns when others may
/// read it.
///
/// # Errors
/// An unreadable or unparsable file (naming the line), a bad realm or bad
/// check limits.
pub fn authenticator(settings: &AuthSettings) -> Result<Option<Authenticator>, UsageError> {
    let Some(path) = &settings.auth_file else {
        return Ok(None);
    };
    let limits = settings.check_limits()?;
    let (file, warning) =
        AuthFile::load(path).map_err(|e| UsageError(format!("--auth-file {e}")))?;
    if let Some(warning) = warning {
        tracing::warn!("{warning}");
    }
    if file.users().next().is_none() {
        tracing::warn!(
            "{}: no users; every request will get 407 (add one with rproxy passwd add)",
            path.display()
        );
    }
    let authenticator =
        Authenticator::with_limits(&file, &settings.realm, limits).map_err(UsageError)?;
    tracing::info!(
        max_checks = limits.max_checks.get(),
        max_memory_mib = authenticator.max_check_memory() >> 20,
        wait_secs = limits.check_wait.as_secs(),
        max_failures_per_minute = limits.max_failures,
        max_failure_addresses = limits.max_failure_addresses.get(),
        failure_table_max_mib = limits.max_failure_table_memory() >> 20,
        "password checks bounded"
    );
    Ok(Some(authenticator))
}

/// `rproxy passwd`: manage a users file.
#[derive(Debug, Subcommand)]
pub enum PasswdCommand {
    /// Adds USER, or changes their password. The password is asked for on
    /// the terminal (twice), or read as one line from stdin when it is not
    /// a terminal. Creates FILE (mode 0600) when missing.
    Add {
        /// The users file.
        file: PathBuf,
        /// The user name (printable, no ':' or spaces).
        user: String,
    },
    /// Removes USER.
    Remove {
        /// The users file.
        file: PathBuf,
        /// The user name.
        user: String,
    },
    /// Lists the users.
    List {
        /// The users file.
        file: PathBuf,
    },
}

fn load_or_new(path: &Path) -> anyhow::Result<AuthFile> {
    if path.exists() {
        Ok(AuthFile::load(path)?.0)
    } else {
        Ok(AuthFile::default())
    }
}

/// Reads a password: twice from the terminal, or one line from stdin.
fn read_password(user: &str) -> anyhow::Result<String> {
    let password = if std::io::stdin().is_terminal() {
        let first = rpassword::prompt_password(format!("password for {user}: "))?;
        let again = rpassword::prompt_password("again: ")?;
        if first != again {
            return Err(UsageError("the passwords differ; nothing changed".into()).into());
        }
        first
    } else {
        let mut line = String::new();
        std::io::stdin()
            .lock()
            .read_line(&mut line)
            .context("cannot read the password from stdin")?;
        line.trim_end_matches(['\r', '\n']).to_owned()
    };
    if password.is_empty() {
        return Err(UsageError("an empty password; nothing changed".into()).into());
    }
    Ok(password)
}

/// Runs `rproxy passwd`.
///
/// # Errors
/// A file that cannot be read, parsed or written; a bad user name; an
/// empty or mistyped password.
pub fn run(command: PasswdCommand) -> anyhow::Result<()> {
    match command {
        PasswdCommand::Add { file, user } => {
            let mut users = load_or_new(&file)?;
            let password = read_password(&user)?;
            users
                .set(&user, &password)
                .map_err(|e| UsageError(e.to_string()))?;
            users.save(&file)?;
            eprintln!("{}: {user} set", file.display());
        }
        PasswdCommand::Remove { file, user } => {
            let mut users = AuthFile::load(&file)?.0;
            if !users.remove(&user) {
                return Err(UsageError(format!("{}: no user {user}", file.display())).into());
            }
            users.save(&file)?;
            eprintln!("{}: {user} removed", file.display());
        }
        PasswdCommand::List { file } => {
            for user in AuthFile::load(&file)?.0.users() {
                println!("{user}");
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;
    use crate::cli::{Cli, Command};
    use crate::http::auth::CheckLimits;

    fn auth_args(role: &str, extra: &[&str]) -> AuthSettings {
        let cli = Cli::try_parse_from(["rproxy", role].iter().chain(extra).copied()).unwrap();
        let mut settings = AuthSettings::default();
        match cli.command {
            Command::Accelerator(args) => args.auth.apply(&mut settings),
            Command::Client(args) => args.auth.apply(&mut settings),
            _ => unreachable!("a role with --auth-file"),
        }
        settings
    }

    #[test]
    fn a_10_both_roles_take_the_check_limits_with_one_set_of_defaults() {
        for role in ["accelerator", "client"] {
            let defaults = auth_args(role, &[]).check_limits().unwrap();
            assert_eq!(defaults, CheckLimits::DEFAULT, "{role}");
            let set = auth_args(
                role,
                &[
                    "--max-password-checks",
                    "4",
                    "--password-check-wait",
                    "0",
                    "--max-login-failures",
                    "3",
                    "--max-login-failure-addresses",
                    "5000",
                ],
            );
            let limits = set.check_limits().unwrap();
            assert_eq!(limits.max_checks.get(), 4);
            assert_eq!(limits.check_wait, Duration::ZERO);
            assert_eq!(limits.max_failures, 3);
            assert_eq!(limits.max_failure_addresses.get(), 5000);
            for zero in [
                "--max-password-checks",
                "--max-login-failures",
                "--max-login-failure-addresses",
            ] {
                let error = auth_args(role, &[zero, "0"]).check_limits().unwrap_err();
                assert!(error.0.contains("use 1 or more"), "{role} {zero}: {error}");
            }
        }
    }
}
