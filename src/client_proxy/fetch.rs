//! Going upstream for a GET the cache could not answer: the request goes
//! with the hsync offer, a basis ([`super::basis`]) and, for a stale entry,
//! its validators; the answer is relayed, or a stale entry served, or
//! refreshed by a 304.
//!
//! Leaves out: the trip itself and the queue wait on the way
//! ([`super::upstream`], [`super::queue_wait`]), rebuilding, checking and
//! storing the body ([`super::transfer`]), serving a stored entry
//! ([`super::hit`]).
//!
//! Main type: [`Attempt`].

use std::sync::Arc;
use std::time::Instant;

use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::request::Parts;
use http::{Response, StatusCode};
use http_body_util::BodyExt;

use super::basis::{BasisBody, BasisOffer};
use super::coalesce;
use super::entry::{content_length, stored_headers, strip_vary};
use super::queue_wait::Observed;
use super::stats::{LoggedAtEnd, RequestLog, Started, record};
use super::transfer::{self, ClientBasis, Coding, OriginDigest, Relay, Relayed, Report, full};
use super::{CACHE_NAME, CACHE_STATUS, ClientProxy, ClientStats, Target, empty, error, unix_now};
use crate::cache::freshness::{self, CacheStatus, Forward, Storability};
use crate::cache::{CacheKey, Completeness, Entry};
use crate::hsync::{DecodeLimits, FileBasis};
use crate::http::headers::{
    HSYNC_ACCEPT, HSYNC_BASIS, HSYNC_CODING, HSYNC_SIGNATURE, add_via, strip_hop_by_hop,
};
use crate::http::server::{BodyError, ProxyBody};
use crate::http::upstream_guard::ExchangeCheck;

/// Which try of a fetch this is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Attempt {
    /// With the basis chosen for it.
    First,
    /// After the first one's rebuilt body failed its checks.
    WithoutBasis,
}

/// Request headers that make a request conditional.
const CONDITIONAL_HEADERS: [HeaderName; 5] = [
    header::IF_NONE_MATCH,
    header::IF_MODIFIED_SINCE,
    header::IF_MATCH,
    header::IF_UNMODIFIED_SINCE,
    header::IF_RANGE,
];

impl ClientProxy {
    /// Fetches a GET upstream with the hsync offer (and validators for a
    /// stale entry), and relays the answer.
    pub(super) async fn fetch(
        self: Arc<Self>,
        parts: Parts,
        target: Target,
        key: CacheKey,
        stale: Option<Entry>,
        leader: Option<coalesce::Leader>,
    ) -> Response<ProxyBody> {
        self.fetch_with(parts, target, key, stale, leader, Attempt::First)
            .await
    }

