//! Proxy authentication (RELIABILITY A-1 … ): `rproxy passwd` and
//! start-up checks through the real binary; the 407/429 gate, the client
//! proxy's upstream credentials and what reaches the origin over real
//! loopback sockets: a recording origin, the accelerator and the client
//! proxy, each behind its own users file.

mod support;

use std::io::Write;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http::{HeaderMap, Request, Response};
use rproxy::accelerator::Accelerator;
use rproxy::client_proxy::{ClientConfig, ClientProxy};
use rproxy::demo::static_origin::StaticOrigin;
use rproxy::http::auth::{AuthFile, AuthGate, Authenticator, CheckLimits, basic_credentials};
use rproxy::http::server::{Handler, ProxyBody, RequestBody};
use support::topology::{Listen, Server, accelerator_config, serve, temp_store};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpSocket;

const PAGE: &str = "/index.html";

fn rproxy(args: &[&str], stdin: &str) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_rproxy"))
        .args(args)
        // An accelerator's spool and basis store default to the temp
        // directory: the target's, not the machine's.
        .env("TMPDIR", env!("CARGO_TARGET_TMPDIR"))
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
    async fn handle(self: Arc<Self>, request: Request<RequestBody>) -> Response<ProxyBody> {
        self.seen.lock().unwrap().push(request.headers().clone());
        self.files.clone().handle(request).await
    }
}

impl RecordingOrigin {
    fn requests(&self) -> usize {
        self.seen.lock().unwrap().len()
    }
}

fn authenticator(user: &str, password: &str, realm: &str) -> Authenticator {
    let mut file = AuthFile::default();
    file.set(user, password).unwrap();
    Authenticator::new(&file, realm).unwrap()
}

struct Pair {
    origin: Server<RecordingOrigin>,
    origin_addr: SocketAddr,
    accelerator: Server<AuthGate<Accelerator>>,
    client: Server<AuthGate<ClientProxy>>,
    client_addr: SocketAddr,
}

