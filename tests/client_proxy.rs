//! The client proxy over real sockets: a scripted origin on 127.0.0.1:0,
//! the accelerator in front of it, a recording tap between accelerator and
//! client proxy (it can also cut a stream in half), and the client proxy
//! with a temp-dir cache, asked as `curl -x` asks (absolute-form) and as a
//! gateway (origin-form). Some tests put a plain origin, or a hostile
//! "accelerator" written here, straight behind the client proxy.
//!
//! Each test checks bytes, status and headers the user agent got (never an
//! hsync coding or header: every reply goes through [`send`]), the cache
//! state, the proxy's counters and what the servers behind it saw. Covers
//! D-A1 (small bodies), D-A4, D-A5 (both branches), D-A7, D-A8, C-W2,
//! C-W3, P-12, P-15, P-16, P-20, P-22, P-23, A-6, A-9 and D-B1 of
//! RELIABILITY.md.

mod support;

use std::collections::VecDeque;
use std::future::Future;
use std::io::{Read, Write};
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::{Frame, Incoming};
use hyper_util::rt::TokioIo;
use rproxy::accelerator::AcceleratorConfig;
use rproxy::cache::freshness::SetCookie;
use rproxy::cache::{CacheKey, Completeness, IndexEntry};
use rproxy::client_proxy::{ClientConfig, StatsSnapshot};
use rproxy::hsync::{Encoder, EncoderOptions};
use rproxy::http::headers::{byte_sequence, parse_byte_sequence};
use rproxy::http::server::{BodyError, ProxyBody};
use sha2::Digest;
use support::topology::{Accelerator, Cache, Listen, accelerator_config, origin};
use support::{accelerator_signature, pseudo_text, reference_signature};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

// ---------------------------------------------------------------------------
// Test data

const BODY_LEN: usize = 200_000;

/// A body the client relays whole (under `transfer::WHOLE_BELOW`), where
/// [`BODY_LEN`] streams.
const SMALL_LEN: usize = 20_000;

/// Release `n` (1..=3) of a script: each release inserts a line into the
/// previous one, so consecutive releases differ by a few dozen bytes.
/// 6 MiB of text: past its first MiB the client writes it to the cache
/// from a thread of its own.
fn large_body() -> &'static [u8] {
    static BODY: OnceLock<Vec<u8>> = OnceLock::new();
    BODY.get_or_init(|| pseudo_text(5, 6 << 20))
}

/// Version `n` (1 or 2) of 1 MiB that does not compress: the second has
/// 100 bytes changed.
fn blob(n: usize) -> &'static [u8] {
    static BLOBS: OnceLock<[Vec<u8>; 2]> = OnceLock::new();
    let blobs = BLOBS.get_or_init(|| {
        let first = support::random_bytes(9, 1 << 20);
        let mut second = first.clone();
        second[300_000..300_100].fill(b'x');
        [first, second]
    });
    &blobs[n - 1]
}

fn release(n: usize) -> &'static [u8] {
    static RELEASES: OnceLock<Vec<Vec<u8>>> = OnceLock::new();
    let releases = RELEASES.get_or_init(|| {
        let mut body = pseudo_text(1, BODY_LEN);
        let mut all = vec![body.clone()];
        for (i, at) in [100_000, 150_000].into_iter().enumerate() {
            let line = format!("/* a change in release {} */\n", i + 2);
            body.splice(at..at, line.bytes());
            all.push(body.clone());
        }
        all
    });
    &releases[n - 1]
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    encoder.write_all(bytes).unwrap();
    encoder.finish().unwrap()
}

fn gunzip(bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    flate2::read::GzDecoder::new(bytes)
        .read_to_end(&mut out)
        .unwrap();
    out
}

// ---------------------------------------------------------------------------
// Bodies

fn full(bytes: impl Into<Bytes>) -> ProxyBody {
    Full::new(bytes.into())
        .map_err(|never| match never {})
        .boxed()
}

/// One step of a [`ScriptedBody`].
enum Step {
    Data(Bytes),
    /// Lets hyper flush what it has before the next step.
    Pause(Duration),
    /// Makes hyper abort the connection mid-body (no last chunk).
    Fail(&'static str),
}

/// A response body that plays its steps in order.
struct ScriptedBody {
    steps: VecDeque<Step>,
    sleep: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl ScriptedBody {
    fn new(steps: impl IntoIterator<Item = Step>) -> ScriptedBody {
        ScriptedBody {
            steps: steps.into_iter().collect(),
            sleep: None,
        }
    }
}

impl hyper::body::Body for ScriptedBody {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        loop {
            if let Some(sleep) = &mut self.sleep {
                std::task::ready!(sleep.as_mut().poll(cx));
                self.sleep = None;
            }
            return Poll::Ready(match self.steps.pop_front() {
                None => None,
                Some(Step::Data(data)) => Some(Ok(Frame::data(data))),
                Some(Step::Fail(message)) => Some(Err(BodyError::from(message))),
                Some(Step::Pause(pause)) => {
                    self.sleep = Some(Box::pin(tokio::time::sleep(pause)));
                    continue;
                }
            });
        }
    }
}

fn respond(status: StatusCode, headers: &[(&str, &str)], body: ProxyBody) -> Response<ProxyBody> {
    let mut response = Response::new(body);
    *response.status_mut() = status;
    for (name, value) in headers {
        response.headers_mut().append(
            http::header::HeaderName::from_bytes(name.as_bytes()).unwrap(),
            HeaderValue::from_str(value).unwrap(),
        );
    }
    response
}

fn ok(headers: &[(&str, &str)], body: impl Into<Bytes>) -> Response<ProxyBody> {
    respond(StatusCode::OK, headers, full(body))
}

// ---------------------------------------------------------------------------
// Scripted servers: origin, tap, hostile accelerator

/// A scripted HTTP/1.1 server on 127.0.0.1:0 that logs every request.
type Server = support::topology::Origin;

fn if_none_match_has(request: &Request<Incoming>, tag: &str) -> bool {
    request
        .headers()
        .get("if-none-match")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains(tag))
}

/// The origin's routes. `earlier` counts earlier requests for the path.
async fn origin_reply(request: Request<Incoming>, earlier: usize) -> Response<ProxyBody> {
    let path = request.uri().path().to_owned();
    match path.as_str() {
        "/app-1.js" | "/private/app-1.js" | "/cookie/app-1.js" => {
            let mut headers = vec![];
            if path.starts_with("/private/") {
                headers.push(("cache-control", "private"));
            }
            if path.starts_with("/cookie/") {
                headers.push(("set-cookie", "session=alice-secret"));
            }
            ok(&headers, release(1))
        }
        "/app-2.js" | "/private/app-2.js" | "/cookie/app-2.js" => ok(&[], release(2)),
        "/cookie/app-3.js" => ok(&[], release(3)),
        "/authorized.js" => ok(&[("cache-control", "public, no-cache")], release(1)),
        "/fresh.js" | "/head.js" => ok(
            &[("cache-control", "max-age=60"), ("etag", "\"f1\"")],
            release(1),
        ),
        // F-6: two versions per case.
        path if path.starts_with("/f6/") => {
            let mut parts = path.split('/').skip(2);
            let case: u64 = parts.next().unwrap().parse().unwrap();
            let version = if parts.next() == Some("v1.js") { 1 } else { 2 };
            ok(&[], f6_version(case, version))
        }
        // L-10: hot keys with a TTL of one second.
        path if path.starts_with("/ttl1/") => ok(
            &[("cache-control", "max-age=1"), ("etag", "\"t1\"")],
            Bytes::from(format!("{path} is hot")),
        ),
        "/etag.js" if if_none_match_has(&request, "\"e1\"") => respond(
            StatusCode::NOT_MODIFIED,
            &[("cache-control", "max-age=0"), ("etag", "\"e1\"")],
            full(Bytes::new()),
        ),
        "/etag.js" => ok(
            &[("cache-control", "max-age=0"), ("etag", "\"e1\"")],
            release(1),
        ),
        // A-9: revalidated on every use; the 304 brings what it brings.
        "/sliding.js" | "/turns-private.js" | "/turns-vary.js"
            if if_none_match_has(&request, "\"r1\"") =>
        {
            let mut headers = vec![("etag", "\"r1\"")];
            match path.as_str() {
                // A sliding session: her cookie, renewed, on the 304.
                "/sliding.js" => headers.extend([
                    ("cache-control", "max-age=60"),
                    ("set-cookie", "session=alice-renewed"),
                ]),
                "/turns-private.js" => headers.push(("cache-control", "private, max-age=60")),
                _ => headers.extend([("cache-control", "max-age=60"), ("vary", "cookie")]),
            }
            respond(StatusCode::NOT_MODIFIED, &headers, full(Bytes::new()))
        }
        "/sliding.js" | "/turns-private.js" | "/turns-vary.js" => ok(
            &[("cache-control", "max-age=0"), ("etag", "\"r1\"")],
            release(1),
        ),
        // Release 1 first, release 2 from then on.
        "/changing.js" if earlier == 0 => ok(
            &[("cache-control", "max-age=0"), ("etag", "\"c1\"")],
            release(1),
        ),
        "/changing.js" => ok(
            &[("cache-control", "max-age=0"), ("etag", "\"c2\"")],
            release(2),
        ),
        "/range.txt" if request.headers().contains_key("range") => respond(
            StatusCode::PARTIAL_CONTENT,
            &[("content-range", &format!("bytes 0-99/{BODY_LEN}"))],
            full(&release(1)[..100]),
        ),
        "/range.txt" => ok(&[], release(1)),
        "/no-store.js" => ok(&[("cache-control", "no-store")], release(1)),
        "/large.txt" => ok(&[("cache-control", "max-age=60")], large_body()),
        "/blob-1.bin" | "/blob-2.bin" => {
            let n = if path == "/blob-1.bin" { 1 } else { 2 };
            let mut response = ok(&[], blob(n).to_vec());
            response.headers_mut().insert(
                "content-type",
                HeaderValue::from_static("application/octet-stream"),
            );
            response
        }
        "/gzip.js" => ok(
            &[
                ("content-encoding", "gzip"),
                ("cache-control", "max-age=60"),
            ],
            gzip(release(1)),
        ),
        "/post.js" if request.method() == Method::POST => {
            let body = request.into_body().collect().await.unwrap().to_bytes();
            let mut echo = b"posted: ".to_vec();
            echo.extend_from_slice(&body);
            ok(&[], echo)
        }
        "/post.js" => ok(&[("cache-control", "max-age=60")], release(1)),
        "/broken" => respond(
            StatusCode::INTERNAL_SERVER_ERROR,
            &[("cache-control", "max-age=60")],
            full("boom"),
        ),
        "/slow.js" => {
            tokio::time::sleep(Duration::from_millis(300)).await;
            ok(&[("cache-control", "max-age=60")], release(1))
        }
        "/stall.js" => {
            if earlier == 0 {
                tokio::time::sleep(Duration::from_secs(2)).await;
            }
            ok(&[("cache-control", "max-age=60")], release(1))
        }
        "/small.js" => ok(&[("cache-control", "max-age=60")], &release(1)[..SMALL_LEN]),
        "/small-2.js" => ok(&[("cache-control", "max-age=60")], &release(2)[..SMALL_LEN]),
        "/bad-digest-small.js" => {
            use base64::Engine;
            let wrong = sha2::Sha256::digest(b"not the body");
            let wrong = base64::engine::general_purpose::STANDARD.encode(wrong);
            ok(
                &[("content-digest", &format!("sha-256=:{wrong}:"))],
                &release(1)[..SMALL_LEN],
            )
        }
        // Half now, half after longer than the tests' upstream wait.
        "/dribble.js" => {
            let body = Bytes::from_static(&release(1)[..SMALL_LEN]);
            let steps = [
                Step::Data(body.slice(..SMALL_LEN / 2)),
                Step::Pause(Duration::from_millis(1500)),
                Step::Data(body.slice(SMALL_LEN / 2..)),
            ];
            respond(
                StatusCode::OK,
                &[("cache-control", "max-age=60")],
                ScriptedBody::new(steps).boxed(),
            )
        }
        "/hang.js" => {
            tokio::time::sleep(Duration::from_secs(30)).await;
            ok(&[("cache-control", "max-age=60")], release(1))
        }
        // Stale at once; then upstream fails: a 503, or no head in time.
        "/stale-if-error.js" | "/stale-if-error-hang.js" | "/no-stale-if-error.js"
            if earlier == 0 =>
        {
            let cache_control = if path.starts_with("/no-") {
                "max-age=0"
            } else {
                "max-age=0, stale-if-error=60"
            };
            ok(
                &[("cache-control", cache_control), ("etag", "\"s1\"")],
                release(1),
            )
        }
        // Stale at once, within stale-if-error; then a new release, which
        // the tap may cut.
        "/stale-if-error-cut.js" => {
            let (etag, body) = if earlier == 0 {
                ("\"k1\"", release(1))
            } else {
                ("\"k2\"", release(2))
            };
            ok(
                &[
                    ("cache-control", "max-age=0, stale-if-error=60"),
                    ("etag", etag),
                ],
                body,
            )
        }
        "/stale-if-error-hang.js" => {
            tokio::time::sleep(Duration::from_secs(30)).await;
            ok(&[], release(2))
        }
        "/stale-if-error.js" | "/no-stale-if-error.js" => respond(
            StatusCode::SERVICE_UNAVAILABLE,
            &[("retry-after", "5")],
            full("down for maintenance"),
        ),
        "/bad-digest.js" => {
            use base64::Engine;
            let wrong = sha2::Sha256::digest(b"not the body");
            let wrong = base64::engine::general_purpose::STANDARD.encode(wrong);
            ok(
                &[("content-digest", &format!("sha-256=:{wrong}:"))],
                release(1),
            )
        }
        "/cookie-fresh.js" => ok(
            &[
                ("cache-control", "max-age=60"),
                ("set-cookie", "session=alice-secret"),
            ],
            release(1),
        ),
        "/cookie-public.js" => ok(
            &[
                ("cache-control", "public, max-age=60"),
                ("set-cookie", "session=alice-secret"),
            ],
            release(1),
        ),
        _ => respond(StatusCode::NOT_FOUND, &[], full("no such thing")),
    }
}

async fn start_origin() -> Server {
    origin(origin_reply).await
}

async fn start_accelerator(origin: SocketAddr, basis_store_bytes: usize) -> Accelerator {
    Accelerator::start(AcceleratorConfig {
        basis_store_bytes,
        encoder: EncoderOptions {
            zstd_level: 3,
            // Small windows: a stream has many frames, so half of one
            // rebuilds a usable prefix (D-A8).
            window_bytes: 16 << 10,
            basis_window_bytes: 16 << 10,
            ..EncoderOptions::default()
        },
        ..accelerator_config(origin)
    })
    .await
}

/// What the tap does with the accelerator's answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TapMode {
    /// Relay as it is.
    Pass,
    /// Relay the first half of the body, then reset the connection.
    CutHalf,
    /// Relay the body changed as [`mangle`] changes it for this seed, in
    /// pieces of random sizes with pauses between some (F-6).
    Mangle(u64),
}

/// A recording shim between the client proxy and the accelerator.
struct Tap {
    server: Server,
    mode: Arc<Mutex<TapMode>>,
    /// Length of the last body it cut.
    cut_from: Arc<Mutex<usize>>,
}

impl Tap {
    fn set_mode(&self, mode: TapMode) {
        *self.mode.lock().unwrap() = mode;
    }
}

