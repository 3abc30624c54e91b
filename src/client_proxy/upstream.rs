//! The client proxy's way upstream, the one place a trip upstream happens:
//! the request as it goes ([`ClientProxy::outbound`]: Via, credentials,
//! Host, the target's form), one send on a pooled or a held connection, and
//! the answer's head checked within the upstream timeout
//! ([`ClientProxy::checked`]). The queue wait on the way is
//! [`super::queue_wait`]'s.
//!
//! Underneath: two pooled hyper clients that both
//! connect to the configured upstream (the accelerator, or any HTTP server
//! or proxy), one sending origin-form targets (gateway requests) and one
//! absolute-form (forward-proxy requests, so the accelerator can refuse a
//! host it does not front instead of serving its own origin's bytes under
//! a foreign URL).
//!
//! Also remembers, per upstream, what its `Hsync-Accept` advertised, in a
//! table whose entries expire (an upgraded accelerator is noticed within
//! the TTL), and, per upstream proxy, its [`Health`]: every trip on a
//! pooled connection asks it first (refused at once, 503, while the proxy
//! is marked down) and tells it how the trip went; a refusal where the
//! upstream sent nothing is marked [`ProxyError::unanswered`], for the
//! callers that may go another way ([`ClientProxy::fail_over`]).
//!
//! A queue wait that keeps its place by its connection (Active Queueing
//! 0.1, PARQ's synchronous part) needs the same connection for every poll,
//! which a pool cannot promise: [`Upstream::hold`] opens one of our own,
//! HTTP/1.1 over the same connector, and [`PooledConnection`] lets the
//! caller retire the pooled connection a queued answer came on.
//!
//! Main types: [`Upstream`], [`Advertised`], [`HeldConnection`].

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use http::header::{self, HeaderMap, HeaderValue};
use http::request::Parts;
use http::uri::{Authority, Scheme};
use http::{Request, Response, StatusCode, Uri};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::{
    CaptureConnection, Connected, Connection, capture_connection,
};
use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use tokio::time::Instant;

use super::targeted::SURROGATE_CAPABILITY;
use super::{ClientProxy, ClientStats, Target};
use crate::expiring::ExpiringMap;
use crate::http::address_policy::AddressPolicy;
use crate::http::dial::{AddressRefused, Dialer, Transport};
use crate::http::error::{ProxyError, error_chain};
use crate::http::forwarded;
use crate::http::headers::{HSYNC_ACCEPT, add_via, check_response_head};
use crate::http::health::{Admission, Health};
use crate::http::server::{
    InterimSender, Peer, ProxyBody, forward_interim, malformed_request_body, slow_request_body,
};
use crate::http::tls::TlsSession;
use crate::http::upstream_guard::{self, ExchangeCheck, FramedUpstream, FramingWatch};
use crate::http::upstream_wait;

/// ALPN for a held connection: HTTP/1.1 only, since a queue place kept by
/// a connection is an HTTP/1.1 notion (an HTTP/2 connection is shared).
const HTTP_1_1_ALPN: &[u8] = b"http/1.1";

/// How long an upstream's `Hsync-Accept` is believed without being seen
/// again.
pub const ADVERTISED_TTL: Duration = Duration::from_secs(3600);

/// Hosts whose `Hsync-Accept` a direct route remembers at once (a
/// backstop: each entry is a few dozen bytes).
const MAX_ADVERTISERS: std::num::NonZeroUsize = std::num::NonZeroUsize::new(4096).expect("not 0");

/// How long a body the upstream said it keeps is believed kept: its basis
/// store is bounded, and a body past this was likely pushed out by newer
/// ones (then the digest alone gets a coding without basis, no error).
pub const HELD_TTL: Duration = Duration::from_secs(600);

/// Answers to a basis named by digest alone that came without it
/// (`Hsync-Missed`) before an upstream's `Hsync-Held` is no longer
/// believed: one can be a race (a body asked for before its keeping ended),
/// two within [`HELD_TTL`] are a store that does not keep what it says (a
/// balancer in front of accelerators with stores of their own).
pub const MISSES_TO_DISTRUST: u32 = 2;

