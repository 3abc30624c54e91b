//! The client proxy's settings ([`ClientSettings`]): every default of
//! `rproxy client` is spelled in its `Default`, and
//! [`ClientSettings::to_config`] resolves them into the runtime
//! [`ClientConfig`] (reading the upstream password and trust roots).
//! [`ClientConfig::for_upstream`], which the demo and the tests start
//! from, comes from the same defaults.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderValue, Uri};
use ipnet::IpNet;
use serde::{Deserialize, Serialize};

use super::shared::saturating_usize;
use super::units::{self, Size};
use super::{AuthSettings, LimitSettings, Role, Settings, UsageError, via_name};
use crate::cache::CacheScope;
use crate::client_proxy::queue_wait::QueueWaitConfig;
use crate::client_proxy::{ClientConfig, TunnelConfig};
use crate::http::auth::basic_credentials;

/// The environment variable holding the upstream password.
pub const UPSTREAM_PASSWORD_ENV: &str = "RPROXY_UPSTREAM_PASSWORD";

/// How long before `idle-timeout` a request whose user agent waits on its
/// connection gives up waiting in the upstream's queue, so that the
/// upstream's answer still reaches it.
const HELD_WAIT_MARGIN: Duration = Duration::from_secs(10);

/// The settings of `rproxy client`, one field per flag (see its `--help`
/// for what each means).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "kebab-case")]
#[allow(missing_docs)]
pub struct ClientSettings {
    /// `role = "client"`, when the file says whom it is for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<Role>,
    pub listen: SocketAddr,
    pub upstream: String,
    pub cache: PathBuf,
    pub cache_size: Size,
    pub memory_cache: Size,
    pub transfer_memory: Size,
    pub max_spool_total: Size,
    pub private: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub via_name: Option<String>,
    pub signature_bytes: Size,
    pub max_signature: Size,
    pub max_object: Size,
    #[serde(with = "units::duration")]
    pub connect_timeout: Duration,
    #[serde(with = "units::duration")]
    pub upstream_timeout: Duration,
    #[serde(with = "units::duration")]
    pub lock_timeout: Duration,
    pub inetd: bool,
    pub allow_open: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub upstream_user: Option<String>,
    #[serde(with = "units::duration")]
    pub queue_wait_max: Duration,
    #[serde(with = "units::duration")]
    pub queue_page_after: Duration,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub queue_callback: Option<SocketAddr>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub queue_node: Option<SocketAddr>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub upstream_ca: Option<PathBuf>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub upstream_password_file: Option<PathBuf>,
    pub connect_ports: Vec<u16>,
    pub connect_allow_addresses: Vec<IpNet>,
    pub limits: LimitSettings,
    pub auth: AuthSettings,
}

impl Default for ClientSettings {
    fn default() -> Self {
        let queue = QueueWaitConfig::default();
        ClientSettings {
            role: None,
            listen: SocketAddr::from(([127, 0, 0, 1], 8082)),
            upstream: "http://127.0.0.1:8081".into(),
            cache: "cache/client".into(),
            cache_size: Size::gib(1),
            memory_cache: Size::mib(64),
            transfer_memory: Size(crate::http::transfer_memory::DEFAULT_CLIENT_MEMORY),
            max_spool_total: Size::gib(8),
            private: false,
            via_name: None,
            // 4608 bytes are 6 KiB of header.
            signature_bytes: Size(4608),
            max_signature: Size::kib(24),
            max_object: Size::gib(4),
            connect_timeout: Duration::from_secs(4),
            upstream_timeout: Duration::from_secs(30),
            lock_timeout: Duration::from_secs(5),
            inetd: false,
            allow_open: false,
            upstream_user: None,
            queue_wait_max: queue.wait_max,
            queue_page_after: queue.page_after,
            queue_callback: None,
            queue_node: None,
            upstream_ca: None,
            upstream_password_file: None,
            connect_ports: TunnelConfig::default().ports,
            connect_allow_addresses: Vec::new(),
            limits: LimitSettings::default(),
            auth: AuthSettings::default(),
        }
    }
}

