//! Upload slots end to end (issue 5, L-9): the accelerator with one slot in
//! front of an origin whose `/slow` body ends only when the test says so.
//! While it holds the slot, clients are queued in arrival order and served
//! in that order, PARQ, legacy and passive alike; a newcomer never
//! overtakes them; auth comes before a place.

mod support;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::Frame;
use rproxy::accelerator::{Accelerator, AcceleratorConfig};
use rproxy::http::auth::{AuthFile, AuthGate, Authenticator, basic_credentials};
use rproxy::http::server::{BodyError, Handler, ProxyBody, RequestBody};
use rproxy::queue::QueueConfig;
use support::topology::{Listen, Server, accelerator_config, serve};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{Mutex, mpsc};

/// `/slow` sends one chunk, then its end once the test sends on `finish`;
/// anything else is a short body. Counts requests.
struct Origin {
    finish: Mutex<Option<mpsc::Receiver<()>>>,
    requests: AtomicUsize,
    /// Requests that arrived with a queue header (they belong to the
    /// client-accelerator hop).
    queue_headers: AtomicUsize,
}

impl Handler for Origin {
    async fn handle(self: Arc<Self>, request: Request<RequestBody>) -> Response<ProxyBody> {
        self.requests.fetch_add(1, Ordering::SeqCst);
        if ["x-queue", "x-queued", "x-node"]
            .iter()
            .any(|name| request.headers().contains_key(*name))
        {
            self.queue_headers.fetch_add(1, Ordering::SeqCst);
        }
        if request.uri().path() != "/slow" {
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
                .send(Ok(Frame::data(Bytes::from_static(b"first half\n"))))
                .await;
            let _ = finish.recv().await;
            let _ = tx
                .send(Ok(Frame::data(Bytes::from_static(b"second half\n"))))
                .await;
        });
        let stream = tokio_stream_from(rx);
        Response::new(BodyExt::boxed(StreamBody::new(stream)))
    }
}

fn tokio_stream_from(
    rx: mpsc::Receiver<Result<Frame<Bytes>, BodyError>>,
) -> impl futures_core::Stream<Item = Result<Frame<Bytes>, BodyError>> {
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
    Receiver(rx)
}

struct Stack {
    addr: SocketAddr,
    origin: Server<Origin>,
    finish: mpsc::Sender<()>,
    _gate: Server<AuthGate<Accelerator>>,
}

async fn start(state: Option<std::path::PathBuf>) -> Stack {
    start_with(state, |_| {}).await
}

/// [`start`] with the queue settings changed by `tweak`.
async fn start_with(
    state: Option<std::path::PathBuf>,
    tweak: impl FnOnce(&mut QueueConfig),
) -> Stack {
    let (finish, finish_rx) = mpsc::channel(1);
    let origin = Arc::new(Origin {
        finish: Mutex::new(Some(finish_rx)),
        requests: AtomicUsize::new(0),
        queue_headers: AtomicUsize::new(0),
    });
    let origin = serve(origin, Listen::default()).await;
    let mut queue = QueueConfig::new(1.try_into().unwrap(), 100);
    // Retries come at once here rather than after Retry-After (30 s).
    queue.retry_slack = Duration::from_secs(600);
    tweak(&mut queue);
    let accelerator = Accelerator::new(AcceleratorConfig {
        basis_store_bytes: 0,
        max_stored_body: 0,
        queue: Some(queue),
        queue_state: state,
        max_encoders: 0,
        ..accelerator_config(origin.addr)
    })
    .unwrap();
    let mut users = AuthFile::default();
    users.set("alice", "wonderland").unwrap();
    let gate = AuthGate::new(
        accelerator,
        Some(Authenticator::new(&users, "rproxy").unwrap()),
    );
    let slots = gate.role().slots().cloned();
    let gate = serve(Arc::new(gate), Listen::default())
        .await
        .with_slot_timer(slots.as_ref());
    Stack {
        addr: gate.addr,
        origin,
        finish,
        _gate: gate,
    }
}

