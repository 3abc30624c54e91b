//! The user agent of the client-proxy tests: `GET` in absolute form
//! through a proxy, as `curl -x` sends it, and what came back.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

/// One response as the user agent got it: `body` is `Err` when it did not
/// end as its framing says a whole body ends.
pub struct Fetched {
    pub status: StatusCode,
    pub cache_status: String,
    pub body: Result<Vec<u8>, String>,
}

impl Fetched {
    pub fn is_hit(&self) -> bool {
        self.cache_status.contains("; hit")
    }

    /// Asserts a 200 whose body ended whole and is `expected` (the origin's
    /// body of `path`).
    pub fn assert_body(&self, path: &str, expected: &[u8]) {
        assert_eq!(self.status, StatusCode::OK, "{path}");
        let body = self
            .body
            .as_ref()
            .unwrap_or_else(|e| panic!("{path}: body failed: {e}"));
        assert!(
            *body == expected,
            "{path}: {} bytes, not the origin's",
            body.len()
        );
    }
}

/// A fresh HTTP/1.1 connection to `proxy`, driven by a task of its own.
async fn connect(proxy: SocketAddr) -> hyper::client::conn::http1::SendRequest<Empty<Bytes>> {
    let stream = TcpStream::connect(proxy).await.unwrap();
    let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(connection);
    sender
}

/// Sends `GET url` through the proxy; the response head within 10 s.
pub async fn start_get(proxy: SocketAddr, url: &str) -> Response<Incoming> {
    let mut sender = connect(proxy).await;
    let uri: http::Uri = url.parse().unwrap();
    let request = Request::get(uri.clone())
        .header("host", uri.authority().unwrap().as_str())
        .body(Empty::<Bytes>::new())
        .unwrap();
    tokio::time::timeout(Duration::from_secs(10), sender.send_request(request))
        .await
        .expect("a response head in time")
        .unwrap()
}

/// `GET url` through the proxy, the whole body within 20 s.
pub async fn get(proxy: SocketAddr, url: &str) -> Fetched {
    let response = start_get(proxy, url).await;
    let status = response.status();
    let cache_status = response
        .headers()
        .get("cache-status")
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default();
    let body = tokio::time::timeout(Duration::from_secs(20), response.into_body().collect())
        .await
        .expect("the body in time")
        .map(|b| b.to_bytes().to_vec())
        .map_err(|e| e.to_string());
    Fetched {
        status,
        cache_status,
        body,
    }
}

/// `method url` with these `headers` and no body over a fresh connection,
/// its whole answer: status, headers, body. Absolute-form names its host;
/// origin-form (to a gateway or an origin) passes `host` in `headers`.
pub async fn request(
    proxy: SocketAddr,
    method: &str,
    url: &str,
    headers: &[(&str, &str)],
) -> (StatusCode, http::HeaderMap, Vec<u8>) {
    let mut sender = connect(proxy).await;
    let uri: http::Uri = url.parse().unwrap();
    let mut request = Request::builder().method(method).uri(uri.clone());
    if let Some(authority) = uri.authority() {
        request = request.header("host", authority.as_str());
    }
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let response = sender
        .send_request(request.body(Empty::<Bytes>::new()).unwrap())
        .await
        .unwrap();
    let (parts, body) = response.into_parts();
    let body = body.collect().await.unwrap().to_bytes().to_vec();
    (parts.status, parts.headers, body)
}
