//! What a stored entry's headers mean: which response headers are kept
//! (never framing, ours, or those that identify the one user answered:
//! [`IDENTIFYING_HEADERS`]) and replayed ([`stored_headers`]), which
//! request headers an entry varies on and how a request finds its variant
//! ([`find_entry`]), how old it is ([`ClientProxy::age_of`]), whether a 304
//! leaves it shareable, and the [`NewEntry`] a storable response opens
//! ([`ClientProxy::begin_entry`]).
//!
//! Leaves out when an entry may be served (RFC 9111 in
//! [`crate::cache::freshness`], applied in [`super::hit`]) and writing its
//! body ([`super::transfer`]).

use http::StatusCode;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};

use super::ClientProxy;
use super::transfer::StoreTarget;
use crate::cache::freshness::{Age, CacheControl, sets_cookie};
use crate::cache::{CacheKey, CacheStore, Completeness, Entry, NewEntry};
use crate::http::headers::{
    HSYNC_ACCEPT, HSYNC_BASIS, HSYNC_ETAG, HSYNC_HELD, HSYNC_MISSED, HSYNC_VARY,
};

impl ClientProxy {
    /// A stored response's age and freshness lifetime at `now`, as this
    /// cache (shared or private) counts them.
    pub(super) fn age_of(
        &self,
        parts: &http::request::Parts,
        status: StatusCode,
        stored: &HeaderMap,
        stored_at: u64,
        now: u64,
    ) -> Age {
        let view = self.caching_view(parts, stored);
        Age::of_stored(status, &view, stored_at, now, self.is_shared())
    }

    /// The stored or received headers as the caching rules read them for
    /// this request (`CDN-Cache-Control` where it applies, RFC 9213).
    pub(super) fn caching_view<'a>(
        &self,
        parts: &http::request::Parts,
        headers: &'a HeaderMap,
    ) -> std::borrow::Cow<'a, HeaderMap> {
        super::targeted::caching_view(self.config.targeted_cache_control, parts, headers)
    }

    /// Opens a cache entry for a storable response of `status` with
    /// `headers`: the key with its Vary'd request values, the headers to
    /// replay. The whole body's length is `complete_len` when the response
    /// is a piece of it (a 206's), else its `Content-Length`: a prefix
    /// committed short of it keeps it (see [`NewEntry::complete_len`]).
    pub(super) async fn begin_entry(
        &self,
        key: &CacheKey,
        request: &HeaderMap,
        (status, headers): (StatusCode, &HeaderMap),
        now: u64,
        identity: bool,
        complete_len: Option<u64>,
    ) -> Option<StoreTarget> {
        let mut key = key.clone();
        let names = vary_names(headers, identity);
        let plain = key.clone();
        for name in &names {
            key = key.with_vary(name, &request_value(request, name)).ok()?;
        }
        // A response that set a cookie (stored under `public`, or because
        // the operator said `store-set-cookie`) is served without it, but
        // its body may still be that user's: never a basis (D-B1).
        let private = !self.is_shared()
            || request.contains_key(header::AUTHORIZATION)
            || sets_cookie(headers)
            || CacheControl::parse(headers).private;
        let expected = content_length(headers);
        let entry = NewEntry {
            status: status.as_u16(),
            // A whole response's Content-Range, however odd on a 200, is
            // the origin's to replay; a piece's describes only the piece.
            headers: headers_to_store(headers, complete_len.is_none()),
            stored_at: now,
            completeness: Completeness::Partial,
            shareable_as_basis: !private,
            complete_len: complete_len.or(expected),
        };
        let store = self.store.clone();
        tokio::task::spawn_blocking(move || {
            if !names.is_empty() {
                // A Vary'd response replaces an unkeyed one for the URL.
                store.remove(&plain);
            }
            let mut writer = store.begin(&key).ok()?;
            if let Some(len) = expected {
                writer.expect_body_len(len).ok()?;
            }
            Some(StoreTarget {
                store,
                writer,
                entry,
            })
        })
        .await
        .ok()
        .flatten()
    }

    /// Whether an entry whose headers were `before` may stay shared with
    /// the `after` headers a 304 left it: not when they make it private
    /// (in a shared cache) or `no-store`, or change what it varies on.
    pub(super) fn still_shared(&self, before: &HeaderMap, after: &HeaderMap) -> bool {
        let directives = CacheControl::parse(after);
        let private = directives.private && self.is_shared();
        !private && !directives.no_store && vary_names(before, true) == vary_names(after, true)
    }
}

