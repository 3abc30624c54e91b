//! TLS and HTTP/2 between the proxies: the accelerator with a certificate
//! made at test time (rcgen), the client proxy with an `https://` upstream
//! trusting it. Checks that ALPN picks HTTP/2 (many requests on one
//! connection) or HTTP/1.1, that the hsync exchange works the same on
//! both, and that an untrusted certificate is a 502, never a fetch.

mod support;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::{Request, Response, Version};
use rproxy::accelerator::Accelerator;
use rproxy::cache::CacheStore;
use rproxy::client_proxy::ClientConfig;
use rproxy::demo::static_origin::StaticOrigin;
use rproxy::http::server::{Handler, Peer, ProxyBody, RequestBody};
use support::topology::{Cache, ClientProxy, Listen, Server, accelerator_config, serve};
use tempfile::TempDir;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const OLD: &str = "/jquery/3.7.0/jquery.js";
const NEW: &str = "/jquery/3.7.1/jquery.js";

fn data(path: &str) -> Vec<u8> {
    std::fs::read(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/data")
            .join(&path[1..]),
    )
    .unwrap()
}

/// A certificate for 127.0.0.1 and localhost, as PEM files in `dir`.
fn certificate(dir: &Path) -> (PathBuf, PathBuf) {
    let made =
        rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_owned(), "localhost".to_owned()])
            .unwrap();
    let cert = dir.join("cert.pem");
    let key = dir.join("key.pem");
    std::fs::write(&cert, made.cert.pem()).unwrap();
    std::fs::write(&key, made.signing_key.serialize_pem()).unwrap();
    (cert, key)
}

/// The accelerator, remembering each request's protocol and peer.
struct Recording {
    inner: Arc<Accelerator>,
    seen: Mutex<Vec<(Version, Option<SocketAddr>)>>,
}

impl Handler for Recording {
    async fn handle(self: Arc<Self>, request: Request<RequestBody>) -> Response<ProxyBody> {
        let peer = request.extensions().get::<Peer>().map(|p| p.0);
        self.seen.lock().unwrap().push((request.version(), peer));
        self.inner.clone().handle(request).await
    }
}

struct Pair {
    origin: Server<StaticOrigin>,
    accelerator: Server<Recording>,
    client: ClientProxy,
    _dir: TempDir,
}

