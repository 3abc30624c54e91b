//! The admin listener (issue 19, "Metrics" and "Status page"): `/metrics`
//! parses as the Prometheus text format and says what `/.rproxy/stats`
//! says (saved bytes are delivered − link in both); the status page,
//! rendered by a real browser (Debian's headless Chromium), shows the same
//! figures; the binary starts the listener where `--admin-listen` says,
//! and refuses one beyond loopback without an auth-file.
//!
//! Chromium is needed: a machine without it fails the page test, saying
//! how to install it. Set `RPROXY_KEEP_SCREENSHOT=1` to keep the page's
//! screenshot (the test prints where).

mod support;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::{HeaderValue, Response};
use http_body_util::Full;
use prometheus_parse::{Scrape, Value};
use rproxy::admin::{self, Admin, Source, Summary, UpstreamView};
use rproxy::config::Role;
use rproxy::http::auth::{AuthFile, basic_credentials};
use support::proxy::eventually;
use support::topology::{Chain, Origin, origin};
use support::user_agent::get;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A page of about 100 KB whose `n`th version differs from the first in
/// one line.
fn page(n: usize) -> Vec<u8> {
    let mut text = String::new();
    for line in 0..2000 {
        if line == 1000 {
            text.push_str(&format!("version {n}\n"));
        }
        text.push_str(&format!(
            "line {line}: the quick brown fox {}\n",
            line * 7919 % 1000
        ));
    }
    text.into_bytes()
}

/// `/page.html`: a new version per request, revalidated every time (a
/// delta the second time); anything else: a script fresh for an hour (a
/// hit the second time).
async fn site() -> Origin {
    origin(|request, earlier| async move {
        let (body, cache_control) = if request.uri().path() == "/page.html" {
            (page(earlier), "max-age=0")
        } else {
            (page(0), "max-age=3600")
        };
        let mut response = Response::new(Full::new(Bytes::from(body)));
        let headers = response.headers_mut();
        headers.insert("cache-control", HeaderValue::from_static(cache_control));
        headers.insert(
            "etag",
            HeaderValue::from_str(&format!("\"v{earlier}\"")).unwrap(),
        );
        response
    })
    .await
}

/// `GET path` on `addr` on a connection of its own, with `Authorization`
/// when given: (status, body).
async fn http_get(addr: SocketAddr, path: &str, authorization: Option<&str>) -> (u16, String) {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let credentials =
        authorization.map_or(String::new(), |value| format!("Authorization: {value}\r\n"));
    let request = format!(
        "GET {path} HTTP/1.1\r\nHost: admin.test\r\nConnection: close\r\n{credentials}\r\n"
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut answer))
        .await
        .expect("an answer within 10 s")
        .unwrap();
    let answer = String::from_utf8(answer).unwrap();
    let (head, body) = answer.split_once("\r\n\r\n").unwrap();
    let status = head[9..12].parse().unwrap();
    (status, body.to_owned())
}

/// `source`'s admin side.
fn admin_of(source: Arc<dyn Source>, role: Role, listen: SocketAddr) -> Arc<Admin> {
    let summary = Summary {
        role,
        listen,
        settings: vec![("cache-size".into(), "64M".into())],
        upstreams: vec![UpstreamView {
            name: "* -> the test's accelerator".into(),
        }],
    };
    Arc::new(Admin::new(source, summary, None))
}

/// Serves `admin` on a loopback port of its own.
fn serve_admin(admin: Arc<Admin>) -> SocketAddr {
    let listener = admin::bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(admin::serve(listener, admin, std::future::pending()));
    address
}

/// Through a chain (origin → accelerator → client proxy): a miss and a
/// hit of the script, a miss and then a delta of the page; returns when
/// every transfer is counted.
async fn traffic(chain: &Chain, origin: &Origin) {
    let proxy = chain.nearest();
    for path in ["/app.js", "/app.js", "/page.html", "/page.html"] {
        let fetched = get(proxy.addr, &origin.url(path)).await;
        assert_eq!(fetched.status, 200, "{path}");
        assert!(fetched.body.is_ok(), "{path}");
    }
    // Counted when each body ends, after the user agent has it.
    eventually("both stored, the page twice", || proxy.stats().stored == 3).await;
    assert_eq!(proxy.stats().hits, 1, "{:?}", proxy.stats());
    assert_eq!(proxy.stats().basis_same_url, 1, "{:?}", proxy.stats());
}

