//! Serving from the cache: the lookup (memory first, then the disk
//! index and the entry's Vary'd variant), a fresh entry answered without
//! asking upstream, the user agent's own validators answered with a 304,
//! a stale entry refreshed by an upstream 304, a stale entry served
//! when upstream fails and RFC 5861 allows it, and Range requests within
//! a fresh partial entry's prefix (RFC 9111 §3.4).
//!
//! Leaves out: going upstream ([`super::fetch`]), the freshness rules
//! themselves ([`crate::cache::freshness`]), reading and checking a stored
//! body ([`super::cached_body`]).
//!
//! Main type: [`Lookup`].

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderValue};
use http::request::Parts;
use http::{Method, Response, StatusCode};

use super::cached_body::{self, CachedBody};
use super::entry::{find_entry, headers_to_store, stored_headers};
use super::hot::HotEntry;
use super::ranges::{self, Requested, Stored};
use super::transfer::full;
use super::{CACHE_NAME, CACHE_STATUS, ClientProxy, ClientStats, empty, unix_now};
use crate::cache::freshness::{self, CacheStatus, Forward, Reuse};
use crate::cache::{CacheKey, Completeness, Entry};
use crate::http::error::ProxyError;
use crate::http::headers::add_via;
use crate::http::server::ProxyBody;

pub(super) enum Lookup {
    Fresh(Response<ProxyBody>),
    Stale(Entry),
    Miss,
}

impl ClientProxy {
    /// The stored response for a request: fresh (already a response),
    /// stale (the entry, to revalidate and to use as basis), or none.
    pub(super) async fn lookup(&self, key: &CacheKey, parts: &Parts) -> Lookup {
        if let Some(response) = self.hot_hit(key, parts) {
            ClientStats::add(&self.stats.hits, 1);
            return Lookup::Fresh(response);
        }
        // Nothing stored for the URL (the index is in memory): no thread hop.
        if self.store.lookup(key).is_none() && self.store.variants(key).is_empty() {
            return Lookup::Miss;
        }
        let store = self.store.clone();
        let key = key.clone();
        let headers = parts.headers.clone();
        let found = tokio::task::spawn_blocking(move || find_entry(&store, &key, &headers))
            .await
            .ok()
            .flatten();
        let Some(entry) = found else {
            return Lookup::Miss;
        };
        if entry.meta.completeness != Completeness::Complete {
            return match self.partial_hit(entry, parts).await {
                Ok(response) => {
                    ClientStats::add(&self.stats.hits, 1);
                    Lookup::Fresh(response)
                }
                Err(Some(entry)) => Lookup::Stale(entry),
                Err(None) => Lookup::Miss,
            };
        }
        let stored = stored_headers(&entry);
        let status = StatusCode::from_u16(entry.meta.status).unwrap_or(StatusCode::OK);
        let age = self.age_of(parts, status, &stored, entry.meta.stored_at, unix_now());
        match freshness::reuse(
            &parts.headers,
            &self.caching_view(parts, &stored),
            age.current,
            age.lifetime,
            self.is_shared(),
        ) {
            Reuse::Serve => {
                match self
                    .respond_from_entry(entry, stored, age.current, parts, CacheStatus::hit(), true)
                    .await
                {
                    Ok(response) => {
                        ClientStats::add(&self.stats.hits, 1);
                        Lookup::Fresh(response)
                    }
                    Err(()) => Lookup::Miss,
                }
            }
            Reuse::Revalidate => Lookup::Stale(entry),
        }
    }

