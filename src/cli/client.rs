//! `rproxy client`: file and flags → [`ClientSettings`] →
//! [`ClientConfig`](crate::client_proxy::ClientConfig), open the cache,
//! then serve.

use crate::client_proxy::targeted::TargetedCacheControl;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Args;

use super::UsageError;
use super::admin::{AdminListener, Following, client_summary, shown};
use super::auth::AuthArgs;
use super::limits::LimitArgs;
use super::log::LogArgs;
use super::serving::{
    Layers, Listening, Reload, bound_address, serve_one, take_stdio, warn_restart_needed,
};
use crate::cache::CacheStore;
use crate::client_proxy::ClientProxy;
use crate::config::units::{Size, parse_duration};
use crate::config::{self, AdminListen, ClientSettings, SubscribeSettings, override_with_flags};
use crate::http::access_log::Logged;
use crate::http::auth::AuthGate;

pub use crate::config::UPSTREAM_PASSWORD_ENV;

/// Flags of `rproxy client`. Each one given overrides its key in the
/// `--config` file; the defaults are [`ClientSettings`]'s.
#[derive(Debug, Args)]
pub struct ClientArgs {
    /// TOML file with the settings (keys named as the flags; see
    /// examples/client.toml); flags given override it.
    #[arg(long = "config", value_name = "FILE")]
    pub config_file: Option<PathBuf>,
    /// Address to listen on. User agents use it as their HTTP proxy
    /// (`curl -x`, `http_proxy=`), or as the site itself (gateway).
    #[arg(long)]
    pub listen: Option<SocketAddr>,
    /// Address of the admin listener: Prometheus metrics at /metrics and
    /// a status page at /, aggregates only; "off" turns it off. Beyond
    /// loopback it needs --auth-file (its users log in with Basic
    /// authentication). Not started under --inetd.
    #[arg(long, value_name = "ADDR|off")]
    pub admin_listen: Option<AdminListen>,
    /// The upstream, `http://host[:port]` or `https://host[:port]`: the
    /// accelerator (any HTTP server works too; then this is an ordinary
    /// caching proxy). Over https, HTTP/2 when the upstream offers it.
    /// Every host goes there (the one-route shorthand; `[[route]]` tables
    /// in the config file route hosts to several upstreams or direct).
    /// Default: http://127.0.0.1:8081.
    #[arg(long)]
    pub upstream: Option<String>,
    /// Cache directory (created if missing; safe to delete).
    #[arg(long)]
    pub cache: Option<PathBuf>,
    /// Cache size budget: bytes, or with a K, M or G suffix. Least recently
    /// used entries are evicted to stay within it.
    #[arg(long, value_name = "SIZE")]
    pub cache_size: Option<Size>,
    /// Memory for small entries served often (each at most a sixteenth of
    /// it), so that hits on them touch no file: bytes, or with a K, M or G
    /// suffix; 0 turns it off.
    #[arg(long, value_name = "SIZE")]
    pub memory_cache: Option<Size>,
    /// Memory that relays of large bodies hold at once: bytes, or with a
    /// K, M or G suffix; 0: no bound. An hsync body being rebuilt takes
    /// about six of the accelerator's coding windows (6 MiB; up to 48 MiB
    /// for a body over ~400 MB, as its stream's block size tells) while
    /// it runs, a plain one a few hundred KiB; past this, a body over 64 KiB
    /// waits for its turn before reading more from upstream, holding no
    /// thread, so bursts and readers that stop reading cannot take more
    /// than this (plus a few hundred KiB per connection).
    #[arg(long, value_name = "SIZE")]
    pub transfer_memory: Option<Size>,
    /// Disk that bodies parked for user agents that stopped reading take
    /// together, in the cache directory's tmp/ (64K, 512M, 4G...): a bound
    /// on what such user agents can make the proxy write. Past it, a relay
    /// waits for its user agent in memory, within its share of
    /// --transfer-memory.
    #[arg(long, value_name = "SIZE")]
    pub max_spool_total: Option<Size>,
    /// The cache serves one user only: responses marked private, or to
    /// requests with credentials, are stored and used as bases.
    #[arg(long)]
    pub private: bool,
    /// Store responses that set a cookie (Set-Cookie) even without
    /// `Cache-Control: public` or `s-maxage`, as RFC 9111 §7.3 allows:
    /// other users get them as hits, never with the cookie, and they are
    /// never a delta basis. Off by default, since such a page is often
    /// one user's (a greeting, a cart): turn it on for sites whose cookies
    /// ride on pages that are the same for everyone.
    #[arg(long)]
    pub store_set_cookie: bool,
    /// When a response's CDN-Cache-Control replaces its Cache-Control in
    /// the caching rules (RFC 9213): for requests that come as to a
    /// gateway (the proxy is then the site's CDN; the default), always, or
    /// never.
    #[arg(long, value_name = "WHEN")]
    pub targeted_cache_control: Option<TargetedCacheControl>,
    /// Serve client proxies downstream of this one (a chain) plain bodies
    /// instead of hsync deltas against their own cached copies.
    #[arg(long)]
    pub no_downstream_coding: bool,
    /// Our name in Via (letters, digits, '.', ':', '_', '-'); default: the
    /// listen address.
    #[arg(long)]
    pub via_name: Option<String>,
    /// Basis signature bytes sent while the upstream's Hsync-Accept is not
    /// known yet (decoded; 4608 is 6 KiB of header): bytes, or with a K,
    /// M or G suffix.
    #[arg(long, value_name = "SIZE")]
    pub signature_bytes: Option<Size>,
    /// Basis signature bytes never exceeded, whatever the upstream
    /// advertises: bytes, or with a K, M or G suffix.
    #[arg(long, value_name = "SIZE")]
    pub max_signature: Option<Size>,
    /// Largest body rebuilt from a delta: bytes, or with a K, M or G suffix.
    #[arg(long, value_name = "SIZE")]
    pub max_object: Option<Size>,
    /// Time to connect upstream: 30s, 5m, 100ms or seconds.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub connect_timeout: Option<Duration>,
    /// Time for the upstream's response head (504 after), counted from the
    /// last byte of the request body it took: 30s, 5m, 100ms or seconds.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub upstream_timeout: Option<Duration>,
    /// Time a request waits for an identical one already in flight before
    /// fetching on its own: 30s, 5m, 100ms or seconds.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub lock_timeout: Option<Duration>,
    /// Consecutive failures (no connection, no response head in time; a
    /// 5xx answer is not one) that mark an upstream proxy down: requests
    /// then go to their route's fallback, or are answered 503 at once
    /// with Retry-After (or from a stale entry that allows it), until one
    /// probes it successfully. 0: never marked down.
    #[arg(long, value_name = "N")]
    pub health_failures: Option<u32>,
    /// How long an upstream marked down is left alone before a request
    /// probes it (30s, 5m, 100ms or seconds); each failed probe doubles it,
    /// up to --health-max-down-time.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub health_down_time: Option<Duration>,
    /// The longest an upstream marked down is left alone.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub health_max_down_time: Option<Duration>,
    /// Serve one connection on stdin/stdout, as inetd, xinetd or a systemd
    /// socket unit with Accept=yes start it, and exit when the peer is
    /// done. --listen is not used (but names us in Via by default, unless
    /// stdin is a TCP socket: then its local address does).
    #[arg(long)]
    pub inetd: bool,
    /// Listen on a non-loopback address without --auth-file: an open
    /// proxy anyone who reaches it can use.
    #[arg(long)]
    pub allow_open: bool,
    #[command(flatten)]
    #[allow(missing_docs)]
    pub auth: AuthArgs,
    #[command(flatten)]
    #[allow(missing_docs)]
    pub limits: LimitArgs,
    #[command(flatten)]
    #[allow(missing_docs)]
    pub log: LogArgs,
    /// User to authenticate as to the upstream (Proxy-Authorization:
    /// Basic), when the accelerator has an --auth-file. The password comes
    /// from --upstream-password-file, or else the environment variable
    /// RPROXY_UPSTREAM_PASSWORD.
    #[arg(long, value_name = "USER")]
    pub upstream_user: Option<String>,
    /// Time a request may wait in the upstream's queue for an upload slot
    /// (the accelerator's --slots): 30s, 5m, 100ms or seconds; then the
    /// upstream's 503 and Retry-After go to the user agent. A request whose
    /// user agent waits on its connection (no waiting page) gives up 10 s
    /// before --idle-timeout at the latest, which would close the
    /// connection.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub queue_wait_max: Option<Duration>,
    /// Time a browser's page load (a navigation) waits in the upstream's
    /// queue before it gets a page showing its position, length and ETA
    /// that reloads itself every 5 s (30s, 5m, 100ms or seconds); the wait
    /// goes on meanwhile and the reload gets the answer. At or past
    /// --queue-wait-max: no page.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub queue_page_after: Option<Duration>,
    /// Listen on this address for the accelerator's QUEUE callbacks
    /// (PARQ), and tell the accelerator where it is (X-Node): a callback
    /// makes a waiting request come back at once instead of losing its
    /// place. Off by default.
    #[arg(long, value_name = "ADDR")]
    pub queue_callback: Option<SocketAddr>,
    /// The address sent in X-Node for QUEUE callbacks, when the
    /// accelerator reaches --queue-callback by another (it listens on
    /// 0.0.0.0, or behind NAT).
    #[arg(long, value_name = "ADDR", requires = "queue_callback")]
    pub queue_node: Option<SocketAddr>,
    /// PEM certificates to trust for an https:// upstream, instead of the
    /// system's roots (for an accelerator with its own CA or a
    /// self-signed certificate).
    #[arg(long, value_name = "FILE")]
    pub upstream_ca: Option<PathBuf>,
    /// File whose first line is the --upstream-user's password.
    #[arg(long, value_name = "FILE", requires = "upstream_user")]
    pub upstream_password_file: Option<PathBuf>,
    /// Ports CONNECT tunnels may go to, comma-separated (default 443),
    /// whichever route takes the host (direct, or a CONNECT to the route's
    /// upstream proxy; direct under the --upstream shorthand); other ports
    /// get 403. A tunnel is relayed byte for
    /// byte, closed after --idle-timeout without traffic: nothing in it is
    /// cached or coded.
    #[arg(long, value_name = "PORT,...", value_delimiter = ',', num_args = 1..)]
    pub connect_ports: Option<Vec<u16>>,
    /// Non-public addresses CONNECT tunnels on a direct route may go to
    /// all the same (loopback, private, link-local...), as CIDR ranges,
    /// comma-separated (127.0.0.0/8,10.0.0.0/8); by default none: a host
    /// that resolves only to such addresses gets 403. (A route's own
    /// allow-addresses are for http:// fetches; a tunnel through an
    /// upstream proxy is checked by that proxy.)
    #[arg(long, value_name = "CIDR,...", value_delimiter = ',', num_args = 1..)]
    pub connect_allow_addresses: Option<Vec<ipnet::IpNet>>,
    /// Replicate this zone (http://host[:port]/path-prefix, repeatable)
    /// from its upstream's change feed (an accelerator with --feed-state,
    /// or a client proxy replicating it): the bodies that change there are
    /// fetched ahead of users, as deltas, and the zone's feed is served to
    /// client proxies behind this one. A [[subscribe]] table says more.
    #[arg(long, value_name = "ZONE")]
    pub subscribe: Vec<String>,
    /// Time between pulls of each --subscribe zone (10s); a push to
    /// --queue-callback makes one pull at once.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub subscribe_interval: Option<Duration>,
    /// Bytes per second the prefetches of each --subscribe zone take on
    /// average (1M; 0: no cap). They always wait for users' fetches.
    #[arg(long, value_name = "SIZE")]
    pub prefetch_rate: Option<Size>,
}

