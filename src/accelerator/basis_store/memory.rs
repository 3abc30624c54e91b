//! The basis store's memory tier: bodies by blake3 within a byte budget,
//! least recently used first out. Small bodies live here; they cost a
//! copy in memory and nothing on disk, and are gone on restart.
//!
//! Main type: [`Memory`].

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, PoisonError};

/// Bodies by blake3, within a byte budget.
#[derive(Debug)]
pub(super) struct Memory {
    budget: usize,
    max_body: usize,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    bodies: HashMap<[u8; 32], (Arc<[u8]>, u64)>,
    /// Last-use tick → digest; the first is the least recently used.
    lru: BTreeMap<u64, [u8; 32]>,
    used: usize,
    tick: u64,
}

impl Memory {
    /// At most `budget` bytes, keeping bodies of at most `max_body` bytes.
    pub(super) fn new(budget: usize, max_body: usize) -> Memory {
        Memory {
            budget,
            max_body: max_body.min(budget),
            state: Mutex::new(State::default()),
        }
    }

    /// Largest body kept (bytes).
    pub(super) fn max_body(&self) -> usize {
        self.max_body
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // The state stays consistent between statements; a panic elsewhere
        // must not take the store down.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The body whose blake3 is `digest`, if held; counts as a use.
    pub(super) fn get(&self, digest: &[u8; 32]) -> Option<Arc<[u8]>> {
        let mut st = self.lock();
        st.tick += 1;
        let tick = st.tick;
        let (body, last) = st.bodies.get_mut(digest)?;
        let body = body.clone();
        let old = std::mem::replace(last, tick);
        st.lru.remove(&old);
        st.lru.insert(tick, *digest);
        Some(body)
    }

    /// Keeps `body` under `digest`, evicting least recently used bodies to
    /// make room; a body over [`max_body`](Self::max_body) is not kept.
    pub(super) fn insert(&self, digest: [u8; 32], body: Arc<[u8]>) {
        if body.len() > self.max_body {
            return;
        }
        let mut st = self.lock();
        if st.bodies.contains_key(&digest) {
            return;
        }
        while st.used + body.len() > self.budget {
            let Some((_, victim)) = st.lru.pop_first() else {
                return;
            };
            if let Some((old, _)) = st.bodies.remove(&victim) {
                st.used -= old.len();
            }
        }
        st.tick += 1;
        let tick = st.tick;
        st.used += body.len();
        st.lru.insert(tick, digest);
        st.bodies.insert(digest, (body, tick));
    }

    /// Whether the body whose blake3 is `digest` is held (not a use).
    pub(super) fn contains(&self, digest: &[u8; 32]) -> bool {
        self.lock().bodies.contains_key(digest)
    }

    /// Bytes held.
    pub(super) fn used(&self) -> usize {
        self.lock().used
    }
}
