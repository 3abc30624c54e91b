//! Basis selection: which cached entry's signature to send upstream for a
//! request. Pure: no I/O, no clock.
//!
//! Rules, in order:
//!
//! 1. Only entries with the same scheme and authority as the request (D-B1):
//!    a signature leaks block hashes of its body to whoever receives it.
//! 2. In a shared cache, never entries marked not shareable (responses to
//!    credentialed requests, `Cache-Control: private`, `Set-Cookie`; A-6).
//!    A single user's private cache may use them.
//! 3. An entry of another media type than the request, as their file
//!    extensions tell ([`media_class`]: `.htm` is `.html`, `.mjs` is `.js`,
//!    no extension is a document like `.html`), never qualifies: its
//!    signature costs more than it saves (a page as the basis of a script
//!    took 25.4 KB on the link where none took 18.6 KB; issue 20).
//! 4. An exact match wins; then an entry with the same file name in a
//!    directory shared with the request (another release of the same file:
//!    `/jquery/3.6.4/jquery.js` for `/jquery/3.7.0/jquery.js`, rather than
//!    `/jquery/3.7.0/jquery.min.js` whose prefix is longer); then the
//!    longest common prefix of path and query. Ties go to the same file
//!    extension; then, among the candidates left, one less than half the
//!    size of another is dropped (a stub or a broken release of the file:
//!    lodash 4.17.16 is 20 KB between two 540 KB releases, and as the basis
//!    of 4.17.19 it cost 88 KB on the link where 4.17.15 costs 10); then the
//!    newest wins, then the smallest URL, so the choice is deterministic.
//!
//! Partial entries are allowed: a prefix is a fine basis for its own URL.
//! What it leaves out: freshness (a stale entry is still a good basis) and
//! stored `Content-Type`s (the extension stands in for them: the request
//! has none yet).
//!
//! Main items: [`select_basis`], [`CacheScope`].

use std::cmp::Ordering;

use super::key::CacheKey;
use super::meta::IndexEntry;

/// Whom the cache serves, which decides whether private entries may be bases.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CacheScope {
    /// Several users share the proxy: private entries are never bases.
    #[default]
    Shared,
    /// The proxy serves one user only: private entries are bases too.
    Private,
}

/// Picks the basis for `url` among `candidates` (a slice, or the store's
/// entries for the origin), or `None` when no entry may be used.
pub fn select_basis<'a>(
    candidates: impl IntoIterator<Item = &'a IndexEntry>,
    url: &CacheKey,
    scope: CacheScope,
) -> Option<&'a IndexEntry> {
    let wanted = url.path_and_query().as_bytes();
    let ext = url.extension();
    let name = url.file_name();
    let ranked: Vec<(&IndexEntry, Rank)> = candidates
        .into_iter()
        .filter(|c| c.key.origin() == url.origin())
        // An error page or a redirect is no release of anything.
        .filter(|c| c.status == 200)
        .filter(|c| c.shareable_as_basis || scope == CacheScope::Private)
        .filter_map(|c| {
            let candidate = c.key.path_and_query().as_bytes();
            let prefix = common_prefix_len(candidate, wanted);
            let shares_directory = wanted[..prefix].iter().skip(1).any(|&b| b == b'/');
            if media_class(c.key.extension()) != media_class(ext) {
                return None;
            }
            let rank = Rank {
                exact: candidate == wanted,
                same_name: !name.is_empty() && shares_directory && c.key.file_name() == name,
                prefix,
                same_ext: ext.is_some() && c.key.extension() == ext,
            };
            Some((c, rank))
        })
        .collect();
    let best = ranked.iter().map(|(_, rank)| rank).max()?;
    let best: Vec<&IndexEntry> = ranked
        .iter()
        .filter(|(_, rank)| rank == best)
        .map(|(c, _)| *c)
        .collect();
    let largest = best.iter().map(|c| c.body_len).max()?;
    best.into_iter()
        .filter(|c| c.body_len >= largest / 2)
        .max_by(|a, b| {
            (a.stored_at, a.commit_order)
                .cmp(&(b.stored_at, b.commit_order))
                // Smaller URL wins the last tie, hence reversed.
                .then_with(|| b.key.url().cmp(a.key.url()))
                .then_with(|| vary_order(b, a))
        })
}

/// How well a candidate fits, best last (fields compare in order).
#[derive(PartialEq, Eq, PartialOrd, Ord)]
struct Rank {
    exact: bool,
    same_name: bool,
    prefix: usize,
    same_ext: bool,
}

