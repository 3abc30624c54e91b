//! Going upstream for a GET the cache could not answer: the request goes
//! with the hsync offer, a basis ([`super::basis`]) and, for a stale entry,
//! its validators. A way that failed before answering anything (or is
//! marked down) passes the GET to the route's next way, the basis going
//! along only within what that one accepts (none to a direct way whose
//! host has not answered in hsync). Everything the trip can end in is one
//! [`Answer`], and [`ClientProxy::fetch`] turns each into the user agent's
//! response in one match: a failure (or a stale entry served in its
//! place, RFC 5861 §4: no answer, a 5xx, or a body that failed before the
//! user agent saw a byte of it), a 304 that refreshes the entry, an answer
//! passed through, a body relayed, or a rebuilt body that failed its
//! checks and is fetched once more whole.
//!
//! Leaves out: the trip itself and the queue wait on the way
//! ([`super::upstream`], [`super::queue_wait`]), rebuilding, checking and
//! storing the body ([`super::transfer`]), serving a stored entry
//! ([`super::hit`]).
//!
//! Main types: [`Answer`], [`Attempt`].

use std::sync::Arc;
use std::time::Instant;

use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::request::Parts;
use http::{Response, StatusCode};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use tokio::sync::oneshot;

use super::basis::{BasisBody, BasisOffer};
use super::coalesce;
use super::entry::{content_length, stored_headers, strip_hsync_vary, strip_vary};
use super::partial::{self, Chained, Resume};
use super::queue_wait::Observed;
use super::stats::{LoggedAtEnd, RequestLog, Started, record};
use super::transfer::{
    self, ClientBasis, Coding, OriginDigest, Outcome, Relay, Relayed, Report, full,
};
use super::{CACHE_NAME, CACHE_STATUS, ClientProxy, ClientStats, Target, empty, unix_now};
use crate::cache::freshness::{self, CacheStatus, Forward, Storability};
use crate::cache::{CacheKey, Completeness, Entry};
use crate::hsync::{DecodeLimits, FileBasis};
use crate::http::access_log::Note;
use crate::http::error::ProxyError;
use crate::http::headers::{
    HSYNC_ACCEPT, HSYNC_BASIS, HSYNC_CODING, HSYNC_ETAG, HSYNC_HELD, HSYNC_MISSED, HSYNC_SIGNATURE,
    HSYNC_SIGNATURE_LENGTH, add_via, restore_etag, strip_hop_by_hop,
};
use crate::http::metrics::nanos;
use crate::http::server::{BodyError, ProxyBody, with_length};
use crate::http::upstream_guard::{self, ExchangeCheck};

/// Which try of a fetch this is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Attempt {
    /// With the basis chosen for it.
    First,
    /// After the first one's rebuilt body failed its checks.
    WithoutBasis,
}

/// What a fetch upstream ended in; [`ClientProxy::fetch_with`] answers
/// each in one match.
enum Answer {
    /// No usable answer head: unreachable, timed out, refused our
    /// credentials, malformed.
    Unanswered(ProxyError),
    /// Upstream failed (no answer, or a 5xx) and the stale entry answered
    /// instead (RFC 5861 `stale-if-error`).
    ServedStale(Response<ProxyBody>),
    /// A 304 to our validators: the stale entry is good again, with these
    /// headers merged into it.
    NotModified {
        /// The entry revalidated.
        entry: Entry,
        /// The 304's headers.
        headers: HeaderMap,
        /// When the revalidation was asked (seconds since the epoch).
        asked_at: u64,
    },
    /// An answer that can be neither used nor passed on (502): a broken
    /// head, hsync layered with other codings.
    Unusable(String),
    /// A coded answer we cannot rebuild because our own basis file cannot
    /// be read: our failure, answered 502 as a failed fetch.
    BasisUnreadable(std::io::Error),
    /// Coded against a basis we did not offer.
    ForeignBasis,
    /// Neither hsync-coded nor storable: passed through as it came.
    PassedThrough(Response<ProxyBody>),
    /// Relayed, rebuilt and checked (and stored when storable), whole or
    /// streaming.
    Relayed(Response<ProxyBody>),
    /// The body rebuilt against our basis failed its checks before the
    /// user agent saw a byte.
    RebuiltWrong {
        /// Why.
        reason: String,
    },
    /// A resume by Range (RFC 9111 §3.4) answered with a piece that is not
    /// the rest of the stored prefix (another ETag, coding, offset or
    /// length), or with 416: the prefix is discarded and the body fetched
    /// whole.
    ResumeRefused {
        /// Why.
        reason: String,
        /// The partial entry and its body's digest.
        partial: (CacheKey, blake3::Hash),
    },
    /// The body failed otherwise before the user agent saw a byte.
    BodyFailed {
        /// Why.
        reason: String,
        /// The stale entry that `stale-if-error` allows in its place.
        stale: Option<Entry>,
    },
}

