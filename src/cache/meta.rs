//! Entry metadata: the JSON file written last when an entry is committed, and
//! the small summary of it the in-memory index keeps.
//!
//! After a crash the disk is untrusted input (F-5), so [`EntryMeta::from_json`]
//! checks the size, the version, the digests' form and that the stored key is
//! already in normal form; anything else is an error the store answers by
//! quarantining the entry. It deliberately knows nothing about files; the
//! store checks lengths and paths.
//!
//! Main types: [`EntryMeta`] (on disk), [`NewEntry`] (what the caller supplies
//! at commit), [`IndexEntry`] (in memory), [`Completeness`].

use serde::{Deserialize, Serialize};

use super::key::{CacheKey, KeyError};
use super::outboard::Outboard;

/// Version of the metadata format written by this code.
pub const META_VERSION: u32 = 1;

/// Largest metadata file read, in bytes (URL limit plus headers, generously).
pub const MAX_META_LEN: u64 = 1024 * 1024;

/// Whether an entry holds the whole body or only a prefix of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Completeness {
    /// The whole response body, verified.
    Complete,
    /// A verified prefix plus its signature: of an interrupted transfer, or
    /// a 206 that began at the first byte (RFC 9111 §3.3). A basis to
    /// resume from, and ranges within it answer Range requests; never
    /// served as a whole response.
    Partial,
}

/// What the caller knows about a response when it commits it; the store adds
/// the key, lengths and digests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewEntry {
    /// The origin's status code.
    pub status: u16,
    /// End-to-end response headers to replay, `(name, value)` in order.
    /// Values must be valid UTF-8; the proxy drops others before storing.
    pub headers: Vec<(String, String)>,
    /// When the response was received, in seconds since the Unix epoch.
    pub stored_at: u64,
    /// Whole body or prefix.
    pub completeness: Completeness,
    /// False for responses that must never leave one user's view: requests
    /// with `Authorization`, `Cache-Control: private`, `Set-Cookie` (A-6,
    /// D-B1). Such entries are bases only in a single user's private cache.
    pub shareable_as_basis: bool,
    /// For a prefix, the length of the whole body when known (a 206's
    /// `Content-Range`, a 200's `Content-Length`): what ranges of the
    /// prefix are answered against (RFC 9111 §3.3). `None` for a whole
    /// body, whose length is its own.
    pub complete_len: Option<u64>,
}

/// The metadata file of one entry (JSON).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EntryMeta {
    /// [`META_VERSION`] when written.
    pub version: u32,
    /// The normalised URL of the key.
    pub url: String,
    /// The key's Vary'd request header values.
    pub vary: Vec<(String, String)>,
    /// The origin's status code.
    pub status: u16,
    /// Stored response headers.
    pub headers: Vec<(String, String)>,
    /// Unix seconds when the response was received.
    pub stored_at: u64,
    /// Length of the `.body` file in bytes.
    pub body_len: u64,
    /// blake3 of the body, lower-case hex.
    pub body_blake3: String,
    /// Length of the `.sig` file in bytes.
    pub sig_len: u64,
    /// blake3 of the signature, lower-case hex.
    pub sig_blake3: String,
    /// Whole body or prefix.
    pub completeness: Completeness,
    /// See [`NewEntry::shareable_as_basis`].
    pub shareable_as_basis: bool,
    /// The body's blake3 outboard ([`Outboard`]), base64: a hit checks
    /// the body group by group before it leaves (C-V3). Empty in entries
    /// written before it was kept; those are checked whole first.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub outboard: String,
    /// See [`NewEntry::complete_len`]; absent (`None`) in whole entries
    /// and in entries written before it was kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub complete_len: Option<u64>,
}