impl ClientArgs {
    /// The settings: the `--config` file's (or the defaults), with each
    /// flag given on top.
    ///
    /// # Errors
    /// A file that cannot be read or parsed ([`UsageError`], naming the
    /// line).
    pub fn settings(&self) -> Result<ClientSettings, UsageError> {
        let mut settings = match &self.config_file {
            Some(path) => config::load(path)?,
            None => ClientSettings::default(),
        };
        override_with_flags!(settings, self;
            plain: listen, admin_listen, cache, cache_size, memory_cache, transfer_memory, max_spool_total,
                signature_bytes,
                max_signature, max_object, connect_timeout, upstream_timeout, lock_timeout,
                health_failures, health_down_time, health_max_down_time,
                queue_wait_max, queue_page_after, connect_ports, connect_allow_addresses,
                targeted_cache_control;
            optional: upstream, via_name, upstream_user, queue_callback, queue_node, upstream_ca,
                upstream_password_file;
            switches: private, store_set_cookie, no_downstream_coding, inetd, allow_open);
        for zone in &self.subscribe {
            let mut table = SubscribeSettings::zone(zone);
            table.interval = self.subscribe_interval.unwrap_or(table.interval);
            table.rate = self.prefetch_rate.unwrap_or(table.rate);
            settings.subscriptions.push(table);
        }
        self.auth.apply(&mut settings.auth);
        self.limits.apply(&mut settings.limits);
        self.log.apply(&mut settings.log);
        Ok(settings)
    }
}

