//! The cache directory's lock: an advisory `flock` on `<root>/lock`, taken
//! by [`CacheStore::open`](super::CacheStore::open) before it cleans
//! anything and held until the store's last handle drops, so that a
//! second proxy, or `rproxy cache purge`, cannot clean or rewrite a
//! directory a running proxy holds in its index. The kernel releases it
//! when the process dies, so a crash never leaves it stale.
//!
//! Processes that serve one connection each (`--inetd`) share the
//! directory by design and take it shared: they keep out a listening
//! proxy and a purge, not each other.
//!
//! Left out: readers. [`super::Listing`] takes no lock, since it changes
//! nothing. The lock file is never deleted: unlinking it would let a new
//! process lock a fresh file while an old one still holds the unlinked
//! one. Filesystems without `flock` (some network mounts) get a warning
//! and no lock, as before there was one.
//!
//! Main type: `DirLock`.

use std::fs::{File, OpenOptions, TryLockError};
use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use tracing::warn;

use crate::cache::CacheError;

/// Name of the lock file inside the root.
pub const LOCK_FILE: &str = "lock";

/// How often, and how far apart, a taken lock is tried again before the
/// directory is called taken: half a second in all.
const LOCK_RETRIES: u32 = 20;
const LOCK_RETRY_EVERY: std::time::Duration = std::time::Duration::from_millis(25);

/// How a process holds the directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Sharing {
    /// Alone: a proxy with a listener, or a purge.
    Exclusive,
    /// Beside other shared holders: one `--inetd` process per connection.
    Shared,
}

/// A held lock on a cache directory; dropping it releases the lock.
#[derive(Debug)]
pub(super) struct DirLock {
    _file: File,
}

impl DirLock {
    /// Locks `<root>/lock` as `sharing` says, without waiting.
    ///
    /// # Errors
    ///
    /// [`CacheError::Locked`] when another process holds it in a way that
    /// excludes this one; [`CacheError::Io`] when the lock file cannot be
    /// opened or created.
    pub(super) fn acquire(root: &Path, sharing: Sharing) -> Result<DirLock, CacheError> {
        let path = root.join(LOCK_FILE);
        // O_NOFOLLOW: a symlink planted as the lock file must not make us
        // create or lock a file elsewhere (C-R2).
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&path)
            .map_err(CacheError::io(&path))?;
        let try_lock = || match sharing {
            Sharing::Exclusive => file.try_lock(),
            Sharing::Shared => file.try_lock_shared(),
        };
        let mut locked = try_lock();
        // A lock released a moment ago can still be held by a copy of its
        // descriptor in a child being started (between fork and exec, where
        // close-on-exec closes it), or by a process on its way out: wait a
        // little before calling the directory taken.
        for _ in 0..LOCK_RETRIES {
            if !matches!(locked, Err(TryLockError::WouldBlock)) {
                break;
            }
            std::thread::sleep(LOCK_RETRY_EVERY);
            locked = try_lock();
        }
        match locked {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => return Err(CacheError::Locked { path }),
            Err(TryLockError::Error(e)) if is_unsupported(&e) => {
                warn!(path = %path.display(), error = %e, "cannot lock the cache directory; nothing keeps a second proxy out of it");
            }
            Err(TryLockError::Error(e)) => return Err(CacheError::io(&path)(e)),
        }
        Ok(DirLock { _file: file })
    }
}

/// Whether `flock` failed because the filesystem has no such locks.
fn is_unsupported(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::Unsupported
        || matches!(e.raw_os_error(), Some(libc::ENOLCK | libc::EOPNOTSUPP))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exclusive_keeps_out_everyone_and_shared_only_exclusive() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let held = DirLock::acquire(root, Sharing::Exclusive).unwrap();
        for sharing in [Sharing::Exclusive, Sharing::Shared] {
            let refused = DirLock::acquire(root, sharing).unwrap_err();
            assert!(
                matches!(&refused, CacheError::Locked { path } if path == &root.join(LOCK_FILE)),
                "{refused}"
            );
        }
        drop(held);
        let first = DirLock::acquire(root, Sharing::Shared).unwrap();
        let second = DirLock::acquire(root, Sharing::Shared).unwrap();
        assert!(DirLock::acquire(root, Sharing::Exclusive).is_err());
        drop((first, second));
        DirLock::acquire(root, Sharing::Exclusive).unwrap();
    }

    #[test]
    fn a_symlink_as_the_lock_file_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let elsewhere = dir.path().join("elsewhere");
        let root = dir.path().join("cache");
        std::fs::create_dir(&root).unwrap();
        std::os::unix::fs::symlink(&elsewhere, root.join(LOCK_FILE)).unwrap();
        assert!(matches!(
            DirLock::acquire(&root, Sharing::Exclusive),
            Err(CacheError::Io { .. })
        ));
        assert!(!elsewhere.exists());
    }
}
