//! The client proxy in the upstream's queue (issue 5), over real sockets on
//! loopback, on tokio's paused clock (a 30 s Retry-After costs nothing).
//! Against our own accelerator with one upload slot held by a slow body
//! where it can answer (PARQ; Active Queueing 0.1 through a relay that
//! makes the client's offer a legacy one, since the accelerator answers
//! PARQ to `X-Queue: 1.0`), and against a raw upstream where a test needs
//! an answer the accelerator never gives.
//!
//! A relay between the client proxy and the upstream logs every request
//! head with the connection it came on, so the tests see which connection
//! each poll used.

mod support;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Request, Response};
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::Frame;
use rproxy::accelerator::AcceleratorConfig;
use rproxy::client_proxy::ClientConfig;
use rproxy::client_proxy::queue_wait::QueueWaitConfig;
use rproxy::http::server::{BodyError, ConnectionLimits, Handler, ProxyBody, RequestBody};
use rproxy::queue::{Callback, QueueConfig, QueueId};
use support::topology::{Accelerator, Cache, ClientProxy, Listen, Server, serve};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::time::Instant;

/// Connection limits for servers whose requests wait minutes of (paused)
/// time: the idle timeout would otherwise cut them.
fn patient() -> ConnectionLimits {
    ConnectionLimits {
        idle_timeout: Duration::from_secs(3600),
        ..ConnectionLimits::default()
    }
}

// ---------------------------------------------------------------------------
// The origin and the accelerator

/// `/slow` sends one chunk, then its end once the test says so; anything
/// else is `quick` at once. Records the paths in arrival order.
struct Origin {
    finish: tokio::sync::Mutex<Option<mpsc::Receiver<()>>>,
    paths: Mutex<Vec<String>>,
}

impl Handler for Origin {
    async fn handle(self: Arc<Self>, request: Request<RequestBody>) -> Response<ProxyBody> {
        let path = request.uri().path().to_owned();
        self.paths.lock().unwrap().push(path.clone());
        if path != "/slow" {
            return Response::new(
                Full::new(Bytes::from_static(b"quick\n"))
                    .map_err(|n| match n {})
                    .boxed(),
            );
        }
        let mut finish = self.finish.lock().await.take().expect("one /slow request");
        let (tx, rx) = mpsc::channel::<Result<Frame<Bytes>, BodyError>>(1);
        tokio::spawn(async move {
            let _ = tx
                .send(Ok(Frame::data(Bytes::from_static(b"first\n"))))
                .await;
            let _ = finish.recv().await;
            let _ = tx
                .send(Ok(Frame::data(Bytes::from_static(b"last\n"))))
                .await;
        });
        Response::new(BodyExt::boxed(StreamBody::new(Receiver(rx))))
    }
}

struct Receiver(mpsc::Receiver<Result<Frame<Bytes>, BodyError>>);

impl futures_core::Stream for Receiver {
    type Item = Result<Frame<Bytes>, BodyError>;
    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        self.0.poll_recv(cx)
    }
}

struct Accel {
    _accelerator: Accelerator,
    addr: SocketAddr,
    origin: Server<Origin>,
    finish: mpsc::Sender<()>,
    /// The connection holding the one slot with `/slow`.
    holder: TcpStream,
}

