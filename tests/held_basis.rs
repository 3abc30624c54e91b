//! Hash-only requests (issue 20): an accelerator that keeps a body it
//! served says so (`Hsync-Held`); the client proxy then names that body as
//! its basis by digest alone, without the signature that was most of a
//! small update's bytes. Should the accelerator have let the body go, the
//! answer comes coded without a basis: more bytes, still the right ones.
//! The accelerator says so (`Hsync-Missed`), and the client proxy then
//! sends signatures there for a while, as it must behind a balancer whose
//! accelerators keep bodies apart.
//! A body of unknown length is believed held only if no longer than the
//! longest the accelerator keeps, which it announces. Against a held body
//! the answer comes without SIG frames, which the client agreed to; the
//! client then verifies the body whole before its head goes, and tells its
//! user agent the length (a chain's middle proxy too, so its own answer
//! goes without SIG frames as well).

mod support;

use std::net::SocketAddr;

use bytes::Bytes;
use http::{HeaderValue, Response};
use http_body_util::BodyExt;
use support::proxy::{client_config, eventually};
use support::topology::{
    Accelerator, Chain, ClientProxy, Origin, accelerator_config, origin, releases_of,
};
use support::user_agent::{get, start_get};

/// Release `n` of a 100 KB text: one line changed per release.
fn release(n: usize) -> Vec<u8> {
    let mut body = support::pseudo_text(5, 100_000);
    let at = 50_000 + n * 97;
    body[at..at + 8].copy_from_slice(format!("rel{n:05}").as_bytes());
    body
}

/// Release `n` of another text (as [`release`], its start changed).
fn b_release(n: usize) -> Vec<u8> {
    let mut body = release(n);
    body[..8].copy_from_slice(b"b-text: ");
    body
}

/// Each path answers its next release on each request, revalidated every
/// time (so every request after the first is an update).
async fn releases() -> Origin {
    releases_of(release).await
}

async fn client_of(accelerator: SocketAddr) -> ClientProxy {
    ClientProxy::start(client_config(&format!("http://{accelerator}"))).await
}

#[tokio::test]
async fn a_basis_the_accelerator_holds_goes_by_its_digest_alone() {
    let origin = releases().await;
    let accelerator = Accelerator::start(accelerator_config(origin.addr)).await;
    let proxy = client_of(accelerator.addr).await;
    let url = origin.url("/lib.js");

    get(proxy.addr, &url)
        .await
        .assert_body("/lib.js", &release(0));
    eventually("release 0 stored", || proxy.stats().stored == 1).await;
    for n in 1..=2 {
        let before = proxy.stats();
        get(proxy.addr, &url)
            .await
            .assert_body("/lib.js", &release(n));
        eventually("the release stored", || {
            proxy.stats().stored == n as u64 + 1
        })
        .await;
        let after = proxy.stats();
        assert_eq!(
            after.signature_bytes, before.signature_bytes,
            "release {n}: no signature went up"
        );
        assert_eq!(after.deltas, before.deltas + 1, "release {n}: a delta");
        let link = after.upstream_bytes - before.upstream_bytes;
        // The SIG frames of 100 KB alone are 1,188 B: the client agreed
        // to do without (`Hsync-Accept: no-sig=N`).
        assert!(link < 800, "release {n}: an 8-byte change took {link} B");
    }
}

/// Through a chain: the middle proxy's update comes without SIG frames, so
/// it is verified whole before its head goes, with a Content-Length; the
/// middle then codes its answer to the nearest proxy without SIG frames
/// too (which needs the length), and the nearest tells its user agent the
/// length as well.
#[tokio::test]
async fn an_update_verified_whole_before_its_head_goes_out_with_its_length() {
    let origin = releases().await;
    let chain = Chain::start(origin.addr, 2).await;
    let (middle, nearest) = (&chain.clients[0], chain.nearest());
    let url = origin.url("/lib.js");

    get(nearest.addr, &url)
        .await
        .assert_body("/lib.js", &release(0));
    eventually("release 0 stored at both proxies", || {
        middle.stats().stored == 1 && nearest.stats().stored == 1
    })
    .await;
    let before = nearest.stats();
    let response = start_get(nearest.addr, &url).await;
    let length = response.headers().get("content-length").cloned();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    assert!(body == release(1), "release 1, whole");
    assert_eq!(
        length,
        Some(HeaderValue::from(release(1).len())),
        "the user agent is told the length"
    );
    let after = nearest.stats();
    assert_eq!(after.deltas, before.deltas + 1, "a delta to the nearest");
    assert_eq!(after.signature_bytes, before.signature_bytes);
    let link = after.upstream_bytes - before.upstream_bytes;
    // With SIG frames (1,188 B for 100 KB) the link took about 2,000 B.
    assert!(
        link < 800,
        "an 8-byte change took {link} B between the proxies"
    );
}

