//! The accelerator's side of the feed: one [`FeedLog`] per site (by the
//! host its origin is sent), kept in `--feed-state`, answered to pulls,
//! and pushed to subscribers that gave a callback address.
//!
//! Writing: a commit marks its log dirty, and a task writes dirty logs at
//! most every [`WRITE_EVERY`], on a blocking thread, marked unclean; the
//! way out writes them clean. A log read back unclean skips
//! [`CRASH_GAP`] CSNs, so none that may have reached a peer is ever given
//! to another path.
//!
//! Submissions (each a list of paths the accelerator fetches from the
//! origin) take turns: [`MAX_SUBMISSIONS`] at once, whoever sends them.
//!
//! Pushing: a pull with `X-Node` (the peer's own address only: never a
//! third party's) and a `notify` token subscribes that address to the
//! zone for [`SUBSCRIPTION_TTL`] (an expiring table, seed 003); each
//! commit under the zone connects there and sends one `FEED` line, at most
//! [`MAX_PUSHES`] at once (a push that finds no room is dropped: the
//! subscriber pulls every interval anyway).
//!
//! Main types: [`Feeds`], [`FeedCommit`].

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::num::NonZeroUsize;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::io::AsyncWriteExt;
use tokio::sync::{Notify, Semaphore};

use super::log::{Answer, FeedLog, Retention};
use super::state;
use super::wire::{Pull, feed_line};
use crate::expiring::ExpiringMap;

/// How often dirty logs are written, at most.
pub const WRITE_EVERY: Duration = Duration::from_millis(50);
/// CSNs skipped after a crash: more than could be committed between two
/// writes.
pub const CRASH_GAP: u64 = 1_000_000;
/// How long a pull's callback address stays subscribed.
pub const SUBSCRIPTION_TTL: Duration = Duration::from_secs(600);
/// Subscriptions held at most (a backstop: age is the rule).
const MAX_SUBSCRIPTIONS: usize = 4096;
/// Pushes under way at once.
pub const MAX_PUSHES: usize = 16;
/// Submissions fetched at once; another waits up to
/// [`SUBMISSION_WAIT`] for its turn, then gets a 503.
pub const MAX_SUBMISSIONS: usize = 2;
/// How long a submission waits for its turn.
pub const SUBMISSION_WAIT: Duration = Duration::from_secs(10);
/// Time a push has to connect and send its line.
const PUSH_TIMEOUT: Duration = Duration::from_secs(2);
/// Sites (hosts) with a log, at most: a parent-mode site never commits,
/// so this bounds only a configuration with very many sites.
const MAX_LOGS: usize = 4096;

/// Where to push, for which zone.
#[derive(Debug, Clone)]
struct Subscription {
    host: String,
    prefix: String,
}

/// The feeds of an accelerator's sites.
pub struct Feeds {
    dir: PathBuf,
    retention: Retention,
    logs: Mutex<HashMap<String, FeedLog>>,
    dirty: Mutex<HashSet<String>>,
    /// Wakes the writer task, which the first change starts.
    wake_writer: Arc<Notify>,
    writer_started: AtomicBool,
    /// Ourselves, for the writer task (which ends with us).
    me: Weak<Feeds>,
    subscribers: Subscribers,
    /// Pulls answered, by site.
    pulls: Mutex<HashMap<String, u64>>,
    /// Submissions under way (each fetches from the origin).
    submissions: Arc<Semaphore>,
}

impl std::fmt::Debug for Feeds {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Feeds")
            .field("dir", &self.dir)
            .finish_non_exhaustive()
    }
}

impl Feeds {
    /// The feeds kept in `dir` (made if missing).
    ///
    /// # Errors
    /// The directory cannot be made.
    pub fn open(dir: &Path, retention: Retention) -> std::io::Result<Arc<Feeds>> {
        std::fs::create_dir_all(dir)?;
        Ok(Arc::new_cyclic(|me| Feeds {
            dir: dir.to_owned(),
            retention,
            logs: Mutex::new(HashMap::new()),
            dirty: Mutex::new(HashSet::new()),
            wake_writer: Arc::new(Notify::new()),
            writer_started: AtomicBool::new(false),
            me: me.clone(),
            subscribers: Subscribers::default(),
            pulls: Mutex::new(HashMap::new()),
            submissions: Arc::new(Semaphore::new(MAX_SUBMISSIONS)),
        }))
    }