/// Held bodies remembered per upstream at most (64 bytes and a little
/// each): a bound on the table, whatever the upstream announces.
const MAX_HELD: std::num::NonZeroUsize = std::num::NonZeroUsize::new(65_536).expect("not 0");

/// What an upstream said it supports in `Hsync-Accept`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Advertised {
    /// Largest basis signature it accepts (bytes, decoded).
    pub max_signature: usize,
    /// Largest basis signature it accepts as a request's body (bytes; 0:
    /// none).
    pub max_body_signature: usize,
}

impl Advertised {
    /// Parses `v=1, max-signature=N[, max-body-signature=M]`; `None` when
    /// version 1 is not offered.
    pub fn parse(value: &http::HeaderValue) -> Option<Advertised> {
        let text = value.to_str().ok()?;
        let mut version_1 = false;
        let mut max_signature = None;
        let mut max_body_signature = 0;
        for item in text.split([',', ';']) {
            let Some((name, value)) = item.split_once('=') else {
                continue;
            };
            match name.trim() {
                "v" => version_1 |= value.trim() == "1",
                "max-signature" => max_signature = value.trim().parse().ok(),
                "max-body-signature" => {
                    max_body_signature = value.trim().parse().unwrap_or(0);
                }
                _ => {}
            }
        }
        Some(Advertised {
            max_signature: max_signature?,
            max_body_signature,
        })
        .filter(|_| version_1)
    }
}

/// The pooled clients and what the upstream advertised.
pub struct Upstream {
    /// The proxy every request goes to, with its scheme; `None` for a
    /// direct route, where each request goes to its URL's own host.
    fixed: Option<(Scheme, Authority)>,
    gateway: Client<UpstreamConnector, ProxyBody>,
    forward: Client<UpstreamConnector, ProxyBody>,
    /// Connects held connections (HTTP/1.1 only over TLS).
    held: UpstreamConnector,
    advertised: Mutex<ExpiringMap<Authority, Advertised>>,
    /// Bodies the upstream said it keeps as bases (`Hsync-Held`), by their
    /// blake3: a request with one as its basis sends the digest alone.
    held_bases: Mutex<ExpiringMap<(Authority, [u8; 32]), ()>>,
    /// Upstreams that answered a basis named by digest alone without
    /// holding it (`Hsync-Missed`), and how often: past
    /// [`MISSES_TO_DISTRUST`], their `Hsync-Held` is not believed for
    /// [`HELD_TTL`] after the last.
    distrusted: Mutex<ExpiringMap<Authority, u32>>,
    /// An upstream proxy's; `None` for a direct route.
    health: Option<Health>,
}

/// The pooled connection a response came on (a response extension): a
/// queue place held by that connection is given up by retiring it.
#[derive(Clone)]
pub struct PooledConnection(CaptureConnection);

impl PooledConnection {
    /// Takes the connection out of the pool and, for HTTP/1.1, closes it,
    /// so the upstream frees whatever it held by it. (Poisoning alone would
    /// leave it open if hyper had put it back in the pool already, which it
    /// does as soon as a short response was read.) An HTTP/2 connection is
    /// only kept from new requests: others' streams are on it.
    pub fn retire(&self) {
        if let Some(connected) = self.0.connection_metadata().as_ref() {
            connected.poison();
            if connected.is_negotiated_h2() {
                return;
            }
            let mut extras = http::Extensions::new();
            connected.get_extras(&mut extras);
            if let Some(closer) = extras.get::<Closer>() {
                closer.close();
            }
        }
    }

    /// The framing check of the response just received on the connection
    /// (HTTP/1.1 only).
    fn last_exchange(&self) -> Option<ExchangeCheck> {
        upstream_guard::last_exchange(&self.0)
    }
}

/// Closes a pooled connection from outside hyper: its reads end, hyper
/// sees the end of the connection and drops it (an idle pooled connection
/// is still read, to notice a close).
#[derive(Clone, Default)]
struct Closer(Arc<CloserState>);

#[derive(Default)]
struct CloserState {
    closed: AtomicBool,
    /// The task reading the connection, to wake when closing.
    reader: Mutex<Option<Waker>>,
}

impl Closer {
    fn close(&self) {
        self.0.closed.store(true, Ordering::Release);
        let reader = self
            .0
            .reader
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(waker) = reader {
            waker.wake();
        }
    }

