//! The basis store shared on Redis (issue 20): two accelerators behind a
//! round-robin balancer share one `redis-server`, so a client whose first
//! request reached one and whose next reaches the other still gets a
//! delta against the body the first one served (by its digest alone).
//! With Redis killed, or answering nothing, every request is still
//! answered, coded without the held body (the rsync fallback) and within
//! the lookup's timeout, never an error.
//!
//! Starts Debian's `redis-server` on a free loopback port; skipped, with
//! a line saying so, where it is not installed.

mod support;

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Response};
use http_body_util::Full;
use rproxy::accelerator::AcceleratorConfig;
use rproxy::accelerator::basis_store::SharedTier;
use support::proxy::{client_config, eventually};
use support::topology::{Accelerator, ClientProxy, Origin, accelerator_config, origin};
use support::user_agent::get;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::AbortHandle;

/// Release `n` of a 100 KB text: one line changed per release.
fn release(n: usize) -> Vec<u8> {
    let mut body = support::pseudo_text(11, 100_000);
    let at = 50_000 + n * 97;
    body[at..at + 8].copy_from_slice(format!("rel{n:05}").as_bytes());
    body
}

/// Each path answers its next release on each request, revalidated every
/// time.
async fn releases() -> Origin {
    origin(|_, earlier| async move {
        let mut response = Response::new(Full::new(Bytes::from(release(earlier))));
        response
            .headers_mut()
            .insert("cache-control", HeaderValue::from_static("no-cache"));
        response
    })
    .await
}

/// A `redis-server` of our own, killed when dropped.
struct Redis {
    child: Child,
    addr: SocketAddr,
}