/// Why a metadata file was rejected.
#[derive(Debug, thiserror::Error)]
pub enum MetaError {
    /// The file is larger than [`MAX_META_LEN`].
    #[error("metadata of {len} bytes is larger than the limit of {max}")]
    TooLarge {
        /// Its length.
        len: u64,
        /// The limit.
        max: u64,
    },
    /// Not JSON of the expected shape.
    #[error("metadata does not parse: {0}")]
    Json(#[from] serde_json::Error),
    /// Written by another version of the format.
    #[error("metadata version {found} is not {META_VERSION}")]
    Version {
        /// The version found.
        found: u32,
    },
    /// The stored key is not a valid key.
    #[error("stored key is invalid: {0}")]
    Key(#[from] KeyError),
    /// The stored key is valid but not in normal form, so it was not written
    /// by us.
    #[error("stored key {url:?} is not normalised")]
    NotNormalised {
        /// The stored URL.
        url: String,
    },
    /// A digest field is not 64 lower-case hex digits.
    #[error("field {field} is not a blake3 hex digest")]
    BadDigest {
        /// The field name.
        field: &'static str,
    },
}

impl EntryMeta {
    /// Builds the metadata for `key` from the caller's part and the lengths
    /// and digests the writer computed.
    pub fn new(
        key: &CacheKey,
        entry: NewEntry,
        body_len: u64,
        body_blake3: blake3::Hash,
        signature: &[u8],
    ) -> EntryMeta {
        EntryMeta {
            version: META_VERSION,
            url: key.url().to_owned(),
            vary: key.vary().to_vec(),
            status: entry.status,
            headers: entry.headers,
            stored_at: entry.stored_at,
            body_len,
            body_blake3: body_blake3.to_hex().to_string(),
            sig_len: signature.len() as u64,
            sig_blake3: blake3::hash(signature).to_hex().to_string(),
            completeness: entry.completeness,
            shareable_as_basis: entry.shareable_as_basis,
            outboard: String::new(),
            complete_len: entry
                .complete_len
                .filter(|_| entry.completeness == Completeness::Partial),
        }
    }

    /// The metadata with `outboard` kept (the writer adds it).
    pub fn with_outboard(mut self, outboard: &Outboard) -> EntryMeta {
        use base64::Engine as _;
        self.outboard = base64::engine::general_purpose::STANDARD.encode(outboard.to_bytes());
        self
    }

    /// The stored outboard, if there is one that merges into the body's
    /// digest; `None` for a missing, malformed or altered one.
    pub fn outboard(&self) -> Option<Outboard> {
        use base64::Engine as _;
        if self.outboard.is_empty() {
            return None;
        }
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(&self.outboard)
            .ok()?;
        let outboard = Outboard::from_bytes(self.body_len, &bytes).ok()?;
        outboard
            .matches(&self.body_digest().ok()?)
            .then_some(outboard)
    }

    /// Parses and checks a metadata file's bytes.
    ///
    /// # Errors
    ///
    /// [`MetaError`] for oversized, malformed, other-version or
    /// non-normalised metadata.
    pub fn from_json(bytes: &[u8]) -> Result<EntryMeta, MetaError> {
        if bytes.len() as u64 > MAX_META_LEN {
            return Err(MetaError::TooLarge {
                len: bytes.len() as u64,
                max: MAX_META_LEN,
            });
        }
        let meta: EntryMeta = serde_json::from_slice(bytes)?;
        if meta.version != META_VERSION {
            return Err(MetaError::Version {
                found: meta.version,
            });
        }
        parse_digest(&meta.body_blake3, "body_blake3")?;
        parse_digest(&meta.sig_blake3, "sig_blake3")?;
        let key = CacheKey::from_parts(&meta.url, &meta.vary)?;
        if key.url() != meta.url || key.vary() != meta.vary.as_slice() {
            return Err(MetaError::NotNormalised { url: meta.url });
        }
        Ok(meta)
    }

    /// Serialises to JSON.
    pub fn to_json(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("metadata of strings and integers always serialises")
    }

    /// The stored key.
    ///
    /// # Errors
    ///
    /// [`KeyError`] when the stored key is invalid (never for metadata that
    /// came through [`EntryMeta::from_json`]).
    pub fn key(&self) -> Result<CacheKey, KeyError> {
        CacheKey::from_parts(&self.url, &self.vary)
    }

    /// The blake3 of the body.
    ///
    /// # Errors
    ///
    /// [`MetaError::BadDigest`] (never for checked metadata).
    pub fn body_digest(&self) -> Result<blake3::Hash, MetaError> {
        parse_digest(&self.body_blake3, "body_blake3")
    }

    /// The blake3 of the signature.
    ///
    /// # Errors
    ///
    /// [`MetaError::BadDigest`] (never for checked metadata).
    pub fn sig_digest(&self) -> Result<blake3::Hash, MetaError> {
        parse_digest(&self.sig_blake3, "sig_blake3")
    }
}

fn parse_digest(hex: &str, field: &'static str) -> Result<blake3::Hash, MetaError> {
    // Lower-case only, so one digest has one spelling.
    if hex.len() != 64 || !hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
        return Err(MetaError::BadDigest { field });
    }
    blake3::Hash::from_hex(hex).map_err(|_| MetaError::BadDigest { field })
}

/// What the in-memory index knows about one entry: enough to choose a basis
/// and name it upstream without touching the disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IndexEntry {
    /// The entry's key.
    pub key: CacheKey,
    /// Unix seconds when the response was received.
    pub stored_at: u64,
    /// Body length in bytes.
    pub body_len: u64,
    /// blake3 of the body (the `Hsync-Basis` value).
    pub body_blake3: blake3::Hash,
    /// Whole body or prefix.
    pub completeness: Completeness,
    /// See [`NewEntry::shareable_as_basis`].
    pub shareable_as_basis: bool,
    /// The stored response's status: only a 200's body is another
    /// response's basis.
    pub status: u16,
    /// When it was committed relative to the others: later is larger (at
    /// open, the order of the entries' files' modification times). Orders
    /// entries stored within the same second, which `stored_at` cannot.
    pub commit_order: u64,
}