    fn is_closed(&self) -> bool {
        self.0.closed.load(Ordering::Acquire)
    }

    /// Remembers who to wake; true if closed meanwhile.
    fn register(&self, waker: &Waker) -> bool {
        *self.0.reader.lock().unwrap_or_else(|e| e.into_inner()) = Some(waker.clone());
        self.is_closed()
    }
}

impl Upstream {
    /// Clients for the upstream at `authority` (`host:port`), over TLS
    /// with `tls` (then HTTP/2 when the upstream offers it by ALPN, many
    /// requests on one connection), else plain HTTP/1.1, opened as `base`
    /// opens them; `health` is what is known of it.
    ///
    /// # Errors
    /// A host that cannot be a TLS server name.
    pub fn new(
        authority: Authority,
        tls: Option<Arc<rustls::ClientConfig>>,
        base: &Dialer,
        health: Health,
    ) -> Result<Upstream, String> {
        let scheme = if tls.is_some() {
            Scheme::HTTPS
        } else {
            Scheme::HTTP
        };
        let held_tls = match &tls {
            Some(config) => {
                let host = authority
                    .host()
                    .trim_start_matches('[')
                    .trim_end_matches(']');
                ServerName::try_from(host.to_owned())
                    .map_err(|e| format!("{host}: not a TLS server name: {e}"))?;
                let mut http1 = (**config).clone();
                http1.alpn_protocols = vec![HTTP_1_1_ALPN.to_vec()];
                Some(Arc::new(http1))
            }
            None => None,
        };
        let dialer = |tls| Dialer {
            tls,
            ..base.clone()
        };
        Ok(Upstream {
            health: Some(health),
            ..Upstream::with(Some((scheme, authority)), dialer(tls), dialer(held_tls))
        })
    }

    /// Clients for a direct route: each request goes to its URL's own
    /// host (`http://` only), at an address `policy` permits (SSRF guard,
    /// A-7), in origin-form, opened as `base` opens them.
    pub fn direct(policy: AddressPolicy, base: &Dialer) -> Upstream {
        let dialer = Dialer {
            policy: Some(Arc::new(policy)),
            ..base.clone()
        };
        Upstream::with(None, dialer.clone(), dialer)
    }

    fn with(fixed: Option<(Scheme, Authority)>, dialer: Dialer, held: Dialer) -> Upstream {
        let authority = fixed.as_ref().map(|(_, authority)| authority.clone());
        let connector = |proxied| UpstreamConnector {
            authority: authority.clone(),
            dialer: dialer.clone(),
            proxied,
        };
        let held = UpstreamConnector {
            dialer: held,
            ..connector(false)
        };
        // A direct route's hosts are whoever the user agents name: a
        // smaller pool per host, and a bounded table of what they said.
        let builder = match fixed {
            Some(_) => crate::http::server::upstream_client_builder,
            None => crate::http::server::web_client_builder,
        };
        let gateway = builder().build(connector(false));
        let forward = builder()
            // Host is set by the caller from the absolute target.
            .set_host(false)
            .build(connector(true));
        Upstream {
            fixed,
            gateway,
            forward,
            held,
            advertised: Mutex::new(ExpiringMap::with_max_entries(
                ADVERTISED_TTL,
                MAX_ADVERTISERS,
            )),
            held_bases: Mutex::new(ExpiringMap::with_max_entries(HELD_TTL, MAX_HELD)),
            distrusted: Mutex::new(ExpiringMap::with_max_entries(HELD_TTL, MAX_ADVERTISERS)),
            health: None,
        }
    }

    /// An upstream proxy's health; `None` for a direct route.
    pub fn health(&self) -> Option<&Health> {
        self.health.as_ref()
    }

    /// Whether it is marked down and not due for a probe (a direct route
    /// never is).
    pub fn is_down(&self, now: Instant) -> bool {
        self.health
            .as_ref()
            .is_some_and(|health| health.is_down(now))
    }

    /// The proxy's scheme and `host:port`; `None` for a direct route.
    pub fn fixed(&self) -> Option<&(Scheme, Authority)> {
        self.fixed.as_ref()
    }