impl Redis {
    /// Started on a free loopback port, bounded as the README says to run
    /// it; `None` when redis-server is not installed.
    fn start() -> Option<Redis> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        Redis::start_on(port)
    }

    /// Started on `port`.
    fn start_on(port: u16) -> Option<Redis> {
        let child = Command::new("redis-server")
            .args(["--bind", "127.0.0.1", "--port", &port.to_string()])
            .args(["--save", "", "--appendonly", "no"])
            .args(["--maxmemory", "64mb", "--maxmemory-policy", "allkeys-lru"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn();
        let child = match child {
            Ok(child) => child,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                eprintln!("skipped: redis-server is not installed (apt-get install redis-server)");
                return None;
            }
            Err(e) => panic!("redis-server: {e}"),
        };
        let redis = Redis {
            child,
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
        };
        for _ in 0..500 {
            if redis
                .command("PING")
                .is_some_and(|answer| answer == "+PONG")
            {
                return Some(redis);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        panic!("redis-server did not answer on {}", redis.addr);
    }

    /// Sends an inline command and reads its one-line answer.
    fn command(&self, command: &str) -> Option<String> {
        let mut stream = std::net::TcpStream::connect(self.addr).ok()?;
        stream.write_all(format!("{command}\r\n").as_bytes()).ok()?;
        let mut answer = [0; 64];
        let n = stream.read(&mut answer).ok()?;
        Some(String::from_utf8_lossy(&answer[..n]).trim_end().to_owned())
    }

    fn keys(&self) -> usize {
        self.command("DBSIZE")
            .and_then(|answer| answer.strip_prefix(':').and_then(|n| n.parse().ok()))
            .unwrap_or(0)
    }

    fn url(&self) -> String {
        format!("redis://{}", self.addr)
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A round-robin TCP balancer: each connection goes to the next backend.
/// [`Balancer::cut`] closes the connections it relays, so that the next
/// request opens a new one (to the next backend).
struct Balancer {
    addr: SocketAddr,
    relays: Arc<Mutex<Vec<AbortHandle>>>,
    accept: AbortHandle,
}

impl Balancer {
    async fn start(backends: Vec<SocketAddr>) -> Balancer {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let relays = Arc::new(Mutex::new(Vec::new()));
        let tracked = relays.clone();
        let accept = tokio::spawn(async move {
            for next in 0.. {
                let Ok((mut downstream, _)) = listener.accept().await else {
                    return;
                };
                let backend = backends[next % backends.len()];
                let relay = tokio::spawn(async move {
                    let Ok(mut upstream) = TcpStream::connect(backend).await else {
                        return;
                    };
                    let _ = tokio::io::copy_bidirectional(&mut downstream, &mut upstream).await;
                });
                tracked.lock().unwrap().push(relay.abort_handle());
            }
        })
        .abort_handle();
        Balancer {
            addr,
            relays,
            accept,
        }
    }

    /// Closes every connection relayed so far.
    fn cut(&self) {
        for relay in self.relays.lock().unwrap().drain(..) {
            relay.abort();
        }
    }
}

impl Drop for Balancer {
    fn drop(&mut self) {
        self.accept.abort();
        self.cut();
    }
}

/// An accelerator in front of `origin` sharing its bodies on `redis`.
async fn accelerator(origin: SocketAddr, redis: &str) -> Accelerator {
    Accelerator::start(AcceleratorConfig {
        basis_shared: Some(SharedTier {
            url: redis.into(),
            timeout: Duration::from_millis(200),
            max_body: 16 << 20,
        }),
        ..accelerator_config(origin)
    })
    .await
}

/// Fetches release `n` through `proxy`; the link bytes and the signature
/// bytes it took, once stored.
async fn update(proxy: &ClientProxy, url: &str, n: usize) -> (u64, u64) {
    let before = proxy.stats();
    get(proxy.addr, url)
        .await
        .assert_body("/lib.js", &release(n));
    eventually("the release stored", || {
        proxy.stats().stored == before.stored + 1
    })
    .await;
    let after = proxy.stats();
    (
        after.upstream_bytes - before.upstream_bytes,
        after.signature_bytes - before.signature_bytes,
    )
}

#[tokio::test]
async fn a_body_one_accelerator_served_is_a_basis_for_the_other() {
    let Some(redis) = Redis::start() else {
        return;
    };
    let origin = releases().await;
    let first = accelerator(origin.addr, &redis.url()).await;
    let second = accelerator(origin.addr, &redis.url()).await;
    let balancer = Balancer::start(vec![first.addr, second.addr]).await;
    let proxy = ClientProxy::start(client_config(&format!("http://{}", balancer.addr))).await;
    let url = origin.url("/lib.js");

    update(&proxy, &url, 0).await;
    eventually("the body in Redis", || redis.keys() == 1).await;
    balancer.cut();
    // Through the other accelerator, which never saw release 0.
    let (link, signature) = update(&proxy, &url, 1).await;
    assert_eq!(signature, 0, "the body named by its digest alone");
    assert!(link < 2_000, "an 8-byte change took {link} B");
    assert_eq!(proxy.stats().digest_failures, 0);
    assert_eq!(
        second.stats().await["coded"],
        1,
        "the second accelerator coded it"
    );
}

#[tokio::test]
async fn with_redis_gone_the_answers_come_coded_without_a_held_body() {
    let Some(redis) = Redis::start() else {
        return;
    };
    let origin = releases().await;
    let first = accelerator(origin.addr, &redis.url()).await;
    let second = accelerator(origin.addr, &redis.url()).await;
    let balancer = Balancer::start(vec![first.addr, second.addr]).await;
    let proxy = ClientProxy::start(client_config(&format!("http://{}", balancer.addr))).await;
    let url = origin.url("/lib.js");
    update(&proxy, &url, 0).await;
    let port = redis.addr.port();
    drop(redis);
    balancer.cut();
    let (link, _) = update(&proxy, &url, 1).await;
    assert!(link > 10_000, "coded without a basis: {link} B");
    // And on: Redis stays gone, every answer is right.
    for n in 2..5 {
        balancer.cut();
        update(&proxy, &url, n).await;
    }
    assert_eq!(proxy.stats().digest_failures, 0);
    assert_eq!(proxy.stats().upstream_errors, 0);
    let fallbacks = first.stats().await["basis_fallbacks"].as_u64().unwrap()
        + second.stats().await["basis_fallbacks"].as_u64().unwrap();
    assert!(fallbacks >= 1, "counted: {fallbacks}");

    // Redis back on its port: the accelerators reconnect by themselves,
    // and soon an update goes by digest again, whichever one it reaches.
    let _redis = Redis::start_on(port).unwrap();
    for n in 5.. {
        assert!(n < 40, "no update came as a small delta again");
        balancer.cut();
        let (link, signature) = update(&proxy, &url, n).await;
        if link < 2_000 && signature == 0 {
            break;
        }
        // Each accelerator leaves Redis alone for a second after a failure.
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A "Redis" that accepts connections and never answers: a lookup times
/// out, and the request is answered all the same, coded without the held
/// body, having waited no longer than the timeout (200 ms here).
#[tokio::test]
async fn a_redis_that_does_not_answer_costs_a_timeout_and_no_error() {
    let silent = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let silent_url = format!("redis://{}", silent.local_addr().unwrap());
    let held = tokio::spawn(async move {
        let mut connections = Vec::new();
        while let Ok((connection, _)) = silent.accept().await {
            connections.push(connection);
        }
    });
    let origin = releases().await;
    let first = accelerator(origin.addr, &silent_url).await;
    let second = accelerator(origin.addr, &silent_url).await;
    let balancer = Balancer::start(vec![first.addr, second.addr]).await;
    let proxy = ClientProxy::start(client_config(&format!("http://{}", balancer.addr))).await;
    let url = origin.url("/lib.js");
    update(&proxy, &url, 0).await;
    balancer.cut();
    let started = std::time::Instant::now();
    let (link, _) = update(&proxy, &url, 1).await;
    let took = started.elapsed();
    assert!(link > 10_000, "coded without a basis: {link} B");
    assert_eq!(second.stats().await["basis_fallbacks"], 1);
    assert!(took < Duration::from_secs(3), "the update took {took:?}");
    assert_eq!(proxy.stats().upstream_errors, 0);
    held.abort();
}