/// Origin ← accelerator over TLS ← client proxy offering `alpn` and
/// trusting the accelerator's certificate, or another one.
async fn start(trust_own: bool, alpn: &[&[u8]]) -> Pair {
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = certificate(dir.path());

    let files =
        StaticOrigin::new(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data")).unwrap();
    let origin = serve(Arc::new(files), Listen::default()).await;

    let accelerator = Accelerator::new(accelerator_config(origin.addr)).unwrap();
    let accelerator = Arc::new(Recording {
        inner: Arc::new(accelerator),
        seen: Mutex::new(Vec::new()),
    });
    let over_tls = Listen::tls(&cert, &key);
    let accelerator = serve(accelerator, over_tls).await;

    let ca = if trust_own {
        cert
    } else {
        // Another certificate for the same names.
        let other = dir.path().join("other");
        std::fs::create_dir(&other).unwrap();
        certificate(&other).0
    };
    let mut tls = (*rproxy::http::tls::client_config(Some(&ca)).unwrap()).clone();
    tls.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    let store = CacheStore::open(dir.path().join("cache"), 64 << 20).unwrap();
    let config = ClientConfig {
        memory_cache_bytes: 0,
        upstream_tls: Some(Arc::new(tls)),
        ..support::proxy::client_config(&format!("https://{}", accelerator.addr))
    };
    let client = ClientProxy::start_with(config, Cache::Store(store), Listen::default()).await;
    Pair {
        origin,
        accelerator,
        client,
        _dir: dir,
    }
}

/// `GET target` on a connection of its own; the status and body
/// (Content-Length framed, or read to the close).
async fn get(proxy: SocketAddr, target: &str) -> (u16, Vec<u8>) {
    let mut stream = TcpStream::connect(proxy).await.unwrap();
    let request = format!("GET {target} HTTP/1.0\r\nHost: site.test\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut raw))
        .await
        .expect("an answer within 10 s")
        .unwrap();
    let split = raw.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
    let status = String::from_utf8_lossy(&raw[9..12]).parse().unwrap();
    (status, raw[split + 4..].to_vec())
}

impl Pair {
    fn seen(&self) -> Vec<(Version, Option<SocketAddr>)> {
        self.accelerator.seen.lock().unwrap().clone()
    }
}

#[tokio::test]
async fn over_http2_the_newer_release_comes_as_a_delta_on_one_connection() {
    let pair = start(true, &[b"h2", b"http/1.1"]).await;
    let old = format!("http://{}{OLD}", pair.origin.addr);
    let new = format!("http://{}{NEW}", pair.origin.addr);
    assert_eq!(get(pair.client.addr, &old).await, (200, data(OLD)));
    assert_eq!(get(pair.client.addr, &new).await, (200, data(NEW)));
    let stats = pair.client.stats();
    assert_eq!(stats.deltas, 2, "both came as hsync streams");
    let (from_delta, total) = (stats.upstream_bytes, data(NEW).len() + data(OLD).len());
    assert!(
        (from_delta as usize) < total / 2,
        "{from_delta} bytes crossed for {total}"
    );

    // Gateway form too: the HTTP/2 authority names the accelerator itself.
    assert_eq!(
        get(pair.client.addr, "/index.html").await,
        (200, data("/index.html"))
    );

    // Concurrent requests share the one connection.
    let fetches = [
        "/jquery/3.7.0/jquery.js?a",
        "/jquery/3.7.0/jquery.js?b",
        "/index.html?c",
    ]
    .map(|path| tokio::spawn(get(pair.client.addr, path)));
    for fetch in fetches {
        assert_eq!(fetch.await.unwrap().0, 200);
    }
    let seen = pair.seen();
    assert_eq!(seen.len(), 6, "{seen:?}");
    assert!(
        seen.iter().all(|(version, _)| *version == Version::HTTP_2),
        "{seen:?}"
    );
    // Forward and gateway requests each have a pooled client: one
    // connection each, whatever the concurrency.
    assert_eq!(seen[0].1, seen[1].1, "{seen:?}");
    assert!(
        seen[2..].iter().all(|(_, peer)| *peer == seen[2].1),
        "{seen:?}"
    );

    // The accelerator's own stats answer over HTTP/2 too, where the
    // target names the accelerator (before, they went to the origin).
    let (status, body) = get(
        pair.client.addr,
        &format!("http://{}/.rproxy/stats", pair.accelerator.addr),
    )
    .await;
    let body = String::from_utf8_lossy(&body);
    assert_eq!(status, 200, "{body}");
    // The six fetches; the stats request is not counted.
    assert!(body.contains("\"requests\":6"), "{body}");
    assert_eq!(pair.seen()[6].0, Version::HTTP_2);
}

#[tokio::test]
async fn over_http1_on_tls_the_exchange_is_the_same() {
    let pair = start(true, &[b"http/1.1"]).await;
    let old = format!("http://{}{OLD}", pair.origin.addr);
    let new = format!("http://{}{NEW}", pair.origin.addr);
    assert_eq!(get(pair.client.addr, &old).await, (200, data(OLD)));
    assert_eq!(get(pair.client.addr, &new).await, (200, data(NEW)));
    assert_eq!(
        get(pair.client.addr, "/index.html").await,
        (200, data("/index.html"))
    );
    // The page too came as an hsync stream (from scratch: no basis).
    assert_eq!(pair.client.stats().deltas, 3);
    let seen = pair.seen();
    assert_eq!(seen.len(), 3);
    assert!(
        seen.iter().all(|(version, _)| *version == Version::HTTP_11),
        "{seen:?}"
    );
}

#[tokio::test]
async fn an_untrusted_certificate_is_a_502_and_nothing_is_fetched() {
    let pair = start(false, &[b"h2", b"http/1.1"]).await;
    let old = format!("http://{}{OLD}", pair.origin.addr);
    let (status, body) = get(pair.client.addr, &old).await;
    let body = String::from_utf8_lossy(&body);
    assert_eq!(status, 502, "{body}");
    assert!(body.contains("certificate"), "says why: {body}");
    assert!(pair.seen().is_empty());
    assert_eq!(pair.client.store().len(), 0);
}
