//! Our HTTP/1.1 connections upstream (the client proxy's to its upstream,
//! the accelerator's to its origin), with every byte read checked by
//! [`ResponseFraming`] before hyper parses it (P-5, P-6, P-17 on the
//! response side). Over TLS it wraps the plaintext.
//!
//! A violation fails the read that carried it, and every later one, with
//! an `InvalidData` I/O error holding [`MalformedResponse`]: none of that
//! read's bytes reach hyper, which fails the response (a 502) or its body
//! (a malformed transfer: nothing stored) and never reuses the connection.
//!
//! One violation leaves the response before it whole: bytes after its end
//! (a body longer than its `Content-Length`, P-17). RFC 9112 §6.3 lets a
//! client discard them, and §9.3 forbids only taking them for a response:
//! the response's own bytes in that read go on, the excess never does, and
//! the next read fails. Its answer is then served as declared but never
//! stored ([`ExchangeCheck::has_excess`], [`refuse_storing`]), and its
//! connection never reused.
//!
//! hyper stops reading a response at its end, so bytes after a body's
//! `Content-Length` may come in a later read than its last bytes, when the
//! body already looks whole. [`FramingWatch`] (in the connection's
//! `Connected` extras) tells whoever commits a body whether its connection
//! saw such bytes by then: [`ExchangeCheck::violation`].

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};

use bytes::Bytes;
use http::Uri;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use hyper::body::Frame;
use hyper_util::client::legacy::connect::{
    CaptureConnection, Connected, Connection, HttpConnector,
};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tower_service::Service;

use crate::http::head_guard::{Reason, ResponseFraming, Violation};
use crate::http::server::{BodyError, ProxyBody};

/// The error under the I/O error of a read that broke the response
/// framing rules.
#[derive(Debug, Clone, Copy, thiserror::Error)]
#[error("malformed upstream response: {} (byte {})", .0.reason, .0.at)]
pub struct MalformedResponse(pub Violation);

/// What one connection's guard found, shared with those who commit the
/// bodies read on it.
#[derive(Debug, Clone, Default)]
pub struct FramingWatch(Arc<WatchState>);

#[derive(Debug, Default)]
struct WatchState {
    requests_sent: AtomicU64,
    violation: OnceLock<Violation>,
}

impl FramingWatch {
    /// The check for the response just received on this connection: the
    /// one to the last request written (hyper writes no request before the
    /// previous response ended).
    pub fn last_exchange(&self) -> ExchangeCheck {
        ExchangeCheck {
            watch: self.clone(),
            exchange: self
                .0
                .requests_sent
                .load(Ordering::Acquire)
                .saturating_sub(1),
        }
    }
}

/// Whether one response's connection saw it break the framing rules.
#[derive(Debug, Clone)]
pub struct ExchangeCheck {
    watch: FramingWatch,
    /// Index of the request on its connection.
    exchange: u64,
}

impl ExchangeCheck {
    /// The violation in this response (bytes after its end included) read
    /// so far; later responses' violations are theirs.
    pub fn violation(&self) -> Option<Violation> {
        self.watch
            .0
            .violation
            .get()
            .copied()
            .filter(|v| v.message == self.exchange)
    }

    /// Whether this response's one fault so far is bytes after its end:
    /// it arrived whole, as its framing declared (the first violation is
    /// the only one: the guard stops at it). It may be served, never
    /// stored, and its connection is not reused (P-17).
    pub fn has_excess(&self) -> bool {
        self.violation()
            .is_some_and(|v| v.reason == Reason::Unsolicited)
    }

    /// The error a body reader reports for [`Self::violation`].
    pub fn error(violation: Violation) -> io::Error {
        io::Error::new(io::ErrorKind::InvalidData, MalformedResponse(violation))
    }
}

/// An upstream connection whose response bytes pass [`ResponseFraming`]
/// (or, for HTTP/2, pass unchecked: its framing is binary and hyper's).
pub struct FramedUpstream<T> {
    io: T,
    framing: Option<ResponseFraming>,
    watch: FramingWatch,
}

impl<T> FramedUpstream<T> {
    /// Checks HTTP/1.1 responses on `io`.
    pub fn http1(io: T) -> Self {
        FramedUpstream {
            io,
            framing: Some(ResponseFraming::new()),
            watch: FramingWatch::default(),
        }
    }

