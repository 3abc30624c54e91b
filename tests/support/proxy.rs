//! Setting up a client proxy in a test, and waiting for what it does in
//! the background.

use std::time::Duration;

use http::HeaderValue;
use rproxy::client_proxy::ClientConfig;

/// The client proxy settings the tests start from (`upstream` is a URL):
/// `rproxy client`'s defaults with shorter timeouts and a smaller memory
/// cache; each test sets what it is about with `..client_config(url)`.
pub fn client_config(upstream: &str) -> ClientConfig {
    ClientConfig {
        via_name: HeaderValue::from_static("client-test"),
        connect_timeout: Duration::from_secs(2),
        upstream_timeout: Duration::from_secs(5),
        max_object_bytes: 1 << 30,
        memory_cache_bytes: 16 << 20,
        ..ClientConfig::for_upstream(upstream.parse().unwrap())
    }
}

/// Polls `condition` for up to 10 s.
pub async fn eventually(what: &str, mut condition: impl FnMut() -> bool) {
    for _ in 0..1000 {
        if condition() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("not within 10 s: {what}");
}