impl Settings for ClientSettings {
    const ROLE: Role = Role::Client;

    fn file_role(&self) -> Option<Role> {
        self.role
    }
}

impl ClientSettings {
    /// The runtime config, for serving on `address` (the listen address,
    /// or under inetd the socket's own).
    ///
    /// # Errors
    /// A [`UsageError`] saying which key (flag) is wrong, or why the
    /// password file or trust roots cannot be read.
    pub fn to_config(&self, address: SocketAddr) -> Result<ClientConfig, UsageError> {
        if !address.ip().is_loopback() && !self.allow_open && self.auth.auth_file.is_none() {
            return Err(UsageError(format!(
                "{address}: not a loopback address, and nobody has to authenticate; \
                 give --auth-file (see rproxy passwd), or --allow-open to run an open proxy there"
            )));
        }
        let held_max = self.held_max();
        if self.queue_page_after >= held_max && self.queue_page_after < self.queue_wait_max {
            return Err(UsageError(format!(
                // Debug prints `60s`, `100ms`: seconds, as the flags
                // took them before units.
                "--queue-page-after {:?}: a navigation waiting that long is cut by \
                 --idle-timeout {:?} first (less {:?}); lower the one or raise the other",
                self.queue_page_after, self.limits.idle_timeout, HELD_WAIT_MARGIN
            )));
        }
        let upstream = self
            .upstream
            .parse()
            .map_err(|_| UsageError(format!("--upstream {}: not a URL", self.upstream)))?;
        let base = self.config_with(upstream, via_name(self.via_name.as_deref(), address)?);
        Ok(ClientConfig {
            upstream_credentials: self.upstream_credentials()?,
            upstream_tls: self.upstream_tls()?,
            queue: QueueWaitConfig {
                node: self.queue_node()?,
                ..base.queue
            },
            ..base
        })
    }

    /// The runtime config for `upstream`, named `via_name`, without
    /// credentials, TLS or QUEUE callbacks.
    fn config_with(&self, upstream: Uri, via_name: HeaderValue) -> ClientConfig {
        ClientConfig {
            upstream,
            via_name,
            scope: if self.private {
                CacheScope::Private
            } else {
                CacheScope::Shared
            },
            default_signature_bytes: saturating_usize(self.signature_bytes.min(self.max_signature)),
            max_signature_bytes: saturating_usize(self.max_signature),
            connect_timeout: self.connect_timeout,
            upstream_timeout: self.upstream_timeout,
            lock_timeout: self.lock_timeout,
            max_object_bytes: self.max_object.0,
            memory_cache_bytes: saturating_usize(self.memory_cache),
            upstream_credentials: None,
            upstream_tls: None,
            queue: QueueWaitConfig {
                wait_max: self.queue_wait_max,
                held_max: self.held_max(),
                page_after: self.queue_page_after,
                node: None,
            },
            transfer_memory: self.transfer_memory.0,
            max_spool_total: self.max_spool_total.0,
            tunnel: TunnelConfig {
                ports: self.connect_ports.clone(),
                allow_addresses: self.connect_allow_addresses.clone(),
                idle_timeout: self.limits.idle_timeout,
            },
        }
    }

    /// The longest wait in the upstream's queue while the user agent holds
    /// its connection: no byte moves on it meanwhile, so the idle timeout
    /// would close it.
    fn held_max(&self) -> Duration {
        self.limits
            .idle_timeout
            .saturating_sub(HELD_WAIT_MARGIN)
            .min(self.queue_wait_max)
    }

