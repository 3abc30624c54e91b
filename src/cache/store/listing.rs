//! A read-only view of a cache directory: its entries as their metadata
//! files describe them, for `rproxy cache ls` and `show` while a proxy
//! has the directory open.
//!
//! It takes no lock and changes nothing: [`CacheStore::open`] deletes temp
//! files and quarantines invalid entries, which is the running proxy's
//! business, not a reader's. Each entry is checked as the open's walk
//! checks it (the metadata parses, names the key its file name is the
//! hash of, and the body and signature lengths match); one that fails is
//! reported as invalid, not an error. A proxy writing meanwhile can make
//! an entry it is replacing look invalid for that moment, and the view is
//! of the disk, not of the proxy's index.
//!
//! Main types: [`Listing`], [`ListedEntry`], [`InvalidEntry`].
//!
//! [`CacheStore::open`]: super::CacheStore::open

use std::io;
use std::path::{Path, PathBuf};

use http::StatusCode;
use http::header::{HeaderMap, HeaderName, HeaderValue};

use super::recovery::{Check, check_found, walk};
use crate::cache::StdFs;
use crate::cache::freshness::Age;
use crate::cache::meta::EntryMeta;

/// The entries of a cache directory, read from disk.
#[derive(Debug, Default)]
pub struct Listing {
    /// Entries whose files check out, sorted by URL, then Vary'd values.
    pub entries: Vec<ListedEntry>,
    /// Metadata files that did not check out, sorted by path.
    pub invalid: Vec<InvalidEntry>,
    /// Paths that could not be read or are not regular files (logged).
    pub skipped: u64,
}

/// One entry, as its metadata file says.
#[derive(Debug, Clone)]
pub struct ListedEntry {
    /// Its metadata file.
    pub meta_path: PathBuf,
    /// What the file holds: URL, Vary'd values, status, stored headers,
    /// when it was stored, lengths and blake3 digests, completeness.
    pub meta: EntryMeta,
}

/// A metadata file that did not check out, and why.
#[derive(Debug, Clone)]
pub struct InvalidEntry {
    /// The metadata file.
    pub path: PathBuf,
    /// What is wrong with it.
    pub reason: String,
}

impl Listing {
    /// Reads every entry under the cache directory `root`, without
    /// locking or changing anything.
    ///
    /// # Errors
    ///
    /// When `root` is not a readable directory.
    pub fn read(root: &Path) -> io::Result<Listing> {
        if !std::fs::metadata(root)?.is_dir() {
            return Err(io::Error::new(
                io::ErrorKind::NotADirectory,
                format!("{} is not a directory", root.display()),
            ));
        }
        let mut listing = Listing::default();
        for (stem, files) in walk(root, &mut listing.skipped) {
            // Bodies and signatures without metadata are a commit under
            // way, or a crash's leftovers the next open deletes: no entry.
            let Some((meta_path, _, _)) = &files.meta else {
                continue;
            };
            match check_found(&StdFs, &stem, &files) {
                Ok(meta) => listing.entries.push(ListedEntry {
                    meta_path: meta_path.clone(),
                    meta,
                }),
                Err(Check::Invalid(reason)) => listing.invalid.push(InvalidEntry {
                    path: meta_path.clone(),
                    reason,
                }),
                Err(Check::Unreadable(e)) => listing.invalid.push(InvalidEntry {
                    path: meta_path.clone(),
                    reason: format!("cannot read: {e}"),
                }),
            }
        }
        listing
            .entries
            .sort_by(|a, b| (&a.meta.url, &a.meta.vary).cmp(&(&b.meta.url, &b.meta.vary)));
        listing.invalid.sort_by(|a, b| a.path.cmp(&b.path));
        Ok(listing)
    }
}

impl ListedEntry {
    /// The entry's normalised URL.
    pub fn url(&self) -> &str {
        &self.meta.url
    }

