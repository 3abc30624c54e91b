//! Hostile HTTP against both proxies' listeners and their upstream
//! response paths (RELIABILITY.md B1: P-1 … P-7, P-9 … P-11, P-13 and
//! P-17 … P-19; P-8, P-12, P-14 … P-16, P-20, P-22 and P-23 are covered in
//! other files).
//!
//! Everything runs in-process on 127.0.0.1:0. Request-side cases write raw
//! bytes over TCP to the client proxy (an ordinary caching proxy in front
//! of a recording origin) and to the accelerator (in front of the same
//! origin), then read to EOF within [`DEADLINE`]: the status line, whether
//! the proxy closed, and what the origin saw. Response-side cases put a
//! raw-TCP fake origin, written here, behind the accelerator, behind a
//! client proxy, and behind a client proxy → accelerator chain: it answers
//! with malformed bytes and counts connections, requests and connections
//! reused after a malformed answer.
//!
//! Cases the proxies get wrong today are `#[ignore]`d with what goes wrong,
//! so the branch stays green while the test keeps saying what is required.

mod support;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Request, Response, Uri};
use http_body_util::{BodyExt, Full};
use rproxy::accelerator::AcceleratorConfig;
use rproxy::cache::{CacheKey, Completeness};
use rproxy::client_proxy::ClientConfig;
use rproxy::http::server::{Handler, ProxyBody, RequestBody};
use support::topology::{
    Accelerator, Cache, ClientProxy, Listen, Server, accelerator_config, serve,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// How long a refused connection may stay open before the test calls it
/// "not closed".
const DEADLINE: Duration = Duration::from_secs(5);

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn full(bytes: impl Into<Bytes>) -> ProxyBody {
    Full::new(bytes.into())
        .map_err(|never| match never {})
        .boxed()
}

// ---------------------------------------------------------------------------
// A recording origin (hyper, through rproxy's own server loop)

/// A request the origin saw. `body` is `None` while it is being read, and
/// stays so when the connection died under it.
#[derive(Debug, Clone)]
struct Seen {
    uri: Uri,
    headers: HeaderMap,
    body: Option<Result<Vec<u8>, String>>,
}

#[derive(Default)]
struct Origin {
    seen: Mutex<Vec<Seen>>,
}

impl Origin {
    fn requests(&self) -> usize {
        self.seen.lock().unwrap().len()
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    fn requests_to(&self, path: &str) -> usize {
        self.seen().iter().filter(|s| s.uri.path() == path).count()
    }
}

impl Handler for Origin {
    async fn handle(self: Arc<Self>, request: Request<RequestBody>) -> Response<ProxyBody> {
        let (parts, body) = request.into_parts();
        let index = {
            let mut seen = self.seen.lock().unwrap();
            seen.push(Seen {
                uri: parts.uri.clone(),
                headers: parts.headers.clone(),
                body: None,
            });
            seen.len() - 1
        };
        let body = match body.collect().await {
            Ok(body) => Ok(body.to_bytes().to_vec()),
            Err(e) => Err(e.to_string()),
        };
        let len = body.as_ref().map_or(0, Vec::len);
        self.seen.lock().unwrap()[index].body = Some(body);
        let mut response = Response::new(full(""));
        let headers = response.headers_mut();
        let path = parts.uri.path();
        let reply: String = match path {
            "/page" => {
                headers.insert("cache-control", HeaderValue::from_static("max-age=60"));
                "the page\n".into()
            }
            "/secret" => "SECRET\n".into(),
            "/vary-xfh" => {
                headers.insert("cache-control", HeaderValue::from_static("max-age=60"));
                headers.insert("vary", HeaderValue::from_static("X-Variant"));
                "varies on X-Variant\n".into()
            }
            "/vary-star" => {
                headers.insert("cache-control", HeaderValue::from_static("max-age=60"));
                headers.insert("vary", HeaderValue::from_static("*"));
                "varies on everything\n".into()
            }
            _ => format!("{} {path} with {len} body bytes\n", parts.method),
        };
        *response.body_mut() = full(reply);
        response
    }
}

async fn start_accelerator(origin: SocketAddr) -> Accelerator {
    Accelerator::start(AcceleratorConfig {
        origin_timeout: Duration::from_secs(3),
        basis_store_bytes: 1 << 20,
        max_stored_body: 64 << 10,
        ..accelerator_config(origin)
    })
    .await
}

type Client = ClientProxy;

/// A caching client proxy in front of `upstream`, with short timeouts and
/// a small cache.
async fn start_client(upstream: SocketAddr) -> Client {
    let config = ClientConfig {
        upstream_timeout: Duration::from_secs(3),
        lock_timeout: Duration::from_secs(3),
        max_object_bytes: 1 << 20,
        memory_cache_bytes: 1 << 20,
        ..support::proxy::client_config(&format!("http://{upstream}"))
    };
    ClientProxy::start_with(config, Cache::Temp(8 << 20), Listen::default()).await
}

impl Client {
    fn stored(&self) -> usize {
        self.store().len()
    }

    /// The entry for `url`, whatever its completeness.
    fn entry(&self, url: &str) -> Option<Completeness> {
        self.store()
            .lookup(&CacheKey::parse(url).unwrap())
            .map(|e| e.completeness)
    }
}

/// The recording origin, with the client proxy (an ordinary caching proxy
/// whose upstream is the origin) and the accelerator in front of it.
struct Rig {
    origin: Server<Origin>,
    origin_addr: SocketAddr,
    accelerator: Accelerator,
    client: Client,
}

impl Rig {
    async fn start() -> Rig {
        let origin = serve(Arc::new(Origin::default()), Listen::default()).await;
        let origin_addr = origin.addr;
        Rig {
            accelerator: start_accelerator(origin_addr).await,
            client: start_client(origin_addr).await,
            origin,
            origin_addr,
        }
    }

    fn fronts(&self) -> [Front; 2] {
        [
            Front {
                name: "client proxy",
                addr: self.client.addr,
                prefix: format!("http://{}", self.origin_addr),
            },
            Front {
                name: "accelerator",
                addr: self.accelerator.addr,
                prefix: String::new(),
            },
        ]
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.origin_addr)
    }
}

/// One proxy's listener and how a request target for it is written: the
/// client proxy is asked as `curl -x` asks (absolute-form), the accelerator
/// in origin-form.
struct Front {
    name: &'static str,
    addr: SocketAddr,
    prefix: String,
}

impl Front {
    fn target(&self, path: &str) -> String {
        format!("{}{path}", self.prefix)
    }
}

// ---------------------------------------------------------------------------
// Raw exchanges

/// Everything a proxy sent back on one connection.
struct Exchange {
    raw: Vec<u8>,
    /// The proxy closed (EOF or reset) within [`DEADLINE`].
    closed: bool,
}

#[derive(Debug)]
struct Reply {
    status: u16,
    head: String,
    body: Vec<u8>,
    /// The framing said the body ended (Content-Length reached, or the
    /// last chunk seen).
    complete: bool,
}

impl Reply {
    fn status_line(&self) -> &str {
        self.head.lines().next().unwrap_or("")
    }

    /// The first field `name` (lower-case), trimmed.
    fn header(&self, name: &str) -> Option<String> {
        self.head.lines().skip(1).find_map(|line| {
            let (n, v) = line.split_once(':')?;
            n.trim()
                .eq_ignore_ascii_case(name)
                .then(|| v.trim().to_owned())
        })
    }
}

impl Exchange {
    fn replies(&self) -> Vec<Reply> {
        parse_replies(&self.raw, self.closed)
    }

    fn status(&self) -> Option<u16> {
        self.replies().first().map(|r| r.status)
    }

    fn describe(&self) -> String {
        let replies = self.replies();
        let statuses: Vec<String> = replies
            .iter()
            .map(|r| {
                format!(
                    "{}{}",
                    r.status_line(),
                    if r.complete { "" } else { " (cut)" }
                )
            })
            .collect();
        format!(
            "replies {statuses:?}, {}",
            if self.closed { "closed" } else { "left open" }
        )
    }
}

/// Writes `request` and reads until the proxy closes, or [`DEADLINE`].
async fn exchange(addr: SocketAddr, request: &[u8]) -> Exchange {
    let stream = TcpStream::connect(addr).await.unwrap();
    let (mut reader, mut writer) = stream.into_split();
    let request = request.to_vec();
    // The proxy may refuse before it has read everything: writing must not
    // hold up reading.
    let writing = tokio::spawn(async move {
        let _ = writer.write_all(&request).await;
        writer
    });
    let mut raw = Vec::new();
    let mut buf = vec![0u8; 64 << 10];
    let deadline = tokio::time::Instant::now() + DEADLINE;
    let closed = loop {
        match tokio::time::timeout_at(deadline, reader.read(&mut buf)).await {
            Err(_) => break false,
            Ok(Ok(0) | Err(_)) => break true,
            Ok(Ok(n)) => raw.extend_from_slice(&buf[..n]),
        }
    };
    // Keep our half open until here: a half-closed socket would look like
    // the end of a close-delimited request.
    drop(writing.await);
    Exchange { raw, closed }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

fn parse_replies(mut raw: &[u8], closed: bool) -> Vec<Reply> {
    let mut replies = Vec::new();
    while let Some(end) = find(raw, b"\r\n\r\n") {
        let head = text(&raw[..end]);
        let Some(status) = head.get(9..12).and_then(|s| s.parse().ok()) else {
            break;
        };
        raw = &raw[end + 4..];
        let lower = head.to_ascii_lowercase();
        let header = |name: &str| {
            lower.lines().skip(1).find_map(|l| {
                let (n, v) = l.split_once(':')?;
                (n.trim() == name).then(|| v.trim().to_owned())
            })
        };
        let (body, complete, used) =
            if status == 304 || status == 204 || (100..200).contains(&status) {
                (Vec::new(), true, 0)
            } else if header("transfer-encoding").is_some_and(|v| v.contains("chunked")) {
                dechunk(raw)
            } else if let Some(len) = header("content-length").and_then(|v| v.parse::<usize>().ok())
            {
                let take = len.min(raw.len());
                (raw[..take].to_vec(), take == len, take)
            } else {
                (raw.to_vec(), closed, raw.len())
            };
        replies.push(Reply {
            status,
            head,
            body,
            complete,
        });
        raw = &raw[used..];
        if !complete {
            break;
        }
    }
    replies
}

/// A chunked body: (data, whether the last chunk came, bytes used).
fn dechunk(chunked: &[u8]) -> (Vec<u8>, bool, usize) {
    let mut body = Vec::new();
    let mut at = 0;
    loop {
        let Some(line_end) = find(&chunked[at..], b"\r\n") else {
            return (body, false, chunked.len());
        };
        let line = text(&chunked[at..at + line_end]);
        let size_text = line.split(';').next().unwrap_or("").trim();
        let Ok(size) = usize::from_str_radix(size_text, 16) else {
            return (body, false, chunked.len());
        };
        at += line_end + 2;
        if size == 0 {
            // Trailer fields, then an empty line.
            loop {
                match find(&chunked[at..], b"\r\n") {
                    Some(0) => return (body, true, at + 2),
                    Some(end) => at += end + 2,
                    None => return (body, false, chunked.len()),
                }
            }
        }
        if chunked.len() < at + size + 2 {
            body.extend_from_slice(&chunked[at.min(chunked.len())..]);
            return (body, false, chunked.len());
        }
        body.extend_from_slice(&chunked[at..at + size]);
        at += size + 2;
    }
}

/// A request with `lines` (each ending in CRLF) after the request line and
/// Host, then the empty line and `body`.
fn raw_request(
    method: &str,
    target: &str,
    version: &str,
    host: &str,
    lines: &str,
    body: &str,
) -> Vec<u8> {
    format!("{method} {target} {version}\r\nHost: {host}\r\n{lines}\r\n{body}").into_bytes()
}

// ---------------------------------------------------------------------------
// Request side: refused with 400 and a close, nothing upstream

/// One malformed request: a name for failure messages, the method, the
/// header lines (after Host) and the body.
struct Case {
    name: &'static str,
    method: &'static str,
    version: &'static str,
    lines: &'static str,
    body: &'static str,
}

const fn case(
    name: &'static str,
    method: &'static str,
    lines: &'static str,
    body: &'static str,
) -> Case {
    Case {
        name,
        method,
        version: "HTTP/1.1",
        lines,
        body,
    }
}

/// Sends every case to both proxies (a fresh rig per case, so one case's
/// upstream requests are not blamed on another) and requires `statuses`,
/// a close where `close`, and no upstream request at all. Returns the
/// failures, one line each.
async fn refused(cases: &[Case], statuses: &[u16], close: bool) -> Vec<String> {
    let mut failures = Vec::new();
    for case in cases {
        let rig = Rig::start().await;
        for front in rig.fronts() {
            let before = rig.origin.requests();
            let request = raw_request(
                case.method,
                &front.target("/page"),
                case.version,
                &rig.origin_addr.to_string(),
                case.lines,
                case.body,
            );
            let got = exchange(front.addr, &request).await;
            let upstream = rig.origin.requests() - before;
            let ok = got.status().is_some_and(|s| statuses.contains(&s))
                && (got.closed || !close)
                && upstream == 0;
            if !ok {
                failures.push(format!(
                    "{} at the {}: {}, {upstream} origin request(s)",
                    case.name,
                    front.name,
                    got.describe()
                ));
            }
        }
        if rig.client.stored() != 0 {
            failures.push(format!("{}: the client proxy stored a response", case.name));
        }
    }
    failures
}

fn assert_none(failures: Vec<String>) {
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}

// P-1: hyper's server takes Transfer-Encoding over Content-Length, removes
// Content-Length before the handler sees the request (so the proxies
// cannot tell), forwards the request and closes afterwards.
#[tokio::test]
async fn p1_content_length_with_transfer_encoding_is_refused_in_both_orders() {
    let body = "5\r\nhello\r\n0\r\n\r\n";
    let cases = [
        case(
            "GET CL then TE",
            "GET",
            "Content-Length: 5\r\nTransfer-Encoding: chunked\r\n",
            body,
        ),
        case(
            "GET TE then CL",
            "GET",
            "Transfer-Encoding: chunked\r\nContent-Length: 5\r\n",
            body,
        ),
        case(
            "POST CL then TE",
            "POST",
            "Content-Length: 5\r\nTransfer-Encoding: chunked\r\n",
            body,
        ),
        case(
            "POST TE then CL",
            "POST",
            "Transfer-Encoding: chunked\r\nContent-Length: 5\r\n",
            body,
        ),
    ];
    assert_none(refused(&cases, &[400], true).await);
}

// P-2, identical values: two `Content-Length: 5` fields are accepted as one
// (hyper's server keeps the first, RFC 9110 §8.6 allows it); `5, 5` in one
// field is refused like any list (hyper parses the field as one number).
#[tokio::test]
async fn p2_differing_content_lengths_are_refused() {
    let cases = [
        case(
            "two fields 5 and 6",
            "POST",
            "Content-Length: 5\r\nContent-Length: 6\r\n",
            "hello!",
        ),
        case(
            "5, 6 in one field",
            "POST",
            "Content-Length: 5, 6\r\n",
            "hello!",
        ),
        case(
            "5, 5 in one field",
            "POST",
            "Content-Length: 5, 5\r\n",
            "hello",
        ),
    ];
    assert_none(refused(&cases, &[400], true).await);
}

#[tokio::test]
async fn p2_identical_content_length_fields_are_accepted_as_one() {
    let rig = Rig::start().await;
    for front in rig.fronts() {
        let request = raw_request(
            "POST",
            &front.target("/post"),
            "HTTP/1.1",
            &rig.origin_addr.to_string(),
            "Content-Length: 5\r\nContent-Length: 5\r\nConnection: close\r\n",
            "hello",
        );
        let got = exchange(front.addr, &request).await;
        let replies = got.replies();
        assert_eq!(replies.len(), 1, "{}: {}", front.name, got.describe());
        assert_eq!(replies[0].status, 200, "{}", front.name);
        assert_eq!(text(&replies[0].body), "POST /post with 5 body bytes\n");
    }
    let seen = rig.origin.seen();
    assert_eq!(seen.len(), 2);
    for s in seen {
        assert_eq!(s.body, Some(Ok(b"hello".to_vec())));
        assert_eq!(s.headers.get_all("content-length").iter().count(), 1);
    }
}

#[tokio::test]
async fn p3_malformed_content_length_values_are_refused() {
    let cases = [
        case("+5", "POST", "Content-Length: +5\r\n", "hello"),
        case("0x5", "POST", "Content-Length: 0x5\r\n", "hello"),
        case("-1", "POST", "Content-Length: -1\r\n", "hello"),
        case("5a", "POST", "Content-Length: 5a\r\n", "hello"),
        case("empty", "POST", "Content-Length:\r\n", "hello"),
        case(
            "21 digits",
            "POST",
            "Content-Length: 100000000000000000000\r\n",
            "hello",
        ),
        // A GET's body is framed the same way, and cached answers are
        // at stake: the same refusal.
        case("+5 on a GET", "GET", "Content-Length: +5\r\n", "hello"),
        case("0x5 on a GET", "GET", "Content-Length: 0x5\r\n", "hello"),
        case("empty on a GET", "GET", "Content-Length:\r\n", "hello"),
    ];
    assert_none(refused(&cases, &[400], true).await);
}

// ` 5 `: the blanks around a field value are optional whitespace (RFC 9112
// §5.1), not part of the value; httparse strips them, so both proxies see
// `5` and forward a good request.
#[tokio::test]
async fn p3_a_content_length_with_blanks_around_it_is_refused() {
    let cases = [case("' 5 '", "POST", "Content-Length:  5 \r\n", "hello")];
    assert_none(refused(&cases, &[400], true).await);
}

#[tokio::test]
async fn p4_unusable_transfer_encodings_are_refused() {
    let body = "5\r\nhello\r\n0\r\n\r\n";
    let http_10 = Case {
        version: "HTTP/1.0",
        ..case(
            "TE on HTTP/1.0",
            "POST",
            "Transfer-Encoding: chunked\r\n",
            body,
        )
    };
    let cases = [
        case("xchunked", "POST", "Transfer-Encoding: xchunked\r\n", body),
        case(
            "space before the colon",
            "POST",
            "Transfer-Encoding : chunked\r\n",
            body,
        ),
        http_10,
    ];
    assert_none(refused(&cases, &[400], true).await);
}

// hyper's server only asks whether the last coding is `chunked`, and
// A request's Transfer-Encoding must be exactly `chunked`: a proxy that
// drops the field as hop-by-hop would otherwise hand the origin, say, gzip
// bytes as if they were the body.
#[tokio::test]
async fn p4_transfer_encoding_lists_are_refused() {
    let body = "5\r\nhello\r\n0\r\n\r\n";
    let cases = [
        case(
            "chunked, chunked",
            "POST",
            "Transfer-Encoding: chunked, chunked\r\n",
            body,
        ),
        case(
            "gzip, chunked",
            "POST",
            "Transfer-Encoding: gzip, chunked\r\n",
            body,
        ),
    ];
    assert_none(refused(&cases, &[400], true).await);
}

// httparse strips the trailing tab before anyone sees it: to hyper (and
// to RFC 9112, for which it is optional whitespace) this is `chunked`.
#[tokio::test]
async fn p4_a_trailing_tab_after_chunked_is_refused() {
    let body = "5\r\nhello\r\n0\r\n\r\n";
    let cases = [case(
        "chunked + tab",
        "POST",
        "Transfer-Encoding: chunked\t\r\n",
        body,
    )];
    assert_none(refused(&cases, &[400], true).await);
}

/// The bad chunked request bodies of P-5 (request side).
const BAD_CHUNKS: [(&str, &str); 7] = [
    ("17 hex digits", "10000000000000005\r\nhello\r\n0\r\n\r\n"),
    ("+ prefix", "+5\r\nhello\r\n0\r\n\r\n"),
    ("0x prefix", "0x5\r\nhello\r\n0\r\n\r\n"),
    ("data longer than declared", "5\r\nhelloEXTRA\r\n0\r\n\r\n"),
    ("bare LF", "5\nhello\r\n0\r\n\r\n"),
    ("CR in chunk-ext", "5;a=b\rc\r\nhello\r\n0\r\n\r\n"),
    ("LF in chunk-ext", "5;a=b\nc\r\nhello\r\n0\r\n\r\n"),
];

// Whatever the status (the test below asks for 400), the origin never sees
// a whole body.
#[tokio::test]
async fn p5_malformed_request_chunks_never_reach_the_origin_as_a_body() {
    for (name, body) in BAD_CHUNKS {
        let rig = Rig::start().await;
        for front in rig.fronts() {
            let request = raw_request(
                "POST",
                &front.target("/post"),
                "HTTP/1.1",
                &rig.origin_addr.to_string(),
                "Transfer-Encoding: chunked\r\n",
                body,
            );
            let got = exchange(front.addr, &request).await;
            assert!(
                got.closed,
                "{name} at the {}: {}",
                front.name,
                got.describe()
            );
            assert!(
                got.replies().iter().all(|r| r.status >= 400),
                "{name} at the {}: {}",
                front.name,
                got.describe()
            );
        }
        for seen in rig.origin.seen() {
            assert!(
                !matches!(seen.body, Some(Ok(_))),
                "{name}: the origin got a whole body: {seen:?}"
            );
        }
    }
}

#[tokio::test]
async fn p5_malformed_request_chunks_are_refused_with_400() {
    let cases: Vec<Case> = BAD_CHUNKS
        .iter()
        .map(|(name, body)| case(name, "POST", "Transfer-Encoding: chunked\r\n", body))
        .collect();
    assert_none(refused(&cases, &[400], true).await);
}

// A bad chunk that comes after the head went upstream (the case above has
// it in the head's read, and the head never leaves): the origin sees the
// head and a body that fails, the client still gets 400 and a close.
#[tokio::test]
async fn p5_a_malformed_request_chunk_after_the_head_went_upstream_is_a_400() {
    let rig = Rig::start().await;
    for front in rig.fronts() {
        let before = rig.origin.requests_to("/late");
        let head = raw_request(
            "POST",
            &front.target("/late"),
            "HTTP/1.1",
            &rig.origin_addr.to_string(),
            "Transfer-Encoding: chunked\r\n",
            "5\r\nhello\r\n",
        );
        let stream = TcpStream::connect(front.addr).await.unwrap();
        let (mut reader, mut writer) = stream.into_split();
        writer.write_all(&head).await.unwrap();
        // The bad chunk only once the origin is reading the body.
        let deadline = tokio::time::Instant::now() + DEADLINE;
        while rig.origin.requests_to("/late") == before {
            assert!(
                tokio::time::Instant::now() < deadline,
                "{}: no head upstream",
                front.name
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        writer.write_all(b"+5\r\nhello\r\n0\r\n\r\n").await.unwrap();
        let mut raw = Vec::new();
        let closed = tokio::time::timeout(DEADLINE, reader.read_to_end(&mut raw))
            .await
            .is_ok();
        let got = Exchange { raw, closed };
        assert_eq!(
            got.status(),
            Some(400),
            "{}: {}",
            front.name,
            got.describe()
        );
        assert!(got.closed, "{}: {}", front.name, got.describe());
        drop(writer);
    }
    for seen in rig.origin.seen() {
        assert!(
            !matches!(seen.body, Some(Ok(_))),
            "a whole body upstream: {seen:?}"
        );
    }
}

#[tokio::test]
async fn p6_obs_fold_in_request_headers_is_refused() {
    let cases = [case("obs-fold", "GET", "X-Folded: a\r\n  b\r\n", "")];
    assert_none(refused(&cases, &[400], false).await);
}

#[tokio::test]
async fn p7_nul_bare_cr_and_spaces_in_names_are_refused() {
    let cases = [
        case("NUL in a value", "GET", "X-Bad: a\0b\r\n", ""),
        case("bare CR in a value", "GET", "X-Bad: a\rb\r\n", ""),
        case("space in a name", "GET", "X Bad: a\r\n", ""),
    ];
    assert_none(refused(&cases, &[400], false).await);
}

#[tokio::test]
async fn p7_underscores_in_names_are_refused() {
    let cases = [case("underscore in a name", "GET", "X_Bad: a\r\n", "")];
    assert_none(refused(&cases, &[400], false).await);
}

#[tokio::test]
async fn p7_a_bare_lf_in_a_value_is_refused() {
    let cases = [case(
        "bare LF in a value",
        "GET",
        "X-Bad: a\nInjected: b\r\n",
        "",
    )];
    assert_none(refused(&cases, &[400], false).await);
}

// The framing guard in front of hyper (src/http/head_guard/) follows pipelined
// requests through their bodies: the good ones before a refused head are
// answered first (the one in flight too), then the 400, then the close.
#[tokio::test]
async fn a_refused_head_after_pipelined_requests_is_answered_after_them() {
    let rig = Rig::start().await;
    for front in rig.fronts() {
        let host = rig.origin_addr.to_string();
        let request = |method, path, lines, body| {
            raw_request(method, &front.target(path), "HTTP/1.1", &host, lines, body)
        };
        let stream = [
            request("POST", "/post", "Content-Length: 5\r\n", "hello"),
            request(
                "POST",
                "/post",
                "Transfer-Encoding: chunked\r\n",
                "3;ext=1\r\nabc\r\n2\r\nde\r\n0\r\nTrailer: x\r\n\r\n",
            ),
            request("GET", "/other", "", ""),
            request("GET", "/secret", "X-Bad: a\nInjected: b\r\n", ""),
            request("GET", "/secret", "", ""),
        ]
        .concat();
        let before = rig.origin.requests();
        let got = exchange(front.addr, &stream).await;
        let statuses: Vec<u16> = got.replies().iter().map(|r| r.status).collect();
        assert_eq!(statuses, [200, 200, 200, 400], "{}", front.name);
        assert!(got.closed, "{}: {}", front.name, got.describe());
        let replies = got.replies();
        assert_eq!(text(&replies[1].body), "POST /post with 5 body bytes\n");
        assert_eq!(rig.origin.requests() - before, 3, "{}", front.name);
    }
    assert_eq!(rig.origin.requests_to("/secret"), 0);
}

// A refused head that arrives in two reads: hyper got its first part with
// the first read and sees the stream end, alone on its connection or after
// a request in flight.
#[tokio::test]
async fn a_refused_head_split_across_reads_is_refused() {
    let rig = Rig::start().await;
    for front in rig.fronts() {
        let host = rig.origin_addr.to_string();
        let good = raw_request("GET", &front.target("/other"), "HTTP/1.1", &host, "", "");
        let bad = raw_request(
            "POST",
            &front.target("/secret"),
            "HTTP/1.1",
            &host,
            "Transfer-Encoding: chunked\r\nContent-Length: 5\r\n",
            "5\r\nhello\r\n0\r\n\r\n",
        );
        for (first, expected) in [(&[][..], &[400][..]), (&good[..], &[200, 400][..])] {
            let stream = TcpStream::connect(front.addr).await.unwrap();
            let (mut reader, mut writer) = stream.into_split();
            writer
                .write_all(&[first, &bad[..20]].concat())
                .await
                .unwrap();
            tokio::time::sleep(Duration::from_millis(100)).await;
            writer.write_all(&bad[20..]).await.unwrap();
            let mut raw = Vec::new();
            tokio::time::timeout(DEADLINE, reader.read_to_end(&mut raw))
                .await
                .expect("closed in time")
                .unwrap();
            let statuses: Vec<u16> = parse_replies(&raw, true).iter().map(|r| r.status).collect();
            assert_eq!(statuses, expected, "{}", front.name);
        }
    }
    assert_eq!(rig.origin.requests_to("/secret"), 0);
}

// hyper gives a request without Content-Length or Transfer-Encoding an
// empty body (RFC 9112 §6.3), so the close-delimited body of CVE-2026-2836
// never exists; what the table asks for is a refusal instead.
#[tokio::test]
async fn p11_an_http_10_body_without_content_length_is_refused() {
    let cases = [
        Case {
            version: "HTTP/1.0",
            ..case("HTTP/1.0 POST, no CL", "POST", "", "a=1&b=2")
        },
        Case {
            version: "HTTP/1.0",
            ..case(
                "HTTP/1.0 POST, no CL, keep-alive",
                "POST",
                "Connection: keep-alive\r\n",
                "a=1&b=2",
            )
        },
    ];
    assert_none(refused(&cases, &[400, 411], true).await);
}

// ---------------------------------------------------------------------------
// P-9: smuggling on a cache hit

/// xorshift64*, enough for lengths.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) % n
    }
}

// A hit is answered without reading the request body; hyper then drains
// what is already buffered, or closes when the body is not all there. GET
// and POST alternate on both proxies (a POST passes to the origin with its
// body); the hidden `GET /secret` lies wholly inside the declared body, a
// pipelined `GET /page` follows it, and now and then the body is larger
// than 64 KiB. Nothing may answer `/secret`, and the origin never sees it.
#[tokio::test]
async fn p9_a_request_hidden_in_a_body_is_never_answered() {
    let rig = Rig::start().await;
    // Cache the page first.
    let host = rig.origin_addr.to_string();
    let warm = raw_request(
        "GET",
        &rig.url("/page"),
        "HTTP/1.1",
        &host,
        "Connection: close\r\n",
        "",
    );
    let got = exchange(rig.client.addr, &warm).await;
    assert_eq!(got.status(), Some(200));
    assert_eq!(
        rig.client.entry(&rig.url("/page")),
        Some(Completeness::Complete)
    );
    let fronts = rig.fronts();
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut answered = [0usize; 2];
    for round in 0..1000 {
        let front = &fronts[round % 2];
        let method = if round % 4 < 2 { "GET" } else { "POST" };
        let smuggled = format!(
            "GET {} HTTP/1.1\r\nHost: {host}\r\n\r\n",
            front.target("/secret")
        );
        // Padding before and after the hidden request; now and then past
        // a 64 KiB drain cap.
        let pad = |rng: &mut Rng| {
            let len = if rng.below(10) == 0 {
                rng.below(100_000)
            } else {
                rng.below(2_000)
            };
            "x".repeat(len as usize)
        };
        let body = format!("{}{smuggled}{}", pad(&mut rng), pad(&mut rng));
        let mut request = raw_request(
            method,
            &front.target("/page"),
            "HTTP/1.1",
            &host,
            &format!("Content-Length: {}\r\n", body.len()),
            &body,
        );
        request.extend(raw_request(
            "GET",
            &front.target("/page"),
            "HTTP/1.1",
            &host,
            "Connection: close\r\n",
            "",
        ));
        let got = exchange(front.addr, &request).await;
        assert!(got.closed, "round {round}: {}", got.describe());
        let replies = got.replies();
        for reply in &replies {
            assert!(
                !text(&reply.body).contains("SECRET"),
                "round {round} ({method} at the {}): answered the hidden request: {}",
                front.name,
                got.describe()
            );
        }
        answered[round % 2] += replies.len();
    }
    assert_eq!(rig.origin.requests_to("/secret"), 0);
}

// ---------------------------------------------------------------------------
// P-13: targets and Host

#[tokio::test]
async fn p13_the_absolute_uri_authority_wins_over_host() {
    let rig = Rig::start().await;
    for front in rig.fronts() {
        let request = raw_request(
            "GET",
            &rig.url("/page"),
            "HTTP/1.1",
            "evil.test",
            "Connection: close\r\n",
            "",
        );
        let got = exchange(front.addr, &request).await;
        assert_eq!(
            got.status(),
            Some(200),
            "{}: {}",
            front.name,
            got.describe()
        );
    }
    let seen = rig.origin.seen();
    assert!(!seen.is_empty());
    for s in &seen {
        assert_eq!(
            s.headers["host"],
            rig.origin_addr.to_string().as_str(),
            "{s:?}"
        );
        assert_eq!(s.headers.get_all("host").iter().count(), 1);
    }
    // Cached under the URI's authority, not Host's.
    assert_eq!(
        rig.client.entry(&rig.url("/page")),
        Some(Completeness::Complete)
    );
    assert_eq!(rig.client.stored(), 1);
}

#[tokio::test]
async fn p13_a_missing_or_duplicate_host_is_refused() {
    let mut failures = Vec::new();
    let rig = Rig::start().await;
    for front in rig.fronts() {
        let host = rig.origin_addr.to_string();
        let requests = [
            (
                "no Host, origin-form",
                "GET /page HTTP/1.1\r\n\r\n".to_owned(),
            ),
            (
                "no Host, absolute-form",
                format!("GET {} HTTP/1.1\r\n\r\n", rig.url("/page")),
            ),
            (
                "two Host fields",
                format!(
                    "GET {} HTTP/1.1\r\nHost: {host}\r\nHost: evil.test\r\n\r\n",
                    front.target("/page")
                ),
            ),
        ];
        for (name, request) in requests {
            let before = rig.origin.requests();
            let got = exchange(front.addr, request.as_bytes()).await;
            let upstream = rig.origin.requests() - before;
            if got.status() != Some(400) || upstream != 0 {
                failures.push(format!(
                    "{name} at the {}: {}, {upstream} origin request(s)",
                    front.name,
                    got.describe()
                ));
            }
        }
    }
    assert_none(failures);
}

// ---------------------------------------------------------------------------
// P-19: unkeyed headers

const UNKEYED: [(&str, &str); 4] = [
    ("X-Forwarded-Host", "evil.test"),
    ("X-Forwarded-Scheme", "nothttp"),
    ("X-Original-URL", "/secret"),
    ("X-HTTP-Method-Override", "DELETE"),
];

// The cache key is the absolute URL only (plus the request values a
// response's Vary names), so the unkeyed headers hit the first entry. They
// are still forwarded on a miss (the ignored test below).
#[tokio::test]
async fn p19_unkeyed_headers_do_not_change_the_cache_key() {
    let rig = Rig::start().await;
    let host = rig.origin_addr.to_string();
    let get = |lines: String| {
        raw_request(
            "GET",
            &rig.url("/page"),
            "HTTP/1.1",
            &host,
            &format!("{lines}Connection: close\r\n"),
            "",
        )
    };
    let got = exchange(rig.client.addr, &get(String::new())).await;
    assert_eq!(got.status(), Some(200));
    for (name, value) in UNKEYED {
        let got = exchange(rig.client.addr, &get(format!("{name}: {value}\r\n"))).await;
        let replies = got.replies();
        assert_eq!(replies[0].status, 200, "{name}");
        assert_eq!(text(&replies[0].body), "the page\n", "{name}");
        assert!(
            replies[0]
                .head
                .to_ascii_lowercase()
                .contains("cache-status: rproxy; hit"),
            "{name}: {}",
            replies[0].head
        );
    }
    assert_eq!(rig.origin.requests(), 1, "one fetch served them all");
    assert_eq!(rig.client.stored(), 1);
}

#[tokio::test]
async fn p19_vary_is_honoured_and_vary_star_is_not_stored() {
    let rig = Rig::start().await;
    let host = rig.origin_addr.to_string();
    let get = |path: &str, xfh: &str| {
        raw_request(
            "GET",
            &rig.url(path),
            "HTTP/1.1",
            &host,
            &format!("X-Variant: {xfh}\r\nConnection: close\r\n"),
            "",
        )
    };
    for xfh in ["a.test", "b.test", "a.test"] {
        let got = exchange(rig.client.addr, &get("/vary-xfh", xfh)).await;
        assert_eq!(got.status(), Some(200));
    }
    assert_eq!(
        rig.origin.requests_to("/vary-xfh"),
        2,
        "a.test twice is one hit"
    );
    for _ in 0..2 {
        let got = exchange(rig.client.addr, &get("/vary-star", "a.test")).await;
        assert_eq!(got.status(), Some(200));
    }
    assert_eq!(
        rig.origin.requests_to("/vary-star"),
        2,
        "Vary: * is never reused"
    );
    assert_eq!(rig.client.entry(&rig.url("/vary-star")), None);
}

#[tokio::test]
async fn p19_unkeyed_headers_are_not_forwarded() {
    let rig = Rig::start().await;
    let host = rig.origin_addr.to_string();
    for front in rig.fronts() {
        let lines: String = UNKEYED
            .iter()
            .map(|(n, v)| format!("{n}: {v}\r\n"))
            .collect::<String>()
            + "Connection: close\r\n";
        let request = raw_request(
            "GET",
            &front.target("/other"),
            "HTTP/1.1",
            &host,
            &lines,
            "",
        );
        let got = exchange(front.addr, &request).await;
        assert_eq!(got.status(), Some(200), "{}", front.name);
    }
    let mut failures = Vec::new();
    for seen in rig.origin.seen() {
        for (name, _) in UNKEYED {
            if let Some(v) = seen.headers.get(name) {
                failures.push(format!("{name}: {v:?} reached the origin"));
            }
        }
    }
    assert_none(failures);
}

// ---------------------------------------------------------------------------
// Response side: a fake origin that answers with raw bytes

/// What the fake origin sends for a path, and whether it closes after.
fn fake_reply(path: &str) -> (Vec<u8>, bool) {
    let chunked = |chunks: &str| {
        format!(
            "HTTP/1.1 200 OK\r\nCache-Control: max-age=60\r\nTransfer-Encoding: chunked\r\n\r\n6\r\nstart \r\n{chunks}"
        )
        .into_bytes()
    };
    let head = |fields: &str, body: &str| {
        format!("HTTP/1.1 200 OK\r\nCache-Control: max-age=60\r\n{fields}\r\n{body}").into_bytes()
    };
    let reply = match path {
        "/good" => head("Content-Length: 5\r\n", "good\n"),
        "/ws" => head("Content-Length: 11\r\n", "no upgrade\n"),
        "/p5/17-hex-digits" => chunked("10000000000000005\r\nhello\r\n0\r\n\r\n"),
        "/p5/17-hex-digits-zero-padded" => chunked("00000000000000005\r\nhello\r\n0\r\n\r\n"),
        "/p5/plus" => chunked("+5\r\nhello\r\n0\r\n\r\n"),
        "/p5/0x" => chunked("0x5\r\nhello\r\n0\r\n\r\n"),
        "/p5/data-longer" => chunked("5\r\nhelloEXTRA\r\n0\r\n\r\n"),
        "/p5/bare-lf" => chunked("5\nhello\r\n0\r\n\r\n"),
        "/p5/cr-in-ext" => chunked("5;a=b\rc\r\nhello\r\n0\r\n\r\n"),
        "/p5/lf-in-ext" => chunked("5;a=b\nc\r\nhello\r\n0\r\n\r\n"),
        "/p6/obs-fold" => head("X-Folded: a\r\n  b\r\nContent-Length: 5\r\n", "hello"),
        "/p17/cl-te" => head(
            "Content-Length: 3\r\nTransfer-Encoding: chunked\r\n",
            "5\r\nhello\r\n0\r\n\r\n",
        ),
        "/p17/te-cl" => head(
            "Transfer-Encoding: chunked\r\nContent-Length: 5\r\n",
            "5\r\nhello\r\n0\r\n\r\n",
        ),
        "/p17/differing-cl" => head("Content-Length: 5\r\nContent-Length: 6\r\n", "hello!"),
        "/p17/cl-list" => head("Content-Length: 5, 6\r\n", "hello!"),
        "/p17/short" => return (head("Content-Length: 100\r\n", "only ten b"), true),
        "/p17/long" => head(
            "Content-Length: 5\r\n",
            "helloHTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nsmuggled!",
        ),
        // Past a whole chunked body: no length, so the accelerator would
        // stream its coding.
        "/p17/chunked-long" => {
            chunked("5\r\nhello\r\n0\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nsmuggled!")
        }
        // As /p17/long, the excess in a later read than the head (see
        // `fake_pause`), with the body's end.
        "/p17/long-late" => head(
            "Content-Length: 1000\r\n",
            &format!(
                "{}HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nsmuggled!",
                late_body()
            ),
        ),
        "/p18/long-reason" => {
            let mut reply = b"HTTP/1.1 200 ".to_vec();
            reply.extend(std::iter::repeat_n(b'R', 64 << 10));
            reply.extend(b"\r\nContent-Length: 5\r\n\r\nhello");
            reply
        }
        "/p18/non-ascii" => {
            b"HTTP/1.1 200 Gr\xc3\xbc\xdf\xff\x80\r\nContent-Length: 5\r\n\r\nhello".to_vec()
        }
        "/p18/control" => b"HTTP/1.1 200 O\x01K\x7f\r\nContent-Length: 5\r\n\r\nhello".to_vec(),
        _ => head("Content-Length: 10\r\n", "not found\n"),
    };
    (reply, false)
}

/// The body /p17/long-late declares: 1000 bytes.
fn late_body() -> String {
    "late".repeat(250)
}

/// Where the fake pauses within its reply to `path` (bytes sent first),
/// so that what follows comes in a later read: /p17/long-late's head and
/// half its body, then 50 ms later the rest with bytes past its end.
fn fake_pause(path: &str) -> Option<usize> {
    let reply = (path == "/p17/long-late").then(|| fake_reply(path).0)?;
    Some(find(&reply, b"\r\n\r\n")? + 4 + late_body().len() / 2)
}

#[derive(Default)]
struct Fake {
    connections: AtomicUsize,
    /// (connection, request target) in order.
    requests: Mutex<Vec<(usize, String)>>,
    /// Requests that arrived on a connection after a malformed answer.
    reused_after_bad: AtomicUsize,
    /// Every byte received.
    received: Mutex<Vec<u8>>,
}

impl Fake {
    fn requests_to(&self, path: &str) -> usize {
        self.requests
            .lock()
            .unwrap()
            .iter()
            .filter(|(_, p)| p == path)
            .count()
    }
}

async fn start_fake() -> (Arc<Fake>, SocketAddr) {
    let fake = Arc::new(Fake::default());
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let state = fake.clone();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let id = state.connections.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(fake_connection(state.clone(), id, stream));
        }
    });
    (fake, addr)
}

