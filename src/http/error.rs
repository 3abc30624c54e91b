//! Why a request was not served, and who was at fault: the one place a
//! refusal's status code, its log line and its metric reason are chosen.
//!
//! A handler names the situation (`ProxyError::upstream_timeout(..)`,
//! `ProxyError::bad_request(..)`) and says what happened in words; the
//! [`ErrorKind`] it picks decides the status, the [`Fault`] and the
//! reason label, each in one `match`, so a 400 can never be counted as
//! the origin's failure nor a 502 as the client's.
//!
//! Leaves out: answers that are not refusals (a 304, a queue page with a
//! place in it is still a refusal, a 200 is not), and the errors of the
//! layers below (`hsync`, the cache store), which keep their own enums
//! and are turned into a `ProxyError` where a request meets them.
//!
//! A refusal's response carries its fault as an extension, so that a role
//! can count refusals by fault where its responses pass ([`fault_of`]).
//!
//! Main types: [`ProxyError`], [`ErrorKind`], [`Fault`].

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Response, StatusCode, header};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};

use crate::http::head_guard::Violation;

/// [`crate::http::server::ProxyBody`], spelled out so that the error model
/// depends on nothing above it (the server and the headers use it).
type ProxyBody = BoxBody<Bytes, Box<dyn std::error::Error + Send + Sync>>;

/// Who a refusal is on: what an operator reads first, and what the
/// counters split by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Fault {
    /// The request itself (malformed, not allowed, not authenticated):
    /// nothing for the operator to fix.
    Client,
    /// The origin or the next proxy: unreachable, late, or answered
    /// something we cannot relay.
    Upstream,
    /// We are full: slots, password checks. Retrying later helps.
    Overload,
    /// Our own bug or failure: the encoder failed or panicked, a stored
    /// body or basis could not be read.
    Proxy,
}

impl Fault {
    /// The name used in logs and counters.
    pub fn as_str(self) -> &'static str {
        match self {
            Fault::Client => "client",
            Fault::Upstream => "upstream",
            Fault::Overload => "overload",
            Fault::Proxy => "proxy",
        }
    }
}

impl std::fmt::Display for Fault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Refusals counted by whose fault they were, for a role's stats: an
/// upstream outage must not read like clients sending bad requests, nor
/// our own failures like either; and by their reason, the log's label.
#[derive(Debug, Default)]
pub struct Refusals {
    client: std::sync::atomic::AtomicU64,
    upstream: std::sync::atomic::AtomicU64,
    overload: std::sync::atomic::AtomicU64,
    proxy: std::sync::atomic::AtomicU64,
    /// By [`ErrorKind`], at its index in [`ErrorKind::ALL`].
    by_kind: [std::sync::atomic::AtomicU64; ErrorKind::ALL.len()],
}

/// [`Refusals`] read at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RefusalCounts {
    /// All of them: the sum of the four below.
    pub total: u64,
    /// [`Fault::Client`]'s.
    pub client: u64,
    /// [`Fault::Upstream`]'s.
    pub upstream: u64,
    /// [`Fault::Overload`]'s.
    pub overload: u64,
    /// [`Fault::Proxy`]'s.
    pub proxy: u64,
}

