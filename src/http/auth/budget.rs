//! What checking passwords may cost (RELIABILITY ): how many
//! argon2id hashes run at once, how many an address may cause per minute,
//! and which credentials need none because they passed recently.
//!
//! A hash holds its memory cost while it runs (19 MiB with the parameters
//! `rproxy passwd` writes) and tens of milliseconds of a core. Left
//! unbounded, a burst of wrong passwords was a burst of allocations: 120 at
//! once took 2.3 GB, which stayed resident. So:
//! - at most [`CheckLimits::max_checks`] hashes run at once, each on one of
//!   `max_checks` threads kept for hashing. A check waits for its turn as
//!   a future (no thread, no hash memory) for up to
//!   [`CheckLimits::check_wait`], then gets 429. Memory for hashes is
//!   therefore at most `max_checks` × the largest memory cost in the users
//!   file, and stays so after the burst. Threads of their own, rather than
//!   tokio's blocking pool, because there turns taken one after another
//!   still landed on ever new threads and the allocator kept their freed
//!   hash memory: 300 guesses, two at a time, left +770 MiB resident (with
//!   own threads but memory allocated per hash, +370 MiB; with the memory
//!   each thread keeps, see the parent module, +47 MiB, connections
//!   included);
//! - a failure is counted *before* the hash: a check reserves one of its
//!   address's [`CheckLimits::max_failures`] per minute up front, and a
//!   password that passes gives it back. Counting afterwards let a whole
//!   burst through, since none of it had failed yet when it was admitted;
//! - a credential that passed is remembered for five minutes, and that
//!   memory is consulted before the failure count, so someone guessing
//!   from an address shared with an honest client (a NAT, a client proxy
//!   in front of its accelerator) cannot lock that client out, and the
//!   honest client pays no hash. The memory holds a keyed blake3 of the
//!   exact header value, keyed at random per process, never the password;
//!   it is an [`ExpiringMap`] with a cap on entries, so it is bounded in
//!   time and in size.
//!
//! Deliberately left out: the users file and the hash itself (the parent
//! module decides what is checked and how), and the clock: every method
//! that needs the time takes `now`.
//!
//! Main types: [`CheckLimits`], [`CheckStats`], and the crate-internal
//! `Budget`.

use std::net::IpAddr;
use std::num::NonZeroUsize;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, mpsc};
use std::time::Duration;

use argon2::password_hash::rand_core::{OsRng, RngCore};
use http::HeaderValue;
use tokio::sync::{Semaphore, oneshot};
use tokio::time::Instant;

use crate::expiring::ExpiringMap;

/// How long a credential that passed is taken without a new hash.
const VERIFIED_FOR: Duration = Duration::from_secs(300);
/// Most credentials remembered at once: a backstop, since only a password
/// that passed adds one (4096 × well under 200 bytes).
const MAX_VERIFIED: NonZeroUsize = NonZeroUsize::new(4096).expect("not zero");
/// The window failures are counted in, per address.
pub(super) const FAILURE_WINDOW: Duration = Duration::from_secs(60);
/// What a check that found no turn is told to wait before it retries.
pub(super) const BUSY_RETRY: Duration = Duration::from_secs(1);

/// The bounds on password checking, shared by both roles' `--auth-file`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CheckLimits {
    /// Hashes computed at once. Each holds the hash's memory cost while it
    /// runs: 19 MiB with `rproxy passwd`'s parameters, so 38 MiB at the
    /// default of 2.
    pub max_checks: NonZeroUsize,
    /// How long a check waits for its turn before the request gets 429
    /// with `Retry-After`. Zero: it gets 429 at once when all turns are
    /// taken.
    pub check_wait: Duration,
    /// Failed (or still running) checks an address may have per minute;
    /// past them it gets 429 without a hash until the minute is over.
    pub max_failures: u32,
}

impl CheckLimits {
    /// The defaults, for the flags and for [`Default`]: two hashes at
    /// once (38 MiB), a two-second wait, ten failures a minute.
    pub const DEFAULT: CheckLimits = CheckLimits {
        max_checks: NonZeroUsize::new(2).expect("not zero"),
        check_wait: Duration::from_secs(2),
        max_failures: 10,
    };
}

