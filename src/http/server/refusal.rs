//! What the server refuses before a role sees a request: a head past the
//! limits or breaking the framing rules hyper does not check (`refuse_early`),
//! and a request body whose chunking the guard refused
//! ([`MalformedRequestBody`], [`malformed_request_body`],
//! [`bad_request_body`]); and what a role answers a request whose body the
//! connection layer failed for coming too slowly ([`slow_request_body`]).
//! Each refusal is a [`ProxyError`], which chooses its status and log
//! reason.

use std::io;
use std::sync::Arc;

use hyper::{Request, Response};

use crate::http::error::ProxyError;
use crate::http::head_guard::Violation;
use crate::http::headers::check_request_head;

use super::body::ProxyBody;
use super::io::IdleTimeout;
use super::limits::ConnectionLimits;
use super::request_body::RequestBody;
use super::upload_rate::SlowUpload;

/// The number of hops a `Via` list names (read as [`crate::http::headers`] reads it
/// for loops, so the two checks agree on what an entry is).
pub fn via_hops(headers: &http::HeaderMap) -> usize {
    crate::http::headers::via_entries(headers).count()
}

/// What every request passes before its role sees it: the limits and
/// framing rules hyper does not check itself.
pub(super) fn refuse_early(
    request: &Request<RequestBody>,
    limits: &ConnectionLimits,
) -> Option<Response<ProxyBody>> {
    let uri = request.uri();
    let target_len = uri.scheme_str().map_or(0, |s| s.len() + 3)
        + uri.authority().map_or(0, |a| a.as_str().len())
        + uri.path_and_query().map_or(0, |p| p.as_str().len());
    let refusal = if let Err(refusal) =
        check_request_head(request.version(), request.method(), request.headers())
    {
        refusal
    } else if target_len > limits.max_target_bytes {
        ProxyError::target_too_long(target_len, limits.max_target_bytes)
    } else if via_hops(request.headers()) > limits.max_hops {
        ProxyError::loop_detected(format!(
            "the request passed more than {} proxies",
            limits.max_hops
        ))
    } else {
        return None;
    };
    let _request = tracing::info_span!("request", method = %request.method()).entered();
    // Refused before its body was read: what follows on the connection
    // cannot be told apart from it.
    Some(refusal.closing().log_and_respond())
}

/// The violation of a request body the guard refused on a connection, if
/// any: the service refuses that request itself when its head comes after
/// (the bad chunk came with it), so nothing goes upstream.
pub(super) type RefusedBody = Arc<std::sync::OnceLock<Violation>>;

/// The error under the I/O error a request body's reader gets when the
/// guard refused its chunking.
#[derive(Debug, Clone, Copy, thiserror::Error)]
#[error("malformed request body: {} (byte {})", .0.reason, .0.at)]
pub struct MalformedRequestBody(pub Violation);

/// Whether `error` (a request's failed body, or an upstream exchange that
/// failed for it) comes from a request body the guard refused: the client
/// is at fault (400), not the upstream.
pub fn malformed_request_body(error: &(dyn std::error::Error + 'static)) -> Option<Violation> {
    under_io::<MalformedRequestBody>(error).map(|found| found.0)
}

/// The refusal (408, closing) when `error` (a request's failed body, or an
/// upstream exchange that failed for it) comes from a body the client
/// sent too slowly: under the minimum upload rate (over HTTP/1.1 the
/// connection's I/O fails it, over HTTP/2 the stream's [`RequestBody`]),
/// or stalled until the idle timeout. The client is at fault, not the upstream, and what went
/// upstream was cut, not ended (the exchange failed).
pub fn slow_request_body(error: &(dyn std::error::Error + 'static)) -> Option<ProxyError> {
    if let Some(slow) = under_io::<SlowUpload>(error) {
        return Some(ProxyError::body_timeout(slow.to_string()));
    }
    // The idle watch fails reads and writes alike; under a request body's
    // error it is a read of that body: the client stopped sending it.
    under_io::<IdleTimeout>(error)
        .map(|idle| ProxyError::body_timeout(format!("request body stalled: {idle}")))
}

/// The `T` inside an I/O error somewhere in `error`'s chain.
fn under_io<'e, T: std::error::Error + 'static>(
    error: &'e (dyn std::error::Error + 'static),
) -> Option<&'e T> {
    let mut next = Some(error);
    while let Some(error) = next {
        // An I/O error's `source` skips its own inner error.
        let inner = error
            .downcast_ref::<io::Error>()
            .and_then(io::Error::get_ref)
            .map(|inner| inner as &(dyn std::error::Error + 'static));
        if let Some(found) = inner.and_then(|e| e.downcast_ref::<T>()) {
            return Some(found);
        }
        next = error.source();
    }
    None
}

/// The answer to a request whose body the guard refused.
pub fn bad_request_body(violation: Violation) -> Response<ProxyBody> {
    ProxyError::malformed_request(violation).log_and_respond()
}
