//! The memory cache in front of the disk cache: small, complete, checked
//! entries kept in memory so that a hit on them opens no file and stays on
//! the async thread (target L-1).
//!
//! A memory entry is also a basis that costs no file and no thread hop
//! when another URL's request chooses it.
//!
//! The disk store stays the truth. A memory entry is used only while the
//! store's index still describes the same body (length, blake3, time
//! stored, complete): an entry replaced, refreshed by a 304, evicted or
//! removed is missed here and read from disk again. The bytes were checked
//! against their blake3 when they were read from disk, and are checked
//! again before each use ([`HotEntry::is_intact`]): memory can be written
//! by mistake too, and a small body hashes in microseconds (C-V3).

use std::collections::HashMap;
use std::sync::Mutex;

use bytes::Bytes;
use http::HeaderMap;

use crate::cache::{Completeness, IndexEntry};

/// One entry as it was served from disk.
pub struct HotEntry {
    /// The stored status.
    pub status: u16,
    /// The stored response headers.
    pub headers: HeaderMap,
    /// When the entry was stored or last refreshed (seconds since the epoch).
    pub stored_at: u64,
    /// The checked body.
    pub body: Bytes,
    body_blake3: blake3::Hash,
    /// The entry's signature, for when it is another request's basis.
    pub signature: Bytes,
}

impl HotEntry {
    /// An entry whose `body` matched `body_blake3`.
    pub fn new(
        status: u16,
        headers: HeaderMap,
        stored_at: u64,
        body: Bytes,
        body_blake3: blake3::Hash,
        signature: Bytes,
    ) -> HotEntry {
        HotEntry {
            status,
            headers,
            stored_at,
            body,
            body_blake3,
            signature,
        }
    }

    /// Whether the body still hashes to the digest it was checked against.
    pub fn is_intact(&self) -> bool {
        blake3::hash(&self.body) == self.body_blake3
    }

    /// Whether the store's index still describes this body.
    fn matches(&self, index: &IndexEntry) -> bool {
        index.completeness == Completeness::Complete
            && index.stored_at == self.stored_at
            && index.body_len == self.body.len() as u64
            && index.body_blake3 == self.body_blake3
    }

    fn cost(&self) -> usize {
        // Headers and bookkeeping, roughly.
        self.body.len() + self.signature.len() + 512
    }
}

/// Small entries by key digest, within a byte budget.
pub struct HotCache {
    budget: usize,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    entries: HashMap<[u8; 32], std::sync::Arc<HotEntry>>,
    bytes: usize,
}

impl HotCache {
    /// A cache of at most `budget` bytes (0: keep nothing).
    pub fn new(budget: usize) -> HotCache {
        HotCache {
            budget,
            state: Mutex::new(State::default()),
        }
    }

    /// The largest body worth keeping: a sixteenth of the budget, so that
    /// one large file cannot push out many small ones.
    pub fn max_body(&self) -> usize {
        self.budget / 16
    }

    /// The entry for `key_digest` if the store's `index` still describes it;
    /// a mismatched one is dropped.
    pub fn get(
        &self,
        key_digest: &[u8; 32],
        index: &IndexEntry,
    ) -> Option<std::sync::Arc<HotEntry>> {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let entry = state.entries.get(key_digest)?;
        if entry.matches(index) {
            return Some(entry.clone());
        }
        state.remove(key_digest);
        None
    }

    /// Keeps `entry`, evicting others (in no particular order) to make room.
    pub fn insert(&self, key_digest: [u8; 32], entry: HotEntry) {
        if entry.body.len() > self.max_body() {
            return;
        }
        let cost = entry.cost();
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        state.remove(&key_digest);
        while state.bytes + cost > self.budget {
            let Some(victim) = state.entries.keys().next().copied() else {
                return;
            };
            state.remove(&victim);
        }
        state.bytes += cost;
        state.entries.insert(key_digest, std::sync::Arc::new(entry));
    }

    /// Forgets `key_digest` (the entry was removed or rewritten).
    pub fn remove(&self, key_digest: &[u8; 32]) {
        self.state
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(key_digest);
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).bytes
    }
}

impl State {
    fn remove(&mut self, key_digest: &[u8; 32]) {
        if let Some(old) = self.entries.remove(key_digest) {
            self.bytes -= old.cost();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::CacheKey;

    fn index(body: &[u8], stored_at: u64) -> IndexEntry {
        IndexEntry {
            key: CacheKey::parse("http://e.com/a.js").unwrap(),
            stored_at,
            commit_order: 0,
            body_len: body.len() as u64,
            body_blake3: blake3::hash(body),
            completeness: Completeness::Complete,
            shareable_as_basis: true,
            status: 200,
        }
    }

    fn hot(body: &'static [u8], stored_at: u64) -> HotEntry {
        HotEntry::new(
            200,
            HeaderMap::new(),
            stored_at,
            Bytes::from_static(body),
            blake3::hash(body),
            Bytes::new(),
        )
    }

    #[test]
    fn an_entry_is_used_only_while_the_index_describes_the_same_body() {
        let cache = HotCache::new(1 << 20);
        cache.insert([1; 32], hot(b"release one", 10));
        assert!(cache.get(&[1; 32], &index(b"release one", 10)).is_some());
        // Refreshed by a 304 (stored_at moved): read from disk again.
        assert!(cache.get(&[1; 32], &index(b"release one", 11)).is_none());
        // ...and the stale copy is gone for good.
        assert!(cache.get(&[1; 32], &index(b"release one", 10)).is_none());
        assert_eq!(cache.bytes(), 0);
        // Replaced by another body.
        cache.insert([1; 32], hot(b"release one", 10));
        assert!(cache.get(&[1; 32], &index(b"release two", 10)).is_none());
        // A partial entry in the index is never served from memory.
        cache.insert([1; 32], hot(b"release one", 10));
        let mut partial = index(b"release one", 10);
        partial.completeness = Completeness::Partial;
        assert!(cache.get(&[1; 32], &partial).is_none());
    }

    #[test]
    fn the_budget_holds_and_large_bodies_stay_on_disk() {
        let cache = HotCache::new(16 * 600);
        static BODY: [u8; 88] = [7; 88];
        for i in 0..100u8 {
            cache.insert([i; 32], hot(&BODY, 1));
            assert!(cache.bytes() <= 16 * 600);
        }
        assert!(cache.bytes() > 8 * 600, "it keeps what fits");
        static LARGE: [u8; 601] = [7; 601];
        cache.insert([200; 32], hot(&LARGE, 1));
        assert!(cache.get(&[200; 32], &index(&LARGE, 1)).is_none());
        let none = HotCache::new(0);
        none.insert([1; 32], hot(b"x", 1));
        assert_eq!(none.bytes(), 0);
    }
}
