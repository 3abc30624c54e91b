//! `rproxy client`: flags → [`ClientConfig`], open the cache, then serve.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use http::HeaderValue;

use super::UsageError;
use super::accelerator::via_name;
use super::auth::AuthArgs;
use super::limits::LimitArgs;
use super::serving::{serve_listener, serve_one, take_stdio};
use crate::auth::{AuthGate, basic_credentials};
use crate::cache::{CacheScope, CacheStore};
use crate::client_proxy::queue_wait::QueueWaitConfig;
use crate::client_proxy::{ClientConfig, ClientProxy};
use crate::inetd::Stdio;

/// Flags of `rproxy client`.
#[derive(Debug, Args)]
pub struct ClientArgs {
    /// Address to listen on. User agents use it as their HTTP proxy
    /// (`curl -x`, `http_proxy=`), or as the site itself (gateway).
    #[arg(long, default_value = "127.0.0.1:8082")]
    pub listen: SocketAddr,
    /// The upstream, `http://host[:port]` or `https://host[:port]`: the
    /// accelerator (any HTTP server works too; then this is an ordinary
    /// caching proxy). Over https, HTTP/2 when the upstream offers it.
    #[arg(long, default_value = "http://127.0.0.1:8081")]
    pub upstream: String,
    /// Cache directory (created if missing; safe to delete).
    #[arg(long, default_value = "cache/client")]
    pub cache: PathBuf,
    /// Cache size budget: bytes, or with a K, M or G suffix. Least recently
    /// used entries are evicted to stay within it.
    #[arg(long, default_value = "1G", value_parser = parse_size)]
    pub cache_size: u64,
    /// Memory for small entries served often (each at most a sixteenth of
    /// it), so that hits on them touch no file: bytes, or with a K, M or G
    /// suffix; 0 turns it off.
    #[arg(long, default_value = "64M", value_parser = parse_size)]
    pub memory_cache: u64,
    /// Memory that relays of large bodies hold at once: bytes, or with a
    /// K, M or G suffix; 0: no bound. An hsync body being rebuilt takes
    /// about six of the accelerator's coding windows (6 MiB) while it
    /// runs, a plain one a few hundred KiB; past this, a body over 64 KiB
    /// waits for its turn before reading more from upstream, holding no
    /// thread, so bursts and readers that stop reading cannot take more
    /// than this (plus a few hundred KiB per connection).
    #[arg(long, value_name = "SIZE", default_value = "256M", value_parser = parse_size)]
    pub transfer_memory: u64,
    /// The cache serves one user only: responses marked private, or to
    /// requests with credentials, are stored and used as bases.
    #[arg(long)]
    pub private: bool,
    /// Our name in Via (letters, digits, '.', ':', '_', '-'); default: the
    /// listen address.
    #[arg(long)]
    pub via_name: Option<String>,
    /// Basis signature bytes sent while the upstream's Hsync-Accept is not
    /// known yet (decoded; 4608 is 6 KiB of header).
    #[arg(long, default_value_t = 4608)]
    pub signature_bytes: usize,
    /// Basis signature bytes never exceeded, whatever the upstream
    /// advertises.
    #[arg(long, default_value_t = 24 << 10)]
    pub max_signature: usize,
    /// Largest body rebuilt from a delta: bytes, or with a K, M or G suffix.
    #[arg(long, default_value = "4G", value_parser = parse_size)]
    pub max_object: u64,
    /// Seconds to connect upstream.
    #[arg(long, default_value_t = 4)]
    pub connect_timeout: u64,
    /// Seconds for the upstream's response head (504 after).
    #[arg(long, default_value_t = 30)]
    pub upstream_timeout: u64,
    /// Seconds a request waits for an identical one already in flight
    /// before fetching on its own.
    #[arg(long, default_value_t = 5)]
    pub lock_timeout: u64,
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
    /// User to authenticate as to the upstream (Proxy-Authorization:
    /// Basic), when the accelerator has an --auth-file. The password comes
    /// from --upstream-password-file, or else the environment variable
    /// RPROXY_UPSTREAM_PASSWORD.
    #[arg(long, value_name = "USER")]
    pub upstream_user: Option<String>,
    /// Seconds a request may wait in the upstream's queue for an upload
    /// slot (the accelerator's --slots); then the upstream's 503 and
    /// Retry-After go to the user agent. A request whose user agent waits
    /// on its connection (no waiting page) gives up 10 s before
    /// --idle-timeout at the latest, which would close the connection.
    #[arg(long, default_value_t = 300, value_name = "SECS")]
    pub queue_wait_max: u64,
    /// Seconds a browser's page load (a navigation) waits in the
    /// upstream's queue before it gets a page showing its position, length
    /// and ETA that reloads itself every 5 s; the wait goes on meanwhile
    /// and the reload gets the answer. At or past --queue-wait-max: no
    /// page.
    #[arg(long, default_value_t = 3, value_name = "SECS")]
    pub queue_page_after: u64,
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
}

