//! `rproxy cache ls|show|purge` as an operator runs them, on a cache a
//! real `rproxy client` process filled through an accelerator: `ls` and
//! `show` read it while the proxy runs; `purge` leaves it alone then (and
//! so does a second proxy), and once the proxy is gone removes exactly
//! the entries under the prefix.

mod support;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::SystemTime;

use bytes::Bytes;
use http::Response;
use http_body_util::Full;
use rproxy::cache::store::Listing;
use rproxy::cache::{CacheKey, CacheStore, Completeness, NewEntry};
use support::proxy::eventually;
use support::topology::{Accelerator, Origin, accelerator_config, origin};
use support::user_agent::get;

/// The origin's paths and body sizes.
const BODIES: [(&str, usize); 3] = [
    ("/img/a.png", 1000),
    ("/img/b.png", 20_000),
    ("/js/app.js", 3000),
];

const LAST_MODIFIED: &str = "Sun, 06 Nov 1994 08:49:37 GMT";

fn body(path: &str) -> Vec<u8> {
    let len = BODIES.iter().find(|(p, _)| *p == path).unwrap().1;
    support::pseudo_text(path.len() as u64, len)
}

fn etag(path: &str) -> String {
    format!("\"v1-{}\"", path.trim_start_matches('/').replace('/', "-"))
}

/// An origin serving [`BODIES`], cacheable for an hour, with validators.
async fn start_origin() -> Origin {
    origin(|request, _| {
        let path = request.uri().path().to_owned();
        async move {
            Response::builder()
                .header("content-type", "application/octet-stream")
                .header("cache-control", "max-age=3600")
                .header("etag", etag(&path))
                .header("last-modified", LAST_MODIFIED)
                .body(Full::new(Bytes::from(body(&path))))
                .unwrap()
        }
    })
    .await
}

/// `rproxy ARGS`, to its end.
fn rproxy(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_rproxy"))
        .args(args)
        .env("NO_COLOR", "1")
        .output()
        .unwrap()
}

fn stdout(output: &Output) -> String {
    String::from_utf8(output.stdout.clone()).unwrap()
}

fn stderr(output: &Output) -> String {
    String::from_utf8(output.stderr.clone()).unwrap()
}

/// `rproxy client` as a child process with its cache in `cache`.
struct ClientProcess {
    child: Child,
    addr: SocketAddr,
}

impl ClientProcess {
    fn start(upstream: SocketAddr, cache: &Path) -> ClientProcess {
        let mut child = Command::new(env!("CARGO_BIN_EXE_rproxy"))
            .args(["client", "--listen", "127.0.0.1:0", "--memory-cache", "0"])
            .args(["--admin-listen", "off"])
            .arg("--upstream")
            .arg(format!("http://{upstream}"))
            .arg("--cache")
            .arg(cache)
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut log = BufReader::new(child.stderr.take().unwrap());
        let mut line = String::new();
        let addr = loop {
            line.clear();
            assert!(
                log.read_line(&mut line).unwrap() > 0,
                "the client ended before it was ready"
            );
            if let Some(listen) = line
                .split_whitespace()
                .find_map(|f| f.strip_prefix("listen="))
            {
                break listen.parse().unwrap();
            }
        };
        // Keep reading the log, so the child never blocks on a full pipe.
        std::thread::spawn(move || std::io::copy(&mut log, &mut std::io::sink()));
        ClientProcess { child, addr }
    }

    /// Stops the proxy and waits until it is gone.
    fn stop(&mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }
}

impl Drop for ClientProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// An origin, an accelerator and a client proxy process whose cache holds
/// every path of [`BODIES`].
struct Filled {
    origin: Origin,
    _accelerator: Accelerator,
    client: ClientProcess,
    cache: PathBuf,
    _dir: tempfile::TempDir,
}

impl Filled {
    async fn start() -> Filled {
        let origin = start_origin().await;
        let accelerator = Accelerator::start(accelerator_config(origin.addr)).await;
        let dir = tempfile::tempdir().unwrap();
        let cache = dir.path().join("cache");
        let client = ClientProcess::start(accelerator.addr, &cache);
        let filled = Filled {
            origin,
            _accelerator: accelerator,
            client,
            cache,
            _dir: dir,
        };
        for (path, _) in BODIES {
            get(filled.client.addr, &filled.url(path))
                .await
                .assert_body(path, &body(path));
        }
        eventually("every response stored", || {
            Listing::read(&filled.cache).is_ok_and(|l| l.entries.len() == BODIES.len())
        })
        .await;
        filled
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.origin.addr)
    }

    /// `rproxy cache ARGS --cache <this cache>`.
    fn cache(&self, args: &[&str]) -> Output {
        let mut line = vec!["cache"];
        line.extend_from_slice(args);
        line.extend(["--cache", self.cache.to_str().unwrap()]);
        rproxy(&line)
    }
}