async fn start_tap(target: SocketAddr) -> Tap {
    let mode = Arc::new(Mutex::new(TapMode::Pass));
    let cut_from = Arc::new(Mutex::new(0));
    let (m, c) = (mode.clone(), cut_from.clone());
    let server = origin(move |request, _| {
        let mode = *m.lock().unwrap();
        let cut_from = c.clone();
        async move {
            // The request goes on as it came: absolute-form stays so.
            let stream = TcpStream::connect(target).await.unwrap();
            let (mut sender, connection) =
                hyper::client::conn::http1::handshake(TokioIo::new(stream))
                    .await
                    .unwrap();
            tokio::spawn(connection);
            let response = sender.send_request(request).await.unwrap();
            let (parts, body) = response.into_parts();
            match mode {
                TapMode::Pass => Response::from_parts(parts, body.map_err(BodyError::from).boxed()),
                TapMode::CutHalf => {
                    let whole = body.collect().await.unwrap().to_bytes();
                    *cut_from.lock().unwrap() = whole.len();
                    let half = whole.slice(..whole.len() / 2);
                    let cut = ScriptedBody::new([
                        Step::Data(half),
                        Step::Pause(Duration::from_millis(50)),
                        Step::Fail("tap cut the stream"),
                    ]);
                    Response::from_parts(parts, cut.boxed())
                }
                TapMode::Mangle(seed) => {
                    let whole = body.collect().await.unwrap().to_bytes();
                    let mut rng = support::Rng::new(seed);
                    let mangled = Bytes::from(mangle(&whole, &mut rng));
                    let mut parts = parts;
                    // Whatever length it has now, it ends cleanly: the
                    // client must find out from the stream itself.
                    parts.headers.remove(http::header::CONTENT_LENGTH);
                    Response::from_parts(
                        parts,
                        ScriptedBody::new(pieces(mangled, &mut rng)).boxed(),
                    )
                }
            }
        }
    })
    .await;
    Tap {
        server,
        mode,
        cut_from,
    }
}

// ---------------------------------------------------------------------------
// The client proxy

fn client_config(upstream: SocketAddr) -> ClientConfig {
    ClientConfig {
        via_name: HeaderValue::from_static("test-client"),
        ..support::proxy::client_config(&format!("http://{upstream}"))
    }
}

type Proxy = support::topology::ClientProxy;

impl Proxy {
    fn entry(&self, url: &str) -> Option<IndexEntry> {
        self.store().lookup(&CacheKey::parse(url).unwrap())
    }

    fn stored_len(&self) -> usize {
        self.store().len()
    }

    /// Changes the byte at `at` of `url`'s stored body in place (same
    /// length): bit rot, or a stray write (C-V3).
    fn flip_stored_byte(&self, url: &str, at: usize) {
        let key = CacheKey::parse(url).unwrap();
        let body_file = self
            .store()
            .root()
            .join(key.entry_path())
            .with_extension("body");
        let mut stored = std::fs::read(&body_file).unwrap();
        stored[at] ^= 0x01;
        std::fs::write(&body_file, &stored).unwrap();
    }

    /// The stored body and signature of `url`.
    fn body_and_signature(&self, url: &str) -> (Vec<u8>, Vec<u8>) {
        let mut entry = self
            .store()
            .get(&CacheKey::parse(url).unwrap())
            .expect("stored");
        let mut body = Vec::new();
        entry.body.read_to_end(&mut body).unwrap();
        (body, entry.signature)
    }

    /// Asserts that `url` is stored complete with exactly `body`.
    fn assert_complete(&self, url: &str, body: &[u8]) {
        let entry = self
            .entry(url)
            .unwrap_or_else(|| panic!("{url} not stored"));
        assert_eq!(entry.completeness, Completeness::Complete, "{url}");
        assert_eq!(entry.body_len, body.len() as u64, "{url}");
        assert_eq!(entry.body_blake3, blake3::hash(body), "{url}");
    }

    /// Waits until `url` is stored complete. A plain body with a
    /// Content-Length looks whole to the user agent before the proxy has
    /// committed it (see
    /// `d_a5_a_plain_body_failing_the_origins_content_digest_never_looks_complete`).
    async fn settled(&self, url: &str) {
        eventually(&format!("{url} committed"), || {
            self.entry(url)
                .is_some_and(|e| e.completeness == Completeness::Complete)
        })
        .await;
    }
}

/// origin → accelerator → tap → client proxy.
struct Stack {
    origin: Server,
    _accelerator: Accelerator,
    tap: Tap,
    proxy: Proxy,
}

impl Stack {
    async fn start() -> Stack {
        Stack::start_with(|_| {}).await
    }

    async fn start_with(tweak: impl FnOnce(&mut ClientConfig)) -> Stack {
        Stack::start_keeping(tweak, 16 << 20).await
    }

    /// With an accelerator that keeps `basis_store_bytes` of bodies it
    /// served (0: none, so every basis goes by its signature).
    async fn start_keeping(
        tweak: impl FnOnce(&mut ClientConfig),
        basis_store_bytes: usize,
    ) -> Stack {
        let origin = start_origin().await;
        let accelerator = start_accelerator(origin.addr, basis_store_bytes).await;
        let tap = start_tap(accelerator.addr).await;
        let mut config = client_config(tap.server.addr);
        tweak(&mut config);
        let proxy = Proxy::start(config).await;
        Stack {
            origin,
            _accelerator: accelerator,
            tap,
            proxy,
        }
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.origin.addr)
    }

    async fn get(&self, path: &str) -> Reply {
        send(
            self.proxy.addr,
            forward(Method::GET, self.origin.addr, path),
        )
        .await
    }
}

// ---------------------------------------------------------------------------
// The user agent

/// What the user agent got. `body` is `Err` when the body did not end
/// cleanly.
#[derive(Debug)]
struct Reply {
    status: StatusCode,
    headers: HeaderMap,
    body: Result<Vec<u8>, String>,
}

impl Reply {
    fn body(&self) -> &[u8] {
        self.body.as_deref().expect("a whole body")
    }

    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(|v| v.to_str().unwrap())
    }

    /// Every value of `name`, joined as one list.
    fn list(&self, name: &str) -> String {
        let values: Vec<&str> = self
            .headers
            .get_all(name)
            .iter()
            .map(|v| v.to_str().unwrap())
            .collect();
        values.join(", ")
    }

    fn cache_status(&self) -> &str {
        self.header("cache-status").unwrap_or("")
    }
}

/// A request as `curl -x` sends it: absolute-form target.
fn forward(method: Method, origin: SocketAddr, path: &str) -> Request<Full<Bytes>> {
    Request::builder()
        .method(method)
        .uri(format!("http://{origin}{path}"))
        .header("host", origin.to_string())
        .body(Full::new(Bytes::new()))
        .unwrap()
}

fn with_header(mut request: Request<Full<Bytes>>, name: &str, value: &str) -> Request<Full<Bytes>> {
    request.headers_mut().append(
        http::header::HeaderName::from_bytes(name.as_bytes()).unwrap(),
        HeaderValue::from_str(value).unwrap(),
    );
    request
}

/// Sends one request on a fresh connection (hyper's connection-level
/// client writes the target as given, absolute-form included) and reads
/// the whole answer. Checks that no hsync coding or header reaches the user
/// agent, whatever the test.
async fn send(proxy: SocketAddr, request: Request<Full<Bytes>>) -> Reply {
    let stream = TcpStream::connect(proxy).await.unwrap();
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(connection);
    let response = tokio::time::timeout(Duration::from_secs(10), sender.send_request(request))
        .await
        .expect("a response head in time")
        .expect("a response head");
    let (parts, body) = response.into_parts();
    let body = tokio::time::timeout(Duration::from_secs(10), body.collect())
        .await
        .expect("the body ends or fails in time")
        .map(|b| b.to_bytes().to_vec())
        .map_err(|e| e.to_string());
    let headers = parts.headers;
    assert!(
        !headers.get_all("content-encoding").iter().any(|v| v
            .to_str()
            .unwrap()
            .to_ascii_lowercase()
            .contains("hsync")),
        "an hsync coding reached the user agent: {headers:?}"
    );
    for name in ["hsync-basis", "hsync-signature", "hsync-accept"] {
        assert!(!headers.contains_key(name), "{name} reached the user agent");
    }
    assert!(
        !headers.get_all("vary").iter().any(|v| v
            .to_str()
            .unwrap()
            .to_ascii_lowercase()
            .contains("hsync")),
        "Vary names hsync: {headers:?}"
    );
    Reply {
        status: parts.status,
        headers,
        body,
    }
}

/// Writes a raw request (which should ask for `Connection: close`) and
/// returns the whole answer as text.
async fn raw_exchange(addr: SocketAddr, request: &str) -> String {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut response = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut response))
        .await
        .expect("an answer in time")
        .unwrap();
    String::from_utf8_lossy(&response).into_owned()
}