/// An accelerator with one upload slot, already taken by a `/slow` body.
async fn accelerator(queue: QueueConfig) -> Accel {
    let (finish, finish_rx) = mpsc::channel(1);
    let origin = Arc::new(Origin {
        finish: tokio::sync::Mutex::new(Some(finish_rx)),
        paths: Mutex::new(Vec::new()),
    });
    let origin = serve(origin, Listen::with_limits(patient())).await;
    let config = AcceleratorConfig {
        via_name: HeaderValue::from_static("accel-test"),
        basis_store_bytes: 0,
        max_stored_body: 0,
        basis_disk: None,
        queue: Some(queue),
        ..AcceleratorConfig::for_origin(format!("http://{}", origin.addr).parse().unwrap())
    };
    let accelerator = Accelerator::start_with(config, Listen::with_limits(patient())).await;
    let mut holder = TcpStream::connect(accelerator.addr).await.unwrap();
    holder
        .write_all(b"GET /slow HTTP/1.1\r\nHost: site.test\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut first = [0; 512];
    let n = holder.read(&mut first).await.unwrap();
    assert!(
        first[..n].starts_with(b"HTTP/1.1 200"),
        "the holder is served"
    );
    Accel {
        addr: accelerator.addr,
        _accelerator: accelerator,
        origin,
        finish,
        holder,
    }
}

impl Accel {
    /// Ends the `/slow` body: the slot is free.
    async fn free_the_slot(&mut self) {
        self.finish.send(()).await.unwrap();
        let mut rest = Vec::new();
        self.holder.read_to_end(&mut rest).await.unwrap();
    }
}

// ---------------------------------------------------------------------------
// The relay

/// One connection through the relay.
#[derive(Debug, Default, Clone)]
struct Connection {
    /// Request heads, with when they passed.
    requests: Vec<(Instant, String)>,
    /// When the client proxy closed it.
    closed: Option<Instant>,
}

type Log = Arc<Mutex<Vec<Connection>>>;

/// A TCP relay to `upstream` that logs request heads per connection; with
/// `legacy`, it turns the offer `x-queue: 1.0` into `x-queue: 0.1`. The
/// client proxy only sends bodiless requests here, so heads are all there
/// is to forward.
async fn relay(upstream: SocketAddr, legacy: bool) -> (SocketAddr, Log) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let log: Log = Arc::default();
    let connections = log.clone();
    tokio::spawn(async move {
        loop {
            let (client, _) = listener.accept().await.unwrap();
            let server = TcpStream::connect(upstream).await.unwrap();
            let index = {
                let mut log = connections.lock().unwrap();
                log.push(Connection::default());
                log.len() - 1
            };
            let (mut from_client, mut to_client) = client.into_split();
            let (mut from_server, mut to_server) = server.into_split();
            tokio::spawn(async move {
                let _ = tokio::io::copy(&mut from_server, &mut to_client).await;
                let _ = to_client.shutdown().await;
            });
            let log = connections.clone();
            tokio::spawn(async move {
                let mut pending = Vec::new();
                let mut chunk = [0u8; 4096];
                loop {
                    let n = from_client.read(&mut chunk).await.unwrap_or(0);
                    if n == 0 {
                        log.lock().unwrap()[index].closed = Some(Instant::now());
                        let _ = to_server.shutdown().await;
                        return;
                    }
                    pending.extend_from_slice(&chunk[..n]);
                    while let Some(end) = pending.windows(4).position(|w| w == b"\r\n\r\n") {
                        let head: Vec<u8> = pending.drain(..end + 4).collect();
                        let mut head = String::from_utf8(head).unwrap();
                        if legacy {
                            head = head.replace("x-queue: 1.0\r\n", "x-queue: 0.1\r\n");
                        }
                        log.lock().unwrap()[index]
                            .requests
                            .push((Instant::now(), head.clone()));
                        if to_server.write_all(head.as_bytes()).await.is_err() {
                            return;
                        }
                    }
                }
            });
        }
    });
    (addr, log)
}

// ---------------------------------------------------------------------------
// The client proxy and user agents

type Client = ClientProxy;

async fn client(upstream: SocketAddr, queue: QueueWaitConfig) -> Client {
    let config = ClientConfig {
        max_object_bytes: 1 << 20,
        memory_cache_bytes: 0,
        queue,
        ..support::proxy::client_config(&format!("http://{upstream}"))
    };
    ClientProxy::start_with(config, Cache::Temp(1 << 20), Listen::with_limits(patient())).await
}

/// Waits of at most `wait_max`, whether the user agent holds its
/// connection or has a page (the tests' servers never close an idle one).
fn waits(wait_max: u64) -> QueueWaitConfig {
    QueueWaitConfig {
        wait_max: Duration::from_secs(wait_max),
        held_max: Duration::from_secs(wait_max),
        ..QueueWaitConfig::default()
    }
}

/// One request on its own connection, read to the close.
async fn exchange(addr: SocketAddr, request: String) -> String {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).await.unwrap();
    String::from_utf8_lossy(&answer).into_owned()
}

