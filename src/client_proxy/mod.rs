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
//! The request path, a file per step: [`ClientProxy::proxy`] (here) checks
//! the target and dispatches; GET and HEAD look in the cache (`hit.rs`),
//! and a miss or a stale entry goes upstream (`fetch.rs`, with the basis
//! `basis.rs` chooses); HEAD misses and other methods pass through
//! (`pass.rs`). Every trip upstream is [`upstream`]'s; what a stored
//! entry's headers mean, and the entry a storable answer opens, is
//! `entry.rs`'s.
//!
//! Where a request goes upstream is `routes.rs`'s: the first route whose
//! hosts match, to an upstream proxy or direct, or to its fallbacks while
//! that is marked down or cannot be reached. A CONNECT opens a tunnel
//! (`tunnel.rs`): checked, then relayed byte for byte, neither cached nor
//! coded.
//!
//! Main types: [`ClientProxy`], [`ClientConfig`], [`ClientStats`].

mod basis;
mod cache_writer;
pub mod cached_body;
pub mod coalesce;
mod entry;
mod fetch;
mod hit;
pub mod hot;
mod partial;
mod pass;
pub mod queue_wait;
mod ranges;
pub mod replica;
mod routes;
mod stats;
pub mod targeted;
pub mod transfer;
mod tunnel;
pub mod upstream;

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::header::{self, HeaderName, HeaderValue};
use http::request::Parts;
use http::{Method, Request, Response};
use http_body_util::{BodyExt, Empty};

use crate::accelerator::{Coder, CoderConfig, Offer};
use crate::cache::freshness::{self, CacheControl, CacheStatus};
use crate::cache::{CacheKey, CacheScope, CacheStore};
use crate::http::access_log::{Note, Side};
use crate::http::dial::{Dialer, MemoryDial};
use crate::http::error::{ProxyError, refusal_of};
use crate::http::headers::{
    HSYNC_ACCEPT, HSYNC_BASIS, HSYNC_SIGNATURE, HSYNC_SIGNATURE_LENGTH, Hop, answer_at_this_hop,
    max_forwards, remove_hsync_coding, strip_hop_by_hop, via_names_hop,
};
use crate::http::server::{Handler, Peer, ProxyBody, RequestBody, counted};
use crate::http::spool::SpoolDisk;
use crate::http::transfer_memory::{MemoryFigures, TransferMemory};
use coalesce::{InFlight, Role};
use hit::Lookup;
use hot::HotCache;
use queue_wait::{MAX_LISTED_WAITS, QueueWaitConfig, QueueWaits};
use replica::{Replicas, Subscription};
use routes::{Routes, Target};
use transfer::full;

pub use routes::{RouteConfig, RouteError as ConfigError, RouteHosts, RouteTo};

pub use stats::{ClientStats, STATS_PATH, StatsSnapshot};
use stats::{LoggedAtEnd, Started};
pub use tunnel::TunnelConfig;

/// What `OPTIONS` answered here says we pass on.
const FORWARDED_METHODS: &str = "GET, HEAD, POST, PUT, DELETE, PATCH, OPTIONS, TRACE";

/// The name this cache gives itself in `Cache-Status` (RFC 9211).
pub const CACHE_NAME: &str = "rproxy";

