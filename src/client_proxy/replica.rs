//! The client proxy as a replica of the zones it subscribes to
//! (`[[subscribe]]`, [`crate::feed`]): it pulls each zone's committed
//! updates every `interval` (at once when its upstream pushes a `FEED`
//! line to the QUEUE callback listener), prefetches the bodies that changed
//! through its own fetch path (coded against what it holds, stored as any
//! answer), and commits each update to its own copy of the log, under the
//! primary's CSN, so proxies behind it replicate from it (and are pushed
//! each update, as the accelerator pushes, when they gave an address).
//!
//! Prefetching yields to users: it waits while any user fetch is under
//! way, one body at a time, and then as long as the bytes it took would
//! take at `rate`. A body it holds already (same digest) costs nothing;
//! with `prefetch = "held"` (the default) a path it holds nothing of is
//! noted, not fetched. An upstream that cannot be reached, or answers
//! 5xx, ends the round where it was: the next round starts there.
//!
//! What an update gives a user is HTTP's to say: the prefetched answer is
//! stored with its own freshness, so a user's next request is a fresh hit
//! when the origin lets it be (`max-age` and the like); the feed never
//! makes a stored answer fresher than its headers do.
//!
//! State: each zone's log is a file in the cache directory
//! (`feed-TOKEN.json`), written after each round that changed it, and
//! bounded as the accelerator's is by default (a week, 100,000 entries).
//!
//! Main types: [`Subscription`], [`Replicas`], [`Zone`].

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use http::header::{self, HeaderMap, HeaderValue};
use http::{Method, Request, Response, StatusCode, Uri};
use http_body_util::{BodyExt, Limited};
use serde::{Deserialize, Serialize};
use tokio::sync::Notify;

use super::coalesce::Role;
use super::transfer::full;
use super::{ClientProxy, empty};
use crate::cache::CacheKey;
use crate::feed::primary::Subscribers;
use crate::feed::wire::callback_node;
use crate::feed::{Answer, FEED_PATH, FeedLog, Pull, Retention, Update, state};
use crate::http::server::{ProxyBody, json_response, text_response};
use crate::queue::X_NODE;

/// Longest pull answer read.
const MAX_ANSWER_BYTES: usize = 64 * 1024 * 1024;
/// Rounds an update is tried again while the upstream serves the old body.
const MAX_STALE_TRIES: u32 = 5;
/// How often a prefetch looks again whether users still fetch.
const USERS_FIRST_POLL: Duration = Duration::from_millis(20);

/// Which changed paths a replica fetches.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Prefetch {
    /// Only paths it holds a body of: its users' pages stay fresh.
    #[default]
    Held,
    /// Every path in the zone: a mirror.
    All,
}

/// One zone subscribed to, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Subscription {
    /// `http://host[:port]/prefix`: the zone. Its updates are pulled from
    /// where the route of its host goes.
    pub zone: Uri,
    /// Time between pulls.
    pub interval: Duration,
    /// Bytes per second prefetches take on average (0: no cap).
    pub rate: u64,
    /// Which changed paths are fetched.
    pub prefetch: Prefetch,
}

impl Subscription {
    /// `http://host[:port]`.
    fn origin(&self) -> String {
        format!(
            "{}://{}",
            self.zone.scheme_str().unwrap_or("http"),
            self.zone.authority().map_or("", |a| a.as_str())
        )
        .to_ascii_lowercase()
    }

    fn prefix(&self) -> String {
        self.zone.path().to_owned()
    }
}

/// One zone's replica: its log and counters.
pub struct Zone {
    subscription: Subscription,
    origin: String,
    prefix: String,
    /// Names the zone in pushes and in its file's name.
    token: String,
    log: Mutex<FeedLog>,
    file: PathBuf,
    wake: Notify,
    counters: ZoneCounters,
    /// Updates whose prefetch found the old body still served, by CSN,
    /// and how often.
    stale_tries: Mutex<std::collections::HashMap<u64, u32>>,
}