/// How long before --idle-timeout a request whose user agent waits on its
/// connection gives up waiting in the upstream's queue, so that the
/// upstream's answer still reaches it.
const HELD_WAIT_MARGIN: Duration = Duration::from_secs(10);

/// The environment variable holding the upstream password.
pub const UPSTREAM_PASSWORD_ENV: &str = "RPROXY_UPSTREAM_PASSWORD";

/// Parses `1234`, `64K`, `512M`, `1G` (binary multiples).
pub(super) fn parse_size(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let (digits, shift) = match text.char_indices().last() {
        Some((i, 'k' | 'K')) => (&text[..i], 10),
        Some((i, 'm' | 'M')) => (&text[..i], 20),
        Some((i, 'g' | 'G')) => (&text[..i], 30),
        _ => (text, 0),
    };
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("{text:?} is not a size (like 1048576, 512M or 1G)"))?;
    n.checked_mul(1 << shift)
        .ok_or_else(|| format!("{text} is too large"))
}

impl ClientArgs {
    /// The validated configuration, for serving on `address` (the listen
    /// address, or under inetd the socket's own).
    ///
    /// # Errors
    /// A [`UsageError`] saying which flag is wrong.
    pub fn config(&self, address: SocketAddr) -> Result<ClientConfig, UsageError> {
        if !address.ip().is_loopback() && !self.allow_open && self.auth.auth_file.is_none() {
            return Err(UsageError(format!(
                "{address}: not a loopback address, and nobody has to authenticate; \
                 give --auth-file (see rproxy passwd), or --allow-open to run an open proxy there"
            )));
        }
        // No byte moves on a user agent's connection while its request
        // waits: the idle timeout would close it.
        let held_max = self
            .limits
            .idle_timeout
            .saturating_sub(HELD_WAIT_MARGIN.as_secs())
            .min(self.queue_wait_max);
        if self.queue_page_after >= held_max && self.queue_page_after < self.queue_wait_max {
            return Err(UsageError(format!(
                "--queue-page-after {}: a navigation waiting that long is cut by --idle-timeout {} \
                 first (less {} s); lower the one or raise the other",
                self.queue_page_after,
                self.limits.idle_timeout,
                HELD_WAIT_MARGIN.as_secs()
            )));
        }
        Ok(ClientConfig {
            upstream: self
                .upstream
                .parse()
                .map_err(|_| UsageError(format!("--upstream {}: not a URL", self.upstream)))?,
            via_name: via_name(self.via_name.as_deref(), address)?,
            scope: if self.private {
                CacheScope::Private
            } else {
                CacheScope::Shared
            },
            default_signature_bytes: self.signature_bytes.min(self.max_signature),
            max_signature_bytes: self.max_signature,
            connect_timeout: Duration::from_secs(self.connect_timeout),
            upstream_timeout: Duration::from_secs(self.upstream_timeout),
            lock_timeout: Duration::from_secs(self.lock_timeout),
            max_object_bytes: self.max_object,
            memory_cache_bytes: usize::try_from(self.memory_cache).map_err(|_| {
                UsageError(format!("--memory-cache {}: too large", self.memory_cache))
            })?,
            upstream_credentials: self.upstream_credentials()?,
            upstream_tls: self.upstream_tls()?,
            queue: QueueWaitConfig {
                wait_max: Duration::from_secs(self.queue_wait_max),
                held_max: Duration::from_secs(held_max),
                page_after: Duration::from_secs(self.queue_page_after),
                node: self.queue_node()?,
            },
            transfer_memory: self.transfer_memory,
        })
    }