impl IndexEntry {
    /// The index summary of checked metadata.
    ///
    /// # Errors
    ///
    /// [`MetaError`] when the key or body digest is invalid (never for
    /// metadata that came through [`EntryMeta::from_json`]).
    pub fn from_meta(meta: &EntryMeta) -> Result<IndexEntry, MetaError> {
        Ok(IndexEntry {
            key: meta.key()?,
            status: meta.status,
            stored_at: meta.stored_at,
            body_len: meta.body_len,
            body_blake3: meta.body_digest()?,
            completeness: meta.completeness,
            shareable_as_basis: meta.shareable_as_basis,
            // Set by the index when it takes the entry in.
            commit_order: 0,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> EntryMeta {
        let key = CacheKey::parse("http://e.com/a").unwrap();
        EntryMeta::new(
            &key,
            NewEntry {
                status: 200,
                headers: vec![("content-type".into(), "text/plain".into())],
                stored_at: 1_700_000_000,
                completeness: Completeness::Complete,
                shareable_as_basis: true,
                complete_len: None,
            },
            5,
            blake3::hash(b"hello"),
            b"sig",
        )
    }

    #[test]
    fn round_trips_through_json() {
        let meta = sample();
        let back = EntryMeta::from_json(&meta.to_json()).unwrap();
        assert_eq!(back, meta);
        let idx = IndexEntry::from_meta(&back).unwrap();
        assert_eq!(idx.body_blake3, blake3::hash(b"hello"));
    }

    #[test]
    fn a_prefix_keeps_its_whole_length_and_a_whole_body_does_not() {
        let key = CacheKey::parse("http://e.com/a").unwrap();
        let entry = |completeness| NewEntry {
            status: 200,
            headers: Vec::new(),
            stored_at: 1,
            completeness,
            shareable_as_basis: true,
            complete_len: Some(10),
        };
        let prefix = EntryMeta::new(
            &key,
            entry(Completeness::Partial),
            5,
            blake3::hash(b"hello"),
            b"",
        );
        let back = EntryMeta::from_json(&prefix.to_json()).unwrap();
        assert_eq!(back.complete_len, Some(10));
        let whole = EntryMeta::new(
            &key,
            entry(Completeness::Complete),
            5,
            blake3::hash(b"hello"),
            b"",
        );
        assert_eq!(whole.complete_len, None);
        // Written before the field was: read as unknown.
        let json = String::from_utf8(sample().to_json()).unwrap();
        assert!(!json.contains("complete_len"));
        assert_eq!(
            EntryMeta::from_json(json.as_bytes()).unwrap().complete_len,
            None
        );
    }

    #[test]
    fn f5_rejects_garbage_without_panicking() {
        for bad in [
            &b""[..],
            b"{",
            b"null",
            b"[]",
            b"\xff\xfe",
            b"{\"version\":1}",
        ] {
            assert!(EntryMeta::from_json(bad).is_err());
        }
        let mut m = sample();
        m.version = 2;
        assert!(matches!(
            EntryMeta::from_json(&m.to_json()),
            Err(MetaError::Version { found: 2 })
        ));
        let mut m = sample();
        m.body_blake3 = m.body_blake3.to_uppercase();
        assert!(matches!(
            EntryMeta::from_json(&m.to_json()),
            Err(MetaError::BadDigest { .. })
        ));
        let mut m = sample();
        m.url = "HTTP://E.com/a".into();
        assert!(matches!(
            EntryMeta::from_json(&m.to_json()),
            Err(MetaError::NotNormalised { .. })
        ));
        let mut json = sample().to_json();
        json.pop();
        json.extend_from_slice(b",\"extra\":1}");
        assert!(EntryMeta::from_json(&json).is_err());
        let huge = vec![b' '; MAX_META_LEN as usize + 1];
        assert!(matches!(
            EntryMeta::from_json(&huge),
            Err(MetaError::TooLarge { .. })
        ));
    }
}
