//! The client proxy's routes (issue 18): one client proxy in front of
//! several sites, each host going to the accelerator that fronts it or
//! direct; deltas across every aware link; direct routes guarded against
//! loopback and private addresses unless listed; hosts no route
//! takes refused before any connection; gateway requests routed by
//! `Host`; our upstream credentials never sent to an origin.

mod support;

use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Response};
use http_body_util::Full;
use rproxy::accelerator::AcceleratorConfig;
use rproxy::client_proxy::{ClientConfig, RouteConfig};
use support::proxy::client_config;
use support::routing::{direct_route, site, upstream_route};
use support::topology::{Accelerator, Chain, ClientProxy, Origin, accelerator_config, origin};
use support::user_agent::get;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A page of about 200 KB whose `n`th version differs from the first in
/// one line, revalidated on every request.
fn page(site: &str, n: usize) -> Vec<u8> {
    let mut text = String::new();
    for line in 0..4000 {
        if line == 2000 {
            text.push_str(&format!("version {n} of {site}\n"));
        }
        text.push_str(&format!(
            "{site} line {line}: the quick brown fox {}\n",
            line * 7919 % 1000
        ));
    }
    text.into_bytes()
}

/// An origin serving [`page`] of `site`, a new version per request.
async fn versioned_origin(site: &'static str) -> Origin {
    origin(move |_, earlier| async move {
        let mut response = Response::new(Full::new(Bytes::from(page(site, earlier))));
        let headers = response.headers_mut();
        headers.insert("cache-control", HeaderValue::from_static("max-age=0"));
        headers.insert(
            "etag",
            HeaderValue::from_str(&format!("\"{site}{earlier}\"")).unwrap(),
        );
        response
    })
    .await
}

/// An accelerator answering to `names`, in front of `origin`.
async fn accelerator(names: &[&str], origin: &Origin) -> Accelerator {
    Accelerator::start(AcceleratorConfig {
        sites: vec![site(names, origin.addr)],
        ..accelerator_config(origin.addr)
    })
    .await
}

/// Sends `request` (a whole HTTP/1.1 head) to the proxy on a connection of
/// its own and returns all it answered, as text.
async fn raw(proxy: &ClientProxy, request: &str) -> String {
    let mut stream = TcpStream::connect(proxy.addr).await.unwrap();
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut answer))
        .await
        .expect("an answer within 10 s")
        .unwrap();
    String::from_utf8_lossy(&answer).into_owned()
}

async fn client(routes: Vec<RouteConfig>) -> ClientProxy {
    ClientProxy::start(ClientConfig {
        routes,
        ..client_config("http://127.0.0.1:1")
    })
    .await
}

#[tokio::test]
async fn one_client_proxy_reaches_three_sites_with_deltas_where_an_accelerator_fronts_them() {
    let a = versioned_origin("a").await;
    let b = versioned_origin("b").await;
    let c = versioned_origin("c").await;
    let accel_a = accelerator(&["*.a.test"], &a).await;
    let accel_b = accelerator(&["b.test"], &b).await;
    let proxy = client(vec![
        upstream_route(&["*.a.test"], accel_a.addr),
        upstream_route(&["b.test"], accel_b.addr),
        direct_route(&["*"], &["127.0.0.0/8"]),
    ])
    .await;
    let direct_url = format!("http://{}/c.html", c.addr);

    for n in 0..2 {
        get(proxy.addr, "http://www.a.test/a.html")
            .await
            .assert_body("a", &page("a", n));
        get(proxy.addr, "http://b.test/b.html")
            .await
            .assert_body("b", &page("b", n));
        get(proxy.addr, &direct_url)
            .await
            .assert_body("c", &page("c", n));
    }
    // Each site was asked by its own way: the virtual host's name, or the
    // direct URL's.
    assert_eq!(a.seen()[0].header("host"), Some("www.a.test"));
    assert_eq!(b.seen()[1].header("host"), Some("b.test"));
    assert_eq!(
        c.seen()[0].header("host"),
        Some(c.addr.to_string().as_str())
    );
    assert!(
        c.seen()[0]
            .header("via")
            .is_some_and(|via| via.contains("client-test"))
    );
    // Every answer of a and b's accelerators was an hsync stream, the
    // second versions' against the first; c's origin speaks no hsync, so
    // its bodies came whole.
    let stats = proxy.stats();
    assert_eq!(stats.deltas, 4, "{stats:?}");
    let whole_bytes = 2 * (page("a", 0).len() + page("b", 0).len() + page("c", 0).len()) as u64;
    assert!(
        stats.upstream_bytes < whole_bytes * 7 / 10,
        "{} bytes upstream for {whole_bytes} delivered",
        stats.upstream_bytes
    );
    assert_eq!(accel_a.stats().await["coded"], 2);
    assert_eq!(accel_b.stats().await["coded"], 2);
}

