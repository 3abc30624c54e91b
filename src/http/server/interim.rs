//! Interim (1xx) responses on an HTTP/1.1 connection. A proxy MUST forward
//! the 1xx heads an upstream sends before its final answer (RFC 9110
//! §15.2): 103 Early Hints lets a browser fetch a page's style sheets while
//! the origin still builds the page. hyper's client hands them to a
//! callback ([`forward_interim`]); its server writes only its own
//! `100 Continue`, so a connection's bytes pass [`Interim`], which puts a
//! whole 1xx head on the wire between hyper's writes, and each request
//! carries an [`InterimSender`] for it in its extensions.
//!
//! The rule is order: a 1xx goes out only while its request still waits
//! for its final head and everything hyper wrote before went out whole, so
//! it can never land inside another response. Otherwise it is dropped,
//! which the user agent cannot tell from an upstream that sent none. An
//! HTTP/1.0 request gets none (RFC 9110 §15.2), nor does HTTP/2 (hyper's
//! server has no way to send one).
//!
//! Bounded: at most [`MAX_HEADS`] heads of [`MAX_HEAD_BYTES`] per request.

use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex, Weak};
use std::task::{Context, Poll, Waker};

use http::{HeaderMap, Request, StatusCode, Version};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::http::headers::strip_hop_by_hop;

/// 1xx heads forwarded for one request at most; an upstream sending more
/// wants something else than hints.
pub const MAX_HEADS: usize = 8;

/// The largest 1xx head forwarded (bytes); a larger one is dropped.
pub const MAX_HEAD_BYTES: usize = 16 << 10;

/// What a connection's requests and its writer share about 1xx heads.
#[derive(Default)]
pub(super) struct Board {
    /// The request (its index on the connection) still waiting for its
    /// final head: the only one a 1xx may go to.
    awaiting: Option<u64>,
    /// Heads taken for it.
    heads: usize,
    /// Whole 1xx heads not yet written: they go before anything hyper
    /// writes next.
    queued: Vec<u8>,
    /// hyper wrote since its last complete flush: a response of an earlier
    /// request may be half out.
    unflushed: bool,
    /// The connection's task, woken when a head is queued.
    waker: Option<Waker>,
}

/// A connection's [`Board`], shared by its service, its I/O and the task
/// that serves it.
pub(super) type SharedBoard = Arc<Mutex<Board>>;

fn lock(board: &Mutex<Board>) -> std::sync::MutexGuard<'_, Board> {
    board
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Marks request `index` as waiting for its final head, and gives it a
/// sender when the client may get 1xx heads (HTTP/1.1).
pub(super) fn awaiting<B>(board: &SharedBoard, index: u64, request: &mut Request<B>) {
    if request.version() != Version::HTTP_11 {
        return;
    }
    let mut state = lock(board);
    state.awaiting = Some(index);
    state.heads = 0;
    drop(state);
    request.extensions_mut().insert(InterimSender {
        board: Arc::downgrade(board),
        request: index,
    });
}

/// Request `index` has its final head: no 1xx may follow.
pub(super) fn answered(board: &SharedBoard, index: u64) {
    let mut state = lock(board);
    if state.awaiting == Some(index) {
        state.awaiting = None;
    }
}

/// In a request's extensions (HTTP/1.1 only): sends a 1xx head to the
/// client ahead of the request's final response.
#[derive(Clone)]
pub struct InterimSender {
    board: Weak<Mutex<Board>>,
    request: u64,
}

impl std::fmt::Debug for InterimSender {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InterimSender")
            .field("request", &self.request)
            .finish_non_exhaustive()
    }
}

impl InterimSender {
    /// Queues a `status` head with `headers` (their hop-by-hop fields
    /// dropped) for the client. `false` when it cannot go in order (the
    /// final head was given, the previous response is not out yet, the
    /// connection is gone) or is not one to forward (100 is hyper's own
    /// and 101 a switch of protocols; past the bounds).
    pub fn send(&self, status: StatusCode, headers: &HeaderMap) -> bool {
        let Some(head) = encode(status, headers) else {
            return false;
        };
        let Some(board) = self.board.upgrade() else {
            return false;
        };
        let mut state = lock(&board);
        if state.awaiting != Some(self.request) || state.unflushed || state.heads >= MAX_HEADS {
            return false;
        }
        state.heads += 1;
        state.queued.extend_from_slice(&head);
        if let Some(waker) = state.waker.take() {
            waker.wake();
        }
        true
    }
}

