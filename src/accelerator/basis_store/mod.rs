//! The accelerator's memory of bodies it served, keyed by blake3: every
//! basis a client holds came out of an accelerator, and the client names it
//! in `Hsync-Basis`, so a body still held here lets the encoder compress
//! against the real basis (codec 3) instead of a 6 KiB signature.
//!
//! Two tiers, bounded each by a byte budget, least recently used first
//! out: small bodies in memory ([`memory`]), larger ones on disk
//! ([`disk`], crash-safe, surviving a restart). Accelerators behind one
//! load balancer may share their bodies on Redis too ([`shared`]): a body
//! held by neither local tier is looked up there, within a short timeout. The accelerator stays
//! correct without either (a miss falls back to rsync), so losing a body
//! costs only bandwidth. Bodies on their way in ([`Collecting`], while they
//! stream) share a quarter of each tier's budget more, so that many
//! responses in flight, however slowly their readers read, hold a bounded
//! amount of memory and disk for it. A body of unknown length starts in
//! memory and moves to a temp file once it outgrows the memory tier.
//!
//! What it holds is visible from outside: a client naming a body's blake3
//! learns from the stream's codec whether the body is held, that is,
//! whether someone was served exactly that body. So by default it keeps
//! only bodies a shared cache may store ([`shareable`], D-B3): guessing a
//! hash then confirms only content any client could have fetched.
//!
//! Main items: [`BasisStore`], [`Collecting`], [`shareable`].

mod disk;
mod memory;
mod shared;

pub use disk::DiskError;
pub use shared::{SharedError, SharedTier, Unavailable};

use std::num::NonZeroUsize;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;

use http::header::{self, HeaderMap, HeaderValue};
use http::{Method, StatusCode, Uri};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use self::disk::{Disk, DiskWriter};
use self::memory::Memory;
use self::shared::Shared;
use crate::hsync::{Basis, SharedAnchors};

use crate::cache::freshness::{SetCookie, Storability, sets_cookie, storability};
use crate::expiring::ExpiringMap;

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
    let shared_cache = storability(
        &Method::GET,
        request,
        StatusCode::OK,
        response,
        true,
        SetCookie::OnlyIfPublic,
    );
    if shared_cache != Storability::Storable {
        return shared_cache;
    }
    if request.contains_key(header::AUTHORIZATION) {
        return Storability::NotStorable("request carried Authorization");
    }
    if request.contains_key(header::COOKIE) {
        return Storability::NotStorable("request carried Cookie");
    }
    if sets_cookie(response) {
        return Storability::NotStorable("response sets a cookie");
    }
    Storability::Storable
}

/// Bodies served, by blake3: a memory tier, and a disk tier when it is on.
#[derive(Debug)]
pub struct BasisStore {
    memory: Memory,
    /// The memory tier's budget (bytes).
    memory_budget: usize,
    disk: Option<Arc<Disk>>,
    shared: Option<Arc<Shared>>,
    /// Bytes that bodies being collected in memory may hold, in all.
    collecting: Arc<Semaphore>,
    /// The digest each body was kept under, by what named it before its
    /// bytes came ([`ServedAs`]): a popular body served again is not
    /// copied (to a temp file, when large) only to find it held.
    served: Mutex<ExpiringMap<ServedAs, [u8; 32]>>,
    /// The anchors codec 3 finds runs of a large held body by, built by
    /// the first encoding against it and shared by those after it.
    anchors: Mutex<ExpiringMap<[u8; 32], SharedAnchors>>,
}

/// Smallest held body whose anchors are kept for the encoders after the
/// first (bytes): below it indexing costs less than a millisecond.
const SHARED_ANCHORS_MIN_BODY: u64 = 4 << 20;

/// Most bodies whose anchors are kept at once: each takes at most 17 MiB
/// (a million anchors), an eighth of its body's size up to 128 MiB.
const MAX_SHARED_ANCHORS: usize = 4;

/// How long anchors are kept after they were first asked for.
const SHARED_ANCHORS_TTL: Duration = Duration::from_secs(600);

/// How long [`BasisStore`] remembers what a kept body was served as.
const SERVED_TTL: Duration = Duration::from_secs(3600);

/// Most bodies [`BasisStore`] remembers that of at once.
const MAX_SERVED: usize = 10_000;