/// The media type a file extension stands for, as far as basis choice
/// cares: extensions of one type (`htm`, `html`) or of pages generated
/// server-side (`php`, none at all) share a class.
pub fn media_class(extension: Option<&str>) -> String {
    let Some(extension) = extension else {
        return "html".to_owned();
    };
    let extension = extension.to_ascii_lowercase();
    match extension.as_str() {
        "htm" | "xhtml" | "shtml" | "php" | "asp" | "aspx" | "jsp" => "html".to_owned(),
        "mjs" | "cjs" => "js".to_owned(),
        "jpeg" => "jpg".to_owned(),
        "tif" => "tiff".to_owned(),
        _ => extension,
    }
}

fn vary_order(a: &IndexEntry, b: &IndexEntry) -> Ordering {
    a.key.vary().cmp(b.key.vary())
}

fn common_prefix_len(a: &[u8], b: &[u8]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::meta::Completeness;

    fn entry(url: &str, stored_at: u64) -> IndexEntry {
        IndexEntry {
            key: CacheKey::parse(url).unwrap(),
            stored_at,
            commit_order: stored_at,
            body_len: 1,
            body_blake3: blake3::hash(url.as_bytes()),
            completeness: Completeness::Complete,
            shareable_as_basis: true,
            status: 200,
        }
    }

    fn pick<'a>(c: &'a [IndexEntry], url: &str) -> Option<&'a str> {
        select_basis(c, &CacheKey::parse(url).unwrap(), CacheScope::Shared).map(|e| e.key.url())
    }

    #[test]
    fn another_media_type_is_no_basis_even_in_the_same_directory() {
        let c = [entry("http://e.com/index.html", 9)];
        assert_eq!(pick(&c, "http://e.com/lib/app.js"), None);
        assert_eq!(
            pick(&c, "http://e.com/about.html"),
            Some("http://e.com/index.html")
        );
        let c = [entry("http://e.com/lib/readme.txt", 9)];
        assert_eq!(pick(&c, "http://e.com/lib/app.js"), None);
        // Extensions of one type, and pages without one, share a class.
        let c = [entry("http://e.com/news/index.htm", 9)];
        assert_eq!(
            pick(&c, "http://e.com/news/today"),
            Some("http://e.com/news/index.htm")
        );
        let c = [entry("http://e.com/lib/app.MJS", 9)];
        assert_eq!(
            pick(&c, "http://e.com/lib/util.js"),
            Some("http://e.com/lib/app.MJS")
        );
    }

    #[test]
    fn entries_stored_in_the_same_second_go_by_their_commit_order() {
        let committed = |url: &str, commit_order: u64| IndexEntry {
            commit_order,
            ..entry(url, 100)
        };
        // A quick sequence of releases: the one committed last is the
        // newest, whatever order the candidates come in.
        let c = [
            committed("http://e.com/lib/1.1/lib.js", 2),
            committed("http://e.com/lib/1.2/lib.js", 3),
            committed("http://e.com/lib/1.0/lib.js", 1),
        ];
        assert_eq!(
            pick(&c, "http://e.com/lib/1.3/lib.js"),
            Some("http://e.com/lib/1.2/lib.js")
        );
    }

    #[test]
    fn exact_match_wins_over_longer_and_newer_neighbours() {
        let c = [
            entry("http://e.com/a/b/c.js", 1),
            entry("http://e.com/a/b/c.js.map", 9),
            entry("http://e.com/a/b/", 9),
        ];
        assert_eq!(
            pick(&c, "http://e.com/a/b/c.js"),
            Some("http://e.com/a/b/c.js")
        );
    }

    #[test]
    fn another_release_of_the_same_file_beats_a_longer_prefix() {
        let c = [
            entry("http://e.com/lib/5.2.3/bootstrap.min.css", 1),
            entry("http://e.com/lib/5.2.0/bootstrap.min.css", 2),
            entry("http://e.com/lib/5.3.0/bootstrap.css", 9),
        ];
        // Both releases share "/lib/5." with the request: the newer wins.
        assert_eq!(
            pick(&c, "http://e.com/lib/5.3.0/bootstrap.min.css"),
            Some("http://e.com/lib/5.2.0/bootstrap.min.css")
        );
        // Without a release of it, the longest prefix decides again.
        assert_eq!(
            pick(&c, "http://e.com/lib/5.3.0/bootstrap.rtl.css"),
            Some("http://e.com/lib/5.3.0/bootstrap.css")
        );
        // The same name in no shared directory is no reason.
        let c = [
            entry("http://e.com/a/app.js", 9),
            entry("http://e.com/b/c/util.js", 1),
        ];
        assert_eq!(
            pick(&c, "http://e.com/b/c/app.js"),
            Some("http://e.com/b/c/util.js")
        );
    }

    #[test]
    fn a_release_less_than_half_the_size_of_another_is_passed_over() {
        let sized = |url: &str, stored_at: u64, body_len: u64| IndexEntry {
            body_len,
            ..entry(url, stored_at)
        };
        let c = [
            sized("http://e.com/lodash/4.17.15/lodash.js", 1, 540_512),
            sized("http://e.com/lodash/4.17.16/lodash.js", 2, 20_666),
        ];
        assert_eq!(
            pick(&c, "http://e.com/lodash/4.17.19/lodash.js"),
            Some("http://e.com/lodash/4.17.15/lodash.js")
        );
        // Within half the size, the newest still wins.
        let c = [
            sized("http://e.com/lodash/4.17.15/lodash.js", 1, 540_512),
            sized("http://e.com/lodash/4.17.16/lodash.js", 2, 280_000),
        ];
        assert_eq!(
            pick(&c, "http://e.com/lodash/4.17.19/lodash.js"),
            Some("http://e.com/lodash/4.17.16/lodash.js")
        );
        // A better rank is never passed over for its size: a small entry
        // of the same URL (a partial one, say) is still the basis.
        let c = [
            sized("http://e.com/lodash/4.17.15/lodash.js", 1, 540_512),
            sized("http://e.com/lodash/4.17.19/lodash.js", 2, 1_000),
        ];
        assert_eq!(
            pick(&c, "http://e.com/lodash/4.17.19/lodash.js"),
            Some("http://e.com/lodash/4.17.19/lodash.js")
        );
    }

    #[test]
    fn longest_prefix_wins() {
        let c = [
            entry("http://e.com/a/x.html", 9),
            entry("http://e.com/a/b/y.html", 1),
        ];
        assert_eq!(
            pick(&c, "http://e.com/a/b/z.html"),
            Some("http://e.com/a/b/y.html")
        );
    }

    #[test]
    fn equal_length_prefixes_go_to_the_newest_of_the_media_type() {
        let c = [
            entry("http://e.com/d/1.css", 5),
            entry("http://e.com/d/2.js", 1),
            entry("http://e.com/d/3.js", 3),
            entry("http://e.com/d/4.js", 2),
        ];
        assert_eq!(pick(&c, "http://e.com/d/9.js"), Some("http://e.com/d/3.js"));
        // No candidate of its media type: none.
        assert_eq!(pick(&c, "http://e.com/d/9.png"), None);
    }

    #[test]
    fn equal_everything_is_deterministic() {
        let a = [entry("http://e.com/x/a", 1), entry("http://e.com/x/b", 1)];
        let b = [a[1].clone(), a[0].clone()];
        assert_eq!(pick(&a, "http://e.com/x/c"), pick(&b, "http://e.com/x/c"));
    }

    #[test]
    fn no_candidate_gives_none() {
        assert_eq!(pick(&[], "http://e.com/a"), None);
    }

    #[test]
    fn d_b1_other_scheme_or_authority_is_never_a_basis() {
        let c = [
            entry("https://e.com/a/b", 1),
            entry("http://e.com:8080/a/b", 1),
            entry("http://other.com/a/b", 1),
            entry("http://sub.e.com/a/b", 1),
        ];
        assert_eq!(pick(&c, "http://e.com/a/b"), None);
        assert_eq!(pick(&c, "https://e.com/a/b"), Some("https://e.com/a/b"));
    }

    #[test]
    fn a6_private_entry_is_a_basis_only_in_a_private_cache() {
        let mut private = entry("http://e.com/account", 9);
        private.shareable_as_basis = false;
        let c = [private, entry("http://e.com/other", 1)];
        let url = CacheKey::parse("http://e.com/account").unwrap();
        assert_eq!(
            select_basis(&c, &url, CacheScope::Shared).map(|e| e.key.url()),
            Some("http://e.com/other")
        );
        assert_eq!(
            select_basis(&c, &url, CacheScope::Private).map(|e| e.key.url()),
            Some("http://e.com/account")
        );
        assert_eq!(select_basis(&c[..1], &url, CacheScope::Shared), None);
    }

    #[test]
    fn partial_entry_is_a_basis() {
        let mut partial = entry("http://e.com/big.iso", 1);
        partial.completeness = Completeness::Partial;
        assert_eq!(
            pick(&[partial], "http://e.com/big.iso"),
            Some("http://e.com/big.iso")
        );
    }
}