fn get(path: &str, extra: &str) -> String {
    format!("GET {path} HTTP/1.1\r\nHost: site.test\r\nConnection: close\r\n{extra}\r\n")
}

const BROWSER: &str =
    "Accept: text/html,application/xhtml+xml,*/*;q=0.8\r\nCookie: session=alice\r\n";

fn header<'a>(answer: &'a str, name: &str) -> Option<&'a str> {
    let head = answer.split("\r\n\r\n").next().unwrap_or("");
    head.lines().find_map(|line| {
        let (n, v) = line.split_once(':')?;
        n.eq_ignore_ascii_case(name).then(|| v.trim())
    })
}

fn body(answer: &str) -> &str {
    answer.split_once("\r\n\r\n").map_or("", |(_, body)| body)
}

/// The client proxy's `/.rproxy/stats`.
async fn stats(client: SocketAddr) -> serde_json::Value {
    let answer = exchange(client, get("/.rproxy/stats", "")).await;
    serde_json::from_str(body(&answer)).unwrap()
}

/// Waits (in paused time) until `check` holds.
async fn until(what: &str, mut check: impl FnMut() -> bool) {
    for _ in 0..10_000 {
        if check() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("never: {what}");
}

fn requests_on(log: &Log) -> Vec<usize> {
    log.lock()
        .unwrap()
        .iter()
        .map(|c| c.requests.len())
        .collect()
}

// ---------------------------------------------------------------------------
// PARQ against the accelerator

#[tokio::test(start_paused = true)]
async fn parq_waits_keep_their_sq_places_on_held_connections_first_come_first_served() {
    let mut accel = accelerator(QueueConfig::new(1.try_into().unwrap(), 100)).await;
    let (relayed, log) = relay(accel.addr, false).await;
    let client = client(relayed, waits(300)).await;
    let waiting = client.handler.queue_waits().clone();

    let a = tokio::spawn(exchange(client.addr, get("/a", "")));
    until("A waits", || waiting.waiting() == 1).await;
    let b = tokio::spawn(exchange(client.addr, get("/b", "")));
    until("B waits", || waiting.waiting() == 2).await;

    // The waits are visible: counted, and listed with their places.
    let now = stats(client.addr).await;
    assert_eq!(now["queue_waiting"], 2, "{now}");
    let listed = now["queue"].as_array().unwrap();
    assert_eq!(listed.len(), 2, "{now}");
    // A-11: places only; no URL or query of anyone's request.
    assert!(listed[0].get("url").is_none(), "{now}");
    assert!(!now.to_string().contains("/a"), "{now}");
    assert_eq!(listed[0]["dialect"], "parq");
    assert_eq!(
        (&listed[0]["position"], &listed[0]["length"]),
        (&1.into(), &1.into())
    );
    assert_eq!(
        (&listed[1]["position"], &listed[1]["length"]),
        (&2.into(), &2.into())
    );
    // The accelerator's ETA says 1 s, but no slot comes before we ask
    // again: the ETA shown is at least the time to the next poll.
    let (next, eta) = (&listed[1]["next_poll_secs"], &listed[1]["eta_secs"]);
    assert!(next.as_u64().unwrap() >= 49, "B comes back at 50 s: {now}");
    assert!(eta.as_u64().unwrap() >= next.as_u64().unwrap(), "{now}");

    // A comes back at 30 s (position 1) and B at 50 s (position 2): both
    // still queued, in Sq, on connections of their own. The slot frees
    // at 55 s; A is served at its next poll (60 s), then B (100 s).
    tokio::time::sleep(Duration::from_secs(55)).await;
    accel.free_the_slot().await;
    let origin = &accel.origin;
    let a = a.await.unwrap();
    let b = b.await.unwrap();
    assert!(a.starts_with("HTTP/1.1 200"), "{a}");
    assert!(b.starts_with("HTTP/1.1 200"), "{b}");
    assert!(body(&a).contains("quick\n"), "{a}");
    assert_eq!(*origin.paths.lock().unwrap(), ["/slow", "/a", "/b"]);
    assert_eq!(waiting.waiting(), 0, "nothing left waiting");

    // Each wait polled twice on one held connection, with its ID, and no
    // place was lost on the way (a lost place would show a new ID).
    let log = log.lock().unwrap().clone();
    for path in ["/a", "/b"] {
        let retries: Vec<(usize, &str)> = log
            .iter()
            .enumerate()
            .flat_map(|(i, c)| c.requests.iter().map(move |(_, h)| (i, h.as_str())))
            .filter(|(_, h)| h.starts_with(&format!("GET {path} ")) && h.contains("x-queued: "))
            .collect();
        assert_eq!(retries.len(), 2, "{path}: {log:#?}");
        assert_eq!(
            retries[0].0, retries[1].0,
            "{path}: one connection: {log:#?}"
        );
        let id = |h: &str| h.split("ID=").nth(1).unwrap()[..32].to_owned();
        assert_eq!(id(retries[0].1), id(retries[1].1));
        assert!(retries[0].1.contains("x-queue: 1.0"));
    }
}

// ---------------------------------------------------------------------------
// Active Queueing 0.1 against the accelerator

#[tokio::test(start_paused = true)]
async fn legacy_waits_poll_one_held_connection_between_poll_min_and_poll_max() {
    let mut queue = QueueConfig::new(1.try_into().unwrap(), 100);
    queue.legacy_poll_min = Duration::from_secs(45);
    queue.legacy_poll_max = Duration::from_secs(120);
    let mut accel = accelerator(queue).await;
    let (relayed, log) = relay(accel.addr, true).await;
    let client = client(relayed, waits(300)).await;
    let waiting = client.handler.queue_waits().clone();

    let started = Instant::now();
    let a = tokio::spawn(exchange(client.addr, get("/a", "")));
    until("A polls its own connection", || {
        requests_on(&log).get(1).is_some_and(|&n| n >= 2)
    })
    .await;
    assert_eq!(waiting.waiting(), 1);
    let now = stats(client.addr).await;
    assert_eq!(now["queue"][0]["dialect"], "legacy", "{now}");
    assert_eq!(
        now["queue"][0]["position"],
        1,
        "{now}\n{:#?}",
        log.lock().unwrap()
    );
    assert_eq!(
        now["queue"][0]["eta_secs"],
        serde_json::Value::Null,
        "no progress yet: {now}"
    );

    tokio::time::sleep(Duration::from_secs(100)).await;
    accel.free_the_slot().await;
    let origin = &accel.origin;
    let a = a.await.unwrap();
    assert!(a.starts_with("HTTP/1.1 200"), "{a}");
    assert_eq!(*origin.paths.lock().unwrap(), ["/slow", "/a"]);

    let log = log.lock().unwrap().clone();
    // The first answer came on a pooled connection, which was closed at
    // once so that the accelerator frees the place it held by it.
    let first = &log[0];
    assert_eq!(first.requests.len(), 1, "{log:#?}");
    let closed = first.closed.expect("the pooled connection was retired");
    assert!(
        closed - first.requests[0].0 < Duration::from_secs(1),
        "{log:#?}"
    );
    // Every poll went on one held connection, never sooner than pollMin
    // after the last, nor later than pollMax.
    let held: Vec<&Connection> = log
        .iter()
        .skip(1)
        .filter(|c| !c.requests.is_empty())
        .collect();
    assert_eq!(held.len(), 1, "{log:#?}");
    let polls = &held[0].requests;
    assert!(polls.len() >= 4, "polled for 150 s and more: {log:#?}");
    assert!(polls.iter().all(|(_, h)| h.contains("x-queue: 0.1")));
    for pair in polls.windows(2) {
        let gap = pair[1].0 - pair[0].0;
        assert!(
            (Duration::from_secs(45)..=Duration::from_secs(120)).contains(&gap),
            "poll gap {gap:?}"
        );
    }
    assert!(started.elapsed() < Duration::from_secs(300), "not given up");
}

// ---------------------------------------------------------------------------
// The waiting page

#[tokio::test(start_paused = true)]
async fn a_navigation_gets_a_waiting_page_and_its_reload_gets_the_answer() {
    let mut accel = accelerator(QueueConfig::new(1.try_into().unwrap(), 100)).await;
    let client = client(accel.addr, waits(300)).await;
    let waiting = client.handler.queue_waits().clone();

    let started = Instant::now();
    let page = exchange(client.addr, get("/page?a=1&b=%3C2%3E", BROWSER)).await;
    let waited = started.elapsed();
    assert!(page.starts_with("HTTP/1.1 503"), "{page}");
    assert!(
        (Duration::from_secs(3)..Duration::from_secs(4)).contains(&waited),
        "the page comes after --queue-page-after: {waited:?}"
    );
    assert_eq!(
        header(&page, "Content-Type"),
        Some("text/html; charset=utf-8")
    );
    assert_eq!(header(&page, "Cache-Control"), Some("no-store"));
    assert_eq!(header(&page, "Refresh"), Some("5"));
    assert_eq!(header(&page, "Retry-After"), Some("5"));
    let html = body(&page);
    assert!(
        html.contains(r#"<meta http-equiv="refresh" content="5">"#),
        "{html}"
    );
    assert!(html.contains("<td>1 of 1</td>"), "{html}");
    assert!(
        html.contains("<td>in 27 s</td>"),
        "next poll at 30 s: {html}"
    );
    assert!(
        html.contains("<td>about 27 s</td>"),
        "no sooner than that: {html}"
    );
    assert!(
        html.contains("page?a=1&amp;b=%3C2%3E</code>"),
        "escaped: {html}"
    );
    assert_eq!(waiting.parked(), 1, "the wait goes on in the background");
    assert_eq!(waiting.waiting(), 1);

    // A reload before the answer: the page again, the same wait.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let reload = get(
        "/page?a=1&b=%3C2%3E",
        &format!("{BROWSER}Cache-Control: max-age=0\r\n"),
    );
    let again = exchange(client.addr, reload.clone()).await;
    assert!(again.starts_with("HTTP/1.1 503"), "{again}");
    assert!(body(&again).contains("<td>1 of 1</td>"), "{again}");
    // Another user's request is not given this wait's answer: it waits
    // on its own (and gets its own page).
    let other = exchange(
        client.addr,
        get(
            "/page?a=1&b=%3C2%3E",
            "Accept: text/html\r\nCookie: session=bob\r\n",
        ),
    )
    .await;
    assert!(other.starts_with("HTTP/1.1 503"), "{other}");
    assert_eq!(waiting.parked(), 2);

    // The slot frees; the background wait is served at its next poll
    // (30 s after the first answer), and the next reload gets that answer.
    accel.free_the_slot().await;
    let origin = &accel.origin;
    let mut answer = String::new();
    for _ in 0..10 {
        tokio::time::sleep(Duration::from_secs(5)).await;
        answer = exchange(client.addr, reload.clone()).await;
        if !answer.starts_with("HTTP/1.1 503") {
            break;
        }
        assert!(
            body(&answer).contains("<td>1 of "),
            "the same place: {answer}"
        );
    }
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    let served_at = started.elapsed();
    assert!(
        (Duration::from_secs(30)..Duration::from_secs(40)).contains(&served_at),
        "served at the first poll after the slot freed: {served_at:?}"
    );
    assert!(body(&answer).contains("quick\n"), "{answer}");
    let paths = origin.paths.lock().unwrap().clone();
    assert_eq!(
        paths.iter().filter(|p| *p == "/page").count(),
        1,
        "{paths:?}"
    );
}

/// A raw upstream that queues every request (PARQ, `Retry-After` as
/// given, keeping no connection) until `serve_from` requests have come,
/// then serves; records each head and when it came.
async fn parq_upstream(
    retry_after: u64,
    serve_from: usize,
) -> (SocketAddr, Arc<Mutex<Vec<(Instant, String)>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let heads = Arc::new(Mutex::new(Vec::new()));
    let seen = heads.clone();
    let position = Arc::new(AtomicUsize::new(9));
    tokio::spawn(async move {
        loop {
            let (mut stream, _) = listener.accept().await.unwrap();
            let seen = seen.clone();
            let position = position.clone();
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut byte = [0; 1];
                while !head.ends_with(b"\r\n\r\n") && stream.read(&mut byte).await.unwrap_or(0) == 1
                {
                    head.push(byte[0]);
                }
                let count = {
                    let mut seen = seen.lock().unwrap();
                    seen.push((Instant::now(), String::from_utf8_lossy(&head).into_owned()));
                    seen.len()
                };
                let answer = if count >= serve_from {
                    "HTTP/1.1 200 OK\r\nContent-Length: 6\r\nCache-Control: no-store\r\nConnection: close\r\n\r\nserved".to_owned()
                } else {
                    let p = position.fetch_sub(1, Ordering::SeqCst);
                    format!(
                        "HTTP/1.1 503 Service Unavailable\r\nX-Queue: 1.0\r\nX-Queued: position={p}; length=12; ETA=90; lifetime={}; ID={ID}\r\nRetry-After: {retry_after}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
                        retry_after + 60
                    )
                };
                let _ = stream.write_all(answer.as_bytes()).await;
            });
        }
    });
    (addr, heads)
}

