//! What goes through uncached: HEAD misses and methods other than GET and
//! HEAD, streamed both ways; a successful unsafe method invalidates the
//! URL's entries (RFC 9111 §4.4). hsync never reaches a user agent as a
//! content coding on these paths (P-25). A HEAD without a body whose way
//! failed before answering goes on to the route's next way; another
//! method never does, since the upstream may have acted on it.
//!
//! Leaves out: GET misses, which are fetched with the hsync offer and may
//! be stored ([`super::fetch`]).

use std::sync::Arc;

use http::header;
use http::request::Parts;
use http::{Method, Response};
use http_body_util::BodyExt;
use hyper::body::{Body, Incoming};

use super::entry::{invalidate, strip_hsync_vary};
use super::fetch::{HsyncCoded, hsync_coded};
use super::{CACHE_NAME, CACHE_STATUS, ClientProxy, ClientStats, Target, empty};
use crate::cache::CacheKey;
use crate::cache::freshness::{self, CacheStatus, Forward};
use crate::http::error::ProxyError;
use crate::http::headers::{
    HSYNC_ACCEPT, HSYNC_BASIS, HSYNC_ETAG, HSYNC_HELD, HSYNC_MISSED, HSYNC_SIGNATURE,
    HSYNC_SIGNATURE_LENGTH, add_via, restore_etag, strip_hop_by_hop,
};
use crate::http::server::{BodyError, ProxyBody, RequestBody};

impl ClientProxy {
    /// HEAD misses: passed through as they are, to the route's next way
    /// when one failed before answering and there is no body (which could
    /// not be sent twice).
    pub(super) async fn pass(
        &self,
        parts: Parts,
        body: RequestBody,
        mut target: Target,
    ) -> Response<ProxyBody> {
        ClientStats::add(&self.stats.passed, 1);
        let repeatable = body.is_end_stream();
        let mut body = Some(body.map_err(BodyError::from).boxed());
        loop {
            let headers = parts.headers.clone();
            let body = body.take().unwrap_or_else(empty);
            let outbound = self.outbound(&parts, headers, &target, body);
            match self.send(outbound, &target).await {
                Ok(response) => {
                    return self.relay_plain(
                        &parts.method,
                        response,
                        CacheStatus::forwarded(Forward::Miss),
                    );
                }
                Err(refusal)
                    if repeatable && let Some(next) = self.fail_over(&target, &refusal) =>
                {
                    target = next;
                }
                Err(refusal) => return refusal.log_and_respond(),
            }
        }
    }

    /// Methods other than GET and HEAD: through, and a success invalidates
    /// the stored entry (RFC 9111 §4.4, P-23).
    pub(super) async fn pass_unsafe(
        self: Arc<Self>,
        parts: Parts,
        body: RequestBody,
        target: Target,
        key: CacheKey,
    ) -> Response<ProxyBody> {
        ClientStats::add(&self.stats.passed, 1);
        let headers = parts.headers.clone();
        let outbound = self.outbound(
            &parts,
            headers,
            &target,
            body.map_err(BodyError::from).boxed(),
        );
        let response = match self.send(outbound, &target).await {
            Ok(response) => response,
            Err(refusal) => return refusal.log_and_respond(),
        };
        if freshness::invalidates(&parts.method, response.status()) {
            let store = self.store.clone();
            let mut keys = vec![key];
            keys.extend(also_invalidated(&target.url, response.headers()));
            let _ = tokio::task::spawn_blocking(move || {
                for key in &keys {
                    invalidate(&store, key);
                }
            })
            .await;
        }
        self.relay_plain(
            &parts.method,
            response,
            CacheStatus::forwarded(Forward::Method),
        )
    }

    /// An upstream answer passed through as it is, but that hsync never
    /// reaches a user agent as a content coding (P-25): we did not offer
    /// it on these paths, so a coded body is an upstream's mistake (502),
    /// and a HEAD answer loses the coding and the coded length.
    fn relay_plain(
        &self,
        method: &Method,
        response: Response<Incoming>,
        outcome: CacheStatus,
    ) -> Response<ProxyBody> {
        let (mut parts, body) = response.into_parts();
        parts.version = http::Version::HTTP_11;
        if let Err(e) = strip_hop_by_hop(&mut parts.headers) {
            return ProxyError::bad_upstream_response(format!("upstream response: {e}"))
                .log_and_respond();
        }
        if hsync_coded(&parts.headers) != HsyncCoded::No {
            if *method != Method::HEAD {
                return ProxyError::bad_upstream_response(
                    "upstream sent an hsync body that was not asked for",
                )
                .log_and_respond();
            }
            parts.headers.remove(header::CONTENT_ENCODING);
            parts.headers.remove(header::CONTENT_LENGTH);
            // The head of the origin's body: its own validator.
            restore_etag(&mut parts.headers);
        }
        for name in [
            HSYNC_ETAG,
            HSYNC_BASIS,
            HSYNC_ACCEPT,
            HSYNC_SIGNATURE,
            HSYNC_SIGNATURE_LENGTH,
            HSYNC_HELD,
            HSYNC_MISSED,
        ] {
            parts.headers.remove(name);
        }
        strip_hsync_vary(&mut parts.headers);
        parts
            .headers
            .insert(CACHE_STATUS, freshness::cache_status(CACHE_NAME, &outcome));
        add_via(&mut parts.headers, &self.config.via_name);
        Response::from_parts(parts, body.map_err(BodyError::from).boxed())
    }
}

/// The other URLs an unsafe request's success invalidates (RFC 9111
/// §4.4): those its `Location` and `Content-Location` name, resolved
/// against the request's, when they are of the same origin (another's
/// could be named to evict what it does not own).
fn also_invalidated(request_url: &http::Uri, response: &http::HeaderMap) -> Vec<CacheKey> {
    let (Some(scheme), Some(authority)) = (request_url.scheme(), request_url.authority()) else {
        return Vec::new();
    };
    [header::LOCATION, header::CONTENT_LOCATION]
        .iter()
        .filter_map(|name| response.get(name)?.to_str().ok())
        .filter_map(|reference| {
            let url = if reference.starts_with('/') && !reference.starts_with("//") {
                format!("{scheme}://{authority}{reference}")
            } else {
                reference.to_owned()
            };
            let uri: http::Uri = url.parse().ok()?;
            let same_origin = uri.scheme() == Some(scheme)
                && uri
                    .authority()
                    .is_some_and(|a| a.as_str().eq_ignore_ascii_case(authority.as_str()));
            same_origin.then(|| CacheKey::parse(&url).ok()).flatten()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc9111_4_4_location_and_content_location_of_the_same_origin_are_invalidated() {
        let request: http::Uri = "http://example.org/cart".parse().unwrap();
        let mut response = http::HeaderMap::new();
        response.insert(header::LOCATION, "/cart/items/7".parse().unwrap());
        response.insert(
            header::CONTENT_LOCATION,
            "http://EXAMPLE.org/cart/summary".parse().unwrap(),
        );
        let keys: Vec<String> = also_invalidated(&request, &response)
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(
            keys,
            [
                "http://example.org/cart/items/7",
                "http://example.org/cart/summary"
            ]
        );
        for other in [
            "http://other.example/x",
            "//other.example/x",
            "https://example.org/x",
        ] {
            let mut response = http::HeaderMap::new();
            response.insert(header::LOCATION, other.parse().unwrap());
            assert!(also_invalidated(&request, &response).is_empty(), "{other}");
        }
    }
}