    /// Whether requests go to their URL's own host.
    pub fn is_direct(&self) -> bool {
        self.fixed.is_none()
    }

    /// The upstream as logs and errors name it: its `host:port`, or
    /// `url`'s host for a direct route.
    pub fn name<'a>(&'a self, url: &'a Uri) -> &'a str {
        self.fixed
            .as_ref()
            .map(|(_, authority)| authority.as_str())
            .or_else(|| url.authority().map(Authority::as_str))
            .unwrap_or("-")
    }

    /// Whose `Hsync-Accept` a request for `url` is answered under: the
    /// proxy's, or for a direct route the URL's host's.
    fn advertiser<'a>(&'a self, url: &'a Uri) -> Option<&'a Authority> {
        self.fixed
            .as_ref()
            .map(|(_, authority)| authority)
            .or_else(|| url.authority())
    }

    /// Sends `request`: a URI whose authority is the upstream's goes in
    /// origin-form, any other in absolute-form to the upstream. The
    /// response carries its [`PooledConnection`].
    ///
    /// # Errors
    /// The client's error: connect failure, reset, malformed response.
    pub async fn send(
        &self,
        mut request: Request<ProxyBody>,
        forward: bool,
    ) -> Result<Response<Incoming>, hyper_util::client::legacy::Error> {
        let connection = PooledConnection(capture_connection(&mut request));
        let advertiser = self.advertiser(request.uri()).map(kept_copy);
        let mut response = if forward {
            self.forward.request(request).await?
        } else {
            self.gateway.request(request).await?
        };
        if check_response_head(response.headers()).is_err() {
            // Framing the two ends may read differently: whatever hyper
            // made of it, this connection is not used again (P-17).
            connection.retire();
        }
        if let Some(advertiser) = advertiser {
            self.remember_advertised(advertiser, &response);
        }
        if let Some(check) = connection.last_exchange() {
            // Bytes past the end, already: served as declared, for nobody
            // to store, and nothing more to check (P-17).
            if upstream_guard::serve_without_excess(&check, response.headers_mut()) {
                connection.retire();
            } else {
                response.extensions_mut().insert(check);
            }
        }
        response.extensions_mut().insert(connection);
        Ok(response)
    }

    fn remember_advertised(&self, advertiser: Authority, response: &Response<Incoming>) {
        if let Some(advertised) = response
            .headers()
            .get(HSYNC_ACCEPT)
            .and_then(Advertised::parse)
        {
            self.advertised
                .lock()
                .expect("no panics under this lock")
                .insert(advertiser, advertised, Instant::now());
        }
    }

    /// Opens a connection of our own to the upstream, HTTP/1.1 (ALPN
    /// `http/1.1` over TLS), outside the pools: every request on it goes
    /// on the same connection, as a queue place held by the connection
    /// needs.
    ///
    /// # Errors
    /// Connect, TLS or handshake failure.
    pub async fn hold(&self, url: &Uri) -> io::Result<HeldConnection> {
        let mut connector = self.held.clone();
        let stream = tower_service::Service::call(&mut connector, url.clone()).await?;
        let watch = stream.io.inner().watch().clone();
        let (sender, connection) = hyper::client::conn::http1::handshake(stream)
            .await
            .map_err(io::Error::other)?;
        // Ends when the connection closes: after the last response once the
        // sender is dropped, or when the upstream closes it.
        tokio::spawn(async move {
            if let Err(error) = connection.await {
                tracing::debug!(%error, "held upstream connection ended");
            }
        });
        Ok(HeldConnection { sender, watch })
    }