#[tokio::test]
async fn direct_routes_refuse_private_addresses_unless_listed() {
    let c = versioned_origin("c").await;
    let proxy = client(vec![direct_route(&["*"], &[])]).await;
    let fetched = get(proxy.addr, &format!("http://{}/", c.addr)).await;
    assert_eq!(fetched.status, 403);
    let fetched = get(proxy.addr, &format!("http://localhost:{}/", c.addr.port())).await;
    assert_eq!(fetched.status, 403);
    let fetched = get(proxy.addr, "http://169.254.169.254/latest/meta-data/").await;
    assert_eq!(fetched.status, 403);
    assert_eq!(c.requests(), 0);
}

#[tokio::test]
async fn direct_routes_refuse_privileged_ports_but_80_and_443() {
    let proxy = client(vec![direct_route(&["*"], &["127.0.0.0/8"])]).await;
    for port in [25, 22, 6, 1023] {
        let fetched = get(proxy.addr, &format!("http://127.0.0.1:{port}/")).await;
        assert_eq!(fetched.status, 403, "port {port}");
        let body = String::from_utf8(fetched.body.unwrap()).unwrap();
        assert!(body.contains(&format!("port {port}")), "{body}");
    }
    // Port 80 is allowed: nothing listens there, so the answer is a 502
    // (or a 200 if something does), not a refusal.
    let fetched = get(proxy.addr, "http://127.0.0.1:80/").await;
    assert_ne!(fetched.status, 403);
}

#[tokio::test]
async fn a_host_no_route_takes_is_refused_without_a_connection() {
    let a = versioned_origin("a").await;
    let accel_a = accelerator(&["a.test"], &a).await;
    let proxy = client(vec![upstream_route(&["a.test"], accel_a.addr)]).await;
    let fetched = get(proxy.addr, "http://elsewhere.test/").await;
    assert_eq!(fetched.status, 403);
    let body = String::from_utf8(fetched.body.unwrap()).unwrap();
    assert!(body.contains("no route for elsewhere.test"), "{body}");
    assert_eq!(
        accel_a.stats().await["requests"],
        0,
        "no request reached it"
    );
}

