//! The accelerator's memory of bodies it served, keyed by blake3: every
//! basis a client holds came out of an accelerator, and the client names it
//! in `Hsync-Basis`, so a body still held here lets the encoder compress
//! against the real basis (codec 3) instead of a 6 KiB signature.
//!
//! In memory, bounded by a byte budget, least recently used first out. The
//! accelerator stays correct without it (a miss falls back to rsync), so
//! losing it on restart costs only bandwidth. Bodies on their way in (being
//! collected while they stream) share a quarter of that budget more
//! ([`BasisStore::reserve`]), so that many responses in flight, however
//! slowly their readers read, hold a bounded amount of memory for it.
//!
//! What it holds is visible from outside: a client naming a body's blake3
//! learns from the stream's codec whether the body is held, that is,
//! whether someone was served exactly that body. So by default it keeps
//! only bodies a shared cache may store ([`shareable`], D-B3): guessing a
//! hash then confirms only content any client could have fetched.
//!
//! Main items: [`BasisStore`], [`shareable`].

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, PoisonError};

use http::header::{self, HeaderMap, HeaderName};
use http::{Method, StatusCode};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::cache::freshness::{Storability, storability};

/// `Set-Cookie2` (RFC 2965, obsolete but still sent by some servers).
const SET_COOKIE2: HeaderName = HeaderName::from_static("set-cookie2");

/// Whether the body of a coded 200 answering `request` may be kept as a
/// basis (D-B3), and if not, why.
///
/// RFC 9111's rules for a shared cache first (`no-store` either way,
/// `private`, an authorized request, `Vary: *`), then stricter ones: a
/// request with `Authorization` or `Cookie`, or a response with
/// `Set-Cookie`, is never kept, even when the response says `public` or
/// `s-maxage`. Those directives let a cache serve the response to others,
/// which this store never does: keeping such a body buys only bandwidth,
/// and frameworks that mark every page `public` would make a user's page
/// confirmable by hash. The operator who wants those bytes anyway says so
/// with `--basis-store-private`.
pub fn shareable(request: &HeaderMap, response: &HeaderMap) -> Storability {
    let shared_cache = storability(&Method::GET, request, StatusCode::OK, response, true);
    if shared_cache != Storability::Storable {
        return shared_cache;
    }
    if request.contains_key(header::AUTHORIZATION) {
        return Storability::NotStorable("request carried Authorization");
    }
    if request.contains_key(header::COOKIE) {
        return Storability::NotStorable("request carried Cookie");
    }
    if response.contains_key(header::SET_COOKIE) || response.contains_key(SET_COOKIE2) {
        return Storability::NotStorable("response sets a cookie");
    }
    Storability::Storable
}

/// Bodies by blake3, within a byte budget.
#[derive(Debug)]
pub struct BasisStore {
    budget: usize,
    max_body: usize,
    state: Mutex<State>,
    /// Bytes that bodies being collected may hold, in all.
    collecting: Arc<Semaphore>,
}

/// Bodies being collected hold at most 1 / `COLLECTING_SHARE` of the
/// store's budget at once.
const COLLECTING_SHARE: usize = 4;

#[derive(Debug, Default)]
struct State {
    bodies: HashMap<[u8; 32], (Arc<[u8]>, u64)>,
    /// Last-use tick → digest; the first is the least recently used.
    lru: BTreeMap<u64, [u8; 32]>,
    used: usize,
    tick: u64,
}

impl BasisStore {
    /// A store of at most `budget` bytes, keeping bodies of at most
    /// `max_body` bytes.
    pub fn new(budget: usize, max_body: usize) -> Self {
        BasisStore {
            budget,
            max_body: max_body.min(budget),
            state: Mutex::new(State::default()),
            collecting: Arc::new(Semaphore::new(
                (budget / COLLECTING_SHARE).min(Semaphore::MAX_PERMITS),
            )),
        }
    }

    /// Room for `len` more bytes of a body being collected for the store,
    /// out of the budget that all such bodies share (a quarter of the
    /// store's): `None` when it is spent, and the body is not kept. The
    /// room comes back when the permit drops.
    pub fn reserve(&self, len: usize) -> Option<OwnedSemaphorePermit> {
        let len = u32::try_from(len).ok()?;
        self.collecting.clone().try_acquire_many_owned(len).ok()
    }

