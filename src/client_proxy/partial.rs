//! Partial content (RFC 9111 §3.3 storing incomplete responses, §3.4
//! combining them): what a 206 must show to be kept, completing a kept
//! prefix with `Range: bytes=N-` and `If-Range`, and the body that joins
//! the prefix to the rest.
//!
//! A partial entry is always a *prefix* of one representation: the bytes
//! from the first on, verified (an interrupted transfer's, or a 206 that
//! began at byte 0), with the whole length when known
//! ([`crate::cache::NewEntry::complete_len`]). A 206 that starts further
//! on is relayed and not kept: the store holds one contiguous body per
//! entry, and a gap would need another format. Every piece is tied to the
//! others by one strong ETag (RFC 9110 §8.8.3: the same bytes, byte for
//! byte) and the same content coding; a piece that differs discards the
//! prefix rather than join it.
//!
//! A resume goes by Range only to an upstream that has not shown it codes
//! with hsync: against such an upstream (the accelerator) the prefix is
//! the basis of a coded fetch instead (its literals come compressed).
//!
//! Leaves out: answering ranges of a stored body ([`super::ranges`]), the
//! relay that checks and stores what comes ([`super::transfer`]).
//!
//! Main items: [`ContentRange`], [`Resume`], [`Chained`].

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderValue};
use http::request::Parts;
use hyper::body::{Body, Frame};

use super::cached_body::CachedBody;
use super::entry::stored_headers;
use super::transfer::full;
use super::{ClientProxy, Target};
use crate::cache::{CacheKey, Completeness, Entry};
use crate::http::headers::is_strong_etag;
use crate::http::server::{BodyError, ProxyBody};

/// `Content-Range: bytes first-last/complete` (RFC 9110 §14.4), with the
/// complete length known.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct ContentRange {
    /// The first byte's offset.
    pub(super) first: u64,
    /// The last byte's offset (inclusive).
    pub(super) last: u64,
    /// The whole representation's length.
    pub(super) complete_len: u64,
}

impl ContentRange {
    /// The range's length in bytes.
    pub(super) fn len(&self) -> u64 {
        self.last - self.first + 1
    }
}

/// The one `Content-Range` of `headers`, when it is a satisfied range
/// with a known complete length that holds it; `None` for `*` lengths,
/// several values, other units or nonsense.
pub(super) fn content_range(headers: &HeaderMap) -> Option<ContentRange> {
    let mut values = headers.get_all(header::CONTENT_RANGE).iter();
    let value = values.next()?.to_str().ok()?;
    if values.next().is_some() {
        return None;
    }
    let (range, complete) = value.trim().strip_prefix("bytes ")?.split_once('/')?;
    let (first, last) = range.split_once('-')?;
    let number = |s: &str| {
        let s = s.trim();
        (!s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
            .then(|| s.parse::<u64>().ok())
            .flatten()
    };
    let (first, last, complete_len) = (number(first)?, number(last)?, number(complete)?);
    (first <= last && last < complete_len).then_some(ContentRange {
        first,
        last,
        complete_len,
    })
}

/// The response's ETag, when it is one strong tag.
pub(super) fn strong_etag(headers: &HeaderMap) -> Option<&HeaderValue> {
    let mut values = headers.get_all(header::ETAG).iter();
    let etag = values.next()?;
    (values.next().is_none() && is_strong_etag(etag)).then_some(etag)
}

/// The content codings that apply, as one comparable string (`identity`
/// and order-preserving whitespace aside).
fn codings(headers: &HeaderMap) -> String {
    headers
        .get_all(header::CONTENT_ENCODING)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|c| c.trim().to_ascii_lowercase())
        .filter(|c| !c.is_empty() && c != "identity")
        .collect::<Vec<_>>()
        .join(",")
}

/// The range of a 206 that may start a partial entry (RFC 9111 §3.3): it
/// begins at the first byte, names its complete length, and carries a
/// strong ETag that later pieces can be matched against. Whether the
/// response may be stored at all is the same decision as for a 200
/// ([`crate::cache::freshness::storability`]), made by the caller.
pub(super) fn keepable_206(headers: &HeaderMap) -> Option<ContentRange> {
    let range = content_range(headers)?;
    (range.first == 0 && strong_etag(headers).is_some()).then_some(range)
}

/// A partial entry being completed by Range: its verified prefix, ready
/// to go first, and what the rest must match.
pub(super) struct Resume {
    /// The prefix's bytes, checked against the entry's digest before
    /// (or, for a large one, as) they go.
    pub(super) prefix: ProxyBody,
    /// The prefix's length: the rest is asked from this offset.
    pub(super) prefix_len: u64,
    /// The stored strong ETag, sent as `If-Range`.
    pub(super) etag: HeaderValue,
    /// The stored content codings.
    codings: String,
    /// The whole length the prefix was stored with, if known.
    complete_len: Option<u64>,
    /// The partial entry, to discard when the rest does not match it.
    pub(super) key: CacheKey,
    /// Its body's digest (discarded only while it is still that body).
    pub(super) digest: blake3::Hash,
}

