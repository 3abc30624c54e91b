//! The accelerator's settings ([`AcceleratorSettings`]): every default of
//! `rproxy accelerator` is spelled in its `Default`, and
//! [`AcceleratorSettings::to_config`] resolves them into the runtime
//! [`AcceleratorConfig`]. [`AcceleratorConfig::for_origin`], which the
//! demo and the tests start from, comes from the same defaults.

use std::net::SocketAddr;
use std::num::NonZeroU32;
use std::path::{Path, PathBuf};
use std::time::Duration;

use http::uri::PathAndQuery;
use http::{HeaderValue, Uri};
use ipnet::IpNet;
use serde::{Deserialize, Serialize};

use super::shared::{LogSettings, health_policy, saturating_usize, server_url};
use super::units::{self, Size};
use super::{AdminListen, AuthSettings, LimitSettings, Role, Settings, UsageError, via_name};
use crate::accelerator::basis_store::{DiskTier, SharedTier};
use crate::accelerator::{
    AcceleratorConfig, CoderConfig, FeedConfig, ParentPolicy, SiteConfig, SiteNames, SiteOrigin,
};
use crate::feed::Retention as FeedRetention;
use crate::hsync::EncoderOptions;
use crate::http::address_policy::AddressPolicy;
use crate::http::health::HealthPolicy;
use crate::http::host_pattern::HostPattern;
use crate::queue::QueueConfig;

/// What `--level` takes: zstd's strong levels.
pub(crate) const LEVELS: std::ops::RangeInclusive<i32> = 1..=19;
/// What `--bulk-level` takes: zstd's fast levels too.
pub(crate) const BULK_LEVELS: std::ops::RangeInclusive<i32> = -7..=19;

/// The `basis-dir` that turns the basis store's disk tier off.
const BASIS_DIR_OFF: &str = "off";

/// The basis store's directory inside the spool directory, by default.
pub const DEFAULT_BASIS_DIR: &str = "rproxy-basis";

/// The origin `rproxy accelerator` fronts when neither `--origin` nor a
/// `[[site]]` says.
pub const DEFAULT_ORIGIN: &str = "http://127.0.0.1:8080";

/// One `[[site]]` table: the names it answers to and its origin.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct SiteSettings {
    /// Host names: `www.example.com`, `*.example.com`, `*`.
    pub names: Vec<String>,
    /// `http://host[:port]`, `https://host[:port]`, or `any` (parent mode:
    /// the URL's own host, within `allow-hosts`, `allow-ports` and
    /// `allow-addresses`).
    pub origin: String,
    /// PEM file of the CAs trusted for `https://` origins instead of the
    /// system's roots.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub origin_ca: Option<PathBuf>,
    /// Parent mode: the hosts that may be fetched (or tunnelled to).
    #[serde(default = "any_host")]
    pub allow_hosts: Vec<String>,
    /// Parent mode: the ports that may be fetched, or tunnelled to by
    /// CONNECT.
    #[serde(default = "web_ports")]
    pub allow_ports: Vec<u16>,
    /// Parent mode: non-public address ranges that may be connected to
    /// (loopback, link-local and private ones are refused otherwise).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow_addresses: Vec<IpNet>,
    /// A path on the origin checked every `health-interval` (a 2xx or 3xx
    /// answer: up); not for a parent-mode site.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health_path: Option<String>,
}

fn any_host() -> Vec<String> {
    vec!["*".into()]
}

fn web_ports() -> Vec<u16> {
    vec![80, 443]
}

/// The `origin` of a parent-mode site.
const PARENT: &str = "any";

impl SiteSettings {
    /// The validated site; `index` names it in errors.
    fn to_config(&self, index: usize) -> Result<SiteConfig, UsageError> {
        let at = |what: String| UsageError(format!("site {}: {what}", index + 1));
        let patterns = |list: &[String]| {
            list.iter()
                .map(|name| HostPattern::parse(name).map_err(|e| at(e.to_string())))
                .collect::<Result<Vec<_>, _>>()
        };
        let names = patterns(&self.names)?;
        if names.is_empty() {
            return Err(at("names: give at least one host name".into()));
        }
        let origin = if self.origin == PARENT {
            if self.health_path.is_some() {
                return Err(at(format!(
                    "health-path: a parent-mode site (origin = \"{PARENT}\") is not \
                     health-checked: its hosts are whoever the URLs name"
                )));
            }
            SiteOrigin::Parent(ParentPolicy {
                hosts: patterns(&self.allow_hosts)?,
                ports: self.allow_ports.clone(),
                addresses: AddressPolicy::new(self.allow_addresses.clone()),
                ca_file: self.origin_ca.clone(),
            })
        } else {
            SiteOrigin::Server {
                url: origin_url(&self.origin).map_err(|e| at(e.0))?,
                ca_file: self.origin_ca.clone(),
                health_path: self
                    .health_path
                    .as_deref()
                    .map(health_path)
                    .transpose()
                    .map_err(|e| at(e.0))?,
            }
        };
        Ok(SiteConfig {
            names: SiteNames::Listed(names),
            origin,
        })
    }
}

