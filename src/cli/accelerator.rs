//! `rproxy accelerator`: flags → [`AcceleratorConfig`], then serve.

use std::net::SocketAddr;
use std::num::NonZeroU32;
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use http::HeaderValue;

use super::UsageError;
use super::auth::AuthArgs;
use super::limits::LimitArgs;
use super::serving::{serve_listener, serve_one, take_stdio};
use crate::accelerator::{Accelerator, AcceleratorConfig};
use crate::auth::AuthGate;
use crate::hsync::EncoderOptions;
use crate::inetd::Stdio;
use crate::queue::QueueConfig;

/// Flags of `rproxy accelerator`.
#[derive(Debug, Args)]
pub struct AcceleratorArgs {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:8081")]
    pub listen: SocketAddr,
    /// The origin web server, `http://host[:port]`.
    #[arg(long, default_value = "http://127.0.0.1:8080")]
    pub origin: String,
    /// Our name in Via (letters, digits, '.', ':', '_', '-'); default: the
    /// listen address.
    #[arg(long)]
    pub via_name: Option<String>,
    /// Largest origin body to encode (bytes); larger ones pass through.
    #[arg(long, default_value_t = 1 << 30)]
    pub max_encode_len: u64,
    /// zstd level for the literals of each body's first MiBs (2 MiB of
    /// zstd work without a kept basis body; with one, the basis level of
    /// 12 applies). Level 19 sends jquery.js in 0.88x of gzip -9 at about
    /// 1.5 MB/s of one core; 15 in 0.93x about five times as fast.
    #[arg(long, default_value_t = EncoderOptions::default().zstd_level, value_name = "LEVEL",
          allow_negative_numbers = true,
          value_parser = clap::value_parser!(i32).range(1..=19))]
    pub level: i32,
    /// zstd level for the literals of large bodies, past the first MiBs
    /// (which get the high levels). A window that compresses no better
    /// than half sends the next at level 1 (or this one, if lower).
    /// Negative levels (zstd's fast ones) leave literals without entropy
    /// coding always; by default the accelerator does so only while the
    /// link is faster than the coding (see --no-adapt).
    #[arg(long, default_value_t = EncoderOptions::default().fast_zstd_level, value_name = "LEVEL",
          allow_negative_numbers = true,
          value_parser = clap::value_parser!(i32).range(-7..=19))]
    pub bulk_level: i32,
    /// Entropy-code large bodies' literals always. By default, past the
    /// first 8 MiB on the wire, the accelerator drops entropy coding (zstd
    /// level -1) while the link takes bytes faster than it can code them,
    /// as `zstd --adapt` does, and keeps it while the link or the origin is
    /// what the transfer waits for. On loopback, random text then crosses
    /// at 1.00x instead of 0.75x, and about a quarter faster.
    #[arg(long)]
    pub no_adapt: bool,
    /// Largest basis signature accepted from a client (bytes, decoded);
    /// advertised in Hsync-Accept.
    #[arg(long, default_value_t = 24 << 10)]
    pub max_signature: usize,
    /// Bodies encoded at once (0: one per core). More wait for a turn, one
    /// per chunk of the origin body, so that large bodies coded together
    /// leave the CPU to cheap requests too.
    #[arg(long, default_value_t = 0)]
    pub max_encoders: usize,
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
    #[arg(long, value_name = "SIZE", default_value = "1G", value_parser = super::client::parse_size)]
    pub max_spool: u64,
    /// Memory that coded responses being streamed hold at once (64K, 256M,
    /// 1G...; 0: no bound). Each takes about six coding windows (6 MiB)
    /// while it runs, less for a body announced smaller; past this, a
    /// coded response waits for its turn, holding no thread and reading
    /// nothing from the origin, so bursts and readers that stop reading
    /// cannot take more than this (plus a few hundred KiB per connection).
    #[arg(long, value_name = "SIZE", default_value = "128M", value_parser = super::client::parse_size)]
    pub transfer_memory: u64,
    /// Seconds to connect to the origin.
    #[arg(long, default_value_t = 4)]
    pub connect_timeout: u64,
    /// Seconds for the origin's response head (504 after), and for the
    /// whole of a coded body announced at most 64 KiB long.
    #[arg(long, default_value_t = 30)]
    pub origin_timeout: u64,
    /// Memory for bodies served, kept so that a client naming one as its
    /// basis gets a delta against the body itself (bytes; 0 turns it off).
    #[arg(long, default_value_t = 256 << 20)]
    pub basis_store: usize,
    /// Largest body kept there (bytes).
    #[arg(long, default_value_t = 8 << 20)]
    pub max_stored_body: usize,
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
    #[arg(long, default_value_t = 0, value_name = "N")]
    pub slots: u32,
    /// Most requests waiting for a slot; past it, a plain 503.
    #[arg(long, default_value_t = 1000, value_name = "N")]
    pub queue_max: u32,
    /// Most of those requests one client address may hold (a PARQ request
    /// for a URL the address already waits for reuses its place); past it,
    /// a plain 503. Generous by default, since a client proxy queues for
    /// all its users from one address. 0: no cap [default: a quarter of
    /// --queue-max]
    #[arg(long, value_name = "N")]
    pub queue_per_address: Option<u32>,
    /// Seconds a free slot still waits for a queued client after the time
    /// it was told to come back (Retry-After, pollMin) or a QUEUE callback;
    /// then the next client in line that is due takes it, and the late one
    /// keeps its place and gets the next free slot when it is back.
    #[arg(long, default_value_t = 10, value_name = "SECS")]
    pub queue_hold_grace: u64,
    /// File the queue is saved to every second and reloaded from at
    /// start-up, so places survive a restart of up to 300 s.
    #[arg(long, value_name = "FILE")]
    pub queue_state: Option<PathBuf>,
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
}

