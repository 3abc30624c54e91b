//! The in-memory index and the size budget: entries by key, by origin and
//! by last use, the bytes committed and reserved, and least-recently-used
//! eviction to make room for a reservation. Nothing here reads a file;
//! eviction only unlinks.
//!
//! Main types: `State` (behind [`super::CacheStore`]'s one lock) and `Slot`.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{MutexGuard, PoisonError};

use tracing::{debug, warn};

use super::Inner;
use super::files::{EntryPaths, remove_if_exists};
use crate::cache::CacheError;
use crate::cache::meta::{Completeness, IndexEntry};

/// Accounting unit: every file counts as a whole number of these.
pub(super) const BLOCK: u64 = 4096;

/// Bytes a file of `len` bytes is counted as.
pub(super) fn disk_bytes(len: u64) -> u64 {
    len.div_ceil(BLOCK) * BLOCK
}

#[derive(Default)]
pub(super) struct State {
    pub(super) slots: HashMap<blake3::Hash, Slot>,
    /// Last-use tick → entry; the first is the least recently used.
    pub(super) lru: BTreeMap<u64, blake3::Hash>,
    pub(super) by_origin: HashMap<String, HashSet<blake3::Hash>>,
    tick: u64,
    /// Bytes of committed entries.
    pub(super) committed: u64,
    /// Bytes reserved by writers plus quarantined bytes.
    pub(super) reserved: u64,
    /// Bytes in quarantine/ (also part of `reserved`).
    pub(super) quarantined: u64,
    /// Entries evicted to make room since the store was opened (not
    /// removals for other reasons: replaced, invalidated, quarantined).
    pub(super) evictions: u64,
}

pub(super) struct Slot {
    pub(super) entry: IndexEntry,
    pub(super) disk_bytes: u64,
    last_used: u64,
}

impl State {
    fn next_tick(&mut self) -> u64 {
        self.tick += 1;
        self.tick
    }

    pub(super) fn insert(&mut self, hash: blake3::Hash, mut entry: IndexEntry, disk_bytes: u64) {
        let tick = self.next_tick();
        entry.commit_order = tick;
        self.by_origin
            .entry(entry.key.origin().to_owned())
            .or_default()
            .insert(hash);
        self.lru.insert(tick, hash);
        self.committed += disk_bytes;
        self.slots.insert(
            hash,
            Slot {
                entry,
                disk_bytes,
                last_used: tick,
            },
        );
    }

    pub(super) fn remove(&mut self, hash: &blake3::Hash) -> Option<Slot> {
        let slot = self.slots.remove(hash)?;
        self.lru.remove(&slot.last_used);
        let origin = slot.entry.key.origin();
        if let Some(set) = self.by_origin.get_mut(origin) {
            set.remove(hash);
            if set.is_empty() {
                self.by_origin.remove(origin);
            }
        }
        self.committed -= slot.disk_bytes;
        Some(slot)
    }

    pub(super) fn touch(&mut self, hash: &blake3::Hash) -> bool {
        let tick = self.next_tick();
        let Some(slot) = self.slots.get_mut(hash) else {
            return false;
        };
        self.lru.remove(&slot.last_used);
        slot.last_used = tick;
        self.lru.insert(tick, *hash);
        true
    }
}

pub(super) fn is_complete(slot: &Slot) -> bool {
    slot.entry.completeness == Completeness::Complete
}

impl Inner {
    pub(super) fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves at worst a stale index entry,
        // which a failed check on the next hit quarantines.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Reserves `bytes` on top of the `held` bytes the caller already has,
    /// evicting least recently used entries as needed; the writer's own
    /// key (`own`) goes last, since a partial write must not displace it.
    pub(super) fn reserve(
        &self,
        bytes: u64,
        held: u64,
        own: &blake3::Hash,
    ) -> Result<(), CacheError> {
        if bytes == 0 {
            return Ok(());
        }
        let over = || CacheError::OverBudget {
            needed: bytes,
            budget: self.budget,
        };
        if held.saturating_add(bytes) > self.budget {
            return Err(over());
        }
        let mut st = self.lock();
        // Fail before evicting anything when the others' reservations leave
        // no room even with an empty index.
        if st.reserved.saturating_add(bytes) > self.budget {
            return Err(over());
        }
        while st.committed + st.reserved + bytes > self.budget {
            let victim = st
                .lru
                .values()
                .find(|hash| *hash != own)
                .or_else(|| st.lru.values().next())
                .copied();
            let Some(victim) = victim else {
                return Err(over());
            };
            self.evict_locked(&mut st, &victim);
            st.evictions += 1;
        }
        st.reserved += bytes;
        Ok(())
    }

    /// Drops an entry from the index and unlinks its files, metadata first.
    pub(super) fn evict_locked(&self, st: &mut State, hash: &blake3::Hash) {
        let Some(slot) = st.remove(hash) else {
            return;
        };
        let paths = EntryPaths::new(&self.root, &slot.entry.key);
        for p in [&paths.meta, &paths.body, &paths.sig] {
            if let Err(e) = remove_if_exists(&*self.fs, p) {
                warn!(path = %p.display(), error = %e, "cannot remove evicted cache file");
            }
        }
        debug!(url = %slot.entry.key, bytes = slot.disk_bytes, "cache entry removed");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn disk_bytes_counts_whole_blocks() {
        assert_eq!(disk_bytes(0), 0);
        assert_eq!(disk_bytes(1), 4096);
        assert_eq!(disk_bytes(4096), 4096);
        assert_eq!(disk_bytes(4097), 8192);
    }
}
