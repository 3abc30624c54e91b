//! What the client proxy counts and logs: the counters `GET /.rproxy/stats`
//! answers with ([`ClientStats`], [`StatsSnapshot`]) and the one summary
//! line each relayed request writes when its body ends ([`record`]).
//! Refusals are counted by who was at fault, as the accelerator's are.
//! Leaves out deciding anything: the request path calls in here.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use http::StatusCode;
use http::header::HeaderValue;

use super::replica::ZoneView;
use super::transfer::Report;
use crate::cache::CacheStore;
use crate::http::access_log::Note;
use crate::http::error::{ErrorKind, Refusals};
use crate::http::metrics::{Latency, millis, saved_bytes};

/// The path where the proxy answers with its counters as JSON.
pub const STATS_PATH: &str = "/.rproxy/stats";

/// A waiting request in `/.rproxy/stats`: its place, never what it asks
/// for. The stats are for anyone who can reach the proxy, and a URL's
/// query can carry another user's token; each user sees their own
/// URL on their own waiting page.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct WaitView {
    /// `parq` or `legacy`.
    pub dialect: String,
    /// Position, 1 is next.
    pub position: u32,
    /// Queue length, when known.
    pub length: Option<u32>,
    /// Estimated seconds to go, when known (never less than
    /// `next_poll_secs`).
    pub eta_secs: Option<u64>,
    /// Seconds until we ask the upstream again.
    pub next_poll_secs: u64,
    /// Seconds waited so far.
    pub waited_secs: u64,
}

/// Counters for `GET /.rproxy/stats`.
#[derive(Debug, Default)]
pub struct ClientStats {
    pub(super) requests: AtomicU64,
    pub(super) hits: AtomicU64,
    pub(super) misses: AtomicU64,
    pub(super) revalidated: AtomicU64,
    pub(super) coalesced: AtomicU64,
    pub(super) deltas: AtomicU64,
    pub(super) passed: AtomicU64,
    pub(super) stored: AtomicU64,
    pub(super) partial_stored: AtomicU64,
    pub(super) digest_failures: AtomicU64,
    pub(super) upstream_errors: AtomicU64,
    pub(super) queue_waits: AtomicU64,
    pub(super) queue_waiting: AtomicU64,
    pub(super) signature_bytes: AtomicU64,
    pub(super) memory_bases: AtomicU64,
    pub(super) upstream_bytes: AtomicU64,
    pub(super) downstream_bytes: AtomicU64,
    pub(super) tunnels: AtomicU64,
    pub(super) tunnel_bytes: AtomicU64,
    /// Every refusal the role made, by whose fault it was.
    pub(super) refusals: Refusals,
    /// The cache store's own counter.
    pub(super) cache_write_errors: Arc<AtomicU64>,
    /// The cache, for its entries, bytes and evictions (none in tests
    /// that count without one).
    pub(super) cache: Option<CacheStore>,
    /// Which basis each fetch upstream offered.
    pub(super) basis: BasisChoices,
    /// Time relays spent on the bytes on blocking threads (decoding,
    /// hashing, writing the cache), in nanoseconds.
    pub(super) decode_busy_nanos: AtomicU64,
    /// Time from a request sent upstream to its response head.
    pub(super) upstream_latency: Latency,
}

/// What kind of basis a fetch upstream offered: the URL's own entry,
/// another release of the same file (same name elsewhere), an entry
/// sharing a prefix, or none.
#[derive(Debug, Default)]
pub(super) struct BasisChoices {
    pub(super) same_url: AtomicU64,
    pub(super) same_name: AtomicU64,
    pub(super) prefix: AtomicU64,
    pub(super) none: AtomicU64,
}

