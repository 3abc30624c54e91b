//! The connection limits both roles share (RELIABILITY P-8, P-15, L-7,
//! L-8): each at exactly its limit (accepted) and one past it (refused
//! with its status, and the origin sees nothing), the header and idle
//! timeouts, the minimum upload rate, and the connection cap. The
//! accelerator in front of a recording origin stands for both roles, the
//! limits living in the shared connection layer; where the role's own
//! code has a part (a slow body's 408 comes from the role that was
//! forwarding it), the client proxy is asked as well. The minimum upload
//! rate is asked over HTTP/2 too (TLS, ALPN), where it holds each stream
//! and the connection goes on.

mod support;

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll, ready};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderValue, Request, Response};
use http_body_util::{BodyExt, Full};
use hyper::body::{Frame, SizeHint};
use hyper::client::conn::http2;
use rproxy::accelerator::AcceleratorConfig;
use rproxy::http::server::{ConnectionLimits, Handler, HoldConnection, ProxyBody, RequestBody};
use support::proxy::{client_config, eventually};
use support::topology::{
    self, Accelerator, Cache, ClientProxy, Listen, Server, accelerator_config, serve,
};
use support::tunnel::connect_http2;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Large enough that loopback socket buffers cannot hold it.
const BIG: usize = 64 << 20;

/// How long the origin waits before it reads a request body to `/late`.
const LATE: Duration = Duration::from_secs(4);

/// Answers `/big` with [`BIG`] bytes and anything else with a short body,
/// after reading the whole request body (to `/late`, after [`LATE`]);
/// counts requests, and the request bodies that came whole and that were
/// cut. `/early` is answered at once, its body the request body echoed as
/// it comes (counted when it ends).
#[derive(Default)]
struct Origin {
    requests: AtomicUsize,
    whole_bodies: AtomicUsize,
    cut_bodies: AtomicUsize,
}

impl Handler for Origin {
    async fn handle(self: Arc<Self>, request: Request<RequestBody>) -> Response<ProxyBody> {
        self.requests.fetch_add(1, Ordering::SeqCst);
        if request.uri().path() == "/early" {
            let echo = Echo {
                upload: request.into_body(),
                origin: self,
            };
            return Response::new(echo.boxed());
        }
        let big = request.uri().path() == "/big";
        if request.uri().path() == "/late" {
            // An origin that takes the body only after a while.
            tokio::time::sleep(LATE).await;
        }
        let ended = match request.into_body().collect().await {
            Ok(_) => &self.whole_bodies,
            Err(_) => &self.cut_bodies,
        };
        ended.fetch_add(1, Ordering::SeqCst);
        let body = if big {
            Bytes::from(vec![b'x'; BIG])
        } else {
            Bytes::from_static(b"hello\n")
        };
        let mut response = Response::new(Full::new(body).map_err(|n| match n {}).boxed());
        response
            .headers_mut()
            .insert("cache-control", HeaderValue::from_static("no-store"));
        response
    }
}

/// `/early`'s answer: the upload as it comes, counted when it ends.
struct Echo {
    upload: RequestBody,
    origin: Arc<Origin>,
}

impl hyper::body::Body for Echo {
    type Data = Bytes;
    type Error = rproxy::http::server::BodyError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let polled = ready!(Pin::new(&mut self.upload).poll_frame(cx));
        let ended = match &polled {
            None => &self.origin.whole_bodies,
            Some(Err(_)) => &self.origin.cut_bodies,
            Some(Ok(_)) => return Poll::Ready(polled),
        };
        ended.fetch_add(1, Ordering::SeqCst);
        Poll::Ready(polled)
    }
}

struct Stack {
    origin: Server<Origin>,
    accelerator: Accelerator,
    addr: SocketAddr,
    /// A client proxy in front of the origin with the same limits, when
    /// asked for ([`start_both`]).
    client: Option<ClientProxy>,
}

async fn start(limits: ConnectionLimits) -> Stack {
    start_waiting(limits, None).await
}

/// [`start`], with the accelerator's origin timeout `upstream_timeout`
/// when given.
async fn start_waiting(limits: ConnectionLimits, upstream_timeout: Option<Duration>) -> Stack {
    start_listening(Listen::with_limits(limits), upstream_timeout).await
}

/// [`start_waiting`], listening as `listen` says.
async fn start_listening(listen: Listen, upstream_timeout: Option<Duration>) -> Stack {
    let origin = serve(Arc::new(Origin::default()), Listen::default()).await;
    let defaults = accelerator_config(origin.addr);
    let config = AcceleratorConfig {
        basis_store_bytes: 0,
        max_stored_body: 0,
        origin_timeout: upstream_timeout.unwrap_or(defaults.origin_timeout),
        ..defaults
    };
    let accelerator = Accelerator::start_with(config, listen).await;
    Stack {
        addr: accelerator.addr,
        origin,
        accelerator,
        client: None,
    }
}