const ID: &str = "0123456789abcdef0123456789abcdef";

#[tokio::test(start_paused = true)]
async fn a_background_wait_nobody_comes_back_for_is_dropped() {
    let (upstream, heads) = parq_upstream(10, usize::MAX).await;
    let client = client(upstream, waits(300)).await;
    let waiting = client.handler.queue_waits().clone();
    let page = exchange(client.addr, get("/page", BROWSER)).await;
    assert!(page.starts_with("HTTP/1.1 503"), "{page}");
    assert!(body(&page).contains("<td>9 of 12</td>"), "{page}");
    assert_eq!(waiting.parked(), 1);
    // No reload comes: after the parking time the wait is dropped, with
    // its place upstream (no more polls).
    tokio::time::sleep(rproxy::client_proxy::queue_wait::PARK_EXPIRY).await;
    until("the parked wait is dropped", || {
        waiting.parked() == 0 && waiting.waiting() == 0
    })
    .await;
    let polls = heads.lock().unwrap().len();
    tokio::time::sleep(Duration::from_secs(120)).await;
    assert_eq!(heads.lock().unwrap().len(), polls, "no poll after the drop");
    assert!(polls >= 3, "polled every 10 s until then: {polls}");
    let now = stats(client.addr).await;
    assert_eq!(now["queue_waiting"], 0, "{now}");
    assert_eq!(now["queue"], serde_json::json!([]), "{now}");
}

