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

/// `GET url` through the proxy with `headers`: status, headers, body.
/// `url` is absolute (a forward proxy's request) or a path (a gateway's,
/// with a `host` among `headers`).
async fn get_with(
    proxy: std::net::SocketAddr,
    url: &str,
    headers: &[(&str, &str)],
) -> (StatusCode, http::HeaderMap, Vec<u8>) {
    support::user_agent::request(proxy, "GET", url, headers).await
}

/// A stored 200 answers ranges (RFC 9110 §14): one range as 206 with its
/// Content-Range, several as multipart/byteranges, none satisfiable as
/// 416, and an If-Range that does not match as the whole 200. A body large
/// enough to stream (checked group by group) answers one range too.
#[tokio::test]
async fn rfc9110_14_a_hit_answers_ranges_from_the_stored_body() {
    let small = support::pseudo_text(4, 5000);
    let large = support::pseudo_text(5, 3 << 20);
    let origin = origin({
        let (small, large) = (small.clone(), large.clone());
        move |request, _| {
            let body = if request.uri().path() == "/large.txt" {
                large.clone()
            } else {
                small.clone()
            };
            async move {
                let mut response = Response::new(Full::new(Bytes::from(body)));
                let headers = response.headers_mut();
                headers.insert("cache-control", HeaderValue::from_static("max-age=60"));
                headers.insert("etag", HeaderValue::from_static("\"r1\""));
                headers.insert("content-type", HeaderValue::from_static("text/plain"));
                response
            }
        }
    })
    .await;
    let (_accelerator, proxy) = pair(&origin).await;
    let url = origin.url("/small.txt");
    get(proxy.addr, &url)
        .await
        .assert_body("/small.txt", &small);
    eventually("stored", || proxy.stats().stored == 1).await;

    let (status, headers, body) = get_with(proxy.addr, &url, &[("range", "bytes=100-199")]).await;
    assert_eq!(status, StatusCode::PARTIAL_CONTENT);
    assert_eq!(headers["content-range"], "bytes 100-199/5000");
    assert_eq!(body, small[100..200]);
    assert!(headers["cache-status"].to_str().unwrap().contains("hit"));

    let (status, headers, body) = get_with(proxy.addr, &url, &[("range", "bytes=0-0,-1")]).await;
    assert_eq!(status, StatusCode::PARTIAL_CONTENT);
    let content_type = headers["content-type"].to_str().unwrap();
    let boundary = content_type
        .strip_prefix("multipart/byteranges; boundary=")
        .unwrap();
    let text = String::from_utf8_lossy(&body);
    assert_eq!(text.matches(&format!("--{boundary}")).count(), 3, "{text}");
    assert!(text.contains("Content-Range: bytes 0-0/5000"), "{text}");
    assert!(
        text.contains("Content-Range: bytes 4999-4999/5000"),
        "{text}"
    );

    let (status, headers, _) = get_with(proxy.addr, &url, &[("range", "bytes=9000-")]).await;
    assert_eq!(status, StatusCode::RANGE_NOT_SATISFIABLE);
    assert_eq!(headers["content-range"], "bytes */5000");

    let (status, _, body) = get_with(
        proxy.addr,
        &url,
        &[("range", "bytes=0-9"), ("if-range", "\"r0\"")],
    )
    .await;
    assert_eq!((status, body.len()), (StatusCode::OK, 5000));
    let (status, _, body) = get_with(
        proxy.addr,
        &url,
        &[("range", "bytes=0-9"), ("if-range", "\"r1\"")],
    )
    .await;
    assert_eq!(
        (status, body),
        (StatusCode::PARTIAL_CONTENT, small[..10].to_vec())
    );

    let url = origin.url("/large.txt");
    get(proxy.addr, &url)
        .await
        .assert_body("/large.txt", &large);
    eventually("stored", || proxy.stats().stored == 2).await;
    let at = (2 << 20) + 12_345;
    let (status, headers, body) = get_with(
        proxy.addr,
        &url,
        &[("range", &format!("bytes={at}-{}", at + 99_999))],
    )
    .await;
    assert_eq!(status, StatusCode::PARTIAL_CONTENT);
    assert_eq!(headers["content-length"], "100000");
    assert!(body == large[at..at + 100_000]);
}

