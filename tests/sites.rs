//! The accelerator's sites (issue 18): requests routed by the host they
//! ask for to the site's origin, with the `Host` a virtual host expects;
//! unknown names refused before any connection (421, and 400 for a foreign
//! absolute-form target, P-12); parent mode fetching the URL's own host
//! within an allow-list that refuses loopback and private addresses
//! unless listed, over TLS for `https://` URLs; and the `Forwarded`
//! and `X-Forwarded-*` the origin sees, kept from trusted hops only.

mod support;

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http::Response;
use http_body_util::Full;
use rproxy::accelerator::{AcceleratorConfig, SiteConfig, SiteNames, SiteOrigin};
use support::routing::{parent_site, patterns, site, with_sites};
use support::topology::{self, Accelerator, Origin, accelerator_config};
use support::tunnel::connect_http2;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// An origin answering every request with `name`.
async fn named_origin(name: &'static str) -> Origin {
    topology::origin(move |_, _| async move { Response::new(Full::new(Bytes::from(name))) }).await
}

/// Sends `target` with `headers` (one `Name: value` per line) and returns
/// the status and the body as text.
async fn ask(proxy: SocketAddr, target: &str, headers: &str) -> (u16, String) {
    let mut stream = TcpStream::connect(proxy).await.unwrap();
    let request = format!("GET {target} HTTP/1.1\r\n{headers}Connection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut answer))
        .await
        .expect("an answer within 10 s")
        .unwrap();
    let text = String::from_utf8_lossy(&answer).into_owned();
    let status = text[9..12].parse().unwrap();
    let body = text
        .split_once("\r\n\r\n")
        .map_or("", |(_, b)| b)
        .to_owned();
    (status, body)
}

#[tokio::test]
async fn requests_go_to_the_site_their_host_names() {
    let a = named_origin("site A").await;
    let b = named_origin("site B").await;
    let accel = Accelerator::start(with_sites(vec![
        site(&["www.a.test", "a.test"], a.addr),
        site(&["*.b.test"], b.addr),
    ]))
    .await;

    assert_eq!(
        ask(accel.addr, "/x", "Host: a.test\r\n").await,
        (200, "site A".into())
    );
    assert_eq!(
        ask(accel.addr, "/y", "Host: static.B.test:8080\r\n").await,
        (200, "site B".into())
    );
    assert_eq!(
        ask(accel.addr, "http://www.a.test/z", "Host: www.a.test\r\n").await,
        (200, "site A".into())
    );
    // A virtual host is sent the name the client asked for.
    assert_eq!(a.seen()[0].header("host"), Some("a.test"));
    assert_eq!(b.seen()[0].header("host"), Some("static.B.test:8080"));
    assert_eq!(a.seen()[1].uri.path(), "/z");
}

#[tokio::test]
async fn unknown_names_are_refused_without_an_origin_request() {
    let a = named_origin("site A").await;
    let accel = Accelerator::start(with_sites(vec![site(&["a.test", "*.a.test"], a.addr)])).await;

    let (status, body) = ask(accel.addr, "/", "Host: b.test\r\n").await;
    assert_eq!(status, 421, "{body}");
    assert!(body.contains("b.test"), "{body}");
    // Not a subdomain: `*.a.test` does not take `evila.test`.
    assert_eq!(ask(accel.addr, "/", "Host: evila.test\r\n").await.0, 421);
    // A foreign absolute-form target (P-12), and a userinfo trick.
    assert_eq!(
        ask(accel.addr, "http://b.test/", "Host: b.test\r\n")
            .await
            .0,
        400
    );
    let trick = format!("http://a.test@{}/", a.addr);
    assert_eq!(ask(accel.addr, &trick, "Host: a.test\r\n").await.0, 400);
    assert_eq!(a.requests(), 0);
}

#[tokio::test]
async fn the_one_site_shorthand_serves_any_host_but_only_its_own_urls() {
    let a = named_origin("site A").await;
    let accel = Accelerator::start(accelerator_config(a.addr)).await;

    assert_eq!(
        ask(accel.addr, "/", "Host: anything.test\r\n").await,
        (200, "site A".into())
    );
    // The origin is sent its own authority, as before sites existed.
    assert_eq!(
        a.seen()[0].header("host"),
        Some(a.addr.to_string().as_str())
    );
    assert_eq!(
        ask(
            accel.addr,
            "http://elsewhere.test/",
            "Host: elsewhere.test\r\n"
        )
        .await
        .0,
        400
    );
    assert_eq!(a.requests(), 1);
}

#[tokio::test]
async fn the_origin_learns_who_asked_from_trusted_hops_only() {
    let a = named_origin("site A").await;
    let lies = "Host: a.test\r\nForwarded: for=203.0.113.9\r\nX-Forwarded-For: 203.0.113.9\r\nX-Forwarded-Proto: https\r\n";

    let untrusting = Accelerator::start(with_sites(vec![site(&["a.test"], a.addr)])).await;
    assert_eq!(ask(untrusting.addr, "/", lies).await.0, 200);
    let seen = &a.seen()[0];
    assert_eq!(
        seen.header("forwarded"),
        Some("for=127.0.0.1;host=\"a.test\";proto=http")
    );
    assert_eq!(seen.header("x-forwarded-for"), Some("127.0.0.1"));
    assert_eq!(seen.header("x-forwarded-proto"), Some("http"));

    let trusting = Accelerator::start(AcceleratorConfig {
        trusted_forwarders: vec!["127.0.0.0/8".parse().unwrap()],
        ..with_sites(vec![site(&["a.test"], a.addr)])
    })
    .await;
    assert_eq!(ask(trusting.addr, "/", lies).await.0, 200);
    let seen = &a.seen()[1];
    assert_eq!(
        seen.header("forwarded"),
        Some("for=203.0.113.9, for=127.0.0.1;host=\"a.test\";proto=http")
    );
    assert_eq!(
        seen.header("x-forwarded-for"),
        Some("203.0.113.9, 127.0.0.1")
    );
    assert_eq!(seen.header("x-forwarded-proto"), Some("https"));
}

#[tokio::test]
async fn a_parent_fetches_allowed_urls_only() {
    let web = named_origin("from the web").await;
    let port = web.addr.port();
    let url = |host: &str| format!("http://{host}:{port}/page");

    let open = Accelerator::start(with_sites(vec![parent_site(
        &["localhost", "*.localhost"],
        vec![port],
        &["127.0.0.0/8", "::1/128"],
    )]))
    .await;
    let (status, body) = ask(open.addr, &url("localhost"), "Host: localhost\r\n").await;
    assert_eq!((status, body.as_str()), (200, "from the web"));
    assert_eq!(
        web.seen()[0].header("host"),
        Some(format!("localhost:{port}").as_str())
    );

    // A host or a port outside the allow-list, an address literal that is
    // not a listed host: 403 with no connection.
    assert_eq!(
        ask(open.addr, &url("127.0.0.1"), "Host: x\r\n").await.0,
        403
    );
    assert_eq!(
        ask(open.addr, &url("example.com"), "Host: x\r\n").await.0,
        403
    );
    let other_port = format!("http://localhost:{}/page", port.wrapping_add(1));
    assert_eq!(ask(open.addr, &other_port, "Host: x\r\n").await.0, 403);
    // The userinfo trick names 127.0.0.1, not localhost.
    let trick = format!("http://localhost@127.0.0.1:{port}/page");
    assert_eq!(ask(open.addr, &trick, "Host: x\r\n").await.0, 400);
    assert_eq!(web.requests(), 1);

    // Without loopback listed, a name that resolves to it is refused
    // where the connection would be made.
    let guarded = Accelerator::start(with_sites(vec![parent_site(
        &["localhost"],
        vec![port],
        &[],
    )]))
    .await;
    let (status, body) = ask(guarded.addr, &url("localhost"), "Host: localhost\r\n").await;
    assert_eq!(status, 403, "{body}");
    assert!(body.contains("may not connect"), "{body}");
    let metadata = "http://169.254.169.254/latest/meta-data/";
    let everything = Accelerator::start(with_sites(vec![parent_site(&["*"], vec![80], &[])])).await;
    assert_eq!(ask(everything.addr, metadata, "Host: x\r\n").await.0, 403);
    assert_eq!(web.requests(), 1);
}

#[tokio::test]
async fn https_origins_are_fetched_over_tls_with_the_configured_ca() {
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = topology::self_signed(dir.path());
    let tls = rproxy::http::tls::server_config(&cert, &key).unwrap();
    // The origin speaks HTTP/1.1 only.
    let mut tls = (*tls).clone();
    tls.alpn_protocols = vec![b"http/1.1".to_vec()];
    let origin = topology::tls_origin(
        |_, _| async { Response::new(Full::new(Bytes::from("secret page"))) },
        std::sync::Arc::new(tls),
    )
    .await;
    let port = origin.addr.port();

    let server_site = SiteConfig {
        names: SiteNames::Listed(patterns(&["secure.test"])),
        origin: SiteOrigin::Server {
            url: format!("https://localhost:{port}").parse().unwrap(),
            ca_file: Some(cert.clone()),
            health_path: None,
        },
    };
    let mut parent_site = parent_site(&["localhost"], vec![port], &["127.0.0.0/8", "::1/128"]);
    if let SiteOrigin::Parent(policy) = &mut parent_site.origin {
        policy.ca_file = Some(cert.clone());
    }
    let accel = Accelerator::start(with_sites(vec![server_site, parent_site])).await;

    let (status, body) = ask(accel.addr, "/", "Host: secure.test\r\n").await;
    assert_eq!((status, body.as_str()), (200, "secret page"));
    let https = format!("https://localhost:{port}/p");
    let (status, body) = ask(accel.addr, &https, "Host: localhost\r\n").await;
    assert_eq!((status, body.as_str()), (200, "secret page"));
    assert_eq!(origin.requests(), 2);

    // Trusting only the system's roots, the self-signed origin is refused.
    let untrusting = Accelerator::start(with_sites(vec![SiteConfig {
        names: SiteNames::Listed(patterns(&["secure.test"])),
        origin: SiteOrigin::Server {
            url: format!("https://localhost:{port}").parse().unwrap(),
            ca_file: None,
            health_path: None,
        },
    }]))
    .await;
    let (status, body) = ask(untrusting.addr, "/", "Host: secure.test\r\n").await;
    assert_eq!(status, 502);
    // The refusal says why, not only hyper's "client error (Connect)".
    assert!(body.contains("certificate"), "{body}");
    assert_eq!(origin.requests(), 2);
}

#[tokio::test]
async fn an_absolute_target_wins_over_a_host_that_names_another_site() {
    let a = named_origin("site A").await;
    let b = named_origin("site B").await;
    let accel = Accelerator::start(with_sites(vec![
        site(&["a.test"], a.addr),
        site(&["b.test"], b.addr),
    ]))
    .await;
    // RFC 9112 §3.2.2: the authority of an absolute-form target replaces
    // Host; a Host naming another site must not pick the origin.
    let (status, body) = ask(accel.addr, "http://a.test/x", "Host: b.test\r\n").await;
    assert_eq!((status, body.as_str()), (200, "site A"));
    assert_eq!(a.seen()[0].header("host"), Some("a.test"));
    assert_eq!(b.requests(), 0);
}

#[tokio::test]
async fn over_http2_a_sites_name_comes_in_the_authority() {
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = topology::self_signed(dir.path());
    let a = named_origin("site A").await;
    let accel = Accelerator::start_with(
        with_sites(vec![site(&["localhost"], a.addr)]),
        topology::Listen::tls(&cert, &key),
    )
    .await;
    // A browser's request: HTTP/2 over TLS to the site's name, no Host.
    let mut sender = connect_http2(accel.addr, &cert).await;
    let request = http::Request::get(format!("https://localhost:{}/page", accel.addr.port()))
        .body(http_body_util::Empty::<Bytes>::new())
        .unwrap();
    let response = sender.send_request(request).await.unwrap();
    assert_eq!(response.status(), 200);
    let body = http_body_util::BodyExt::collect(response.into_body())
        .await
        .unwrap();
    assert_eq!(body.to_bytes(), "site A");
    assert_eq!(
        a.seen()[0].header("host"),
        Some(format!("localhost:{}", accel.addr.port()).as_str())
    );
}
