//! Origin and upstream health (issue 19): an accelerator whose origin
//! stopped answers 503 at once after N failures, without a connection,
//! lets one request probe once the down time has passed and serves again
//! when it succeeds; an active `health-path` check marks a site down and
//! up; a 5xx answer marks nothing. A client proxy passes a GET whose
//! upstream cannot be reached to the route's fallback, never a POST unless
//! the upstream is already marked down; a direct fallback gets neither our
//! credentials, nor our queue callback address, nor a signature its host
//! did not ask for.

mod support;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode};
use http_body_util::Full;
use rproxy::accelerator::{AcceleratorConfig, SiteConfig, SiteNames, SiteOrigin};
use rproxy::client_proxy::{ClientConfig, RouteConfig, RouteHosts, RouteTo};
use rproxy::http::health::{HealthPolicy, HealthState};
use support::proxy::{client_config, eventually};
use support::routing::{allowing, parent_site, patterns, with_sites};
use support::topology::{Accelerator, ClientProxy, Origin, accelerator_config, origin, origin_on};
use support::user_agent::get;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// An address nothing listens on (until a test binds it again).
async fn closed_port() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    listener.local_addr().unwrap()
}

/// Marked down after `failures`, for `down_time`.
fn policy(failures: u32, down_time: Duration) -> HealthPolicy {
    HealthPolicy {
        failures,
        down_time,
        max_down_time: down_time,
    }
}

/// What a raw exchange came back with.
struct Answer {
    status: u16,
    head: String,
    body: String,
}

/// Sends `request` (a whole HTTP/1.1 request) on a connection of its own.
async fn exchange(to: SocketAddr, request: &str) -> Answer {
    let mut stream = TcpStream::connect(to).await.unwrap();
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut answer))
        .await
        .expect("an answer within 10 s")
        .unwrap();
    let text = String::from_utf8_lossy(&answer).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    Answer {
        status: head[9..12].parse().unwrap(),
        head: head.to_ascii_lowercase(),
        body: body.to_owned(),
    }
}

/// `GET path` from the accelerator at `to`.
async fn ask(to: SocketAddr, path: &str) -> Answer {
    exchange(
        to,
        &format!("GET {path} HTTP/1.1\r\nHost: site.test\r\nConnection: close\r\n\r\n"),
    )
    .await
}

/// An origin answering `body` to everything.
async fn saying(body: &'static str) -> Origin {
    origin(move |_, _| async move { Response::new(Full::new(Bytes::from(body))) }).await
}

#[tokio::test]
async fn an_origin_that_failed_n_times_is_refused_at_once_without_a_connection() {
    let addr = closed_port().await;
    let accel = Accelerator::start(AcceleratorConfig {
        health: policy(3, Duration::from_secs(600)),
        ..accelerator_config(addr)
    })
    .await;
    for n in 0..3 {
        let answer = ask(accel.addr, "/").await;
        assert_eq!(answer.status, 502, "request {n}: {}", answer.body);
    }
    // The origin's port listens again; the accelerator does not know yet.
    let listener = std::net::TcpListener::bind(addr).unwrap();
    listener.set_nonblocking(true).unwrap();

    let answer = ask(accel.addr, "/").await;
    assert_eq!(answer.status, 503, "{}", answer.body);
    assert!(answer.head.contains("retry-after: "), "{}", answer.head);
    assert!(answer.body.contains("is down"), "{}", answer.body);
    // A connection would be waiting to be accepted by now.
    let accepted = listener.accept();
    assert!(
        matches!(&accepted, Err(e) if e.kind() == std::io::ErrorKind::WouldBlock),
        "the origin was connected to: {accepted:?}"
    );

    let views = accel.health_views();
    assert_eq!(views.len(), 1);
    assert_eq!(views[0].name, format!("http://{addr}"));
    assert!(matches!(views[0].state, HealthState::Down { .. }));
    assert_eq!((views[0].failures, views[0].times_down), (3, 1));
    assert!(
        views[0]
            .last_error
            .as_deref()
            .is_some_and(|e| e.contains("unreachable")),
        "{:?}",
        views[0].last_error
    );
    // Refused on the origin's account.
    assert_eq!(accel.stats().await["refused_upstream"], 4);

    // The admin listener's metrics say so, by the origin's URL.
    let source: Arc<dyn rproxy::admin::Source> = accel.handler.clone();
    let metrics = rproxy::admin::Metrics::new(source).encode();
    let origin = format!("upstream=\"http://{addr}\"");
    for sample in [
        format!("rproxy_upstream_up{{{origin}}} 0"),
        format!("rproxy_upstream_failures{{{origin}}} 3"),
        format!("rproxy_upstream_marked_down_total{{{origin}}} 1"),
    ] {
        assert!(metrics.contains(&sample), "{sample} in {metrics}");
    }
}

