//! The accept loop and per-connection HTTP/1.1 serving both roles share.
//! Per-connection code takes any `AsyncRead + AsyncWrite` (a TCP stream, or
//! inetd's stdin/stdout: [`crate::inetd`]), and a role is a [`Handler`].
//!
//! Leaves out TLS, HTTP/2 and connection caps (issue 4).

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tracing::Instrument;

/// The error type of response bodies: whatever stopped the stream.
pub type BodyError = Box<dyn std::error::Error + Send + Sync>;
/// The body type both roles answer with.
pub type ProxyBody = BoxBody<Bytes, BodyError>;

/// Wraps a body so that `on_end` learns how many data bytes went through
/// and whether the body ended cleanly (false when it failed, or was dropped
/// before its end because the peer left). For log lines and counters of
/// bodies that pass through untouched.
pub fn counted<F>(body: ProxyBody, on_end: F) -> ProxyBody
where
    F: FnOnce(u64, bool) + Send + Sync + Unpin + 'static,
{
    BoxBody::new(Counted {
        inner: body,
        bytes: 0,
        on_end: Some(on_end),
    })
}

struct Counted<F: FnOnce(u64, bool)> {
    inner: ProxyBody,
    bytes: u64,
    on_end: Option<F>,
}

impl<F: FnOnce(u64, bool)> Counted<F> {
    fn end(&mut self, clean: bool) {
        if let Some(on_end) = self.on_end.take() {
            on_end(self.bytes, clean);
        }
    }
}

impl<F: FnOnce(u64, bool) + Unpin> hyper::body::Body for Counted<F> {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Bytes>, BodyError>>> {
        let this = &mut *self;
        let polled = std::pin::Pin::new(&mut this.inner).poll_frame(cx);
        match &polled {
            std::task::Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    this.bytes += data.len() as u64;
                }
                if this.inner.is_end_stream() {
                    this.end(true);
                }
            }
            std::task::Poll::Ready(None) => this.end(true),
            std::task::Poll::Ready(Some(Err(_))) => this.end(false),
            std::task::Poll::Pending => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.inner.size_hint()
    }
}

impl<F: FnOnce(u64, bool)> Drop for Counted<F> {
    fn drop(&mut self) {
        let clean = hyper::body::Body::is_end_stream(&self.inner);
        self.end(clean);
    }
}

/// A role: turns a request into a response. Errors become responses inside
/// the handler; an error in the body stream aborts the connection so a
/// client never mistakes a cut body for a whole one.
pub trait Handler: Send + Sync + 'static {
    /// Answers one request.
    fn handle(
        self: Arc<Self>,
        request: Request<Incoming>,
    ) -> impl Future<Output = Response<ProxyBody>> + Send;
}

/// Limits of the HTTP/1.1 connection layer.
#[derive(Debug, Clone, Copy)]
pub struct ConnectionLimits {
    /// Time a client has to send a whole request head (408 after it).
    pub header_read_timeout: Duration,
    /// Largest request head buffered (bytes).
    pub max_head_bytes: usize,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        ConnectionLimits {
            header_read_timeout: Duration::from_secs(10),
            max_head_bytes: 64 << 10,
        }
    }
}

/// The address of the peer a request came from, in its extensions (absent
/// on inetd pipes). Failed logins are counted per peer address.
#[derive(Debug, Clone, Copy)]
pub struct Peer(pub SocketAddr);

/// Serves one connection from `peer` until the peer is done.
pub async fn serve_connection<H, I>(
    io: I,
    peer: Option<SocketAddr>,
    handler: Arc<H>,
    limits: ConnectionLimits,
) where
    H: Handler,
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let service = service_fn(move |mut request: Request<Incoming>| {
        let handler = handler.clone();
        if let Some(peer) = peer {
            request.extensions_mut().insert(Peer(peer));
        }
        async move { Ok::<_, Infallible>(handler.handle(request).await) }
    });
    let result = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .max_buf_size(limits.max_head_bytes.max(8192))
        .serve_connection(TokioIo::new(io), service)
        .await;
    if let Err(error) = result {
        tracing::debug!(%error, "connection ended with an error");
    }
}

/// Accepts connections on `listener` until `shutdown` resolves, serving
/// each on its own task.
pub async fn serve<H: Handler>(
    listener: TcpListener,
    handler: Arc<H>,
    limits: ConnectionLimits,
    shutdown: impl Future<Output = ()>,
) {
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            () = &mut shutdown => return,
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    let _ = stream.set_nodelay(true);
                    let handler = handler.clone();
                    tokio::spawn(
                        serve_connection(stream, Some(peer), handler, limits)
                            .instrument(tracing::info_span!("conn", %peer)),
                    );
                }
                Err(error) => {
                    // EMFILE and friends: back off rather than spin.
                    tracing::warn!(%error, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    }
}
