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
//! The connection's window, which all its streams share, is subtler: hyper
//! gives it the size of one stream's (1 MiB), so a stream whose role
//! stopped reading a large upload can hold it shut for the others, whose
//! clients then cannot send. hyper does not show that window, so the
//! streams of a connection keep a [`SharedWindow`]: while any of them may
//! be holding data the role has not read, the others' waits are excused.
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
//! Main types: [`RequestBody`], [`SharedWindow`].

use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use hyper::body::{Body, Frame, Incoming, SizeHint};
use tokio::time::Instant;

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
    /// Over HTTP/2, unless the rate is off or the body ended with its
    /// head: the stream's waiting. Boxed, so that a body that has none
    /// costs a pointer.
    stream: Option<Box<StreamWatch>>,
}

/// An HTTP/2 stream's body under the minimum upload rate.
#[derive(Debug)]
struct StreamWatch {
    rate: MinUploadRate,
    /// Data bytes that came so far.
    received: u64,
    watch: UploadWatch,
    /// The connection's window, and whether this stream may be holding it
    /// (its body is open and the role is not waiting on it).
    window: Arc<SharedWindow>,
    holding: bool,
}

impl StreamWatch {
    fn hold(&mut self, hold: bool) {
        if self.holding != hold {
            self.holding = hold;
            self.window.held(hold, Instant::now());
        }
    }
}

impl Drop for StreamWatch {
    fn drop(&mut self) {
        self.hold(false);
    }
}

impl RequestBody {
    /// `inner`, passed on as it comes (HTTP/1.1: the connection's I/O
    /// holds the body to the rate).
    pub(super) fn new(inner: Incoming) -> RequestBody {
        RequestBody {
            inner,
            stream: None,
        }
    }

    /// `inner`, an HTTP/2 stream's body on the connection whose window is
    /// `window`, held to `rate` (`None`: off).
    pub(super) fn of_stream(
        inner: Incoming,
        rate: Option<MinUploadRate>,
        window: &Arc<SharedWindow>,
    ) -> RequestBody {
        let stream = rate.filter(|_| !inner.is_end_stream()).map(|rate| {
            let mut stream = StreamWatch {
                rate,
                received: 0,
                watch: UploadWatch::new(),
                window: window.clone(),
                holding: false,
            };
            // What the client sends before the role first asks for it
            // waits in the window.
            stream.hold(true);
            Box::new(stream)
        });
        RequestBody { inner, stream }
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
        let Some(stream) = &mut this.stream else {
            return Pin::new(&mut this.inner)
                .poll_frame(cx)
                .map_err(BodyError::from);
        };
        if let Some(slow) = stream.watch.failed() {
            return Poll::Ready(Some(Err(timed_out(slow))));
        }
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Pending => {
                // The role asks and nothing came: this stream holds no
                // data, and its wait is the client's, unless another
                // stream holds the connection's window.
                stream.hold(false);
                let waited = stream
                    .watch
                    .poll_wait(cx, stream.rate, stream.received, |now| {
                        stream.window.excused(now)
                    });
                waited.map(|slow| Some(Err(timed_out(slow))))
            }
            Poll::Ready(polled) => {
                stream.watch.arrived(|now| stream.window.excused(now));
                if let Some(Ok(frame)) = &polled {
                    let len = frame.data_ref().map_or(0, |data| data.len() as u64);
                    stream.received = stream.received.saturating_add(len);
                }
                // Until the role asks again, what comes waits in the
                // window.
                let open = matches!(polled, Some(Ok(_))) && !this.inner.is_end_stream();
                stream.hold(open);
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

/// One HTTP/2 connection's receive window as far as its streams' bodies
/// can tell: which of them may be holding it, and the clock of the time
/// any did, which excuses the others' waits.
///
/// A stream holds data in the window from the moment it comes until the
/// role reads it, so the stream may be holding it while its body is open
/// and the role is not waiting on it (it has not asked yet, or is busy
/// with what it got). hyper does not show how much each holds, so any
/// such stream excuses the others' waits: the rule may be looser than it
/// could be (while the role is the slow one, which the client pays for in
/// full-speed bytes or with an upstream of its own choosing that is slow
/// to read), never stricter.
#[derive(Debug, Default)]
pub(super) struct SharedWindow(Mutex<Holding>);

#[derive(Debug, Default)]
struct Holding {
    /// Streams that may be holding the window.
    streams: usize,
    /// The time any did, up to `since`.
    excused: Duration,
    /// Since when some stream has been, while any is.
    since: Option<Instant>,
}

impl SharedWindow {
    /// A stream begins (`hold`) or stops holding the window at `now`.
    fn held(&self, hold: bool, now: Instant) {
        let mut holding = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if hold {
            holding.streams += 1;
            holding.since.get_or_insert(now);
        } else {
            holding.streams = holding.streams.saturating_sub(1);
            if holding.streams == 0
                && let Some(since) = holding.since.take()
            {
                holding.excused += now.saturating_duration_since(since);
            }
        }
    }

    /// The time any stream held the window, up to `now`.
    fn excused(&self, now: Instant) -> Duration {
        let holding = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        holding.excused
            + holding
                .since
                .map_or(Duration::ZERO, |since| now.saturating_duration_since(since))
    }
}