/// Runs the client proxy until the process is stopped.
///
/// # Errors
/// A bad flag ([`UsageError`]), a cache directory that cannot be opened or
/// a listener that cannot bind.
pub fn run(args: ClientArgs) -> anyhow::Result<()> {
    let settings = args.settings()?;
    let limits = settings.limits.to_limits()?;
    let stdio = take_stdio(settings.inetd)?;
    let listening = match stdio {
        Some(_) => None,
        None => Some(Listening::bind(settings.listen, &limits)?),
    };
    let address = bound_address(listening.as_ref(), stdio.as_ref(), settings.listen);
    let mut config = settings.to_config(address)?;
    let callbacks = match settings.queue_callback {
        Some(listen) => {
            let listener = std::net::TcpListener::bind(listen)
                .with_context(|| format!("--queue-callback: cannot listen on {listen}"))?;
            listener.set_nonblocking(true)?;
            if settings.queue_node.is_none() {
                config.queue.node = Some(listener.local_addr()?);
            }
            Some(listener)
        }
        None => None,
    };
    let layers = Layers::open(&settings.log, &settings.auth)?;
    // inetd processes, one per connection, share the cache with each other.
    let open = if settings.inetd {
        CacheStore::open_shared
    } else {
        CacheStore::open
    };
    let store = open(&settings.cache, settings.cache_size.0)
        .with_context(|| format!("cannot open the cache in {}", settings.cache.display()))?;
    let queue_node = config.queue.node;
    let proxy = ClientProxy::new(config, store).map_err(|e| UsageError(e.to_string()))?;
    let proxy = layers.around(proxy, &settings.log)?;
    let (Some(listening), None) = (listening, &stdio) else {
        return serve_one(stdio.expect("no listener: --inetd"), proxy, limits);
    };
    let admin = AdminListener::bind(
        settings.admin_address()?,
        client_summary(&settings),
        proxy.role().shared_authenticator(),
    )?;
    let describe = settings.describe_routes().to_string();
    let cache = settings.cache.display().to_string();
    let reload = reload(args, settings, address, queue_node);
    listening.serve(proxy, limits, None, reload, |address, proxy| {
        let admin = admin.and_then(|admin| admin.spawn(address, Arc::new(Following(proxy.clone()))));
        tracing::info!(listen = %address, admin = %shown(admin), routes = %describe, cache = %cache, "client proxy ready");
        for zone in proxy.current().role().role().replicas().zones() {
            let handler = proxy.clone();
            tokio::spawn(ClientProxy::replicate(zone.clone(), move || {
                Some(handler.current().role().shared_role())
            }));
        }
        let proxy = proxy.current();
        if let Some(listener) = callbacks {
            match tokio::net::TcpListener::from_std(listener) {
                Ok(listener) => {
                    let node = proxy.role().role().queue_waits().config().node;
                    tracing::info!(listen = ?listener.local_addr().ok(), node = ?node, "QUEUE callbacks ready");
                    tokio::spawn(proxy.role().role().serve_queue_callbacks(listener));
                }
                Err(error) => tracing::error!(%error, "cannot serve QUEUE callbacks"),
            }
        }
    })
}