#[tokio::test(start_paused = true)]
async fn a_background_wait_ends_at_queue_wait_max_with_the_upstreams_503() {
    let (upstream, heads) = parq_upstream(10, usize::MAX).await;
    let client = client(upstream, waits(25)).await;
    let waiting = client.handler.queue_waits().clone();
    let page = exchange(client.addr, get("/page", BROWSER)).await;
    assert!(page.starts_with("HTTP/1.1 503"), "{page}");
    // Reloads keep it parked; at 25 s it gives up, and the reload after
    // that gets the upstream's 503 (without our queue ID).
    let mut last = String::new();
    for _ in 0..6 {
        tokio::time::sleep(Duration::from_secs(5)).await;
        last = exchange(client.addr, get("/page", BROWSER)).await;
        if !last.contains("text/html") {
            break;
        }
    }
    assert!(last.starts_with("HTTP/1.1 503"), "{last}");
    assert_eq!(header(&last, "Retry-After"), Some("10"), "{last}");
    assert_eq!(header(&last, "X-Queued"), None, "{last}");
    assert_eq!(
        header(&last, "Content-Type"),
        None,
        "the upstream's, not a page: {last}"
    );
    assert_eq!((waiting.parked(), waiting.waiting()), (0, 0));
    assert_eq!(heads.lock().unwrap().len(), 3, "0, 10 and 20 s");
}

