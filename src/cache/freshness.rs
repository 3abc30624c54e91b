//! HTTP caching decisions (RFC 9111), pure: which responses the client proxy
//! may store, how long they stay fresh, when a stored response may be served
//! without asking upstream, and how to revalidate and freshen it.
//!
//! Everything takes header maps and Unix seconds and returns values; the
//! caller reads the clock and passes `now`. Main items: [`CacheControl`],
//! [`storability`] (with the operator's [`SetCookie`]), [`freshness_lifetime`], [`current_age`] (both at once:
//! [`Age`]), [`reuse`], [`may_serve_stale_on_error`], [`conditional_headers`],
//! [`merge_not_modified`], [`invalidates`] and the RFC 9211 [`CacheStatus`].
//!
//! Deliberately conservative where RFC 9111 allows a choice:
//!
//! - Only GET responses are stored. Statuses: the heuristically cacheable
//!   ones below 400 (200, 203, 204, 300, 301, 308) always, 302, 303 and
//!   307 with explicit freshness, and errors only with explicit freshness
//!   and only 404, 405, 410, 414 and 501, whose cause is the URL: an error
//!   a header provoked (400, 413, 431, 5xx) is never stored (P-20: one
//!   attacker-provoked error must not be served to everyone, CPDoS).
//!   Never 206 or 304. Only a 200's body is ever a basis.
//! - The qualified forms `no-cache="field"` and `private="field"` count as
//!   their unqualified forms: the whole response is revalidated or kept out
//!   of a shared cache, rather than stored with fields removed.
//! - A shared cache stores a response that sets a cookie only when
//!   `public` or `s-maxage` allows it, unless the operator says
//!   otherwise ([`SetCookie::Stored`]; RFC 9111 §7.3 allows it).
//! - A stale response is served only when a directive allows it (request
//!   `max-stale`, `stale-if-error`, `stale-while-revalidate`); being
//!   disconnected alone is not enough.
//!
//! Left out: storage, cache keys and `Vary` matching (see `cache`), request
//! collapsing, and scheduling the background revalidation that
//! `stale-while-revalidate` allows ([`may_serve_stale_while_revalidating`]
//! says when).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, StatusCode};

/// The largest delta-seconds value we keep: RFC 9111 §1.2.2 says a larger
/// value, or an overflowing calculation, means 2^31 seconds.
const MAX_DELTA_SECONDS: u64 = 1 << 31;

/// Heuristic freshness is capped at one day (RFC 9111 §4.2.2 suggests 10%
/// of the time since Last-Modified; the cap keeps a years-old file from
/// being served for months without a check).
const MAX_HEURISTIC_LIFETIME: u64 = 24 * 60 * 60;

/// The last second httpdate can format (9999-12-31T23:59:59Z).
const MAX_HTTP_DATE: u64 = 253_402_300_799;

/// A parsed `Cache-Control` field, request or response (RFC 9111 §5.2).
///
/// All field lines are combined; unknown directives are ignored; when a
/// directive appears twice the first one wins. A delta-seconds argument
/// that is missing or not a number counts as 0 (for `max-age` that means
/// stale, RFC 9111 §4.2.1), and larger values are capped at 2^31.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CacheControl {
    /// `no-store`: neither this request nor its response may be stored.
    pub no_store: bool,
    /// `no-cache`: a stored response must be revalidated before each use.
    pub no_cache: bool,
    /// `private`: the response is for one user; shared caches don't store it.
    pub private: bool,
    /// `public`: a shared cache may store it even for an authorized request.
    pub public: bool,
    /// `max-age`: freshness lifetime (response) or the oldest acceptable age
    /// (request), in seconds.
    pub max_age: Option<u64>,
    /// `s-maxage`: freshness lifetime in shared caches, in seconds.
    pub s_maxage: Option<u64>,
    /// `must-revalidate`: never served stale, not even when the client asks.
    pub must_revalidate: bool,
    /// `proxy-revalidate`: `must-revalidate` for shared caches only.
    pub proxy_revalidate: bool,
    /// `no-transform`: intermediaries must not change the content.
    pub no_transform: bool,
    /// `immutable` (RFC 8246): the content won't change while fresh.
    pub immutable: bool,
    /// `must-understand` (RFC 9111 §5.2.2.3): store only if the status is
    /// understood, and then despite `no-store`.
    pub must_understand: bool,
    /// `stale-if-error` (RFC 5861): seconds of staleness acceptable when
    /// upstream fails.
    pub stale_if_error: Option<u64>,
    /// `stale-while-revalidate` (RFC 5861): seconds of staleness acceptable
    /// while revalidating in the background.
    pub stale_while_revalidate: Option<u64>,
    /// `only-if-cached` (request): answer from the cache or with 504.
    pub only_if_cached: bool,
    /// `max-stale` (request): `Some(None)` accepts any staleness,
    /// `Some(Some(n))` up to `n` seconds.
    pub max_stale: Option<Option<u64>>,
    /// `min-fresh` (request): the response must stay fresh this many more
    /// seconds.
    pub min_fresh: Option<u64>,
}

impl CacheControl {
    /// Parses every `Cache-Control` field line of `headers`.
    pub fn parse(headers: &HeaderMap) -> CacheControl {
        let mut cc = CacheControl::default();
        for member in list_members(headers, &header::CACHE_CONTROL) {
            let (name, value) = directive(&member);
            let value = value.as_deref();
            match name.as_str() {
                "no-store" => cc.no_store = true,
                "no-cache" => cc.no_cache = true,
                "private" => cc.private = true,
                "public" => cc.public = true,
                "must-revalidate" => cc.must_revalidate = true,
                "proxy-revalidate" => cc.proxy_revalidate = true,
                "no-transform" => cc.no_transform = true,
                "immutable" => cc.immutable = true,
                "must-understand" => cc.must_understand = true,
                "only-if-cached" => cc.only_if_cached = true,
                "max-age" => first(&mut cc.max_age, delta_seconds(value)),
                "s-maxage" => first(&mut cc.s_maxage, delta_seconds(value)),
                "stale-if-error" => first(&mut cc.stale_if_error, delta_seconds(value)),
                "stale-while-revalidate" => {
                    first(&mut cc.stale_while_revalidate, delta_seconds(value));
                }
                "min-fresh" => first(&mut cc.min_fresh, delta_seconds(value)),
                "max-stale" => first(&mut cc.max_stale, value.map(|v| delta_seconds(Some(v)))),
                _ => {}
            }
        }
        cc
    }

    /// Parses a request's directives, counting `Pragma: no-cache` as
    /// `no-cache` when there is no `Cache-Control` (RFC 9111 §5.4).
    pub fn parse_request(headers: &HeaderMap) -> CacheControl {
        let mut cc = Self::parse(headers);
        if !headers.contains_key(header::CACHE_CONTROL) && has_pragma_no_cache(headers) {
            cc.no_cache = true;
        }
        cc
    }
}

/// Sets `slot` unless an earlier occurrence of the directive already did.
fn first<T>(slot: &mut Option<T>, value: T) {
    if slot.is_none() {
        *slot = Some(value);
    }
}

/// Whether `Pragma` holds `no-cache`.
fn has_pragma_no_cache(headers: &HeaderMap) -> bool {
    list_members(headers, &header::PRAGMA).any(|member| directive(&member).0 == "no-cache")
}

/// The members of every field line named `name`, split on commas outside
/// quoted strings, trimmed, empty ones left out. Bytes that are not
/// visible ASCII are replaced rather than dropping the whole line (a
/// dropped line could hide a `no-store`).
fn list_members<'a>(
    headers: &'a HeaderMap,
    name: &HeaderName,
) -> impl Iterator<Item = String> + 'a {
    headers
        .get_all(name)
        .iter()
        .flat_map(|value| split_list(&String::from_utf8_lossy(value.as_bytes())))
}

