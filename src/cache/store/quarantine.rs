//! Quarantine: moving an entry that failed a check out of the index and
//! into `quarantine/`, where it stays counted against the budget until the
//! next open empties it, within [`QUARANTINE_SHARE`] of the budget.

use std::io;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use tracing::warn;

use super::files::{EntryPaths, remove_if_exists};
use super::index::State;
use super::{CacheStore, Inner, QUARANTINE_SHARE};
use crate::cache::key::CacheKey;

impl CacheStore {
    /// Moves `key`'s entry into quarantine/ because its body failed a check
    /// (a group of it did not match its outboard, say), if the index still
    /// holds the body whose blake3 is `body_blake3` (a newer one stays).
    /// The next request for the key is a miss and refetches (C-V3).
    pub fn quarantine(&self, key: &CacheKey, body_blake3: blake3::Hash) {
        warn!(url = %key, "cache entry failed its check; quarantined");
        self.inner.quarantine_entry(key, body_blake3);
    }
}

impl Inner {
    /// Moves `key`'s files to quarantine if the index still holds the entry
    /// that was checked (`seen` is its body digest).
    pub(super) fn quarantine_entry(&self, key: &CacheKey, seen: blake3::Hash) {
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
    pub(super) fn quarantine_files(&self, st: &mut State, files: &[&Path], bytes: u64) {
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
}
