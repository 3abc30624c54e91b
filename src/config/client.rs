//! The client proxy's settings ([`ClientSettings`]): every default of
//! `rproxy client` is spelled in its `Default`, and
//! [`ClientSettings::to_config`] resolves them into the runtime
//! [`ClientConfig`] (reading the upstream password and trust roots).
//! [`ClientConfig::for_upstream`], which the demo and the tests start
//! from, comes from the same defaults.

use crate::client_proxy::targeted::TargetedCacheControl;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderValue, Uri};
use ipnet::IpNet;
use serde::{Deserialize, Serialize};

use super::shared::{LogSettings, health_policy, saturating_usize, server_url};
use super::units::{self, Size};
use super::{AdminListen, AuthSettings, LimitSettings, Role, Settings, UsageError, via_name};
use crate::cache::CacheScope;
use crate::cache::freshness::SetCookie;
use crate::client_proxy::queue_wait::QueueWaitConfig;
use crate::client_proxy::replica::{Prefetch, Subscription};
use crate::client_proxy::{ClientConfig, RouteConfig, RouteHosts, RouteTo, TunnelConfig};
use crate::http::address_policy::AddressPolicy;
use crate::http::auth::basic_credentials;
use crate::http::health::HealthPolicy;
use crate::http::host_pattern::HostPattern;

/// The environment variable holding the upstream password.
pub const UPSTREAM_PASSWORD_ENV: &str = "RPROXY_UPSTREAM_PASSWORD";

/// How long before `idle-timeout` a request whose user agent waits on its
/// connection gives up waiting in the upstream's queue, so that the
/// upstream's answer still reaches it.
const HELD_WAIT_MARGIN: Duration = Duration::from_secs(10);

/// The upstream `rproxy client` uses when neither `--upstream` nor a
/// `[[route]]` says.
pub const DEFAULT_UPSTREAM: &str = "http://127.0.0.1:8081";

/// One `[[route]]` table: the hosts it takes, and an upstream or direct.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct RouteSettings {
    /// Host names: `www.example.com`, `*.example.com`, `*`.
    pub hosts: Vec<String>,
    /// An accelerator, a parent, or another client proxy:
    /// `http://host[:port]` or `https://host[:port]`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upstream: Option<String>,
    /// To the URL's own host, as any forward proxy.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub direct: bool,
    /// Direct routes: non-public address ranges that may be connected to
    /// (loopback, link-local and private ones are refused otherwise), for
    /// `http://` fetches; a CONNECT tunnel's are `connect-allow-addresses`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow_addresses: Vec<IpNet>,
    /// Where the hosts go, in order, while `upstream` (or `direct`) is
    /// marked down or cannot be reached: upstream URLs, and `"direct"`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub fallback: Vec<String>,
}

/// A fallback to the URL's own host.
const DIRECT: &str = "direct";

/// One `[[subscribe]]` table: a zone replicated from its upstream's
/// change feed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct SubscribeSettings {
    /// `http://host[:port]/prefix/`.
    pub zone: String,
    /// Time between pulls.
    #[serde(default = "default_subscribe_interval", with = "units::duration")]
    pub interval: Duration,
    /// Bytes per second prefetches take on average (0: no cap).
    #[serde(default = "default_prefetch_rate")]
    pub rate: Size,
    /// `held` (the default): fetch the changed paths the cache holds;
    /// `all`: every changed path of the zone.
    #[serde(default)]
    pub prefetch: Prefetch,
}

/// How often a zone is pulled when its table does not say.
pub const DEFAULT_SUBSCRIBE_INTERVAL: Duration = Duration::from_secs(10);
/// What prefetches take when a zone's table does not say (1 MiB/s).
pub const DEFAULT_PREFETCH_RATE: Size = Size(1024 * 1024);

fn default_subscribe_interval() -> Duration {
    DEFAULT_SUBSCRIBE_INTERVAL
}

