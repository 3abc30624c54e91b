//! The basis store's disk tier: bodies too large for memory, one file
//! each, named by the body's blake3 in hex, in a directory of their own,
//! within a byte budget, least recently used first out.
//!
//! Written with the cache's protocol (RELIABILITY B3, the helpers of
//! [`crate::cache::store::files`]): the body streams into a fresh temp
//! file while it is coded ([`DiskWriter`]); only a whole body, whose
//! digest the encoder computed, is fsynced, renamed to its digest's name,
//! and the directory fsynced. A body cut short or failed drops its writer,
//! which unlinks the temp file. So whatever a crash interrupts, the
//! directory holds whole bodies under their names and temp files, which
//! the next start removes ([`Disk::open`]) before it rebuilds the index
//! from the names, the sizes and the modification times (a use touches
//! its file, so recency survives a restart). Names that are neither are
//! left alone: the directory may be shared with something else.
//!
//! A body is not hashed again when it is read back: that would cost more
//! than coding against it (a GiB per request). A file damaged on disk is
//! then a wrong basis, which costs bytes and never a wrong byte: the
//! client rebuilds the body from its own copy of the basis and checks the
//! result against the blake3 that END carries, and fetches the body again
//! without a basis when it does not match. The length is checked on every
//! read, which catches a truncated file for nothing.
//!
//! The directory must be ours and writable by no one else (the default is
//! in the temp directory, where another user could make it first); it is
//! made mode 0700. It is locked (`flock` on `lock`) by one process: a second
//! accelerator given the same one runs without the tier, rather than
//! removing the first one's temp files and overrunning their budget.
//!
//! Main types: [`Disk`], [`DiskWriter`].

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::SystemTime;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::cache::fs::{Fs, FsWriter, StdFs};
use crate::cache::store::files::{create_temp, fsync_dir, remove_if_exists};
use crate::hsync::FileBasis;

/// Name of the lock file inside the directory.
const LOCK_FILE: &str = "lock";

/// What `create_temp` ends a temp file's name with.
const TEMP_SUFFIX: &str = ".basis.tmp";

/// Capacity of a writer's buffer.
const WRITE_BUFFER: usize = 256 * 1024;

/// Bodies being written hold at most 1 / `WRITING_SHARE` of the budget
/// more, in all (or one body of the largest kept, if that is more).
const WRITING_SHARE: u64 = 4;

/// Bodies on disk by blake3, within a byte budget.
pub(super) struct Disk {
    dir: PathBuf,
    budget: u64,
    max_body: u64,
    fs: Arc<dyn Fs>,
    state: Mutex<Index>,
    /// Bytes that temp files may hold, in all.
    writing: Arc<Semaphore>,
    /// Held while the tier lives.
    _lock: File,
}

impl std::fmt::Debug for Disk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Disk")
            .field("dir", &self.dir)
            .field("budget", &self.budget)
            .field("max_body", &self.max_body)
            .finish_non_exhaustive()
    }
}

#[derive(Debug, Default)]
struct Index {
    /// Digest → (length, last-use tick).
    files: HashMap<[u8; 32], (u64, u64)>,
    /// Last-use tick → digest; the first is the least recently used.
    lru: BTreeMap<u64, [u8; 32]>,
    used: u64,
    tick: u64,
}

impl Index {
    fn insert(&mut self, digest: [u8; 32], len: u64) {
        self.tick += 1;
        self.files.insert(digest, (len, self.tick));
        self.lru.insert(self.tick, digest);
        self.used += len;
    }

    fn remove(&mut self, digest: &[u8; 32]) {
        if let Some((len, tick)) = self.files.remove(digest) {
            self.lru.remove(&tick);
            self.used -= len;
        }
    }

    /// The least recently used digest, taken out of the index.
    fn pop_oldest(&mut self) -> Option<[u8; 32]> {
        let (_, digest) = self.lru.pop_first()?;
        if let Some((len, _)) = self.files.remove(&digest) {
            self.used -= len;
        }
        Some(digest)
    }
}