/// Checks a Via pseudonym: a header value that cannot carry CR/LF or
/// separators (P-24).
pub(super) fn via_name(name: Option<&str>, listen: SocketAddr) -> Result<HeaderValue, UsageError> {
    let name = name.map_or_else(|| listen.to_string(), str::to_owned);
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

/// Runs the accelerator until the process is stopped.
///
impl AcceleratorArgs {
    /// The accelerator's settings, for one listening on `address`.
    fn config(&self, address: SocketAddr) -> Result<AcceleratorConfig, UsageError> {
        Ok(AcceleratorConfig {
            origin: self
                .origin
                .parse()
                .map_err(|_| UsageError(format!("--origin {}: not a URL", self.origin)))?,
            via_name: via_name(self.via_name.as_deref(), address)?,
            encoder: self.encoder_options(),
            adapt_entropy_coding: !self.no_adapt,
            max_encode_len: self.max_encode_len,
            max_signature_bytes: self.max_signature,
            connect_timeout: Duration::from_secs(self.connect_timeout),
            origin_timeout: Duration::from_secs(self.origin_timeout),
            basis_store_bytes: self.basis_store,
            max_stored_body: self.max_stored_body,
            basis_store_private: self.basis_store_private,
            queue: NonZeroU32::new(self.slots).map(|slots| {
                let mut queue = QueueConfig::new(slots, self.queue_max);
                if let Some(per_address) = self.queue_per_address {
                    queue.per_address_max = per_address;
                }
                queue.slot_hold_grace = Duration::from_secs(self.queue_hold_grace);
                queue
            }),
            queue_state: self.queue_state.clone(),
            max_encoders: self.max_encoders,
            spool_dir: self.spool_dir.clone().unwrap_or_else(std::env::temp_dir),
            max_spool: self.max_spool,
            transfer_memory: self.transfer_memory,
        })
    }

    /// The encoder's settings: the defaults, with `--level` and
    /// `--bulk-level`.
    fn encoder_options(&self) -> EncoderOptions {
        let defaults = EncoderOptions::default();
        EncoderOptions {
            zstd_level: self.level,
            fast_zstd_level: self.bulk_level,
            entropy_zstd_level: defaults.entropy_zstd_level.min(self.bulk_level),
            ..defaults
        }
    }
}

/// # Errors
/// A bad flag ([`UsageError`]) or a listener that cannot bind.
pub fn run(args: AcceleratorArgs) -> anyhow::Result<()> {
    let stdio = take_stdio(args.inetd)?;
    let address = stdio
        .as_ref()
        .and_then(Stdio::local_addr)
        .unwrap_or(args.listen);
    let config = args.config(address)?;
    let limits = args.limits.limits();
    let accelerator = Accelerator::new(config).map_err(|e| UsageError(e.to_string()))?;
    let accelerator = AuthGate::new(accelerator, args.auth.authenticator()?);
    let tls = match (&args.tls_cert, &args.tls_key) {
        (Some(cert), Some(key)) => Some(
            crate::tls::server_config(cert, key)
                .map_err(|e| UsageError(format!("--tls-cert/--tls-key: {e}")))?,
        ),
        _ => None,
    };
    if let Some(stdio) = stdio {
        if args.slots > 0 {
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
    }
    serve_listener(
        args.listen,
        accelerator,
        limits,
        tls.clone(),
        |address, accelerator| {
            tracing::info!(listen = %address, origin = %args.origin, tls = tls.is_some(), "accelerator ready");
            if let Some(slots) = accelerator.role().slots() {
                tokio::spawn(slots.clone().run_timer(address));
            }
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

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
        assert_eq!(default.max_spool, crate::accelerator::DEFAULT_MAX_SPOOL);
        let set = config(&["--spool-dir", "/var/spool/rproxy", "--max-spool", "64M"]);
        assert_eq!(set.spool_dir, PathBuf::from("/var/spool/rproxy"));
        assert_eq!(set.max_spool, 64 << 20);
        assert_eq!(config(&["--max-spool", "0"]).max_spool, 0);
    }

    #[test]
    fn the_basis_store_keeps_private_bodies_only_when_asked() {
        let address = "127.0.0.1:8080".parse().unwrap();
        let config = |extra: &[&str]| args(extra).unwrap().config(address).unwrap();
        assert!(!config(&[]).basis_store_private);
        assert!(config(&["--basis-store-private"]).basis_store_private);
    }
}
