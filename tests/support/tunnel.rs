//! What the CONNECT tests share: a TCP echo server that counts its
//! connections, a CONNECT sent over a raw socket with its answer's head
//! read, or on a stream of an HTTP/2 connection over TLS, and bytes sent
//! through the tunnel and read back.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Empty};
use hyper::client::conn::http2;
use hyper::upgrade::Upgraded;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Patience for anything that should happen at once.
pub const PROMPT: Duration = Duration::from_secs(5);

/// A TCP server on 127.0.0.1 that echoes what it reads and counts the
/// connections it accepted.
pub struct Echo {
    pub addr: SocketAddr,
    connections: Arc<AtomicUsize>,
}

impl Echo {
    pub async fn start() -> Echo {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let connections = Arc::new(AtomicUsize::new(0));
        let counted = connections.clone();
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                counted.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    let (mut read, mut write) = stream.split();
                    let _ = tokio::io::copy(&mut read, &mut write).await;
                });
            }
        });
        Echo { addr, connections }
    }

    pub fn connections(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
    }
}

/// Sends a CONNECT for `target` (with `extra` header lines) and reads the
/// answer's head; the stream is left at the tunnel's first byte.
pub async fn connect(proxy: SocketAddr, target: &str, extra: &str) -> (String, TcpStream) {
    let mut stream = TcpStream::connect(proxy).await.unwrap();
    let request = format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n{extra}\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        let n = tokio::time::timeout(PROMPT, stream.read(&mut byte))
            .await
            .expect("an answer to CONNECT")
            .unwrap();
        if n == 0 {
            break;
        }
        head.push(byte[0]);
    }
    (String::from_utf8_lossy(&head).into_owned(), stream)
}

/// The status of a response head.
pub fn status(head: &str) -> u16 {
    head.split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status in {head:?}"))
}

/// The body of a refusal whose head [`connect`] read (it closes its
/// connection after it).
pub async fn rest(mut stream: TcpStream) -> String {
    let mut body = Vec::new();
    let _ = tokio::time::timeout(PROMPT, stream.read_to_end(&mut body)).await;
    String::from_utf8_lossy(&body).into_owned()
}

/// Writes `bytes` into a tunnel and reads as many back.
pub async fn round_trip<S>(stream: &mut S, bytes: &[u8]) -> Vec<u8>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    stream.write_all(bytes).await.unwrap();
    let mut got = vec![0; bytes.len()];
    tokio::time::timeout(PROMPT, stream.read_exact(&mut got))
        .await
        .expect("the echo")
        .unwrap();
    got
}

/// An HTTP/2 connection over TLS to `proxy` (trusting `cert`), where ALPN
/// must pick h2, sending request bodies of type `B`.
pub async fn connect_http2<B>(proxy: SocketAddr, cert: &Path) -> http2::SendRequest<B>
where
    B: hyper::body::Body + Send + Unpin + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let tls = rproxy::http::tls::client_config(Some(cert)).unwrap();
    let tcp = TcpStream::connect(proxy).await.unwrap();
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let stream = tokio_rustls::TlsConnector::from(tls)
        .connect(name, tcp)
        .await
        .unwrap();
    assert_eq!(stream.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    let (sender, connection) = http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(connection);
    sender
}

/// What a CONNECT on an HTTP/2 stream got: the tunnel when the answer was
/// a 2xx, else the refusal's body.
pub enum Http2Connect {
    Open(TokioIo<Upgraded>),
    Refused { status: u16, body: String },
}

/// Sends a CONNECT for `target` (RFC 9113 section 8.5: `:authority` only) on
/// a new stream of `sender`'s connection.
pub async fn connect_over_http2(
    sender: &mut http2::SendRequest<Empty<Bytes>>,
    target: &str,
) -> Http2Connect {
    let request = Request::connect(target).body(Empty::new()).unwrap();
    let response = tokio::time::timeout(PROMPT, sender.send_request(request))
        .await
        .expect("an answer to CONNECT")
        .unwrap();
    let status = response.status().as_u16();
    if response.status().is_success() {
        let upgraded = hyper::upgrade::on(response).await.unwrap();
        return Http2Connect::Open(TokioIo::new(upgraded));
    }
    let body = response.into_body().collect().await.unwrap().to_bytes();
    Http2Connect::Refused {
        status,
        body: String::from_utf8_lossy(&body).into_owned(),
    }
}

/// The HTTP/2 CONNECT checks both fronts share (RFC 9113 section 8.5): a
/// tunnel to `allowed` is one stream carrying bytes both ways; a CONNECT to
/// `refused` is answered 403 on its own stream, before any connection,
/// while the open tunnel and the connection go on (a second tunnel on it).
/// Returns the bytes the tunnels carried, both ways.
pub async fn http2_tunnels_are_streams(
    sender: &mut http2::SendRequest<Empty<Bytes>>,
    allowed: &str,
    refused: &str,
    echo: &Echo,
) -> u64 {
    let Http2Connect::Open(mut tunnel) = connect_over_http2(sender, allowed).await else {
        panic!("the CONNECT to {allowed} was refused");
    };
    let payload: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
    assert_eq!(round_trip(&mut tunnel, &payload).await, payload);
    match connect_over_http2(sender, refused).await {
        Http2Connect::Refused { status, body } => assert_eq!(status, 403, "{body}"),
        Http2Connect::Open(_) => panic!("the CONNECT to {refused} was tunnelled"),
    }
    assert_eq!(echo.connections(), 1, "the refusal opened a connection");
    assert_eq!(round_trip(&mut tunnel, b"still open").await, b"still open");
    let Http2Connect::Open(mut second) = connect_over_http2(sender, allowed).await else {
        panic!("the connection refused a tunnel after a refusal");
    };
    assert_eq!(round_trip(&mut second, b"second").await, b"second");
    assert_eq!(echo.connections(), 2);
    (payload.len() + b"still open".len() + b"second".len()) as u64 * 2
}
