//! The accelerator's settings once validated ([`AcceleratorConfig`]), and
//! why a configuration cannot be used ([`ConfigError`]). Filling them from a
//! file and flags, with their defaults, is [`crate::config`]'s job; what
//! each setting does is the role's.

use std::path::PathBuf;
use std::time::Duration;

use http::Uri;
use http::header::HeaderValue;
use http::uri::PathAndQuery;
use ipnet::IpNet;

use crate::hsync::EncoderOptions;
use crate::http::address_policy::AddressPolicy;
use crate::http::health::HealthPolicy;
use crate::http::host_pattern::HostPattern;
use crate::queue::QueueConfig;

/// One site: the names it answers to and where its bodies come from.
#[derive(Debug, Clone)]
pub struct SiteConfig {
    /// The host names routed here.
    pub names: SiteNames,
    /// Where requests go.
    pub origin: SiteOrigin,
}

/// What a site answers to.
#[derive(Debug, Clone)]
pub enum SiteNames {
    /// `--origin URL` alone: any `Host`; an absolute-form target only when
    /// it names the origin itself. The origin is sent its own authority as
    /// `Host`.
    AnyHost,
    /// A `[[site]]`'s `names`: requests whose host matches one, by their
    /// absolute-form authority or `Host`. The origin is sent the host the
    /// client asked for, as a virtual host expects.
    Listed(Vec<HostPattern>),
}

/// Where a site's requests go.
#[derive(Debug, Clone)]
pub enum SiteOrigin {
    /// One origin server, `http://host[:port]` or `https://host[:port]`.
    Server {
        /// Its scheme and authority.
        url: Uri,
        /// Trust these (PEM) instead of the system's roots for `https://`.
        ca_file: Option<PathBuf>,
        /// Checked every `health_interval` when given (the active health
        /// check); requests alone tell otherwise.
        health_path: Option<PathAndQuery>,
    },
    /// Parent mode: the URL's own host, for authenticated client proxies
    /// (the far-side proxy of the 1999 set-up). Not health-checked: its
    /// hosts are whoever the URLs name.
    Parent(ParentPolicy),
}

/// What a parent-mode site may fetch.
#[derive(Debug, Clone)]
pub struct ParentPolicy {
    /// Hosts that may be asked for.
    pub hosts: Vec<HostPattern>,
    /// Ports that may be asked for.
    pub ports: Vec<u16>,
    /// The addresses connections may go to: public ones, and the private
    /// ranges listed (SSRF guard, A-7).
    pub addresses: AddressPolicy,
    /// Trust these (PEM) beside the system's roots for `https://`, when given.
    pub ca_file: Option<PathBuf>,
}

impl SiteConfig {
    /// The `--origin URL` shorthand: one origin server for any `Host`.
    pub fn any_host(url: Uri) -> SiteConfig {
        SiteConfig {
            names: SiteNames::AnyHost,
            origin: SiteOrigin::Server {
                url,
                ca_file: None,
                health_path: None,
            },
        }
    }
}

/// Addresses whose `Forwarded` and `X-Forwarded-*` are believed and
/// appended to; from anyone else they are replaced.
pub type TrustedForwarders = Vec<IpNet>;