async fn fake_connection(fake: Arc<Fake>, id: usize, mut stream: TcpStream) {
    let mut buf = Vec::new();
    let mut answered_bad = false;
    let mut chunk = vec![0u8; 16 << 10];
    loop {
        let end = loop {
            if let Some(end) = find(&buf, b"\r\n\r\n") {
                break end;
            }
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => {
                    fake.received.lock().unwrap().extend_from_slice(&chunk[..n]);
                    buf.extend_from_slice(&chunk[..n]);
                }
            }
        };
        let head = text(&buf[..end]);
        buf.drain(..end + 4);
        let target = head.split(' ').nth(1).unwrap_or("/").to_owned();
        let path = match target.strip_prefix("http://") {
            Some(rest) => rest
                .find('/')
                .map_or("/".to_owned(), |i| rest[i..].to_owned()),
            None => target,
        };
        if answered_bad {
            fake.reused_after_bad.fetch_add(1, Ordering::SeqCst);
        }
        fake.requests.lock().unwrap().push((id, path.clone()));
        let (reply, close) = fake_reply(&path);
        answered_bad |= path != "/good" && path != "/ws";
        let pause = fake_pause(&path).unwrap_or(reply.len());
        if stream.write_all(&reply[..pause]).await.is_err() {
            return;
        }
        if pause < reply.len() {
            tokio::time::sleep(Duration::from_millis(50)).await;
            if stream.write_all(&reply[pause..]).await.is_err() {
                return;
            }
        }
        if close {
            let _ = stream.shutdown().await;
            return;
        }
    }
}

