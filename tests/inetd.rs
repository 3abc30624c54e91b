//! `--inetd` on both roles: the real binary with one end of a socketpair (or
//! two pipes) as stdin/stdout, as inetd, xinetd and systemd `Accept=yes`
//! start it. Each test asserts the answer, and that the process exits by
//! itself once the peer is done.

mod support;

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rproxy::demo::static_origin::StaticOrigin;
use support::topology::{Listen, Server, serve};

fn data_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data")
}

/// The bundled sample files served on a loopback port, on a runtime of its
/// own (the test thread itself does blocking socket I/O). The server is
/// declared before the runtime, so it stops before the runtime goes.
struct Origin {
    addr: SocketAddr,
    _server: Server<StaticOrigin>,
    _runtime: tokio::runtime::Runtime,
}

fn start_origin() -> Origin {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let files = Arc::new(StaticOrigin::new(data_dir()).unwrap());
    let server = runtime.block_on(serve(files, Listen::default()));
    Origin {
        addr: server.addr,
        _server: server,
        _runtime: runtime,
    }
}

/// Starts `rproxy ARGS --inetd` with one end of a socketpair as stdin and
/// stdout; returns the other end.
fn spawn_on_socketpair(args: &[&str]) -> (Child, UnixStream) {
    let (ours, theirs) = UnixStream::pair().unwrap();
    let stdin = OwnedFd::from(theirs.try_clone().unwrap());
    let stdout = OwnedFd::from(theirs);
    let child = Command::new(env!("CARGO_BIN_EXE_rproxy"))
        .args(args)
        .arg("--inetd")
        .env("RUST_LOG", "info")
        .stdin(Stdio::from(stdin))
        .stdout(Stdio::from(stdout))
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    ours.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    (child, ours)
}

/// Waits (bounded) for the process to exit by itself.
fn exits_by_itself(child: &mut Child, within: Duration) -> ExitStatus {
    let deadline = Instant::now() + within;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("rproxy --inetd still running {within:?} after its peer was done");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Reads one HTTP/1.1 response with a Content-Length body: (head, body).
fn read_response(stream: &mut impl Read) -> (String, Vec<u8>) {
    let mut buffer = Vec::new();
    let mut byte = [0u8; 1];
    while !buffer.ends_with(b"\r\n\r\n") {
        let n = stream.read(&mut byte).expect("a response head");
        assert!(n == 1, "connection closed inside the head: {buffer:?}");
        buffer.push(byte[0]);
    }
    let head = String::from_utf8(buffer).unwrap();
    let length: usize = head
        .lines()
        .find_map(|line| {
            let (name, value) = line.split_once(':')?;
            name.eq_ignore_ascii_case("content-length")
                .then(|| value.trim().parse().unwrap())
        })
        .unwrap_or_else(|| panic!("no Content-Length in {head}"));
    let mut body = vec![0; length];
    stream.read_exact(&mut body).unwrap();
    (head, body)
}

fn header<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.lines().find_map(|line| {
        let (n, v) = line.split_once(':')?;
        n.eq_ignore_ascii_case(name).then(|| v.trim())
    })
}

#[test]
fn l12_the_accelerator_serves_one_connection_on_a_socketpair_and_exits() {
    let origin = start_origin();
    let origin_url = format!("http://{}", origin.addr);
    let (mut child, mut peer) = spawn_on_socketpair(&["accelerator", "--origin", &origin_url]);
    let index = std::fs::read(data_dir().join("index.html")).unwrap();

    // Two requests on the one connection (keep-alive), then we are done.
    for _ in 0..2 {
        peer.write_all(b"GET /index.html HTTP/1.1\r\nHost: site\r\n\r\n")
            .unwrap();
        let (head, body) = read_response(&mut peer);
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        assert_eq!(body, index);
        assert!(
            header(&head, "via").is_some_and(|v| v.starts_with("1.1 ")),
            "{head}"
        );
    }
    peer.shutdown(std::net::Shutdown::Write).unwrap();
    let status = exits_by_itself(&mut child, Duration::from_secs(10));
    assert!(status.success(), "{status}");
    // Its log went to stderr (not the connection), one line per request.
    let mut log = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut log)
        .unwrap();
    assert_eq!(log.matches("/index.html").count(), 2, "{log}");
}