#[tokio::test]
async fn after_the_down_time_one_request_probes_and_brings_the_site_back() {
    let addr = closed_port().await;
    let accel = Accelerator::start(AcceleratorConfig {
        health: policy(1, Duration::from_millis(200)),
        ..accelerator_config(addr)
    })
    .await;
    assert_eq!(ask(accel.addr, "/").await.status, 502);
    let origin = origin_on(TcpListener::bind(addr).await.unwrap(), |_, _| async {
        Response::new(Full::new(Bytes::from("back")))
    })
    .await;

    // Refused until the down time has passed; then one request probes.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let answer = ask(accel.addr, "/").await;
        if answer.status == 200 {
            assert_eq!(answer.body, "back");
            break;
        }
        assert_eq!(answer.status, 503, "{}", answer.body);
        assert!(tokio::time::Instant::now() < deadline, "no probe in 10 s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        origin.requests(),
        1,
        "the refused requests never reached it"
    );
    assert!(accel.health_views()[0].is_up());
    assert_eq!(ask(accel.addr, "/").await.status, 200);
    assert_eq!(origin.requests(), 2);
}

#[tokio::test]
async fn a_5xx_answer_does_not_mark_the_origin_down() {
    let failing = origin(|_, _| async {
        let mut response = Response::new(Full::new(Bytes::from("oops")));
        *response.status_mut() = StatusCode::INTERNAL_SERVER_ERROR;
        response
    })
    .await;
    let accel = Accelerator::start(AcceleratorConfig {
        health: policy(1, Duration::from_secs(600)),
        ..accelerator_config(failing.addr)
    })
    .await;
    for _ in 0..3 {
        assert_eq!(ask(accel.addr, "/").await.status, 500);
    }
    assert_eq!(failing.requests(), 3);
    assert!(accel.health_views()[0].is_up());
}

#[tokio::test]
async fn a_failing_health_check_marks_the_site_down_and_a_passing_one_up_again() {
    let healthy = Arc::new(AtomicBool::new(true));
    let flag = healthy.clone();
    let checked = origin(move |request, _| {
        let status = match request.uri().path() {
            "/healthz" if !flag.load(Ordering::SeqCst) => StatusCode::SERVICE_UNAVAILABLE,
            _ => StatusCode::OK,
        };
        async move {
            let mut response = Response::new(Full::new(Bytes::from("page")));
            *response.status_mut() = status;
            response
        }
    })
    .await;
    let accel = Accelerator::start(AcceleratorConfig {
        sites: vec![SiteConfig {
            names: SiteNames::Listed(patterns(&["*.site.test", "site.test"])),
            origin: SiteOrigin::Server {
                url: format!("http://{}", checked.addr).parse().unwrap(),
                ca_file: None,
                health_path: Some("/healthz".parse().unwrap()),
            },
        }],
        health: policy(2, Duration::from_secs(600)),
        health_interval: Duration::from_millis(100),
        ..accelerator_config(checked.addr)
    })
    .await;
    // Checks name the site, as a virtual host expects.
    checked.wait_for_requests(1).await;
    let check = &checked.seen_for("/healthz")[0];
    assert_eq!(check.header("host"), Some("site.test"));
    assert_eq!(check.header("user-agent"), Some("rproxy-health-check"));

    healthy.store(false, Ordering::SeqCst);
    eventually("the site marked down", || !accel.health_views()[0].is_up()).await;
    let answer = ask(accel.addr, "/page").await;
    assert_eq!(answer.status, 503, "{}", answer.body);
    assert!(
        answer.body.contains("503"),
        "the check's answer: {}",
        answer.body
    );
    assert_eq!(checked.requests_to("/page"), 0);

    healthy.store(true, Ordering::SeqCst);
    eventually("the site up again", || accel.health_views()[0].is_up()).await;
    let answer = ask(accel.addr, "/page").await;
    assert_eq!((answer.status, answer.body.as_str()), (200, "page"));
}

#[tokio::test]
async fn parent_mode_sites_have_no_health_and_reloads_keep_what_was_known() {
    let parent = Accelerator::start(with_sites(vec![parent_site(&["*"], vec![80], &[])])).await;
    assert!(parent.health_views().is_empty());

    let addr = closed_port().await;
    let config = AcceleratorConfig {
        health: policy(1, Duration::from_secs(600)),
        ..accelerator_config(addr)
    };
    let accel = Accelerator::start(config.clone()).await;
    assert_eq!(ask(accel.addr, "/").await.status, 502);
    let reloaded = accel.reconfigured(config).unwrap();
    let views = reloaded.health_views();
    assert!(
        matches!(views[0].state, HealthState::Down { .. }),
        "{views:?}"
    );
    assert_eq!(views[0].times_down, 1);
}

/// A page that changes with every request and is revalidated each time.
async fn versioned() -> Origin {
    origin(|_, earlier| async move {
        let text = format!("version {earlier}\n").repeat(2000);
        let mut response = Response::new(Full::new(Bytes::from(text)));
        let headers = response.headers_mut();
        headers.insert("cache-control", HeaderValue::from_static("max-age=0"));
        headers.insert(
            "etag",
            HeaderValue::from_str(&format!("\"v{earlier}\"")).unwrap(),
        );
        response
    })
    .await
}