/// Client proxy settings, validated.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// The routes upstream, tried in order (the `--upstream` shorthand
    /// is one route for every host).
    pub routes: Vec<RouteConfig>,
    /// Our name in `Via`.
    pub via_name: HeaderValue,
    /// Whether several users share this cache (the default) or it is one
    /// user's private cache (then `private` responses are stored and used
    /// as bases).
    pub scope: CacheScope,
    /// When a response's `CDN-Cache-Control` replaces its `Cache-Control`
    /// in the caching rules (RFC 9213).
    pub targeted_cache_control: targeted::TargetedCacheControl,
    /// Whether a shared cache stores a response that sets a cookie without
    /// `public` (never its cookie, never as a basis).
    pub set_cookie: freshness::SetCookie,
    /// Signature bytes sent upstream while the upstream's `Hsync-Accept`
    /// is unknown (decoded; 4,608 is 6 KiB of header).
    pub default_signature_bytes: usize,
    /// Signature bytes never exceeded, whatever the upstream advertises.
    pub max_signature_bytes: usize,
    /// Time to connect upstream.
    pub connect_timeout: Duration,
    /// Not a setting: a test's or fuzz target's stand-in for the network,
    /// which then takes every connection to the routes' upstreams (not
    /// CONNECT tunnels').
    pub upstream_dial: Option<MemoryDial>,
    /// Time for the upstream's response head (504 after).
    pub upstream_timeout: Duration,
    /// When an upstream proxy that fails is marked down, and for how long
    /// ([`crate::http::health`]).
    pub health: crate::http::health::HealthPolicy,
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
    /// CONNECT tunnels: the ports and non-public addresses they may go
    /// to, and how long one may stay quiet.
    pub tunnel: TunnelConfig,
    /// User agents (or proxies) whose `Forwarded` and `X-Forwarded-*` are
    /// kept and appended to; from anyone else they are replaced.
    pub trusted_forwarders: Vec<ipnet::IpNet>,
    /// How answers to downstream client proxies that offer hsync are coded
    /// (a chain of proxies); `None` serves them plain bodies.
    pub downstream_coding: Option<CoderConfig>,
    /// The zones replicated from their upstream's change feed.
    pub subscriptions: Vec<Subscription>,
}

impl ClientConfig {
    /// How the routes' connections are opened, before each way adds its
    /// TLS settings or address policy.
    fn base_dialer(&self) -> Dialer {
        Dialer {
            connect_timeout: self.connect_timeout,
            policy: None,
            tls: None,
            memory: self.upstream_dial.clone(),
        }
    }
}

/// Codes `response` for a downstream client proxy that offered hsync,
/// when it may be coded (the bytes are ours, verified and rebuilt).
async fn code_downstream(
    coder: &Coder,
    response: Response<ProxyBody>,
    offer: Offer,
    request: &http::HeaderMap,
    method: Method,
    uri: http::Uri,
) -> Response<ProxyBody> {
    let (parts, body) = response.into_parts();
    if !coder.codes(&offer, &parts) {
        return Response::from_parts(parts, body);
    }
    match coder
        .code(parts, body, None, offer, request, method, uri)
        .await
    {
        Ok(response) => response,
        Err(refusal) => refusal.log_and_respond(),
    }
}

/// The client proxy role.
pub struct ClientProxy {
    config: ClientConfig,
    store: CacheStore,
    routes: Routes,
    /// Codes what downstream client proxies are served, when enabled.
    coder: Option<Coder>,
    in_flight: InFlight,
    hot: Arc<HotCache>,
    stats: Arc<ClientStats>,
    waits: Arc<QueueWaits>,
    /// What relays of large bodies hold at once.
    memory: TransferMemory,
    /// What the bodies spooled for stalled user agents take on disk.
    spool_disk: SpoolDisk,
    /// The zones replicated (their logs outlive a reload).
    replicas: Arc<Replicas>,
}

impl ClientProxy {
    /// Builds the proxy over an opened cache.
    ///
    /// # Errors
    /// A [`ConfigError`]: no route, a bad upstream URL, an `https://`
    /// upstream without TLS settings.
    pub fn new(config: ClientConfig, store: CacheStore) -> Result<ClientProxy, ConfigError> {
        let routes = Routes::new(
            &config.routes,
            config.upstream_tls.as_ref(),
            &config.base_dialer(),
            config.health,
            None,
        )?;
        let stats = Arc::new(ClientStats {
            cache_write_errors: store.write_errors(),
            cache: Some(store.clone()),
            ..ClientStats::default()
        });
        let mut proxy = ClientProxy {
            replicas: Arc::new(Replicas::open(&config.subscriptions, store.root())),
            routes,
            coder: None,
            memory: TransferMemory::new(config.transfer_memory),
            spool_disk: SpoolDisk::new(config.max_spool_total),
            in_flight: InFlight::new(config.lock_timeout),
            hot: Arc::new(HotCache::new(config.memory_cache_bytes)),
            waits: Arc::new(QueueWaits::new(config.queue.clone(), stats.clone())),
            stats,
            store,
            config,
        };
        proxy.coder = proxy
            .config
            .downstream_coding
            .clone()
            .map(|coding| proxy.downstream_coder(coding));
        Ok(proxy)
    }