    /// Passes `io` through unchecked (HTTP/2).
    pub fn unchecked(io: T) -> Self {
        FramedUpstream {
            io,
            framing: None,
            watch: FramingWatch::default(),
        }
    }

    /// The connection's watch, for its `Connected` extras.
    pub fn watch(&self) -> &FramingWatch {
        &self.watch
    }

    /// The connection underneath.
    pub fn get_ref(&self) -> &T {
        &self.io
    }

    fn sent(&mut self, bytes: &[u8]) {
        if let Some(framing) = &mut self.framing {
            framing.sent(bytes);
            self.watch
                .0
                .requests_sent
                .store(framing.requests_sent(), Ordering::Release);
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for FramedUpstream<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        let Some(framing) = &mut this.framing else {
            return Pin::new(&mut this.io).poll_read(cx, buf);
        };
        if let Some(&violation) = this.watch.0.violation.get() {
            return Poll::Ready(Err(ExchangeCheck::error(violation)));
        }
        let before = buf.filled().len();
        std::task::ready!(Pin::new(&mut this.io).poll_read(cx, buf))?;
        let checked = framing.received(&buf.filled()[before..]);
        let Some(violation) = checked.violation else {
            return Poll::Ready(Ok(()));
        };
        let _ = this.watch.0.violation.set(violation);
        tracing::info!(reason = %violation.reason, at = violation.at, "malformed upstream response");
        if violation.reason == Reason::Unsolicited && checked.safe > 0 {
            // The response ended in this read: its bytes go on (the next
            // read fails), the excess never does.
            buf.set_filled(before + checked.safe);
            return Poll::Ready(Ok(()));
        }
        // None of this read goes on: it would only be more of a response
        // that is not used.
        buf.set_filled(before);
        Poll::Ready(Err(ExchangeCheck::error(violation)))
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for FramedUpstream<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let written = std::task::ready!(Pin::new(&mut self.io).poll_write(cx, buf))?;
        self.sent(&buf[..written]);
        Poll::Ready(Ok(written))
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let written = std::task::ready!(Pin::new(&mut self.io).poll_write_vectored(cx, bufs))?;
        let mut left = written;
        for buf in bufs {
            if left == 0 {
                break;
            }
            let take = left.min(buf.len());
            self.sent(&buf[..take]);
            left -= take;
        }
        Poll::Ready(Ok(written))
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

impl<T: Connection> Connection for FramedUpstream<T> {
    fn connected(&self) -> Connected {
        self.io.connected().extra(self.watch.clone())
    }
}

/// hyper-util's plain HTTP connector, its connections checked by
/// [`FramedUpstream`] (the accelerator's way to its origin).
#[derive(Clone)]
pub struct FramedHttpConnector(pub HttpConnector);

impl Service<Uri> for FramedHttpConnector {
    type Response = TokioIo<FramedUpstream<TcpStream>>;
    type Error = Box<dyn std::error::Error + Send + Sync>;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Service::poll_ready(&mut self.0, cx).map_err(Into::into)
    }

    fn call(&mut self, target: Uri) -> Self::Future {
        let connecting = Service::call(&mut self.0, target);
        Box::pin(async move {
            let stream = connecting.await?.into_inner();
            Ok(TokioIo::new(FramedUpstream::http1(stream)))
        })
    }
}

/// For a response whose one fault so far is bytes past its end
/// ([`ExchangeCheck::has_excess`]): logs it and makes the answer
/// unstorable ([`refuse_storing`]). Returns whether it was one; its
/// connection must then not be reused (the guard fails its next read, and
/// a pooled one is best taken out of its pool at once).
pub fn serve_without_excess(check: &ExchangeCheck, headers: &mut HeaderMap) -> bool {
    let Some(violation) = check.violation().filter(|_| check.has_excess()) else {
        return false;
    };
    tracing::warn!(
        excess_at = violation.at,
        "upstream response longer than its framing: served as declared, not stored, connection not reused"
    );
    refuse_storing(headers);
    true
}

/// Makes an answer whose upstream response had bytes past its end
/// ([`ExchangeCheck::has_excess`]) unstorable by any cache after us:
/// `Cache-Control: no-store` replaces the response's own caching fields
/// (`CDN-Cache-Control` and `Surrogate-Control` included, which a cache
/// that is the site's CDN would read instead). Whether the declared
/// length was right cannot be known; the user agent who asked gets it
/// (RFC 9112 §6.3), nobody after her.
pub fn refuse_storing(headers: &mut HeaderMap) {
    for name in [
        header::CACHE_CONTROL,
        header::EXPIRES,
        header::PRAGMA,
        HeaderName::from_static("cdn-cache-control"),
        HeaderName::from_static("surrogate-control"),
    ] {
        headers.remove(name);
    }
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
}

/// The framing check of the response just received on a captured
/// connection, when it is one of ours over HTTP/1.1.
pub fn last_exchange(connection: &CaptureConnection) -> Option<ExchangeCheck> {
    let connected = connection.connection_metadata();
    let mut extras = http::Extensions::new();
    connected.as_ref()?.get_extras(&mut extras);
    extras
        .get::<FramingWatch>()
        .map(FramingWatch::last_exchange)
}

/// `body`, whose clean end becomes an error when its connection saw the
/// response break the framing rules by then (bytes past a
/// `Content-Length`, in a read after the head's).
/// The frame that completes a known length waits for that check: hyper
/// ends such a body with its last byte, and so does whoever was told the
/// length, so an error after it would go unseen (and a cache after us
/// would keep the body).
pub fn checked_at_end(body: ProxyBody, check: ExchangeCheck) -> ProxyBody {
    ProxyBody::new(CheckedAtEnd {
        inner: body,
        check: Some(check),
        last: None,
        after_last: None,
    })
}

struct CheckedAtEnd {
    inner: ProxyBody,
    /// Taken at the end.
    check: Option<ExchangeCheck>,
    /// The frame that completed the body's known length, until the check.
    last: Option<Frame<Bytes>>,
    /// What came after it anyway (nothing should), after it.
    after_last: Option<Result<Frame<Bytes>, BodyError>>,
}

impl hyper::body::Body for CheckedAtEnd {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        loop {
            if let Some(after) = self.after_last.take() {
                return Poll::Ready(Some(after));
            }
            if self.check.is_none() {
                // Checked: the held frame, then the end.
                return Poll::Ready(self.last.take().map(Ok));
            }
            let polled = std::task::ready!(Pin::new(&mut self.inner).poll_frame(cx));
            match polled {
                Some(Ok(frame))
                    if self.last.is_none()
                        && frame.is_data()
                        && self.inner.size_hint().exact() == Some(0) =>
                {
                    self.last = Some(frame);
                }
                Some(polled) => match self.last.take() {
                    Some(last) => {
                        self.after_last = Some(polled);
                        return Poll::Ready(Some(Ok(last)));
                    }
                    None => return Poll::Ready(Some(polled)),
                },
                None => {
                    if let Some(violation) = self.check.take().and_then(|check| check.violation()) {
                        self.last = None;
                        return Poll::Ready(Some(Err(ExchangeCheck::error(violation).into())));
                    }
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        // hyper must poll past the last frame, for the check.
        self.check.is_none()
            && self.last.is_none()
            && self.after_last.is_none()
            && self.inner.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;
    use crate::http::head_guard::Reason;

    const GET: &[u8] = b"GET / HTTP/1.1\r\nHost: a\r\n\r\n";

    #[tokio::test]
    async fn bytes_past_a_body_in_a_later_read_fail_that_exchange_only() {
        let (ours, mut upstream) = tokio::io::duplex(1024);
        let mut connection = FramedUpstream::http1(ours);
        let watch = connection.watch().clone();
        let mut buf = [0u8; 256];

        connection.write_all(GET).await.unwrap();
        upstream
            .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello")
            .await
            .unwrap();
        let first = watch.last_exchange();
        let n = connection.read(&mut buf).await.unwrap();
        assert!(buf[..n].ends_with(b"hello"));
        assert_eq!(first.violation(), None, "whole so far");

        // The next request's response is fine; its check is its own.
        connection.write_all(GET).await.unwrap();
        let second = watch.last_exchange();
        upstream
            .write_all(b"HTTP/1.1 204 No Content\r\n\r\n")
            .await
            .unwrap();
        let n = connection.read(&mut buf).await.unwrap();
        assert!(buf[..n].starts_with(b"HTTP/1.1 204"));
        upstream.write_all(b"smuggled").await.unwrap();
        let error = connection.read(&mut buf).await.unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::InvalidData);
        let violation = second.violation().expect("seen before the commit");
        assert_eq!(violation.reason, Reason::Unsolicited);
        assert_eq!(first.violation(), None, "not the first response's fault");
        // Sticky: the connection is of no further use.
        assert!(connection.read(&mut buf).await.is_err());
    }

    #[tokio::test]
    async fn p17_a_response_before_bytes_past_its_end_goes_on_whole_the_excess_never() {
        let (ours, mut upstream) = tokio::io::duplex(1024);
        let mut connection = FramedUpstream::http1(ours);
        let watch = connection.watch().clone();
        let mut buf = [0u8; 256];
        connection.write_all(GET).await.unwrap();
        let response = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello";
        upstream
            .write_all(&[&response[..], b"HTTP/1.1 200 OK\r\n\r\nsmuggled"].concat())
            .await
            .unwrap();
        let check = watch.last_exchange();
        let n = connection.read(&mut buf).await.unwrap();
        assert_eq!(
            &buf[..n],
            response,
            "the response, whole, and nothing after"
        );
        assert!(check.has_excess());
        let error = connection.read(&mut buf).await.unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::InvalidData);

        // Any other violation lets nothing of its read through.
        let (ours, mut upstream) = tokio::io::duplex(1024);
        let mut connection = FramedUpstream::http1(ours);
        let watch = connection.watch().clone();
        connection.write_all(GET).await.unwrap();
        upstream
            .write_all(b"HTTP/1.1 200 OK\r\nX: a\r\n b\r\nContent-Length: 5\r\n\r\nhello")
            .await
            .unwrap();
        assert!(connection.read(&mut buf).await.is_err());
        let check = watch.last_exchange();
        assert!(check.violation().is_some() && !check.has_excess());
    }

    /// A check of an exchange whose response is `response` (as the
    /// upstream wrote it), once it was read.
    async fn check_of(response: &[u8]) -> ExchangeCheck {
        let (ours, mut upstream) = tokio::io::duplex(1024);
        let mut connection = FramedUpstream::http1(ours);
        connection.write_all(GET).await.unwrap();
        upstream.write_all(response).await.unwrap();
        let _ = connection.read(&mut [0u8; 256]).await;
        connection.watch().last_exchange()
    }

    #[tokio::test]
    async fn p17_the_frame_that_completes_a_length_waits_for_the_check() {
        use http_body_util::{BodyExt, Full};
        let body = || {
            Full::new(Bytes::from_static(b"hello"))
                .map_err(|never| match never {})
                .boxed()
        };
        let clean = check_of(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello").await;
        let mut checked = checked_at_end(body(), clean);
        let frame = checked.frame().await.unwrap().unwrap();
        assert_eq!(frame.into_data().unwrap(), "hello");
        assert!(checked.frame().await.is_none());
        assert!(hyper::body::Body::is_end_stream(&checked));

        let long = check_of(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhelloHTTP/1.1").await;
        let mut checked = checked_at_end(body(), long);
        let first = checked.frame().await.unwrap();
        assert!(first.is_err(), "the last bytes never go before the check");
    }

    #[test]
    fn p17_an_answer_with_excess_is_no_store_whatever_the_origin_said() {
        let mut headers = HeaderMap::new();
        for (name, value) in [
            ("cache-control", "public, max-age=600"),
            ("cache-control", "must-understand"),
            ("cdn-cache-control", "max-age=600"),
            ("surrogate-control", "max-age=600"),
            ("expires", "Tue, 01 Jan 2030 00:00:00 GMT"),
            ("etag", "\"a\""),
        ] {
            headers.append(name, HeaderValue::from_static(value));
        }
        refuse_storing(&mut headers);
        let mut left: Vec<_> = headers
            .iter()
            .map(|(n, v)| (n.as_str(), v.to_str().unwrap()))
            .collect();
        left.sort_unstable();
        assert_eq!(left, [("cache-control", "no-store"), ("etag", "\"a\"")]);
    }
}