    /// A Range request answered from a partial entry (RFC 9111 §3.4: a
    /// cache may serve the parts it holds): when the stored response is
    /// fresh, the whole length is known, and every range asked lies within
    /// the stored prefix (several only from a prefix read whole). The
    /// entry comes back as `Err(Some(_))` otherwise (a basis, or the
    /// prefix a resume completes), `Err(None)` when its body failed its
    /// check (it is quarantined).
    async fn partial_hit(
        &self,
        entry: Entry,
        parts: &Parts,
    ) -> Result<Response<ProxyBody>, Option<Entry>> {
        let Some(complete_len) = entry.meta.complete_len.filter(|_| entry.meta.status == 200)
        else {
            return Err(Some(entry));
        };
        let conditional = [
            header::IF_NONE_MATCH,
            header::IF_MODIFIED_SINCE,
            header::IF_MATCH,
            header::IF_UNMODIFIED_SINCE,
        ]
        .iter()
        .any(|name| parts.headers.contains_key(name));
        if parts.method != Method::GET || !parts.headers.contains_key(header::RANGE) || conditional
        {
            return Err(Some(entry));
        }
        let stored = stored_headers(&entry);
        let len = entry.meta.body_len;
        let ranges = match ranges::requested(&parts.method, &parts.headers, &stored, complete_len) {
            Requested::Ranges(ranges)
                if ranges.iter().all(|range| range.end <= len)
                    && (ranges.len() == 1 || len <= cached_body::SMALL_BODY) =>
            {
                ranges
            }
            _ => return Err(Some(entry)),
        };
        let age = self.age_of(
            parts,
            StatusCode::OK,
            &stored,
            entry.meta.stored_at,
            unix_now(),
        );
        let reuse = freshness::reuse(
            &parts.headers,
            &self.caching_view(parts, &stored),
            age.current,
            age.lifetime,
            self.is_shared(),
        );
        if !matches!(reuse, Reuse::Serve) {
            return Err(Some(entry));
        }
        let mut headers = stored;
        headers.insert(header::AGE, HeaderValue::from(age.current));
        headers.insert(
            CACHE_STATUS,
            freshness::cache_status(CACHE_NAME, &CacheStatus::hit()),
        );
        add_via(&mut headers, &self.config.via_name);
        let (Ok(digest), Ok(key)) = (entry.meta.body_digest(), entry.meta.key()) else {
            return Err(Some(entry));
        };
        let outboard = entry.meta.outboard();
        let body = self
            .serve_checked(entry.body, len, digest, key, outboard)
            .await
            .ok_or(None)?;
        let body = match body {
            CachedBody::Whole(bytes) => Stored::Whole(bytes),
            CachedBody::Stream(body) => Stored::Stream(body),
        };
        Ok(ranges::answer(
            Requested::Ranges(ranges),
            headers,
            body,
            complete_len,
        ))
    }

    /// A stored body of `len` bytes, checked as it is served
    /// ([`cached_body::serve_cached`], on the blocking pool): one that fails
    /// a check is counted and its entry quarantined. `None` when it failed
    /// before a byte went.
    pub(super) async fn serve_checked(
        &self,
        body: std::fs::File,
        len: u64,
        digest: blake3::Hash,
        key: CacheKey,
        outboard: Option<crate::cache::outboard::Outboard>,
    ) -> Option<CachedBody> {
        let store = self.store.clone();
        let stats = self.stats.clone();
        let on_failure = move || {
            ClientStats::add(&stats.digest_failures, 1);
            store.quarantine(&key, digest);
        };
        tokio::task::spawn_blocking(move || {
            cached_body::serve_cached(body, len, digest, outboard, on_failure)
        })
        .await
        .ok()
        .flatten()
    }

    /// A fresh hit served from memory: no file, no thread hop. `None` when
    /// the memory cache lacks the entry, the store describes another body
    /// by now, or it needs revalidation (the disk path decides then).
    fn hot_hit(&self, key: &CacheKey, parts: &Parts) -> Option<Response<ProxyBody>> {
        let digest = *key.digest().as_bytes();
        let index = self.store.lookup(key)?;
        let entry = self.hot.get(&digest, &index)?;
        if !entry.is_intact() {
            // C-V3: the disk copy is read (and checked) instead.
            tracing::warn!(url = %key, "memory cache body failed its check; dropped");
            ClientStats::add(&self.stats.digest_failures, 1);
            self.hot.remove(&digest);
            return None;
        }
        let status = StatusCode::from_u16(entry.status).ok()?;
        let age = self.age_of(parts, status, &entry.headers, entry.stored_at, unix_now());
        let reuse = freshness::reuse(
            &parts.headers,
            &self.caching_view(parts, &entry.headers),
            age.current,
            age.lifetime,
            self.is_shared(),
        );
        if reuse != Reuse::Serve {
            return None;
        }
        self.store.touch(key);
        let head = self.stored_head(
            status,
            entry.headers.clone(),
            age.current,
            parts,
            CacheStatus::hit(),
            entry.body.len() as u64,
        );
        Some(match head {
            Ok(response) => response,
            Err(headers) => served(
                status,
                parts,
                headers,
                Stored::Whole(entry.body.clone()),
                entry.body.len() as u64,
            ),
        })
    }

