//! The static origin over real sockets: bytes and headers of served files,
//! HEAD, conditional GETs, path traversal attempts, methods, directory
//! indexes and the request counter.

mod support;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use http::{HeaderMap, Method, StatusCode};
use rproxy::demo::static_origin::StaticOrigin;
use support::topology::{Listen, Server, serve};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Serves `origin` on a port of its own; dropping the handle stops it.
async fn start(origin: StaticOrigin) -> Server<StaticOrigin> {
    serve(Arc::new(origin), Listen::default()).await
}

fn data_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data")
}

/// Sends one request over a fresh connection, with `Host: origin.test`;
/// returns status, headers and the whole body.
async fn fetch(
    addr: SocketAddr,
    method: Method,
    path: &str,
    headers: &[(&str, &str)],
) -> (StatusCode, HeaderMap, Vec<u8>) {
    let mut with_host = vec![("host", "origin.test")];
    with_host.extend_from_slice(headers);
    support::user_agent::request(addr, method.as_str(), path, &with_host).await
}

/// Sends `target` byte for byte (no client-side normalisation) and returns
/// the status code.
async fn raw_status(addr: SocketAddr, target: &str) -> u16 {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let request =
        format!("GET {target} HTTP/1.1\r\nHost: origin.test\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut response = Vec::new();
    stream.read_to_end(&mut response).await.unwrap();
    let response = String::from_utf8_lossy(&response);
    response
        .strip_prefix("HTTP/1.1 ")
        .and_then(|rest| rest.get(..3))
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| panic!("no status line in {response:?}"))
}

#[tokio::test]
async fn a_file_is_served_byte_for_byte_with_validators() {
    let server = start(StaticOrigin::new(data_dir()).unwrap()).await;
    let path = data_dir().join("jquery/3.7.1/jquery.js");
    let expected = std::fs::read(&path).unwrap();
    let (status, headers, body) =
        fetch(server.addr, Method::GET, "/jquery/3.7.1/jquery.js", &[]).await;
    assert_eq!(status, StatusCode::OK);
    assert!(body == expected, "body differs from the file");
    assert_eq!(
        headers["content-length"],
        expected.len().to_string().as_str()
    );
    assert_eq!(headers["content-type"], "text/javascript; charset=utf-8");
    let mtime = std::fs::metadata(&path)
        .unwrap()
        .modified()
        .unwrap()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    assert_eq!(
        headers["etag"],
        format!("\"{mtime:x}-{:x}\"", expected.len()).as_str()
    );
    assert!(headers["last-modified"].to_str().unwrap().ends_with(" GMT"));
    assert!(headers.get("cache-control").is_none());
}

#[tokio::test]
async fn a_query_is_ignored_and_cache_control_is_sent_when_configured() {
    let origin = StaticOrigin::new(data_dir())
        .unwrap()
        .with_cache_control(http::HeaderValue::from_static("max-age=60"));
    let server = start(origin).await;
    let (status, headers, body) =
        fetch(server.addr, Method::GET, "/jquery/3.7.0/jquery.js?v=2", &[]).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        body.len(),
        std::fs::metadata(data_dir().join("jquery/3.7.0/jquery.js"))
            .unwrap()
            .len() as usize
    );
    assert_eq!(headers["cache-control"], "max-age=60");
}

#[tokio::test]
async fn head_sends_the_length_and_no_body() {
    let server = start(StaticOrigin::new(data_dir()).unwrap()).await;
    let len = std::fs::metadata(data_dir().join("jquery/3.7.1/jquery.js"))
        .unwrap()
        .len();
    let (status, headers, body) =
        fetch(server.addr, Method::HEAD, "/jquery/3.7.1/jquery.js", &[]).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(headers["content-length"], len.to_string().as_str());
    assert!(body.is_empty());
}

#[tokio::test]
async fn matching_validators_get_304_without_a_body() {
    let server = start(StaticOrigin::new(data_dir()).unwrap()).await;
    let target = "/jquery/3.7.1/jquery.js";
    let (_, first, _) = fetch(server.addr, Method::GET, target, &[]).await;
    let etag = first["etag"].to_str().unwrap();
    let last_modified = first["last-modified"].to_str().unwrap();

    let weak = format!("W/{etag}");
    let list = format!("\"nope\", {etag}");
    for if_none_match in [etag, weak.as_str(), list.as_str(), "*"] {
        let (status, headers, body) = fetch(
            server.addr,
            Method::GET,
            target,
            &[("if-none-match", if_none_match)],
        )
        .await;
        assert_eq!(status, StatusCode::NOT_MODIFIED, "{if_none_match}");
        assert_eq!(headers["etag"], etag);
        assert_eq!(headers["last-modified"], last_modified);
        assert!(body.is_empty());
    }

    let (status, _, body) = fetch(
        server.addr,
        Method::GET,
        target,
        &[("if-modified-since", last_modified)],
    )
    .await;
    assert_eq!(status, StatusCode::NOT_MODIFIED);
    assert!(body.is_empty());

    // An older date, or an If-None-Match that does not match, gets the body.
    let (status, _, body) = fetch(
        server.addr,
        Method::GET,
        target,
        &[("if-modified-since", "Thu, 01 Jan 1970 00:00:00 GMT")],
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert!(!body.is_empty());
    let (status, _, _) = fetch(
        server.addr,
        Method::GET,
        target,
        &[
            ("if-none-match", "\"nope\""),
            ("if-modified-since", last_modified),
        ],
    )
    .await;
    assert_eq!(status, StatusCode::OK);
}

/// A temp tree with a secret next to the root: `tmp/Cargo.toml` outside,
/// `tmp/root/{inside.txt, jquery/}` inside.
fn traversal_tree() -> tempfile::TempDir {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("Cargo.toml"), b"secret").unwrap();
    let root = tmp.path().join("root");
    std::fs::create_dir_all(root.join("jquery")).unwrap();
    std::fs::write(root.join("inside.txt"), b"public").unwrap();
    tmp
}

