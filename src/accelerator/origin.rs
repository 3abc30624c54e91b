//! The trip to the origin: the request as it goes (hop-by-hop fields and
//! ours removed, identity asked for when we will code, `Via`, `Host`,
//! `Forwarded`, the route's URL, HTTP/1.1), one send within the origin
//! timeout, and the response head checked and made ours (no hop-by-hop
//! fields, our `Via`, our reason phrase and version).
//!
//! The trip feeds the origin's health: an answer is a success, a
//! connection that could not be opened or no head in time a failure
//! ([`crate::http::health`] says why those), and while the origin is
//! marked down a request is refused at once (503, `Retry-After`) instead
//! of waiting for its own connect timeout, but for the one that probes.
//!
//! Leaves out which origin (`sites.rs`) and what is done with the body
//! (`mod.rs` decides to code or pass).
//!
//! Main items: [`Accelerator::rewrite_request`], [`Accelerator::fetch`],
//! [`FromOrigin`].

use http::Request;
use http::header::{self, HeaderValue};
use http::request::Parts;
use hyper::body::Incoming;
use hyper_util::client::legacy::connect::capture_connection;
use tokio::time::Instant;

use super::Accelerator;
use super::sites::Route;
use crate::http::dial::AddressRefused;
use crate::http::error::{ProxyError, error_chain};
use crate::http::forwarded::{self, Hop};
use crate::http::headers::{
    HSYNC_ACCEPT, HSYNC_BASIS, HSYNC_SIGNATURE, add_via, check_response_head, remove_hsync_coding,
    strip_hop_by_hop,
};
use crate::http::health::Admission;
use crate::http::server::{
    InterimSender, Peer, ProxyBody, forward_interim, malformed_request_body, slow_request_body,
};
use crate::http::tls::TlsSession;
use crate::http::upstream_guard::{self, ExchangeCheck};
use crate::http::upstream_wait;
use crate::queue::{X_NODE, X_QUEUE, X_QUEUED};

/// The origin's answer, its head made ours.
pub(super) struct FromOrigin {
    pub parts: http::response::Parts,
    pub body: Incoming,
    /// The HTTP/1.1 framing check of the exchange, read when the body ends.
    pub framing: Option<ExchangeCheck>,
}

impl Accelerator {
    /// Turns the client's request head into the one the origin gets along
    /// `route`. `encodable`: we will code the answer, so the origin is
    /// asked for identity; else an hsync offer is taken out of
    /// `Accept-Encoding` (the origin cannot answer it).
    ///
    /// # Errors
    /// A malformed `Connection` field (the client's fault).
    pub(super) fn rewrite_request(
        &self,
        parts: &mut Parts,
        route: &Route,
        offers_hsync: bool,
        encodable: bool,
    ) -> Result<(), ProxyError> {
        strip_hop_by_hop(&mut parts.headers)
            .map_err(|error| ProxyError::bad_request(error.to_string()))?;
        // The hsync fields and the queue's are between the client and us.
        for name in [
            &HSYNC_SIGNATURE,
            &HSYNC_BASIS,
            &HSYNC_ACCEPT,
            &X_QUEUE,
            &X_QUEUED,
            &X_NODE,
        ] {
            parts.headers.remove(name);
        }
        if encodable {
            // We encode the identity body; the origin must not code it.
            parts.headers.insert(
                header::ACCEPT_ENCODING,
                HeaderValue::from_static("identity"),
            );
        } else if offers_hsync {
            remove_hsync_coding(&mut parts.headers);
        }
        add_via(&mut parts.headers, &self.config.via_name);
        let hop = Hop {
            client: parts.extensions.get::<Peer>().map(|peer| peer.0.ip()),
            tls: parts.extensions.get::<TlsSession>().is_some(),
            host: route.asked.as_deref(),
        };
        forwarded::forward(&mut parts.headers, hop, &self.config.trusted_forwarders);
        parts.headers.insert(header::HOST, route.host.clone());
        parts.uri = route.url.clone();
        // The client may have come over HTTP/2; the origin hop is HTTP/1.1.
        parts.version = http::Version::HTTP_11;
        Ok(())
    }