    /// Where the accelerator reaches our QUEUE callback listener. A port 0
    /// is filled in once the listener is bound.
    fn queue_node(&self) -> Result<Option<SocketAddr>, UsageError> {
        let Some(listen) = self.queue_callback else {
            if self.queue_node.is_some() {
                return Err(UsageError(
                    "--queue-node: needs --queue-callback, the listener it names".into(),
                ));
            }
            return Ok(None);
        };
        if self.inetd {
            return Err(UsageError(
                "--queue-callback needs the listener: each inetd process serves one connection"
                    .into(),
            ));
        }
        let node = self.queue_node.unwrap_or(listen);
        if node.ip().is_unspecified() {
            return Err(UsageError(format!(
                "--queue-callback {listen}: the accelerator cannot call back to {}; \
                 give --queue-node with the address it reaches us on",
                node.ip()
            )));
        }
        if self.queue_node.is_some() && node.port() == 0 {
            return Err(UsageError(format!("--queue-node {node}: needs a port")));
        }
        Ok(Some(node))
    }

    /// TLS for an https:// upstream.
    fn upstream_tls(&self) -> Result<Option<Arc<rustls::ClientConfig>>, UsageError> {
        if !self.upstream.starts_with("https://") {
            if self.upstream_ca.is_some() {
                return Err(UsageError(
                    "--upstream-ca: the upstream is not https://".into(),
                ));
            }
            return Ok(None);
        }
        crate::http::tls::client_config(self.upstream_ca.as_deref())
            .map(Some)
            .map_err(|e| UsageError(format!("--upstream-ca: {e}")))
    }

    /// `Proxy-Authorization` for the upstream, from `upstream-user` and
    /// the password file or environment.
    fn upstream_credentials(&self) -> Result<Option<HeaderValue>, UsageError> {
        let Some(user) = &self.upstream_user else {
            if self.upstream_password_file.is_some() {
                return Err(UsageError(
                    "--upstream-password-file: needs --upstream-user".into(),
                ));
            }
            return Ok(None);
        };
        if user.is_empty() || user.contains(':') {
            return Err(UsageError(format!(
                "--upstream-user {user:?}: a user name has no ':'"
            )));
        }
        let password = match &self.upstream_password_file {
            Some(path) => std::fs::read_to_string(path)
                .map_err(|e| {
                    UsageError(format!("--upstream-password-file {}: {e}", path.display()))
                })?
                .lines()
                .next()
                .unwrap_or_default()
                .to_owned(),
            None => std::env::var(UPSTREAM_PASSWORD_ENV).map_err(|_| {
                UsageError(format!(
                    "--upstream-user {user}: no password; give --upstream-password-file \
                     or set {UPSTREAM_PASSWORD_ENV}"
                ))
            })?,
        };
        Ok(Some(basic_credentials(user, &password)))
    }
}

impl ClientConfig {
    /// The settings `rproxy client` uses by default, in front of
    /// `upstream` and named `client` in Via.
    pub fn for_upstream(upstream: Uri) -> ClientConfig {
        ClientSettings::default().config_with(upstream, HeaderValue::from_static("client"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn for_upstream_is_the_default_settings() {
        let address = "127.0.0.1:8082".parse().unwrap();
        let resolved = ClientSettings::default().to_config(address).unwrap();
        let for_upstream = ClientConfig::for_upstream(resolved.upstream.clone());
        assert_eq!(
            format!("{resolved:?}"),
            format!("{for_upstream:?}").replace("\"client\"", "\"127.0.0.1:8082\"")
        );
        assert_eq!(
            format!("{:?}", for_upstream.queue),
            format!("{:?}", QueueWaitConfig::default())
        );
    }

    #[test]
    fn pairs_the_flags_require_are_required_in_a_file_too() {
        let address = "127.0.0.1:8082".parse().unwrap();
        for settings in [
            ClientSettings {
                queue_node: Some("192.0.2.7:1".parse().unwrap()),
                ..Default::default()
            },
            ClientSettings {
                upstream_password_file: Some("password".into()),
                ..Default::default()
            },
        ] {
            assert!(settings.to_config(address).is_err(), "{settings:?}");
        }
    }
}