    /// This proxy with a new configuration (a reload): new routes,
    /// timeouts and coding settings over the same cache, counters, queue
    /// waits, fetches in flight and memory and disk budgets (whose sizes
    /// need a restart to change); what was known of each upstream proxy's
    /// health carries over by its URL. Requests under way finish with this
    /// one.
    ///
    /// # Errors
    /// As [`ClientProxy::new`].
    pub fn reconfigured(&self, config: ClientConfig) -> Result<ClientProxy, ConfigError> {
        let routes = Routes::new(
            &config.routes,
            config.upstream_tls.as_ref(),
            &config.base_dialer(),
            config.health,
            Some(&self.routes),
        )?;
        let coder = match (&self.coder, config.downstream_coding.clone()) {
            (Some(coder), Some(coding)) => Some(coder.reconfigured(self.parked_in_cache(coding))),
            (None, Some(coding)) => Some(self.downstream_coder(coding)),
            (_, None) => None,
        };
        Ok(ClientProxy {
            routes,
            coder,
            memory: self.memory.clone(),
            spool_disk: self.spool_disk.clone(),
            in_flight: self.in_flight.clone(),
            hot: self.hot.clone(),
            waits: self.waits.clone(),
            stats: self.stats.clone(),
            store: self.store.clone(),
            replicas: self.replicas.clone(),
            config,
        })
    }

    /// `coding`, parking its bodies in the cache's `tmp/`.
    fn parked_in_cache(&self, coding: CoderConfig) -> CoderConfig {
        CoderConfig {
            spool_dir: self.store.root().join("tmp"),
            ..coding
        }
    }

    /// What codes the answers to client proxies behind this one: it takes
    /// the same memory and disk budgets as the relays.
    fn downstream_coder(&self, coding: CoderConfig) -> Coder {
        Coder::sharing(
            self.parked_in_cache(coding),
            Arc::default(),
            self.memory.clone(),
            self.spool_disk.clone(),
        )
    }

    /// The health of each upstream proxy the routes name, once each (direct
    /// ways have none), for the status page and metrics.
    pub fn health_views(&self) -> Vec<crate::http::health::HealthView> {
        self.routes.health_views(tokio::time::Instant::now())
    }

    /// The counters.
    pub fn stats(&self) -> &ClientStats {
        &self.stats
    }

    /// What `GET /.rproxy/stats` answers: the counters, the first waits
    /// in the upstream's queue and the zones replicated, as JSON.
    pub fn stats_json(&self) -> String {
        self.stats
            .to_json(&self.waits.views(MAX_LISTED_WAITS), &self.replicas.views())
    }

    /// The transfer memory's shares now, for the metrics.
    pub fn transfer_memory_figures(&self) -> MemoryFigures {
        self.memory.figures()
    }

    /// The replicated zones, for the metrics.
    pub fn feed_figures(&self) -> Vec<crate::admin::FeedFigures> {
        self.replicas.figures()
    }

    /// The zones replicated from change feeds (`[[subscribe]]`): spawn
    /// [`ClientProxy::replicate`] for each.
    pub fn replicas(&self) -> &Arc<Replicas> {
        &self.replicas
    }

    /// The cache.
    pub fn store(&self) -> &CacheStore {
        &self.store
    }

    /// The waits in the upstream's queue.
    pub fn queue_waits(&self) -> &Arc<QueueWaits> {
        &self.waits
    }