/// An answer head worth relaying, and what was decided about it.
struct Relayable {
    head: http::response::Parts,
    body: ProxyBody,
    /// Coded with hsync (against the basis offered).
    hsync: bool,
    /// To be stored (RFC 9111, and status 200).
    storable: bool,
    /// Its `Cache-Status`.
    outcome: CacheStatus,
    /// The upstream (and the URL it was asked for) that said it keeps the
    /// body as a basis if no longer than the limit (`Hsync-Held`): told
    /// the body's digest once whole.
    held_by: Option<(Arc<super::upstream::Upstream>, http::Uri, u64)>,
    /// The stale entry to answer with, should the body fail before the
    /// user agent saw a byte of it (RFC 5861 §4).
    stale_on_error: Option<Entry>,
    /// What the body is of the representation.
    piece: Piece,
}

/// What a relayed body is of the representation (RFC 9111 §3.3–3.4).
enum Piece {
    /// All of it, as it came.
    Whole,
    /// A 206 from the first byte: relayed as it came, stored as a prefix
    /// (whole when it reaches the end).
    FromStart {
        /// The whole representation's length.
        complete_len: u64,
    },
    /// A stored prefix and the 206 that brought the rest, served as one
    /// 200.
    Resumed {
        /// The whole representation's length.
        complete_len: u64,
        /// The partial entry, discarded if the joined body fails a check.
        partial: (CacheKey, blake3::Hash),
    },
}

/// Request headers that make a request conditional.
const CONDITIONAL_HEADERS: [HeaderName; 5] = [
    header::IF_NONE_MATCH,
    header::IF_MODIFIED_SINCE,
    header::IF_MATCH,
    header::IF_UNMODIFIED_SINCE,
    header::IF_RANGE,
];

