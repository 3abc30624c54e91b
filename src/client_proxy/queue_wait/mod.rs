//! The client proxy's waits in the upstream's queue for an upload slot
//! (issue 5). Every request goes upstream offering PARQ (`X-Queue: 1.0`,
//! and `X-Node` when `--queue-callback` listens). When the upstream
//! queues a GET or HEAD, the user agent's request waits while we come
//! back for it, in the dialect the upstream answered ([`place`]):
//!
//! - PARQ: at each `Retry-After`, with `X-Queued: position=…; ID=…`. In
//!   the synchronous part (the answer keeps its connection) the place is
//!   kept by the connection, so later polls go on a connection of our own
//!   ([`HeldConnection`](super::upstream::HeldConnection)): the pool cannot promise the same one twice, and
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
//! The polls themselves, the step of a trip upstream that waits, are
//! `polls.rs`'s; this file keeps what a wait shows and how a navigation
//! watches it (registry, stats view, parking behind the page).
//!
//! Main types: [`QueueWaitConfig`], [`QueueWaits`], [`Wait`],
//! [`WaitView`].

pub mod callback;
pub mod page;
pub mod place;
mod polls;

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use http::Response;
use http::header::{HeaderMap, HeaderValue};
use http::request::Parts;
use tokio::sync::{Notify, oneshot, watch};
use tokio::time::Instant;

use super::ClientStats;
pub use super::stats::WaitView;
use crate::cache::CacheKey;
use crate::http::error::ProxyError;
use crate::http::server::ProxyBody;
use crate::queue::QueueId;
use page::{PAGE_REFRESH, PageView, WaitKey, waiting_page};
use place::Dialect;

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

/// A navigation's wait, begun before its fetch: what the fetch reports its
/// place to ([`Observed`]) and the key its page is parked under.
pub(in crate::client_proxy) struct NavigationWait {
    key: WaitKey,
    wait: Arc<Wait>,
}

impl QueueWaits {
    /// A navigation that a background wait for the same request (same
    /// cache key, same credentials and cookies) is parked for: picks it
    /// up, and answers with its result, or with the page again while it
    /// still waits. `None` when no wait is parked for it.
    pub(in crate::client_proxy) async fn attach(
        self: &Arc<Self>,
        key: &CacheKey,
        headers: &HeaderMap,
        via_name: &HeaderValue,
    ) -> Option<Response<ProxyBody>> {
        let wait_key = WaitKey::new(&key.digest(), headers);
        let parked = self.unpark(&wait_key)?;
        tracing::debug!(url = %parked.wait.url, "picked up a parked queue wait");
        let page_at = Instant::now() + self.config.page_after;
        Some(self.watch(wait_key, parked, page_at, via_name).await)
    }

    /// Begins the wait of a navigation about to be fetched: the request
    /// carries it, so that the queue wait on the way shows its place.
    pub(in crate::client_proxy) fn begin_navigation(
        &self,
        key: &CacheKey,
        parts: &mut Parts,
    ) -> NavigationWait {
        let wait_key = WaitKey::new(&key.digest(), &parts.headers);
        let wait = Arc::new(Wait::new(key.to_string(), Instant::now()));
        parts.extensions.insert(Observed(wait.clone()));
        NavigationWait {
            key: wait_key,
            wait,
        }
    }

    /// Waits for the answer of a navigation's fetch, running as a task of
    /// its own; after `--queue-page-after` in the upstream's queue, the
    /// user agent gets the waiting page while the wait goes on.
    pub(in crate::client_proxy) async fn watch_navigation(
        self: &Arc<Self>,
        navigation: NavigationWait,
        result: oneshot::Receiver<Response<ProxyBody>>,
        via_name: &HeaderValue,
    ) -> Response<ProxyBody> {
        let NavigationWait { key, wait } = navigation;
        let page_at = wait.since + self.config.page_after;
        self.watch(key, Parked { wait, result }, page_at, via_name)
            .await
    }

    /// Waits for a background fetch's answer; once `page_at` has passed
    /// while it waits in the upstream's queue, parks it and answers with
    /// the waiting page instead.
    async fn watch(
        self: &Arc<Self>,
        key: WaitKey,
        parked: Parked,
        page_at: Instant,
        via_name: &HeaderValue,
    ) -> Response<ProxyBody> {
        let mut shown = parked.wait.shown.subscribe();
        let mut watching = Watching {
            waits: self.clone(),
            key,
            parked: Some(parked),
        };
        let mut page_due = false;
        loop {
            let parked = watching.parked.as_mut().expect("present until returned");
            tokio::select! {
                result = &mut parked.result => {
                    watching.parked = None;
                    return result.unwrap_or_else(|_| fetch_ended().log_and_respond());
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
            crate::http::headers::add_via(page.headers_mut(), via_name);
            let parked = watching.parked.take().expect("present until returned");
            match self.park(key, parked) {
                Ok(()) => return page,
                Err(parked) => {
                    // No room to park: wait on, without a page.
                    watching.parked = Some(parked);
                    tracing::warn!(
                        max = MAX_PARKED,
                        "too many parked queue waits; no waiting page"
                    );
                    let parked = watching.parked.as_mut().expect("just put back");
                    return (&mut parked.result)
                        .await
                        .unwrap_or_else(|_| fetch_ended().log_and_respond());
                }
            }
        }
    }
}

/// A navigation's fetch task that ended without sending its answer (it
/// panicked, or the runtime is shutting down): our failure, answered 502
/// as any fetch that failed.
fn fetch_ended() -> ProxyError {
    ProxyError::internal_bad_gateway("the fetch ended without an answer")
}