/// A `basis-redis` URL Redis's client takes: `redis://[user:password@]host[:port][/db]`
/// or `redis+unix:///path`. The password is never repeated in the error.
fn check_redis_url(url: &str) -> Result<(), UsageError> {
    let shown = SharedTier {
        url: url.into(),
        timeout: Duration::ZERO,
        max_body: 0,
    }
    .redacted_url();
    if !(url.starts_with("redis://") || url.starts_with("redis+unix://")) {
        return Err(UsageError(format!(
            "--basis-redis {shown}: use redis://host[:port][/db] or redis+unix:///path"
        )));
    }
    redis::Client::open(url)
        .map(drop)
        .map_err(|e| UsageError(format!("--basis-redis {shown}: {e}")))
}

/// `http[s]://host[:port]`, checked.
fn origin_url(text: &str) -> Result<Uri, UsageError> {
    server_url("origin", text, &format!(" or \"{PARENT}\""))
}

/// A `health-path`: a path (and query) on the origin.
fn health_path(text: &str) -> Result<PathAndQuery, UsageError> {
    text.parse::<PathAndQuery>()
        .ok()
        .filter(|path| path.as_str().starts_with('/'))
        .ok_or_else(|| {
            UsageError(format!(
                "health-path {text:?}: use a path, such as /healthz"
            ))
        })
}

/// The settings of `rproxy accelerator`, one field per flag (see its
/// `--help` for what each means).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "kebab-case")]
#[allow(missing_docs)]
pub struct AcceleratorSettings {
    /// `role = "accelerator"`, when the file says whom it is for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<Role>,
    pub listen: SocketAddr,
    pub admin_listen: AdminListen,
    /// None: `DEFAULT_ORIGIN`, unless `[[site]]` tables say.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub origin: Option<String>,
    /// Addresses (ranges) of previous hops whose `Forwarded` and
    /// `X-Forwarded-*` are kept and appended to.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub trusted_forwarders: Vec<IpNet>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub via_name: Option<String>,
    pub max_encode_len: Size,
    pub level: i32,
    pub bulk_level: i32,
    pub no_adapt: bool,
    pub max_signature: Size,
    pub max_body_signature: Size,
    pub max_encoders: usize,
    /// None: the system's temp directory.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub spool_dir: Option<PathBuf>,
    pub max_spool: Size,
    pub max_spool_total: Size,
    pub transfer_memory: Size,
    #[serde(with = "units::duration")]
    pub connect_timeout: Duration,
    #[serde(with = "units::duration")]
    pub origin_timeout: Duration,
    /// The `origin` shorthand's; a `[[site]]` names its own.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub health_path: Option<String>,
    #[serde(with = "units::duration")]
    pub health_interval: Duration,
    pub health_failures: u32,
    #[serde(with = "units::duration")]
    pub health_down_time: Duration,
    #[serde(with = "units::duration")]
    pub health_max_down_time: Duration,
    pub basis_store: Size,
    pub max_stored_body: Size,
    /// None: `rproxy-basis` in the spool directory; "off": no disk tier.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub basis_dir: Option<PathBuf>,
    pub basis_disk: Size,
    pub max_disk_body: Size,
    /// None: no shared store.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub basis_redis: Option<String>,
    #[serde(with = "units::duration")]
    pub basis_redis_timeout: Duration,
    pub max_redis_body: Size,
    pub basis_store_private: bool,
    pub inetd: bool,
    pub slots: u32,
    pub queue_max: u32,
    /// None: a quarter of `queue_max`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub queue_per_address: Option<u32>,
    #[serde(with = "units::duration")]
    pub queue_hold_grace: Duration,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub queue_state: Option<PathBuf>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub feed_state: Option<PathBuf>,
    #[serde(with = "units::duration")]
    pub feed_retain: Duration,
    pub feed_max_entries: usize,
    /// `DIR=URL`: document roots whose changed files are submitted.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub feed_watch: Vec<String>,
    #[serde(with = "units::duration")]
    pub feed_watch_interval: Duration,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls_cert: Option<PathBuf>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls_key: Option<PathBuf>,
    pub limits: LimitSettings,
    pub auth: AuthSettings,
    /// The logs (`[log]`).
    pub log: LogSettings,
    /// `[[site]]` tables, tried in order.
    #[serde(rename = "site", skip_serializing_if = "Vec::is_empty")]
    pub sites: Vec<SiteSettings>,
}

