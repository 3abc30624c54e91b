//! Byte ranges of a stored body (RFC 9110 §14): a GET with `Range` answered
//! from a complete stored 200 gets 206 with its range (or
//! `multipart/byteranges` for several, from a body read whole), 416 when
//! no range is satisfiable, and the whole 200 when `If-Range` does not
//! match or the ranges are not worth serving (a server may ignore Range,
//! §14.2): malformed, more than [`MAX_RANGES`], or several over a body that
//! streams.
//!
//! Ranges of a partial entry's prefix are answered the same way, against
//! the whole length it was kept with ([`super::hit`] decides when).
//!
//! Leaves out: which stored response is served ([`super::hit`]); a Range
//! request that goes upstream is forwarded as it is ([`super::partial`]
//! keeps what comes back when it can).
//!
//! Main items: [`requested`], [`Requested`], [`answer`].

use std::ops::Range;

use bytes::{Bytes, BytesMut};
use http::header::{self, HeaderMap, HeaderValue};
use http::{Method, Response, StatusCode};
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Frame;

use super::hit::respond;
use crate::cache::freshness::parse_http_date;
use crate::http::headers::is_strong_etag;
use crate::http::server::{BodyError, ProxyBody, ReceiverStream};

/// More ranges than this in one request are ignored (the whole body goes):
/// many small ranges cost more than they save, and are a known way to make
/// a server work (CVE-2011-3192).
pub const MAX_RANGES: usize = 16;

/// What a request's `Range` asks of a stored body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Requested {
    /// The whole body, as a 200.
    Whole,
    /// These ranges, in the order asked, each within the body.
    Ranges(Vec<Range<u64>>),
    /// None of the ranges overlaps the body: 416.
    Unsatisfiable,
}

/// What `request` asks of a stored 200 whose headers are `stored` and
/// whose body is `len` bytes long.
pub fn requested(method: &Method, request: &HeaderMap, stored: &HeaderMap, len: u64) -> Requested {
    if method != Method::GET {
        return Requested::Whole;
    }
    let Some(range) = request.get(header::RANGE).and_then(|v| v.to_str().ok()) else {
        return Requested::Whole;
    };
    if let Some(if_range) = request.get(header::IF_RANGE)
        && !if_range_matches(if_range, stored)
    {
        return Requested::Whole;
    }
    parse(range, len)
}

/// `If-Range` (RFC 9110 §13.1.5): a strong ETag equal to the stored one,
/// or a date equal to the stored `Last-Modified`.
fn if_range_matches(if_range: &HeaderValue, stored: &HeaderMap) -> bool {
    if if_range.as_bytes().starts_with(b"\"") {
        return is_strong_etag(if_range) && stored.get(header::ETAG) == Some(if_range);
    }
    let date = parse_http_date(if_range);
    date.is_some() && stored.get(header::LAST_MODIFIED).and_then(parse_http_date) == date
}

/// Parses `bytes=…` (RFC 9110 §14.1.2) against a body of `len` bytes.
fn parse(range: &str, len: u64) -> Requested {
    let Some(set) = range.trim().strip_prefix("bytes=") else {
        return Requested::Whole;
    };
    let mut ranges = Vec::new();
    for spec in set.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let Some((first, last)) = spec.split_once('-') else {
            return Requested::Whole;
        };
        let number = |s: &str| {
            (!s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
                .then(|| s.parse::<u64>().ok())
                .flatten()
        };
        let wanted = match (first.trim(), last.trim()) {
            ("", suffix) => match number(suffix) {
                Some(0) => None,
                Some(n) => Some(len.saturating_sub(n)..len),
                None => return Requested::Whole,
            },
            (first, "") => match number(first) {
                Some(first) => Some(first..len),
                None => return Requested::Whole,
            },
            (first, last) => match (number(first), number(last)) {
                (Some(first), Some(last)) if first <= last => {
                    Some(first..last.saturating_add(1).min(len))
                }
                _ => return Requested::Whole,
            },
        };
        if let Some(wanted) = wanted.filter(|r| r.start < len && r.start < r.end) {
            ranges.push(wanted);
        }
        if ranges.len() > MAX_RANGES {
            return Requested::Whole;
        }
    }
    if ranges.is_empty() {
        // Syntactically fine, nothing within the body (an empty set is
        // not a valid Range: ignored).
        return if set.trim().is_empty() {
            Requested::Whole
        } else {
            Requested::Unsatisfiable
        };
    }
    Requested::Ranges(ranges)
}