    /// Opens a connection of our own to the upstream proxy, plain or TLS
    /// as its URL says (ALPN `http/1.1`), with nothing sent on it yet: for
    /// a CONNECT to it, after whose answer the connection is a tunnel.
    ///
    /// # Errors
    /// A direct route (no upstream proxy), connect, TLS or the timeout.
    pub(super) async fn dial_raw(&self) -> io::Result<Transport> {
        let Some((_, authority)) = &self.fixed else {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "a direct route has no upstream proxy",
            ));
        };
        let dialer = &self.held.dialer;
        let tls = dialer.tls.is_some();
        let port = authority.port_u16().unwrap_or(if tls { 443 } else { 80 });
        dialer.dial(authority.host(), port, tls).await
    }

    /// Remembers that the upstream a request for `url` goes to keeps the
    /// body whose blake3 is `digest` (it said `Hsync-Held`).
    pub fn remember_held(&self, url: &Uri, digest: blake3::Hash) {
        if let Some(advertiser) = self.advertiser(url) {
            self.held_bases
                .lock()
                .expect("no panics under this lock")
                .insert(
                    (kept_copy(advertiser), *digest.as_bytes()),
                    (),
                    Instant::now(),
                );
        }
    }

    /// The upstream a request for `url` goes to answered a basis named by
    /// digest alone without holding it: after [`MISSES_TO_DISTRUST`] such
    /// answers, what it says it keeps is not believed for [`HELD_TTL`]
    /// (requests carry signatures there).
    pub fn distrust_held(&self, url: &Uri) {
        if let Some(advertiser) = self.advertiser(url) {
            let mut distrusted = self.distrusted.lock().expect("no panics under this lock");
            let now = Instant::now();
            let misses = distrusted.get(advertiser, now).copied().unwrap_or(0) + 1;
            distrusted.insert(kept_copy(advertiser), misses, now);
        }
    }

    /// Whether the upstream a request for `url` goes to said, within
    /// [`HELD_TTL`], that it keeps the body whose blake3 is `digest`, and
    /// has not since answered such a body without holding it.
    pub fn holds(&self, url: &Uri, digest: &[u8; 32]) -> bool {
        let Some(advertiser) = self.advertiser(url) else {
            return false;
        };
        if self
            .distrusted
            .lock()
            .expect("no panics under this lock")
            .get(advertiser, Instant::now())
            .is_some_and(|&misses| misses >= MISSES_TO_DISTRUST)
        {
            return false;
        }
        self.held_bases
            .lock()
            .expect("no panics under this lock")
            .get(&(advertiser.clone(), *digest), Instant::now())
            .is_some()
    }

    /// What the upstream a request for `url` goes to advertised last, if
    /// it is still believed.
    pub fn advertised(&self, url: &Uri) -> Option<Advertised> {
        let advertiser = self.advertiser(url)?;
        self.advertised
            .lock()
            .expect("no panics under this lock")
            .get(advertiser, Instant::now())
            .copied()
    }
}

/// `authority` in an allocation of its own, for a table that keeps it: one
/// parsed from a user agent's request is a slice of that connection's read
/// buffer, which it would keep alive for as long as the table keeps the
/// entry (the accelerator's basis store leaked that way with an ETag).
fn kept_copy(authority: &Authority) -> Authority {
    Authority::from_maybe_shared(bytes::Bytes::copy_from_slice(authority.as_str().as_bytes()))
        .unwrap_or_else(|_| authority.clone())
}

/// A connection of our own to the upstream, for a queue wait whose place
/// the upstream keeps by the connection. Closed when dropped (once a
/// response still streaming on it is done).
pub struct HeldConnection {
    sender: hyper::client::conn::http1::SendRequest<ProxyBody>,
    watch: FramingWatch,
}

impl HeldConnection {
    /// Sends `request` on this connection, in absolute-form when
    /// `forward`, else in origin-form, after the previous response's body
    /// was read to its end.
    ///
    /// # Errors
    /// The connection closed or failed, or the response was malformed.
    pub async fn send(
        &mut self,
        mut request: Request<ProxyBody>,
        forward: bool,
    ) -> Result<Response<Incoming>, hyper::Error> {
        if !forward && let Some(path) = request.uri().path_and_query().cloned() {
            *request.uri_mut() = Uri::from(path);
        }
        self.sender.ready().await?;
        let mut response = self.sender.send_request(request).await?;
        let check = self.watch.last_exchange();
        // As `Upstream::send`; the connection ends on its own (the guard
        // fails its next read).
        if !upstream_guard::serve_without_excess(&check, response.headers_mut()) {
            response.extensions_mut().insert(check);
        }
        Ok(response)
    }

    /// Whether the connection is gone (the upstream closed it).
    pub fn is_closed(&self) -> bool {
        self.sender.is_closed()
    }
}

