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
//!   time and in size;
//! - the window is a sliding one: an address is refused while it has
//!   `max_failures` failures in the last 60 seconds, so no 60-second span
//!   holds more, wherever it starts. A window fixed at the address's first
//!   failure let ten guesses just before its end and ten more just after,
//!   19 within two seconds. So each address keeps the times of its last
//!   `max_failures` failures (4 bytes each), and a throttled address is
//!   told to retry when the oldest of them leaves the window;
//! - the failure times are an [`ExpiringMap`] too, an address's entry
//!   living until its newest failure leaves the window, and capped at
//!   [`CheckLimits::max_failure_addresses`] (at most
//!   [`FAILURE_ENTRY_BYTES`] + 4 × `max_failures` bytes each), since a
//!   client with a block of IPv6 addresses could otherwise add entries
//!   faster than they expire.
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
    /// Failed (or still running) checks an address may have in any 60
    /// seconds; with that many in the last 60 seconds it gets 429 without
    /// a hash until the oldest of them is 60 seconds old.
    pub max_failures: u32,
    /// Addresses whose failures are counted at once, each costing at most
    /// [`FAILURE_ENTRY_BYTES`] + [`FAILURE_TIME_BYTES`] × `max_failures`.
    /// When all are taken, the address whose last failure leaves the
    /// window first is forgotten to make room (see
    /// `Budget::reserve_failure` for why).
    pub max_failure_addresses: NonZeroUsize,
}

/// The most one address in the failure table costs, in bytes, rounded up,
/// besides its failure times ([`FAILURE_TIME_BYTES`] each): its hash-table
/// slot (57 bytes in a table that doubles to twice the cap once entries
/// churn, and briefly holds both sizes while it does), its entry in the
/// expiry order's B-tree nodes, its boxed record (40 bytes), and
/// allocator overhead. Measured by counting allocations while 300,000
/// addresses passed through a table capped at 100,000, ten failures each:
/// 309 bytes an address held, 383 at the peak, of which 40 were the ten
/// times (one failure each: 285 and 359).
pub const FAILURE_ENTRY_BYTES: u64 = 360;

/// What each failure an address may have in the window adds to
/// [`FAILURE_ENTRY_BYTES`]: its time, a `u32` (the vector holding them
/// grows to `max_failures` and no further).
pub const FAILURE_TIME_BYTES: u64 = 4;

impl CheckLimits {
    /// The defaults, for the flags and for [`Default`]: two hashes at
    /// once (38 MiB), a two-second wait, ten failures in any 60 seconds
    /// counted for up to 100,000 addresses (at most 400 bytes each,
    /// 40 MB).
    pub const DEFAULT: CheckLimits = CheckLimits {
        max_checks: NonZeroUsize::new(2).expect("not zero"),
        check_wait: Duration::from_secs(2),
        max_failures: 10,
        max_failure_addresses: NonZeroUsize::new(100_000).expect("not zero"),
    };

    /// The most memory one address in the failure table can take, in
    /// bytes.
    pub fn max_failure_entry_memory(&self) -> u64 {
        FAILURE_ENTRY_BYTES + FAILURE_TIME_BYTES * u64::from(self.max_failures)
    }

    /// The most memory the failure table can take, in bytes.
    pub fn max_failure_table_memory(&self) -> u64 {
        self.max_failure_addresses.get() as u64 * self.max_failure_entry_memory()
    }
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
    /// Addresses whose failures were forgotten before their minute was
    /// over, because [`CheckLimits::max_failure_addresses`] were counted.
    pub forgotten_addresses: u64,
}

/// Why a check was not run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum NoCheck {
    /// The address has used up its failures for the window, which ends
    /// after `retry_after`.
    Throttled {
        /// Until the address's window ends; never zero.
        retry_after: Duration,
    },
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
    /// Boxed so that the hash table's slots, of which it keeps up to four
    /// per address while it grows, stay at 57 bytes rather than 89.
    failures: Mutex<ExpiringMap<IpAddr, Box<Failures>>>,
}

/// One address's failures in the last [`FAILURE_WINDOW`], oldest first:
/// when each was reserved, as whole microseconds after `base`, rounded up
/// (so none seems older than it is). Four bytes a failure rather than an
/// [`Instant`]'s 16; at most `max_failures` of them are kept, since an
/// address with that many in the window gets no more.
#[derive(Debug)]
struct Failures {
    /// When the oldest failure was reserved (or the last one, if the
    /// window has emptied).
    base: Instant,
    /// Microseconds after `base`, ascending; the first is 0. They stay
    /// under the window's 60 × 10⁶, far from `u32::MAX`.
    times: Vec<u32>,
}

impl Failures {
    fn new(now: Instant) -> Failures {
        Failures {
            base: now,
            times: Vec::new(),
        }
    }

    fn at(&self, offset: u32) -> Instant {
        self.base + Duration::from_micros(offset.into())
    }

    /// `at` as an offset, or `None` before `base`.
    fn offset(&self, at: Instant) -> Option<u32> {
        let after = at.checked_duration_since(self.base)?;
        let micros = after.as_micros() + u128::from(after.subsec_nanos() % 1000 != 0);
        Some(u32::try_from(micros).unwrap_or(u32::MAX))
    }