impl Resume {
    /// The headers that ask for the rest: `Range: bytes=N-` and
    /// `If-Range` with the strong ETag, without the user agent's own
    /// conditions (a resume is asked only without them).
    pub(super) fn ask_rest(&self, headers: &mut HeaderMap) {
        headers.insert(
            header::RANGE,
            HeaderValue::from_str(&format!("bytes={}-", self.prefix_len)).expect("ASCII"),
        );
        headers.insert(header::IF_RANGE, self.etag.clone());
    }

    /// The range of a 206 that is exactly the rest of this prefix: from
    /// the prefix's end to the end of the same representation (the same
    /// strong ETag, content codings and, if known, length). `Err` says
    /// what differs; the prefix is then discarded.
    pub(super) fn rest_in(&self, headers: &HeaderMap) -> Result<ContentRange, String> {
        let Some(range) = content_range(headers) else {
            return Err("a 206 without a usable Content-Range".into());
        };
        if strong_etag(headers) != Some(&self.etag) {
            return Err("a 206 for another representation (its ETag)".into());
        }
        if codings(headers) != self.codings {
            return Err("a 206 in other content codings".into());
        }
        if range.first != self.prefix_len || range.last + 1 != range.complete_len {
            return Err(format!(
                "bytes {}-{} of {} where the rest from {} was asked",
                range.first, range.last, range.complete_len, self.prefix_len
            ));
        }
        if self
            .complete_len
            .is_some_and(|len| len != range.complete_len)
        {
            return Err("a 206 of another length than the stored prefix's".into());
        }
        Ok(range)
    }
}

impl ClientProxy {
    /// Whether `entry`, a partial entry of this URL, is completed by
    /// asking for the rest by Range: a verified prefix of a 200 with a
    /// strong ETag, from an upstream that said `Accept-Ranges: bytes` and
    /// has not shown it codes (the accelerator resumes a prefix as a
    /// coded fetch's basis), for a plain GET of the whole body (no Range,
    /// no conditions of the user agent's own).
    pub(super) fn is_resumable(&self, entry: &Entry, parts: &Parts, target: &Target) -> bool {
        if entry.meta.completeness != Completeness::Partial
            || entry.meta.status != 200
            || entry.meta.body_len == 0
            || parts.method != http::Method::GET
            || parts.headers.contains_key(header::RANGE)
            || super::fetch::is_conditional(&parts.headers)
            || target.upstream.advertised(&target.url).is_some()
        {
            return false;
        }
        let stored = stored_headers(entry);
        let ranges = stored
            .get_all(header::ACCEPT_RANGES)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .any(|unit| unit.trim().eq_ignore_ascii_case("bytes"));
        ranges && strong_etag(&stored).is_some()
    }

    /// Whether a piece of `len` bytes from the first byte adds to what is
    /// kept for `key`: not over a whole entry, nor over a longer prefix.
    pub(super) fn is_longer_than_kept(&self, key: &CacheKey, len: u64) -> bool {
        self.store
            .lookup(key)
            .is_none_or(|kept| kept.completeness == Completeness::Partial && kept.body_len < len)
    }

    /// Prepares the resume of `entry` (see [`Self::is_resumable`]): its
    /// prefix read and, up to [`super::cached_body::SMALL_BODY`], checked whole
    /// now. `None` when it failed its check (it is quarantined then).
    pub(super) async fn resume_from(&self, entry: Entry) -> Option<Resume> {
        let stored = stored_headers(&entry);
        let etag = strong_etag(&stored)?.clone();
        let key = entry.meta.key().ok()?;
        let digest = entry.meta.body_digest().ok()?;
        let (len, outboard, complete_len) = (
            entry.meta.body_len,
            entry.meta.outboard(),
            entry.meta.complete_len,
        );
        let prefix = self
            .serve_checked(entry.body, len, digest, key.clone(), outboard)
            .await?;
        Some(Resume {
            prefix: match prefix {
                CachedBody::Whole(bytes) => full(bytes),
                CachedBody::Stream(body) => body,
            },
            prefix_len: len,
            etag,
            codings: codings(&stored),
            complete_len,
            key,
            digest,
        })
    }
}

/// One body after another: a stored prefix, then the upstream's rest. A
/// failure of either fails the whole (never a clean end that is short).
pub(super) struct Chained {
    first: Option<ProxyBody>,
    second: ProxyBody,
}

