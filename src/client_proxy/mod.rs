//! The client proxy: a caching forward proxy (absolute-form requests, as
//! `curl -x` and `http_proxy=` send them) and gateway (origin-form requests)
//! whose upstream is the accelerator — or any plain HTTP server, which makes
//! it an ordinary caching proxy.
//!
//! A GET goes through two questions, kept apart as DESIGN.md says:
//! *may a stored response be served without asking upstream?* (RFC 9111
//! freshness, [`crate::cache::freshness`]) and, when not, *which cached body is
//! the basis?* The exact URL's entry (fresh or stale, complete or partial)
//! is the best basis; otherwise the longest-prefix entry of the same
//! origin ([`crate::cache::select_basis`]). The request goes upstream with
//! the hsync offer and, for a stale entry, its validators, so a changed
//! body comes back as a delta and an unchanged one as a 304 in the same
//! round trip. The answer is rebuilt and checked while it streams to the
//! user agent ([`transfer`]) and committed only after every check passed.
//! Identical concurrent misses share one fetch ([`coalesce`]).
//!
//! Everything else (HEAD misses, other methods, uncacheable answers) passes
//! through, streaming; a successful unsafe method invalidates the entry
//! (RFC 9111 §4.4).
//!
//! When the upstream's upload slots are busy, requests wait in its queue
//! ([`queue_wait`]).
//!
//! Leaves out: CONNECT tunnels (501).
//!
//! Main types: [`ClientProxy`], [`ClientConfig`], [`ClientStats`].

mod cache_writer;
pub mod cached_body;
pub mod coalesce;
pub mod hot;
pub mod queue_wait;
mod stats;
pub mod transfer;
pub mod upstream;

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::request::Parts;
use http::uri::{Authority, Scheme};
use http::{Method, Request, Response, StatusCode, Uri};
use http_body_util::{BodyExt, Empty};
use hyper::body::Incoming;

use crate::cache::freshness::{self, Age, CacheControl, CacheStatus, Forward, Reuse, Storability};
use crate::cache::{CacheKey, CacheScope, CacheStore, Completeness, Entry, NewEntry};
use crate::hsync::{DecodeLimits, FileBasis};
use crate::http::headers::{
    HSYNC_ACCEPT, HSYNC_BASIS, HSYNC_CODING, HSYNC_SIGNATURE, Hop, add_via, answer_at_this_hop,
    byte_sequence, check_response_head, max_forwards, remove_hsync_coding, strip_hop_by_hop,
    via_names_hop,
};
use crate::http::server::{
    BodyError, Handler, ProxyBody, counted, malformed_request_body, text_response,
};
use crate::http::spool::SpoolDisk;
use crate::http::transfer_memory::TransferMemory;
use crate::http::upstream_guard::ExchangeCheck;
use cached_body::CachedBody;
use coalesce::{InFlight, Role};
use hot::{HotCache, HotEntry};
use queue_wait::{MAX_LISTED_WAITS, QueueWaitConfig, QueueWaits};
use transfer::{ClientBasis, Coding, OriginDigest, Relay, Relayed, Report, StoreTarget, full};
use upstream::Upstream;

pub use stats::{ClientStats, STATS_PATH, StatsSnapshot};
use stats::{LoggedAtEnd, RequestLog, Started, record};

/// What `OPTIONS` answered here says we pass on.
const FORWARDED_METHODS: &str = "GET, HEAD, POST, PUT, DELETE, PATCH, OPTIONS, TRACE";

/// The name this cache gives itself in `Cache-Status` (RFC 9211).
pub const CACHE_NAME: &str = "rproxy";

/// Client proxy settings, validated.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// The upstream, `http://host[:port]`: the accelerator, or any server.
    pub upstream: Uri,
    /// Our name in `Via`.
    pub via_name: HeaderValue,
    /// Whether several users share this cache (the default) or it is one
    /// user's private cache (then `private` responses are stored and used
    /// as bases).
    pub scope: CacheScope,
    /// Signature bytes sent upstream while the upstream's `Hsync-Accept`
    /// is unknown (decoded; 4,608 is 6 KiB of header).
    pub default_signature_bytes: usize,
    /// Signature bytes never exceeded, whatever the upstream advertises.
    pub max_signature_bytes: usize,
    /// Time to connect upstream.
    pub connect_timeout: Duration,
    /// Time for the upstream's response head (504 after).
    pub upstream_timeout: Duration,
    /// Longest a request waits for an identical one in flight.
    pub lock_timeout: Duration,
    /// Largest body rebuilt from an hsync stream (bytes).
    pub max_object_bytes: u64,
    /// Memory for small entries served often (bytes; 0 turns it off).
    pub memory_cache_bytes: usize,
    /// `Proxy-Authorization` for the upstream, when it wants credentials.
    pub upstream_credentials: Option<HeaderValue>,
    /// TLS for an `https://` upstream (trust roots, ALPN).
    pub upstream_tls: Option<Arc<rustls::ClientConfig>>,
    /// Waits in the upstream's queue for an upload slot.
    pub queue: QueueWaitConfig,
    /// Memory that relays of large bodies hold at once (bytes; 0: no
    /// bound); past it, a relay waits before reading more of its body
    /// (see [`crate::http::transfer_memory`]).
    pub transfer_memory: u64,
    /// Disk that the bodies spooled for user agents that stopped reading
    /// take together, in the cache's `tmp/` (bytes); past it, a relay
    /// waits for its user agent in memory.
    pub max_spool_total: u64,
}

/// Why the configuration cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The upstream URL is not `http(s)://host[:port]`.
    #[error("upstream {upstream} must be http://host[:port] or https://host[:port] (no path)")]
    BadUpstream {
        /// The URL given.
        upstream: String,
    },
    /// An `https://` upstream without a TLS configuration.
    #[error("an https:// upstream needs a TLS configuration")]
    NoTls,
    /// The upstream host cannot be a TLS server name.
    #[error("{0}")]
    TlsName(String),
}

/// Where a request is going.
struct Target {
    /// The absolute URL (the cache key's source).
    url: Uri,
    /// Absolute-form request (forward proxy), else gateway.
    forward: bool,
}

/// The basis sent upstream.
struct BasisOffer {
    key: CacheKey,
    /// The body the signature describes, even if the entry is replaced
    /// meanwhile (D-A7).
    body: BasisBody,
    /// `Hsync-Basis`.
    name: HeaderValue,
    /// `Hsync-Signature`, cut to the budget.
    signature: HeaderValue,
    /// Its length, decoded.
    signature_len: usize,
}

/// Which try of a fetch this is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Attempt {
    /// With the basis chosen for it.
    First,
    /// After the first one's rebuilt body failed its checks.
    WithoutBasis,
}

/// Where a basis's bytes are.
enum BasisBody {
    /// The entry's body file, kept open.
    File(std::fs::File),
    /// The memory cache's copy.
    Memory(Bytes),
}

/// The client proxy role.
pub struct ClientProxy {
    config: ClientConfig,
    upstream_authority: Authority,
    /// `http` or `https`: gateway URLs (and their cache keys) take it.
    upstream_scheme: Scheme,
    store: CacheStore,
    upstream: Upstream,
    in_flight: InFlight,
    hot: HotCache,
    stats: Arc<ClientStats>,
    waits: Arc<QueueWaits>,
    /// What relays of large bodies hold at once.
    memory: TransferMemory,
    /// What the bodies spooled for stalled user agents take on disk.
    spool_disk: SpoolDisk,
}

