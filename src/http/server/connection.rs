//! Serving one connection: the service every request passes (the early
//! refusals, then the role), HTTP/1.1 over the guarded and watched I/O with
//! its raw last answers (400, 408), and TLS with HTTP/2 or HTTP/1.1 as ALPN
//! chose. Per-connection code takes any `AsyncRead + AsyncWrite`, so TCP
//! and inetd's stdin/stdout share it. Accepting connections is
//! `accept.rs`.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use http::{HeaderValue, Method, Version, header};
use hyper::body::Incoming;
use hyper::server::conn::http1::UpgradeableConnection;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::OwnedSemaphorePermit;
use tokio_rustls::TlsAcceptor;

use crate::http::error::ProxyError;
use crate::http::headers::strip_unkeyed;
use crate::http::tls::TlsSession;

use super::body::ProxyBody;
use super::handler::{ConnectionNumber, Handler, HoldConnection, KeepConnection, Peer};
use super::interim::{self, Interim, SharedBoard};
use super::io::{Guarded, Hold, Watched};
use super::limits::{ConnectionLimits, Draining};
use super::refusal::{RefusedBody, bad_request_body, refuse_early};
use super::request_body::{RequestBody, SharedWindow};
use super::upload_rate::MinUploadRate;

/// hyper's timer, with the connection's hold added to every deadline it
/// sets (hyper uses it only for the header timeout on HTTP/1.1).
#[derive(Clone)]
struct HeldTimer {
    hold: Hold,
}

impl HeldTimer {
    fn extra(&self) -> Duration {
        Duration::from_secs(self.hold.load(Ordering::Relaxed))
    }
}

impl hyper::rt::Timer for HeldTimer {
    fn sleep(&self, duration: Duration) -> Pin<Box<dyn hyper::rt::Sleep>> {
        TokioTimer::new().sleep(duration + self.extra())
    }

    fn sleep_until(&self, deadline: std::time::Instant) -> Pin<Box<dyn hyper::rt::Sleep>> {
        TokioTimer::new().sleep_until(deadline + self.extra())
    }

    fn reset(&self, sleep: &mut Pin<Box<dyn hyper::rt::Sleep>>, new_deadline: std::time::Instant) {
        TokioTimer::new().reset(sleep, new_deadline + self.extra());
    }

    fn now(&self) -> std::time::Instant {
        TokioTimer::new().now()
    }
}

/// What every request of a connection carries in its extensions.
#[derive(Clone)]
struct Arrival {
    number: ConnectionNumber,
    peer: Option<SocketAddr>,
    tls: Option<TlsSession>,
    keep: KeepConnection,
}

impl Arrival {
    /// A new connection's, numbered, and the receiver that tells when every
    /// [`KeepConnection`] of it is gone.
    fn new(
        peer: Option<SocketAddr>,
        tls: Option<TlsSession>,
    ) -> (Arrival, tokio::sync::oneshot::Receiver<()>) {
        let (keep, kept) = tokio::sync::oneshot::channel();
        let arrival = Arrival {
            number: ConnectionNumber::next(),
            peer,
            tls,
            keep: KeepConnection::new(keep),
        };
        (arrival, kept)
    }

    fn mark<B>(&self, request: &mut Request<B>) {
        let extensions = request.extensions_mut();
        extensions.insert(self.number);
        if let Some(peer) = self.peer {
            extensions.insert(Peer(peer));
        }
        if let Some(tls) = &self.tls {
            extensions.insert(tls.clone());
        }
        extensions.insert(self.keep.clone());
    }
}

/// The service every connection runs: the early checks, then the role.
/// Boxed futures, so that an HTTP/1.1 connection is Unpin and can hand its
/// socket back after a header timeout, for the 408.
#[allow(clippy::type_complexity)]
fn service<H: Handler>(
    handler: Arc<H>,
    hold: Hold,
    refused_body: RefusedBody,
    arrival: Arrival,
    limits: ConnectionLimits,
    interim: Option<SharedBoard>,
    window: Option<Arc<SharedWindow>>,
) -> impl hyper::service::Service<
    Request<Incoming>,
    Response = Response<ProxyBody>,
    Error = Infallible,
    Future = ResponseFuture,