    /// The head of a stored response as served (Age, Cache-Status, Via,
    /// Content-Length): a whole 304 when the user agent's own validators
    /// match or a whole HEAD answer as `Ok`, else the headers the body
    /// goes with as `Err`.
    fn stored_head(
        &self,
        status: StatusCode,
        mut headers: HeaderMap,
        age: u64,
        parts: &Parts,
        outcome: CacheStatus,
        body_len: u64,
    ) -> Result<Response<ProxyBody>, HeaderMap> {
        headers.insert(header::AGE, HeaderValue::from(age));
        headers.insert(CACHE_STATUS, freshness::cache_status(CACHE_NAME, &outcome));
        add_via(&mut headers, &self.config.via_name);
        if status == StatusCode::OK && not_modified_for(&parts.headers, &headers) {
            return Ok(respond(StatusCode::NOT_MODIFIED, headers, empty()));
        }
        headers.insert(header::CONTENT_LENGTH, HeaderValue::from(body_len));
        if parts.method == Method::HEAD {
            return Ok(respond(status, headers, empty()));
        }
        Err(headers)
    }

    /// Serves a stored entry: 304 when the user agent's own validators
    /// match, headers only for HEAD, else the body (checked; `Err` when it
    /// failed its digest and was quarantined, so the caller goes upstream).
    /// With `remember`, a small body is kept in the memory cache.
    async fn respond_from_entry(
        &self,
        mut entry: Entry,
        stored: HeaderMap,
        age: u64,
        parts: &Parts,
        outcome: CacheStatus,
        remember: bool,
    ) -> Result<Response<ProxyBody>, ()> {
        let status = StatusCode::from_u16(entry.meta.status).unwrap_or(StatusCode::OK);
        let len = entry.meta.body_len;
        let remember = remember && len <= self.hot.max_body() as u64;
        // What the store keeps, never what this user was answered with
        // (a 304's Set-Cookie, say): the memory copy is shared.
        let kept_headers = remember.then(|| stored_headers(&entry));
        let headers = match self.stored_head(status, stored, age, parts, outcome, len) {
            Ok(response) => return Ok(response),
            Err(headers) => headers,
        };
        let digest = entry.meta.body_digest().map_err(|_| ())?;
        let stored_at = entry.meta.stored_at;
        let signature = Bytes::from(std::mem::take(&mut entry.signature));
        let key = entry.meta.key().map_err(|_| ())?;
        let key_digest = *key.digest().as_bytes();
        let outboard = entry.meta.outboard();
        let body = self
            .serve_checked(entry.body, len, digest, key, outboard)
            .await
            .ok_or(())?;
        let body = match body {
            CachedBody::Whole(bytes) => {
                if let Some(kept) = kept_headers {
                    let entry = HotEntry::new(
                        status.as_u16(),
                        kept,
                        stored_at,
                        bytes.clone(),
                        digest,
                        signature,
                    );
                    self.hot.insert(key_digest, entry);
                }
                Stored::Whole(bytes)
            }
            CachedBody::Stream(body) => Stored::Stream(body),
        };
        Ok(served(status, parts, headers, body, len))
    }