impl ClientProxy {
    /// Builds the proxy over an opened cache.
    ///
    /// # Errors
    /// [`ConfigError::BadUpstream`] for anything but `http://host[:port]`.
    pub fn new(config: ClientConfig, store: CacheStore) -> Result<ClientProxy, ConfigError> {
        let bad = || ConfigError::BadUpstream {
            upstream: config.upstream.to_string(),
        };
        let upstream_scheme = config.upstream.scheme().cloned().ok_or_else(bad)?;
        if !(upstream_scheme == Scheme::HTTP || upstream_scheme == Scheme::HTTPS)
            || config
                .upstream
                .path_and_query()
                .is_some_and(|p| p.as_str() != "/")
        {
            return Err(bad());
        }
        let upstream_authority = config.upstream.authority().cloned().ok_or_else(bad)?;
        let tls = match (&upstream_scheme, &config.upstream_tls) {
            (s, Some(tls)) if *s == Scheme::HTTPS => Some(tls.clone()),
            (s, None) if *s == Scheme::HTTPS => return Err(ConfigError::NoTls),
            _ => None,
        };
        let upstream = Upstream::new(upstream_authority.clone(), tls, config.connect_timeout)
            .map_err(ConfigError::TlsName)?;
        let stats = Arc::new(ClientStats {
            cache_write_errors: store.write_errors(),
            ..ClientStats::default()
        });
        Ok(ClientProxy {
            memory: TransferMemory::new(config.transfer_memory),
            spool_disk: SpoolDisk::new(config.max_spool_total),
            upstream,
            in_flight: InFlight::new(config.lock_timeout),
            hot: HotCache::new(config.memory_cache_bytes),
            waits: Arc::new(QueueWaits::new(config.queue.clone(), stats.clone())),
            stats,
            upstream_authority,
            upstream_scheme,
            store,
            config,
        })
    }

    /// The counters.
    pub fn stats(&self) -> &ClientStats {
        &self.stats
    }

    /// The cache.
    pub fn store(&self) -> &CacheStore {
        &self.store
    }

    fn is_shared(&self) -> bool {
        self.config.scope == CacheScope::Shared
    }

    /// A stored response's age and freshness lifetime at `now`, as this
    /// cache (shared or private) counts them.
    fn age_of(&self, status: StatusCode, stored: &HeaderMap, stored_at: u64, now: u64) -> Age {
        Age::of_stored(status, stored, stored_at, now, self.is_shared())
    }

    /// The absolute URL of a request, or why it cannot be served (P-12).
    fn target(&self, request: &Request<Incoming>) -> Result<Target, String> {
        let uri = request.uri();
        if uri.authority().is_some() {
            if uri.scheme() != Some(&Scheme::HTTP) {
                return Err(format!("only http:// URLs can be proxied, not {uri}"));
            }
            if uri.authority().is_some_and(|a| a.as_str().contains('@')) {
                return Err("a URL with userinfo is refused".into());
            }
            let path = uri.path_and_query().map_or("/", |p| p.as_str());
            let url = Uri::builder()
                .scheme(Scheme::HTTP)
                .authority(uri.authority().expect("checked").clone())
                .path_and_query(path)
                .build()
                .map_err(|e| format!("bad URL {uri}: {e}"))?;
            return Ok(Target { url, forward: true });
        }
        match uri.path_and_query() {
            Some(path) if path.as_str().starts_with('/') => {
                let url = Uri::builder()
                    .scheme(self.upstream_scheme.clone())
                    .authority(self.upstream_authority.clone())
                    .path_and_query(path.clone())
                    .build()
                    .map_err(|e| format!("bad target {uri}: {e}"))?;
                Ok(Target {
                    url,
                    forward: false,
                })
            }
            _ => Err(format!("request target {uri} is neither a path nor a URL")),
        }
    }

    async fn proxy(self: Arc<Self>, request: Request<Incoming>) -> Response<ProxyBody> {
        let started = Instant::now();
        ClientStats::add(&self.stats.requests, 1);
        if request.method() == Method::GET
            && request.uri().authority().is_none()
            && request.uri().path() == STATS_PATH
        {
            let waiting = self.waits.views(MAX_LISTED_WAITS);
            let mut response = Response::new(full(self.stats.to_json(&waiting)));
            response.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
            return response;
        }
        if request.method() == Method::CONNECT {
            return error(
                StatusCode::NOT_IMPLEMENTED,
                "this proxy does not tunnel (CONNECT); use http:// URLs".into(),
            );
        }
        let target = match self.target(&request) {
            Ok(target) => target,
            Err(message) => return error(StatusCode::BAD_REQUEST, message),
        };
        if via_names_hop(request.headers(), self.config.via_name.as_bytes()) {
            return error(
                StatusCode::LOOP_DETECTED,
                format!(
                    "request already passed {}",
                    self.config.via_name.to_str().unwrap_or("us")
                ),
            );
        }
        let mut request = request;
        let method = request.method().clone();
        if max_forwards(&method, request.headers_mut()) == Hop::Answer {
            // RFC 9110 §7.6.2: this hop is the final recipient (P-25).
            return answer_at_this_hop(&request, FORWARDED_METHODS).map(full);
        }
        let key = match CacheKey::parse(&target.url.to_string()) {
            Ok(key) => key,
            Err(e) => {
                return error(
                    StatusCode::BAD_REQUEST,
                    format!("cannot cache {}: {e}", target.url),
                );
            }
        };
        let (mut parts, body) = request.into_parts();
        if let Err(e) = strip_hop_by_hop(&mut parts.headers) {
            return error(StatusCode::BAD_REQUEST, e.to_string());
        }
        // Hsync headers from the user agent are never ours to trust, and
        // it cannot take the coding from us: we offer it ourselves, where
        // we decode it.
        for name in [HSYNC_BASIS, HSYNC_SIGNATURE, HSYNC_ACCEPT] {
            parts.headers.remove(name);
        }
        remove_hsync_coding(&mut parts.headers);
        let method = parts.method.clone();
        let url = target.url.to_string();
        parts.extensions.insert(Started(started));
        let response = match method {
            Method::GET | Method::HEAD => self.clone().cacheable(parts, body, target, key).await,
            _ => self.clone().pass_unsafe(parts, body, target, key).await,
        };
        let logged = response.extensions().get::<LoggedAtEnd>().is_some();
        let (parts, body) = response.into_parts();
        let status = parts.status.as_u16();
        let cache = parts
            .headers
            .get(CACHE_STATUS)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("-")
            .to_owned();
        // Counted (and logged) when the body is over, with the bytes that
        // really went: a user agent that left early got only those.
        let stats = self.stats.clone();
        let body = counted(body, move |bytes, complete| {
            ClientStats::add(&stats.downstream_bytes, bytes);
            if !logged {
                tracing::info!(
                    %method, %url, status, %cache, downstream_bytes = bytes, complete,
                    ms = started.elapsed().as_secs_f64() * 1e3, "request"
                );
            }
        });
        Response::from_parts(parts, body)
    }

