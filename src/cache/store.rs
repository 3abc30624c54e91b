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
//! # The file system
//!
//! Every operation that changes the disk, and opening files to read, goes
//! through [`Fs`] ([`StdFs`] unless [`CacheStore::open_with_fs`] is given
//! another), one dynamic call per file operation or 64 KiB write, so tests
//! can fail any step or drop what was not fsynced (C-K2, C-K3, C-E2).
//!
//! What it leaves out: persisting LRU order (after a restart entries are
//! ordered by their metadata's modification time), and any HTTP decisions.
//!
//! Main types: [`CacheStore`], [`EntryWriter`], [`Entry`].

use std::collections::{BTreeMap, HashMap, HashSet};
use std::ffi::OsStr;
use std::fs::{self, File};
use std::io::{self, BufWriter, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant, SystemTime};

use tracing::{debug, error, info, warn};
use walkdir::WalkDir;

use super::CacheError;
use super::basis::{CacheScope, select_basis};
use super::fs::{Fs, FsWriter, StdFs};
use super::key::CacheKey;
use super::meta::{Completeness, EntryMeta, IndexEntry, MAX_META_LEN, NewEntry};
use super::outboard::OutboardBuilder;

/// Name of the temp directory inside the root.
pub const TMP_DIR: &str = "tmp";

/// Name of the quarantine directory inside the root.
pub const QUARANTINE_DIR: &str = "quarantine";

/// Largest signature file read on a hit, in bytes.
pub const MAX_SIG_LEN: u64 = 256 * 1024 * 1024;

/// Quarantine keeps at most 1/this of the budget; beyond, invalid entries
/// are deleted.
pub const QUARANTINE_SHARE: u64 = 10;

/// Accounting unit: every file counts as a whole number of these.
const BLOCK: u64 = 4096;

/// Capacity of the body writer's buffer.
const WRITE_BUFFER: usize = 64 * 1024;

/// Least time between two "cache disk full" (or "room again") log lines, so
/// a disk hovering at full does not log once per response.
const DISK_LOG_INTERVAL: Duration = Duration::from_secs(60);

/// Bytes a file of `len` bytes is counted as.
fn disk_bytes(len: u64) -> u64 {
    len.div_ceil(BLOCK) * BLOCK
}

/// The on-disk cache: index, budget and files. Cheap to clone (shared).
#[derive(Clone)]
pub struct CacheStore {
    inner: Arc<Inner>,
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

/// What the writes have said about the disk (C-E1): failed writes are
/// counted for the stats, and the operator reads one clear line when the
/// disk fills up and one when room comes back, not one per response.
#[derive(Default)]
struct DiskHealth {
    /// File-system errors while storing (shared with the proxy's stats).
    write_errors: Arc<AtomicU64>,
    /// The last write failed for want of space (ENOSPC, EDQUOT, EFBIG).
    full: AtomicBool,
    /// When each of the two lines was last logged.
    logged_full: Mutex<Option<Instant>>,
    logged_room: Mutex<Option<Instant>>,
}

impl DiskHealth {
    /// Notes the outcome of a write; only file-system errors count.
    fn note_error(&self, root: &Path, failure: &CacheError) {
        if !matches!(failure, CacheError::Io { .. }) {
            return;
        }
        self.write_errors.fetch_add(1, Ordering::Relaxed);
        if !failure.is_disk_full() {
            // The caller logs the failure with its context.
            return;
        }
        if !self.full.swap(true, Ordering::Relaxed) && due(&self.logged_full) {
            error!(
                cache = %root.display(),
                error = %failure,
                "cache disk full: responses pass through unstored until space is freed"
            );
        }
    }