/// RFC 5861 §3: a stale entry within `stale-while-revalidate` is served at
/// once, and revalidated in the background; the next request gets what
/// that brought.
#[tokio::test]
async fn rfc5861_3_stale_while_revalidate_serves_stale_and_refreshes_behind() {
    let origin = origin(|_, earlier| async move {
        let mut response = Response::new(Full::new(Bytes::from(format!("release {earlier}\n"))));
        response.headers_mut().insert(
            "cache-control",
            HeaderValue::from_static("max-age=1, stale-while-revalidate=60"),
        );
        response
    })
    .await;
    let (_accelerator, proxy) = pair(&origin).await;
    let url = origin.url("/swr.txt");
    get(proxy.addr, &url)
        .await
        .assert_body("/swr.txt", b"release 0\n");
    eventually("stored", || proxy.stats().stored == 1).await;
    tokio::time::sleep(std::time::Duration::from_millis(2100)).await;

    let stale = get(proxy.addr, &url).await;
    stale.assert_body("/swr.txt", b"release 0\n");
    assert!(
        stale.cache_status.contains("hit") && stale.cache_status.contains("stale-while-revalidate"),
        "{}",
        stale.cache_status
    );
    eventually("revalidated behind", || proxy.stats().stored == 2).await;
    let fresh = get(proxy.addr, &url).await;
    fresh.assert_body("/swr.txt", b"release 1\n");
    assert!(fresh.is_hit(), "{}", fresh.cache_status);
}

/// RFC 9213: at a gateway (origin-form requests: the proxy is the site's
/// CDN) `CDN-Cache-Control` replaces `Cache-Control` in the caching
/// decisions; as a forward proxy the field is ignored. The user agent gets
/// the headers as the origin sent them.
#[tokio::test]
async fn rfc9213_cdn_cache_control_counts_at_a_gateway_only() {
    let (origin, asked) = answering(
        StatusCode::OK,
        &[
            ("cache-control", "no-store"),
            ("cdn-cache-control", "max-age=60"),
        ],
    )
    .await;
    let (accelerator, proxy) = pair(&origin).await;
    // As a gateway in front of the accelerator: origin-form, its Host.
    let host = accelerator.addr.to_string();
    for _ in 0..2 {
        let (status, headers, body) = get_with(proxy.addr, "/cdn.txt", &[("host", &host)]).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(headers["cache-control"], "no-store");
        assert!(!body.is_empty());
    }
    assert_eq!(
        asked.load(Ordering::SeqCst),
        1,
        "stored by CDN-Cache-Control"
    );
    // As a forward proxy: no-store rules.
    for _ in 0..2 {
        let fetched = get(proxy.addr, &origin.url("/fwd.txt")).await;
        assert!(!fetched.is_hit());
    }
    assert_eq!(asked.load(Ordering::SeqCst), 3);
}

/// The body the ranged origin serves (100,000 bytes).
fn ranged_body(release: usize) -> Vec<u8> {
    support::pseudo_text(10 + release as u64, 100_000)
}