/// The fake origin with the accelerator, a client proxy, and a client
/// proxy → accelerator chain in front of it.
struct FakeRig {
    fake: Arc<Fake>,
    fake_addr: SocketAddr,
    accelerator: Accelerator,
    direct: Client,
    chain: Client,
}

impl FakeRig {
    async fn start() -> FakeRig {
        let (fake, fake_addr) = start_fake().await;
        let accelerator = start_accelerator(fake_addr).await;
        FakeRig {
            direct: start_client(fake_addr).await,
            chain: start_client(accelerator.addr).await,
            fake,
            fake_addr,
            accelerator,
        }
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.fake_addr)
    }

    /// (name, listener, target, the client proxy whose cache is behind it).
    fn fronts(&self, path: &str) -> [(&'static str, SocketAddr, String, Option<&Client>); 3] {
        [
            ("accelerator", self.accelerator.addr, path.to_owned(), None),
            (
                "client proxy",
                self.direct.addr,
                self.url(path),
                Some(&self.direct),
            ),
            (
                "client proxy → accelerator",
                self.chain.addr,
                self.url(path),
                Some(&self.chain),
            ),
        ]
    }

    async fn get(&self, addr: SocketAddr, target: &str, lines: &str) -> Exchange {
        let request = raw_request(
            "GET",
            target,
            "HTTP/1.1",
            &self.fake_addr.to_string(),
            &format!("{lines}Connection: close\r\n"),
            "",
        );
        exchange(addr, &request).await
    }
}

