//! A map whose entries expire by age: the table behind in-flight request
//! coalescing, per-upstream capabilities (`Hsync-Accept`), queue IDs and
//! auth failure counters.
//!
//! Age, not count, is the rule, as the Gnutella routing-table guidelines
//! advise: a table capped at N entries either forgets live entries under a
//! flood or holds stale ones when traffic is quiet, while a table that
//! keeps each entry for a fixed time holds at most `rate × ttl` entries
//! whatever the traffic (RELIABILITY C-T1). An optional `max_entries` cap
//! exists only as a backstop against a flood faster than anyone planned
//! for; when it bites, the entry closest to expiry goes first and the
//! eviction is counted.
//!
//! An entry expires `ttl` after it was inserted; inserting the key again
//! refreshes it, reading it does not. An expired entry is absent to every
//! lookup even before it is swept. Memory stays bounded without anyone
//! calling [`ExpiringMap::sweep`], because every insert also removes a few
//! expired entries; a periodic `sweep` on a timer tick additionally makes
//! sure no entry outlives `ttl` + one tick.
//!
//! Deliberately left out:
//! - locking and timers: the map is synchronous; callers wrap it in a
//!   `std::sync::Mutex` (never held across `.await`) and, if they want
//!   the TTL + tick bound, call `sweep` from their own interval task;
//! - reading the clock: every method that needs the time takes `now`, so
//!   tests drive it with explicit [`Instant`]s. Only the monotonic clock is
//!   used (tokio's [`Instant`], which follows tokio's paused test clock),
//!   so a wall-clock jump has no effect.
//!
//! Expiry order is kept in a `BTreeMap` keyed by (deadline, generation)
//! rather than a FIFO with lazy deletion: per-entry TTLs make deadlines
//! non-monotonic in insertion order, and removing the queue item eagerly
//! on re-insert or remove means the queue never holds stale items that
//! could delete a newer entry for the same key. The generation makes two
//! entries with the same deadline distinct. Sweeping costs O(log n) per
//! expired entry.
//!
//! Main type: [`ExpiringMap`].

use std::borrow::Borrow;
use std::collections::{BTreeMap, HashMap};
use std::hash::Hash;
use std::num::NonZeroUsize;
use std::time::Duration;

use tokio::time::Instant;

/// How many expired entries an insert removes at most. More than the one
/// entry it adds, so a backlog of expired entries shrinks with every insert,
/// yet bounded, so no single insert pays for a whole backlog while its
/// caller holds the mutex.
const SWEEP_PER_INSERT: usize = 4;

/// A deadline used when `now + ttl` does not fit in an [`Instant`]: far
/// enough to mean "never, for this process".
const FAR_FUTURE: Duration = Duration::from_secs(30 * 365 * 24 * 60 * 60);

/// A map whose entries disappear a fixed time after they were inserted.
#[derive(Debug)]
pub struct ExpiringMap<K, V> {
    ttl: Duration,
    max_entries: Option<NonZeroUsize>,
    entries: HashMap<K, Slot<V>>,
    /// (deadline, generation) → key, one item per entry; the first expires
    /// first.
    deadlines: BTreeMap<(Instant, u64), K>,
    next_generation: u64,
    evictions: u64,
}

#[derive(Debug)]
struct Slot<V> {
    value: V,
    deadline: Instant,
    generation: u64,
}

impl<V> Slot<V> {
    fn is_live(&self, now: Instant) -> bool {
        now < self.deadline
    }
}