/// [`start`], and a client proxy whose upstream is the origin, under the
/// same `limits`.
async fn start_both(limits: ConnectionLimits) -> Stack {
    start_both_waiting(limits, None).await
}

/// [`start_both`], with both proxies' upstream timeout `upstream_timeout`
/// when given.
async fn start_both_waiting(limits: ConnectionLimits, upstream_timeout: Option<Duration>) -> Stack {
    start_both_listening(Listen::with_limits(limits), upstream_timeout).await
}

/// [`start_both_waiting`], both proxies listening as `listen` says.
async fn start_both_listening(listen: Listen, upstream_timeout: Option<Duration>) -> Stack {
    let mut stack = start_listening(listen.clone(), upstream_timeout).await;
    let mut config = client_config(&format!("http://{}", stack.origin.addr));
    if let Some(timeout) = upstream_timeout {
        config.upstream_timeout = timeout;
    }
    let client = ClientProxy::start_with(config, Cache::Temp(1 << 20), listen);
    stack.client = Some(client.await);
    stack
}

/// One of the proxies a test asks, and how: the accelerator in
/// origin-form, the client proxy in absolute-form, as `curl -x` asks.
struct Front {
    name: &'static str,
    addr: SocketAddr,
    /// What goes before the path in the request line.
    prefix: String,
}

impl Stack {
    fn origin_requests(&self) -> usize {
        self.origin.requests.load(Ordering::SeqCst)
    }

    fn origin_whole_bodies(&self) -> usize {
        self.origin.whole_bodies.load(Ordering::SeqCst)
    }

    fn origin_cut_bodies(&self) -> usize {
        self.origin.cut_bodies.load(Ordering::SeqCst)
    }

    /// Each front's refusals so far by reason, in [`Stack::fronts`]'
    /// order.
    fn refusal_reasons(&self) -> Vec<Vec<(&'static str, u64)>> {
        let mut reasons = vec![self.accelerator.handler.stats().refusal_reasons()];
        if let Some(client) = &self.client {
            reasons.push(client.handler.stats().refusal_reasons());
        }
        reasons
    }

    /// Each front's refusals so far, in [`Stack::fronts`]' order: the
    /// client's and the upstream's.
    fn refusals(&self) -> Vec<(u64, u64)> {
        let accelerator = self.accelerator.handler.stats().snapshot();
        let mut refusals = vec![(accelerator.refused_client, accelerator.refused_upstream)];
        if let Some(client) = &self.client {
            let client = client.stats();
            refusals.push((client.refused_client, client.refused_upstream));
        }
        refusals
    }

    /// The accelerator, and the client proxy when there is one.
    fn fronts(&self) -> Vec<Front> {
        let mut fronts = vec![Front {
            name: "accelerator",
            addr: self.addr,
            prefix: String::new(),
        }];
        if let Some(client) = &self.client {
            fronts.push(Front {
                name: "client proxy",
                addr: client.addr,
                prefix: format!("http://{}", self.origin.addr),
            });
        }
        fronts
    }

    /// The head of a POST of `len` bytes to `/upload` through `front`,
    /// closing the connection after its answer.
    fn upload_head(&self, front: &Front, len: usize) -> Vec<u8> {
        format!(
            "POST {}/upload HTTP/1.1\r\nHost: {}\r\nContent-Length: {len}\r\n\
             Connection: close\r\n\r\n",
            front.prefix, self.origin.addr
        )
        .into_bytes()
    }
}

