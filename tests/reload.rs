//! Reloading the configuration on SIGHUP (issue 19), against the real
//! binary: a 100 MB transfer under way finishes byte-exact with the
//! configuration it started with, the next request takes the new route,
//! a file that does not validate leaves the running configuration in
//! force, a key that needs a restart is named in the log, and a renewed
//! TLS certificate is presented from the next handshake.

mod support;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::time::Duration;

use bytes::Bytes;
use http::Response;
use http_body_util::Full;
use support::process::{Running, exchange, split_answer};
use support::topology::{Origin, origin};

/// The size of the transfer under way at the reload.
const BIG: usize = 100 << 20;

/// An origin that answers `/which` with `name` (never stored) and `/big`
/// with `big`.
async fn named_origin(name: &'static str, big: Bytes) -> Origin {
    origin(move |request, _| {
        let big = big.clone();
        async move {
            if request.uri().path() == "/big" {
                return Response::new(Full::new(big));
            }
            Response::builder()
                .header("cache-control", "no-store")
                .body(Full::new(Bytes::from_static(name.as_bytes())))
                .unwrap()
        }
    })
    .await
}

/// `GET target` through `proxy` on a connection of its own.
fn get(proxy: SocketAddr, target: &str) -> (u16, Vec<u8>) {
    exchange(proxy, &format!("GET {target} HTTP/1.1\r\nHost: site"))
}

