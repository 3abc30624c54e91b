//! Proxy authentication (RELIABILITY A-1 … ): `rproxy passwd` and
//! start-up checks through the real binary; the 407/429 gate, the client
//! proxy's upstream credentials and what reaches the origin over real
//! loopback sockets: a recording origin, the accelerator and the client
//! proxy, each behind its own users file.

mod support;

use std::io::Write;
use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::{HeaderMap, HeaderValue, Request, Response};
use hyper::body::Incoming;
use rproxy::accelerator::{Accelerator, AcceleratorConfig};
use rproxy::auth::{AuthFile, AuthGate, Authenticator, basic_credentials};
use rproxy::cache::CacheStore;
use rproxy::client_proxy::{ClientConfig, ClientProxy};
use rproxy::server::{ConnectionLimits, Handler, ProxyBody, serve};
use rproxy::static_origin::StaticOrigin;
use tempfile::TempDir;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const PAGE: &str = "/index.html";

fn rproxy(args: &[&str], stdin: &str) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_rproxy"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn a_4_passwd_stores_salted_hashes_in_a_private_file() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("users");
    let path = file.to_str().unwrap();

    for (user, password) in [("alice", "wonderland"), ("bob", "wonderland")] {
        let out = rproxy(&["passwd", "add", path, user], &format!("{password}\n"));
        assert!(out.status.success(), "{}", text(&out.stderr));
    }
    let mode = std::fs::metadata(&file).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600);
    let stored = std::fs::read_to_string(&file).unwrap();
    assert!(!stored.contains("wonderland"), "never the password itself");
    let hashes: Vec<&str> = stored
        .lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| l.split_once(':').unwrap().1)
        .collect();
    assert_eq!(hashes.len(), 2);
    assert!(hashes.iter().all(|h| h.starts_with("$argon2id$")));
    assert_ne!(hashes[0], hashes[1], "the same password, salted apart");

    let out = rproxy(&["passwd", "list", path], "");
    assert_eq!(text(&out.stdout), "alice\nbob\n");
    let out = rproxy(&["passwd", "remove", path, "alice"], "");
    assert!(out.status.success());
    let out = rproxy(&["passwd", "list", path], "");
    assert_eq!(text(&out.stdout), "bob\n");

    // Mistakes change nothing and say why.
    let out = rproxy(&["passwd", "remove", path, "alice"], "");
    assert_eq!(out.status.code(), Some(64));
    assert!(text(&out.stderr).contains("no user alice"));
    let out = rproxy(&["passwd", "add", path, "carol"], "\n");
    assert_eq!(out.status.code(), Some(64));
    assert!(text(&out.stderr).contains("empty password"));
    let out = rproxy(&["passwd", "add", path, "a:b"], "pw\n");
    assert_eq!(out.status.code(), Some(64));
    assert_eq!(std::fs::read_to_string(&file).unwrap().lines().count(), 2);
}

#[test]
fn an_unparsable_users_file_stops_start_up_naming_the_line() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("users");
    std::fs::write(&file, "# users\n\ncarol:plaintext-password\n").unwrap();
    for role in ["accelerator", "client"] {
        let out = rproxy(
            &[
                role,
                "--listen",
                "127.0.0.1:0",
                "--auth-file",
                file.to_str().unwrap(),
            ],
            "",
        );
        assert_eq!(out.status.code(), Some(64), "{role}");
        let stderr = text(&out.stderr);
        assert!(stderr.contains("users:3: bad hash"), "{role}: {stderr}");
    }
}

#[test]
fn a_4_a_users_file_others_can_read_gets_a_warning() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("users");
    let mut users = AuthFile::default();
    users.set("alice", "wonderland").unwrap();
    users.save(&file).unwrap();
    let start = |file: &Path| {
        // --inetd on two pipes: stdin is empty, so it serves nothing and
        // exits once start-up is done.
        let cache = dir.path().join("cache");
        rproxy(
            &[
                "client",
                "--inetd",
                "--auth-file",
                file.to_str().unwrap(),
                "--cache",
                cache.to_str().unwrap(),
            ],
            "",
        )
    };
    let out = start(&file);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(!text(&out.stderr).contains("readable by others"));

    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
    let out = start(&file);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("readable by others"),
        "{}",
        text(&out.stderr)
    );
}

// ---------------------------------------------------------------------------
// The pair over sockets

/// The bundled sample site, remembering the headers of every request.
struct RecordingOrigin {
    files: Arc<StaticOrigin>,
    seen: Mutex<Vec<HeaderMap>>,
}

impl Handler for RecordingOrigin {
    async fn handle(self: Arc<Self>, request: Request<Incoming>) -> Response<ProxyBody> {
        self.seen.lock().unwrap().push(request.headers().clone());
        self.files.clone().handle(request).await
    }
}