/// The entry stored for a request: the URL's unkeyed entry, else one whose
/// Vary'd request values match this request's.
pub(super) fn find_entry(store: &CacheStore, key: &CacheKey, request: &HeaderMap) -> Option<Entry> {
    if store.lookup(key).is_some() {
        return store.get(key);
    }
    store
        .variants(key)
        .into_iter()
        .filter(|c| !c.key.vary().is_empty())
        .find(|c| {
            let mut wanted = key.clone();
            for (name, _) in c.key.vary() {
                match wanted.with_vary(name, &request_value(request, name)) {
                    Ok(k) => wanted = k,
                    Err(_) => return false,
                }
            }
            wanted == c.key
        })
        .and_then(|c| store.get(&c.key))
}

/// Removes every entry of the URL (all its Vary'd variants).
pub(super) fn invalidate(store: &CacheStore, key: &CacheKey) {
    for variant in store.variants(key) {
        store.remove(&variant.key);
        tracing::debug!(url = %variant.key, "invalidated by an unsafe method");
    }
}

/// A request header's combined value (empty when absent).
fn request_value(headers: &HeaderMap, name: &str) -> Vec<u8> {
    let mut value = Vec::new();
    for (i, v) in headers.get_all(name).iter().enumerate() {
        if i > 0 {
            value.extend_from_slice(b", ");
        }
        value.extend_from_slice(v.as_bytes());
    }
    value
}

/// The request headers a response varies on, lower-case. A body we store
/// as identity does not vary on the codings offered, so `Accept-Encoding`
/// (and the hsync basis) are left out then; a coded body always varies on
/// `Accept-Encoding`.
fn vary_names(response: &HeaderMap, identity: bool) -> Vec<String> {
    let identity = identity || !response.contains_key(header::CONTENT_ENCODING);
    let mut names: Vec<String> = response
        .get_all(header::VARY)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|n| n.trim().to_ascii_lowercase())
        .filter(|n| !n.is_empty())
        .filter(|n| !(identity && (n == "accept-encoding" || n == "hsync-basis")))
        .collect();
    if !identity {
        // A coded body suits only the codings the request offered, even
        // when the origin forgot to say `Vary: Accept-Encoding`.
        names.push("accept-encoding".to_owned());
    }
    names.sort();
    names.dedup();
    names
}

/// Removes the `Vary` line an accelerator added ([`HSYNC_VARY`]) and any
/// `Hsync-Basis` member: the body we deliver is the same whatever the
/// user agent offers, and the origin's own `Vary` is what it should see.
pub(super) fn strip_hsync_vary(headers: &mut HeaderMap) {
    let ours = |value: &HeaderValue| {
        value
            .to_str()
            .is_ok_and(|v| v.trim().eq_ignore_ascii_case(HSYNC_VARY))
    };
    if headers.get_all(header::VARY).iter().any(ours) {
        let kept: Vec<HeaderValue> = headers
            .get_all(header::VARY)
            .iter()
            .filter(|value| !ours(value))
            .cloned()
            .collect();
        headers.remove(header::VARY);
        for value in kept {
            headers.append(header::VARY, value);
        }
    }
    strip_vary(headers, &["hsync-basis"]);
}

/// Removes `names` from `Vary`, dropping the header when nothing is left.
pub(super) fn strip_vary(headers: &mut HeaderMap, names: &[&str]) {
    let kept: Vec<String> = headers
        .get_all(header::VARY)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .filter(|n| !n.is_empty() && !names.iter().any(|x| n.eq_ignore_ascii_case(x)))
        .map(str::to_owned)
        .collect();
    headers.remove(header::VARY);
    if let Ok(value) = HeaderValue::from_str(&kept.join(", "))
        && !kept.is_empty()
    {
        headers.insert(header::VARY, value);
    }
}