/// A stored body to answer from.
pub enum Stored {
    /// Read (and checked) whole.
    Whole(Bytes),
    /// Checked as it streams.
    Stream(ProxyBody),
}

/// The answer to `requested` from a stored 200 with `headers` (its
/// Content-Length set) and `body` of `len` bytes.
pub fn answer(
    requested: Requested,
    mut headers: HeaderMap,
    body: Stored,
    len: u64,
) -> Response<ProxyBody> {
    headers.insert(header::ACCEPT_RANGES, HeaderValue::from_static("bytes"));
    let whole = |headers: HeaderMap, body: Stored| {
        let body = match body {
            Stored::Whole(bytes) => full(bytes),
            Stored::Stream(body) => body,
        };
        respond(StatusCode::OK, headers, body)
    };
    match (requested, body) {
        (Requested::Whole, body) => whole(headers, body),
        (Requested::Unsatisfiable, _) => {
            headers.insert(
                header::CONTENT_RANGE,
                HeaderValue::from_str(&format!("bytes */{len}")).expect("ASCII"),
            );
            headers.insert(header::CONTENT_LENGTH, HeaderValue::from(0));
            respond(
                StatusCode::RANGE_NOT_SATISFIABLE,
                headers,
                full(Bytes::new()),
            )
        }
        (Requested::Ranges(ranges), body) if ranges.len() == 1 => {
            let range = ranges[0].clone();
            headers.insert(header::CONTENT_RANGE, content_range(&range, len));
            headers.insert(
                header::CONTENT_LENGTH,
                HeaderValue::from(range.end - range.start),
            );
            let body = match body {
                Stored::Whole(bytes) => full(bytes.slice(range.start as usize..range.end as usize)),
                Stored::Stream(body) => slice_of(body, range),
            };
            respond(StatusCode::PARTIAL_CONTENT, headers, body)
        }
        (Requested::Ranges(ranges), Stored::Whole(bytes)) => {
            // Each part names its own range; a stored one would contradict them.
            headers.remove(header::CONTENT_RANGE);
            multipart(ranges, headers, &bytes, len)
        }
        // Several ranges of a body that streams: the whole of it.
        (Requested::Ranges(_), body) => whole(headers, body),
    }
}

fn content_range(range: &Range<u64>, len: u64) -> HeaderValue {
    HeaderValue::from_str(&format!("bytes {}-{}/{len}", range.start, range.end - 1)).expect("ASCII")
}

/// `multipart/byteranges` (RFC 9110 §14.6) of `ranges` of `body`.
fn multipart(
    ranges: Vec<Range<u64>>,
    mut headers: HeaderMap,
    body: &Bytes,
    len: u64,
) -> Response<ProxyBody> {
    // A boundary the body cannot hold by chance: from its digest.
    let boundary = blake3::hash(body).to_hex()[..32].to_owned();
    let content_type = headers.remove(header::CONTENT_TYPE);
    let mut out = BytesMut::new();
    for range in &ranges {
        out.extend_from_slice(format!("\r\n--{boundary}\r\n").as_bytes());
        if let Some(content_type) = &content_type {
            out.extend_from_slice(b"Content-Type: ");
            out.extend_from_slice(content_type.as_bytes());
            out.extend_from_slice(b"\r\n");
        }
        out.extend_from_slice(b"Content-Range: ");
        out.extend_from_slice(content_range(range, len).as_bytes());
        out.extend_from_slice(b"\r\n\r\n");
        out.extend_from_slice(&body[range.start as usize..range.end as usize]);
    }
    out.extend_from_slice(format!("\r\n--{boundary}--\r\n").as_bytes());
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_str(&format!("multipart/byteranges; boundary={boundary}")).expect("hex"),
    );
    headers.insert(header::CONTENT_LENGTH, HeaderValue::from(out.len()));
    respond(StatusCode::PARTIAL_CONTENT, headers, full(out.freeze()))
}

