//! The settings both roles share, each role's file holding them in a table
//! of its own: connection limits (`[limits]`), proxy authentication
//! (`[auth]`) and the logs (`[log]`). Their defaults are the connection layer's
//! ([`ConnectionLimits::default`]) and the password checks'
//! ([`CheckLimits::DEFAULT`]), spelled there once.
//!
//! Main types: [`LimitSettings`], [`AuthSettings`], [`LogSettings`].

use std::num::NonZeroUsize;
use std::path::PathBuf;
use std::time::Duration;

use http::Uri;
use serde::{Deserialize, Serialize};

use super::UsageError;
use super::units::{self, Size};
use crate::http::access_log::{AccessLog, Destination, LogFormat};
use crate::http::auth::CheckLimits;
use crate::http::health::HealthPolicy;
use crate::http::server::ConnectionLimits;

/// Limits on what a client may send and hold (`[limits]`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "kebab-case")]
pub struct LimitSettings {
    /// Time to send a whole request head; also how long an idle
    /// keep-alive connection stays open.
    #[serde(with = "units::duration")]
    pub header_read_timeout: Duration,
    /// Time a connection with a request under way may go without a byte
    /// moving either way.
    #[serde(with = "units::duration")]
    pub idle_timeout: Duration,
    /// Largest request head, request line included.
    pub max_head: Size,
    /// Most header fields in a request.
    pub max_headers: usize,
    /// Longest request target.
    pub max_target: Size,
    /// Most proxies a request may have passed, counted in Via.
    pub max_hops: usize,
    /// Connections served at once.
    pub max_connections: usize,
    /// Requests served at once on one HTTP/2 connection (at least 1).
    pub max_streams: u32,
    /// Time requests under way have to finish after a stop.
    #[serde(with = "units::duration")]
    pub drain_timeout: Duration,
}

impl Default for LimitSettings {
    fn default() -> Self {
        let limits = ConnectionLimits::default();
        LimitSettings {
            header_read_timeout: limits.header_read_timeout,
            idle_timeout: limits.idle_timeout,
            max_head: Size(limits.max_head_bytes as u64),
            max_headers: limits.max_headers,
            max_target: Size(limits.max_target_bytes as u64),
            max_hops: limits.max_hops,
            max_connections: limits.max_connections,
            max_streams: limits.max_streams,
            drain_timeout: limits.drain_timeout,
        }
    }
}

impl LimitSettings {
    /// The limits for the connection layer.
    ///
    /// # Errors
    /// A `max-streams` of 0.
    pub fn to_limits(&self) -> Result<ConnectionLimits, UsageError> {
        if self.max_streams == 0 {
            return Err(UsageError(
                "--max-streams 0: no request could be served; use 1 or more".into(),
            ));
        }
        Ok(ConnectionLimits {
            header_read_timeout: self.header_read_timeout,
            max_head_bytes: saturating_usize(self.max_head),
            max_headers: self.max_headers,
            max_target_bytes: saturating_usize(self.max_target),
            idle_timeout: self.idle_timeout,
            max_hops: self.max_hops,
            max_connections: self.max_connections,
            max_streams: self.max_streams,
            drain_timeout: self.drain_timeout,
        })
    }
}

/// Proxy authentication (`[auth]`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "kebab-case")]
pub struct AuthSettings {
    /// Users file (`rproxy passwd`); none: no authentication.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub auth_file: Option<PathBuf>,
    /// The realm named in the 407 challenge.
    pub realm: String,
    /// Passwords checked at once.
    pub max_password_checks: usize,
    /// Time a password check waits for its turn before a 429.
    #[serde(with = "units::duration")]
    pub password_check_wait: Duration,
    /// Failed logins per address in any 60 seconds.
    pub max_login_failures: u32,
    /// Addresses whose failed logins are counted at once.
    pub max_login_failure_addresses: usize,
}

impl Default for AuthSettings {
    fn default() -> Self {
        AuthSettings {
            auth_file: None,
            realm: "rproxy".into(),
            max_password_checks: CheckLimits::DEFAULT.max_checks.get(),
            password_check_wait: CheckLimits::DEFAULT.check_wait,
            max_login_failures: CheckLimits::DEFAULT.max_failures,
            max_login_failure_addresses: CheckLimits::DEFAULT.max_failure_addresses.get(),
        }
    }
}