/// Asks every front for each of `paths` and requires a 502 or a cut body
/// (never a clean answer), no complete cache entry, no reuse of the
/// upstream connection, and a good answer for `/good` right after.
async fn upstream_refused(paths: &[&str], no_partial: bool) -> Vec<String> {
    let mut failures = Vec::new();
    for path in paths {
        let rig = FakeRig::start().await;
        for (name, addr, target, client) in rig.fronts(path) {
            let got = rig.get(addr, &target, "").await;
            let replies = got.replies();
            let clean = replies.iter().any(|r| r.status != 502 && r.complete);
            if clean || replies.is_empty() && !got.closed {
                failures.push(format!("{path} at the {name}: {}", got.describe()));
            }
            if let Some(client) = client {
                // The relay settles the cache just before it aborts the
                // user agent; give it a moment.
                tokio::time::sleep(Duration::from_millis(20)).await;
                let entry = client.entry(&rig.url(path));
                let bad = match entry {
                    Some(Completeness::Complete) => true,
                    Some(_) => no_partial,
                    None => false,
                };
                if bad {
                    failures.push(format!("{path} at the {name}: stored {entry:?}"));
                }
            }
            let good = rig.get(addr, &rig.url_or_path(&target, "/good"), "").await;
            let replies = good.replies();
            if replies.len() != 1 || replies[0].status != 200 || replies[0].body != b"good\n" {
                failures.push(format!(
                    "/good after {path} at the {name}: {}",
                    good.describe()
                ));
            }
        }
        let reused = rig.fake.reused_after_bad.load(Ordering::SeqCst);
        if reused != 0 {
            failures.push(format!(
                "{path}: {reused} request(s) on a connection after a malformed answer"
            ));
        }
    }
    failures
}