> + Clone {
    let requests = Arc::new(AtomicU64::new(0));
    let upload_rate = MinUploadRate::of(&limits);
    service_fn(move |request: Request<Incoming>| {
        let handler = handler.clone();
        // Over HTTP/1.1 the connection's I/O holds bodies to the minimum
        // upload rate; over HTTP/2 each stream's body does (see
        // `request_body.rs`).
        let mut request = match &window {
            Some(window) => request.map(|body| RequestBody::of_stream(body, upload_rate, window)),
            None => request.map(RequestBody::new),
        };
        // hyper hands requests over in the order the guard saw them.
        let index = requests.fetch_add(1, Ordering::Relaxed);
        arrival.mark(&mut request);
        if let Some(board) = &interim {
            interim::awaiting(board, index, &mut request);
        }
        strip_unkeyed(request.headers_mut());
        // A refused CONNECT over HTTP/1.x closes its connection: what
        // follows its head is a tunnel's bytes, which the guard let
        // through unchecked and hyper must not read as a next request.
        let closes_unless_tunnel =
            request.method() == Method::CONNECT && request.version() <= Version::HTTP_11;
        let refused = refused_body
            .get()
            .filter(|v| v.message == index)
            .map(|&violation| bad_request_body(violation))
            .or_else(|| refuse_early(&request, &limits));
        let hold = hold.clone();
        let interim = interim.clone();
        Box::pin(async move {
            let response = match refused {
                Some(response) => response,
                None => handler.handle(request).await,
            };
            if let Some(board) = &interim {
                interim::answered(board, index);
            }
            let mut response = response;
            if closes_unless_tunnel && !response.status().is_success() {
                response
                    .headers_mut()
                    .insert(header::CONNECTION, HeaderValue::from_static("close"));
            }
            let held = response.extensions().get::<HoldConnection>();
            hold.store(held.map_or(0, |h| h.0.as_secs()), Ordering::Relaxed);
            Ok::<_, Infallible>(response)
        }) as Pin<Box<dyn Future<Output = _> + Send>>
    })
}

/// Serves one HTTP/1.1 connection from `peer` until the peer is done.
pub async fn serve_connection<H, I>(
    io: I,
    peer: Option<SocketAddr>,
    handler: Arc<H>,
    limits: ConnectionLimits,
) where
    H: Handler,
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    serve_connection_until(io, peer, handler, limits, Draining::default(), None).await;
}

/// [`serve_connection`], finishing what is under way and closing once
/// `draining` starts, and holding `slot` (its place under
/// `max-connections`) until it is done.
pub(super) fn serve_connection_until<H, I>(
    io: I,
    peer: Option<SocketAddr>,
    handler: Arc<H>,
    limits: ConnectionLimits,
    draining: Draining,
    slot: Option<OwnedSemaphorePermit>,
) -> impl Future<Output = ()> + Send + 'static
where
    H: Handler,
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (arrival, kept) = Arrival::new(peer, None);
    serve_http1_role(io, handler, arrival, kept, limits, draining, slot)
}

/// Serves `io` as HTTP/1.1 for `handler` until the peer is done, then
/// tells the handler the connection closed.
///
/// An idle keep-alive connection costs mostly this future (its task) and
/// hyper's buffers, so the future is kept small (L-5). The connection is
/// built here, before the future: an async fn would keep its by-value
/// arguments for its whole life, beside what it built from them. And the
/// end (a raw 400 or 408, the shutdown, a tunnel's wait) is boxed, so that
/// its state is not reserved while the connection waits.
fn serve_http1_role<H, I>(
    io: I,
    handler: Arc<H>,
    arrival: Arrival,
    kept: tokio::sync::oneshot::Receiver<()>,
    limits: ConnectionLimits,
    draining: Draining,
    slot: Option<OwnedSemaphorePermit>,
) -> impl Future<Output = ()> + Send + 'static
where
    H: Handler,
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let number = arrival.number;
    let mut http1 = http1(io, handler.clone(), arrival, limits);
    async move {
        let result = http1.run(draining).await;
        Box::pin(http1.finish(result, kept)).await;
        handler.connection_closed(number);
        drop(slot);
    }
}