/// Sends `head` (and nothing else) and reads until the server closes;
/// returns the status and whether it closed within 5 s.
async fn exchange(addr: SocketAddr, head: &[u8]) -> (u16, bool) {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream.write_all(head).await.unwrap();
    let mut answer = Vec::new();
    let closed = tokio::time::timeout(Duration::from_secs(5), async {
        let mut buf = [0; 4096];
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => answer.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await
    .is_ok();
    let status = String::from_utf8_lossy(answer.get(9..12).unwrap_or_default())
        .parse()
        .unwrap_or(0);
    (status, closed)
}

/// A request head whose target is `target` and with `extra` header lines,
/// asking to close the connection afterwards.
fn head(target: &str, extra: &[String]) -> Vec<u8> {
    let mut head = format!("GET {target} HTTP/1.1\r\nHost: site.test\r\nConnection: close\r\n");
    for line in extra {
        head.push_str(line);
        head.push_str("\r\n");
    }
    head.push_str("\r\n");
    head.into_bytes()
}

#[tokio::test]
async fn p8_a_target_one_byte_too_long_is_414() {
    let limits = ConnectionLimits {
        max_target_bytes: 1024,
        ..ConnectionLimits::default()
    };
    let stack = start(limits).await;
    let at_limit = format!("/{}", "a".repeat(1023));
    assert_eq!(
        exchange(stack.addr, &head(&at_limit, &[])).await,
        (200, true)
    );
    assert_eq!(stack.origin_requests(), 1);
    let past = format!("/{}", "a".repeat(1024));
    assert_eq!(exchange(stack.addr, &head(&past, &[])).await, (414, true));
    assert_eq!(stack.origin_requests(), 1, "the origin saw nothing");
}

#[tokio::test]
async fn p8_one_header_too_many_is_431() {
    let limits = ConnectionLimits {
        max_headers: 20,
        ..ConnectionLimits::default()
    };
    let stack = start(limits).await;
    // Host and Connection are two of them.
    let lines = |n: usize| (0..n).map(|i| format!("X-H{i}: v")).collect::<Vec<_>>();
    assert_eq!(
        exchange(stack.addr, &head("/", &lines(18))).await,
        (200, true)
    );
    assert_eq!(
        exchange(stack.addr, &head("/", &lines(19))).await,
        (431, true)
    );
    assert_eq!(stack.origin_requests(), 1);
}

#[tokio::test]
async fn p8_a_head_past_its_size_is_431() {
    let limits = ConnectionLimits {
        max_head_bytes: 16 << 10,
        ..ConnectionLimits::default()
    };
    let stack = start(limits).await;
    let with_field = |len: usize| head("/", &[format!("X-Big: {}", "b".repeat(len))]);
    let base = with_field(0).len();
    let at_limit = with_field((16 << 10) - base);
    assert_eq!(at_limit.len(), 16 << 10);
    assert_eq!(exchange(stack.addr, &at_limit).await, (200, true));
    let past = with_field((16 << 10) - base + 1);
    assert_eq!(exchange(stack.addr, &past).await, (431, true));
    assert_eq!(stack.origin_requests(), 1);
}

#[tokio::test]
async fn p15_more_hops_than_allowed_is_508() {
    let limits = ConnectionLimits {
        max_hops: 3,
        ..ConnectionLimits::default()
    };
    let stack = start(limits).await;
    let via = |n: usize| {
        let hops: Vec<String> = (0..n).map(|i| format!("1.1 proxy{i}")).collect();
        vec![format!("Via: {}", hops.join(", "))]
    };
    assert_eq!(exchange(stack.addr, &head("/", &via(3))).await, (200, true));
    assert_eq!(exchange(stack.addr, &head("/", &via(4))).await, (508, true));
    // Split over several fields, the hops still add up.
    let split = vec![
        "Via: 1.1 a, 1.1 b".to_owned(),
        "Via: 1.1 c, 1.1 d".to_owned(),
    ];
    assert_eq!(exchange(stack.addr, &head("/", &split)).await, (508, true));
    assert_eq!(stack.origin_requests(), 1);
}

#[tokio::test]
async fn l7_half_a_head_gets_408_and_a_close_at_the_header_timeout() {
    let limits = ConnectionLimits {
        header_read_timeout: Duration::from_secs(1),
        ..ConnectionLimits::default()
    };
    let stack = start(limits).await;
    let started = Instant::now();
    let (status, closed) = exchange(stack.addr, b"GET / HTTP/1.1\r\nHost: si").await;
    assert_eq!((status, closed), (408, true));
    let took = started.elapsed();
    assert!(took < Duration::from_secs(2), "closed after {took:?}");
    assert_eq!(stack.origin_requests(), 0);
}

/// What came back on a connection that sent an upload, and how it ended.
#[derive(Debug)]
struct Answer {
    status: u16,
    /// The answer's head says `Connection: close`.
    says_close: bool,
    body: String,
    /// The proxy closed the connection within 10 s.
    closed: bool,
    /// From the connect to the close (or to the 10 s).
    took: Duration,
}

/// Sends `head`, then `body` `piece` bytes at a time, each after `every`,
/// reading meanwhile until the proxy closes or 10 s pass.
async fn trickle(
    addr: SocketAddr,
    head: &[u8],
    body: &[u8],
    piece: usize,
    every: Duration,
) -> Answer {
    let started = Instant::now();
    let stream = TcpStream::connect(addr).await.unwrap();
    let (mut reader, mut writer) = stream.into_split();
    let (head, body) = (head.to_vec(), body.to_vec());
    let writing = tokio::spawn(async move {
        if writer.write_all(&head).await.is_ok() {
            for piece in body.chunks(piece) {
                tokio::time::sleep(every).await;
                if writer.write_all(piece).await.is_err() {
                    break;
                }
            }
        }
        // Kept open until the answer is read: a half-closed socket would
        // look like a client that left.
        std::future::pending::<()>().await;
        drop(writer);
    });
    let mut raw = Vec::new();
    let mut buf = [0; 4096];
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let closed = loop {
        match tokio::time::timeout_at(deadline, reader.read(&mut buf)).await {
            Err(_) => break false,
            Ok(Ok(0) | Err(_)) => break true,
            Ok(Ok(n)) => raw.extend_from_slice(&buf[..n]),
        }
    };
    let took = started.elapsed();
    writing.abort();
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    Answer {
        status: head.get(9..12).and_then(|s| s.parse().ok()).unwrap_or(0),
        says_close: head
            .lines()
            .any(|line| line.eq_ignore_ascii_case("connection: close")),
        body: body.to_owned(),
        closed,
        took,
    }
}

/// The limits of the L-8 tests: a body may be waited for 1 s (the header
/// timeout), plus a second per 100 bytes it brought.
fn slow_upload_limits() -> ConnectionLimits {
    ConnectionLimits {
        header_read_timeout: Duration::from_secs(1),
        min_upload_bytes_per_sec: 100,
        ..ConnectionLimits::default()
    }
}

/// Waits until the origin has seen `n` request bodies end, cut or whole.
async fn bodies_ended(stack: &Stack, n: usize) {
    eventually("the origin saw the bodies end", || {
        stack.origin_whole_bodies() + stack.origin_cut_bodies() >= n
    })
    .await;
}

/// `n` uploads reached the origin whole, and no front refused any.
async fn uploads_arrived_whole(stack: &Stack, n: usize) {
    bodies_ended(stack, n).await;
    assert_eq!(stack.origin_whole_bodies(), n);
    assert_eq!(stack.refusals(), vec![(0, 0); stack.fronts().len()]);
}

#[tokio::test]
async fn l8_an_upload_slower_than_the_minimum_rate_gets_408_and_is_closed() {
    let stack = start_both(slow_upload_limits()).await;
    let fronts = stack.fronts();
    for front in &fronts {
        // 4 bytes every 200 ms, 20 B/s: bytes keep moving (the idle
        // timeout never comes), but the allowance, 1 s and 0.2 s a second,
        // runs out after 1.25 s. Sent whole, the body would take 50 s.
        let body = [b'x'; 1000];
        let head = stack.upload_head(front, body.len());
        let answer = trickle(front.addr, &head, &body, 4, Duration::from_millis(200)).await;
        assert_eq!(answer.status, 408, "{}: {answer:?}", front.name);
        assert!(answer.says_close, "{}: {answer:?}", front.name);
        assert!(answer.closed, "{}: {answer:?}", front.name);
        assert!(
            answer.body.contains("slower than 100 B/s"),
            "{}: {answer:?}",
            front.name
        );
    }
    // Each front counted the client's refusal, not the origin's, under
    // the reason its log line gives (RELIABILITY's "clear error").
    assert_eq!(stack.refusals(), vec![(1, 0); fronts.len()]);
    assert_eq!(
        stack.refusal_reasons(),
        vec![vec![("body_timeout", 1)]; fronts.len()]
    );
    // Each request went upstream as it came, and was cut there, not ended.
    bodies_ended(&stack, fronts.len()).await;
    assert_eq!(stack.origin_requests(), fronts.len());
    assert_eq!(stack.origin_cut_bodies(), fronts.len());
    assert_eq!(stack.origin_whole_bodies(), 0);
}

#[tokio::test]
async fn l8_an_upload_above_the_minimum_rate_completes() {
    let stack = start_both(slow_upload_limits()).await;
    let fronts = stack.fronts();
    for front in &fronts {
        // 30 bytes every 200 ms, 150 B/s for 2.4 s: the allowance, 1 s and
        // 1.5 s a second, stays ahead of the waits. A rate three times too
        // high (or bits taken for bytes) would run out within 2 s.
        let body = [b'x'; 360];
        let head = stack.upload_head(front, body.len());
        let answer = trickle(front.addr, &head, &body, 30, Duration::from_millis(200)).await;
        assert_eq!(answer.status, 200, "{}: {answer:?}", front.name);
        assert_eq!(answer.body, "hello\n", "{}: {answer:?}", front.name);
        assert!(answer.closed, "{}: {answer:?}", front.name);
    }
    bodies_ended(&stack, fronts.len()).await;
    assert_eq!(stack.origin_whole_bodies(), fronts.len());
    assert_eq!(stack.origin_cut_bodies(), 0);
    assert_eq!(stack.refusals(), vec![(0, 0); fronts.len()]);
}

/// An upload that takes longer than the upstream timeout, at a rate the
/// proxies accept, is not cut with a 504 blaming the upstream: the
/// timeout counts from the last byte of the body the upstream took.
#[tokio::test]
async fn an_upload_longer_than_the_upstream_timeout_completes() {
    let stack = start_both_waiting(slow_upload_limits(), Some(Duration::from_secs(1))).await;
    let fronts = stack.fronts();
    for front in &fronts {
        // 2.4 s at 150 B/s, as in the test above; the timeout is 1 s.
        let body = [b'x'; 360];
        let head = stack.upload_head(front, body.len());
        let answer = trickle(front.addr, &head, &body, 30, Duration::from_millis(200)).await;
        assert_eq!(answer.status, 200, "{}: {answer:?}", front.name);
        assert!(answer.took > Duration::from_secs(2), "{answer:?}");
    }
    uploads_arrived_whole(&stack, fronts.len()).await;
}

#[tokio::test]
async fn l8_a_stalled_upload_gets_408_and_a_close_at_the_idle_timeout() {
    // The minimum rate at its default would give this body 10 s.
    let limits = ConnectionLimits {
        idle_timeout: Duration::from_secs(1),
        ..ConnectionLimits::default()
    };
    let stack = start_both(limits).await;
    let fronts = stack.fronts();
    for front in &fronts {
        // Ten bytes of a hundred, then nothing.
        let head = stack.upload_head(front, 100);
        let answer = trickle(front.addr, &head, b"ten bytes!", 10, Duration::ZERO).await;
        assert_eq!(answer.status, 408, "{}: {answer:?}", front.name);
        assert!(answer.says_close, "{}: {answer:?}", front.name);
        assert!(answer.closed, "{}: {answer:?}", front.name);
        assert!(
            (Duration::from_millis(900)..Duration::from_secs(3)).contains(&answer.took),
            "{}: {answer:?}",
            front.name
        );
    }
    assert_eq!(stack.refusals(), vec![(1, 0); fronts.len()]);
    bodies_ended(&stack, fronts.len()).await;
    assert_eq!(stack.origin_cut_bodies(), fronts.len());
    assert_eq!(stack.origin_whole_bodies(), 0);
}

/// A request body of `left` bytes sent `piece` bytes at a time, each
/// after `every`: an HTTP/2 client's trickle.
struct Trickled {
    left: usize,
    piece: usize,
    every: Duration,
    next: Pin<Box<tokio::time::Sleep>>,
}

impl Trickled {
    fn new(len: usize, piece: usize, every: Duration) -> Trickled {
        Trickled {
            left: len,
            piece,
            every,
            next: Box::pin(tokio::time::sleep(every)),
        }
    }
}

impl hyper::body::Body for Trickled {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        if self.left == 0 {
            return Poll::Ready(None);
        }
        ready!(self.next.as_mut().poll(cx));
        let n = self.piece.min(self.left);
        self.left -= n;
        let next = tokio::time::Instant::now() + self.every;
        self.next.as_mut().reset(next);
        Poll::Ready(Some(Ok(Frame::data(Bytes::from(vec![b'x'; n])))))
    }

    fn is_end_stream(&self) -> bool {
        self.left == 0
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.left as u64)
    }
}