#[test]
fn the_client_proxy_serves_from_its_cache_across_inetd_processes() {
    let origin = start_origin();
    let origin_url = format!("http://{}", origin.addr);
    let cache = tempfile::tempdir().unwrap();
    let cache_dir = cache.path().to_str().unwrap();
    let jquery = std::fs::read(data_dir().join("jquery/3.7.0/jquery.js")).unwrap();
    let request = format!(
        "GET {origin_url}/jquery/3.7.0/jquery.js HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n",
        origin.addr
    );

    // One process per connection, as inetd runs it; the cache outlives them.
    let mut statuses = Vec::new();
    for _ in 0..2 {
        let (mut child, mut peer) =
            spawn_on_socketpair(&["client", "--upstream", &origin_url, "--cache", cache_dir]);
        peer.write_all(request.as_bytes()).unwrap();
        let (head, body) = read_response(&mut peer);
        assert!(
            head.starts_with("HTTP/1.1 200"),
            "{head}{}",
            String::from_utf8_lossy(&body)
        );
        assert!(body == jquery, "the bytes of jquery 3.7.0");
        statuses.push(header(&head, "cache-status").unwrap_or("").to_owned());
        drop(peer);
        let status = exits_by_itself(&mut child, Duration::from_secs(10));
        assert!(status.success(), "{status}");
    }
    assert!(statuses[0].contains("fwd=miss"), "{statuses:?}");
    // The static origin sends Last-Modified: the stored copy is fresh.
    assert!(statuses[1].contains("hit"), "{statuses:?}");
}

#[test]
fn the_header_read_timeout_applies_under_inetd() {
    let origin = start_origin();
    let origin_url = format!("http://{}", origin.addr);
    let (mut child, mut peer) = spawn_on_socketpair(&[
        "accelerator",
        "--origin",
        &origin_url,
        "--header-read-timeout",
        "1",
    ]);
    // Half a request head, then silence (slowloris, L-12).
    peer.write_all(b"GET /index.html HTTP/1.1\r\nHost: si")
        .unwrap();
    let started = Instant::now();
    let mut answer = Vec::new();
    let _ = peer.read_to_end(&mut answer);
    let answer = String::from_utf8_lossy(&answer);
    assert!(
        answer.is_empty() || answer.starts_with("HTTP/1.1 408"),
        "{answer}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "closed after {:?}",
        started.elapsed()
    );
    let status = exits_by_itself(&mut child, Duration::from_secs(5));
    assert!(status.success(), "{status}");
}

#[test]
fn pipes_work_too() {
    let origin = start_origin();
    let origin_url = format!("http://{}", origin.addr);
    let mut child = Command::new(env!("CARGO_BIN_EXE_rproxy"))
        .args(["accelerator", "--origin", &origin_url, "--inetd"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    stdin
        .write_all(b"GET /index.html HTTP/1.1\r\nHost: site\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let (head, body) = read_response(&mut stdout);
    drop(stdin);
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert_eq!(body, std::fs::read(data_dir().join("index.html")).unwrap());
    let status = exits_by_itself(&mut child, Duration::from_secs(10));
    assert!(status.success(), "{status}");
}

#[test]
fn a_connection_that_is_also_stderr_gets_no_log_lines() {
    let origin = start_origin();
    let origin_url = format!("http://{}", origin.addr);
    // inetd proper: descriptors 0, 1 and 2 are all the connection.
    let (mut peer, theirs) = UnixStream::pair().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_rproxy"))
        .args(["accelerator", "--origin", &origin_url, "--inetd"])
        .env("RUST_LOG", "debug")
        .stdin(Stdio::from(OwnedFd::from(theirs.try_clone().unwrap())))
        .stdout(Stdio::from(OwnedFd::from(theirs.try_clone().unwrap())))
        .stderr(Stdio::from(OwnedFd::from(theirs)))
        .spawn()
        .unwrap();
    peer.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    peer.write_all(b"GET /index.html HTTP/1.1\r\nHost: site\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut answer = Vec::new();
    peer.read_to_end(&mut answer).unwrap();
    let index = std::fs::read(data_dir().join("index.html")).unwrap();
    let (head, body) = read_response(&mut answer.as_slice());
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert_eq!(body, index);
    let head_len = head.len();
    assert_eq!(
        answer.len(),
        head_len + index.len(),
        "nothing but the response on the connection: {:?}",
        String::from_utf8_lossy(&answer)
    );
    let status = exits_by_itself(&mut child, Duration::from_secs(10));
    assert!(status.success(), "{status}");
}
