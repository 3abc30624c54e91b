//! The client proxy's waits in the upstream's queue for an upload slot
//! (issue 5). Every request goes upstream offering PARQ (`X-Queue: 1.0`,
//! and `X-Node` when `--queue-callback` listens). When the upstream
//! queues a GET or HEAD, the user agent's request waits while we come
//! back for it, in the dialect the upstream answered ([`place`]):
//!
//! - PARQ: at each `Retry-After`, with `X-Queued: position=…; ID=…`. In
//!   the synchronous part (the answer keeps its connection) the place is
//!   kept by the connection, so later polls go on a connection of our own
//!   ([`HeldConnection`]): the pool cannot promise the same one twice, and
//!   the upstream forgives one lost connection only.
//! - Active Queueing 0.1 (seed 001): the place is the connection. An
//!   answer that came on a pooled connection is given up (the connection
//!   is retired, so the upstream frees it at once) for a place on a held
//!   connection, polled between pollMin and pollMax with `X-Queue: 0.1`.
//!
//! After `--queue-wait-max` the upstream's last `503` and `Retry-After`
//! go to the user agent. A QUEUE callback for our ID ([`callback`]) makes
//! the wait come back at once.
//!
//! What waits is visible: a log line per step (position, length, ETA), the
//! waiting requests in `/.rproxy/stats` ([`QueueWaits::views`]), and for
//! a navigation that has waited `--queue-page-after`, a self-refreshing
//! `503` page ([`page`]) while the wait goes on in the background, parked
//! under its [`WaitKey`] until the reload picks it up. A parked wait that
//! no reload picks up within [`PARK_EXPIRY`] is dropped, with its place
//! upstream and any answer it got; every wait ends by `--queue-wait-max`.
//!
//! Main types: [`QueueWaitConfig`], [`QueueWaits`], [`Wait`],
//! [`WaitView`].

pub mod callback;
pub mod page;
pub mod place;

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use http::header::{HeaderMap, HeaderValue};
use http::request::Parts;
use http::{Method, Request, Response, StatusCode, Version};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use tokio::sync::{Notify, oneshot, watch};
use tokio::time::Instant;

use super::upstream::{HeldConnection, PooledConnection};
use super::{ClientProxy, ClientStats, Target, coalesce, empty, error};
use crate::cache::{CacheKey, Entry};
use crate::http::server::ProxyBody;
use crate::queue::{QueueId, X_NODE, X_QUEUE, X_QUEUED};
use page::{PAGE_REFRESH, PageView, WaitKey, waiting_page};
use place::{Dialect, EtaEstimate, Place};

/// Waiting requests listed in `/.rproxy/stats` at most (the oldest).
pub const MAX_LISTED_WAITS: usize = 100;
/// Background waits parked for a reload at most; past it a navigation
/// waits without a page, as any request does.
pub const MAX_PARKED: usize = 1024;
/// How long a parked wait is kept for a reload that does not come (the
/// page reloads every [`PAGE_REFRESH`]).
pub const PARK_EXPIRY: Duration = Duration::from_secs(20);
/// Largest queued answer body read so that its connection can carry the
/// next poll; a larger one costs the connection.
const MAX_QUEUED_BODY: usize = 64 << 10;
/// Held connections lost (closed by the upstream, failed) in one wait
/// before the wait gives up.
const MAX_LOST_CONNECTIONS: u32 = 2;

/// The `X-Queue` we offer on pooled requests: PARQ, which also gets us a
/// legacy answer from a legacy server (seed 000 §7).
const OFFER_PARQ: HeaderValue = HeaderValue::from_static("1.0");
/// The `X-Queue` of legacy polls on a held connection (seed 001).
const OFFER_LEGACY: HeaderValue = HeaderValue::from_static("0.1");

/// Settings of the waits in the upstream's queue.
#[derive(Debug, Clone)]
pub struct QueueWaitConfig {
    /// Longest a request waits; then the upstream's `503` goes to the
    /// user agent (`--queue-wait-max`). Bounds the background waits behind
    /// waiting pages.
    pub wait_max: Duration,
    /// Longest a request waits while its user agent holds the connection
    /// open for the answer (no waiting page): keep it below the connection
    /// layer's idle timeout, which closes a connection where no byte
    /// moves. At most `wait_max`.
    pub held_max: Duration,
    /// How long a navigation waits before it gets the waiting page
    /// (`--queue-page-after`).
    pub page_after: Duration,
    /// Where the QUEUE callback listener is reached, sent as `X-Node`
    /// (`--queue-callback`, `--queue-node`); `None`: no callbacks.
    pub node: Option<SocketAddr>,
}