/// Why the tier cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum DiskError {
    /// The directory cannot be created, listed or locked.
    #[error("basis directory {path}: {source}")]
    Io {
        /// The directory or file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// Another process holds the directory.
    #[error("basis directory {path} is in use by another process")]
    Locked {
        /// The directory.
        path: PathBuf,
    },
}

impl Disk {
    /// The tier in `dir` (created if missing) with the real file system:
    /// at most `budget` bytes, bodies of at most `max_body`.
    ///
    /// # Errors
    /// As [`Disk::open_with`].
    pub(super) fn open(dir: &Path, budget: u64, max_body: u64) -> Result<Disk, DiskError> {
        Disk::open_with(Arc::new(StdFs), dir, budget, max_body)
    }

    /// The tier in `dir` through `fs`: locks it, removes temp files a
    /// crash left, indexes the bodies (oldest modification first out) and
    /// evicts past `budget`.
    ///
    /// # Errors
    /// The directory cannot be created, listed or locked, or another
    /// process holds it.
    pub(super) fn open_with(
        fs: Arc<dyn Fs>,
        dir: &Path,
        budget: u64,
        max_body: u64,
    ) -> Result<Disk, DiskError> {
        let at = |path: &Path| {
            let path = path.to_path_buf();
            move |source| DiskError::Io { path, source }
        };
        let max_body = max_body.min(budget);
        ensure_private_dir(&*fs, dir).map_err(at(dir))?;
        let lock_path = dir.join(LOCK_FILE);
        let lock = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(at(&lock_path))?;
        match lock.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                return Err(DiskError::Locked { path: dir.into() });
            }
            Err(std::fs::TryLockError::Error(e)) => {
                // Some network file systems have no flock: run unlocked.
                tracing::warn!(dir = %dir.display(), error = %e, "cannot lock the basis directory");
            }
        }
        let mut found = Vec::new();
        for entry in std::fs::read_dir(dir).map_err(at(dir))? {
            let entry = entry.map_err(at(dir))?;
            let name = entry.file_name();
            let Some(name) = name.to_str() else {
                continue;
            };
            let path = entry.path();
            if is_temp_name(name) {
                if let Err(e) = remove_if_exists(&*fs, &path) {
                    tracing::warn!(path = %path.display(), error = %e, "cannot remove a basis temp file");
                }
                continue;
            }
            let Some(digest) = parse_digest(name) else {
                continue;
            };
            let Ok(meta) = std::fs::symlink_metadata(&path) else {
                continue;
            };
            if !meta.is_file() {
                continue;
            }
            let used = meta.modified().unwrap_or(SystemTime::UNIX_EPOCH);
            found.push((used, digest, meta.len(), path));
        }
        found.sort_by_key(|(used, ..)| *used);
        let mut index = Index::default();
        let mut evicted = Vec::new();
        for (_, digest, len, path) in found {
            if len > max_body {
                evicted.push(path);
            } else {
                index.insert(digest, len);
            }
        }
        let disk = Disk {
            dir: dir.into(),
            budget,
            max_body,
            fs,
            writing: Arc::new(Semaphore::new(
                usize::try_from((budget / WRITING_SHARE).max(max_body))
                    .unwrap_or(usize::MAX)
                    .min(Semaphore::MAX_PERMITS),
            )),
            state: Mutex::new(index),
            _lock: lock,
        };
        for path in evicted {
            disk.unlink(&path);
        }
        {
            let mut st = disk.lock();
            while st.used > budget {
                let Some(victim) = st.pop_oldest() else {
                    break;
                };
                disk.unlink(&disk.path_of(&victim));
            }
            tracing::info!(dir = %dir.display(), bodies = st.files.len(), bytes = st.used, "basis store on disk");
        }
        Ok(disk)
    }

    /// Largest body kept (bytes).
    pub(super) fn max_body(&self) -> u64 {
        self.max_body
    }

    /// Bytes held.
    pub(super) fn used(&self) -> u64 {
        self.lock().used
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Index> {
        // The index stays consistent between statements.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn path_of(&self, digest: &[u8; 32]) -> PathBuf {
        self.dir
            .join(blake3::Hash::from_bytes(*digest).to_hex().as_str())
    }

    fn unlink(&self, path: &Path) {
        if let Err(e) = remove_if_exists(&*self.fs, path) {
            tracing::warn!(path = %path.display(), error = %e, "cannot remove a basis body");
        }
    }

    /// Whether `digest` is held (not a use).
    pub(super) fn contains(&self, digest: &[u8; 32]) -> bool {
        self.lock().files.contains_key(digest)
    }

    /// The body whose blake3 is `digest`, if held, to be read by offset;
    /// counts as a use. A file gone or of another length than it was
    /// stored with is dropped (see the module doc for why its content is
    /// not checked).
    pub(super) fn get(&self, digest: &[u8; 32]) -> Option<FileBasis> {
        let len = {
            let mut st = self.lock();
            let (len, tick) = st.files.get(digest).copied()?;
            st.lru.remove(&tick);
            st.tick += 1;
            let now = st.tick;
            st.lru.insert(now, *digest);
            st.files.insert(*digest, (len, now));
            len
        };
        let path = self.path_of(digest);
        let opened = self
            .fs
            .open_read(&path)
            .and_then(|file| {
                if file.metadata()?.is_file() {
                    Ok(file)
                } else {
                    Err(io::Error::other("not a regular file"))
                }
            })
            .and_then(|file| {
                // Recency for the next start's index; a failure costs only
                // that.
                let _ = file.set_modified(SystemTime::now());
                FileBasis::new(file)
            });
        match opened {
            Ok(basis) if crate::hsync::Basis::size(&basis) == len => Some(basis),
            Ok(basis) => {
                tracing::warn!(path = %path.display(), stored = len, found = crate::hsync::Basis::size(&basis), "basis body changed length on disk; dropped");
                self.lock().remove(digest);
                self.unlink(&path);
                None
            }
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "cannot open a basis body; dropped");
                self.lock().remove(digest);
                None
            }
        }
    }

    /// A writer for a body of `expected` bytes if announced: `None` when
    /// it is over the limit, when the bodies being written hold their
    /// share of the budget, or when no temp file can be made.
    pub(super) fn begin(self: &Arc<Self>, expected: Option<u64>) -> Option<DiskWriter> {
        if expected.is_some_and(|len| len > self.max_body) {
            return None;
        }
        let room = self.writing.clone().try_acquire_many_owned(0).ok()?;
        let (tmp, file) = match create_temp(&*self.fs, &self.dir, "basis") {
            Ok(created) => created,
            Err(e) => {
                tracing::warn!(error = %e, "cannot write a basis body");
                return None;
            }
        };
        Some(DiskWriter {
            disk: self.clone(),
            file: Some(BufWriter::with_capacity(
                WRITE_BUFFER,
                FsWriter::new(self.fs.clone(), file, tmp.clone()),
            )),
            tmp,
            len: 0,
            room,
        })
    }

    /// Makes the written body visible under `digest`: fsync, evict to make
    /// room, rename, fsync the directory. Any failure leaves no file.
    fn commit(&self, mut writer: DiskWriter, digest: [u8; 32]) -> io::Result<()> {
        let len = writer.len;
        if self.lock().files.contains_key(&digest) || len > self.budget {
            // Held already (a body served again): no fsync for a copy that
            // the writer's drop removes.
            return Ok(());
        }
        let file = writer.file.take().expect("open until commit or drop");
        let file = file.into_inner().map_err(io::IntoInnerError::into_error)?;
        file.sync()?;
        let path = self.path_of(&digest);
        {
            let mut st = self.lock();
            if st.files.contains_key(&digest) {
                // Kept meanwhile by another writer of the same body.
                return Ok(());
            }
            while st.used + len > self.budget {
                let Some(victim) = st.pop_oldest() else {
                    break;
                };
                self.unlink(&self.path_of(&victim));
            }
            self.fs.rename(&writer.tmp, &path)?;
            st.insert(digest, len);
        }
        if let Err(e) = fsync_dir(&*self.fs, &self.dir) {
            // After a failed fsync the file's durability is unknown: it is
            // dropped rather than trusted (as the cache does, C-E2).
            self.lock().remove(&digest);
            self.unlink(&path);
            return Err(io::Error::other(e.to_string()));
        }
        Ok(())
    }
}