/// An origin that answers `Range: bytes=a-b` and `bytes=a-` with 206
/// (honouring `If-Range` unless `ignores_if_range`), `Accept-Ranges:
/// bytes`, a strong ETag per release, and `max-age=60`. `release_of(n)`
/// says which release the request after `n` earlier ones gets; `extra`
/// headers go on every answer.
async fn ranged(
    release_of: fn(usize) -> usize,
    ignores_if_range: bool,
    extra: &'static [(&'static str, &'static str)],
) -> Origin {
    origin(move |request, earlier| {
        let release = release_of(earlier);
        let body = ranged_body(release);
        let etag = format!("\"p{release}\"");
        let range = request
            .headers()
            .get("range")
            .map(|v| v.to_str().unwrap().to_owned());
        let if_range_fails = request
            .headers()
            .get("if-range")
            .is_some_and(|v| v.to_str().unwrap() != etag)
            && !ignores_if_range;
        async move {
            let len = body.len();
            let wanted = range.filter(|_| !if_range_fails).map(|range| {
                let (first, last) = range
                    .strip_prefix("bytes=")
                    .unwrap()
                    .split_once('-')
                    .unwrap();
                let first: usize = first.parse().unwrap();
                let last = if last.is_empty() {
                    len - 1
                } else {
                    last.parse::<usize>().unwrap().min(len - 1)
                };
                (first, last)
            });
            let mut response = match wanted {
                Some((first, last)) => {
                    let mut response =
                        Response::new(Full::new(Bytes::from(body[first..=last].to_vec())));
                    *response.status_mut() = StatusCode::PARTIAL_CONTENT;
                    response.headers_mut().insert(
                        "content-range",
                        HeaderValue::from_str(&format!("bytes {first}-{last}/{len}")).unwrap(),
                    );
                    response
                }
                None => Response::new(Full::new(Bytes::from(body))),
            };
            let headers = response.headers_mut();
            headers.insert("etag", HeaderValue::from_str(&etag).unwrap());
            headers.insert("accept-ranges", HeaderValue::from_static("bytes"));
            headers.insert("cache-control", HeaderValue::from_static("max-age=60"));
            for (name, value) in extra {
                headers.insert(*name, HeaderValue::from_static(value));
            }
            response
        }
    })
    .await
}

/// What the client proxy keeps for `url`, if anything.
fn kept(proxy: &ClientProxy, url: &str) -> Option<rproxy::cache::IndexEntry> {
    proxy
        .store()
        .lookup(&rproxy::cache::CacheKey::parse(url).unwrap())
}

/// RFC 9111 §3.3: a 206 from the first byte with a strong ETag is kept as
/// a partial entry (the accelerator passes a Range request through
/// uncoded), and a Range request within it is answered from it while it
/// is fresh (§3.4), with the whole length in `Content-Range`. A range
/// past it goes upstream, and a 206 that does not start at the first byte
/// is not kept.
#[tokio::test]
async fn rfc9111_3_3_a_206_from_the_first_byte_is_kept_and_answers_ranges_within_it() {
    let origin = ranged(|_| 1, false, &[]).await;
    let (_accelerator, proxy) = pair(&origin).await;
    let url = origin.url("/video.bin");
    let body = ranged_body(1);
    let (status, headers, got) = get_with(proxy.addr, &url, &[("range", "bytes=0-49999")]).await;
    assert_eq!(status, StatusCode::PARTIAL_CONTENT);
    assert_eq!(headers["content-range"], "bytes 0-49999/100000");
    assert!(got == body[..50_000]);
    eventually("the prefix kept", || {
        kept(&proxy, &url).is_some_and(|e| e.body_len == 50_000)
    })
    .await;
    let entry = kept(&proxy, &url).unwrap();
    assert_eq!(entry.completeness, rproxy::cache::Completeness::Partial);
    assert_eq!(entry.body_blake3, blake3::hash(&body[..50_000]));

    let (status, headers, got) = get_with(proxy.addr, &url, &[("range", "bytes=100-199")]).await;
    assert_eq!(status, StatusCode::PARTIAL_CONTENT);
    assert_eq!(headers["content-range"], "bytes 100-199/100000");
    assert!(got == body[100..200]);
    assert!(
        headers["cache-status"].to_str().unwrap().contains("; hit"),
        "{headers:?}"
    );
    assert_eq!(origin.requests_to("/video.bin"), 1);

    let (status, headers, got) =
        get_with(proxy.addr, &url, &[("range", "bytes=60000-60099")]).await;
    assert_eq!(status, StatusCode::PARTIAL_CONTENT);
    assert_eq!(headers["content-range"], "bytes 60000-60099/100000");
    assert!(got == body[60_000..60_100]);
    assert_eq!(origin.requests_to("/video.bin"), 2, "past the prefix");
    let entry = kept(&proxy, &url).unwrap();
    assert_eq!(
        (entry.completeness, entry.body_len),
        (rproxy::cache::Completeness::Partial, 50_000),
        "a piece that does not start at the first byte is not kept"
    );
}