/// What names a body before its bytes are read: the URL it answered, the
/// origin's strong ETag and its length. Responses alike in all three are
/// taken to carry the same bytes only to skip writing a copy of one held
/// already; the digest computed at the end still decides, and a mismatch
/// (an origin that changed a body under its tag) keeps nothing and
/// forgets the pairing.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ServedAs {
    url: String,
    /// A copy: a `HeaderValue` parsed by hyper is a slice of the
    /// connection's read buffer, and kept for an hour it would keep that
    /// whole buffer (the body's first hundreds of KiB) alive with it.
    etag: Box<[u8]>,
    len: u64,
}

impl ServedAs {
    /// `None` without a strong ETag or a `Content-Length`.
    pub fn of(uri: &Uri, host: Option<&HeaderValue>, response: &HeaderMap) -> Option<ServedAs> {
        let etag = response.get(header::ETAG)?;
        if etag.as_bytes().starts_with(b"W/") {
            return None;
        }
        let len = response
            .get(header::CONTENT_LENGTH)?
            .to_str()
            .ok()?
            .parse()
            .ok()?;
        let host = host.and_then(|h| h.to_str().ok()).unwrap_or_default();
        Some(ServedAs {
            url: format!("{host}{uri}"),
            etag: etag.as_bytes().into(),
            len,
        })
    }
}

/// Bodies being collected hold at most 1 / `COLLECTING_SHARE` of the
/// memory tier's budget at once.
const COLLECTING_SHARE: usize = 4;

/// Where the disk tier lives and how large it may grow.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiskTier {
    /// Its directory (created if missing; locked while in use).
    pub dir: std::path::PathBuf,
    /// Bytes of bodies it keeps, in all.
    pub budget: u64,
    /// Largest body it keeps (bytes).
    pub max_body: u64,
}

impl BasisStore {
    /// A store of at most `budget` bytes in memory, keeping bodies of at
    /// most `max_body` bytes, without a disk tier.
    pub fn new(budget: usize, max_body: usize) -> Self {
        BasisStore {
            memory: Memory::new(budget, max_body),
            memory_budget: budget,
            disk: None,
            shared: None,
            // Room for one of the largest bodies at least: with a quarter
            // alone, a body over a quarter of the budget was never kept,
            // whatever `--max-stored-body` said (a 1 GiB body in a 3 GiB
            // store went uncoded, 212x zstd --patch-from).
            collecting: Arc::new(Semaphore::new(
                (budget / COLLECTING_SHARE)
                    .max(max_body.min(budget))
                    .min(Semaphore::MAX_PERMITS),
            )),
            served: Mutex::new(ExpiringMap::with_max_entries(
                SERVED_TTL,
                NonZeroUsize::new(MAX_SERVED).expect("not zero"),
            )),
            anchors: Mutex::new(ExpiringMap::with_max_entries(
                SHARED_ANCHORS_TTL,
                NonZeroUsize::new(MAX_SHARED_ANCHORS).expect("not zero"),
            )),
        }
    }

    /// The anchors of the held body `digest`, `size` bytes long, shared by
    /// the encoders coding against it: `None` for a small body (each
    /// encoder indexes it alone).
    pub fn anchors_for(&self, digest: &[u8; 32], size: u64) -> Option<SharedAnchors> {
        if size < SHARED_ANCHORS_MIN_BODY {
            return None;
        }
        let mut anchors = self.anchors.lock().unwrap_or_else(|e| e.into_inner());
        let now = tokio::time::Instant::now();
        Some(
            anchors
                .get_or_insert_with(*digest, now, SharedAnchors::default)
                .clone(),
        )
    }

    /// This store with the disk tier `tier` for the bodies larger than the
    /// memory tier keeps.
    ///
    /// # Errors
    /// The directory cannot be created, listed or locked, or another
    /// process holds it ([`DiskError`]).
    pub fn with_disk(mut self, tier: &DiskTier) -> Result<Self, DiskError> {
        self.disk = Some(Arc::new(Disk::open(&tier.dir, tier.budget, tier.max_body)?));
        Ok(self)
    }