/// Waits (bounded) for a condition the proxy reaches right after it has
/// aborted a user agent's body: the abort goes out before the relay's
/// report is recorded.
async fn eventually(what: &str, condition: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(3);
    while !condition() {
        assert!(Instant::now() < deadline, "never happened: {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

fn basis_name(body: &[u8]) -> String {
    byte_sequence(blake3::hash(body).as_bytes())
        .to_str()
        .unwrap()
        .to_owned()
}

// ---------------------------------------------------------------------------
// 1. The delta path

#[tokio::test]
async fn a_similar_url_is_the_basis_and_the_new_release_comes_as_a_small_delta() {
    let stack = Stack::start().await;
    let first = stack.get("/app-1.js").await;
    assert_eq!(first.status, StatusCode::OK);
    assert!(first.body() == release(1));
    assert!(first.cache_status().contains("fwd=miss"), "{first:?}");
    assert!(
        first
            .list("via")
            .ends_with("1.1 accel-test, 1.1 test-client")
    );
    let before = stack.proxy.stats();

    let second = stack.get("/app-2.js").await;
    assert_eq!(second.status, StatusCode::OK);
    assert!(second.body() == release(2), "v2 rebuilt exactly");
    let after = stack.proxy.stats();
    assert_eq!(after.deltas, 2, "both came as hsync streams: {after:?}");
    let link = after.upstream_bytes - before.upstream_bytes;
    assert!(
        link < release(2).len() as u64 / 20,
        "{link} bytes on the link for a {} byte body",
        release(2).len()
    );
    // The accelerator kept release 1 (it said so): its digest alone named
    // the basis, without a signature.
    assert_eq!(after.signature_bytes, before.signature_bytes);
    assert_eq!(after.stored, 2);
    assert_eq!(
        after.downstream_bytes,
        (release(1).len() + release(2).len()) as u64
    );

    // The basis was /app-1.js: the longest prefix on the same origin.
    let sent = stack.tap.server.seen_for("/app-2.js");
    assert_eq!(
        sent[0].header("hsync-basis"),
        Some(&*basis_name(release(1)))
    );
    assert!(
        sent[0]
            .header("accept-encoding")
            .unwrap()
            .starts_with("hsync")
    );
    assert!(sent[0].header("via").unwrap().contains("test-client"));
    let none = stack.tap.server.seen_for("/app-1.js");
    assert!(none[0].header("hsync-signature").is_none(), "no basis yet");

    assert_eq!(stack.proxy.stored_len(), 2);
    stack
        .proxy
        .assert_complete(&stack.url("/app-1.js"), release(1));
    stack
        .proxy
        .assert_complete(&stack.url("/app-2.js"), release(2));
    for n in [1, 2] {
        let (body, signature) = stack
            .proxy
            .body_and_signature(&stack.url(&format!("/app-{n}.js")));
        assert!(body == release(n));
        assert!(
            signature == accelerator_signature(release(n)),
            "the stored signature of release {n} is the body's signature"
        );
    }
    assert_eq!(stack.origin.requests(), 2);
}

/// A large body that does not compress comes plain the first time (the
/// accelerator reads its first bytes), is cached and served whole, and is
/// then the basis of the next version, which comes as a small delta.
#[tokio::test]
async fn an_incompressible_body_comes_plain_then_is_the_basis_of_a_delta() {
    let stack = Stack::start().await;
    let first = stack.get("/blob-1.bin").await;
    assert_eq!(first.status, StatusCode::OK);
    assert!(first.body() == blob(1));
    let before = stack.proxy.stats();
    assert_eq!(before.deltas, 0, "plain from the accelerator: {before:?}");
    assert_eq!(before.stored, 1);
    assert!(before.upstream_bytes >= blob(1).len() as u64);

    let second = stack.get("/blob-2.bin").await;
    assert_eq!(second.status, StatusCode::OK);
    assert!(second.body() == blob(2), "rebuilt exactly");
    let after = stack.proxy.stats();
    assert_eq!(after.deltas, 1, "{after:?}");
    let link = after.upstream_bytes - before.upstream_bytes;
    assert!(link < 64 << 10, "{link} bytes on the link for 1 MiB");
    stack
        .proxy
        .assert_complete(&stack.url("/blob-2.bin"), blob(2));
}

/// A large body's cache writes run on their own thread: coded or plain,
/// the user agent gets every byte and the entry is stored whole, with the
/// body's own signature (D-A6).
#[tokio::test]
async fn a_large_body_is_stored_whole_by_the_background_writer() {
    let stack = Stack::start().await;
    let plain = Proxy::start(client_config(stack.origin.addr)).await;
    for (proxy, coded) in [(&stack.proxy, true), (&plain, false)] {
        let url = stack.url("/large.txt");
        let reply = send(
            proxy.addr,
            forward(Method::GET, stack.origin.addr, "/large.txt"),
        )
        .await;
        assert!(reply.body() == large_body(), "coded {coded}");
        proxy.settled(&url).await;
        proxy.assert_complete(&url, large_body());
        let (body, signature) = proxy.body_and_signature(&url);
        assert!(body == large_body(), "coded {coded}");
        // The signature of the body with the block size it declares (a
        // plain body's depends on whether its length was announced).
        let block_size = u32::from_be_bytes(signature[4..8].try_into().unwrap());
        assert!(
            signature == reference_signature(large_body(), block_size),
            "coded {coded}: the stored signature is the body's"
        );
        let hit = send(
            proxy.addr,
            forward(Method::GET, stack.origin.addr, "/large.txt"),
        )
        .await;
        assert!(hit.cache_status().contains("hit"), "coded {coded}: {hit:?}");
        assert!(hit.body() == large_body(), "coded {coded}");
    }
    assert_eq!(stack.proxy.stats().deltas, 1, "the coded fetch was hsync");
    assert_eq!(stack.origin.requests_to("/large.txt"), 2);
}

/// C-E1 on the background writer: a body larger than the cache's budget
/// fails its writes after the first MiB, on the writer's thread. The user
/// agent still gets every byte, and nothing is stored, then or later.
#[tokio::test]
async fn a_cache_write_failing_in_the_background_still_serves_every_byte() {
    let stack = Stack::start().await;
    let proxy = Proxy::start_with(
        client_config(stack.tap.server.addr),
        Cache::Temp(3 << 20),
        Listen::default(),
    )
    .await;
    let url = stack.url("/large.txt");
    for _ in 0..2 {
        let reply = send(
            proxy.addr,
            forward(Method::GET, stack.origin.addr, "/large.txt"),
        )
        .await;
        assert!(reply.body() == large_body());
        assert!(!reply.cache_status().contains("hit"), "{reply:?}");
    }
    assert_eq!(proxy.stats().stored, 0);
    assert!(proxy.entry(&url).is_none());
    assert_eq!(proxy.stored_len(), 0);
    assert_eq!(stack.origin.requests_to("/large.txt"), 2);
}

#[tokio::test]
async fn a_gateway_request_is_cached_under_the_upstream_authority() {
    let stack = Stack::start().await;
    let gateway = |path: &str| {
        Request::get(path)
            .header("host", "www.example")
            .body(Full::new(Bytes::new()))
            .unwrap()
    };
    let first = send(stack.proxy.addr, gateway("/app-1.js")).await;
    assert!(first.body() == release(1));
    let second = send(stack.proxy.addr, gateway("/app-2.js")).await;
    assert!(second.body() == release(2));
    assert_eq!(stack.proxy.stats().deltas, 2);
    // Origin-form on the way up (the tap saw a path, not a URL).
    let seen = stack.tap.server.seen_for("/app-2.js");
    assert!(seen[0].uri.authority().is_none(), "{:?}", seen[0].uri);
    assert_eq!(
        seen[0].header("hsync-basis"),
        Some(&*basis_name(release(1)))
    );
    let upstream = stack.tap.server.addr;
    stack
        .proxy
        .assert_complete(&format!("http://{upstream}/app-2.js"), release(2));
    let fresh = send(stack.proxy.addr, gateway("/fresh.js")).await;
    assert!(fresh.body() == release(1));
    let hit = send(stack.proxy.addr, gateway("/fresh.js")).await;
    assert!(hit.cache_status().contains("hit"), "{hit:?}");
    assert_eq!(stack.origin.requests_to("/fresh.js"), 1);
}

// ---------------------------------------------------------------------------
// 2-4. Freshness, revalidation, the user agent's own validators

#[tokio::test]
async fn a_fresh_entry_is_served_without_asking_upstream() {
    let stack = Stack::start().await;
    let first = stack.get("/fresh.js").await;
    assert!(first.body() == release(1));
    let second = stack.get("/fresh.js").await;
    assert_eq!(second.status, StatusCode::OK);
    assert!(second.body() == release(1));
    assert!(second.cache_status().contains("hit"), "{second:?}");
    let age: u64 = second.header("age").expect("Age on a hit").parse().unwrap();
    assert!(age < 60);
    assert_eq!(
        second.header("content-length"),
        Some(&*BODY_LEN.to_string())
    );
    assert!(second.list("via").ends_with("1.1 test-client"));
    assert_eq!(stack.origin.requests_to("/fresh.js"), 1);
    assert_eq!(stack.tap.server.requests(), 1);
    let stats = stack.proxy.stats();
    assert_eq!((stats.hits, stats.misses), (1, 1), "{stats:?}");
}

#[tokio::test]
async fn a_stale_entry_is_revalidated_and_a_304_serves_the_stored_body() {
    let stack = Stack::start().await;
    let first = stack.get("/etag.js").await;
    assert!(first.body() == release(1));
    let second = stack.get("/etag.js").await;
    assert_eq!(second.status, StatusCode::OK);
    assert!(second.body() == release(1), "the stored body, whole");
    assert!(
        second.cache_status().contains("fwd=stale") && second.cache_status().contains("304"),
        "{second:?}"
    );
    let seen = stack.origin.seen_for("/etag.js");
    assert_eq!(seen.len(), 2);
    assert!(seen[0].header("if-none-match").is_none());
    assert!(
        seen[1].header("if-none-match").unwrap().contains("\"e1\""),
        "{:?}",
        seen[1].headers
    );
    let stats = stack.proxy.stats();
    assert_eq!(stats.revalidated, 1, "{stats:?}");
    assert_eq!(stats.hits, 1, "{stats:?}");
    stack
        .proxy
        .assert_complete(&stack.url("/etag.js"), release(1));
}

#[tokio::test]
async fn a_stale_entry_that_changed_comes_back_as_a_delta_against_itself() {
    let stack = Stack::start().await;
    assert!(stack.get("/changing.js").await.body() == release(1));
    let before = stack.proxy.stats();
    let second = stack.get("/changing.js").await;
    assert_eq!(second.status, StatusCode::OK);
    assert!(second.body() == release(2));
    assert!(second.cache_status().contains("fwd=stale"), "{second:?}");
    let after = stack.proxy.stats();
    assert_eq!(after.deltas, before.deltas + 1, "{after:?}");
    assert_eq!(after.revalidated, 1);
    assert!(after.upstream_bytes - before.upstream_bytes < BODY_LEN as u64 / 20);
    // The origin saw the revalidation; the basis was the URL's own entry.
    let origin_saw = stack.origin.seen_for("/changing.js");
    assert!(
        origin_saw[1]
            .header("if-none-match")
            .unwrap()
            .contains("c1")
    );
    let tap_saw = stack.tap.server.seen_for("/changing.js");
    assert_eq!(
        tap_saw[1].header("hsync-basis"),
        Some(&*basis_name(release(1)))
    );
    stack
        .proxy
        .assert_complete(&stack.url("/changing.js"), release(2));
    // Issue 21: the origin's strong validator, restored from Hsync-ETag
    // once the body was verified (the coded answer carried it weak).
    assert_eq!(second.header("etag"), Some("\"c2\""));
    assert!(second.header("hsync-etag").is_none());
}

#[tokio::test]
async fn a_hit_served_from_memory_never_outlives_its_entry() {
    let stack = Stack::start().await;
    let url = stack.url("/fresh.js");
    assert!(stack.get("/fresh.js").await.body() == release(1));
    stack.proxy.settled(&url).await;
    // The first hit reads the disk and keeps the body in memory.
    assert!(stack.get("/fresh.js").await.cache_status().contains("hit"));
    // Wreck the body on disk: a hit from memory does not read it again.
    let key = CacheKey::parse(&url).unwrap();
    let body_file = stack
        .proxy
        .store()
        .root()
        .join(key.entry_path())
        .with_extension("body");
    std::fs::write(&body_file, b"garbage").unwrap();
    let hit = stack.get("/fresh.js").await;
    assert!(hit.cache_status().contains("hit"), "{hit:?}");
    assert!(hit.body() == release(1));
    assert_eq!(stack.origin.requests_to("/fresh.js"), 1);
    // An unsafe method removes the entry, from memory too.
    let post = forward(Method::POST, stack.origin.addr, "/fresh.js");
    assert_eq!(send(stack.proxy.addr, post).await.status, StatusCode::OK);
    let after = stack.get("/fresh.js").await;
    assert!(!after.cache_status().contains("hit"), "{after:?}");
    assert!(after.body() == release(1));
    assert_eq!(stack.origin.requests_to("/fresh.js"), 3);
}

#[tokio::test]
async fn the_user_agents_own_validator_gets_a_304_from_a_fresh_entry() {
    let stack = Stack::start().await;
    assert!(stack.get("/fresh.js").await.body() == release(1));
    let conditional = with_header(
        forward(Method::GET, stack.origin.addr, "/fresh.js"),
        "if-none-match",
        "\"f1\"",
    );
    let reply = send(stack.proxy.addr, conditional).await;
    assert_eq!(reply.status, StatusCode::NOT_MODIFIED);
    assert!(reply.body().is_empty());
    assert!(reply.header("etag").unwrap().contains("\"f1\""));
    // Another tag: the whole body, still from the cache.
    let other = with_header(
        forward(Method::GET, stack.origin.addr, "/fresh.js"),
        "if-none-match",
        "\"zz\"",
    );
    let reply = send(stack.proxy.addr, other).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert!(reply.body() == release(1));
    assert_eq!(stack.origin.requests_to("/fresh.js"), 1);
}

// ---------------------------------------------------------------------------
// 5. What passes through

#[tokio::test]
async fn a_range_request_passes_uncoded_and_unstored() {
    let stack = Stack::start().await;
    let request = with_header(
        forward(Method::GET, stack.origin.addr, "/range.txt"),
        "range",
        "bytes=0-99",
    );
    let reply = send(stack.proxy.addr, request).await;
    assert_eq!(reply.status, StatusCode::PARTIAL_CONTENT);
    assert!(reply.body() == &release(1)[..100]);
    assert!(reply.header("content-encoding").is_none());
    let seen = stack.origin.seen_for("/range.txt");
    assert_eq!(seen[0].header("range"), Some("bytes=0-99"));
    assert!(
        !seen[0]
            .header("accept-encoding")
            .unwrap_or("")
            .contains("hsync"),
        "{:?}",
        seen[0].headers
    );
    assert!(stack.proxy.entry(&stack.url("/range.txt")).is_none());
    assert_eq!(stack.proxy.stats().deltas, 0);
}

#[tokio::test]
async fn p16_head_is_answered_from_a_fresh_entry_and_passed_on_a_miss() {
    let stack = Stack::start().await;
    assert!(stack.get("/fresh.js").await.body() == release(1));
    let head = send(
        stack.proxy.addr,
        forward(Method::HEAD, stack.origin.addr, "/fresh.js"),
    )
    .await;
    assert_eq!(head.status, StatusCode::OK);
    assert!(head.body().is_empty());
    assert_eq!(head.header("content-length"), Some(&*BODY_LEN.to_string()));
    assert!(head.cache_status().contains("hit"));
    assert_eq!(stack.origin.requests_to("/fresh.js"), 1);

    let started = Instant::now();
    let miss = send(
        stack.proxy.addr,
        forward(Method::HEAD, stack.origin.addr, "/head.js"),
    )
    .await;
    assert!(started.elapsed() < Duration::from_secs(2));
    assert_eq!(miss.status, StatusCode::OK);
    assert!(miss.body().is_empty());
    assert_eq!(miss.header("content-length"), Some(&*BODY_LEN.to_string()));
    let seen = stack.origin.seen_for("/head.js");
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].method, Method::HEAD);
    assert!(
        stack.proxy.entry(&stack.url("/head.js")).is_none(),
        "a HEAD never fills the GET entry"
    );
    // And the GET afterwards gets the whole body.
    assert!(stack.get("/head.js").await.body() == release(1));
}

#[tokio::test]
async fn a_no_store_response_is_served_but_never_stored() {
    let stack = Stack::start().await;
    for _ in 0..2 {
        let reply = stack.get("/no-store.js").await;
        assert_eq!(reply.status, StatusCode::OK);
        assert!(reply.body() == release(1));
    }
    assert_eq!(stack.origin.requests_to("/no-store.js"), 2);
    assert!(stack.proxy.entry(&stack.url("/no-store.js")).is_none());
    assert_eq!(stack.proxy.stored_len(), 0);
    assert_eq!(stack.proxy.stats().stored, 0);
}

#[tokio::test]
async fn a_gzip_body_from_the_origin_passes_with_its_bytes_intact() {
    let stack = Stack::start().await;
    let reply = stack.get("/gzip.js").await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.header("content-encoding"), Some("gzip"));
    assert!(reply.body() == gzip(release(1)));
    assert!(gunzip(reply.body()) == release(1));
    assert_eq!(stack.proxy.stats().deltas, 0);
    // Stored as the origin sent it (keyed by Accept-Encoding, as a coded
    // body always is), and served so.
    eventually("/gzip.js stored", || stack.proxy.stats().stored == 1).await;
    let hit = stack.get("/gzip.js").await;
    assert!(hit.cache_status().contains("hit"), "{hit:?}");
    assert_eq!(hit.header("content-encoding"), Some("gzip"));
    assert!(gunzip(hit.body()) == release(1));
    assert_eq!(stack.origin.requests_to("/gzip.js"), 1);
}

#[tokio::test]
async fn p20_error_statuses_are_never_stored() {
    let stack = Stack::start().await;
    for (path, status) in [
        ("/missing", StatusCode::NOT_FOUND),
        ("/broken", StatusCode::INTERNAL_SERVER_ERROR),
    ] {
        for round in 1..=2 {
            let reply = stack.get(path).await;
            assert_eq!(reply.status, status, "{path}");
            assert!(!reply.body().is_empty());
            assert_eq!(
                stack.origin.requests_to(path),
                round,
                "{path} reached the origin"
            );
        }
        assert!(stack.proxy.entry(&stack.url(path)).is_none(), "{path}");
    }
    assert_eq!(stack.proxy.stored_len(), 0);
    // The next clean request still gets a fresh 200.
    assert!(stack.get("/fresh.js").await.body() == release(1));
}

#[tokio::test]
async fn p23_a_post_passes_with_its_body_and_invalidates_the_entry() {
    let stack = Stack::start().await;
    assert!(stack.get("/post.js").await.body() == release(1));
    assert!(stack.proxy.entry(&stack.url("/post.js")).is_some());
    let mut post = forward(Method::POST, stack.origin.addr, "/post.js");
    *post.body_mut() = Full::new(Bytes::from_static(b"name=value&more=1"));
    let reply = send(stack.proxy.addr, post).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.body(), b"posted: name=value&more=1");
    assert!(
        stack.proxy.entry(&stack.url("/post.js")).is_none(),
        "the POST invalidated the stored GET"
    );
    let seen = stack.origin.seen_for("/post.js");
    assert_eq!(seen[1].method, Method::POST);
    assert!(seen[1].header("hsync-signature").is_none());
    // The next GET goes to the origin again.
    let again = stack.get("/post.js").await;
    assert!(again.body() == release(1));
    assert!(!again.cache_status().contains("hit"));
    assert_eq!(stack.origin.requests_to("/post.js"), 3);
}

// ---------------------------------------------------------------------------
// 6. An upstream that knows nothing of hsync

#[tokio::test]
async fn with_a_plain_origin_upstream_it_is_an_ordinary_caching_proxy() {
    let origin = start_origin().await;
    let proxy = Proxy::start(client_config(origin.addr)).await;
    let get = |path: &str| send(proxy.addr, forward(Method::GET, origin.addr, path));
    let url = |path: &str| format!("http://{}{path}", origin.addr);

    assert!(get("/fresh.js").await.body() == release(1));
    proxy.settled(&url("/fresh.js")).await;
    let hit = get("/fresh.js").await;
    assert!(hit.cache_status().contains("hit"), "{hit:?}");
    assert!(hit.body() == release(1));
    assert_eq!(origin.requests_to("/fresh.js"), 1);

    assert!(get("/app-1.js").await.body() == release(1));
    proxy.settled(&url("/app-1.js")).await;
    assert!(get("/app-2.js").await.body() == release(2));
    proxy.settled(&url("/app-2.js")).await;
    let first = &origin.seen_for("/fresh.js")[0];
    assert!(
        first
            .header("accept-encoding")
            .unwrap()
            .starts_with("hsync")
    );
    assert!(first.header("hsync-signature").is_none());
    assert!(first.header("hsync-basis").is_none());
    // With a basis it offers its signature; the origin ignores it.
    let second = &origin.seen_for("/app-2.js")[0];
    assert!(second.header("hsync-signature").is_some());
    // (The counters are added when the relay reports, just after the end.)
    let upstream_bytes = (2 * release(1).len() + release(2).len()) as u64;
    eventually("three bodies counted", || {
        proxy.stats().upstream_bytes == upstream_bytes
    })
    .await;
    assert_eq!(proxy.stats().deltas, 0);
    proxy.assert_complete(&url("/app-2.js"), release(2));
    // The signature it computed itself is the accelerator's kind.
    let (_, signature) = proxy.body_and_signature(&url("/app-1.js"));
    assert!(signature == accelerator_signature(release(1)));
}