#[derive(Default)]
struct ZoneCounters {
    pushed: AtomicU64,
    pulls: AtomicU64,
    pull_failures: AtomicU64,
    resets: AtomicU64,
    updates: AtomicU64,
    prefetched: AtomicU64,
    prefetch_bytes: AtomicU64,
    held_already: AtomicU64,
    not_held: AtomicU64,
}

/// A zone as `/.rproxy/stats` shows it.
#[derive(Debug, Serialize)]
pub struct ZoneView {
    zone: String,
    incarnation: String,
    csn: u64,
    entries: usize,
    /// Pushes received (each made a pull at once).
    pushed: u64,
    pulls: u64,
    pull_failures: u64,
    resets: u64,
    /// Updates received (after collapsing).
    updates: u64,
    /// Bodies fetched because they changed.
    prefetched: u64,
    /// What those fetches took from upstream (link bytes).
    prefetch_bytes: u64,
    /// Updates whose body was held already.
    held_already: u64,
    /// Updates of paths not held (`prefetch = "held"`).
    not_held: u64,
}

impl Zone {
    fn view(&self) -> ZoneView {
        let log = self.log.lock().unwrap_or_else(PoisonError::into_inner);
        let c = &self.counters;
        let n = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        ZoneView {
            zone: self.subscription.zone.to_string(),
            incarnation: log.incarnation().to_owned(),
            csn: log.csn(),
            entries: log.len(),
            pushed: n(&c.pushed),
            pulls: n(&c.pulls),
            pull_failures: n(&c.pull_failures),
            resets: n(&c.resets),
            updates: n(&c.updates),
            prefetched: n(&c.prefetched),
            prefetch_bytes: n(&c.prefetch_bytes),
            held_already: n(&c.held_already),
            not_held: n(&c.not_held),
        }
    }

    fn save(&self) {
        let log = self
            .log
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        if let Err(error) = state::save(&self.file, &log, true) {
            tracing::warn!(zone = %self.subscription.zone, %error, "cannot write the zone's replica log");
        }
    }
}

/// The zones a client proxy replicates.
#[derive(Default)]
pub struct Replicas {
    zones: Vec<Arc<Zone>>,
    /// Proxies behind this one that pulled with a callback address.
    subscribers: Subscribers,
}

impl Replicas {
    /// The zones of `subscriptions`, each with its log as the cache
    /// directory `root` kept it.
    pub fn open(subscriptions: &[Subscription], root: &Path) -> Replicas {
        let zones = subscriptions
            .iter()
            .map(|subscription| {
                let token = blake3::hash(subscription.zone.to_string().as_bytes()).to_hex()[..16]
                    .to_owned();
                let file = root.join(format!("feed-{token}.json"));
                let log = state::load(&file)
                    .map_or_else(|| FeedLog::new(String::new()), |loaded| loaded.log);
                Arc::new(Zone {
                    origin: subscription.origin(),
                    prefix: subscription.prefix(),
                    subscription: subscription.clone(),
                    token,
                    log: Mutex::new(log),
                    file,
                    wake: Notify::new(),
                    counters: ZoneCounters::default(),
                    stale_tries: Mutex::default(),
                })
            })
            .collect();
        Replicas {
            zones,
            subscribers: Subscribers::default(),
        }
    }

    /// The zones.
    pub fn zones(&self) -> &[Arc<Zone>] {
        &self.zones
    }

    /// A push named `token`: its zone pulls now. False for a token that
    /// is none of ours.
    pub fn wake(&self, token: &str) -> bool {
        match self.zones.iter().find(|zone| zone.token == token) {
            Some(zone) => {
                zone.counters.pushed.fetch_add(1, Ordering::Relaxed);
                zone.wake.notify_one();
                true
            }
            None => false,
        }
    }

    /// The zones as the stats show them.
    pub fn views(&self) -> Vec<ZoneView> {
        self.zones.iter().map(|zone| zone.view()).collect()
    }