/// Splits a list field value on commas that are not inside a quoted string.
fn split_list(text: &str) -> Vec<String> {
    let mut members = Vec::new();
    let mut current = String::new();
    let mut in_quotes = false;
    let mut escaped = false;
    for c in text.chars() {
        if in_quotes {
            if escaped {
                escaped = false;
            } else if c == '\\' {
                escaped = true;
            } else if c == '"' {
                in_quotes = false;
            }
            current.push(c);
        } else if c == '"' {
            in_quotes = true;
            current.push(c);
        } else if c == ',' {
            members.push(std::mem::take(&mut current));
        } else {
            current.push(c);
        }
    }
    members.push(current);
    members
        .into_iter()
        .map(|m| m.trim().to_owned())
        .filter(|m| !m.is_empty())
        .collect()
}

/// Splits `name[=value]` into a lower-case name and the value, unquoted
/// (RFC 9111 §5.2: recipients accept both the token and the quoted form).
fn directive(member: &str) -> (String, Option<String>) {
    let (name, value) = match member.split_once('=') {
        Some((name, value)) => (name, Some(value.trim())),
        None => (member, None),
    };
    let value = value.map(|v| match v.strip_prefix('"') {
        Some(quoted) => unquote(quoted),
        None => v.to_owned(),
    });
    (name.trim().to_ascii_lowercase(), value)
}

/// The content of a quoted string whose opening quote is already removed.
fn unquote(quoted: &str) -> String {
    let mut out = String::new();
    let mut chars = quoted.chars();
    while let Some(c) = chars.next() {
        match c {
            '"' => break,
            '\\' => out.extend(chars.next()),
            c => out.push(c),
        }
    }
    out
}

/// A delta-seconds argument: missing or invalid gives 0, too large gives
/// 2^31 (RFC 9111 §1.2.2).
fn delta_seconds(value: Option<&str>) -> u64 {
    match value {
        Some(v) if !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()) => v
            .parse::<u64>()
            .map_or(MAX_DELTA_SECONDS, |n| n.min(MAX_DELTA_SECONDS)),
        _ => 0,
    }
}

/// `Set-Cookie2` (RFC 2965, obsolete but still sent by some servers).
const SET_COOKIE2: HeaderName = HeaderName::from_static("set-cookie2");

/// Whether a response sets a cookie (`Set-Cookie`, or the obsolete
/// `Set-Cookie2`).
pub fn sets_cookie(response: &HeaderMap) -> bool {
    response.contains_key(header::SET_COOKIE) || response.contains_key(SET_COOKIE2)
}

/// Whether a shared cache stores a response that sets a cookie, when
/// nothing else keeps it out (RFC 9111 §7.3 says `Set-Cookie` alone does
/// not; A-6 is stricter by default).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SetCookie {
    /// Only when `public` or `s-maxage` allows it: a page that sets
    /// a cookie without saying `public` is often one user's.
    #[default]
    OnlyIfPublic,
    /// As any other response (Apache Traffic Server's
    /// `cache_responses_to_cookies`). The caller stores it without its
    /// cookie, replays the cookie to nobody, and never uses it as a basis.
    Stored,
}

/// Whether a response may be stored, and if not, why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Storability {
    /// The cache may store the response.
    Storable,
    /// The cache must not store it; the reason is for logs.
    NotStorable(&'static str),
}

/// Whether a cache may store this response to this request (RFC 9111 §3,
/// §3.5), under this project's narrower rules (see the module docs).
///
/// A response without validators or any freshness information is still
/// storable: it can serve as a delta basis, and will simply always be
/// stale. `set_cookie` says what a shared cache does with a cookie.
pub fn storability(
    method: &Method,
    request: &HeaderMap,
    status: StatusCode,
    response: &HeaderMap,
    shared: bool,
    set_cookie: SetCookie,
) -> Storability {
    use Storability::NotStorable;
    if method != Method::GET {
        return NotStorable("method is not GET");
    }
    let req = CacheControl::parse(request);
    let resp = CacheControl::parse(response);
    let explicit = resp.max_age.is_some()
        || (shared && resp.s_maxage.is_some())
        || response.contains_key(header::EXPIRES);
    let understood = understood(status);
    let status_stored = match status.as_u16() {
        // P-20: an error is stored only where its URL alone decides it
        // (not a header an attacker sent: 400, 413, 431, most 5xx), and
        // only for as long as the origin said.
        400.. => explicit && is_heuristically_cacheable(status),
        _ => understood && (explicit || is_heuristically_cacheable(status)),
    };
    if !status_stored {
        return NotStorable("status is not stored");
    }
    if resp.must_understand && !understood {
        return NotStorable("must-understand, for a status not understood");
    }
    if req.no_store {
        return NotStorable("request has no-store");
    }
    // RFC 9111 §5.2.2.3: must-understand overrides no-store in a cache
    // that understands the status.
    if resp.no_store && !resp.must_understand {
        return NotStorable("response has no-store");
    }
    if shared && resp.private {
        return NotStorable("private response in a shared cache");
    }
    // RFC 9111 §3.5: only these directives let a shared cache store a
    // response to a request that carried credentials.
    if shared
        && request.contains_key(header::AUTHORIZATION)
        && !(resp.public || resp.s_maxage.is_some() || resp.must_revalidate)
    {
        return NotStorable("authorized request in a shared cache");
    }
    // a cookie is one user's, and often so is the page that sets
    // it. Stored anyway only when the operator says (the cookie is then
    // left out of the entry by the caller).
    if shared
        && set_cookie == SetCookie::OnlyIfPublic
        && sets_cookie(response)
        && !(resp.public || resp.s_maxage.is_some())
    {
        return NotStorable("Set-Cookie in a shared cache");
    }
    if list_members(response, &header::VARY).any(|member| member == "*") {
        return NotStorable("Vary: *");
    }
    Storability::Storable
}

/// Statuses whose meaning this cache implements as RFC 9110 defines it:
/// final ones it serves from a whole stored body, not 206 (it does not
/// complete ranges) or 304 (an answer to a condition, not a body).
fn understood(status: StatusCode) -> bool {
    matches!(
        status.as_u16(),
        200 | 203 | 204 | 300 | 301 | 302 | 303 | 307 | 308 | 404 | 405 | 410 | 414 | 501
    )
}

/// Statuses that are heuristically cacheable (RFC 9110 §15.1).
fn is_heuristically_cacheable(status: StatusCode) -> bool {
    matches!(
        status.as_u16(),
        200 | 203 | 204 | 206 | 300 | 301 | 308 | 404 | 405 | 410 | 414 | 501
    )
}

/// The response's freshness lifetime in seconds (RFC 9111 §4.2.1).
///
/// In order: `s-maxage` (shared caches only), `max-age`, `Expires` minus
/// `Date` (an invalid `Expires` such as `0` means already expired), then
/// for heuristically cacheable statuses 10% of `Date` minus
/// `Last-Modified`, at most a day; otherwise 0. A missing or invalid `Date`
/// is replaced by `response_time`, when the response was received.
pub fn freshness_lifetime(
    status: StatusCode,
    response: &HeaderMap,
    response_time: u64,
    shared: bool,
) -> u64 {
    let cc = CacheControl::parse(response);
    if shared && let Some(s_maxage) = cc.s_maxage {
        return s_maxage;
    }
    if let Some(max_age) = cc.max_age {
        return max_age;
    }
    let date = || {
        response
            .get(header::DATE)
            .and_then(parse_http_date)
            .unwrap_or(response_time)
    };
    if let Some(expires) = response.get(header::EXPIRES) {
        return parse_http_date(expires).map_or(0, |expires| expires.saturating_sub(date()));
    }
    if is_heuristically_cacheable(status)
        && let Some(last_modified) = response
            .get(header::LAST_MODIFIED)
            .and_then(parse_http_date)
    {
        return (date().saturating_sub(last_modified) / 10).min(MAX_HEURISTIC_LIFETIME);
    }
    0
}