impl RefusalCounts {
    /// `(fault, count)`, as the metrics label them and the status page
    /// lists them.
    pub fn rows(&self) -> [(&'static str, u64); 4] {
        [
            ("client", self.client),
            ("upstream", self.upstream),
            ("overload", self.overload),
            ("proxy", self.proxy),
        ]
    }
}

impl Refusals {
    /// Counts one refusal of `kind`, under its fault and its reason.
    pub fn count(&self, kind: ErrorKind) {
        // A kind left out of `ALL` by mistake is counted by fault alone,
        // rather than panic on a refusal.
        if let Some(by_kind) = self.by_kind.get(kind as usize) {
            by_kind.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        let counter = match kind.fault() {
            Fault::Client => &self.client,
            Fault::Upstream => &self.upstream,
            Fault::Overload => &self.overload,
            Fault::Proxy => &self.proxy,
        };
        counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    /// `(reason, count)` of the reasons counted so far (the others are
    /// left out), in [`ErrorKind::ALL`]'s order.
    pub fn reasons(&self) -> Vec<(&'static str, u64)> {
        ErrorKind::ALL
            .iter()
            .zip(&self.by_kind)
            .map(|(kind, count)| {
                (
                    kind.reason(),
                    count.load(std::sync::atomic::Ordering::Relaxed),
                )
            })
            .filter(|&(_, count)| count > 0)
            .collect()
    }

    /// The counts now.
    pub fn read(&self) -> RefusalCounts {
        let get = |c: &std::sync::atomic::AtomicU64| c.load(std::sync::atomic::Ordering::Relaxed);
        let (client, upstream, overload, proxy) = (
            get(&self.client),
            get(&self.upstream),
            get(&self.overload),
            get(&self.proxy),
        );
        RefusalCounts {
            total: client + upstream + overload + proxy,
            client,
            upstream,
            overload,
            proxy,
        }
    }
}

/// The situation a request was refused in; it alone decides the status,
/// the fault and the reason label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// A request we cannot act on: its target, headers or body (400).
    BadRequest,
    /// An HTTP/1.0 request with content and no `Content-Length` (411).
    LengthRequired,
    /// A request target longer than the configured limit (414).
    TargetTooLong,
    /// No whole request head within the header timeout (408).
    RequestTimeout,
    /// A request body that came too slowly: under the minimum upload
    /// rate, or stalled for the idle timeout (408, then close; over
    /// HTTP/2 only its stream ends).
    BodyTimeout,
    /// A method this hop does not serve at all (405).
    MethodNotAllowed,
    /// Something this hop does not do, such as tunnelling (501).
    NotImplemented,
    /// No such resource (404; the demo's static origin).
    NotFound,
    /// A host this hop serves no site for (421): the client reached the
    /// wrong server.
    Misdirected,
    /// A destination this hop may not fetch from: a host, port or address
    /// outside the allow-list (403).
    Forbidden,
    /// The request came round to us again, or passed too many proxies
    /// (508): a routing loop in front of us, refused as the request's.
    Loop,
    /// `only-if-cached` and nothing fresh stored (504, RFC 9111
    /// §5.2.1.7): the client asked not to go upstream.
    NotCached,
    /// No or wrong proxy credentials (407).
    Unauthenticated,
    /// Too many failed logins from this address (429): the client's.
    LoginsThrottled,
    /// Too many password checks under way at once (429): ours, since the
    /// client did nothing wrong.
    AuthBusy,
    /// Every upload slot is busy; the answer may carry a queue place
    /// (503).
    SlotsBusy,
    /// The upstream could not be reached or broke off the exchange (502).
    UpstreamUnreachable,
    /// The upstream failed often enough to be marked down, and is not
    /// tried again yet (503 with `Retry-After`): refused at once instead
    /// of after a connect timeout of its own.
    UpstreamDown,
    /// The upstream sent no head, or no whole body, in time (504).
    UpstreamTimeout,
    /// The upstream's answer cannot be relayed: bad framing, a cut body
    /// (502).
    BadUpstreamResponse,
    /// Our own failure, such as the encoder's (500).
    Internal,
    /// Our own failure on the way to an answer the client proxy fetches:
    /// a basis file we cannot read, a stored body that fails its check
    /// after a 304, a fetch task that ended without an answer. Answered
    /// 502, as a failed fetch is, so that the user agent retries; filed as
    /// ours, since the upstream did nothing wrong.
    InternalBadGateway,
}

impl ErrorKind {
    /// Every kind, in declaration order: `kind as usize` is its index. A
    /// new kind goes here too, in its place (a test checks the order).
    pub const ALL: [ErrorKind; 22] = [
        ErrorKind::BadRequest,
        ErrorKind::LengthRequired,
        ErrorKind::TargetTooLong,
        ErrorKind::RequestTimeout,
        ErrorKind::BodyTimeout,
        ErrorKind::MethodNotAllowed,
        ErrorKind::NotImplemented,
        ErrorKind::NotFound,
        ErrorKind::Misdirected,
        ErrorKind::Forbidden,
        ErrorKind::Loop,
        ErrorKind::NotCached,
        ErrorKind::Unauthenticated,
        ErrorKind::LoginsThrottled,
        ErrorKind::AuthBusy,
        ErrorKind::SlotsBusy,
        ErrorKind::UpstreamUnreachable,
        ErrorKind::UpstreamDown,
        ErrorKind::UpstreamTimeout,
        ErrorKind::BadUpstreamResponse,
        ErrorKind::Internal,
        ErrorKind::InternalBadGateway,
    ];

