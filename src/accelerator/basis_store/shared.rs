//! The basis store shared by many accelerators, on Redis: where a site
//! outgrows one accelerator and several run behind a load balancer, a
//! client's next request may reach another one than the last, which then
//! finds the body the first one served here.
//!
//! Bodies go in with `SET rproxy:basis:<hex blake3>` once coded (sent by a
//! task of their own: a request never waits for it), and come out with
//! `GET` within a short timeout. Redis bounds its own memory: run it with
//! `maxmemory` and `maxmemory-policy allkeys-lru`, and it evicts the least
//! recently used bodies as ours would. Redis slow, down or unreachable is
//! never an error to the user: the lookup counts as a miss and the body is
//! coded against the client's signature (rsync), as without a store; after
//! a failure Redis is left alone for a second, so that while it is down
//! requests do not each wait for the timeout. Failures are counted and
//! logged at most every ten seconds.
//!
//! Reads and writes use two connections ([`ConnectionManager`]s, which
//! reconnect by themselves): a large `SET` on the one connection every
//! lookup shares would hold the lookups behind it past their timeout.
//!
//! Main type: [`Shared`].

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use tokio::sync::Semaphore;

/// Prefix of the keys.
const KEY_PREFIX: &str = "rproxy:basis:";

/// How long Redis is left alone after a failure.
const PAUSE_AFTER_FAILURE: Duration = Duration::from_secs(1);

/// Failures are logged at most this often.
const WARN_EVERY: Duration = Duration::from_secs(10);

/// Time a `SET` has (large bodies take a while; no request waits for it).
const WRITE_TIMEOUT: Duration = Duration::from_secs(5);

/// Bodies being sent to Redis at once hold at most this many times the
/// largest body; past it a body is not shared.
const SENDING_BODIES: u64 = 4;

/// Where the shared store lives and what it takes.
#[derive(Clone, PartialEq, Eq)]
pub struct SharedTier {
    /// `redis://[user:password@]host[:port][/db]`.
    pub url: String,
    /// Time a lookup has before the body is coded without it.
    pub timeout: Duration,
    /// Largest body sent there (bytes).
    pub max_body: u64,
}

impl SharedTier {
    /// The URL without its password, for the log.
    pub fn redacted_url(&self) -> String {
        match self.url.split_once("://") {
            Some((scheme, rest)) => match rest.rsplit_once('@') {
                Some((_, host)) => format!("{scheme}://…@{host}"),
                None => self.url.clone(),
            },
            None => self.url.clone(),
        }
    }
}

impl std::fmt::Debug for SharedTier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedTier")
            .field("url", &self.redacted_url())
            .field("timeout", &self.timeout)
            .field("max_body", &self.max_body)
            .finish()
    }
}

/// Bodies in Redis by blake3.
pub(super) struct Shared {
    client: redis::Client,
    tier: SharedTier,
    reads: OnceLock<Option<ConnectionManager>>,
    writes: OnceLock<Option<ConnectionManager>>,
    /// Bytes of bodies being sent.
    sending: Arc<Semaphore>,
    /// Until when lookups skip Redis, after a failure.
    paused_until: Mutex<Option<Instant>>,
    last_warned: Mutex<Option<Instant>>,
    failures: AtomicU64,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("tier", &self.tier)
            .finish_non_exhaustive()
    }
}

/// The shared store did not answer a lookup: the body is coded without it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the shared basis store did not answer")]
pub struct Unavailable;