    /// A write reached the disk: if it was full, it has room again.
    fn note_stored(&self, root: &Path) {
        if self.full.swap(false, Ordering::Relaxed) && due(&self.logged_room) {
            info!(cache = %root.display(), "cache disk has room again; storing entries");
        }
    }
}

/// Whether a rate-limited line is due now; if so, marks it logged.
fn due(last: &Mutex<Option<Instant>>) -> bool {
    let mut last = last.lock().unwrap_or_else(PoisonError::into_inner);
    let now = Instant::now();
    if last.is_some_and(|at| now.duration_since(at) < DISK_LOG_INTERVAL) {
        return false;
    }
    *last = Some(now);
    true
}

/// One cache hit: checked metadata, the open body and the signature bytes.
#[derive(Debug)]
pub struct Entry {
    /// The entry's metadata.
    pub meta: EntryMeta,
    /// The body, open at offset 0. It stays readable if the entry is evicted
    /// or replaced meanwhile.
    pub body: File,
    /// The signature the accelerator sent for the body.
    pub signature: Vec<u8>,
}

impl Entry {
    /// Hashes the whole body and compares it with the metadata's digest, then
    /// rewinds the body.
    ///
    /// # Errors
    ///
    /// I/O errors reading or seeking the body.
    pub fn verify_body(&mut self) -> io::Result<bool> {
        self.body.seek(SeekFrom::Start(0))?;
        let mut hasher = blake3::Hasher::new();
        let copied = io::copy(&mut self.body, &mut hasher)?;
        self.body.seek(SeekFrom::Start(0))?;
        Ok(copied == self.meta.body_len && self.meta.body_digest().ok() == Some(hasher.finalize()))
    }
}

/// Writes one entry: body bytes first, then [`EntryWriter::commit`] with the
/// metadata and signature. Dropping it uncommitted removes its temp files and
/// releases its reservation.
pub struct EntryWriter {
    store: Arc<Inner>,
    key: CacheKey,
    body_tmp: PathBuf,
    body: Option<BufWriter<FsWriter>>,
    /// The body's blake3 and its outboard, as written.
    outboard: OutboardBuilder,
    body_len: u64,
    /// Budget bytes this writer holds.
    reserved: u64,
    /// The part of `reserved` that covers the body.
    body_reserved: u64,
    /// Signature and metadata temp files created by `commit`.
    other_tmp: Vec<PathBuf>,
    failed: bool,
    committed: bool,
    /// Whether a complete entry for the key existed when writing began: a
    /// partial entry is refused then, even if the budget evicted it since.
    complete_at_begin: bool,
}

#[derive(Default)]
struct State {
    slots: HashMap<blake3::Hash, Slot>,
    /// Last-use tick → entry; the first is the least recently used.
    lru: BTreeMap<u64, blake3::Hash>,
    by_origin: HashMap<String, HashSet<blake3::Hash>>,
    tick: u64,
    /// Bytes of committed entries.
    committed: u64,
    /// Bytes reserved by writers plus quarantined bytes.
    reserved: u64,
    /// Bytes in quarantine/ (also part of `reserved`).
    quarantined: u64,
}

struct Slot {
    entry: IndexEntry,
    disk_bytes: u64,
    last_used: u64,
}

/// The three files of an entry and their directory.
struct EntryPaths {
    dir: PathBuf,
    body: PathBuf,
    sig: PathBuf,
    meta: PathBuf,
}

impl EntryPaths {
    fn new(root: &Path, key: &CacheKey) -> EntryPaths {
        let stem = root.join(key.entry_path());
        EntryPaths {
            dir: stem
                .parent()
                .expect("an entry path has a directory")
                .to_path_buf(),
            body: stem.with_extension("body"),
            sig: stem.with_extension("sig"),
            meta: stem.with_extension("meta"),
        }
    }
}

impl State {
    fn next_tick(&mut self) -> u64 {
        self.tick += 1;
        self.tick
    }