/// The stored response's current age in seconds (RFC 9111 §4.2.3), from
/// its `Age` and `Date` headers, when the request that fetched it was sent
/// (`request_time`), when it arrived (`response_time`) and `now`.
///
/// Clocks that run backwards give 0, never a negative age. After a
/// revalidation, pass the times of the revalidation exchange.
///
/// An `Age` that is not one field line of digits (a list, two lines, a
/// sign, a fraction, a parameter) leaves the age unknown, and the
/// response is taken to be as old as an age can say (2^31 s): stale.
/// RFC 9111 §5.1 says to use a list's first member and ignore an invalid
/// value, which would take `0, 7200` or `-7200` for new; the conformance
/// suite asks for stale, and a revalidation is the cost of being wrong
/// that way.
pub fn current_age(response: &HeaderMap, request_time: u64, response_time: u64, now: u64) -> u64 {
    let mut lines = response.get_all(header::AGE).iter();
    let age_value = match (lines.next(), lines.next()) {
        (None, _) => 0,
        (Some(line), None)
            if !line.is_empty() && line.as_bytes().iter().all(u8::is_ascii_digit) =>
        {
            delta_seconds(line.to_str().ok())
        }
        _ => return MAX_DELTA_SECONDS,
    };
    let date_value = response
        .get(header::DATE)
        .and_then(parse_http_date)
        .unwrap_or(response_time);
    let apparent_age = response_time.saturating_sub(date_value);
    let response_delay = response_time.saturating_sub(request_time);
    let corrected_age_value = age_value.saturating_add(response_delay);
    let corrected_initial_age = apparent_age.max(corrected_age_value);
    let resident_time = now.saturating_sub(response_time);
    corrected_initial_age.saturating_add(resident_time)
}

/// A stored response's current age and freshness lifetime, in seconds:
/// what [`reuse`] and [`may_serve_stale_on_error`] weigh.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Age {
    /// Its current age ([`current_age`]).
    pub current: u64,
    /// How long it stays fresh ([`freshness_lifetime`]).
    pub lifetime: u64,
}

impl Age {
    /// The age and lifetime of a response stored at `stored_at` (the
    /// exchange that fetched or last revalidated it, taken as both its
    /// request and its response time), at `now`.
    pub fn of_stored(
        status: StatusCode,
        stored: &HeaderMap,
        stored_at: u64,
        now: u64,
        shared: bool,
    ) -> Age {
        Age {
            current: current_age(stored, stored_at, stored_at, now),
            lifetime: freshness_lifetime(status, stored, stored_at, shared),
        }
    }

    /// Seconds of freshness left; negative once stale (RFC 9211's `ttl`).
    pub fn ttl(&self) -> i64 {
        self.lifetime as i64 - self.current as i64
    }
}

/// What to do with a stored response for a new request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reuse {
    /// Serve it without contacting upstream: it is fresh enough for the
    /// request, or stale by no more than the request's `max-stale`.
    Serve,
    /// Send a conditional request upstream first (see
    /// [`conditional_headers`]).
    Revalidate,
}

/// Whether a stored response may answer `request` without contacting
/// upstream (RFC 9111 §4), given its current `age` and freshness `lifetime`
/// in seconds.
///
/// Revalidates when the response has `no-cache`; when the request has
/// `no-cache` (or `Pragma: no-cache`), `max-age=0` or a `max-age` the age
/// exceeds, or a
/// `min-fresh` the remaining freshness doesn't cover; and when the response
/// is stale, unless the request's `max-stale` covers the staleness and the
/// response has no `must-revalidate` (nor, in a shared cache,
/// `proxy-revalidate` or `s-maxage`, which implies it).
pub fn reuse(
    request: &HeaderMap,
    stored: &HeaderMap,
    age: u64,
    lifetime: u64,
    shared: bool,
) -> Reuse {
    let req = CacheControl::parse_request(request);
    let resp = CacheControl::parse(stored);
    if resp.no_cache || req.no_cache {
        return Reuse::Revalidate;
    }
    // Ages are whole seconds, so a response stored a moment ago has age 0:
    // `max-age=0` would let it through within that second, where the
    // client (apt, a browser's reload) asks for end-to-end revalidation.
    if req
        .max_age
        .is_some_and(|max_age| max_age == 0 || age > max_age)
    {
        return Reuse::Revalidate;
    }
    if lifetime > age {
        // Fresh; `min-fresh` asks for that much freshness still left.
        return if lifetime - age >= req.min_fresh.unwrap_or(0) {
            Reuse::Serve
        } else {
            Reuse::Revalidate
        };
    }
    if forbids_stale(&resp, shared) {
        return Reuse::Revalidate;
    }
    let staleness = age - lifetime;
    match req.max_stale {
        Some(None) => Reuse::Serve,
        Some(Some(max_stale)) if staleness <= max_stale => Reuse::Serve,
        _ => Reuse::Revalidate,
    }
}

/// Whether the response's directives forbid serving it stale.
fn forbids_stale(resp: &CacheControl, shared: bool) -> bool {
    resp.no_cache
        || resp.must_revalidate
        || (shared && (resp.proxy_revalidate || resp.s_maxage.is_some()))
}

/// Whether a stale stored response may be served because upstream failed
/// (RFC 5861 `stale-if-error`), given its current `age` and freshness
/// `lifetime` in seconds.
///
/// The request's `stale-if-error` sets the limit when present, else the
/// response's; without either, no. `must-revalidate`, `no-cache` and, in a
/// shared cache, `proxy-revalidate` or `s-maxage` on the response forbid
/// it, and so does a request `no-cache` without its own `stale-if-error`.
pub fn may_serve_stale_on_error(
    request: &HeaderMap,
    stored: &HeaderMap,
    age: u64,
    lifetime: u64,
    shared: bool,
) -> bool {
    let req = CacheControl::parse_request(request);
    let resp = CacheControl::parse(stored);
    if forbids_stale(&resp, shared) {
        return false;
    }
    if req.no_cache && req.stale_if_error.is_none() {
        return false;
    }
    let staleness = age.saturating_sub(lifetime);
    req.stale_if_error
        .or(resp.stale_if_error)
        .is_some_and(|limit| staleness <= limit)
}

/// Whether a stale stored response may be served at once while it is
/// revalidated in the background (RFC 5861 `stale-while-revalidate`),
/// given its current `age` and freshness `lifetime` in seconds: within
/// the response's window, unless the response forbids serving it stale or
/// the request asks for a fresh or validated answer (`no-cache`,
/// `max-age`, `min-fresh`).
pub fn may_serve_stale_while_revalidating(
    request: &HeaderMap,
    stored: &HeaderMap,
    age: u64,
    lifetime: u64,
    shared: bool,
) -> bool {
    let req = CacheControl::parse_request(request);
    let resp = CacheControl::parse(stored);
    if forbids_stale(&resp, shared)
        || req.no_cache
        || req.max_age.is_some()
        || req.min_fresh.is_some()
    {
        return false;
    }
    let staleness = age.saturating_sub(lifetime);
    resp.stale_while_revalidate
        .is_some_and(|window| staleness <= window)
}