    /// [`fetch`](Self::fetch), once more without a basis when a small body
    /// rebuilt against one failed its checks before the user agent saw a
    /// byte (D-A1, D-A4: the full fetch serves the right bytes).
    async fn fetch_with(
        self: Arc<Self>,
        parts: Parts,
        target: Target,
        key: CacheKey,
        stale: Option<Entry>,
        leader: Option<coalesce::Leader>,
        attempt: Attempt,
    ) -> Response<ProxyBody> {
        let basis = match attempt {
            Attempt::First => self.choose_basis(&key, stale.as_ref()).await,
            Attempt::WithoutBasis => None,
        };
        let stale_complete =
            stale.filter(|e| e.meta.completeness == Completeness::Complete && e.meta.status == 200);
        let mut headers = parts.headers.clone();
        let revalidating = stale_complete.is_some();
        if let Some(entry) = &stale_complete {
            // We answer the user agent's own conditions from the entry.
            for name in CONDITIONAL_HEADERS {
                headers.remove(name);
            }
            headers.extend(freshness::conditional_headers(&stored_headers(entry)));
        }
        offer_hsync(&mut headers);
        if let Some(offer) = &basis {
            ClientStats::add(&self.stats.signature_bytes, offer.signature_len as u64);
            headers.insert(HSYNC_BASIS, offer.name.clone());
            headers.insert(HSYNC_SIGNATURE, offer.signature.clone());
        }
        let mut outbound = self.outbound(&parts, headers, &target, empty());
        if let Some(observed) = parts.extensions.get::<Observed>() {
            // A navigation's wait goes along: the queue wait shows its
            // place on the waiting page.
            outbound.extensions_mut().insert(observed.clone());
        }
        let now = unix_now();
        let response = match self.send(outbound, &target).await {
            Ok(response) => response,
            Err((status, message)) => {
                if let Some(entry) = stale_complete
                    && let Some(response) = self.serve_stale_on_error(entry, &parts, None).await
                {
                    return response;
                }
                return error(status, message);
            }
        };
        let (mut rparts, rbody) = response.into_parts();
        rparts.version = http::Version::HTTP_11;
        if let Err(e) = strip_hop_by_hop(&mut rparts.headers) {
            return error(StatusCode::BAD_GATEWAY, format!("upstream response: {e}"));
        }

        if rparts.status == StatusCode::NOT_MODIFIED
            && let Some(entry) = stale_complete
        {
            return self.refreshed(entry, &rparts.headers, &parts, now).await;
        }
        if rparts.status.is_server_error()
            && let Some(entry) = stale_complete
            && let Some(response) = self
                .serve_stale_on_error(entry, &parts, Some(rparts.status))
                .await
        {
            return response;
        }
        if hsync_coded(&rparts.headers) == HsyncCoded::Layered {
            return error(
                StatusCode::BAD_GATEWAY,
                "upstream layered other codings with hsync; it cannot be undone here".into(),
            );
        }
        let hsync = is_hsync(&rparts.headers);
        if hsync {
            let sent = basis.as_ref().map(|b| &b.name);
            if rparts.headers.get(HSYNC_BASIS) != sent {
                ClientStats::add(&self.stats.digest_failures, 1);
                return error(
                    StatusCode::BAD_GATEWAY,
                    "upstream coded against a basis we did not offer".into(),
                );
            }
            ClientStats::add(&self.stats.deltas, 1);
            rparts.headers.remove(header::CONTENT_ENCODING);
            rparts.headers.remove(header::CONTENT_LENGTH);
            rparts.headers.remove(HSYNC_BASIS);
            rparts.headers.remove(HSYNC_ACCEPT);
            strip_vary(&mut rparts.headers, &["accept-encoding", "hsync-basis"]);
        }
        ClientStats::add(&self.stats.misses, 1);
        if revalidating {
            ClientStats::add(&self.stats.revalidated, 1);
        }
        let outcome = if revalidating {
            CacheStatus {
                fwd_status: Some(rparts.status),
                ..CacheStatus::forwarded(Forward::Stale)
            }
        } else {
            CacheStatus::forwarded(Forward::Miss)
        };
        let storable = match freshness::storability(
            &parts.method,
            &parts.headers,
            rparts.status,
            &rparts.headers,
            self.is_shared(),
        ) {
            Storability::Storable if rparts.status == StatusCode::OK => true,
            Storability::Storable => false,
            Storability::NotStorable(reason) => {
                tracing::debug!(url = %key, reason, "not storable");
                false
            }
        };
        if !hsync && !storable {
            drop(leader);
            ClientStats::add(&self.stats.passed, 1);
            rparts
                .headers
                .insert(CACHE_STATUS, freshness::cache_status(CACHE_NAME, &outcome));
            add_via(&mut rparts.headers, &self.config.via_name);
            return Response::from_parts(rparts, rbody.map_err(BodyError::from).boxed());
        }

        let store_target = if storable {
            self.begin_entry(&key, &parts.headers, &rparts, now, hsync)
                .await
        } else {
            None
        };
        let basis_url = basis.as_ref().map(|b| b.key.to_string());
        let had_basis = basis.is_some();
        let coding = if hsync {
            let (basis_file, basis_key) = match basis {
                Some(BasisOffer {
                    body: BasisBody::Memory(body),
                    key,
                    ..
                }) => (ClientBasis::Memory(body), Some(key)),
                Some(BasisOffer {
                    body: BasisBody::File(file),
                    key,
                    ..
                }) => match FileBasis::new(file) {
                    Ok(file) => (ClientBasis::File(file), Some(key)),
                    Err(e) => {
                        return error(
                            StatusCode::BAD_GATEWAY,
                            format!("cannot read the basis: {e}"),
                        );
                    }
                },
                None => (ClientBasis::None, None),
            };
            Coding::Hsync {
                basis: basis_file,
                basis_key,
                limits: DecodeLimits {
                    max_output: self.config.max_object_bytes,
                    ..DecodeLimits::default()
                },
            }
        } else {
            Coding::Plain {
                expected_len: content_length(&rparts.headers),
            }
        };
        let mut origin_digests = OriginDigest::parse_all(&rparts.headers, "content-digest");
        if hsync || !rparts.headers.contains_key(header::CONTENT_ENCODING) {
            origin_digests.extend(OriginDigest::parse_all(&rparts.headers, "repr-digest"));
        }
        rparts
            .headers
            .insert(CACHE_STATUS, freshness::cache_status(CACHE_NAME, &outcome));
        add_via(&mut rparts.headers, &self.config.via_name);
        let stats = self.stats.clone();
        let log = RequestLog {
            url: key.to_string(),
            status: rparts.status,
            cache: freshness::cache_status(CACHE_NAME, &outcome),
            basis: basis_url,
            hsync,
            started: parts
                .extensions
                .get::<Started>()
                .map_or_else(Instant::now, |s| s.0),
        };
        rparts.extensions.insert(LoggedAtEnd);
        let relayed = transfer::relay(
            rbody,
            Relay {
                coding,
                store: store_target,
                origin_digests,
                framing: rparts.extensions.get::<ExchangeCheck>().cloned(),
                spool_dir: Some(self.store.root().join("tmp")),
                spool_disk: self.spool_disk.clone(),
                memory: self.memory.clone(),
            },
            self.config.upstream_timeout.min(transfer::WHOLE_WAIT),
            move |report: Report| {
                record(&stats, &log, &report);
                drop(leader);
            },
        )
        .await;
        match relayed {
            Relayed::Whole(body) => {
                // Ours now, whatever upstream said (a coded length, or none).
                rparts.headers.remove(header::CONTENT_LENGTH);
                Response::from_parts(rparts, full(body))
            }
            Relayed::Stream(body) => Response::from_parts(rparts, body),
            Relayed::Failed {
                reason,
                corrupt: true,
            } if attempt == Attempt::First && had_basis => {
                // The basis is dropped by now; the retry cannot loop.
                tracing::warn!(url = %key, %reason, "rebuilt body failed its checks; fetching it whole");
                Box::pin(self.fetch_with(parts, target, key, None, None, Attempt::WithoutBasis))
                    .await
            }
            Relayed::Failed { reason, .. } => error(
                StatusCode::BAD_GATEWAY,
                format!("the upstream body failed: {reason}; retry"),
            ),
        }
    }
}