#[tokio::test]
async fn traversal_attempts_are_404() {
    let tmp = traversal_tree();
    let server = start(StaticOrigin::new(tmp.path().join("root")).unwrap()).await;
    assert_eq!(raw_status(server.addr, "/inside.txt").await, 200);
    for target in [
        "/../Cargo.toml",
        "/%2e%2e/Cargo.toml",
        "/%2E%2E/Cargo.toml",
        "/jquery/../../Cargo.toml",
        "/jquery/..%2f..%2fCargo.toml",
        "/jquery/..%5c..%5cCargo.toml",
        "/./inside.txt",
        "//inside.txt",
        "/inside.txt%00",
        "/%zz",
    ] {
        assert_eq!(raw_status(server.addr, target).await, 404, "{target}");
    }
}

#[cfg(unix)]
#[tokio::test]
async fn symlinks_leading_out_of_the_root_are_404() {
    let tmp = traversal_tree();
    let root = tmp.path().join("root");
    std::os::unix::fs::symlink(tmp.path().join("Cargo.toml"), root.join("link.txt")).unwrap();
    std::os::unix::fs::symlink(tmp.path(), root.join("up")).unwrap();
    std::os::unix::fs::symlink(root.join("inside.txt"), root.join("alias.txt")).unwrap();
    let server = start(StaticOrigin::new(root).unwrap()).await;
    assert_eq!(raw_status(server.addr, "/link.txt").await, 404);
    assert_eq!(raw_status(server.addr, "/up/Cargo.toml").await, 404);
    // A symlink that stays inside is fine.
    let (status, _, body) = fetch(server.addr, Method::GET, "/alias.txt", &[]).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body, b"public");
}

#[tokio::test]
async fn other_methods_get_405_with_allow() {
    let server = start(StaticOrigin::new(data_dir()).unwrap()).await;
    for method in [Method::POST, Method::PUT, Method::DELETE] {
        let (status, headers, _) = fetch(server.addr, method.clone(), "/index.html", &[]).await;
        assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED, "{method}");
        assert_eq!(headers["allow"], "GET, HEAD");
    }
}

#[tokio::test]
async fn a_directory_serves_its_index_html_or_404() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(tmp.path().join("with")).unwrap();
    std::fs::create_dir_all(tmp.path().join("without")).unwrap();
    std::fs::write(tmp.path().join("with/index.html"), b"<p>hi</p>").unwrap();
    let server = start(StaticOrigin::new(tmp.path().to_path_buf()).unwrap()).await;
    for target in ["/with/", "/with"] {
        let (status, headers, body) = fetch(server.addr, Method::GET, target, &[]).await;
        assert_eq!(status, StatusCode::OK, "{target}");
        assert_eq!(headers["content-type"], "text/html; charset=utf-8");
        assert_eq!(body, b"<p>hi</p>");
    }
    let (status, _, _) = fetch(server.addr, Method::GET, "/without/", &[]).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, _, _) = fetch(server.addr, Method::GET, "/", &[]).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn the_demo_page_is_served_at_the_root_and_links_both_releases() {
    let server = start(StaticOrigin::new(data_dir()).unwrap()).await;
    let (status, _, body) = fetch(server.addr, Method::GET, "/", &[]).await;
    assert_eq!(status, StatusCode::OK);
    let page = String::from_utf8(body).unwrap();
    assert!(page.contains("<title>rproxy demo</title>"));
    for link in ["jquery/3.7.0/jquery.js", "jquery/3.7.1/jquery.js"] {
        assert!(page.contains(&format!("href=\"{link}\"")), "{link}");
        assert!(data_dir().join(link).is_file(), "{link}");
    }
}

#[tokio::test]
async fn the_counter_counts_every_request() {
    let server = start(StaticOrigin::new(data_dir()).unwrap()).await;
    assert_eq!(server.handler.requests(), 0);
    fetch(server.addr, Method::GET, "/index.html", &[]).await;
    fetch(server.addr, Method::HEAD, "/index.html", &[]).await;
    fetch(server.addr, Method::GET, "/missing", &[]).await;
    fetch(server.addr, Method::POST, "/index.html", &[]).await;
    assert_eq!(server.handler.requests(), 4);
}

#[test]
fn new_refuses_a_file_or_a_missing_root() {
    assert!(StaticOrigin::new(data_dir().join("index.html")).is_err());
    assert!(StaticOrigin::new(data_dir().join("no-such-dir")).is_err());
    let origin = StaticOrigin::new(data_dir()).unwrap();
    assert_eq!(origin.root(), data_dir().canonicalize().unwrap());
}
