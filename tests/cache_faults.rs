//! Real faults under the client proxy's cache, no mocks: the `rproxy
//! client` binary with its cache directory on a disk that fills up
//! (RELIABILITY C-E1), and the same binary killed with SIGKILL in the middle
//! of a cache write, then restarted on the same directory (C-K1, C-K2's
//! "entry absent or valid"), and C-K1's crash loop (10 iterations here,
//! 200 in the ignored test `scripts/crash-loop.sh` runs). Also a body
//! truncated on disk by another process (C-E3).
//!
//! The full disk is a 1 MiB tmpfs mounted over the cache directory in a
//! mount namespace of the proxy's own (`unshare -m` as root, `unshare -rm`
//! otherwise), so nothing is left mounted when the process dies; the test
//! sees the proxy's view of the directory through `/proc/PID/root`. Where
//! no namespace can be made, it falls back to `RLIMIT_FSIZE` on the proxy
//! (which handles SIGXFSZ itself, so writes past the limit fail with EFBIG
//! rather than kill it).
//! `RPROXY_TEST_DISK_FAULT=fsize` forces the fallback. The test prints
//! which fault it used.
//!
//! Behind the proxy: the accelerator (in this process) and an origin
//! written here that can stall or cut a body after a given number of bytes,
//! so the proxy is mid-write when it is killed.

mod support;

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Empty};
use hyper::body::{Frame, Incoming};
use hyper_util::rt::TokioIo;
use rproxy::accelerator::AcceleratorConfig;
use rproxy::cache::{Completeness, EntryMeta};
use support::proxy::eventually;
use support::topology::{Accelerator, Origin, origin};
use support::user_agent::{Fetched, get, start_get};
use support::{pseudo_text, random_bytes};
use tokio::net::TcpStream;
use tokio::sync::mpsc;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

// ---------------------------------------------------------------------------
// The origin

/// What the origin does with one request.
#[derive(Debug, Clone, Copy)]
enum Reply {
    /// The whole body.
    Full,
    /// The first `n` bytes, then nothing until the reader goes away.
    StallAfter(usize),
    /// The first `n` bytes, then the body fails (the connection is cut).
    CutAfter(usize),
}

/// The body the origin serves at `path`: random bytes under `/random/`
/// (so a delta cannot shrink what was not sent before), text elsewhere;
/// `/rel-N.js` are releases of one script that differ a little.
fn origin_body(path: &str) -> Vec<u8> {
    let seed = u64::from_le_bytes(
        blake3::hash(path.as_bytes()).as_bytes()[..8]
            .try_into()
            .unwrap(),
    );
    let len = if path.contains("big") {
        1_536 << 10
    } else {
        96 << 10
    };
    if path.starts_with("/random/") {
        return random_bytes(seed, 1 << 20);
    }
    if let Some(n) = path
        .strip_prefix("/rel-")
        .and_then(|p| p.strip_suffix(".js"))
    {
        let mut body = pseudo_text(7, len);
        let at = n.parse::<usize>().unwrap() * 997;
        body.splice(at..at, format!("/* release {n} */").bytes());
        return body;
    }
    pseudo_text(seed, len)
}

/// A body fed from a channel, so the origin can stop or fail half-way.
struct ChannelBody(mpsc::Receiver<Result<Frame<Bytes>, BoxError>>);

impl hyper::body::Body for ChannelBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        self.0.poll_recv(cx)
    }
}

/// Starts the origin; `script(path, n)` says what the `n`-th request (from
/// 0) for `path` gets. Bodies are cacheable for an hour; `/plain/` ones are
/// `no-transform`, so the accelerator passes them uncoded.
async fn start_origin(script: impl Fn(&str, usize) -> Reply + Send + Sync + 'static) -> Origin {
    origin(move |request, n| {
        let path = request.uri().path();
        let reply = origin_reply(path, n, script(path, n));
        async move { reply }
    })
    .await
}

/// Version `n` (the `n`-th request, from 0) of the crash loop's body at
/// `path`: random bytes, 0 to 8 MiB.
fn crash_body(path: &str, n: usize) -> Vec<u8> {
    let seed = u64::from_le_bytes(
        blake3::hash(format!("{path}#{n}").as_bytes()).as_bytes()[..8]
            .try_into()
            .unwrap(),
    );
    let len = (seed >> 8) % (8 << 20);
    random_bytes(seed, len as usize)
}

fn origin_reply(path: &str, n: usize, reply: Reply) -> Response<ChannelBody> {
    let body = Bytes::from(if path.starts_with("/crash/") {
        crash_body(path, n)
    } else {
        origin_body(path)
    });
    let etag = format!("\"{}\"", &blake3::hash(&body).to_hex()[..16]);
    let (tx, rx) = mpsc::channel(2);
    let len = body.len();
    tokio::spawn(async move {
        let end = match reply {
            Reply::Full => len,
            Reply::StallAfter(n) | Reply::CutAfter(n) => n,
        };
        let mut at = 0;
        while at < end {
            let next = (at + (64 << 10)).min(end);
            if tx
                .send(Ok(Frame::data(body.slice(at..next))))
                .await
                .is_err()
            {
                return;
            }
            at = next;
        }
        match reply {
            Reply::Full => {}
            Reply::StallAfter(_) => tx.closed().await,
            Reply::CutAfter(_) => {
                tokio::time::sleep(Duration::from_millis(30)).await;
                let _ = tx.send(Err("origin cut the body".into())).await;
            }
        }
    });
    let cache_control = if path.starts_with("/plain/") {
        "max-age=3600, no-transform"
    } else {
        "max-age=3600"
    };
    Response::builder()
        .header("content-length", len)
        .header("content-type", "application/javascript")
        .header("cache-control", cache_control)
        .header("etag", etag)
        .body(ChannelBody(rx))
        .unwrap()
}

