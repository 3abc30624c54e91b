//! Opening a cache directory: locking it, emptying `tmp/` and
//! `quarantine/`, walking the entries' files to delete what a crash left
//! half done (temp files, orphaned bodies and signatures), quarantining
//! entries that fail their check, and rebuilding the index, oldest
//! metadata first in LRU order.
//!
//! Main item: [`CacheStore::open`].

use std::collections::HashMap;
use std::ffi::OsStr;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Instant, SystemTime};

use tracing::{debug, info, warn};
use walkdir::WalkDir;

use super::files::{empty_dir, ensure_dir, open_regular, read_bounded, remove_if_exists};
use super::health::DiskHealth;
use super::hit::empty_body_digest_matches;
use super::index::{State, disk_bytes};
use super::lock::{DirLock, Sharing};
use super::{CacheStore, Inner, MAX_SIG_LEN, QUARANTINE_DIR, TMP_DIR};
use crate::cache::CacheError;
use crate::cache::fs::{Fs, StdFs};
use crate::cache::meta::{EntryMeta, IndexEntry, MAX_META_LEN};

impl CacheStore {
    /// Opens (creating if needed) the cache at `root` with a budget of
    /// `budget_bytes`, cleans it up and rebuilds the index (C-R1, C-R2).
    ///
    /// It first locks `<root>/`[`LOCK_FILE`](super::LOCK_FILE) for this
    /// process alone, until the last clone of the store drops.
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
    /// [`CacheError::Locked`] when another process has the directory
    /// open; [`CacheError::Io`] when the root, `tmp/`, `quarantine/` or
    /// the lock file cannot be created; [`CacheError::NotADirectory`]
    /// when one of them is something else.
    pub fn open(root: impl Into<PathBuf>, budget_bytes: u64) -> Result<CacheStore, CacheError> {
        CacheStore::open_with_fs(root, budget_bytes, Arc::new(StdFs))
    }

    /// [`CacheStore::open`] for a process that serves one connection
    /// (`--inetd`): it shares the directory with others like it, which
    /// clean up at their own open as before, but not with a proxy that
    /// opened it with [`CacheStore::open`], nor with a purge.
    ///
    /// # Errors
    ///
    /// As [`CacheStore::open`]; [`CacheError::Locked`] only when a
    /// process holds the directory alone.
    pub fn open_shared(
        root: impl Into<PathBuf>,
        budget_bytes: u64,
    ) -> Result<CacheStore, CacheError> {
        CacheStore::open_locked(root.into(), budget_bytes, Arc::new(StdFs), Sharing::Shared)
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
        CacheStore::open_locked(root.into(), budget_bytes, fs, Sharing::Exclusive)
    }

    /// Creates and locks `root`, then cleans it and rebuilds the index.
    fn open_locked(
        root: PathBuf,
        budget_bytes: u64,
        fs: Arc<dyn Fs>,
        sharing: Sharing,
    ) -> Result<CacheStore, CacheError> {
        let started = Instant::now();
        fs::create_dir_all(&root).map_err(CacheError::io(&root))?;
        // The lock and the file it is on are the process's, not the
        // cache's data: std::fs, not `fs`, and before anything is cleaned.
        let lock = DirLock::acquire(&root, sharing)?;
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
            _lock: Arc::new(lock),
        })
    }
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
pub(super) struct Found {
    pub(super) body: Option<(PathBuf, u64)>,
    pub(super) sig: Option<(PathBuf, u64)>,
    pub(super) meta: Option<(PathBuf, u64, SystemTime)>,
}

impl Inner {
    /// Walks the root and fills the index (see [`CacheStore::open`]).
    fn rebuild(&self) -> RebuildReport {
        let mut report = RebuildReport::default();
        let found = walk(&self.root, &mut report.skipped);
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
}

/// Lists the regular files under `root` named like entry files, grouped by
/// entry (`<dir>/<hash>`), with lstat lengths; `tmp/` and `quarantine/`
/// are left out. Follows no symlinks; skips, counts in `skipped` and logs
/// what it cannot read and what is not a regular file. Changes nothing.
pub(super) fn walk(root: &Path, skipped: &mut u64) -> HashMap<PathBuf, Found> {
    let mut found: HashMap<PathBuf, Found> = HashMap::new();
    let walk = WalkDir::new(root)
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
                *skipped += 1;
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
            *skipped += 1;
            continue;
        }
        let md = match dirent.metadata() {
            Ok(md) => md,
            Err(e) => {
                warn!(path = %dirent.path().display(), error = %e, "cannot stat cache file");
                *skipped += 1;
                continue;
            }
        };
        let parent = dirent.path().parent().unwrap_or(root);
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

/// Why a found entry was not indexed.
pub(super) enum Check {
    /// Reading failed in a way worth retrying later (permissions): skip.
    Unreadable(io::Error),
    /// The entry is garbage: quarantine.
    Invalid(String),
}

/// Reads and checks the metadata of an entry found by the walk, against its
/// file name, directory and the other files' lengths.
pub(super) fn check_found(fs: &dyn Fs, stem: &Path, files: &Found) -> Result<EntryMeta, Check> {
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

/// Splits `<64 hex>.<body|sig|meta>` into stem and extension.
fn split_entry_name(name: &OsStr) -> Option<(&str, &str)> {
    let (stem, ext) = name.to_str()?.split_once('.')?;
    let is_hash = stem.len() == 64 && stem.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
    (is_hash && matches!(ext, "body" | "sig" | "meta")).then_some((stem, ext))
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