    /// GET and HEAD: from the cache when fresh, else upstream.
    async fn cacheable(
        self: Arc<Self>,
        parts: Parts,
        body: Incoming,
        target: Target,
        key: CacheKey,
    ) -> Response<ProxyBody> {
        let request_cc = CacheControl::parse_request(&parts.headers);
        let mut stale = match self.lookup(&key, &parts).await {
            Lookup::Fresh(response) => return response,
            Lookup::Stale(entry) => Some(entry),
            Lookup::Miss => None,
        };
        if request_cc.only_if_cached {
            return error(
                StatusCode::GATEWAY_TIMEOUT,
                "only-if-cached, and no fresh entry is stored".into(),
            );
        }
        if parts.method == Method::HEAD {
            return self.pass(parts, body, target).await;
        }
        let navigation = queue_wait::page::is_navigation(&parts.method, &parts.headers);
        if navigation && let Some(response) = self.attach_to_wait(&key, &parts.headers).await {
            return response;
        }
        let leader = match self.in_flight.join(key.digest()) {
            Role::Leader(leader) => Some(leader),
            Role::Follower(follower) => {
                let led = follower.wait().await;
                match self.lookup(&key, &parts).await {
                    Lookup::Fresh(mut response) if led => {
                        ClientStats::add(&self.stats.coalesced, 1);
                        let collapsed = CacheStatus {
                            collapsed: true,
                            ..CacheStatus::hit()
                        };
                        response.headers_mut().insert(
                            CACHE_STATUS,
                            freshness::cache_status(CACHE_NAME, &collapsed),
                        );
                        return response;
                    }
                    Lookup::Fresh(response) => return response,
                    Lookup::Stale(entry) => stale = Some(entry),
                    Lookup::Miss => stale = None,
                }
                None
            }
        };
        if navigation {
            return self
                .fetch_navigation(parts, target, key, stale, leader)
                .await;
        }
        self.fetch(parts, target, key, stale, leader).await
    }

    /// The stored response for a request: fresh (already a response),
    /// stale (the entry, to revalidate and to use as basis), or none.
    async fn lookup(&self, key: &CacheKey, parts: &Parts) -> Lookup {
        if let Some(response) = self.hot_hit(key, parts) {
            ClientStats::add(&self.stats.hits, 1);
            return Lookup::Fresh(response);
        }
        // Nothing stored for the URL (the index is in memory): no thread hop.
        if self.store.lookup(key).is_none() && self.store.variants(key).is_empty() {
            return Lookup::Miss;
        }
        let store = self.store.clone();
        let key = key.clone();
        let headers = parts.headers.clone();
        let found = tokio::task::spawn_blocking(move || find_entry(&store, &key, &headers))
            .await
            .ok()
            .flatten();
        let Some(entry) = found else {
            return Lookup::Miss;
        };
        if entry.meta.completeness != Completeness::Complete {
            return Lookup::Stale(entry);
        }
        let stored = stored_headers(&entry);
        let status = StatusCode::from_u16(entry.meta.status).unwrap_or(StatusCode::OK);
        let age = self.age_of(status, &stored, entry.meta.stored_at, unix_now());
        match freshness::reuse(
            &parts.headers,
            &stored,
            age.current,
            age.lifetime,
            self.is_shared(),
        ) {
            Reuse::Serve => {
                match self
                    .respond_from_entry(entry, stored, age.current, parts, CacheStatus::hit(), true)
                    .await
                {
                    Ok(response) => {
                        ClientStats::add(&self.stats.hits, 1);
                        Lookup::Fresh(response)
                    }
                    Err(()) => Lookup::Miss,
                }
            }
            Reuse::Revalidate => Lookup::Stale(entry),
        }
    }

    /// A fresh hit served from memory: no file, no thread hop. `None` when
    /// the memory cache lacks the entry, the store describes another body
    /// by now, or it needs revalidation (the disk path decides then).
    fn hot_hit(&self, key: &CacheKey, parts: &Parts) -> Option<Response<ProxyBody>> {
        let digest = *key.digest().as_bytes();
        let index = self.store.lookup(key)?;
        let entry = self.hot.get(&digest, &index)?;
        if !entry.is_intact() {
            // C-V3: the disk copy is read (and checked) instead.
            tracing::warn!(url = %key, "memory cache body failed its check; dropped");
            ClientStats::add(&self.stats.digest_failures, 1);
            self.hot.remove(&digest);
            return None;
        }
        let status = StatusCode::from_u16(entry.status).ok()?;
        let age = self.age_of(status, &entry.headers, entry.stored_at, unix_now());
        let reuse = freshness::reuse(
            &parts.headers,
            &entry.headers,
            age.current,
            age.lifetime,
            self.is_shared(),
        );
        if reuse != Reuse::Serve {
            return None;
        }
        self.store.touch(key);
        let head = self.stored_head(
            status,
            entry.headers.clone(),
            age.current,
            parts,
            CacheStatus::hit(),
            entry.body.len() as u64,
        );
        Some(match head {
            Ok(response) => response,
            Err(headers) => respond(status, headers, full(entry.body.clone())),
        })
    }

    /// The head of a stored response as served (Age, Cache-Status, Via,
    /// Content-Length): a whole 304 when the user agent's own validators
    /// match or a whole HEAD answer as `Ok`, else the headers the body
    /// goes with as `Err`.
    fn stored_head(
        &self,
        status: StatusCode,
        mut headers: HeaderMap,
        age: u64,
        parts: &Parts,
        outcome: CacheStatus,
        body_len: u64,
    ) -> Result<Response<ProxyBody>, HeaderMap> {
        headers.insert(header::AGE, HeaderValue::from(age));
        headers.insert(CACHE_STATUS, freshness::cache_status(CACHE_NAME, &outcome));
        add_via(&mut headers, &self.config.via_name);
        if status == StatusCode::OK && not_modified_for(&parts.headers, &headers) {
            return Ok(respond(StatusCode::NOT_MODIFIED, headers, empty()));
        }
        headers.insert(header::CONTENT_LENGTH, HeaderValue::from(body_len));
        if parts.method == Method::HEAD {
            return Ok(respond(status, headers, empty()));
        }
        Err(headers)
    }

    /// Serves a stored entry: 304 when the user agent's own validators
    /// match, headers only for HEAD, else the body (checked; `Err` when it
    /// failed its digest and was quarantined, so the caller goes upstream).
    /// With `remember`, a small body is kept in the memory cache.
    async fn respond_from_entry(
        &self,
        mut entry: Entry,
        stored: HeaderMap,
        age: u64,
        parts: &Parts,
        outcome: CacheStatus,
        remember: bool,
    ) -> Result<Response<ProxyBody>, ()> {
        let status = StatusCode::from_u16(entry.meta.status).unwrap_or(StatusCode::OK);
        let len = entry.meta.body_len;
        let remember = remember && len <= self.hot.max_body() as u64;
        // What the store keeps, never what this user was answered with
        // (a 304's Set-Cookie, say): the memory copy is shared (A-9).
        let kept_headers = remember.then(|| stored_headers(&entry));
        let headers = match self.stored_head(status, stored, age, parts, outcome, len) {
            Ok(response) => return Ok(response),
            Err(headers) => headers,
        };
        let digest = entry.meta.body_digest().map_err(|_| ())?;
        let stored_at = entry.meta.stored_at;
        let signature = Bytes::from(std::mem::take(&mut entry.signature));
        let store = self.store.clone();
        let key = entry.meta.key().map_err(|_| ())?;
        let key_digest = *key.digest().as_bytes();
        let outboard = entry.meta.outboard();
        let stats = self.stats.clone();
        let on_failure = move || {
            ClientStats::add(&stats.digest_failures, 1);
            store.quarantine(&key, digest);
        };
        let body = tokio::task::spawn_blocking(move || {
            cached_body::serve_cached(entry.body, len, digest, outboard, on_failure)
        })
        .await
        .map_err(|_| ())?
        .ok_or(())?;
        let body = match body {
            CachedBody::Whole(bytes) => {
                if let Some(kept) = kept_headers {
                    let entry = HotEntry::new(
                        status.as_u16(),
                        kept,
                        stored_at,
                        bytes.clone(),
                        digest,
                        signature,
                    );
                    self.hot.insert(key_digest, entry);
                }
                full(bytes)
            }
            CachedBody::Stream(body) => body,
        };
        Ok(respond(status, headers, body))
    }