fn request(path: &str, extra: &str) -> String {
    let credentials = basic_credentials("alice", "wonderland");
    format!(
        "GET {path} HTTP/1.1\r\nHost: site.test\r\nConnection: close\r\nProxy-Authorization: {}\r\n{extra}\r\n",
        credentials.to_str().unwrap()
    )
}

/// One request on its own connection, read to the close.
async fn exchange(addr: SocketAddr, request: &str) -> String {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut answer))
        .await
        .expect("an answer within 5 s")
        .unwrap();
    String::from_utf8_lossy(&answer).into_owned()
}

fn header<'a>(answer: &'a str, name: &str) -> Option<&'a str> {
    answer.lines().find_map(|line| {
        let (n, v) = line.split_once(':')?;
        n.eq_ignore_ascii_case(name).then(|| v.trim())
    })
}

/// `(position, ID)` of a queued answer.
fn place(answer: &str) -> (u32, String) {
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    let queued = header(answer, "X-Queued").unwrap_or_else(|| panic!("no X-Queued: {answer}"));
    let field = |name: &str| {
        queued
            .split(';')
            .find_map(|f| f.trim().strip_prefix(name)?.strip_prefix('='))
            .unwrap_or_else(|| panic!("no {name} in {queued}"))
            .to_owned()
    };
    (field("position").parse().unwrap(), field("ID"))
}

fn retry(path: &str, position: u32, id: &str) -> String {
    request(
        path,
        &format!("X-Queue: 1.0\r\nX-Queued: position={position}; ID={id}\r\n"),
    )
}

