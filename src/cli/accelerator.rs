//! `rproxy accelerator`: file and flags → [`AcceleratorSettings`] →
//! [`AcceleratorConfig`](crate::accelerator::AcceleratorConfig), then
//! serve.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;

use super::UsageError;
use super::admin::{AdminListener, Following, accelerator_summary, shown};
use super::auth::AuthArgs;
use super::limits::LimitArgs;
use super::log::LogArgs;
use super::serving::{
    Layers, Listening, Reload, bound_address, serve_one, take_stdio, warn_restart_needed,
};
use crate::accelerator::Accelerator;
use crate::config::units::{Size, parse_duration};
use crate::config::{self, AcceleratorSettings, AdminListen, override_with_flags};
use crate::http::access_log::Logged;
use crate::http::auth::AuthGate;
use crate::http::tls::ServerCertificate;

/// Flags of `rproxy accelerator`. Each one given overrides its key in the
/// `--config` file; the defaults are [`AcceleratorSettings`]'s.
#[derive(Debug, Args)]
pub struct AcceleratorArgs {
    /// TOML file with the settings (keys named as the flags; see
    /// examples/accelerator.toml); flags given override it.
    #[arg(long = "config", value_name = "FILE")]
    pub config_file: Option<PathBuf>,
    /// Address to listen on.
    #[arg(long)]
    pub listen: Option<SocketAddr>,
    /// Address of the admin listener: Prometheus metrics at /metrics and
    /// a status page at /, aggregates only; "off" turns it off. Beyond
    /// loopback it needs --auth-file (its users log in with Basic
    /// authentication). Not started under --inetd.
    #[arg(long, value_name = "ADDR|off")]
    pub admin_listen: Option<AdminListen>,
    /// The origin web server, `http://host[:port]` or `https://host[:port]`,
    /// for requests naming any host (the one-site shorthand; `[[site]]`
    /// tables in the config file name several sites). Default:
    /// http://127.0.0.1:8080.
    #[arg(long)]
    pub origin: Option<String>,
    /// Our name in Via (letters, digits, '.', ':', '_', '-'); default: the
    /// listen address.
    #[arg(long)]
    pub via_name: Option<String>,
    /// Largest origin body to encode (64K, 256M, 1G or bytes); larger ones
    /// pass through.
    #[arg(long, value_name = "SIZE")]
    pub max_encode_len: Option<Size>,
    /// zstd level for the literals of each body's first MiBs (2 MiB of
    /// zstd work without a kept basis body; with one, the basis level of
    /// 12 applies). Level 19 sends jquery.js in 0.88x of gzip -9 at about
    /// 1.5 MB/s of one core; 15 in 0.93x about five times as fast.
    #[arg(long, value_name = "LEVEL", allow_negative_numbers = true,
          value_parser = clap::value_parser!(i32).range(1..=19))]
    pub level: Option<i32>,
    /// zstd level for the literals of large bodies, past the first MiBs
    /// (which get the high levels). A window that compresses no better
    /// than half sends the next at level 1 (or this one, if lower).
    /// Negative levels (zstd's fast ones) leave literals without entropy
    /// coding always; by default the accelerator does so only while the
    /// link is faster than the coding (see --no-adapt).
    #[arg(long, value_name = "LEVEL", allow_negative_numbers = true,
          value_parser = clap::value_parser!(i32).range(-7..=19))]
    pub bulk_level: Option<i32>,
    /// Entropy-code large bodies' literals always. By default, past the
    /// first 8 MiB on the wire, the accelerator drops entropy coding (zstd
    /// level -1) while the link takes bytes faster than it can code them,
    /// as `zstd --adapt` does, and keeps it while the link or the origin is
    /// what the transfer waits for. On loopback, random text then crosses
    /// at 1.00x instead of 0.75x, and about a quarter faster.
    #[arg(long)]
    pub no_adapt: bool,
    /// Largest basis signature accepted from a client (decoded; 24K,
    /// 4608 or any size); advertised in Hsync-Accept.
    #[arg(long, value_name = "SIZE")]
    pub max_signature: Option<Size>,
    /// Largest basis signature accepted as a request's body (default 8M;
    /// 0: none), from a client proxy whose basis is too large for a
    /// header's signature to find small edits; advertised in Hsync-Accept.
    #[arg(long, value_name = "SIZE")]
    pub max_body_signature: Option<Size>,
    /// Bodies encoded at once (0: one per core). More wait for a turn, one
    /// per chunk of the origin body, so that large bodies coded together
    /// leave the CPU to cheap requests too.
    #[arg(long, value_name = "N")]
    pub max_encoders: Option<usize>,
    /// Directory where a coded body is parked, in an unlinked temp file,
    /// for a client that took nothing for 100 ms: the encoder then runs
    /// on at the origin's pace and frees its state, and the client costs
    /// a page of memory while it does not read [default: the system's
    /// temp directory ($TMPDIR or /tmp)]
    #[arg(long, value_name = "DIR")]
    pub spool_dir: Option<PathBuf>,
    /// Most bytes of one coded body parked ahead of its client (64K, 512M,
    /// 1G...); past it the encoder waits for the client. 0 turns parking
    /// off: the encoder waits, holding its memory, as soon as the client
    /// does not read.
    #[arg(long, value_name = "SIZE")]
    pub max_spool: Option<Size>,
    /// Disk that all parked bodies take together (64K, 512M, 4G...): a
    /// bound on what clients that stop reading can make the accelerator
    /// write (on a `/tmp` that is a tmpfs, it is memory). Past it, no
    /// body is parked: its encoder waits for the client, within its share
    /// of --transfer-memory, and a parked body whose file can grow no
    /// more waits for its client at the length it has.
    #[arg(long, value_name = "SIZE")]
    pub max_spool_total: Option<Size>,
    /// Memory that coded responses being streamed hold at once (64K, 256M,
    /// 1G...; 0: no bound). Each takes about six coding windows (6 MiB;
    /// up to 48 MiB for a body over ~400 MB, whose windows are eight of
    /// its 1 MiB blocks) while it runs, less for a body announced
    /// smaller; past this, a coded response waits for its turn, holding
    /// no thread and reading nothing from the origin, so bursts and
    /// readers that stop reading cannot take more than this (plus a few
    /// hundred KiB per connection).
    /// A sixteenth more holds the first 64 KiB that large bodies without a
    /// basis are probed with (whether they compress at all); when that is
    /// spent, a body is coded unprobed rather than wait.
    #[arg(long, value_name = "SIZE")]
    pub transfer_memory: Option<Size>,
    /// Time to connect to the origin: 30s, 5m, 100ms or seconds.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub connect_timeout: Option<Duration>,
    /// Time for the origin's response head (504 after; counted from the
    /// last byte of the request body it took), and for the whole
    /// of a coded body announced at most 64 KiB long: 30s, 5m, 100ms or
    /// seconds.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub origin_timeout: Option<Duration>,
    /// A path on the origin (the --origin shorthand's; a [[site]] names its
    /// own) that is asked for every --health-interval: a 2xx or 3xx answer
    /// says the origin is up, anything else counts as a failure, as a
    /// request that cannot connect does. Without it, requests alone tell.
    #[arg(long, value_name = "PATH")]
    pub health_path: Option<String>,
    /// Time between two checks of a health-path (30s, 5m, 100ms or
    /// seconds); a check has this long (or --origin-timeout, if shorter)
    /// to answer.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub health_interval: Option<Duration>,
    /// Consecutive failures (no connection, no response head in time, a
    /// failed health check; a 5xx answer is not one) that mark an origin
    /// down: its requests are then answered 503 at once, with Retry-After,
    /// until one probes it successfully. 0: never marked down.
    #[arg(long, value_name = "N")]
    pub health_failures: Option<u32>,
    /// How long an origin marked down is left alone before a request
    /// probes it (30s, 5m, 100ms or seconds); each failed probe doubles it,
    /// up to --health-max-down-time.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub health_down_time: Option<Duration>,
    /// The longest an origin marked down is left alone.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub health_max_down_time: Option<Duration>,
    /// Memory for bodies served, kept so that a client naming one as its
    /// basis gets a delta against the body itself (64K, 256M, 1G or bytes;
    /// 0 turns it off). Bodies still streaming take up to a quarter of it
    /// more (at least one --max-stored-body).
    #[arg(long, value_name = "SIZE")]
    pub basis_store: Option<Size>,
    /// Largest body kept there (64K, 8M or bytes); larger ones go to the
    /// disk tier (--basis-dir).
    #[arg(long, value_name = "SIZE")]
    pub max_stored_body: Option<Size>,
    /// Directory of the basis store's disk tier: bodies over
    /// --max-stored-body, up to --max-disk-body, kept in files named by
    /// their blake3, written crash-safe (temp file, fsync, rename) and
    /// found again after a restart. One accelerator per directory (it is
    /// locked); "off" turns the tier off [default: rproxy-basis in
    /// --spool-dir; none under --inetd]
    #[arg(long, value_name = "DIR|off")]
    pub basis_dir: Option<PathBuf>,
    /// Disk that the bodies kept in --basis-dir take together (64K, 4G or
    /// bytes; least recently used first out; 0 turns the tier off).
    /// Bodies being written take up to a quarter of it more (at least one
    /// --max-disk-body).
    #[arg(long, value_name = "SIZE")]
    pub basis_disk: Option<Size>,
    /// Largest body kept in --basis-dir (64K, 128M or bytes). Coding
    /// against a held body larger than about 190 MiB costs more than the
    /// rsync stream for now: raise it only past that fix.
    #[arg(long, value_name = "SIZE")]
    pub max_disk_body: Option<Size>,
    /// Share kept bodies with other accelerators on Redis
    /// (redis://[user:password@]host[:port][/db]): where several run
    /// behind a load balancer, the one a client's next request reaches
    /// finds the body another one served. A body neither memory nor disk
    /// holds is looked up there; one that does not come within
    /// --basis-redis-timeout, or a Redis that is down, costs bytes (the
    /// body is coded against the client's signature), never an error.
    /// Bound Redis's memory with its own maxmemory and
    /// maxmemory-policy allkeys-lru.
    #[arg(long, value_name = "URL")]
    pub basis_redis: Option<String>,
    /// Time a lookup in --basis-redis may take (50ms, 1s...).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub basis_redis_timeout: Option<Duration>,
    /// Largest body shared in --basis-redis (64K, 16M or bytes; at most
    /// 512M, Redis's own limit). Bodies are collected in memory for it.
    #[arg(long, value_name = "SIZE")]
    pub max_redis_body: Option<Size>,
    /// Dangerous: keep every coded body in the basis store, including
    /// Cache-Control private and no-store responses, those that set a
    /// cookie and answers to requests with Authorization or Cookie. Any
    /// client can then learn whether someone was served a body it guesses
    /// (naming the body's hash as its basis changes the reply), so
    /// low-entropy private pages can be brute-forced. By default only
    /// bodies a shared cache may store are kept.
    #[arg(long)]
    pub basis_store_private: bool,
    /// Serve one connection on stdin/stdout, as inetd, xinetd or a systemd
    /// socket unit with Accept=yes start it, and exit when the peer is
    /// done. --listen is not used (but names us in Via by default, unless
    /// stdin is a TCP socket: then its local address does).
    #[arg(long)]
    pub inetd: bool,
    /// Upload slots: responses sent at once. Requests beyond them wait in
    /// a fair queue (PARQ 1.0.a for `X-Queue: 1.0` clients, Active
    /// Queueing for `X-Queue: 0.1`, by address for the rest) and get 503
    /// with their position and Retry-After. 0: no limit.
    #[arg(long, value_name = "N")]
    pub slots: Option<u32>,
    /// Most requests waiting for a slot; past it, a plain 503.
    #[arg(long, value_name = "N")]
    pub queue_max: Option<u32>,
    /// Most of those requests one client address may hold (a PARQ request
    /// for a URL the address already waits for reuses its place); past it,
    /// a plain 503. Generous by default, since a client proxy queues for
    /// all its users from one address. 0: no cap [default: a quarter of
    /// --queue-max]
    #[arg(long, value_name = "N")]
    pub queue_per_address: Option<u32>,
    /// Time a free slot still waits for a queued client after the time it
    /// was told to come back (Retry-After, pollMin) or a QUEUE callback
    /// (30s, 5m, 100ms or seconds); then the next client in line that is
    /// due takes it, and the late one keeps its place and gets the next
    /// free slot when it is back.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub queue_hold_grace: Option<Duration>,
    /// File the queue is saved to every second and reloaded from at
    /// start-up, so places survive a restart of up to 300 s.
    #[arg(long, value_name = "FILE")]
    pub queue_state: Option<PathBuf>,
    /// Directory of the change feed's logs: turns the feed on. Each site
    /// numbers the changes of its bodies (a path served or submitted with
    /// another body than last time) and client proxies subscribed to a
    /// zone pull them from GET /.well-known/hsync-feed on the site's host
    /// and prefetch them; a deploy hook POSTs the changed paths there.
    #[arg(long, value_name = "DIR")]
    pub feed_state: Option<PathBuf>,
    /// Time the feed keeps an update (168h, 30m, seconds); a client proxy
    /// that last asked before that gets the whole listing (a reset).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub feed_retain: Option<Duration>,
    /// Updates each site's feed keeps at most (the oldest go first).
    #[arg(long, value_name = "N")]
    pub feed_max_entries: Option<usize>,
    /// Watch a static document root (DIR=URL, repeatable: the directory
    /// and the URL its files are served at, such as
    /// /var/www/html=http://www.example.com/): each file whose size or
    /// time changes is fetched from the origin and committed to the feed
    /// if its body changed. Needs --feed-state.
    #[arg(long, value_name = "DIR=URL")]
    pub feed_watch: Vec<String>,
    /// Time between two walks of each --feed-watch root (2s).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub feed_watch_interval: Option<Duration>,
    /// PEM certificate chain: serve TLS (HTTP/2 or HTTP/1.1 by ALPN) for
    /// client proxies with an https:// upstream. Needs --tls-key.
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of --tls-cert.
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    #[command(flatten)]
    #[allow(missing_docs)]
    pub auth: AuthArgs,
    #[command(flatten)]
    #[allow(missing_docs)]
    pub limits: LimitArgs,
    #[command(flatten)]
    #[allow(missing_docs)]
    pub log: LogArgs,
}