/// Every file under `root` with its length and modification time.
fn files(root: &Path) -> Vec<(PathBuf, u64, SystemTime)> {
    let mut out: Vec<_> = walkdir::WalkDir::new(root)
        .into_iter()
        .map(|e| e.unwrap())
        .filter(|e| e.file_type().is_file())
        .map(|e| {
            let md = e.metadata().unwrap();
            (e.path().to_owned(), md.len(), md.modified().unwrap())
        })
        .collect();
    out.sort();
    out
}

/// What the budget counts for the entries under `url_prefix`: each of
/// their three files in whole 4 KiB blocks.
fn disk_bytes(cache: &Path, url_prefix: &str) -> u64 {
    let listing = Listing::read(cache).unwrap();
    let blocks = |path: PathBuf| std::fs::metadata(path).unwrap().len().div_ceil(4096) * 4096;
    listing
        .entries
        .iter()
        .filter(|e| e.url().starts_with(url_prefix))
        .flat_map(|e| ["meta", "body", "sig"].map(|ext| e.meta_path.with_extension(ext)))
        .map(blocks)
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ls_and_show_read_the_cache_of_a_running_proxy() {
    let filled = Filled::start().await;

    let ls = filled.cache(&["ls"]);
    assert!(ls.status.success(), "{}", stderr(&ls));
    let text = stdout(&ls);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), BODIES.len() + 1, "{text}");
    for ((path, len), line) in BODIES.iter().zip(&lines) {
        let fields: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(fields[0], "200", "{line}");
        assert_eq!(fields[1], len.to_string(), "{path}: {line}");
        assert_eq!(fields[3], "complete", "{line}");
        assert_eq!(fields[4], filled.url(path), "sorted by URL: {text}");
    }
    assert_eq!(lines[3], "3 entries (0 partial), 24000 body bytes");

    let images = filled.cache(&["ls", &filled.url("/img/")]);
    assert_eq!(stdout(&images).lines().count(), 3, "{}", stdout(&images));
    assert!(stdout(&images).contains("2 entries (0 partial), 21000 body bytes"));

    let json = filled.cache(&["ls", "--json", &filled.url("/js/")]);
    let objects: Vec<serde_json::Value> = stdout(&json)
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    assert_eq!(objects.len(), 1, "{}", stdout(&json));
    assert_eq!(objects[0]["url"], filled.url("/js/app.js"));
    assert_eq!(objects[0]["body_len"], 3000);
    // The origin's validator (the coding carried it weak, the client
    // proxy restored it).
    let stored_etag = objects[0]["etag"].as_str().unwrap();
    assert_eq!(stored_etag, etag("/js/app.js"));
    assert_eq!(objects[0]["lifetime"], 3600);
    let digest = blake3::hash(&body("/js/app.js")).to_hex().to_string();
    assert_eq!(objects[0]["body_blake3"], digest);

    let show = filled.cache(&["show", &filled.url("/js/app.js")]);
    assert!(show.status.success(), "{}", stderr(&show));
    let shown = stdout(&show);
    for expected in [
        format!("etag          {stored_etag}\n"),
        format!("last-modified {LAST_MODIFIED}"),
        format!("body          3000 bytes, complete, blake3 {digest}"),
        "status        200".to_owned(),
        "freshness     fresh for".to_owned(),
        "(lifetime 1h)".to_owned(),
        "  cache-control: max-age=3600".to_owned(),
    ] {
        assert!(shown.contains(&expected), "{expected:?} in\n{shown}");
    }

    // The URL is normalised as the proxy does: an upper-case host finds it.
    let upper = filled.url("/js/app.js").replace("http://", "HTTP://");
    assert!(filled.cache(&["show", &upper]).status.success());
    let missing = filled.cache(&["show", &filled.url("/nothing")]);
    assert_eq!(missing.status.code(), Some(1));
    assert!(
        stderr(&missing).contains("no entry for"),
        "{}",
        stderr(&missing)
    );
    assert_eq!(filled.cache(&["show", "not a url"]).status.code(), Some(64));

    // The directory from a client's configuration file.
    let config = filled._dir.path().join("client.toml");
    std::fs::write(&config, format!("cache = {:?}\n", filled.cache)).unwrap();
    let from_file = rproxy(&["cache", "ls", "--config", config.to_str().unwrap()]);
    // The same entries; their ages may have gone on by a second meanwhile.
    assert_eq!(without_ages(&stdout(&from_file)), without_ages(&text));
}

