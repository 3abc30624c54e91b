//! The two I/O wrappers a connection's bytes pass on their way to hyper:
//! [`Guarded`] checks the request bytes against the HTTP/1.1 framing rules
//! ([`Framing`]) and stops hyper at the first violation, and fails a
//! request body that comes slower than the minimum upload rate
//! ([`MinUploadRate`]); [`Watched`] fails the connection once no byte has
//! moved either way for the idle timeout (stretched by the connection's
//! [`Hold`]). What to answer then is the serving code's choice: each
//! failure is an I/O error with a typed error inside ([`IdleTimeout`],
//! [`SlowUpload`](super::upload_rate::SlowUpload),
//! [`MalformedRequestBody`]) that a request body's reader can tell apart.
//! Over HTTP/2 only the idle watch is here: the streams' bodies are held
//! to the minimum upload rate one by one (`request_body.rs`).

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Sleep;

use crate::http::head_guard::{Framing, Part, Violation};

use super::refusal::{MalformedRequestBody, RefusedBody};
use super::upload_rate::{MinUploadRate, UploadWatch, nothing_excused};

/// A connection's current hold (seconds), shared by its service (which
/// reads [`HoldConnection`] off each response), its timer and its I/O.
pub(super) type Hold = Arc<AtomicU64>;

/// A connection that fails once no byte has moved either way for the idle
/// timeout while hyper waits on it.
pub(super) struct Watched<I> {
    pub(super) io: I,
    idle: Duration,
    hold: Hold,
    deadline: Pin<Box<Sleep>>,
    pub(super) idle_expired: bool,
}

impl<I> Watched<I> {
    pub(super) fn new(io: I, idle: Duration, hold: Hold) -> Self {
        Watched {
            io,
            idle,
            hold,
            deadline: Box::pin(tokio::time::sleep(idle)),
            idle_expired: false,
        }
    }

    fn moved(&mut self) {
        let hold = Duration::from_secs(self.hold.load(Ordering::Relaxed));
        self.deadline
            .as_mut()
            .reset(tokio::time::Instant::now() + self.idle + hold);
    }

    /// Called when the I/O is pending: fails once the deadline passed.
    fn check(&mut self, cx: &mut Context<'_>) -> Poll<io::Error> {
        if self.deadline.as_mut().poll(cx).is_ready() {
            self.idle_expired = true;
            return Poll::Ready(io::Error::new(
                io::ErrorKind::TimedOut,
                IdleTimeout { idle: self.idle },
            ));
        }
        Poll::Pending
    }
}

/// The error under the I/O error of a connection [`Watched`] failed: under
/// a request body's error, a client that stopped sending it.
#[derive(Debug, Clone, Copy, thiserror::Error)]
#[error("no byte moved either way for {idle:?}")]
pub(super) struct IdleTimeout {
    pub(super) idle: Duration,
}

impl<I: AsyncRead + Unpin> AsyncRead for Watched<I> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        match Pin::new(&mut this.io).poll_read(cx, buf) {
            Poll::Pending => this.check(cx).map(Err),
            ready => {
                this.moved();
                ready
            }
        }
    }
}

impl<I: AsyncWrite + Unpin> AsyncWrite for Watched<I> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        match Pin::new(&mut this.io).poll_write(cx, buf) {
            Poll::Pending => this.check(cx).map(Err),
            ready => {
                this.moved();
                ready
            }
        }
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        match Pin::new(&mut this.io).poll_write_vectored(cx, bufs) {
            Poll::Pending => this.check(cx).map(Err),
            ready => {
                this.moved();
                ready
            }
        }
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        match Pin::new(&mut this.io).poll_flush(cx) {
            Poll::Pending => this.check(cx).map(Err),
            ready => ready,
        }
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// A connection whose request bytes pass [`Framing`] before hyper reads
/// them. Once a request breaks its rules hyper gets no further byte: at a
/// refused head it waits (and the connection shuts down gracefully, so
/// requests in flight are still answered) or, when it already has part of
/// that head, or is reading a body whose chunking broke, it reads the end
/// of the stream.
pub(super) struct Guarded<I> {
    io: I,
    framing: Framing,
    /// Set when hyper waits at a refused head: the serving loop then shuts
    /// the connection down gracefully.
    refusing: Arc<AtomicBool>,
    stop: Option<Stop>,
    /// hyper asked for the refused head: nobody has answered it.
    owes_refusal: bool,
    /// Set at a refused body, for the service.
    refused_body: RefusedBody,
    /// The least rate of request bodies (`None`: off).
    min_upload_rate: Option<MinUploadRate>,
    /// The body waited for under it, if any: boxed, and only while a body
    /// is under way, so that a connection between requests holds no
    /// timer.
    waited: Option<Box<WaitedBody>>,
}