    /// The first stored value of response header `name` (lower case).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.meta
            .headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The stored headers as a map; a pair that is no longer a valid
    /// header is left out.
    pub fn headers(&self) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in &self.meta.headers {
            if let (Ok(name), Ok(value)) = (
                HeaderName::from_bytes(name.as_bytes()),
                HeaderValue::from_str(value),
            ) {
                map.append(name, value);
            }
        }
        map
    }

    /// Its current age and freshness lifetime at `now` (Unix seconds), as
    /// a shared or a private (`--private`) cache counts them.
    pub fn age(&self, now: u64, shared: bool) -> Age {
        let status = StatusCode::from_u16(self.meta.status).unwrap_or(StatusCode::OK);
        Age::of_stored(status, &self.headers(), self.meta.stored_at, now, shared)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::meta::{Completeness, NewEntry};
    use crate::cache::{CacheKey, CacheStore};

    fn put(store: &CacheStore, key: &CacheKey, body: &[u8], headers: &[(&str, &str)]) {
        let mut w = store.begin(key).unwrap();
        w.write_body(body).unwrap();
        let entry = NewEntry {
            status: 200,
            headers: headers
                .iter()
                .map(|(n, v)| (n.to_string(), v.to_string()))
                .collect(),
            stored_at: 1_000,
            completeness: Completeness::Complete,
            shareable_as_basis: true,
            complete_len: None,
        };
        w.commit(entry, b"sig").unwrap();
    }

    #[test]
    fn lists_entries_sorted_reports_invalid_ones_and_changes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let store = CacheStore::open(root, 1 << 20).unwrap();
        let b = CacheKey::parse("http://e.com/b").unwrap();
        let a = CacheKey::parse("http://e.com/a").unwrap();
        let a_gzip = a.clone().with_vary("accept-encoding", b"gzip").unwrap();
        let broken = CacheKey::parse("http://e.com/broken").unwrap();
        put(&store, &b, b"bbb", &[("Cache-Control", "max-age=60")]);
        put(&store, &a_gzip, b"gzipped", &[("etag", "\"v1\"")]);
        put(&store, &a, b"plain", &[]);
        put(&store, &broken, b"12345", &[]);
        // While the store is open: a truncated body, a temp file, an
        // orphaned body, a foreign file.
        let stem = root.join(broken.entry_path());
        std::fs::write(stem.with_extension("body"), b"12").unwrap();
        std::fs::write(root.join("tmp/x.body.tmp"), b"half").unwrap();
        let orphan = root.join(CacheKey::parse("http://e.com/o").unwrap().entry_path());
        std::fs::write(orphan.with_extension("body"), b"o").unwrap();

        let listing = Listing::read(root).unwrap();
        let urls: Vec<(&str, usize)> = listing
            .entries
            .iter()
            .map(|e| (e.url(), e.meta.vary.len()))
            .collect();
        assert_eq!(
            urls,
            [
                ("http://e.com/a", 0),
                ("http://e.com/a", 1),
                ("http://e.com/b", 0)
            ]
        );
        assert_eq!(listing.entries[1].meta.body_len, 7);
        assert_eq!(listing.entries[1].header("ETag"), Some("\"v1\""));
        let b_age = listing.entries[2].age(1_010, true);
        assert_eq!((b_age.current, b_age.lifetime), (10, 60));
        assert_eq!(listing.invalid.len(), 1);
        assert_eq!(listing.invalid[0].path, stem.with_extension("meta"));
        assert!(listing.invalid[0].reason.contains("body is 2 bytes"));
        // Nothing was cleaned or quarantined under the open store.
        assert!(root.join("tmp/x.body.tmp").exists());
        assert!(orphan.with_extension("body").exists());
        assert!(stem.with_extension("meta").exists());
        assert_eq!(store.len(), 4);
    }

    #[test]
    fn a_missing_directory_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("nope");
        assert!(Listing::read(&missing).is_err());
        assert!(!missing.exists(), "reading created it");
    }
}