/// What every response of the service comes as.
type ResponseFuture = Pin<Box<dyn Future<Output = Result<Response<ProxyBody>, Infallible>> + Send>>;

/// One HTTP/1.1 connection under hyper, and what its serving loop shares
/// with its service and its I/O.
struct Http1<I, S>
where
    S: hyper::service::HttpService<Incoming>,
{
    connection: UpgradeableConnection<TokioIo<Interim<Watched<Guarded<I>>>>, S>,
    /// The I/O under hyper, for the 1xx heads queued while hyper waits for
    /// a final head.
    interim: Interim<Watched<Guarded<I>>>,
    /// Set when hyper waits at a refused head.
    refusing: Arc<AtomicBool>,
}

/// `io` under hyper, with the service every request of it passes, and
/// what the service shares with the connection (the hold, the refused
/// body, the 1xx board).
fn http1<H, I>(
    io: I,
    handler: Arc<H>,
    arrival: Arrival,
    limits: ConnectionLimits,
) -> Http1<
    I,
    impl hyper::service::Service<
        Request<Incoming>,
        Response = Response<ProxyBody>,
        Error = Infallible,
        Future = ResponseFuture,
    > + Unpin
    + Send
    + 'static,
>
where
    H: Handler,
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let hold = Hold::default();
    let refused_body = RefusedBody::default();
    let board = SharedBoard::default();
    let service = service(
        handler,
        hold.clone(),
        refused_body.clone(),
        arrival,
        limits,
        Some(board.clone()),
        None,
    );
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(HeldTimer { hold: hold.clone() })
        .header_read_timeout(limits.header_read_timeout)
        .max_header_size(limits.max_head_bytes)
        .max_buf_size(limits.max_head_bytes.max(8192));
    if limits.max_headers != 100 {
        // hyper's default; any other value costs a heap allocation per
        // request.
        builder.max_headers(limits.max_headers);
    }
    let refusing = Arc::new(AtomicBool::new(false));
    let io = Interim::new(
        Watched::new(
            Guarded::new(
                io,
                refusing.clone(),
                refused_body,
                MinUploadRate::of(&limits),
            ),
            limits.idle_timeout,
            hold,
        ),
        board,
    );
    let interim = io.clone();
    // With upgrades: a CONNECT answered 2xx hands the connection to the
    // role's tunnel (`hyper::upgrade::on`).
    let connection = builder
        .serve_connection(TokioIo::new(io), service)
        .with_upgrades();
    Http1 {
        connection,
        interim,
        refusing,
    }
}

