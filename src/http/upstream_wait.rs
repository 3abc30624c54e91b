//! How long an upstream (the origin, or the client proxy's upstream) may
//! keep a request waiting for its answer's head. The timeout counts from
//! the last byte of the request body the upstream took, not from the
//! request's start: an upload longer than the timeout (a large POST over a
//! slow link) is then not cut with a 504 that blames the upstream, while
//! an upstream that takes no byte of the body and sends no head for that
//! long still is. The client's own slowness is the minimum upload rate's
//! business (`server::upload_rate`).
//!
//! Main items: [`watch`], [`Patience::answer`].

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use hyper::body::{Body, Frame, SizeHint};
use tokio::time::Instant;

use crate::http::server::{BodyError, ProxyBody};

/// When the upstream last made progress on a request: took a piece of its
/// body, or took its end.
#[derive(Debug)]
pub struct Patience {
    timeout: Duration,
    since: Instant,
    /// Nanoseconds from `since` to the last progress; `None` for a request
    /// with no body to take, whose patience is never renewed.
    last: Option<Arc<AtomicU64>>,
}

/// The upstream waited too long: no byte of the body taken and no head
/// sent for the timeout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Impatient;

/// `body` (a request's, on its way upstream) watched, and the patience
/// the answer is waited for with: `timeout` from now, renewed by each piece
/// of the body the upstream takes, and by its end.
///
/// A body that has ended already (most GETs) is passed on as it is: there
/// is nothing to take, so the patience is a plain timeout, and the hot
/// path pays no boxed wrapper and no clock read for it.
pub fn watch(body: ProxyBody, timeout: Duration) -> (ProxyBody, Patience) {
    let since = Instant::now();
    if body.is_end_stream() {
        let patience = Patience {
            timeout,
            since,
            last: None,
        };
        return (body, patience);
    }
    let last = Arc::new(AtomicU64::new(0));
    let patience = Patience {
        timeout,
        since,
        last: Some(last.clone()),
    };
    let body = Watched {
        inner: body,
        since,
        last,
    };
    (ProxyBody::new(body), patience)
}

impl Patience {
    /// Waits for `answer` (the upstream's head), or fails once the
    /// upstream has made no progress for the timeout.
    ///
    /// # Errors
    /// [`Impatient`], and `answer` is dropped.
    pub async fn answer<F: Future>(&self, answer: F) -> Result<F::Output, Impatient> {
        tokio::pin!(answer);
        loop {
            let deadline = self.last_progress() + self.timeout;
            tokio::select! {
                answered = &mut answer => return Ok(answered),
                () = tokio::time::sleep_until(deadline) => {
                    if self.last_progress() + self.timeout <= Instant::now() {
                        return Err(Impatient);
                    }
                }
            }
        }
    }

    fn last_progress(&self) -> Instant {
        let nanos = self
            .last
            .as_ref()
            .map_or(0, |last| last.load(Ordering::Relaxed));
        self.since + Duration::from_nanos(nanos)
    }
}

/// A request body that notes when the upstream takes a piece of it.
struct Watched {
    inner: ProxyBody,
    since: Instant,
    last: Arc<AtomicU64>,
}

impl Body for Watched {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        if polled.is_ready() {
            let nanos = u64::try_from(self.since.elapsed().as_nanos()).unwrap_or(u64::MAX);
            self.last.store(nanos, Ordering::Relaxed);
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use http_body_util::{BodyExt, StreamBody};

    use super::*;
    use crate::http::server::ReceiverStream;

    type Sent = Result<Frame<Bytes>, BodyError>;

    fn body_fed_by_channel() -> (tokio::sync::mpsc::Sender<Sent>, ProxyBody) {
        let (sender, receiver) = tokio::sync::mpsc::channel(1);
        (
            sender,
            ProxyBody::new(StreamBody::new(ReceiverStream(receiver))),
        )
    }

    fn piece() -> Sent {
        Ok(Frame::data(Bytes::from_static(b"piece")))
    }

    /// An answer that never comes, for a request whose body the upstream
    /// reads as it comes: each piece taken renews the patience, and the
    /// timeout runs from the last one.
    #[tokio::test(start_paused = true)]
    async fn each_piece_taken_renews_the_patience() {
        let (sender, body) = body_fed_by_channel();
        let (mut body, patience) = watch(body, Duration::from_secs(10));
        let started = Instant::now();
        let upstream = tokio::spawn(async move {
            while let Some(Ok(_)) = body.frame().await {}
            std::future::pending::<()>().await
        });
        let client = tokio::spawn(async move {
            for _ in 0..3 {
                tokio::time::sleep(Duration::from_secs(8)).await;
                sender.send(piece()).await.unwrap();
            }
            // The body's end, at 24 s.
        });
        let waited = patience.answer(std::future::pending::<()>()).await;
        assert_eq!(waited, Err(Impatient));
        assert_eq!(
            started.elapsed(),
            Duration::from_secs(34),
            "10 s after the end"
        );
        client.await.unwrap();
        upstream.abort();
    }

    /// An upstream that takes nothing of the body and sends no head fails
    /// after the timeout, as before.
    #[tokio::test(start_paused = true)]
    async fn an_upstream_that_takes_nothing_fails_at_the_timeout() {
        let (sender, body) = body_fed_by_channel();
        let (_body, patience) = watch(body, Duration::from_secs(10));
        sender.send(piece()).await.unwrap();
        let started = Instant::now();
        let waited = patience.answer(std::future::pending::<()>()).await;
        assert_eq!(waited, Err(Impatient));
        assert_eq!(started.elapsed(), Duration::from_secs(10));
    }

    /// A request with no body (a GET) is not wrapped, and its patience is
    /// the plain timeout.
    #[tokio::test(start_paused = true)]
    async fn a_body_that_has_ended_is_passed_on_unwatched() {
        let empty = ProxyBody::new(http_body_util::Empty::new().map_err(|never| match never {}));
        let (body, patience) = watch(empty, Duration::from_secs(10));
        assert!(body.is_end_stream());
        assert!(patience.last.is_none(), "no progress to note, no wrapper");
        let started = Instant::now();
        let waited = patience.answer(std::future::pending::<()>()).await;
        assert_eq!(waited, Err(Impatient));
        assert_eq!(started.elapsed(), Duration::from_secs(10));
    }

    #[tokio::test(start_paused = true)]
    async fn an_answer_in_time_is_returned() {
        let (_sender, body) = body_fed_by_channel();
        let (_body, patience) = watch(body, Duration::from_secs(10));
        let answer = async {
            tokio::time::sleep(Duration::from_secs(9)).await;
            "head"
        };
        assert_eq!(patience.answer(answer).await, Ok("head"));
    }
}