/// The accelerator in front of `origin`, in this process, with small
/// windows so a stalled origin still lets most of what it sent through.
/// Otherwise `rproxy accelerator`'s own defaults, as this file always ran
/// it, rather than `accelerator_config`'s shorter origin timeout: the
/// origin here stalls on purpose.
async fn start_accelerator(origin: SocketAddr) -> Accelerator {
    let mut config = AcceleratorConfig::for_origin(format!("http://{origin}").parse().unwrap());
    config.encoder.window_bytes = 64 << 10;
    config.encoder.zstd_level = 3;
    // It keeps no body, so every basis goes by its signature and a coded
    // body reaches the user agent as its SIG frames vouch for it: these
    // tests stop the proxy in the middle of a body. (Against a body it
    // held, the stream would come without SIG frames and wait for END.)
    config.basis_store_bytes = 0;
    config.basis_disk = None;
    Accelerator::start(config).await
}

// ---------------------------------------------------------------------------
// The disk fault

/// How the proxy's disk is made to fill up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum DiskFault {
    /// A 1 MiB tmpfs over the cache directory, in a mount namespace made by
    /// `unshare` with these flags.
    Tmpfs { unshare: &'static str },
    /// `RLIMIT_FSIZE` of 1 MiB on the proxy, whose SIGXFSZ handler turns a
    /// write past it into EFBIG. "Full" lowers it to 0.
    FileSizeLimit,
}

/// The tmpfs size, and the file-size limit of the fallback.
const DISK_BYTES: usize = 1 << 20;

impl DiskFault {
    /// A tmpfs in a namespace when this machine lets us make one (root, or
    /// user namespaces allowed), else the file-size limit.
    fn detect() -> DiskFault {
        if std::env::var("RPROXY_TEST_DISK_FAULT").as_deref() == Ok("fsize") {
            return DiskFault::FileSizeLimit;
        }
        let probe = tempfile::tempdir().unwrap();
        let root = is_root();
        let flags: &[&'static str] = if root { &["-m", "-rm"] } else { &["-rm"] };
        for &unshare in flags {
            let mounted = Command::new("unshare")
                .args([
                    unshare,
                    "sh",
                    "-c",
                    "mount -t tmpfs -o size=64k rproxy-probe \"$0\"",
                ])
                .arg(probe.path())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            if mounted {
                return DiskFault::Tmpfs { unshare };
            }
        }
        DiskFault::FileSizeLimit
    }

    /// The command that runs `rproxy ARGS` with this fault on `cache`.
    fn command(self, cache: &Path) -> Command {
        match self {
            DiskFault::Tmpfs { unshare } => {
                let mut command = Command::new("unshare");
                command.args([
                    unshare,
                    "sh",
                    "-c",
                    &format!(
                        "mount -t tmpfs -o size={DISK_BYTES} rproxy-cache \"$0\" && exec \"$@\""
                    ),
                ]);
                command.arg(cache).arg(env!("CARGO_BIN_EXE_rproxy"));
                command
            }
            DiskFault::FileSizeLimit => {
                let mut command = Command::new("sh");
                command.args([
                    "-c",
                    &format!("exec prlimit --fsize={DISK_BYTES}: \"$0\" \"$@\""),
                    env!("CARGO_BIN_EXE_rproxy"),
                ]);
                command
            }
        }
    }

    /// The cache directory as the proxy with pid `pid` sees it.
    fn view(self, pid: u32, cache: &Path) -> PathBuf {
        match self {
            DiskFault::Tmpfs { .. } => {
                Path::new(&format!("/proc/{pid}/root")).join(cache.strip_prefix("/").unwrap())
            }
            DiskFault::FileSizeLimit => cache.to_path_buf(),
        }
    }

    /// Leaves no room for another byte.
    fn fill(self, pid: u32, cache: &Path) {
        match self {
            DiskFault::Tmpfs { .. } => {
                let mut filler =
                    std::fs::File::create(self.view(pid, cache).join("filler")).unwrap();
                let block = vec![0xa5u8; 4096];
                let error = loop {
                    if let Err(e) = filler.write_all(&block) {
                        break e;
                    }
                };
                assert_eq!(error.raw_os_error(), Some(libc::ENOSPC), "{error}");
            }
            DiskFault::FileSizeLimit => prlimit(pid, "0:"),
        }
    }

    /// Gives the room back.
    fn free(self, pid: u32, cache: &Path) {
        match self {
            DiskFault::Tmpfs { .. } => {
                std::fs::remove_file(self.view(pid, cache).join("filler")).unwrap()
            }
            DiskFault::FileSizeLimit => prlimit(pid, &format!("{DISK_BYTES}:")),
        }
    }
}

fn prlimit(pid: u32, fsize: &str) {
    let status = Command::new("prlimit")
        .args(["--pid", &pid.to_string(), &format!("--fsize={fsize}")])
        .status()
        .expect("prlimit (util-linux) runs");
    assert!(status.success(), "prlimit --fsize={fsize} on {pid}");
}

/// Whether we run as root (`id -u`; the crate's tests use no unsafe).
fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| o.stdout.trim_ascii() == b"0")
}