    /// The status code a refusal of this kind answers with.
    pub fn status(self) -> StatusCode {
        match self {
            ErrorKind::BadRequest => StatusCode::BAD_REQUEST,
            ErrorKind::LengthRequired => StatusCode::LENGTH_REQUIRED,
            ErrorKind::TargetTooLong => StatusCode::URI_TOO_LONG,
            ErrorKind::RequestTimeout | ErrorKind::BodyTimeout => StatusCode::REQUEST_TIMEOUT,
            ErrorKind::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            ErrorKind::NotImplemented => StatusCode::NOT_IMPLEMENTED,
            ErrorKind::NotFound => StatusCode::NOT_FOUND,
            ErrorKind::Misdirected => StatusCode::MISDIRECTED_REQUEST,
            ErrorKind::Forbidden => StatusCode::FORBIDDEN,
            ErrorKind::Loop => StatusCode::LOOP_DETECTED,
            ErrorKind::NotCached => StatusCode::GATEWAY_TIMEOUT,
            ErrorKind::Unauthenticated => StatusCode::PROXY_AUTHENTICATION_REQUIRED,
            ErrorKind::LoginsThrottled | ErrorKind::AuthBusy => StatusCode::TOO_MANY_REQUESTS,
            ErrorKind::SlotsBusy | ErrorKind::UpstreamDown => StatusCode::SERVICE_UNAVAILABLE,
            ErrorKind::UpstreamUnreachable
            | ErrorKind::BadUpstreamResponse
            | ErrorKind::InternalBadGateway => StatusCode::BAD_GATEWAY,
            ErrorKind::UpstreamTimeout => StatusCode::GATEWAY_TIMEOUT,
            ErrorKind::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// Who a refusal of this kind is on.
    pub fn fault(self) -> Fault {
        match self {
            ErrorKind::BadRequest
            | ErrorKind::LengthRequired
            | ErrorKind::TargetTooLong
            | ErrorKind::RequestTimeout
            | ErrorKind::BodyTimeout
            | ErrorKind::MethodNotAllowed
            | ErrorKind::NotImplemented
            | ErrorKind::NotFound
            | ErrorKind::Misdirected
            | ErrorKind::Forbidden
            | ErrorKind::Loop
            | ErrorKind::NotCached
            | ErrorKind::Unauthenticated
            | ErrorKind::LoginsThrottled => Fault::Client,
            ErrorKind::AuthBusy | ErrorKind::SlotsBusy => Fault::Overload,
            ErrorKind::UpstreamUnreachable
            | ErrorKind::UpstreamDown
            | ErrorKind::UpstreamTimeout
            | ErrorKind::BadUpstreamResponse => Fault::Upstream,
            ErrorKind::Internal | ErrorKind::InternalBadGateway => Fault::Proxy,
        }
    }

    /// A short fixed label for logs and metrics (the message varies, this
    /// does not).
    pub fn reason(self) -> &'static str {
        match self {
            ErrorKind::BadRequest => "bad_request",
            ErrorKind::LengthRequired => "length_required",
            ErrorKind::TargetTooLong => "target_too_long",
            ErrorKind::RequestTimeout => "request_timeout",
            ErrorKind::BodyTimeout => "body_timeout",
            ErrorKind::MethodNotAllowed => "method_not_allowed",
            ErrorKind::NotImplemented => "not_implemented",
            ErrorKind::NotFound => "not_found",
            ErrorKind::Misdirected => "misdirected",
            ErrorKind::Forbidden => "forbidden",
            ErrorKind::Loop => "loop",
            ErrorKind::NotCached => "not_cached",
            ErrorKind::Unauthenticated => "unauthenticated",
            ErrorKind::LoginsThrottled => "logins_throttled",
            ErrorKind::AuthBusy => "auth_busy",
            ErrorKind::SlotsBusy => "slots_busy",
            ErrorKind::UpstreamUnreachable => "upstream_unreachable",
            ErrorKind::UpstreamDown => "upstream_down",
            ErrorKind::UpstreamTimeout => "upstream_timeout",
            ErrorKind::BadUpstreamResponse => "bad_upstream_response",
            ErrorKind::Internal => "internal",
            ErrorKind::InternalBadGateway => "internal_bad_gateway",
        }
    }
}

/// A refused request: what kind of refusal, the text the client reads,
/// and the headers that go with it.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct ProxyError {
    kind: ErrorKind,
    message: String,
    /// Stream offset of the byte that broke the framing, for the log.
    at: Option<u64>,
    /// Headers the situation adds (a challenge, `Retry-After`, a queue
    /// place); boxed, since most refusals have none and a `Result` carrying
    /// a whole `HeaderMap` inline is large on every happy path.
    headers: Option<Box<HeaderMap>>,
    /// The connection cannot be trusted after this message (its framing
    /// was refused), so it is closed.
    close: bool,
    /// The upstream sent no byte of an answer (see [`Self::unanswered`]).
    unanswered: bool,
}

impl ProxyError {
    /// A refusal of `kind`, saying `message` to the client.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        ProxyError {
            kind,
            message: message.into(),
            at: None,
            headers: None,
            close: false,
            unanswered: false,
        }
    }

