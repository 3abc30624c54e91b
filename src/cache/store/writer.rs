//! Writing an entry (RELIABILITY B3's store protocol): the body into a temp
//! file with its budget reserved first, then at commit the signature and
//! metadata, fsyncs, the renames under the index lock and the directory
//! fsync; and rewriting an entry's metadata for a 304.
//!
//! Main type: [`EntryWriter`].

use std::fs;
use std::io::{BufWriter, Write};
use std::path::PathBuf;
use std::sync::Arc;

use tracing::{debug, warn};

use super::files::{EntryPaths, create_temp, ensure_dir, fsync_dir, remove_if_exists, rename_all};
use super::index::{disk_bytes, is_complete};
use super::{CacheStore, Inner};
use crate::cache::CacheError;
use crate::cache::fs::FsWriter;
use crate::cache::key::CacheKey;
use crate::cache::meta::{Completeness, EntryMeta, IndexEntry, NewEntry};
use crate::cache::outboard::OutboardBuilder;

/// Capacity of the body writer's buffer.
const WRITE_BUFFER: usize = 64 * 1024;

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

impl CacheStore {
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