/// Both proxies over TLS, where ALPN picks HTTP/2, under the L-8 limits;
/// and the certificate to trust (in the directory, kept as long as it).
async fn start_both_over_http2() -> (Stack, tempfile::TempDir, PathBuf) {
    start_both_over_http2_with(slow_upload_limits()).await
}

/// [`start_both_over_http2`] under `limits`.
async fn start_both_over_http2_with(
    limits: ConnectionLimits,
) -> (Stack, tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = topology::self_signed(dir.path());
    let listen = Listen {
        limits,
        ..Listen::tls(&cert, &key)
    };
    (start_both_listening(listen, None).await, dir, cert)
}

/// What came back on an HTTP/2 stream.
#[derive(Debug)]
struct StreamAnswer {
    /// 0 when the stream was reset before a head came.
    status: u16,
    /// The body, or the error that cut it (or the reset).
    body: String,
    /// From the request to the end of the answer.
    took: Duration,
}

/// POSTs `body` to `target` on a new stream of `sender`'s connection.
async fn post_http2(
    mut sender: http2::SendRequest<Trickled>,
    target: &str,
    body: Trickled,
) -> StreamAnswer {
    let started = Instant::now();
    let request = Request::post(target)
        .header("content-length", body.left)
        .body(body)
        .unwrap();
    let (status, body) = match sender.send_request(request).await {
        Ok(response) => {
            let status = response.status().as_u16();
            match response.into_body().collect().await {
                Ok(body) => (
                    status,
                    String::from_utf8_lossy(&body.to_bytes()).into_owned(),
                ),
                Err(error) => (status, format!("cut: {error}")),
            }
        }
        Err(error) => (0, format!("reset: {error}")),
    };
    StreamAnswer {
        status,
        body,
        took: started.elapsed(),
    }
}