impl AcceleratorArgs {
    /// The settings: the `--config` file's (or the defaults), with each
    /// flag given on top.
    ///
    /// # Errors
    /// A file that cannot be read or parsed ([`UsageError`], naming the
    /// line).
    pub fn settings(&self) -> Result<AcceleratorSettings, UsageError> {
        let mut settings = match &self.config_file {
            Some(path) => config::load(path)?,
            None => AcceleratorSettings::default(),
        };
        override_with_flags!(settings, self;
            plain: listen, admin_listen, max_encode_len, level, bulk_level, max_signature,
                max_body_signature, max_encoders, max_spool, max_spool_total, transfer_memory, connect_timeout, origin_timeout, basis_store,
                max_stored_body, basis_disk, max_disk_body, basis_redis_timeout, max_redis_body, feed_retain, feed_max_entries, feed_watch_interval, slots, queue_max, queue_hold_grace, health_interval, health_failures,
                health_down_time, health_max_down_time;
            optional: origin, via_name, spool_dir, basis_dir, basis_redis, queue_per_address, queue_state, feed_state, tls_cert, tls_key,
                health_path;
            switches: no_adapt, basis_store_private, inetd);
        if !self.feed_watch.is_empty() {
            settings.feed_watch.clone_from(&self.feed_watch);
        }
        self.auth.apply(&mut settings.auth);
        self.limits.apply(&mut settings.limits);
        self.log.apply(&mut settings.log);
        Ok(settings)
    }
}

