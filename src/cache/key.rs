//! Cache keys: a normalised absolute URL plus the values of the request
//! headers the response varies on, and the relative path an entry lives at.
//!
//! Normalisation (P-21) makes equivalent spellings of one URL share an entry:
//!
//! * scheme and host are lower-cased; only `http` and `https` are accepted;
//! * the default port (80 for http, 443 for https) and an empty port are
//!   dropped, other ports lose leading zeros;
//! * an empty path becomes `/`;
//! * `%xx` escapes of unreserved characters (`A-Z a-z 0-9 - . _ ~`) are
//!   decoded, other escapes get upper-case hex digits, and bytes that may not
//!   appear raw in a URI (controls, space, non-ASCII, `"<>\^`{|}`, a stray
//!   `%`) are escaped — so a raw UTF-8 path and its escaped form agree;
//! * the fragment is dropped.
//!
//! Deliberately **not** merged: `%2F` and `/` (an origin may route them
//! differently), an empty query `?` and no query (RFC 3986 §6.2.3 keeps them
//! apart and so do common origins), dot segments (`/a/../b` is forwarded as
//! written, so it is cached as written), and Unicode NFC/NFD variants (they are
//! different bytes on the wire). Keeping them apart only costs a miss; merging
//! them wrongly would serve one resource for another.
//!
//! Headers that are not named by `Vary` are never part of the key (P-19), so
//! `X-Forwarded-Host` and friends cannot split or poison entries. Vary'd
//! credential headers (`Authorization`, `Cookie`) are keyed by their blake3
//! only, so credentials never reach the disk or the logs.
//!
//! The on-disk name of an entry is derived from the blake3 hash of the whole
//! key, never from URL text, so no URL can escape the cache root (C-P1). The
//! metadata stores the full key and reads compare it (C-P2).
//!
//! Main type: [`CacheKey`]; errors: [`KeyError`].

use std::fmt;
use std::path::PathBuf;

/// Longest URL accepted as a key, in bytes (request lines are capped well
/// below this, so only hostile input reaches it).
pub const MAX_URL_LEN: usize = 64 * 1024;

/// Longest host kept verbatim in the per-authority directory name, in bytes.
const MAX_DIR_HOST_LEN: usize = 100;

/// Why a URL or a Vary'd header could not become a cache key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    /// The URL is longer than [`MAX_URL_LEN`].
    #[error("URL of {len} bytes is longer than the limit of {max}")]
    UrlTooLong {
        /// Length of the URL in bytes.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// The URL is not absolute (`scheme://authority...`).
    #[error("URL {url:?} is not absolute")]
    NotAbsolute {
        /// The URL as given.
        url: String,
    },
    /// The scheme is neither `http` nor `https`.
    #[error("scheme {scheme:?} is not cacheable")]
    UnsupportedScheme {
        /// The scheme as given.
        scheme: String,
    },
    /// The authority carries `user:password@`, which a proxy must not key on.
    #[error("URL {url:?} carries user information")]
    UserInfo {
        /// The URL as given.
        url: String,
    },
    /// The host is empty or has characters a host cannot have.
    #[error("invalid host {host:?}")]
    InvalidHost {
        /// The host as given.
        host: String,
    },
    /// The port is not a number in 0..=65535.
    #[error("invalid port {port:?}")]
    InvalidPort {
        /// The port as given.
        port: String,
    },
    /// A stored credential value is not in its hashed form.
    #[error("stored value of Vary header {name:?} is not a hash")]
    InvalidVaryValue {
        /// The header name.
        name: String,
    },
    /// A Vary'd header name is not an HTTP token.
    #[error("invalid Vary header name {name:?}")]
    InvalidHeaderName {
        /// The name as given.
        name: String,
    },
}

/// A normalised cache key: the canonical URL plus the Vary'd request header
/// values, sorted by header name.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CacheKey {
    /// `scheme://host[:port]path[?query]`, normalised.
    url: String,
    /// `url[..origin_len]` is `scheme://host[:port]`.
    origin_len: usize,
    /// Length of the scheme within `url`.
    scheme_len: usize,
    /// (lower-case name, escaped value), sorted by name, names unique.
    vary: Vec<(String, String)>,
}