/// Connects every request, whatever its URI, to the upstream (over TLS
/// when configured); a forward client's connections are marked proxied so
/// hyper writes absolute-form targets on HTTP/1.1.
#[derive(Clone)]
pub struct UpstreamConnector {
    /// `None`: the URI's own authority (a direct route).
    authority: Option<Authority>,
    dialer: Dialer,
    proxied: bool,
}

impl tower_service::Service<Uri> for UpstreamConnector {
    type Response = UpstreamStream;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<UpstreamStream>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, target: Uri) -> Self::Future {
        let this = self.clone();
        Box::pin(async move {
            let tls = this.dialer.tls.is_some();
            let authority = match this.authority.as_ref().or(target.authority()) {
                Some(authority) => authority.clone(),
                None => {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidInput,
                        format!("{target}: no host to connect to"),
                    ));
                }
            };
            let port = authority.port_u16().unwrap_or(if tls { 443 } else { 80 });
            let transport = this.dialer.dial(authority.host(), port, tls).await?;
            let h2 = transport.is_h2();
            let io = if h2 {
                FramedUpstream::unchecked(transport)
            } else {
                FramedUpstream::http1(transport)
            };
            Ok(UpstreamStream {
                io: TokioIo::new(io),
                proxied: this.proxied,
                h2,
                closer: Closer::default(),
            })
        })
    }
}

/// A connection to the upstream, as hyper sees it: its HTTP/1.1 responses
/// checked by [`FramedUpstream`].
pub struct UpstreamStream {
    io: TokioIo<FramedUpstream<Transport>>,
    proxied: bool,
    h2: bool,
    closer: Closer,
}

impl Connection for UpstreamStream {
    fn connected(&self) -> Connected {
        let connected = Connected::new()
            .proxy(self.proxied)
            .extra(self.closer.clone())
            .extra(self.io.inner().watch().clone());
        if self.h2 {
            connected.negotiated_h2()
        } else {
            connected
        }
    }
}

impl hyper::rt::Read for UpstreamStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: hyper::rt::ReadBufCursor<'_>,
    ) -> Poll<io::Result<()>> {
        if self.closer.is_closed() {
            // The end of the connection, as if the upstream had closed it.
            return Poll::Ready(Ok(()));
        }
        let polled = Pin::new(&mut self.io).poll_read(cx, buf);
        // The lock is taken only before the task sleeps.
        if polled.is_pending() && self.closer.register(cx.waker()) {
            return Poll::Ready(Ok(()));
        }
        polled
    }
}

impl hyper::rt::Write for UpstreamStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

impl ClientProxy {
    /// The request as it goes upstream.
    pub(super) fn outbound(
        &self,
        parts: &Parts,
        mut headers: HeaderMap,
        target: &Target,
        body: ProxyBody,
    ) -> Request<ProxyBody> {
        add_via(&mut headers, &self.config.via_name);
        // Who asked, for the origin: the user agent's own claims only from
        // a trusted hop (an accelerator trusting us believes what we send).
        let hop = forwarded::Hop {
            client: parts.extensions.get::<Peer>().map(|peer| peer.0.ip()),
            tls: parts.extensions.get::<TlsSession>().is_some(),
            host: target.url.authority().map(Authority::as_str),
        };
        forwarded::forward(&mut headers, hop, &self.config.trusted_forwarders);
        // Our credentials are for the proxies upstream, never an origin's.
        if let Some(credentials) = &self.config.upstream_credentials
            && !target.upstream.is_direct()
        {
            headers.insert(header::PROXY_AUTHORIZATION, credentials.clone());
        }
        let authority = target.url.authority().expect("targets are absolute");
        headers.insert(
            header::HOST,
            HeaderValue::from_str(authority.as_str()).expect("an authority is a valid header"),
        );
        // As the site's gateway we are its surrogate: `Surrogate-Control`
        // may target us by this token.
        if self.config.targeted_cache_control.applies(parts) {
            let (name, token) = SURROGATE_CAPABILITY;
            headers.append(name, HeaderValue::from_static(token));
        }
        let mut request = Request::new(body);
        *request.method_mut() = parts.method.clone();
        *request.uri_mut() = target.url.clone();
        if !target.forward
            && let Some((scheme, authority)) = target.upstream.fixed()
        {
            // Gateway requests go to the upstream itself.
            *request.uri_mut() = Uri::builder()
                .scheme(scheme.clone())
                .authority(authority.clone())
                .path_and_query(target.url.path_and_query().expect("absolute").clone())
                .build()
                .expect("scheme, authority and path are valid");
        }
        *request.headers_mut() = headers;
        // The upstream's 1xx heads (103 Early Hints) go on to the user
        // agent while it waits (RFC 9110 §15.2).
        forward_interim(&mut request, parts.extensions.get::<InterimSender>());
        request
    }