/// The parsed exposition's value of `name` (with `label` = `value`, when
/// given).
fn sample(scrape: &Scrape, name: &str, label: Option<(&str, &str)>) -> f64 {
    let found = scrape
        .samples
        .iter()
        .find(|s| {
            s.metric == name && label.is_none_or(|(key, value)| s.labels.get(key) == Some(value))
        })
        .unwrap_or_else(|| panic!("no {name} {label:?} in the exposition"));
    match &found.value {
        Value::Counter(v) | Value::Gauge(v) | Value::Untyped(v) => *v,
        other => panic!("{name}: {other:?}"),
    }
}

async fn scrape(admin: SocketAddr) -> (Scrape, String) {
    let (status, text) = http_get(admin, "/metrics", None).await;
    assert_eq!(status, 200);
    let lines = text.lines().map(|line| Ok(line.to_owned()));
    (Scrape::parse(lines).expect("the exposition parses"), text)
}

async fn json_stats(addr: SocketAddr) -> serde_json::Value {
    let (status, body) = http_get(addr, "/.rproxy/stats", None).await;
    assert_eq!(status, 200);
    serde_json::from_str(&body).unwrap()
}

#[tokio::test]
async fn metrics_parse_and_saved_bytes_are_what_the_stats_say() {
    let origin = site().await;
    let chain = Chain::start(origin.addr, 1).await;
    traffic(&chain, &origin).await;
    // A refusal of the accelerator's own: a site it does not serve.
    let refused = get(chain.accelerator.addr, "http://elsewhere.test/x").await;
    assert_ne!(refused.status, 200);

    for (role, proxy_addr, source) in [
        (
            Role::Client,
            chain.nearest().addr,
            chain.nearest().handler.clone() as Arc<dyn Source>,
        ),
        (
            Role::Accelerator,
            chain.accelerator.addr,
            chain.accelerator.handler.clone() as Arc<dyn Source>,
        ),
    ] {
        let admin = serve_admin(admin_of(source, role, proxy_addr));
        let (scrape, text) = scrape(admin).await;
        let stats = json_stats(proxy_addr).await;
        let delivered = sample(&scrape, "rproxy_delivered_bytes_total", None);
        let link = sample(&scrape, "rproxy_link_bytes_total", None);
        assert!(delivered > 0.0 && link > 0.0, "{role:?}: {text}");
        let saved = delivered - link;
        assert!(
            saved > 0.0,
            "{role:?}: a delta and a hit save bytes: {text}"
        );
        assert_eq!(
            saved,
            stats["saved_bytes"].as_f64().unwrap(),
            "{role:?}: {stats}"
        );
        assert_eq!(delivered, stats["delivered_bytes"].as_f64().unwrap());
        assert_eq!(link, stats["link_bytes"].as_f64().unwrap());
        assert_eq!(
            sample(&scrape, "rproxy_requests_total", None),
            stats["requests"].as_f64().unwrap()
        );
        // Refusals by reason add up to those by fault (RELIABILITY's
        // "clear error": a counter with a stable reason).
        let sum = |name: &str| -> f64 {
            scrape
                .samples
                .iter()
                .filter(|s| s.metric == name)
                .map(|s| match &s.value {
                    Value::Counter(v) => *v,
                    other => panic!("{name}: {other:?}"),
                })
                .sum()
        };
        let by_reason = sum("rproxy_refused_by_reason_total");
        assert_eq!(by_reason, sum("rproxy_refused_requests_total"), "{text}");
        if role == Role::Accelerator {
            assert!(by_reason >= 1.0, "{text}");
        }
        let delta = sample(
            &scrape,
            "rproxy_request_outcomes_total",
            Some(("outcome", "delta")),
        );
        let deltas = if role == Role::Client {
            "deltas"
        } else {
            "coded"
        };
        assert_eq!(delta, stats[deltas].as_f64().unwrap(), "{role:?}");
        // The latency histogram: one answer per trip upstream.
        let histogram = scrape
            .samples
            .iter()
            .find(|s| s.metric == "rproxy_upstream_response_seconds")
            .expect("the latency histogram");
        let Value::Histogram(buckets) = &histogram.value else {
            panic!("{histogram:?}");
        };
        let answers = stats["upstream_responses"].as_f64().unwrap();
        assert!(answers >= 3.0, "{role:?}: {stats}");
        assert_eq!(buckets.last().unwrap().count, answers, "{role:?}: +Inf");
        assert_eq!(
            sample(&scrape, "rproxy_upstream_response_seconds_count", None),
            answers
        );
        if role == Role::Client {
            assert_eq!(
                sample(
                    &scrape,
                    "rproxy_request_outcomes_total",
                    Some(("outcome", "hit"))
                ),
                stats["hits"].as_f64().unwrap()
            );
            assert_eq!(
                sample(&scrape, "rproxy_cache_entries", None),
                stats["cache_entries"].as_f64().unwrap()
            );
            assert_eq!(sample(&scrape, "rproxy_cache_entries", None), 2.0);
            assert_eq!(
                sample(
                    &scrape,
                    "rproxy_basis_choices_total",
                    Some(("basis", "same_url"))
                ),
                1.0,
                "the page's second fetch offered its own entry"
            );
        }
    }
}