impl Default for QueueWaitConfig {
    fn default() -> Self {
        QueueWaitConfig {
            wait_max: Duration::from_secs(300),
            held_max: Duration::from_secs(50),
            page_after: Duration::from_secs(3),
            node: None,
        }
    }
}

/// One request waiting in the upstream's queue, as the stats, its page
/// and a QUEUE callback see it.
pub struct Wait {
    url: String,
    since: Instant,
    shown: watch::Sender<Option<Shown>>,
    wake: Notify,
}

/// The place last told, as shown.
#[derive(Debug, Clone, Copy)]
struct Shown {
    dialect: Dialect,
    position: u32,
    length: Option<u32>,
    /// The upstream's estimate, or ours from the progress.
    eta: Option<Duration>,
    /// When we come back: no answer can come sooner.
    next_poll: Instant,
}

impl Shown {
    /// The estimated wait from now: never less than the time to the next
    /// poll, whatever the estimate says (a slot is given only when we ask).
    fn eta(&self) -> Option<Duration> {
        let to_poll = self.next_poll.saturating_duration_since(Instant::now());
        self.eta.map(|eta| eta.max(to_poll))
    }
}

impl Wait {
    fn new(url: String, since: Instant) -> Wait {
        Wait {
            url,
            since,
            shown: watch::channel(None).0,
            wake: Notify::new(),
        }
    }

    fn shown(&self) -> Option<Shown> {
        *self.shown.borrow()
    }

    fn page_view(&self, shown: &Shown) -> PageView<'_> {
        PageView {
            url: &self.url,
            dialect: shown.dialect,
            position: shown.position,
            length: shown.length,
            eta: shown.eta(),
            next_check: shown.next_poll.saturating_duration_since(Instant::now()),
            waited: self.since.elapsed(),
        }
    }
}

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

/// The waits of one client proxy: those under way (for stats and
/// callbacks) and those parked for a reload.
pub struct QueueWaits {
    config: QueueWaitConfig,
    node: Option<HeaderValue>,
    stats: Arc<ClientStats>,
    waiting: Mutex<Registry>,
    parked: Mutex<HashMap<WaitKey, ParkedSlot>>,
    next: AtomicU64,
}

#[derive(Default)]
struct Registry {
    /// By registration number: the oldest first.
    order: BTreeMap<u64, Arc<Wait>>,
    /// PARQ IDs of the waits, for callbacks.
    ids: HashMap<QueueId, u64>,
}

/// A background wait parked for a reload: what it shows, and its answer
/// once it comes. Dropping it drops the answer and, while the answer has
/// not come, the wait itself.
struct Parked {
    wait: Arc<Wait>,
    result: oneshot::Receiver<Response<ProxyBody>>,
}

struct ParkedSlot {
    generation: u64,
    parked: Parked,
}

/// A wait listed in the registry until dropped.
struct Registered<'a> {
    waits: &'a QueueWaits,
    number: u64,
    wait: Arc<Wait>,
}

impl Registered<'_> {
    fn set_id(&self, id: Option<QueueId>) {
        let mut registry = self.waits.lock_waiting();
        registry.ids.retain(|_, number| *number != self.number);
        if let Some(id) = id {
            registry.ids.insert(id, self.number);
        }
    }
}

impl Drop for Registered<'_> {
    fn drop(&mut self) {
        let mut registry = self.waits.lock_waiting();
        registry.order.remove(&self.number);
        registry.ids.retain(|_, number| *number != self.number);
        self.waits
            .stats
            .queue_waiting
            .fetch_sub(1, Ordering::Relaxed);
    }
}

impl QueueWaits {
    /// The waits of a proxy whose counters are `stats`.
    pub fn new(config: QueueWaitConfig, stats: Arc<ClientStats>) -> QueueWaits {
        let node = config
            .node
            .and_then(|node| HeaderValue::try_from(node.to_string()).ok());
        QueueWaits {
            config,
            node,
            stats,
            waiting: Mutex::new(Registry::default()),
            parked: Mutex::new(HashMap::new()),
            next: AtomicU64::new(1),
        }
    }

