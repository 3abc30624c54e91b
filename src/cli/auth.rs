//! Proxy authentication on the command line: the `--auth-file` flags both
//! roles share, and `rproxy passwd`, which writes that file.

use std::io::{BufRead, IsTerminal};
use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::{Args, Subcommand};

use super::UsageError;
use crate::auth::{AuthFile, Authenticator};

/// The authentication flags of both proxies.
#[derive(Debug, Args)]
pub struct AuthArgs {
    /// Users file (written by `rproxy passwd`): every request must then
    /// carry `Proxy-Authorization: Basic` for one of its users, or gets 407.
    #[arg(long, value_name = "FILE")]
    pub auth_file: Option<PathBuf>,
    /// The realm named in the 407 challenge.
    #[arg(long, default_value = "rproxy")]
    pub realm: String,
}

impl AuthArgs {
    /// The authenticator, when a users file is given; warns when others
    /// may read it.
    ///
    /// # Errors
    /// An unreadable or unparsable file (naming the line), or a bad realm.
    pub fn authenticator(&self) -> Result<Option<Authenticator>, UsageError> {
        let Some(path) = &self.auth_file else {
            return Ok(None);
        };
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
        Authenticator::new(&file, &self.realm)
            .map(Some)
            .map_err(|e| UsageError(format!("--realm: {e}")))
    }
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