/// Origin ← accelerator (user "accel" / "s3cret") ← client proxy (user
/// "alice" / "wonderland"), the client authenticating upstream with
/// `upstream_password` (none: no credentials).
async fn start_pair(upstream_password: Option<&str>) -> Pair {
    let data = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data");
    let origin = RecordingOrigin {
        files: Arc::new(StaticOrigin::new(data).unwrap()),
        seen: Mutex::new(Vec::new()),
    };
    let origin = serve(Arc::new(origin), Listen::default()).await;
    let accelerator = Accelerator::new(accelerator_config(origin.addr)).unwrap();
    let accelerator = AuthGate::new(
        accelerator,
        Some(authenticator("accel", "s3cret", "accelerator")),
    );
    let accelerator = serve(Arc::new(accelerator), Listen::default()).await;
    let (cache, store) = temp_store(64 << 20);
    let client = ClientProxy::new(
        ClientConfig {
            upstream_credentials: upstream_password.map(|p| basic_credentials("accel", p)),
            ..support::proxy::client_config(&format!("http://{}", accelerator.addr))
        },
        store,
    )
    .unwrap();
    let client = AuthGate::new(client, Some(authenticator("alice", "wonderland", "rproxy")));
    let client = serve(Arc::new(client), Listen::default())
        .await
        .keeping(cache);
    Pair {
        origin_addr: origin.addr,
        client_addr: client.addr,
        origin,
        accelerator,
        client,
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
    get_from(LOOPBACK, proxy, url, extra).await
}

const LOOPBACK: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

/// [`get`] from the address `source` (any of 127/8 on Linux), as if from
/// another client.
async fn get_from(source: IpAddr, proxy: SocketAddr, url: &str, extra: &[(&str, &str)]) -> Reply {
    let socket = TcpSocket::new_v4().unwrap();
    socket.bind(SocketAddr::new(source, 0)).unwrap();
    let mut stream = socket.connect(proxy).await.unwrap();
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

/// An upstream that records each request's head and answers with the
/// headers of another hop: `Proxy-Authenticate` and `Proxy-Authorization`
/// on an ordinary 200.
struct ProxyHeadersUpstream {
    seen: Mutex<Vec<HeaderMap>>,
}

impl Handler for ProxyHeadersUpstream {
    async fn handle(self: Arc<Self>, request: Request<RequestBody>) -> Response<ProxyBody> {
        use http_body_util::BodyExt;
        self.seen.lock().unwrap().push(request.headers().clone());
        Response::builder()
            .header("proxy-authenticate", "Basic realm=\"upstream\"")
            .header("proxy-authorization", "Basic dXBzdHJlYW06aG9w")
            .header("cache-control", "no-store")
            .body(
                http_body_util::Full::new(bytes::Bytes::from_static(b"hello"))
                    .map_err(|never| match never {})
                    .boxed(),
            )
            .unwrap()
    }
}

/// A-3 on the hop the pair test above cannot see: the client proxy's
/// upstream gets the proxy's own credentials, once, never the user's; and
/// proxy authentication headers on an upstream's answer belong to that hop,
/// so they never reach the user agent.
#[tokio::test]
async fn a_3_the_upstream_gets_only_the_proxys_credentials_and_keeps_its_own() {
    let upstream = Arc::new(ProxyHeadersUpstream {
        seen: Mutex::new(Vec::new()),
    });
    let upstream_server = serve(upstream.clone(), Listen::default()).await;
    let (cache, store) = temp_store(64 << 20);
    let client = ClientProxy::new(
        ClientConfig {
            upstream_credentials: Some(basic_credentials("accel", "s3cret")),
            ..support::proxy::client_config(&format!("http://{}", upstream_server.addr))
        },
        store,
    )
    .unwrap();
    let client = AuthGate::new(client, Some(authenticator("alice", "wonderland", "rproxy")));
    let client = serve(Arc::new(client), Listen::default())
        .await
        .keeping(cache);
    let reply = get(
        client.addr,
        "http://site.test/page",
        &[
            ("Proxy-Authorization", &credentials("alice", "wonderland")),
            ("Authorization", "Bearer for-the-origin"),
        ],
    )
    .await;
    assert_eq!(reply.status, 200, "{}", reply.head);
    assert_eq!(reply.body, b"hello");
    assert_eq!(reply.header("proxy-authenticate"), None, "{}", reply.head);
    assert_eq!(reply.header("proxy-authorization"), None, "{}", reply.head);
    let seen = upstream.seen.lock().unwrap();
    assert_eq!(seen.len(), 1);
    let sent: Vec<_> = seen[0].get_all("proxy-authorization").iter().collect();
    assert_eq!(
        sent,
        [&basic_credentials("accel", "s3cret")],
        "{:?}",
        seen[0]
    );
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
    let reply = get(pair.accelerator.addr, PAGE, &[]).await;
    assert_eq!(reply.status, 407);
    assert_eq!(
        reply.header("Proxy-Authenticate"),
        Some("Basic realm=\"accelerator\"")
    );
    let ok = credentials("accel", "s3cret");
    let reply = get(pair.accelerator.addr, PAGE, &[("Proxy-Authorization", &ok)]).await;
    assert_eq!(reply.status, 200, "{}", reply.head);
}

#[tokio::test]
async fn a_5_a_guessing_peer_gets_429_with_retry_after() {
    let pair = start_pair(Some("s3cret")).await;
    let url = format!("http://{}{PAGE}", pair.origin_addr);
    let first = Instant::now();
    for n in 0..10 {
        let guess = credentials("alice", &format!("guess{n}"));
        let reply = get(pair.client_addr, &url, &[("Proxy-Authorization", &guess)]).await;
        assert_eq!(reply.status, 407);
    }
    let right = credentials("alice", "wonderland");
    let reply = get(pair.client_addr, &url, &[("Proxy-Authorization", &right)]).await;
    assert_eq!(reply.status, 429, "{}", reply.head);
    assert_retry_after_is_left_of_the_minute(&reply, first);
    assert_eq!(pair.origin.requests(), 0);
}

// ---------------------------------------------------------------------------
// Bursts of guesses

/// The bundled sample site behind a users file of alice / wonderland and
/// bob / builder.
async fn start_gate() -> (Server<AuthGate<StaticOrigin>>, SocketAddr) {
    let data = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data");
    let mut users = AuthFile::default();
    users.set("alice", "wonderland").unwrap();
    users.set("bob", "builder").unwrap();
    let gate = Arc::new(AuthGate::new(
        StaticOrigin::new(data).unwrap(),
        Some(Authenticator::new(&users, "rproxy").unwrap()),
    ));
    let gate = serve(gate, Listen::default()).await;
    let addr = gate.addr;
    (gate, addr)
}

/// `count` requests at once, the i-th from `source(i)` with `credential(i)`;
/// their statuses.
async fn burst(
    gate: SocketAddr,
    count: usize,
    source: impl Fn(usize) -> IpAddr,
    credential: impl Fn(usize) -> String,
) -> Vec<u16> {
    let requests: Vec<_> = (0..count)
        .map(|i| {
            let (source, credential) = (source(i), credential(i));
            tokio::spawn(async move {
                let reply =
                    get_from(source, gate, PAGE, &[("Proxy-Authorization", &credential)]).await;
                if reply.status == 429 {
                    assert!(reply.header("Retry-After").is_some(), "{}", reply.head);
                }
                reply.status
            })
        })
        .collect();
    let mut statuses = Vec::new();
    for request in requests {
        statuses.push(request.await.unwrap());
    }
    statuses
}

/// `reply` says to retry when the minute that began with the first guess,
/// sent at `first`, is over: no later, and no sooner than what was left of
/// it when the reply came.
fn assert_retry_after_is_left_of_the_minute(reply: &Reply, first: Instant) {
    let seconds: u64 = reply
        .header("Retry-After")
        .expect("a 429 says when to retry")
        .parse()
        .unwrap();
    let left = Duration::from_secs(60).saturating_sub(first.elapsed());
    assert!(
        (left.as_secs().max(1)..=60).contains(&seconds),
        "Retry-After {seconds} with {left:?} left of the minute"
    );
}

fn count(statuses: &[u16], status: u16) -> usize {
    statuses.iter().filter(|&&s| s == status).count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_10_a_burst_of_wrong_passwords_costs_at_most_ten_hashes_two_at_a_time() {
    let (gate, addr) = start_gate().await;
    let auth = gate.authenticator().unwrap();
    let statuses = burst(
        addr,
        200,
        |_| LOOPBACK,
        |i| credentials("alice", &format!("guess{i}")),
    )
    .await;
    let stats = auth.stats();
    assert_eq!(
        count(&statuses, 407) + count(&statuses, 429),
        200,
        "{statuses:?}"
    );
    // Counted before the hash: only ten got one; the rest were 429 at once.
    assert!(count(&statuses, 429) >= 190, "{statuses:?}");
    assert!(stats.hashes <= 10, "{stats:?}");
    assert_eq!(stats.hashes, count(&statuses, 407) as u64);
    assert!(
        stats.peak_running <= CheckLimits::DEFAULT.max_checks.get(),
        "{stats:?}"
    );

    // From many addresses the failure count does not bound the hashes;
    // the turns still do.
    let statuses = burst(
        addr,
        200,
        |i| IpAddr::V4(Ipv4Addr::new(127, 0, 1, (i % 20) as u8 + 1)),
        |i| credentials("mallory", &format!("guess{i}")),
    )
    .await;
    let stats = auth.stats();
    assert_eq!(
        count(&statuses, 407) + count(&statuses, 429),
        200,
        "{statuses:?}"
    );
    assert!(
        stats.peak_running <= CheckLimits::DEFAULT.max_checks.get(),
        "{stats:?}"
    );
    assert_eq!(stats.running, 0);
    assert!(stats.hashes <= 10 + 200, "{stats:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_10_a_user_verified_before_a_burst_from_her_address_still_gets_through() {
    let (gate, addr) = start_gate().await;
    let alice = credentials("alice", "wonderland");
    let reply = get(addr, PAGE, &[("Proxy-Authorization", &alice)]).await;
    assert_eq!(reply.status, 200, "{}", reply.head);

    // Someone else behind 127.0.0.1 guesses until it is locked out.
    let first = Instant::now();
    let statuses = burst(
        addr,
        30,
        |_| LOOPBACK,
        |i| credentials("alice", &format!("guess{i}")),
    )
    .await;
    assert!(count(&statuses, 429) >= 20, "{statuses:?}");
    let hashes = gate.authenticator().unwrap().stats().hashes;

    let reply = get(addr, PAGE, &[("Proxy-Authorization", &alice)]).await;
    assert_eq!(reply.status, 200, "{}", reply.head);
    assert_eq!(reply.body, page());
    assert_eq!(
        gate.authenticator().unwrap().stats().hashes,
        hashes,
        "no hash"
    );
    // Bob's right password never passed before: from there, it waits.
    let bob = credentials("bob", "builder");
    let reply = get(addr, PAGE, &[("Proxy-Authorization", &bob)]).await;
    assert_eq!(reply.status, 429, "{}", reply.head);
    assert_retry_after_is_left_of_the_minute(&reply, first);
    // From another address it passes.
    let elsewhere = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2));
    let reply = get_from(elsewhere, addr, PAGE, &[("Proxy-Authorization", &bob)]).await;
    assert_eq!(reply.status, 200, "{}", reply.head);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_10_a_burst_of_1000_from_many_addresses_adds_at_most_128_mib_to_the_process() {
    let dir = tempfile::tempdir().unwrap();
    let users = dir.path().join("users");
    let mut file = AuthFile::default();
    file.set("alice", "wonderland").unwrap();
    file.save(&users).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_rproxy"))
        .args(["client", "--listen", "127.0.0.1:0", "--admin-listen", "off"])
        .arg("--auth-file")
        .arg(&users)
        .arg("--cache")
        .arg(dir.path().join("cache"))
        .env("RUST_LOG", "info")
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Its address, from the "ready" line.
    let stderr = child.stderr.take().unwrap();
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        use std::io::BufRead;
        let mut sent = false;
        for line in std::io::BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            if !sent && line.contains("client proxy ready") {
                let at = line.find("127.0.0.1:").unwrap();
                let port: String = line[at + 10..]
                    .chars()
                    .take_while(char::is_ascii_digit)
                    .collect();
                ready_tx.send(port.parse::<u16>().unwrap()).unwrap();
                sent = true;
            }
        }
    });
    let port = ready_rx
        .recv_timeout(Duration::from_secs(30))
        .expect("the proxy starts");
    let addr = SocketAddr::new(LOOPBACK, port);
    let before = support::memory_of(child.id(), "VmRSS:");

    // RELIABILITY's N: 1,000 guesses at once from 100 addresses, ten
    // each: the failure count lets every one of them be checked, so only
    // the turns bound memory.
    const N: usize = 1000;
    let started = Instant::now();
    let statuses = burst(
        addr,
        N,
        |i| IpAddr::V4(Ipv4Addr::new(127, 0, 2, (i % 100) as u8 + 1)),
        |i| credentials("alice", &format!("guess{i}")),
    )
    .await;
    let took = started.elapsed();
    let peak = support::memory_of(child.id(), "VmHWM:");
    child.kill().unwrap();
    child.wait().unwrap();
    assert_eq!(
        count(&statuses, 407) + count(&statuses, 429),
        N,
        "{statuses:?}"
    );
    let growth_mib = peak.saturating_sub(before) >> 20;
    // The figure for the README (cargo test -- --nocapture).
    eprintln!(
        "A-10: {N} wrong passwords at once: peak RSS {} MiB, +{growth_mib} MiB over {} MiB before; \
         {} checked (407), {} refused (429) in {took:.1?}",
        peak >> 20,
        before >> 20,
        count(&statuses, 407),
        count(&statuses, 429),
    );
    assert!(
        growth_mib <= 128,
        "RSS grew by {growth_mib} MiB during the burst"
    );
}