    /// Serves QUEUE callbacks (and change feed pushes) on `listener`
    /// (`--queue-callback`) for ever;
    /// `X-Node` tells the upstream where it is only if the configuration
    /// names it ([`QueueWaitConfig::node`]).
    pub fn serve_queue_callbacks(
        &self,
        listener: tokio::net::TcpListener,
    ) -> impl Future<Output = ()> + Send + 'static {
        queue_wait::callback::serve_callbacks(listener, self.waits.clone(), self.replicas.clone())
    }

    fn is_shared(&self) -> bool {
        self.config.scope == CacheScope::Shared
    }

    async fn proxy(self: Arc<Self>, request: Request<RequestBody>) -> Response<ProxyBody> {
        let started = Instant::now();
        if request.method() == Method::GET
            && request.uri().authority().is_none()
            && request.uri().path() == STATS_PATH
        {
            let mut response = Response::new(full(self.stats_json()));
            response.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
            return response;
        }
        // Requests for the web: the stats polls are not among them.
        ClientStats::add(&self.stats.requests, 1);
        if request.method() == Method::CONNECT {
            return self.tunnel(request).await;
        }
        let target = match self.routes.target(&request) {
            Ok(target) => target,
            Err(refusal) => return refusal.log_and_respond(),
        };
        if via_names_hop(request.headers(), self.config.via_name.as_bytes()) {
            return ProxyError::loop_detected(format!(
                "request already passed {}",
                self.config.via_name.to_str().unwrap_or("us")
            ))
            .log_and_respond();
        }
        // A proxy behind us replicating a zone we replicate.
        if let Some(response) = self.answer_feed_pull(
            request.method(),
            &target.url,
            request.headers(),
            request.extensions().get::<Peer>().map(|peer| peer.0),
        ) {
            return response;
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
                return ProxyError::bad_request(format!("cannot cache {}: {e}", target.url))
                    .log_and_respond();
            }
        };
        let (mut parts, body) = request.into_parts();
        if let Err(e) = strip_hop_by_hop(&mut parts.headers) {
            return ProxyError::bad_request(e.to_string()).log_and_respond();
        }
        // A downstream client proxy's offer (a chain of proxies): what we
        // serve it is coded against its basis, as an accelerator codes.
        let downstream = self
            .coder
            .as_ref()
            .map(|coder| coder.offer(&parts.method, &parts.headers))
            .filter(|offer| offer.encodable)
            .map(|offer| (offer, parts.headers.clone()));
        // Hsync headers from the user agent are never ours to trust, and
        // it cannot take the coding from us: we offer it ourselves, where
        // we decode it.
        for name in [
            HSYNC_BASIS,
            HSYNC_SIGNATURE,
            HSYNC_SIGNATURE_LENGTH,
            HSYNC_ACCEPT,
        ] {
            parts.headers.remove(name);
        }
        remove_hsync_coding(&mut parts.headers);
        let method = parts.method.clone();
        let url = target.url.to_string();
        let note = parts.extensions.get::<Note>().cloned();
        if let Some(note) = &note {
            note.side(Side::Client);
        }
        parts.extensions.insert(Started(started));
        let uri = target.url.clone();
        let response = match method {
            Method::GET | Method::HEAD => self.clone().cacheable(parts, body, target, key).await,
            _ => self.clone().pass_unsafe(parts, body, target, key).await,
        };
        let response = match (&self.coder, downstream) {
            (Some(coder), Some((offer, request))) => {
                code_downstream(coder, response, offer, &request, method.clone(), uri).await
            }
            _ => response,
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
        // What came from upstream, for the access log, when the relay's
        // own report does not say (`LoggedAtEnd`): nothing for an answer
        // from the cache (a hit, or a 304 that revalidated it), the body
        // as it passed for one forwarded, nothing known for our own.
        let passed = !logged
            && parts.headers.contains_key(CACHE_STATUS)
            && !cache.contains("; hit")
            && !cache.contains("fwd-status=304");
        if let Some(note) = &note {
            if passed {
                note.coding("identity", None);
            } else if cache.contains("; hit") || cache.contains("fwd-status=304") {
                note.from_upstream(0);
            }
        }
        // Counted when the body is over, with the bytes that really went: a
        // user agent that left early got only those.
        let stats = self.stats.clone();
        let body = counted(body, move |bytes, complete| {
            ClientStats::add(&stats.downstream_bytes, bytes);
            if passed {
                // Crossed the link as it came: not saved.
                ClientStats::add(&stats.upstream_bytes, bytes);
                if let Some(note) = note {
                    note.from_upstream(bytes);
                }
            }
            if !logged {
                tracing::debug!(
                    %method, %url, status, %cache, downstream_bytes = bytes, complete,
                    ms = started.elapsed().as_secs_f64() * 1e3, "answered"
                );
            }
        });
        Response::from_parts(parts, body)
    }

    /// GET and HEAD: from the cache when fresh, else upstream.
    async fn cacheable(
        self: Arc<Self>,
        parts: Parts,
        body: RequestBody,
        target: Target,
        key: CacheKey,
    ) -> Response<ProxyBody> {
        let request_cc = CacheControl::parse_request(&parts.headers);
        let mut stale = match self.lookup(&key, &parts).await {
            Lookup::Fresh(response) => return response,
            Lookup::Stale(entry) => Some(entry),
            Lookup::Miss => None,
        };
        if parts.method == Method::GET
            && let Some(entry) = stale.take()
        {
            stale = match self.serve_stale_while_revalidating(entry, &parts).await {
                Ok(served) => {
                    self.revalidate_in_background(&parts, &target, &key);
                    match served {
                        Some(response) => return response,
                        // Its body failed its check: fetched as a miss.
                        None => None,
                    }
                }
                Err(entry) => Some(entry),
            };
        }
        if request_cc.only_if_cached {
            return ProxyError::not_cached("only-if-cached, and no fresh entry is stored")
                .log_and_respond();
        }
        if parts.method == Method::HEAD {
            return self.pass(parts, body, target).await;
        }
        let navigation = queue_wait::page::is_navigation(&parts.method, &parts.headers);
        if navigation
            && let Some(response) = self
                .waits
                .attach(&key, &parts.headers, &self.config.via_name)
                .await
        {
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
}

impl ClientProxy {
    /// Revalidates the stale entry for `key` as a task of its own, as the
    /// leader of its fetch (RFC 5861 `stale-while-revalidate`): nothing if
    /// a fetch for it is already under way. The request is the user
    /// agent's head (its Vary'd fields select the entry) without its own
    /// conditions and range; the answer is read to its end, which stores
    /// it.
    fn revalidate_in_background(self: &Arc<Self>, parts: &Parts, target: &Target, key: &CacheKey) {
        let Role::Leader(leader) = self.in_flight.join(key.digest()) else {
            return;
        };
        let mut request = Request::get(parts.uri.clone())
            .body(())
            .expect("a GET of a parsed URI");
        *request.headers_mut() = parts.headers.clone();
        for name in [header::RANGE, header::IF_RANGE] {
            request.headers_mut().remove(name);
        }
        let (background, ()) = request.into_parts();
        let (proxy, target, key) = (self.clone(), target.clone(), key.clone());
        tokio::spawn(async move {
            let stale = match proxy.lookup(&key, &background).await {
                Lookup::Stale(entry) => Some(entry),
                Lookup::Fresh(_) => return,
                Lookup::Miss => None,
            };
            let response = proxy
                .fetch(background, target, key, stale, Some(leader))
                .await;
            let status = response.status();
            if let Err(error) = response.into_body().collect().await {
                tracing::debug!(%error, "background revalidation cut");
            } else {
                tracing::debug!(%status, "revalidated in the background");
            }
        });
    }
}

impl Handler for ClientProxy {
    /// [`ClientProxy::proxy`], and the one place its refusals are counted
    /// by fault and reason: they are made all along the request path
    /// (here, `hit.rs`, `fetch.rs`, `pass.rs`, a queue wait's task), and
    /// each carries its kind on the response it became.
    fn handle(
        self: Arc<Self>,
        request: Request<RequestBody>,
    ) -> impl Future<Output = Response<ProxyBody>> + Send {
        let stats = self.stats.clone();
        async move {
            let response = self.proxy(request).await;
            if let Some(kind) = refusal_of(&response) {
                stats.refused(kind);
            }
            response
        }
    }
}

/// `Cache-Status` (RFC 9211).
pub const CACHE_STATUS: HeaderName = HeaderName::from_static("cache-status");

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn empty() -> ProxyBody {
    Empty::<Bytes>::new()
        .map_err(|never| match never {})
        .boxed()
}