    /// Picks the basis for `key`: the stale or partial entry of the same
    /// URL, else the longest-prefix entry of the same origin.
    async fn choose_basis(&self, key: &CacheKey, same_url: Option<&Entry>) -> Option<BasisOffer> {
        let budget = self.signature_budget();
        if let Some(entry) = same_url {
            // D-B1: an entry kept for one user (Authorization, Set-Cookie,
            // private) is never another request's basis, even for its URL.
            let usable = entry.meta.shareable_as_basis || !self.is_shared();
            return usable.then(|| basis_offer(entry, budget)).flatten();
        }
        // The choice is made in memory; only reading the entry needs a
        // thread, unless the memory cache holds it.
        let candidate = self.store.basis(key, self.config.scope)?;
        if let Some(hot) = self.hot.get(candidate.key.digest().as_bytes(), &candidate)
            && hot.is_intact()
            && let Some(signature) = cut_signature(&hot.signature, budget)
        {
            ClientStats::add(&self.stats.memory_bases, 1);
            return Some(BasisOffer {
                name: byte_sequence(candidate.body_blake3.as_bytes()),
                signature: byte_sequence(signature),
                signature_len: signature.len(),
                key: candidate.key,
                body: BasisBody::Memory(hot.body.clone()),
            });
        }
        let store = self.store.clone();
        tokio::task::spawn_blocking(move || {
            let entry = store.get(&candidate.key)?;
            basis_offer(&entry, budget)
        })
        .await
        .ok()
        .flatten()
    }

    /// Signature bytes to send: what the upstream advertised, within our
    /// own cap, else the default.
    fn signature_budget(&self) -> usize {
        self.upstream
            .advertised()
            .map_or(self.config.default_signature_bytes, |advertised| {
                advertised
                    .max_signature
                    .min(self.config.max_signature_bytes)
            })
    }

    /// Fetches a GET upstream with the hsync offer (and validators for a
    /// stale entry), and relays the answer.
    async fn fetch(
        self: Arc<Self>,
        parts: Parts,
        target: Target,
        key: CacheKey,
        stale: Option<Entry>,
        leader: Option<coalesce::Leader>,
    ) -> Response<ProxyBody> {
        self.fetch_with(parts, target, key, stale, leader, Attempt::First)
            .await
    }

    /// [`fetch`](Self::fetch), once more without a basis when a small body
    /// rebuilt against one failed its checks before the user agent saw a
    /// byte (D-A1, D-A4: the full fetch serves the right bytes).
    async fn fetch_with(
        self: Arc<Self>,
        parts: Parts,
        target: Target,
        key: CacheKey,
        stale: Option<Entry>,
        leader: Option<coalesce::Leader>,
        attempt: Attempt,
    ) -> Response<ProxyBody> {
        let basis = match attempt {
            Attempt::First => self.choose_basis(&key, stale.as_ref()).await,
            Attempt::WithoutBasis => None,
        };
        let stale_complete =
            stale.filter(|e| e.meta.completeness == Completeness::Complete && e.meta.status == 200);
        let mut headers = parts.headers.clone();
        let revalidating = stale_complete.is_some();
        if let Some(entry) = &stale_complete {
            // We answer the user agent's own conditions from the entry.
            for name in CONDITIONAL_HEADERS {
                headers.remove(name);
            }
            headers.extend(freshness::conditional_headers(&stored_headers(entry)));
        }
        offer_hsync(&mut headers);
        if let Some(offer) = &basis {
            ClientStats::add(&self.stats.signature_bytes, offer.signature_len as u64);
            headers.insert(HSYNC_BASIS, offer.name.clone());
            headers.insert(HSYNC_SIGNATURE, offer.signature.clone());
        }
        let outbound = self.outbound(&parts, headers, &target, empty());
        let now = unix_now();
        let response = match self.send(outbound, &target).await {
            Ok(response) => response,
            Err((status, message)) => {
                if let Some(entry) = stale_complete
                    && let Some(response) = self.serve_stale_on_error(entry, &parts, None).await
                {
                    return response;
                }
                return error(status, message);
            }
        };
        let (mut rparts, rbody) = response.into_parts();
        rparts.version = http::Version::HTTP_11;
        if let Err(e) = strip_hop_by_hop(&mut rparts.headers) {
            return error(StatusCode::BAD_GATEWAY, format!("upstream response: {e}"));
        }

        if rparts.status == StatusCode::NOT_MODIFIED
            && let Some(entry) = stale_complete
        {
            return self.refreshed(entry, &rparts.headers, &parts, now).await;
        }
        if rparts.status.is_server_error()
            && let Some(entry) = stale_complete
            && let Some(response) = self
                .serve_stale_on_error(entry, &parts, Some(rparts.status))
                .await
        {
            return response;
        }
        if hsync_coded(&rparts.headers) == HsyncCoded::Layered {
            return error(
                StatusCode::BAD_GATEWAY,
                "upstream layered other codings with hsync; it cannot be undone here".into(),
            );
        }
        let hsync = is_hsync(&rparts.headers);
        if hsync {
            let sent = basis.as_ref().map(|b| &b.name);
            if rparts.headers.get(HSYNC_BASIS) != sent {
                ClientStats::add(&self.stats.digest_failures, 1);
                return error(
                    StatusCode::BAD_GATEWAY,
                    "upstream coded against a basis we did not offer".into(),
                );
            }
            ClientStats::add(&self.stats.deltas, 1);
            rparts.headers.remove(header::CONTENT_ENCODING);
            rparts.headers.remove(header::CONTENT_LENGTH);
            rparts.headers.remove(HSYNC_BASIS);
            rparts.headers.remove(HSYNC_ACCEPT);
            strip_vary(&mut rparts.headers, &["accept-encoding", "hsync-basis"]);
        }
        ClientStats::add(&self.stats.misses, 1);
        if revalidating {
            ClientStats::add(&self.stats.revalidated, 1);
        }
        let outcome = if revalidating {
            CacheStatus {
                fwd_status: Some(rparts.status),
                ..CacheStatus::forwarded(Forward::Stale)
            }
        } else {
            CacheStatus::forwarded(Forward::Miss)
        };
        let storable = match freshness::storability(
            &parts.method,
            &parts.headers,
            rparts.status,
            &rparts.headers,
            self.is_shared(),
        ) {
            Storability::Storable if rparts.status == StatusCode::OK => true,
            Storability::Storable => false,
            Storability::NotStorable(reason) => {
                tracing::debug!(url = %key, reason, "not storable");
                false
            }
        };
        if !hsync && !storable {
            drop(leader);
            ClientStats::add(&self.stats.passed, 1);
            rparts
                .headers
                .insert(CACHE_STATUS, freshness::cache_status(CACHE_NAME, &outcome));
            add_via(&mut rparts.headers, &self.config.via_name);
            return Response::from_parts(rparts, rbody.map_err(BodyError::from).boxed());
        }

        let store_target = if storable {
            self.begin_entry(&key, &parts.headers, &rparts, now, hsync)
                .await
        } else {
            None
        };
        let basis_url = basis.as_ref().map(|b| b.key.to_string());
        let had_basis = basis.is_some();
        let coding = if hsync {
            let (basis_file, basis_key) = match basis {
                Some(BasisOffer {
                    body: BasisBody::Memory(body),
                    key,
                    ..
                }) => (ClientBasis::Memory(body), Some(key)),
                Some(BasisOffer {
                    body: BasisBody::File(file),
                    key,
                    ..
                }) => match FileBasis::new(file) {
                    Ok(file) => (ClientBasis::File(file), Some(key)),
                    Err(e) => {
                        return error(
                            StatusCode::BAD_GATEWAY,
                            format!("cannot read the basis: {e}"),
                        );
                    }
                },
                None => (ClientBasis::None, None),
            };
            Coding::Hsync {
                basis: basis_file,
                basis_key,
                limits: DecodeLimits {
                    max_output: self.config.max_object_bytes,
                    ..DecodeLimits::default()
                },
            }
        } else {
            Coding::Plain {
                expected_len: content_length(&rparts.headers),
            }
        };
        let mut origin_digests = OriginDigest::parse_all(&rparts.headers, "content-digest");
        if hsync || !rparts.headers.contains_key(header::CONTENT_ENCODING) {
            origin_digests.extend(OriginDigest::parse_all(&rparts.headers, "repr-digest"));
        }
        rparts
            .headers
            .insert(CACHE_STATUS, freshness::cache_status(CACHE_NAME, &outcome));
        add_via(&mut rparts.headers, &self.config.via_name);
        let stats = self.stats.clone();
        let log = RequestLog {
            url: key.to_string(),
            status: rparts.status,
            cache: freshness::cache_status(CACHE_NAME, &outcome),
            basis: basis_url,
            hsync,
            started: parts
                .extensions
                .get::<Started>()
                .map_or_else(Instant::now, |s| s.0),
        };
        rparts.extensions.insert(LoggedAtEnd);
        let relayed = transfer::relay(
            rbody,
            Relay {
                coding,
                store: store_target,
                origin_digests,
                framing: rparts.extensions.get::<ExchangeCheck>().cloned(),
                spool_dir: Some(self.store.root().join("tmp")),
                spool_disk: self.spool_disk.clone(),
                memory: self.memory.clone(),
            },
            self.config.upstream_timeout.min(transfer::WHOLE_WAIT),
            move |report: Report| {
                record(&stats, &log, &report);
                drop(leader);
            },
        )
        .await;
        match relayed {
            Relayed::Whole(body) => {
                // Ours now, whatever upstream said (a coded length, or none).
                rparts.headers.remove(header::CONTENT_LENGTH);
                Response::from_parts(rparts, full(body))
            }
            Relayed::Stream(body) => Response::from_parts(rparts, body),
            Relayed::Failed {
                reason,
                corrupt: true,
            } if attempt == Attempt::First && had_basis => {
                // The basis is dropped by now; the retry cannot loop.
                tracing::warn!(url = %key, %reason, "rebuilt body failed its checks; fetching it whole");
                Box::pin(self.fetch_with(parts, target, key, None, None, Attempt::WithoutBasis))
                    .await
            }
            Relayed::Failed { reason, .. } => error(
                StatusCode::BAD_GATEWAY,
                format!("the upstream body failed: {reason}; retry"),
            ),
        }
    }

