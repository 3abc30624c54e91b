//! The disk side of the cache: crash-safe writes, the in-memory index and its
//! rebuild at start-up, the hard size budget and LRU eviction.
//!
//! # Store protocol (RELIABILITY B3)
//!
//! 1. [`CacheStore::begin`] creates the body's temp file in `<root>/tmp/` with
//!    `create_new` and a random name; [`EntryWriter::write_body`] reserves
//!    budget for the bytes, then writes them and feeds blake3.
//! 2. [`EntryWriter::commit`] fsyncs the body, writes and fsyncs the signature
//!    and the metadata (which holds both lengths and digests and the full
//!    key) as temp files too.
//! 3. Under the index lock it unlinks the metadata of an entry it replaces
//!    (so a crash in the next step leaves an orphan, never new body + old
//!    metadata), renames body and signature into place, then the metadata.
//! 4. It fsyncs the entry's directory. If that fails the entry is removed,
//!    not trusted (C-E2).
//!
//! An entry is valid only if its metadata parses, names the key its file
//! name is the hash of, and the body and signature lengths match. At
//! [`CacheStore::open`] everything else goes: temp files, orphaned bodies and
//! signatures are deleted, invalid entries quarantined.
//!
//! # Concurrency
//!
//! The index sits behind one `std::sync::Mutex`. Data writes, fsyncs and
//! hashing happen outside it; the few metadata operations that must be atomic
//! with the index (the three renames of a commit, opening an entry's three
//! files on a hit, unlinking evicted entries) happen under it, so a reader
//! never opens one version's body with another's metadata (C-W1). Open files
//! keep their inode when an entry is evicted or replaced (C-W4).
//!
//! # Budget
//!
//! Sizes are counted in 4 KiB blocks per file, close to what `du` reports.
//! Writers reserve blocks before writing them; a reservation evicts least
//! recently used entries when needed and fails when the entry cannot fit
//! (C-V1). Quarantined files stay counted until the next open (at most a
//! tenth of the budget; beyond that invalid entries are deleted). The
//! directories themselves (one per origin, plus `tmp/` and `quarantine/`)
//! are not counted.
//!
//! # On a hit
//!
//! [`CacheStore::get`] checks the metadata's key (C-P2), the body length and
//! the signature's length and blake3. It does not hash the body on every
//! hit (that would read every body twice); the metadata carries the body's
//! blake3 so the proxy can hash while streaming and abort on a mismatch, and
//! [`Entry::verify_body`] does the full check for callers that want it first.
//!
//! # A full disk (C-E1)
//!
//! A failed write drops the entry (temp files removed, reservation given
//! back) and the caller passes the response through. The store counts
//! file-system errors ([`CacheStore::write_errors`], in the proxy's
//! stats) and logs the disk filling up (ENOSPC, EDQUOT, EFBIG) as one
//! error line, and room coming back as one info line, each at most once a
//! minute, rather than once per response.
//!
//! # One process at a time (the lock)
//!
//! [`CacheStore::open`] locks `<root>/lock` ([`LOCK_FILE`]) with `flock`
//! before it cleans anything, and the store's handles hold it: a second
//! proxy on the same directory (by mistake, or `rproxy cache purge` while
//! one runs) gets [`CacheError::Locked`](super::CacheError::Locked)
//! instead of deleting the first one's temp files and evicting under its
//! index. `--inetd` processes share it ([`CacheStore::open_shared`]).
//!
//! # The file system
//!
//! Every operation that changes the disk, and opening files to read, goes
//! through [`Fs`] ([`StdFs`](super::StdFs) unless
//! [`CacheStore::open_with_fs`] is given another), one dynamic call per
//! file operation or 64 KiB write, so tests can fail any step or drop what
//! was not fsynced (C-K2, C-K3, C-E2).
//!
//! What it leaves out: persisting LRU order (after a restart entries are
//! ordered by their metadata's modification time), and any HTTP decisions.
//!
//! # Parts
//!
//! This file holds [`CacheStore`] and the queries that only read the
//! index; each other reason to change has its own file: `index` (entries,
//! LRU order, budget and eviction), `writer` (the store protocol above),
//! `hit` (opening and checking an entry), `quarantine`, `recovery` (open:
//! the start-up walk and rebuild), `listing` (the same walk, read-only,
//! for `rproxy cache ls`), `lock` (the directory's lock), `health` (the
//! full-disk count and log lines) and `files` (the file-system steps they
//! share, which the accelerator's basis store on disk writes with too).
//!
//! Main types: [`CacheStore`], [`EntryWriter`], [`Entry`], [`PurgeReport`],
//! [`Listing`].