/// The validators to add to a revalidation request (RFC 9111 §4.3.1):
/// `If-None-Match` with the stored `ETag` and `If-Modified-Since` with the
/// stored `Last-Modified`, or else (without an ETag) its `Date`, when it
/// is a valid date.
///
/// A weak ETag (`W/"x"`) is sent as it is: `If-None-Match` uses weak
/// comparison.
pub fn conditional_headers(stored: &HeaderMap) -> HeaderMap {
    let mut headers = HeaderMap::new();
    if let Some(etag) = stored.get(header::ETAG) {
        headers.insert(header::IF_NONE_MATCH, etag.clone());
    }
    // RFC 9111 §4.3.1: without a Last-Modified, the stored response's
    // Date is a time the origin's copy was current at; not worth its
    // bytes beside an ETag, which an origin checks instead (RFC 9110
    // §13.2.2).
    let fallback = (!headers.contains_key(header::IF_NONE_MATCH)).then_some(header::DATE);
    let since = std::iter::once(header::LAST_MODIFIED)
        .chain(fallback)
        .filter_map(|name| stored.get(name))
        .find(|value| parse_http_date(value).is_some());
    if let Some(since) = since {
        headers.insert(header::IF_MODIFIED_SINCE, since.clone());
    }
    headers
}

/// Headers a 304 must not change in the stored response.
///
/// RFC 9111 §3.2 excepts Content-Length and the headers the stored body
/// depends on: its coding, its range, its digests (Content-Digest and the
/// older Content-MD5 describe our stored bytes), and the hop-by-hop
/// headers, which describe the 304's own connection. The ETag names the
/// representation we hold, which a 304 says is current: another tag on it
/// (a server's slip, or a strong tag weakened on the way) would make our
/// next revalidation ask for what we do not have. Content-Type is
/// updated, as §3.2 asks.
const NOT_UPDATED_BY_304: [HeaderName; 15] = [
    header::ETAG,
    header::CONTENT_LENGTH,
    header::CONTENT_ENCODING,
    header::CONTENT_RANGE,
    HeaderName::from_static("content-md5"),
    HeaderName::from_static("content-digest"),
    header::TRANSFER_ENCODING,
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::TE,
    header::TRAILER,
    header::UPGRADE,
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
];

/// The stored headers freshened by a 304's headers (RFC 9111 §4.3.4):
/// each header the 304 carries replaces all stored values of that name.
///
/// Kept from the stored response whatever the 304 says: ETag,
/// Content-Length, Content-Encoding, Content-Range, Content-MD5,
/// Content-Digest, the hop-by-hop headers and our `hsync-*` headers (they
/// describe the coded exchange that produced the stored body). `Vary`,
/// `Content-Type`, `Cache-Control`, `Date`, `Expires` and the rest are
/// updated.
pub fn merge_not_modified(stored: &HeaderMap, not_modified: &HeaderMap) -> HeaderMap {
    let mut merged = stored.clone();
    for name in not_modified.keys() {
        if NOT_UPDATED_BY_304.contains(name) || name.as_str().starts_with("hsync-") {
            continue;
        }
        merged.remove(name);
        for value in not_modified.get_all(name) {
            merged.append(name.clone(), value.clone());
        }
    }
    merged
}

/// Whether a response to `method` with `status` invalidates the stored
/// response for the target URI (RFC 9111 §4.4): an unsafe method (anything
/// but GET, HEAD, OPTIONS and TRACE) that got a 2xx or 3xx.
pub fn invalidates(method: &Method, status: StatusCode) -> bool {
    !method.is_safe() && (status.is_success() || status.is_redirection())
}

/// Why a request went forward towards the origin: the `fwd` values of
/// RFC 9211 §2.2.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Forward {
    /// `bypass`: the cache was configured not to handle this request.
    Bypass,
    /// `method`: the request method's semantics require forwarding.
    Method,
    /// `uri-miss`: nothing stored for the target URI.
    UriMiss,
    /// `vary-miss`: stored responses exist, but `Vary` doesn't match.
    VaryMiss,
    /// `miss`: the cache doesn't know or say which kind of miss.
    Miss,
    /// `request`: the request's directives (e.g. `no-cache`) required it.
    Request,
    /// `stale`: the stored response was stale and had to be revalidated.
    Stale,
    /// `partial`: only part of the response was stored.
    Partial,
}

impl Forward {
    /// The RFC 9211 token.
    pub fn as_str(self) -> &'static str {
        match self {
            Forward::Bypass => "bypass",
            Forward::Method => "method",
            Forward::UriMiss => "uri-miss",
            Forward::VaryMiss => "vary-miss",
            Forward::Miss => "miss",
            Forward::Request => "request",
            Forward::Stale => "stale",
            Forward::Partial => "partial",
        }
    }
}

/// How this cache handled a request: one member of an RFC 9211
/// `Cache-Status` field, rendered by [`cache_status`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheStatus {
    /// `None` for a hit (`hit`: answered from the cache, not forwarded),
    /// otherwise why the request went forward (`fwd`).
    pub fwd: Option<Forward>,
    /// `fwd-status`: the status the next hop returned.
    pub fwd_status: Option<StatusCode>,
    /// `ttl`: remaining freshness in seconds, negative when serving stale.
    pub ttl: Option<i64>,
    /// `stored`: the response was stored.
    pub stored: bool,
    /// `collapsed`: the request was collapsed with another one.
    pub collapsed: bool,
    /// `detail`: free-form extra information for debugging.
    pub detail: Option<&'static str>,
}

impl CacheStatus {
    /// A hit: served from the cache without going forward.
    pub fn hit() -> CacheStatus {
        CacheStatus {
            fwd: None,
            fwd_status: None,
            ttl: None,
            stored: false,
            collapsed: false,
            detail: None,
        }
    }

    /// The request went forward for `reason`.
    pub fn forwarded(reason: Forward) -> CacheStatus {
        CacheStatus {
            fwd: Some(reason),
            ..CacheStatus::hit()
        }
    }

    /// A stale stored response served because revalidation failed
    /// (`stale-if-error`). RFC 9211 has no parameter for this: a hit means
    /// "not forwarded", and this request was forwarded, so it reads
    /// `fwd=stale` with the failing status if there was one, a negative
    /// `ttl` and `detail=stale-if-error`.
    pub fn stale_on_error(upstream_status: Option<StatusCode>, ttl: i64) -> CacheStatus {
        CacheStatus {
            fwd_status: upstream_status,
            ttl: Some(ttl),
            detail: Some("stale-if-error"),
            ..CacheStatus::forwarded(Forward::Stale)
        }
    }

    /// A stale response served while it is revalidated in the background
    /// (RFC 5861): a hit, with its negative `ttl` and
    /// `detail=stale-while-revalidate`.
    pub fn stale_while_revalidating(ttl: i64) -> CacheStatus {
        CacheStatus {
            ttl: Some(ttl),
            detail: Some("stale-while-revalidate"),
            ..CacheStatus::hit()
        }
    }
}

/// Renders one `Cache-Status` member (RFC 9211 §2), e.g.
/// `rproxy; fwd=miss; stored` or `rproxy; fwd=stale; fwd-status=304`.
///
/// `name` identifies the cache; it is sent as a token when it is one and
/// as a quoted string otherwise. Parameters come in the order hit/fwd,
/// fwd-status, ttl, stored, collapsed, detail.
pub fn cache_status(name: &str, status: &CacheStatus) -> HeaderValue {
    let mut out = sf_token_or_string(name);
    match status.fwd {
        None => out.push_str("; hit"),
        Some(reason) => {
            out.push_str("; fwd=");
            out.push_str(reason.as_str());
        }
    }
    if let Some(fwd_status) = status.fwd_status {
        out.push_str(&format!("; fwd-status={}", fwd_status.as_u16()));
    }
    if let Some(ttl) = status.ttl {
        // RFC 8941 integers have at most 15 digits.
        const MAX: i64 = 999_999_999_999_999;
        out.push_str(&format!("; ttl={}", ttl.clamp(-MAX, MAX)));
    }
    if status.stored {
        out.push_str("; stored");
    }
    if status.collapsed {
        out.push_str("; collapsed");
    }
    if let Some(detail) = status.detail {
        out.push_str("; detail=");
        out.push_str(&sf_token_or_string(detail));
    }
    HeaderValue::from_str(&out).expect("built from tokens, digits and printable ASCII strings")
}