impl Default for AcceleratorSettings {
    fn default() -> Self {
        let encoder = EncoderOptions::default();
        let health = HealthPolicy::default();
        AcceleratorSettings {
            role: None,
            listen: SocketAddr::from(([127, 0, 0, 1], 8081)),
            // Beside the proxy's 8081, as the client proxy's is beside 8082.
            admin_listen: AdminListen::On(SocketAddr::from(([127, 0, 0, 1], 9081))),
            origin: None,
            trusted_forwarders: Vec::new(),
            via_name: None,
            max_encode_len: Size::gib(1),
            level: encoder.zstd_level,
            bulk_level: encoder.fast_zstd_level,
            no_adapt: false,
            max_signature: Size::kib(24),
            // 1 GiB of basis at 1.5 KiB blocks (the client proxy's choice).
            max_body_signature: Size::mib(8),
            max_encoders: 0,
            spool_dir: None,
            max_spool: Size::gib(1),
            max_spool_total: Size::gib(8),
            transfer_memory: Size(crate::http::transfer_memory::DEFAULT_ACCELERATOR_MEMORY),
            connect_timeout: Duration::from_secs(4),
            origin_timeout: Duration::from_secs(30),
            health_path: None,
            health_interval: Duration::from_secs(10),
            health_failures: health.failures,
            health_down_time: health.down_time,
            health_max_down_time: health.max_down_time,
            basis_store: Size::mib(256),
            max_stored_body: Size::mib(8),
            basis_dir: None,
            basis_disk: Size::gib(4),
            // Not larger: coding against a held body of more than about
            // 190 MiB is worse than rsync today (its windows outgrow the
            // basis text each one sees; scripts/README.md#bench-bigsh).
            max_disk_body: Size::mib(128),
            basis_redis: None,
            basis_redis_timeout: Duration::from_millis(50),
            max_redis_body: Size::mib(16),
            basis_store_private: false,
            inetd: false,
            slots: 0,
            queue_max: 1000,
            queue_per_address: None,
            queue_hold_grace: Duration::from_secs(10),
            queue_state: None,
            feed_state: None,
            feed_retain: FeedRetention::default().max_age,
            feed_max_entries: FeedRetention::default().max_entries,
            feed_watch: Vec::new(),
            feed_watch_interval: Duration::from_secs(2),
            tls_cert: None,
            tls_key: None,
            limits: LimitSettings::default(),
            auth: AuthSettings::default(),
            log: LogSettings::default(),
            sites: Vec::new(),
        }
    }
}

impl Settings for AcceleratorSettings {
    const ROLE: Role = Role::Accelerator;
    const RESTART_KEYS: &'static [&'static str] = &[
        "listen",
        "admin-listen",
        "inetd",
        "max-encoders",
        "max-spool-total",
        "transfer-memory",
        "basis-store",
        "max-stored-body",
        "basis-dir",
        "basis-disk",
        "max-disk-body",
        "basis-redis",
        "basis-redis-timeout",
        "max-redis-body",
        "slots",
        "queue-max",
        "queue-per-address",
        "queue-hold-grace",
        "queue-state",
        "feed-state",
        "feed-retain",
        "feed-max-entries",
        "feed-watch",
        "feed-watch-interval",
        "limits.max-connections",
    ];

    fn file_role(&self) -> Option<Role> {
        self.role
    }
}