    /// Opens a cache entry for a storable response: the key with its Vary'd
    /// request values, the headers to replay.
    async fn begin_entry(
        &self,
        key: &CacheKey,
        request: &HeaderMap,
        response: &http::response::Parts,
        now: u64,
        identity: bool,
    ) -> Option<StoreTarget> {
        let mut key = key.clone();
        let names = vary_names(&response.headers, identity);
        let plain = key.clone();
        for name in &names {
            key = key.with_vary(name, &request_value(request, name)).ok()?;
        }
        let private = !self.is_shared()
            || request.contains_key(header::AUTHORIZATION)
            || response.headers.contains_key(header::SET_COOKIE)
            || CacheControl::parse(&response.headers).private;
        let entry = NewEntry {
            status: response.status.as_u16(),
            headers: headers_to_store(&response.headers),
            stored_at: now,
            completeness: Completeness::Partial,
            shareable_as_basis: !private,
        };
        let store = self.store.clone();
        let expected = content_length(&response.headers);
        tokio::task::spawn_blocking(move || {
            if !names.is_empty() {
                // A Vary'd response replaces an unkeyed one for the URL.
                store.remove(&plain);
            }
            let mut writer = store.begin(&key).ok()?;
            if let Some(len) = expected {
                writer.expect_body_len(len).ok()?;
            }
            Some(StoreTarget {
                store,
                writer,
                entry,
            })
        })
        .await
        .ok()
        .flatten()
    }

    /// A 304 answered our validators: refresh the stored headers and serve
    /// the entry.
    async fn refreshed(
        &self,
        entry: Entry,
        not_modified: &HeaderMap,
        parts: &Parts,
        now: u64,
    ) -> Response<ProxyBody> {
        ClientStats::add(&self.stats.revalidated, 1);
        let stored = stored_headers(&entry);
        // The merge is this user's answer (her Set-Cookie included); what
        // is kept is only its shareable part (A-9).
        let merged = freshness::merge_not_modified(&stored, not_modified);
        let mut meta = entry.meta.clone();
        meta.headers = headers_to_store(&merged);
        meta.stored_at = now;
        let store = self.store.clone();
        // A 304 may change what the entry is: `private` or `no-store` now,
        // or varying on other request headers than its key was made with
        // (RFC 9111 §4.3.4 lets it update every header). Then the entry is
        // no longer one every user may get: it goes, and this user alone
        // gets the body (A-9).
        let keep = self.still_shared(&stored, &merged);
        let kept_meta = meta.clone();
        let _ = tokio::task::spawn_blocking(move || {
            if !keep {
                if let Ok(key) = meta.key() {
                    store.remove(&key);
                }
            } else if let Err(error) = store.update_meta(&meta) {
                tracing::warn!(url = %meta.url, %error, "cannot refresh the stored headers");
            }
        })
        .await;
        // Revalidated just now: aged from this exchange.
        let status = StatusCode::from_u16(entry.meta.status).unwrap_or(StatusCode::OK);
        let age = self.age_of(status, &merged, now, now).current;
        // As the store now describes it (the memory cache checks that).
        let mut entry = entry;
        entry.meta = kept_meta;
        match self
            .respond_from_entry(
                entry,
                merged,
                age,
                parts,
                CacheStatus {
                    fwd_status: Some(StatusCode::NOT_MODIFIED),
                    ..CacheStatus::forwarded(Forward::Stale)
                },
                keep,
            )
            .await
        {
            Ok(response) => {
                ClientStats::add(&self.stats.hits, 1);
                response
            }
            Err(()) => error(
                StatusCode::BAD_GATEWAY,
                "the stored body failed its check after a 304; retry".into(),
            ),
        }
    }