impl<I, S> Http1<I, S>
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    S: hyper::service::Service<
            Request<Incoming>,
            Response = Response<ProxyBody>,
            Error = Infallible,
            Future = ResponseFuture,
        > + Unpin,
{
    /// Lets hyper serve the connection until it is done.
    async fn run(&mut self, draining: Draining) -> hyper::Result<()> {
        let mut shutting_down = false;
        let mut drain = std::pin::pin!(draining.started());
        std::future::poll_fn(|cx| {
            loop {
                let polled = Pin::new(&mut self.connection).poll(cx);
                if polled.is_pending() {
                    // A 1xx queued while hyper waits for the final head.
                    self.interim.write_queued(cx);
                }
                if polled.is_pending()
                    && !shutting_down
                    // hyper waits at a refused head, or the server is
                    // stopping: let it finish the requests in flight, then
                    // stop (an idle connection closes at once).
                    && (self.refusing.load(Ordering::Relaxed) || drain.as_mut().poll(cx).is_ready())
                {
                    shutting_down = true;
                    Pin::new(&mut self.connection).graceful_shutdown();
                    continue;
                }
                return polled;
            }
        })
        .await
    }

    /// The end, once hyper is done with the connection: a tunnel's wait,
    /// or the raw answer hyper could not give (the 400 of a refused head,
    /// the 408 of a head that did not come whole in time) and the shutdown.
    async fn finish(self, result: hyper::Result<()>, kept: tokio::sync::oneshot::Receiver<()>) {
        let Some(parts) = self.connection.into_parts() else {
            // Upgraded: the connection is the tunnel's now. It keeps its
            // place under `max-connections` until the tunnel lets go of the
            // request's `KeepConnection` (every other copy went with the
            // service).
            let _ = kept.await;
            return;
        };
        let Some(mut io) = parts.io.into_inner().into_inner() else {
            return;
        };
        match result {
            _ if let Some(violation) = io.io.take_refusal() => {
                // hyper gave up on the connection: the answer goes out raw.
                let refusal = ProxyError::malformed_request(violation);
                refusal.log();
                let _ =
                    tokio::time::timeout(Duration::from_secs(1), io.write_all(&refusal.to_http1()))
                        .await;
            }
            Ok(()) => {}
            // hyper's header timer also runs while a kept-alive connection
            // waits for its next request: one that never started is just
            // idle, and closing it is the end of keep-alive, not an error. A
            // 408 there would reach a client that sent nothing, which reads
            // it as an unsolicited (malformed) response (P-25); only a head
            // that has begun gets one.
            Err(error) if error.is_timeout() && !io.idle_expired && io.io.is_between_messages() => {
                tracing::debug!("idle connection: closed without a word");
            }
            Err(error) if error.is_timeout() && !io.idle_expired => {
                tracing::debug!("no whole request head in time: 408");
                let answer = ProxyError::request_timeout().to_http1();
                let _ = tokio::time::timeout(Duration::from_secs(1), io.write_all(&answer)).await;
            }
            Err(error) => tracing::debug!(%error, "connection ended with an error"),
        }
        let _ = tokio::time::timeout(Duration::from_secs(1), io.shutdown()).await;
    }
}

/// Serves one TLS connection: the handshake within the header timeout,
/// then HTTP/2 or HTTP/1.1 as ALPN chose.
pub(super) async fn serve_tls_connection<H: Handler>(
    stream: TcpStream,
    peer: SocketAddr,
    handler: Arc<H>,
    limits: ConnectionLimits,
    acceptor: TlsAcceptor,
    draining: Draining,
    slot: OwnedSemaphorePermit,
) {
    let Ok(local) = stream.local_addr() else {
        return;
    };
    let tls = match tokio::time::timeout(limits.header_read_timeout, acceptor.accept(stream)).await
    {
        Ok(Ok(tls)) => tls,
        Ok(Err(error)) => {
            tracing::info!(%error, "TLS handshake failed");
            return;
        }
        Err(_) => {
            tracing::info!("no TLS handshake within the header timeout");
            return;
        }
    };
    let (_, session) = tls.get_ref();
    let h2 = session.alpn_protocol() == Some(b"h2");
    let info = TlsSession {
        server_name: session.server_name().map(str::to_owned),
        local,
    };
    let (arrival, kept) = Arrival::new(Some(peer), Some(info));
    let number = arrival.number;
    if !h2 {
        serve_http1_role(tls, handler, arrival, kept, limits, draining, Some(slot)).await;
        return;
    }
    let hold = Hold::default();
    // Over HTTP/2 nothing sets it: the guard is HTTP/1.1's, and so are
    // 1xx heads. The streams' bodies share the connection's window.
    let service = service(
        handler.clone(),
        hold.clone(),
        RefusedBody::default(),
        arrival,
        limits,
        None,
        Some(Arc::default()),
    );
    let builder = {
        let mut builder = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
        builder
            .timer(TokioTimer::new())
            .max_concurrent_streams(limits.max_streams)
            .max_header_list_size(u32::try_from(limits.max_head_bytes).unwrap_or(u32::MAX));
        builder
    };
    let mut connection = std::pin::pin!(builder.serve_connection(
        TokioIo::new(Watched::new(tls, limits.idle_timeout, hold)),
        service,
    ));
    let result = tokio::select! {
        result = connection.as_mut() => result,
        () = draining.started() => {
            // GOAWAY: streams under way finish, no new ones.
            connection.as_mut().graceful_shutdown();
            connection.await
        }
    };
    if let Err(error) = result {
        tracing::debug!(%error, "HTTP/2 connection ended with an error");
    }
    handler.connection_closed(number);
    drop(slot);
}
