//! CONNECT through the routes (issue 18): a client proxy whose route
//! sends a host to an upstream proxy tunnels there as a CONNECT to it
//! (plain or TLS), with its upstream credentials, and a parent-mode
//! accelerator tunnels for it within its allow-list of hosts, ports and
//! addresses; a site that is not a parent still refuses CONNECT. Bytes
//! both ways to a TCP echo server, curl fetching an `https://` page
//! through the pair, and every refusal made before the target sees a
//! connection. Everything stays on 127.0.0.1.

mod support;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Response};
use http_body_util::Full;
use rproxy::accelerator::{
    Accelerator as AcceleratorRole, AcceleratorConfig, SiteConfig, SiteNames, SiteOrigin,
};
use rproxy::client_proxy::{ClientConfig, RouteConfig, RouteHosts, RouteTo, TunnelConfig};
use rproxy::http::auth::{AuthFile, AuthGate, Authenticator, basic_credentials};
use support::proxy::{client_config, eventually};
use support::routing::{allowing, parent_site, patterns, upstream_route, with_sites};
use support::topology::{self, Accelerator, ClientProxy, Listen, accelerator_config, serve};
use support::tunnel::{
    Echo, PROMPT, connect, connect_http2, http2_tunnels_are_streams, rest, round_trip, status,
};

const LOOPBACK: &[&str] = &["127.0.0.0/8", "::1/128"];

/// A parent tunnelling to localhost on `ports`, loopback allowed.
async fn parent(ports: Vec<u16>) -> Accelerator {
    Accelerator::start(with_sites(vec![parent_site(
        &["localhost"],
        ports,
        LOOPBACK,
    )]))
    .await
}

/// Every other host direct: its tunnels may not go to loopback, so a
/// tunnel to the echo server that works went through the upstream.
fn direct_elsewhere() -> RouteConfig {
    RouteConfig {
        hosts: RouteHosts::Listed(patterns(&["*"])),
        to: RouteTo::Direct(allowing(LOOPBACK)),
        fallback: Vec::new(),
    }
}

/// A client proxy with `routes`, tunnelling to `ports`, loopback refused
/// to its own (direct) tunnels.
fn client(routes: Vec<RouteConfig>, ports: Vec<u16>) -> ClientConfig {
    ClientConfig {
        routes,
        tunnel: TunnelConfig {
            ports,
            allow_addresses: Vec::new(),
            idle_timeout: PROMPT,
        },
        ..client_config("http://127.0.0.1:1")
    }
}

fn authenticator(user: &str, password: &str) -> Authenticator {
    let mut file = AuthFile::default();
    file.set(user, password).unwrap();
    Authenticator::new(&file, "parent").unwrap()
}