impl AcceleratorSettings {
    /// The runtime config, for an accelerator listening on `address` (the
    /// listen address, or under inetd the socket's own: it names us in Via
    /// unless `via-name` does).
    ///
    /// # Errors
    /// A [`UsageError`] naming the key (flag) at fault.
    pub fn to_config(&self, address: SocketAddr) -> Result<AcceleratorConfig, UsageError> {
        let sites = self.site_configs()?;
        self.admin_address()?;
        if sites
            .iter()
            .any(|site| matches!(site.origin, SiteOrigin::Parent(_)))
            && !address.ip().is_loopback()
            && self.auth.auth_file.is_none()
        {
            return Err(UsageError(format!(
                "a parent-mode site (origin = \"{PARENT}\") fetches for whoever reaches {address}: \
                 give an auth-file, or listen on loopback"
            )));
        }
        if !LEVELS.contains(&self.level) {
            return Err(UsageError(format!(
                "--level {}: use {} to {}",
                self.level,
                LEVELS.start(),
                LEVELS.end()
            )));
        }
        if !BULK_LEVELS.contains(&self.bulk_level) {
            return Err(UsageError(format!(
                "--bulk-level {}: use {} to {}",
                self.bulk_level,
                BULK_LEVELS.start(),
                BULK_LEVELS.end()
            )));
        }
        if self.tls_cert.is_some() != self.tls_key.is_some() {
            return Err(UsageError(
                "--tls-cert and --tls-key: give both or neither".into(),
            ));
        }
        if self.health_interval.is_zero() {
            return Err(UsageError(
                "--health-interval 0: give a time between checks, such as 10s".into(),
            ));
        }
        health_policy(
            self.health_failures,
            self.health_down_time,
            self.health_max_down_time,
        )?;
        if let Some(url) = &self.basis_redis {
            check_redis_url(url)?;
            if self.basis_redis_timeout.is_zero() {
                return Err(UsageError(
                    "--basis-redis-timeout 0: give the time a lookup may take, such as 50ms".into(),
                ));
            }
        }
        let watches = self.feed_watches()?;
        let via_name = via_name(self.via_name.as_deref(), address)?;
        let mut config = self.config_with(sites, via_name);
        if let Some(feed) = &mut config.feed {
            feed.watches = watches;
        }
        Ok(config)
    }