    /// Where the accelerator reaches our QUEUE callback listener. A port 0
    /// is filled in once the listener is bound ([`run`]).
    fn queue_node(&self) -> Result<Option<SocketAddr>, UsageError> {
        let Some(listen) = self.queue_callback else {
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
        crate::tls::client_config(self.upstream_ca.as_deref())
            .map(Some)
            .map_err(|e| UsageError(format!("--upstream-ca: {e}")))
    }

    /// `Proxy-Authorization` for the upstream, from --upstream-user and
    /// the password file or environment.
    fn upstream_credentials(&self) -> Result<Option<HeaderValue>, UsageError> {
        let Some(user) = &self.upstream_user else {
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

/// Runs the client proxy until the process is stopped.
///
/// # Errors
/// A bad flag ([`UsageError`]), a cache directory that cannot be opened or
/// a listener that cannot bind.
pub fn run(args: ClientArgs) -> anyhow::Result<()> {
    let stdio = take_stdio(args.inetd)?;
    let address = stdio
        .as_ref()
        .and_then(Stdio::local_addr)
        .unwrap_or(args.listen);
    let mut config = args.config(address)?;
    let callbacks = match args.queue_callback {
        Some(listen) => {
            let listener = std::net::TcpListener::bind(listen)
                .with_context(|| format!("--queue-callback: cannot listen on {listen}"))?;
            listener.set_nonblocking(true)?;
            if args.queue_node.is_none() {
                config.queue.node = Some(listener.local_addr()?);
            }
            Some(listener)
        }
        None => None,
    };
    let auth = args.auth.authenticator()?;
    let store = CacheStore::open(&args.cache, args.cache_size)
        .with_context(|| format!("cannot open the cache in {}", args.cache.display()))?;
    let proxy = ClientProxy::new(config, store).map_err(|e| UsageError(e.to_string()))?;
    let proxy = AuthGate::new(proxy, auth);
    let limits = args.limits.limits();
    if let Some(stdio) = stdio {
        return serve_one(stdio, proxy, limits);
    }
    serve_listener(args.listen, proxy, limits, None, |address, proxy| {
        tracing::info!(listen = %address, upstream = %args.upstream, cache = %args.cache.display(), "client proxy ready");
        if let Some(listener) = callbacks {
            match tokio::net::TcpListener::from_std(listener) {
                Ok(listener) => {
                    let node = proxy.role().queue_waits().config().node;
                    tracing::info!(listen = ?listener.local_addr().ok(), node = ?node, "QUEUE callbacks ready");
                    tokio::spawn(proxy.role().serve_queue_callbacks(listener));
                }
                Err(error) => tracing::error!(%error, "cannot serve QUEUE callbacks"),
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn sizes_take_binary_suffixes() {
        assert_eq!(parse_size("1234"), Ok(1234));
        assert_eq!(parse_size("64K"), Ok(64 << 10));
        assert_eq!(parse_size("512m"), Ok(512 << 20));
        assert_eq!(parse_size("1G"), Ok(1 << 30));
        assert!(parse_size("1T").is_err());
        assert!(parse_size("G").is_err());
        assert!(parse_size("99999999999G").is_err());
    }
}
