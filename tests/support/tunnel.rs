//! What the CONNECT tests share: a TCP echo server that counts its
//! connections, a CONNECT sent over a raw socket with its answer's head
//! read, and bytes sent through the tunnel and read back.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
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
pub async fn round_trip(stream: &mut TcpStream, bytes: &[u8]) -> Vec<u8> {
    stream.write_all(bytes).await.unwrap();
    let mut got = vec![0; bytes.len()];
    tokio::time::timeout(PROMPT, stream.read_exact(&mut got))
        .await
        .expect("the echo")
        .unwrap();
    got
}