impl Chained {
    /// `first`, then `second`.
    pub(super) fn new(first: ProxyBody, second: ProxyBody) -> Chained {
        Chained {
            first: Some(first),
            second,
        }
    }
}

impl Body for Chained {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        while let Some(first) = &mut self.first {
            match std::task::ready!(Pin::new(first).poll_frame(cx)) {
                // Its trailers (none, for a stored body) are not the
                // whole's.
                Some(Ok(frame)) if !frame.is_data() => {}
                Some(item) => return Poll::Ready(Some(item)),
                None => self.first = None,
            }
        }
        Pin::new(&mut self.second).poll_frame(cx)
    }
}

/// A body that fails at once (a cut upstream, in tests).
#[cfg(test)]
struct Failing;

#[cfg(test)]
impl Body for Failing {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        Poll::Ready(Some(Err(BodyError::from("cut"))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    fn with(name: &'static str, value: &'static str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(name, HeaderValue::from_static(value));
        headers
    }

    #[test]
    fn content_range_needs_a_satisfied_range_within_a_known_length() {
        assert_eq!(
            content_range(&with("content-range", "bytes 0-99/1000")),
            Some(ContentRange {
                first: 0,
                last: 99,
                complete_len: 1000
            })
        );
        for bad in [
            "bytes 0-99/*",
            "bytes */1000",
            "bytes 100-99/1000",
            "bytes 0-1000/1000",
            "items 0-9/10",
            "bytes -1-9/10",
            "bytes 0-9/1e3",
        ] {
            assert_eq!(content_range(&with("content-range", bad)), None, "{bad}");
        }
    }

    #[test]
    fn only_a_206_from_the_first_byte_with_a_strong_etag_starts_an_entry() {
        let mut headers = with("content-range", "bytes 0-9/100");
        assert_eq!(keepable_206(&headers), None, "no ETag");
        headers.insert(header::ETAG, HeaderValue::from_static("W/\"w\""));
        assert_eq!(keepable_206(&headers), None, "a weak ETag");
        headers.insert(header::ETAG, HeaderValue::from_static("\"s\""));
        assert_eq!(keepable_206(&headers).map(|r| r.len()), Some(10));
        headers.insert(
            header::CONTENT_RANGE,
            HeaderValue::from_static("bytes 5-9/100"),
        );
        assert_eq!(keepable_206(&headers), None, "not from the first byte");
    }

    fn resume() -> Resume {
        Resume {
            prefix: full(Bytes::from_static(b"abc")),
            prefix_len: 3,
            etag: HeaderValue::from_static("\"s\""),
            codings: String::new(),
            complete_len: Some(10),
            key: CacheKey::parse("http://e.com/a").unwrap(),
            digest: blake3::hash(b"abc"),
        }
    }

    #[test]
    fn the_rest_must_be_the_same_representation_from_the_prefix_on() {
        let resume = resume();
        let rest = |range: &'static str, etag: &'static str| {
            let mut headers = with("content-range", range);
            headers.insert(header::ETAG, HeaderValue::from_static(etag));
            resume.rest_in(&headers)
        };
        assert_eq!(rest("bytes 3-9/10", "\"s\"").map(|r| r.len()), Ok(7));
        assert!(rest("bytes 3-9/10", "\"t\"").is_err(), "another ETag");
        assert!(rest("bytes 3-9/10", "W/\"s\"").is_err(), "a weak ETag");
        assert!(rest("bytes 2-9/10", "\"s\"").is_err(), "overlapping");
        assert!(rest("bytes 3-8/10", "\"s\"").is_err(), "short of the end");
        assert!(rest("bytes 3-10/11", "\"s\"").is_err(), "another length");
        let mut gzip = with("content-range", "bytes 3-9/10");
        gzip.insert(header::ETAG, HeaderValue::from_static("\"s\""));
        gzip.insert(header::CONTENT_ENCODING, HeaderValue::from_static("gzip"));
        assert!(resume.rest_in(&gzip).is_err(), "another coding");
        let mut asked = HeaderMap::new();
        resume.ask_rest(&mut asked);
        assert_eq!(asked[header::RANGE], "bytes=3-");
        assert_eq!(asked[header::IF_RANGE], "\"s\"");
    }

    #[tokio::test]
    async fn a_chained_body_is_the_prefix_then_the_rest_and_fails_with_either() {
        let whole = Chained::new(
            full(Bytes::from_static(b"abc")),
            full(Bytes::from_static(b"def")),
        );
        assert_eq!(whole.collect().await.unwrap().to_bytes(), "abcdef");
        let cut = Chained::new(full(Bytes::from_static(b"abc")), Failing.boxed());
        assert!(cut.collect().await.is_err());
    }
}