impl FakeRig {
    fn url_or_path(&self, target: &str, path: &str) -> String {
        if target.starts_with('/') {
            path.to_owned()
        } else {
            self.url(path)
        }
    }
}

const P5_RESPONSES: [&str; 7] = [
    "/p5/17-hex-digits",
    "/p5/plus",
    "/p5/0x",
    "/p5/data-longer",
    "/p5/bare-lf",
    "/p5/cr-in-ext",
    "/p5/lf-in-ext",
];

#[tokio::test]
async fn p5_malformed_upstream_chunks_are_never_relayed_as_whole_or_stored() {
    assert_none(upstream_refused(&P5_RESPONSES, false).await);
}

// The client proxy treats a malformed upstream chunk like a cut stream and
// commits the prefix it got as a Partial entry (D-A8's resume basis; it is
// never served as a hit, only offered as a basis). The table says nothing
// may be kept. Through the accelerator nothing is kept.
#[tokio::test]
async fn p5_malformed_upstream_chunks_leave_no_partial_entry() {
    assert_none(upstream_refused(&P5_RESPONSES, true).await);
}

// hyper's chunk-size parser only fails on overflow, so `00000000000000005`
// (17 digits, value 5) is a good chunk to it; the response guard
// (upstream_guard) refuses it by length, as the table's "17+ hex digits" asks.
#[tokio::test]
async fn p5_a_zero_padded_17_digit_upstream_chunk_size_is_refused() {
    assert_none(upstream_refused(&["/p5/17-hex-digits-zero-padded"], true).await);
}