// ---------------------------------------------------------------------------
// 7, 10. A hostile upstream

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Hostile {
    /// Codes release 2 against the offered signature but breaks END's digest.
    BadDigest,
    /// Breaks END's digest only when coding against a basis (as an MD4
    /// collision would); codes a from-scratch stream correctly.
    BadDigestWithBasis,
    /// Codes correctly without SIG frames (so the client holds the body
    /// until END, and may then announce its length), under a
    /// `Repr-Digest` the body does not match.
    NoSigWrongReprDigest,
    /// Codes correctly but echoes another basis than the one offered.
    WrongBasis,
    /// Codes correctly but echoes no basis at all.
    NoBasis,
    /// Codes correctly, as `Content-Encoding: hsync, identity`.
    WithIdentity,
    /// Codes correctly, but says `gzip, hsync`.
    Layered,
}

/// An "accelerator" that serves /app-1.js plainly (so the client seeds its
/// cache) and answers /app-2.js per `behaviour`.
async fn start_hostile(behaviour: Hostile) -> Server {
    origin(move |request, _| async move {
        let body = match request.uri().path() {
            "/app-2.js" => release(2),
            // Rebuilds to less than the client relays whole.
            "/small-2.js" => &release(2)[..SMALL_LEN],
            _ => return ok(&[], release(1)),
        };
        let signature = request
            .headers()
            .get("hsync-signature")
            .and_then(|v| parse_byte_sequence(v, 1 << 20));
        let mut encoder = Encoder::new(
            signature.as_deref(),
            Some(body.len() as u64),
            EncoderOptions {
                zstd_level: 3,
                ..EncoderOptions::default()
            },
        );
        if behaviour == Hostile::NoSigWrongReprDigest {
            encoder.leave_out_sig_frames();
        }
        let mut stream = Vec::new();
        encoder.push(body, &mut stream).unwrap();
        encoder.finish(&mut stream).unwrap();
        let offered = request
            .headers()
            .get("hsync-basis")
            .map(|v| v.to_str().unwrap().to_owned());
        let echoed = match behaviour {
            Hostile::BadDigest => {
                // END is the last frame; its last 32 bytes are the blake3.
                let last = stream.len() - 1;
                stream[last] ^= 0x01;
                offered
            }
            Hostile::BadDigestWithBasis => {
                if offered.is_some() {
                    let last = stream.len() - 1;
                    stream[last] ^= 0x01;
                }
                offered
            }
            Hostile::WrongBasis => Some(basis_name(b"some other body")),
            Hostile::NoBasis => None,
            Hostile::WithIdentity | Hostile::Layered | Hostile::NoSigWrongReprDigest => offered,
        };
        let coding = match behaviour {
            Hostile::WithIdentity => "hsync, identity",
            Hostile::Layered => "gzip, hsync",
            _ => "hsync",
        };
        let mut headers = vec![
            ("content-encoding", coding.to_owned()),
            ("vary", "Accept-Encoding, Hsync-Basis".to_owned()),
        ];
        if let Some(echoed) = echoed {
            headers.push(("hsync-basis", echoed));
        }
        if behaviour == Hostile::NoSigWrongReprDigest {
            let zeros = "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=";
            headers.push(("repr-digest", format!("sha-256=:{zeros}:")));
        }
        let headers: Vec<(&str, &str)> = headers.iter().map(|(n, v)| (*n, v.as_str())).collect();
        // Chunked, in a few pieces, END (5 + 40 bytes) after a pause: the
        // client streams what the SIG entries vouched for before END.
        let (frames, end) = stream.split_at(stream.len() - 45);
        let pieces = frames
            .chunks(8 << 10)
            .map(|c| Step::Data(Bytes::copy_from_slice(c)))
            .chain([
                Step::Pause(Duration::from_millis(50)),
                Step::Data(Bytes::copy_from_slice(end)),
            ]);
        respond(StatusCode::OK, &headers, ScriptedBody::new(pieces).boxed())
    })
    .await
}

/// A client proxy behind a hostile upstream, with release 1 fetched and
/// stored as `/app-1.js`: the basis its next requests offer.
async fn seeded_behind(behaviour: Hostile) -> (Server, Proxy) {
    let hostile = start_hostile(behaviour).await;
    let proxy = Proxy::start(client_config(hostile.addr)).await;
    let seed = send(proxy.addr, forward(Method::GET, hostile.addr, "/app-1.js")).await;
    assert!(seed.body() == release(1));
    proxy
        .settled(&format!("http://{}/app-1.js", hostile.addr))
        .await;
    (hostile, proxy)
}

#[tokio::test]
async fn d_a4_a_stream_with_a_wrong_digest_aborts_the_response_and_drops_its_basis() {
    let (hostile, proxy) = seeded_behind(Hostile::BadDigest).await;
    let url = |path: &str| format!("http://{}{path}", hostile.addr);
    proxy.assert_complete(&url("/app-1.js"), release(1));

    let reply = send(proxy.addr, forward(Method::GET, hostile.addr, "/app-2.js")).await;
    assert_eq!(reply.status, StatusCode::OK, "the head left before END");
    assert!(
        reply.body.is_err(),
        "the body must not end cleanly: got {} bytes",
        reply.body.as_ref().map_or(0, Vec::len)
    );
    // The client really offered the basis it then dropped.
    let seen = hostile.seen_for("/app-2.js");
    assert_eq!(
        seen[0].header("hsync-basis"),
        Some(&*basis_name(release(1)))
    );
    eventually("digest failure counted", || {
        proxy.stats().digest_failures == 1
    })
    .await;
    assert!(proxy.entry(&url("/app-2.js")).is_none(), "nothing stored");
    assert!(
        proxy.entry(&url("/app-1.js")).is_none(),
        "the basis that produced wrong bytes is dropped"
    );
    assert_eq!(proxy.stored_len(), 0);
    let stats = proxy.stats();
    assert_eq!((stats.stored, stats.deltas), (1, 1), "{stats:?}");
}

/// A stream without SIG frames is verified whole at END before its head
/// goes, and the user agent is told its length; a check after END (here
/// the origin's `Repr-Digest`) still fails the body: its last piece never
/// leaves, so the body does not look complete.
#[tokio::test]
async fn d_a5_a_body_told_its_length_that_fails_a_check_after_end_is_cut() {
    let (hostile, proxy) = seeded_behind(Hostile::NoSigWrongReprDigest).await;
    let url = |path: &str| format!("http://{}{path}", hostile.addr);

    let reply = send(proxy.addr, forward(Method::GET, hostile.addr, "/app-2.js")).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(
        reply.headers.get("content-length"),
        Some(&HeaderValue::from(release(2).len())),
        "verified whole before the head: its length announced"
    );
    assert!(
        reply.body.is_err(),
        "the body must not end cleanly: got {} bytes",
        reply.body.as_ref().map_or(0, Vec::len)
    );
    eventually("digest failure counted", || {
        proxy.stats().digest_failures == 1
    })
    .await;
    assert!(proxy.entry(&url("/app-2.js")).is_none(), "nothing stored");
}

/// L-13: a coded stream's share of the client proxy's transfer memory
/// follows the windows its header's block size makes. A body of 1 GiB
/// gets 1 MiB blocks and so 8 MiB windows: six of them, 48 MiB, where the
/// configured 1 MiB window's share is 6 MiB (a 1 GiB soak held 2.6 times
/// what the budget counted at the accelerator, which sized it that way).
/// Seen in the metrics' figure while the stream stalls after its first
/// window.
#[tokio::test]
async fn l_13_a_large_bodys_stream_takes_the_share_its_windows_make() {
    let upstream = origin(|_, _| async move {
        let mut encoder = Encoder::new(
            None,
            Some(1 << 30),
            EncoderOptions {
                zstd_level: 3,
                ..EncoderOptions::default()
            },
        );
        assert_eq!(encoder.window_len(), 8 << 20, "1 MiB blocks");
        let mut stream = Vec::new();
        encoder
            .push(&support::random_bytes(3, 9 << 20), &mut stream)
            .unwrap();
        assert!(stream.len() > 1 << 20, "a window went out");
        let headers = [
            ("content-encoding", "hsync"),
            ("vary", "Accept-Encoding, Hsync-Basis"),
        ];
        let steps = [
            Step::Data(Bytes::from(stream)),
            Step::Pause(Duration::from_secs(60)),
        ];
        respond(StatusCode::OK, &headers, ScriptedBody::new(steps).boxed())
    })
    .await;
    let proxy = Proxy::start(client_config(upstream.addr)).await;
    let idle = proxy.transfer_memory_figures();
    assert_eq!((idle.taken, idle.budget), (0, 256 << 20));
    let fetch = tokio::spawn(send(
        proxy.addr,
        forward(Method::GET, upstream.addr, "/big"),
    ));
    eventually("the stream takes its share", || {
        proxy.transfer_memory_figures().taken > 0
    })
    .await;
    assert_eq!(proxy.transfer_memory_figures().taken, 48 << 20);
    fetch.abort();
}

#[tokio::test]
async fn d_a5_a_small_stream_with_a_wrong_digest_is_a_clean_502_and_drops_its_basis() {
    let (hostile, proxy) = seeded_behind(Hostile::BadDigest).await;
    let url = |path: &str| format!("http://{}{path}", hostile.addr);

    // Small enough to be rebuilt and checked before the head goes out: it
    // is fetched once more without the basis, and as that fails too, a
    // clean error instead of a cut body.
    let reply = send(
        proxy.addr,
        forward(Method::GET, hostile.addr, "/small-2.js"),
    )
    .await;
    assert_eq!(reply.status, StatusCode::BAD_GATEWAY, "{reply:?}");
    assert!(
        String::from_utf8_lossy(reply.body()).contains("failed"),
        "{reply:?}"
    );
    let seen = hostile.seen_for("/small-2.js");
    assert_eq!(seen.len(), 2, "one retry, no more");
    assert_eq!(
        seen[0].header("hsync-basis"),
        Some(&*basis_name(release(1)))
    );
    assert_eq!(seen[1].header("hsync-basis"), None);
    eventually("digest failures counted", || {
        proxy.stats().digest_failures == 2
    })
    .await;
    assert!(proxy.entry(&url("/small-2.js")).is_none(), "nothing stored");
    assert!(
        proxy.entry(&url("/app-1.js")).is_none(),
        "the basis that produced wrong bytes is dropped"
    );
}

#[tokio::test]
async fn d_a4_a_small_body_that_its_basis_rebuilt_wrong_is_fetched_whole_and_served_right() {
    let (hostile, proxy) = seeded_behind(Hostile::BadDigestWithBasis).await;
    let url = |path: &str| format!("http://{}{path}", hostile.addr);

    let reply = send(
        proxy.addr,
        forward(Method::GET, hostile.addr, "/small-2.js"),
    )
    .await;
    assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
    assert!(reply.body() == &release(2)[..SMALL_LEN]);
    let seen = hostile.seen_for("/small-2.js");
    assert_eq!(seen.len(), 2);
    assert!(seen[0].header("hsync-basis").is_some());
    assert_eq!(
        seen[1].header("hsync-basis"),
        None,
        "the retry has no basis"
    );
    proxy.assert_complete(&url("/small-2.js"), &release(2)[..SMALL_LEN]);
    assert!(
        proxy.entry(&url("/app-1.js")).is_none(),
        "the basis that produced wrong bytes is dropped"
    );
    assert_eq!(proxy.stats().digest_failures, 1);
}

#[tokio::test]
async fn d_a5_a_small_body_is_checked_before_its_head_and_sent_with_a_length() {
    let stack = Stack::start().await;
    let reply = stack.get("/small.js").await;
    assert_eq!(reply.status, StatusCode::OK);
    assert!(reply.body() == &release(1)[..SMALL_LEN]);
    assert_eq!(
        reply.header("content-length"),
        Some(&*SMALL_LEN.to_string())
    );
    assert!(reply.header("transfer-encoding").is_none(), "{reply:?}");
    // Committed before the head left, so at once a hit.
    stack
        .proxy
        .assert_complete(&stack.url("/small.js"), &release(1)[..SMALL_LEN]);
    assert_eq!(stack.proxy.stats().deltas, 1, "it came coded");
    // A body past the limit streams: chunked, unless it was rebuilt and
    // verified whole before its head went (on loopback, its stream may
    // come in one read), when it goes with its own length.
    let large = stack.get("/app-1.js").await;
    assert!(large.body() == release(1));
    let length = large.header("content-length");
    assert!(
        length.is_none() || length == Some(&*release(1).len().to_string()),
        "{:?}",
        large.headers
    );
}

#[tokio::test]
async fn d_a5_a_small_plain_body_failing_the_origins_content_digest_is_a_clean_502() {
    let origin = start_origin().await;
    let proxy = Proxy::start(client_config(origin.addr)).await;
    let reply = send(
        proxy.addr,
        forward(Method::GET, origin.addr, "/bad-digest-small.js"),
    )
    .await;
    assert_eq!(reply.status, StatusCode::BAD_GATEWAY, "{reply:?}");
    eventually("digest failure counted", || {
        proxy.stats().digest_failures == 1
    })
    .await;
    assert_eq!(proxy.stored_len(), 0);
}

#[tokio::test]
async fn a_small_body_slower_than_the_upstream_wait_streams_instead() {
    let origin = start_origin().await;
    let proxy = Proxy::start(ClientConfig {
        upstream_timeout: Duration::from_secs(1),
        ..client_config(origin.addr)
    })
    .await;
    let stream = TcpStream::connect(proxy.addr).await.unwrap();
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(connection);
    let started = Instant::now();
    let response = sender
        .send_request(forward(Method::GET, origin.addr, "/dribble.js"))
        .await
        .unwrap();
    let head_after = started.elapsed();
    assert_eq!(response.status(), StatusCode::OK);
    assert!(
        head_after < Duration::from_millis(1400),
        "the head waited for the whole body: {head_after:?}"
    );
    let body = response.into_body().collect().await.unwrap().to_bytes();
    assert!(started.elapsed() >= Duration::from_millis(1500));
    assert!(body == release(1)[..SMALL_LEN]);
    proxy
        .settled(&format!("http://{}/dribble.js", origin.addr))
        .await;
}

#[tokio::test]
async fn a_basis_held_in_memory_is_offered_without_opening_its_file() {
    let stack = Stack::start().await;
    assert!(stack.get("/small.js").await.body() == &release(1)[..SMALL_LEN]);
    // Served from disk once, then kept in the memory cache.
    let hit = stack.get("/small.js").await;
    assert!(hit.cache_status().contains("hit"), "{hit:?}");
    assert_eq!(stack.proxy.stats().memory_bases, 0);

    let before = stack.proxy.stats();
    let reply = stack.get("/small-2.js").await;
    assert!(reply.body() == &release(2)[..SMALL_LEN]);
    let stats = stack.proxy.stats();
    assert_eq!(stats.memory_bases, 1, "{stats:?}");
    let seen = stack.tap.server.seen_for("/small-2.js");
    assert_eq!(
        seen[0].header("hsync-basis"),
        Some(&*basis_name(&release(1)[..SMALL_LEN]))
    );
    // A delta: a fraction of the body crossed the link.
    let link = stats.upstream_bytes - before.upstream_bytes;
    assert!(link < SMALL_LEN as u64 / 4, "{link} bytes on the link");
    stack
        .proxy
        .assert_complete(&stack.url("/small-2.js"), &release(2)[..SMALL_LEN]);
}

#[tokio::test]
async fn d_a4_a_coded_body_failing_the_origins_content_digest_is_aborted_and_not_stored() {
    let stack = Stack::start().await;
    let reply = stack.get("/bad-digest.js").await;
    assert_eq!(reply.status, StatusCode::OK);
    assert!(reply.body.is_err(), "must not end cleanly");
    eventually("digest failure counted", || {
        stack.proxy.stats().digest_failures == 1
    })
    .await;
    assert_eq!(stack.proxy.stats().deltas, 1, "it came coded");
    assert!(stack.proxy.entry(&stack.url("/bad-digest.js")).is_none());
}