impl CacheKey {
    /// Parses and normalises an absolute `http`/`https` URL (see the module
    /// docs for the rules).
    ///
    /// # Errors
    ///
    /// [`KeyError`] when the URL is too long, not absolute, has another
    /// scheme, carries user information, or has an invalid host or port.
    pub fn parse(url: &str) -> Result<CacheKey, KeyError> {
        if url.len() > MAX_URL_LEN {
            return Err(KeyError::UrlTooLong {
                len: url.len(),
                max: MAX_URL_LEN,
            });
        }
        let Some((scheme, rest)) = url.split_once("://") else {
            return Err(KeyError::NotAbsolute { url: url.into() });
        };
        let scheme = scheme.to_ascii_lowercase();
        let default_port = match scheme.as_str() {
            "http" => 80,
            "https" => 443,
            _ => return Err(KeyError::UnsupportedScheme { scheme }),
        };
        // The fragment is never sent upstream, so it is never part of the key.
        let rest = rest.split_once('#').map_or(rest, |(before, _)| before);
        let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
        let (authority, path_and_query) = rest.split_at(authority_end);
        if authority.contains('@') {
            return Err(KeyError::UserInfo { url: url.into() });
        }
        let (host, port) = split_host_port(authority)?;
        let port = match port {
            Some(p) if p != default_port => Some(p),
            _ => None,
        };

        let mut out = String::with_capacity(url.len() + 8);
        out.push_str(&scheme);
        out.push_str("://");
        out.push_str(&host);
        if let Some(p) = port {
            out.push(':');
            out.push_str(&p.to_string());
        }
        let origin_len = out.len();
        let (path, query) = match path_and_query.split_once('?') {
            Some((p, q)) => (p, Some(q)),
            None => (path_and_query, None),
        };
        if path.is_empty() {
            out.push('/');
        } else {
            normalise_component(path, false, &mut out);
        }
        if let Some(q) = query {
            out.push('?');
            normalise_component(q, true, &mut out);
        }
        Ok(CacheKey {
            url: out,
            origin_len,
            scheme_len: scheme.len(),
            vary: Vec::new(),
        })
    }

    /// Adds the value of one request header named by the response's `Vary`.
    /// Call it once per header name with the field's combined value; a repeat
    /// replaces the earlier value. Surrounding whitespace is trimmed and
    /// bytes outside visible ASCII (and `%`) are `%xx`-escaped, so the key
    /// string stays injective. Values of credential headers
    /// (`Authorization`, `Proxy-Authorization`, `Cookie`) are replaced by
    /// `blake3:<hex>` of the value, so no credential reaches the metadata
    /// file or a log line.
    ///
    /// # Errors
    ///
    /// [`KeyError::InvalidHeaderName`] when `name` is not an HTTP token.
    pub fn with_vary(mut self, name: &str, value: &[u8]) -> Result<CacheKey, KeyError> {
        if name.is_empty() || !name.bytes().all(crate::http::head_guard::is_tchar) {
            return Err(KeyError::InvalidHeaderName { name: name.into() });
        }
        let name = name.to_ascii_lowercase();
        let value = value.trim_ascii();
        // Always hashed, even a value that looks hashed already, so nobody
        // can send another user's stored hash as their credential.
        let value = if is_credential(&name) {
            format!("{HASHED_PREFIX}{}", blake3::hash(value).to_hex())
        } else if CASE_INSENSITIVE_LISTS.contains(&name.as_str()) {
            escape_header_value(&normalised_list(value))
        } else {
            escape_header_value(value)
        };
        self.insert_vary(name, value);
        Ok(self)
    }

    fn insert_vary(&mut self, name: String, value: String) {
        match self.vary.binary_search_by(|(n, _)| n.as_str().cmp(&name)) {
            Ok(i) => self.vary[i].1 = value,
            Err(i) => self.vary.insert(i, (name, value)),
        }
    }