    /// A request we cannot act on (400).
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::BadRequest, message)
    }

    /// A request whose framing the head guard refused (400, connection
    /// closed): what follows on the connection cannot be told apart.
    pub fn malformed_request(violation: Violation) -> Self {
        let mut error = Self::bad_request(violation.reason.to_string()).closing();
        error.at = Some(violation.at);
        error
    }

    /// A request target over the limit (414).
    pub fn target_too_long(len: usize, max: usize) -> Self {
        Self::new(
            ErrorKind::TargetTooLong,
            format!("request target of {len} bytes; at most {max}"),
        )
    }

    /// A client that sent no whole request head in time (408): no body,
    /// since the client may not be reading at all.
    pub fn request_timeout() -> Self {
        Self::new(ErrorKind::RequestTimeout, "").closing()
    }

    /// A request whose body came too slowly, `message` saying how (408):
    /// the connection is closed, since the rest of the body may still
    /// come. (Over HTTP/2 hyper drops the `Connection` header: the stream
    /// ends alone, and the connection's other streams go on.)
    pub fn body_timeout(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::BodyTimeout, message).closing()
    }

    /// A request that came back to us, or passed too many proxies (508).
    pub fn loop_detected(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Loop, message)
    }

    /// A method this hop does not serve (405), with the `Allow` it does.
    pub fn method_not_allowed(message: impl Into<String>, allow: &'static str) -> Self {
        Self::new(ErrorKind::MethodNotAllowed, message)
            .with_header(header::ALLOW, HeaderValue::from_static(allow))
    }

    /// Something this hop does not do, such as CONNECT (501).
    pub fn not_implemented(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::NotImplemented, message)
    }

    /// A host this hop serves no site for (421).
    pub fn misdirected(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Misdirected, message)
    }

    /// A destination outside what this hop may fetch from (403).
    pub fn forbidden(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Forbidden, message)
    }

    /// 404.
    pub fn not_found() -> Self {
        Self::new(ErrorKind::NotFound, "not found")
    }

    /// `only-if-cached` with nothing fresh stored (504).
    pub fn not_cached(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::NotCached, message)
    }

    /// No or wrong proxy credentials (407), with the challenge to answer.
    pub fn unauthenticated(challenge: HeaderValue) -> Self {
        Self::new(
            ErrorKind::Unauthenticated,
            "proxy authentication required: send Proxy-Authorization: Basic",
        )
        .with_header(header::PROXY_AUTHENTICATE, challenge)
    }

    /// Too many failed logins from this address (429).
    pub fn logins_throttled(retry_after_secs: u64) -> Self {
        Self::new(
            ErrorKind::LoginsThrottled,
            format!("too many failed logins from this address; retry in {retry_after_secs} s"),
        )
        .with_header(header::RETRY_AFTER, HeaderValue::from(retry_after_secs))
    }

    /// Too many password checks under way (429).
    pub fn auth_busy(retry_after_secs: u64) -> Self {
        Self::new(
            ErrorKind::AuthBusy,
            format!("too many password checks under way; retry in {retry_after_secs} s"),
        )
        .with_header(header::RETRY_AFTER, HeaderValue::from(retry_after_secs))
    }

    /// Every upload slot busy (503); the queue's headers go with it.
    pub fn slots_busy(message: impl Into<String>, queue_headers: HeaderMap) -> Self {
        let mut error = Self::new(ErrorKind::SlotsBusy, message);
        error.headers = Some(Box::new(queue_headers));
        error
    }

    /// The upstream could not be reached or broke off (502).
    pub fn upstream_unreachable(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::UpstreamUnreachable, message)
    }

    /// The upstream is marked down (503), tried again in `retry_in`.
    pub fn upstream_down(message: impl Into<String>, retry_in: std::time::Duration) -> Self {
        // Whole seconds, rounded up: `Retry-After: 0` would invite a
        // client to hammer the probe.
        let seconds = retry_in.as_secs() + u64::from(retry_in.subsec_nanos() > 0);
        Self::new(ErrorKind::UpstreamDown, message)
            .with_header(header::RETRY_AFTER, HeaderValue::from(seconds.max(1)))
    }

    /// The upstream was too slow (504).
    pub fn upstream_timeout(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::UpstreamTimeout, message)
    }

    /// The upstream's answer cannot be relayed (502).
    pub fn bad_upstream_response(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::BadUpstreamResponse, message)
    }

    /// Our own failure (500).
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Internal, message)
    }

    /// Our own failure while fetching for the client, answered as a failed
    /// fetch (502, fault: proxy): see [`ErrorKind::InternalBadGateway`].
    pub fn internal_bad_gateway(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::InternalBadGateway, message)
    }

    /// The same refusal, closing the connection after it.
    pub fn closing(mut self) -> Self {
        self.close = true;
        self
    }

    /// The same refusal, marked as one where the upstream sent no byte of
    /// an answer: it could not be connected to, sent no head in time, or
    /// was not tried (marked down). A request that is safe to repeat (a
    /// GET or HEAD without a body) may go another way.
    pub fn unanswered(mut self) -> Self {
        self.unanswered = true;
        self
    }

    /// Whether the upstream sent no byte of an answer
    /// ([`Self::unanswered`]).
    pub fn is_unanswered(&self) -> bool {
        self.unanswered
    }

    /// The same refusal with one more header.
    pub fn with_header(mut self, name: header::HeaderName, value: HeaderValue) -> Self {
        self.headers.get_or_insert_default().insert(name, value);
        self
    }

    /// The situation.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// The status code the client gets.
    pub fn status(&self) -> StatusCode {
        self.kind.status()
    }

    /// Who is at fault.
    pub fn fault(&self) -> Fault {
        self.kind.fault()
    }

    /// What the client reads.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// One `info` line: refusals are answers, not our errors, and an
    /// operator filters them by `fault` (an `upstream` run means the
    /// origin is down, a `proxy` one is a bug to report).
    pub fn log(&self) {
        tracing::info!(
            status = self.status().as_u16(),
            fault = self.fault().as_str(),
            reason = self.kind.reason(),
            message = %self.message,
            at = self.at,
            "refused"
        );
    }

    /// The plain-text response: the message and a newline, as
    /// `text/plain`, with the situation's headers; its kind rides along
    /// for [`refusal_of`].
    pub fn into_response(self) -> Response<ProxyBody> {
        let kind = self.kind;
        let mut response = text_response(self.status(), self.message);
        response.extensions_mut().insert(Refused(kind));
        let headers = response.headers_mut();
        if let Some(extra) = self.headers {
            headers.extend(*extra);
        }
        if self.close {
            headers.insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        response
    }

    /// [`Self::log`], then [`Self::into_response`].
    pub fn log_and_respond(self) -> Response<ProxyBody> {
        self.log();
        self.into_response()
    }

    /// The response as raw HTTP/1.1 bytes, closing, for a connection hyper
    /// has given up on: no body when the message is empty.
    pub fn to_http1(&self) -> Vec<u8> {
        let status = self.status();
        let mut head = format!(
            "HTTP/1.1 {} {}\r\nConnection: close\r\n",
            status.as_u16(),
            status.canonical_reason().unwrap_or("")
        );
        if self.message.is_empty() {
            head.push_str("Content-Length: 0\r\n\r\n");
        } else {
            let body = format!("{}\n", self.message);
            head.push_str(&format!(
                "Content-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            ));
        }
        head.into_bytes()
    }
}

/// Marks a response made by [`ProxyError::into_response`] (a response
/// extension; it never goes on the wire).
#[derive(Debug, Clone, Copy)]
struct Refused(ErrorKind);

/// What kind of refusal `response` is, when it was made by
/// [`ProxyError::into_response`]; `None` for any other response (an
/// upstream's own 502 is not our refusal).
pub fn refusal_of<B>(response: &Response<B>) -> Option<ErrorKind> {
    response
        .extensions()
        .get::<Refused>()
        .map(|&Refused(kind)| kind)
}

/// Who was at fault, when `response` is a refusal made by
/// [`ProxyError::into_response`] (see [`refusal_of`]).
pub fn fault_of<B>(response: &Response<B>) -> Option<Fault> {
    refusal_of(response).map(ErrorKind::fault)
}

/// An error and its sources, `: `-separated (hyper's client errors say
/// little more than "Connect" on their own; the cause, such as a
/// certificate the peer's name does not match or that no trusted CA
/// issued, is in the chain).
pub fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// A plain-text response, for errors and refusals: `message` and a
/// newline.
pub fn text_response(status: StatusCode, message: String) -> Response<ProxyBody> {
    let mut response = Response::new(
        Full::new(Bytes::from(message + "\n"))
            .map_err(|never| match never {})
            .boxed(),
    );
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

/// A JSON response of our own (stats, the change feed, the admin
/// listener's answers), never to be stored: `body` as it is.
pub fn json_response(status: StatusCode, body: impl Into<Bytes>) -> Response<ProxyBody> {
    let mut response = Response::new(
        Full::new(body.into())
            .map_err(|never| match never {})
            .boxed(),
    );
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_sits_at_its_index_and_has_a_reason_of_its_own() {
        for (index, kind) in ErrorKind::ALL.iter().enumerate() {
            assert_eq!(*kind as usize, index, "{kind:?}");
        }
        let mut reasons: Vec<_> = ErrorKind::ALL.iter().map(|k| k.reason()).collect();
        reasons.sort_unstable();
        reasons.dedup();
        assert_eq!(reasons.len(), ErrorKind::ALL.len());
    }

    #[test]
    fn refusals_are_counted_by_fault_and_by_reason() {
        let refusals = Refusals::default();
        refusals.count(ErrorKind::BodyTimeout);
        refusals.count(ErrorKind::BodyTimeout);
        refusals.count(ErrorKind::UpstreamTimeout);
        let counts = refusals.read();
        assert_eq!((counts.total, counts.client, counts.upstream), (3, 2, 1));
        assert_eq!(
            refusals.reasons(),
            [("body_timeout", 2), ("upstream_timeout", 1)]
        );
    }
    use crate::http::head_guard::{Part, Reason};

    #[test]
    fn client_and_upstream_refusals_have_different_faults() {
        assert_eq!(ProxyError::bad_request("x").fault(), Fault::Client);
        assert_eq!(ProxyError::upstream_timeout("x").fault(), Fault::Upstream);
        assert_eq!(
            ProxyError::upstream_unreachable("x").status(),
            StatusCode::BAD_GATEWAY
        );
        assert_eq!(ProxyError::auth_busy(1).fault(), Fault::Overload);
        assert_eq!(ProxyError::logins_throttled(1).fault(), Fault::Client);
        assert_eq!(ProxyError::internal("x").fault(), Fault::Proxy);
    }

    #[test]
    fn a_down_upstream_is_a_503_on_it_with_a_retry_after_in_whole_seconds() {
        let error = ProxyError::upstream_down("down", std::time::Duration::from_millis(2100));
        assert_eq!(error.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(error.fault(), Fault::Upstream);
        assert_eq!(error.kind().reason(), "upstream_down");
        assert!(!error.is_unanswered(), "only where the caller says so");
        let response = error.into_response();
        assert_eq!(response.headers()[header::RETRY_AFTER], "3");
        let soon = ProxyError::upstream_down("down", std::time::Duration::ZERO).into_response();
        assert_eq!(soon.headers()[header::RETRY_AFTER], "1");
    }

    #[test]
    fn an_internal_bad_gateway_is_a_502_on_us() {
        let error = ProxyError::internal_bad_gateway("cannot read the basis");
        assert_eq!(error.kind(), ErrorKind::InternalBadGateway);
        assert_eq!(error.status(), StatusCode::BAD_GATEWAY);
        assert_eq!(error.fault(), Fault::Proxy);
        assert_eq!(error.kind().reason(), "internal_bad_gateway");
        // The upstream's 502s stay the upstream's.
        assert_eq!(
            ProxyError::bad_upstream_response("x").fault(),
            Fault::Upstream
        );
    }

    #[test]
    fn a_refusal_response_carries_its_fault_and_no_other_response_does() {
        let refusal = ProxyError::internal_bad_gateway("x").into_response();
        assert_eq!(fault_of(&refusal), Some(Fault::Proxy));
        let refusal = ProxyError::bad_request("x").into_response();
        assert_eq!(fault_of(&refusal), Some(Fault::Client));
        let answer = text_response(StatusCode::BAD_GATEWAY, "from upstream".into());
        assert_eq!(fault_of(&answer), None);
    }

    #[tokio::test]
    async fn response_is_the_message_as_text_with_the_situations_headers() {
        let response = ProxyError::auth_busy(7).into_response();
        assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(response.headers()[header::RETRY_AFTER], "7");
        assert_eq!(
            response.headers()[header::CONTENT_TYPE],
            "text/plain; charset=utf-8"
        );
        assert!(!response.headers().contains_key(header::CONNECTION));
        let body = response.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(
            &body[..],
            b"too many password checks under way; retry in 7 s\n"
        );
    }

    #[test]
    fn a_malformed_request_closes_the_connection() {
        let violation = Violation {
            reason: Reason::ObsFold,
            at: 3,
            part: Part::Head { start: 0 },
            message: 0,
        };
        let response = ProxyError::malformed_request(violation).into_response();
        assert_eq!(response.status(), StatusCode::BAD_REQUEST);
        assert_eq!(response.headers()[header::CONNECTION], "close");
    }

    #[test]
    fn a_slow_body_is_the_clients_408_and_closes() {
        let error = ProxyError::body_timeout("too slow");
        assert_eq!(error.status(), StatusCode::REQUEST_TIMEOUT);
        assert_eq!(error.fault(), Fault::Client);
        assert_eq!(error.kind().reason(), "body_timeout");
        let response = error.into_response();
        assert_eq!(response.headers()[header::CONNECTION], "close");
    }

    #[test]
    fn raw_form_has_a_body_only_with_a_message() {
        assert_eq!(
            ProxyError::request_timeout().to_http1(),
            b"HTTP/1.1 408 Request Timeout\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"
        );
        let text = String::from_utf8(ProxyError::bad_request("no").to_http1()).unwrap();
        assert!(text.ends_with("Content-Length: 3\r\n\r\nno\n"), "{text}");
    }
}