// ---------------------------------------------------------------------------
// QUEUE callbacks

#[tokio::test(start_paused = true)]
async fn a_queue_callback_wakes_its_wait_and_junk_is_dropped() {
    let (upstream, heads) = parq_upstream(600, 2).await;
    let callbacks = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let node = callbacks.local_addr().unwrap();
    let client = client(
        upstream,
        QueueWaitConfig {
            node: Some(node),
            ..waits(3600)
        },
    )
    .await;
    tokio::spawn(client.handler.serve_queue_callbacks(callbacks));
    let waiting = client.handler.queue_waits().clone();
    let started = Instant::now();
    let answer = tokio::spawn(exchange(client.addr, get("/file", "")));
    until("the request waits", || waiting.waiting() == 1).await;

    let send = move |bytes: Vec<u8>| async move {
        let mut stream = TcpStream::connect(node).await.unwrap();
        let _ = stream.write_all(&bytes).await;
        let mut rest = Vec::new();
        // The listener closes every callback connection.
        let _ = stream.read_to_end(&mut rest).await;
    };
    let unknown = QueueId::parse_hex(b"ffffffffffffffffffffffffffffffff").unwrap();
    let server: SocketAddr = "127.0.0.1:9".parse().unwrap();
    send(b"GET / HTTP/1.1\r\n\r\n".to_vec()).await;
    send(vec![b'Q'; 10_000]).await;
    send(Callback { id: unknown, node }.line(server).into_bytes()).await;
    // A sender that never ends its line is dropped after 5 s.
    let slow_since = Instant::now();
    send(b"QUEUE 0123".to_vec()).await;
    let slow = slow_since.elapsed();
    assert!(
        (Duration::from_secs(5)..Duration::from_secs(6)).contains(&slow),
        "slow sender dropped after {slow:?}"
    );
    assert_eq!(heads.lock().unwrap().len(), 1, "nothing woke the wait");
    assert!(!answer.is_finished());

    // The accelerator's own line for our ID: we come back at once.
    let ours = QueueId::parse_hex(ID.as_bytes()).unwrap();
    send(Callback { id: ours, node }.line(server).into_bytes()).await;
    let answer = answer.await.unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "not at Retry-After (600 s): {:?}",
        started.elapsed()
    );
    let heads = heads.lock().unwrap();
    assert_eq!(heads.len(), 2);
    for (_, head) in heads.iter() {
        assert!(
            head.to_ascii_lowercase()
                .contains(&format!("x-node: {node}\r\n")),
            "X-Node tells where to call back: {head}"
        );
    }
    assert!(heads[1].1.contains(&format!("ID={ID}")), "{}", heads[1].1);
}

