//! A request's trip upstream when the upstream may queue it: it goes
//! offering PARQ and, while queued, comes back at each poll in the dialect
//! the upstream answered, on a connection of our own where the place is
//! kept by one (the module doc of [`super`] says how). The step between
//! going upstream ([`crate::client_proxy::upstream`]) and the wait's
//! visible state ([`super::QueueWaits`]).

use std::sync::Arc;
use std::time::Duration;

use http::request::Parts;
use http::{Method, Request, Response, Version};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use tokio::time::Instant;

use super::place::{Dialect, EtaEstimate, Place};
use super::{
    MAX_LOST_CONNECTIONS, MAX_QUEUED_BODY, OFFER_LEGACY, OFFER_PARQ, Observed, Registered, Shown,
    Wait,
};
use crate::client_proxy::upstream::{HeldConnection, PooledConnection};
use crate::client_proxy::{ClientProxy, ClientStats, Target, empty};
use crate::http::error::ProxyError;
use crate::http::server::ProxyBody;
use crate::queue::{X_NODE, X_QUEUE, X_QUEUED};

impl ClientProxy {
    /// Sends a request upstream, offering PARQ; when the upstream queues a
    /// GET or HEAD, waits in its queue (see the module doc) for at most
    /// `--queue-wait-max`. `Err` is the status and message for the user
    /// agent.
    pub(in crate::client_proxy) async fn send(
        &self,
        request: Request<ProxyBody>,
        target: &Target,
    ) -> Result<Response<Incoming>, ProxyError> {
        let started = Instant::now();
        let (mut parts, body) = request.into_parts();
        // The queue headers of this hop are ours, never the user agent's.
        parts.headers.remove(&X_QUEUED);
        parts.headers.remove(&X_NODE);
        parts.headers.insert(X_QUEUE.clone(), OFFER_PARQ);
        // Where to call us back: for the proxies we configured, not for
        // every origin a direct route reaches.
        if let Some(node) = &self.waits.node
            && !target.upstream.is_direct()
        {
            parts.headers.insert(X_NODE.clone(), node.clone());
        }
        let response = self.send_once(again(&parts, body), target).await?;
        if !matches!(parts.method, Method::GET | Method::HEAD) {
            return Ok(response);
        }
        let Some(place) = Place::read(response.status(), response.version(), response.headers())
        else {
            return Ok(response);
        };
        // A navigation can be given the waiting page, and then waits in
        // the background; any other request waits with its user agent on
        // the line.
        let (wait, max) = match parts.extensions.get::<Observed>() {
            Some(Observed(wait)) => (wait.clone(), self.waits.config.wait_max),
            None => (
                Arc::new(Wait::new(target.url.to_string(), started)),
                self.waits.config.held_max.min(self.waits.config.wait_max),
            ),
        };
        let give_up = wait.since + max;
        let registered = self.waits.register(wait);
        self.wait_in_queue(&mut parts, response, place, target, &registered, give_up)
            .await
    }