/// Runs the accelerator until the process is stopped.
///
/// # Errors
/// A bad flag or file ([`UsageError`]) or a listener that cannot bind.
pub fn run(args: AcceleratorArgs) -> anyhow::Result<()> {
    let settings = args.settings()?;
    let limits = settings.limits.to_limits()?;
    let stdio = take_stdio(settings.inetd)?;
    let listening = match stdio {
        Some(_) => None,
        None => Some(Listening::bind(settings.listen, &limits)?),
    };
    let address = bound_address(listening.as_ref(), stdio.as_ref(), settings.listen);
    let config = settings.to_config(address)?;
    let accelerator = Accelerator::new(config).map_err(|e| UsageError(e.to_string()))?;
    let accelerator =
        Layers::open(&settings.log, &settings.auth)?.around(accelerator, &settings.log)?;
    let certificate = match (&settings.tls_cert, &settings.tls_key) {
        (Some(cert), Some(key)) => Some(Arc::new(
            ServerCertificate::load(cert, key)
                .map_err(|e| UsageError(format!("--tls-cert/--tls-key: {e}")))?,
        )),
        _ => None,
    };
    let tls = certificate
        .clone()
        .map(ServerCertificate::config)
        .transpose()
        .map_err(|e| UsageError(format!("--tls-cert/--tls-key: {e}")))?;
    let Some(listening) = listening else {
        let stdio = stdio.expect("no listener: --inetd");
        if settings.slots > 0 {
            return Err(UsageError(
                "--slots needs the listener: each inetd process serves one connection".into(),
            )
            .into());
        }
        if tls.is_some() {
            return Err(
                UsageError("--inetd serves plain HTTP; leave TLS to the listener".into()).into(),
            );
        }
        return serve_one(stdio, accelerator, limits);
    };
    let admin = AdminListener::bind(
        settings.admin_address()?,
        accelerator_summary(&settings),
        accelerator.role().shared_authenticator(),
    )?;
    let describe = settings.describe_sites().to_string();
    let reload = reload(args, settings, address, certificate);
    listening.serve(
        accelerator,
        limits,
        tls.clone(),
        reload,
        |address, accelerator| {
            let admin = admin.and_then(|admin| admin.spawn(address, Arc::new(Following(accelerator.clone()))));
            tracing::info!(listen = %address, admin = %shown(admin), sites = %describe, tls = tls.is_some(), "accelerator ready");
            let handler = accelerator.clone();
            if let Some(watching) =
                Accelerator::watch_doc_roots(&accelerator.current().role().role().config().feed, move || {
                    Some(handler.current().role().shared_role())
                })
            {
                tokio::spawn(watching);
            }
            let accelerator = accelerator.current();
            let accelerator = accelerator.role().role();
            if let Some(slots) = accelerator.slots() {
                tokio::spawn(slots.clone().run_timer(address));
            }
            tokio::spawn(accelerator.health_checks());
        },
    )
}