impl Stack {
    /// The target of an upload through `front` over HTTP/2: the
    /// accelerator's own authority, or the origin's for the client proxy.
    fn http2_upload_target(&self, front: &Front) -> String {
        self.http2_target(front, "/upload")
    }

    /// `path` through `front` over HTTP/2.
    fn http2_target(&self, front: &Front, path: &str) -> String {
        if front.prefix.is_empty() {
            format!("https://localhost:{}{path}", front.addr.port())
        } else {
            format!("{}{path}", front.prefix)
        }
    }
}

/// On one HTTP/2 connection to `front`, two streams at once: to
/// `slow_path`, 4 bytes every 200 ms (20 B/s, whose allowance, 1 s and
/// 0.2 s a second, runs out after 1.25 s), and an upload of 30 bytes every
/// 200 ms (150 B/s, for 2.4 s). Checks that the slow one ended within the
/// grace and what 25 bytes earned, and a second; that the other went on to
/// its 200; and that the connection then takes a new stream. Returns the
/// slow and the good answer.
async fn slow_beside_good(
    stack: &Stack,
    front: &Front,
    cert: &Path,
    slow_path: &str,
) -> (StreamAnswer, StreamAnswer) {
    let sender = connect_http2(front.addr, cert).await;
    let (slow_target, upload) = (
        stack.http2_target(front, slow_path),
        stack.http2_upload_target(front),
    );
    let (slow, good) = tokio::join!(
        post_http2(
            sender.clone(),
            &slow_target,
            Trickled::new(1000, 4, Duration::from_millis(200))
        ),
        post_http2(
            sender.clone(),
            &upload,
            Trickled::new(360, 30, Duration::from_millis(200))
        ),
    );
    assert!(
        (Duration::from_secs(1)..Duration::from_millis(2250)).contains(&slow.took),
        "{}: {slow:?}",
        front.name
    );
    assert_eq!(
        (good.status, good.body.as_str()),
        (200, "hello\n"),
        "{}: {good:?}",
        front.name
    );
    // The connection was not closed: it takes new streams.
    let after = post_http2(sender, &upload, Trickled::new(0, 1, Duration::ZERO)).await;
    assert_eq!(after.status, 200, "{}: {after:?}", front.name);
    (slow, good)
}