    /// Rebuilds a key from its stored parts (the metadata's `url` and
    /// `vary`), normalising again.
    ///
    /// # Errors
    ///
    /// As [`CacheKey::parse`] and [`CacheKey::with_vary`].
    pub fn from_parts(url: &str, vary: &[(String, String)]) -> Result<CacheKey, KeyError> {
        let mut key = CacheKey::parse(url)?;
        for (name, value) in vary {
            let lower = name.to_ascii_lowercase();
            if is_credential(&lower) {
                // Stored already hashed: taken as it is, if well-formed.
                let hex = value.strip_prefix(HASHED_PREFIX).unwrap_or_default();
                if hex.len() != 64 || !hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
                    return Err(KeyError::InvalidVaryValue { name: lower });
                }
                key.insert_vary(lower, value.clone());
            } else {
                key = key.with_vary(name, &unescape(value))?;
            }
        }
        Ok(key)
    }

    /// The normalised URL, `scheme://host[:port]path[?query]`.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The scheme, `http` or `https`.
    pub fn scheme(&self) -> &str {
        &self.url[..self.scheme_len]
    }

    /// `scheme://host[:port]`: entries may only serve as bases for URLs with
    /// the same origin (D-B1).
    pub fn origin(&self) -> &str {
        &self.url[..self.origin_len]
    }

    /// The path and query, starting with `/`.
    pub fn path_and_query(&self) -> &str {
        &self.url[self.origin_len..]
    }

    /// The path without the query, starting with `/`.
    pub fn path(&self) -> &str {
        let pq = self.path_and_query();
        pq.split_once('?').map_or(pq, |(p, _)| p)
    }

    /// The last path segment (`jquery.js` of `/jquery/3.7.1/jquery.js`);
    /// empty for a path that ends in `/`.
    pub fn file_name(&self) -> &str {
        self.path().rsplit('/').next().unwrap_or("")
    }

    /// The extension of the last path segment (`"js"` for `/a/app.min.js`),
    /// if it has one.
    pub fn extension(&self) -> Option<&str> {
        let segment = self.path().rsplit('/').next()?;
        match segment.rsplit_once('.') {
            Some((stem, ext)) if !stem.is_empty() && !ext.is_empty() => Some(ext),
            _ => None,
        }
    }

    /// The Vary'd request header values, `(lower-case name, escaped value)`
    /// sorted by name.
    pub fn vary(&self) -> &[(String, String)] {
        &self.vary
    }

    /// The blake3 hash of the whole key (URL and Vary'd values): the entry's
    /// file name and its identity in the index.
    pub fn digest(&self) -> blake3::Hash {
        let mut h = blake3::Hasher::new();
        h.update(self.url.as_bytes());
        for (name, value) in &self.vary {
            // Neither part can contain '\n' (names are tokens, values are
            // escaped), so this encoding is injective.
            h.update(b"\n");
            h.update(name.as_bytes());
            h.update(b": ");
            h.update(value.as_bytes());
        }
        h.finalize()
    }

    /// The name of the per-authority directory: `scheme_host_port`, with
    /// characters outside `[a-z0-9.-]` replaced by `_` and a long host cut
    /// short. It only groups files; it need not be injective because the
    /// file name is the hash of the whole key.
    pub fn authority_dir(&self) -> String {
        let scheme = self.scheme();
        let host_and_port = &self.url[self.scheme_len + 3..self.origin_len];
        // An IPv6 literal ends in ']', so the port is after the last ':' only
        // when that ':' follows the host.
        let (host, port) = match host_and_port.rsplit_once(':') {
            Some((h, p)) if !p.contains(']') => (h, p),
            _ if scheme == "https" => (host_and_port, "443"),
            _ => (host_and_port, "80"),
        };
        let mut dir = String::with_capacity(scheme.len() + host.len() + 8);
        dir.push_str(scheme);
        dir.push('_');
        for c in host.chars().take(MAX_DIR_HOST_LEN) {
            dir.push(
                if c.is_ascii_lowercase() || c.is_ascii_digit() || c == '.' || c == '-' {
                    c
                } else {
                    '_'
                },
            );
        }
        dir.push('_');
        dir.push_str(port);
        dir
    }

    /// The entry's path relative to the cache root, without extension:
    /// `<authority_dir>/<blake3 hex of the key>`. The store appends `.body`,
    /// `.sig` and `.meta`. Both components are made of `[a-z0-9._-]`, start
    /// with a letter or digit and are at most ~120 bytes, so the path stays
    /// under the root whatever the URL (C-P1).
    pub fn entry_path(&self) -> PathBuf {
        let mut p = PathBuf::from(self.authority_dir());
        p.push(self.digest().to_hex().as_str());
        p
    }
}

/// The URL and the names (not the values) of the Vary'd headers, for logs.
impl fmt::Display for CacheKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.url)?;
        for (name, _) in &self.vary {
            write!(f, " [vary {name}]")?;
        }
        Ok(())
    }
}