    /// The zones as the metrics show them.
    pub fn figures(&self) -> Vec<crate::admin::FeedFigures> {
        self.views()
            .into_iter()
            .map(|view| crate::admin::FeedFigures {
                zone: view.zone,
                csn: view.csn,
                entries: view.entries as u64,
                pulls: view.pulls,
                prefetched: view.prefetched,
                prefetch_bytes: view.prefetch_bytes,
            })
            .collect()
    }

    /// The zone that serves a pull of `origin` under `prefix`: one of
    /// ours with that origin whose prefix holds it.
    fn serving(&self, origin: &str, prefix: &str) -> Option<&Arc<Zone>> {
        self.zones
            .iter()
            .find(|zone| zone.origin == origin && prefix.starts_with(&zone.prefix))
    }
}

/// How one round ended.
enum Round {
    /// Caught up (or stopped where it could not go on).
    Done,
    /// The upstream could not be asked.
    Failed(String),
}

impl ClientProxy {
    /// Replicates `zone` for ever: a round, then the interval or a push,
    /// whichever comes first. `current` gives the proxy to work with (the
    /// one a reload made, from the next round on); the loop ends when it
    /// gives none.
    pub async fn replicate(zone: Arc<Zone>, current: impl Fn() -> Option<Arc<ClientProxy>>) {
        loop {
            let Some(proxy) = current() else {
                return;
            };
            match proxy.replicate_once(&zone).await {
                Round::Done => {}
                Round::Failed(error) => {
                    zone.counters.pull_failures.fetch_add(1, Ordering::Relaxed);
                    tracing::info!(zone = %zone.subscription.zone, %error, "change feed: cannot pull; trying again after the interval");
                }
            }
            drop(proxy);
            tokio::select! {
                () = tokio::time::sleep(zone.subscription.interval) => {}
                () = zone.wake.notified() => {}
            }
        }
    }

    /// One pull, and the prefetches it calls for.
    async fn replicate_once(self: &Arc<Self>, zone: &Arc<Zone>) -> Round {
        let answer = match self.pull(zone).await {
            Ok(answer) => answer,
            Err(error) => return Round::Failed(error),
        };
        zone.counters.pulls.fetch_add(1, Ordering::Relaxed);
        let changed = answer.reset || !answer.updates.is_empty() || {
            let log = zone.log.lock().unwrap_or_else(PoisonError::into_inner);
            log.csn() != answer.csn
        };
        if answer.reset {
            // A replica's first answer lists the zone: not a reset of
            // anything it held.
            let first = zone
                .log
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .incarnation()
                .is_empty();
            if !first {
                zone.counters.resets.fetch_add(1, Ordering::Relaxed);
            }
            tracing::info!(zone = %zone.subscription.zone, incarnation = %answer.incarnation, csn = answer.csn, listed = answer.updates.len(), "change feed: reset");
            zone.log
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .restart(&answer.incarnation, answer.csn);
        }
        let mut caught_up = answer.csn;
        for update in answer.updates {
            zone.counters.updates.fetch_add(1, Ordering::Relaxed);
            if let Err(error) = self.prefetch(zone, &update).await {
                tracing::info!(zone = %zone.subscription.zone, path = %update.path, %error, "change feed: prefetch failed; the next round starts here");
                caught_up = update.csn - 1;
                break;
            }
            let (path, csn) = (update.path.clone(), update.csn);
            let applied = zone
                .log
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .apply(update);
            if applied {
                self.replicas.subscribers.push(&zone.origin, &path, csn);
            }
        }
        if changed {
            {
                let mut log = zone.log.lock().unwrap_or_else(PoisonError::into_inner);
                log.caught_up(caught_up);
                // Bounded as the primary's is: by age, and by count.
                log.expire(super::unix_now(), &Retention::default());
            }
            let zone = zone.clone();
            let _ = tokio::task::spawn_blocking(move || zone.save()).await;
        }
        Round::Done
    }