    /// A 304 answered our validators: refresh the stored headers and serve
    /// the entry.
    pub(super) async fn refreshed(
        &self,
        entry: Entry,
        not_modified: &HeaderMap,
        parts: &Parts,
        now: u64,
    ) -> Response<ProxyBody> {
        ClientStats::add(&self.stats.revalidated, 1);
        let stored = stored_headers(&entry);
        // The merge is this user's answer (her Set-Cookie included); what
        // is kept is only its shareable part.
        let merged = freshness::merge_not_modified(&stored, not_modified);
        let mut meta = entry.meta.clone();
        // A stored Content-Range is a whole response's (a piece keeps none),
        // and a 304 does not change it.
        meta.headers = headers_to_store(&merged, true);
        meta.stored_at = now;
        let store = self.store.clone();
        // A 304 may change what the entry is: `private` or `no-store` now,
        // or varying on other request headers than its key was made with
        // (RFC 9111 §4.3.4 lets it update every header). Then the entry is
        // no longer one every user may get: it goes, and this user alone
        // gets the body.
        let keep = self.still_shared(&stored, &merged);
        let kept_meta = meta.clone();
        let _ = tokio::task::spawn_blocking(move || {
            if !keep {
                if let Ok(key) = meta.key() {
                    store.remove(&key);
                }
            } else if let Err(error) = store.update_meta(&meta) {
                tracing::warn!(url = %meta.url, %error, "cannot refresh the stored headers");
            }
        })
        .await;
        // Revalidated just now: aged from this exchange.
        let status = StatusCode::from_u16(entry.meta.status).unwrap_or(StatusCode::OK);
        let age = self.age_of(parts, status, &merged, now, now).current;
        // As the store now describes it (the memory cache checks that).
        let mut entry = entry;
        entry.meta = kept_meta;
        match self
            .respond_from_entry(
                entry,
                merged,
                age,
                parts,
                CacheStatus {
                    fwd_status: Some(StatusCode::NOT_MODIFIED),
                    ..CacheStatus::forwarded(Forward::Stale)
                },
                keep,
            )
            .await
        {
            Ok(response) => {
                ClientStats::add(&self.stats.hits, 1);
                response
            }
            // The cache's failure, so ours; but 502 as every failed fetch
            // is: the user agent retries.
            Err(()) => ProxyError::internal_bad_gateway(
                "the stored body failed its check after a 304; retry",
            )
            .log_and_respond(),
        }
    }

    /// Serves a stale entry at once when RFC 5861's
    /// `stale-while-revalidate` allows it (the caller revalidates it in the
    /// background); `Err` gives the entry back when it does not, `Ok(None)`
    /// when its body failed its check (it is quarantined).
    pub(super) async fn serve_stale_while_revalidating(
        &self,
        entry: Entry,
        parts: &Parts,
    ) -> Result<Option<Response<ProxyBody>>, Entry> {
        let stored = stored_headers(&entry);
        let Ok(status) = StatusCode::from_u16(entry.meta.status) else {
            return Err(entry);
        };
        let age = self.age_of(parts, status, &stored, entry.meta.stored_at, unix_now());
        if entry.meta.completeness != Completeness::Complete
            || !freshness::may_serve_stale_while_revalidating(
                &parts.headers,
                &self.caching_view(parts, &stored),
                age.current,
                age.lifetime,
                self.is_shared(),
            )
        {
            return Err(entry);
        }
        ClientStats::add(&self.stats.hits, 1);
        Ok(self
            .respond_from_entry(
                entry,
                stored,
                age.current,
                parts,
                CacheStatus::stale_while_revalidating(age.ttl()),
                false,
            )
            .await
            .ok())
    }

    /// Whether RFC 5861's `stale-if-error` lets `entry` answer this
    /// request now, were upstream to fail.
    pub(super) fn may_serve_stale_on_error(&self, entry: &Entry, parts: &Parts) -> bool {
        let stored = stored_headers(entry);
        let Ok(status) = StatusCode::from_u16(entry.meta.status) else {
            return false;
        };
        let age = self.age_of(parts, status, &stored, entry.meta.stored_at, unix_now());
        entry.meta.completeness == Completeness::Complete
            && freshness::may_serve_stale_on_error(
                &parts.headers,
                &self.caching_view(parts, &stored),
                age.current,
                age.lifetime,
                self.is_shared(),
            )
    }

