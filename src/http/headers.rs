//! HTTP details both proxies share, as pure functions over header maps: the
//! hsync header names and their byte-sequence values, `Accept-Encoding`
//! negotiation, hop-by-hop stripping, `Via` (appending, and reading it for
//! loops) and `Max-Forwards` (when a hop answers TRACE and OPTIONS itself).
//!
//! Leaves out everything with I/O (see `server` and the roles).

use base64::Engine;
use http::Method;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};

use crate::http::error::{ErrorKind, ProxyError};

/// `Hsync-Basis`: `:<base64 blake3 of the basis body>:` (RFC 8941 byte
/// sequence), sent by the client and echoed by the accelerator, except to
/// a request that agreed to `no-sig` (it checks the digest at END).
pub const HSYNC_BASIS: HeaderName = HeaderName::from_static("hsync-basis");
/// `Hsync-Signature`: `:<base64 basis signature>:`, possibly truncated.
pub const HSYNC_SIGNATURE: HeaderName = HeaderName::from_static("hsync-signature");
/// `Hsync-Signature-Length: N` on a GET: the basis signature is the
/// request's body, N bytes, for one too large for a header (issue 20:
/// a large body's edits need blocks finer than 4.6 KB of header allows).
/// Taken only by an upstream that advertised `max-body-signature`.
pub const HSYNC_SIGNATURE_LENGTH: HeaderName = HeaderName::from_static("hsync-signature-length");
/// `Hsync-Accept`: on an answer, what the accelerator supports
/// (`v=1, max-signature=N`); on a request, what the client agrees to do
/// without (`no-sig=N`: SIG frames may be left out of a body of at most N
/// bytes coded against a basis the accelerator holds). An answer to a
/// request that says `no-sig` leaves its own out: that client has it.
pub const HSYNC_ACCEPT: HeaderName = HeaderName::from_static("hsync-accept");
/// `Hsync-Held: N` on an answer: the accelerator keeps this body as a
/// basis if it is at most N bytes long (its length may not be known when
/// the head goes), so the next request whose basis it is may send
/// `Hsync-Basis` alone, without the signature (issue 20). Should it be
/// gone by then, the answer is coded without a basis: more bytes, never a
/// wrong one.
pub const HSYNC_HELD: HeaderName = HeaderName::from_static("hsync-held");
/// `Hsync-Missed: 1` on an answer to a request that named its basis by
/// digest alone (no signature) when the accelerator, which shares no store
/// with others, does not hold that body, so it came coded without a basis:
/// the client proxy then sends signatures to that upstream for a while
/// ([`HSYNC_HELD`] is no longer believed there). Several accelerators
/// behind one balancer, each with its own store, answer so half of the
/// time.
pub const HSYNC_MISSED: HeaderName = HeaderName::from_static("hsync-missed");
/// `Hsync-ETag` on a coded answer: the origin's strong `ETag`, which the
/// coded answer carries weak (issue 21): the client proxy, which delivers
/// the very bytes the tag names, restores it for the user agent and for
/// its own revalidations.
pub const HSYNC_ETAG: HeaderName = HeaderName::from_static("hsync-etag");
/// The content coding token.
pub const HSYNC_CODING: &str = "hsync";
/// The `Vary` field line an accelerator adds to an answer that depends on
/// the request's offer (coded, or plain where a stream would not pay), for
/// an unaware cache between the proxies. A line of its own, so that the
/// client proxy, which always delivers the body itself, removes exactly
/// it and the user agent sees the origin's `Vary`.
pub const HSYNC_VARY: &str = "Accept-Encoding, Hsync-Basis";

/// Decodes an RFC 8941 byte sequence (`:base64:`) of at most `max` decoded
/// bytes. A value cut inside a base64 quantum (a header budget truncated
/// it) keeps its whole quanta: a truncated signature is still usable.
pub fn parse_byte_sequence(value: &HeaderValue, max: usize) -> Option<Vec<u8>> {
    let text = value.to_str().ok()?.trim();
    let inner = text.strip_prefix(':')?;
    let inner = inner.strip_suffix(':').unwrap_or(inner);
    // Check the size before decoding anything (3 bytes per 4 characters).
    if inner.len() / 4 * 3 > max + 3 {
        return None;
    }
    let whole = &inner[..inner.len() / 4 * 4];
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(whole)
        .ok()?;
    (bytes.len() <= max).then_some(bytes)
}