    /// Forgets the failures that have left the window at `now`.
    fn forget_gone(&mut self, now: Instant) {
        let gone = self
            .times
            .partition_point(|&offset| self.at(offset) + FAILURE_WINDOW <= now);
        self.times.drain(..gone);
        self.rebase();
    }

    /// Makes the oldest failure the base again, so offsets stay small.
    fn rebase(&mut self) {
        let Some(&first) = self.times.first() else {
            return;
        };
        if first > 0 {
            self.base = self.at(first);
            for offset in &mut self.times {
                *offset -= first;
            }
        }
    }

    /// Counts a failure reserved at `now`, keeping at most `max` times.
    fn add(&mut self, now: Instant, max: usize) {
        if self.times.is_empty() {
            self.base = now;
        }
        // A check that took its time just before another one that found
        // the window empty, but got the lock after it: counted from the
        // other's time, a few microseconds later, which errs on the safe
        // side (its give_back may then find nothing to give back).
        let offset = self.offset(now).unwrap_or(0);
        if self.times.len() == self.times.capacity() {
            // Grown in steps up to `max` and no further: an address seen
            // once (a spray) costs one small allocation, not `max` times.
            let capacity = (self.times.capacity() * 2).clamp(4, max.max(1));
            self.times
                .reserve_exact(capacity.saturating_sub(self.times.len()).max(1));
        }
        let place = self.times.partition_point(|&t| t <= offset);
        self.times.insert(place, offset);
    }

    /// Removes the failure reserved at `at`, if it is still counted.
    fn give_back(&mut self, at: Instant) {
        let Some(offset) = self.offset(at) else {
            return;
        };
        if let Some(place) = self.times.iter().position(|&t| t == offset) {
            self.times.remove(place);
            self.rebase();
        }
    }

    /// When the oldest failure leaves the window, if there is one.
    fn oldest_leaves(&self) -> Option<Instant> {
        let first = *self.times.first()?;
        Some(self.at(first) + FAILURE_WINDOW)
    }

    /// When the newest failure leaves the window, if there is one.
    fn newest_leaves(&self) -> Option<Instant> {
        let last = *self.times.last()?;
        Some(self.at(last) + FAILURE_WINDOW)
    }
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
            failures: Mutex::new(ExpiringMap::with_max_entries(
                FAILURE_WINDOW,
                limits.max_failure_addresses,
            )),
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
            forgotten_addresses: lock(&self.failures).evictions(),
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

    /// Counts a failure for `peer`, reserved at `now`, before its check
    /// runs; or says that it has [`CheckLimits::max_failures`] in the last
    /// [`FAILURE_WINDOW`] and how long until the oldest of them leaves it.
    /// Without an address (inetd on a pipe) nothing is counted.
    ///
    /// A new address when [`CheckLimits::max_failure_addresses`] are
    /// counted makes the table forget the address whose newest failure
    /// leaves the window first (its entry expires first). Forgetting
    /// failures can lock nobody out, which refusing new addresses while
    /// full would: whoever fills the table could keep every client not yet
    /// remembered from logging in. And it is no way to win guesses: to
    /// push out one address before its failures leave the window takes
    /// `max_failure_addresses` new addresses within that window, each with
    /// its own `max_failures`, far more than the one address gets back.
    /// Such a client is bounded by the turns to hash, as any client with
    /// many addresses is.
    pub(super) fn reserve_failure(
        &self,
        peer: Option<IpAddr>,
        now: Instant,
    ) -> Result<(), NoCheck> {
        let Some(peer) = peer else {
            return Ok(());
        };
        let mut failures = lock(&self.failures);
        // Taken out and put back with its new expiry; an entry that
        // expired holds only failures that have left the window.
        let mut entry = failures
            .remove(&peer)
            .unwrap_or_else(|| Box::new(Failures::new(now)));
        entry.forget_gone(now);
        let max = self.limits.max_failures as usize;
        let verdict = match entry.oldest_leaves() {
            Some(leaves) if entry.times.len() >= max => {
                self.gauge.throttled.fetch_add(1, Ordering::Relaxed);
                Err(NoCheck::Throttled {
                    retry_after: leaves - now,
                })
            }
            _ => {
                entry.add(now, max);
                Ok(())
            }
        };
        // Not empty: one was just added, or there were `max` (at least 1).
        if let Some(leaves) = entry.newest_leaves() {
            failures.insert_with_ttl(peer, entry, leaves - now, now);
        }
        verdict
    }