    /// Upstream failed: serves the stale entry if RFC 5861 allows it.
    pub(super) async fn serve_stale_on_error(
        &self,
        entry: Entry,
        parts: &Parts,
        upstream_status: Option<StatusCode>,
    ) -> Option<Response<ProxyBody>> {
        if !self.may_serve_stale_on_error(&entry, parts) {
            return None;
        }
        let stored = stored_headers(&entry);
        let status = StatusCode::from_u16(entry.meta.status).ok()?;
        let age = self.age_of(parts, status, &stored, entry.meta.stored_at, unix_now());
        self.respond_from_entry(
            entry,
            stored,
            age.current,
            parts,
            CacheStatus::stale_on_error(upstream_status, age.ttl()),
            false,
        )
        .await
        .ok()
    }
}

/// Whether the user agent's own validators match the stored response (RFC
/// 9110 §13.1.2 and §13.1.3; If-None-Match wins when both are present).
/// Without `Last-Modified`, the stored response's `Date` is when it was
/// last modified as far as the cache knows (RFC 9111 §4.3.2).
fn not_modified_for(request: &HeaderMap, stored: &HeaderMap) -> bool {
    if let Some(condition) = request.get(header::IF_NONE_MATCH) {
        let Some(etag) = stored.get(header::ETAG).and_then(|v| v.to_str().ok()) else {
            return false;
        };
        let opaque = |tag: &str| tag.trim().trim_start_matches("W/").to_owned();
        return condition.to_str().is_ok_and(|list| {
            list.split(',')
                .any(|tag| tag.trim() == "*" || opaque(tag) == opaque(etag))
        });
    }
    match (
        request
            .get(header::IF_MODIFIED_SINCE)
            .and_then(freshness::parse_http_date),
        stored
            .get(header::LAST_MODIFIED)
            .or_else(|| stored.get(header::DATE))
            .and_then(freshness::parse_http_date),
    ) {
        (Some(since), Some(modified)) => modified <= since,
        _ => false,
    }
}

/// A stored body as the request asks for it: a 200's in the ranges it
/// names (RFC 9110 §14), any other status's whole.
fn served(
    status: StatusCode,
    parts: &Parts,
    headers: HeaderMap,
    body: Stored,
    len: u64,
) -> Response<ProxyBody> {
    if status == StatusCode::OK {
        let requested = ranges::requested(&parts.method, &parts.headers, &headers, len);
        return ranges::answer(requested, headers, body, len);
    }
    let body = match body {
        Stored::Whole(bytes) => full(bytes),
        Stored::Stream(body) => body,
    };
    respond(status, headers, body)
}

pub(super) fn respond(
    status: StatusCode,
    headers: HeaderMap,
    body: ProxyBody,
) -> Response<ProxyBody> {
    let mut response = Response::new(body);
    *response.status_mut() = status;
    *response.headers_mut() = headers;
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn user_agent_validators_are_answered_from_the_entry() {
        let mut stored = HeaderMap::new();
        stored.insert(header::ETAG, HeaderValue::from_static("W/\"v2\""));
        stored.insert(
            header::LAST_MODIFIED,
            HeaderValue::from_static("Tue, 01 Jan 2030 00:00:00 GMT"),
        );
        let mut request = HeaderMap::new();
        request.insert(
            header::IF_NONE_MATCH,
            HeaderValue::from_static("\"v1\", \"v2\""),
        );
        assert!(not_modified_for(&request, &stored));
        request.insert(header::IF_NONE_MATCH, HeaderValue::from_static("\"v1\""));
        assert!(!not_modified_for(&request, &stored));
        let mut since = HeaderMap::new();
        since.insert(
            header::IF_MODIFIED_SINCE,
            HeaderValue::from_static("Wed, 02 Jan 2030 00:00:00 GMT"),
        );
        assert!(not_modified_for(&since, &stored));
        since.insert(
            header::IF_MODIFIED_SINCE,
            HeaderValue::from_static("Mon, 31 Dec 2029 00:00:00 GMT"),
        );
        assert!(!not_modified_for(&since, &stored));
        // RFC 9111 §4.3.2: no Last-Modified, so the Date.
        stored.remove(header::LAST_MODIFIED);
        assert!(!not_modified_for(&since, &stored));
        stored.insert(
            header::DATE,
            HeaderValue::from_static("Sun, 30 Dec 2029 00:00:00 GMT"),
        );
        assert!(not_modified_for(&since, &stored));
    }
}