/// Encodes bytes as an RFC 8941 byte sequence header value.
pub fn byte_sequence(bytes: &[u8]) -> HeaderValue {
    let text = format!(
        ":{}:",
        base64::engine::general_purpose::STANDARD.encode(bytes)
    );
    HeaderValue::from_str(&text).expect("base64 and colons are valid header characters")
}

/// The items of every `Accept-Encoding` field, trimmed, empty ones left out.
fn accept_encoding_items(headers: &HeaderMap) -> impl Iterator<Item = &str> {
    headers
        .get_all(header::ACCEPT_ENCODING)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .filter(|item| !item.is_empty())
}

/// Whether an `Accept-Encoding` item names the hsync coding.
fn is_hsync_item(item: &str) -> bool {
    item.split(';')
        .next()
        .is_some_and(|coding| coding.trim().eq_ignore_ascii_case(HSYNC_CODING))
}

/// Whether `Accept-Encoding` offers the hsync coding (with q > 0).
pub fn accepts_hsync(headers: &HeaderMap) -> bool {
    accepts_coding(headers, HSYNC_CODING)
}

/// Whether `Accept-Encoding` names `coding` with q > 0. (A `*` is not
/// taken as an offer: a coding we choose on our own must be named.)
pub fn accepts_coding(headers: &HeaderMap, coding: &str) -> bool {
    accept_encoding_items(headers).any(|item| {
        item.split(';')
            .next()
            .is_some_and(|name| name.trim().eq_ignore_ascii_case(coding))
            && !item.split(';').skip(1).any(|p| {
                p.trim()
                    .strip_prefix("q=")
                    .is_some_and(|q| q.trim().parse::<f32>().is_ok_and(|q| q <= 0.0))
            })
    })
}

/// Removes the hsync offer from `Accept-Encoding`, for a request we will
/// not encode: the origin should not see an offer it cannot honour.
pub fn remove_hsync_coding(headers: &mut HeaderMap) {
    let others: Vec<&str> = accept_encoding_items(headers)
        .filter(|item| !is_hsync_item(item))
        .collect();
    let value = (!others.is_empty())
        .then(|| HeaderValue::from_str(&others.join(", ")).ok())
        .flatten();
    headers.remove(header::ACCEPT_ENCODING);
    if let Some(value) = value {
        headers.insert(header::ACCEPT_ENCODING, value);
    }
}

/// The hop-by-hop headers of RFC 9110 §7.6.1, plus `Proxy-Connection`
/// (sent by old clients) and the proxy-authentication pair, which belong
/// to one hop.
const HOP_BY_HOP: [HeaderName; 9] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
    header::PROXY_AUTHORIZATION,
    header::PROXY_AUTHENTICATE,
];

/// Headers that `Connection` must not name: stripping them would let a
/// client remove framing or integrity information (P-14).
const PROTECTED: [&str; 4] = ["content-length", "host", "content-digest", "repr-digest"];

/// Why a message's headers cannot be forwarded.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum HeaderError {
    /// `Connection` names a header that must stay.
    #[error("Connection names {name}, which a proxy must not strip")]
    ProtectedConnectionOption {
        /// The header it named.
        name: String,
    },
}

/// The options of every `Connection` field, trimmed (RFC 9110 §7.6.1).
fn connection_options(headers: &HeaderMap) -> impl Iterator<Item = &str> {
    headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .filter(|option| !option.is_empty())
}

/// Whether a message's `Connection` says `close`.
pub fn closes_connection(headers: &HeaderMap) -> bool {
    connection_options(headers).any(|option| option.eq_ignore_ascii_case("close"))
}