    /// Asks the zone's upstream for the updates after what the log holds.
    async fn pull(&self, zone: &Zone) -> Result<Answer, String> {
        let pull = {
            let log = zone.log.lock().unwrap_or_else(PoisonError::into_inner);
            Pull {
                since: log.csn(),
                incarnation: Some(log.incarnation().to_owned()).filter(|i| !i.is_empty()),
                prefix: zone.prefix.clone(),
                notify: self.config.queue.node.map(|_| zone.token.clone()),
            }
        };
        let url = format!("{}{FEED_PATH}?{}", zone.origin, pull.to_query());
        let mut request = Request::get(url.as_str())
            .body(())
            .map_err(|e| format!("{url}: {e}"))?;
        if let Some(node) = self.config.queue.node {
            request.headers_mut().insert(
                X_NODE.clone(),
                HeaderValue::from_str(&node.to_string()).expect("an address is a valid header"),
            );
        }
        let target = self.routes.target(&request).map_err(|e| e.to_string())?;
        let (parts, ()) = request.into_parts();
        let outbound = self.outbound(&parts, parts.headers.clone(), &target, empty());
        let response = self
            .send(outbound, &target)
            .await
            .map_err(|e| e.to_string())?;
        if response.status() != StatusCode::OK {
            return Err(format!("the upstream answered {}", response.status()));
        }
        let body = Limited::new(response.into_body(), MAX_ANSWER_BYTES)
            .collect()
            .await
            .map_err(|e| format!("the answer: {e}"))?
            .to_bytes();
        serde_json::from_slice(&body).map_err(|e| format!("the answer is not a feed's: {e}"))
    }

    /// Makes the cache hold `update`'s body, unless it does or (by the
    /// zone's rule) need not. `Err` when the upstream could not give it.
    async fn prefetch(self: &Arc<Self>, zone: &Zone, update: &Update) -> Result<(), String> {
        let url = format!("{}{}", zone.origin, update.path);
        let key = CacheKey::parse(&url).map_err(|e| format!("{url}: {e}"))?;
        let held = {
            let mut held = self.store.variants(&key);
            held.extend(self.store.lookup(&key));
            held
        };
        if held
            .iter()
            .any(|entry| entry.body_blake3.to_hex().as_str() == update.digest)
        {
            zone.counters.held_already.fetch_add(1, Ordering::Relaxed);
            return Ok(());
        }
        if held.is_empty() && zone.subscription.prefetch == Prefetch::Held {
            zone.counters.not_held.fetch_add(1, Ordering::Relaxed);
            return Ok(());
        }
        let held_before: Vec<String> = held
            .iter()
            .map(|entry| entry.body_blake3.to_hex().to_string())
            .collect();
        // Users first: none of their fetches waits behind ours.
        while !self.in_flight.is_empty() {
            tokio::time::sleep(USERS_FIRST_POLL).await;
        }
        let leader = match self.in_flight.join(key.digest()) {
            Role::Leader(leader) => leader,
            Role::Follower(follower) => {
                // A user fetches it right now: what that stores is checked.
                follower.wait().await;
                return self.check_stored(zone, update, &key, &held_before);
            }
        };
        let request = Request::get(url.as_str())
            .header(header::HOST, key_authority(&url))
            .body(())
            .map_err(|e| format!("{url}: {e}"))?;
        let target = self.routes.target(&request).map_err(|e| e.to_string())?;
        let (parts, ()) = request.into_parts();
        let before = self.link_bytes();
        let started = tokio::time::Instant::now();
        let response = self
            .clone()
            .fetch(parts, target, key.clone(), None, Some(leader))
            .await;
        let status = response.status();
        let complete = drain(response).await;
        // The body's end is not its commit: a large one is stored after its
        // reader (here, us) had the last byte, and its fetch holds the
        // coalescing slot until then. Only a stored body may be told to
        // the proxies behind us.
        if let Role::Follower(follower) = self.in_flight.join(key.digest()) {
            follower.wait().await;
        }
        let took = self.link_bytes().saturating_sub(before);
        if status.is_server_error() || !complete {
            return Err(format!(
                "upstream answered {status}{}",
                if complete { "" } else { ", cut" }
            ));
        }
        zone.counters.prefetched.fetch_add(1, Ordering::Relaxed);
        zone.counters
            .prefetch_bytes
            .fetch_add(took, Ordering::Relaxed);
        tracing::info!(
            url,
            status = status.as_u16(),
            link_bytes = took,
            csn = update.csn,
            "change feed: prefetched"
        );
        if zone.subscription.rate > 0 {
            let due = Duration::from_secs_f64(took as f64 / zone.subscription.rate as f64);
            tokio::time::sleep_until(started + due).await;
        }
        self.check_stored(zone, update, &key, &held_before)
    }