// ---------------------------------------------------------------------------
// The client proxy process

/// `rproxy client` running in a child process, its log lines collected.
struct ClientProcess {
    child: Child,
    addr: SocketAddr,
    logs: Arc<Mutex<Vec<String>>>,
}

impl ClientProcess {
    /// Starts `command` (the binary, or a wrapper that ends by running it)
    /// as a client proxy for `upstream` with its cache in `cache`, and
    /// waits for it to listen.
    async fn start(command: Command, upstream: SocketAddr, cache: &Path) -> ClientProcess {
        // The budget is far above the disk: the disk fills first.
        ClientProcess::start_logging(command, upstream, cache, "64M", "info").await
    }

    /// [`ClientProcess::start`] with a cache budget of `cache_size` and
    /// `RUST_LOG=rust_log`.
    async fn start_logging(
        mut command: Command,
        upstream: SocketAddr,
        cache: &Path,
        cache_size: &str,
        rust_log: &str,
    ) -> ClientProcess {
        command
            .args(["client", "--listen", "127.0.0.1:0", "--admin-listen", "off"])
            .arg("--upstream")
            .arg(format!("http://{upstream}"))
            .arg("--cache")
            .arg(cache)
            .args(["--cache-size", cache_size, "--memory-cache", "0"])
            .env("RUST_LOG", rust_log)
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut child = command.spawn().expect("rproxy client starts");
        let logs = Arc::new(Mutex::new(Vec::new()));
        let stderr = child.stderr.take().unwrap();
        let lines = logs.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                lines.lock().unwrap().push(strip_ansi(&line));
            }
        });
        let mut process = ClientProcess {
            child,
            addr: "127.0.0.1:1".parse().unwrap(),
            logs,
        };
        let ready = process.wait_for_log("client proxy ready").await;
        let listen = ready
            .split_whitespace()
            .find_map(|field| field.strip_prefix("listen="))
            .expect("the ready line names the address");
        process.addr = listen.parse().unwrap();
        process
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The first log line containing `needle`, waiting up to 10 s for it.
    async fn wait_for_log(&mut self, needle: &str) -> String {
        for _ in 0..1000 {
            if let Some(line) = self
                .logs
                .lock()
                .unwrap()
                .iter()
                .find(|l| l.contains(needle))
            {
                return line.clone();
            }
            if let Some(status) = self.child.try_wait().unwrap() {
                panic!("rproxy client exited ({status}):\n{}", self.log_text());
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("no log line with {needle:?}:\n{}", self.log_text());
    }

    fn log_text(&self) -> String {
        self.logs.lock().unwrap().join("\n")
    }

    /// SIGKILL, and wait for the process to be gone.
    fn kill_9(&mut self) {
        self.child.kill().unwrap();
        let status = self.child.wait().unwrap();
        assert!(!status.success());
    }

    /// After the process is gone: every line it logged, once the reader
    /// has drained its stderr.
    async fn final_logs(&self) -> Vec<String> {
        eventually("stderr drained", || Arc::strong_count(&self.logs) == 1).await;
        self.logs.lock().unwrap().clone()
    }

    async fn get(&self, url: &str) -> Fetched {
        get(self.addr, url).await
    }

    /// The proxy's counters.
    async fn stats(&self) -> serde_json::Value {
        let stream = TcpStream::connect(self.addr).await.unwrap();
        let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .unwrap();
        tokio::spawn(connection);
        let request = Request::get("/.rproxy/stats")
            .header("host", self.addr.to_string())
            .body(Empty::<Bytes>::new())
            .unwrap();
        let response = sender.send_request(request).await.unwrap();
        let body = response.into_body().collect().await.unwrap().to_bytes();
        serde_json::from_slice(&body).unwrap()
    }

    async fn stat(&self, name: &str) -> u64 {
        let stats = self.stats().await;
        stats[name]
            .as_u64()
            .unwrap_or_else(|| panic!("no counter {name} in {stats}"))
    }
}

impl Drop for ClientProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn strip_ansi(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

// ---------------------------------------------------------------------------
// The user agent

/// Reads at least `n` body bytes of `response`; returns the rest of it.
async fn read_at_least(response: Response<Incoming>, n: usize) -> Incoming {
    let mut body = response.into_body();
    let mut got = 0;
    while got < n {
        let frame = tokio::time::timeout(Duration::from_secs(10), body.frame())
            .await
            .expect("body bytes in time")
            .expect("the body goes on")
            .expect("no body error yet");
        got += frame.data_ref().map_or(0, |d| d.len());
    }
    body
}

// ---------------------------------------------------------------------------
// The cache directory

/// What the cache directory holds, every entry checked.
#[derive(Debug, Default)]
struct Census {
    complete: Vec<String>,
    partial: Vec<String>,
    temp_files: usize,
}

/// Checks every entry under `root` against the origin: its metadata parses,
/// body length and blake3 match the metadata, a complete body is the
/// origin's, a partial one a prefix of it; no body or signature sits under
/// a final name without metadata. Panics on a violation.
fn census(root: &Path) -> Census {
    let mut census = Census::default();
    if let Ok(tmp) = std::fs::read_dir(root.join("tmp")) {
        census.temp_files = tmp.count();
    }
    for dir in std::fs::read_dir(root).unwrap() {
        let dir = dir.unwrap();
        let name = dir.file_name().into_string().unwrap();
        if !dir.file_type().unwrap().is_dir() || name == "tmp" || name == "quarantine" {
            continue;
        }
        let mut stems: HashMap<String, Vec<String>> = HashMap::new();
        for file in std::fs::read_dir(dir.path()).unwrap() {
            let file = file.unwrap().file_name().into_string().unwrap();
            let (stem, ext) = file.split_once('.').unwrap();
            stems
                .entry(stem.to_owned())
                .or_default()
                .push(ext.to_owned());
        }
        for (stem, exts) in stems {
            let at = dir.path().join(&stem);
            assert!(
                exts.iter().any(|e| e == "meta"),
                "{} has {exts:?} under final names and no metadata",
                at.display()
            );
            let meta = EntryMeta::from_json(&std::fs::read(at.with_extension("meta")).unwrap())
                .unwrap_or_else(|e| panic!("{}: metadata does not parse: {e}", at.display()));
            let body = std::fs::read(at.with_extension("body")).unwrap();
            assert_eq!(body.len() as u64, meta.body_len, "{}", meta.url);
            assert!(
                meta.body_digest().is_ok_and(|d| d == blake3::hash(&body)),
                "{}: body does not match its metadata's digest",
                meta.url
            );
            let path = &meta.url[meta.url.find("//").unwrap() + 2..];
            let path = &path[path.find('/').unwrap()..];
            let origin = origin_body(path);
            match meta.completeness {
                Completeness::Complete => {
                    assert!(
                        body == origin,
                        "complete entry {path} is not the origin's body"
                    );
                    census.complete.push(path.to_owned());
                }
                Completeness::Partial => {
                    assert!(
                        origin.starts_with(&body),
                        "partial entry {path} is not a prefix"
                    );
                    census.partial.push(path.to_owned());
                }
            }
        }
    }
    census
}

// ---------------------------------------------------------------------------
// Full disk (C-E1)

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c_e1_a_full_disk_degrades_to_pass_through_and_storing_resumes_once_space_is_freed() {
    let fault = DiskFault::detect();
    println!("disk fault used: {fault:?}");
    eprintln!("disk fault used: {fault:?}");
    let origin = start_origin(|_, _| Reply::Full).await;
    let accelerator = start_accelerator(origin.addr).await;
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    std::fs::create_dir(&cache).unwrap();
    let mut proxy = ClientProcess::start(fault.command(&cache), accelerator.addr, &cache).await;
    let view = fault.view(proxy.pid(), &cache);

    // A coded body larger than the disk: the write fails half-way, the
    // user agent still gets every byte, and nothing is kept.
    for path in ["/big/app.js", "/plain/big.js"] {
        let first = proxy.get(&origin.url(path)).await;
        first.assert_body(path, &origin_body(path));
        let again = proxy.get(&origin.url(path)).await;
        again.assert_body(path, &origin_body(path));
        assert!(!again.is_hit(), "{path}: {}", again.cache_status);
    }
    let full_line = proxy.wait_for_log("cache disk full").await;
    assert!(full_line.contains("ERROR"), "{full_line}");
    eventually("temp files of failed writes removed", || {
        census(&view).temp_files == 0
    })
    .await;
    assert!(census(&view).complete.is_empty());
    assert!(proxy.stat("cache_write_errors").await >= 2);

    // Room for a small entry, a base for later deltas.
    let base = "/rel-1.js";
    proxy
        .get(&origin.url(base))
        .await
        .assert_body(base, &origin_body(base));
    eventually("the small entry stored", || {
        census(&view).complete == [base]
    })
    .await;
    let hit = proxy.get(&origin.url(base)).await;
    hit.assert_body(base, &origin_body(base));
    assert!(hit.is_hit(), "{}", hit.cache_status);

    // No room at all: deltas against the stored base and plain bodies pass
    // through whole, hits still work, nothing half-written appears.
    fault.fill(proxy.pid(), &cache);
    let errors_before = proxy.stat("cache_write_errors").await;
    for path in ["/rel-2.js", "/plain/small.js", "/rel-2.js"] {
        let fetched = proxy.get(&origin.url(path)).await;
        fetched.assert_body(path, &origin_body(path));
        assert!(!fetched.is_hit(), "{path} cannot have been stored");
    }
    let hit = proxy.get(&origin.url(base)).await;
    hit.assert_body(base, &origin_body(base));
    assert!(hit.is_hit(), "hits go on while the disk is full");
    assert!(proxy.stat("cache_write_errors").await >= errors_before + 3);
    eventually("no temp files left", || census(&view).temp_files == 0).await;
    assert_eq!(census(&view).complete, [base]);

    // Space again: the next response is stored and then served as a hit.
    fault.free(proxy.pid(), &cache);
    let path = "/rel-3.js";
    proxy
        .get(&origin.url(path))
        .await
        .assert_body(path, &origin_body(path));
    eventually("stored again", || census(&view).complete.len() == 2).await;
    let hit = proxy.get(&origin.url(path)).await;
    hit.assert_body(path, &origin_body(path));
    assert!(hit.is_hit(), "{}", hit.cache_status);
    proxy.wait_for_log("cache disk has room again").await;
    assert_eq!(origin.requests_to(path), 1);
    let census = census(&view);
    assert_eq!(census.temp_files, 0);
    assert!(census.partial.is_empty());
}

// ---------------------------------------------------------------------------
// kill -9 in the middle of a cache write (C-K1)

/// Starts a request for `path` and returns once the proxy is writing its
/// body into the cache: the user agent got `n` bytes and a temp file under
/// `tmp/` holds some of them. Returns the rest of the user agent's body.
async fn mid_write(proxy: &ClientProcess, url: &str, cache: &Path, n: usize) -> Incoming {
    let response = start_get(proxy.addr, url).await;
    assert_eq!(response.status(), StatusCode::OK);
    let rest = read_at_least(response, n).await;
    eventually("a body temp file with bytes in it", || {
        std::fs::read_dir(cache.join("tmp"))
            .unwrap()
            .flatten()
            .any(|f| {
                f.file_name().to_string_lossy().contains(".body.")
                    && f.metadata().is_ok_and(|m| m.len() > 0)
            })
    })
    .await;
    rest
}

/// After the kill: the user agent's body does not end as a whole one.
async fn assert_cut(rest: Incoming) {
    let end = tokio::time::timeout(Duration::from_secs(10), rest.collect())
        .await
        .expect("the cut is seen in time");
    assert!(end.is_err(), "a body cut by kill -9 ended cleanly");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c_k1_kill_9_during_a_cache_write_leaves_no_entry_and_restart_removes_the_temp_file() {
    let (kept, path) = ("/rel-1.js", "/big/app.js");
    let origin = start_origin(|path, n| match (path, n) {
        ("/big/app.js", 0) => Reply::StallAfter(1 << 20),
        _ => Reply::Full,
    })
    .await;
    let accelerator = start_accelerator(origin.addr).await;
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let rproxy = || Command::new(env!("CARGO_BIN_EXE_rproxy"));
    let mut proxy = ClientProcess::start(rproxy(), accelerator.addr, &cache).await;

    // An entry committed before the crash, which must survive it.
    proxy
        .get(&origin.url(kept))
        .await
        .assert_body(kept, &origin_body(kept));
    eventually("the first entry stored", || {
        census(&cache).complete == [kept]
    })
    .await;

    let rest = mid_write(&proxy, &origin.url(path), &cache, 256 << 10).await;
    proxy.kill_9();
    assert_cut(rest).await;
    let torn = census(&cache);
    assert!(torn.temp_files >= 1, "killed in the middle of a write");
    assert_eq!(
        torn.complete,
        [kept],
        "nothing of the torn write under a final name"
    );
    assert!(torn.partial.is_empty());

    let proxy = ClientProcess::start(rproxy(), accelerator.addr, &cache).await;
    let restarted = census(&cache);
    assert_eq!(restarted.temp_files, 0, "start-up removes temp files");
    assert_eq!(restarted.complete, [kept]);
    assert!(restarted.partial.is_empty());
    let hit = proxy.get(&origin.url(kept)).await;
    hit.assert_body(kept, &origin_body(kept));
    assert!(
        hit.is_hit(),
        "the committed entry survived: {}",
        hit.cache_status
    );
    let fetched = proxy.get(&origin.url(path)).await;
    fetched.assert_body(path, &origin_body(path));
    assert!(!fetched.is_hit(), "{}", fetched.cache_status);
    eventually("stored after the restart", || {
        census(&cache).complete.len() == 2
    })
    .await;
    let hit = proxy.get(&origin.url(path)).await;
    hit.assert_body(path, &origin_body(path));
    assert!(hit.is_hit(), "{}", hit.cache_status);
    assert_eq!(origin.requests_to(path), 2);
    assert_eq!(origin.requests_to(kept), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c_k1_a_partial_entry_survives_kill_9_of_its_resume_and_the_next_fetch_resumes_from_it() {
    // Random bytes: what the delta saves is exactly the prefix already held.
    let path = "/random/app.bin";
    let len = origin_body(path).len();
    let origin = start_origin(move |_, n| match n {
        0 => Reply::CutAfter(len / 2),
        1 => Reply::StallAfter(len * 7 / 8),
        _ => Reply::Full,
    })
    .await;
    let accelerator = start_accelerator(origin.addr).await;
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let rproxy = || Command::new(env!("CARGO_BIN_EXE_rproxy"));
    let mut proxy = ClientProcess::start(rproxy(), accelerator.addr, &cache).await;

    // An upstream cut leaves a partial entry.
    let cut = proxy.get(&origin.url(path)).await;
    assert!(cut.body.is_err(), "a cut body must not end cleanly");
    eventually("a partial entry", || census(&cache).partial == [path]).await;
    let prefix_len = std::fs::metadata(find_body(&cache)).unwrap().len() as usize;
    assert!(prefix_len > 0 && prefix_len < len);

    // The resume is killed half-way through writing its new entry.
    let rest = mid_write(&proxy, &origin.url(path), &cache, len * 3 / 4).await;
    proxy.kill_9();
    assert_cut(rest).await;
    let torn = census(&cache);
    assert!(torn.temp_files >= 1);
    assert_eq!(torn.partial, [path], "the old partial entry is untouched");

    // After a restart the partial entry is still there and resumes.
    let mut proxy = ClientProcess::start(rproxy(), accelerator.addr, &cache).await;
    proxy.wait_for_log("entries=1").await;
    let restarted = census(&cache);
    assert_eq!(restarted.temp_files, 0);
    assert_eq!(restarted.partial, [path]);
    let resumed = proxy.get(&origin.url(path)).await;
    resumed.assert_body(path, &origin_body(path));
    eventually("complete after the resume", || {
        census(&cache).complete == [path]
    })
    .await;
    let link = proxy.stat("upstream_bytes").await as usize;
    println!("resumed after kill -9: {link} link bytes for {len} body bytes, {prefix_len} held");
    assert!(
        link + prefix_len * 9 / 10 < len,
        "the resume sent {link} bytes for a {len}-byte body with {prefix_len} held"
    );
    let hit = proxy.get(&origin.url(path)).await;
    hit.assert_body(path, &origin_body(path));
    assert!(hit.is_hit(), "{}", hit.cache_status);
}

/// The one entry body under `cache`.
fn find_body(cache: &Path) -> PathBuf {
    for dir in std::fs::read_dir(cache).unwrap().flatten() {
        if let Ok(files) = std::fs::read_dir(dir.path()) {
            for file in files.flatten() {
                if file.file_name().to_string_lossy().ends_with(".body") && dir.file_name() != "tmp"
                {
                    return file.path();
                }
            }
        }
    }
    panic!("no entry body under {}", cache.display());
}

// ---------------------------------------------------------------------------
// A body truncated on disk by another process (C-E3)

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c_e3_a_body_truncated_on_disk_is_a_miss_served_whole_from_upstream_and_the_entry_dropped()
{
    let origin = start_origin(|_, _| Reply::Full).await;
    let accelerator = start_accelerator(origin.addr).await;
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let rproxy = || Command::new(env!("CARGO_BIN_EXE_rproxy"));
    let proxy = ClientProcess::start(rproxy(), accelerator.addr, &cache).await;
    // Read whole before the head goes out, and streamed (past 1 MiB).
    for (stored, path) in [(1, "/app.js"), (2, "/big/app.js")] {
        proxy
            .get(&origin.url(path))
            .await
            .assert_body(path, &origin_body(path));
        eventually("stored", || census(&cache).complete.len() == stored).await;
        let body = find_entry_body(&cache, path);
        let len = std::fs::metadata(&body).unwrap().len();
        std::fs::OpenOptions::new()
            .write(true)
            .open(&body)
            .unwrap()
            .set_len(len / 2)
            .unwrap();

        let fetched = proxy.get(&origin.url(path)).await;
        fetched.assert_body(path, &origin_body(path));
        assert!(!fetched.is_hit(), "{path}: {}", fetched.cache_status);
        assert_eq!(origin.requests_to(path), 2, "{path}: served from upstream");
        let quarantined: Vec<String> = std::fs::read_dir(cache.join("quarantine"))
            .unwrap()
            .map(|f| f.unwrap().file_name().into_string().unwrap())
            .collect();
        let stem = body.file_stem().unwrap().to_str().unwrap();
        assert!(
            quarantined
                .iter()
                .any(|f| f.ends_with(&format!("{stem}.body"))),
            "{path}: the truncated entry is quarantined: {quarantined:?}"
        );
        // The refetch stored the whole body again (census checks it).
        eventually("stored again, whole", || {
            std::fs::metadata(&body).is_ok_and(|m| m.len() == len)
                && census(&cache).complete.len() == stored
        })
        .await;
        let hit = proxy.get(&origin.url(path)).await;
        hit.assert_body(path, &origin_body(path));
        assert!(hit.is_hit(), "{path}: {}", hit.cache_status);
    }
}

/// The body file of `path`'s entry under `cache`.
fn find_entry_body(cache: &Path, path: &str) -> PathBuf {
    for dir in std::fs::read_dir(cache).unwrap().flatten() {
        for file in std::fs::read_dir(dir.path())
            .into_iter()
            .flatten()
            .flatten()
        {
            let file = file.path();
            if file.extension().is_some_and(|e| e == "meta") {
                let meta = EntryMeta::from_json(&std::fs::read(&file).unwrap()).unwrap();
                if meta.url.ends_with(path) {
                    return file.with_extension("body");
                }
            }
        }
    }
    panic!("no entry for {path} under {}", cache.display());
}

// ---------------------------------------------------------------------------
// kill -9 crash loop (C-K1)

/// The `url=` and `body_blake3=` fields of a "cache entry committed" line.
fn committed_line(line: &str) -> Option<(&str, &str)> {
    if !line.contains("cache entry committed") {
        return None;
    }
    let field = |name: &str| {
        line.split_whitespace()
            .find_map(|f| f.strip_prefix(name))
            .map(|v| v.trim_matches('"'))
    };
    Some((field("url=")?, field("body_blake3=")?))
}

/// What a crash loop counted.
#[derive(Debug, Default)]
struct CrashLoopTally {
    iterations: usize,
    requests: usize,
    /// "committed" log lines seen before the kills.
    committed: usize,
    /// Entries whose last commit was logged before the kill, no later write
    /// of theirs having started: each must be there after the restart.
    must_survive: usize,
    survived: usize,
    /// Entries on disk after a restart, each checked against its digest.
    entries_checked: usize,
    bad_digest: usize,
    partial_under_final_names: usize,
    temp_files_after_restart: usize,
    hits_checked: usize,
}

/// One user agent of the crash loop: GETs with `no-cache` (so each one
/// writes an entry) over its own keys, 20 % of them the key it just wrote.
/// Before the next request it waits (up to 2 s) for the last one's
/// "committed" line, so no two writes of one key overlap; a key whose
/// commit did not show is `unsettled` and left out of the survival check.
async fn crash_loop_agent(
    proxy: SocketAddr,
    origin: SocketAddr,
    agent: usize,
    seed: u64,
    logs: Arc<Mutex<Vec<String>>>,
    requests: Arc<std::sync::atomic::AtomicUsize>,
    unsettled: Arc<Mutex<std::collections::HashSet<String>>>,
) {
    let mut rng = support::Rng::new(seed);
    let mut last: Option<String> = None;
    loop {
        let path = match &last {
            Some(path) if rng.below(5) == 0 => path.clone(),
            _ => format!("/crash/a{agent}-k{}", rng.below(16)),
        };
        unsettled.lock().unwrap().insert(path.clone());
        // Any failure here is the kill: the agent stops.
        let Ok(stream) = TcpStream::connect(proxy).await else {
            return;
        };
        let Ok((mut sender, connection)) =
            hyper::client::conn::http1::handshake(TokioIo::new(stream)).await
        else {
            return;
        };
        tokio::spawn(connection);
        let request = Request::get(format!("http://{origin}{path}"))
            .header("host", origin.to_string())
            .header("cache-control", "no-cache")
            .body(Empty::<Bytes>::new())
            .unwrap();
        requests.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let Ok(response) = sender.send_request(request).await else {
            return;
        };
        let Ok(body) = response.into_body().collect().await else {
            return;
        };
        let digest = blake3::hash(&body.to_bytes()).to_hex().to_string();
        let url = format!("http://{origin}{path}");
        for _ in 0..200 {
            let settled = logs
                .lock()
                .unwrap()
                .iter()
                .rev()
                .filter_map(|l| committed_line(l))
                .any(|(u, d)| u == url && d == digest);
            if settled {
                unsettled.lock().unwrap().remove(&path);
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        last = Some(path);
    }
}

/// The C-K1 loop: start `rproxy client`, check the cache directory and a
/// hit, drive cache-filling requests (bodies of 0 to 8 MiB) and SIGKILL the
/// proxy after a uniformly random 0-500 ms; `iterations` times, on one
/// directory. The upstream is the origin itself: the accelerator would only
/// add CPU, and what is tested is the client's cache.
async fn crash_loop(iterations: usize, seed: u64) -> CrashLoopTally {
    let origin = start_origin(|_, _| Reply::Full).await;
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let mut rng = support::Rng::new(seed);
    let mut tally = CrashLoopTally::default();
    // What the last run left to check: its log and its unsettled keys.
    let mut previous: Option<(Vec<String>, std::collections::HashSet<String>)> = None;
    for iteration in 0..=iterations {
        let mut proxy = ClientProcess::start_logging(
            Command::new(env!("CARGO_BIN_EXE_rproxy")),
            origin.addr,
            &cache,
            "1G",
            "info,rproxy::cache::store=debug",
        )
        .await;
        if let Some((log, unsettled)) = previous.take() {
            check_after_kill(&proxy, &origin, &cache, &log, &unsettled, &mut tally).await;
            tally.iterations += 1;
        }
        if iteration == iterations {
            break;
        }
        let requests = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let unsettled = Arc::new(Mutex::new(std::collections::HashSet::new()));
        let agents: Vec<_> = (0..2)
            .map(|agent| {
                tokio::spawn(crash_loop_agent(
                    proxy.addr,
                    origin.addr,
                    agent,
                    rng.next_u64(),
                    proxy.logs.clone(),
                    requests.clone(),
                    unsettled.clone(),
                ))
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(rng.below(501))).await;
        proxy.kill_9();
        for agent in agents {
            agent.abort();
            let _ = agent.await;
        }
        tally.requests += requests.load(std::sync::atomic::Ordering::Relaxed);
        let log = proxy.final_logs().await;
        tally.committed += log.iter().filter_map(|l| committed_line(l)).count();
        let unsettled = unsettled.lock().unwrap().clone();
        previous = Some((log, unsettled));
    }
    tally
}

/// After a restart: no temp files, every entry whole under its final names
/// and matching its digest, every entry whose commit was logged before the
/// kill (and not written again since) present with that digest, and one of
/// them served as a hit with the right bytes.
async fn check_after_kill(
    proxy: &ClientProcess,
    origin: &Origin,
    cache: &Path,
    log: &[String],
    unsettled: &std::collections::HashSet<String>,
    tally: &mut CrashLoopTally,
) {
    tally.temp_files_after_restart += std::fs::read_dir(cache.join("tmp")).unwrap().count();
    // url → body digest of each entry on disk that checks out.
    let mut on_disk: HashMap<String, String> = HashMap::new();
    for dir in std::fs::read_dir(cache).unwrap().flatten() {
        let name = dir.file_name();
        if !dir.file_type().unwrap().is_dir() || name == "tmp" || name == "quarantine" {
            continue;
        }
        let mut stems: HashMap<String, Vec<String>> = HashMap::new();
        for file in std::fs::read_dir(dir.path()).unwrap().flatten() {
            let file = file.file_name().into_string().unwrap();
            let (stem, ext) = file.split_once('.').unwrap();
            stems.entry(stem.into()).or_default().push(ext.into());
        }
        for (stem, exts) in stems {
            tally.entries_checked += 1;
            if exts.len() != 3 {
                tally.partial_under_final_names += 1;
                continue;
            }
            let at = dir.path().join(&stem);
            let meta = EntryMeta::from_json(&std::fs::read(at.with_extension("meta")).unwrap());
            let body = std::fs::read(at.with_extension("body")).unwrap();
            match meta {
                Ok(meta)
                    if meta.body_len == body.len() as u64
                        && meta.body_digest().is_ok_and(|d| d == blake3::hash(&body)) =>
                {
                    on_disk.insert(meta.url.clone(), blake3::hash(&body).to_hex().to_string());
                }
                _ => tally.bad_digest += 1,
            }
        }
    }
    // The last committed line of each URL.
    let mut last_commit: HashMap<&str, &str> = HashMap::new();
    for (url, digest) in log.iter().filter_map(|l| committed_line(l)) {
        last_commit.insert(url, digest);
    }
    let mut survivor = None;
    for (url, digest) in last_commit {
        let path = &url[url.find("/crash/").unwrap()..];
        // A later version fetched from the origin means a later write,
        // which may have been cut by the kill after unlinking this one.
        let served = origin.requests_to(path);
        let latest = blake3::hash(&crash_body(path, served - 1))
            .to_hex()
            .to_string();
        if unsettled.contains(path) || latest != digest {
            continue;
        }
        tally.must_survive += 1;
        if on_disk.get(url).map(String::as_str) == Some(digest) {
            tally.survived += 1;
            survivor = Some((path.to_owned(), served - 1));
        } else {
            println!("lost after kill -9: {url} ({digest})");
        }
    }
    if let Some((path, version)) = survivor {
        let hit = proxy.get(&origin.url(&path)).await;
        assert!(hit.is_hit(), "{path}: {}", hit.cache_status);
        let body = hit.body.expect("a whole hit");
        if body != crash_body(&path, version) {
            tally.bad_digest += 1;
        }
        tally.hits_checked += 1;
    }
}

fn assert_crash_loop(tally: &CrashLoopTally) {
    println!("C-K1 crash loop: {tally:#?}");
    assert_eq!(tally.bad_digest, 0, "entries failing their digest");
    assert_eq!(
        tally.partial_under_final_names, 0,
        "partial files under final names"
    );
    assert_eq!(
        tally.temp_files_after_restart, 0,
        "temp files after start-up cleanup"
    );
    assert_eq!(
        tally.survived, tally.must_survive,
        "logged-committed entries lost"
    );
    assert!(
        tally.committed > 0 && tally.must_survive > 0,
        "the loop wrote nothing"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c_k1_kill_9_crash_loop_short() {
    let iterations = std::env::var("RPROXY_CK1_ITERATIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10);
    assert_crash_loop(&crash_loop(iterations, 0xc1).await);
}

/// The full C-K1: 200 iterations (`scripts/crash-loop.sh`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "minutes long; scripts/crash-loop.sh runs it"]
async fn c_k1_kill_9_crash_loop_200_iterations() {
    let iterations = std::env::var("RPROXY_CK1_ITERATIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200);
    assert_crash_loop(&crash_loop(iterations, 0xc1_200).await);
}
