//! The client proxy's on-disk cache: one entry per URL (and Vary'd request
//! header values) holding the body, the rsync signature the accelerator sent
//! for it, and JSON metadata.
//!
//! ```text
//! <root>/
//!   lock                          flock'd while a proxy has the directory open
//!   tmp/                          writers' temp files (create_new, random names)
//!   quarantine/                   entries that failed a check; emptied at open
//!   http_example.com_80/          one directory per scheme + authority
//!     <blake3 hex of key>.body    the body
//!     <blake3 hex of key>.sig     its signature, as the accelerator sent it
//!     <blake3 hex of key>.meta    key, status, headers, lengths, digests (last)
//! ```
//!
//! [`CacheStore`] is synchronous (blocking `std::fs`); the proxy calls it from
//! `spawn_blocking`. Writes follow RELIABILITY B3's store protocol (temp files,
//! fsync, rename body and signature then metadata, fsync the directory), so a
//! crash leaves an entry absent or valid, and [`CacheStore::open`] rebuilds
//! the index by walking the directory, deleting temp files and orphans. The
//! size budget is hard: bytes are reserved before they are written, and least
//! recently used entries are evicted to make room. [`select_basis`] picks the
//! longest-prefix basis among the index's [`IndexEntry`]s, and
//! [`CacheKey`] normalises URLs and names files.
//!
//! HTTP semantics (freshness, what may be stored) are [`freshness`]'s, pure
//! RFC 9111 the store never calls: the proxy decides and passes
//! [`NewEntry`]. Left out on purpose: signature parsing (the store
//! keeps the bytes it is given). Every disk change goes through the [`Fs`]
//! trait ([`StdFs`] in production), so tests can fail operations and model a
//! power cut (C-K2, C-K3, C-E2, C-E3 in `tests/cache_crash.rs`). A real full
//! disk and a real `kill -9` are tested from outside, on the binary
//! (`tests/cache_faults.rs`).
//!
//! Main types: [`CacheStore`], [`EntryWriter`], [`Entry`], [`CacheKey`],
//! [`EntryMeta`], [`IndexEntry`], [`Fs`]; errors: [`CacheError`].

use std::io;
use std::path::PathBuf;

pub mod basis;
pub mod freshness;
pub mod fs;
pub mod key;
pub mod meta;
pub mod outboard;
pub mod store;

pub use basis::{CacheScope, select_basis};
pub use fs::{Fs, StdFs};
pub use key::{CacheKey, KeyError};
pub use meta::{Completeness, EntryMeta, IndexEntry, MetaError, NewEntry};
pub use outboard::{Outboard, OutboardBuilder};
pub use store::{CacheStore, Entry, EntryWriter, Listing, PurgeReport};

/// Errors of the cache store.
#[derive(Debug, thiserror::Error)]
pub enum CacheError {
    /// A file-system operation failed.
    #[error("cache I/O on {path}: {source}")]
    Io {
        /// The file or directory involved.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// The entry does not fit: larger than the whole budget, or the rest is
    /// held by other writers' reservations.
    #[error("{needed} more bytes do not fit the cache budget of {budget} bytes")]
    OverBudget {
        /// Bytes that were asked for.
        needed: u64,
        /// The budget.
        budget: u64,
    },
    /// A partial entry was committed while a complete one exists for the key.
    #[error("a complete entry exists for {url}; the partial one is not stored")]
    CompleteEntryExists {
        /// The key's URL.
        url: String,
    },
    /// A path inside the cache that must be a directory is something else
    /// (a symlink planted in the cache directory, say).
    #[error("{path} is not a directory")]
    NotADirectory {
        /// The path.
        path: PathBuf,
    },
    /// The digest given to [`EntryWriter::commit_with_digest`] is not the
    /// written body's.
    #[error("the digest given for {url} is not the written body's")]
    DigestMismatch {
        /// The key's URL.
        url: String,
    },
    /// Another process holds the directory's lock file: a second proxy
    /// would clean up and evict under the first one's index.
    #[error(
        "another rproxy process uses this cache directory ({path} is locked); \
         stop it, or give each proxy a cache directory of its own"
    )]
    Locked {
        /// The lock file.
        path: PathBuf,
    },
    /// The writer failed earlier and can only be dropped.
    #[error("the entry writer for {url} failed earlier")]
    WriterFailed {
        /// The key's URL.
        url: String,
    },
}

impl CacheError {
    /// Whether this is the disk (or the process's file-size limit or the
    /// user's quota) running out of room: ENOSPC, EDQUOT or EFBIG.
    pub fn is_disk_full(&self) -> bool {
        let CacheError::Io { source, .. } = self else {
            return false;
        };
        matches!(
            source.raw_os_error(),
            Some(libc::ENOSPC | libc::EDQUOT | libc::EFBIG)
        )
    }

    /// Wraps an I/O error with the path it happened on.
    pub(crate) fn io(path: impl Into<PathBuf>) -> impl FnOnce(io::Error) -> CacheError {
        let path = path.into();
        move |source| CacheError::Io { path, source }
    }
}