#[tokio::test]
async fn l8_over_http2_a_slow_stream_gets_408_and_the_connection_goes_on() {
    let (stack, _dir, cert) = start_both_over_http2().await;
    let fronts = stack.fronts();
    for front in &fronts {
        let (slow, good) = slow_beside_good(&stack, front, &cert, "/upload").await;
        assert_eq!(slow.status, 408, "{}: {slow:?}", front.name);
        assert!(
            slow.body.contains("slower than 100 B/s"),
            "{}: {slow:?}",
            front.name
        );
        // The other stream ended after the slow one's 408.
        assert!(good.took > slow.took, "{}: {good:?}", front.name);
    }
    // Each front counted the client's refusal, under its reason.
    assert_eq!(stack.refusals(), vec![(1, 0); fronts.len()]);
    assert_eq!(
        stack.refusal_reasons(),
        vec![vec![("body_timeout", 1)]; fronts.len()]
    );
    // The slow body went upstream as it came, and was cut there.
    bodies_ended(&stack, 3 * fronts.len()).await;
    assert_eq!(stack.origin_requests(), 3 * fronts.len());
    assert_eq!(stack.origin_cut_bodies(), fronts.len());
    assert_eq!(stack.origin_whole_bodies(), 2 * fronts.len());
}

/// A slow stream whose answer had begun (the origin answered at once, and
/// echoes the upload as it comes) can no longer get a 408: it is reset,
/// its upstream request cut, and the connection's other streams go on.
#[tokio::test]
async fn l8_over_http2_a_slow_stream_whose_answer_began_is_reset_alone() {
    let (stack, _dir, cert) = start_both_over_http2().await;
    let fronts = stack.fronts();
    for front in &fronts {
        let (slow, _) = slow_beside_good(&stack, front, &cert, "/early").await;
        assert_eq!(slow.status, 200, "{}: the head went: {slow:?}", front.name);
        assert!(slow.body.starts_with("cut: "), "{}: {slow:?}", front.name);
    }
    // The slow upload went upstream as it came, and was cut there. It is
    // no refusal (its 200 had gone out): the cut stream is the answer.
    bodies_ended(&stack, 3 * fronts.len()).await;
    assert_eq!(stack.origin_cut_bodies(), fronts.len());
    assert_eq!(stack.origin_whole_bodies(), 2 * fronts.len());
    assert_eq!(stack.refusals(), vec![(0, 0); fronts.len()]);
}