#[tokio::test]
async fn p6_obs_fold_in_upstream_headers_is_a_502_and_not_stored() {
    assert_none(upstream_refused(&["/p6/obs-fold"], true).await);
}

#[tokio::test]
async fn p17_bad_upstream_framing_is_never_relayed_as_whole_or_stored() {
    assert_none(
        upstream_refused(&["/p17/differing-cl", "/p17/cl-list", "/p17/short"], false).await,
    );
}

#[tokio::test]
async fn p17_upstream_content_length_with_transfer_encoding_is_refused() {
    assert_none(upstream_refused(&["/p17/cl-te", "/p17/te-cl"], true).await);
}

/// Asks every front for `path`, whose body is longer than its framing
/// says (P-17), and requires the declared length as the answer: one 200,
/// complete, `body`, `Cache-Control: no-store` and nothing else of the
/// excess; no cache entry at the client proxy, whole or partial; a good
/// answer for `/good` right after; no upstream connection reused.
async fn served_as_declared(path: &str, body: &[u8]) -> Vec<String> {
    let mut failures = Vec::new();
    let rig = FakeRig::start().await;
    for (name, addr, target, client) in rig.fronts(path) {
        let got = rig.get(addr, &target, "").await;
        let replies = got.replies();
        let served = matches!(&replies[..], [reply] if reply.status == 200
            && reply.complete
            && reply.body == body
            && reply.header("cache-control").as_deref() == Some("no-store"));
        if !served || text(&got.raw).contains("smuggled") {
            failures.push(format!("{path} at the {name}: {}", got.describe()));
        }
        if let Some(client) = client {
            tokio::time::sleep(Duration::from_millis(20)).await;
            if let Some(entry) = client.entry(&rig.url(path)) {
                failures.push(format!("{path} at the {name}: stored {entry:?}"));
            }
        }
        let good = rig.get(addr, &rig.url_or_path(&target, "/good"), "").await;
        let replies = good.replies();
        if replies.len() != 1 || replies[0].status != 200 || replies[0].body != b"good\n" {
            failures.push(format!(
                "/good after {path} at the {name}: {}",
                good.describe()
            ));
        }
    }
    let reused = rig.fake.reused_after_bad.load(Ordering::SeqCst);
    if reused != 0 {
        failures.push(format!(
            "{path}: {reused} request(s) on a connection after a malformed answer"
        ));
    }
    failures
}

