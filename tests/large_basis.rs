//! Signatures beyond the header budget (issue 20): a basis too large for
//! 4.6 KB of header to describe at blocks that find small edits goes up as
//! the request's body (`Hsync-Signature-Length`), at 1.5 KiB blocks, to an
//! accelerator that advertises `max-body-signature`; one that does not
//! gets the header's coarse signature, as before.

mod support;

use bytes::Bytes;
use http::{HeaderValue, Response};
use http_body_util::Full;
use rproxy::accelerator::AcceleratorConfig;
use support::proxy::{client_config, eventually};
use support::topology::{Accelerator, ClientProxy, Origin, accelerator_config, origin};
use support::user_agent::get;

const LEN: usize = 8_000_000;
const EDITS: usize = 50;

/// Release `n` of an 8 MB text: 50 scattered 8-byte edits per release.
fn release(n: usize) -> Vec<u8> {
    let mut body = support::pseudo_text(9, LEN);
    if n > 0 {
        for edit in 0..EDITS {
            let at = (edit * 2_654_435_761 + n * 7919) % (LEN - 8);
            body[at..at + 8].copy_from_slice(format!("r{n:02}e{edit:04}").as_bytes());
        }
    }
    body
}

/// Each request gets the next release, revalidated every time.
async fn releases() -> Origin {
    origin(|_, earlier| async move {
        let mut response = Response::new(Full::new(Bytes::from(release(earlier))));
        response
            .headers_mut()
            .insert("cache-control", HeaderValue::from_static("no-cache"));
        response
    })
    .await
}

/// The bytes that came down and the signature bytes that went up for the update from
/// release 0 to release 1, through an accelerator that keeps no body (so
/// the basis goes by signature) with `max_body_signature_bytes`.
async fn update_cost(max_body_signature_bytes: usize) -> (u64, u64) {
    let origin = releases().await;
    let accelerator = Accelerator::start(AcceleratorConfig {
        basis_store_bytes: 0,
        max_body_signature_bytes,
        ..accelerator_config(origin.addr)
    })
    .await;
    let proxy = ClientProxy::start(client_config(&format!("http://{}", accelerator.addr))).await;
    let url = origin.url("/big.txt");
    get(proxy.addr, &url)
        .await
        .assert_body("/big.txt", &release(0));
    eventually("release 0 stored", || proxy.stats().stored == 1).await;
    let before = proxy.stats();
    get(proxy.addr, &url)
        .await
        .assert_body("/big.txt", &release(1));
    eventually("release 1 stored", || proxy.stats().stored == 2).await;
    let after = proxy.stats();
    assert_eq!(
        after.deltas,
        before.deltas + 1,
        "the update came as a delta"
    );
    assert_eq!(after.digest_failures, 0);
    (
        after.upstream_bytes - before.upstream_bytes,
        after.signature_bytes - before.signature_bytes,
    )
}

#[tokio::test]
async fn a_large_basis_sends_a_fine_signature_as_the_request_body() {
    let (fine_link, fine_signature) = update_cost(8 << 20).await;
    // 8 MB at 1.5 KiB blocks: 5,209 entries of 12 bytes.
    assert!(
        (60_000..70_000).contains(&fine_signature),
        "signature in the body: {fine_signature} B"
    );
    let (coarse_link, coarse_signature) = update_cost(0).await;
    assert!(
        coarse_signature <= 4608,
        "without max-body-signature the header's: {coarse_signature} B"
    );
    // Both ways: 50 edits each cost a 1.5 KiB block against a 21 KB one
    // (seen: 27,077 + 62,520 B against 282,074 + 4,608 B).
    let (fine, coarse) = (fine_link + fine_signature, coarse_link + coarse_signature);
    assert!(
        fine * 2 < coarse,
        "fine blocks: {fine} B on the link, the header's: {coarse} B"
    );
}

/// What the accelerator answers a raw request `head` + `body` with: its
/// status line.
async fn status_of(addr: std::net::SocketAddr, head: &str, body: &[u8]) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream.write_all(head.as_bytes()).await.unwrap();
    stream.write_all(body).await.unwrap();
    let mut answer = Vec::new();
    let read = tokio::time::timeout(
        std::time::Duration::from_secs(10),
        stream.read_to_end(&mut answer),
    );
    // The accelerator closes after a refusal it did not read the body of.
    let _ = read.await;
    let text = String::from_utf8_lossy(&answer);
    text.lines().next().unwrap_or_default().to_owned()
}

/// A signature body over the limit, or other than announced, is the
/// client's error, answered without reading it all.
#[tokio::test]
async fn a_signature_body_over_the_limit_or_misannounced_is_refused() {
    let origin = releases().await;
    let accelerator = Accelerator::start(AcceleratorConfig {
        max_body_signature_bytes: 1000,
        ..accelerator_config(origin.addr)
    })
    .await;
    let head = |length: usize, content_length: usize| {
        format!(
            "GET /big.txt HTTP/1.1\r\nHost: {}\r\nAccept-Encoding: hsync\r\n\
             Connection: close\r\nHsync-Signature-Length: {length}\r\n\
             Content-Length: {content_length}\r\n\r\n",
            origin.addr
        )
    };
    let over = status_of(accelerator.addr, &head(2000, 2000), &[0; 2000]).await;
    assert!(over.contains(" 400 "), "{over}");
    let short = status_of(accelerator.addr, &head(500, 400), &[0; 400]).await;
    assert!(short.contains(" 400 "), "{short}");
    // One within the limit is read, whatever it holds (an unusable
    // signature codes from scratch): the answer is the body.
    let fine = status_of(accelerator.addr, &head(500, 500), &[0; 500]).await;
    assert!(fine.contains(" 200 "), "{fine}");
}