/// Whether a request carries conditions of its own.
pub(super) fn is_conditional(headers: &HeaderMap) -> bool {
    CONDITIONAL_HEADERS
        .iter()
        .any(|name| headers.contains_key(name))
}

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

    /// Fetches for a navigation: the fetch runs as a task of its own, so
    /// that when it has waited `--queue-page-after` in the upstream's
    /// queue the user agent can be given the waiting page while the wait
    /// goes on.
    pub(super) async fn fetch_navigation(
        self: Arc<Self>,
        mut parts: Parts,
        target: Target,
        key: CacheKey,
        stale: Option<Entry>,
        leader: Option<coalesce::Leader>,
    ) -> Response<ProxyBody> {
        let navigation = self.waits.begin_navigation(&key, &mut parts);
        let (mut sender, result) = oneshot::channel();
        let fetch = self.clone().fetch(parts, target, key, stale, leader);
        tokio::spawn(async move {
            tokio::select! {
                response = fetch => {
                    let _ = sender.send(response);
                }
                // Nobody will take the answer any more: stop waiting.
                () = sender.closed() => {}
            }
        });
        self.waits
            .watch_navigation(navigation, result, &self.config.via_name)
            .await
    }

    /// [`fetch`](Self::fetch), once more without a basis when a small body
    /// rebuilt against one failed its checks before the user agent saw a
    /// byte (D-A1, D-A4: the full fetch serves the right bytes).
    async fn fetch_with(
        self: Arc<Self>,
        parts: Parts,
        mut target: Target,
        key: CacheKey,
        stale: Option<Entry>,
        mut leader: Option<coalesce::Leader>,
        attempt: Attempt,
    ) -> Response<ProxyBody> {
        // A prefix kept of this URL is completed by Range where that is
        // sound (RFC 9111 §3.4), else it is the basis of a coded fetch.
        let mut resume = None;
        let stale = match stale {
            Some(entry)
                if attempt == Attempt::First && self.is_resumable(&entry, &parts, &target) =>
            {
                resume = self.resume_from(entry).await;
                None
            }
            stale => stale,
        };
        let basis = match attempt {
            Attempt::First if resume.is_some() => None,
            Attempt::First => {
                let basis = self.choose_basis(&target, &key, stale.as_ref()).await;
                let basis_key = basis.as_ref().map(|basis| &basis.key);
                self.stats.basis.count(&key, basis_key);
                basis
            }
            Attempt::WithoutBasis => None,
        };
        let stale_complete =
            stale.filter(|e| e.meta.completeness == Completeness::Complete && e.meta.status == 200);
        // The leader stays until the answer is served from here, unless
        // the answer's body carries it.
        let answer = self
            .ask(
                &parts,
                &mut target,
                &key,
                basis,
                stale_complete,
                resume,
                &mut leader,
            )
            .await;
        match answer {
            Answer::Unanswered(refusal) => refusal.log_and_respond(),
            Answer::ServedStale(response)
            | Answer::PassedThrough(response)
            | Answer::Relayed(response) => response,
            Answer::NotModified {
                entry,
                headers,
                asked_at,
            } => self.refreshed(entry, &headers, &parts, asked_at).await,
            Answer::Unusable(message) => {
                ProxyError::bad_upstream_response(message).log_and_respond()
            }
            Answer::BasisUnreadable(e) => {
                ProxyError::internal_bad_gateway(format!("cannot read the basis: {e}"))
                    .log_and_respond()
            }
            Answer::ForeignBasis => {
                ClientStats::add(&self.stats.digest_failures, 1);
                ProxyError::bad_upstream_response("upstream coded against a basis we did not offer")
                    .log_and_respond()
            }
            Answer::ResumeRefused {
                reason,
                partial: (partial, digest),
            } => {
                tracing::warn!(url = %key, %reason, "the rest of a kept prefix does not match it; discarded, fetching the body whole");
                let store = self.store.clone();
                let _ =
                    tokio::task::spawn_blocking(move || store.quarantine(&partial, digest)).await;
                Box::pin(self.fetch_with(parts, target, key, None, leader, Attempt::WithoutBasis))
                    .await
            }
            Answer::RebuiltWrong { reason } if attempt == Attempt::First => {
                // The basis is dropped by now; the retry cannot loop.
                tracing::warn!(url = %key, %reason, "rebuilt body failed its checks; fetching it whole");
                Box::pin(self.fetch_with(parts, target, key, None, None, Attempt::WithoutBasis))
                    .await
            }
            Answer::BodyFailed {
                reason,
                stale: Some(entry),
            } => {
                // RFC 5861 §4: a connection that dropped mid-body is an
                // error like a 5xx, as long as the user agent saw nothing
                // of it yet (past that, only a cut can tell it).
                tracing::debug!(url = %key, %reason, "upstream body failed; serving the stale entry");
                match self.serve_stale_on_error(entry, &parts, None).await {
                    Some(response) => response,
                    None => ProxyError::bad_upstream_response(format!(
                        "the upstream body failed: {reason}; retry"
                    ))
                    .log_and_respond(),
                }
            }
            Answer::RebuiltWrong { reason } | Answer::BodyFailed { reason, .. } => {
                ProxyError::bad_upstream_response(format!(
                    "the upstream body failed: {reason}; retry"
                ))
                .log_and_respond()
            }
        }
    }

    /// Asks upstream, offering hsync against `basis` and revalidating
    /// `stale` (a complete 200), and reads the answer's head; a body worth
    /// relaying goes on to [`relay`](Self::relay). A way that fails before
    /// answering passes the request to the next of the route's, which
    /// `target` then is.
    #[allow(clippy::too_many_arguments)]
    async fn ask(
        &self,
        parts: &Parts,
        target: &mut Target,
        key: &CacheKey,
        mut basis: Option<BasisOffer>,
        mut stale: Option<Entry>,
        resume: Option<Resume>,
        leader: &mut Option<coalesce::Leader>,
    ) -> Answer {
        let mut headers = parts.headers.clone();
        let revalidating = stale.is_some();
        if let Some(resume) = &resume {
            resume.ask_rest(&mut headers);
        }
        if let Some(entry) = &stale {
            // We answer the user agent's own conditions from the entry.
            for name in CONDITIONAL_HEADERS {
                headers.remove(name);
            }
            headers.extend(freshness::conditional_headers(&stored_headers(entry)));
        }
        if resume.is_none() {
            offer_hsync(&mut headers);
        }
        let (response, now, by_digest) = loop {
            let mut headers = headers.clone();
            // A basis the upstream said it keeps goes by its digest alone:
            // the signature is most of a small update's bytes (issue 20).
            let by_digest = basis
                .as_ref()
                .is_some_and(|offer| target.upstream.holds(&target.url, &offer.digest));
            let (signature_len, body) = match &basis {
                Some(offer) if target.upstream.holds(&target.url, &offer.digest) => {
                    headers.insert(HSYNC_BASIS, offer.name.clone());
                    // Its delta will be small: we may as well hold the
                    // body until END and compute its signature ourselves
                    // (the decoder does anyway) than take SIG frames.
                    headers.insert(HSYNC_ACCEPT, no_sig_offer());
                    (0, empty())
                }
                Some(offer) => {
                    headers.insert(HSYNC_BASIS, offer.name.clone());
                    match self.body_signature(target, offer).await {
                        Some(signature) => {
                            // Too fine for a header: it goes as the body.
                            headers.insert(HSYNC_SIGNATURE_LENGTH, signature.len().into());
                            let len = signature.len() as u64;
                            (len, full(signature))
                        }
                        None => {
                            headers.insert(HSYNC_SIGNATURE, offer.signature.clone());
                            (offer.signature_len as u64, empty())
                        }
                    }
                }
                None => (0, empty()),
            };
            let mut outbound = self.outbound(parts, headers, target, body);
            if let Some(observed) = parts.extensions.get::<Observed>() {
                // A navigation's wait goes along: the queue wait shows its
                // place on the waiting page.
                outbound.extensions_mut().insert(observed.clone());
            }
            let now = unix_now();
            match self.send(outbound, target).await {
                Ok(response) => {
                    // Counted where it went: a way that was not reached
                    // did not take it.
                    if signature_len > 0 {
                        ClientStats::add(&self.stats.signature_bytes, signature_len);
                        if let Some(note) = parts.extensions.get::<Note>() {
                            note.to_upstream(signature_len);
                        }
                    }
                    break (response, now, by_digest);
                }
                // A GET (its body, if any, is not sent): safe to repeat.
                Err(refusal) if let Some(next) = self.fail_over(target, &refusal) => {
                    *target = next;
                    // Each way gets a signature only within what it
                    // accepts: none to a direct way's host that has not
                    // answered in hsync.
                    let budget = self.signature_budget(target);
                    basis = basis.filter(|offer| offer.signature_len <= budget);
                }
                Err(refusal) => {
                    if let Some(entry) = stale
                        && let Some(response) = self.serve_stale_on_error(entry, parts, None).await
                    {
                        return Answer::ServedStale(response);
                    }
                    return Answer::Unanswered(refusal);
                }
            }
        };
        let (mut rparts, rbody) = response.into_parts();
        rparts.version = http::Version::HTTP_11;
        if let Err(e) = strip_hop_by_hop(&mut rparts.headers) {
            return Answer::Unusable(format!("upstream response: {e}"));
        }
        // Between the proxies only: remembered once the body is whole, if
        // it is no longer than the upstream keeps.
        let held_up_to = rparts
            .headers
            .remove(HSYNC_HELD)
            .and_then(|value| value.to_str().ok()?.parse::<u64>().ok());
        if rparts.headers.remove(HSYNC_MISSED).is_some() && by_digest {
            tracing::info!(url = %key, "the upstream no longer holds a basis it said it kept; signatures go there for a while");
            target.upstream.distrust_held(&target.url);
        }

        if rparts.status == StatusCode::NOT_MODIFIED
            && let Some(entry) = stale
        {
            return Answer::NotModified {
                entry,
                headers: rparts.headers,
                asked_at: now,
            };
        }
        if rparts.status.is_server_error()
            && stale
                .as_ref()
                .is_some_and(|entry| self.may_serve_stale_on_error(entry, parts))
            && let Some(entry) = stale.take()
            && let Some(response) = self
                .serve_stale_on_error(entry, parts, Some(rparts.status))
                .await
        {
            return Answer::ServedStale(response);
        }
        if let Some(resume) = resume {
            let partial = (resume.key.clone(), resume.digest);
            match rparts.status {
                StatusCode::PARTIAL_CONTENT => {
                    return self
                        .relay_resumed(parts, key, resume, rparts, rbody, now, leader)
                        .await;
                }
                StatusCode::RANGE_NOT_SATISFIABLE => {
                    return Answer::ResumeRefused {
                        reason: "416 to the rest of the kept prefix".into(),
                        partial,
                    };
                }
                // A 200 (If-Range found another representation) is a
                // whole new body, as on any miss; an error passes on.
                _ => {}
            }
        }
        if hsync_coded(&rparts.headers) == HsyncCoded::Layered {
            return Answer::Unusable(
                "upstream layered other codings with hsync; it cannot be undone here".into(),
            );
        }
        let hsync = is_hsync(&rparts.headers);
        if hsync {
            // The answer names the basis it was coded against, but for one
            // named by digest alone (the 60 bytes are a tenth of a small
            // update): coded against any other, it fails its digest at
            // END, where a stream without SIG frames has let nothing out.
            let sent = basis.as_ref().map(|b| &b.name);
            let named = rparts.headers.get(HSYNC_BASIS);
            if named != sent && !(named.is_none() && by_digest) {
                return Answer::ForeignBasis;
            }
            ClientStats::add(&self.stats.deltas, 1);
            rparts.headers.remove(header::CONTENT_ENCODING);
            rparts.headers.remove(header::CONTENT_LENGTH);
            rparts.headers.remove(HSYNC_BASIS);
            rparts.headers.remove(HSYNC_ACCEPT);
            strip_vary(&mut rparts.headers, &["accept-encoding", "hsync-basis"]);
            // The body is the origin's, byte for byte, once verified (and
            // never served otherwise): its strong validator applies.
            restore_etag(&mut rparts.headers);
        }
        rparts.headers.remove(HSYNC_ETAG);
        strip_hsync_vary(&mut rparts.headers);
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
        // A 206 from the first byte with a strong ETag may start a partial
        // entry, under the rules a 200 is stored by (RFC 9111 §3.3).
        let from_start = (rparts.status == StatusCode::PARTIAL_CONTENT && !hsync)
            .then(|| partial::keepable_206(&rparts.headers))
            .flatten()
            .filter(|range| self.is_longer_than_kept(key, range.len()));
        let stored_status = if from_start.is_some() {
            StatusCode::OK
        } else {
            rparts.status
        };
        let storable = match freshness::storability(
            &parts.method,
            &parts.headers,
            stored_status,
            &self.caching_view(parts, &rparts.headers),
            self.is_shared(),
            self.config.set_cookie,
        ) {
            Storability::Storable => true,
            Storability::NotStorable(reason) => {
                tracing::debug!(url = %key, reason, "not storable");
                false
            }
        };
        if !hsync && !storable {
            drop(leader.take());
            ClientStats::add(&self.stats.passed, 1);
            rparts
                .headers
                .insert(CACHE_STATUS, freshness::cache_status(CACHE_NAME, &outcome));
            add_via(&mut rparts.headers, &self.config.via_name);
            return Answer::PassedThrough(Response::from_parts(
                rparts,
                rbody.map_err(BodyError::from).boxed(),
            ));
        }
        let piece = match from_start {
            Some(range) if storable => Piece::FromStart {
                complete_len: range.complete_len,
            },
            _ => Piece::Whole,
        };
        let relayable = Relayable {
            head: rparts,
            body: rbody.map_err(BodyError::from).boxed(),
            piece,
            hsync,
            storable,
            outcome,
            held_by: held_up_to.map(|limit| (target.upstream.clone(), target.url.clone(), limit)),
            stale_on_error: stale.filter(|entry| self.may_serve_stale_on_error(entry, parts)),
        };
        self.relay(parts, key, relayable, basis, now, leader).await
    }

    /// Relays an answer's body to the user agent: rebuilt from hsync
    /// against `basis` or taken as it comes, checked, and stored when
    /// storable. The leader goes with the body, until it ends.
    async fn relay(
        &self,
        parts: &Parts,
        key: &CacheKey,
        answer: Relayable,
        basis: Option<BasisOffer>,
        asked_at: u64,
        leader: &mut Option<coalesce::Leader>,
    ) -> Answer {
        let Relayable {
            head: mut rparts,
            body: rbody,
            hsync,
            storable,
            outcome,
            held_by,
            stale_on_error,
            piece,
        } = answer;
        let (stored_status, complete_len) = match &piece {
            Piece::Whole => (rparts.status, None),
            Piece::FromStart { complete_len } | Piece::Resumed { complete_len, .. } => {
                (StatusCode::OK, Some(*complete_len))
            }
        };
        let store_target = if storable {
            self.begin_entry(
                key,
                &parts.headers,
                (stored_status, &rparts.headers),
                asked_at,
                hsync,
                complete_len,
            )
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
                    Err(e) => return Answer::BasisUnreadable(e),
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
        // Content-Digest is of the bytes that came (a 206's: its piece),
        // Repr-Digest of the whole representation (RFC 9530): each is
        // checked where the relayed body is what it describes.
        let mut origin_digests = Vec::new();
        if !matches!(piece, Piece::Resumed { .. }) {
            origin_digests = OriginDigest::parse_all(&rparts.headers, "content-digest");
        }
        if !matches!(piece, Piece::FromStart { .. })
            && (hsync || !rparts.headers.contains_key(header::CONTENT_ENCODING))
        {
            origin_digests.extend(OriginDigest::parse_all(&rparts.headers, "repr-digest"));
        }
        // A joined body that fails a check takes its stored prefix with it.
        let discard = match piece {
            Piece::Resumed { partial, .. } => Some((self.store.clone(), partial)),
            _ => None,
        };
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
            note: parts.extensions.get::<Note>().cloned(),
        };
        rparts.extensions.insert(LoggedAtEnd);
        let leader = leader.take();
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
                hold_head: stale_on_error.is_some(),
            },
            self.config.upstream_timeout.min(transfer::WHOLE_WAIT),
            move |report: Report| {
                ClientStats::add(&stats.decode_busy_nanos, nanos(report.busy));
                if let (Some((upstream, url, limit)), Some(digest)) =
                    (&held_by, report.committed_digest)
                    && report.body_bytes <= *limit
                {
                    upstream.remember_held(url, digest);
                }
                if let (Some((store, (partial, digest))), Outcome::Corrupt { .. }) =
                    (&discard, &report.outcome)
                {
                    store.quarantine(partial, *digest);
                }
                record(&stats, &log, &report);
                drop(leader);
            },
        )
        .await;
        match relayed {
            Relayed::Whole(body) => {
                // Ours now, whatever upstream said (a coded length, or none).
                rparts.headers.remove(header::CONTENT_LENGTH);
                Answer::Relayed(Response::from_parts(rparts, full(body)))
            }
            Relayed::Excess(body) => {
                rparts.headers.remove(header::CONTENT_LENGTH);
                upstream_guard::refuse_storing(&mut rparts.headers);
                Answer::Relayed(Response::from_parts(rparts, full(body)))
            }
            Relayed::Stream { body, rebuilt_len } => {
                // An hsync body rebuilt whole before its head: its length,
                // for the user agent (and for the coder of a downstream
                // client proxy, which can then leave out SIG frames).
                if let Some(len) = rebuilt_len {
                    rparts
                        .headers
                        .insert(header::CONTENT_LENGTH, HeaderValue::from(len));
                }
                // A length the user agent is told: the answer ends with its
                // last byte (a large body is stored after that), and a log
                // line counts it whole.
                let body = match content_length(&rparts.headers) {
                    Some(len) => with_length(body, len),
                    None => body,
                };
                Answer::Relayed(Response::from_parts(rparts, body))
            }
            Relayed::Failed {
                reason,
                corrupt: true,
            } if had_basis => Answer::RebuiltWrong { reason },
            Relayed::Failed { reason, .. } => Answer::BodyFailed {
                reason,
                stale: stale_on_error,
            },
        }
    }
}