/// Runs Debian's Chromium headless with `args`; its stdout.
async fn chromium(args: &[&str]) -> String {
    let run = tokio::process::Command::new("chromium")
        .args(["--headless", "--no-sandbox", "--disable-gpu"])
        .args(args)
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .output();
    let output = match tokio::time::timeout(Duration::from_secs(120), run).await {
        Ok(Ok(output)) => output,
        Ok(Err(error)) if error.kind() == std::io::ErrorKind::NotFound => panic!(
            "chromium is not installed: the status page is tested in a real browser; \
             install Debian's (apt-get install chromium)"
        ),
        Ok(Err(error)) => panic!("cannot run chromium: {error}"),
        Err(_) => panic!("chromium did not finish within 120 s"),
    };
    assert!(
        output.status.success(),
        "chromium {args:?}: {:?}",
        output.status
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

#[tokio::test]
async fn a_browser_renders_the_status_page_with_the_figures_of_the_stats() {
    let origin = site().await;
    let chain = Chain::start(origin.addr, 1).await;
    let proxy = chain.nearest();
    let admin = admin_of(proxy.handler.clone(), Role::Client, proxy.addr);
    // Samples 20 s and 10 s ago, around the traffic (the listener's own
    // sampler adds one now): the chart has a bar to draw.
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs();
    admin.sample(now - 20);
    traffic(&chain, &origin).await;
    admin.sample(now - 10);
    let admin = serve_admin(admin);
    let stats = json_stats(proxy.addr).await;
    let url = format!("http://{admin}/");

    let dom = chromium(&["--dump-dom", &url]).await;
    let saved = format!("<span id=\"saved-bytes\">{}</span>", stats["saved_bytes"]);
    assert!(dom.contains(&saved), "{saved} not in {dom}");
    let hits = format!("id=\"outcome-hit\">{}<", stats["hits"]);
    assert!(dom.contains(&hits), "{hits} not in {dom}");
    let deltas = format!("id=\"outcome-delta\">{}<", stats["deltas"]);
    assert!(dom.contains(&deltas), "{deltas} not in {dom}");
    assert!(
        dom.contains("aria-label=\"saved bytes\"><rect"),
        "the chart: {dom}"
    );
    for text in [
        "rproxy client proxy",
        "Savings",
        "Cache",
        "Queue",
        "Upstreams",
        "Configuration",
    ] {
        assert!(dom.contains(text), "{text} not in {dom}");
    }
    assert!(
        !dom.contains("/page.html") && !dom.contains("/app.js"),
        "no requested URL on the page (A-11)"
    );

    let dir = tempfile::Builder::new()
        .prefix("rproxy-status-")
        .tempdir()
        .unwrap();
    let shot = dir.path().join("status.png");
    let screenshot = format!("--screenshot={}", shot.display());
    chromium(&[&screenshot, "--window-size=1024,768", &url]).await;
    let png = std::fs::read(&shot).expect("chromium wrote the screenshot");
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"), "a PNG");
    assert!(png.len() > 10_000, "{} bytes: a blank page?", png.len());
    if std::env::var_os("RPROXY_KEEP_SCREENSHOT").is_some() {
        eprintln!(
            "the status page: {}",
            dir.keep().join("status.png").display()
        );
    }
}

/// `rproxy ROLE ARGS` with its log read until the ready line; the child
/// and (listen, admin) from that line.
fn start_binary(args: &[&str]) -> (Child, SocketAddr, Option<SocketAddr>) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_rproxy"))
        .args(args)
        // An accelerator's spool and basis store default to the temp
        // directory: the target's, not the machine's.
        .env("TMPDIR", env!("CARGO_TARGET_TMPDIR"))
        .env("RUST_LOG", "info")
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut log = BufReader::new(child.stderr.take().unwrap());
    let mut line = String::new();
    loop {
        line.clear();
        assert!(log.read_line(&mut line).unwrap() > 0, "ended before ready");
        if line.contains(" ready ") {
            break;
        }
    }
    std::thread::spawn(move || std::io::copy(&mut log, &mut std::io::sink()));
    let field = |name: &str| {
        line.split_whitespace()
            .find_map(|field| field.strip_prefix(name))
            .map(str::to_owned)
    };
    let listen = field("listen=").unwrap().parse().unwrap();
    let admin = field("admin=").expect("the ready line names the admin listener");
    let admin = (admin != "off").then(|| {
        let admin: SocketAddr = admin.parse().unwrap();
        SocketAddr::from(([127, 0, 0, 1], admin.port()))
    });
    (child, listen, admin)
}

#[tokio::test]
async fn the_binary_serves_metrics_and_the_page_where_admin_listen_says() {
    let (mut child, listen, admin) = start_binary(&[
        "accelerator",
        "--listen",
        "127.0.0.1:0",
        "--admin-listen",
        "127.0.0.1:0",
        "--origin",
        "http://127.0.0.1:9",
    ]);
    let admin = admin.unwrap();
    assert_ne!(admin, listen);
    let (_, text) = scrape(admin).await;
    assert!(
        text.contains("rproxy_build_info{version=\"0.1.0\",role=\"accelerator\"} 1"),
        "{text}"
    );
    let (status, page) = http_get(admin, "/", None).await;
    assert_eq!(status, 200);
    assert!(page.contains("rproxy accelerator"), "{page}");
    assert!(page.contains(&format!("listening on {listen}")), "{page}");
    // Not on the proxy port: there `/metrics` is a path of the origin's.
    let (status, _) = http_get(listen, "/metrics", None).await;
    assert_ne!(status, 200);
    child.kill().unwrap();
    child.wait().unwrap();

    let (mut child, _, admin) = start_binary(&[
        "accelerator",
        "--listen",
        "127.0.0.1:0",
        "--admin-listen",
        "off",
        "--origin",
        "http://127.0.0.1:9",
    ]);
    assert_eq!(admin, None);
    child.kill().unwrap();
    child.wait().unwrap();
}

#[test]
fn an_admin_listener_beyond_loopback_needs_the_auth_file_and_never_the_proxy_port() {
    for (flags, says) in [
        (
            ["--listen", "127.0.0.1:0", "--admin-listen", "0.0.0.0:0"],
            "--auth-file",
        ),
        (
            [
                "--listen",
                "127.0.0.1:18082",
                "--admin-listen",
                "127.0.0.1:18082",
            ],
            "one socket",
        ),
    ] {
        for role in ["client", "accelerator"] {
            let output = Command::new(env!("CARGO_BIN_EXE_rproxy"))
                .arg(role)
                .args(flags)
                .env("TMPDIR", env!("CARGO_TARGET_TMPDIR"))
                .stdin(Stdio::null())
                .output()
                .unwrap();
            let stderr = String::from_utf8_lossy(&output.stderr);
            assert_eq!(output.status.code(), Some(64), "{role} {flags:?}: {stderr}");
            assert!(stderr.contains("--admin-listen"), "{stderr}");
            assert!(stderr.contains(says), "{stderr}");
        }
    }
}

#[tokio::test]
async fn beyond_loopback_the_admin_listener_asks_for_the_roles_users() {
    let dir = tempfile::tempdir().unwrap();
    let users = dir.path().join("users");
    let mut file = AuthFile::default();
    file.set("alice", "wonderland").unwrap();
    file.save(&users).unwrap();
    let cache = dir.path().join("cache");
    let (mut child, _, admin) = start_binary(&[
        "client",
        "--listen",
        "127.0.0.1:0",
        "--admin-listen",
        "0.0.0.0:0",
        "--auth-file",
        users.to_str().unwrap(),
        "--cache",
        cache.to_str().unwrap(),
    ]);
    let admin = admin.unwrap();
    let (status, _) = http_get(admin, "/metrics", None).await;
    assert_eq!(status, 401, "no credentials");
    let wrong = basic_credentials("alice", "looking-glass");
    let (status, _) = http_get(admin, "/metrics", Some(wrong.to_str().unwrap())).await;
    assert_eq!(status, 401, "a wrong password");
    let right = basic_credentials("alice", "wonderland");
    let (status, text) = http_get(admin, "/metrics", Some(right.to_str().unwrap())).await;
    assert_eq!(status, 200, "{text}");
    assert!(text.contains("rproxy_cache_budget_bytes"), "{text}");
    // The default transfer memory, none of it taken by an idle proxy.
    assert!(
        text.contains("rproxy_transfer_memory_budget_bytes 268435456\n"),
        "{text}"
    );
    assert!(text.contains("rproxy_transfer_memory_bytes 0\n"), "{text}");
    child.kill().unwrap();
    child.wait().unwrap();
}

/// `METHOD target` on `addr` on a connection of its own: (status, body).
async fn http_request(addr: SocketAddr, method: &str, target: &str) -> (u16, String) {
    http_request_with(addr, method, target, "").await
}

/// `POST target` with `body` on `addr`: (status, body).
async fn http_post(addr: SocketAddr, target: &str, body: &str) -> (u16, String) {
    http_request_with(addr, "POST", target, body).await
}

/// `METHOD target` with `body` on `addr` on a connection of its own:
/// (status, body).
async fn http_request_with(
    addr: SocketAddr,
    method: &str,
    target: &str,
    body: &str,
) -> (u16, String) {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let length = if body.is_empty() {
        String::new()
    } else {
        format!("Content-Length: {}\r\n", body.len())
    };
    let request =
        format!("{method} {target} HTTP/1.1\r\nHost: h\r\nConnection: close\r\n{length}\r\n{body}");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut answer))
        .await
        .expect("an answer within 10 s")
        .unwrap();
    let answer = String::from_utf8_lossy(&answer).into_owned();
    let (head, body) = answer.split_once("\r\n\r\n").unwrap();
    (head[9..12].parse().unwrap(), body.to_owned())
}