#[tokio::test]
async fn d_a5_a_plain_body_failing_the_origins_content_digest_never_looks_complete() {
    let origin = start_origin().await;
    let proxy = Proxy::start(client_config(origin.addr)).await;
    let reply = send(
        proxy.addr,
        forward(Method::GET, origin.addr, "/bad-digest.js"),
    )
    .await;
    eventually("digest failure counted", || {
        proxy.stats().digest_failures == 1
    })
    .await;
    assert!(
        proxy
            .entry(&format!("http://{}/bad-digest.js", origin.addr))
            .is_none()
    );
    assert_eq!(reply.status, StatusCode::OK);
    assert!(
        reply.body.is_err(),
        "the user agent got a complete-looking body that failed the origin's digest \
         (Content-Length: {:?})",
        reply.header("content-length")
    );
}

#[tokio::test]
async fn d_a7_an_echoed_basis_other_than_the_offered_one_is_a_502() {
    for behaviour in [Hostile::WrongBasis, Hostile::NoBasis] {
        let hostile = start_hostile(behaviour).await;
        let proxy = Proxy::start(client_config(hostile.addr)).await;
        let url = |path: &str| format!("http://{}{path}", hostile.addr);
        let seed = send(proxy.addr, forward(Method::GET, hostile.addr, "/app-1.js")).await;
        assert!(seed.body() == release(1));
        proxy.settled(&url("/app-1.js")).await;
        let reply = send(proxy.addr, forward(Method::GET, hostile.addr, "/app-2.js")).await;
        assert_eq!(reply.status, StatusCode::BAD_GATEWAY, "{behaviour:?}");
        assert!(
            !matches!(&reply.body, Ok(b) if b == release(2)),
            "{behaviour:?}"
        );
        assert!(proxy.entry(&url("/app-2.js")).is_none(), "{behaviour:?}");
        assert_eq!(proxy.stored_len(), 1, "only the seed: {behaviour:?}");
        assert_eq!(proxy.stats().digest_failures, 1, "{behaviour:?}");
        assert_eq!(hostile.requests_to("/app-2.js"), 1);
    }
}

// ---------------------------------------------------------------------------
// 8. An interrupted transfer resumes

#[tokio::test]
async fn d_a8_a_cut_stream_leaves_a_partial_entry_that_the_next_fetch_resumes_from() {
    let stack = Stack::start().await;
    let url = stack.url("/app-1.js");
    stack.tap.set_mode(TapMode::CutHalf);
    let cut = stack.get("/app-1.js").await;
    assert_eq!(cut.status, StatusCode::OK);
    assert!(cut.body.is_err(), "a cut body must not end cleanly");
    eventually("partial entry committed", || {
        stack.proxy.stats().partial_stored == 1
    })
    .await;
    let partial = stack.proxy.entry(&url).expect("a partial entry");
    assert_eq!(partial.completeness, Completeness::Partial);
    assert!(partial.body_len > 0 && partial.body_len < BODY_LEN as u64);
    let (prefix, prefix_signature) = stack.proxy.body_and_signature(&url);
    assert!(
        prefix == release(1)[..prefix.len()],
        "the partial body is a prefix"
    );
    assert!(
        prefix_signature == accelerator_signature_with_block_of(&prefix, &prefix_signature),
        "the partial's signature describes its prefix"
    );
    let full_stream = *stack.tap.cut_from.lock().unwrap() as u64;

    stack.tap.set_mode(TapMode::Pass);
    // (Counters are added when the relay reports, just after the end.)
    eventually("the cut counted", || {
        stack.proxy.stats().partial_stored == 1
    })
    .await;
    let before = stack.proxy.stats();
    let resumed = stack.get("/app-1.js").await;
    assert_eq!(resumed.status, StatusCode::OK);
    assert!(resumed.body() == release(1));
    let seen = stack.tap.server.seen_for("/app-1.js");
    assert_eq!(seen.len(), 2);
    assert_eq!(seen[1].header("hsync-basis"), Some(&*basis_name(&prefix)));
    let offered = parse_byte_sequence(&seen[1].headers["hsync-signature"], 1 << 20).unwrap();
    assert!(
        offered == prefix_signature,
        "the partial's signature went up"
    );
    eventually("the resumed body counted", || {
        stack.proxy.stats().stored == before.stored + 1
    })
    .await;
    let link = stack.proxy.stats().upstream_bytes - before.upstream_bytes;
    assert!(
        link * 4 < full_stream * 3,
        "resuming sent {link} bytes, from scratch is {full_stream}"
    );
    stack.proxy.assert_complete(&url, release(1));
    assert_eq!(stack.origin.requests_to("/app-1.js"), 2);
}

/// The signature of `body` with the block size and strong length named in
/// `like`'s header.
fn accelerator_signature_with_block_of(body: &[u8], like: &[u8]) -> Vec<u8> {
    let block = u32::from_be_bytes(like[4..8].try_into().unwrap());
    let strong = u32::from_be_bytes(like[8..12].try_into().unwrap());
    assert_eq!(strong, rproxy::hsync::DEFAULT_STRONG_LEN);
    support::signature_with_block(body, block)
}

// ---------------------------------------------------------------------------
// 9. Coalescing

#[tokio::test]
async fn c_w2_identical_concurrent_misses_share_one_upstream_fetch() {
    let stack = Stack::start().await;
    let requests: Vec<_> = (0..50)
        .map(|_| {
            let (proxy, origin) = (stack.proxy.addr, stack.origin.addr);
            tokio::spawn(async move { send(proxy, forward(Method::GET, origin, "/slow.js")).await })
        })
        .collect();
    for request in requests {
        let reply = request.await.unwrap();
        assert_eq!(reply.status, StatusCode::OK);
        assert!(reply.body() == release(1));
    }
    assert_eq!(stack.origin.requests_to("/slow.js"), 1);
    assert_eq!(stack.tap.server.requests(), 1);
    let stats = stack.proxy.stats();
    assert!(stats.coalesced >= 1, "{stats:?}");
    assert_eq!(stats.misses, 1, "{stats:?}");
    assert_eq!(stats.hits, 49, "{stats:?}");
}

/// `stream` with one change chosen by `rng`: a byte flipped, a cut, a
/// run overwritten, duplicated or dropped.
fn mangle(stream: &[u8], rng: &mut support::Rng) -> Vec<u8> {
    let mut out = stream.to_vec();
    if out.is_empty() {
        return out;
    }
    let at = rng.below(out.len() as u64) as usize;
    let run = (1 + rng.below(64) as usize).min(out.len() - at);
    match rng.below(5) {
        0 => out[at] ^= 1 + rng.below(255) as u8,
        1 => out.truncate(at),
        2 => rng.fill(&mut out[at..at + run]),
        3 => {
            let copy = out[at..at + run].to_vec();
            out.splice(at..at, copy);
        }
        _ => {
            out.drain(at..at + run);
        }
    }
    out
}

/// `bytes` as body steps of 1 to 2,048 bytes, a short pause after about
/// one in four: the reader's reads are split and some come up empty.
fn pieces(mut bytes: Bytes, rng: &mut support::Rng) -> Vec<Step> {
    let mut steps = Vec::new();
    while !bytes.is_empty() {
        let len = (1 + rng.below(2048) as usize).min(bytes.len());
        steps.push(Step::Data(bytes.split_to(len)));
        if rng.below(4) == 0 {
            steps.push(Step::Pause(Duration::from_millis(rng.below(3))));
        }
    }
    steps
}

/// The two versions F-6's case `case` fetches: a streamed body (200 KB,
/// the releases) or, for odd cases, one coded whole (30 KB, one line
/// inserted).
fn f6_version(case: u64, version: usize) -> Vec<u8> {
    if case.is_multiple_of(2) {
        return release(version).to_vec();
    }
    let mut body = release(1)[..30_000].to_vec();
    if version == 2 {
        body.splice(
            10_000..10_000,
            b"/* the small one's change */\n".iter().copied(),
        );
    }
    body
}

/// Fetches `path` through `proxy`: the status and the body bytes that
/// came, and whether the body ended cleanly.
async fn fetch_what_comes(
    proxy: SocketAddr,
    origin: SocketAddr,
    path: &str,
) -> (StatusCode, Vec<u8>, bool) {
    let stream = TcpStream::connect(proxy).await.unwrap();
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(connection);
    let response = tokio::time::timeout(
        Duration::from_secs(10),
        sender.send_request(forward(Method::GET, origin, path)),
    )
    .await
    .expect("a response head in time");
    let Ok(response) = response else {
        return (StatusCode::BAD_GATEWAY, Vec::new(), false);
    };
    let status = response.status();
    let mut body = response.into_body();
    let mut got = Vec::new();
    let clean = loop {
        match tokio::time::timeout(Duration::from_secs(10), body.frame())
            .await
            .expect("the body moves or ends in time")
        {
            None => break true,
            Some(Ok(frame)) => {
                if let Some(data) = frame.data_ref() {
                    got.extend_from_slice(data);
                }
            }
            Some(Err(_)) => break false,
        }
    };
    (status, got, clean)
}

/// F-6 (in-process, seeded rather than fuzzed): the accelerator's coded
/// answer changed on its way to the client proxy (a byte flipped, a cut
/// that ends cleanly, a run overwritten, duplicated or dropped), and
/// delivered in pieces of random sizes with pauses, 48 times, against a
/// basis the client holds: the user agent never gets a wrong byte (what
/// comes is a prefix of the true body, and a body that ends cleanly is the
/// whole true body), the cache never keeps a wrong one, and the proxy goes
/// on serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn f_6_a_mangled_coded_answer_never_reaches_the_user_or_the_cache() {
    let stack = Stack::start().await;
    let (proxy, origin) = (stack.proxy.addr, stack.origin.addr);
    for case in 0..48u64 {
        let seed = 0xf6_0000 + case;
        let (first, second) = (f6_version(case, 1), f6_version(case, 2));
        stack.tap.set_mode(TapMode::Pass);
        let v1 = format!("/f6/{case}/v1.js");
        let (status, got, clean) = fetch_what_comes(proxy, origin, &v1).await;
        assert!(
            status == StatusCode::OK && clean && got == first,
            "case {case}: v1"
        );
        stack.proxy.settled(&stack.url(&v1)).await;

        stack.tap.set_mode(TapMode::Mangle(seed));
        let v2 = format!("/f6/{case}/v2.js");
        let (status, got, clean) = fetch_what_comes(proxy, origin, &v2).await;
        if status == StatusCode::OK {
            assert!(
                second.starts_with(&got),
                "case {case} (seed {seed:#x}): a wrong byte reached the user agent"
            );
            assert!(
                !clean || got.len() == second.len(),
                "case {case} (seed {seed:#x}): {} of {} bytes, ended as if whole",
                got.len(),
                second.len()
            );
        }
    }
    // Every entry still kept (the cache evicts the oldest), once the cache
    // writers are done: whole and right, or not kept whole.
    stack.tap.set_mode(TapMode::Pass);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut kept_whole = 0;
    for case in 0..48u64 {
        for version in [1, 2] {
            let url = stack.url(&format!("/f6/{case}/v{version}.js"));
            if let Some(entry) = stack.proxy.entry(&url)
                && entry.completeness == Completeness::Complete
            {
                stack
                    .proxy
                    .assert_complete(&url, &f6_version(case, version));
                kept_whole += 1;
            }
        }
    }
    // (A basis whose delta failed its digest is dropped too: the client
    // cannot tell a bad link from a bad basis.)
    assert!(kept_whole > 0, "the sweep found nothing to check");
    // Still serving, and right, once the link is honest again.
    let (status, got, clean) = fetch_what_comes(proxy, origin, "/f6/0/v2.js").await;
    assert!(status == StatusCode::OK && clean && got == f6_version(0, 2));
    let stats = stack.proxy.stats();
    assert!(
        stats.digest_failures > 0 || stats.upstream_errors > 0,
        "{stats:?}"
    );
}

/// Hot keys of L-10.
const HOT_KEYS: usize = 100;

/// L-10: coalescing under load. 100 hot keys with a TTL of 1 s are asked
/// about 200 times a second for 3 s, in bursts of 10 concurrent requests
/// every 50 ms, each burst two requests for each of 5 keys: a key comes
/// round once a second, about when its entry goes stale, and its two
/// requests then miss together. The origin may see each key once a second
/// and once more for its first fetch, plus 10 % (the row's target: upstream
/// rate at most keys / TTL × 1.1); without coalescing, the second request
/// of each pair would go up too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn l_10_hot_keys_under_load_go_upstream_once_per_ttl() {
    let stack = Stack::start().await;
    let (proxy, origin) = (stack.proxy.addr, stack.origin.addr);
    let started = Instant::now();
    let mut bursts = tokio::time::interval(Duration::from_millis(50));
    let mut sent = 0;
    let mut checks = Vec::new();
    for burst in 0..60 {
        bursts.tick().await;
        let requests: Vec<_> = (0..10)
            .map(|n| {
                let key = (burst * 5 + n / 2) % HOT_KEYS;
                let path = format!("/ttl1/{key}");
                tokio::spawn(async move {
                    let reply = send(proxy, forward(Method::GET, origin, &path)).await;
                    (reply, path)
                })
            })
            .collect();
        // Not awaited before the next burst: the load keeps its pace.
        checks.push(tokio::spawn(async move {
            for request in requests {
                let (reply, path) = request.await.unwrap();
                assert_eq!(reply.status, StatusCode::OK);
                assert_eq!(reply.body(), format!("{path} is hot").as_bytes());
            }
        }));
        sent += 10;
    }
    for check in checks {
        check.await.unwrap();
    }
    let seconds = started.elapsed().as_secs_f64();
    let upstream = stack.origin.requests();
    let bound = (HOT_KEYS as f64 * (seconds + 1.0) * 1.1) as usize;
    assert!(
        upstream <= bound,
        "{upstream} upstream requests for {sent} in {seconds:.1} s (bound {bound})"
    );
    let stats = stack.proxy.stats();
    assert!(stats.hits > 0, "{stats:?}");
}

#[tokio::test]
async fn c_w3_followers_of_a_hung_leader_fetch_on_their_own_after_the_lock_timeout() {
    let stack = Stack::start_with(|c| c.lock_timeout = Duration::from_millis(200)).await;
    let (proxy, origin) = (stack.proxy.addr, stack.origin.addr);
    let started = Instant::now();
    let leader =
        tokio::spawn(async move { send(proxy, forward(Method::GET, origin, "/stall.js")).await });
    stack.origin.wait_for_requests(1).await;
    let followers: Vec<_> = (0..5)
        .map(|_| {
            tokio::spawn(async move {
                let reply = send(proxy, forward(Method::GET, origin, "/stall.js")).await;
                (reply, started.elapsed())
            })
        })
        .collect();
    for follower in followers {
        let (reply, elapsed) = follower.await.unwrap();
        assert_eq!(reply.status, StatusCode::OK);
        assert!(reply.body() == release(1));
        assert!(
            elapsed < Duration::from_millis(1500),
            "a follower waited {elapsed:?} for a leader stalled 2 s"
        );
    }
    assert!(stack.origin.requests_to("/stall.js") >= 2);
    let leader = leader.await.unwrap();
    assert!(leader.body() == release(1));
    assert!(started.elapsed() >= Duration::from_secs(2));
}