    /// This store with the disk tier `tier` if it can be had; without it,
    /// and an error logged, if not: the accelerator then serves as well,
    /// at the cost of bandwidth for large bodies.
    pub fn with_disk_or_log(self, tier: Option<&DiskTier>) -> Self {
        let Some(tier) = tier else {
            return self;
        };
        match Disk::open(&tier.dir, tier.budget, tier.max_body) {
            Ok(disk) => BasisStore {
                disk: Some(Arc::new(disk)),
                ..self
            },
            Err(error) => {
                tracing::error!(%error, "no basis store on disk: bodies over the memory tier's limit are not kept");
                self
            }
        }
    }

    /// This store sharing its bodies on Redis as `tier` says, if it can;
    /// without, and an error logged, if not (the URL was checked with the
    /// configuration, so that is not expected).
    pub fn with_shared_or_log(self, tier: Option<&SharedTier>) -> Self {
        let Some(tier) = tier else {
            return self;
        };
        match Shared::new(tier) {
            Ok(shared) => {
                // Bodies sent to Redis are collected in memory first: room
                // for one of the largest at least.
                let share = (self.memory_budget / COLLECTING_SHARE)
                    .max(usize::try_from(tier.max_body).unwrap_or(usize::MAX));
                BasisStore {
                    shared: Some(Arc::new(shared)),
                    collecting: Arc::new(Semaphore::new(share.min(Semaphore::MAX_PERMITS))),
                    ..self
                }
            }
            Err(error) => {
                tracing::error!(%error, "no shared basis store");
                self
            }
        }
    }

    /// Largest body collected in memory (bytes): the memory tier's, or
    /// the shared store's if that is more.
    fn memory_collect_limit(&self) -> u64 {
        let memory = self.memory.max_body() as u64;
        self.shared
            .as_ref()
            .map_or(memory, |shared| shared.max_body().max(memory))
    }

    /// Whether bodies are shared with other accelerators (`--basis-redis`).
    pub fn is_shared(&self) -> bool {
        self.shared.is_some()
    }

    /// Lookups in the shared store that failed (or were skipped while it
    /// was failing) and fell back to coding without it.
    pub fn shared_failures(&self) -> u64 {
        self.shared.as_ref().map_or(0, |shared| shared.failures())
    }

    /// Room for `len` more bytes of a body being collected in memory, out
    /// of the budget that all such bodies share (a quarter of the memory
    /// tier's): `None` when it is spent. The room comes back when the
    /// permit drops.
    fn reserve(&self, len: usize) -> Option<OwnedSemaphorePermit> {
        let len = u32::try_from(len).ok()?;
        self.collecting.clone().try_acquire_many_owned(len).ok()
    }

    /// Largest body kept, by any tier (bytes): what `Hsync-Held`
    /// announces, and past which callers do not collect a body.
    pub fn max_body(&self) -> u64 {
        let memory = self.memory_collect_limit();
        self.disk
            .as_ref()
            .map_or(memory, |disk| disk.max_body().max(memory))
    }

    /// Longest body announced held (`Hsync-Held`), so that a client names
    /// such a body by its digest alone: the longest kept, or with a shared
    /// store the longest shared. Behind a load balancer the next request
    /// may reach another accelerator, which finds only what is shared; a
    /// longer body is still coded against when this one holds it, the
    /// client having sent its signature too.
    pub fn held_limit(&self) -> u64 {
        match &self.shared {
            Some(shared) => shared.max_body(),
            None => self.max_body(),
        }
    }

    /// Memory that collecting a body announced `expected` bytes long may
    /// take: the body itself if the memory tier would keep it, the memory
    /// tier's limit if its length is unknown (past it, it moves to disk),
    /// nothing for a body that goes straight to disk.
    pub fn collecting_memory(&self, expected: Option<u64>) -> u64 {
        let memory = self.memory_collect_limit();
        match expected {
            Some(len) if len <= memory => len,
            Some(_) if self.disk.is_some() => 0,
            Some(len) => len,
            None => memory,
        }
    }

    /// The body whose blake3 is `digest`, if held, as a basis the encoder
    /// reads (a disk tier's body by offset, on the encoder's thread);
    /// counts as a use. Held by neither local tier, it is looked up in the
    /// shared store, within its timeout, and kept in memory if found.
    ///
    /// # Errors
    /// The shared store failed or did not answer in time ([`Unavailable`]):
    /// the caller codes without a held body, as on a miss, and counts it.
    pub async fn get(
        &self,
        digest: &[u8; 32],
    ) -> Result<Option<Box<dyn Basis + Send + Sync>>, Unavailable> {
        if let Some(held) = self.get_local(digest) {
            return Ok(Some(held));
        }
        let Some(shared) = &self.shared else {
            return Ok(None);
        };
        let Some(body) = shared.get(digest).await? else {
            return Ok(None);
        };
        let body: Arc<[u8]> = body.into();
        self.memory.insert(*digest, body.clone());
        Ok(Some(Box::new(body)))
    }

