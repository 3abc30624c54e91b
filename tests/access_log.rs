//! The access log (issue 19), from the real binaries: a client proxy in
//! front of an accelerator in front of an origin, each writing JSON lines
//! to a file. Every line of either has the same keys, whatever path the
//! request took (a miss, a delta, a hit, a pass-through, a refusal); the
//! request id the client proxy gives a request is the one the
//! accelerator logs; the bytes a delta saved agree on both sides; and
//! SIGUSR1 reopens the file after logrotate moved it. A CONNECT tunnel is
//! logged when it ends, with its bytes each way.

mod support;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::Response;
use http_body_util::Full;
use serde_json::Value;
use support::process::{Running, exchange};
use support::topology::origin;

/// The keys of every line (in this order in logfmt).
const KEYS: [&str; 17] = [
    "time",
    "id",
    "client",
    "user",
    "method",
    "url",
    "status",
    "cache",
    "coding",
    "basis",
    "from_upstream",
    "to_upstream",
    "from_downstream",
    "to_downstream",
    "saved",
    "ms",
    "complete",
];

/// The status code of `head`'s answer from `proxy`.
fn request(proxy: SocketAddr, head: &str) -> u16 {
    exchange(proxy, head).0
}

/// The JSON lines of `path`, once there are at least `count`.
fn lines(path: &Path, count: usize) -> Vec<Value> {
    let started = Instant::now();
    loop {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        if text.lines().count() >= count {
            return text
                .lines()
                .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}")))
                .collect();
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{} has {} lines, not {count}: {text}",
            path.display(),
            text.lines().count()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The keys of a line, sorted.
fn keys(line: &Value) -> Vec<&str> {
    line.as_object()
        .expect("a line is an object")
        .keys()
        .map(String::as_str)
        .collect()
}

fn sorted(keys: [&'static str; 17]) -> Vec<&'static str> {
    let mut keys = keys.to_vec();
    keys.sort_unstable();
    keys
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_path_writes_one_line_with_the_same_keys_and_both_roles_share_the_id() {
    let old = support::pseudo_text(7, 200_000);
    let mut new = old.clone();
    new[100_000..100_010].copy_from_slice(b"0123456789");
    let (old, new) = (Bytes::from(old), Bytes::from(new));
    let origin = origin(move |request, earlier| {
        let body = match (request.uri().path(), earlier) {
            ("/page", 0) => old.clone(),
            ("/page", _) => new.clone(),
            _ => Bytes::from_static(b"small and fresh"),
        };
        let cache_control = match request.uri().path() {
            "/page" => "no-cache",
            _ => "max-age=60",
        };
        async move {
            Response::builder()
                .header("cache-control", cache_control)
                .body(Full::new(body))
                .unwrap()
        }
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let accelerator_log = dir.path().join("accelerator.log");
    let client_log = dir.path().join("client.log");
    let accelerator = Running::start(&[
        "accelerator",
        "--listen",
        "127.0.0.1:0",
        "--origin",
        &format!("http://{}", origin.addr),
        "--access-log",
        accelerator_log.to_str().unwrap(),
        "--log-format",
        "json",
    ]);
    let mut client = Running::start(&[
        "client",
        "--listen",
        "127.0.0.1:0",
        "--upstream",
        &format!("http://{}", accelerator.address),
        "--cache",
        dir.path().join("cache").to_str().unwrap(),
        "--access-log",
        client_log.to_str().unwrap(),
        "--log-format",
        "json",
    ]);
    let proxy = client.address;
    // As a gateway: the accelerator's one-site shorthand takes origin-form
    // requests for any host.
    let get = |path: &str| request(proxy, &format!("GET {path} HTTP/1.1\r\nHost: site"));
    assert_eq!(get("/page"), 200, "a miss");
    assert_eq!(get("/page"), 200, "a delta");
    assert_eq!(get("/fresh"), 200, "a miss");
    assert_eq!(get("/fresh"), 200, "a hit");
    let posted = request(
        proxy,
        "POST /form HTTP/1.1\r\nHost: site\r\nContent-Length: 0",
    );
    assert_eq!(posted, 200, "a pass-through");
    let refused = request(proxy, "CONNECT site:25 HTTP/1.1\r\nHost: site:25");
    assert_eq!(refused, 403, "a refusal");

    let client_lines = lines(&client_log, 6);
    // The hit and the refused CONNECT never reach the accelerator.
    let accelerator_lines = lines(&accelerator_log, 4);
    for line in client_lines.iter().chain(&accelerator_lines) {
        assert_eq!(keys(line), sorted(KEYS), "{line}");
        assert!(
            line["id"].as_str().is_some_and(|id| !id.is_empty()),
            "{line}"
        );
        assert!(line["user"].is_null(), "no user without --auth-file");
    }
    let statuses: Vec<_> = client_lines.iter().map(|l| l["status"].clone()).collect();
    assert_eq!(
        statuses,
        [200, 200, 200, 200, 200, 403].map(Value::from),
        "{client_lines:#?}"
    );

    let delta = &client_lines[1];
    assert_eq!(delta["coding"], "hsync", "{delta}");
    assert!(
        delta["basis"]
            .as_str()
            .is_some_and(|b| b.ends_with("/page")),
        "the cached copy of the same page: {delta}"
    );
    assert_eq!(delta["to_downstream"], 200_000, "{delta}");
    let link = delta["from_upstream"].as_u64().unwrap();
    assert!(link < 20_000, "a 10-byte change took {link} bytes");
    // The accelerator kept the first version: its digest alone named the
    // basis, so no signature went up.
    assert!(delta["to_upstream"].is_null(), "{delta}");
    assert_eq!(delta["saved"], 200_000 - link, "{delta}");
    let coded = accelerator_lines
        .iter()
        .find(|line| line["id"] == delta["id"])
        .expect("the accelerator logs the client proxy's request id");
    assert_eq!(coded["coding"], "hsync", "{coded}");
    assert_eq!(coded["from_upstream"], 200_000, "{coded}");
    assert_eq!(coded["to_downstream"], link, "{coded}");
    assert_eq!(coded["saved"], 200_000 - link, "{coded}");

    let hit = &client_lines[3];
    assert!(hit["cache"].as_str().unwrap().contains("hit"), "{hit}");
    assert_eq!(hit["from_upstream"], 0, "{hit}");
    assert_eq!(hit["saved"], hit["to_downstream"], "a hit saves all: {hit}");
    let passed = &client_lines[4];
    assert_eq!(
        (passed["method"].as_str(), passed["coding"].as_str()),
        (Some("POST"), Some("identity"))
    );
    assert_eq!(passed["from_upstream"], passed["to_downstream"]);
    assert_eq!(passed["saved"], 0, "{passed}");
    assert!(client_lines[5]["complete"].as_bool().unwrap());

    // The lines' savings add up to what the counters (and so the metrics)
    // say, on either side.
    let total = |lines: &[Value]| -> i64 { lines.iter().filter_map(|l| l["saved"].as_i64()).sum() };
    for (lines, address) in [
        (&client_lines, proxy),
        (&accelerator_lines, accelerator.address),
    ] {
        let (status, stats) = exchange(address, "GET /.rproxy/stats HTTP/1.1\r\nHost: site");
        assert_eq!(status, 200);
        let stats: Value = serde_json::from_slice(&stats).unwrap();
        assert_eq!(
            total(lines),
            stats["saved_bytes"].as_i64().unwrap(),
            "{stats}"
        );
    }

    // logrotate moves the file, then SIGUSR1: the next line goes to a new
    // file under the old name.
    let rotated = dir.path().join("client.log.1");
    std::fs::rename(&client_log, &rotated).unwrap();
    client.signal(libc::SIGUSR1);
    client.wait_for_line("reopened");
    assert_eq!(get("/fresh"), 200);
    let after = lines(&client_log, 1);
    assert_eq!(after.len(), 1);
    assert!(after[0]["cache"].as_str().unwrap().contains("hit"));
    // Six requests and the stats poll.
    assert_eq!(lines(&rotated, 7).len(), 7, "the old file keeps its lines");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logfmt_lines_go_to_stderr_by_default() {
    let origin = origin(|_, _| async { Response::new(Full::new(Bytes::from_static(b"x"))) }).await;
    let mut accelerator = Running::start(&[
        "accelerator",
        "--listen",
        "127.0.0.1:0",
        "--origin",
        &format!("http://{}", origin.addr),
    ]);
    let proxy = accelerator.address;
    assert_eq!(request(proxy, "GET /a%20b HTTP/1.1\r\nHost: site"), 200);
    let line = accelerator.wait_for_line("method=GET");
    assert!(line.starts_with("time="), "{line}");
    for field in [
        "url=//site/a%20b",
        "status=200",
        "coding=identity",
        "user=-",
    ] {
        assert!(line.contains(field), "{field} in {line}");
    }
    assert!(!line.contains('\u{1b}'), "no colour into a pipe: {line}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tunnel_is_logged_when_it_ends_with_its_bytes_each_way() {
    let origin =
        origin(|_, _| async { Response::new(Full::new(Bytes::from_static(b"inside"))) }).await;
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("client.log");
    let client = Running::start(&[
        "client",
        "--listen",
        "127.0.0.1:0",
        "--cache",
        dir.path().join("cache").to_str().unwrap(),
        "--connect-ports",
        &origin.addr.port().to_string(),
        "--connect-allow-addresses",
        "127.0.0.0/8",
        "--access-log",
        log.to_str().unwrap(),
        "--log-format",
        "json",
    ]);
    let mut stream = TcpStream::connect(client.address).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let target = origin.addr;
    write!(
        stream,
        "CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n"
    )
    .unwrap();
    let inner = format!("GET / HTTP/1.1\r\nHost: {target}\r\nConnection: close\r\n\r\n");
    stream.write_all(inner.as_bytes()).unwrap();
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).unwrap();
    assert!(answer.starts_with(b"HTTP/1.1 200"));
    assert!(
        answer.ends_with(b"inside"),
        "the origin's answer came through"
    );
    drop(stream);

    let line = &lines(&log, 1)[0];
    assert_eq!(keys(line), sorted(KEYS), "{line}");
    assert_eq!(line["method"], "CONNECT", "{line}");
    assert_eq!(line["coding"], "tunnel", "{line}");
    assert_eq!(line["to_upstream"], inner.len(), "{line}");
    let down = line["from_upstream"].as_u64().unwrap();
    assert!(down > "inside".len() as u64, "{line}");
    assert_eq!(line["to_downstream"], down, "{line}");
}