#[tokio::test]
async fn l8_over_http2_an_upload_above_the_minimum_rate_completes() {
    let (stack, _dir, cert) = start_both_over_http2().await;
    let fronts = stack.fronts();
    for front in &fronts {
        let sender = connect_http2(front.addr, &cert).await;
        let target = stack.http2_upload_target(front);
        // 150 B/s for 2.4 s, past the grace, as over HTTP/1.1.
        let body = Trickled::new(360, 30, Duration::from_millis(200));
        let answer = post_http2(sender, &target, body).await;
        assert_eq!(
            (answer.status, answer.body.as_str()),
            (200, "hello\n"),
            "{}: {answer:?}",
            front.name
        );
        assert!(answer.took > Duration::from_secs(2), "{answer:?}");
    }
    uploads_arrived_whole(&stack, fronts.len()).await;
}

/// Flow control is not the client's fault: while the proxy cannot pass a
/// stream's body on (its origin does not read yet), the stream's window
/// stays shut and the client cannot send, and that time does not count.
#[tokio::test]
async fn l8_over_http2_a_stream_the_proxy_does_not_read_is_not_timed() {
    // A rate high enough that what fills the buffers on the way to the
    // origin (a few MiB) earns less than the origin's wait: timed, the
    // wait would run the body out (1 s and a second per 8 MiB).
    let limits = ConnectionLimits {
        header_read_timeout: Duration::from_secs(1),
        min_upload_bytes_per_sec: 8 << 20,
        ..ConnectionLimits::default()
    };
    let (stack, _dir, cert) = start_both_over_http2_with(limits).await;
    let fronts = stack.fronts();
    for front in &fronts {
        let sender = connect_http2(front.addr, &cert).await;
        let target = stack.http2_target(front, "/late");
        // 32 MiB as fast as the windows let it go: more than the sockets
        // to the origin hold while it waits.
        let body = Trickled::new(32 << 20, 1 << 20, Duration::ZERO);
        let answer = post_http2(sender, &target, body).await;
        assert_eq!(
            (answer.status, answer.body.as_str()),
            (200, "hello\n"),
            "{}: {answer:?}",
            front.name
        );
        assert!(answer.took > LATE, "{answer:?}");
    }
    uploads_arrived_whole(&stack, fronts.len()).await;
}

/// Nor is the connection's window, which its streams share: while the
/// proxy cannot pass one stream's large upload on, that stream's unread
/// data fills the window, the client cannot send another stream's body
/// either, and that stream's waits do not count.
#[tokio::test]
async fn l8_over_http2_a_stream_held_back_by_anothers_unread_data_is_not_timed() {
    let (stack, _dir, cert) = start_both_over_http2().await;
    let fronts = stack.fronts();
    let both = |front: &Front| {
        let (late, target) = (
            stack.http2_target(front, "/late"),
            stack.http2_upload_target(front),
        );
        let addr = front.addr;
        let cert = cert.clone();
        async move {
            let sender = connect_http2(addr, &cert).await;
            // 32 MiB that the origin takes only after a while, and, once
            // that fills the window, 150 B/s on another stream: within the
            // rate, were the window open.
            let held = post_http2(
                sender.clone(),
                &late,
                Trickled::new(32 << 20, 1 << 20, Duration::ZERO),
            );
            let after = async {
                tokio::time::sleep(Duration::from_millis(500)).await;
                let body = Trickled::new(360, 30, Duration::from_millis(200));
                post_http2(sender.clone(), &target, body).await
            };
            tokio::join!(held, after)
        }
    };
    // Both fronts at once, as each takes the origin's wait and more.
    let (accelerator, client) = tokio::join!(both(&fronts[0]), both(&fronts[1]));
    for (front, (held, after)) in fronts.iter().zip([accelerator, client]) {
        assert_eq!(
            (held.status, held.body.as_str()),
            (200, "hello\n"),
            "{}: {held:?}",
            front.name
        );
        assert_eq!(
            (after.status, after.body.as_str()),
            (200, "hello\n"),
            "{}: {after:?}",
            front.name
        );
    }
    uploads_arrived_whole(&stack, 2 * fronts.len()).await;
}