fn default_prefetch_rate() -> Size {
    DEFAULT_PREFETCH_RATE
}

impl SubscribeSettings {
    /// `zone` with the defaults.
    pub fn zone(zone: &str) -> SubscribeSettings {
        SubscribeSettings {
            zone: zone.to_owned(),
            interval: DEFAULT_SUBSCRIBE_INTERVAL,
            rate: DEFAULT_PREFETCH_RATE,
            prefetch: Prefetch::default(),
        }
    }

    /// The validated subscription; `index` names it in errors.
    fn to_subscription(&self, index: usize) -> Result<Subscription, UsageError> {
        let at = |what: String| UsageError(format!("subscribe {}: {what}", index + 1));
        let zone: Uri = self
            .zone
            .parse()
            .map_err(|e| at(format!("zone {}: {e}", self.zone)))?;
        if zone.scheme() != Some(&http::uri::Scheme::HTTP)
            || zone.authority().is_none()
            || zone.query().is_some()
            || !zone.path().starts_with('/')
        {
            return Err(at(format!(
                "zone {}: give http://host[:port]/path-prefix (the URLs the zone holds start with it)",
                self.zone
            )));
        }
        if self.interval.is_zero() {
            return Err(at("interval: give more than 0".into()));
        }
        Ok(Subscription {
            zone,
            interval: self.interval,
            rate: self.rate.0,
            prefetch: self.prefetch,
        })
    }
}

impl RouteSettings {
    /// The validated route; `index` names it in errors.
    fn to_config(&self, index: usize) -> Result<RouteConfig, UsageError> {
        let at = |what: String| UsageError(format!("route {}: {what}", index + 1));
        let hosts = self
            .hosts
            .iter()
            .map(|name| HostPattern::parse(name).map_err(|e| at(e.to_string())))
            .collect::<Result<Vec<_>, _>>()?;
        if hosts.is_empty() {
            return Err(at("hosts: give at least one host name".into()));
        }
        let direct = || RouteTo::Direct(AddressPolicy::new(self.allow_addresses.clone()));
        let to = match (&self.upstream, self.direct) {
            (Some(url), false) => RouteTo::Upstream(upstream_url(url).map_err(|e| at(e.0))?),
            (None, true) => direct(),
            _ => return Err(at("give upstream = \"URL\" or direct = true".into())),
        };
        let mut named: Vec<&str> = vec![self.upstream.as_deref().unwrap_or(DIRECT)];
        let mut fallback = Vec::with_capacity(self.fallback.len());
        for way in &self.fallback {
            if named
                .iter()
                .any(|earlier| earlier.eq_ignore_ascii_case(way))
            {
                return Err(at(format!("fallback: {way} is named twice")));
            }
            named.push(way);
            fallback.push(if way == DIRECT {
                direct()
            } else {
                RouteTo::Upstream(
                    upstream_url(way)
                        .map_err(|e| at(format!("fallback: {} or \"{DIRECT}\"", e.0)))?,
                )
            });
        }
        if !self.allow_addresses.is_empty() && !named.contains(&DIRECT) {
            return Err(at(
                "allow-addresses is for direct routes (or a direct fallback)".into(),
            ));
        }
        Ok(RouteConfig {
            hosts: RouteHosts::Listed(hosts),
            to,
            fallback,
        })
    }
}