/// Why the shared store cannot be used.
#[derive(Debug, thiserror::Error)]
#[error("basis-redis: {0}")]
pub struct SharedError(#[from] redis::RedisError);

impl Shared {
    /// The store `tier` names; connects on first use, so that an
    /// accelerator starts while Redis is down.
    ///
    /// # Errors
    /// The URL cannot be used.
    pub(super) fn new(tier: &SharedTier) -> Result<Shared, SharedError> {
        let client = redis::Client::open(tier.url.as_str())?;
        Ok(Shared {
            client,
            sending: Arc::new(Semaphore::new(
                usize::try_from(tier.max_body.saturating_mul(SENDING_BODIES))
                    .unwrap_or(usize::MAX)
                    .min(Semaphore::MAX_PERMITS),
            )),
            tier: tier.clone(),
            reads: OnceLock::new(),
            writes: OnceLock::new(),
            paused_until: Mutex::new(None),
            last_warned: Mutex::new(None),
            failures: AtomicU64::new(0),
        })
    }

    /// Largest body sent there (bytes).
    pub(super) fn max_body(&self) -> u64 {
        self.tier.max_body
    }

    /// Lookups and sends that failed or were skipped while Redis was
    /// failing.
    pub(super) fn failures(&self) -> u64 {
        self.failures.load(Ordering::Relaxed)
    }

    /// A connection of `cell`'s, made on first use (inside the runtime,
    /// which the manager's reconnecting task needs).
    fn connection(
        &self,
        cell: &OnceLock<Option<ConnectionManager>>,
        response_timeout: Duration,
    ) -> Option<ConnectionManager> {
        cell.get_or_init(|| {
            let config = ConnectionManagerConfig::new()
                .set_connection_timeout(Some(self.tier.timeout.max(Duration::from_millis(100))))
                .set_response_timeout(Some(response_timeout))
                .set_number_of_retries(1)
                .set_max_delay(Duration::from_secs(1));
            ConnectionManager::new_lazy_with_config(self.client.clone(), config)
                .inspect_err(|error| tracing::warn!(%error, "basis-redis: no connection"))
                .ok()
        })
        .clone()
    }

    fn is_paused(&self) -> bool {
        let paused = self
            .paused_until
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        paused.is_some_and(|until| Instant::now() < until)
    }

    /// Counts a failure, pauses lookups and logs, at most every
    /// [`WARN_EVERY`].
    fn failed(&self, what: &str, error: &dyn std::fmt::Display) {
        self.failures.fetch_add(1, Ordering::Relaxed);
        let now = Instant::now();
        *self
            .paused_until
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(now + PAUSE_AFTER_FAILURE);
        let mut last = self
            .last_warned
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if last.is_none_or(|at| now.duration_since(at) >= WARN_EVERY) {
            *last = Some(now);
            tracing::warn!(
                redis = %self.tier.redacted_url(), %error, failures = self.failures(),
                "basis-redis {what} failed: coding without the shared store"
            );
        } else {
            tracing::debug!(%error, "basis-redis {what} failed");
        }
    }

    /// The body whose blake3 is `digest`, if Redis holds it.
    ///
    /// # Errors
    /// Redis failed, did not answer in time, or is left alone after a
    /// recent failure.
    pub(super) async fn get(&self, digest: &[u8; 32]) -> Result<Option<Vec<u8>>, Unavailable> {
        if self.is_paused() {
            self.failures.fetch_add(1, Ordering::Relaxed);
            return Err(Unavailable);
        }
        let Some(mut connection) = self.connection(&self.reads, self.tier.timeout) else {
            self.failures.fetch_add(1, Ordering::Relaxed);
            return Err(Unavailable);
        };
        let get = redis::cmd("GET").arg(key(digest)).clone();
        let answer = tokio::time::timeout(
            self.tier.timeout,
            get.query_async::<Option<Vec<u8>>>(&mut connection),
        )
        .await;
        match answer {
            // Not hashed again, as a body on disk is not: a wrong one
            // (anyone who may write to Redis could put one) costs bytes,
            // never a wrong byte, since the client checks what it rebuilds.
            Ok(Ok(Some(body))) if body.len() as u64 <= self.tier.max_body => Ok(Some(body)),
            Ok(Ok(_)) => Ok(None),
            Ok(Err(error)) => {
                self.failed("lookup", &error);
                Err(Unavailable)
            }
            Err(_) => {
                self.failed(
                    "lookup",
                    &format!("no answer within {:?}", self.tier.timeout),
                );
                Err(Unavailable)
            }
        }
    }

    /// Sends `body` under `digest` from a task of its own, if it is within
    /// the limit, the sending budget has room and a runtime is at hand.
    pub(super) fn put(self: &Arc<Self>, digest: [u8; 32], body: Arc<[u8]>) {
        let len = body.len() as u64;
        if len > self.tier.max_body || self.is_paused() {
            return;
        }
        let Some(room) = u32::try_from(len)
            .ok()
            .and_then(|len| self.sending.clone().try_acquire_many_owned(len).ok())
        else {
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let shared = self.clone();
        runtime.spawn(async move {
            let _room = room;
            let Some(mut connection) = shared.connection(&shared.writes, WRITE_TIMEOUT) else {
                return;
            };
            let set = redis::cmd("SET").arg(key(&digest)).arg(&body[..]).clone();
            match tokio::time::timeout(WRITE_TIMEOUT, set.query_async::<()>(&mut connection)).await
            {
                Ok(Ok(())) => {}
                Ok(Err(error)) => shared.failed("store", &error),
                Err(_) => shared.failed("store", &format!("no answer within {WRITE_TIMEOUT:?}")),
            }
        });
    }
}

/// The key of the body whose blake3 is `digest`.
fn key(digest: &[u8; 32]) -> String {
    format!("{KEY_PREFIX}{}", blake3::Hash::from_bytes(*digest).to_hex())
}
