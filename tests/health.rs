//! Origin health (issue 19): an accelerator whose origin stopped answers
//! 503 at once after N failures, without a connection, lets one request
//! probe once the down time has passed and serves again when it
//! succeeds; an active `health-path` check marks a site down and up; a
//! 5xx answer marks nothing.

mod support;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::{Response, StatusCode};
use http_body_util::Full;
use rproxy::accelerator::{AcceleratorConfig, SiteConfig, SiteNames, SiteOrigin};
use rproxy::http::health::{HealthPolicy, HealthState};
use support::proxy::eventually;
use support::routing::{parent_site, patterns, with_sites};
use support::topology::{Accelerator, accelerator_config, origin, origin_on};
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