    fn insert(&mut self, hash: blake3::Hash, entry: IndexEntry, disk_bytes: u64) {
        let tick = self.next_tick();
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

    fn remove(&mut self, hash: &blake3::Hash) -> Option<Slot> {
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

    fn touch(&mut self, hash: &blake3::Hash) -> bool {
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

impl CacheStore {
    /// Opens (creating if needed) the cache at `root` with a budget of
    /// `budget_bytes`, cleans it up and rebuilds the index (C-R1, C-R2).
    ///
    /// The walk follows no symlinks and reads only regular files; unreadable
    /// paths are logged and skipped. Temp files and orphaned bodies and
    /// signatures are deleted, entries whose metadata does not parse or does
    /// not match their files are quarantined, and least recently modified
    /// entries are evicted if the cache is over budget. Files that are not
    /// entries (a README, say) are left alone.
    ///
    /// # Errors
    ///
    /// [`CacheError::Io`] when the root, `tmp/` or `quarantine/` cannot be
    /// created; [`CacheError::NotADirectory`] when one of them is something
    /// else.
    pub fn open(root: impl Into<PathBuf>, budget_bytes: u64) -> Result<CacheStore, CacheError> {
        CacheStore::open_with_fs(root, budget_bytes, Arc::new(StdFs))
    }

    /// [`CacheStore::open`] on the file system `fs`: a test's, which can
    /// fail operations or model a power cut. The root is created with
    /// `std::fs` if it is missing.
    ///
    /// # Errors
    ///
    /// As [`CacheStore::open`].
    pub fn open_with_fs(
        root: impl Into<PathBuf>,
        budget_bytes: u64,
        fs: Arc<dyn Fs>,
    ) -> Result<CacheStore, CacheError> {
        let started = Instant::now();
        let root = root.into();
        fs::create_dir_all(&root).map_err(CacheError::io(&root))?;
        let tmp = root.join(TMP_DIR);
        let quarantine = root.join(QUARANTINE_DIR);
        for dir in [&tmp, &quarantine] {
            ensure_dir(&*fs, dir)?;
            empty_dir(&*fs, dir);
        }
        let inner = Inner {
            fs,
            root,
            tmp,
            quarantine,
            budget: budget_bytes,
            state: Mutex::new(State::default()),
            disk: DiskHealth::default(),
        };
        let report = inner.rebuild();
        {
            let mut st = inner.lock();
            while st.committed + st.reserved > inner.budget {
                let Some((_, &hash)) = st.lru.iter().next() else {
                    break;
                };
                inner.evict_locked(&mut st, &hash);
            }
            info!(
                root = %inner.root.display(),
                entries = st.slots.len(),
                bytes = st.committed,
                budget = inner.budget,
                deleted = report.deleted,
                quarantined = report.quarantined,
                skipped = report.skipped,
                elapsed_ms = started.elapsed().as_millis() as u64,
                "cache index rebuilt"
            );
        }
        Ok(CacheStore {
            inner: Arc::new(inner),
        })
    }

    /// Starts writing an entry for `key`. Nothing is visible to readers until
    /// [`EntryWriter::commit`].
    ///
    /// # Errors
    ///
    /// [`CacheError::Io`] when the temp file cannot be created.
    pub fn begin(&self, key: &CacheKey) -> Result<EntryWriter, CacheError> {
        let (body_tmp, file) = create_temp(&*self.inner.fs, &self.inner.tmp, "body")
            .inspect_err(|e| self.inner.disk.note_error(&self.inner.root, e))?;
        let complete_at_begin = self
            .inner
            .lock()
            .slots
            .get(&key.digest())
            .is_some_and(is_complete);
        Ok(EntryWriter {
            complete_at_begin,
            store: Arc::clone(&self.inner),
            key: key.clone(),
            body: Some(BufWriter::with_capacity(
                WRITE_BUFFER,
                FsWriter::new(Arc::clone(&self.inner.fs), file, body_tmp.clone()),
            )),
            body_tmp,
            outboard: OutboardBuilder::new(),
            body_len: 0,
            reserved: 0,
            body_reserved: 0,
            other_tmp: Vec::new(),
            failed: false,
            committed: false,
        })
    }

    /// Looks `key` up and opens its files; counts as a use for LRU.
    ///
    /// Returns `None` on a miss, and also when the entry fails a check (its
    /// metadata names another key, the body or signature length or the
    /// signature digest differs, a file cannot be opened): such an entry is
    /// quarantined and logged (C-E3, C-P2). Partial entries are returned too;
    /// look at `meta.completeness` before serving one.
    pub fn get(&self, key: &CacheKey) -> Option<Entry> {
        let hash = key.digest();
        let paths = EntryPaths::new(&self.inner.root, key);
        let (seen, files) = {
            let mut st = self.inner.lock();
            let seen = st.slots.get(&hash)?.entry.body_blake3;
            st.touch(&hash);
            // Opened under the lock so that all three come from one commit.
            let fs = &*self.inner.fs;
            let files = (
                open_regular(fs, &paths.meta),
                open_regular(fs, &paths.body),
                open_regular(fs, &paths.sig),
            );
            (seen, files)
        };
        match load_entry(key, seen, files) {
            Ok(entry) => Some(entry),
            Err(reason) => {
                warn!(url = %key, %reason, "cache entry failed its check; quarantined");
                self.inner.quarantine_entry(key, seen);
                None
            }
        }
    }

    /// Moves `key`'s entry into quarantine/ because its body failed a check
    /// (a group of it did not match its outboard, say), if the index still
    /// holds the body whose blake3 is `body_blake3` (a newer one stays).
    /// The next request for the key is a miss and refetches (C-V3).
    pub fn quarantine(&self, key: &CacheKey, body_blake3: blake3::Hash) {
        warn!(url = %key, "cache entry failed its check; quarantined");
        self.inner.quarantine_entry(key, body_blake3);
    }

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

    /// Replaces the stored headers and time of an entry, as a 304 refreshes
    /// them (RFC 9111 §4.3.4), without rewriting its body. `meta` is the
    /// entry's metadata as read on the hit with `headers` and `stored_at`
    /// changed; it applies only if the index still holds that body (same
    /// digest), so a refresh never lands on a newer entry. Crash-safe like
    /// a commit: temp file, fsync, rename over the old metadata, fsync the
    /// directory. Returns whether the entry was updated.
    ///
    /// # Errors
    ///
    /// [`CacheError::Io`] when writing fails (the old metadata stays), and
    /// [`CacheError::OverBudget`] when the larger metadata does not fit.
    pub fn update_meta(&self, meta: &EntryMeta) -> Result<bool, CacheError> {
        let (Ok(key), Ok(body_digest)) = (meta.key(), meta.body_digest()) else {
            return Ok(false);
        };
        let hash = key.digest();
        let paths = EntryPaths::new(&self.inner.root, &key);
        let json = meta.to_json();
        let fs = &*self.inner.fs;
        let (tmp, mut file) = create_temp(fs, &self.inner.tmp, "meta")?;
        let written = fs
            .write_all(&mut file, &tmp, &json)
            .and_then(|()| fs.sync_file(&file, &tmp))
            .map_err(CacheError::io(&tmp));
        drop(file);
        let result = written.and_then(|()| {
            let mut st = self.inner.lock();
            let Some(slot) = st.slots.get_mut(&hash) else {
                return Ok(false);
            };
            if slot.entry.body_blake3 != body_digest || slot.entry.body_len != meta.body_len {
                return Ok(false);
            }
            let old_meta = fs::symlink_metadata(&paths.meta)
                .map(|m| disk_bytes(m.len()))
                .unwrap_or(0);
            let grow = disk_bytes(json.len() as u64).saturating_sub(old_meta);
            if grow > 0 && st.committed + st.reserved + grow > self.inner.budget {
                return Err(CacheError::OverBudget {
                    needed: grow,
                    budget: self.inner.budget,
                });
            }
            fs.rename(&tmp, &paths.meta)
                .map_err(CacheError::io(&paths.meta))?;
            let st = &mut *st;
            let slot = st.slots.get_mut(&hash).expect("checked above");
            let new_bytes =
                slot.disk_bytes - old_meta.min(slot.disk_bytes) + disk_bytes(json.len() as u64);
            st.committed = st.committed - slot.disk_bytes + new_bytes;
            slot.disk_bytes = new_bytes;
            slot.entry.stored_at = meta.stored_at;
            Ok(true)
        });
        let _ = remove_if_exists(fs, &tmp);
        let result = match result {
            Ok(true) => fsync_dir(fs, &paths.dir).map(|()| true),
            other => other,
        };
        match &result {
            Ok(true) => self.inner.disk.note_stored(&self.inner.root),
            Ok(false) => {}
            Err(e) => self.inner.disk.note_error(&self.inner.root, e),
        }
        result
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

impl EntryWriter {
    /// Appends body bytes, reserving budget for them first.
    ///
    /// # Errors
    ///
    /// [`CacheError::OverBudget`] when the entry cannot fit,
    /// [`CacheError::Io`] when the write fails, and
    /// [`CacheError::WriterFailed`] after either: drop the writer then.
    pub fn write_body(&mut self, data: &[u8]) -> Result<(), CacheError> {
        if self.failed {
            return Err(self.failed_error());
        }
        let result = self.try_write_body(data);
        if let Err(e) = &result {
            self.failed = true;
            self.store.disk.note_error(&self.store.root, e);
        }
        result
    }

    fn try_write_body(&mut self, data: &[u8]) -> Result<(), CacheError> {
        let new_len = self.body_len + data.len() as u64;
        let need = disk_bytes(new_len).saturating_sub(self.body_reserved);
        self.reserve(need)?;
        self.body_reserved += need;
        let body = self.body.as_mut().expect("body is open until commit");
        body.write_all(data)
            .map_err(CacheError::io(&self.body_tmp))?;
        self.outboard.update(data);
        self.body_len = new_len;
        Ok(())
    }

    /// Reserves budget for a body of `len` bytes now (from the origin's
    /// `Content-Length`, say), so an entry that cannot fit fails before it
    /// evicts anything. Without it, space is reserved as bytes arrive, and a
    /// body that turns out too large may already have evicted entries.
    ///
    /// # Errors
    ///
    /// [`CacheError::OverBudget`] when the body cannot fit; the writer is
    /// failed then.
    pub fn expect_body_len(&mut self, len: u64) -> Result<(), CacheError> {
        if self.failed {
            return Err(self.failed_error());
        }
        let need = disk_bytes(len).saturating_sub(self.body_reserved);
        let result = self.reserve(need);
        self.failed = result.is_err();
        self.body_reserved += if result.is_ok() { need } else { 0 };
        result
    }

    /// Body bytes written so far.
    pub fn body_len(&self) -> u64 {
        self.body_len
    }

    /// Makes the entry visible: writes the signature and the metadata (with
    /// the lengths, digests and key the writer knows), fsyncs, renames into
    /// place and fsyncs the directory. Replaces an existing entry for the
    /// key; among concurrent writers of one key the last rename wins.
    ///
    /// # Errors
    ///
    /// [`CacheError::CompleteEntryExists`] for a partial entry when a
    /// complete one is stored; [`CacheError::OverBudget`]; [`CacheError::Io`]
    /// for any file-system failure, in which case nothing new is visible
    /// (or, when only the final directory fsync failed, the entry has been
    /// removed again).
    pub fn commit(self, entry: NewEntry, signature: &[u8]) -> Result<(), CacheError> {
        self.commit_noted(entry, signature, None)
    }

    /// [`EntryWriter::commit`], checking that the written body's blake3 is
    /// `digest` (the hsync decoder's, checked against END): what was
    /// written is what was checked.
    ///
    /// # Errors
    ///
    /// As `commit`; [`CacheError::DigestMismatch`] when the written body
    /// has another digest.
    pub fn commit_with_digest(
        self,
        entry: NewEntry,
        signature: &[u8],
        digest: blake3::Hash,
    ) -> Result<(), CacheError> {
        self.commit_noted(entry, signature, Some(digest))
    }

    /// `commit_inner`, with its outcome noted in the disk's health.
    fn commit_noted(
        self,
        entry: NewEntry,
        signature: &[u8],
        expected: Option<blake3::Hash>,
    ) -> Result<(), CacheError> {
        let store = Arc::clone(&self.store);
        let result = self.commit_inner(entry, signature, expected);
        match &result {
            Ok(()) => store.disk.note_stored(&store.root),
            Err(e) => store.disk.note_error(&store.root, e),
        }
        result
    }

    fn commit_inner(
        mut self,
        entry: NewEntry,
        signature: &[u8],
        expected: Option<blake3::Hash>,
    ) -> Result<(), CacheError> {
        let (body_digest, outboard) = std::mem::take(&mut self.outboard).finish();
        if expected.is_some_and(|digest| digest != body_digest) {
            return Err(CacheError::DigestMismatch {
                url: self.key.url().to_owned(),
            });
        }
        if self.failed {
            return Err(self.failed_error());
        }
        let partial = entry.completeness == Completeness::Partial;
        let hash = self.key.digest();
        if partial && (self.complete_at_begin || self.complete_entry_exists(&hash)) {
            return Err(self.complete_exists_error());
        }

        let body = self.body.take().expect("body is open until commit");
        let file = body
            .into_inner()
            .map_err(|e| CacheError::io(&self.body_tmp)(e.into_error()))?;
        file.sync().map_err(CacheError::io(&self.body_tmp))?;

        let meta = EntryMeta::new(&self.key, entry, self.body_len, body_digest, signature)
            .with_outboard(&outboard);
        let json = meta.to_json();
        self.reserve(disk_bytes(signature.len() as u64) + disk_bytes(json.len() as u64))?;
        let sig_tmp = self.write_temp("sig", signature)?;
        let meta_tmp = self.write_temp("meta", &json)?;

        let inner = Arc::clone(&self.store);
        let paths = EntryPaths::new(&inner.root, &self.key);
        let fs = &*inner.fs;
        if ensure_dir(fs, &paths.dir)? {
            fsync_dir(fs, &inner.root)?;
        }
        {
            let mut st = inner.lock();
            if partial && st.slots.get(&hash).is_some_and(is_complete) {
                return Err(self.complete_exists_error());
            }
            if st.slots.contains_key(&hash) {
                // Without the old metadata a crash during the renames leaves
                // an orphan, never the new body under the old metadata.
                remove_if_exists(fs, &paths.meta).map_err(CacheError::io(&paths.meta))?;
                if let Some(old) = st.remove(&hash) {
                    debug!(url = %self.key, bytes = old.disk_bytes, "replacing cache entry");
                }
            }
            let renamed = rename_all(
                fs,
                &[
                    (&self.body_tmp, &paths.body),
                    (&sig_tmp, &paths.sig),
                    (&meta_tmp, &paths.meta),
                ],
            );
            if let Err(e) = renamed {
                for p in [&paths.meta, &paths.body, &paths.sig] {
                    let _ = remove_if_exists(fs, p);
                }
                return Err(e);
            }
            let index_entry =
                IndexEntry::from_meta(&meta).expect("metadata built from a valid key is valid");
            // A body shorter than `expect_body_len` said gives back the rest.
            let actual = disk_bytes(meta.body_len)
                + disk_bytes(meta.sig_len)
                + disk_bytes(json.len() as u64);
            debug_assert!(actual <= self.reserved);
            st.reserved -= self.reserved;
            st.insert(hash, index_entry, actual.min(self.reserved));
            self.reserved = 0;
            self.committed = true;
        }
        if let Err(e) = fsync_dir(fs, &paths.dir) {
            // fsyncgate: after a failed fsync the entry's durability is
            // unknown, so it is dropped rather than trusted (C-E2).
            let mut st = inner.lock();
            if st.slots.get(&hash).map(|s| s.entry.body_blake3) == meta.body_digest().ok() {
                inner.evict_locked(&mut st, &hash);
            }
            return Err(e);
        }
        // After the directory fsync: what this line names survives a crash
        // (C-K1 checks it).
        debug!(
            url = %self.key,
            body_len = meta.body_len,
            sig_len = meta.sig_len,
            body_blake3 = %body_digest.to_hex(),
            "cache entry committed"
        );
        Ok(())
    }

    /// Discards the entry: removes the temp files and releases the budget.
    pub fn abort(self) {
        drop(self);
    }

    fn reserve(&mut self, bytes: u64) -> Result<(), CacheError> {
        self.store
            .reserve(bytes, self.reserved, &self.key.digest())?;
        self.reserved += bytes;
        Ok(())
    }

    fn write_temp(&mut self, kind: &str, data: &[u8]) -> Result<PathBuf, CacheError> {
        let fs = &*self.store.fs;
        let (path, mut file) = create_temp(fs, &self.store.tmp, kind)?;
        self.other_tmp.push(path.clone());
        fs.write_all(&mut file, &path, data)
            .map_err(CacheError::io(&path))?;
        fs.sync_file(&file, &path).map_err(CacheError::io(&path))?;
        Ok(path)
    }

    fn complete_entry_exists(&self, hash: &blake3::Hash) -> bool {
        self.store.lock().slots.get(hash).is_some_and(is_complete)
    }

    fn complete_exists_error(&self) -> CacheError {
        CacheError::CompleteEntryExists {
            url: self.key.to_string(),
        }
    }

    fn failed_error(&self) -> CacheError {
        CacheError::WriterFailed {
            url: self.key.to_string(),
        }
    }
}

impl Drop for EntryWriter {
    fn drop(&mut self) {
        if self.committed {
            return;
        }
        drop(self.body.take());
        for path in std::iter::once(&self.body_tmp).chain(&self.other_tmp) {
            if let Err(e) = remove_if_exists(&*self.store.fs, path) {
                warn!(path = %path.display(), error = %e, "cannot remove cache temp file");
            }
        }
        if self.reserved > 0 {
            self.store.lock().reserved -= self.reserved;
        }
    }
}

fn is_complete(slot: &Slot) -> bool {
    slot.entry.completeness == Completeness::Complete
}

/// What start-up cleaning did, for the log line.
#[derive(Default)]
struct RebuildReport {
    deleted: u64,
    quarantined: u64,
    skipped: u64,
}

/// Files found for one entry stem during the walk: path, length, mtime.
#[derive(Default)]
struct Found {
    body: Option<(PathBuf, u64)>,
    sig: Option<(PathBuf, u64)>,
    meta: Option<(PathBuf, u64, SystemTime)>,
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves at worst a stale index entry,
        // which a failed check on the next hit quarantines.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Reserves `bytes` on top of the `held` bytes the caller already has,
    /// evicting least recently used entries as needed; the writer's own
    /// key (`own`) goes last, since a partial write must not displace it.
    fn reserve(&self, bytes: u64, held: u64, own: &blake3::Hash) -> Result<(), CacheError> {
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
        }
        st.reserved += bytes;
        Ok(())
    }

    /// Drops an entry from the index and unlinks its files, metadata first.
    fn evict_locked(&self, st: &mut State, hash: &blake3::Hash) {
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

    /// Moves `key`'s files to quarantine if the index still holds the entry
    /// that was checked (`seen` is its body digest).
    fn quarantine_entry(&self, key: &CacheKey, seen: blake3::Hash) {
        let hash = key.digest();
        let mut st = self.lock();
        if st.slots.get(&hash).map(|s| s.entry.body_blake3) != Some(seen) {
            return;
        }
        let Some(slot) = st.remove(&hash) else {
            return;
        };
        let paths = EntryPaths::new(&self.root, key);
        self.quarantine_files(
            &mut st,
            &[&paths.meta, &paths.body, &paths.sig],
            slot.disk_bytes,
        );
    }

    /// Renames files (together `bytes` on disk) into quarantine/, where they
    /// stay counted against the budget until the next open empties it. Once
    /// quarantine holds [`QUARANTINE_SHARE`] of the budget, or when a rename
    /// fails, files are deleted instead, so corruption cannot eat the cache.
    /// A file that does not exist is skipped.
    fn quarantine_files(&self, st: &mut State, files: &[&Path], bytes: u64) {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        if st.quarantined + bytes > self.budget / QUARANTINE_SHARE {
            for &path in files {
                if let Err(e) = remove_if_exists(&*self.fs, path) {
                    warn!(path = %path.display(), error = %e, "cannot delete invalid cache file");
                }
            }
            return;
        }
        st.quarantined += bytes;
        st.reserved += bytes;
        for &path in files {
            let Some(name) = path.file_name() else {
                continue;
            };
            let n = COUNTER.fetch_add(1, Ordering::Relaxed);
            let mut target = self.quarantine.join(format!("{n}-"));
            target.as_mut_os_string().push(name);
            match self.fs.rename(path, &target) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => {
                    warn!(path = %path.display(), error = %e, "cannot quarantine; deleting");
                    let _ = remove_if_exists(&*self.fs, path);
                }
            }
        }
    }

    /// Walks the root and fills the index (see [`CacheStore::open`]).
    fn rebuild(&self) -> RebuildReport {
        let mut report = RebuildReport::default();
        let found = self.walk(&mut report);
        let mut valid = Vec::new();
        for (stem, files) in found {
            let Some((meta_path, meta_len, mtime)) = &files.meta else {
                // Orphans: a crash between the renames, or before the meta.
                for (p, _) in files.body.iter().chain(&files.sig) {
                    match remove_if_exists(&*self.fs, p) {
                        Ok(()) => report.deleted += 1,
                        Err(e) => warn!(path = %p.display(), error = %e, "cannot delete orphan"),
                    }
                }
                continue;
            };
            let all: Vec<&Path> = std::iter::once(meta_path.as_path())
                .chain(files.body.iter().map(|(p, _)| p.as_path()))
                .chain(files.sig.iter().map(|(p, _)| p.as_path()))
                .collect();
            match check_found(&*self.fs, &stem, &files) {
                Ok(meta) => {
                    let bytes = disk_bytes(meta.body_len)
                        + disk_bytes(meta.sig_len)
                        + disk_bytes(*meta_len);
                    valid.push((*mtime, meta, bytes));
                }
                Err(Check::Unreadable(e)) => {
                    warn!(path = %meta_path.display(), error = %e, "skipping unreadable cache entry");
                    report.skipped += 1;
                }
                Err(Check::Invalid(reason)) => {
                    warn!(path = %meta_path.display(), %reason, "invalid cache entry; quarantined");
                    let bytes = files
                        .body
                        .iter()
                        .chain(&files.sig)
                        .map(|(_, l)| disk_bytes(*l))
                        .sum::<u64>()
                        + disk_bytes(*meta_len);
                    self.quarantine_files(&mut self.lock(), &all, bytes);
                    report.quarantined += 1;
                }
            }
        }

        // Oldest metadata first, so it is the first to be evicted.
        valid.sort_by_key(|(mtime, meta, _)| (*mtime, meta.stored_at));
        let mut st = self.lock();
        for (_, meta, bytes) in valid {
            let entry = IndexEntry::from_meta(&meta).expect("checked metadata is valid");
            st.insert(entry.key.digest(), entry, bytes);
        }
        report
    }

    /// Lists the regular files named like entry files, grouped by entry
    /// (`<dir>/<hash>`), with lstat lengths. Follows no symlinks; skips and
    /// logs what it cannot read and what is not a regular file.
    fn walk(&self, report: &mut RebuildReport) -> HashMap<PathBuf, Found> {
        let mut found: HashMap<PathBuf, Found> = HashMap::new();
        let walk = WalkDir::new(&self.root)
            .min_depth(1)
            .max_depth(2)
            .follow_links(false)
            .into_iter()
            .filter_entry(|e| {
                !(e.depth() == 1 && (e.file_name() == TMP_DIR || e.file_name() == QUARANTINE_DIR))
            });
        for item in walk {
            let dirent = match item {
                Ok(d) => d,
                Err(e) => {
                    let path = e.path().map(|p| p.display().to_string());
                    warn!(?path, error = %e, "skipping unreadable cache path");
                    report.skipped += 1;
                    continue;
                }
            };
            if dirent.depth() == 1 {
                continue; // authority directories, or foreign files at the top
            }
            let Some((stem, ext)) = split_entry_name(dirent.file_name()) else {
                debug!(path = %dirent.path().display(), "ignoring foreign file in cache");
                continue;
            };
            if !dirent.file_type().is_file() {
                warn!(path = %dirent.path().display(), "skipping non-regular file in cache");
                report.skipped += 1;
                continue;
            }
            let md = match dirent.metadata() {
                Ok(md) => md,
                Err(e) => {
                    warn!(path = %dirent.path().display(), error = %e, "cannot stat cache file");
                    report.skipped += 1;
                    continue;
                }
            };
            let parent = dirent.path().parent().unwrap_or(&self.root);
            let slot = found.entry(parent.join(stem)).or_default();
            let path = dirent.path().to_path_buf();
            match ext {
                "body" => slot.body = Some((path, md.len())),
                "sig" => slot.sig = Some((path, md.len())),
                _ => {
                    let mtime = md.modified().unwrap_or(SystemTime::UNIX_EPOCH);
                    slot.meta = Some((path, md.len(), mtime));
                }
            }
        }

        found
    }
}

/// Why a found entry was not indexed.
enum Check {
    /// Reading failed in a way worth retrying later (permissions): skip.
    Unreadable(io::Error),
    /// The entry is garbage: quarantine.
    Invalid(String),
}

/// Reads and checks the metadata of an entry found by the walk, against its
/// file name, directory and the other files' lengths.
fn check_found(fs: &dyn Fs, stem: &Path, files: &Found) -> Result<EntryMeta, Check> {
    let (meta_path, _, _) = files.meta.as_ref().expect("caller checked");
    let bytes = match open_regular(fs, meta_path).and_then(|f| read_bounded(f, MAX_META_LEN)) {
        Ok(b) => b,
        Err(e) if e.kind() == io::ErrorKind::PermissionDenied => return Err(Check::Unreadable(e)),
        Err(e) => return Err(Check::Invalid(format!("cannot read metadata: {e}"))),
    };
    let meta = EntryMeta::from_json(&bytes).map_err(|e| Check::Invalid(e.to_string()))?;
    let key = meta.key().map_err(|e| Check::Invalid(e.to_string()))?;
    let expected_stem = key.entry_path();
    if !stem.ends_with(&expected_stem) {
        return Err(Check::Invalid(format!(
            "metadata names {key}, which lives at {}",
            expected_stem.display()
        )));
    }
    match files.body {
        Some((_, len)) if len == meta.body_len => {}
        Some((_, len)) => {
            return Err(Check::Invalid(format!(
                "body is {len} bytes, metadata says {}",
                meta.body_len
            )));
        }
        None => return Err(Check::Invalid("body is missing".into())),
    }
    if !empty_body_digest_matches(&meta) {
        return Err(Check::Invalid(
            "empty body with the digest of another".into(),
        ));
    }
    match files.sig {
        Some((_, len)) if len == meta.sig_len && len <= MAX_SIG_LEN => {}
        Some((_, len)) => {
            return Err(Check::Invalid(format!(
                "signature is {len} bytes, metadata says {}",
                meta.sig_len
            )));
        }
        None => return Err(Check::Invalid("signature is missing".into())),
    }
    Ok(meta)
}

/// Reads and checks a hit's files, opened under the lock.
fn load_entry(
    key: &CacheKey,
    seen: blake3::Hash,
    (meta, body, sig): (io::Result<File>, io::Result<File>, io::Result<File>),
) -> Result<Entry, String> {
    let bytes = meta
        .and_then(|f| read_bounded(f, MAX_META_LEN))
        .map_err(|e| format!("metadata: {e}"))?;
    let meta = EntryMeta::from_json(&bytes).map_err(|e| e.to_string())?;
    // C-P2: the file name is a hash; the metadata must name this very key.
    if meta.url != key.url() || meta.vary.as_slice() != key.vary() {
        return Err(format!("metadata names another key, {}", meta.url));
    }
    if meta.body_digest().ok() != Some(seen) {
        return Err("metadata changed on disk".into());
    }
    let body = body.map_err(|e| format!("body: {e}"))?;
    let body_len = body.metadata().map_err(|e| format!("body: {e}"))?.len();
    if body_len != meta.body_len {
        return Err(format!(
            "body is {body_len} bytes, metadata says {}",
            meta.body_len
        ));
    }
    if !empty_body_digest_matches(&meta) {
        return Err("empty body with the digest of another".into());
    }
    let sig = sig.map_err(|e| format!("signature: {e}"))?;
    let signature =
        read_bounded(sig, meta.sig_len.min(MAX_SIG_LEN)).map_err(|e| format!("signature: {e}"))?;
    if signature.len() as u64 != meta.sig_len
        || meta.sig_digest().ok() != Some(blake3::hash(&signature))
    {
        return Err("signature does not match its digest".into());
    }
    Ok(Entry {
        meta,
        body,
        signature,
    })
}

/// An empty body's digest is known, so it is checked for free: a 0-byte
/// body under metadata that promises content is caught (C-R2).
fn empty_body_digest_matches(meta: &EntryMeta) -> bool {
    meta.body_len != 0 || meta.body_digest().ok() == Some(blake3::hash(b""))
}

/// Splits `<64 hex>.<body|sig|meta>` into stem and extension.
fn split_entry_name(name: &OsStr) -> Option<(&str, &str)> {
    let (stem, ext) = name.to_str()?.split_once('.')?;
    let is_hash = stem.len() == 64 && stem.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
    (is_hash && matches!(ext, "body" | "sig" | "meta")).then_some((stem, ext))
}

/// Opens a regular file for reading without following a final symlink and
/// without blocking on a FIFO (C-R2).
fn open_regular(fs: &dyn Fs, path: &Path) -> io::Result<File> {
    let file = fs.open_read(path)?;
    if !file.metadata()?.is_file() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "not a regular file",
        ));
    }
    Ok(file)
}

/// Reads a whole file of at most `max` bytes.
fn read_bounded(file: File, max: u64) -> io::Result<Vec<u8>> {
    let mut buf = Vec::new();
    file.take(max + 1).read_to_end(&mut buf)?;
    if buf.len() as u64 > max {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("longer than {max} bytes"),
        ));
    }
    Ok(buf)
}

/// Creates a fresh temp file (`create_new`, random name, mode 0600).
fn create_temp(fs: &dyn Fs, dir: &Path, kind: &str) -> Result<(PathBuf, File), CacheError> {
    use std::hash::{BuildHasher, Hasher};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    for _ in 0..16 {
        // RandomState is seeded from the OS once per thread and then varied,
        // which is random enough for names that create_new double-checks.
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
        h.write_u32(std::process::id());
        let path = dir.join(format!("{:016x}.{kind}.tmp", h.finish()));
        match fs.create_new(&path) {
            Ok(file) => return Ok((path, file)),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(CacheError::io(path)(e)),
        }
    }
    Err(CacheError::io(dir)(io::Error::new(
        io::ErrorKind::AlreadyExists,
        "no free temp file name",
    )))
}

/// Makes sure `dir` is a real directory (not a symlink), creating it if
/// needed. Returns whether it was created.
fn ensure_dir(fs: &dyn Fs, dir: &Path) -> Result<bool, CacheError> {
    match fs::symlink_metadata(dir) {
        Ok(md) if md.is_dir() => Ok(false),
        Ok(_) => Err(CacheError::NotADirectory { path: dir.into() }),
        Err(e) if e.kind() == io::ErrorKind::NotFound => match fs.create_dir(dir) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => ensure_dir(fs, dir),
            Err(e) => Err(CacheError::io(dir)(e)),
        },
        Err(e) => Err(CacheError::io(dir)(e)),
    }
}