    /// `host` served `path` with a body of `digest`: committed under the
    /// next CSN unless it is the body last seen there; subscribers of its
    /// zone are told.
    pub fn commit(&self, host: &str, path: &str, digest: &[u8; 32], length: u64) -> Option<u64> {
        let hex = blake3::Hash::from(*digest).to_hex();
        let csn = self.with_log(host, |log| {
            let csn = log.commit(path, hex.as_str(), length, unix_now())?;
            log.expire(unix_now(), &self.retention);
            Some(csn)
        })??;
        tracing::info!(host, path, csn, length, "change feed: committed");
        self.mark_dirty(host);
        self.subscribers.push(host, path, csn);
        Some(csn)
    }

    /// What a pull of `host`'s feed gets; `node` (with the pull's token)
    /// is subscribed to pushes.
    pub fn answer(&self, host: &str, pull: &Pull, node: Option<SocketAddr>) -> Answer {
        if let (Some(node), Some(token)) = (node, &pull.notify) {
            self.subscribers.subscribe(node, token, host, &pull.prefix);
        }
        match self.with_log(host, |log| {
            log.answer(pull.since, pull.incarnation.as_deref(), &pull.prefix)
        }) {
            Some(answer) => {
                *self
                    .pulls
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .entry(host.to_owned())
                    .or_default() += 1;
                answer
            }
            None => FeedLog::new(String::new()).answer(0, None, "/"),
        }
    }

    /// A turn to fetch a submission's paths from the origin: at most
    /// [`MAX_SUBMISSIONS`] at once, whoever sends them; `None` when none
    /// came within [`SUBMISSION_WAIT`].
    pub async fn submission_turn(&self) -> Option<tokio::sync::OwnedSemaphorePermit> {
        tokio::time::timeout(SUBMISSION_WAIT, self.submissions.clone().acquire_owned())
            .await
            .ok()?
            .ok()
    }

    /// Each site's log, for the metrics: (host, CSN, entries, pulls).
    pub fn figures(&self) -> Vec<(String, u64, u64, u64)> {
        let pulls = self.pulls.lock().unwrap_or_else(PoisonError::into_inner);
        let mut figures: Vec<_> = self
            .logs
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .map(|(host, log)| {
                let pulled = pulls.get(host).copied().unwrap_or(0);
                (host.clone(), log.csn(), log.len() as u64, pulled)
            })
            .collect();
        figures.sort();
        figures
    }

    /// Writes dirty logs as they come, on a task the first change starts
    /// (on the runtime it is made on), until the feeds are dropped.
    fn start_writer(&self) {
        if self.writer_started.swap(true, Ordering::AcqRel) {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            // No runtime (a test): written on the way out only.
            self.writer_started.store(false, Ordering::Release);
            return;
        };
        let (me, wake) = (self.me.clone(), self.wake_writer.clone());
        runtime.spawn(async move {
            loop {
                wake.notified().await;
                tokio::time::sleep(WRITE_EVERY).await;
                let Some(feeds) = me.upgrade() else {
                    return;
                };
                let _ = tokio::task::spawn_blocking(move || feeds.write(false)).await;
            }
        });
    }

    /// Writes every log, clean: the way out.
    pub fn write_clean(&self) {
        let hosts: Vec<String> = self
            .logs
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .keys()
            .cloned()
            .collect();
        self.dirty
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .extend(hosts);
        self.write(true);
    }

    fn write(&self, clean: bool) {
        let dirty: Vec<String> = self
            .dirty
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .drain()
            .collect();
        for host in dirty {
            let Some(log) = self
                .logs
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .get(&host)
                .cloned()
            else {
                continue;
            };
            if let Err(error) = state::save(&self.path_of(&host), &log, clean) {
                tracing::warn!(host, %error, "cannot write the change feed's log; tried again at the next change");
                self.mark_dirty(&host);
            }
        }
    }

