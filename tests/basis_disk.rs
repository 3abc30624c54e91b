//! The basis store's disk tier through the real binary: a body over the
//! memory tier's limit (`--max-stored-body 1M`) is kept on disk
//! (`--basis-dir`), so the next release goes by the held body's digest
//! alone and crosses as a small delta; and it is still held after the
//! accelerator is killed and started again on the same directory.

mod support;

use std::net::{SocketAddr, TcpListener};

use bytes::Bytes;
use http::{HeaderValue, Response};
use http_body_util::Full;
use support::process::Running;
use support::proxy::{client_config, eventually};
use support::topology::{ClientProxy, origin};
use support::user_agent::get;

/// The body's length: five times the memory tier's limit.
const LEN: usize = 5 << 20;

/// Release `n` of a 5 MiB text: one line changed per release.
fn release(n: usize) -> Vec<u8> {
    let mut body = support::pseudo_text(7, LEN);
    let at = LEN / 2 + n * 97;
    body[at..at + 8].copy_from_slice(format!("rel{n:05}").as_bytes());
    body
}

/// An accelerator process in front of `origin`, listening on `listen`,
/// keeping large bodies in `dir`.
fn accelerator(origin: SocketAddr, listen: SocketAddr, dir: &std::path::Path) -> Running {
    Running::start(&[
        "accelerator",
        "--listen",
        &listen.to_string(),
        "--origin",
        &format!("http://{origin}"),
        "--max-stored-body",
        "1M",
        "--basis-dir",
        dir.to_str().unwrap(),
    ])
}

/// Fetches release `n` through `proxy` and returns the bytes that crossed
/// the link and the signature bytes sent up, once it is stored.
async fn update(proxy: &ClientProxy, url: &str, n: usize) -> (u64, u64) {
    let before = proxy.stats();
    get(proxy.addr, url)
        .await
        .assert_body("/big.txt", &release(n));
    eventually("the release stored", || {
        proxy.stats().stored == before.stored + 1
    })
    .await;
    let after = proxy.stats();
    assert_eq!(after.digest_failures, 0);
    (
        after.upstream_bytes - before.upstream_bytes,
        after.signature_bytes - before.signature_bytes,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_over_the_memory_limit_is_held_on_disk_across_a_restart() {
    let origin = origin(|_, earlier| async move {
        let mut response = Response::new(Full::new(Bytes::from(release(earlier))));
        response
            .headers_mut()
            .insert("cache-control", HeaderValue::from_static("no-cache"));
        response
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    // A port of our own, so that the restarted accelerator takes the
    // client proxy's upstream address again.
    let listen = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let mut first = accelerator(origin.addr, listen, dir.path());
    let proxy = ClientProxy::start(client_config(&format!("http://{listen}"))).await;
    let url = origin.url("/big.txt");

    let (cold, _) = update(&proxy, &url, 0).await;
    assert!(cold > 100_000, "the first release crosses whole: {cold} B");
    let (link, signature) = update(&proxy, &url, 1).await;
    assert_eq!(signature, 0, "named by digest alone: no signature went up");
    assert!(link < 20_000, "an 8-byte change took {link} B");

    // Killed, as a crash would: what was kept is in its files.
    let _ = first.child.kill();
    let _ = first.child.wait();
    drop(first);
    let _second = accelerator(origin.addr, listen, dir.path());
    let (link, signature) = update(&proxy, &url, 2).await;
    assert_eq!(signature, 0);
    assert!(
        link < 20_000,
        "held after the restart, an 8-byte change took {link} B"
    );
}