/// Deletes everything inside `dir` (not following symlinks), logging
/// failures.
fn empty_dir(fs: &dyn Fs, dir: &Path) {
    let entries = match fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) => {
            warn!(dir = %dir.display(), error = %e, "cannot list cache directory");
            return;
        }
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let result = match entry.file_type() {
            Ok(t) if t.is_dir() => fs.remove_dir_all(&path),
            _ => fs.remove_file(&path),
        };
        if let Err(e) = result {
            warn!(path = %path.display(), error = %e, "cannot delete stale cache file");
        }
    }
}

fn rename_all(fs: &dyn Fs, pairs: &[(&PathBuf, &PathBuf)]) -> Result<(), CacheError> {
    for (from, to) in pairs {
        fs.rename(from, to).map_err(CacheError::io(*to))?;
    }
    Ok(())
}

fn remove_if_exists(fs: &dyn Fs, path: &Path) -> io::Result<()> {
    match fs.remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

fn fsync_dir(fs: &dyn Fs, dir: &Path) -> Result<(), CacheError> {
    fs.sync_dir(dir).map_err(CacheError::io(dir))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assert_send_sync<T: Send + Sync + 'static>() {}

    #[test]
    fn store_and_writer_can_move_into_spawn_blocking() {
        assert_send_sync::<CacheStore>();
        fn assert_send<T: Send + 'static>() {}
        assert_send::<EntryWriter>();
        assert_send::<Entry>();
    }

    #[test]
    fn disk_bytes_counts_whole_blocks() {
        assert_eq!(disk_bytes(0), 0);
        assert_eq!(disk_bytes(1), 4096);
        assert_eq!(disk_bytes(4096), 4096);
        assert_eq!(disk_bytes(4097), 8192);
    }

    #[test]
    fn entry_names_are_hash_and_known_extension_only() {
        let hex = "ab".repeat(32);
        for (name, ok) in [
            (format!("{hex}.body"), true),
            (format!("{hex}.sig"), true),
            (format!("{hex}.meta"), true),
            (format!("{hex}.tmp"), false),
            (format!("{hex}.body.tmp"), false),
            (format!("{}.body", "AB".repeat(32)), false),
            ("README".to_string(), false),
            (format!("{}.body", &hex[1..]), false),
        ] {
            assert_eq!(split_entry_name(OsStr::new(&name)).is_some(), ok, "{name}");
        }
    }

    #[test]
    fn open_regular_refuses_symlinks_and_fifos_without_blocking() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("f");
        fs::write(&file, b"x").unwrap();
        assert!(open_regular(&StdFs, &file).is_ok());
        let link = dir.path().join("l");
        std::os::unix::fs::symlink(&file, &link).unwrap();
        assert!(open_regular(&StdFs, &link).is_err());
        let fifo = dir.path().join("p");
        let made = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap();
        assert!(made.success());
        assert!(open_regular(&StdFs, &fifo).is_err());
        assert!(open_regular(&StdFs, dir.path()).is_err());
    }

    #[test]
    fn read_bounded_stops_at_the_limit() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("f");
        fs::write(&file, [0u8; 10]).unwrap();
        assert_eq!(
            read_bounded(File::open(&file).unwrap(), 10).unwrap().len(),
            10
        );
        assert!(read_bounded(File::open(&file).unwrap(), 9).is_err());
    }

    #[test]
    fn temp_names_are_fresh() {
        let dir = tempfile::tempdir().unwrap();
        let names: HashSet<PathBuf> = (0..200)
            .map(|_| create_temp(&StdFs, dir.path(), "body").unwrap().0)
            .collect();
        assert_eq!(names.len(), 200);
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
        };
        w.commit(entry, b"").unwrap();
        // body and metadata, one block each; an empty signature is no block.
        assert_eq!(store.used_bytes(), 2 * BLOCK);
    }
}