/// The upstream's end of an in-memory connection (F-6's seam, a
/// `MemoryDial`): once the request's head was written (a reply before it
/// would be bytes no request asked for), `reply` a byte per read,
/// `Pending` before each (as h2's `fuzz_e2e` MockIo does); what the proxy
/// writes is dropped.
struct ByteByByte {
    reply: Vec<u8>,
    at: usize,
    pending: bool,
    asked: Vec<u8>,
    reader: Option<std::task::Waker>,
}

impl ByteByByte {
    fn new(reply: Vec<u8>) -> ByteByByte {
        ByteByByte {
            reply,
            at: 0,
            pending: false,
            asked: Vec::new(),
            reader: None,
        }
    }
}

impl tokio::io::AsyncRead for ByteByByte {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        if !self.asked.windows(4).any(|w| w == b"\r\n\r\n") {
            self.reader = Some(cx.waker().clone());
            return Poll::Pending;
        }
        self.pending = !self.pending;
        if self.pending {
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        if let Some(&byte) = self.reply.get(self.at) {
            buf.put_slice(&[byte]);
            self.at += 1;
        }
        Poll::Ready(Ok(()))
    }
}

impl tokio::io::AsyncWrite for ByteByByte {
    fn poll_write(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        self.asked.extend_from_slice(buf);
        if let Some(reader) = self.reader.take() {
            reader.wake();
        }
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

/// F-6's seam: the client proxy's upstream in memory, its reply read a
/// byte at a time with `Pending` before every read. A coded answer is
/// rebuilt, served and stored whole; the same answer with one byte of its
/// END digest flipped is neither served whole nor stored.
#[tokio::test]
async fn f_6_an_in_memory_upstream_read_a_byte_at_a_time_is_rebuilt_or_refused() {
    let body = release(1);
    let mut encoder = Encoder::new(
        None,
        Some(body.len() as u64),
        EncoderOptions {
            zstd_level: 1,
            ..EncoderOptions::default()
        },
    );
    let mut stream = Vec::new();
    encoder.push(body, &mut stream).unwrap();
    encoder.finish(&mut stream).unwrap();
    let reply = |stream: &[u8]| {
        let mut reply = format!(
            "HTTP/1.1 200 OK\r\nContent-Encoding: hsync\r\nVary: Accept-Encoding, Hsync-Basis\r\nCache-Control: max-age=3600\r\nContent-Length: {}\r\n\r\n",
            stream.len()
        )
        .into_bytes();
        reply.extend_from_slice(stream);
        reply
    };
    let mut bad = stream.clone();
    *bad.last_mut().unwrap() ^= 1;
    let replies = Arc::new(Mutex::new(VecDeque::from([reply(&stream), reply(&bad)])));
    let dialled = replies.clone();
    let dial = rproxy::http::dial::MemoryDial(Arc::new(move || {
        let reply = dialled.lock().unwrap().pop_front().ok_or_else(|| {
            std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "no more replies")
        })?;
        Ok(Box::new(ByteByByte::new(reply)) as Box<dyn rproxy::http::dial::MemoryIo>)
    }));
    // Nothing listens there: every connection is the dial's.
    let upstream: SocketAddr = "127.0.0.1:9".parse().unwrap();
    let proxy = Proxy::start(ClientConfig {
        upstream_dial: Some(dial),
        ..client_config(upstream)
    })
    .await;
    let url = |path: &str| format!("http://{upstream}{path}");

    let good = send(proxy.addr, forward(Method::GET, upstream, "/good.js")).await;
    assert_eq!(
        good.status,
        StatusCode::OK,
        "{:?}",
        good.body
            .as_ref()
            .map(|b| String::from_utf8_lossy(b).into_owned())
    );
    assert!(good.body() == body, "rebuilt whole");
    proxy.settled(&url("/good.js")).await;
    proxy.assert_complete(&url("/good.js"), body);

    let wrong = send(proxy.addr, forward(Method::GET, upstream, "/wrong.js")).await;
    assert!(
        wrong.status != StatusCode::OK || wrong.body.is_err(),
        "a stream failing END's digest was served whole: {:?}",
        wrong.status
    );
    eventually("the digest failure counted", || {
        proxy.stats().digest_failures == 1
    })
    .await;
    assert!(proxy.entry(&url("/wrong.js")).is_none(), "nothing stored");
    assert!(replies.lock().unwrap().is_empty(), "both went in memory");
}

// ---------------------------------------------------------------------------
// 11. Refusals

#[tokio::test]
async fn p12_connect_tls_and_userinfo_targets_are_refused_without_upstream_requests() {
    let stack = Stack::start().await;
    let origin = stack.origin.addr;
    let cases = [
        (
            // Tunnelled now, but only to the listed ports (443): refused
            // before any lookup or connection.
            "CONNECT example.com:25 HTTP/1.1\r\nHost: example.com:25\r\nConnection: close\r\n\r\n"
                .to_owned(),
            "403",
            "port 25",
        ),
        (
            "GET https://example.com/ HTTP/1.1\r\nHost: example.com\r\nConnection: close\r\n\r\n"
                .to_owned(),
            "400",
            "only http://",
        ),
        (
            format!(
                "GET http://user:secret@{origin}/fresh.js HTTP/1.1\r\nHost: {origin}\r\nConnection: close\r\n\r\n"
            ),
            "400",
            "userinfo",
        ),
    ];
    for (request, status, why) in cases {
        let answer = raw_exchange(stack.proxy.addr, &request).await;
        assert!(
            answer.starts_with(&format!("HTTP/1.1 {status}")),
            "{request:?} → {answer}"
        );
        // Refused by the proxy itself, with its reason.
        assert!(answer.contains(why), "{request:?} → {answer}");
    }
    assert_eq!(stack.tap.server.requests(), 0);
    assert_eq!(stack.proxy.stored_len(), 0);
}

#[tokio::test]
async fn p15_a_request_that_already_passed_us_is_a_loop() {
    let stack = Stack::start().await;
    let looped = with_header(
        forward(Method::GET, stack.origin.addr, "/fresh.js"),
        "via",
        "1.1 someone, 1.1 test-client",
    );
    let reply = send(stack.proxy.addr, looped).await;
    assert_eq!(reply.status, StatusCode::LOOP_DETECTED);
    assert_eq!(stack.tap.server.requests(), 0);
    assert_eq!(stack.origin.requests(), 0);
    // Another proxy's name is no loop.
    let other = with_header(
        forward(Method::GET, stack.origin.addr, "/fresh.js"),
        "via",
        "1.1 test-client-2",
    );
    assert_eq!(send(stack.proxy.addr, other).await.status, StatusCode::OK);
}

#[tokio::test]
async fn p22_an_unreachable_upstream_is_a_502_at_once() {
    let closed = TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap()
        .local_addr()
        .unwrap();
    let proxy = Proxy::start(client_config(closed)).await;
    let started = Instant::now();
    let reply = send(proxy.addr, forward(Method::GET, closed, "/fresh.js")).await;
    assert_eq!(reply.status, StatusCode::BAD_GATEWAY);
    assert!(started.elapsed() < Duration::from_secs(2));
    assert_eq!(proxy.stats().upstream_errors, 1);
    assert_eq!(proxy.stored_len(), 0);
}

#[tokio::test]
async fn p22_an_upstream_that_sends_no_head_in_time_is_a_504_within_the_timeout_and_a_second() {
    let stack = Stack::start_with(|c| c.upstream_timeout = Duration::from_secs(1)).await;
    let started = Instant::now();
    let reply = stack.get("/hang.js").await;
    let waited = started.elapsed();
    assert_eq!(reply.status, StatusCode::GATEWAY_TIMEOUT);
    assert!(
        String::from_utf8_lossy(reply.body()).contains("no response head within"),
        "{reply:?}"
    );
    assert!(
        waited >= Duration::from_secs(1) && waited < Duration::from_secs(2),
        "answered after {waited:?}"
    );
    assert_eq!(stack.proxy.stats().upstream_errors, 1);
    assert!(stack.proxy.entry(&stack.url("/hang.js")).is_none());
}

#[tokio::test]
async fn p22_a_stale_entry_within_stale_if_error_is_served_when_upstream_answers_5xx() {
    let stack = Stack::start().await;
    assert!(stack.get("/stale-if-error.js").await.body() == release(1));
    let reply = stack.get("/stale-if-error.js").await;
    assert_eq!(reply.status, StatusCode::OK);
    assert!(reply.body() == release(1), "the stored body, whole");
    let status = reply.cache_status();
    for part in ["fwd=stale", "fwd-status=503", "detail=stale-if-error"] {
        assert!(status.contains(part), "{part} missing: {reply:?}");
    }
    assert!(reply.header("age").is_some(), "{reply:?}");
    // The 503 went upstream once, carrying the stored validator: the
    // origin's own, strong, though the coded answer carried it weak
    // (issue 21: a strict origin matches only that).
    let seen = stack.origin.seen_for("/stale-if-error.js");
    assert_eq!(seen.len(), 2);
    assert_eq!(seen[1].header("if-none-match"), Some("\"s1\""));
    stack
        .proxy
        .assert_complete(&stack.url("/stale-if-error.js"), release(1));
}

#[tokio::test]
async fn p22_a_stale_entry_within_stale_if_error_is_served_when_upstream_times_out() {
    let stack = Stack::start_with(|c| c.upstream_timeout = Duration::from_secs(1)).await;
    assert!(stack.get("/stale-if-error-hang.js").await.body() == release(1));
    let started = Instant::now();
    let reply = stack.get("/stale-if-error-hang.js").await;
    assert!(started.elapsed() < Duration::from_secs(2));
    assert_eq!(reply.status, StatusCode::OK);
    assert!(reply.body() == release(1));
    let status = reply.cache_status();
    assert!(
        status.contains("fwd=stale") && status.contains("detail=stale-if-error"),
        "{reply:?}"
    );
    assert!(
        !status.contains("fwd-status"),
        "no upstream status: {reply:?}"
    );
}

/// RFC 5861 §4: a connection that drops mid-body is an upstream error as
/// a 5xx is. Here the update is coded against a basis the accelerator
/// holds (no SIG frames), so the client holds its bytes until END: the
/// user agent has seen nothing when the tap cuts the stream, and gets the
/// stale entry instead of a 502.
#[tokio::test]
async fn rfc5861_4_stale_if_error_serves_the_stale_entry_when_the_upstream_drops_mid_body() {
    let stack = Stack::start().await;
    let path = "/stale-if-error-cut.js";
    let url = stack.url(path);
    assert!(stack.get(path).await.body() == release(1));
    stack.proxy.settled(&url).await;
    stack.tap.set_mode(TapMode::CutHalf);
    let reply = stack.get(path).await;
    assert!(
        *stack.tap.cut_from.lock().unwrap() > 0,
        "the answer was cut"
    );
    assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
    assert!(reply.body() == release(1), "the stored body, whole");
    let status = reply.cache_status();
    for part in ["fwd=stale", "detail=stale-if-error"] {
        assert!(status.contains(part), "{part} missing: {reply:?}");
    }
    assert_eq!(stack.origin.requests_to(path), 2);
    // The cut left the stored entry as it was.
    stack.proxy.assert_complete(&url, release(1));
    // Once the upstream is whole again, the new release comes.
    stack.tap.set_mode(TapMode::Pass);
    assert!(stack.get(path).await.body() == release(2));
}

/// A plain origin behind the client proxy whose first answer to every
/// path is stale at once within `stale-if-error`, and whose later ones
/// play `later` (a head, then these body steps).
async fn stale_then(later: fn() -> Vec<Step>) -> (Server, Proxy) {
    let origin = origin(move |_, earlier| async move {
        let headers = [
            ("cache-control", "max-age=0, stale-if-error=60"),
            ("content-length", "200000"),
        ];
        let body = if earlier == 0 {
            full(release(1))
        } else {
            ScriptedBody::new(later()).boxed()
        };
        respond(StatusCode::OK, &headers, body)
    })
    .await;
    let proxy = Proxy::start(ClientConfig {
        // The head of a slow body waits this long at most.
        upstream_timeout: Duration::from_millis(300),
        ..client_config(origin.addr)
    })
    .await;
    (origin, proxy)
}

/// RFC 5861 §4, a body slower than the upstream wait: with a stale entry
/// that `stale-if-error` allows, the head waits for the body's first byte
/// rather than go out alone, so a drop before it still gets the stale
/// entry.
#[tokio::test]
async fn rfc5861_4_stale_if_error_holds_the_head_until_the_first_byte_and_serves_stale_on_a_drop() {
    let (origin, proxy) = stale_then(|| {
        vec![
            Step::Pause(Duration::from_millis(900)),
            Step::Fail("dropped before the first byte"),
        ]
    })
    .await;
    let path = "/slow-drop.js";
    let url = format!("http://{}{path}", origin.addr);
    let first = send(proxy.addr, forward(Method::GET, origin.addr, path)).await;
    assert!(first.body() == release(1));
    proxy.settled(&url).await;
    let reply = send(proxy.addr, forward(Method::GET, origin.addr, path)).await;
    assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
    assert!(reply.body() == release(1), "the stored body, whole");
    assert!(
        reply.cache_status().contains("detail=stale-if-error"),
        "{reply:?}"
    );
    assert_eq!(origin.requests_to(path), 2);
    proxy.assert_complete(&url, release(1));
}

/// RFC 5861 §4's limit: once bytes of the new answer went to the user
/// agent, nothing else can follow them; the body is cut (never completed
/// with stale bytes), and the stored entry is left as it was.
#[tokio::test]
async fn rfc5861_4_a_drop_after_bytes_went_to_the_user_agent_cuts_the_body() {
    let (origin, proxy) = stale_then(|| {
        vec![
            Step::Data(Bytes::from_static(&release(2)[..100_000])),
            Step::Pause(Duration::from_millis(50)),
            Step::Fail("dropped mid-body"),
        ]
    })
    .await;
    let path = "/late-drop.js";
    let url = format!("http://{}{path}", origin.addr);
    assert!(
        send(proxy.addr, forward(Method::GET, origin.addr, path))
            .await
            .body()
            == release(1)
    );
    proxy.settled(&url).await;
    let reply = send(proxy.addr, forward(Method::GET, origin.addr, path)).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert!(reply.body.is_err(), "a cut body must not end cleanly");
    assert!(
        !reply.cache_status().contains("stale-if-error"),
        "{reply:?}"
    );
    proxy.assert_complete(&url, release(1));
}

/// RFC 9111 §3.4 for an interrupted transfer: a plain upstream that said
/// `Accept-Ranges: bytes` with a strong ETag gets asked only for the rest
/// of the kept prefix (`Range: bytes=N-`, `If-Range`) instead of the whole
/// body again; the user agent gets the whole body, and the entry is whole.
#[tokio::test]
async fn rfc9111_3_4_an_interrupted_transfer_is_completed_by_range() {
    let origin = origin(|request, earlier| async move {
        let mut headers = vec![
            ("cache-control", "max-age=60".to_owned()),
            ("etag", "\"i1\"".to_owned()),
            ("accept-ranges", "bytes".to_owned()),
        ];
        if earlier == 0 {
            headers.push(("content-length", BODY_LEN.to_string()));
            let body = ScriptedBody::new([
                Step::Data(Bytes::from_static(&release(1)[..120_000])),
                Step::Pause(Duration::from_millis(50)),
                Step::Fail("cut mid-body"),
            ]);
            let headers: Vec<(&str, &str)> =
                headers.iter().map(|(n, v)| (*n, v.as_str())).collect();
            return respond(StatusCode::OK, &headers, body.boxed());
        }
        let range = request.headers()["range"].to_str().unwrap().to_owned();
        let from: usize = range
            .strip_prefix("bytes=")
            .and_then(|r| r.strip_suffix('-'))
            .unwrap()
            .parse()
            .unwrap();
        headers.push((
            "content-range",
            format!("bytes {from}-{}/{BODY_LEN}", BODY_LEN - 1),
        ));
        let headers: Vec<(&str, &str)> = headers.iter().map(|(n, v)| (*n, v.as_str())).collect();
        respond(
            StatusCode::PARTIAL_CONTENT,
            &headers,
            full(&release(1)[from..]),
        )
    })
    .await;
    let proxy = Proxy::start(client_config(origin.addr)).await;
    let path = "/big.iso";
    let url = format!("http://{}{path}", origin.addr);
    let cut = send(proxy.addr, forward(Method::GET, origin.addr, path)).await;
    assert!(cut.body.is_err(), "a cut body must not end cleanly");
    eventually("partial entry committed", || {
        proxy
            .entry(&url)
            .is_some_and(|e| e.completeness == Completeness::Partial)
    })
    .await;
    let prefix_len = proxy.entry(&url).unwrap().body_len;
    assert!(prefix_len > 0 && prefix_len < BODY_LEN as u64);

    let resumed = send(proxy.addr, forward(Method::GET, origin.addr, path)).await;
    assert_eq!(resumed.status, StatusCode::OK);
    assert!(resumed.body() == release(1), "the whole body");
    let seen = origin.seen_for(path);
    assert_eq!(seen.len(), 2);
    assert_eq!(
        seen[1].header("range"),
        Some(&*format!("bytes={prefix_len}-"))
    );
    assert_eq!(seen[1].header("if-range"), Some("\"i1\""));
    proxy.settled(&url).await;
    proxy.assert_complete(&url, release(1));
}

#[tokio::test]
async fn p22_without_stale_if_error_the_upstream_error_reaches_the_user_agent() {
    let stack = Stack::start().await;
    assert!(stack.get("/no-stale-if-error.js").await.body() == release(1));
    let reply = stack.get("/no-stale-if-error.js").await;
    assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(reply.body(), b"down for maintenance");
    assert_eq!(reply.header("retry-after"), Some("5"));
    // The error is not stored over the entry (P-20).
    stack
        .proxy
        .assert_complete(&stack.url("/no-stale-if-error.js"), release(1));
}

#[tokio::test]
async fn the_stats_path_answers_json_with_the_counters() {
    let stack = Stack::start().await;
    stack.get("/fresh.js").await;
    stack.get("/fresh.js").await;
    let request = Request::get("/.rproxy/stats")
        .header("host", "localhost")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let reply = send(stack.proxy.addr, request).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.header("content-type"), Some("application/json"));
    let stats: StatsSnapshot = serde_json::from_slice(reply.body()).unwrap();
    // The two GETs; the stats poll is not a request for the web.
    assert_eq!(stats.requests, 2, "{stats:?}");
    assert_eq!((stats.hits, stats.misses, stats.stored), (1, 1, 1));
    assert_eq!(stats.downstream_bytes, 2 * BODY_LEN as u64);
    let value: serde_json::Value = serde_json::from_slice(reply.body()).unwrap();
    assert_eq!(value["hits"], 1);
    assert_eq!(stack.tap.server.requests(), 1, "never goes upstream");
}