    /// The body whose blake3 is `digest`, if a local tier holds it.
    pub fn get_local(&self, digest: &[u8; 32]) -> Option<Box<dyn Basis + Send + Sync>> {
        if let Some(body) = self.memory.get(digest) {
            return Some(Box::new(body));
        }
        let file = self.disk.as_ref()?.get(digest)?;
        Some(Box::new(file))
    }

    /// Keeps `body` (a small body, coded whole) under its blake3 `digest`
    /// in the memory tier, evicting least recently used bodies to make
    /// room, and sends it to the shared store. Bodies over a tier's limit
    /// are not kept there.
    pub fn insert(&self, digest: [u8; 32], body: Arc<[u8]>) {
        // A body served again (a popular one) is sent once, not each time.
        if let Some(shared) = &self.shared
            && !self.memory.contains(&digest)
        {
            shared.put(digest, body.clone());
        }
        self.memory.insert(digest, body);
    }

    /// Starts collecting a body announced `expected` bytes long (if it
    /// was) as it streams: `None` when no tier would keep it, or their
    /// collecting budgets are spent.
    pub fn collect(self: &Arc<Self>, expected: Option<u64>) -> Option<Collecting> {
        self.collect_as(None, expected)
    }

    /// [`collect`](Self::collect) for a body `served_as` names: when the
    /// body kept under that name is still held, nothing is copied, and
    /// [`Collecting::keep`] only counts a use of it (if the digests agree).
    pub fn collect_as(
        self: &Arc<Self>,
        served_as: Option<ServedAs>,
        expected: Option<u64>,
    ) -> Option<Collecting> {
        let now = tokio::time::Instant::now();
        let held = served_as.as_ref().and_then(|served_as| {
            let served = self.served.lock().unwrap_or_else(|e| e.into_inner());
            served.get(served_as, now).copied()
        });
        if let Some(digest) = held
            && self.holds_locally(&digest)
        {
            return Some(Collecting {
                store: self.clone(),
                served_as,
                to: Destination::Held(digest),
            });
        }
        let to = match expected {
            Some(len) if len > self.memory_collect_limit() => {
                Destination::Disk(self.disk.as_ref()?.begin(expected)?)
            }
            _ => Destination::Memory {
                chunks: Vec::new(),
                len: 0,
                room: self.reserve(0)?,
            },
        };
        Some(Collecting {
            store: self.clone(),
            served_as,
            to,
        })
    }

    /// Whether a local tier holds `digest` (not a use).
    fn holds_locally(&self, digest: &[u8; 32]) -> bool {
        self.memory.contains(digest) || self.disk.as_ref().is_some_and(|disk| disk.contains(digest))
    }

    /// Remembers (or, with `None`, forgets) the digest kept for `served_as`.
    fn served(&self, served_as: ServedAs, digest: Option<[u8; 32]>) {
        let mut served = self.served.lock().unwrap_or_else(|e| e.into_inner());
        match digest {
            Some(digest) => {
                served.insert(served_as, digest, tokio::time::Instant::now());
            }
            None => {
                served.remove(&served_as);
            }
        }
    }

    /// Bytes held in memory.
    pub fn used(&self) -> usize {
        self.memory.used()
    }

    /// Bytes held on disk (0 without a disk tier).
    pub fn disk_used(&self) -> u64 {
        self.disk.as_ref().map_or(0, |disk| disk.used())
    }
}

/// A body on its way into the store, collected as it streams: in memory
/// (the origin's chunks as they came, copied once when the body is
/// complete) within its room in the collecting budget, or in a temp file
/// of the disk tier. Dropped before [`Collecting::keep`], it leaves
/// nothing behind.
pub struct Collecting {
    store: Arc<BasisStore>,
    /// What named the body, remembered with its digest once kept.
    served_as: Option<ServedAs>,
    to: Destination,
}