impl AuthSettings {
    /// The bounds on password checks.
    ///
    /// # Errors
    /// A zero `max-password-checks`, `max-login-failures` or
    /// `max-login-failure-addresses`.
    pub fn check_limits(&self) -> Result<CheckLimits, UsageError> {
        let max_checks = NonZeroUsize::new(self.max_password_checks).ok_or_else(|| {
            UsageError(
                "--max-password-checks 0: no password could ever be checked; use 1 or more".into(),
            )
        })?;
        if self.max_login_failures == 0 {
            return Err(UsageError(
                "--max-login-failures 0: nobody could ever log in; use 1 or more".into(),
            ));
        }
        let max_failure_addresses = NonZeroUsize::new(self.max_login_failure_addresses)
            .ok_or_else(|| {
                UsageError(
                    "--max-login-failure-addresses 0: no failure could be counted; use 1 or more"
                        .into(),
                )
            })?;
        Ok(CheckLimits {
            max_checks,
            check_wait: self.password_check_wait,
            max_failures: self.max_login_failures,
            max_failure_addresses,
        })
    }
}

/// The logs (`[log]`): the diagnostic log's level, and where and how the
/// access log is written. All three apply again at a reload.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "kebab-case")]
pub struct LogSettings {
    /// The diagnostic log's level, as `RUST_LOG` takes it (`info`,
    /// `warn,rproxy::cache=debug`); `RUST_LOG`, when set, wins.
    pub log_level: String,
    /// Where the access log goes: `stderr`, `off`, or a file (appended
    /// to, reopened on SIGUSR1).
    pub access_log: String,
    /// The access log's lines: `logfmt` or `json`.
    pub log_format: LogFormat,
}

impl Default for LogSettings {
    fn default() -> Self {
        LogSettings {
            log_level: crate::logging::DEFAULT_LEVEL.into(),
            access_log: "stderr".into(),
            log_format: LogFormat::Logfmt,
        }
    }
}

impl LogSettings {
    /// Opens the access log (not written to when `quiet`: under inetd,
    /// stderr may be the connection) and checks the level.
    ///
    /// # Errors
    /// A file that cannot be opened, or a bad level.
    pub fn open(&self, quiet: bool) -> Result<AccessLog, UsageError> {
        crate::logging::parse_level(&self.log_level)?;
        let destination = match Destination::parse(&self.access_log) {
            Destination::Stderr if quiet => Destination::Off,
            destination => destination,
        };
        AccessLog::open(destination, self.log_format)
            .map_err(|e| UsageError(format!("access-log: {e}")))
    }
}

/// A byte budget as a `usize`; past what the machine addresses it is no
/// bound anyway.
pub(super) fn saturating_usize(size: Size) -> usize {
    usize::try_from(size.0).unwrap_or(usize::MAX)
}

/// A server's URL as a setting names one (`origin`, `upstream`):
/// `http://host[:port]` or `https://host[:port]`, no path. `key` names the
/// setting in the error, `or` adds what else it may be (`or "any"`).
pub(super) fn server_url(key: &str, text: &str, or: &str) -> Result<Uri, UsageError> {
    let bad = || {
        UsageError(format!(
            "{key} {text}: use http://host[:port] or https://host[:port]{or}"
        ))
    };
    let url: Uri = text.parse().map_err(|_| bad())?;
    let scheme_ok = matches!(url.scheme_str(), Some("http" | "https"));
    let path_ok = url.path_and_query().is_none_or(|p| p.as_str() == "/");
    if !scheme_ok || url.authority().is_none() || !path_ok {
        return Err(bad());
    }
    Ok(url)
}

/// When an upstream that fails is marked down, from the `health-failures`,
/// `health-down-time` and `health-max-down-time` keys both roles have.
///
/// # Errors
/// A down time of 0 (the upstream would be probed by every request) or a
/// longest one shorter than the first.
pub(super) fn health_policy(
    failures: u32,
    down_time: Duration,
    max_down_time: Duration,
) -> Result<HealthPolicy, UsageError> {
    if down_time.is_zero() && failures > 0 {
        return Err(UsageError(
            "--health-down-time 0: use --health-failures 0 to never mark an upstream down".into(),
        ));
    }
    if max_down_time < down_time {
        return Err(UsageError(format!(
            "--health-max-down-time {max_down_time:?} is shorter than --health-down-time {down_time:?}"
        )));
    }
    Ok(HealthPolicy {
        failures,
        down_time,
        max_down_time,
    })
}