/// `http[s]://host[:port]`, checked.
fn upstream_url(text: &str) -> Result<Uri, UsageError> {
    server_url("upstream", text, "")
}

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
    pub admin_listen: AdminListen,
    /// None: `DEFAULT_UPSTREAM`, unless `[[route]]` tables say.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub upstream: Option<String>,
    pub cache: PathBuf,
    pub cache_size: Size,
    pub memory_cache: Size,
    pub transfer_memory: Size,
    pub max_spool_total: Size,
    pub private: bool,
    pub store_set_cookie: bool,
    pub targeted_cache_control: TargetedCacheControl,
    pub no_downstream_coding: bool,
    /// Addresses (ranges) of user agents or proxies in front whose
    /// `Forwarded` and `X-Forwarded-*` are kept and appended to.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub trusted_forwarders: Vec<IpNet>,
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
    pub health_failures: u32,
    #[serde(with = "units::duration")]
    pub health_down_time: Duration,
    #[serde(with = "units::duration")]
    pub health_max_down_time: Duration,
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
    /// The logs (`[log]`).
    pub log: LogSettings,
    /// `[[route]]` tables, tried in order.
    #[serde(rename = "route", skip_serializing_if = "Vec::is_empty")]
    pub routes: Vec<RouteSettings>,
    /// `[[subscribe]]` tables: zones replicated from change feeds.
    #[serde(rename = "subscribe", skip_serializing_if = "Vec::is_empty")]
    pub subscriptions: Vec<SubscribeSettings>,
}

impl Default for ClientSettings {
    fn default() -> Self {
        let queue = QueueWaitConfig::default();
        let health = HealthPolicy::default();
        ClientSettings {
            role: None,
            listen: SocketAddr::from(([127, 0, 0, 1], 8082)),
            // Beside the proxy's 8082, as the accelerator's is beside 8081.
            admin_listen: AdminListen::On(SocketAddr::from(([127, 0, 0, 1], 9082))),
            upstream: None,
            cache: "cache/client".into(),
            cache_size: Size::gib(1),
            memory_cache: Size::mib(64),
            transfer_memory: Size(crate::http::transfer_memory::DEFAULT_CLIENT_MEMORY),
            max_spool_total: Size::gib(8),
            private: false,
            // A-6: a page that sets a cookie without `public` is often one
            // user's; the operator who knows the site's are not says so.
            store_set_cookie: false,
            targeted_cache_control: TargetedCacheControl::default(),
            no_downstream_coding: false,
            trusted_forwarders: Vec::new(),
            via_name: None,
            // 4608 bytes are 6 KiB of header.
            signature_bytes: Size(4608),
            max_signature: Size::kib(24),
            max_object: Size::gib(4),
            connect_timeout: Duration::from_secs(4),
            upstream_timeout: Duration::from_secs(30),
            lock_timeout: Duration::from_secs(5),
            health_failures: health.failures,
            health_down_time: health.down_time,
            health_max_down_time: health.max_down_time,
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
            log: LogSettings::default(),
            routes: Vec::new(),
            subscriptions: Vec::new(),
        }
    }
}