/// `cache ls` lines with the age column (the third) left out.
fn without_ages(listing: &str) -> Vec<Vec<&str>> {
    listing
        .lines()
        .map(|line| {
            let mut fields: Vec<&str> = line.split_whitespace().collect();
            if fields.len() > 3 && fields[0].parse::<u16>().is_ok() {
                fields.remove(2);
            }
            fields
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purge_leaves_a_running_proxy_s_cache_alone_and_then_removes_exactly_the_prefix() {
    let mut filled = Filled::start().await;
    let before = files(&filled.cache);
    let prefix = filled.url("/img/");
    let (image_bytes, script_bytes) = (
        disk_bytes(&filled.cache, &prefix),
        disk_bytes(&filled.cache, &filled.url("/js/")),
    );

    let refused = filled.cache(&["purge", &prefix]);
    assert_eq!(refused.status.code(), Some(1));
    let message = stderr(&refused);
    assert!(message.contains("nothing was purged"), "{message}");
    assert!(
        message.contains("admin listener (admin-listen)"),
        "{message}"
    );
    assert!(
        message.contains(&format!("curl -X PURGE 'http://ADMIN-ADDRESS/{prefix}'")),
        "{message}"
    );
    assert!(stdout(&refused).is_empty());
    assert_eq!(files(&filled.cache), before, "the files were touched");

    // A second proxy on the same directory is refused too.
    let second = Command::new(env!("CARGO_BIN_EXE_rproxy"))
        .args(["client", "--listen", "127.0.0.1:0", "--cache"])
        .arg(&filled.cache)
        .env("NO_COLOR", "1")
        .output()
        .unwrap();
    assert_eq!(second.status.code(), Some(1));
    assert!(
        stderr(&second).contains("another rproxy process uses this cache directory"),
        "{}",
        stderr(&second)
    );
    assert_eq!(
        files(&filled.cache),
        before,
        "the second proxy touched files"
    );

    filled.client.stop();
    let purged = filled.cache(&["purge", &prefix]);
    assert!(purged.status.success(), "{}", stderr(&purged));
    assert_eq!(
        stdout(&purged),
        format!("purged 2 entries, {image_bytes} bytes\n"),
        "{}",
        stderr(&purged)
    );

    let store = CacheStore::open(&filled.cache, 1 << 30).unwrap();
    assert_eq!(store.len(), 1);
    for (path, _) in BODIES {
        let key = CacheKey::parse(&filled.url(path)).unwrap();
        let kept = store.get(&key).is_some();
        assert_eq!(kept, !path.starts_with("/img/"), "{path}");
    }
    drop(store);
    let all = filled.cache(&["purge", "--all"]);
    assert_eq!(
        stdout(&all),
        format!("purged 1 entry, {script_bytes} bytes\n")
    );
    assert!(Listing::read(&filled.cache).unwrap().entries.is_empty());
}

#[test]
fn an_empty_prefix_without_all_is_refused_and_purges_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let store = CacheStore::open(dir.path(), 1 << 20).unwrap();
    let key = CacheKey::parse("http://example.com/kept").unwrap();
    let mut writer = store.begin(&key).unwrap();
    writer.write_body(b"kept").unwrap();
    let entry = NewEntry {
        status: 200,
        headers: Vec::new(),
        stored_at: 1,
        completeness: Completeness::Complete,
        shareable_as_basis: true,
        complete_len: None,
    };
    writer.commit(entry, b"").unwrap();
    drop(store);

    let cache = dir.path().to_str().unwrap();
    for line in [
        &["cache", "purge", "", "--cache", cache][..],
        &["cache", "purge", "--cache", cache],
    ] {
        let refused = rproxy(line);
        assert_eq!(refused.status.code(), Some(64), "{line:?}");
        assert!(stderr(&refused).contains("--all"), "{}", stderr(&refused));
    }
    assert_eq!(Listing::read(dir.path()).unwrap().entries.len(), 1);
}