    /// Sends the rewritten request and waits for the origin's head.
    ///
    /// # Errors
    /// The origin marked down (503), no head within the origin timeout
    /// (504), the origin unreachable or not permitted (502, 403), the
    /// client's body malformed (400) or too slow (408), a head that cannot
    /// be relayed (502).
    pub(super) async fn fetch(
        &self,
        mut parts: Parts,
        body: ProxyBody,
        route: &Route,
    ) -> Result<FromOrigin, ProxyError> {
        let health = route.health.as_deref();
        if let Some(health) = health
            && let Admission::Refused { retry_in } = health.admit(Instant::now())
        {
            let last = health.view(Instant::now()).last_error.unwrap_or_default();
            return Err(ProxyError::upstream_down(
                format!(
                    "origin {} is down ({last}); it is tried again in {} s",
                    health.name(),
                    retry_in.as_secs_f64().ceil()
                ),
                retry_in,
            ));
        }
        let failed = |error: &str| {
            if let Some(health) = health {
                health.record_failure(error, Instant::now());
            }
        };
        let interim = parts.extensions.remove::<InterimSender>();
        let timeout = self.config.origin_timeout;
        // The timeout runs from the last byte of the body the origin took:
        // an upload longer than it is not the origin's fault.
        let (body, patience) = upstream_wait::watch(body, timeout);
        let mut outbound = Request::from_parts(parts, body);
        // The origin's 1xx heads (103 Early Hints) go on while the client
        // waits (RFC 9110 §15.2).
        forward_interim(&mut outbound, interim.as_ref());
        let connection = capture_connection(&mut outbound);
        let asked = std::time::Instant::now();
        let answered = patience.answer(route.client.request(outbound)).await;
        if let Ok(Ok(_)) = &answered {
            self.stats.origin_latency.observe(asked.elapsed());
        }
        let response = match answered {
            Err(_) => {
                let message = format!(
                    "origin sent no response head within {timeout:?} (of the last request byte it took)"
                );
                failed(&message);
                return Err(ProxyError::upstream_timeout(message));
            }
            // The exchange failed on the client's body, not the origin.
            Ok(Err(error)) if let Some(violation) = malformed_request_body(&error) => {
                return Err(ProxyError::malformed_request(violation));
            }
            Ok(Err(error)) if let Some(refusal) = slow_request_body(&error) => {
                return Err(refusal);
            }
            Ok(Err(error)) => {
                if let Some(refused) = AddressRefused::in_chain(&error) {
                    return Err(ProxyError::forbidden(refused.to_string()));
                }
                let message = format!(
                    "origin unreachable: {}: {}",
                    route.url.authority().map_or("", |a| a.as_str()),
                    error_chain(&error)
                );
                // Only a connection that could not be opened says the
                // origin is gone; a pooled one it closed under us does not.
                if error.is_connect() {
                    failed(&message);
                }
                return Err(ProxyError::upstream_unreachable(message));
            }
            Ok(Ok(response)) => response,
        };
        if let Some(health) = health {
            health.record_success(Instant::now());
        }
        if let Err(message) = check_response_head(response.headers()) {
            // Whatever hyper made of it, the connection is not used again.
            if let Some(connected) = connection.connection_metadata().as_ref() {
                connected.poison();
            }
            return Err(ProxyError::bad_upstream_response(format!(
                "origin response: {message}"
            )));
        }
        let framing = upstream_guard::last_exchange(&connection);
        let (mut parts, body) = response.into_parts();
        // The reason phrase is the origin's; ours comes from the status
        // (P-18).
        parts.extensions.remove::<hyper::ext::ReasonPhrase>();
        // The protocol version belongs to each hop: ours is HTTP/1.1
        // whatever the origin speaks (an HTTP/1.0 origin must not make us
        // answer 1.0 and lose chunked framing).
        parts.version = http::Version::HTTP_11;
        strip_hop_by_hop(&mut parts.headers).map_err(|error| {
            ProxyError::bad_upstream_response(format!("origin response: {error}"))
        })?;
        add_via(&mut parts.headers, &self.config.via_name);
        // P-17: whole as declared, with bytes after it: served for nobody
        // to store (the caller neither codes nor keeps it).
        if let Some(check) = &framing
            && upstream_guard::serve_without_excess(check, &mut parts.headers)
            && let Some(connected) = connection.connection_metadata().as_ref()
        {
            connected.poison();
        }
        Ok(FromOrigin {
            parts,
            body,
            framing,
        })
    }
}