    /// After a prefetch: `Err` when the cache still holds only what it held
    /// before (`held_before`'s digests), which means the upstream still
    /// serves the old body (a replica that has not stored the new one yet),
    /// so the update is tried again next round rather than passed on; at
    /// most [`MAX_STALE_TRIES`] times, since a body that may not be stored
    /// (an origin that says `no-store` now) would look the same. Another
    /// body than the update's is fine: the path changed again since, and
    /// its next update says so.
    fn check_stored(
        &self,
        zone: &Zone,
        update: &Update,
        key: &CacheKey,
        held_before: &[String],
    ) -> Result<(), String> {
        let mut held: Vec<String> = self
            .store
            .variants(key)
            .iter()
            .chain(self.store.lookup(key).iter())
            .map(|entry| entry.body_blake3.to_hex().to_string())
            .collect();
        held.dedup();
        let stale = !held.is_empty()
            && !held.contains(&update.digest)
            && held.iter().all(|digest| held_before.contains(digest));
        let mut tries = zone
            .stale_tries
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if !stale {
            tries.remove(&update.csn);
            return Ok(());
        }
        let count = tries.entry(update.csn).or_default();
        *count += 1;
        if *count >= MAX_STALE_TRIES {
            tries.remove(&update.csn);
            tracing::warn!(zone = %zone.subscription.zone, path = %update.path, "change feed: the upstream still serves the body held before; passed on all the same");
            return Ok(());
        }
        Err("the upstream still serves the body held before".into())
    }

    /// A submission on the admin listener (absolute URLs, one per line):
    /// passed up, as a POST of the paths to each origin's feed, to the
    /// primary (ars-s). The status and the answers, as one JSON list.
    pub(crate) async fn submit_upstream(&self, text: &str) -> (StatusCode, String) {
        let mut by_origin: Vec<(String, Vec<String>)> = Vec::new();
        for line in text.lines().map(str::trim).filter(|line| !line.is_empty()) {
            let Some((origin, path)) = line
                .parse::<Uri>()
                .ok()
                .filter(|uri| uri.scheme_str() == Some("http"))
                .and_then(|uri| {
                    let authority = uri.authority()?.as_str().to_owned();
                    let path = uri.path_and_query()?.as_str().to_owned();
                    Some((format!("http://{authority}"), path))
                })
            else {
                return (
                    StatusCode::BAD_REQUEST,
                    format!(
                        "\"{}: not an absolute http:// URL\"\n",
                        line.escape_default()
                    ),
                );
            };
            match by_origin.iter_mut().find(|(o, _)| *o == origin) {
                Some((_, paths)) => paths.push(path),
                None => by_origin.push((origin, vec![path])),
            }
        }
        let mut results: Vec<serde_json::Value> = Vec::new();
        for (origin, paths) in by_origin {
            match self.post_submission(&origin, &paths).await {
                Ok(answers) => results.extend(answers),
                Err(detail) => results.extend(paths.iter().map(|path| {
                    serde_json::json!({
                        "path": format!("{origin}{path}"),
                        "result": "failed",
                        "detail": detail,
                    })
                })),
            }
        }
        (
            StatusCode::OK,
            serde_json::to_string(&results).unwrap_or_default() + "\n",
        )
    }

