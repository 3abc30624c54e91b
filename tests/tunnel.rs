//! CONNECT tunnels through the client proxy on a direct route (through an
//! upstream proxy: `parent_tunnel.rs`): bytes both ways to a TCP
//! echo server, curl fetching an `https://` page through one, and every
//! refusal made before any connection is opened (a port not listed, a
//! loopback address or a name resolving to one, a malformed target, no
//! credentials); a quiet tunnel closes after the idle timeout. Everything
//! stays on 127.0.0.1.

mod support;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::Response;
use http_body_util::Full;
use rproxy::client_proxy::{ClientConfig, RouteConfig, RouteHosts, RouteTo, TunnelConfig};
use rproxy::http::address_policy::AddressPolicy;
use rproxy::http::auth::{AuthFile, AuthGate, Authenticator, basic_credentials};
use rproxy::http::host_pattern::HostPattern;
use support::proxy::{client_config, eventually};
use support::topology::{self, Cache, ClientProxy, Listen, serve, temp_store};
use support::tunnel::{
    Echo, PROMPT, connect, connect_http2, http2_tunnels_are_streams, round_trip, status,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A client proxy whose tunnels may go to `ports` and to 127.0.0.0/8 when
/// `loopback`, every host by a direct route. The route's own address
/// policy allows nothing private: a tunnel's is `connect-allow-addresses`.
fn config(ports: &[u16], loopback: bool, idle_timeout: Duration) -> ClientConfig {
    ClientConfig {
        routes: vec![RouteConfig {
            hosts: RouteHosts::Listed(vec![HostPattern::parse("*").unwrap()]),
            to: RouteTo::Direct(AddressPolicy::default()),
            fallback: Vec::new(),
        }],
        tunnel: TunnelConfig {
            ports: ports.to_vec(),
            allow_addresses: if loopback {
                vec!["127.0.0.0/8".parse().unwrap()]
            } else {
                Vec::new()
            },
            idle_timeout,
        },
        ..client_config("http://127.0.0.1:9")
    }
}

#[tokio::test]
async fn a_tunnel_carries_bytes_both_ways_and_is_counted() {
    let echo = Echo::start().await;
    let proxy = ClientProxy::start(config(&[echo.addr.port()], true, PROMPT)).await;
    let (head, mut tunnel) = connect(proxy.addr, &echo.addr.to_string(), "").await;
    assert_eq!(status(&head), 200, "{head}");
    // Bytes that are no HTTP request (a TLS record's start, a blank line).
    let first: &[u8] = b"\x16\x03\x01 not HTTP\r\n\r\n";
    let payload: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
    assert_eq!(round_trip(&mut tunnel, first).await, first);
    assert_eq!(round_trip(&mut tunnel, &payload).await, payload);
    assert_eq!(echo.connections(), 1);
    drop(tunnel);
    let sent = (first.len() + payload.len()) as u64 * 2;
    eventually("the tunnel's bytes counted at its end", || {
        proxy.stats().tunnel_bytes == sent
    })
    .await;
    assert_eq!(proxy.stats().tunnels, 1);
    let json = reqwest_free_stats(proxy.addr).await;
    assert!(json.contains("\"tunnels\":1"), "{json}");
    assert!(json.contains(&format!("\"tunnel_bytes\":{sent}")), "{json}");
}

/// `GET /.rproxy/stats` over a raw socket.
async fn reqwest_free_stats(proxy: SocketAddr) -> String {
    let mut stream = TcpStream::connect(proxy).await.unwrap();
    stream
        .write_all(b"GET /.rproxy/stats HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut answer = String::new();
    tokio::time::timeout(PROMPT, stream.read_to_string(&mut answer))
        .await
        .unwrap()
        .unwrap();
    answer
}

#[tokio::test]
async fn curl_fetches_an_https_page_through_a_tunnel() {
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = topology::self_signed(dir.path());
    let tls = rproxy::http::tls::server_config(&cert, &key).unwrap();
    let mut tls = (*tls).clone();
    tls.alpn_protocols = vec![b"http/1.1".to_vec()];
    let origin = topology::tls_origin(
        |_, _| async { Response::new(Full::new(Bytes::from("secret page"))) },
        Arc::new(tls),
    )
    .await;
    let port = origin.addr.port();
    let proxy = ClientProxy::start(config(&[port], true, PROMPT)).await;
    let output = tokio::time::timeout(
        Duration::from_secs(20),
        tokio::process::Command::new("curl")
            .env_remove("no_proxy")
            .env_remove("NO_PROXY")
            .args(["-s", "-S", "--noproxy", "", "--proxy"])
            .arg(format!("http://{}", proxy.addr))
            .arg("--cacert")
            .arg(&cert)
            .arg(format!("https://localhost:{port}/"))
            .output(),
    )
    .await
    .expect("curl within 20 s")
    .expect("curl is installed");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert_eq!(output.stdout, b"secret page");
    assert_eq!(origin.requests(), 1);
    assert_eq!(proxy.stats().tunnels, 1, "curl went through the proxy");
}

#[tokio::test]
async fn a_port_not_listed_is_refused_before_any_connection() {
    let echo = Echo::start().await;
    let proxy = ClientProxy::start(config(&[443], true, PROMPT)).await;
    let (head, _) = connect(proxy.addr, &echo.addr.to_string(), "").await;
    assert_eq!(status(&head), 403, "{head}");
    assert!(
        head.to_ascii_lowercase().contains("connection: close"),
        "{head}"
    );
    assert_eq!(echo.connections(), 0);
    assert_eq!(proxy.stats().tunnels, 0);
}

#[tokio::test]
async fn loopback_addresses_and_names_are_refused_unless_allowed() {
    let echo = Echo::start().await;
    let port = echo.addr.port();
    let proxy = ClientProxy::start(config(&[port], false, PROMPT)).await;
    for target in [
        format!("127.0.0.1:{port}"),
        format!("localhost:{port}"),
        format!("[::ffff:127.0.0.1]:{port}"),
    ] {
        let (head, _) = connect(proxy.addr, &target, "").await;
        assert_eq!(status(&head), 403, "{target}: {head}");
    }
    assert_eq!(echo.connections(), 0);
    // Allowed, the same target goes through.
    let allowed = ClientProxy::start(config(&[port], true, PROMPT)).await;
    let (head, _) = connect(allowed.addr, &format!("localhost:{port}"), "").await;
    assert_eq!(status(&head), 200, "{head}");
    eventually("the echo server saw the tunnel", || echo.connections() == 1).await;
}

#[tokio::test]
async fn malformed_targets_are_bad_requests() {
    let echo = Echo::start().await;
    let port = echo.addr.port();
    let proxy = ClientProxy::start(config(&[port, 443], true, PROMPT)).await;
    for target in [
        "/path".to_owned(),
        format!("a@127.0.0.1:{port}"),
        "127.0.0.1".to_owned(),
        "example.com".to_owned(),
        format!("http://127.0.0.1:{port}/"),
    ] {
        let (head, _) = connect(proxy.addr, &target, "").await;
        assert_eq!(status(&head), 400, "{target}: {head}");
    }
    assert_eq!(echo.connections(), 0);
}

#[tokio::test]
async fn a_quiet_tunnel_closes_after_the_idle_timeout() {
    let echo = Echo::start().await;
    let idle = Duration::from_millis(400);
    let proxy = ClientProxy::start(config(&[echo.addr.port()], true, idle)).await;
    let (head, mut tunnel) = connect(proxy.addr, &echo.addr.to_string(), "").await;
    assert_eq!(status(&head), 200, "{head}");
    // Traffic keeps it open past the timeout…
    for _ in 0..4 {
        tokio::time::sleep(idle / 2).await;
        assert_eq!(round_trip(&mut tunnel, b"ping").await, b"ping");
    }
    // … and quiet closes it.
    let quiet = tokio::time::Instant::now();
    let mut byte = [0u8; 1];
    let read = tokio::time::timeout(PROMPT, tunnel.read(&mut byte))
        .await
        .expect("the proxy closes a quiet tunnel");
    assert!(matches!(read, Ok(0) | Err(_)), "{read:?}");
    assert!(quiet.elapsed() >= idle - Duration::from_millis(50));
}

fn authenticator(user: &str, password: &str) -> Authenticator {
    let mut file = AuthFile::default();
    file.set(user, password).unwrap();
    Authenticator::new(&file, "rproxy").unwrap()
}

#[tokio::test]
async fn a_connect_without_credentials_gets_407_and_opens_nothing() {
    let echo = Echo::start().await;
    let (dir, store) = temp_store(16 << 20);
    let proxy =
        rproxy::client_proxy::ClientProxy::new(config(&[echo.addr.port()], true, PROMPT), store)
            .unwrap();
    let gate = AuthGate::new(proxy, Some(authenticator("alice", "wonderland")));
    let gate = serve(Arc::new(gate), Listen::default()).await.keeping(dir);
    let target = echo.addr.to_string();
    let (head, _) = connect(gate.addr, &target, "").await;
    assert_eq!(status(&head), 407, "{head}");
    assert!(
        head.to_ascii_lowercase().contains("proxy-authenticate"),
        "{head}"
    );
    assert_eq!(echo.connections(), 0);
    let credentials = basic_credentials("alice", "wonderland");
    let (head, mut tunnel) = connect(
        gate.addr,
        &target,
        &format!("Proxy-Authorization: {}\r\n", credentials.to_str().unwrap()),
    )
    .await;
    assert_eq!(status(&head), 200, "{head}");
    assert_eq!(round_trip(&mut tunnel, b"through").await, b"through");
}

/// CONNECT over HTTP/2, to a client proxy listening on TLS where ALPN
/// picks h2: each tunnel is a stream of the one connection, and a refusal
/// is that stream's answer alone.
#[tokio::test]
async fn over_http2_each_tunnel_is_a_stream_and_a_refusal_ends_only_its_own() {
    let echo = Echo::start().await;
    let port = echo.addr.port();
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = topology::self_signed(dir.path());
    let listen = Listen::tls(&cert, &key);
    let proxy = ClientProxy::start_with(
        config(&[port], true, PROMPT),
        Cache::Temp(topology::CACHE_BYTES),
        listen,
    )
    .await;
    let mut sender = connect_http2(proxy.addr, &cert).await;

    let sent = http2_tunnels_are_streams(
        &mut sender,
        &echo.addr.to_string(),
        &format!("127.0.0.1:{}", port.wrapping_add(1)),
        &echo,
    )
    .await;
    drop(sender);
    eventually("both tunnels counted, with every byte", || {
        proxy.stats().tunnel_bytes == sent
    })
    .await;
    assert_eq!(proxy.stats().tunnels, 2);
}

#[tokio::test]
async fn open_tunnels_count_against_max_connections() {
    let echo = Echo::start().await;
    let target = format!("127.0.0.1:{}", echo.addr.port());
    let limits = rproxy::http::server::ConnectionLimits {
        max_connections: 2,
        ..Default::default()
    };
    let proxy = ClientProxy::start_with(
        config(&[echo.addr.port()], true, PROMPT),
        support::topology::Cache::Temp(support::topology::CACHE_BYTES),
        support::topology::Listen::with_limits(limits),
    )
    .await;
    let (head, mut first) = connect(proxy.addr, &target, "").await;
    assert_eq!(status(&head), 200, "{head}");
    let (head, mut second) = connect(proxy.addr, &target, "").await;
    assert_eq!(status(&head), 200, "{head}");
    assert_eq!(round_trip(&mut first, b"one").await, b"one");
    assert_eq!(round_trip(&mut second, b"two").await, b"two");

    // A third connection waits in the backlog while both tunnels are open.
    let third = tokio::spawn(async move { connect(proxy.addr, &target, "").await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !third.is_finished(),
        "a third connection was served beside two tunnels"
    );
    assert_eq!(echo.connections(), 2);
    // Closing a tunnel gives its place back.
    drop(first);
    let (head, mut third) = tokio::time::timeout(PROMPT, third).await.unwrap().unwrap();
    assert_eq!(status(&head), 200, "{head}");
    assert_eq!(round_trip(&mut third, b"three").await, b"three");
}