    /// Gives back the failure reserved for `peer` at `reserved_at`: its
    /// check passed, or never ran.
    pub(super) fn give_back(&self, peer: Option<IpAddr>, reserved_at: Instant) {
        let Some(peer) = peer else {
            return;
        };
        let mut failures = lock(&self.failures);
        // An entry holding the failure lives until at least a window after
        // it; one that expired, or was forgotten and began again, no longer
        // holds it.
        let Some(entry) = failures.get_mut(&peer, reserved_at) else {
            return;
        };
        entry.give_back(reserved_at);
        if entry.times.is_empty() {
            failures.remove(&peer);
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
            ..CheckLimits::DEFAULT
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
        assert!(matches!(
            budget.reserve_failure(peer, t0),
            Err(NoCheck::Throttled { .. })
        ));
        budget.give_back(peer, t0);
        assert_eq!(budget.reserve_failure(peer, t0), Ok(()));
        assert!(matches!(
            budget.reserve_failure(peer, t0),
            Err(NoCheck::Throttled { .. })
        ));
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
    fn a_10_a_throttled_address_is_told_when_its_window_ends() {
        let budget = Budget::new(limits(2, Duration::ZERO)).unwrap();
        let peer = Some(IpAddr::from([192, 0, 2, 1]));
        let t0 = Instant::now();
        assert_eq!(budget.reserve_failure(peer, t0), Ok(()));
        let later = t0 + Duration::from_millis(44_250);
        for _ in 1..10 {
            assert_eq!(budget.reserve_failure(peer, later), Ok(()));
        }
        // The wait ends when the oldest failure leaves the window, not
        // the newest.
        let left = FAILURE_WINDOW - Duration::from_millis(44_250);
        assert_eq!(
            budget.reserve_failure(peer, later),
            Err(NoCheck::Throttled { retry_after: left })
        );
        let last_moment = t0 + FAILURE_WINDOW - Duration::from_millis(1);
        assert_eq!(
            budget.reserve_failure(peer, last_moment),
            Err(NoCheck::Throttled {
                retry_after: Duration::from_millis(1)
            })
        );
        assert_eq!(budget.reserve_failure(peer, t0 + FAILURE_WINDOW), Ok(()));
    }

    #[test]
    fn a_10_a_check_that_passes_gives_back_its_own_failure() {
        let budget = Budget::new(limits(2, Duration::ZERO)).unwrap();
        let peer = Some(IpAddr::from([192, 0, 2, 1]));
        let t0 = Instant::now();
        let later = t0 + Duration::from_secs(30);
        assert_eq!(budget.reserve_failure(peer, t0), Ok(()));
        for _ in 1..10 {
            assert_eq!(budget.reserve_failure(peer, later), Ok(()));
        }
        // The check reserved at t0 passed: the others stay, so the wait is
        // for the oldest of them, a whole window after `later`.
        budget.give_back(peer, t0);
        assert_eq!(budget.reserve_failure(peer, later), Ok(()));
        assert_eq!(
            budget.reserve_failure(peer, later),
            Err(NoCheck::Throttled {
                retry_after: FAILURE_WINDOW
            })
        );
        // A failure that has left the window has nothing to give back.
        let gone = later + FAILURE_WINDOW;
        budget.give_back(peer, t0);
        assert_eq!(budget.reserve_failure(peer, gone), Ok(()));
    }

    #[test]
    fn a_10_the_failure_table_bound_counts_each_failure_time() {
        let defaults = CheckLimits::DEFAULT;
        assert_eq!(defaults.max_failure_entry_memory(), 400);
        assert_eq!(defaults.max_failure_table_memory(), 40_000_000);
        let more = CheckLimits {
            max_failures: 100,
            ..defaults
        };
        assert_eq!(more.max_failure_entry_memory(), 760);
    }

    #[test]
    fn a_10_a_full_failure_table_forgets_the_address_whose_window_ends_first() {
        let budget = Budget::new(CheckLimits {
            max_failure_addresses: NonZeroUsize::new(3).unwrap(),
            ..limits(2, Duration::ZERO)
        })
        .unwrap();
        let t0 = Instant::now();
        let second = Duration::from_secs(1);
        let [first, locked, other] = [1, 2, 3].map(|n| Some(IpAddr::from([192, 0, 2, n])));
        assert_eq!(budget.reserve_failure(first, t0), Ok(()));
        for _ in 0..10 {
            assert_eq!(budget.reserve_failure(locked, t0 + second), Ok(()));
        }
        assert_eq!(budget.reserve_failure(other, t0 + second), Ok(()));
        // Full: a new address pushes out the one whose minute ends first,
        // and still gets its check.
        let newcomer = Some(IpAddr::from([0x2001, 0xdb8, 0, 0, 0, 0, 0, 1]));
        assert_eq!(budget.reserve_failure(newcomer, t0 + 2 * second), Ok(()));
        assert_eq!(budget.stats().forgotten_addresses, 1);
        assert_eq!(lock(&budget.failures).len(), 3);
        // The locked address is still locked.
        assert!(matches!(
            budget.reserve_failure(locked, t0 + 2 * second),
            Err(NoCheck::Throttled { .. })
        ));

        // A spray from a /64, one check per address, never holds more
        // than the cap.
        for n in 0..1000u16 {
            let sprayed = IpAddr::from([0x2001, 0xdb8, 0, 1, 0, 0, 0, n]);
            assert_eq!(
                budget.reserve_failure(Some(sprayed), t0 + 3 * second),
                Ok(())
            );
            assert!(lock(&budget.failures).len() <= 3);
        }
        assert_eq!(budget.stats().forgotten_addresses, 1 + 1000);
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
