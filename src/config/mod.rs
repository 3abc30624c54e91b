//! Each role's settings, as the operator gives them: one typed struct per
//! role ([`AcceleratorSettings`], [`ClientSettings`]) whose `Default` is
//! the one place its defaults are spelled. A TOML file (`--config FILE`)
//! fills it, then each flag given on the command line overrides its key;
//! `to_config` validates the result once and resolves it into the
//! role's runtime config ([`crate::accelerator::AcceleratorConfig`],
//! [`crate::client_proxy::ClientConfig`]).
//!
//! The file's keys are the flags' names without `--` (`max-spool = "1G"`);
//! the flags both roles share sit in the tables `[limits]` and `[auth]`.
//! Sizes and durations take one syntax everywhere ([`units`]). Unknown
//! keys are errors, reported with their line.
//!
//! A running proxy re-reads its file on SIGHUP and applies it to new
//! requests, except the keys of [`Settings::RESTART_KEYS`]
//! ([`restart_needed`] names those that changed).
//!
//! Leaves out: environment variables as a third source (only the upstream
//! password is read from one).
//!
//! Main items: [`AcceleratorSettings`], [`ClientSettings`],
//! [`LimitSettings`], [`AuthSettings`], [`AdminListen`], [`Role`], [`load`],
//! [`UsageError`].

mod accelerator;
mod client;
mod shared;
pub mod units;

use std::path::Path;

use http::HeaderValue;
use serde::Serialize;
use serde::de::DeserializeOwned;

pub use accelerator::AcceleratorSettings;
pub use client::{ClientSettings, SubscribeSettings, UPSTREAM_PASSWORD_ENV};
pub use shared::{AdminListen, AuthSettings, LimitSettings, LogSettings};
pub use units::Size;

/// A bad flag or configuration: the process exits with 64.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct UsageError(pub String);

/// Which proxy a configuration is for; a file may say so with
/// `role = "accelerator"` or `role = "client"`.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize, clap::ValueEnum,
)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// `rproxy accelerator`.
    Accelerator,
    /// `rproxy client`.
    Client,
}

impl Role {
    /// The subcommand's name.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Accelerator => "accelerator",
            Role::Client => "client",
        }
    }
}

/// A role's settings: what [`load`] and the help texts need to know.
pub trait Settings: Serialize + DeserializeOwned + Default {
    /// The role these settings are for.
    const ROLE: Role;
    /// The role the file named, if any.
    fn file_role(&self) -> Option<Role>;
    /// The keys a reload does not apply (`table.key` for one in a table):
    /// what is bound or sized once at start (listeners, the cache
    /// directory, memory and disk pools, queues, the connection count). A
    /// change to one of them is logged and waits for a restart.
    const RESTART_KEYS: &'static [&'static str];
}

/// The keys of [`Settings::RESTART_KEYS`] whose values differ between the
/// settings in force (`running`) and a reloaded file's (`reloaded`).
pub fn restart_needed<S: Settings>(running: &S, reloaded: &S) -> Vec<&'static str> {
    let table = |settings: &S| {
        toml::Table::try_from(settings).expect("settings are plain keys, strings and numbers")
    };
    let (running, reloaded) = (table(running), table(reloaded));
    // `table.key` names a key of a table (`limits.max-connections`).
    let value = |table: &toml::Table, key: &str| -> Option<toml::Value> {
        let mut path = key.split('.');
        let mut value = table.get(path.next()?)?;
        for part in path {
            value = value.get(part)?;
        }
        Some(value.clone())
    };
    S::RESTART_KEYS
        .iter()
        .copied()
        .filter(|key| value(&running, key) != value(&reloaded, key))
        .collect()
}

/// Reads a role's settings from a TOML file; keys left out keep their
/// defaults.
///
/// # Errors
/// An unreadable file, or a one-line [`UsageError`] naming the file and
/// the line at fault: bad TOML, an unknown key, a value of the wrong type
/// or syntax, or a file whose `role` is the other one.
pub fn load<S: Settings>(path: &Path) -> Result<S, UsageError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| UsageError(format!("--config {}: {e}", path.display())))?;
    let settings: S = parse(path, &text)?;
    match settings.file_role() {
        Some(role) if role != S::ROLE => Err(UsageError(format!(
            "{}: role = \"{}\": a file for the {}, not the {}",
            path.display(),
            role.as_str(),
            role.as_str(),
            S::ROLE.as_str()
        ))),
        _ => Ok(settings),
    }
}

/// The role a file names with `role = "..."`, if any.
///
/// # Errors
/// As [`load`], for a file that is not TOML or has a bad `role`.
pub fn file_role(path: &Path) -> Result<Option<Role>, UsageError> {
    #[derive(serde::Deserialize)]
    struct RoleOnly {
        role: Option<Role>,
    }
    let text = std::fs::read_to_string(path)
        .map_err(|e| UsageError(format!("--config {}: {e}", path.display())))?;
    Ok(parse::<RoleOnly>(path, &text)?.role)
}

/// `toml::from_str`, with its error as `FILE:LINE: message`: toml's own
/// report spans several lines with a snippet, and a bad configuration
/// gets one line on stderr.
fn parse<T: DeserializeOwned>(path: &Path, text: &str) -> Result<T, UsageError> {
    toml::from_str(text).map_err(|error| {
        let line = error
            .span()
            .map(|span| text[..span.start.min(text.len())].matches('\n').count() + 1);
        let message = error.message().trim_end().replace('\n', " ");
        UsageError(match line {
            Some(line) => format!("{}:{line}: {message}", path.display()),
            None => format!("{}: {message}", path.display()),
        })
    })
}

