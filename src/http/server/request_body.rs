//! The request body a role reads ([`RequestBody`]): hyper's, and over
//! HTTP/2 under the minimum upload rate (RELIABILITY L-8) stream by
//! stream.
//!
//! Over HTTP/1.1 the rate is the connection's I/O's (`io.rs`), where the
//! framing is parsed and one body at a time comes; this wrapper then only
//! passes hyper's body on. Over HTTP/2 the connection's bytes interleave
//! many streams, so each stream's body keeps its own [`UploadWatch`]: the
//! same rule (the header-read timeout as a grace, then a second per `rate`
//! bytes come so far), and as over HTTP/1.1 only the waits count, from a
//! poll of the body that found no data to the poll that found some.
//!
//! So flow control does not count against a client when the role is the
//! slow one. A stream whose role does not read its body (an origin that
//! takes it slowly, a queue) is not polled, and its wait is not timed; its
//! unread data holds its window shut, and hyper opens it again as the role
//! reads, so what the client sent meanwhile is there at the next poll.
//! Left out: the connection's window, which all its streams share. hyper
//! gives it the size of one stream's (1 MiB), so a stream whose role
//! stopped reading a large upload can hold it shut for the others, whose
//! waits then count although their clients could not send. Telling that
//! apart needs h2's window state, which hyper does not show.
//!
//! What differs from HTTP/1.1 is the end. A body too slow fails the role's
//! read with [`SlowUpload`] under an I/O error, as over HTTP/1.1, and the
//! role answers `408` on that stream (or, when its head went out already,
//! the stream is reset), and the upstream request is cut; but the
//! connection goes on. Over HTTP/1.1 the connection must close, since the
//! rest of the body would still come on it and hyper could not tell it
//! from a next request. An HTTP/2 stream ends by itself (hyper resets it
//! once the answer is out and the body is dropped), and the connection's
//! other streams, which may be other users' requests that a client proxy
//! multiplexes, did nothing wrong.
//!
//! Main type: [`RequestBody`].

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use hyper::body::{Body, Frame, Incoming, SizeHint};

use super::body::BodyError;
use super::upload_rate::{MinUploadRate, SlowUpload, UploadWatch};

/// A request body as the server hands it to a role.
///
/// Its errors are hyper's, boxed, or over HTTP/2 an I/O error (timed out)
/// with `SlowUpload` inside, which
/// [`slow_request_body`](super::slow_request_body) tells apart. Unlike
/// over HTTP/1.1, that failure ends only its stream: the connection, and
/// its other streams, which did nothing wrong, go on.
#[derive(Debug)]
pub struct RequestBody {
    inner: Incoming,
    /// The rate this body is held to here: over HTTP/2, unless it is off
    /// or the body ended with its head.
    rate: Option<MinUploadRate>,
    /// Data bytes that came so far.
    received: u64,
    /// The body's waiting, from its first wait on: boxed, so that a body
    /// never waited for holds no timer.
    watch: Option<Box<UploadWatch>>,
}

impl RequestBody {
    /// `inner`, passed on as it comes (HTTP/1.1: the connection's I/O
    /// holds the body to the rate).
    pub(super) fn new(inner: Incoming) -> RequestBody {
        RequestBody {
            inner,
            rate: None,
            received: 0,
            watch: None,
        }
    }

    /// `inner`, an HTTP/2 stream's body, held to `rate` (`None`: off).
    pub(super) fn of_stream(inner: Incoming, rate: Option<MinUploadRate>) -> RequestBody {
        let rate = rate.filter(|_| !inner.is_end_stream());
        RequestBody {
            rate,
            ..RequestBody::new(inner)
        }
    }
}

impl Body for RequestBody {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        let this = self.get_mut();
        let Some(rate) = this.rate else {
            return Pin::new(&mut this.inner)
                .poll_frame(cx)
                .map_err(BodyError::from);
        };
        if let Some(slow) = this.watch.as_ref().and_then(|watch| watch.failed()) {
            return Poll::Ready(Some(Err(timed_out(slow))));
        }
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Pending => this
                .watch
                .get_or_insert_with(|| Box::new(UploadWatch::new()))
                .poll_wait(cx, rate, this.received)
                .map(|slow| Some(Err(timed_out(slow)))),
            Poll::Ready(polled) => {
                if let Some(watch) = &mut this.watch {
                    watch.arrived();
                }
                if let Some(Ok(frame)) = &polled {
                    let len = frame.data_ref().map_or(0, |data| data.len() as u64);
                    this.received = this.received.saturating_add(len);
                }
                Poll::Ready(polled.map(|frame| frame.map_err(BodyError::from)))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// The error a read of a body too slow fails with: as over HTTP/1.1, where
/// it comes from the connection's I/O.
fn timed_out(slow: SlowUpload) -> BodyError {
    Box::new(io::Error::new(io::ErrorKind::TimedOut, slow))
}