#[tokio::test]
async fn purge_on_the_admin_listener_removes_a_url_prefix_from_a_running_cache() {
    let origin = site().await;
    let dir = tempfile::tempdir().unwrap();
    let (mut child, proxy, admin) = start_binary(&[
        "client",
        "--listen",
        "127.0.0.1:0",
        "--admin-listen",
        "127.0.0.1:0",
        "--upstream",
        &format!("http://{}", origin.addr),
        "--cache",
        dir.path().join("cache").to_str().unwrap(),
        "--access-log",
        "off",
    ]);
    let admin = admin.unwrap();
    let (a, b) = (origin.url("/a/app.js"), origin.url("/b/app.js"));
    for url in [&a, &b, &a, &b] {
        assert_eq!(http_request(proxy, "GET", url).await.0, 200, "{url}");
    }
    assert_eq!(origin.requests(), 2, "the second of each was a hit");

    let prefix = format!("/http://{}/a/", origin.addr);
    let (status, body) = http_request(admin, "PURGE", &prefix).await;
    assert_eq!(status, 200, "{body}");
    let report: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(report["entries"], 1, "{body}");
    assert!(report["bytes"].as_u64().unwrap() > 0, "{body}");
    for url in [&a, &b] {
        assert_eq!(http_request(proxy, "GET", url).await.0, 200, "{url}");
    }
    assert_eq!(origin.requests_to("/a/app.js"), 2, "purged: fetched again");
    assert_eq!(
        origin.requests_to("/b/app.js"),
        1,
        "outside the prefix: a hit"
    );

    let (status, body) = http_request(admin, "PURGE", "/").await;
    assert_eq!(status, 400, "an empty prefix is not everything: {body}");
    let (status, body) = http_request(admin, "PURGE", "/*").await;
    let report: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!((status, &report["entries"]), (200, &2.into()), "{body}");

    // The accelerator keeps no cache to purge.
    let (mut accelerator, _, accelerator_admin) = start_binary(&[
        "accelerator",
        "--listen",
        "127.0.0.1:0",
        "--admin-listen",
        "127.0.0.1:0",
        "--origin",
        "http://127.0.0.1:9",
        "--access-log",
        "off",
    ]);
    let (status, _) = http_request(accelerator_admin.unwrap(), "PURGE", "/*").await;
    assert_eq!(status, 501);
    accelerator.kill().unwrap();
    accelerator.wait().unwrap();
    child.kill().unwrap();
    child.wait().unwrap();
}