    /// POSTs `paths` to `origin`'s feed, upstream: the answers.
    async fn post_submission(
        &self,
        origin: &str,
        paths: &[String],
    ) -> Result<Vec<serde_json::Value>, String> {
        let url = format!("{origin}{FEED_PATH}");
        let request = Request::post(url.as_str())
            .body(())
            .map_err(|e| format!("{url}: {e}"))?;
        let target = self.routes.target(&request).map_err(|e| e.to_string())?;
        let (parts, ()) = request.into_parts();
        let outbound = self.outbound(
            &parts,
            parts.headers.clone(),
            &target,
            full(paths.join("\n")),
        );
        let response = self
            .send(outbound, &target)
            .await
            .map_err(|e| e.to_string())?;
        let status = response.status();
        let body = Limited::new(response.into_body(), MAX_ANSWER_BYTES)
            .collect()
            .await
            .map_err(|e| format!("the answer: {e}"))?
            .to_bytes();
        if status != StatusCode::OK {
            return Err(format!(
                "the upstream answered {status}: {}",
                String::from_utf8_lossy(&body).trim()
            ));
        }
        serde_json::from_slice(&body).map_err(|e| format!("the answer is not a feed's: {e}"))
    }

    /// What crossed the link so far (answers and basis signatures sent).
    fn link_bytes(&self) -> u64 {
        self.stats.upstream_bytes.load(Ordering::Relaxed)
            + self.stats.signature_bytes.load(Ordering::Relaxed)
    }

    /// A pull from a proxy behind us for a zone we replicate, answered
    /// from our log; `None` when it is not for one of our zones (it goes
    /// upstream as any request).
    pub(super) fn answer_feed_pull(
        &self,
        method: &Method,
        url: &Uri,
        headers: &HeaderMap,
        peer: Option<SocketAddr>,
    ) -> Option<Response<ProxyBody>> {
        if *method != Method::GET || url.path() != FEED_PATH {
            return None;
        }
        let pull = Pull::parse(url.query()).ok()?;
        let origin = format!(
            "{}://{}",
            url.scheme_str().unwrap_or("http"),
            url.authority().map_or("", |a| a.as_str())
        )
        .to_ascii_lowercase();
        let zone = self.replicas.serving(&origin, &pull.prefix)?;
        if let (Some(node), Some(token)) = (callback_node(headers, peer), &pull.notify) {
            self.replicas
                .subscribers
                .subscribe(node, token, &zone.origin, &pull.prefix);
        }
        let log = zone.log.lock().unwrap_or_else(PoisonError::into_inner);
        if log.incarnation().is_empty() {
            let mut response = text_response(
                StatusCode::SERVICE_UNAVAILABLE,
                "this proxy has not replicated the zone from its upstream yet".into(),
            );
            response.headers_mut().insert(
                header::RETRY_AFTER,
                HeaderValue::from(zone.subscription.interval.as_secs().max(1)),
            );
            return Some(response);
        }
        let answer = log.answer(pull.since, pull.incarnation.as_deref(), &pull.prefix);
        drop(log);
        Some(json_response(
            StatusCode::OK,
            serde_json::to_vec(&answer).unwrap_or_default(),
        ))
    }
}

/// Reads a response's body to its end, keeping nothing: true when it
/// ended cleanly (which is what stores it).
async fn drain(response: Response<ProxyBody>) -> bool {
    let mut body = response.into_body();
    while let Some(frame) = body.frame().await {
        if frame.is_err() {
            return false;
        }
    }
    true
}

fn key_authority(url: &str) -> HeaderValue {
    url.parse::<Uri>()
        .ok()
        .and_then(|uri| uri.authority().map(|a| a.as_str().to_owned()))
        .and_then(|authority| HeaderValue::from_str(&authority).ok())
        .unwrap_or_else(|| HeaderValue::from_static(""))
}