enum Destination {
    /// Held already under this digest, by what named it: not copied.
    Held([u8; 32]),
    Memory {
        chunks: Vec<Bytes>,
        len: usize,
        room: OwnedSemaphorePermit,
    },
    Disk(DiskWriter),
}

impl Collecting {
    /// Adds `chunk`; false when the body outgrew every tier's limit or
    /// their budgets are spent (drop it then: it is not kept). A body in
    /// memory that outgrows the memory tier moves to a temp file.
    pub fn add(&mut self, chunk: &Bytes) -> bool {
        let store = &self.store;
        match &mut self.to {
            Destination::Held(_) => true,
            Destination::Disk(writer) => writer.add(chunk),
            Destination::Memory { chunks, len, room } => {
                if (*len + chunk.len()) as u64 <= store.memory_collect_limit() {
                    let Some(more) = store.reserve(chunk.len()) else {
                        return false;
                    };
                    room.merge(more);
                    chunks.push(chunk.clone());
                    *len += chunk.len();
                    return true;
                }
                let Some(mut writer) = store.disk.as_ref().and_then(|disk| disk.begin(None)) else {
                    return false;
                };
                if !chunks.iter().chain([chunk]).all(|chunk| writer.add(chunk)) {
                    return false;
                }
                self.to = Destination::Disk(writer);
                true
            }
        }
    }