impl RecordingOrigin {
    fn requests(&self) -> usize {
        self.seen.lock().unwrap().len()
    }
}

async fn listen<H: Handler>(handler: Arc<H>) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(serve(
        listener,
        handler,
        ConnectionLimits::default(),
        std::future::pending(),
    ));
    addr
}

fn authenticator(user: &str, password: &str, realm: &str) -> Authenticator {
    let mut file = AuthFile::default();
    file.set(user, password).unwrap();
    Authenticator::new(&file, realm).unwrap()
}

struct Pair {
    origin: Arc<RecordingOrigin>,
    origin_addr: SocketAddr,
    accelerator: SocketAddr,
    client: Arc<AuthGate<ClientProxy>>,
    client_addr: SocketAddr,
    _cache: TempDir,
}

/// Origin ← accelerator (user "accel" / "s3cret") ← client proxy (user
/// "alice" / "wonderland"), the client authenticating upstream with
/// `upstream_password` (none: no credentials).
async fn start_pair(upstream_password: Option<&str>) -> Pair {
    let data = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data");
    let origin = Arc::new(RecordingOrigin {
        files: Arc::new(StaticOrigin::new(data).unwrap()),
        seen: Mutex::new(Vec::new()),
    });
    let origin_addr = listen(origin.clone()).await;
    let accelerator = Accelerator::new(AcceleratorConfig {
        via_name: HeaderValue::from_static("accel-test"),
        connect_timeout: Duration::from_secs(2),
        origin_timeout: Duration::from_secs(5),
        basis_store_bytes: 16 << 20,
        max_stored_body: 4 << 20,
        ..AcceleratorConfig::for_origin(format!("http://{origin_addr}").parse().unwrap())
    })
    .unwrap();
    let accelerator = Arc::new(AuthGate::new(
        accelerator,
        Some(authenticator("accel", "s3cret", "accelerator")),
    ));
    let accelerator_addr = listen(accelerator).await;
    let cache = tempfile::tempdir().unwrap();
    let store = CacheStore::open(cache.path().join("cache"), 64 << 20).unwrap();
    let client = ClientProxy::new(
        ClientConfig {
            upstream_credentials: upstream_password.map(|p| basic_credentials("accel", p)),
            ..support::proxy::client_config(&format!("http://{accelerator_addr}"))
        },
        store,
    )
    .unwrap();
    let client = Arc::new(AuthGate::new(
        client,
        Some(authenticator("alice", "wonderland", "rproxy")),
    ));
    let client_addr = listen(client.clone()).await;
    Pair {
        origin,
        origin_addr,
        accelerator: accelerator_addr,
        client,
        client_addr,
        _cache: cache,
    }
}

struct Reply {
    status: u16,
    head: String,
    body: Vec<u8>,
}

impl Reply {
    fn header(&self, name: &str) -> Option<&str> {
        self.head.lines().find_map(|line| {
            let (n, v) = line.split_once(':')?;
            n.eq_ignore_ascii_case(name).then(|| v.trim())
        })
    }
}