/// A body being written to a temp file for the disk tier. Dropping it
/// unfinished removes the file.
pub(super) struct DiskWriter {
    disk: Arc<Disk>,
    file: Option<BufWriter<FsWriter>>,
    tmp: PathBuf,
    len: u64,
    /// This body's room in the tier's writing share.
    room: OwnedSemaphorePermit,
}

impl DiskWriter {
    /// Appends `data`; false when the body outgrew the limit, the writing
    /// share is spent or the write failed: it is not kept then.
    pub(super) fn add(&mut self, data: &[u8]) -> bool {
        if self.len + data.len() as u64 > self.disk.max_body {
            return false;
        }
        let Some(room) = u32::try_from(data.len())
            .ok()
            .and_then(|len| self.disk.writing.clone().try_acquire_many_owned(len).ok())
        else {
            return false;
        };
        self.room.merge(room);
        let Some(file) = &mut self.file else {
            return false;
        };
        if let Err(e) = file.write_all(data) {
            tracing::warn!(path = %self.tmp.display(), error = %e, "cannot write a basis body");
            return false;
        }
        self.len += data.len() as u64;
        true
    }

    /// Keeps the body written under its blake3 `digest` (the encoder's,
    /// over the very bytes written). Blocking: run it on a blocking thread.
    pub(super) fn commit(self, digest: [u8; 32]) {
        let disk = self.disk.clone();
        let tmp = self.tmp.clone();
        if let Err(e) = disk.commit(self, digest) {
            tracing::warn!(path = %tmp.display(), error = %e, "cannot keep a basis body");
        }
    }
}