    /// Keeps the body under its blake3 `digest`, which the encoder
    /// computed over the very bytes added. Blocking (a disk tier's body is
    /// fsynced and renamed): call it on a blocking thread.
    pub fn keep(self, digest: [u8; 32]) {
        if let Some(served_as) = self.served_as {
            // Another body than the one held under its name: the pairing
            // is forgotten (and this body not kept).
            let other = matches!(self.to, Destination::Held(known) if known != digest);
            self.store.served(served_as, (!other).then_some(digest));
        }
        match self.to {
            Destination::Held(known) => {
                if known == digest {
                    // A use, for the least-recently-used order.
                    let _ = self.store.get_local(&digest);
                }
            }
            Destination::Memory { chunks, len, room } => {
                let mut body = Vec::with_capacity(len);
                for chunk in &chunks {
                    body.extend_from_slice(chunk);
                }
                let body: Arc<[u8]> = body.into();
                let store = &self.store;
                // Collected in memory for the shared store, and too large
                // for the memory tier: the disk tier keeps it.
                if len > store.memory.max_body()
                    && let Some(mut writer) = store.disk.as_ref().and_then(|disk| disk.begin(None))
                    && writer.add(&body)
                {
                    writer.commit(digest);
                }
                store.insert(digest, body);
                drop(room);
            }
            Destination::Disk(writer) => writer.commit(digest),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The ETag is copied out of the head: hyper's header values share
    /// the read buffer the head and the body's first bytes came in, which
    /// a pairing remembered for an hour (10,000 of them) would keep alive
    /// (the accelerator grew ~45 MiB a minute in scripts/soak-mixed.sh).
    #[test]
    fn what_a_body_was_served_as_keeps_nothing_of_the_head_s_buffer() {
        let read_buffer = Bytes::from(vec![b'x'; 400 << 10]);
        let mut response = HeaderMap::new();
        let tag = read_buffer.slice(..10);
        response.insert(header::ETAG, HeaderValue::from_maybe_shared(tag).unwrap());
        response.insert(header::CONTENT_LENGTH, HeaderValue::from_static("10"));
        let uri: Uri = "/page".parse().unwrap();
        let served = ServedAs::of(&uri, None, &response).expect("a strong tag and a length");
        drop(response);
        assert!(
            read_buffer.is_unique(),
            "the remembered tag shares the read buffer"
        );
        assert_eq!(&*served.etag, b"xxxxxxxxxx");
    }
    use http::header::HeaderName;

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
        let body: Arc<[u8]> = (0..len)
            .map(|i| byte.wrapping_add((i % 251) as u8))
            .collect::<Vec<u8>>()
            .into();
        (*blake3::hash(&body).as_bytes(), body)
    }

    /// The whole body held under `digest`, if any.
    fn held(store: &BasisStore, digest: &[u8; 32]) -> Option<Vec<u8>> {
        let basis = store.get_local(digest)?;
        let mut out = Vec::new();
        basis
            .append_range(0, basis.size() as usize, &mut out)
            .unwrap();
        Some(out)
    }

    #[test]
    fn keeps_bodies_within_budget_evicting_the_least_recently_used() {
        let store = BasisStore::new(300, 200);
        let (a, body_a) = body(1, 100);
        let (b, body_b) = body(2, 100);
        let (c, body_c) = body(3, 100);
        store.insert(a, body_a.clone());
        store.insert(b, body_b);
        assert_eq!(held(&store, &a).as_deref(), Some(&body_a[..]));
        store.insert(c, body_c.clone());
        assert_eq!(store.used(), 300);
        let (d, body_d) = body(4, 100);
        store.insert(d, body_d);
        // b was the least recently used.
        assert!(held(&store, &b).is_none());
        assert!(
            store.get_local(&a).is_some()
                && store.get_local(&c).is_some()
                && store.get_local(&d).is_some()
        );
        assert_eq!(store.used(), 300);
    }

    #[test]
    fn bodies_over_the_limit_are_not_kept_and_evict_nothing() {
        let store = BasisStore::new(300, 200);
        let (a, body_a) = body(1, 100);
        store.insert(a, body_a);
        let (big, body_big) = body(9, 201);
        store.insert(big, body_big);
        assert!(store.get_local(&big).is_none());
        assert!(store.get_local(&a).is_some());
        assert_eq!(store.used(), 100);
    }

    /// Bodies being collected share a quarter of the budget; what one
    /// gives back another may take.
    #[test]
    fn bodies_being_collected_share_a_quarter_of_the_budget_or_the_largest_body() {
        // Room for the largest body kept, when that is more than a quarter.
        let store = BasisStore::new(400, 200);
        assert!(store.reserve(200).is_some());
        assert!(store.reserve(201).is_none());
        let store = BasisStore::new(400, 50);
        let first = store.reserve(60).unwrap();
        let mut second = store.reserve(0).unwrap();
        second.merge(store.reserve(40).unwrap());
        assert!(store.reserve(1).is_none());
        drop(first);
        assert!(store.reserve(60).is_some());
        assert!(store.reserve(61).is_none());
    }

    /// A memory tier of 1000 bytes keeping bodies up to 100, over a disk
    /// tier in `dir` of `budget` bytes keeping bodies up to 2000.
    fn with_disk(dir: &std::path::Path, budget: u64) -> Result<Arc<BasisStore>, DiskError> {
        let tier = DiskTier {
            dir: dir.into(),
            budget,
            max_body: 2000,
        };
        Ok(Arc::new(BasisStore::new(1000, 100).with_disk(&tier)?))
    }

    /// Streams `body` into `store` in chunks of 64 bytes, its length
    /// announced or not, and keeps it.
    fn stream(store: &Arc<BasisStore>, body: &[u8], announced: bool) -> bool {
        let Some(mut collecting) = store.collect(announced.then_some(body.len() as u64)) else {
            return false;
        };
        for chunk in body.chunks(64) {
            if !collecting.add(&Bytes::copy_from_slice(chunk)) {
                return false;
            }
        }
        collecting.keep(*blake3::hash(body).as_bytes());
        true
    }

    /// The names in `dir` but the lock, sorted.
    fn names(dir: &std::path::Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|entry| entry.unwrap().file_name().into_string().unwrap())
            .filter(|name| name != "lock")
            .collect();
        names.sort();
        names
    }

    fn hex(digest: &[u8; 32]) -> String {
        blake3::Hash::from_bytes(*digest).to_hex().to_string()
    }

    #[test]
    fn large_bodies_go_to_disk_by_digest_evicting_the_least_recently_used() {
        let dir = tempfile::tempdir().unwrap();
        let store = with_disk(dir.path(), 3000).unwrap();
        assert_eq!(store.max_body(), 2000);
        let (a, body_a) = body(1, 1000);
        let (b, body_b) = body(2, 1000);
        let (c, body_c) = body(3, 1000);
        assert!(stream(&store, &body_a, true));
        assert!(stream(&store, &body_b, true));
        assert_eq!(held(&store, &a).as_deref(), Some(&body_a[..]));
        assert!(stream(&store, &body_c, true));
        assert_eq!((store.used(), store.disk_used()), (0, 3000));
        let (d, body_d) = body(4, 1000);
        assert!(stream(&store, &body_d, true));
        // b was the least recently used; its file is gone too.
        assert!(store.get_local(&b).is_none());
        let mut expected = vec![hex(&a), hex(&c), hex(&d)];
        expected.sort();
        assert_eq!(names(dir.path()), expected);
        assert_eq!(held(&store, &c).as_deref(), Some(&body_c[..]));
        // Over the disk tier's limit: not even collected.
        let (_, huge) = body(5, 2001);
        assert!(!stream(&store, &huge, true));
        assert!(!stream(&store, &huge, false));
        assert_eq!(names(dir.path()).len(), 3);
    }