    /// Sends a request upstream once, on a pooled connection (the queue
    /// is [`Self::send`]'s), unless the upstream is marked down.
    pub(super) async fn send_once(
        &self,
        request: Request<ProxyBody>,
        target: &Target,
    ) -> Result<Response<Incoming>, ProxyError> {
        if let Some(health) = target.upstream.health()
            && let Admission::Refused { retry_in } = health.admit(Instant::now())
        {
            let last = health.view(Instant::now()).last_error.unwrap_or_default();
            return Err(ProxyError::upstream_down(
                format!(
                    "upstream {} is down ({last}); it is tried again in {} s",
                    health.name(),
                    retry_in.as_secs_f64().ceil()
                ),
                retry_in,
            )
            .unanswered());
        }
        self.checked(target, request, |request| {
            target.upstream.send(request, target.forward)
        })
        .await
    }

    /// The way after `target`'s for a request safe to repeat (the caller
    /// knows: a GET or HEAD without a body) that `refusal` ended before
    /// the upstream answered anything; `None` when it must stand.
    pub(super) fn fail_over(&self, target: &Target, refusal: &ProxyError) -> Option<Target> {
        if !refusal.is_unanswered() {
            return None;
        }
        let next = target.next()?;
        tracing::info!(
            url = %target.url,
            failed = target.upstream.name(&target.url),
            next = next.upstream.name(&next.url),
            reason = %refusal,
            "trying the route's next way"
        );
        Some(next)
    }

    /// The refusal for the user agent when `upstream` answered 407: the
    /// challenge is for us, not for the user agent (whose credentials never
    /// go upstream), so a gateway error saying which of ours to check.
    pub(super) fn challenged(&self, upstream: &str) -> ProxyError {
        ClientStats::add(&self.stats.upstream_errors, 1);
        let what = if self.config.upstream_credentials.is_some() {
            "refused our credentials (check --upstream-user and its password)"
        } else {
            "wants proxy credentials (give --upstream-user)"
        };
        ProxyError::bad_upstream_response(format!("upstream {upstream} {what}"))
    }

