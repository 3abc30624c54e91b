//! The change feed end to end (issue 22), with real programs on every
//! side:
//!
//! ```text
//! curl ──► client B ──► client A ══ hsync ══► accelerator ──► nginx
//!          (replicates    (replicates            (--feed-state)
//!           from A)        from the accelerator)
//! ```
//!
//! Both client proxies subscribe to the zone `http://127.0.0.1:PORT/static/`
//! with a 1 s interval, and take pushes on a callback address. nginx serves five files with `max-age=3600`, so a
//! stored version stays fresh (and, without the feed, stale content would
//! be served for an hour). Checked:
//! - after every node restarted, five files changed and one submission
//!   (POSTed through B, which passes it up to the accelerator: ars-s), both
//!   caches hold the new versions within the interval + 1 s, and a user's
//!   request for each, through B or A, is a fresh hit that takes no
//!   upstream byte;
//! - a replica that was offline while a file changed ten times gets one
//!   update for it (collapsing), and the latest body;
//! - an accelerator killed (no clean stop) comes back with CSNs past
//!   any it gave out, and its replicas reset and still converge;
//! - a file written in a watched document root reaches a replica with no
//!   submission; a path served enters the feed, the same path with a
//!   query does not.
//!
//! Needs nginx (Debian's `nginx`, in PATH or /usr/sbin) and curl.

mod support;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;
use support::process::Running;

const INTERVAL: Duration = Duration::from_secs(1);
const FILES: usize = 5;

/// nginx serving `root` on a free loopback port, with `max-age=3600` on
/// everything; stopped when dropped.
struct Nginx {
    child: std::process::Child,
    port: u16,
}