/// Splits `host[:port]` (or `[v6]:port`), lower-casing and validating the
/// host. An empty port counts as absent (RFC 3986 §6.2.3).
fn split_host_port(authority: &str) -> Result<(String, Option<u16>), KeyError> {
    let bad_host = || KeyError::InvalidHost {
        host: authority.into(),
    };
    let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
        let (inner, after) = v6.split_once(']').ok_or_else(bad_host)?;
        if inner.is_empty()
            || !inner
                .bytes()
                .all(|b| b.is_ascii_hexdigit() || b == b':' || b == b'.')
        {
            return Err(bad_host());
        }
        let port = match after {
            "" => None,
            p => Some(p.strip_prefix(':').ok_or_else(bad_host)?),
        };
        (format!("[{}]", inner.to_ascii_lowercase()), port)
    } else {
        let (host, port) = match authority.split_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (authority, None),
        };
        if host.is_empty()
            || !host
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~'))
        {
            return Err(bad_host());
        }
        (host.to_ascii_lowercase(), port)
    };
    let port = match port {
        None | Some("") => None,
        Some(p) => {
            let invalid = || KeyError::InvalidPort { port: p.into() };
            if p.len() > 5 || !p.bytes().all(|b| b.is_ascii_digit()) {
                return Err(invalid());
            }
            Some(p.parse::<u16>().map_err(|_| invalid())?)
        }
    };
    Ok((host, port))
}

/// Marks a Vary'd value that was replaced by its hash.
const HASHED_PREFIX: &str = "blake3:";

/// Request headers whose values are credentials: keyed by hash only.
fn is_credential(lower_name: &str) -> bool {
    matches!(
        lower_name,
        "authorization" | "proxy-authorization" | "cookie"
    )
}

/// RFC 3986 unreserved characters.
fn is_unreserved(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~')
}

/// Characters kept raw in a normalised path (or query, which also keeps `?`).
fn is_kept_raw(b: u8, in_query: bool) -> bool {
    is_unreserved(b)
        || matches!(
            b,
            b'!' | b'$'
                | b'&'
                | b'\''
                | b'('
                | b')'
                | b'*'
                | b'+'
                | b','
                | b';'
                | b'='
                | b':'
                | b'@'
                | b'/'
        )
        || (in_query && b == b'?')
}

fn push_escaped(b: u8, out: &mut String) {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    out.push('%');
    out.push(char::from(HEX[usize::from(b >> 4)]));
    out.push(char::from(HEX[usize::from(b & 0xf)]));
}

fn hex_value(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

/// Appends the normalised form of a path or query to `out`. The output only
/// holds kept-raw characters and `%XX` escapes of other bytes, so running it
/// again changes nothing (idempotence, F-1).
fn normalise_component(s: &str, in_query: bool, out: &mut String) {
    let bytes = s.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        if b == b'%' {
            let hi = bytes.get(i + 1).copied().and_then(hex_value);
            let lo = bytes.get(i + 2).copied().and_then(hex_value);
            if let (Some(hi), Some(lo)) = (hi, lo) {
                let v = hi << 4 | lo;
                if is_unreserved(v) {
                    out.push(char::from(v));
                } else {
                    push_escaped(v, out);
                }
                i += 3;
                continue;
            }
            // A stray '%' is not a valid URI character: escape it.
            push_escaped(b'%', out);
        } else if is_kept_raw(b, in_query) {
            out.push(char::from(b));
        } else {
            push_escaped(b, out);
        }
        i += 1;
    }
}