/// RFC 9112 §6.3 (a client may discard what follows a body's length) and
/// §9.3 (it must not take it for a response, nor cache it): a 502 for the
/// whole response was too strict when the declared length came whole. The
/// excess arrives with the response, so every front knows before its head
/// goes (through the pair the accelerator sees it, and its answer says
/// no-store to the client proxy).
#[tokio::test]
async fn p17_rfc9112_6_3_a_body_longer_than_its_content_length_is_served_as_declared_and_not_stored()
 {
    assert_none(served_as_declared("/p17/long", b"hello").await);
}

/// The same past the last chunk of a chunked body: its end was as
/// unambiguous.
#[tokio::test]
async fn p17_rfc9112_9_3_bytes_past_a_whole_chunked_body_are_discarded_as_well() {
    assert_none(served_as_declared("/p17/chunked-long", b"start hello").await);
}

/// Nor does the accelerator code such an answer for a client that offers
/// hsync, or keep it as a basis, even where the operator lets it keep what
/// no shared cache may store (`--basis-store-private`): a body it keeps is
/// announced by `Hsync-Held`, as /good's is.
#[tokio::test]
async fn p17_rfc9112_9_3_a_body_longer_than_its_content_length_is_never_a_kept_basis() {
    let rig = FakeRig::start().await;
    let accelerator = Accelerator::start(AcceleratorConfig {
        basis_store_private: true,
        ..accelerator_config(rig.fake_addr)
    })
    .await;
    let offer = "Accept-Encoding: hsync\r\n";
    let good = rig.get(accelerator.addr, "/good", offer).await;
    let good = good.replies();
    assert!(good[0].header("hsync-held").is_some(), "{good:?}");
    // Coded whole (a length), or streamed (chunked).
    for (path, body) in [("/p17/long", "hello"), ("/p17/chunked-long", "start hello")] {
        let long = rig.get(accelerator.addr, path, offer).await;
        let replies = long.replies();
        let [reply] = &replies[..] else {
            panic!("{path}: {}", long.describe());
        };
        assert!(reply.complete, "{path}: {reply:?}");
        assert_eq!((reply.status, text(&reply.body)), (200, body.into()));
        assert_eq!(reply.header("cache-control").as_deref(), Some("no-store"));
        assert_eq!(reply.header("content-encoding"), None, "{path}: {reply:?}");
        assert_eq!(reply.header("hsync-held"), None, "{path}: {reply:?}");
    }
    assert_eq!(rig.fake.reused_after_bad.load(Ordering::SeqCst), 0);
}