/// A request body waited for under the minimum upload rate.
struct WaitedBody {
    /// The message of the connection the body belongs to.
    message: u64,
    watch: UploadWatch,
}

#[derive(Clone, Copy)]
struct Stop {
    violation: Violation,
    /// hyper has none of the refused head (it begins at a message boundary
    /// of what went on), so an end of stream would look like the client
    /// leaving and cut the requests in flight.
    hold: bool,
}

impl<I> Guarded<I> {
    pub(super) fn new(
        io: I,
        refusing: Arc<AtomicBool>,
        refused_body: RefusedBody,
        min_upload_rate: Option<MinUploadRate>,
    ) -> Self {
        Guarded {
            io,
            framing: Framing::new(),
            refusing,
            stop: None,
            owes_refusal: false,
            refused_body,
            min_upload_rate,
            waited: None,
        }
    }

    /// A read found no byte: while a request body is under way, its wait
    /// is timed, and fails once the body is slower than the minimum rate.
    /// Between requests, in a head (hyper's header timeout) or in a
    /// tunnel, nothing is timed here.
    fn wait_for_body(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let (Some(rate), Some(received)) = (self.min_upload_rate, self.framing.body_received())
        else {
            return Poll::Pending;
        };
        let message = self.framing.message();
        let body = match &mut self.waited {
            Some(body) if body.message == message => body,
            // The first wait of this body (a pipelined one's is not the
            // one before's).
            waited => waited.insert(Box::new(WaitedBody {
                message,
                watch: UploadWatch::new(),
            })),
        };
        body.watch
            .poll_wait(cx, rate, received, nothing_excused)
            .map(|slow| Err(io::Error::new(io::ErrorKind::TimedOut, slow)))
    }

    /// A read found bytes (or the end): the body's wait, if one was under
    /// way, is over; and once no body is under way, its clock goes.
    fn body_arrived(&mut self) {
        let Some(body) = &mut self.waited else {
            return;
        };
        body.watch.arrived(nothing_excused);
        if self.framing.body_received().is_none() {
            self.waited = None;
        }
    }

    /// Whether nothing of a next request has come (see
    /// [`Framing::is_between_messages`]).
    pub(super) fn is_between_messages(&self) -> bool {
        self.framing.is_between_messages()
    }

    /// The violation of a request that got no answer: a `400` is owed.
    pub(super) fn refusal(&self) -> Option<Violation> {
        self.stop.filter(|_| self.owes_refusal).map(|s| s.violation)
    }

    /// [`Guarded::refusal`], taken: whoever takes it writes the `400`, and
    /// the connection may shut down after it.
    pub(super) fn take_refusal(&mut self) -> Option<Violation> {
        let refusal = self.refusal();
        self.owes_refusal = false;
        refusal
    }

    /// What hyper reads once a request broke the rules.
    fn stopped(&mut self, stop: Stop) -> Poll<io::Result<()>> {
        let in_head = matches!(stop.violation.part, Part::Head { .. });
        self.owes_refusal |= in_head;
        if stop.hold {
            self.refusing.store(true, Ordering::Relaxed);
            Poll::Pending
        } else if in_head {
            Poll::Ready(Ok(()))
        } else {
            // The body's reader learns why it failed (a 400, not a 502).
            Poll::Ready(Err(io::Error::new(
                io::ErrorKind::InvalidData,
                MalformedRequestBody(stop.violation),
            )))
        }
    }
}

impl<I: AsyncRead + Unpin> AsyncRead for Guarded<I> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if let Some(stop) = this.stop {
            return this.stopped(stop);
        }
        if let Some(slow) = this.waited.as_ref().and_then(|body| body.watch.failed()) {
            return Poll::Ready(Err(io::Error::new(io::ErrorKind::TimedOut, slow)));
        }
        let before = buf.filled().len();
        let chunk_start = this.framing.checked();
        let read = match Pin::new(&mut this.io).poll_read(cx, buf) {
            Poll::Pending => return this.wait_for_body(cx),
            Poll::Ready(read) => read,
        };
        read?;
        let checked = this.framing.check(&buf.filled()[before..]);
        this.body_arrived();
        let Some(violation) = checked.violation else {
            return Poll::Ready(Ok(()));
        };
        buf.set_filled(before + checked.safe);
        let stop = Stop {
            violation,
            hold: matches!(violation.part, Part::Head { start } if start >= chunk_start),
        };
        this.stop = Some(stop);
        if violation.part == Part::Body {
            let _ = this.refused_body.set(violation);
        }
        if checked.safe > 0 {
            // hyper reads what went on first; it asks again once it has
            // used it.
            return Poll::Ready(Ok(()));
        }
        this.stopped(stop)
    }
}

impl<I: AsyncWrite + Unpin> AsyncWrite for Guarded<I> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
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

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.owes_refusal {
            // hyper shuts down when it is done; the serving code still
            // owes the refused head its 400, and shuts down after it.
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}