pub(crate) mod files;
mod health;
mod hit;
mod index;
mod listing;
mod lock;
mod quarantine;
mod recovery;
mod writer;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tracing::{info, warn};

use super::basis::{CacheScope, select_basis};
use super::fs::Fs;
use super::key::CacheKey;
use super::meta::IndexEntry;
use files::{EntryPaths, fsync_dir};
use health::DiskHealth;
use index::State;
use lock::DirLock;

pub use hit::Entry;
pub use listing::{InvalidEntry, ListedEntry, Listing};
pub use lock::LOCK_FILE;
pub use writer::EntryWriter;

/// Name of the temp directory inside the root.
pub const TMP_DIR: &str = "tmp";

/// Name of the quarantine directory inside the root.
pub const QUARANTINE_DIR: &str = "quarantine";

/// Largest signature file read on a hit, in bytes.
pub const MAX_SIG_LEN: u64 = 256 * 1024 * 1024;

/// Quarantine keeps at most 1/this of the budget; beyond, invalid entries
/// are deleted.
pub const QUARANTINE_SHARE: u64 = 10;

/// Entries [`CacheStore::purge_prefix`] removes under one hold of the
/// index lock, so that requests wait for a batch, not a whole purge.
pub const PURGE_BATCH: usize = 256;

/// What [`CacheStore::purge_prefix`] removed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PurgeReport {
    /// Entries removed (each Vary'd variant counts as one).
    pub entries: u64,
    /// Bytes given back to the budget: the entries' three files, each in
    /// whole 4 KiB blocks, as [`CacheStore::used_bytes`] counts them.
    pub bytes: u64,
}

/// The on-disk cache: index, budget and files. Cheap to clone (shared).
#[derive(Clone)]
pub struct CacheStore {
    inner: Arc<Inner>,
    /// The directory's lock, held by the handles rather than by `Inner`,
    /// which writers share too: a writer outlives the last handle only on
    /// the way out, and tests that leak one to stand for a crash reopen
    /// the directory as a restarted process would.
    _lock: Arc<DirLock>,
}

struct Inner {
    fs: Arc<dyn Fs>,
    root: PathBuf,
    tmp: PathBuf,
    quarantine: PathBuf,
    budget: u64,
    state: Mutex<State>,
    disk: DiskHealth,
}

/// Names the store by its root; the index is too large to print.
impl std::fmt::Debug for CacheStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CacheStore")
            .field("root", &self.inner.root)
            .field("budget", &self.inner.budget)
            .finish_non_exhaustive()
    }
}

impl CacheStore {
    /// The index summary of `key`'s entry, without touching the disk or the
    /// LRU order.
    pub fn lookup(&self, key: &CacheKey) -> Option<IndexEntry> {
        let st = self.inner.lock();
        st.slots.get(&key.digest()).map(|s| s.entry.clone())
    }

    /// Marks `key`'s entry as just used (for example as a basis). Returns
    /// whether it exists.
    pub fn touch(&self, key: &CacheKey) -> bool {
        self.inner.lock().touch(&key.digest())
    }