    /// Whether an entry whose headers were `before` may stay shared with
    /// the `after` headers a 304 left it: not when they make it private
    /// (in a shared cache) or `no-store`, or change what it varies on.
    fn still_shared(&self, before: &HeaderMap, after: &HeaderMap) -> bool {
        let directives = CacheControl::parse(after);
        let private = directives.private && self.is_shared();
        !private && !directives.no_store && vary_names(before, true) == vary_names(after, true)
    }

    /// Upstream failed: serve the stale entry if RFC 5861 allows it.
    async fn serve_stale_on_error(
        &self,
        entry: Entry,
        parts: &Parts,
        upstream_status: Option<StatusCode>,
    ) -> Option<Response<ProxyBody>> {
        let stored = stored_headers(&entry);
        let status = StatusCode::from_u16(entry.meta.status).ok()?;
        let age = self.age_of(status, &stored, entry.meta.stored_at, unix_now());
        if !freshness::may_serve_stale_on_error(
            &parts.headers,
            &stored,
            age.current,
            age.lifetime,
            self.is_shared(),
        ) {
            return None;
        }
        self.respond_from_entry(
            entry,
            stored,
            age.current,
            parts,
            CacheStatus::stale_on_error(upstream_status, age.ttl()),
            false,
        )
        .await
        .ok()
    }

    /// HEAD misses: passed through as they are.
    async fn pass(&self, parts: Parts, body: Incoming, target: Target) -> Response<ProxyBody> {
        ClientStats::add(&self.stats.passed, 1);
        let headers = parts.headers.clone();
        let outbound = self.outbound(
            &parts,
            headers,
            &target,
            body.map_err(BodyError::from).boxed(),
        );
        match self.send(outbound, &target).await {
            Ok(response) => self.relay_plain(
                &parts.method,
                response,
                CacheStatus::forwarded(Forward::Miss),
            ),
            Err((status, message)) => error(status, message),
        }
    }

    /// Methods other than GET and HEAD: through, and a success invalidates
    /// the stored entry (RFC 9111 §4.4, P-23).
    async fn pass_unsafe(
        self: Arc<Self>,
        parts: Parts,
        body: Incoming,
        target: Target,
        key: CacheKey,
    ) -> Response<ProxyBody> {
        ClientStats::add(&self.stats.passed, 1);
        let headers = parts.headers.clone();
        let outbound = self.outbound(
            &parts,
            headers,
            &target,
            body.map_err(BodyError::from).boxed(),
        );
        let response = match self.send(outbound, &target).await {
            Ok(response) => response,
            Err((status, message)) => return error(status, message),
        };
        if freshness::invalidates(&parts.method, response.status()) {
            let store = self.store.clone();
            let _ = tokio::task::spawn_blocking(move || invalidate(&store, &key)).await;
        }
        self.relay_plain(
            &parts.method,
            response,
            CacheStatus::forwarded(Forward::Method),
        )
    }

    /// An upstream answer passed through as it is, but that hsync never
    /// reaches a user agent as a content coding (P-25): we did not offer
    /// it on these paths, so a coded body is an upstream's mistake (502),
    /// and a HEAD answer loses the coding and the coded length.
    fn relay_plain(
        &self,
        method: &Method,
        response: Response<Incoming>,
        outcome: CacheStatus,
    ) -> Response<ProxyBody> {
        let (mut parts, body) = response.into_parts();
        parts.version = http::Version::HTTP_11;
        if let Err(e) = strip_hop_by_hop(&mut parts.headers) {
            return error(StatusCode::BAD_GATEWAY, format!("upstream response: {e}"));
        }
        if hsync_coded(&parts.headers) != HsyncCoded::No {
            if *method != Method::HEAD {
                return error(
                    StatusCode::BAD_GATEWAY,
                    "upstream sent an hsync body that was not asked for".into(),
                );
            }
            parts.headers.remove(header::CONTENT_ENCODING);
            parts.headers.remove(header::CONTENT_LENGTH);
        }
        for name in [HSYNC_BASIS, HSYNC_ACCEPT, HSYNC_SIGNATURE] {
            parts.headers.remove(name);
        }
        strip_vary(&mut parts.headers, &["hsync-basis"]);
        parts
            .headers
            .insert(CACHE_STATUS, freshness::cache_status(CACHE_NAME, &outcome));
        add_via(&mut parts.headers, &self.config.via_name);
        Response::from_parts(parts, body.map_err(BodyError::from).boxed())
    }

    /// The request as it goes upstream.
    fn outbound(
        &self,
        parts: &Parts,
        mut headers: HeaderMap,
        target: &Target,
        body: ProxyBody,
    ) -> Request<ProxyBody> {
        add_via(&mut headers, &self.config.via_name);
        if let Some(credentials) = &self.config.upstream_credentials {
            headers.insert(header::PROXY_AUTHORIZATION, credentials.clone());
        }
        let authority = target.url.authority().expect("targets are absolute");
        headers.insert(
            header::HOST,
            HeaderValue::from_str(authority.as_str()).expect("an authority is a valid header"),
        );
        let mut request = Request::new(body);
        if let Some(observed) = parts.extensions.get::<queue_wait::Observed>() {
            request.extensions_mut().insert(observed.clone());
        }
        *request.method_mut() = parts.method.clone();
        *request.uri_mut() = target.url.clone();
        if !target.forward {
            // Gateway requests go to the upstream itself.
            *request.uri_mut() = Uri::builder()
                .scheme(self.upstream_scheme.clone())
                .authority(self.upstream_authority.clone())
                .path_and_query(target.url.path_and_query().expect("absolute").clone())
                .build()
                .expect("scheme, authority and path are valid");
        }
        *request.headers_mut() = headers;
        request
    }

    /// Sends a request upstream once, on a pooled connection (the queue
    /// is [`Self::send`]'s).
    async fn send_once(
        &self,
        request: Request<ProxyBody>,
        target: &Target,
    ) -> Result<Response<Incoming>, (StatusCode, String)> {
        self.checked(self.upstream.send(request, target.forward))
            .await
    }

    /// The upstream's answer to a request `sent` (pooled or on a held
    /// connection), within the upstream timeout and checked; `Err` is the
    /// status and message for the user agent. After a malformed head the
    /// connection must not be used again (`Upstream::send` sees to it for
    /// pooled ones).
    async fn checked<E: std::error::Error + 'static>(
        &self,
        sent: impl Future<Output = Result<Response<Incoming>, E>>,
    ) -> Result<Response<Incoming>, (StatusCode, String)> {
        match tokio::time::timeout(self.config.upstream_timeout, sent).await {
            // The upstream's challenge is for us, not for the user agent
            // (whose credentials never go upstream): a gateway error.
            Ok(Ok(response)) if response.status() == StatusCode::PROXY_AUTHENTICATION_REQUIRED => {
                ClientStats::add(&self.stats.upstream_errors, 1);
                let what = if self.config.upstream_credentials.is_some() {
                    "refused our credentials (check --upstream-user and its password)"
                } else {
                    "wants proxy credentials (give --upstream-user)"
                };
                Err((
                    StatusCode::BAD_GATEWAY,
                    format!("upstream {} {what}", self.upstream_authority),
                ))
            }
            Ok(Ok(mut response)) => {
                if let Err(message) = check_response_head(response.headers()) {
                    ClientStats::add(&self.stats.upstream_errors, 1);
                    return Err((
                        StatusCode::BAD_GATEWAY,
                        format!("upstream {}: {message}", self.upstream_authority),
                    ));
                }
                // The reason phrase is the upstream's; ours comes from the
                // status (P-18).
                response
                    .extensions_mut()
                    .remove::<hyper::ext::ReasonPhrase>();
                Ok(response)
            }
            Ok(Err(e)) if let Some(violation) = malformed_request_body(&e) => {
                Err((StatusCode::BAD_REQUEST, violation.reason.to_string()))
            }
            Ok(Err(e)) => {
                ClientStats::add(&self.stats.upstream_errors, 1);
                Err((
                    StatusCode::BAD_GATEWAY,
                    format!(
                        "upstream {} unreachable: {}",
                        self.upstream_authority,
                        error_chain(&e)
                    ),
                ))
            }
            Err(_) => {
                ClientStats::add(&self.stats.upstream_errors, 1);
                Err((
                    StatusCode::GATEWAY_TIMEOUT,
                    format!(
                        "upstream {} sent no response head within {:?}",
                        self.upstream_authority, self.config.upstream_timeout
                    ),
                ))
            }
        }
    }
}