#[tokio::test]
async fn a_routed_connect_goes_through_the_parent_both_ways() {
    let echo = Echo::start().await;
    let port = echo.addr.port();
    let parent = parent(vec![port]).await;
    let proxy = ClientProxy::start(client(
        vec![
            upstream_route(&["localhost"], parent.addr),
            direct_elsewhere(),
        ],
        vec![port],
    ))
    .await;

    let (head, mut tunnel) = connect(proxy.addr, &format!("localhost:{port}"), "").await;
    assert_eq!(status(&head), 200, "{head}");
    let first: &[u8] = b"\x16\x03\x01 not HTTP\r\n\r\n";
    let payload: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
    assert_eq!(round_trip(&mut tunnel, first).await, first);
    assert_eq!(round_trip(&mut tunnel, &payload).await, payload);
    assert_eq!(echo.connections(), 1);
    drop(tunnel);

    let sent = (first.len() + payload.len()) as u64 * 2;
    eventually("the client's tunnel bytes counted at its end", || {
        proxy.stats().tunnel_bytes == sent
    })
    .await;
    assert_eq!(proxy.stats().tunnels, 1);
    // The parent opened it and counted the same bytes.
    for _ in 0..100 {
        if parent.stats().await["tunnel_bytes"] == sent {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let stats = parent.stats().await;
    assert_eq!(stats["tunnels"], 1, "{stats}");
    assert_eq!(stats["tunnel_bytes"], sent, "{stats}");

    // The direct route's tunnels may not reach loopback: the same target
    // by address goes direct, and is refused there.
    let (head, _) = connect(proxy.addr, &format!("127.0.0.1:{port}"), "").await;
    assert_eq!(status(&head), 403, "{head}");
    assert_eq!(echo.connections(), 1);
}

#[tokio::test]
async fn curl_fetches_an_https_page_through_the_client_and_its_parent() {
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
    let parent = parent(vec![port]).await;
    let proxy = ClientProxy::start(client(
        vec![upstream_route(&["*"], parent.addr)],
        vec![port],
    ))
    .await;
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
    assert_eq!(proxy.stats().tunnels, 1);
    assert_eq!(parent.stats().await["tunnels"], 1);
}

/// CONNECT over HTTP/2, to a parent reached over TLS where ALPN picks
/// h2: each tunnel is a stream of the one connection, and a refusal is
/// that stream's answer alone.
#[tokio::test]
async fn over_http2_each_tunnel_is_a_stream_and_a_refusal_ends_only_its_own() {
    let echo = Echo::start().await;
    let port = echo.addr.port();
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = topology::self_signed(dir.path());
    let listen = Listen::tls(&cert, &key);
    let sites = with_sites(vec![parent_site(&["localhost"], vec![port], LOOPBACK)]);
    let parent = Accelerator::start_with(sites, listen).await;
    let mut sender = connect_http2(parent.addr, &cert).await;

    let sent = http2_tunnels_are_streams(
        &mut sender,
        &format!("localhost:{port}"),
        &format!("localhost:{}", port.wrapping_add(1)),
        &echo,
    )
    .await;
    drop(sender);
    // Both tunnels counted, with every byte, once their streams ended (the
    // counters read in place: the listener speaks TLS only).
    let stats = || parent.handler.stats().snapshot();
    eventually("both tunnels' bytes counted", || {
        stats().tunnel_bytes == sent
    })
    .await;
    assert_eq!(stats().tunnels, 2);
}

#[tokio::test]
async fn the_parent_refuses_tunnels_outside_its_allow_list_before_connecting() {
    let echo = Echo::start().await;
    let port = echo.addr.port();
    let parent = parent(vec![port]).await;
    // A host not listed (an address literal is no listed name), a port
    // not listed, a malformed target.
    for (target, expected) in [
        (format!("127.0.0.1:{port}"), 403),
        (format!("example.com:{port}"), 403),
        (format!("localhost:{}", port.wrapping_add(1)), 403),
        ("localhost".to_owned(), 400),
        (format!("a@localhost:{port}"), 400),
    ] {
        let (head, stream) = connect(parent.addr, &target, "").await;
        assert_eq!(status(&head), expected, "{target}: {head}");
        assert!(
            head.to_ascii_lowercase().contains("connection: close"),
            "{head}"
        );
        drop(stream);
    }
    // Any host, but loopback not among the addresses: a name resolving
    // to it is refused where the connection would be made, a literal
    // before.
    let guarded = Accelerator::start(with_sites(vec![parent_site(&["*"], vec![port], &[])])).await;
    for target in [format!("localhost:{port}"), format!("127.0.0.1:{port}")] {
        let (head, stream) = connect(guarded.addr, &target, "").await;
        assert_eq!(status(&head), 403, "{target}: {head}");
        let body = rest(stream).await;
        assert!(
            body.contains("may not connect") || body.contains("not an address this parent"),
            "{target}: {body}"
        );
    }
    assert_eq!(echo.connections(), 0);
    assert_eq!(parent.stats().await["tunnels"], 0);
    assert_eq!(guarded.stats().await["tunnels"], 0);

    // Through a client proxy, the parent's refusal is a 502 naming it.
    let proxy = ClientProxy::start(client(
        vec![upstream_route(&["*"], guarded.addr)],
        vec![port],
    ))
    .await;
    let (head, stream) = connect(proxy.addr, &format!("localhost:{port}"), "").await;
    assert_eq!(status(&head), 502, "{head}");
    let body = rest(stream).await;
    assert!(body.contains("403"), "{body}");
    assert_eq!(echo.connections(), 0);
    assert_eq!(proxy.stats().tunnels, 0);
}

#[tokio::test]
async fn a_site_that_is_not_a_parent_refuses_connect_with_400() {
    let echo = Echo::start().await;
    let port = echo.addr.port();
    // The first site whose names match takes the CONNECT, as it would a
    // request: an origin server's site does not tunnel, even with a
    // parent behind it.
    let accel = Accelerator::start(with_sites(vec![
        SiteConfig {
            names: SiteNames::Listed(patterns(&["localhost"])),
            origin: SiteOrigin::Server {
                url: format!("http://{}", echo.addr).parse().unwrap(),
                ca_file: None,
                health_path: None,
            },
        },
        parent_site(&["*"], vec![port], LOOPBACK),
    ]))
    .await;
    let (head, _) = connect(accel.addr, &format!("localhost:{port}"), "").await;
    assert_eq!(status(&head), 400, "{head}");
    // The parent takes the others.
    let (head, mut tunnel) = connect(accel.addr, &format!("127.0.0.1:{port}"), "").await;
    assert_eq!(status(&head), 200, "{head}");
    assert_eq!(round_trip(&mut tunnel, b"hello").await, b"hello");
    assert_eq!(echo.connections(), 1);

    // The one-origin shorthand never tunnels. A client proxy with it as
    // its `--upstream` tunnels direct (the shorthand's upstream is the
    // accelerator of a site); a route that names it gets 502, naming its
    // 400.
    let plain = Accelerator::start(accelerator_config(echo.addr)).await;
    let (head, _) = connect(plain.addr, &format!("127.0.0.1:{port}"), "").await;
    assert_eq!(status(&head), 400, "{head}");
    let shorthand = ClientProxy::start(ClientConfig {
        tunnel: TunnelConfig {
            ports: vec![port],
            allow_addresses: LOOPBACK.iter().map(|a| a.parse().unwrap()).collect(),
            idle_timeout: PROMPT,
        },
        ..client_config(&format!("http://{}", plain.addr))
    })
    .await;
    let (head, mut tunnel) = connect(shorthand.addr, &format!("127.0.0.1:{port}"), "").await;
    assert_eq!(status(&head), 200, "{head}");
    assert_eq!(round_trip(&mut tunnel, b"direct").await, b"direct");
    assert_eq!(echo.connections(), 2);
    let routed =
        ClientProxy::start(client(vec![upstream_route(&["*"], plain.addr)], vec![port])).await;
    let (head, stream) = connect(routed.addr, &format!("127.0.0.1:{port}"), "").await;
    assert_eq!(status(&head), 502, "{head}");
    assert!(rest(stream).await.contains("400"));
    assert_eq!(echo.connections(), 2);
}

#[tokio::test]
async fn a_host_no_route_takes_gets_403_without_a_connection() {
    let echo = Echo::start().await;
    let port = echo.addr.port();
    let parent = parent(vec![port]).await;
    let proxy = ClientProxy::start(client(
        vec![upstream_route(&["localhost"], parent.addr)],
        vec![port],
    ))
    .await;
    let (head, stream) = connect(proxy.addr, &format!("127.0.0.1:{port}"), "").await;
    assert_eq!(status(&head), 403, "{head}");
    assert!(rest(stream).await.contains("no route for 127.0.0.1"));
    assert_eq!(echo.connections(), 0);
    assert_eq!(parent.stats().await["requests"], 0, "no request reached it");
}

#[tokio::test]
async fn the_client_sends_its_upstream_credentials_on_connect() {
    let echo = Echo::start().await;
    let port = echo.addr.port();
    let accelerator = AcceleratorRole::new(with_sites(vec![parent_site(
        &["localhost"],
        vec![port],
        LOOPBACK,
    )]))
    .unwrap();
    let gate = AuthGate::new(accelerator, Some(authenticator("edge", "s3cret")));
    let gate = serve(Arc::new(gate), Listen::default()).await;
    let through = |credentials: Option<HeaderValue>| {
        ClientProxy::start(ClientConfig {
            upstream_credentials: credentials,
            ..client(vec![upstream_route(&["*"], gate.addr)], vec![port])
        })
    };
    let target = format!("localhost:{port}");

    // Right: the tunnel opens.
    let proxy = through(Some(basic_credentials("edge", "s3cret"))).await;
    let (head, mut tunnel) = connect(proxy.addr, &target, "").await;
    assert_eq!(status(&head), 200, "{head}");
    assert_eq!(
        round_trip(&mut tunnel, b"with credentials").await,
        b"with credentials"
    );
    assert_eq!(echo.connections(), 1);

    // Wrong, or none: the upstream's 407 is ours to fix, not the user
    // agent's, so it gets a 502 saying which.
    let proxy = through(Some(basic_credentials("edge", "wrong"))).await;
    let (head, stream) = connect(proxy.addr, &target, "").await;
    assert_eq!(status(&head), 502, "{head}");
    assert!(
        !head.to_ascii_lowercase().contains("proxy-authenticate"),
        "{head}"
    );
    let body = rest(stream).await;
    assert!(body.contains("refused our credentials"), "{body}");
    let proxy = through(None).await;
    let (head, stream) = connect(proxy.addr, &target, "").await;
    assert_eq!(status(&head), 502, "{head}");
    assert!(rest(stream).await.contains("wants proxy credentials"));
    assert_eq!(echo.connections(), 1);
    assert_eq!(proxy.stats().tunnels, 0);
}

#[tokio::test]
async fn a_quiet_parent_tunnel_closes_after_the_idle_timeout() {
    let echo = Echo::start().await;
    let port = echo.addr.port();
    let idle = Duration::from_millis(400);
    let parent = Accelerator::start(AcceleratorConfig {
        tunnel_idle_timeout: idle,
        ..with_sites(vec![parent_site(&["localhost"], vec![port], LOOPBACK)])
    })
    .await;
    let (head, mut tunnel) = connect(parent.addr, &format!("localhost:{port}"), "").await;
    assert_eq!(status(&head), 200, "{head}");
    assert_eq!(round_trip(&mut tunnel, b"ping").await, b"ping");
    let quiet = tokio::time::Instant::now();
    let mut byte = [0u8; 1];
    let read = tokio::time::timeout(
        PROMPT,
        tokio::io::AsyncReadExt::read(&mut tunnel, &mut byte),
    )
    .await
    .expect("the parent closes a quiet tunnel");
    assert!(matches!(read, Ok(0) | Err(_)), "{read:?}");
    assert!(quiet.elapsed() >= idle - Duration::from_millis(50));
}

#[tokio::test]
async fn a_connect_goes_to_an_https_upstream_over_tls() {
    let echo = Echo::start().await;
    let port = echo.addr.port();
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = topology::self_signed(dir.path());
    // The parent offers h2 and HTTP/1.1; a CONNECT to it goes on an
    // HTTP/1.1 connection of its own.
    let parent = Accelerator::start_with(
        with_sites(vec![parent_site(&["localhost"], vec![port], LOOPBACK)]),
        Listen::tls(&cert, &key),
    )
    .await;
    let mut tls = (*rproxy::http::tls::client_config(Some(&cert)).unwrap()).clone();
    tls.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    let proxy = ClientProxy::start(ClientConfig {
        upstream_tls: Some(Arc::new(tls)),
        ..client(
            vec![RouteConfig {
                hosts: RouteHosts::Listed(patterns(&["*"])),
                to: RouteTo::Upstream(format!("https://{}", parent.addr).parse().unwrap()),
                fallback: Vec::new(),
            }],
            vec![port],
        )
    })
    .await;
    let (head, mut tunnel) = connect(proxy.addr, &format!("localhost:{port}"), "").await;
    assert_eq!(status(&head), 200, "{head}");
    assert_eq!(round_trip(&mut tunnel, b"over TLS").await, b"over TLS");
    assert_eq!(echo.connections(), 1);
    assert_eq!(proxy.stats().tunnels, 1);
}