impl Drop for DiskWriter {
    fn drop(&mut self) {
        drop(self.file.take());
        // After a commit the temp name is gone (renamed): nothing to do.
        if let Err(e) = remove_if_exists(&*self.disk.fs, &self.tmp) {
            tracing::warn!(path = %self.tmp.display(), error = %e, "cannot remove a basis temp file");
        }
    }
}

/// Creates `dir` (mode 0700) if missing, and checks that it is a real
/// directory (not a symlink) of ours that no one else may write to: the
/// default one is in the temp directory, where another user could have
/// made it first. Its names tell which bodies were served, so it is kept
/// from other users' eyes too when we create it. Whose it is, is told by
/// a file made in it (`lib.rs` forbids the unsafe `geteuid`).
fn ensure_private_dir(fs: &dyn Fs, dir: &Path) -> io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt};
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)?;
    let meta = std::fs::symlink_metadata(dir)?;
    if !meta.is_dir() {
        return Err(io::Error::other("not a directory (a symlink?)"));
    }
    let (probe, file) =
        create_temp(fs, dir, "basis").map_err(|e| io::Error::other(e.to_string()))?;
    let ours = file.metadata().map(|made| made.uid());
    drop(file);
    remove_if_exists(fs, &probe)?;
    if ours? != meta.uid() || meta.mode() & 0o022 != 0 {
        return Err(io::Error::other(
            "owned by another user, or writable by others: give --basis-dir a directory of ours",
        ));
    }
    Ok(())
}

/// Whether `name` is one of our temp files: `create_temp`'s sixteen hex
/// digits and suffix.
fn is_temp_name(name: &str) -> bool {
    name.strip_suffix(TEMP_SUFFIX)
        .is_some_and(|stem| stem.len() == 16 && stem.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// The digest a body's file name spells (64 lower-case hex digits).
fn parse_digest(name: &str) -> Option<[u8; 32]> {
    if name.len() != 64 || !name.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
        return None;
    }
    blake3::Hash::from_hex(name)
        .ok()
        .map(|hash| *hash.as_bytes())
}