impl Nginx {
    fn start(dir: &Path, root: &Path) -> Nginx {
        let nginx = ["nginx", "/usr/sbin/nginx"]
            .into_iter()
            .find(|candidate| {
                Command::new(candidate)
                    .arg("-v")
                    .output()
                    .is_ok_and(|out| out.status.success())
            })
            .expect("nginx is needed (Debian's nginx package)");
        let prefix = dir.join("nginx");
        std::fs::create_dir_all(prefix.join("temp")).unwrap();
        let user = if unsafe_is_root() {
            "user root root;"
        } else {
            ""
        };
        // A port found free may be taken before nginx binds it (other
        // programs here pick ports the same way): nginx then exits, or
        // another server answers. A file only this nginx serves tells.
        let marker = format!("nginx of {}\n", prefix.display());
        std::fs::write(root.join("nginx-check.txt"), &marker).unwrap();
        for _ in 0..20 {
            let port = free_port();
            let conf = prefix.join("nginx.conf");
            std::fs::write(
                &conf,
                format!(
                    "{user}
daemon off;
master_process off;
pid {p}/nginx.pid;
error_log {p}/error.log warn;
events {{ worker_connections 256; }}
http {{
    access_log {p}/access.log;
    client_body_temp_path {p}/temp/client_body;
    proxy_temp_path {p}/temp/proxy;
    fastcgi_temp_path {p}/temp/fastcgi;
    uwsgi_temp_path {p}/temp/uwsgi;
    scgi_temp_path {p}/temp/scgi;
    default_type text/plain;
    server {{
        listen 127.0.0.1:{port};
        root {root};
        add_header Cache-Control \"max-age=3600\";
    }}
}}
",
                    p = prefix.display(),
                    root = root.display()
                ),
            )
            .unwrap();
            let child = Command::new(nginx)
                .args(["-p", prefix.to_str().unwrap(), "-c", conf.to_str().unwrap()])
                .spawn()
                .unwrap();
            let mut nginx = Nginx { child, port };
            let started = Instant::now();
            while started.elapsed() < Duration::from_secs(10) {
                if nginx.child.try_wait().unwrap().is_some() {
                    break;
                }
                if serves(port, &marker) {
                    return nginx;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        panic!("nginx did not start on any of 20 free ports");
    }
}

/// Whether the server on `port` serves `/nginx-check.txt` as `marker`.
fn serves(port: u16, marker: &str) -> bool {
    use std::io::{Read, Write};
    let Ok(mut stream) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
    let mut answer = String::new();
    stream
        .write_all(b"GET /nginx-check.txt HTTP/1.0\r\n\r\n")
        .is_ok()
        && stream.read_to_string(&mut answer).is_ok()
        && answer.starts_with("HTTP/1.1 200")
        && answer.ends_with(marker)
}

impl Drop for Nginx {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn unsafe_is_root() -> bool {
    std::env::var("USER").is_ok_and(|user| user == "root")
        || Command::new("id")
            .arg("-u")
            .output()
            .is_ok_and(|out| out.stdout.starts_with(b"0\n"))
}

/// A port below the ephemeral range that is free now (nginx cannot be told
/// to take port 0 and say which it got).
fn free_port() -> u16 {
    // Seeded apart in each test (they run at once, in one process).
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    let thread = format!("{:?}", std::thread::current().id());
    let thread = u64::from_le_bytes(
        blake3::hash(thread.as_bytes()).as_bytes()[..8]
            .try_into()
            .unwrap(),
    );
    let mut seed = nanos ^ thread;
    for _ in 0..1000 {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let port = 20000 + (seed >> 33) as u16 % 12000;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free port");
}

/// The `rproxy` processes and what they were started with, to restart them.
struct Node {
    args: Vec<String>,
    running: Option<Running>,
}

impl Node {
    fn start(args: Vec<String>) -> Node {
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        let running = Running::start(&refs);
        Node {
            args,
            running: Some(running),
        }
    }

    fn address(&self) -> SocketAddr {
        self.running.as_ref().unwrap().address
    }

    fn url(&self) -> String {
        format!("http://{}", self.address())
    }

    /// SIGTERM, and the exit it leads to.
    fn stop(&mut self) {
        let mut running = self.running.take().unwrap();
        running.signal(libc::SIGTERM);
        let status = running.child.wait().unwrap();
        assert!(status.success(), "{status}");
    }

    /// SIGKILL: no clean stop.
    fn kill(&mut self) {
        let mut running = self.running.take().unwrap();
        running.child.kill().unwrap();
        running.child.wait().unwrap();
    }

    /// Started again with its arguments, `upstream` replacing the value
    /// after `--upstream` (whose port changed when it restarted).
    fn restart(&mut self, upstream: Option<&str>) {
        if let Some(upstream) = upstream {
            let at = self.args.iter().position(|a| a == "--upstream").unwrap() + 1;
            self.args[at] = upstream.to_owned();
        }
        let refs: Vec<&str> = self.args.iter().map(String::as_str).collect();
        self.running = Some(Running::start(&refs));
    }

    /// `/.rproxy/stats`, parsed.
    fn stats(&self) -> Value {
        let (_, body) = curl(&[&format!("{}/.rproxy/stats", self.url())]);
        serde_json::from_slice(&body).unwrap()
    }

    /// The zone's figures in the stats.
    fn zone(&self) -> Value {
        self.stats()["feed"][0].clone()
    }
}

/// Runs curl with `args`: the response head (as text) and body.
fn curl(args: &[&str]) -> (String, Vec<u8>) {
    let out = Command::new("curl")
        .args(["-sS", "--max-time", "10", "-D", "-"])
        .args(args)
        .output()
        .expect("curl is needed");
    assert!(
        out.status.success(),
        "curl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = out.stdout;
    let end = text.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
    (
        String::from_utf8_lossy(&text[..end]).into_owned(),
        text[end..].to_vec(),
    )
}

/// A user agent's GET of `url` through the proxy at `proxy`.
fn get_through(proxy: &Node, url: &str) -> (String, Vec<u8>) {
    curl(&["-x", &proxy.url(), url])
}

fn version(n: usize, v: usize) -> Vec<u8> {
    // 20 KB of text per file, the last one 2.5 MB (a large body is stored
    // after its reader had its last byte); a version changes one line in
    // the middle.
    let lines = if n == FILES - 1 { 50_000 } else { 400 };
    let mut body = String::new();
    for line in 0..lines {
        if line == lines / 2 {
            body.push_str(&format!("file {n} version {v} of the zone's content\n"));
        } else {
            body.push_str(&format!(
                "file {n} line {line:04}: the quick brown fox jumps over\n"
            ));
        }
    }
    body.into_bytes()
}

/// That `body` is version `v` of file `n`; else which one it is (bodies
/// are too long to print).
fn assert_version(body: &[u8], n: usize, v: usize) {
    if body != version(n, v).as_slice() {
        let was = (0..20).find(|&other| body == version(n, other).as_slice());
        panic!(
            "file {n}: not version {v} but {was:?} ({} bytes)",
            body.len()
        );
    }
}

fn write_version(root: &Path, n: usize, v: usize) {
    let path = root.join("static").join(format!("f{n}.txt"));
    // Through a rename, so nginx never serves half a file.
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, version(n, v)).unwrap();
    std::fs::rename(&tmp, &path).unwrap();
}

/// POSTs `paths` as a submission through `proxy`: the accelerator's
/// answer.
fn submit(proxy: &Node, origin: &str, paths: &[String]) -> Value {
    let list = paths.join("\n");
    let (head, body) = curl(&[
        "-x",
        &proxy.url(),
        "-X",
        "POST",
        "--data-binary",
        &list,
        &format!("{origin}/.well-known/hsync-feed"),
    ]);
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    serde_json::from_slice(&body).unwrap()
}

/// Waits until `done` holds, within `limit`; the time it took.
fn within(limit: Duration, what: &str, mut done: impl FnMut() -> bool) -> Duration {
    let started = Instant::now();
    loop {
        if done() {
            return started.elapsed();
        }
        assert!(started.elapsed() < limit, "not within {limit:?}: {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn client_args(dir: &Path, name: &str, upstream: &str, zone: &str) -> Vec<String> {
    [
        "client",
        "--listen",
        "127.0.0.1:0",
        "--upstream",
        upstream,
        "--cache",
        dir.join(name).to_str().unwrap(),
        "--subscribe",
        zone,
        "--subscribe-interval",
        "1s",
        "--queue-callback",
        "127.0.0.1:0",
    ]
    .map(str::to_owned)
    .to_vec()
}

fn held_digest_of(n: usize, v: usize) -> String {
    blake3::hash(&version(n, v)).to_hex().to_string()
}

#[test]
fn zones_replicate_down_a_tree_of_client_proxies() {
    let dir = tempfile::tempdir().unwrap();
    let root: PathBuf = dir.path().join("www");
    std::fs::create_dir_all(root.join("static")).unwrap();
    for n in 0..FILES {
        write_version(&root, n, 1);
    }
    let nginx = Nginx::start(dir.path(), &root);
    let origin = format!("http://127.0.0.1:{}", nginx.port);
    let zone = format!("{origin}/static/");
    let urls: Vec<String> = (0..FILES).map(|n| format!("{zone}f{n}.txt")).collect();
    let paths: Vec<String> = (0..FILES).map(|n| format!("/static/f{n}.txt")).collect();

    let feed_dir = dir.path().join("feed");
    let mut accelerator = Node::start(
        [
            "accelerator",
            "--listen",
            "127.0.0.1:0",
            "--origin",
            &origin,
            "--feed-state",
            feed_dir.to_str().unwrap(),
        ]
        .map(str::to_owned)
        .to_vec(),
    );
    let mut a = Node::start(client_args(dir.path(), "a", &accelerator.url(), &zone));
    let mut b = Node::start(client_args(dir.path(), "b", &a.url(), &zone));

    // Users fetch version 1 through B: both caches hold it.
    for (n, url) in urls.iter().enumerate() {
        let (head, body) = get_through(&b, url);
        assert!(
            head.starts_with("HTTP/1.1 200"),
            "{head}{}",
            String::from_utf8_lossy(&body[..body.len().min(500)])
        );
        assert_version(&body, n, 1);
    }

    // Every node restarts (cleanly), in the order their addresses feed
    // each other.
    accelerator.stop();
    accelerator.restart(None);
    a.stop();
    a.restart(Some(&accelerator.url()));
    b.stop();
    b.restart(Some(&a.url()));
    // Each replica has pulled since it started (its log came back from disk).
    within(Duration::from_secs(5), "both replicas pulled", || {
        a.zone()["pulls"].as_u64() > Some(0) && b.zone()["pulls"].as_u64() > Some(0)
    });

    // A deploy changes the five files and submits them at B: the POST
    // goes up to the accelerator, which fetches and commits each.
    for n in 0..FILES {
        write_version(&root, n, 2);
    }
    let submitted = Instant::now();
    let results = submit(&b, &origin, &paths);
    let committed: Vec<u64> = results
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            assert_eq!(r["result"], "committed", "{results}");
            r["csn"].as_u64().unwrap()
        })
        .collect();
    let last = *committed.iter().max().unwrap();
    let limit = INTERVAL + Duration::from_secs(1);
    for (name, node) in [("A", &a), ("B", &b)] {
        within(
            limit.saturating_sub(submitted.elapsed()) + Duration::from_millis(1),
            &format!("{name} caught up to CSN {last}"),
            || node.zone()["csn"].as_u64() >= Some(last),
        );
    }
    let fresh_everywhere = submitted.elapsed();
    assert!(fresh_everywhere <= limit, "{fresh_everywhere:?}");
    for node in [&a, &b] {
        let zone = node.zone();
        assert_eq!(zone["prefetched"], FILES as u64, "{zone}");
        // Each was pushed by its upstream (the accelerator, A), rather
        // than waiting for its next pull.
        assert!(zone["pushed"].as_u64() >= Some(1), "{zone}");
    }

    // Users now get version 2 from each cache, fresh, with nothing from
    // upstream at that moment.
    for node in [&b, &a] {
        let before = node.stats()["upstream_bytes"].as_u64().unwrap();
        for (n, url) in urls.iter().enumerate() {
            let (head, body) = get_through(node, url);
            assert!(head.contains("cache-status: rproxy; hit"), "{head}");
            assert_version(&body, n, 2);
        }
        assert_eq!(node.stats()["upstream_bytes"].as_u64().unwrap(), before);
    }

    // B goes offline while f0 changes ten times, each change submitted at
    // A; when it is back it gets one update for f0, and the latest body.
    b.stop();
    let csn_before = a.zone()["csn"].as_u64().unwrap();
    for v in 3..13 {
        write_version(&root, 0, v);
        // "unchanged" when A's prefetch of the previous version reached
        // the origin after this write: the accelerator committed this
        // body as it served it.
        let results = submit(&a, &origin, &paths[..1]);
        let result = &results[0]["result"];
        assert!(result == "committed" || result == "unchanged", "{results}");
    }
    within(Duration::from_secs(5), "A caught up", || {
        a.zone()["prefetched"].as_u64() > Some(FILES as u64)
            && get_through(&a, &urls[0]).1 == version(0, 12)
    });
    let a_csn = a.zone()["csn"].as_u64().unwrap();
    assert!(
        a_csn >= csn_before + 5,
        "f0 changed at least five times in the feed: {csn_before} to {a_csn}"
    );
    let wanted = held_digest_of(0, 12);
    b.restart(Some(&a.url()));
    within(Duration::from_secs(5), "B caught up with A", || {
        b.zone()["csn"].as_u64() >= Some(a_csn)
    });
    let zone = b.zone();
    assert_eq!(zone["updates"], 1, "one update for ten changes: {zone}");
    assert_eq!(zone["prefetched"], 1, "{zone}");
    let (head, body) = get_through(&b, &urls[0]);
    assert!(head.contains("cache-status: rproxy; hit"), "{head}");
    assert_eq!(blake3::hash(&body).to_hex().to_string(), wanted);

    // The accelerator dies without writing its log cleanly: it comes back
    // with CSNs past the ones it gave out, its replicas reset, and a new
    // change still reaches both.
    accelerator.kill();
    accelerator.restart(None);
    a.stop();
    a.restart(Some(&accelerator.url()));
    b.stop();
    b.restart(Some(&a.url()));
    write_version(&root, 1, 3);
    let results = submit(&b, &origin, &paths[1..2]);
    assert_eq!(results[0]["result"], "committed", "{results}");
    let csn = results[0]["csn"].as_u64().unwrap();
    assert!(csn > a_csn + 1000, "CSNs skip ahead after a crash: {csn}");
    for node in [&a, &b] {
        within(Duration::from_secs(5), "caught up after the crash", || {
            node.zone()["csn"].as_u64() >= Some(csn)
        });
        assert!(node.zone()["resets"].as_u64() >= Some(1), "{}", node.zone());
        let (head, body) = get_through(node, &urls[1]);
        assert!(head.contains("cache-status: rproxy; hit"), "{head}");
        assert_version(&body, 1, 3);
    }
    drop(nginx);
}

#[test]
fn a_watched_document_root_reaches_the_replicas_without_a_submission() {
    let dir = tempfile::tempdir().unwrap();
    let root: PathBuf = dir.path().join("www");
    std::fs::create_dir_all(root.join("static")).unwrap();
    write_version(&root, 0, 1);
    let nginx = Nginx::start(dir.path(), &root);
    let origin = format!("http://127.0.0.1:{}", nginx.port);
    let zone = format!("{origin}/static/");
    let url = format!("{zone}f0.txt");
    let watch = format!("{}={origin}/", root.display());
    let accelerator = Node::start(
        [
            "accelerator",
            "--listen",
            "127.0.0.1:0",
            "--origin",
            &origin,
            "--feed-state",
            dir.path().join("feed").to_str().unwrap(),
            "--feed-watch",
            &watch,
            "--feed-watch-interval",
            "100ms",
        ]
        .map(str::to_owned)
        .to_vec(),
    );
    let client = Node::start(client_args(dir.path(), "c", &accelerator.url(), &zone));
    assert_version(&get_through(&client, &url).1, 0, 1);
    // Served, the path entered the feed; with a query (which may carry
    // what one user was given) it did not.
    let with_query = format!("{url}?token=alice");
    assert_version(&get_through(&client, &with_query).1, 0, 1);
    let (_, listing) = curl(&[
        "-H",
        &format!("Host: 127.0.0.1:{}", nginx.port),
        &format!("{}/.well-known/hsync-feed?since=0", accelerator.url()),
    ]);
    let listing: Value = serde_json::from_slice(&listing).unwrap();
    let paths: Vec<&str> = listing["updates"]
        .as_array()
        .unwrap()
        .iter()
        .map(|u| u["path"].as_str().unwrap())
        .collect();
    assert_eq!(paths, ["/static/f0.txt"], "{listing}");

    // A deploy that only writes the file: the walk sees it, the
    // accelerator commits it, the client proxy is pushed and prefetches.
    write_version(&root, 0, 2);
    within(
        Duration::from_secs(5),
        "the client proxy prefetched",
        || client.zone()["prefetched"].as_u64() >= Some(1),
    );
    let (head, body) = get_through(&client, &url);
    assert!(head.contains("cache-status: rproxy; hit"), "{head}");
    assert_version(&body, 0, 2);
    drop(nginx);
}