    /// The settings.
    pub fn config(&self) -> &QueueWaitConfig {
        &self.config
    }

    fn lock_waiting(&self) -> MutexGuard<'_, Registry> {
        self.waiting.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn lock_parked(&self) -> MutexGuard<'_, HashMap<WaitKey, ParkedSlot>> {
        self.parked.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn register(&self, wait: Arc<Wait>) -> Registered<'_> {
        let number = self.next.fetch_add(1, Ordering::Relaxed);
        self.lock_waiting().order.insert(number, wait.clone());
        ClientStats::add(&self.stats.queue_waiting, 1);
        Registered {
            waits: self,
            number,
            wait,
        }
    }

    /// Wakes the wait that holds PARQ ID `id`, so that it comes back at
    /// once; false when no wait holds it.
    pub fn wake(&self, id: QueueId) -> bool {
        let registry = self.lock_waiting();
        let Some(wait) = registry
            .ids
            .get(&id)
            .and_then(|number| registry.order.get(number))
        else {
            return false;
        };
        // Only a wait asleep is woken: one under way is coming back
        // anyway, and a stored wake-up would make its next poll too early
        // (PARQ frees a place asked for before Retry-After).
        wait.wake.notify_waiters();
        true
    }

    /// The requests waiting now, the oldest first, at most `limit`.
    pub fn views(&self, limit: usize) -> Vec<WaitView> {
        let registry = self.lock_waiting();
        registry
            .order
            .values()
            .filter_map(|wait| {
                let shown = wait.shown()?;
                Some(WaitView {
                    dialect: match shown.dialect {
                        Dialect::Parq => "parq",
                        Dialect::Legacy => "legacy",
                    }
                    .to_owned(),
                    position: shown.position,
                    length: shown.length,
                    eta_secs: shown.eta().map(|eta| eta.as_secs()),
                    next_poll_secs: shown
                        .next_poll
                        .saturating_duration_since(Instant::now())
                        .as_secs(),
                    waited_secs: wait.since.elapsed().as_secs(),
                })
            })
            .take(limit)
            .collect()
    }

    /// Background waits parked for a reload.
    pub fn parked(&self) -> usize {
        self.lock_parked().len()
    }

    /// Requests waiting in the upstream's queue now.
    pub fn waiting(&self) -> usize {
        self.lock_waiting().order.len()
    }

    /// Parks a background wait for a reload under `key`, for at most
    /// [`PARK_EXPIRY`]. When a wait is parked under the key already, it is
    /// kept (its place is older) and this one dropped. `Err` gives the
    /// wait back when the table is full.
    fn park(self: &Arc<Self>, key: WaitKey, parked: Parked) -> Result<(), Parked> {
        let mut table = self.lock_parked();
        if table.contains_key(&key) {
            return Ok(());
        }
        if table.len() >= MAX_PARKED {
            return Err(parked);
        }
        let generation = self.next.fetch_add(1, Ordering::Relaxed);
        table.insert(key, ParkedSlot { generation, parked });
        drop(table);
        let waits: Weak<QueueWaits> = Arc::downgrade(self);
        tokio::spawn(async move {
            tokio::time::sleep(PARK_EXPIRY).await;
            let Some(waits) = waits.upgrade() else {
                return;
            };
            let mut table = waits.lock_parked();
            if table.get(&key).is_some_and(|s| s.generation == generation) {
                let slot = table.remove(&key);
                drop(table);
                if let Some(slot) = slot {
                    tracing::info!(url = %slot.parked.wait.url, "queue wait abandoned: no reload came");
                }
            }
        });
        Ok(())
    }

    fn unpark(&self, key: &WaitKey) -> Option<Parked> {
        self.lock_parked().remove(key).map(|slot| slot.parked)
    }
}

/// The wait a navigation's fetch reports its place to (a request
/// extension, passed on to the upstream request).
#[derive(Clone)]
pub(super) struct Observed(Arc<Wait>);