    /// The wait itself, from the first queued answer on.
    async fn wait_in_queue(
        &self,
        parts: &mut Parts,
        mut response: Response<Incoming>,
        mut place: Place,
        target: &Target,
        registered: &Registered<'_>,
        give_up: Instant,
    ) -> Result<Response<Incoming>, ProxyError> {
        let wait = &registered.wait;
        let mut progress = EtaEstimate::default();
        let mut held: Option<HeldConnection> = None;
        let mut lost_connections = 0;
        loop {
            let now = Instant::now();
            progress.observe(place.position, now);
            let eta = place.eta.or_else(|| progress.eta());
            // A legacy place on a pooled connection cannot be polled on
            // that connection: a place on a held one is taken at once.
            let moving = place.dialect == Dialect::Legacy && held.is_none();
            let come_back = if moving {
                Duration::ZERO
            } else {
                place.come_back_after()
            };
            let at = now + come_back;
            let shown = Shown {
                dialect: place.dialect,
                position: place.position,
                length: place.length,
                eta,
                next_poll: at,
            };
            wait.shown.send_replace(Some(shown));
            registered.set_id(place.id);
            if at > give_up {
                tracing::info!(
                    url = %wait.url,
                    dialect = ?place.dialect,
                    position = place.position,
                    waited_secs = wait.since.elapsed().as_secs(),
                    back_in_secs = come_back.as_secs(),
                    may_wait_secs = give_up.saturating_duration_since(wait.since).as_secs(),
                    "gave up waiting in the upstream's queue"
                );
                // The place and its ID are ours, not the user agent's.
                response.headers_mut().remove(&X_QUEUE);
                response.headers_mut().remove(&X_QUEUED);
                return Ok(response);
            }
            ClientStats::add(&self.stats.queue_waits, 1);
            tracing::info!(
                url = %wait.url,
                dialect = ?place.dialect,
                position = place.position,
                length = place.length,
                eta_secs = shown.eta().map(|e| e.as_secs()),
                back_in_secs = come_back.as_secs_f64(),
                waited_secs = wait.since.elapsed().as_secs(),
                "queued upstream; waiting"
            );
            // Leave the answer's connection as the next poll needs it.
            match (&held, place.held) {
                (Some(_), true) => {
                    if !drain(response, self.config.upstream_timeout).await {
                        held = None;
                    }
                }
                (None, true) if place.dialect == Dialect::Legacy => {
                    if response.version() == Version::HTTP_11
                        && let Some(pooled) = response.extensions().get::<PooledConnection>()
                    {
                        // Closed once dropped: the upstream frees the
                        // place it held by it.
                        pooled.retire();
                    }
                    drop(response);
                }
                (None, true) => {
                    // PARQ Sq on a pooled connection: read to the end, so
                    // the connection goes back to the pool rather than
                    // closing, which would cost the place its one allowed
                    // disconnection.
                    drain(response, self.config.upstream_timeout).await;
                }
                (_, false) => {
                    held = None;
                    drop(response);
                }
            }
            tokio::select! {
                () = tokio::time::sleep_until(at) => {}
                () = wait.wake.notified() => {
                    tracing::info!(url = %wait.url, "woken by a QUEUE callback");
                }
            }
            let offer = match place.dialect {
                Dialect::Parq => OFFER_PARQ,
                Dialect::Legacy => OFFER_LEGACY,
            };
            parts.headers.insert(X_QUEUE.clone(), offer);
            match place.claim() {
                Some(claim) => parts.headers.insert(X_QUEUED.clone(), claim),
                None => parts.headers.remove(&X_QUEUED),
            };
            response = if place.held {
                match self
                    .send_held(&mut held, again(parts, empty()), target)
                    .await
                {
                    Ok(response) => response,
                    Err(message) => {
                        held = None;
                        lost_connections += 1;
                        if lost_connections > MAX_LOST_CONNECTIONS {
                            return Err(ProxyError::upstream_unreachable(format!(
                                "lost our place in the upstream's queue: {message}"
                            )));
                        }
                        tracing::info!(url = %wait.url, %message, "lost the connection holding our queue place; asking again");
                        parts.headers.insert(X_QUEUE.clone(), OFFER_PARQ);
                        parts.headers.remove(&X_QUEUED);
                        self.send_once(again(parts, empty()), target).await?
                    }
                }
            } else {
                self.send_once(again(parts, empty()), target).await?
            };
            match Place::read(response.status(), response.version(), response.headers()) {
                Some(next) => place = next,
                None => return Ok(response),
            }
        }
    }

    /// Sends on the held connection, opening it first if there is none or
    /// the upstream closed it. `Err` says why the connection failed.
    async fn send_held(
        &self,
        held: &mut Option<HeldConnection>,
        request: Request<ProxyBody>,
        target: &Target,
    ) -> Result<Response<Incoming>, String> {
        if held.as_ref().is_none_or(HeldConnection::is_closed) {
            let opened = tokio::time::timeout(
                self.config.connect_timeout,
                target.upstream.hold(&target.url),
            );
            *held = Some(match opened.await {
                Ok(Ok(connection)) => connection,
                Ok(Err(e)) => return Err(format!("cannot connect: {e}")),
                Err(_) => return Err("connect timed out".into()),
            });
        }
        let connection = held.as_mut().expect("opened above");
        self.checked(target, request, |request| {
            connection.send(request, target.forward)
        })
        .await
        .map_err(|refusal| refusal.message().to_owned())
    }
}

/// The request again, for one more try (the body was sent with the first).
/// Its extensions go along: what the outbound request carries for the
/// client (the 1xx callback, the navigation's wait).
fn again(parts: &Parts, body: ProxyBody) -> Request<ProxyBody> {
    let mut request = Request::new(body);
    *request.method_mut() = parts.method.clone();
    *request.uri_mut() = parts.uri.clone();
    *request.version_mut() = parts.version;
    *request.headers_mut() = parts.headers.clone();
    *request.extensions_mut() = parts.extensions.clone();
    request
}

/// Reads a queued answer's body to its end, so its connection can carry
/// the next request; false when it is too large, fails or takes too long.
async fn drain(response: Response<Incoming>, within: Duration) -> bool {
    let body = Limited::new(response.into_body(), MAX_QUEUED_BODY);
    matches!(
        tokio::time::timeout(within, body.collect()).await,
        Ok(Ok(_))
    )
}
