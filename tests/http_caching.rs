//! HTTP caching through the pair (client proxy → accelerator → origin),
//! one test per rule, named by its RFC section (issue 21).

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode};
use http_body_util::Full;
use support::proxy::{client_config, eventually};
use support::topology::{Accelerator, ClientProxy, Origin, accelerator_config, origin};
use support::user_agent::get;

/// An origin that answers every path with `status` and these headers,
/// counting the requests it gets.
async fn answering(
    status: StatusCode,
    headers: &'static [(&'static str, &'static str)],
) -> (Origin, Arc<AtomicUsize>) {
    let asked = Arc::new(AtomicUsize::new(0));
    let counted = asked.clone();
    let origin = origin(move |request, _| {
        counted.fetch_add(1, Ordering::SeqCst);
        async move {
            let body = format!("{status} for {}\n", request.uri().path());
            let mut response = Response::new(Full::new(Bytes::from(body)));
            *response.status_mut() = status;
            for (name, value) in headers {
                response
                    .headers_mut()
                    .insert(*name, HeaderValue::from_static(value));
            }
            response
        }
    })
    .await;
    (origin, asked)
}

/// The pair in front of `origin`.
async fn pair(origin: &Origin) -> (Accelerator, ClientProxy) {
    let accelerator = Accelerator::start(accelerator_config(origin.addr)).await;
    let proxy = ClientProxy::start(client_config(&format!("http://{}", accelerator.addr))).await;
    (accelerator, proxy)
}

/// Two GETs of one URL: whether the second was a hit, and how many
/// requests reached the origin.
async fn twice(
    status: StatusCode,
    headers: &'static [(&'static str, &'static str)],
) -> (bool, usize) {
    let (origin, asked) = answering(status, headers).await;
    let (_accelerator, proxy) = pair(&origin).await;
    let url = origin.url("/page");
    let first = get(proxy.addr, &url).await;
    assert_eq!(first.status, status);
    // The first answer is stored (or not) once its body is in.
    let stored = eventually_stored(&proxy).await;
    let second = get(proxy.addr, &url).await;
    assert_eq!(second.status, status);
    assert_eq!(second.body, first.body);
    assert_eq!(second.is_hit(), stored, "{}", second.cache_status);
    (second.is_hit(), asked.load(Ordering::SeqCst))
}

/// Whether the proxy stored an entry within a second.
async fn eventually_stored(proxy: &ClientProxy) -> bool {
    for _ in 0..20 {
        if proxy.stats().stored > 0 {
            return true;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    false
}

#[tokio::test]
async fn rfc9111_3_a_404_with_explicit_freshness_is_stored_and_served_fresh() {
    let (hit, asked) = twice(StatusCode::NOT_FOUND, &[("cache-control", "max-age=60")]).await;
    assert!(hit);
    assert_eq!(asked, 1);
}

#[tokio::test]
async fn rfc9111_3_a_301_is_stored_with_its_location() {
    let (origin, asked) = answering(
        StatusCode::MOVED_PERMANENTLY,
        &[("cache-control", "max-age=60"), ("location", "/elsewhere")],
    )
    .await;
    let (_accelerator, proxy) = pair(&origin).await;
    let url = origin.url("/moved");
    get(proxy.addr, &url).await;
    eventually("the 301 stored", || proxy.stats().stored == 1).await;
    let response = support::user_agent::start_get(proxy.addr, &url).await;
    assert_eq!(response.status(), StatusCode::MOVED_PERMANENTLY);
    assert_eq!(response.headers()["location"], "/elsewhere");
    assert_eq!(asked.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn rfc9111_3_a_204_is_stored() {
    let (hit, asked) = twice(StatusCode::NO_CONTENT, &[("cache-control", "max-age=60")]).await;
    assert!(hit);
    assert_eq!(asked, 1);
}

/// P-20 (CPDoS): an error a header can provoke is never stored, whatever
/// freshness it claims; one that depends on the URL alone needs explicit
/// freshness.
#[tokio::test]
async fn rfc9111_3_p20_a_400_is_never_stored_and_a_404_not_heuristically() {
    let (hit, asked) = twice(
        StatusCode::BAD_REQUEST,
        &[("cache-control", "public, max-age=600")],
    )
    .await;
    assert!(!hit);
    assert_eq!(asked, 2);
    let (hit, asked) = twice(
        StatusCode::NOT_FOUND,
        &[("last-modified", "Mon, 01 Jan 2024 00:00:00 GMT")],
    )
    .await;
    assert!(!hit);
    assert_eq!(asked, 2);
}

/// An error page stored for one URL is no basis for another: the next
/// request goes without `Hsync-Basis` (nothing else of the origin is
/// stored).
#[tokio::test]
async fn rfc9111_3_a_stored_error_page_is_never_a_basis() {
    let origin = origin(|request, _| async move {
        let mut response = Response::new(Full::new(Bytes::from(support::pseudo_text(3, 5000))));
        if request.uri().path() == "/gone.js" {
            *response.status_mut() = StatusCode::GONE;
        }
        response
            .headers_mut()
            .insert("cache-control", HeaderValue::from_static("max-age=60"));
        response
    })
    .await;
    let (_accelerator, proxy) = pair(&origin).await;
    get(proxy.addr, &origin.url("/gone.js")).await;
    eventually("the 410 stored", || proxy.stats().stored == 1).await;
    let fetched = get(proxy.addr, &origin.url("/app.js")).await;
    fetched.assert_body("/app.js", &support::pseudo_text(3, 5000));
    let stats = proxy.stats();
    assert_eq!(stats.signature_bytes, 0, "no basis offered");
    assert_eq!(stats.memory_bases, 0);
}