/// A navigation watching its wait: if the user agent leaves while the wait
/// is queued, the wait is parked for a reload rather than dropped.
struct Watching {
    waits: Arc<QueueWaits>,
    key: WaitKey,
    parked: Option<Parked>,
}

impl Drop for Watching {
    fn drop(&mut self) {
        if let Some(parked) = self.parked.take()
            && parked.wait.shown().is_some()
            && tokio::runtime::Handle::try_current().is_ok()
        {
            let _ = self.waits.park(self.key, parked);
        }
    }
}

/// The request again, for one more try (the body was sent with the first).
fn again(parts: &Parts, body: ProxyBody) -> Request<ProxyBody> {
    let mut request = Request::new(body);
    *request.method_mut() = parts.method.clone();
    *request.uri_mut() = parts.uri.clone();
    *request.version_mut() = parts.version;
    *request.headers_mut() = parts.headers.clone();
    request
}

/// Reads a queued answer's body to its end, so its connection can carry
/// the next request; false when it is too large, fails or takes too long.
async fn drain(response: Response<Incoming>, within: Duration) -> bool {
    let body = Limited::new(response.into_body(), MAX_QUEUED_BODY);
    matches!(
        tokio::time::timeout(within, body.collect()).await,
        Ok(Ok(_))
    )
}

impl ClientProxy {
    /// The waits in the upstream's queue.
    pub fn queue_waits(&self) -> &Arc<QueueWaits> {
        &self.waits
    }