    /// The upstream's answer to `request`, sent by `send` (pooled or on a
    /// held connection), within the upstream timeout (from the last byte
    /// of the body the upstream took: an upload longer than the timeout is
    /// not the upstream's fault) and checked; `Err` is the refusal for the
    /// user agent. After a malformed head the connection must not be used
    /// again (`Upstream::send` sees to it for pooled ones).
    pub(super) async fn checked<E, F>(
        &self,
        target: &Target,
        request: Request<ProxyBody>,
        send: impl FnOnce(Request<ProxyBody>) -> F,
    ) -> Result<Response<Incoming>, ProxyError>
    where
        E: std::error::Error + 'static,
        F: Future<Output = Result<Response<Incoming>, E>>,
    {
        let (parts, body) = request.into_parts();
        let (body, patience) = upstream_wait::watch(body, self.config.upstream_timeout);
        let sent = send(Request::from_parts(parts, body));
        let upstream = target.upstream.name(&target.url);
        let health = target.upstream.health();
        let failed = |message: &str| {
            if let Some(health) = health {
                health.record_failure(message, Instant::now());
            }
        };
        let asked = Instant::now();
        let answered = match patience.answer(sent).await {
            Ok(Ok(response)) => {
                self.stats.upstream_latency.observe(asked.elapsed());
                if let Some(health) = health {
                    health.record_success(Instant::now());
                }
                Ok(Ok(response))
            }
            other => other,
        };
        match answered {
            // The upstream's challenge is for us, not for the user agent
            // (whose credentials never go upstream): a gateway error.
            Ok(Ok(response)) if response.status() == StatusCode::PROXY_AUTHENTICATION_REQUIRED => {
                Err(self.challenged(upstream))
            }
            Ok(Ok(mut response)) => {
                if let Err(message) = check_response_head(response.headers()) {
                    ClientStats::add(&self.stats.upstream_errors, 1);
                    return Err(ProxyError::bad_upstream_response(format!(
                        "upstream {}: {message}",
                        upstream
                    )));
                }
                // The reason phrase is the upstream's; ours comes from the
                // status (P-18).
                response
                    .extensions_mut()
                    .remove::<hyper::ext::ReasonPhrase>();
                Ok(response)
            }
            Ok(Err(e)) if let Some(violation) = malformed_request_body(&e) => {
                // The user agent's body broke its framing on the way up.
                Err(ProxyError::bad_request(violation.reason.to_string()))
            }
            // The user agent's body came too slowly; the upstream got a cut
            // request, not a whole one.
            Ok(Err(e)) if let Some(refusal) = slow_request_body(&e) => Err(refusal),
            Ok(Err(e)) => {
                if let Some(refused) = AddressRefused::in_chain(&e) {
                    // A direct route's destination the policy refused.
                    return Err(ProxyError::forbidden(refused.to_string()));
                }
                ClientStats::add(&self.stats.upstream_errors, 1);
                let refusal = ProxyError::upstream_unreachable(format!(
                    "upstream {} unreachable: {}",
                    upstream,
                    error_chain(&e)
                ));
                // Only a connection that could not be opened says the
                // upstream is gone, and that nothing was sent; a pooled
                // one closed under us may have carried the request.
                if is_connect_failure(&e) {
                    failed(refusal.message());
                    return Err(refusal.unanswered());
                }
                Err(refusal)
            }
            Err(_) => {
                ClientStats::add(&self.stats.upstream_errors, 1);
                let refusal = ProxyError::upstream_timeout(format!(
                    "upstream {} sent no response head within {:?} (of the last request byte it took)",
                    upstream, self.config.upstream_timeout
                ));
                failed(refusal.message());
                Err(refusal.unanswered())
            }
        }
    }
}

/// Whether `error` is a pooled client's failure to open a connection (not
/// one on a connection already open).
fn is_connect_failure(error: &(dyn std::error::Error + 'static)) -> bool {
    error
        .downcast_ref::<hyper_util::client::legacy::Error>()
        .is_some_and(hyper_util::client::legacy::Error::is_connect)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the tables keep of an authority shares nothing with the
    /// buffer it was parsed from.
    #[test]
    fn a_kept_authority_does_not_share_the_request_s_buffer() {
        let read_buffer =
            bytes::Bytes::from(b"example.org:8080 and the rest of a request head".repeat(1000));
        let parsed = Authority::from_maybe_shared(read_buffer.slice(..16)).unwrap();
        let kept = kept_copy(&parsed);
        drop(parsed);
        assert!(read_buffer.is_unique());
        assert_eq!(kept.as_str(), "example.org:8080");
    }

    #[test]
    fn hsync_accept_is_read_only_for_version_1_with_a_size() {
        let parse = |s: &str| Advertised::parse(&http::HeaderValue::from_str(s).unwrap());
        assert_eq!(
            parse("v=1, max-signature=24576"),
            Some(Advertised {
                max_signature: 24576,
                max_body_signature: 0,
            })
        );
        assert_eq!(
            parse("v=1, max-signature=4608, max-body-signature=4194304"),
            Some(Advertised {
                max_signature: 4608,
                max_body_signature: 4 << 20,
            })
        );
        assert_eq!(parse("v=2, max-signature=24576"), None);
        assert_eq!(parse("v=1"), None);
        assert_eq!(parse("v=1, max-signature=lots"), None);
        assert_eq!(parse("garbage"), None);
        assert_eq!(
            parse("v=1, codecs=2;3, max-signature=100, future"),
            Some(Advertised {
                max_signature: 100,
                max_body_signature: 0
            }),
            "unknown members are skipped"
        );
    }
}