/// Bytes past the end that come in a later read than the head, with the
/// body's last bytes. Whoever has not sent its head yet serves the
/// declared length whole, for nobody to store: the client proxy relaying
/// a small body whole, the accelerator coding one for it (the pair). The
/// accelerator passing a body on has sent the origin's head, and cuts the
/// body so that no cache after it keeps it, as before (its last bytes
/// wait for the check: told the length, a cache would take them for the
/// end). Nothing is stored, and no connection reused.
#[tokio::test]
async fn p17_rfc9112_6_3_bytes_past_the_end_after_the_head_are_served_only_under_no_store() {
    let rig = FakeRig::start().await;
    let path = "/p17/long-late";
    let mut failures = Vec::new();
    for (name, addr, target, client) in rig.fronts(path) {
        let got = rig.get(addr, &target, "").await;
        let replies = got.replies();
        let as_declared = matches!(&replies[..], [reply] if reply.status == 200
            && reply.complete
            && reply.body == late_body().as_bytes()
            && reply.header("cache-control").as_deref() == Some("no-store"));
        let cut = matches!(&replies[..], [reply] if !reply.complete) && got.closed;
        // (Had the proxy read the two parts at once, it knew with the head:
        // the accelerator then serves it as declared too.)
        let expected = as_declared || cut && client.is_none();
        if !expected || text(&got.raw).contains("smuggled") {
            failures.push(format!("{name}: {}", got.describe()));
        }
        if let Some(client) = client {
            tokio::time::sleep(Duration::from_millis(20)).await;
            if let Some(entry) = client.entry(&rig.url(path)) {
                failures.push(format!("{name}: stored {entry:?}"));
            }
        }
        let good = rig.get(addr, &rig.url_or_path(&target, "/good"), "").await;
        let replies = good.replies();
        if replies.len() != 1 || replies[0].body != b"good\n" {
            failures.push(format!("/good after at the {name}: {}", good.describe()));
        }
    }
    assert_eq!(rig.fake.reused_after_bad.load(Ordering::SeqCst), 0);
    assert_none(failures);
}

#[tokio::test]
async fn p17_bytes_past_the_content_length_are_never_the_next_response() {
    let rig = FakeRig::start().await;
    for (name, addr, target, _) in rig.fronts("/p17/long") {
        // The first answer is the declared length (the test above).
        let got = rig.get(addr, &target, "").await;
        assert!(
            got.replies()
                .iter()
                .all(|r| !text(&r.body).contains("smuggled")),
            "{name}: {}",
            got.describe()
        );
        for i in 0..3 {
            let next = rig.get(addr, &rig.url_or_path(&target, "/good"), "").await;
            let replies = next.replies();
            assert!(
                replies.len() == 1 && replies[0].body == b"good\n",
                "{name}, request {i} after: {}",
                next.describe()
            );
        }
    }
    assert_eq!(rig.fake.reused_after_bad.load(Ordering::SeqCst), 0);
}

/// Asks every front for each odd reason phrase: `accept` judges the first
/// status line. The proxies must keep serving afterwards (no panic).
async fn reason_phrases(paths: &[&str], accept: fn(&Reply) -> bool) -> Vec<String> {
    let rig = FakeRig::start().await;
    let mut failures = Vec::new();
    for path in paths {
        for (name, addr, target, _) in rig.fronts(path) {
            let got = rig.get(addr, &target, "").await;
            let replies = got.replies();
            if !replies.first().is_some_and(accept) {
                let line: Option<String> = replies
                    .first()
                    .map(|r| r.status_line().chars().take(40).collect());
                failures.push(format!("{path} at the {name}: {line:?}"));
            }
            let good = rig.get(addr, &rig.url_or_path(&target, "/good"), "").await;
            assert_eq!(good.status(), Some(200), "{name} still serves after {path}");
        }
    }
    failures
}

// Control characters are refused by httparse (502); a 64 KiB reason and
// obs-text pass its parser.
#[tokio::test]
async fn p18_odd_reason_phrases_cause_no_panic_and_control_characters_a_502() {
    let any = |r: &Reply| r.status == 200 || r.status == 502;
    assert_none(reason_phrases(&["/p18/long-reason", "/p18/non-ascii"], any).await);
    let refused = |r: &Reply| r.status == 502;
    assert_none(reason_phrases(&["/p18/control"], refused).await);
}

#[tokio::test]
async fn p18_reason_phrases_are_regenerated_from_the_status() {
    let regenerated = |r: &Reply| r.status_line() == "HTTP/1.1 200 OK";
    assert_none(reason_phrases(&["/p18/long-reason", "/p18/non-ascii"], regenerated).await);
}

// ---------------------------------------------------------------------------
// P-10: Upgrade answered with 200

// Both proxies drop Upgrade as hop-by-hop, so the origin never sees it and
// answers 200; the frame bytes after the request are then parsed as the
// next request (400) and the connection closes. No 101, no raw relay.
#[tokio::test]
async fn p10_an_upgrade_answered_with_200_opens_no_tunnel() {
    let rig = FakeRig::start().await;
    let frame = b"\x81\x85RAWFRAME-BYTES\x00\x01";
    for (name, addr, target, _) in rig.fronts("/ws") {
        let mut request = raw_request(
            "GET",
            &target,
            "HTTP/1.1",
            &rig.fake_addr.to_string(),
            "Connection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n",
            "",
        );
        request.extend_from_slice(frame);
        let got = exchange(addr, &request).await;
        let replies = got.replies();
        assert!(!replies.is_empty(), "{name}");
        assert_eq!(replies[0].status, 200, "{name}: {}", got.describe());
        assert!(replies.iter().all(|r| r.status != 101));
        assert!(got.closed, "{name}: {}", got.describe());
    }
    let received = rig.fake.received.lock().unwrap().clone();
    assert!(
        find(&received, b"RAWFRAME").is_none(),
        "raw bytes went upstream"
    );
    assert!(
        !text(&received)
            .to_ascii_lowercase()
            .contains("upgrade: websocket"),
        "{}",
        text(&received)
    );
    assert_eq!(rig.fake.requests_to("/ws"), 3);
}