/// SIGHUP: the file and the flags read again and checked as at start
/// (and as `rproxy check` does), then a proxy over the same cache.
fn reload(
    args: ClientArgs,
    running: ClientSettings,
    address: SocketAddr,
    queue_node: Option<SocketAddr>,
) -> Reload<Logged<AuthGate<ClientProxy>>> {
    Box::new(move |current| {
        let settings = args.settings()?;
        warn_restart_needed(&running, &settings);
        let limits = settings.limits.to_limits()?;
        let layers = Layers::open(&settings.log, &settings.auth)?;
        let mut config = settings.to_config(address)?;
        config.queue.node = queue_node;
        let proxy = current
            .role()
            .role()
            .reconfigured(config)
            .map_err(|e| UsageError(e.to_string()))?;
        tracing::info!(routes = %settings.describe_routes(), "client proxy reconfigured");
        Ok((layers.around(proxy, &settings.log)?, limits))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client_proxy::ClientConfig;
    use crate::http::auth::basic_credentials;

    /// The flags on top of the defaults, as the tests below ask for them.
    impl ClientArgs {
        fn config(&self, address: SocketAddr) -> Result<ClientConfig, UsageError> {
            self.settings()?.to_config(address)
        }
    }

    fn args(extra: &[&str]) -> ClientArgs {
        use clap::Parser;
        let cli =
            crate::cli::Cli::try_parse_from(["rproxy", "client"].iter().chain(extra).copied())
                .unwrap();
        match cli.command {
            crate::cli::Command::Client(args) => args,
            _ => unreachable!(),
        }
    }

    #[test]
    fn a_7_a_public_address_needs_an_auth_file_or_allow_open() {
        let public: SocketAddr = "192.0.2.1:8082".parse().unwrap();
        let loopback: SocketAddr = "127.0.0.1:8082".parse().unwrap();
        assert!(args(&[]).config(loopback).is_ok());
        let refused = args(&[]).config(public).unwrap_err().to_string();
        assert!(refused.contains("--auth-file"), "{refused}");
        assert!(args(&["--auth-file", "users"]).config(public).is_ok());
        assert!(args(&["--allow-open"]).config(public).is_ok());
    }

    #[test]
    fn upstream_credentials_come_from_a_file_and_need_a_password() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("password");
        std::fs::write(&file, "s3cret\nignored\n").unwrap();
        let loopback: SocketAddr = "127.0.0.1:8082".parse().unwrap();
        let with_file = args(&[
            "--upstream-user",
            "accel",
            "--upstream-password-file",
            file.to_str().unwrap(),
        ]);
        let config = with_file.config(loopback).unwrap();
        assert_eq!(
            config.upstream_credentials,
            Some(basic_credentials("accel", "s3cret"))
        );
        assert_eq!(
            args(&[]).config(loopback).unwrap().upstream_credentials,
            None
        );
        let bad_user = args(&["--upstream-user", "a:b"]).config(loopback);
        assert!(bad_user.is_err());
    }

    #[test]
    fn queue_flags_have_sane_defaults_and_callbacks_need_a_reachable_address() {
        let loopback: SocketAddr = "127.0.0.1:8082".parse().unwrap();
        let queue = args(&[]).config(loopback).unwrap().queue;
        assert_eq!(queue.wait_max, Duration::from_secs(300));
        assert_eq!(
            queue.held_max,
            Duration::from_secs(50),
            "10 s before the idle timeout"
        );
        assert_eq!(queue.page_after, Duration::from_secs(3));
        assert_eq!(queue.node, None, "no callbacks by default");
        let node = args(&["--queue-callback", "127.0.0.1:6346"])
            .config(loopback)
            .unwrap()
            .queue
            .node;
        assert_eq!(node, Some("127.0.0.1:6346".parse().unwrap()));
        let anywhere = args(&["--queue-callback", "0.0.0.0:6346"]).config(loopback);
        assert!(
            anywhere.unwrap_err().to_string().contains("--queue-node"),
            "0.0.0.0 is no address to call back to"
        );
        let natted = args(&[
            "--queue-callback",
            "0.0.0.0:6346",
            "--queue-node",
            "192.0.2.7:16346",
        ])
        .config(loopback)
        .unwrap();
        assert_eq!(natted.queue.node, Some("192.0.2.7:16346".parse().unwrap()));
        assert!(
            args(&["--queue-callback", "127.0.0.1:6346", "--inetd"])
                .config(loopback)
                .is_err()
        );
        let short = args(&["--queue-wait-max", "20"]).config(loopback).unwrap();
        assert_eq!(short.queue.held_max, Duration::from_secs(20));
        let cut = args(&["--queue-page-after", "55"]).config(loopback);
        assert!(
            cut.unwrap_err().to_string().contains("--idle-timeout 60"),
            "a page later than the idle timeout would never be seen"
        );
        let patient = args(&["--queue-page-after", "55", "--idle-timeout", "120"]);
        assert_eq!(
            patient.config(loopback).unwrap().queue.held_max,
            Duration::from_secs(110)
        );
        use clap::Parser;
        assert!(
            crate::cli::Cli::try_parse_from(["rproxy", "client", "--queue-node", "192.0.2.7:1"])
                .is_err(),
            "--queue-node needs --queue-callback"
        );
    }
}