/// The refusal counters of a snapshot: total, client, upstream, overload,
/// proxy.
fn refusals(stats: &StatsSnapshot) -> (u64, u64, u64, u64, u64) {
    (
        stats.refused,
        stats.refused_client,
        stats.refused_upstream,
        stats.refused_overload,
        stats.refused_proxy,
    )
}

#[tokio::test]
async fn refusals_are_counted_by_fault_and_a_stored_body_failing_after_a_304_is_ours() {
    let stack = Stack::start().await;
    // The client's: a CONNECT to a port tunnels may not go to (403).
    let connect =
        "CONNECT example.com:25 HTTP/1.1\r\nHost: example.com:25\r\nConnection: close\r\n\r\n";
    let answer = raw_exchange(stack.proxy.addr, connect).await;
    assert!(answer.starts_with("HTTP/1.1 403"), "{answer}");
    assert_eq!(refusals(&stack.proxy.stats()), (1, 1, 0, 0, 0));

    // Ours: the stored body changed on disk, the upstream says 304 (it did
    // nothing wrong), and the body fails its check before the head goes
    // out: a 502, counted as the proxy's fault, not the upstream's.
    let url = stack.url("/etag.js");
    assert!(stack.get("/etag.js").await.body() == release(1));
    stack.proxy.settled(&url).await;
    stack.proxy.flip_stored_byte(&url, 1000);
    let reply = stack.get("/etag.js").await;
    assert_eq!(reply.status, StatusCode::BAD_GATEWAY, "{reply:?}");
    assert!(
        String::from_utf8_lossy(reply.body()).contains("failed its check after a 304"),
        "{reply:?}"
    );
    let stats = stack.proxy.stats();
    assert_eq!(refusals(&stats), (2, 1, 0, 0, 1), "{stats:?}");
    assert_eq!(stats.upstream_errors, 0, "{stats:?}");

    // The same counters in the JSON of `/.rproxy/stats`.
    let request = Request::get("/.rproxy/stats")
        .header("host", "localhost")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let reply = send(stack.proxy.addr, request).await;
    let value: serde_json::Value = serde_json::from_slice(reply.body()).unwrap();
    assert_eq!(value["refused"], 2, "{value}");
    assert_eq!(value["refused_client"], 1, "{value}");
    assert_eq!(value["refused_proxy"], 1, "{value}");
    assert_eq!(value["refused_upstream"], 0, "{value}");
}

#[tokio::test]
async fn an_unreachable_upstream_is_refused_as_the_upstreams_fault() {
    let closed = TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap()
        .local_addr()
        .unwrap();
    let proxy = Proxy::start(client_config(closed)).await;
    let reply = send(proxy.addr, forward(Method::GET, closed, "/fresh.js")).await;
    assert_eq!(reply.status, StatusCode::BAD_GATEWAY);
    assert_eq!(refusals(&proxy.stats()), (1, 0, 1, 0, 0));
}

// ---------------------------------------------------------------------------
// 12. Privacy

#[tokio::test]
async fn d_b1_private_and_cookie_responses_are_never_bases_for_other_urls() {
    let stack = Stack::start().await;
    // `private`: not stored at all in a shared cache.
    assert!(stack.get("/private/app-1.js").await.body() == release(1));
    assert!(stack.proxy.entry(&stack.url("/private/app-1.js")).is_none());
    assert!(stack.get("/private/app-2.js").await.body() == release(2));
    let seen = stack.tap.server.seen_for("/private/app-2.js");
    assert!(seen[0].header("hsync-signature").is_none(), "{seen:?}");

    // `Set-Cookie`: a shared cache does not keep it at all (A-6), so it is
    // no basis either. (A new stack: /private/app-2.js above is a
    // shareable neighbour.)
    let stack = Stack::start().await;
    assert!(stack.get("/cookie/app-1.js").await.body() == release(1));
    assert!(stack.proxy.entry(&stack.url("/cookie/app-1.js")).is_none());
    assert!(stack.get("/cookie/app-2.js").await.body() == release(2));
    let seen = stack.tap.server.seen_for("/cookie/app-2.js");
    assert!(seen[0].header("hsync-signature").is_none(), "{seen:?}");
    assert!(seen[0].header("hsync-basis").is_none());
    // Control: a shareable neighbour is used.
    assert!(stack.get("/cookie/app-3.js").await.body() == release(3));
    let seen = stack.tap.server.seen_for("/cookie/app-3.js");
    assert_eq!(
        seen[0].header("hsync-basis"),
        Some(&*basis_name(release(2)))
    );
}

#[tokio::test]
async fn d_b1_an_authorized_entry_is_not_the_basis_even_for_its_own_url() {
    let stack = Stack::start().await;
    // Stored (the origin said `public`) but kept for its user only.
    let alice = with_header(
        forward(Method::GET, stack.origin.addr, "/authorized.js"),
        "authorization",
        "Basic YWxpY2U6c2VjcmV0",
    );
    assert!(send(stack.proxy.addr, alice).await.body() == release(1));
    stack.proxy.settled(&stack.url("/authorized.js")).await;
    let stored = stack
        .proxy
        .entry(&stack.url("/authorized.js"))
        .expect("a public response to an authorized request is stored");
    assert!(!stored.shareable_as_basis);
    // `no-cache`: the next request goes up, and must not carry a signature
    // of what Alice was sent.
    assert!(stack.get("/authorized.js").await.body() == release(1));
    let seen = stack.tap.server.seen_for("/authorized.js");
    assert_eq!(seen.len(), 2);
    assert!(
        seen[1].header("hsync-signature").is_none(),
        "the signature of an authorized response went upstream on another request"
    );
}

#[tokio::test]
async fn a6_a_set_cookie_response_is_not_served_to_another_user() {
    let stack = Stack::start().await;
    let alice = stack.get("/cookie-fresh.js").await;
    assert_eq!(alice.header("set-cookie"), Some("session=alice-secret"));
    // Fresh for a minute, but not stored: Bob's answer is the origin's.
    let bob = stack.get("/cookie-fresh.js").await;
    assert!(bob.body() == release(1));
    assert!(!bob.cache_status().contains("hit"), "{bob:?}");
    assert_eq!(stack.origin.requests_to("/cookie-fresh.js"), 2);
    assert_eq!(stack.proxy.stats().stored, 0);
}

#[tokio::test]
async fn a6_a_public_response_is_stored_without_its_set_cookie() {
    let stack = Stack::start().await;
    let alice = stack.get("/cookie-public.js").await;
    assert_eq!(alice.header("set-cookie"), Some("session=alice-secret"));
    stack.proxy.settled(&stack.url("/cookie-public.js")).await;
    let bob = stack.get("/cookie-public.js").await;
    assert!(bob.cache_status().contains("hit"), "{bob:?}");
    assert!(bob.body() == release(1));
    assert!(
        bob.header("set-cookie").is_none(),
        "Bob got Alice's cookie from the cache: {bob:?}"
    );
    assert_eq!(stack.origin.requests_to("/cookie-public.js"), 1);
}

/// RFC 9111 §7.3: `Set-Cookie` alone does not keep a response out of a
/// shared cache. With `store-set-cookie` (the operator knows the site's
/// cookies ride on pages that are the same for everyone) Alice's answer is
/// stored and she keeps her cookie; Bob gets hits without it (A-9); and
/// the entry is never a basis (D-B1), for its URL or another.
#[tokio::test]
async fn rfc9111_7_3_with_store_set_cookie_a_cookie_response_is_stored_without_its_cookie() {
    let stack = Stack::start_with(|config| config.set_cookie = SetCookie::Stored).await;
    let url = stack.url("/cookie-fresh.js");
    let alice = stack.get("/cookie-fresh.js").await;
    assert_eq!(alice.header("set-cookie"), Some("session=alice-secret"));
    stack.proxy.settled(&url).await;
    // From disk, then from memory.
    for _ in 0..2 {
        let bob = stack.get("/cookie-fresh.js").await;
        assert!(bob.cache_status().contains("hit"), "{bob:?}");
        assert!(bob.body() == release(1));
        assert!(
            bob.header("set-cookie").is_none(),
            "Bob got Alice's cookie from the cache: {bob:?}"
        );
    }
    assert_eq!(stack.origin.requests_to("/cookie-fresh.js"), 1);
    let stored = stack.proxy.store().get(&CacheKey::parse(&url).unwrap());
    let stored = stored.expect("stored");
    assert!(!stored.meta.shareable_as_basis);
    assert!(
        !stored
            .meta
            .headers
            .iter()
            .any(|(name, _)| name == "set-cookie"),
        "{:?}",
        stored.meta.headers
    );

    // No basis for a neighbour either: nothing shareable is stored, so
    // the next release goes without a signature.
    assert!(stack.get("/cookie/app-1.js").await.body() == release(1));
    stack.proxy.settled(&stack.url("/cookie/app-1.js")).await;
    assert!(stack.get("/cookie/app-2.js").await.body() == release(2));
    let seen = stack.tap.server.seen_for("/cookie/app-2.js");
    assert!(seen[0].header("hsync-signature").is_none(), "{seen:?}");
    assert!(seen[0].header("hsync-basis").is_none(), "{seen:?}");
}

#[tokio::test]
async fn a_9_a_set_cookie_on_a_304_is_hers_and_never_replayed_to_another_user() {
    let stack = Stack::start().await;
    assert!(stack.get("/sliding.js").await.body() == release(1));
    stack.proxy.settled(&stack.url("/sliding.js")).await;
    let alice = with_header(
        forward(Method::GET, stack.origin.addr, "/sliding.js"),
        "cookie",
        "session=alice",
    );
    let alice = send(stack.proxy.addr, alice).await;
    assert!(alice.cache_status().contains("304"), "{alice:?}");
    assert_eq!(alice.header("set-cookie"), Some("session=alice-renewed"));
    // Fresh for a minute now: Bob is served from the cache (memory first,
    // then disk), never with her cookie.
    for _ in 0..2 {
        let bob = stack.get("/sliding.js").await;
        assert!(bob.cache_status().contains("hit"), "{bob:?}");
        assert!(bob.body() == release(1));
        assert!(
            bob.header("set-cookie").is_none(),
            "Bob got Alice's renewed cookie: {bob:?}"
        );
    }
    let stored = stack
        .proxy
        .store()
        .get(&CacheKey::parse(&stack.url("/sliding.js")).unwrap())
        .unwrap();
    assert!(
        !stored
            .meta
            .headers
            .iter()
            .any(|(name, _)| name == "set-cookie"),
        "{:?}",
        stored.meta.headers
    );
    assert_eq!(stack.origin.requests_to("/sliding.js"), 2);
}

#[tokio::test]
async fn a_9_a_304_that_makes_the_entry_private_or_vary_is_honoured() {
    for path in ["/turns-private.js", "/turns-vary.js"] {
        let stack = Stack::start().await;
        assert!(stack.get(path).await.body() == release(1));
        stack.proxy.settled(&stack.url(path)).await;
        let alice = with_header(
            forward(Method::GET, stack.origin.addr, path),
            "cookie",
            "session=alice",
        );
        let alice = send(stack.proxy.addr, alice).await;
        assert!(alice.cache_status().contains("304"), "{path}: {alice:?}");
        assert!(
            alice.body() == release(1),
            "{path}: she still gets the body"
        );
        // The entry is not hers to share any more: Bob goes to the origin.
        let bob = stack.get(path).await;
        assert!(!bob.cache_status().contains("hit"), "{path}: {bob:?}");
        assert!(bob.body() == release(1));
        assert_eq!(stack.origin.requests_to(path), 3, "{path}");
    }
}

/// Sends `request` and reads the body frame by frame: the bytes that
/// arrived, and whether the body ended cleanly.
async fn receive_frames(
    proxy: SocketAddr,
    request: Request<Full<Bytes>>,
    stop_after: usize,
) -> (Vec<u8>, bool) {
    let stream = TcpStream::connect(proxy).await.unwrap();
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(connection);
    let response = sender.send_request(request).await.unwrap();
    let mut body = response.into_body();
    let mut received = Vec::new();
    loop {
        if received.len() >= stop_after {
            return (received, false);
        }
        match tokio::time::timeout(Duration::from_secs(10), body.frame())
            .await
            .unwrap()
        {
            None => return (received, true),
            Some(Ok(frame)) => {
                if let Some(data) = frame.data_ref() {
                    received.extend_from_slice(data);
                }
            }
            Some(Err(_)) => return (received, false),
        }
    }
}