/// Removes hop-by-hop headers and those that `Connection` names.
///
/// # Errors
/// [`HeaderError::ProtectedConnectionOption`] when `Connection` names
/// Content-Length, Host or a digest header.
pub fn strip_hop_by_hop(headers: &mut HeaderMap) -> Result<(), HeaderError> {
    let named: Vec<String> = connection_options(headers)
        .map(str::to_ascii_lowercase)
        .collect();
    if let Some(name) = named.iter().find(|n| PROTECTED.contains(&n.as_str())) {
        return Err(HeaderError::ProtectedConnectionOption { name: name.clone() });
    }
    for name in named {
        if let Ok(name) = HeaderName::from_bytes(name.as_bytes()) {
            headers.remove(name);
        }
    }
    for name in HOP_BY_HOP {
        headers.remove(name);
    }
    Ok(())
}

/// Appends `1.1 <name>` to `Via`.
pub fn add_via(headers: &mut HeaderMap, name: &HeaderValue) {
    let mut value = b"1.1 ".to_vec();
    value.extend_from_slice(name.as_bytes());
    let value = HeaderValue::from_bytes(&value).expect("built from a valid header value");
    headers.append(header::VIA, value);
}

/// The entries of every `Via` field line, trimmed, empty ones left out.
///
/// Commas inside a comment (`1.1 proxy (Squid/6, beta)`) do not split an
/// entry: the comment is free text, and a name in it must not read as a
/// hop.
pub(crate) fn via_entries(headers: &HeaderMap) -> impl Iterator<Item = &[u8]> {
    headers.get_all(header::VIA).iter().flat_map(|value| {
        let bytes = value.as_bytes();
        let mut entries = Vec::new();
        let (mut depth, mut escaped, mut start) = (0usize, false, 0);
        for (i, &b) in bytes.iter().enumerate() {
            match b {
                _ if escaped => escaped = false,
                b'\\' if depth > 0 => escaped = true,
                b'(' => depth += 1,
                b')' => depth = depth.saturating_sub(1),
                b',' if depth == 0 => {
                    entries.push(&bytes[start..i]);
                    start = i + 1;
                }
                _ => {}
            }
        }
        entries.push(&bytes[start..]);
        entries
            .into_iter()
            .map(<[u8]>::trim_ascii)
            .filter(|entry| !entry.is_empty())
    })
}

/// Whether a `Via` entry names `name` as its received-by: `1.1 name`,
/// `HTTP/1.1   name`, `1.1\tNAME (comment)` alike. RFC 9110 §7.6.3 separates
/// the protocol and the name by RWS (any run of spaces and tabs), and a host
/// name is case-insensitive, so a loop is a loop however it is spaced or
/// spelt (P-25).
fn via_entry_names(entry: &[u8], name: &[u8]) -> bool {
    entry
        .split(|&b| b == b' ' || b == b'\t')
        .filter(|part| !part.is_empty())
        .nth(1)
        .is_some_and(|received_by| received_by.eq_ignore_ascii_case(name))
}

/// Whether the request already passed the hop called `name` (its
/// pseudonym or `host[:port]` in `Via`): forwarding it again would loop.
pub(crate) fn via_names_hop(headers: &HeaderMap, name: &[u8]) -> bool {
    via_entries(headers).any(|entry| via_entry_names(entry, name))
}

/// What a hop does with a request, by its `Max-Forwards` (RFC 9110 §7.6.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hop {
    /// Send it on (with `Max-Forwards` decremented, when it had one).
    Forward,
    /// Answer it here, as its final recipient: `Max-Forwards` reached 0.
    Answer,
}

/// Decides whether a TRACE or OPTIONS request goes on or is answered by
/// this hop, and decrements `Max-Forwards` in `headers` when it goes on.
///
/// Other methods are forwarded untouched: RFC 9110 §7.6.2 defines the
/// field for these two only. A value that is not a number is left for the
/// next hop to judge (we cannot tell what the sender meant, and forwarding
/// is what a proxy does without the field); several values count as the
/// smallest, the reading under which the request travels least far.
pub fn max_forwards(method: &Method, headers: &mut HeaderMap) -> Hop {
    if *method != Method::TRACE && *method != Method::OPTIONS {
        return Hop::Forward;
    }
    let mut remaining: Option<u64> = None;
    for member in headers
        .get_all(header::MAX_FORWARDS)
        .iter()
        .flat_map(|v| v.as_bytes().split(|&b| b == b','))
        .map(<[u8]>::trim_ascii)
    {
        if member.is_empty() || !member.iter().all(u8::is_ascii_digit) {
            return Hop::Forward;
        }
        // Past u64, a number is still far from 0.
        let value = std::str::from_utf8(member)
            .ok()
            .and_then(|digits| digits.parse::<u64>().ok())
            .unwrap_or(u64::MAX);
        remaining = Some(remaining.map_or(value, |r| r.min(value)));
    }
    match remaining {
        None => Hop::Forward,
        Some(0) => Hop::Answer,
        Some(n) => {
            headers.insert(header::MAX_FORWARDS, HeaderValue::from(n - 1));
            Hop::Forward
        }
    }
}

