//! What the admin listener shows of a role: [`Figures`], one shape for
//! both roles, read from the role's own counters ([`Source`]) at the
//! moment it is asked. The counters stay where the request path keeps
//! them (`client_proxy::ClientStats`, `accelerator::Stats`); nothing here
//! counts, so `/metrics`, the status page and `/.rproxy/stats` always
//! agree.
//!
//! Leaves out how the figures are shown (`metrics.rs`, `page.rs`) and
//! kept over time (`history.rs`).
//!
//! Main types: [`Figures`], [`Source`].

use std::time::Duration;

use crate::accelerator::Accelerator;
use crate::cache::PurgeReport;
use crate::client_proxy::ClientProxy;
use crate::config::Role;
use crate::http::error::RefusalCounts;
use crate::http::health::HealthView;
use crate::http::metrics::LatencySnapshot;
use crate::http::transfer_memory::MemoryFigures;

/// A role whose counters the admin listener reads.
pub trait Source: Send + Sync + 'static {
    /// The counters now.
    fn figures(&self) -> Figures;

    /// The counters as `/.rproxy/stats` answers with them (JSON).
    fn stats_json(&self) -> String;

    /// Removes every cached entry whose URL starts with `url_prefix` (all
    /// of them for an empty one), safe while requests run; `None` for a
    /// role without a cache. Blocking: unlinks and fsyncs.
    fn purge(&self, url_prefix: &str) -> Option<PurgeReport> {
        let _ = url_prefix;
        None
    }

    /// A change feed submission (`POST /feed`): `urls`, one per line,
    /// changed at their origin. `None` for a role that takes none; else
    /// the status and JSON to answer.
    fn submit(&self, urls: String) -> Submission<'_> {
        let _ = urls;
        Box::pin(async { None })
    }
}

/// What [`Source::submit`] answers, when it takes submissions.
pub type Submission<'a> = std::pin::Pin<
    Box<dyn std::future::Future<Output = Option<(http::StatusCode, String)>> + Send + 'a>,
>;

/// How requests ended, by outcome (a request may count under more than
/// one: a delta is a miss too, a revalidation a hit).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Outcomes {
    /// Served from the cache (fresh, or revalidated with a 304).
    pub hit: u64,
    /// Forwarded upstream for a body.
    pub miss: u64,
    /// Came as (or, at the accelerator, went as) an hsync stream.
    pub delta: u64,
    /// Stale entries revalidated upstream.
    pub revalidated: u64,
    /// Passed through uncached or uncoded.
    pub pass: u64,
    /// Waited for an identical request and were served from its entry.
    pub coalesced: u64,
}

impl Outcomes {
    /// `(label, count)` in the order the metrics and the page list them.
    pub fn rows(&self) -> [(&'static str, u64); 6] {
        [
            ("hit", self.hit),
            ("miss", self.miss),
            ("delta", self.delta),
            ("revalidated", self.revalidated),
            ("pass", self.pass),
            ("coalesced", self.coalesced),
        ]
    }
}

/// The client proxy's disk cache.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheFigures {
    /// Entries now.
    pub entries: u64,
    /// Bytes they take (whole blocks).
    pub bytes: u64,
    /// The budget.
    pub budget: u64,
    /// Entries evicted to make room.
    pub evictions: u64,
    /// Writes that failed (a full disk, say).
    pub write_errors: u64,
    /// Entries committed.
    pub stored: u64,
}

/// Which basis the client proxy's fetches offered.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BasisFigures {
    /// The URL's own entry.
    pub same_url: u64,
    /// Another release of the same file.
    pub same_name: u64,
    /// The entry sharing the longest URL prefix.
    pub prefix: u64,
    /// None.
    pub none: u64,
}