/// Adds the hsync coding first to `Accept-Encoding`.
fn offer_hsync(headers: &mut HeaderMap) {
    let others: Vec<String> = headers
        .get_all(header::ACCEPT_ENCODING)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .filter(|c| !c.is_empty())
        .filter(|c| {
            !c.split(';')
                .next()
                .is_some_and(|t| t.trim().eq_ignore_ascii_case(HSYNC_CODING))
        })
        .map(str::to_owned)
        .collect();
    let value = std::iter::once(HSYNC_CODING.to_owned())
        .chain(others)
        .collect::<Vec<_>>()
        .join(", ");
    headers.insert(
        header::ACCEPT_ENCODING,
        HeaderValue::from_str(&value).unwrap_or(HeaderValue::from_static(HSYNC_CODING)),
    );
}

/// How a response's `Content-Encoding` involves hsync.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum HsyncCoded {
    /// Not at all.
    No,
    /// hsync alone (`identity` beside it changes nothing): we decode it.
    Yes,
    /// hsync with other codings over or under it, or a coding list we
    /// cannot read: nothing we can undo, and never for a user agent.
    Layered,
}

pub(super) fn hsync_coded(headers: &HeaderMap) -> HsyncCoded {
    let mut codings = Vec::new();
    for value in headers.get_all(header::CONTENT_ENCODING) {
        let Ok(value) = value.to_str() else {
            return if value
                .as_bytes()
                .windows(5)
                .any(|w| w.eq_ignore_ascii_case(b"hsync"))
            {
                HsyncCoded::Layered
            } else {
                HsyncCoded::No
            };
        };
        codings.extend(
            value
                .split(',')
                .map(str::trim)
                .filter(|c| !c.is_empty() && !c.eq_ignore_ascii_case("identity")),
        );
    }
    let hsync = codings
        .iter()
        .filter(|c| c.eq_ignore_ascii_case(HSYNC_CODING))
        .count();
    match (hsync, codings.len()) {
        (0, _) => HsyncCoded::No,
        (1, 1) => HsyncCoded::Yes,
        _ => HsyncCoded::Layered,
    }
}

fn is_hsync(headers: &HeaderMap) -> bool {
    hsync_coded(headers) == HsyncCoded::Yes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hsync_offer_goes_first_and_once() {
        let mut headers = HeaderMap::new();
        headers.insert(
            header::ACCEPT_ENCODING,
            HeaderValue::from_static("gzip, HSYNC;q=0.1, br"),
        );
        offer_hsync(&mut headers);
        assert_eq!(headers[header::ACCEPT_ENCODING], "hsync, gzip, br");
        let mut none = HeaderMap::new();
        offer_hsync(&mut none);
        assert_eq!(none[header::ACCEPT_ENCODING], "hsync");
    }
}