    /// Removes `key`'s entry, durably: its directory is fsynced, so that an
    /// entry invalidated by an unsafe method or dropped for a bad digest
    /// does not come back after a power cut (eviction for space skips
    /// this: an evicted entry that comes back is still valid). Returns
    /// whether there was one.
    pub fn remove(&self, key: &CacheKey) -> bool {
        let hash = key.digest();
        {
            let mut st = self.inner.lock();
            if !st.slots.contains_key(&hash) {
                return false;
            }
            self.inner.evict_locked(&mut st, &hash);
        }
        let dir = EntryPaths::new(&self.inner.root, key).dir;
        if let Err(e) = fsync_dir(&*self.inner.fs, &dir) {
            warn!(dir = %dir.display(), error = %e, "cannot fsync after removing a cache entry; it may come back after a power cut");
        }
        true
    }

    /// Removes every entry whose URL starts with `url_prefix`, each of its
    /// Vary'd variants and partial entries included, and gives their bytes
    /// back to the budget; the directories are fsynced, as
    /// [`CacheStore::remove`] does, so purged entries do not come back
    /// after a power cut. The in-process purge of the admin listener.
    ///
    /// The prefix is compared with the stored URL, which is normalised
    /// ([`CacheKey`]: lower-case scheme and host, no default port), byte
    /// for byte: `http://e.com/img/` purges `http://e.com/img/a.png`, and
    /// an empty prefix purges everything (callers taking the prefix from
    /// an operator should ask for "all" in so many words).
    ///
    /// Safe while requests run: entries go in batches of [`PURGE_BATCH`]
    /// under the index lock, and a response being read from one keeps its
    /// open files (C-W4). A response being stored meanwhile is stored
    /// after the purge.
    pub fn purge_prefix(&self, url_prefix: &str) -> PurgeReport {
        let matching: Vec<(blake3::Hash, PathBuf)> = {
            let st = self.inner.lock();
            st.slots
                .iter()
                .filter(|(_, s)| s.entry.key.url().starts_with(url_prefix))
                .map(|(hash, s)| (*hash, EntryPaths::new(&self.inner.root, &s.entry.key).dir))
                .collect()
        };
        let mut report = PurgeReport::default();
        let mut dirs = BTreeSet::new();
        for batch in matching.chunks(PURGE_BATCH) {
            let mut st = self.inner.lock();
            for (hash, dir) in batch {
                // Gone since the scan (evicted, removed) is not counted;
                // replaced since is purged all the same.
                let Some(bytes) = st.slots.get(hash).map(|s| s.disk_bytes) else {
                    continue;
                };
                self.inner.evict_locked(&mut st, hash);
                report.entries += 1;
                report.bytes += bytes;
                dirs.insert(dir);
            }
        }
        for dir in dirs {
            if let Err(e) = fsync_dir(&*self.inner.fs, dir) {
                warn!(dir = %dir.display(), error = %e, "cannot fsync after purging cache entries; they may come back after a power cut");
            }
        }
        info!(
            prefix = url_prefix,
            entries = report.entries,
            bytes = report.bytes,
            "cache entries purged"
        );
        report
    }

    /// All entries with the same scheme and authority as `key`: the input of
    /// [`select_basis`].
    pub fn candidates(&self, key: &CacheKey) -> Vec<IndexEntry> {
        let st = self.inner.lock();
        st.by_origin
            .get(key.origin())
            .into_iter()
            .flatten()
            .filter_map(|h| st.slots.get(h))
            .map(|s| s.entry.clone())
            .collect()
    }

    /// The entries of `key`'s URL, whatever their Vary'd values.
    pub fn variants(&self, key: &CacheKey) -> Vec<IndexEntry> {
        let st = self.inner.lock();
        st.by_origin
            .get(key.origin())
            .into_iter()
            .flatten()
            .filter_map(|h| st.slots.get(h))
            .filter(|s| s.entry.key.url() == key.url())
            .map(|s| s.entry.clone())
            .collect()
    }

    /// Chooses the basis for `key` among the entries of its origin (see
    /// [`select_basis`]) without copying the others.
    /// Does not count as a use; [`CacheStore::touch`] the basis when it is
    /// sent.
    pub fn basis(&self, key: &CacheKey, scope: CacheScope) -> Option<IndexEntry> {
        let st = self.inner.lock();
        let same_origin = st
            .by_origin
            .get(key.origin())
            .into_iter()
            .flatten()
            .filter_map(|h| st.slots.get(h))
            .map(|s| &s.entry);
        select_basis(same_origin, key, scope).cloned()
    }