    fn mark_dirty(&self, host: &str) {
        self.dirty
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(host.to_owned());
        self.start_writer();
        self.wake_writer.notify_one();
    }

    /// Runs `f` on `host`'s log, read from disk the first time (a log read
    /// back unclean skips ahead, and is written at once as such); `None`
    /// past [`MAX_LOGS`].
    fn with_log<T>(&self, host: &str, f: impl FnOnce(&mut FeedLog) -> T) -> Option<T> {
        let mut logs = self.logs.lock().unwrap_or_else(PoisonError::into_inner);
        if !logs.contains_key(host) {
            if logs.len() >= MAX_LOGS {
                return None;
            }
            let log = match state::load(&self.path_of(host)) {
                Some(loaded) if loaded.clean => loaded.log,
                Some(mut loaded) => {
                    loaded.log.skip_after_crash(CRASH_GAP);
                    tracing::warn!(
                        host,
                        csn = loaded.log.csn(),
                        "the change feed's log was not closed cleanly: CSNs go on from here and every peer resets"
                    );
                    loaded.log
                }
                None => FeedLog::new(new_incarnation(host)),
            };
            logs.insert(host.to_owned(), log);
            // Marked unclean on disk before anything is given out.
            drop(logs);
            self.mark_dirty(host);
            logs = self.logs.lock().unwrap_or_else(PoisonError::into_inner);
        }
        logs.get_mut(host).map(f)
    }

    fn path_of(&self, host: &str) -> PathBuf {
        let name: String = host
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '.' || c == '-' {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        self.dir.join(format!("{name}.json"))
    }
}

/// Who asked to be pushed, and the pushes under way: the peers that
/// pulled with a callback address, for [`SUBSCRIPTION_TTL`] after their
/// last pull (an expiring table, seed 003).
pub struct Subscribers {
    table: Mutex<ExpiringMap<(SocketAddr, String), Subscription>>,
    pushes: Arc<Semaphore>,
}

impl Default for Subscribers {
    fn default() -> Self {
        Subscribers {
            table: Mutex::new(ExpiringMap::with_max_entries(
                SUBSCRIPTION_TTL,
                NonZeroUsize::new(MAX_SUBSCRIPTIONS).expect("not zero"),
            )),
            pushes: Arc::new(Semaphore::new(MAX_PUSHES)),
        }
    }
}

impl Subscribers {
    /// `node` wants a `FEED token` line for each update of `site` under
    /// `prefix`.
    pub fn subscribe(&self, node: SocketAddr, token: &str, site: &str, prefix: &str) {
        self.table
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(
                (node, token.to_owned()),
                Subscription {
                    host: site.to_owned(),
                    prefix: prefix.to_owned(),
                },
                tokio::time::Instant::now(),
            );
    }

    /// Tells the subscribers of `host`'s zones that hold `path`.
    pub fn push(&self, host: &str, path: &str, csn: u64) {
        let now = tokio::time::Instant::now();
        let targets: Vec<(SocketAddr, String)> = {
            let mut subscriptions = self.table.lock().unwrap_or_else(PoisonError::into_inner);
            subscriptions.sweep(now);
            subscriptions
                .iter(now)
                .filter(|(_, sub)| sub.host == host && path.starts_with(&sub.prefix))
                .map(|(key, _)| key.clone())
                .collect()
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        for (node, token) in targets {
            let Ok(permit) = self.pushes.clone().try_acquire_owned() else {
                tracing::debug!(%node, "change feed: push dropped, too many under way");
                continue;
            };
            runtime.spawn(async move {
                let sent = tokio::time::timeout(PUSH_TIMEOUT, async {
                    let mut stream = tokio::net::TcpStream::connect(node).await?;
                    stream.write_all(feed_line(&token, csn).as_bytes()).await?;
                    stream.shutdown().await
                })
                .await;
                match sent {
                    Ok(Ok(())) => tracing::debug!(%node, csn, "change feed: pushed"),
                    Ok(Err(error)) => tracing::debug!(%node, %error, "change feed: push failed"),
                    Err(_) => tracing::debug!(%node, "change feed: push timed out"),
                }
                drop(permit);
            });
        }
    }
}

/// A coded answer's way into its site's feed: committed once the body is
/// whole and its digest known (the coder makes one only for a body a
/// shared cache may store).
#[derive(Debug, Clone)]
pub struct FeedCommit {
    feeds: Arc<Feeds>,
    host: String,
    path: String,
}

impl FeedCommit {
    /// `host`'s `path`, to be committed to `feeds`.
    pub fn new(feeds: Arc<Feeds>, host: String, path: String) -> FeedCommit {
        FeedCommit { feeds, host, path }
    }