    #[test]
    fn a_body_of_unknown_length_moves_to_disk_once_it_outgrows_memory() {
        let dir = tempfile::tempdir().unwrap();
        let store = with_disk(dir.path(), 3000).unwrap();
        let (small, body_small) = body(1, 100);
        let (large, body_large) = body(2, 1500);
        assert!(stream(&store, &body_small, false));
        assert!(stream(&store, &body_large, false));
        assert_eq!((store.used(), store.disk_used()), (100, 1500));
        assert_eq!(held(&store, &small).as_deref(), Some(&body_small[..]));
        assert_eq!(held(&store, &large).as_deref(), Some(&body_large[..]));
        assert_eq!(names(dir.path()), [hex(&large)]);
    }

    /// Collects `body` as served under `etag`, and keeps it; what the
    /// directory held while it streamed.
    fn serve_as(
        store: &Arc<BasisStore>,
        dir: &std::path::Path,
        etag: &str,
        body: &[u8],
    ) -> Vec<String> {
        let served_as = ServedAs {
            url: "example.org/big.bin".into(),
            etag: etag.as_bytes().into(),
            len: body.len() as u64,
        };
        let mut collecting = store
            .collect_as(Some(served_as), Some(body.len() as u64))
            .unwrap();
        assert!(collecting.add(&Bytes::copy_from_slice(body)));
        let streaming = names(dir);
        collecting.keep(*blake3::hash(body).as_bytes());
        streaming
    }

    #[test]
    fn a_body_held_under_the_name_it_is_served_as_is_not_copied_again() {
        let dir = tempfile::tempdir().unwrap();
        let store = with_disk(dir.path(), 3000).unwrap();
        let (v1, body_v1) = body(1, 1000);
        assert_eq!(serve_as(&store, dir.path(), "\"v1\"", &body_v1).len(), 1);
        assert_eq!(names(dir.path()), [hex(&v1)]);
        assert_eq!(
            serve_as(&store, dir.path(), "\"v1\"", &body_v1),
            [hex(&v1)],
            "served again: no temp file"
        );
        assert_eq!(held(&store, &v1).as_deref(), Some(&body_v1[..]));
        // Another tag is another body: copied as any.
        let (v2, body_v2) = body(2, 1000);
        assert_eq!(serve_as(&store, dir.path(), "\"v2\"", &body_v2).len(), 2);
        assert_eq!(held(&store, &v2).as_deref(), Some(&body_v2[..]));
        // An origin that changed the bytes under the tag: nothing kept
        // this time, and the pairing forgotten, so the next serve copies.
        let (v3, body_v3) = body(3, 1000);
        serve_as(&store, dir.path(), "\"v1\"", &body_v3);
        assert!(held(&store, &v3).is_none());
        assert_eq!(serve_as(&store, dir.path(), "\"v1\"", &body_v3).len(), 3);
        assert_eq!(held(&store, &v3).as_deref(), Some(&body_v3[..]));
    }

    #[test]
    fn only_a_strong_tag_and_a_length_name_a_body_before_its_bytes() {
        let uri: Uri = "/big.bin".parse().unwrap();
        let host = HeaderValue::from_static("example.org");
        let strong = map(&[("etag", "\"a\""), ("content-length", "10")]);
        let named = ServedAs::of(&uri, Some(&host), &strong).unwrap();
        assert_eq!(named.url, "example.org/big.bin");
        let weak = map(&[("etag", "W/\"a\""), ("content-length", "10")]);
        assert!(ServedAs::of(&uri, Some(&host), &weak).is_none());
        let unknown_length = map(&[("etag", "\"a\"")]);
        assert!(ServedAs::of(&uri, Some(&host), &unknown_length).is_none());
    }