impl Default for CheckLimits {
    fn default() -> Self {
        CheckLimits::DEFAULT
    }
}

/// What password checking has cost so far; for tests and stats.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct CheckStats {
    /// Hashes computed (started) since start-up.
    pub hashes: u64,
    /// Hashes running now.
    pub running: usize,
    /// The most hashes that ever ran at once.
    pub peak_running: usize,
    /// Checks refused with 429 because no turn came within the wait.
    pub busy: u64,
    /// Checks refused with 429 because their address had used up its
    /// failures.
    pub throttled: u64,
}

/// Why a check was not run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum NoCheck {
    /// The address has used up its failures for the window.
    Throttled,
    /// No turn came within the wait.
    Busy,
}

#[derive(Debug, Default)]
struct Gauge {
    hashes: AtomicU64,
    running: AtomicUsize,
    peak_running: AtomicUsize,
    busy: AtomicU64,
    throttled: AtomicU64,
}

/// Counts a hash as running for as long as it lives, also when the hash
/// panics.
struct Running<'a>(&'a Gauge);

impl<'a> Running<'a> {
    fn start(gauge: &'a Gauge) -> Running<'a> {
        gauge.hashes.fetch_add(1, Ordering::Relaxed);
        let now = gauge.running.fetch_add(1, Ordering::AcqRel) + 1;
        gauge.peak_running.fetch_max(now, Ordering::AcqRel);
        Running(gauge)
    }
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        self.0.running.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Work for a hashing thread.
type Job = Box<dyn FnOnce() + Send>;

/// Starts `count` threads that run jobs from the returned sender, one at a
/// time each, until the sender is dropped.
fn start_hashers(count: usize) -> std::io::Result<mpsc::Sender<Job>> {
    let (jobs, queue) = mpsc::channel::<Job>();
    let queue = Arc::new(Mutex::new(queue));
    for n in 0..count {
        let queue = queue.clone();
        std::thread::Builder::new()
            .name(format!("password-check-{n}"))
            .spawn(move || {
                loop {
                    // The lock is held only while waiting for a job, so
                    // one idle thread waits on the queue and the others on
                    // the lock.
                    let Ok(job) = lock(&queue).recv() else {
                        return;
                    };
                    // A panicking hash has already answered "no" by
                    // dropping its reply; the thread stays for the next.
                    let _ = std::panic::catch_unwind(AssertUnwindSafe(job));
                }
            })?;
    }
    Ok(jobs)
}

/// The turns, failure counts and remembered credentials of one
/// authenticator.
pub(super) struct Budget {
    limits: CheckLimits,
    /// One permit per hashing thread: a check holds one from before its
    /// job is queued until its hash is done, so a queued job always finds
    /// its thread free.
    turns: Arc<Semaphore>,
    hashers: mpsc::Sender<Job>,
    gauge: Arc<Gauge>,
    /// Keys the fingerprints of remembered credentials, so that the table
    /// says nothing about a password to someone who can read memory
    /// dumps or guess at a plain blake3.
    key: [u8; 32],
    verified: Mutex<ExpiringMap<[u8; 32], String>>,
    failures: Mutex<ExpiringMap<IpAddr, u32>>,
}

impl Budget {
    /// # Errors
    /// When the hashing threads cannot be started.
    pub(super) fn new(limits: CheckLimits) -> std::io::Result<Budget> {
        let mut key = [0; 32];
        OsRng.fill_bytes(&mut key);
        Ok(Budget {
            limits,
            turns: Arc::new(Semaphore::new(limits.max_checks.get())),
            hashers: start_hashers(limits.max_checks.get())?,
            gauge: Arc::default(),
            key,
            verified: Mutex::new(ExpiringMap::with_max_entries(VERIFIED_FOR, MAX_VERIFIED)),
            failures: Mutex::new(ExpiringMap::new(FAILURE_WINDOW)),
        })
    }

    pub(super) fn limits(&self) -> CheckLimits {
        self.limits
    }

    pub(super) fn stats(&self) -> CheckStats {
        let gauge = &self.gauge;
        CheckStats {
            hashes: gauge.hashes.load(Ordering::Relaxed),
            running: gauge.running.load(Ordering::Acquire),
            peak_running: gauge.peak_running.load(Ordering::Acquire),
            busy: gauge.busy.load(Ordering::Relaxed),
            throttled: gauge.throttled.load(Ordering::Relaxed),
        }
    }

    fn fingerprint(&self, credentials: &HeaderValue) -> [u8; 32] {
        *blake3::keyed_hash(&self.key, credentials.as_bytes()).as_bytes()
    }

    /// The user whose exact `credentials` passed a check within the last
    /// five minutes.
    pub(super) fn recall(&self, credentials: &HeaderValue, now: Instant) -> Option<String> {
        lock(&self.verified)
            .get(&self.fingerprint(credentials), now)
            .cloned()
    }

    /// Remembers that `credentials` passed a check as `user`.
    pub(super) fn remember(&self, credentials: &HeaderValue, user: String, now: Instant) {
        let fingerprint = self.fingerprint(credentials);
        lock(&self.verified).insert(fingerprint, user, now);
    }

    /// Counts a failure for `peer` before its check runs, or says that it
    /// has none left this window. Without an address (inetd on a pipe)
    /// nothing is counted.
    pub(super) fn reserve_failure(
        &self,
        peer: Option<IpAddr>,
        now: Instant,
    ) -> Result<(), NoCheck> {
        let Some(peer) = peer else {
            return Ok(());
        };
        let mut failures = lock(&self.failures);
        let count = failures.get_or_insert_with(peer, now, || 0);
        if *count >= self.limits.max_failures {
            self.gauge.throttled.fetch_add(1, Ordering::Relaxed);
            return Err(NoCheck::Throttled);
        }
        *count += 1;
        Ok(())
    }

    /// Gives back a failure reserved for `peer`: its check passed, or
    /// never ran.
    pub(super) fn give_back(&self, peer: Option<IpAddr>, now: Instant) {
        let Some(peer) = peer else {
            return;
        };
        let mut failures = lock(&self.failures);
        // An entry that expired meanwhile started a new window: nothing
        // of this check is in it.
        if let Some(count) = failures.get_mut(&peer, now) {
            *count = count.saturating_sub(1);
        }
    }

    /// Runs `hash` on a hashing thread once a turn is free, waiting for
    /// one at most [`CheckLimits::check_wait`]; its verdict.
    ///
    /// The turn goes with the hash onto its thread, so a request dropped
    /// while its hash runs does not free the turn before the memory is.
    pub(super) async fn run(
        &self,
        hash: impl FnOnce() -> bool + Send + 'static,
    ) -> Result<bool, NoCheck> {
        let turn =
            tokio::time::timeout(self.limits.check_wait, self.turns.clone().acquire_owned()).await;
        let Ok(Ok(turn)) = turn else {
            // Timed out (the semaphore is never closed).
            self.gauge.busy.fetch_add(1, Ordering::Relaxed);
            return Err(NoCheck::Busy);
        };
        let gauge = self.gauge.clone();
        let (reply, verdict) = oneshot::channel();
        let job: Job = Box::new(move || {
            let running = Running::start(&gauge);
            let verdict = hash();
            // Done before the answer, so that whoever reads the answer
            // sees the hash finished and its turn free.
            drop(running);
            drop(turn);
            // The request may have gone meanwhile: nobody to tell.
            let _ = reply.send(verdict);
        });
        if self.hashers.send(job).is_err() {
            // The threads are gone (they only end with the sender): treat
            // it as no turn rather than as a wrong password.
            self.gauge.busy.fetch_add(1, Ordering::Relaxed);
            return Err(NoCheck::Busy);
        }
        // A hash that panicked dropped its reply: a wrong password, not a
        // crash.
        Ok(verdict.await.unwrap_or(false))
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(max_checks: usize, check_wait: Duration) -> CheckLimits {
        CheckLimits {
            max_checks: NonZeroUsize::new(max_checks).unwrap(),
            check_wait,
            max_failures: 10,
        }
    }

    #[test]
    fn a_10_failures_are_reserved_up_front_and_given_back() {
        let budget = Budget::new(limits(2, Duration::ZERO)).unwrap();
        let peer = Some(IpAddr::from([192, 0, 2, 1]));
        let t0 = Instant::now();
        for _ in 0..10 {
            assert_eq!(budget.reserve_failure(peer, t0), Ok(()));
        }
        assert_eq!(budget.reserve_failure(peer, t0), Err(NoCheck::Throttled));
        budget.give_back(peer, t0);
        assert_eq!(budget.reserve_failure(peer, t0), Ok(()));
        assert_eq!(budget.reserve_failure(peer, t0), Err(NoCheck::Throttled));
        // Other addresses and no address are not affected.
        assert_eq!(
            budget.reserve_failure(Some([192, 0, 2, 2].into()), t0),
            Ok(())
        );
        assert_eq!(budget.reserve_failure(None, t0), Ok(()));
        // The window is over.
        assert_eq!(budget.reserve_failure(peer, t0 + FAILURE_WINDOW), Ok(()));
        assert_eq!(budget.stats().throttled, 2);
    }

    #[test]
    fn a_10_remembered_credentials_match_only_the_exact_header_and_expire() {
        let budget = Budget::new(limits(2, Duration::ZERO)).unwrap();
        let t0 = Instant::now();
        let right = HeaderValue::from_static("Basic YWxpY2U6d29uZGVybGFuZA==");
        budget.remember(&right, "alice".to_owned(), t0);
        assert_eq!(budget.recall(&right, t0), Some("alice".to_owned()));
        for other in [
            "Basic YWxpY2U6d29uZGVybGFuZA=",
            "Basic YWxpY2U6d29uZGVybGFuZA==x",
            "Basic YWxpY2U6d29uZGVybGFuZQ==",
            "basic YWxpY2U6d29uZGVybGFuZA==",
        ] {
            let other = HeaderValue::from_static(other);
            assert_eq!(budget.recall(&other, t0), None, "{other:?}");
        }
        assert_eq!(budget.recall(&right, t0 + VERIFIED_FOR), None);
        // Another process (another key) does not know it either.
        let other_process = Budget::new(limits(2, Duration::ZERO)).unwrap();
        assert_ne!(other_process.key, budget.key);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_10_at_most_max_checks_hashes_run_at_once_and_the_rest_are_busy() {
        let budget = Arc::new(Budget::new(limits(2, Duration::ZERO)).unwrap());
        let hash = || {
            std::thread::sleep(Duration::from_millis(20));
            false
        };
        let checks: Vec<_> = (0..50)
            .map(|_| {
                let budget = budget.clone();
                tokio::spawn(async move { budget.run(hash).await })
            })
            .collect();
        let mut busy = 0;
        for check in checks {
            match check.await.unwrap() {
                Ok(verdict) => assert!(!verdict),
                Err(no) => {
                    assert_eq!(no, NoCheck::Busy);
                    busy += 1;
                }
            }
        }
        let stats = budget.stats();
        assert!(stats.peak_running <= 2, "{stats:?}");
        assert_eq!(stats.running, 0);
        assert_eq!(stats.busy, busy);
        assert_eq!(stats.hashes, 50 - busy);
        assert!(busy > 0, "with no wait, 50 at once cannot all have a turn");
    }

    #[tokio::test]
    async fn a_10_a_panicking_hash_is_a_failure_and_frees_its_turn() {
        let budget = Budget::new(limits(1, Duration::ZERO)).unwrap();
        assert_eq!(budget.run(|| panic!("hash")).await, Ok(false));
        assert_eq!(budget.run(|| true).await, Ok(true));
        assert_eq!(budget.stats().running, 0);
    }
}