// ---------------------------------------------------------------------------
// Retry-After and queue-wait-max (a raw PARQ upstream, real timings)

#[tokio::test(start_paused = true)]
async fn the_client_proxy_keeps_its_place_for_the_user_agent() {
    let (upstream, heads) = parq_upstream(30, 2).await;
    let client = client(upstream, waits(60)).await;
    let started = Instant::now();
    let answer = exchange(client.addr, get("/page", "")).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.ends_with("served"), "{answer}");
    let heads = heads.lock().unwrap();
    assert_eq!(heads.len(), 2, "{heads:?}");
    let waited = heads[1].0 - started;
    assert!(
        (Duration::from_secs(30)..Duration::from_secs(31)).contains(&waited),
        "came back at Retry-After: {waited:?}"
    );
    let lower: Vec<String> = heads.iter().map(|(_, h)| h.to_ascii_lowercase()).collect();
    assert!(
        lower[0].contains("x-queue: 1.0"),
        "offers PARQ: {}",
        heads[0].1
    );
    assert!(!lower[0].contains("x-queued"), "{}", heads[0].1);
    assert!(
        !lower[0].contains("x-node"),
        "no callbacks asked for: {}",
        heads[0].1
    );
    assert!(
        lower[1].contains(&format!("x-queued: position=9; id={ID}")),
        "comes back with its place: {}",
        heads[1].1
    );
}