    #[test]
    fn a_large_held_bodys_anchors_are_one_for_every_encoder() {
        let store = BasisStore::new(1 << 20, 1 << 20);
        let large = SHARED_ANCHORS_MIN_BODY;
        assert!(store.anchors_for(&[1; 32], large - 1).is_none(), "small");
        let first = store.anchors_for(&[1; 32], large).unwrap();
        let basis = vec![7u8; 1 << 12];
        first.get_or_build(&basis).unwrap();
        assert!(store.anchors_for(&[1; 32], large).unwrap().is_built());
        assert!(!store.anchors_for(&[2; 32], large).unwrap().is_built());
    }

    #[test]
    fn a_body_cut_short_leaves_no_file() {
        let dir = tempfile::tempdir().unwrap();
        let store = with_disk(dir.path(), 3000).unwrap();
        let (_, body_a) = body(1, 1000);
        let mut collecting = store.collect(Some(1000)).unwrap();
        assert!(collecting.add(&Bytes::copy_from_slice(&body_a[..500])));
        assert_eq!(names(dir.path()).len(), 1, "a temp file while it streams");
        drop(collecting);
        assert!(names(dir.path()).is_empty());
        assert_eq!(store.disk_used(), 0);
    }

    #[test]
    fn a_restart_finds_the_bodies_and_removes_what_a_crash_left() {
        let dir = tempfile::tempdir().unwrap();
        let (a, body_a) = body(1, 1000);
        let (b, body_b) = body(2, 1000);
        {
            let store = with_disk(dir.path(), 3000).unwrap();
            assert!(stream(&store, &body_a, true));
            assert!(stream(&store, &body_b, true));
        }
        // A body being written when the process died.
        std::fs::write(dir.path().join("0123456789abcdef.basis.tmp"), "partial").unwrap();
        std::fs::write(dir.path().join("README"), "not a body").unwrap();
        assert_eq!(names(dir.path()).len(), 4);
        // a used last: b goes first when the budget shrinks.
        let past = std::time::SystemTime::now() - std::time::Duration::from_secs(60);
        let file = std::fs::File::options()
            .write(true)
            .open(dir.path().join(hex(&b)))
            .unwrap();
        file.set_modified(past).unwrap();

        let store = with_disk(dir.path(), 3000).unwrap();
        let mut expected = vec![hex(&a), hex(&b), "README".to_owned()];
        expected.sort();
        assert_eq!(names(dir.path()), expected, "the temp file is gone");
        assert_eq!(held(&store, &a).as_deref(), Some(&body_a[..]));
        assert_eq!(held(&store, &b).as_deref(), Some(&body_b[..]));
        drop(store);

        std::fs::File::options()
            .write(true)
            .open(dir.path().join(hex(&b)))
            .unwrap()
            .set_modified(past)
            .unwrap();
        let store = with_disk(dir.path(), 1500).unwrap();
        assert!(store.get_local(&b).is_none(), "over the smaller budget");
        assert!(store.get_local(&a).is_some());
        assert_eq!(store.disk_used(), 1000);
    }

    #[test]
    fn a_body_whose_file_changed_length_is_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let store = with_disk(dir.path(), 3000).unwrap();
        let (a, body_a) = body(1, 1000);
        assert!(stream(&store, &body_a, true));
        std::fs::write(dir.path().join(hex(&a)), &body_a[..999]).unwrap();
        assert!(store.get_local(&a).is_none());
        assert_eq!(store.disk_used(), 0);
        assert!(names(dir.path()).is_empty());
    }

    #[test]
    fn a_directory_others_may_write_to_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let basis = dir.path().join("basis");
        drop(with_disk(&basis, 3000).unwrap());
        let mode = std::fs::metadata(&basis).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o700, "made private");
        std::fs::set_permissions(&basis, std::fs::Permissions::from_mode(0o777)).unwrap();
        assert!(with_disk(&basis, 3000).is_err());
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(dir.path(), &link).unwrap();
        assert!(with_disk(&link, 3000).is_err(), "a symlink");
    }

    #[test]
    fn one_store_per_directory() {
        let dir = tempfile::tempdir().unwrap();
        let _first = with_disk(dir.path(), 3000).unwrap();
        assert!(matches!(
            with_disk(dir.path(), 3000),
            Err(DiskError::Locked { .. })
        ));
    }
}