fn write_config(path: &Path, text: &str) {
    // Written beside and renamed, as an operator's editor or deploy does:
    // a reload never reads half a file.
    let temp = path.with_extension("new");
    std::fs::write(&temp, text).unwrap();
    std::fs::rename(&temp, path).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_proxy_reloads_its_routes_without_cutting_a_transfer() {
    let big = Bytes::from(support::random_bytes(19, BIG));
    let first = named_origin("first", big.clone()).await;
    let second = named_origin("second", Bytes::from_static(b"not this one")).await;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("client.toml");
    let cache = dir.path().join("cache");
    let config_for = |upstream: SocketAddr, cache_size: &str| {
        format!(
            "role = \"client\"\nlisten = \"127.0.0.1:0\"\nupstream = \"http://{upstream}\"\n\
             cache = \"{}\"\ncache-size = \"{cache_size}\"\n",
            cache.display()
        )
    };
    write_config(&config, &config_for(first.addr, "1G"));
    let mut proxy = Running::start(&["client", "--config", config.to_str().unwrap()]);
    let address = proxy.address;
    assert_eq!(get(address, "http://site/which").1, b"first");

    // A 100 MB download, of which the user agent has read one MiB.
    let mut download = TcpStream::connect(address).unwrap();
    download
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    download
        .write_all(b"GET http://site/big HTTP/1.1\r\nHost: site\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut received = vec![0; 1 << 20];
    download.read_exact(&mut received).unwrap();

    write_config(&config, &config_for(second.addr, "2G"));
    proxy.hangup();
    let warned = proxy.wait_for_line("applies only at the next start");
    assert!(warned.contains("cache-size"), "{warned}");
    proxy.wait_for_line("configuration reloaded");
    assert_eq!(
        get(address, "http://site/which").1,
        b"second",
        "the next request takes the new route"
    );

    // The transfer goes on with the route it started with, to its end.
    download.read_to_end(&mut received).unwrap();
    let (status, body) = split_answer(&received);
    assert_eq!(status, 200);
    assert_eq!(body.len(), BIG, "the transfer was cut");
    assert!(body == big, "the transfer's bytes changed");

    // A file that does not validate changes nothing.
    write_config(&config, "role = \"client\"\nupstream = \"ftp://nowhere\"\n");
    proxy.hangup();
    let refused = proxy.wait_for_line("configuration refused");
    assert!(refused.contains("ftp://nowhere"), "{refused}");
    assert_eq!(get(address, "http://site/which").1, b"second");
    assert_eq!(first.requests_to("/which"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_accelerator_reloads_its_sites() {
    let first = named_origin("first", Bytes::new()).await;
    let second = named_origin("second", Bytes::new()).await;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("accelerator.toml");
    let config_for = |origin: SocketAddr| {
        format!(
            "role = \"accelerator\"\nlisten = \"127.0.0.1:0\"\n\
             [[site]]\nnames = [\"site\"]\norigin = \"http://{origin}\"\n"
        )
    };
    write_config(&config, &config_for(first.addr));
    let mut accelerator = Running::start(&["accelerator", "--config", config.to_str().unwrap()]);
    let address = accelerator.address;
    assert_eq!(get(address, "/which").1, b"first");

    write_config(&config, &config_for(second.addr));
    accelerator.hangup();
    accelerator.wait_for_line("configuration reloaded");
    assert_eq!(get(address, "/which").1, b"second");

    // A site without an origin is refused; the one in force stays.
    write_config(
        &config,
        "role = \"accelerator\"\n[[site]]\nnames = [\"site\"]\n",
    );
    accelerator.hangup();
    accelerator.wait_for_line("configuration refused");
    assert_eq!(get(address, "/which").1, b"second");
    assert_eq!(get(address, "/which").0, 200);
}

/// Whether a TLS handshake with `address` succeeds for a client that
/// trusts only the certificate in `ca`.
async fn handshake_trusting(address: SocketAddr, ca: &std::path::Path) -> bool {
    let config = rproxy::http::tls::client_config(Some(ca)).unwrap();
    let connector = tokio_rustls::TlsConnector::from(config);
    let stream = tokio::net::TcpStream::connect(address).await.unwrap();
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    connector.connect(name, stream).await.is_ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewed_certificate_is_presented_after_a_reload() {
    let origin = named_origin("site", Bytes::new()).await;
    let (old_dir, new_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (old_cert, old_key) = support::topology::self_signed(old_dir.path());
    let (new_cert, new_key) = support::topology::self_signed(new_dir.path());
    // The files the accelerator reads; renewal overwrites them in place.
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
    std::fs::copy(&old_cert, &cert).unwrap();
    std::fs::copy(&old_key, &key).unwrap();
    let mut accelerator = Running::start(&[
        "accelerator",
        "--listen",
        "127.0.0.1:0",
        "--origin",
        &format!("http://{}", origin.addr),
        "--tls-cert",
        cert.to_str().unwrap(),
        "--tls-key",
        key.to_str().unwrap(),
    ]);
    let address = accelerator.address;
    assert!(handshake_trusting(address, &old_cert).await);
    assert!(!handshake_trusting(address, &new_cert).await);

    std::fs::copy(&new_cert, &cert).unwrap();
    std::fs::copy(&new_key, &key).unwrap();
    accelerator.hangup();
    accelerator.wait_for_line("configuration reloaded");
    assert!(handshake_trusting(address, &new_cert).await);
    assert!(!handshake_trusting(address, &old_cert).await);

    // A key that is not the certificate's is refused; the renewed pair stays.
    std::fs::copy(&old_key, &key).unwrap();
    accelerator.hangup();
    accelerator.wait_for_line("configuration refused");
    assert!(handshake_trusting(address, &new_cert).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_limits_apply_to_connections_accepted_after_a_reload() {
    let origin = named_origin("site", Bytes::new()).await;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("accelerator.toml");
    let config_for = |max_headers: usize, max_connections: usize| {
        format!(
            "role = \"accelerator\"\nlisten = \"127.0.0.1:0\"\norigin = \"http://{}\"\n\
             [limits]\nmax-headers = {max_headers}\nmax-connections = {max_connections}\n",
            origin.addr
        )
    };
    write_config(&config, &config_for(100, 100));
    let mut accelerator = Running::start(&["accelerator", "--config", config.to_str().unwrap()]);
    let address = accelerator.address;
    // Sixty short headers: read whole in one go, so a refusal is not cut
    // by a reset for bytes left unread.
    let many: String = (0..60).map(|n| format!("\r\nX-{n}: v")).collect();
    let many_headers = format!("GET /which HTTP/1.1\r\nHost: site{many}");
    assert_eq!(exchange(address, &many_headers).0, 200);

    write_config(&config, &config_for(50, 200));
    accelerator.hangup();
    let warned = accelerator.wait_for_line("applies only at the next start");
    assert!(warned.contains("limits.max-connections"), "{warned}");
    accelerator.wait_for_line("configuration reloaded");
    assert_eq!(
        exchange(address, &many_headers).0,
        431,
        "the new max-headers"
    );
    assert_eq!(get(address, "/which").0, 200);
}