fn version(n: usize) -> Vec<u8> {
    format!("version {n}\n").repeat(2000).into_bytes()
}

/// Every host to the upstream at `primary`, else to `fallback`.
fn failing_over(primary: SocketAddr, fallback: Vec<RouteTo>) -> RouteConfig {
    RouteConfig {
        hosts: RouteHosts::Listed(patterns(&["*"])),
        to: RouteTo::Upstream(format!("http://{primary}").parse().unwrap()),
        fallback,
    }
}

fn upstream(addr: SocketAddr) -> RouteTo {
    RouteTo::Upstream(format!("http://{addr}").parse().unwrap())
}

async fn client(route: RouteConfig, health: HealthPolicy) -> ClientProxy {
    ClientProxy::start(ClientConfig {
        routes: vec![route],
        health,
        ..client_config("http://127.0.0.1:1")
    })
    .await
}

/// `POST url` through the proxy at `proxy`.
async fn post(proxy: SocketAddr, url: &str) -> Answer {
    let host = url.trim_start_matches("http://").split('/').next().unwrap();
    exchange(
        proxy,
        &format!(
            "POST {url} HTTP/1.1\r\nHost: {host}\r\nContent-Length: 4\r\nConnection: close\r\n\r\nform"
        ),
    )
    .await
}

#[tokio::test]
async fn a_get_goes_to_the_fallback_when_the_upstream_cannot_be_reached_but_a_post_does_not() {
    let site = saying("from the site").await;
    let accel = Accelerator::start(accelerator_config(site.addr)).await;
    let dead = closed_port().await;
    // Never marked down: every request tries the first upstream.
    let proxy = client(
        failing_over(dead, vec![upstream(accel.addr)]),
        policy(0, Duration::from_secs(10)),
    )
    .await;
    let url = site.url("/page");

    get(proxy.addr, &url)
        .await
        .assert_body("/page", b"from the site");
    let via: Vec<_> = site.seen()[0]
        .headers
        .get_all("via")
        .iter()
        .cloned()
        .collect();
    assert!(
        via.iter()
            .any(|hop| hop.to_str().unwrap().contains("accel-test")),
        "through the fallback: {via:?}"
    );
    let answer = post(proxy.addr, &url).await;
    assert_eq!(answer.status, 502, "{}", answer.body);
    assert!(answer.body.contains(&dead.to_string()), "{}", answer.body);
    assert_eq!(
        accel.stats().await["requests"],
        1,
        "the POST was not repeated"
    );
    assert_eq!(site.requests(), 1);
}

#[tokio::test]
async fn while_the_upstream_is_marked_down_even_a_post_goes_to_the_fallback() {
    let site = saying("from the site").await;
    let accel = Accelerator::start(accelerator_config(site.addr)).await;
    let dead = closed_port().await;
    let proxy = client(
        failing_over(dead, vec![upstream(accel.addr)]),
        policy(1, Duration::from_secs(600)),
    )
    .await;
    let url = site.url("/form");

    get(proxy.addr, &url)
        .await
        .assert_body("/form", b"from the site");
    let views = proxy.health_views();
    assert_eq!(views.len(), 2, "{views:?}");
    assert_eq!(views[0].name, format!("http://{dead}"));
    assert!(matches!(views[0].state, HealthState::Down { .. }));
    assert!(views[1].is_up());

    let answer = post(proxy.addr, &url).await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    assert_eq!(site.seen()[1].method, http::Method::POST);
}

#[tokio::test]
async fn a_direct_fallback_gets_no_credentials_no_queue_node_and_no_unasked_signature() {
    let plain = versioned().await;
    let dead = closed_port().await;
    let mut config = ClientConfig {
        routes: vec![failing_over(
            dead,
            vec![RouteTo::Direct(allowing(&["127.0.0.0/8"]))],
        )],
        // Never marked down: each GET is offered to the upstream first,
        // the second with a basis signature.
        health: policy(0, Duration::from_secs(10)),
        upstream_credentials: Some(HeaderValue::from_static("Basic dXNlcjpwYXNz")),
        ..client_config("http://127.0.0.1:1")
    };
    config.queue.node = Some("192.0.2.1:9".parse().unwrap());
    let proxy = ClientProxy::start(config).await;
    let url = plain.url("/page");

    get(proxy.addr, &url)
        .await
        .assert_body("/page", &version(0));
    get(proxy.addr, &url)
        .await
        .assert_body("/page", &version(1));
    let seen = plain.seen();
    assert_eq!(seen.len(), 2);
    // The second one revalidated the stored entry, by the direct way.
    assert_eq!(seen[1].header("if-none-match"), Some("\"v0\""));
    for request in &seen {
        assert_eq!(request.header("proxy-authorization"), None);
        assert_eq!(request.header("x-node"), None);
        assert_eq!(request.header("hsync-signature"), None);
    }
    // A direct way has no health of its own.
    assert_eq!(proxy.health_views().len(), 1);
}