#[tokio::test]
async fn c_v3_a_byte_rotten_on_disk_never_leaves_and_the_next_request_refetches() {
    let stack = Stack::start().await;
    let url = stack.url("/large.txt");
    assert!(stack.get("/large.txt").await.body() == large_body());
    stack.proxy.settled(&url).await;
    // One byte changed in place, same length: bit rot, a stray write.
    let at = (3 << 20) + 5;
    stack.proxy.flip_stored_byte(&url, at);

    let request = forward(Method::GET, stack.origin.addr, "/large.txt");
    let (received, complete) = receive_frames(stack.proxy.addr, request, usize::MAX).await;
    assert!(!complete, "a rotten body was served as complete");
    assert!(
        received.len() <= at,
        "{} bytes went out, the bad one among them",
        received.len()
    );
    assert!(received == large_body()[..received.len()]);
    eventually("the entry is quarantined", || {
        stack.proxy.entry(&url).is_none()
    })
    .await;
    assert_eq!(stack.proxy.stats().digest_failures, 1);

    let again = stack.get("/large.txt").await;
    assert!(!again.cache_status().contains("hit"), "{again:?}");
    assert!(again.body() == large_body());
    assert_eq!(stack.origin.requests_to("/large.txt"), 2);
}

#[tokio::test]
async fn c_v3_a_user_agent_that_abandons_a_large_hit_leaves_the_entry_alone() {
    let stack = Stack::start().await;
    let url = stack.url("/large.txt");
    assert!(stack.get("/large.txt").await.body() == large_body());
    stack.proxy.settled(&url).await;
    let before = stack.proxy.stats().downstream_bytes;
    for _ in 0..3 {
        let request = forward(Method::GET, stack.origin.addr, "/large.txt");
        let (received, _) = receive_frames(stack.proxy.addr, request, 1 << 20).await;
        assert!(received == large_body()[..received.len()]);
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        stack.proxy.entry(&url).is_some(),
        "an abandoned transfer dropped a good entry"
    );
    assert_eq!(stack.proxy.stats().digest_failures, 0);
    // P-25: what they took is counted, not what they abandoned.
    let taken = stack.proxy.stats().downstream_bytes - before;
    assert!(
        taken < 3 * large_body().len() as u64,
        "{taken} bytes counted as delivered"
    );
    let hit = stack.get("/large.txt").await;
    assert!(hit.cache_status().contains("hit"), "{hit:?}");
    assert!(hit.body() == large_body());
    assert_eq!(stack.origin.requests_to("/large.txt"), 1);
}

#[tokio::test]
async fn p_25_hsync_never_reaches_a_user_agent_as_a_content_coding() {
    // A HEAD miss that an upstream answers as it would the GET (coded):
    // `send` checks that no hsync coding or header gets through.
    let (hostile, proxy) = seeded_behind(Hostile::BadDigest).await;
    let head = send(proxy.addr, forward(Method::HEAD, hostile.addr, "/app-2.js")).await;
    assert_eq!(head.status, StatusCode::OK);
    assert!(
        head.header("content-length").is_none(),
        "the coded length went through: {head:?}"
    );
    // A user agent offering hsync itself does not get it passed on.
    let offered = with_header(
        forward(Method::HEAD, hostile.addr, "/app-2.js"),
        "accept-encoding",
        "hsync, gzip",
    );
    send(proxy.addr, offered).await;
    let seen = hostile.seen_for("/app-2.js");
    let last = seen.last().unwrap().header("accept-encoding").unwrap_or("");
    assert!(!last.contains("hsync"), "{last}");

    // `hsync, identity` is hsync: decoded, checked and stored as the body.
    let (hostile, proxy) = seeded_behind(Hostile::WithIdentity).await;
    let reply = send(proxy.addr, forward(Method::GET, hostile.addr, "/app-2.js")).await;
    assert!(reply.body() == release(2), "served raw: {reply:?}");
    let url = format!("http://{}/app-2.js", hostile.addr);
    proxy.settled(&url).await;
    proxy.assert_complete(&url, release(2));

    // Other codings layered with hsync cannot be undone: a clean 502, and
    // nothing stored.
    let (hostile, proxy) = seeded_behind(Hostile::Layered).await;
    let reply = send(proxy.addr, forward(Method::GET, hostile.addr, "/app-2.js")).await;
    assert_eq!(reply.status, StatusCode::BAD_GATEWAY, "{reply:?}");
    assert!(
        proxy
            .entry(&format!("http://{}/app-2.js", hostile.addr))
            .is_none()
    );
}

/// With an accelerator that does not hold the basis, the stream carries
/// SIG frames, and the rebuilt body leaves as far as they vouch for it.
#[tokio::test]
async fn c_v3_a_basis_rotten_on_disk_never_shows_in_the_rebuilt_body() {
    let stack = Stack::start_keeping(|_| {}, 0).await;
    assert!(stack.get("/app-1.js").await.body() == release(1));
    let basis_url = stack.url("/app-1.js");
    stack.proxy.settled(&basis_url).await;
    // One byte of the basis changed in place, where release 2 copies it.
    stack.proxy.flip_stored_byte(&basis_url, 150_000);

    let request = forward(Method::GET, stack.origin.addr, "/app-2.js");
    let (received, complete) = receive_frames(stack.proxy.addr, request, usize::MAX).await;
    // What the SIG entries vouched for went; the block they did not, and
    // anything after it, never left.
    assert!(!complete, "a body rebuilt from a rotten basis completed");
    assert!(
        received.len() <= 150_000,
        "{} bytes went out",
        received.len()
    );
    assert!(
        received == release(2)[..received.len()],
        "wrong bytes reached the user agent"
    );
    eventually("the rotten basis is dropped", || {
        stack.proxy.entry(&basis_url).is_none()
    })
    .await;
    // The next request comes whole (no basis left) and right.
    let again = stack.get("/app-2.js").await;
    assert!(again.body() == release(2));
    let seen = stack.tap.server.seen_for("/app-2.js");
    assert!(seen[1].header("hsync-basis").is_none(), "{seen:?}");
}

/// Against a basis the accelerator holds, the stream comes without SIG
/// frames (issue 20): the whole body waits for END, fails its digest there
/// before a byte left, and is asked for again without a basis. The user
/// agent gets it right and whole; the rotten basis is dropped.
#[tokio::test]
async fn c_v3_a_basis_rotten_on_disk_against_a_held_body_is_caught_before_a_byte_leaves() {
    let stack = Stack::start().await;
    assert!(stack.get("/app-1.js").await.body() == release(1));
    let basis_url = stack.url("/app-1.js");
    stack.proxy.settled(&basis_url).await;
    stack.proxy.flip_stored_byte(&basis_url, 150_000);

    let request = forward(Method::GET, stack.origin.addr, "/app-2.js");
    let (received, complete) = receive_frames(stack.proxy.addr, request, usize::MAX).await;
    assert!(
        complete && received == release(2),
        "{} bytes",
        received.len()
    );
    let seen = stack.tap.server.seen_for("/app-2.js");
    assert_eq!(seen.len(), 2, "asked again: {seen:?}");
    assert!(
        seen[0].header("hsync-basis").is_some()
            && seen[0].header("hsync-signature").is_none()
            && seen[1].header("hsync-basis").is_none(),
        "{seen:?}"
    );
    eventually("the rotten basis is dropped", || {
        stack.proxy.entry(&basis_url).is_none()
    })
    .await;
}

/// L-13 on the client proxy: user agents that start a large response and
/// stop reading, as relays from upstream and as hits, hold no thread. With
/// four blocking threads in all and twelve stalled readers, a bystander is
/// still answered.
#[test]
fn l_13_readers_that_stop_reading_hold_no_thread() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .max_blocking_threads(4)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let origin = start_origin().await;
        let proxy = Proxy::start(client_config(origin.addr)).await;
        let stored = send(proxy.addr, forward(Method::GET, origin.addr, "/large.txt")).await;
        assert!(stored.body() == large_body());
        proxy
            .settled(&format!("http://{}/large.txt", origin.addr))
            .await;
        let mut stalled = Vec::new();
        for i in 0..12 {
            // Even: hits on the stored body; odd: relays of fresh copies.
            let target = match i % 2 {
                0 => format!("http://{}/large.txt", origin.addr),
                _ => format!("http://{}/large.txt?copy={i}", origin.addr),
            };
            let mut stream = TcpStream::connect(proxy.addr).await.unwrap();
            let request = format!("GET {target} HTTP/1.1\r\nHost: {}\r\n\r\n", origin.addr);
            stream.write_all(request.as_bytes()).await.unwrap();
            let mut head = [0; 1024];
            let n = stream.read(&mut head).await.unwrap();
            assert!(head[..n].starts_with(b"HTTP/1.1 200"), "{i}");
            stalled.push(stream); // and never read again
        }
        let started = Instant::now();
        let bystander = tokio::time::timeout(
            Duration::from_secs(5),
            send(proxy.addr, forward(Method::GET, origin.addr, "/app-2.js")),
        )
        .await
        .expect("a bystander answered while readers stall");
        assert!(bystander.body() == release(2));
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "{:?}",
            started.elapsed()
        );
        drop(stalled);
    });
}

#[tokio::test]
async fn p_25_max_forwards_0_is_answered_here_and_a_loop_is_a_loop_however_spaced() {
    let stack = Stack::start().await;
    let trace = with_header(
        forward(Method::TRACE, stack.origin.addr, "/echo"),
        "max-forwards",
        "0",
    );
    let trace = with_header(trace, "cookie", "session=alice");
    let reply = send(stack.proxy.addr, trace).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.header("content-type"), Some("message/http"));
    let echoed = String::from_utf8_lossy(reply.body()).into_owned();
    assert!(echoed.starts_with("TRACE "), "{echoed}");
    assert!(!echoed.contains("alice"), "credentials echoed: {echoed}");
    let options = with_header(
        forward(Method::OPTIONS, stack.origin.addr, "/"),
        "max-forwards",
        "0",
    );
    let reply = send(stack.proxy.addr, options).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert!(
        reply.header("allow").is_some_and(|a| a.contains("GET")),
        "{reply:?}"
    );
    assert_eq!(stack.tap.server.requests(), 0, "nothing went upstream");
    // Max-Forwards: 1 goes on, as 0.
    let options = with_header(
        forward(Method::OPTIONS, stack.origin.addr, "/"),
        "max-forwards",
        "1",
    );
    send(stack.proxy.addr, options).await;
    let seen = stack.tap.server.seen_for("/");
    assert_eq!(seen.last().unwrap().header("max-forwards"), Some("0"));

    for via in [
        "1.1  test-client",
        "1.1\ttest-client",
        "1.1 TEST-CLIENT",
        "1.0 other, 1.1 \t test-client (rproxy)",
    ] {
        let looped = with_header(
            forward(Method::GET, stack.origin.addr, "/app-1.js"),
            "via",
            via,
        );
        let reply = send(stack.proxy.addr, looped).await;
        assert_eq!(reply.status, StatusCode::LOOP_DETECTED, "{via:?}");
    }
}

/// C-V3 with D-A8: a stream cut between a window and the SIG entries that
/// vouch for it leaves a partial entry of what was vouched for (whole
/// blocks), never the unchecked window.
#[tokio::test]
async fn c_v3_a_cut_before_a_windows_sig_keeps_only_the_checked_prefix() {
    let upstream = origin(|_request, _| async move {
        let body = release(1);
        let mut encoder = Encoder::new(
            None,
            Some(body.len() as u64),
            EncoderOptions {
                zstd_level: 3,
                window_bytes: 64 << 10,
                ..EncoderOptions::default()
            },
        );
        let mut stream = Vec::new();
        encoder.push(body, &mut stream).unwrap();
        encoder.finish(&mut stream).unwrap();
        // Frames after the 12-byte header: kind, u32 length, payload. Cut
        // right after the last DELTA (kind 1), before its SIG.
        let (mut at, mut cut) = (12, 0);
        while at < stream.len() {
            let len = u32::from_be_bytes(stream[at + 1..at + 5].try_into().unwrap()) as usize;
            if stream[at] == 1 {
                cut = at + 5 + len;
            }
            at += 5 + len;
        }
        let steps = [
            Step::Data(Bytes::copy_from_slice(&stream[..cut])),
            Step::Pause(Duration::from_millis(20)),
            Step::Fail("cut before the last SIG"),
        ];
        respond(
            StatusCode::OK,
            &[("content-encoding", "hsync")],
            ScriptedBody::new(steps).boxed(),
        )
    })
    .await;
    let proxy = Proxy::start(client_config(upstream.addr)).await;
    let request = forward(Method::GET, upstream.addr, "/app-1.js");
    let (received, complete) = receive_frames(proxy.addr, request, usize::MAX).await;
    assert!(!complete);
    let url = format!("http://{}/app-1.js", upstream.addr);
    eventually("partial entry committed", || {
        proxy.stats().partial_stored == 1
    })
    .await;
    let partial = proxy.entry(&url).expect("a partial entry");
    assert_eq!(partial.completeness, Completeness::Partial);
    let (prefix, signature) = proxy.body_and_signature(&url);
    assert!(!prefix.is_empty() && prefix.len() < release(1).len());
    assert!(
        prefix == release(1)[..prefix.len()],
        "the partial body is a checked prefix"
    );
    assert_eq!(
        received.len(),
        prefix.len(),
        "the user agent got the checked prefix only"
    );
    assert!(
        signature == accelerator_signature_with_block_of(&prefix, &signature),
        "the partial's signature describes its prefix"
    );
}

/// L-13's memory on the client proxy: a user agent that stops reading gets
/// its body parked in a spool, so the relay finishes (the entry is stored
/// while nobody reads) and frees its state; the user agent, when it reads
/// again, gets every byte, checked.
#[tokio::test]
async fn l_13_a_stalled_user_agents_body_is_spooled_and_the_relay_finishes() {
    let origin = start_origin().await;
    let proxy = Proxy::start(client_config(origin.addr)).await;
    let mut stalled = Vec::new();
    for i in 0..8 {
        let target = format!("http://{}/large.txt?copy={i}", origin.addr);
        let mut stream = TcpStream::connect(proxy.addr).await.unwrap();
        let request = format!("GET {target} HTTP/1.1\r\nHost: {}\r\n\r\n", origin.addr);
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut head = vec![0; 512];
        let n = stream.read(&mut head).await.unwrap();
        head.truncate(n);
        stalled.push((stream, head)); // and not read for now
    }
    // Every relay ran to its end and committed, though nobody reads.
    let deadline = Instant::now() + Duration::from_secs(20);
    while proxy.stats().stored < 8 {
        assert!(
            Instant::now() < deadline,
            "relays still wait for their readers: {:?}",
            proxy.stats()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for (mut stream, mut received) in stalled {
        tokio::time::timeout(Duration::from_secs(10), async {
            let mut buf = vec![0; 1 << 16];
            loop {
                let body_start = received.windows(4).position(|w| w == b"\r\n\r\n");
                if let Some(at) = body_start
                    && received.len() >= at + 4 + large_body().len()
                {
                    break;
                }
                let n = stream.read(&mut buf).await.unwrap();
                assert!(n > 0, "the body ended early");
                received.extend_from_slice(&buf[..n]);
            }
        })
        .await
        .expect("the spooled body arrives");
        let at = received.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
        assert!(received[..at].starts_with(b"HTTP/1.1 200"));
        assert!(received[at..] == *large_body(), "the spooled body differs");
    }
}