/// Request fields a TRACE echo leaves out: credentials, which a script
/// able to send TRACE must not read back (RFC 9110 §9.3.8, cross-site
/// tracing).
const NOT_ECHOED: [HeaderName; 4] = [
    header::AUTHORIZATION,
    header::PROXY_AUTHORIZATION,
    header::COOKIE,
    HeaderName::from_static("set-cookie"),
];

/// The answer of a hop that is the final recipient of a TRACE or OPTIONS
/// request (see [`max_forwards`]): TRACE echoes the request head as
/// `message/http` (without credentials), OPTIONS says `allow`.
pub fn answer_at_this_hop<B>(
    request: &http::Request<B>,
    allow: &'static str,
) -> http::Response<bytes::Bytes> {
    let mut response = http::Response::new(bytes::Bytes::new());
    if *request.method() == Method::TRACE {
        let mut echo = format!(
            "{} {} {:?}\r\n",
            request.method(),
            request.uri(),
            request.version()
        )
        .into_bytes();
        for (name, value) in request.headers() {
            if NOT_ECHOED.contains(name) {
                continue;
            }
            echo.extend_from_slice(name.as_str().as_bytes());
            echo.extend_from_slice(b": ");
            echo.extend_from_slice(value.as_bytes());
            echo.extend_from_slice(b"\r\n");
        }
        echo.extend_from_slice(b"\r\n");
        *response.body_mut() = echo.into();
        response.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("message/http"),
        );
    } else {
        response
            .headers_mut()
            .insert(header::ALLOW, HeaderValue::from_static(allow));
    }
    response
}

/// Makes a strong `ETag` weak (a coded body is not byte-identical to the
/// representation the strong validator names) and returns the strong one,
/// which a coded answer carries in `Hsync-ETag` for the client proxy to
/// restore once it has rebuilt and verified the body. A weak or malformed
/// tag is left as it is (never made into another malformed one).
pub fn weaken_etag(headers: &mut HeaderMap) -> Option<HeaderValue> {
    let strong = headers
        .get(header::ETAG)
        .filter(|tag| is_strong_etag(tag))?
        .clone();
    let mut weak = b"W/".to_vec();
    weak.extend_from_slice(strong.as_bytes());
    headers.insert(header::ETAG, HeaderValue::from_bytes(&weak).ok()?);
    Some(strong)
}

/// Whether `tag` is a strong entity-tag (RFC 9110 §8.8.3): `"`, then
/// etagc (`!`, `#`..=`~`, obs-text), then `"`.
pub fn is_strong_etag(tag: &HeaderValue) -> bool {
    let bytes = tag.as_bytes();
    bytes.len() >= 2
        && bytes[0] == b'"'
        && bytes[bytes.len() - 1] == b'"'
        && bytes[1..bytes.len() - 1]
            .iter()
            .all(|&c| c == 0x21 || (0x23..=0x7e).contains(&c) || c >= 0x80)
}

/// The client proxy's copy of the origin's ETag, back in `ETag`, for an
/// answer whose coding it has undone: `Hsync-ETag` is taken out, and put
/// back only if it is the strong tag that the weak `ETag` names.
pub fn restore_etag(headers: &mut HeaderMap) {
    let Some(strong) = headers.remove(HSYNC_ETAG) else {
        return;
    };
    let names_it = headers
        .get(header::ETAG)
        .is_some_and(|weak| weak.as_bytes().strip_prefix(b"W/") == Some(strong.as_bytes()));
    if names_it && is_strong_etag(&strong) {
        headers.insert(header::ETAG, strong);
    }
}