#[tokio::test(start_paused = true)]
async fn a_request_its_user_agent_waits_on_gives_up_by_its_own_bound() {
    let (upstream, heads) = parq_upstream(30, usize::MAX).await;
    // Background waits may go on for 300 s; a user agent on the line (no
    // page) is answered within 45 s.
    let client = client(
        upstream,
        QueueWaitConfig {
            held_max: Duration::from_secs(45),
            ..waits(300)
        },
    )
    .await;
    let started = Instant::now();
    // A user agent's own queue headers are not passed on.
    let answer = exchange(
        client.addr,
        get(
            "/page",
            &format!("X-Queued: position=1; ID={ID}\r\nX-Node: 192.0.2.1:1\r\n"),
        ),
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    let waited = started.elapsed();
    assert!(
        (Duration::from_secs(30)..Duration::from_secs(31)).contains(&waited),
        "gave up at the poll after which the next would be too late: {waited:?}"
    );
    assert_eq!(header(&answer, "Retry-After"), Some("30"), "{answer}");
    assert_eq!(
        header(&answer, "X-Queued"),
        None,
        "our place, not theirs: {answer}"
    );
    let heads = heads.lock().unwrap();
    assert_eq!(heads.len(), 2, "one retry within 45 s");
    assert!(
        !heads[0].1.to_ascii_lowercase().contains("x-queued"),
        "{}",
        heads[0].1
    );
    assert!(
        !heads[0].1.to_ascii_lowercase().contains("x-node"),
        "{}",
        heads[0].1
    );
}

// ---------------------------------------------------------------------------
// A wait given up upstream (PARQ has no cancel)

#[tokio::test(start_paused = true)]
async fn a_wait_given_up_at_the_head_does_not_keep_the_free_slot_from_the_next() {
    let mut accel = accelerator(QueueConfig::new(1.try_into().unwrap(), 100)).await;
    // A's user agent is on the line: its client proxy answers it by 45 s.
    let impatient = client(
        accel.addr,
        QueueWaitConfig {
            held_max: Duration::from_secs(45),
            ..waits(300)
        },
    )
    .await;
    let patient = client(accel.addr, waits(600)).await;
    let started = Instant::now();
    let a = tokio::spawn(exchange(impatient.addr, get("/a", "")));
    until("A waits", || impatient.handler.queue_waits().waiting() == 1).await;
    let b = tokio::spawn(exchange(patient.addr, get("/b", "")));
    until("B waits", || patient.handler.queue_waits().waiting() == 1).await;

    // A gives up at its poll at 30 s (the next, at 60 s, would be too
    // late), leaving its place at the head upstream until its lifetime
    // lapses (Retry-After 30 s + 300 s).
    let a = a.await.unwrap();
    assert!(a.starts_with("HTTP/1.1 503"), "{a}");
    accel.free_the_slot().await;
    let origin = &accel.origin;

    // The slot waits for A only until its Retry-After and a grace (70 s):
    // B, at position 2, polls at 50 s (held for A) and at 100 s (served).
    let b = b.await.unwrap();
    assert!(b.starts_with("HTTP/1.1 200"), "{b}");
    let waited = started.elapsed();
    assert!(
        waited < Duration::from_secs(120),
        "B served at {waited:?}, not when A's place lapsed (about 350 s)"
    );
    assert_eq!(*origin.paths.lock().unwrap(), ["/slow", "/b"]);
}

// ---------------------------------------------------------------------------
// A-11: the stats are for anyone who reaches the proxy

#[tokio::test(start_paused = true)]
async fn a_11_the_stats_show_waits_by_place_never_by_url_or_query() {
    let mut accel = accelerator(QueueConfig::new(1.try_into().unwrap(), 100)).await;
    let (relayed, _log) = relay(accel.addr, false).await;
    let client = client(relayed, waits(300)).await;
    let waiting = client.handler.queue_waits().clone();
    let alice = tokio::spawn(exchange(
        client.addr,
        get("/account/statement?token=alice-secret-token", BROWSER),
    ));
    until("Alice waits", || waiting.waiting() == 1).await;

    let now = stats(client.addr).await;
    let text = now.to_string();
    assert_eq!(now["queue_waiting"], 1, "{now}");
    assert_eq!(now["queue"][0]["position"], 1, "{now}");
    for private in [
        "alice-secret-token",
        "/account",
        "statement",
        "session=alice",
    ] {
        assert!(!text.contains(private), "{private} in the stats: {now}");
    }
    accel.free_the_slot().await;
    alice.abort();
}