/// SIGHUP: the file and the flags read again and checked as at start
/// (and as `rproxy check` does), then an accelerator with the same
/// counters, slots and kept bodies.
fn reload(
    args: AcceleratorArgs,
    running: AcceleratorSettings,
    address: SocketAddr,
    certificate: Option<Arc<ServerCertificate>>,
) -> Reload<Logged<AuthGate<Accelerator>>> {
    Box::new(move |current| {
        let settings = args.settings()?;
        warn_restart_needed(&running, &settings);
        let limits = settings.limits.to_limits()?;
        let layers = Layers::open(&settings.log, &settings.auth)?;
        let config = settings.to_config(address)?;
        let accelerator = current
            .role()
            .role()
            .reconfigured(config)
            .map_err(|e| UsageError(e.to_string()))?;
        // Last, once all else is valid: a renewed certificate is presented
        // from the next handshake on. TLS itself cannot be turned on or off
        // on a bound listener.
        match (&certificate, &settings.tls_cert, &settings.tls_key) {
            (Some(certificate), Some(cert), Some(key)) => certificate
                .reload(cert, key)
                .map_err(|e| UsageError(format!("--tls-cert/--tls-key: {e}")))?,
            (None, None, None) => {}
            _ => tracing::warn!(
                key = "tls-cert",
                "SIGHUP: TLS turned on or off, which applies only at the next start"
            ),
        }
        tracing::info!(sites = %settings.describe_sites(), "accelerator reconfigured");
        // The running one's checks end with it.
        tokio::spawn(accelerator.health_checks());
        Ok((layers.around(accelerator, &settings.log)?, limits))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::accelerator::AcceleratorConfig;
    use crate::hsync::EncoderOptions;

    /// The flags on top of the defaults, as the tests below ask for them.
    impl AcceleratorArgs {
        fn encoder_options(&self) -> EncoderOptions {
            self.settings().unwrap().encoder_options()
        }

        fn config(&self, address: SocketAddr) -> Result<AcceleratorConfig, UsageError> {
            self.settings()?.to_config(address)
        }
    }

    fn args(extra: &[&str]) -> Result<AcceleratorArgs, clap::Error> {
        use clap::Parser;
        let cli = crate::cli::Cli::try_parse_from(
            ["rproxy", "accelerator"].iter().chain(extra).copied(),
        )?;
        match cli.command {
            crate::cli::Command::Accelerator(args) => Ok(args),
            _ => unreachable!(),
        }
    }

    #[test]
    fn bulk_level_sets_the_fast_stage_and_caps_its_entropy_level() {
        let default = args(&[]).unwrap().encoder_options();
        assert_eq!(
            (default.fast_zstd_level, default.entropy_zstd_level),
            (3, 1)
        );
        let fast = args(&["--bulk-level", "-1"]).unwrap().encoder_options();
        assert_eq!((fast.fast_zstd_level, fast.entropy_zstd_level), (-1, -1));
        let strong = args(&["--bulk-level", "9"]).unwrap().encoder_options();
        assert_eq!((strong.fast_zstd_level, strong.entropy_zstd_level), (9, 1));
        assert_eq!(strong.zstd_level, EncoderOptions::default().zstd_level);
        assert_eq!(
            args(&["--level", "15"])
                .unwrap()
                .encoder_options()
                .zstd_level,
            15
        );
        assert!(args(&["--level", "0"]).is_err());
        assert!(args(&["--bulk-level", "20"]).is_err());
        assert!(args(&["--bulk-level", "-8"]).is_err());
    }

    #[test]
    fn entropy_coding_adapts_unless_no_adapt() {
        let address = "127.0.0.1:8080".parse().unwrap();
        assert!(
            args(&[])
                .unwrap()
                .config(address)
                .unwrap()
                .adapt_entropy_coding
        );
        let fixed = args(&["--no-adapt"]).unwrap().config(address).unwrap();
        assert!(!fixed.adapt_entropy_coding);
    }

    #[test]
    fn spooling_defaults_to_the_temp_dir_and_1_gib_and_0_turns_it_off() {
        let address = "127.0.0.1:8080".parse().unwrap();
        let config = |extra: &[&str]| args(extra).unwrap().config(address).unwrap();
        let default = config(&[]);
        assert_eq!(default.spool_dir, std::env::temp_dir());
        assert_eq!(default.max_spool, 1 << 30);
        let set = config(&["--spool-dir", "/var/spool/rproxy", "--max-spool", "64M"]);
        assert_eq!(set.spool_dir, PathBuf::from("/var/spool/rproxy"));
        assert_eq!(set.max_spool, 64 << 20);
        assert_eq!(config(&["--max-spool", "0"]).max_spool, 0);
    }

    #[test]
    fn the_disk_tier_is_on_by_default_in_the_spool_dir_and_off_when_asked() {
        let address = "127.0.0.1:8080".parse().unwrap();
        let tier = |extra: &[&str]| args(extra).unwrap().config(address).unwrap().basis_disk;
        let default = tier(&[]).unwrap();
        assert_eq!(default.dir, std::env::temp_dir().join("rproxy-basis"));
        assert_eq!((default.budget, default.max_body), (4 << 30, 128 << 20));
        let spooled = tier(&["--spool-dir", "/var/spool/rproxy"]).unwrap();
        assert_eq!(spooled.dir, PathBuf::from("/var/spool/rproxy/rproxy-basis"));
        let set = tier(&["--basis-dir", "/srv/basis", "--basis-disk", "64G"]).unwrap();
        assert_eq!(
            (set.dir, set.budget),
            (PathBuf::from("/srv/basis"), 64 << 30)
        );
        assert_eq!(tier(&["--basis-dir", "off"]), None);
        assert_eq!(tier(&["--basis-disk", "0"]), None);
        assert_eq!(tier(&["--inetd"]), None, "a process per connection");
    }

    #[test]
    fn the_basis_store_keeps_private_bodies_only_when_asked() {
        let address = "127.0.0.1:8080".parse().unwrap();
        let config = |extra: &[&str]| args(extra).unwrap().config(address).unwrap();
        assert!(!config(&[]).basis_store_private);
        assert!(config(&["--basis-store-private"]).basis_store_private);
    }
}
