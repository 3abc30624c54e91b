//! The body types both roles answer with ([`ProxyBody`], [`BodyError`]) and
//! small wrappers: [`counted`] tells a log line how a passed-through body
//! ended, [`with_length`] gives a streamed body of known length its size,
//! and `ReceiverStream` turns a task's channel into a body.
//! Nothing here knows about connections or requests.

use bytes::Bytes;
use http_body_util::combinators::BoxBody;

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
        announced: hyper::body::Body::size_hint(&body).exact(),
        inner: body,
        bytes: 0,
        on_end: Some(on_end),
    })
}

/// `body`, which is `len` bytes long, saying so: its size hint is exact
/// and it ends with its last byte. A stream fed by a task knows neither, so
/// the server would wait for the task's end to finish the response, and a
/// reader that left after the last byte would look cut ([`counted`]).
pub fn with_length(body: ProxyBody, len: u64) -> ProxyBody {
    BoxBody::new(WithLength {
        inner: body,
        remaining: len,
    })
}

struct WithLength {
    inner: ProxyBody,
    remaining: u64,
}

impl hyper::body::Body for WithLength {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Bytes>, BodyError>>> {
        if self.remaining == 0 {
            return std::task::Poll::Ready(None);
        }
        let polled = std::pin::Pin::new(&mut self.inner).poll_frame(cx);
        match &polled {
            std::task::Poll::Ready(Some(Ok(frame))) => {
                let len = frame.data_ref().map_or(0, |data| data.len() as u64);
                if len > self.remaining {
                    self.remaining = 0;
                    return std::task::Poll::Ready(Some(Err(
                        "the body is longer than its length".into()
                    )));
                }
                self.remaining -= len;
            }
            std::task::Poll::Ready(None) => {
                return std::task::Poll::Ready(Some(
                    Err("the body ended before its length".into()),
                ));
            }
            _ => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.remaining == 0
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        hyper::body::SizeHint::with_exact(self.remaining)
    }
}

/// A `Stream` over an mpsc receiver: a body fed by a task (wrap it in
/// `http_body_util::StreamBody`).
pub(crate) struct ReceiverStream<T>(pub(crate) tokio::sync::mpsc::Receiver<T>);

impl<T> futures_core::Stream for ReceiverStream<T> {
    type Item = T;

    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<T>> {
        self.0.poll_recv(cx)
    }
}

struct Counted<F: FnOnce(u64, bool)> {
    inner: ProxyBody,
    /// The length the body announced when it was wrapped: what is left
    /// of it shrinks as it is read.
    announced: Option<u64>,
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
        // Whole if it ended, or if every byte its length announced went
        // (a 304's or a HEAD's empty body is never polled at all).
        let clean =
            hyper::body::Body::is_end_stream(&self.inner) || self.announced == Some(self.bytes);
        self.end(clean);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use http_body_util::{BodyExt, Empty, Full};

    use super::*;

    /// The bytes and the cleanness `counted` reported, once it did.
    type Ending = Arc<Mutex<Option<(u64, bool)>>>;

    fn ended(body: ProxyBody) -> (ProxyBody, Ending) {
        let seen = Arc::new(Mutex::new(None));
        let record = seen.clone();
        let body = counted(body, move |bytes, clean| {
            *record.lock().unwrap() = Some((bytes, clean));
        });
        (body, seen)
    }

    /// A body of known length 0 that only says it ended once polled, as
    /// an upstream 304's body with its framing check still pending.
    struct EmptyButUnsure;

    impl hyper::body::Body for EmptyButUnsure {
        type Data = Bytes;
        type Error = BodyError;

        fn poll_frame(
            self: std::pin::Pin<&mut Self>,
            _cx: &mut std::task::Context<'_>,
        ) -> std::task::Poll<Option<Result<hyper::body::Frame<Bytes>, BodyError>>> {
            std::task::Poll::Ready(None)
        }

        fn is_end_stream(&self) -> bool {
            false
        }

        fn size_hint(&self) -> hyper::body::SizeHint {
            hyper::body::SizeHint::with_exact(0)
        }
    }

    #[test]
    fn an_empty_body_never_polled_counts_as_whole() {
        let (body, seen) = ended(Empty::new().map_err(|never| match never {}).boxed());
        drop(body);
        assert_eq!(*seen.lock().unwrap(), Some((0, true)));
        // A 304's: hyper never polls it, and its end was not seen.
        let (body, seen) = ended(BoxBody::new(EmptyButUnsure));
        drop(body);
        assert_eq!(*seen.lock().unwrap(), Some((0, true)));
    }

    #[test]
    fn a_body_dropped_before_its_bytes_went_is_not_whole() {
        let full = Full::new(Bytes::from_static(b"0123456789"));
        let (body, seen) = ended(full.map_err(|never| match never {}).boxed());
        drop(body);
        assert_eq!(*seen.lock().unwrap(), Some((0, false)));
    }

    #[tokio::test]
    async fn a_body_of_known_length_ends_with_its_last_byte() {
        let (tx, rx) =
            tokio::sync::mpsc::channel::<Result<hyper::body::Frame<Bytes>, BodyError>>(4);
        tx.send(Ok(hyper::body::Frame::data(Bytes::from_static(b"abc"))))
            .await
            .unwrap();
        tx.send(Ok(hyper::body::Frame::data(Bytes::from_static(b"de"))))
            .await
            .unwrap();
        // The task that feeds it has not ended (`tx` lives on).
        let body = with_length(
            http_body_util::StreamBody::new(ReceiverStream(rx)).boxed(),
            5,
        );
        assert_eq!(hyper::body::Body::size_hint(&body).exact(), Some(5));
        let (body, ending) = ended(body);
        let collected = body.collect().await.unwrap().to_bytes();
        assert_eq!(&collected[..], b"abcde");
        assert_eq!(*ending.lock().unwrap(), Some((5, true)));
        drop(tx);

        // One that ends short is an error, not a clean end.
        let short = with_length(
            Full::new(Bytes::from_static(b"ab"))
                .map_err(|never| match never {})
                .boxed(),
            5,
        );
        assert!(short.collect().await.is_err());
    }
}