/// RFC 9111 §3.4: a GET of the whole body, with a prefix kept, asks only
/// for the rest (`Range: bytes=N-`, `If-Range` with the strong ETag); the
/// user agent gets one 200 of prefix and rest, and the entry becomes
/// whole, answering hits (ranges included) from then on.
#[tokio::test]
async fn rfc9111_3_4_a_kept_prefix_is_completed_by_range_and_then_serves_hits() {
    let origin = ranged(|_| 1, false, &[]).await;
    let (_accelerator, proxy) = pair(&origin).await;
    let url = origin.url("/video.bin");
    let body = ranged_body(1);
    get_with(proxy.addr, &url, &[("range", "bytes=0-29999")]).await;
    eventually("the prefix kept", || kept(&proxy, &url).is_some()).await;

    let (status, headers, got) = get_with(proxy.addr, &url, &[]).await;
    assert_eq!(status, StatusCode::OK);
    assert!(got == body, "{} bytes, not the origin's", got.len());
    assert!(headers.get("content-range").is_none());
    assert_eq!(headers["content-length"], "100000");
    assert!(
        headers["cache-status"]
            .to_str()
            .unwrap()
            .contains("fwd=partial"),
        "{headers:?}"
    );
    let seen = origin.seen_for("/video.bin");
    assert_eq!(seen.len(), 2);
    assert_eq!(seen[1].header("range"), Some("bytes=30000-"));
    assert_eq!(seen[1].header("if-range"), Some("\"p1\""));
    eventually("the entry whole", || {
        kept(&proxy, &url).is_some_and(|e| e.completeness == rproxy::cache::Completeness::Complete)
    })
    .await;
    assert_eq!(kept(&proxy, &url).unwrap().body_blake3, blake3::hash(&body));

    let fetched = get(proxy.addr, &url).await;
    fetched.assert_body("/video.bin", &body);
    assert!(fetched.is_hit(), "{}", fetched.cache_status);
    let (status, _, got) = get_with(proxy.addr, &url, &[("range", "bytes=70000-70099")]).await;
    assert_eq!(status, StatusCode::PARTIAL_CONTENT);
    assert!(got == body[70_000..70_100]);
    assert_eq!(origin.requests_to("/video.bin"), 2);
}

/// RFC 9111 §3.4 (and 9110 §13.1.5): pieces join only under one strong
/// validator. An origin that ignores `If-Range` and sends the rest of a
/// changed body (another ETag) does not get it joined to the kept prefix:
/// the prefix is discarded and the body fetched whole, so the user agent
/// never sees a mix of the two.
#[tokio::test]
async fn rfc9111_3_4_a_piece_of_another_representation_discards_the_prefix() {
    let origin = ranged(|earlier| if earlier == 0 { 1 } else { 2 }, true, &[]).await;
    let (_accelerator, proxy) = pair(&origin).await;
    let url = origin.url("/video.bin");
    get_with(proxy.addr, &url, &[("range", "bytes=0-29999")]).await;
    eventually("the prefix kept", || kept(&proxy, &url).is_some()).await;

    let (status, headers, got) = get_with(proxy.addr, &url, &[]).await;
    assert_eq!(status, StatusCode::OK);
    assert!(got == ranged_body(2), "only the new release, whole");
    assert_eq!(headers["etag"], "\"p2\"");
    let seen = origin.seen_for("/video.bin");
    assert_eq!(seen.len(), 3, "the rest, refused, then the whole");
    assert_eq!(seen[1].header("range"), Some("bytes=30000-"));
    assert_eq!(seen[2].header("range"), None);
    eventually("the new release kept whole", || {
        kept(&proxy, &url).is_some_and(|e| e.body_blake3 == blake3::hash(&ranged_body(2)))
    })
    .await;
}