#[tokio::test]
async fn l9_queued_clients_are_served_first_come_first_served() {
    let stack = start(None).await;

    // A holds the one slot: its body is under way.
    let mut holder = TcpStream::connect(stack.addr).await.unwrap();
    holder
        .write_all(request("/slow", "").as_bytes())
        .await
        .unwrap();
    let mut first = [0; 1024];
    let n = holder.read(&mut first).await.unwrap();
    assert!(
        first[..n].starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&first[..n])
    );

    // B then C are queued, in that order, with Retry-After.
    let b = exchange(stack.addr, &request("/b", "X-Queue: 1.0\r\n")).await;
    let (b_position, b_id) = place(&b);
    assert_eq!(b_position, 1);
    assert!(header(&b, "Retry-After").is_some(), "{b}");
    assert_eq!(header(&b, "X-Queue"), Some("1.0"), "{b}");
    let c = exchange(stack.addr, &request("/c", "X-Queue: 1.0\r\n")).await;
    let (c_position, c_id) = place(&c);
    assert_eq!(c_position, 2);
    assert_ne!(b_id, c_id);

    // A stranger takes no place.
    let stranger = exchange(
        stack.addr,
        "GET /d HTTP/1.1\r\nHost: site.test\r\nConnection: close\r\nX-Queue: 1.0\r\n\r\n",
    )
    .await;
    assert!(stranger.starts_with("HTTP/1.1 407"), "{stranger}");

    // The slot frees; C asks first but B is ahead: C keeps waiting.
    stack.finish.send(()).await.unwrap();
    let mut rest = Vec::new();
    holder.read_to_end(&mut rest).await.unwrap();
    let c = exchange(stack.addr, &retry("/c", c_position, &c_id)).await;
    assert_eq!(place(&c), (2, c_id.clone()), "C does not overtake B");
    // A newcomer queues behind both.
    let e = exchange(stack.addr, &request("/e", "X-Queue: 1.0\r\n")).await;
    assert_eq!(place(&e).0, 3);

    let b = exchange(stack.addr, &retry("/b", b_position, &b_id)).await;
    assert!(b.starts_with("HTTP/1.1 200"), "B is served first: {b}");
    // C repeats the position it was last told (PARQ: a different one
    // would lose the place).
    let c = exchange(stack.addr, &retry("/c", 2, &c_id)).await;
    assert!(c.starts_with("HTTP/1.1 200"), "then C: {c}");
    assert_eq!(
        stack.origin.requests.load(Ordering::SeqCst),
        3,
        "A, B and C reached the origin"
    );
    assert_eq!(stack.origin.queue_headers.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn one_address_cannot_fill_the_queue() {
    let stack = start_with(None, |queue| queue.per_address_max = 2).await;
    let mut holder = TcpStream::connect(stack.addr).await.unwrap();
    holder
        .write_all(request("/slow", "").as_bytes())
        .await
        .unwrap();
    let mut first = [0; 1024];
    let _ = holder.read(&mut first).await.unwrap();

    // Every request comes from 127.0.0.1. Asking again for /b without the
    // ID gives back the same place, not a second one.
    let b = place(&exchange(stack.addr, &request("/b", "X-Queue: 1.0\r\n")).await);
    assert_eq!(b.0, 1);
    for _ in 0..3 {
        let again = exchange(stack.addr, &request("/b", "X-Queue: 1.0\r\n")).await;
        assert_eq!(place(&again), b, "the same entry for the same URL");
    }
    let c = place(&exchange(stack.addr, &request("/c", "X-Queue: 1.0\r\n")).await);
    assert_eq!(c.0, 2, "/b holds one place, however often it was asked");
    assert_ne!(c.1, b.1);

    // The address holds its two: a third URL, in any dialect, gets a plain
    // 503 with Retry-After and no place.
    for extra in ["X-Queue: 1.0\r\n", ""] {
        let refused = exchange(stack.addr, &request("/d", extra)).await;
        assert!(refused.starts_with("HTTP/1.1 503"), "{refused}");
        assert!(header(&refused, "Retry-After").is_some(), "{refused}");
        assert!(header(&refused, "X-Queued").is_none(), "{refused}");
    }
    // Its places are intact: /b is still first.
    let b_again = exchange(stack.addr, &retry("/b", b.0, &b.1)).await;
    assert_eq!(place(&b_again), b);
    assert_eq!(stack.origin.requests.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn queued_places_survive_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("queue");
    let stack = start(Some(state.clone())).await;
    let mut holder = TcpStream::connect(stack.addr).await.unwrap();
    holder
        .write_all(request("/slow", "").as_bytes())
        .await
        .unwrap();
    let mut first = [0; 1024];
    let _ = holder.read(&mut first).await.unwrap();
    let mut places = Vec::new();
    for path in ["/b", "/c"] {
        let queued = exchange(stack.addr, &request(path, "X-Queue: 1.0\r\n")).await;
        places.push(place(&queued));
    }
    // Saved within a tick (1 s); a new accelerator reloads both places.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let reloaded = rproxy::accelerator::slots::Slots::new(
        QueueConfig::new(1.try_into().unwrap(), 100),
        Some(state.clone()),
    );
    assert_eq!(reloaded.queued(), 2);
    // With their URLs: a request for /b without its ID (a user agent
    // asking again) finds /b's place rather than making a second one.
    let copy = dir.path().join("queue-copy");
    std::fs::copy(&state, &copy).unwrap();
    let restarted = start_with(Some(copy), |queue| {
        queue.retry_slack = Duration::from_secs(1);
    })
    .await;
    let again = exchange(restarted.addr, &request("/b", "X-Queue: 1.0\r\n")).await;
    assert_eq!(place(&again), places[0], "the same place for the same URL");
    let other = exchange(restarted.addr, &request("/d", "X-Queue: 1.0\r\n")).await;
    assert_eq!(place(&other).0, 3);
    // A torn file is refused, not trusted: the queue starts empty.
    let bytes = std::fs::read(&state).unwrap();
    std::fs::write(&state, &bytes[..bytes.len() / 2]).unwrap();
    let torn = rproxy::accelerator::slots::Slots::new(
        QueueConfig::new(1.try_into().unwrap(), 100),
        Some(state),
    );
    assert_eq!(torn.queued(), 0);
}

/// A log written by `tracing` into memory.
#[derive(Clone, Default)]
struct Captured(Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// `Slots::new` on `state`, with what it logged.
fn reload_logged(state: &std::path::Path) -> (rproxy::accelerator::slots::Slots, String) {
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .finish();
    let slots = tracing::subscriber::with_default(subscriber, || {
        rproxy::accelerator::slots::Slots::new(
            QueueConfig::new(1.try_into().unwrap(), 100),
            Some(state.to_owned()),
        )
    });
    let log = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
    (slots, log)
}

/// The state file as version 1 wrote it: records without the URL digest
/// (78 bytes each in version 2, 70 in version 1), re-signed.
fn as_version_1(bytes: &[u8]) -> Vec<u8> {
    let count = u32::from_be_bytes(bytes[13..17].try_into().unwrap()) as usize;
    assert_eq!(bytes.len(), 17 + count * 78 + 32, "a version 2 file");
    let mut out = bytes[..17].to_vec();
    out[4] = 1;
    for i in 0..count {
        out.extend_from_slice(&bytes[17 + i * 78..17 + i * 78 + 70]);
    }
    let checksum = blake3::hash(&out);
    out.extend_from_slice(checksum.as_bytes());
    out
}

#[tokio::test]
async fn a_state_file_of_version_1_is_read_and_an_unknown_version_refused_with_a_log_line() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("queue");
    let stack = start(Some(state.clone())).await;
    let mut holder = TcpStream::connect(stack.addr).await.unwrap();
    holder
        .write_all(request("/slow", "").as_bytes())
        .await
        .unwrap();
    let mut first = [0; 1024];
    let _ = holder.read(&mut first).await.unwrap();
    for path in ["/b", "/c", "/d"] {
        place(&exchange(stack.addr, &request(path, "X-Queue: 1.0\r\n")).await);
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let saved = std::fs::read(&state).unwrap();
    assert_eq!(saved[4], 2, "version 2 is written");

    let old = dir.path().join("queue-v1");
    std::fs::write(&old, as_version_1(&saved)).unwrap();
    let (slots, log) = reload_logged(&old);
    assert_eq!(slots.queued(), 3, "{log}");
    assert!(log.contains("queue reloaded"), "{log}");

    let mut future = saved.clone();
    future[4] = 3;
    let body = future.len() - 32;
    let checksum = blake3::hash(&future[..body]);
    future[body..].copy_from_slice(checksum.as_bytes());
    let unknown = dir.path().join("queue-v3");
    std::fs::write(&unknown, future).unwrap();
    let (slots, log) = reload_logged(&unknown);
    assert_eq!(slots.queued(), 0, "refused: the queue starts empty");
    assert!(
        log.contains("saved queue not used") && log.contains("format version 3 is not supported"),
        "{log}"
    );
}

/// A client of one dialect, as the mixed test drives it.
enum Client {
    /// PARQ: comes back with the ID and the position it was last told.
    Parq {
        path: String,
        id: String,
        position: u32,
    },
    /// Legacy Active Queueing 0.1: polls on the connection it keeps.
    Legacy { path: String, stream: TcpStream },
    /// Passive: no `X-Queue`; known by its own source address.
    Passive {
        path: String,
        from: std::net::IpAddr,
    },
}

/// One response read off a persistent connection: the head, then a body
/// by `Content-Length` or chunked to its last chunk.
async fn read_response(stream: &mut TcpStream) -> String {
    let mut buffer = Vec::new();
    let read = async {
        loop {
            let mut headers = [httparse::EMPTY_HEADER; 32];
            let mut parsed = httparse::Response::new(&mut headers);
            if let httparse::Status::Complete(head) = parsed.parse(&buffer).unwrap() {
                let value = |name: &str| {
                    parsed
                        .headers
                        .iter()
                        .find(|h| h.name.eq_ignore_ascii_case(name))
                        .map(|h| String::from_utf8_lossy(h.value).into_owned())
                };
                let done = match (value("content-length"), value("transfer-encoding")) {
                    (Some(len), _) => buffer.len() >= head + len.parse::<usize>().unwrap(),
                    (None, Some(te)) if te.eq_ignore_ascii_case("chunked") => {
                        buffer.ends_with(b"\r\n0\r\n\r\n")
                    }
                    _ => panic!("no body length: {}", String::from_utf8_lossy(&buffer)),
                };
                if done {
                    return;
                }
            }
            let mut chunk = [0; 4096];
            let n = stream.read(&mut chunk).await.unwrap();
            assert!(
                n > 0,
                "closed mid-response: {}",
                String::from_utf8_lossy(&buffer)
            );
            buffer.extend_from_slice(&chunk[..n]);
        }
    };
    tokio::time::timeout(Duration::from_secs(5), read)
        .await
        .expect("an answer within 5 s");
    String::from_utf8_lossy(&buffer).into_owned()
}

/// The position a `503` tells its client, whatever the dialect: PARQ's
/// `X-Queued`, legacy's `X-Queue: position=…`, passive's text (passive
/// answers carry only `Retry-After`, which must match the position).
fn position_told(client: &Client, answer: &str) -> u32 {
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    match client {
        Client::Parq { .. } => place(answer).0,
        Client::Legacy { .. } => {
            let status = header(answer, "X-Queue").unwrap_or_else(|| panic!("{answer}"));
            status
                .split(',')
                .find_map(|f| f.strip_prefix("position="))
                .unwrap_or_else(|| panic!("no position in {status}"))
                .parse()
                .unwrap()
        }
        Client::Passive { .. } => {
            assert!(header(answer, "X-Queue").is_none(), "{answer}");
            let position: u32 = answer
                .split("position ")
                .nth(1)
                .and_then(|rest| rest.split(' ').next())
                .unwrap_or_else(|| panic!("no position in {answer}"))
                .parse()
                .unwrap();
            let retry_after = rproxy::queue::parq::passive_retry_after(position).as_secs();
            assert_eq!(
                header(answer, "Retry-After"),
                Some(retry_after.to_string().as_str()),
                "{answer}"
            );
            position
        }
    }
}

impl Client {
    fn name(&self) -> &str {
        match self {
            Client::Parq { path, .. }
            | Client::Legacy { path, .. }
            | Client::Passive { path, .. } => path,
        }
    }

    /// Asks (again) in the client's dialect; a PARQ client keeps the
    /// position it is told for its next retry.
    async fn ask(&mut self, addr: SocketAddr) -> String {
        match self {
            Client::Parq { path, id, position } => {
                let answer = exchange(addr, &retry(path, *position, id)).await;
                if answer.starts_with("HTTP/1.1 503") {
                    let (told, same_id) = place(&answer);
                    assert_eq!(&same_id, id, "{answer}");
                    *position = told;
                }
                answer
            }
            Client::Legacy { path, stream } => {
                stream
                    .write_all(legacy_request(path).as_bytes())
                    .await
                    .unwrap();
                read_response(stream).await
            }
            Client::Passive { path, from } => passive_exchange(addr, *from, path).await,
        }
    }
}

/// A legacy request: `X-Queue: 0.1` on a connection kept open.
fn legacy_request(path: &str) -> String {
    request(path, "X-Queue: 0.1\r\n").replace("Connection: close\r\n", "")
}

/// A request without `X-Queue` from `from`, on its own connection.
async fn passive_exchange(addr: SocketAddr, from: std::net::IpAddr, path: &str) -> String {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind(SocketAddr::new(from, 0)).unwrap();
    let mut stream = socket.connect(addr).await.unwrap();
    stream
        .write_all(request(path, "").as_bytes())
        .await
        .unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut answer))
        .await
        .expect("an answer within 5 s")
        .unwrap();
    String::from_utf8_lossy(&answer).into_owned()
}

