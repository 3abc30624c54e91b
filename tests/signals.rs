//! How the real binary takes signals (issue 19): SIGTERM stops accepting,
//! lets a download under way finish and exits 0 within the drain timeout;
//! SIGHUP no longer ends the process; the queue is saved on the way out.
//! Its log into a pipe has no colour.

mod support;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::Response;
use http_body_util::StreamBody;
use hyper::body::Frame;
use support::topology::origin;

/// The body the slow origin sends: 40 pieces of 16 KiB, 50 ms apart (about
/// two seconds).
const PIECES: usize = 40;
const PIECE: usize = 16 << 10;

/// An origin sending [`PIECES`] pieces slowly, as a rate-limited download.
async fn slow_origin() -> support::topology::Origin {
    origin(|_, _| async {
        let (to_body, body) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, std::io::Error>>(1);
        tokio::spawn(async move {
            for n in 0..PIECES {
                tokio::time::sleep(Duration::from_millis(50)).await;
                let piece = Bytes::from(vec![b'a' + (n % 26) as u8; PIECE]);
                if to_body.send(Ok(Frame::data(piece))).await.is_err() {
                    return;
                }
            }
        });
        let mut response = Response::new(StreamBody::new(frames(body)));
        response.headers_mut().insert(
            "content-length",
            (PIECES * PIECE).to_string().parse().unwrap(),
        );
        response
    })
    .await
}

/// The frames `receiver` gets, as a body's stream.
fn frames(
    receiver: tokio::sync::mpsc::Receiver<Result<Frame<Bytes>, std::io::Error>>,
) -> impl futures_core::Stream<Item = Result<Frame<Bytes>, std::io::Error>> {
    struct Frames(tokio::sync::mpsc::Receiver<Result<Frame<Bytes>, std::io::Error>>);
    impl futures_core::Stream for Frames {
        type Item = Result<Frame<Bytes>, std::io::Error>;
        fn poll_next(
            mut self: std::pin::Pin<&mut Self>,
            cx: &mut std::task::Context<'_>,
        ) -> std::task::Poll<Option<Self::Item>> {
            self.0.poll_recv(cx)
        }
    }
    Frames(receiver)
}

/// Starts `rproxy accelerator` in front of `origin` on a port of its own
/// choosing; returns the child and the address it logged.
fn start_accelerator(origin: SocketAddr) -> (Child, SocketAddr) {
    start_accelerator_with(origin, &[])
}

/// [`start_accelerator`] with more flags.
fn start_accelerator_with(origin: SocketAddr, more: &[&str]) -> (Child, SocketAddr) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_rproxy"))
        .args([
            "accelerator",
            "--listen",
            "127.0.0.1:0",
            "--admin-listen",
            "127.0.0.1:0",
            "--origin",
            &format!("http://{origin}"),
            "--drain-timeout",
            "10s",
            // Not the shared temp directory's basis store.
            "--basis-dir",
            "off",
        ])
        .args(more)
        .env("RUST_LOG", "info")
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut log = BufReader::new(child.stderr.take().unwrap());
    let mut line = String::new();
    let address = loop {
        line.clear();
        assert!(
            log.read_line(&mut line).unwrap() > 0,
            "the accelerator ended before it was ready"
        );
        if let Some(at) = line.find("listen=") {
            let rest = &line[at + "listen=".len()..];
            let end = rest.find(char::is_whitespace).unwrap_or(rest.len());
            break rest[..end].parse().unwrap();
        }
    };
    // Keep reading the log, so the child never blocks on a full pipe.
    std::thread::spawn(move || {
        let mut sink = String::new();
        let _ = log.read_to_string(&mut sink);
    });
    (child, address)
}

fn signal(child: &Child, signal: i32) {
    let pid = i32::try_from(child.id()).unwrap();
    assert_eq!(unsafe { libc::kill(pid, signal) }, 0);
}

/// Waits up to `within` for the child to exit.
fn exit_status(child: &mut Child, within: Duration) -> Option<std::process::ExitStatus> {
    let started = Instant::now();
    while started.elapsed() < within {
        if let Some(status) = child.try_wait().unwrap() {
            return Some(status);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_lets_a_download_finish_refuses_new_connections_and_exits_0() {
    let origin = slow_origin().await;
    let (mut child, address) = start_accelerator(origin.addr);
    let downloaded = tokio::task::spawn_blocking(move || {
        let mut stream = TcpStream::connect(address).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(20)))
            .unwrap();
        stream
            .write_all(b"GET /big HTTP/1.1\r\nHost: site\r\nConnection: close\r\n\r\n")
            .unwrap();
        let mut answer = Vec::new();
        stream.read_to_end(&mut answer).unwrap();
        answer
    });
    // The download is under way when the signal comes.
    origin.wait_for_requests(1).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    signal(&child, libc::SIGTERM);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        TcpStream::connect(address).is_err(),
        "a new connection was accepted while draining"
    );
    assert!(
        child.try_wait().unwrap().is_none(),
        "it exited with a download under way"
    );

    let answer = downloaded.await.unwrap();
    let body_at = answer.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
    assert!(answer.starts_with(b"HTTP/1.1 200"));
    assert_eq!(
        answer.len() - body_at,
        PIECES * PIECE,
        "the download was cut"
    );
    let status = exit_status(&mut child, Duration::from_secs(10)).expect("it exits once drained");
    assert!(status.success(), "{status:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_does_not_end_the_process() {
    let origin = slow_origin().await;
    let (mut child, address) = start_accelerator(origin.addr);
    signal(&child, libc::SIGHUP);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(child.try_wait().unwrap().is_none(), "SIGHUP ended it");
    let served = tokio::task::spawn_blocking(move || {
        let mut stream = TcpStream::connect(address).unwrap();
        stream
            .write_all(b"GET /.rproxy/stats HTTP/1.1\r\nHost: site\r\nConnection: close\r\n\r\n")
            .unwrap();
        let mut answer = Vec::new();
        stream.read_to_end(&mut answer).unwrap();
        answer
    })
    .await
    .unwrap();
    assert!(served.starts_with(b"HTTP/1.1 200"));
    // An idle server stops at once on SIGINT, and exits 0.
    signal(&child, libc::SIGINT);
    let status = exit_status(&mut child, Duration::from_secs(5)).expect("it exits");
    assert!(status.success(), "{status:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_queue_is_saved_on_the_way_out() {
    let origin = slow_origin().await;
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("queue.json");
    let state_arg = state.display().to_string();
    let (mut child, _) =
        start_accelerator_with(origin.addr, &["--slots", "1", "--queue-state", &state_arg]);
    // The timer saves it every second; take that copy away, and stop at
    // once: what is there afterwards was written on the way out.
    let started = Instant::now();
    while !state.exists() && started.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(10));
    }
    std::fs::remove_file(&state).unwrap();
    signal(&child, libc::SIGTERM);
    let status = exit_status(&mut child, Duration::from_secs(5)).expect("it exits");
    assert!(status.success(), "{status:?}");
    assert!(state.exists(), "the queue was not saved on the way out");
}