impl BasisFigures {
    /// `(label, count)`.
    pub fn rows(&self) -> [(&'static str, u64); 4] {
        [
            ("same_url", self.same_url),
            ("same_name", self.same_name),
            ("prefix", self.prefix),
            ("none", self.none),
        ]
    }
}

/// A role's counters at one moment, the same shape for both roles; what
/// only one role has is `None` (or zero) for the other.
#[derive(Debug, Clone, PartialEq)]
pub struct Figures {
    /// Whose figures they are.
    pub role: Role,
    /// Requests received (stats polls left out).
    pub requests: u64,
    /// How they ended.
    pub outcomes: Outcomes,
    /// Refusals by fault.
    pub refused: RefusalCounts,
    /// Refusals by reason (the log's label), those seen so far.
    pub refused_reasons: Vec<(&'static str, u64)>,
    /// Bytes on the hsync link (both directions as each role counts them).
    pub link_bytes: u64,
    /// Bytes delivered: to user agents (client proxy), or what the
    /// origins sent (accelerator).
    pub delivered_bytes: u64,
    /// Basis signature bytes sent upstream (client proxy; part of
    /// `link_bytes`).
    pub signature_bytes: Option<u64>,
    /// The disk cache (client proxy).
    pub cache: Option<CacheFigures>,
    /// Basis choices (client proxy).
    pub basis: Option<BasisFigures>,
    /// Transfers that failed a digest or stream check (client proxy).
    pub digest_failures: Option<u64>,
    /// Requests waiting in a queue now: for an upload slot here
    /// (accelerator), or in the upstream's queue (client proxy).
    pub queue_length: u64,
    /// Answers from a queue: the accelerator's 503s for a slot; the
    /// client proxy's waits in the upstream's queue (one per
    /// `Retry-After`).
    pub queue_answers: u64,
    /// Codings that waited for an encoder's turn, and how long together
    /// (accelerator).
    pub encoder_waits: Option<(u64, Duration)>,
    /// Time encoders spent coding (accelerator).
    pub encoder_busy: Option<Duration>,
    /// Lookups in the shared basis store that failed or timed out, the
    /// bodies coded without the held body (accelerator).
    pub basis_fallbacks: Option<u64>,
    /// Time relays spent decoding, hashing and storing (client proxy).
    pub decoder_busy: Option<Duration>,
    /// Upstream unreachable, silent or unusable (client proxy; the
    /// accelerator counts these as upstream-fault refusals).
    pub upstream_errors: Option<u64>,
    /// Time to the upstream's (origin's) response head.
    pub upstream_latency: LatencySnapshot,
    /// CONNECT tunnels opened.
    pub tunnels: u64,
    /// Bytes relayed by tunnels that ended.
    pub tunnel_bytes: u64,
    /// The health of each checked origin (accelerator) or upstream proxy
    /// (client proxy), now.
    pub health: Vec<HealthView>,
    /// The change feed: each site's log (accelerator) or each zone
    /// replicated (client proxy).
    pub feed: Vec<FeedFigures>,
    /// What streamed transfers' shares of `transfer-memory` hold now.
    pub transfer_memory: MemoryFigures,
}

/// One change feed log, as the metrics show it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FeedFigures {
    /// The site's host (accelerator) or the zone's URL (client proxy):
    /// configured, never a user's.
    pub zone: String,
    /// The last CSN committed, or caught up to.
    pub csn: u64,
    /// Updates the log holds.
    pub entries: u64,
    /// Pulls answered (accelerator) or made (client proxy).
    pub pulls: u64,
    /// Bodies prefetched, and their link bytes (client proxy).
    pub prefetched: u64,
    /// The link bytes of those prefetches.
    pub prefetch_bytes: u64,
}

impl Figures {
    /// `delivered_bytes - link_bytes`.
    pub fn saved_bytes(&self) -> i64 {
        crate::http::metrics::saved_bytes(self.delivered_bytes, self.link_bytes)
    }
}

impl Source for ClientProxy {
    fn purge(&self, url_prefix: &str) -> Option<PurgeReport> {
        Some(self.store().purge_prefix(url_prefix))
    }

