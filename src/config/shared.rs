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
    /// keep-alive connection stays open, and the grace of
    /// `min-upload-rate`.
    #[serde(with = "units::duration")]
    pub header_read_timeout: Duration,
    /// Time a connection with a request under way may go without a byte
    /// moving either way.
    #[serde(with = "units::duration")]
    pub idle_timeout: Duration,
    /// Least average rate of a request body past its grace (the header
    /// read timeout), in bytes per second; 0: none.
    pub min_upload_rate: Size,
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
            min_upload_rate: Size(limits.min_upload_bytes_per_sec),
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
            min_upload_bytes_per_sec: self.min_upload_rate.0,
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

/// `admin-listen`: where the admin listener (`/metrics`, the status page)
/// listens, or `off`. Written `"127.0.0.1:9082"` or `"off"` in files and
/// flags alike.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AdminListen {
    /// No admin listener.
    Off,
    /// Listen on this address.
    On(std::net::SocketAddr),
}

/// What `admin-listen` takes besides an address.
const ADMIN_OFF: &str = "off";

impl AdminListen {
    /// The address to bind for a role listening on `listen`, with its
    /// `[auth]` and `inetd`; `None` when off, or under inetd (one process
    /// per connection has nothing to report for long).
    ///
    /// # Errors
    /// The proxy's own address (one socket cannot be both), or a
    /// non-loopback address while nobody has to authenticate.
    pub fn address(
        self,
        listen: std::net::SocketAddr,
        auth: &AuthSettings,
        inetd: bool,
    ) -> Result<Option<std::net::SocketAddr>, UsageError> {
        let AdminListen::On(address) = self else {
            return Ok(None);
        };
        if inetd {
            return Ok(None);
        }
        // The same port on the same address, or on every address (0.0.0.0
        // takes the port on loopback too): the second bind would fail, and
        // name the proxy's listener, since the admin listener binds first.
        let overlaps = address.ip() == listen.ip()
            || address.ip().is_unspecified()
            || listen.ip().is_unspecified();
        if address.port() == listen.port() && address.port() != 0 && overlaps {
            return Err(UsageError(format!(
                "--admin-listen {address}: that is the proxy's --listen {listen}, and one socket \
                 cannot serve both; give the admin listener another port, or \"{ADMIN_OFF}\""
            )));
        }
        if !address.ip().is_loopback() && auth.auth_file.is_none() {
            return Err(UsageError(format!(
                "--admin-listen {address}: not a loopback address, and nobody has to \
                 authenticate; give --auth-file (its users may then read the metrics), or \
                 keep the admin listener on loopback"
            )));
        }
        Ok(Some(address))
    }
}

impl std::fmt::Display for AdminListen {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AdminListen::Off => f.write_str(ADMIN_OFF),
            AdminListen::On(address) => address.fmt(f),
        }
    }
}

impl std::str::FromStr for AdminListen {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        if text.eq_ignore_ascii_case(ADMIN_OFF) {
            return Ok(AdminListen::Off);
        }
        text.parse().map(AdminListen::On).map_err(|_| {
            format!("{text:?}: give an address and port (127.0.0.1:9082) or \"{ADMIN_OFF}\"")
        })
    }
}

impl Serialize for AdminListen {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for AdminListen {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn admin_listen_reads_an_address_or_off_and_prints_back() {
        for text in ["127.0.0.1:9082", "[::1]:9081", "off"] {
            let parsed: AdminListen = text.parse().unwrap();
            assert_eq!(parsed.to_string(), text);
        }
        assert_eq!("OFF".parse(), Ok(AdminListen::Off));
        let bad = "9082".parse::<AdminListen>().unwrap_err();
        assert!(bad.contains("\"off\""), "{bad}");
    }

    #[test]
    fn the_admin_listener_is_never_the_proxy_socket_nor_open_beyond_loopback() {
        let listen: std::net::SocketAddr = "127.0.0.1:8082".parse().unwrap();
        let none = AuthSettings::default();
        let at = |text: &str| AdminListen::On(text.parse().unwrap());
        assert_eq!(
            at("127.0.0.1:9082").address(listen, &none, false).unwrap(),
            Some("127.0.0.1:9082".parse().unwrap())
        );
        let same = at("127.0.0.1:8082").address(listen, &none, false);
        assert!(same.unwrap_err().0.contains("one socket"));
        let everywhere: std::net::SocketAddr = "0.0.0.0:9082".parse().unwrap();
        let under = at("127.0.0.1:9082").address(everywhere, &none, false);
        assert!(
            under.unwrap_err().0.contains("one socket"),
            "0.0.0.0 has it too"
        );
        assert!(at("127.0.0.2:8082").address(listen, &none, false).is_ok());
        let public = at("0.0.0.0:9082").address(listen, &none, false);
        assert!(public.unwrap_err().0.contains("--auth-file"));
        let users = AuthSettings {
            auth_file: Some("users".into()),
            ..AuthSettings::default()
        };
        assert!(at("0.0.0.0:9082").address(listen, &users, false).is_ok());
        assert_eq!(
            AdminListen::Off.address(listen, &none, false).unwrap(),
            None
        );
        assert_eq!(
            at("0.0.0.0:9082").address(listen, &none, true).unwrap(),
            None,
            "not started under inetd"
        );
    }
}