/// A 1xx head as HTTP/1.1 writes it, or `None` for one not forwarded.
fn encode(status: StatusCode, headers: &HeaderMap) -> Option<Vec<u8>> {
    let code = status.as_u16();
    if !(102..200).contains(&code) {
        return None;
    }
    let mut headers = headers.clone();
    strip_hop_by_hop(&mut headers).ok()?;
    let reason = status.canonical_reason().unwrap_or("Informational");
    let mut head = format!("HTTP/1.1 {code} {reason}\r\n").into_bytes();
    for (name, value) in &headers {
        head.extend_from_slice(name.as_str().as_bytes());
        head.extend_from_slice(b": ");
        head.extend_from_slice(value.as_bytes());
        head.extend_from_slice(b"\r\n");
    }
    head.extend_from_slice(b"\r\n");
    (head.len() <= MAX_HEAD_BYTES).then_some(head)
}

/// Asks hyper's client to pass the 1xx heads the upstream sends for
/// `upstream` on to the client of the request `sender` came with.
pub fn forward_interim<B>(upstream: &mut Request<B>, sender: Option<&InterimSender>) {
    let Some(sender) = sender.cloned() else {
        return;
    };
    hyper::ext::on_informational(upstream, move |interim| {
        let status = interim.status();
        if !sender.send(status, interim.headers()) {
            tracing::debug!(%status, "an upstream 1xx was not forwarded: it could not go in order");
        }
    });
}

/// A connection's I/O under hyper, with the 1xx heads of its [`Board`]
/// written before hyper's next bytes. The I/O is shared with
/// [`Interim::write_queued`], which the connection's task calls while
/// hyper waits for a final head and writes nothing.
pub(super) struct Interim<I> {
    io: Arc<Mutex<Option<I>>>,
    board: SharedBoard,
}

impl<I> Clone for Interim<I> {
    fn clone(&self) -> Self {
        Interim {
            io: self.io.clone(),
            board: self.board.clone(),
        }
    }
}

impl<I: AsyncWrite + Unpin> Interim<I> {
    pub(super) fn new(io: I, board: SharedBoard) -> Self {
        Interim {
            io: Arc::new(Mutex::new(Some(io))),
            board,
        }
    }

    /// The I/O, back from hyper (every copy then writes nothing more).
    pub(super) fn into_inner(self) -> Option<I> {
        self.io
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take()
    }

    /// Writes the queued 1xx heads (from the connection's task, between
    /// hyper's polls); the task is woken when one is queued.
    pub(super) fn write_queued(&self, cx: &mut Context<'_>) {
        let mut io = self
            .io
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut board = lock(&self.board);
        board.waker = Some(cx.waker().clone());
        if let Some(io) = io.as_mut() {
            let _ = drain(io, &mut board, cx);
        }
    }

    /// Runs `write` on the I/O once the queued heads are out; `hyper_writes`
    /// marks the board unflushed first (hyper's bytes are on their way).
    fn poll_with<T>(
        &self,
        cx: &mut Context<'_>,
        hyper_writes: bool,
        write: impl FnOnce(Pin<&mut I>, &mut Context<'_>) -> Poll<io::Result<T>>,
    ) -> Poll<io::Result<T>> {
        let mut io = self
            .io
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let Some(io) = io.as_mut() else {
            return Poll::Ready(Err(io::ErrorKind::NotConnected.into()));
        };
        let mut board = lock(&self.board);
        board.unflushed |= hyper_writes;
        std::task::ready!(drain(io, &mut board, cx))?;
        drop(board);
        write(Pin::new(io), cx)
    }
}

/// Writes `board`'s queued heads; ready once none is left.
fn drain<I: AsyncWrite + Unpin>(
    io: &mut I,
    board: &mut Board,
    cx: &mut Context<'_>,
) -> Poll<io::Result<()>> {
    while !board.queued.is_empty() {
        match Pin::new(&mut *io).poll_write(cx, &board.queued) {
            Poll::Ready(Ok(0)) => {
                board.queued.clear();
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            Poll::Ready(Ok(written)) => {
                board.queued.drain(..written);
            }
            Poll::Ready(Err(error)) => {
                board.queued.clear();
                return Poll::Ready(Err(error));
            }
            Poll::Pending => return Poll::Pending,
        }
    }
    Poll::Ready(Ok(()))
}

impl<I: AsyncRead + AsyncWrite + Unpin> AsyncRead for Interim<I> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let mut io = self
            .io
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match io.as_mut() {
            Some(io) => Pin::new(io).poll_read(cx, buf),
            None => Poll::Ready(Ok(())),
        }
    }
}