/// `text` as an RFC 8941 token if it is one, else as a string (characters
/// outside printable ASCII dropped).
fn sf_token_or_string(text: &str) -> String {
    let is_tchar = |c: char| c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~:/".contains(c);
    let mut chars = text.chars();
    let is_token = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '*')
        && chars.all(is_tchar);
    if is_token {
        return text.to_owned();
    }
    let mut out = String::from("\"");
    for c in text.chars().filter(|c| (' '..='~').contains(c)) {
        if c == '"' || c == '\\' {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('"');
    out
}

/// Formats Unix seconds as an IMF-fixdate (`Sun, 06 Nov 1994 08:49:37
/// GMT`). Times after the year 9999 are clamped to its last second.
pub fn http_date(unix_secs: u64) -> HeaderValue {
    let time = UNIX_EPOCH + Duration::from_secs(unix_secs.min(MAX_HTTP_DATE));
    HeaderValue::from_str(&httpdate::fmt_http_date(time)).expect("an HTTP-date is visible ASCII")
}

/// Parses an HTTP-date in any of the three formats RFC 9110 §5.6.7 allows
/// (IMF-fixdate, RFC 850, asctime) into Unix seconds; `None` when invalid
/// or before 1970.
pub fn parse_http_date(value: &HeaderValue) -> Option<u64> {
    let text = value.to_str().ok()?.trim();
    let time: SystemTime = httpdate::parse_http_date(text).ok()?;
    time.duration_since(UNIX_EPOCH).ok().map(|d| d.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 1994-11-06T08:49:37Z, the RFC 9110 example date.
    const T: u64 = 784_111_777;

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

    fn date(secs: u64) -> String {
        http_date(secs).to_str().unwrap().to_owned()
    }

    fn store(status: u16, request: &[(&str, &str)], response: &[(&str, &str)]) -> Storability {
        storability(
            &Method::GET,
            &map(request),
            StatusCode::from_u16(status).unwrap(),
            &map(response),
            true,
            SetCookie::OnlyIfPublic,
        )
    }

    fn lifetime(response: &[(&str, &str)], shared: bool) -> u64 {
        freshness_lifetime(StatusCode::OK, &map(response), T, shared)
    }

    // --- Cache-Control parsing ---

    #[test]
    fn a6_set_cookie_is_stored_by_a_shared_cache_only_when_public() {
        let get = Method::GET;
        let only_if_public = SetCookie::OnlyIfPublic;
        for name in ["set-cookie", "set-cookie2"] {
            let cookie = map(&[(name, "session=1")]);
            let shared = storability(
                &get,
                &map(&[]),
                StatusCode::OK,
                &cookie,
                true,
                only_if_public,
            );
            assert!(matches!(shared, Storability::NotStorable(_)), "{name}");
            let private = storability(
                &get,
                &map(&[]),
                StatusCode::OK,
                &cookie,
                false,
                only_if_public,
            );
            assert_eq!(private, Storability::Storable, "{name}");
        }
        for allowed in ["public, max-age=5", "s-maxage=5"] {
            let public = map(&[("set-cookie", "a=1"), ("cache-control", allowed)]);
            let public = storability(
                &get,
                &map(&[]),
                StatusCode::OK,
                &public,
                true,
                only_if_public,
            );
            assert_eq!(public, Storability::Storable, "{allowed}");
        }
    }

    #[test]
    fn rfc9111_7_3_set_cookie_alone_does_not_keep_a_response_out_when_the_operator_says() {
        let get = Method::GET;
        for name in ["set-cookie", "set-cookie2"] {
            let cookie = map(&[(name, "session=1"), ("cache-control", "max-age=60")]);
            let stored = storability(
                &get,
                &map(&[]),
                StatusCode::OK,
                &cookie,
                true,
                SetCookie::Stored,
            );
            assert_eq!(stored, Storability::Storable, "{name}");
        }
        // The other rules still hold: only the cookie's is relaxed.
        for (request, response, reason) in [
            (
                &[][..],
                &[("set-cookie", "a=1"), ("cache-control", "private")][..],
                "private response in a shared cache",
            ),
            (
                &[][..],
                &[("set-cookie", "a=1"), ("cache-control", "no-store")][..],
                "response has no-store",
            ),
            (
                &[("authorization", "Basic dTpw")][..],
                &[("set-cookie", "a=1")][..],
                "authorized request in a shared cache",
            ),
            (
                &[][..],
                &[("set-cookie", "a=1"), ("vary", "*")][..],
                "Vary: *",
            ),
        ] {
            let s = storability(
                &get,
                &map(request),
                StatusCode::OK,
                &map(response),
                true,
                SetCookie::Stored,
            );
            assert_eq!(s, Storability::NotStorable(reason), "{response:?}");
        }
    }

    #[test]
    fn cache_control_combines_field_lines_and_ignores_unknown_directives() {
        let cc = CacheControl::parse(&map(&[
            ("cache-control", "Public, x-custom=\"a, b\", max-age=60"),
            ("cache-control", "must-revalidate, stale-if-error=300"),
        ]));
        assert!(cc.public && cc.must_revalidate);
        assert_eq!(cc.max_age, Some(60));
        assert_eq!(cc.stale_if_error, Some(300));
        assert!(!cc.private && !cc.no_store);
    }

    #[test]
    fn cache_control_first_duplicate_wins() {
        let cc = CacheControl::parse(&map(&[("cache-control", "max-age=10, max-age=99")]));
        assert_eq!(cc.max_age, Some(10));
    }

    #[test]
    fn cache_control_invalid_max_age_means_zero() {
        for value in ["max-age=abc", "max-age=-5", "max-age", "max-age=1.5"] {
            let cc = CacheControl::parse(&map(&[("cache-control", value)]));
            assert_eq!(cc.max_age, Some(0), "{value}");
        }
    }

    #[test]
    fn cache_control_caps_delta_seconds_at_two_to_the_31() {
        let cc = CacheControl::parse(&map(&[(
            "cache-control",
            "max-age=99999999999999999999999, s-maxage=3000000000",
        )]));
        assert_eq!(cc.max_age, Some(1 << 31));
        assert_eq!(cc.s_maxage, Some(1 << 31));
    }

    #[test]
    fn cache_control_accepts_quoted_arguments() {
        let cc = CacheControl::parse(&map(&[("cache-control", "max-age=\"30\"")]));
        assert_eq!(cc.max_age, Some(30));
    }

    #[test]
    fn cache_control_max_stale_with_and_without_value() {
        let any = CacheControl::parse(&map(&[("cache-control", "max-stale")]));
        let some = CacheControl::parse(&map(&[("cache-control", "max-stale=5, min-fresh=7")]));
        assert_eq!(any.max_stale, Some(None));
        assert_eq!(some.max_stale, Some(Some(5)));
        assert_eq!(some.min_fresh, Some(7));
    }

    #[test]
    fn qualified_no_cache_counts_as_no_cache() {
        let cc = CacheControl::parse(&map(&[("cache-control", "no-cache=\"Set-Cookie, X\"")]));
        assert!(cc.no_cache);
    }

    #[test]
    fn pragma_no_cache_counts_only_without_cache_control() {
        let pragma = map(&[("pragma", "no-cache")]);
        assert!(CacheControl::parse_request(&pragma).no_cache);
        assert!(!CacheControl::parse(&pragma).no_cache);
        let both = map(&[("pragma", "no-cache"), ("cache-control", "max-age=5")]);
        assert!(!CacheControl::parse_request(&both).no_cache);
    }

    // --- storability ---

    #[test]
    fn plain_200_without_freshness_or_validators_is_storable() {
        assert_eq!(store(200, &[], &[]), Storability::Storable);
    }

    #[test]
    fn only_get_is_stored() {
        for method in [Method::HEAD, Method::POST] {
            let s = storability(
                &method,
                &map(&[]),
                StatusCode::OK,
                &map(&[]),
                true,
                SetCookie::OnlyIfPublic,
            );
            assert!(matches!(s, Storability::NotStorable(_)), "{method}");
        }
    }

    #[test]
    fn rfc9111_3_statuses_stored_and_p20_errors_only_by_url_with_explicit_freshness() {
        let fresh = [("cache-control", "max-age=600")];
        for status in [200, 203, 204, 300, 301, 308] {
            assert_eq!(store(status, &[], &[]), Storability::Storable, "{status}");
        }
        for status in [302, 303, 307, 404, 405, 410, 414, 501] {
            assert_eq!(
                store(status, &[], &fresh),
                Storability::Storable,
                "{status}"
            );
            let heuristic = store(
                status,
                &[],
                &[("last-modified", "Tue, 01 Jan 2030 00:00:00 GMT")],
            );
            assert!(matches!(heuristic, Storability::NotStorable(_)), "{status}");
        }
        let expires = [("expires", "Tue, 01 Jan 2030 00:00:00 GMT")];
        assert_eq!(store(404, &[], &expires), Storability::Storable);
        // CPDoS (P-20): errors a header can provoke, whatever they say.
        for status in [206, 304, 400, 413, 431, 500, 502, 503] {
            let s = store(status, &[], &[("cache-control", "max-age=600, public")]);
            assert!(matches!(s, Storability::NotStorable(_)), "{status}");
        }
    }

    #[test]
    fn rfc9111_5_2_2_3_must_understand_stores_despite_no_store_only_a_status_understood() {
        let both = [("cache-control", "must-understand, no-store, max-age=60")];
        assert_eq!(store(200, &[], &both), Storability::Storable);
        assert_eq!(store(404, &[], &both), Storability::Storable);
        assert!(matches!(
            store(206, &[], &both),
            Storability::NotStorable(_)
        ));
        assert!(matches!(
            store(299, &[], &both),
            Storability::NotStorable(_)
        ));
    }

    #[test]
    fn no_store_on_either_side_is_not_storable() {
        let req = store(200, &[("cache-control", "no-store")], &[]);
        let resp = store(200, &[], &[("cache-control", "max-age=60, no-store")]);
        assert_eq!(req, Storability::NotStorable("request has no-store"));
        assert_eq!(resp, Storability::NotStorable("response has no-store"));
    }

    #[test]
    fn private_is_not_storable_in_a_shared_cache_only() {
        let response = map(&[("cache-control", "private, max-age=60")]);
        let store = |shared| {
            let cookies = SetCookie::OnlyIfPublic;
            storability(
                &Method::GET,
                &map(&[]),
                StatusCode::OK,
                &response,
                shared,
                cookies,
            )
        };
        let (shared, private) = (store(true), store(false));
        assert!(matches!(shared, Storability::NotStorable(_)));
        assert_eq!(private, Storability::Storable);
    }

    #[test]
    fn authorized_request_is_stored_in_a_shared_cache_only_when_the_response_allows() {
        let auth = [("authorization", "Basic dTpw")];
        assert!(matches!(
            store(200, &auth, &[("cache-control", "max-age=60")]),
            Storability::NotStorable(_)
        ));
        for allowing in ["public", "s-maxage=60", "must-revalidate"] {
            let s = store(200, &auth, &[("cache-control", allowing)]);
            assert_eq!(s, Storability::Storable, "{allowing}");
        }
    }

    #[test]
    fn vary_star_is_not_storable() {
        let s = store(200, &[], &[("vary", "Accept-Encoding, *")]);
        assert_eq!(s, Storability::NotStorable("Vary: *"));
        assert_eq!(
            store(200, &[], &[("vary", "Accept")]),
            Storability::Storable
        );
    }

    // --- freshness lifetime ---

    #[test]
    fn s_maxage_beats_max_age_only_in_shared_caches() {
        let response = [("cache-control", "max-age=60, s-maxage=600")];
        assert_eq!(lifetime(&response, true), 600);
        assert_eq!(lifetime(&response, false), 60);
    }

    #[test]
    fn max_age_beats_expires() {
        let expires = date(T + 1000);
        let response = [("cache-control", "max-age=60"), ("expires", &expires)];
        assert_eq!(lifetime(&response, true), 60);
    }

    #[test]
    fn expires_minus_date() {
        let (d, e) = (date(T - 100), date(T + 200));
        assert_eq!(lifetime(&[("date", &d), ("expires", &e)], true), 300);
    }

    #[test]
    fn expires_without_date_counts_from_response_time() {
        let e = date(T + 200);
        assert_eq!(lifetime(&[("expires", &e)], true), 200);
    }

    #[test]
    fn invalid_or_past_expires_means_already_expired() {
        let lm = date(T - 100_000);
        assert_eq!(
            lifetime(&[("expires", "0"), ("last-modified", &lm)], true),
            0
        );
        let (d, e) = (date(T), date(T - 50));
        assert_eq!(lifetime(&[("date", &d), ("expires", &e)], true), 0);
    }

    #[test]
    fn heuristic_is_ten_percent_of_time_since_last_modified() {
        let (d, lm) = (date(T), date(T - 5000));
        assert_eq!(lifetime(&[("date", &d), ("last-modified", &lm)], true), 500);
    }

    #[test]
    fn heuristic_is_capped_at_a_day() {
        let (d, lm) = (date(T), date(T - 365 * 86_400));
        assert_eq!(
            lifetime(&[("date", &d), ("last-modified", &lm)], true),
            86_400
        );
    }

    #[test]
    fn heuristic_applies_only_to_heuristically_cacheable_statuses() {
        let (d, lm) = (date(T), date(T - 5000));
        let response = map(&[("date", &d), ("last-modified", &lm)]);
        assert_eq!(
            freshness_lifetime(StatusCode::NOT_FOUND, &response, T, true),
            500
        );
        let found = freshness_lifetime(StatusCode::FOUND, &response, T, true);
        let error = freshness_lifetime(StatusCode::INTERNAL_SERVER_ERROR, &response, T, true);
        assert_eq!((found, error), (0, 0));
    }

    #[test]
    fn no_freshness_information_means_zero() {
        assert_eq!(lifetime(&[("etag", "\"x\"")], true), 0);
    }

    // --- current age ---

    #[test]
    fn age_is_resident_time_plus_response_delay() {
        let d = date(T);
        let age = current_age(&map(&[("date", &d)]), T - 2, T, T + 100);
        assert_eq!(age, 102);
    }

    #[test]
    fn age_header_raises_the_current_age() {
        let d = date(T);
        let age = current_age(&map(&[("date", &d), ("age", "3600")]), T, T, T + 10);
        assert_eq!(age, 3610);
    }

    #[test]
    fn apparent_age_from_an_old_date_counts() {
        let d = date(T - 500);
        assert_eq!(current_age(&map(&[("date", &d)]), T, T, T), 500);
    }

    #[test]
    fn clocks_running_backwards_give_zero_not_negative() {
        let d = date(T + 1000);
        assert_eq!(current_age(&map(&[("date", &d)]), T + 5, T, T - 10), 0);
    }

    #[test]
    fn an_age_that_is_not_one_number_makes_the_response_stale() {
        for age in ["-5", "abc", "7200.0", "7200;foo=bar", "0, 0", "0,7200", ""] {
            let stored = map(&[("age", age), ("cache-control", "max-age=3600")]);
            assert_eq!(
                current_age(&stored, T, T, T + 7),
                MAX_DELTA_SECONDS,
                "{age:?}"
            );
        }
        let mut two_lines = map(&[("age", "0")]);
        two_lines.append(header::AGE, HeaderValue::from_static("0"));
        assert_eq!(current_age(&two_lines, T, T, T), MAX_DELTA_SECONDS);
        assert_eq!(current_age(&map(&[("age", "5")]), T, T, T + 7), 12);
    }

    // --- reuse ---

    fn reuse_of(request: &[(&str, &str)], stored: &[(&str, &str)], age: u64, life: u64) -> Reuse {
        reuse(&map(request), &map(stored), age, life, true)
    }

    #[test]
    fn fresh_response_is_served_and_stale_one_revalidated() {
        assert_eq!(reuse_of(&[], &[], 10, 60), Reuse::Serve);
        assert_eq!(reuse_of(&[], &[], 60, 60), Reuse::Revalidate);
    }

    #[test]
    fn request_max_age_zero_forces_revalidation() {
        let req = [("cache-control", "max-age=0")];
        assert_eq!(reuse_of(&req, &[], 1, 60), Reuse::Revalidate);
        // Stored within the same second (age 0): still revalidated, as
        // apt's `max-age=0` means (its lists would keep an old Release).
        assert_eq!(reuse_of(&req, &[], 0, 60), Reuse::Revalidate);
        assert_eq!(
            reuse_of(&[("cache-control", "max-age=5")], &[], 1, 60),
            Reuse::Serve
        );
    }

    #[test]
    fn request_no_cache_and_pragma_force_revalidation() {
        let no_cache = [("cache-control", "no-cache")];
        assert_eq!(reuse_of(&no_cache, &[], 0, 60), Reuse::Revalidate);
        assert_eq!(
            reuse_of(&[("pragma", "no-cache")], &[], 0, 60),
            Reuse::Revalidate
        );
    }

    #[test]
    fn min_fresh_requires_remaining_freshness() {
        let req = [("cache-control", "min-fresh=30")];
        assert_eq!(reuse_of(&req, &[], 40, 60), Reuse::Revalidate);
        assert_eq!(reuse_of(&req, &[], 30, 60), Reuse::Serve);
    }

    #[test]
    fn max_stale_allows_a_stale_response_within_its_limit() {
        let req = [("cache-control", "max-stale=100")];
        assert_eq!(reuse_of(&req, &[], 150, 60), Reuse::Serve);
        assert_eq!(reuse_of(&req, &[], 161, 60), Reuse::Revalidate);
        let any = [("cache-control", "max-stale")];
        assert_eq!(reuse_of(&any, &[], 1_000_000, 60), Reuse::Serve);
    }

    #[test]
    fn must_revalidate_overrides_max_stale() {
        let req = [("cache-control", "max-stale")];
        let stored = [("cache-control", "max-age=60, must-revalidate")];
        assert_eq!(reuse_of(&req, &stored, 61, 60), Reuse::Revalidate);
    }

    #[test]
    fn proxy_revalidate_and_s_maxage_override_max_stale_only_when_shared() {
        let req = map(&[("cache-control", "max-stale")]);
        for directive in ["proxy-revalidate", "s-maxage=60"] {
            let stored = map(&[("cache-control", directive)]);
            assert_eq!(
                reuse(&req, &stored, 61, 60, true),
                Reuse::Revalidate,
                "{directive}"
            );
            assert_eq!(
                reuse(&req, &stored, 61, 60, false),
                Reuse::Serve,
                "{directive}"
            );
        }
    }

    #[test]
    fn no_cache_response_is_always_revalidated() {
        let stored = [("cache-control", "no-cache, max-age=3600")];
        assert_eq!(reuse_of(&[], &stored, 0, 3600), Reuse::Revalidate);
    }

    // --- stale-if-error ---

    fn on_error(request: &[(&str, &str)], stored: &[(&str, &str)], age: u64) -> bool {
        may_serve_stale_on_error(&map(request), &map(stored), age, 60, true)
    }

    #[test]
    fn stale_if_error_from_the_response_allows_within_its_limit() {
        let stored = [("cache-control", "max-age=60, stale-if-error=100")];
        assert!(on_error(&[], &stored, 160));
        assert!(!on_error(&[], &stored, 161));
    }

    #[test]
    fn stale_if_error_from_the_request_sets_the_limit() {
        let stored = [("cache-control", "max-age=60, stale-if-error=100")];
        let req = [("cache-control", "stale-if-error=10")];
        assert!(!on_error(&req, &stored, 100));
        assert!(on_error(&req, &[], 70));
    }

    #[test]
    fn no_stale_if_error_means_no_stale_on_error() {
        assert!(!on_error(&[], &[("cache-control", "max-age=60")], 61));
    }

    #[test]
    fn revalidation_directives_forbid_stale_on_error() {
        for directive in [
            "must-revalidate",
            "proxy-revalidate",
            "no-cache",
            "s-maxage=60",
        ] {
            let stored = [("cache-control", format!("stale-if-error=999, {directive}"))];
            let stored: Vec<(&str, &str)> = stored.iter().map(|(n, v)| (*n, v.as_str())).collect();
            assert!(!on_error(&[], &stored, 61), "{directive}");
        }
    }

    #[test]
    fn request_no_cache_forbids_stale_on_error_unless_it_sets_its_own_limit() {
        let stored = [("cache-control", "stale-if-error=999")];
        assert!(!on_error(&[("cache-control", "no-cache")], &stored, 61));
        let req = [("cache-control", "no-cache, stale-if-error=999")];
        assert!(on_error(&req, &stored, 61));
    }

    // --- revalidation ---

    #[test]
    fn conditional_headers_carry_etag_as_is_and_last_modified() {
        let lm = date(T);
        let stored = map(&[("etag", "W/\"abc\""), ("last-modified", &lm)]);
        let cond = conditional_headers(&stored);
        assert_eq!(cond[header::IF_NONE_MATCH], "W/\"abc\"");
        assert_eq!(cond[header::IF_MODIFIED_SINCE], lm.as_str());
        assert_eq!(cond.len(), 2);
    }

    #[test]
    fn conditional_headers_skip_missing_or_invalid_validators() {
        assert!(conditional_headers(&map(&[("last-modified", "yesterday")])).is_empty());
    }

    #[test]
    fn rfc5861_3_stale_while_revalidate_within_its_window_unless_forbidden_or_refused() {
        let stored = map(&[("cache-control", "max-age=60, stale-while-revalidate=30")]);
        let may = |request: &[(&str, &str)], stored: &HeaderMap, age| {
            may_serve_stale_while_revalidating(&map(request), stored, age, 60, true)
        };
        assert!(may(&[], &stored, 90));
        assert!(!may(&[], &stored, 91), "past the window");
        assert!(!may(&[("cache-control", "no-cache")], &stored, 70));
        assert!(!may(&[("cache-control", "max-age=0")], &stored, 70));
        let must = map(&[(
            "cache-control",
            "max-age=60, stale-while-revalidate=30, must-revalidate",
        )]);
        assert!(!may(&[], &must, 70));
        assert!(!may(&[], &map(&[("cache-control", "max-age=60")]), 61));
    }

    #[test]
    fn rfc9111_4_3_1_without_last_modified_the_date_is_if_modified_since() {
        let (lm, d) = (date(T), date(T + 100));
        let cond = conditional_headers(&map(&[("date", &d)]));
        assert_eq!(cond[header::IF_MODIFIED_SINCE], d.as_str());
        let cond = conditional_headers(&map(&[("date", &d), ("last-modified", &lm)]));
        assert_eq!(
            cond[header::IF_MODIFIED_SINCE],
            lm.as_str(),
            "Last-Modified first"
        );
        let cond = conditional_headers(&map(&[("date", &d), ("last-modified", "yesterday")]));
        assert_eq!(cond[header::IF_MODIFIED_SINCE], d.as_str());
        let cond = conditional_headers(&map(&[("date", &d), ("etag", "\"x\"")]));
        assert!(
            cond.get(header::IF_MODIFIED_SINCE).is_none(),
            "the ETag decides"
        );
    }

    #[test]
    fn not_modified_merge_replaces_validators_and_keeps_content_headers() {
        let stored = map(&[
            ("content-length", "1234"),
            ("content-type", "text/html"),
            ("etag", "\"old\""),
            ("cache-control", "max-age=60"),
            ("cache-control", "public"),
            ("date", "Sun, 06 Nov 1994 08:49:37 GMT"),
            ("hsync-basis", ":AAAA:"),
            ("x-kept", "1"),
        ]);
        let not_modified = map(&[
            ("content-length", "0"),
            ("content-type", "text/plain"),
            ("etag", "W/\"new\""),
            ("cache-control", "max-age=600"),
            ("date", "Mon, 07 Nov 1994 08:49:37 GMT"),
            ("hsync-basis", ":BBBB:"),
            ("connection", "close"),
        ]);
        let merged = merge_not_modified(&stored, &not_modified);
        assert_eq!(merged[header::CONTENT_LENGTH], "1234");
        assert_eq!(merged[header::CONTENT_TYPE], "text/plain");
        assert_eq!(merged["hsync-basis"], ":AAAA:");
        assert_eq!(merged[header::ETAG], "\"old\"");
        let cc: Vec<_> = merged.get_all(header::CACHE_CONTROL).iter().collect();
        assert_eq!(cc, ["max-age=600"]);
        assert_eq!(merged[header::DATE], "Mon, 07 Nov 1994 08:49:37 GMT");
        assert_eq!(merged["x-kept"], "1");
        assert!(!merged.contains_key(header::CONNECTION));
    }

    #[test]
    fn rfc9111_3_2_a_304_keeps_the_stored_etag_and_digests_and_freshens_the_rest() {
        let stored = map(&[
            ("etag", "\"abcdef\""),
            ("content-md5", "rL0Y20zC+Fzt72VPzMSk2A=="),
            ("cache-control", "max-age=2"),
        ]);
        let other = map(&[("etag", "\"ghijkl\""), ("cache-control", "max-age=600")]);
        let merged = merge_not_modified(&stored, &other);
        assert_eq!(merged[header::ETAG], "\"abcdef\"");
        assert_eq!(merged[header::CACHE_CONTROL], "max-age=600");
        let same = map(&[
            ("etag", "\"abcdef\""),
            ("content-md5", "N7UdGUp1E+RbVvZSTy1R8g=="),
            ("cache-control", "max-age=600"),
        ]);
        let merged = merge_not_modified(&stored, &same);
        assert_eq!(merged["content-md5"], "rL0Y20zC+Fzt72VPzMSk2A==");
        assert_eq!(merged[header::CACHE_CONTROL], "max-age=600");
    }

    // --- invalidation ---

    #[test]
    fn unsafe_methods_with_success_or_redirect_invalidate() {
        assert!(invalidates(&Method::POST, StatusCode::OK));
        assert!(invalidates(&Method::DELETE, StatusCode::NO_CONTENT));
        assert!(invalidates(&Method::PUT, StatusCode::SEE_OTHER));
        assert!(!invalidates(
            &Method::POST,
            StatusCode::INTERNAL_SERVER_ERROR
        ));
        assert!(!invalidates(&Method::POST, StatusCode::NOT_FOUND));
        assert!(!invalidates(&Method::GET, StatusCode::OK));
        assert!(!invalidates(&Method::HEAD, StatusCode::OK));
    }

    // --- Cache-Status ---

    #[test]
    fn cache_status_hit() {
        assert_eq!(cache_status("rproxy", &CacheStatus::hit()), "rproxy; hit");
        let with_ttl = CacheStatus {
            ttl: Some(-412),
            ..CacheStatus::hit()
        };
        assert_eq!(cache_status("rproxy", &with_ttl), "rproxy; hit; ttl=-412");
    }

    #[test]
    fn cache_status_miss_stored() {
        let status = CacheStatus {
            stored: true,
            ..CacheStatus::forwarded(Forward::Miss)
        };
        assert_eq!(cache_status("rproxy", &status), "rproxy; fwd=miss; stored");
    }

    #[test]
    fn cache_status_revalidated_with_304() {
        let status = CacheStatus {
            fwd_status: Some(StatusCode::NOT_MODIFIED),
            ..CacheStatus::forwarded(Forward::Stale)
        };
        assert_eq!(
            cache_status("rproxy", &status),
            "rproxy; fwd=stale; fwd-status=304"
        );
    }

    #[test]
    fn cache_status_forward_reasons() {
        let cases = [
            (Forward::UriMiss, "rproxy; fwd=uri-miss"),
            (Forward::VaryMiss, "rproxy; fwd=vary-miss"),
            (Forward::Bypass, "rproxy; fwd=bypass"),
            (Forward::Method, "rproxy; fwd=method"),
            (Forward::Request, "rproxy; fwd=request"),
            (Forward::Partial, "rproxy; fwd=partial"),
        ];
        for (reason, expected) in cases {
            assert_eq!(
                cache_status("rproxy", &CacheStatus::forwarded(reason)),
                expected
            );
        }
    }

    #[test]
    fn cache_status_stale_served_on_error() {
        let status = CacheStatus::stale_on_error(Some(StatusCode::BAD_GATEWAY), -30);
        assert_eq!(
            cache_status("rproxy", &status),
            "rproxy; fwd=stale; fwd-status=502; ttl=-30; detail=stale-if-error"
        );
        let no_status = CacheStatus::stale_on_error(None, -1);
        assert_eq!(
            cache_status("rproxy", &no_status),
            "rproxy; fwd=stale; ttl=-1; detail=stale-if-error"
        );
    }

    #[test]
    fn cache_status_quotes_a_name_that_is_not_a_token() {
        let status = CacheStatus {
            collapsed: true,
            ..CacheStatus::forwarded(Forward::UriMiss)
        };
        assert_eq!(
            cache_status("my \"cache\"", &status),
            "\"my \\\"cache\\\"\"; fwd=uri-miss; collapsed"
        );
    }

    // --- HTTP dates ---

    #[test]
    fn http_date_formats_imf_fixdate() {
        assert_eq!(http_date(T), "Sun, 06 Nov 1994 08:49:37 GMT");
    }

    #[test]
    fn http_date_clamps_past_year_9999_instead_of_panicking() {
        assert_eq!(http_date(u64::MAX), "Fri, 31 Dec 9999 23:59:59 GMT");
    }

    #[test]
    fn parse_http_date_accepts_the_three_formats() {
        for text in [
            "Sun, 06 Nov 1994 08:49:37 GMT",
            "Sunday, 06-Nov-94 08:49:37 GMT",
            "Sun Nov  6 08:49:37 1994",
        ] {
            assert_eq!(
                parse_http_date(&HeaderValue::from_static(text)),
                Some(T),
                "{text}"
            );
        }
    }

    #[test]
    fn parse_http_date_rejects_garbage() {
        assert_eq!(parse_http_date(&HeaderValue::from_static("0")), None);
        assert_eq!(parse_http_date(&HeaderValue::from_static("tomorrow")), None);
    }
}