    /// The body was served whole: committed if it changed.
    pub fn commit(&self, digest: &[u8; 32], length: u64) {
        self.feeds.commit(&self.host, &self.path, digest, length);
    }
}

/// A new incarnation's name: unique enough that two logs never share one.
pub fn new_incarnation(salt: &str) -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let mut hasher = blake3::Hasher::new();
    hasher.update(&nanos.to_le_bytes());
    hasher.update(&std::process::id().to_le_bytes());
    hasher.update(salt.as_bytes());
    hasher.finalize().to_hex()[..16].to_owned()
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("rproxy-feeds-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    fn pull(since: u64, incarnation: Option<String>) -> Pull {
        Pull {
            since,
            incarnation,
            prefix: "/".into(),
            notify: None,
        }
    }

    #[tokio::test]
    async fn csns_survive_a_clean_restart_and_skip_after_a_crash() {
        let dir = dir("restart");
        let feeds = Feeds::open(&dir, Retention::default()).unwrap();
        assert_eq!(feeds.commit("h", "/a", &[1; 32], 1), Some(1));
        assert_eq!(feeds.commit("h", "/a", &[1; 32], 1), None);
        assert_eq!(feeds.commit("h", "/a", &[2; 32], 1), Some(2));
        let incarnation = feeds.answer("h", &pull(0, None), None).incarnation;
        feeds.write_clean();
        drop(feeds);

        let feeds = Feeds::open(&dir, Retention::default()).unwrap();
        let answer = feeds.answer("h", &pull(1, Some(incarnation.clone())), None);
        assert!(!answer.reset);
        assert_eq!(answer.csn, 2);
        assert_eq!(feeds.commit("h", "/b", &[3; 32], 1), Some(3));
        // Written unclean (as the writer task does), then a crash.
        feeds.write(false);
        drop(feeds);

        let feeds = Feeds::open(&dir, Retention::default()).unwrap();
        let answer = feeds.answer("h", &pull(3, Some(incarnation)), None);
        assert!(answer.reset, "a peer may hold CSNs the crash lost");
        assert_eq!(
            feeds.commit("h", "/c", &[4; 32], 1),
            Some(3 + CRASH_GAP + 1)
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test(start_paused = true)]
    async fn submissions_take_turns_whoever_sends_them() {
        let dir = dir("turns");
        let feeds = Feeds::open(&dir, Retention::default()).unwrap();
        let first = feeds.submission_turn().await.unwrap();
        let _second = feeds.submission_turn().await.unwrap();
        let started = tokio::time::Instant::now();
        assert!(
            feeds.submission_turn().await.is_none(),
            "a third waits, then gives up"
        );
        assert_eq!(started.elapsed(), SUBMISSION_WAIT);
        drop(first);
        assert!(feeds.submission_turn().await.is_some());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test]
    async fn a_subscriber_of_the_zone_is_pushed_the_csn() {
        let dir = dir("push");
        let feeds = Feeds::open(&dir, Retention::default()).unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let node = listener.local_addr().unwrap();
        let subscribe = Pull {
            notify: Some("tok".into()),
            prefix: "/static/".into(),
            ..pull(0, None)
        };
        feeds.answer("h", &subscribe, Some(node));
        feeds.commit("h", "/other", &[1; 32], 1);
        feeds.commit("h", "/static/a.js", &[2; 32], 1);
        let (mut stream, _) = listener.accept().await.unwrap();
        let mut line = String::new();
        tokio::io::AsyncReadExt::read_to_string(&mut stream, &mut line)
            .await
            .unwrap();
        assert_eq!(line, feed_line("tok", 2));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