impl BasisChoices {
    /// Counts the basis offered for `url`: `basis` names its entry, if any.
    pub(super) fn count(
        &self,
        url: &crate::cache::CacheKey,
        basis: Option<&crate::cache::CacheKey>,
    ) {
        let counter = match basis {
            None => &self.none,
            Some(basis) if basis == url => &self.same_url,
            Some(basis) if basis.file_name() == url.file_name() => &self.same_name,
            Some(_) => &self.prefix,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

/// The counters at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct StatsSnapshot {
    /// Requests received, stats polls left out.
    pub requests: u64,
    /// Answered from the cache (fresh, or revalidated with a 304).
    pub hits: u64,
    /// Forwarded upstream for a body.
    pub misses: u64,
    /// Stale entries revalidated upstream.
    pub revalidated: u64,
    /// Requests that waited for an identical one and were served from its
    /// entry.
    pub coalesced: u64,
    /// Responses that came as hsync streams.
    pub deltas: u64,
    /// Requests passed through uncached.
    pub passed: u64,
    /// Entries committed.
    pub stored: u64,
    /// Partial entries committed after an interrupted transfer.
    pub partial_stored: u64,
    /// Transfers that failed a digest or stream check.
    pub digest_failures: u64,
    /// Upstream unreachable or silent.
    pub upstream_errors: u64,
    /// Waits in the upstream's queue for an upload slot (one per
    /// `Retry-After`).
    pub queue_waits: u64,
    /// Requests waiting in the upstream's queue now.
    #[serde(default)]
    pub queue_waiting: u64,
    /// Bytes of basis signatures sent upstream (decoded).
    pub signature_bytes: u64,
    /// Bases offered from the memory cache (no file opened).
    #[serde(default)]
    pub memory_bases: u64,
    /// Body bytes received from upstream (coded, as on the link).
    pub upstream_bytes: u64,
    /// Body bytes sent to user agents.
    pub downstream_bytes: u64,
    /// CONNECT tunnels opened (the target connected, 200 answered).
    #[serde(default)]
    pub tunnels: u64,
    /// Bytes relayed by tunnels that ended, both ways together.
    #[serde(default)]
    pub tunnel_bytes: u64,
    /// Requests refused (a 4xx or 5xx of our own making): the sum of the
    /// four `refused_*` below.
    #[serde(default)]
    pub refused: u64,
    /// Refused as the request's fault (malformed, not allowed, a loop,
    /// `only-if-cached` with nothing stored).
    #[serde(default)]
    pub refused_client: u64,
    /// Refused as the upstream's fault (unreachable, late, an answer we
    /// cannot relay).
    #[serde(default)]
    pub refused_upstream: u64,
    /// Refused because we are full.
    #[serde(default)]
    pub refused_overload: u64,
    /// Refused as our own failure (a basis or stored body we cannot read
    /// or trust, a fetch task that ended without an answer).
    #[serde(default)]
    pub refused_proxy: u64,
    /// File-system errors while storing (a full disk, say): those
    /// responses were served but not stored.
    pub cache_write_errors: u64,
    /// Bytes on the hsync link: bodies from upstream as they came, and
    /// basis signatures sent (`upstream_bytes + signature_bytes`).
    #[serde(default)]
    pub link_bytes: u64,
    /// Bytes delivered to user agents (`downstream_bytes`).
    #[serde(default)]
    pub delivered_bytes: u64,
    /// `delivered_bytes - link_bytes`: what the cache and the deltas
    /// saved (negative while signatures cost more than they save).
    #[serde(default)]
    pub saved_bytes: i64,
    /// Entries in the cache now.
    #[serde(default)]
    pub cache_entries: u64,
    /// Bytes the cache takes now (whole 4 KiB blocks, as `du` counts).
    #[serde(default)]
    pub cache_bytes: u64,
    /// The cache's budget (`--cache-size`).
    #[serde(default)]
    pub cache_budget: u64,
    /// Entries evicted to make room.
    #[serde(default)]
    pub cache_evictions: u64,
    /// Fetches that offered the URL's own entry as the basis.
    #[serde(default)]
    pub basis_same_url: u64,
    /// Fetches that offered another release of the same file.
    #[serde(default)]
    pub basis_same_name: u64,
    /// Fetches that offered an entry sharing the longest URL prefix.
    #[serde(default)]
    pub basis_prefix: u64,
    /// Fetches that offered no basis.
    #[serde(default)]
    pub basis_none: u64,
    /// Milliseconds relays spent on the bytes on blocking threads
    /// (decoding, hashing, writing the cache).
    #[serde(default)]
    pub decode_busy_ms: u64,
    /// Response heads received from upstream.
    #[serde(default)]
    pub upstream_responses: u64,
    /// Milliseconds those took together, from sending the request.
    #[serde(default)]
    pub upstream_response_ms: u64,
}

impl ClientStats {
    pub(super) fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    /// Counts a refusal, in the total, under its fault and its reason.
    pub(super) fn refused(&self, kind: ErrorKind) {
        self.refusals.count(kind);
    }

    /// `(reason, count)` of the refusals so far, by the log's reason
    /// label (those not seen left out).
    pub fn refusal_reasons(&self) -> Vec<(&'static str, u64)> {
        self.refusals.reasons()
    }

    /// The counters now.
    pub fn snapshot(&self) -> StatsSnapshot {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let refused = self.refusals.read();
        let link_bytes = get(&self.upstream_bytes) + get(&self.signature_bytes);
        let delivered_bytes = get(&self.downstream_bytes);
        let cache = self.cache.as_ref();
        let latency = self.upstream_latency.snapshot();
        StatsSnapshot {
            requests: get(&self.requests),
            hits: get(&self.hits),
            misses: get(&self.misses),
            revalidated: get(&self.revalidated),
            coalesced: get(&self.coalesced),
            deltas: get(&self.deltas),
            passed: get(&self.passed),
            stored: get(&self.stored),
            partial_stored: get(&self.partial_stored),
            digest_failures: get(&self.digest_failures),
            upstream_errors: get(&self.upstream_errors),
            queue_waits: get(&self.queue_waits),
            queue_waiting: get(&self.queue_waiting),
            signature_bytes: get(&self.signature_bytes),
            memory_bases: get(&self.memory_bases),
            upstream_bytes: get(&self.upstream_bytes),
            downstream_bytes: get(&self.downstream_bytes),
            tunnels: get(&self.tunnels),
            tunnel_bytes: get(&self.tunnel_bytes),
            refused: refused.total,
            refused_client: refused.client,
            refused_upstream: refused.upstream,
            refused_overload: refused.overload,
            refused_proxy: refused.proxy,
            cache_write_errors: get(&self.cache_write_errors),
            link_bytes,
            delivered_bytes,
            saved_bytes: saved_bytes(delivered_bytes, link_bytes),
            cache_entries: cache.map_or(0, |store| store.len() as u64),
            cache_bytes: cache.map_or(0, CacheStore::used_bytes),
            cache_budget: cache.map_or(0, CacheStore::budget),
            cache_evictions: cache.map_or(0, CacheStore::evictions),
            basis_same_url: get(&self.basis.same_url),
            basis_same_name: get(&self.basis.same_name),
            basis_prefix: get(&self.basis.prefix),
            basis_none: get(&self.basis.none),
            decode_busy_ms: get(&self.decode_busy_nanos) / 1_000_000,
            upstream_responses: latency.count,
            upstream_response_ms: millis(latency.sum),
        }
    }

    /// The histogram of upstream response-head latencies.
    pub fn upstream_latency(&self) -> &Latency {
        &self.upstream_latency
    }

    /// The counters and the requests waiting in the upstream's queue
    /// (`queue`) as a JSON object.
    pub fn to_json(&self, waiting: &[WaitView], zones: &[ZoneView]) -> String {
        #[derive(serde::Serialize)]
        struct Stats<'a> {
            #[serde(flatten)]
            counters: StatsSnapshot,
            queue: &'a [WaitView],
            #[serde(skip_serializing_if = "<[ZoneView]>::is_empty")]
            feed: &'a [ZoneView],
        }
        let stats = Stats {
            counters: self.snapshot(),
            queue: waiting,
            feed: zones,
        };
        serde_json::to_string(&stats).expect("integers and strings serialise") + "\n"
    }
}

/// What the one log line of a relayed request says, besides the report.
pub(super) struct RequestLog {
    pub(super) url: String,
    pub(super) status: StatusCode,
    pub(super) cache: HeaderValue,
    pub(super) basis: Option<String>,
    pub(super) hsync: bool,
    pub(super) started: Instant,
    /// The access log's note for the request.
    pub(super) note: Option<Note>,
}

/// When the request arrived (a request extension).
#[derive(Clone, Copy)]
pub(super) struct Started(pub(super) Instant);

/// Marks a response whose log line is written when its body ends.
#[derive(Clone, Copy)]
pub(super) struct LoggedAtEnd;

pub(super) fn record(stats: &ClientStats, log: &RequestLog, report: &Report) {
    ClientStats::add(&stats.upstream_bytes, report.upstream_bytes);
    match &report.outcome {
        super::transfer::Outcome::Complete { stored: true } => ClientStats::add(&stats.stored, 1),
        super::transfer::Outcome::Interrupted {
            partial_stored: true,
        } => ClientStats::add(&stats.partial_stored, 1),
        super::transfer::Outcome::Corrupt { .. } => ClientStats::add(&stats.digest_failures, 1),
        _ => {}
    }
    if let Some(note) = &log.note {
        note.coding(
            if log.hsync { "hsync" } else { "identity" },
            log.basis.clone(),
        );
        note.from_upstream(report.upstream_bytes);
    }
    tracing::debug!(
        method = "GET",
        url = %log.url,
        status = log.status.as_u16(),
        cache = log.cache.to_str().unwrap_or(""),
        coding = if log.hsync { "hsync" } else { "identity" },
        basis = log.basis.as_deref().unwrap_or("-"),
        upstream_bytes = report.upstream_bytes,
        body_bytes = report.body_bytes,
        outcome = ?report.outcome,
        ms = log.started.elapsed().as_secs_f64() * 1e3,
        "relayed"
    );
}