/// A-6 holds for pieces: a 206 is kept only under the rules a 200 is, so
/// one with `Set-Cookie` (and no `public`) is relayed and not kept.
#[tokio::test]
async fn rfc9111_3_3_a6_a_206_with_set_cookie_is_not_kept() {
    let origin = ranged(|_| 1, false, &[("set-cookie", "session=alice-secret")]).await;
    let (_accelerator, proxy) = pair(&origin).await;
    let url = origin.url("/video.bin");
    let (status, headers, got) = get_with(proxy.addr, &url, &[("range", "bytes=0-9999")]).await;
    assert_eq!(status, StatusCode::PARTIAL_CONTENT);
    assert!(got == ranged_body(1)[..10_000]);
    assert_eq!(headers["set-cookie"], "session=alice-secret");
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert!(kept(&proxy, &url).is_none());
    get_with(proxy.addr, &url, &[("range", "bytes=0-99")]).await;
    assert_eq!(origin.requests_to("/video.bin"), 2, "never a hit");
}

/// An origin that answers with `respond(request, earlier)`, counting.
async fn scripted(
    respond: fn(&http::Request<hyper::body::Incoming>, usize) -> Response<Full<Bytes>>,
) -> (Origin, Arc<AtomicUsize>) {
    let asked = Arc::new(AtomicUsize::new(0));
    let counted = asked.clone();
    let origin = origin(move |request, earlier| {
        counted.fetch_add(1, Ordering::SeqCst);
        let response = respond(&request, earlier);
        async move { response }
    })
    .await;
    (origin, asked)
}

fn answer(status: StatusCode, headers: &[(&str, &str)], body: &str) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body.to_owned())));
    *response.status_mut() = status;
    for (name, value) in headers {
        response.headers_mut().append(
            http::HeaderName::from_bytes(name.as_bytes()).unwrap(),
            HeaderValue::from_str(value).unwrap(),
        );
    }
    response
}

/// `Age: 0, 0` (a list) leaves the age unknown: the stored response is
/// stale, and revalidated; `Age: 5` is an age.
#[tokio::test]
async fn rfc9111_5_1_an_age_that_is_not_one_number_makes_the_response_stale() {
    let (origin, asked) = answering(
        StatusCode::OK,
        &[("cache-control", "max-age=3600"), ("age", "0, 0")],
    )
    .await;
    let (_accelerator, proxy) = pair(&origin).await;
    let url = origin.url("/listed-age");
    get(proxy.addr, &url).await;
    eventually("stored", || proxy.stats().stored == 1).await;
    let second = get(proxy.addr, &url).await;
    assert!(
        second.cache_status.contains("fwd=stale"),
        "{}",
        second.cache_status
    );
    assert_eq!(asked.load(Ordering::SeqCst), 2);
    let (hit, asked) = twice(
        StatusCode::OK,
        &[("cache-control", "max-age=3600"), ("age", "5")],
    )
    .await;
    assert!(hit);
    assert_eq!(asked, 1);
}