/// The bytes `range` of a body that streams (already checked piece by
/// piece): the rest is read past and dropped.
fn slice_of(mut body: ProxyBody, range: Range<u64>) -> ProxyBody {
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, BodyError>>(1);
    tokio::spawn(async move {
        let mut at = 0u64;
        while at < range.end {
            let Some(frame) = body.frame().await else {
                return;
            };
            let data = match frame.map(Frame::into_data) {
                Ok(Ok(data)) => data,
                Ok(Err(_)) => continue,
                Err(error) => {
                    let _ = tx.send(Err(error)).await;
                    return;
                }
            };
            let (start, end) = (at, at + data.len() as u64);
            at = end;
            let from = range.start.clamp(start, end) - start;
            let to = range.end.clamp(start, end) - start;
            if from < to
                && tx
                    .send(Ok(Frame::data(data.slice(from as usize..to as usize))))
                    .await
                    .is_err()
            {
                return;
            }
        }
    });
    StreamBody::new(ReceiverStream(rx)).boxed()
}

fn full(bytes: Bytes) -> ProxyBody {
    super::transfer::full(bytes)
}

#[cfg(test)]
// A list of one range is what a single range request yields.
#[allow(clippy::single_range_in_vec_init)]
mod tests {
    use super::*;

    fn asked(range: &str, len: u64) -> Requested {
        parse(range, len)
    }

    #[test]
    fn rfc9110_14_1_2_byte_ranges_are_read_as_the_rfc_writes_them() {
        use Requested::*;
        assert_eq!(asked("bytes=0-99", 1000), Ranges(vec![0..100]));
        assert_eq!(asked("bytes=900-", 1000), Ranges(vec![900..1000]));
        assert_eq!(asked("bytes=-100", 1000), Ranges(vec![900..1000]));
        assert_eq!(asked("bytes=-5000", 1000), Ranges(vec![0..1000]));
        assert_eq!(asked("bytes=990-2000", 1000), Ranges(vec![990..1000]));
        assert_eq!(asked("bytes=0-0, -1", 1000), Ranges(vec![0..1, 999..1000]));
        assert_eq!(asked("bytes=1000-", 1000), Unsatisfiable);
        assert_eq!(asked("bytes=-0", 1000), Unsatisfiable);
        for ignored in ["bytes=5-1", "bytes=a-b", "items=0-1", "bytes=1", "bytes="] {
            assert_eq!(asked(ignored, 1000), Whole, "{ignored}");
        }
        let many = format!("bytes={}", vec!["0-0"; MAX_RANGES + 1].join(","));
        assert_eq!(asked(&many, 1000), Whole);
    }

    #[test]
    fn rfc9110_13_1_5_if_range_needs_the_strong_etag_or_the_exact_date() {
        let stored: HeaderMap = [
            (header::ETAG, HeaderValue::from_static("\"v1\"")),
            (
                header::LAST_MODIFIED,
                HeaderValue::from_static("Tue, 01 Jan 2030 00:00:00 GMT"),
            ),
        ]
        .into_iter()
        .collect();
        let with = |if_range: &'static str| {
            let request: HeaderMap = [
                (header::RANGE, HeaderValue::from_static("bytes=0-1")),
                (header::IF_RANGE, HeaderValue::from_static(if_range)),
            ]
            .into_iter()
            .collect();
            requested(&Method::GET, &request, &stored, 10)
        };
        assert_eq!(with("\"v1\""), Requested::Ranges(vec![0..2]));
        assert_eq!(
            with("Tue, 01 Jan 2030 00:00:00 GMT"),
            Requested::Ranges(vec![0..2])
        );
        assert_eq!(with("\"v0\""), Requested::Whole);
        assert_eq!(with("W/\"v1\""), Requested::Whole);
        assert_eq!(with("Wed, 02 Jan 2030 00:00:00 GMT"), Requested::Whole);
    }
}