impl ClientProxy {
    /// The rest of a kept prefix came (a 206 to `Range: bytes=N-` with
    /// `If-Range`): when it is the rest of the same representation, the
    /// prefix and it go to the user agent as one 200 and are stored as the
    /// whole body (RFC 9111 §3.4), checked as any body is (its length,
    /// Repr-Digest); otherwise the prefix is discarded.
    #[allow(clippy::too_many_arguments)]
    async fn relay_resumed(
        &self,
        parts: &Parts,
        key: &CacheKey,
        resume: Resume,
        mut rparts: http::response::Parts,
        rbody: Incoming,
        asked_at: u64,
        leader: &mut Option<coalesce::Leader>,
    ) -> Answer {
        let partial = (resume.key.clone(), resume.digest);
        let range = match resume.rest_in(&rparts.headers) {
            Ok(range) => range,
            Err(reason) => return Answer::ResumeRefused { reason, partial },
        };
        if content_length(&rparts.headers).is_some_and(|len| len != range.len()) {
            return Answer::ResumeRefused {
                reason: "a 206 whose Content-Length is not its range's".into(),
                partial,
            };
        }
        rparts.status = StatusCode::OK;
        rparts.headers.remove(header::CONTENT_RANGE);
        rparts.headers.remove(HSYNC_ETAG);
        rparts.headers.insert(
            header::CONTENT_LENGTH,
            HeaderValue::from(range.complete_len),
        );
        let storable = freshness::storability(
            &parts.method,
            &parts.headers,
            StatusCode::OK,
            &self.caching_view(parts, &rparts.headers),
            self.is_shared(),
            self.config.set_cookie,
        ) == Storability::Storable;
        if !storable {
            return Answer::ResumeRefused {
                reason: "the rest is not storable".into(),
                partial,
            };
        }
        ClientStats::add(&self.stats.misses, 1);
        tracing::debug!(url = %key, from = resume.prefix_len, len = range.complete_len, "completing a kept prefix by Range");
        let relayable = Relayable {
            head: rparts,
            body: Chained::new(resume.prefix, rbody.map_err(BodyError::from).boxed()).boxed(),
            hsync: false,
            storable,
            outcome: CacheStatus::forwarded(Forward::Partial),
            held_by: None,
            stale_on_error: None,
            piece: Piece::Resumed {
                complete_len: range.complete_len,
                partial,
            },
        };
        self.relay(parts, key, relayable, None, asked_at, leader)
            .await
    }
}

/// Adds the hsync coding first to `Accept-Encoding`.
/// Largest body whose SIG frames we do without, against a basis the
/// upstream holds (`Hsync-Accept: no-sig=N`). The rebuilt body is then
/// held until END verifies it (within the transfer's unverified bound):
/// the user agent gets nothing until the origin has sent it all, which
/// for a script or a stylesheet (of use only whole) costs nothing, and for
/// a page its progressive display. 2 MiB covers the corpus's largest
/// releases (three.js, 1.3 MB), whose SIG frames would be 4.6 KB each.
const NO_SIG_UP_TO: u64 = 2 << 20;

fn no_sig_offer() -> HeaderValue {
    HeaderValue::from_str(&format!("no-sig={NO_SIG_UP_TO}")).expect("ASCII")
}

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