/// Accelerator settings, validated.
#[derive(Debug, Clone)]
pub struct AcceleratorConfig {
    /// The sites, tried in order: the first whose names match serves.
    pub sites: Vec<SiteConfig>,
    /// Previous hops whose `Forwarded` and `X-Forwarded-*` are kept.
    pub trusted_forwarders: TrustedForwarders,
    /// Our name in `Via`.
    pub via_name: HeaderValue,
    /// Encoder settings.
    pub encoder: EncoderOptions,
    /// Past the high-level budget, entropy-code literals only while that
    /// is faster than sending them without (see [`super::pace`]); false
    /// codes them always.
    pub adapt_entropy_coding: bool,
    /// Largest origin body encoded (bytes); larger ones pass through.
    pub max_encode_len: u64,
    /// Largest basis signature accepted from a request (bytes, decoded).
    pub max_signature_bytes: usize,
    /// Largest basis signature accepted as a GET's body
    /// (`Hsync-Signature-Length`; bytes, 0: none): a large body's
    /// signature at blocks fine enough to find small edits.
    pub max_body_signature_bytes: usize,
    /// Time to connect to the origin.
    pub connect_timeout: Duration,
    /// Time for the origin's response head.
    pub origin_timeout: Duration,
    /// When an origin that fails is marked down, and for how long
    /// ([`crate::http::health`]).
    pub health: HealthPolicy,
    /// Time between two checks of a site's `health_path`.
    pub health_interval: Duration,
    /// Time without a byte moving either way before a parent-mode site's
    /// CONNECT tunnel is closed: the listener's `idle-timeout`.
    pub tunnel_idle_timeout: Duration,
    /// Memory for bodies served, kept as future bases (bytes; 0: none).
    pub basis_store_bytes: usize,
    /// Largest body kept there (bytes).
    pub max_stored_body: usize,
    /// The basis store's disk tier, for bodies over `max_stored_body`
    /// (`None`: off).
    pub basis_disk: Option<super::basis_store::DiskTier>,
    /// The basis store shared with other accelerators on Redis (`None`:
    /// none).
    pub basis_shared: Option<super::basis_store::SharedTier>,
    /// Keep every coded body there, including `private`, `no-store` and
    /// cookie-setting responses and answers to requests with credentials.
    /// Off by default: the store is then an oracle, since a client naming
    /// a body's hash learns from the codec whether someone was served it
    /// (D-B3, see [`super::basis_store::shareable`]).
    pub basis_store_private: bool,
    /// Upload slots and their queue (issue 5); `None` serves every request
    /// at once.
    pub queue: Option<QueueConfig>,
    /// Where the queue is saved every second and reloaded at start-up, so
    /// places survive a restart.
    pub queue_state: Option<std::path::PathBuf>,
    /// The change feed (`--feed-state`); `None`: no feed.
    pub feed: Option<FeedConfig>,
    /// Encoders that run at once (0: one per core). The others wait for
    /// a turn, one per chunk of the origin body, so a burst of large bodies
    /// leaves the async workers, and cheap requests, their share of the CPU
    /// (D-S6).
    pub max_encoders: usize,
    /// Where a coded body is parked for a client that stopped reading
    /// (see [`crate::http::spool`]).
    pub spool_dir: std::path::PathBuf,
    /// Most bytes of a coded body parked ahead of its reader (0: never
    /// parked; the encoder then waits for the reader, holding its state).
    pub max_spool: u64,
    /// Disk that all parked bodies take together (bytes); past it, a
    /// coded body whose client stops reading waits in memory.
    pub max_spool_total: u64,
    /// Memory that streamed codings hold at once (bytes; 0: no bound):
    /// past it, a coded response waits for its turn before reading its
    /// origin body (see [`crate::http::transfer_memory`]).
    pub transfer_memory: u64,
}

/// The change feed's settings ([`crate::feed`]).
#[derive(Debug, Clone)]
pub struct FeedConfig {
    /// Where each site's log is kept.
    pub dir: PathBuf,
    /// How long (and how many) updates each log keeps.
    pub retention: crate::feed::Retention,
    /// Document roots watched, each with the URL its files are served at.
    pub watches: Vec<(PathBuf, String)>,
    /// Time between two walks of a watched root.
    pub watch_interval: std::time::Duration,
}

/// Why the configuration cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The origin URL is not `http[s]://host[:port]`.
    #[error("origin {origin} must be http://host[:port] or https://host[:port] (no path)")]
    BadOrigin {
        /// The URL given.
        origin: String,
    },
    /// No site at all.
    #[error("no site: give --origin or [[site]] tables")]
    NoSite,
    /// TLS to an origin cannot be set up.
    #[error("origin TLS: {0}")]
    Tls(#[from] crate::http::tls::TlsError),
    /// The change feed's directory cannot be made.
    #[error("feed-state {}: {error}", dir.display())]
    Feed {
        /// The directory.
        dir: PathBuf,
        /// Why.
        error: std::io::Error,
    },
}