    /// Serves QUEUE callbacks on `listener` (`--queue-callback`) for ever;
    /// `X-Node` tells the upstream where it is only if the configuration
    /// names it ([`QueueWaitConfig::node`]).
    pub fn serve_queue_callbacks(
        &self,
        listener: tokio::net::TcpListener,
    ) -> impl Future<Output = ()> + Send + 'static {
        callback::serve_callbacks(listener, self.waits.clone())
    }

    /// Sends a request upstream, offering PARQ; when the upstream queues a
    /// GET or HEAD, waits in its queue (see the module doc) for at most
    /// `--queue-wait-max`. `Err` is the status and message for the user
    /// agent.
    pub(super) async fn send(
        &self,
        request: Request<ProxyBody>,
        target: &Target,
    ) -> Result<Response<Incoming>, (StatusCode, String)> {
        let started = Instant::now();
        let (mut parts, body) = request.into_parts();
        // The queue headers of this hop are ours, never the user agent's.
        parts.headers.remove(&X_QUEUED);
        parts.headers.remove(&X_NODE);
        parts.headers.insert(X_QUEUE.clone(), OFFER_PARQ);
        if let Some(node) = &self.waits.node {
            parts.headers.insert(X_NODE.clone(), node.clone());
        }
        let response = self.send_once(again(&parts, body), target).await?;
        if !matches!(parts.method, Method::GET | Method::HEAD) {
            return Ok(response);
        }
        let Some(place) = Place::read(response.status(), response.version(), response.headers())
        else {
            return Ok(response);
        };
        // A navigation can be given the waiting page, and then waits in
        // the background; any other request waits with its user agent on
        // the line.
        let (wait, max) = match parts.extensions.get::<Observed>() {
            Some(Observed(wait)) => (wait.clone(), self.waits.config.wait_max),
            None => (
                Arc::new(Wait::new(target.url.to_string(), started)),
                self.waits.config.held_max.min(self.waits.config.wait_max),
            ),
        };
        let give_up = wait.since + max;
        let registered = self.waits.register(wait);
        self.wait_in_queue(&mut parts, response, place, target, &registered, give_up)
            .await
    }

    /// The wait itself, from the first queued answer on.
    async fn wait_in_queue(
        &self,
        parts: &mut Parts,
        mut response: Response<Incoming>,
        mut place: Place,
        target: &Target,
        registered: &Registered<'_>,
        give_up: Instant,
    ) -> Result<Response<Incoming>, (StatusCode, String)> {
        let wait = &registered.wait;
        let mut progress = EtaEstimate::default();
        let mut held: Option<HeldConnection> = None;
        let mut lost_connections = 0;
        loop {
            let now = Instant::now();
            progress.observe(place.position, now);
            let eta = place.eta.or_else(|| progress.eta());
            // A legacy place on a pooled connection cannot be polled on
            // that connection: a place on a held one is taken at once.
            let moving = place.dialect == Dialect::Legacy && held.is_none();
            let come_back = if moving {
                Duration::ZERO
            } else {
                place.come_back_after()
            };
            let at = now + come_back;
            let shown = Shown {
                dialect: place.dialect,
                position: place.position,
                length: place.length,
                eta,
                next_poll: at,
            };
            wait.shown.send_replace(Some(shown));
            registered.set_id(place.id);
            if at > give_up {
                tracing::info!(
                    url = %wait.url,
                    dialect = ?place.dialect,
                    position = place.position,
                    waited_secs = wait.since.elapsed().as_secs(),
                    back_in_secs = come_back.as_secs(),
                    may_wait_secs = give_up.saturating_duration_since(wait.since).as_secs(),
                    "gave up waiting in the upstream's queue"
                );
                // The place and its ID are ours, not the user agent's.
                response.headers_mut().remove(&X_QUEUE);
                response.headers_mut().remove(&X_QUEUED);
                return Ok(response);
            }
            ClientStats::add(&self.stats.queue_waits, 1);
            tracing::info!(
                url = %wait.url,
                dialect = ?place.dialect,
                position = place.position,
                length = place.length,
                eta_secs = shown.eta().map(|e| e.as_secs()),
                back_in_secs = come_back.as_secs_f64(),
                waited_secs = wait.since.elapsed().as_secs(),
                "queued upstream; waiting"
            );
            // Leave the answer's connection as the next poll needs it.
            match (&held, place.held) {
                (Some(_), true) => {
                    if !drain(response, self.config.upstream_timeout).await {
                        held = None;
                    }
                }
                (None, true) if place.dialect == Dialect::Legacy => {
                    if response.version() == Version::HTTP_11
                        && let Some(pooled) = response.extensions().get::<PooledConnection>()
                    {
                        // Closed once dropped: the upstream frees the
                        // place it held by it.
                        pooled.retire();
                    }
                    drop(response);
                }
                (None, true) => {
                    // PARQ Sq on a pooled connection: read to the end, so
                    // the connection goes back to the pool rather than
                    // closing, which would cost the place its one allowed
                    // disconnection.
                    drain(response, self.config.upstream_timeout).await;
                }
                (_, false) => {
                    held = None;
                    drop(response);
                }
            }
            tokio::select! {
                () = tokio::time::sleep_until(at) => {}
                () = wait.wake.notified() => {
                    tracing::info!(url = %wait.url, "woken by a QUEUE callback");
                }
            }
            let offer = match place.dialect {
                Dialect::Parq => OFFER_PARQ,
                Dialect::Legacy => OFFER_LEGACY,
            };
            parts.headers.insert(X_QUEUE.clone(), offer);
            match place.claim() {
                Some(claim) => parts.headers.insert(X_QUEUED.clone(), claim),
                None => parts.headers.remove(&X_QUEUED),
            };
            response = if place.held {
                match self
                    .send_held(&mut held, again(parts, empty()), target)
                    .await
                {
                    Ok(response) => response,
                    Err(message) => {
                        held = None;
                        lost_connections += 1;
                        if lost_connections > MAX_LOST_CONNECTIONS {
                            return Err((
                                StatusCode::BAD_GATEWAY,
                                format!("lost our place in the upstream's queue: {message}"),
                            ));
                        }
                        tracing::info!(url = %wait.url, %message, "lost the connection holding our queue place; asking again");
                        parts.headers.insert(X_QUEUE.clone(), OFFER_PARQ);
                        parts.headers.remove(&X_QUEUED);
                        self.send_once(again(parts, empty()), target).await?
                    }
                }
            } else {
                self.send_once(again(parts, empty()), target).await?
            };
            match Place::read(response.status(), response.version(), response.headers()) {
                Some(next) => place = next,
                None => return Ok(response),
            }
        }
    }

    /// Sends on the held connection, opening it first if there is none or
    /// the upstream closed it. `Err` says why the connection failed.
    async fn send_held(
        &self,
        held: &mut Option<HeldConnection>,
        request: Request<ProxyBody>,
        target: &Target,
    ) -> Result<Response<Incoming>, String> {
        if held.as_ref().is_none_or(HeldConnection::is_closed) {
            let opened = tokio::time::timeout(self.config.connect_timeout, self.upstream.hold());
            *held = Some(match opened.await {
                Ok(Ok(connection)) => connection,
                Ok(Err(e)) => return Err(format!("cannot connect: {e}")),
                Err(_) => return Err("connect timed out".into()),
            });
        }
        let connection = held.as_mut().expect("opened above");
        self.checked(connection.send(request, target.forward))
            .await
            .map_err(|(_, message)| message)
    }

    /// A navigation that a background wait for the same request (same
    /// cache key, same credentials and cookies) is parked for: picks it
    /// up, and answers with its result, or with the page again while it
    /// still waits. `None` when no wait is parked for it.
    pub(super) async fn attach_to_wait(
        &self,
        key: &CacheKey,
        headers: &HeaderMap,
    ) -> Option<Response<ProxyBody>> {
        let wait_key = WaitKey::new(&key.digest(), headers);
        let parked = self.waits.unpark(&wait_key)?;
        tracing::debug!(url = %parked.wait.url, "picked up a parked queue wait");
        let page_at = Instant::now() + self.waits.config.page_after;
        Some(self.watch(wait_key, parked, page_at).await)
    }

    /// Fetches for a navigation: the fetch runs as a task of its own, so
    /// that when it has waited `--queue-page-after` in the upstream's
    /// queue the user agent can be given the waiting page while the wait
    /// goes on.
    pub(super) async fn fetch_navigation(
        self: Arc<Self>,
        mut parts: Parts,
        target: Target,
        key: CacheKey,
        stale: Option<Entry>,
        leader: Option<coalesce::Leader>,
    ) -> Response<ProxyBody> {
        let wait_key = WaitKey::new(&key.digest(), &parts.headers);
        let wait = Arc::new(Wait::new(key.to_string(), Instant::now()));
        parts.extensions.insert(Observed(wait.clone()));
        let (mut sender, result) = oneshot::channel();
        let fetch = self.clone().fetch(parts, target, key, stale, leader);
        tokio::spawn(async move {
            tokio::select! {
                response = fetch => {
                    let _ = sender.send(response);
                }
                // Nobody will take the answer any more: stop waiting.
                () = sender.closed() => {}
            }
        });
        let page_at = wait.since + self.waits.config.page_after;
        self.watch(wait_key, Parked { wait, result }, page_at).await
    }

    /// Waits for a background fetch's answer; once `page_at` has passed
    /// while it waits in the upstream's queue, parks it and answers with
    /// the waiting page instead.
    async fn watch(&self, key: WaitKey, parked: Parked, page_at: Instant) -> Response<ProxyBody> {
        let mut shown = parked.wait.shown.subscribe();
        let mut watching = Watching {
            waits: self.waits.clone(),
            key,
            parked: Some(parked),
        };
        let mut page_due = false;
        loop {
            let parked = watching.parked.as_mut().expect("present until returned");
            tokio::select! {
                result = &mut parked.result => {
                    watching.parked = None;
                    return result.unwrap_or_else(|_| error(
                        StatusCode::BAD_GATEWAY,
                        "the fetch ended without an answer".into(),
                    ));
                }
                () = tokio::time::sleep_until(page_at), if !page_due => page_due = true,
                // The sender lives in the wait we hold: never closed.
                _ = shown.changed() => {}
            }
            let Some(now_shown) = parked.wait.shown() else {
                continue;
            };
            if !page_due {
                continue;
            }
            let mut page = waiting_page(&parked.wait.page_view(&now_shown), PAGE_REFRESH);
            crate::http::headers::add_via(page.headers_mut(), &self.config.via_name);
            let parked = watching.parked.take().expect("present until returned");
            match self.waits.park(key, parked) {
                Ok(()) => return page,
                Err(parked) => {
                    // No room to park: wait on, without a page.
                    watching.parked = Some(parked);
                    tracing::warn!(
                        max = MAX_PARKED,
                        "too many parked queue waits; no waiting page"
                    );
                    let parked = watching.parked.as_mut().expect("just put back");
                    return (&mut parked.result).await.unwrap_or_else(|_| {
                        error(
                            StatusCode::BAD_GATEWAY,
                            "the fetch ended without an answer".into(),
                        )
                    });
                }
            }
        }
    }
}