    /// Number of entries in the index.
    pub fn len(&self) -> usize {
        self.inner.lock().slots.len()
    }

    /// Whether the index is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes counted against the budget: committed entries, writers'
    /// reservations and quarantined files.
    pub fn used_bytes(&self) -> u64 {
        let st = self.inner.lock();
        st.committed + st.reserved
    }

    /// Entries evicted to make room since the store was opened.
    pub fn evictions(&self) -> u64 {
        self.inner.lock().evictions
    }

    /// The size budget in bytes.
    pub fn budget(&self) -> u64 {
        self.inner.budget
    }

    /// The cache root.
    pub fn root(&self) -> &Path {
        &self.inner.root
    }

    /// File-system errors met while storing since the store was opened
    /// (full disk or other; over-budget refusals are not errors). The
    /// counter is live: the proxy's stats hold it.
    pub fn write_errors(&self) -> Arc<AtomicU64> {
        Arc::clone(&self.inner.disk.write_errors)
    }

    /// Whether the last write failed for want of space.
    pub fn is_disk_full(&self) -> bool {
        self.inner.disk.full.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::CacheError;
    use crate::cache::meta::{Completeness, NewEntry};
    use index::BLOCK;

    fn assert_send_sync<T: Send + Sync + 'static>() {}

    #[test]
    fn store_and_writer_can_move_into_spawn_blocking() {
        assert_send_sync::<CacheStore>();
        fn assert_send<T: Send + 'static>() {}
        assert_send::<EntryWriter>();
        assert_send::<Entry>();
    }

    #[test]
    fn a_second_open_is_refused_until_the_last_clone_of_the_first_drops() {
        let dir = tempfile::tempdir().unwrap();
        let first = CacheStore::open(dir.path(), 1 << 20).unwrap();
        let clone = first.clone();
        drop(first);
        let Err(refused) = CacheStore::open(dir.path(), 1 << 20) else {
            panic!("a second open while a clone holds the lock");
        };
        let message = refused.to_string();
        assert!(matches!(refused, CacheError::Locked { .. }), "{message}");
        assert!(message.contains("another rproxy process"), "{message}");
        assert!(message.contains(&dir.path().join(LOCK_FILE).display().to_string()));
        assert!(CacheStore::open_shared(dir.path(), 1 << 20).is_err());
        drop(clone);
        let second = CacheStore::open(dir.path(), 1 << 20).unwrap();
        drop(second);
        let inetd = CacheStore::open_shared(dir.path(), 1 << 20).unwrap();
        let inetd_too = CacheStore::open_shared(dir.path(), 1 << 20).unwrap();
        assert!(CacheStore::open(dir.path(), 1 << 20).is_err());
        drop((inetd, inetd_too));
    }

    fn put(store: &CacheStore, key: &CacheKey, body: &[u8], completeness: Completeness) {
        let mut w = store.begin(key).unwrap();
        w.write_body(body).unwrap();
        let entry = NewEntry {
            status: 200,
            headers: Vec::new(),
            stored_at: 1,
            completeness,
            shareable_as_basis: true,
            complete_len: None,
        };
        w.commit(entry, b"sig").unwrap();
    }

    #[test]
    fn purge_prefix_removes_every_variant_under_the_prefix_and_gives_the_bytes_back() {
        use std::io::Read;
        let dir = tempfile::tempdir().unwrap();
        let store = CacheStore::open(dir.path(), 1 << 20).unwrap();
        let k = |url: &str| CacheKey::parse(url).unwrap();
        let gzip = k("http://e.com/img/a.png")
            .with_vary("accept-encoding", b"gzip")
            .unwrap();
        let purged = [
            k("http://e.com/img/a.png"),
            gzip,
            k("http://e.com/img/deep/b.png"),
        ];
        let kept = [
            k("http://e.com/imgx"),
            k("http://e.com/"),
            k("http://f.com/img/a.png"),
        ];
        for key in purged.iter().chain(&kept) {
            put(&store, key, &[7; 5000], Completeness::Complete);
        }
        let partial = k("http://e.com/img/c.bin");
        put(&store, &partial, b"prefix", Completeness::Partial);
        let mut open_body = store.get(&purged[0]).unwrap().body;
        let before = store.used_bytes();

        let report = store.purge_prefix("http://e.com/img/");
        assert_eq!(report.entries, 4);
        // Two blocks of body, one each of signature and metadata; one
        // block of body for the partial entry.
        assert_eq!(report.bytes, 3 * 4 * BLOCK + 3 * BLOCK);
        assert_eq!(store.used_bytes(), before - report.bytes);
        for key in purged.iter().chain([&partial]) {
            assert!(store.lookup(key).is_none(), "{key} still indexed");
            let stem = dir.path().join(key.entry_path());
            assert!(!stem.with_extension("meta").exists(), "{key} on disk");
            assert!(!stem.with_extension("body").exists(), "{key} on disk");
        }
        let mut read = Vec::new();
        open_body.read_to_end(&mut read).unwrap();
        assert_eq!(read, [7; 5000], "a body being served is read to its end");
        assert_eq!(
            store.purge_prefix("http://e.com/img/"),
            PurgeReport::default()
        );

        drop(store);
        let store = CacheStore::open(dir.path(), 1 << 20).unwrap();
        assert_eq!(store.len(), kept.len());
        for key in &kept {
            assert!(store.get(key).is_some(), "{key} lost");
        }
        assert_eq!(store.purge_prefix("").entries, 3);
        assert!(store.is_empty());
        assert_eq!(store.used_bytes(), 0);
    }

    #[test]
    fn basis_is_chosen_under_the_lock_and_counts_private_entries_by_scope() {
        let dir = tempfile::tempdir().unwrap();
        let store = CacheStore::open(dir.path(), 1 << 20).unwrap();
        let put = |url: &str, shareable: bool| {
            let key = CacheKey::parse(url).unwrap();
            let mut w = store.begin(&key).unwrap();
            w.write_body(url.as_bytes()).unwrap();
            let entry = NewEntry {
                status: 200,
                headers: Vec::new(),
                stored_at: 1,
                completeness: Completeness::Complete,
                shareable_as_basis: shareable,
                complete_len: None,
            };
            w.commit(entry, b"sig").unwrap();
        };
        put("http://e.com/me/inbox", false);
        put("http://e.com/news", true);
        let want = CacheKey::parse("http://e.com/me/outbox").unwrap();
        let shared = store.basis(&want, CacheScope::Shared).unwrap();
        assert_eq!(shared.key.url(), "http://e.com/news");
        let private = store.basis(&want, CacheScope::Private).unwrap();
        assert_eq!(private.key.url(), "http://e.com/me/inbox");
        let other = CacheKey::parse("http://x.com/me/inbox").unwrap();
        assert!(store.basis(&other, CacheScope::Private).is_none());
    }

    #[test]
    fn expected_length_longer_than_the_body_is_given_back_at_commit() {
        let dir = tempfile::tempdir().unwrap();
        let store = CacheStore::open(dir.path(), 1 << 20).unwrap();
        let key = CacheKey::parse("http://e.com/a").unwrap();
        let mut w = store.begin(&key).unwrap();
        w.expect_body_len(500_000).unwrap();
        assert!(store.used_bytes() >= 500_000);
        w.write_body(b"short").unwrap();
        let entry = NewEntry {
            status: 200,
            headers: Vec::new(),
            stored_at: 1,
            completeness: Completeness::Complete,
            shareable_as_basis: true,
            complete_len: None,
        };
        w.commit(entry, b"").unwrap();
        // body and metadata, one block each; an empty signature is no block.
        assert_eq!(store.used_bytes(), 2 * BLOCK);
    }
}