/// L-9 across dialects: PARQ, legacy and passive clients queue
/// interleaved behind one busy slot, and once it frees they are served in
/// arrival order however they ask, later arrivals asking first each round.
#[tokio::test]
async fn l9_clients_of_every_dialect_are_served_first_come_first_served() {
    let stack = start(None).await;
    let mut holder = TcpStream::connect(stack.addr).await.unwrap();
    holder
        .write_all(request("/slow", "").as_bytes())
        .await
        .unwrap();
    let mut first = [0; 1024];
    let n = holder.read(&mut first).await.unwrap();
    assert!(first[..n].starts_with(b"HTTP/1.1 200"));

    // Arrival: B1, L1, P1, B2, L2, P2, each told the next position.
    let mut clients = Vec::new();
    for round in 1..=2u8 {
        let path = format!("/b{round}");
        let answer = exchange(stack.addr, &request(&path, "X-Queue: 1.0\r\n")).await;
        let (position, id) = place(&answer);
        clients.push(Client::Parq { path, id, position });

        let path = format!("/l{round}");
        let mut stream = TcpStream::connect(stack.addr).await.unwrap();
        stream
            .write_all(legacy_request(&path).as_bytes())
            .await
            .unwrap();
        let answer = read_response(&mut stream).await;
        assert!(
            header(&answer, "Connection").is_none(),
            "kept open: {answer}"
        );
        let status = header(&answer, "X-Queue").unwrap_or_else(|| panic!("{answer}"));
        assert!(
            status.contains(",limit=1,pollMin=45,pollMax=120"),
            "{answer}"
        );
        clients.push(Client::Legacy { path, stream });
        let last = clients.len() - 1;
        assert_eq!(position_told(&clients[last], &answer), last as u32 + 1);

        let path = format!("/p{round}");
        let from = std::net::IpAddr::from([127, 0, 0, 1 + round]);
        let answer = passive_exchange(stack.addr, from, &path).await;
        clients.push(Client::Passive { path, from });
        let last = clients.len() - 1;
        assert_eq!(position_told(&clients[last], &answer), last as u32 + 1);
    }
    for (i, client) in clients.iter().enumerate() {
        if let Client::Parq { position, .. } = client {
            assert_eq!(*position, i as u32 + 1, "{}", client.name());
        }
    }

    // The slot frees.
    stack.finish.send(()).await.unwrap();
    let mut rest = Vec::new();
    holder.read_to_end(&mut rest).await.unwrap();

    // Each round every waiting client asks, the latest arrival first: only
    // the earliest is served; the others keep their order, moved up by
    // the one served before them.
    let mut served = Vec::new();
    while !clients.is_empty() {
        let waiting = clients.len() as u32;
        for (i, client) in clients.iter_mut().enumerate().rev() {
            let answer = client.ask(stack.addr).await;
            if i == 0 {
                assert!(
                    answer.starts_with("HTTP/1.1 200") && answer.ends_with("quick\n"),
                    "{} is served after {served:?}: {answer}",
                    client.name()
                );
            } else {
                assert_eq!(
                    position_told(client, &answer),
                    i as u32 + 1,
                    "{} waits behind the earlier ones, {served:?} served: {answer}",
                    client.name()
                );
                if let Client::Legacy { .. } = client {
                    let status = header(&answer, "X-Queue").unwrap();
                    assert!(status.contains(&format!("length={waiting}")), "{answer}");
                }
            }
        }
        served.push(clients.remove(0).name().to_owned());
    }
    assert_eq!(served, ["/b1", "/l1", "/p1", "/b2", "/l2", "/p2"]);
    assert_eq!(
        stack.origin.requests.load(Ordering::SeqCst),
        7,
        "the holder and the six queued clients, each once"
    );
    assert_eq!(stack.origin.queue_headers.load(Ordering::SeqCst), 0);
}