pub(super) fn content_length(headers: &HeaderMap) -> Option<u64> {
    headers
        .get(header::CONTENT_LENGTH)?
        .to_str()
        .ok()?
        .parse()
        .ok()
}

/// The headers an entry replays.
pub(super) fn stored_headers(entry: &Entry) -> HeaderMap {
    let mut headers = HeaderMap::new();
    for (name, value) in &entry.meta.headers {
        if let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_str(value),
        ) {
            headers.append(name, value);
        }
    }
    headers
}

/// Response headers that belong to the one user who was answered (A-6,
/// A-9): never stored, so never replayed from the cache, even on a
/// `public` response. `Authentication-Info` carries the session's
/// next nonce (RFC 9110 §11.6.3).
const IDENTIFYING_HEADERS: [&str; 4] = [
    "set-cookie",
    "set-cookie2",
    "authentication-info",
    "proxy-authentication-info",
];

/// End-to-end response headers worth storing: not framing (the store knows
/// the length), not ours, not `Age`-free of meaning; `Content-Range` only
/// when `with_content_range` (a whole response's, RFC 9111 §3.1).
pub(super) fn headers_to_store(
    headers: &HeaderMap,
    with_content_range: bool,
) -> Vec<(String, String)> {
    headers
        .iter()
        .filter(|(name, _)| {
            !matches!(
                name.as_str(),
                "content-length" | "transfer-encoding" | "cache-status" | "via"
            ) && (with_content_range || *name != header::CONTENT_RANGE)
                && !IDENTIFYING_HEADERS.contains(&name.as_str())
                && **name != HSYNC_BASIS
                && **name != HSYNC_ACCEPT
                && **name != HSYNC_HELD
                && **name != HSYNC_MISSED
                && **name != HSYNC_ETAG
        })
        .filter_map(|(name, value)| {
            Some((name.as_str().to_owned(), value.to_str().ok()?.to_owned()))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identity_bodies_do_not_vary_on_accept_encoding() {
        let mut headers = HeaderMap::new();
        headers.append(
            header::VARY,
            HeaderValue::from_static("Accept-Encoding, Cookie"),
        );
        headers.append(
            header::VARY,
            HeaderValue::from_static("hsync-basis, accept-language"),
        );
        assert_eq!(vary_names(&headers, true), ["accept-language", "cookie"]);
        headers.insert(header::CONTENT_ENCODING, HeaderValue::from_static("gzip"));
        let mut no_vary = HeaderMap::new();
        no_vary.insert(header::CONTENT_ENCODING, HeaderValue::from_static("br"));
        assert_eq!(vary_names(&no_vary, false), ["accept-encoding"]);
        assert_eq!(
            vary_names(&headers, false),
            [
                "accept-encoding",
                "accept-language",
                "cookie",
                "hsync-basis"
            ]
        );
        strip_vary(&mut headers, &["accept-encoding", "hsync-basis"]);
        assert_eq!(headers[header::VARY], "Cookie, accept-language");
    }

    #[test]
    fn the_accelerators_vary_line_goes_and_the_origins_stays() {
        let mut headers = HeaderMap::new();
        headers.append(
            header::VARY,
            HeaderValue::from_static("Foo, Accept-Encoding"),
        );
        headers.append(header::VARY, HeaderValue::from_static(HSYNC_VARY));
        strip_hsync_vary(&mut headers);
        let vary: Vec<_> = headers.get_all(header::VARY).iter().collect();
        assert_eq!(vary, ["Foo, Accept-Encoding"]);
        let mut ours_only = HeaderMap::new();
        ours_only.append(header::VARY, HeaderValue::from_static(HSYNC_VARY));
        strip_hsync_vary(&mut ours_only);
        assert!(!ours_only.contains_key(header::VARY));
    }
}