    fn submit(&self, urls: String) -> Submission<'_> {
        Box::pin(async move { Some(self.submit_upstream(&urls).await) })
    }

    fn figures(&self) -> Figures {
        let stats = self.stats().snapshot();
        Figures {
            role: Role::Client,
            requests: stats.requests,
            outcomes: Outcomes {
                hit: stats.hits,
                miss: stats.misses,
                delta: stats.deltas,
                revalidated: stats.revalidated,
                pass: stats.passed,
                coalesced: stats.coalesced,
            },
            refused: RefusalCounts {
                total: stats.refused,
                client: stats.refused_client,
                upstream: stats.refused_upstream,
                overload: stats.refused_overload,
                proxy: stats.refused_proxy,
            },
            refused_reasons: self.stats().refusal_reasons(),
            link_bytes: stats.link_bytes,
            delivered_bytes: stats.delivered_bytes,
            signature_bytes: Some(stats.signature_bytes),
            cache: Some(CacheFigures {
                entries: stats.cache_entries,
                bytes: stats.cache_bytes,
                budget: stats.cache_budget,
                evictions: stats.cache_evictions,
                write_errors: stats.cache_write_errors,
                stored: stats.stored,
            }),
            basis: Some(BasisFigures {
                same_url: stats.basis_same_url,
                same_name: stats.basis_same_name,
                prefix: stats.basis_prefix,
                none: stats.basis_none,
            }),
            digest_failures: Some(stats.digest_failures),
            queue_length: stats.queue_waiting,
            queue_answers: stats.queue_waits,
            encoder_waits: None,
            encoder_busy: None,
            basis_fallbacks: None,
            decoder_busy: Some(Duration::from_millis(stats.decode_busy_ms)),
            upstream_errors: Some(stats.upstream_errors),
            upstream_latency: self.stats().upstream_latency().snapshot(),
            tunnels: stats.tunnels,
            tunnel_bytes: stats.tunnel_bytes,
            health: self.health_views(),
            feed: self.feed_figures(),
            transfer_memory: self.transfer_memory_figures(),
        }
    }

    fn stats_json(&self) -> String {
        self.stats_json()
    }
}

impl Source for Accelerator {
    fn submit(&self, urls: String) -> Submission<'_> {
        Box::pin(async move { Some(self.submit_urls(&urls).await) })
    }

    fn figures(&self) -> Figures {
        let stats = self.stats().snapshot();
        let timings = stats.timings.unwrap_or_default();
        Figures {
            role: Role::Accelerator,
            requests: stats.requests,
            outcomes: Outcomes {
                delta: stats.coded,
                pass: stats.passed,
                ..Outcomes::default()
            },
            refused: RefusalCounts {
                total: stats.refused,
                client: stats.refused_client,
                upstream: stats.refused_upstream,
                overload: stats.refused_overload,
                proxy: stats.refused_proxy,
            },
            refused_reasons: self.stats().refusal_reasons(),
            link_bytes: stats.link_bytes,
            delivered_bytes: stats.delivered_bytes,
            signature_bytes: None,
            cache: None,
            basis: None,
            digest_failures: None,
            queue_length: self.slots().map_or(0, |slots| slots.queued() as u64),
            queue_answers: stats.queued,
            encoder_waits: Some((
                stats.encoder_waits,
                Duration::from_millis(timings.encoder_wait_ms),
            )),
            encoder_busy: Some(Duration::from_millis(timings.encode_busy_ms)),
            basis_fallbacks: Some(stats.basis_fallbacks),
            decoder_busy: None,
            upstream_errors: None,
            upstream_latency: self.stats().origin_latency().snapshot(),
            tunnels: stats.tunnels,
            tunnel_bytes: stats.tunnel_bytes,
            health: self.health_views(),
            feed: self.feed_figures(),
            transfer_memory: self.transfer_memory_figures(),
        }
    }

    fn stats_json(&self) -> String {
        self.stats().to_admin_json()
    }
}