impl<K, V> ExpiringMap<K, V>
where
    K: Hash + Eq + Clone,
{
    /// An empty map whose entries live for `ttl` unless inserted with
    /// their own.
    pub fn new(ttl: Duration) -> Self {
        ExpiringMap {
            ttl,
            max_entries: None,
            entries: HashMap::new(),
            deadlines: BTreeMap::new(),
            next_generation: 0,
            evictions: 0,
        }
    }

    /// An empty map like [`ExpiringMap::new`] that also never holds more
    /// than `max_entries`: a backstop against floods, not the expiry rule.
    pub fn with_max_entries(ttl: Duration, max_entries: NonZeroUsize) -> Self {
        ExpiringMap {
            max_entries: Some(max_entries),
            ..Self::new(ttl)
        }
    }

    /// The default time an entry lives after its insertion.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// The cap on stored entries, if any.
    pub fn max_entries(&self) -> Option<NonZeroUsize> {
        self.max_entries
    }

    /// How many live entries the `max_entries` cap has pushed out so far.
    pub fn evictions(&self) -> u64 {
        self.evictions
    }

    /// The number of stored entries, including expired ones not yet swept:
    /// this is what the map costs in memory.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether no entries are stored, expired or not.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Stores `value` under `key` for the default TTL from `now`, replacing
    /// (and refreshing) any entry for `key`. Returns the replaced value if
    /// it was still live at `now`.
    pub fn insert(&mut self, key: K, value: V, now: Instant) -> Option<V> {
        self.insert_with_ttl(key, value, self.ttl, now)
    }

    /// Stores `value` under `key` for `ttl` from `now`, for entries with
    /// their own lifetime (a capability advertised with its own max-age).
    /// Returns the replaced value if it was still live at `now`.
    ///
    /// A `ttl` so long that `now + ttl` overflows [`Instant`] is taken as
    /// about 30 years.
    pub fn insert_with_ttl(&mut self, key: K, value: V, ttl: Duration, now: Instant) -> Option<V> {
        self.sweep_some(now);
        let old = self.unlink(&key);
        if old.is_none() {
            self.make_room(now);
        }
        self.link(key, value, ttl, now);
        old.filter(|slot| slot.is_live(now)).map(|slot| slot.value)
    }

    /// The value under `key` if its entry is live at `now`.
    pub fn get<Q>(&self, key: &Q, now: Instant) -> Option<&V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.entries
            .get(key)
            .filter(|slot| slot.is_live(now))
            .map(|slot| &slot.value)
    }

    /// The entries live at `now`, in no order.
    pub fn iter(&self, now: Instant) -> impl Iterator<Item = (&K, &V)> {
        self.entries
            .iter()
            .filter(move |(_, slot)| slot.is_live(now))
            .map(|(key, slot)| (key, &slot.value))
    }

    /// The value under `key`, mutably, if its entry is live at `now`.
    /// Changing the value does not refresh the entry.
    pub fn get_mut<Q>(&mut self, key: &Q, now: Instant) -> Option<&mut V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.entries
            .get_mut(key)
            .filter(|slot| slot.is_live(now))
            .map(|slot| &mut slot.value)
    }

    /// How long the entry for `key` has left at `now`, if it is live:
    /// the time until it expires, never zero.
    pub fn time_left<Q>(&self, key: &Q, now: Instant) -> Option<Duration>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.entries
            .get(key)
            .filter(|slot| slot.is_live(now))
            .map(|slot| slot.deadline - now)
    }

    /// Whether `key` has an entry live at `now`.
    pub fn contains_key<Q>(&self, key: &Q, now: Instant) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.get(key, now).is_some()
    }

    /// The live value under `key`, or, if there is none or it has expired,
    /// a new entry holding `f()` for the default TTL from `now`. Meant for
    /// counters: a count whose entry expired starts again from `f()`.
    pub fn get_or_insert_with(&mut self, key: K, now: Instant, f: impl FnOnce() -> V) -> &mut V {
        self.sweep_some(now);
        let is_live = self.entries.get(&key).is_some_and(|slot| slot.is_live(now));
        if !is_live {
            if self.unlink(&key).is_none() {
                self.make_room(now);
            }
            self.link(key.clone(), f(), self.ttl, now);
        }
        &mut self
            .entries
            .get_mut(&key)
            .expect("the entry is live or was just linked")
            .value
    }

    /// Removes the entry for `key` and returns its value, expired or not.
    pub fn remove<Q>(&mut self, key: &Q) -> Option<V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.unlink(key).map(|slot| slot.value)
    }

    /// Removes every entry expired at `now` and returns how many it
    /// removed.
    pub fn sweep(&mut self, now: Instant) -> usize {
        self.sweep_up_to(now, usize::MAX)
    }

    fn sweep_some(&mut self, now: Instant) {
        self.sweep_up_to(now, SWEEP_PER_INSERT);
    }

    fn sweep_up_to(&mut self, now: Instant, limit: usize) -> usize {
        let mut removed = 0;
        while removed < limit {
            let Some(entry) = self.deadlines.first_entry() else {
                break;
            };
            if entry.key().0 > now {
                break;
            }
            let key = entry.remove();
            let slot = self.entries.remove(&key);
            debug_assert!(slot.is_some(), "every deadline has its entry");
            removed += 1;
        }
        removed
    }

    /// Frees one place if the cap is reached, for an entry about to be
    /// added under a new key.
    fn make_room(&mut self, now: Instant) {
        let Some(max) = self.max_entries else {
            return;
        };
        if self.entries.len() < max.get() {
            return;
        }
        // The entry closest to expiry: with one TTL for all entries this is
        // also the oldest. If it has already expired, this is a sweep, not
        // an eviction.
        let Some(((deadline, _), key)) = self.deadlines.pop_first() else {
            return;
        };
        self.entries.remove(&key);
        if deadline > now {
            self.evictions += 1;
        }
    }

    fn link(&mut self, key: K, value: V, ttl: Duration, now: Instant) {
        let deadline = now
            .checked_add(ttl)
            .or_else(|| now.checked_add(FAR_FUTURE))
            .unwrap_or(now);
        let generation = self.next_generation;
        self.next_generation += 1;
        self.deadlines.insert((deadline, generation), key.clone());
        self.entries.insert(
            key,
            Slot {
                value,
                deadline,
                generation,
            },
        );
    }

    fn unlink<Q>(&mut self, key: &Q) -> Option<Slot<V>>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let slot = self.entries.remove(key)?;
        let queued = self.deadlines.remove(&(slot.deadline, slot.generation));
        debug_assert!(queued.is_some(), "every entry has its deadline");
        Some(slot)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TTL: Duration = Duration::from_secs(60);
    const MS: Duration = Duration::from_millis(1);

    fn map() -> ExpiringMap<u64, u32> {
        ExpiringMap::new(TTL)
    }

    /// Every stored entry has exactly one deadline and the other way round.
    fn assert_consistent<K: Hash + Eq + Clone + std::fmt::Debug, V>(map: &ExpiringMap<K, V>) {
        assert_eq!(map.entries.len(), map.deadlines.len());
        for ((deadline, generation), key) in &map.deadlines {
            let slot = &map.entries[key];
            assert_eq!((slot.deadline, slot.generation), (*deadline, *generation));
        }
    }

    #[test]
    fn entry_is_present_just_before_ttl_and_gone_at_ttl() {
        let t0 = Instant::now();
        let mut map = map();
        map.insert(1, 10, t0);
        assert_eq!(map.get(&1, t0), Some(&10));
        assert_eq!(map.get(&1, t0 + TTL - MS), Some(&10));
        assert_eq!(map.get(&1, t0 + TTL), None);
        assert!(!map.contains_key(&1, t0 + TTL));
        assert!(map.get_mut(&1, t0 + TTL).is_none());
        // Absent before any sweep, but still stored until swept.
        assert_eq!(map.len(), 1);
        assert_eq!(map.sweep(t0 + TTL), 1);
        assert!(map.is_empty());
    }

    #[test]
    fn time_left_counts_down_to_expiry_and_ignores_reads() {
        let t0 = Instant::now();
        let mut map = map();
        assert_eq!(map.time_left(&1, t0), None);
        map.insert(1, 10, t0);
        assert_eq!(map.time_left(&1, t0), Some(TTL));
        *map.get_mut(&1, t0 + TTL / 2).expect("live") += 1;
        assert_eq!(map.time_left(&1, t0 + TTL / 2), Some(TTL / 2));
        assert_eq!(map.time_left(&1, t0 + TTL - MS), Some(MS));
        assert_eq!(map.time_left(&1, t0 + TTL), None);
    }

    #[test]
    fn get_does_not_refresh() {
        let t0 = Instant::now();
        let mut map = map();
        map.insert(1, 10, t0);
        *map.get_mut(&1, t0 + TTL / 2).expect("live") += 1;
        assert_eq!(map.get(&1, t0 + TTL - MS), Some(&11));
        assert_eq!(map.get(&1, t0 + TTL), None);
    }

    #[test]
    fn reinsert_refreshes_and_old_deadline_does_not_remove_new_entry() {
        let t0 = Instant::now();
        let mut map = map();
        assert_eq!(map.insert(1, 10, t0), None);
        let t1 = t0 + TTL / 2;
        assert_eq!(map.insert(1, 11, t1), Some(10));
        // The first insertion's deadline passes: the new entry stays.
        assert_eq!(map.sweep(t0 + TTL), 0);
        assert_eq!(map.get(&1, t0 + TTL), Some(&11));
        assert_eq!(map.get(&1, t1 + TTL - MS), Some(&11));
        assert_eq!(map.sweep(t1 + TTL), 1);
        assert!(map.is_empty());
        assert_consistent(&map);
    }

    #[test]
    fn insert_over_expired_entry_returns_none() {
        let t0 = Instant::now();
        let mut map = map();
        map.insert(1, 10, t0);
        assert_eq!(map.insert(1, 11, t0 + TTL), None);
        assert_eq!(map.len(), 1);
        assert_consistent(&map);
    }

    #[test]
    fn sweep_removes_only_expired_and_returns_count() {
        let t0 = Instant::now();
        let mut map = map();
        for k in 0..10 {
            map.insert(k, 0, t0 + Duration::from_secs(k));
        }
        // Keys 0..=3 were inserted at or before t0 + 3 s.
        assert_eq!(map.sweep(t0 + TTL + Duration::from_secs(3)), 4);
        assert_eq!(map.len(), 6);
        assert!(map.get(&3, t0).is_none());
        assert!(map.get(&4, t0).is_some());
        assert_eq!(map.sweep(t0 + TTL + Duration::from_secs(3)), 0);
        assert_consistent(&map);
    }

    #[test]
    fn remove_returns_value_and_its_deadline_goes_too() {
        let t0 = Instant::now();
        let mut map = map();
        map.insert(1, 10, t0);
        map.insert(2, 20, t0);
        assert_eq!(map.remove(&1), Some(10));
        assert_eq!(map.remove(&1), None);
        assert_consistent(&map);
        assert_eq!(map.sweep(t0 + TTL), 1);
    }

    #[test]
    fn string_keys_are_looked_up_by_str() {
        let t0 = Instant::now();
        let mut map: ExpiringMap<String, u32> = ExpiringMap::new(TTL);
        map.insert("http://a/".to_owned(), 1, t0);
        assert_eq!(map.get("http://a/", t0), Some(&1));
        assert_eq!(map.remove("http://a/"), Some(1));
    }

    #[test]
    fn per_entry_ttl_overrides_default() {
        let t0 = Instant::now();
        let mut map = map();
        let short = Duration::from_secs(5);
        let long = Duration::from_secs(600);
        map.insert_with_ttl(1, 1, long, t0);
        map.insert_with_ttl(2, 2, short, t0);
        map.insert(3, 3, t0);
        assert_eq!(map.get(&2, t0 + short - MS), Some(&2));
        assert_eq!(map.get(&2, t0 + short), None);
        assert_eq!(map.get(&3, t0 + TTL), None);
        assert_eq!(map.get(&1, t0 + TTL), Some(&1));
        assert_eq!(map.get(&1, t0 + long - MS), Some(&1));
        assert_eq!(map.get(&1, t0 + long), None);
        // Deadlines out of insertion order still sweep in deadline order.
        assert_eq!(map.sweep(t0 + short), 1);
        assert_eq!(map.sweep(t0 + TTL), 1);
        assert_eq!(map.sweep(t0 + long), 1);
    }

    #[test]
    fn huge_ttl_does_not_panic_and_never_expires_in_practice() {
        let t0 = Instant::now();
        let mut map = map();
        map.insert_with_ttl(1, 1, Duration::MAX, t0);
        assert_eq!(
            map.get(&1, t0 + Duration::from_secs(10 * 365 * 86_400)),
            Some(&1)
        );
    }

    #[test]
    fn zero_ttl_entry_is_never_visible() {
        let t0 = Instant::now();
        let mut map = map();
        map.insert_with_ttl(1, 1, Duration::ZERO, t0);
        assert_eq!(map.get(&1, t0), None);
        assert_eq!(map.sweep(t0), 1);
    }

    #[test]
    fn cap_evicts_oldest_first_and_counts_evictions() {
        let t0 = Instant::now();
        let max = NonZeroUsize::new(3).expect("3 is not zero");
        let mut map = ExpiringMap::with_max_entries(TTL, max);
        for k in 0..5u64 {
            map.insert(k, k, t0 + Duration::from_secs(k));
        }
        let now = t0 + Duration::from_secs(5);
        assert_eq!(map.len(), 3);
        assert_eq!(map.evictions(), 2);
        assert!(map.get(&0, now).is_none());
        assert!(map.get(&1, now).is_none());
        assert!((2..5).all(|k| map.get(&k, now) == Some(&k)));
        // Replacing an existing key at the cap evicts nothing.
        map.insert(4, 40, now);
        assert_eq!(map.evictions(), 2);
        assert_eq!(map.get(&2, now), Some(&2));
        assert_consistent(&map);
    }

    #[test]
    fn cap_removing_an_expired_entry_is_not_an_eviction() {
        let t0 = Instant::now();
        let max = NonZeroUsize::new(1).expect("1 is not zero");
        let mut map = ExpiringMap::with_max_entries(TTL, max);
        map.insert(1, 1, t0);
        map.insert(2, 2, t0 + TTL);
        assert_eq!(map.evictions(), 0);
        map.insert(3, 3, t0 + TTL);
        assert_eq!(map.evictions(), 1);
        assert_eq!(map.get(&3, t0 + TTL), Some(&3));
        assert_eq!(map.len(), 1);
    }

    #[test]
    fn get_or_insert_with_counts_and_resets_an_expired_counter() {
        let t0 = Instant::now();
        let mut failures: ExpiringMap<&str, u32> = ExpiringMap::new(TTL);
        for i in 0..3 {
            *failures.get_or_insert_with("peer", t0 + Duration::from_secs(i), || 0) += 1;
        }
        assert_eq!(failures.get("peer", t0 + TTL - MS), Some(&3));
        // Counting does not refresh: the window starts at the first failure.
        let later = t0 + TTL;
        *failures.get_or_insert_with("peer", later, || 0) += 1;
        assert_eq!(failures.get("peer", later), Some(&1));
        assert_eq!(failures.get("peer", later + TTL - MS), Some(&1));
        assert_eq!(failures.len(), 1);
        assert_consistent(&failures);
    }

    /// C-T1: distinct keys at a steady rate, nobody calling `sweep`; the
    /// stored size never exceeds rate × TTL × 1.1.
    #[test]
    fn steady_rate_of_distinct_keys_stays_within_rate_times_ttl() {
        // C-T1 names 1M keys; that took 2.6 s in a debug build on a busy
        // box. 300k still turns the 10k-entry table over 30 times.
        const KEYS: u64 = 300_000;
        const RATE_PER_SEC: u64 = 1_000;
        let ttl = Duration::from_secs(10);
        let step = Duration::from_secs(1) / RATE_PER_SEC as u32;
        let bound = (RATE_PER_SEC * ttl.as_secs()) as usize * 11 / 10;
        let t0 = Instant::now();
        let mut map = ExpiringMap::new(ttl);
        let mut now = t0;
        let mut peak = 0;
        for k in 0..KEYS {
            map.insert(k, (), now);
            peak = peak.max(map.len());
            now += step;
        }
        assert!(peak <= bound, "peak {peak} > bound {bound}");
        // The table filled up to about rate × TTL, so the bound was tested.
        assert!(
            peak >= bound * 9 / 10,
            "peak {peak} too low to test the bound"
        );
        assert_consistent(&map);
    }

    /// C-T1: with a sweep on every tick, no entry outlives TTL + one tick.
    #[test]
    fn sweep_tick_leaves_no_entry_older_than_ttl_plus_tick() {
        let ttl = Duration::from_secs(10);
        let tick = Duration::from_secs(1);
        let step = Duration::from_millis(7);
        let t0 = Instant::now();
        let mut map = ExpiringMap::new(ttl);
        let mut inserted_at = HashMap::new();
        let mut now = t0;
        let mut next_tick = t0 + tick;
        for k in 0..20_000u64 {
            map.insert(k, (), now);
            inserted_at.insert(k, now);
            now += step;
            if now >= next_tick {
                for key in map.entries.keys() {
                    assert!(now - inserted_at[key] <= ttl + tick, "key {key} outlived");
                }
                map.sweep(now);
                next_tick += tick;
                for key in map.entries.keys() {
                    assert!(now - inserted_at[key] < ttl, "key {key} survived a sweep");
                }
            }
        }
    }
}