impl Settings for ClientSettings {
    const ROLE: Role = Role::Client;
    const RESTART_KEYS: &'static [&'static str] = &[
        "listen",
        "admin-listen",
        "inetd",
        "cache",
        "cache-size",
        "memory-cache",
        "transfer-memory",
        "max-spool-total",
        "lock-timeout",
        "queue-wait-max",
        "queue-page-after",
        "queue-callback",
        "queue-node",
        "subscribe",
        "limits.max-connections",
    ];

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
        self.admin_address()?;
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
        health_policy(
            self.health_failures,
            self.health_down_time,
            self.health_max_down_time,
        )?;
        let routes = self.route_configs()?;
        let base = self.config_with(routes, via_name(self.via_name.as_deref(), address)?);
        let subscriptions = self
            .subscriptions
            .iter()
            .enumerate()
            .map(|(index, table)| table.to_subscription(index))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(ClientConfig {
            subscriptions,
            upstream_credentials: self.upstream_credentials()?,
            upstream_tls: self.upstream_tls()?,
            queue: QueueWaitConfig {
                node: self.queue_node()?,
                ..base.queue
            },
            ..base
        })
    }

    /// Where the admin listener listens; `None` when it is off or under
    /// inetd.
    ///
    /// # Errors
    /// As [`AdminListen::address`].
    pub fn admin_address(&self) -> Result<Option<SocketAddr>, UsageError> {
        self.admin_listen
            .address(self.listen, &self.auth, self.inetd)
    }

    /// The routes: the `[[route]]` tables, or the one `--upstream` names.
    fn route_configs(&self) -> Result<Vec<RouteConfig>, UsageError> {
        match (&self.upstream, self.routes.is_empty()) {
            (Some(_), false) => Err(UsageError(
                "--upstream and [[route]] tables: give one or the other".into(),
            )),
            (upstream, true) => {
                let url = upstream_url(upstream.as_deref().unwrap_or(DEFAULT_UPSTREAM))
                    .map_err(|e| UsageError(format!("--{}", e.0)))?;
                Ok(vec![RouteConfig::upstream(url)])
            }
            (None, false) => self
                .routes
                .iter()
                .enumerate()
                .map(|(index, route)| route.to_config(index))
                .collect(),
        }
    }

    /// The routes in one line, for the log: `hosts -> upstream; ...`.
    pub fn describe_routes(&self) -> String {
        if self.routes.is_empty() {
            return format!(
                "* -> {}",
                self.upstream.as_deref().unwrap_or(DEFAULT_UPSTREAM)
            );
        }
        self.routes
            .iter()
            .map(|route| {
                let to = std::iter::once(route.upstream.as_deref().unwrap_or(DIRECT))
                    .chain(route.fallback.iter().map(String::as_str))
                    .collect::<Vec<_>>()
                    .join(", then ");
                format!("{} -> {to}", route.hosts.join(" "))
            })
            .collect::<Vec<_>>()
            .join("; ")
    }

    /// The upstream URLs the routes name.
    fn upstream_urls(&self) -> Vec<&str> {
        if self.routes.is_empty() {
            return vec![self.upstream.as_deref().unwrap_or(DEFAULT_UPSTREAM)];
        }
        self.routes
            .iter()
            .flat_map(|route| route.upstream.iter().chain(&route.fallback))
            .map(String::as_str)
            .filter(|url| *url != DIRECT)
            .collect()
    }

    /// The runtime config for `routes`, named `via_name`, without
    /// credentials, TLS or QUEUE callbacks.
    fn config_with(&self, routes: Vec<RouteConfig>, via_name: HeaderValue) -> ClientConfig {
        ClientConfig {
            upstream_dial: None,
            trusted_forwarders: self.trusted_forwarders.clone(),
            downstream_coding: (!self.no_downstream_coding)
                .then(super::accelerator::default_coding),
            routes,
            via_name,
            targeted_cache_control: self.targeted_cache_control,
            set_cookie: if self.store_set_cookie {
                SetCookie::Stored
            } else {
                SetCookie::OnlyIfPublic
            },
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
            // Checked in `to_config` (the defaults pass).
            health: HealthPolicy {
                failures: self.health_failures,
                down_time: self.health_down_time,
                max_down_time: self.health_max_down_time,
            },
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
            subscriptions: Vec::new(),
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
        if !self.upstream_urls().iter().any(|url| {
            url.get(..8)
                .is_some_and(|scheme| scheme.eq_ignore_ascii_case("https://"))
        }) {
            if self.upstream_ca.is_some() {
                return Err(UsageError("--upstream-ca: no upstream is https://".into()));
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
        ClientSettings::default().config_with(
            vec![RouteConfig::upstream(upstream)],
            HeaderValue::from_static("client"),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn for_upstream_is_the_default_settings() {
        let address = "127.0.0.1:8082".parse().unwrap();
        let resolved = ClientSettings::default().to_config(address).unwrap();
        let for_upstream = ClientConfig::for_upstream(DEFAULT_UPSTREAM.parse().unwrap());
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

    #[test]
    fn routes_come_from_the_file_and_print_back() {
        let text = r#"
[[route]]
hosts = ["*.example.com", "example.org"]
upstream = "http://accel.example.com"
fallback = ["http://accel2.example.com", "direct"]
allow-addresses = ["10.0.0.0/8"]

[[route]]
hosts = ["*"]
direct = true
allow-addresses = ["10.0.0.0/8"]
"#;
        let settings: ClientSettings = toml::from_str(text).unwrap();
        let config = settings.to_config(settings.listen).unwrap();
        assert_eq!(config.routes.len(), 2);
        assert!(
            matches!(&config.routes[0].to, RouteTo::Upstream(url) if url.host() == Some("accel.example.com"))
        );
        assert!(matches!(
            &config.routes[0].fallback[..],
            [RouteTo::Upstream(url), RouteTo::Direct(policy)]
                if url.host() == Some("accel2.example.com")
                    && policy.permits("10.1.2.3".parse().unwrap())
        ));
        assert!(config.routes[1].fallback.is_empty());
        assert_eq!(
            settings.describe_routes(),
            "*.example.com example.org -> http://accel.example.com, then \
             http://accel2.example.com, then direct; * -> direct"
        );
        let RouteTo::Direct(policy) = &config.routes[1].to else {
            panic!("route 2 is direct");
        };
        assert!(policy.permits("10.1.2.3".parse().unwrap()));
        assert!(!policy.permits("127.0.0.1".parse().unwrap()));
        let printed = super::super::to_toml(&settings);
        let reread: ClientSettings = toml::from_str(&printed).unwrap();
        assert_eq!(reread, settings, "{printed}");
    }

    #[test]
    fn bad_routes_are_refused_with_their_number() {
        for (text, expected) in [
            ("[[route]]\nhosts = []\ndirect = true", "route 1: hosts"),
            ("[[route]]\nhosts = [\"*\"]", "route 1: give upstream"),
            (
                "[[route]]\nhosts = [\"*\"]\ndirect = true\nupstream = \"http://a\"",
                "route 1: give upstream",
            ),
            (
                "[[route]]\nhosts = [\"*\"]\nupstream = \"ftp://a\"",
                "route 1: upstream ftp://a",
            ),
            (
                "[[route]]\nhosts = [\"*\"]\nupstream = \"http://a\"\nallow-addresses = [\"10.0.0.0/8\"]",
                "for direct routes",
            ),
            (
                "[[route]]\nhosts = [\"*\"]\nupstream = \"http://a\"\nfallback = [\"a.example\"]",
                "route 1: fallback: upstream a.example: use http",
            ),
            (
                "[[route]]\nhosts = [\"*\"]\nupstream = \"http://a\"\nfallback = [\"http://b\", \"http://a\"]",
                "route 1: fallback: http://a is named twice",
            ),
            (
                "[[route]]\nhosts = [\"*\"]\ndirect = true\nfallback = [\"direct\"]",
                "route 1: fallback: direct is named twice",
            ),
            (
                "health-down-time = \"5m\"",
                "--health-max-down-time 60s is shorter",
            ),
            (
                "upstream = \"http://a\"\n[[route]]\nhosts = [\"*\"]\ndirect = true",
                "one or the other",
            ),
        ] {
            let settings: ClientSettings = toml::from_str(text).unwrap();
            let error = settings.to_config(settings.listen).unwrap_err();
            assert!(error.0.contains(expected), "{text}: {error}");
        }
    }

    #[test]
    fn an_upper_case_https_upstream_gets_tls() {
        let dir = tempfile::tempdir().unwrap();
        let made = rcgen::generate_simple_self_signed(vec!["accel.example".to_owned()]).unwrap();
        let ca = dir.path().join("ca.pem");
        std::fs::write(&ca, made.cert.pem()).unwrap();
        let settings = ClientSettings {
            upstream: Some("HTTPS://accel.example".into()),
            upstream_ca: Some(ca),
            ..Default::default()
        };
        let config = settings.to_config(settings.listen).unwrap();
        assert!(config.upstream_tls.is_some());
    }
}