/// One request on its own connection, as `curl -x` sends it.
async fn get(proxy: SocketAddr, url: &str, extra: &[(&str, &str)]) -> Reply {
    let mut stream = TcpStream::connect(proxy).await.unwrap();
    let mut request = format!("GET {url} HTTP/1.1\r\nHost: site.test\r\nConnection: close\r\n");
    for (name, value) in extra {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str("\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut raw))
        .await
        .expect("an answer within 10 s")
        .unwrap();
    let split = raw.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
    let head = text(&raw[..split]);
    let status = head[9..12].parse().unwrap();
    let mut body = raw[split + 4..].to_vec();
    if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        body = dechunk(&body);
    }
    Reply { status, head, body }
}

fn dechunk(mut chunked: &[u8]) -> Vec<u8> {
    let mut body = Vec::new();
    loop {
        let line_end = chunked.windows(2).position(|w| w == b"\r\n").unwrap();
        let size = usize::from_str_radix(&text(&chunked[..line_end]), 16).unwrap();
        if size == 0 {
            return body;
        }
        body.extend_from_slice(&chunked[line_end + 2..line_end + 2 + size]);
        chunked = &chunked[line_end + 4 + size..];
    }
}

fn credentials(user: &str, password: &str) -> String {
    basic_credentials(user, password)
        .to_str()
        .unwrap()
        .to_owned()
}

fn page() -> Vec<u8> {
    std::fs::read(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/index.html")).unwrap()
}

#[tokio::test]
async fn a_1_without_valid_credentials_nothing_goes_upstream_or_to_the_cache() {
    let pair = start_pair(Some("s3cret")).await;
    let url = format!("http://{}{PAGE}", pair.origin_addr);
    let wrong = credentials("alice", "wonderlan");
    let unknown = credentials("mallory", "wonderland");
    // Longer than any credential we look at, shorter than a head may be
    // (a 64 KiB one is a 431 before authentication: tests/limits.rs).
    let long = format!("Basic {}", "A".repeat(32 << 10));
    let refusals: [&[(&str, &str)]; 6] = [
        &[],
        &[("Proxy-Authorization", &wrong)],
        &[("Proxy-Authorization", &unknown)],
        &[("Proxy-Authorization", "Basic !!!")],
        &[("Proxy-Authorization", "Basic YWxpY2U=")],
        &[("Proxy-Authorization", &long)],
    ];
    for extra in refusals {
        let reply = get(pair.client_addr, &url, extra).await;
        assert_eq!(reply.status, 407, "{}", reply.head);
        assert_eq!(
            reply.header("Proxy-Authenticate"),
            Some("Basic realm=\"rproxy\"")
        );
    }
    assert_eq!(pair.origin.requests(), 0, "no upstream request");
    let stats = pair.client.role().stats().snapshot();
    assert_eq!(stats.requests, 0, "the proxy itself never saw them");
    assert_eq!(pair.client.role().store().len(), 0);

    let right = credentials("alice", "wonderland");
    let reply = get(pair.client_addr, &url, &[("Proxy-Authorization", &right)]).await;
    assert_eq!(reply.status, 200, "{}", reply.head);
    assert_eq!(reply.body, page());
    assert_eq!(pair.origin.requests(), 1);
}

#[tokio::test]
async fn a_3_proxy_credentials_stay_on_their_hop_and_authorization_goes_through() {
    let pair = start_pair(Some("s3cret")).await;
    let url = format!("http://{}{PAGE}", pair.origin_addr);
    let right = credentials("alice", "wonderland");
    let reply = get(
        pair.client_addr,
        &url,
        &[
            ("Proxy-Authorization", &right),
            ("Proxy-Authenticate", "Basic realm=\"x\""),
            ("Authorization", "Bearer for-the-origin"),
        ],
    )
    .await;
    assert_eq!(reply.status, 200, "{}", reply.head);
    let seen = pair.origin.seen.lock().unwrap();
    assert_eq!(seen.len(), 1);
    assert!(
        !seen[0].contains_key("proxy-authorization"),
        "{:?}",
        seen[0]
    );
    assert!(!seen[0].contains_key("proxy-authenticate"));
    assert_eq!(seen[0]["authorization"], "Bearer for-the-origin");
}

#[tokio::test]
async fn the_accelerator_refuses_a_client_proxy_without_its_credentials() {
    for (password, says) in [
        (None, "give --upstream-user"),
        (Some("wrong"), "refused our credentials"),
    ] {
        let pair = start_pair(password).await;
        let url = format!("http://{}{PAGE}", pair.origin_addr);
        let right = credentials("alice", "wonderland");
        let reply = get(pair.client_addr, &url, &[("Proxy-Authorization", &right)]).await;
        // The accelerator's challenge is the client proxy's business, not
        // the user agent's: a gateway error that says what to fix.
        assert_eq!(reply.status, 502, "{}", reply.head);
        assert_eq!(reply.header("Proxy-Authenticate"), None);
        assert!(text(&reply.body).contains(says), "{}", text(&reply.body));
        assert_eq!(pair.origin.requests(), 0);
    }
    // And the accelerator asked directly says 407 itself.
    let pair = start_pair(Some("s3cret")).await;
    let reply = get(pair.accelerator, PAGE, &[]).await;
    assert_eq!(reply.status, 407);
    assert_eq!(
        reply.header("Proxy-Authenticate"),
        Some("Basic realm=\"accelerator\"")
    );
    let ok = credentials("accel", "s3cret");
    let reply = get(pair.accelerator, PAGE, &[("Proxy-Authorization", &ok)]).await;
    assert_eq!(reply.status, 200, "{}", reply.head);
}

#[tokio::test]
async fn a_5_a_guessing_peer_gets_429_with_retry_after() {
    let pair = start_pair(Some("s3cret")).await;
    let url = format!("http://{}{PAGE}", pair.origin_addr);
    for n in 0..10 {
        let guess = credentials("alice", &format!("guess{n}"));
        let reply = get(pair.client_addr, &url, &[("Proxy-Authorization", &guess)]).await;
        assert_eq!(reply.status, 407);
    }
    let right = credentials("alice", "wonderland");
    let reply = get(pair.client_addr, &url, &[("Proxy-Authorization", &right)]).await;
    assert_eq!(reply.status, 429, "{}", reply.head);
    assert_eq!(reply.header("Retry-After"), Some("60"));
    assert_eq!(pair.origin.requests(), 0);
}