#[tokio::test]
async fn a_reader_that_stops_reading_is_closed_at_the_idle_timeout() {
    let limits = ConnectionLimits {
        idle_timeout: Duration::from_secs(1),
        ..ConnectionLimits::default()
    };
    let stack = start(limits).await;
    let mut stream = TcpStream::connect(stack.addr).await.unwrap();
    stream.write_all(&head("/big", &[])).await.unwrap();
    // Read nothing while the proxy's writes back up, then drain.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let mut got = 0;
    let mut buf = vec![0; 1 << 16];
    let drained = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => got += n,
            }
        }
    })
    .await;
    assert!(drained.is_ok(), "the connection was closed");
    assert!(got < BIG, "cut short: got {got} bytes of {BIG}");
}

#[tokio::test]
async fn connections_past_the_cap_wait_until_one_ends() {
    let limits = ConnectionLimits {
        max_connections: 2,
        ..ConnectionLimits::default()
    };
    let stack = start(limits).await;
    let keep_alive = b"GET / HTTP/1.1\r\nHost: site.test\r\n\r\n";
    let mut held = Vec::new();
    for _ in 0..2 {
        let mut stream = TcpStream::connect(stack.addr).await.unwrap();
        stream.write_all(keep_alive).await.unwrap();
        let mut buf = [0; 1024];
        let n = stream.read(&mut buf).await.unwrap();
        assert!(buf[..n].starts_with(b"HTTP/1.1 200"));
        held.push(stream);
    }
    let addr = stack.addr;
    let third = tokio::spawn(async move { exchange(addr, &head("/", &[])).await });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!third.is_finished(), "served although both slots are taken");
    assert_eq!(stack.origin_requests(), 2);
    drop(held.pop());
    let answer = tokio::time::timeout(Duration::from_secs(5), third)
        .await
        .expect("served once a slot is free")
        .unwrap();
    assert_eq!(answer, (200, true));
    assert_eq!(stack.origin_requests(), 3);
}

/// Answers `/hold` with a [`HoldConnection`] of 3 s, anything else plainly.
struct Holder;

impl Handler for Holder {
    async fn handle(self: Arc<Self>, request: Request<RequestBody>) -> Response<ProxyBody> {
        let held = request.uri().path() == "/hold";
        let mut response = Response::new(
            Full::new(Bytes::from_static(b"ok"))
                .map_err(|n| match n {})
                .boxed(),
        );
        if held {
            response
                .extensions_mut()
                .insert(HoldConnection(Duration::from_secs(3)));
        }
        response
    }
}

/// Sends `path` on `stream` (keep-alive) and reads its 2-byte answer.
async fn ask(stream: &mut TcpStream, path: &str) -> bool {
    let request = format!("GET {path} HTTP/1.1\r\nHost: site.test\r\n\r\n");
    if stream.write_all(request.as_bytes()).await.is_err() {
        return false;
    }
    let mut answer = Vec::new();
    let mut buf = [0; 1024];
    while !answer.ends_with(b"ok") {
        match tokio::time::timeout(Duration::from_secs(2), stream.read(&mut buf)).await {
            Ok(Ok(n)) if n > 0 => answer.extend_from_slice(&buf[..n]),
            _ => return false,
        }
    }
    answer.starts_with(b"HTTP/1.1 200")
}

#[tokio::test]
async fn a_held_connection_outlives_the_header_timeout_once() {
    let limits = ConnectionLimits {
        header_read_timeout: Duration::from_secs(1),
        idle_timeout: Duration::from_secs(1),
        ..ConnectionLimits::default()
    };
    let holder = serve(Arc::new(Holder), Listen::with_limits(limits)).await;
    let addr = holder.addr;

    // Plain: idle past the header timeout, the connection is gone.
    let mut plain = TcpStream::connect(addr).await.unwrap();
    assert!(ask(&mut plain, "/").await);
    tokio::time::sleep(Duration::from_millis(2000)).await;
    assert!(!ask(&mut plain, "/").await, "closed at the header timeout");

    // Held: the client may be silent for the hold, and come back.
    let mut held = TcpStream::connect(addr).await.unwrap();
    assert!(ask(&mut held, "/hold").await);
    tokio::time::sleep(Duration::from_millis(2000)).await;
    assert!(ask(&mut held, "/").await, "still open within the hold");
    // That answer held nothing: the usual timeout is back.
    tokio::time::sleep(Duration::from_millis(2000)).await;
    assert!(
        !ask(&mut held, "/").await,
        "closed at the header timeout again"
    );
}