#[tokio::test]
async fn a_change_feed_submission_on_either_admin_listener_reaches_the_accelerator() {
    let origin = site().await;
    let dir = tempfile::tempdir().unwrap();
    let (mut accelerator, accelerator_addr, accelerator_admin) = start_binary(&[
        "accelerator",
        "--listen",
        "127.0.0.1:0",
        "--admin-listen",
        "127.0.0.1:0",
        "--origin",
        &format!("http://{}", origin.addr),
        "--feed-state",
        dir.path().join("feed").to_str().unwrap(),
        "--access-log",
        "off",
    ]);
    let (mut client, _, client_admin) = start_binary(&[
        "client",
        "--listen",
        "127.0.0.1:0",
        "--admin-listen",
        "127.0.0.1:0",
        "--upstream",
        &format!("http://{accelerator_addr}"),
        "--cache",
        dir.path().join("cache").to_str().unwrap(),
        "--access-log",
        "off",
    ]);
    let (accelerator_admin, client_admin) = (accelerator_admin.unwrap(), client_admin.unwrap());
    let script = origin.url("/app.js");
    let results = |body: &str| -> Vec<(String, Option<u64>)> {
        let list: serde_json::Value = serde_json::from_str(body).unwrap();
        list.as_array()
            .unwrap()
            .iter()
            .map(|r| (r["result"].as_str().unwrap().to_owned(), r["csn"].as_u64()))
            .collect()
    };

    // The accelerator fetches the URL and commits its body, once.
    let (status, body) = http_post(accelerator_admin, "/feed", &script).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        results(&body),
        [("committed".to_owned(), Some(1))],
        "{body}"
    );
    let (_, body) = http_post(accelerator_admin, "/feed", &format!("{script}\n")).await;
    assert_eq!(results(&body), [("unchanged".to_owned(), None)], "{body}");
    assert_eq!(origin.requests_to("/app.js"), 2);

    // A client proxy passes a submission up (ANTACID's ars-s): a page
    // whose body changed since is committed next.
    let page = origin.url("/page.html");
    let (status, body) = http_post(client_admin, "/feed", &format!("{script}\n{page}")).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        results(&body),
        [
            ("unchanged".to_owned(), None),
            ("committed".to_owned(), Some(2))
        ],
        "{body}"
    );
    // What is not a URL is said to be so, and commits nothing.
    let (_, body) = http_post(accelerator_admin, "/feed", "/app.js").await;
    assert_eq!(results(&body), [("failed".to_owned(), None)], "{body}");
    // The site's log, in the metrics.
    let (metrics, _) = scrape(accelerator_admin).await;
    let site = origin.addr.to_string();
    let site = Some(("zone", site.as_str()));
    assert_eq!(sample(&metrics, "rproxy_feed_csn", site), 2.0);
    assert_eq!(sample(&metrics, "rproxy_feed_entries", site), 2.0);

    accelerator.kill().unwrap();
    accelerator.wait().unwrap();
    client.kill().unwrap();
    client.wait().unwrap();
}