    /// Largest body kept (bytes); callers stop collecting a body past it.
    pub fn max_body(&self) -> usize {
        self.max_body
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // The state stays consistent between statements; a panic elsewhere
        // must not take the store down.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The body whose blake3 is `digest`, if held; counts as a use.
    pub fn get(&self, digest: &[u8; 32]) -> Option<Arc<[u8]>> {
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

    /// Keeps `body` under its blake3 `digest` (the caller computed it while
    /// streaming), evicting least recently used bodies to make room.
    /// Bodies over [`max_body`](Self::max_body) are not kept.
    pub fn insert(&self, digest: [u8; 32], body: Arc<[u8]>) {
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

    /// Bytes held.
    pub fn used(&self) -> usize {
        self.lock().used
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> HeaderMap {
        pairs
            .iter()
            .map(|(name, value)| {
                (
                    HeaderName::from_bytes(name.as_bytes()).unwrap(),
                    http::HeaderValue::from_str(value).unwrap(),
                )
            })
            .collect()
    }

    #[test]
    fn only_bodies_a_shared_cache_may_store_and_no_credentials_are_shareable() {
        let plain = map(&[("accept-encoding", "hsync")]);
        assert_eq!(shareable(&plain, &map(&[])), Storability::Storable);
        assert_eq!(
            shareable(&plain, &map(&[("cache-control", "public, max-age=60")])),
            Storability::Storable
        );
        for response in [
            &[("cache-control", "private")][..],
            &[("cache-control", "max-age=60, No-Store")],
            &[("set-cookie", "a=b")],
            &[("set-cookie", "a=b"), ("cache-control", "public")],
            &[("set-cookie2", "a=b")],
        ] {
            assert!(
                matches!(
                    shareable(&plain, &map(response)),
                    Storability::NotStorable(_)
                ),
                "{response:?}"
            );
        }
        for request in [
            &[("authorization", "Basic eDp5")][..],
            &[("cookie", "session=1")],
            &[("cache-control", "no-store")],
        ] {
            let public = map(&[("cache-control", "public, s-maxage=60")]);
            assert!(
                matches!(
                    shareable(&map(request), &public),
                    Storability::NotStorable(_)
                ),
                "{request:?}"
            );
        }
    }

    fn body(byte: u8, len: usize) -> ([u8; 32], Arc<[u8]>) {
        let body: Arc<[u8]> = vec![byte; len].into();
        (*blake3::hash(&body).as_bytes(), body)
    }

    #[test]
    fn keeps_bodies_within_budget_evicting_the_least_recently_used() {
        let store = BasisStore::new(300, 200);
        let (a, body_a) = body(1, 100);
        let (b, body_b) = body(2, 100);
        let (c, body_c) = body(3, 100);
        store.insert(a, body_a.clone());
        store.insert(b, body_b);
        assert_eq!(store.get(&a).as_deref(), Some(&body_a[..]));
        store.insert(c, body_c.clone());
        assert_eq!(store.used(), 300);
        let (d, body_d) = body(4, 100);
        store.insert(d, body_d);
        // b was the least recently used.
        assert!(store.get(&b).is_none());
        assert!(store.get(&a).is_some() && store.get(&c).is_some() && store.get(&d).is_some());
        assert_eq!(store.used(), 300);
    }

    #[test]
    fn bodies_over_the_limit_are_not_kept_and_evict_nothing() {
        let store = BasisStore::new(300, 200);
        let (a, body_a) = body(1, 100);
        store.insert(a, body_a);
        let (big, body_big) = body(9, 201);
        store.insert(big, body_big);
        assert!(store.get(&big).is_none());
        assert!(store.get(&a).is_some());
        assert_eq!(store.used(), 100);
    }

    /// Bodies being collected share a quarter of the budget; what one
    /// gives back another may take.
    #[test]
    fn bodies_being_collected_share_a_quarter_of_the_budget() {
        let store = BasisStore::new(400, 200);
        let first = store.reserve(60).unwrap();
        let mut second = store.reserve(0).unwrap();
        second.merge(store.reserve(40).unwrap());
        assert!(store.reserve(1).is_none());
        drop(first);
        assert!(store.reserve(60).is_some());
        assert!(store.reserve(61).is_none());
    }
}