/// Request headers a cache must not let vary its answers without keying
/// on them (P-19: cache poisoning through unkeyed inputs). They are not
/// forwarded.
const UNKEYED: [&str; 4] = [
    "x-forwarded-host",
    "x-forwarded-scheme",
    "x-original-url",
    "x-http-method-override",
];

/// Removes the headers of [`UNKEYED`].
pub fn strip_unkeyed(headers: &mut HeaderMap) {
    for name in UNKEYED {
        headers.remove(name);
    }
}

/// Why a request head is refused before anyone acts on it (RELIABILITY
/// P-4, P-7, P-11, P-13): what hyper lets through but a proxy must not
/// pass on, since the next hop may read the message differently.
///
/// # Errors
/// A bad request, or a length required (an HTTP/1.0 body).
pub fn check_request_head(
    version: http::Version,
    method: &http::Method,
    headers: &HeaderMap,
) -> Result<(), ProxyError> {
    let bad = |message: &str| Err(ProxyError::bad_request(message));
    let hosts = headers.get_all(header::HOST).iter().count();
    if hosts > 1 || (hosts == 0 && version == http::Version::HTTP_11) {
        return bad("an HTTP/1.1 request needs exactly one Host field");
    }
    if let Some(name) = headers.keys().find(|name| name.as_str().contains('_')) {
        return Err(ProxyError::bad_request(format!(
            "header name {name} has an underscore (ambiguous behind some servers)"
        )));
    }
    let mut codings = headers.get_all(header::TRANSFER_ENCODING).iter();
    match (codings.next(), codings.next()) {
        (None, _) => {}
        (Some(coding), None) if coding.as_bytes().eq_ignore_ascii_case(b"chunked") => {}
        _ => return bad("a request's Transfer-Encoding must be exactly chunked"),
    }
    let has_body_framing = headers.contains_key(header::CONTENT_LENGTH)
        || headers.contains_key(header::TRANSFER_ENCODING);
    let sends_content = matches!(
        *method,
        http::Method::POST | http::Method::PUT | http::Method::PATCH
    );
    if version == http::Version::HTTP_10 && sends_content && !has_body_framing {
        // Its body would be delimited by the close, which nobody behind us
        // can be trusted to read the same way.
        return Err(ProxyError::new(
            ErrorKind::LengthRequired,
            "an HTTP/1.0 request with content needs Content-Length",
        ));
    }
    Ok(())
}

