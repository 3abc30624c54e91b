//! Serving a hit: opening an entry's three files under the index lock and
//! checking them (the key the metadata names, lengths, the signature's
//! digest) before the proxy reads the body. Hashing the whole body is left
//! to the caller ([`Entry::verify_body`], or while streaming).
//!
//! Main type: [`Entry`].

use std::fs::File;
use std::io::{self, Seek, SeekFrom};

use tracing::warn;

use super::files::{EntryPaths, open_regular, read_bounded};
use super::{CacheStore, MAX_SIG_LEN};
use crate::cache::key::CacheKey;
use crate::cache::meta::{EntryMeta, MAX_META_LEN};

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

impl CacheStore {
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
pub(super) fn empty_body_digest_matches(meta: &EntryMeta) -> bool {
    meta.body_len != 0 || meta.body_digest().ok() == Some(blake3::hash(b""))
}