impl Handler for ClientProxy {
    fn handle(
        self: Arc<Self>,
        request: Request<Incoming>,
    ) -> impl Future<Output = Response<ProxyBody>> + Send {
        self.proxy(request)
    }
}

/// An error and its sources, `: `-separated (hyper's client errors say
/// little more than "Connect" on their own; the cause, such as a
/// certificate the upstream's name does not match, is in the chain).
fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

enum Lookup {
    Fresh(Response<ProxyBody>),
    Stale(Entry),
    Miss,
}

/// `Cache-Status` (RFC 9211).
pub const CACHE_STATUS: HeaderName = HeaderName::from_static("cache-status");

/// Request headers that make a request conditional.
const CONDITIONAL_HEADERS: [HeaderName; 5] = [
    header::IF_NONE_MATCH,
    header::IF_MODIFIED_SINCE,
    header::IF_MATCH,
    header::IF_UNMODIFIED_SINCE,
    header::IF_RANGE,
];

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// The entry stored for a request: the URL's unkeyed entry, else one whose
/// Vary'd request values match this request's.
fn find_entry(store: &CacheStore, key: &CacheKey, request: &HeaderMap) -> Option<Entry> {
    if store.lookup(key).is_some() {
        return store.get(key);
    }
    store
        .variants(key)
        .into_iter()
        .filter(|c| !c.key.vary().is_empty())
        .find(|c| {
            let mut wanted = key.clone();
            for (name, _) in c.key.vary() {
                match wanted.with_vary(name, &request_value(request, name)) {
                    Ok(k) => wanted = k,
                    Err(_) => return false,
                }
            }
            wanted == c.key
        })
        .and_then(|c| store.get(&c.key))
}

/// Removes every entry of the URL (all its Vary'd variants).
fn invalidate(store: &CacheStore, key: &CacheKey) {
    for variant in store.variants(key) {
        store.remove(&variant.key);
        tracing::debug!(url = %variant.key, "invalidated by an unsafe method");
    }
}

/// A request header's combined value (empty when absent).
fn request_value(headers: &HeaderMap, name: &str) -> Vec<u8> {
    let mut value = Vec::new();
    for (i, v) in headers.get_all(name).iter().enumerate() {
        if i > 0 {
            value.extend_from_slice(b", ");
        }
        value.extend_from_slice(v.as_bytes());
    }
    value
}

/// The request headers a response varies on, lower-case. A body we store
/// as identity does not vary on the codings offered, so `Accept-Encoding`
/// (and the hsync basis) are left out then; a coded body always varies on
/// `Accept-Encoding`.
fn vary_names(response: &HeaderMap, identity: bool) -> Vec<String> {
    let identity = identity || !response.contains_key(header::CONTENT_ENCODING);
    let mut names: Vec<String> = response
        .get_all(header::VARY)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|n| n.trim().to_ascii_lowercase())
        .filter(|n| !n.is_empty())
        .filter(|n| !(identity && (n == "accept-encoding" || n == "hsync-basis")))
        .collect();
    if !identity {
        // A coded body suits only the codings the request offered, even
        // when the origin forgot to say `Vary: Accept-Encoding`.
        names.push("accept-encoding".to_owned());
    }
    names.sort();
    names.dedup();
    names
}

/// Removes `names` from `Vary`, dropping the header when nothing is left.
fn strip_vary(headers: &mut HeaderMap, names: &[&str]) {
    let kept: Vec<String> = headers
        .get_all(header::VARY)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .filter(|n| !n.is_empty() && !names.iter().any(|x| n.eq_ignore_ascii_case(x)))
        .map(str::to_owned)
        .collect();
    headers.remove(header::VARY);
    if let Ok(value) = HeaderValue::from_str(&kept.join(", "))
        && !kept.is_empty()
    {
        headers.insert(header::VARY, value);
    }
}

/// Adds the hsync coding first to `Accept-Encoding`.
fn offer_hsync(headers: &mut HeaderMap) {
    let others: Vec<String> = headers
        .get_all(header::ACCEPT_ENCODING)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .filter(|c| !c.is_empty())
        .filter(|c| {
            !c.split(';')
                .next()
                .is_some_and(|t| t.trim().eq_ignore_ascii_case(HSYNC_CODING))
        })
        .map(str::to_owned)
        .collect();
    let value = std::iter::once(HSYNC_CODING.to_owned())
        .chain(others)
        .collect::<Vec<_>>()
        .join(", ");
    headers.insert(
        header::ACCEPT_ENCODING,
        HeaderValue::from_str(&value).unwrap_or(HeaderValue::from_static(HSYNC_CODING)),
    );
}

/// How a response's `Content-Encoding` involves hsync.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum HsyncCoded {
    /// Not at all.
    No,
    /// hsync alone (`identity` beside it changes nothing): we decode it.
    Yes,
    /// hsync with other codings over or under it, or a coding list we
    /// cannot read: nothing we can undo, and never for a user agent.
    Layered,
}

fn hsync_coded(headers: &HeaderMap) -> HsyncCoded {
    let mut codings = Vec::new();
    for value in headers.get_all(header::CONTENT_ENCODING) {
        let Ok(value) = value.to_str() else {
            return if value
                .as_bytes()
                .windows(5)
                .any(|w| w.eq_ignore_ascii_case(b"hsync"))
            {
                HsyncCoded::Layered
            } else {
                HsyncCoded::No
            };
        };
        codings.extend(
            value
                .split(',')
                .map(str::trim)
                .filter(|c| !c.is_empty() && !c.eq_ignore_ascii_case("identity")),
        );
    }
    let hsync = codings
        .iter()
        .filter(|c| c.eq_ignore_ascii_case(HSYNC_CODING))
        .count();
    match (hsync, codings.len()) {
        (0, _) => HsyncCoded::No,
        (1, 1) => HsyncCoded::Yes,
        _ => HsyncCoded::Layered,
    }
}

fn is_hsync(headers: &HeaderMap) -> bool {
    hsync_coded(headers) == HsyncCoded::Yes
}

fn content_length(headers: &HeaderMap) -> Option<u64> {
    headers
        .get(header::CONTENT_LENGTH)?
        .to_str()
        .ok()?
        .parse()
        .ok()
}

/// The headers an entry replays.
fn stored_headers(entry: &Entry) -> HeaderMap {
    let mut headers = HeaderMap::new();
    for (name, value) in &entry.meta.headers {
        if let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_str(value),
        ) {
            headers.append(name, value);
        }
    }
    headers
}