    /// The document roots `feed-watch` names, checked.
    fn feed_watches(&self) -> Result<Vec<(PathBuf, String)>, UsageError> {
        if self.feed_watch.is_empty() {
            return Ok(Vec::new());
        }
        if self.feed_state.is_none() {
            return Err(UsageError(
                "--feed-watch needs --feed-state (the change feed's directory)".into(),
            ));
        }
        if self.feed_watch_interval.is_zero() {
            return Err(UsageError(
                "--feed-watch-interval 0: give the time between walks, such as 2s".into(),
            ));
        }
        self.feed_watch
            .iter()
            .map(|watch| {
                let bad = |why: &str| {
                    UsageError(format!(
                        "--feed-watch {watch}: {why}; give DIR=URL, such as /var/www/html=http://www.example.com/"
                    ))
                };
                let (dir, url) = watch.split_once('=').ok_or_else(|| bad("no ="))?;
                let uri: Uri = url.parse().map_err(|_| bad("the URL does not parse"))?;
                if uri.scheme().is_none() || uri.authority().is_none() || !uri.path().ends_with('/') {
                    return Err(bad("the URL must be absolute and end with /"));
                }
                if !Path::new(dir).is_dir() {
                    return Err(bad("not a directory"));
                }
                Ok((PathBuf::from(dir), url.to_owned()))
            })
            .collect()
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

    /// The sites: the `[[site]]` tables, or the one `--origin` names.
    fn site_configs(&self) -> Result<Vec<SiteConfig>, UsageError> {
        match (&self.origin, self.sites.is_empty()) {
            (Some(_), false) => Err(UsageError(
                "--origin and [[site]] tables: give one or the other".into(),
            )),
            (None, false) if self.health_path.is_some() => Err(UsageError(
                "--health-path is the origin shorthand's: give health-path in each [[site]]".into(),
            )),
            (origin, true) => {
                let url = origin_url(origin.as_deref().unwrap_or(DEFAULT_ORIGIN))
                    .map_err(|e| UsageError(format!("--{}", e.0)))?;
                let path = self
                    .health_path
                    .as_deref()
                    .map(health_path)
                    .transpose()
                    .map_err(|e| UsageError(format!("--{}", e.0)))?;
                Ok(vec![SiteConfig {
                    names: SiteNames::AnyHost,
                    origin: SiteOrigin::Server {
                        url,
                        ca_file: None,
                        health_path: path,
                    },
                }])
            }
            (None, false) => self
                .sites
                .iter()
                .enumerate()
                .map(|(index, site)| site.to_config(index))
                .collect(),
        }
    }

    /// The sites in one line, for the log: `names -> origin; ...`.
    pub fn describe_sites(&self) -> String {
        if self.sites.is_empty() {
            return format!("* -> {}", self.origin.as_deref().unwrap_or(DEFAULT_ORIGIN));
        }
        self.sites
            .iter()
            .map(|site| format!("{} -> {}", site.names.join(" "), site.origin))
            .collect::<Vec<_>>()
            .join("; ")
    }

    /// The runtime config for `sites`, named `via_name`, with nothing
    /// left to check.
    fn config_with(&self, sites: Vec<SiteConfig>, via_name: HeaderValue) -> AcceleratorConfig {
        AcceleratorConfig {
            sites,
            trusted_forwarders: self.trusted_forwarders.clone(),
            via_name,
            encoder: self.encoder_options(),
            adapt_entropy_coding: !self.no_adapt,
            max_encode_len: self.max_encode_len.0,
            max_signature_bytes: saturating_usize(self.max_signature),
            max_body_signature_bytes: saturating_usize(self.max_body_signature),
            connect_timeout: self.connect_timeout,
            origin_timeout: self.origin_timeout,
            // Checked in `to_config` (the defaults pass).
            health: HealthPolicy {
                failures: self.health_failures,
                down_time: self.health_down_time,
                max_down_time: self.health_max_down_time,
            },
            health_interval: self.health_interval,
            tunnel_idle_timeout: self.limits.idle_timeout,
            basis_store_bytes: saturating_usize(self.basis_store),
            max_stored_body: saturating_usize(self.max_stored_body),
            basis_disk: self.basis_disk_tier(),
            basis_shared: self.basis_redis.as_ref().map(|url| SharedTier {
                url: url.clone(),
                timeout: self.basis_redis_timeout,
                max_body: self.max_redis_body.0,
            }),
            basis_store_private: self.basis_store_private,
            queue: NonZeroU32::new(self.slots).map(|slots| {
                let mut queue = QueueConfig::new(slots, self.queue_max);
                if let Some(per_address) = self.queue_per_address {
                    queue.per_address_max = per_address;
                }
                queue.slot_hold_grace = self.queue_hold_grace;
                queue
            }),
            queue_state: self.queue_state.clone(),
            feed: self.feed_state.clone().map(|dir| FeedConfig {
                dir,
                watches: Vec::new(),
                watch_interval: self.feed_watch_interval,
                retention: FeedRetention {
                    max_age: self.feed_retain,
                    max_entries: self.feed_max_entries.max(1),
                },
            }),
            max_encoders: self.max_encoders,
            spool_dir: self.spool_dir(),
            max_spool: self.max_spool.0,
            max_spool_total: self.max_spool_total.0,
            transfer_memory: self.transfer_memory.0,
        }
    }

    /// The spool directory: `spool-dir`, or the system's temp directory.
    fn spool_dir(&self) -> PathBuf {
        self.spool_dir.clone().unwrap_or_else(std::env::temp_dir)
    }

    /// The basis store's disk tier: `basis-dir` (by default
    /// `rproxy-basis` in the spool directory), unless it is "off" or
    /// either of its sizes is 0.
    fn basis_disk_tier(&self) -> Option<DiskTier> {
        let dir = match &self.basis_dir {
            Some(dir) if dir.as_os_str() == BASIS_DIR_OFF => return None,
            Some(dir) => dir.clone(),
            // A process per connection would hold the directory's lock
            // in turn, the others logging that they cannot: none by
            // default (their memory tier dies with them too).
            None if self.inetd => return None,
            None => self.spool_dir().join(DEFAULT_BASIS_DIR),
        };
        (self.basis_disk.0 > 0 && self.max_disk_body.0 > 0).then_some(DiskTier {
            dir,
            budget: self.basis_disk.0,
            max_body: self.max_disk_body.0,
        })
    }

    /// The encoder's settings: the codec's defaults, with `level` and
    /// `bulk-level`.
    pub fn encoder_options(&self) -> EncoderOptions {
        let defaults = EncoderOptions::default();
        EncoderOptions {
            zstd_level: self.level,
            fast_zstd_level: self.bulk_level,
            entropy_zstd_level: defaults.entropy_zstd_level.min(self.bulk_level),
            ..defaults
        }
    }
}

/// How `rproxy accelerator` codes answers by default: what a client proxy
/// codes its answers to downstream client proxies with (within the client
/// proxy's own transfer memory and spool disk, parking in its cache).
/// Its basis store is smaller: a client proxy's chain coder keeps only
/// what it coded for the few proxies behind it.
pub fn default_coding() -> CoderConfig {
    let config = AcceleratorSettings::default()
        .config_with(Vec::new(), HeaderValue::from_static("accelerator"));
    CoderConfig {
        basis_store_bytes: 32 << 20,
        basis_disk: None,
        basis_shared: None,
        // A client proxy reads no request body as a signature.
        max_body_signature_bytes: 0,
        ..CoderConfig::from(&config)
    }
}

impl AcceleratorConfig {
    /// The settings `rproxy accelerator` uses by default, in front of
    /// `origin` and named `accelerator` in Via.
    pub fn for_origin(origin: Uri) -> AcceleratorConfig {
        AcceleratorSettings::default().config_with(
            vec![SiteConfig::any_host(origin)],
            HeaderValue::from_static("accelerator"),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn for_origin_is_the_default_settings() {
        let address = "127.0.0.1:8081".parse().unwrap();
        let resolved = AcceleratorSettings::default().to_config(address).unwrap();
        let for_origin = AcceleratorConfig::for_origin(DEFAULT_ORIGIN.parse().unwrap());
        assert_eq!(
            format!("{resolved:?}"),
            format!("{for_origin:?}").replace("\"accelerator\"", "\"127.0.0.1:8081\"")
        );
    }

    #[test]
    fn levels_from_a_file_are_checked_as_the_flags_are() {
        let address = "127.0.0.1:8081".parse().unwrap();
        for settings in [
            AcceleratorSettings {
                level: 0,
                ..Default::default()
            },
            AcceleratorSettings {
                bulk_level: 20,
                ..Default::default()
            },
            AcceleratorSettings {
                tls_key: Some("key.pem".into()),
                ..Default::default()
            },
        ] {
            assert!(settings.to_config(address).is_err(), "{settings:?}");
        }
    }

    const SITES: &str = r#"
listen = "0.0.0.0:8081"
trusted-forwarders = ["10.0.0.0/8"]

[auth]
auth-file = "/etc/rproxy/users"

[[site]]
names = ["www.example.com", "*.static.example.com"]
origin = "http://127.0.0.1:8080"
health-path = "/healthz?deep=1"

[[site]]
names = ["*"]
origin = "any"
allow-hosts = ["*.debian.org"]
allow-addresses = ["192.168.0.0/16"]
"#;

    #[test]
    fn sites_come_from_the_file_and_print_back() {
        let settings: AcceleratorSettings = toml::from_str(SITES).unwrap();
        let config = settings.to_config(settings.listen).unwrap();
        assert_eq!(config.sites.len(), 2);
        assert!(matches!(&config.sites[0].names, SiteNames::Listed(names) if names.len() == 2));
        assert!(matches!(
            &config.sites[0].origin,
            SiteOrigin::Server { health_path: Some(path), .. } if path == "/healthz?deep=1"
        ));
        let SiteOrigin::Parent(parent) = &config.sites[1].origin else {
            panic!("site 2 is a parent");
        };
        assert_eq!(parent.ports, [80, 443]);
        assert!(parent.addresses.permits("192.168.1.1".parse().unwrap()));
        assert!(!parent.addresses.permits("10.0.0.1".parse().unwrap()));
        assert_eq!(config.trusted_forwarders.len(), 1);
        // What `rproxy check` prints reads back as the same settings.
        let printed = super::super::to_toml(&settings);
        let reread: AcceleratorSettings = toml::from_str(&printed).unwrap();
        assert_eq!(reread, settings, "{printed}");
    }

    #[test]
    fn the_shorthand_takes_a_health_path_and_the_health_times_are_checked() {
        let address = "127.0.0.1:8081".parse().unwrap();
        let settings: AcceleratorSettings =
            toml::from_str("health-path = \"/up\"\nhealth-interval = \"500ms\"").unwrap();
        let config = settings.to_config(address).unwrap();
        assert!(matches!(
            &config.sites[0],
            SiteConfig {
                names: SiteNames::AnyHost,
                origin: SiteOrigin::Server { health_path: Some(path), .. },
            } if path == "/up"
        ));
        assert_eq!(config.health_interval, Duration::from_millis(500));
        assert_eq!(config.health, HealthPolicy::default());
        for (text, expected) in [
            ("health-interval = 0", "--health-interval 0"),
            ("health-down-time = 0", "--health-down-time 0"),
            (
                "health-down-time = \"2m\"",
                "--health-max-down-time 60s is shorter",
            ),
        ] {
            let settings: AcceleratorSettings = toml::from_str(text).unwrap();
            let error = settings.to_config(address).unwrap_err();
            assert!(error.0.contains(expected), "{text}: {error}");
        }
        let never: AcceleratorSettings =
            toml::from_str("health-failures = 0\nhealth-down-time = 0").unwrap();
        assert_eq!(never.to_config(address).unwrap().health.failures, 0);
    }

    #[test]
    fn a_redis_url_is_checked_and_its_password_never_shown() {
        let address = "127.0.0.1:8081".parse().unwrap();
        let settings: AcceleratorSettings = toml::from_str(
            "basis-redis = \"redis://:s3cret@10.0.0.5:6379/2\"\nbasis-redis-timeout = \"20ms\"",
        )
        .unwrap();
        let shared = settings.to_config(address).unwrap().basis_shared.unwrap();
        assert_eq!(shared.timeout, Duration::from_millis(20));
        assert_eq!(shared.max_body, 16 << 20);
        assert!(!format!("{shared:?}").contains("s3cret"), "{shared:?}");
        for (text, expected) in [
            ("basis-redis = \"http://:s3cret@host\"", "use redis://"),
            (
                "basis-redis = \"redis://h\"\nbasis-redis-timeout = 0",
                "--basis-redis-timeout 0",
            ),
        ] {
            let settings: AcceleratorSettings = toml::from_str(text).unwrap();
            let error = settings.to_config(address).unwrap_err();
            assert!(error.0.contains(expected), "{text}: {error}");
            assert!(!error.0.contains("s3cret"), "{error}");
        }
        assert!(
            AcceleratorSettings::default()
                .to_config(address)
                .unwrap()
                .basis_shared
                .is_none()
        );
    }

    #[test]
    fn a_parent_beyond_loopback_needs_an_auth_file() {
        let mut settings: AcceleratorSettings = toml::from_str(SITES).unwrap();
        settings.auth.auth_file = None;
        let error = settings.to_config(settings.listen).unwrap_err();
        assert!(error.0.contains("auth-file"), "{error}");
        assert!(
            settings
                .to_config("127.0.0.1:8081".parse().unwrap())
                .is_ok()
        );
    }

    #[test]
    fn bad_sites_are_refused_with_their_number() {
        for (text, expected) in [
            (
                "[[site]]\nnames = []\norigin = \"http://a\"",
                "site 1: names",
            ),
            (
                "[[site]]\nnames = [\"a*b\"]\norigin = \"http://a\"",
                "site 1: host pattern",
            ),
            (
                "[[site]]\nnames = [\"a\"]\norigin = \"ftp://a\"",
                "site 1: origin ftp://a",
            ),
            (
                "[[site]]\nnames = [\"a\"]\norigin = \"http://a/x\"",
                "site 1: origin",
            ),
            (
                "origin = \"http://a\"\n[[site]]\nnames = [\"a\"]\norigin = \"http://a\"",
                "one or the other",
            ),
            (
                "[[site]]\nnames = [\"a\"]\norigin = \"http://a\"\nhealth-path = \"healthz\"",
                "site 1: health-path \"healthz\": use a path",
            ),
            (
                "[[site]]\nnames = [\"*\"]\norigin = \"any\"\nhealth-path = \"/healthz\"",
                "site 1: health-path: a parent-mode site",
            ),
            (
                "health-path = \"/healthz\"\n[[site]]\nnames = [\"a\"]\norigin = \"http://a\"",
                "give health-path in each [[site]]",
            ),
        ] {
            let settings: AcceleratorSettings = toml::from_str(text).unwrap();
            let error = settings.to_config(settings.listen).unwrap_err();
            assert!(error.0.contains(expected), "{text}: {error}");
        }
    }
}