#[tokio::test]
async fn a_body_the_accelerator_let_go_comes_without_a_basis_and_right() {
    // Releases of two texts, one per path: b's push a's out of the store.
    let origin = origin(|request, earlier| async move {
        let body = if request.uri().path() == "/b.js" {
            b_release(earlier)
        } else {
            release(earlier)
        };
        let mut response = Response::new(http_body_util::Full::new(Bytes::from(body)));
        response
            .headers_mut()
            .insert("cache-control", HeaderValue::from_static("no-cache"));
        response
    })
    .await;
    // Room for one kept body of 100 KB: the next one pushes it out.
    let accelerator = Accelerator::start(rproxy::accelerator::AcceleratorConfig {
        basis_store_bytes: 150_000,
        ..accelerator_config(origin.addr)
    })
    .await;
    let proxy = client_of(accelerator.addr).await;
    let (a, b) = (origin.url("/a.js"), origin.url("/b.js"));
    get(proxy.addr, &a).await.assert_body("/a.js", &release(0));
    get(proxy.addr, &b)
        .await
        .assert_body("/b.js", &b_release(0));
    eventually("both stored", || proxy.stats().stored == 2).await;

    let before = proxy.stats();
    get(proxy.addr, &a).await.assert_body("/a.js", &release(1));
    eventually("the update stored", || proxy.stats().stored == 3).await;
    let after = proxy.stats();
    assert_eq!(
        after.signature_bytes, before.signature_bytes,
        "the client believed the body held"
    );
    assert_eq!(after.digest_failures, 0);
    let link = after.upstream_bytes - before.upstream_bytes;
    assert!(
        link > 10_000,
        "coded without a basis, the whole text's worth: {link} B"
    );

    // Told so twice (`Hsync-Missed`: a's release 1 went out for b's
    // next), the client proxy sends signatures there for a while,
    // although the accelerator says each time that it keeps the new
    // release: the next update is a delta either way.
    get(proxy.addr, &b)
        .await
        .assert_body("/b.js", &b_release(1));
    eventually("the update stored", || proxy.stats().stored == 4).await;
    let before = proxy.stats();
    get(proxy.addr, &a).await.assert_body("/a.js", &release(2));
    eventually("the update stored", || proxy.stats().stored == 5).await;
    let after = proxy.stats();
    assert!(
        after.signature_bytes > before.signature_bytes,
        "a signature went up"
    );
    assert_eq!(after.deltas, before.deltas + 1);
    let link = after.upstream_bytes - before.upstream_bytes;
    assert!(link < 5_000, "a delta against the signature: {link} B");
}

/// An accelerator that does not know a body's length when its head goes
/// announces the longest body it keeps; a longer one is not believed held.
#[tokio::test]
async fn a_body_longer_than_the_accelerator_keeps_is_not_believed_held() {
    // Chunked, without a length: two frames of each release.
    let origin = origin(|_, earlier| async move {
        let body = release(earlier);
        let (first, second) = body.split_at(body.len() / 2);
        let frames: Vec<Result<hyper::body::Frame<Bytes>, std::io::Error>> = vec![
            Ok(hyper::body::Frame::data(Bytes::copy_from_slice(first))),
            Ok(hyper::body::Frame::data(Bytes::copy_from_slice(second))),
        ];
        let mut response = Response::new(http_body_util::StreamBody::new(as_stream(frames)));
        response
            .headers_mut()
            .insert("cache-control", HeaderValue::from_static("no-cache"));
        response
    })
    .await;
    let accelerator = Accelerator::start(rproxy::accelerator::AcceleratorConfig {
        max_stored_body: 50_000,
        ..accelerator_config(origin.addr)
    })
    .await;
    let proxy = client_of(accelerator.addr).await;
    let url = origin.url("/big.js");
    get(proxy.addr, &url)
        .await
        .assert_body("/big.js", &release(0));
    eventually("release 0 stored", || proxy.stats().stored == 1).await;
    let before = proxy.stats();
    get(proxy.addr, &url)
        .await
        .assert_body("/big.js", &release(1));
    eventually("release 1 stored", || proxy.stats().stored == 2).await;
    assert!(
        proxy.stats().signature_bytes > before.signature_bytes,
        "100 KB is over the 50 KB the accelerator keeps: the signature went up"
    );
}

/// The frames as a stream, for a body without a length.
fn as_stream(
    frames: Vec<Result<hyper::body::Frame<Bytes>, std::io::Error>>,
) -> impl futures_core::Stream<Item = Result<hyper::body::Frame<Bytes>, std::io::Error>> {
    struct Frames(std::vec::IntoIter<Result<hyper::body::Frame<Bytes>, std::io::Error>>);
    impl futures_core::Stream for Frames {
        type Item = Result<hyper::body::Frame<Bytes>, std::io::Error>;
        fn poll_next(
            mut self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<Option<Self::Item>> {
            std::task::Poll::Ready(self.0.next())
        }
    }
    Frames(frames.into_iter())
}
