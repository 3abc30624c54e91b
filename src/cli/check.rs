//! `rproxy check`: validates a role's configuration file, and flags given
//! after it, as the role would at start-up (the users file, the upstream
//! password and the TLS files are read too), then prints the effective
//! configuration as TOML, as `nginx -t` does. Leaves out what only
//! serving shows: binding the listeners and opening the cache.

use std::io::Write;
use std::path::PathBuf;

use clap::Args;

use super::auth::authenticator;
use super::{Cli, Command, UsageError};
use crate::config::{self, Role};

/// Flags of `rproxy check`.
#[derive(Debug, Args)]
pub struct CheckArgs {
    /// The TOML file to check.
    #[arg(long = "config", value_name = "FILE")]
    pub config_file: PathBuf,
    /// The role the file is for [default: the file's `role` key]
    #[arg(long, value_enum)]
    pub role: Option<Role>,
    /// Flags of the role, checked on top of the file as they would
    /// override it (`rproxy check --config c.toml --role client
    /// --cache-size 2G`).
    #[arg(
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "FLAGS"
    )]
    pub flags: Vec<String>,
}

/// Checks the file and flags and prints the effective configuration.
///
/// # Errors
/// A [`UsageError`] naming the line or key at fault, or saying that the
/// role is not known.
pub fn run(args: CheckArgs) -> anyhow::Result<()> {
    let text = effective_config(&args)?;
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes())?;
    out.flush()?;
    eprintln!("rproxy: {} is valid", args.config_file.display());
    Ok(())
}

/// The effective configuration as TOML, once every check passed.
fn effective_config(args: &CheckArgs) -> Result<String, UsageError> {
    let in_file = config::file_role(&args.config_file)?;
    let role = match (args.role, in_file) {
        (Some(asked), Some(named)) if asked != named => {
            return Err(UsageError(format!(
                "--role {}: {} says role = \"{}\"",
                asked.as_str(),
                args.config_file.display(),
                named.as_str()
            )));
        }
        (Some(role), _) | (None, Some(role)) => role,
        (None, None) => {
            return Err(UsageError(format!(
                "{}: which role is it for? give --role accelerator or --role client, \
                 or set role in the file",
                args.config_file.display()
            )));
        }
    };
    // The role's own parser reads the flags, so they mean here exactly
    // what they mean to `rproxy accelerator` or `rproxy client`.
    let mut line = vec!["rproxy".to_owned(), role.as_str().to_owned()];
    line.extend(args.flags.iter().cloned());
    line.push("--config".into());
    line.push(args.config_file.display().to_string());
    let cli = <Cli as clap::Parser>::try_parse_from(&line)
        .map_err(|e| UsageError(e.to_string().trim_end().replace('\n', " ")))?;
    match cli.command {
        Command::Accelerator(flags) => {
            let mut settings = flags.settings()?;
            settings.to_config(settings.listen)?;
            settings.limits.to_limits()?;
            authenticator(&settings.auth)?;
            crate::logging::parse_level(&settings.log.log_level)?;
            if let (Some(cert), Some(key)) = (&settings.tls_cert, &settings.tls_key) {
                crate::http::tls::server_config(cert, key)
                    .map_err(|e| UsageError(format!("--tls-cert/--tls-key: {e}")))?;
            }
            if settings.inetd && settings.slots > 0 {
                return Err(UsageError(
                    "--slots needs the listener: each inetd process serves one connection".into(),
                ));
            }
            if settings.inetd && settings.tls_cert.is_some() {
                return Err(UsageError(
                    "--inetd serves plain HTTP; leave TLS to the listener".into(),
                ));
            }
            settings.role = Some(role);
            Ok(config::to_toml(&settings))
        }
        Command::Client(flags) => {
            let mut settings = flags.settings()?;
            settings.to_config(settings.listen)?;
            settings.limits.to_limits()?;
            authenticator(&settings.auth)?;
            crate::logging::parse_level(&settings.log.log_level)?;
            settings.role = Some(role);
            Ok(config::to_toml(&settings))
        }
        _ => unreachable!("the line starts with a role"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(text: &str, role: Option<Role>, flags: &[&str]) -> Result<String, UsageError> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("rproxy.toml");
        std::fs::write(&path, text).unwrap();
        effective_config(&CheckArgs {
            config_file: path,
            role,
            flags: flags.iter().map(|f| f.to_string()).collect(),
        })
    }

    #[test]
    fn the_effective_configuration_is_the_file_with_the_flags_on_top() {
        let printed = check(
            "role = \"client\"\ncache-size = \"2G\"\nlock-timeout = 7\n",
            None,
            &["--lock-timeout", "100ms"],
        )
        .unwrap();
        assert!(printed.starts_with("role = \"client\"\n"), "{printed}");
        assert!(printed.contains("cache-size = \"2G\"\n"), "{printed}");
        assert!(printed.contains("lock-timeout = \"100ms\"\n"), "{printed}");
        assert!(printed.contains("[limits]\n"), "{printed}");
        // What it prints is a file that checks to the same.
        assert_eq!(check(&printed, None, &[]).unwrap(), printed);
    }

    #[test]
    fn the_role_comes_from_the_flag_or_the_file_and_they_must_agree() {
        assert!(check("", Some(Role::Accelerator), &[]).is_ok());
        let unknown = check("", None, &[]).unwrap_err().0;
        assert!(unknown.contains("--role"), "{unknown}");
        let disagree = check("role = \"client\"\n", Some(Role::Accelerator), &[]);
        assert!(disagree.unwrap_err().0.contains("role = \"client\""));
    }

    #[test]
    fn a_bad_value_names_its_key_and_a_bad_flag_is_refused() {
        let bad_url = check("origin = \"not a url\"\n", Some(Role::Accelerator), &[]);
        assert!(bad_url.unwrap_err().0.contains("--origin"));
        let bad_flag = check("", Some(Role::Client), &["--cache-size", "lots"]);
        assert!(bad_flag.unwrap_err().0.contains("--cache-size"));
        let other_role = check("", Some(Role::Client), &["--origin", "http://a"]);
        assert!(other_role.is_err(), "--origin is the accelerator's");
    }
}