/// The settings as a TOML file, as `rproxy check` prints them.
pub fn to_toml<S: Settings>(settings: &S) -> String {
    toml::to_string(settings).expect("settings are plain keys, strings and numbers")
}

/// Every key of a role's defaults with its value as a flag would take it
/// (`max-spool` → `1G`), for the help texts; keys of the tables
/// (`[limits]`) are listed without the table's name, as their flags are.
/// Keys without a default (`via-name`) and `false` switches are left out.
pub fn flag_defaults<S: Settings>() -> Vec<(String, String)> {
    fn walk(table: &toml::Table, out: &mut Vec<(String, String)>) {
        for (key, value) in table {
            let shown = match value {
                toml::Value::Table(inner) => {
                    walk(inner, out);
                    continue;
                }
                toml::Value::Boolean(false) => continue,
                toml::Value::String(text) => text.clone(),
                other => other.to_string(),
            };
            out.push((key.clone(), shown));
        }
    }
    let table = toml::Table::try_from(S::default()).expect("settings are a table");
    let mut out = Vec::new();
    walk(&table, &mut out);
    out
}

/// Checks a Via pseudonym (`via-name`), or takes `address` when none is
/// given: a header value that cannot carry CR/LF or separators (P-24).
///
/// # Errors
/// A name with other characters, or empty, or longer than 255.
pub fn via_name(
    name: Option<&str>,
    address: std::net::SocketAddr,
) -> Result<HeaderValue, UsageError> {
    let name = name.map_or_else(|| address.to_string(), str::to_owned);
    let valid = !name.is_empty()
        && name.len() <= 255
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b".:_-[]".contains(&b));
    if !valid {
        return Err(UsageError(format!(
            "--via-name {name:?}: use letters, digits, '.', ':', '_' or '-' (at most 255)"
        )));
    }
    Ok(HeaderValue::from_str(&name).expect("checked above"))
}

/// Copies each flag that was given onto its key of the settings; a flag
/// not given (`None`, or a switch left off) leaves the file's value.
/// `plain` fields are `Option<T>` in the flags and `T` in the settings,
/// `optional` ones `Option<T>` in both, `switches` are `bool` in both.
macro_rules! override_with_flags {
    ($settings:expr, $flags:expr;
     plain: $($plain:ident),* ;
     optional: $($optional:ident),* ;
     switches: $($switch:ident),* $(;)?) => {{
        $( if let Some(value) = &$flags.$plain { $settings.$plain = value.clone(); } )*
        $( if let Some(value) = &$flags.$optional { $settings.$optional = Some(value.clone()); } )*
        $( if $flags.$switch { $settings.$switch = true; } )*
    }};
}
pub(crate) use override_with_flags;

#[cfg(test)]
mod tests {
    use super::*;

    fn write(text: &str) -> (tempfile::TempDir, std::path::PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("rproxy.toml");
        std::fs::write(&path, text).unwrap();
        (dir, path)
    }

    #[test]
    fn each_example_file_sets_the_defaults_and_names_every_key() {
        fn check<S: Settings + PartialEq + std::fmt::Debug>(example: &str, name: &str) {
            let parsed: S = parse(Path::new(name), example).unwrap();
            assert_eq!(parsed.file_role(), Some(S::ROLE), "{name}");
            assert_eq!(
                to_toml(&parsed).replace(&format!("role = \"{}\"\n", S::ROLE.as_str()), ""),
                to_toml(&S::default()),
                "{name} must spell the defaults"
            );
            for (key, _) in flag_defaults::<S>() {
                assert!(
                    example.lines().any(|line| line
                        .trim_start_matches(['#', ' '])
                        .starts_with(&format!("{key} ="))),
                    "{name} does not show {key}"
                );
            }
        }
        check::<AcceleratorSettings>(
            include_str!("../../examples/accelerator.toml"),
            "examples/accelerator.toml",
        );
        check::<ClientSettings>(
            include_str!("../../examples/client.toml"),
            "examples/client.toml",
        );
    }

    #[test]
    fn an_unknown_key_is_reported_with_its_line() {
        let (_dir, path) = write("listen = \"127.0.0.1:9000\"\n\nmax-spol = \"1G\"\n");
        let error = load::<AcceleratorSettings>(&path).unwrap_err().0;
        assert!(
            error.contains("rproxy.toml:3: unknown field `max-spol`"),
            "{error}"
        );
        assert!(!error.contains('\n'), "one line: {error}");
        let (_dir, path) = write("[limits]\nidle-timeout = \"1d\"\n");
        let error = load::<ClientSettings>(&path).unwrap_err().0;
        assert!(error.contains(":2: "), "{error}");
        assert!(error.contains("not a duration"), "{error}");
    }

    #[test]
    fn a_file_for_the_other_role_is_refused() {
        let (_dir, path) = write("role = \"client\"\n");
        let error = load::<AcceleratorSettings>(&path).unwrap_err().0;
        assert!(error.contains("a file for the client"), "{error}");
        assert_eq!(file_role(&path).unwrap(), Some(Role::Client));
        assert!(load::<ClientSettings>(&path).is_ok());
    }

    #[test]
    fn keys_left_out_keep_their_defaults() {
        let (_dir, path) = write("basis-store = \"64M\"\n[limits]\nidle-timeout = 120\n");
        let settings = load::<AcceleratorSettings>(&path).unwrap();
        assert_eq!(settings.basis_store, Size::mib(64));
        assert_eq!(
            settings.limits.idle_timeout,
            std::time::Duration::from_secs(120)
        );
        assert_eq!(
            AcceleratorSettings {
                basis_store: Size::mib(64),
                limits: LimitSettings {
                    idle_timeout: std::time::Duration::from_secs(120),
                    ..LimitSettings::default()
                },
                ..AcceleratorSettings::default()
            },
            settings
        );
    }
}