#[tokio::test]
async fn gateway_requests_are_routed_by_host() {
    let a = versioned_origin("a").await;
    let accel_a = accelerator(&["a.test"], &a).await;
    let proxy = client(vec![upstream_route(&["a.test"], accel_a.addr)]).await;
    let text = raw(
        &proxy,
        "GET /a.html HTTP/1.1\r\nHost: a.test\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    assert!(text.contains("version 0 of a\n"), "{text}");
    assert_eq!(a.seen()[0].header("host"), Some("a.test"));
}

#[tokio::test]
async fn our_upstream_credentials_never_reach_an_origin() {
    let a = versioned_origin("a").await;
    let c = versioned_origin("c").await;
    let accel_a = accelerator(&["a.test"], &a).await;
    let proxy = ClientProxy::start(ClientConfig {
        routes: vec![
            upstream_route(&["a.test"], accel_a.addr),
            direct_route(&["*"], &["127.0.0.0/8"]),
        ],
        upstream_credentials: Some(HeaderValue::from_static("Basic dXNlcjpwYXNz")),
        ..client_config("http://127.0.0.1:1")
    })
    .await;
    get(proxy.addr, &format!("http://{}/", c.addr))
        .await
        .assert_body("c", &page("c", 0));
    assert_eq!(c.seen()[0].header("proxy-authorization"), None);
    get(proxy.addr, "http://a.test/")
        .await
        .assert_body("a", &page("a", 0));
    // Nor does the origin behind the accelerator.
    assert_eq!(a.seen()[0].header("proxy-authorization"), None);
}

#[tokio::test]
async fn in_a_chain_every_client_proxy_is_an_hsync_hop() {
    let a = versioned_origin("a").await;
    let chain = Chain::start(a.addr, 2).await;
    let (middle, nearest) = (&chain.clients[0], chain.nearest());
    let url = format!("http://{}/a.html", a.addr);

    get(nearest.addr, &url)
        .await
        .assert_body("a", &page("a", 0));
    let first_link = nearest.stats().upstream_bytes;
    get(nearest.addr, &url)
        .await
        .assert_body("a", &page("a", 1));

    // Both links carried hsync: the accelerator's to the middle proxy, and
    // the middle proxy's, coded against the nearest one's copy, to it.
    assert_eq!(middle.stats().deltas, 2, "{:?}", middle.stats());
    assert_eq!(nearest.stats().deltas, 2, "{:?}", nearest.stats());
    let second_link = nearest.stats().upstream_bytes - first_link;
    assert!(
        second_link < page("a", 1).len() as u64 / 20,
        "{second_link} bytes for a one-line change between the two proxies"
    );
    // Each hop's Via reached the origin.
    let seen = &a.seen()[1];
    let via: Vec<&str> = seen
        .headers
        .get_all("via")
        .iter()
        .map(|v| v.to_str().unwrap())
        .collect();
    let via = via.join(", ");
    for hop in ["client-test-1", "client-test-0", "accel-test"] {
        assert!(via.contains(hop), "{via}");
    }
}

#[tokio::test]
async fn a_chain_link_can_serve_plain_bodies() {
    let a = versioned_origin("a").await;
    let accel = accelerator(&["*"], &a).await;
    let middle = ClientProxy::start(ClientConfig {
        downstream_coding: None,
        ..client_config(&format!("http://{}", accel.addr))
    })
    .await;
    let nearest = ClientProxy::start(ClientConfig {
        via_name: HeaderValue::from_static("client-test-near"),
        ..client_config(&format!("http://{}", middle.addr))
    })
    .await;
    let url = format!("http://{}/a.html", a.addr);
    get(nearest.addr, &url)
        .await
        .assert_body("a", &page("a", 0));
    get(nearest.addr, &url)
        .await
        .assert_body("a", &page("a", 1));
    assert_eq!(middle.stats().deltas, 2);
    assert_eq!(nearest.stats().deltas, 0);
}

#[tokio::test]
async fn the_urls_host_picks_the_route_whatever_host_says() {
    let a = versioned_origin("a").await;
    let accel_a = accelerator(&["a.test"], &a).await;
    let c = versioned_origin("c").await;
    let proxy = client(vec![
        upstream_route(&["a.test"], accel_a.addr),
        direct_route(&["*"], &["127.0.0.0/8"]),
    ])
    .await;
    let request = format!(
        "GET http://{}/c.html HTTP/1.1\r\nHost: a.test\r\nConnection: close\r\n\r\n",
        c.addr
    );
    let text = raw(&proxy, &request).await;
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    assert!(text.contains("version 0 of c\n"), "{text}");
    assert_eq!(a.requests(), 0);
    assert_eq!(
        c.seen()[0].header("host"),
        Some(c.addr.to_string().as_str())
    );
}

#[tokio::test]
async fn the_client_proxy_tells_who_asked_and_drops_what_a_user_agent_made_up() {
    let c = versioned_origin("c").await;
    let proxy = client(vec![direct_route(&["*"], &["127.0.0.0/8"])]).await;
    let request = format!(
        "GET http://{0}/c.html HTTP/1.1\r\nHost: {0}\r\nForwarded: for=203.0.113.9\r\n\
         X-Forwarded-For: 203.0.113.9\r\nConnection: close\r\n\r\n",
        c.addr
    );
    let text = raw(&proxy, &request).await;
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    let seen = &c.seen()[0];
    assert_eq!(
        seen.header("forwarded"),
        Some(format!("for=127.0.0.1;host=\"{}\";proto=http", c.addr).as_str())
    );
    assert_eq!(seen.header("x-forwarded-for"), Some("127.0.0.1"));
}

#[tokio::test]
async fn a_direct_route_sends_signatures_only_to_hosts_that_answered_in_hsync() {
    let a = versioned_origin("a").await;
    let accel_a = Accelerator::start(accelerator_config(a.addr)).await;
    let c = versioned_origin("c").await;
    let proxy = client(vec![direct_route(&["*"], &["127.0.0.0/8"])]).await;
    let fronted = format!("http://{}/a.html", accel_a.addr);
    let plain = format!("http://{}/c.html", c.addr);
    let mut streams = Vec::new();
    for n in 0..2 {
        get(proxy.addr, &fronted)
            .await
            .assert_body("a", &page("a", n));
        streams.push(
            accel_a.stats().await["coded_stream_bytes"]
                .as_u64()
                .unwrap(),
        );
        get(proxy.addr, &plain)
            .await
            .assert_body("c", &page("c", n));
    }
    // The accelerator's first (coded) answer advertised hsync: the second
    // request offered the first version as its basis and got a delta.
    let delta = streams[1] - streams[0];
    assert!(
        delta < page("a", 1).len() as u64 / 50,
        "{delta} bytes for a one-line change (first answer {})",
        streams[0]
    );
    // The plain origin never answered in hsync: it was sent no basis.
    for seen in c.seen() {
        assert_eq!(seen.header("hsync-signature"), None);
        assert_eq!(seen.header("hsync-basis"), None);
    }
}

#[tokio::test]
async fn our_queue_callback_address_goes_to_upstream_proxies_only() {
    let a = versioned_origin("a").await;
    let accel_a = accelerator(&["a.test"], &a).await;
    let c = versioned_origin("c").await;
    let mut config = ClientConfig {
        routes: vec![
            upstream_route(&["a.test"], accel_a.addr),
            direct_route(&["*"], &["127.0.0.0/8"]),
        ],
        ..client_config("http://127.0.0.1:1")
    };
    config.queue.node = Some("192.0.2.1:9".parse().unwrap());
    let proxy = ClientProxy::start(config).await;
    get(proxy.addr, &format!("http://{}/c.html", c.addr))
        .await
        .assert_body("c", &page("c", 0));
    assert_eq!(c.seen()[0].header("x-node"), None);
    // The accelerator got it (and keeps the queue's headers from its origin).
    get(proxy.addr, "http://a.test/a.html")
        .await
        .assert_body("a", &page("a", 0));
    assert_eq!(a.seen()[0].header("x-node"), None);
}