/// A POST answered with `Location` and `Content-Location` invalidates the
/// URLs they name (same origin), not only its own.
#[tokio::test]
async fn rfc9111_4_4_an_unsafe_methods_location_and_content_location_are_invalidated() {
    let (origin, asked) = scripted(|request, _| {
        if request.method() == http::Method::POST {
            return answer(
                StatusCode::SEE_OTHER,
                &[("location", "/item"), ("content-location", "/list")],
                "",
            );
        }
        answer(
            StatusCode::OK,
            &[("cache-control", "max-age=600")],
            "page\n",
        )
    })
    .await;
    let (_accelerator, proxy) = pair(&origin).await;
    for path in ["/item", "/list", "/other"] {
        get(proxy.addr, &origin.url(path)).await;
    }
    eventually("three stored", || proxy.stats().stored == 3).await;
    for path in ["/item", "/list", "/other"] {
        assert!(get(proxy.addr, &origin.url(path)).await.is_hit(), "{path}");
    }
    let before = asked.load(Ordering::SeqCst);
    let (status, _, _) =
        support::user_agent::request(proxy.addr, "POST", &origin.url("/form"), &[]).await;
    assert_eq!(status, StatusCode::SEE_OTHER);
    assert!(!get(proxy.addr, &origin.url("/item")).await.is_hit());
    assert!(!get(proxy.addr, &origin.url("/list")).await.is_hit());
    assert!(get(proxy.addr, &origin.url("/other")).await.is_hit());
    assert_eq!(asked.load(Ordering::SeqCst), before + 3);
}

/// A 304 freshens the stored headers and changes `Content-Type`, but not
/// the `ETag` that names what is stored (nor its digests).
#[tokio::test]
async fn rfc9111_3_2_a_304_updates_content_type_and_keeps_the_stored_etag() {
    let (origin, _) = scripted(|request, earlier| {
        if earlier > 0 && request.headers().contains_key("if-none-match") {
            return answer(
                StatusCode::NOT_MODIFIED,
                &[
                    ("etag", "\"other\""),
                    ("content-type", "text/plain;charset=utf-8"),
                    ("cache-control", "max-age=0"),
                    ("x-fresh", "2"),
                ],
                "",
            );
        }
        answer(
            StatusCode::OK,
            &[
                ("etag", "\"stored\""),
                ("content-type", "text/plain"),
                ("cache-control", "max-age=0"),
                ("x-fresh", "1"),
            ],
            "the body\n",
        )
    })
    .await;
    let (_accelerator, proxy) = pair(&origin).await;
    let url = origin.url("/doc.txt");
    get(proxy.addr, &url).await;
    eventually("stored", || proxy.stats().stored == 1).await;
    let (status, headers, body) = get_with(proxy.addr, &url, &[]).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body, b"the body\n");
    assert_eq!(headers["x-fresh"], "2", "freshened by the 304");
    assert_eq!(headers["content-type"], "text/plain;charset=utf-8");
    assert_eq!(headers["etag"], "\"stored\"");
}

/// At a gateway, `Surrogate-Control` counts as `CDN-Cache-Control` does,
/// and our requests announce the token that targets us.
#[tokio::test]
async fn surrogate_control_counts_at_a_gateway_and_can_target_us() {
    let (origin, asked) = scripted(|request, _| {
        let announced = request
            .headers()
            .get("surrogate-capability")
            .is_some_and(|v| v.to_str().unwrap().starts_with("rproxy="));
        let surrogate = if announced {
            "max-age=60;rproxy, no-store"
        } else {
            "no-store"
        };
        answer(
            StatusCode::OK,
            &[
                ("cache-control", "no-store"),
                ("surrogate-control", surrogate),
            ],
            "page\n",
        )
    })
    .await;
    let (accelerator, proxy) = pair(&origin).await;
    let host = accelerator.addr.to_string();
    for _ in 0..2 {
        let (status, _, _) = get_with(proxy.addr, "/s.txt", &[("host", &host)]).await;
        assert_eq!(status, StatusCode::OK);
    }
    assert_eq!(
        asked.load(Ordering::SeqCst),
        1,
        "stored by the targeted max-age"
    );
}