/// Response headers that belong to the one user who was answered (A-6,
/// A-9): never stored, so never replayed from the cache, even on a
/// `public` response. `Authentication-Info` carries the session's
/// next nonce (RFC 9110 §11.6.3).
const IDENTIFYING_HEADERS: [&str; 4] = [
    "set-cookie",
    "set-cookie2",
    "authentication-info",
    "proxy-authentication-info",
];

/// End-to-end response headers worth storing: not framing (the store knows
/// the length), not ours, not `Age`-free of meaning.
fn headers_to_store(headers: &HeaderMap) -> Vec<(String, String)> {
    headers
        .iter()
        .filter(|(name, _)| {
            !matches!(
                name.as_str(),
                "content-length" | "transfer-encoding" | "cache-status" | "via"
            ) && !IDENTIFYING_HEADERS.contains(&name.as_str())
                && **name != HSYNC_BASIS
                && **name != HSYNC_ACCEPT
        })
        .filter_map(|(name, value)| {
            Some((name.as_str().to_owned(), value.to_str().ok()?.to_owned()))
        })
        .collect()
}

/// Whether the user agent's own validators match the stored response (RFC
/// 9110 §13.1.2 and §13.1.3; If-None-Match wins when both are present).
fn not_modified_for(request: &HeaderMap, stored: &HeaderMap) -> bool {
    if let Some(condition) = request.get(header::IF_NONE_MATCH) {
        let Some(etag) = stored.get(header::ETAG).and_then(|v| v.to_str().ok()) else {
            return false;
        };
        let opaque = |tag: &str| tag.trim().trim_start_matches("W/").to_owned();
        return condition.to_str().is_ok_and(|list| {
            list.split(',')
                .any(|tag| tag.trim() == "*" || opaque(tag) == opaque(etag))
        });
    }
    match (
        request
            .get(header::IF_MODIFIED_SINCE)
            .and_then(freshness::parse_http_date),
        stored
            .get(header::LAST_MODIFIED)
            .and_then(freshness::parse_http_date),
    ) {
        (Some(since), Some(modified)) => modified <= since,
        _ => false,
    }
}

/// The `Hsync-Basis` and cut `Hsync-Signature` for an entry, or `None` when
/// it has no usable signature.
fn basis_offer(entry: &Entry, budget: usize) -> Option<BasisOffer> {
    let signature = cut_signature(&entry.signature, budget)?;
    let digest = entry.meta.body_digest().ok()?;
    Some(BasisOffer {
        key: entry.meta.key().ok()?,
        body: BasisBody::File(entry.body.try_clone().ok()?),
        name: byte_sequence(digest.as_bytes()),
        signature: byte_sequence(signature),
        signature_len: signature.len(),
    })
}

/// The signature cut to `budget` bytes at an entry boundary (the
/// accelerator uses the blocks it gets); `None` when not even the header
/// and one entry fit, or the signature is malformed.
fn cut_signature(signature: &[u8], budget: usize) -> Option<&[u8]> {
    const HEADER: usize = crate::hsync::SIGNATURE_HEADER_LEN;
    let strong_len = u32::from_be_bytes(signature.get(8..12)?.try_into().ok()?) as usize;
    if !(8..=32).contains(&strong_len) {
        return None;
    }
    let entry_len = 4 + strong_len;
    let room = budget.min(signature.len()).checked_sub(HEADER)?;
    let entries = room / entry_len;
    (entries > 0).then(|| &signature[..HEADER + entries * entry_len])
}

fn empty() -> ProxyBody {
    Empty::<Bytes>::new()
        .map_err(|never| match never {})
        .boxed()
}

fn respond(status: StatusCode, headers: HeaderMap, body: ProxyBody) -> Response<ProxyBody> {
    let mut response = Response::new(body);
    *response.status_mut() = status;
    *response.headers_mut() = headers;
    response
}

/// A short plain-text error.
fn error(status: StatusCode, message: String) -> Response<ProxyBody> {
    tracing::info!(status = status.as_u16(), %message, "refused");
    text_response(status, message)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signatures_are_cut_at_entry_boundaries() {
        let mut sig = vec![0x72, 0x73, 0x01, 0x36, 0, 0, 4, 0, 0, 0, 0, 8];
        sig.extend(std::iter::repeat_n(7u8, 12 * 10));
        assert_eq!(cut_signature(&sig, 1000).unwrap().len(), sig.len());
        assert_eq!(cut_signature(&sig, 12 + 12 * 3 + 5).unwrap().len(), 12 + 36);
        assert_eq!(cut_signature(&sig, 20), None, "not one entry");
        assert_eq!(cut_signature(&sig[..10], 1000), None, "no header");
    }

    #[test]
    fn identity_bodies_do_not_vary_on_accept_encoding() {
        let mut headers = HeaderMap::new();
        headers.append(
            header::VARY,
            HeaderValue::from_static("Accept-Encoding, Cookie"),
        );
        headers.append(
            header::VARY,
            HeaderValue::from_static("hsync-basis, accept-language"),
        );
        assert_eq!(vary_names(&headers, true), ["accept-language", "cookie"]);
        headers.insert(header::CONTENT_ENCODING, HeaderValue::from_static("gzip"));
        let mut no_vary = HeaderMap::new();
        no_vary.insert(header::CONTENT_ENCODING, HeaderValue::from_static("br"));
        assert_eq!(vary_names(&no_vary, false), ["accept-encoding"]);
        assert_eq!(
            vary_names(&headers, false),
            [
                "accept-encoding",
                "accept-language",
                "cookie",
                "hsync-basis"
            ]
        );
        strip_vary(&mut headers, &["accept-encoding", "hsync-basis"]);
        assert_eq!(headers[header::VARY], "Cookie, accept-language");
    }

    #[test]
    fn the_hsync_offer_goes_first_and_once() {
        let mut headers = HeaderMap::new();
        headers.insert(
            header::ACCEPT_ENCODING,
            HeaderValue::from_static("gzip, HSYNC;q=0.1, br"),
        );
        offer_hsync(&mut headers);
        assert_eq!(headers[header::ACCEPT_ENCODING], "hsync, gzip, br");
        let mut none = HeaderMap::new();
        offer_hsync(&mut none);
        assert_eq!(none[header::ACCEPT_ENCODING], "hsync");
    }

    #[test]
    fn user_agent_validators_are_answered_from_the_entry() {
        let mut stored = HeaderMap::new();
        stored.insert(header::ETAG, HeaderValue::from_static("W/\"v2\""));
        stored.insert(
            header::LAST_MODIFIED,
            HeaderValue::from_static("Tue, 01 Jan 2030 00:00:00 GMT"),
        );
        let mut request = HeaderMap::new();
        request.insert(
            header::IF_NONE_MATCH,
            HeaderValue::from_static("\"v1\", \"v2\""),
        );
        assert!(not_modified_for(&request, &stored));
        request.insert(header::IF_NONE_MATCH, HeaderValue::from_static("\"v1\""));
        assert!(!not_modified_for(&request, &stored));
        let mut since = HeaderMap::new();
        since.insert(
            header::IF_MODIFIED_SINCE,
            HeaderValue::from_static("Wed, 02 Jan 2030 00:00:00 GMT"),
        );
        assert!(not_modified_for(&since, &stored));
        since.insert(
            header::IF_MODIFIED_SINCE,
            HeaderValue::from_static("Mon, 31 Dec 2029 00:00:00 GMT"),
        );
        assert!(!not_modified_for(&since, &stored));
    }
}