/// Why a response head from upstream cannot be relayed (P-17): with both
/// `Content-Length` and `Transfer-Encoding` the two ends of a hop may cut
/// the body at different places.
///
/// # Errors
/// What is wrong.
pub fn check_response_head(headers: &HeaderMap) -> Result<(), String> {
    if headers.contains_key(header::TRANSFER_ENCODING)
        && headers.contains_key(header::CONTENT_LENGTH)
    {
        return Err("the response has both Content-Length and Transfer-Encoding".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_strong_etag_is_weakened_carried_and_restored_a_malformed_one_left_alone() {
        let mut headers = HeaderMap::new();
        headers.insert(header::ETAG, HeaderValue::from_static("\"abc\""));
        let strong = weaken_etag(&mut headers).unwrap();
        assert_eq!(headers[header::ETAG], "W/\"abc\"");
        assert_eq!(strong, "\"abc\"");
        headers.insert(HSYNC_ETAG, strong);
        restore_etag(&mut headers);
        assert_eq!(headers[header::ETAG], "\"abc\"");
        assert!(headers.get(HSYNC_ETAG).is_none());

        for left in ["W/\"abc\"", "w/\"abc\"", "abc", "\"a\"b\"", "\""] {
            let mut headers = HeaderMap::new();
            headers.insert(header::ETAG, HeaderValue::from_static(left));
            assert_eq!(weaken_etag(&mut headers), None, "{left}");
            assert_eq!(headers[header::ETAG], left, "never W/ on a malformed tag");
        }
        // A carried tag that is not what the weak one names is dropped.
        let mut headers = HeaderMap::new();
        headers.insert(header::ETAG, HeaderValue::from_static("W/\"abc\""));
        headers.insert(HSYNC_ETAG, HeaderValue::from_static("\"other\""));
        restore_etag(&mut headers);
        assert_eq!(headers[header::ETAG], "W/\"abc\"");
        assert!(headers.get(HSYNC_ETAG).is_none());
    }

    fn map(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        for (name, value) in pairs {
            headers.append(
                HeaderName::from_bytes(name.as_bytes()).unwrap(),
                HeaderValue::from_str(value).unwrap(),
            );
        }
        headers
    }

    #[test]
    fn byte_sequences_round_trip_and_keep_whole_quanta_when_cut() {
        let bytes: Vec<u8> = (0..=255).collect();
        let value = byte_sequence(&bytes);
        assert_eq!(parse_byte_sequence(&value, 1000).unwrap(), bytes);
        assert_eq!(parse_byte_sequence(&value, 255), None, "over the cap");
        let cut = HeaderValue::from_str(&value.to_str().unwrap()[..101]).unwrap();
        assert_eq!(parse_byte_sequence(&cut, 1000).unwrap(), bytes[..75]);
        for bad in ["", "abc", ":!!!!:", ":"] {
            let parsed = parse_byte_sequence(&HeaderValue::from_str(bad).unwrap(), 1000);
            assert!(parsed.is_none_or(|b| b.is_empty()), "{bad:?}");
        }
    }

    #[test]
    fn accept_encoding_offers_hsync_unless_q_is_zero() {
        assert!(accepts_hsync(&map(&[("accept-encoding", "hsync, gzip")])));
        assert!(accepts_hsync(&map(&[
            ("accept-encoding", "gzip"),
            ("accept-encoding", "HSync;q=0.5")
        ])));
        assert!(!accepts_hsync(&map(&[(
            "accept-encoding",
            "hsync;q=0, gzip"
        )])));
        assert!(!accepts_hsync(&map(&[("accept-encoding", "hsyncx")])));
        assert!(!accepts_hsync(&map(&[])));
    }

    #[test]
    fn a_declined_hsync_offer_leaves_the_other_codings() {
        let mut headers = map(&[
            ("accept-encoding", "hsync, gzip;q=0.5"),
            ("accept-encoding", "br"),
        ]);
        remove_hsync_coding(&mut headers);
        assert_eq!(headers["accept-encoding"], "gzip;q=0.5, br");
        let mut only = map(&[("accept-encoding", "HSYNC")]);
        remove_hsync_coding(&mut only);
        assert!(only.get("accept-encoding").is_none());
    }

    #[test]
    fn hop_by_hop_headers_and_connection_options_are_stripped() {
        let mut headers = map(&[
            ("connection", "close, X-Foo"),
            ("x-foo", "1"),
            ("keep-alive", "timeout=5"),
            ("proxy-connection", "keep-alive"),
            ("te", "trailers"),
            ("trailer", "x"),
            ("upgrade", "websocket"),
            ("proxy-authorization", "Basic eDp5"),
            ("authorization", "Bearer end-to-end"),
            ("x-bar", "kept"),
        ]);
        strip_hop_by_hop(&mut headers).unwrap();
        let left: Vec<_> = headers.keys().map(|k| k.as_str().to_string()).collect();
        assert_eq!(left, ["authorization", "x-bar"]);
    }

    #[test]
    fn connection_may_not_name_framing_or_integrity_headers() {
        for name in ["Content-Length", "host", "Content-Digest"] {
            let mut headers = map(&[("connection", name), ("content-length", "5")]);
            assert!(strip_hop_by_hop(&mut headers).is_err(), "{name}");
        }
    }

    #[test]
    fn via_appends_and_etag_weakens_once() {
        let mut headers = map(&[("via", "1.0 other"), ("etag", "\"abc\"")]);
        add_via(&mut headers, &HeaderValue::from_static("accel:8081"));
        let via: Vec<_> = headers
            .get_all("via")
            .iter()
            .map(|v| v.to_str().unwrap())
            .collect();
        assert_eq!(via, ["1.0 other", "1.1 accel:8081"]);
        weaken_etag(&mut headers);
        weaken_etag(&mut headers);
        assert_eq!(headers["etag"], "W/\"abc\"");
    }

    #[test]
    fn via_loops_are_found_however_the_entry_is_spaced_or_spelt() {
        for via in [
            "1.1 accel:8081",
            "1.0 other, 1.1 accel:8081",
            "1.1  accel:8081",
            "1.1\taccel:8081",
            " HTTP/1.1 \t ACCEL:8081 (rproxy)",
            "1.0 other,1.1 Accel:8081,",
        ] {
            assert!(
                via_names_hop(&map(&[("via", via)]), b"accel:8081"),
                "{via:?}"
            );
        }
        assert!(via_names_hop(
            &map(&[("via", "1.0 a"), ("via", "1.1 accel:8081")]),
            b"accel:8081"
        ));
        for via in [
            "1.1 accel:80811",
            "accel:8081",
            "1.1 other (accel:8081)",
            "1.1 other (x, 1.1 accel:8081)",
            "1.1 other (x\\), 1.1 accel:8081)",
        ] {
            assert!(
                !via_names_hop(&map(&[("via", via)]), b"accel:8081"),
                "{via:?}"
            );
        }
        let headers = map(&[("via", "1.1 a (x, y), , 1.1 b"), ("via", "1.1 c")]);
        assert_eq!(via_entries(&headers).count(), 3);
    }

    #[test]
    fn max_forwards_zero_is_answered_here_and_more_is_decremented() {
        let hop = |method: Method, pairs: &[(&str, &str)]| {
            let mut headers = map(pairs);
            let hop = max_forwards(&method, &mut headers);
            let left = headers
                .get_all("max-forwards")
                .iter()
                .map(|v| v.to_str().unwrap().to_owned())
                .collect::<Vec<_>>();
            (hop, left)
        };
        assert_eq!(hop(Method::TRACE, &[("max-forwards", "0")]).0, Hop::Answer);
        assert_eq!(
            hop(Method::OPTIONS, &[("max-forwards", " 00 ")]).0,
            Hop::Answer
        );
        assert_eq!(
            hop(Method::OPTIONS, &[("max-forwards", "3")]),
            (Hop::Forward, vec!["2".to_owned()])
        );
        assert_eq!(
            hop(
                Method::TRACE,
                &[("max-forwards", "5"), ("max-forwards", "1")]
            ),
            (Hop::Forward, vec!["0".to_owned()])
        );
        assert_eq!(
            hop(
                Method::TRACE,
                &[("max-forwards", "99999999999999999999999")]
            )
            .0,
            Hop::Forward
        );
        // Other methods, no field, or a value that is no number: untouched.
        assert_eq!(
            hop(Method::GET, &[("max-forwards", "0")]),
            (Hop::Forward, vec!["0".to_owned()])
        );
        assert_eq!(hop(Method::TRACE, &[]), (Hop::Forward, vec![]));
        assert_eq!(
            hop(Method::TRACE, &[("max-forwards", "-1")]),
            (Hop::Forward, vec!["-1".to_owned()])
        );
    }

    #[test]
    fn a_trace_answered_here_echoes_the_head_without_credentials() {
        let request = http::Request::builder()
            .method(Method::TRACE)
            .uri("/a?b")
            .header("host", "origin.test")
            .header("cookie", "session=secret")
            .header("authorization", "Bearer secret")
            .header("x-seen", "yes")
            .body(())
            .unwrap();
        let response = answer_at_this_hop(&request, "GET");
        assert_eq!(response.headers()["content-type"], "message/http");
        let echo = std::str::from_utf8(response.body()).unwrap();
        assert!(echo.starts_with("TRACE /a?b HTTP/1.1\r\n"), "{echo}");
        assert!(echo.contains("x-seen: yes\r\n") && echo.ends_with("\r\n\r\n"));
        assert!(!echo.contains("secret"), "{echo}");
        let options = http::Request::options("*").body(()).unwrap();
        let response = answer_at_this_hop(&options, "GET, HEAD");
        assert_eq!(response.headers()["allow"], "GET, HEAD");
        assert!(response.body().is_empty());
    }
}