impl<I: AsyncWrite + Unpin> AsyncWrite for Interim<I> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.poll_with(cx, true, |io, cx| io.poll_write(cx, buf))
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.poll_with(cx, true, |io, cx| io.poll_write_vectored(cx, bufs))
    }

    fn is_write_vectored(&self) -> bool {
        self.io
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .as_ref()
            .is_some_and(I::is_write_vectored)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let flushed = std::task::ready!(self.poll_with(cx, false, |io, cx| io.poll_flush(cx)));
        if flushed.is_ok() {
            // hyper flushes its I/O only once its own buffer is empty.
            lock(&self.board).unflushed = false;
        }
        Poll::Ready(flushed)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.poll_with(cx, false, |io, cx| io.poll_shutdown(cx))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sender(board: &SharedBoard, index: u64) -> InterimSender {
        let mut request = Request::new(());
        awaiting(board, index, &mut request);
        request.extensions().get::<InterimSender>().unwrap().clone()
    }

    fn hints() -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert("link", "</style.css>; rel=preload".parse().unwrap());
        headers.insert("connection", "x-hop".parse().unwrap());
        headers.insert("x-hop", "1".parse().unwrap());
        headers
    }

    #[test]
    fn an_early_hint_is_written_whole_without_hop_by_hop_fields() {
        let head = encode(StatusCode::from_u16(103).unwrap(), &hints()).unwrap();
        assert_eq!(
            String::from_utf8(head).unwrap(),
            "HTTP/1.1 103 Early Hints\r\nlink: </style.css>; rel=preload\r\n\r\n"
        );
    }

    #[test]
    fn continue_and_switching_protocols_are_not_forwarded() {
        assert!(encode(StatusCode::CONTINUE, &HeaderMap::new()).is_none());
        assert!(encode(StatusCode::SWITCHING_PROTOCOLS, &HeaderMap::new()).is_none());
        assert!(encode(StatusCode::OK, &HeaderMap::new()).is_none());
    }

    #[test]
    fn a_head_goes_only_to_the_request_waiting_and_only_after_a_flush() {
        let board = SharedBoard::default();
        let first = sender(&board, 0);
        let early = StatusCode::from_u16(103).unwrap();
        assert!(first.send(early, &hints()));
        answered(&board, 0);
        assert!(!first.send(early, &hints()), "after the final head");
        lock(&board).queued.clear();
        lock(&board).unflushed = true;
        let second = sender(&board, 1);
        assert!(
            !second.send(early, &hints()),
            "the first response may be half out"
        );
        lock(&board).unflushed = false;
        assert!(second.send(early, &hints()));
        assert!(!first.send(early, &hints()), "another request's");
    }

    #[test]
    fn heads_per_request_are_bounded() {
        let board = SharedBoard::default();
        let seventh = sender(&board, 7);
        let early = StatusCode::from_u16(103).unwrap();
        let sent = (0..MAX_HEADS + 3)
            .filter(|_| seventh.send(early, &hints()))
            .count();
        assert_eq!(sent, MAX_HEADS);
        let mut huge = HeaderMap::new();
        huge.insert("link", "x".repeat(MAX_HEAD_BYTES).parse().unwrap());
        let other = sender(&board, 8);
        assert!(!other.send(early, &huge));
    }

    #[test]
    fn an_http_1_0_request_gets_no_sender() {
        let board = SharedBoard::default();
        let mut request = Request::new(());
        *request.version_mut() = Version::HTTP_10;
        awaiting(&board, 0, &mut request);
        assert!(request.extensions().get::<InterimSender>().is_none());
    }
}