/// Undoes [`escape_header_value`] (and leaves anything else as it is).
fn unescape(value: &str) -> Vec<u8> {
    let bytes = value.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hi = bytes.get(i + 1).copied().and_then(hex_value);
        let lo = bytes.get(i + 2).copied().and_then(hex_value);
        match (bytes[i], hi, lo) {
            (b'%', Some(hi), Some(lo)) => {
                out.push(hi << 4 | lo);
                i += 3;
            }
            (b, _, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    out
}

/// Escapes a header value: visible ASCII and space stay, `%` and everything
/// else become `%XX`.
fn escape_header_value(value: &[u8]) -> String {
    let mut out = String::with_capacity(value.len());
    for &b in value {
        if (b == b' ' || b.is_ascii_graphic()) && b != b'%' {
            out.push(char::from(b));
        } else {
            push_escaped(b, &mut out);
        }
    }
    out
}

/// Selecting headers whose values are lists of case-insensitive tokens
/// (with parameters), in which neither case, whitespace nor member order
/// changes the meaning: their values are normalised before they key an
/// entry (RFC 9111 §4.1 lets a cache do so), so `gzip, br` and `BR,gzip`
/// select the same one.
const CASE_INSENSITIVE_LISTS: [&str; 4] = [
    "accept",
    "accept-charset",
    "accept-encoding",
    "accept-language",
];

/// `value` as a sorted, lower-case list: members trimmed, whitespace
/// around `;` and `=` dropped, empty members left out, joined by `, `.
/// A quoted string is left as it is (its case may matter).
fn normalised_list(value: &[u8]) -> Vec<u8> {
    if value.contains(&b'"') {
        return value.to_vec();
    }
    let text = String::from_utf8_lossy(value).to_ascii_lowercase();
    let mut members: Vec<String> = text
        .split(',')
        .map(|member| {
            member
                .split(';')
                .map(|part| part.split('=').map(str::trim).collect::<Vec<_>>().join("="))
                .collect::<Vec<_>>()
                .join(";")
        })
        .filter(|member| !member.is_empty())
        .collect();
    members.sort();
    members.join(", ").into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::path::Component;

    fn key(url: &str) -> CacheKey {
        CacheKey::parse(url).expect("test URL parses")
    }

    #[test]
    fn p21_equivalent_forms_share_a_key() {
        let k = key("http://example.com/a");
        assert_eq!(key("HTTP://Example.COM:80/a"), k);
        assert_eq!(key("http://example.com/%61"), k);
        assert_eq!(key("http://example.com/a#frag"), k);
        assert_eq!(key("http://example.com:/a"), k);
        assert_eq!(key("http://example.com:0080/a"), k);
        assert_eq!(key("https://x.org:443").url(), "https://x.org/");
        assert_eq!(key("http://x.org?q").url(), "http://x.org/?q");
    }

    #[test]
    fn p21_slash_escape_and_empty_query_stay_distinct() {
        assert_ne!(key("http://e.com/a%2Fb"), key("http://e.com/a/b"));
        assert_ne!(key("http://e.com/a?"), key("http://e.com/a"));
        assert_eq!(key("http://e.com/a%2fb").url(), "http://e.com/a%2Fb");
        assert_ne!(key("http://e.com:8080/a"), key("http://e.com/a"));
        assert_ne!(key("https://e.com/a"), key("http://e.com/a"));
    }

    #[test]
    fn raw_unicode_and_its_escape_agree() {
        assert_eq!(key("http://e.com/€"), key("http://e.com/%e2%82%ac"));
        assert_eq!(key("http://e.com/a b").url(), "http://e.com/a%20b");
        assert_eq!(key("http://e.com/%zz").url(), "http://e.com/%25zz");
    }

    #[test]
    fn rejects_what_cannot_be_a_key() {
        assert!(matches!(
            CacheKey::parse("/relative"),
            Err(KeyError::NotAbsolute { .. })
        ));
        assert!(matches!(
            CacheKey::parse("ftp://e.com/"),
            Err(KeyError::UnsupportedScheme { .. })
        ));
        assert!(matches!(
            CacheKey::parse("http://u:p@e.com/"),
            Err(KeyError::UserInfo { .. })
        ));
        assert!(matches!(
            CacheKey::parse("http:///a"),
            Err(KeyError::InvalidHost { .. })
        ));
        assert!(matches!(
            CacheKey::parse("http://e.com:99999/"),
            Err(KeyError::InvalidPort { .. })
        ));
        assert!(matches!(
            CacheKey::parse("http://e.com:8x/"),
            Err(KeyError::InvalidPort { .. })
        ));
    }

    #[test]
    fn origin_path_and_extension() {
        let k = key("HTTPS://E.com:8443/dir/app.min.JS?x=1");
        assert_eq!(k.scheme(), "https");
        assert_eq!(k.origin(), "https://e.com:8443");
        assert_eq!(k.path(), "/dir/app.min.JS");
        assert_eq!(k.path_and_query(), "/dir/app.min.JS?x=1");
        assert_eq!(k.extension(), Some("JS"));
        assert_eq!(key("http://e.com/dir/").extension(), None);
        assert_eq!(key("http://e.com/.hidden").extension(), None);
        assert_eq!(k.authority_dir(), "https_e.com_8443");
        assert_eq!(key("http://[::1]:81/").authority_dir(), "http____1__81");
        assert_eq!(key("http://[::1]/").authority_dir(), "http____1__80");
    }

    #[test]
    fn rfc9111_4_1_selecting_lists_are_normalised_before_they_key() {
        let base = CacheKey::parse("http://example.com/a").unwrap();
        let key = |name: &str, value: &[u8]| base.clone().with_vary(name, value).unwrap();
        assert_eq!(
            key("Accept-Encoding", b"gzip, br"),
            key("accept-encoding", b" BR,gzip ")
        );
        assert_eq!(
            key("accept-language", b"en-US;q=0.8, fr"),
            key("accept-language", b"fr,en-us ; q = 0.8")
        );
        assert_ne!(
            key("accept-encoding", b"gzip"),
            key("accept-encoding", b"br")
        );
        // Other fields keep their case and order.
        assert_ne!(key("x-variant", b"A, b"), key("x-variant", b"b, a"));
    }

    #[test]
    fn vary_values_are_part_of_the_key_and_p19_unkeyed_headers_are_not() {
        let base = key("http://e.com/a");
        let gz = base
            .clone()
            .with_vary("Accept-Encoding", b" gzip ")
            .unwrap();
        let br = base.clone().with_vary("accept-encoding", b"br").unwrap();
        assert_ne!(gz.digest(), br.digest());
        assert_ne!(gz.digest(), base.digest());
        assert_eq!(gz.vary(), &[("accept-encoding".into(), "gzip".into())]);
        // Order of with_vary calls does not matter.
        let ab = base
            .clone()
            .with_vary("a", b"1")
            .unwrap()
            .with_vary("b", b"2");
        let ba = base
            .clone()
            .with_vary("b", b"2")
            .unwrap()
            .with_vary("a", b"1");
        assert_eq!(ab.unwrap(), ba.unwrap());
        // A newline in a value cannot forge a second header.
        let forged = base.clone().with_vary("a", b"1\nb: 2").unwrap();
        assert_ne!(forged.digest(), ab_hash(&base));
        assert!(base.clone().with_vary("bad name", b"x").is_err());
    }

    fn ab_hash(base: &CacheKey) -> blake3::Hash {
        base.clone()
            .with_vary("a", b"1")
            .and_then(|k| k.with_vary("b", b"2"))
            .unwrap()
            .digest()
    }

    #[test]
    fn credential_values_are_keyed_by_hash_and_never_shown() {
        let base = key("http://e.com/a");
        let alice = base
            .clone()
            .with_vary("Authorization", b"Basic YWxpY2U6cHc=")
            .unwrap();
        let bob = base
            .clone()
            .with_vary("Authorization", b"Basic Ym9iOnB3")
            .unwrap();
        assert_ne!(alice, bob);
        let stored = &alice.vary()[0].1;
        assert!(
            stored.starts_with("blake3:") && !stored.contains("YWxp"),
            "{stored}"
        );
        assert!(!alice.to_string().contains("YWxp"));
        assert_eq!(alice.to_string(), "http://e.com/a [vary authorization]");
        // The stored (hashed) form reads back as the same key ...
        assert_eq!(
            CacheKey::from_parts(alice.url(), alice.vary()).unwrap(),
            alice
        );
        // ... but sending the stored hash as a credential is another key.
        let replay = base
            .clone()
            .with_vary("authorization", stored.as_bytes())
            .unwrap();
        assert_ne!(replay, alice);
        let bad = [("authorization".to_string(), "Basic x".to_string())];
        assert!(CacheKey::from_parts(alice.url(), &bad).is_err());
    }

    #[test]
    fn from_parts_round_trips() {
        let k = key("http://e.com/a?b")
            .with_vary("Accept-Language", "fr\u{e9}".as_bytes())
            .unwrap();
        assert_eq!(CacheKey::from_parts(k.url(), k.vary()).unwrap(), k);
    }

    /// C-P1: every entry path is relative, made of normal components of at
    /// most 255 bytes.
    fn assert_contained(k: &CacheKey) {
        let p = k.entry_path();
        assert!(p.is_relative(), "{p:?}");
        let comps: Vec<_> = p.components().collect();
        assert_eq!(comps.len(), 2, "{p:?}");
        for c in comps {
            let Component::Normal(name) = c else {
                panic!("non-normal component in {p:?}");
            };
            // Room for the ".body"/".meta" extension the store appends.
            assert!(name.len() + 5 <= 255, "{p:?}");
            assert!(!name.to_string_lossy().starts_with(['.', '-']), "{p:?}");
        }
    }

    #[test]
    fn c_p1_adversarial_urls_stay_contained() {
        let long_segment = "a".repeat(300);
        let long_url = format!("http://e.com/{}", "x/".repeat(3000));
        let long_host = format!("http://{}.com/", "h".repeat(500));
        for url in [
            "http://e.com/../../etc/passwd",
            "http://e.com/%2e%2e%2f%2e%2e%2fetc",
            "http://e.com/..%2f..%2f",
            "http://e.com/%2e%2e/",
            "http://e.com/..\\..\\",
            "http://e.com/a%00b",
            "http://e.com/a\0b",
            "http://e.com/./.",
            "http://e.com/-rf",
            "http://e.com/caf\u{e9}",
            "http://e.com/cafe\u{301}",
            "http://..:80/",
            "http://.../",
            &format!("http://e.com/{long_segment}"),
            &long_url,
            &long_host,
        ] {
            assert_contained(&key(url));
        }
    }

    fn url_strategy() -> impl Strategy<Value = String> {
        let host = prop_oneof![
            "[a-zA-Z0-9.-]{1,20}",
            Just("..".to_string()),
            "\\[[0-9a-fA-F:]{1,10}\\]",
        ];
        let port = prop_oneof![Just(String::new()), "(:[0-9]{0,5})"];
        let segment = prop_oneof![
            Just("..".to_string()),
            Just(".".to_string()),
            Just("%2e%2e%2f".to_string()),
            Just("%2F".to_string()),
            Just("%00".to_string()),
            Just("\0".to_string()),
            Just("%".to_string()),
            "%[0-9a-fA-F]{2}",
            "\\PC{0,8}",
            "[a-z]{0,300}",
        ];
        (
            prop_oneof![Just("http"), Just("HTTPS"), Just("hTtP")],
            host,
            port,
            proptest::collection::vec(segment, 0..8),
            proptest::option::of("\\PC{0,10}"),
            proptest::option::of("\\PC{0,5}"),
        )
            .prop_map(|(scheme, host, port, segs, query, frag)| {
                let mut u = format!("{scheme}://{host}{port}");
                for s in segs {
                    u.push('/');
                    u.push_str(&s);
                }
                if let Some(q) = query {
                    u.push('?');
                    u.push_str(&q);
                }
                if let Some(f) = frag {
                    u.push('#');
                    u.push_str(&f);
                }
                u
            })
    }

    proptest! {
        /// F-1/F-3: normalise ∘ normalise = normalise, and containment.
        #[test]
        fn normalise_is_idempotent_and_contained(url in url_strategy()) {
            if let Ok(k) = CacheKey::parse(&url) {
                let again = CacheKey::parse(k.url()).expect("a normalised URL parses");
                prop_assert_eq!(&again, &k);
                assert_contained(&k);
            }
        }

        /// Arbitrary strings never panic and, when accepted, stay contained.
        #[test]
        fn arbitrary_input_never_escapes(s in "\\PC{0,64}", tail in "[\\x00-\\x7f]{0,64}") {
            for url in [format!("http://e.com/{s}{tail}"), s.clone(), format!("http://{s}")] {
                if let Ok(k) = CacheKey::parse(&url) {
                    let again = CacheKey::parse(k.url());
                    prop_assert_eq!(again.as_ref(), Ok(&k));
                    assert_contained(&k);
                }
            }
        }

        /// C-P2: distinct keys get distinct hashes (and so distinct files).
        #[test]
        fn distinct_keys_distinct_files(a in url_strategy(), b in url_strategy()) {
            if let (Ok(ka), Ok(kb)) = (CacheKey::parse(&a), CacheKey::parse(&b)) {
                prop_assert_eq!(ka == kb, ka.entry_path() == kb.entry_path());
            }
        }
    }

    #[test]
    fn very_long_url_is_contained_or_rejected() {
        let url = format!("http://e.com/{}", "a".repeat(5000));
        assert_contained(&key(&url));
        let too_long = format!("http://e.com/{}", "a".repeat(MAX_URL_LEN));
        assert!(matches!(
            CacheKey::parse(&too_long),
            Err(KeyError::UrlTooLong { .. })
        ));
    }
}
